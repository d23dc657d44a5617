//! Egress policy: which destinations a sandbox may reach.
//!
//! Pure parse + decide, no I/O: the helper's network stack asks it about
//! every flow and DNS query, the orchestrator uses [`NetworkPolicy::parse`]
//! to validate configuration. The contract is the `NetworkPolicy` comment in
//! `proto/sandbox_mcp/helper/v1/helper.proto`.
//!
//! Order of a decision ([`NetworkPolicy::check`]):
//! 1. hard deny: loopback, unspecified, multicast, broadcast and every
//!    address of the host itself; nothing opens these;
//! 2. user `deny` rules (CIDR rules on the address, domain rules on the
//!    names the address is tied to);
//! 3. with a non-empty `allow` list, only what an allow rule matches;
//!    private, link-local, CGNAT, IPv6 transition and other special
//!    ranges, and the networks the host is attached to, need a CIDR allow
//!    rule covering the address: a domain rule never opens them, since a
//!    name's answer is chosen by whoever runs its DNS (rebinding);
//! 4. with `allow` empty: the public internet, without those special ranges.
mod addr;
mod rule;
#[cfg(test)]
mod tests;

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use addr::canonical;
pub use addr::{Cidr, HostAddrs};
pub use rule::{Rule, Target, normalize_name};

/// A rule that could not be parsed. Display names the rule and the problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("network rule '{rule}': {problem}")]
pub struct RuleError {
    /// The rule as given.
    pub rule: String,
    /// What is wrong with it.
    pub problem: String,
}

/// What the policy decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The flow or query may go ahead.
    Allow,
    /// Refused; the reason is shown to the agent.
    Deny(String),
}

impl Verdict {
    /// True for [`Verdict::Allow`].
    pub fn is_allow(&self) -> bool {
        matches!(self, Verdict::Allow)
    }
}
/// Ranges refused unless a CIDR allow rule covers the address, with what
/// they are called in the refusal.
const SOFT_DENY: &[(Cidr, &str)] = &[
    (Cidr::v4(10, 0, 0, 0, 8), "a private address"),
    (Cidr::v4(172, 16, 0, 0, 12), "a private address"),
    (Cidr::v4(192, 168, 0, 0, 16), "a private address"),
    (Cidr::v4(169, 254, 169, 254, 32), "the cloud metadata address"),
    (Cidr::v4(169, 254, 0, 0, 16), "a link-local address"),
    (Cidr::v4(100, 64, 0, 0, 10), "a shared (CGNAT) address"),
    (Cidr::v4(0, 0, 0, 0, 8), "a reserved address"),
    (Cidr::v4(192, 0, 0, 0, 24), "a reserved address"),
    (Cidr::v4(198, 18, 0, 0, 15), "a reserved (benchmarking) address"),
    (Cidr::v4(240, 0, 0, 0, 4), "a reserved address"),
    (Cidr::v4(192, 88, 99, 0, 24), "a reserved (deprecated 6to4 relay) address"),
    (Cidr::v6(0xfc00, 0, 7), "a private (ULA) address"),
    (Cidr::v6(0xfe80, 0, 10), "a link-local address"),
    // IPv6 transition addresses that carry a v4 address the policy does not
    // decode (NAT64's well-known prefix is decoded, see `embedded_v4`): 6to4
    // and Teredo tunnel to whatever v4 address they embed, and the local-use
    // NAT64 prefix (RFC 8215) translates to v4 addresses of a local network.
    (Cidr::v6(0x2002, 0, 16), "a 6to4 address (it tunnels to an embedded IPv4 address)"),
    (Cidr::v6(0x2001, 0, 32), "a Teredo address (it tunnels to an embedded IPv4 address)"),
    (Cidr { addr: IpAddr::V6(Ipv6Addr::new(0x64, 0xff9b, 1, 0, 0, 0, 0, 0)), prefix: 48 }, "a local-use NAT64 address"),
];

fn hard_deny(ip: IpAddr, host: &HostAddrs) -> Option<&'static str> {
    let what = match ip {
        IpAddr::V4(v4) if v4.is_loopback() => "loopback",
        IpAddr::V4(v4) if v4.is_unspecified() => "the unspecified address",
        IpAddr::V4(v4) if v4.is_broadcast() => "broadcast",
        IpAddr::V4(v4) if v4.is_multicast() => "multicast",
        IpAddr::V6(v6) if v6.is_loopback() => "loopback",
        IpAddr::V6(v6) if v6.is_unspecified() => "the unspecified address",
        IpAddr::V6(v6) if v6.is_multicast() => "multicast",
        _ if host.contains(ip) => "an address of this host",
        _ => return None,
    };
    Some(what)
}

fn soft_deny(ip: IpAddr, host: &HostAddrs) -> Option<String> {
    if let Some((_, what)) = SOFT_DENY.iter().find(|(c, _)| c.contains(ip)) {
        return Some((*what).to_string());
    }
    host.attached_network(ip).map(|net| format!("on {net}, a network this host is attached to (its LAN)"))
}

/// A sandbox's egress policy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NetworkPolicy {
    allow: Vec<Rule>,
    deny: Vec<Rule>,
}

impl NetworkPolicy {
    /// Parses the allow and deny lists; the first bad rule is the error.
    pub fn parse(allow: &[String], deny: &[String]) -> Result<Self, RuleError> {
        let parse_all = |rules: &[String]| rules.iter().map(|r| r.parse::<Rule>()).collect::<Result<Vec<_>, _>>();
        Ok(NetworkPolicy { allow: parse_all(allow)?, deny: parse_all(deny)? })
    }

    /// True for the default policy (no rules): the public internet only.
    pub fn is_default(&self) -> bool {
        self.allow.is_empty() && self.deny.is_empty()
    }

    /// The allow rules.
    pub fn allow(&self) -> &[Rule] {
        &self.allow
    }

    /// The deny rules.
    pub fn deny(&self) -> &[Rule] {
        &self.deny
    }

    /// Decides a flow to `dst`. `names` are the names `dst`'s address is tied
    /// to: the names whose DNS answers (to this sandbox) gave it, or, for the
    /// second check once a flow shows it, the TLS SNI or HTTP Host.
    pub fn check(&self, dst: SocketAddr, names: &[&str], host: &HostAddrs) -> Verdict {
        let ip = canonical(dst.ip());
        let port = dst.port();
        let shown = SocketAddr::new(ip, port);
        if let Some(what) = hard_deny(ip, host) {
            return Verdict::Deny(format!("{ip} is {what}: never reachable from a sandbox"));
        }
        if let Some(rule) = self.deny.iter().find(|r| r.matches(ip, port, names)) {
            return Verdict::Deny(format!("denied by rule '{rule}'"));
        }
        let soft = soft_deny(ip, host);
        if !self.allow.is_empty() {
            let cidr_allows = self.allow.iter().any(|r| !r.is_domain() && r.matches(ip, port, names));
            if cidr_allows {
                return Verdict::Allow;
            }
            let domain_allows = self.allow.iter().any(|r| r.is_domain() && r.matches(ip, port, names));
            return match (domain_allows, soft) {
                (true, None) => Verdict::Allow,
                (true, Some(what)) => Verdict::Deny(format!(
                    "{ip} is {what}: a domain rule never opens it (DNS rebinding); allow it with a CIDR rule"
                )),
                (false, _) => Verdict::Deny(format!("{shown} is not in the allow list")),
            };
        }
        match soft {
            Some(what) => Verdict::Deny(format!("{ip} is {what}: allow it with a CIDR rule")),
            None => Verdict::Allow,
        }
    }

    /// Whether some name could change the verdict of a flow to `dst` that
    /// [`NetworkPolicy::check`] allowed by its address and pinned names: a
    /// deny domain rule covers its port, or it got in only through a domain
    /// allow rule (no CIDR allow rule covers it). Only then must the name the
    /// flow's bytes carry (TLS SNI, HTTP Host) be read and checked; without
    /// any domain rule no name matters and flows pass uninspected.
    pub fn name_decides(&self, dst: SocketAddr) -> bool {
        let (ip, port) = (canonical(dst.ip()), dst.port());
        let denied_by_name = self.deny.iter().any(|r| r.is_domain() && r.port_matches(port));
        let allowed_by_name =
            !self.allow.is_empty() && !self.allow.iter().any(|r| !r.is_domain() && r.matches(ip, port, &[]));
        denied_by_name || allowed_by_name
    }

    /// Decides a DNS query for `name`: refused when a port-less deny domain
    /// rule matches it and, under a non-empty allow list, unless an allow
    /// domain rule matches it (so DNS cannot carry data out past the list).
    pub fn check_query(&self, name: &str) -> Verdict {
        let name = normalize_name(name);
        if let Some(rule) = self.deny.iter().find(|r| r.is_domain() && r.port().is_none() && r.name_matches(&name)) {
            return Verdict::Deny(format!("denied by rule '{rule}'"));
        }
        if !self.allow.is_empty() && !self.allow.iter().any(|r| r.is_domain() && r.name_matches(&name)) {
            return Verdict::Deny(format!("{name} is not in the allow list"));
        }
        Verdict::Allow
    }
}
