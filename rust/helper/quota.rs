//! Disk quotas: a VM's writable layer (its /tmp included, which lives in
//! it) and its writable mounts (the /workspace volume) may hold
//! `VmSpec.disk_bytes` together.
//!
//! Enforced by measuring, not by the filesystem. A hard quota needs ext4 or
//! xfs project quotas, which need mount options (`prjquota`) that hosts
//! rarely have and that only root may set, or a loop-mounted filesystem per
//! VM, which costs a preallocated image and a mount per VM and cannot hold
//! the /workspace volume (a host directory that outlives the VM). So a
//! watcher per running VM sums the allocated blocks (`st_blocks`, hard
//! links once) under each part, about once a second: more often near the
//! quota, where a fast writer overshoots the most, and never more than a
//! tenth of the time, so a slow walk (a huge tree) costs a bounded share of
//! a CPU. When a measurement is past the quota and above the previous one
//! (something is writing), every process of the VM but its PID 1 and agent
//! is killed and the reason recorded: Stats reports it, and an Exec whose
//! process died of it gets it on stderr. Deleting files is never stopped
//! (usage goes down), so the sandbox can be brought back under its quota.
use std::collections::HashSet;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// How often usage is measured, far from the quota.
const INTERVAL: Duration = Duration::from_secs(1);
/// How often near it (above [`NEAR`] of the quota).
const NEAR_INTERVAL: Duration = Duration::from_millis(100);
/// "Near the quota": this fraction of it, in percent.
const NEAR: u64 = 80;
/// A measurement may take at most this share of the time (1/N).
const DUTY: u32 = 10;
/// Bound on the kill rounds (each finds only what forked before the last).
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

/// Starts watching a VM whose PID 1 and agent have host pids `pid1` and
/// `agent`; the watcher ends when the returned handle is dropped.
pub fn watch(
    limit: u64,
    parts: Vec<Part>,
    pid1: i32,
    agent: i32,
) -> (std::sync::Arc<Watch>, tokio_util::task::AbortOnDropHandle<()>) {
    let w = std::sync::Arc::new(Watch { limit, reading: Mutex::default(), stops: AtomicU64::new(0) });
    let shared = w.clone();
    let task = tokio::spawn(async move {
        let mut previous: Option<u64> = None;
        loop {
            let started = tokio::time::Instant::now();
            let walk = parts.clone();
            let Ok(sizes) = tokio::task::spawn_blocking(move || measure(&walk)).await else { return };
            let took = started.elapsed();
            let used: u64 = sizes.iter().map(|(_, b)| b).sum();
            let stop = used > limit && previous.is_none_or(|p| used > p);
            {
                let mut r = shared.reading.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                r.used = used;
                if stop {
                    r.exceeded = message(used, limit, &sizes);
                    tracing::warn!(pid1, why = %r.exceeded, "stopping the vm's processes");
                }
            }
            if stop {
                // Counted before the kill: an Exec that sees its process die
                // of it must find the reason already there.
                shared.stops.fetch_add(1, Ordering::SeqCst);
                stop_processes(pid1, agent);
            }
            previous = Some(used);
            let near = used.saturating_mul(100) >= limit.saturating_mul(NEAR);
            let pause = if near { NEAR_INTERVAL } else { INTERVAL };
            tokio::time::sleep(pause.max(took * DUTY)).await;
        }
    });
    (w, tokio_util::task::AbortOnDropHandle::new(task))
}

/// Bytes allocated under each part.
fn measure(parts: &[Part]) -> Vec<(String, u64)> {
    parts.iter().map(|p| (p.label.clone(), allocated(&p.path))).collect()
}

/// Allocated bytes under `root`: st_blocks of every entry, hard-linked files
/// once, without following symlinks or leaving root's filesystem.
/// Unreadable directories count as empty.
pub fn allocated(root: &Path) -> u64 {
    let Ok(top) = std::fs::symlink_metadata(root) else { return 0 };
    let dev = top.dev();
    let mut total = top.blocks() * 512;
    let mut linked = HashSet::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            if meta.dev() != dev {
                continue;
            }
            if meta.nlink() > 1 && !meta.is_dir() && !linked.insert(meta.ino()) {
                continue;
            }
            total += meta.blocks() * 512;
            if meta.is_dir() {
                dirs.push(entry.path());
            }
        }
    }
    total
}

/// `disk quota exceeded: 10.0 GiB used of 10 GiB (writable layer 8.1 GiB,
/// /workspace 1.9 GiB); delete files or raise disk in the profile`.
pub fn message(used: u64, limit: u64, parts: &[(String, u64)]) -> String {
    let parts: Vec<String> = parts.iter().map(|(label, b)| format!("{label} {}", size(*b))).collect();
    format!(
        "disk quota exceeded: {} used of {} ({}); its processes were stopped; delete files or raise disk in the profile",
        size(used),
        size(limit),
        parts.join(", ")
    )
}

fn size(bytes: u64) -> String {
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

/// Kills every process of the VM but PID 1 and the agent. Killed processes
/// cannot fork, so a few rounds catch what was being forked meanwhile.
fn stop_processes(pid1: i32, agent: i32) {
    for _ in 0..KILL_ROUNDS {
        let victims: Vec<i32> = crate::agent::tree::descendants(pid1).into_keys().filter(|&p| p != agent).collect();
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
    use super::*;

    #[test]
    fn sizes_read_like_the_message_says() {
        assert_eq!(size(10 << 30), "10 GiB");
        assert_eq!(size((81 << 30) / 10), "8.1 GiB");
        assert_eq!(size(512), "512 B");
        assert_eq!(size(64 << 20), "64 MiB");
        let parts = [("writable layer".to_string(), (81 << 30) / 10), ("/workspace".to_string(), (19 << 30) / 10)];
        assert_eq!(
            message(10 << 30, 10 << 30, &parts),
            "disk quota exceeded: 10 GiB used of 10 GiB (writable layer 8.1 GiB, /workspace 1.9 GiB); its processes \
             were stopped; delete files or raise disk in the profile"
        );
    }

    #[test]
    fn allocated_counts_blocks_and_hard_links_once() {
        let root = std::env::temp_dir().join(format!("quota-test-{}", std::process::id()));
        std::fs::create_dir_all(&root).unwrap();
        let dir = Scratch(root);
        let empty = allocated(dir.path());
        let data = vec![1u8; 1 << 20];
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/a"), &data).unwrap();
        std::fs::hard_link(dir.path().join("sub/a"), dir.path().join("b")).unwrap();
        std::os::unix::fs::symlink("/usr", dir.path().join("link")).unwrap();
        // Sparse: a large size with nothing allocated.
        std::fs::File::create(dir.path().join("sparse")).unwrap().set_len(1 << 30).unwrap();
        let grown = allocated(dir.path()) - empty;
        assert!((1 << 20..(1 << 20) + (64 << 10)).contains(&grown), "{grown}");
    }

    /// A directory removed when the test ends.
    struct Scratch(PathBuf);

    impl Scratch {
        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
