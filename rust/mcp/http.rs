//! MCP over Streamable HTTP (`sandbox-mcp serve --http`): the axum router at
//! `/mcp`, one MCP session per client over one shared [`Orchestrator`], and the
//! guards in front of it: bearer token, `Host` and `Origin` checks against DNS
//! rebinding. Token storage lives in [`super::http_token`].
//!
//! The front-end a user starts resolves the options ([`HttpOptions::resolve`],
//! where the token is announced); the daemon binds and serves
//! ([`bind`], [`serve_on`]) for as long as that front-end stays connected.
use std::{net::SocketAddr, sync::Arc, time::Duration};

use axum::{
    Router,
    body::Body,
    extract::{Request, State},
    http::{HeaderMap, StatusCode, header},
    middleware::{self, Next},
    response::{IntoResponse, Response},
};
use rmcp::transport::streamable_http_server::{
    StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
};
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::{SandboxServer, http_compat, http_token};
use sandbox_orchestrator::{Config, Orchestrator};

/// Where the MCP endpoint is mounted.
pub const MCP_PATH: &str = "/mcp";

/// The default listen address: loopback (a token is still required).
pub const DEFAULT_ADDR: &str = "127.0.0.1:8765";

/// Hosts every server accepts in `Host` and `Origin` (rmcp's loopback default).
const LOOPBACK_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// Why the HTTP server could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// The token file could not be read or written.
    #[error("token file {path}: {source}")]
    TokenFile {
        /// The file.
        path: std::path::PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A token given by flag or environment is unusable.
    #[error("invalid token: {0}")]
    InvalidToken(String),
    /// The server failed while running.
    #[error("HTTP server: {0}")]
    Serve(std::io::Error),
}

/// How `serve --http` was asked to run.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// Listen address.
    pub addr: SocketAddr,
    /// Bearer token from `--token` / `SANDBOX_MCP_TOKEN`; when absent, the
    /// stored (or a newly generated) token, whatever the bind address.
    pub token: Option<String>,
    /// `--no-auth`: serve without a token, explicitly (said on stderr).
    pub no_auth: bool,
    /// Extra `Host`/`Origin` names to accept besides loopback and the bind
    /// address (`--allowed-host`).
    pub allowed_hosts: Vec<String>,
}

/// A listener as resolved by the front-end: what the daemon binds and checks.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HttpListen {
    /// Listen address.
    pub addr: SocketAddr,
    /// The bearer token required; `None` only with `--no-auth`.
    pub token: Option<String>,
    /// `--allowed-host` entries.
    pub allowed_hosts: Vec<String>,
}

impl HttpOptions {
    /// The token to require: the given one (checked), else the stored one
    /// (generated and announced on first use), loopback too: any local
    /// process, and any other user of the machine, reaches a loopback port
    /// (a sandbox did, through its network).
    pub fn resolve(self) -> Result<HttpListen, HttpError> {
        let token = match (self.token, self.no_auth) {
            (Some(_), true) => {
                return Err(HttpError::InvalidToken("--token and --no-auth exclude each other".into()));
            }
            (Some(t), false) => Some(http_token::validate(&t)?),
            (None, false) => Some(http_token::load_or_create(&http_token::token_path())?),
            (None, true) => {
                eprintln!(
                    "sandbox-mcp: --no-auth: HTTP requests are NOT authenticated; any process or user that can \
                     reach {} can run commands in your sandboxes and upload and download host files",
                    self.addr
                );
                None
            }
        };
        if self.addr.ip().is_unspecified() && self.allowed_hosts.is_empty() {
            tracing::warn!(
                "bound to a wildcard address: remote clients must reach it by a name given with --allowed-host \
                 (only loopback Host headers are accepted otherwise)"
            );
        }
        Ok(HttpListen { addr: self.addr, token, allowed_hosts: self.allowed_hosts })
    }
}

/// The line a front-end prints once the daemon listens (tests and users
/// read the real port from it).
pub fn announce(local: SocketAddr, token_required: bool) {
    eprintln!(
        "sandbox-mcp: serving MCP at http://{local}{MCP_PATH} ({})",
        if token_required { "bearer token required" } else { "no token: --no-auth" }
    );
}

/// What every request to `/mcp` is checked against before rmcp sees it.
#[derive(Debug)]
struct Guard {
    /// The bearer token, if one is required.
    token: Option<String>,
    /// Accepted hosts (`name` or `name:port`), shared with rmcp's `Host` check.
    allowed_hosts: Vec<String>,
    /// The port served: an `Origin` must name it unless its allowed entry
    /// names another (a proxy's), since another port on an allowed host is
    /// another origin (any local web app on `localhost:9999`).
    port: u16,
}

/// Hosts accepted in `Host` and `Origin`: loopback, the bind address when it
/// is a specific non-loopback one (a wildcard bind has no name of its own to
/// add), and whatever was configured explicitly.
fn allowed_hosts(addr: &SocketAddr, extra: &[String]) -> Vec<String> {
    let mut hosts: Vec<String> = LOOPBACK_HOSTS.iter().map(|h| h.to_string()).collect();
    let ip = addr.ip();
    if !ip.is_loopback() && !ip.is_unspecified() {
        hosts.push(ip.to_string());
    }
    hosts.extend(extra.iter().map(|h| h.trim().to_ascii_lowercase()).filter(|h| !h.is_empty()));
    hosts
}

/// The router: `/mcp` behind the guard, 404 elsewhere. Each MCP session gets
/// its own [`SandboxServer`] over the one orchestrator, so sessions share
/// sandboxes; all of them run under the configuration of the front-end that
/// opened the listener.
fn router(orchestrator: Arc<Orchestrator>, session: Arc<Config>, guard: Guard, shutdown: CancellationToken) -> Router {
    let config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(guard.allowed_hosts.clone())
        .with_cancellation_token(shutdown)
        // Idle SSE streams through proxies get cut without traffic.
        .with_sse_keep_alive(Some(Duration::from_secs(15)))
        // The same ceiling as a stdio message (rmcp's line limit), not
        // rmcp's 4 MiB HTTP default: a write_file's contents ride in one.
        .with_max_request_body_bytes(rmcp::transport::async_rw::DEFAULT_MAX_LINE_LENGTH);
    let service = StreamableHttpService::new(
        move || Ok(SandboxServer::new(&orchestrator, session.clone())),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    Router::new()
        .nest_service(MCP_PATH, service.clone())
        .route_layer(middleware::from_fn_with_state(http_compat::Compat::new(service), http_compat::adjust))
        .route_layer(middleware::from_fn_with_state(Arc::new(guard), check))
}

/// Rejects a cross-origin request (403) and a request without the token (401).
/// Origin first: a browser page on a foreign site must learn nothing, not even
/// whether a token is required.
async fn check(State(guard): State<Arc<Guard>>, request: Request<Body>, next: Next) -> Response {
    if let Err(reason) = origin_allowed(request.headers(), &guard.allowed_hosts, guard.port) {
        tracing::warn!(%reason, "rejected request: Origin not allowed");
        return (StatusCode::FORBIDDEN, format!("Forbidden: {reason}\n")).into_response();
    }
    if let Some(token) = &guard.token
        && !bearer_matches(request.headers(), token)
    {
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "Unauthorized: send `Authorization: Bearer <token>`\n",
        )
            .into_response();
    }
    next.run(request).await
}

/// An `Origin` header, when present, must name an allowed host and the
/// port served (`served`), or the port its allowed entry names.
fn origin_allowed(headers: &HeaderMap, allowed: &[String], served: u16) -> Result<(), String> {
    let Some(value) = headers.get(header::ORIGIN) else {
        return Ok(());
    };
    let origin = value.to_str().map_err(|_| "Origin is not ASCII".to_string())?;
    let uri: axum::http::Uri = origin.parse().map_err(|_| format!("malformed Origin '{origin}'"))?;
    let authority = uri.authority().ok_or_else(|| format!("Origin '{origin}' has no host"))?;
    // An origin without a port has its scheme's.
    let port = authority.port_u16().or(match uri.scheme_str() {
        Some("http") => Some(80),
        Some("https") => Some(443),
        _ => None,
    });
    if origin_host_allowed(authority.host(), port, allowed, served) {
        Ok(())
    } else {
        Err(format!(
            "Origin '{origin}' is not an allowed host and port (port {served} served; see --allowed-host NAME[:PORT])"
        ))
    }
}

/// The names match, as in rmcp's `Host` check, and so do the ports: the
/// allowed entry's when it names one (a reverse proxy's), else the one served.
fn origin_host_allowed(host: &str, port: Option<u16>, allowed: &[String], served: u16) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']').to_ascii_lowercase();
    allowed.iter().any(|entry| {
        let (name, entry_port) = match entry.parse::<axum::http::uri::Authority>() {
            Ok(a) => (a.host().to_string(), a.port_u16()),
            Err(_) => (entry.clone(), None),
        };
        let name = name.trim_start_matches('[').trim_end_matches(']').to_ascii_lowercase();
        name == host && port == Some(entry_port.unwrap_or(served))
    })
}

/// Whether `Authorization: Bearer <token>` carries `token`, compared in
/// constant time so response timing does not reveal a matching prefix.
fn bearer_matches(headers: &HeaderMap, token: &str) -> bool {
    let Some(given) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
    else {
        return false;
    };
    constant_time_eq(given.trim().as_bytes(), token.as_bytes())
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Binds the listen address.
pub async fn bind(listen: &HttpListen) -> Result<TcpListener, HttpError> {
    TcpListener::bind(listen.addr).await.map_err(|source| HttpError::Bind { addr: listen.addr, source })
}

/// Serves MCP over HTTP on `listener` until `shutdown` is cancelled.
pub async fn serve_on(
    listener: TcpListener,
    orchestrator: Arc<Orchestrator>,
    session: Arc<Config>,
    listen: HttpListen,
    shutdown: CancellationToken,
) -> Result<(), HttpError> {
    // The port bound, which for port 0 only the listener knows.
    let port = listener.local_addr().map_err(HttpError::Serve)?.port();
    let guard = Guard { token: listen.token, allowed_hosts: allowed_hosts(&listen.addr, &listen.allowed_hosts), port };
    let app = router(orchestrator, session, guard, shutdown.child_token());
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
        .map_err(HttpError::Serve)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn loopback_bind_allows_only_loopback_names() {
        let h = allowed_hosts(&"127.0.0.1:8765".parse().unwrap(), &[]);
        assert_eq!(h, hosts(&["localhost", "127.0.0.1", "::1"]));
        let h = allowed_hosts(&"0.0.0.0:8765".parse().unwrap(), &[]);
        assert_eq!(h, hosts(&["localhost", "127.0.0.1", "::1"]));
    }

    #[test]
    fn specific_bind_and_explicit_hosts_are_added() {
        let h = allowed_hosts(&"10.1.2.3:80".parse().unwrap(), &["Box.LAN".into()]);
        assert!(h.contains(&"10.1.2.3".to_string()));
        assert!(h.contains(&"box.lan".to_string()));
    }

    #[test]
    fn origin_must_name_an_allowed_host_and_the_port_served() {
        let allowed = hosts(&["localhost", "127.0.0.1", "::1", "box.lan:8443", "plain.lan"]);
        let with = |o: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::ORIGIN, o.parse().unwrap());
            origin_allowed(&h, &allowed, 8765)
        };
        assert!(origin_allowed(&HeaderMap::new(), &allowed, 8765).is_ok());
        assert!(with("http://localhost:8765").is_ok());
        assert!(with("http://127.0.0.1:8765").is_ok());
        assert!(with("http://[::1]:8765").is_ok());
        // Another port on an allowed host is another origin.
        let err = with("http://localhost:9999").unwrap_err();
        assert!(err.contains("port 8765 served"), "{err}");
        assert!(with("http://[::1]:9").is_err());
        assert!(with("http://localhost").is_err(), "port 80");
        // An entry naming a port (a proxy in front) takes that one instead.
        assert!(with("https://box.lan:8443").is_ok());
        assert!(with("https://box.lan:8765").is_err());
        assert!(with("https://box.lan:9999").is_err());
        assert!(with("http://plain.lan:8765").is_ok());
        assert!(with("https://plain.lan").is_err(), "port 443");
        let default_port = |o: &str, served| {
            let mut h = HeaderMap::new();
            h.insert(header::ORIGIN, o.parse().unwrap());
            origin_allowed(&h, &allowed, served)
        };
        assert!(default_port("https://plain.lan", 443).is_ok());
        assert!(default_port("http://localhost", 80).is_ok());
        assert!(with("http://evil.example:8765").is_err());
        assert!(with("null").is_err());
    }

    #[test]
    fn bearer_token_is_compared_exactly() {
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::AUTHORIZATION, v.parse().unwrap());
            h
        };
        assert!(bearer_matches(&with("Bearer abc123"), "abc123"));
        assert!(!bearer_matches(&with("Bearer abc124"), "abc123"));
        assert!(!bearer_matches(&with("Bearer abc"), "abc123"));
        assert!(!bearer_matches(&with("Basic abc123"), "abc123"));
        assert!(!bearer_matches(&HeaderMap::new(), "abc123"));
    }
}
