//! Orchestrator configuration: defaults for new sandboxes, per-name profiles,
//! the idle TTL, leases and capacity limits, the host roots and the project
//! directory (see [`super::project`]). Read from a TOML file
//! (`$XDG_CONFIG_HOME/sandbox-mcp/config.toml`, or `SANDBOX_MCP_CONFIG`), then
//! overridden by environment variables. Precedence: env > file > built-in.
//!
//! ```toml
//! idle_ttl = 1800                      # seconds; 0 disables reaping
//! lease_ttl = 60                       # minutes every new sandbox lives; 0: no lease
//! max_lease_ttl = 120                  # minutes: bound of lease_ttl and of extend_ttl
//! max_sandboxes = 16
//! host_roots = ["~/src", "/data/in"]   # default: the server's start directory
//! [defaults]
//! image = "mcp-dev"
//! cpus = 2
//! memory = "512M"
//! network = "egress"                   # or "none"
//! [profiles.offline]                   # applies to the sandbox named "offline"
//! network = "none"
//! memory = "1G"
//! [spawn_policies.default]              # who may spawn children (see spawn::policy)
//! max_concurrent = 3
//! inject_ctl = true                     # opt in to sandbox-ctl inside "default"
//! ```
//!
//! Without a `[spawn_policies]` table, `default` may spawn under the built-in
//! policy (no sandbox-ctl); with one, exactly the listed names may.
use std::{
    collections::{BTreeMap, HashMap},
    path::PathBuf,
    time::Duration,
};

use serde::Deserialize;

use super::{
    error::OrchestratorError,
    helper_client::Network,
    hostpath::HostRoots,
    lease::Limits,
    spawn::policy::{SpawnPolicy, SpawnPolicyFile},
};

/// What a sandbox is created with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    /// Image name.
    pub image: String,
    /// Whole CPUs.
    pub cpus: u32,
    /// Memory limit in bytes.
    pub memory_bytes: u64,
    /// Network mode.
    pub network: Network,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProfileFile {
    image: Option<String>,
    cpus: Option<u32>,
    memory: Option<String>,
    network: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    idle_ttl: Option<u64>,
    lease_ttl: Option<u64>,
    max_lease_ttl: Option<u64>,
    max_sandboxes: Option<usize>,
    host_roots: Option<Vec<String>>,
    #[serde(default)]
    defaults: ProfileFile,
    #[serde(default)]
    profiles: HashMap<String, ProfileFile>,
    spawn_policies: Option<BTreeMap<String, SpawnPolicyFile>>,
}

/// The whole orchestrator configuration.
#[derive(Debug, Clone)]
pub struct Config {
    defaults: Profile,
    profiles: HashMap<String, Profile>,
    /// Sandboxes idle longer than this are reaped (except `default`); `None` disables.
    pub idle_ttl: Option<Duration>,
    /// Host paths upload/download/sync may touch.
    pub host_roots: HostRoots,
    /// Root of per-sandbox volumes.
    pub volumes_dir: PathBuf,
    /// Leases and capacity limits.
    pub limits: Limits,
    /// Where `.sandbox-mcp.toml` is looked for: `SANDBOX_MCP_PROJECT_DIR`,
    /// else the first host root (the server's start directory by default).
    pub project_dir: PathBuf,
    /// Who may spawn child sandboxes, by parent name.
    pub spawn_policies: BTreeMap<String, SpawnPolicy>,
}

/// A configuration error naming its key.
pub(super) fn invalid(key: &str, msg: impl std::fmt::Display) -> OrchestratorError {
    OrchestratorError::InvalidArgument(format!("config {key}: {msg}"))
}

/// Parse `512M`, `2G`, `1024` (MiB), `512MB`, `2GiB`.
pub fn parse_memory(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits: String = t.chars().take_while(|c| c.is_ascii_digit()).collect();
    let unit = t[digits.len()..].trim().to_ascii_uppercase();
    let n: u64 = digits.parse().map_err(|_| format!("invalid memory size '{s}' (use e.g. 512M or 2G)"))?;
    let mib = match unit.as_str() {
        "" | "M" | "MB" | "MIB" => n,
        "G" | "GB" | "GIB" => n * 1024,
        _ => return Err(format!("invalid memory size '{s}' (use e.g. 512M or 2G)")),
    };
    if mib < 64 {
        return Err(format!("memory must be at least 64M (got '{s}')"));
    }
    Ok(mib << 20)
}

fn parse_network(key: &str, s: &str) -> Result<Network, OrchestratorError> {
    match s {
        "egress" => Ok(Network::Egress),
        "none" => Ok(Network::None),
        other => Err(invalid(key, format!("network must be 'egress' or 'none', not '{other}'"))),
    }
}

fn apply(base: &Profile, f: &ProfileFile, key: &str) -> Result<Profile, OrchestratorError> {
    let mut p = base.clone();
    if let Some(i) = &f.image {
        crate::image::validate_name(i).map_err(|e| invalid(&format!("{key}.image"), e))?;
        p.image = i.clone();
    }
    if let Some(c) = f.cpus {
        if c == 0 {
            return Err(invalid(&format!("{key}.cpus"), "must be at least 1"));
        }
        p.cpus = c;
    }
    if let Some(m) = &f.memory {
        p.memory_bytes = parse_memory(m).map_err(|e| invalid(&format!("{key}.memory"), e))?;
    }
    if let Some(n) = &f.network {
        p.network = parse_network(&format!("{key}.network"), n)?;
    }
    Ok(p)
}

/// An environment variable, unset when empty.
pub(super) fn env(key: &str) -> Option<String> {
    std::env::var(key).ok().filter(|v| !v.is_empty())
}

impl Config {
    /// The config file's path.
    pub fn path() -> PathBuf {
        env("SANDBOX_MCP_CONFIG").map(PathBuf::from).unwrap_or_else(|| crate::paths::config_dir().join("config.toml"))
    }

    /// Load the file (if present) and apply environment overrides.
    pub fn load() -> Result<Self, OrchestratorError> {
        let path = Self::path();
        let file: ConfigFile = match std::fs::read_to_string(&path) {
            Ok(text) => toml::from_str(&text)
                .map_err(|e| OrchestratorError::InvalidArgument(format!("config file {}: {e}", path.display())))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => ConfigFile::default(),
            Err(e) => {
                return Err(OrchestratorError::InvalidArgument(format!("cannot read {}: {e}", path.display())));
            }
        };
        Self::from_file(file)
    }

    fn from_file(file: ConfigFile) -> Result<Self, OrchestratorError> {
        let builtin = Profile {
            image: crate::image::DEFAULT_IMAGE.to_string(),
            cpus: 2,
            memory_bytes: 512 << 20,
            network: Network::Egress,
        };
        let mut defaults = apply(&builtin, &file.defaults, "defaults")?;
        if let Some(i) = env("SANDBOX_MCP_DEFAULT_IMAGE") {
            defaults.image = i;
        }
        if let Some(n) = env("SANDBOX_MCP_NETWORK") {
            defaults.network = parse_network("SANDBOX_MCP_NETWORK", &n)?;
        }
        let mut profiles = HashMap::new();
        for (name, f) in &file.profiles {
            super::names::validate_top_level_name(name)?;
            profiles.insert(name.clone(), apply(&defaults, f, &format!("profiles.{name}"))?);
        }
        let spawn_policies = match &file.spawn_policies {
            None => BTreeMap::from([("default".to_string(), SpawnPolicy::builtin(&defaults.image))]),
            Some(table) => {
                let mut out = BTreeMap::new();
                for (name, f) in table {
                    super::names::validate_top_level_name(name)?;
                    out.insert(
                        name.clone(),
                        SpawnPolicy::from_file(f, &defaults.image, &format!("spawn_policies.{name}"))?,
                    );
                }
                out
            }
        };
        let idle_secs = match env("SANDBOX_MCP_IDLE_TTL") {
            Some(v) => v
                .parse::<u64>()
                .map_err(|_| invalid("SANDBOX_MCP_IDLE_TTL", format!("'{v}' is not a number of seconds")))?,
            None => file.idle_ttl.unwrap_or(1800),
        };
        let roots: Vec<PathBuf> = match env("SANDBOX_MCP_HOST_ROOTS") {
            Some(v) => v.split(':').filter(|s| !s.is_empty()).map(PathBuf::from).collect(),
            None => match file.host_roots {
                Some(list) => list.iter().map(|s| super::hostpath::expand_home(s)).collect(),
                None => {
                    vec![std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/nonexistent"))]
                }
            },
        };
        let host_roots = HostRoots::new(&roots)?;
        let project_dir = env("SANDBOX_MCP_PROJECT_DIR")
            .map(PathBuf::from)
            .or_else(|| host_roots.roots().first().cloned())
            .unwrap_or_else(|| PathBuf::from("."));
        Ok(Self {
            defaults,
            profiles,
            idle_ttl: (idle_secs > 0).then(|| Duration::from_secs(idle_secs)),
            host_roots,
            volumes_dir: crate::paths::volumes_dir(),
            limits: Limits::load(file.lease_ttl, file.max_lease_ttl, file.max_sandboxes)?,
            project_dir,
            spawn_policies,
        })
    }

    /// The profile a sandbox of this name is created with.
    pub fn profile_for(&self, name: &str) -> &Profile {
        self.profiles.get(name).unwrap_or(&self.defaults)
    }

    /// Defaults for names without a profile.
    pub fn defaults(&self) -> &Profile {
        &self.defaults
    }

    /// Names that have a profile, with it.
    pub fn profiles(&self) -> impl Iterator<Item = (&String, &Profile)> {
        self.profiles.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_sizes() {
        assert_eq!(parse_memory("512M").unwrap(), 512 << 20);
        assert_eq!(parse_memory("2G").unwrap(), 2 << 30);
        assert_eq!(parse_memory("1024").unwrap(), 1 << 30);
        assert!(parse_memory("12").is_err());
        assert!(parse_memory("lots").is_err());
        assert!(parse_memory("5T").is_err());
    }

    #[test]
    fn file_profiles_and_errors() {
        let file: ConfigFile = toml::from_str(
            "idle_ttl = 0\nhost_roots = [\"/tmp\"]\n[defaults]\ncpus = 1\n[profiles.off]\nnetwork = \"none\"\nmemory = \"1G\"\n",
        )
        .unwrap();
        let c = Config::from_file(file).unwrap();
        assert_eq!(c.idle_ttl, None);
        assert_eq!(c.profile_for("off").network, Network::None);
        assert_eq!(c.profile_for("off").cpus, 1);
        assert_eq!(c.profile_for("off").memory_bytes, 1 << 30);
        assert_eq!(c.profile_for("other").memory_bytes, 512 << 20);
        let bad: ConfigFile = toml::from_str("[profiles.x]\nnetwork = \"wifi\"\n").unwrap();
        assert!(Config::from_file(bad).unwrap_err().to_string().contains("profiles.x.network"));
        assert!(toml::from_str::<ConfigFile>("bogus = 1\n").is_err());
    }

    #[test]
    fn spawn_policies_builtin_or_listed() {
        let c = Config::from_file(toml::from_str("host_roots = [\"/tmp\"]\n").unwrap()).unwrap();
        assert_eq!(c.spawn_policies.keys().collect::<Vec<_>>(), ["default"]);
        assert!(!c.spawn_policies["default"].inject_ctl);
        assert_eq!(c.spawn_policies["default"].allowed_images, vec![c.defaults().image.clone()]);
        let file = "host_roots = [\"/tmp\"]\n[spawn_policies.boss]\ninject_ctl = true\nmax_total = 2\n";
        let c = Config::from_file(toml::from_str(file).unwrap()).unwrap();
        assert_eq!(c.spawn_policies.keys().collect::<Vec<_>>(), ["boss"]);
        assert_eq!((c.spawn_policies["boss"].max_total, c.spawn_policies["boss"].inject_ctl), (2, true));
        let bad = "host_roots = [\"/tmp\"]\n[spawn_policies.boss]\nchild_network_peers = \"x\"\n";
        let e = Config::from_file(toml::from_str(bad).unwrap()).unwrap_err().to_string();
        assert!(e.contains("spawn_policies.boss.child_network_peers"), "{e}");
        let e = toml::from_str::<ConfigFile>("[spawn_policies.boss]\nmax_kids = 1\n").unwrap_err().to_string();
        assert!(e.contains("max_kids"), "{e}");
    }
}
