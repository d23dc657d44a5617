//! Unpacking mmdebstrap's tarball through the sandbox's id map.
//!
//! tar runs as root of a user namespace carrying the helper's map, with the
//! owners the tarball records (the ids inside the chroot): every file gets
//! exactly the host ids a sandbox of this helper maps, hard links, symlinks,
//! setuid bits and extended attributes included, and no file is ever chowned
//! by host id. The same works for root and for an ordinary user.
use std::path::Path;
use std::process::{Command, Stdio};

use super::ImageError;
use crate::helper::driver::userns::{IdMapper, run_mapped};

/// Lines of tar's complaints kept in the error.
const TAIL_LINES: usize = 10;

/// Unpacks `tarball` into the new directory `rootfs`.
pub(super) fn unpack(mapper: &IdMapper, tarball: &Path, rootfs: &Path) -> Result<(), ImageError> {
    std::fs::create_dir(rootfs).map_err(|e| ImageError::io(format!("creating {}", rootfs.display()), e))?;
    // The top directory is made out here; it must belong to root inside for
    // tar (as that root) to restore its owner and mode.
    let (uid, gid) = mapper.id_map().host_root();
    std::os::unix::fs::chown(rootfs, Some(uid), Some(gid))
        .map_err(|e| ImageError::io(format!("handing {} to the sandbox's root", rootfs.display()), e))?;
    let mut tar = Command::new("tar");
    tar.arg("--extract")
        .arg("--file")
        .arg(tarball)
        .arg("--directory")
        .arg(rootfs)
        // Device nodes cannot be made in a user namespace, and a sandbox
        // gets its own /dev anyway.
        .args(["--numeric-owner", "--same-owner", "--preserve-permissions", "--xattrs", "--xattrs-include=*"])
        .args(["--exclude=./dev/*"])
        .stdin(Stdio::null());
    let out = run_mapped(mapper, tar).map_err(|e| ImageError::Unpack(e.to_string()))?;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let tail: Vec<&str> = stderr.lines().rev().take(TAIL_LINES).collect();
    Err(ImageError::Unpack(format!("tar {}: {}", out.status, tail.into_iter().rev().collect::<Vec<_>>().join("\n"))))
}
