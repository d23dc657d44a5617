//! Snapshots, restore, the image list and clone, on top of the helper's
//! layered images: a snapshot is the sandbox's writable layer committed on
//! top of the layers it runs on (so snapshots of restored sandboxes keep
//! every generation of changes), restore boots a sandbox from one, and
//! clone starts a sandbox from a copy of another's layers plus its workspace.
use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use tokio::sync::mpsc;

use sandbox_image::oci::Reference;

use super::{
    error::OrchestratorError,
    helper_client::{CommitConfig, HelperError, ImageSummary, PullEvent, PullSpec},
    names::validate_key,
    sandbox::{Origin, Sandbox, SandboxManager, WORKSPACE},
};

/// Image name prefix of snapshots.
pub const SNAPSHOT_PREFIX: &str = "mcp-snap-";
/// Label saying what made an image: `snapshot`, `built`, `build-step`.
pub const KIND_LABEL: &str = "sandbox-mcp.kind";
/// Label of a snapshot: the sandbox it was taken from.
pub const SOURCE_LABEL: &str = "sandbox-mcp.source";

/// Whether `name` may be given to a new image (pulled, imported or built):
/// a valid name, and not one in the snapshots' namespace, which would be
/// listed, restored and deleted as a snapshot. The error names the problem.
pub fn new_image_name(name: &str) -> Result<(), String> {
    sandbox_image::validate_name(name).map_err(|e| e.to_string())?;
    if name.starts_with(SNAPSHOT_PREFIX) {
        return Err(format!("image names starting with '{SNAPSHOT_PREFIX}' are reserved for snapshots"));
    }
    Ok(())
}

/// Why a snapshot, restore, clone or image operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ImagesError {
    /// A snapshot name breaks the image naming rule.
    #[error(
        "invalid snapshot name '{0}': must match ^[a-z0-9][a-z0-9._-]{{0,53}}$ (image names are lowercase: letters, digits, '.', '_', '-')"
    )]
    InvalidSnapshotName(String),
    /// No sandbox to act on: (name, what for).
    #[error("no active sandbox '{shown}' to {1}", shown = super::names::display(.0))]
    NoSandbox(String, &'static str),
    /// The operation is refused on this sandbox.
    #[error("{0}")]
    NotPermitted(&'static str),
    /// A snapshot of that name exists.
    #[error("snapshot '{0}' already exists: delete_snapshot('{0}') first or choose another name")]
    SnapshotExists(String),
    /// Restore of a snapshot that does not exist.
    #[error("snapshot '{0}' not found. Use list_snapshots().")]
    SnapshotNotFound(String),
    /// Delete of a snapshot that does not exist.
    #[error("snapshot '{0}' not found. Available: {1}")]
    NothingToDelete(String, String),
    /// Other images are built on the snapshot.
    #[error("snapshot '{0}' is the base of {1}: delete those first")]
    SnapshotInUse(String, String),
    /// Copying the source's workspace into a clone failed: (source, why).
    #[error("copying the workspace of '{shown}' failed, so the clone was removed: {1}", shown = super::names::display(.0))]
    WorkspaceCopy(String, HelperError),
    /// Booting the restored sandbox failed (the old VM is already gone).
    #[error("{0}")]
    Restoring(OrchestratorError),
    /// Anything the sandbox layer refused.
    #[error(transparent)]
    Orchestrator(#[from] OrchestratorError),
    /// A reference or image name that cannot be pulled as given.
    #[error("{0}")]
    InvalidImage(String),
    /// The helper failed.
    #[error(transparent)]
    Helper(#[from] HelperError),
}

/// A finished pull.
#[derive(Debug, Clone)]
pub struct Pulled {
    /// The new image.
    pub image: ImageSummary,
    /// Wall-clock time.
    pub elapsed: Duration,
}

/// A committed snapshot.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// Its name without the prefix.
    pub name: String,
    /// The image behind it.
    pub image: ImageSummary,
    /// Bytes of its own layer: the image's size counts the layers below it.
    pub layer_bytes: u64,
}

/// A finished clone.
#[derive(Debug, Clone)]
pub struct Cloned {
    /// The new sandbox.
    pub sandbox: Arc<Sandbox>,
    /// Workspace bytes copied.
    pub workspace_bytes: u64,
    /// Wall-clock time.
    pub elapsed: Duration,
}

/// Check a snapshot name: the image name rule minus the prefix's length.
pub fn validate_snapshot_name(name: &str) -> Result<(), ImagesError> {
    let mut chars = name.chars();
    let ok = name.len() <= 54
        && chars.next().is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-'));
    if ok { Ok(()) } else { Err(ImagesError::InvalidSnapshotName(name.to_string())) }
}

fn image_of(snapshot: &str) -> String {
    format!("{SNAPSHOT_PREFIX}{snapshot}")
}

/// How an image is shown to a user: a snapshot by its snapshot name.
pub fn display_name(image: &str) -> String {
    match image.strip_prefix(SNAPSHOT_PREFIX) {
        Some(s) => format!("snapshot '{s}'"),
        None => format!("image '{image}'"),
    }
}

/// Bytes of `image`'s own layer: its size counts the layers below it, its
/// parent's those below the parent.
fn own_layer(image: &ImageSummary, images: &[ImageSummary]) -> u64 {
    let below = images.iter().find(|i| i.name == image.parent).map(|i| i.size_bytes).unwrap_or(0);
    image.size_bytes.saturating_sub(below)
}

impl SandboxManager {
    /// Pull `reference` from its registry (through the mirrors and
    /// plain-HTTP registries of the user's config) as image `name`, by
    /// default one derived from the reference (`python:3.12` →
    /// `python-3.12`). Dropping the future cancels the pull.
    pub async fn pull_image(
        &self,
        reference: &str,
        name: Option<&str>,
        force: bool,
        on_event: impl FnMut(PullEvent),
    ) -> Result<Pulled, ImagesError> {
        let started = Instant::now();
        let parsed = Reference::parse(reference).map_err(|e| ImagesError::InvalidImage(e.to_string()))?;
        let name = name.filter(|n| !n.is_empty()).map_or_else(|| parsed.image_name(), str::to_string);
        new_image_name(&name).map_err(ImagesError::InvalidImage)?;
        let spec =
            PullSpec { reference: reference.to_string(), name, force, registries: self.config().registries.clone() };
        let image = self.helper.pull_image(spec, on_event).await?;
        tracing::info!(image = %image.name, source = %image.source, "pulled image");
        Ok(Pulled { image, elapsed: started.elapsed() })
    }

    /// Every image the helper has, sorted by name.
    pub async fn images(&self) -> Result<Vec<ImageSummary>, ImagesError> {
        let mut images = self.helper.list_images().await?;
        images.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(images)
    }

    /// Every snapshot, sorted by name.
    pub async fn snapshots(&self) -> Result<Vec<Snapshot>, ImagesError> {
        let images = self.images().await?;
        Ok(images
            .iter()
            .filter_map(|i| {
                let name = i.name.strip_prefix(SNAPSHOT_PREFIX)?.to_string();
                Some(Snapshot { name, layer_bytes: own_layer(i, &images), image: i.clone() })
            })
            .collect())
    }

    async fn find_snapshot(&self, name: &str) -> Result<Option<Snapshot>, ImagesError> {
        Ok(self.snapshots().await?.into_iter().find(|s| s.name == name))
    }

    /// Commit a sandbox's root filesystem (not /workspace) as snapshot
    /// `name`. Returns it with the size of the new layer alone.
    pub async fn snapshot(&self, name: &str, sandbox: &str) -> Result<(Snapshot, u64, Duration), ImagesError> {
        let started = Instant::now();
        validate_snapshot_name(name)?;
        let source = self.existing(sandbox, "snapshot")?;
        if source.parent.is_some() {
            return Err(ImagesError::NotPermitted("snapshots not permitted on child sandboxes"));
        }
        let images = self.images().await?;
        if images.iter().any(|i| i.name == image_of(name)) {
            return Err(ImagesError::SnapshotExists(name.to_string()));
        }
        let labels = HashMap::from([
            (KIND_LABEL.to_string(), "snapshot".to_string()),
            (SOURCE_LABEL.to_string(), sandbox.to_string()),
        ]);
        let commit = CommitConfig { image: image_of(name), config: None, parent: String::new(), labels };
        let image = match self.helper.commit_vm(&source.name, source.isolation, commit).await {
            Ok(image) => image,
            Err(HelperError::AlreadyExists(_)) => return Err(ImagesError::SnapshotExists(name.to_string())),
            Err(e) => return Err(e.into()),
        };
        let layer = own_layer(&image, &images);
        tracing::info!(snapshot = %name, %sandbox, layer, "snapshot saved");
        Ok((Snapshot { name: name.to_string(), image, layer_bytes: layer }, layer, started.elapsed()))
    }

    /// Replace `sandbox` (and its children) with a VM booted from snapshot
    /// `name`; /workspace is kept, env comes back from the snapshot.
    pub async fn restore(&self, name: &str, sandbox: &str) -> Result<Arc<Sandbox>, ImagesError> {
        validate_snapshot_name(name)?;
        validate_key(sandbox)?;
        if self.find_snapshot(name).await?.is_none() {
            return Err(ImagesError::SnapshotNotFound(name.to_string()));
        }
        if self.get(sandbox).is_ok_and(|s| s.parent.is_some()) {
            return Err(ImagesError::NotPermitted("restore not permitted on child sandboxes"));
        }
        let origin = Origin { image: Some(image_of(name)), ..Origin::default() };
        self.recreate(sandbox, &origin).await.map_err(ImagesError::Restoring)
    }

    /// Delete snapshot `name`, unless other images are built on it.
    pub async fn delete_snapshot(&self, name: &str) -> Result<(), ImagesError> {
        let snapshots = self.snapshots().await?;
        if validate_snapshot_name(name).is_err() || !snapshots.iter().any(|s| s.name == name) {
            let names: Vec<&str> = snapshots.iter().map(|s| s.name.as_str()).collect();
            let available = if names.is_empty() { "none".to_string() } else { names.join(", ") };
            return Err(ImagesError::NothingToDelete(name.to_string(), available));
        }
        let image = image_of(name);
        let in_use = |dependents: Vec<String>| ImagesError::SnapshotInUse(name.to_string(), dependents.join(", "));
        let dependents: Vec<String> =
            self.images().await?.into_iter().filter(|i| i.parent == image).map(|i| display_name(&i.name)).collect();
        if !dependents.is_empty() {
            return Err(in_use(dependents));
        }
        match self.helper.delete_image(&image).await {
            Ok(()) => Ok(()),
            // Committed on top of it since we looked: the helper names them.
            Err(HelperError::FailedPrecondition(why)) => Err(in_use(vec![why])),
            Err(e) => Err(e.into()),
        }
    }

    /// A new sandbox `target` from `source`'s layers plus a copy of its
    /// writable layer (taken frozen) and of its workspace. On any failure the
    /// target is destroyed again.
    pub async fn clone_sandbox(&self, source: &str, target: &str) -> Result<Cloned, ImagesError> {
        let started = Instant::now();
        let from = self.existing(source, "clone")?;
        if from.parent.is_some() {
            return Err(ImagesError::NotPermitted("cloning from a child sandbox is not permitted"));
        }
        validate_key(target)?;
        let origin = Origin { clone_from: Some(source.to_string()), ..Origin::default() };
        let sandbox = self.create(target, &origin).await?;
        match self.copy_workspace(source, target).await {
            Ok(workspace_bytes) => Ok(Cloned { sandbox, workspace_bytes, elapsed: started.elapsed() }),
            Err(e) => {
                if let Err(undo) = self.destroy(target).await {
                    tracing::warn!(sandbox = %target, "could not remove the failed clone: {undo}");
                }
                Err(ImagesError::WorkspaceCopy(source.to_string(), e))
            }
        }
    }

    /// Stream `source`'s /workspace into `target`'s through the helper, one
    /// bounded chunk at a time; returns the bytes extracted.
    async fn copy_workspace(&self, source: &str, target: &str) -> Result<u64, HelperError> {
        let reader = self.helper.copy_out(source, WORKSPACE).await?;
        let (tx, rx) = mpsc::channel(8);
        let (pumped, copied) = tokio::join!(reader.pump(tx), self.helper.copy_in(target, WORKSPACE, rx));
        pumped?;
        let (_, bytes) = copied?;
        Ok(bytes)
    }

    fn existing(&self, name: &str, what: &'static str) -> Result<Arc<Sandbox>, ImagesError> {
        match self.get(name) {
            Ok(s) => Ok(s),
            Err(OrchestratorError::NoSuchSandbox(_)) => Err(ImagesError::NoSandbox(name.to_string(), what)),
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_names() {
        for good in ["a", "v1.2_x-y", &"a".repeat(54)] {
            assert!(validate_snapshot_name(good).is_ok(), "{good}");
        }
        for bad in ["", "A", "-a", "a/b", "a b", &"a".repeat(55)] {
            assert!(validate_snapshot_name(bad).is_err(), "{bad}");
        }
    }
}
