//! Files placed in a new VM's writable layer before its first start
//! (`VmSpec.files`): what a client would otherwise copy in through the agent
//! right after the start, without that round trip.
//!
//! The layer is fresh (made by `prepare_dir` a moment ago, never mounted),
//! so nothing in it can redirect a write; the image's layers are only read,
//! to follow a parent the image holds as a symlink (as a write inside the VM
//! would) and to give a parent directory made here the mode and owner the
//! image gives it (as overlayfs's copy-up would).
use std::ffi::OsString;
use std::fs::{DirBuilder, Metadata, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, FileTypeExt as _, MetadataExt as _, OpenOptionsExt as _, lchown};
use std::path::{Component, Path, PathBuf};

use sandbox_userns::HandOver;

use super::error::HelperError;
use super::spec::is_normal_absolute;

/// Symlinks followed while resolving one path, as the kernel's limit.
const MAX_LINKS: usize = 40;

/// One file to place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeedFile {
    /// Absolute, normalized path inside the VM.
    pub path: PathBuf,
    /// What it is.
    pub kind: SeedKind,
}

/// A regular file or a symlink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SeedKind {
    /// A regular file.
    File {
        /// Its bytes.
        content: Vec<u8>,
        /// Permission bits; 0 means 0644.
        mode: u32,
    },
    /// A symlink to this target.
    Link(PathBuf),
}

/// Checks the files of a spec; errors name `spec.files[i]`.
pub fn validate(files: &[SeedFile]) -> Result<(), HelperError> {
    for (i, f) in files.iter().enumerate() {
        if !is_normal_absolute(&f.path) {
            return Err(HelperError::invalid(
                format!("spec.files[{i}].path"),
                format!("{} must be an absolute path below / without . or ..", f.path.display()),
            ));
        }
        if let SeedKind::File { mode, .. } = f.kind
            && mode & !0o7777 != 0
        {
            return Err(HelperError::invalid(format!("spec.files[{i}].mode"), format!("{mode:#o} is not a mode")));
        }
    }
    Ok(())
}

/// Writes `files` into `upper`, a fresh writable layer over `layers` (top
/// first); `owner` is the host uid/gid of the VM's root, `None` when the
/// helper cannot chown (it then owns them, and is the VM's root). Without
/// `owner`, returns the directories made for image directories of other
/// owners (`/var/mail` is root:mail, apt's `partial` is `_apt`'s), for the
/// caller to hand over once nothing more is written into them.
pub fn place(
    upper: &Path,
    layers: &[PathBuf],
    owner: Option<u32>,
    files: &[SeedFile],
) -> Result<Vec<HandOver>, HelperError> {
    let mut hand_over = Vec::new();
    for (i, f) in files.iter().enumerate() {
        let field = format!("spec.files[{i}].path");
        let (Some(parent), Some(name)) = (f.path.parent(), f.path.file_name()) else {
            return Err(HelperError::invalid(field, "must name a file below /"));
        };
        let parent = resolve(layers, parent).map_err(|why| HelperError::invalid(&field, why))?;
        make_parents(upper, layers, &parent, owner, &mut hand_over)?;
        let rel = parent.join(name);
        if lookup(layers, &rel).is_some_and(|(_, m)| m.is_dir()) {
            let why = format!("{} is a directory in the image", Path::new("/").join(&rel).display());
            return Err(HelperError::invalid(field, why));
        }
        let dst = upper.join(&rel);
        let io = |e| HelperError::io(format!("write {}", dst.display()), e);
        // A path given twice: the last one wins, as a second copy would.
        match std::fs::remove_file(&dst) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(e)),
            _ => {}
        }
        match &f.kind {
            SeedKind::File { content, mode } => {
                let mode = if *mode == 0 { 0o644 } else { *mode };
                let mut file = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .custom_flags(libc::O_NOFOLLOW)
                    .mode(mode)
                    .open(&dst)
                    .map_err(io)?;
                file.write_all(content).map_err(io)?;
                // The umask must not change what was asked for.
                file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(mode)).map_err(io)?;
            }
            SeedKind::Link(target) => std::os::unix::fs::symlink(target, &dst).map_err(io)?,
        }
        if let Some(id) = owner {
            lchown(&dst, Some(id), Some(id)).map_err(io)?;
        }
    }
    Ok(hand_over)
}

/// `dir` (absolute, inside the VM) with the symlinks the image holds on the
/// way resolved inside the image, relative to its root. A part the image
/// lacks is taken as a directory to make.
fn resolve(layers: &[PathBuf], dir: &Path) -> Result<PathBuf, String> {
    let mut resolved = PathBuf::new();
    let mut pending: Vec<OsString> = parts(dir);
    pending.reverse();
    let mut links = 0;
    while let Some(part) = pending.pop() {
        if part == ".." {
            resolved.pop();
            continue;
        }
        let next = resolved.join(&part);
        match lookup(layers, &next) {
            Some((i, m)) if m.file_type().is_symlink() => {
                links += 1;
                if links > MAX_LINKS {
                    return Err(format!("too many symlinks under {}", dir.display()));
                }
                let target = std::fs::read_link(layers[i].join(&next))
                    .map_err(|e| format!("cannot read the image's symlink /{}: {e}", next.display()))?;
                if target.is_absolute() {
                    resolved = PathBuf::new();
                }
                pending.extend(parts(&target).into_iter().rev());
            }
            Some((_, m)) if !m.is_dir() => return Err(format!("/{} is not a directory in the image", next.display())),
            _ => resolved = next,
        }
    }
    Ok(resolved)
}

/// A path's normal parts and `..`s, in order (`.` and the root dropped).
fn parts(p: &Path) -> Vec<OsString> {
    p.components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s.to_os_string()),
            Component::ParentDir => Some("..".into()),
            _ => None,
        })
        .collect()
}

/// What the image shows at `rel` (relative to its root, no symlinks on the
/// way): the topmost layer holding it (its index) and the entry there,
/// `None` if none does or a whiteout hides it. An opaque directory hides
/// what lower layers hold below it.
fn lookup(layers: &[PathBuf], rel: &Path) -> Option<(usize, Metadata)> {
    let mut visible = layers.len();
    let mut prefix = PathBuf::new();
    let mut found = None;
    for part in rel.components() {
        prefix.push(part);
        let (i, meta) = layers[..visible]
            .iter()
            .enumerate()
            .find_map(|(i, l)| Some((i, l.join(&prefix).symlink_metadata().ok()?)))?;
        if meta.file_type().is_char_device() && meta.rdev() == 0 {
            return None;
        }
        if meta.is_dir() && is_opaque(&layers[i].join(&prefix)) {
            visible = i + 1;
        }
        found = Some((i, meta));
    }
    found
}

/// Marked opaque by overlayfs (`trusted.` as root, `user.` in a user
/// namespace, as the store's layers are). Elsewhere (a Mac) layers are no
/// overlay directories, and nothing is.
#[cfg(not(linux_host))]
fn is_opaque(_dir: &Path) -> bool {
    false
}

/// Marked opaque by overlayfs (`trusted.` as root, `user.` in a user
/// namespace, as the store's layers are).
#[cfg(linux_host)]
fn is_opaque(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt as _;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else { return false };
    ["trusted.overlay.opaque\0", "user.overlay.opaque\0"].iter().any(|name| {
        let mut v = [0u8; 1];
        // SAFETY: both strings are NUL-terminated and `v` outlives the call.
        let n = unsafe { libc::lgetxattr(c.as_ptr(), name.as_ptr().cast(), v.as_mut_ptr().cast(), v.len()) };
        n == 1 && v[0] == b'y'
    })
}

/// Makes the directories of `rel` in `upper` that are not there yet, each
/// with the image's mode and owner, or 0755 and the VM's root. Without
/// `owner`, those whose image owner is not the helper's ids go on
/// `hand_over` instead of being chowned.
fn make_parents(
    upper: &Path,
    layers: &[PathBuf],
    rel: &Path,
    owner: Option<u32>,
    hand_over: &mut Vec<HandOver>,
) -> Result<(), HelperError> {
    let mut prefix = PathBuf::new();
    for part in rel.components() {
        prefix.push(part);
        let dir = upper.join(&prefix);
        if dir.symlink_metadata().is_ok() {
            continue;
        }
        let image = lookup(layers, &prefix).map(|(_, m)| m);
        let mode = image.as_ref().map_or(0o755, |m| m.mode() & 0o7777);
        let io = |e| HelperError::io(format!("create {}", dir.display()), e);
        DirBuilder::new().mode(mode).create(&dir).map_err(io)?;
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(mode)).map_err(io)?;
        let ids = match (&image, owner) {
            (Some(m), Some(_)) => Some((m.uid(), m.gid())),
            (None, Some(id)) => Some((id, id)),
            (Some(m), None) => {
                let own = (nix::unistd::geteuid().as_raw(), nix::unistd::getegid().as_raw());
                if (m.uid(), m.gid()) != own {
                    hand_over.push(HandOver { path: dir.clone(), uid: m.uid(), gid: m.gid() });
                }
                None
            }
            (None, None) => None,
        };
        if let Some((uid, gid)) = ids {
            lchown(&dir, Some(uid), Some(gid)).map_err(io)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_base::test_support::scratch_dir;

    fn file(path: &str, content: &str) -> SeedFile {
        SeedFile { path: path.into(), kind: SeedKind::File { content: content.into(), mode: 0 } }
    }

    #[test]
    fn follows_image_symlinks_and_keeps_its_directories() {
        let t = scratch_dir("seed-links");
        let (upper, top, base) = (t.join("upper"), t.join("top"), t.join("base"));
        for d in [&upper, &top.join("etc"), &base.join("etc/pki/certs"), &base.join("gone")] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::set_permissions(base.join("etc/pki"), std::os::unix::fs::PermissionsExt::from_mode(0o750)).unwrap();
        // /etc/ssl -> pki (relative), /etc/abs -> /etc/pki (absolute), in the top layer.
        std::os::unix::fs::symlink("pki", top.join("etc/ssl")).unwrap();
        std::os::unix::fs::symlink("/etc/pki", top.join("etc/abs")).unwrap();
        std::fs::write(top.join("etc/file"), "x").unwrap();
        let layers = [top.clone(), base.clone()];
        let files = [
            file("/etc/ssl/certs/a.crt", "A"),
            file("/etc/abs/b.crt", "B"),
            file("/new/dir/c", "C"),
            SeedFile { path: "/etc/link".into(), kind: SeedKind::Link("/etc/ssl/certs/a.crt".into()) },
        ];
        place(&upper, &layers, None, &files).unwrap();
        assert_eq!(std::fs::read_to_string(upper.join("etc/pki/certs/a.crt")).unwrap(), "A");
        assert_eq!(std::fs::read_to_string(upper.join("etc/pki/b.crt")).unwrap(), "B");
        assert_eq!(std::fs::read_to_string(upper.join("new/dir/c")).unwrap(), "C");
        assert_eq!(std::fs::read_link(upper.join("etc/link")).unwrap(), Path::new("/etc/ssl/certs/a.crt"));
        let mode = |p: &str| upper.join(p).metadata().unwrap().mode() & 0o7777;
        assert_eq!((mode("etc/pki"), mode("new"), mode("etc/pki/certs/a.crt")), (0o750, 0o755, 0o644));
        // Not a directory in the image, or the leaf is one: refused, naming the file.
        let err = place(&upper, &layers, None, &[file("/x", ""), file("/etc/file/y", "")]).unwrap_err();
        assert!(err.to_string().contains("spec.files[1]") && err.to_string().contains("/etc/file"), "{err}");
        let err = place(&upper, &layers, None, &[file("/etc/pki", "")]).unwrap_err();
        assert!(err.to_string().contains("is a directory in the image"), "{err}");
        std::fs::remove_dir_all(&t).unwrap();
    }

    #[test]
    fn whiteouts_and_opaque_directories_hide_lower_layers() {
        let t = scratch_dir("seed-hide");
        let (top, base) = (t.join("top"), t.join("base"));
        std::fs::create_dir_all(base.join("d/sub")).unwrap();
        std::fs::create_dir_all(top.join("d")).unwrap();
        let layers = [top.clone(), base.clone()];
        assert!(lookup(&layers, Path::new("d/sub")).is_some());
        let opaque = std::ffi::CString::new(top.join("d").to_str().unwrap()).unwrap();
        // SAFETY: NUL-terminated strings, value of the given length.
        let set =
            unsafe { libc::lsetxattr(opaque.as_ptr(), c"user.overlay.opaque".as_ptr(), b"y".as_ptr().cast(), 1, 0) };
        if set == 0 {
            assert!(lookup(&layers, Path::new("d/sub")).is_none());
        }
        // A whiteout (a 0:0 character device) needs CAP_MKNOD: checked where we have it.
        let node = std::ffi::CString::new(top.join("gone").to_str().unwrap()).unwrap();
        std::fs::create_dir_all(base.join("gone")).unwrap();
        // SAFETY: a NUL-terminated path.
        if unsafe { libc::mknod(node.as_ptr(), libc::S_IFCHR | 0o600, 0) } == 0 {
            assert!(lookup(&layers, Path::new("gone")).is_none());
        }
        let err = validate(&[file("/a/../b", "")]).unwrap_err();
        assert!(err.to_string().contains("spec.files[0].path"), "{err}");
        let bad_mode = SeedFile { path: "/a".into(), kind: SeedKind::File { content: Vec::new(), mode: 0o170000 } };
        assert!(validate(&[bad_mode]).unwrap_err().to_string().contains("spec.files[0].mode"));
        std::fs::remove_dir_all(&t).unwrap();
    }
}
