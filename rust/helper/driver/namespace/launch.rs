//! The helper side of a VM's life: prepare a launcher (map its ids, put it
//! in a cgroup), give it its VM (limits, network link, config), wait for the
//! agent; later stop and clean up. [`super::warm`] prepares launchers ahead.
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::socket::{AddressFamily, ControlMessage, MsgFlags, SockFlag, SockType, recv, send, sendmsg, socketpair};
use tokio::io::AsyncWriteExt as _;
use tokio::io::unix::AsyncFd;
use tokio::net::UnixStream;
use tokio::process::{Child, ChildStdin, Command};

use super::DriverError;
use super::cgroup::{CgroupLayout, Limits, UsageFiles, VmCgroup};
use super::init::{CONTROL_FD, InitConfig};
use crate::driver::keep;
use super::network::{pidfd_exited, pidfd_kill, pidfd_open};
use crate::driver::Egress;
use crate::netstack::NetStack;
use crate::netstack::device::LinkKind;
use sandbox_agent::mux::Mux;
use sandbox_agent::protocol::Frame;
use sandbox_userns::IdMapper;

/// Generous bound on a start; a healthy one takes milliseconds, this only
/// turns a wedged launcher into an error instead of a hung RPC.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Everything needed to start one VM.
#[derive(Debug, Clone)]
pub struct LaunchSpec {
    /// VM id (names its cgroup).
    pub id: String,
    /// What the launcher builds inside.
    pub init: InitConfig,
    /// cgroup limits.
    pub limits: Limits,
    /// EGRESS: where eth0 leads.
    pub egress: Option<Egress>,
    /// Where the agent's listening socket is created (outside the VM).
    pub agent_socket: PathBuf,
    /// Where the launcher's keeper listens (see [`super::keep`]).
    pub keeper_socket: PathBuf,
    /// The VM's directory, where its launcher is recorded for the next
    /// helper ([`crate::storage::record_launcher`]).
    pub dir: PathBuf,
}

/// A running VM's namespaces, as fds.
#[derive(Debug)]
pub struct VmNamespaces {
    /// Its user namespace: joining it gives a process the rights of the
    /// VM's root over the VM's files (and lets an ordinary user's helper
    /// enter the VM's other namespaces at all).
    pub user: OwnedFd,
    /// Its network namespace.
    pub net: OwnedFd,
}

impl VmNamespaces {
    /// The namespaces of the process `pid1` (the caller makes sure the pid
    /// names the VM's PID 1).
    fn open(pid1: i32) -> Result<Self, DriverError> {
        let open = |kind: &str| {
            std::fs::File::open(format!("/proc/{pid1}/ns/{kind}"))
                .map(OwnedFd::from)
                .map_err(|e| DriverError::io(format!("open the vm's {kind} namespace"), e))
        };
        Ok(VmNamespaces { user: open("user")?, net: open("net")? })
    }
}

/// A running VM's host-side resources.
#[derive(Debug)]
pub struct Instance {
    /// Host pid of the sandbox's PID 1.
    pub pid1: i32,
    /// Host pid of its agent (0 if it could not be told).
    pub agent: i32,
    /// The sandbox's user and network namespaces, opened once at start so
    /// Dial and layer copies never have to trust a pid that may have been
    /// reused.
    pub ns: Arc<VmNamespaces>,
    pid1fd: OwnedFd,
    /// Our end of the control socket; closing it is the lifeline cut.
    control: OwnedFd,
    cgroup: Option<VmCgroup>,
    /// The VM's network stack (EGRESS); dropped at cleanup.
    net: std::sync::Mutex<Option<NetStack>>,
    agent_socket: PathBuf,
    keeper_socket: PathBuf,
    /// The connection to the agent the start opened (and pinged).
    pub connection: Mux,
}

impl Instance {
    /// Opens another connection to the agent (after the first one died).
    pub fn agent_dialer(&self) -> crate::agent_link::Dialer {
        let path = self.agent_socket.clone();
        std::sync::Arc::new(move || {
            let path = path.clone();
            Box::pin(async move { connect_agent(&path).await })
        })
    }

    /// Asks PID 1 to SIGTERM everything in the sandbox.
    pub fn request_stop(&self) {
        let _ = send(self.control.as_raw_fd(), b"term", MsgFlags::MSG_DONTWAIT);
    }

    /// The VM's cgroup counters, when it has a cgroup.
    pub fn usage_files(&self) -> Option<UsageFiles> {
        self.cgroup.as_ref().map(VmCgroup::usage_files)
    }

    /// Kills PID 1, which takes the whole pid namespace down.
    pub fn kill(&self) {
        pidfd_kill(&self.pid1fd, libc::SIGKILL);
    }

    /// Releases what the VM held on the host; call once its launcher exited.
    pub fn cleanup(&self) {
        drop(self.net.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take());
        if let Some(cg) = &self.cgroup {
            cg.remove();
        }
        let _ = std::fs::remove_file(&self.agent_socket);
        let _ = std::fs::remove_file(&self.keeper_socket);
    }
}

/// A launcher ready for any VM: it has unshared its user and network
/// namespaces (made eth0's tun when the helper serves EGRESS), has this
/// helper's id map and sits in a fresh cgroup without limits. It waits for
/// `go`; until then it is no VM, and it dies with the helper like one.
#[derive(Debug)]
pub struct Prepared {
    /// The launcher (killed when dropped).
    child: Child,
    pid: i32,
    /// Where its config goes, once known.
    stdin: ChildStdin,
    /// Our end of the control socket.
    control: AsyncFd<OwnedFd>,
    /// eth0's tun (with `--eth0`).
    tun: Option<OwnedFd>,
    cgroup: Option<VmCgroup>,
}

impl Prepared {
    /// The launcher exited (killed, say) while it waited for a VM.
    pub fn is_dead(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    /// Kills the launcher and removes its cgroup.
    pub async fn discard(mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
        if let Some(cg) = &self.cgroup {
            cg.remove();
        }
    }
}

/// What preparing a launcher needs: this binary, the id map, the cgroups.
#[derive(Debug)]
pub struct Spawner {
    /// This binary, re-executed as the launcher.
    pub self_exe: PathBuf,
    /// Installs the id map.
    pub mapper: IdMapper,
    /// Where launchers' cgroups go, when the host has cgroups.
    pub cgroups: Option<CgroupLayout>,
    /// Launchers make eth0's tun (the helper can serve EGRESS).
    pub eth0: bool,
}

impl Spawner {
    /// Spawns a launcher and takes it through everything that does not
    /// depend on its VM.
    pub async fn prepare(&self) -> Result<Prepared, DriverError> {
        let (ours, theirs) = socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)
            .map_err(|source| DriverError::sys("control socketpair", source))?;
        let mut cmd = Command::new(&self.self_exe);
        // The launcher becomes the sandbox's PID 1, whose environment anything
        // inside can read (/proc/1/environ): it must not inherit the helper's,
        // which is the orchestrator's and may hold the user's tokens.
        cmd.env_clear();
        for key in ["PATH", "RUST_LOG"] {
            if let Some(v) = std::env::var_os(key) {
                cmd.env(key, v);
            }
        }
        // A neutral argv[0]: /proc/1/cmdline inside the sandbox shows it.
        cmd.arg0("sandbox-vm-init").arg("__vm-init");
        if self.eth0 {
            cmd.arg("--eth0");
        }
        cmd.stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::null()).kill_on_drop(true);
        let cfd = theirs.as_raw_fd();
        // SAFETY: only fcntl/dup2 (async-signal-safe) between fork and exec.
        // The detour through an fd >= 10 keeps dup2 correct when the source
        // already sits on CONTROL_FD, and dup2 clears CLOEXEC on the copy.
        unsafe {
            cmd.pre_exec(move || {
                let b = libc::fcntl(cfd, libc::F_DUPFD_CLOEXEC, 10);
                if b < 0 || libc::dup2(b, CONTROL_FD) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(|e| DriverError::io("spawn vm launcher", e))?;
        drop(theirs);
        let pid = child.id().and_then(|p| i32::try_from(p).ok()).unwrap_or(0);
        let stdin = child.stdin.take().ok_or_else(|| DriverError::InitFailed("the launcher has no stdin".into()))?;
        let set_nb = nix::fcntl::fcntl(&ours, nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK));
        set_nb.map_err(|source| DriverError::sys("control socket nonblocking", source))?;
        // SAFETY: we own the fd and it stays open for as long as the AsyncFd.
        let control = unsafe { AsyncFd::register(ours) }
            .map_err(|e| DriverError::io("register control socket", std::io::Error::from(e)))?;
        let mut prepared = Prepared { child, pid, stdin, control, tun: None, cgroup: None };
        match tokio::time::timeout(START_TIMEOUT, self.setup(&mut prepared)).await {
            Ok(Ok(())) => Ok(prepared),
            Ok(Err(e)) => {
                prepared.discard().await;
                Err(e)
            }
            Err(_) => {
                prepared.discard().await;
                Err(DriverError::Timeout("a vm launcher to get ready"))
            }
        }
    }

    async fn setup(&self, p: &mut Prepared) -> Result<(), DriverError> {
        let begun = Instant::now();
        if self.eth0 {
            p.tun = Some(recv_tun(&p.control).await?);
        }
        let t0 = Instant::now();
        expect(&p.control, b"userns").await?;
        let t1 = Instant::now();
        self.mapper.map(p.pid)?;
        let t2 = Instant::now();
        if let Some(layout) = &self.cgroups {
            // Not a possible VM id (those start with a letter or digit): a VM
            // can never be given a launcher's group.
            p.cgroup = Some(layout.create_unlimited(&format!("_launcher-{}", p.pid))?);
            p.cgroup.as_ref().map_or(Ok(()), |cg| cg.add(p.pid))?;
        }
        // Where preparing time goes; the cgroup step is a cgroup v1 attach,
        // which waits for an RCU grace period unless another attach just
        // happened (see README, Benchmarks).
        tracing::debug!(
            launcher = p.pid, tun = ?(t0 - begun), userns = ?(t1 - t0), idmap = ?(t2 - t1), cgroup = ?t2.elapsed(),
            "launcher prepared"
        );
        Ok(())
    }
}

/// Starts a VM in `prepared` (a warm launcher, or one prepared just now)
/// and returns once its agent answers. The returned [`Child`] is the
/// launcher: it exits when the VM is gone, with PID 1's status.
pub async fn launch(prepared: Prepared, spec: &LaunchSpec) -> Result<(Instance, Child), DriverError> {
    let io = |what: &str| {
        let what = what.to_string();
        move |e| DriverError::io(what, e)
    };
    let Prepared { child, pid, stdin, control, tun, cgroup } = prepared;
    let mut state = Partial { cgroup, net: None, pid1: None };
    let listener = match bind_agent_socket(&spec.agent_socket) {
        Ok(l) => l,
        Err(e) => return Err(abort(state, child, spec, io("bind agent socket")(e)).await),
    };
    let keeper = match keep::bind_keeper(&spec.keeper_socket) {
        Ok(k) => k,
        Err(e) => return Err(abort(state, child, spec, e).await),
    };
    let sockets = GoSockets { agent: listener, keeper };
    // Before `go`: a helper dying from then on leaves a VM that the next
    // one must find, to adopt or to kill.
    crate::storage::record_launcher(&spec.dir, pid as u32);
    let result =
        tokio::time::timeout(START_TIMEOUT, handshake(spec, &control, stdin, tun, sockets, pid, &mut state)).await;
    match result {
        Ok(Ok(connection)) => match state {
            Partial { cgroup, net, pid1: Some((pid1, pid1fd)) } => {
                let ns = match VmNamespaces::open(pid1) {
                    Ok(ns) => Arc::new(ns),
                    Err(e) => {
                        let state = Partial { cgroup, net, pid1: Some((pid1, pid1fd)) };
                        return Err(abort(state, child, spec, e).await);
                    }
                };
                let agent = agent_pid(pid1);
                let agent_socket = spec.agent_socket.clone();
                let keeper_socket = spec.keeper_socket.clone();
                let control = control.into_inner();
                let net = std::sync::Mutex::new(net);
                let instance =
                    Instance { pid1, agent, ns, pid1fd, control, cgroup, net, agent_socket, keeper_socket, connection };
                Ok((instance, child))
            }
            _ => Err(DriverError::InitFailed("PID 1 never reported its pid".into())),
        },
        Ok(Err(e)) => Err(abort(state, child, spec, e).await),
        Err(_) => Err(abort(state, child, spec, DriverError::Timeout("the vm to start")).await),
    }
}

/// The agent's listening socket, created outside the VM in a directory only
/// we can enter.
fn bind_agent_socket(path: &std::path::Path) -> std::io::Result<std::os::unix::net::UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    let _ = std::fs::remove_file(path);
    let listener = std::os::unix::net::UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

struct Partial {
    cgroup: Option<VmCgroup>,
    net: Option<NetStack>,
    pid1: Option<(i32, OwnedFd)>,
}

async fn abort(state: Partial, mut child: Child, spec: &LaunchSpec, e: DriverError) -> DriverError {
    if let Some((_, fd)) = &state.pid1 {
        pidfd_kill(fd, libc::SIGKILL);
    }
    let _ = child.start_kill();
    let _ = child.wait().await;
    drop(state.net);
    if let Some(cg) = &state.cgroup {
        cg.remove();
    }
    let _ = std::fs::remove_file(&spec.agent_socket);
    let _ = std::fs::remove_file(&spec.keeper_socket);
    e
}

/// Gives the launcher its VM: cgroup name and limits, network, config,
/// agent socket; then waits for PID 1 and the agent.
async fn handshake(
    spec: &LaunchSpec,
    control: &AsyncFd<OwnedFd>,
    mut stdin: ChildStdin,
    tun: Option<OwnedFd>,
    sockets: GoSockets,
    launcher_pid: i32,
    state: &mut Partial,
) -> Result<Mux, DriverError> {
    let begun = Instant::now();
    if let Some(cg) = &mut state.cgroup {
        cg.rename(&spec.id);
        cg.limit(spec.limits)?;
    }
    let unused_tun = match &spec.egress {
        Some(egress) => {
            let tun = tun.ok_or_else(|| {
                DriverError::InitFailed("EGRESS needs eth0's tun, which this helper cannot create".into())
            })?;
            state.net = Some(serve_egress(egress, tun)?);
            None
        }
        None => tun,
    };
    let init_json = serde_json::to_string(&spec.init).map_err(|e| DriverError::InitFailed(e.to_string()))?;
    // A few hundred bytes: fits the pipe buffer, never blocks for long.
    stdin.write_all(init_json.as_bytes()).await.map_err(|e| DriverError::io("send init config", e))?;
    drop(stdin);
    send_go(control, &sockets)?;
    drop(sockets);

    let t1 = Instant::now();
    let mut ready = false;
    while !ready || state.pid1.is_none() {
        let msg = recv_async(control).await?;
        let text = String::from_utf8_lossy(&msg);
        if let Some(pid) = text.strip_prefix("pid:") {
            let pid: i32 = pid.parse().map_err(|_| DriverError::InitFailed(format!("bad pid message {text:?}")))?;
            state.pid1 = Some((pid, pidfd_open(pid)?));
        } else if text == "ready" {
            ready = true;
        } else if let Some(err) = text.strip_prefix("error:") {
            return Err(DriverError::InitFailed(err.to_string()));
        } else if msg.is_empty() {
            return Err(DriverError::LauncherExited);
        }
    }
    if let Some((pid1, _)) = &state.pid1 {
        protect_from_oom(launcher_pid, *pid1);
    }
    let t2 = Instant::now();
    let connection = ping(spec).await?;
    // Closing the last fd of a tun deletes the device, which waits for RCU
    // grace periods: not on the start path, nor on a runtime thread.
    if let Some(tun) = unused_tun {
        tokio::task::spawn_blocking(move || drop(tun));
    }
    // Where start time goes: our own steps, the launcher, the agent.
    tracing::debug!(
        vm = %spec.id, launcher = launcher_pid, config = ?(t1 - begun), ready = ?(t2 - t1), ping = ?t2.elapsed(),
        "start steps"
    );
    Ok(connection)
}

/// The VM's network stack over eth0's tun.
fn serve_egress(egress: &Egress, tun: OwnedFd) -> Result<NetStack, DriverError> {
    match egress {
        Egress::Stack(policy, events) => NetStack::start(tun, LinkKind::Packets, policy.clone(), events.clone())
            .map_err(|e| DriverError::io("start the vm's network stack", e)),
        Egress::Frames(frames) => {
            let frames = frames.try_clone().map_err(|e| DriverError::io("take the vm's frame socket", e))?;
            Ok(NetStack::relay(tun, frames))
        }
    }
}

/// Takes over a VM a helper that died left running, handed over by its
/// launcher's keeper (see [`super::keep`]): the same host resources
/// [`launch`] gathers, its network stack started again over the same tun
/// (connections through the old one are gone); returns the connection on
/// which the launcher reports the VM's end. `cgroups`: where its group
/// would be. On an error PID 1 is killed, through its pidfd: code in the VM
/// may have cleared PID 1's parent-death signal, so killing its launcher
/// would not end it.
pub async fn adopt(
    spec: &LaunchSpec,
    kept: keep::Kept,
    cgroups: Option<&CgroupLayout>,
) -> Result<(Instance, OwnedFd), DriverError> {
    let keep::Kept { pid1, pid1fd, control, link: tun, conn } = kept;
    let Some(control) = control else {
        pidfd_kill(&pid1fd, libc::SIGKILL);
        return Err(DriverError::InitFailed("its launcher kept no control socket".into()));
    };
    match adopted(spec, pid1, &pid1fd, tun).await {
        Ok((ns, net, connection)) => {
            let instance = Instance {
                pid1,
                agent: agent_pid(pid1),
                ns,
                pid1fd,
                control,
                cgroup: cgroups.and_then(|layout| layout.existing(&spec.id)),
                net: std::sync::Mutex::new(net),
                agent_socket: spec.agent_socket.clone(),
                keeper_socket: spec.keeper_socket.clone(),
                connection,
            };
            Ok((instance, conn))
        }
        Err(e) => {
            pidfd_kill(&pid1fd, libc::SIGKILL);
            Err(e)
        }
    }
}

/// The namespaces, network stack and agent connection of an adopted VM.
async fn adopted(
    spec: &LaunchSpec,
    pid1: i32,
    pid1fd: &OwnedFd,
    tun: Option<OwnedFd>,
) -> Result<(Arc<VmNamespaces>, Option<NetStack>, Mux), DriverError> {
    let ns = Arc::new(VmNamespaces::open(pid1)?);
    // Opened by pid: they are PID 1's if it still lives now (a live
    // process's pid is never reused).
    if pidfd_exited(pid1fd) {
        return Err(DriverError::InitFailed("PID 1 exited during the handover".into()));
    }
    let net = match (&spec.egress, tun) {
        (Some(egress), Some(tun)) => Some(serve_egress(egress, tun)?),
        (Some(_), None) => return Err(DriverError::InitFailed("its launcher kept no tun for EGRESS".into())),
        (None, _) => None,
    };
    let connection = ping(spec).await?;
    Ok((ns, net, connection))
}

/// The listening sockets `go` hands the launcher.
struct GoSockets {
    /// The agent's (PID 1 passes it on).
    agent: std::os::unix::net::UnixListener,
    /// The keeper's (the launcher's own).
    keeper: OwnedFd,
}

/// `go`, carrying the agent's and the keeper's listening sockets, a copy of
/// our end of the control socket, which the launcher keeps for the next
/// helper should this one die (see [`super::keep`]), and our pidfd, by
/// which it sees this helper die (its parent may be gone by the time it
/// looks).
fn send_go(control: &AsyncFd<OwnedFd>, sockets: &GoSockets) -> Result<(), DriverError> {
    let ours = control.get_ref().as_raw_fd();
    let me = pidfd_open(std::process::id() as i32)?;
    let fds = [sockets.agent.as_raw_fd(), sockets.keeper.as_raw_fd(), ours, me.as_raw_fd()];
    let cmsg = [ControlMessage::ScmRights(&fds)];
    let iov = [std::io::IoSlice::new(b"go")];
    sendmsg::<()>(ours, &iov, &cmsg, MsgFlags::MSG_DONTWAIT, None)
        .map_err(|source| DriverError::sys("control socket send", source))?;
    Ok(())
}

/// The agent: PID 1's only child until the agent starts something (a VM
/// that was just started has not).
fn agent_pid(pid1: i32) -> i32 {
    let children = std::fs::read_to_string(format!("/proc/{pid1}/task/{pid1}/children")).unwrap_or_default();
    children.split_whitespace().next().and_then(|p| p.parse().ok()).unwrap_or(0)
}

/// Once the agent is up, and before it starts anything: see [`super::oom`].
fn protect_from_oom(launcher_pid: i32, pid1: i32) {
    if !super::oom::protect(launcher_pid, pid1) {
        tracing::debug!(pid1, "vm init and agent keep the helper's oom_score_adj");
    }
}

/// The launcher's `tun` message and the fd it carries (eth0's tun).
async fn recv_tun(control: &AsyncFd<OwnedFd>) -> Result<OwnedFd, DriverError> {
    use std::os::fd::FromRawFd as _;
    let mut buf = [0u8; 64];
    let mut cmsg = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    loop {
        let mut guard = control.readable().await.map_err(|e| DriverError::io("wait on control socket", e))?;
        let got = guard.try_io(|fd| {
            let mut iov = [std::io::IoSliceMut::new(&mut buf)];
            let msg = nix::sys::socket::recvmsg::<()>(
                fd.get_ref().as_raw_fd(),
                &mut iov,
                Some(&mut cmsg),
                MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_CMSG_CLOEXEC,
            )
            .map_err(std::io::Error::from)?;
            let mut fds = Vec::new();
            for c in msg.cmsgs().map_err(std::io::Error::from)? {
                if let nix::sys::socket::ControlMessageOwned::ScmRights(rights) = c {
                    fds.extend(rights);
                }
            }
            Ok((msg.bytes, fds))
        });
        let (n, fds) = match got {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => return Err(DriverError::io("read control socket", e)),
            Err(_would_block) => continue,
        };
        // SAFETY: SCM_RIGHTS just gave us these fds; we own them now.
        let mut owned: Vec<OwnedFd> = fds.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }).collect();
        let text = String::from_utf8_lossy(&buf[..n]).into_owned();
        return match (text.as_str(), owned.len()) {
            ("tun", 1) => Ok(owned.remove(0)),
            _ if n == 0 => Err(DriverError::LauncherExited),
            (other, _) => Err(DriverError::InitFailed(match other.strip_prefix("error:") {
                Some(err) => err.to_string(),
                None => format!("expected the tun, got {other:?} with {} fds", owned.len()),
            })),
        };
    }
}

async fn expect(control: &AsyncFd<OwnedFd>, want: &[u8]) -> Result<(), DriverError> {
    let msg = recv_async(control).await?;
    if msg == want {
        return Ok(());
    }
    if msg.is_empty() {
        return Err(DriverError::LauncherExited);
    }
    let text = String::from_utf8_lossy(&msg);
    Err(DriverError::InitFailed(match text.strip_prefix("error:") {
        Some(err) => err.to_string(),
        None => format!("unexpected message {text:?}"),
    }))
}

async fn recv_async(control: &AsyncFd<OwnedFd>) -> Result<Vec<u8>, DriverError> {
    let mut buf = vec![0u8; 4096];
    loop {
        let mut guard = control.readable().await.map_err(|e| DriverError::io("wait on control socket", e))?;
        match guard
            .try_io(|fd| recv(fd.get_ref().as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT).map_err(std::io::Error::from))
        {
            Ok(Ok(n)) => {
                buf.truncate(n);
                return Ok(buf);
            }
            Ok(Err(e)) if e.raw_os_error() == Some(libc::ECONNRESET) => return Ok(Vec::new()),
            Ok(Err(e)) => return Err(DriverError::io("read control socket", e)),
            Err(_would_block) => continue,
        }
    }
}

/// A new multiplexed connection to the agent listening at `path`.
pub async fn connect_agent(path: &std::path::Path) -> std::io::Result<Mux> {
    Ok(Mux::open_side(UnixStream::connect(path).await?))
}

/// Connects and makes one round trip to the agent, so StartVm returns only
/// when Exec works; the connection is the VM's from then on.
async fn ping(spec: &LaunchSpec) -> Result<Mux, DriverError> {
    let mux = connect_agent(&spec.agent_socket).await.map_err(|e| DriverError::io("connect agent", e))?;
    let mut stream = mux.open(Frame::Ping)?;
    match stream.next().await? {
        Some(Frame::Pong) => Ok(mux),
        other => Err(DriverError::InitFailed(format!("agent answered {other:?} to a ping"))),
    }
}
