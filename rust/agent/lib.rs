//! The in-sandbox agent: serves multiplexed connections ([`mux`]) from the
//! helper; each stream on one runs one process, one copy, one
//! background-process request, one dial or one stats reading.
//!
//! Two entries. The namespace driver forks it from the sandbox's PID 1 (no
//! exec: the sandbox root has no agent binary) with a listening socket the
//! helper created outside the sandbox and never mounts inside, so only the
//! helper can connect ([`run`]). A VM's init starts it as
//! `sandbox-vm-helper agent --listen ADDR` ([`listen`]): a virtio-serial
//! port, a vsock, an inherited descriptor or a Unix socket. Either way it
//! runs on a current-thread tokio runtime: every Exec is a stream on an open
//! connection, one spawn and a handful of frames. Background processes
//! belong to the agent's [`background::Registry`], so they outlive the
//! stream (and the connection) that started them.
#[cfg(linux_host)]
use std::os::unix::net::UnixListener as StdUnixListener;
#[cfg(linux_host)]
use std::sync::Arc;

// The wire ([`mux`], [`protocol`]: both sides of it) builds everywhere; the
// agent itself runs only in a Linux guest or namespace sandbox.
#[cfg(linux_host)]
pub mod background;
#[cfg(linux_host)]
pub mod copy;
#[cfg(linux_host)]
pub mod dial;
#[cfg(linux_host)]
pub mod group;
#[cfg(linux_host)]
pub mod listen;
pub mod mux;
#[cfg(linux_host)]
pub mod oom;
#[cfg(linux_host)]
pub mod process;
pub mod protocol;
#[cfg(linux_host)]
pub mod session;
#[cfg(linux_host)]
pub mod stats;
#[cfg(linux_host)]
pub mod tree;
#[cfg(linux_host)]
pub mod user;

/// Where a vm's sandbox root shows the VM's writable layer (read-only,
/// mounted by guest init): a snapshot is the agent's tar of this directory,
/// which has the format of a layer in the image store.
pub const LAYER_VIEW: &str = "/run/sandbox-mcp-layer";

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
    /// The kernel refused the new process (fork's EAGAIN): the sandbox is at
    /// its task limit, most likely; the helper, which can read that limit,
    /// says so.
    #[error("{0}")]
    ForkRefused(String),
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
            AgentError::ForkRefused(_) => FailKind::ForkRefused,
            AgentError::Io { .. } => FailKind::Internal,
        }
    }
}

/// Serves the listener until it fails; returns the error that stopped it.
#[cfg(linux_host)]
pub fn run(listener: StdUnixListener) -> AgentError {
    block_on(async move {
        match listen::accept_unix(listener, Arc::new(background::Registry::default())).await {
            Ok(never) => match never {},
            Err(e) => e,
        }
    })
}

/// Serves `address` (`sandbox-vm-helper agent --listen`) until it fails.
#[cfg(linux_host)]
pub fn serve(address: listen::Address) -> AgentError {
    block_on(listen::serve(address))
}

#[cfg(linux_host)]
fn block_on(work: impl std::future::Future<Output = AgentError>) -> AgentError {
    // The helper caps file sizes at the disk quota (RLIMIT_FSIZE): a write
    // past it must fail the one request (EFBIG), not kill the agent with
    // SIGXFSZ. Blocked, not ignored: std empties the mask of the processes
    // it spawns, so they meet the limit as any process does.
    let mut xfsz = nix::sys::signal::SigSet::empty();
    xfsz.add(nix::sys::signal::Signal::SIGXFSZ);
    if let Err(e) = xfsz.thread_block() {
        return AgentError::Io { what: "block SIGXFSZ".into(), source: e.into() };
    }
    match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt.block_on(work),
        Err(source) => AgentError::Io { what: "start runtime".into(), source },
    }
}
