//! Dial: byte pipes to TCP ports inside a VM, against python servers
//! started in the VM.
use super::*;

/// `echo` mode echoes until EOF, then half-closes; `count` mode reads to
/// EOF and only then answers with the byte count (proving the half-close
/// reached it while its answer could still travel back); `source` sends
/// 256 MiB of zeros without reading.
const SERVER: &str = r#"
import socket, sys, threading
mode, port = sys.argv[1], int(sys.argv[2])
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", port))
s.listen(64)
def serve(c):
    n = 0
    if mode == "source":
        block = bytes(1 << 20)
        for _ in range(256):
            c.sendall(block)
        c.close()
        return
    buf = bytearray(1 << 20)
    while True:
        if mode == "echo":
            b = c.recv(262144)
            k = len(b)
            c.sendall(b)
        else:
            k = c.recv_into(buf)
        if not k:
            break
        n += k
    if mode == "count":
        c.sendall(b"count=%d" % n)
    c.shutdown(socket.SHUT_WR)
    c.close()
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;

fn dial_req(msg: pb::dial_request::Msg) -> pb::DialRequest {
    pb::DialRequest { msg: Some(msg) }
}

type DialPipe = (mpsc::Sender<pb::DialRequest>, Streaming<pb::DialResponse>);

async fn dial(client: &mut VmHelperClient<Channel>, id: &str, port: u32) -> Result<DialPipe, tonic::Status> {
    let (tx, rx) = mpsc::channel(8);
    tx.send(dial_req(pb::dial_request::Msg::Start(pb::DialStart { vm_id: id.into(), port }))).await.unwrap();
    let mut resp = client.dial(ReceiverStream::new(rx)).await?.into_inner();
    match resp.next().await {
        Some(Ok(pb::DialResponse { msg: Some(pb::dial_response::Msg::Connected(_)) })) => Ok((tx, resp)),
        Some(Err(e)) => Err(e),
        other => panic!("expected connected first, got {other:?}"),
    }
}

/// Starts a server in the VM and waits (bounded) until it accepts.
async fn serve(h: &mut Harness, id: &str, mode: &str, port: u32) {
    let script = format!("cat > /tmp/srv.py <<'EOF'\n{SERVER}\nEOF\n");
    assert_eq!(h.sh(id, &script).await.code(), Some(0));
    let start = format!("python3 /tmp/srv.py {mode} {port} >/tmp/srv-{port}.log 2>&1 &");
    assert_eq!(h.sh(id, &start).await.code(), Some(0));
    let mut poll = Poll::every(Duration::from_millis(25));
    while poll.again().await {
        match dial(&mut h.client, id, port).await {
            Ok(_) => return,
            Err(e) if e.code() == Code::Unavailable => {}
            Err(e) => panic!("dial while waiting for the server: {e}"),
        }
    }
    panic!("server on port {port} never came up");
}

/// Everything the guest sends until it closes.
async fn read_all(out: &mut Streaming<pb::DialResponse>) -> Result<Vec<u8>, tonic::Status> {
    let mut got = Vec::new();
    while let Some(msg) = out.next().await {
        if let Some(pb::dial_response::Msg::Data(b)) = msg?.msg {
            got.extend(b);
        }
    }
    Ok(got)
}

/// Sends `data` in chunks, then half-closes.
async fn send_all(tx: mpsc::Sender<pb::DialRequest>, data: Vec<u8>, chunk: usize) {
    for c in data.chunks(chunk) {
        tx.send(dial_req(pb::dial_request::Msg::Data(c.to_vec()))).await.unwrap();
    }
    tx.send(dial_req(pb::dial_request::Msg::CloseWrite(pb::CloseStdin {}))).await.unwrap();
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn checksum(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

#[tokio::test]
async fn dial_reaches_a_guest_server_and_half_closes() {
    let mut h = Harness::new("dial").await;
    let id = h.running("vm", |_| {}).await;
    serve(&mut h, &id, "count", 7001).await;
    let (tx, mut out) = dial(&mut h.client, &id, 7001).await.unwrap();
    send_all(tx, b"hello, guest".to_vec(), 4).await;
    assert_eq!(read_all(&mut out).await.unwrap(), b"count=12");

    serve(&mut h, &id, "echo", 7002).await;
    let (tx, mut out) = dial(&mut h.client, &id, 7002).await.unwrap();
    send_all(tx, b"ping".to_vec(), 1024).await;
    assert_eq!(read_all(&mut out).await.unwrap(), b"ping");
}

#[tokio::test]
async fn dial_to_a_closed_port_is_unavailable() {
    let mut h = Harness::new("dialno").await;
    let id = h.running("vm", |_| {}).await;
    let e = dial(&mut h.client, &id, 7999).await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e}");
    assert!(e.message().contains("connection refused to port 7999"), "{}", e.message());
    let e = dial(&mut h.client, &id, 70000).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e}");
    let e = dial(&mut h.client, "no-such-vm", 80).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e}");
    h.stop(&id).await.unwrap();
    let e = dial(&mut h.client, &id, 80).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e}");
}

#[tokio::test]
async fn eight_concurrent_dials_stay_separate() {
    let mut h = Harness::new("dial8").await;
    let id = h.running("vm", |_| {}).await;
    serve(&mut h, &id, "echo", 7003).await;
    let mut tasks = Vec::new();
    for i in 0..8u64 {
        let mut client = h.client.clone();
        let id = id.clone();
        tasks.push(tokio::spawn(async move {
            let data = pattern(1 << 20, i + 1);
            let (tx, mut out) = dial(&mut client, &id, 7003).await.unwrap();
            let sender = tokio::spawn(send_all(tx, data.clone(), 64 * 1024));
            let got = read_all(&mut out).await.unwrap();
            sender.await.unwrap();
            assert!(got == data, "dial {i}: echo differs ({} bytes)", got.len());
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

#[tokio::test]
async fn a_64_mib_transfer_arrives_intact() {
    let mut h = Harness::new("dialbig").await;
    let id = h.running("vm", |_| {}).await;
    serve(&mut h, &id, "echo", 7004).await;
    let data = pattern(64 << 20, 42);
    let want = checksum(&data);
    let (tx, mut out) = dial(&mut h.client, &id, 7004).await.unwrap();
    let started = std::time::Instant::now();
    let sender = tokio::spawn(send_all(tx, data, 256 * 1024));
    let got = read_all(&mut out).await.unwrap();
    let secs = started.elapsed().as_secs_f64();
    sender.await.unwrap();
    assert_eq!(got.len(), 64 << 20);
    assert_eq!(checksum(&got), want);
    // Informational only (each byte crossed the helper twice).
    eprintln!("dial echo: 64 MiB each way in {secs:.3}s = {:.0} MB/s per direction", 64.0 * 1.048_576 / secs);
}

#[tokio::test]
async fn dial_throughput_is_reported() {
    let mut h = Harness::new("dialrate").await;
    let id = h.running("vm", |_| {}).await;
    serve(&mut h, &id, "count", 7005).await;
    serve(&mut h, &id, "source", 7006).await;
    let block = vec![7u8; 256 * 1024];
    let (tx, mut out) = dial(&mut h.client, &id, 7005).await.unwrap();
    let started = std::time::Instant::now();
    for _ in 0..1024 {
        tx.send(dial_req(pb::dial_request::Msg::Data(block.clone()))).await.unwrap();
    }
    tx.send(dial_req(pb::dial_request::Msg::CloseWrite(pb::CloseStdin {}))).await.unwrap();
    assert_eq!(read_all(&mut out).await.unwrap(), b"count=268435456");
    let up = started.elapsed().as_secs_f64();
    // The client keeps its side open: the stream still ends when the
    // guest closes.
    let (_keep_open, mut out) = dial(&mut h.client, &id, 7006).await.unwrap();
    let started = std::time::Instant::now();
    let mut n = 0;
    while let Some(msg) = out.next().await {
        if let Some(pb::dial_response::Msg::Data(b)) = msg.unwrap().msg {
            n += b.len();
        }
    }
    let down = started.elapsed().as_secs_f64();
    assert_eq!(n, 256 << 20);
    // Informational only: no assertion on time.
    eprintln!(
        "dial throughput, 256 MiB each: client->guest {:.0} MB/s, guest->client {:.0} MB/s",
        268.435_456 / up,
        268.435_456 / down
    );
}
