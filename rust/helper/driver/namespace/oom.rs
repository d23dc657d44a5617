//! Out-of-memory kills inside a VM must take the workload, never the
//! sandbox's launcher, PID 1 or agent: losing those loses the whole sandbox.
//!
//! The OOM killer (the VM's memory cgroup's, or the host's) never picks a
//! process whose `oom_score_adj` is -1000. Lowering a score needs
//! CAP_SYS_RESOURCE in the host's user namespace, which only a root helper
//! has; so the helper sets -1000 on the three from outside once the agent is
//! up ([`protect`]), and the agent raises every process it starts well above
//! itself (`agent::oom`), which needs no privilege.
//!
//! What a workload can do about it: lowering its own score below
//! `oom_score_adj_min` needs the capability too. That floor is inherited
//! from the agent: -1000 under a root helper, so a workload may make itself
//! as unkillable as the agent (it then only wedges its own sandbox when it
//! fills memory; PID 1 and the agent are still never picked), never more.
//! Under an unprivileged helper the three keep the helper's own score S and
//! workloads start at S + 500; a workload can come down to the helper's
//! floor (at most S), tying with PID 1 and the agent, and among equals the
//! OOM killer takes the one using the most memory, which is not a small
//! PID 1 or agent. What remains is memory that no kill frees (tmpfs pages),
//! which the size cap on /dev/shm bounds (see `rootfs`).
use std::io::Write as _;

/// The score that makes the OOM killer skip a process.
const OOM_SCORE_ADJ_MIN: i32 = -1000;

/// Sets `oom_score_adj` -1000 on the launcher, PID 1 and the agent (PID 1's
/// only child while the VM starts). Returns whether it worked: an
/// unprivileged helper gets EACCES and the scores stay as they were.
pub fn protect(launcher: i32, pid1: i32) -> bool {
    let agents = std::fs::read_to_string(format!("/proc/{pid1}/task/{pid1}/children")).unwrap_or_default();
    let mut all = vec![launcher, pid1];
    all.extend(agents.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
    let mut ok = true;
    for pid in all {
        if let Err(e) = set(pid, OOM_SCORE_ADJ_MIN) {
            tracing::debug!(pid, error = %e, "cannot lower oom_score_adj (unprivileged helper?)");
            ok = false;
        }
    }
    ok
}

fn set(pid: i32, score: i32) -> std::io::Result<()> {
    std::fs::OpenOptions::new()
        .write(true)
        .open(format!("/proc/{pid}/oom_score_adj"))?
        .write_all(score.to_string().as_bytes())
}

/// The size of the VM's /dev/shm: a quarter of its memory limit. tmpfs pages
/// are charged to the VM's memory cgroup and no kill frees them, so an
/// unbounded /dev/shm filled up leaves the OOM killer nothing to kill but
/// the sandbox itself; with the cap, three quarters stay for processes.
pub fn shm_bytes(memory_bytes: u64) -> u64 {
    memory_bytes / 4
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protect_sets_the_floor_score_or_leaves_the_scores_alone() {
        let mut parent = std::process::Command::new("sh").args(["-c", "sleep 60 & wait"]).spawn().unwrap();
        let pid = parent.id() as i32;
        let read = |p: i32| std::fs::read_to_string(format!("/proc/{p}/oom_score_adj")).unwrap().trim().to_string();
        let child = (0..500)
            .find_map(|_| {
                std::thread::sleep(std::time::Duration::from_millis(5));
                let c = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
                c.split_whitespace().next().map(|c| c.parse::<i32>().unwrap())
            })
            .unwrap();
        let before = (read(pid), read(child));
        // `sh` stands for both the launcher and PID 1, `sleep` for the agent.
        // With CAP_SYS_RESOURCE (a root helper on most hosts) the scores go
        // to -1000; without it (rootless, or a host that withholds it) they
        // stay as they were.
        if protect(pid, pid) {
            assert_eq!((read(pid), read(child)), ("-1000".to_string(), "-1000".to_string()));
        } else {
            assert_eq!((read(pid), read(child)), before);
        }
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child), nix::sys::signal::Signal::SIGKILL);
        parent.wait().unwrap();
    }
}
