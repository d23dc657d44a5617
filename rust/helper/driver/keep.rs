//! A VM outliving its helper: the process it hangs from keeps it through a
//! helper's death, and a new helper adopts it (issue 25). On the namespace
//! driver that is the VM's launcher, whose child is PID 1; on the vm driver
//! it is qemu's keeper ([`super::qemu::keeper`]), whose child is qemu. Below,
//! "launcher" and "PID 1" stand for either.
//!
//! A VM's processes hang from its launcher (PID 1 dies with it), not from
//! the helper, so a helper that dies (a crash, `kill -9`) need not take its
//! VMs along. What it would take is what only it held: its end of the
//! control socket (how PID 1 hears `term`), eth0's tun (closing its last fd
//! deletes the device) and PID 1's pidfd. So `go` gives the launcher a copy
//! of the helper's control end, the launcher keeps a copy of the tun, and
//! the helper hands the launcher a listening socket, the keeper, beside the
//! agent's. When the helper is gone (its pidfd, or an adopter's connection,
//! says so) the launcher waits up to [`ADOPT_WAIT`] for a new helper to
//! connect there and ask for the VM ([`reclaim`]): it gets those fds back
//! and the launcher watches it from then on. Nobody within the wait: the
//! launcher kills PID 1, as its lifeline always did, so an orphan never
//! runs on unwatched (no quota, no egress stack, no way to reach it).
//!
//! A namespace VM frozen at its helper's death (a snapshot's copy, a quota
//! hold), even in part, is not kept: nobody knows which of its stopped processes to
//! resume, so the launcher kills it at once. Neither
//! is one whose launcher speaks another keeper protocol ([`KEEP_VERSION`]).
//!
//! Messages (SEQPACKET): from the helper `adopt:<version>`; from the
//! launcher `kept:<version>:<pid1>` carrying the helper's control end, PID
//! 1's pidfd and (EGRESS) the network link (eth0's tun, or the helper's end
//! of the vm's card), or `refused:<why>`; from the helper
//! `adopted` once it holds the VM (until then the wait runs on: a helper
//! that dies mid-adoption, again and again, does not keep an orphan alive
//! past it); from the launcher `exit:<status>` when PID 1 exits. Only the
//! helper's user can reach the keeper (it sits in the runtime dir's 0700
//! `vms`, never inside a VM).
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{
    AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType, UnixAddr, accept4, bind, connect,
    listen, recvmsg, sendmsg, socket,
};
use nix::unistd::Pid;

use super::DriverError;
use super::network::{pidfd_kill, pidfd_open};

/// How long a launcher whose helper died waits for a new one: the daemon's
/// watchdog starts one within seconds; a daemon that died too is started
/// again by its front-end at once. Past it the VM is killed.
pub const ADOPT_WAIT: Duration = Duration::from_secs(60);
/// The keeper protocol: a launcher adopts only a helper speaking its own.
pub const KEEP_VERSION: u32 = 1;
/// Bound on one handshake, either side: a peer that stalls is dropped.
const HANDSHAKE_WAIT: Duration = Duration::from_secs(5);

/// The keeper's listening socket at `path` (replacing a stale one), 0600.
pub fn bind_keeper(path: &Path) -> Result<OwnedFd, DriverError> {
    let sys = |what: &'static str| move |source| DriverError::sys(what, source);
    let _ = std::fs::remove_file(path);
    let fd =
        socket(AddressFamily::Unix, SockType::SeqPacket, SockFlag::SOCK_CLOEXEC, None).map_err(sys("keeper socket"))?;
    let addr = UnixAddr::new(path).map_err(sys("keeper socket path"))?;
    bind(fd.as_raw_fd(), &addr).map_err(sys("bind the keeper socket"))?;
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .map_err(|e| DriverError::io("chmod the keeper socket", e))?;
    listen(&fd, nix::sys::socket::Backlog::new(4).map_err(sys("keeper backlog"))?)
        .map_err(sys("listen on the keeper socket"))?;
    Ok(fd)
}

/// What a launcher keeps: its child, and what that takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keeps {
    /// A namespace VM's PID 1: the helper's end of the control socket goes
    /// with it, and a helper's freeze can hold the VM's processes.
    Pid1,
    /// A vm's qemu: a guest that escaped into it (or into another vm's
    /// qemu, the same program) may knock, and must not be handed a vm.
    Qemu,
}

/// What the launcher holds to hand its VM to a new helper.
pub struct Keeper {
    /// The keeper's listening socket.
    pub listener: OwnedFd,
    /// A copy of the helper's end of the control socket (a namespace VM's).
    pub helper_end: Option<OwnedFd>,
    /// The network link (EGRESS): eth0's tun, whose device lives as long
    /// as one fd does, or the helper's end of a vm's card.
    pub link: Option<OwnedFd>,
    /// Its child.
    pub keeps: Keeps,
}

/// Who watches the VM now.
enum Watcher {
    /// The helper that started it, by pidfd.
    Parent(OwnedFd),
    /// A helper that took the VM's fds and has not confirmed yet; the wait
    /// that began at the instant runs on.
    Adopting(OwnedFd, Instant),
    /// A helper that adopted it, by its connection.
    Adopter(OwnedFd),
    /// None since then.
    Gone(Instant),
}

impl Keeper {
    /// Runs until PID 1 has exited (or was killed: its helper gone and none
    /// adopting it within `wait`, or it was frozen then). Returns the
    /// adopter's connection, to which its exit is reported, if a helper
    /// adopted it.
    pub fn keep(&self, pid1: Pid, pid1fd: &OwnedFd, parent: Option<OwnedFd>, wait: Duration) -> Option<OwnedFd> {
        let mut watcher = parent.map_or_else(|| Watcher::Gone(Instant::now()), Watcher::Parent);
        loop {
            let timeout = match &watcher {
                Watcher::Gone(since) | Watcher::Adopting(_, since) => {
                    let left = wait.saturating_sub(since.elapsed());
                    if left.is_zero() {
                        pidfd_kill(pid1fd, libc::SIGKILL);
                        PollTimeout::NONE
                    } else {
                        PollTimeout::try_from(left.as_millis().min(60_000) as i32 + 1).unwrap_or(PollTimeout::MAX)
                    }
                }
                _ => PollTimeout::NONE,
            };
            let (pid1_done, watcher_ready, knocked) = {
                let watched = match &watcher {
                    Watcher::Parent(fd) | Watcher::Adopting(fd, _) => Some(PollFd::new(fd.as_fd(), PollFlags::POLLIN)),
                    // No POLLIN: the adopter sends nothing more; a hang-up
                    // is reported whatever the events asked for.
                    Watcher::Adopter(fd) => Some(PollFd::new(fd.as_fd(), PollFlags::empty())),
                    Watcher::Gone(_) => None,
                };
                let mut fds = vec![
                    PollFd::new(pid1fd.as_fd(), PollFlags::POLLIN),
                    PollFd::new(self.listener.as_fd(), PollFlags::POLLIN),
                ];
                fds.extend(watched);
                match poll(&mut fds, timeout) {
                    Err(nix::errno::Errno::EINTR) => continue,
                    // Nothing to wait on that works: the old lifeline's answer.
                    Err(_) => {
                        pidfd_kill(pid1fd, libc::SIGKILL);
                        return None;
                    }
                    Ok(_) => {}
                }
                let ready = |f: &PollFd<'_>| f.revents().is_some_and(|r| !r.is_empty());
                (ready(&fds[0]), fds.get(2).is_some_and(ready), ready(&fds[1]))
            };
            if pid1_done {
                return match watcher {
                    Watcher::Adopter(conn) | Watcher::Adopting(conn, _) => Some(conn),
                    _ => None,
                };
            }
            if watcher_ready {
                watcher = match watcher {
                    Watcher::Adopting(conn, since) => match recv_message(&conn, Duration::ZERO) {
                        Some((text, _)) if text == "adopted" => Watcher::Adopter(conn),
                        _ => Watcher::Gone(since),
                    },
                    _ => {
                        if self.keeps == Keeps::Pid1 && frozen(pid1) {
                            pidfd_kill(pid1fd, libc::SIGKILL);
                        }
                        Watcher::Gone(Instant::now())
                    }
                };
            }
            if knocked {
                let Ok(conn) = accept4(self.listener.as_raw_fd(), SockFlag::SOCK_CLOEXEC) else { continue };
                // SAFETY: accept4 just returned this fd; we own it.
                let conn = unsafe { OwnedFd::from_raw_fd(conn) };
                // A knock while watched is turned away: one helper at a time.
                if let Watcher::Gone(since) = watcher
                    && !self.stranger(&conn, pid1)
                    && self.hand_over(&conn, pid1, pid1fd)
                {
                    watcher = Watcher::Adopting(conn, since);
                }
            }
        }
    }

    /// Whether the peer on `conn` may not adopt: PID 1 itself, or (a vm)
    /// any process running qemu's program; turned away before it speaks,
    /// so it cannot hold the handshake's wait either.
    fn stranger(&self, conn: &OwnedFd, pid1: Pid) -> bool {
        let Ok(peer) = nix::sys::socket::getsockopt(conn, nix::sys::socket::sockopt::PeerCredentials) else {
            return true;
        };
        if peer.pid() == pid1.as_raw() {
            return true;
        }
        let exe = |pid: i32| std::fs::read_link(format!("/proc/{pid}/exe"));
        self.keeps == Keeps::Qemu
            && match (exe(peer.pid()), exe(pid1.as_raw())) {
                (Ok(peer), Ok(qemu)) => peer == qemu,
                // Not readable: not known to be a helper.
                _ => true,
            }
    }

    /// The handshake with a would-be adopter: whether it took the VM.
    fn hand_over(&self, conn: &OwnedFd, pid1: Pid, pid1fd: &OwnedFd) -> bool {
        let Some(asked) = recv_message(conn, HANDSHAKE_WAIT).map(|(m, _)| m) else { return false };
        if asked != format!("adopt:{KEEP_VERSION}") {
            let why = format!("refused:this launcher speaks keeper protocol {KEEP_VERSION}");
            let _ = nix::sys::socket::send(conn.as_raw_fd(), why.as_bytes(), MsgFlags::MSG_DONTWAIT);
            return false;
        }
        let mut fds: Vec<RawFd> = self.helper_end.iter().map(AsRawFd::as_raw_fd).collect();
        fds.push(pid1fd.as_raw_fd());
        fds.extend(self.link.as_ref().map(AsRawFd::as_raw_fd));
        let text = format!("kept:{KEEP_VERSION}:{pid1}");
        send_with_fds(conn, text.as_bytes(), &fds).is_ok()
    }
}

/// Tells the adopter how PID 1 ended (an exit status, or 128 + signal).
pub fn report_exit(conn: &OwnedFd, code: i32) {
    let _ = nix::sys::socket::send(conn.as_raw_fd(), format!("exit:{code}").as_bytes(), MsgFlags::empty());
}

/// Tells the launcher this helper holds the VM now: from then on its death
/// starts the launcher's wait afresh.
pub fn confirm(conn: &OwnedFd) -> Result<(), DriverError> {
    nix::sys::socket::send(conn.as_raw_fd(), b"adopted", MsgFlags::empty())
        .map_err(|source| DriverError::sys("confirm the adoption to the launcher", source))?;
    Ok(())
}

/// A VM handed over by its launcher.
#[derive(Debug)]
pub struct Kept {
    /// Host pid of PID 1.
    pub pid1: i32,
    /// PID 1's pidfd (the launcher's: it names PID 1, whatever reused its pid).
    pub pid1fd: OwnedFd,
    /// The helper's end of the control socket (a namespace VM's).
    pub control: Option<OwnedFd>,
    /// The network link (EGRESS), see [`Keeper::link`].
    pub link: Option<OwnedFd>,
    /// The connection to the launcher: its hang-up or `exit:` ends the VM.
    pub conn: OwnedFd,
}

/// Asks the launcher `launcher`, listening at `keeper` and keeping what
/// `keeps` says, for its VM. Blocking (a few round trips on a local
/// socket, bounded by [`HANDSHAKE_WAIT`]).
pub fn reclaim(keeper: &Path, launcher: u32, keeps: Keeps) -> Result<Kept, DriverError> {
    let sys = |what: &'static str| move |source| DriverError::sys(what, source);
    let conn =
        socket(AddressFamily::Unix, SockType::SeqPacket, SockFlag::SOCK_CLOEXEC, None).map_err(sys("keeper socket"))?;
    let addr = UnixAddr::new(keeper).map_err(sys("keeper socket path"))?;
    connect(conn.as_raw_fd(), &addr).map_err(sys("reach the vm's launcher"))?;
    send_with_fds(&conn, format!("adopt:{KEEP_VERSION}").as_bytes(), &[]).map_err(sys("ask the launcher"))?;
    let (text, mut fds) = recv_message(&conn, HANDSHAKE_WAIT)
        .ok_or_else(|| DriverError::InitFailed("the vm's launcher did not answer".into()))?;
    if let Some(why) = text.strip_prefix("refused:") {
        return Err(DriverError::InitFailed(why.to_string()));
    }
    let pid1 = text
        .strip_prefix(&format!("kept:{KEEP_VERSION}:"))
        .and_then(|p| p.parse::<i32>().ok())
        .filter(|p| *p > 1)
        .ok_or_else(|| DriverError::InitFailed(format!("the vm's launcher answered {text:?}")))?;
    let control_fds = usize::from(keeps == Keeps::Pid1);
    if !(control_fds + 1..=control_fds + 2).contains(&fds.len()) {
        return Err(DriverError::InitFailed(format!("the vm's launcher sent {} fds", fds.len())));
    }
    let control = (control_fds == 1).then(|| fds.remove(0));
    let pid1fd = fds.remove(0);
    let link = fds.pop();
    // The pidfd is the launcher's word for PID 1; the pid must name the
    // same process (it cannot be reused while that process lives), and
    // that process must be the launcher's own child.
    let check = pidfd_open(pid1)?;
    if !same_process(&check, &pid1fd) {
        return Err(DriverError::InitFailed("PID 1 exited during the handover".into()));
    }
    if sandbox_base::proc::parent(pid1 as u32) != Some(launcher) {
        return Err(DriverError::InitFailed(format!("the vm's launcher handed over process {pid1}, not its child")));
    }
    Ok(Kept { pid1, pid1fd, control, link, conn })
}

/// Waits for the launcher's report of PID 1's end, then for the launcher
/// to exit (it holds the VM's mounts until then): PID 1's exit status
/// (128 plus the signal that killed it), or `None` from a launcher that
/// died without saying.
pub async fn wait_exit(conn: OwnedFd) -> Option<i32> {
    report(conn, true).await
}

/// Waits for the launcher's report of its child's end, and only that (a
/// vm's keeper reports once qemu is reaped, holding nothing after): a wait
/// dropped half way loses no report, which stays unread in the socket.
pub async fn wait_report(conn: OwnedFd) -> Option<i32> {
    report(conn, false).await
}

/// The exit status a launcher reports on `conn`, read when it comes or
/// (`until_gone`) once the launcher has hung up.
async fn report(conn: OwnedFd, until_gone: bool) -> Option<i32> {
    let messages = async {
        let nonblocking = nix::fcntl::OFlag::O_NONBLOCK;
        nix::fcntl::fcntl(&conn, nix::fcntl::FcntlArg::F_SETFL(nonblocking)).ok()?;
        // SAFETY: we own the fd and it stays open for as long as the AsyncFd.
        let conn = unsafe { tokio::io::unix::AsyncFd::register(conn) }.ok()?;
        let mut buf = [0u8; 64];
        let mut report = None;
        loop {
            let mut guard = conn.readable().await.ok()?;
            let got = guard.try_io(|fd| {
                nix::sys::socket::recv(fd.get_ref().as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT)
                    .map_err(std::io::Error::from)
            });
            match got {
                Ok(Ok(0)) | Ok(Err(_)) => return report,
                Ok(Ok(n)) => {
                    report = Some(String::from_utf8_lossy(&buf[..n]).into_owned());
                    if !until_gone {
                        return report;
                    }
                }
                Err(_would_block) => continue,
            }
        }
    };
    messages.await?.strip_prefix("exit:").and_then(|c| c.parse::<i32>().ok())
}

/// Whether both pidfds name the same live process: compared by their
/// `Pid:` lines (a pidfd's fdinfo names its process, -1 once it is gone).
fn same_process(a: &OwnedFd, b: &OwnedFd) -> bool {
    let pid = |fd: &OwnedFd| {
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())).ok()?;
        info.lines().find_map(|l| l.strip_prefix("Pid:")).and_then(|p| p.trim().parse::<i32>().ok())
    };
    matches!((pid(a), pid(b)), (Some(x), Some(y)) if x == y && x > 0)
}

/// Whether any process of the VM whose PID 1 is `pid1` is stopped or has
/// a SIGSTOP pending (one in an uninterruptible sleep takes it later): a
/// freeze by the dead helper holds it, in whole or in part.
///
/// The launcher shares PID 1's mount namespace, whose `pivot_root` moved
/// the launcher's root along: its /proc is the VM's, which lists the VM's
/// processes only (and no `self`: the launcher is not in that pid
/// namespace). Were it the host's, the VM's processes are those in PID 1's
/// pid namespace.
fn frozen(pid1: Pid) -> bool {
    let ns = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok();
    let host_view = std::fs::read_link("/proc/self").is_ok();
    let vm = if host_view {
        match ns(&pid1.to_string()) {
            Some(vm) => Some(vm),
            None => return false,
        }
    } else {
        None
    };
    let sigstop = 1u64 << (libc::SIGSTOP - 1);
    let entries = std::fs::read_dir("/proc").into_iter().flatten().flatten();
    entries.filter_map(|e| e.file_name().into_string().ok()).filter(|p| p.parse::<u32>().is_ok()).any(|pid| {
        if vm.is_some() && ns(&pid) != vm {
            return false;
        }
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        status.lines().any(|line| match line.split_once(':') {
            Some(("State", v)) => matches!(v.trim_start().chars().next(), Some('T' | 't')),
            Some(("SigPnd" | "ShdPnd", v)) => u64::from_str_radix(v.trim(), 16).is_ok_and(|m| m & sigstop != 0),
            _ => false,
        })
    })
}

pub fn send_with_fds(conn: &OwnedFd, bytes: &[u8], fds: &[RawFd]) -> nix::Result<usize> {
    let cmsg = [ControlMessage::ScmRights(fds)];
    let iov = [std::io::IoSlice::new(bytes)];
    sendmsg::<()>(conn.as_raw_fd(), &iov, if fds.is_empty() { &[] } else { &cmsg }, MsgFlags::empty(), None)
}

/// One message and the fds it carried (up to four: `go`'s), waiting at
/// most `wait`; `None` on a hang-up, an error or the wait running out.
pub fn recv_message(conn: &OwnedFd, wait: Duration) -> Option<(String, Vec<OwnedFd>)> {
    let deadline = Instant::now().checked_add(wait);
    loop {
        let timeout = match deadline {
            Some(d) => {
                PollTimeout::try_from(d.saturating_duration_since(Instant::now()).as_millis().min(60_000) as i32)
                    .unwrap_or(PollTimeout::ZERO)
            }
            None => PollTimeout::NONE,
        };
        let mut fds = [PollFd::new(conn.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, timeout) {
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return None,
            Ok(0) if deadline.is_some_and(|d| Instant::now() >= d) => return None,
            Ok(0) => continue,
            Ok(_) => {}
        }
        let mut buf = [0u8; 256];
        let mut cmsg = nix::cmsg_space!([RawFd; 4]);
        let (n, owned) = {
            let mut iov = [std::io::IoSliceMut::new(&mut buf)];
            let msg = match recvmsg::<()>(conn.as_raw_fd(), &mut iov, Some(&mut cmsg), MsgFlags::MSG_CMSG_CLOEXEC) {
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => return None,
                Ok(msg) => msg,
            };
            let mut owned = Vec::new();
            for c in msg.cmsgs().ok()? {
                if let ControlMessageOwned::ScmRights(rights) = c {
                    // SAFETY: SCM_RIGHTS just gave us these fds; we own them now.
                    owned.extend(rights.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
                }
            }
            (msg.bytes, owned)
        };
        if n == 0 {
            return None;
        }
        return Some((String::from_utf8_lossy(&buf[..n]).into_owned(), owned));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in for PID 1 and a keeper listening in a directory of the test's own.
    fn setup(test: &str) -> (std::process::Child, OwnedFd, Keeper, std::path::PathBuf, OwnedFd) {
        let dir = std::env::temp_dir().join(format!("keep-{}-{test}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("vm.keep");
        let child = std::process::Command::new("sleep").arg("600").spawn().unwrap();
        let pid1fd = pidfd_open(child.id() as i32).unwrap();
        let (ours, theirs) =
            nix::sys::socket::socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)
                .unwrap();
        let keeper = Keeper { listener: bind_keeper(&path).unwrap(), helper_end: Some(ours), link: None, keeps: Keeps::Pid1 };
        (child, pid1fd, keeper, path, theirs)
    }

    #[test]
    fn an_orphan_nobody_adopts_in_time_is_killed() {
        let (mut child, pid1fd, keeper, path, _theirs) = setup("orphan");
        let pid1 = Pid::from_raw(child.id() as i32);
        assert!(keeper.keep(pid1, &pid1fd, None, Duration::from_millis(200)).is_none());
        let status = child.wait().unwrap();
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGKILL));
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }

    #[tokio::test]
    async fn a_new_helper_reclaims_the_vm_and_hears_how_it_ended() {
        let (mut child, pid1fd, keeper, path, _theirs) = setup("reclaim");
        let pid1 = Pid::from_raw(child.id() as i32);
        let launcher = std::thread::spawn(move || {
            let adopter = keeper.keep(pid1, &pid1fd, None, Duration::from_secs(60));
            let status = child.wait().unwrap();
            let code = 128 + std::os::unix::process::ExitStatusExt::signal(&status).unwrap_or(0);
            report_exit(adopter.as_ref().expect("adopted"), code);
        });
        let reclaimed = tokio::task::spawn_blocking({
            let path = path.clone();
            move || reclaim(&path, std::process::id(), Keeps::Pid1)
        });
        let kept = reclaimed.await.unwrap().expect("the launcher hands the vm over");
        assert_eq!(kept.pid1, pid1.as_raw());
        assert!(kept.link.is_none());
        // A second helper knocking now is turned away: one adopter at a time.
        assert!(reclaim(&path, std::process::id(), Keeps::Pid1).is_err());
        pidfd_kill(&kept.pid1fd, libc::SIGKILL);
        confirm(&kept.conn).unwrap();
        assert_eq!(wait_exit(kept.conn).await, Some(137));
        launcher.join().unwrap();
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }

    #[test]
    fn an_adopter_that_never_confirms_does_not_extend_the_wait() {
        let (mut child, pid1fd, keeper, path, _theirs) = setup("unconfirmed");
        let pid1 = Pid::from_raw(child.id() as i32);
        let knocker = std::thread::spawn({
            let path = path.clone();
            move || {
                // Takes the fds and drops them, twice, as a helper crashing
                // mid-adoption would.
                for _ in 0..2 {
                    drop(reclaim(&path, std::process::id(), Keeps::Pid1).expect("an orphan hands its vm over"));
                    std::thread::sleep(Duration::from_millis(150));
                }
            }
        });
        let begun = Instant::now();
        assert!(keeper.keep(pid1, &pid1fd, None, Duration::from_millis(400)).is_none());
        knocker.join().unwrap();
        let status = child.wait().unwrap();
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGKILL));
        assert!(begun.elapsed() < Duration::from_secs(5), "the wait ran on from the first loss");
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }

    #[tokio::test]
    async fn a_vm_is_not_handed_to_a_process_running_qemus_program() {
        // "qemu" here is a python3, and so is the knocker: to the keeper it
        // is that vm's (or another vm's) qemu, which a guest may control.
        let dir = std::env::temp_dir().join(format!("keep-{}-kin", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("keep.sock");
        let mut qemu = std::process::Command::new("python3").args(["-c", "import time; time.sleep(600)"]).spawn().unwrap();
        let qemufd = pidfd_open(qemu.id() as i32).unwrap();
        let keeper = Keeper { listener: bind_keeper(&path).unwrap(), helper_end: None, link: None, keeps: Keeps::Qemu };
        let pid = Pid::from_raw(qemu.id() as i32);
        let launcher = std::thread::spawn(move || {
            let adopter = keeper.keep(pid, &qemufd, None, Duration::from_secs(60));
            let status = qemu.wait().unwrap();
            let code = 128 + std::os::unix::process::ExitStatusExt::signal(&status).unwrap_or(0);
            adopter.as_ref().inspect(|a| report_exit(a, code)).is_some()
        });
        let knock = "import socket,sys\ns = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n\
                     s.settimeout(10)\ns.connect(sys.argv[1])\n\
                     try:\n    s.send(b'adopt:1')\n    print(s.recv(256))\nexcept OSError as e:\n    print(type(e).__name__)";
        let out = std::process::Command::new("python3").args(["-c", knock]).arg(&path).output().unwrap();
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(said.trim() == "b''" || said.contains("Error"), "a kin process got an answer: {said}");
        // A helper (this test process) still gets it, qemu's pidfd alone.
        let p = path.clone();
        let pid = std::process::id();
        let kept = tokio::task::spawn_blocking(move || reclaim(&p, pid, Keeps::Qemu)).await.unwrap().expect("handed over");
        assert!(kept.control.is_none() && kept.link.is_none());
        confirm(&kept.conn).unwrap();
        pidfd_kill(&kept.pid1fd, libc::SIGKILL);
        assert_eq!(wait_report(kept.conn).await, Some(137));
        assert!(launcher.join().unwrap(), "adopted by the helper");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
