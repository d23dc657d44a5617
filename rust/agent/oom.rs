//! Every process the agent starts is the OOM killer's choice before the
//! agent and PID 1 (the helper's side and the reasoning: `driver::oom`).
//! Raising a score needs no privilege, so this works under an unprivileged
//! helper too, where the agent cannot be given -1000.
use std::io::Read as _;

use tokio::process::Command;

/// How far above the agent its processes start.
const ABOVE_AGENT: i32 = 500;
/// The kernel's maximum score.
const OOM_SCORE_ADJ_MAX: i32 = 1000;

/// The score for the agent's processes: well above its own, at least
/// [`ABOVE_AGENT`] (the agent's own is -1000 under a root helper).
fn workload_score(agent: i32) -> i32 {
    agent.max(0).saturating_add(ABOVE_AGENT).min(OOM_SCORE_ADJ_MAX)
}

fn own_score() -> i32 {
    let mut s = String::new();
    let read = std::fs::File::open("/proc/self/oom_score_adj").and_then(|mut f| f.read_to_string(&mut s));
    read.ok().and_then(|_| s.trim().parse().ok()).unwrap_or(0)
}

/// Makes the process `cmd` starts write its raised score before anything
/// else runs in it: register before any closure that drops privileges (a
/// non-root process may not open its own /proc files once setuid made it
/// undumpable).
pub fn raise(cmd: &mut Command) {
    let score = workload_score(own_score()).to_string();
    // SAFETY: open, write and close are async-signal-safe; the bytes were
    // formatted before the fork.
    unsafe {
        // Best effort: raising needs no privilege and only fails without a
        // /proc, where refusing to run the command would help nobody.
        cmd.pre_exec(move || {
            let fd = libc::open(c"/proc/self/oom_score_adj".as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd >= 0 {
                libc::write(fd, score.as_ptr().cast(), score.len());
                libc::close(fd);
            }
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workloads_sit_well_above_the_agent() {
        assert_eq!(workload_score(-1000), 500);
        assert_eq!(workload_score(0), 500);
        assert_eq!(workload_score(200), 700);
        assert_eq!(workload_score(900), 1000);
    }

    #[test]
    fn a_started_process_runs_with_the_raised_score() {
        let mut cmd = Command::new("cat");
        cmd.arg("/proc/self/oom_score_adj").stdout(std::process::Stdio::piped());
        raise(&mut cmd);
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let out = rt.block_on(async { cmd.output().await }).unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), workload_score(own_score()).to_string());
    }
}
