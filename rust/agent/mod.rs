//! The in-sandbox agent: accepts connections on a listening socket it
//! inherited from the sandbox's init; each connection runs one process,
//! one copy or one background-process request.
//!
//! The helper created the socket outside the sandbox and never mounts it
//! inside, so only the helper can connect. The agent runs as a forked child of
//! the sandbox's PID 1 (no exec: the sandbox root has no agent binary), on a
//! current-thread tokio runtime: every Exec is a connect, one spawn and a
//! handful of frames. Background processes belong to the agent's
//! [`background::Registry`], so they outlive the connection that started them.
use std::os::unix::net::UnixListener as StdUnixListener;
use std::sync::Arc;

pub mod background;
pub mod copy;
pub mod oom;
pub mod process;
pub mod protocol;
pub mod session;
pub mod tree;
pub mod user;

/// Why the agent could not run a process or keep serving.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The request cannot be honoured (bad cwd, program not found); the
    /// message names the offending field.
    #[error("{0}")]
    Rejected(String),
    /// The path or background process does not exist.
    #[error("{0}")]
    NotFound(String),
    /// A running background process already has this name.
    #[error("{0}")]
    AlreadyExists(String),
    /// Too many background processes are running.
    #[error("{0}")]
    Exhausted(String),
    /// A system call failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The underlying error.
        source: std::io::Error,
    },
}

impl AgentError {
    /// How the helper should report this failure.
    pub fn kind(&self) -> protocol::FailKind {
        use protocol::FailKind;
        match self {
            AgentError::Rejected(_) => FailKind::Invalid,
            AgentError::NotFound(_) => FailKind::NotFound,
            AgentError::AlreadyExists(_) => FailKind::AlreadyExists,
            AgentError::Exhausted(_) => FailKind::Exhausted,
            AgentError::Io { .. } => FailKind::Internal,
        }
    }
}

/// Serves the listener until it fails; returns the error that stopped it.
pub fn run(listener: StdUnixListener) -> AgentError {
    let io = |what: &str| {
        let what = what.to_string();
        move |source| AgentError::Io { what, source }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return io("start runtime")(e),
    };
    runtime.block_on(async move {
        if let Err(e) = listener.set_nonblocking(true) {
            return io("listener nonblocking")(e);
        }
        let listener = match tokio::net::UnixListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => return io("listener")(e),
        };
        let background = Arc::new(background::Registry::default());
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    tokio::spawn(session::handle(stream, background.clone()));
                }
                Err(e) => return io("accept")(e),
            }
        }
    })
}
