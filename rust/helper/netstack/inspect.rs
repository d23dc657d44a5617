//! The names a TCP flow's client bytes carry, read for flows whose verdict
//! depends on a name ([`crate::netpolicy::NetworkPolicy::name_decides`]):
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
                _ => {
                    if let Some(kind) = tls::non_handshake_record(data) {
                        return Step::Unnamed(format!("TLS: {kind} came before the ClientHello"));
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
        // Application data, an alert, a change_cipher_spec or a heartbeat
        // before any ClientHello: a request no name was checked for.
        for (first, kind) in
            [(0x17, "application data"), (0x15, "alert"), (0x14, "change_cipher_spec"), (0x18, "heartbeat")]
        {
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
    }
}
