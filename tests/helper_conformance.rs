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
//! The core contract's tests are there too: a VM's lifecycle, exec, and
//! what a VM is confined to; this file holds the harness they share.
use std::collections::HashMap;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use sandbox_contract::v1 as pb;
use sandbox_contract::v1::vm_helper_client::VmHelperClient;
use tokio::sync::mpsc;
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Streaming};

#[path = "helper_conformance/background.rs"]
mod background;
#[path = "helper_conformance/confinement.rs"]
mod confinement;
#[path = "helper_conformance/copy.rs"]
mod copy;
#[path = "helper_conformance/dial.rs"]
mod dial;
#[path = "helper_conformance/exec.rs"]
mod exec;
#[path = "helper_conformance/images.rs"]
mod images;
#[path = "helper_conformance/lifecycle.rs"]
mod lifecycle;
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
        let _ = sandbox_userns::remove_tree(&self.0);
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

fn mount(host: &str, guest: &str) -> pb::Mount {
    pb::Mount { host_path: host.into(), guest_path: guest.into(), read_only: false }
}
