//! The driver seam: the one thing that differs between a namespace sandbox
//! and a real VM. A [`Driver`] boots an [`Instance`] from a [`BootSpec`];
//! the instance gives a byte-stream transport to its agent (already
//! connected once at boot), stops, is killed, is waited for, and copies
//! its writable layer. Everything else (exec, signals, background
//! processes, copies, dial, usage) goes through the agent protocol
//! ([`sandbox_agent::mux`]), the same on every driver.
//!
//! - [`namespace`]: Linux namespaces, cgroups and seccomp around one kernel.
//! - [`qemu`]: qemu microVMs with their own kernel (the `vm` driver's groundwork).
//! - [`swift`]: VMs whose layer lives across swift-bridge (Swift on a Mac;
//!   a double on the namespace driver elsewhere).
//!
//! Drivers report what they can do as typed [`Capabilities`], which GetInfo
//! carries to the orchestrator.
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;

use crate::agent_link::Dialer;
use crate::netstack::events::Events;
use sandbox_agent::mux::Mux;
use sandbox_net::policy::NetworkPolicy;

#[cfg(linux_host)]
pub mod keep;
#[cfg(linux_host)]
pub mod namespace;
#[cfg(linux_host)]
pub mod qemu;
pub mod swift;

// Host facts the namespace driver owns and others share: cgroup delegation
// (host setup, doctor), the tun request (doctor).
#[cfg(linux_host)]
pub use namespace::{cgroup, network};

/// Why a driver could not start, stop or copy a VM.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// A system call or file or process I/O failed.
    #[error(transparent)]
    Sys(#[from] sandbox_base::error::SysError),
    /// The user namespace could not be mapped, or a mapped process run.
    #[error(transparent)]
    UserNs(#[from] sandbox_userns::UserNsError),
    /// A cgroup could not be created or configured.
    #[error("cgroup: {0}")]
    Cgroup(String),
    /// The seccomp filter could not be built or installed.
    #[error("seccomp: {0}")]
    Seccomp(String),
    /// The sandbox's init reported a failure (or died) during setup.
    #[error("vm init: {0}")]
    InitFailed(String),
    /// The namespace driver's launcher exited before it reported PID 1
    /// (killed, say, while it waited warm for its VM).
    #[error("vm init: the launcher exited during setup")]
    LauncherExited,
    /// The agent did not answer its first ping.
    #[error("agent: {0}")]
    Agent(#[from] sandbox_agent::mux::MuxError),
    /// A step did not finish in time.
    #[error("timed out waiting for {0}")]
    Timeout(&'static str),
    /// The VM layer across the bridge knows no VM by that id.
    #[error("vm layer: no vm {0:?}")]
    LayerNotFound(String),
    /// The VM layer across the bridge failed; its message.
    #[error("vm layer: {0}")]
    LayerFailed(String),
    /// This driver cannot do that here; the message says why.
    #[error("{0}")]
    Unavailable(String),
}

impl DriverError {
    /// An I/O error with context.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        sandbox_base::error::SysError::io(what, source).into()
    }

    /// A failed system call with context.
    pub fn sys(what: impl Into<String>, source: nix::errno::Errno) -> Self {
        sandbox_base::error::SysError::sys(what, source).into()
    }
}

/// Resources one VM may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// CPUs (a quota of that many CPUs' time).
    pub cpus: u32,
    /// Memory, bytes.
    pub memory_bytes: u64,
    /// Tasks.
    pub pids: u32,
}

/// A directory shared from the host into the VM.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BindMount {
    /// Host path.
    pub host: PathBuf,
    /// Absolute, normalized path inside the VM.
    pub guest: PathBuf,
    /// Mounted read-only.
    pub read_only: bool,
}

/// Everything a driver needs to boot one VM, in the helper's terms.
#[derive(Debug, Clone)]
pub struct BootSpec {
    /// VM id.
    pub id: String,
    /// The guest's hostname.
    pub hostname: String,
    /// The image's read-only layers, bottom first.
    pub layers: Vec<PathBuf>,
    /// The VM's own directory: its writable layer (`upper`, `work`) and
    /// whatever the driver keeps per VM.
    pub dir: PathBuf,
    /// Host directories shared into the guest.
    pub mounts: Vec<BindMount>,
    /// CPU, memory and task limits.
    pub limits: Limits,
    /// The OCI reference the root filesystem is pulled from instead of
    /// `layers` (which then hold only what was committed on it); drivers
    /// with [`Capabilities::pull_images`] only.
    pub image_reference: Option<String>,
    /// The disk quota, bytes: the writable layer and the writable mounts
    /// together (a vm's writable disk has this size).
    pub disk_bytes: u64,
    /// EGRESS: where the VM's network card leads; `None` is no network.
    pub egress: Option<Egress>,
}

/// Where an EGRESS VM's network card leads.
#[derive(Debug, Clone)]
pub enum Egress {
    /// The helper's network stack, enforcing this policy and recording its
    /// decisions in these events.
    Stack(NetworkPolicy, Arc<Events>),
    /// A frame socket (one Ethernet frame per datagram) whose other end is
    /// a stack elsewhere: how the Linux double of the Swift layer hands its
    /// VM's card back across the bridge, as a Mac guest's card is.
    Frames(Arc<std::os::fd::OwnedFd>),
}

/// A running VM's limits, usage and OOM kills: what the host's cgroup
/// knows ([`Instance::host_facts`]), or a vm guest's own group, where the
/// sandbox's processes are counted ([`crate::stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostFacts {
    /// Memory limit, 0 if none is enforced.
    pub memory_limit_bytes: u64,
    /// Task limit, 0 if none is enforced.
    pub pids_limit: u64,
    /// The OOM killer fired inside the VM.
    pub oom_killed: bool,
    /// What the cgroup counts now; `None` where no cgroup holds the
    /// sandbox (limits not enforced, a host that cannot see its
    /// processes), and the guest's own sums stand in.
    pub usage: Option<GroupUsage>,
}

/// A sandbox's cgroup's own counters: the figures its limits are enforced
/// against, where summing over processes counts shared pages once per
/// process. A counter that could not be read is 0 (unknown).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupUsage {
    /// Working set: charged memory less the inactive file cache (see
    /// [`sandbox_agent::group::working_set`]).
    pub memory_used_bytes: u64,
    /// Tasks (processes and threads) in the group.
    pub pids: u64,
    /// CPU time of every task that ran in the group, exited ones included.
    pub cpu_usage_ns: u64,
}

impl From<sandbox_agent::protocol::GroupStats> for HostFacts {
    /// A vm guest's group: its limits and counters (it has no CPU time;
    /// the guest's own sum covers the whole VM).
    fn from(g: sandbox_agent::protocol::GroupStats) -> Self {
        HostFacts {
            memory_limit_bytes: g.memory_limit_bytes,
            pids_limit: g.pids_limit,
            oom_killed: g.oom_kills > 0,
            usage: Some(GroupUsage { memory_used_bytes: g.memory_used_bytes, pids: g.pids, cpu_usage_ns: 0 }),
        }
    }
}

/// A process a helper that died left running (a VM's launcher), recorded
/// beside its VM (see `leftovers`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Orphan {
    /// Its pid.
    pub pid: u32,
    /// Its start time, against pid reuse.
    pub start: String,
}

/// Where a VM's processes show on the host (the namespace driver only):
/// the disk quota watcher finds and stops the writers there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostProcesses {
    /// Host pid of the VM's PID 1.
    pub pid1: i32,
    /// Host pid of its agent, spared by the watcher.
    pub agent: i32,
}

/// A future resolving when an instance is gone, with how it ended.
pub type Exit = Pin<Box<dyn Future<Output = String> + Send>>;

/// One running VM, as its driver holds it. Valid from a successful
/// [`Driver::boot`] until [`Instance::cleanup`].
pub trait Instance: Send + Sync + std::fmt::Debug {
    /// The agent connection opened (and pinged) at boot.
    fn connection(&self) -> Mux;
    /// Opens a new connection to the agent (after the first one died).
    fn agent_dialer(&self) -> Dialer;
    /// Asks the guest to shut down (TERM everything); returns at once.
    fn request_stop(&self);
    /// Ends the VM now.
    fn kill(&self);
    /// Resolves once the VM is gone; `None` after the first call.
    fn take_exit(&self) -> Option<Exit>;
    /// Copies the writable layer `upper` to `dst` as it is now, with the
    /// guest paused while it is copied. Blocking: call off the runtime.
    fn snapshot_layer(&self, upper: &Path, dst: &Path) -> Result<(), crate::HelperError>;
    /// Limits and OOM kills as the host sees them.
    fn host_facts(&self) -> HostFacts;
    /// Why this run's limits are not enforced; empty when they are.
    fn limits_not_enforced(&self) -> String;
    /// Where its processes show on the host, if they do.
    fn host_processes(&self) -> Option<HostProcesses>;
    /// Releases what the VM held on the host; call once it is gone.
    fn cleanup(&self);
}

/// Typed capabilities of a driver on this host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// Processes run on a terminal.
    pub tty: bool,
    /// EGRESS networking through the helper's stack, with its policy.
    pub network_egress: bool,
    /// CPU, memory and task limits are enforced.
    pub limits: bool,
    /// The cgroup flavour enforcing them (`cgroups.v1`, `cgroups.v2`).
    pub cgroups: Option<&'static str>,
    /// A syscall filter applies inside.
    pub seccomp: bool,
    /// The guest has its own kernel.
    pub own_kernel: bool,
    /// Dial to guest ports.
    pub dial: bool,
    /// The writable layer can be copied while running (commit, clone).
    pub snapshot: bool,
    /// Containers run inside (dockerd in images that have it).
    pub containers: bool,
    /// Boots images recorded as an OCI reference, pulling them itself.
    pub pull_images: bool,
}

impl Capabilities {
    /// The capability names GetInfo has always listed.
    pub fn names(&self) -> Vec<String> {
        let mut caps = vec!["exec", "network.none"];
        if self.tty {
            caps.push("exec.tty");
        }
        if self.seccomp {
            caps.push("seccomp");
        }
        if self.network_egress {
            caps.push("network.egress");
            caps.push("network.policy");
        }
        if let Some(cg) = self.cgroups {
            caps.push(cg);
        }
        if self.dial {
            caps.push("dial");
        }
        if self.snapshot {
            caps.push("snapshot");
        }
        caps.into_iter().map(String::from).collect()
    }
}

/// One way of running VMs.
#[tonic::async_trait]
pub trait Driver: Send + Sync + std::fmt::Debug {
    /// Its name in GetInfo and in `isolation` settings.
    fn name(&self) -> &'static str;
    /// Why it cannot run VMs on this host, if it cannot.
    fn unavailable_reason(&self) -> Option<String>;
    /// What it can do here.
    fn capabilities(&self) -> Capabilities;
    /// Boots a VM; returns once its agent answers.
    async fn boot(&self, spec: &BootSpec) -> Result<Arc<dyn Instance>, DriverError>;
    /// Takes over the VM `spec` that a helper which died left running, its
    /// launcher still alive; the error says why it cannot be kept (then it
    /// is killed and its sandbox comes back as lost).
    async fn adopt(&self, spec: &BootSpec, launcher: &Orphan) -> Result<Arc<dyn Instance>, DriverError> {
        let _ = (spec, launcher);
        Err(DriverError::Unavailable(format!("the {} driver's VMs end with their helper", self.name())))
    }
    /// Prepares ahead whatever makes the next boot faster.
    fn keep_warm(&self) {}
    /// Boots from a launcher prepared ahead and cold ones, so far (GetInfo's
    /// `warm_starts`, `cold_starts`).
    fn launch_counts(&self) -> (u64, u64) {
        (0, 0)
    }
    /// Releases host-wide resources once no VM runs (helper exit).
    async fn release(&self) {}
}
