//! Copying a VM's writable layer exactly: owners, modes, timestamps,
//! symlinks, hard links, extended attributes (overlayfs marks opaque
//! directories and redirects with `trusted.overlay.*`, or `user.overlay.*` in
//! a user namespace) and device nodes (whiteouts are 0:0 character devices).
//!
//! The source is the upper dir of a *running* sandbox: code inside may swap
//! any directory for a symlink while we copy (the freeze is best effort). A
//! copier that opens entries by path (`cp -a` opens `upper/a/b/c`) then
//! follows `b -> /etc` and copies host files into the layer. So this walk
//! never resolves more than one name: every entry is reached through the
//! already-open fd of its parent with `O_NOFOLLOW`, must be the very inode
//! `fstatat` saw, and only directories and regular files are ever opened
//! (non-blocking, so a fifo swapped in cannot hang us). An entry that changes
//! type under us fails the copy, so a snapshot never silently lacks files.
use std::collections::HashMap;
use std::ffi::{CStr, CString, OsStr};
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, OpenHow, ResolveFlag, openat, openat2};
use nix::sys::stat::{
    FileStat, Mode, SFlag, UtimensatFlags, fchmod, fstat, fstatat, futimens, mkdirat, mknodat, utimensat,
};
use nix::sys::time::TimeSpec;
use nix::unistd::{Gid, Uid, fchown, fchownat, linkat, symlinkat};

use super::ImageError;

/// Deepest directory nesting copied; deeper trees are refused rather than
/// holding ever more descriptors (two per level).
const MAX_DEPTH: usize = 4096;

/// `FICLONE`: share the source's extents (reflink) where the filesystem can.
const FICLONE: libc::Ioctl = nix::request_code_write!(0x94, 9, std::mem::size_of::<libc::c_int>()) as libc::Ioctl;

/// Copies the directory `src` to `dst`, which must not exist yet. On failure
/// whatever was copied is removed again.
pub fn copy_tree(src: &Path, dst: &Path) -> Result<(), ImageError> {
    copy_tree_bounded(src, dst, MAX_DEPTH)
}

fn copy_tree_bounded(src: &Path, dst: &Path, max_depth: usize) -> Result<(), ImageError> {
    let fail =
        |detail: String| ImageError::CopyFailed { what: format!("{} to {}", src.display(), dst.display()), detail };
    let src_fd = nix::fcntl::open(
        src,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| fail(format!("cannot open the source: {e}")))?;
    let (Some(parent), Some(name)) = (dst.parent(), dst.file_name()) else {
        return Err(fail("the target has no parent directory".into()));
    };
    let parent = if parent.as_os_str().is_empty() { Path::new(".") } else { parent };
    let parent_fd = nix::fcntl::open(parent, OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
        .map_err(|e| fail(format!("cannot open {}: {e}", parent.display())))?;
    match mkdirat(&parent_fd, name, Mode::from_bits_truncate(0o700)) {
        Ok(()) => {}
        Err(Errno::EEXIST) => return Err(fail("the target exists".into())),
        Err(e) => return Err(fail(format!("cannot create the target: {e}"))),
    }
    let copied = open_dir(parent_fd.as_fd(), name).and_then(|dst_fd| {
        let dst_root = dst_fd.try_clone().map_err(|e| at(Path::new(""), "dup", io_errno(&e)))?;
        Copier::new(max_depth, dst_root).run(src_fd, dst_fd)
    });
    copied.map_err(|detail| {
        super::store::remove_tree(dst);
        fail(detail)
    })
}

/// One directory being copied: both ends open, the names still to copy.
struct Frame {
    src: OwnedFd,
    dst: OwnedFd,
    /// The source directory as first seen, applied to `dst` once filled.
    st: FileStat,
    /// Path inside the tree, for messages and hard links.
    rel: PathBuf,
    names: std::vec::IntoIter<CString>,
}

impl Frame {
    fn new(src: OwnedFd, dst: OwnedFd, st: FileStat, rel: PathBuf) -> Result<Self, String> {
        // Listing a duplicate: nix's Dir owns and closes its descriptor.
        let listing = src.try_clone().map_err(|e| at(&rel, "dup", io_errno(&e)))?;
        let mut dir = nix::dir::Dir::from_fd(listing).map_err(|e| at(&rel, "list", e))?;
        let mut names = Vec::new();
        for entry in dir.iter() {
            let entry = entry.map_err(|e| at(&rel, "list", e))?;
            let name = entry.file_name();
            if name != c"." && name != c".." {
                names.push(name.to_owned());
            }
        }
        Ok(Frame { src, dst, st, rel, names: names.into_iter() })
    }
}

struct Copier {
    /// Source inodes with several links: (dev, ino) to where the first copy
    /// went, relative to the target root.
    links: HashMap<(u64, u64), PathBuf>,
    /// Without root, chown to other owners fails; `cp -a` then keeps the
    /// data with our ownership, and so do we.
    root: bool,
    /// The target root, which hard links are resolved beneath.
    dst_root: OwnedFd,
    max_depth: usize,
}

impl Copier {
    fn new(max_depth: usize, dst_root: OwnedFd) -> Self {
        Copier { links: HashMap::new(), root: nix::unistd::geteuid().is_root(), dst_root, max_depth }
    }

    fn run(mut self, src: OwnedFd, dst: OwnedFd) -> Result<(), String> {
        let st = fstat(&src).map_err(|e| at(Path::new(""), "stat", e))?;
        let mut stack = vec![Frame::new(src, dst, st, PathBuf::new())?];
        while let Some(depth) = stack.len().checked_sub(1) {
            let top = &mut stack[depth];
            let Some(name) = top.names.next() else {
                let done = stack.pop().expect("a frame is on the stack");
                self.finish_dir(&done)?;
                continue;
            };
            if let Some(sub) = self.copy_entry(top, &name, depth + 1)? {
                stack.push(sub);
            }
        }
        Ok(())
    }

    /// Copies one entry of `top`; a directory comes back as a frame to fill.
    fn copy_entry(&mut self, top: &Frame, name: &CStr, depth: usize) -> Result<Option<Frame>, String> {
        let rel = top.rel.join(OsStr::from_bytes(name.to_bytes()));
        let st = fstatat(&top.src, name, AtFlags::AT_SYMLINK_NOFOLLOW).map_err(|e| gone_or(&rel, "stat", e))?;
        let kind = SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits());
        if kind == SFlag::S_IFDIR {
            if depth >= self.max_depth {
                return Err(format!("{}: nested deeper than {} directories", rel.display(), self.max_depth));
            }
            let src = open_checked(&top.src, name, OFlag::O_RDONLY | OFlag::O_DIRECTORY, &st, &rel)?;
            mkdirat(&top.dst, name, Mode::from_bits_truncate(0o700)).map_err(|e| at(&rel, "mkdir", e))?;
            let dst = open_dir(top.dst.as_fd(), name)?;
            return Frame::new(src, dst, st, rel).map(Some);
        }
        if st.st_nlink > 1 {
            if let Some(first) = self.links.get(&(st.st_dev, st.st_ino)) {
                self.link(first, &top.dst, name, &rel)?;
                return Ok(None);
            }
            self.links.insert((st.st_dev, st.st_ino), rel.clone());
        }
        match kind {
            SFlag::S_IFREG => self.copy_file(top, name, &st, &rel)?,
            SFlag::S_IFLNK => {
                // EINVAL: no longer a symlink.
                let target = nix::fcntl::readlinkat(&top.src, name).map_err(|e| match e {
                    Errno::EINVAL => changed(&rel),
                    e => gone_or(&rel, "readlink", e),
                })?;
                symlinkat(target.as_os_str(), &top.dst, name).map_err(|e| at(&rel, "symlink", e))?;
                self.chown_at(&top.dst, name, &st, &rel)?;
                set_times_at(&top.dst, name, &st, &rel)?;
            }
            // Devices, fifos and sockets are made anew from the stat, never opened.
            _ => {
                mknodat(&top.dst, name, kind, Mode::from_bits_truncate(0o600), st.st_rdev)
                    .map_err(|e| at(&rel, "mknod", e))?;
                let kept = self.chown_at(&top.dst, name, &st, &rel)?;
                nix::sys::stat::fchmodat(&top.dst, name, mode(&st, kept), nix::sys::stat::FchmodatFlags::FollowSymlink)
                    .map_err(|e| at(&rel, "chmod", e))?;
                set_times_at(&top.dst, name, &st, &rel)?;
            }
        }
        Ok(None)
    }

    fn copy_file(&self, top: &Frame, name: &CStr, st: &FileStat, rel: &Path) -> Result<(), String> {
        let flags = OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY;
        let src = File::from(open_checked(&top.src, name, flags, st, rel)?);
        let create = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let dst = File::from(
            openat(&top.dst, name, create, Mode::from_bits_truncate(0o600)).map_err(|e| at(rel, "create", e))?,
        );
        copy_data(&src, &dst).map_err(|e| at(rel, "copy data", e))?;
        self.apply(src.as_fd(), dst.as_fd(), st, rel)
    }

    /// Owner, then mode (chown clears setuid), xattrs, and times last.
    fn apply(&self, src: BorrowedFd, dst: BorrowedFd, st: &FileStat, rel: &Path) -> Result<(), String> {
        let kept = self.owner_kept(fchown(dst, Some(Uid::from_raw(st.st_uid)), Some(Gid::from_raw(st.st_gid))), rel)?;
        fchmod(dst, mode(st, kept)).map_err(|e| at(rel, "chmod", e))?;
        copy_xattrs(src, dst).map_err(|e| at(rel, "copy xattrs", e))?;
        futimens(dst, &atime(st), &mtime(st)).map_err(|e| at(rel, "set times", e))
    }

    /// A directory's own metadata, once its entries are in (adding them
    /// changes its times; a read-only mode would refuse them).
    fn finish_dir(&self, frame: &Frame) -> Result<(), String> {
        self.apply(frame.src.as_fd(), frame.dst.as_fd(), &frame.st, &frame.rel)
    }

    fn chown_at(&self, dir: &OwnedFd, name: &CStr, st: &FileStat, rel: &Path) -> Result<bool, String> {
        let (uid, gid) = (Some(Uid::from_raw(st.st_uid)), Some(Gid::from_raw(st.st_gid)));
        self.owner_kept(fchownat(dir, name, uid, gid, AtFlags::AT_SYMLINK_NOFOLLOW), rel)
    }

    fn owner_kept(&self, chowned: nix::Result<()>, rel: &Path) -> Result<bool, String> {
        match chowned {
            Ok(()) => Ok(true),
            Err(Errno::EPERM | Errno::EINVAL) if !self.root => Ok(false),
            Err(e) => Err(at(rel, "chown", e)),
        }
    }

    /// Links `name` to the copy of an inode seen before. The target tree is
    /// ours alone, yet the path is still resolved beneath its root without
    /// symlinks.
    fn link(&self, first: &Path, dir: &OwnedFd, name: &CStr, rel: &Path) -> Result<(), String> {
        let parent = first.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let how = OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_NO_XDEV);
        let parent_fd = openat2(&self.dst_root, parent, how).map_err(|e| at(first, "open for linking", e))?;
        let first_name = first.file_name().expect("a linked entry has a name");
        linkat(&parent_fd, first_name, dir, name, AtFlags::empty()).map_err(|e| at(rel, "link", e))
    }
}

/// Opens `name` in `dir` without following a symlink and checks it is the
/// inode `st` describes; anything else means the sandbox changed it.
fn open_checked(dir: &OwnedFd, name: &CStr, flags: OFlag, st: &FileStat, rel: &Path) -> Result<OwnedFd, String> {
    match openat(dir, name, flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::empty()) {
        Ok(fd) => match fstat(&fd) {
            Ok(now) if same(st, &now) => Ok(fd),
            Ok(_) => Err(changed(rel)),
            Err(e) => Err(at(rel, "stat", e)),
        },
        Err(e) => match fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(now) if same(st, &now) => Err(at(rel, "open", e)),
            _ => Err(changed(rel)),
        },
    }
}

fn same(a: &FileStat, b: &FileStat) -> bool {
    let ty = SFlag::S_IFMT.bits();
    (a.st_dev, a.st_ino, a.st_mode & ty) == (b.st_dev, b.st_ino, b.st_mode & ty)
}

/// Opens a directory of the target, which nothing else touches.
fn open_dir(dir: BorrowedFd, name: &(impl nix::NixPath + ?Sized)) -> Result<OwnedFd, String> {
    openat(dir, name, OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::empty())
        .map_err(|e| format!("cannot open a target directory: {e}"))
}

/// The permission bits to set; like `cp -a`, setuid and setgid are dropped
/// where the owner could not be kept.
fn mode(st: &FileStat, owner_kept: bool) -> Mode {
    let mut bits = st.st_mode & 0o7777;
    if !owner_kept {
        bits &= !(libc::S_ISUID | libc::S_ISGID);
    }
    Mode::from_bits_truncate(bits)
}

fn atime(st: &FileStat) -> TimeSpec {
    TimeSpec::new(st.st_atime, st.st_atime_nsec)
}

fn mtime(st: &FileStat) -> TimeSpec {
    TimeSpec::new(st.st_mtime, st.st_mtime_nsec)
}

fn set_times_at(dir: &OwnedFd, name: &CStr, st: &FileStat, rel: &Path) -> Result<(), String> {
    utimensat(dir, name, &atime(st), &mtime(st), UtimensatFlags::NoFollowSymlink).map_err(|e| at(rel, "set times", e))
}

/// Reflinks where the filesystem can, else lets std copy (copy_file_range,
/// falling back to read/write).
fn copy_data(src: &File, dst: &File) -> Result<(), Errno> {
    // SAFETY: FICLONE takes the source descriptor as its argument; both are open.
    if unsafe { libc::ioctl(dst.as_raw_fd(), FICLONE, src.as_raw_fd()) } == 0 {
        return Ok(());
    }
    std::io::copy(&mut &*src, &mut &*dst).map(drop).map_err(|e| io_errno(&e))
}

/// Copies every extended attribute the target accepts; like `cp -a`, those
/// it refuses (a namespace without privilege, no xattr support) are left out.
fn copy_xattrs(src: BorrowedFd, dst: BorrowedFd) -> Result<(), Errno> {
    let list = match sized(|buf, len| {
        // SAFETY: `buf` has room for `len` bytes.
        unsafe { libc::flistxattr(src.as_raw_fd(), buf.cast(), len) }
    }) {
        Err(Errno::ENOTSUP) => return Ok(()),
        other => other?,
    };
    for name in list.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let name = CString::new(name).expect("split at every NUL");
        let value = sized(|buf, len| {
            // SAFETY: a C string and room for `len` bytes at `buf`.
            unsafe { libc::fgetxattr(src.as_raw_fd(), name.as_ptr(), buf.cast(), len) }
        })?;
        // SAFETY: a C string and `value.len()` bytes at `value`.
        let set = unsafe { libc::fsetxattr(dst.as_raw_fd(), name.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
        match Errno::result(set) {
            Ok(_) | Err(Errno::EPERM | Errno::ENOTSUP) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Runs a size-then-fill xattr call until the buffer fits.
fn sized(mut call: impl FnMut(*mut u8, usize) -> isize) -> Result<Vec<u8>, Errno> {
    loop {
        let len = usize::try_from(call(std::ptr::null_mut(), 0)).map_err(|_| Errno::last())?;
        let mut buf = vec![0u8; len];
        match usize::try_from(call(buf.as_mut_ptr(), len)) {
            Ok(n) => {
                buf.truncate(n);
                return Ok(buf);
            }
            Err(_) if Errno::last() == Errno::ERANGE => continue,
            Err(_) => return Err(Errno::last()),
        }
    }
}

fn io_errno(e: &std::io::Error) -> Errno {
    Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO))
}

fn at(rel: &Path, op: &str, e: Errno) -> String {
    let rel = if rel.as_os_str().is_empty() { Path::new(".") } else { rel };
    format!("{}: {op}: {e}", rel.display())
}

/// An entry listed a moment ago that is gone was removed by the sandbox.
fn gone_or(rel: &Path, op: &str, e: Errno) -> String {
    if e == Errno::ENOENT { changed(rel) } else { at(rel, op, e) }
}

fn changed(rel: &Path) -> String {
    format!("{} changed while being copied (the sandbox modified it); retry", rel.display())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::test_dir::TempDir;
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

    /// `(uid, gid, mode, mtime s, mtime ns)` of `p`, not following a symlink.
    fn meta(p: &Path) -> (u32, u32, u32, i64, i64) {
        let m = fs::symlink_metadata(p).unwrap();
        (m.uid(), m.gid(), m.mode(), m.mtime(), m.mtime_nsec())
    }

    /// Sets atime and mtime of `p` (a symlink itself, not its target).
    fn set_times(p: &Path, secs: i64, nsecs: i64) {
        let t = nix::sys::time::TimeSpec::new(secs, nsecs);
        nix::sys::stat::utimensat(nix::fcntl::AT_FDCWD, p, &t, &t, nix::sys::stat::UtimensatFlags::NoFollowSymlink)
            .unwrap();
    }

    #[test]
    fn keeps_owners_setuid_sticky_and_nanosecond_times() {
        let t = TempDir::new("copyown");
        let src = t.path().join("src");
        fs::create_dir_all(src.join("shared")).unwrap();
        fs::write(src.join("shared/su"), b"#!/bin/sh\n").unwrap();
        std::os::unix::fs::lchown(src.join("shared/su"), Some(1234), Some(5678)).unwrap();
        fs::set_permissions(src.join("shared/su"), fs::Permissions::from_mode(0o6755)).unwrap();
        std::os::unix::fs::lchown(src.join("shared"), Some(4321), Some(8765)).unwrap();
        fs::set_permissions(src.join("shared"), fs::Permissions::from_mode(0o3775)).unwrap();
        symlink("su", src.join("shared/link")).unwrap();
        std::os::unix::fs::lchown(src.join("shared/link"), Some(99), Some(98)).unwrap();
        set_times(&src.join("shared/su"), 1_600_000_000, 123_456_789);
        set_times(&src.join("shared/link"), 1_500_000_000, 987_654_321);
        set_times(&src.join("shared"), 1_400_000_000, 1);
        set_times(&src, 1_300_000_000, 999_999_999);

        let dst = t.path().join("dst");
        copy_tree(&src, &dst).unwrap();
        for rel in ["", "shared", "shared/su", "shared/link"] {
            assert_eq!(meta(&dst.join(rel)), meta(&src.join(rel)), "{rel:?}");
        }
        assert_eq!(meta(&dst.join("shared/su")), (1234, 5678, 0o106755, 1_600_000_000, 123_456_789));
        assert_eq!(meta(&dst.join("shared")).2, 0o43775);
    }

    #[test]
    fn copies_fifos_devices_whiteouts_and_sockets_as_such() {
        use nix::sys::stat::{Mode, SFlag, makedev, mknod};
        use std::os::unix::fs::FileTypeExt;
        let t = TempDir::new("copyspecial");
        let src = t.path().join("src");
        fs::create_dir(&src).unwrap();
        nix::unistd::mkfifo(&src.join("fifo"), Mode::from_bits_truncate(0o640)).unwrap();
        mknod(&src.join("null"), SFlag::S_IFCHR, Mode::from_bits_truncate(0o666), makedev(1, 3)).unwrap();
        mknod(&src.join("whiteout"), SFlag::S_IFCHR, Mode::empty(), makedev(0, 0)).unwrap();
        mknod(&src.join("disk"), SFlag::S_IFBLK, Mode::from_bits_truncate(0o600), makedev(7, 0)).unwrap();
        // overlayfs links whiteouts to one shared inode.
        fs::hard_link(src.join("whiteout"), src.join("whiteout2")).unwrap();
        let _sock = std::os::unix::net::UnixListener::bind(src.join("sock")).unwrap();

        let dst = t.path().join("dst");
        copy_tree(&src, &dst).unwrap();
        let m = |n: &str| fs::symlink_metadata(dst.join(n)).unwrap();
        assert!(m("fifo").file_type().is_fifo());
        assert_eq!(m("fifo").mode() & 0o7777, 0o640);
        assert!(m("null").file_type().is_char_device());
        assert_eq!(m("null").rdev(), makedev(1, 3));
        assert!(m("whiteout").file_type().is_char_device());
        assert_eq!(m("whiteout").rdev(), 0);
        assert_eq!(m("whiteout").ino(), m("whiteout2").ino(), "whiteouts stay linked");
        assert!(m("disk").file_type().is_block_device());
        assert_eq!(m("disk").rdev(), makedev(7, 0));
        assert!(m("sock").file_type().is_socket());
    }

    #[test]
    fn keeps_hard_links_across_directories_and_symlink_loops_as_links() {
        let t = TempDir::new("copylinks");
        let src = t.path().join("src");
        fs::create_dir_all(src.join("a/deep/er")).unwrap();
        fs::create_dir_all(src.join("b")).unwrap();
        fs::write(src.join("a/deep/er/f"), b"linked").unwrap();
        fs::hard_link(src.join("a/deep/er/f"), src.join("b/g")).unwrap();
        fs::hard_link(src.join("a/deep/er/f"), src.join("h")).unwrap();
        symlink("loop2", src.join("loop1")).unwrap();
        symlink("loop1", src.join("loop2")).unwrap();
        symlink("self", src.join("self")).unwrap();
        symlink("..", src.join("a/up")).unwrap();
        fs::hard_link(src.join("self"), src.join("b/self-link")).unwrap();

        let dst = t.path().join("dst");
        copy_tree(&src, &dst).unwrap();
        let ino = |n: &str| fs::symlink_metadata(dst.join(n)).unwrap().ino();
        assert_eq!(ino("a/deep/er/f"), ino("b/g"));
        assert_eq!(ino("a/deep/er/f"), ino("h"));
        assert_eq!(fs::symlink_metadata(dst.join("h")).unwrap().nlink(), 3);
        assert_eq!(fs::read(dst.join("b/g")).unwrap(), b"linked");
        assert_eq!(ino("self"), ino("b/self-link"));
        for (link, target) in [("loop1", "loop2"), ("loop2", "loop1"), ("self", "self"), ("a/up", "..")] {
            assert_eq!(fs::read_link(dst.join(link)).unwrap(), Path::new(target), "{link}");
        }
    }

    #[test]
    fn copies_trusted_overlay_xattrs_of_files_and_directories() {
        let t = TempDir::new("copyxattr");
        let src = t.path().join("src");
        fs::create_dir_all(src.join("opaque")).unwrap();
        fs::write(src.join("redirect"), b"").unwrap();
        // tmpfs and most disk filesystems take trusted.* from root.
        if !set_xattr(&src.join("opaque"), "trusted.overlay.opaque", b"y") {
            return;
        }
        assert!(set_xattr(&src.join("redirect"), "trusted.overlay.redirect", b"/elsewhere"));
        assert!(set_xattr(&src.join("redirect"), "user.overlay.origin", &[0, 1, 2, 255]));
        let dst = t.path().join("dst");
        copy_tree(&src, &dst).unwrap();
        assert_eq!(get_xattr(&dst.join("opaque"), "trusted.overlay.opaque"), b"y");
        assert_eq!(get_xattr(&dst.join("redirect"), "trusted.overlay.redirect"), b"/elsewhere");
        assert_eq!(get_xattr(&dst.join("redirect"), "user.overlay.origin"), [0, 1, 2, 255]);
    }

    /// The red-team attack: code in the sandbox swaps a directory of its
    /// layer for a symlink to a host directory while the layer is copied. No
    /// copy may ever contain the host file: each either succeeds without it or
    /// fails naming the change.
    #[test]
    fn a_directory_swapped_for_a_host_symlink_never_leaks_host_files() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        const MARKER: &[u8] = b"host-secret-marker";
        let t = TempDir::new("copyattack");
        let host = t.path().join("host");
        fs::create_dir(&host).unwrap();
        fs::write(host.join("SECRET"), MARKER).unwrap();
        let src = t.path().join("src");
        let dirs: Vec<_> = (0..8).map(|i| src.join(format!("d{i}"))).collect();
        for d in &dirs {
            fs::create_dir_all(d).unwrap();
            fs::write(d.join("SECRET"), b"sandbox file").unwrap();
            for j in 0..4 {
                fs::write(d.join(format!("f{j}")), b"x").unwrap();
            }
        }
        let stop = Arc::new(AtomicBool::new(false));
        let swapper = {
            let (stop, host, dirs) = (stop.clone(), host.clone(), dirs.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    for d in &dirs {
                        let aside = d.with_extension("aside");
                        fs::rename(d, &aside).unwrap();
                        symlink(&host, d).unwrap();
                        std::thread::sleep(std::time::Duration::from_micros(200));
                        fs::remove_file(d).unwrap();
                        fs::rename(&aside, d).unwrap();
                    }
                }
            })
        };
        let (mut copied, mut refused) = (0, 0);
        for i in 0..200 {
            let dst = t.path().join(format!("dst{i}"));
            match copy_tree(&src, &dst) {
                Ok(()) => {
                    copied += 1;
                    assert_no_marker(&dst, MARKER);
                    fs::remove_dir_all(&dst).unwrap();
                }
                Err(e) => {
                    refused += 1;
                    assert!(e.to_string().contains("changed while being copied"), "{e}");
                    assert!(!dst.exists(), "a failed copy leaves nothing");
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
        swapper.join().unwrap();
        eprintln!("{copied} copies, {refused} refused as changed");
    }

    fn assert_no_marker(dir: &Path, marker: &[u8]) {
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let ty = fs::symlink_metadata(&path).unwrap().file_type();
            if ty.is_dir() {
                assert_no_marker(&path, marker);
            } else if ty.is_file() {
                assert!(fs::read(&path).unwrap() != marker, "host file copied into {}", path.display());
            }
        }
    }

    #[test]
    fn too_deep_a_tree_fails_and_leaves_nothing() {
        let t = TempDir::new("copydeep");
        let src = t.path().join("src");
        fs::create_dir_all(src.join("1/2/3/4")).unwrap();
        let dst = t.path().join("dst");
        let err = copy_tree_bounded(&src, &dst, 4).unwrap_err();
        assert!(err.to_string().contains("1/2/3/4: nested deeper than"), "{err}");
        assert!(!dst.exists(), "a failed copy leaves nothing");
        copy_tree_bounded(&src, &dst, 5).unwrap();
        assert!(dst.join("1/2/3/4").is_dir());
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
        let err = copy_tree(&t.path().join("src"), &t.path().join("no-dir/dst")).unwrap_err();
        assert!(err.to_string().contains("cannot open"), "{err}");
        let err = copy_tree(&t.path().join("src"), Path::new("/proc/smcp-copy-target")).unwrap_err();
        assert!(err.to_string().contains("cannot create the target"), "{err}");
        let err = copy_tree(&t.path().join("src"), Path::new("/")).unwrap_err();
        assert!(err.to_string().contains("no parent directory"), "{err}");
    }
}
