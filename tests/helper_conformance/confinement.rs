//! What a VM is given and kept to: the shared `/workspace` mount owned by
//! the mapped root, its hostname and network mode, its memory and pids
//! limits, and the lockdown of the sandbox.
use super::*;

#[tokio::test]
async fn workspace_mount_is_shared_and_owned_by_the_mapped_root() {
    let mut h = Harness::new("ws").await;
    let ws = h.tmp.0.join("workspace");
    std::fs::create_dir(&ws).unwrap();
    std::fs::write(ws.join("from-host"), "host\n").unwrap();
    let ws_str = ws.to_str().unwrap().to_string();
    let id = h.running("vm", |s| s.mounts = vec![mount(&ws_str, "/workspace")]).await;
    let o = h.sh(&id, "cat /workspace/from-host && echo guest > /workspace/from-guest && id -u").await;
    assert_eq!((o.out(), o.code()), ("host\n0\n".to_string(), Some(0)), "{}", o.err());
    let created = ws.join("from-guest");
    assert_eq!(std::fs::read_to_string(&created).unwrap(), "guest\n");
    let owner = std::fs::metadata(&created).unwrap().uid();
    if let Some(root) = h.host_root {
        assert_eq!(owner, root, "root inside is the image's mapped root outside");
    }
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if me != 0 {
        assert_eq!(owner, me, "an ordinary user's sandbox writes /workspace files as that user");
        std::fs::remove_file(&created).expect("the user deletes what its sandbox's root wrote");
        return;
    }
    assert_ne!(owner, 0, "root inside must not be root on the host");
    // root's sandboxes never use a user's subordinate ids.
    let subuid = std::fs::read_to_string("/etc/subuid").unwrap_or_default();
    for line in subuid.lines() {
        let f: Vec<&str> = line.split(':').collect();
        if let [user, start, count] = f[..]
            && let (Ok(start), Ok(count)) = (start.parse::<u64>(), count.parse::<u64>())
            && user != "root"
            && user != "0"
        {
            let owner = u64::from(owner);
            assert!(!(start..start + count).contains(&owner), "root's sandbox uses {owner}, in {user}'s range {line}");
        }
    }
}
#[tokio::test]
async fn hostname_and_network_none() {
    let mut h = Harness::new("net").await;
    let id = h.running("vm", |s| s.hostname = "box1".into()).await;
    assert_eq!(h.sh(&id, "hostname").await.out(), "box1\n");
    let dev = h.sh(&id, "cat /proc/net/dev").await.out();
    assert!(dev.contains("lo:") && !dev.contains("eth0"), "{dev}");
    let other = h.running("dflt", |_| {}).await;
    assert_eq!(h.sh(&other, "hostname").await.out(), format!("{other}\n"));
}

#[tokio::test]
async fn network_egress_has_an_interface() {
    let mut h = Harness::new("egress").await;
    if !h.has_egress().await {
        eprintln!("skipped: the driver under test lacks network.egress");
        return;
    }
    let id = h.running("vm", |s| s.network = pb::NetworkMode::Egress as i32).await;
    let dev = h.sh(&id, "cat /proc/net/dev").await.out();
    assert!(dev.lines().skip(2).any(|l| !l.trim_start().starts_with("lo:")), "an interface besides lo: {dev}");
    if h.has_egress().await {
        assert!(dev.contains("eth0:"), "{dev}");
        let conf = h.sh(&id, "cat /etc/resolv.conf").await.out();
        assert_eq!(conf, "nameserver 10.0.2.3\n", "the helper's stack answers dns");
    }
}

#[tokio::test]
async fn memory_limit_is_enforced() {
    let mut h = Harness::new("mem").await;
    if !h.has_cgroups().await {
        eprintln!("skipped: the driver under test has no cgroups");
        return;
    }
    let id = h.running("vm", |s| s.memory_bytes = 64 << 20).await;
    let o = h.run(process(&id, &["python3", "-c", "x = b'a' * (300 << 20); print(len(x))"]), b"").await.unwrap();
    // A cgroup OOM-kills it; a guest kernel whose whole RAM is the limit
    // may refuse the allocation outright instead.
    let refused = o.code() == Some(1) && o.err().contains("MemoryError");
    assert!(o.status == Some(pb::exited::Status::Signal(9)) || refused, "allocation past the limit fails: {o:?}");
    assert_eq!(h.sh(&id, "echo alive").await.out(), "alive\n", "the vm survives");
}

#[tokio::test]
async fn pids_limit_is_enforced() {
    let mut h = Harness::new("pids").await;
    if !h.has_cgroups().await {
        eprintln!("skipped: the driver under test has no cgroups");
        return;
    }
    let id = h.running("vm", |s| s.pids_limit = 16).await;
    let o = h.sh(&id, "i=0; while [ $i -lt 40 ]; do sleep 30 & i=$((i+1)); done; echo done").await;
    assert!(o.err().to_lowercase().contains("fork"), "forks beyond the limit fail: {o:?}");
}

#[tokio::test]
async fn sandbox_is_locked_down() {
    let mut h = Harness::new("lock").await;
    if !h.driver_caps().await.seccomp {
        // Root of a guest owns its kernel (unshare, mount): the VM is the
        // boundary there (tests/test_security_vm.py).
        eprintln!("skipped: the driver under test has no seccomp lockdown");
        return;
    }
    let id = h.running("vm", |_| {}).await;
    let o = h.sh(&id, "grep NoNewPrivs /proc/self/status").await;
    assert_eq!(o.out().split_whitespace().collect::<Vec<_>>(), ["NoNewPrivs:", "1"]);
    let o = h.run(process(&id, &["unshare", "-U", "true"]), b"").await.unwrap();
    assert_ne!(o.code(), Some(0), "unshare must be refused: {o:?}");
    let o = h.sh(&id, "mount -t tmpfs none /mnt").await;
    assert_ne!(o.code(), Some(0), "mount must be refused: {o:?}");
    // Threads and plain forks still work (clone without namespace flags).
    assert_eq!(h.sh(&id, "(echo sub) | cat").await.out(), "sub\n");
    let o = h.sh(&id, "ls /proc | grep -c '^[0-9]'").await;
    let procs: u32 = o.out().trim().parse().unwrap();
    assert!(procs < 10, "only the sandbox's own processes are visible: {procs}");
}
