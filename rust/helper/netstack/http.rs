//! The HTTP/1 requests a client sends on one connection, each with the host
//! it names. Every request is read, not only the first: a keep-alive or
//! pipelined request may name another host on the same connection, so the
//! parser follows `Content-Length` and chunked bodies to the next head.
//! Whatever would let a request name a host we cannot see (HTTP/0.9, h2c,
//! a protocol switch, CONNECT, ambiguous framing or Host) is reported as
//! unnamed; the caller refuses it where a name decides.
use super::inspect::Step;

/// The largest request head (or chunk-size or trailer line) read: longer
/// ones are unnamed, so [`Requests::next`] never waits on more bytes.
pub const MAX_HEAD: usize = 16 * 1024;

/// The requests of one connection, fed its client bytes in order.
#[derive(Debug)]
pub struct Requests {
    state: State,
    /// No request parsed yet: bytes that are not HTTP/1 are then another
    /// protocol, not a smuggled request.
    first: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Head,
    Body(u64),
    ChunkSize,
    ChunkData(u64),
    ChunkEnd,
    Trailers,
    /// After a websocket handshake: frames, or (if the server refused the
    /// switch) the next request.
    Websocket,
}

impl Default for Requests {
    fn default() -> Self {
        Requests { state: State::Head, first: true }
    }
}

fn unnamed(why: impl Into<String>) -> Step {
    Step::Unnamed(why.into())
}

impl Requests {
    /// What the start of `data` (the client bytes not yet passed) is.
    pub fn next(&mut self, data: &[u8]) -> Step {
        if data.is_empty() {
            return Step::NeedMore;
        }
        match self.state {
            State::Head => self.head(data),
            State::Body(n) | State::ChunkData(n) => {
                let len = usize::try_from(n).unwrap_or(usize::MAX).min(data.len());
                let left = n - len as u64;
                self.state = match (self.state, left) {
                    (State::Body(_), 0) => State::Head,
                    (State::Body(_), _) => State::Body(left),
                    (_, 0) => State::ChunkEnd,
                    _ => State::ChunkData(left),
                };
                Step::Pass { len, name: None }
            }
            State::ChunkSize => self.line(data, |this, line| {
                let size = line.split(|&b| b == b';').next().unwrap_or_default();
                let size = std::str::from_utf8(size).ok().map(|s| s.trim_matches([' ', '\t']));
                match size.and_then(|s| (!s.is_empty()).then(|| u64::from_str_radix(s, 16).ok()).flatten()) {
                    Some(0) => this.state = State::Trailers,
                    Some(n) => this.state = State::ChunkData(n),
                    None => return Err("a malformed chunk size in a chunked request body".into()),
                }
                Ok(())
            }),
            State::ChunkEnd => self.line(data, |this, line| {
                if !line.is_empty() {
                    return Err("chunk data longer than its size in a chunked request body".into());
                }
                this.state = State::ChunkSize;
                Ok(())
            }),
            State::Trailers => self.line(data, |this, line| {
                if line.is_empty() {
                    this.state = State::Head;
                }
                Ok(())
            }),
            State::Websocket => {
                let Some(&second) = data.get(1) else { return Step::NeedMore };
                // A client's websocket frames are always masked (RFC 6455);
                // an HTTP request's second byte never has the top bit set.
                if second & 0x80 != 0 {
                    return Step::Rest;
                }
                self.state = State::Head;
                self.head(data)
            }
        }
    }

    /// Passes one line of a chunked body (without its CR LF) to `f`.
    fn line(&mut self, data: &[u8], f: impl FnOnce(&mut Self, &[u8]) -> Result<(), String>) -> Step {
        let Some(end) = data.iter().position(|&b| b == b'\n').filter(|&end| end < MAX_HEAD) else {
            return if data.len() >= MAX_HEAD {
                unnamed("a line of a chunked request body is too long")
            } else {
                Step::NeedMore
            };
        };
        let line = &data[..end];
        match f(self, line.strip_suffix(b"\r").unwrap_or(line)) {
            Ok(()) => Step::Pass { len: end + 1, name: None },
            Err(why) => Step::Unnamed(why),
        }
    }

    fn head(&mut self, data: &[u8]) -> Step {
        // RFC 9112 2.2: servers skip empty lines before a request line.
        let skip = data.iter().take_while(|&&b| b == b'\r' || b == b'\n').count();
        let rest = &data[skip..];
        let not_http = |first: bool| {
            if first { Step::Rest } else { unnamed("bytes that are not an HTTP/1 request followed a request") }
        };
        let Some(line_end) = rest.iter().position(|&b| b == b'\n') else {
            if !rest.is_empty() && !could_be_request_line(rest) {
                return not_http(self.first);
            }
            return if data.len() >= MAX_HEAD {
                unnamed("an HTTP request line longer than 16 KiB")
            } else {
                Step::NeedMore
            };
        };
        let line = &rest[..line_end];
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Ok(line) = std::str::from_utf8(line) else { return not_http(self.first) };
        let parts: Vec<&str> = line.split([' ', '\t']).filter(|p| !p.is_empty()).collect();
        let (method, target) = match parts[..] {
            [method, target, version] if is_token(method) && version.starts_with("HTTP/") => {
                if version != "HTTP/1.1" && version != "HTTP/1.0" {
                    return unnamed(format!("{version} without TLS (e.g. h2c prior knowledge) cannot be checked"));
                }
                (method, target)
            }
            ["GET", _] => return unnamed("an HTTP/0.9 request names no host"),
            _ => return not_http(self.first),
        };
        let too_long = || unnamed("an HTTP request head longer than 16 KiB");
        let Some(head_end) = head_end(rest) else {
            return if data.len() >= MAX_HEAD { too_long() } else { Step::NeedMore };
        };
        if skip + head_end > MAX_HEAD {
            return too_long();
        }
        let head = Head::parse(&rest[line_end + 1..head_end]);
        let head = match head.and_then(|h| h.check(method, target)) {
            Ok(head) => head,
            Err(why) => return Step::Unnamed(why),
        };
        self.first = false;
        self.state = head.next;
        Step::Pass { len: skip + head_end, name: Some(head.name) }
    }
}

/// Whether an unfinished first line can still become `TOKEN SP ...`.
fn could_be_request_line(line: &[u8]) -> bool {
    let method_len = line.iter().position(|&b| b == b' ').unwrap_or(line.len());
    method_len > 0
        && method_len <= 32
        && line[..method_len].iter().all(|&b| is_tchar(b))
        && line[method_len..].iter().all(|&b| b == b'\t' || b == b'\r' || (b' '..0x7f).contains(&b) || b >= 0x80)
}

/// Where the head starting at `data` ends (just after its empty line).
/// Lines may end in LF alone, as many servers accept.
fn head_end(data: &[u8]) -> Option<usize> {
    let mut start = 0;
    while let Some(n) = data[start..].iter().position(|&b| b == b'\n') {
        let line = &data[start..start + n];
        if start > 0 && (line.is_empty() || line == b"\r") {
            return Some(start + n + 1);
        }
        start += n + 1;
    }
    None
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn is_token(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(is_tchar)
}

/// The header fields that decide a request's host and framing.
#[derive(Debug, Default)]
struct Head {
    hosts: Vec<String>,
    content_length: Option<u64>,
    transfer_encoding: Option<String>,
    upgrade: Option<String>,
}

/// A checked request head: the host it names and what follows it.
struct Checked {
    name: String,
    next: State,
}

impl Head {
    fn parse(fields: &[u8]) -> Result<Head, String> {
        let text = std::str::from_utf8(fields).map_err(|_| "a request head that is not UTF-8".to_string())?;
        let mut head = Head::default();
        for line in text.split('\n') {
            let line = line.strip_suffix('\r').unwrap_or(line);
            if line.is_empty() {
                continue;
            }
            if line.starts_with([' ', '\t']) {
                return Err("a folded header line (obsolete line folding)".into());
            }
            let Some((key, value)) = line.split_once(':') else {
                return Err(format!("a header line without ':' ({line:?})"));
            };
            if !is_token(key) {
                return Err(format!("a malformed header name ({key:?})"));
            }
            let value = value.trim_matches([' ', '\t']);
            match key.to_ascii_lowercase().as_str() {
                "host" => head.hosts.push(value.to_string()),
                "content-length" => {
                    let n = value
                        .parse::<u64>()
                        .ok()
                        .filter(|_| value.bytes().all(|b| b.is_ascii_digit()))
                        .ok_or_else(|| format!("a malformed Content-Length ({value:?})"))?;
                    if head.content_length.is_some_and(|m| m != n) {
                        return Err("several different Content-Length headers".into());
                    }
                    head.content_length = Some(n);
                }
                "transfer-encoding" => {
                    let all = head.transfer_encoding.take().map_or(value.to_string(), |t| format!("{t}, {value}"));
                    head.transfer_encoding = Some(all);
                }
                "upgrade" => head.upgrade = Some(value.to_string()),
                _ => {}
            }
        }
        Ok(head)
    }

    fn check(self, method: &str, target: &str) -> Result<Checked, String> {
        let name = match &self.hosts[..] {
            [] => return Err("an HTTP request without a Host header".into()),
            [one] => {
                host_name(strip_port(one)).ok_or_else(|| format!("a Host header that is not a host name ({one:?})"))?
            }
            _ => return Err("an HTTP request with several Host headers".into()),
        };
        if method.eq_ignore_ascii_case("CONNECT") {
            return Err("a CONNECT tunnel cannot be checked".into());
        }
        if let Some((_, rest)) = target.split_once("://") {
            let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
            let authority = authority.rsplit('@').next().unwrap_or_default();
            if host_name(strip_port(authority)).as_deref() != Some(name.as_str()) {
                return Err(format!("the request target names {authority:?} but its Host header names {name:?}"));
            }
        }
        let body = match (self.content_length, self.transfer_encoding) {
            (Some(_), Some(_)) => return Err("both Content-Length and Transfer-Encoding".into()),
            (Some(n), None) => (n > 0).then_some(State::Body(n)),
            (None, Some(te)) => {
                let last = te.rsplit(',').next().unwrap_or_default().trim_matches([' ', '\t']);
                if !last.eq_ignore_ascii_case("chunked") {
                    return Err(format!("a request body whose end cannot be found (Transfer-Encoding: {te})"));
                }
                Some(State::ChunkSize)
            }
            (None, None) => None,
        };
        let next = match (self.upgrade, body) {
            (None, body) => body.unwrap_or(State::Head),
            (Some(up), None) if up.eq_ignore_ascii_case("websocket") => State::Websocket,
            (Some(up), _) => return Err(format!("a protocol switch (Upgrade: {up}) cannot be checked")),
        };
        Ok(Checked { name, next })
    }
}

fn strip_port(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return match rest.split_once(']') {
            Some((inner, "")) => inner,
            Some((inner, port)) if port.strip_prefix(':').is_some_and(|p| p.bytes().all(|b| b.is_ascii_digit())) => {
                inner
            }
            _ => host,
        };
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) && !name.contains(':') => name,
        _ => host,
    }
}

/// `name` normalized (lower case, no trailing dot) if it is a host name or
/// an IP address; None for anything else (a list, spaces, a URL), which a
/// server might read differently than a rule matches it.
pub fn host_name(name: &str) -> Option<String> {
    let name = sandbox_net::policy::normalize_name(name);
    let ok = !name.is_empty()
        && (name.parse::<std::net::IpAddr>().is_ok()
            || name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.'));
    ok.then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `data` as one buffer (trimming what passes) and returns the
    /// names passed, and the step that stopped it (NeedMore when all passed).
    fn run(data: &[u8]) -> (Vec<String>, Step) {
        let mut r = Requests::default();
        let mut names = Vec::new();
        let mut at = 0;
        loop {
            match r.next(&data[at..]) {
                Step::Pass { len, name } => {
                    assert!(len > 0);
                    names.extend(name);
                    at += len;
                }
                other => return (names, other),
            }
        }
    }

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_host_is_found_without_port_and_partial_heads_wait() {
        let req = b"GET / HTTP/1.1\r\nUser-Agent: x\r\nHOST: Files.Example.com:8080\r\n\r\n";
        assert_eq!(run(req), (names(&["files.example.com"]), Step::NeedMore));
        assert_eq!(run(b"GET / HTTP/1.1\r\nHost: [2001:db8::1]:80\r\n\r\n").0, names(&["2001:db8::1"]));
        assert_eq!(run(b"GET / HTTP/1.1\nHost: a.example.\n\n").0, names(&["a.example"]), "bare LF lines");
        for cut in [1, 2, 10, req.len() - 1] {
            assert_eq!(run(&req[..cut]), (vec![], Step::NeedMore), "cut at {cut}");
        }
    }

    #[test]
    fn other_protocols_pass_and_endless_heads_do_not() {
        assert_eq!(run(b"SSH-2.0-OpenSSH_9.2\r\n").1, Step::Rest);
        assert_eq!(run(b"\x00\x01binary").1, Step::Rest);
        assert_eq!(run(b"*1\r\n$4\r\nPING\r\n").1, Step::Rest);
        assert_eq!(run(b"get key\r\n").1, Step::Rest, "memcached");
        let mut big = b"GET / HTTP/1.1\r\nX: ".to_vec();
        big.resize(MAX_HEAD, b'a');
        assert!(matches!(run(&big).1, Step::Unnamed(_)), "an endless head is not waited for");
        big.extend_from_slice(b"\r\nHost: a.example\r\n\r\n");
        assert!(matches!(run(&big).1, Step::Unnamed(_)), "nor a complete one past the bound");
        let mut big = b"GET /".to_vec();
        big.resize(MAX_HEAD, b'a');
        assert!(matches!(run(&big).1, Step::Unnamed(_)), "nor an endless request line");
    }

    #[test]
    fn leading_empty_lines_are_skipped() {
        let (found, _) = run(b"\r\n\r\n\nGET / HTTP/1.1\r\nHost: bad.example\r\n\r\n");
        assert_eq!(found, names(&["bad.example"]));
    }

    #[test]
    fn every_request_of_a_connection_is_read() {
        let pipelined = b"GET / HTTP/1.1\r\nHost: a.example\r\n\r\nGET / HTTP/1.1\r\nHost: bad.example\r\n\r\n";
        assert_eq!(run(pipelined).0, names(&["a.example", "bad.example"]));
        // Keep-alive: the second request comes in a later read.
        let mut r = Requests::default();
        assert_eq!(r.next(b"GET / HTTP/1.1\r\nHost: a.example\r\n\r\n").into_name(), Some("a.example".into()));
        assert_eq!(r.next(b""), Step::NeedMore);
        assert_eq!(r.next(b"\r\nGET /x HTTP/1.1\r\nHost: bad.example\r\n\r\n").into_name(), Some("bad.example".into()));
        // Bodies are skipped by their length, whatever they contain.
        let body = b"POST / HTTP/1.1\r\nHost: a.example\r\nContent-Length: 35\r\n\r\nGET / HTTP/1.1\r\nHost: x.example\r\n\r\nGET / HTTP/1.1\r\nHost: bad.example\r\n\r\n";
        assert_eq!(run(body).0, names(&["a.example", "bad.example"]));
        // A request after the first that is not HTTP/1 is not let through.
        let junk = b"GET / HTTP/1.1\r\nHost: a.example\r\n\r\nget / HTTP/1.1 x\r\n";
        assert!(matches!(run(junk).1, Step::Unnamed(_)));
    }

    #[test]
    fn chunked_bodies_are_followed_to_the_next_request() {
        let chunked = b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: gzip, chunked\r\n\r\n\
            5;ext=1\r\nGET /\r\n1A\r\nHost: x.example\r\n\r\n0123456\r\n0\r\nTrailer: t\r\n\r\n\
            GET / HTTP/1.1\r\nHost: bad.example\r\n\r\n";
        assert_eq!(run(chunked).0, names(&["a.example", "bad.example"]));
        for bad in [&b"zz\r\n"[..], b"5\r\nabcdefg\r\n"] {
            let mut req = b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
            req.extend_from_slice(bad);
            assert!(matches!(run(&req).1, Step::Unnamed(_)), "{bad:?}");
        }
    }

    #[test]
    fn ambiguous_requests_are_unnamed() {
        for (req, why) in [
            (&b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"[..], "h2c"),
            (b"GET /\r\n", "HTTP/0.9"),
            (b"GET / HTTP/1.1\r\n\r\n", "without a Host"),
            (b"GET / HTTP/1.1\r\nHost: a.example\r\nHost: bad.example\r\n\r\n", "several Host"),
            (b"GET / HTTP/1.1\r\nHost: a.example, bad.example\r\n\r\n", "not a host name"),
            (b"GET http://bad.example/ HTTP/1.1\r\nHost: a.example\r\n\r\n", "names \"bad.example\""),
            (b"GET http://u@bad.example:80/ HTTP/1.1\r\nHost: a.example\r\n\r\n", "Host header names"),
            (b"CONNECT bad.example:443 HTTP/1.1\r\nHost: a.example\r\n\r\n", "CONNECT"),
            (b"GET / HTTP/1.1\r\nHost: a.example\r\nUpgrade: h2c\r\n\r\n", "Upgrade: h2c"),
            (b"GET / HTTP/1.1\r\nHost: a.example\r\n X: fold\r\n\r\n", "folded"),
            (b"GET / HTTP/1.1\r\nHost : a.example\r\n\r\n", "header name"),
            (b"POST / HTTP/1.1\r\nHost: a.example\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", "Content-Length"),
            (b"POST / HTTP/1.1\r\nHost: a.example\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n", "both"),
            (b"POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: gzip\r\n\r\n", "cannot be found"),
        ] {
            match run(req).1 {
                Step::Unnamed(reason) => assert!(reason.contains(why), "{reason} should say {why}"),
                other => panic!("{req:?}: {other:?}"),
            }
        }
        assert_eq!(run(b"GET http://A.example:80/x HTTP/1.1\r\nHost: a.example\r\n\r\n").0, names(&["a.example"]));
    }

    #[test]
    fn a_websocket_ends_the_reading_but_a_refused_switch_does_not() {
        let ws = b"GET /ws HTTP/1.1\r\nHost: a.example\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n";
        let mut framed = ws.to_vec();
        framed.extend_from_slice(&[0x81, 0x85, 1, 2, 3, 4, b'h', b'e', b'l', b'l', b'o']);
        assert_eq!(run(&framed), (names(&["a.example"]), Step::Rest));
        let mut again = ws.to_vec();
        again.extend_from_slice(b"GET / HTTP/1.1\r\nHost: bad.example\r\n\r\n");
        assert_eq!(run(&again).0, names(&["a.example", "bad.example"]));
    }

    impl Step {
        fn into_name(self) -> Option<String> {
            match self {
                Step::Pass { name, .. } => name,
                _ => None,
            }
        }
    }
}
