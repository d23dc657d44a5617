//! What a sandbox's PID 1 sets up in its own network namespace, the same on
//! both drivers (the namespace driver's init and the vm driver's guest):
//! `lo` up, and with EGRESS eth0's address, route and resolv.conf, as the
//! [`crate::plan`] lays them out.
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

/// Why a step of the setup failed.
pub type SetupError = sandbox_base::error::SysError;

/// Brings `lo` up in the calling process's network namespace.
pub fn loopback_up() -> Result<(), SetupError> {
    let sys = |what: &str| SetupError::Sys { what: what.into(), source: nix::errno::Errno::last() };
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
pub fn write_resolv_conf(dest: &Path) -> Result<(), SetupError> {
    let text = format!("nameserver {}\n", crate::plan::DNS);
    std::fs::write(dest, text).map_err(|e| SetupError::io(format!("write {}", dest.display()), e))
}

/// PID 1 of an EGRESS VM: eth0 up as 10.0.2.15/24 with `mtu` (the link's,
/// see [`crate::plan`]) and the default route via
/// 10.0.2.2 (the helper's stack). The vm driver's guest init calls it too,
/// so both drivers' sandboxes see the same network.
pub fn eth0_up(mtu: usize) -> Result<(), SetupError> {
    use crate::plan::{GATEWAY, GUEST, PREFIX};
    let sys = |what: &str| SetupError::Sys { what: what.into(), source: nix::errno::Errno::last() };
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
