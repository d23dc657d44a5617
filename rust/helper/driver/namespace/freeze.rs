//! Freezing a running VM while its writable layer is copied (CommitVm,
//! clone_from), so the copy is one consistent moment of the VM.
//!
//! The VM cgroups carry no freezer controller (only memory, cpu and pids are
//! set up, and the hybrid hosts' v2 mount holds no VM groups), so every
//! process in the VM's pid namespace gets SIGSTOP, through a pidfd so a
//! reused pid is never hit, and SIGCONT when the [`Frozen`] guard drops:
//! the VM thaws on every path out, errors and panics included. Processes the
//! VM had stopped itself are stopped again but not resumed at thaw.
//!
//! One freeze per VM at a time ([`FROZEN`]): a second one would take the
//! first one's stopped processes for ones the VM stopped itself, and the
//! first thaw would resume them under the second (a snapshot copied while
//! the disk quota watcher's hold ends). A snapshot waits for a hold to end;
//! the quota watcher does not wait for a snapshot, whose VM writes nothing.
use std::collections::HashSet;
use std::os::fd::OwnedFd;
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::network::{pidfd_kill, pidfd_open};
use crate::error::HelperError;

/// Bound on waiting for SIGSTOP to take effect; a process in an
/// uninterruptible sleep stops when it returns to user space.
const STOP_WAIT: Duration = Duration::from_secs(5);

/// The VMs (by PID 1) being frozen or frozen now, and a wake-up for those
/// waiting for one of them.
static FROZEN: (Mutex<Vec<i32>>, Condvar) = (Mutex::new(Vec::new()), Condvar::new());

/// A VM whose processes are stopped; dropping it resumes them.
pub struct Frozen {
    /// The VM's PID 1, its entry in [`FROZEN`].
    pid1: i32,
    /// Every process signalled, and whether to resume it at thaw (not
    /// those the VM had stopped itself).
    stopped: Vec<(i32, OwnedFd, bool)>,
}

impl Frozen {
    /// Number of processes stopped.
    pub fn count(&self) -> usize {
        self.stopped.len()
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        for (_, fd, resume) in &self.stopped {
            if *resume {
                pidfd_kill(fd, libc::SIGCONT);
            }
        }
        let (frozen, wake) = &FROZEN;
        frozen.lock().unwrap_or_else(PoisonError::into_inner).retain(|p| *p != self.pid1);
        wake.notify_all();
    }
}

/// Stops every process in the pid namespace of `pid1` (the VM's PID 1, a
/// host pid) and returns once they are all stopped.
///
/// The VM is hostile: a process not stopped yet may SIGCONT one that is (or
/// one the VM had stopped itself), and the copy that follows must not run
/// beside it. So every process gets SIGSTOP, already-stopped ones too, and
/// the freeze holds only after two consecutive full scans find every
/// process of the namespace stopped (a stopped process can resume nobody);
/// one seen running again is stopped again. A VM that keeps its processes
/// running past [`STOP_WAIT`] fails the operation: nothing is copied.
pub fn freeze(pid1: i32) -> Result<Frozen, HelperError> {
    let (frozen, wake) = &FROZEN;
    let mut vms = frozen.lock().unwrap_or_else(PoisonError::into_inner);
    while vms.contains(&pid1) {
        vms = wake.wait(vms).unwrap_or_else(PoisonError::into_inner);
    }
    vms.push(pid1);
    drop(vms);
    stop_all(Frozen { pid1, stopped: Vec::new() }, STOP_WAIT)
}

/// Like [`freeze`] with `wait` as the bound, but `None` at once when the VM
/// is frozen already (nothing in it runs to wait for), and `None` when its
/// processes did not all stop in time (they are resumed).
pub fn try_freeze(pid1: i32, wait: Duration) -> Option<Frozen> {
    let mut vms = FROZEN.0.lock().unwrap_or_else(PoisonError::into_inner);
    if vms.contains(&pid1) {
        return None;
    }
    vms.push(pid1);
    drop(vms);
    stop_all(Frozen { pid1, stopped: Vec::new() }, wait).ok()
}

/// Stops every process of `frozen`'s VM within `wait` (see [`freeze`]).
fn stop_all(mut frozen: Frozen, wait: Duration) -> Result<Frozen, HelperError> {
    let pid1 = frozen.pid1;
    let ns = pid_ns(pid1).map_err(|e| HelperError::io(format!("reading the pid namespace of {pid1}"), e))?;
    let mut seen = HashSet::new();
    let deadline = Instant::now() + wait;
    let mut clean_scans = 0;
    while clean_scans < 2 {
        if Instant::now() > deadline {
            let e = std::io::Error::other("its processes kept running (resuming each other?); nothing was copied");
            return Err(HelperError::io("freezing the vm", e));
        }
        let mut all_stopped = true;
        for pid in all_pids()? {
            if pid_ns(pid).ok().as_deref() != Some(ns.as_str()) {
                continue;
            }
            let st = state(pid);
            let running = match st {
                None | Some('Z' | 'X') => continue,
                Some('T' | 't') => false,
                Some(_) => true,
            };
            // A parent parked in vfork() runs nothing until its child execs
            // or exits; the child is of the namespace, scanned and stopped
            // like any other, so the parent is as good as stopped (it takes
            // its SIGSTOP once the child goes on, after the thaw).
            all_stopped &= !running || in_vfork_wait(pid, st);
            if seen.insert(pid) {
                let Ok(fd) = pidfd_open(pid) else { continue };
                pidfd_kill(&fd, libc::SIGSTOP);
                frozen.stopped.push((pid, fd, running));
            } else if running && let Some((_, fd, _)) = frozen.stopped.iter().find(|(p, _, _)| *p == pid) {
                pidfd_kill(fd, libc::SIGSTOP);
            }
        }
        if all_stopped {
            clean_scans += 1;
        } else {
            clean_scans = 0;
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    Ok(frozen)
}

/// Whether `pid`, in state `st`, waits in the kernel for its vfork() child
/// (shells and `posix_spawn` use it): uninterruptible, yet running none of
/// its code. The kernel's own name for where it sleeps: `kernel_clone`
/// since 5.10, `_do_fork` before.
fn in_vfork_wait(pid: i32, st: Option<char>) -> bool {
    st == Some('D')
        && std::fs::read_to_string(format!("/proc/{pid}/wchan"))
            .is_ok_and(|w| matches!(w.trim(), "kernel_clone" | "wait_for_vfork_done" | "_do_fork"))
}

fn pid_ns(pid: i32) -> std::io::Result<String> {
    Ok(std::fs::read_link(format!("/proc/{pid}/ns/pid"))?.to_string_lossy().into_owned())
}

/// The one-letter state of `pid`; `None` if gone.
fn state(pid: i32) -> Option<char> {
    sandbox_base::proc::state(pid as u32)
}

fn all_pids() -> Result<Vec<i32>, HelperError> {
    let entries = std::fs::read_dir("/proc").map_err(|e| HelperError::io("listing /proc", e))?;
    Ok(entries.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect())
}

/// Taken for its whole run by each test that freezes processes or loads
/// the host's disk: each freeze scans every host process under a 5 s bound,
/// one test keeps four shells busy resuming each other, and the quota tests
/// write hundreds of MiB; side by side on a 2-core machine a freeze missed
/// its bound (make test). These tests are about what a freeze holds, not
/// about sharing two cores with a busy neighbour.
#[cfg(test)]
pub(crate) fn heavy_test() -> std::sync::MutexGuard<'static, ()> {
    static HEAVY: Mutex<()> = Mutex::new(());
    HEAVY.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `sh -c script` as PID 1 of a pid namespace of its own (`unshare`),
    /// killed however the test ends: a panic must not leave it running and
    /// holding the harness's pipes.
    struct Namespace(std::process::Child);

    impl Namespace {
        fn start(script: &str) -> Self {
            let child = std::process::Command::new("unshare")
                .args(["--pid", "--fork", "--kill-child", "sh", "-c", script])
                .spawn()
                .unwrap();
            Namespace(child)
        }

        /// Its PID 1, as the host sees it.
        fn pid1(&self) -> i32 {
            ns_init(self.0.id() as i32)
        }
    }

    impl Drop for Namespace {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// Stopped, or parked in vfork() under a stopped child: it runs none
    /// of its code.
    fn held(pid: i32) -> bool {
        let st = state(pid);
        matches!(st, Some('T' | 't')) || in_vfork_wait(pid, st)
    }

    /// The PID 1 (host pid) of the pid namespace `unshare --pid --fork` made.
    fn ns_init(unshare: i32) -> i32 {
        for _ in 0..500 {
            let children = std::fs::read_to_string(format!("/proc/{unshare}/task/{unshare}/children")).unwrap();
            let pid1 = children.split_whitespace().next().and_then(|p| p.parse::<i32>().ok());
            if let Some(p) = pid1.filter(|p| pid_ns(*p).ok() != pid_ns(unshare).ok()) {
                return p;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("no pid namespace under {unshare}");
    }

    #[test]
    fn stops_the_namespace_and_resumes_on_drop() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root for a pid namespace");
            return;
        }
        let _serial = heavy_test();
        // A shell as PID 1 of its own pid namespace, with a child.
        let ns = Namespace::start("sleep 30 & while :; do sleep 0.01; done");
        let (unshare, pid1) = (ns.0.id() as i32, ns.pid1());
        std::thread::sleep(Duration::from_millis(50));
        let frozen = freeze(pid1).unwrap();
        assert!(frozen.count() >= 2, "sh and sleep");
        assert!(held(pid1), "{:?}", state(pid1));
        assert_ne!(state(unshare), Some('T'), "outside the namespace");
        drop(frozen);
        std::thread::sleep(Duration::from_millis(50));
        assert_ne!(state(pid1), Some('T'));
    }

    /// One freeze per VM: a hold is refused while a freeze holds it, and a
    /// second freeze waits for the first to thaw, so nothing is resumed
    /// under it.
    #[test]
    fn a_frozen_vm_is_frozen_once_at_a_time() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root for a pid namespace");
            return;
        }
        let _serial = heavy_test();
        let child = Namespace::start("sleep 30 & while :; do sleep 0.01; done");
        let pid1 = child.pid1();
        std::thread::sleep(Duration::from_millis(50));
        let first = freeze(pid1).expect("the first freeze");
        assert!(try_freeze(pid1, Duration::from_secs(1)).is_none(), "a hold while frozen");
        let second = std::thread::spawn(move || freeze(pid1).map(|f| f.count()));
        std::thread::sleep(Duration::from_millis(100));
        assert!(!second.is_finished(), "the second freeze waits for the first");
        assert!(held(pid1), "{:?}", state(pid1));
        drop(first);
        assert!(second.join().unwrap().unwrap() >= 1);
        // Thawed by the second's drop, and free for a hold again.
        // Patience, not a time limit: a scan of every host pid is slow on a loaded CI machine.
        let hold = try_freeze(pid1, Duration::from_secs(60)).expect("a hold once nothing holds it");
        assert!(held(pid1), "{:?}", state(pid1));
        drop(hold);
        drop(child);
    }

    /// A shell starting programs back to back (each through vfork, which
    /// parks the shell in the kernel until its child execs) is frozen every
    /// time: a child stopped before its exec leaves the shell waiting
    /// uninterruptibly, which is stopped in effect, not running.
    #[test]
    fn a_shell_parked_in_vfork_under_a_stopped_child_counts_as_stopped() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root for a pid namespace");
            return;
        }
        let _serial = heavy_test();
        // Busy loops beside it keep the cores taken, so children wait to
        // run their exec and the freeze often meets one before it.
        let ns = Namespace::start("for i in 1 2 3 4; do (while :; do :; done) & done; while :; do /bin/true; done");
        let pid1 = ns.pid1();
        for round in 0..40 {
            let frozen = freeze(pid1).unwrap_or_else(|e| panic!("round {round}: {e}"));
            assert!(held(pid1), "round {round}: {:?}", state(pid1));
            drop(frozen);
        }
    }

    /// Processes that resume each other (`kill -CONT -1` in a loop) are all
    /// stopped when freeze returns, and stay stopped.
    #[test]
    fn processes_resuming_each_other_are_all_stopped() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root for a pid namespace");
            return;
        }
        let _serial = heavy_test();
        let script = "for i in 1 2 3 4; do (while :; do kill -CONT -1 2>/dev/null; done) & done; wait";
        let child = Namespace::start(script);
        let pid1 = child.pid1();
        std::thread::sleep(Duration::from_millis(100));
        let ns = pid_ns(pid1).unwrap();
        let members = || -> Vec<i32> {
            all_pids().unwrap().into_iter().filter(|p| pid_ns(*p).ok().as_deref() == Some(ns.as_str())).collect()
        };
        for _ in 0..3 {
            let frozen = freeze(pid1).unwrap();
            for _ in 0..2 {
                for pid in members() {
                    assert!(held(pid) || state(pid).is_none(), "{pid} runs while frozen");
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            drop(frozen);
            std::thread::sleep(Duration::from_millis(20));
        }
        drop(child);
    }
}
