//! Wall-clock stamps, the way the contract, the state files and tar headers
//! carry them: one reading of `SystemTime` for the whole crate.
use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch: 0 for a clock set before it,
/// `i64::MAX` past what an `i64` holds.
pub fn unix_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Whole seconds since the Unix epoch: 0 for a clock set before it.
pub fn unix_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_readings_agree_and_are_after_2020() {
        let (ms, secs) = (unix_ms(), unix_secs());
        assert!(secs > 1_577_836_800, "{secs}");
        assert!((ms / 1000).abs_diff(secs as i64) <= 1, "{ms} ms and {secs} s");
    }
}
