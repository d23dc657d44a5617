//! Memory snapshots of a vm booted to guest init's handshake, one per
//! [`Shape`] (image, cpus, memory, kernel, initramfs, accel): the state a
//! new vm is restored from instead of booting its kernel.
//!
//! A template is a vm started with [`Start::Template`] (no writable disk,
//! no `/workspace`: qemu 7.2 refuses to save or load a vm with a
//! vhost-user-fs device), saved with QMP `migrate` to a file once guest
//! init says it is ready, then ended. Its directory under the templates
//! root is named by the image's layers and size; a `key` file names all of
//! the shape (the kernel's and initramfs's files, so a new kernel or helper
//! build makes it stale) and the state is used only when the key matches.
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

use super::QemuError;
use super::instance::{Instance, READY_WAIT, Shape, Start};

/// Bumped when what a template holds changes meaning (the machine's
/// devices, the handshake), so older states are stale.
const FORMAT: &str = "smcp-vm-template-1";

fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Where one shape's template lives.
#[derive(Debug, Clone)]
pub struct Template {
    dir: PathBuf,
    key: String,
}

impl Template {
    /// The template of `shape` under `root`.
    pub fn of(root: &Path, shape: &Shape) -> Self {
        let mut slot = Sha256::new();
        for l in &shape.layers {
            slot.update(l.as_os_str().as_encoded_bytes());
            slot.update([0]);
        }
        slot.update(format!("{} {}", shape.cpus, shape.memory_mib));
        let dir = root.join(&hex(&slot.finalize())[..24]);
        let mut key = Sha256::new();
        key.update(FORMAT);
        for f in [&shape.kernel, &shape.initramfs].into_iter().chain(&shape.layers) {
            let meta = std::fs::metadata(f).ok();
            let mtime = meta.as_ref().and_then(|m| m.modified().ok()).map(|t| format!("{t:?}")).unwrap_or_default();
            key.update(format!("{}|{}|{mtime}\n", f.display(), meta.map_or(0, |m| m.len())));
        }
        key.update(format!("{} {} {}", shape.accel.name(), shape.cpus, shape.memory_mib));
        Template { dir, key: hex(&key.finalize()) }
    }

    /// What the key file holds when the state is current.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The state file.
    pub fn state(&self) -> PathBuf {
        self.dir.join("vm.state")
    }

    /// The shape itself, so a helper that starts can fill its pool
    /// ([`Template::saved_shapes`]).
    fn shape_file(&self) -> PathBuf {
        self.dir.join("shape.json")
    }

    /// The shapes with a current template under `root`.
    pub fn saved_shapes(root: &Path) -> Vec<Shape> {
        let Ok(dirs) = std::fs::read_dir(root) else { return Vec::new() };
        dirs.flatten()
            .filter_map(|d| std::fs::read(d.path().join("shape.json")).ok())
            .filter_map(|json| serde_json::from_slice::<Shape>(&json).ok())
            .filter(|shape| Template::of(root, shape).current().is_some())
            .collect()
    }

    /// The file naming the shape the state was saved for.
    pub fn key_file(&self) -> PathBuf {
        self.dir.join("key")
    }

    /// The state file, if it was saved for this very shape.
    pub fn current(&self) -> Option<PathBuf> {
        let key = std::fs::read_to_string(self.key_file()).ok()?;
        (key.trim() == self.key && self.state().is_file()).then(|| self.state())
    }

    /// Why there is no usable state (for the cold boot's reason).
    pub fn why_not(&self) -> String {
        match std::fs::read_to_string(self.key_file()) {
            Err(_) => "no memory snapshot of this image and size yet".into(),
            Ok(k) if k.trim() != self.key => {
                "the memory snapshot is stale (kernel, initramfs, helper or image changed)".into()
            }
            Ok(_) => format!("{} is missing", self.state().display()),
        }
    }

    /// Removes the state (it failed to load).
    pub fn discard(&self) {
        let _ = std::fs::remove_file(self.key_file());
        let _ = std::fs::remove_file(self.state());
    }

    /// Boots a vm of `shape` to guest init's handshake in `run_dir`, saves
    /// its memory state here and ends it. The state appears whole or not
    /// at all (written aside, then renamed).
    pub async fn build(&self, shape: &Shape, run_dir: &Path) -> Result<(), QemuError> {
        std::fs::create_dir_all(&self.dir).map_err(|e| QemuError::io(format!("create {}", self.dir.display()), e))?;
        let mut vm = Instance::start(shape, run_dir, Start::Template, None).await?;
        let tmp = self.dir.join(format!("vm.state.{}", std::process::id()));
        let saved = async {
            vm.wait_ready(READY_WAIT).await?;
            let file =
                std::fs::File::create(&tmp).map_err(|e| QemuError::io(format!("create {}", tmp.display()), e))?;
            vm.qmp().await?.migrate_to_file(&file).await
        }
        .await;
        vm.kill().await;
        let _ = std::fs::remove_dir_all(run_dir);
        if let Err(e) = saved {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        let _ = std::fs::remove_file(self.key_file());
        std::fs::rename(&tmp, self.state()).map_err(|e| QemuError::io(format!("rename {}", tmp.display()), e))?;
        let shape_json = serde_json::to_vec(shape).map_err(|e| QemuError::io("describe the shape", e.into()))?;
        std::fs::write(self.shape_file(), shape_json)
            .map_err(|e| QemuError::io(format!("write {}", self.shape_file().display()), e))?;
        std::fs::write(self.key_file(), &self.key)
            .map_err(|e| QemuError::io(format!("write {}", self.key_file().display()), e))
    }
}
