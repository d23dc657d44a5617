//! Leases and capacity: an optional absolute expiry per sandbox (besides the
//! idle TTL), `extend_ttl`, reaping of expired leases, and the preflight that
//! refuses a new sandbox before the host runs out of sandboxes, memory or disk.
//!
//! Leases live in the orchestrator's memory: a sandbox attached after a
//! restart starts a fresh default lease (if one is configured).
use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use super::{
    config::{ConfigSource, Profile, invalid},
    error::OrchestratorError,
    sandbox::{Sandbox, SandboxManager},
};

/// Sandboxes allowed at once unless configured.
const DEFAULT_MAX_SANDBOXES: usize = 16;
/// Longest lease (and single extension) unless configured, in minutes.
const DEFAULT_MAX_LEASE_MINUTES: u64 = 120;
/// A bound on the bound, so expiry times always fit a `SystemTime`.
const MAX_LEASE_MINUTES_LIMIT: u64 = 10 * 366 * 24 * 60;
/// Memory the host must keep available beside a new sandbox's limit.
const DEFAULT_MEMORY_HEADROOM_MB: u64 = 512;
/// Free disk the volumes directory must keep.
const DEFAULT_MIN_FREE_DISK_MB: u64 = 2048;
/// The reaper's slowest tick: an expired lease is gone within this.
const MAX_REAP_INTERVAL: Duration = Duration::from_secs(5);
const MIN_REAP_INTERVAL: Duration = Duration::from_millis(500);

/// Lease and capacity settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Lease every new sandbox gets; `None`: no lease until `extend_ttl`.
    pub lease_ttl: Option<Duration>,
    /// Upper bound of `lease_ttl` and of one `extend_ttl` call.
    pub max_lease: Duration,
    /// Sandboxes that may exist at once.
    pub max_sandboxes: usize,
    /// Bytes of available memory required beside the new sandbox's limit.
    pub memory_headroom: u64,
    /// Bytes of free disk required in the volumes directory.
    pub min_free_disk: u64,
}

fn env_number(source: &ConfigSource, key: &str) -> Result<Option<u64>, OrchestratorError> {
    match source.var(key) {
        None => Ok(None),
        Some(v) => v.trim().parse().map(Some).map_err(|_| invalid(key, format!("'{v}' is not a whole number"))),
    }
}

impl Limits {
    /// The file's values (`lease_ttl`, `max_lease_ttl` in minutes,
    /// `max_sandboxes`) overridden by the environment:
    /// SANDBOX_MCP_LEASE_TTL (minutes), SANDBOX_MCP_LEASE_TTL_SECONDS
    /// (seconds, wins; for short leases in tests), SANDBOX_MCP_MAX_LEASE_TTL,
    /// SANDBOX_MCP_MAX_SANDBOXES, SANDBOX_MCP_MEMORY_HEADROOM_MB,
    /// SANDBOX_MCP_MIN_FREE_DISK_MB.
    pub fn load(
        lease_ttl: Option<u64>,
        max_lease_ttl: Option<u64>,
        max_sandboxes: Option<usize>,
        source: &ConfigSource,
    ) -> Result<Self, OrchestratorError> {
        let env_number = |key| env_number(source, key);
        let max_minutes =
            env_number("SANDBOX_MCP_MAX_LEASE_TTL")?.or(max_lease_ttl).unwrap_or(DEFAULT_MAX_LEASE_MINUTES);
        if !(1..=MAX_LEASE_MINUTES_LIMIT).contains(&max_minutes) {
            return Err(invalid("max_lease_ttl", format!("must be 1 to {MAX_LEASE_MINUTES_LIMIT} minutes")));
        }
        let max_lease = Duration::from_secs(max_minutes * 60);
        let lease = match env_number("SANDBOX_MCP_LEASE_TTL_SECONDS")? {
            Some(s) => Duration::from_secs(s),
            None => {
                Duration::from_secs(env_number("SANDBOX_MCP_LEASE_TTL")?.or(lease_ttl).unwrap_or(0).saturating_mul(60))
            }
        };
        if lease > max_lease {
            return Err(invalid("lease_ttl", format!("must not exceed max_lease_ttl ({max_minutes} minutes)")));
        }
        let max_sandboxes = match env_number("SANDBOX_MCP_MAX_SANDBOXES")? {
            Some(n) => n as usize,
            None => max_sandboxes.unwrap_or(DEFAULT_MAX_SANDBOXES),
        };
        if max_sandboxes == 0 {
            return Err(invalid("max_sandboxes", "must be at least 1"));
        }
        let mb = |key, default| env_number(key).map(|v| v.unwrap_or(default).saturating_mul(1 << 20));
        Ok(Self {
            lease_ttl: (!lease.is_zero()).then_some(lease),
            max_lease,
            max_sandboxes,
            memory_headroom: mb("SANDBOX_MCP_MEMORY_HEADROOM_MB", DEFAULT_MEMORY_HEADROOM_MB)?,
            min_free_disk: mb("SANDBOX_MCP_MIN_FREE_DISK_MB", DEFAULT_MIN_FREE_DISK_MB)?,
        })
    }
}

/// Push a lease's end `by` past the later of now and its current end, in one
/// step under its lock: two extensions at once both count.
fn extend(lease: &Mutex<Option<SystemTime>>, by: Duration) -> SystemTime {
    let mut lease = lease.lock().unwrap_or_else(|p| p.into_inner());
    let now = SystemTime::now();
    let expires = lease.filter(|t| *t > now).unwrap_or(now) + by;
    *lease = Some(expires);
    expires
}

impl Sandbox {
    /// When the lease ends, if the sandbox has one.
    pub fn lease_expires(&self) -> Option<SystemTime> {
        *self.lease.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Time left on the lease (zero once expired), if the sandbox has one.
    pub fn lease_remaining(&self) -> Option<Duration> {
        self.lease_expires().map(|t| t.duration_since(SystemTime::now()).unwrap_or_default())
    }

    pub(super) fn set_lease(&self, expires: Option<SystemTime>) {
        *self.lease.lock().unwrap_or_else(|p| p.into_inner()) = expires;
    }

    fn extend_lease_by(&self, by: Duration) -> SystemTime {
        extend(&self.lease, by)
    }

    fn lease_expired(&self) -> bool {
        self.lease_expires().is_some_and(|t| t <= SystemTime::now())
    }
}

/// A creation in progress, counted against `max_sandboxes` until dropped.
pub(super) struct CreateSlot<'a>(&'a AtomicUsize);

impl Drop for CreateSlot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// `MemAvailable` of /proc/meminfo in bytes (`None` if unreadable, which
/// skips the check rather than refusing every sandbox).
fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb << 10)
}

impl SandboxManager {
    /// Refuse to create `name` when the sandbox count, available memory or
    /// free disk would go past the limits; nothing is created before this.
    /// `replacing`: the sandboxes that go before it is created (a reset's
    /// old sandbox and its children), counted as gone, their memory limits
    /// as available; they are unchanged if it is refused.
    pub(super) fn preflight(
        &self,
        name: &str,
        profile: &Profile,
        replacing: &[Arc<Sandbox>],
    ) -> Result<CreateSlot<'_>, OrchestratorError> {
        let limits = &self.config().limits;
        let refuse = |why: String| {
            OrchestratorError::InvalidArgument(if !replacing.is_empty() {
                format!("cannot replace sandbox '{}': {why}; the sandbox is unchanged", super::names::display(name))
            } else {
                format!("cannot create sandbox '{}': {why}", super::names::display(name))
            })
        };
        let pending = self.creating.fetch_add(1, Ordering::SeqCst);
        let slot = CreateSlot(&self.creating);
        let existing = (self.list().len() + pending).saturating_sub(replacing.len());
        if existing >= limits.max_sandboxes {
            return Err(refuse(format!(
                "{existing} sandboxes already exist (max_sandboxes = {}); destroy one first",
                limits.max_sandboxes
            )));
        }
        let needed = profile.memory_bytes.saturating_add(limits.memory_headroom);
        let freed = replacing.iter().map(|s| s.memory_bytes).sum::<u64>();
        if let Some(avail) = mem_available().map(|a| a.saturating_add(freed)).filter(|a| *a < needed) {
            return Err(refuse(format!(
                "host has {} MiB memory available, needs {} MiB (the sandbox's limit + {} MiB headroom)",
                avail >> 20,
                needed >> 20,
                limits.memory_headroom >> 20
            )));
        }
        let volumes = &self.config().volumes_dir;
        if let Some(free) = sandbox_base::disk::free_bytes(volumes).filter(|f| *f < limits.min_free_disk) {
            return Err(refuse(format!(
                "only {} MiB free disk in {}, needs {} MiB",
                free >> 20,
                volumes.display(),
                limits.min_free_disk >> 20
            )));
        }
        Ok(slot)
    }

    /// Extend a sandbox's lease by `minutes` (1..=max_lease_ttl) from its
    /// current end or from now, whichever is later; a sandbox without a lease
    /// gets one. Returns the new end.
    pub async fn extend_lease(
        &self,
        name: &str,
        minutes: u64,
    ) -> Result<(Arc<Sandbox>, SystemTime), OrchestratorError> {
        let max = self.config().limits.max_lease.as_secs() / 60;
        if minutes == 0 || minutes > max {
            return Err(OrchestratorError::InvalidArgument(format!(
                "minutes must be between 1 and {max} (max_lease_ttl), got {minutes}"
            )));
        }
        let sandbox = self.get(name)?;
        if sandbox.parent.is_some() {
            return Err(OrchestratorError::NotPermitted(format!(
                "'{}' is a child sandbox: its lifetime is its parent's child_ttl, not a lease to extend",
                super::names::display(name)
            )));
        }
        let before = sandbox.lease_expires();
        let expires = sandbox.extend_lease_by(Duration::from_secs(minutes * 60));
        if let Err(e) = self.record_sandbox(&sandbox).saved().await {
            // Not extended: a lease a restart would shorten again is not one
            // to promise. (Unless another extension came in meanwhile.)
            if sandbox.lease_expires() == Some(expires) {
                sandbox.set_lease(before);
            }
            return Err(e.into());
        }
        Ok((sandbox, expires))
    }

    /// Destroy every sandbox whose lease has ended, `default` included (a
    /// lease is explicit); returns their names.
    pub async fn reap_expired(&self) -> Vec<String> {
        let expired: Vec<String> =
            self.list().into_iter().filter(|s| s.lease_expired()).map(|s| s.name.clone()).collect();
        let mut reaped = Vec::new();
        for name in expired {
            self.remember_reaped(&name, &format!("the lease of '{}' ended", super::names::plain(&name)));
            match self.destroy(&name).await {
                Ok(_) => {
                    tracing::info!(sandbox = %name, "reaped sandbox whose lease ended");
                    reaped.push(name);
                }
                Err(e) => tracing::warn!(sandbox = %name, "could not reap expired sandbox: {e}"),
            }
        }
        reaped
    }

    /// How often the reaper looks: often enough for short idle TTLs and
    /// leases, and at least every few seconds since `extend_ttl` can give
    /// any sandbox a lease.
    pub(super) fn reap_interval(&self) -> Duration {
        let c = self.config();
        [c.idle_ttl, c.limits.lease_ttl]
            .into_iter()
            .flatten()
            .map(|t| t / 4)
            .fold(MAX_REAP_INTERVAL, Duration::min)
            .max(MIN_REAP_INTERVAL)
    }
}

/// `2026-01-31T12:00:00Z` (UTC, second precision).
pub fn iso_utc(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concurrent_extensions_all_count() {
        let start = SystemTime::now() + Duration::from_secs(3600);
        let lease = Mutex::new(Some(start));
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..100 {
                        extend(&lease, Duration::from_secs(60));
                    }
                });
            }
        });
        assert_eq!(lease.into_inner().unwrap(), Some(start + Duration::from_secs(800 * 60)));
    }

    #[test]
    fn iso_dates() {
        assert_eq!(iso_utc(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(iso_utc(UNIX_EPOCH + Duration::from_secs(951_782_400)), "2000-02-29T00:00:00Z");
        assert_eq!(iso_utc(UNIX_EPOCH + Duration::from_secs(1_767_225_599)), "2025-12-31T23:59:59Z");
    }

    #[test]
    fn file_limits_are_checked() {
        let l = Limits::load(Some(1), None, None, &ConfigSource::default()).unwrap();
        assert_eq!(
            (l.lease_ttl, l.max_lease, l.max_sandboxes),
            (Some(Duration::from_secs(60)), Duration::from_secs(7200), 16)
        );
        assert_eq!(Limits::load(None, None, None, &ConfigSource::default()).unwrap().lease_ttl, None);
        assert!(
            Limits::load(Some(121), None, None, &ConfigSource::default())
                .unwrap_err()
                .to_string()
                .contains("lease_ttl")
        );
        assert!(Limits::load(Some(10), Some(5), None, &ConfigSource::default()).is_err());
        assert!(
            Limits::load(None, Some(0), None, &ConfigSource::default())
                .unwrap_err()
                .to_string()
                .contains("max_lease_ttl")
        );
        assert!(Limits::load(Some(u64::MAX), Some(u64::MAX), None, &ConfigSource::default()).is_err());
        assert!(Limits::load(Some(u64::MAX), None, None, &ConfigSource::default()).is_err());
        assert!(
            Limits::load(None, None, Some(0), &ConfigSource::default())
                .unwrap_err()
                .to_string()
                .contains("max_sandboxes")
        );
    }

    #[test]
    fn host_probes_read_real_values() {
        assert!(mem_available().is_some_and(|m| m > 0));
        assert!(
            sandbox_base::disk::free_bytes(&std::env::temp_dir().join("does/not/exist/yet")).is_some_and(|f| f > 0)
        );
    }
}
