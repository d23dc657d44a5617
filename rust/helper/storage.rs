//! Where a VM's files live on the host, and preparing them at CreateVm:
//! the writable layer under the state dir, the agent socket under the
//! runtime dir, and ownership of shared directories.
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use super::error::HelperError;
use super::spec::VmConfig;
use crate::image::ImageInfo;

/// The VM's directory: the overlay upper and work dirs, resolv.conf.
pub fn vm_dir(id: &str) -> PathBuf {
    crate::paths::state_dir().join("vms").join(id)
}

/// The agent's socket: in the runtime dir, never inside the VM.
pub fn agent_socket(id: &str) -> PathBuf {
    crate::paths::runtime_dir().join("vms").join(format!("{id}.sock"))
}

/// Creates the VM's directory with empty layers owned by the image's
/// mapped root; a directory left by an earlier helper is replaced.
pub fn prepare_dir(dir: &Path, image: &ImageInfo) -> Result<(), HelperError> {
    use std::os::unix::fs::{DirBuilderExt as _, chown};
    if dir.exists() {
        // Left behind by an earlier helper: a new VM starts from the image.
        crate::helper::driver::userns::remove_tree(dir)
            .map_err(|e| HelperError::io(format!("remove stale {}", dir.display()), e))?;
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
