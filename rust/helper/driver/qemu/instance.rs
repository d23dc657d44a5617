//! One running vm: qemu, its virtiofsd, the agent's transport.
//!
//! The helper listens on the agent socket before qemu starts; qemu connects
//! to it as the virtio-serial port's host end (and again after the helper
//! restarts and listens anew), so each accepted connection is one byte
//! stream to the agent. A second port carries guest init's "go" handshake
//! ([`sandbox_guest::handshake`]). A vm's files live in its run dir: the
//! sockets, the console log, and (by default) its writable disk.
//!
//! A vm starts one of three ways ([`Start`]): cold (the kernel boots), as a
//! template (booted to the handshake and saved, see [`super::template`]),
//! or restored from a template's memory state. Only then does it get what
//! is the sandbox's own ([`Attach`]): the writable disk and `/workspace`
//! are attached over QMP on PCIe root ports, then the guest gets its "go".
//! A shape with a network card has it from the start on every way, its
//! host end the vm's own socket pair ([`super::network`]).
//!
//! qemu runs under a keeper ([`super::keeper`]), so a vm outlives a helper
//! that dies and the next one adopts it ([`Instance::adopt`]).
use std::os::fd::{AsRawFd as _, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use nix::fcntl::{Flock, FlockArg};
use serde_json::json;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{UnixListener, UnixStream};

use super::argv::{Machine, UPPER_PORT, WORKSPACE_PORT, cmdline};
use super::assets::Assets;
use super::keeper::{self, KEEP_SOCKET};
use super::network::Connected;
use super::qmp::Qmp;
use super::ram::Backing;
use super::virtiofsd::Virtiofsd;
use super::{Accel, QemuError};
use crate::driver::cgroup::VmCgroup;
use crate::driver::keep;
use crate::driver::network::{pidfd_exited, pidfd_kill};
use sandbox_agent::mux::Mux;
use sandbox_agent::protocol::Frame;
use sandbox_guest::handshake::{Go, GuestLimits, READY, ROOTED, SEED_BYTES};
use sandbox_guest::{UPPER_SERIAL, WORKSPACE_TAG};
use sandbox_userns::IdMapper;

/// The record of a vm's keeper in its run dir ([`crate::leftovers`]).
pub const KEEPER_RECORD: &str = "keeper.pid";
/// The state dir of the helper that made a run dir: helpers of other state
/// dirs share the run root and leave it alone
/// ([`super::driver::QemuDriver::kill_leftovers`]).
pub const OWNER_RECORD: &str = "state-dir";
/// How long qemu has to connect to the agent socket after it starts (it
/// does so before the guest runs).
const CONNECT_WAIT: Duration = Duration::from_secs(30);
/// How long a TCG boot may take to guest init's ready on the control port.
pub const READY_WAIT: Duration = Duration::from_secs(300);
/// How much of the console an exit report quotes.
const CONSOLE_TAIL: usize = 2048;

/// What every vm restored from one template shares: the machine, the
/// image's layer disks and the size. A template is made per shape.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Shape {
    /// The PVH kernel.
    pub kernel: PathBuf,
    /// The initramfs (named by the helper's build id).
    pub initramfs: PathBuf,
    /// KVM or TCG.
    pub accel: Accel,
    /// The image's layer disks, bottom first ([`super::disks::layer_disk`]).
    pub layers: Vec<PathBuf>,
    /// `-smp`.
    pub cpus: u32,
    /// `-m`, MiB.
    pub memory_mib: u64,
    /// A virtio-net card (EGRESS). Part of the shape, as a restored vm has
    /// exactly its template's devices; its host end is each vm's own.
    pub network: bool,
}

/// What is the sandbox's own, attached once the vm runs its shape.
#[derive(Debug, Clone, Copy)]
pub struct Attach<'a> {
    /// The vm's hostname.
    pub hostname: &'a str,
    /// The writable disk ([`super::disks::upper_disk`]).
    pub upper: &'a Path,
    /// The volume shown at `/workspace`.
    pub workspace: Option<&'a Path>,
    /// The helper's id map (virtiofsd runs under it).
    pub mapper: &'a IdMapper,
    /// The sandbox's cgroup: qemu (started for no sandbox yet when it came
    /// from the pool) and virtiofsd go into it.
    pub cgroup: Option<&'a VmCgroup>,
    /// The task and memory limits the guest enforces on the sandbox's
    /// processes (the host's cgroup only sees qemu's threads).
    pub limits: GuestLimits,
}

/// How a vm starts.
#[derive(Debug, Clone, Copy)]
pub enum Start<'a> {
    /// The kernel boots; CPUs stopped until [`Instance::go`].
    Cold,
    /// The kernel boots to guest init's handshake, to be saved; its RAM
    /// lives in this file ([`super::ram`]).
    Template(&'a Path),
    /// The memory state in this file is loaded, its RAM copied from the
    /// template's RAM file beside it; CPUs stopped until [`Instance::go`].
    Restore(&'a Path),
}

/// What to boot (cold, all at once: [`Instance::boot`]).
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
    /// A network card (EGRESS), its host end [`Instance::take_network`].
    pub network: bool,
}

impl BootSpec<'_> {
    /// The shape this boot shares with others of its image and size.
    pub fn shape(&self) -> Shape {
        Shape {
            kernel: self.assets.kernel.clone(),
            initramfs: self.assets.initramfs.clone(),
            accel: self.accel.clone(),
            layers: self.layers.clone(),
            cpus: self.cpus,
            memory_mib: self.memory_mib,
            network: self.network,
        }
    }
}

/// qemu's keeper, as this helper holds it ([`super::keeper`]).
enum Keeping {
    /// Started by this helper: its child, which exits with qemu's status.
    Started(tokio::process::Child),
    /// Adopted from a helper that died: it reports qemu's end on `conn`;
    /// `ended` once heard.
    Adopted { conn: OwnedFd, ended: Option<std::process::ExitStatus> },
}

impl Keeping {
    /// Waits for qemu's end, as its keeper tells it. Cancel-safe: a wait
    /// dropped half way loses nothing.
    async fn ended(&mut self) -> std::io::Result<std::process::ExitStatus> {
        match self {
            Keeping::Started(child) => child.wait().await.map(keeper::qemu_status),
            Keeping::Adopted { conn, ended } => {
                if let Some(status) = ended {
                    return Ok(*status);
                }
                let code = keep::wait_report(conn.try_clone()?).await;
                let status = code
                    .map(keeper::from_code)
                    .ok_or_else(|| std::io::Error::other("qemu's keeper died without saying how qemu ended"))?;
                *ended = Some(status);
                Ok(status)
            }
        }
    }
}

/// A started vm.
pub struct Instance {
    keeper: Keeping,
    /// qemu's pid and pidfd.
    qemu: (u32, OwnedFd),
    listener: Arc<UnixListener>,
    /// The first agent connection, until [`go`](Self::go) hands it out.
    agent: Option<UnixStream>,
    /// The agent connection [`warm_agent`](Self::warm_agent) opened and
    /// pinged, handed out by [`go`](Self::go).
    mux: Option<Mux>,
    control: UnixStream,
    paused: bool,
    run_dir: PathBuf,
    qmp: PathBuf,
    console: PathBuf,
    qemu_log: PathBuf,
    virtiofsd: Option<Virtiofsd>,
    /// The QMP connection a restore made, kept for [`go`](Self::go)'s
    /// commands (qemu serves one client at a time: dropped there).
    qmp_conn: Option<Qmp>,
    /// The network card's host end, until the sandbox's stack takes it.
    net: Option<Connected>,
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
    /// Starts qemu for `shape` and returns the vm with its agent connection
    /// (cold: booted and given its "go" at once).
    pub async fn boot(spec: BootSpec<'_>) -> Result<(Instance, Mux), QemuError> {
        let mut vm = Instance::start(&spec.shape(), &spec.run_dir, Start::Cold, spec.cgroup).await?;
        let attach = Attach {
            hostname: spec.hostname,
            upper: &spec.upper,
            workspace: spec.workspace.as_deref(),
            mapper: spec.mapper,
            cgroup: spec.cgroup,
            // A bare boot (the driver's tests) has no sandbox's limits.
            limits: GuestLimits::default(),
        };
        match vm.go(attach, true).await {
            Ok(stream) => Ok((vm, stream)),
            Err(e) => {
                vm.kill().await;
                Err(e)
            }
        }
    }

    /// Starts qemu for `shape` in `run_dir`, `how` says from what; waits
    /// for its agent and control connections (and, for a restore, until the
    /// state is loaded).
    pub async fn start(
        shape: &Shape,
        run_dir: &Path,
        how: Start<'_>,
        cgroup: Option<&VmCgroup>,
    ) -> Result<Instance, QemuError> {
        let dir = run_dir;
        std::fs::create_dir_all(dir).map_err(|e| QemuError::io(format!("create {}", dir.display()), e))?;
        let owner = sandbox_base::paths::state_dir();
        std::fs::write(dir.join(OWNER_RECORD), owner.as_os_str().as_encoded_bytes())
            .map_err(|e| QemuError::io(format!("write {}", dir.join(OWNER_RECORD).display()), e))?;
        let bind = |name: &str| bind(dir, name);
        // A restore holds its state locked shared from here on: the
        // template collector leaves a state in use alone (see
        // super::template). Its RAM starts as the template's, copied.
        let restore = match how {
            Start::Restore(state) => {
                let file =
                    std::fs::File::open(state).map_err(|e| QemuError::io(format!("open {}", state.display()), e))?;
                let file = Flock::lock(file, FlockArg::LockShared)
                    .map_err(|(_, e)| QemuError::io(format!("lock {}", state.display()), e.into()))?;
                let ram = super::template::ram_of(state);
                let size = shape.memory_mib << 20;
                let ram = tokio::task::spawn_blocking(move || super::ram::from_template(&ram, size))
                    .await
                    .map_err(|e| QemuError::io("copy the template's memory", std::io::Error::other(e)))??;
                Some((file, ram))
            }
            Start::Cold | Start::Template(_) => None,
        };
        let memory = match (how, &restore) {
            (_, Some((_, ram))) => Backing::File(format!("/dev/fd/{}", ram.as_raw_fd()).into()),
            (Start::Template(ram), _) => Backing::File(ram.to_path_buf()),
            _ => Backing::Memfd,
        };
        let (listener, agent_socket) = bind("agent.sock")?;
        let (control_listener, control_socket) = bind("control.sock")?;
        let card = if shape.network { Some(super::network::pair()?) } else { None };
        let machine = Machine {
            accel: shape.accel.name(),
            cpus: shape.cpus,
            memory_mib: shape.memory_mib,
            memory,
            kernel: shape.kernel.clone(),
            initramfs: shape.initramfs.clone(),
            cmdline: cmdline(shape.layers.len(), false),
            layers: shape.layers.clone(),
            agent_socket,
            control_socket: Some(control_socket),
            network: card.as_ref().map(|(qemu, _)| qemu.as_raw_fd()),
            qmp_socket: dir.join("qmp.sock"),
            console_log: dir.join("console.log"),
            incoming: matches!(how, Start::Restore(_)),
            paused: !matches!(how, Start::Template(_)),
        };
        // qemu names these by number: its RAM, its end of the card.
        let pass: Vec<RawFd> = restore
            .as_ref()
            .map(|(_, ram)| ram.as_raw_fd())
            .into_iter()
            .chain(card.as_ref().map(|(qemu, _)| qemu.as_raw_fd()))
            .collect();
        let log = std::fs::File::create(qemu_log(&machine)).map_or(Stdio::null(), Stdio::from);
        let link = card.as_ref().map(|(_, helper)| helper.fd());
        let kept = keeper::start(machine.argv(), &pass, link, &dir.join(KEEP_SOCKET), log).await?;
        // The keeper outlives a helper killed outright: the next one adopts
        // its vm, or kills it by this record (QemuDriver::kill_leftovers).
        if let Some(pid) = kept.keeper.id() {
            crate::leftovers::record(&dir.join(KEEPER_RECORD), pid);
        }
        if let Some(cg) = cgroup {
            into_cgroup(cg, kept.pid, &kept.pidfd)?;
        }
        let qemu_log = qemu_log(&machine);
        let mut vm = Instance {
            keeper: Keeping::Started(kept.keeper),
            qemu: (kept.pid, kept.pidfd),
            listener: Arc::new(listener),
            agent: None,
            mux: None,
            // Replaced below; a placeholder keeps the struct whole meanwhile.
            control: UnixStream::pair().map_err(|e| QemuError::io("socketpair", e))?.0,
            paused: machine.paused,
            run_dir: dir.to_path_buf(),
            qmp: machine.qmp_socket,
            console: machine.console_log,
            qemu_log,
            virtiofsd: None,
            qmp_conn: None,
            net: card.map(|(_, helper)| helper),
        };
        let started = async {
            vm.agent = Some(vm.accept(CONNECT_WAIT).await?);
            let control = tokio::time::timeout(CONNECT_WAIT, control_listener.accept())
                .await
                .map_err(|_| QemuError::Timeout { what: "qemu to connect to the control socket", secs: 30 })?
                .map_err(|e| QemuError::io("accept qemu's control connection", e))?;
            vm.control = control.0;
            if let Some((state, ram)) = restore {
                // qemu holds its own copy of the RAM's fd now.
                drop(ram);
                let mut qmp = vm.qmp().await?;
                qmp.migrate_from_file(&state).await?;
                vm.qmp_conn = Some(qmp);
            }
            Ok(())
        };
        match started.await {
            Ok(()) => Ok(vm),
            Err(e) => {
                let exit = vm.kill().await;
                Err(with_output(e, &exit))
            }
        }
    }

    /// Waits for guest init's [`READY`] on the control port: it waits for
    /// its "go", nothing sandbox-specific attached or mounted yet.
    pub async fn wait_ready(&mut self, wait: Duration) -> Result<(), QemuError> {
        self.wait_for(READY, "guest init to be ready", wait).await
    }

    /// Waits for guest init to say `line` on the control port.
    async fn wait_for(&mut self, line: &str, what: &'static str, wait: Duration) -> Result<(), QemuError> {
        let mut got = Vec::new();
        // Ok(false): the port closed, which a qemu that is exiting does.
        let read = async {
            while !got.ends_with(line.as_bytes()) {
                let mut byte = [0u8; 1];
                let n = self.control.read(&mut byte).await.map_err(|e| QemuError::io("read the control port", e))?;
                if n == 0 {
                    return Ok(false);
                }
                got.push(byte[0]);
            }
            Ok(true)
        };
        let status = tokio::select! {
            r = tokio::time::timeout(wait, read) => match r {
                Ok(Ok(true)) => return Ok(()),
                Ok(Ok(false)) => match tokio::time::timeout(CONNECT_WAIT, self.keeper.ended()).await {
                    Ok(status) => status,
                    Err(_) => return Err(QemuError::Exited(format!("the control port closed while waiting for {what}"))),
                },
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err(QemuError::Timeout { what, secs: wait.as_secs() }),
            },
            status = self.keeper.ended() => status,
        };
        let status = status.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string());
        Err(QemuError::Exited(format!("{status}; {}", self.output())))
    }

    /// Resumes a restored vm before its hand-out and pings its agent
    /// (started before the template's snapshot): its code is then
    /// translated, under TCG, while the vm waits in the pool rather than
    /// while a sandbox waits for it. Guest init still waits for its "go".
    pub async fn warm_agent(&mut self) -> Result<(), QemuError> {
        if self.paused {
            // The restore's own connection: qemu serves one QMP client at a time.
            let mut qmp = match self.qmp_conn.take() {
                Some(q) => q,
                None => self.qmp().await?,
            };
            qmp.execute_all(&[("cont", None)]).await?;
            self.paused = false;
        }
        let stream = match self.agent.take() {
            Some(s) => s,
            None => self.accept(CONNECT_WAIT).await?,
        };
        let mux = Mux::open_side(stream);
        let mut ping = mux.open(Frame::Ping).map_err(|e| QemuError::Exited(format!("ping the agent: {e}")))?;
        match tokio::time::timeout(READY_WAIT, ping.next()).await {
            Ok(Ok(Some(Frame::Pong))) => {}
            Ok(other) => return Err(QemuError::Exited(format!("the agent answered {other:?} to ping"))),
            Err(_) => return Err(QemuError::Timeout { what: "the agent's first pong", secs: READY_WAIT.as_secs() }),
        }
        self.mux = Some(mux);
        Ok(())
    }

    /// Attaches what is the sandbox's own (the writable disk, `/workspace`
    /// with its virtiofsd), resumes the CPUs and gives guest init its "go"
    /// (waiting for its ready first on a cold boot, so the clock it gets is
    /// the time it reads it), and waits until the sandbox's root is made and
    /// the agent runs in it. Returns the agent's connection.
    pub async fn go(&mut self, attach: Attach<'_>, wait_ready: bool) -> Result<Mux, QemuError> {
        if let Some(cg) = attach.cgroup {
            into_cgroup(cg, self.qemu.0, &self.qemu.1)?;
        }
        if let Some(source) = attach.workspace {
            let socket = self.run_dir.join("workspace.sock");
            self.virtiofsd = Some(Virtiofsd::start(source, &socket, attach.mapper, attach.cgroup)?);
        }
        let mut qmp = match self.qmp_conn.take() {
            Some(q) => q,
            None => self.qmp().await?,
        };
        let upper = attach.upper.to_string_lossy();
        let mut commands = vec![
            (
                "blockdev-add",
                Some(json!({ "driver": "raw", "node-name": "upper", "discard": "unmap",
                              "file": { "driver": "file", "filename": upper } })),
            ),
            (
                "device_add",
                Some(json!({ "driver": "virtio-blk-pci", "id": "upper-disk", "drive": "upper",
                              "serial": UPPER_SERIAL, "bus": UPPER_PORT })),
            ),
        ];
        if let Some(d) = &self.virtiofsd {
            let path = d.socket().to_string_lossy();
            commands.push((
                "chardev-add",
                Some(json!({ "id": "workspace", "backend": { "type": "socket", "data": {
                    "addr": { "type": "unix", "data": { "path": path } }, "server": false } } })),
            ));
            commands.push((
                "device_add",
                Some(json!({ "driver": "vhost-user-fs-pci", "id": "workspace-fs", "chardev": "workspace",
                              "tag": WORKSPACE_TAG, "bus": WORKSPACE_PORT })),
            ));
        }
        if self.paused {
            commands.push(("cont", None));
        }
        qmp.execute_all(&commands).await?;
        self.paused = false;
        // qemu serves one QMP client at a time.
        drop(qmp);
        if wait_ready {
            self.wait_ready(READY_WAIT).await?;
        }
        let go = Go {
            hostname: attach.hostname.to_string(),
            workspace: attach.workspace.is_some(),
            time_ns: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()),
            seed: seed()?,
            limits: attach.limits,
        };
        self.control
            .write_all(go.encode().as_bytes())
            .await
            .map_err(|e| QemuError::io("write go on the control port", e))?;
        self.wait_for(ROOTED, "guest init to make the sandbox's root", READY_WAIT).await?;
        if let Some(mux) = self.mux.take() {
            return Ok(mux);
        }
        let stream = match self.agent.take() {
            Some(stream) => stream,
            None => self.accept(CONNECT_WAIT).await?,
        };
        Ok(Mux::open_side(stream))
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
            status = self.keeper.ended() => {
                let status = status.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string());
                Err(QemuError::Exited(format!("{status}; {}", self.output())))
            }
        }
    }

    /// The network card's host end (a shape with one), for the sandbox's
    /// stack; once.
    pub fn take_network(&mut self) -> Option<Connected> {
        self.net.take()
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

    /// Takes over the vm in `run_dir` that a helper which died left
    /// running, handed over by its keeper ([`keep::reclaim`]): listens on
    /// its agent socket again, where qemu reconnects the agent's port
    /// ([`accept`](Self::accept) takes that connection). Call
    /// [`confirm`](Self::confirm) once the vm answers.
    pub fn adopt(run_dir: &Path, kept: keep::Kept) -> Result<Instance, QemuError> {
        let keep::Kept { pid1, pid1fd, control: _, link, conn } = kept;
        let (listener, _) = bind(run_dir, "agent.sock")?;
        Ok(Instance {
            keeper: Keeping::Adopted { conn, ended: None },
            qemu: (pid1 as u32, pid1fd),
            listener: Arc::new(listener),
            agent: None,
            mux: None,
            // Guest init spoke its last on the control port at the start.
            control: UnixStream::pair().map_err(|e| QemuError::io("socketpair", e))?.0,
            paused: false,
            run_dir: run_dir.to_path_buf(),
            qmp: run_dir.join("qmp.sock"),
            console: run_dir.join("console.log"),
            qemu_log: run_dir.join("qemu.log"),
            virtiofsd: None,
            qmp_conn: None,
            net: link.map(Connected::from),
        })
    }

    /// Tells an adopted vm's keeper that this helper holds the vm now.
    pub fn confirm(&self) -> Result<(), QemuError> {
        match &self.keeper {
            Keeping::Adopted { conn, .. } => {
                keep::confirm(conn).map_err(|e| QemuError::io("confirm the adoption", std::io::Error::other(e)))
            }
            Keeping::Started(_) => Ok(()),
        }
    }

    /// The keeper's pid, for a vm this helper started.
    pub fn keeper_pid(&self) -> Option<u32> {
        match &self.keeper {
            Keeping::Started(child) => child.id(),
            Keeping::Adopted { .. } => None,
        }
    }

    /// qemu's pid, while it runs (its keeper reaps it at once: past its
    /// end the number may name another process).
    pub fn pid(&self) -> Option<u32> {
        (!pidfd_exited(&self.qemu.1)).then_some(self.qemu.0)
    }

    /// A copy of qemu's pidfd, to signal it by.
    pub fn pidfd(&self) -> std::io::Result<OwnedFd> {
        self.qemu.1.try_clone()
    }

    /// Kills qemu (SIGKILL) and waits for it and virtiofsd.
    pub async fn kill(&mut self) -> Exit {
        pidfd_kill(&self.qemu.1, libc::SIGKILL);
        self.wait().await
    }

    /// Asks qemu to quit over QMP, killing it if that fails or it takes
    /// longer than `grace`; then waits.
    pub async fn stop(&mut self, grace: Duration) -> Exit {
        // Its own connection would keep the one below waiting.
        self.qmp_conn = None;
        let quit = async {
            let mut qmp = self.qmp().await?;
            qmp.quit().await
        };
        if tokio::time::timeout(grace, quit).await.map_or(true, |r| r.is_err()) {
            pidfd_kill(&self.qemu.1, libc::SIGKILL);
        }
        match tokio::time::timeout(grace, self.keeper.ended()).await {
            Ok(_) => self.wait().await,
            Err(_) => self.kill().await,
        }
    }

    /// Waits for qemu to exit (the guest powered off, panicked, or qemu was
    /// killed), then for virtiofsd; says how it ended.
    pub async fn wait(&mut self) -> Exit {
        let status = self.keeper.ended().await;
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

/// The seed a guest's RNG gets at its "go".
fn seed() -> Result<[u8; SEED_BYTES], QemuError> {
    use std::io::Read as _;
    let mut seed = [0u8; SEED_BYTES];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut seed))
        .map_err(|e| QemuError::io("read /dev/urandom for the guest's seed", e))?;
    Ok(seed)
}

/// `e` with what qemu and the console said, when qemu exited.
fn with_output(e: QemuError, exit: &Exit) -> QemuError {
    match e {
        QemuError::Exited(_) => e,
        other => {
            let tail = exit.console_tail.trim();
            if tail.is_empty() { other } else { QemuError::Exited(format!("{other}; {tail}")) }
        }
    }
}

/// Where qemu's stderr goes: next to the console log.
fn qemu_log(machine: &Machine) -> PathBuf {
    machine.console_log.with_file_name("qemu.log")
}

/// Starts qemu with `machine`'s arguments as this helper's own child,
/// dying with it: the KVM probe's, which nothing needs to outlive a helper
/// (a vm's qemu runs under its keeper, [`Instance::start`]).
pub fn spawn(machine: &Machine) -> Result<tokio::process::Child, QemuError> {
    let mut cmd = tokio::process::Command::from(super::command(machine.argv(), Vec::new()));
    // qemu's own complaints (a bad option, a missing file) go next to the
    // console, where an exit report finds them.
    cmd.stderr(std::fs::File::create(qemu_log(machine)).map_or(Stdio::null(), Stdio::from)).kill_on_drop(true);
    cmd.spawn().map_err(super::spawn_error)
}

/// Listens on `dir/name`, replacing a stale socket.
fn bind(dir: &Path, name: &str) -> Result<(UnixListener, PathBuf), QemuError> {
    let path = dir.join(name);
    let _ = std::fs::remove_file(&path);
    UnixListener::bind(&path)
        .map(|l| (l, path.clone()))
        .map_err(|e| QemuError::io(format!("bind {}", path.display()), e))
}

/// Moves qemu (`pid`, `pidfd`) into a vm's cgroup. Its keeper reaps it at
/// once, so the pid is checked after the move: a qemu still running then
/// was the process moved (a live process keeps its pid).
fn into_cgroup(cg: &VmCgroup, pid: u32, pidfd: &OwnedFd) -> Result<(), QemuError> {
    cg.add(pid as i32)
        .map_err(|e| QemuError::io("move qemu into the vm's cgroup", std::io::Error::other(e.to_string())))?;
    if pidfd_exited(pidfd) {
        return Err(QemuError::Exited("qemu exited before it joined the vm's cgroup".into()));
    }
    Ok(())
}

impl Drop for Instance {
    /// qemu goes with its handle: through its pidfd, as a qemu a guest
    /// took over may have cleared its parent-death signal (and a keeper
    /// dropped with this is killed).
    fn drop(&mut self) {
        pidfd_kill(&self.qemu.1, libc::SIGKILL);
    }
}
