//! A VM's network link as a packet device. Two kinds of link carry the
//! same IPv4 packets, so stack, flows and policy are one implementation:
//!
//! - [`LinkKind::Packets`]: any fd that delivers one IPv4 packet per read and
//!   takes one per write (a tun opened with IFF_NO_PI, a SOCK_DGRAM or
//!   SEQPACKET socket): the namespace driver's eth0.
//! - [`LinkKind::EthernetDatagrams`]: a datagram socket carrying one
//!   Ethernet frame per datagram: the vm driver's virtio-net card (qemu's
//!   `-netdev dgram`), and what a Mac's `VZFileHandleNetworkDeviceAttachment`
//!   reads and writes. Frames are unwrapped to IP packets here: ARP requests
//!   for the gateway and the DNS address get this end's MAC, other ARP
//!   (spoofed replies included) and other ether types are dropped, and
//!   packets to the VM go out in a frame from [`super::GATEWAY_MAC`] to
//!   [`super::GUEST_MAC`]. [`frame_socket`] makes the pair; [`relay_as_frames`] puts a
//!   tun's packets on one the way a guest's card would (the Linux double
//!   of the Swift layer).
//!
//! The stack reads packets here, inspects them, and feeds the ones smoltcp
//! should see through [`Device`].
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd};

use smoltcp::phy::{Checksum, ChecksumCapabilities, Device, DeviceCapabilities, Medium};
use smoltcp::time::Instant;
use smoltcp::wire::{ArpOperation, ArpPacket, ArpRepr, EthernetAddress, EthernetFrame, EthernetProtocol, EthernetRepr};
use tokio::io::unix::AsyncFd;

use super::{DNS, GATEWAY, GATEWAY_MAC, GUEST, GUEST_MAC};

pub use sandbox_net::plan::{ETHERNET_MTU, MTU};
/// The largest frame read from an Ethernet link: a maximal IPv4 packet in
/// its Ethernet header.
const MAX_FRAME: usize = 14 + 65535;
/// Frames one read takes that carry no packet (ARP, other ether types,
/// garbage) before it lets the stack's other work run: a guest flooding
/// them does not hold the stack's task.
const NO_PACKET_BUDGET: usize = 64;
const ETHERNET_HEADER: usize = 14;

/// What the link's fd carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkKind {
    /// One IPv4 packet per read or write.
    Packets,
    /// One Ethernet frame per datagram.
    EthernetDatagrams,
}

/// The fd and what its framing needs.
struct Link {
    fd: AsyncFd<OwnedFd>,
    framing: Framing,
    scratch: Vec<u8>,
    /// The last read stopped at its budget, not at an empty link.
    more: bool,
}

enum Framing {
    Packets,
    /// With the buffer each datagram is read into.
    EthernetDatagrams(Vec<u8>),
}

/// One link, nonblocking.
pub struct PacketDevice {
    link: Link,
    /// Packets read but not yet consumed by smoltcp.
    rx: VecDeque<Vec<u8>>,
    /// The last read found the link empty, so waiting for readiness cannot
    /// miss data already there.
    drained: bool,
}

impl PacketDevice {
    /// Wraps `fd`, a link of `kind` (set nonblocking here).
    pub fn new(fd: OwnedFd, kind: LinkKind) -> std::io::Result<Self> {
        nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK))?;
        // SAFETY: we own the fd, and it stays open as long as the AsyncFd.
        let fd = unsafe { AsyncFd::register(fd) }?;
        let framing = match kind {
            LinkKind::Packets => Framing::Packets,
            LinkKind::EthernetDatagrams => Framing::EthernetDatagrams(vec![0u8; MAX_FRAME]),
        };
        let link = Link { fd, framing, scratch: Vec::with_capacity(MTU), more: false };
        Ok(PacketDevice { link, rx: VecDeque::new(), drained: false })
    }

    /// Whether the last [`read`](Self::read) found nothing left: only then
    /// may the stack sleep until [`readable`](Self::readable).
    pub fn drained(&self) -> bool {
        self.drained
    }

    /// Waits until the link may have packets to read.
    pub async fn readable(&self) -> std::io::Result<()> {
        let mut guard = self.link.fd.readable().await?;
        guard.clear_ready();
        Ok(())
    }

    /// Reads one IP packet without blocking; None when there is none now.
    pub fn read(&mut self) -> std::io::Result<Option<Vec<u8>>> {
        let packet = self.link.read();
        self.drained = matches!(packet, Ok(None)) && !self.link.more;
        packet
    }

    /// Writes one IP packet to the VM. A full queue drops it, as a real
    /// link would; TCP retransmits.
    pub fn write(&mut self, packet: &[u8]) {
        self.link.send(packet);
    }

    /// Queues a packet for smoltcp; `front` puts it before everything else
    /// (a held SYN, now that its flow exists).
    pub fn queue(&mut self, packet: Vec<u8>, front: bool) {
        if front { self.rx.push_front(packet) } else { self.rx.push_back(packet) }
    }
}

/// One read(2): the byte count, None when the fd has nothing now; 0 (the
/// end of a tun) is an error.
fn read_fd(fd: &AsyncFd<OwnedFd>, buf: &mut [u8]) -> std::io::Result<Option<usize>> {
    match read_datagram(fd, buf)? {
        Some(0) => Err(std::io::ErrorKind::UnexpectedEof.into()),
        n => Ok(n),
    }
}

/// One read(2) of a datagram socket, where 0 is an empty datagram (a
/// datagram peer that closes is not an end to read).
fn read_datagram(fd: &AsyncFd<OwnedFd>, buf: &mut [u8]) -> std::io::Result<Option<usize>> {
    // SAFETY: read into a buffer we borrow, of its length.
    let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        return match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted => Ok(None),
            _ => Err(e),
        };
    }
    Ok(Some(n as usize))
}

/// One write(2): the byte count, 0 when the fd takes nothing now.
fn write_fd(fd: &AsyncFd<OwnedFd>, bytes: &[u8]) -> usize {
    // SAFETY: write from a slice we borrow, of its length.
    let n = unsafe { libc::write(fd.as_raw_fd(), bytes.as_ptr().cast(), bytes.len()) };
    if n < 0 {
        tracing::trace!(error = %std::io::Error::last_os_error(), "write to the vm's link failed");
        return 0;
    }
    n as usize
}

impl Link {
    fn read(&mut self) -> std::io::Result<Option<Vec<u8>>> {
        self.more = false;
        match &mut self.framing {
            Framing::Packets => {
                let mut buf = vec![0u8; MTU + 64];
                let Some(n) = read_fd(&self.fd, &mut buf)? else { return Ok(None) };
                buf.truncate(n);
                Ok(Some(buf))
            }
            Framing::EthernetDatagrams(buf) => {
                for _ in 0..NO_PACKET_BUDGET {
                    // A longer datagram is cut to the buffer (the rest is
                    // discarded by the socket), and its packet then fails
                    // the stack's length checks.
                    let Some(n) = read_datagram(&self.fd, buf)? else { return Ok(None) };
                    match unwrap_frame(&buf[..n]) {
                        Unwrapped::Ip(packet) => return Ok(Some(packet)),
                        Unwrapped::ArpReply(reply) => {
                            write_fd(&self.fd, &reply);
                        }
                        Unwrapped::Dropped => {}
                    }
                }
                self.more = true;
                Ok(None)
            }
        }
    }

    fn send(&mut self, packet: &[u8]) {
        match &mut self.framing {
            Framing::Packets => {
                if write_fd(&self.fd, packet) == 0 {
                    tracing::trace!("packet to the vm dropped");
                }
            }
            // A datagram the socket cannot take now is dropped, as on a
            // full queue.
            Framing::EthernetDatagrams(_) => {
                if write_fd(&self.fd, &ip_frame(GATEWAY_MAC, GUEST_MAC, packet)) == 0 {
                    tracing::trace!("frame to the vm dropped");
                }
            }
        }
    }
}

/// `packet` in an Ethernet frame from `src` to `dst`.
fn ip_frame(src: EthernetAddress, dst: EthernetAddress, packet: &[u8]) -> Vec<u8> {
    let mut frame = vec![0u8; ETHERNET_HEADER + packet.len()];
    let mut eth = EthernetFrame::new_unchecked(&mut frame[..]);
    EthernetRepr { src_addr: src, dst_addr: dst, ethertype: EthernetProtocol::Ipv4 }.emit(&mut eth);
    eth.payload_mut().copy_from_slice(packet);
    frame
}

/// Socket buffers of a frame socket, per Apple's advice for
/// `VZFileHandleNetworkDeviceAttachment` (receive at least twice send): a
/// burst of full frames waits here instead of being dropped.
const FRAME_SNDBUF: usize = 1 << 20;
const FRAME_RCVBUF: usize = 4 << 20;

/// A connected pair of datagram sockets for one card's frames: the
/// stack's end and the card's (handed to the VM layer).
pub fn frame_socket() -> std::io::Result<(OwnedFd, OwnedFd)> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, setsockopt, socketpair, sockopt};
    // Close-on-exec from the start: another thread may fork meanwhile.
    let (a, b) = socketpair(AddressFamily::Unix, SockType::Datagram, None, SockFlag::SOCK_CLOEXEC)?;
    for fd in [&a, &b] {
        // Best effort: a host that caps them (net.core.*mem_max) still
        // carries frames, only with less slack.
        let _ = setsockopt(fd, sockopt::SndBuf, &FRAME_SNDBUF);
        let _ = setsockopt(fd, sockopt::RcvBuf, &FRAME_RCVBUF);
    }
    Ok((a, b))
}

/// Relays a packet link (`tun`, one IPv4 packet per read) to a frame
/// socket as a guest's card would: each packet leaves in a frame from
/// [`GUEST_MAC`] to [`GATEWAY_MAC`], and each IPv4 frame to [`GUEST_MAC`]
/// arriving comes in as its packet (anything else is dropped: a packet
/// link has no ARP to answer). Runs until either end fails or closes.
pub async fn relay_as_frames(tun: OwnedFd, frames: OwnedFd) -> std::io::Result<()> {
    for fd in [&tun, &frames] {
        nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK))?;
    }
    // SAFETY: we own both fds, and they stay open as long as their AsyncFd.
    let (tun, frames) = unsafe { (AsyncFd::register(tun)?, AsyncFd::register(frames)?) };
    let mut buf = vec![0u8; MAX_FRAME];
    loop {
        tokio::select! {
            ready = tun.readable() => {
                let mut guard = ready?;
                while let Some(n) = read_fd(&tun, &mut buf)? {
                    write_fd(&frames, &ip_frame(GUEST_MAC, GATEWAY_MAC, &buf[..n]));
                }
                guard.clear_ready();
            }
            ready = frames.readable() => {
                let mut guard = ready?;
                while let Some(n) = read_datagram(&frames, &mut buf)? {
                    if let Ok(eth) = EthernetFrame::new_checked(&buf[..n])
                        && eth.ethertype() == EthernetProtocol::Ipv4
                        && eth.dst_addr() == GUEST_MAC
                    {
                        write_fd(&tun, eth.payload());
                    }
                }
                guard.clear_ready();
            }
        }
    }
}

enum Unwrapped {
    /// An IPv4 packet for the stack.
    Ip(Vec<u8>),
    /// A frame answering the VM's ARP request.
    ArpReply(Vec<u8>),
    Dropped,
}

/// What one Ethernet frame from the VM is to the stack.
fn unwrap_frame(frame: &[u8]) -> Unwrapped {
    let Ok(eth) = EthernetFrame::new_checked(frame) else { return Unwrapped::Dropped };
    match eth.ethertype() {
        EthernetProtocol::Ipv4 => Unwrapped::Ip(eth.payload().to_vec()),
        EthernetProtocol::Arp => arp_reply(eth.payload()).map_or(Unwrapped::Dropped, Unwrapped::ArpReply),
        _ => Unwrapped::Dropped,
    }
}

/// The answer to an ARP request from the VM's address for the gateway or
/// the DNS address; None for anything else (replies, gratuitous ARP,
/// requests from other addresses or for other addresses): this end's idea
/// of who is where never changes.
fn arp_reply(payload: &[u8]) -> Option<Vec<u8>> {
    let packet = ArpPacket::new_checked(payload).ok()?;
    let ArpRepr::EthernetIpv4 { operation, source_hardware_addr, source_protocol_addr, target_protocol_addr, .. } =
        ArpRepr::parse(&packet).ok()?
    else {
        return None;
    };
    if operation != ArpOperation::Request
        || source_protocol_addr != GUEST
        || !(target_protocol_addr == GATEWAY || target_protocol_addr == DNS)
        || !source_hardware_addr.is_unicast()
    {
        return None;
    }
    let reply = ArpRepr::EthernetIpv4 {
        operation: ArpOperation::Reply,
        source_hardware_addr: GATEWAY_MAC,
        source_protocol_addr: target_protocol_addr,
        target_hardware_addr: source_hardware_addr,
        target_protocol_addr: source_protocol_addr,
    };
    let mut frame = vec![0u8; ETHERNET_HEADER + reply.buffer_len()];
    let mut eth = EthernetFrame::new_unchecked(&mut frame[..]);
    EthernetRepr { src_addr: GATEWAY_MAC, dst_addr: source_hardware_addr, ethertype: EthernetProtocol::Arp }
        .emit(&mut eth);
    reply.emit(&mut ArpPacket::new_unchecked(eth.payload_mut()));
    Some(frame)
}

/// A packet handed to smoltcp.
pub struct Rx(Vec<u8>);

/// A packet smoltcp writes, sent to the VM when consumed.
pub struct Tx<'a> {
    link: &'a mut Link,
}

impl smoltcp::phy::RxToken for Rx {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(&self.0)
    }
}

impl smoltcp::phy::TxToken for Tx<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut scratch = std::mem::take(&mut self.link.scratch);
        scratch.clear();
        scratch.resize(len, 0);
        let r = f(&mut scratch);
        self.link.send(&scratch);
        self.link.scratch = scratch;
        r
    }
}

impl Device for PacketDevice {
    type RxToken<'a> = Rx;
    type TxToken<'a> = Tx<'a>;

    fn receive(&mut self, _now: Instant) -> Option<(Rx, Tx<'_>)> {
        let packet = self.rx.pop_front()?;
        Some((Rx(packet), Tx { link: &mut self.link }))
    }

    fn transmit(&mut self, _now: Instant) -> Option<Tx<'_>> {
        Some(Tx { link: &mut self.link })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        // Frames are unwrapped at this boundary: smoltcp always sees IP.
        caps.medium = Medium::Ip;
        caps.max_transmission_unit = match self.link.framing {
            Framing::Packets => MTU,
            Framing::EthernetDatagrams(_) => ETHERNET_MTU,
        };
        // The VM's kernel checksummed what it wrote into a memory link;
        // verifying again only costs throughput. What we send is summed.
        let mut sums = ChecksumCapabilities::default();
        sums.ipv4 = Checksum::Tx;
        sums.tcp = Checksum::Tx;
        sums.udp = Checksum::Tx;
        sums.icmpv4 = Checksum::Tx;
        caps.checksum = sums;
        caps
    }
}

#[cfg(test)]
mod tests {
    use smoltcp::wire::EthernetAddress;

    use super::*;

    fn arp(operation: ArpOperation, sender: std::net::Ipv4Addr, target: std::net::Ipv4Addr) -> Vec<u8> {
        let repr = ArpRepr::EthernetIpv4 {
            operation,
            source_hardware_addr: GUEST_MAC,
            source_protocol_addr: sender,
            target_hardware_addr: EthernetAddress([0; 6]),
            target_protocol_addr: target,
        };
        let mut frame = vec![0u8; ETHERNET_HEADER + repr.buffer_len()];
        let mut eth = EthernetFrame::new_unchecked(&mut frame[..]);
        EthernetRepr { src_addr: GUEST_MAC, dst_addr: EthernetAddress::BROADCAST, ethertype: EthernetProtocol::Arp }
            .emit(&mut eth);
        repr.emit(&mut ArpPacket::new_unchecked(eth.payload_mut()));
        frame
    }

    #[test]
    fn arp_answers_only_the_guests_requests_for_the_gateway_and_dns() {
        for target in [GATEWAY, DNS] {
            let Unwrapped::ArpReply(reply) = unwrap_frame(&arp(ArpOperation::Request, GUEST, target)) else {
                panic!("no reply for {target}");
            };
            let eth = EthernetFrame::new_checked(&reply[..]).unwrap();
            assert_eq!(eth.dst_addr(), GUEST_MAC);
            let ArpRepr::EthernetIpv4 { operation, source_hardware_addr, source_protocol_addr, .. } =
                ArpRepr::parse(&ArpPacket::new_checked(eth.payload()).unwrap()).unwrap()
            else {
                unreachable!()
            };
            assert_eq!(
                (operation, source_hardware_addr, source_protocol_addr),
                (ArpOperation::Reply, GATEWAY_MAC, target)
            );
        }
        let other = std::net::Ipv4Addr::new(10, 0, 2, 9);
        for ignored in [
            arp(ArpOperation::Request, GUEST, other),
            arp(ArpOperation::Request, other, GATEWAY),
            // A spoofed reply claiming the gateway changes nothing here.
            arp(ArpOperation::Reply, GATEWAY, GUEST),
            vec![0u8; 10],
        ] {
            assert!(matches!(unwrap_frame(&ignored), Unwrapped::Dropped));
        }
    }

    /// A datagram pair as the stack's link (`ours`) and the card (`card`).
    fn datagram_link() -> (PacketDevice, std::os::unix::net::UnixDatagram) {
        let (ours, card) = frame_socket().unwrap();
        let card = std::os::unix::net::UnixDatagram::from(card);
        card.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
        (PacketDevice::new(ours, LinkKind::EthernetDatagrams).unwrap(), card)
    }

    #[tokio::test]
    async fn a_frame_socket_carries_one_frame_per_datagram_both_ways() {
        let (mut dev, card) = datagram_link();
        let packet = vec![0x45u8; 60];
        // Empty datagrams and frames the stack does not take are skipped;
        // they do not end the link.
        card.send(&[]).unwrap();
        card.send(&arp(ArpOperation::Reply, GATEWAY, GUEST)).unwrap();
        card.send(&ip_frame(GUEST_MAC, GATEWAY_MAC, &packet)).unwrap();
        dev.readable().await.unwrap();
        assert_eq!(dev.read().unwrap(), Some(packet.clone()));
        assert_eq!(dev.read().unwrap(), None);
        // An ARP request for the gateway is answered on the socket.
        card.send(&arp(ArpOperation::Request, GUEST, GATEWAY)).unwrap();
        dev.readable().await.unwrap();
        assert_eq!(dev.read().unwrap(), None);
        let mut buf = vec![0u8; MAX_FRAME];
        let n = card.recv(&mut buf).unwrap();
        let reply = EthernetFrame::new_checked(&buf[..n]).unwrap();
        assert_eq!((reply.ethertype(), reply.dst_addr()), (EthernetProtocol::Arp, GUEST_MAC));
        // A packet to the VM leaves as one frame from the gateway.
        dev.write(&packet);
        let n = card.recv(&mut buf).unwrap();
        let frame = EthernetFrame::new_checked(&buf[..n]).unwrap();
        assert_eq!((frame.src_addr(), frame.dst_addr()), (GATEWAY_MAC, GUEST_MAC));
        assert_eq!(frame.payload(), &packet[..]);
        assert_eq!(dev.capabilities().max_transmission_unit, ETHERNET_MTU);
    }

    // The relay runs on a worker while this thread blocks in recv.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_relayed_packet_link_shows_on_the_frame_socket_as_the_guests_card() {
        // A datagram pair stands in for the tun: one packet per read.
        let (tun, guest) = std::os::unix::net::UnixDatagram::pair().unwrap();
        let (frames, stack) = frame_socket().unwrap();
        let relay = tokio::spawn(relay_as_frames(OwnedFd::from(tun), frames));
        let stack = std::os::unix::net::UnixDatagram::from(stack);
        for s in [&guest, &stack] {
            s.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
        }
        let mut buf = vec![0u8; MAX_FRAME];
        let packet = vec![0x45u8; 100];
        guest.send(&packet).unwrap();
        let n = stack.recv(&mut buf).unwrap();
        let frame = EthernetFrame::new_checked(&buf[..n]).unwrap();
        assert_eq!((frame.src_addr(), frame.dst_addr()), (GUEST_MAC, GATEWAY_MAC));
        assert_eq!(frame.payload(), &packet[..]);
        // Only IPv4 frames to the guest's MAC reach its link.
        stack.send(&arp(ArpOperation::Request, GATEWAY, GUEST)).unwrap();
        stack.send(&ip_frame(GATEWAY_MAC, EthernetAddress([2, 0, 0, 0, 0, 9]), &[0x45; 30])).unwrap();
        stack.send(&ip_frame(GATEWAY_MAC, GUEST_MAC, &packet)).unwrap();
        let n = guest.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], &packet[..], "the first packet through is the one to the guest");
        relay.abort();
    }
}
