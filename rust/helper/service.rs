//! The `VmHelper` gRPC service: the only place proto types and
//! `tonic::Status` appear. Converts requests into domain calls on
//! [`VmManager`] and maps [`HelperError`] to status codes in [`status`].
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::{Stream, StreamExt as _};
use tonic::{Request, Response, Status, Streaming};

use super::error::HelperError;
use super::exec::{self, ExecInput, ExecOutput};
use super::spec::{MountSpec, Network, VmConfig, check_env_key};
use super::vm::{VmInfo, VmManager, VmState};
use crate::agent::protocol::{ExitStatus, StartSpec};
use crate::proto::v1 as pb;
use crate::proto::v1::vm_helper_server::VmHelper;

/// Default StopVm grace period.
const DEFAULT_GRACE: Duration = Duration::from_millis(2000);

/// The service, over a shared VM manager.
pub struct HelperService {
    vms: Arc<VmManager>,
}

impl HelperService {
    /// Serves `vms`.
    pub fn new(vms: Arc<VmManager>) -> Self {
        Self { vms }
    }
}

/// The one mapping from helper errors to gRPC status codes.
pub fn status(e: HelperError) -> Status {
    let msg = e.to_string();
    match e {
        HelperError::InvalidArgument { .. } | HelperError::ExecRejected(_) => {
            Status::invalid_argument(msg)
        }
        HelperError::VmNotFound(_) | HelperError::ImageNotFound(_) => Status::not_found(msg),
        HelperError::AlreadyExists(_) => Status::already_exists(msg),
        HelperError::WrongState { .. } => Status::failed_precondition(msg),
        HelperError::Unavailable(_) => Status::unavailable(msg),
        HelperError::Driver(_)
        | HelperError::Agent(_)
        | HelperError::Image(_)
        | HelperError::Io { .. } => Status::internal(msg),
    }
}

type ExecStream = Pin<Box<dyn Stream<Item = Result<pb::ExecResponse, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl VmHelper for HelperService {
    async fn get_info(
        &self,
        _: Request<pb::GetInfoRequest>,
    ) -> Result<Response<pb::GetInfoResponse>, Status> {
        Ok(Response::new(pb::GetInfoResponse {
            platform: "linux".into(),
            driver: "namespaces".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            capabilities: self.vms.driver().capabilities(),
            image_store: crate::paths::image_store().display().to_string(),
        }))
    }

    async fn create_vm(
        &self,
        req: Request<pb::CreateVmRequest>,
    ) -> Result<Response<pb::CreateVmResponse>, Status> {
        let spec = req
            .into_inner()
            .spec
            .ok_or_else(|| status(HelperError::invalid("spec", "required")))?;
        let config = config_from_proto(spec).map_err(status)?;
        let vm = self.vms.create(config).map_err(status)?;
        Ok(Response::new(pb::CreateVmResponse {
            vm: Some(vm_to_proto(vm)),
        }))
    }

    async fn start_vm(
        &self,
        req: Request<pb::StartVmRequest>,
    ) -> Result<Response<pb::StartVmResponse>, Status> {
        let vm = self.vms.start(&req.into_inner().id).await.map_err(status)?;
        Ok(Response::new(pb::StartVmResponse {
            vm: Some(vm_to_proto(vm)),
        }))
    }

    async fn stop_vm(
        &self,
        req: Request<pb::StopVmRequest>,
    ) -> Result<Response<pb::StopVmResponse>, Status> {
        let req = req.into_inner();
        let grace = if req.grace_ms == 0 {
            DEFAULT_GRACE
        } else {
            Duration::from_millis(req.grace_ms.into())
        };
        let vm = self.vms.stop(&req.id, grace).await.map_err(status)?;
        Ok(Response::new(pb::StopVmResponse {
            vm: Some(vm_to_proto(vm)),
        }))
    }

    async fn delete_vm(
        &self,
        req: Request<pb::DeleteVmRequest>,
    ) -> Result<Response<pb::DeleteVmResponse>, Status> {
        self.vms
            .delete(&req.into_inner().id)
            .await
            .map_err(status)?;
        Ok(Response::new(pb::DeleteVmResponse {}))
    }

    async fn get_vm(
        &self,
        req: Request<pb::GetVmRequest>,
    ) -> Result<Response<pb::GetVmResponse>, Status> {
        let vm = self.vms.get(&req.into_inner().id).map_err(status)?;
        Ok(Response::new(pb::GetVmResponse {
            vm: Some(vm_to_proto(vm)),
        }))
    }

    async fn list_vms(
        &self,
        _: Request<pb::ListVmsRequest>,
    ) -> Result<Response<pb::ListVmsResponse>, Status> {
        Ok(Response::new(pb::ListVmsResponse {
            vms: self.vms.list().into_iter().map(vm_to_proto).collect(),
        }))
    }

    type ExecStream = ExecStream;

    async fn exec(
        &self,
        req: Request<Streaming<pb::ExecRequest>>,
    ) -> Result<Response<ExecStream>, Status> {
        let mut inbound = req.into_inner();
        let first = match inbound.next().await {
            Some(Ok(pb::ExecRequest {
                msg: Some(pb::exec_request::Msg::Start(p)),
            })) => p,
            Some(Err(e)) => return Err(e),
            _ => {
                return Err(status(HelperError::invalid(
                    "start",
                    "the first message must be start",
                )));
            }
        };
        if first.argv.is_empty() || first.argv[0].is_empty() {
            return Err(status(HelperError::invalid(
                "start.argv",
                "must not be empty",
            )));
        }
        for key in first.env.keys() {
            check_env_key("start.env", key).map_err(status)?;
        }
        let target = self.vms.exec_target(&first.vm_id).map_err(status)?;
        let mut env = target.env;
        let mut process_env: Vec<_> = first.env.into_iter().collect();
        process_env.sort();
        env.extend(process_env);
        let spec = StartSpec {
            argv: first.argv,
            env,
            cwd: first.cwd,
            create_cwd: first.create_cwd,
            tty: first.tty,
            tty_cols: u16::try_from(first.tty_cols).unwrap_or(u16::MAX),
            tty_rows: u16::try_from(first.tty_rows).unwrap_or(u16::MAX),
        };
        let (pid, mut sink, mut source) =
            exec::start(&target.socket, spec).await.map_err(status)?;

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
                            Ok(Some(ExecOutput::Exited(st))) => (Ok(response(pb::exec_response::Msg::Exited(exited(st)))), true),
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
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn list_images(
        &self,
        _: Request<pb::ListImagesRequest>,
    ) -> Result<Response<pb::ListImagesResponse>, Status> {
        let images = self
            .vms
            .images()
            .list()
            .map_err(|e| status(HelperError::Image(e.to_string())))?;
        Ok(Response::new(pb::ListImagesResponse {
            images: images
                .into_iter()
                .map(|i| pb::Image {
                    name: i.name,
                    size_bytes: i.size_bytes,
                    created_at_ms: i.created_at_ms,
                    shell: i.shell,
                    package_manager: i.package_manager,
                })
                .collect(),
        }))
    }
}

fn response(msg: pb::exec_response::Msg) -> pb::ExecResponse {
    pb::ExecResponse { msg: Some(msg) }
}

fn exited(st: ExitStatus) -> pb::Exited {
    pb::Exited {
        status: Some(match st {
            ExitStatus::Code(c) => pb::exited::Status::Code(c),
            ExitStatus::Signal(s) => pb::exited::Status::Signal(s),
        }),
    }
}

fn config_from_proto(spec: pb::VmSpec) -> Result<VmConfig, HelperError> {
    let network = match pb::NetworkMode::try_from(spec.network) {
        Ok(pb::NetworkMode::None) => Network::None,
        Ok(pb::NetworkMode::Unspecified | pb::NetworkMode::Egress) => Network::Egress,
        Err(_) => {
            return Err(HelperError::invalid(
                "spec.network",
                format!("unknown network mode {}", spec.network),
            ));
        }
    };
    Ok(VmConfig {
        id: spec.id,
        image: spec.image,
        cpus: spec.cpus,
        memory_bytes: spec.memory_bytes,
        pids_limit: spec.pids_limit,
        mounts: spec
            .mounts
            .into_iter()
            .map(|m| MountSpec {
                host_path: m.host_path.into(),
                guest_path: m.guest_path.into(),
                read_only: m.read_only,
            })
            .collect(),
        env: spec.env.into_iter().collect(),
        hostname: spec.hostname,
        network,
        labels: spec.labels.into_iter().collect(),
    })
}

fn vm_to_proto(vm: VmInfo) -> pb::Vm {
    let c = vm.config;
    pb::Vm {
        spec: Some(pb::VmSpec {
            id: c.id,
            image: c.image,
            cpus: c.cpus,
            memory_bytes: c.memory_bytes,
            pids_limit: c.pids_limit,
            mounts: c
                .mounts
                .into_iter()
                .map(|m| pb::Mount {
                    host_path: m.host_path.display().to_string(),
                    guest_path: m.guest_path.display().to_string(),
                    read_only: m.read_only,
                })
                .collect(),
            env: c.env.into_iter().collect(),
            hostname: c.hostname,
            network: match c.network {
                Network::None => pb::NetworkMode::None,
                Network::Egress => pb::NetworkMode::Egress,
            } as i32,
            labels: c.labels.into_iter().collect(),
        }),
        state: match vm.state {
            VmState::Created => pb::VmState::Created,
            VmState::Running => pb::VmState::Running,
            VmState::Stopped => pb::VmState::Stopped,
        } as i32,
        created_at_ms: vm.created_at_ms,
        started_at_ms: vm.started_at_ms,
        shell: vm.shell,
        stop_reason: vm.stop_reason,
    }
}
