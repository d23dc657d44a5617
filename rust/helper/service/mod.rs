//! The `VmHelper` gRPC service: the only place proto types and
//! `tonic::Status` appear. Converts requests into domain calls on
//! [`VmManager`] and maps [`HelperError`] to status codes in [`status`].
//!
//! - [`streams`]: the streaming RPCs (Exec, Dial, CopyIn, CopyOut).
//! - [`convert`]: proto ⇄ domain conversions.
//! - [`images`]: the image RPCs.
use std::sync::Arc;
use std::time::Duration;

use tonic::{Request, Response, Status, Streaming};

use super::agent_link::AgentLink;
use super::error::HelperError;
use super::vm::VmManager;
use sandbox_agent::protocol::{BackgroundRequest, FailKind};
use sandbox_contract::v1 as pb;
use sandbox_contract::v1::vm_helper_server::VmHelper;
use sandbox_image::{ImageError, oci::OciError};

mod convert;
mod images;
mod streams;

use convert::{background_to_proto, config_from_proto, driver_to_proto, seed_files, start_spec, vm_to_proto};
use streams::RpcStream;

/// What this helper does with images and VMs on top of the driver's
/// capabilities.
const IMAGE_CAPABILITIES: &[&str] =
    &["images.commit", "images.delete", "images.build", "images.layers", "vm.clone", "process.user"];

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

impl HelperService {
    /// Run a state-changing operation to its end even if the client hangs
    /// up: tonic drops the handler of a caller that went away, and a VM left
    /// half stopped or half deleted would stay registered as running.
    async fn completing<T, F>(&self, op: impl FnOnce(Arc<VmManager>) -> F) -> Result<T, Status>
    where
        F: std::future::Future<Output = Result<T, HelperError>> + Send + 'static,
        T: Send + 'static,
    {
        match tokio::spawn(op(self.vms.clone())).await {
            Ok(result) => result.map_err(status),
            Err(e) => Err(Status::internal(bounded(format!("VM operation failed: {e}")))),
        }
    }

    /// The agent link of running VM `id`.
    fn agent(&self, id: &str) -> Result<Arc<AgentLink>, Status> {
        self.vms.exec_target(id).map(|t| t.agent).map_err(status)
    }
}

/// The longest error message a status carries. Messages echo what the
/// request held (an id, a path): the message travels in a trailer, and one
/// past the client's header list limit (16 KiB in hyper) makes the client
/// end the whole connection (GOAWAY, ENHANCE_YOUR_CALM) rather than fail
/// the one call.
pub(super) const MAX_MESSAGE: usize = 4 << 10;

/// `msg`, cut at a char boundary to at most [`MAX_MESSAGE`] bytes.
pub(super) fn bounded(mut msg: String) -> String {
    if msg.len() > MAX_MESSAGE {
        let mut end = MAX_MESSAGE - 3;
        while !msg.is_char_boundary(end) {
            end -= 1;
        }
        msg.truncate(end);
        msg.push_str("...");
    }
    msg
}

/// The one mapping from helper errors to gRPC status codes.
pub fn status(e: HelperError) -> Status {
    let msg = bounded(e.to_string());
    match e {
        HelperError::InvalidArgument { .. } | HelperError::ExecRejected(_) => Status::invalid_argument(msg),
        HelperError::VmNotFound(_) | HelperError::ImageNotFound(_) => Status::not_found(msg),
        HelperError::AlreadyExists(_) => Status::already_exists(msg),
        HelperError::ProcessLimit { .. } => Status::resource_exhausted(msg),
        HelperError::WrongState { .. } | HelperError::DriverUnusable { .. } => Status::failed_precondition(msg),
        HelperError::Unavailable(_) | HelperError::DialRefused { .. } | HelperError::AgentLost { .. } => {
            Status::unavailable(msg)
        }
        HelperError::Guest { kind, .. } => match kind {
            FailKind::Invalid => Status::invalid_argument(msg),
            FailKind::NotFound => Status::not_found(msg),
            FailKind::AlreadyExists => Status::already_exists(msg),
            FailKind::Exhausted | FailKind::ForkRefused => Status::resource_exhausted(msg),
            FailKind::Internal => Status::internal(msg),
            FailKind::Refused => Status::unavailable(msg),
        },
        HelperError::Image(e) => match e {
            ImageError::InvalidName(_)
            | ImageError::InvalidPackage(_)
            | ImageError::InvalidSuite(_)
            | ImageError::InvalidReference(_) => Status::invalid_argument(msg),
            ImageError::NotFound(_) => Status::not_found(msg),
            ImageError::AlreadyExists(_) => Status::already_exists(msg),
            ImageError::HasChildren { .. }
            | ImageError::TooManyLayers { .. }
            | ImageError::OtherIdMap { .. }
            | ImageError::NeedsPull { .. } => Status::failed_precondition(msg),
            ImageError::Oci(e) => match e {
                OciError::InvalidReference { .. } => Status::invalid_argument(msg),
                OciError::Unauthorized { .. } => Status::permission_denied(msg),
                OciError::Registry { .. } => Status::unavailable(msg),
                OciError::NoPlatform { .. } => Status::not_found(msg),
                OciError::Cancelled => Status::cancelled(msg),
                OciError::DigestMismatch { .. } | OciError::BadDigest(_) => Status::data_loss(msg),
                OciError::Malformed { .. } => Status::failed_precondition(msg),
                OciError::Io { .. } => Status::internal(msg),
            },
            _ => Status::internal(msg),
        },
        HelperError::Driver(_) | HelperError::Io { .. } => Status::internal(msg),
    }
}

#[tonic::async_trait]
impl VmHelper for HelperService {
    async fn get_info(&self, _: Request<pb::GetInfoRequest>) -> Result<Response<pb::GetInfoResponse>, Status> {
        let drivers = self.vms.drivers();
        let (warm_starts, cold_starts) =
            drivers.iter().map(|d| d.launch_counts()).fold((0, 0), |(w, c), (dw, dc)| (w + dw, c + dc));
        let mut capabilities = drivers.first().map(|d| d.capabilities().names()).unwrap_or_default();
        if self.vms.id_mapper().is_ok() {
            capabilities.push("userns".into());
        }
        capabilities.extend(IMAGE_CAPABILITIES.iter().map(|c| c.to_string()));
        Ok(Response::new(pb::GetInfoResponse {
            platform: "linux".into(),
            driver: drivers.first().map(|d| d.name().to_string()).unwrap_or_default(),
            version: env!("CARGO_PKG_VERSION").into(),
            capabilities,
            image_store: sandbox_base::paths::image_store().display().to_string(),
            warm_starts,
            cold_starts,
            drivers: drivers.iter().enumerate().map(|(i, d)| driver_to_proto(d.as_ref(), i == 0)).collect(),
        }))
    }

    async fn create_vm(&self, req: Request<pb::CreateVmRequest>) -> Result<Response<pb::CreateVmResponse>, Status> {
        let mut spec = req.into_inner().spec.ok_or_else(|| status(HelperError::invalid("spec", "required")))?;
        let files = seed_files(std::mem::take(&mut spec.files)).map_err(status)?;
        let config = config_from_proto(spec).map_err(status)?;
        let vm = self.completing(move |vms| async move { vms.create(config, files).await }).await?;
        Ok(Response::new(pb::CreateVmResponse { vm: Some(vm_to_proto(vm)) }))
    }

    async fn start_vm(&self, req: Request<pb::StartVmRequest>) -> Result<Response<pb::StartVmResponse>, Status> {
        let id = req.into_inner().id;
        let vm = self.completing(move |vms| async move { vms.start(&id).await }).await?;
        Ok(Response::new(pb::StartVmResponse { vm: Some(vm_to_proto(vm)) }))
    }

    async fn stop_vm(&self, req: Request<pb::StopVmRequest>) -> Result<Response<pb::StopVmResponse>, Status> {
        let req = req.into_inner();
        let grace = if req.grace_ms == 0 { DEFAULT_GRACE } else { Duration::from_millis(req.grace_ms.into()) };
        let vm = self.completing(move |vms| async move { vms.stop(&req.id, grace).await }).await?;
        Ok(Response::new(pb::StopVmResponse { vm: Some(vm_to_proto(vm)) }))
    }

    async fn delete_vm(&self, req: Request<pb::DeleteVmRequest>) -> Result<Response<pb::DeleteVmResponse>, Status> {
        let id = req.into_inner().id;
        self.completing(move |vms| async move { vms.delete(&id).await }).await?;
        Ok(Response::new(pb::DeleteVmResponse {}))
    }

    async fn get_vm(&self, req: Request<pb::GetVmRequest>) -> Result<Response<pb::GetVmResponse>, Status> {
        let vm = self.vms.get(&req.into_inner().id).map_err(status)?;
        Ok(Response::new(pb::GetVmResponse { vm: Some(vm_to_proto(vm)) }))
    }

    async fn list_vms(&self, _: Request<pb::ListVmsRequest>) -> Result<Response<pb::ListVmsResponse>, Status> {
        Ok(Response::new(pb::ListVmsResponse { vms: self.vms.list().into_iter().map(vm_to_proto).collect() }))
    }

    type ExecStream = RpcStream<pb::ExecResponse>;

    async fn exec(&self, req: Request<Streaming<pb::ExecRequest>>) -> Result<Response<Self::ExecStream>, Status> {
        streams::exec(&self.vms, req.into_inner()).await
    }

    async fn list_images(&self, _: Request<pb::ListImagesRequest>) -> Result<Response<pb::ListImagesResponse>, Status> {
        images::list(&self.vms).map(Response::new)
    }

    async fn commit_vm(&self, req: Request<pb::CommitVmRequest>) -> Result<Response<pb::CommitVmResponse>, Status> {
        // Like `completing`: a commit dropped midway would leave the VM's
        // processes stopped until the guards run, and the layer half copied.
        let (vms, req) = (self.vms.clone(), req.into_inner());
        match tokio::spawn(async move { images::commit(&vms, req).await }).await {
            Ok(result) => result.map(Response::new),
            Err(e) => Err(Status::internal(bounded(format!("commit failed: {e}")))),
        }
    }

    async fn delete_image(
        &self,
        req: Request<pb::DeleteImageRequest>,
    ) -> Result<Response<pb::DeleteImageResponse>, Status> {
        let name = req.into_inner().name;
        self.completing(move |vms| async move { vms.delete_image(&name).await }).await?;
        Ok(Response::new(pb::DeleteImageResponse {}))
    }

    type BuildImageStream = RpcStream<pb::BuildImageResponse>;

    async fn build_image(
        &self,
        req: Request<pb::BuildImageRequest>,
    ) -> Result<Response<Self::BuildImageStream>, Status> {
        images::build(&self.vms, req.into_inner()).await
    }

    type PullImageStream = RpcStream<pb::PullImageResponse>;

    async fn pull_image(&self, req: Request<pb::PullImageRequest>) -> Result<Response<Self::PullImageStream>, Status> {
        images::pull(&self.vms, req.into_inner()).await
    }

    type DialStream = RpcStream<pb::DialResponse>;

    async fn dial(&self, req: Request<Streaming<pb::DialRequest>>) -> Result<Response<Self::DialStream>, Status> {
        streams::dial(&self.vms, req.into_inner()).await
    }

    async fn copy_in(
        &self,
        req: Request<Streaming<pb::CopyInRequest>>,
    ) -> Result<Response<pb::CopyInResponse>, Status> {
        streams::copy_in(&self.vms, req.into_inner()).await
    }

    type CopyOutStream = RpcStream<pb::CopyOutResponse>;

    async fn copy_out(&self, req: Request<pb::CopyOutRequest>) -> Result<Response<Self::CopyOutStream>, Status> {
        streams::copy_out(&self.vms, req.into_inner()).await
    }

    async fn stats(&self, req: Request<pb::StatsRequest>) -> Result<Response<pb::StatsResponse>, Status> {
        let run = self.vms.run_handles(&req.into_inner().vm_id, "read stats of").map_err(status)?;
        let u = super::stats::read(&run).await.map_err(status)?;
        let disk = (run.quota.reading(), run.quota.limit());
        Ok(Response::new(pb::StatsResponse {
            disk_used_bytes: disk.0.used,
            disk_limit_bytes: disk.1,
            disk_quota_exceeded: disk.0.exceeded,
            cpu_usage_ns: u.cpu_usage_ns,
            memory_used_bytes: u.memory_used_bytes,
            memory_limit_bytes: u.limits.memory_limit_bytes,
            pids: u.pids,
            pids_limit: u.limits.pids_limit,
            net_rx_bytes: u.net_rx_bytes,
            net_tx_bytes: u.net_tx_bytes,
            uptime_ms: u.uptime_ms,
            oom_killed: u.limits.oom_killed,
            limits_not_enforced: run.instance.limits_not_enforced(),
        }))
    }

    async fn start_background(
        &self,
        req: Request<pb::StartBackgroundRequest>,
    ) -> Result<Response<pb::StartBackgroundResponse>, Status> {
        let req = req.into_inner();
        sandbox_agent::protocol::check_name(&req.name)
            .map_err(|e| status(HelperError::invalid("name", e.to_string())))?;
        let process = req.process.ok_or_else(|| status(HelperError::invalid("process", "required")))?;
        if process.tty {
            return Err(status(HelperError::invalid("process.tty", "not supported for background processes")));
        }
        let vm_id = process.vm_id.clone();
        let (agent, spec) = start_spec(&self.vms, process, "process").map_err(status)?;
        let start = BackgroundRequest::Start { name: req.name, spec };
        let (reply, _) = match super::guest::background(&agent, start).await {
            Ok(done) => done,
            Err(e) => return Err(status(streams::fork_refused(&self.vms, &vm_id, e).await)),
        };
        Ok(Response::new(pb::StartBackgroundResponse {
            process: reply.processes.into_iter().next().map(background_to_proto),
        }))
    }

    async fn list_background(
        &self,
        req: Request<pb::ListBackgroundRequest>,
    ) -> Result<Response<pb::ListBackgroundResponse>, Status> {
        let agent = self.agent(&req.into_inner().vm_id)?;
        let (reply, _) = super::guest::background(&agent, BackgroundRequest::List).await.map_err(status)?;
        Ok(Response::new(pb::ListBackgroundResponse {
            processes: reply.processes.into_iter().map(background_to_proto).collect(),
        }))
    }

    async fn read_background_log(
        &self,
        req: Request<pb::ReadBackgroundLogRequest>,
    ) -> Result<Response<pb::ReadBackgroundLogResponse>, Status> {
        let req = req.into_inner();
        let agent = self.agent(&req.vm_id)?;
        let log = BackgroundRequest::Log { name: req.name, tail_lines: req.tail_lines };
        let (reply, output) = super::guest::background(&agent, log).await.map_err(status)?;
        Ok(Response::new(pb::ReadBackgroundLogResponse {
            process: reply.processes.into_iter().next().map(background_to_proto),
            output,
            dropped_bytes: reply.dropped_bytes,
        }))
    }

    async fn stop_background(
        &self,
        req: Request<pb::StopBackgroundRequest>,
    ) -> Result<Response<pb::StopBackgroundResponse>, Status> {
        let req = req.into_inner();
        let agent = self.agent(&req.vm_id)?;
        let stop = BackgroundRequest::Stop { name: req.name, grace_ms: req.grace_ms, tail_lines: req.tail_lines };
        let (reply, output) = super::guest::background(&agent, stop).await.map_err(status)?;
        Ok(Response::new(pb::StopBackgroundResponse {
            process: reply.processes.into_iter().next().map(background_to_proto),
            output,
        }))
    }

    async fn network_events(
        &self,
        req: Request<pb::NetworkEventsRequest>,
    ) -> Result<Response<pb::NetworkEventsResponse>, Status> {
        let snapshot = self.vms.network_events(&req.into_inner().vm_id).map_err(status)?;
        Ok(Response::new(snapshot.into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_echoing_a_huge_id_is_cut_to_fit_a_trailer() {
        let id = "é".repeat(40 << 10);
        let s = status(HelperError::VmNotFound(id));
        assert_eq!(s.code(), tonic::Code::NotFound);
        assert!(s.message().len() <= MAX_MESSAGE && s.message().ends_with("..."), "{}", s.message().len());
        let short = status(HelperError::VmNotFound("vm-1".into()));
        assert!(!short.message().ends_with("..."), "{}", short.message());
    }
}
