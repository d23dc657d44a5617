//! Memory snapshots and the pool of restored vms: restores are reseeded,
//! clocked and their own, the pool refills, its vms wait in limited cgroups,
//! and templates or state files that do not fit are not restored.
use super::*;
use sandbox_helper::driver::qemu::template::{Template, ram_of};

async fn sh(vm: &VmInstance, script: &str) -> String {
    let (code, out) = exec(&vm.connection(), &["sh", "-c", script]).await;
    assert_eq!(code, 0, "{script}: {out}");
    out
}

/// The guest's wall clock is the host's, within a few seconds.
async fn assert_clock_is_the_hosts(vm: &VmInstance) {
    let guest: i64 = sh(vm, "date +%s").await.trim().parse().unwrap();
    let host = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    assert!((guest - host).abs() <= 5, "guest clock {guest} vs host {host}");
}

/// `/workspace` is this sandbox's volume, both ways, and the writable
/// layer is its own: what other vms wrote is not there.
async fn assert_own_volume_and_layer(vm: &VmInstance, workspace: &Path, name: &str) {
    std::fs::write(workspace.join("host.txt"), format!("for {name}\n")).unwrap();
    assert_eq!(sh(vm, "cat /workspace/host.txt").await, format!("for {name}\n"));
    sh(vm, &format!("echo from {name} > /workspace/guest.txt")).await;
    assert_eq!(std::fs::read_to_string(workspace.join("guest.txt")).unwrap(), format!("from {name}\n"));
    assert_eq!(sh(vm, "ls /etc/written-by-* 2>/dev/null || true").await, "", "another vm's writable layer");
    sh(vm, &format!("echo {name} > /etc/written-by-{name}")).await;
}

/// Two vms restored from one memory snapshot: each reseeded (different
/// random uuids and boot ids), each with the host's clock, each with its
/// own `/workspace` and writable layer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restores_from_one_snapshot_are_reseeded_clocked_and_their_own() {
    let Some(assets) = assets() else { return };
    let Some(layers) = test_image_layers() else { return };
    let mapper = IdMapper::detect().expect("an id map (host-setup)");
    let dir = TempDir::new("restore");
    let driver = warm_driver(&assets, &dir.0, 0);
    let (spec, ws) = sandbox(&dir.0, "cold", &layers, &mapper);
    let cold = driver.boot_vm(&spec).await.expect("a cold boot");
    assert!(
        matches!(cold.origin(), Origin::Cold { reason } if reason.contains("no memory snapshot")),
        "{:?}",
        cold.origin()
    );
    assert_own_volume_and_layer(&cold, &ws, "cold").await;
    cold.kill();
    cold.cleanup();
    driver.warm().idle().await;
    let template = driver.warm().template(&seam_shape(&driver, &assets, &layers, &mapper).await);
    let saved = digest_of(&[template.state(), ram_of(&template.state())]);
    // The snapshot's own clock stands still while it is saved: let it fall
    // behind the host's, so a restore that did not set the clock shows.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let mut seen = Vec::new();
    for name in ["first", "second"] {
        let (spec, ws) = sandbox(&dir.0, name, &layers, &mapper);
        let vm = driver.boot_vm(&spec).await.expect("a restore");
        assert_eq!(vm.origin(), &Origin::Snapshot);
        let ids = sh(&vm, "cat /proc/sys/kernel/random/uuid /proc/sys/kernel/random/boot_id").await;
        assert_clock_is_the_hosts(&vm).await;
        assert_own_volume_and_layer(&vm, &ws, name).await;
        assert_eq!(sh(&vm, "hostname").await.trim(), "seam");
        // The attacker in the first restore fills RAM (a RAM-backed file,
        // a process) with its marks; the second restore starts from the
        // template, not from what the first one wrote.
        let marks = "ls /dev/shm/poison 2>/dev/null; grep -l poison-mark[e]r /proc/[0-9]*/cmdline 2>/dev/null; true";
        assert_eq!(sh(&vm, marks).await, "", "{name}: another restore's RAM");
        sh(&vm, "mkdir -p /dev/shm && head -c 8388608 /dev/zero | tr '\\0' p > /dev/shm/poison && (setsid python3 -c 'import time; time.sleep(1000)' poison-marker >/dev/null 2>&1 &)").await;
        assert_ne!(sh(&vm, marks).await, "", "{name}: the marks were made");
        vm.kill();
        vm.cleanup();
        seen.push(ids);
    }
    let (a, b): (Vec<&str>, Vec<&str>) = (seen[0].lines().collect(), seen[1].lines().collect());
    assert_ne!(a[0], b[0], "random uuids after two restores of one snapshot");
    assert_ne!(a[1], b[1], "boot ids after two restores of one snapshot");
    assert_eq!(digest_of(&[template.state(), ram_of(&template.state())]), saved, "the restores changed their template");
    driver.release().await;
}

/// A digest of the files' bytes, to see that none of them changed.
fn digest_of(files: &[PathBuf]) -> u64 {
    use std::hash::Hasher as _;
    use std::io::Read as _;
    let mut hasher = std::hash::DefaultHasher::new();
    for file in files {
        let mut f = std::fs::File::open(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = f.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            hasher.write(&buf[..n]);
        }
    }
    hasher.finish()
}

/// With a pool, the next boot takes a restored vm from it and the pool
/// fills again behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_vm_serves_the_next_boot_and_the_pool_refills() {
    let Some(assets) = assets() else { return };
    let Some(layers) = test_image_layers() else { return };
    let mapper = IdMapper::detect().expect("an id map (host-setup)");
    let dir = TempDir::new("pool");
    let driver = warm_driver(&assets, &dir.0, 1);
    let (spec, _) = sandbox(&dir.0, "cold", &layers, &mapper);
    let cold = driver.boot_vm(&spec).await.expect("a cold boot");
    cold.kill();
    cold.cleanup();
    driver.warm().idle().await;
    let shape = seam_shape(&driver, &assets, &layers, &mapper).await;
    assert_eq!(driver.warm().ready(&shape), 1, "the pool filled behind the cold boot");
    let (spec, ws) = sandbox(&dir.0, "pooled", &layers, &mapper);
    let vm = driver.boot_vm(&spec).await.expect("a boot from the pool");
    assert_eq!(vm.origin(), &Origin::Pool);
    assert_own_volume_and_layer(&vm, &ws, "pooled").await;
    assert_clock_is_the_hosts(&vm).await;
    vm.kill();
    vm.cleanup();
    driver.warm().idle().await;
    assert_eq!(driver.warm().ready(&shape), 1, "the pool refilled");
    driver.release().await;
    assert_eq!(driver.warm().ready(&shape), 0, "release kills the idle vms");
    // A helper that starts fills the pools of the shapes it has templates of.
    let restarted = warm_driver(&assets, &dir.0, 1);
    restarted.keep_warm();
    restarted.warm().idle().await;
    assert_eq!(restarted.warm().ready(&shape), 1, "keep_warm fills the pool from the saved template");
    restarted.release().await;
}

/// The last component of `pid`'s cgroup (v2, or v1's memory hierarchy).
fn cgroup_of(pid: u32) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let line = text.lines().find(|l| l.starts_with("0::") || l.contains(":memory:")).unwrap_or_default();
    line.rsplit('/').next().unwrap_or_default().to_string()
}

/// The qemu of the pool vms waiting in a group of their own (only a driver
/// with cgroups gives them one), with that group.
fn pooled_qemus() -> Vec<(u32, String)> {
    let pids = std::fs::read_dir("/proc").unwrap().flatten().filter_map(|e| e.file_name().to_str()?.parse().ok());
    pids.filter(|pid: &u32| {
        std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| String::from_utf8_lossy(&c).contains("qemu-system"))
    })
    .map(|pid| (pid, cgroup_of(pid)))
    .filter(|(_, group)| group.starts_with(&format!("pool-{}-", std::process::id())))
    .collect()
}

/// A pool vm waits in a cgroup of its own with a cold vm's limits for its
/// shape (its memory plus qemu's overhead), not in the helper's unlimited
/// one; handed out, its qemu runs in its sandbox's cgroup and the pool's
/// group is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_vms_wait_in_limited_cgroups_and_run_in_their_sandboxs() {
    let Some(assets) = assets() else { return };
    let Some(layers) = test_image_layers() else { return };
    let layout = match CgroupLayout::detect() {
        Ok(layout) => layout,
        Err(e) => {
            eprintln!("SKIP: no cgroup limits here ({e})");
            return;
        }
    };
    let mapper = IdMapper::detect().expect("an id map (host-setup)");
    let dir = TempDir::new("poolcg");
    let driver = warm_driver(&assets, &dir.0, 1).with_cgroups(Ok(layout.clone()));
    let (spec, _) = sandbox(&dir.0, "cg-cold", &layers, &mapper);
    let cold = driver.boot_vm(&spec).await.expect("a cold boot");
    cold.kill();
    cold.cleanup();
    driver.warm().idle().await;
    let waiting = pooled_qemus();
    let [(pid, group)] = waiting.as_slice() else { panic!("one pool vm in a group of its own: {waiting:?}") };
    let memory = match &layout {
        CgroupLayout::V2 { base } => base.join(group).join("memory.max"),
        CgroupLayout::V1 { memory, .. } => memory.join(group).join("memory.limit_in_bytes"),
    };
    let limit: u64 = std::fs::read_to_string(&memory).unwrap().trim().parse().unwrap();
    assert_eq!(limit, (512 << 20) + (1 << 30), "{}", memory.display());
    let (spec, _) = sandbox(&dir.0, "cg-pooled", &layers, &mapper);
    let vm = driver.boot_vm(&spec).await.expect("a boot from the pool");
    assert_eq!(vm.origin(), &Origin::Pool);
    assert_eq!(cgroup_of(*pid), spec.id, "the pooled qemu runs in its sandbox's cgroup");
    assert!(!memory.exists(), "the pool's group of the vm handed out is removed");
    vm.kill();
    vm.cleanup();
    driver.warm().idle().await;
    driver.release().await;
}

/// Templates this helper cannot use go at its start (`keep_warm`), ones it
/// can stay.
#[tokio::test]
async fn keep_warm_removes_templates_of_another_helper_build() {
    let Some(assets) = assets() else { return };
    let dir = TempDir::new("gc");
    let driver = warm_driver(&assets, &dir.0, 0);
    let stale = dir.0.join("templates/0123456789abcdef01234567");
    std::fs::create_dir_all(&stale).unwrap();
    let shape = Shape {
        kernel: assets.kernel.clone(),
        initramfs: dir.0.join("initramfs-of-an-older-build.cpio.gz"),
        accel: tcg(),
        layers: Vec::new(),
        cpus: 1,
        memory_mib: 512,
        network: false,
    };
    std::fs::write(stale.join("shape.json"), serde_json::to_vec(&shape).unwrap()).unwrap();
    std::fs::write(stale.join("vm.state"), b"state").unwrap();
    driver.keep_warm();
    assert!(!stale.exists(), "the other build's template is removed");
    assert!(dir.0.join("templates").is_dir());
}

/// A state file that is stale (another kernel, helper or image) or corrupt,
/// or a RAM file cut short, is not restored: the vm boots cold and says
/// why, and a corrupt one is discarded to be saved anew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_or_corrupt_state_file_falls_back_to_a_cold_boot() {
    let Some(assets) = assets() else { return };
    let Some(layers) = test_image_layers() else { return };
    let mapper = IdMapper::detect().expect("an id map (host-setup)");
    let dir = TempDir::new("stale");
    let driver = warm_driver(&assets, &dir.0, 0);
    let shape = seam_shape(&driver, &assets, &layers, &mapper).await;
    let template = driver.warm().template(&shape);
    std::fs::create_dir_all(template.state().parent().unwrap()).unwrap();
    std::fs::write(template.state(), b"not a vm state").unwrap();
    std::fs::write(template.key_file(), "an older kernel's key").unwrap();
    let stale = |reason: &str| reason.contains("stale");
    boots_cold_and_renews(&driver, &template, &dir.0, "stale", &layers, &mapper, stale).await;
    std::fs::write(template.state(), b"corrupt").unwrap();
    let cold = |reason: &str| reason.contains("restoring") && reason.contains("failed");
    boots_cold_and_renews(&driver, &template, &dir.0, "corrupt", &layers, &mapper, cold).await;
    // A RAM file cut short (a disk that filled while it was written) is
    // refused by its size.
    let ram = ram_of(&template.state());
    std::fs::File::options().write(true).open(&ram).unwrap().set_len(1 << 20).unwrap();
    let short = |reason: &str| reason.contains("holds 1048576 bytes of RAM");
    boots_cold_and_renews(&driver, &template, &dir.0, "short", &layers, &mapper, short).await;
    assert_eq!(std::fs::metadata(&ram).unwrap().len(), shape.memory_mib << 20);
    driver.release().await;
}

/// The next boot, of a sandbox named `name`, is cold for a reason `why`
/// accepts and is its own; the template is saved anew behind it.
async fn boots_cold_and_renews(
    driver: &QemuDriver,
    template: &Template,
    dir: &Path,
    name: &str,
    layers: &[PathBuf],
    mapper: &IdMapper,
    why: impl Fn(&str) -> bool,
) {
    let (spec, ws) = sandbox(dir, name, layers, mapper);
    let vm = driver.boot_vm(&spec).await.expect("a cold boot");
    match vm.origin() {
        Origin::Cold { reason } => assert!(why(reason), "{name}: {reason}"),
        other => panic!("{name}: {other:?}"),
    }
    assert_own_volume_and_layer(&vm, &ws, name).await;
    vm.kill();
    vm.cleanup();
    driver.warm().idle().await;
    assert!(template.current().is_some(), "{name}: the template was saved anew");
}
