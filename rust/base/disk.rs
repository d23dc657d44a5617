//! Room on the host's filesystems.
use std::path::Path;

/// Free bytes for unprivileged use on the filesystem holding `dir`, or its
/// nearest existing ancestor (a directory made lazily lives there); `None`
/// when that cannot be read.
pub fn free_bytes(dir: &Path) -> Option<u64> {
    let existing = dir.ancestors().find(|p| p.exists())?;
    let st = nix::sys::statvfs::statvfs(existing).ok()?;
    Some(st.blocks_available() as u64 * st.fragment_size() as u64)
}
