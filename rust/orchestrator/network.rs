//! A sandbox's network as the orchestrator configures it: the mode and, for
//! `egress`, the policy the helper enforces ([`sandbox_net::policy`] defines the
//! rule syntax). Parsed from the `network` key of the config file's
//! `[defaults]` and profiles and of `.sandbox-mcp.toml`:
//!
//! ```toml
//! network = "none"                                   # loopback only
//! network = "egress"                                 # the default policy
//! network = { allow = ["pypi.org", "*.pythonhosted.org:443"], deny = [] }
//! [network]                                          # the same, as a section
//! deny = ["203.0.113.0/24"]
//! ```
//!
//! Children: a child sandbox always runs with exactly its parent's network
//! (see [`Network::for_child`]), whatever its own profile, the project file
//! or `SANDBOX_MCP_NETWORK` say, so no parent can hand a child a wider one.
//! Also here: `network_info`'s report, with the refusals the helper saw.
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use toml::Value;

use super::{
    error::OrchestratorError,
    helper_client::{HelperError, NetworkEvents},
    sandbox::{Sandbox, SandboxManager},
};
use sandbox_net::policy::NetworkPolicy;

/// What `network_info` says of the default egress policy.
pub const DEFAULT_POLICY_TEXT: &str = "default: public internet; never the host, loopback or private ranges";

/// The egress rules of a sandbox, validated and in canonical text. Both
/// lists empty is the helper's default policy (the public internet).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressPolicy {
    /// Allow rules; empty: the public internet.
    pub allow: Vec<String>,
    /// Deny rules, checked first.
    pub deny: Vec<String>,
}

/// Network access of a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Network {
    /// Loopback only.
    None,
    /// Outbound access through the helper's network stack, under a policy.
    Egress(EgressPolicy),
}

impl Default for Network {
    fn default() -> Self {
        Self::Egress(EgressPolicy::default())
    }
}

/// The message for a `network` value of the wrong kind.
fn wrong_kind(value: &Value) -> String {
    format!("must be \"egress\", \"none\" or a table {{ allow = [...], deny = [...] }}, not {value}")
}

impl EgressPolicy {
    /// Check every rule (each malformed one is a problem naming its key,
    /// `<key>.allow[2]`) and keep them in canonical form.
    pub fn parse(key: &str, allow: &[String], deny: &[String]) -> Result<Self, Vec<(String, String)>> {
        let mut problems = Vec::new();
        let one = |list: &str, i: usize, rule: &String| {
            let single = std::slice::from_ref(rule);
            let parsed =
                if list == "allow" { NetworkPolicy::parse(single, &[]) } else { NetworkPolicy::parse(&[], single) };
            parsed.err().map(|e| (format!("{key}.{list}[{i}]"), e.to_string()))
        };
        problems.extend(allow.iter().enumerate().filter_map(|(i, r)| one("allow", i, r)));
        problems.extend(deny.iter().enumerate().filter_map(|(i, r)| one("deny", i, r)));
        if !problems.is_empty() {
            return Err(problems);
        }
        let policy = NetworkPolicy::parse(allow, deny).map_err(|e| vec![(key.to_string(), e.to_string())])?;
        Ok(Self {
            allow: policy.allow().iter().map(ToString::to_string).collect(),
            deny: policy.deny().iter().map(ToString::to_string).collect(),
        })
    }

    /// No rules: the public internet, nothing private, never the host.
    pub fn is_default(&self) -> bool {
        self.allow.is_empty() && self.deny.is_empty()
    }

    /// One line for summaries: `allow=a,b deny=c` (empty when default).
    pub fn summary(&self) -> String {
        let mut parts = Vec::new();
        if !self.allow.is_empty() {
            parts.push(format!("allow={}", self.allow.join(",")));
        }
        if !self.deny.is_empty() {
            parts.push(format!("deny={}", self.deny.join(",")));
        }
        parts.join(" ")
    }
}

impl Network {
    /// `"none"` or `"egress"` (the env override and the plain config form).
    pub fn from_mode(mode: &str) -> Option<Self> {
        match mode {
            "none" => Some(Self::None),
            "egress" => Some(Self::default()),
            _ => None,
        }
    }

    /// The `network` value at `key` of a config or project file: a mode
    /// string or a table of `allow`/`deny` rule lists. Every problem is
    /// returned as (key, what is wrong).
    pub fn from_toml(key: &str, value: &Value) -> Result<Self, Vec<(String, String)>> {
        let table = match value {
            Value::String(s) => return Self::from_mode(s).ok_or_else(|| vec![(key.to_string(), wrong_kind(value))]),
            Value::Table(t) => t,
            other => return Err(vec![(key.to_string(), wrong_kind(other))]),
        };
        let mut problems = Vec::new();
        let mut lists = [Vec::new(), Vec::new()];
        for (k, v) in table {
            let slot = match k.as_str() {
                "allow" => 0,
                "deny" => 1,
                other => {
                    problems.push((format!("{key}.{other}"), "is not supported (allowed: allow, deny)".to_string()));
                    continue;
                }
            };
            let Some(items) = v.as_array() else {
                problems.push((format!("{key}.{k}"), "expected a list of rule strings".to_string()));
                continue;
            };
            for (i, item) in items.iter().enumerate() {
                match item.as_str() {
                    Some(rule) => lists[slot].push(rule.to_string()),
                    None => problems.push((format!("{key}.{k}[{i}]"), format!("expected a rule string, not {item}"))),
                }
            }
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        let [allow, deny] = lists;
        EgressPolicy::parse(key, &allow, &deny).map(Self::Egress)
    }

    /// The network of a child of a sandbox with `parent`'s network: exactly
    /// the parent's. A `none` parent has `none` children; a parent under a
    /// policy gives its children that policy and nothing more. The child's
    /// own profile, the project file and the env override never widen it.
    pub fn for_child(parent: &Self) -> Self {
        parent.clone()
    }

    /// `egress` or `none`.
    pub fn mode(&self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Egress(_) => "egress",
        }
    }

    /// One line for summaries: `egress`, `none` or `egress allow=… deny=…`.
    pub fn summary(&self) -> String {
        match self {
            Self::Egress(p) if !p.is_default() => format!("egress {}", p.summary()),
            other => other.mode().to_string(),
        }
    }

    /// The form kept in the VM's label, read back after a restart.
    pub fn to_label(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| "\"none\"".to_string())
    }

    /// A label written by [`Self::to_label`].
    pub fn from_label(label: &str) -> Option<Self> {
        serde_json::from_str(label).ok()
    }
}

/// Whether the helper reports refusals for a sandbox, and which.
#[derive(Debug)]
pub enum EventsView {
    /// The sandbox has no egress, or is not running: nothing to report.
    NotApplicable,
    /// This helper does not implement NetworkEvents.
    Unsupported,
    /// The helper could not answer for this sandbox; why.
    Unavailable(String),
    /// What the helper reported.
    Events(NetworkEvents),
}

/// One sandbox in `network_info`.
#[derive(Debug)]
pub struct NetworkRow {
    /// The sandbox (its network is [`Sandbox::network`]).
    pub sandbox: Arc<Sandbox>,
    /// Whether its VM runs.
    pub alive: bool,
    /// Refused connections, as far as the helper reports them.
    pub events: EventsView,
    /// The network a sandbox of its name would get now, when the
    /// configuration changed since it was created (top-level sandboxes; a
    /// child's follows its parent's).
    pub configured: Option<Network>,
}

impl SandboxManager {
    /// Every sandbox with its network and the refusals the helper recorded.
    /// A helper that does not report refusals (or fails to for one sandbox)
    /// leaves that sandbox without events; it never fails the report.
    pub async fn network_report(&self) -> Result<Vec<NetworkRow>, OrchestratorError> {
        let sandboxes = self.list_own();
        if sandboxes.is_empty() {
            return Ok(Vec::new());
        }
        let running = self.running().await?;
        let mut rows = Vec::with_capacity(sandboxes.len());
        for sandbox in sandboxes {
            let alive = running.get(&sandbox.name).copied().unwrap_or(false);
            let events = if !alive || sandbox.network == Network::None {
                EventsView::NotApplicable
            } else {
                match self.helper.network_events(&sandbox.name).await {
                    Ok(Some(events)) => EventsView::Events(events),
                    Ok(None) => EventsView::Unsupported,
                    Err(HelperError::NotFound(_)) => EventsView::NotApplicable,
                    Err(e) => EventsView::Unavailable(e.to_string()),
                }
            };
            let configured = match &sandbox.parent {
                None => self.creation_profile(&sandbox.name).ok().map(|(p, _)| p.network),
                Some(_) => None,
            }
            .filter(|n| *n != sandbox.network);
            rows.push(NetworkRow { sandbox, alive, events, configured });
        }
        Ok(rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Network, Vec<(String, String)>> {
        let table: toml::Table = toml::from_str(text).unwrap();
        Network::from_toml("network", &table["network"])
    }

    #[test]
    fn every_form() {
        assert_eq!(parse("network = \"none\"").unwrap(), Network::None);
        assert_eq!(parse("network = \"egress\"").unwrap(), Network::default());
        assert_eq!(parse("network = {}").unwrap(), Network::default());
        let inline = parse("network = { allow = [\"PyPI.org\", \"*.example.com:443\"], deny = [\"10.0.0.0/8\"] }");
        let section = parse("[network]\nallow = [\"pypi.org\", \"*.example.com:443\"]\ndeny = [\"10.0.0.0/8\"]\n");
        let want = Network::Egress(EgressPolicy {
            allow: vec!["pypi.org".into(), "*.example.com:443".into()],
            deny: vec!["10.0.0.0/8".into()],
        });
        assert_eq!(inline.unwrap(), want);
        assert_eq!(section.unwrap(), want);
        assert_eq!(want.summary(), "egress allow=pypi.org,*.example.com:443 deny=10.0.0.0/8");
        assert_eq!(Network::None.summary(), "none");
        assert_eq!(Network::default().summary(), "egress");
    }

    #[test]
    fn every_problem_names_its_key() {
        let e = parse("network = \"wifi\"").unwrap_err();
        assert_eq!(e[0].0, "network");
        assert!(e[0].1.starts_with("must be \"egress\", \"none\" or a table"), "{e:?}");
        assert_eq!(parse("network = 3").unwrap_err()[0].0, "network");
        assert_eq!(parse("network = [\"egress\"]").unwrap_err()[0].0, "network");
        let e = parse("network = { allow = [\"ok.org\", \"bad rule\", 7], deny = \"x\", ports = [] }").unwrap_err();
        let keys: Vec<&str> = e.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["network.allow[2]", "network.deny", "network.ports"], "{e:?}");
        // Rules are checked once the lists have the right shape.
        let e = parse("network = { allow = [\"ok.org\", \"bad rule\"], deny = [\"10.0.0.0/99\"] }").unwrap_err();
        let keys: Vec<&str> = e.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["network.allow[1]", "network.deny[0]"], "{e:?}");
        assert!(e[0].1.contains("bad rule"), "{e:?}");
    }

    #[test]
    fn labels_round_trip_and_children_inherit() {
        let policy = Network::Egress(EgressPolicy { allow: vec!["pypi.org".into()], deny: vec![] });
        for n in [Network::None, Network::default(), policy.clone()] {
            assert_eq!(Network::from_label(&n.to_label()), Some(n.clone()));
            assert_eq!(Network::for_child(&n), n);
        }
        assert_eq!(Network::from_label("garbage"), None);
    }
}
