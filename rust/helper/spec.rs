//! VM specs as the helper understands them: validated, with defaults filled
//! in, free of wire types.
use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};
use std::sync::LazyLock;

use regex::Regex;

use super::error::HelperError;

/// Default CPU limit, in whole CPUs.
pub const DEFAULT_CPUS: u32 = 1;
/// Default memory limit.
pub const DEFAULT_MEMORY_BYTES: u64 = 512 << 20;
/// Default process/thread limit.
pub const DEFAULT_PIDS: u32 = 1024;
/// Default disk quota (writable layer and writable mounts together).
pub const DEFAULT_DISK_BYTES: u64 = 10 << 30;
/// Below this a Debian userland cannot even start a shell reliably.
const MIN_MEMORY_BYTES: u64 = 16 << 20;

static ID_RE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$").expect("static regex"));

/// A VM id a client could have created (it names directories on the host).
pub fn is_vm_id(id: &str) -> bool {
    ID_RE.is_match(id)
}

static HOSTNAME_RE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,62})$").expect("static regex"));

/// How a VM reaches the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Network {
    /// Loopback only.
    None,
    /// Outbound through the helper's network stack, under the VM's policy.
    Egress,
}

/// A host directory shared into the VM.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MountSpec {
    /// Absolute host directory.
    pub host_path: PathBuf,
    /// Absolute, normalized path inside the VM.
    pub guest_path: PathBuf,
    /// Read-only inside the VM.
    pub read_only: bool,
}

/// A VM spec with defaults applied. Immutable once created. Kept beside a
/// running VM (see `VmManager::adopt_left`) as JSON.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VmConfig {
    /// Client-chosen id.
    pub id: String,
    /// Image name.
    pub image: String,
    /// CPU limit.
    pub cpus: u32,
    /// Memory limit in bytes.
    pub memory_bytes: u64,
    /// Process/thread limit.
    pub pids_limit: u32,
    /// Shared host directories.
    pub mounts: Vec<MountSpec>,
    /// Environment of every process in the VM.
    pub env: BTreeMap<String, String>,
    /// Hostname inside the VM.
    pub hostname: String,
    /// Network mode.
    pub network: Network,
    /// Egress rules (EGRESS only); the default policy when empty.
    #[serde(with = "policy_rules")]
    pub network_policy: sandbox_net::policy::NetworkPolicy,
    /// Client metadata, returned as given.
    pub labels: BTreeMap<String, String>,
    /// Id of a running VM whose writable layer the new VM starts from a copy
    /// of; empty for a fresh layer.
    pub clone_from: String,
    /// Disk quota in bytes (see `quota`).
    pub disk_bytes: u64,
    /// The driver it runs on, by name; empty until the helper resolves its
    /// default (see `VmManager::create`).
    pub driver: String,
}

/// A network policy as its rules' text, parsed again when read.
mod policy_rules {
    use sandbox_net::policy::NetworkPolicy;
    use serde::{Deserialize as _, Deserializer, Serialize as _, Serializer};

    #[derive(serde::Serialize, serde::Deserialize)]
    struct Rules {
        allow: Vec<String>,
        deny: Vec<String>,
    }

    pub fn serialize<S: Serializer>(policy: &NetworkPolicy, s: S) -> Result<S::Ok, S::Error> {
        let text = |rules: &[sandbox_net::policy::Rule]| rules.iter().map(ToString::to_string).collect();
        Rules { allow: text(policy.allow()), deny: text(policy.deny()) }.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<NetworkPolicy, D::Error> {
        let rules = Rules::deserialize(d)?;
        NetworkPolicy::parse(&rules.allow, &rules.deny).map_err(serde::de::Error::custom)
    }
}

impl VmConfig {
    /// Checks every field and fills the defaults (0 → default, empty
    /// hostname → id). Errors name the field as `spec.<field>`.
    pub fn validate(mut self) -> Result<Self, HelperError> {
        if !ID_RE.is_match(&self.id) {
            return Err(HelperError::invalid("spec.id", format!("{:?} must match {}", self.id, ID_RE.as_str())));
        }
        if self.image.is_empty() && self.clone_from.is_empty() {
            return Err(HelperError::invalid("spec.image", "required"));
        }
        if self.cpus == 0 {
            self.cpus = DEFAULT_CPUS;
        }
        if self.memory_bytes == 0 {
            self.memory_bytes = DEFAULT_MEMORY_BYTES;
        } else if self.memory_bytes < MIN_MEMORY_BYTES {
            return Err(HelperError::invalid("spec.memory_bytes", format!("must be at least {MIN_MEMORY_BYTES}")));
        }
        if self.pids_limit == 0 {
            self.pids_limit = DEFAULT_PIDS;
        }
        if self.disk_bytes == 0 {
            self.disk_bytes = DEFAULT_DISK_BYTES;
        }
        if self.hostname.is_empty() {
            self.hostname = self.id.clone();
        } else if !HOSTNAME_RE.is_match(&self.hostname) {
            return Err(HelperError::invalid("spec.hostname", format!("{:?} is not a valid hostname", self.hostname)));
        }
        for key in self.env.keys() {
            check_env_key("spec.env", key)?;
        }
        for (i, m) in self.mounts.iter().enumerate() {
            let field = |f: &str| format!("spec.mounts[{i}].{f}");
            if !m.host_path.is_absolute() {
                return Err(HelperError::invalid(
                    field("host_path"),
                    format!("{} is not absolute", m.host_path.display()),
                ));
            }
            if !m.host_path.is_dir() {
                return Err(HelperError::invalid(
                    field("host_path"),
                    format!("{} does not exist or is not a directory", m.host_path.display()),
                ));
            }
            if !is_normal_absolute(&m.guest_path) {
                return Err(HelperError::invalid(
                    field("guest_path"),
                    format!("{} must be an absolute path below / without . or ..", m.guest_path.display()),
                ));
            }
        }
        Ok(self)
    }
}

/// An absolute path below / made of normal parts only.
pub(crate) fn is_normal_absolute(p: &Path) -> bool {
    let mut comps = p.components();
    comps.next() == Some(Component::RootDir)
        && p.components().count() > 1
        && comps.all(|c| matches!(c, Component::Normal(_)))
}

/// Environment-variable check for process specs (same rule as the VM env).
pub fn check_env_key(field: &str, key: &str) -> Result<(), HelperError> {
    if key.is_empty() || key.contains('=') || key.contains('\0') {
        return Err(HelperError::invalid(field, format!("invalid variable name {key:?}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(id: &str) -> VmConfig {
        VmConfig {
            id: id.into(),
            image: "img".into(),
            cpus: 0,
            memory_bytes: 0,
            pids_limit: 0,
            mounts: Vec::new(),
            env: BTreeMap::new(),
            hostname: String::new(),
            network: Network::Egress,
            network_policy: Default::default(),
            labels: BTreeMap::new(),
            clone_from: String::new(),
            disk_bytes: 0,
            driver: String::new(),
        }
    }

    fn field_of(e: HelperError) -> String {
        match e {
            HelperError::InvalidArgument { field, .. } => field,
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn defaults_are_filled() {
        let c = config("a-1.b_c").validate().unwrap();
        assert_eq!((c.cpus, c.memory_bytes, c.pids_limit), (1, 512 << 20, 1024));
        assert_eq!(c.hostname, "a-1.b_c");
    }

    #[test]
    fn bad_fields_are_named() {
        for id in ["", "-a", "a/b", &"x".repeat(64)] {
            assert_eq!(field_of(config(id).validate().unwrap_err()), "spec.id");
        }
        let mut c = config("a");
        c.image.clear();
        assert_eq!(field_of(c.validate().unwrap_err()), "spec.image");
        let mut c = config("a");
        c.memory_bytes = 1;
        assert_eq!(field_of(c.validate().unwrap_err()), "spec.memory_bytes");
        let mut c = config("a");
        c.hostname = "bad host".into();
        assert_eq!(field_of(c.validate().unwrap_err()), "spec.hostname");
        let mut c = config("a");
        c.env.insert("A=B".into(), "x".into());
        assert_eq!(field_of(c.validate().unwrap_err()), "spec.env");
        let mount =
            |host: &str, guest: &str| MountSpec { host_path: host.into(), guest_path: guest.into(), read_only: false };
        for (m, f) in [
            (mount("rel", "/w"), "spec.mounts[0].host_path"),
            (mount("/nonexistent-dir-xyz", "/w"), "spec.mounts[0].host_path"),
            (mount("/tmp", "w"), "spec.mounts[0].guest_path"),
            (mount("/tmp", "/"), "spec.mounts[0].guest_path"),
            (mount("/tmp", "/a/../b"), "spec.mounts[0].guest_path"),
        ] {
            let mut c = config("a");
            c.mounts.push(m);
            assert_eq!(field_of(c.validate().unwrap_err()), f);
        }
        assert!(check_env_key("start.env", "").is_err());
        assert!(check_env_key("start.env", "OK").is_ok());
    }
}
