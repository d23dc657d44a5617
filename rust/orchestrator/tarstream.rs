//! Tar archives as streams of chunks, built and read on blocking threads so
//! large trees never sit in memory and never stall the async runtime. Used
//! for everything that moves files between host and sandbox.
use std::io::{self, Read, Write};

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
        self.tx
            .blocking_send(chunk)
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the receiver went away"))
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

/// Build a tar archive on a blocking thread with `fill`; returns the chunk
/// receiver and a handle yielding `fill`'s result and the archive size.
pub fn build<T, F>(
    fill: F,
) -> (
    mpsc::Receiver<Vec<u8>>,
    tokio::task::JoinHandle<io::Result<(T, u64)>>,
)
where
    T: Send + 'static,
    F: FnOnce(&mut tar::Builder<&mut ChunkWriter>) -> io::Result<T> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(8);
    let handle = tokio::task::spawn_blocking(move || {
        let mut writer = ChunkWriter {
            buf: Vec::with_capacity(CHUNK),
            tx,
            written: 0,
        };
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
        Self {
            rx,
            current: Vec::new(),
            pos: 0,
        }
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
