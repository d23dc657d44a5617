//! The per-project config file, `.sandbox-mcp.toml` in the project directory
//! ([`super::Config::project_dir`]): what sandboxes of this workspace run
//! and start with. Read at every sandbox creation (and reset), so an edited
//! file applies without a restart.
//!
//! ```toml
//! image = "mcp-dev"
//! cpus = 2
//! memory = "1G"
//! network = "none"                            # or "egress", or { allow = [...], deny = [...] }
//! disk = "20G"
//! trust_host_ca = true
//! isolation = "vm"                            # or "namespaces" (see super::isolation)
//! services = ["python3 -m http.server 8000"]   # started with `bg` as svc-1, svc-2, …
//! [env]
//! APP_ENV = "test"
//! [sync]
//! exclude = ["target/", "*.log"]               # gitignore syntax, for sync
//! ```
//!
//! Precedence: the project file overrides the user config for every sandbox
//! (its `[defaults]`, env overrides and named `[profiles]` alike), which
//! overrides the built-in defaults. No tool takes per-request image or
//! resource settings yet; such a request would come first.
use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use toml::{Table, Value};

use super::{
    config::{Profile, disk_from_toml, parse_memory, trust_from_toml},
    error::OrchestratorError,
    hostpath::Entry,
    isolation::Isolation,
    names::validate_env_key,
    network::Network,
    sandbox::{Sandbox, SandboxManager, WORKSPACE},
};

/// The file's name in the project directory.
pub const PROJECT_FILE: &str = ".sandbox-mcp.toml";

/// A project's identity: the canonical path of its directory, the tag that
/// keys its sandboxes (see [`super::names::key`]) and the id users write to
/// reach its sandboxes from another project (`<id>:<name>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Project {
    /// Canonical path of the project directory.
    pub dir: PathBuf,
    /// First 6 hex digits of the SHA-256 of the path.
    pub tag: String,
    /// `<directory name>-<tag>`, e.g. `api-3f2a1c`.
    pub id: String,
}

/// Projects seen by this process, by tag: how a key's project is shown.
static KNOWN: std::sync::Mutex<BTreeMap<String, Project>> = std::sync::Mutex::new(BTreeMap::new());

impl Project {
    /// The project whose directory is `dir` (canonicalized when it exists:
    /// `./api` and `/home/me/api` are one project).
    pub fn of(dir: &Path) -> Self {
        use sha2::{Digest, Sha256};
        let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
        let digest = Sha256::digest(dir.as_os_str().as_encoded_bytes());
        let tag: String = digest.iter().take(3).map(|b| format!("{b:02x}")).collect();
        // The id's label is the directory name in the characters of a
        // sandbox name, short enough to read: the tag alone identifies.
        let label: String = dir
            .file_name()
            .map(|n| n.to_string_lossy().to_lowercase())
            .unwrap_or_default()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .take(24)
            .collect();
        let label = label.trim_matches('-');
        let id = if label.is_empty() { format!("p-{tag}") } else { format!("{label}-{tag}") };
        let project = Self { dir, tag, id };
        project.remember();
        project
    }

    /// Make this project's id known to [`Self::id_of_tag`].
    pub fn remember(&self) {
        KNOWN.lock().unwrap_or_else(|p| p.into_inner()).insert(self.tag.clone(), self.clone());
    }

    /// A project seen by this process, by tag.
    pub fn by_tag(tag: &str) -> Option<Self> {
        KNOWN.lock().unwrap_or_else(|p| p.into_inner()).get(tag).cloned()
    }

    /// The id of the project tagged `tag`: `legacy` for the empty tag, the
    /// tag itself for a project not seen (yet).
    pub fn id_of_tag(tag: &str) -> String {
        if tag.is_empty() {
            return super::names::LEGACY_PROJECT.to_string();
        }
        Self::by_tag(tag).map(|p| p.id).unwrap_or_else(|| tag.to_string())
    }

    /// The tag a project id names (`api-3f2a1c` → `3f2a1c`; `legacy` → ""),
    /// if it has the form of one.
    pub fn tag_of_id(id: &str) -> Option<&str> {
        if id == super::names::LEGACY_PROJECT {
            return Some("");
        }
        let (_, tag) = id.rsplit_once('-')?;
        (tag.len() == super::names::TAG_LEN && tag.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
            .then_some(tag)
    }
}

const TOP_KEYS: [&str; 10] =
    ["image", "cpus", "memory", "network", "disk", "trust_host_ca", "isolation", "env", "sync", "services"];
const SYNC_KEYS: [&str; 1] = ["exclude"];

/// A valid project file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProjectConfig {
    /// Image name.
    pub image: Option<String>,
    /// Whole CPUs.
    pub cpus: Option<u32>,
    /// Memory limit in bytes.
    pub memory_bytes: Option<u64>,
    /// Network mode and egress policy.
    pub network: Option<Network>,
    /// Disk quota in bytes.
    pub disk_bytes: Option<u64>,
    /// Add the host's CA bundle to the sandbox's trust store.
    pub trust_host_ca: Option<bool>,
    /// The helper driver its sandboxes run on.
    pub isolation: Option<Isolation>,
    /// Persistent env set in every new sandbox.
    pub env: BTreeMap<String, String>,
    /// Extra gitignore-style patterns sync never sends.
    pub sync_exclude: Vec<String>,
    /// Shell commands started in the background in every new sandbox.
    pub services: Vec<String>,
}

impl ProjectConfig {
    /// `base` with this file's settings on top.
    pub fn apply(&self, base: &Profile) -> Profile {
        Profile {
            image: self.image.clone().unwrap_or_else(|| base.image.clone()),
            cpus: self.cpus.unwrap_or(base.cpus),
            memory_bytes: self.memory_bytes.unwrap_or(base.memory_bytes),
            pids: base.pids,
            network: self.network.clone().unwrap_or_else(|| base.network.clone()),
            disk_bytes: self.disk_bytes.unwrap_or(base.disk_bytes),
            trust_host_ca: self.trust_host_ca.unwrap_or(base.trust_host_ca),
            isolation: self.isolation.unwrap_or(base.isolation),
        }
    }

    /// Parse a project file, collecting every problem as `key: what is wrong`.
    pub fn parse(text: &str) -> Result<Self, Vec<String>> {
        let table: Table = toml::from_str(text).map_err(|e| vec![format!("not valid TOML: {}", e.message())])?;
        let mut p = Self::default();
        let mut problems = Vec::new();
        for (key, value) in &table {
            let mut bad = |msg: String| problems.push(format!("{key}: {msg}"));
            match key.as_str() {
                "image" => match value.as_str() {
                    Some(s) => match sandbox_image::validate_name(s) {
                        Ok(()) => p.image = Some(s.to_string()),
                        Err(e) => bad(e.to_string()),
                    },
                    None => bad("expected a string".into()),
                },
                "cpus" => match value.as_integer().map(u32::try_from) {
                    Some(Ok(n)) if n >= 1 => p.cpus = Some(n),
                    _ => bad("expected a whole number of CPUs, at least 1".into()),
                },
                "memory" => match value.as_str() {
                    Some(s) => match parse_memory(s) {
                        Ok(b) => p.memory_bytes = Some(b),
                        Err(e) => bad(e),
                    },
                    None => bad("expected a size string such as \"512M\" or \"2G\"".into()),
                },
                "network" => match Network::from_toml(key, value) {
                    Ok(n) => p.network = Some(n),
                    Err(all) => problems.extend(all.into_iter().map(|(k, msg)| format!("{k}: {msg}"))),
                },
                "disk" => match disk_from_toml(value) {
                    Ok(b) => p.disk_bytes = Some(b),
                    Err(e) => bad(e),
                },
                "trust_host_ca" => match trust_from_toml(value) {
                    Ok(t) => p.trust_host_ca = Some(t),
                    Err(e) => bad(e),
                },
                "isolation" => match Isolation::from_toml(value) {
                    Ok(i) => p.isolation = Some(i),
                    Err(e) => bad(e),
                },
                "env" => match value.as_table() {
                    Some(t) => {
                        for (k, v) in t {
                            match (validate_env_key(k), v.as_str()) {
                                (Err(e), _) => problems.push(format!("env.{k}: {e}")),
                                (Ok(()), None) => problems.push(format!("env.{k}: expected a string")),
                                (Ok(()), Some(v)) => {
                                    p.env.insert(k.clone(), v.to_string());
                                }
                            }
                        }
                    }
                    None => bad("expected a table of KEY = \"value\"".into()),
                },
                "sync" => match value.as_table() {
                    Some(t) => {
                        for (k, v) in t {
                            match k.as_str() {
                                "exclude" => match string_list(v) {
                                    Some(list) => p.sync_exclude = list,
                                    None => problems.push("sync.exclude: expected a list of strings".into()),
                                },
                                other => problems
                                    .push(format!("sync.{other} is not supported (allowed: {})", SYNC_KEYS.join(", "))),
                            }
                        }
                    }
                    None => bad("expected a table".into()),
                },
                "services" => match string_list(value) {
                    Some(list) if list.iter().all(|c| !c.trim().is_empty()) => p.services = list,
                    _ => bad("expected a list of non-empty command strings".into()),
                },
                other => problems.push(format!("{other} is not supported (allowed: {})", TOP_KEYS.join(", "))),
            }
        }
        if problems.is_empty() { Ok(p) } else { Err(problems) }
    }

    /// The project file in `dir`, if there is one.
    pub fn load(dir: &Path) -> Result<Option<(PathBuf, Self)>, OrchestratorError> {
        let path = dir.join(PROJECT_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(OrchestratorError::InvalidArgument(format!("cannot read {}: {e}", path.display())));
            }
        };
        match Self::parse(&text) {
            Ok(p) => Ok(Some((path, p))),
            Err(problems) => Err(OrchestratorError::InvalidArgument(format!(
                "project config {} is invalid (see validate_config): {}",
                path.display(),
                problems.join("; ")
            ))),
        }
    }
}

fn string_list(v: &Value) -> Option<Vec<String>> {
    v.as_array()?.iter().map(|i| i.as_str().map(str::to_string)).collect()
}

/// The background process name of the `n`th service (from 1).
pub fn service_name(n: usize) -> String {
    format!("svc-{n}")
}

/// What `validate_config` found.
#[derive(Debug)]
pub enum Validation {
    /// The file is valid; the profile a sandbox without a request override gets.
    Valid {
        /// The file.
        path: PathBuf,
        /// Its contents.
        project: ProjectConfig,
        /// The resolved settings for the `default` sandbox.
        resolved: Profile,
    },
    /// There is no project file at the default location.
    Absent {
        /// Where it was looked for.
        path: PathBuf,
        /// What sandboxes get from the user config.
        resolved: Profile,
    },
    /// Every problem, each naming its key.
    Invalid {
        /// The file.
        path: PathBuf,
        /// `key: what is wrong` lines.
        problems: Vec<String>,
    },
}

impl SandboxManager {
    /// The profile the sandbox keyed `key` is created with (profiles name
    /// plain names) and the project file, if any.
    pub(super) fn creation_profile(&self, key: &str) -> Result<(Profile, Option<ProjectConfig>), OrchestratorError> {
        let config = self.config();
        let user = config.profile_for(super::names::plain(key));
        Ok(match ProjectConfig::load(&config.project_dir)? {
            Some((_, project)) => (project.apply(user), Some(project)),
            None => (user.clone(), None),
        })
    }

    /// Set the project's env in a new sandbox and start its services.
    pub(super) async fn apply_project(
        &self,
        sandbox: &Sandbox,
        project: &ProjectConfig,
    ) -> Result<(), OrchestratorError> {
        for (k, v) in &project.env {
            self.set_env(sandbox, k, v).await?;
        }
        for (i, command) in project.services.iter().enumerate() {
            self.start_background(sandbox, &service_name(i + 1), command, WORKSPACE, false).await?;
        }
        Ok(())
    }

    /// Check a project file: `path` empty means the project directory's; else
    /// a host file or a directory holding one (under the host roots).
    pub fn validate_project(&self, path: &str) -> Result<Validation, OrchestratorError> {
        let config = self.config();
        let user = config.profile_for("default");
        let (file, text) = if path.is_empty() {
            let file = config.project_dir.join(PROJECT_FILE);
            if !file.exists() {
                return Ok(Validation::Absent { path: file, resolved: user.clone() });
            }
            let text = std::fs::read_to_string(&file)
                .map_err(|e| OrchestratorError::InvalidArgument(format!("cannot read {}: {e}", file.display())))?;
            (file, text)
        } else {
            // A host path: read through the fds hostfs opened, like every
            // other host-path tool.
            let p = self.config().host_roots.locate(path)?;
            match p.open()? {
                Entry::Dir(dir) => {
                    let file = p.shown().join(PROJECT_FILE);
                    let text = dir.read_to_string(std::ffi::OsStr::new(PROJECT_FILE))?.ok_or_else(|| {
                        OrchestratorError::InvalidArgument(format!("cannot read {}: no such file", file.display()))
                    })?;
                    (file, text)
                }
                Entry::File(mut f, _) => {
                    let mut text = String::new();
                    std::io::Read::read_to_string(&mut f, &mut text).map_err(|e| {
                        OrchestratorError::InvalidArgument(format!("cannot read {}: {e}", p.shown().display()))
                    })?;
                    (p.shown().to_path_buf(), text)
                }
            }
        };
        Ok(match ProjectConfig::parse(&text) {
            Ok(project) => Validation::Valid { resolved: project.apply(user), path: file, project },
            Err(problems) => Validation::Invalid { path: file, problems },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_key() {
        let p = ProjectConfig::parse(
            "image = \"mcp-dev\"\ncpus = 1\nmemory = \"1G\"\nnetwork = \"none\"\nservices = [\"sleep 1\"]\n\
             [env]\nA = \"1\"\n[sync]\nexclude = [\"*.log\"]\n",
        )
        .unwrap();
        assert_eq!(p.image.as_deref(), Some("mcp-dev"));
        assert_eq!((p.cpus, p.memory_bytes, p.network.clone()), (Some(1), Some(1 << 30), Some(Network::None)));
        assert_eq!(p.env.get("A").map(String::as_str), Some("1"));
        assert_eq!((p.sync_exclude.len(), p.services.len()), (1, 1));
        let base = Profile {
            image: "x".into(),
            cpus: 4,
            memory_bytes: 512 << 20,
            pids: 1024,
            network: Network::default(),
            disk_bytes: 10 << 30,
            trust_host_ca: true,
            isolation: Isolation::Namespaces,
        };
        let vm = ProjectConfig::parse("isolation = \"vm\"\n").unwrap();
        assert_eq!(vm.apply(&base).isolation, Isolation::Vm);
        let bad = ProjectConfig::parse("isolation = \"kvm\"\n").unwrap_err();
        assert!(bad[0].starts_with("isolation: must be \"namespaces\" or \"vm\""), "{bad:?}");
        let cpus_only = ProjectConfig { cpus: Some(2), ..Default::default() };
        assert_eq!(cpus_only.apply(&base), Profile { cpus: 2, ..base.clone() });
        let p = ProjectConfig::parse(
            "disk = \"20G\"\ntrust_host_ca = false\n[network]\nallow = [\"pypi.org\"]\ndeny = [\"*.evil.example\"]\n",
        )
        .unwrap();
        let applied = p.apply(&base);
        assert_eq!((applied.disk_bytes, applied.trust_host_ca), (20 << 30, false));
        assert_eq!(applied.network.summary(), "egress allow=pypi.org deny=*.evil.example");
        let inline = ProjectConfig::parse("network = { allow = [\"pypi.org\"], deny = [\"*.evil.example\"] }").unwrap();
        assert_eq!(inline.network, p.network);
    }

    #[test]
    fn reports_every_network_disk_and_ca_problem() {
        let problems = ProjectConfig::parse(
            "disk = 20\ntrust_host_ca = \"yes\"\n[network]\nallow = [\"pypi.org\", \"bad rule\", 3]\ndeny = \"x\"\nports = []\n",
        )
        .unwrap_err();
        let all = problems.join("\n");
        for want in [
            "disk: expected a size string such as \"20G\", not 20",
            "trust_host_ca: expected true or false, not \"yes\"",
            "network.allow[2]: expected a rule string, not 3",
            "network.deny: expected a list of rule strings",
            "network.ports: is not supported (allowed: allow, deny)",
        ] {
            assert!(all.contains(want), "missing {want:?} in:\n{all}");
        }
        assert_eq!(problems.len(), 5, "{all}");
        let problems = ProjectConfig::parse("disk = \"1M\"\nnetwork = { allow = [\"bad rule\"] }\n").unwrap_err();
        assert!(problems[0].starts_with("disk: disk must be at least 64M"), "{problems:?}");
        assert!(problems[1].starts_with("network.allow[0]: ") && problems[1].contains("bad rule"), "{problems:?}");
    }

    #[test]
    fn reports_every_problem() {
        let problems = ProjectConfig::parse(
            "foo = 1\ncpus = 0\nmemory = \"lots\"\nnetwork = \"wifi\"\nservices = \"x\"\n\
             [env]\n\"1BAD\" = \"x\"\nN = 3\n[sync]\nexclude = \"x\"\nbar = 1\n",
        )
        .unwrap_err();
        let all = problems.join("\n");
        for want in [
            "foo is not supported (allowed: image, cpus",
            "cpus: expected a whole number",
            "memory: invalid memory size 'lots'",
            "network: must be \"egress\", \"none\" or a table",
            "services: expected a list",
            "env.1BAD: invalid env key",
            "env.N: expected a string",
            "sync.exclude: expected a list of strings",
            "sync.bar is not supported (allowed: exclude)",
        ] {
            assert!(all.contains(want), "missing {want:?} in:\n{all}");
        }
        assert_eq!(problems.len(), 9);
        assert!(ProjectConfig::parse("cpus = [").unwrap_err()[0].starts_with("not valid TOML"));
    }

    #[test]
    fn a_project_is_its_canonical_directory() {
        let dir = std::env::temp_dir().join(format!("smcp-project-id-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("My App")).unwrap();
        let p = Project::of(&dir.join("My App"));
        assert_eq!(p.tag.len(), 6);
        assert_eq!(p.id, format!("my-app-{}", p.tag));
        // Another spelling of the same directory is the same project.
        assert_eq!(Project::of(&dir.join("My App/../My App/.")), p);
        assert_ne!(Project::of(&dir).tag, p.tag);
        assert_eq!(Project::tag_of_id(&p.id), Some(p.tag.as_str()));
        assert_eq!(Project::id_of_tag(&p.tag), p.id);
        assert_eq!(Project::tag_of_id("legacy"), Some(""));
        for bad in ["app", "app-3f2a1", "app-3F2A1C", "app-3f2a1g", ""] {
            assert_eq!(Project::tag_of_id(bad), None, "{bad}");
        }
        std::fs::remove_dir_all(dir).unwrap();
    }
}
