//! Tar archives as streams of chunks, built and read on blocking threads so
//! large trees never sit in memory and never stall the async runtime. Used
//! for everything that moves files between host and sandbox.
use std::{
    ffi::OsStr,
    fs::File,
    io::{self, Read, Write},
    path::{Path, PathBuf},
};

use tokio::sync::mpsc;

use super::hostfs::{Dir, HostFsError, Kind, Stat};

/// Chunk size handed to the helper.
const CHUNK: usize = 256 * 1024;

/// A `Write` that cuts what it is given into chunks for an mpsc channel.
pub struct ChunkWriter {
    buf: Vec<u8>,
    tx: mpsc::Sender<Vec<u8>>,
    /// Bytes written so far.
    pub written: u64,
}

impl ChunkWriter {
    fn send(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK));
        self.tx.blocking_send(chunk).map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the receiver went away"))
    }
}

impl Write for ChunkWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(data);
        self.written += data.len() as u64;
        if self.buf.len() >= CHUNK {
            self.send()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.send()
    }
}

/// An in-memory tar of small regular files given by absolute path (stored
/// relative to `/`), root-owned, all with `mode`: for writes that fit one
/// CopyIn chunk (file tools, COPY steps, installing sandbox-ctl).
pub fn files_archive<'a>(files: impl IntoIterator<Item = (&'a str, &'a [u8])>, mode: u32) -> io::Result<Vec<u8>> {
    let now = sandbox_base::clock::unix_secs();
    let mut b = tar::Builder::new(Vec::new());
    for (path, data) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(now);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, path.trim_start_matches('/'), data)?;
    }
    b.into_inner()
}

/// The running build of an archive: `fill`'s result and the archive size.
pub type Building<T> = tokio::task::JoinHandle<io::Result<(T, u64)>>;

/// Build a tar archive on a blocking thread with `fill`; returns the chunk
/// receiver and a handle yielding `fill`'s result and the archive size.
pub fn build<T, F>(fill: F) -> (mpsc::Receiver<Vec<u8>>, Building<T>)
where
    T: Send + 'static,
    F: FnOnce(&mut tar::Builder<&mut ChunkWriter>) -> io::Result<T> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(8);
    let handle = tokio::task::spawn_blocking(move || {
        let mut writer = ChunkWriter { buf: Vec::with_capacity(CHUNK), tx, written: 0 };
        let value = {
            let mut builder = tar::Builder::new(&mut writer);
            builder.follow_symlinks(false);
            let value = fill(&mut builder)?;
            builder.finish()?;
            value
        };
        writer.flush()?;
        Ok((value, writer.written))
    });
    (rx, handle)
}

/// A `Read` over chunks arriving on a channel (for reading a tar stream on a
/// blocking thread).
pub struct ChunkReader {
    rx: mpsc::Receiver<Vec<u8>>,
    current: Vec<u8>,
    pos: usize,
}

impl ChunkReader {
    /// Read from `rx` until it closes.
    pub fn new(rx: mpsc::Receiver<Vec<u8>>) -> Self {
        Self { rx, current: Vec::new(), pos: 0 }
    }
}

impl Read for ChunkReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.current.len() {
            match self.rx.blocking_recv() {
                Some(chunk) => {
                    self.current = chunk;
                    self.pos = 0;
                }
                None => return Ok(0),
            }
        }
        let n = out.len().min(self.current.len() - self.pos);
        out[..n].copy_from_slice(&self.current[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// Append `rels` (relative paths, the empty path meaning all of it) under
/// the host directory `base` to `b`, walking only through fds
/// ([`hostfs::Dir`]): symlinks are archived as symlinks and never followed,
/// fifos, sockets and devices are left out, entries are owned by root.
/// Paths that vanish or cannot be opened (a symlink swapped in on the way,
/// sandbox-mcp's own directories) are skipped; a later event brings them.
pub fn append_all<W: Write>(
    b: &mut tar::Builder<W>,
    base: &Dir,
    rels: &[PathBuf],
    ignored: &dyn Fn(&Path, Option<bool>) -> bool,
) -> io::Result<()> {
    for rel in rels {
        let (Some(parent), Some(name)) = (rel.parent(), rel.file_name()) else {
            append_contents(b, base, rel, ignored)?;
            continue;
        };
        match base.try_clone().and_then(|d| d.walk(parent)) {
            Ok(dir) => append_entry(b, &dir, name, rel, None, ignored)?,
            Err(e) => skip(&e),
        }
    }
    Ok(())
}

fn header(st: &Stat, kind: tar::EntryType) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_mode(st.mode);
    h.set_mtime(u64::try_from(st.mtime).unwrap_or(0));
    h.set_uid(0);
    h.set_gid(0);
    h.set_entry_type(kind);
    h.set_size(if kind == tar::EntryType::Regular { st.size } else { 0 });
    h
}

fn skip(e: &HostFsError) {
    if !e.is_missing() {
        tracing::warn!("archive: skipping {e}");
    }
}

/// Everything in `dir` (archived under `rel`), not `dir` itself.
fn append_contents<W: Write>(
    b: &mut tar::Builder<W>,
    dir: &Dir,
    rel: &Path,
    ignored: &dyn Fn(&Path, Option<bool>) -> bool,
) -> io::Result<()> {
    let entries = match dir.list() {
        Ok(e) => e,
        Err(e) => {
            skip(&e);
            return Ok(());
        }
    };
    for (name, kind) in entries {
        let child = rel.join(&name);
        append_entry(b, dir, &name, &child, kind, ignored)?;
    }
    Ok(())
}

/// The entry `name` of `parent`, archived as `rel` (with everything under
/// it if it is a directory). `listed` is its type from the listing, if any.
fn append_entry<W: Write>(
    b: &mut tar::Builder<W>,
    parent: &Dir,
    name: &OsStr,
    rel: &Path,
    listed: Option<Kind>,
    ignored: &dyn Fn(&Path, Option<bool>) -> bool,
) -> io::Result<()> {
    let kind = match listed {
        Some(k) => k,
        None => match parent.child(name) {
            Ok(Some(st)) => st.kind,
            Ok(None) => return Ok(()),
            Err(e) => {
                skip(&e);
                return Ok(());
            }
        },
    };
    if ignored(rel, Some(kind == Kind::Dir)) {
        return Ok(());
    }
    match kind {
        Kind::Dir => {
            let dir = match parent.open_dir(name) {
                Ok(d) => d,
                Err(e) => {
                    skip(&e);
                    return Ok(());
                }
            };
            match dir.stat() {
                Ok(st) => {
                    b.append_data(&mut header(&st, tar::EntryType::Directory), rel, io::empty())?;
                    append_contents(b, &dir, rel, ignored)?;
                }
                Err(e) => skip(&e),
            }
        }
        Kind::Symlink => match parent.child(name).and_then(|st| Ok((st, parent.read_link(name)?))) {
            Ok((Some(st), target)) => b.append_link(&mut header(&st, tar::EntryType::Symlink), rel, target)?,
            Ok((None, _)) => {}
            Err(e) => skip(&e),
        },
        Kind::File => match parent.open_file(name) {
            Ok((file, st)) => append_file(b, file, &st, rel)?,
            Err(e) => skip(&e),
        },
        _ => tracing::debug!("archive: leaving out {} ({kind:?})", parent.path().join(name).display()),
    }
    Ok(())
}

/// Append the open regular file `file` (its `fstat` in `st`) under the
/// archive name `name`, owned by root.
pub fn append_file<W: Write>(b: &mut tar::Builder<W>, file: File, st: &Stat, name: &Path) -> io::Result<()> {
    // Exactly `size` bytes whatever happens to the file meanwhile: a file
    // growing or shrinking mid-read must not corrupt the stream.
    let size = st.size;
    let data = file.take(size).chain(io::repeat(0)).take(size);
    b.append_data(&mut header(st, tar::EntryType::Regular), name, data)
}

#[cfg(test)]
mod tests {
    use std::{collections::BTreeMap, sync::Arc};

    use super::*;
    use crate::hostfs::OwnDirs;

    #[test]
    fn walks_by_fd_and_leaves_out_what_it_must() {
        let d = std::env::temp_dir().join(format!("smcp-tarstream-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("root/a")).unwrap();
        std::fs::create_dir_all(d.join("root/own/volumes")).unwrap();
        std::fs::create_dir_all(d.join("outside")).unwrap();
        std::fs::write(d.join("outside/secret"), "secret").unwrap();
        std::fs::write(d.join("root/own/volumes/v"), "volume").unwrap();
        std::fs::write(d.join("root/a/f"), "file").unwrap();
        std::os::unix::fs::symlink(d.join("outside"), d.join("root/a/link")).unwrap();
        nix::unistd::mkfifo(&d.join("root/a/fifo"), nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
        let own = Arc::new(OwnDirs::of([d.join("root/own")]));
        let root = Dir::open_absolute(&d.join("root"), own).unwrap();
        let mut b = tar::Builder::new(Vec::new());
        append_all(&mut b, &root, &[PathBuf::new(), PathBuf::from("a/link/secret")], &|_, _| false).unwrap();
        let out = b.into_inner().unwrap();
        let mut archive = tar::Archive::new(out.as_slice());
        let entries: BTreeMap<String, tar::EntryType> = archive
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (e.path().unwrap().to_string_lossy().trim_end_matches('/').to_string(), e.header().entry_type())
            })
            .collect();
        let want = [
            ("a".to_string(), tar::EntryType::Directory),
            ("a/f".to_string(), tar::EntryType::Regular),
            ("a/link".to_string(), tar::EntryType::Symlink),
        ];
        assert_eq!(entries, BTreeMap::from(want));
        let text = String::from_utf8_lossy(&out);
        assert!(!text.contains("secret") && !text.contains("volume"), "nothing behind the symlink or in own dirs");
        std::fs::remove_dir_all(d).unwrap();
    }
}
