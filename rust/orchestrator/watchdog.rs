//! Watching the VM helper: when it stops answering it is started again (and
//! adopts the VMs it can), and sandboxes whose VMs went with it (or stopped
//! on their own) are reported as lost — never silently replaced by empty
//! ones under the same name.
use std::{path::PathBuf, sync::Arc, time::Duration};

use super::{
    helper_client::{HelperClient, VmInfo, VmState},
    isolation::Isolation,
    sandbox::{Sandbox, SandboxManager},
};

/// How often the helper is asked for its VMs.
const TICK: Duration = Duration::from_secs(1);

/// How to start the helper again.
#[derive(Debug, Clone)]
pub struct Respawn {
    /// Its socket.
    pub socket: PathBuf,
    /// Its binary.
    pub binary: PathBuf,
}

/// The time of day in UTC, for messages that say when something happened.
pub(super) fn clock() -> String {
    let secs = sandbox_base::clock::unix_secs();
    format!("{:02}:{:02}:{:02} UTC", secs / 3600 % 24, secs / 60 % 60, secs % 60)
}

/// Why a sandbox's VM is missing from the helper's list.
enum Missing {
    /// The helper answers, so it did not take the VM with it: someone else
    /// deleted it through the same helper.
    DeletedByAnother,
    /// The helper died and a new one, started at `at`, did not adopt it.
    HelperRestarted { at: String },
}

impl Missing {
    /// The loss reason of `sandbox`, as `status` and the comeback show it.
    fn why(&self, sandbox: &Sandbox) -> String {
        match self {
            Missing::DeletedByAnother => format!(
                "its VM was deleted through the VM helper by another client (another sandbox-mcp server sharing the \
                 helper, or a helper started afresh by one) (noticed at {})",
                clock()
            ),
            Missing::HelperRestarted { at } => match sandbox.isolation {
                Isolation::Vm => format!(
                    "the VM helper stopped and was restarted at {at}, which could not keep this sandbox (it was \
                     being started, its qemu or keeper was gone, or its agent did not answer in time)"
                ),
                Isolation::Namespaces => format!(
                    "the VM helper stopped and was restarted at {at}, which could not keep this sandbox (a snapshot \
                     had frozen it then, it was being started, or its launcher was gone)"
                ),
            },
        }
    }
}

impl SandboxManager {
    /// Compare the registry with the helper's VMs once; a sandbox whose VM
    /// is not running any more is marked lost, saying why it is `missing`.
    /// Sandboxes being created, reset or destroyed right now are left to
    /// that operation. Returns the names lost.
    async fn reconcile(&self, missing: &Missing) -> Result<Vec<String>, super::OrchestratorError> {
        let vms = self.helper.list_vms().await?;
        let lost = self.lose_missing(&vms, missing).await;
        self.remove_cut_short_late(&vms).await;
        self.free_unfreed().await;
        Ok(lost)
    }

    /// Marks lost each sandbox whose VM is not running among `vms`; returns
    /// the names lost.
    async fn lose_missing(&self, vms: &[VmInfo], missing: &Missing) -> Vec<String> {
        let mut lost = Vec::new();
        for sandbox in self.list() {
            let vm = vms.iter().find(|v| v.id == sandbox.name);
            if vm.is_some_and(|v| v.state == VmState::Running) {
                continue;
            }
            let lock = self.lifecycle_lock(&sandbox.name);
            let Ok(_guard) = lock.try_lock() else { continue };
            if !self.list().iter().any(|s| Arc::ptr_eq(s, &sandbox)) {
                continue;
            }
            let why = match vm {
                Some(v) => {
                    // Its processes are gone; the stopped VM only holds a
                    // writable layer nobody can use any more.
                    self.helper.delete_vm(&sandbox.name).await.ok();
                    match &v.stop_reason {
                        Some(reason) => format!("its VM stopped on its own: {reason} (noticed at {})", clock()),
                        None => format!("its VM stopped unexpectedly (noticed at {})", clock()),
                    }
                }
                None => missing.why(&sandbox),
            };
            // Its children must not outlive it: they would run outside any
            // live parent's budget, and a reset of the name would adopt them.
            self.destroy_subtree(&sandbox.name).await;
            self.mark_lost(&sandbox.name, &why);
            lost.push(sandbox.name.clone());
        }
        lost
    }

    /// Check the helper every [`TICK`] until the manager is dropped; start
    /// it again when it stopped answering.
    pub fn spawn_watchdog(self: &Arc<Self>, respawn: Respawn) {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(TICK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(manager) = weak.upgrade() else { break };
                if manager.reconcile(&Missing::DeletedByAnother).await.is_ok() {
                    continue;
                }
                tracing::warn!("the VM helper stopped answering; starting it again");
                let missing = Missing::HelperRestarted { at: clock() };
                manager.helper_settled.send_replace(false);
                // The channel inside the manager dials the socket again by
                // itself: starting the helper is all it takes. A new helper
                // adopts the VMs the dead one left running before it answers
                // (namespace VMs: see the helper's `keep`), so only the rest
                // are lost.
                let lost = match HelperClient::connect_or_spawn(&respawn.socket, &respawn.binary).await {
                    Ok(_) => manager.reconcile(&missing).await.unwrap_or_else(|e| {
                        tracing::warn!("the restarted VM helper does not answer yet: {e}");
                        Vec::new()
                    }),
                    Err(e) => {
                        tracing::warn!("could not restart the VM helper: {e}");
                        manager.lose_missing(&[], &missing).await
                    }
                };
                manager.helper_settled.send_replace(true);
                // What they served comes back without waiting for a call.
                manager.revive_serving(lost);
            }
        });
    }
}
