//! Unpacking an OCI image's layers into a root filesystem.
//!
//! Layers are applied bottom first by the confined child (see
//! [`super::confined`]): root of a user namespace with the sandbox's id map,
//! chrooted into the new tree. Owners are the numeric ids the tar records,
//! so a file owned by 33 inside gets the host id the map gives 33. Every
//! path is also resolved inside the root by the kernel (`openat2` with
//! `RESOLVE_IN_ROOT`), and the last component of an entry is always acted
//! on through its parent's descriptor without following it: a symlink
//! `etc -> /` makes `etc/passwd` the tree's own `/passwd`, as it would be
//! in a container, and never the host's. Entries naming `..` or an absolute
//! path are refused outright. Whiteouts (`.wh.NAME`, `.wh..wh..opq`) remove
//! what lower layers put there; device nodes are skipped (sandboxes get
//! their own /dev). Each layer's uncompressed stream is hashed while it is
//! read and must match its diff_id.
use std::collections::HashSet;
use std::ffi::{CStr, CString};
use std::fs::File;
use std::io::{BufReader, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use sandbox_base::size::human_size;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, OpenHow, ResolveFlag, openat, openat2};
use nix::sys::stat::{Mode, SFlag, UtimensatFlags, fchmod, fstatat, futimens, mkdirat, mknodat, utimensat};
use nix::sys::statvfs::fstatvfs;
use nix::sys::time::TimeSpec;
use nix::unistd::{Gid, Uid, UnlinkatFlags, fchown, fchownat, linkat, symlinkat, unlinkat};

use super::blobs::HashingReader;
use super::confined::{self, Job, LayerJob, PROGRESS_PREFIX};
use super::{BlobStore, FetchedImage, OciError};
use sandbox_userns::IdMapper;

/// Most entries an image's layers may hold together; a layer listing
/// millions of empty files is refused before it exhausts the inodes.
const MAX_ENTRIES: u64 = 4_000_000;
/// Free space an unpack always leaves on the store's filesystem, at least:
/// a layer that would take it (a size bomb, or just too big an image) is
/// refused before its file is written, so the host's other writers go on.
const SPARE_BYTES: u64 = 1 << 30;
/// Prefix of a whiteout entry's name.
const WHITEOUT: &[u8] = b".wh.";
/// Name of an opaque whiteout: the directory hides what lower layers put there.
const OPAQUE: &[u8] = b".wh..wh..opq";

/// How a layer blob is compressed, from its media type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Compression {
    None,
    Gzip,
    Zstd,
}

fn compression(media_type: &str) -> Result<Compression, OciError> {
    match media_type {
        "application/vnd.oci.image.layer.v1.tar"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar"
        | "application/vnd.docker.image.rootfs.diff.tar" => Ok(Compression::None),
        "application/vnd.oci.image.layer.v1.tar+gzip"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
        | "application/vnd.docker.image.rootfs.diff.tar.gzip"
        | "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip" => Ok(Compression::Gzip),
        "application/vnd.oci.image.layer.v1.tar+zstd"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd"
        | "application/vnd.docker.image.rootfs.diff.tar.zstd" => Ok(Compression::Zstd),
        other => {
            Err(OciError::malformed(format!("layer media type {other:?}"), "not a tar, tar+gzip or tar+zstd layer"))
        }
    }
}

/// Applies `image`'s layers, bottom first, into the new directory `rootfs`
/// through `mapper`'s id map. On any failure (a hostile entry, a diff_id
/// that does not match, a truncated blob) `rootfs` is removed again.
pub fn unpack_image(
    image: &FetchedImage,
    blobs: &BlobStore,
    mapper: &IdMapper,
    rootfs: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<(), OciError> {
    // Checked before anything is created: an unknown compression is the
    // caller's error, not a half-made tree's.
    for layer in &image.layers {
        compression(&layer.media_type)?;
        super::blobs::digest_hex(&layer.diff_id)?;
    }
    let files = image
        .layers
        .iter()
        .map(|l| {
            let path = blobs.path(&l.digest)?;
            File::open(&path).map_err(|e| OciError::io(format!("opening layer blob {}", path.display()), e))
        })
        .collect::<Result<Vec<_>, _>>()?;
    std::fs::create_dir(rootfs).map_err(|e| OciError::io(format!("creating {}", rootfs.display()), e))?;
    let result = (|| {
        // Made out here, so it must belong to root inside for the applier
        // (that root) to own it.
        let (uid, gid) = mapper.id_map().host_root();
        std::os::unix::fs::chown(rootfs, Some(uid), Some(gid))
            .map_err(|e| OciError::io(format!("handing {} to the sandbox's root", rootfs.display()), e))?;
        let dir = File::from(open_path_dir(rootfs)?);
        let layers = image
            .layers
            .iter()
            .zip(&files)
            .map(|(l, f)| LayerJob {
                fd: confined::fd_of(f),
                media_type: l.media_type.clone(),
                diff_id: l.diff_id.clone(),
                digest: l.digest.clone(),
            })
            .collect();
        let job = Job::Apply { root: confined::fd_of(&dir), layers };
        let size: u64 = image.layers.iter().map(|l| l.size).sum();
        progress(&format!(
            "unpacking {} layers ({}) for the sandbox's ids ({})",
            image.layers.len(),
            human_size(size),
            mapper.id_map().describe()
        ));
        let mut handed: Vec<&File> = files.iter().collect();
        handed.push(&dir);
        let out = confined::run(mapper, &job, &handed)?;
        for line in out.lines().filter_map(|l| l.strip_prefix(PROGRESS_PREFIX)) {
            progress(line);
        }
        Ok(())
    })();
    if result.is_err()
        && let Err(e) = sandbox_userns::remove_tree(rootfs)
    {
        tracing::warn!(path = %rootfs.display(), error = %e, "cannot remove a failed unpack");
    }
    result
}

/// An `O_PATH` descriptor of the directory `path` (no read permission
/// needed: the namespace's root may not be able to list it from here).
pub(super) fn open_path_dir(path: &Path) -> Result<OwnedFd, OciError> {
    nix::fcntl::open(path, OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
        .map_err(|e| OciError::io(format!("opening {}", path.display()), e.into()))
}

/// The root directory entries are resolved in.
pub(super) fn open_root(path: &str) -> Result<OwnedFd, OciError> {
    open_path_dir(Path::new(path))
}

/// Applies one layer blob into `root`; returns how many entries it held.
pub(super) fn apply_blob(
    root: &OwnedFd,
    what: &str,
    media_type: &str,
    diff_id: &str,
    file: File,
) -> Result<u64, OciError> {
    let reader = BufReader::with_capacity(1 << 16, file);
    let stream: Box<dyn Read> = match compression(media_type)? {
        Compression::None => Box::new(reader),
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(reader)),
        Compression::Zstd => Box::new(
            zstd::stream::read::Decoder::with_buffer(reader)
                .map_err(|e| OciError::malformed(what, format!("starting zstd: {e}")))?,
        ),
    };
    apply_layer(root.as_fd(), what, diff_id, stream)
}

/// Applies the uncompressed tar `stream` into `root` and checks its
/// sha256 against `diff_id`, including the bytes after the end of the
/// archive that tar readers stop short of.
pub(super) fn apply_layer(root: BorrowedFd, what: &str, diff_id: &str, stream: impl Read) -> Result<u64, OciError> {
    let mut hashing = HashingReader::new(stream);
    let mut applier = Applier { root, what, seen: HashSet::new(), entries: 0 };
    {
        let mut archive = tar::Archive::new(&mut hashing);
        let entries = archive.entries().map_err(|e| applier.bad("reading the tar", e))?;
        for entry in entries {
            let mut entry = entry.map_err(|e| applier.bad("reading the tar", e))?;
            applier.entries += 1;
            if applier.entries > MAX_ENTRIES {
                return Err(OciError::malformed(what, format!("more than {MAX_ENTRIES} entries")));
            }
            applier.apply(&mut entry)?;
        }
    }
    std::io::copy(&mut hashing, &mut std::io::sink()).map_err(|e| applier.bad("reading the tar", e))?;
    let (actual, _) = hashing.finish();
    if actual != diff_id {
        return Err(OciError::DigestMismatch {
            what: format!("{what}, uncompressed (its diff_id)"),
            expected: diff_id.to_string(),
            actual,
        });
    }
    Ok(applier.entries)
}

/// The state of one layer being applied.
struct Applier<'a> {
    root: BorrowedFd<'a>,
    what: &'a str,
    /// Paths this layer put in place and every directory above them: an
    /// opaque whiteout empties a directory of what *lower* layers put there.
    seen: HashSet<Vec<u8>>,
    entries: u64,
}

impl Applier<'_> {
    fn bad(&self, doing: &str, e: impl std::fmt::Display) -> OciError {
        OciError::malformed(self.what, format!("{doing}: {e}"))
    }

    /// Refuses a file of `size` bytes (as its header declares: the tar
    /// reader reads no more) that would leave less than [`SPARE_BYTES`]
    /// free, or 2% of the filesystem if that is more.
    fn check_room(&self, dir: &OwnedFd, size: u64, shown: &str) -> Result<(), OciError> {
        let Ok(st) = fstatvfs(dir) else { return Ok(()) };
        let block = st.fragment_size().max(1);
        let free = st.blocks_available().saturating_mul(block);
        let spare = SPARE_BYTES.max(st.blocks().saturating_mul(block) / 50);
        if size.saturating_add(spare) <= free {
            return Ok(());
        }
        Err(OciError::malformed(
            self.what,
            format!(
                "entry {shown:?} declares {size} bytes, and the image store's filesystem has {free} bytes free \
                 ({spare} kept spare): nothing more is written; free space, or use a smaller image"
            ),
        ))
    }

    fn apply<R: Read>(&mut self, entry: &mut tar::Entry<R>) -> Result<(), OciError> {
        let raw = entry.path_bytes().into_owned();
        let shown = String::from_utf8_lossy(&raw).into_owned();
        let kind = entry.header().entry_type();
        if matches!(kind, tar::EntryType::XGlobalHeader | tar::EntryType::XHeader) {
            return Ok(());
        }
        let comps = components(&raw).map_err(|why| self.bad(&format!("entry {shown:?}"), why))?;
        let fail = |doing: &str, e: Errno| OciError::malformed(self.what, format!("{doing} {shown:?}: {e}"));
        let Some((name, parents)) = comps.split_last() else {
            // The root itself: only a directory may stand there.
            if kind.is_dir() {
                let dir =
                    openat(self.root, ".", OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
                        .map_err(|e| fail("opening", e))?;
                return self.finish_fd(&dir, entry, &shown);
            }
            return Err(self.bad(&format!("entry {shown:?}"), "names the root as a non-directory"));
        };
        if let Some(hidden) = name.strip_prefix(WHITEOUT) {
            return self.whiteout(parents, name, hidden, &shown);
        }
        let parent = self.dir(parents, true).map_err(|e| fail("creating the directory of", e))?;
        let cname = cstring(name);
        let mut path = parents.join(&b'/');
        for i in 0..parents.len() {
            self.seen.insert(parents[..=i].join(&b'/'));
        }
        if !path.is_empty() {
            path.push(b'/');
        }
        path.extend_from_slice(name);
        self.seen.insert(path);
        let header = entry.header();
        let mode = Mode::from_bits_truncate(header.mode().map_err(|e| self.bad("reading a mode", e))? & 0o7777);
        match kind {
            tar::EntryType::Directory => {
                let existing = fstatat(&parent, cname.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW);
                if !existing.is_ok_and(|st| SFlag::from_bits_truncate(st.st_mode & libc::S_IFMT) == SFlag::S_IFDIR) {
                    remove_at(parent.as_fd(), &cname).map_err(|e| fail("replacing", e))?;
                    mkdirat(&parent, cname.as_c_str(), Mode::from_bits_truncate(0o700))
                        .map_err(|e| fail("creating", e))?;
                }
                let dir = openat(
                    &parent,
                    cname.as_c_str(),
                    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|e| fail("opening", e))?;
                self.finish_fd(&dir, entry, &shown)
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                self.check_room(&parent, entry.size(), &shown)?;
                remove_at(parent.as_fd(), &cname).map_err(|e| fail("replacing", e))?;
                let fd = openat(
                    &parent,
                    cname.as_c_str(),
                    OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                    Mode::from_bits_truncate(0o600),
                )
                .map_err(|e| fail("creating", e))?;
                let mut file = File::from(fd);
                std::io::copy(entry, &mut file).map_err(|e| self.bad(&format!("writing {shown:?}"), e))?;
                let fd = OwnedFd::from(file);
                self.finish_fd(&fd, entry, &shown)?;
                let mtime = TimeSpec::new(entry.header().mtime().unwrap_or(0).min(i64::MAX as u64) as i64, 0);
                futimens(&fd, &mtime, &mtime).map_err(|e| fail("setting the time of", e))
            }
            tar::EntryType::Symlink => {
                let target = entry.link_name_bytes().ok_or_else(|| self.bad(&shown, "a symlink without a target"))?;
                remove_at(parent.as_fd(), &cname).map_err(|e| fail("replacing", e))?;
                // The target is stored as written: it is only ever resolved
                // inside a sandbox's root (or here, inside this one).
                symlinkat(cstring(&target).as_c_str(), &parent, cname.as_c_str())
                    .map_err(|e| fail("creating the symlink", e))?;
                self.chown_at(&parent, &cname, entry, &shown)?;
                let mtime = TimeSpec::new(entry.header().mtime().unwrap_or(0).min(i64::MAX as u64) as i64, 0);
                utimensat(&parent, cname.as_c_str(), &mtime, &mtime, UtimensatFlags::NoFollowSymlink)
                    .map_err(|e| fail("setting the time of", e))
            }
            tar::EntryType::Link => {
                let target = entry.link_name_bytes().ok_or_else(|| self.bad(&shown, "a hard link without a target"))?;
                let shown_target = String::from_utf8_lossy(&target).into_owned();
                let tcomps = components(&target)
                    .map_err(|why| self.bad(&format!("hard link {shown:?} -> {shown_target:?}"), why))?;
                let Some((tname, tparents)) = tcomps.split_last() else {
                    return Err(self.bad(&format!("hard link {shown:?}"), "links to the root directory"));
                };
                if tcomps == comps {
                    return Ok(());
                }
                let tparent =
                    self.dir(tparents, false).map_err(|e| fail(&format!("linking to {shown_target:?} as"), e))?;
                remove_at(parent.as_fd(), &cname).map_err(|e| fail("replacing", e))?;
                // Flags 0: the link names the entry itself, never what a
                // symlink there points to.
                linkat(&tparent, cstring(tname).as_c_str(), &parent, cname.as_c_str(), AtFlags::empty())
                    .map_err(|e| fail(&format!("linking to {shown_target:?} as"), e))
            }
            tar::EntryType::Fifo => {
                remove_at(parent.as_fd(), &cname).map_err(|e| fail("replacing", e))?;
                mknodat(&parent, cname.as_c_str(), SFlag::S_IFIFO, mode, 0).map_err(|e| fail("creating", e))?;
                self.chown_at(&parent, &cname, entry, &shown)?;
                nix::sys::stat::fchmodat(&parent, cname.as_c_str(), mode, nix::sys::stat::FchmodatFlags::FollowSymlink)
                    .map_err(|e| fail("setting the mode of", e))
            }
            // A sandbox gets its own /dev, and a user namespace cannot make
            // device nodes anyway.
            tar::EntryType::Char | tar::EntryType::Block => Ok(()),
            other => Err(self.bad(&format!("entry {shown:?}"), format!("unsupported tar entry type {other:?}"))),
        }
    }

    /// Applies a whiteout `.wh.<hidden>` in the directory `parents`.
    fn whiteout(&mut self, parents: &[&[u8]], name: &[u8], hidden: &[u8], shown: &str) -> Result<(), OciError> {
        let fail = |doing: &str, e: Errno| OciError::malformed(self.what, format!("{doing} {shown:?}: {e}"));
        if name != OPAQUE && (hidden.is_empty() || hidden == b"." || hidden == b".." || hidden.contains(&b'/')) {
            return Err(self.bad(&format!("whiteout {shown:?}"), "does not name an entry of its directory"));
        }
        let parent = match self.dir(parents, false) {
            Ok(fd) => fd,
            // Nothing below to hide.
            Err(Errno::ENOENT) => return Ok(()),
            Err(e) => return Err(fail("resolving the directory of", e)),
        };
        let mut prefix = parents.join(&b'/');
        if !prefix.is_empty() {
            prefix.push(b'/');
        }
        if name == OPAQUE {
            let dir = nix::dir::Dir::openat(
                &parent,
                ".",
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| fail("listing the directory of", e))?;
            let names: Vec<CString> = dir
                .into_iter()
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_owned())
                .filter(|n| n.as_bytes() != b"." && n.as_bytes() != b"..")
                .collect();
            for n in names {
                let path = [prefix.as_slice(), n.as_bytes()].concat();
                if !self.seen.contains(&path) {
                    remove_at(parent.as_fd(), &n).map_err(|e| fail("removing for", e))?;
                }
            }
            return Ok(());
        }
        if self.seen.contains(&[prefix.as_slice(), hidden].concat()) {
            // This layer's own entry of that name stays: a whiteout hides
            // lower layers only.
            return Ok(());
        }
        remove_at(parent.as_fd(), &cstring(hidden)).map_err(|e| fail("applying", e))
    }

    /// The directory `comps` below the root, resolved inside it; missing
    /// directories are made (owned by root inside, 0755) when `create`.
    fn dir(&self, comps: &[&[u8]], create: bool) -> Result<OwnedFd, Errno> {
        let how = OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
        let path = if comps.is_empty() { b".".to_vec() } else { comps.join(&b'/') };
        let cpath = cstring(&path);
        match openat2(self.root, cpath.as_c_str(), how) {
            Err(Errno::ENOENT) if create && !comps.is_empty() => {
                let (last, above) = comps.split_last().expect("not empty");
                let parent = self.dir(above, true)?;
                match mkdirat(&parent, cstring(last).as_c_str(), Mode::from_bits_truncate(0o755)) {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(e) => return Err(e),
                }
                openat2(self.root, cpath.as_c_str(), how)
            }
            other => other,
        }
    }

    /// Owner, mode and extended attributes of a file or directory just made.
    fn finish_fd<R: Read>(&self, fd: &OwnedFd, entry: &mut tar::Entry<R>, shown: &str) -> Result<(), OciError> {
        let header = entry.header();
        let (uid, gid) = ids(header).map_err(|e| self.bad("reading an owner", e))?;
        fchown(fd, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)))
            .map_err(|e| self.owner_error(shown, uid, gid, e))?;
        // After the owner: chown clears setuid and setgid.
        let mode = header.mode().map_err(|e| self.bad("reading a mode", e))? & 0o7777;
        fchmod(fd, Mode::from_bits_truncate(mode))
            .map_err(|e| self.bad(&format!("setting the mode of {shown:?}"), e))?;
        if let Ok(Some(pax)) = entry.pax_extensions() {
            for ext in pax.flatten() {
                let Some(name) = ext.key_bytes().strip_prefix(b"SCHILY.xattr.") else { continue };
                // overlayfs's own markers would change how the sandbox's
                // overlay reads this tree.
                if name.starts_with(b"trusted.overlay.") || name.starts_with(b"user.overlay.") {
                    continue;
                }
                set_xattr(fd.as_fd(), name, ext.value_bytes());
            }
        }
        Ok(())
    }

    fn chown_at<R: Read>(
        &self,
        parent: &OwnedFd,
        name: &CStr,
        entry: &tar::Entry<R>,
        shown: &str,
    ) -> Result<(), OciError> {
        let (uid, gid) = ids(entry.header()).map_err(|e| self.bad("reading an owner", e))?;
        fchownat(parent, name, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)), AtFlags::AT_SYMLINK_NOFOLLOW)
            .map_err(|e| self.owner_error(shown, uid, gid, e))
    }

    fn owner_error(&self, shown: &str, uid: u32, gid: u32, e: Errno) -> OciError {
        let why = if e == Errno::EINVAL {
            format!("{shown:?} is owned by {uid}:{gid}, outside the sandbox's id map")
        } else {
            format!("setting the owner of {shown:?} to {uid}:{gid}: {e}")
        };
        OciError::malformed(self.what, why)
    }
}

/// The numeric owner an entry records (names are ignored: they would be
/// looked up on the host).
fn ids(header: &tar::Header) -> std::io::Result<(u32, u32)> {
    let uid = u32::try_from(header.uid()?).map_err(std::io::Error::other)?;
    let gid = u32::try_from(header.gid()?).map_err(std::io::Error::other)?;
    Ok((uid, gid))
}

/// Sets an extended attribute where the kernel allows it; one it refuses
/// (`trusted.*` in a user namespace, a filesystem without xattrs) is
/// dropped, as container runtimes do.
fn set_xattr(fd: BorrowedFd, name: &[u8], value: &[u8]) {
    let name = cstring(name);
    // SAFETY: a valid descriptor, a NUL-terminated name and a buffer of the given length.
    unsafe {
        libc::fsetxattr(std::os::fd::AsRawFd::as_raw_fd(&fd), name.as_ptr(), value.as_ptr().cast(), value.len(), 0);
    }
}

/// The components of an entry's path, without `.` and empty ones. An
/// absolute path or a `..` is refused: no layer a builder wrote has one.
pub(super) fn components(raw: &[u8]) -> Result<Vec<&[u8]>, &'static str> {
    if raw.first() == Some(&b'/') {
        return Err("is an absolute path");
    }
    if raw.contains(&0) {
        return Err("contains a NUL byte");
    }
    let mut out = Vec::new();
    for c in raw.split(|&b| b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => return Err("climbs out with `..`"),
            c => out.push(c),
        }
    }
    Ok(out)
}

/// A C string of bytes already checked to hold no NUL.
fn cstring(bytes: &[u8]) -> CString {
    CString::new(bytes).unwrap_or_default()
}

/// Removes `name` in `dir` (a whole tree if it is a directory), never
/// following a symlink; a missing entry is fine.
fn remove_at(dir: BorrowedFd, name: &CStr) -> Result<(), Errno> {
    match unlinkat(dir, name, UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => return Ok(()),
        Err(Errno::EISDIR) => {}
        Err(e) => return Err(e),
    }
    let sub = nix::dir::Dir::openat(
        dir,
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let names: Vec<CString> = sub
        .into_iter()
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_owned())
        .filter(|n| n.as_bytes() != b"." && n.as_bytes() != b"..")
        .collect();
    let subfd =
        openat(dir, name, OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::empty())?;
    for n in names {
        remove_at(subfd.as_fd(), &n)?;
    }
    unlinkat(dir, name, UnlinkatFlags::RemoveDir)
}

#[cfg(test)]
#[path = "layers_tests.rs"]
pub(crate) mod tests;
