//! The helper ⇄ agent wire protocol: ONE byte stream per VM (a Unix socket,
//! a virtio-serial port, a vsock) carrying many concurrent streams, each a
//! sequence of frames `[u8 kind][u32 LE stream id][u32 LE length][payload]`.
//! [`super::mux`] multiplexes them (stream table, flow control).
//!
//! Both ends use this module, so the two halves can never disagree. Specs and
//! requests are JSON (small, once per stream); every other frame is raw
//! bytes or fixed-width integers so output, stdin and tar streams stay
//! binary-safe and cheap.
//!
//! Stream kinds, by their first (opening) frame, always sent by the helper:
//! `Ping` (answered by `Pong`); `Start` (an Exec: `Started`, output,
//! `Exited`); `CopyIn` (then `Data`… `End`, answered by `Copied`); `CopyOut`
//! (answered by `Data`… `End`); `Background` (answered by `BackgroundReply`,
//! plus, for log and stop, the output in `Stdout` frames up to the end of the stream); `Dial` (answered by
//! `Connected`, then `Data` both ways, `End` = half-close); `Stats`
//! (answered by `StatsReply`). Any of them may be answered by `Fail`.
//! Two frames belong to the connection's bookkeeping rather than to a
//! request: `Credit` (flow control) and `Cancel` (this end hung up the
//! stream: the process it ran is killed, as when today's per-request
//! connection was closed).
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Upper bound on one frame's payload; anything larger is a broken peer.
pub const MAX_FRAME: usize = 16 << 20;

/// Bytes before a frame's payload: kind, stream id, length.
pub const HEADER: usize = 9;

/// Largest payload of a data frame (`Stdin`, `Stdout`, `Stderr`, `Data`):
/// keeps one busy stream from holding the shared byte stream for long.
pub const MAX_DATA: usize = 256 * 1024;

/// Identifies one stream on a connection; chosen by the helper.
pub type StreamId = u32;

/// What the agent should run, with the environment already merged in order
/// (VM env, then process env) by the helper.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartSpec {
    /// argv; argv[0] is looked up in PATH when it has no slash.
    pub argv: Vec<String>,
    /// Variables applied after the agent's base environment, later wins.
    pub env: Vec<(String, String)>,
    /// Working directory; empty means "/".
    pub cwd: String,
    /// mkdir -p the cwd before starting.
    pub create_cwd: bool,
    /// Run on a pseudo-terminal.
    pub tty: bool,
    /// Terminal columns (tty only).
    pub tty_cols: u16,
    /// Terminal rows (tty only).
    pub tty_rows: u16,
    /// User to run as: a name from the VM's /etc/passwd or "uid[:gid]";
    /// empty means root.
    #[serde(default)]
    pub user: String,
    /// Bytes readable once on descriptor `secret_fd` (ProcessSpec.secret).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secret: Vec<u8>,
    /// Descriptor number for `secret`; 0 means 3.
    #[serde(default)]
    pub secret_fd: u32,
}

impl StartSpec {
    /// `argv` as root in `/`, with only a standard PATH: what the helper runs
    /// in a guest for itself (snapshots, probes).
    pub fn plain(argv: Vec<String>) -> Self {
        Self {
            argv,
            env: vec![("PATH".into(), "/usr/sbin:/usr/bin:/sbin:/bin".into())],
            cwd: "/".into(),
            create_cwd: false,
            tty: false,
            tty_cols: 0,
            tty_rows: 0,
            user: String::new(),
            secret: Vec::new(),
            secret_fd: 0,
        }
    }
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExitStatus {
    /// Normal exit with this code.
    Code(i32),
    /// Killed by this signal.
    Signal(i32),
}

/// A request about the VM's background processes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum BackgroundRequest {
    /// Start `spec` under `name`.
    Start {
        /// Client-chosen id, unique among running processes.
        name: String,
        /// What to run (tty is refused).
        spec: StartSpec,
    },
    /// Every record.
    List,
    /// One record and the last `tail_lines` lines of its output (0 = all).
    Log {
        /// The record.
        name: String,
        /// Lines wanted.
        tail_lines: u32,
    },
    /// TERM the group, KILL it after `grace_ms`, drop the record.
    Stop {
        /// The record.
        name: String,
        /// Between TERM and KILL.
        grace_ms: u32,
        /// Lines of output to return.
        tail_lines: u32,
    },
}

/// One background process as the agent knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackgroundRecord {
    /// Client-chosen id.
    pub name: String,
    /// Pid inside the VM, also its process group.
    pub pid: i32,
    /// What it was started with.
    pub argv: Vec<String>,
    /// Unix ms.
    pub started_at_ms: i64,
    /// Set once it exited.
    pub exit: Option<ExitStatus>,
}

/// The answer to a [`BackgroundRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackgroundReply {
    /// One record (start, log, stop) or all of them (list).
    pub processes: Vec<BackgroundRecord>,
    /// Output bytes dropped from the front of the ring (log).
    pub dropped_bytes: u64,
}

/// Why the agent refused a copy or background request; decides the gRPC
/// code the helper answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailKind {
    /// The request is malformed or escapes its bounds.
    Invalid,
    /// The path or process does not exist.
    NotFound,
    /// A running process already has the name.
    AlreadyExists,
    /// A bound was reached (too many background records).
    Exhausted,
    /// Something failed inside the VM.
    Internal,
    /// Nothing listens on the dialled port.
    Refused,
    /// The kernel refused to start the process (fork's EAGAIN).
    ForkRefused,
}

/// Resource usage as seen from inside the VM (the `Stats` stream's
/// answer). A counter the guest cannot read is 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestStats {
    /// CPU time of every process the agent can see.
    pub cpu_usage_ns: u64,
    /// Memory in use by the guest's processes.
    pub memory_used_bytes: u64,
    /// Processes (tasks) running.
    pub pids: u64,
    /// Bytes received on non-loopback interfaces.
    pub net_rx_bytes: u64,
    /// Bytes sent on non-loopback interfaces.
    pub net_tx_bytes: u64,
    /// Bytes in use on a vm's writable disk (its writable layer and
    /// Docker's data), which only the guest can read; 0 elsewhere.
    #[serde(default)]
    pub disk_used_bytes: u64,
    /// The sandbox's cgroup inside a vm's guest, where its limits hold;
    /// `None` on the namespace driver (the host has those figures) and from
    /// agents that predate it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<GroupStats>,
}

/// The figures of the sandbox's cgroup inside a vm's guest
/// ([`super::group`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupStats {
    /// `memory.current` less the inactive file cache
    /// ([`super::group::working_set`]).
    pub memory_used_bytes: u64,
    /// `memory.max`, or the guest's RAM when that is `max`.
    pub memory_limit_bytes: u64,
    /// `pids.current`.
    pub pids: u64,
    /// `pids.max`; 0 when that is `max`.
    pub pids_limit: u64,
    /// Processes of the group the OOM killer killed (`memory.events`).
    pub oom_kills: u64,
}

/// One protocol message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// helper → agent: run a process (first frame of an exec connection).
    Start(StartSpec),
    /// helper → agent: bytes for the process's stdin.
    Stdin(Vec<u8>),
    /// helper → agent: end of stdin.
    CloseStdin,
    /// helper → agent: deliver a signal, to the process group if `group`.
    Signal {
        /// Signal number.
        signal: i32,
        /// Whole process group instead of the process only.
        group: bool,
    },
    /// helper → agent: liveness probe (first and only frame of its connection).
    Ping,
    /// agent → helper: the process runs with this pid.
    Started(i32),
    /// agent → helper: stdout bytes.
    Stdout(Vec<u8>),
    /// agent → helper: stderr bytes.
    Stderr(Vec<u8>),
    /// agent → helper: the process is gone; last frame.
    Exited(ExitStatus),
    /// agent → helper: the process could not be started.
    Error(String),
    /// agent → helper: answer to `Ping`.
    Pong,
    /// helper → agent: extract the tar stream that follows into this
    /// absolute directory.
    CopyIn(String),
    /// helper → agent: send this absolute path as a tar stream.
    CopyOut(String),
    /// Either way: the next chunk of a tar stream.
    Data(Vec<u8>),
    /// Either way: the tar stream is complete.
    End,
    /// agent → helper: the copy-in finished: regular files and their bytes.
    Copied {
        /// Regular files written.
        files: u64,
        /// Bytes of their content.
        bytes: u64,
    },
    /// helper → agent: a background-process request.
    Background(BackgroundRequest),
    /// agent → helper: its answer.
    BackgroundReply(BackgroundReply),
    /// agent → helper: the request failed; last frame.
    Fail {
        /// Which kind of failure.
        kind: FailKind,
        /// What happened.
        message: String,
    },
    /// Either way: the receiver consumed this many more data bytes of the
    /// stream; the sender may send that much more (see [`super::mux`]).
    Credit(u32),
    /// Either way: this end is done with the stream (gone, or not
    /// interested any more); the peer stops its work and forgets it.
    Cancel,
    /// helper → agent: connect to 127.0.0.1:port inside the VM.
    Dial(u16),
    /// agent → helper: the dial connected; `Data`/`End` follow both ways.
    Connected,
    /// helper → agent: report resource usage.
    Stats,
    /// agent → helper: the usage.
    StatsReply(GuestStats),
}

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    /// The socket failed.
    #[error("agent connection: {0}")]
    Io(#[from] std::io::Error),
    /// The peer sent a frame larger than [`MAX_FRAME`].
    #[error("agent frame of {0} bytes exceeds the limit")]
    TooLarge(usize),
    /// The peer sent an unknown frame kind.
    #[error("unknown agent frame kind {0}")]
    UnknownKind(u8),
    /// The payload does not fit its kind.
    #[error("malformed agent frame: {0}")]
    Malformed(String),
    /// The connection ended in the middle of a frame.
    #[error("agent connection closed mid-frame")]
    Truncated,
}

mod kind {
    pub const START: u8 = 1;
    pub const STDIN: u8 = 2;
    pub const CLOSE_STDIN: u8 = 3;
    pub const SIGNAL: u8 = 4;
    pub const PING: u8 = 5;
    pub const STARTED: u8 = 10;
    pub const STDOUT: u8 = 11;
    pub const STDERR: u8 = 12;
    pub const EXITED: u8 = 13;
    pub const ERROR: u8 = 14;
    pub const PONG: u8 = 15;
    pub const COPY_IN: u8 = 20;
    pub const COPY_OUT: u8 = 21;
    pub const DATA: u8 = 22;
    pub const END: u8 = 23;
    pub const COPIED: u8 = 24;
    pub const BACKGROUND: u8 = 25;
    pub const BACKGROUND_REPLY: u8 = 26;
    pub const FAIL: u8 = 27;
    pub const CREDIT: u8 = 30;
    pub const CANCEL: u8 = 31;
    pub const DIAL: u8 = 32;
    pub const CONNECTED: u8 = 33;
    pub const STATS: u8 = 34;
    pub const STATS_REPLY: u8 = 35;
}

fn fail_code(kind: FailKind) -> u8 {
    match kind {
        FailKind::Invalid => 0,
        FailKind::NotFound => 1,
        FailKind::AlreadyExists => 2,
        FailKind::Exhausted => 3,
        FailKind::Internal => 4,
        FailKind::Refused => 5,
        FailKind::ForkRefused => 6,
    }
}

fn fail_kind(code: u8) -> Result<FailKind, ProtocolError> {
    Ok(match code {
        0 => FailKind::Invalid,
        1 => FailKind::NotFound,
        2 => FailKind::AlreadyExists,
        3 => FailKind::Exhausted,
        4 => FailKind::Internal,
        5 => FailKind::Refused,
        6 => FailKind::ForkRefused,
        other => return Err(ProtocolError::Malformed(format!("failure kind {other}"))),
    })
}

fn to_json<T: Serialize>(v: &T) -> Result<Vec<u8>, ProtocolError> {
    serde_json::to_vec(v).map_err(|e| ProtocolError::Malformed(e.to_string()))
}

fn from_json<'a, T: Deserialize<'a>>(p: &'a [u8]) -> Result<T, ProtocolError> {
    serde_json::from_slice(p).map_err(|e| ProtocolError::Malformed(e.to_string()))
}

impl Frame {
    /// Opens a stream (the first frame a helper sends on a new stream id).
    pub fn is_opening(&self) -> bool {
        matches!(
            self,
            Frame::Start(_)
                | Frame::Ping
                | Frame::CopyIn(_)
                | Frame::CopyOut(_)
                | Frame::Background(_)
                | Frame::Dial(_)
                | Frame::Stats
        )
    }

    /// Bytes of this frame that count against the stream's flow-control
    /// window: the payload of data frames; other frames are few per stream
    /// and never wait for credit.
    pub fn data_len(&self) -> usize {
        match self {
            Frame::Stdin(b) | Frame::Stdout(b) | Frame::Stderr(b) | Frame::Data(b) => b.len(),
            _ => 0,
        }
    }

    /// Appends the encoded frame, on stream `stream`, to `out`.
    pub fn encode(&self, stream: StreamId, out: &mut Vec<u8>) -> Result<(), ProtocolError> {
        let (k, payload): (u8, std::borrow::Cow<'_, [u8]>) = match self {
            Frame::Start(spec) => (kind::START, to_json(spec)?.into()),
            Frame::Stdin(b) => (kind::STDIN, b.as_slice().into()),
            Frame::CloseStdin => (kind::CLOSE_STDIN, (&[][..]).into()),
            Frame::Signal { signal, group } => {
                let mut p = signal.to_le_bytes().to_vec();
                p.push(u8::from(*group));
                (kind::SIGNAL, p.into())
            }
            Frame::Ping => (kind::PING, (&[][..]).into()),
            Frame::Started(pid) => (kind::STARTED, pid.to_le_bytes().to_vec().into()),
            Frame::Stdout(b) => (kind::STDOUT, b.as_slice().into()),
            Frame::Stderr(b) => (kind::STDERR, b.as_slice().into()),
            Frame::Exited(status) => {
                let (tag, v) = match status {
                    ExitStatus::Code(c) => (0u8, *c),
                    ExitStatus::Signal(s) => (1u8, *s),
                };
                let mut p = vec![tag];
                p.extend_from_slice(&v.to_le_bytes());
                (kind::EXITED, p.into())
            }
            Frame::Error(msg) => (kind::ERROR, msg.as_bytes().into()),
            Frame::Pong => (kind::PONG, (&[][..]).into()),
            Frame::CopyIn(dir) => (kind::COPY_IN, dir.as_bytes().into()),
            Frame::CopyOut(path) => (kind::COPY_OUT, path.as_bytes().into()),
            Frame::Data(b) => (kind::DATA, b.as_slice().into()),
            Frame::End => (kind::END, (&[][..]).into()),
            Frame::Copied { files, bytes } => {
                let mut p = files.to_le_bytes().to_vec();
                p.extend_from_slice(&bytes.to_le_bytes());
                (kind::COPIED, p.into())
            }
            Frame::Background(req) => (kind::BACKGROUND, to_json(req)?.into()),
            Frame::BackgroundReply(reply) => (kind::BACKGROUND_REPLY, to_json(reply)?.into()),
            Frame::Fail { kind: k, message } => {
                let mut p = vec![fail_code(*k)];
                p.extend_from_slice(message.as_bytes());
                (kind::FAIL, p.into())
            }
            Frame::Credit(n) => (kind::CREDIT, n.to_le_bytes().to_vec().into()),
            Frame::Cancel => (kind::CANCEL, (&[][..]).into()),
            Frame::Dial(port) => (kind::DIAL, port.to_le_bytes().to_vec().into()),
            Frame::Connected => (kind::CONNECTED, (&[][..]).into()),
            Frame::Stats => (kind::STATS, (&[][..]).into()),
            Frame::StatsReply(s) => (kind::STATS_REPLY, to_json(s)?.into()),
        };
        let limit = if self.data_len() > 0 { MAX_DATA } else { MAX_FRAME };
        if payload.len() > limit {
            return Err(ProtocolError::TooLarge(payload.len()));
        }
        out.reserve(HEADER + payload.len());
        out.push(k);
        out.extend_from_slice(&stream.to_le_bytes());
        out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        out.extend_from_slice(&payload);
        Ok(())
    }

    fn decode(k: u8, p: &[u8]) -> Result<Frame, ProtocolError> {
        let int = |p: &[u8]| -> Result<i32, ProtocolError> {
            let b: [u8; 4] = p
                .get(..4)
                .and_then(|s| s.try_into().ok())
                .ok_or_else(|| ProtocolError::Malformed("short integer".into()))?;
            Ok(i32::from_le_bytes(b))
        };
        let long = |p: &[u8]| -> Result<u64, ProtocolError> {
            let b: [u8; 8] = p
                .get(..8)
                .and_then(|s| s.try_into().ok())
                .ok_or_else(|| ProtocolError::Malformed("short integer".into()))?;
            Ok(u64::from_le_bytes(b))
        };
        let text = |p: &[u8]| String::from_utf8_lossy(p).into_owned();
        let frame = match k {
            kind::START => Frame::Start(from_json(p)?),
            kind::STDIN => Frame::Stdin(p.to_vec()),
            kind::CLOSE_STDIN => Frame::CloseStdin,
            kind::SIGNAL => Frame::Signal { signal: int(p)?, group: p.get(4).copied().unwrap_or(0) != 0 },
            kind::PING => Frame::Ping,
            kind::STARTED => Frame::Started(int(p)?),
            kind::STDOUT => Frame::Stdout(p.to_vec()),
            kind::STDERR => Frame::Stderr(p.to_vec()),
            kind::EXITED => {
                let v = int(p.get(1..).unwrap_or_default())?;
                match p.first() {
                    Some(0) => Frame::Exited(ExitStatus::Code(v)),
                    Some(1) => Frame::Exited(ExitStatus::Signal(v)),
                    _ => return Err(ProtocolError::Malformed("exit status tag".into())),
                }
            }
            kind::ERROR => Frame::Error(String::from_utf8_lossy(p).into_owned()),
            kind::PONG => Frame::Pong,
            kind::COPY_IN => Frame::CopyIn(text(p)),
            kind::COPY_OUT => Frame::CopyOut(text(p)),
            kind::DATA => Frame::Data(p.to_vec()),
            kind::END => Frame::End,
            kind::COPIED => Frame::Copied { files: long(p)?, bytes: long(p.get(8..).unwrap_or_default())? },
            kind::BACKGROUND => Frame::Background(from_json(p)?),
            kind::BACKGROUND_REPLY => Frame::BackgroundReply(from_json(p)?),
            kind::FAIL => Frame::Fail {
                kind: fail_kind(p.first().copied().unwrap_or(u8::MAX))?,
                message: text(p.get(1..).unwrap_or_default()),
            },
            kind::CREDIT => Frame::Credit(int(p)? as u32),
            kind::CANCEL => Frame::Cancel,
            kind::DIAL => {
                let b: [u8; 2] = p.try_into().map_err(|_| ProtocolError::Malformed("dial port".into()))?;
                Frame::Dial(u16::from_le_bytes(b))
            }
            kind::CONNECTED => Frame::Connected,
            kind::STATS => Frame::Stats,
            kind::STATS_REPLY => Frame::StatsReply(from_json(p)?),
            other => return Err(ProtocolError::UnknownKind(other)),
        };
        if frame.data_len() > MAX_DATA {
            return Err(ProtocolError::TooLarge(frame.data_len()));
        }
        Ok(frame)
    }
}

/// Writes one frame with a single write call.
pub async fn write_frame<W: AsyncWrite + Unpin>(
    w: &mut W,
    stream: StreamId,
    frame: &Frame,
) -> Result<(), ProtocolError> {
    let mut buf = Vec::new();
    frame.encode(stream, &mut buf)?;
    w.write_all(&buf).await?;
    Ok(())
}

/// Reads frames from a byte stream.
///
/// `next` is cancel-safe (bytes read are kept in the buffer), which lets
/// callers use it as one branch of `tokio::select!` next to other I/O.
pub struct FrameReader<R> {
    inner: R,
    buf: Vec<u8>,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// Wraps a reader.
    pub fn new(inner: R) -> Self {
        Self { inner, buf: Vec::new() }
    }

    /// The next frame and its stream, or `None` at a clean end of stream.
    pub async fn next(&mut self) -> Result<Option<(StreamId, Frame)>, ProtocolError> {
        loop {
            if let Some(frame) = self.parse()? {
                return Ok(Some(frame));
            }
            self.buf.reserve(64 * 1024);
            if self.inner.read_buf(&mut self.buf).await? == 0 {
                return if self.buf.is_empty() { Ok(None) } else { Err(ProtocolError::Truncated) };
            }
        }
    }

    fn parse(&mut self) -> Result<Option<(StreamId, Frame)>, ProtocolError> {
        if self.buf.len() < HEADER {
            return Ok(None);
        }
        let stream = u32::from_le_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]);
        let len = u32::from_le_bytes([self.buf[5], self.buf[6], self.buf[7], self.buf[8]]) as usize;
        if len > MAX_FRAME {
            return Err(ProtocolError::TooLarge(len));
        }
        if self.buf.len() < HEADER + len {
            return Ok(None);
        }
        let frame = Frame::decode(self.buf[0], &self.buf[HEADER..HEADER + len])?;
        self.buf.drain(..HEADER + len);
        Ok(Some((stream, frame)))
    }
}

/// Largest secret: it must fit a pipe's buffer, so the agent's write of it
/// never blocks.
pub const MAX_SECRET: usize = 4096;

/// Background process names are ids: `^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`
/// (the helper checks them before a request reaches the agent).
pub fn check_name(name: &str) -> Result<(), super::AgentError> {
    let ok = name.len() <= 63
        && name.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(super::AgentError::Rejected(format!("name: {name:?} must match ^[A-Za-z0-9][A-Za-z0-9._-]{{0,62}}$")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        for ok in ["a", "web-1", "x.y_z", &"a".repeat(63)] {
            assert!(check_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-a", ".a", "a b", "a/b", &"a".repeat(64)] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn every_frame_round_trips() {
        let frames = vec![
            Frame::Start(StartSpec {
                argv: vec!["echo".into(), "hi".into()],
                env: vec![("A".into(), "1".into())],
                cwd: "/tmp".into(),
                create_cwd: true,
                tty: false,
                tty_cols: 80,
                tty_rows: 24,
                user: "nobody".into(),
                secret: b"s3cret".to_vec(),
                secret_fd: 4,
            }),
            Frame::Stdin((0..=255).collect()),
            Frame::CloseStdin,
            Frame::Signal { signal: 15, group: true },
            Frame::Ping,
            Frame::Started(42),
            Frame::Stdout(vec![0, 1, 2]),
            Frame::Stderr(Vec::new()),
            Frame::Exited(ExitStatus::Code(3)),
            Frame::Exited(ExitStatus::Signal(9)),
            Frame::Error("nope".into()),
            Frame::Pong,
            Frame::CopyIn("/dst".into()),
            Frame::CopyOut("/src".into()),
            Frame::Data(vec![9; 3]),
            Frame::End,
            Frame::Copied { files: 2, bytes: 1 << 40 },
            Frame::Background(BackgroundRequest::Stop { name: "web".into(), grace_ms: 10, tail_lines: 5 }),
            Frame::BackgroundReply(BackgroundReply {
                processes: vec![BackgroundRecord {
                    name: "web".into(),
                    pid: 7,
                    argv: vec!["sleep".into()],
                    started_at_ms: 1,
                    exit: Some(ExitStatus::Signal(15)),
                }],
                dropped_bytes: 3,
            }),
            Frame::Fail { kind: FailKind::AlreadyExists, message: "taken".into() },
            Frame::Fail { kind: FailKind::Refused, message: "no".into() },
            Frame::Fail { kind: FailKind::ForkRefused, message: "again".into() },
            Frame::Credit(1 << 20),
            Frame::Cancel,
            Frame::Dial(8080),
            Frame::Connected,
            Frame::Stats,
            Frame::StatsReply(GuestStats {
                cpu_usage_ns: 1,
                memory_used_bytes: 2,
                pids: 3,
                net_rx_bytes: 4,
                net_tx_bytes: 5,
                disk_used_bytes: 6,
                group: Some(GroupStats {
                    memory_used_bytes: 7,
                    memory_limit_bytes: 8,
                    pids: 9,
                    pids_limit: 10,
                    oom_kills: 11,
                }),
            }),
        ];
        let mut bytes = Vec::new();
        for (i, f) in frames.iter().enumerate() {
            f.encode(i as u32 * 7, &mut bytes).unwrap();
        }
        let mut r = FrameReader::new(bytes.as_slice());
        for (i, f) in frames.iter().enumerate() {
            assert_eq!(r.next().await.unwrap(), Some((i as u32 * 7, f.clone())));
        }
        assert!(r.next().await.unwrap().is_none());
    }

    #[test]
    fn data_frames_are_bounded() {
        let mut out = Vec::new();
        assert!(matches!(Frame::Data(vec![0; MAX_DATA + 1]).encode(1, &mut out), Err(ProtocolError::TooLarge(_))));
        assert!(Frame::Data(vec![0; MAX_DATA]).encode(1, &mut out).is_ok());
    }

    #[tokio::test]
    async fn truncated_and_unknown_frames_are_errors() {
        let mut r = FrameReader::new(&[kind::STDOUT, 1, 0, 0, 0, 10, 0, 0, 0, 1][..]);
        assert!(matches!(r.next().await, Err(ProtocolError::Truncated)));
        let mut r = FrameReader::new(&[99u8, 1, 0, 0, 0, 0, 0, 0, 0][..]);
        assert!(matches!(r.next().await, Err(ProtocolError::UnknownKind(99))));
        let mut r = FrameReader::new(&[kind::STDOUT, 1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff][..]);
        assert!(matches!(r.next().await, Err(ProtocolError::TooLarge(_))));
        let mut r = FrameReader::new(&[kind::STARTED, 1, 0, 0, 0, 1, 0, 0, 0, 7][..]);
        assert!(matches!(r.next().await, Err(ProtocolError::Malformed(_))));
        let mut r = FrameReader::new(&[kind::FAIL, 1, 0, 0, 0, 1, 0, 0, 0, 99][..]);
        assert!(matches!(r.next().await, Err(ProtocolError::Malformed(_))));
        let mut r = FrameReader::new(&[kind::COPIED, 1, 0, 0, 0, 4, 0, 0, 0, 1, 2, 3, 4][..]);
        assert!(matches!(r.next().await, Err(ProtocolError::Malformed(_))));
        let mut r = FrameReader::new(&[kind::DIAL, 1, 0, 0, 0, 1, 0, 0, 0, 1][..]);
        assert!(matches!(r.next().await, Err(ProtocolError::Malformed(_))));
    }
}
