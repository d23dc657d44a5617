//! Conformance tests for the VmHelper contract, written only against the
//! generated gRPC client so they can run against any helper.
//!
//! With `SANDBOX_MCP_CONFORMANCE_SOCKET` set, every test talks to that
//! helper. Otherwise each test starts its own `sandbox-vm-helper serve` with
//! XDG dirs in a temp dir and the image store from
//! `SANDBOX_MCP_TEST_IMAGE_STORE` (built by `make test`), and kills it at the
//! end, even on panic.
//!
//! With `SANDBOX_MCP_CONFORMANCE_DRIVER` set (e.g. `vm`, with the vm assets
//! in `SANDBOX_MCP_VM_DIR`), every VM a test creates names that driver: run
//! a chosen subset against it by filter, e.g. `exec_` and `lifecycle_`.
//!
//! With `SANDBOX_MCP_CONFORMANCE_BRIDGE=1`, the helpers it starts run
//! `serve --through-bridge`: every VM call crosses the swift-bridge ABI.
//!
//! The issue-3 RPCs have a file each under `helper_conformance/`; the image
//! RPCs (issue 4) are in `helper_conformance/images.rs`, with a store of
//! their own per test whose base image is a symlink to the shared one.
use std::collections::HashMap;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use sandbox_mcp::proto::v1 as pb;
use sandbox_mcp::proto::v1::vm_helper_client::VmHelperClient;
use tokio::sync::mpsc;
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Streaming};

#[path = "helper_conformance/background.rs"]
mod background;
#[path = "helper_conformance/copy.rs"]
mod copy;
#[path = "helper_conformance/dial.rs"]
mod dial;
#[path = "helper_conformance/images.rs"]
mod images;
#[path = "helper_conformance/mux.rs"]
mod mux;
#[path = "support/net.rs"]
mod net_support;
#[path = "helper_conformance/network.rs"]
mod network;
#[path = "helper_conformance/quota.rs"]
mod quota;
#[path = "helper_conformance/refused.rs"]
mod refused;
#[path = "helper_conformance/seed.rs"]
mod seed;
#[path = "helper_conformance/stats.rs"]
mod stats;
#[path = "helper_conformance/warm.rs"]
mod warm;

// ------------------------------------------------------------------ harness

/// A directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        // Short, because Unix socket paths are limited to 107 bytes.
        let p = PathBuf::from(format!("/tmp/smcp-h{}-{}", std::process::id(), N.fetch_add(1, Ordering::SeqCst)));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        // Through the helper's own removal: as an ordinary user, VM
        // directories hold files only the sandbox's id map reaches.
        let _ = sandbox_mcp::helper::userns::remove_tree(&self.0);
    }
}

/// The helper under test; stopped (TERM, then KILL) on drop.
struct HelperProcess(Child);

impl Drop for HelperProcess {
    fn drop(&mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        for _ in 0..200 {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Harness {
    // Dropped first: the helper stops (and cleans its VMs) before the temp
    // dir holding its state goes away.
    helper: Option<HelperProcess>,
    client: VmHelperClient<Channel>,
    image: String,
    /// The host uid of root inside per the test image's id map, when we know
    /// the store.
    host_root: Option<u32>,
    tmp: TempDir,
    /// The helper's socket, for tests that open channels of their own.
    socket: PathBuf,
    prefix: String,
    /// An external helper (SANDBOX_MCP_CONFORMANCE_SOCKET) outlives the
    /// test, so the VMs created here are deleted on drop.
    external: Option<PathBuf>,
    created: Vec<String>,
}

impl Drop for Harness {
    fn drop(&mut self) {
        let (Some(socket), ids) = (self.external.take(), std::mem::take(&mut self.created)) else {
            return;
        };
        // Drop cannot await, and the test's runtime is busy dropping us:
        // clean up from a thread with a runtime of its own.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                if let Some(mut client) = connect(&socket).await {
                    for id in ids {
                        let _ = client.delete_vm(pb::DeleteVmRequest { id }).await;
                    }
                }
            });
        })
        .join();
    }
}

/// How long a test waits for something that happens eventually (a process's
/// output, a state change, a server coming up). Generous on purpose: the suite
/// runs two tests at a time on 2-core machines, as root and as an ordinary
/// user, next to VMs filling their disks; a wait that succeeds ends at once,
/// so only a real failure pays for it.
const PATIENCE: Duration = Duration::from_secs(60);

/// A bounded poll: `while poll.again().await { … }` runs its body at once,
/// then every `every`, until [`PATIENCE`] has passed.
struct Poll {
    every: Duration,
    deadline: tokio::time::Instant,
    first: bool,
}

impl Poll {
    fn every(every: Duration) -> Self {
        Poll { every, deadline: tokio::time::Instant::now() + PATIENCE, first: true }
    }

    /// `false` once the patience is spent; sleeps between rounds.
    async fn again(&mut self) -> bool {
        if std::mem::take(&mut self.first) {
            return true;
        }
        if tokio::time::Instant::now() >= self.deadline {
            return false;
        }
        tokio::time::sleep(self.every).await;
        true
    }
}

async fn connect(socket: &Path) -> Option<VmHelperClient<Channel>> {
    let socket = socket.to_path_buf();
    // Windows as large as the helper's, so bulk streams (Dial, copies) are
    // not throttled by HTTP/2 flow control on the client side.
    let channel = Endpoint::try_from("http://localhost")
        .ok()?
        .initial_stream_window_size(8 << 20)
        .initial_connection_window_size(32 << 20)
        .connect_with_connector(tower::service_fn(move |_| {
            let socket = socket.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(socket).await?)) }
        }))
        .await
        .ok()?;
    Some(VmHelperClient::new(channel).max_decoding_message_size(64 << 20))
}

impl Harness {
    async fn new(test: &str) -> Harness {
        Harness::launch(test, false).await
    }

    /// A harness whose helper has an image store of its own, holding only a
    /// symlink to the shared test image (what the pytest suite does), so
    /// tests can commit and delete images freely.
    async fn with_own_store(test: &str) -> Harness {
        Harness::launch(test, true).await
    }

    /// The helper's image store, when this harness made it.
    fn own_store(&self) -> Option<PathBuf> {
        let p = self.tmp.0.join("images");
        p.exists().then_some(p)
    }

    /// A harness whose helper gets `env` too (e.g. its DNS upstream).
    async fn with_env(test: &str, env: &[(&str, String)]) -> Harness {
        Harness::launch_env(test, false, env).await
    }

    async fn launch(test: &str, own_store: bool) -> Harness {
        Harness::launch_env(test, own_store, &[]).await
    }

    async fn launch_env(test: &str, own_store: bool, env: &[(&str, String)]) -> Harness {
        let image = std::env::var("SANDBOX_MCP_TEST_IMAGE").unwrap_or_else(|_| "mcp-test".into());
        let tmp = TempDir::new();
        let prefix = format!("{test}-{}", std::process::id());
        if let Ok(socket) = std::env::var("SANDBOX_MCP_CONFORMANCE_SOCKET") {
            let client = connect(Path::new(&socket)).await.expect("connect to SANDBOX_MCP_CONFORMANCE_SOCKET");
            return Harness {
                client,
                image,
                host_root: None,
                tmp,
                socket: PathBuf::from(&socket),
                prefix,
                helper: None,
                external: Some(PathBuf::from(socket)),
                created: Vec::new(),
            };
        }
        let store = std::env::var("SANDBOX_MCP_TEST_IMAGE_STORE").expect(
            "SANDBOX_MCP_TEST_IMAGE_STORE is not set: run `make test`, which builds the test image and sets it \
             (or set SANDBOX_MCP_CONFORMANCE_SOCKET to test a running helper)",
        );
        let host_root = std::fs::read_to_string(Path::new(&store).join(&image).join("image.json"))
            .ok()
            .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok())
            .and_then(|v| {
                let uids = v.pointer("/id_map/uids")?.as_array()?.clone();
                uids.iter().find(|e| e["inside"] == 0).and_then(|e| e["outside"].as_u64())
            })
            .map(|u| u as u32);
        let store = if own_store {
            let own = tmp.0.join("images");
            std::fs::create_dir_all(&own).unwrap();
            std::os::unix::fs::symlink(Path::new(&store).join(&image), own.join(&image)).unwrap();
            own.display().to_string()
        } else {
            store
        };
        let socket = tmp.0.join("h.sock");
        // The build's helper, unless the run names a copy (an ordinary
        // user's run may not reach the build tree: scripts/test-user.sh).
        let helper =
            std::env::var_os("SANDBOX_VM_HELPER_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_sandbox-vm-helper").into());
        let child = Command::new(helper)
            .arg("serve")
            .args(through_bridge().then_some("--through-bridge"))
            .arg("--socket")
            .arg(&socket)
            .env("XDG_DATA_HOME", tmp.0.join("data"))
            .env("XDG_STATE_HOME", tmp.0.join("state"))
            .env("XDG_RUNTIME_DIR", tmp.0.join("run"))
            .env("SANDBOX_MCP_IMAGE_STORE", &store)
            .env("RUST_LOG", "warn")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn sandbox-vm-helper");
        let helper = HelperProcess(child);
        let mut client = None;
        let mut poll = Poll::every(Duration::from_millis(25));
        while client.is_none() && poll.again().await {
            if socket.exists() {
                client = connect(&socket).await;
            }
        }
        let client = client.expect("helper did not come up");
        Harness {
            client,
            image,
            host_root,
            tmp,
            socket,
            prefix,
            helper: Some(helper),
            external: None,
            created: Vec::new(),
        }
    }

    fn id(&self, name: &str) -> String {
        format!("{}-{name}", self.prefix)
    }

    fn spec(&self, name: &str) -> pb::VmSpec {
        pb::VmSpec {
            id: self.id(name),
            image: self.image.clone(),
            network: pb::NetworkMode::None as i32,
            driver: driver_under_test(),
            ..Default::default()
        }
    }

    async fn create(&mut self, spec: pb::VmSpec) -> Result<pb::Vm, tonic::Status> {
        self.created.push(spec.id.clone());
        let r = self.client.create_vm(pb::CreateVmRequest { spec: Some(spec) }).await?;
        Ok(r.into_inner().vm.expect("vm in response"))
    }

    async fn start(&mut self, id: &str) -> Result<pb::Vm, tonic::Status> {
        let r = self.client.start_vm(pb::StartVmRequest { id: id.into() }).await?;
        Ok(r.into_inner().vm.expect("vm in response"))
    }

    async fn stop(&mut self, id: &str) -> Result<pb::Vm, tonic::Status> {
        let r = self.client.stop_vm(pb::StopVmRequest { id: id.into(), grace_ms: 0 }).await?;
        Ok(r.into_inner().vm.expect("vm in response"))
    }

    async fn delete(&mut self, id: &str) -> Result<(), tonic::Status> {
        self.client.delete_vm(pb::DeleteVmRequest { id: id.into() }).await.map(|_| ())
    }

    async fn get(&mut self, id: &str) -> Result<pb::Vm, tonic::Status> {
        let r = self.client.get_vm(pb::GetVmRequest { id: id.into() }).await?;
        Ok(r.into_inner().vm.expect("vm in response"))
    }

    /// Creates and starts a VM (network NONE unless `tweak` changes it).
    async fn running(&mut self, name: &str, tweak: impl FnOnce(&mut pb::VmSpec)) -> String {
        let mut spec = self.spec(name);
        tweak(&mut spec);
        let id = spec.id.clone();
        self.create(spec).await.expect("create");
        let vm = self.start(&id).await.expect("start");
        assert_eq!(vm.state, pb::VmState::Running as i32);
        id
    }

    async fn caps(&mut self) -> Vec<String> {
        self.client.get_info(pb::GetInfoRequest {}).await.unwrap().into_inner().capabilities
    }

    /// The typed capabilities of the driver under test (the default driver
    /// when the run names none): what a test that needs a feature asks.
    async fn driver_caps(&mut self) -> pb::DriverCapabilities {
        let info = self.client.get_info(pb::GetInfoRequest {}).await.unwrap().into_inner();
        let wanted = driver_under_test();
        let d = info
            .drivers
            .iter()
            .find(|d| if wanted.is_empty() { d.is_default } else { d.name == wanted })
            .unwrap_or_else(|| panic!("GetInfo lists no driver {wanted:?}: {:?}", info.drivers));
        d.capabilities.clone().unwrap_or_default()
    }

    /// Whether the driver under test puts its VMs in cgroups.
    async fn has_cgroups(&mut self) -> bool {
        !self.driver_caps().await.cgroups.is_empty()
    }

    /// Whether the driver under test has EGRESS networking under the helper's
    /// policy.
    async fn has_egress(&mut self) -> bool {
        self.driver_caps().await.network_egress
    }

    /// Opens an Exec stream; returns the request sender and the responses.
    async fn open(
        &mut self,
        start: pb::ProcessSpec,
    ) -> Result<(mpsc::Sender<pb::ExecRequest>, Streaming<pb::ExecResponse>), tonic::Status> {
        let (tx, rx) = mpsc::channel(64);
        tx.send(req(pb::exec_request::Msg::Start(start))).await.unwrap();
        let resp = self.client.exec(ReceiverStream::new(rx)).await?;
        Ok((tx, resp.into_inner()))
    }

    /// Runs argv to completion with the given stdin (then close_stdin).
    async fn run(&mut self, start: pb::ProcessSpec, stdin: &[u8]) -> Result<Output, tonic::Status> {
        let (tx, mut out) = self.open(start).await?;
        if !stdin.is_empty() {
            for chunk in stdin.chunks(256 * 1024) {
                // A process that exits early ends the call; later sends fail.
                let _ = tx.send(req(pb::exec_request::Msg::Stdin(chunk.to_vec()))).await;
            }
        }
        let _ = tx.send(req(pb::exec_request::Msg::CloseStdin(pb::CloseStdin {}))).await;
        collect(&mut out).await
    }

    async fn sh(&mut self, id: &str, script: &str) -> Output {
        self.run(process(id, &["sh", "-c", script]), b"").await.expect("exec")
    }
}

/// Whether the helpers this suite starts serve through the swift-bridge
/// ABI (`SANDBOX_MCP_CONFORMANCE_BRIDGE=1`: `serve --through-bridge`, the
/// Linux double of the Swift VM layer).
fn through_bridge() -> bool {
    std::env::var("SANDBOX_MCP_CONFORMANCE_BRIDGE").is_ok_and(|v| v == "1")
}

/// The driver the tests' VMs name (`SANDBOX_MCP_CONFORMANCE_DRIVER`); empty:
/// the helper's default.
fn driver_under_test() -> String {
    std::env::var("SANDBOX_MCP_CONFORMANCE_DRIVER").unwrap_or_default()
}

/// Whether the VMs run on the namespace driver (the helper's default), for
/// the tests of its own machinery (host-side overlay dirs, warm launchers):
/// other drivers skip them, saying so.
fn on_namespaces() -> bool {
    matches!(driver_under_test().as_str(), "" | "namespaces")
}

fn req(msg: pb::exec_request::Msg) -> pb::ExecRequest {
    pb::ExecRequest { msg: Some(msg) }
}

fn process(id: &str, argv: &[&str]) -> pb::ProcessSpec {
    pb::ProcessSpec { vm_id: id.into(), argv: argv.iter().map(|s| s.to_string()).collect(), ..Default::default() }
}

#[derive(Debug, Default)]
struct Output {
    pid: i32,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    status: Option<pb::exited::Status>,
}

impl Output {
    fn out(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
    fn err(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
    fn code(&self) -> Option<i32> {
        match self.status {
            Some(pb::exited::Status::Code(c)) => Some(c),
            _ => None,
        }
    }
}

async fn collect(out: &mut Streaming<pb::ExecResponse>) -> Result<Output, tonic::Status> {
    let mut o = Output::default();
    let mut first = true;
    while let Some(msg) = out.next().await {
        match msg?.msg {
            Some(pb::exec_response::Msg::Started(s)) => {
                assert!(first, "started must come first");
                o.pid = s.pid;
            }
            Some(pb::exec_response::Msg::Stdout(b)) => o.stdout.extend(b),
            Some(pb::exec_response::Msg::Stderr(b)) => o.stderr.extend(b),
            Some(pb::exec_response::Msg::Exited(e)) => {
                assert!(o.status.is_none(), "exactly one exited");
                o.status = e.status;
            }
            None => {}
        }
        first = false;
    }
    assert!(o.status.is_some(), "stream ended without exited: {o:?}");
    Ok(o)
}

/// Waits (bounded) until `pid` is gone inside the VM.
async fn wait_gone(h: &mut Harness, id: &str, pid: &str) -> bool {
    let mut poll = Poll::every(Duration::from_millis(50));
    while poll.again().await {
        if h.sh(id, &format!("kill -0 {pid} 2>/dev/null")).await.code() != Some(0) {
            return true;
        }
    }
    false
}

// ------------------------------------------------------------------ tests

#[tokio::test]
async fn get_info_describes_the_helper() {
    let mut h = Harness::new("info").await;
    let info = h.client.get_info(pb::GetInfoRequest {}).await.unwrap().into_inner();
    assert!(!info.platform.is_empty() && !info.driver.is_empty() && !info.version.is_empty());
    assert!(info.capabilities.iter().any(|c| c == "exec"), "{:?}", info.capabilities);
    if h.helper.is_some() {
        assert_eq!((info.platform.as_str(), info.driver.as_str()), ("linux", "namespaces"));
        for cap in ["seccomp", "userns", "network.none"] {
            assert!(info.capabilities.iter().any(|c| c == cap), "missing {cap}: {:?}", info.capabilities);
        }
    }
    let images = h.client.list_images(pb::ListImagesRequest {}).await.unwrap().into_inner().images;
    let image = images.iter().find(|i| i.name == h.image).expect("test image listed");
    assert!(!image.shell.is_empty());
}

#[tokio::test]
async fn get_info_lists_every_driver_with_typed_capabilities() {
    let mut h = Harness::new("drivers").await;
    let info = h.client.get_info(pb::GetInfoRequest {}).await.unwrap().into_inner();
    let defaults: Vec<_> = info.drivers.iter().filter(|d| d.is_default).collect();
    assert_eq!(defaults.len(), 1, "exactly one default driver: {:?}", info.drivers);
    let default = defaults[0];
    assert_eq!(default.name, info.driver, "the default driver is the one `driver` names");
    for d in &info.drivers {
        assert_eq!(d.usable, d.unavailable_reason.is_empty(), "a reason exactly when unusable: {d:?}");
        assert!(d.capabilities.is_some(), "{d:?}");
    }
    // The flat names agree with the default driver's typed capabilities.
    let caps = default.capabilities.clone().unwrap();
    let named = |n: &str| info.capabilities.iter().any(|c| c == n);
    assert_eq!(caps.tty, named("exec.tty"), "{info:?}");
    assert_eq!(caps.network_egress, named("network.egress"), "{info:?}");
    assert_eq!(caps.seccomp, named("seccomp"), "{info:?}");
    assert_eq!(caps.limits, info.capabilities.iter().any(|c| c.starts_with("cgroups.")), "{info:?}");
    if h.helper.is_some() {
        assert_eq!(default.name, "namespaces");
        assert!(default.usable && caps.dial && caps.snapshot && !caps.own_kernel, "{default:?}");
    }
}

#[tokio::test]
async fn a_vm_runs_on_the_driver_it_names() {
    let mut h = Harness::new("drv").await;
    let info = h.client.get_info(pb::GetInfoRequest {}).await.unwrap().into_inner();
    let mut plain = h.spec("plain");
    plain.driver = String::new();
    let vm = h.create(plain).await.unwrap();
    assert_eq!(vm.spec.unwrap().driver, info.driver, "an empty driver is the default one");
    let err = {
        let mut spec = h.spec("odd");
        spec.driver = "gvisor".into();
        h.create(spec).await.unwrap_err()
    };
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    for d in &info.drivers {
        assert!(err.message().contains(&d.name), "the error lists the drivers: {}", err.message());
    }
    for d in info.drivers.iter().filter(|d| !d.is_default) {
        let mut spec = h.spec(&format!("on-{}", d.name));
        spec.driver = d.name.clone();
        let id = spec.id.clone();
        match h.create(spec).await {
            Ok(vm) => {
                assert!(d.usable, "{d:?}");
                assert_eq!(vm.spec.unwrap().driver, d.name);
                assert_eq!(h.get(&id).await.unwrap().spec.unwrap().driver, d.name, "GetVm reports the driver");
                h.delete(&id).await.unwrap();
            }
            Err(e) => {
                assert!(!d.usable, "{d:?}: {e:?}");
                assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
                let want = format!("the {} driver is not usable here: {}", d.name, d.unavailable_reason);
                assert_eq!(e.message(), want);
            }
        }
    }
}

#[tokio::test]
async fn lifecycle_create_start_stop_restart_delete() {
    let mut h = Harness::new("life").await;
    let mut spec = h.spec("vm");
    spec.labels = HashMap::from([("owner".into(), "test".into())]);
    let id = spec.id.clone();
    let vm = h.create(spec).await.unwrap();
    assert_eq!(vm.state, pb::VmState::Created as i32);
    assert_eq!(vm.started_at_ms, 0);
    let s = vm.spec.unwrap();
    assert_eq!((s.cpus, s.memory_bytes, s.pids_limit), (1, 512 << 20, 1024), "defaults");
    assert_eq!(s.hostname, id);
    assert_eq!(s.labels.get("owner").map(String::as_str), Some("test"));
    assert!(
        h.client.list_vms(pb::ListVmsRequest {}).await.unwrap().into_inner().vms.iter().any(|v| v
            .spec
            .as_ref()
            .unwrap()
            .id
            == id)
    );

    let err = h.create(h.spec("vm")).await.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists);
    assert_eq!(h.stop(&id).await.unwrap_err().code(), Code::FailedPrecondition);
    let exec_err = h.run(process(&id, &["true"]), b"").await.unwrap_err();
    assert_eq!(exec_err.code(), Code::FailedPrecondition);

    let vm = h.start(&id).await.unwrap();
    assert_eq!(vm.state, pb::VmState::Running as i32);
    assert!(vm.started_at_ms > 0);
    assert_eq!(h.start(&id).await.unwrap_err().code(), Code::FailedPrecondition);
    // Exec works as soon as StartVm returned.
    assert_eq!(h.sh(&id, "echo kept > /root/state").await.code(), Some(0));

    let vm = h.stop(&id).await.unwrap();
    assert_eq!(vm.state, pb::VmState::Stopped as i32);
    assert!(vm.stop_reason.is_empty(), "requested stop has no reason: {}", vm.stop_reason);
    assert_eq!(h.get(&id).await.unwrap().state, pb::VmState::Stopped as i32);
    assert_eq!(h.stop(&id).await.unwrap_err().code(), Code::FailedPrecondition);

    h.start(&id).await.unwrap();
    assert_eq!(h.sh(&id, "cat /root/state").await.out(), "kept\n", "writable layer survives a stop");

    h.delete(&id).await.unwrap();
    assert_eq!(h.get(&id).await.unwrap_err().code(), Code::NotFound);
    assert_eq!(h.delete(&id).await.unwrap_err().code(), Code::NotFound);
}

#[tokio::test]
async fn a_delete_completes_when_its_client_goes_away() {
    let mut h = Harness::new("gone").await;
    let id = h.running("vm", |_| {}).await;
    // A writable layer of many files keeps the delete busy for a while, so
    // the client usually hangs up halfway through it.
    assert_eq!(h.sh(&id, "mkdir /many && cd /many && seq 1 20000 | xargs touch").await.code(), Some(0));
    let mut client = h.client.clone();
    let delete = client.delete_vm(pb::DeleteVmRequest { id: id.clone() });
    let _ = tokio::time::timeout(Duration::from_millis(20), delete).await;
    let mut gone = false;
    let mut poll = Poll::every(Duration::from_millis(50));
    while !gone && poll.again().await {
        gone = h.get(&id).await.is_err_and(|e| e.code() == Code::NotFound);
    }
    assert!(gone, "the VM of an abandoned DeleteVm is still registered");
}

#[tokio::test]
async fn unknown_vms_and_images_are_not_found() {
    let mut h = Harness::new("nf").await;
    let id = h.id("ghost");
    assert_eq!(h.start(&id).await.unwrap_err().code(), Code::NotFound);
    assert_eq!(h.stop(&id).await.unwrap_err().code(), Code::NotFound);
    assert_eq!(h.get(&id).await.unwrap_err().code(), Code::NotFound);
    assert_eq!(h.delete(&id).await.unwrap_err().code(), Code::NotFound);
    assert_eq!(h.run(process(&id, &["true"]), b"").await.unwrap_err().code(), Code::NotFound);
    let mut spec = h.spec("img");
    spec.image = "no-such-image".into();
    assert_eq!(h.create(spec).await.unwrap_err().code(), Code::NotFound);
}

#[tokio::test]
async fn malformed_specs_are_invalid_arguments() {
    let mut h = Harness::new("inval").await;
    let missing = h.tmp.0.join("missing");
    let file = h.tmp.0.join("file");
    std::fs::write(&file, "x").unwrap();
    type Tweak = Box<dyn Fn(&mut pb::VmSpec)>;
    let cases: Vec<(&str, Tweak)> = vec![
        ("id", Box::new(|s| s.id = "-bad/id".into())),
        ("id", Box::new(|s| s.id = String::new())),
        ("host_path", Box::new(|s| s.mounts = vec![mount("relative/dir", "/w")])),
        ("host_path", Box::new(move |s| s.mounts = vec![mount(missing.to_str().unwrap(), "/w")])),
        ("host_path", Box::new(move |s| s.mounts = vec![mount(file.to_str().unwrap(), "/w")])),
        ("guest_path", Box::new(|s| s.mounts = vec![mount("/tmp", "relative")])),
        ("network", Box::new(|s| s.network = 99)),
        ("spec.driver", Box::new(|s| s.driver = "gvisor".into())),
    ];
    for (field, tweak) in cases {
        let mut spec = h.spec("bad");
        tweak(&mut spec);
        let err = h.create(spec).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{field}: {err:?}");
        assert!(err.message().contains(field), "message names {field}: {}", err.message());
    }
    assert_eq!(h.client.create_vm(pb::CreateVmRequest { spec: None }).await.unwrap_err().code(), Code::InvalidArgument);
}

fn mount(host: &str, guest: &str) -> pb::Mount {
    pb::Mount { host_path: host.into(), guest_path: guest.into(), read_only: false }
}

#[tokio::test]
async fn exec_reports_output_and_exit_status_exactly() {
    let mut h = Harness::new("exec").await;
    let id = h.running("vm", |_| {}).await;
    let o = h.run(process(&id, &["echo", "hi"]), b"").await.unwrap();
    assert_eq!((o.out(), o.code()), ("hi\n".to_string(), Some(0)));
    assert!(o.pid > 0);
    let o = h.sh(&id, "echo out; echo err >&2; exit 3").await;
    assert_eq!((o.out(), o.err(), o.code()), ("out\n".into(), "err\n".into(), Some(3)));
    let o = h.sh(&id, "kill -9 $$").await;
    assert_eq!(o.status, Some(pb::exited::Status::Signal(9)));
    let o = h.run(process(&id, &["cat"]), b"").await.unwrap();
    assert_eq!((o.stdout.len(), o.code()), (0, Some(0)), "no stdin given reads EOF at once");

    let err = h.run(process(&id, &[]), b"").await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let err = h.run(process(&id, &["/no/such/program"]), b"").await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
}

#[tokio::test]
async fn exec_is_binary_safe_both_ways() {
    let mut h = Harness::new("bin").await;
    let id = h.running("vm", |_| {}).await;
    let all: Vec<u8> = (0..=255u8).cycle().take(256 * 40).collect();
    let o = h.run(process(&id, &["cat"]), &all).await.unwrap();
    assert_eq!(o.stdout, all, "all 256 byte values round trip");

    let stdin = b"line one\nline two without newline".to_vec();
    let o = h.run(process(&id, &["cat"]), &stdin).await.unwrap();
    assert_eq!(o.stdout, stdin);

    let o = h.sh(&id, "head -c 1000000 /dev/zero | tr '\\0' a; echo").await;
    assert_eq!(o.stdout.len(), 1_000_001);
    assert!(o.stdout[..1_000_000].iter().all(|&b| b == b'a'));
}

#[tokio::test]
async fn exec_applies_cwd_and_env() {
    let mut h = Harness::new("env").await;
    let id = h.running("vm", |s| s.env = HashMap::from([("A".into(), "vm".into()), ("B".into(), "vm".into())])).await;
    let mut p = process(&id, &["sh", "-c", "echo $A $B $C $HOME; pwd"]);
    p.env = HashMap::from([("B".into(), "proc".into()), ("C".into(), "c".into())]);
    let o = h.run(p, b"").await.unwrap();
    assert_eq!(o.out(), "vm proc c /root\n/\n");

    let mut p = process(&id, &["pwd"]);
    p.cwd = "/tmp/new/deep".into();
    let err = h.run(p.clone(), b"").await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("/tmp/new/deep"), "{}", err.message());
    p.create_cwd = true;
    assert_eq!(h.run(p, b"").await.unwrap().out(), "/tmp/new/deep\n");
}

#[tokio::test]
async fn a_secret_is_readable_once_on_its_descriptor_and_nowhere_else() {
    let mut h = Harness::new("secret").await;
    let id = h.running("vm", |_| {}).await;
    // Read on fd 3 by a child of the process (inherited), once; never in
    // the environment or argv of the process.
    let script = "grep -c 's3cr3t-va[l]ue' /proc/$$/environ /proc/$$/cmdline; sh -c 'cat <&3'; echo; cat <&3; echo end";
    let mut p = process(&id, &["sh", "-c", script]);
    p.secret = b"s3cr3t-value".to_vec();
    let o = h.run(p.clone(), b"").await.unwrap();
    assert_eq!(
        o.out(),
        "/proc/1/environ:0\n/proc/1/cmdline:0\ns3cr3t-value\nend\n".replace("/proc/1", &format!("/proc/{}", o.pid)),
        "{}",
        o.err()
    );
    // Another descriptor number; none without a secret.
    p.argv = vec!["sh".into(), "-c".into(), "cat <&7".into()];
    p.secret_fd = 7;
    assert_eq!(h.run(p.clone(), b"").await.unwrap().out(), "s3cr3t-value");
    p.secret = Vec::new();
    assert_ne!(h.run(p.clone(), b"").await.unwrap().code(), Some(0));
    // Bounds: the descriptor number and the size.
    p.secret = b"x".to_vec();
    p.secret_fd = 2;
    assert_eq!(h.run(p.clone(), b"").await.unwrap_err().code(), Code::InvalidArgument);
    p.secret_fd = 0;
    p.secret = vec![b'x'; 4097];
    assert_eq!(h.run(p, b"").await.unwrap_err().code(), Code::InvalidArgument);
}

#[tokio::test]
async fn exec_stdin_streams_interactively() {
    let mut h = Harness::new("stdin").await;
    let id = h.running("vm", |_| {}).await;
    let (tx, mut out) = h.open(process(&id, &["cat"])).await.unwrap();
    assert!(matches!(out.next().await.unwrap().unwrap().msg, Some(pb::exec_response::Msg::Started(_))));
    for word in ["ping\n", "pong\n"] {
        tx.send(req(pb::exec_request::Msg::Stdin(word.as_bytes().to_vec()))).await.unwrap();
        match out.next().await.unwrap().unwrap().msg {
            Some(pb::exec_response::Msg::Stdout(b)) => assert_eq!(b, word.as_bytes()),
            other => panic!("expected echo, got {other:?}"),
        }
    }
    tx.send(req(pb::exec_request::Msg::CloseStdin(pb::CloseStdin {}))).await.unwrap();
    let rest = collect(&mut out).await.unwrap();
    assert_eq!(rest.code(), Some(0));
}

#[tokio::test]
async fn signals_reach_the_process_group() {
    let mut h = Harness::new("sig").await;
    let id = h.running("vm", |_| {}).await;
    let (tx, mut out) = h.open(process(&id, &["sh", "-c", "sleep 1000 & echo $!; wait"])).await.unwrap();
    let mut bg = String::new();
    while !bg.ends_with('\n') {
        if let Some(pb::exec_response::Msg::Stdout(b)) = out.next().await.unwrap().unwrap().msg {
            bg.push_str(&String::from_utf8_lossy(&b));
        }
    }
    let bg = bg.trim().to_string();
    tx.send(req(pb::exec_request::Msg::Signal(pb::Signal { signal: 15, process_group: true }))).await.unwrap();
    let o = collect(&mut out).await.unwrap();
    assert_eq!(o.status, Some(pb::exited::Status::Signal(15)));
    assert!(wait_gone(&mut h, &id, &bg).await, "background sleep {bg} survived a group signal");

    let (tx, mut out) = h.open(process(&id, &["sleep", "1000"])).await.unwrap();
    assert!(matches!(out.next().await.unwrap().unwrap().msg, Some(pb::exec_response::Msg::Started(_))));
    tx.send(req(pb::exec_request::Msg::Signal(pb::Signal { signal: 2, process_group: false }))).await.unwrap();
    assert_eq!(collect(&mut out).await.unwrap().status, Some(pb::exited::Status::Signal(2)));
}

#[tokio::test]
async fn client_disconnect_kills_the_process() {
    let mut h = Harness::new("disc").await;
    let id = h.running("vm", |_| {}).await;
    let (tx, mut out) = h.open(process(&id, &["sh", "-c", "echo ready; exec sleep 1000"])).await.unwrap();
    let mut pid = 0;
    loop {
        match out.next().await.unwrap().unwrap().msg {
            Some(pb::exec_response::Msg::Started(s)) => pid = s.pid,
            Some(pb::exec_response::Msg::Stdout(_)) => break,
            _ => {}
        }
    }
    drop(tx);
    drop(out);
    assert!(wait_gone(&mut h, &id, &pid.to_string()).await, "process {pid} survived its client");
}

#[tokio::test]
async fn background_processes_survive_a_finished_exec() {
    let mut h = Harness::new("bg").await;
    let id = h.running("vm", |_| {}).await;
    let o = h.sh(&id, "sleep 1000 >/dev/null 2>&1 & echo $!").await;
    assert_eq!(o.code(), Some(0));
    let pid = o.out().trim().to_string();
    assert_eq!(h.sh(&id, &format!("kill -0 {pid}")).await.code(), Some(0), "detached child still runs");
}

#[tokio::test]
async fn workspace_mount_is_shared_and_owned_by_the_mapped_root() {
    let mut h = Harness::new("ws").await;
    let ws = h.tmp.0.join("workspace");
    std::fs::create_dir(&ws).unwrap();
    std::fs::write(ws.join("from-host"), "host\n").unwrap();
    let ws_str = ws.to_str().unwrap().to_string();
    let id = h.running("vm", |s| s.mounts = vec![mount(&ws_str, "/workspace")]).await;
    let o = h.sh(&id, "cat /workspace/from-host && echo guest > /workspace/from-guest && id -u").await;
    assert_eq!((o.out(), o.code()), ("host\n0\n".to_string(), Some(0)), "{}", o.err());
    let created = ws.join("from-guest");
    assert_eq!(std::fs::read_to_string(&created).unwrap(), "guest\n");
    let owner = std::fs::metadata(&created).unwrap().uid();
    if let Some(root) = h.host_root {
        assert_eq!(owner, root, "root inside is the image's mapped root outside");
    }
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if me != 0 {
        assert_eq!(owner, me, "an ordinary user's sandbox writes /workspace files as that user");
        std::fs::remove_file(&created).expect("the user deletes what its sandbox's root wrote");
        return;
    }
    assert_ne!(owner, 0, "root inside must not be root on the host");
    // root's sandboxes never use a user's subordinate ids.
    let subuid = std::fs::read_to_string("/etc/subuid").unwrap_or_default();
    for line in subuid.lines() {
        let f: Vec<&str> = line.split(':').collect();
        if let [user, start, count] = f[..]
            && let (Ok(start), Ok(count)) = (start.parse::<u64>(), count.parse::<u64>())
            && user != "root"
            && user != "0"
        {
            let owner = u64::from(owner);
            assert!(!(start..start + count).contains(&owner), "root's sandbox uses {owner}, in {user}'s range {line}");
        }
    }
}

/// Files the VM's other ids keep private (apt's `_apt`, a service user)
/// are the helper's to remove with the VM: for an ordinary user's helper
/// they belong to subordinate ids the user cannot touch outside the VM's
/// user namespace.
#[tokio::test]
async fn delete_removes_files_of_every_id_in_the_vm() {
    let mut h = Harness::new("delids").await;
    let id = h.running("vm", |_| {}).await;
    let o = h
        .sh(
            &id,
            "mkdir -p /var/tmp/p/q && echo x > /var/tmp/p/q/f && chown -R 42:42 /var/tmp/p && chmod -R go= /var/tmp/p",
        )
        .await;
    assert_eq!(o.code(), Some(0), "{}", o.err());
    // The VM dir is under the state dir of a helper this test started; an
    // external helper's is its own (the delete must still succeed).
    let dir = h.helper.is_some().then(|| h.tmp.0.join("state/sandbox-mcp/vms").join(&id));
    // Namespaces keep the writable layer as a host dir; a vm keeps it in a
    // disk file in the same VM dir.
    if let Some(dir) = &dir {
        assert!(if on_namespaces() { dir.join("upper/var/tmp/p").exists() } else { dir.exists() });
    }
    h.delete(&id).await.expect("delete a vm holding files of another id");
    if let Some(dir) = &dir {
        assert!(!dir.exists(), "the vm's directory is gone");
    }
}

#[tokio::test]
async fn hostname_and_network_none() {
    let mut h = Harness::new("net").await;
    let id = h.running("vm", |s| s.hostname = "box1".into()).await;
    assert_eq!(h.sh(&id, "hostname").await.out(), "box1\n");
    let dev = h.sh(&id, "cat /proc/net/dev").await.out();
    assert!(dev.contains("lo:") && !dev.contains("eth0"), "{dev}");
    let other = h.running("dflt", |_| {}).await;
    assert_eq!(h.sh(&other, "hostname").await.out(), format!("{other}\n"));
}

#[tokio::test]
async fn network_egress_has_an_interface() {
    let mut h = Harness::new("egress").await;
    if !h.has_egress().await {
        eprintln!("skipped: the driver under test lacks network.egress");
        return;
    }
    let id = h.running("vm", |s| s.network = pb::NetworkMode::Egress as i32).await;
    let dev = h.sh(&id, "cat /proc/net/dev").await.out();
    assert!(dev.lines().skip(2).any(|l| !l.trim_start().starts_with("lo:")), "an interface besides lo: {dev}");
    if h.has_egress().await {
        assert!(dev.contains("eth0:"), "{dev}");
        let conf = h.sh(&id, "cat /etc/resolv.conf").await.out();
        assert_eq!(conf, "nameserver 10.0.2.3\n", "the helper's stack answers dns");
    }
}

#[tokio::test]
async fn memory_limit_is_enforced() {
    let mut h = Harness::new("mem").await;
    if !h.has_cgroups().await {
        eprintln!("skipped: the driver under test has no cgroups");
        return;
    }
    let id = h.running("vm", |s| s.memory_bytes = 64 << 20).await;
    let o = h.run(process(&id, &["python3", "-c", "x = b'a' * (300 << 20); print(len(x))"]), b"").await.unwrap();
    // A cgroup OOM-kills it; a guest kernel whose whole RAM is the limit
    // may refuse the allocation outright instead.
    let refused = o.code() == Some(1) && o.err().contains("MemoryError");
    assert!(o.status == Some(pb::exited::Status::Signal(9)) || refused, "allocation past the limit fails: {o:?}");
    assert_eq!(h.sh(&id, "echo alive").await.out(), "alive\n", "the vm survives");
}

#[tokio::test]
async fn pids_limit_is_enforced() {
    let mut h = Harness::new("pids").await;
    if !h.has_cgroups().await {
        eprintln!("skipped: the driver under test has no cgroups");
        return;
    }
    let id = h.running("vm", |s| s.pids_limit = 16).await;
    let o = h.sh(&id, "i=0; while [ $i -lt 40 ]; do sleep 30 & i=$((i+1)); done; echo done").await;
    assert!(o.err().to_lowercase().contains("fork"), "forks beyond the limit fail: {o:?}");
}

#[tokio::test]
async fn sandbox_is_locked_down() {
    let mut h = Harness::new("lock").await;
    if !h.driver_caps().await.seccomp {
        // Root of a guest owns its kernel (unshare, mount): the VM is the
        // boundary there (tests/test_security_vm.py).
        eprintln!("skipped: the driver under test has no seccomp lockdown");
        return;
    }
    let id = h.running("vm", |_| {}).await;
    let o = h.sh(&id, "grep NoNewPrivs /proc/self/status").await;
    assert_eq!(o.out().split_whitespace().collect::<Vec<_>>(), ["NoNewPrivs:", "1"]);
    let o = h.run(process(&id, &["unshare", "-U", "true"]), b"").await.unwrap();
    assert_ne!(o.code(), Some(0), "unshare must be refused: {o:?}");
    let o = h.sh(&id, "mount -t tmpfs none /mnt").await;
    assert_ne!(o.code(), Some(0), "mount must be refused: {o:?}");
    // Threads and plain forks still work (clone without namespace flags).
    assert_eq!(h.sh(&id, "(echo sub) | cat").await.out(), "sub\n");
    let o = h.sh(&id, "ls /proc | grep -c '^[0-9]'").await;
    let procs: u32 = o.out().trim().parse().unwrap();
    assert!(procs < 10, "only the sandbox's own processes are visible: {procs}");
}

#[tokio::test]
async fn tty_exec_runs_on_a_terminal() {
    let mut h = Harness::new("tty").await;
    let id = h.running("vm", |_| {}).await;
    let mut p = process(&id, &["sh", "-c", "tty; echo $TERM; stty size"]);
    p.tty = true;
    p.tty_cols = 100;
    p.tty_rows = 30;
    let o = h.run(p, b"").await.unwrap();
    let out = o.out();
    assert!(out.starts_with("/dev/pts/"), "{out:?}");
    assert!(out.contains("xterm-256color") && out.contains("30 100"), "{out:?}");
    assert!(o.stderr.is_empty());
}

#[tokio::test]
async fn stop_kills_processes_that_ignore_term_after_the_grace() {
    let mut h = Harness::new("grace").await;
    let id = h.running("vm", |_| {}).await;
    let o = h.sh(&id, "(trap '' TERM; exec sleep 1000) >/dev/null 2>&1 & echo started").await;
    assert_eq!(o.out(), "started\n");
    let r = h.client.stop_vm(pb::StopVmRequest { id: id.clone(), grace_ms: 100 }).await.unwrap().into_inner();
    assert_eq!(r.vm.unwrap().state, pb::VmState::Stopped as i32);
    h.start(&id).await.unwrap();
    assert_eq!(h.sh(&id, "echo back").await.out(), "back\n");
}

#[tokio::test]
async fn a_vm_whose_agent_dies_is_reported_stopped_with_a_reason() {
    let mut h = Harness::new("death").await;
    if h.helper.is_none() {
        eprintln!("skipped: kills the agent, only on a helper this test started");
        return;
    }
    let id = h.running("vm", |_| {}).await;
    // The agent spawns every process: the shell's parent is the agent, on
    // every driver (PID 2 under namespaces, a child of guest-init in a VM).
    let _ = h.run(process(&id, &["sh", "-c", "kill -9 $PPID"]), b"").await;
    let mut vm = h.get(&id).await.unwrap();
    let mut poll = Poll::every(Duration::from_millis(20));
    while vm.state != pb::VmState::Stopped as i32 && poll.again().await {
        vm = h.get(&id).await.unwrap();
    }
    assert_eq!(vm.state, pb::VmState::Stopped as i32);
    assert!(!vm.stop_reason.is_empty());
    assert_eq!(h.run(process(&id, &["true"]), b"").await.unwrap_err().code(), Code::FailedPrecondition);
    h.start(&id).await.unwrap();
    assert_eq!(h.sh(&id, "echo again").await.out(), "again\n");
}
