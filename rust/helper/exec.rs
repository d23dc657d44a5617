//! The helper's side of one Exec: a stream on the VM's agent connection,
//! started with a process spec, then split into an input sink and an
//! output source.
//!
//! Dropping both halves cancels the stream, which makes the agent kill the
//! process tree if it has not exited yet: that is how a vanished gRPC
//! client takes its process down with it.
use super::agent_link::{AgentLink, agent_error};
use super::error::HelperError;
use sandbox_agent::mux::{StreamReceiver, StreamSender};
#[cfg(doc)]
use sandbox_agent::protocol::FailKind;
use sandbox_agent::protocol::{ExitStatus, Frame, StartSpec};

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
    tx: StreamSender,
    vm: String,
}

/// Receives a process's output.
pub struct ExecSource {
    rx: StreamReceiver,
    vm: String,
}

/// Starts the process in `vm` through its agent link. Returns its pid
/// (inside the VM) once it runs; a process that cannot start is
/// `ExecRejected`, or `Guest` with [`FailKind::ForkRefused`] when the
/// kernel refused the fork ([`crate::stats::fork_refused`] names
/// the limit).
pub async fn start(vm: &str, link: &AgentLink, spec: StartSpec) -> Result<(i32, ExecSink, ExecSource), HelperError> {
    let stream = link.open(Frame::Start(spec)).await?;
    let (tx, mut rx) = (stream.tx, stream.rx);
    match rx.next().await.map_err(|e| link.error(e))? {
        Some(Frame::Started(pid)) => Ok((pid, ExecSink { tx, vm: vm.into() }, ExecSource { rx, vm: vm.into() })),
        Some(Frame::Error(msg)) => Err(HelperError::ExecRejected(msg)),
        Some(Frame::Fail { kind, message }) => Err(HelperError::Guest { kind, message }),
        Some(other) => {
            Err(HelperError::io("agent protocol", std::io::Error::other(format!("expected started, got {other:?}"))))
        }
        None => Err(HelperError::io(
            "agent protocol",
            std::io::Error::other("the agent ended the stream before the process started"),
        )),
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
        self.tx.send(frame).await.map_err(|e| agent_error(&self.vm, e))
    }
}

impl ExecSource {
    /// The next output; `None` means the agent ended the stream without an
    /// exit status. Cancel-safe.
    pub async fn next(&mut self) -> Result<Option<ExecOutput>, HelperError> {
        loop {
            return Ok(match self.rx.next().await.map_err(|e| agent_error(&self.vm, e))? {
                Some(Frame::Stdout(b)) => Some(ExecOutput::Stdout(b)),
                Some(Frame::Stderr(b)) => Some(ExecOutput::Stderr(b)),
                Some(Frame::Exited(st)) => Some(ExecOutput::Exited(st)),
                Some(_) => continue,
                None => None,
            });
        }
    }
}
