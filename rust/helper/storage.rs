//! Where a VM's files live on the host, and preparing them at CreateVm:
//! the writable layer under the state dir, the agent socket under the
//! runtime dir, and ownership of shared directories. Each running VM's
//! launcher is recorded in its directory, so that a helper starting after
//! one that died can kill what it left running.
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use super::error::HelperError;
use super::spec::VmConfig;
use sandbox_image::ImageInfo;

/// The VM's directory: the overlay upper and work dirs, resolv.conf.
pub fn vm_dir(id: &str) -> PathBuf {
    sandbox_base::paths::state_dir().join("vms").join(id)
}

/// The agent's socket: in the runtime dir, never inside the VM.
pub fn agent_socket(id: &str) -> PathBuf {
    sandbox_base::paths::runtime_dir().join("vms").join(format!("{id}.sock"))
}

/// Where a namespace VM's launcher keeps it for the next helper (see the
/// driver's `keep`): beside the agent's socket.
pub fn keeper_socket(id: &str) -> PathBuf {
    sandbox_base::paths::runtime_dir().join("vms").join(format!("{id}.keep"))
}

/// Creates the VM's directory with empty layers owned by the image's
/// mapped root; a directory left by an earlier helper is replaced.
pub fn prepare_dir(dir: &Path, image: &ImageInfo) -> Result<(), HelperError> {
    use std::os::unix::fs::{DirBuilderExt as _, chown};
    if dir.exists() {
        // Left behind by an earlier helper: a new VM starts from the image.
        sandbox_userns::remove_tree(dir).map_err(|e| HelperError::io(format!("remove stale {}", dir.display()), e))?;
    }
    // 0711: the VM's root (when the helper is root, an unmapped "other"
    // here) must be able to pass through to its layers, but not list them.
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o711)
        .create(dir)
        .map_err(|e| HelperError::io(format!("create {}", dir.display()), e))?;
    for sub in ["upper", "work"] {
        let p = dir.join(sub);
        std::fs::DirBuilder::new()
            .mode(0o755)
            .create(&p)
            .map_err(|e| HelperError::io(format!("create {}", p.display()), e))?;
        // Root inside the VM must own its layers (overlayfs in a user
        // namespace checks ownership against the mapped ids). For an
        // ordinary user that is the user itself, so this changes nothing.
        let (uid, gid) = image.id_map.host_root();
        chown(&p, Some(uid), Some(gid)).map_err(|e| HelperError::io(format!("chown {}", p.display()), e))?;
    }
    Ok(())
}

/// Hands each shared directory's top level to the VM's root, so root
/// inside can write there. Only directories the helper's user owns, never
/// read-only ones, and never a top-level system directory such as /tmp.
/// Only a root helper does anything: an ordinary user's VMs have the user
/// as their root, who owns those directories already.
pub fn share_mounts(config: &VmConfig, image: &ImageInfo) {
    let me = nix::unistd::geteuid();
    if !me.is_root() {
        return;
    }
    let (uid, gid) = image.id_map.host_root();
    for m in config.mounts.iter().filter(|m| !m.read_only) {
        let Ok(canonical) = m.host_path.canonicalize() else {
            continue;
        };
        if canonical.components().count() < 3 {
            continue;
        }
        match canonical.metadata() {
            Ok(meta) if meta.uid() == me.as_raw() => {
                if let Err(e) = std::os::unix::fs::chown(&canonical, Some(uid), Some(gid)) {
                    tracing::warn!(path = %canonical.display(), error = %e, "cannot hand the mount to the vm's root");
                }
            }
            _ => {}
        }
    }
}

/// Names the launcher (pid and start time) of the VM whose directory is
/// `dir`.
#[cfg(linux_host)]
const LAUNCHER_FILE: &str = "launcher";

/// Records `pid` as the launcher of the VM whose directory is `dir`; see
/// [`kill_leftovers`].
#[cfg(linux_host)]
pub fn record_launcher(dir: &Path, pid: u32) {
    crate::leftovers::record(&dir.join(LAUNCHER_FILE), pid);
}

/// The launcher recorded in the VM directory `dir`, if it runs and the
/// helper that started it is gone (a VM the next helper may adopt).
#[cfg(linux_host)]
pub fn orphaned_launcher(dir: &Path) -> Option<crate::driver::Orphan> {
    crate::leftovers::orphan(&dir.join(LAUNCHER_FILE))
}

/// Records the launcher of the VM in `dir` as this helper's, once adopted.
#[cfg(linux_host)]
pub fn record_adopted(dir: &Path, launcher: &crate::driver::Orphan) {
    crate::leftovers::record_owned(&dir.join(LAUNCHER_FILE), launcher);
}

/// At helper start: kills every launcher recorded under the state dir
/// whose helper died and whose VM did not go along (a helper from before
/// launchers watched their helper, with the VM frozen by a snapshot; or the
/// launcher itself stopped). Killing the launcher kills PID 1 (its
/// parent-death signal), and with it the VM. Launchers of a live helper
/// sharing the state dir are left alone.
#[cfg(linux_host)]
pub fn kill_leftovers() {
    let root = sandbox_base::paths::state_dir().join("vms");
    for entry in std::fs::read_dir(&root).into_iter().flatten().flatten() {
        if let crate::leftovers::Reaped::Killed(pid) = crate::leftovers::reap(&entry.path().join(LAUNCHER_FILE)) {
            tracing::warn!(vm = %entry.file_name().to_string_lossy(), launcher = pid, "killed a vm a dead helper left running");
        }
    }
}
