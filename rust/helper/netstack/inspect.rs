//! The names a TCP flow's client bytes carry, read for flows whose verdict
//! depends on a name ([`sandbox_net::policy::NetworkPolicy::name_decides`]):
//! the SNI of a TLS ClientHello ([`super::tls`]) or the Host of every HTTP/1
//! request ([`super::http`]). Pure: the flow feeds it the client bytes it
//! has not passed upstream yet and acts on each [`Step`].
use super::http::Requests;
use super::tls::{self, Hello};

/// What to do with the start of the bytes not yet passed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Hold them: what decides is not complete yet (never past
    /// [`tls::MAX_HELLO`] or [`super::http::MAX_HEAD`] bytes).
    NeedMore,
    /// Some bytes may go upstream once a name, if any, is allowed; then
    /// ask again about the rest.
    Pass {
        /// How many (> 0).
        len: usize,
        /// The host they name (a request head or ClientHello), if any.
        name: Option<String>,
    },
    /// Everything from here on goes unread: another protocol than TLS or
    /// HTTP/1, the encrypted stream after a ClientHello, a websocket.
    Rest,
    /// TLS or HTTP whose name cannot be checked: why.
    Unnamed(String),
}

/// Reads one flow's client bytes.
#[derive(Debug, Default)]
pub enum Inspector {
    /// Nothing seen yet.
    #[default]
    Start,
    /// A TLS ClientHello is awaited.
    Tls,
    /// HTTP/1 requests (or, until the first, maybe another protocol).
    Http(Requests),
    /// The ClientHello passed: the rest is encrypted.
    Done,
}

impl Inspector {
    /// What the start of `data` (the client bytes not yet passed) is.
    pub fn next(&mut self, data: &[u8]) -> Step {
        match self {
            Inspector::Start => match data {
                [] => Step::NeedMore,
                [first] if tls::is_record_type(*first) => Step::NeedMore,
                [first, ..] if first & 0x80 != 0 && data.len() < tls::SSLV2_PREFIX => Step::NeedMore,
                _ => {
                    if let Some(kind) = tls::non_handshake_record(data) {
                        return Step::Unnamed(format!("TLS: {kind} came before the ClientHello"));
                    }
                    if tls::sslv2_client_hello(data) {
                        return Step::Unnamed(
                            "TLS: an SSLv2-format ClientHello, which carries no server name (SNI)".into(),
                        );
                    }
                    *self =
                        if tls::looks_like_tls(data) { Inspector::Tls } else { Inspector::Http(Requests::default()) };
                    self.next(data)
                }
            },
            Inspector::Tls => match tls::client_hello(data) {
                Hello::NeedMore => Step::NeedMore,
                Hello::Done { sni: Some(name), len } => {
                    *self = Inspector::Done;
                    Step::Pass { len, name: Some(name) }
                }
                Hello::Done { sni: None, .. } => {
                    Step::Unnamed("a TLS ClientHello without exactly one server name (SNI)".into())
                }
                Hello::Bad(why) => Step::Unnamed(format!("TLS: {why}")),
            },
            Inspector::Http(requests) => requests.next(data),
            Inspector::Done => Step::Rest,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tls::tests::{client_hello_record, hello_message, records};
    use super::*;

    #[test]
    fn tls_passes_its_hello_named_then_the_rest_unread() {
        let mut i = Inspector::default();
        let message = hello_message("bad.example");
        let split = records(&message, &[3, 40]);
        assert_eq!(i.next(&split[..1]), Step::NeedMore);
        assert_eq!(i.next(&split[..7]), Step::NeedMore);
        assert_eq!(i.next(&split), Step::Pass { len: split.len(), name: Some("bad.example".into()) });
        assert_eq!(i.next(b"\x17\x03\x03"), Step::Rest);
        let unnamed = Inspector::default().next(&client_hello_record("a.example, b.example"));
        assert!(matches!(unnamed, Step::Unnamed(why) if why.contains("SNI")));
    }

    #[test]
    fn http_and_other_protocols_are_told_apart() {
        let mut i = Inspector::default();
        assert_eq!(
            i.next(b"GET / HTTP/1.1\r\nHost: a.example\r\n\r\n"),
            Step::Pass { len: 35, name: Some("a.example".into()) }
        );
        assert_eq!(Inspector::default().next(b"\x16\x01nope"), Step::Rest, "not TLS, not HTTP");
        assert_eq!(Inspector::default().next(b"SSH-2.0-x\r\n"), Step::Rest);
    }

    #[test]
    fn a_tls_record_other_than_a_handshake_first_is_refused_not_passed() {
        // Application data, an alert, a change_cipher_spec, a heartbeat or
        // any other type of 0x14..=0x1f before any ClientHello: a request no
        // name was checked for.
        for (first, kind) in [
            (0x17, "application data"),
            (0x15, "alert"),
            (0x14, "change_cipher_spec"),
            (0x18, "heartbeat"),
            (0x19, "another content type"),
            (0x1a, "another content type"),
            (0x1f, "another content type"),
        ] {
            let mut i = Inspector::default();
            assert_eq!(i.next(&[first]), Step::NeedMore, "one byte of {kind} decides nothing yet");
            let record = [first, 0x03, 0x03, 0x00, 0x05, b'h', b'e', b'l', b'l', b'o'];
            let step = i.next(&record);
            assert!(
                matches!(&step, Step::Unnamed(why) if why.contains(kind) && why.contains("before the ClientHello")),
                "{step:?}"
            );
            // Followed by a real ClientHello, it is refused all the same.
            let mut both = record.to_vec();
            both.extend_from_slice(&client_hello_record("good.example"));
            assert!(matches!(Inspector::default().next(&both), Step::Unnamed(_)));
        }
        // The same first bytes with another second byte are not TLS.
        assert_eq!(Inspector::default().next(b"\x17\x01binary"), Step::Rest);
        assert_eq!(Inspector::default().next(b"\x1f\x01binary"), Step::Rest);
        // Past the range, one byte decides at once (here: not HTTP).
        assert_eq!(Inspector::default().next(b"\x20"), Step::Rest);
    }

    /// An SSLv2-format ClientHello (2-byte header, high bit set), as old
    /// clients sent it to offer TLS 1.0: version 3.1, one cipher spec, no
    /// session id, a 16-byte challenge.
    fn sslv2_hello() -> Vec<u8> {
        let mut body = vec![0x01, 0x03, 0x01, 0x00, 0x03, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x2f];
        body.extend_from_slice(&[0x11; 16]);
        let mut record = vec![0x80 | (body.len() >> 8) as u8, body.len() as u8];
        record.extend_from_slice(&body);
        record
    }

    #[test]
    fn an_sslv2_client_hello_is_refused_not_passed() {
        let hello = sslv2_hello();
        let mut i = Inspector::default();
        assert_eq!(i.next(&hello[..1]), Step::NeedMore, "its first byte decides nothing yet");
        assert_eq!(i.next(&hello[..2]), Step::NeedMore, "nor its header");
        for data in [&hello[..3], &hello[..]] {
            let step = Inspector::default().next(data);
            assert!(matches!(&step, Step::Unnamed(why) if why.contains("SSLv2") && why.contains("SNI")), "{step:?}");
        }
        // A real ClientHello after it changes nothing.
        let mut both = hello.clone();
        both.extend_from_slice(&client_hello_record("good.example"));
        assert!(matches!(Inspector::default().next(&both), Step::Unnamed(why) if why.contains("SSLv2")));
        // Neither the 3-byte header form (high bit clear), which OpenSSL
        // does not read, nor a high bit before another message type is one:
        // they are another protocol.
        assert_eq!(Inspector::default().next(b"\x00\x1c\x00\x01\x03\x01"), Step::Rest);
        assert_eq!(Inspector::default().next(b"\x80\x1c\x02\x03\x01"), Step::Rest, "a server hello");
        assert_eq!(Inspector::default().next(b"\xff\xfe\x00binary"), Step::Rest);
        // Ordinary TLS and HTTP are read as before.
        let tls = client_hello_record("good.example");
        assert_eq!(Inspector::default().next(&tls), Step::Pass { len: tls.len(), name: Some("good.example".into()) });
        let get = b"GET / HTTP/1.1\r\nHost: good.example\r\n\r\n";
        assert_eq!(Inspector::default().next(get), Step::Pass { len: get.len(), name: Some("good.example".into()) });
    }
}
