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
                [] | [0x16] => Step::NeedMore,
                _ => {
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
}
