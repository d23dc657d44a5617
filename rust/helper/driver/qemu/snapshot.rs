//! A vm's writable layer as a layer of the image store. The guest's
//! overlay uses `userxattr`, so its upper dir (shown read-only at
//! [`sandbox_guest::LAYER_VIEW`]) already has the store's format: whiteouts are 0/0
//! character devices and opaque directories carry `user.overlay.opaque`.
//! The guest archives it with GNU tar, its filesystem frozen
//! ([`sandbox_guest::layer_archive`]), the helper receives the archive like
//! any Exec's stdout, and [`unpack_layer`] extracts it as root
//! of a user namespace with the helper's id map, so every file gets the
//! host ids the sandbox maps, as the namespace driver's layers have.
use std::path::Path;
use std::process::Command;

use super::QemuError;
use super::disks::run_mapped_with;
use sandbox_userns::IdMapper;

/// strerror(ENOSPC).
const NO_SPACE: &str = "No space left on device";

/// Extracts `archive` (from [`sandbox_guest::layer_archive`]) into the new directory
/// `dest`, which must not exist.
pub fn unpack_layer(archive: &Path, dest: &Path, mapper: &IdMapper) -> Result<(), QemuError> {
    let failed = |detail: String| QemuError::Disk { what: format!("layer {}", dest.display()), detail };
    std::fs::create_dir(dest).map_err(|e| QemuError::io(format!("create {}", dest.display()), e))?;
    let (uid, gid) = mapper.id_map().host_root();
    nix::unistd::chown(dest, Some(uid.into()), Some(gid.into()))
        .map_err(|e| failed(format!("chown to the namespace's root: {e}")))?;
    // Opened here: the namespace's root may have no right to the file, nor
    // pass through the dirs above `dest` (a private image store).
    let input = std::fs::File::open(archive).map_err(|e| QemuError::io(format!("open {}", archive.display()), e))?;
    let dir = std::fs::File::open(dest).map_err(|e| QemuError::io(format!("open {}", dest.display()), e))?;
    let mut cmd = Command::new("tar");
    cmd.args(["--xattrs", "--xattrs-include=*", "--numeric-owner", "--same-permissions", "-x", "-f", "-"])
        .stdin(input)
        .arg("-C");
    let out = run_mapped_with(mapper, cmd, &[&dir]).map_err(|e| failed(e.to_string()))?;
    if !out.status.success() {
        // tar words a full disk per file it could not write (`Cannot
        // write: No space left on device`, `Wrote only 1024 of 10240
        // bytes`): the one cause is enough.
        let store = dest.parent().unwrap_or(dest);
        let needed = std::fs::metadata(archive).map_or(0, |m| m.len());
        if sandbox_base::disk::free_bytes(store).is_some_and(|free| free < needed) {
            return Err(failed(format!("{NO_SPACE} in {}: free some and snapshot again", store.display())));
        }
        return Err(failed(format!("tar: {}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim())));
    }
    Ok(())
}
