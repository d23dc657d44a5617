//! The stdio front-end's relay: MCP messages (one JSON object per line)
//! between the client's stdin/stdout and the daemon, passed on unchanged.
//!
//! A daemon that goes away mid-session (killed, crashed) is replaced: the
//! relay answers the requests it had in flight with an error saying so,
//! starts or reaches a new daemon, replays the client's `initialize` (its
//! answer kept from the client, which already has one) and goes on. The
//! client sees one failed call, not a dead server; the sandboxes, which
//! never depended on the daemon, are attached by the new one. A daemon that
//! keeps dying ([`MAX_RESTARTS`] within [`RESTART_WINDOW`]) ends the session
//! with [`DaemonError::Gone`].
use std::{
    collections::HashSet,
    time::{Duration, Instant},
};

use serde::Deserialize;
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
    sync::mpsc,
};

use super::{
    DaemonError,
    frontend::{self, Connection},
    hello::Mode,
};
use sandbox_base::paths;
use sandbox_orchestrator::config::ConfigSource;

/// Daemons a session outlives within [`RESTART_WINDOW`] before it gives up.
pub(super) const MAX_RESTARTS: usize = 3;
/// See [`MAX_RESTARTS`].
const RESTART_WINDOW: Duration = Duration::from_secs(60);
/// How long a new daemon gets to answer the replayed `initialize`.
const REPLAY_TIMEOUT: Duration = Duration::from_secs(60);

/// The daemons a front-end replaced lately: a daemon that keeps dying ends
/// the session rather than being started over and over.
#[derive(Default)]
pub(super) struct Restarts(Vec<Instant>);

impl Restarts {
    /// Count another replacement; [`DaemonError::Gone`] when it is one too many.
    pub(super) fn another(&mut self) -> Result<(), DaemonError> {
        self.0.retain(|t| t.elapsed() < RESTART_WINDOW);
        if self.0.len() >= MAX_RESTARTS {
            return Err(DaemonError::Gone(paths::daemon_log_file()));
        }
        self.0.push(Instant::now());
        Ok(())
    }
}

/// The parts of a JSON-RPC message the relay looks at.
#[derive(Deserialize)]
struct Head {
    #[serde(default)]
    id: Option<serde_json::Value>,
    #[serde(default)]
    method: Option<String>,
    /// Read for `requestId` only: the rest of a request's parameters (a
    /// file's content) is skipped, not copied.
    #[serde(default)]
    params: Option<Params>,
}

#[derive(Deserialize)]
struct Params {
    #[serde(default, rename = "requestId")]
    request_id: Option<serde_json::Value>,
}

impl Head {
    fn of(line: &[u8]) -> Option<Self> {
        // The server accepts a line that starts with a byte order mark.
        serde_json::from_slice(line.strip_prefix("\u{feff}".as_bytes()).unwrap_or(line)).ok()
    }
}

/// A request id as the relay keeps it: its JSON text, so `1` and `"1"`
/// stay apart.
fn key(id: &serde_json::Value) -> String {
    id.to_string()
}

/// What the relay must know to move a session to a new daemon.
#[derive(Default)]
struct Session {
    /// The client's `initialize` request, and its id.
    initialize: Option<(Vec<u8>, String)>,
    /// The client's `notifications/initialized`.
    initialized: Option<Vec<u8>>,
    /// Ids (as JSON text) of the client's requests not answered yet.
    in_flight: HashSet<String>,
}

impl Session {
    /// A line from the client, on its way to the daemon.
    fn up(&mut self, line: &[u8]) {
        let Some(head) = Head::of(line) else { return };
        match (&head.id, head.method.as_deref()) {
            // A cancelled request gets no answer (MCP's cancellation).
            (None, Some("notifications/cancelled")) => {
                if let Some(id) = head.params.and_then(|p| p.request_id) {
                    self.in_flight.remove(&key(&id));
                }
            }
            (Some(id), Some(method)) => {
                let id = key(id);
                if method == "initialize" {
                    self.initialize = Some((line.to_vec(), id.clone()));
                }
                self.in_flight.insert(id);
            }
            (None, Some("notifications/initialized")) => self.initialized = Some(line.to_vec()),
            _ => {}
        }
    }

    /// A line from the daemon, on its way to the client.
    fn down(&mut self, line: &[u8]) {
        if let Some(Head { id: Some(id), method: None, .. }) = Head::of(line) {
            self.in_flight.remove(&key(&id));
        }
    }

    /// Whether the client still waits for its `initialize` answer.
    fn initializing(&self) -> bool {
        self.initialize.as_ref().is_some_and(|(_, id)| self.in_flight.contains(id))
    }
}

/// How one daemon connection ended.
enum Ended {
    /// The client closed stdin, and the daemon's last answers were passed on.
    ClientClosed,
    /// The daemon went away.
    DaemonGone,
}

/// Relays MCP between stdin/stdout and the daemon until the client closes
/// stdin (the daemon's last answers are still delivered), moving the
/// session to a new daemon when one goes away (see the module docs).
pub async fn relay_stdio(conn: Connection, source: ConfigSource) -> Result<(), DaemonError> {
    let (lines, mut from_client) = mpsc::channel::<Vec<u8>>(16);
    tokio::spawn(async move {
        let mut stdin = BufReader::new(tokio::io::stdin());
        loop {
            let mut line = Vec::new();
            match stdin.read_until(b'\n', &mut line).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    if lines.send(line).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
    let mut stdout = tokio::io::stdout();
    let mut session = Session::default();
    let mut restarts = Restarts::default();
    let mut conn = conn;
    loop {
        match relay_one(conn, &mut from_client, &mut stdout, &mut session).await {
            Ended::ClientClosed => return Ok(()),
            Ended::DaemonGone => {}
        }
        // Logged before the client hears of it: its log says why first.
        tracing::warn!(
            log = %paths::daemon_log_file().display(),
            "the sandbox-mcp daemon went away mid-session; moving the session to a new one"
        );
        let initializing = session.initializing();
        answer_in_flight(&mut session, &mut stdout).await;
        let mut failed = None;
        conn = loop {
            if let Err(gone) = restarts.another() {
                // A new daemon's failure to start says more, when it was that.
                return Err(failed.unwrap_or(gone));
            }
            let moved = async {
                let mut conn = frontend::open(source.clone(), Mode::Stdio).await?;
                replay(&mut conn, &mut session, initializing, &mut stdout).await?;
                Ok::<_, DaemonError>(conn)
            };
            match moved.await {
                Ok(conn) => break conn,
                // The new daemon went away too (or was killed starting):
                // another try, counted.
                Err(e @ DaemonError::Start { .. }) => failed = Some(e),
                Err(DaemonError::Connection(_) | DaemonError::Gone(_) | DaemonError::Closed) => failed = None,
                Err(e) => return Err(e),
            }
        };
    }
}

/// Relays over one daemon connection until the client or the daemon ends.
async fn relay_one(
    conn: Connection,
    from_client: &mut mpsc::Receiver<Vec<u8>>,
    stdout: &mut tokio::io::Stdout,
    session: &mut Session,
) -> Ended {
    let Connection { mut read, mut write, .. } = conn;
    let mut client_open = true;
    // One buffer across turns: a read the other branch interrupts keeps
    // what it had (tokio's `read_until` appends), so a long answer racing a
    // client message is never torn in two.
    let mut line = Vec::new();
    loop {
        tokio::select! {
            up = from_client.recv(), if client_open => match up {
                Some(line) => {
                    session.up(&line);
                    // Undelivered, the request is answered as in flight.
                    if write.write_all(&line).await.is_err() || write.flush().await.is_err() {
                        return Ended::DaemonGone;
                    }
                }
                None => {
                    // Half-close: the daemon sees the client's end of input
                    // and answers what it has.
                    client_open = false;
                    let _ = write.shutdown().await;
                }
            },
            down = read.read_until(b'\n', &mut line) => match down {
                // A whole message: passed on. The end of a daemon that died
                // mid-message is not: its request is answered as in flight.
                Ok(n) if n > 0 && line.ends_with(b"\n") => {
                    session.down(&line);
                    if stdout.write_all(&line).await.is_err() || stdout.flush().await.is_err() {
                        // The client is gone: nothing is left to relay to.
                        return Ended::ClientClosed;
                    }
                    line.clear();
                }
                _ if client_open => return Ended::DaemonGone,
                _ => return Ended::ClientClosed,
            },
        }
    }
}

/// Answers every request the dead daemon left unanswered (but an
/// `initialize` the client still waits for, which the new daemon answers).
async fn answer_in_flight(session: &mut Session, stdout: &mut tokio::io::Stdout) {
    let keep = session.initialize.as_ref().map(|(_, id)| id.clone()).filter(|_| session.initializing());
    let log = paths::daemon_log_file();
    for id in session.in_flight.drain().filter(|id| Some(id) != keep.as_ref()) {
        let id: serde_json::Value = serde_json::from_str(&id).unwrap_or(serde_json::Value::Null);
        let answer = serde_json::json!({
            "jsonrpc": "2.0",
            "id": id,
            "error": {
                "code": -32000,
                "message": format!(
                    "the sandbox-mcp daemon stopped while this request ran (see {}); the session moves to a new \
                     daemon, with the sandboxes as they are: retry the request (a command it carried may or may \
                     not have run)",
                    log.display()
                ),
            },
        });
        let mut line = answer.to_string().into_bytes();
        line.push(b'\n');
        let _ = stdout.write_all(&line).await;
    }
    if let Some(id) = keep {
        session.in_flight.insert(id);
    }
    let _ = stdout.flush().await;
}

/// Makes the new daemon's session the client's: its `initialize` again
/// (answered to the client when it still waits, else kept from it), then
/// `notifications/initialized`.
async fn replay(
    conn: &mut Connection,
    session: &mut Session,
    initializing: bool,
    stdout: &mut tokio::io::Stdout,
) -> Result<(), DaemonError> {
    let Some((request, id)) = session.initialize.clone() else { return Ok(()) };
    conn.write.write_all(&request).await.map_err(DaemonError::Connection)?;
    conn.write.flush().await.map_err(DaemonError::Connection)?;
    if initializing {
        // The client's own wait: the relay passes the answer on.
        return Ok(());
    }
    let answered = async {
        loop {
            let mut line = Vec::new();
            if conn.read.read_until(b'\n', &mut line).await.map_err(DaemonError::Connection)? == 0 {
                return Err(DaemonError::Gone(paths::daemon_log_file()));
            }
            match Head::of(&line) {
                Some(Head { id: Some(got), method: None, .. }) if key(&got) == id => return Ok(()),
                // Anything else the new daemon says before it is the client's.
                _ => {
                    let _ = stdout.write_all(&line).await;
                    let _ = stdout.flush().await;
                }
            }
        }
    };
    tokio::time::timeout(REPLAY_TIMEOUT, answered)
        .await
        .map_err(|_| DaemonError::Protocol("the new daemon did not answer the session's initialize".into()))??;
    if let Some(initialized) = &session.initialized {
        conn.write.write_all(initialized).await.map_err(DaemonError::Connection)?;
        conn.write.flush().await.map_err(DaemonError::Connection)?;
    }
    Ok(())
}
