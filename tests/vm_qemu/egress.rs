//! EGRESS through the helper's network stack: a vm reaches only what its
//! policy allows and survives hostile frames, EGRESS vms restored from a
//! snapshot each get their own network, and the network socket speaks
//! qemu's frame stream.
use std::sync::Arc;

use sandbox_helper::netstack::events::Events;
use sandbox_net::policy::NetworkPolicy;

use super::*;
use crate::net_support::{CLIENT, TestHost, dns_responder};

/// In the guest, as root, straight onto eth0 with AF_PACKET: runt and
/// garbage frames, unknown ether types, IPv4 with lying lengths and a
/// spoofed source, ARP replies and gratuitous ARP claiming the gateway and
/// the DNS address, ARP requests from a spoofed sender, then a flood of
/// full-size garbage; prints "sent N".
const HOSTILE_FRAMES: &str = r#"
import os, socket, struct
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind(("eth0", 0))
me = bytes.fromhex("5254000a000f")
gw = bytes.fromhex("52550a000202")
bcast = b"\xff" * 6
evil = bytes.fromhex("deadbeef0001")
def arp(op, sha, spa, tha, tpa):
    return struct.pack("!HHBBH6s4s6s4s", 1, 0x0800, 6, 4, op, sha, socket.inet_aton(spa), tha, socket.inet_aton(tpa))
frames = [b"", b"\x00", b"\x01" * 13, gw + me + b"\x88\xb5" + os.urandom(200), bcast + me + b"\x86\xdd" + os.urandom(60)]
frames += [gw + me + b"\x08\x00" + bytes([0x45, 0, 0xff, 0xff]) + os.urandom(40)]
frames += [gw + me + b"\x08\x00" + bytes([0x4f]) + os.urandom(10)]
spoofed = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 40, 1, 0, 64, 6, 0, socket.inet_aton("10.0.2.99"), socket.inet_aton("10.0.2.2"))
frames += [gw + me + b"\x08\x00" + spoofed + os.urandom(20)]
for ip in ("10.0.2.2", "10.0.2.3"):
    frames += [bcast + evil + b"\x08\x06" + arp(2, evil, ip, me, "10.0.2.15")]
    frames += [bcast + evil + b"\x08\x06" + arp(1, evil, ip, b"\0" * 6, ip)]
    frames += [bcast + evil + b"\x08\x06" + arp(1, evil, "10.0.2.99", b"\0" * 6, ip)]
frames += [gw + me + b"\x08\x06" + os.urandom(5)]
sent = 0
for f in frames:
    try:
        s.send(f)
        sent += 1
    except OSError:
        pass
junk = gw + me + b"\x08\x00" + os.urandom(1500)
for _ in range(20000):
    try:
        s.send(junk)
        sent += 1
    except OSError:
        pass
print("sent", sent)
"#;

/// Runs the shared test client in the guest with `args`; its one line.
async fn net_client(agent: &Mux, args: &[&str]) -> String {
    let mut argv = vec!["python3", "-c", CLIENT];
    argv.extend_from_slice(args);
    exec(agent, &argv).await.1.trim().to_string()
}

/// The policy of [`a_vm_reaches_the_network_only_as_its_policy_allows_and_survives_hostile_frames`]
/// seen from the guest: `allowed.test` resolves to `addr`, other names and
/// destinations are refused and recorded, and a test host (if any) at
/// `addr` serves its allowed port only.
async fn egress_checks(agent: &Mux, events: &Events, addr: std::net::Ipv4Addr, host: Option<&TestHost>) {
    assert_eq!(net_client(agent, &["resolve", "allowed.test"]).await, format!("['{addr}']"), "an allowed name");
    assert_eq!(net_client(agent, &["resolve", "other.test"]).await, "gaierror", "a name outside the list");
    let refused = refusals(events);
    assert!(refused.contains("dns other.test "), "the refused query is recorded: {refused}");
    assert_eq!(net_client(agent, &["tcp", "198.51.100.9", "80"]).await, "ConnectionRefusedError");
    let refused = refusals(events);
    assert!(refused.contains("tcp 198.51.100.9:80 198.51.100.9:80 is not in the allow list"), "{refused}");
    match host {
        Some(host) => {
            let a = host.addr();
            let served = net_client(agent, &["tcp", &a, "8080"]).await;
            assert_eq!(served, "HTTP/1.0 200 OK hello from the test host", "the allowed host serves");
            assert_eq!(net_client(agent, &["tcp", &a, "8081"]).await, "ConnectionRefusedError", "its other port");
        }
        None => eprintln!("SKIP (part): no test host as an ordinary user (ip netns needs root)"),
    }
}

/// What the helper's dial (the way `expose` reaches a guest port) gets
/// from an HTTP server on the guest's loopback: the agent's `Dial` stream
/// on the serial port, no network card involved. Retries while the server
/// starts (a refused dial fails the stream).
async fn dial_guest_http(agent: &Mux) -> String {
    let start = "setsid python3 -m http.server 8000 --bind 127.0.0.1 >/dev/null 2>&1 < /dev/null &";
    assert_eq!(exec(agent, &["sh", "-c", start]).await.0, 0);
    for _ in 0..60 {
        let mut s = agent.open(Frame::Dial(8000)).expect("open a dial stream");
        match tokio::time::timeout(Duration::from_secs(30), s.next()).await.expect("dial answers") {
            Ok(Some(Frame::Connected)) => {}
            _ => {
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        }
        s.send(Frame::Data(b"GET / HTTP/1.0\r\n\r\n".to_vec())).await.expect("send the request");
        s.send(Frame::End).await.expect("half-close");
        let mut answer = Vec::new();
        loop {
            match tokio::time::timeout(Duration::from_secs(30), s.next()).await.expect("the answer comes") {
                Ok(Some(Frame::Data(b))) => answer.extend(b),
                Ok(Some(Frame::Credit(_))) => {}
                _ => break,
            }
        }
        return String::from_utf8_lossy(&answer).lines().next().unwrap_or_default().to_string();
    }
    panic!("the guest's http server never accepted a dial");
}

/// The stack's refusals so far, as "protocol destination reason" lines.
fn refusals(events: &Events) -> String {
    let snap = events.snapshot();
    snap.refused.iter().map(|r| format!("{} {} {}\n", r.protocol, r.destination, r.reason)).collect()
}

/// A vm with EGRESS: its virtio-net card reaches the helper's stack, which
/// applies the sandbox's policy exactly as for a namespace sandbox (the
/// same `NetStack`, addresses and checks): DNS answers only allowed names,
/// a destination outside the allow list is refused at once with the
/// refusal recorded, and an allowed test host (root: a network namespace)
/// serves HTTP. A hostile guest's frames (garbage, lying lengths, ARP
/// spoofing of the gateway, a flood) leave the stack serving, and another
/// vm's stack in the helper answers throughout. A guest port
/// is reached by the helper's dial, as `expose` does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vm_reaches_the_network_only_as_its_policy_allows_and_survives_hostile_frames() {
    let Some(assets) = assets() else { return };
    let Some(layers) = test_image_layers() else { return };
    let (_upstream, host, addr, responder) = upstream().await;
    let policy = egress_policy(addr, &[]);
    let events = Arc::new(Events::default());
    let dir = TempDir::new("net");
    let driver = QemuDriver::with_assets(Ok(assets)).with_warm(&dir.0, 0);
    assert!(driver.capabilities().network_egress, "the vm driver offers EGRESS");
    let mut spec = seam_spec(&dir.0, layers, Vec::new());
    spec.id = "vm-net".into();
    spec.egress = Some(Egress::Stack(policy, events.clone()));
    let vm = driver.boot(&spec).await.expect("boot with EGRESS");
    let agent = vm.connection();
    let (_, conf) = exec(&agent, &["cat", "/etc/resolv.conf"]).await;
    assert_eq!(conf, "nameserver 10.0.2.3\n");
    egress_checks(&agent, &events, addr, host.as_ref()).await;

    // Another vm's stack in this helper keeps answering while this guest
    // is hostile.
    let (_neighbour, other) = neighbour_stack();
    let hostile = exec(&agent, &["python3", "-c", HOSTILE_FRAMES]);
    let asking = async {
        for _ in 0..20 {
            ask_gateway(&other).await;
        }
    };
    let ((code, sent), ()) = tokio::join!(hostile, asking);
    assert_eq!(code, 0, "{sent}");
    assert!(sent.starts_with("sent "), "{sent}");
    ask_gateway(&other).await;
    // The stack still serves the guest: every check passes again, and the
    // guest found the gateway at the stack's MAC.
    egress_checks(&agent, &events, addr, host.as_ref()).await;
    let (_, arp) = exec(&agent, &["cat", "/proc/net/arp"]).await;
    assert!(arp.lines().any(|l| l.starts_with("10.0.2.2 ") && l.contains("52:55:0a:00:02:02")), "{arp}");
    assert_eq!(dial_guest_http(&agent).await, "HTTP/1.0 200 OK", "a guest port is reachable by dial");
    vm.kill();
    responder.abort();
    vm.cleanup();
}

/// The DNS upstream the stacks of this process ask (one responder at a
/// time: the variable is process-wide), so EGRESS tests take it in turn.
static UPSTREAM: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Takes [`UPSTREAM`] and points it at a fresh responder answering every
/// name with the test host's address (as an ordinary user there is no
/// test host, ip netns needing root: names then resolve to a
/// documentation address nothing serves). Returns the turn, the host, its
/// address and the responder.
async fn upstream()
-> (tokio::sync::MutexGuard<'static, ()>, Option<TestHost>, std::net::Ipv4Addr, tokio::task::JoinHandle<()>) {
    let turn = UPSTREAM.lock().await;
    let host = TestHost::up();
    let addr: std::net::Ipv4Addr = host.as_ref().map_or("198.51.100.7".into(), |h| h.addr()).parse().unwrap();
    let (dns, responder) = dns_responder(addr).await;
    // SAFETY: std's own environment lock orders this against every other
    // env read in this process (they are all Rust's); a stack reads the
    // variable when it starts.
    unsafe { std::env::set_var("SANDBOX_VM_HELPER_DNS_UPSTREAM", dns.to_string()) };
    (turn, host, addr, responder)
}

/// The policy [`egress_checks`] expects: the test host's port 8080 and
/// `allowed.test`, plus `names`.
fn egress_policy(addr: std::net::Ipv4Addr, names: &[&str]) -> NetworkPolicy {
    let mut allow = vec![format!("{addr}:8080"), "allowed.test".into()];
    allow.extend(names.iter().map(|n| n.to_string()));
    NetworkPolicy::parse(&allow, &[]).unwrap()
}

/// Boots sandbox `name` under `dir` with EGRESS under `policy` through
/// `driver`; the vm and its stack's events.
async fn egress_vm(
    driver: &QemuDriver,
    dir: &Path,
    name: &str,
    layers: &[PathBuf],
    policy: NetworkPolicy,
) -> (Arc<VmInstance>, Arc<Events>) {
    let mapper = IdMapper::detect().expect("an id map (host-setup)");
    let (mut spec, _) = sandbox(dir, name, layers, &mapper);
    let events = Arc::new(Events::default());
    spec.egress = Some(Egress::Stack(policy, events.clone()));
    let vm = driver.boot_vm(&spec).await.unwrap_or_else(|e| panic!("boot {name} with EGRESS: {e}"));
    let (_, conf) = exec(&vm.connection(), &["cat", "/etc/resolv.conf"]).await;
    assert_eq!(conf, "nameserver 10.0.2.3\n", "{name}'s resolver is the stack");
    (vm, events)
}

/// EGRESS vms come from their shape's memory snapshot, as others do: the
/// network card is part of the shape, so its template and pool have one,
/// and each restored vm's card reaches its own stack with its own policy.
/// The first boots cold (no snapshot yet), the next comes from the pool,
/// a third (while the second runs) from the refilled pool or the state
/// file; each resolves only what its policy allows and has refusals
/// recorded, and neither sees the other's traffic: a name only the third
/// allows resolves there and not in the second, and each one's refusals
/// land in its own events only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egress_vms_come_from_the_pool_and_the_state_file_each_with_its_own_network() {
    let Some(assets) = assets() else { return };
    let Some(layers) = test_image_layers() else { return };
    let mapper = IdMapper::detect().expect("an id map (host-setup)");
    let (_upstream, host, addr, responder) = upstream().await;
    let dir = TempDir::new("netpool");
    let driver = warm_driver(&assets, &dir.0, 1);

    let (cold, events) = egress_vm(&driver, &dir.0, "cold", &layers, egress_policy(addr, &[])).await;
    assert!(
        matches!(cold.origin(), Origin::Cold { reason } if reason.contains("no memory snapshot")),
        "{:?}",
        cold.origin()
    );
    egress_checks(&cold.connection(), &events, addr, host.as_ref()).await;
    cold.kill();
    cold.cleanup();
    driver.warm().idle().await;
    let shape = Shape { network: true, ..seam_shape(&driver, &assets, &layers, &mapper).await };
    assert_eq!(driver.warm().ready(&shape), 1, "the EGRESS shape's pool filled behind the cold boot");

    let (pooled, pooled_events) = egress_vm(&driver, &dir.0, "pooled", &layers, egress_policy(addr, &[])).await;
    assert_eq!(pooled.origin(), &Origin::Pool);
    egress_checks(&pooled.connection(), &pooled_events, addr, host.as_ref()).await;

    let policy = egress_policy(addr, &["third.test"]);
    let (third, third_events) = egress_vm(&driver, &dir.0, "third", &layers, policy).await;
    assert!(matches!(third.origin(), Origin::Pool | Origin::Snapshot), "{:?}", third.origin());
    let pooled_refused = refusals(&pooled_events);
    egress_checks(&third.connection(), &third_events, addr, host.as_ref()).await;
    assert_eq!(refusals(&pooled_events), pooled_refused, "the third's refusals are not the second's");
    assert_eq!(net_client(&third.connection(), &["resolve", "third.test"]).await, format!("['{addr}']"));
    assert_eq!(net_client(&pooled.connection(), &["resolve", "third.test"]).await, "gaierror", "the second's policy");
    assert!(refusals(&pooled_events).contains("dns third.test "), "{}", refusals(&pooled_events));
    assert!(!refusals(&third_events).contains("third.test"), "{}", refusals(&third_events));
    // The second's network still answers it, not the third.
    assert_eq!(net_client(&pooled.connection(), &["resolve", "allowed.test"]).await, format!("['{addr}']"));
    for vm in [pooled, third] {
        vm.kill();
        vm.cleanup();
    }
    driver.warm().idle().await;
    driver.release().await;
    responder.abort();
}

/// An ARP request from the guest's address for `target`.
fn arp_request(target: std::net::Ipv4Addr) -> Vec<u8> {
    use sandbox_helper::netstack::{GUEST, GUEST_MAC};
    use smoltcp::wire::{ArpOperation, ArpPacket, ArpRepr, EthernetAddress, EthernetFrame, EthernetProtocol};
    let repr = ArpRepr::EthernetIpv4 {
        operation: ArpOperation::Request,
        source_hardware_addr: GUEST_MAC,
        source_protocol_addr: GUEST,
        target_hardware_addr: EthernetAddress([0; 6]),
        target_protocol_addr: target,
    };
    let mut frame = vec![0u8; 14 + repr.buffer_len()];
    let mut eth = EthernetFrame::new_unchecked(&mut frame[..]);
    eth.set_src_addr(GUEST_MAC);
    eth.set_dst_addr(EthernetAddress::BROADCAST);
    eth.set_ethertype(EthernetProtocol::Arp);
    repr.emit(&mut ArpPacket::new_unchecked(eth.payload_mut()));
    frame
}

/// The next frame the stack sends on a card's socket.
async fn reply(qemu: &tokio::net::UnixDatagram) -> Vec<u8> {
    let mut frame = vec![0u8; 65536];
    let n = tokio::time::timeout(Duration::from_secs(10), qemu.recv(&mut frame)).await.expect("an answer").unwrap();
    frame.truncate(n);
    frame
}

/// Asserts `frame` is the stack's ARP reply: the gateway is at its MAC.
fn expect_arp_reply(frame: &[u8]) {
    use sandbox_helper::netstack::{GATEWAY, GATEWAY_MAC, GUEST_MAC};
    use smoltcp::wire::{ArpOperation, ArpPacket, ArpRepr, EthernetFrame};
    let eth = EthernetFrame::new_checked(frame).unwrap();
    assert_eq!((eth.src_addr(), eth.dst_addr()), (GATEWAY_MAC, GUEST_MAC));
    let repr = ArpRepr::parse(&ArpPacket::new_checked(eth.payload()).unwrap()).unwrap();
    let ArpRepr::EthernetIpv4 { operation, source_hardware_addr, source_protocol_addr, .. } = repr else {
        panic!("{repr:?}")
    };
    assert_eq!((operation, source_hardware_addr, source_protocol_addr), (ArpOperation::Reply, GATEWAY_MAC, GATEWAY));
}

/// A second vm's stack in the same helper, the test playing its qemu:
/// its stack and qemu's end of the card.
fn neighbour_stack() -> (sandbox_helper::netstack::NetStack, tokio::net::UnixDatagram) {
    let (qemu, helper) = sandbox_helper::driver::qemu::network::pair().expect("a card's socket pair");
    let stack = helper.serve(NetworkPolicy::default(), Arc::new(Events::default())).expect("serve");
    (stack, as_qemu(qemu))
}

/// qemu's end of a card as the test's socket.
fn as_qemu(fd: std::os::fd::OwnedFd) -> tokio::net::UnixDatagram {
    let socket = std::os::unix::net::UnixDatagram::from(fd);
    socket.set_nonblocking(true).unwrap();
    tokio::net::UnixDatagram::from_std(socket).unwrap()
}

/// Asks `qemu`'s stack for the gateway's MAC and checks the answer.
async fn ask_gateway(qemu: &tokio::net::UnixDatagram) {
    qemu.send(&arp_request(sandbox_net::plan::GATEWAY)).await.unwrap();
    expect_arp_reply(&reply(qemu).await);
}

/// The card without qemu: the test plays qemu's `-netdev dgram` end. The
/// stack answers ARP for the gateway with its MAC, and after runts,
/// garbage and a datagram far beyond any frame it is still answering.
#[tokio::test]
async fn the_cards_socket_pair_carries_one_frame_per_datagram_and_survives_garbage() {
    let (_stack, qemu) = neighbour_stack();
    ask_gateway(&qemu).await;
    for junk in [vec![1u8, 2, 3], vec![0xffu8; 1500], vec![0x5au8; 60_000], Vec::new()] {
        qemu.send(&junk).await.unwrap();
    }
    ask_gateway(&qemu).await;
}
