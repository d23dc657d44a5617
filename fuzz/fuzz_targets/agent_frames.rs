//! The in-sandbox agent's frame decoder on any byte stream: frames it
//! decodes encode again to frames that decode the same.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sandbox_mcp::agent::protocol::FrameReader;

fuzz_target!(|data: &[u8]| {
    let runtime = tokio::runtime::Builder::new_current_thread().build().expect("a runtime");
    runtime.block_on(async {
        let mut reader = FrameReader::new(data);
        while let Ok(Some(frame)) = reader.next().await {
            let mut bytes = Vec::new();
            if frame.encode(&mut bytes).is_ok() {
                match FrameReader::new(bytes.as_slice()).next().await {
                    Ok(Some(again)) => assert_eq!(again, frame),
                    other => panic!("{frame:?} encoded to bytes that decode to {other:?}"),
                }
            }
        }
    });
});
