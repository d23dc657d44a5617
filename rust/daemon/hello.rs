//! The front-end ↔ daemon handshake: one JSON line each way, then (for a
//! stdio session) MCP messages, relayed unchanged.
//!
//! The front-end sends a [`Hello`] with the session's context (its `SANDBOX_MCP_*`
//! environment and start directory) and what it wants; the daemon answers
//! with a [`Reply`] naming its own [`Build`], so a front-end from a newer
//! install can tell it is talking to an older daemon.
use std::{cmp::Ordering, net::SocketAddr, time::UNIX_EPOCH};

use serde::{Deserialize, Serialize, de::DeserializeOwned};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::DaemonError;
use sandbox_mcp_tools::http::HttpListen;
use sandbox_orchestrator::config::ConfigSource;

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
    /// The front-end's build.
    pub build: Build,
    /// The session's environment and start directory.
    pub source: ConfigSource,
    /// What it wants.
    pub mode: Mode,
}

/// The daemon's answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Reply {
    /// The daemon's build.
    pub build: Build,
    /// Why the request was refused (the session's configuration is invalid,
    /// the address cannot be bound); the front-end prints it and exits.
    pub error: Option<String>,
    /// The address an HTTP listener was bound to.
    pub http_addr: Option<SocketAddr>,
}

/// What identifies an install: the version, and when its binary was
/// written, so a rebuilt or reinstalled binary of the same version counts as
/// a newer build.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Build {
    /// `CARGO_PKG_VERSION`.
    pub version: String,
    /// The binary's modification time, in nanoseconds since the epoch.
    pub written_ns: u128,
}

impl Build {
    /// This binary's build.
    pub fn current() -> Self {
        let written_ns = std::env::current_exe()
            .and_then(std::fs::metadata)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        Self { version: env!("CARGO_PKG_VERSION").to_string(), written_ns }
    }

    /// Whether `self` is a newer install than `other`: a higher version,
    /// or the same version written later.
    pub fn is_newer_than(&self, other: &Build) -> bool {
        let numbers = |v: &str| v.split(['.', '-', '+']).map(|p| p.parse::<u64>().unwrap_or(0)).collect::<Vec<_>>();
        match numbers(&self.version).cmp(&numbers(&other.version)) {
            Ordering::Equal => self.written_ns > other.written_ns,
            by_version => by_version == Ordering::Greater,
        }
    }
}

impl std::fmt::Display for Build {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (binary written at {} ns)", self.version, self.written_ns)
    }
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
    if line.is_empty() {
        return Err(DaemonError::Closed);
    }
    if !line.ends_with(b"\n") {
        return Err(DaemonError::Protocol(format!("handshake line incomplete or over {MAX_LINE} bytes")));
    }
    serde_json::from_slice(&line).map_err(|e| DaemonError::Protocol(format!("bad handshake line: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(version: &str, written_ns: u128) -> Build {
        Build { version: version.into(), written_ns }
    }

    #[test]
    fn newer_is_a_higher_version_or_a_later_binary_of_the_same() {
        assert!(build("0.2.0", 1).is_newer_than(&build("0.1.9", 5)));
        assert!(build("0.10.0", 1).is_newer_than(&build("0.9.0", 1)));
        assert!(build("0.1.0", 6).is_newer_than(&build("0.1.0", 5)));
        assert!(!build("0.1.0", 5).is_newer_than(&build("0.1.0", 5)));
        assert!(!build("0.1.0", 9).is_newer_than(&build("0.2.0", 1)));
    }
}
