//! UDP from the VM, NAT style: one host socket per VM-side source port,
//! replies accepted only from destinations that port already sent to (and
//! the policy allowed), idle flows closed, their number bounded.
use std::collections::{HashMap, HashSet};
use std::net::{SocketAddr, SocketAddrV4};
use std::time::{Duration, Instant};

use tokio::net::UdpSocket;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::stack::Msg;

/// A flow unused this long is closed.
const IDLE: Duration = Duration::from_secs(60);
/// Most flows per VM; the least recently used goes first.
const MAX_FLOWS: usize = 256;

struct Flow {
    /// Sending side: a plain nonblocking socket, since tokio's try_send_to
    /// fails until the runtime has seen the socket writable.
    sock: std::net::UdpSocket,
    peers: HashSet<SocketAddrV4>,
    last: Instant,
    reader: JoinHandle<()>,
}

impl Drop for Flow {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// The VM's UDP flows.
#[derive(Default)]
pub struct Nat {
    flows: HashMap<u16, Flow>,
}

impl Nat {
    /// Sends `data` from the VM's `port` to `dst` (already allowed).
    pub fn send(&mut self, port: u16, dst: SocketAddrV4, data: &[u8], msgs: &mpsc::UnboundedSender<Msg>) {
        let now = Instant::now();
        if !self.flows.contains_key(&port) {
            if self.flows.len() >= MAX_FLOWS
                && let Some(oldest) = self.flows.iter().min_by_key(|(_, f)| f.last).map(|(p, _)| *p)
            {
                self.flows.remove(&oldest);
            }
            match open(port, msgs.clone()) {
                Ok(flow) => {
                    self.flows.insert(port, flow);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "udp socket for the vm");
                    return;
                }
            }
        }
        if let Some(flow) = self.flows.get_mut(&port) {
            flow.last = now;
            flow.peers.insert(dst);
            let _ = flow.sock.send_to(data, SocketAddr::V4(dst));
        }
    }

    /// Whether a reply from `from` to the VM's `port` may pass.
    pub fn accepts(&mut self, port: u16, from: SocketAddrV4) -> bool {
        match self.flows.get_mut(&port) {
            Some(flow) if flow.peers.contains(&from) => {
                flow.last = Instant::now();
                true
            }
            _ => false,
        }
    }

    /// Closes idle flows.
    pub fn expire(&mut self, now: Instant) {
        self.flows.retain(|_, f| now.duration_since(f.last) < IDLE);
    }
}

fn open(port: u16, msgs: mpsc::UnboundedSender<Msg>) -> std::io::Result<Flow> {
    let std_sock = std::net::UdpSocket::bind("0.0.0.0:0")?;
    std_sock.set_nonblocking(true)?;
    let sock = std_sock.try_clone()?;
    let reader_sock = UdpSocket::from_std(std_sock)?;
    let reader = tokio::spawn(async move {
        let mut buf = vec![0u8; 65536];
        while let Ok((n, from)) = reader_sock.recv_from(&mut buf).await {
            if let SocketAddr::V4(from) = from
                && msgs.send(Msg::UdpReply { port, from, data: buf[..n].to_vec() }).is_err()
            {
                return;
            }
        }
    });
    Ok(Flow { sock, peers: HashSet::new(), last: Instant::now(), reader })
}
