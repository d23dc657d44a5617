//! The `vm` driver behind the seam ([`crate::helper::driver::Driver`]):
//! boots a qemu microVM per sandbox and hands the helper the agent's
//! multiplexed connection over the virtio-serial port.
//!
//! EGRESS goes through the helper's network stack, with the sandbox's
//! policy, as on the namespace driver ([`super::network`]). What it does
//! not do yet, refused with the reason: shares other than `/workspace`.
//! CPUs and memory are the VM's own size (`-smp`, `-m`); no host cgroup is
//! applied yet.
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::assets::Assets;
use super::instance::{BootSpec as QemuBoot, Instance as QemuInstance};
use super::network::NetLink;
use super::{Accel, disks, probe, snapshot};
use crate::agent::mux::Mux;
use crate::agent::protocol::{ExitStatus, Frame, StartSpec};
use crate::helper::agent_link::Dialer;
use crate::helper::driver::userns::IdMapper;
use crate::helper::driver::{BootSpec, Capabilities, Driver, DriverError, Exit, HostFacts, HostProcesses, Instance};
use crate::helper::netstack::NetStack;

/// How long a TCG boot may take to the agent's first Pong.
const BOOT_WAIT: Duration = Duration::from_secs(300);
/// Size of a VM's writable disk (sparse; the disk quota's default).
const UPPER_BYTES: u64 = 10 << 30;

/// The qemu driver of this helper.
#[derive(Debug)]
pub struct QemuDriver {
    assets: Result<Assets, String>,
    mapper: Result<IdMapper, String>,
    accel: tokio::sync::OnceCell<Accel>,
    /// Layer disks, built once per layer.
    disk_cache: PathBuf,
    /// Per-VM sockets and consoles (short paths: sockets).
    run_root: PathBuf,
}

impl QemuDriver {
    /// Finds the kernel and initramfs of this helper binary and its id map.
    pub fn detect() -> Self {
        Self::with_assets(Assets::for_this_helper().map_err(|e| e.to_string()))
    }

    /// A driver booting `assets` (tests boot the helper binary's initramfs
    /// from their own process).
    pub fn with_assets(assets: Result<Assets, String>) -> Self {
        let mapper = IdMapper::detect();
        QemuDriver {
            assets,
            mapper,
            accel: tokio::sync::OnceCell::new(),
            disk_cache: super::assets::vm_dir().join("disks"),
            run_root: crate::paths::runtime_dir().join("qemu"),
        }
    }

    /// KVM or TCG, probed once.
    pub async fn accel(&self, assets: &Assets) -> &Accel {
        let dir = self.run_root.join("probe");
        self.accel.get_or_init(|| async move { probe::detect(assets, &dir).await }).await
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
        self.assets.as_ref().err().or(self.mapper.as_ref().err()).cloned()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            tty: true,
            network_egress: true,
            own_kernel: true,
            dial: true,
            snapshot: true,
            ..Capabilities::default()
        }
    }

    async fn boot(&self, spec: &BootSpec) -> Result<Arc<dyn Instance>, DriverError> {
        let assets = self.assets.as_ref().map_err(unavailable)?;
        let mapper = self.mapper.as_ref().map_err(unavailable)?;
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
        let upper = spec.dir.join("upper.ext4");
        disks::upper_disk(&upper, UPPER_BYTES).map_err(|e| DriverError::InitFailed(e.to_string()))?;
        let run_dir = self.run_root.join(&spec.id);
        let net_link = match &spec.egress {
            Some(_) => Some(NetLink::listen(&run_dir).map_err(|e| DriverError::InitFailed(e.to_string()))?),
            None => None,
        };
        let boot = QemuBoot {
            hostname: &spec.hostname,
            run_dir: run_dir.clone(),
            assets,
            accel: &accel,
            layers,
            upper,
            workspace,
            cpus: spec.limits.cpus.max(1),
            memory_mib: (spec.limits.memory_bytes >> 20).max(256),
            mapper,
            cgroup: None,
            network: net_link.as_ref().map(|l| l.path().to_path_buf()),
        };
        let (mut vm, transport) = QemuInstance::boot(boot).await.map_err(|e| DriverError::InitFailed(e.to_string()))?;
        let net = match (net_link, &spec.egress) {
            (Some(link), Some((policy, events))) => match link.attach(policy.clone(), events.clone()).await {
                Ok(net) => Some(net),
                Err(e) => {
                    vm.kill().await;
                    return Err(DriverError::InitFailed(e.to_string()));
                }
            },
            _ => None,
        };
        let mux = Mux::open_side(transport);
        let mut ping = mux.open(Frame::Ping)?;
        match tokio::time::timeout(BOOT_WAIT, ping.next()).await {
            Ok(Ok(Some(Frame::Pong))) => {}
            Ok(other) => return Err(DriverError::InitFailed(format!("the agent answered {other:?} to ping"))),
            Err(_) => return Err(DriverError::Timeout("the vm's agent")),
        }
        let pid = vm.pid().unwrap_or(0);
        let listener = vm.listener();
        Ok(Arc::new(VmInstance {
            mux,
            listener,
            pid,
            qmp: vm.qmp_socket().to_path_buf(),
            vm: Mutex::new(Some(vm)),
            mapper: mapper.clone(),
            run_dir,
            _net: net,
        }))
    }
}

/// One booted vm.
pub struct VmInstance {
    mux: Mux,
    listener: Arc<tokio::net::UnixListener>,
    pid: u32,
    qmp: PathBuf,
    vm: Mutex<Option<QemuInstance>>,
    mapper: IdMapper,
    run_dir: PathBuf,
    /// The EGRESS stack; it ends with qemu's connection, or with this.
    _net: Option<NetStack>,
}

impl std::fmt::Debug for VmInstance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VmInstance").field("pid", &self.pid).field("run_dir", &self.run_dir).finish_non_exhaustive()
    }
}

impl VmInstance {
    /// Runs argv in the guest and returns its stdout; a nonzero exit is an
    /// error carrying stderr.
    async fn output(&self, argv: Vec<String>) -> Result<Vec<u8>, String> {
        let spec = StartSpec::plain(argv);
        let mut s = self.mux.open(Frame::Start(spec)).map_err(|e| e.to_string())?;
        let (mut out, mut err) = (Vec::new(), Vec::new());
        loop {
            match s.next().await.map_err(|e| e.to_string())? {
                Some(Frame::Stdout(b)) => out.extend(b),
                Some(Frame::Stderr(b)) => err.extend(b),
                Some(Frame::Exited(ExitStatus::Code(0))) => return Ok(out),
                Some(Frame::Exited(status)) => {
                    return Err(format!("{status:?}: {}", String::from_utf8_lossy(&err).trim()));
                }
                Some(Frame::Error(e)) => return Err(e),
                Some(Frame::Fail { message, .. }) => return Err(message),
                Some(_) => {}
                None => return Err("the agent ended the stream".into()),
            }
        }
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
        // The guest has no shutdown path of its own yet: qemu quits.
        let qmp = self.qmp.clone();
        tokio::spawn(async move {
            if let Ok(mut q) = super::qmp::Qmp::connect(&qmp, Duration::from_secs(5)).await {
                let _ = q.quit().await;
            }
        });
    }

    fn kill(&self) {
        if let Ok(pid) = i32::try_from(self.pid)
            && pid > 0
        {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL);
        }
    }

    fn take_exit(&self) -> Option<Exit> {
        let mut vm = self.vm.lock().unwrap_or_else(PoisonError::into_inner).take()?;
        Some(Box::pin(async move { vm.wait().await.to_string() }))
    }

    fn snapshot_layer(&self, _upper: &Path, dst: &Path) -> Result<(), crate::helper::HelperError> {
        // The writable layer lives on the guest's disk: the guest archives
        // it and the helper unpacks it as a store layer.
        let failed = |detail: String| {
            crate::helper::HelperError::io("snapshot the vm's writable layer", std::io::Error::other(detail))
        };
        let tar = tokio::runtime::Handle::current()
            .block_on(async {
                self.output(vec!["sync".into()]).await?;
                self.output(snapshot::archive_argv()).await
            })
            .map_err(failed)?;
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
        "the vm driver sizes the VM (cpus, memory) but applies no host cgroup yet".into()
    }

    fn host_processes(&self) -> Option<HostProcesses> {
        None
    }

    fn cleanup(&self) {
        let _ = std::fs::remove_dir_all(&self.run_dir);
    }
}
