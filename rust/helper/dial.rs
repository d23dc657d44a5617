//! Dial: a TCP connection to a port inside a VM, made from the VM's own
//! network namespace, so the guest sees a plain loopback client and needs
//! no veth, no port mapping and no listener on any host interface.
//!
//! Entering the VM's network namespace takes rights in the VM's user
//! namespace, which an ordinary user's helper has only from inside it, and
//! only a single-threaded process may join a user namespace. So each dial
//! forks a child (from a short-lived thread, never a tokio worker) that
//! joins the VM's user and network namespaces, connects, hands the socket
//! back over a socket pair and exits. The connected socket keeps belonging
//! to the VM's namespace wherever it is then used. The child of a
//! multithreaded process may only make async-signal-safe calls: it makes
//! nothing but raw system calls on values prepared before the fork.

use std::net::TcpStream as StdTcpStream;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::socket::{AddressFamily, ControlMessageOwned, MsgFlags, SockFlag, SockType, recvmsg, socketpair};
use tokio::net::TcpStream;

use super::driver::launch::VmNamespaces;
use super::error::HelperError;

/// A loopback connect answers at once; this only bounds a guest whose
/// listen backlog is full (the kernel then drops our SYNs and retries).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Connects to `127.0.0.1:port` inside the network namespace of VM `vm`
/// (named in errors).
pub async fn connect(vm: &str, ns: Arc<VmNamespaces>, port: u32) -> Result<TcpStream, HelperError> {
    let port16 = u16::try_from(port)
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| HelperError::invalid("start.port", format!("{port} is not a TCP port")))?;
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(format!("dial-{port16}"))
        .spawn(move || {
            let _ = tx.send(connect_in(&ns, port16));
        })
        .map_err(|e| HelperError::io("start a dial thread", e))?;
    let connected = rx.await.map_err(|_| HelperError::io("dial", std::io::Error::other("the dial thread died")))?;
    let stream = connected.map_err(|e| match e.kind() {
        std::io::ErrorKind::ConnectionRefused => HelperError::DialRefused { vm: vm.into(), port },
        _ => HelperError::io(format!("connect to port {port} in vm {vm}"), e),
    })?;
    stream
        .set_nonblocking(true)
        .and_then(|()| stream.set_nodelay(true))
        .and_then(|()| TcpStream::from_std(stream))
        .map_err(|e| HelperError::io("register the dial socket", e))
}

fn connect_in(ns: &VmNamespaces, port: u16) -> std::io::Result<StdTcpStream> {
    // Seqpacket: a child that dies without answering reads as end of file.
    let (ours, theirs) = socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)?;
    // SAFETY: sockaddr_in is plain data; zeroed is a valid value.
    let mut addr: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    addr.sin_family = libc::AF_INET as libc::sa_family_t;
    addr.sin_port = port.to_be();
    addr.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
    let timeout = libc::timeval { tv_sec: CONNECT_TIMEOUT.as_secs() as libc::time_t, tv_usec: 0 };
    let (user, net, reply) = (ns.user.as_raw_fd(), ns.net.as_raw_fd(), theirs.as_raw_fd());
    // SAFETY: the child runs only `child_connect` (raw system calls on the
    // values above) and _exit.
    let pid = match unsafe { libc::fork() } {
        -1 => return Err(std::io::Error::last_os_error()),
        // SAFETY: see above.
        0 => unsafe { libc::_exit(child_connect(user, net, reply, &addr, &timeout)) },
        pid => pid,
    };
    drop(theirs);
    let got = receive(&ours);
    let mut status = 0;
    // SAFETY: waiting for the child we just forked.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    got
}

/// The forked child: join the namespaces, connect, send the socket (or the
/// errno, as 4 bytes without an fd). Returns the exit code.
///
/// # Safety
/// Only async-signal-safe calls; every pointer is to the parent's stack,
/// copied into the child.
unsafe fn child_connect(user: i32, net: i32, reply: i32, addr: &libc::sockaddr_in, timeout: &libc::timeval) -> i32 {
    let errno = || std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO);
    // SAFETY: raw system calls on fds and on memory we own.
    unsafe {
        let fd = if libc::setns(user, libc::CLONE_NEWUSER) != 0 || libc::setns(net, libc::CLONE_NEWNET) != 0 {
            Err(errno())
        } else {
            let s = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            let tv_len = std::mem::size_of::<libc::timeval>() as libc::socklen_t;
            // A full listen backlog makes the kernel retry our SYNs: bounded.
            if s < 0
                || libc::setsockopt(
                    s,
                    libc::SOL_SOCKET,
                    libc::SO_SNDTIMEO,
                    (timeout as *const libc::timeval).cast(),
                    tv_len,
                ) != 0
                || libc::connect(s, (addr as *const libc::sockaddr_in).cast(), len) != 0
            {
                Err(errno())
            } else {
                Ok(s)
            }
        };
        let mut payload: [u8; 4] = match fd {
            Ok(_) => 0i32.to_ne_bytes(),
            Err(e) => e.to_ne_bytes(),
        };
        let mut iov = libc::iovec { iov_base: payload.as_mut_ptr().cast(), iov_len: payload.len() };
        // Room for one cmsghdr carrying one fd, aligned for cmsghdr.
        let mut control = [0u64; 4];
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if let Ok(s) = fd {
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<i32>() as u32) as _;
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<i32>() as u32) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<i32>(), s);
        }
        if libc::sendmsg(reply, &msg, 0) < 0 { 1 } else { 0 }
    }
}

/// The child's answer: the connected socket, or its errno.
fn receive(ours: &OwnedFd) -> std::io::Result<StdTcpStream> {
    let mut payload = [0u8; 4];
    let mut cmsg = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    let mut iov = [std::io::IoSliceMut::new(&mut payload)];
    let msg = recvmsg::<()>(ours.as_raw_fd(), &mut iov, Some(&mut cmsg), MsgFlags::MSG_CMSG_CLOEXEC)?;
    let mut fds = Vec::new();
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(rights) = c {
            fds.extend(rights);
        }
    }
    let n = msg.bytes;
    match (n, fds.as_slice()) {
        // SAFETY: SCM_RIGHTS just gave us this fd; we own it now.
        (4, [fd]) => Ok(unsafe { StdTcpStream::from_raw_fd(*fd) }),
        (4, []) => Err(std::io::Error::from_raw_os_error(i32::from_ne_bytes(payload))),
        _ => Err(std::io::Error::other("the dial child exited without an answer")),
    }
}
