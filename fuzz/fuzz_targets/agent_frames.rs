//! The agent protocol's frame decoder on any byte stream: frames it decodes
//! (with their stream ids) encode again to frames that decode the same; and
//! the multiplexer serving those bytes never panics, whatever they open,
//! cancel or credit.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sandbox_agent::mux::Mux;
use sandbox_agent::protocol::FrameReader;
use tokio::io::AsyncWriteExt as _;

fuzz_target!(|data: &[u8]| {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    runtime.block_on(async {
        let mut reader = FrameReader::new(data);
        while let Ok(Some((stream, frame))) = reader.next().await {
            let mut bytes = Vec::new();
            if frame.encode(stream, &mut bytes).is_ok() {
                match FrameReader::new(bytes.as_slice()).next().await {
                    Ok(Some(again)) => assert_eq!(again, (stream, frame)),
                    other => panic!("{frame:?} encoded to bytes that decode to {other:?}"),
                }
            }
        }
        let (ours, theirs) = tokio::io::duplex(1 << 16);
        let (_mux, mut incoming) = Mux::serve(theirs);
        let (mut rd, mut wr) = tokio::io::split(ours);
        // What the multiplexer sends back (credits, failures) is drained, so
        // its writer never waits on a full pipe.
        tokio::spawn(async move { tokio::io::copy(&mut rd, &mut tokio::io::sink()).await });
        let _ = wr.write_all(data).await;
        // The end of the input: dropping one half of a split stream would not
        // close it, and the multiplexer would wait for more bytes forever.
        let _ = wr.shutdown().await;
        let mut streams = Vec::new();
        while let Some(mut s) = incoming.recv().await {
            while let Ok(Some(_)) = s.next().await {}
            streams.push(s);
        }
    });
});
