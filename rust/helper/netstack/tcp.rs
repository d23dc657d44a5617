//! One TCP flow: a smoltcp socket facing the VM, a host TcpStream facing the
//! destination, and a relay task between them with bounded channels, so a
//! slow side stalls the other (backpressure through both TCP windows).
//! Half-close travels both ways; a reset on either side aborts the other.
//!
//! Where a name decides the flow's verdict, its client bytes are read before
//! they go upstream ([`Inspector`]): each TLS SNI or HTTP Host is checked
//! against the policy again, and bytes that name nothing checkable are
//! refused. At most 16 KiB are held back while a name is awaited (the
//! parsers' bound, below [`CHUNK`], so a flow never waits on a full
//! buffer). Upstream → client is never held, so server-speaks-first
//! protocols are not delayed; flows where no name decides are not read.
use std::net::{SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use smoltcp::socket::tcp;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::{CancellationToken, DropGuard};

use super::inspect::{Inspector, Step};
use super::stack::Ctx;

/// Largest chunk moved at once between a socket and a channel.
const CHUNK: usize = 64 * 1024;
/// Chunks in flight per direction.
const DEPTH: usize = 8;

/// (VM side, destination) of a flow.
pub type Key = (SocketAddrV4, SocketAddrV4);

/// The stack's side of a flow.
pub struct Flow {
    /// Its addresses.
    pub key: Key,
    /// Client → upstream; None once the client's FIN was passed on.
    up: Option<mpsc::Sender<Vec<u8>>>,
    /// Upstream → client; closed when upstream sent its FIN.
    down: mpsc::Receiver<Vec<u8>>,
    pending: Vec<u8>,
    sent: usize,
    fin_sent: bool,
    /// Reads the client's bytes while a name may still decide.
    inspect: Option<Inspector>,
    /// Client bytes taken from the socket but not yet upstream; the first
    /// `cleared` of them have passed the inspector.
    held: Vec<u8>,
    cleared: usize,
    /// Bytes read into `held` so far, and that count when the inspector last
    /// wanted more: it is not asked again (re-parsing up to 16 KiB on every
    /// poll) until more arrive.
    read: u64,
    waiting_at: Option<u64>,
    reset: Arc<AtomicBool>,
    _relay: DropGuard,
}

impl Flow {
    /// Starts the relay for a connected `stream`; `inspect` when a name
    /// the client's bytes carry may change the flow's verdict.
    pub fn start(key: Key, stream: TcpStream, inspect: bool, wake: Arc<Notify>) -> Flow {
        let (up_tx, up_rx) = mpsc::channel(DEPTH);
        let (down_tx, down_rx) = mpsc::channel(DEPTH);
        let reset = Arc::new(AtomicBool::new(false));
        let cancel = CancellationToken::new();
        tokio::spawn(relay(stream, up_rx, down_tx, reset.clone(), wake, cancel.clone()));
        Flow {
            key,
            up: Some(up_tx),
            down: down_rx,
            pending: Vec::new(),
            sent: 0,
            fin_sent: false,
            inspect: inspect.then(Inspector::default),
            held: Vec::new(),
            cleared: 0,
            read: 0,
            waiting_at: None,
            reset,
            _relay: cancel.drop_guard(),
        }
    }

    /// Moves what can move now; returns the bytes moved.
    pub fn pump(&mut self, sock: &mut tcp::Socket<'_>, ctx: &Ctx) -> usize {
        if self.reset.load(Ordering::Relaxed) {
            sock.abort();
            return 0;
        }
        let mut moved = 0;
        if self.inspect.is_some() || !self.held.is_empty() {
            match self.pump_inspected(sock, ctx) {
                Some(n) => moved += n,
                None => {
                    sock.abort();
                    return 0;
                }
            }
            // Bytes read past the inspector must not overtake those held.
            if self.inspect.is_some() || !self.held.is_empty() {
                if self.held.is_empty() && client_finished(sock) {
                    self.up = None;
                }
                return moved + self.pump_down(sock);
            }
        }
        if let Some(up) = &self.up {
            while sock.can_recv() {
                let Ok(permit) = up.try_reserve() else { break };
                let chunk = sock.recv(|b| {
                    let n = b.len().min(CHUNK);
                    (n, b[..n].to_vec())
                });
                let Ok(chunk) = chunk else { break };
                moved += chunk.len();
                permit.send(chunk);
            }
            if client_finished(sock) {
                self.up = None;
            }
        }
        moved + self.pump_down(sock)
    }

    /// Moves client bytes through the inspector: reads them into `held`,
    /// checks each name found, sends what passed. None: refused (the
    /// refusal is recorded), the flow must be reset.
    fn pump_inspected(&mut self, sock: &mut tcp::Socket<'_>, ctx: &Ctx) -> Option<usize> {
        let dst = SocketAddr::V4(self.key.1);
        let mut moved = 0;
        loop {
            while let Some(inspector) = &mut self.inspect {
                let pending = &self.held[self.cleared..];
                let step = if self.waiting_at == Some(self.read) { Step::NeedMore } else { inspector.next(pending) };
                match step {
                    Step::Pass { len, name } => {
                        if let Some(name) = name
                            && !ctx.check_name(dst, &name)
                        {
                            return None;
                        }
                        self.cleared += len.min(pending.len());
                    }
                    Step::Rest => {
                        self.cleared = self.held.len();
                        self.inspect = None;
                    }
                    Step::NeedMore => {
                        if !pending.is_empty() && client_finished(sock) {
                            let why =
                                "the connection was closed in the middle of a TLS ClientHello or HTTP request head";
                            ctx.refuse_unnamed(dst, why);
                            return None;
                        }
                        self.waiting_at = Some(self.read);
                        break;
                    }
                    Step::Unnamed(why) => {
                        ctx.refuse_unnamed(dst, &why);
                        return None;
                    }
                }
            }
            let mut progress = false;
            if self.cleared > 0
                && let Some(up) = &self.up
                && let Ok(permit) = up.try_reserve()
            {
                let rest = self.held.split_off(self.cleared);
                permit.send(std::mem::replace(&mut self.held, rest));
                self.cleared = 0;
                progress = true;
            }
            // Once the inspector is gone, what is left here goes first,
            // then the plain path takes over.
            if self.inspect.is_some() && self.held.len() < CHUNK && sock.can_recv() {
                let room = CHUNK - self.held.len();
                let held = &mut self.held;
                let n = sock
                    .recv(|b| {
                        let n = b.len().min(room);
                        held.extend_from_slice(&b[..n]);
                        (n, n)
                    })
                    .unwrap_or(0);
                moved += n;
                self.read += n as u64;
                progress |= n > 0;
            }
            if !progress {
                return Some(moved);
            }
        }
    }

    fn pump_down(&mut self, sock: &mut tcp::Socket<'_>) -> usize {
        let mut moved = 0;
        loop {
            if self.sent < self.pending.len() {
                if !sock.can_send() {
                    break;
                }
                let n = sock.send_slice(&self.pending[self.sent..]).unwrap_or(0);
                if n == 0 {
                    break;
                }
                self.sent += n;
                moved += n;
                continue;
            }
            match self.down.try_recv() {
                Ok(chunk) => {
                    self.pending = chunk;
                    self.sent = 0;
                }
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    if !self.fin_sent {
                        self.fin_sent = true;
                        sock.close();
                    }
                    break;
                }
            }
        }
        moved
    }
}

/// Whether the client sent its FIN and every byte before it was read.
/// A socket still in its handshake (SYN-RECEIVED: the held SYN was
/// answered, the client's ACK is on its way) cannot receive yet either, but
/// has not finished: taken for finished, the flow would half-close upstream
/// before the client's first byte (seen with a guest slow to ACK, a vm under
/// TCG).
fn client_finished(sock: &tcp::Socket<'_>) -> bool {
    let handshaking = matches!(sock.state(), tcp::State::Listen | tcp::State::SynReceived | tcp::State::SynSent);
    !handshaking && !sock.may_recv() && !sock.can_recv()
}

/// Copies between the host stream and the flow's channels until both
/// directions end, an error resets the flow, or the stack drops the flow.
async fn relay(
    stream: TcpStream,
    mut up_rx: mpsc::Receiver<Vec<u8>>,
    down_tx: mpsc::Sender<Vec<u8>>,
    reset: Arc<AtomicBool>,
    wake: Arc<Notify>,
    cancel: CancellationToken,
) {
    let _ = stream.set_nodelay(true);
    let (mut rd, mut wr) = stream.into_split();
    let fail = || {
        reset.store(true, Ordering::Relaxed);
        wake.notify_one();
    };
    let upstream = async {
        while let Some(chunk) = up_rx.recv().await {
            if wr.write_all(&chunk).await.is_err() {
                fail();
                return;
            }
            // Room in the channel again: the stack may read more.
            wake.notify_one();
        }
        let _ = wr.shutdown().await;
    };
    let downstream = async {
        let mut buf = vec![0u8; CHUNK];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) => break,
                Ok(n) => {
                    if down_tx.send(buf[..n].to_vec()).await.is_err() {
                        return;
                    }
                    wake.notify_one();
                }
                Err(_) => {
                    fail();
                    return;
                }
            }
        }
        drop(down_tx);
        wake.notify_one();
    };
    tokio::select! {
        _ = cancel.cancelled() => {}
        _ = async { tokio::join!(upstream, downstream) } => {}
    }
}
