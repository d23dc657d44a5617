//! OCI images: what `image pull` fetches from a registry and `image import`
//! reads from an archive, kept in one content-addressed blob store shared by
//! every image, and unpacked (on Linux) into a root filesystem that both
//! drivers boot like a built image.
//!
//! Modules:
//! - `reference`: parsing `python:3.12`, `ghcr.io/o/r@sha256:…` into registry, repository, tag, digest.
//! - `blobs`: the blob store, `<store>/blobs/sha256/<hex>`: written to a temp file, verified, renamed.
//! - `registry`: pulling a manifest (an index resolved to this host's platform), its config and layers.
//! - `archive`: importing an OCI image layout (directory or tar) or a `docker save` archive; exporting.
//! - `layers`: unpacking layers (tar, gzip, zstd; whiteouts) through the sandbox's id map, confined.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

// Pulling and the reference grammar are every host's (a Mac's helper shares
// them); unpacking, import and export need Linux's user namespaces.
#[cfg(linux_host)]
pub mod archive;
mod auth;
pub mod blobs;
#[cfg(linux_host)]
mod confined;
#[cfg(linux_host)]
mod flatten;
#[cfg(linux_host)]
mod install;
#[cfg(linux_host)]
pub mod layers;
pub mod reference;
pub mod registry;

pub use blobs::BlobStore;
#[cfg(linux_host)]
pub use confined::run_layer_applier_if_asked;
#[cfg(linux_host)]
pub use layers::unpack_image;
pub use reference::Reference;
pub use registry::{LayerState, PullProgress, RegistryConfig, pull};

/// Media types of the manifests and layers we read.
pub mod media {
    /// An OCI image manifest.
    pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
    /// An OCI image index.
    pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
    /// A Docker v2 schema 2 manifest.
    pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
    /// A Docker manifest list.
    pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
}

/// One layer of an image, as its manifest lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerRef {
    /// `sha256:<hex>` of the blob as stored (compressed).
    pub digest: String,
    /// Its media type: tar, tar+gzip or tar+zstd (OCI or Docker names).
    pub media_type: String,
    /// Its size in bytes.
    pub size: u64,
    /// `sha256:<hex>` of the uncompressed tar, from the config's rootfs.diff_ids.
    pub diff_id: String,
}

/// What an image's config says a process starts with.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunConfig {
    /// `KEY=value` pairs, split.
    pub env: BTreeMap<String, String>,
    /// The working directory.
    pub workdir: String,
    /// The user (`name`, `uid`, `uid:gid`); empty means root.
    pub user: String,
    /// Entrypoint and Cmd, informational (a sandbox runs what a tool asks).
    pub entrypoint: Vec<String>,
    /// See `entrypoint`.
    pub cmd: Vec<String>,
    /// `ExposedPorts`, as `8080/tcp`, informational.
    pub exposed_ports: Vec<String>,
    /// `Labels`, less any in our own `sandbox-mcp.` namespace (which say
    /// what made an image, and an image must not claim that for itself).
    pub labels: BTreeMap<String, String>,
}

/// Our own labels' namespace.
const OWN_LABELS: &str = "sandbox-mcp.";

impl RunConfig {
    /// The process defaults of an image config's `config` object (OCI and
    /// Docker name them alike). What a process could not be given is left
    /// out: env entries without `=`, or with NUL or an empty key.
    pub fn from_config(c: &serde_json::Value) -> Self {
        let strings = |v: &serde_json::Value| {
            v.as_array().into_iter().flatten().filter_map(|s| s.as_str().map(String::from)).collect::<Vec<_>>()
        };
        let keys = |v: &serde_json::Value| v.as_object().into_iter().flatten().map(|(k, _)| k.clone()).collect();
        let text = |v: &serde_json::Value| v.as_str().unwrap_or("").to_string();
        RunConfig {
            env: strings(&c["Env"])
                .into_iter()
                .filter_map(|kv| kv.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
                .filter(|(k, v)| !k.is_empty() && !k.contains('\0') && !v.contains('\0'))
                .collect(),
            workdir: text(&c["WorkingDir"]),
            user: text(&c["User"]),
            entrypoint: strings(&c["Entrypoint"]),
            cmd: strings(&c["Cmd"]),
            exposed_ports: keys(&c["ExposedPorts"]),
            labels: c["Labels"]
                .as_object()
                .into_iter()
                .flatten()
                .filter(|(k, _)| !k.starts_with(OWN_LABELS))
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect(),
        }
    }
}

/// An image whose manifest, config and layers are all in the blob store,
/// each verified against its digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchedImage {
    /// Where it came from, pinned: the reference with the digest it named
    /// (`…:tag@sha256:…`), or the archive's path with its manifest's digest.
    pub source: String,
    /// `sha256:<hex>` of the manifest.
    pub manifest_digest: String,
    /// `sha256:<hex>` of the config blob.
    pub config_digest: String,
    /// The layers, bottom first.
    pub layers: Vec<LayerRef>,
    /// Process defaults from the config.
    pub run: RunConfig,
}

/// Everything that can go wrong fetching, importing or unpacking an OCI image.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    /// Not a reference we can pull.
    #[error("invalid image reference {reference:?}: {why}")]
    InvalidReference {
        /// What was given.
        reference: String,
        /// What is wrong with it.
        why: String,
    },
    /// Content does not match the digest that named it.
    #[error("{what} does not match its digest: expected {expected}, got {actual}; nothing of it was kept")]
    DigestMismatch {
        /// What was checked (a manifest, a layer, a config).
        what: String,
        /// The digest that named it.
        expected: String,
        /// The digest of what arrived.
        actual: String,
    },
    /// A digest that is not `sha256:` and 64 lowercase hex digits.
    #[error("unsupported or malformed digest {0:?}: only sha256:<64 hex digits> is accepted")]
    BadDigest(String),
    /// The registry refused or failed a request.
    #[error("registry {registry}: {why}")]
    Registry {
        /// The registry's host.
        registry: String,
        /// What it answered, or why it could not be reached.
        why: String,
    },
    /// The registry wants credentials we do not have, or refused ours.
    #[error(
        "registry {registry} refused access to {repository} ({why}): log in with `docker login {registry}` or \
         `podman login {registry}` (credentials are read from ~/.docker/config.json, $REGISTRY_AUTH_FILE or \
         containers' auth.json)"
    )]
    Unauthorized {
        /// The registry's host.
        registry: String,
        /// The repository.
        repository: String,
        /// What the registry said.
        why: String,
    },
    /// No manifest for this host's platform in an index.
    #[error("{reference} has no image for {platform} (it has: {available})")]
    NoPlatform {
        /// The reference.
        reference: String,
        /// This host's platform.
        platform: String,
        /// The platforms the index lists.
        available: String,
    },
    /// A manifest, config, archive or layer we cannot use.
    #[error("{what}: {why}")]
    Malformed {
        /// What was read.
        what: String,
        /// What is wrong with it.
        why: String,
    },
    /// The pull or import was cancelled.
    #[error("cancelled")]
    Cancelled,
    /// A filesystem operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, naming the path.
        context: String,
        /// The OS error.
        source: std::io::Error,
    },
}

impl OciError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        OciError::Io { context: context.into(), source }
    }

    pub(crate) fn malformed(what: impl Into<String>, why: impl Into<String>) -> Self {
        OciError::Malformed { what: what.into(), why: why.into() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_configs_process_defaults_are_read_and_unusable_env_left_out() {
        let c: serde_json::Value = serde_json::from_str(
            r#"{"Env":["PATH=/bin:/usr/bin","A=b=c","EMPTY=","NOEQUALS","=x","N\u0000UL=1"],"WorkingDir":"/w",
                "User":"1:2","Entrypoint":null,"Cmd":["sh"],"ExposedPorts":{"8080/tcp":{},"53/udp":{}},
                "Labels":{"org.opencontainers.image.title":"t","sandbox-mcp.kind":"snapshot","n":1}}"#,
        )
        .unwrap();
        let run = RunConfig::from_config(&c);
        let env: Vec<_> = run.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        assert_eq!(env, ["A=b=c", "EMPTY=", "PATH=/bin:/usr/bin"]);
        assert_eq!((run.workdir.as_str(), run.user.as_str()), ("/w", "1:2"));
        assert!(run.entrypoint.is_empty());
        assert_eq!(run.cmd, ["sh"]);
        assert_eq!(run.exposed_ports, ["8080/tcp", "53/udp"], "in the config's order");
        assert_eq!(run.labels.into_iter().collect::<Vec<_>>(), [("org.opencontainers.image.title".into(), "t".into())]);
        assert_eq!(RunConfig::from_config(&serde_json::Value::Null), RunConfig::default());
    }
}
