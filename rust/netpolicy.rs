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
use std::collections::HashSet;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

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
    fn attached_network(&self, ip: IpAddr) -> Option<Cidr> {
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
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    const fn v4(a: u8, b: u8, c: u8, d: u8, prefix: u8) -> Cidr {
        Cidr { addr: IpAddr::V4(Ipv4Addr::new(a, b, c, d)), prefix }
    }

    const fn v6(first: u16, second: u16, prefix: u8) -> Cidr {
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

/// What a rule names.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    /// One name, lower case, no trailing dot.
    Exact(String),
    /// Strict subdomains of this name (`*.example.com` stores `example.com`).
    Subdomains(String),
    /// An address or a block of addresses.
    Net(Cidr),
}

/// One allow or deny rule. Display gives back its canonical text.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Rule {
    target: Target,
    port: Option<u16>,
}

impl Rule {
    /// What the rule names.
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// The port it is limited to, if any.
    pub fn port(&self) -> Option<u16> {
        self.port
    }

    fn is_domain(&self) -> bool {
        !matches!(self.target, Target::Net(_))
    }

    fn port_matches(&self, port: u16) -> bool {
        self.port.is_none_or(|p| p == port)
    }

    fn name_matches(&self, name: &str) -> bool {
        let name = normalize_name(name);
        match &self.target {
            Target::Exact(n) => name == *n,
            Target::Subdomains(n) => {
                name.len() > n.len() + 1
                    && name.ends_with(n.as_str())
                    && name.as_bytes()[name.len() - n.len() - 1] == b'.'
            }
            Target::Net(_) => false,
        }
    }

    /// Whether this rule matches a flow to `ip:port` tied to `names`.
    fn matches(&self, ip: IpAddr, port: u16, names: &[&str]) -> bool {
        if !self.port_matches(port) {
            return false;
        }
        match &self.target {
            Target::Net(c) => c.contains(ip),
            _ => names.iter().any(|n| self.name_matches(n)),
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let host = match &self.target {
            Target::Exact(n) => n.clone(),
            Target::Subdomains(n) => format!("*.{n}"),
            Target::Net(c) => c.to_string(),
        };
        match (self.port, &self.target) {
            (None, _) => f.write_str(&host),
            (Some(p), Target::Net(c)) if c.addr.is_ipv6() => write!(f, "[{host}]:{p}"),
            (Some(p), _) => write!(f, "{host}:{p}"),
        }
    }
}

impl std::str::FromStr for Rule {
    type Err = RuleError;

    fn from_str(text: &str) -> Result<Rule, RuleError> {
        let err = |problem: &str| RuleError { rule: text.to_string(), problem: problem.to_string() };
        if text.is_empty() {
            return Err(err("empty rule"));
        }
        if text.chars().any(char::is_whitespace) {
            return Err(err("contains whitespace"));
        }
        if text.contains("://") {
            return Err(err("a URL is not a rule: give the host name, e.g. 'example.org' or 'example.org:443'"));
        }
        let (host, port, bracketed) = split_port(text).map_err(|p| err(&p))?;
        let port = match port {
            None => None,
            Some(p) => Some(parse_port(p).map_err(|p| err(&p))?),
        };
        let target = if let Some((addr, prefix)) = host.split_once('/') {
            Target::Net(parse_cidr(addr, prefix).map_err(|p| err(&p))?)
        } else if let Ok(ip) = host.parse::<IpAddr>() {
            let ip = canonical(ip);
            Target::Net(Cidr { addr: ip, prefix: if ip.is_ipv4() { 32 } else { 128 } })
        } else if bracketed {
            return Err(err("brackets hold an IPv6 address"));
        } else {
            parse_domain(host).map_err(|p| err(&p))?
        };
        if bracketed && matches!(target, Target::Net(Cidr { addr: IpAddr::V4(_), .. })) {
            return Err(err("brackets are for IPv6 addresses only"));
        }
        Ok(Rule { target, port })
    }
}

/// Splits `host[:port]`, `[v6]:port`, `[v6]`, or a bare v6 address/CIDR.
/// Returns (host, port, bracketed).
fn split_port(text: &str) -> Result<(&str, Option<&str>, bool), String> {
    if let Some(rest) = text.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or("'[' without a matching ']'")?;
        return match after {
            "" => Ok((host, None, true)),
            _ => match after.strip_prefix(':') {
                Some(port) => Ok((host, Some(port), true)),
                None => Err("after ']' only ':port' may follow".into()),
            },
        };
    }
    match text.matches(':').count() {
        0 => Ok((text, None, false)),
        1 => {
            let (host, port) = text.split_once(':').unwrap_or((text, ""));
            Ok((host, Some(port), false))
        }
        // Two or more colons: an IPv6 address or CIDR without a port.
        _ => Ok((text, None, false)),
    }
}

fn parse_port(p: &str) -> Result<u16, String> {
    if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("port '{p}' is not a number"));
    }
    match p.parse::<u32>() {
        Ok(0) => Err("port 0 is not a port".into()),
        Ok(n) if n <= 65535 => Ok(n as u16),
        _ => Err(format!("port {p} is above 65535")),
    }
}

fn parse_cidr(addr: &str, prefix: &str) -> Result<Cidr, String> {
    let ip: IpAddr = addr.parse().map_err(|_| format!("'{addr}' is not an IP address"))?;
    let ip = canonical_with_prefix(ip, prefix)?;
    let (ip, prefix) = ip;
    let full = if ip.is_ipv4() { 32 } else { 128 };
    if prefix > full {
        return Err(format!("prefix /{prefix} is longer than {full} bits"));
    }
    let cidr = Cidr { addr: ip, prefix };
    let network = network_of(ip, prefix);
    if network != ip {
        return Err(format!("host bits are set: did you mean {}/{prefix}?", network));
    }
    Ok(cidr)
}

/// Parses the prefix and, for a v4-mapped or NAT64 v6 block, turns it into v4.
fn canonical_with_prefix(ip: IpAddr, prefix: &str) -> Result<(IpAddr, u8), String> {
    if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_digit()) || prefix.len() > 3 {
        return Err(format!("prefix '/{prefix}' is not a number"));
    }
    let n: u8 = prefix.parse().map_err(|_| format!("prefix '/{prefix}' is not a number"))?;
    match ip {
        IpAddr::V6(v6) if n >= 96 => match embedded_v4(v6) {
            Some(v4) => Ok((IpAddr::V4(v4), n - 96)),
            None => Ok((ip, n)),
        },
        _ => Ok((ip, n)),
    }
}

fn network_of(ip: IpAddr, prefix: u8) -> IpAddr {
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

fn parse_domain(host: &str) -> Result<Target, String> {
    let name = normalize_name(host);
    let (wild, base) = match name.strip_prefix("*.") {
        Some(base) => (true, base.to_string()),
        None => (false, name.clone()),
    };
    if base.is_empty() {
        return Err("empty domain".into());
    }
    if base.contains('*') {
        return Err("a wildcard is only allowed as the whole first label: '*.example.com'".into());
    }
    if base.len() > 253 {
        return Err("domain longer than 253 characters".into());
    }
    for label in base.split('.') {
        if label.is_empty() {
            return Err("empty label in domain".into());
        }
        if label.len() > 63 {
            return Err(format!("label '{label}' is longer than 63 characters"));
        }
        if !label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
            return Err(format!("'{label}' is not a valid domain label (letters, digits, '-' and '_' only)"));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(format!("label '{label}' starts or ends with '-'"));
        }
    }
    if base.rsplit('.').next().is_some_and(|tld| tld.bytes().all(|b| b.is_ascii_digit())) {
        return Err("not an IP address, and a domain cannot end in a numeric label".into());
    }
    Ok(if wild { Target::Subdomains(base) } else { Target::Exact(base) })
}

/// Lower case, trailing dot removed.
pub fn normalize_name(name: &str) -> String {
    name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase()
}

/// The v4 address a v6 address stands for: v4-mapped (`::ffff:a.b.c.d`)
/// or NAT64's well-known prefix (`64:ff9b::a.b.c.d`, RFC 6052), which a
/// DNS64/NAT64 network translates to that v4 address, so it is judged as
/// that address (a private v4 stays refused).
fn embedded_v4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = v6.segments();
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return Some(Ipv4Addr::from((u32::from(s[6]) << 16) | u32::from(s[7])));
    }
    v6.to_ipv4_mapped()
}

/// An address as the policy judges it: see [`embedded_v4`].
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => embedded_v4(v6).map_or(ip, IpAddr::V4),
        v4 => v4,
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
        if let Some(rule) = self.deny.iter().find(|r| r.is_domain() && r.port.is_none() && r.name_matches(&name)) {
            return Verdict::Deny(format!("denied by rule '{rule}'"));
        }
        if !self.allow.is_empty() && !self.allow.iter().any(|r| r.is_domain() && r.name_matches(&name)) {
            return Verdict::Deny(format!("{name} is not in the allow list"));
        }
        Verdict::Allow
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(allow: &[&str], deny: &[&str]) -> NetworkPolicy {
        let s = |v: &[&str]| v.iter().map(|r| r.to_string()).collect::<Vec<_>>();
        NetworkPolicy::parse(&s(allow), &s(deny)).unwrap()
    }

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn none() -> HostAddrs {
        HostAddrs::default()
    }

    fn deny_reason(v: Verdict) -> String {
        match v {
            Verdict::Deny(r) => r,
            Verdict::Allow => panic!("expected a refusal"),
        }
    }

    #[test]
    fn every_rule_form_round_trips_to_canonical_text() {
        for (given, canonical) in [
            ("example.org", "example.org"),
            ("Example.ORG.", "example.org"),
            ("*.example.com", "*.example.com"),
            ("*.Example.com:443", "*.example.com:443"),
            ("example.org:8080", "example.org:8080"),
            ("203.0.113.7", "203.0.113.7"),
            ("203.0.113.7:443", "203.0.113.7:443"),
            ("10.20.0.0/16", "10.20.0.0/16"),
            ("10.20.0.0/16:5432", "10.20.0.0/16:5432"),
            ("0.0.0.0/0", "0.0.0.0/0"),
            ("2001:db8::/32", "2001:db8::/32"),
            ("2001:db8::1", "2001:db8::1"),
            ("[2001:db8::1]:443", "[2001:db8::1]:443"),
            ("[2001:db8::1]", "2001:db8::1"),
            ("[2001:db8::/32]:443", "[2001:db8::/32]:443"),
            ("::ffff:10.0.0.1", "10.0.0.1"),
            ("::ffff:10.0.0.0/104", "10.0.0.0/8"),
            ("64:ff9b::10.0.0.0/104", "10.0.0.0/8"),
            ("under_score.example", "under_score.example"),
        ] {
            let rule: Rule = given.parse().unwrap_or_else(|e| panic!("{given}: {e}"));
            assert_eq!(rule.to_string(), canonical, "{given}");
            assert_eq!(canonical.parse::<Rule>().unwrap(), rule, "{canonical} parses back");
        }
    }

    #[test]
    fn bad_rules_are_refused_naming_rule_and_problem() {
        for (given, problem) in [
            ("", "empty"),
            (" example.org", "whitespace"),
            ("exa mple.org", "whitespace"),
            ("https://example.org", "URL"),
            ("example.org:0", "port 0"),
            ("example.org:65536", "above 65535"),
            ("example.org:http", "not a number"),
            ("example.org:", "not a number"),
            ("10.0.0.0/33", "longer than 32"),
            ("10.0.0.1/8", "host bits"),
            ("10.0.0.0/x", "not a number"),
            ("10.0.0.0/", "not a number"),
            ("300.1.1.1/8", "not an IP address"),
            ("2001:db8::/129", "longer than 128"),
            ("foo.*.example.com", "wildcard"),
            ("*example.com", "wildcard"),
            ("*", "wildcard"),
            ("*.", "wildcard"),
            ("*..", "empty domain"),
            ("example..org", "empty label"),
            ("exa$mple.org", "not a valid domain label"),
            ("-bad.example", "starts or ends with '-'"),
            ("10.0.0", "numeric label"),
            ("[2001:db8::1", "matching ']'"),
            ("[2001:db8::1]x", "only ':port'"),
            ("[example.org]:443", "IPv6"),
            ("[10.0.0.1]:443", "IPv6"),
            ("example.org/path", "not an IP address"),
        ] {
            let err = given.parse::<Rule>().expect_err(given);
            let text = err.to_string();
            assert!(text.contains(&format!("'{given}'")), "{text} names the rule");
            assert!(text.contains(problem), "{given}: {text} should say {problem}");
        }
        let err = NetworkPolicy::parse(&["example.org".into()], &["bad rule".into()]).unwrap_err();
        assert_eq!(err.rule, "bad rule");
    }

    #[test]
    fn default_policy_is_default_and_allows_the_public_internet() {
        let p = NetworkPolicy::default();
        assert!(p.is_default());
        assert!(!policy(&["example.org"], &[]).is_default());
        assert!(!policy(&[], &["example.org"]).is_default());
        assert_eq!(p.check(sa("93.184.215.14:443"), &[], &none()), Verdict::Allow);
        assert_eq!(p.check(sa("[2606:4700::1]:443"), &[], &none()), Verdict::Allow);
        assert_eq!(p.check_query("anything.example"), Verdict::Allow);
    }

    #[test]
    fn hard_deny_is_never_opened() {
        let host = HostAddrs::new(["10.213.1.1".parse().unwrap(), "2001:db8::5".parse().unwrap()]);
        let open = policy(&["0.0.0.0/0", "::/0", "*.example.com"], &[]);
        for (dst, what) in [
            ("127.0.0.1:80", "127.0.0.1 is loopback: never reachable from a sandbox"),
            ("127.1.2.3:80", "loopback"),
            ("[::1]:80", "loopback"),
            ("[::ffff:127.0.0.1]:80", "127.0.0.1 is loopback"),
            ("0.0.0.0:80", "unspecified"),
            ("[::]:80", "unspecified"),
            ("255.255.255.255:80", "broadcast"),
            ("224.0.0.1:80", "multicast"),
            ("[ff02::1]:80", "multicast"),
            ("[ff0e::1]:80", "multicast"),
            ("239.1.2.3:80", "multicast"),
            ("[64:ff9b::127.0.0.1]:80", "127.0.0.1 is loopback"),
            ("[64:ff9b::10.213.1.1]:80", "an address of this host"),
            ("10.213.1.1:80", "10.213.1.1 is an address of this host"),
            ("[::ffff:10.213.1.1]:80", "an address of this host"),
            ("[2001:db8::5]:80", "an address of this host"),
        ] {
            for p in [&NetworkPolicy::default(), &open] {
                let reason = deny_reason(p.check(sa(dst), &["a.example.com"], &host));
                assert!(reason.contains(what), "{dst}: {reason}");
            }
        }
    }

    #[test]
    fn every_soft_range_is_refused_by_default_and_opened_by_a_cidr_rule() {
        let cases = [
            ("10.1.2.3", "10.1.2.3 is a private address: allow it with a CIDR rule", "10.0.0.0/8"),
            ("172.16.0.1", "private", "172.16.0.0/12"),
            ("172.31.255.254", "private", "172.16.0.0/12"),
            ("192.168.1.1", "private", "192.168.0.0/16"),
            ("169.254.169.254", "cloud metadata", "169.254.169.254"),
            ("169.254.1.1", "link-local", "169.254.0.0/16"),
            ("100.64.0.1", "CGNAT", "100.64.0.0/10"),
            ("100.127.255.1", "CGNAT", "100.64.0.0/10"),
            ("0.1.2.3", "reserved", "0.0.0.0/8"),
            ("192.0.0.8", "reserved", "192.0.0.0/24"),
            ("198.19.0.1", "benchmarking", "198.18.0.0/15"),
            ("240.0.0.1", "reserved", "240.0.0.0/4"),
            ("fd00::1", "ULA", "fc00::/7"),
            ("fe80::1", "link-local", "fe80::/10"),
            ("::ffff:10.1.2.3", "10.1.2.3 is a private", "10.0.0.0/8"),
            ("192.88.99.1", "6to4 relay", "192.88.99.0/24"),
            ("2002:c000:207::1", "6to4", "2002::/16"),
            ("2001:0:4136:e378::1", "Teredo", "2001::/32"),
            ("64:ff9b:1::a00:1", "local-use NAT64", "64:ff9b:1::/48"),
            // NAT64's well-known prefix is judged by the v4 address it holds.
            ("64:ff9b::10.1.2.3", "10.1.2.3 is a private", "10.0.0.0/8"),
            ("64:ff9b::192.168.1.1", "192.168.1.1 is a private", "64:ff9b::192.168.1.0/120"),
        ];
        for (ip, what, cidr) in cases {
            let ip: IpAddr = ip.parse().unwrap();
            let dst = SocketAddr::new(ip, 443);
            let reason = deny_reason(NetworkPolicy::default().check(dst, &[], &none()));
            assert!(reason.contains(what), "{ip}: {reason}");
            assert_eq!(policy(&[cidr], &[]).check(dst, &[], &none()), Verdict::Allow, "{ip} via {cidr}");
        }
        // Just outside the ranges is public.
        for ip in [
            "172.32.0.1",
            "100.128.0.1",
            "11.0.0.1",
            "198.20.0.1",
            "192.0.1.1",
            "192.0.3.1",
            "198.51.101.1",
            "203.0.114.1",
            "2001:db9::1",
            "2001:1::1",
            "2003::1",
            "64:ff9b::93.184.215.14",
        ] {
            let dst = SocketAddr::new(ip.parse().unwrap(), 80);
            assert_eq!(NetworkPolicy::default().check(dst, &[], &none()), Verdict::Allow, "{ip}");
        }
    }

    #[test]
    fn networks_the_host_is_attached_to_need_a_cidr_rule_whatever_their_numbers() {
        // A LAN on documentation addresses, as on this project's machines,
        // and one on public addresses: neighbours are refused, the rest of
        // the same ranges (reached through the gateway) is the internet.
        let host = HostAddrs::with_networks([
            ("192.0.2.2".parse().unwrap(), 24),
            ("8.8.4.9".parse().unwrap(), 29),
            ("10.0.9.1".parse().unwrap(), 32),
            ("127.0.0.1".parse().unwrap(), 8),
            ("9.9.9.1".parse().unwrap(), 0),
        ]);
        let reason = deny_reason(NetworkPolicy::default().check(sa("192.0.2.1:80"), &[], &host));
        assert!(reason.contains("192.0.2.1 is on 192.0.2.0/24, a network this host is attached to"), "{reason}");
        assert!(reason.contains("allow it with a CIDR rule"), "{reason}");
        assert!(!NetworkPolicy::default().check(sa("8.8.4.14:443"), &[], &host).is_allow());
        for public in ["203.0.113.80:443", "198.51.100.7:80", "8.8.4.16:443", "9.9.9.9:53"] {
            assert_eq!(NetworkPolicy::default().check(sa(public), &[], &host), Verdict::Allow, "{public}");
        }
        // The host's own addresses stay refused for good.
        assert!(deny_reason(policy(&["192.0.2.0/24"], &[]).check(sa("192.0.2.2:22"), &[], &host)).contains("never"));
        assert_eq!(policy(&["192.0.2.0/24"], &[]).check(sa("192.0.2.1:80"), &[], &host), Verdict::Allow);
        // A domain rule never opens a neighbour (DNS rebinding).
        let by_name = policy(&["router.example.com"], &[]);
        assert!(deny_reason(by_name.check(sa("192.0.2.1:80"), &["router.example.com"], &host)).contains("rebinding"));
    }

    #[test]
    fn a_domain_rule_never_opens_a_soft_range() {
        let p = policy(&["internal.example.com"], &[]);
        let reason = deny_reason(p.check(sa("10.1.2.3:443"), &["internal.example.com"], &none()));
        assert!(reason.contains("DNS rebinding"), "{reason}");
        assert!(reason.contains("CIDR"), "{reason}");
        assert_eq!(p.check(sa("93.184.215.14:443"), &["internal.example.com"], &none()), Verdict::Allow);
    }

    #[test]
    fn allow_list_admits_only_what_it_names() {
        let p = policy(&["example.org", "*.example.com:443", "8.8.4.0/24:22", "[2606:4700::1]:443"], &[]);
        let h = &none();
        assert_eq!(p.check(sa("93.184.215.14:80"), &["example.org"], h), Verdict::Allow);
        assert_eq!(p.check(sa("93.184.215.14:80"), &["EXAMPLE.org."], h), Verdict::Allow);
        assert_eq!(p.check(sa("93.184.215.14:443"), &["a.b.example.com"], h), Verdict::Allow);
        assert!(!p.check(sa("93.184.215.14:80"), &["a.example.com"], h).is_allow(), "port limited");
        assert!(!p.check(sa("93.184.215.14:443"), &["example.com"], h).is_allow(), "apex is not a subdomain");
        assert!(!p.check(sa("93.184.215.14:443"), &["badexample.com"], h).is_allow());
        assert!(!p.check(sa("93.184.215.14:443"), &["sub.example.org"], h).is_allow(), "exact only");
        assert_eq!(p.check(sa("8.8.4.9:22"), &[], h), Verdict::Allow);
        assert_eq!(p.check(sa("8.8.4.9:443"), &[], h), Verdict::Deny("8.8.4.9:443 is not in the allow list".into()));
        assert_eq!(p.check(sa("[2606:4700::1]:443"), &[], h), Verdict::Allow);
        assert!(!p.check(sa("[2606:4700::1]:80"), &[], h).is_allow());
        assert!(!p.check(sa("1.1.1.1:443"), &[], h).is_allow(), "no name, not listed");
    }

    #[test]
    fn deny_comes_before_allow() {
        let p = policy(&["0.0.0.0/0", "*.example.com"], &["*.evil.com", "9.9.9.0/24", "example.com:25"]);
        let h = &none();
        assert_eq!(
            p.check(sa("93.184.215.14:443"), &["x.evil.com"], h),
            Verdict::Deny("denied by rule '*.evil.com'".into())
        );
        assert_eq!(p.check(sa("9.9.9.1:443"), &[], h), Verdict::Deny("denied by rule '9.9.9.0/24'".into()));
        assert!(!p.check(sa("93.184.215.14:25"), &["example.com"], h).is_allow());
        assert_eq!(p.check(sa("93.184.215.14:443"), &["example.com"], h), Verdict::Allow);
        // Deny rules apply without an allow list too.
        let p = policy(&[], &["1.0.0.7", "*.evil.com"]);
        assert!(!p.check(sa("1.0.0.7:80"), &[], h).is_allow());
        assert!(!p.check(sa("93.184.215.14:80"), &["a.evil.com"], h).is_allow());
        assert_eq!(p.check(sa("93.184.215.14:80"), &["good.com"], h), Verdict::Allow);
        // A v4 deny rule matches the v4-mapped form.
        assert!(!p.check(sa("[::ffff:1.0.0.7]:80"), &[], h).is_allow());
        assert!(!p.check(sa("[64:ff9b::1.0.0.7]:80"), &[], h).is_allow());
    }

    #[test]
    fn a_name_decides_only_where_a_domain_rule_could_change_the_verdict() {
        let dst = sa("93.184.215.14:443");
        assert!(!NetworkPolicy::default().name_decides(dst), "no rules: names never matter");
        assert!(!policy(&["0.0.0.0/0"], &["203.0.113.0/24"]).name_decides(dst), "CIDR rules only");
        assert!(policy(&[], &["*.evil.com"]).name_decides(dst), "a deny name rule on any port");
        assert!(policy(&[], &["evil.com:443"]).name_decides(dst), "a deny name rule on this port");
        assert!(!policy(&[], &["evil.com:25"]).name_decides(dst), "a deny name rule on another port");
        assert!(policy(&["*.example.com"], &[]).name_decides(dst), "in only by a domain allow rule");
        assert!(!policy(&["*.example.com", "93.184.215.0/24"], &[]).name_decides(dst), "a CIDR rule opens it");
        assert!(policy(&["*.example.com", "93.184.215.0/24:80"], &[]).name_decides(dst), "CIDR rule for another port");
        assert!(policy(&["93.184.215.0/24"], &["bad.example.com"]).name_decides(dst), "CIDR allow, name deny");
    }

    #[test]
    fn check_query_follows_domain_rules() {
        let p = policy(&[], &["*.evil.com", "bad.org:443"]);
        assert_eq!(p.check_query("x.evil.com."), Verdict::Deny("denied by rule '*.evil.com'".into()));
        assert_eq!(p.check_query("evil.com"), Verdict::Allow, "apex not covered by the wildcard");
        assert_eq!(p.check_query("bad.org"), Verdict::Allow, "a port-limited rule leaves the name resolvable");
        let p = policy(&["example.org:443", "*.example.com", "10.0.0.0/8"], &[]);
        assert_eq!(p.check_query("Example.org"), Verdict::Allow);
        assert_eq!(p.check_query("a.example.com"), Verdict::Allow);
        assert_eq!(p.check_query("other.net"), Verdict::Deny("other.net is not in the allow list".into()));
        assert!(!p.check_query("data.exfil.attacker.net").is_allow());
        let p = policy(&["10.0.0.0/8"], &[]);
        assert!(!p.check_query("example.org").is_allow(), "an address-only allow list resolves nothing");
    }

    #[test]
    fn host_addrs_canonicalize_mapped_addresses() {
        let h = HostAddrs::new(["::ffff:192.0.2.1".parse().unwrap()]);
        assert!(h.contains("192.0.2.1".parse().unwrap()));
        assert!(h.contains("::ffff:192.0.2.1".parse().unwrap()));
        assert_eq!(h.len(), 1);
        assert!(!h.is_empty());
        assert!(HostAddrs::default().is_empty());
    }
}
