//! The helper side of a VM's life: start the launcher, map its ids, put it in
//! its cgroup, serve its network link, wait for the agent; later stop and clean up.
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::socket::{AddressFamily, MsgFlags, SockFlag, SockType, recv, send, socketpair};
use tokio::io::AsyncWriteExt as _;
use tokio::io::unix::AsyncFd;
use tokio::net::UnixStream;
use tokio::process::{Child, Command};

use super::cgroup::{Limits, UsageFiles, VmCgroup};
use super::init::{CONTROL_FD, InitConfig, LISTENER_FD};
use super::network::{pidfd_kill, pidfd_open};
use super::{Driver, DriverError};
use crate::agent::protocol::{Frame, FrameReader, write_frame};
use crate::helper::netstack::NetStack;
use crate::helper::netstack::events::Events;
use crate::netpolicy::NetworkPolicy;

/// Generous bound on a start; a healthy one takes milliseconds, this only
/// turns a wedged launcher into an error instead of a hung RPC.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Everything needed to start one VM.
#[derive(Debug, Clone)]
pub struct LaunchSpec {
    /// VM id (names its cgroup).
    pub id: String,
    /// What the launcher builds inside.
    pub init: InitConfig,
    /// cgroup limits.
    pub limits: Limits,
    /// EGRESS: the policy its stack enforces and where it records refusals.
    pub egress: Option<(NetworkPolicy, Arc<Events>)>,
    /// Where the agent's listening socket is created (outside the VM).
    pub agent_socket: PathBuf,
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
    /// The VM's network stack (EGRESS); dropped with the instance.
    net: Option<NetStack>,
    agent_socket: PathBuf,
}

impl Instance {
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
    pub fn cleanup(self) {
        drop(self.net);
        if let Some(cg) = &self.cgroup {
            cg.remove();
        }
        let _ = std::fs::remove_file(&self.agent_socket);
    }
}

/// Starts a VM and returns once its agent answers. The returned [`Child`] is
/// the launcher: it exits when the VM is gone, with PID 1's status.
pub async fn launch(driver: &Driver, spec: &LaunchSpec) -> Result<(Instance, Child), DriverError> {
    let io = |what: &str| {
        let what = what.to_string();
        move |e| DriverError::io(what, e)
    };
    if let Some(dir) = spec.agent_socket.parent() {
        std::fs::create_dir_all(dir).map_err(io("create runtime dir"))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(io("chmod runtime dir"))?;
    }
    let _ = std::fs::remove_file(&spec.agent_socket);
    let listener = std::os::unix::net::UnixListener::bind(&spec.agent_socket).map_err(io("bind agent socket"))?;
    std::fs::set_permissions(&spec.agent_socket, std::fs::Permissions::from_mode(0o600))
        .map_err(io("chmod agent socket"))?;
    let (ours, theirs) = socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)
        .map_err(|source| DriverError::Sys { what: "control socketpair".into(), source })?;

    let init_json = serde_json::to_string(&spec.init).map_err(|e| DriverError::InitFailed(e.to_string()))?;
    let mut cmd = Command::new(&driver.self_exe);
    // A neutral argv[0]: /proc/1/cmdline inside the sandbox shows it.
    // The launcher becomes the sandbox's PID 1, whose environment anything
    // inside can read (/proc/1/environ): it must not inherit the helper's,
    // which is the orchestrator's and may hold the user's tokens.
    cmd.env_clear();
    for key in ["PATH", "RUST_LOG"] {
        if let Some(v) = std::env::var_os(key) {
            cmd.env(key, v);
        }
    }
    cmd.arg0("sandbox-vm-init")
        .arg("__vm-init")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true);
    let (lfd, cfd) = (listener.as_raw_fd(), theirs.as_raw_fd());
    // SAFETY: only fcntl/dup2 (async-signal-safe) between fork and exec. The
    // detour through fds >= 10 keeps dup2 correct when a source already sits
    // on 3 or 4, and dup2 clears CLOEXEC on the copies the launcher needs.
    unsafe {
        cmd.pre_exec(move || {
            let a = libc::fcntl(lfd, libc::F_DUPFD_CLOEXEC, 10);
            let b = libc::fcntl(cfd, libc::F_DUPFD_CLOEXEC, 10);
            if a < 0 || b < 0 || libc::dup2(a, LISTENER_FD) < 0 || libc::dup2(b, CONTROL_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let spawned = Instant::now();
    let mut child = cmd.spawn().map_err(io("spawn vm launcher"))?;
    let spawn = spawned.elapsed();
    drop(listener);
    drop(theirs);
    let launcher_pid = child.id().and_then(|p| i32::try_from(p).ok()).unwrap_or(0);
    if let Some(mut stdin) = child.stdin.take() {
        // A few hundred bytes: fits the pipe buffer, never blocks for long.
        let written = stdin.write_all(init_json.as_bytes()).await;
        drop(stdin);
        if let Err(e) = written {
            let state = Partial { cgroup: None, net: None, pid1: None };
            return Err(abort(state, child, spec, DriverError::io("send init config", e)).await);
        }
    }

    let mut state = Partial { cgroup: None, net: None, pid1: None };
    let result = tokio::time::timeout(START_TIMEOUT, handshake(driver, spec, ours, launcher_pid, &mut state)).await;
    tracing::debug!(vm = %spec.id, ?spawn, "launcher spawned");
    match result {
        Ok(Ok(control)) => match state {
            Partial { cgroup, net, pid1: Some((pid1, pid1fd)) } => {
                let open = |kind: &str| {
                    std::fs::File::open(format!("/proc/{pid1}/ns/{kind}"))
                        .map(OwnedFd::from)
                        .map_err(|e| DriverError::io(format!("open the vm's {kind} namespace"), e))
                };
                let ns = match open("user").and_then(|user| Ok(VmNamespaces { user, net: open("net")? })) {
                    Ok(ns) => Arc::new(ns),
                    Err(e) => {
                        let state = Partial { cgroup, net, pid1: Some((pid1, pid1fd)) };
                        return Err(abort(state, child, spec, e).await);
                    }
                };
                let agent = agent_pid(pid1);
                let agent_socket = spec.agent_socket.clone();
                Ok((Instance { pid1, agent, ns, pid1fd, control, cgroup, net, agent_socket }, child))
            }
            _ => Err(DriverError::InitFailed("PID 1 never reported its pid".into())),
        },
        Ok(Err(e)) => Err(abort(state, child, spec, e).await),
        Err(_) => Err(abort(state, child, spec, DriverError::Timeout("the vm to start")).await),
    }
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
    e
}

async fn handshake(
    driver: &Driver,
    spec: &LaunchSpec,
    control: OwnedFd,
    launcher_pid: i32,
    state: &mut Partial,
) -> Result<OwnedFd, DriverError> {
    let set_nb = nix::fcntl::fcntl(&control, nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK));
    set_nb.map_err(|source| DriverError::Sys { what: "control socket nonblocking".into(), source })?;
    // SAFETY: we own the fd and it stays open for as long as the AsyncFd.
    let control = unsafe { AsyncFd::register(control) }
        .map_err(|e| DriverError::io("register control socket", std::io::Error::from(e)))?;

    let begun = Instant::now();
    if let Some((policy, events)) = &spec.egress {
        let tun = recv_tun(&control).await?;
        let net = NetStack::start(tun, policy.clone(), events.clone())
            .map_err(|e| DriverError::io("start the vm's network stack", e))?;
        state.net = Some(net);
    }
    let t0 = Instant::now();
    expect(&control, b"userns").await?;
    let t1 = Instant::now();
    let mapper = driver.ids.as_ref().map_err(|reason| DriverError::UserNs(reason.clone()))?;
    mapper.map(launcher_pid)?;
    let t2 = Instant::now();
    if let Some(layout) = &driver.cgroups {
        let cg = layout.create(&spec.id, spec.limits)?;
        let added = cg.add(launcher_pid);
        state.cgroup = Some(cg);
        added?;
    }
    send(control.get_ref().as_raw_fd(), b"go", MsgFlags::MSG_DONTWAIT)
        .map_err(|source| DriverError::Sys { what: "control socket send".into(), source })?;

    let t3 = Instant::now();
    let mut ready = false;
    while !ready || state.pid1.is_none() {
        let msg = recv_async(&control).await?;
        let text = String::from_utf8_lossy(&msg);
        if let Some(pid) = text.strip_prefix("pid:") {
            let pid: i32 = pid.parse().map_err(|_| DriverError::InitFailed(format!("bad pid message {text:?}")))?;
            state.pid1 = Some((pid, pidfd_open(pid)?));
        } else if text == "ready" {
            ready = true;
        } else if let Some(err) = text.strip_prefix("error:") {
            return Err(DriverError::InitFailed(err.to_string()));
        } else if msg.is_empty() {
            return Err(DriverError::InitFailed("the launcher exited during setup".into()));
        }
    }
    if let Some((pid1, _)) = &state.pid1 {
        protect_from_oom(launcher_pid, *pid1);
    }
    let t4 = Instant::now();
    ping(spec).await?;
    // Where start time goes: waits on the launcher, our own steps, the agent.
    tracing::debug!(
        vm = %spec.id, tun = ?(t0 - begun), userns = ?(t1 - t0), idmap = ?(t2 - t1), cgroup = ?(t3 - t2), ready = ?(t4 - t3), ping = ?t4.elapsed(),
        "start steps"
    );
    Ok(control.into_inner())
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
            (other, _) => Err(DriverError::InitFailed(match other.strip_prefix("error:") {
                Some(err) => err.to_string(),
                None if n == 0 => "the launcher exited during setup".into(),
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
    let text = String::from_utf8_lossy(&msg);
    Err(DriverError::InitFailed(match text.strip_prefix("error:") {
        Some(err) => err.to_string(),
        None if msg.is_empty() => "the launcher exited during setup".into(),
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

/// One round trip to the agent, so StartVm returns only when Exec works.
async fn ping(spec: &LaunchSpec) -> Result<(), DriverError> {
    let stream = UnixStream::connect(&spec.agent_socket).await.map_err(|e| DriverError::io("connect agent", e))?;
    let (rd, mut wr) = stream.into_split();
    write_frame(&mut wr, &Frame::Ping).await?;
    match FrameReader::new(rd).next().await? {
        Some(Frame::Pong) => Ok(()),
        other => Err(DriverError::InitFailed(format!("agent answered {other:?} to a ping"))),
    }
}
