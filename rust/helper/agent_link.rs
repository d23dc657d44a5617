//! The helper's one connection to a running VM's agent: every Exec, copy,
//! background request, dial and stats reading of that VM is a stream on it
//! ([`sandbox_agent::mux`]).
//!
//! When the connection dies, every stream on it fails with the reason and
//! the link is marked lost; the next request reconnects once through the
//! driver's transport (a new helper-side connection to an agent that still
//! runs), and reports the agent gone if that fails too.
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};

use super::error::HelperError;
use sandbox_agent::mux::{Mux, MuxError, Stream};
use sandbox_agent::protocol::Frame;

/// Opens a new connection to the agent (the driver's byte-stream transport).
pub type Dialer = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = std::io::Result<Mux>> + Send>> + Send + Sync>;

/// A VM's agent connection.
pub struct AgentLink {
    vm: String,
    current: Mutex<Option<Mux>>,
    dial: Dialer,
    /// One reconnect at a time.
    reconnecting: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for AgentLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentLink").field("vm", &self.vm).finish_non_exhaustive()
    }
}

impl AgentLink {
    /// A link over `mux`, the connection the VM's start opened.
    pub fn new(vm: &str, mux: Mux, dial: Dialer) -> Arc<Self> {
        Arc::new(AgentLink {
            vm: vm.into(),
            current: Mutex::new(Some(mux)),
            dial,
            reconnecting: tokio::sync::Mutex::new(()),
        })
    }

    fn current(&self) -> Option<Mux> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The live connection, reconnecting once if it died.
    async fn mux(&self) -> Result<Mux, HelperError> {
        if let Some(m) = self.current().filter(|m| m.dead().is_none()) {
            return Ok(m);
        }
        let _one = self.reconnecting.lock().await;
        let previous = match self.current() {
            Some(m) => match m.dead() {
                None => return Ok(m),
                Some(reason) => reason.to_string(),
            },
            None => "closed".to_string(),
        };
        match (self.dial)().await {
            Ok(m) => {
                tracing::info!(vm = %self.vm, %previous, "reconnected to the vm's agent");
                *self.current.lock().unwrap_or_else(PoisonError::into_inner) = Some(m.clone());
                Ok(m)
            }
            Err(e) => Err(HelperError::AgentLost {
                vm: self.vm.clone(),
                reason: format!("{previous}; reconnecting failed: {e}"),
            }),
        }
    }

    /// Opens a stream with its first frame.
    pub async fn open(&self, first: Frame) -> Result<Stream, HelperError> {
        let mux = self.mux().await?;
        mux.open(first).map_err(|e| self.error(e))
    }

    /// A stream failure as the helper reports it.
    pub fn error(&self, e: MuxError) -> HelperError {
        agent_error(&self.vm, e)
    }

    /// Closes the connection (the VM stops): its streams fail.
    pub fn close(&self) {
        self.current.lock().unwrap_or_else(PoisonError::into_inner).take();
    }
}

/// A stream failure on VM `vm`'s agent connection as the helper reports it.
pub fn agent_error(vm: &str, e: MuxError) -> HelperError {
    match e {
        MuxError::Lost(reason) => HelperError::AgentLost { vm: vm.into(), reason: reason.to_string() },
        MuxError::Cancelled => HelperError::io(
            "agent protocol",
            std::io::Error::other(format!("vm {vm}'s agent ended the request without an answer")),
        ),
        MuxError::Encode(e) => HelperError::invalid("request", e.to_string()),
    }
}
