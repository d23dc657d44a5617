//! The guest's cgroup2 hierarchy and the sandbox's group in it, where the
//! sandbox's [`GuestLimits`] hold. The host's cgroup around qemu counts
//! qemu's threads and bounds the whole VM; only the guest kernel sees the
//! sandbox's own processes, so a task limit (a fork bomb refused with
//! EAGAIN) and a memory limit below the VM's RAM are enforced here.
//!
//! - The hierarchy is mounted once at `/sys/fs/cgroup`, in the sandbox's
//!   root, for this group and for dockerd ([`super::containers`]).
//! - The root enables `cpu`, `pids` and `memory` for its children: with
//!   `cpu` the whole group competes for the CPUs as one entity beside each
//!   of the agent's threads, so a thousand busy processes (a fork bomb under
//!   TCG) do not starve the agent's answers. The group
//!   [`SANDBOX_GROUP`] gets `pids.max` and `memory.max` from the go line
//!   (`max` without one). `memory.oom.group` stays off: the OOM killer takes
//!   the one process that pushed the group over, as on the namespace driver;
//!   the guest always overcommits, so a large allocation meets that OOM
//!   killer rather than an outright refusal.
//! - Guest init and the agent stay in the root group, outside the limits: a
//!   fork bomb at the limit must not keep the agent from starting its
//!   threads, running the next exec or answering. The agent places every
//!   process it starts in the group before it execs
//!   ([`sandbox_agent::group`]); dockerd, started by init, stays outside.
//!
//! The guest's root can move a process out or raise a limit: the VM is the
//! boundary, and its RAM and the host's cgroup around qemu bound it.
use std::path::{Path, PathBuf};

use nix::mount::{MsFlags, mount};

use super::GuestError;
use super::handshake::GuestLimits;

pub use super::{CGROUP_ROOT as ROOT, SANDBOX_GROUP};
/// The guest's overcommit policy.
const OVERCOMMIT: &str = "/proc/sys/vm/overcommit_memory";

/// Mounts cgroup2 at [`ROOT`] and makes the sandbox's group with `limits`;
/// returns the group's directory (for the agent).
pub fn sandbox_group(limits: &GuestLimits) -> Result<PathBuf, GuestError> {
    let io = |what: &str, e| GuestError::io(what, e);
    mount(
        Some("cgroup2"),
        ROOT,
        Some("cgroup2"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .map_err(|e| GuestError::sys(format!("mount cgroup2 on {ROOT}"), e))?;
    let root = Path::new(ROOT);
    std::fs::write(root.join("cgroup.subtree_control"), "+cpu +pids +memory")
        .map_err(|e| io("enable the cpu, pids and memory controllers in the guest's cgroup root", e))?;
    let group = root.join(SANDBOX_GROUP);
    std::fs::create_dir_all(&group).map_err(|e| io("create the sandbox's cgroup", e))?;
    std::fs::write(group.join("pids.max"), limit_value(limits.pids))
        .map_err(|e| io("set the sandbox's pids.max", e))?;
    std::fs::write(group.join("memory.max"), limit_value(limits.memory_bytes))
        .map_err(|e| io("set the sandbox's memory.max", e))?;
    // The kernel's heuristic overcommit refuses outright one allocation
    // larger than the guest's RAM, which a host with more RAM than the
    // sandbox's limit grants and the limit's OOM killer then ends: always
    // overcommitting makes the limit hold as on the namespace driver, by the
    // OOM killer at memory.max, counted in the group's memory.events.
    std::fs::write(OVERCOMMIT, "1").map_err(|e| io("set vm.overcommit_memory", e))?;
    Ok(group)
}

/// A limit as a cgroup file takes it: the number, or `max` for none (0 is
/// none too, as the host's limits say).
fn limit_value(limit: Option<u64>) -> String {
    match limit {
        Some(n) if n > 0 => n.to_string(),
        _ => "max".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_absent_or_zero_limit_is_max() {
        assert_eq!(limit_value(Some(77)), "77");
        assert_eq!(limit_value(None), "max");
        assert_eq!(limit_value(Some(0)), "max");
    }
}
