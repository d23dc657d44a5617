//! The `vm` driver behind the seam ([`crate::driver::Driver`]):
//! boots a qemu microVM per sandbox and hands the helper the agent's
//! multiplexed connection over the virtio-serial port.
//!
//! A vm comes from the warm pool when one of its shape waits there, else
//! it is restored from its shape's memory snapshot, else it boots cold
//! (the reason kept in its [`Origin`]); after a boot the shape's template
//! and pool are made ready in the background ([`super::pool`]).
//!
//! EGRESS goes through the helper's network stack, with the sandbox's
//! policy, as on the namespace driver ([`super::network`]): the network
//! card is part of the shape, so an EGRESS vm comes from its own shape's
//! pool or template too, and the stack takes the card's connection once
//! the vm is the sandbox's. What it does not do yet, refused with the reason: shares other
//! than `/workspace`. CPUs and memory are the VM's own size
//! (`-smp`, `-m`); qemu also runs in the sandbox's cgroup (the namespace
//! driver's layout), which bounds what the host gives the whole VM. The
//! sandbox's task limit, and its memory limit where it is below the VM's
//! RAM, hold inside the guest, on the cgroup its processes run in (the go
//! line carries them, [`sandbox_guest::cgroup`]); its stats report that
//! group's figures.
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::assets::Assets;
use super::instance::{Attach, Instance as QemuInstance, KEEPER_RECORD, OWNER_RECORD, Shape, Start};
use super::pool::Warm;
use super::share::Share;
use super::virtiofsd::VIRTIOFSD;
use super::{Accel, QemuError, disks, probe, snapshot};
use crate::agent_link::Dialer;
use crate::driver::cgroup::{CgroupLayout, VmCgroup};
use crate::driver::{
    BootSpec, Capabilities, Driver, DriverError, Egress, Exit, HostFacts, HostProcesses, Instance, Limits,
};
use crate::netstack::NetStack;
use sandbox_agent::mux::Mux;
use sandbox_agent::protocol::Frame;
use sandbox_guest::handshake::GuestLimits;
use sandbox_userns::IdMapper;

/// How long a TCG boot may take to the agent's first Pong.
const BOOT_WAIT: Duration = Duration::from_secs(300);
/// What qemu needs on the host beside the guest's memory, within the
/// cgroup's memory limit: TCG's translated-code buffer alone may grow to
/// 1 GiB (qemu's default on a host this size), and a limit below it would
/// have the host kill qemu, not the guest its own processes.
const QEMU_OVERHEAD_BYTES: u64 = 1 << 30;
/// Host tasks per VM in its cgroup: qemu's threads (vCPUs, I/O) and
/// virtiofsd's; the guest's own processes are the guest kernel's.
const QEMU_PIDS: u32 = 512;

/// The qemu driver of this helper.
#[derive(Debug)]
pub struct QemuDriver {
    /// The kernel and initramfs of this helper, or why they are not found.
    assets: Mutex<Result<Assets, String>>,
    /// Whether to look for missing assets again at the next request: a
    /// helper's own, which `make vm` may give them while it runs (a test's
    /// driver keeps what it was given).
    look_again: bool,
    mapper: Result<IdMapper, String>,
    accel: tokio::sync::OnceCell<Accel>,
    /// Layer disks, built once per layer.
    disk_cache: PathBuf,
    /// Per-VM sockets and consoles (short paths: sockets).
    run_root: PathBuf,
    /// Memory snapshots and the warm pool.
    warm: Arc<Warm>,
    /// Where the per-VM cgroups go, or why VMs run without host limits.
    cgroups: Result<CgroupLayout, String>,
}

/// A started vm for a sandbox: qemu, its run dir, the agent's first
/// connection, and where it came from.
type Created = (QemuInstance, PathBuf, Mux, Origin);

/// Where a vm came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A restored vm waiting in the warm pool.
    Pool,
    /// Restored from its shape's memory snapshot on demand.
    Snapshot,
    /// The kernel booted; why no snapshot served.
    Cold {
        /// No snapshot yet, a stale one, or why restoring failed.
        reason: String,
    },
    /// Left running by a helper that died, and adopted ([`super::adopt`]).
    Kept,
}

impl QemuDriver {
    /// Finds the kernel and initramfs of this helper binary and its id map.
    pub fn detect() -> Self {
        Self { look_again: true, ..Self::with_assets(Assets::for_this_helper().map_err(|e| e.to_string())) }
    }

    /// A driver booting `assets` (tests boot the helper binary's initramfs
    /// from their own process).
    pub fn with_assets(assets: Result<Assets, String>) -> Self {
        let mapper = IdMapper::detect();
        let run_root = sandbox_base::paths::runtime_dir().join("qemu");
        let templates = super::assets::vm_dir().join("templates");
        QemuDriver {
            assets: Mutex::new(assets),
            look_again: false,
            mapper,
            accel: tokio::sync::OnceCell::new(),
            disk_cache: super::assets::vm_dir().join("disks"),
            warm: Arc::new(Warm::new(super::pool::configured_size(), templates, run_root.clone())),
            run_root,
            cgroups: Err("no cgroup layout was given to the vm driver".into()),
        }
    }

    /// Runs each VM's qemu in a cgroup of `layout` (the namespace driver's),
    /// or without host limits for the reason given; template and pool vms
    /// too, in groups of their own until one is handed out.
    pub fn with_cgroups(mut self, layout: Result<CgroupLayout, String>) -> Self {
        if let Ok(l) = &layout {
            self.warm.limit(l.clone());
        }
        self.cgroups = layout;
        self
    }

    /// This driver with its vms' run dirs under `dir/run`, memory snapshots
    /// under `dir/templates` and a warm pool of `pool_size` vms per shape
    /// (tests keep theirs apart).
    pub fn with_warm(mut self, dir: &Path, pool_size: usize) -> Self {
        self.run_root = dir.join("run");
        let templates = dir.join("templates");
        self.warm = Arc::new(Warm::new(pool_size, templates, self.run_root.clone()));
        if let Ok(l) = &self.cgroups {
            self.warm.limit(l.clone());
        }
        self
    }

    /// At helper start, before adopting: kills the template and pool vms a
    /// dead helper left running (no sandbox's record names their run dir),
    /// which would only take the CPU the adopted vms' agents need to
    /// answer in time.
    pub fn kill_idle_leftovers(&self) {
        let sandboxes = super::adopt::recorded_run_dirs();
        self.reap_run_dirs(|dir| !sandboxes.contains(dir));
    }

    /// At helper start, after adopting what it could ([`super::adopt`]):
    /// kills the keeper (qemu first) of every other vm a dead helper left
    /// running (sandboxes' vms that could not be adopted; virtiofsd ends
    /// with its qemu's connection) and removes their run dirs. A vm of a
    /// live helper sharing the run dirs, this one's adopted vms included,
    /// and one of another state dir's helpers (which shares the runtime
    /// dir) are left alone. A sandbox whose vm this killed is lost to the
    /// orchestrator, its writable disk kept.
    pub fn kill_leftovers(&self) {
        self.reap_run_dirs(|_| true);
    }

    /// Kills what a dead helper left running in the run dirs `chosen`
    /// picks, and removes them (see [`kill_leftovers`](Self::kill_leftovers)).
    fn reap_run_dirs(&self, chosen: impl Fn(&Path) -> bool) {
        use crate::leftovers::{Reaped, reap};
        let ours = sandbox_base::paths::state_dir();
        for entry in std::fs::read_dir(&self.run_root).into_iter().flatten().flatten() {
            let dir = entry.path();
            // Another state dir's helper's: its own next helper adopts it.
            if !chosen(&dir)
                || std::fs::read(dir.join(OWNER_RECORD)).is_ok_and(|o| o != ours.as_os_str().as_encoded_bytes())
            {
                continue;
            }
            match reap(&dir.join(KEEPER_RECORD)) {
                Reaped::Owned => continue,
                Reaped::Killed(pid) => {
                    tracing::warn!(vm = %entry.file_name().to_string_lossy(), keeper = pid, "killed a vm a dead helper left running");
                }
                Reaped::Gone => {}
            }
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    /// The kernel and initramfs, looked for again while missing (see
    /// `look_again`): the first request after `make vm` finds them.
    fn assets(&self) -> Result<Assets, String> {
        let mut assets = self.assets.lock().unwrap_or_else(PoisonError::into_inner);
        if assets.is_err()
            && self.look_again
            && let Ok(found) = Assets::for_this_helper()
        {
            tracing::info!(initramfs = %found.initramfs.display(), "vm assets found");
            *assets = Ok(found);
        }
        assets.clone()
    }

    /// The id map virtiofsd and the disks use, or why there is none.
    pub(super) fn mapper(&self) -> Result<&IdMapper, String> {
        self.mapper.as_ref().map_err(Clone::clone)
    }

    /// Where vms' run dirs go.
    pub(super) fn run_root(&self) -> &Path {
        &self.run_root
    }

    /// Where VMs' cgroups go, if anywhere.
    pub(super) fn cgroup_layout(&self) -> Option<&CgroupLayout> {
        self.cgroups.as_ref().ok()
    }

    /// Templates and the pool.
    pub fn warm(&self) -> &Arc<Warm> {
        &self.warm
    }

    /// A vm of `shape` with the sandbox's `attach`: from the pool, else
    /// restored from the template, else booted cold.
    async fn create(&self, shape: &Shape, run_dir: &Path, attach: Attach<'_>) -> Result<Created, QemuError> {
        if let Some(mut pooled) = self.warm.take(shape) {
            // `go` moves qemu into the sandbox's group: the pool's own one
            // is empty then.
            let started = pooled.vm.go(attach, false).await;
            if started.is_err() {
                pooled.vm.kill().await;
                let _ = std::fs::remove_dir_all(&pooled.run_dir);
            }
            if let Some(cg) = &pooled.cgroup {
                cg.remove();
            }
            match started {
                Ok(stream) => return Ok((pooled.vm, pooled.run_dir, stream, Origin::Pool)),
                Err(e) => tracing::warn!(error = %e, "a pooled vm failed to start; restoring another"),
            }
        }
        let template = self.warm.template(shape);
        let reason = match template.current() {
            None => template.why_not(),
            Some(state) => match QemuInstance::start(shape, run_dir, Start::Restore(&state), None).await {
                Ok(mut vm) => match vm.go(attach, false).await {
                    Ok(stream) => return Ok((vm, run_dir.to_path_buf(), stream, Origin::Snapshot)),
                    Err(e) => {
                        vm.kill().await;
                        format!("the restored vm did not start: {e}")
                    }
                },
                Err(e) => {
                    // A state that does not load never will: made anew.
                    template.discard();
                    format!("restoring {} failed: {e}", state.display())
                }
            },
        };
        self.boot_cold(shape, run_dir, attach, reason).await
    }

    async fn boot_cold(
        &self,
        shape: &Shape,
        run_dir: &Path,
        attach: Attach<'_>,
        reason: String,
    ) -> Result<Created, QemuError> {
        tracing::info!(%reason, "vm boots cold");
        let mut vm = QemuInstance::start(shape, run_dir, Start::Cold, None).await?;
        match vm.go(attach, true).await {
            Ok(stream) => Ok((vm, run_dir.to_path_buf(), stream, Origin::Cold { reason })),
            Err(e) => {
                vm.kill().await;
                Err(e)
            }
        }
    }

    /// Boots a vm for `spec` (what [`Driver::boot`] does), the vm's own
    /// type: its [`Origin`] says whether the pool or a snapshot served it.
    pub async fn boot_vm(&self, spec: &BootSpec) -> Result<Arc<VmInstance>, DriverError> {
        let assets = self.assets().map_err(unavailable)?;
        let assets = &assets;
        let mapper = self.mapper.as_ref().map_err(unavailable)?;
        if let Some(Egress::Frames(_)) = &spec.egress {
            return Err(unavailable("the vm driver's card is served by the helper's own stack, not a frame socket"));
        }
        let mut workspace = None;
        for m in &spec.mounts {
            if m.guest != Path::new("/workspace") || m.read_only {
                return Err(unavailable(format!(
                    "the vm driver shares only a writable /workspace, not {}",
                    m.guest.display()
                )));
            }
            workspace = Some(m.host.clone());
        }
        let accel = self.accel(assets).await.clone();
        let (layers, cache, m) = (spec.layers.clone(), self.disk_cache.clone(), mapper.clone());
        let layers = tokio::task::spawn_blocking(move || {
            layers.iter().map(|l| disks::layer_disk(l, &cache, &m)).collect::<Result<Vec<_>, _>>()
        })
        .await
        .map_err(|e| DriverError::InitFailed(format!("layer disks: {e}")))?
        .map_err(|e| DriverError::InitFailed(e.to_string()))?;
        // Made at the first boot from the layer dir the helper prepared
        // (seeded files, a clone's copy), then kept: the writable layer
        // survives a stop as on the namespace driver. Sized to the disk
        // quota (sparse), so the guest's writes there meet ENOSPC at it.
        let upper = spec.dir.join("upper.ext4");
        if !upper.exists() {
            let (disk, dir, m, size) = (upper.clone(), spec.dir.clone(), mapper.clone(), spec.disk_bytes);
            tokio::task::spawn_blocking(move || disks::upper_disk_from(&disk, size, &dir, &m))
                .await
                .map_err(|e| DriverError::InitFailed(format!("writable disk: {e}")))?
                .map_err(|e| DriverError::InitFailed(e.to_string()))?;
        }
        let cgroup = match &self.cgroups {
            Ok(layout) => Some(layout.create(&spec.id, host_limits(spec.limits.cpus, spec.limits.memory_bytes))?),
            Err(_) => None,
        };
        let share = match &workspace {
            Some(host) => Some(Share::of(host, &spec.id).map_err(|e| DriverError::InitFailed(e.to_string()))?),
            None => None,
        };
        let shape = Shape {
            kernel: assets.kernel.clone(),
            initramfs: assets.initramfs.clone(),
            accel,
            layers,
            cpus: spec.limits.cpus.max(1),
            memory_mib: (spec.limits.memory_bytes >> 20).max(256),
            network: spec.egress.is_some(),
        };
        let attach = Attach {
            hostname: &spec.hostname,
            upper: &upper,
            workspace: share.as_ref().map(Share::path),
            mapper,
            cgroup: cgroup.as_ref(),
            limits: guest_limits(&spec.limits),
        };
        let run_dir = self.run_root.join(&spec.id);
        let failed = |e: String| {
            if let Some(cg) = &cgroup {
                cg.remove();
            }
            DriverError::InitFailed(e)
        };
        let created = self.create(&shape, &run_dir, attach).await;
        let (mut vm, run_dir, transport, origin) = created.map_err(|e| failed(e.to_string()))?;
        // The policy is the sandbox's, known only now: a pooled vm's card
        // waited connected and unread until here.
        let net = match (vm.take_network(), &spec.egress) {
            (Some(card), Some(Egress::Stack(policy, events))) => match card.serve(policy.clone(), events.clone()) {
                Ok(net) => Some(net),
                Err(e) => {
                    vm.kill().await;
                    return Err(failed(e.to_string()));
                }
            },
            _ => None,
        };
        self.warm.warm_up(shape);
        let mux = transport;
        let mut ping = mux.open(Frame::Ping)?;
        match tokio::time::timeout(BOOT_WAIT, ping.next()).await {
            Ok(Ok(Some(Frame::Pong))) => {}
            Ok(other) => return Err(DriverError::InitFailed(format!("the agent answered {other:?} to ping"))),
            Err(_) => return Err(DriverError::Timeout("the vm's agent")),
        }
        // The sandbox's from here: a helper dying now leaves it to the next.
        let share_mount = share.as_ref().filter(|s| s.is_mounted()).map(|s| s.path().to_path_buf());
        super::adopt::Hosted { run_dir: run_dir.clone(), share_mount }.record(&spec.dir, vm.keeper_pid());
        Ok(Arc::new(VmInstance::new(vm, mux, mapper.clone(), run_dir, origin, cgroup, share, net, self)))
    }

    /// KVM or TCG, probed once.
    pub async fn accel(&self, assets: &Assets) -> &Accel {
        // Of this process: doctor may probe while a helper does.
        let dir = self.run_root.join(format!("probe-{}", std::process::id()));
        let memo = super::assets::vm_dir().join(super::assets::ACCEL_MEMO);
        self.accel
            .get_or_init(|| async move {
                let accel = probe::detect(assets, &dir, &memo).await;
                let _ = std::fs::remove_dir_all(&dir);
                accel
            })
            .await
    }
}

/// The host limits of a vm's cgroup (qemu and virtiofsd): `cpus`, the
/// guest's `memory_bytes` (at least 256 MiB, as `-m`) plus qemu's own
/// overhead, and qemu's tasks.
pub(super) fn host_limits(cpus: u32, memory_bytes: u64) -> Limits {
    Limits { cpus, memory_bytes: memory_bytes.max(256 << 20) + QEMU_OVERHEAD_BYTES, pids: QEMU_PIDS }
}

/// What the guest enforces on the sandbox's processes: its task limit, and
/// its memory limit, which also holds when below the shape's RAM (at least
/// 256 MiB, and one memory snapshot serves every limit of a shape).
fn guest_limits(limits: &Limits) -> GuestLimits {
    GuestLimits {
        pids: (limits.pids > 0).then_some(u64::from(limits.pids)),
        memory_bytes: (limits.memory_bytes > 0).then_some(limits.memory_bytes),
    }
}

fn unavailable(e: impl std::fmt::Display) -> DriverError {
    DriverError::Unavailable(e.to_string())
}

#[tonic::async_trait]
impl Driver for QemuDriver {
    fn name(&self) -> &'static str {
        "vm"
    }

    fn unavailable_reason(&self) -> Option<String> {
        if let Some(reason) = self.assets().err().or_else(|| self.mapper.as_ref().err().cloned()) {
            return Some(reason);
        }
        if !on_path(super::QEMU) {
            return Some(format!("{} is not installed: {}", super::QEMU, super::INSTALL_HINT));
        }
        // Every sandbox shares its /workspace through it.
        if !Path::new(VIRTIOFSD).is_file() {
            return Some(format!("{VIRTIOFSD} is missing: {}", super::INSTALL_HINT));
        }
        None
    }

    fn capabilities(&self) -> Capabilities {
        let cgroups = self.cgroups.as_ref().ok();
        Capabilities {
            tty: true,
            own_kernel: true,
            dial: true,
            snapshot: true,
            network_egress: true,
            containers: true,
            limits: cgroups.is_some(),
            cgroups: cgroups.map(CgroupLayout::capability),
            ..Capabilities::default()
        }
    }

    async fn boot(&self, spec: &BootSpec) -> Result<Arc<dyn Instance>, DriverError> {
        Ok(self.boot_vm(spec).await?)
    }

    async fn adopt(&self, spec: &BootSpec, keeper: &crate::driver::Orphan) -> Result<Arc<dyn Instance>, DriverError> {
        if let Some(reason) = self.unavailable_reason() {
            return Err(DriverError::Unavailable(reason));
        }
        Ok(self.adopt_vm(spec, keeper).await?)
    }

    fn keep_warm(&self) {
        // Templates this helper cannot use go first (another kernel or
        // helper build, a deleted image); shapes booted before have
        // templates: their pools fill now; others get theirs after their
        // first boot.
        // (Without assets no vm boots: nothing to keep warm.)
        if let Ok(assets) = self.assets() {
            self.warm.keep_warm(&assets);
        }
    }

    async fn release(&self) {
        self.warm.drain().await;
    }
}

/// Whether `program` is an executable file in a directory of `PATH`.
fn on_path(program: &str) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).any(|dir| {
        std::fs::metadata(dir.join(program)).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

/// One booted vm.
pub struct VmInstance {
    mux: Mux,
    listener: Arc<tokio::net::UnixListener>,
    pid: u32,
    /// qemu's pidfd: what kills it (its pid may be another process's once
    /// its keeper reaped it).
    qemu: Option<std::os::fd::OwnedFd>,
    qmp: PathBuf,
    vm: Mutex<Option<QemuInstance>>,
    mapper: IdMapper,
    run_dir: PathBuf,
    origin: Origin,
    /// Why qemu runs without a cgroup; empty when it has one.
    limits_not_enforced: String,
    /// The VM's cgroup, holding qemu and virtiofsd.
    cgroup: Option<VmCgroup>,
    /// Its workspace's mount for virtiofsd, released at cleanup.
    share: Mutex<Option<Share>>,
    /// The EGRESS stack; it ends with qemu's connection, or with this.
    _net: Option<NetStack>,
}

impl std::fmt::Debug for VmInstance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VmInstance").field("pid", &self.pid).field("run_dir", &self.run_dir).finish_non_exhaustive()
    }
}

impl VmInstance {
    /// A vm `driver` started or adopted, its agent answering on `mux`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        vm: QemuInstance,
        mux: Mux,
        mapper: IdMapper,
        run_dir: PathBuf,
        origin: Origin,
        cgroup: Option<VmCgroup>,
        share: Option<Share>,
        net: Option<NetStack>,
        driver: &QemuDriver,
    ) -> Self {
        VmInstance {
            mux,
            listener: vm.listener(),
            pid: vm.pid().unwrap_or(0),
            qemu: vm.pidfd().ok(),
            qmp: vm.qmp_socket().to_path_buf(),
            vm: Mutex::new(Some(vm)),
            mapper,
            run_dir,
            origin,
            limits_not_enforced: driver.cgroups.as_ref().err().cloned().unwrap_or_default(),
            cgroup,
            share: Mutex::new(share),
            _net: net,
        }
    }

    /// Where this vm came from.
    pub fn origin(&self) -> &Origin {
        &self.origin
    }

    /// Runs argv in the guest and returns its stdout; a nonzero exit is an
    /// error carrying stderr.
    async fn output(&self, argv: Vec<String>) -> Result<Vec<u8>, String> {
        crate::guest::output(&self.mux, argv).await
    }
}

impl Instance for VmInstance {
    fn connection(&self) -> Mux {
        self.mux.clone()
    }

    fn agent_dialer(&self) -> Dialer {
        let listener = self.listener.clone();
        Arc::new(move || {
            let listener = listener.clone();
            Box::pin(async move {
                let (stream, _) = tokio::time::timeout(Duration::from_secs(10), listener.accept())
                    .await
                    .map_err(|_| std::io::Error::other("qemu did not reconnect to the agent socket"))??;
                Ok(Mux::open_side(stream))
            })
        })
    }

    fn request_stop(&self) {
        // The guest has no shutdown path of its own yet: qemu quits, once
        // the guest wrote what its page cache holds to its writable disk
        // (the layer survives a stop, as on the namespace driver). The
        // caller's grace period bounds the whole.
        let (qmp, mux) = (self.qmp.clone(), self.mux.clone());
        tokio::spawn(async move {
            if let Err(e) = crate::guest::output(&mux, vec!["sync".into()]).await {
                tracing::warn!(error = %e, "the vm's writable disk was not synced before its stop");
            }
            if let Ok(mut q) = super::qmp::Qmp::connect(&qmp, Duration::from_secs(5)).await {
                let _ = q.quit().await;
            }
        });
    }

    fn kill(&self) {
        if let Some(qemu) = &self.qemu {
            crate::driver::network::pidfd_kill(qemu, libc::SIGKILL);
        }
    }

    fn take_exit(&self) -> Option<Exit> {
        let mut vm = self.vm.lock().unwrap_or_else(PoisonError::into_inner).take()?;
        Some(Box::pin(async move { vm.wait().await.to_string() }))
    }

    fn snapshot_layer(&self, _upper: &Path, dst: &Path) -> Result<(), crate::HelperError> {
        // The writable layer lives on the guest's disk: the guest archives
        // it and the helper unpacks it as a store layer.
        let failed =
            |detail: String| crate::HelperError::io("snapshot the vm's writable layer", std::io::Error::other(detail));
        let tar = tokio::runtime::Handle::current()
            .block_on(async {
                self.output(vec!["sync".into()]).await?;
                self.output(sandbox_guest::layer_archive::argv()).await
            })
            .map_err(|detail| {
                // GNU tar's words for a file the guest changed mid-copy (the
                // layer is frozen while it is read, so only a guest that
                // thawed it itself gets there): the same answer as the
                // namespace driver's copy gives.
                if detail.contains(sandbox_guest::layer_archive::CHANGED) {
                    failed("the writable layer changed while being copied (the sandbox modified it); retry".into())
                } else {
                    failed(detail)
                }
            })?;
        let archive = self.run_dir.join("layer.tar");
        std::fs::write(&archive, tar).map_err(|e| failed(format!("write {}: {e}", archive.display())))?;
        let unpacked = snapshot::unpack_layer(&archive, dst, &self.mapper).map_err(|e| failed(e.to_string()));
        let _ = std::fs::remove_file(&archive);
        unpacked
    }

    fn host_facts(&self) -> HostFacts {
        HostFacts::default()
    }

    fn limits_not_enforced(&self) -> String {
        self.limits_not_enforced.clone()
    }

    fn host_processes(&self) -> Option<HostProcesses> {
        None
    }

    fn cleanup(&self) {
        let _ = std::fs::remove_dir_all(&self.run_dir);
        drop(self.share.lock().unwrap_or_else(PoisonError::into_inner).take());
        if let Some(cg) = &self.cgroup {
            cg.remove();
        }
    }
}
