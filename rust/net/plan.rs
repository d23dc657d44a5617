//! The addressing plan of a sandbox's network: the one subnet every EGRESS
//! sandbox sees, whose other end is the helper's user-mode stack. The
//! sandbox side configures it ([`crate::setup`]), the stack answers on it.
use std::net::Ipv4Addr;

/// The VM's address.
pub const GUEST: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 15);
/// Its gateway (the stack).
pub const GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 2);
/// Its DNS server (the stack).
pub const DNS: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 3);
/// Its prefix length.
pub const PREFIX: u8 = 24;
/// The MTU of packet links: tun links are memory copies, so the largest
/// packets cost the least per byte.
pub const MTU: usize = 65520;
/// The IP MTU of Ethernet links: virtio-net's default, which needs no
/// offload or large-buffer negotiation with the guest's driver.
pub const ETHERNET_MTU: usize = 1500;
