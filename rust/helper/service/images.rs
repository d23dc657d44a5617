//! The image RPCs: ListImages, CommitVm, DeleteImage and BuildImage, with
//! their proto ⇄ domain conversions.
#[cfg(linux_host)]
use tokio::sync::mpsc;
use tonic::{Response, Status};

use super::super::error::HelperError;
use super::super::vm::{CommitRequest, VmManager};
use super::status;
use super::streams::RpcStream;
use crate::image::{BuildRequest, ImageConfig, ImageInfo};
use crate::proto::v1 as pb;

/// Build output lines buffered toward the client; a slow client slows the
/// build's reader instead of growing memory.
#[cfg(linux_host)]
const BUILD_LOG_BUFFER: usize = 256;

pub(super) fn image_to_proto(i: ImageInfo) -> pb::Image {
    let layer_count = u32::try_from(i.layers().len()).unwrap_or(u32::MAX);
    pb::Image {
        name: i.name,
        size_bytes: i.size_bytes,
        created_at_ms: i.created_at_ms,
        shell: i.shell,
        package_manager: i.package_manager,
        parent: i.parent,
        layer_count,
        config: Some(pb::ImageConfig {
            env: i.config.env.into_iter().collect(),
            workdir: i.config.workdir,
            user: i.config.user,
        }),
        labels: i.labels.into_iter().collect(),
        reference: i.reference,
    }
}

pub(super) fn list(vms: &VmManager) -> Result<pb::ListImagesResponse, Status> {
    let images = vms.images().list().map_err(|e| status(e.into()))?;
    Ok(pb::ListImagesResponse { images: images.into_iter().map(image_to_proto).collect() })
}

pub(super) async fn commit(vms: &VmManager, req: pb::CommitVmRequest) -> Result<pb::CommitVmResponse, Status> {
    for key in req.config.iter().flat_map(|c| c.env.keys()) {
        super::super::spec::check_env_key("config.env", key).map_err(status)?;
    }
    let req = CommitRequest {
        vm_id: req.vm_id,
        image: req.image,
        config: req.config.map(|c| ImageConfig { env: c.env.into_iter().collect(), workdir: c.workdir, user: c.user }),
        parent: req.parent,
        labels: req.labels.into_iter().collect(),
    };
    let image = vms.commit(req).await.map_err(status)?;
    Ok(pb::CommitVmResponse { image: Some(image_to_proto(image)) })
}

/// Checks the request up front (so its errors are the call's status, on any
/// host), then builds where this host can.
pub(super) async fn build(
    vms: &VmManager,
    req: pb::BuildImageRequest,
) -> Result<Response<RpcStream<pb::BuildImageResponse>>, Status> {
    let req = BuildRequest::from(req);
    req.check().map_err(|e| status(e.into()))?;
    build_checked(vms, req)
}

/// Checks an existing name up front (its error is the call's status too),
/// then builds in a blocking task, streaming its output.
#[cfg(linux_host)]
fn build_checked(vms: &VmManager, req: BuildRequest) -> Result<Response<RpcStream<pb::BuildImageResponse>>, Status> {
    let mapper = vms.id_mapper().cloned().map_err(|why| status(HelperError::Unavailable(why.to_string())))?;
    if !req.force {
        match vms.images().get(&req.name) {
            // One built for another map is of no use here: the build replaces it.
            Ok(info) if info.check_id_map(mapper.id_map()).is_err() => {}
            Ok(_) => return Err(status(crate::image::ImageError::AlreadyExists(req.name).into())),
            Err(crate::image::ImageError::NotFound(_)) => {}
            Err(e) => return Err(status(e.into())),
        }
    }
    let (tx, rx) = mpsc::channel(BUILD_LOG_BUFFER);
    let store = vms.images().clone();
    tokio::task::spawn_blocking(move || {
        let log = |line: &str| {
            let msg = pb::build_image_response::Msg::Log(line.to_string());
            // A client that went away no longer needs the lines; the build
            // still finishes, as its result is the store's.
            let _ = tx.blocking_send(Ok(pb::BuildImageResponse { msg: Some(msg) }));
        };
        let mut log = log;
        let last = match store.build(&req, &mapper, &mut log) {
            Ok(image) => {
                Ok(pb::BuildImageResponse { msg: Some(pb::build_image_response::Msg::Image(image_to_proto(image))) })
            }
            Err(e) => Err(status(HelperError::from(e))),
        };
        let _ = tx.blocking_send(last);
    });
    Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
}

/// Images are built with mmdebstrap under a Linux id map: a helper
/// elsewhere (a Mac's) has images by reference (`sandbox-mcp image pull`,
/// pulled by its VM layer) and by commit.
#[cfg(not(linux_host))]
fn build_checked(vms: &VmManager, _req: BuildRequest) -> Result<Response<RpcStream<pb::BuildImageResponse>>, Status> {
    let why = vms.id_mapper().err().unwrap_or("not on this host");
    Err(status(HelperError::Unavailable(format!("BuildImage needs Linux (mmdebstrap and user namespaces): {why}"))))
}
