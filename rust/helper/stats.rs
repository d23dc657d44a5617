//! Resource usage of a running VM: memory, tasks and CPU time as the
//! sandbox's cgroup counts them where one holds it (a vm guest's own group,
//! or on the namespace driver the host's group around the whole sandbox),
//! else as the guest sums them over its processes; interface counters from
//! the guest (the same on every driver); its limits and OOM kills
//! ([`HostFacts`]) and the time since the start.
use super::driver::HostFacts;
use super::error::HelperError;
use super::vm::RunHandles;
use sandbox_agent::protocol::FailKind;

/// One reading. Counters nobody has are 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// CPU time of the sandbox's processes, exited ones included.
    pub cpu_usage_ns: u64,
    /// Memory in use: the cgroup's working set where there is one.
    pub memory_used_bytes: u64,
    /// Tasks now.
    pub pids: u64,
    /// Bytes received on non-loopback interfaces.
    pub net_rx_bytes: u64,
    /// Bytes sent on non-loopback interfaces.
    pub net_tx_bytes: u64,
    /// Since the VM started.
    pub uptime_ms: u64,
    /// Limits and OOM kills (and the cgroup's counters the figures above
    /// came from, if any).
    pub limits: HostFacts,
}

/// Reads the usage of the VM behind `run`.
pub async fn read(run: &RunHandles) -> Result<Usage, HelperError> {
    let guest = super::guest::stats(&run.agent).await?;
    // The guest's group holds the sandbox's limits where it has one (the
    // host's cgroup around a vm counts qemu, not the sandbox's processes).
    let facts = guest.group.map_or_else(|| run.instance.host_facts(), HostFacts::from);
    // The group's counters are what its limits are enforced against; the
    // guest's sums over /proc count a page shared by many processes once
    // per process, so they stand in only for a counter the group lacks.
    let group = facts.usage.unwrap_or_default();
    let prefer = |counted: u64, summed: u64| if counted > 0 { counted } else { summed };
    Ok(Usage {
        cpu_usage_ns: prefer(group.cpu_usage_ns, guest.cpu_usage_ns),
        memory_used_bytes: prefer(group.memory_used_bytes, guest.memory_used_bytes),
        pids: prefer(group.pids, guest.pids),
        net_rx_bytes: guest.net_rx_bytes,
        net_tx_bytes: guest.net_tx_bytes,
        uptime_ms: u64::try_from(run.started.elapsed().as_millis()).unwrap_or(u64::MAX),
        limits: facts,
    })
}

/// Share of the task limit, in percent, at or above which a refused fork
/// is put down to it. The reading comes just after the refusal, when a
/// task or two may have ended; far below the limit, the refusal was the
/// host's (its own task limit), and naming the sandbox's would mislead.
const NEAR_LIMIT_PCT: u64 = 90;

/// `e`, or for a fork the kernel refused ([`FailKind::ForkRefused`]) in a
/// sandbox at its task limit, [`HelperError::ProcessLimit`] naming it.
pub async fn fork_refused(run: &RunHandles, e: HelperError) -> HelperError {
    if !matches!(e, HelperError::Guest { kind: FailKind::ForkRefused, .. }) {
        return e;
    }
    match read(run).await {
        Ok(u) => at_limit(u.pids, u.limits.pids_limit).unwrap_or(e),
        Err(_) => e,
    }
}

/// The limit error when `pids` is near a known `limit`.
fn at_limit(pids: u64, limit: u64) -> Option<HelperError> {
    (limit > 0 && pids.saturating_mul(100) >= limit.saturating_mul(NEAR_LIMIT_PCT))
        .then_some(HelperError::ProcessLimit { pids, limit })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_fork_names_the_limit_only_near_it() {
        let e = at_limit(64, 64).unwrap();
        assert!(
            e.to_string()
                .starts_with("cannot start the process: the sandbox is at its process limit (pids = 64 of 64)")
        );
        assert!(at_limit(60, 64).is_some(), "a few ended since the refusal");
        assert!(at_limit(10, 64).is_none(), "far below: not the sandbox's limit");
        assert!(at_limit(64, 0).is_none(), "no limit known");
    }
}
