//! Disk quota (VmSpec.disk_bytes): a writer past it is stopped or gets
//! ENOSPC within a couple of seconds, the VM's disk use stays near the
//! quota, the VM says why, and deleting files still works.
use std::io::Write as _;

use super::*;

const QUOTA: u64 = 64 << 20;
/// How far past the quota a throttled writer may get before it is stopped
/// (a helper that measures checks several times a second near the quota).
const OVERSHOOT: u64 = 32 << 20;

async fn stats(h: &mut Harness, id: &str) -> pb::StatsResponse {
    h.client.stats(pb::StatsRequest { vm_id: id.into() }).await.unwrap().into_inner()
}

/// A running VM with a [`QUOTA`] disk quota and a host directory as its
/// /workspace; its id and that directory.
async fn quota_vm(h: &mut Harness) -> (String, std::path::PathBuf) {
    let ws = h.tmp.0.join("workspace");
    std::fs::create_dir(&ws).unwrap();
    let ws_str = ws.to_str().unwrap().to_string();
    let id = h
        .running("vm", |s| {
            s.disk_bytes = QUOTA;
            s.mounts = vec![mount(&ws_str, "/workspace")];
        })
        .await;
    (id, ws)
}

#[tokio::test]
async fn a_writer_past_the_disk_quota_is_stopped_and_the_vm_says_why() {
    let mut h = Harness::new("quota").await;
    let (id, ws) = quota_vm(&mut h).await;
    assert_eq!(h.get(&id).await.unwrap().spec.unwrap().disk_bytes, QUOTA);
    // 16 MiB in the writable layer (/tmp is part of it), then a writer
    // into /workspace that would go far past the quota.
    let o = h.sh(&id, "head -c 16777216 /dev/urandom > /tmp/layer && echo ok").await;
    assert_eq!(o.out(), "ok\n", "{}", o.err());
    let writer = format!("import os, time\nf = open('/workspace/big', 'wb')\n{WRITE_1GIB}");
    let o = h.run(process(&id, &["python3", "-c", &writer]), b"").await.unwrap();
    let stopped = stopped_or_refused(&o);
    if stopped {
        let err = o.err();
        assert!(err.contains("disk quota exceeded: "), "{err}");
        assert!(err.contains("used of 64 MiB (writable layer "), "{err}");
        assert!(err.contains(", /workspace "), "{err}");
        assert!(err.contains("delete files or raise disk in the profile"), "{err}");
    }
    let now = stats(&mut h, &id).await;
    assert_eq!(now.disk_limit_bytes, QUOTA);
    assert!(now.disk_used_bytes <= QUOTA + OVERSHOOT, "{now:?}");
    let on_host = std::fs::metadata(ws.join("big")).map(|m| m.blocks() * 512).unwrap_or(0);
    assert!(on_host <= QUOTA + OVERSHOOT, "{on_host} bytes reached the host");
    if stopped {
        assert!(now.disk_quota_exceeded.starts_with("disk quota exceeded: "), "{now:?}");
    }
    // The VM still answers, and deleting brings it back under its quota.
    let o = h.sh(&id, "rm /workspace/big /tmp/layer && echo small > /workspace/small && cat /workspace/small").await;
    assert_eq!((o.out(), o.code()), ("small\n".to_string(), Some(0)), "{}", o.err());
    back_under_quota(&mut h, &id).await;
}

#[tokio::test]
async fn the_disk_quota_defaults_to_ten_gibibytes() {
    let mut h = Harness::new("quotadef").await;
    let id = h.running("vm", |_| {}).await;
    assert_eq!(h.get(&id).await.unwrap().spec.unwrap().disk_bytes, 10 << 30);
    let now = stats(&mut h, &id).await;
    assert_eq!(now.disk_limit_bytes, 10 << 30);
    assert!(now.disk_quota_exceeded.is_empty(), "{now:?}");
}

/// Runs `writer` (Python) in a VM with the 64 MiB quota and asserts it was
/// stopped (or refused) near the quota with the reason on stderr.
async fn assert_writer_is_stopped(h: &mut Harness, writer: &str, reason: &str) -> String {
    let id = h.running("vm", |s| s.disk_bytes = QUOTA).await;
    let o = h.run(process(&id, &["python3", "-c", writer]), b"").await.unwrap();
    if stopped_or_refused(&o) {
        assert!(o.err().contains("disk quota exceeded: "), "{o:?}");
        assert!(o.err().contains(reason), "{o:?}");
        let now = stats(h, &id).await;
        assert!(now.disk_quota_exceeded.starts_with("disk quota exceeded: "), "{now:?}");
    }
    // The VM still answers. A writer the kernel's cap refused left its file
    // over the quota: the watcher's next walk kills what runs then, once.
    let mut alive = h.sh(&id, "echo alive").await;
    let mut poll = Poll::every(Duration::from_millis(50));
    while alive.status == Some(pb::exited::Status::Signal(libc::SIGKILL)) && poll.again().await {
        alive = h.sh(&id, "echo alive").await;
    }
    assert_eq!(alive.out(), "alive\n", "{alive:?}");
    id
}

/// Asserts a 1 GiB writer was stopped (SIGKILL, the measured quota) or got
/// ENOSPC before it finished; true when it was stopped.
fn stopped_or_refused(o: &Output) -> bool {
    let stopped = o.status == Some(pb::exited::Status::Signal(libc::SIGKILL));
    assert!(stopped || refused(&o.err()), "the writer was neither stopped nor refused: {o:?}");
    assert!(!o.out().contains("wrote 1 GiB"), "{o:?}");
    stopped
}

/// Waits until the watcher has recorded why the VM went over its quota: the
/// writer may have been stopped by the kernel's cap on one file before the
/// watcher's next walk, which records it (and kills what runs then).
async fn recorded_exceeded(h: &mut Harness, id: &str) {
    let mut now = stats(h, id).await;
    let mut poll = Poll::every(Duration::from_millis(50));
    while now.disk_quota_exceeded.is_empty() && poll.again().await {
        now = stats(h, id).await;
    }
    assert!(now.disk_quota_exceeded.starts_with("disk quota exceeded: "), "{now:?}");
}

/// Waits until the watcher has measured the VM well under its quota.
async fn back_under_quota(h: &mut Harness, id: &str) {
    let mut now = stats(h, id).await;
    let mut poll = Poll::every(Duration::from_millis(50));
    while now.disk_used_bytes >= QUOTA / 2 && poll.again().await {
        now = stats(h, id).await;
    }
    assert!(now.disk_used_bytes < QUOTA / 2, "{now:?}");
}

/// Whether `err` says a write was refused: the disk is full (a guest's
/// disk sized to the quota) or the file reached the cap on one file's size.
fn refused(err: &str) -> bool {
    err.contains("No space left on device") || err.contains("File too large")
}

/// 1 MiB at a time, about 50 MB/s, synced so the blocks are allocated as it
/// goes, into the already open `f`.
const WRITE_1GIB: &str = "for i in range(1024):\n    f.write(os.urandom(1 << 20)); f.flush(); os.fsync(f.fileno()); \
                          time.sleep(0.02)\nprint('wrote 1 GiB')";

#[tokio::test]
async fn a_writer_into_an_unlinked_file_is_stopped_at_the_disk_quota() {
    let mut h = Harness::new("quotaunl").await;
    // No name left for a walk of the tree to find.
    let writer = format!("import os, time\nf = open('/tmp/x', 'wb')\nos.unlink('/tmp/x')\n{WRITE_1GIB}");
    assert_writer_is_stopped(&mut h, &writer, "unlinked open files ").await;
}

#[tokio::test]
async fn a_writer_deeper_than_path_max_is_stopped_at_the_disk_quota() {
    let mut h = Harness::new("quotadeep").await;
    // 25 levels of 200-character names: 5000 bytes of path, past PATH_MAX,
    // reached by relative chdir.
    let writer = format!(
        "import os, time\nos.chdir('/tmp')\nfor i in range(25):\n    os.mkdir('d' * 200); os.chdir('d' * 200)\n\
         f = open('big', 'wb')\n{WRITE_1GIB}"
    );
    assert_writer_is_stopped(&mut h, &writer, "writable layer ").await;
}

/// How far past the quota the fastest writers may get: the bound,
/// 10% of the quota or 64 MiB, whichever is larger.
const FAST_OVERSHOOT: u64 = 64 << 20;

#[tokio::test]
async fn a_writer_at_full_speed_is_stopped_within_64_mib_of_the_disk_quota() {
    let mut h = Harness::new("quotafast").await;
    let (id, ws) = quota_vm(&mut h).await;
    // 1.6 GiB in 16 MiB writes as fast as the host takes them: no pause
    // for a once-a-second walk to fall between.
    let o = h.sh(&id, "dd if=/dev/zero of=/workspace/big bs=16M count=100 2>&1; echo done").await;
    let on_host = std::fs::metadata(ws.join("big")).map(|m| m.blocks() * 512).unwrap_or(0);
    assert!(on_host <= QUOTA + FAST_OVERSHOOT, "{on_host} bytes reached the host: {o:?}");
    recorded_exceeded(&mut h, &id).await;
    assert_eq!(h.sh(&id, "rm /workspace/big && echo gone").await.out(), "gone\n");
}

#[tokio::test]
async fn no_one_file_outgrows_the_quota_and_the_agent_outlives_a_copy_that_tries() {
    let mut h = Harness::new("quotafile").await;
    let id = h.running("vm", |s| s.disk_bytes = QUOTA).await;
    // Straight from Exec, so its own end is what the client sees: the
    // kernel's file size cap (SIGXFSZ, with the cap named), the watcher's
    // kill, or a guest disk sized to the quota.
    let o = h.run(process(&id, &["dd", "if=/dev/zero", "of=/tmp/big", "bs=16M", "count=100"]), b"").await.unwrap();
    match o.status {
        Some(pb::exited::Status::Signal(libc::SIGXFSZ)) => {
            let err = o.err();
            assert!(
                err.contains("disk quota exceeded: a file reached 64 MiB, the whole quota and the most any one"),
                "{err}"
            );
        }
        Some(pb::exited::Status::Signal(libc::SIGKILL)) => assert!(o.err().contains("disk quota exceeded: "), "{o:?}"),
        // A write through the overlay meets the cap as EFBIG.
        _ => assert!(refused(&o.err()), "{o:?}"),
    }
    // The watcher's walk after dd's end kills whatever runs then: wait for it.
    recorded_exceeded(&mut h, &id).await;
    let o = h.sh(&id, "stat -c %b /tmp/big; rm /tmp/big").await;
    let blocks: u64 = o.out().trim().parse().unwrap_or_else(|_| panic!("{o:?}"));
    assert!(blocks * 512 <= QUOTA + FAST_OVERSHOOT, "{o:?}");
    // Back under the quota before the next writer, as a user would be: a
    // VM still over it after a kill round is stopped when it grows again.
    back_under_quota(&mut h, &id).await;
    // Preallocation and a write far into a sparse file meet the same cap
    // (or the guest disk's end).
    let far = "import os\nf = os.open('/tmp/far', os.O_CREAT | os.O_WRONLY)\n\
               for what, call in (('fallocate', lambda: os.posix_fallocate(f, 0, 1 << 30)), ('pwrite', lambda: os.pwrite(f, b'x', 1 << 34))):\n\
               \x20   try: call(); print(what, 'done', os.fstat(f).st_blocks * 512)\n\
               \x20   except OSError as e: print(what, e.strerror)\n";
    let o = h.run(process(&id, &["python3", "-c", far]), b"").await.unwrap();
    let out = o.out();
    assert_eq!(o.code(), Some(0), "{o:?}");
    for line in out.lines() {
        let small = line.split(' ').nth(2).and_then(|b| b.parse::<u64>().ok()).is_some_and(|b| b <= QUOTA);
        assert!(refused(line) || (line.starts_with("pwrite done") && small), "{out}");
    }
    assert_eq!(out.lines().count(), 2, "{o:?}");
    assert_eq!(h.sh(&id, "rm /tmp/far && echo gone").await.out(), "gone\n");
    back_under_quota(&mut h, &id).await;
    // A file larger than the quota through CopyIn, which the agent itself
    // writes: the copy fails naming the file, the partial file is gone and
    // the agent still answers.
    let mut b = tar::Builder::new(Vec::new());
    super::copy::file(&mut b, "huge", 0o644, &vec![0u8; (QUOTA + (1 << 20)) as usize]);
    let e = super::copy::copy_in(&mut h, &id, "/tmp", b.into_inner().unwrap()).await.unwrap_err();
    let m = e.message();
    assert!(m.contains("cannot write /tmp/huge"), "{e:?}");
    assert!(refused(m), "{e:?}");
    let o = h.sh(&id, "ls -A /tmp; echo alive").await;
    assert_eq!(o.out(), "alive\n", "{o:?}");
    // Root in the sandbox cannot lift the cap, on itself or on the
    // sandbox's PID 1: raising a hard limit takes CAP_SYS_RESOURCE in the
    // host's user namespace. A driver with a kernel of its own sets no cap
    // (its guest's disk is sized to the quota).
    let lift = "import resource as r\n\
                for pid in (0, 1):\n\
                \x20   hard = r.prlimit(pid, r.RLIMIT_FSIZE)[1]\n\
                \x20   if hard == r.RLIM_INFINITY: print(pid, 'uncapped'); continue\n\
                \x20   try: r.prlimit(pid, r.RLIMIT_FSIZE, (r.RLIM_INFINITY, r.RLIM_INFINITY)); print(pid, 'lifted')\n\
                \x20   except (ValueError, OSError): print(pid, 'refused', hard)\n";
    let o = h.run(process(&id, &["python3", "-c", lift]), b"").await.unwrap();
    let info = h.client.get_info(pb::GetInfoRequest {}).await.unwrap().into_inner();
    let own_kernel =
        info.drivers.iter().find(|d| d.is_default).and_then(|d| d.capabilities.as_ref()).is_some_and(|c| c.own_kernel);
    let capped = format!("0 refused {QUOTA}\n1 refused {QUOTA}\n");
    assert!(o.out() == capped || (own_kernel && o.out() == "0 uncapped\n1 uncapped\n"), "{o:?}");
}

#[tokio::test]
async fn empty_files_cost_quota_and_a_flood_of_them_is_stopped() {
    let mut h = Harness::new("quotainodes").await;
    let id = h.running("vm", |s| s.disk_bytes = QUOTA).await;
    // Empty files allocate no block, yet each takes an inode of the host:
    // each costs 4 KiB of quota, so 64 MiB holds 16384 of them, and a
    // writer making 200000 as fast as it can is stopped near there.
    let flood = "import os\nos.mkdir('/tmp/f')\nfor i in range(200000):\n    os.close(os.open(f'/tmp/f/{i}', os.O_CREAT | os.O_WRONLY))\nprint('made them all')";
    let o = h.run(process(&id, &["python3", "-c", flood]), b"").await.unwrap();
    // A vm's writable disk is sized to the quota: its own inodes run out.
    let stopped = o.status == Some(pb::exited::Status::Signal(libc::SIGKILL));
    assert!(stopped || o.err().contains("No space left on device"), "{o:?}");
    assert!(!o.out().contains("made them all"), "{o:?}");
    let count = h.sh(&id, "find /tmp/f -mindepth 1 | wc -l").await;
    let made: u64 = count.out().trim().parse().unwrap();
    assert!(made * 4096 <= QUOTA + FAST_OVERSHOOT, "{made} empty files were made under a 64 MiB quota");
    if stopped {
        assert!(o.err().contains("disk quota exceeded: "), "{o:?}");
        // Its last measurement, which found the files past the quota.
        let now = stats(&mut h, &id).await;
        assert!(now.disk_used_bytes > QUOTA, "{now:?}");
    }
    assert_eq!(h.sh(&id, "rm -rf /tmp/f && echo gone").await.out(), "gone\n");
}

#[tokio::test]
async fn writes_that_outlive_the_kill_round_stop_the_vm_with_the_reason() {
    let mut h = Harness::new("quotavm").await;
    let (id, ws) = quota_vm(&mut h).await;
    // A writer the kill round cannot reach (as one injected into PID 1
    // would be): this test, writing into the VM's /workspace from the host.
    let mut f = std::fs::File::create(ws.join("big")).unwrap();
    let chunk = vec![1u8; 1 << 20];
    let mut vm = h.get(&id).await.unwrap();
    for _ in 0..512 {
        if vm.state == pb::VmState::Stopped as i32 {
            break;
        }
        f.write_all(&chunk).unwrap();
        f.sync_data().unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        vm = h.get(&id).await.unwrap();
    }
    assert_eq!(vm.state, pb::VmState::Stopped as i32, "{vm:?}");
    assert!(vm.stop_reason.starts_with("disk quota exceeded: "), "{}", vm.stop_reason);
    assert!(vm.stop_reason.contains("the VM was stopped"), "{}", vm.stop_reason);
    // Deleting brings it back under the quota, and it starts again.
    drop(f);
    std::fs::remove_file(ws.join("big")).unwrap();
    h.start(&id).await.unwrap();
    assert_eq!(h.sh(&id, "echo again").await.out(), "again\n");
}
