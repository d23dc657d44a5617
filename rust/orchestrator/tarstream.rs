//! Tar archives as streams of chunks, built and read on blocking threads so
//! large trees never sit in memory and never stall the async runtime. Used
//! for everything that moves files between host and sandbox.
use std::{
    io::{self, Read, Write},
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
};

use tokio::sync::mpsc;

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
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
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

/// Append `rels` under `root` to `b`. Symlinks are archived as symlinks and
/// never followed; entries are owned by root; paths that vanish or cannot be
/// opened are skipped (a later event brings them).
pub fn append_all<W: Write>(
    b: &mut tar::Builder<W>,
    root: &Path,
    rels: &[PathBuf],
    ignored: &dyn Fn(&Path, Option<bool>) -> bool,
) -> io::Result<()> {
    for rel in rels {
        append_tree(b, root, rel, ignored)?;
    }
    Ok(())
}

fn header_for(meta: &std::fs::Metadata, kind: tar::EntryType) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_metadata_in_mode(meta, tar::HeaderMode::Complete);
    h.set_uid(0);
    h.set_gid(0);
    h.set_entry_type(kind);
    if kind != tar::EntryType::Regular {
        h.set_size(0);
    }
    h
}

fn skip(path: &Path, e: &io::Error) {
    if e.kind() != io::ErrorKind::NotFound {
        tracing::warn!("archive: skipping {}: {e}", path.display());
    }
}

fn append_tree<W: Write>(
    b: &mut tar::Builder<W>,
    root: &Path,
    rel: &Path,
    ignored: &dyn Fn(&Path, Option<bool>) -> bool,
) -> io::Result<()> {
    let abs = root.join(rel);
    let meta = match std::fs::symlink_metadata(&abs) {
        Ok(m) => m,
        Err(e) => {
            skip(&abs, &e);
            return Ok(());
        }
    };
    let ft = meta.file_type();
    if ft.is_dir() {
        if !rel.as_os_str().is_empty() {
            b.append_data(&mut header_for(&meta, tar::EntryType::Directory), rel, io::empty())?;
        }
        let entries = match std::fs::read_dir(&abs) {
            Ok(e) => e,
            Err(e) => {
                skip(&abs, &e);
                return Ok(());
            }
        };
        for entry in entries.flatten() {
            let child = rel.join(entry.file_name());
            let is_dir = entry.file_type().map(|t| t.is_dir()).unwrap_or(false);
            if !ignored(&child, Some(is_dir)) {
                append_tree(b, root, &child, ignored)?;
            }
        }
    } else if ft.is_symlink() {
        match std::fs::read_link(&abs) {
            Ok(target) => b.append_link(&mut header_for(&meta, tar::EntryType::Symlink), rel, target)?,
            Err(e) => skip(&abs, &e),
        }
    } else if ft.is_file() {
        append_file(b, &abs, rel)?;
    }
    Ok(())
}

/// Append the regular file `abs` under the archive name `name`, owned by
/// root. Vanished or unreadable files are skipped with a warning.
pub fn append_file<W: Write>(b: &mut tar::Builder<W>, abs: &Path, name: &Path) -> io::Result<()> {
    // O_NOFOLLOW: the file may have been swapped for a symlink since the lstat.
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(abs);
    let (file, meta) = match file.and_then(|f| f.metadata().map(|m| (f, m))) {
        Ok(fm) => fm,
        Err(e) => {
            skip(abs, &e);
            return Ok(());
        }
    };
    // Exactly `size` bytes whatever happens to the file meanwhile: a file
    // growing or shrinking mid-read must not corrupt the stream.
    let size = meta.len();
    let data = file.take(size).chain(io::repeat(0)).take(size);
    b.append_data(&mut header_for(&meta, tar::EntryType::Regular), name, data)
}
