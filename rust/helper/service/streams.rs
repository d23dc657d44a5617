//! The streaming RPCs: Exec, Dial, CopyIn and CopyOut. Each pumps a gRPC
//! stream to or from its domain side (a stream on the VM's agent link) on
//! a task of its own, and ends when either side is done or gone.
use std::pin::Pin;

use tokio::sync::mpsc;
use tokio_stream::{Stream, StreamExt as _};
use tonic::{Response, Status, Streaming};

use super::convert::{exited, start_spec};
use super::status;
use crate::error::HelperError;
use crate::exec::{self, ExecInput, ExecOutput};
use crate::guest::{self, CopyIn, CopyOut, Dialed};
use crate::vm::VmManager;
use sandbox_agent::mux::{StreamReceiver, StreamSender};
use sandbox_agent::protocol::Frame;
use sandbox_contract::v1 as pb;

/// A server stream of `T`.
pub type RpcStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

fn response(msg: pb::exec_response::Msg) -> pb::ExecResponse {
    pb::ExecResponse { msg: Some(msg) }
}

fn stream_of<T: Send + 'static>(rx: mpsc::Receiver<Result<T, Status>>) -> Response<RpcStream<T>> {
    Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
}

/// The quota watcher's reason, as a stderr line, if it stopped the VM's
/// processes since `before`; else, for a process the file size cap killed
/// (SIGXFSZ), what that cap is.
fn quota_notice(
    quota: Option<&crate::quota::Watch>,
    before: Option<u64>,
    status: &sandbox_agent::protocol::ExitStatus,
) -> Option<Vec<u8>> {
    let quota = quota?;
    if Some(quota.stops()) != before {
        return Some(format!("\n{}\n", quota.reading().exceeded).into_bytes());
    }
    (*status == sandbox_agent::protocol::ExitStatus::Signal(libc::SIGXFSZ)).then(|| {
        let cap = crate::quota::size(quota.limit());
        format!("\ndisk quota exceeded: a file reached {cap}, the whole quota and the most any one file may hold; delete files or raise disk in the profile\n")
            .into_bytes()
    })
}

/// `e`, naming the sandbox's task limit if that refused the process.
pub async fn fork_refused(vms: &VmManager, vm_id: &str, e: HelperError) -> HelperError {
    match vms.run_handles(vm_id, "read stats of") {
        Ok(run) => crate::stats::fork_refused(&run, e).await,
        Err(_) => e,
    }
}

fn vm_stopped(id: String) -> Status {
    status(HelperError::WrongState { op: "exec in", id, state: crate::vm::VmState::Stopped })
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
    let (agent, spec) = start_spec(vms, first, "start").map_err(status)?;
    // Whether the disk quota watcher killed processes while this one ran.
    let quota = vms.run_handles(&vm_id, "exec in").ok().map(|r| r.quota);
    let stops_before = quota.as_ref().map(|q| q.stops());
    let (pid, mut sink, mut source) = match exec::start(&vm_id, &agent, spec).await {
        Ok(started) => started,
        // The VM died a moment ago and its exit has not been recorded yet:
        // report what the client will see on its next call anyway.
        Err(HelperError::AgentLost { .. }) => return Err(vm_stopped(vm_id.clone())),
        Err(e) => return Err(status(fork_refused(vms, &vm_id, e).await)),
    };

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
                            if let Some(notice) = quota_notice(quota.as_deref(), stops_before, &st) {
                                let _ = tx.send(Ok(response(pb::exec_response::Msg::Stderr(notice)))).await;
                            }
                            (Ok(response(pb::exec_response::Msg::Exited(exited(st)))), true)
                        }
                        Ok(None) => (Err(Status::internal("the vm agent ended the exec before the process exited (vm stopped?)")), true),
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

/// Dial: the VM's agent connects inside the guest; answer `connected`, then
/// relay bytes both ways with TCP half-close semantics.
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
    let agent = vms.run_handles(&start.vm_id, "dial into").map_err(status)?.agent;
    let Dialed { tx: guest_tx, rx: guest_rx } = guest::dial(&start.vm_id, &agent, start.port).await.map_err(status)?;
    let (tx, rx) = mpsc::channel::<Result<pb::DialResponse, Status>>(8);
    let connected = pb::DialResponse { msg: Some(pb::dial_response::Msg::Connected(pb::Connected {})) };
    if tx.send(Ok(connected)).await.is_err() {
        return Err(Status::cancelled("client went away"));
    }
    // Weak: the response stream must end when the guest closes, even while
    // the client keeps its own side open.
    tokio::spawn(client_to_guest(inbound, guest_tx, tx.downgrade()));
    tokio::spawn(guest_to_client(guest_rx, tx));
    Ok(stream_of(rx))
}

async fn client_to_guest(
    mut inbound: Streaming<pb::DialRequest>,
    guest: StreamSender,
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
            // The client is gone; once the response side notices too, both
            // halves are dropped, which cancels the stream, and the agent
            // closes the guest connection.
            Err(_) => return,
        };
        if data.is_empty() {
            continue;
        }
        if guest.send(Frame::Data(data)).await.is_err() {
            return;
        }
    }
    // close_write, or the client finished sending: the guest reads EOF. The
    // stream stays open while the response side still holds its half.
    let _ = guest.send(Frame::End).await;
}

async fn guest_to_client(mut guest: StreamReceiver, tx: mpsc::Sender<Result<pb::DialResponse, Status>>) {
    loop {
        let read = tokio::select! {
            () = tx.closed() => return,
            r = guest.next() => r,
        };
        let msg = match read {
            Ok(Some(Frame::Data(buf))) => Ok(pb::DialResponse { msg: Some(pb::dial_response::Msg::Data(buf)) }),
            Ok(Some(Frame::End)) | Ok(None) => return,
            Ok(Some(Frame::Fail { message, .. })) => Err(guest_failed(message)),
            Ok(Some(_)) => continue,
            Err(e) => Err(guest_failed(e)),
        };
        let last = msg.is_err();
        if tx.send(msg).await.is_err() || last {
            return;
        }
    }
}

/// A dialled guest connection's failure. Its message is the guest's own
/// (a vm guest's root can answer in its agent's place), so it is bounded
/// like every other status message.
fn guest_failed(what: impl std::fmt::Display) -> Status {
    Status::unavailable(super::bounded(format!("guest connection: {what}")))
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
    let mut copy = CopyIn::start(&start.vm_id, &target.agent, start.dest_dir).await.map_err(status)?;
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
    let mut copy = CopyOut::start(&req.vm_id, &target.agent, req.path).await.map_err(status)?;
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

#[cfg(test)]
mod tests {
    #[test]
    fn a_guest_answering_a_dial_with_a_huge_failure_is_cut_to_fit_a_trailer() {
        // Past hyper's 16 KiB header list the client would end the whole
        // connection, every sandbox's calls on it with this one.
        let s = super::guest_failed("x".repeat(16 << 20));
        assert_eq!(s.code(), tonic::Code::Unavailable);
        assert!(s.message().len() <= super::super::MAX_MESSAGE, "{}", s.message().len());
        assert!(s.message().starts_with("guest connection: x"), "{}", &s.message()[..40]);
    }
}
