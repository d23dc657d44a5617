//! The front-end ↔ daemon handshake: one JSON line each way, then (for a
//! stdio session) MCP bytes, relayed unchanged.
//!
//! The front-end sends a [`Hello`] with the session's context (its `SANDBOX_MCP_*`
//! environment and start directory) and what it wants; the daemon answers
//! with a [`Reply`] naming its own build, so a front-end from another install
//! can tell it is talking to an older daemon.
use std::{net::SocketAddr, os::unix::fs::MetadataExt, time::UNIX_EPOCH};

use serde::{Deserialize, Serialize, de::DeserializeOwned};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::DaemonError;
use crate::{mcp::http::HttpListen, orchestrator::config::ConfigSource};

/// The longest handshake line: the environment and a path fit many times over.
const MAX_LINE: u64 = 1 << 20;

/// What a front-end asks of the daemon.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// One MCP session over this connection.
    Stdio,
    /// Listen for MCP over HTTP until this connection closes.
    Http(HttpListen),
    /// Stop accepting, let in-flight sessions finish, and exit (a newer
    /// front-end replaces this daemon).
    Drain,
}

/// The first line a front-end sends.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Hello {
    /// The front-end's [`build_id`].
    pub build: String,
    /// The session's environment and start directory.
    pub source: ConfigSource,
    /// What it wants.
    pub mode: Mode,
}

/// The daemon's answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Reply {
    /// The daemon's [`build_id`].
    pub build: String,
    /// Why the request was refused (the session's configuration is invalid,
    /// the address cannot be bound); the front-end prints it and exits.
    pub error: Option<String>,
    /// The address an HTTP listener was bound to.
    pub http_addr: Option<SocketAddr>,
}

/// What identifies this install: the version, and the binary's size and
/// modification time, so a rebuilt or reinstalled binary of the same version
/// counts as another build.
pub fn build_id() -> String {
    let stamp = std::env::current_exe()
        .and_then(std::fs::metadata)
        .map(|m| {
            let mtime = m.modified().ok().and_then(|t| t.duration_since(UNIX_EPOCH).ok()).unwrap_or_default();
            format!("{}-{}.{:09}", m.size(), mtime.as_secs(), mtime.subsec_nanos())
        })
        .unwrap_or_default();
    format!("{}+{stamp}", env!("CARGO_PKG_VERSION"))
}

/// Writes one message as a JSON line.
pub async fn send<W: AsyncWrite + Unpin, T: Serialize>(w: &mut W, message: &T) -> Result<(), DaemonError> {
    let mut line = serde_json::to_vec(message).map_err(|e| DaemonError::Protocol(e.to_string()))?;
    line.push(b'\n');
    w.write_all(&line).await.map_err(DaemonError::Connection)?;
    w.flush().await.map_err(DaemonError::Connection)
}

/// Reads one JSON line; what follows it stays in `r`'s buffer.
pub async fn receive<R: AsyncBufRead + Unpin, T: DeserializeOwned>(r: &mut R) -> Result<T, DaemonError> {
    let mut line = Vec::new();
    (&mut *r).take(MAX_LINE).read_until(b'\n', &mut line).await.map_err(DaemonError::Connection)?;
    if !line.ends_with(b"\n") {
        return Err(DaemonError::Protocol(if line.is_empty() {
            "the connection closed before the handshake".into()
        } else {
            format!("handshake line incomplete or over {MAX_LINE} bytes")
        }));
    }
    serde_json::from_slice(&line).map_err(|e| DaemonError::Protocol(format!("bad handshake line: {e}")))
}
