//! The streaming RPCs: Exec, Dial, CopyIn and CopyOut. Each pumps a gRPC
//! stream to or from its domain side (agent connection or guest socket) on
//! a task of its own, and ends when either side is done or gone.
use std::pin::Pin;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::mpsc;
use tokio_stream::{Stream, StreamExt as _};
use tonic::{Response, Status, Streaming};

use super::convert::{exited, start_spec};
use super::status;
use crate::helper::dial;
use crate::helper::error::HelperError;
use crate::helper::exec::{self, ExecInput, ExecOutput};
use crate::helper::guest::{CopyIn, CopyOut};
use crate::helper::vm::VmManager;
use crate::proto::v1 as pb;

/// A server stream of `T`.
pub type RpcStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// Bytes read from a guest socket per DialResponse: large, because
/// per-message overhead dominates port-forwarding throughput.
const DIAL_CHUNK: usize = 256 * 1024;

fn response(msg: pb::exec_response::Msg) -> pb::ExecResponse {
    pb::ExecResponse { msg: Some(msg) }
}

fn stream_of<T: Send + 'static>(rx: mpsc::Receiver<Result<T, Status>>) -> Response<RpcStream<T>> {
    Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
}

/// The quota watcher's reason, as a stderr line, if it stopped the VM's
/// processes since `before`.
fn quota_notice(quota: Option<&crate::helper::quota::Watch>, before: Option<u64>) -> Option<Vec<u8>> {
    let quota = quota?;
    (Some(quota.stops()) != before).then(|| format!("\n{}\n", quota.reading().exceeded).into_bytes())
}

fn vm_stopped(id: String) -> Status {
    status(HelperError::WrongState { op: "exec in", id, state: crate::helper::vm::VmState::Stopped })
}

/// Exec: start the process, then relay stdin/signals in and output out.
pub async fn exec(
    vms: &VmManager,
    mut inbound: Streaming<pb::ExecRequest>,
) -> Result<Response<RpcStream<pb::ExecResponse>>, Status> {
    let first = match inbound.next().await {
        Some(Ok(pb::ExecRequest { msg: Some(pb::exec_request::Msg::Start(p)) })) => p,
        Some(Err(e)) => return Err(e),
        _ => {
            return Err(status(HelperError::invalid("start", "the first message must be start")));
        }
    };
    let vm_id = first.vm_id.clone();
    let (socket, spec) = start_spec(vms, first, "start").map_err(status)?;
    // Whether the disk quota watcher killed processes while this one ran.
    let quota = vms.run_handles(&vm_id, "exec in").ok().map(|r| r.quota);
    let stops_before = quota.as_ref().map(|q| q.stops());
    let (pid, mut sink, mut source) = exec::start(&socket, spec).await.map_err(|e| {
        // The VM died a moment ago and its exit has not been recorded yet:
        // report what the client will see on its next call anyway.
        let gone = |k: std::io::ErrorKind| {
            use std::io::ErrorKind::*;
            matches!(k, ConnectionRefused | NotFound | ConnectionReset | BrokenPipe | UnexpectedEof)
        };
        match e {
            HelperError::Io { ref source, .. } if gone(source.kind()) => vm_stopped(vm_id),
            HelperError::Agent(crate::agent::protocol::ProtocolError::Io(ref source)) if gone(source.kind()) => {
                vm_stopped(vm_id)
            }
            HelperError::Agent(crate::agent::protocol::ProtocolError::Truncated) => vm_stopped(vm_id),
            other => status(other),
        }
    })?;

    let (tx, rx) = mpsc::channel::<Result<pb::ExecResponse, Status>>(16);
    let started = response(pb::exec_response::Msg::Started(pb::Started { pid }));
    if tx.send(Ok(started)).await.is_err() {
        return Err(Status::cancelled("client went away"));
    }
    tokio::spawn(async move {
        let mut inbound_open = true;
        let mut stdin_closed = false;
        loop {
            tokio::select! {
                // Client gone: returning drops the agent connection,
                // and the agent kills the process group.
                () = tx.closed() => return,
                msg = inbound.next(), if inbound_open => {
                    let input = match msg {
                        Some(Ok(req)) => match req.msg {
                            Some(pb::exec_request::Msg::Stdin(b)) => ExecInput::Stdin(b),
                            Some(pb::exec_request::Msg::CloseStdin(_)) => ExecInput::CloseStdin,
                            Some(pb::exec_request::Msg::Signal(s)) => {
                                ExecInput::Signal { signal: s.signal, group: s.process_group }
                            }
                            Some(pb::exec_request::Msg::Start(_)) => {
                                let e = HelperError::invalid("start", "may only be the first message");
                                let _ = tx.send(Err(status(e))).await;
                                return;
                            }
                            None => continue,
                        },
                        // The client finished sending; its process reads EOF.
                        None => {
                            inbound_open = false;
                            ExecInput::CloseStdin
                        }
                        Some(Err(_)) => return,
                    };
                    if input == ExecInput::CloseStdin {
                        if stdin_closed {
                            continue;
                        }
                        stdin_closed = true;
                    }
                    if sink.send(input).await.is_err() {
                        inbound_open = false;
                    }
                },
                out = source.next() => {
                    let (msg, last) = match out {
                        Ok(Some(ExecOutput::Stdout(b))) => (Ok(response(pb::exec_response::Msg::Stdout(b))), false),
                        Ok(Some(ExecOutput::Stderr(b))) => (Ok(response(pb::exec_response::Msg::Stderr(b))), false),
                        Ok(Some(ExecOutput::Exited(st))) => {
                            if let Some(notice) = quota_notice(quota.as_deref(), stops_before) {
                                let _ = tx.send(Ok(response(pb::exec_response::Msg::Stderr(notice)))).await;
                            }
                            (Ok(response(pb::exec_response::Msg::Exited(exited(st)))), true)
                        }
                        Ok(None) => (Err(Status::internal("the vm agent hung up before the process exited (vm stopped?)")), true),
                        Err(e) => (Err(status(e)), true),
                    };
                    if tx.send(msg).await.is_err() || last {
                        return;
                    }
                },
            }
        }
    });
    Ok(stream_of(rx))
}

/// Dial: connect inside the VM, answer `connected`, then relay bytes both
/// ways with TCP half-close semantics.
pub async fn dial(
    vms: &VmManager,
    mut inbound: Streaming<pb::DialRequest>,
) -> Result<Response<RpcStream<pb::DialResponse>>, Status> {
    let start = match inbound.next().await {
        Some(Ok(pb::DialRequest { msg: Some(pb::dial_request::Msg::Start(s)) })) => s,
        Some(Err(e)) => return Err(e),
        _ => {
            return Err(status(HelperError::invalid("start", "the first message must be start")));
        }
    };
    let run = vms.run_handles(&start.vm_id, "dial into").map_err(status)?;
    let stream = dial::connect(&start.vm_id, run.ns, start.port).await.map_err(status)?;
    let (guest_rd, guest_wr) = stream.into_split();
    let (tx, rx) = mpsc::channel::<Result<pb::DialResponse, Status>>(8);
    let connected = pb::DialResponse { msg: Some(pb::dial_response::Msg::Connected(pb::Connected {})) };
    if tx.send(Ok(connected)).await.is_err() {
        return Err(Status::cancelled("client went away"));
    }
    // Weak: the response stream must end when the guest closes, even while
    // the client keeps its own side open.
    tokio::spawn(client_to_guest(inbound, guest_wr, tx.downgrade()));
    tokio::spawn(guest_to_client(guest_rd, tx));
    Ok(stream_of(rx))
}

async fn client_to_guest(
    mut inbound: Streaming<pb::DialRequest>,
    mut guest: OwnedWriteHalf,
    tx: mpsc::WeakSender<Result<pb::DialResponse, Status>>,
) {
    while let Some(msg) = inbound.next().await {
        let data = match msg {
            Ok(pb::DialRequest { msg: Some(pb::dial_request::Msg::Data(b)) }) => b,
            Ok(pb::DialRequest { msg: Some(pb::dial_request::Msg::CloseWrite(_)) }) => break,
            Ok(pb::DialRequest { msg: Some(pb::dial_request::Msg::Start(_)) }) => {
                let e = HelperError::invalid("start", "may only be the first message");
                if let Some(tx) = tx.upgrade() {
                    let _ = tx.send(Err(status(e))).await;
                }
                return;
            }
            Ok(pb::DialRequest { msg: None }) => continue,
            // The client is gone; dropping the write half (and the
            // response side noticing) closes the guest connection.
            Err(_) => return,
        };
        if guest.write_all(&data).await.is_err() {
            return;
        }
    }
    // close_write, or the client finished sending: the guest reads EOF.
    let _ = guest.shutdown().await;
}

async fn guest_to_client(mut guest: OwnedReadHalf, tx: mpsc::Sender<Result<pb::DialResponse, Status>>) {
    loop {
        let mut buf = Vec::with_capacity(DIAL_CHUNK);
        let read = tokio::select! {
            () = tx.closed() => return,
            r = guest.read_buf(&mut buf) => r,
        };
        let msg = match read {
            Ok(0) => return,
            Ok(_) => Ok(pb::DialResponse { msg: Some(pb::dial_response::Msg::Data(buf)) }),
            Err(e) => Err(Status::unavailable(format!("guest connection: {e}"))),
        };
        let last = msg.is_err();
        if tx.send(msg).await.is_err() || last {
            return;
        }
    }
}

/// CopyIn: relay the tar stream to the agent, which extracts it.
pub async fn copy_in(
    vms: &VmManager,
    mut inbound: Streaming<pb::CopyInRequest>,
) -> Result<Response<pb::CopyInResponse>, Status> {
    let start = match inbound.next().await {
        Some(Ok(pb::CopyInRequest { msg: Some(pb::copy_in_request::Msg::Start(s)) })) => s,
        Some(Err(e)) => return Err(e),
        _ => {
            return Err(status(HelperError::invalid("start", "the first message must be start")));
        }
    };
    if !start.dest_dir.starts_with('/') {
        return Err(status(HelperError::invalid(
            "start.dest_dir",
            format!("{:?} must be an absolute path", start.dest_dir),
        )));
    }
    let target = vms.exec_target(&start.vm_id).map_err(status)?;
    let mut copy = CopyIn::start(&target.socket, start.dest_dir).await.map_err(status)?;
    loop {
        tokio::select! {
            // The agent answers before the end only when it gave up.
            outcome = copy.outcome() => {
                return Err(status(outcome.err().unwrap_or_else(|| HelperError::io(
                    "agent protocol",
                    std::io::Error::other("the agent finished before the tar stream did"),
                ))));
            }
            msg = inbound.next() => match msg {
                Some(Ok(pb::CopyInRequest { msg: Some(pb::copy_in_request::Msg::Data(b)) })) => {
                    if copy.send(b).await.is_err() {
                        break;
                    }
                }
                Some(Ok(pb::CopyInRequest { msg: Some(pb::copy_in_request::Msg::Start(_)) })) => {
                    return Err(status(HelperError::invalid("start", "may only be the first message")));
                }
                Some(Ok(pb::CopyInRequest { msg: None })) => {}
                Some(Err(e)) => return Err(e),
                None => break,
            },
        }
    }
    let copied = copy.finish().await.map_err(status)?;
    Ok(Response::new(pb::CopyInResponse { files: copied.files, bytes: copied.bytes }))
}

/// CopyOut: relay the agent's tar stream to the client.
pub async fn copy_out(
    vms: &VmManager,
    req: pb::CopyOutRequest,
) -> Result<Response<RpcStream<pb::CopyOutResponse>>, Status> {
    if !req.path.starts_with('/') {
        return Err(status(HelperError::invalid("path", format!("{:?} must be an absolute path", req.path))));
    }
    let target = vms.exec_target(&req.vm_id).map_err(status)?;
    let mut copy = CopyOut::start(&target.socket, req.path).await.map_err(status)?;
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(async move {
        loop {
            let msg = tokio::select! {
                () = tx.closed() => return,
                next = copy.next() => next,
            };
            let (msg, last) = match msg {
                Ok(Some(data)) => (Ok(pb::CopyOutResponse { data }), false),
                Ok(None) => return,
                Err(e) => (Err(status(e)), true),
            };
            if tx.send(msg).await.is_err() || last {
                return;
            }
        }
    });
    Ok(stream_of(rx))
}
