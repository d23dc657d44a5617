//! Allow and deny rules: what a rule names, its canonical text, and parsing
//! it from configuration, refusing malformed rules with the reason.
use std::fmt;
use std::net::IpAddr;

use super::RuleError;
use super::addr::{Cidr, canonical, embedded_v4, network_of};

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

    pub(super) fn is_domain(&self) -> bool {
        !matches!(self.target, Target::Net(_))
    }

    pub(super) fn port_matches(&self, port: u16) -> bool {
        self.port.is_none_or(|p| p == port)
    }

    pub(super) fn name_matches(&self, name: &str) -> bool {
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
    pub(super) fn matches(&self, ip: IpAddr, port: u16, names: &[&str]) -> bool {
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
