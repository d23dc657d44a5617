//! One agent stream: a ping, one process from `Start` to `Exited`, one
//! copy, one background-process request, one dial or one stats reading.
//!
//! Two small tasks per Exec and no threads: the stream loop below forwards
//! output and waits for the exit, a reader task applies the helper's
//! stdin/signal frames, and a writer task feeds stdin so a process that
//! stops reading its stdin can never stall signals or output.
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use super::AgentError;
use super::background::Registry;
use super::copy;
use super::mux::{Stream, StreamReceiver, StreamSender};
use super::process::{self, Spawned};
use super::protocol::{BackgroundRequest, ExitStatus, Frame};
use super::tree;

/// How long output is still forwarded after the main process exited: enough
/// to drain what it wrote, short enough that a background child holding the
/// pipe open cannot hang the call.
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(100);

const CHUNK: usize = 64 * 1024;

enum StdinOp {
    Data(Vec<u8>),
    Close,
}

/// Default grace between TERM and KILL when stopping a background process.
const DEFAULT_STOP_GRACE: Duration = Duration::from_millis(2000);

/// Serves one stream until its work is done or the helper hangs up.
pub async fn handle(stream: Stream, background: Arc<Registry>) {
    let Stream { tx, mut rx, .. } = stream;
    let first = rx.next().await;
    let result = match first {
        Ok(Some(Frame::CopyIn(dest))) => {
            copy_in(&dest, rx).await.map(|c| vec![Frame::Copied { files: c.files, bytes: c.bytes }])
        }
        Ok(Some(Frame::CopyOut(path))) => {
            // Kept: dropping the receiver would end the stream early.
            let _rx = rx;
            copy_out(&path, &tx).await.map(|()| vec![Frame::End])
        }
        Ok(Some(Frame::Background(req))) => background_request(&background, req).await,
        Ok(Some(Frame::Stats)) => Ok(vec![Frame::StatsReply(super::stats::read())]),
        Ok(Some(Frame::Dial(port))) => {
            super::dial::serve(port, tx, rx).await;
            return;
        }
        Ok(Some(Frame::Ping)) => Ok(vec![Frame::Pong]),
        Ok(Some(Frame::Start(spec))) => {
            match process::spawn(&spec) {
                Ok(spawned) => run(spawned, rx, tx).await,
                Err(e) => {
                    // A refused fork goes typed, so that the helper can name
                    // the limit that refused it; anything else is about the
                    // process asked for (its program, its cwd).
                    let frame = match e {
                        AgentError::ForkRefused(_) => Frame::Fail { kind: e.kind(), message: e.to_string() },
                        _ => Frame::Error(e.to_string()),
                    };
                    let _ = tx.send(frame).await;
                }
            }
            return;
        }
        _ => return,
    };
    let frames = result.unwrap_or_else(|e| vec![Frame::Fail { kind: e.kind(), message: e.to_string() }]);
    for f in frames {
        if tx.send(f).await.is_err() {
            return;
        }
    }
}

async fn copy_in(dest: &str, mut reader: StreamReceiver) -> Result<copy::Copied, AgentError> {
    let extraction = copy::extract(dest)?;
    loop {
        match reader.next().await {
            Ok(Some(Frame::Data(chunk))) => {
                if !extraction.feed(chunk).await {
                    break;
                }
            }
            Ok(Some(Frame::End)) => break,
            Ok(Some(_)) => {}
            // The helper gave up: whatever was written stays, like an
            // interrupted tar; nobody is left to report to.
            Ok(None) | Err(_) => {
                let _ = extraction.finish().await;
                return Err(AgentError::Rejected("the tar stream was cut short".into()));
            }
        }
    }
    extraction.finish().await
}

async fn copy_out(path: &str, wr: &StreamSender) -> Result<(), AgentError> {
    let copy::Archiving { mut chunks, worker } = copy::archive(path)?;
    while let Some(chunk) = chunks.recv().await {
        if wr.send(Frame::Data(chunk)).await.is_err() {
            // Dropping the receiver makes the tar thread stop too.
            drop(chunks);
            let _ = worker.await;
            return Err(AgentError::Rejected("the helper hung up".into()));
        }
    }
    worker.await.map_err(|e| AgentError::Io { what: "copy-out thread".into(), source: std::io::Error::other(e) })?
}

async fn background_request(registry: &Registry, req: BackgroundRequest) -> Result<Vec<Frame>, AgentError> {
    let with_output = |(reply, output)| vec![Frame::BackgroundReply(reply), Frame::Stdout(output)];
    Ok(match req {
        BackgroundRequest::Start { name, spec } => {
            let record = registry.start(name, &spec)?;
            vec![Frame::BackgroundReply(super::protocol::BackgroundReply { processes: vec![record], dropped_bytes: 0 })]
        }
        BackgroundRequest::List => vec![Frame::BackgroundReply(registry.list())],
        BackgroundRequest::Log { name, tail_lines } => with_output(registry.log(&name, tail_lines)?),
        BackgroundRequest::Stop { name, grace_ms, tail_lines } => {
            let grace = if grace_ms == 0 { DEFAULT_STOP_GRACE } else { Duration::from_millis(grace_ms.into()) };
            with_output(registry.stop(&name, grace, tail_lines).await?)
        }
    })
}

async fn run(p: Spawned, reader: StreamReceiver, wr: StreamSender) {
    let Spawned { mut child, pid, stdin, mut stdout, stderr } = p;
    if wr.send(Frame::Started(pid)).await.is_err() {
        let _ = tree::kill(pid);
        return;
    }
    // Cleared (on this thread, with no await in between) the moment the
    // process is reaped: from then on its pid may name someone else, so
    // requests may no longer walk its tree.
    let unreaped = Arc::new(AtomicBool::new(true));
    let (stdin_tx, stdin_rx) = mpsc::unbounded_channel();
    let writer = tokio::spawn(feed_stdin(stdin, stdin_rx));
    let control = tokio::spawn(apply_requests(reader, stdin_tx, pid, unreaped.clone()));

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
                Ok(n) if n > 0 => connected = wr.send(Frame::Stdout(out_buf[..n].to_vec())).await.is_ok(),
                _ => out_open = false,
            },
            n = read_opt(&mut stderr, &mut err_buf), if err_open => match n {
                Ok(n) if n > 0 => connected = wr.send(Frame::Stderr(err_buf[..n].to_vec())).await.is_ok(),
                _ => err_open = false,
            },
            st = child.wait(), if status.is_none() => {
                unreaped.store(false, Ordering::Relaxed);
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
            let _ = wr.send(Frame::Exited(st)).await;
        }
        // The helper hung up (a cancelled call) while the process ran.
        None => drop(tree::kill(pid)),
        // It exited and then the helper hung up: what it left behind can
        // only be found by its process group now.
        Some(_) => kill_group(pid),
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

/// Applies stdin and signal frames; a dropped connection kills the tree.
/// A group signal reaches the whole tree (SIGKILL ends it: an exec's
/// timeout) while the process is unreaped, its group afterwards.
async fn apply_requests(
    mut reader: StreamReceiver,
    stdin: mpsc::UnboundedSender<StdinOp>,
    pid: i32,
    unreaped: Arc<AtomicBool>,
) {
    let alive = || unreaped.load(Ordering::Relaxed);
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
                    match (group, alive()) {
                        (true, true) => tree::signal(pid, sig),
                        (true, false) => {
                            let _ = killpg(Pid::from_raw(pid), sig);
                        }
                        (false, _) => {
                            let _ = kill(Pid::from_raw(pid), sig);
                        }
                    }
                }
            }
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => {
                if alive() {
                    let _ = tree::kill(pid);
                } else {
                    kill_group(pid);
                }
                return;
            }
        }
    }
}

async fn feed_stdin(mut stdin: Box<dyn AsyncWrite + Send + Unpin>, mut ops: mpsc::UnboundedReceiver<StdinOp>) {
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

/// The protocol's view of a finished process.
pub fn exit_status(st: std::process::ExitStatus) -> ExitStatus {
    use std::os::unix::process::ExitStatusExt as _;
    match (st.code(), st.signal()) {
        (Some(c), _) => ExitStatus::Code(c),
        (None, Some(s)) => ExitStatus::Signal(s),
        (None, None) => ExitStatus::Code(-1),
    }
}
