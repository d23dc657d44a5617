//! Spawn policies: who may spawn child sandboxes and within which limits
//! (internals §8). Parsed from `[spawn_policies.<parent>]` in the config
//! file; a child allowed to spawn gets a derived, halved policy.
use serde::{Deserialize, Serialize};

use crate::{config::invalid, error::OrchestratorError, isolation::Isolation};

/// Smallest child memory in MiB.
pub const MIN_CHILD_MEMORY_MB: u64 = 64;

/// The limits a parent spawns children under. Field names are those of the
/// reference's state file (`derived_policies`), so state stays compatible.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpawnPolicy {
    /// Live direct children at once.
    pub max_concurrent: u32,
    /// Children this parent may ever spawn (ctl `run` children included).
    pub max_total: u64,
    /// CPUs of all live direct children together (and of the whole tree, for a root).
    pub total_child_cpus: u32,
    /// Memory of all live direct children together, MiB (tree-wide for a root).
    pub total_child_memory_mb: u64,
    /// Largest and default CPUs of one child.
    pub child_max_cpus: u32,
    /// Largest and default memory of one child (`512M`, `1G`).
    pub child_max_memory: String,
    /// Images children may run; the first is the default.
    pub allowed_images: Vec<String>,
    /// Seconds a child lives (its lease); 0: no limit.
    pub child_ttl: u64,
    /// Whether children may spawn grandchildren (under a derived policy).
    pub child_can_spawn: bool,
    /// Which peers a child may reach: `none`, `family` or `all` (stored;
    /// sandboxes are isolated from each other regardless).
    pub child_network_peers: String,
    /// Whether children may `expose` ports.
    pub child_allow_port_forward: bool,
    /// Whether the sandbox gets `sandbox-ctl` and its socket.
    pub inject_ctl: bool,
    /// Isolations children may ask for (`namespaces`, `vm`); empty: any.
    #[serde(default)]
    pub allowed_isolation: Vec<String>,
}

/// `[spawn_policies.<name>]` as written; absent keys take the built-in values.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SpawnPolicyFile {
    max_concurrent: Option<u32>,
    max_total: Option<u64>,
    total_child_cpus: Option<u32>,
    total_child_memory_mb: Option<u64>,
    child_max_cpus: Option<u32>,
    child_max_memory: Option<String>,
    allowed_images: Option<Vec<String>>,
    child_ttl: Option<u64>,
    child_can_spawn: Option<bool>,
    child_network_peers: Option<String>,
    child_allow_port_forward: Option<bool>,
    inject_ctl: Option<bool>,
    allowed_isolation: Option<Vec<String>>,
}

/// Parse a child memory size as the reference does: `^\d+\s*[MmGg][Bb]?$`,
/// in MiB.
pub fn parse_child_memory(s: &str) -> Option<u64> {
    let t = s.trim();
    let digits = t.chars().take_while(|c| c.is_ascii_digit()).count();
    let n: u64 = t[..digits].parse().ok()?;
    match t[digits..].trim_start().to_ascii_uppercase().as_str() {
        "M" | "MB" => Some(n),
        "G" | "GB" => n.checked_mul(1024),
        _ => None,
    }
}

impl SpawnPolicy {
    /// The reference's numbers, except `inject_ctl`: in-sandbox code gets no
    /// power to start sandboxes unless the user opts in.
    pub fn builtin(default_image: &str) -> Self {
        Self {
            max_concurrent: 3,
            max_total: 10,
            total_child_cpus: 6,
            total_child_memory_mb: 1536,
            child_max_cpus: 2,
            child_max_memory: "512M".to_string(),
            allowed_images: vec![default_image.to_string()],
            child_ttl: 300,
            child_can_spawn: false,
            child_network_peers: "family".to_string(),
            child_allow_port_forward: false,
            inject_ctl: false,
            allowed_isolation: Vec::new(),
        }
    }

    /// Whether children may run with `isolation`.
    pub fn allows_isolation(&self, isolation: Isolation) -> bool {
        self.allowed_isolation.is_empty() || self.allowed_isolation.iter().any(|i| i == isolation.as_str())
    }

    /// A policy from the config file, `key` naming it in errors.
    pub(crate) fn from_file(f: &SpawnPolicyFile, default_image: &str, key: &str) -> Result<Self, OrchestratorError> {
        let b = Self::builtin(default_image);
        let p = Self {
            max_concurrent: f.max_concurrent.unwrap_or(b.max_concurrent),
            max_total: f.max_total.unwrap_or(b.max_total),
            total_child_cpus: f.total_child_cpus.unwrap_or(b.total_child_cpus),
            total_child_memory_mb: f.total_child_memory_mb.unwrap_or(b.total_child_memory_mb),
            child_max_cpus: f.child_max_cpus.unwrap_or(b.child_max_cpus),
            child_max_memory: f.child_max_memory.clone().unwrap_or(b.child_max_memory),
            allowed_images: f.allowed_images.clone().unwrap_or(b.allowed_images),
            child_ttl: f.child_ttl.unwrap_or(b.child_ttl),
            child_can_spawn: f.child_can_spawn.unwrap_or(b.child_can_spawn),
            child_network_peers: f.child_network_peers.clone().unwrap_or(b.child_network_peers),
            child_allow_port_forward: f.child_allow_port_forward.unwrap_or(b.child_allow_port_forward),
            inject_ctl: f.inject_ctl.unwrap_or(b.inject_ctl),
            allowed_isolation: f.allowed_isolation.clone().unwrap_or(b.allowed_isolation),
        };
        let at = |field: &str| format!("{key}.{field}");
        if p.child_max_cpus == 0 {
            return Err(invalid(&at("child_max_cpus"), "must be at least 1"));
        }
        match parse_child_memory(&p.child_max_memory) {
            Some(mb) if mb >= MIN_CHILD_MEMORY_MB => {}
            _ => {
                return Err(invalid(
                    &at("child_max_memory"),
                    format!("'{}' is not a size of at least 64M (e.g. 512M, 1G)", p.child_max_memory),
                ));
            }
        }
        for isolation in &p.allowed_isolation {
            Isolation::parse(isolation).map_err(|e| invalid(&at("allowed_isolation"), e))?;
        }
        for image in &p.allowed_images {
            sandbox_image::validate_name(image).map_err(|e| invalid(&at("allowed_images"), e))?;
        }
        if !matches!(p.child_network_peers.as_str(), "none" | "family" | "all") {
            return Err(invalid(
                &at("child_network_peers"),
                format!("must be 'none', 'family' or 'all', not '{}'", p.child_network_peers),
            ));
        }
        Ok(p)
    }

    /// `child_max_memory` in MiB (validated when the policy was made).
    pub fn child_max_memory_mb(&self) -> u64 {
        parse_child_memory(&self.child_max_memory).unwrap_or(MIN_CHILD_MEMORY_MB)
    }

    /// The policy a child spawned under `self` gets when `child_can_spawn`:
    /// halved budgets, no further spawning, no ctl, no forwards. `remaining`
    /// is the child's own remaining lifetime in seconds, if it has one.
    pub fn derive(&self, remaining: Option<u64>) -> Self {
        let child_ttl = match remaining {
            Some(r) if self.child_ttl > 0 => self.child_ttl.min(r),
            _ => self.child_ttl,
        };
        Self {
            max_concurrent: (self.max_concurrent / 2).max(1),
            max_total: (self.max_total / 2).max(1),
            total_child_cpus: (self.total_child_cpus / 2).max(1),
            total_child_memory_mb: (self.total_child_memory_mb / 2).max(128),
            child_max_cpus: self.child_max_cpus,
            child_max_memory: self.child_max_memory.clone(),
            allowed_images: self.allowed_images.clone(),
            child_ttl,
            child_can_spawn: false,
            child_network_peers: self.child_network_peers.clone(),
            child_allow_port_forward: false,
            inject_ctl: false,
            allowed_isolation: self.allowed_isolation.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<SpawnPolicy, String> {
        let f: SpawnPolicyFile = toml::from_str(text).map_err(|e| e.to_string())?;
        SpawnPolicy::from_file(&f, "img", "spawn_policies.p").map_err(|e| e.to_string())
    }

    #[test]
    fn builtin_values_and_file_overrides() {
        let b = parse("").unwrap();
        assert_eq!(b, SpawnPolicy::builtin("img"));
        assert!(!b.inject_ctl);
        assert_eq!(b.allowed_images, vec!["img".to_string()]);
        let p = parse("max_concurrent = 5\nchild_max_memory = \"1G\"\ninject_ctl = true\nchild_ttl = 0\n").unwrap();
        assert_eq!((p.max_concurrent, p.child_max_memory_mb(), p.inject_ctl, p.child_ttl), (5, 1024, true, 0));
    }

    #[test]
    fn bad_keys_and_values_name_the_key() {
        assert!(parse("bogus = 1\n").unwrap_err().contains("bogus"));
        assert!(parse("child_max_memory = \"lots\"\n").unwrap_err().contains("spawn_policies.p.child_max_memory"));
        assert!(parse("child_max_memory = \"32M\"\n").unwrap_err().contains("child_max_memory"));
        assert!(
            parse("child_network_peers = \"some\"\n").unwrap_err().contains("spawn_policies.p.child_network_peers")
        );
        assert!(parse("child_max_cpus = 0\n").unwrap_err().contains("child_max_cpus"));
        assert!(parse("allowed_images = [\"../x\"]\n").unwrap_err().contains("allowed_images"));
        assert!(parse("max_total = -1\n").is_err());
        let e = parse("allowed_isolation = [\"kvm\"]\n").unwrap_err();
        assert!(e.contains("spawn_policies.p.allowed_isolation") && e.contains("\"namespaces\" or \"vm\""), "{e}");
        let vm_only = parse("allowed_isolation = [\"vm\"]\n").unwrap();
        assert!(vm_only.allows_isolation(Isolation::Vm) && !vm_only.allows_isolation(Isolation::Namespaces));
        assert!(parse("").unwrap().allows_isolation(Isolation::Namespaces));
        for peers in ["none", "family", "all"] {
            assert!(parse(&format!("child_network_peers = \"{peers}\"\n")).is_ok());
        }
    }

    #[test]
    fn memory_strings() {
        assert_eq!(parse_child_memory("512M"), Some(512));
        assert_eq!(parse_child_memory("2g"), Some(2048));
        assert_eq!(parse_child_memory("256 MB"), Some(256));
        assert_eq!(parse_child_memory("1Gb"), Some(1024));
        assert_eq!(parse_child_memory("512"), None);
        assert_eq!(parse_child_memory("1T"), None);
        assert_eq!(parse_child_memory("M"), None);
    }

    #[test]
    fn derived_policy_halves_and_locks_down() {
        let mut p = SpawnPolicy::builtin("img");
        p.child_can_spawn = true;
        p.inject_ctl = true;
        p.child_allow_port_forward = true;
        let d = p.derive(Some(120));
        assert_eq!((d.max_concurrent, d.max_total, d.total_child_cpus, d.total_child_memory_mb), (1, 5, 3, 768));
        assert_eq!(d.child_ttl, 120);
        assert!(!d.child_can_spawn && !d.inject_ctl && !d.child_allow_port_forward);
        assert_eq!(d.allowed_images, p.allowed_images);
        assert_eq!(d.child_max_memory, "512M");
        let tiny =
            SpawnPolicy { max_concurrent: 1, max_total: 1, total_child_cpus: 1, total_child_memory_mb: 200, ..p };
        let d = tiny.derive(None);
        assert_eq!((d.max_concurrent, d.max_total, d.total_child_cpus, d.total_child_memory_mb), (1, 1, 1, 128));
        assert_eq!(d.child_ttl, 300);
    }
}
