//! Sandbox networking, the namespace side: loopback (every VM) and, for
//! EGRESS, eth0 as a tun whose other end is the helper's stack
//! ([`crate::helper::netstack`]).
//!
//! Every VM has its own network namespace. NONE leaves it with only `lo`.
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;

use super::DriverError;

/// Brings `lo` up in the calling process's network namespace.
pub fn loopback_up() -> Result<(), DriverError> {
    let sys = |what: &str| DriverError::Sys { what: what.into(), source: nix::errno::Errno::last() };
    // SAFETY: plain socket/ioctl calls on a zeroed ifreq we own.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(sys("socket for lo"));
        }
        let fd = OwnedFd::from_raw_fd(fd);
        let mut req: libc::ifreq = std::mem::zeroed();
        for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
            *dst = *src as libc::c_char;
        }
        if libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) < 0 {
            return Err(sys("SIOCGIFFLAGS lo"));
        }
        req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        if libc::ioctl(fd.as_raw_fd(), libc::SIOCSIFFLAGS, &req) < 0 {
            return Err(sys("SIOCSIFFLAGS lo"));
        }
    }
    Ok(())
}

/// Writes the VM's resolv.conf: the helper's stack answers DNS.
pub fn write_resolv_conf(dest: &Path) -> Result<(), DriverError> {
    let text = format!("nameserver {}\n", crate::helper::netstack::DNS);
    std::fs::write(dest, text).map_err(|e| DriverError::io(format!("write {}", dest.display()), e))
}

/// The tun device's flags (`linux/if_tun.h`): IP packets without the
/// packet-information header.
const IFF_TUN: libc::c_short = 0x0001;
const IFF_NO_PI: libc::c_short = 0x1000;

/// The launcher, right after unsharing its user and network namespaces:
/// creates eth0 as a tun in the latter and sends the tun's fd to the helper
/// (message `tun` with SCM_RIGHTS), keeping no copy. A VM without EGRESS
/// never sees the device: its launcher moves to a network namespace of its
/// own (see [`super::init`]).
///
/// The open of /dev/net/tun is checked against the launcher's host
/// credentials, which it still has here (ids are mapped later); the tun
/// belongs to the namespace of its opener, hence the unshare first.
pub fn create_tun(control: &OwnedFd) -> Result<(), DriverError> {
    let sys = |what: &'static str| move |source| DriverError::Sys { what: what.into(), source };
    let tun = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open("/dev/net/tun")
        .map_err(|e| DriverError::io("open /dev/net/tun", e))?;
    let req = eth0_tun_request();
    // SAFETY: TUNSETIFF reads the ifreq we own.
    if unsafe { libc::ioctl(tun.as_raw_fd(), libc::TUNSETIFF as _, &req) } < 0 {
        return Err(DriverError::Sys { what: "TUNSETIFF eth0".into(), source: nix::errno::Errno::last() });
    }
    let fds = [tun.as_raw_fd()];
    let cmsg = [nix::sys::socket::ControlMessage::ScmRights(&fds)];
    let iov = [std::io::IoSlice::new(b"tun")];
    nix::sys::socket::sendmsg::<()>(control.as_raw_fd(), &iov, &cmsg, nix::sys::socket::MsgFlags::empty(), None)
        .map_err(sys("send the tun to the helper"))?;
    Ok(())
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

/// PID 1 of an EGRESS VM: eth0 up as 10.0.2.15/24 with `mtu` (the link's,
/// see [`crate::helper::netstack::device`]) and the default route via
/// 10.0.2.2 (the helper's stack). The vm driver's guest init calls it too,
/// so both drivers' sandboxes see the same network.
pub fn eth0_up(mtu: usize) -> Result<(), DriverError> {
    use crate::helper::netstack::{GATEWAY, GUEST, PREFIX};
    let sys = |what: &str| DriverError::Sys { what: what.into(), source: nix::errno::Errno::last() };
    let sockaddr = |ip: std::net::Ipv4Addr| {
        // SAFETY: a zeroed sockaddr_in is valid; we fill family and address.
        let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        sa.sin_family = libc::AF_INET as libc::sa_family_t;
        sa.sin_addr.s_addr = u32::from(ip).to_be();
        // SAFETY: sockaddr_in fits in sockaddr (both 16 bytes).
        unsafe { std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(sa) }
    };
    let mask = std::net::Ipv4Addr::from(u32::MAX << (32 - u32::from(PREFIX)));
    // SAFETY: socket/ioctl calls on zeroed structs we own.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(sys("socket for eth0"));
        }
        let fd = OwnedFd::from_raw_fd(fd);
        let mut req: libc::ifreq = std::mem::zeroed();
        for (dst, src) in req.ifr_name.iter_mut().zip(b"eth0\0") {
            *dst = *src as libc::c_char;
        }
        req.ifr_ifru.ifru_mtu = mtu as libc::c_int;
        if libc::ioctl(fd.as_raw_fd(), libc::SIOCSIFMTU, &req) < 0 {
            return Err(sys("SIOCSIFMTU eth0"));
        }
        req.ifr_ifru.ifru_addr = sockaddr(GUEST);
        if libc::ioctl(fd.as_raw_fd(), libc::SIOCSIFADDR, &req) < 0 {
            return Err(sys("SIOCSIFADDR eth0"));
        }
        req.ifr_ifru.ifru_netmask = sockaddr(mask);
        if libc::ioctl(fd.as_raw_fd(), libc::SIOCSIFNETMASK, &req) < 0 {
            return Err(sys("SIOCSIFNETMASK eth0"));
        }
        req.ifr_ifru.ifru_flags = (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        if libc::ioctl(fd.as_raw_fd(), libc::SIOCSIFFLAGS, &req) < 0 {
            return Err(sys("SIOCSIFFLAGS eth0"));
        }
        let mut route: libc::rtentry = std::mem::zeroed();
        route.rt_dst = sockaddr(std::net::Ipv4Addr::UNSPECIFIED);
        route.rt_genmask = sockaddr(std::net::Ipv4Addr::UNSPECIFIED);
        route.rt_gateway = sockaddr(GATEWAY);
        route.rt_flags = libc::RTF_UP | libc::RTF_GATEWAY;
        if libc::ioctl(fd.as_raw_fd(), libc::SIOCADDRT, &route) < 0 {
            return Err(sys("SIOCADDRT default via the gateway"));
        }
    }
    Ok(())
}

/// A pidfd for `pid`: signals through it can never hit a recycled pid.
pub fn pidfd_open(pid: i32) -> Result<OwnedFd, DriverError> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(DriverError::Sys { what: format!("pidfd_open {pid}"), source: nix::errno::Errno::last() });
    }
    // SAFETY: the kernel just returned this fd to us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Sends `signal` through a pidfd.
pub fn pidfd_kill(pidfd: &OwnedFd, signal: i32) {
    // SAFETY: pidfd_send_signal on a pidfd we own; the siginfo pointer is null.
    unsafe {
        libc::syscall(libc::SYS_pidfd_send_signal, pidfd.as_raw_fd(), signal, std::ptr::null::<u8>(), 0);
    }
}
