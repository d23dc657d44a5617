//! Resource usage of a running VM: what the guest reads itself, through
//! its agent (CPU time, memory, tasks, interface counters; the same on every
//! driver), plus what only the host knows: the namespace driver's cgroup
//! limits and OOM kills, and the time since the start.
use std::path::Path;

use super::driver::cgroup::UsageFiles;
use super::error::HelperError;
use super::vm::RunHandles;

/// One reading. Counters nobody has are 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// CPU time of every process in the VM.
    pub cpu_usage_ns: u64,
    /// Memory in use.
    pub memory_used_bytes: u64,
    /// Memory limit.
    pub memory_limit_bytes: u64,
    /// Tasks now.
    pub pids: u64,
    /// Task limit.
    pub pids_limit: u64,
    /// Bytes received on non-loopback interfaces.
    pub net_rx_bytes: u64,
    /// Bytes sent on non-loopback interfaces.
    pub net_tx_bytes: u64,
    /// Since the VM started.
    pub uptime_ms: u64,
    /// The kernel's OOM killer fired inside the VM at least once.
    pub oom_killed: bool,
}

/// Reads the usage of the VM behind `run`.
pub async fn read(run: &RunHandles) -> Result<Usage, HelperError> {
    let guest = super::guest::stats(&run.agent).await?;
    let mut usage = Usage {
        cpu_usage_ns: guest.cpu_usage_ns,
        memory_used_bytes: guest.memory_used_bytes,
        pids: guest.pids,
        net_rx_bytes: guest.net_rx_bytes,
        net_tx_bytes: guest.net_tx_bytes,
        uptime_ms: u64::try_from(run.started.elapsed().as_millis()).unwrap_or(u64::MAX),
        ..Usage::default()
    };
    // The guest cannot see the limits its host put around it.
    match &run.usage {
        Some(UsageFiles::V1 { memory, pids, .. }) => {
            usage.memory_limit_bytes = number(&memory.join("memory.limit_in_bytes"));
            usage.oom_killed = keyed(&memory.join("memory.oom_control"), "oom_kill") > 0;
            usage.pids_limit = number(&pids.join("pids.max"));
        }
        Some(UsageFiles::V2(dir)) => {
            usage.memory_limit_bytes = number(&dir.join("memory.max"));
            usage.oom_killed = keyed(&dir.join("memory.events"), "oom_kill") > 0;
            usage.pids_limit = number(&dir.join("pids.max"));
        }
        None => {}
    }
    Ok(usage)
}

/// A file holding one number; "max" and unreadable files read as 0
/// (unknown), as the contract says.
fn number(path: &Path) -> u64 {
    std::fs::read_to_string(path).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0)
}

/// The value of `key` in a flat-keyed file (`key value` per line).
fn keyed(path: &Path, key: &str) -> u64 {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    parse_keyed(&text, key)
}

fn parse_keyed(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == key).then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyed_files_are_parsed() {
        let oom = "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n";
        assert_eq!(parse_keyed(oom, "oom_kill"), 2);
        assert_eq!(parse_keyed(oom, "missing"), 0);
        assert_eq!(parse_keyed("usage_usec 1234\nuser_usec 1000\n", "usage_usec"), 1234);
    }
}
