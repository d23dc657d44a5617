//! Port forwards: a listener on the host's 127.0.0.1 per forward, each
//! accepted connection piped through the helper's Dial RPC to a TCP port
//! inside the sandbox. The sandbox is looked up by name per connection, so a
//! forward keeps working across `reset` (the new VM is dialled).
use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, SocketAddr},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    task::JoinHandle,
};

use super::{OrchestratorError, SandboxManager, isolation::Isolation, state::ForwardRecord};

/// Bytes read from a client per Dial message: big chunks keep the per-message
/// cost of gRPC small next to the copy itself.
const CHUNK: usize = 256 * 1024;

/// Why a forward could not be set up or found.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// A port parameter is out of range.
    #[error("{param} must be between 1 and 65535{extra} (got {value})")]
    InvalidPort {
        /// Parameter name.
        param: &'static str,
        /// What else is accepted.
        extra: &'static str,
        /// The value given.
        value: i64,
    },
    /// The host port already serves a forward.
    #[error(
        "localhost:{host_port} already forwarding to '{}':{port}. Use unexpose({host_port}) first.",
        super::names::display(sandbox)
    )]
    InUse {
        /// The host port.
        host_port: u16,
        /// Sandbox it forwards to.
        sandbox: String,
        /// Port inside that sandbox.
        port: u16,
    },
    /// The host port could not be bound.
    #[error("could not bind localhost:{host_port}: {source}")]
    Bind {
        /// The host port.
        host_port: u16,
        /// The OS error.
        source: std::io::Error,
    },
    /// No forward on that host port.
    #[error("no forward on localhost:{port}. Active: {active}")]
    NoForward {
        /// The host port asked for.
        port: i64,
        /// Host ports that are forwarded, or `none`.
        active: String,
    },
    /// The sandbox could not be found or created.
    #[error(transparent)]
    Orchestrator(#[from] OrchestratorError),
}

/// A forward as reported to clients.
#[derive(Debug, Clone)]
pub struct ForwardInfo {
    /// Port on the host's loopback.
    pub host_port: u16,
    /// Sandbox name.
    pub sandbox: String,
    /// Port inside the sandbox.
    pub port: u16,
    /// Connections accepted so far.
    pub connections: u64,
}

/// The result of `expose`.
#[derive(Debug, Clone)]
pub struct Exposed {
    /// The forward.
    pub forward: ForwardInfo,
    /// Whether something accepted a connection on the port when probed.
    pub listening: bool,
}

struct Forward {
    sandbox: String,
    port: u16,
    connections: Arc<AtomicU64>,
    accept_loop: JoinHandle<()>,
}

impl Forward {
    fn info(&self, host_port: u16) -> ForwardInfo {
        ForwardInfo {
            host_port,
            sandbox: self.sandbox.clone(),
            port: self.port,
            connections: self.connections.load(Ordering::Relaxed),
        }
    }
}

/// Every active forward, keyed by host port.
pub struct ForwardManager {
    sandboxes: Arc<SandboxManager>,
    forwards: Mutex<BTreeMap<u16, Forward>>,
}

fn port_param(param: &'static str, value: i64, extra: &'static str) -> Result<u16, ForwardError> {
    match u16::try_from(value) {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(ForwardError::InvalidPort { param, extra, value }),
    }
}

impl ForwardManager {
    /// Forwards into the sandboxes of `sandboxes`.
    pub fn new(sandboxes: Arc<SandboxManager>) -> Self {
        Self { sandboxes, forwards: Mutex::default() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u16, Forward>> {
        self.forwards.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn in_use(&self, host_port: u16) -> Result<(), ForwardError> {
        match self.lock().get(&host_port) {
            Some(f) => Err(ForwardError::InUse { host_port, sandbox: f.sandbox.clone(), port: f.port }),
            None => Ok(()),
        }
    }

    /// Forward `127.0.0.1:host_port` (0: the same as `port`) to `port` inside
    /// the sandbox, creating the sandbox on first use.
    pub async fn expose(&self, sandbox: &str, port: i64, host_port: i64) -> Result<Exposed, ForwardError> {
        let port = port_param("port", port, "")?;
        let host_port =
            if host_port == 0 { port } else { port_param("host_port", host_port, ", or 0 for the same as port")? };
        self.in_use(host_port)?;
        let sb = self.sandboxes.get_or_create(sandbox).await?;
        let listening = self.probe(&sb.name, sb.isolation, port).await;
        let info = {
            let mut forwards = self.lock();
            // Checked again: another expose may have taken the port while we waited.
            if let Some(f) = forwards.get(&host_port) {
                return Err(ForwardError::InUse { host_port, sandbox: f.sandbox.clone(), port: f.port });
            }
            let listener = bind(host_port)?;
            let connections = Arc::new(AtomicU64::new(0));
            let accept_loop =
                tokio::spawn(accept_loop(listener, self.sandboxes.clone(), sb.name.clone(), port, connections.clone()));
            let forward = Forward { sandbox: sb.name.clone(), port, connections, accept_loop };
            let info = forward.info(host_port);
            forwards.insert(host_port, forward);
            info
        };
        let saved = self.sandboxes.record_forward(ForwardRecord { host_port, sandbox: sb.name.clone(), port });
        if let Err(e) = saved.saved().await {
            // Not started: a forward a restart would not bring back.
            let started = self.lock().remove(&host_port);
            if let Some(forward) = started {
                stop(host_port, forward).await;
            }
            return Err(OrchestratorError::from(e).into());
        }
        tracing::info!(sandbox = %sb.name, port, host_port, "forward started");
        Ok(Exposed { forward: info, listening })
    }

    /// Whether a connection to `port` inside the sandbox is accepted.
    async fn probe(&self, vm_id: &str, isolation: Isolation, port: u16) -> bool {
        match self.sandboxes.helper.dial(vm_id, isolation, port).await {
            Ok((writer, _reader)) => {
                writer.close_write().await;
                true
            }
            Err(_) => false,
        }
    }

    /// Stop the forward on `host_port`. Its listener is closed before this
    /// returns; connections already open are left to finish on their own.
    pub async fn unexpose(&self, host_port: i64) -> Result<ForwardInfo, ForwardError> {
        let no_forward = || {
            let ports: Vec<String> = self.lock().keys().map(u16::to_string).collect();
            let active = if ports.is_empty() { "none".to_string() } else { ports.join(", ") };
            ForwardError::NoForward { port: host_port, active }
        };
        let hp = u16::try_from(host_port).ok().filter(|hp| self.lock().contains_key(hp));
        let Some(hp) = hp else { return Err(no_forward()) };
        // Saved before it stops: a forward a restart would bring back is
        // left running, and the answer says why.
        self.sandboxes.record_unforward(hp).saved().await.map_err(OrchestratorError::from)?;
        // Another unexpose may have taken it meanwhile.
        let removed = self.lock().remove(&hp);
        match removed {
            Some(forward) => Ok(stop(hp, forward).await),
            None => Err(no_forward()),
        }
    }

    /// Stop every forward into `sandbox` (call when it is destroyed or
    /// reaped). With `keep`, the state database keeps them for the
    /// sandbox's comeback after a loss.
    pub async fn sandbox_gone(&self, sandbox: &str, keep: bool) -> Vec<ForwardInfo> {
        let gone: Vec<(u16, Forward)> = {
            let mut forwards = self.lock();
            let ports: Vec<u16> = forwards.iter().filter(|(_, f)| f.sandbox == sandbox).map(|(hp, _)| *hp).collect();
            ports.into_iter().filter_map(|hp| forwards.remove(&hp).map(|f| (hp, f))).collect()
        };
        let mut stopped = Vec::new();
        for (hp, f) in gone {
            if !keep {
                self.sandboxes.record_unforward(hp).in_background();
            }
            stopped.push(stop(hp, f).await);
        }
        stopped
    }

    /// Every forward, by host port.
    pub fn list(&self) -> Vec<ForwardInfo> {
        self.lock().iter().map(|(hp, f)| f.info(*hp)).collect()
    }
}

/// Abort the accept loop and wait until it is dropped, so the listening
/// socket is closed when this returns. Only the loop is awaited, never the
/// connections it started, which is why this cannot hang.
async fn stop(host_port: u16, forward: Forward) -> ForwardInfo {
    let Forward { sandbox, port, connections, accept_loop } = forward;
    accept_loop.abort();
    let _ = accept_loop.await;
    tracing::info!(%sandbox, port, host_port, "forward stopped");
    ForwardInfo { host_port, sandbox, port, connections: connections.load(Ordering::Relaxed) }
}

/// Loopback only: a forward must never be reachable from other hosts.
fn bind(host_port: u16) -> Result<TcpListener, ForwardError> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, host_port));
    let bind_err = |source| ForwardError::Bind { host_port, source };
    let std_listener = std::net::TcpListener::bind(addr).map_err(bind_err)?;
    std_listener.set_nonblocking(true).map_err(bind_err)?;
    TcpListener::from_std(std_listener).map_err(bind_err)
}

async fn accept_loop(
    listener: TcpListener,
    sandboxes: Arc<SandboxManager>,
    sandbox: String,
    port: u16,
    connections: Arc<AtomicU64>,
) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Per-connection failures (e.g. the peer reset before accept,
                // or fd exhaustion) must not end the forward.
                tracing::warn!(%sandbox, port, "accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        connections.fetch_add(1, Ordering::Relaxed);
        let sandboxes = sandboxes.clone();
        let sandbox = sandbox.clone();
        tokio::spawn(async move {
            if let Err(e) = serve(stream, &sandboxes, &sandbox, port).await {
                tracing::debug!(%sandbox, port, %peer, "forwarded connection ended: {e}");
            }
        });
    }
}

/// Pipe one client connection to the sandbox's current VM until both
/// directions have ended; each direction's EOF is passed on as a half-close.
async fn serve(stream: TcpStream, sandboxes: &SandboxManager, sandbox: &str, port: u16) -> Result<(), ForwardError> {
    let current = sandboxes.get(sandbox)?;
    // Traffic through a forward is use: a served dev server is not idle.
    sandboxes.touch(sandbox);
    let (writer, mut reader) =
        sandboxes.helper.dial(&current.name, current.isolation, port).await.map_err(OrchestratorError::from)?;
    stream.set_nodelay(true).ok();
    let (mut client_rx, mut client_tx) = stream.into_split();
    let upstream = async move {
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = match client_rx.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            // A full buffer is handed over as is (no copy); small reads are
            // copied so the big buffer is not reallocated per request.
            let chunk = if n * 4 >= CHUNK {
                let mut full = std::mem::replace(&mut buf, vec![0u8; CHUNK]);
                full.truncate(n);
                full
            } else {
                buf[..n].to_vec()
            };
            if !writer.write(chunk).await {
                return;
            }
        }
        writer.close_write().await;
    };
    let downstream = async move {
        while let Ok(Some(data)) = reader.read().await {
            if client_tx.write_all(&data).await.is_err() {
                return;
            }
        }
        let _ = client_tx.shutdown().await;
    };
    tokio::join!(upstream, downstream);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_validated_by_name() {
        assert_eq!(port_param("port", 80, "").unwrap(), 80);
        assert_eq!(port_param("port", 65535, "").unwrap(), 65535);
        for bad in [0, -1, 65536, i64::MAX] {
            let e = port_param("port", bad, "").unwrap_err().to_string();
            assert_eq!(e, format!("port must be between 1 and 65535 (got {bad})"));
        }
        let e = port_param("host_port", 70000, ", or 0 for the same as port").unwrap_err().to_string();
        assert!(e.starts_with("host_port must be between 1 and 65535, or 0"), "{e}");
    }

    #[tokio::test]
    async fn bind_is_loopback_only_and_reports_the_os_error() {
        let taken = bind(0).unwrap();
        let addr = taken.local_addr().unwrap();
        assert!(addr.ip().is_loopback());
        let e = bind(addr.port()).unwrap_err().to_string();
        assert!(e.starts_with(&format!("could not bind localhost:{}: ", addr.port())), "{e}");
        assert!(e.contains("in use"), "{e}");
    }
}
