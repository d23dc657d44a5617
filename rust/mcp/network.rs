//! Networking tools: expose, unexpose, network_info. Forwards live in the
//! orchestrator's [`ForwardManager`](sandbox_orchestrator::forward::ForwardManager);
//! this file only maps parameters in and results to the reference's text.
use rmcp::{handler::server::wrapper::Parameters, model::CallToolResult, schemars, tool, tool_router};
use serde::Deserialize;

use super::{SandboxServer, default_sandbox, fail, ok};
use sandbox_orchestrator::{
    forward::{Exposed, ForwardInfo},
    helper_client::{NetworkEvents, RefusedFlow},
    network::{DEFAULT_POLICY_TEXT, EventsView, Network, NetworkRow},
};

/// Refusals shown per sandbox (the newest).
const EVENTS_SHOWN: usize = 10;

/// Parameters of `expose`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ExposeParams {
    /// TCP port inside the sandbox (1-65535).
    pub port: i64,
    /// Port on the host's 127.0.0.1; 0 means the same as `port`.
    #[serde(default)]
    pub host_port: i64,
    /// Sandbox name.
    #[serde(default = "default_sandbox")]
    pub sandbox: String,
}

/// Parameters of `unexpose`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct UnexposeParams {
    /// Host port of the forward to stop.
    pub port: i64,
}

/// What the agent reads after a successful `expose`.
fn exposed_text(e: &Exposed) -> String {
    let f = &e.forward;
    let mut lines = vec![
        format!(
            "Forwarding localhost:{} -> '{}':{}",
            f.host_port,
            sandbox_orchestrator::names::display(&f.sandbox),
            f.port
        ),
        format!("  URL:  http://localhost:{}", f.host_port),
        format!("  curl: curl http://localhost:{}", f.host_port),
    ];
    if !e.listening {
        lines.push(format!("  Warning: port {} is not yet listening in the sandbox", f.port));
    }
    lines.join("\n")
}

fn unexposed_text(f: &ForwardInfo) -> String {
    format!(
        "Stopped forwarding localhost:{} -> '{}':{} ({} connections served)",
        f.host_port,
        sandbox_orchestrator::names::display(&f.sandbox),
        f.port,
        f.connections
    )
}

/// Sandboxes have no routable address, so each line shows the network mode
/// where the reference showed an IP; below it the egress policy and the
/// connections it refused, then the forwards. Since sandboxes are isolated
/// from each other by construction, that fact replaces the reference's pings.
fn network_text(rows: &[NetworkRow], forwards: &[ForwardInfo]) -> String {
    if rows.is_empty() {
        return "No active sandboxes.".to_string();
    }
    let mut lines = Vec::new();
    for row in rows {
        let s = &row.sandbox;
        let alive = if row.alive { "alive" } else { "dead" };
        lines.push(format!("{:<12}  {}  net:{}  shell:{alive}", s.shown(), s.shown(), s.network.mode()));
        lines.extend(policy_lines(&s.network));
        if let Some(now) = &row.configured {
            let rules = match now {
                Network::Egress(p) if !p.is_default() => " with its own allow/deny rules",
                _ => "",
            };
            lines.push(format!(
                "  configuration now says: {}{rules}; this sandbox keeps the network it was created with until \
                 reset(sandbox='{}')",
                now.mode(),
                s.shown()
            ));
        }
        lines.extend(event_lines(&row.events));
        for f in forwards.iter().filter(|f| f.sandbox == s.name) {
            lines.push(format!("  forward localhost:{} -> :{} ({} connections)", f.host_port, f.port, f.connections));
        }
    }
    lines.push(
        "Sandboxes are isolated from each other and from the host: separate network namespaces, and egress \
         goes through the helper's policy-checked network stack, which never reaches the host's loopback or \
         its own addresses. Use expose() to reach a sandbox port from the host."
            .to_string(),
    );
    lines.join("\n")
}

fn policy_lines(network: &Network) -> Vec<String> {
    match network {
        Network::None => vec!["  policy: loopback only".to_string()],
        Network::Egress(p) if p.is_default() => vec![format!("  policy: {DEFAULT_POLICY_TEXT}")],
        Network::Egress(p) => {
            let mut lines = vec!["  policy: deny rules first, then allow; never the host or loopback".to_string()];
            lines.push(if p.allow.is_empty() {
                "  allow: public internet (no private ranges)".to_string()
            } else {
                format!("  allow: {}", p.allow.join(", "))
            });
            if !p.deny.is_empty() {
                lines.push(format!("  deny: {}", p.deny.join(", ")));
            }
            lines
        }
    }
}

fn refused_line(e: &RefusedFlow) -> String {
    let name = if e.name.is_empty() || e.name == e.destination { String::new() } else { format!(" ({})", e.name) };
    format!("  refused {} {}{name} \u{2014} {}", e.protocol, e.destination, e.reason)
}

fn event_lines(events: &EventsView) -> Vec<String> {
    match events {
        EventsView::NotApplicable | EventsView::Unsupported => Vec::new(),
        EventsView::Unavailable(why) => vec![format!("  refused connections: unavailable ({why})")],
        EventsView::Events(NetworkEvents { refused, refused_total, allowed_total }) => {
            let mut lines: Vec<String> =
                refused.iter().skip(refused.len().saturating_sub(EVENTS_SHOWN)).map(refused_line).collect();
            if *refused_total > 0 {
                lines.push(format!("  {refused_total} refused, {allowed_total} allowed since start"));
            }
            lines
        }
    }
}

#[tool_router(router = network_router, vis = "pub(super)")]
impl SandboxServer {
    #[tool(
        description = "Forward a port on the host's localhost (127.0.0.1 only) to a TCP port inside a sandbox, e.g. to open a dev server. host_port 0 uses the same number. The forward follows the sandbox across reset.",
        annotations(destructive_hint = false, idempotent_hint = false, open_world_hint = false)
    )]
    async fn expose(&self, Parameters(p): Parameters<ExposeParams>) -> Result<CallToolResult, rmcp::ErrorData> {
        if self.manager.get(&p.sandbox).is_ok_and(|s| !self.spawns.may_forward(&s)) {
            return fail("port forwarding not permitted on child sandboxes");
        }
        match self.forwards.expose(&p.sandbox, p.port, p.host_port).await {
            Ok(e) => ok(exposed_text(&e)),
            Err(e) => fail(e),
        }
    }

    #[tool(
        description = "Stop the port forward on a host port. Connections already open finish on their own.",
        annotations(destructive_hint = true, idempotent_hint = false, open_world_hint = false)
    )]
    async fn unexpose(&self, Parameters(p): Parameters<UnexposeParams>) -> Result<CallToolResult, rmcp::ErrorData> {
        match self.forwards.unexpose(p.port).await {
            Ok(f) => ok(unexposed_text(&f)),
            Err(e) => fail(e),
        }
    }

    #[tool(
        description = "Each sandbox's network mode (egress or none), its egress policy (allow/deny rules or the default: public internet, never the host, loopback or private ranges), the recent connections the policy refused with why, and its port forwards.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn network_info(&self) -> Result<CallToolResult, rmcp::ErrorData> {
        match self.manager.network_report().await {
            Ok(rows) => ok(network_text(&rows, &self.forwards.list())),
            Err(e) => fail(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fwd(connections: u64) -> ForwardInfo {
        ForwardInfo { host_port: 8080, sandbox: "web".into(), port: 8000, connections }
    }

    #[test]
    fn texts_keep_the_reference_shapes() {
        let e = Exposed { forward: fwd(0), listening: false };
        assert_eq!(
            exposed_text(&e),
            "Forwarding localhost:8080 -> 'web':8000\n  URL:  http://localhost:8080\n  curl: curl http://localhost:8080\n  Warning: port 8000 is not yet listening in the sandbox"
        );
        assert!(!exposed_text(&Exposed { forward: fwd(0), listening: true }).contains("Warning"));
        assert_eq!(unexposed_text(&fwd(3)), "Stopped forwarding localhost:8080 -> 'web':8000 (3 connections served)");
        assert_eq!(network_text(&[], &[]), "No active sandboxes.");
    }

    #[test]
    fn policies_and_refusals() {
        use sandbox_orchestrator::network::EgressPolicy;
        assert_eq!(policy_lines(&Network::None), ["  policy: loopback only"]);
        assert_eq!(
            policy_lines(&Network::default()),
            ["  policy: default: public internet; never the host, loopback or private ranges"]
        );
        let p = Network::Egress(EgressPolicy { allow: vec!["pypi.org".into(), "*.x.org:443".into()], deny: vec![] });
        assert_eq!(policy_lines(&p)[1..], ["  allow: pypi.org, *.x.org:443"]);
        let p = Network::Egress(EgressPolicy { allow: vec![], deny: vec!["10.1.0.0/16".into()] });
        assert_eq!(policy_lines(&p)[1..], ["  allow: public internet (no private ranges)", "  deny: 10.1.0.0/16"]);
        let flow = |n: usize| RefusedFlow {
            protocol: "tcp".into(),
            destination: format!("127.0.0.{n}:8765"),
            reason: "loopback is never reachable".into(),
            ..Default::default()
        };
        let events = NetworkEvents { refused: (1..=12).map(flow).collect(), refused_total: 40, allowed_total: 3 };
        let lines = event_lines(&EventsView::Events(events));
        assert_eq!(lines.len(), EVENTS_SHOWN + 1);
        assert_eq!(lines[0], "  refused tcp 127.0.0.3:8765 \u{2014} loopback is never reachable");
        assert_eq!(lines[EVENTS_SHOWN], "  40 refused, 3 allowed since start");
        let named = RefusedFlow { name: "example.org".into(), ..flow(1) };
        assert!(refused_line(&named).starts_with("  refused tcp 127.0.0.1:8765 (example.org) \u{2014} "));
        assert!(event_lines(&EventsView::Unsupported).is_empty());
    }
}
