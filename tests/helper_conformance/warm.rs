//! The warm launcher (a native helper's): the helper keeps one launcher
//! prepared ahead of the next start. A VM started in it gets its own limits
//! and network mode, and no launcher or cgroup of one outlives the helper.
//! These tests look at the helper's processes on this host, so they skip an
//! external helper.
use super::*;

/// A harness on a helper this test started (an external helper's processes
/// are not ours to inspect: the test is skipped, saying so).
async fn native_harness(name: &str) -> Option<Harness> {
    if !on_namespaces() {
        eprintln!("skipped: warm launchers are the namespace driver's");
        return None;
    }
    let h = Harness::new(name).await;
    if h.helper.is_none() {
        eprintln!("skipped: an external helper's processes are not ours to inspect");
        return None;
    }
    Some(h)
}

/// The helper's processes that are VM launchers (children of any of its
/// threads).
fn launchers(helper: u32) -> Vec<i32> {
    let tasks = std::fs::read_dir(format!("/proc/{helper}/task")).into_iter().flatten().flatten();
    let children: String =
        tasks.map(|t| std::fs::read_to_string(t.path().join("children")).unwrap_or_default() + " ").collect();
    children
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .filter(|pid: &i32| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.starts_with(b"sandbox-vm-init\0"))
        })
        .collect()
}

/// Whether `pid` has forked (a launcher's only child is its VM's PID 1).
fn has_child(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).is_ok_and(|c| !c.trim().is_empty())
}

/// The cgroup dirs `pid` is in (v1: one per hierarchy; v2: the unified one).
fn cgroup_dirs(pid: i32) -> Vec<PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let v2_root =
        if Path::new("/sys/fs/cgroup/unified").is_dir() { "/sys/fs/cgroup/unified" } else { "/sys/fs/cgroup" };
    text.lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            let root = if controllers.is_empty() {
                v2_root.to_string()
            } else {
                format!("/sys/fs/cgroup/{}", controllers.trim_start_matches("name="))
            };
            Some(PathBuf::from(format!("{root}{path}")))
        })
        .collect()
}

/// The helper's warm launcher: a launcher without a VM, once it is in its
/// cgroup (when the helper has cgroups). Waits (bounded) for one.
async fn warm_launcher(h: &mut Harness) -> Option<i32> {
    let helper = h.helper.as_ref()?.0.id();
    let cgroups = h.has_cgroups().await;
    let mut poll = Poll::every(Duration::from_millis(25));
    while poll.again().await {
        let warm = launchers(helper).into_iter().find(|&pid| {
            !has_child(pid)
                && (!cgroups
                    || std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|c| c.contains("/_launcher-")))
        });
        if warm.is_some() {
            return warm;
        }
    }
    None
}

#[tokio::test]
async fn vms_started_in_warm_launchers_get_their_own_limits_and_network() {
    let Some(mut h) = native_harness("warm").await else { return };
    let cgroups = h.has_cgroups().await;
    let egress = h.has_egress().await;
    let none = pb::NetworkMode::None as i32;
    let mut runs =
        vec![("a", none, 64u64 << 20), ("b", pb::NetworkMode::Egress as i32, 96 << 20), ("c", none, 128 << 20)];
    runs.retain(|r| egress || r.1 == none);
    for (name, network, memory) in runs {
        let warm = warm_launcher(&mut h).await.expect("the helper keeps a launcher ready");
        let id = h
            .running(name, |s| {
                s.network = network;
                s.memory_bytes = memory;
            })
            .await;
        assert!(has_child(warm), "{id} runs in the warm launcher {warm}");
        let dev = h.sh(&id, "cat /proc/net/dev").await.out();
        assert_eq!(dev.contains("eth0:"), network != none, "{id}: {dev}");
        if cgroups {
            let r = h.client.stats(pb::StatsRequest { vm_id: id.clone() }).await.unwrap().into_inner();
            assert_eq!(r.memory_limit_bytes, memory, "{id} has its own memory limit");
        }
    }
}

#[tokio::test]
async fn no_launcher_or_its_cgroup_outlives_the_helper() {
    let Some(mut h) = native_harness("warmexit").await else { return };
    // One VM, so a launcher was taken and the next one prepared.
    let id = h.running("vm", |_| {}).await;
    let vm_launcher = launchers(h.helper.as_ref().unwrap().0.id()).into_iter().find(|&p| has_child(p));
    let warm = warm_launcher(&mut h).await.expect("the helper keeps a launcher ready");
    let dirs =
        cgroup_dirs(warm).into_iter().filter(|d| d.to_string_lossy().contains("/_launcher-")).collect::<Vec<_>>();
    let cgroups = h.has_cgroups().await;
    assert_eq!(!dirs.is_empty(), cgroups, "the warm launcher has a cgroup exactly when the helper has cgroups");
    assert!(dirs.iter().all(|d| d.is_dir()), "{dirs:?}");
    assert!(!dirs.iter().any(|d| d.to_string_lossy().contains(&id)), "the warm launcher is in no vm's cgroup");
    drop(h.helper.take());
    for pid in [Some(warm), vm_launcher].into_iter().flatten() {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        assert!(!cmdline.starts_with(b"sandbox-vm-init\0"), "launcher {pid} outlived the helper");
    }
    for d in dirs {
        assert!(!d.exists(), "{} outlived the helper", d.display());
    }
}

#[tokio::test]
async fn a_start_after_the_warm_launcher_died_prepares_another() {
    let Some(mut h) = native_harness("warmdead").await else { return };
    let warm = warm_launcher(&mut h).await.expect("the helper keeps a launcher ready");
    // SAFETY: signalling a process of the helper under test.
    unsafe { libc::kill(warm, libc::SIGKILL) };
    let id = h.running("vm", |_| {}).await;
    assert_eq!(h.sh(&id, "echo alive").await.out(), "alive\n");
    assert!(!has_child(warm), "the dead launcher got no vm");
    assert!(warm_launcher(&mut h).await.is_some(), "and the helper prepares the next one");
}

#[tokio::test]
async fn back_to_back_starts_all_find_a_launcher_prepared_ahead() {
    let Some(mut h) = native_harness("warmb2b").await else { return };
    warm_launcher(&mut h).await.expect("the helper keeps a launcher ready");
    // No pause between the starts: the next launcher is prepared while each
    // start runs, not once it is over.
    for name in ["a", "b", "c"] {
        h.running(name, |_| {}).await;
    }
    if through_bridge() {
        // GetInfo counts the helper's own namespace driver's starts; through
        // the bridge the launchers are the layer's, and the seam carries no
        // counts (a Mac's layer has no launchers at all).
        eprintln!("skipped the (warm, cold) start counts: the layer across the bridge keeps its own");
        return;
    }
    let info = h.client.get_info(pb::GetInfoRequest {}).await.unwrap().into_inner();
    assert_eq!((info.warm_starts, info.cold_starts), (3, 0), "(warm, cold) starts");
}
