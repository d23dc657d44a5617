//! A VM's network link as a packet device: any fd that delivers one IPv4
//! packet per read and takes one per write (a tun opened with IFF_NO_PI, a
//! SOCK_DGRAM/SEQPACKET socket). The stack reads packets here, inspects them,
//! and feeds the ones smoltcp should see through [`Device`].
//!
//! Links that carry Ethernet frames or a byte stream (qemu `-netdev stream`
//! prefixes each frame with its length; Virtualization.framework's file
//! handle attachment sends frames as datagrams) plug in by unwrapping frames
//! to IP packets at this boundary (ARP for the one gateway address and the
//! Ethernet header are all it takes), so stack, flows and policy are shared.
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd};

use smoltcp::phy::{Checksum, ChecksumCapabilities, Device, DeviceCapabilities, Medium};
use smoltcp::time::Instant;
use tokio::io::unix::AsyncFd;

/// The MTU both ends use: tun links are memory copies, so the largest
/// packets cost the least per byte.
pub const MTU: usize = 65520;

/// One packet link, nonblocking.
pub struct PacketDevice {
    fd: AsyncFd<OwnedFd>,
    /// Packets read but not yet consumed by smoltcp.
    rx: VecDeque<Vec<u8>>,
    scratch: Vec<u8>,
}

impl PacketDevice {
    /// Wraps `fd` (set nonblocking here).
    pub fn new(fd: OwnedFd) -> std::io::Result<Self> {
        nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK))?;
        // SAFETY: we own the fd, and it stays open as long as the AsyncFd.
        let fd = unsafe { AsyncFd::register(fd) }?;
        Ok(PacketDevice { fd, rx: VecDeque::new(), scratch: Vec::with_capacity(MTU) })
    }

    /// Waits until the link may have packets to read.
    pub async fn readable(&self) -> std::io::Result<()> {
        let mut guard = self.fd.readable().await?;
        guard.clear_ready();
        Ok(())
    }

    /// Reads one packet without blocking; None when there is none now.
    pub fn read(&self) -> std::io::Result<Option<Vec<u8>>> {
        let mut buf = vec![0u8; MTU + 64];
        // SAFETY: read into a buffer we own, of the length given.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            return match e.kind() {
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted => Ok(None),
                _ => Err(e),
            };
        }
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.truncate(n as usize);
        Ok(Some(buf))
    }

    /// Writes one packet to the VM. A full queue drops it, as a real link
    /// would; TCP retransmits.
    pub fn write(&self, packet: &[u8]) {
        write_fd(&self.fd, packet);
    }

    /// Queues a packet for smoltcp; `front` puts it before everything else
    /// (a held SYN, now that its flow exists).
    pub fn queue(&mut self, packet: Vec<u8>, front: bool) {
        if front { self.rx.push_front(packet) } else { self.rx.push_back(packet) }
    }
}

fn write_fd(fd: &AsyncFd<OwnedFd>, packet: &[u8]) {
    // SAFETY: write from a slice we borrow, of its length.
    let n = unsafe { libc::write(fd.as_raw_fd(), packet.as_ptr().cast(), packet.len()) };
    if n < 0 {
        tracing::trace!(error = %std::io::Error::last_os_error(), "packet to the vm dropped");
    }
}

/// A packet handed to smoltcp.
pub struct Rx(Vec<u8>);

/// A packet smoltcp writes, sent to the VM when consumed.
pub struct Tx<'a> {
    fd: &'a AsyncFd<OwnedFd>,
    scratch: &'a mut Vec<u8>,
}

impl smoltcp::phy::RxToken for Rx {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(&self.0)
    }
}

impl smoltcp::phy::TxToken for Tx<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        self.scratch.clear();
        self.scratch.resize(len, 0);
        let r = f(self.scratch);
        write_fd(self.fd, self.scratch);
        r
    }
}

impl Device for PacketDevice {
    type RxToken<'a> = Rx;
    type TxToken<'a> = Tx<'a>;

    fn receive(&mut self, _now: Instant) -> Option<(Rx, Tx<'_>)> {
        let packet = self.rx.pop_front()?;
        Some((Rx(packet), Tx { fd: &self.fd, scratch: &mut self.scratch }))
    }

    fn transmit(&mut self, _now: Instant) -> Option<Tx<'_>> {
        Some(Tx { fd: &self.fd, scratch: &mut self.scratch })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ip;
        caps.max_transmission_unit = MTU;
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
