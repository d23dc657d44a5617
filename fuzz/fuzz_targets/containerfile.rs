//! The Containerfile parser on any text.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sandbox_orchestrator::containerfile::parse;

fuzz_target!(|data: &[u8]| {
    let _ = parse(&String::from_utf8_lossy(data));
});
