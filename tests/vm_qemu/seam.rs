//! The vm driver behind the helper's driver seam: it boots, execs,
//! snapshots and reports a kill, and refuses what it cannot do yet.
use super::*;

/// The vm driver behind the helper's seam: boots to a pinged agent, runs
/// Exec on the guest kernel, snapshots the writable layer, and reports a
/// kill through its exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_vm_driver_boots_execs_snapshots_and_reports_a_kill() {
    let Some(assets) = assets() else { return };
    let Some(layers) = test_image_layers() else { return };
    let dir = TempDir::new("seam");
    let driver = QemuDriver::with_assets(Ok(assets.clone())).with_warm(&dir.0, 0);
    assert_eq!(driver.unavailable_reason(), None);
    assert!(driver.capabilities().own_kernel);
    let vm = driver.boot(&seam_spec(&dir.0, layers, Vec::new())).await.expect("boot through the seam");
    let (code, release) = exec(&vm.connection(), &["uname", "-r"]).await;
    assert_eq!((code, release.trim()), (0, assets.release.as_str()));
    assert_eq!(exec(&vm.connection(), &["sh", "-c", "echo kept > /etc/kept"]).await.0, 0);
    let dst = dir.0.join("layer");
    let (snap_vm, snap_dst) = (vm.clone(), dst.clone());
    tokio::task::spawn_blocking(move || snap_vm.snapshot_layer(Path::new("/unused"), &snap_dst))
        .await
        .unwrap()
        .expect("snapshot the writable layer");
    assert_eq!(std::fs::read_to_string(dst.join("etc/kept")).unwrap(), "kept\n");
    let exit = vm.take_exit().expect("the exit, once");
    assert!(vm.take_exit().is_none());
    vm.kill();
    let how = tokio::time::timeout(Duration::from_secs(30), exit).await.expect("the exit resolves");
    assert!(how.starts_with("qemu was killed"), "{how}");
    vm.cleanup();
    // The template saved behind the boot is not left running.
    driver.warm().idle().await;
}

/// What the vm driver cannot do yet is refused before anything boots.
#[tokio::test]
async fn the_vm_driver_refuses_shares_other_than_workspace() {
    let Some(assets) = assets() else { return };
    let driver = QemuDriver::with_assets(Ok(assets));
    let dir = TempDir::new("refuse");
    let mount = BindMount { host: dir.0.clone(), guest: "/data".into(), read_only: true };
    let e = driver.boot(&seam_spec(&dir.0, Vec::new(), vec![mount])).await.unwrap_err().to_string();
    assert!(e.contains("only a writable /workspace, not /data"), "{e}");
    let unbuilt = QemuDriver::with_assets(Err("no vm kernel".into()));
    assert_eq!(unbuilt.unavailable_reason().as_deref(), Some("no vm kernel"));
}

/// A vm a dead helper left running (its qemu outlived the helper: one
/// started by an older build) is killed by the next helper's driver, and
/// its run dir removed; a vm of a live helper is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_helper_kills_the_vms_a_dead_one_left_and_no_other() {
    let Some(assets) = assets() else { return };
    let Some(layers) = test_image_layers() else { return };
    let dir = TempDir::new("leftover");
    let driver = QemuDriver::with_assets(Ok(assets.clone())).with_warm(&dir.0, 0);
    let vm = driver.boot(&seam_spec(&dir.0, layers, Vec::new())).await.expect("boot through the seam");
    let exit = vm.take_exit().expect("the exit");
    // Only the sandbox's vm runs: the template saved behind its boot is done.
    driver.warm().idle().await;
    let run_dirs = || -> Vec<PathBuf> {
        std::fs::read_dir(dir.0.join("run")).unwrap().flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect()
    };
    let [run_dir] = run_dirs().try_into().unwrap_or_else(|d| panic!("one run dir: {d:?}"));
    let record = run_dir.join(KEEPER_RECORD);
    let text = std::fs::read_to_string(&record).expect("qemu's record");
    // This process started it and runs: the vm stays.
    QemuDriver::with_assets(Ok(assets.clone())).with_warm(&dir.0, 0).kill_leftovers();
    assert_eq!(exec(&vm.connection(), &["true"]).await.0, 0, "a live helper's vm was killed");
    assert!(run_dir.is_dir());
    // The same vm, recorded as started by a helper that is gone.
    let mut gone = std::process::Command::new("true").spawn().unwrap();
    let dead = gone.id();
    gone.wait().unwrap();
    let [pid, start, ..] = text.split_whitespace().collect::<Vec<_>>()[..] else { panic!("{text}") };
    std::fs::write(&record, format!("{pid} {start} {dead} 1\n")).unwrap();
    QemuDriver::with_assets(Ok(assets)).with_warm(&dir.0, 0).kill_leftovers();
    let how = tokio::time::timeout(Duration::from_secs(30), exit).await.expect("qemu was killed");
    assert!(how.starts_with("qemu was killed"), "{how}");
    assert_eq!(run_dirs(), Vec::<PathBuf>::new(), "the dead helper's run dir is removed");
    vm.cleanup();
}
