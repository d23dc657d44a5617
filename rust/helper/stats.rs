//! Resource usage of a running VM: what the guest reads itself, through
//! its agent (CPU time, memory, tasks, interface counters; the same on every
//! driver), its limits and OOM kills ([`HostFacts`]: the sandbox's cgroup
//! in a vm's guest, where they hold, else what the host knows) and the time
//! since the start.
use super::driver::HostFacts;
use super::error::HelperError;
use super::vm::RunHandles;

/// One reading. Counters nobody has are 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// CPU time of every process in the VM.
    pub cpu_usage_ns: u64,
    /// Memory in use (by the sandbox's cgroup, in a vm's guest).
    pub memory_used_bytes: u64,
    /// Tasks now (in the sandbox's cgroup, in a vm's guest).
    pub pids: u64,
    /// Bytes received on non-loopback interfaces.
    pub net_rx_bytes: u64,
    /// Bytes sent on non-loopback interfaces.
    pub net_tx_bytes: u64,
    /// Since the VM started.
    pub uptime_ms: u64,
    /// Limits and OOM kills.
    pub limits: HostFacts,
}

/// Reads the usage of the VM behind `run`.
pub async fn read(run: &RunHandles) -> Result<Usage, HelperError> {
    let guest = super::guest::stats(&run.agent).await?;
    // The guest's group holds the sandbox's limits where it has one (the
    // host's cgroup around a vm counts qemu, not the sandbox's processes).
    let (memory_used_bytes, pids, limits) = match guest.group {
        Some(g) => (
            g.memory_used_bytes,
            g.pids,
            HostFacts {
                memory_limit_bytes: g.memory_limit_bytes,
                pids_limit: g.pids_limit,
                oom_killed: g.oom_kills > 0,
            },
        ),
        None => (guest.memory_used_bytes, guest.pids, run.instance.host_facts()),
    };
    Ok(Usage {
        cpu_usage_ns: guest.cpu_usage_ns,
        memory_used_bytes,
        pids,
        net_rx_bytes: guest.net_rx_bytes,
        net_tx_bytes: guest.net_tx_bytes,
        uptime_ms: u64::try_from(run.started.elapsed().as_millis()).unwrap_or(u64::MAX),
        limits,
    })
}
