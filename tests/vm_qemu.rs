//! The `vm` driver's qemu side on real microVMs: the boot probe, a full
//! boot of the test image, and a killed qemu. TCG is slow, so each test
//! boots at most one vm.
//!
//! Needs qemu (`make vm` installs it) and the kernel and initramfs built
//! for `SANDBOX_VM_HELPER_BIN` in `SANDBOX_MCP_VM_DIR` (`make vm`; the test
//! setup builds them). Without qemu or the kernel each test says why and
//! passes; with the kernel but no initramfs for this very binary (built
//! after `make vm`) it fails, since it would otherwise never run.
use std::path::{Path, PathBuf};
use std::time::Duration;

use sandbox_mcp::agent::mux::Mux;
use sandbox_mcp::agent::protocol::{ExitStatus, Frame, StartSpec};
use sandbox_mcp::helper::driver::cgroup::CgroupLayout;
use sandbox_mcp::helper::driver::qemu::assets::{Assets, build_id, vm_dir};
use sandbox_mcp::helper::driver::qemu::driver::{Origin, QemuDriver, VmInstance};
use sandbox_mcp::helper::driver::qemu::instance::{BootSpec, Instance, Shape};
use sandbox_mcp::helper::driver::qemu::{Accel, disks, probe, snapshot};
use sandbox_mcp::helper::driver::{BindMount, BootSpec as SeamBootSpec, Driver as _, Egress, Instance as _, Limits};
use sandbox_mcp::helper::userns::IdMapper;

/// A directory removed on drop; short, for socket paths.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let p = PathBuf::from(format!("/tmp/smcp-q{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The assets for the helper binary under test, or why the test skips.
fn assets() -> Option<Assets> {
    let helper = std::env::var_os("SANDBOX_VM_HELPER_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/debug/sandbox-vm-helper"));
    if std::process::Command::new(sandbox_mcp::helper::driver::qemu::QEMU).arg("--version").output().is_err() {
        eprintln!("SKIP: qemu-system-x86_64 is not installed (make vm)");
        return None;
    }
    if !vm_dir().join("vmlinux").is_file() {
        eprintln!("SKIP: no vm kernel in {} (make vm)", vm_dir().display());
        return None;
    }
    let id = build_id(&helper).expect("read the helper's build id").expect("the helper has a build id");
    match Assets::locate(&vm_dir(), &id) {
        Ok(a) => Some(a),
        Err(e) => panic!("{e} (for {})", helper.display()),
    }
}

/// A `/workspace` volume under `dir`, owned by the sandbox's root as the
/// helper's id map places it on the host.
fn workspace_dir(dir: &Path, mapper: &IdMapper) -> PathBuf {
    let workspace = dir.join("ws");
    std::fs::create_dir(&workspace).unwrap();
    let (uid, gid) = mapper.id_map().host_root();
    nix::unistd::chown(&workspace, Some(uid.into()), Some(gid.into())).unwrap();
    workspace
}

/// A boot of one cpu and 512 MiB from the layer disks and writable disk
/// in `disks`, its run directory under `dir`.
fn boot_spec<'a>(
    hostname: &'a str,
    dir: &Path,
    assets: &'a Assets,
    accel: &'a Accel,
    mapper: &'a IdMapper,
    disks: (Vec<PathBuf>, PathBuf),
    workspace: Option<PathBuf>,
) -> BootSpec<'a> {
    BootSpec {
        hostname,
        run_dir: dir.join("run"),
        assets,
        accel,
        layers: disks.0,
        upper: disks.1,
        workspace,
        cpus: 1,
        memory_mib: 512,
        mapper,
        cgroup: None,
        network: false,
    }
}

fn tcg() -> Accel {
    Accel::Tcg { kvm_unusable: "not probed by this test".into() }
}

#[tokio::test]
async fn boot_probe_reaches_guest_init_under_tcg() {
    let Some(assets) = assets() else { return };
    let dir = TempDir::new("probe");
    probe::boot_probe(&assets, &dir.0, &tcg(), Duration::from_secs(120)).await.expect("the probe vm answers under TCG");
}

/// On this project's hosts (kvm_pvm) KVM must come out unusable, with the
/// reason; where KVM does boot our kernel, the probe vm answered under it.
#[tokio::test]
async fn kvm_probe_says_why_kvm_is_unusable() {
    let Some(assets) = assets() else { return };
    let dir = TempDir::new("kvm");
    match probe::detect(&assets, &dir.0).await {
        Accel::Kvm => eprintln!("KVM boots the guest kernel on this host"),
        Accel::Tcg { kvm_unusable } => {
            eprintln!("KVM unusable: {kvm_unusable}");
            assert!(
                kvm_unusable.starts_with("/dev/kvm: ") || kvm_unusable.contains("under KVM"),
                "the reason names the device or the failed KVM boot: {kvm_unusable}"
            );
        }
    }
    // The probe vm is gone with its sockets.
    assert!(!dir.0.join("probe.sock").exists());
}

/// The test image's layers as disks and a fresh writable disk.
fn disks_for_test_image(run: &Path, mapper: &IdMapper) -> Option<(Vec<PathBuf>, PathBuf)> {
    let name = std::env::var("SANDBOX_MCP_TEST_IMAGE").unwrap_or_else(|_| "mcp-test".into());
    disks_for_image(run, mapper, &name)
}

/// Image `name` of the test store as disks, and a fresh writable disk.
fn disks_for_image(run: &Path, mapper: &IdMapper, name: &str) -> Option<(Vec<PathBuf>, PathBuf)> {
    let store = std::env::var_os("SANDBOX_MCP_TEST_IMAGE_STORE").map(PathBuf::from)?;
    let store = sandbox_mcp::image::ImageStore::new(store);
    let info = store.get(name).ok()?;
    let mut layers = vec![store.rootfs(name)];
    layers.extend(store.layer_paths(&info.layers));
    let cache = vm_dir().join("disks");
    let disks = layers.iter().map(|l| disks::layer_disk(l, &cache, mapper).expect("layer disk")).collect();
    let upper = run.join("upper.ext4");
    disks::upper_disk(&upper, 1 << 30).expect("upper disk");
    Some((disks, upper))
}

#[tokio::test]
async fn a_killed_qemu_is_reported() {
    let Some(assets) = assets() else { return };
    let mapper = IdMapper::detect().expect("an id map (host-setup)");
    let dir = TempDir::new("kill");
    let Some((layers, upper)) = disks_for_test_image(&dir.0, &mapper) else {
        eprintln!("SKIP: no test image (SANDBOX_MCP_TEST_IMAGE_STORE)");
        return;
    };
    let workspace = workspace_dir(&dir.0, &mapper);
    let accel = tcg();
    let spec = boot_spec("killed", &dir.0, &assets, &accel, &mapper, (layers, upper), Some(workspace));
    let (mut vm, _transport) = Instance::boot(spec).await.expect("boot");
    let pid = vm.pid().expect("qemu runs");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::SIGKILL).unwrap();
    let exit = tokio::time::timeout(Duration::from_secs(30), vm.wait()).await.expect("wait returns");
    assert!(exit.killed, "{exit:?}");
    let text = exit.to_string();
    assert!(text.starts_with("qemu was killed (signal: 9"), "{text}");
}

/// A guest whose init fails powers off; the exit says why, from the
/// guest console.
#[tokio::test]
async fn a_guest_that_cannot_start_reports_why() {
    let Some(assets) = assets() else { return };
    let mapper = IdMapper::detect().expect("an id map (host-setup)");
    let dir = TempDir::new("fail");
    let upper = dir.0.join("upper.ext4");
    disks::upper_disk(&upper, 1 << 30).expect("upper disk");
    let accel = tcg();
    // No layers: guest-init refuses `smcp_layers=0`.
    let mut spec = boot_spec("failing", &dir.0, &assets, &accel, &mapper, (Vec::new(), upper), None);
    spec.memory_mib = 256;
    // The guest powers off before its handshake: the boot fails with why.
    let e = match tokio::time::timeout(Duration::from_secs(300), Instance::boot(spec)).await.expect("boot returns") {
        Ok(_) => panic!("a guest without layers booted"),
        Err(e) => e.to_string(),
    };
    assert!(e.starts_with("qemu exited: exit status: 0"), "{e}");
    assert!(e.contains("guest-init: kernel command line: smcp_layers=0"), "{e}");
}

/// QMP pauses a vm and writes its state to a file it gets as a descriptor
/// (qemu may not spawn `exec:` migrations under `-sandbox spawn=deny`).
#[tokio::test]
async fn qmp_saves_a_paused_vm_to_a_file() {
    let Some(assets) = assets() else { return };
    let mapper = IdMapper::detect().expect("an id map (host-setup)");
    let dir = TempDir::new("qmp");
    let Some((layers, upper)) = disks_for_test_image(&dir.0, &mapper) else {
        eprintln!("SKIP: no test image (SANDBOX_MCP_TEST_IMAGE_STORE)");
        return;
    };
    let accel = tcg();
    let mut spec = boot_spec("saved", &dir.0, &assets, &accel, &mapper, (layers, upper), None);
    spec.memory_mib = 256;
    let (mut vm, _transport) = Instance::boot(spec).await.expect("boot");
    let mut qmp = vm.qmp().await.expect("qmp");
    let state_path = dir.0.join("vm.state");
    let state = std::fs::File::create(&state_path).unwrap();
    qmp.migrate_to_file(&state).await.expect("migrate to the file");
    assert_eq!(qmp.status().await.unwrap(), "postmigrate");
    let size = std::fs::metadata(&state_path).unwrap().len();
    assert!(size > 1 << 20, "the state holds the guest's memory: {size} bytes");
    qmp.cont().await.expect("cont");
    assert_eq!(qmp.status().await.unwrap(), "running");
    // Commands sent at once: the failing one is named, and every answer is
    // read, so the connection stays in step for the next command.
    let bogus = serde_json::json!({ "driver": "virtio-blk-pci", "id": "x", "drive": "no-such-node" });
    let e = qmp
        .execute_all(&[("query-status", None), ("device_add", Some(bogus)), ("stop", None)])
        .await
        .expect_err("a device_add of a missing drive fails")
        .to_string();
    assert!(e.starts_with("qmp device_add: "), "{e}");
    assert_eq!(qmp.status().await.unwrap(), "paused", "the command after the failure ran");
    // qemu serves one QMP client at a time; stop() makes its own.
    drop(qmp);
    let exit = vm.stop(Duration::from_secs(10)).await;
    assert!(!exit.killed, "quit over QMP ends qemu without a signal: {exit:?}");
}

// ------------------------------------------------------------------ disks

/// A layer's disk is built once (as the namespace's root, so the guest sees
/// the sandbox's ids) and then found in the cache.
#[test]
fn a_layer_disk_is_built_once_and_holds_the_layer() {
    let Ok(mapper) = IdMapper::detect() else {
        eprintln!("SKIP: no id map for this user (host-setup)");
        return;
    };
    let dir = TempDir::new("disk");
    let layer = dir.0.join("layer");
    std::fs::create_dir_all(layer.join("etc")).unwrap();
    std::fs::write(layer.join("etc/motd"), "hello from a layer\n").unwrap();
    let cache = dir.0.join("cache");
    let disk = disks::layer_disk(&layer, &cache, &mapper).expect("build the disk");
    assert_eq!(disk, disks::layer_disk_path(&layer, &cache).unwrap());
    let built = std::fs::metadata(&disk).unwrap().modified().unwrap();
    assert_eq!(disks::layer_disk(&layer, &cache, &mapper).unwrap(), disk);
    assert_eq!(std::fs::metadata(&disk).unwrap().modified().unwrap(), built, "the cached disk is reused");
    let out = std::process::Command::new("debugfs").args(["-R", "cat /etc/motd"]).arg(&disk).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello from a layer\n");
}

/// Boots of one image at once build its layer's disk once: the builders
/// in one process (one helper, so one temp name) used to write one file
/// together and mke2fs failed midway (two vm tests failed so in CI).
#[test]
fn concurrent_builders_of_one_layer_disk_all_get_it_whole() {
    let Ok(mapper) = IdMapper::detect() else {
        eprintln!("SKIP: no id map for this user (host-setup)");
        return;
    };
    let dir = TempDir::new("diskrace");
    let layer = dir.0.join("layer");
    // Enough entries that mke2fs takes a while: the race needs overlap.
    for d in 0..40 {
        let sub = layer.join(format!("usr/share/d{d}"));
        std::fs::create_dir_all(&sub).unwrap();
        for f in 0..50 {
            std::fs::write(sub.join(format!("f{f}.gz")), format!("{d}/{f}\n")).unwrap();
        }
    }
    let cache = dir.0.join("cache");
    let disks: Vec<PathBuf> = std::thread::scope(|s| {
        let builders: Vec<_> =
            (0..4).map(|_| s.spawn(|| disks::layer_disk(&layer, &cache, &mapper).expect("build the disk"))).collect();
        builders.into_iter().map(|b| b.join().unwrap()).collect()
    });
    assert!(disks.iter().all(|d| *d == disks[0]), "{disks:?}");
    let out = std::process::Command::new("debugfs")
        .args(["-R", "cat /usr/share/d39/f49.gz"])
        .arg(&disks[0])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "39/49\n");
    let leftovers: Vec<_> = std::fs::read_dir(&cache)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(".tmp-"))
        .collect();
    assert!(leftovers.is_empty(), "temp files left: {leftovers:?}");
}

#[test]
fn a_missing_layer_is_named() {
    let Ok(mapper) = IdMapper::detect() else {
        eprintln!("SKIP: no id map for this user (host-setup)");
        return;
    };
    let dir = TempDir::new("nolayer");
    let e = disks::layer_disk(&dir.0.join("gone"), &dir.0.join("cache"), &mapper).unwrap_err().to_string();
    assert!(e.contains("stat layer") && e.contains("gone"), "{e}");
    let e = disks::upper_disk(&dir.0.join("no/such/dir/upper.ext4"), 1 << 20).unwrap_err().to_string();
    assert!(e.contains("upper.ext4"), "{e}");
}

// ------------------------------------------- the agent over the serial port

/// A booted test-image vm (with `/workspace` when asked) and the
/// multiplexed agent connection over its virtio-serial port.
struct Booted {
    dir: TempDir,
    vm: Instance,
    agent: Mux,
    workspace: PathBuf,
}

async fn boot_test_image(tag: &str, assets: &Assets, mapper: &IdMapper) -> Option<Booted> {
    let dir = TempDir::new(tag);
    let Some((layers, upper)) = disks_for_test_image(&dir.0, mapper) else {
        eprintln!("SKIP: no test image (SANDBOX_MCP_TEST_IMAGE_STORE)");
        return None;
    };
    let workspace = workspace_dir(&dir.0, mapper);
    let accel = tcg();
    let spec = boot_spec(tag, &dir.0, assets, &accel, mapper, (layers, upper), Some(workspace.clone()));
    let (vm, agent) = Instance::boot(spec).await.expect("boot");
    Some(Booted { dir, vm, agent, workspace })
}

/// Waits for the agent's first Pong (the guest's boot under TCG).
async fn ping(agent: &Mux) {
    let mut s = agent.open(Frame::Ping).expect("open a ping stream");
    let answer = tokio::time::timeout(Duration::from_secs(180), s.next()).await.expect("the agent answers in time");
    assert!(matches!(answer, Ok(Some(Frame::Pong))), "{answer:?}");
}

/// Runs argv in the guest; its exit code and stdout.
async fn exec(agent: &Mux, argv: &[&str]) -> (i32, String) {
    let (code, out) = exec_bytes(agent, argv).await;
    (code, String::from_utf8_lossy(&out).into_owned())
}

/// Runs argv in the guest; its exit code and stdout's bytes.
async fn exec_bytes(agent: &Mux, argv: &[&str]) -> (i32, Vec<u8>) {
    let spec = StartSpec::plain(argv.iter().map(|a| a.to_string()).collect());
    let mut s = agent.open(Frame::Start(spec)).expect("open an exec stream");
    let mut out = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(120), s.next()).await.expect("exec answers") {
            Ok(Some(Frame::Stdout(b))) => out.extend(b),
            Ok(Some(Frame::Exited(ExitStatus::Code(c)))) => return (c, out),
            Ok(Some(Frame::Started(_) | Frame::Stderr(_) | Frame::Credit(_))) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[tokio::test]
async fn the_agent_answers_on_the_serial_port_from_the_guest_kernel() {
    let Some(assets) = assets() else { return };
    let mapper = IdMapper::detect().expect("an id map (host-setup)");
    let Some(mut b) = boot_test_image("uname", &assets, &mapper).await else { return };
    ping(&b.agent).await;
    let (code, release) = exec(&b.agent, &["uname", "-r"]).await;
    assert_eq!(code, 0);
    let host = nix::sys::utsname::uname().unwrap().release().to_string_lossy().into_owned();
    assert_eq!(release.trim(), assets.release, "the guest runs the vm kernel");
    assert_ne!(release.trim(), host, "not the host's kernel");
    let exit = b.vm.stop(Duration::from_secs(10)).await;
    assert!(!exit.killed, "{exit:?}");
    drop(b.dir);
}

#[tokio::test]
async fn workspace_files_cross_between_host_and_guest() {
    let Some(assets) = assets() else { return };
    let mapper = IdMapper::detect().expect("an id map (host-setup)");
    let Some(mut b) = boot_test_image("ws", &assets, &mapper).await else { return };
    std::fs::write(b.workspace.join("from-host.txt"), "written by the host\n").unwrap();
    ping(&b.agent).await;
    let (code, seen) = exec(&b.agent, &["cat", "/workspace/from-host.txt"]).await;
    assert_eq!((code, seen.as_str()), (0, "written by the host\n"));
    let (code, _) = exec(&b.agent, &["sh", "-c", "echo written by the guest > /workspace/from-guest.txt"]).await;
    assert_eq!(code, 0);
    let back = b.workspace.join("from-guest.txt");
    assert_eq!(std::fs::read_to_string(&back).unwrap(), "written by the guest\n");
    // The guest's root writes files the sandbox's root owns on the host
    // (the user, for an ordinary user's helper), as in a namespace sandbox.
    let (uid, _) = mapper.id_map().host_root();
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&back).unwrap()), uid);
    b.vm.kill().await;
}

/// The guest's writable layer comes out as a layer in the image store's
/// format: files with the sandbox's owners, a deletion as a 0/0 character
/// device, a replaced directory marked opaque.
#[tokio::test]
async fn the_writable_layer_becomes_a_store_layer() {
    let Some(assets) = assets() else { return };
    let mapper = IdMapper::detect().expect("an id map (host-setup)");
    let Some(mut b) = boot_test_image("snap", &assets, &mapper).await else { return };
    ping(&b.agent).await;
    let change = "echo added > /etc/added && rm /etc/hostname && rm -r /usr/share/doc && mkdir /usr/share/doc \
        && echo new > /usr/share/doc/new && sync";
    assert_eq!(exec(&b.agent, &["sh", "-c", change]).await.0, 0);
    let argv = sandbox_mcp::guest::layer_archive::argv();
    let (code, tar) = exec_bytes(&b.agent, &argv.iter().map(String::as_str).collect::<Vec<_>>()).await;
    assert_eq!(code, 0);
    b.vm.kill().await;
    let archive = b.dir.0.join("layer.tar");
    std::fs::write(&archive, tar).unwrap();
    let layer = b.dir.0.join("layer");
    snapshot::unpack_layer(&archive, &layer, &mapper).expect("unpack");

    use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
    let (uid, _) = mapper.id_map().host_root();
    let added = std::fs::symlink_metadata(layer.join("etc/added")).unwrap();
    assert_eq!(std::fs::read_to_string(layer.join("etc/added")).unwrap(), "added\n");
    assert_eq!(added.uid(), uid, "root's file in the guest is the sandbox root's on the host");
    let whiteout = std::fs::symlink_metadata(layer.join("etc/hostname")).unwrap();
    assert!(whiteout.file_type().is_char_device() && whiteout.rdev() == 0, "{whiteout:?}");
    let doc = layer.join("usr/share/doc");
    let value = xattr(&doc, "user.overlay.opaque");
    assert_eq!(value.as_deref(), Some(&b"y"[..]), "the replaced directory is opaque");
    assert!(doc.join("new").is_file());
    // Unpacking into an existing directory is refused, naming it.
    let e = snapshot::unpack_layer(&archive, &layer, &mapper).unwrap_err().to_string();
    assert!(e.contains(&layer.display().to_string()), "{e}");
}

fn xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    let p = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    let mut buf = [0u8; 64];
    // SAFETY: valid C strings and a buffer of the given length.
    let len = unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    (len >= 0).then(|| buf[..len as usize].to_vec())
}

// ------------------------------------------------- through the driver seam

fn seam_spec(dir: &Path, layers: Vec<PathBuf>, mounts: Vec<BindMount>) -> SeamBootSpec {
    let id = format!("vm-{}", dir.file_name().unwrap().to_string_lossy());
    SeamBootSpec {
        id,
        hostname: "seam".into(),
        layers,
        dir: dir.to_path_buf(),
        mounts,
        limits: Limits { cpus: 1, memory_bytes: 512 << 20, pids: 1024 },
        image_reference: None,
        disk_bytes: 1 << 30,
        egress: None,
    }
}

/// The test image's layers, or None (the caller's test skipped, saying so)
/// when there is no test image.
fn test_image_layers() -> Option<Vec<PathBuf>> {
    let layers = (|| {
        let store = std::env::var_os("SANDBOX_MCP_TEST_IMAGE_STORE").map(PathBuf::from)?;
        let name = std::env::var("SANDBOX_MCP_TEST_IMAGE").unwrap_or_else(|_| "mcp-test".into());
        let store = sandbox_mcp::image::ImageStore::new(store);
        let info = store.get(&name).ok()?;
        let mut layers = vec![store.rootfs(&name)];
        layers.extend(store.layer_paths(&info.layers));
        Some(layers)
    })();
    if layers.is_none() {
        eprintln!("SKIP: no test image (SANDBOX_MCP_TEST_IMAGE_STORE)");
    }
    layers
}

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

// ------------------------------------------------------- Docker in the guest

/// An image with Docker Engine starts dockerd at boot (guest init's
/// containers module): `docker build` of a `FROM scratch` image holding the
/// image's static busybox, and `docker run` of it, work with no registry.
/// A privileged container with the root bound in sees the VM's root and
/// kernel, never the host's: the VM is the boundary. Needs the docker test
/// image (`make test-image-docker`); skips without it.
#[tokio::test]
async fn dockerd_in_the_guest_builds_and_runs_a_scratch_image() {
    let Some(assets) = assets() else { return };
    let mapper = IdMapper::detect().expect("an id map (host-setup)");
    let name = std::env::var("SANDBOX_MCP_DOCKER_TEST_IMAGE").unwrap_or_else(|_| "mcp-docker".into());
    let dir = TempDir::new("docker");
    let Some((layers, upper)) = disks_for_image(&dir.0, &mapper, &name) else {
        eprintln!("SKIP: no image {name} in SANDBOX_MCP_TEST_IMAGE_STORE (make test-image-docker)");
        return;
    };
    let workspace = workspace_dir(&dir.0, &mapper);
    let accel = tcg();
    let spec = BootSpec {
        memory_mib: 1024,
        ..boot_spec("docker", &dir.0, &assets, &accel, &mapper, (layers, upper), Some(workspace))
    };
    let (mut vm, agent) = Instance::boot(spec).await.expect("boot");
    ping(&agent).await;
    let sh = |script: &str| ["sh".to_string(), "-c".into(), format!("exec 2>&1; {script}")];
    let run = |script: &str| {
        let argv = sh(script);
        let agent = &agent;
        async move { exec(agent, &argv.iter().map(String::as_str).collect::<Vec<_>>()).await }
    };
    // Within exec's 120 s between frames; dockerd's log says why not.
    let (code, out) = run("end=$(($(date +%s) + 90)); while [ $(date +%s) -lt $end ]; do \
         docker info >/dev/null 2>&1 && exit 0; sleep 1; done; \
         echo dockerd did not answer within 90 s; cat /var/log/dockerd.log; exit 1")
    .await;
    assert_eq!(code, 0, "{out}");
    let (code, out) = run(
        "mkdir -p /workspace/ctx && cp /bin/busybox /workspace/ctx/ && cd /workspace/ctx && \
         printf 'FROM scratch\\nCOPY busybox /bin/sh\\nCOPY busybox /bin/busybox\\nCMD [\"/bin/sh\", \"-c\", \"echo hello from scratch\"]\\n' > Dockerfile && \
         docker build -t scratch-test . && docker run --rm scratch-test",
    )
    .await;
    assert_eq!(code, 0, "{out}");
    assert!(out.trim_end().ends_with("hello from scratch"), "{out}");
    std::fs::write(dir.0.join("host-only"), "on the host").unwrap();
    let (code, out) = run(&format!(
        "docker run --rm --privileged -v /:/host scratch-test /bin/busybox sh -c \
         'busybox uname -r; busybox ls /host/run/sandbox-mcp >/dev/null && echo guest-root; \
          busybox ls /host{} 2>/dev/null || echo no-host-file'",
        dir.0.join("host-only").display()
    ))
    .await;
    assert_eq!(code, 0, "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines, [assets.release.as_str(), "guest-root", "no-host-file"], "{out}");
    vm.kill().await;
}

// ------------------------------------------------ memory snapshots, pool

/// A driver keeping its memory snapshots (and pool of `pool` vms) in `dir`.
fn warm_driver(assets: &Assets, dir: &Path, pool: usize) -> QemuDriver {
    QemuDriver::with_assets(Ok(assets.clone())).with_warm(dir, pool)
}

/// The shape of [`seam_spec`]'s vms of `layers`.
async fn seam_shape(driver: &QemuDriver, assets: &Assets, layers: &[PathBuf], mapper: &IdMapper) -> Shape {
    Shape {
        kernel: assets.kernel.clone(),
        initramfs: assets.initramfs.clone(),
        accel: driver.accel(assets).await.clone(),
        layers: layers.iter().map(|l| disks::layer_disk(l, &vm_dir().join("disks"), mapper).unwrap()).collect(),
        cpus: 1,
        memory_mib: 512,
        network: false,
    }
}

/// A sandbox named `name` under `dir` with its own `/workspace` volume.
fn sandbox(dir: &Path, name: &str, layers: &[PathBuf], mapper: &IdMapper) -> (SeamBootSpec, PathBuf) {
    let own = dir.join(name);
    std::fs::create_dir_all(&own).unwrap();
    let workspace = workspace_dir(&own, mapper);
    let mount = BindMount { host: workspace.clone(), guest: "/workspace".into(), read_only: false };
    let mut spec = seam_spec(&own, layers.to_vec(), vec![mount]);
    spec.id = format!("vm-{}-{name}", std::process::id());
    (spec, workspace)
}

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
        vm.kill();
        vm.cleanup();
        seen.push(ids);
    }
    let (a, b): (Vec<&str>, Vec<&str>) = (seen[0].lines().collect(), seen[1].lines().collect());
    assert_ne!(a[0], b[0], "random uuids after two restores of one snapshot");
    assert_ne!(a[1], b[1], "boot ids after two restores of one snapshot");
    driver.release().await;
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

/// A state file that is stale (another kernel, helper or image) or corrupt
/// is not restored: the vm boots cold and says why, and a corrupt one is
/// discarded to be saved anew.
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
    let (spec, _) = sandbox(&dir.0, "stale", &layers, &mapper);
    let vm = driver.boot_vm(&spec).await.expect("a cold boot");
    assert!(matches!(vm.origin(), Origin::Cold { reason } if reason.contains("stale")), "{:?}", vm.origin());
    vm.kill();
    vm.cleanup();
    driver.warm().idle().await;
    assert!(template.current().is_some(), "a current template was saved behind the cold boot");
    std::fs::write(template.state(), b"corrupt").unwrap();
    let (spec, ws) = sandbox(&dir.0, "corrupt", &layers, &mapper);
    let vm = driver.boot_vm(&spec).await.expect("a cold boot");
    match vm.origin() {
        Origin::Cold { reason } => assert!(reason.contains("restoring") && reason.contains("failed"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert_own_volume_and_layer(&vm, &ws, "corrupt").await;
    vm.kill();
    vm.cleanup();
    driver.warm().idle().await;
    assert!(template.current().is_some(), "the corrupt state was replaced");
    driver.release().await;
}

// ------------------------------------------- EGRESS through the helper's stack

#[path = "support/net.rs"]
#[allow(dead_code)]
mod net_support;

use std::sync::Arc;

use net_support::{CLIENT, TestHost, dns_responder};
use sandbox_mcp::helper::netstack::events::Events;
use sandbox_mcp::netpolicy::NetworkPolicy;

/// In the guest, as root, straight onto eth0 with AF_PACKET: runt and
/// garbage frames, unknown ether types, IPv4 with lying lengths and a
/// spoofed source, ARP replies and gratuitous ARP claiming the gateway and
/// the DNS address, ARP requests from a spoofed sender, then a flood of
/// full-size garbage; prints "sent N".
const HOSTILE_FRAMES: &str = r#"
import os, socket, struct
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind(("eth0", 0))
me = bytes.fromhex("5254000a000f")
gw = bytes.fromhex("52550a000202")
bcast = b"\xff" * 6
evil = bytes.fromhex("deadbeef0001")
def arp(op, sha, spa, tha, tpa):
    return struct.pack("!HHBBH6s4s6s4s", 1, 0x0800, 6, 4, op, sha, socket.inet_aton(spa), tha, socket.inet_aton(tpa))
frames = [b"", b"\x00", b"\x01" * 13, gw + me + b"\x88\xb5" + os.urandom(200), bcast + me + b"\x86\xdd" + os.urandom(60)]
frames += [gw + me + b"\x08\x00" + bytes([0x45, 0, 0xff, 0xff]) + os.urandom(40)]
frames += [gw + me + b"\x08\x00" + bytes([0x4f]) + os.urandom(10)]
spoofed = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 40, 1, 0, 64, 6, 0, socket.inet_aton("10.0.2.99"), socket.inet_aton("10.0.2.2"))
frames += [gw + me + b"\x08\x00" + spoofed + os.urandom(20)]
for ip in ("10.0.2.2", "10.0.2.3"):
    frames += [bcast + evil + b"\x08\x06" + arp(2, evil, ip, me, "10.0.2.15")]
    frames += [bcast + evil + b"\x08\x06" + arp(1, evil, ip, b"\0" * 6, ip)]
    frames += [bcast + evil + b"\x08\x06" + arp(1, evil, "10.0.2.99", b"\0" * 6, ip)]
frames += [gw + me + b"\x08\x06" + os.urandom(5)]
sent = 0
for f in frames:
    try:
        s.send(f)
        sent += 1
    except OSError:
        pass
junk = gw + me + b"\x08\x00" + os.urandom(1500)
for _ in range(20000):
    try:
        s.send(junk)
        sent += 1
    except OSError:
        pass
print("sent", sent)
"#;

/// Runs the shared test client in the guest with `args`; its one line.
async fn net_client(agent: &Mux, args: &[&str]) -> String {
    let mut argv = vec!["python3", "-c", CLIENT];
    argv.extend_from_slice(args);
    exec(agent, &argv).await.1.trim().to_string()
}

/// The policy of [`a_vm_reaches_the_network_only_as_its_policy_allows_and_survives_hostile_frames`]
/// seen from the guest: `allowed.test` resolves to `addr`, other names and
/// destinations are refused and recorded, and a test host (if any) at
/// `addr` serves its allowed port only.
async fn egress_checks(agent: &Mux, events: &Events, addr: std::net::Ipv4Addr, host: Option<&TestHost>) {
    assert_eq!(net_client(agent, &["resolve", "allowed.test"]).await, format!("['{addr}']"), "an allowed name");
    assert_eq!(net_client(agent, &["resolve", "other.test"]).await, "gaierror", "a name outside the list");
    let refused = refusals(events);
    assert!(refused.contains("dns other.test "), "the refused query is recorded: {refused}");
    assert_eq!(net_client(agent, &["tcp", "198.51.100.9", "80"]).await, "ConnectionRefusedError");
    let refused = refusals(events);
    assert!(refused.contains("tcp 198.51.100.9:80 198.51.100.9:80 is not in the allow list"), "{refused}");
    match host {
        Some(host) => {
            let a = host.addr();
            let served = net_client(agent, &["tcp", &a, "8080"]).await;
            assert_eq!(served, "HTTP/1.0 200 OK hello from the test host", "the allowed host serves");
            assert_eq!(net_client(agent, &["tcp", &a, "8081"]).await, "ConnectionRefusedError", "its other port");
        }
        None => eprintln!("SKIP (part): no test host as an ordinary user (ip netns needs root)"),
    }
}

/// What the helper's dial (the way `expose` reaches a guest port) gets
/// from an HTTP server on the guest's loopback: the agent's `Dial` stream
/// on the serial port, no network card involved. Retries while the server
/// starts (a refused dial fails the stream).
async fn dial_guest_http(agent: &Mux) -> String {
    let start = "setsid python3 -m http.server 8000 --bind 127.0.0.1 >/dev/null 2>&1 < /dev/null &";
    assert_eq!(exec(agent, &["sh", "-c", start]).await.0, 0);
    for _ in 0..60 {
        let mut s = agent.open(Frame::Dial(8000)).expect("open a dial stream");
        match tokio::time::timeout(Duration::from_secs(30), s.next()).await.expect("dial answers") {
            Ok(Some(Frame::Connected)) => {}
            _ => {
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        }
        s.send(Frame::Data(b"GET / HTTP/1.0\r\n\r\n".to_vec())).await.expect("send the request");
        s.send(Frame::End).await.expect("half-close");
        let mut answer = Vec::new();
        loop {
            match tokio::time::timeout(Duration::from_secs(30), s.next()).await.expect("the answer comes") {
                Ok(Some(Frame::Data(b))) => answer.extend(b),
                Ok(Some(Frame::Credit(_))) => {}
                _ => break,
            }
        }
        return String::from_utf8_lossy(&answer).lines().next().unwrap_or_default().to_string();
    }
    panic!("the guest's http server never accepted a dial");
}

/// The stack's refusals so far, as "protocol destination reason" lines.
fn refusals(events: &Events) -> String {
    let snap = events.snapshot();
    snap.refused.iter().map(|r| format!("{} {} {}\n", r.protocol, r.destination, r.reason)).collect()
}

/// A vm with EGRESS: its virtio-net card reaches the helper's stack, which
/// applies the sandbox's policy exactly as for a namespace sandbox (the
/// same `NetStack`, addresses and checks): DNS answers only allowed names,
/// a destination outside the allow list is refused at once with the
/// refusal recorded, and an allowed test host (root: a network namespace)
/// serves HTTP. A hostile guest's frames (garbage, lying lengths, ARP
/// spoofing of the gateway, a flood) leave the stack serving, and another
/// vm's stack in the helper answers throughout. A guest port
/// is reached by the helper's dial, as `expose` does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vm_reaches_the_network_only_as_its_policy_allows_and_survives_hostile_frames() {
    let Some(assets) = assets() else { return };
    let Some(layers) = test_image_layers() else { return };
    let (_upstream, host, addr, responder) = upstream().await;
    let policy = egress_policy(addr, &[]);
    let events = Arc::new(Events::default());
    let dir = TempDir::new("net");
    let driver = QemuDriver::with_assets(Ok(assets)).with_warm(&dir.0, 0);
    assert!(driver.capabilities().network_egress, "the vm driver offers EGRESS");
    let mut spec = seam_spec(&dir.0, layers, Vec::new());
    spec.id = "vm-net".into();
    spec.egress = Some(Egress::Stack(policy, events.clone()));
    let vm = driver.boot(&spec).await.expect("boot with EGRESS");
    let agent = vm.connection();
    let (_, conf) = exec(&agent, &["cat", "/etc/resolv.conf"]).await;
    assert_eq!(conf, "nameserver 10.0.2.3\n");
    egress_checks(&agent, &events, addr, host.as_ref()).await;

    // Another vm's stack in this helper keeps answering while this guest
    // is hostile.
    let (_neighbour, mut other) = neighbour_stack(&dir.0.join("other")).await;
    let hostile = exec(&agent, &["python3", "-c", HOSTILE_FRAMES]);
    let asking = async {
        for _ in 0..20 {
            ask_gateway(&mut other).await;
        }
    };
    let ((code, sent), ()) = tokio::join!(hostile, asking);
    assert_eq!(code, 0, "{sent}");
    assert!(sent.starts_with("sent "), "{sent}");
    ask_gateway(&mut other).await;
    // The stack still serves the guest: every check passes again, and the
    // guest found the gateway at the stack's MAC.
    egress_checks(&agent, &events, addr, host.as_ref()).await;
    let (_, arp) = exec(&agent, &["cat", "/proc/net/arp"]).await;
    assert!(arp.lines().any(|l| l.starts_with("10.0.2.2 ") && l.contains("52:55:0a:00:02:02")), "{arp}");
    assert_eq!(dial_guest_http(&agent).await, "HTTP/1.0 200 OK", "a guest port is reachable by dial");
    vm.kill();
    responder.abort();
    vm.cleanup();
}

/// The DNS upstream the stacks of this process ask (one responder at a
/// time: the variable is process-wide), so EGRESS tests take it in turn.
static UPSTREAM: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Takes [`UPSTREAM`] and points it at a fresh responder answering every
/// name with the test host's address (as an ordinary user there is no
/// test host, ip netns needing root: names then resolve to a
/// documentation address nothing serves). Returns the turn, the host, its
/// address and the responder.
async fn upstream()
-> (tokio::sync::MutexGuard<'static, ()>, Option<TestHost>, std::net::Ipv4Addr, tokio::task::JoinHandle<()>) {
    let turn = UPSTREAM.lock().await;
    let host = TestHost::up();
    let addr: std::net::Ipv4Addr = host.as_ref().map_or("198.51.100.7".into(), |h| h.addr()).parse().unwrap();
    let (dns, responder) = dns_responder(addr).await;
    // SAFETY: std's own environment lock orders this against every other
    // env read in this process (they are all Rust's); a stack reads the
    // variable when it starts.
    unsafe { std::env::set_var("SANDBOX_VM_HELPER_DNS_UPSTREAM", dns.to_string()) };
    (turn, host, addr, responder)
}

/// The policy [`egress_checks`] expects: the test host's port 8080 and
/// `allowed.test`, plus `names`.
fn egress_policy(addr: std::net::Ipv4Addr, names: &[&str]) -> NetworkPolicy {
    let mut allow = vec![format!("{addr}:8080"), "allowed.test".into()];
    allow.extend(names.iter().map(|n| n.to_string()));
    NetworkPolicy::parse(&allow, &[]).unwrap()
}

/// Boots sandbox `name` under `dir` with EGRESS under `policy` through
/// `driver`; the vm and its stack's events.
async fn egress_vm(
    driver: &QemuDriver,
    dir: &Path,
    name: &str,
    layers: &[PathBuf],
    policy: NetworkPolicy,
) -> (Arc<VmInstance>, Arc<Events>) {
    let mapper = IdMapper::detect().expect("an id map (host-setup)");
    let (mut spec, _) = sandbox(dir, name, layers, &mapper);
    let events = Arc::new(Events::default());
    spec.egress = Some(Egress::Stack(policy, events.clone()));
    let vm = driver.boot_vm(&spec).await.unwrap_or_else(|e| panic!("boot {name} with EGRESS: {e}"));
    let (_, conf) = exec(&vm.connection(), &["cat", "/etc/resolv.conf"]).await;
    assert_eq!(conf, "nameserver 10.0.2.3\n", "{name}'s resolver is the stack");
    (vm, events)
}

/// EGRESS vms come from their shape's memory snapshot, as others do: the
/// network card is part of the shape, so its template and pool have one,
/// and each restored vm's card reaches its own stack with its own policy.
/// The first boots cold (no snapshot yet), the next comes from the pool,
/// a third (while the second runs) from the refilled pool or the state
/// file; each resolves only what its policy allows and has refusals
/// recorded, and neither sees the other's traffic: a name only the third
/// allows resolves there and not in the second, and each one's refusals
/// land in its own events only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egress_vms_come_from_the_pool_and_the_state_file_each_with_its_own_network() {
    let Some(assets) = assets() else { return };
    let Some(layers) = test_image_layers() else { return };
    let mapper = IdMapper::detect().expect("an id map (host-setup)");
    let (_upstream, host, addr, responder) = upstream().await;
    let dir = TempDir::new("netpool");
    let driver = warm_driver(&assets, &dir.0, 1);

    let (cold, events) = egress_vm(&driver, &dir.0, "cold", &layers, egress_policy(addr, &[])).await;
    assert!(
        matches!(cold.origin(), Origin::Cold { reason } if reason.contains("no memory snapshot")),
        "{:?}",
        cold.origin()
    );
    egress_checks(&cold.connection(), &events, addr, host.as_ref()).await;
    cold.kill();
    cold.cleanup();
    driver.warm().idle().await;
    let shape = Shape { network: true, ..seam_shape(&driver, &assets, &layers, &mapper).await };
    assert_eq!(driver.warm().ready(&shape), 1, "the EGRESS shape's pool filled behind the cold boot");

    let (pooled, pooled_events) = egress_vm(&driver, &dir.0, "pooled", &layers, egress_policy(addr, &[])).await;
    assert_eq!(pooled.origin(), &Origin::Pool);
    egress_checks(&pooled.connection(), &pooled_events, addr, host.as_ref()).await;

    let policy = egress_policy(addr, &["third.test"]);
    let (third, third_events) = egress_vm(&driver, &dir.0, "third", &layers, policy).await;
    assert!(matches!(third.origin(), Origin::Pool | Origin::Snapshot), "{:?}", third.origin());
    let pooled_refused = refusals(&pooled_events);
    egress_checks(&third.connection(), &third_events, addr, host.as_ref()).await;
    assert_eq!(refusals(&pooled_events), pooled_refused, "the third's refusals are not the second's");
    assert_eq!(net_client(&third.connection(), &["resolve", "third.test"]).await, format!("['{addr}']"));
    assert_eq!(net_client(&pooled.connection(), &["resolve", "third.test"]).await, "gaierror", "the second's policy");
    assert!(refusals(&pooled_events).contains("dns third.test "), "{}", refusals(&pooled_events));
    assert!(!refusals(&third_events).contains("third.test"), "{}", refusals(&third_events));
    // The second's network still answers it, not the third.
    assert_eq!(net_client(&pooled.connection(), &["resolve", "allowed.test"]).await, format!("['{addr}']"));
    for vm in [pooled, third] {
        vm.kill();
        vm.cleanup();
    }
    driver.warm().idle().await;
    driver.release().await;
    responder.abort();
}

/// One length-prefixed frame, as qemu's `-netdev stream` writes it.
fn framed(frame: &[u8]) -> Vec<u8> {
    let mut v = (frame.len() as u32).to_be_bytes().to_vec();
    v.extend(frame);
    v
}

/// An ARP request from the guest's address for `target`.
fn arp_request(target: std::net::Ipv4Addr) -> Vec<u8> {
    use sandbox_mcp::helper::netstack::{GUEST, GUEST_MAC};
    use smoltcp::wire::{ArpOperation, ArpPacket, ArpRepr, EthernetAddress, EthernetFrame, EthernetProtocol};
    let repr = ArpRepr::EthernetIpv4 {
        operation: ArpOperation::Request,
        source_hardware_addr: GUEST_MAC,
        source_protocol_addr: GUEST,
        target_hardware_addr: EthernetAddress([0; 6]),
        target_protocol_addr: target,
    };
    let mut frame = vec![0u8; 14 + repr.buffer_len()];
    let mut eth = EthernetFrame::new_unchecked(&mut frame[..]);
    eth.set_src_addr(GUEST_MAC);
    eth.set_dst_addr(EthernetAddress::BROADCAST);
    eth.set_ethertype(EthernetProtocol::Arp);
    repr.emit(&mut ArpPacket::new_unchecked(eth.payload_mut()));
    frame
}

/// The next frame the stack sends on a network socket.
async fn reply(qemu: &mut tokio::net::UnixStream) -> Vec<u8> {
    use tokio::io::AsyncReadExt as _;
    let mut len = [0u8; 4];
    tokio::time::timeout(Duration::from_secs(10), qemu.read_exact(&mut len)).await.expect("an answer").unwrap();
    let mut frame = vec![0u8; u32::from_be_bytes(len) as usize];
    qemu.read_exact(&mut frame).await.unwrap();
    frame
}

/// Asserts `frame` is the stack's ARP reply: the gateway is at its MAC.
fn expect_arp_reply(frame: &[u8]) {
    use sandbox_mcp::helper::netstack::{GATEWAY, GATEWAY_MAC, GUEST_MAC};
    use smoltcp::wire::{ArpOperation, ArpPacket, ArpRepr, EthernetFrame};
    let eth = EthernetFrame::new_checked(frame).unwrap();
    assert_eq!((eth.src_addr(), eth.dst_addr()), (GATEWAY_MAC, GUEST_MAC));
    let repr = ArpRepr::parse(&ArpPacket::new_checked(eth.payload()).unwrap()).unwrap();
    let ArpRepr::EthernetIpv4 { operation, source_hardware_addr, source_protocol_addr, .. } = repr else {
        panic!("{repr:?}")
    };
    assert_eq!((operation, source_hardware_addr, source_protocol_addr), (ArpOperation::Reply, GATEWAY_MAC, GATEWAY));
}

/// A second vm's stack in the same helper, the test playing its qemu:
/// its stack and the stream to it.
async fn neighbour_stack(dir: &Path) -> (sandbox_mcp::helper::netstack::NetStack, tokio::net::UnixStream) {
    use sandbox_mcp::helper::driver::qemu::network::NetLink;
    let link = NetLink::listen(dir).expect("listen");
    let qemu = tokio::net::UnixStream::connect(link.path()).await.expect("connect as qemu");
    let stack = link.attach(NetworkPolicy::default(), Arc::new(Events::default())).await.expect("attach");
    (stack, qemu)
}

/// Asks `qemu`'s stack for the gateway's MAC and checks the answer.
async fn ask_gateway(qemu: &mut tokio::net::UnixStream) {
    use tokio::io::AsyncWriteExt as _;
    qemu.write_all(&framed(&arp_request(sandbox_mcp::helper::netstack::GATEWAY))).await.unwrap();
    expect_arp_reply(&reply(qemu).await);
}

/// The network socket without qemu: the test plays qemu's `-netdev stream`
/// end. The helper accepts one connection and removes the socket; the
/// stack answers ARP for the gateway with its MAC, and after a length
/// prefix far beyond any frame (skipped unbuffered), garbage and a runt it
/// is still in step and answering.
#[tokio::test]
async fn the_network_socket_speaks_qemus_frame_stream_and_survives_a_corrupt_one() {
    use sandbox_mcp::helper::driver::qemu::network::NetLink;
    use tokio::io::AsyncWriteExt as _;
    let dir = TempDir::new("netsock");
    let link = NetLink::listen(&dir.0).expect("listen");
    let path = link.path().to_path_buf();
    let mut qemu = tokio::net::UnixStream::connect(&path).await.expect("connect as qemu");
    let _stack = link.attach(NetworkPolicy::default(), Arc::new(Events::default())).await.expect("attach");
    assert!(!path.exists(), "the socket is gone once qemu is connected");

    ask_gateway(&mut qemu).await;

    // A 64 MiB length prefix and its "frame" in 1 MiB writes, then a
    // runt, garbage, and the question again.
    let huge: u32 = 1 << 26;
    qemu.write_all(&huge.to_be_bytes()).await.unwrap();
    let junk = vec![0x5au8; 1 << 20];
    let mut left = huge as usize;
    while left > 0 {
        let n = left.min(junk.len());
        qemu.write_all(&junk[..n]).await.unwrap();
        left -= n;
    }
    qemu.write_all(&framed(&[1, 2, 3])).await.unwrap();
    qemu.write_all(&framed(&[0xffu8; 1500])).await.unwrap();
    ask_gateway(&mut qemu).await;
}
