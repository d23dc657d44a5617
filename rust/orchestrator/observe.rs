//! Observability: per-sandbox resource figures (`stats`) and the health
//! sweep over every sandbox (`health`), from the helper's Stats RPC plus
//! unaudited probes inside the sandbox: how full the filesystem under
//! /workspace is, and (for `stats`) how much of it the sandbox's own
//! /workspace takes.
use std::time::Duration;

use super::{
    error::OrchestratorError,
    helper_client::VmStats,
    sandbox::{Command, Sandbox, SandboxManager, WORKSPACE},
};

/// Usage percentage at which `health` flags a resource.
pub const HIGH_PCT: u64 = 80;
/// Percentage at which disk is FULL and memory is OOM.
pub const FULL_PCT: u64 = 95;

/// The filesystem holding /workspace (the host's, shared by every sandbox).
#[derive(Debug, Clone, Copy, Default)]
pub struct Disk {
    /// Bytes used on it, by anyone.
    pub used: u64,
    /// Bytes in all.
    pub size: u64,
}

impl Disk {
    /// Used percentage (0 when unknown).
    pub fn pct(&self) -> u64 {
        (self.used * 100).checked_div(self.size).unwrap_or(0)
    }
}

/// A sandbox's figures.
#[derive(Debug, Clone)]
pub struct Observation {
    /// Helper figures, `None` if the helper could not give them.
    pub stats: Option<VmStats>,
    /// The filesystem under /workspace, `None` if the probe failed.
    pub disk: Option<Disk>,
    /// Bytes the sandbox's own /workspace takes; measured for `stats` only
    /// (it walks the tree), `None` otherwise or if the walk failed.
    pub workspace_used: Option<u64>,
    /// The agent answered the probe.
    pub alive: bool,
}

impl Observation {
    /// Memory use in percent of the limit.
    pub fn mem_pct(&self) -> Option<u64> {
        self.stats.as_ref().and_then(|s| (s.memory_used * 100).checked_div(s.memory_limit))
    }

    /// Disk use in percent of the sandbox's disk quota (`None` without one).
    pub fn quota_pct(&self) -> Option<u64> {
        self.stats.as_ref().and_then(|s| (s.disk_used.saturating_mul(100)).checked_div(s.disk_limit))
    }
}

/// How long the walk of /workspace may take.
const USAGE_TIMEOUT: Duration = Duration::from_secs(10);

fn parse_du(out: &[u8]) -> Option<u64> {
    // `du -sk`: "<KiB>\t<path>".
    let text = std::str::from_utf8(out).ok()?;
    Some(text.lines().last()?.split_whitespace().next()?.parse::<u64>().ok()? * 1024)
}

fn parse_df(out: &[u8]) -> Option<Disk> {
    // `df -Pk`: header, then "fs blocks used avail capacity mount".
    let text = std::str::from_utf8(out).ok()?;
    let line = text.lines().nth(1)?;
    let f: Vec<&str> = line.split_whitespace().collect();
    let size = f.get(1)?.parse::<u64>().ok()? * 1024;
    let used = f.get(2)?.parse::<u64>().ok()? * 1024;
    Some(Disk { used, size })
}

impl SandboxManager {
    /// Why each running sandbox that has no cpu/memory/pids limits runs
    /// without them, by name (for `status`).
    pub async fn unenforced_limits(&self) -> Result<std::collections::HashMap<String, String>, OrchestratorError> {
        Ok(self
            .helper
            .list_vms()
            .await?
            .into_iter()
            .filter(|v| v.state == super::helper_client::VmState::Running)
            .filter_map(|v| Some((v.id, v.limits_not_enforced?)))
            .collect())
    }

    /// Figures for one sandbox. Probes are not audited and do not count as activity.
    pub async fn observe(&self, sandbox: &Sandbox) -> Result<Observation, OrchestratorError> {
        let stats = self.helper.stats(&sandbox.name).await.ok();
        let probe = Command::argv(["df", "-Pk", WORKSPACE], Duration::from_secs(5));
        let (alive, disk) = match self.probe(sandbox, probe).await {
            Ok(r) => (true, parse_df(&r.stdout.bytes)),
            Err(_) => (false, None),
        };
        Ok(Observation { stats, disk, alive, workspace_used: None })
    }

    /// [`Self::observe`] plus the space the sandbox's own /workspace takes.
    pub async fn observe_with_usage(&self, sandbox: &Sandbox) -> Result<Observation, OrchestratorError> {
        let mut obs = self.observe(sandbox).await?;
        if obs.alive {
            let probe = Command::argv(["du", "-skx", WORKSPACE], USAGE_TIMEOUT);
            // A directory it cannot read makes du exit 1 with the rest counted.
            obs.workspace_used = self.probe(sandbox, probe).await.ok().and_then(|r| parse_du(&r.stdout.bytes));
        }
        Ok(obs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn df_output() {
        let d = parse_df(
            b"Filesystem 1024-blocks Used Available Capacity Mounted on\n/dev/vda 1000 250 750 25% /workspace\n",
        )
        .unwrap();
        assert_eq!(d.size, 1_024_000);
        assert_eq!(d.pct(), 25);
        assert!(parse_df(b"garbage").is_none());
        assert_eq!(parse_du(b"8200\t/workspace\n"), Some(8200 * 1024));
        assert_eq!(parse_du(b""), None);
    }
}
