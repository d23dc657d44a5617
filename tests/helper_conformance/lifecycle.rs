//! A VM's life through the contract: the helper describes itself and its
//! drivers, a VM is created, started, stopped, restarted and deleted (its
//! files with it), unknown names and malformed specs are refused, and a VM
//! whose processes will not stop or whose agent dies is reported stopped.
use super::*;

#[tokio::test]
async fn get_info_describes_the_helper() {
    let mut h = Harness::new("info").await;
    let info = h.client.get_info(pb::GetInfoRequest {}).await.unwrap().into_inner();
    assert!(!info.platform.is_empty() && !info.driver.is_empty() && !info.version.is_empty());
    assert!(info.capabilities.iter().any(|c| c == "exec"), "{:?}", info.capabilities);
    if h.helper.is_some() {
        assert_eq!((info.platform.as_str(), info.driver.as_str()), ("linux", "namespaces"));
        for cap in ["seccomp", "userns", "network.none"] {
            assert!(info.capabilities.iter().any(|c| c == cap), "missing {cap}: {:?}", info.capabilities);
        }
    }
    let images = h.client.list_images(pb::ListImagesRequest {}).await.unwrap().into_inner().images;
    let image = images.iter().find(|i| i.name == h.image).expect("test image listed");
    assert!(!image.shell.is_empty());
}

#[tokio::test]
async fn get_info_lists_every_driver_with_typed_capabilities() {
    let mut h = Harness::new("drivers").await;
    let info = h.client.get_info(pb::GetInfoRequest {}).await.unwrap().into_inner();
    let defaults: Vec<_> = info.drivers.iter().filter(|d| d.is_default).collect();
    assert_eq!(defaults.len(), 1, "exactly one default driver: {:?}", info.drivers);
    let default = defaults[0];
    assert_eq!(default.name, info.driver, "the default driver is the one `driver` names");
    for d in &info.drivers {
        assert_eq!(d.usable, d.unavailable_reason.is_empty(), "a reason exactly when unusable: {d:?}");
        assert!(d.capabilities.is_some(), "{d:?}");
    }
    // The flat names agree with the default driver's typed capabilities.
    let caps = default.capabilities.clone().unwrap();
    let named = |n: &str| info.capabilities.iter().any(|c| c == n);
    assert_eq!(caps.tty, named("exec.tty"), "{info:?}");
    assert_eq!(caps.network_egress, named("network.egress"), "{info:?}");
    assert_eq!(caps.seccomp, named("seccomp"), "{info:?}");
    assert_eq!(caps.limits, info.capabilities.iter().any(|c| c.starts_with("cgroups.")), "{info:?}");
    if h.helper.is_some() {
        assert_eq!(default.name, "namespaces");
        assert!(default.usable && caps.dial && caps.snapshot && !caps.own_kernel, "{default:?}");
    }
}

#[tokio::test]
async fn a_vm_runs_on_the_driver_it_names() {
    let mut h = Harness::new("drv").await;
    let info = h.client.get_info(pb::GetInfoRequest {}).await.unwrap().into_inner();
    let mut plain = h.spec("plain");
    plain.driver = String::new();
    let vm = h.create(plain).await.unwrap();
    assert_eq!(vm.spec.unwrap().driver, info.driver, "an empty driver is the default one");
    let err = {
        let mut spec = h.spec("odd");
        spec.driver = "gvisor".into();
        h.create(spec).await.unwrap_err()
    };
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    for d in &info.drivers {
        assert!(err.message().contains(&d.name), "the error lists the drivers: {}", err.message());
    }
    for d in info.drivers.iter().filter(|d| !d.is_default) {
        let mut spec = h.spec(&format!("on-{}", d.name));
        spec.driver = d.name.clone();
        let id = spec.id.clone();
        match h.create(spec).await {
            Ok(vm) => {
                assert!(d.usable, "{d:?}");
                assert_eq!(vm.spec.unwrap().driver, d.name);
                assert_eq!(h.get(&id).await.unwrap().spec.unwrap().driver, d.name, "GetVm reports the driver");
                h.delete(&id).await.unwrap();
            }
            Err(e) => {
                assert!(!d.usable, "{d:?}: {e:?}");
                assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
                let want = format!("the {} driver is not usable here: {}", d.name, d.unavailable_reason);
                assert_eq!(e.message(), want);
            }
        }
    }
}

#[tokio::test]
async fn lifecycle_create_start_stop_restart_delete() {
    let mut h = Harness::new("life").await;
    let mut spec = h.spec("vm");
    spec.labels = HashMap::from([("owner".into(), "test".into())]);
    let id = spec.id.clone();
    let vm = h.create(spec).await.unwrap();
    assert_eq!(vm.state, pb::VmState::Created as i32);
    assert_eq!(vm.started_at_ms, 0);
    let s = vm.spec.unwrap();
    assert_eq!((s.cpus, s.memory_bytes, s.pids_limit), (1, 512 << 20, 1024), "defaults");
    assert_eq!(s.hostname, id);
    assert_eq!(s.labels.get("owner").map(String::as_str), Some("test"));
    assert!(
        h.client.list_vms(pb::ListVmsRequest {}).await.unwrap().into_inner().vms.iter().any(|v| v
            .spec
            .as_ref()
            .unwrap()
            .id
            == id)
    );

    let err = h.create(h.spec("vm")).await.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists);
    assert_eq!(h.stop(&id).await.unwrap_err().code(), Code::FailedPrecondition);
    let exec_err = h.run(process(&id, &["true"]), b"").await.unwrap_err();
    assert_eq!(exec_err.code(), Code::FailedPrecondition);

    let vm = h.start(&id).await.unwrap();
    assert_eq!(vm.state, pb::VmState::Running as i32);
    assert!(vm.started_at_ms > 0);
    assert_eq!(h.start(&id).await.unwrap_err().code(), Code::FailedPrecondition);
    // Exec works as soon as StartVm returned.
    assert_eq!(h.sh(&id, "echo kept > /root/state").await.code(), Some(0));

    let vm = h.stop(&id).await.unwrap();
    assert_eq!(vm.state, pb::VmState::Stopped as i32);
    assert!(vm.stop_reason.is_empty(), "requested stop has no reason: {}", vm.stop_reason);
    assert_eq!(h.get(&id).await.unwrap().state, pb::VmState::Stopped as i32);
    assert_eq!(h.stop(&id).await.unwrap_err().code(), Code::FailedPrecondition);

    h.start(&id).await.unwrap();
    assert_eq!(h.sh(&id, "cat /root/state").await.out(), "kept\n", "writable layer survives a stop");

    h.delete(&id).await.unwrap();
    assert_eq!(h.get(&id).await.unwrap_err().code(), Code::NotFound);
    assert_eq!(h.delete(&id).await.unwrap_err().code(), Code::NotFound);
}

#[tokio::test]
async fn a_delete_completes_when_its_client_goes_away() {
    let mut h = Harness::new("gone").await;
    let id = h.running("vm", |_| {}).await;
    // A writable layer of many files keeps the delete busy for a while, so
    // the client usually hangs up halfway through it.
    assert_eq!(h.sh(&id, "mkdir /many && cd /many && seq 1 20000 | xargs touch").await.code(), Some(0));
    let mut client = h.client.clone();
    let delete = client.delete_vm(pb::DeleteVmRequest { id: id.clone() });
    let _ = tokio::time::timeout(Duration::from_millis(20), delete).await;
    let mut gone = false;
    let mut poll = Poll::every(Duration::from_millis(50));
    while !gone && poll.again().await {
        gone = h.get(&id).await.is_err_and(|e| e.code() == Code::NotFound);
    }
    assert!(gone, "the VM of an abandoned DeleteVm is still registered");
}

#[tokio::test]
async fn unknown_vms_and_images_are_not_found() {
    let mut h = Harness::new("nf").await;
    let id = h.id("ghost");
    assert_eq!(h.start(&id).await.unwrap_err().code(), Code::NotFound);
    assert_eq!(h.stop(&id).await.unwrap_err().code(), Code::NotFound);
    assert_eq!(h.get(&id).await.unwrap_err().code(), Code::NotFound);
    assert_eq!(h.delete(&id).await.unwrap_err().code(), Code::NotFound);
    assert_eq!(h.run(process(&id, &["true"]), b"").await.unwrap_err().code(), Code::NotFound);
    let mut spec = h.spec("img");
    spec.image = "no-such-image".into();
    assert_eq!(h.create(spec).await.unwrap_err().code(), Code::NotFound);
}

#[tokio::test]
async fn malformed_specs_are_invalid_arguments() {
    let mut h = Harness::new("inval").await;
    let missing = h.tmp.0.join("missing");
    let file = h.tmp.0.join("file");
    std::fs::write(&file, "x").unwrap();
    type Tweak = Box<dyn Fn(&mut pb::VmSpec)>;
    let cases: Vec<(&str, Tweak)> = vec![
        ("id", Box::new(|s| s.id = "-bad/id".into())),
        ("id", Box::new(|s| s.id = String::new())),
        ("host_path", Box::new(|s| s.mounts = vec![mount("relative/dir", "/w")])),
        ("host_path", Box::new(move |s| s.mounts = vec![mount(missing.to_str().unwrap(), "/w")])),
        ("host_path", Box::new(move |s| s.mounts = vec![mount(file.to_str().unwrap(), "/w")])),
        ("guest_path", Box::new(|s| s.mounts = vec![mount("/tmp", "relative")])),
        ("network", Box::new(|s| s.network = 99)),
        ("spec.driver", Box::new(|s| s.driver = "gvisor".into())),
    ];
    for (field, tweak) in cases {
        let mut spec = h.spec("bad");
        tweak(&mut spec);
        let err = h.create(spec).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{field}: {err:?}");
        assert!(err.message().contains(field), "message names {field}: {}", err.message());
    }
    assert_eq!(h.client.create_vm(pb::CreateVmRequest { spec: None }).await.unwrap_err().code(), Code::InvalidArgument);
}
/// Files the VM's other ids keep private (apt's `_apt`, a service user)
/// are the helper's to remove with the VM: for an ordinary user's helper
/// they belong to subordinate ids the user cannot touch outside the VM's
/// user namespace.
#[tokio::test]
async fn delete_removes_files_of_every_id_in_the_vm() {
    let mut h = Harness::new("delids").await;
    let id = h.running("vm", |_| {}).await;
    let o = h
        .sh(
            &id,
            "mkdir -p /var/tmp/p/q && echo x > /var/tmp/p/q/f && chown -R 42:42 /var/tmp/p && chmod -R go= /var/tmp/p",
        )
        .await;
    assert_eq!(o.code(), Some(0), "{}", o.err());
    // The VM dir is under the state dir of a helper this test started; an
    // external helper's is its own (the delete must still succeed).
    let dir = h.helper.is_some().then(|| h.tmp.0.join("state/sandbox-mcp/vms").join(&id));
    // Namespaces keep the writable layer as a host dir; a vm keeps it in a
    // disk file in the same VM dir.
    if let Some(dir) = &dir {
        assert!(if on_namespaces() { dir.join("upper/var/tmp/p").exists() } else { dir.exists() });
    }
    h.delete(&id).await.expect("delete a vm holding files of another id");
    if let Some(dir) = &dir {
        assert!(!dir.exists(), "the vm's directory is gone");
    }
}
#[tokio::test]
async fn stop_kills_processes_that_ignore_term_after_the_grace() {
    let mut h = Harness::new("grace").await;
    let id = h.running("vm", |_| {}).await;
    let o = h.sh(&id, "(trap '' TERM; exec sleep 1000) >/dev/null 2>&1 & echo started").await;
    assert_eq!(o.out(), "started\n");
    let r = h.client.stop_vm(pb::StopVmRequest { id: id.clone(), grace_ms: 100 }).await.unwrap().into_inner();
    assert_eq!(r.vm.unwrap().state, pb::VmState::Stopped as i32);
    h.start(&id).await.unwrap();
    assert_eq!(h.sh(&id, "echo back").await.out(), "back\n");
}

#[tokio::test]
async fn a_vm_whose_agent_dies_is_reported_stopped_with_a_reason() {
    let mut h = Harness::new("death").await;
    if h.helper.is_none() {
        eprintln!("skipped: kills the agent, only on a helper this test started");
        return;
    }
    let id = h.running("vm", |_| {}).await;
    // The agent spawns every process: the shell's parent is the agent, on
    // every driver (PID 2 under namespaces, a child of guest-init in a VM).
    let _ = h.run(process(&id, &["sh", "-c", "kill -9 $PPID"]), b"").await;
    let mut vm = h.get(&id).await.unwrap();
    let mut poll = Poll::every(Duration::from_millis(20));
    while vm.state != pb::VmState::Stopped as i32 && poll.again().await {
        vm = h.get(&id).await.unwrap();
    }
    assert_eq!(vm.state, pb::VmState::Stopped as i32);
    assert!(!vm.stop_reason.is_empty());
    assert_eq!(h.run(process(&id, &["true"]), b"").await.unwrap_err().code(), Code::FailedPrecondition);
    h.start(&id).await.unwrap();
    assert_eq!(h.sh(&id, "echo again").await.out(), "again\n");
}
