//! Sandbox networking, the namespace side: for EGRESS, eth0 as a tun whose
//! other end is the helper's stack ([`crate::netstack`]); what PID 1 sets up
//! in it (loopback, eth0's address and route, resolv.conf) is
//! [`sandbox_net::setup`], shared with the vm driver's guest.
//!
//! Every VM has its own network namespace. NONE leaves it with only `lo`.
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt as _;

use super::DriverError;

/// The tun device's flags (`linux/if_tun.h`): IP packets without the
/// packet-information header.
const IFF_TUN: libc::c_short = 0x0001;
const IFF_NO_PI: libc::c_short = 0x1000;

/// The launcher, right after unsharing its user and network namespaces:
/// creates eth0 as a tun in the latter and sends the tun's fd to the helper
/// (message `tun` with SCM_RIGHTS) and returns its own copy, which keeps
/// the device through a helper's death (see [`super::keep`]). A VM without EGRESS
/// never sees the device: its launcher moves to a network namespace of its
/// own (see [`super::init`]).
///
/// The open of /dev/net/tun is checked against the launcher's host
/// credentials, which it still has here (ids are mapped later); the tun
/// belongs to the namespace of its opener, hence the unshare first.
pub fn create_tun(control: &OwnedFd) -> Result<OwnedFd, DriverError> {
    let sys = |what: &'static str| move |source| DriverError::sys(what, source);
    let tun = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open("/dev/net/tun")
        .map_err(|e| DriverError::io("open /dev/net/tun", e))?;
    let req = eth0_tun_request();
    // SAFETY: TUNSETIFF reads the ifreq we own.
    if unsafe { libc::ioctl(tun.as_raw_fd(), libc::TUNSETIFF as _, &req) } < 0 {
        return Err(DriverError::sys("TUNSETIFF eth0", nix::errno::Errno::last()));
    }
    let fds = [tun.as_raw_fd()];
    let cmsg = [nix::sys::socket::ControlMessage::ScmRights(&fds)];
    let iov = [std::io::IoSlice::new(b"tun")];
    nix::sys::socket::sendmsg::<()>(control.as_raw_fd(), &iov, &cmsg, nix::sys::socket::MsgFlags::empty(), None)
        .map_err(sys("send the tun to the helper"))?;
    Ok(tun.into())
}

/// The TUNSETIFF request that makes a tun `eth0` without packet info. It
/// allocates nothing, so `doctor` can use it in a forked child before exec.
pub fn eth0_tun_request() -> libc::ifreq {
    // SAFETY: a zeroed ifreq is valid; name and flags are filled in place.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"eth0\0") {
        *dst = *src as libc::c_char;
    }
    req.ifr_ifru.ifru_flags = IFF_TUN | IFF_NO_PI;
    req
}

/// A pidfd for `pid`: signals through it can never hit a recycled pid.
pub fn pidfd_open(pid: i32) -> Result<OwnedFd, DriverError> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(DriverError::sys(format!("pidfd_open {pid}"), nix::errno::Errno::last()));
    }
    // SAFETY: the kernel just returned this fd to us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Whether the process behind `pidfd` has exited (its pidfd reads ready).
pub fn pidfd_exited(pidfd: &OwnedFd) -> bool {
    use std::os::fd::AsFd as _;
    let mut fds = [nix::poll::PollFd::new(pidfd.as_fd(), nix::poll::PollFlags::POLLIN)];
    !matches!(nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO), Ok(0))
}

/// Sends `signal` through a pidfd.
pub fn pidfd_kill(pidfd: &OwnedFd, signal: i32) {
    // SAFETY: pidfd_send_signal on a pidfd we own; the siginfo pointer is null.
    unsafe {
        libc::syscall(libc::SYS_pidfd_send_signal, pidfd.as_raw_fd(), signal, std::ptr::null::<u8>(), 0);
    }
}
