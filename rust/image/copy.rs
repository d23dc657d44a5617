//! Copying a VM's writable layer exactly: owners, modes, timestamps,
//! symlinks, hard links, extended attributes (overlayfs in a user namespace
//! marks opaque directories and whiteouts with `user.overlay.*`) and device
//! nodes (whiteouts are 0:0 character devices).
//!
//! coreutils `cp -a` already gets every one of those right, reflinks where
//! the filesystem can, and never follows a symlink in the tree; a walk of our
//! own would have to redo all of it.
use std::path::Path;
use std::process::{Command, Stdio};

use super::ImageError;

/// Copies the directory `src` to `dst`, which must not exist yet. On failure
/// whatever was copied is removed again.
pub fn copy_tree(src: &Path, dst: &Path) -> Result<(), ImageError> {
    let what = format!("{} to {}", src.display(), dst.display());
    if dst.symlink_metadata().is_ok() {
        return Err(ImageError::CopyFailed { what, detail: "the target exists".into() });
    }
    let out = Command::new("cp")
        .args(["-a", "--reflink=auto", "--no-target-directory", "--"])
        .arg(src)
        .arg(dst)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| ImageError::io("running cp", e))?;
    if out.status.success() {
        return Ok(());
    }
    super::store::remove_tree(dst);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
    let detail = tail.into_iter().rev().collect::<Vec<_>>().join("\n");
    Err(ImageError::CopyFailed { what, detail: format!("cp {}: {detail}", out.status) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::store::test_dir::TempDir;
    use std::fs;
    use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};

    #[test]
    fn copies_modes_links_symlinks_and_user_xattrs() {
        let t = TempDir::new("copy");
        let src = t.path().join("src");
        fs::create_dir_all(src.join("d")).unwrap();
        fs::write(src.join("d/f"), b"data").unwrap();
        fs::set_permissions(src.join("d/f"), fs::Permissions::from_mode(0o640)).unwrap();
        fs::hard_link(src.join("d/f"), src.join("d/g")).unwrap();
        symlink("/etc/passwd", src.join("abs")).unwrap();
        let xattr = set_xattr(&src.join("d"), "user.overlay.opaque", b"y");

        let dst = t.path().join("dst");
        copy_tree(&src, &dst).unwrap();
        assert_eq!(fs::read(dst.join("d/f")).unwrap(), b"data");
        let (f, g) = (fs::metadata(dst.join("d/f")).unwrap(), fs::metadata(dst.join("d/g")).unwrap());
        assert_eq!(f.mode() & 0o777, 0o640);
        assert_eq!(f.ino(), g.ino(), "hard links stay linked");
        assert_eq!(fs::read_link(dst.join("abs")).unwrap(), Path::new("/etc/passwd"));
        if xattr {
            assert_eq!(get_xattr(&dst.join("d"), "user.overlay.opaque"), b"y");
        }
    }

    fn c(p: &Path) -> std::ffi::CString {
        std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap()
    }

    /// False where the filesystem has no user xattrs (then the check is moot).
    fn set_xattr(p: &Path, name: &str, value: &[u8]) -> bool {
        let n = std::ffi::CString::new(name).unwrap();
        // SAFETY: valid C strings and a buffer of the given length.
        unsafe { libc::setxattr(c(p).as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), 0) == 0 }
    }

    fn get_xattr(p: &Path, name: &str) -> Vec<u8> {
        let n = std::ffi::CString::new(name).unwrap();
        let mut buf = vec![0u8; 64];
        // SAFETY: valid C strings and a buffer of the given length.
        let len = unsafe { libc::getxattr(c(p).as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        assert!(len >= 0, "getxattr: {}", std::io::Error::last_os_error());
        buf.truncate(len as usize);
        buf
    }

    #[test]
    fn existing_target_and_missing_source_fail_without_leftovers() {
        let t = TempDir::new("copyfail");
        let err = copy_tree(&t.path().join("absent"), &t.path().join("dst")).unwrap_err();
        assert!(matches!(err, ImageError::CopyFailed { .. }), "{err}");
        assert!(!t.path().join("dst").exists());
        fs::create_dir(t.path().join("src")).unwrap();
        fs::create_dir(t.path().join("taken")).unwrap();
        let err = copy_tree(&t.path().join("src"), &t.path().join("taken")).unwrap_err();
        assert!(err.to_string().contains("exists"), "{err}");
        assert!(t.path().join("taken").exists(), "an existing target is left alone");
    }
}
