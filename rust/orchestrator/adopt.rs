//! What a server finds of its predecessor's sandboxes when it starts: VMs
//! it attaches, and creations the predecessor died in the middle of. The
//! state database's record of a sandbox is the point a creation commits at,
//! so a VM whose creator died is kept exactly when that record exists.
use std::{path::PathBuf, sync::Arc, time::SystemTime};

use super::{
    error::OrchestratorError,
    helper_client::VmInfo,
    sandbox::{NAME_LABEL, PARENT_LABEL, Sandbox, SandboxManager},
};

/// A marker beside a sandbox's volumes while it is being created, naming
/// the creating server process. Removed when creation ends either way; one
/// left by a crashed server tells the next one the VM may not be finished.
pub(super) struct Creating(PathBuf);

impl Creating {
    const FILE: &'static str = ".creating";

    pub(super) fn mark(volume: &std::path::Path) -> Result<Self, OrchestratorError> {
        let path = volume.join(Self::FILE);
        std::fs::write(&path, super::owner::me())
            .map_err(|source| OrchestratorError::Volume { path: path.display().to_string(), source })?;
        Ok(Self(path))
    }

    /// The creator named by a marker left in `volume`, if any.
    pub(super) fn owner(volume: &std::path::Path) -> Option<String> {
        std::fs::read_to_string(volume.join(Self::FILE)).ok()
    }

    fn clear(volume: &std::path::Path) {
        let _ = std::fs::remove_file(volume.join(Self::FILE));
    }
}

impl Drop for Creating {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

impl SandboxManager {
    /// Registers the running VM `vm` of a previous server as sandbox `name`,
    /// with the persistent env it holds.
    pub(super) async fn attach(&self, vm: &VmInfo, name: String) {
        let sandbox = Arc::new(Sandbox::from_vm(vm, name.clone()));
        sandbox.set_lease(self.config.limits.lease_ttl.map(|t| SystemTime::now() + t));
        match self.load_env(&sandbox).await {
            Ok(env) => *sandbox.env.lock().unwrap_or_else(|p| p.into_inner()) = env,
            Err(e) => tracing::warn!(sandbox = %name, "could not read persistent env: {e}"),
        }
        tracing::info!(sandbox = %name, "attached running sandbox");
        self.lock_map().insert(name, sandbox);
    }

    /// Decides the VMs [`Self::start`] found with a dead creator's marker:
    /// one whose creation `recorded` (the state database holds it, so its
    /// creator had answered or was about to) is attached; any other was
    /// cut short and goes. Called once the database is read, or with
    /// `|_| false` when it cannot be.
    pub(super) async fn settle_unfinished(&self, recorded: impl Fn(&str) -> bool) {
        let vms = std::mem::take(&mut *self.unfinished.lock().unwrap_or_else(|p| p.into_inner()));
        for vm in vms {
            let Some(name) = vm.labels.get(NAME_LABEL).cloned() else { continue };
            let parent_gone = vm.labels.get(PARENT_LABEL).is_some_and(|p| !self.lock_map().contains_key(p));
            if recorded(&name) && !parent_gone {
                tracing::info!(sandbox = %name, "keeping a sandbox whose creation was recorded just before a crash");
                Creating::clear(&self.config.volumes_dir.join(&name));
                self.attach(&vm, name).await;
            } else {
                self.remove_cut_short(&vm.id, &name).await;
            }
        }
    }

    /// Removes the VM of a sandbox whose server died before it was ready (a
    /// clone without its whole workspace, a child without its sandbox-ctl):
    /// never hand out something half made. The workspace stays.
    async fn remove_cut_short(&self, vm_id: &str, name: &str) {
        tracing::info!(sandbox = %name, "removing a sandbox whose creation was cut short by a crash");
        self.helper.delete_vm(vm_id).await.ok();
        Creating::clear(&self.config.volumes_dir.join(name));
    }

    /// The VMs among `vms` whose creation a server that died asked for and
    /// the helper finished only after this server's [`Self::start`] looked
    /// (the helper finishes a creation its caller left): no sandbox holds
    /// them, and they are removed as `start` removes the ones it sees.
    pub(super) async fn remove_cut_short_late(&self, vms: &[VmInfo]) {
        for vm in vms {
            let Some(name) = vm.labels.get(NAME_LABEL) else { continue };
            if self.lock_map().contains_key(name) {
                continue;
            }
            // Still waiting for the state database to decide it.
            if self.unfinished.lock().unwrap_or_else(|p| p.into_inner()).iter().any(|u| u.id == vm.id) {
                continue;
            }
            // A creation in this server holds the name's lock (and its
            // marker names this live server).
            let lock = self.lifecycle_lock(name);
            let Ok(_guard) = lock.try_lock() else { continue };
            let dead_creator = Creating::owner(&self.config.volumes_dir.join(name))
                .is_some_and(|creator| !super::owner::alive(&creator));
            if dead_creator && !self.lock_map().contains_key(name) {
                self.remove_cut_short(&vm.id, name).await;
            }
        }
    }
}
