//! The namespace driver: what this host can do ([`NamespaceDriver`]) and how
//! one VM is started, stopped and cleaned up ([`launch`]).
//!
//! A VM is a launcher process (re-exec of this binary) in fresh user, mount,
//! pid, ipc, uts, net and cgroup namespaces whose PID 1 runs the agent. The
//! pieces live in one file each: [`cgroup`] limits,
//! [`rootfs`] the filesystem, [`seccomp`] the syscall filter, [`network`]
//! loopback and the EGRESS tun, [`init`] the in-sandbox side, [`launch`] the helper
//! side, [`warm`] the launcher kept ready for the next start, [`freeze`]
//! stopping a VM's processes while its layer is copied, [`keep`](super::keep) a VM
//! outliving its helper and adopted by the next.
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::keep;
use super::{BootSpec, Capabilities, Driver, DriverError, Exit, HostFacts, HostProcesses, Instance};
use crate::HelperError;
use crate::agent_link::Dialer;
use sandbox_agent::mux::Mux;

pub mod cgroup;
pub mod freeze;
pub mod init;
pub mod launch;
pub mod network;
pub mod oom;
pub mod rootfs;
pub mod seccomp;
pub mod warm;

/// Bound on adopting one VM once its launcher handed it over (its agent's
/// answer, mostly): the helper adopts its VMs before it serves anyone, and
/// a VM whose agent stalls must not hold the others up.
const ADOPT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// What this host offers for running VMs, probed once at helper start.
#[derive(Debug)]
pub struct NamespaceDriver {
    /// This binary, re-executed as each VM's launcher.
    self_exe: PathBuf,
    /// The id map every VM gets and how to install it, or why VMs cannot
    /// get a user namespace as this user.
    ids: Result<sandbox_userns::IdMapper, String>,
    cgroups: Option<cgroup::CgroupLayout>,
    /// Prepares VM launchers; `None` when VMs cannot run here (`ids`).
    launchers: Option<Arc<warm::Launchers>>,
    /// Why VMs run without cpu/memory/pids limits, if they do.
    no_limits: Option<String>,
    /// Why EGRESS cannot be served, if it cannot.
    no_egress: Option<String>,
}

impl NamespaceDriver {
    /// Probes the host: id mapping, cgroups, the tun device.
    pub fn detect() -> Result<Self, DriverError> {
        let self_exe = std::env::current_exe().map_err(|e| DriverError::io("locate own binary", e))?;
        let (cgroups, no_limits) = match cgroup::CgroupLayout::detect() {
            Ok(layout) => (Some(layout), None),
            Err(reason) => {
                tracing::warn!(%reason, "cgroups unavailable: VMs run without cpu/memory/pids limits");
                (None, Some(reason.to_string()))
            }
        };
        let no_egress = match std::fs::metadata("/dev/net/tun") {
            Ok(_) => None,
            Err(e) => {
                tracing::warn!(error = %e, "/dev/net/tun unavailable: EGRESS networking unavailable");
                Some(format!("/dev/net/tun: {e}"))
            }
        };
        let ids = sandbox_userns::IdMapper::detect();
        let launchers = ids.as_ref().ok().map(|mapper| {
            warm::Launchers::new(launch::Spawner {
                self_exe: self_exe.clone(),
                mapper: mapper.clone(),
                cgroups: cgroups.clone(),
                eth0: no_egress.is_none(),
            })
        });
        Ok(NamespaceDriver { self_exe, ids, cgroups, launchers, no_limits, no_egress })
    }

    /// Starts a VM (see [`launch::launch`]) in the warm launcher when there
    /// is one, and has the next one prepared as soon as it is taken.
    async fn launch(
        &self,
        spec: &launch::LaunchSpec,
    ) -> Result<(launch::Instance, tokio::process::Child), DriverError> {
        // Launchers exist exactly when VMs have an id map (see `detect`).
        let Some(launchers) = &self.launchers else {
            return Err(sandbox_userns::UserNsError::Map(self.unavailable_reason().unwrap_or_default()).into());
        };
        let taken = launchers.take().await;
        launchers.refill();
        let (prepared, warm) = taken?;
        match launch::launch(prepared, spec).await {
            // Killed while it waited, but not yet gone when taken (a
            // SIGKILL takes effect when the launcher next runs): the VM
            // never began, so it begins again in a launcher of its own.
            Err(DriverError::LauncherExited) if warm => {
                tracing::warn!("the warm vm launcher died as it was taken; preparing another");
                launch::launch(launchers.prepare_now().await?, spec).await
            }
            r => r,
        }
    }

    /// A started or adopted VM, as the VM manager holds it.
    fn instance(&self, inner: launch::Instance, launcher: Launcher) -> Arc<dyn Instance> {
        let limits_not_enforced =
            if inner.usage_files().is_some() { String::new() } else { self.no_limits.clone().unwrap_or_default() };
        Arc::new(NamespaceInstance {
            inner,
            launcher: std::sync::Mutex::new(Some(launcher)),
            self_exe: self.self_exe.clone(),
            limits_not_enforced,
        })
    }

    /// Where VM cgroups go on this host, or why VMs run without limits:
    /// shared with the other drivers, whose processes live in the same
    /// per-VM groups.
    pub fn cgroup_layout(&self) -> Result<cgroup::CgroupLayout, String> {
        self.cgroups.clone().ok_or_else(|| self.no_limits.clone().unwrap_or_default())
    }

    /// The id map of this helper's VMs (and of the images they can run),
    /// when it has one.
    pub fn id_mapper(&self) -> Option<&sandbox_userns::IdMapper> {
        self.ids.as_ref().ok()
    }
}

#[tonic::async_trait]
impl Driver for NamespaceDriver {
    fn name(&self) -> &'static str {
        "namespaces"
    }

    fn unavailable_reason(&self) -> Option<String> {
        self.ids.as_ref().err().cloned()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            tty: true,
            network_egress: self.no_egress.is_none(),
            limits: self.cgroups.is_some(),
            cgroups: self.cgroups.as_ref().map(|cg| cg.capability()),
            seccomp: true,
            own_kernel: false,
            dial: true,
            snapshot: true,
            // Shared kernel: dockerd would need the host's privileges.
            containers: false,
            pull_images: false,
        }
    }

    async fn boot(&self, spec: &BootSpec) -> Result<Arc<dyn Instance>, DriverError> {
        if let Some(reason) = self.unavailable_reason() {
            return Err(DriverError::Unavailable(reason));
        }
        if spec.egress.is_some()
            && let Some(reason) = &self.no_egress
        {
            return Err(DriverError::Unavailable(format!("network EGRESS: {reason}")));
        }
        if spec.egress.is_some() {
            sandbox_net::setup::write_resolv_conf(&spec.dir.join("resolv.conf"))?;
        }
        let (instance, child) = self.launch(&launch_spec(spec)).await?;
        Ok(self.instance(instance, Launcher::Child(child)))
    }

    async fn adopt(&self, spec: &BootSpec, launcher: &crate::driver::Orphan) -> Result<Arc<dyn Instance>, DriverError> {
        if let Some(reason) = self.unavailable_reason() {
            return Err(DriverError::Unavailable(reason));
        }
        let launch_spec = launch_spec(spec);
        let keeper = launch_spec.keeper_socket.clone();
        let pid = launcher.pid;
        let kept = tokio::task::spawn_blocking(move || keep::reclaim(&keeper, pid, keep::Keeps::Pid1))
            .await
            .map_err(|e| DriverError::InitFailed(format!("reclaiming the vm: {e}")))??;
        // Ours from the handover on: another helper starting now must not
        // take it for a dead helper's leftover.
        crate::storage::record_adopted(&spec.dir, launcher);
        let pid1 = kept.pid1fd.try_clone().map_err(|e| DriverError::io("keep PID 1's pidfd", e))?;
        let adopted = launch::adopt(&launch_spec, kept, self.cgroups.as_ref());
        let Ok(adopted) = tokio::time::timeout(ADOPT_TIMEOUT, adopted).await else {
            // Killed now, not when its launcher's wait ends: its sandbox
            // comes back as lost, under the same id, at once.
            network::pidfd_kill(&pid1, libc::SIGKILL);
            return Err(DriverError::Timeout("the vm's agent to answer"));
        };
        let (instance, conn) = adopted?;
        keep::confirm(&conn)?;
        Ok(self.instance(instance, Launcher::Kept(conn)))
    }

    fn keep_warm(&self) {
        if let Some(launchers) = &self.launchers {
            launchers.refill();
        }
    }

    /// Starts that found a launcher prepared ahead (warm), and those that
    /// prepared their own (cold).
    fn launch_counts(&self) -> (u64, u64) {
        self.launchers.as_ref().map_or((0, 0), |l| {
            let c = l.counts();
            (c.warm.load(std::sync::atomic::Ordering::Relaxed), c.cold.load(std::sync::atomic::Ordering::Relaxed))
        })
    }

    async fn release(&self) {
        if let Some(launchers) = &self.launchers {
            launchers.close().await;
        }
        if let Some(cgroups) = &self.cgroups {
            cgroups.remove_parent();
        }
    }
}

/// What tells the helper that a VM ended: its launcher, which exits with
/// PID 1.
#[derive(Debug)]
enum Launcher {
    /// This helper's child.
    Child(tokio::process::Child),
    /// A dead helper's, adopted: its keeper connection reports the end.
    Kept(std::os::fd::OwnedFd),
}

/// A running namespace sandbox: its launcher and the host resources
/// [`launch::Instance`] holds.
#[derive(Debug)]
struct NamespaceInstance {
    inner: launch::Instance,
    /// Taken by [`Instance::take_exit`].
    launcher: std::sync::Mutex<Option<Launcher>>,
    /// This binary, for layer copies as the VM's root.
    self_exe: PathBuf,
    /// Why this run has no cgroup limits; empty when it has.
    limits_not_enforced: String,
}

impl Instance for NamespaceInstance {
    fn connection(&self) -> Mux {
        self.inner.connection.clone()
    }

    fn agent_dialer(&self) -> Dialer {
        self.inner.agent_dialer()
    }

    fn request_stop(&self) {
        self.inner.request_stop();
    }

    fn kill(&self) {
        self.inner.kill();
    }

    fn take_exit(&self) -> Option<Exit> {
        let launcher = self.launcher.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take()?;
        Some(match launcher {
            Launcher::Child(mut child) => Box::pin(async move {
                match child.wait().await {
                    Ok(st) => describe_exit(st),
                    Err(e) => format!("lost track of init: {e}"),
                }
            }),
            Launcher::Kept(conn) => Box::pin(async move {
                match keep::wait_exit(conn).await {
                    Some(code) => format!("init exited with status {code}"),
                    None => "the vm's launcher died".into(),
                }
            }),
        })
    }

    fn snapshot_layer(&self, upper: &Path, dst: &Path) -> Result<(), HelperError> {
        let frozen = freeze::freeze(self.inner.pid1)?;
        let copied = copy_layer(&self.self_exe, &self.inner.ns, upper, dst);
        drop(frozen);
        Ok(copied?)
    }

    fn host_facts(&self) -> HostFacts {
        self.inner.usage_files().map(|u| u.facts()).unwrap_or_default()
    }

    fn limits_not_enforced(&self) -> String {
        self.limits_not_enforced.clone()
    }

    fn host_processes(&self) -> Option<HostProcesses> {
        Some(HostProcesses { pid1: self.inner.pid1, agent: self.inner.agent })
    }

    fn cleanup(&self) {
        self.inner.cleanup();
    }
}

/// What the launcher of the VM `spec` gets, and where its sockets are.
fn launch_spec(spec: &BootSpec) -> launch::LaunchSpec {
    launch::LaunchSpec {
        id: spec.id.clone(),
        init: init::InitConfig {
            hostname: spec.hostname.clone(),
            lowers: spec.layers.clone(),
            upper: spec.dir.join("upper"),
            work: spec.dir.join("work"),
            mounts: spec.mounts.clone(),
            resolv_conf: spec.egress.as_ref().map(|_| spec.dir.join("resolv.conf")),
            shm_bytes: oom::shm_bytes(spec.limits.memory_bytes),
            egress: spec.egress.is_some(),
        },
        limits: spec.limits,
        egress: spec.egress.clone(),
        agent_socket: crate::storage::agent_socket(&spec.id),
        keeper_socket: crate::storage::keeper_socket(&spec.id),
        dir: spec.dir.clone(),
    }
}

/// Copies a running VM's writable layer `src` to `dst` with the rights of
/// the VM's root over its files (reading 0600 files of any of its ids,
/// giving the copies their owners). A root helper has those rights itself;
/// an ordinary user's helper runs the copy in a child (this binary,
/// `self_exe`) that joined the VM's user namespace.
fn copy_layer(
    self_exe: &Path,
    ns: &launch::VmNamespaces,
    src: &Path,
    dst: &Path,
) -> Result<(), sandbox_image::ImageError> {
    if nix::unistd::geteuid().is_root() {
        return sandbox_image::copy_tree(src, dst);
    }
    let failed = |detail: String| sandbox_image::ImageError::CopyFailed {
        what: format!("{} to {}", src.display(), dst.display()),
        detail,
    };
    let mut cmd = std::process::Command::new(self_exe);
    cmd.arg("__copy-layer").arg(src).arg(dst).env_clear().stdin(std::process::Stdio::null());
    let out = sandbox_userns::run_joined(&ns.user, cmd).map_err(|e| failed(e.to_string()))?;
    if out.status.success() {
        return Ok(());
    }
    Err(failed(format!("{}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim())))
}

fn describe_exit(st: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt as _;
    match (st.code(), st.signal()) {
        (Some(c), _) => format!("init exited with status {c}"),
        (None, Some(s)) => format!("init was killed by signal {s}"),
        _ => "init exited".into(),
    }
}
