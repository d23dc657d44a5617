//! Turning captured process output into text for a client: valid UTF-8
//! passes through, bytes that are not UTF-8 show as U+FFFD (never as a
//! `\xNN` that output could also contain literally; the structured results
//! carry the exact bytes beside), and a truncation note says how much was cut.
use super::exec::{Captured, MAX_OUTPUT};

/// Bytes as text: UTF-8 kept, each invalid sequence shown as U+FFFD.
pub fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A captured stream as text with the reference's truncation note appended
/// when bytes were dropped. A UTF-8 sequence cut by the cap is dropped whole
/// rather than shown as a replacement character.
pub fn render(c: &Captured) -> String {
    let mut bytes = c.bytes.as_slice();
    if c.truncated() {
        // Drop a multi-byte character split at the cap.
        let valid_up_to = match std::str::from_utf8(bytes) {
            Ok(_) => bytes.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => bytes.len(),
        };
        bytes = &bytes[..valid_up_to];
    }
    let mut text = lossy(bytes);
    if c.truncated() {
        text.push_str(&format!(
            "\n[truncated — {} total, showing first {}]",
            human_size(c.total),
            human_size(MAX_OUTPUT as u64)
        ));
    }
    text
}

/// Sizes as every answer prints them ([`sandbox_base::size`]).
pub use sandbox_base::size::human_size;

/// A path for a message: its names may come from a sandbox (see
/// [`escaped_bytes`]).
pub fn escaped_path(path: &std::path::Path) -> String {
    escaped_bytes(path.as_os_str().as_encoded_bytes())
}

/// Text that came from a sandbox or an image, for a message: control
/// characters (a newline would start a line of its own in the agent's text),
/// bidirectional and invisible format characters, and bytes that are not
/// UTF-8 are written as escapes, and `\` as `\\` so that an escape cannot
/// be forged.
pub fn escaped_bytes(bytes: &[u8]) -> String {
    let mut out = String::new();
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                // `\n`, `\t`, `\u{1b}`...
                c if c.is_control() => out.extend(c.escape_debug()),
                c if is_invisible(c) => out.extend(c.escape_unicode()),
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// Format characters that change how the text around them reads without
/// showing themselves: bidirectional controls, zero-width characters, line
/// and paragraph separators, the byte order mark.
pub fn is_invisible(c: char) -> bool {
    matches!(c,
        '\u{00ad}' | '\u{061c}' | '\u{180e}' | '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}'
        | '\u{2060}'..='\u{206f}' | '\u{feff}' | '\u{fff9}'..='\u{fffb}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_invalid_bytes_only() {
        assert_eq!(lossy(b"h\xc3\xa9\x00\xff!\\xff"), "hé\u{0}\u{fffd}!\\xff");
    }

    #[test]
    fn truncation_note() {
        let c = Captured { bytes: vec![b'x'; MAX_OUTPUT], total: 1 << 20 };
        let t = render(&c);
        assert!(t.ends_with("[truncated — 1.0MB total, showing first 48.8KB]"), "{}", &t[t.len() - 60..]);
    }
}
