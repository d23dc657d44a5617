//! Addresses as the policy sees them: address blocks ([`Cidr`]), the host's
//! own addresses and attached networks ([`HostAddrs`]), and the canonical
//! form an address is judged in (v4-mapped and NAT64 v6 turned into v4).
use std::collections::HashSet;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The host's own addresses, never reachable from a sandbox, and the
/// networks its interfaces sit on, reachable only through a CIDR rule.
///
/// The attached networks are what "the LAN" means whatever it is numbered
/// from: a fixed list of private ranges misses a LAN on public or
/// documentation addresses (this project's own machines sit on 192.0.2.0/24
/// and reach the internet through 203.0.113.80), and refusing those ranges
/// by name would cut such hosts off the internet instead.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostAddrs {
    addrs: HashSet<IpAddr>,
    networks: Vec<Cidr>,
}

impl HostAddrs {
    /// The set of `addrs` (v4-mapped v6 addresses are stored as v4).
    pub fn new(addrs: impl IntoIterator<Item = IpAddr>) -> Self {
        HostAddrs { addrs: addrs.into_iter().map(canonical).collect(), networks: Vec::new() }
    }

    /// The host's interface addresses with their prefix lengths: each
    /// address, and its network when it has neighbours (a /32 or /128 has
    /// none; a prefix of 0 would be the whole internet, never a LAN).
    pub fn with_networks(interfaces: impl IntoIterator<Item = (IpAddr, u8)>) -> Self {
        let mut host = HostAddrs::default();
        for (ip, prefix) in interfaces {
            let ip = canonical(ip);
            host.addrs.insert(ip);
            let width = if ip.is_ipv4() { 32 } else { 128 };
            if prefix == 0 || prefix >= width || ip.is_loopback() {
                continue;
            }
            let net = Cidr { addr: network_of(ip, prefix), prefix };
            if !host.networks.contains(&net) {
                host.networks.push(net);
            }
        }
        host
    }

    /// Whether `ip` is one of the host's addresses.
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.addrs.contains(&canonical(ip))
    }

    /// The network of one of the host's interfaces that holds `ip`.
    pub(super) fn attached_network(&self, ip: IpAddr) -> Option<Cidr> {
        self.networks.iter().copied().find(|n| n.contains(ip))
    }

    /// How many addresses are known.
    pub fn len(&self) -> usize {
        self.addrs.len()
    }

    /// True when no address is known.
    pub fn is_empty(&self) -> bool {
        self.addrs.is_empty()
    }
}

/// An address block: `addr/prefix`, host bits zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    pub(super) addr: IpAddr,
    pub(super) prefix: u8,
}

impl Cidr {
    pub(super) const fn v4(a: u8, b: u8, c: u8, d: u8, prefix: u8) -> Cidr {
        Cidr { addr: IpAddr::V4(Ipv4Addr::new(a, b, c, d)), prefix }
    }

    pub(super) const fn v6(first: u16, second: u16, prefix: u8) -> Cidr {
        Cidr { addr: IpAddr::V6(Ipv6Addr::new(first, second, 0, 0, 0, 0, 0, 0)), prefix }
    }

    /// Whether `ip` (canonical: v4-mapped v6 already turned into v4) is inside.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                masked(u32::from(net).into(), 32, self.prefix) == masked(u32::from(ip).into(), 32, self.prefix)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                masked(u128::from(net), 128, self.prefix) == masked(u128::from(ip), 128, self.prefix)
            }
            _ => false,
        }
    }
}

fn masked(bits: u128, width: u8, prefix: u8) -> u128 {
    if prefix == 0 { 0 } else { bits >> (width - prefix) }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let full = if self.addr.is_ipv4() { 32 } else { 128 };
        if self.prefix == full { write!(f, "{}", self.addr) } else { write!(f, "{}/{}", self.addr, self.prefix) }
    }
}
pub(super) fn network_of(ip: IpAddr, prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => {
            let mask = if prefix == 0 { 0 } else { u32::MAX << (32 - prefix) };
            IpAddr::V4(Ipv4Addr::from(u32::from(v4) & mask))
        }
        IpAddr::V6(v6) => {
            let mask = if prefix == 0 { 0 } else { u128::MAX << (128 - prefix) };
            IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask))
        }
    }
}

/// The v4 address a v6 address stands for: v4-mapped (`::ffff:a.b.c.d`)
/// or NAT64's well-known prefix (`64:ff9b::a.b.c.d`, RFC 6052), which a
/// DNS64/NAT64 network translates to that v4 address, so it is judged as
/// that address (a private v4 stays refused).
pub(super) fn embedded_v4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = v6.segments();
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return Some(Ipv4Addr::from((u32::from(s[6]) << 16) | u32::from(s[7])));
    }
    v6.to_ipv4_mapped()
}

/// An address as the policy judges it: see [`embedded_v4`].
pub(super) fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => embedded_v4(v6).map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}
