//! The `vm` driver's qemu side on real microVMs: the boot probe, a full
//! boot of the test image, and a killed qemu. TCG is slow, so each test
//! boots at most one vm.
//!
//! Needs qemu (`make vm` installs it) and the kernel and initramfs built
//! for `SANDBOX_VM_HELPER_BIN` in `SANDBOX_MCP_VM_DIR` (`make vm`; the test
//! setup builds them). Without qemu or the kernel each test says why and
//! passes; with the kernel but no initramfs for this very binary (built
//! after `make vm`) it fails, since it would otherwise never run.
//!
//! Tests beyond a plain boot have a file each under `vm_qemu/`; the helpers
//! they share are here.
use std::path::{Path, PathBuf};
use std::time::Duration;

use sandbox_agent::mux::Mux;
use sandbox_agent::protocol::{ExitStatus, Frame, StartSpec};
use sandbox_helper::driver::cgroup::CgroupLayout;
use sandbox_helper::driver::qemu::assets::{Assets, build_id, vm_dir};
use sandbox_helper::driver::qemu::driver::{Origin, QemuDriver, VmInstance};
use sandbox_helper::driver::qemu::instance::{BootSpec, Instance, KEEPER_RECORD, Shape};
use sandbox_helper::driver::qemu::{Accel, disks, probe, snapshot};
use sandbox_helper::driver::{BindMount, BootSpec as SeamBootSpec, Driver as _, Egress, Instance as _, Limits};
use sandbox_userns::IdMapper;

#[path = "vm_qemu/agent.rs"]
mod agent;
#[path = "vm_qemu/docker.rs"]
mod docker;
#[path = "vm_qemu/egress.rs"]
mod egress;
#[path = "vm_qemu/layer_disks.rs"]
mod layer_disks;
#[path = "support/net.rs"]
#[allow(dead_code)]
mod net_support;
#[path = "vm_qemu/seam.rs"]
mod seam;
#[path = "vm_qemu/warm.rs"]
mod warm;

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
    if std::process::Command::new(sandbox_helper::driver::qemu::QEMU).arg("--version").output().is_err() {
        eprintln!("SKIP: qemu-system-x86_64 is not installed (make vm)");
        return None;
    }
    if !vm_dir().join("vmlinux").is_file() {
        eprintln!("SKIP: no vm kernel in {} (make vm)", vm_dir().display());
        return None;
    }
    let id = build_id(&helper).expect("read the helper's build id").expect("the helper has a build id");
    // qemu's keeper is the helper binary, not this test process.
    sandbox_helper::driver::qemu::keeper::use_program(&helper);
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
    let memo = dir.0.join("accel");
    let accel = probe::detect(&assets, &dir.0, &memo).await;
    match accel.clone() {
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
    // The answer is remembered for this host boot and kernel, and served
    // from there (no probe vm runs: its run dir is not even made).
    let memo_text = std::fs::read_to_string(&memo).unwrap();
    assert!(memo_text.contains(&format!("\n{}\n", assets.release)), "{memo_text}");
    let elsewhere = dir.0.join("not-made");
    assert_eq!(probe::detect(&assets, &elsewhere, &memo).await, accel);
    assert!(!elsewhere.exists());
}

/// The test image's layers as disks and a fresh writable disk.
fn disks_for_test_image(run: &Path, mapper: &IdMapper) -> Option<(Vec<PathBuf>, PathBuf)> {
    let name = std::env::var("SANDBOX_MCP_TEST_IMAGE").unwrap_or_else(|_| "mcp-test".into());
    disks_for_image(run, mapper, &name)
}

/// Image `name` of the test store as disks, and a fresh writable disk.
fn disks_for_image(run: &Path, mapper: &IdMapper, name: &str) -> Option<(Vec<PathBuf>, PathBuf)> {
    let store = std::env::var_os("SANDBOX_MCP_TEST_IMAGE_STORE").map(PathBuf::from)?;
    let store = sandbox_image::ImageStore::new(store);
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
    // The devices only: the guest's RAM is shared memory, left out of the
    // state (x-ignore-shared), as a template keeps it in a file of its own.
    assert!(size > 0 && size < 1 << 20, "the state holds the devices, not 256 MiB of RAM: {size} bytes");
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
        let store = sandbox_image::ImageStore::new(store);
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
