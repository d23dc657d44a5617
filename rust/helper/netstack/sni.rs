//! The name a flow's first bytes carry: the SNI of a TLS ClientHello or the
//! Host header of an HTTP/1 request. The stack checks it against the policy
//! a second time before forwarding anything the client sent.

/// What the client's first bytes say so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peek {
    /// Looks like TLS or HTTP but is not complete yet.
    NeedMore,
    /// The name the client asked for (lower case, no port, no trailing dot).
    Name(String),
    /// Neither TLS with SNI nor HTTP with Host: nothing to check.
    Nothing,
}

/// The most the stack holds back from upstream while waiting for a name; a
/// ClientHello or request head larger than this is passed on unchecked
/// beyond the connection's first policy check.
pub const MAX_PEEK: usize = 16 * 1024;

const METHODS: &[&[u8]] =
    &[b"GET ", b"POST ", b"PUT ", b"HEAD ", b"DELETE ", b"OPTIONS ", b"PATCH ", b"CONNECT ", b"TRACE "];

/// Looks at the first bytes a client sent.
pub fn peek(data: &[u8]) -> Peek {
    match data.first() {
        None => Peek::NeedMore,
        Some(0x16) => tls_sni(data),
        Some(_) => http_host(data),
    }
}

fn tls_sni(data: &[u8]) -> Peek {
    if data.len() < 5 {
        return Peek::NeedMore;
    }
    let record_len = usize::from(u16::from_be_bytes([data[3], data[4]]));
    if data.len() < 5 + record_len {
        return if 5 + record_len > MAX_PEEK { Peek::Nothing } else { Peek::NeedMore };
    }
    client_hello_sni(&data[5..5 + record_len]).map_or(Peek::Nothing, Peek::Name)
}

/// A byte reader that fails (None) instead of panicking on short input.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn u8(&mut self) -> Option<usize> {
        self.take(1).map(|b| usize::from(b[0]))
    }
    fn u16(&mut self) -> Option<usize> {
        self.take(2).map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
    }
    fn vec8(&mut self) -> Option<&'a [u8]> {
        let n = self.u8()?;
        self.take(n)
    }
    fn vec16(&mut self) -> Option<&'a [u8]> {
        let n = self.u16()?;
        self.take(n)
    }
}

fn client_hello_sni(handshake: &[u8]) -> Option<String> {
    let mut r = Reader(handshake);
    if r.u8()? != 1 {
        return None; // not a ClientHello
    }
    r.take(3)?; // handshake length: the record bounds us already
    r.take(2 + 32)?; // version, random
    r.vec8()?; // session id
    r.vec16()?; // cipher suites
    r.vec8()?; // compression methods
    let mut exts = Reader(r.vec16()?);
    while !exts.0.is_empty() {
        let kind = exts.u16()?;
        let body = exts.vec16()?;
        if kind != 0 {
            continue;
        }
        let mut list = Reader(Reader(body).vec16()?);
        while !list.0.is_empty() {
            let name_type = list.u8()?;
            let name = list.vec16()?;
            if name_type == 0 {
                return clean_name(std::str::from_utf8(name).ok()?);
            }
        }
    }
    None
}

fn http_host(data: &[u8]) -> Peek {
    let is_method = METHODS.iter().any(|m| data.starts_with(m));
    if !is_method {
        let could_be = METHODS.iter().any(|m| m.starts_with(data));
        return if could_be { Peek::NeedMore } else { Peek::Nothing };
    }
    let Some(end) = data.windows(4).position(|w| w == b"\r\n\r\n") else {
        return if data.len() >= MAX_PEEK { Peek::Nothing } else { Peek::NeedMore };
    };
    let head = String::from_utf8_lossy(&data[..end]);
    for line in head.split("\r\n").skip(1) {
        let Some((key, value)) = line.split_once(':') else { continue };
        if key.trim().eq_ignore_ascii_case("host") {
            return clean_name(strip_port(value.trim())).map_or(Peek::Nothing, Peek::Name);
        }
    }
    Peek::Nothing
}

fn strip_port(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) && !name.contains(':') => name,
        _ => host,
    }
}

fn clean_name(name: &str) -> Option<String> {
    let name = crate::netpolicy::normalize_name(name);
    (!name.is_empty()).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ClientHello record carrying `sni` (and an unrelated
    /// extension first, as real clients send many).
    pub fn client_hello(sni: &str) -> Vec<u8> {
        let mut sni_ext = Vec::new();
        let name = sni.as_bytes();
        let entry_len = 3 + name.len();
        sni_ext.extend_from_slice(&(entry_len as u16).to_be_bytes());
        sni_ext.push(0);
        sni_ext.extend_from_slice(&(name.len() as u16).to_be_bytes());
        sni_ext.extend_from_slice(name);
        let mut exts = vec![0x00, 0x17, 0x00, 0x00]; // extended_master_secret, empty
        exts.extend_from_slice(&[0x00, 0x00]);
        exts.extend_from_slice(&(sni_ext.len() as u16).to_be_bytes());
        exts.extend_from_slice(&sni_ext);
        let mut body = vec![0x03, 0x03];
        body.extend_from_slice(&[7u8; 32]);
        body.push(0); // session id
        body.extend_from_slice(&[0x00, 0x02, 0x13, 0x01]); // one cipher suite
        body.extend_from_slice(&[0x01, 0x00]); // null compression
        body.extend_from_slice(&(exts.len() as u16).to_be_bytes());
        body.extend_from_slice(&exts);
        let mut hs = vec![0x01];
        hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
        hs.extend_from_slice(&body);
        let mut rec = vec![0x16, 0x03, 0x01];
        rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
        rec.extend_from_slice(&hs);
        rec
    }

    #[test]
    fn tls_sni_is_found_and_partial_hellos_wait() {
        let hello = client_hello("Example.ORG");
        assert_eq!(peek(&hello), Peek::Name("example.org".into()));
        for cut in [1, 4, 5, 20, hello.len() - 1] {
            assert_eq!(peek(&hello[..cut]), Peek::NeedMore, "cut at {cut}");
        }
        let mut more = hello.clone();
        more.extend_from_slice(b"application data follows");
        assert_eq!(peek(&more), Peek::Name("example.org".into()));
    }

    #[test]
    fn tls_without_sni_or_malformed_is_nothing() {
        let mut hello = client_hello("a.example");
        // Turn it into a ServerHello-typed handshake.
        hello[5] = 2;
        assert_eq!(peek(&hello), Peek::Nothing);
        // Truncate the inner structure while keeping the record length honest.
        let garbage = [0x16, 0x03, 0x01, 0x00, 0x03, 0x01, 0x00, 0x00];
        assert_eq!(peek(&garbage), Peek::Nothing);
        // A record announced larger than we hold back is not waited for.
        assert_eq!(peek(&[0x16, 0x03, 0x01, 0xff, 0xff, 0x01]), Peek::Nothing);
    }

    #[test]
    fn http_host_is_found_without_port() {
        let req = b"GET / HTTP/1.1\r\nUser-Agent: x\r\nHOST: Files.Example.com:8080\r\n\r\n";
        assert_eq!(peek(req), Peek::Name("files.example.com".into()));
        assert_eq!(peek(b"GET / HTTP/1.1\r\nHost: [2001:db8::1]:80\r\n\r\n"), Peek::Name("2001:db8::1".into()));
        assert_eq!(peek(b"POST /x HTTP/1.1\r\nHost: a.example.\r\n\r\nbody"), Peek::Name("a.example".into()));
        assert_eq!(peek(b"GET / HTTP/1.0\r\n\r\n"), Peek::Nothing, "no Host header");
    }

    #[test]
    fn http_partial_heads_wait_and_other_protocols_pass() {
        assert_eq!(peek(b"GE"), Peek::NeedMore);
        assert_eq!(peek(b"GET / HTTP/1.1\r\nHost: a"), Peek::NeedMore);
        assert_eq!(peek(b"SSH-2.0-OpenSSH_9.2\r\n"), Peek::Nothing);
        assert_eq!(peek(b"\x00\x01binary"), Peek::Nothing);
        let mut big = b"GET / HTTP/1.1\r\nX: ".to_vec();
        big.resize(MAX_PEEK, b'a');
        assert_eq!(peek(&big), Peek::Nothing, "an endless head is not waited for");
    }
}
