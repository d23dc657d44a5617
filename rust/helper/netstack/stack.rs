//! One VM's stack: a tokio task that reads the VM's packets, decides new
//! flows before smoltcp sees them, and runs smoltcp for the accepted ones.
//!
//! A SYN to a new destination is held: the policy decides, the helper
//! connects on the host, and only then is a smoltcp socket listening on
//! that exact destination created and the held SYN handed to it. Refusal or
//! a failed connect is an RST at once. UDP and DNS never enter smoltcp.
//!
//! Bounds, so one VM cannot exhaust the helper's descriptors or memory for
//! every other VM: at most [`MAX_FLOWS`] TCP flows (one host socket each),
//! of which [`MAX_CONNECTING`] may be waiting for their host connect; at
//! most [`MAX_DNS_IN_FLIGHT`] DNS queries upstream (one UDP socket each).
//! A flow whose guest side falls silent for [`FLOW_TIMEOUT`] (a SYN-ACK
//! never acknowledged, a dead peer that no longer answers keep-alives) is
//! aborted. Socket buffers are 2 × [`SOCKET_BUFFER`] per flow, so a VM's
//! TCP buffers are bounded by 256 × 2 MiB = 512 MiB, touched only as data
//! actually flows.
use std::collections::HashMap;
use std::net::{SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use smoltcp::iface::{Config, Interface, SocketHandle, SocketSet};
use smoltcp::socket::tcp;
use smoltcp::wire::{
    HardwareAddress, IpAddress, IpCidr, IpListenEndpoint, IpProtocol, Ipv4Packet, TcpPacket, UdpPacket,
};
use tokio::net::TcpStream;
use tokio::sync::{Notify, mpsc};

use super::device::PacketDevice;
use super::dns::{self, Pins};
use super::events::Events;
use super::tcp::{Flow, Key};
use super::udp::Nat;
use super::{DNS, GATEWAY, GUEST, wire};
use sandbox_net::policy::{NetworkPolicy, Verdict};

/// A host connect that takes longer than this fails the flow (RST).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Most TCP flows (open or being connected) per VM: a few hundred VMs stay
/// well under the helper's raised descriptor limit.
const MAX_FLOWS: usize = 256;
/// Most flows per VM waiting for their host connect.
const MAX_CONNECTING: usize = 64;
/// Most DNS queries per VM waiting for an upstream answer.
const MAX_DNS_IN_FLIGHT: usize = 64;
/// A flow whose guest sent nothing (not even an ACK) for this long is
/// aborted: a handshake never completed, or a peer that is gone.
const FLOW_TIMEOUT: Duration = Duration::from_secs(60);
/// Idle flows are probed this often, so a live idle peer's answers keep
/// it under [`FLOW_TIMEOUT`].
const KEEP_ALIVE: Duration = Duration::from_secs(20);
/// Per-socket buffers: large, for window scaling and throughput; memory is
/// only touched as data flows.
const SOCKET_BUFFER: usize = 1 << 20;
/// Packets read from the link per round, so one busy VM cannot starve its
/// own flows' timers.
const READ_BATCH: usize = 256;

/// What the VM's policy decisions need, shared with helper tasks.
pub struct Ctx {
    /// The VM's policy.
    pub policy: NetworkPolicy,
    /// Its refusals and counters.
    pub events: Arc<Events>,
    /// Names its DNS answers tied to addresses.
    pub pins: Mutex<Pins>,
    /// Where its DNS queries go.
    pub upstreams: Vec<SocketAddr>,
}

impl Ctx {
    /// Checks a new flow to `dst` with the names its address is pinned to;
    /// records the outcome.
    fn check_flow(&self, proto: &'static str, dst: SocketAddrV4) -> bool {
        let ip = *dst.ip();
        if ip.octets()[..3] == GUEST.octets()[..3] {
            let reason = format!("{ip} is the sandbox's own network: only DNS at {DNS}:53 answers there");
            self.events.refused(proto, dst.to_string(), None, reason);
            return false;
        }
        let names = self.pins.lock().unwrap_or_else(|e| e.into_inner()).names(ip, std::time::Instant::now());
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        match self.policy.check(SocketAddr::V4(dst), &refs, &super::host_addrs()) {
            Verdict::Allow => {
                self.events.allowed();
                true
            }
            Verdict::Deny(reason) => {
                self.events.refused(proto, dst.to_string(), names.first().map(String::as_str), reason);
                false
            }
        }
    }

    /// The second check of a TCP flow, against a name its client bytes
    /// carry (a TLS SNI or the Host of each HTTP request).
    pub fn check_name(&self, dst: SocketAddr, name: &str) -> bool {
        match self.policy.check(dst, &[name], &super::host_addrs()) {
            Verdict::Allow => true,
            Verdict::Deny(reason) => {
                self.events.refused("tcp", dst.to_string(), Some(name), reason);
                false
            }
        }
    }

    /// Records the refusal of a flow whose verdict depends on a name when
    /// its bytes carry none we can check (`why`).
    pub fn refuse_unnamed(&self, dst: SocketAddr, why: &str) {
        let reason = format!(
            "{why}: the policy allows {dst} only for some names, so every connection to it must name its host \
             where the sandbox can check it (one TLS SNI, one Host per HTTP/1 request)"
        );
        self.events.refused("tcp", dst.to_string(), None, reason);
    }
}

/// Messages from the stack's helper tasks.
pub enum Msg {
    /// The host connect for a held SYN succeeded.
    Connected { key: Key, syn: Vec<u8>, stream: TcpStream },
    /// It failed; the SYN gets its RST.
    Failed { key: Key, syn: Vec<u8>, error: String },
    /// A datagram for the VM's UDP `port` from `from`.
    UdpReply { port: u16, from: SocketAddrV4, data: Vec<u8> },
    /// A DNS answer for the VM's UDP `port`.
    DnsReply { port: u16, data: Vec<u8> },
}

enum Tuple {
    Connecting,
    Open,
}

struct Stack {
    dev: PacketDevice,
    iface: Interface,
    sockets: SocketSet<'static>,
    flows: HashMap<SocketHandle, Flow>,
    tuples: HashMap<Key, Tuple>,
    nat: Nat,
    ctx: Arc<Ctx>,
    msgs: mpsc::UnboundedSender<Msg>,
    wake: Arc<Notify>,
    epoch: std::time::Instant,
    dns_in_flight: Arc<AtomicUsize>,
}

/// One DNS query upstream; counted until dropped.
struct DnsSlot(Arc<AtomicUsize>);

impl Drop for DnsSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Runs a VM's stack until its link closes.
pub async fn run(mut dev: PacketDevice, ctx: Arc<Ctx>) {
    let epoch = std::time::Instant::now();
    let mut config = Config::new(HardwareAddress::Ip);
    config.random_seed = random_seed();
    let mut iface = Interface::new(config, &mut dev, smoltcp::time::Instant::from_micros(0));
    iface.update_ip_addrs(|addrs| {
        let _ = addrs.push(IpCidr::new(IpAddress::Ipv4(GATEWAY), 24));
    });
    // any_ip: smoltcp answers for every destination routed via an address
    // of its own, so a socket can listen on the VM's real destination.
    let _ = iface.routes_mut().add_default_ipv4_route(GATEWAY);
    iface.set_any_ip(true);
    let (msgs, mut inbox) = mpsc::unbounded_channel();
    let mut s = Stack {
        dev,
        iface,
        sockets: SocketSet::new(Vec::new()),
        flows: HashMap::new(),
        tuples: HashMap::new(),
        nat: Nat::default(),
        ctx,
        msgs,
        wake: Arc::new(Notify::new()),
        epoch,
        dns_in_flight: Arc::new(AtomicUsize::new(0)),
    };
    loop {
        for _ in 0..READ_BATCH {
            match s.dev.read() {
                Ok(Some(packet)) => s.inbound(packet),
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(error = %e, "vm link closed");
                    return;
                }
            }
        }
        while let Ok(msg) = inbox.try_recv() {
            s.message(msg);
        }
        s.poll();
        s.reap();
        let moved = s.pump();
        s.poll();
        s.nat.expire(std::time::Instant::now());
        // Packets left unread (a full batch) are not waited for.
        if moved > 0 || !s.dev.drained() {
            tokio::task::yield_now().await;
            continue;
        }
        let now = s.now();
        let delay = s.iface.poll_delay(now, &s.sockets).map_or(Duration::from_secs(1), Duration::from);
        let wake = s.wake.clone();
        tokio::select! {
            r = s.dev.readable() => if r.is_err() { return },
            Some(msg) = inbox.recv() => s.message(msg),
            _ = wake.notified() => {}
            _ = tokio::time::sleep(delay) => {}
        }
    }
}

fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(std::process::id().into());
    h.finish()
}

impl Stack {
    fn now(&self) -> smoltcp::time::Instant {
        smoltcp::time::Instant::from_micros(self.epoch.elapsed().as_micros() as i64)
    }

    fn poll(&mut self) {
        let now = self.now();
        self.iface.poll(now, &mut self.dev, &mut self.sockets);
    }

    /// Sorts one packet from the VM: new TCP flows are decided here, other
    /// TCP goes to smoltcp, UDP and DNS are handled directly.
    fn inbound(&mut self, packet: Vec<u8>) {
        let Ok(ip) = Ipv4Packet::new_checked(&packet[..]) else { return };
        // The VM has one address; anything else is spoofed or v6 (not
        // served). Fragments are not reassembled: the link MTU makes them
        // unnecessary.
        if ip.version() != 4 || ip.src_addr() != GUEST || ip.more_frags() || ip.frag_offset() != 0 {
            return;
        }
        let dst_ip = ip.dst_addr();
        match ip.next_header() {
            IpProtocol::Tcp => {
                let Ok(tcp) = TcpPacket::new_checked(ip.payload()) else { return };
                let key = (SocketAddrV4::new(GUEST, tcp.src_port()), SocketAddrV4::new(dst_ip, tcp.dst_port()));
                match self.tuples.get(&key) {
                    None if tcp.syn() && !tcp.ack() => {
                        let rst = wire::tcp_rst(&ip, &tcp);
                        self.new_flow(key, packet, rst);
                    }
                    // Retransmitted SYNs wait for the connect under way.
                    Some(Tuple::Connecting) => {}
                    _ => self.dev.queue(packet, false),
                }
            }
            IpProtocol::Udp => {
                let Ok(udp) = UdpPacket::new_checked(ip.payload()) else { return };
                let dst = SocketAddrV4::new(dst_ip, udp.dst_port());
                let (port, data) = (udp.src_port(), udp.payload().to_vec());
                if dst == SocketAddrV4::new(DNS, 53) {
                    self.dns(port, data);
                } else if self.ctx.check_flow("udp", dst) {
                    self.nat.send(port, dst, &data, &self.msgs);
                } else {
                    self.dev.write(&wire::port_unreachable(&packet, GATEWAY, GUEST));
                }
            }
            _ => {}
        }
    }

    fn new_flow(&mut self, key: Key, syn: Vec<u8>, rst: Vec<u8>) {
        let connecting = self.tuples.values().filter(|t| matches!(t, Tuple::Connecting)).count();
        let limit = if self.tuples.len() >= MAX_FLOWS {
            Some(format!("too many connections: at most {MAX_FLOWS} per sandbox"))
        } else if connecting >= MAX_CONNECTING {
            Some(format!("too many connections being opened: at most {MAX_CONNECTING} at once per sandbox"))
        } else {
            None
        };
        if let Some(reason) = limit {
            tracing::debug!(%reason, "refusing a new tcp flow");
            self.ctx.events.refused("tcp", key.1.to_string(), None, reason);
            self.dev.write(&rst);
            return;
        }
        if !self.ctx.check_flow("tcp", key.1) {
            self.dev.write(&rst);
            return;
        }
        self.tuples.insert(key, Tuple::Connecting);
        let msgs = self.msgs.clone();
        tokio::spawn(async move {
            let msg = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(key.1)).await {
                Ok(Ok(stream)) => Msg::Connected { key, syn, stream },
                Ok(Err(e)) => Msg::Failed { key, syn, error: e.to_string() },
                Err(_) => Msg::Failed { key, syn, error: "connect timed out".into() },
            };
            let _ = msgs.send(msg);
        });
    }

    fn dns(&mut self, port: u16, query: Vec<u8>) {
        let name = match dns::query_name(&query) {
            Ok(name) => name,
            Err(e @ dns::DnsError::QuestionCount(_)) => {
                self.ctx.events.refused("dns", "10.0.2.3:53".into(), None, e.to_string());
                if let Ok(reply) = dns::refused(&query) {
                    self.reply_dns(port, &reply);
                }
                return;
            }
            Err(e) => {
                tracing::debug!(error = %e, "dropping a malformed dns query");
                return;
            }
        };
        if let Verdict::Deny(reason) = self.ctx.policy.check_query(&name) {
            self.ctx.events.refused("dns", name, None, reason);
            if let Ok(reply) = dns::refused(&query) {
                self.reply_dns(port, &reply);
            }
            return;
        }
        if self.dns_in_flight.fetch_add(1, Ordering::SeqCst) >= MAX_DNS_IN_FLIGHT {
            self.dns_in_flight.fetch_sub(1, Ordering::SeqCst);
            let reason = format!("too many dns queries waiting for an answer: at most {MAX_DNS_IN_FLIGHT} per sandbox");
            self.ctx.events.refused("dns", name, None, reason);
            if let Ok(reply) = dns::servfail(&query) {
                self.reply_dns(port, &reply);
            }
            return;
        }
        let slot = DnsSlot(self.dns_in_flight.clone());
        self.ctx.events.allowed();
        let (ctx, msgs) = (self.ctx.clone(), self.msgs.clone());
        tokio::spawn(async move {
            let _slot = slot;
            let Some(answer) = dns::forward(&query, &ctx.upstreams).await else { return };
            match dns::filter_answer(&answer) {
                Ok(filtered) => {
                    let now = std::time::Instant::now();
                    let mut pins = ctx.pins.lock().unwrap_or_else(|e| e.into_inner());
                    for (addr, names, ttl) in &filtered.pins {
                        for name in names {
                            pins.pin(*addr, name, *ttl, now);
                        }
                    }
                    drop(pins);
                    let _ = msgs.send(Msg::DnsReply { port, data: filtered.reply });
                }
                Err(e) => tracing::debug!(error = %e, "dropping a malformed dns answer"),
            }
        });
    }

    fn reply_dns(&mut self, port: u16, data: &[u8]) {
        self.dev.write(&wire::udp(SocketAddrV4::new(DNS, 53), SocketAddrV4::new(GUEST, port), data));
    }

    fn message(&mut self, msg: Msg) {
        match msg {
            Msg::Connected { key, syn, stream } => {
                if !matches!(self.tuples.get(&key), Some(Tuple::Connecting)) {
                    return;
                }
                let mut sock = tcp::Socket::new(
                    tcp::SocketBuffer::new(vec![0; SOCKET_BUFFER]),
                    tcp::SocketBuffer::new(vec![0; SOCKET_BUFFER]),
                );
                sock.set_nagle_enabled(false);
                sock.set_timeout(Some(FLOW_TIMEOUT.into()));
                sock.set_keep_alive(Some(KEEP_ALIVE.into()));
                let endpoint = IpListenEndpoint { addr: Some(IpAddress::Ipv4(*key.1.ip())), port: key.1.port() };
                if sock.listen(endpoint).is_err() {
                    self.tuples.remove(&key);
                    return;
                }
                let handle = self.sockets.add(sock);
                let inspect = self.ctx.policy.name_decides(SocketAddr::V4(key.1));
                self.flows.insert(handle, Flow::start(key, stream, inspect, self.wake.clone()));
                self.tuples.insert(key, Tuple::Open);
                // The held SYN, now that a socket listens for it; polled at
                // once so no other flow's SYN can reach this socket first.
                self.dev.queue(syn, true);
                self.poll();
            }
            Msg::Failed { key, syn, error } => {
                tracing::debug!(dst = %key.1, %error, "egress connect failed");
                self.tuples.remove(&key);
                if let Ok(ip) = Ipv4Packet::new_checked(&syn[..])
                    && let Ok(tcp) = TcpPacket::new_checked(ip.payload())
                {
                    self.dev.write(&wire::tcp_rst(&ip, &tcp));
                }
            }
            Msg::UdpReply { port, from, data } => {
                if self.nat.accepts(port, from) {
                    self.dev.write(&wire::udp(from, SocketAddrV4::new(GUEST, port), &data));
                }
            }
            Msg::DnsReply { port, data } => self.reply_dns(port, &data),
        }
    }

    fn pump(&mut self) -> usize {
        let mut moved = 0;
        for (handle, flow) in &mut self.flows {
            moved += flow.pump(self.sockets.get_mut::<tcp::Socket>(*handle), &self.ctx);
        }
        moved
    }

    /// Forgets flows whose socket is closed (after its RST or FIN went out).
    fn reap(&mut self) {
        let closed: Vec<SocketHandle> = self
            .flows
            .keys()
            .copied()
            .filter(|h| self.sockets.get::<tcp::Socket>(*h).state() == tcp::State::Closed)
            .collect();
        for handle in closed {
            if let Some(flow) = self.flows.remove(&handle) {
                self.tuples.remove(&flow.key);
            }
            self.sockets.remove(handle);
        }
    }
}
