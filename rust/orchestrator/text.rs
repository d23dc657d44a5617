//! Turning captured process output into text for a client without losing
//! anything: valid UTF-8 passes through, every other byte shows as `\xNN`,
//! and a truncation note says how much was cut.
use super::exec::{Captured, MAX_OUTPUT};

/// Bytes as text: UTF-8 kept, invalid bytes escaped as `\xNN`.
pub fn escape_bytes(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        out.push_str(chunk.valid());
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// A captured stream as text with the reference's truncation note appended
/// when bytes were dropped. A UTF-8 sequence cut by the cap is dropped whole
/// rather than shown as escapes.
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
    let mut text = escape_bytes(bytes);
    if c.truncated() {
        text.push_str(&format!(
            "\n[truncated — {} total, showing first {}]",
            human_size(c.total),
            human_size(MAX_OUTPUT as u64)
        ));
    }
    text
}

/// Sizes as the reference prints them: `512B`, `48.8KB`, `1.5MB`, `2.0GB`.
pub fn human_size(n: u64) -> String {
    const KB: f64 = 1024.0;
    let f = n as f64;
    if f < KB {
        format!("{n}B")
    } else if f < KB * KB {
        format!("{:.1}KB", f / KB)
    } else if f < KB * KB * KB {
        format!("{:.1}MB", f / KB / KB)
    } else {
        format!("{:.1}GB", f / KB / KB / KB)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_invalid_bytes_only() {
        assert_eq!(escape_bytes(b"h\xc3\xa9\x00\xff!"), "hé\u{0}\\xff!");
    }

    #[test]
    fn sizes() {
        assert_eq!(human_size(12), "12B");
        assert_eq!(human_size(50_000), "48.8KB");
        assert_eq!(human_size(3 << 20), "3.0MB");
    }

    #[test]
    fn truncation_note() {
        let c = Captured { bytes: vec![b'x'; MAX_OUTPUT], total: 1 << 20 };
        let t = render(&c);
        assert!(t.ends_with("[truncated — 1.0MB total, showing first 48.8KB]"), "{}", &t[t.len() - 60..]);
    }
}
