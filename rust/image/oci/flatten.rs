//! Flattening an image's stacked layer directories into one OCI layer, in
//! the confined child (see [`super::confined`]): as root of the sandbox's
//! id map, so every file is readable and its owner reads as the id inside.
//!
//! The layers are overlayfs layers: the base image's tree and committed
//! writable layers, whose whiteouts are 0:0 character devices and whose
//! opaque directories carry `trusted.overlay.opaque` or `user.overlay.opaque`
//! = "y". The merged view is what the tar holds, so no whiteout is needed.
//! Every entry is reached through its parent's descriptor with `O_NOFOLLOW`:
//! a symlink in an image is recorded, never followed.
use std::collections::{BTreeMap, HashMap};
use std::ffi::{CStr, CString, OsStr};
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use nix::fcntl::{AtFlags, OFlag, openat, readlinkat};
use nix::sys::stat::{FileStat, Mode, SFlag, fstatat};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use super::OciError;

/// Deepest directory nesting exported (two descriptors per level).
const MAX_DEPTH: usize = 4096;

/// The layer written: digests of the tar and of its gzip, and the size of the latter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct FlatLayer {
    /// `sha256:` of the uncompressed tar.
    pub diff_id: String,
    /// `sha256:` of the tar.gz.
    pub digest: String,
    /// Bytes of the tar.gz.
    pub size: u64,
}

/// Hashes and counts what passes through it.
struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    count: u64,
}

impl<W: Write> HashingWriter<W> {
    fn new(inner: W) -> Self {
        Self { inner, hasher: Sha256::new(), count: 0 }
    }

    fn finish(self) -> (W, String, u64) {
        let hex: String = self.hasher.finalize().iter().map(|b| format!("{b:02x}")).collect();
        (self.inner, format!("sha256:{hex}"), self.count)
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

type TarOut = tar::Builder<HashingWriter<flate2::write::GzEncoder<HashingWriter<File>>>>;

/// Writes the merged view of `layers` (bottom first) to `out` as a tar.gz.
pub(super) fn flatten(layers: &[OwnedFd], out: File) -> Result<FlatLayer, OciError> {
    let gz = flate2::write::GzEncoder::new(HashingWriter::new(out), flate2::Compression::default());
    let mut walker = Walker { tar: tar::Builder::new(HashingWriter::new(gz)), links: HashMap::new() };
    walker.tar.mode(tar::HeaderMode::Complete);
    let tops = layers
        .iter()
        .rev()
        .map(|l| reopen_dir(l.as_fd(), c".").map_err(|e| fail("opening a layer", e)))
        .collect::<Result<Vec<_>, _>>()?;
    walker.walk(&tops, "", 0)?;
    let hashed = walker.tar.into_inner().map_err(|e| OciError::io("finishing the layer's tar", e))?;
    let (gz, diff_id, _) = hashed.finish();
    let compressed = gz.finish().map_err(|e| OciError::io("finishing the layer's gzip", e))?;
    let (file, digest, size) = compressed.finish();
    file.sync_all().map_err(|e| OciError::io("syncing the layer", e))?;
    Ok(FlatLayer { diff_id, digest, size })
}

fn fail(doing: &str, e: impl std::fmt::Display) -> OciError {
    OciError::malformed("exporting the image's files", format!("{doing}: {e}"))
}

fn reopen_dir(dir: BorrowedFd, name: &CStr) -> nix::Result<OwnedFd> {
    openat(dir, name, OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::empty())
}

fn kind(st: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(st.st_mode & libc::S_IFMT)
}

fn is_whiteout(st: &FileStat) -> bool {
    kind(st) == SFlag::S_IFCHR && st.st_rdev == 0
}

/// Whether overlayfs treats `dir` as opaque (it hides lower layers).
fn is_opaque(dir: BorrowedFd) -> bool {
    [c"trusted.overlay.opaque", c"user.overlay.opaque"].iter().any(|name| {
        let mut buf = [0u8; 4];
        // SAFETY: a valid descriptor, a NUL-terminated name and a buffer of its length.
        let n = unsafe { libc::fgetxattr(dir.as_raw_fd(), name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        n == 1 && buf[0] == b'y'
    })
}

struct Walker {
    tar: TarOut,
    /// Hard-linked inodes already written, by (device, inode): later names
    /// become hard links to the first.
    links: HashMap<(u64, u64), String>,
}

impl Walker {
    /// Writes the merged directory whose layers (top first, down to the
    /// first opaque one) are `dirs`, at `rel` in the tar.
    fn walk(&mut self, dirs: &[OwnedFd], rel: &str, depth: usize) -> Result<(), OciError> {
        if depth > MAX_DEPTH {
            return Err(fail(rel, format!("nested deeper than {MAX_DEPTH} directories")));
        }
        // Each name's topmost layer among `dirs`.
        let mut names: BTreeMap<CString, usize> = BTreeMap::new();
        for (i, d) in dirs.iter().enumerate() {
            let listing =
                nix::dir::Dir::openat(d, c".", OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
                    .map_err(|e| fail(&format!("listing /{rel}"), e))?;
            for entry in listing.into_iter().filter_map(Result::ok) {
                let name = entry.file_name();
                if name.to_bytes() != b"." && name.to_bytes() != b".." {
                    names.entry(name.to_owned()).or_insert(i);
                }
            }
        }
        for (name, top) in names {
            let path = format!("{rel}{}", OsStr::from_bytes(name.to_bytes()).to_string_lossy());
            let shown = format!("/{path}");
            let st = fstatat(&dirs[top], name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
                .map_err(|e| fail(&format!("reading {shown}"), e))?;
            if is_whiteout(&st) {
                continue;
            }
            if kind(&st) == SFlag::S_IFDIR {
                let mut below = Vec::new();
                for d in &dirs[top..] {
                    match fstatat(d, name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
                        Ok(s) if kind(&s) == SFlag::S_IFDIR => {
                            let fd = reopen_dir(d.as_fd(), &name).map_err(|e| fail(&format!("opening {shown}"), e))?;
                            let opaque = is_opaque(fd.as_fd());
                            below.push(fd);
                            if opaque {
                                break;
                            }
                        }
                        // A file or whiteout hides every lower layer's entry.
                        Ok(_) => break,
                        Err(_) => {}
                    }
                }
                self.append(&st, &format!("{path}/"), tar::EntryType::Directory, &mut std::io::empty())?;
                self.walk(&below, &format!("{path}/"), depth + 1)?;
                continue;
            }
            self.file(dirs[top].as_fd(), &name, &st, &path)?;
        }
        Ok(())
    }

    /// Writes one non-directory entry.
    fn file(&mut self, dir: BorrowedFd, name: &CStr, st: &FileStat, path: &str) -> Result<(), OciError> {
        let shown = format!("/{path}");
        let key = (st.st_dev, st.st_ino);
        if st.st_nlink > 1
            && let Some(first) = self.links.get(&key)
        {
            let mut h = header(st, tar::EntryType::Link);
            h.set_size(0);
            let first = first.clone();
            return self.tar.append_link(&mut h, path, &first).map_err(|e| fail(&format!("writing {shown}"), e));
        }
        match kind(st) {
            SFlag::S_IFREG => {
                let fd = openat(
                    dir,
                    name,
                    OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|e| fail(&format!("opening {shown}"), e))?;
                let mut file = File::from(fd);
                self.append(st, path, tar::EntryType::Regular, &mut file)?;
            }
            SFlag::S_IFLNK => {
                let target = readlinkat(dir, name).map_err(|e| fail(&format!("reading the symlink {shown}"), e))?;
                let mut h = header(st, tar::EntryType::Symlink);
                h.set_size(0);
                self.tar
                    .append_link(&mut h, path, std::path::Path::new(&target))
                    .map_err(|e| fail(&format!("writing {shown}"), e))?;
            }
            SFlag::S_IFIFO => self.append(st, path, tar::EntryType::Fifo, &mut std::io::empty())?,
            // Device nodes and sockets: a sandbox gets its own /dev, and an
            // unpack skips them anyway.
            _ => return Ok(()),
        }
        if st.st_nlink > 1 {
            self.links.insert(key, path.to_string());
        }
        Ok(())
    }

    fn append(
        &mut self,
        st: &FileStat,
        path: &str,
        kind: tar::EntryType,
        data: &mut dyn std::io::Read,
    ) -> Result<(), OciError> {
        let mut h = header(st, kind);
        h.set_size(if kind == tar::EntryType::Regular { st.st_size as u64 } else { 0 });
        self.tar.append_data(&mut h, path, data).map_err(|e| fail(&format!("writing /{path}"), e))
    }
}

/// A header with `st`'s owner (the ids inside: we run in the namespace),
/// mode and modification time.
fn header(st: &FileStat, kind: tar::EntryType) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_uid(u64::from(st.st_uid));
    h.set_gid(u64::from(st.st_gid));
    h.set_mode(st.st_mode & 0o7777);
    h.set_mtime(u64::try_from(st.st_mtime).unwrap_or(0));
    h
}
