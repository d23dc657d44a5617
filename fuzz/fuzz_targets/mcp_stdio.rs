//! MCP stdio framing and JSON-RPC decoding: any bytes, cut into reads of
//! any size, split into lines under a small limit, each line decoded.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sandbox_mcp_tools::stdio::{Decoded, LineSplitter, Split, decode_line, leading_id, oversized_reply};

/// A small line limit, so the oversized path is reached too.
const MAX: usize = 256;

fuzz_target!(|data: &[u8]| {
    // The first byte sets the read size, as a pipe hands over chunks.
    let Some((&read, input)) = data.split_first() else { return };
    let read = usize::from(read).max(1);
    let mut splitter = LineSplitter::new(MAX);
    let mut lines = Vec::new();
    for chunk in input.chunks(read) {
        let mut rest = chunk;
        while !rest.is_empty() {
            let (taken, split) = splitter.feed(rest);
            assert!(taken > 0 && taken <= rest.len());
            rest = &rest[taken..];
            lines.push(split);
        }
    }
    lines.push(splitter.finish());
    for split in lines {
        match split {
            Split::More => {}
            Split::Line(line) => {
                assert!(line.len() <= MAX);
                if let Decoded::Reply(reply) = decode_line(&line) {
                    serde_json::to_vec(&reply).expect("a reply serializes");
                }
            }
            Split::Oversized(head) => {
                serde_json::to_vec(&oversized_reply(&head)).expect("a reply serializes");
            }
        }
    }
    // Whole input as one line too: the decoder sees lengths the splitter cuts.
    let _ = decode_line(input);
    let _ = leading_id(input);
});
