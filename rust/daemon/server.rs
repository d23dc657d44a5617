//! The daemon: one [`Orchestrator`], many sessions. Each connection on the
//! socket is one front-end: a stdio session runs one rmcp session over the
//! connection's byte stream under that session's configuration; an HTTP
//! front-end gets a TCP listener for as long as it stays connected.
//!
//! The daemon exits on SIGTERM/SIGINT, after a drain request from a newer
//! front-end, or once it has had no connection and no sandbox for
//! `SANDBOX_MCP_DAEMON_IDLE` seconds (default 30): nothing is left for it to
//! keep. State is saved on the way out; the sandboxes stay in the helper and
//! the next daemon re-attaches them. A connection is counted from the moment
//! it is accepted, so an idle exit never cuts a handshake short; one that
//! reaches a daemon going away (still queued on the socket, or during a
//! drain) gets no answer, and its front-end reaches the next daemon.
use std::{
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use tokio::{io::BufReader, net::UnixStream};
use tokio_util::sync::CancellationToken;

use super::{
    DaemonError,
    hello::{self, Hello, Mode, Reply},
    socket,
};
use sandbox_base::paths;
use sandbox_mcp_tools::{SandboxServer, http};
use sandbox_orchestrator::{
    Config, Orchestrator, SandboxManager, helper_client::HelperClient, state, watchdog::Respawn,
};

/// How long a connection may take to send its handshake.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Default seconds without sessions or sandboxes before the daemon exits.
const DEFAULT_IDLE_SECS: u64 = 30;
/// How long a drain waits for the sessions to close before exiting anyway.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// Open connections (handshakes, stdio sessions, HTTP listeners), and
/// since when there have been none.
#[derive(Default)]
struct Sessions {
    open: AtomicUsize,
    idle_since: Mutex<Option<Instant>>,
}

/// Counts one open connection until dropped.
struct SessionGuard(Arc<Sessions>);

impl Sessions {
    fn enter(self: &Arc<Self>) -> SessionGuard {
        self.open.fetch_add(1, Ordering::SeqCst);
        SessionGuard(self.clone())
    }

    fn idle_for(&self) -> Option<Duration> {
        if self.open.load(Ordering::SeqCst) > 0 {
            return None;
        }
        let mut since = self.idle_since.lock().unwrap_or_else(|p| p.into_inner());
        Some(since.get_or_insert_with(Instant::now).elapsed())
    }
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        *self.0.idle_since.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What every connection handler shares.
struct Daemon {
    orchestrator: Arc<Orchestrator>,
    sessions: Arc<Sessions>,
    /// Cancelled to stop the daemon (signal, drain).
    shutdown: CancellationToken,
    /// Cancelled to stop accepting (drain): open sessions may finish.
    draining: CancellationToken,
    build: hello::Build,
}

/// Runs the daemon until it is told to stop or has nothing left to keep.
pub async fn run(helper_bin: PathBuf) -> Result<(), DaemonError> {
    // Before anything is written there (the helper's log, sockets, state).
    paths::make_private_dirs();
    let _lock = socket::lock(&paths::daemon_lock(), false)?;
    let orchestrator = start_orchestrator(helper_bin).await?;
    let listener = socket::bind(&paths::daemon_socket())?;
    let _pid = socket::PidFile::write(&paths::daemon_pid_file())?;
    let daemon = Arc::new(Daemon {
        orchestrator,
        sessions: Arc::default(),
        shutdown: CancellationToken::new(),
        draining: CancellationToken::new(),
        build: hello::Build::current(),
    });
    tracing::info!(socket = %paths::daemon_socket().display(), build = %daemon.build, "daemon listening");
    tokio::spawn(stop_on_signal(daemon.shutdown.clone()));
    let idle = idle_limit();
    // The first check a second after start: the front-end that started this
    // daemon is connecting.
    let every = Duration::from_secs(1);
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    // Held from the end of a drain to exit: no call starts on a daemon that
    // is going away.
    let mut _no_more_calls = None;
    loop {
        tokio::select! {
            _ = daemon.shutdown.cancelled() => break,
            _ = daemon.draining.cancelled() => {
                _no_more_calls = drain(&daemon).await;
                break;
            }
            // One task decides both: a connection accepted is counted
            // before the next idle check.
            _ = tick.tick() => {
                if daemon.sessions.idle_for().is_some_and(|d| d >= idle) && daemon.orchestrator.sandboxes.list().is_empty() {
                    tracing::info!("no sessions and no sandboxes for {} s: exiting", idle.as_secs());
                    break;
                }
            }
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let counted = daemon.sessions.enter();
                    tokio::spawn(connection(daemon.clone(), stream, counted));
                }
                Err(e) => tracing::warn!("accept on the daemon socket: {e}"),
            },
        }
    }
    drop(listener);
    let _ = std::fs::remove_file(paths::daemon_socket());
    daemon.shutdown.cancel();
    daemon.orchestrator.sandboxes.close_state().await;
    tracing::info!("daemon stopped");
    Ok(())
}

/// The helper connection, the sandboxes it runs, and the state of the
/// previous daemon (or server) put back. The daemon's own configuration
/// comes from the environment it was started in; sessions bring their own.
async fn start_orchestrator(helper_bin: PathBuf) -> Result<Arc<Orchestrator>, DaemonError> {
    let failed = |e: &dyn std::fmt::Display| DaemonError::Orchestrator(e.to_string());
    let config = Config::load().map_err(|e| failed(&e))?;
    let respawn = Respawn { socket: paths::helper_socket(), binary: helper_bin };
    let helper = HelperClient::connect_or_spawn(&respawn.socket, &respawn.binary).await.map_err(|e| failed(&e))?;
    let manager = Arc::new(SandboxManager::start(helper, config).await.map_err(|e| failed(&e))?);
    let orchestrator = Arc::new(Orchestrator::new(manager));
    orchestrator.resume(state::path(), respawn).await;
    Ok(orchestrator)
}

fn idle_limit() -> Duration {
    let secs = std::env::var("SANDBOX_MCP_DAEMON_IDLE").ok().and_then(|v| v.trim().parse().ok());
    Duration::from_secs(secs.unwrap_or(DEFAULT_IDLE_SECS))
}

async fn stop_on_signal(shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        },
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
    tracing::info!("signal received: stopping");
    shutdown.cancel();
}

/// A newer front-end asked this daemon to make way: no new sessions, and
/// the tool calls in progress get until [`DRAIN_TIMEOUT`] to finish (later
/// calls wait) before the daemon saves its state and exits. The sandboxes stay
/// in the helper for the next daemon.
async fn drain(daemon: &Daemon) -> Option<tokio::sync::OwnedRwLockWriteGuard<()>> {
    tracing::info!(open = daemon.sessions.open.load(Ordering::SeqCst), "draining for a newer build");
    let calls = tokio::time::timeout(DRAIN_TIMEOUT, daemon.orchestrator.calls.clone().write_owned()).await;
    if calls.is_err() {
        tracing::warn!("calls still running after {} s of draining: exiting anyway", DRAIN_TIMEOUT.as_secs());
    }
    calls.ok()
}

/// One front-end connection, from handshake to close; it counts as open
/// until `_counted` is dropped with it.
async fn connection(daemon: Arc<Daemon>, stream: UnixStream, _counted: SessionGuard) {
    match socket::same_user(&stream) {
        Ok(true) => {}
        Ok(false) => {
            tracing::warn!(peer = ?stream.peer_cred().ok(), "refused a connection from another user");
            return;
        }
        Err(e) => {
            tracing::warn!("cannot identify the peer of a connection: {e}");
            return;
        }
    }
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    let hello: Hello = match tokio::time::timeout(HELLO_TIMEOUT, hello::receive(&mut read)).await {
        Ok(Ok(h)) => h,
        Ok(Err(e)) => {
            tracing::warn!("{e}");
            return;
        }
        Err(_) => {
            tracing::warn!("a connection sent no handshake within {} s", HELLO_TIMEOUT.as_secs());
            return;
        }
    };
    let reply = |error: Option<String>, http_addr| Reply { build: daemon.build.clone(), error, http_addr };
    if let Mode::Drain = hello.mode {
        let _ = hello::send(&mut write, &reply(None, None)).await;
        daemon.draining.cancel();
        return;
    }
    if daemon.draining.is_cancelled() {
        // No answer: the front-end waits for this daemon to go and starts
        // one of the newer build.
        tracing::info!("closed a connection that came in while draining");
        return;
    }
    let config = match Config::load_from(&hello.source) {
        Ok(c) => Arc::new(c),
        Err(e) => {
            let _ = hello::send(&mut write, &reply(Some(e.to_string()), None)).await;
            return;
        }
    };
    match hello.mode {
        Mode::Stdio => {
            if hello::send(&mut write, &reply(None, None)).await.is_err() {
                return;
            }
            let server = SandboxServer::new(&daemon.orchestrator, config);
            tokio::select! {
                served = server.serve_stream(read, write) => {
                    if let Err(e) = served {
                        tracing::debug!("stdio session ended: {e}");
                    }
                }
                _ = daemon.shutdown.cancelled() => {}
            }
        }
        Mode::Http(listen) => {
            let listener = match http::bind(&listen).await {
                Ok(l) => l,
                Err(e) => {
                    let _ = hello::send(&mut write, &reply(Some(e.to_string()), None)).await;
                    return;
                }
            };
            let local = listener.local_addr().ok();
            if hello::send(&mut write, &reply(None, local)).await.is_err() {
                return;
            }
            tracing::info!(addr = ?local, "serving MCP over HTTP for a front-end");
            let stop = daemon.shutdown.child_token();
            let served =
                tokio::spawn(http::serve_on(listener, daemon.orchestrator.clone(), config, listen, stop.clone()));
            // The listener lives as long as its front-end: EOF (or anything
            // else) on the connection ends it.
            let mut rest = Vec::new();
            tokio::select! {
                _ = tokio::io::AsyncReadExt::read_to_end(&mut read, &mut rest) => {}
                _ = stop.cancelled() => {}
            }
            stop.cancel();
            match served.await {
                Ok(Err(e)) => tracing::warn!("{e}"),
                Err(e) => tracing::warn!("HTTP listener task: {e}"),
                Ok(Ok(())) => {}
            }
            tracing::info!(addr = ?local, "HTTP listener closed");
            drop(write);
        }
        Mode::Drain => {}
    }
}
