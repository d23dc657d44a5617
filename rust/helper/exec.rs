//! The helper's side of one Exec: a connection to the VM's agent, started
//! with a process spec, then split into an input sink and an output stream.
//!
//! Dropping both halves closes the connection, which makes the agent kill
//! the process group if it has not exited yet: that is how a vanished gRPC
//! client takes its process down with it.
use std::path::Path;

use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

use super::error::HelperError;
use crate::agent::protocol::{ExitStatus, Frame, FrameReader, StartSpec, write_frame};

/// Client → process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecInput {
    /// Bytes for stdin.
    Stdin(Vec<u8>),
    /// End of stdin.
    CloseStdin,
    /// A signal, to the group if `group`.
    Signal {
        /// Signal number.
        signal: i32,
        /// Whole process group.
        group: bool,
    },
}

/// Process → client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecOutput {
    /// stdout bytes.
    Stdout(Vec<u8>),
    /// stderr bytes.
    Stderr(Vec<u8>),
    /// The process is gone; nothing follows.
    Exited(ExitStatus),
}

/// Sends input to a running process.
pub struct ExecSink {
    wr: OwnedWriteHalf,
}

/// Receives a process's output.
pub struct ExecSource {
    rd: FrameReader<OwnedReadHalf>,
}

/// Connects to the agent and starts the process. Returns its pid (inside the
/// VM) once it runs; a process that cannot start is `ExecRejected`.
pub async fn start(socket: &Path, spec: StartSpec) -> Result<(i32, ExecSink, ExecSource), HelperError> {
    let stream = UnixStream::connect(socket)
        .await
        .map_err(|e| HelperError::io(format!("connect to the vm agent at {}", socket.display()), e))?;
    let (rd, mut wr) = stream.into_split();
    write_frame(&mut wr, &Frame::Start(spec)).await?;
    let mut rd = FrameReader::new(rd);
    match rd.next().await? {
        Some(Frame::Started(pid)) => Ok((pid, ExecSink { wr }, ExecSource { rd })),
        Some(Frame::Error(msg)) => Err(HelperError::ExecRejected(msg)),
        Some(other) => Err(HelperError::Io {
            what: "agent protocol".into(),
            source: std::io::Error::other(format!("expected started, got {other:?}")),
        }),
        None => Err(HelperError::Io {
            what: "agent protocol".into(),
            source: std::io::Error::other("the agent closed the connection before the process started"),
        }),
    }
}

impl ExecSink {
    /// Forwards one input message.
    pub async fn send(&mut self, input: ExecInput) -> Result<(), HelperError> {
        let frame = match input {
            ExecInput::Stdin(b) => Frame::Stdin(b),
            ExecInput::CloseStdin => Frame::CloseStdin,
            ExecInput::Signal { signal, group } => Frame::Signal { signal, group },
        };
        write_frame(&mut self.wr, &frame).await?;
        Ok(())
    }
}

impl ExecSource {
    /// The next output; `None` means the agent hung up without an exit
    /// status. Cancel-safe.
    pub async fn next(&mut self) -> Result<Option<ExecOutput>, HelperError> {
        loop {
            return Ok(match self.rd.next().await? {
                Some(Frame::Stdout(b)) => Some(ExecOutput::Stdout(b)),
                Some(Frame::Stderr(b)) => Some(ExecOutput::Stderr(b)),
                Some(Frame::Exited(st)) => Some(ExecOutput::Exited(st)),
                Some(_) => continue,
                None => None,
            });
        }
    }
}
