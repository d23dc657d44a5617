//! Inside a VM: the launcher process (hidden `__vm-init` subcommand, config
//! on stdin) and the sandbox's PID 1.
//!
//! The launcher is a fresh exec of the helper binary, so it is
//! single-threaded and may unshare a user namespace. It unshares that and
//! its network namespace first (creating eth0's tun when asked to), then
//! waits for the helper to write its id maps, put it in a cgroup and give it
//! a VM: none of that depends on the VM, so the helper does it ahead of time
//! (see [`super::warm`]). With `go` it receives the agent's listening socket;
//! then it reads its config from stdin, stages the VM's host paths, becomes
//! root, unshares the other namespaces and forks PID 1; then it waits for
//! PID 1 and exits with its status, which is how the helper learns the VM
//! ended. While it waits it keeps the VM through its helper's death, for a
//! new helper to adopt, and holds the lifeline when none does (see
//! [`super::keep`]).
//!
//! PID 1 builds the filesystem, locks the sandbox down (no_new_privs,
//! seccomp), forks the agent and reaps children until the agent dies, or a
//! stop finishes. It dies with its launcher (its parent-death signal).
//!
//! Control socket messages (SEQPACKET, one per datagram): to the helper
//! `tun` (with `--eth0`, carrying eth0's tun fd), `userns`, `pid:<host pid of PID 1>`, `ready`, `error:<text>`; from it
//! `go` (carrying the agent's listening socket, the keeper's, a copy of
//! the helper's end and the helper's pidfd) and `term`.
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sched::{CloneFlags, unshare};
use nix::sys::signal::{SigSet, Signal, kill};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::socket::{MsgFlags, recv, send};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Gid, Pid, Uid, fork};
use serde::{Deserialize, Serialize};

use super::DriverError;
use crate::driver::keep::{ADOPT_WAIT, Keeper, Keeps, recv_message, report_exit};
use super::rootfs;

/// The control socket to the helper, inherited from the helper.
pub const CONTROL_FD: RawFd = 4;

/// What the launcher needs to build a VM; passed as JSON on its stdin (not
/// argv, which every process in the sandbox could read from /proc/1/cmdline).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InitConfig {
    /// Hostname inside the VM.
    pub hostname: String,
    /// The image's layers (overlay lower layers), bottom first.
    pub lowers: Vec<PathBuf>,
    /// The VM's writable layer.
    pub upper: PathBuf,
    /// overlayfs work dir, next to `upper`.
    pub work: PathBuf,
    /// Host directories to bind into the VM.
    pub mounts: Vec<BindMount>,
    /// A resolv.conf to bind over /etc/resolv.conf (EGRESS only).
    pub resolv_conf: Option<PathBuf>,
    /// Size cap of /dev/shm in bytes (0: the kernel's default, half of RAM).
    #[serde(default)]
    pub shm_bytes: u64,
    /// EGRESS: eth0 is a tun served by the helper's network stack.
    pub egress: bool,
}

pub use crate::driver::BindMount;

/// Entry point of `__vm-init`; `eth0`: create eth0's tun (the helper can
/// serve EGRESS). Returns the process exit code.
pub fn run(eth0: bool) -> i32 {
    // SAFETY: the helper placed the control socket on this fd for us.
    let control = unsafe { OwnedFd::from_raw_fd(CONTROL_FD) };
    set_cloexec(CONTROL_FD);
    match launcher(&control, eth0) {
        Ok(code) => code,
        Err(e) => {
            report(&control, &format!("error:{e}"));
            1
        }
    }
}

fn launcher(control: &OwnedFd, eth0: bool) -> Result<i32, DriverError> {
    let sys = |what: &'static str| move |source| DriverError::sys(what, source);
    // The user namespace comes first and everything else is made inside it
    // (unshare makes the user namespace before the others it is given): an
    // ordinary user has no rights to make any other namespace, and root
    // needs none of its host privileges past this point. The network
    // namespace is made now, so that this launcher can be prepared before
    // it knows its VM: eth0's tun belongs to it.
    unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNET)
        .map_err(sys("unshare user and network namespaces"))?;
    let tun = if eth0 { Some(super::network::create_tun(control)?) } else { None };
    report(control, "userns");
    // The helper is watched by the pidfd it sent from now on: this launcher
    // holds a copy of the helper's end, whose closing no longer tells.
    let Go { agent: listener, keeper: keeper_listener, helper_end, helper } = recv_go(control)?;
    let mut config_json = String::new();
    std::io::Read::read_to_string(&mut std::io::stdin(), &mut config_json)
        .map_err(|e| DriverError::io("read init config", e))?;
    let config: InitConfig =
        serde_json::from_str(&config_json).map_err(|e| DriverError::InitFailed(format!("bad init config: {e}")))?;
    let host_paths = rootfs::open_host_paths(&config)?;
    nix::unistd::setresgid(Gid::from_raw(0), Gid::from_raw(0), Gid::from_raw(0)).map_err(sys("setresgid 0"))?;
    nix::unistd::setresuid(Uid::from_raw(0), Uid::from_raw(0), Uid::from_raw(0)).map_err(sys("setresuid 0"))?;
    let _ = nix::unistd::setgroups(&[]);
    // Changing credentials made us non-dumpable, which locks our
    // /proc/PID/ns files against a helper without privileges of its own
    // (Dial enters our network namespace). Root in the sandbox can ptrace us
    // regardless.
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1) };
    rootfs::stage(host_paths)?;
    let mut namespaces = CloneFlags::CLONE_NEWNS
        | CloneFlags::CLONE_NEWPID
        | CloneFlags::CLONE_NEWIPC
        | CloneFlags::CLONE_NEWUTS
        | CloneFlags::CLONE_NEWCGROUP;
    if !config.egress {
        // A VM without EGRESS gets a network namespace of its own, without
        // the tun made ahead: deleting that device on the start path would
        // cost RCU grace periods; the kernel takes the old namespace and its
        // device down in the background once we leave it.
        namespaces |= CloneFlags::CLONE_NEWNET;
    }
    unshare(namespaces).map_err(sys("unshare namespaces"))?;
    // Only a VM with EGRESS keeps eth0's tun.
    let keeper =
        Keeper { listener: keeper_listener, helper_end: Some(helper_end), link: tun.filter(|_| config.egress), keeps: Keeps::Pid1 };
    // SAFETY: this process is single-threaded (a fresh exec, no runtime).
    match unsafe { fork() }.map_err(sys("fork PID 1"))? {
        ForkResult::Child => {
            // What hands the VM to a helper stays out of the VM's reach.
            drop((keeper, helper));
            let code = match pid1(control, &config, listener) {
                Ok(code) => code,
                Err(e) => {
                    report(control, &format!("error:{e}"));
                    1
                }
            };
            std::process::exit(code);
        }
        ForkResult::Parent { child } => {
            drop(listener);
            report(control, &format!("pid:{child}"));
            let pid1fd = super::network::pidfd_open(child.as_raw())?;
            let adopter = keeper.keep(child, &pid1fd, Some(helper), ADOPT_WAIT);
            let code = loop {
                match waitpid(child, None) {
                    Ok(WaitStatus::Exited(_, code)) => break code,
                    Ok(WaitStatus::Signaled(_, sig, _)) => break 128 + sig as i32,
                    Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
                    Err(e) => {
                        return Err(DriverError::sys("wait for PID 1", e));
                    }
                }
            };
            if let Some(adopter) = adopter {
                report_exit(&adopter, code);
            }
            Ok(code)
        }
    }
}

fn pid1(control: &OwnedFd, config: &InitConfig, listener: OwnedFd) -> Result<i32, DriverError> {
    let sys = |what: &'static str| move |source| DriverError::sys(what, source);
    // If the launcher dies, so does the sandbox.
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    rootfs::setup(config)?;
    nix::unistd::sethostname(&config.hostname).map_err(sys("sethostname"))?;
    sandbox_net::setup::loopback_up()?;
    if config.egress {
        sandbox_net::setup::eth0_up(sandbox_net::plan::MTU)?;
    }

    let mut mask = SigSet::empty();
    mask.add(Signal::SIGCHLD);
    mask.add(Signal::SIGTERM);
    mask.thread_block().map_err(sys("block signals"))?;
    let mut sigfd =
        SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK).map_err(sys("signalfd"))?;

    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(DriverError::sys("no_new_privs", nix::errno::Errno::last()));
    }
    super::seccomp::install()?;
    quiet_stdio()?;

    // SAFETY: PID 1 is single-threaded.
    let agent = match unsafe { fork() }.map_err(sys("fork agent"))? {
        ForkResult::Child => {
            let _ = SigSet::empty().thread_set_mask();
            drop(sigfd);
            // SAFETY: closing our copy of the control socket; the agent has
            // no business with the helper's lifeline.
            unsafe { libc::close(CONTROL_FD) };
            let _ = sandbox_agent::run(std::os::unix::net::UnixListener::from(listener));
            std::process::exit(1);
        }
        ForkResult::Parent { child } => child,
    };
    // PID 1 does not use the listener; the agent owns it now.
    drop(listener);
    report(control, "ready");
    reap(control, &mut sigfd, agent)
}

/// PID 1's loop: reap everything, exit when the agent dies (mirroring its
/// status), when a requested stop has emptied the sandbox, or when the
/// control socket closes (its launcher is gone: the parent-death signal is
/// on its way). Exiting makes the kernel kill whatever is left in the
/// namespace.
fn reap(control: &OwnedFd, sigfd: &mut SignalFd, agent: Pid) -> Result<i32, DriverError> {
    let mut stopping = false;
    loop {
        let (ctl_ready, sig_ready) = {
            let mut fds =
                [PollFd::new(control.as_fd(), PollFlags::POLLIN), PollFd::new(sigfd.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, PollTimeout::NONE) {
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => {
                    return Err(DriverError::sys("poll", e));
                }
                Ok(_) => {}
            }
            let ready = |f: &PollFd<'_>| f.revents().is_some_and(|r| !r.is_empty());
            (ready(&fds[0]), ready(&fds[1]))
        };
        if ctl_ready {
            let mut buf = [0u8; 64];
            match recv(control.as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT) {
                Ok(0) | Err(nix::errno::Errno::ECONNRESET) => return Ok(0),
                Ok(n) if &buf[..n] == b"term" => {
                    stopping = true;
                    let _ = kill(Pid::from_raw(-1), Signal::SIGTERM);
                }
                _ => {}
            }
        }
        if sig_ready {
            while let Ok(Some(info)) = sigfd.read_signal() {
                if info.ssi_signo == Signal::SIGTERM as u32 {
                    stopping = true;
                    let _ = kill(Pid::from_raw(-1), Signal::SIGTERM);
                }
            }
        }
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) if pid == agent && !stopping => return Ok(code),
                Ok(WaitStatus::Signaled(pid, sig, _)) if pid == agent && !stopping => {
                    return Ok(128 + sig as i32);
                }
                Ok(WaitStatus::StillAlive) => break,
                Ok(_) => {}
                Err(nix::errno::Errno::ECHILD) if stopping => return Ok(0),
                Err(_) => break,
            }
        }
    }
}

/// PID 1 and the agent keep no fd on the helper's log: the sandbox is
/// untrusted and ptrace is allowed inside it.
fn quiet_stdio() -> Result<(), DriverError> {
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map_err(|e| DriverError::io("open /dev/null", e))?;
    for fd in 0..3 {
        // SAFETY: dup2 onto the standard fds.
        unsafe { libc::dup2(null.as_raw_fd(), fd) };
    }
    Ok(())
}

fn set_cloexec(fd: RawFd) {
    // SAFETY: fcntl on an fd number; harmless if it is not open.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
}

fn report(control: &OwnedFd, msg: &str) {
    let _ = send(control.as_raw_fd(), msg.as_bytes(), MsgFlags::empty());
}

/// What the helper's `go` carries.
struct Go {
    /// The agent's listening socket.
    agent: OwnedFd,
    /// The keeper's listening socket.
    keeper: OwnedFd,
    /// A copy of the helper's end of the control socket.
    helper_end: OwnedFd,
    /// The helper's pidfd.
    helper: OwnedFd,
}

/// Waits for the helper's `go` and returns what it carries. Anything else
/// (the helper gone: end of file) ends the launcher.
fn recv_go(control: &OwnedFd) -> Result<Go, DriverError> {
    let no_vm = || DriverError::InitFailed("the helper gave this launcher no vm".into());
    let (text, fds) = recv_message(control, std::time::Duration::MAX).ok_or_else(no_vm)?;
    match (text.as_str(), <[OwnedFd; 4]>::try_from(fds)) {
        ("go", Ok([agent, keeper, helper_end, helper])) => Ok(Go { agent, keeper, helper_end, helper }),
        _ => Err(no_vm()),
    }
}
