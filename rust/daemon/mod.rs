//! One orchestrator per user: `sandbox-mcp daemon` owns the [`Orchestrator`]
//! (sandboxes, leases, env, history, forwards, sync jobs, sandbox-ctl
//! sockets) and serves every client of the user, so they all see one truth.
//!
//! - [`socket`]: the Unix socket in the runtime dir and its guards.
//! - [`hello`]: the handshake that carries a session's context.
//! - [`server`]: the daemon: sessions, HTTP listeners, idle exit, drain.
//! - [`frontend`]: what `sandbox-mcp` (stdio) and `serve --http` run: connect
//!   to the daemon (starting it under a lock), hand over the context, relay.
pub mod frontend;
pub mod hello;
pub mod relay;
pub mod server;
pub mod socket;

use std::path::PathBuf;

/// Why the daemon or a front-end could not do its part.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// A file operation on the daemon's own files failed.
    #[error("cannot {what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Another daemon holds the lock.
    #[error("another sandbox-mcp daemon is running (it holds {0})")]
    AlreadyRunning(PathBuf),
    /// The daemon could not be started or did not answer.
    #[error("the sandbox-mcp daemon did not start: {reason}; see {log}")]
    Start {
        /// What went wrong.
        reason: String,
        /// The daemon's log.
        log: PathBuf,
    },
    /// The other side closed the connection before its handshake line (a
    /// daemon does so when it is exiting or draining).
    #[error("the connection closed before the handshake")]
    Closed,
    /// Reading from or writing to the daemon connection failed.
    #[error("connection to the sandbox-mcp daemon: {0}")]
    Connection(std::io::Error),
    /// The other side broke the handshake.
    #[error("sandbox-mcp daemon handshake: {0}")]
    Protocol(String),
    /// The daemon refused the session (e.g. its configuration is invalid).
    #[error("{0}")]
    Refused(String),
    /// The daemon went away while the session was open, and kept going
    /// away when replaced.
    #[error(
        "the sandbox-mcp daemon closed the connection mid-session and each new one went away too (it exited \
         or was killed; see {0}); restart the MCP client's server to start a new daemon: sandboxes and their \
         state are kept"
    )]
    Gone(PathBuf),
    /// Starting the orchestrator failed.
    #[error("{0}")]
    Orchestrator(String),
}

impl DaemonError {
    /// Whether the daemon hung up before answering the handshake: it was
    /// going away (idle exit, drain), so the next one is to be reached.
    pub fn is_hangup(&self) -> bool {
        use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset, UnexpectedEof};
        match self {
            DaemonError::Closed => true,
            DaemonError::Connection(e) => {
                matches!(e.kind(), BrokenPipe | ConnectionAborted | ConnectionReset | UnexpectedEof)
            }
            _ => false,
        }
    }
}
