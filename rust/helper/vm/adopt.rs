//! VMs a helper that died left running, taken over by the next one (issue
//! 25). Each running VM's config and image are kept beside it (`run.json`
//! in its directory, which only the helper's user can write); a helper
//! starting adopts, through their driver, the VMs whose launcher still runs
//! and whose helper is gone, before it serves anyone. A VM it cannot adopt
//! (a driver that cannot, a launcher or agent of another protocol) is
//! killed by the leftovers pass that follows, and its sandbox comes back as
//! lost.
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{Events, VmInfo, VmManager};
use crate::driver::Orphan;
use crate::error::HelperError;
use crate::spec::VmConfig;
use sandbox_image::ImageInfo;

/// The record's file name in a VM's directory.
const RECORD: &str = "run.json";

/// What a new helper needs to hold a running VM as its starter did.
#[derive(serde::Serialize, serde::Deserialize)]
struct Kept {
    config: VmConfig,
    image: ImageInfo,
    created_at_ms: i64,
}

/// Forgets the record in `dir`, before the VM starts again: a helper dying
/// before the new one is written must not adopt the new run with the old
/// run's config.
pub(super) fn forget(dir: &Path) {
    let _ = std::fs::remove_file(dir.join(RECORD));
}

/// Records the running VM `info` (booted from `image`) in its directory
/// `dir`. Not fatal: only a helper adopting the VM reads it.
pub(super) fn record(dir: &Path, info: &VmInfo, image: &ImageInfo) {
    let kept = Kept { config: info.config.clone(), image: image.clone(), created_at_ms: info.created_at_ms };
    let tmp = dir.join(format!("{RECORD}.tmp"));
    let written = serde_json::to_vec(&kept)
        .map_err(std::io::Error::other)
        .and_then(|json| std::fs::write(&tmp, json))
        .and_then(|()| std::fs::rename(&tmp, dir.join(RECORD)));
    if let Err(e) = written {
        tracing::warn!(vm = %info.config.id, error = %e, "cannot record the vm for a helper that would adopt it");
    }
}

impl VmManager {
    /// Adopts every VM under the state dir that a dead helper left running
    /// (see the module doc); call at start, before the leftovers pass and
    /// before serving.
    pub async fn adopt_left(&self) {
        let Some(me) = self.me.upgrade() else { return };
        let root = sandbox_base::paths::state_dir().join("vms");
        // All at once: each launcher waits a bounded time for a helper, and
        // one VM whose agent stalls must not use up the others' wait.
        let mut adoptions = tokio::task::JoinSet::new();
        for entry in std::fs::read_dir(&root).into_iter().flatten().flatten() {
            let dir = entry.path();
            #[cfg(linux_host)]
            let Some(launcher) = crate::storage::orphaned_launcher(&dir) else { continue };
            #[cfg(not(linux_host))]
            let launcher = Orphan { pid: 0, start: String::new() };
            let id = entry.file_name().to_string_lossy().into_owned();
            let me = me.clone();
            adoptions.spawn(async move {
                match me.adopt(&id, dir, &launcher).await {
                    Ok(()) => {
                        tracing::info!(vm = %id, launcher = launcher.pid, "kept a vm the last helper left running")
                    }
                    Err(e) => tracing::warn!(vm = %id, reason = %e, "cannot keep a vm the last helper left running"),
                }
            });
        }
        while adoptions.join_next().await.is_some() {}
    }

    /// Adopts the VM `id` in `dir`, whose launcher is `launcher`.
    async fn adopt(&self, id: &str, dir: PathBuf, launcher: &Orphan) -> Result<(), HelperError> {
        let text = std::fs::read(dir.join(RECORD)).map_err(|e| HelperError::io("read the vm's record", e))?;
        let kept: Kept = serde_json::from_slice(&text)
            .map_err(|e| HelperError::invalid("the vm's record", format!("{} is not one: {e}", RECORD)))?;
        let config = kept.config.validate()?;
        if config.id != id {
            return Err(HelperError::invalid("the vm's record", format!("it names vm {:?}", config.id)));
        }
        let driver = self.driver_named(&config.driver)?;
        {
            let _store = self.images.lock();
            self.register(config.clone(), driver.clone(), kept.image, dir)?;
        }
        let slot = self.slot(id)?;
        slot.data().info.created_at_ms = kept.created_at_ms;
        let mut op = slot.op.lock().await;
        let events = Arc::new(Events::default());
        let spec = self.boot_spec(&slot, &config, &events);
        match driver.adopt(&spec, launcher).await {
            Ok(instance) => {
                self.begin_run(&slot, &mut op, instance, events);
                Ok(())
            }
            Err(e) => {
                drop(op);
                self.list_slots().retain(|s| !Arc::ptr_eq(s, &slot));
                self.images.remove_vm_ref(id);
                Err(HelperError::Driver(e))
            }
        }
    }
}
