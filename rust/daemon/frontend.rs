//! The front-end: what an MCP client starts (`sandbox-mcp`, `sandbox-mcp
//! serve`, `serve --http`). It finds the user's daemon, starting it when none
//! runs (under a lock, so concurrent front-ends start one), hands over the
//! session's context, and then stays out of the way: a stdio front-end
//! relays messages between its stdin/stdout and the daemon connection
//! ([`super::relay`]); an HTTP
//! front-end holds the connection open for as long as the listener should
//! live.
//!
//! A daemon that hangs up before answering the handshake was going away
//! (an idle exit or a drain caught it mid-connect): the front-end waits for
//! it to exit and reaches the next one, started anew if need be.
//!
//! If the daemon goes away mid-session, the stdio front-end moves the
//! session to a new daemon ([`super::relay`]), and an HTTP front-end has a
//! new daemon listen on the same address (its clients' sessions start over:
//! the spec's answer to an unknown session id).
use std::{
    fs::OpenOptions,
    os::unix::{fs::OpenOptionsExt, process::CommandExt},
    path::Path,
    process::{Child, Stdio},
    time::Duration,
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt, BufReader},
    net::{
        UnixStream,
        unix::{OwnedReadHalf, OwnedWriteHalf},
    },
};

use super::{
    DaemonError,
    hello::{self, Build, Hello, Mode, Reply},
    socket,
};
use sandbox_base::paths;
use sandbox_mcp_tools::http;
use sandbox_orchestrator::config::ConfigSource;

/// How long a new daemon gets to answer (it may first start the helper and
/// re-attach every sandbox).
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a front-end keeps reaching for a daemon while old ones go away:
/// a drain lets the calls in progress finish first (up to 30 s).
const REACH_TIMEOUT: Duration = Duration::from_secs(90);
/// How long an exiting daemon (its socket gone) gets to let go of its lock.
const EXIT_TIMEOUT: Duration = Duration::from_secs(10);
/// The pause between attempts to reach a daemon going away.
const RETRY_PAUSE: Duration = Duration::from_millis(20);

/// An open, handshaken connection to the daemon.
pub struct Connection {
    pub(super) read: BufReader<OwnedReadHalf>,
    pub(super) write: OwnedWriteHalf,
    /// The daemon's answer.
    pub reply: Reply,
}

/// Connects to the daemon for `mode`, starting it (the `daemon` subcommand of
/// this binary) if none answers. A daemon of an older build is asked to drain
/// and replaced by one of this build; a newer one serves an older front-end
/// as it is (the handshake and MCP do not change between builds).
pub async fn open(source: ConfigSource, mode: Mode) -> Result<Connection, DaemonError> {
    let build = Build::current();
    let deadline = tokio::time::Instant::now() + REACH_TIMEOUT;
    loop {
        let mut conn = match handshake(connect_or_start().await?, &build, &source, mode.clone()).await {
            Ok(conn) => conn,
            Err(e) if e.is_hangup() && tokio::time::Instant::now() < deadline => {
                tracing::debug!("the daemon hung up before answering ({e}): reaching the next one");
                tokio::time::sleep(RETRY_PAUSE).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        // Past the deadline an older daemon that does not go is used as it is.
        if build.is_newer_than(&conn.reply.build) && tokio::time::Instant::now() < deadline {
            tracing::info!(old = %conn.reply.build, new = %build, "replacing a daemon of an older build");
            drop(conn);
            drain().await?;
            continue;
        }
        if let Some(e) = conn.reply.error.take() {
            return Err(DaemonError::Refused(e));
        }
        return Ok(conn);
    }
}

async fn handshake(
    stream: UnixStream,
    build: &Build,
    source: &ConfigSource,
    mode: Mode,
) -> Result<Connection, DaemonError> {
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    let hello = Hello { build: build.clone(), source: source.clone(), mode };
    hello::send(&mut write, &hello).await?;
    let reply: Reply = hello::receive(&mut read).await?;
    Ok(Connection { read, write, reply })
}

/// Asks the running daemon to drain. It answers no connection from then
/// on, so reaching a daemon again waits for it to go and starts one of this
/// build.
async fn drain() -> Result<(), DaemonError> {
    let Ok(stream) = UnixStream::connect(paths::daemon_socket()).await else {
        // Its socket is gone already: it is on its way out.
        return Ok(());
    };
    let source = ConfigSource::default();
    match handshake(stream, &Build::current(), &source, Mode::Drain).await {
        // Another front-end asked first.
        Err(e) if e.is_hangup() => Ok(()),
        done => done.map(drop),
    }
}

/// Waits (up to [`EXIT_TIMEOUT`]) until no daemon holds the daemon lock: one
/// whose socket is gone may still be saving its state on the way out, and a
/// daemon started meanwhile would find the lock taken and give up. Called
/// under the start lock, so the lock is only probed while no daemon is
/// being started. A daemon that keeps it is left to the start to report.
async fn wait_for_exit() {
    let deadline = tokio::time::Instant::now() + EXIT_TIMEOUT;
    while tokio::time::Instant::now() < deadline {
        match socket::lock(&paths::daemon_lock(), false) {
            Err(DaemonError::AlreadyRunning(_)) => tokio::time::sleep(RETRY_PAUSE).await,
            _ => return,
        }
    }
}

/// A connection to the running daemon, or to one started now.
async fn connect_or_start() -> Result<UnixStream, DaemonError> {
    let path = paths::daemon_socket();
    if let Ok(s) = UnixStream::connect(&path).await {
        return Ok(s);
    }
    socket::private_dir(&paths::runtime_dir())?;
    // Front-ends starting together start one daemon: the rest wait here and
    // then find it answering.
    let start_lock = paths::daemon_start_lock();
    let _lock = tokio::task::spawn_blocking(move || socket::lock(&start_lock, true))
        .await
        .map_err(|e| DaemonError::Connection(std::io::Error::other(e)))??;
    if let Ok(s) = UnixStream::connect(&path).await {
        return Ok(s);
    }
    wait_for_exit().await;
    let log = paths::daemon_log_file();
    let start_failed = |reason: String| DaemonError::Start { reason, log: log.clone() };
    let spawn = || spawn_daemon(&log).map_err(|e| start_failed(format!("cannot run this binary: {e}")));
    let mut child = spawn()?;
    let deadline = tokio::time::Instant::now() + START_TIMEOUT;
    loop {
        match UnixStream::connect(&path).await {
            Ok(s) => {
                // Reap it whenever it exits; a daemon is never waited for.
                std::thread::spawn(move || child.wait());
                return Ok(s);
            }
            Err(e) => {
                match child.try_wait() {
                    // It went idle before this front-end got through (a
                    // loaded machine): start another.
                    Ok(Some(status)) if status.success() && tokio::time::Instant::now() < deadline => {
                        tracing::debug!("the daemon started for this session exited idle: starting another");
                        child = spawn()?;
                        continue;
                    }
                    Ok(Some(status)) => {
                        return Err(start_failed(format!("it exited ({status}): {}", log_tail(&log))));
                    }
                    _ => {}
                }
                if tokio::time::Instant::now() >= deadline {
                    return Err(start_failed(format!(
                        "no answer on {} within {:?} ({e})",
                        path.display(),
                        START_TIMEOUT
                    )));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// Starts `<this binary> daemon`, detached (its own session, so it outlives
/// the client killing our process group), logging to `log`.
fn spawn_daemon(log: &Path) -> std::io::Result<Child> {
    if let Some(dir) = log.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let out = OpenOptions::new().create(true).append(true).mode(0o600).open(log)?;
    let mut cmd = std::process::Command::new(installed_exe()?);
    cmd.arg("daemon").stdin(Stdio::null()).stdout(out.try_clone()?).stderr(out);
    // SAFETY: setsid is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| nix::unistd::setsid().map(|_| ()).map_err(std::io::Error::from));
    }
    cmd.spawn()
}

/// This binary's path, to start a daemon from. A front-end whose binary an
/// upgrade replaced (installed by rename: the kernel then names the old one
/// `<path> (deleted)`) starts the binary installed at its path now, which
/// is the new build.
fn installed_exe() -> std::io::Result<std::path::PathBuf> {
    let exe = std::env::current_exe()?;
    let replaced = exe.to_str().and_then(|p| p.strip_suffix(" (deleted)")).map(std::path::PathBuf::from);
    Ok(replaced.filter(|p| p.exists()).unwrap_or(exe))
}

/// The last lines of the daemon's log, for a start failure.
fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().rev().take(5).collect();
    lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
}

/// Holds an HTTP listener open: announces it, then waits for SIGTERM/SIGINT
/// (closing the connection stops the listener; the daemon closes its end
/// once the listener is down). A daemon that goes away is replaced by one
/// listening on the same address, up to [`super::relay::MAX_RESTARTS`] times
/// a minute.
pub async fn hold_http(
    conn: Connection,
    token_required: bool,
    source: ConfigSource,
    listen: http::HttpListen,
) -> Result<(), DaemonError> {
    let Connection { mut read, mut write, reply } = conn;
    let addr = reply.http_addr.ok_or_else(|| DaemonError::Protocol("the daemon named no HTTP address".into()))?;
    http::announce(addr, token_required);
    let mut rest = Vec::new();
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).map_err(DaemonError::Connection)?;
    let mut restarts = super::relay::Restarts::default();
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = &mut interrupted => break,
            _ = read.read_to_end(&mut rest) => {
                // The same address: the port is ours again once the dead
                // daemon's listener is gone. A new daemon that goes away
                // too is another try, counted.
                let conn = loop {
                    restarts.another()?;
                    tracing::warn!(%addr, "the sandbox-mcp daemon went away; a new one listens on the same address");
                    let again = http::HttpListen { addr, ..listen.clone() };
                    match open(source.clone(), Mode::Http(again)).await {
                        Ok(conn) => break conn,
                        Err(DaemonError::Connection(_) | DaemonError::Closed) => continue,
                        Err(e) => return Err(e),
                    }
                };
                (read, write) = (conn.read, conn.write);
            }
        }
    }
    let _ = write.shutdown().await;
    // The listener is closed once the daemon closes its end.
    let _ = tokio::time::timeout(Duration::from_secs(10), read.read_to_end(&mut rest)).await;
    Ok(())
}
