//! The VM's DNS: answered by the helper at 10.0.2.3:53 (UDP). Each query the
//! policy allows is forwarded to the host's resolvers; the answer comes back
//! without AAAA records (the sandbox is IPv4 only) and every A record in it
//! is pinned to the query name and its CNAME chain, so a domain rule later
//! matches a connection only to an address this VM was given for that name.
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use simple_dns::rdata::RData;
use simple_dns::{Packet, RCODE};

/// Env var naming the upstream resolvers (`ip:port[,ip:port]`), instead of
/// the host's /etc/resolv.conf.
pub const UPSTREAM_ENV: &str = "SANDBOX_VM_HELPER_DNS_UPSTREAM";

/// How long one upstream gets to answer before the next one is asked.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(3);

/// A pin lives at least this long whatever the TTL: clients cache answers
/// longer than they should, and a pin that expires under them would refuse
/// the connection they make from their cache.
const TTL_FLOOR: Duration = Duration::from_secs(300);

/// Most (address, name) pins kept per VM; the soonest to expire go first.
const MAX_PINS: usize = 4096;

/// Why a DNS message could not be handled.
#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    /// Not a DNS message we can parse or rebuild.
    #[error("malformed dns message: {0}")]
    Malformed(#[from] simple_dns::SimpleDnsError),
    /// A query that does not ask exactly one question: the policy checks
    /// one name and answers are pinned to every question, so a second
    /// question would be resolved and pinned unchecked.
    #[error("a dns query must ask exactly one question, not {0}")]
    QuestionCount(usize),
}

/// Which names each address was given for, in answers to this VM.
#[derive(Debug, Default)]
pub struct Pins {
    by_addr: HashMap<Ipv4Addr, Vec<(String, Instant)>>,
    count: usize,
}

impl Pins {
    /// Ties `addr` to `name` for `ttl` (at least the floor).
    pub fn pin(&mut self, addr: Ipv4Addr, name: &str, ttl: Duration, now: Instant) {
        let until = now + ttl.max(TTL_FLOOR);
        let names = self.by_addr.entry(addr).or_default();
        if let Some(entry) = names.iter_mut().find(|(n, _)| n == name) {
            entry.1 = entry.1.max(until);
            return;
        }
        names.push((name.to_string(), until));
        self.count += 1;
        if self.count > MAX_PINS {
            self.evict(now);
        }
    }

    /// The names `addr` is currently pinned to.
    pub fn names(&self, addr: Ipv4Addr, now: Instant) -> Vec<String> {
        self.by_addr
            .get(&addr)
            .map(|names| names.iter().filter(|(_, until)| *until > now).map(|(n, _)| n.clone()).collect())
            .unwrap_or_default()
    }

    /// Drops expired pins, then the soonest to expire until under the bound.
    fn evict(&mut self, now: Instant) {
        for names in self.by_addr.values_mut() {
            names.retain(|(_, until)| *until > now);
        }
        while self.by_addr.values().map(Vec::len).sum::<usize>() > MAX_PINS {
            let soonest = self
                .by_addr
                .iter()
                .flat_map(|(a, names)| names.iter().map(move |(n, u)| (*u, *a, n.clone())))
                .min_by_key(|(u, _, _)| *u);
            let Some((_, addr, name)) = soonest else { break };
            if let Some(names) = self.by_addr.get_mut(&addr) {
                names.retain(|(n, _)| *n != name);
            }
        }
        self.by_addr.retain(|_, names| !names.is_empty());
        self.count = self.by_addr.values().map(Vec::len).sum();
    }
}

/// The name a query asks about (lower case, no trailing dot).
pub fn query_name(query: &[u8]) -> Result<String, DnsError> {
    let packet = Packet::parse(query)?;
    let [q] = packet.questions.as_slice() else { return Err(DnsError::QuestionCount(packet.questions.len())) };
    Ok(sandbox_net::policy::normalize_name(&q.qname.to_string()))
}

/// A REFUSED answer to `query`.
pub fn refused(query: &[u8]) -> Result<Vec<u8>, DnsError> {
    error_reply(query, RCODE::Refused)
}

/// A SERVFAIL answer to `query`: the helper will not resolve it now.
pub fn servfail(query: &[u8]) -> Result<Vec<u8>, DnsError> {
    error_reply(query, RCODE::ServerFailure)
}

fn error_reply(query: &[u8], rcode: RCODE) -> Result<Vec<u8>, DnsError> {
    let mut reply = Packet::parse(query)?.into_reply();
    *reply.rcode_mut() = rcode;
    reply.answers.clear();
    reply.name_servers.clear();
    reply.additional_records.clear();
    Ok(reply.build_bytes_vec()?)
}

/// What a filtered answer carries: the bytes for the VM and the pins.
#[derive(Debug, PartialEq, Eq)]
pub struct Filtered {
    /// The answer without AAAA (and HTTPS/SVCB, whose hints carry v6).
    pub reply: Vec<u8>,
    /// (address, names it is tied to, TTL).
    pub pins: Vec<(Ipv4Addr, Vec<String>, Duration)>,
}

/// Drops v6 from an upstream answer and lists what to pin: every A record
/// against the question's name and every name in the answer's CNAME chain.
pub fn filter_answer(answer: &[u8]) -> Result<Filtered, DnsError> {
    let mut packet = Packet::parse(answer)?;
    let v6 = |rd: &RData<'_>| matches!(rd, RData::AAAA(_) | RData::HTTPS(_) | RData::SVCB(_));
    packet.answers.retain(|rr| !v6(&rr.rdata));
    packet.additional_records.retain(|rr| !v6(&rr.rdata));
    let norm = |n: &simple_dns::Name<'_>| sandbox_net::policy::normalize_name(&n.to_string());
    let mut names: Vec<String> = packet.questions.iter().map(|q| norm(&q.qname)).collect();
    for rr in &packet.answers {
        if let RData::CNAME(target) = &rr.rdata {
            for n in [norm(&rr.name), norm(&target.0)] {
                if !names.contains(&n) {
                    names.push(n);
                }
            }
        }
    }
    let pins = packet
        .answers
        .iter()
        .filter_map(|rr| match &rr.rdata {
            RData::A(a) => {
                let mut tied = names.clone();
                let owner = norm(&rr.name);
                if !tied.contains(&owner) {
                    tied.push(owner);
                }
                Some((Ipv4Addr::from(a.address), tied, Duration::from_secs(rr.ttl.into())))
            }
            _ => None,
        })
        .collect();
    Ok(Filtered { reply: packet.build_bytes_vec()?, pins })
}

/// The resolvers queries go to: [`UPSTREAM_ENV`] if set, else the
/// nameservers of the host's /etc/resolv.conf (port 53), read now.
pub fn upstreams() -> Vec<SocketAddr> {
    if let Ok(list) = std::env::var(UPSTREAM_ENV) {
        return list.split(',').filter_map(|s| s.trim().parse().ok()).collect();
    }
    let conf = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    conf.lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|ip| ip.trim().parse::<std::net::IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, 53))
        .collect()
}

/// Sends `query` to each upstream in turn until one answers.
pub async fn forward(query: &[u8], upstreams: &[SocketAddr]) -> Option<Vec<u8>> {
    for upstream in upstreams {
        let bind: SocketAddr = if upstream.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { ([0u16; 8], 0).into() };
        let Ok(sock) = tokio::net::UdpSocket::bind(bind).await else { continue };
        if sock.connect(upstream).await.is_err() || sock.send(query).await.is_err() {
            continue;
        }
        let mut buf = vec![0u8; 4096];
        let answer = tokio::time::timeout(UPSTREAM_TIMEOUT, async {
            loop {
                let n = sock.recv(&mut buf).await.ok()?;
                // Same id as ours: anything else is stale or forged.
                if n >= 2 && buf[..2] == query[..2] {
                    return Some(buf[..n].to_vec());
                }
            }
        })
        .await;
        match answer {
            Ok(Some(a)) => return Some(a),
            _ => tracing::debug!(%upstream, "dns upstream did not answer"),
        }
    }
    None
}

#[cfg(test)]
pub(crate) mod tests {
    use simple_dns::rdata::{A, AAAA, CNAME};
    use simple_dns::{CLASS, Name, Question, ResourceRecord, TYPE};

    use super::*;

    pub fn query(name: &str, id: u16) -> Vec<u8> {
        let mut p = Packet::new_query(id);
        p.questions.push(Question::new(Name::new_unchecked(name), TYPE::A.into(), CLASS::IN.into(), false));
        p.build_bytes_vec().unwrap()
    }

    fn answer() -> Vec<u8> {
        let mut p = Packet::new_reply(7);
        p.questions.push(Question::new(
            Name::new_unchecked("www.Example.com"),
            TYPE::A.into(),
            CLASS::IN.into(),
            false,
        ));
        let cname = RData::CNAME(CNAME(Name::new_unchecked("edge.cdn.example.net")));
        p.answers.push(ResourceRecord::new(Name::new_unchecked("www.Example.com"), CLASS::IN, 30, cname));
        let a = RData::A(A { address: u32::from(Ipv4Addr::new(203, 0, 113, 5)) });
        p.answers.push(ResourceRecord::new(Name::new_unchecked("edge.cdn.example.net"), CLASS::IN, 30, a));
        let aaaa = RData::AAAA(AAAA { address: 1 });
        p.answers.push(ResourceRecord::new(Name::new_unchecked("edge.cdn.example.net"), CLASS::IN, 30, aaaa));
        p.build_bytes_vec().unwrap()
    }

    #[test]
    fn answers_lose_aaaa_and_pin_a_records_to_the_cname_chain() {
        let f = filter_answer(&answer()).unwrap();
        let back = Packet::parse(&f.reply).unwrap();
        assert_eq!(back.answers.len(), 2, "the AAAA is gone");
        assert!(back.answers.iter().all(|rr| !matches!(rr.rdata, RData::AAAA(_))));
        assert_eq!(
            f.pins,
            vec![(
                Ipv4Addr::new(203, 0, 113, 5),
                vec!["www.example.com".to_string(), "edge.cdn.example.net".to_string()],
                Duration::from_secs(30)
            )]
        );
    }

    #[test]
    fn pins_expire_after_the_floor_and_stay_bounded() {
        let now = Instant::now();
        let mut pins = Pins::default();
        let ip = Ipv4Addr::new(203, 0, 113, 5);
        pins.pin(ip, "a.example", Duration::from_secs(1), now);
        assert_eq!(pins.names(ip, now + Duration::from_secs(10)), vec!["a.example".to_string()], "floor applies");
        assert!(pins.names(ip, now + TTL_FLOOR + Duration::from_secs(1)).is_empty());
        assert!(pins.names(Ipv4Addr::new(203, 0, 113, 6), now).is_empty());
        for i in 0..(MAX_PINS as u32 + 100) {
            pins.pin(Ipv4Addr::from(0x0a00_0000 + i), "b.example", Duration::from_secs(u64::from(i)), now);
        }
        assert!(pins.count <= MAX_PINS);
        let last = Ipv4Addr::from(0x0a00_0000 + MAX_PINS as u32 + 99);
        assert_eq!(pins.names(last, now), vec!["b.example".to_string()], "the newest pin survives");
    }

    #[test]
    fn refused_and_query_name() {
        let q = query("Data.Evil.example.", 42);
        assert_eq!(query_name(&q).unwrap(), "data.evil.example");
        let bytes = refused(&q).unwrap();
        let r = Packet::parse(&bytes).unwrap();
        assert_eq!(r.id(), 42);
        assert_eq!(r.rcode(), RCODE::Refused);
        assert!(query_name(b"\x00\x01garbage").is_err());
    }

    #[test]
    fn a_query_must_ask_exactly_one_question() {
        let question = |name| Question::new(Name::new_unchecked(name), TYPE::A.into(), CLASS::IN.into(), false);
        let mut two = Packet::new_query(7);
        two.questions.push(question("allowed.example"));
        two.questions.push(question("secret.evil.example"));
        let two = two.build_bytes_vec().unwrap();
        assert!(matches!(query_name(&two), Err(DnsError::QuestionCount(2))));
        let none = Packet::new_query(8).build_bytes_vec().unwrap();
        assert!(matches!(query_name(&none), Err(DnsError::QuestionCount(0))));
        // Both still get an answer the client can read.
        assert_eq!(Packet::parse(&refused(&two).unwrap()).unwrap().rcode(), RCODE::Refused);
        assert_eq!(Packet::parse(&servfail(&none).unwrap()).unwrap().rcode(), RCODE::ServerFailure);
    }
}
