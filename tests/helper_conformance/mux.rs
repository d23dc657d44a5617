//! One agent connection per VM carries every request at once: many
//! concurrent execs next to a bulk copy stay correct and independent, and a
//! connection that dies fails every open request with an error instead of
//! ending it as if it had finished.
use super::*;

/// 16 MiB of a pattern both the guest (python) and this test can make.
const BIG: usize = 16 << 20;

fn big_content() -> Vec<u8> {
    (0..=255u8).cycle().take(BIG).collect()
}

async fn make_big_file(h: &mut Harness, id: &str) {
    let o = h
        .sh(id, "python3 -c \"import sys; sys.stdout.buffer.write(bytes(range(256)) * 65536)\" > /tmp/big && echo ok")
        .await;
    assert_eq!(o.out(), "ok\n", "{o:?}");
}

/// A copy-out of the big file, started.
async fn copy_out_big(h: &mut Harness, id: &str) -> tonic::Streaming<pb::CopyOutResponse> {
    h.client.copy_out(pb::CopyOutRequest { vm_id: id.into(), path: "/tmp/big".into() }).await.unwrap().into_inner()
}

/// The content of the one file in a tar stream.
fn only_file(tar: &[u8]) -> Vec<u8> {
    let mut archive = tar::Archive::new(tar);
    let mut entry = archive.entries().unwrap().next().unwrap().unwrap();
    let mut data = Vec::new();
    std::io::Read::read_to_end(&mut entry, &mut data).unwrap();
    data
}

async fn exec_cat(mut client: VmHelperClient<Channel>, id: String, payload: Vec<u8>) -> Result<Output, tonic::Status> {
    let (tx, rx) = mpsc::channel(8);
    tx.send(req(pb::exec_request::Msg::Start(process(&id, &["cat"])))).await.unwrap();
    let mut out = client.exec(ReceiverStream::new(rx)).await?.into_inner();
    let feed = tokio::spawn(async move {
        for chunk in payload.chunks(16 * 1024) {
            let _ = tx.send(req(pb::exec_request::Msg::Stdin(chunk.to_vec()))).await;
        }
        let _ = tx.send(req(pb::exec_request::Msg::CloseStdin(pb::CloseStdin {}))).await;
    });
    let o = collect(&mut out).await;
    feed.await.unwrap();
    o
}

#[tokio::test]
async fn fifty_execs_and_a_large_copy_out_run_at_once_and_all_are_exact() {
    let mut h = Harness::new("mux50").await;
    let id = h.running("vm", |_| {}).await;
    make_big_file(&mut h, &id).await;
    let mut copy = copy_out_big(&mut h, &id).await;
    // The copy is under way (its first chunk is here) while the execs run.
    let mut tar = copy.next().await.unwrap().unwrap().data;
    let execs: Vec<_> = (0..50u32)
        .map(|i| {
            let payload: Vec<u8> = (0..64 * 1024 + i).map(|b| (b * (i + 1)) as u8).collect();
            let run = exec_cat(h.client.clone(), id.clone(), payload.clone());
            tokio::spawn(async move { (payload, run.await) })
        })
        .collect();
    let reader = tokio::spawn(async move {
        while let Some(msg) = copy.next().await {
            tar.extend(msg.unwrap().data);
        }
        tar
    });
    for e in execs {
        let (payload, out) = e.await.unwrap();
        let out = out.unwrap();
        assert_eq!(out.code(), Some(0), "{:?}", out.err());
        assert!(out.stdout == payload, "exec output differs: {} bytes for {}", out.stdout.len(), payload.len());
    }
    assert!(only_file(&reader.await.unwrap()) == big_content(), "the copy-out's content differs");
}

#[tokio::test]
async fn a_lost_agent_connection_fails_every_open_stream() {
    let mut h = Harness::new("muxlost").await;
    if h.helper.is_none() {
        eprintln!("skipped: kills the agent, only on a helper this test started");
        return;
    }
    let id = h.running("vm", |_| {}).await;
    make_big_file(&mut h, &id).await;
    let mut execs = Vec::new();
    for _ in 0..5 {
        let (tx, mut out) = h.open(process(&id, &["sleep", "1000"])).await.unwrap();
        assert!(matches!(out.next().await.unwrap().unwrap().msg, Some(pb::exec_response::Msg::Started(_))));
        execs.push((tx, out));
    }
    // A copy-out left unread: it waits on flow control, mid-stream.
    let mut copy = copy_out_big(&mut h, &id).await;
    assert!(!copy.next().await.unwrap().unwrap().data.is_empty());
    // The agent spawns every process: the shell's parent is the agent, on
    // every driver (PID 2 under namespaces, a child of guest-init in a VM).
    let _ = h.run(process(&id, &["sh", "-c", "kill -9 $PPID"]), b"").await;
    let bounded = Duration::from_secs(60);
    for (_tx, mut out) in execs {
        let e = tokio::time::timeout(bounded, collect(&mut out)).await.expect("an exec hung").unwrap_err();
        assert_eq!(e.code(), Code::Unavailable, "{e}");
        assert!(e.message().contains("agent"), "{e}");
    }
    let copied = tokio::time::timeout(bounded, async {
        while let Some(msg) = copy.next().await {
            msg?;
        }
        Ok::<(), tonic::Status>(())
    })
    .await
    .expect("the copy-out hung");
    let e = copied.expect_err("a cut copy-out must not end as if complete");
    assert_eq!(e.code(), Code::Unavailable, "{e}");
}
