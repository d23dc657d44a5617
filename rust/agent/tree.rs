//! Whole process trees: what an exec's timeout or cancellation and a
//! background process's `kill` end.
//!
//! A process group is not enough: `setsid`, `nohup … &` inside a subshell or
//! a double fork leave it, and the process then reparents to the sandbox's
//! PID 1, out of reach. So every process the agent starts is made a *child
//! subreaper* ([`track`], before exec; the flag survives exec and setuid):
//! while it lives, every process it started, however detached, stays its
//! descendant in the parent chain, and [`descendants`] finds them all by
//! walking `/proc`. Ending a tree ([`kill`]) first stops every member with
//! SIGSTOP, rescanning until a scan finds nobody new (a stopped process
//! cannot fork, and a fork with a signal pending is restarted), then sends
//! SIGKILL until no live member is left, the root last so that nobody is
//! reparented out of the tree meanwhile.
//!
//! Why a subreaper rather than a cgroup per exec: the sandbox has no cgroup
//! hierarchy of its own to create children in (v1 controllers are mounted
//! outside it, and only the helper may write them), and creating, filling
//! and removing a cgroup per exec would cost more than the ~2 ms a warm exec
//! takes. The subreaper costs one prctl per spawn and a `/proc` walk only
//! when something is killed.
//!
//! What it does not cover, by design: once the process the agent started
//! has exited normally, whatever it left running (`sleep 1 &`, a daemon)
//! reparents to PID 1 and keeps running, as after a terminal command; the
//! agent no longer knows it. One cost: a subreaper that never reaps unknown
//! children (a program exec'd in place of the shell) keeps its exited
//! orphans as zombies until it exits itself.
use std::collections::{HashMap, HashSet};

use nix::sys::signal::{Signal, kill as send, killpg};
use nix::unistd::Pid;

use tokio::process::Command;

/// Bound on the stop and kill rounds: each round only finds processes
/// forked before the previous round's signals landed, so a handful suffice;
/// the bound keeps a pathological tree from holding the agent.
const MAX_ROUNDS: usize = 64;

/// Makes the process `cmd` starts a child subreaper.
pub fn track(cmd: &mut Command) {
    // SAFETY: prctl with integer arguments is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// One process as `/proc/PID/stat` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stat {
    ppid: i32,
    zombie: bool,
    /// Start time in clock ticks since boot: with the pid, an identity that
    /// survives pid reuse.
    start: u64,
}

fn stat(pid: i32) -> Option<Stat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Parses a `/proc/PID/stat` line. The command name (field 2) may hold
/// spaces and parentheses, so fields are counted from its last `)`.
fn parse_stat(line: &str) -> Option<Stat> {
    let rest = &line[line.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state(3) ppid(4) … starttime(22).
    Some(Stat {
        zombie: matches!(*fields.first()?, "Z" | "X"),
        ppid: fields.get(1)?.parse().ok()?,
        start: fields.get(19)?.parse().ok()?,
    })
}

/// Every live (non-zombie) process below `root`, with its start time.
pub fn descendants(root: i32) -> HashMap<i32, u64> {
    let mut children: HashMap<i32, Vec<(i32, Stat)>> = HashMap::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
                continue;
            };
            if let Some(st) = stat(pid) {
                children.entry(st.ppid).or_default().push((pid, st));
            }
        }
    }
    let mut found = HashMap::new();
    let mut queue = vec![root];
    while let Some(parent) = queue.pop() {
        for &(pid, st) in children.get(&parent).map(Vec::as_slice).unwrap_or_default() {
            // A zombie's children were reparented already; it has none.
            if !st.zombie && found.insert(pid, st.start).is_none() {
                queue.push(pid);
            }
        }
    }
    found
}

/// Sends `signal` to `root`, its process group and every descendant.
pub fn signal(root: i32, signal: Signal) {
    if signal == Signal::SIGKILL {
        let _ = kill(root);
        return;
    }
    let _ = send(Pid::from_raw(root), signal);
    let _ = killpg(Pid::from_raw(root), signal);
    for pid in descendants(root).into_keys() {
        let _ = send(Pid::from_raw(pid), signal);
    }
}

/// Ends `root` and every process below it (see the module doc). `root` must
/// not have been reaped yet, or its pid may name someone else. Returns the
/// descendants it killed, for [`wait_gone`].
pub fn kill(root: i32) -> Victims {
    let root_pid = Pid::from_raw(root);
    let _ = send(root_pid, Signal::SIGSTOP);
    let mut stopped = HashSet::new();
    for _ in 0..MAX_ROUNDS {
        let new: Vec<i32> = descendants(root).into_keys().filter(|p| !stopped.contains(p)).collect();
        if new.is_empty() {
            break;
        }
        for pid in new {
            let _ = send(Pid::from_raw(pid), Signal::SIGSTOP);
            stopped.insert(pid);
        }
    }
    let mut killed = HashMap::new();
    for _ in 0..MAX_ROUNDS {
        let new: Vec<(i32, u64)> = descendants(root).into_iter().filter(|(p, _)| !killed.contains_key(p)).collect();
        if new.is_empty() {
            break;
        }
        for (pid, start) in new {
            let _ = send(Pid::from_raw(pid), Signal::SIGKILL);
            killed.insert(pid, start);
        }
    }
    let _ = killpg(root_pid, Signal::SIGKILL);
    let _ = send(root_pid, Signal::SIGKILL);
    Victims(killed)
}

/// Processes sent SIGKILL, by identity.
#[derive(Debug, Default)]
pub struct Victims(HashMap<i32, u64>);

impl Victims {
    fn alive(&self) -> bool {
        self.0.iter().any(|(&pid, &start)| stat(pid).is_some_and(|st| st.start == start && !st.zombie))
    }
}

/// Waits (at most `limit`) until every victim has died: SIGKILL is
/// asynchronous, and a `kill` should answer once the work is gone.
pub async fn wait_gone(victims: &Victims, limit: std::time::Duration) {
    let deadline = tokio::time::Instant::now() + limit;
    while victims.alive() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// Processes seen in a tree, remembered by identity so they can still be
/// found after the root exits and they were reparented away.
#[derive(Debug, Default)]
pub struct Seen(HashMap<i32, u64>);

impl Seen {
    /// Adds every current descendant of `root`.
    pub fn record(&mut self, root: i32) {
        self.0.extend(descendants(root));
    }

    /// Ends the remembered processes that still run (same pid, same start
    /// time) and everything below them; adds what it killed to `victims`.
    pub fn kill(&self, victims: &mut Victims) {
        for (&pid, &start) in &self.0 {
            if stat(pid).is_some_and(|st| st.start == start && !st.zombie) {
                victims.0.extend(kill(pid).0);
                victims.0.insert(pid, start);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_with_odd_names_parse() {
        let line = "42 (a) b (c)) S 7 42 42 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 123456 0 0";
        assert_eq!(parse_stat(line), Some(Stat { ppid: 7, zombie: false, start: 123456 }));
        let zombie = "9 (sh) Z 1 9 9 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 77 0 0";
        assert_eq!(parse_stat(zombie), Some(Stat { ppid: 1, zombie: true, start: 77 }));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn a_detached_grandchild_stays_below_a_subreaper_and_dies_with_it() {
        // The root runs a subshell that starts a new session and leaves a
        // grandchild behind; without the subreaper it would reparent to init.
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "(setsid sleep 1000 &) ; sleep 1000"]);
        track(&mut cmd);
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let mut child = cmd.spawn().unwrap();
            let root = child.id().unwrap() as i32;
            let mut below = HashMap::new();
            for _ in 0..200 {
                below = descendants(root);
                if below.len() >= 2 {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            assert_eq!(below.len(), 2, "{below:?}");
            let victims = kill(root);
            child.wait().await.unwrap();
            wait_gone(&victims, std::time::Duration::from_secs(5)).await;
            for (pid, start) in below {
                let gone = (0..200).any(|_| {
                    let alive = stat(pid).is_some_and(|st| st.start == start && !st.zombie);
                    std::thread::sleep(std::time::Duration::from_millis(5));
                    !alive
                });
                assert!(gone, "{pid} survived");
            }
        });
    }
}
