//! Pulling an image from a registry into the blob store: its manifest (an
//! index resolved to this host's platform), its config and its layers, each
//! verified against its digest before anything uses it, through configured
//! mirrors first. The HTTP, token and redirect handling is `oci-client`'s;
//! manifests are fetched raw and parsed here, so that their exact bytes are
//! hashed and stored, Docker and OCI types alike are read, and the platform
//! choice (and the error naming what an index has) is ours. Blobs stream
//! through `pull_blob_stream` into the store's [`BlobWriter`](super::blobs::BlobWriter), so progress is
//! reported and a cancellation lands between any two chunks.
mod endpoint;
mod errors;
mod manifest;
mod session;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use super::reference::Reference;
use super::{BlobStore, FetchedImage, OciError};
use endpoint::endpoints;
use session::Session;

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
