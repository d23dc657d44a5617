//! The sandbox-ctl NDJSON request parser, and the response lines built
//! from what it returns: each is one line of valid JSON.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sandbox_ctl::protocol::{ErrorCode, error_line, parse_request, result_line};

fn one_json_line(line: &str) {
    let body = line.strip_suffix('\n').expect("a response line ends with a newline");
    assert!(!body.contains('\n'));
    serde_json::from_str::<serde_json::Value>(body).expect("a response line is JSON");
}

fuzz_target!(|data: &[u8]| {
    match parse_request(data) {
        Ok(request) => one_json_line(&result_line(&request.id, serde_json::Value::Object(request.params))),
        Err(bad) => one_json_line(&error_line(&bad.id, ErrorCode::InvalidRequest, &bad.message)),
    }
});
