//! Shifting a built tree's ownership into the image id range (uid/gid + base).
//!
//! The walk visits every inode exactly once, which is the whole difficulty:
//! - the root is shifted, then each directory's *entries*; never a directory
//!   both as an entry and as the thing being listed (a double shift makes it
//!   show up as `nobody` inside, and creating files in it fails with EOVERFLOW);
//! - hard-linked files appear under several names but share one owner, so
//!   they are remembered by (dev, inode);
//! - symlinks are changed themselves (`lchown`), never their targets, which
//!   could point anywhere on the host;
//! - `chown` clears setuid/setgid, so the mode is put back afterwards.
use std::collections::HashSet;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt, lchown};
use std::path::Path;

use super::ImageError;

/// Bits that `chown` clears and that must survive the shift.
const SET_ID_BITS: u32 = 0o6000;

/// Adds `base` to the uid and gid of every file under (and including) `root`.
/// Every existing owner must be below `count`; anything else means the tree
/// was already shifted or carries ids the sandbox cannot map. Returns the
/// number of inodes shifted.
pub(super) fn shift_tree(root: &Path, base: u32, count: u32) -> Result<u64, ImageError> {
    let mut seen = HashSet::new();
    let mut shifted = 0;
    shift_one(root, base, count, &mut seen, &mut shifted)?;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = fs::read_dir(&dir).map_err(|e| ImageError::io(format!("reading {}", dir.display()), e))?;
        for entry in entries {
            let path = entry.map_err(|e| ImageError::io(format!("reading {}", dir.display()), e))?.path();
            if shift_one(&path, base, count, &mut seen, &mut shifted)? {
                stack.push(path);
            }
        }
    }
    Ok(shifted)
}

/// Shifts one inode (unless already done through another hard link) and
/// reports whether it is a directory to descend into.
fn shift_one(
    path: &Path,
    base: u32,
    count: u32,
    seen: &mut HashSet<(u64, u64)>,
    shifted: &mut u64,
) -> Result<bool, ImageError> {
    let meta = fs::symlink_metadata(path).map_err(|e| ImageError::io(format!("stat {}", path.display()), e))?;
    let is_dir = meta.file_type().is_dir();
    if !is_dir && meta.nlink() > 1 && !seen.insert((meta.dev(), meta.ino())) {
        return Ok(false);
    }
    for id in [meta.uid(), meta.gid()] {
        if id >= count {
            return Err(ImageError::IdOutOfRange { path: path.to_path_buf(), id, count });
        }
    }
    lchown(path, Some(meta.uid() + base), Some(meta.gid() + base))
        .map_err(|e| ImageError::io(format!("lchown {}", path.display()), e))?;
    let mode = meta.mode();
    if !meta.file_type().is_symlink() && mode & SET_ID_BITS != 0 {
        fs::set_permissions(path, fs::Permissions::from_mode(mode & 0o7777))
            .map_err(|e| ImageError::io(format!("chmod {}", path.display()), e))?;
    }
    *shifted += 1;
    Ok(is_dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::store::test_dir::TempDir;
    use std::os::unix::fs::symlink;

    fn owner(p: &Path) -> (u32, u32) {
        let m = fs::symlink_metadata(p).unwrap();
        (m.uid(), m.gid())
    }

    fn is_root() -> bool {
        nix::unistd::geteuid().is_root()
    }

    #[test]
    fn shifts_every_inode_once_and_keeps_setid_bits() {
        if !is_root() {
            eprintln!("skipped: chown to other ids needs root");
            return;
        }
        let t = TempDir::new("shift");
        let r = t.path().join("root");
        fs::create_dir_all(r.join("usr/bin")).unwrap();
        fs::create_dir_all(r.join("var/lib/apt")).unwrap();
        fs::write(r.join("usr/bin/su"), b"x").unwrap();
        fs::set_permissions(r.join("usr/bin/su"), fs::Permissions::from_mode(0o4755)).unwrap();
        fs::set_permissions(r.join("var/lib/apt"), fs::Permissions::from_mode(0o2775)).unwrap();
        lchown(r.join("var/lib/apt"), Some(0), Some(42)).unwrap();
        fs::write(r.join("usr/bin/a"), b"y").unwrap();
        fs::hard_link(r.join("usr/bin/a"), r.join("usr/bin/b")).unwrap();
        lchown(r.join("usr/bin/a"), Some(100), Some(100)).unwrap();
        // A symlink pointing outside the tree: its target must stay untouched.
        let outside = t.path().join("outside");
        fs::write(&outside, b"host file").unwrap();
        symlink(&outside, r.join("usr/bin/escape")).unwrap();
        let before_outside = owner(&outside);

        let n = shift_tree(&r, 100_000, 65_536).unwrap();

        // root, usr, usr/bin, var, var/lib, var/lib/apt, su, a (= b), escape
        assert_eq!(n, 9);
        assert_eq!(owner(&r), (100_000, 100_000));
        assert_eq!(owner(&r.join("usr")), (100_000, 100_000));
        assert_eq!(owner(&r.join("usr/bin")), (100_000, 100_000));
        assert_eq!(owner(&r.join("var/lib/apt")), (100_000, 100_042));
        assert_eq!(owner(&r.join("usr/bin/a")), (100_100, 100_100));
        assert_eq!(owner(&r.join("usr/bin/b")), (100_100, 100_100));
        assert_eq!(owner(&r.join("usr/bin/escape")), (100_000, 100_000));
        assert_eq!(owner(&outside), before_outside);
        let mode = |p: &str| fs::symlink_metadata(r.join(p)).unwrap().mode() & 0o7777;
        assert_eq!(mode("usr/bin/su"), 0o4755);
        assert_eq!(mode("var/lib/apt"), 0o2775);
    }

    #[test]
    fn refuses_a_tree_that_is_already_shifted() {
        if !is_root() {
            eprintln!("skipped: chown to other ids needs root");
            return;
        }
        let t = TempDir::new("reshift");
        let r = t.path().join("root");
        fs::create_dir_all(r.join("etc")).unwrap();
        shift_tree(&r, 100_000, 65_536).unwrap();
        let err = shift_tree(&r, 100_000, 65_536).unwrap_err();
        assert!(matches!(err, ImageError::IdOutOfRange { id: 100_000, count: 65_536, .. }), "{err}");
        assert_eq!(owner(&r.join("etc")), (100_000, 100_000));
    }

    #[test]
    fn missing_root_is_an_io_error_naming_the_path() {
        let t = TempDir::new("noroot");
        let err = shift_tree(&t.path().join("absent"), 100_000, 65_536).unwrap_err();
        assert!(matches!(err, ImageError::Io { .. }));
        assert!(err.to_string().contains("absent"), "{err}");
    }
}
