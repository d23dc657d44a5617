//! Disk quotas: a VM's writable layer (its /tmp included, which lives in
//! it) and its writable mounts (the /workspace volume) may hold
//! `VmSpec.disk_bytes` together.
//!
//! Enforced by measuring, not by the filesystem. A hard quota needs ext4 or
//! xfs project quotas, which need mount options (`prjquota`) that hosts
//! rarely have and that only root may set, or a loop-mounted filesystem per
//! VM, which costs a preallocated image and a mount per VM and cannot hold
//! the /workspace volume (a host directory that outlives the VM). So a
//! watcher per running VM sums what its files cost under each part: the
//! allocated blocks (`st_blocks`, hard links once), and at least
//! [`INODE_COST`] per file, directory, link or node, so a flood of empty
//! files costs quota as it costs the host's inode table. It walks about
//! once a second: more often near the quota, and never more than a tenth of
//! the time, so a slow walk (a huge tree) costs a bounded share of a CPU.
//! Between walks a [`Tripwire`] reads the free blocks and inodes of the
//! parts' filesystems every 25 ms (one `statfs`, no walk): a drop
//! of half the VM's headroom walks at once, and a VM writing fast enough to
//! pass its quota before that walk has counted is stopped until it has, so
//! a writer at any speed passes the quota by about what it writes in one
//! poll, however long a walk takes on a busy host. When a measurement is past the quota and above the previous one
//! (something is writing), every process of the VM but its PID 1 and agent
//! is killed and the reason recorded: Stats reports it, and an Exec whose
//! process died of it gets it on stderr. Deleting files is never stopped
//! (usage goes down), so the sandbox can be brought back under its quota.
//! If usage still grows past the quota after a kill round (measured from a
//! baseline taken after it), the writer lives in PID 1 or the agent, which
//! the round spares (e.g. code injected by ptrace): the VM is stopped by
//! killing its PID 1, with the reason as its stop reason. Files the VM's
//! processes hold open after unlinking them count too.
//!
//! On the host one file is also capped at the whole quota by the kernel
//! ([`cap_file_size`]): a single writer at full speed needs no walk to stop.
//!
//! A vm (its own kernel) is watched the same way with the guest's figures
//! for its writable disk, which is itself sized to the quota ([`Writers`]).
#[cfg(linux_host)]
use std::collections::HashSet;
#[cfg(linux_host)]
use std::os::unix::fs::MetadataExt as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[cfg(linux_host)]
use nix::sys::signal::{Signal, kill};
#[cfg(linux_host)]
use nix::unistd::Pid;

use super::agent_link::AgentLink;
use super::driver::Instance;

mod tripwire;
mod walk;

use tripwire::Tripwire;
pub use walk::allocated;
#[cfg(linux_host)]
pub use walk::unlinked;

/// How often usage is measured, far from the quota.
const INTERVAL: Duration = Duration::from_secs(1);
/// How often near it (above [`NEAR`] of the quota).
const NEAR_INTERVAL: Duration = Duration::from_millis(100);
/// "Near the quota": this fraction of it, in percent.
const NEAR: u64 = 80;
/// A measurement may take at most this share of the time (1/N).
const DUTY: u32 = 10;
/// What every inode under a part costs at least, in bytes: one block, as
/// ext4 and xfs allocate for a file with data. An empty file, a symlink or
/// a whiteout allocates no block yet takes an inode of the host's
/// filesystem, which a quota in bytes alone would let a sandbox use up.
pub const INODE_COST: u64 = 4096;
/// How long a hold waits for the VM's processes to stop (a `vfork` parent
/// waits in `D` for its child): past it the walk runs with them running.
#[cfg(linux_host)]
const HOLD_WAIT: Duration = Duration::from_millis(250);
/// Bound on the kill rounds (each finds only what forked before the last).
#[cfg(linux_host)]
const KILL_ROUNDS: usize = 16;

/// One measured part of a VM's disk.
#[derive(Debug, Clone)]
pub struct Part {
    /// How the message names it: "writable layer", "/workspace".
    pub label: String,
    /// Host directory.
    pub path: PathBuf,
}

/// The last measurement of one VM, shared with Stats and Exec.
#[derive(Debug)]
pub struct Watch {
    limit: u64,
    reading: Mutex<Reading>,
    /// How many times the VM's processes were killed for the quota.
    stops: AtomicU64,
}

/// One measurement.
#[derive(Debug, Clone, Default)]
pub struct Reading {
    /// Bytes allocated under every part together.
    pub used: u64,
    /// Why the processes were last killed for the quota; empty if never.
    pub exceeded: String,
    /// Whether the watcher stopped the whole VM (then `exceeded` says why).
    pub stopped_vm: bool,
}

impl Watch {
    /// The quota in bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The latest measurement.
    pub fn reading(&self) -> Reading {
        self.reading.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// A counter that moves each time the VM's processes are killed for the
    /// quota: compare it before and after a process ran.
    pub fn stops(&self) -> u64 {
        self.stops.load(Ordering::SeqCst)
    }
}

/// Where a VM's writers run: how the watcher measures them and stops them.
pub enum Writers {
    /// On the host (the namespace driver): its PID 1 and agent by host pid.
    /// Every part is a host directory, the writable layer included.
    #[cfg(linux_host)]
    Host {
        /// Host pid of the VM's PID 1.
        pid1: i32,
        /// Host pid of its agent, spared by a kill round.
        agent: i32,
    },
    /// In a guest with a kernel of its own (the vm driver). The writable
    /// layer lives on the guest's disk, which only the guest can read: its
    /// agent reports the disk's use. The disk's size is the quota, so the
    /// guest's writes there meet ENOSPC at the latest; the watcher adds the
    /// shares (host directories). A kill round is the guest's own `kill`
    /// of every process but its init and agent; stopping the VM kills qemu.
    Guest {
        /// The guest's agent.
        agent: Arc<AgentLink>,
        /// The vm, killed if its writes outlive a kill round.
        instance: Arc<dyn Instance>,
    },
}

/// Kills the guest's sandbox processes: its cgroup at once with
/// `cgroup.kill` (every process in it, and the forks it races; see
/// the guest's `cgroup`), then in one pass what runs outside it but
/// init (1), the agent (this shell's parent) and itself: dockerd and its
/// containers (kernel threads ignore the signal). This shell first leaves
/// the group the agent started it in. A process in the group after the kill
/// is a new request's (an exec that came after it) and is spared: rounds of
/// kills over every process, as [`stop_processes`] does on the host, are
/// slow enough under TCG to kill the next exec too. Then flushes the guest's
/// page cache: writes to `/workspace` the killed processes left there reach
/// the host now, so the watcher's next measurement (its baseline) holds
/// them, and only writes made after it count as growth.
fn guest_kill() -> String {
    use sandbox_guest::{CGROUP_ROOT as ROOT, SANDBOX_GROUP};
    format!(
        r#"echo $$ > {ROOT}/cgroup.procs
echo 1 > {ROOT}/{SANDBOX_GROUP}/cgroup.kill
for d in /proc/[0-9]*; do
  p=${{d#/proc/}}
  if [ "$p" = 1 ] || [ "$p" = "$PPID" ] || [ "$p" = "$$" ]; then continue; fi
  read -r group < "$d/cgroup" 2>/dev/null || continue
  if [ "$group" != "0::/{SANDBOX_GROUP}" ]; then kill -9 "$p" 2>/dev/null; fi
done
sync"#
    )
}

/// Starts watching a VM whose writers are `writers`; the watcher ends when
/// the returned handle is dropped.
pub fn watch(limit: u64, parts: Vec<Part>, writers: Writers) -> (Arc<Watch>, tokio_util::task::AbortOnDropHandle<()>) {
    let w = Arc::new(Watch { limit, reading: Mutex::default(), stops: AtomicU64::new(0) });
    #[cfg(linux_host)]
    if let Writers::Host { pid1, agent } = &writers {
        cap_file_size(&[*pid1, *agent], limit);
    }
    let shared = w.clone();
    let task = tokio::spawn(async move {
        let mut wire = Tripwire::new(&parts);
        let mut previous: Option<u64> = None;
        let mut phase = Phase::Normal;
        // The VM's processes, stopped for the next walk to count.
        let mut held: Held = None;
        loop {
            let started = tokio::time::Instant::now();
            let Some(sizes) = measure_writers(&parts, &writers).await else {
                drop(held.take());
                tokio::time::sleep(INTERVAL).await;
                continue;
            };
            let took = started.elapsed();
            let used: u64 = sizes.iter().map(|(_, b)| b).sum();
            let action;
            (action, phase) = decide(phase, used, limit, previous);
            {
                let mut r = shared.reading.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                r.used = used;
                match action {
                    Action::Nothing => {}
                    Action::KillProcesses => {
                        r.exceeded = message(used, limit, &sizes, "its processes were stopped");
                        tracing::warn!(why = %r.exceeded, "stopping the vm's processes");
                    }
                    Action::StopVm => {
                        r.exceeded =
                            message(used, limit, &sizes, "the VM was stopped, its writes outlived its processes");
                        r.stopped_vm = true;
                        tracing::warn!(why = %r.exceeded, "stopping the vm");
                    }
                }
            }
            match action {
                Action::Nothing => {}
                Action::KillProcesses => {
                    // Counted before the kill: an Exec that sees its process
                    // die of it must find the reason already there.
                    shared.stops.fetch_add(1, Ordering::SeqCst);
                    match &writers {
                        #[cfg(linux_host)]
                        Writers::Host { pid1, agent } => stop_processes(*pid1, *agent),
                        Writers::Guest { agent, .. } => {
                            let argv = vec!["sh".into(), "-c".into(), guest_kill()];
                            if let Err(e) = super::guest::run(agent, argv).await {
                                tracing::warn!(error = %e, "the guest's processes were not all stopped");
                            }
                        }
                    }
                }
                Action::StopVm => {
                    // On the host, PID 1's death ends the pid namespace: the
                    // kernel kills every process in it. Either way the VM
                    // stops as if its init died, with the reason above as
                    // its stop reason.
                    shared.stops.fetch_add(1, Ordering::SeqCst);
                    match &writers {
                        #[cfg(linux_host)]
                        Writers::Host { pid1, .. } => {
                            let _ = kill(Pid::from_raw(*pid1), Signal::SIGKILL);
                        }
                        Writers::Guest { instance, .. } => instance.kill(),
                    }
                    return;
                }
            }
            // Resumed only after the kill: a held writer gets no moment to write on.
            drop(held.take());
            let grew = previous.map_or(0, |p| used.saturating_sub(p));
            previous = Some(used);
            let near = used.saturating_mul(100) >= limit.saturating_mul(NEAR);
            let pause = if near { NEAR_INTERVAL } else { INTERVAL };
            // An early walk still waits as long as the last walk took: the
            // watcher spends at most half its time walking, however busy
            // the host's filesystem is.
            let headroom = limit.saturating_sub(used);
            let trip = wire.wait(pause.max(took * DUTY), took, headroom).await;
            // This VM is writing fast (its last interval's growth at least
            // an eighth of what is left) and, at the pace the host's
            // filesystems fall, passes its quota before the next walk has
            // counted (one as long as the last, twice over: a tree grows
            // while it is walked): its processes wait for the count. A walk
            // of a large tree takes long enough (a second for 260,000 files
            // on an idle host, several on a busy one) for a fast writer to go
            // far past its quota meanwhile. A slow writer near its quota is
            // not held for what other writers on the host do.
            let grew = grew > 0 && grew.saturating_mul(8) >= headroom;
            if let Some(trip) = trip {
                if grew && trip.reaches(headroom, took * 2) {
                    held = hold_writers(&writers).await;
                }
                tokio::time::sleep(took.saturating_sub(trip.waited)).await;
            }
        }
    });
    (w, tokio_util::task::AbortOnDropHandle::new(task))
}

/// What resumes a VM whose processes were stopped for a measurement.
#[cfg(linux_host)]
type Held = Option<super::driver::namespace::freeze::Frozen>;
/// Never held off Linux (no host VMs there); a guard all the same, so the
/// loop drops it alike everywhere.
#[cfg(not(linux_host))]
type Held = Option<Box<dyn Send>>;

/// Stops a host VM's processes until the returned guard drops (a VM that
/// will not stop within [`HOLD_WAIT`] runs on). A vm's guest is never held:
/// its writable disk is sized to the quota.
async fn hold_writers(writers: &Writers) -> Held {
    match writers {
        #[cfg(linux_host)]
        Writers::Host { pid1, .. } => {
            let pid1 = *pid1;
            tokio::task::spawn_blocking(move || super::driver::namespace::freeze::try_freeze(pid1, HOLD_WAIT))
                .await
                .ok()
                .flatten()
        }
        Writers::Guest { .. } => None,
    }
}

/// One measurement of the parts and what the writers hold beside them;
/// `None` if none could be made this time (a guest's agent that did not
/// answer: the run's end aborts the watcher).
async fn measure_writers(parts: &[Part], writers: &Writers) -> Option<Vec<(String, u64)>> {
    let walk = parts.to_vec();
    match writers {
        #[cfg(linux_host)]
        Writers::Host { pid1, .. } => {
            let pid1 = *pid1;
            tokio::task::spawn_blocking(move || measure(&walk, pid1)).await.ok()
        }
        Writers::Guest { agent, .. } => {
            let layer = super::guest::stats(agent).await.ok()?.disk_used_bytes;
            let shares = tokio::task::spawn_blocking(move || {
                walk.iter().map(|p| (p.label.clone(), allocated(&p.path))).collect::<Vec<_>>()
            })
            .await
            .ok()?;
            Some(std::iter::once(("writable layer".to_string(), layer)).chain(shares).collect())
        }
    }
}

/// Where the watcher stands after its last kill round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// No kill round since usage was last under the quota.
    Normal,
    /// A kill round just happened: the next measurement is the baseline
    /// (the one that triggered it may have started before writes the
    /// killed processes made until they died).
    Settling,
    /// Over the quota after a kill round: growth now comes from something
    /// the round spares (PID 1 or the agent, e.g. a writer injected by
    /// ptrace), so only stopping the VM ends it.
    Watching,
}

/// What one measurement calls for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Nothing,
    /// Kill every process of the VM but PID 1 and the agent.
    KillProcesses,
    /// Kill PID 1, ending the VM.
    StopVm,
}

/// The action for a measurement of `used` bytes, given the previous one, and
/// the phase after it.
fn decide(phase: Phase, used: u64, limit: u64, previous: Option<u64>) -> (Action, Phase) {
    if used <= limit {
        return (Action::Nothing, Phase::Normal);
    }
    let growing = previous.is_none_or(|p| used > p);
    match phase {
        Phase::Normal if growing => (Action::KillProcesses, Phase::Settling),
        Phase::Normal => (Action::Nothing, Phase::Normal),
        Phase::Settling => (Action::Nothing, Phase::Watching),
        Phase::Watching if growing => (Action::StopVm, Phase::Watching),
        Phase::Watching => (Action::Nothing, Phase::Watching),
    }
}

/// Bytes allocated under each part, and to files the VM's processes hold
/// open unlinked (listed only when there are any).
#[cfg(linux_host)]
fn measure(parts: &[Part], pid1: i32) -> Vec<(String, u64)> {
    let mut sizes: Vec<(String, u64)> = parts.iter().map(|p| (p.label.clone(), allocated(&p.path))).collect();
    let mut devs: HashSet<u64> =
        parts.iter().filter_map(|p| std::fs::metadata(&p.path).ok()).map(|m| m.dev()).collect();
    // Files opened through the overlay report the overlay's device.
    devs.extend(std::fs::metadata(format!("/proc/{pid1}/root")).ok().map(|m| m.dev()));
    let open = unlinked(pid1, &devs);
    if open > 0 {
        sizes.push(("unlinked open files".into(), open));
    }
    sizes
}

/// `disk quota exceeded: 10.0 GiB used of 10 GiB (writable layer 8.1 GiB,
/// /workspace 1.9 GiB); delete files or raise disk in the profile`.
pub fn message(used: u64, limit: u64, parts: &[(String, u64)], done: &str) -> String {
    let parts: Vec<String> = parts.iter().map(|(label, b)| format!("{label} {}", size(*b))).collect();
    format!(
        "disk quota exceeded: {} used of {} ({}); {done}; delete files or raise disk in the profile",
        size(used),
        size(limit),
        parts.join(", ")
    )
}

/// `bytes` in the largest binary unit that keeps it at least 1, as messages show sizes.
pub fn size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = "B";
    for u in UNITS {
        if value < 1024.0 {
            break;
        }
        value /= 1024.0;
        unit = u;
    }
    if unit == "B" {
        return format!("{bytes} B");
    }
    let text = format!("{value:.1}");
    format!("{} {unit}", text.strip_suffix(".0").unwrap_or(&text))
}

/// Caps the size of any one file the VM's processes write at the quota
/// (`RLIMIT_FSIZE`, soft and hard), on PID 1 and the agent, which every
/// later process inherits. A file bigger than the whole quota is over it
/// anyway, and the kernel refuses the write that would pass it (EFBIG,
/// SIGXFSZ) before it lands: the one writer no walk is fast enough for, a
/// single stream at the disk's full speed (`dd bs=16M`, `fallocate`, a
/// sparse file written far out), is stopped at the quota exactly, whatever
/// the host's load. Only the host's own capabilities raise a hard limit,
/// so root in the sandbox cannot lift it. Many files written at once are
/// still the walk's and the [`Tripwire`]'s to catch.
#[cfg(linux_host)]
fn cap_file_size(pids: &[i32], limit: u64) {
    let cap = libc::rlimit { rlim_cur: limit, rlim_max: limit };
    for &pid in pids {
        // SAFETY: prlimit with a valid struct and no old-value pointer.
        if unsafe { libc::prlimit(pid, libc::RLIMIT_FSIZE, &cap, std::ptr::null_mut()) } != 0 {
            let e = std::io::Error::last_os_error();
            tracing::warn!(pid, error = %e, "could not cap file sizes at the disk quota");
        }
    }
}

/// Kills every process of the VM but PID 1 and the agent. Killed processes
/// cannot fork, so a few rounds catch what was being forked meanwhile.
#[cfg(linux_host)]
fn stop_processes(pid1: i32, agent: i32) {
    for _ in 0..KILL_ROUNDS {
        let victims: Vec<i32> = sandbox_agent::tree::descendants(pid1).into_keys().filter(|&p| p != agent).collect();
        if victims.is_empty() {
            return;
        }
        for pid in victims {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn sizes_read_like_the_message_says() {
        assert_eq!(size(10 << 30), "10 GiB");
        assert_eq!(size((81 << 30) / 10), "8.1 GiB");
        assert_eq!(size(512), "512 B");
        assert_eq!(size(64 << 20), "64 MiB");
        let parts = [("writable layer".to_string(), (81 << 30) / 10), ("/workspace".to_string(), (19 << 30) / 10)];
        assert_eq!(
            message(10 << 30, 10 << 30, &parts, "its processes were stopped"),
            "disk quota exceeded: 10 GiB used of 10 GiB (writable layer 8.1 GiB, /workspace 1.9 GiB); its processes \
             were stopped; delete files or raise disk in the profile"
        );
    }

    #[test]
    fn growth_after_a_kill_round_stops_the_vm() {
        let limit = 100;
        // Under the quota: nothing, whatever came before.
        assert_eq!(decide(Phase::Watching, 90, limit, Some(150)), (Action::Nothing, Phase::Normal));
        // Past it and growing: the processes are killed.
        assert_eq!(decide(Phase::Normal, 120, limit, Some(90)), (Action::KillProcesses, Phase::Settling));
        assert_eq!(decide(Phase::Normal, 120, limit, None), (Action::KillProcesses, Phase::Settling));
        // Past it but not growing (files being deleted): nothing.
        assert_eq!(decide(Phase::Normal, 120, limit, Some(130)), (Action::Nothing, Phase::Normal));
        // The measurement after a kill round is the baseline, even if it
        // grew (the triggering walk started before the last writes).
        assert_eq!(decide(Phase::Settling, 130, limit, Some(120)), (Action::Nothing, Phase::Watching));
        // Still growing after that: something the round spares writes.
        assert_eq!(decide(Phase::Watching, 131, limit, Some(130)), (Action::StopVm, Phase::Watching));
        // Holding steady over the quota is no reason; a later growth is.
        assert_eq!(decide(Phase::Watching, 130, limit, Some(130)), (Action::Nothing, Phase::Watching));
        assert_eq!(decide(Phase::Watching, 140, limit, Some(130)), (Action::StopVm, Phase::Watching));
    }

    /// A directory removed when the test ends.
    pub(super) struct Scratch(pub(super) PathBuf);

    impl Scratch {
        pub(super) fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
