//! The image RPCs: ListImages, CommitVm, DeleteImage, BuildImage and
//! PullImage, with their proto ⇄ domain conversions.
#[cfg(linux_host)]
use tokio::sync::mpsc;
#[cfg(linux_host)]
use tokio_util::sync::CancellationToken;
use tonic::{Response, Status};

use super::super::error::HelperError;
use super::super::vm::{CommitRequest, VmManager};
use super::status;
use super::streams::RpcStream;
use sandbox_contract::v1 as pb;
use sandbox_image::oci::Reference;
#[cfg(linux_host)]
use sandbox_image::oci::{LayerState, OciError, PullProgress, RegistryConfig};
use sandbox_image::{BuildRequest, ImageConfig, ImageError, ImageInfo};

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
        config: Some(config_to_proto(i.config)),
        labels: i.labels.into_iter().collect(),
        reference: i.reference,
        source: i.source,
    }
}

/// An image's config on the wire (both types are other crates': the
/// orphan rule leaves a function, not `From`).
fn config_to_proto(c: ImageConfig) -> pb::ImageConfig {
    pb::ImageConfig {
        env: c.env.into_iter().collect(),
        workdir: c.workdir,
        user: c.user,
        entrypoint: c.entrypoint,
        cmd: c.cmd,
        exposed_ports: c.exposed_ports,
    }
}

/// An image's config from the wire.
fn config_from_proto(c: pb::ImageConfig) -> ImageConfig {
    ImageConfig {
        env: c.env.into_iter().collect(),
        workdir: c.workdir,
        user: c.user,
        entrypoint: c.entrypoint,
        cmd: c.cmd,
        exposed_ports: c.exposed_ports,
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
        config: req.config.map(config_from_proto),
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
    let req = BuildRequest { name: req.name, suite: req.release, packages: req.packages, force: req.force };
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
            Ok(_) => return Err(status(ImageError::AlreadyExists(req.name).into())),
            Err(ImageError::NotFound(_)) => {}
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

/// Checks the reference up front (its error is the call's status, on any
/// host), then pulls where this host can unpack.
pub(super) async fn pull(
    vms: &VmManager,
    req: pb::PullImageRequest,
) -> Result<Response<RpcStream<pb::PullImageResponse>>, Status> {
    let reference = Reference::parse(&req.reference).map_err(|e| status(ImageError::from(e).into()))?;
    sandbox_image::validate_name(&req.name).map_err(|e| status(e.into()))?;
    pull_checked(vms, reference, req)
}

/// Pulls into the store's blob store (cancelled when the client goes away),
/// then unpacks in a blocking task. Blob progress is best effort: a slow
/// client misses some byte counts, never the image or the error.
#[cfg(linux_host)]
fn pull_checked(
    vms: &VmManager,
    reference: Reference,
    req: pb::PullImageRequest,
) -> Result<Response<RpcStream<pb::PullImageResponse>>, Status> {
    use pb::pull_image_response::Msg;
    let mapper = vms.id_mapper().cloned().map_err(|why| status(HelperError::Unavailable(why.to_string())))?;
    let store = vms.images().clone();
    store.check_replaceable(&req.name, req.force).map_err(|e| status(e.into()))?;
    let cfg = RegistryConfig {
        mirrors: req.mirrors.into_iter().map(|m| (m.registry, m.mirrors)).collect(),
        insecure: req.insecure_registries,
    };
    let (tx, rx) = mpsc::channel(BUILD_LOG_BUFFER);
    let cancel = CancellationToken::new();
    let gone = {
        let (tx, cancel) = (tx.clone(), cancel.clone());
        tokio::spawn(async move {
            tx.closed().await;
            cancel.cancel();
        })
    };
    tokio::spawn(async move {
        let blobs = store.blobs();
        let progress = |p: PullProgress| {
            let blob = pb::BlobProgress {
                digest: p.digest,
                done: p.done,
                total: p.total,
                present: p.state == LayerState::Present,
                layer: u32::try_from(p.layer).unwrap_or(u32::MAX),
                layers: u32::try_from(p.layers).unwrap_or(u32::MAX),
            };
            let _ = tx.try_send(Ok(pb::PullImageResponse { msg: Some(Msg::Blob(blob)) }));
        };
        let fetched = sandbox_image::oci::pull(&reference, &cfg, &blobs, &progress, &cancel).await;
        let installed = match fetched {
            Ok(_) if cancel.is_cancelled() => Err(ImageError::from(OciError::Cancelled)),
            Ok(image) => {
                let (name, force, tx) = (req.name, req.force, tx.clone());
                tokio::task::spawn_blocking(move || {
                    let mut log = |line: &str| {
                        let _ = tx.blocking_send(Ok(pb::PullImageResponse { msg: Some(Msg::Log(line.to_string())) }));
                    };
                    store.add_oci(&name, &image, &blobs, &mapper, force, &mut log)
                })
                .await
                .unwrap_or_else(|e| Err(ImageError::Unpack(format!("the unpacking task failed: {e}"))))
            }
            Err(e) => Err(e.into()),
        };
        let last = match installed {
            Ok(image) => Ok(pb::PullImageResponse { msg: Some(Msg::Image(image_to_proto(image))) }),
            Err(e) => Err(status(e.into())),
        };
        let _ = tx.send(last).await;
        gone.abort();
    });
    Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
}

/// Pulled images are unpacked under a Linux id map; a Mac's VM layer pulls
/// the references `sandbox-mcp image pull` records.
#[cfg(not(linux_host))]
fn pull_checked(
    vms: &VmManager,
    _reference: Reference,
    _req: pb::PullImageRequest,
) -> Result<Response<RpcStream<pb::PullImageResponse>>, Status> {
    let why = vms.id_mapper().err().unwrap_or("not on this host");
    Err(status(HelperError::Unavailable(format!(
        "PullImage needs Linux (user namespaces to unpack layers): {why}; `sandbox-mcp image pull` records a \
         reference the VM layer pulls"
    ))))
}
