//! Reading what a registry says when something fails: its text made safe
//! to show, an error's causes on one line, and whether they show a server
//! that does not speak TLS or a certificate that was refused.

/// How much of a registry's own text goes into an error.
pub(super) const HOSTILE_TEXT_MAX: usize = 300;

/// A registry's own text, made safe to show: control and invisible
/// formatting characters dropped, whitespace collapsed, at most 300
/// characters.
pub(super) fn clean(text: &str) -> String {
    let invisible =
        |c: char| matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{2069}' | '\u{feff}');
    let mut out = String::new();
    let mut count = 0;
    for c in text.chars().filter(|&c| !invisible(c)) {
        let c = if c.is_control() || c.is_whitespace() { ' ' } else { c };
        if c == ' ' && (out.is_empty() || out.ends_with(' ')) {
            continue;
        }
        if count == HOSTILE_TEXT_MAX {
            out.push('…');
            break;
        }
        out.push(c);
        count += 1;
    }
    out.trim_end().to_string()
}

/// An error and its causes, one line ("error sending request" alone does
/// not say the certificate was refused).
pub(super) fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// Whether a failed request shows that the server does not speak TLS at
/// all: what it sent first is no TLS record (a plain HTTP server answers
/// the ClientHello with `HTTP/1.1 400`), or it closed the connection
/// without a word of TLS. A server that answers TLS, with whatever
/// certificate or alert, does not qualify. rustls's and tokio-rustls's
/// texts are matched (rustls is not a dependency of ours to downcast to);
/// the plain-HTTP registry tests fail if they change.
pub(super) fn speaks_no_tls(e: &dyn std::error::Error) -> bool {
    let text = chain(e);
    text.contains("received corrupt message of type InvalidContentType") || text.contains("tls handshake eof")
}

/// The text of a rejected server certificate (`invalid peer certificate:
/// UnknownIssuer`) in an error's chain, if that is what it is.
pub(super) fn certificate_problem(text: &str) -> Option<&str> {
    text.find("invalid peer certificate").map(|at| &text[at..])
}
