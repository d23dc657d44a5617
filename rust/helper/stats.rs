//! Resource usage of a running VM, read from the host: its cgroup's
//! counters (v1 or v2), its network namespace's interface counters through
//! /proc/<PID 1>/net/dev, and the time since its start.
use std::path::Path;

use super::driver::cgroup::UsageFiles;
use super::error::HelperError;
use super::vm::RunHandles;

/// One reading. Counters the host does not have are 0.
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
pub fn read(run: &RunHandles) -> Result<Usage, HelperError> {
    let mut usage =
        Usage { uptime_ms: u64::try_from(run.started.elapsed().as_millis()).unwrap_or(u64::MAX), ..Usage::default() };
    let dev_path = format!("/proc/{}/net/dev", run.pid1);
    let dev = std::fs::read_to_string(&dev_path).map_err(|e| HelperError::io(dev_path, e))?;
    (usage.net_rx_bytes, usage.net_tx_bytes) = net_bytes(&dev);
    match &run.usage {
        Some(UsageFiles::V1 { memory, pids, cpu }) => {
            usage.memory_used_bytes = number(&memory.join("memory.usage_in_bytes"));
            usage.memory_limit_bytes = number(&memory.join("memory.limit_in_bytes"));
            usage.oom_killed = keyed(&memory.join("memory.oom_control"), "oom_kill") > 0;
            usage.pids = number(&pids.join("pids.current"));
            usage.pids_limit = number(&pids.join("pids.max"));
            usage.cpu_usage_ns = number(&cpu.join("cpuacct.usage"));
        }
        Some(UsageFiles::V2(dir)) => {
            usage.memory_used_bytes = number(&dir.join("memory.current"));
            usage.memory_limit_bytes = number(&dir.join("memory.max"));
            usage.oom_killed = keyed(&dir.join("memory.events"), "oom_kill") > 0;
            usage.pids = number(&dir.join("pids.current"));
            usage.pids_limit = number(&dir.join("pids.max"));
            usage.cpu_usage_ns = keyed(&dir.join("cpu.stat"), "usage_usec").saturating_mul(1000);
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

/// Received and sent bytes summed over every interface but `lo`.
fn net_bytes(dev: &str) -> (u64, u64) {
    dev.lines()
        .skip(2)
        .filter_map(|l| {
            let (name, counters) = l.split_once(':')?;
            if name.trim() == "lo" {
                return None;
            }
            let fields: Vec<u64> = counters.split_whitespace().map(|f| f.parse().unwrap_or(0)).collect();
            Some((*fields.first()?, *fields.get(8)?))
        })
        .fold((0, 0), |(rx, tx), (r, t)| (rx + r, tx + t))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn net_dev_sums_everything_but_loopback() {
        let dev = "Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:  999999      10    0    0    0     0          0         0   999999      10    0    0    0     0       0          0
  eth0:    1500      12    0    0    0     0          0         0      700       9    0    0    0     0       0          0
  eth1:      10       1    0    0    0     0          0         0        5       1    0    0    0     0       0          0
";
        assert_eq!(net_bytes(dev), (1510, 705));
    }

    #[test]
    fn keyed_files_are_parsed() {
        let oom = "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n";
        assert_eq!(parse_keyed(oom, "oom_kill"), 2);
        assert_eq!(parse_keyed(oom, "missing"), 0);
        assert_eq!(parse_keyed("usage_usec 1234\nuser_usec 1000\n", "usage_usec"), 1234);
    }
}
