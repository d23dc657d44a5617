//! The helper's side of the agent requests other than Exec: tar copies in
//! and out of the VM, and its background processes. One agent connection
//! per request; the agent's `Fail` frames become [`HelperError::Guest`].
use std::path::Path;

use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

use super::error::HelperError;
use crate::agent::protocol::{BackgroundReply, BackgroundRequest, Frame, FrameReader, write_frame};

async fn connect(socket: &Path, first: &Frame) -> Result<(FrameReader<OwnedReadHalf>, OwnedWriteHalf), HelperError> {
    let stream = UnixStream::connect(socket)
        .await
        .map_err(|e| HelperError::io(format!("connect to the vm agent at {}", socket.display()), e))?;
    let (rd, mut wr) = stream.into_split();
    write_frame(&mut wr, first).await?;
    Ok((FrameReader::new(rd), wr))
}

fn unexpected(what: &str, frame: Option<Frame>) -> HelperError {
    let got = match frame {
        Some(Frame::Fail { kind, message }) => return HelperError::Guest { kind, message },
        Some(f) => format!("{f:?}"),
        None => "the end of the connection".into(),
    };
    HelperError::io("agent protocol", std::io::Error::other(format!("expected {what}, got {got}")))
}

/// A copy-in under way: feed it tar chunks, then [`finish`](Self::finish).
pub struct CopyIn {
    rd: FrameReader<OwnedReadHalf>,
    wr: OwnedWriteHalf,
}

/// Regular files and content bytes a copy-in wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Copied {
    /// Regular files.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
}

impl CopyIn {
    /// Starts extracting into `dest_dir` in the VM whose agent is at `socket`.
    pub async fn start(socket: &Path, dest_dir: String) -> Result<Self, HelperError> {
        let (rd, wr) = connect(socket, &Frame::CopyIn(dest_dir)).await?;
        Ok(CopyIn { rd, wr })
    }

    /// Sends the next chunk. A failure here usually means the agent
    /// stopped early; [`outcome`](Self::outcome) then says why.
    pub async fn send(&mut self, chunk: Vec<u8>) -> Result<(), HelperError> {
        write_frame(&mut self.wr, &Frame::Data(chunk)).await?;
        Ok(())
    }

    /// The agent's answer. Cancel-safe, so it can wait next to the client's
    /// stream and catch an early rejection.
    pub async fn outcome(&mut self) -> Result<Copied, HelperError> {
        match self.rd.next().await? {
            Some(Frame::Copied { files, bytes }) => Ok(Copied { files, bytes }),
            other => Err(unexpected("copied", other)),
        }
    }

    /// Ends the tar stream and waits for the extraction to finish.
    pub async fn finish(mut self) -> Result<Copied, HelperError> {
        // If the agent already gave up, its reason is waiting to be read.
        let _ = write_frame(&mut self.wr, &Frame::End).await;
        self.outcome().await
    }
}

/// A copy-out's tar stream.
pub struct CopyOut {
    rd: FrameReader<OwnedReadHalf>,
    /// Kept open: closing it would tell the agent to stop.
    _wr: OwnedWriteHalf,
    first: Option<Vec<u8>>,
}

impl CopyOut {
    /// Asks for `path` and waits for the first chunk, so a missing path is
    /// an error here and not in the middle of a stream.
    pub async fn start(socket: &Path, path: String) -> Result<Self, HelperError> {
        let (mut rd, wr) = connect(socket, &Frame::CopyOut(path)).await?;
        let first = match rd.next().await? {
            Some(Frame::Data(chunk)) => Some(chunk),
            Some(Frame::End) => None,
            other => return Err(unexpected("data", other)),
        };
        Ok(CopyOut { rd, _wr: wr, first })
    }

    /// The next chunk; `None` once the archive is complete.
    pub async fn next(&mut self) -> Result<Option<Vec<u8>>, HelperError> {
        if let Some(chunk) = self.first.take() {
            return Ok(Some(chunk));
        }
        match self.rd.next().await? {
            Some(Frame::Data(chunk)) => Ok(Some(chunk)),
            Some(Frame::End) => Ok(None),
            other => Err(unexpected("data", other)),
        }
    }
}

/// Sends one background-process request; the output comes with log and
/// stop requests.
pub async fn background(socket: &Path, req: BackgroundRequest) -> Result<(BackgroundReply, Vec<u8>), HelperError> {
    let with_output = matches!(req, BackgroundRequest::Log { .. } | BackgroundRequest::Stop { .. });
    let (mut rd, _wr) = connect(socket, &Frame::Background(req)).await?;
    let reply = match rd.next().await? {
        Some(Frame::BackgroundReply(reply)) => reply,
        other => return Err(unexpected("a background reply", other)),
    };
    let output = if with_output {
        match rd.next().await? {
            Some(Frame::Stdout(output)) => output,
            other => return Err(unexpected("output", other)),
        }
    } else {
        Vec::new()
    };
    Ok((reply, output))
}
