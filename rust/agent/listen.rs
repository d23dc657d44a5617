//! Where the agent takes its connection from (`sandbox-vm-helper agent
//! --listen ADDR`), and serving each connection as one multiplexed stream
//! of requests ([`super::mux`]).
//!
//! - `unix:PATH`: listen on a Unix socket; every accepted connection is
//!   served (a helper that restarts connects again).
//! - `fd:N`: an inherited descriptor: a listening socket (accepted like
//!   `unix:`), or a connected byte stream served as one connection.
//! - `serial:PATH`: a character device such as a virtio-serial port
//!   (`/dev/virtio-ports/NAME`): one connection, reopened whenever it ends
//!   (the host side closed it), so a new helper can take over.
//! - `vsock:PORT`: listen on `AF_VSOCK` port PORT of any CID.
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::AgentError;
use super::background::Registry;
use super::mux::Mux;

/// A parsed `--listen` address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    /// `unix:PATH`.
    Unix(PathBuf),
    /// `fd:N`.
    Fd(i32),
    /// `serial:PATH`.
    Serial(PathBuf),
    /// `vsock:PORT`.
    Vsock(u32),
}

impl std::str::FromStr for Address {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (scheme, rest) =
            s.split_once(':').ok_or_else(|| format!("{s:?}: expected unix:PATH, fd:N, serial:PATH or vsock:PORT"))?;
        let nonempty = |what: &str| {
            if rest.is_empty() { Err(format!("{s:?}: {what} is empty")) } else { Ok(PathBuf::from(rest)) }
        };
        match scheme {
            "unix" => Ok(Address::Unix(nonempty("the socket path")?)),
            "serial" => Ok(Address::Serial(nonempty("the device path")?)),
            "fd" => match rest.parse::<i32>() {
                Ok(n) if n >= 0 => Ok(Address::Fd(n)),
                _ => Err(format!("{s:?}: {rest:?} is not a descriptor number")),
            },
            "vsock" => match rest.parse::<u32>() {
                // u32::MAX is VMADDR_PORT_ANY.
                Ok(p) if p != u32::MAX => Ok(Address::Vsock(p)),
                _ => Err(format!("{s:?}: {rest:?} is not a vsock port")),
            },
            other => Err(format!("{s:?}: unknown scheme {other:?}; expected unix, fd, serial or vsock")),
        }
    }
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> AgentError {
    let what = what.into();
    move |source| AgentError::Io { what, source }
}

/// Serves `address` until it fails; returns the error that stopped it.
pub async fn serve(address: Address) -> AgentError {
    let background = Arc::new(Registry::default());
    let result = match address {
        Address::Unix(path) => {
            let _ = std::fs::remove_file(&path);
            match std::os::unix::net::UnixListener::bind(&path) {
                Ok(l) => accept_unix(l, background).await,
                Err(e) => Err(io(format!("bind {}", path.display()))(e)),
            }
        }
        Address::Fd(n) => {
            // SAFETY: the caller handed us this descriptor to own.
            let fd = unsafe { OwnedFd::from_raw_fd(n) };
            serve_fd(fd, background).await
        }
        Address::Serial(path) => serve_serial(&path, background).await,
        Address::Vsock(port) => match vsock_listener(port) {
            Ok(fd) => accept_raw(fd, background).await,
            Err(e) => Err(io(format!("listen on vsock port {port}"))(e)),
        },
    };
    match result {
        Ok(never) => match never {},
        Err(e) => e,
    }
}

/// Serves connections accepted on a listening Unix socket.
pub async fn accept_unix(
    listener: std::os::unix::net::UnixListener,
    background: Arc<Registry>,
) -> Result<std::convert::Infallible, AgentError> {
    listener.set_nonblocking(true).map_err(io("listener nonblocking"))?;
    let listener = tokio::net::UnixListener::from_std(listener).map_err(io("listener"))?;
    loop {
        let (stream, _) = listener.accept().await.map_err(io("accept"))?;
        tokio::spawn(connection(stream, background.clone()));
    }
}

/// Serves every stream the helper opens on one connection, until it ends.
pub async fn connection<S>(io: S, background: Arc<Registry>)
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (_mux, mut incoming) = Mux::serve(io);
    while let Some(stream) = incoming.recv().await {
        tokio::spawn(super::session::handle(stream, background.clone()));
    }
}

async fn serve_fd(fd: OwnedFd, background: Arc<Registry>) -> Result<std::convert::Infallible, AgentError> {
    use nix::sys::socket::{AddressFamily, SockaddrLike as _, getsockname, getsockopt, sockopt};
    let listening = getsockopt(&fd, sockopt::AcceptConn).unwrap_or(false);
    if !listening {
        let stream = FdStream::new(fd).map_err(io("register the agent descriptor"))?;
        connection(stream, background).await;
        return Err(AgentError::Io {
            what: "serve the inherited descriptor".into(),
            source: std::io::Error::other("the connection ended"),
        });
    }
    let family = getsockname::<nix::sys::socket::SockaddrStorage>(fd.as_raw_fd()).ok().and_then(|a| a.family());
    if family == Some(AddressFamily::Unix) {
        return accept_unix(std::os::unix::net::UnixListener::from(fd), background).await;
    }
    accept_raw(fd, background).await
}

async fn serve_serial(
    path: &std::path::Path,
    background: Arc<Registry>,
) -> Result<std::convert::Infallible, AgentError> {
    use std::os::unix::fs::OpenOptionsExt as _;
    loop {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOCTTY | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(path)
            .map_err(io(format!("open {}", path.display())))?;
        let stream = FdStream::new(OwnedFd::from(file)).map_err(io(format!("register {}", path.display())))?;
        connection(stream, background.clone()).await;
        // The host closed the port: wait for the next helper without spinning.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn vsock_listener(port: u32) -> std::io::Result<OwnedFd> {
    // SAFETY: plain socket calls on values we own.
    unsafe {
        let s = libc::socket(libc::AF_VSOCK, libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0);
        if s < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let fd = OwnedFd::from_raw_fd(s);
        let mut addr: libc::sockaddr_vm = std::mem::zeroed();
        addr.svm_family = libc::AF_VSOCK as libc::sa_family_t;
        addr.svm_cid = libc::VMADDR_CID_ANY;
        addr.svm_port = port;
        let len = std::mem::size_of::<libc::sockaddr_vm>() as libc::socklen_t;
        if libc::bind(s, (&addr as *const libc::sockaddr_vm).cast(), len) != 0 || libc::listen(s, 16) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(fd)
    }
}

/// Accepts on a listening socket of any family tokio has no type for (vsock).
async fn accept_raw(listener: OwnedFd, background: Arc<Registry>) -> Result<std::convert::Infallible, AgentError> {
    let flags = nix::fcntl::OFlag::O_NONBLOCK;
    nix::fcntl::fcntl(&listener, nix::fcntl::FcntlArg::F_SETFL(flags))
        .map_err(|e| io("listener nonblocking")(e.into()))?;
    // SAFETY: we own the descriptor, and it stays open as long as the AsyncFd.
    let listener = unsafe { AsyncFd::register(listener) }.map_err(|e| io("register the listener")(e.into()))?;
    loop {
        let mut guard = listener.readable().await.map_err(io("wait for a connection"))?;
        let accepted = guard.try_io(|l| {
            // SAFETY: accept4 on our listening socket; no address wanted.
            let s = unsafe {
                libc::accept4(
                    l.as_raw_fd(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                )
            };
            if s < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                // SAFETY: accept4 just returned this descriptor.
                Ok(unsafe { OwnedFd::from_raw_fd(s) })
            }
        });
        match accepted {
            Ok(Ok(fd)) => {
                let stream = FdStream::new(fd).map_err(io("register a connection"))?;
                tokio::spawn(connection(stream, background.clone()));
            }
            Ok(Err(e)) => return Err(io("accept")(e)),
            Err(_would_block) => continue,
        }
    }
}

/// A nonblocking descriptor (socket or character device) as a tokio stream.
pub struct FdStream {
    fd: AsyncFd<OwnedFd>,
}

impl FdStream {
    /// Registers `fd` (made nonblocking) with the runtime.
    pub fn new(fd: OwnedFd) -> std::io::Result<Self> {
        let flags = nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_GETFL).map_err(std::io::Error::from)?;
        let flags = nix::fcntl::OFlag::from_bits_truncate(flags) | nix::fcntl::OFlag::O_NONBLOCK;
        nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_SETFL(flags)).map_err(std::io::Error::from)?;
        // SAFETY: we own the descriptor, and it stays open as long as the AsyncFd.
        Ok(FdStream { fd: unsafe { AsyncFd::register(fd) }.map_err(std::io::Error::from)? })
    }
}

fn syscall_result(n: isize) -> std::io::Result<usize> {
    if n < 0 { Err(std::io::Error::last_os_error()) } else { Ok(n as usize) }
}

impl AsyncRead for FdStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        loop {
            let mut guard = ready!(self.fd.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            // SAFETY: reading into memory we own, within its length.
            let got = guard.try_io(|fd| {
                syscall_result(unsafe { libc::read(fd.as_raw_fd(), unfilled.as_mut_ptr().cast(), unfilled.len()) })
            });
            match got {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl AsyncWrite for FdStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<std::io::Result<usize>> {
        loop {
            let mut guard = ready!(self.fd.poll_write_ready(cx))?;
            // SAFETY: writing from memory we own, within its length.
            let put = guard
                .try_io(|fd| syscall_result(unsafe { libc::write(fd.as_raw_fd(), data.as_ptr().cast(), data.len()) }));
            match put {
                Ok(result) => return Poll::Ready(result),
                Err(_would_block) => continue,
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_and_bad_ones_say_why() {
        assert_eq!("unix:/run/a.sock".parse(), Ok(Address::Unix("/run/a.sock".into())));
        assert_eq!("fd:3".parse(), Ok(Address::Fd(3)));
        assert_eq!("serial:/dev/virtio-ports/agent".parse(), Ok(Address::Serial("/dev/virtio-ports/agent".into())));
        assert_eq!("vsock:1024".parse(), Ok(Address::Vsock(1024)));
        for (bad, says) in [
            ("nothing", "expected unix:PATH"),
            ("unix:", "socket path is empty"),
            ("fd:-1", "not a descriptor"),
            ("fd:x", "not a descriptor"),
            ("vsock:4294967295", "not a vsock port"),
            ("tcp:80", "unknown scheme"),
        ] {
            let e = bad.parse::<Address>().unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[tokio::test]
    async fn an_inherited_stream_descriptor_is_served() {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let agent = tokio::spawn(serve(Address::Fd(std::os::fd::IntoRawFd::into_raw_fd(theirs))));
        ours.set_nonblocking(true).unwrap();
        let helper = Mux::open_side(tokio::net::UnixStream::from_std(ours).unwrap());
        let mut s = helper.open(super::super::protocol::Frame::Ping).unwrap();
        assert_eq!(s.next().await.unwrap(), Some(super::super::protocol::Frame::Pong));
        agent.abort();
    }
}
