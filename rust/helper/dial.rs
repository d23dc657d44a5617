//! Dial: a TCP connection to a port inside a VM, made from the VM's own
//! network namespace, so the guest sees a plain loopback client and needs
//! no veth, no port mapping and no listener on any host interface.
//!
//! `setns` changes the namespace of the calling thread only, and a tokio
//! worker must never change namespace, so each dial gets a short-lived
//! thread of its own: it enters the VM's namespace, connects, hands the
//! socket back and exits, which also means no thread is ever left in the
//! wrong namespace, whatever fails. The connected socket keeps belonging to
//! the VM's namespace wherever it is then used.
use std::net::{Ipv4Addr, SocketAddr, TcpStream as StdTcpStream};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use nix::sched::{CloneFlags, setns};
use tokio::net::TcpStream;

use super::error::HelperError;

/// A loopback connect answers at once; this only bounds a guest whose
/// listen backlog is full (the kernel then drops our SYNs and retries).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Connects to `127.0.0.1:port` inside the network namespace `netns` of
/// VM `vm` (named in errors).
pub async fn connect(vm: &str, netns: Arc<OwnedFd>, port: u32) -> Result<TcpStream, HelperError> {
    let port16 = u16::try_from(port)
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| HelperError::invalid("start.port", format!("{port} is not a TCP port")))?;
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(format!("dial-{port16}"))
        .spawn(move || {
            let _ = tx.send(connect_in(&netns, port16));
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

fn connect_in(netns: &OwnedFd, port: u16) -> std::io::Result<StdTcpStream> {
    setns(netns, CloneFlags::CLONE_NEWNET).map_err(std::io::Error::from)?;
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    StdTcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)
}
