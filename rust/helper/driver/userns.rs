//! User-namespace id maps: inside ids 0..count become host ids base.. so
//! root in the sandbox owns the image's shifted files and nothing on the host.
//!
//! As root the helper writes /proc/PID/{uid,gid}_map itself. Otherwise the
//! setuid helpers newuidmap/newgidmap (package uidmap) must vouch for the
//! range through /etc/subuid and /etc/subgid.
use std::path::PathBuf;
use std::process::Command;

use super::DriverError;

/// How this helper can install id maps.
#[derive(Debug, Clone)]
pub enum IdMapper {
    /// We are root: write the map files directly.
    Direct,
    /// Unprivileged: go through these newuidmap/newgidmap binaries.
    Setuid {
        /// Path of newuidmap.
        newuidmap: PathBuf,
        /// Path of newgidmap.
        newgidmap: PathBuf,
    },
    /// Neither is possible; the reason is reported when a VM starts.
    Unavailable(String),
}

impl IdMapper {
    /// Picks the mechanism for the current user.
    pub fn detect() -> Self {
        if nix::unistd::geteuid().is_root() {
            return IdMapper::Direct;
        }
        match (find_in_path("newuidmap"), find_in_path("newgidmap")) {
            (Some(newuidmap), Some(newgidmap)) => IdMapper::Setuid { newuidmap, newgidmap },
            _ => IdMapper::Unavailable(
                "cannot map user ids: the helper is not root and newuidmap/newgidmap are missing (install the uidmap package and add a range to /etc/subuid and /etc/subgid)"
                    .into(),
            ),
        }
    }

    /// Whether VMs can get a user namespace at all.
    pub fn available(&self) -> bool {
        !matches!(self, IdMapper::Unavailable(_))
    }

    /// Maps `0..count` inside the user namespace of `pid` to `base..` outside.
    pub fn map(&self, pid: i32, base: u32, count: u32) -> Result<(), DriverError> {
        let line = format!("0 {base} {count}\n");
        match self {
            IdMapper::Direct => {
                for file in ["uid_map", "gid_map"] {
                    let path = format!("/proc/{pid}/{file}");
                    std::fs::write(&path, &line).map_err(|e| DriverError::UserNs(format!("write {path}: {e}")))?;
                }
                Ok(())
            }
            IdMapper::Setuid { newuidmap, newgidmap } => {
                for tool in [newuidmap, newgidmap] {
                    let out = Command::new(tool)
                        .args([pid.to_string(), "0".into(), base.to_string(), count.to_string()])
                        .output()
                        .map_err(|e| DriverError::UserNs(format!("run {}: {e}", tool.display())))?;
                    if !out.status.success() {
                        return Err(DriverError::UserNs(format!(
                            "{} {pid} 0 {base} {count} failed ({}): {}; the range must be listed for this user in /etc/subuid and /etc/subgid",
                            tool.display(),
                            out.status,
                            String::from_utf8_lossy(&out.stderr).trim()
                        )));
                    }
                }
                Ok(())
            }
            IdMapper::Unavailable(reason) => Err(DriverError::UserNs(reason.clone())),
        }
    }
}

/// First executable called `name` on PATH.
pub fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin".into());
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| {
        use std::os::unix::fs::PermissionsExt as _;
        p.metadata().map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0).unwrap_or(false)
    })
}
