//! The VM operations that touch the image store: committing a VM's writable
//! layer as an image, creating a VM from a copy of another's layer
//! (`clone_from`), and deleting images.
//!
//! Both copies freeze the source VM (see [`crate::freeze`]) and hold
//! its lifecycle lock, so it can be neither stopped nor deleted meanwhile.
use std::collections::BTreeMap;

use super::{HelperError, RunHandles, Slot, VmConfig, VmInfo, VmManager, VmState, prepare_dir, share_mounts, vm_dir};
use sandbox_image::{ImageConfig, ImageError, ImageInfo, MAX_LAYERS, disk_usage, validate_name};

/// What to commit.
#[derive(Debug, Clone, Default)]
pub struct CommitRequest {
    /// The running VM.
    pub vm_id: String,
    /// Name of the new image.
    pub image: String,
    /// Process defaults; `None` keeps the VM image's.
    pub config: Option<ImageConfig>,
    /// Recorded parent; empty means the VM's image.
    pub parent: String,
    /// Metadata of the new image.
    pub labels: BTreeMap<String, String>,
}

impl VmManager {
    /// Commits the writable layer of a running VM as a new image stacked on
    /// the VM's image layers.
    pub async fn commit(&self, req: CommitRequest) -> Result<ImageInfo, HelperError> {
        validate_name(&req.image)?;
        if !req.parent.is_empty() {
            validate_name(&req.parent).map_err(|e| HelperError::invalid("parent", e.to_string()))?;
        }
        let slot = self.slot(&req.vm_id)?;
        let _op = slot.op.lock().await;
        let run = running(&slot, "commit")?;
        match self.images.get(&req.image) {
            Ok(_) => return Err(ImageError::AlreadyExists(req.image).into()),
            Err(ImageError::NotFound(_)) => {}
            Err(e) => return Err(e.into()),
        }
        if slot.image.layers().len() >= MAX_LAYERS {
            return Err(ImageError::TooManyLayers { name: req.image, max: MAX_LAYERS }.into());
        }
        let staged = self.images.stage_layer()?;
        let (upper, copy) = (slot.dir.join("upper"), staged.path().to_path_buf());
        let size = blocking(move || {
            run.instance.snapshot_layer(&upper, &copy)?;
            Ok(disk_usage(&copy))
        })
        .await?;
        let base = &slot.image;
        let info = ImageInfo {
            name: req.image,
            size_bytes: base.size_bytes + size,
            created_at_ms: sandbox_base::clock::unix_ms(),
            shell: base.shell.clone(),
            package_manager: base.package_manager.clone(),
            id_map: base.id_map.clone(),
            parent: if req.parent.is_empty() { base.name.clone() } else { req.parent },
            layers: base.layers(),
            config: req.config.unwrap_or_else(|| base.config.clone()),
            labels: req.labels,
            reference: base.reference.clone(),
            source: base.source.clone(),
            // Committed, not built: `image build` never rebuilds it.
            recipe: 0,
        };
        let images = self.images.clone();
        blocking(move || Ok(images.install_layer(staged, info)?)).await
    }

    /// CreateVm with `clone_from`: the new VM runs on the source's layers
    /// with a copy of its writable layer.
    pub(super) async fn create_clone(&self, mut config: VmConfig) -> Result<VmInfo, HelperError> {
        let source = self.slot(&config.clone_from)?;
        let image = source.image.clone();
        if !config.image.is_empty() && config.image != image.name {
            return Err(HelperError::invalid(
                "spec.image",
                format!("must be empty or {:?}, the image of vm {:?}", image.name, config.clone_from),
            ));
        }
        config.image = image.name.clone();
        // The copy is the source's layer as its driver keeps it.
        if !config.driver.is_empty() && config.driver != source.driver.name() {
            return Err(HelperError::invalid(
                "spec.driver",
                format!("must be empty or {:?}, the driver of vm {:?}", source.driver.name(), config.clone_from),
            ));
        }
        config.driver = source.driver.name().into();
        let driver = source.driver.clone();
        let _op = source.op.lock().await;
        let run = running(&source, "clone")?;
        let dir = vm_dir(&config.id);
        prepare_dir(&dir, &image)?;
        let (from, to) = (source.dir.join("upper"), dir.join("upper"));
        let copied = blocking(move || {
            // The copy brings the source's upper dir itself (owner, mode).
            std::fs::remove_dir(&to).map_err(|e| HelperError::io(format!("remove {}", to.display()), e))?;
            run.instance.snapshot_layer(&from, &to)
        })
        .await;
        let registered = copied.and_then(|()| {
            share_mounts(&config, &image);
            let _store = self.images.lock();
            self.register(config, driver, image, dir.clone())
        });
        if registered.is_err() {
            let _ = sandbox_userns::remove_tree(&dir);
        }
        registered
    }

    /// Removes layers no image and no VM of any live helper sharing the
    /// store uses any more, and copies left by dead processes. A failure
    /// only leaves disk space in use, so it is logged, not returned.
    pub async fn collect_layers(&self) {
        let Some(me) = self.me.upgrade() else { return };
        let collected = tokio::task::spawn_blocking(move || me.images.gc()).await;
        match collected {
            Ok(Ok(removed)) if !removed.is_empty() => tracing::info!(?removed, "removed unused layers"),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "layer collection skipped"),
            Err(e) => tracing::warn!(error = %e, "layer collection failed"),
        }
    }

    /// Deletes an image (refused while others name it as parent) and
    /// collects the layers nothing uses any more. VMs running on it go on.
    pub async fn delete_image(&self, name: &str) -> Result<(), HelperError> {
        let Some(me) = self.me.upgrade() else { return Err(HelperError::Unavailable("shutting down".into())) };
        let name = name.to_string();
        blocking(move || Ok(me.images.delete(&name)?)).await
    }
}

/// The handles of `slot` if it is running, for `op` (named in the error).
fn running(slot: &Slot, op: &'static str) -> Result<RunHandles, HelperError> {
    let d = slot.data();
    match &d.run {
        Some(run) if d.info.state == VmState::Running => Ok(run.clone()),
        _ => Err(HelperError::WrongState { op, id: slot.id.clone(), state: d.info.state }),
    }
}

/// Runs filesystem work off the runtime's worker threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, HelperError> + Send + 'static,
) -> Result<T, HelperError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| HelperError::io("blocking task", std::io::Error::other(e)))?
}
