//! The server name (SNI) of a TLS ClientHello, reassembled across the
//! handshake records it arrives in: a handshake message may legally span
//! records (down to one byte each), so reading only the first record would
//! let a split ClientHello pass unnamed.

/// The most TLS bytes (record headers included) held back for one
/// ClientHello; a larger or unfinished one names nothing we can check.
pub const MAX_HELLO: usize = 16 * 1024;

/// What a client's TLS bytes say so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hello {
    /// The ClientHello is not complete yet.
    NeedMore,
    /// Complete.
    Done {
        /// Its server name, if it carries exactly one.
        sni: Option<String>,
        /// How many bytes (whole records) it took.
        len: usize,
    },
    /// Not a well-formed ClientHello within the bound: what is wrong.
    Bad(&'static str),
}

/// Whether `data` (at least 2 bytes) starts like a TLS handshake record.
pub fn looks_like_tls(data: &[u8]) -> bool {
    data.len() >= 2 && data[0] == HANDSHAKE && data[1] == 3
}

/// Whether `byte` may be a TLS record's content type: the ones in use
/// (change_cipher_spec, alert, handshake, application_data, heartbeat,
/// tls12_cid, ack) and the rest of 0x14..=0x1f: a flow starting with one may
/// be TLS, and is read as TLS once its second byte says so.
pub fn is_record_type(byte: u8) -> bool {
    (CHANGE_CIPHER_SPEC..=LAST_RECORD_TYPE).contains(&byte)
}

/// What a TLS record other than a handshake record at the start of a flow
/// (at least 2 bytes) is, if it is one: nothing a client sends before its
/// ClientHello, so it is refused rather than passed unread (application
/// data sent first would carry a request no name was checked for). Any
/// content type of 0x14..=0x1f with a version-major byte of 3 counts, not
/// only the known ones: what a server does with a type it does not know
/// is its own affair, and no ClientHello starts that way.
pub fn non_handshake_record(data: &[u8]) -> Option<&'static str> {
    if data.len() < 2 || data[1] != 3 || !is_record_type(data[0]) {
        return None;
    }
    match data[0] {
        HANDSHAKE => None,
        CHANGE_CIPHER_SPEC => Some("a change_cipher_spec record"),
        ALERT => Some("an alert record"),
        APPLICATION_DATA => Some("an application data record"),
        HEARTBEAT => Some("a heartbeat record"),
        _ => Some("a record of another content type"),
    }
}

/// How many bytes [`sslv2_client_hello`] needs to decide.
pub const SSLV2_PREFIX: usize = 3;

/// Whether `data` (at least [`SSLV2_PREFIX`] bytes) starts like an
/// SSLv2-format ClientHello: a two-byte record header with the high bit set,
/// then message type 1 (CLIENT-HELLO), as OpenSSL tells one apart on a
/// server's first record. It has no extensions, so no SNI, yet servers that
/// still accept it answer it (from the default site of a shared address).
pub fn sslv2_client_hello(data: &[u8]) -> bool {
    data.len() >= SSLV2_PREFIX && data[0] & 0x80 != 0 && data[2] == SSLV2_CLIENT_HELLO
}

const CHANGE_CIPHER_SPEC: u8 = 0x14;
const ALERT: u8 = 0x15;
const HANDSHAKE: u8 = 0x16;
const APPLICATION_DATA: u8 = 0x17;
const HEARTBEAT: u8 = 0x18;
const LAST_RECORD_TYPE: u8 = 0x1f;
const SSLV2_CLIENT_HELLO: u8 = 1;
const CLIENT_HELLO: u8 = 1;

/// Reassembles the ClientHello from the handshake records at the start of
/// `data` and reads its SNI.
pub fn client_hello(data: &[u8]) -> Hello {
    let mut message = Vec::new();
    let mut pos = 0;
    loop {
        if message.len() >= 4 {
            if message[0] != CLIENT_HELLO {
                return Hello::Bad("the first handshake message is not a ClientHello");
            }
            let need = 4 + (usize::from(message[1]) << 16 | usize::from(message[2]) << 8 | usize::from(message[3]));
            if need > MAX_HELLO {
                return Hello::Bad("the ClientHello is larger than 16 KiB");
            }
            if message.len() >= need {
                return Hello::Done { sni: client_hello_sni(&message[..need]), len: pos };
            }
        }
        if pos + 5 >= MAX_HELLO {
            return Hello::Bad("the ClientHello's records are larger than 16 KiB");
        }
        let Some(header) = data.get(pos..pos + 5) else { return Hello::NeedMore };
        if header[0] != HANDSHAKE || header[1] != 3 {
            return Hello::Bad("a record other than a handshake record came before the ClientHello ended");
        }
        let record_len = usize::from(u16::from_be_bytes([header[3], header[4]]));
        if record_len == 0 {
            return Hello::Bad("an empty handshake record");
        }
        if pos + 5 + record_len > MAX_HELLO {
            return Hello::Bad("the ClientHello's records are larger than 16 KiB");
        }
        let Some(fragment) = data.get(pos + 5..pos + 5 + record_len) else { return Hello::NeedMore };
        message.extend_from_slice(fragment);
        pos += 5 + record_len;
    }
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

/// The one host name of a complete ClientHello message. None when it has
/// none, or more than one (a server extension or name list beyond the
/// first could be what the server acts on).
fn client_hello_sni(message: &[u8]) -> Option<String> {
    let mut r = Reader(message);
    r.take(4)?; // type and length: the caller cut the message to its length
    r.take(2 + 32)?; // version, random
    r.vec8()?; // session id
    r.vec16()?; // cipher suites
    r.vec8()?; // compression methods
    let mut exts = Reader(r.vec16()?);
    let mut found = None;
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
                if found.is_some() {
                    return None;
                }
                found = Some(super::http::host_name(std::str::from_utf8(name).ok()?)?);
            }
        }
    }
    found
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A ClientHello handshake message carrying `sni` (and an unrelated
    /// extension first, as real clients send many).
    pub fn hello_message(sni: &str) -> Vec<u8> {
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
        let mut hs = vec![CLIENT_HELLO];
        hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
        hs.extend_from_slice(&body);
        hs
    }

    /// `message` in handshake records cut at `cuts` (offsets into it).
    pub fn records(message: &[u8], cuts: &[usize]) -> Vec<u8> {
        let mut bounds = vec![0];
        bounds.extend_from_slice(cuts);
        bounds.push(message.len());
        let mut out = Vec::new();
        for w in bounds.windows(2) {
            let part = &message[w[0]..w[1]];
            out.extend_from_slice(&[HANDSHAKE, 0x03, 0x01]);
            out.extend_from_slice(&(part.len() as u16).to_be_bytes());
            out.extend_from_slice(part);
        }
        out
    }

    /// A ClientHello for `sni` in one record.
    pub fn client_hello_record(sni: &str) -> Vec<u8> {
        records(&hello_message(sni), &[])
    }

    fn done(sni: &str, len: usize) -> Hello {
        Hello::Done { sni: Some(sni.into()), len }
    }

    #[test]
    fn sni_is_found_in_one_record_and_partial_hellos_wait() {
        let hello = client_hello_record("Example.ORG");
        assert_eq!(client_hello(&hello), done("example.org", hello.len()));
        for cut in [1, 4, 5, 20, hello.len() - 1] {
            assert_eq!(client_hello(&hello[..cut]), Hello::NeedMore, "cut at {cut}");
        }
        let mut more = hello.clone();
        more.extend_from_slice(b"\x17\x03\x03\x00\x01x");
        assert_eq!(client_hello(&more), done("example.org", hello.len()));
    }

    #[test]
    fn a_hello_split_across_records_is_reassembled() {
        let message = hello_message("bad.example.com");
        // Where the SNI extension's name starts: inside it.
        let in_sni = message.windows(3).position(|w| w == b"bad").unwrap() + 1;
        for cuts in [vec![10], vec![1, 2, 3, 50, 60], vec![in_sni], vec![3, in_sni - 4, in_sni]] {
            let data = records(&message, &cuts);
            assert_eq!(client_hello(&data), done("bad.example.com", data.len()), "cuts {cuts:?}");
            assert_eq!(client_hello(&data[..data.len() - 1]), Hello::NeedMore, "cuts {cuts:?}");
        }
    }

    #[test]
    fn hellos_without_one_name_or_malformed_or_too_large_name_nothing() {
        let mut not_hello = hello_message("a.example");
        not_hello[0] = 2;
        assert_eq!(
            client_hello(&records(&not_hello, &[])),
            Hello::Bad("the first handshake message is not a ClientHello")
        );
        // A truncated inner structure inside an honest length.
        assert_eq!(
            client_hello(&[0x16, 0x03, 0x01, 0x00, 0x04, 0x01, 0x00, 0x00, 0x00]),
            Hello::Done { sni: None, len: 9 }
        );
        let message = hello_message("a.example");
        let mut interleaved = records(&message[..10], &[]);
        interleaved.extend_from_slice(b"\x17\x03\x03\x00\x01x");
        assert!(matches!(client_hello(&interleaved), Hello::Bad(_)));
        assert!(matches!(client_hello(&[0x16, 0x03, 0x01, 0x00, 0x00]), Hello::Bad(_)), "empty record");
        // A message or records beyond the bound are not waited for.
        assert!(matches!(client_hello(&[0x16, 0x03, 0x01, 0x00, 0x04, 0x01, 0x01, 0x00, 0x00]), Hello::Bad(_)));
        assert!(matches!(client_hello(&[0x16, 0x03, 0x01, 0xff, 0xff, 0x01]), Hello::Bad(_)));
        let long = hello_message(&format!("{}.example", "a".repeat(3000)));
        let tiny = records(&long, &(1..long.len()).collect::<Vec<_>>());
        assert!(tiny.len() > MAX_HELLO);
        assert!(matches!(client_hello(&tiny), Hello::Bad(_)), "one byte per record, past the bound");
        // Two SNI extensions, or a name that is not a host name.
        let mut two = message.clone();
        // The SNI extension is last: type, length, list length, name type,
        // name length, "a.example".
        let sni_ext = &message[message.len() - (4 + 2 + 3 + 9)..];
        two.extend_from_slice(sni_ext);
        let exts_len_at = 4 + 2 + 32 + 1 + 4 + 2;
        let exts_len = u16::from_be_bytes([two[exts_len_at], two[exts_len_at + 1]]) + sni_ext.len() as u16;
        two[exts_len_at..exts_len_at + 2].copy_from_slice(&exts_len.to_be_bytes());
        let body_len = (two.len() - 4) as u32;
        two[1..4].copy_from_slice(&body_len.to_be_bytes()[1..]);
        assert_eq!(client_hello(&records(&two, &[])), Hello::Done { sni: None, len: two.len() + 5 });
        let odd = records(&hello_message("a.example, b.example"), &[]);
        assert_eq!(client_hello(&odd), Hello::Done { sni: None, len: odd.len() });
    }
}
