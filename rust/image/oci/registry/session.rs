//! One pull from one endpoint: settling on a client (HTTPS, or plain HTTP
//! for a server that speaks no TLS where that is allowed) through the token
//! handshake, fetching and verifying the manifest, config and layers into
//! the blob store, and mapping oci-client's errors to ours.
use std::future::Future;
use std::sync::OnceLock;

use oci_client::client::ClientProtocol;
use oci_client::errors::{DigestError, OciDistributionError, OciErrorCode};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, RegistryOperation};
use tokio_stream::StreamExt as _;
use tokio_util::sync::CancellationToken;

use super::endpoint::{Endpoint, Scheme, new_client};
use super::errors::{certificate_problem, chain, clean, speaks_no_tls};
use super::manifest::{ImageConfig, Manifest, choose_platform, host_platform, is_index, parse, platform_name};
use super::{LayerState, PullProgress};
use crate::oci::auth;
use crate::oci::blobs::{BlobWriter, digest_hex, sha256_of};
use crate::oci::reference::Reference;
use crate::oci::{BlobStore, FetchedImage, LayerRef, OciError, RunConfig, media};

/// Largest manifest or index accepted (real ones are a few KiB).
const MANIFEST_MAX: usize = 4 << 20;
/// Largest image config accepted (real ones are tens of KiB).
const CONFIG_MAX: u64 = 16 << 20;
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

/// One pull from one endpoint.
pub(super) struct Session<'a> {
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
    pub(super) fn new(
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

    pub(super) async fn pull(&self, progress: &(dyn Fn(PullProgress) + Send + Sync)) -> Result<FetchedImage, OciError> {
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
