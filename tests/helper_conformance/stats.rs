//! Stats: a running VM's resource usage moves with what runs inside it.
use super::*;

async fn stats(h: &mut Harness, id: &str) -> Result<pb::StatsResponse, tonic::Status> {
    let r = h.client.stats(pb::StatsRequest { vm_id: id.into() }).await?;
    Ok(r.into_inner())
}

#[tokio::test]
async fn stats_follow_memory_pids_cpu_and_time() {
    let mut h = Harness::new("stats").await;
    let cgroups = h.has_cgroups().await;
    let id = h
        .running("vm", |s| {
            s.memory_bytes = 256 << 20;
            s.pids_limit = 77;
        })
        .await;
    let first = stats(&mut h, &id).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let alloc = "python3 -c 'import time; x = bytearray(64 << 20); time.sleep(1000)' >/dev/null 2>&1 &
                 sleep 1000 >/dev/null 2>&1 &
                 python3 -c 'sum(range(3000000))'";
    assert_eq!(h.sh(&id, alloc).await.code(), Some(0));
    let mut now = stats(&mut h, &id).await.unwrap();
    assert!(now.uptime_ms > first.uptime_ms, "{first:?} then {now:?}");
    // Limits are enforced exactly when the helper has cgroups; otherwise it says why not.
    assert_eq!(now.limits_not_enforced.is_empty(), cgroups, "{now:?}");
    let vm = h.get(&id).await.unwrap();
    assert_eq!(vm.limits_not_enforced, now.limits_not_enforced, "GetVm and Stats agree");
    if !cgroups {
        eprintln!("skipped the cgroup counters: the driver under test has no cgroups");
        return;
    }
    let mut poll = Poll::every(Duration::from_millis(20));
    while now.memory_used_bytes < 64 << 20 && poll.again().await {
        now = stats(&mut h, &id).await.unwrap();
    }
    assert!(now.memory_used_bytes >= 64 << 20, "{now:?}");
    assert_eq!(now.memory_limit_bytes, 256 << 20);
    assert!(now.pids >= first.pids + 2, "{first:?} then {now:?}");
    assert_eq!(now.pids_limit, 77);
    assert!(now.cpu_usage_ns > first.cpu_usage_ns, "{first:?} then {now:?}");
    assert!(!now.oom_killed);
    assert_eq!((now.net_rx_bytes, now.net_tx_bytes), (0, 0), "network NONE");
}

#[tokio::test]
async fn stats_report_oom_kills() {
    let mut h = Harness::new("statsoom").await;
    if !h.has_cgroups().await {
        eprintln!("skipped: the driver under test has no cgroups");
        return;
    }
    let id = h.running("vm", |s| s.memory_bytes = 64 << 20).await;
    let o = h.sh(&id, "python3 -c \"x = b'a' * (300 << 20)\" 2>/dev/null; echo done").await;
    assert_eq!(o.out(), "done\n");
    assert!(stats(&mut h, &id).await.unwrap().oom_killed);
}

#[tokio::test]
async fn stats_count_egress_traffic() {
    let mut h = Harness::new("statsnet").await;
    if !h.has_egress().await {
        eprintln!("skipped: the driver under test lacks network.egress");
        return;
    }
    let id = h.running("vm", |s| s.network = pb::NetworkMode::Egress as i32).await;
    // A private address: the policy refuses the datagrams in the helper's
    // stack (nothing reaches a network), yet they left the sandbox's eth0.
    let send = "python3 -c \"import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); \
                [s.sendto(b'x' * 500, ('10.255.255.1', 9)) for _ in range(10)]\"";
    assert_eq!(h.sh(&id, send).await.code(), Some(0));
    let now = stats(&mut h, &id).await.unwrap();
    assert!(now.net_tx_bytes >= 5000, "{now:?}");
}

#[tokio::test]
async fn stats_need_a_running_vm() {
    let mut h = Harness::new("statsst").await;
    let e = stats(&mut h, "no-such-vm").await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    let spec = h.spec("vm");
    let id = spec.id.clone();
    h.create(spec).await.unwrap();
    let e = stats(&mut h, &id).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e}");
}

#[tokio::test]
async fn a_process_refused_at_the_task_limit_names_it() {
    let mut h = Harness::new("statspids").await;
    // A vm's agent starts its processes from outside the guest's group, so
    // the limit refuses their children, not the start itself.
    if !on_namespaces() || !h.has_cgroups().await {
        eprintln!("skipped: the start itself meets the task limit on the namespace driver with cgroups only");
        return;
    }
    // The bridge carries no cgroup counters, and the guest's own count
    // misses the tasks outside its pid namespace.
    if through_bridge() {
        eprintln!("skipped: across the bridge the task count is the guest's, short of the cgroup's");
        return;
    }
    let id = h.running("vm", |s| s.pids_limit = 24).await;
    // Keeps the group full for a minute, taking every slot that frees.
    let fill = format!(
        "cat > /tmp/fill.py <<'EOF'\n{}EOF\nnohup python3 /tmp/fill.py >/dev/null 2>&1 &",
        include_str!("../fixtures/fill_pids.py")
    );
    assert_eq!(h.sh(&id, &fill).await.code(), Some(0));
    let mut poll = Poll::every(Duration::from_millis(50));
    while stats(&mut h, &id).await.unwrap().pids < 24 && poll.again().await {}
    let e = h.run(process(&id, &["true"]), b"").await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e}");
    assert!(e.message().contains("the sandbox is at its process limit (pids = "), "{e}");
    assert!(e.message().contains(" of 24)"), "{e}");
}
