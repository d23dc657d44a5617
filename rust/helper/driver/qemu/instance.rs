//! One running vm: qemu, its virtiofsd, the agent's transport.
//!
//! The helper listens on the agent socket before qemu starts; qemu connects
//! to it as the virtio-serial port's host end (and again after the helper
//! restarts and listens anew), so each accepted connection is one byte
//! stream to the agent. A vm's files live in its run dir: the sockets, the
//! console log, and (by default) its writable disk.
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{UnixListener, UnixStream};

use super::argv::{Machine, cmdline};
use super::assets::Assets;
use super::qmp::Qmp;
use super::virtiofsd::Virtiofsd;
use super::{Accel, QEMU, QemuError};
use crate::helper::driver::cgroup::VmCgroup;
use crate::helper::driver::userns::IdMapper;

/// How long qemu has to connect to the agent socket after it starts (it
/// does so before the guest runs).
const CONNECT_WAIT: Duration = Duration::from_secs(30);
/// How much of the console an exit report quotes.
const CONSOLE_TAIL: usize = 2048;

/// What to boot.
pub struct BootSpec<'a> {
    /// The vm's hostname.
    pub hostname: &'a str,
    /// Its own directory (sockets, console), created if missing; short, as
    /// Unix socket paths are limited to 107 bytes.
    pub run_dir: PathBuf,
    /// Kernel and initramfs.
    pub assets: &'a Assets,
    /// KVM or TCG (see [`super::probe`]).
    pub accel: &'a Accel,
    /// The image's layer disks, bottom first ([`super::disks::layer_disk`]).
    pub layers: Vec<PathBuf>,
    /// The writable disk ([`super::disks::upper_disk`]).
    pub upper: PathBuf,
    /// The volume shown at `/workspace`.
    pub workspace: Option<PathBuf>,
    /// `-smp`.
    pub cpus: u32,
    /// `-m`, MiB.
    pub memory_mib: u64,
    /// The helper's id map (virtiofsd runs under it).
    pub mapper: &'a IdMapper,
    /// The sandbox's cgroup: qemu and virtiofsd are moved into it.
    pub cgroup: Option<&'a VmCgroup>,
    /// The network stack's socket ([`super::network::NetLink`]), for EGRESS.
    pub network: Option<PathBuf>,
}

/// A booted vm.
pub struct Instance {
    child: tokio::process::Child,
    listener: Arc<UnixListener>,
    qmp: PathBuf,
    console: PathBuf,
    qemu_log: PathBuf,
    virtiofsd: Option<Virtiofsd>,
}

/// How a vm ended, for the report a killed qemu or a guest panic gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exit {
    /// qemu's exit status as text ("exit status: 0", "signal: 9 (SIGKILL)").
    pub status: String,
    /// Whether qemu itself died by a signal (killed), not by the guest
    /// powering off.
    pub killed: bool,
    /// The end of qemu's messages and of the guest console (a panic's
    /// message, guest-init's error).
    pub console_tail: String,
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.killed {
            write!(f, "qemu was killed ({})", self.status)?;
        } else {
            write!(f, "the vm stopped (qemu {})", self.status)?;
        }
        let tail = self.console_tail.trim();
        if !tail.is_empty() {
            write!(f, "; guest console: {tail}")?;
        }
        Ok(())
    }
}

fn tail(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap_or_default();
    let from = bytes.len().saturating_sub(CONSOLE_TAIL);
    String::from_utf8_lossy(&bytes[from..]).into_owned()
}

impl Instance {
    /// Starts qemu (and virtiofsd for `/workspace`) and returns the vm with
    /// its first agent connection.
    pub async fn boot(spec: BootSpec<'_>) -> Result<(Instance, UnixStream), QemuError> {
        let dir = &spec.run_dir;
        std::fs::create_dir_all(dir).map_err(|e| QemuError::io(format!("create {}", dir.display()), e))?;
        let agent_socket = dir.join("agent.sock");
        let _ = std::fs::remove_file(&agent_socket);
        let listener = UnixListener::bind(&agent_socket)
            .map_err(|e| QemuError::io(format!("bind {}", agent_socket.display()), e))?;
        let virtiofsd = match &spec.workspace {
            Some(source) => Some(Virtiofsd::start(source, &dir.join("workspace.sock"), spec.mapper)?),
            None => None,
        };
        let machine = Machine {
            accel: spec.accel.name(),
            cpus: spec.cpus,
            memory_mib: spec.memory_mib,
            kernel: spec.assets.kernel.clone(),
            initramfs: spec.assets.initramfs.clone(),
            cmdline: cmdline(spec.layers.len(), spec.hostname, spec.workspace.is_some(), false),
            layers: spec.layers.clone(),
            upper: Some(spec.upper.clone()),
            workspace: virtiofsd.as_ref().map(|d| d.socket().to_path_buf()),
            agent_socket,
            network: spec.network.clone(),
            qmp_socket: dir.join("qmp.sock"),
            console_log: dir.join("console.log"),
            incoming: false,
        };
        let (child, listener) = spawn(&machine, listener, spec.cgroup)?;
        let qemu_log = qemu_log(&machine);
        let mut vm = Instance {
            child,
            listener: Arc::new(listener),
            qmp: machine.qmp_socket,
            console: machine.console_log,
            qemu_log,
            virtiofsd,
        };
        match vm.accept(CONNECT_WAIT).await {
            Ok(stream) => Ok((vm, stream)),
            Err(e) => {
                vm.kill().await;
                Err(e)
            }
        }
    }

    /// The next connection qemu makes to the agent socket (the first one,
    /// or the one after the previous connection ended): a byte stream to
    /// the agent. Fails if qemu exits first.
    pub async fn accept(&mut self, wait: Duration) -> Result<UnixStream, QemuError> {
        let listener = self.listener.clone();
        tokio::select! {
            accepted = tokio::time::timeout(wait, listener.accept()) => match accepted {
                Ok(Ok((stream, _))) => Ok(stream),
                Ok(Err(e)) => Err(QemuError::io("accept qemu's agent connection", e)),
                Err(_) => Err(QemuError::Timeout { what: "qemu to connect to the agent socket", secs: wait.as_secs() }),
            },
            status = self.child.wait() => {
                let status = status.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string());
                Err(QemuError::Exited(format!("{status}; {}", self.output())))
            }
        }
    }

    /// The agent socket's listener, for reconnections while another task
    /// waits for the vm (see [`accept`](Self::accept)).
    pub fn listener(&self) -> Arc<UnixListener> {
        self.listener.clone()
    }

    /// The QMP socket.
    pub fn qmp_socket(&self) -> &Path {
        &self.qmp
    }

    /// A QMP connection to this vm. qemu serves one client at a time: a
    /// second one (or [`stop`](Self::stop)'s) waits until it is dropped.
    pub async fn qmp(&self) -> Result<Qmp, QemuError> {
        Qmp::connect(&self.qmp, Duration::from_secs(10)).await
    }

    /// qemu's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Kills qemu (SIGKILL) and waits for it and virtiofsd.
    pub async fn kill(&mut self) -> Exit {
        let _ = self.child.start_kill();
        self.wait().await
    }

    /// Asks qemu to quit over QMP, killing it if that fails or it takes
    /// longer than `grace`; then waits.
    pub async fn stop(&mut self, grace: Duration) -> Exit {
        let quit = async {
            let mut qmp = self.qmp().await?;
            qmp.quit().await
        };
        if tokio::time::timeout(grace, quit).await.map_or(true, |r| r.is_err()) {
            let _ = self.child.start_kill();
        }
        match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(_) => self.wait().await,
            Err(_) => self.kill().await,
        }
    }

    /// Waits for qemu to exit (the guest powered off, panicked, or qemu was
    /// killed), then for virtiofsd; says how it ended.
    pub async fn wait(&mut self) -> Exit {
        let status = self.child.wait().await;
        if let Some(mut d) = self.virtiofsd.take() {
            let _ = tokio::task::spawn_blocking(move || d.stop()).await;
        }
        let (status, killed) = match status {
            Ok(s) => {
                use std::os::unix::process::ExitStatusExt as _;
                (s.to_string(), s.signal().is_some())
            }
            Err(e) => (format!("unknown ({e})"), false),
        };
        Exit { status, killed, console_tail: self.output() }
    }

    /// The end of qemu's own messages and of the guest console.
    fn output(&self) -> String {
        let (qemu, console) = (tail(&self.qemu_log), tail(&self.console));
        [qemu.trim(), console.trim()].iter().filter(|t| !t.is_empty()).copied().collect::<Vec<_>>().join("\n")
    }
}

/// Where qemu's stderr goes: next to the console log.
fn qemu_log(machine: &Machine) -> PathBuf {
    machine.console_log.with_file_name("qemu.log")
}

/// Starts qemu with `machine`'s arguments, in `cgroup` if given.
pub fn spawn(
    machine: &Machine,
    listener: UnixListener,
    cgroup: Option<&VmCgroup>,
) -> Result<(tokio::process::Child, UnixListener), QemuError> {
    let mut cmd = tokio::process::Command::new(QEMU);
    cmd.args(machine.argv())
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        // qemu's own complaints (a bad option, a missing file) go next to
        // the console, where an exit report finds them.
        .stderr(std::fs::File::create(qemu_log(machine)).map_or(Stdio::null(), Stdio::from))
        .kill_on_drop(true);
    let child = cmd.spawn().map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => {
            QemuError::NotInstalled(format!("{QEMU} is not installed: {}", super::INSTALL_HINT))
        }
        _ => QemuError::io(format!("start {QEMU}"), e),
    })?;
    if let (Some(cg), Some(pid)) = (cgroup, child.id()) {
        cg.add(pid as i32)
            .map_err(|e| QemuError::io("move qemu into the vm's cgroup", std::io::Error::other(e.to_string())))?;
    }
    Ok((child, listener))
}
