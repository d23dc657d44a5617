//! CopyIn and CopyOut inside the VM: tar streams extracted or built by the
//! agent, which has the VM's mount namespace and root-in-userns ownership.
//!
//! The tar crate is synchronous, so each copy runs on a blocking thread fed
//! (or drained) through a small bounded channel of chunks: memory stays
//! bounded whatever the tree's size, and a slow peer slows the walk down.
use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};

use tokio::sync::mpsc;

use super::AgentError;

/// Size of the chunks CopyOut sends.
pub const CHUNK: usize = 256 * 1024;
/// Chunks in flight between the async side and the tar thread.
const IN_FLIGHT: usize = 8;

/// What a copy-in wrote.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Copied {
    /// Regular files.
    pub files: u64,
    /// Bytes of their content.
    pub bytes: u64,
}

/// Feeds a copy-in's tar stream; [`Extraction::finish`] returns the result.
pub struct Extraction {
    chunks: mpsc::Sender<Vec<u8>>,
    worker: tokio::task::JoinHandle<Result<Copied, AgentError>>,
}

/// Starts extracting into `dest` (absolute, created if missing).
pub fn extract(dest: &str) -> Result<Extraction, AgentError> {
    let dest = absolute("dest_dir", dest)?;
    std::fs::create_dir_all(&dest)
        .map_err(|e| AgentError::Rejected(format!("dest_dir: cannot create {}: {e}", dest.display())))?;
    let dest = dest.canonicalize().map_err(|e| io(format!("resolve {}", dest.display()), e))?;
    let (chunks, rx) = mpsc::channel(IN_FLIGHT);
    let worker = tokio::task::spawn_blocking(move || unpack(&dest, ChunkReader::new(rx)));
    Ok(Extraction { chunks, worker })
}

impl Extraction {
    /// Hands over the next chunk; `false` once extraction has stopped
    /// (failed), in which case [`finish`](Self::finish) says why.
    pub async fn feed(&self, chunk: Vec<u8>) -> bool {
        self.chunks.send(chunk).await.is_ok()
    }

    /// Ends the stream and waits for the extraction.
    pub async fn finish(self) -> Result<Copied, AgentError> {
        drop(self.chunks);
        self.worker.await.map_err(|e| io("copy-in thread", std::io::Error::other(e)))?
    }
}

fn unpack(dest: &Path, stream: ChunkReader) -> Result<Copied, AgentError> {
    let mut archive = tar::Archive::new(stream);
    archive.set_preserve_permissions(true);
    archive.set_preserve_ownerships(true);
    archive.set_overwrite(true);
    let mut copied = Copied::default();
    // A stream the tar reader cannot parse is the client's mistake.
    let malformed = |e: std::io::Error| AgentError::Rejected(format!("tar stream: {e}"));
    let entries = archive.entries().map_err(malformed)?;
    for entry in entries {
        let mut entry = entry.map_err(malformed)?;
        let path = entry.path().map_err(|e| io("read tar entry name", e))?.into_owned();
        check_inside(dest, &path)?;
        if let Ok(Some(link)) = entry.link_name()
            && entry.header().entry_type().is_hard_link()
        {
            check_inside(dest, &link)?;
        }
        let regular = entry.header().entry_type().is_file();
        let size = entry.size();
        let failed = |e| io(format!("cannot write {}", dest.join(&path).display()), root_cause(e));
        if regular {
            unpack_file(&mut entry, dest, &path).map_err(failed)?;
        } else {
            entry.unpack_in(dest).map_err(failed)?;
        }
        if regular {
            copied.files += 1;
            copied.bytes += size;
        }
    }
    Ok(copied)
}

/// Distinguishes the temp names of concurrent copy-ins in one agent.
static TEMP_SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Extract a regular file (its name already checked) under a temp name
/// beside it, then rename it into place. The tar crate's own overwrite
/// (remove, then create exclusively) fails with EEXIST when two copy-ins
/// write the same path at once; a rename replaces atomically, and readers
/// see the old file or the whole new one, never a part.
fn unpack_file<R: Read>(entry: &mut tar::Entry<'_, R>, dest: &Path, name: &Path) -> std::io::Result<()> {
    let target = dest.join(name);
    let Some(dir) = target.parent() else {
        return Err(std::io::Error::other("a file entry needs a file name"));
    };
    std::fs::create_dir_all(dir)?;
    let seq = TEMP_SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    // Short whatever the file's name, so it never exceeds NAME_MAX.
    let tmp = dir.join(format!(".copy-in-{}-{seq}.tmp", std::process::id()));
    let placed = entry.unpack(&tmp).and_then(|_| std::fs::rename(&tmp, &target));
    if placed.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    placed
}

/// Rejects names that leave `dest`: absolute, `..`, or through a symlink
/// (already there or made by an earlier entry) that points outside.
fn check_inside(dest: &Path, name: &Path) -> Result<(), AgentError> {
    let escapes = || AgentError::Rejected(format!("tar entry {} escapes the destination directory", name.display()));
    let mut target = dest.to_path_buf();
    for part in name.components() {
        match part {
            Component::Normal(p) => target.push(p),
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) | Component::ParentDir => {
                return Err(escapes());
            }
        }
    }
    let mut existing = target.parent().unwrap_or(dest);
    while !existing.exists() {
        existing = existing.parent().unwrap_or(dest);
    }
    match existing.canonicalize() {
        Ok(real) if real.starts_with(dest) => Ok(()),
        Ok(_) => Err(escapes()),
        Err(e) => Err(io(format!("resolve {}", existing.display()), e)),
    }
}

/// A copy-out under way.
pub struct Archiving {
    /// The tar stream, in [`CHUNK`]-sized pieces; closes when the walk ends.
    pub chunks: mpsc::Receiver<Vec<u8>>,
    /// How the walk ended.
    pub worker: tokio::task::JoinHandle<Result<(), AgentError>>,
}

/// Starts archiving `path`. Missing → NotFound.
pub fn archive(path: &str) -> Result<Archiving, AgentError> {
    let path = absolute("path", path)?;
    let meta = std::fs::symlink_metadata(&path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => AgentError::NotFound(format!("{} does not exist in the vm", path.display())),
        _ => io(format!("stat {}", path.display()), e),
    })?;
    let (tx, rx) = mpsc::channel(IN_FLIGHT);
    let worker = tokio::task::spawn_blocking(move || {
        let mut builder = tar::Builder::new(ChunkWriter::new(tx));
        builder.follow_symlinks(false);
        let walked = if meta.is_dir() {
            builder.append_dir_all("", &path)
        } else {
            let name = path.file_name().map(PathBuf::from).unwrap_or_default();
            builder.append_path_with_name(&path, name)
        };
        walked
            .and_then(|()| builder.into_inner())
            .and_then(|mut w| w.flush())
            .map_err(|e| io(format!("archive {}", path.display()), e))
    });
    Ok(Archiving { chunks: rx, worker })
}

fn absolute(field: &str, path: &str) -> Result<PathBuf, AgentError> {
    let p = PathBuf::from(path);
    if p.is_absolute() {
        Ok(p)
    } else {
        Err(AgentError::Rejected(format!("{field}: {path:?} must be an absolute path")))
    }
}

/// The tar crate wraps the OS error and only displays its own context;
/// the cause is what tells the client what went wrong.
/// The innermost cause of an unpack error ("Is a directory (os error 21)"):
/// the tar crate wraps it in messages that repeat the entry's name, once as
/// cut to the 100 bytes of the tar header, which only hid the real path.
fn root_cause(e: std::io::Error) -> std::io::Error {
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(&e);
    while let Some(c) = cause {
        text = c.to_string();
        cause = c.source();
    }
    std::io::Error::new(e.kind(), text)
}

fn io(what: impl Into<String>, source: std::io::Error) -> AgentError {
    AgentError::Io { what: what.into(), source }
}

/// `Read` over chunks from the async side; EOF when the sender is gone.
struct ChunkReader {
    rx: mpsc::Receiver<Vec<u8>>,
    chunk: Vec<u8>,
    at: usize,
}

impl ChunkReader {
    fn new(rx: mpsc::Receiver<Vec<u8>>) -> Self {
        Self { rx, chunk: Vec::new(), at: 0 }
    }
}

impl Read for ChunkReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.at == self.chunk.len() {
            match self.rx.blocking_recv() {
                Some(c) => (self.chunk, self.at) = (c, 0),
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.chunk.len() - self.at);
        buf[..n].copy_from_slice(&self.chunk[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// `Write` that batches the tar stream into [`CHUNK`]-sized messages.
struct ChunkWriter {
    tx: mpsc::Sender<Vec<u8>>,
    buf: Vec<u8>,
}

impl ChunkWriter {
    fn new(tx: mpsc::Sender<Vec<u8>>) -> Self {
        Self { tx, buf: Vec::with_capacity(CHUNK) }
    }

    fn send(&mut self) -> std::io::Result<()> {
        let full = std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK));
        self.tx
            .blocking_send(full)
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the helper hung up"))
    }
}

impl Write for ChunkWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let n = data.len().min(CHUNK - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == CHUNK {
            self.send()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() { Ok(()) } else { self.send() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_leaving_the_destination_are_rejected() {
        let dir = std::env::temp_dir().join(format!("agent-copy-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        let _ = std::fs::remove_file(dir.join("out"));
        std::os::unix::fs::symlink("/", dir.join("out")).unwrap();
        let dest = dir.canonicalize().unwrap();
        for ok in ["a", "sub/b", "./c", "new/deeper/d"] {
            assert!(check_inside(&dest, Path::new(ok)).is_ok(), "{ok}");
        }
        for bad in ["/etc/passwd", "../x", "sub/../../x", "out/etc/passwd"] {
            assert!(matches!(check_inside(&dest, Path::new(bad)), Err(AgentError::Rejected(_))), "{bad}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
