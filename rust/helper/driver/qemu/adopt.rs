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
use super::instance::{Instance as QemuInstance, KEEPER_RECORD};
use super::keeper::KEEP_SOCKET;
use super::share::Share;
use crate::driver::network::pidfd_kill;
use crate::driver::keep::{self, Keeps};
use crate::driver::{BootSpec, DriverError, Egress, Orphan};
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
        let tmp = dir.join(format!("{RECORD}.tmp"));
        let written = serde_json::to_vec(self)
            .map_err(std::io::Error::other)
            .and_then(|json| std::fs::write(&tmp, json))
            .and_then(|()| std::fs::rename(&tmp, dir.join(RECORD)));
        match written {
            Ok(()) => {
                if let Some(pid) = keeper {
                    crate::storage::record_launcher(dir, pid);
                }
            }
            Err(e) => tracing::warn!(dir = %dir.display(), error = %e, "cannot record the vm for a helper that would adopt it"),
        }
    }

    /// The record of vm `id` in `dir`, if it names a run dir under
    /// `run_root` and (a root helper's) a mount of that vm's workspace
    /// where [`Share`] makes them: a root helper unmounts what it names.
    fn read(dir: &Path, id: &str, run_root: &Path) -> Result<Hosted, DriverError> {
        let text = std::fs::read(dir.join(RECORD)).map_err(|e| DriverError::io("read the vm's record", e))?;
        let hosted: Hosted = serde_json::from_slice(&text)
            .map_err(|e| DriverError::InitFailed(format!("{RECORD} is not a vm record: {e}")))?;
        let bad = |what: &str, path: &Path| DriverError::InitFailed(format!("{RECORD} names {what} {}", path.display()));
        if hosted.run_dir.parent() != Some(run_root) {
            return Err(bad("a run dir outside the vm driver's", &hosted.run_dir));
        }
        if let Some(mount) = &hosted.share_mount
            && !Share::is_made_for(mount, id)
        {
            return Err(bad("a workspace mount the vm driver does not make", mount));
        }
        Ok(hosted)
    }
}

/// The run dirs the sandboxes' records under the state dir name: the vms
/// a new helper may adopt.
pub(super) fn recorded_run_dirs() -> std::collections::HashSet<PathBuf> {
    let root = sandbox_base::paths::state_dir().join("vms");
    let records = std::fs::read_dir(root).into_iter().flatten().flatten();
    records
        .filter_map(|e| std::fs::read(e.path().join(RECORD)).ok())
        .filter_map(|text| serde_json::from_slice::<Hosted>(&text).ok())
        .map(|h| h.run_dir)
        .collect()
}

impl QemuDriver {
    /// Takes over the sandbox vm of `spec` whose keeper is `keeper`.
    pub(super) async fn adopt_vm(&self, spec: &BootSpec, keeper: &Orphan) -> Result<Arc<VmInstance>, DriverError> {
        let mapper = self.mapper().map_err(DriverError::Unavailable)?.clone();
        let hosted = Hosted::read(&spec.dir, &spec.id, self.run_root())?;
        // Unmounted on every way out but the adoption's success.
        let share = hosted.share_mount.clone().map(Share::kept);
        let socket = hosted.run_dir.join(KEEP_SOCKET);
        let pid = keeper.pid;
        let kept = tokio::task::spawn_blocking(move || keep::reclaim(&socket, pid, Keeps::Qemu))
            .await
            .map_err(|e| DriverError::InitFailed(format!("reclaiming the vm: {e}")))??;
        // Ours from the handover on, in both records: another helper
        // starting now must not take it for a dead helper's leftover.
        crate::storage::record_adopted(&spec.dir, keeper);
        crate::leftovers::record_owned(&hosted.run_dir.join(KEEPER_RECORD), keeper);
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
        Ok(Arc::new(VmInstance::new(vm, mux, mapper, hosted.run_dir, Origin::Kept, cgroup, share, net, self)))
    }
}
