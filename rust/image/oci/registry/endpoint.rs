//! Where a pull goes and how it connects: the configured mirrors, then the
//! registry, each with the scheme it may be spoken to in (plain HTTP only
//! for loopback and listed registries), and an oci-client set up for one.
use std::net::IpAddr;
use std::time::Duration;

use oci_client::Client;
use oci_client::client::{ClientConfig, ClientProtocol};

use super::RegistryConfig;
use super::errors::{chain, clean};
use crate::oci::OciError;
use crate::oci::reference::{Reference, check_registry};

/// One place to pull from: a mirror or the registry itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Endpoint {
    /// host[:port] of its API.
    pub(super) host: String,
    /// How it is spoken to.
    pub(super) scheme: Scheme,
    /// Whether it mirrors the reference's registry (asked with `?ns=`).
    pub(super) mirror: bool,
}

/// How an endpoint is spoken to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Scheme {
    /// HTTPS, verified against the host's CA store.
    Https,
    /// Plain HTTP: an `http://` mirror where plain HTTP is allowed.
    Http,
    /// HTTPS, or plain HTTP if the server does not speak TLS at all
    /// (docker's rule for loopback and insecure registries). A certificate
    /// error is an error, never a reason for plain HTTP.
    HttpsOrHttp,
}

/// The mirrors for `reference`'s registry, then the registry, each checked
/// (plain HTTP included) before anything is sent anywhere.
pub(super) fn endpoints(reference: &Reference, cfg: &RegistryConfig) -> Result<Vec<Endpoint>, OciError> {
    let mut out = Vec::new();
    for mirror in cfg.mirrors.get(reference.registry()).into_iter().flatten() {
        let refuse = |why: String| OciError::Registry { registry: mirror.clone(), why };
        let (scheme, host) = match mirror.split_once("://") {
            Some((scheme, host)) => (Some(scheme), host.trim_end_matches('/')),
            None => (None, mirror.trim_end_matches('/')),
        };
        check_registry(host).map_err(|why| refuse(format!("not a mirror's host[:port]: {why}")))?;
        let plain_ok = plain_http_allowed(host, cfg);
        let scheme = match scheme {
            None if plain_ok => Scheme::HttpsOrHttp,
            None | Some("https") => Scheme::Https,
            Some("http") if plain_ok => Scheme::Http,
            Some("http") => {
                return Err(refuse(format!(
                    "plain HTTP is refused: it is used only for loopback registries and ones listed in \
                     [registries] insecure, and {host} is neither"
                )));
            }
            Some(other) => return Err(refuse(format!("unknown scheme {other:?}: use https:// or a bare host[:port]"))),
        };
        out.push(Endpoint { host: host.to_string(), scheme, mirror: true });
    }
    let scheme = if plain_http_allowed(reference.registry(), cfg) { Scheme::HttpsOrHttp } else { Scheme::Https };
    out.push(Endpoint { host: reference.api_host().to_string(), scheme, mirror: false });
    Ok(out)
}

/// Plain HTTP is for loopback hosts (as docker does) and ones the user
/// listed as insecure, when they do not speak TLS; everything else is HTTPS.
pub(super) fn plain_http_allowed(host_port: &str, cfg: &RegistryConfig) -> bool {
    cfg.insecure.iter().any(|h| h == host_port) || is_loopback(host_port)
}

/// `localhost`, 127.0.0.0/8 or ::1, with or without a port.
fn is_loopback(host_port: &str) -> bool {
    let host = match host_port.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or_default(),
        None => host_port.rsplit_once(':').map_or(host_port, |(h, _)| h),
    };
    host.eq_ignore_ascii_case("localhost") || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// An oci-client for `host` over `protocol`.
pub(super) fn new_client(host: &str, protocol: ClientProtocol) -> Result<Client, OciError> {
    let config = ClientConfig {
        protocol,
        // Indexes are resolved here, from raw manifests.
        platform_resolver: None,
        connect_timeout: Some(Duration::from_secs(30)),
        // Per read: a stalled transfer fails instead of hanging.
        read_timeout: Some(Duration::from_secs(120)),
        user_agent: concat!("sandbox-mcp/", env!("CARGO_PKG_VERSION")),
        // A loopback registry is never reached through the environment's
        // proxy (as with docker's Go client). oci-client cannot turn
        // reqwest's environment proxies off, but any explicit proxy does,
        // and this one is bypassed for every name ("*") and address.
        http_proxy: is_loopback(host).then(|| "http://127.0.0.1:9".to_string()),
        no_proxy: is_loopback(host).then(|| "*,0.0.0.0/0,::/0".to_string()),
        ..ClientConfig::default()
    };
    // reqwest's rustls verifier loads the host's CA store here, each time,
    // for a plain HTTP client too: with no CA certificate at all, no client
    // can be made (reqwest: "No CA certificates were loaded from the
    // system"), and the words say what to do.
    Client::try_from(config).map_err(|e| {
        let why = clean(&chain(&e));
        let why = if why.contains("No CA certificates") { NO_CA.to_string() } else { why };
        OciError::Registry { registry: host.to_string(), why }
    })
}

/// Why no client could be made on a host without CA certificates.
const NO_CA: &str = "this host has no CA certificates to verify registries with (even a plain HTTP one: the \
                     HTTP library loads them for every client): install Debian's ca-certificates, or set \
                     SSL_CERT_FILE to a CA bundle";
