//! Sizes as every answer prints them, so one image or file reads the same
//! size wherever it is reported.

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
    fn sizes() {
        assert_eq!(human_size(12), "12B");
        assert_eq!(human_size(50_000), "48.8KB");
        assert_eq!(human_size(3 << 20), "3.0MB");
        // An image of 657,000,000 bytes: the same figure in every answer.
        assert_eq!(human_size(657_000_000), "626.6MB");
    }
}
