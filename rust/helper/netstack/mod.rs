//! Egress for EGRESS VMs: a user-mode TCP/IP stack in the helper, one tokio
//! task per VM, on the VM's link: a namespace sandbox's tun device or a vm
//! sandbox's virtio-net card (qemu's `-netdev dgram`), see [`device`]. Every TCP flow and UDP datagram is
//! re-dialled by the helper only after [`sandbox_net::policy`] allows its real
//! destination; the VM's DNS is answered here so domain rules can be pinned
//! to the addresses this VM was given.
//!
//! Addresses inside, the same on both drivers: the VM is 10.0.2.15/24, its
//! gateway 10.0.2.2, its DNS 10.0.2.3 (IPv4 only; AAAA answers are
//! dropped). On an Ethernet link both answer ARP with [`GATEWAY_MAC`].
//!
//! Why smoltcp rather than `ipstack` or `netstack-smoltcp`: those accept a
//! connection inside (complete the handshake) and hand it over as a stream,
//! so a refused or unreachable destination becomes a connect that succeeds
//! and is then reset, or hangs. We decide before the handshake: the SYN is
//! held until the policy allows and the host-side connect succeeds, then
//! injected into a smoltcp socket listening on that exact destination
//! (any_ip), so refusal is an immediate RST (ECONNREFUSED inside). smoltcp is
//! 0.12, the newest that builds with the crate's rust-version (1.88).
//!
//! Files: [`device`] the link, `stack` the poll loop and flow decisions,
//! `tcp` the flow relay, `udp` NAT, [`dns`] forwarding and pinning,
//! [`inspect`] the names a flow's client bytes carry ([`tls`] SNI, [`http`]
//! Host), [`events`] refusals and counters, [`wire`] the packets the stack
//! writes itself.

use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use smoltcp::wire::EthernetAddress;
use tokio::task::JoinHandle;

use sandbox_net::policy::{HostAddrs, NetworkPolicy};

pub mod device;
pub mod dns;
pub mod events;
pub mod http;
pub mod inspect;
mod stack;
mod tcp;
pub mod tls;
mod udp;
pub mod wire;

pub use sandbox_net::plan::{DNS, GATEWAY, GUEST, PREFIX};
/// The VM's MAC on an Ethernet link (qemu's OUI; set on its virtio-net card).
pub const GUEST_MAC: EthernetAddress = EthernetAddress([0x52, 0x54, 0x00, 0x0a, 0x00, 0x0f]);
/// The gateway's and the DNS address's MAC on an Ethernet link.
pub const GATEWAY_MAC: EthernetAddress = EthernetAddress([0x52, 0x55, 0x0a, 0x00, 0x02, 0x02]);

/// How stale the host's address list may get: an address added to the host
/// is refused to sandboxes within this long.
const HOST_ADDRS_MAX_AGE: Duration = Duration::from_secs(2);

/// A running stack for one VM; dropping it stops it.
#[derive(Debug)]
pub struct NetStack {
    task: JoinHandle<()>,
}

impl NetStack {
    /// Starts serving `link` (the VM's tun fd, or its end of a frame
    /// stream) under `policy`, recording into `events`.
    pub fn start(
        link: OwnedFd,
        kind: device::LinkKind,
        policy: NetworkPolicy,
        events: Arc<events::Events>,
    ) -> std::io::Result<Self> {
        let dev = device::PacketDevice::new(link, kind)?;
        let ctx = Arc::new(stack::Ctx {
            policy,
            events,
            pins: Mutex::new(dns::Pins::default()),
            upstreams: dns::upstreams(),
        });
        Ok(NetStack { task: tokio::spawn(stack::run(dev, ctx)) })
    }
}

impl NetStack {
    /// A VM's packet link (its tun) relayed as Ethernet frames to
    /// `frames`, whose other end is served by a stack elsewhere
    /// ([`device::relay_as_frames`]).
    pub fn relay(tun: OwnedFd, frames: OwnedFd) -> Self {
        let task = tokio::spawn(async move {
            if let Err(e) = device::relay_as_frames(tun, frames).await {
                tracing::debug!(error = %e, "the vm's frame relay ended");
            }
        });
        NetStack { task }
    }
}

impl Drop for NetStack {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The host's own addresses, refreshed when older than
/// [`HOST_ADDRS_MAX_AGE`]; shared by every VM's stack.
pub fn host_addrs() -> Arc<HostAddrs> {
    static CACHE: Mutex<Option<(Instant, Arc<HostAddrs>)>> = Mutex::new(None);
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((at, addrs)) = cache.as_ref()
        && at.elapsed() < HOST_ADDRS_MAX_AGE
    {
        return addrs.clone();
    }
    let addrs = Arc::new(HostAddrs::with_networks(read_host_interfaces()));
    *cache = Some((Instant::now(), addrs.clone()));
    addrs
}

/// Every interface address with its prefix length (from the netmask).
fn read_host_interfaces() -> Vec<(std::net::IpAddr, u8)> {
    let Ok(ifaddrs) = nix::ifaddrs::getifaddrs() else {
        tracing::warn!("getifaddrs failed: only loopback is known as the host's");
        return Vec::new();
    };
    ifaddrs
        .filter_map(|i| {
            let (addr, mask) = (i.address?, i.netmask);
            if let Some(v4) = addr.as_sockaddr_in() {
                let prefix = mask.and_then(|m| m.as_sockaddr_in().map(|m| u32::from(m.ip()).count_ones()));
                Some((std::net::IpAddr::V4(v4.ip()), prefix.unwrap_or(32) as u8))
            } else {
                let v6 = addr.as_sockaddr_in6()?;
                let prefix = mask.and_then(|m| m.as_sockaddr_in6().map(|m| u128::from(m.ip()).count_ones()));
                Some((std::net::IpAddr::V6(v6.ip()), prefix.unwrap_or(128) as u8))
            }
        })
        .collect()
}
