//! The tripwire between walks: the free blocks and inodes of the
//! filesystems a VM's parts live on, read every [`TRIP_POLL`], so a fast
//! writer triggers the next walk at once instead of a second later.
use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;

use super::{INODE_COST, Part};

/// How often the [`Tripwire`] reads the parts' filesystems between walks.
const TRIP_POLL: Duration = Duration::from_millis(25);
/// The least drop of free space that trips it: below this an early walk
/// is not worth its cost, even with no headroom left.
const TRIP_MIN: u64 = 4 << 20;

/// The free space of the filesystems a VM's parts live on, read with one
/// `statfs` each: O(1), so it is read every [`TRIP_POLL`], where a walk of
/// the tree may take a second. Those filesystems are the host's, so other
/// writers move it too: one that fills it costs at most an early walk, and
/// one that frees space (a test deleting a large file beside a sandbox
/// making empty files) must not hide this VM's use, so blocks and inodes of
/// each filesystem are counted apart, each down from the most seen free
/// during the wait.
pub(super) struct Tripwire {
    /// One path per filesystem among the parts.
    filesystems: Vec<PathBuf>,
}

/// One filesystem's free space, as a walk charges it.
#[derive(Debug, Clone, Copy, Default)]
struct Free {
    bytes: u64,
    inodes: u64,
}

impl Tripwire {
    pub(super) fn new(parts: &[Part]) -> Self {
        let mut devices = HashSet::new();
        let filesystems = parts
            .iter()
            .filter(|p| {
                std::fs::metadata(&p.path).is_ok_and(|m| devices.insert(std::os::unix::fs::MetadataExt::dev(&m)))
            })
            .map(|p| p.path.clone())
            .collect();
        Tripwire { filesystems }
    }

    /// Each filesystem's free bytes and inodes (zero for one that cannot be read).
    fn free(&self) -> Vec<Free> {
        self.filesystems
            .iter()
            .map(|p| {
                nix::sys::statvfs::statvfs(p).map_or(Free::default(), |fs| Free {
                    bytes: fs.blocks_free().saturating_mul(fs.fragment_size()),
                    inodes: fs.files_free(),
                })
            })
            .collect()
    }

    /// Sleeps for `pause`, or less: once at least `least` has passed and
    /// the filesystems lost half of `headroom` (the quota left at the last
    /// walk) since the call began, each inode worth [`INODE_COST`], or at
    /// once when they lost all of it (the VM may be past its quota: the
    /// watcher decides whether to hold it while the rest of `least` runs).
    /// `None`: the pause ran out.
    pub(super) async fn wait(&mut self, pause: Duration, least: Duration, headroom: u64) -> Option<Trip> {
        let started = tokio::time::Instant::now();
        if self.filesystems.is_empty() {
            tokio::time::sleep(pause).await;
            return None;
        }
        let mut most = self.free();
        let trip = (headroom / 2).max(TRIP_MIN);
        while started.elapsed() < pause {
            tokio::time::sleep(TRIP_POLL.min(pause.saturating_sub(started.elapsed()))).await;
            let mut fell = 0u64;
            for (most, now) in most.iter_mut().zip(self.free()) {
                most.bytes = most.bytes.max(now.bytes);
                most.inodes = most.inodes.max(now.inodes);
                fell = fell
                    .saturating_add(most.bytes - now.bytes)
                    .saturating_add((most.inodes - now.inodes).saturating_mul(INODE_COST));
            }
            let waited = started.elapsed();
            if (waited >= least && fell >= trip) || fell >= headroom.max(TRIP_MIN) {
                return Some(Trip { fell, waited });
            }
        }
        None
    }
}

/// What ended a [`Tripwire::wait`] early: the filesystems lost `fell`
/// bytes (inodes at [`INODE_COST`]) in `waited`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Trip {
    pub(super) fell: u64,
    pub(super) waited: Duration,
}

impl Trip {
    /// Whether, at the pace it fell, the filesystems lose `headroom` within
    /// `more` from now: a writer that fast passes its quota while a walk
    /// that long counts.
    pub(super) fn reaches(&self, headroom: u64, more: Duration) -> bool {
        let pace = self.fell as f64 / self.waited.as_secs_f64().max(TRIP_POLL.as_secs_f64());
        self.fell as f64 + pace * more.as_secs_f64() >= headroom as f64
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::tests::Scratch;
    use super::*;

    #[tokio::test]
    #[allow(clippy::await_holding_lock, reason = "held for the whole test, on its own runtime")]
    async fn the_tripwire_cuts_a_pause_short_when_the_filesystem_fills() {
        let _serial = crate::driver::namespace::freeze::heavy_test();
        let dir = Scratch(std::env::temp_dir().join(format!("quota-trip-{}", std::process::id())));
        std::fs::create_dir_all(dir.path()).unwrap();
        let mut wire = Tripwire::new(&[Part { label: "scratch".into(), path: dir.path().to_path_buf() }]);
        assert_eq!(wire.filesystems.len(), 1);
        let path = dir.path().join("fill");
        // Written while the tripwire waits: 32 MiB, past half of a 16 MiB
        // headroom. Nothing else ends an hour's pause.
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            std::fs::write(&path, vec![1u8; 32 << 20]).unwrap();
        });
        let waited = tokio::time::timeout(
            Duration::from_secs(60),
            wire.wait(Duration::from_secs(3600), Duration::ZERO, 16 << 20),
        );
        assert!(waited.await.is_ok(), "the tripwire did not see 32 MiB written");
        writer.join().unwrap();
    }

    #[tokio::test]
    #[allow(clippy::await_holding_lock, reason = "held for the whole test, on its own runtime")]
    async fn space_freed_beside_a_flood_of_empty_files_does_not_hide_it() {
        let _serial = crate::driver::namespace::freeze::heavy_test();
        let dir = Scratch(std::env::temp_dir().join(format!("quota-trip-free-{}", std::process::id())));
        std::fs::create_dir_all(dir.path().join("flood")).unwrap();
        let big = dir.path().join("big");
        std::fs::write(&big, vec![1u8; 256 << 20]).unwrap();
        let mut wire = Tripwire::new(&[Part { label: "scratch".into(), path: dir.path().to_path_buf() }]);
        // Another writer on the host frees 256 MiB, then this VM makes
        // 4096 empty files (16 MiB of quota, past half of a 16 MiB
        // headroom): the freed blocks must not cancel the inodes.
        let flood = dir.path().join("flood");
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            std::fs::remove_file(&big).unwrap();
            std::thread::sleep(Duration::from_millis(100));
            for i in 0..4096 {
                std::fs::File::create(flood.join(i.to_string())).unwrap();
            }
        });
        let waited = tokio::time::timeout(
            Duration::from_secs(60),
            wire.wait(Duration::from_secs(3600), Duration::ZERO, 16 << 20),
        );
        assert!(waited.await.is_ok(), "the tripwire did not see 4096 files made after 256 MiB were freed");
        writer.join().unwrap();
    }

    #[test]
    fn a_writer_is_held_when_its_pace_passes_the_headroom_within_the_next_walk() {
        // 100 MiB in half a second: 200 MiB/s.
        let trip = Trip { fell: 100 << 20, waited: Duration::from_millis(500) };
        assert!(trip.reaches(100 << 20, Duration::ZERO), "the whole headroom is gone already");
        assert!(trip.reaches(300 << 20, Duration::from_secs(1)), "200 MiB more in a 1 s walk");
        assert!(!trip.reaches(400 << 20, Duration::from_secs(1)), "a 1 s walk ends 100 MiB short");
        // A trip on the first poll is paced over a poll, not over no time.
        let at_once = Trip { fell: 8 << 20, waited: Duration::ZERO };
        assert!(!at_once.reaches(1 << 30, Duration::from_secs(1)));
    }
}
