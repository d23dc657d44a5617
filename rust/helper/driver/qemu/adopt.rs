//! A sandbox's vm that a helper which died left running, taken over by the
//! next one (issue 25). At hand-out the helper records, in the sandbox's
//! VM directory, the vm's run dir (a pool vm keeps the one it was restored
//! in) and where its workspace is mounted for virtiofsd, and records the
//! keeper as the VM's launcher ([`crate::storage::record_launcher`]). A new
//! helper asks that keeper for qemu ([`crate::driver::keep::reclaim`]),
//! listens on the agent socket again for qemu to reconnect the agent's
//! port, pings the agent, serves the network card's frames with the
//! sandbox's policy again and confirms.
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::driver::{Origin, QemuDriver, VmInstance};
use super::instance::{Instance as QemuInstance, QEMU_RECORD};
use super::keeper::KEEP_SOCKET;
use super::share::Share;
use crate::driver::network::pidfd_kill;
use crate::driver::{BootSpec, DriverError, Egress, Orphan, keep};
use sandbox_agent::mux::Mux;
use sandbox_agent::protocol::Frame;

/// The record's file name in a sandbox's VM directory.
const RECORD: &str = "qemu.json";
/// How long a new helper gives an adopted vm to reconnect its agent and
/// answer: qemu reconnects within a second; the guest agent reopens its
/// port and answers a ping within a few under TCG.
const ADOPT_TIMEOUT: Duration = Duration::from_secs(20);
/// How long qemu has to reconnect the agent's port.
const RECONNECT_WAIT: Duration = Duration::from_secs(10);

/// Where a sandbox's vm lives on the host.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Hosted {
    /// The vm's run dir (sockets, console, the keeper's socket).
    pub run_dir: PathBuf,
    /// Where a root helper mounted the workspace for virtiofsd.
    pub share_mount: Option<PathBuf>,
}

impl Hosted {
    /// Records it in the VM directory `dir`, with the keeper (pid `keeper`)
    /// as the VM's launcher. Not fatal: only a helper adopting the vm reads
    /// it; without it the vm is killed with its helper's other leftovers.
    pub fn record(&self, dir: &Path, keeper: Option<u32>) {
        let written = serde_json::to_vec(self)
            .map_err(std::io::Error::other)
            .and_then(|json| std::fs::write(dir.join(RECORD), json));
        match written {
            Ok(()) => {
                if let Some(pid) = keeper {
                    crate::storage::record_launcher(dir, pid);
                }
            }
            Err(e) => tracing::warn!(dir = %dir.display(), error = %e, "cannot record the vm for a helper that would adopt it"),
        }
    }

    fn read(dir: &Path) -> Result<Hosted, DriverError> {
        let text = std::fs::read(dir.join(RECORD)).map_err(|e| DriverError::io("read the vm's record", e))?;
        serde_json::from_slice(&text).map_err(|e| DriverError::InitFailed(format!("{RECORD} is not a vm record: {e}")))
    }
}

impl QemuDriver {
    /// Takes over the sandbox vm of `spec` whose keeper is `keeper`.
    pub(super) async fn adopt_vm(&self, spec: &BootSpec, keeper: &Orphan) -> Result<Arc<VmInstance>, DriverError> {
        let mapper = self.mapper().map_err(DriverError::Unavailable)?.clone();
        let hosted = Hosted::read(&spec.dir)?;
        let socket = hosted.run_dir.join(KEEP_SOCKET);
        let kept = tokio::task::spawn_blocking(move || keep::reclaim(&socket))
            .await
            .map_err(|e| DriverError::InitFailed(format!("reclaiming the vm: {e}")))??;
        // Ours from the handover on, in both records: another helper
        // starting now must not take it for a dead helper's leftover.
        crate::storage::record_adopted(&spec.dir, keeper);
        crate::leftovers::record_owned(&hosted.run_dir.join(QEMU_RECORD), keeper);
        let qemu = kept.pid1fd.try_clone().map_err(|e| DriverError::io("keep qemu's pidfd", e))?;
        let run_dir = hosted.run_dir.clone();
        let taken = async move {
            let mut vm = QemuInstance::adopt(&run_dir, kept).map_err(|e| DriverError::InitFailed(e.to_string()))?;
            let stream = vm.accept(RECONNECT_WAIT).await.map_err(|e| DriverError::InitFailed(e.to_string()))?;
            let mux = Mux::open_side(stream);
            match mux.open(Frame::Ping)?.next().await {
                Ok(Some(Frame::Pong)) => {}
                other => return Err(DriverError::InitFailed(format!("the agent answered {other:?} to ping"))),
            }
            let net = match (vm.take_network(), &spec.egress) {
                (Some(card), Some(Egress::Stack(policy, events))) => {
                    Some(card.serve(policy.clone(), events.clone()).map_err(|e| DriverError::InitFailed(e.to_string()))?)
                }
                (None, Some(_)) => return Err(DriverError::InitFailed("its keeper kept no network card".into())),
                _ => None,
            };
            vm.confirm().map_err(|e| DriverError::InitFailed(e.to_string()))?;
            Ok((vm, mux, net))
        };
        let (vm, mux, net) = match tokio::time::timeout(ADOPT_TIMEOUT, taken).await {
            Ok(Ok(taken)) => taken,
            // Killed now, not when its keeper's wait ends: its sandbox comes
            // back as lost, under the same id, at once.
            Ok(Err(e)) => {
                pidfd_kill(&qemu, libc::SIGKILL);
                return Err(e);
            }
            Err(_) => {
                pidfd_kill(&qemu, libc::SIGKILL);
                return Err(DriverError::Timeout("the vm's agent to answer"));
            }
        };
        let cgroup = self.cgroup_layout().and_then(|layout| layout.existing(&spec.id));
        let share = hosted.share_mount.map(Share::kept);
        Ok(Arc::new(VmInstance::new(vm, mux, mapper, hosted.run_dir, Origin::Kept, cgroup, share, net, self)))
    }
}
