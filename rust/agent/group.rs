//! The sandbox's cgroup inside a vm's guest, made by guest init with the
//! sandbox's task and memory limits (`sandbox_guest::cgroup`). Every
//! process the agent starts joins it before it execs ([`place`], one
//! `write` of "0" to its `cgroup.procs`, opened once here), so the limits
//! hold for the whole tree it forks; the agent itself stays outside, so a
//! fork bomb at the limit neither stops it from spawning its threads nor
//! from starting the next exec (joining a group at its task limit is
//! allowed: `pids.max` refuses forks, not moves). The agent's stats report
//! the group's figures ([`stats`]).
//!
//! On the namespace driver no group is given: the helper's cgroup around
//! the whole sandbox holds its limits, [`place`] adds nothing and
//! [`stats`] has nothing to say.
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use tokio::process::Command;

use super::AgentError;
use super::protocol::GroupStats;

/// The group this agent starts processes in, once given.
static GROUP: OnceLock<Group> = OnceLock::new();

struct Group {
    dir: PathBuf,
    /// `cgroup.procs`, write-only and close-on-exec: a forked child writes
    /// to it before exec without opening anything.
    procs: OwnedFd,
}

/// Makes every process this agent starts from now on join the cgroup at
/// `dir`. Called once, before the agent serves.
pub fn confine_to(dir: &Path) -> Result<(), AgentError> {
    let path = dir.join("cgroup.procs");
    let procs = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(&path)
        .map_err(|source| AgentError::Io { what: format!("open {}", path.display()), source })?;
    GROUP.set(Group { dir: dir.to_path_buf(), procs: procs.into() }).map_err(|_| {
        AgentError::Rejected(format!("the agent already starts its processes in a cgroup, not {}", dir.display()))
    })
}

/// Makes the process `cmd` starts join the sandbox's group before anything
/// else runs in it (register before any closure that drops privileges: an
/// ordinary user may not move itself). Nothing without a group.
pub fn place(cmd: &mut Command) {
    let Some(group) = GROUP.get() else { return };
    let fd = group.procs.as_raw_fd();
    // SAFETY: write is async-signal-safe; the descriptor stays open for the
    // agent's life (the group is never dropped) and nothing is allocated.
    unsafe {
        // A process that cannot join would run outside the sandbox's
        // limits: it is not started.
        cmd.pre_exec(move || {
            if libc::write(fd, c"0".as_ptr().cast(), 1) != 1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// The group's figures now; `None` without a group.
pub fn stats() -> Option<GroupStats> {
    let dir = &GROUP.get()?.dir;
    let read = |file: &str| std::fs::read_to_string(dir.join(file)).unwrap_or_default();
    let ram = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| mem_total(&m)).unwrap_or(0);
    Some(GroupStats {
        memory_used_bytes: working_set(number(&read("memory.current")).unwrap_or(0), &read("memory.stat"), V2_INACTIVE),
        memory_limit_bytes: number(&read("memory.max")).unwrap_or(ram),
        pids: number(&read("pids.current")).unwrap_or(0),
        pids_limit: number(&read("pids.max")).unwrap_or(0),
        oom_kills: keyed(&read("memory.events"), "oom_kill").unwrap_or(0),
    })
}

/// The `memory.stat` key of the inactive page cache on cgroup v2 (v1
/// names it `total_inactive_file`, counting the group's children too).
pub const V2_INACTIVE: &str = "inactive_file";

/// The memory a sandbox's group uses, as `stats` reports it on every
/// driver: the charge (`memory.current`, v1 `memory.usage_in_bytes`) less
/// the inactive file cache in `memory_stat` under `inactive_key`. It is
/// the "working set" `docker stats` and the kubelet show. The charge alone
/// counts every page of cache the sandbox's reads and writes left behind,
/// so a sandbox that unpacked a big archive would read 100% of its limit
/// and be flagged by `health` while nothing is at risk: the kernel drops
/// that inactive cache first, before it reclaims anything else or kills.
/// What remains (anonymous memory, tmpfs, cache in use) is what the limit
/// really presses on. Shared pages are counted once, as the group is
/// charged once, unlike a sum of each process's RSS.
pub fn working_set(charge: u64, memory_stat: &str, inactive_key: &str) -> u64 {
    charge.saturating_sub(keyed(memory_stat, inactive_key).unwrap_or(0))
}

/// A single-value cgroup file: the number, `None` for `max` (or garbage).
fn number(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

/// The value of `key` in a flat-keyed cgroup file (`memory.events`).
fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The guest's RAM, bytes, from `/proc/meminfo`: the memory limit when the
/// group has none (the VM's size is then the sandbox's limit).
fn mem_total(meminfo: &str) -> Option<u64> {
    let kib = meminfo.lines().find_map(|l| l.strip_prefix("MemTotal:"))?.trim().strip_suffix("kB")?.trim();
    kib.parse::<u64>().ok()?.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_files_are_read_as_the_kernel_writes_them() {
        assert_eq!(number("268435456\n"), Some(268_435_456));
        assert_eq!(number("max\n"), None);
        let events = "low 0\nhigh 0\nmax 12\noom 2\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(keyed(events, "oom_kill"), Some(1));
        assert_eq!(keyed(events, "oom"), Some(2));
        assert_eq!(keyed("", "oom_kill"), None);
        let meminfo = "MemTotal:         498764 kB\nMemFree:          300000 kB\n";
        assert_eq!(mem_total(meminfo), Some(498_764 * 1024));
    }

    #[test]
    fn the_working_set_leaves_out_inactive_cache_only() {
        let v2 = "anon 30000000\nfile 9000000\nactive_file 1000000\ninactive_file 8000000\nshmem 0\n";
        assert_eq!(working_set(40_000_000, v2, V2_INACTIVE), 32_000_000);
        // v1's own `inactive_file` leaves out its children; the total is used.
        let v1 = "cache 9000000\ninactive_file 5\ntotal_inactive_file 8000000\n";
        assert_eq!(working_set(40_000_000, v1, "total_inactive_file"), 32_000_000);
        assert_eq!(working_set(40_000_000, "", V2_INACTIVE), 40_000_000, "no memory.stat: the charge");
        assert_eq!(working_set(1, v2, V2_INACTIVE), 0, "never below 0");
    }

    #[test]
    fn without_a_group_nothing_is_placed_or_read() {
        // The unit tests' agent, like the namespace driver's, was given none.
        assert!(stats().is_none());
        let mut cmd = Command::new("true");
        place(&mut cmd);
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        assert!(rt.block_on(async { cmd.status().await }).unwrap().success());
    }
}
