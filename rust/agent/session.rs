//! One agent connection: a ping, or one process from `Start` to `Exited`.
//!
//! Two small tasks per process and no threads: the connection loop below
//! forwards output and waits for the exit, a reader task applies the
//! helper's stdin/signal frames, and a writer task feeds stdin so a process
//! that stops reading its stdin can never stall signals or output.
use std::time::Duration;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::net::unix::OwnedReadHalf;
use tokio::sync::mpsc;

use super::process::{self, Spawned};
use super::protocol::{ExitStatus, Frame, FrameReader, write_frame};

/// How long output is still forwarded after the main process exited: enough
/// to drain what it wrote, short enough that a background child holding the
/// pipe open cannot hang the call.
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(100);

const CHUNK: usize = 64 * 1024;

enum StdinOp {
    Data(Vec<u8>),
    Close,
}

/// Serves one connection until its process is gone or the helper hangs up.
pub async fn handle(stream: UnixStream) {
    let (rd, mut wr) = stream.into_split();
    let mut reader = FrameReader::new(rd);
    match reader.next().await {
        Ok(Some(Frame::Ping)) => {
            let _ = write_frame(&mut wr, &Frame::Pong).await;
        }
        Ok(Some(Frame::Start(spec))) => match process::spawn(&spec) {
            Ok(spawned) => run(spawned, reader, wr).await,
            Err(e) => {
                let _ = write_frame(&mut wr, &Frame::Error(e.to_string())).await;
            }
        },
        _ => {}
    }
}

async fn run<W: AsyncWrite + Unpin>(p: Spawned, reader: FrameReader<OwnedReadHalf>, mut wr: W) {
    let Spawned {
        mut child,
        pid,
        stdin,
        mut stdout,
        stderr,
    } = p;
    if write_frame(&mut wr, &Frame::Started(pid)).await.is_err() {
        kill_group(pid);
        return;
    }
    let (stdin_tx, stdin_rx) = mpsc::unbounded_channel();
    let writer = tokio::spawn(feed_stdin(stdin, stdin_rx));
    let control = tokio::spawn(apply_requests(reader, stdin_tx, pid));

    let mut stderr = stderr;
    let mut out_buf = vec![0u8; CHUNK];
    let mut err_buf = vec![0u8; CHUNK];
    let mut out_open = true;
    let mut err_open = stderr.is_some();
    let mut status: Option<ExitStatus> = None;
    let drain = tokio::time::sleep(Duration::MAX);
    tokio::pin!(drain);
    let mut connected = true;
    while connected && (status.is_none() || out_open || err_open) {
        tokio::select! {
            n = stdout.read(&mut out_buf), if out_open => match n {
                Ok(n) if n > 0 => connected = write_frame(&mut wr, &Frame::Stdout(out_buf[..n].to_vec())).await.is_ok(),
                _ => out_open = false,
            },
            n = read_opt(&mut stderr, &mut err_buf), if err_open => match n {
                Ok(n) if n > 0 => connected = write_frame(&mut wr, &Frame::Stderr(err_buf[..n].to_vec())).await.is_ok(),
                _ => err_open = false,
            },
            st = child.wait(), if status.is_none() => {
                status = Some(match st {
                    Ok(st) => exit_status(st),
                    Err(_) => ExitStatus::Code(-1),
                });
                drain.as_mut().reset(tokio::time::Instant::now() + DRAIN_AFTER_EXIT);
            },
            () = &mut drain, if status.is_some() => break,
        }
    }
    // Stop applying requests before reporting the exit: once the helper has
    // the status it may hang up, and that must not kill background children
    // the command intentionally left running.
    control.abort();
    writer.abort();
    match status {
        Some(st) if connected => {
            let _ = write_frame(&mut wr, &Frame::Exited(st)).await;
            let _ = wr.flush().await;
        }
        _ => kill_group(pid),
    }
}

async fn read_opt(
    r: &mut Option<Box<dyn tokio::io::AsyncRead + Send + Unpin>>,
    buf: &mut [u8],
) -> std::io::Result<usize> {
    match r {
        Some(r) => r.read(buf).await,
        None => Ok(0),
    }
}

/// Applies stdin and signal frames; a dropped connection kills the group.
async fn apply_requests(
    mut reader: FrameReader<OwnedReadHalf>,
    stdin: mpsc::UnboundedSender<StdinOp>,
    pid: i32,
) {
    loop {
        match reader.next().await {
            Ok(Some(Frame::Stdin(b))) => {
                let _ = stdin.send(StdinOp::Data(b));
            }
            Ok(Some(Frame::CloseStdin)) => {
                let _ = stdin.send(StdinOp::Close);
            }
            Ok(Some(Frame::Signal { signal, group })) => {
                if let Ok(sig) = Signal::try_from(signal) {
                    let _ = if group {
                        killpg(Pid::from_raw(pid), sig)
                    } else {
                        kill(Pid::from_raw(pid), sig)
                    };
                }
            }
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => {
                kill_group(pid);
                return;
            }
        }
    }
}

async fn feed_stdin(
    mut stdin: Box<dyn AsyncWrite + Send + Unpin>,
    mut ops: mpsc::UnboundedReceiver<StdinOp>,
) {
    while let Some(op) = ops.recv().await {
        match op {
            StdinOp::Data(b) => {
                if stdin.write_all(&b).await.is_err() || stdin.flush().await.is_err() {
                    // The process closed its stdin; later bytes have nowhere to go.
                    return;
                }
            }
            StdinOp::Close => return,
        }
    }
}

fn kill_group(pid: i32) {
    let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
}

fn exit_status(st: std::process::ExitStatus) -> ExitStatus {
    use std::os::unix::process::ExitStatusExt as _;
    match (st.code(), st.signal()) {
        (Some(c), _) => ExitStatus::Code(c),
        (None, Some(s)) => ExitStatus::Signal(s),
        (None, None) => ExitStatus::Code(-1),
    }
}
