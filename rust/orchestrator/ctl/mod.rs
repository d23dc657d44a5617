//! The sandbox-ctl server: one Unix socket per parent allowed to use ctl, at
//! `$XDG_RUNTIME_DIR/sandbox-mcp/ctl/<parent>/ctl.sock`. The socket's
//! directory is mounted into the sandbox at `/run/sandbox-ctl`, so the
//! socket identifies the parent; no credentials are involved. The CLI is
//! copied in at creation. NDJSON, one request and one response per
//! connection (internals §15, [`sandbox_ctl::protocol`]).
//!
//! Connections: at most [`MAX_CONNECTIONS`] per parent are admitted at once;
//! each gets [`READ_TIMEOUT`] for its request line, but one still waiting for
//! its line after [`IDLE_EVICT`] is evicted (answered `Read timeout`) as soon
//! as another connection waits for a slot. So idle connections cannot block
//! a parent's API (the reference's slow-loris), while a slow but lone client
//! keeps the full timeout. Requests being handled are never evicted.
mod methods;

use std::{
    collections::HashMap,
    os::unix::fs::PermissionsExt,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{UnixListener, UnixStream},
    task::JoinSet,
};
use tokio_util::sync::CancellationToken;

pub use methods::MAX_TIMEOUT;

use super::{
    error::OrchestratorError,
    helper_client::ProcessConfig,
    sandbox::{HookFuture, Sandbox, SandboxListener},
    spawn::SpawnManager,
};
use sandbox_ctl::protocol::{
    ErrorCode, GUEST_BINARY, GUEST_SOCKET, GUEST_SOCKET_DIR, MAX_REQUEST_LINE, SOCKET_FILE, error_line, parse_request,
    result_line,
};

/// Connections admitted at once per parent.
pub const MAX_CONNECTIONS: usize = 8;
/// Time a connection has to send its request line.
pub const READ_TIMEOUT: Duration = Duration::from_secs(300);
/// After this, a connection still without its request line yields its slot
/// to a waiting one.
pub const IDLE_EVICT: Duration = Duration::from_secs(10);
/// Connections waiting for a slot beyond this are closed at once.
const MAX_WAITING: usize = 64;
/// How often a waiting connection looks for a free or evictable slot.
const ADMIT_POLL: Duration = Duration::from_millis(200);
/// Installing the CLI into a new sandbox.
const INSTALL_TIMEOUT: Duration = Duration::from_secs(60);

/// The host's sandbox-ctl binary: `SANDBOX_CTL_BIN`, else next to the
/// running executable.
pub fn host_binary() -> Option<PathBuf> {
    let path = match std::env::var_os("SANDBOX_CTL_BIN").filter(|v| !v.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => std::env::current_exe().ok()?.parent()?.join("sandbox-ctl"),
    };
    path.is_file().then_some(path)
}

/// Host directory holding a parent's socket (mounted into the sandbox).
pub fn socket_dir(parent: &str) -> PathBuf {
    sandbox_base::paths::runtime_dir().join("ctl").join(parent)
}

/// Per-parent listeners.
pub struct CtlServer {
    spawns: Arc<SpawnManager>,
    binary: Option<PathBuf>,
    /// Each parent's accept loop; aborting it drops its connections too.
    listeners: Mutex<HashMap<String, tokio::task::JoinHandle<()>>>,
}

impl CtlServer {
    /// A server for the policies `spawns` knows; warns once if the CLI
    /// binary is missing (sandboxes then start without ctl).
    pub fn new(spawns: Arc<SpawnManager>) -> Arc<Self> {
        let binary = host_binary();
        if binary.is_none() {
            tracing::warn!(
                "sandbox-ctl binary not found (SANDBOX_CTL_BIN or next to sandbox-mcp): sandboxes start without sandbox-ctl"
            );
        }
        Arc::new(Self { spawns, binary, listeners: Mutex::default() })
    }

    fn listeners(&self) -> std::sync::MutexGuard<'_, HashMap<String, tokio::task::JoinHandle<()>>> {
        self.listeners.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Start listeners for every existing sandbox that gets ctl: call once
    /// after an orchestrator restart has attached the running sandboxes
    /// (idempotent).
    pub fn reattach(self: &Arc<Self>) {
        if self.binary.is_none() {
            return;
        }
        for s in self.spawns.sandboxes().list() {
            if self.spawns.wants_ctl(&s.name, s.parent.as_deref())
                && let Err(e) = self.start(&s.name)
            {
                tracing::warn!(sandbox = %s.name, "could not start sandbox-ctl listener: {e}");
            }
        }
    }

    /// Whether `parent` has a listener.
    pub fn is_serving(&self, parent: &str) -> bool {
        self.listeners().contains_key(parent)
    }

    /// Listen on `parent`'s socket (a stale file is replaced); idempotent.
    pub fn start(self: &Arc<Self>, parent: &str) -> std::io::Result<PathBuf> {
        let dir = socket_dir(parent);
        let mut listeners = self.listeners();
        if listeners.get(parent).is_some_and(|h| !h.is_finished()) {
            return Ok(dir);
        }
        let top = sandbox_base::paths::runtime_dir().join("ctl");
        std::fs::create_dir_all(&top)?;
        std::fs::set_permissions(&top, std::fs::Permissions::from_mode(0o700))?;
        std::fs::create_dir_all(&dir)?;
        // The sandbox's root (a high host uid) must reach the socket through
        // the mounted directory; the 0700 directory above keeps host users out.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
        let path = dir.join(SOCKET_FILE);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let std_listener = std::os::unix::net::UnixListener::bind(&path)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))?;
        std_listener.set_nonblocking(true)?;
        let listener = UnixListener::from_std(std_listener)?;
        let conns = Arc::new(Slots::default());
        let (spawns, name) = (self.spawns.clone(), parent.to_string());
        let task = tokio::spawn(accept_loop(listener, spawns, name, conns));
        listeners.insert(parent.to_string(), task);
        tracing::info!(sandbox = %parent, "sandbox-ctl listening on {}", path.display());
        Ok(dir)
    }

    /// Stop `parent`'s listener and remove its socket directory.
    pub fn stop(&self, parent: &str) {
        if let Some(task) = self.listeners().remove(parent) {
            task.abort();
        }
        let dir = socket_dir(parent);
        if dir.exists()
            && let Err(e) = std::fs::remove_dir_all(&dir)
        {
            tracing::warn!(sandbox = %parent, "could not remove {}: {e}", dir.display());
        }
    }

    /// Copy the CLI into a sandbox and point the documented socket path at
    /// the mounted directory.
    async fn install(&self, sandbox: &Sandbox) -> Result<(), OrchestratorError> {
        let Some(binary) = &self.binary else { return Ok(()) };
        let io = |e: std::io::Error| OrchestratorError::InvalidArgument(format!("cannot install sandbox-ctl: {e}"));
        let data = std::fs::read(binary).map_err(io)?;
        let archive = super::tarstream::files_archive([(GUEST_BINARY, data.as_slice())], 0o755).map_err(io)?;
        let manager = self.spawns.sandboxes();
        manager.helper.copy_in_archive(&sandbox.name, "/", archive).await?;
        let link = format!("{GUEST_SOCKET_DIR}/{SOCKET_FILE}");
        let process = ProcessConfig {
            argv: vec!["ln".into(), "-sfn".into(), link, GUEST_SOCKET.into()],
            env: Default::default(),
            cwd: "/".into(),
            create_cwd: false,
            user: String::new(),
            secret: Vec::new(),
        };
        let r = super::exec::run(&manager.helper, &sandbox.name, process, &[], INSTALL_TIMEOUT).await?;
        if r.exit_code() != 0 {
            return Err(OrchestratorError::InvalidArgument(format!(
                "cannot link {GUEST_SOCKET}: {}",
                super::text::render(&r.stderr).trim_end()
            )));
        }
        Ok(())
    }
}

/// The [`SandboxListener`] side: mount the socket directory into sandboxes
/// that get ctl, install the CLI, stop the listener with the sandbox.
pub(super) struct FollowCtl(pub(super) Arc<CtlServer>);

impl SandboxListener for FollowCtl {
    fn destroyed(&self, name: &str) {
        self.0.stop(name);
    }

    fn mounts(&self, name: &str, parent: Option<&str>) -> Vec<(PathBuf, String, bool)> {
        if self.0.binary.is_none() || !self.0.spawns.wants_ctl(name, parent) {
            return Vec::new();
        }
        match self.0.start(name) {
            // Read-only: a writable mount would be handed to the sandbox's
            // root, which could then plant files and symlinks in a host
            // directory the server chmods paths in. Connecting needs no write.
            Ok(dir) => vec![(dir, GUEST_SOCKET_DIR.to_string(), true)],
            Err(e) => {
                tracing::warn!(sandbox = %name, "sandbox-ctl unavailable, could not listen: {e}");
                Vec::new()
            }
        }
    }

    fn created<'a>(&'a self, sandbox: &'a Arc<Sandbox>) -> HookFuture<'a> {
        Box::pin(async move { if self.0.is_serving(&sandbox.name) { self.0.install(sandbox).await } else { Ok(()) } })
    }
}

/// The admitted connections of one parent.
#[derive(Default)]
struct Slots {
    open: Mutex<Vec<Slot>>,
    waiting: std::sync::atomic::AtomicUsize,
}

struct Slot {
    id: u64,
    admitted: Instant,
    /// Still waiting for its request line (evictable after [`IDLE_EVICT`]).
    reading: bool,
    evict: CancellationToken,
}

impl Slots {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Slot>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wait for a free slot, evicting a connection idle past [`IDLE_EVICT`].
    async fn admit(&self, id: u64) -> CancellationToken {
        loop {
            {
                let mut open = self.lock();
                if open.len() >= MAX_CONNECTIONS
                    && let Some(i) = open.iter().position(|s| s.reading && s.admitted.elapsed() >= IDLE_EVICT)
                {
                    open.remove(i).evict.cancel();
                }
                if open.len() < MAX_CONNECTIONS {
                    let evict = CancellationToken::new();
                    open.push(Slot { id, admitted: Instant::now(), reading: true, evict: evict.clone() });
                    return evict;
                }
            }
            tokio::time::sleep(ADMIT_POLL).await;
        }
    }

    fn handling(&self, id: u64) {
        if let Some(s) = self.lock().iter_mut().find(|s| s.id == id) {
            s.reading = false;
        }
    }

    fn release(&self, id: u64) {
        self.lock().retain(|s| s.id != id);
    }
}

async fn accept_loop(listener: UnixListener, spawns: Arc<SpawnManager>, parent: String, slots: Arc<Slots>) {
    let mut conns = JoinSet::new();
    let mut next_id = 0u64;
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    next_id += 1;
                    conns.spawn(serve(stream, spawns.clone(), parent.clone(), slots.clone(), next_id));
                }
                Err(e) => {
                    tracing::warn!(sandbox = %parent, "sandbox-ctl accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            Some(_) = conns.join_next() => {}
        }
    }
}

/// How reading a request line ended.
enum Line {
    Complete(Vec<u8>),
    TooLong,
    Closed,
}

async fn read_line(stream: &mut UnixStream) -> std::io::Result<Line> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            // The reference answers a final line without newline too.
            return Ok(if buf.is_empty() { Line::Closed } else { Line::Complete(buf) });
        }
        let start = buf.len();
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf[start..].iter().position(|b| *b == b'\n') {
            buf.truncate(start + i);
            return Ok(if buf.len() > MAX_REQUEST_LINE { Line::TooLong } else { Line::Complete(buf) });
        }
        if buf.len() > MAX_REQUEST_LINE {
            return Ok(Line::TooLong);
        }
    }
}

async fn serve(mut stream: UnixStream, spawns: Arc<SpawnManager>, parent: String, slots: Arc<Slots>, id: u64) {
    use std::sync::atomic::Ordering;
    if slots.waiting.fetch_add(1, Ordering::SeqCst) >= MAX_WAITING {
        slots.waiting.fetch_sub(1, Ordering::SeqCst);
        return;
    }
    let evict = slots.admit(id).await;
    slots.waiting.fetch_sub(1, Ordering::SeqCst);
    let null = serde_json::Value::Null;
    let read = tokio::select! {
        r = tokio::time::timeout(READ_TIMEOUT, read_line(&mut stream)) => r.ok(),
        _ = evict.cancelled() => None,
    };
    slots.handling(id);
    let response = match read {
        None => Some(error_line(&null, ErrorCode::InvalidRequest, "Read timeout")),
        Some(Err(_)) | Some(Ok(Line::Closed)) => None,
        Some(Ok(Line::TooLong)) => Some(error_line(&null, ErrorCode::InvalidRequest, "Request too long")),
        Some(Ok(Line::Complete(line))) => Some(match parse_request(&line) {
            Err(bad) => error_line(&bad.id, ErrorCode::InvalidRequest, &bad.message),
            Ok(req) => match methods::call(&spawns, &parent, &req.method, &req.params).await {
                Ok(result) => result_line(&req.id, result),
                Err((code, message)) => error_line(&req.id, code, &message),
            },
        }),
    };
    if let Some(response) = response
        && stream.write_all(response.as_bytes()).await.is_ok()
    {
        let _ = stream.shutdown().await;
        // Read what the client still sends (the rest of an oversize
        // line) so closing does not reset the connection under its reply.
        let mut sink = [0u8; 8192];
        let drain = async { while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {} };
        let _ = tokio::time::timeout(Duration::from_secs(2), drain).await;
    }
    slots.release(id);
}
