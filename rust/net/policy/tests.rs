//! Unit tests of rule parsing and of the decisions on flows and DNS queries.
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
