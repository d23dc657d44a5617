//! The namespace driver: what this host can do ([`Driver`]) and how one VM
//! is started, stopped and cleaned up ([`launch`]).
//!
//! A VM is a launcher process (re-exec of this binary) in fresh user, mount,
//! pid, ipc, uts, net and cgroup namespaces whose PID 1 runs the agent. The
//! pieces live in one file each: [`userns`] id maps, [`cgroup`] limits,
//! [`rootfs`] the filesystem, [`seccomp`] the syscall filter, [`network`]
//! loopback and the EGRESS tun, [`init`] the in-sandbox side, [`launch`] the helper
//! side, [`warm`] the launcher kept ready for the next start.
use std::path::PathBuf;
use std::sync::Arc;

pub mod cgroup;
pub mod init;
pub mod launch;
pub mod network;
pub mod oom;
pub mod qemu;
pub mod rootfs;
pub mod seccomp;
pub mod userns;
pub mod warm;

/// Why the driver could not start, stop or build a VM.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// A system call failed.
    #[error("{what}: {source}")]
    Sys {
        /// What was being done.
        what: String,
        /// The errno.
        source: nix::errno::Errno,
    },
    /// File or process I/O failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The user namespace could not be mapped.
    #[error("user namespace: {0}")]
    UserNs(String),
    /// A cgroup could not be created or configured.
    #[error("cgroup: {0}")]
    Cgroup(String),
    /// The seccomp filter could not be built or installed.
    #[error("seccomp: {0}")]
    Seccomp(String),
    /// The sandbox's init reported a failure (or died) during setup.
    #[error("vm init: {0}")]
    InitFailed(String),
    /// The agent did not answer its first ping.
    #[error("agent: {0}")]
    Agent(#[from] crate::agent::mux::MuxError),
    /// A step did not finish in time.
    #[error("timed out waiting for {0}")]
    Timeout(&'static str),
}

impl DriverError {
    /// An I/O error with context.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        DriverError::Io { what: what.into(), source }
    }
}

/// What this host offers for running VMs, probed once at helper start.
#[derive(Debug)]
pub struct Driver {
    /// This binary, re-executed as each VM's launcher.
    self_exe: PathBuf,
    /// The id map every VM gets and how to install it, or why VMs cannot
    /// get a user namespace as this user.
    ids: Result<userns::IdMapper, String>,
    cgroups: Option<cgroup::CgroupLayout>,
    /// Prepares VM launchers; `None` when VMs cannot run here (`ids`).
    launchers: Option<Arc<warm::Launchers>>,
    /// Why VMs run without cpu/memory/pids limits, if they do.
    no_limits: Option<String>,
    /// Why EGRESS cannot be served, if it cannot.
    no_egress: Option<String>,
}

impl Driver {
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
        let ids = userns::IdMapper::detect();
        let launchers = ids.as_ref().ok().map(|mapper| {
            warm::Launchers::new(launch::Spawner {
                self_exe: self_exe.clone(),
                mapper: mapper.clone(),
                cgroups: cgroups.clone(),
                eth0: no_egress.is_none(),
            })
        });
        Ok(Driver { self_exe, ids, cgroups, launchers, no_limits, no_egress })
    }

    /// Prepares a launcher in the background for the next start.
    pub fn keep_warm(&self) {
        if let Some(launchers) = &self.launchers {
            launchers.refill();
        }
    }

    /// Starts a VM (see [`launch::launch`]) in the warm launcher when there
    /// is one, and has the next one prepared as soon as it is taken.
    pub async fn launch(
        &self,
        spec: &launch::LaunchSpec,
    ) -> Result<(launch::Instance, tokio::process::Child), DriverError> {
        // Launchers exist exactly when VMs have an id map (see `detect`).
        let Some(launchers) = &self.launchers else {
            return Err(DriverError::UserNs(self.unavailable_reason().unwrap_or_default()));
        };
        let taken = launchers.take().await;
        launchers.refill();
        launch::launch(taken?, spec).await
    }

    /// How many starts found a launcher prepared ahead (warm) and how many
    /// prepared their own (cold), for GetInfo.
    pub fn launch_counts(&self) -> (u64, u64) {
        self.launchers.as_ref().map_or((0, 0), |l| {
            let c = l.counts();
            (c.warm.load(std::sync::atomic::Ordering::Relaxed), c.cold.load(std::sync::atomic::Ordering::Relaxed))
        })
    }

    /// Releases host-wide resources once no VM runs (the helper is exiting):
    /// the warm launcher and its cgroup, then the VMs' parent group.
    pub async fn release(&self) {
        if let Some(launchers) = &self.launchers {
            launchers.close().await;
        }
        if let Some(cgroups) = &self.cgroups {
            cgroups.remove_parent();
        }
    }

    /// Capability names for GetInfo.
    pub fn capabilities(&self) -> Vec<String> {
        let mut caps = vec!["exec", "exec.tty", "network.none", "seccomp"];
        if self.no_egress.is_none() {
            caps.push("network.egress");
            caps.push("network.policy");
        }
        if let Some(cg) = &self.cgroups {
            caps.push(cg.capability());
        }
        if self.ids.is_ok() {
            caps.push("userns");
        }
        caps.into_iter().map(String::from).collect()
    }

    /// Why VMs cannot run here at all, if they cannot.
    pub fn unavailable_reason(&self) -> Option<String> {
        self.ids.as_ref().err().cloned()
    }

    /// The id map of this helper's VMs (and of the images they can run),
    /// when it has one.
    pub fn id_mapper(&self) -> Option<&userns::IdMapper> {
        self.ids.as_ref().ok()
    }

    /// Copies a running VM's writable layer `src` to `dst` with the rights of
    /// the VM's root over its files (reading 0600 files of any of its ids,
    /// giving the copies their owners). A root helper has those rights
    /// itself; an ordinary user's helper runs the copy in a child that
    /// joined the VM's user namespace.
    pub fn copy_layer(
        &self,
        ns: &launch::VmNamespaces,
        src: &std::path::Path,
        dst: &std::path::Path,
    ) -> Result<(), crate::image::ImageError> {
        if nix::unistd::geteuid().is_root() {
            return crate::image::copy_tree(src, dst);
        }
        let failed = |detail: String| crate::image::ImageError::CopyFailed {
            what: format!("{} to {}", src.display(), dst.display()),
            detail,
        };
        let mut cmd = std::process::Command::new(&self.self_exe);
        cmd.arg("__copy-layer").arg(src).arg(dst).env_clear().stdin(std::process::Stdio::null());
        let out = userns::run_joined(&ns.user, cmd).map_err(|e| failed(e.to_string()))?;
        if out.status.success() {
            return Ok(());
        }
        Err(failed(format!("{}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim())))
    }

    /// Why a VM runs without cpu/memory/pids limits, as the contract's
    /// `limits_not_enforced` says it: empty when it has its cgroup (which
    /// every VM has whenever the host has cgroups: launch fails otherwise).
    pub fn limits_not_enforced(&self, has_cgroup: bool) -> String {
        if has_cgroup { String::new() } else { self.no_limits.clone().unwrap_or_default() }
    }

    /// Why EGRESS networking cannot be provided, if it cannot.
    pub fn egress_unavailable(&self) -> Option<&str> {
        self.no_egress.as_deref()
    }
}
