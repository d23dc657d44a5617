//! Pulling an image from a registry into the blob store: its manifest (an
//! index resolved to this host's platform), its config and its layers, each
//! verified against its digest before anything uses it, through configured
//! mirrors first. The HTTP, token and redirect handling is `oci-client`'s;
//! manifests are fetched raw and parsed here, so that their exact bytes are
//! hashed and stored, Docker and OCI types alike are read, and the platform
//! choice (and the error naming what an index has) is ours. Blobs stream
//! through `pull_blob_stream` into the store's [`BlobWriter`], so progress is
//! reported and a cancellation lands between any two chunks.
use std::collections::BTreeMap;
use std::future::Future;
use std::net::IpAddr;
use std::sync::OnceLock;
use std::time::Duration;

use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::{DigestError, OciDistributionError, OciErrorCode};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, RegistryOperation};
use serde::Deserialize;
use tokio_stream::StreamExt as _;
use tokio_util::sync::CancellationToken;

use super::auth;
use super::blobs::{BlobWriter, digest_hex, sha256_of};
use super::reference::{Reference, check_registry};
use super::{BlobStore, FetchedImage, LayerRef, OciError, RunConfig, media};

/// Largest manifest or index accepted (real ones are a few KiB).
const MANIFEST_MAX: usize = 4 << 20;
/// Largest image config accepted (real ones are tens of KiB).
const CONFIG_MAX: u64 = 16 << 20;
/// How much of a registry's own text goes into an error.
const HOSTILE_TEXT_MAX: usize = 300;
/// Progress is reported at most once per this many bytes of a layer.
const PROGRESS_STEP: u64 = 1 << 20;
/// Media types of image configs (OCI, Docker).
const CONFIG_TYPES: [&str; 2] =
    ["application/vnd.oci.image.config.v1+json", "application/vnd.docker.container.image.v1+json"];
/// Layer media types `layers` can unpack: tar, tar+gzip, tar+zstd under
/// their OCI and Docker names.
const LAYER_TYPES: [&str; 10] = [
    "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd",
    "application/vnd.oci.image.layer.nondistributable.v1.tar",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd",
    "application/vnd.docker.image.rootfs.diff.tar",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
    "application/vnd.docker.image.rootfs.diff.tar.zstd",
    "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip",
];

/// Where images are pulled from, beyond the reference itself: the
/// `[registries]` table of the user's config.toml.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RegistryConfig {
    /// Pull-through mirrors per registry, tried in order before the registry
    /// itself. Keys are registries as references name them (`docker.io`,
    /// `ghcr.io`); values are mirrors' `host[:port]`, optionally prefixed
    /// `https://`, or `http://` where plain HTTP is allowed (see `insecure`).
    /// A mirror that fails is passed over for the next.
    pub mirrors: BTreeMap<String, Vec<String>>,
    /// Registries and mirrors (`host[:port]`) that may be reached over
    /// plain HTTP. As with docker, these and loopback ones (`localhost`,
    /// 127.0.0.0/8, ::1) are tried over HTTPS first, and over plain HTTP
    /// only when the server does not speak TLS at all: one that answers TLS
    /// is never downgraded, and a certificate it presents that is not
    /// trusted is an error. Every other registry is reached over HTTPS only.
    /// Certificates are verified against the host's CA store (what OpenSSL
    /// reads: /etc/ssl/certs and the like; `SSL_CERT_FILE` or `SSL_CERT_DIR`
    /// in the puller's environment replace it), read afresh for each pull,
    /// so a private CA is trusted by adding it there (for example with
    /// `update-ca-certificates`).
    pub insecure: Vec<String>,
}

/// Where a layer's download stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerState {
    /// Bytes are arriving (`done` of `total`).
    Downloading,
    /// Fetched, verified and stored.
    Done,
    /// Already in the store (verified when written): not fetched.
    Present,
}

/// One progress report about one layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullProgress {
    /// Its position, bottom first.
    pub layer: usize,
    /// How many layers the image has.
    pub layers: usize,
    /// Its digest.
    pub digest: String,
    /// Bytes stored so far.
    pub done: u64,
    /// Its size.
    pub total: u64,
    /// Where it stands.
    pub state: LayerState,
}

/// Pulls `reference` into `blobs`: the manifest (for an index, the one for
/// this host's platform, the index stored too), the config and every layer,
/// each verified against its digest; blobs already in the store are not
/// fetched again. Mirrors configured for its registry are tried first.
/// `progress` hears about each layer; `cancel` stops the pull between or
/// during downloads with [`OciError::Cancelled`], keeping no partial blob.
/// The result's `source` is the reference pinned to the digest of what it
/// named (the index, for a multi-platform image); `manifest_digest` is the
/// manifest whose layers these are.
pub async fn pull(
    reference: &Reference,
    cfg: &RegistryConfig,
    blobs: &BlobStore,
    progress: &(dyn Fn(PullProgress) + Send + Sync),
    cancel: &CancellationToken,
) -> Result<FetchedImage, OciError> {
    let endpoints = endpoints(reference, cfg)?;
    let last = endpoints.len() - 1;
    for (i, endpoint) in endpoints.iter().enumerate() {
        let session = Session::new(endpoint, reference, blobs, cancel)?;
        match session.pull(progress).await {
            Ok(image) => return Ok(image),
            Err(e @ (OciError::Cancelled | OciError::Io { .. })) => return Err(e),
            Err(e) if i < last => tracing::warn!(mirror = %endpoint.host, error = %e, "mirror failed; trying the next"),
            Err(e) => return Err(e),
        }
    }
    unreachable!("endpoints() always ends with the registry itself")
}

/// One place to pull from: a mirror or the registry itself.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Endpoint {
    /// host[:port] of its API.
    host: String,
    /// How it is spoken to.
    scheme: Scheme,
    /// Whether it mirrors the reference's registry (asked with `?ns=`).
    mirror: bool,
}

/// How an endpoint is spoken to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scheme {
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
fn endpoints(reference: &Reference, cfg: &RegistryConfig) -> Result<Vec<Endpoint>, OciError> {
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
fn plain_http_allowed(host_port: &str, cfg: &RegistryConfig) -> bool {
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

/// A manifest or index, as much of either as we read.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Manifest {
    schema_version: u32,
    #[serde(default)]
    media_type: Option<String>,
    #[serde(default)]
    config: Option<Descriptor>,
    #[serde(default)]
    layers: Vec<Descriptor>,
    #[serde(default)]
    manifests: Option<Vec<Descriptor>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Descriptor {
    media_type: String,
    digest: String,
    size: u64,
    #[serde(default)]
    platform: Option<Platform>,
}

#[derive(Deserialize)]
struct Platform {
    architecture: String,
    os: String,
    #[serde(default)]
    variant: Option<String>,
}

/// An image config, as much as we read.
#[derive(Deserialize)]
struct ImageConfig {
    rootfs: RootFs,
}

#[derive(Deserialize)]
struct RootFs {
    #[serde(rename = "type")]
    kind: String,
    diff_ids: Vec<String>,
}

/// Whether parsed manifest bytes are an index (true) or an image manifest.
fn is_index(m: &Manifest, what: &str) -> Result<bool, OciError> {
    if m.schema_version != 2 {
        return Err(OciError::malformed(what, format!("schema version {} (only 2 is read)", m.schema_version)));
    }
    match m.media_type.as_deref() {
        Some(media::OCI_INDEX | media::DOCKER_LIST) => Ok(true),
        Some(media::OCI_MANIFEST | media::DOCKER_MANIFEST) => Ok(false),
        Some(other) => Err(OciError::malformed(what, format!("unsupported media type {}", clean(other)))),
        // OCI lets the media type be left out; the fields tell.
        None if m.manifests.is_some() => Ok(true),
        None if m.config.is_some() => Ok(false),
        None => Err(OciError::malformed(what, "neither an image manifest nor an index")),
    }
}

/// This host's platform in an index's terms (GOARCH names).
fn host_platform() -> (&'static str, Option<&'static str>) {
    match std::env::consts::ARCH {
        "x86_64" => ("amd64", None),
        "aarch64" => ("arm64", Some("v8")),
        "x86" => ("386", None),
        "powerpc64" if cfg!(target_endian = "little") => ("ppc64le", None),
        "loongarch64" => ("loong64", None),
        other => (other, None),
    }
}

/// The index entry for linux on `arch` (no variant, or `variant`), else
/// NoPlatform naming what the index has.
fn choose_platform<'a>(
    entries: &'a [Descriptor],
    (arch, variant): (&str, Option<&str>),
    reference: &Reference,
) -> Result<&'a Descriptor, OciError> {
    let fits = |p: &Platform| {
        p.os == "linux" && p.architecture == arch && (p.variant.is_none() || p.variant.as_deref() == variant)
    };
    if let Some(entry) = entries.iter().find(|e| e.platform.as_ref().is_some_and(fits)) {
        return Ok(entry);
    }
    let mut available: Vec<String> = entries
        .iter()
        .map(|e| match &e.platform {
            Some(p) => {
                let v = p.variant.as_deref().map(|v| format!("/{v}")).unwrap_or_default();
                clean(&format!("{}/{}{v}", p.os, p.architecture))
            }
            None => "unspecified".to_string(),
        })
        .collect();
    available.dedup();
    Err(OciError::NoPlatform {
        reference: reference.to_string(),
        platform: format!("linux/{arch}{}", variant.map(|v| format!("/{v}")).unwrap_or_default()),
        available: if available.is_empty() { "nothing".to_string() } else { available.join(", ") },
    })
}

/// A registry's own text, made safe to show: control and invisible
/// formatting characters dropped, whitespace collapsed, at most 300
/// characters.
fn clean(text: &str) -> String {
    let invisible =
        |c: char| matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{2069}' | '\u{feff}');
    let mut out = String::new();
    let mut count = 0;
    for c in text.chars().filter(|&c| !invisible(c)) {
        let c = if c.is_control() || c.is_whitespace() { ' ' } else { c };
        if c == ' ' && (out.is_empty() || out.ends_with(' ')) {
            continue;
        }
        if count == HOSTILE_TEXT_MAX {
            out.push('…');
            break;
        }
        out.push(c);
        count += 1;
    }
    out.trim_end().to_string()
}

/// An error and its causes, one line ("error sending request" alone does
/// not say the certificate was refused).
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// Whether a failed request shows that the server does not speak TLS at
/// all: what it sent first is no TLS record (a plain HTTP server answers
/// the ClientHello with `HTTP/1.1 400`), or it closed the connection
/// without a word of TLS. A server that answers TLS, with whatever
/// certificate or alert, does not qualify. rustls's and tokio-rustls's
/// texts are matched (rustls is not a dependency of ours to downcast to);
/// the plain-HTTP registry tests fail if they change.
fn speaks_no_tls(e: &dyn std::error::Error) -> bool {
    let text = chain(e);
    text.contains("received corrupt message of type InvalidContentType") || text.contains("tls handshake eof")
}

/// The text of a rejected server certificate (`invalid peer certificate:
/// UnknownIssuer`) in an error's chain, if that is what it is.
fn certificate_problem(text: &str) -> Option<&str> {
    text.find("invalid peer certificate").map(|at| &text[at..])
}

/// An oci-client for `host` over `protocol`.
fn new_client(host: &str, protocol: ClientProtocol) -> Result<Client, OciError> {
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
    // reqwest's rustls verifier loads the host's CA store here, each time.
    Client::try_from(config).map_err(|e| OciError::Registry { registry: host.to_string(), why: clean(&chain(&e)) })
}

/// One pull from one endpoint.
struct Session<'a> {
    /// The client tried first (HTTPS unless the endpoint is `http://`).
    first: Client,
    /// Whether plain HTTP follows if the endpoint does not speak TLS.
    fallback: bool,
    /// The client the first request settled on, and authenticated (the
    /// handshake is deferred until a request is needed: a pull by digest
    /// of stored blobs sends none).
    settled: OnceLock<Client>,
    auth: RegistryAuth,
    /// The reference in oci-client's terms, addressed to the endpoint.
    oref: oci_client::Reference,
    reference: &'a Reference,
    host: String,
    blobs: &'a BlobStore,
    cancel: &'a CancellationToken,
}

impl<'a> Session<'a> {
    fn new(
        endpoint: &Endpoint,
        reference: &'a Reference,
        blobs: &'a BlobStore,
        cancel: &'a CancellationToken,
    ) -> Result<Self, OciError> {
        let host = endpoint.host.clone();
        let first = new_client(
            &host,
            if endpoint.scheme == Scheme::Http { ClientProtocol::Http } else { ClientProtocol::Https },
        )?;
        // A mirror is asked for the original registry's repository, which
        // oci-client names in the `ns` query parameter.
        let registry = if endpoint.mirror { reference.registry() } else { endpoint.host.as_str() };
        let (registry, repository) = (registry.to_string(), reference.repository().to_string());
        let mut oref = match (reference.digest(), reference.tag()) {
            (Some(digest), _) => oci_client::Reference::with_digest(registry, repository, digest.to_string()),
            (None, tag) => oci_client::Reference::with_tag(registry, repository, tag.unwrap_or("latest").to_string()),
        };
        if endpoint.mirror {
            oref.set_mirror_registry(endpoint.host.clone());
        }
        let cred_host = if endpoint.mirror { endpoint.host.as_str() } else { reference.registry() };
        let auth = match auth::lookup(cred_host, reference.repository()) {
            Some(c) => RegistryAuth::Basic(c.username, c.password),
            None => RegistryAuth::Anonymous,
        };
        let fallback = endpoint.scheme == Scheme::HttpsOrHttp;
        Ok(Session { first, fallback, settled: OnceLock::new(), auth, oref, reference, host, blobs, cancel })
    }

    async fn pull(&self, progress: &(dyn Fn(PullProgress) + Send + Sync)) -> Result<FetchedImage, OciError> {
        let top_what = format!("the manifest of {}", self.reference);
        let (top_bytes, top_digest) = self.manifest(&top_what, &self.oref, self.reference.digest()).await?;
        let top = parse::<Manifest>(&top_what, &top_bytes)?;
        let (manifest, manifest_digest) = if is_index(&top, &top_what)? {
            let entries = top.manifests.as_deref().unwrap_or_default();
            let entry = choose_platform(entries, host_platform(), self.reference)?;
            digest_hex(&entry.digest)?;
            let what = format!("the {} manifest of {}", platform_name(entry), self.reference);
            let oref = self.oref.clone_with_digest(entry.digest.clone());
            let (bytes, digest) = self.manifest(&what, &oref, Some(&entry.digest)).await?;
            let manifest = parse::<Manifest>(&what, &bytes)?;
            if is_index(&manifest, &what)? {
                return Err(OciError::malformed(what, "an index inside an index"));
            }
            (manifest, digest)
        } else {
            (top, top_digest.clone())
        };
        let config_desc = manifest.config.as_ref().ok_or_else(|| OciError::malformed(&top_what, "no config"))?;
        let config_what = format!("the config of {}", self.reference);
        if !CONFIG_TYPES.contains(&config_desc.media_type.as_str()) {
            let why = format!("config media type {} is not an image's", clean(&config_desc.media_type));
            return Err(OciError::malformed(config_what, why));
        }
        if config_desc.size > CONFIG_MAX {
            return Err(OciError::malformed(config_what, format!("{} bytes is too large", config_desc.size)));
        }
        digest_hex(&config_desc.digest)?;
        self.blob(&config_what, &config_desc.digest, config_desc.size, |_| ()).await?;
        let config_bytes = self.blobs.read(&config_desc.digest)?;
        let config = parse::<ImageConfig>(&config_what, &config_bytes)?;
        let run = RunConfig::from_config(&parse::<serde_json::Value>(&config_what, &config_bytes)?["config"]);
        if config.rootfs.kind != "layers" {
            return Err(OciError::malformed(config_what, "rootfs.type is not \"layers\""));
        }
        let (ids, count) = (config.rootfs.diff_ids.len(), manifest.layers.len());
        if ids != count {
            return Err(OciError::malformed(
                config_what,
                format!("rootfs.diff_ids lists {ids} layers, the manifest {count}"),
            ));
        }
        let mut layers = Vec::with_capacity(manifest.layers.len());
        for (desc, diff_id) in manifest.layers.iter().zip(&config.rootfs.diff_ids) {
            digest_hex(&desc.digest)?;
            digest_hex(diff_id)?;
            if !LAYER_TYPES.contains(&desc.media_type.as_str()) {
                let why = format!("media type {} is not a tar, tar+gzip or tar+zstd layer", clean(&desc.media_type));
                return Err(OciError::malformed(format!("layer {} of {}", desc.digest, self.reference), why));
            }
            layers.push(LayerRef {
                digest: desc.digest.clone(),
                media_type: desc.media_type.clone(),
                size: desc.size,
                diff_id: diff_id.clone(),
            });
        }
        for (i, layer) in layers.iter().enumerate() {
            let (digest, total) = (&layer.digest, layer.size);
            let report = |done, state| {
                progress(PullProgress { layer: i, layers: count, digest: digest.clone(), done, total, state })
            };
            let what = format!("layer {} of {}", layer.digest, self.reference);
            let mut reported = 0;
            let fetched = self
                .blob(&what, &layer.digest, layer.size, |done| {
                    if done == 0 || done - reported >= PROGRESS_STEP {
                        reported = done;
                        report(done, LayerState::Downloading);
                    }
                })
                .await?;
            report(layer.size, if fetched { LayerState::Done } else { LayerState::Present });
        }
        Ok(FetchedImage {
            source: self.reference.with_digest(&top_digest).to_string(),
            manifest_digest,
            config_digest: config_desc.digest.clone(),
            layers,
            run,
        })
    }

    /// Runs a registry call through the settled client, unless cancelled
    /// first, mapping its error.
    async fn call<'s, T, F>(&'s self, doing: &str, request: impl FnOnce(&'s Client) -> F) -> Result<T, OciError>
    where
        F: Future<Output = Result<T, OciDistributionError>>,
    {
        let client = self.settle(doing).await?;
        self.cancellable(request(client)).await?.map_err(|e| self.error(doing, e))
    }

    /// The client to use, after the token handshake (the first request,
    /// `GET /v2/`, sent without credentials): the first one's, or for an
    /// endpoint that may be plain HTTP and turns out not to speak TLS at
    /// all, a plain HTTP one's. Any other failure is the pull's error.
    async fn settle(&self, doing: &str) -> Result<&Client, OciError> {
        if let Some(client) = self.settled.get() {
            return Ok(client);
        }
        let authenticate = |client: Client| async move {
            let auth = client.auth(&self.oref, &self.auth, RegistryOperation::Pull);
            self.cancellable(auth).await?.map(|_| client).map_err(OciOrRegistry::Registry)
        };
        let client = match authenticate(self.first.clone()).await {
            Ok(client) => client,
            Err(OciOrRegistry::Registry(e)) if self.fallback && speaks_no_tls(&e) => {
                tracing::debug!(registry = %self.host, "does not speak TLS; using plain HTTP");
                authenticate(new_client(&self.host, ClientProtocol::Http)?).await.map_err(|e| match e {
                    OciOrRegistry::Oci(e) => e,
                    OciOrRegistry::Registry(e) => self.error(&format!("authenticating for {doing}"), e),
                })?
            }
            Err(OciOrRegistry::Oci(e)) => return Err(e),
            Err(OciOrRegistry::Registry(e)) => return Err(self.error(&format!("authenticating for {doing}"), e)),
        };
        Ok(self.settled.get_or_init(|| client))
    }

    async fn cancellable<T>(&self, fut: impl Future<Output = T>) -> Result<T, OciError> {
        tokio::select! {
            biased;
            () = self.cancel.cancelled() => Err(OciError::Cancelled),
            out = fut => Ok(out),
        }
    }

    /// The manifest `oref` names, verified against `expected` (from the
    /// reference or an index) when there is one and stored; with no
    /// expected digest (a tag), its digest is computed here. One already
    /// stored under an expected digest is read from the store.
    async fn manifest(
        &self,
        what: &str,
        oref: &oci_client::Reference,
        expected: Option<&str>,
    ) -> Result<(Vec<u8>, String), OciError> {
        if let Some(digest) = expected.filter(|d| self.blobs.contains(d)) {
            return Ok((self.blobs.read(digest)?, digest.to_string()));
        }
        let accept = [media::OCI_MANIFEST, media::DOCKER_MANIFEST, media::OCI_INDEX, media::DOCKER_LIST];
        let doing = format!("fetching {what}");
        // oci-client checks the body against the reference's digest and the
        // Docker-Content-Digest header; the checks below do not rely on it.
        let (bytes, _) = self.call(&doing, |c| c.pull_manifest_raw(oref, &self.auth, &accept)).await?;
        if bytes.len() > MANIFEST_MAX {
            return Err(OciError::malformed(what, format!("{} bytes is too large for a manifest", bytes.len())));
        }
        let actual = sha256_of(&bytes);
        if let Some(expected) = expected
            && expected != actual
        {
            return Err(OciError::DigestMismatch { what: what.to_string(), expected: expected.to_string(), actual });
        }
        let (blobs, what_owned, digest, body) = (self.blobs.clone(), what.to_string(), actual.clone(), bytes.to_vec());
        let stored = tokio::task::spawn_blocking(move || blobs.put_bytes(&what_owned, &digest, &body).map(drop));
        joined(self.cancellable(stored).await?)?;
        Ok((bytes.to_vec(), actual))
    }

    /// Fetches blob `digest` of `size` bytes into the store unless it is
    /// there; `tick` hears the bytes stored so far. True if it was fetched.
    async fn blob(&self, what: &str, digest: &str, size: u64, mut tick: impl FnMut(u64)) -> Result<bool, OciError> {
        if self.blobs.contains(digest) {
            return Ok(false);
        }
        // The store's lock is blocking, and held by whoever else is fetching
        // this blob: wait for it on a blocking thread.
        let (blobs, what_owned, digest_owned) = (self.blobs.clone(), what.to_string(), digest.to_string());
        let writer = tokio::task::spawn_blocking(move || blobs.writer(&what_owned, &digest_owned));
        let Some(mut writer) = joined(self.cancellable(writer).await?)? else {
            return Ok(false);
        };
        tick(0);
        // The bare digest, not the descriptor: oci-client would follow a
        // descriptor's `urls` to other hosts.
        let mut stream = self.call(&format!("fetching {what}"), |c| c.pull_blob_stream(&self.oref, digest)).await?;
        loop {
            let chunk = self.cancellable(stream.next()).await?;
            match chunk {
                None => break,
                Some(Err(e)) => return Err(self.stream_error(what, &e)),
                Some(Ok(bytes)) => {
                    if writer.written() + bytes.len() as u64 > size {
                        let why = format!("the registry sent more than the {size} bytes its descriptor says");
                        return Err(OciError::malformed(what, why));
                    }
                    writer.write(&bytes)?;
                    tick(writer.written());
                }
            }
        }
        if writer.written() != size {
            let why = format!("{} bytes arrived, its descriptor says {size}", writer.written());
            return Err(OciError::malformed(what, why));
        }
        joined(tokio::task::spawn_blocking(move || BlobWriter::commit(writer)).await)?;
        Ok(true)
    }

    /// A failed blob stream: oci-client's own digest check ends the stream
    /// with an error carrying the mismatch.
    fn stream_error(&self, what: &str, e: &std::io::Error) -> OciError {
        let inner = e.get_ref().and_then(|inner| inner.downcast_ref::<DigestError>());
        if let Some(DigestError::VerificationError { expected, actual }) = inner {
            let (expected, actual) = (clean(expected), clean(actual));
            return OciError::DigestMismatch { what: what.to_string(), expected, actual };
        }
        OciError::Registry { registry: self.host.clone(), why: clean(&format!("fetching {what}: {}", chain(e))) }
    }

    /// Maps an oci-client error; all of a registry's text goes through
    /// `clean`. A certificate refused says so, naming the registry.
    fn error(&self, doing: &str, e: OciDistributionError) -> OciError {
        let unauthorized = |why: String| OciError::Unauthorized {
            registry: self.host.clone(),
            repository: self.reference.repository().to_string(),
            why: clean(&why),
        };
        let registry =
            |why: String| OciError::Registry { registry: self.host.clone(), why: format!("{doing}: {}", clean(&why)) };
        match e {
            OciDistributionError::UnauthorizedError { .. } => unauthorized("HTTP 401".to_string()),
            OciDistributionError::AuthenticationFailure(reason) => unauthorized(format!("token refused: {reason}")),
            OciDistributionError::ServerError { code: code @ (401 | 403), message, .. } => {
                unauthorized(format!("HTTP {code}: {message}"))
            }
            OciDistributionError::DigestError(DigestError::VerificationError { expected, actual }) => {
                OciError::DigestMismatch { what: doing.to_string(), expected: clean(&expected), actual: clean(&actual) }
            }
            OciDistributionError::RegistryError { envelope, .. } => {
                let text = envelope
                    .errors
                    .iter()
                    .map(|e| {
                        // The code as the registry spelled it (MANIFEST_UNKNOWN).
                        let code = serde_json::to_string(&e.code).unwrap_or_default();
                        format!("{}: {}", code.trim_matches('"'), e.message)
                    })
                    .collect::<Vec<_>>()
                    .join("; ");
                let codes = || envelope.errors.iter().map(|e| &e.code);
                if codes().any(|c| matches!(c, OciErrorCode::Unauthorized | OciErrorCode::Denied)) {
                    unauthorized(text)
                } else if codes().any(|c| {
                    matches!(c, OciErrorCode::ManifestUnknown | OciErrorCode::NameUnknown | OciErrorCode::NotFound)
                }) {
                    registry(format!("{} not found ({text})", self.reference))
                } else {
                    registry(text)
                }
            }
            OciDistributionError::ServerError { code: 404, message, .. } => {
                registry(format!("{} not found (HTTP 404: {message})", self.reference))
            }
            OciDistributionError::ServerError { code, message, .. } => registry(format!("HTTP {code}: {message}")),
            other => {
                let text = chain(&other);
                match certificate_problem(&text) {
                    Some(problem) => {
                        let hint = if problem.contains("UnknownIssuer") {
                            ": it is issued by a CA this host does not trust; a private registry's CA is trusted by \
                             adding it to the host's CA store (update-ca-certificates), or naming it in SSL_CERT_FILE"
                        } else {
                            ""
                        };
                        registry(format!("the TLS certificate of {} is not trusted ({problem}){hint}", self.host))
                    }
                    None => registry(text),
                }
            }
        }
    }
}

/// A failure of the token handshake: ours (cancelled, no client), or
/// oci-client's, not yet mapped.
enum OciOrRegistry {
    Oci(OciError),
    Registry(OciDistributionError),
}

impl From<OciError> for OciOrRegistry {
    fn from(e: OciError) -> Self {
        OciOrRegistry::Oci(e)
    }
}

/// The result of a blocking job (a panic in it reported as an I/O error).
fn joined<T>(r: Result<Result<T, OciError>, tokio::task::JoinError>) -> Result<T, OciError> {
    r.map_err(|e| OciError::io("the blob store's blocking job", std::io::Error::other(e)))?
}

fn platform_name(entry: &Descriptor) -> String {
    entry.platform.as_ref().map_or_else(String::new, |p| clean(&format!("{}/{}", p.os, p.architecture)))
}

fn parse<T: for<'de> Deserialize<'de>>(what: &str, bytes: &[u8]) -> Result<T, OciError> {
    serde_json::from_slice(bytes).map_err(|e| OciError::malformed(what, clean(&e.to_string())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(mirrors: &[(&str, &[&str])], insecure: &[&str]) -> RegistryConfig {
        RegistryConfig {
            mirrors: mirrors.iter().map(|(k, v)| (k.to_string(), v.iter().map(|m| m.to_string()).collect())).collect(),
            insecure: insecure.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn plain_http_only_for_loopback_and_listed_registries() {
        let c = cfg(&[], &["reg.lan:5000"]);
        for host in
            ["localhost", "localhost:5000", "127.0.0.1:5000", "127.9.9.9", "[::1]:5000", "[::1]", "reg.lan:5000"]
        {
            assert!(plain_http_allowed(host, &c), "{host}");
        }
        let remote = "reg.lan reg.lan:5001 ghcr.io 10.0.0.1:5000 [::2]:5000 localhost.evil.com 127.0.0.1.nip.io";
        for host in remote.split(' ') {
            assert!(!plain_http_allowed(host, &c), "{host}");
        }
    }

    #[test]
    fn mirrors_come_first_and_plain_http_is_checked_before_any_request() {
        let r = Reference::parse("python:3").unwrap();
        let c = cfg(&[("docker.io", &["https://mirror.gcr.io/", "localhost:5001", "http://127.0.0.1:5002"])], &[]);
        let e = endpoints(&r, &c).unwrap();
        let got: Vec<_> = e.iter().map(|e| (e.host.as_str(), e.scheme, e.mirror)).collect();
        assert_eq!(
            got,
            [
                ("mirror.gcr.io", Scheme::Https, true),
                ("localhost:5001", Scheme::HttpsOrHttp, true),
                ("127.0.0.1:5002", Scheme::Http, true),
                ("registry-1.docker.io", Scheme::Https, false)
            ]
        );
        let bad = cfg(&[("docker.io", &["http://mirror.example.com"])], &[]);
        let err = endpoints(&r, &bad).unwrap_err();
        assert!(err.to_string().contains("plain HTTP is refused"), "{err}");
        let allowed = cfg(
            &[("docker.io", &["http://mirror.example.com", "mirror.example.com", "https://mirror.example.com"])],
            &["mirror.example.com"],
        );
        let schemes: Vec<_> = endpoints(&r, &allowed).unwrap().iter().map(|e| e.scheme).collect();
        assert_eq!(schemes, [Scheme::Http, Scheme::HttpsOrHttp, Scheme::Https, Scheme::Https]);
        for wrong in ["ftp://m.io", "m.io/path", "m.io:port"] {
            assert!(endpoints(&r, &cfg(&[("docker.io", &[wrong])], &[])).is_err(), "{wrong}");
        }
        let local = Reference::parse("127.0.0.1:5000/a").unwrap();
        assert_eq!(endpoints(&local, &RegistryConfig::default()).unwrap()[0].scheme, Scheme::HttpsOrHttp);
        let listed = Reference::parse("reg.lan:5000/a").unwrap();
        assert_eq!(endpoints(&listed, &cfg(&[], &["reg.lan:5000"])).unwrap()[0].scheme, Scheme::HttpsOrHttp);
        let remote = Reference::parse("ghcr.io/a/b").unwrap();
        assert_eq!(endpoints(&remote, &RegistryConfig::default()).unwrap()[0].scheme, Scheme::Https);
    }

    /// An error with a cause, as reqwest's are.
    #[derive(Debug)]
    struct Chained(&'static str, Option<Box<Chained>>);

    impl std::fmt::Display for Chained {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Chained {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|e| e as _)
        }
    }

    #[test]
    fn only_a_server_that_speaks_no_tls_is_spoken_to_in_plain_http() {
        let request = |cause: &'static str| {
            Chained(
                "error sending request",
                Some(Box::new(Chained("client error (Connect)", Some(Box::new(Chained(cause, None)))))),
            )
        };
        assert!(speaks_no_tls(&request("received corrupt message of type InvalidContentType")));
        assert!(speaks_no_tls(&request("tls handshake eof")));
        for tls in [
            "invalid peer certificate: UnknownIssuer",
            "invalid peer certificate: certificate not valid for name \"x\"; certificate is only valid for y",
            "received fatal alert: HandshakeFailure",
            "peer is incompatible: Tls12NotOffered",
            "Connection refused (os error 111)",
        ] {
            assert!(!speaks_no_tls(&request(tls)), "{tls}");
        }
        let text = chain(&request("invalid peer certificate: UnknownIssuer"));
        assert_eq!(certificate_problem(&text), Some("invalid peer certificate: UnknownIssuer"));
        assert_eq!(certificate_problem("Connection refused"), None);
    }

    #[test]
    fn config_reads_from_toml() {
        let text =
            "[registries]\ninsecure = [\"reg.lan:5000\"]\n[registries.mirrors]\n\"docker.io\" = [\"mirror.gcr.io\"]\n";
        #[derive(Deserialize)]
        struct File {
            registries: RegistryConfig,
        }
        let f: File = toml::from_str(text).unwrap();
        assert_eq!(f.registries, cfg(&[("docker.io", &["mirror.gcr.io"])], &["reg.lan:5000"]));
        assert!(toml::from_str::<File>("[registries]\nmirrorz = {}\n").is_err());
    }

    fn entry(os: &str, arch: &str, variant: Option<&str>) -> Descriptor {
        Descriptor {
            media_type: media::OCI_MANIFEST.to_string(),
            digest: format!("sha256:{}", "0".repeat(64)),
            size: 1,
            platform: Some(Platform { architecture: arch.into(), os: os.into(), variant: variant.map(Into::into) }),
        }
    }

    #[test]
    fn an_index_resolves_to_this_platform_or_says_what_it_has() {
        let r = Reference::parse("x").unwrap();
        let entries =
            vec![entry("linux", "arm", Some("v7")), entry("linux", "arm64", Some("v8")), entry("linux", "amd64", None)];
        let amd = choose_platform(&entries, ("amd64", None), &r).unwrap();
        assert_eq!(amd.platform.as_ref().unwrap().architecture, "amd64");
        let arm = choose_platform(&entries, ("arm64", Some("v8")), &r).unwrap();
        assert_eq!(arm.platform.as_ref().unwrap().variant.as_deref(), Some("v8"));
        let only = vec![entry("windows", "amd64", None), entry("linux", "s390x", None)];
        match choose_platform(&only, ("amd64", None), &r) {
            Err(OciError::NoPlatform { platform, available, .. }) => {
                assert_eq!(platform, "linux/amd64");
                assert_eq!(available, "windows/amd64, linux/s390x");
            }
            other => panic!("{:?}", other.map(|_| ())),
        }
    }

    #[test]
    fn a_registrys_text_is_cleaned_and_capped() {
        assert_eq!(clean("bad\x1b[31m red\r\n\tline\u{202e}gnp.exe"), "bad [31m red linegnp.exe");
        let long = clean(&"x".repeat(1000));
        assert_eq!(long.chars().count(), HOSTILE_TEXT_MAX + 1);
        assert!(long.ends_with('…'));
    }

    #[test]
    fn manifests_are_told_apart_by_media_type_or_fields() {
        let m = |j: &str| serde_json::from_str::<Manifest>(j).unwrap();
        let typed = |t: &str| m(&format!(r#"{{"schemaVersion":2,"mediaType":"{t}"}}"#));
        assert!(is_index(&typed(media::OCI_INDEX), "x").unwrap());
        assert!(!is_index(&typed(media::DOCKER_MANIFEST), "x").unwrap());
        assert!(is_index(&m(r#"{"schemaVersion":2,"manifests":[]}"#), "x").unwrap());
        assert!(is_index(&m(r#"{"schemaVersion":1}"#), "x").is_err());
        assert!(is_index(&m(r#"{"schemaVersion":2,"mediaType":"text/html"}"#), "x").is_err());
    }
}
