//! Test hosts for egress tests, shared by the helper's conformance suite
//! and the vm driver's tests: a network namespace behind a veth pair (made
//! by scripts/test-host.sh) serving HTTP and UDP echo, a DNS responder on
//! the host's loopback, and the in-sandbox client that reaches them.
use std::net::{Ipv4Addr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// HTTP on 8080 and UDP echo on 8081, on the test host's address.
pub const TEST_HOST_SERVER: &str = include_str!("host_server.py");

/// In the sandbox: `tcp HOST PORT [HOSTHEADER]` GETs / and prints the
/// status line or the error's name; `udp HOST PORT` sends one datagram on a
/// connected socket and prints the answer or the error; `resolve NAME`
/// prints the addresses or the error.
pub const CLIENT: &str = r#"
import socket, sys
kind = sys.argv[1]
try:
    if kind == "tcp":
        host, port = sys.argv[2], int(sys.argv[3])
        hosthdr = sys.argv[4] if len(sys.argv) > 4 else host
        s = socket.create_connection((host, port), timeout=8)
        s.sendall(b"GET / HTTP/1.1\r\nHost: " + hosthdr.encode() + b"\r\nConnection: close\r\n\r\n")
        data = b""
        while True:
            b = s.recv(65536)
            if not b:
                break
            data += b
        print(data.split(b"\r\n")[0].decode() if data else "EMPTY", data.split(b"\r\n\r\n")[-1].decode())
    elif kind == "udp":
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.settimeout(5)
        s.connect((sys.argv[2], int(sys.argv[3])))
        s.send(b"ping")
        print(s.recv(100).decode())
    elif kind == "resolve":
        print(sorted({a[4][0] for a in socket.getaddrinfo(sys.argv[2], 80)}))
except Exception as e:
    print(type(e).__name__)
"#;

/// A test host serving [`TEST_HOST_SERVER`] at `10.213.N.2` (or `NET.2`);
/// removed on drop.
pub struct TestHost {
    name: String,
    /// Its number, unique per run.
    pub n: u32,
    /// The first three octets of its /30 (`10.213.N` unless placed elsewhere).
    net: String,
    server: Option<Child>,
}

impl TestHost {
    /// None (test skipped) when not root or `ip netns` is unavailable.
    pub fn up() -> Option<TestHost> {
        Self::up_in(None)
    }

    /// A test host whose /30 starts at `net.0` (e.g. "198.51.100") instead
    /// of the default 10.213.N.0.
    pub fn up_in(net: Option<&str>) -> Option<TestHost> {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        if !nix_is_root() {
            eprintln!("skipped: test hosts need root (ip netns)");
            return None;
        }
        let n = (std::process::id() + SEQ.fetch_add(1, Ordering::SeqCst) * 7) % 250 + 1;
        let name = format!("smcp{n}");
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/test-host.sh");
        let _ = Command::new(script).args(["down", &name]).status();
        let net = net.map_or_else(|| format!("10.213.{n}"), str::to_string);
        let ok = Command::new(script).args(["up", &name, &n.to_string(), &net]).status().is_ok_and(|s| s.success());
        if !ok {
            eprintln!("skipped: could not create a test host (ip netns)");
            return None;
        }
        let addr = format!("{net}.2");
        let server = Command::new("ip")
            .args(["netns", "exec", &name, "python3", "-c", TEST_HOST_SERVER, &addr])
            .stdin(Stdio::null())
            .spawn()
            .expect("start the test host's server");
        let host = TestHost { name, n, net, server: Some(server) };
        // Wait until it serves.
        for _ in 0..100 {
            let up = Command::new("ip")
                .args(["netns", "exec", &host.name, "python3", "-c"])
                .arg(format!("import socket; socket.create_connection(('{addr}', 8080), timeout=1)"))
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if up {
                return Some(host);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("the test host's server did not come up");
    }

    pub fn addr(&self) -> String {
        format!("{}.2", self.net)
    }

    /// The host's own end of the veth.
    pub fn host_side(&self) -> String {
        format!("{}.1", self.net)
    }
}

impl Drop for TestHost {
    fn drop(&mut self) {
        if let Some(mut s) = self.server.take() {
            let _ = s.kill();
            let _ = s.wait();
        }
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/test-host.sh");
        let _ = Command::new(script).args(["down", &self.name]).status();
    }
}

pub fn nix_is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A DNS responder on 127.0.0.1: every A query gets `addr`, every AAAA
/// query gets ::1 (which the stack must drop).
pub async fn dns_responder(addr: Ipv4Addr) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    use simple_dns::rdata::{A, AAAA, RData};
    use simple_dns::{CLASS, Packet, QTYPE, ResourceRecord, TYPE};
    let sock = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let local = sock.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        while let Ok((n, peer)) = sock.recv_from(&mut buf).await {
            let Ok(q) = Packet::parse(&buf[..n]) else { continue };
            let mut reply = Packet::new_reply(q.id());
            for question in &q.questions {
                reply.questions.push(question.clone());
                let rdata = match question.qtype {
                    QTYPE::TYPE(TYPE::A) => RData::A(A { address: u32::from(addr) }),
                    QTYPE::TYPE(TYPE::AAAA) => RData::AAAA(AAAA { address: 1 }),
                    _ => continue,
                };
                reply.answers.push(ResourceRecord::new(question.qname.clone(), CLASS::IN, 60, rdata));
            }
            if let Ok(bytes) = reply.build_bytes_vec() {
                let _ = sock.send_to(&bytes, peer).await;
            }
        }
    });
    (local, task)
}
