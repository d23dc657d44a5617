//! The helper's side of the agent requests other than Exec: tar copies in
//! and out of the VM, its background processes, dials to its ports and its
//! usage as the guest sees it, and the helper's own short commands there. Each is one stream on the VM's agent link;
//! the agent's `Fail` frames become [`HelperError::Guest`].
use super::agent_link::{AgentLink, agent_error};
use super::error::HelperError;
use sandbox_agent::mux::{Mux, MuxError, Stream, StreamReceiver, StreamSender};
use sandbox_agent::protocol::{BackgroundReply, BackgroundRequest, ExitStatus, FailKind, Frame, GuestStats, StartSpec};

fn unexpected(what: &str, frame: Option<Frame>) -> HelperError {
    let got = match frame {
        Some(Frame::Fail { kind, message }) => return HelperError::Guest { kind, message },
        Some(f) => format!("{f:?}"),
        None => "the end of the stream".into(),
    };
    HelperError::io("agent protocol", std::io::Error::other(format!("expected {what}, got {got}")))
}

/// A copy-in under way: feed it tar chunks, then [`finish`](Self::finish).
pub struct CopyIn {
    tx: StreamSender,
    rx: StreamReceiver,
    vm: String,
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
    /// Starts extracting into `dest_dir` in VM `vm`.
    pub async fn start(vm: &str, link: &AgentLink, dest_dir: String) -> Result<Self, HelperError> {
        let s = link.open(Frame::CopyIn(dest_dir)).await?;
        Ok(CopyIn { tx: s.tx, rx: s.rx, vm: vm.into() })
    }

    /// Sends the next chunk. A failure here usually means the agent
    /// stopped early; [`outcome`](Self::outcome) then says why.
    pub async fn send(&mut self, chunk: Vec<u8>) -> Result<(), HelperError> {
        self.tx.send(Frame::Data(chunk)).await.map_err(|e| agent_error(&self.vm, e))
    }

    /// The agent's answer. Cancel-safe, so it can wait next to the client's
    /// stream and catch an early rejection.
    pub async fn outcome(&mut self) -> Result<Copied, HelperError> {
        match self.rx.next().await.map_err(|e| agent_error(&self.vm, e))? {
            Some(Frame::Copied { files, bytes }) => Ok(Copied { files, bytes }),
            other => Err(unexpected("copied", other)),
        }
    }

    /// Ends the tar stream and waits for the extraction to finish.
    pub async fn finish(mut self) -> Result<Copied, HelperError> {
        // If the agent already gave up, its reason is waiting to be read.
        let _ = self.tx.send(Frame::End).await;
        self.outcome().await
    }
}

/// A copy-out's tar stream.
pub struct CopyOut {
    rx: StreamReceiver,
    /// Kept: dropping both halves would tell the agent to stop.
    _tx: StreamSender,
    first: Option<Vec<u8>>,
    vm: String,
}

impl CopyOut {
    /// Asks for `path` and waits for the first chunk, so a missing path is
    /// an error here and not in the middle of a stream.
    pub async fn start(vm: &str, link: &AgentLink, path: String) -> Result<Self, HelperError> {
        let s = link.open(Frame::CopyOut(path)).await?;
        let mut rx = s.rx;
        let first = match rx.next().await.map_err(|e| link.error(e))? {
            Some(Frame::Data(chunk)) => Some(chunk),
            Some(Frame::End) => None,
            other => return Err(unexpected("data", other)),
        };
        Ok(CopyOut { rx, _tx: s.tx, first, vm: vm.into() })
    }

    /// The next chunk; `None` once the archive is complete.
    pub async fn next(&mut self) -> Result<Option<Vec<u8>>, HelperError> {
        if let Some(chunk) = self.first.take() {
            return Ok(Some(chunk));
        }
        match self.rx.next().await.map_err(|e| agent_error(&self.vm, e))? {
            Some(Frame::Data(chunk)) => Ok(Some(chunk)),
            Some(Frame::End) => Ok(None),
            other => Err(unexpected("data", other)),
        }
    }
}

/// Sends one background-process request; the output comes with log and
/// stop requests.
pub async fn background(link: &AgentLink, req: BackgroundRequest) -> Result<(BackgroundReply, Vec<u8>), HelperError> {
    let with_output = matches!(req, BackgroundRequest::Log { .. } | BackgroundRequest::Stop { .. });
    let mut s = link.open(Frame::Background(req)).await?;
    let reply = match s.next().await.map_err(|e| link.error(e))? {
        Some(Frame::BackgroundReply(reply)) => reply,
        other => return Err(unexpected("a background reply", other)),
    };
    // The output (up to a ring's worth) comes in data frames, then the
    // agent ends the stream.
    let mut output = Vec::new();
    if with_output {
        loop {
            match s.next().await.map_err(|e| link.error(e))? {
                Some(Frame::Stdout(chunk)) => output.extend_from_slice(&chunk),
                None => break,
                other => return Err(unexpected("output", other)),
            }
        }
    }
    Ok((reply, output))
}

/// What a process the helper ran in the guest left when it exited.
#[derive(Debug)]
pub struct Finished {
    /// How it ended.
    pub status: ExitStatus,
    /// Its standard output.
    pub stdout: Vec<u8>,
    /// Its standard error.
    pub stderr: Vec<u8>,
}

/// Why a process's stream ended without its exit status.
#[derive(Debug, thiserror::Error)]
pub enum Unfinished {
    /// The agent connection failed.
    #[error(transparent)]
    Stream(#[from] MuxError),
    /// The agent answered something else (a `Fail`, or ended the stream).
    #[error("expected the process's output or exit, got {0:?}")]
    Unexpected(Option<Frame>),
}

/// Reads a started process's stream (`Frame::Start` sent) to its exit,
/// collecting its output: the one loop behind every short command the
/// helper runs in a guest.
pub async fn finish(s: &mut Stream) -> Result<Finished, Unfinished> {
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    loop {
        match s.next().await? {
            Some(Frame::Stdout(b)) => stdout.extend(b),
            Some(Frame::Stderr(b)) => stderr.extend(b),
            Some(Frame::Started(_) | Frame::Credit(_)) => {}
            Some(Frame::Exited(status)) => return Ok(Finished { status, stdout, stderr }),
            other => return Err(Unfinished::Unexpected(other)),
        }
    }
}

/// Runs `argv` in the guest as root through `mux` and returns its stdout;
/// an exit other than 0 is an error carrying the status and stderr.
pub async fn output(mux: &Mux, argv: Vec<String>) -> Result<Vec<u8>, String> {
    let mut s = mux.open(Frame::Start(StartSpec::plain(argv))).map_err(|e| e.to_string())?;
    match finish(&mut s).await {
        Ok(Finished { status: ExitStatus::Code(0), stdout, .. }) => Ok(stdout),
        Ok(f) => Err(format!("{:?}: {}", f.status, String::from_utf8_lossy(&f.stderr).trim())),
        Err(Unfinished::Unexpected(Some(Frame::Fail { message, .. }))) => Err(message),
        Err(Unfinished::Unexpected(Some(Frame::Error(e)))) => Err(e),
        Err(e) => Err(e.to_string()),
    }
}

/// Runs `argv` in the guest as root, output discarded, until it exits;
/// an exit other than 0 is an error naming the status.
pub async fn run(link: &AgentLink, argv: Vec<String>) -> Result<(), HelperError> {
    let what = argv.join(" ");
    let mut s = link.open(Frame::Start(StartSpec::plain(argv))).await?;
    match finish(&mut s).await {
        Ok(Finished { status: ExitStatus::Code(0), .. }) => Ok(()),
        Ok(f) => {
            Err(HelperError::io(format!("run {what} in the guest"), std::io::Error::other(format!("{:?}", f.status))))
        }
        Err(Unfinished::Stream(e)) => Err(link.error(e)),
        Err(Unfinished::Unexpected(other)) => Err(unexpected("the process's output or exit", other)),
    }
}

/// The guest's own view of its usage.
pub async fn stats(link: &AgentLink) -> Result<GuestStats, HelperError> {
    let mut s = link.open(Frame::Stats).await?;
    match s.next().await.map_err(|e| link.error(e))? {
        Some(Frame::StatsReply(stats)) => Ok(stats),
        other => Err(unexpected("stats", other)),
    }
}

/// A connection to a port inside the VM, made by its agent.
pub struct Dialed {
    /// Bytes (`Data`) and half-close (`End`) to the guest.
    pub tx: StreamSender,
    /// The guest's bytes and its half-close.
    pub rx: StreamReceiver,
}

/// Has the agent connect to `127.0.0.1:port` inside VM `vm`.
pub async fn dial(vm: &str, link: &AgentLink, port: u32) -> Result<Dialed, HelperError> {
    let port16 = u16::try_from(port)
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| HelperError::invalid("start.port", format!("{port} is not a TCP port")))?;
    let mut s = link.open(Frame::Dial(port16)).await?;
    match s.next().await.map_err(|e| link.error(e))? {
        Some(Frame::Connected) => Ok(Dialed { tx: s.tx, rx: s.rx }),
        Some(Frame::Fail { kind: FailKind::Refused, .. }) => Err(HelperError::DialRefused { vm: vm.into(), port }),
        other => Err(unexpected("connected", other)),
    }
}
