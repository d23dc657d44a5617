//! Orchestrator configuration: defaults for new sandboxes, per-name profiles,
//! the idle TTL, leases and capacity limits, the host roots and the project
//! directory (see [`super::project`]). Read from a TOML file
//! (`$XDG_CONFIG_HOME/sandbox-mcp/config.toml`, or `SANDBOX_MCP_CONFIG`), then
//! overridden by environment variables. Precedence: env > file > built-in.
//! The environment and start directory are a [`ConfigSource`]: this process's
//! own, or in the daemon, those of the front-end a session came through, so
//! each session gets the configuration its client started it with.
//!
//! ```toml
//! idle_ttl = 1800                      # seconds; 0 disables reaping
//! lease_ttl = 60                       # minutes every new sandbox lives; 0: no lease
//! max_lease_ttl = 120                  # minutes: bound of lease_ttl and of extend_ttl
//! max_sandboxes = 16
//! isolation = "namespaces"             # or "vm": the default of every sandbox (super::isolation)
//! host_roots = ["~/src", "/data/in"]   # default: the session's start directory
//! host_write_deny = ["*.pem"]          # more places no sandbox file is written (super::hostguard)
//! host_write_allow = [".vscode/"]      # built-in guard rules to lift, by name
//! [defaults]
//! image = "mcp-dev"
//! cpus = 2
//! memory = "512M"
//! pids = 1024                          # tasks (processes and threads) at once
//! network = "egress"                   # or "none", or { allow = [...], deny = [...] }
//! disk = "10G"                         # disk quota (writable layer, /workspace, /tmp)
//! trust_host_ca = true                 # the host's CA certificates in the sandbox's trust store (super::ca_trust)
//! [profiles.offline]                   # applies to the sandbox named "offline"
//! network = "none"
//! isolation = "vm"                     # this sandbox runs in a microVM
//! memory = "1G"
//! [profiles.pypi.network]              # egress under a policy (see super::network)
//! allow = ["pypi.org", "files.pythonhosted.org"]
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
    sync::Arc,
    time::Duration,
};

use sandbox_image::oci::RegistryConfig;
use serde::{Deserialize, Serialize};
use toml::Value;

use super::{
    error::OrchestratorError,
    hostguard::HostGuard,
    hostpath::HostRoots,
    isolation::Isolation,
    lease::Limits,
    network::Network,
    spawn::policy::{SpawnPolicy, SpawnPolicyFile},
};

/// Disk quota of a sandbox unless configured.
pub const DEFAULT_DISK_BYTES: u64 = 10 << 30;

/// Task limit of a sandbox unless configured.
pub const DEFAULT_PIDS: u32 = 1024;

/// The lowest task limit accepted: the sandbox's init and agent (with its
/// threads) count against it before any command runs.
const MIN_PIDS: u32 = 8;

/// What a sandbox is created with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    /// Image name.
    pub image: String,
    /// Whole CPUs.
    pub cpus: u32,
    /// Memory limit in bytes.
    pub memory_bytes: u64,
    /// Task limit (processes and threads at once).
    pub pids: u32,
    /// Network mode and egress policy.
    pub network: Network,
    /// Disk quota in bytes.
    pub disk_bytes: u64,
    /// Add the host's CA bundle to the sandbox's trust store.
    pub trust_host_ca: bool,
    /// The helper driver it runs on.
    pub isolation: Isolation,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProfileFile {
    image: Option<String>,
    cpus: Option<u32>,
    memory: Option<String>,
    pids: Option<u32>,
    // Checked by hand, so that every problem names its key.
    network: Option<Value>,
    disk: Option<Value>,
    trust_host_ca: Option<Value>,
    isolation: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    idle_ttl: Option<u64>,
    lease_ttl: Option<u64>,
    max_lease_ttl: Option<u64>,
    max_sandboxes: Option<usize>,
    host_roots: Option<Vec<String>>,
    /// Rules added to the host write guard's (only here, never in a project
    /// file, which a sandbox could have written).
    #[serde(default)]
    host_write_deny: Vec<String>,
    /// Guard rules lifted, by their pattern.
    #[serde(default)]
    host_write_allow: Vec<String>,
    /// The default isolation (also `[defaults] isolation`, which wins).
    isolation: Option<Value>,
    #[serde(default)]
    defaults: ProfileFile,
    #[serde(default)]
    profiles: HashMap<String, ProfileFile>,
    spawn_policies: Option<BTreeMap<String, SpawnPolicyFile>>,
    /// Registry mirrors and plain-HTTP registries (only here: a project
    /// file could redirect pulls).
    #[serde(default)]
    registries: RegistryConfig,
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
    /// else the first host root (the session's start directory by default).
    pub project_dir: PathBuf,
    /// The project the session's sandbox names belong to: its project
    /// directory's (see [`super::project::Project`]).
    pub project: super::project::Project,
    /// Who may spawn child sandboxes, by parent name.
    pub spawn_policies: BTreeMap<String, SpawnPolicy>,
    /// Where images are pulled from: `[registries]` mirrors and insecure.
    pub registries: RegistryConfig,
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

/// Parse a disk quota like `20G`, `512M`, `1T`, `2048` (MiB).
pub fn parse_disk(s: &str) -> Result<u64, String> {
    let bad = || format!("invalid disk size '{s}' (use e.g. 10G or 512M)");
    let t = s.trim();
    let digits: String = t.chars().take_while(|c| c.is_ascii_digit()).collect();
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let shift = match t[digits.len()..].trim().to_ascii_uppercase().as_str() {
        "" | "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => return Err(bad()),
    };
    let bytes = n.checked_mul(1 << shift).ok_or_else(bad)?;
    if bytes < 64 << 20 {
        return Err(format!("disk must be at least 64M (got '{s}')"));
    }
    Ok(bytes)
}

/// The `disk` value: a size string.
pub fn disk_from_toml(value: &Value) -> Result<u64, String> {
    match value.as_str() {
        Some(s) => parse_disk(s),
        None => Err(format!("expected a size string such as \"20G\", not {value}")),
    }
}

/// The `trust_host_ca` value: a boolean.
pub fn trust_from_toml(value: &Value) -> Result<bool, String> {
    value.as_bool().ok_or_else(|| format!("expected true or false, not {value}"))
}

/// A `network` value, or the first problem as a config error.
fn network_from_toml(key: &str, value: &Value) -> Result<Network, OrchestratorError> {
    Network::from_toml(key, value).map_err(|problems| {
        let (key, msg) = problems.into_iter().next().unwrap_or_default();
        invalid(&key, msg)
    })
}

fn apply(base: &Profile, f: &ProfileFile, key: &str) -> Result<Profile, OrchestratorError> {
    let mut p = base.clone();
    if let Some(i) = &f.image {
        sandbox_image::validate_name(i).map_err(|e| invalid(&format!("{key}.image"), e))?;
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
    if let Some(n) = f.pids {
        if n < MIN_PIDS {
            return Err(invalid(&format!("{key}.pids"), format!("must be at least {MIN_PIDS}")));
        }
        p.pids = n;
    }
    if let Some(n) = &f.network {
        p.network = network_from_toml(&format!("{key}.network"), n)?;
    }
    if let Some(d) = &f.disk {
        p.disk_bytes = disk_from_toml(d).map_err(|e| invalid(&format!("{key}.disk"), e))?;
    }
    if let Some(t) = &f.trust_host_ca {
        p.trust_host_ca = trust_from_toml(t).map_err(|e| invalid(&format!("{key}.trust_host_ca"), e))?;
    }
    if let Some(i) = &f.isolation {
        p.isolation = Isolation::from_toml(i).map_err(|e| invalid(&format!("{key}.isolation"), e))?;
    }
    Ok(p)
}

/// The prefix of every environment variable that configures sandbox-mcp.
pub const ENV_PREFIX: &str = "SANDBOX_MCP_";

/// What a configuration is read from besides the files: the `SANDBOX_MCP_*`
/// environment and the start directory (the default host root and project
/// directory).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigSource {
    /// `SANDBOX_MCP_*` variables.
    pub vars: BTreeMap<String, String>,
    /// The start directory.
    pub cwd: PathBuf,
}

impl ConfigSource {
    /// This process's environment and working directory.
    pub fn current() -> Self {
        Self {
            vars: std::env::vars().filter(|(k, _)| k.starts_with(ENV_PREFIX)).collect(),
            cwd: std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/nonexistent")),
        }
    }

    /// A variable, unset when empty.
    pub fn var(&self, key: &str) -> Option<String> {
        self.vars.get(key).filter(|v| !v.is_empty()).cloned()
    }
}

tokio::task_local! {
    /// The configuration of the session a tool call came from (see
    /// [`with_session`]); absent outside sessions (restore, reaper, watchdog).
    static SESSION: Arc<Config>;
}

/// Runs `f` with `config` as the configuration every
/// [`super::SandboxManager::config`] call inside it sees.
pub async fn with_session<F: std::future::Future>(config: Arc<Config>, f: F) -> F::Output {
    SESSION.scope(config, f).await
}

/// The configuration of the session this task serves, if it serves one.
pub(super) fn session() -> Option<Arc<Config>> {
    SESSION.try_with(Arc::clone).ok()
}

impl Config {
    /// The config file's path.
    pub fn path() -> PathBuf {
        Self::path_for(&ConfigSource::current())
    }

    fn path_for(source: &ConfigSource) -> PathBuf {
        source
            .var("SANDBOX_MCP_CONFIG")
            .map(PathBuf::from)
            .unwrap_or_else(|| sandbox_base::paths::config_dir().join("config.toml"))
    }

    /// Load the file (if present) and apply this process's environment.
    pub fn load() -> Result<Self, OrchestratorError> {
        Self::load_from(&ConfigSource::current())
    }

    /// Load the file (if present) and apply `source`'s environment.
    pub fn load_from(source: &ConfigSource) -> Result<Self, OrchestratorError> {
        let path = Self::path_for(source);
        let file: ConfigFile = match std::fs::read_to_string(&path) {
            Ok(text) => toml::from_str(&text)
                .map_err(|e| OrchestratorError::InvalidArgument(format!("config file {}: {e}", path.display())))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => ConfigFile::default(),
            Err(e) => {
                return Err(OrchestratorError::InvalidArgument(format!("cannot read {}: {e}", path.display())));
            }
        };
        Self::from_file(file, source)
    }

    fn from_file(file: ConfigFile, source: &ConfigSource) -> Result<Self, OrchestratorError> {
        let env = |key: &str| source.var(key);
        let builtin = Profile {
            image: sandbox_image::DEFAULT_IMAGE.to_string(),
            cpus: 2,
            memory_bytes: 512 << 20,
            pids: DEFAULT_PIDS,
            network: Network::default(),
            disk_bytes: DEFAULT_DISK_BYTES,
            trust_host_ca: true,
            isolation: match &file.isolation {
                Some(i) => Isolation::from_toml(i).map_err(|e| invalid("isolation", e))?,
                None => Isolation::default(),
            },
        };
        let mut defaults = apply(&builtin, &file.defaults, "defaults")?;
        if let Some(i) = env("SANDBOX_MCP_ISOLATION") {
            defaults.isolation = Isolation::parse(&i).map_err(|e| invalid("SANDBOX_MCP_ISOLATION", e))?;
        }
        if let Some(i) = env("SANDBOX_MCP_DEFAULT_IMAGE") {
            defaults.image = i;
        }
        if let Some(n) = env("SANDBOX_MCP_NETWORK") {
            defaults.network = Network::from_mode(&n)
                .ok_or_else(|| invalid("SANDBOX_MCP_NETWORK", format!("must be 'egress' or 'none', not '{n}'")))?;
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
                None => vec![source.cwd.clone()],
            },
        };
        let guard = HostGuard::new(&file.host_write_deny, &file.host_write_allow, &Self::path_for(source))
            .map_err(|e| OrchestratorError::InvalidArgument(e.to_string()))?;
        let host_roots = HostRoots::new(&roots)?.guarded(guard);
        let project_dir = env("SANDBOX_MCP_PROJECT_DIR")
            .map(PathBuf::from)
            .or_else(|| host_roots.roots().first().cloned())
            .unwrap_or_else(|| PathBuf::from("."));
        Ok(Self {
            defaults,
            profiles,
            idle_ttl: (idle_secs > 0).then(|| Duration::from_secs(idle_secs)),
            host_roots,
            volumes_dir: sandbox_base::paths::volumes_dir(),
            limits: Limits::load(file.lease_ttl, file.max_lease_ttl, file.max_sandboxes, source)?,
            project: super::project::Project::of(&project_dir),
            project_dir,
            spawn_policies,
            registries: file.registries,
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
            "idle_ttl = 0\nhost_roots = [\"/tmp\"]\n[defaults]\ncpus = 1\n[profiles.off]\nnetwork = \"none\"\nmemory = \"1G\"\npids = 64\n",
        )
        .unwrap();
        let c = Config::from_file(file, &ConfigSource::default()).unwrap();
        assert_eq!(c.idle_ttl, None);
        assert_eq!(c.profile_for("off").network, Network::None);
        assert_eq!(c.profile_for("off").cpus, 1);
        assert_eq!(c.profile_for("off").memory_bytes, 1 << 30);
        assert_eq!((c.profile_for("off").pids, c.profile_for("other").pids), (64, DEFAULT_PIDS));
        assert_eq!(c.profile_for("other").memory_bytes, 512 << 20);
        let bad: ConfigFile = toml::from_str("[profiles.x]\nnetwork = \"wifi\"\n").unwrap();
        assert!(
            Config::from_file(bad, &ConfigSource::default()).unwrap_err().to_string().contains("profiles.x.network")
        );
        assert!(toml::from_str::<ConfigFile>("bogus = 1\n").is_err());
    }

    #[test]
    fn isolation_default_and_per_profile() {
        let file: ConfigFile = toml::from_str(
            "isolation = \"vm\"\nhost_roots = [\"/tmp\"]\n[profiles.fast]\nisolation = \"namespaces\"\n",
        )
        .unwrap();
        let c = Config::from_file(file, &ConfigSource::default()).unwrap();
        assert_eq!(c.defaults().isolation, Isolation::Vm);
        assert_eq!(c.profile_for("fast").isolation, Isolation::Namespaces);
        let bad: ConfigFile = toml::from_str("host_roots = [\"/tmp\"]\n[profiles.x]\nisolation = \"kvm\"\n").unwrap();
        let e = Config::from_file(bad, &ConfigSource::default()).unwrap_err().to_string();
        assert!(e.contains("profiles.x.isolation") && e.contains("\"namespaces\" or \"vm\""), "{e}");
        let env = ConfigSource { vars: [("SANDBOX_MCP_ISOLATION".into(), "vm".into())].into(), ..Default::default() };
        let c = Config::from_file(toml::from_str("host_roots = [\"/tmp\"]\n").unwrap(), &env).unwrap();
        assert_eq!(c.defaults().isolation, Isolation::Vm);
    }

    #[test]
    fn disk_sizes() {
        assert_eq!(parse_disk("20G").unwrap(), 20 << 30);
        assert_eq!(parse_disk("512M").unwrap(), 512 << 20);
        assert_eq!(parse_disk("1T").unwrap(), 1 << 40);
        assert_eq!(parse_disk("2048").unwrap(), 2 << 30);
        assert_eq!(parse_disk("2GiB").unwrap(), 2 << 30);
        assert!(parse_disk("12M").unwrap_err().contains("at least 64M"));
        assert!(parse_disk("lots").unwrap_err().contains("invalid disk size 'lots'"));
        assert!(parse_disk("5P").is_err());
        assert!(parse_disk("99999999999999999999G").is_err());
        assert!(parse_disk("99999999999T").is_err());
    }

    fn load(text: &str) -> Result<Config, String> {
        let file: ConfigFile = toml::from_str(text).map_err(|e| e.to_string())?;
        Config::from_file(file, &ConfigSource::default()).map_err(|e| e.to_string())
    }

    #[test]
    fn network_disk_and_ca_keys() {
        let c = load(
            "host_roots = [\"/tmp\"]\n[defaults]\ndisk = \"20G\"\ntrust_host_ca = false\n\
             [profiles.pypi]\nnetwork = { allow = [\"pypi.org\"] }\n\
             [profiles.sec.network]\ndeny = [\"203.0.113.0/24\"]\n[profiles.off]\nnetwork = \"none\"\ndisk = \"1G\"\n",
        )
        .unwrap();
        let d = c.defaults();
        assert_eq!((d.network.clone(), d.disk_bytes, d.trust_host_ca), (Network::default(), 20 << 30, false));
        assert_eq!(c.profile_for("pypi").network.summary(), "egress allow=pypi.org");
        assert_eq!(c.profile_for("sec").network.summary(), "egress deny=203.0.113.0/24");
        // Profiles start from the defaults.
        assert_eq!((c.profile_for("pypi").disk_bytes, c.profile_for("pypi").trust_host_ca), (20 << 30, false));
        assert_eq!((c.profile_for("off").network.clone(), c.profile_for("off").disk_bytes), (Network::None, 1 << 30));
        let builtin = load("host_roots = [\"/tmp\"]\n").unwrap();
        let b = builtin.defaults();
        assert_eq!((b.network.clone(), b.disk_bytes, b.trust_host_ca), (Network::default(), DEFAULT_DISK_BYTES, true));
        for (text, want) in [
            (
                "[profiles.x]\nnetwork = { allow = [\"ok.org\", \"not a rule\"] }\n",
                "config profiles.x.network.allow[1]: ",
            ),
            ("[profiles.x.network]\ndeny = [1]\n", "config profiles.x.network.deny[0]: expected a rule string, not 1"),
            ("[profiles.x.network]\nallow = \"pypi.org\"\n", "config profiles.x.network.allow: expected a list"),
            ("[profiles.x.network]\nports = [443]\n", "config profiles.x.network.ports: is not supported"),
            ("[defaults]\nnetwork = 1\n", "config defaults.network: must be \"egress\", \"none\" or a table"),
            ("[defaults]\ndisk = \"huge\"\n", "config defaults.disk: invalid disk size 'huge'"),
            ("[defaults]\ndisk = 20\n", "config defaults.disk: expected a size string such as \"20G\", not 20"),
            ("[profiles.x]\ntrust_host_ca = \"yes\"\n", "config profiles.x.trust_host_ca: expected true or false"),
            ("[profiles.x]\npids = 4\n", "config profiles.x.pids: must be at least 8"),
            ("host_write_allow = [\".gti/\"]\n", "config host_write_allow: \".gti/\" is not a deny rule"),
            ("host_write_deny = [\"/etc\"]\n", "config host_write_deny: \"/etc\": rules match anywhere"),
        ] {
            let e = load(&format!("host_roots = [\"/tmp\"]\n{text}")).unwrap_err();
            assert!(e.starts_with(want), "{text}: {e}");
        }
        assert!(
            load("[profiles.x.network]\nallow = [\"ok.org\", \"not a rule\"]\n").unwrap_err().contains("not a rule")
        );
    }

    #[test]
    fn a_source_gives_the_start_directory_and_environment() {
        let vars = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let source = ConfigSource {
            vars: vars(&[("SANDBOX_MCP_NETWORK", "none"), ("SANDBOX_MCP_DEFAULT_IMAGE", "")]),
            cwd: PathBuf::from("/tmp"),
        };
        let c = Config::from_file(ConfigFile::default(), &source).unwrap();
        assert_eq!((c.project_dir.clone(), c.defaults().network.clone()), (PathBuf::from("/tmp"), Network::None));
        // An empty variable counts as unset.
        assert_eq!(c.defaults().image, sandbox_image::DEFAULT_IMAGE);
        let bad = ConfigSource { vars: vars(&[("SANDBOX_MCP_NETWORK", "wifi")]), cwd: PathBuf::from("/tmp") };
        let e = Config::from_file(ConfigFile::default(), &bad).unwrap_err().to_string();
        assert!(e.contains("SANDBOX_MCP_NETWORK"), "{e}");
    }

    #[test]
    fn spawn_policies_builtin_or_listed() {
        let c =
            Config::from_file(toml::from_str("host_roots = [\"/tmp\"]\n").unwrap(), &ConfigSource::default()).unwrap();
        assert_eq!(c.spawn_policies.keys().collect::<Vec<_>>(), ["default"]);
        assert!(!c.spawn_policies["default"].inject_ctl);
        assert_eq!(c.spawn_policies["default"].allowed_images, vec![c.defaults().image.clone()]);
        let file = "host_roots = [\"/tmp\"]\n[spawn_policies.boss]\ninject_ctl = true\nmax_total = 2\n";
        let c = Config::from_file(toml::from_str(file).unwrap(), &ConfigSource::default()).unwrap();
        assert_eq!(c.spawn_policies.keys().collect::<Vec<_>>(), ["boss"]);
        assert_eq!((c.spawn_policies["boss"].max_total, c.spawn_policies["boss"].inject_ctl), (2, true));
        let bad = "host_roots = [\"/tmp\"]\n[spawn_policies.boss]\nchild_network_peers = \"x\"\n";
        let e = Config::from_file(toml::from_str(bad).unwrap(), &ConfigSource::default()).unwrap_err().to_string();
        assert!(e.contains("spawn_policies.boss.child_network_peers"), "{e}");
        let e = toml::from_str::<ConfigFile>("[spawn_policies.boss]\nmax_kids = 1\n").unwrap_err().to_string();
        assert!(e.contains("max_kids"), "{e}");
    }
}
