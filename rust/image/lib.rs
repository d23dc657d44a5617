//! The local image store and the mmdebstrap image builder.
//!
//! An image is a Debian root filesystem that sandboxes boot from (read-only,
//! as the lower layer of an overlay). On disk, per image:
//!
//! ```text
//! <store>/<name>/rootfs/       a base image's tree, owned by the id range in image.json
//! <store>/<name>/image.json    ImageInfo (serde)
//! <store>/layers/<hex id>/     a committed layer (a VM's writable layer, copied)
//! ```
//!
//! A committed image stacks its VM's image layers plus one new layer; its
//! `layers` list names them relative to the store root, bottom first. A layer
//! is removed once no image and no VM uses it (see `layers`). An image
//! directory may be a symlink to a shared prebuilt image: it is read through
//! the link, and deleting the image removes only the link.
//!
//! A build unpacks mmdebstrap's tarball as root of a user namespace carrying
//! the helper's id map ([`IdMap`]), so the files get exactly the host ids a
//! sandbox maps and nothing is chowned by host id: root inside a sandbox is
//! never root on the host. The map is recorded in `image.json`; an image
//! unpacked for another map (another user, or root before a user took its
//! range) is refused with the advice to rebuild it.
//!
//! - `store`: listing, lookup and the build sequence (temp dir, atomic rename).
//! - `mmdebstrap`: running mmdebstrap with the host's apt sources as mirrors.
//! - `unpack`: unpacking mmdebstrap's tarball through the sandbox's id map.
//! - `inspect`: what a built tree provides (shell, package manager, size).
//! - `layers`: committing layers, deleting images and layer garbage collection.
//! - `copy`: copying a writable layer exactly (owners, xattrs, whiteouts).
use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use sandbox_userns::IdMap;

#[cfg(linux_host)]
mod build;
#[cfg(linux_host)]
mod copy;
mod inspect;
mod layers;
#[cfg(linux_host)]
mod mmdebstrap;
pub mod oci;
mod refs;
mod store;
#[cfg(linux_host)]
mod unpack;

#[cfg(linux_host)]
pub use copy::copy_tree;
pub use inspect::disk_usage;
pub use layers::{MAX_LAYERS, StagedLayer};
pub use refs::{Holder, StoreGuard};
pub use store::ImageStore;

/// Name of the default image, the one sandboxes boot from unless told otherwise.
pub const DEFAULT_IMAGE: &str = "mcp-dev";

/// Debian suite images are built from unless the request names another.
pub const DEFAULT_SUITE: &str = "bookworm";

/// Packages of the default image `mcp-dev`: enough for agents to run Python and
/// Node projects, clone repositories and install more with apt.
pub fn default_packages() -> Vec<String> {
    ["python3", "python3-pip", "python3-venv", "git", "curl", "ca-certificates", "nodejs", "npm", "gpgv", "procps"]
        .into_iter()
        .map(String::from)
        .collect()
}

/// What an image built here gets besides its packages, counted up when it
/// changes: `image build` without `--force` rebuilds an image of an older
/// recipe, as one built for another id map. 1: `/etc/pip.conf` lets a plain
/// `pip install` work (the mmdebstrap module's `PIP_CONF`).
pub const RECIPE: u32 = 1;

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Packages every image gets whatever was asked for: apt inside a sandbox
/// cannot verify its lists without `gpgv`, nor reach https mirrors without
/// `ca-certificates`.
const REQUIRED_PACKAGES: [&str; 2] = ["gpgv", "ca-certificates"];

/// A built image, as stored in `image.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageInfo {
    /// Name used to select the image (`VmSpec.image`).
    pub name: String,
    /// Disk usage of the root filesystem in bytes (allocated blocks, hard
    /// links counted once).
    pub size_bytes: u64,
    /// Unix time in milliseconds when the build finished.
    pub created_at_ms: i64,
    /// Shell for `sh -c` style commands: `/bin/bash` if present, else `/bin/sh`.
    pub shell: String,
    /// Package manager the image carries: "apt", "apk", "dnf" or "".
    pub package_manager: String,
    /// The user-namespace id map the tree was unpacked through: its files
    /// carry the host ids this map gives their ids inside, so only a sandbox
    /// with the same map sees them with their right owners.
    pub id_map: IdMap,
    /// Image this one was committed on top of; empty for a base image.
    /// The build recipe an image built here had ([`RECIPE`]); 0 for one
    /// built before recipes were counted, or not built here (pulled,
    /// committed).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub recipe: u32,
    #[serde(default)]
    pub parent: String,
    /// Layer directories relative to the store root, bottom first. Empty
    /// means the base layout, `["<name>/rootfs"]` (see [`ImageInfo::layers`]).
    #[serde(default)]
    pub layers: Vec<String>,
    /// Process defaults of VMs booted from the image.
    #[serde(default)]
    pub config: ImageConfig,
    /// Free-form metadata given at commit.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// An OCI reference the VM layer pulls the image's files from (a Mac's
    /// helper, through containerization's image store) instead of a
    /// `rootfs` here ([`ImageStore::add_reference`]); `layers` then holds
    /// only what was committed on top. Empty for images built here.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reference: String,
    /// Where an image pulled or imported on this host came from (the
    /// reference with its manifest digest, or the archive); its files are
    /// in `rootfs` here like a built image's. Empty for images built here.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source: String,
}

impl ImageInfo {
    /// The layers the image stacks, relative to the store root, bottom first.
    pub fn layers(&self) -> Vec<String> {
        if self.layers.is_empty() && self.reference.is_empty() {
            vec![format!("{}/rootfs", self.name)]
        } else {
            self.layers.clone()
        }
    }

    /// Refuses an image whose files were unpacked for another id map than
    /// `map`: its owners would be wrong (or unmapped) in the sandbox.
    pub fn check_id_map(&self, map: &IdMap) -> Result<(), ImageError> {
        if &self.id_map == map {
            return Ok(());
        }
        // The bottom layer is `<base image>/rootfs`.
        let layers = self.layers();
        let base = layers.first().and_then(|l| l.split('/').next()).unwrap_or(&self.name);
        Err(ImageError::OtherIdMap {
            name: self.name.clone(),
            base: base.to_string(),
            built: self.id_map.describe(),
            wanted: map.describe(),
        })
    }
}

/// Process defaults an image carries (a Containerfile's ENV, WORKDIR, USER).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageConfig {
    /// Environment every process starts with, under the VM's and the
    /// process's own.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory recorded by the image (informational).
    #[serde(default)]
    pub workdir: String,
    /// Default user of processes; empty means root.
    #[serde(default)]
    pub user: String,
    /// An OCI image's Entrypoint, recorded and shown (tools run what they are asked).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub entrypoint: Vec<String>,
    /// An OCI image's Cmd, likewise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cmd: Vec<String>,
    /// An OCI image's ExposedPorts (`8080/tcp`), shown.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exposed_ports: Vec<String>,
}

/// What to build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildRequest {
    /// Image name, `^[a-z0-9][a-z0-9._-]{0,62}$`.
    pub name: String,
    /// Debian suite, e.g. "bookworm"; empty means [`DEFAULT_SUITE`].
    pub suite: String,
    /// Packages on top of minbase; `gpgv` and `ca-certificates` are always added.
    pub packages: Vec<String>,
    /// Rebuild even if an image of that name exists (it is replaced only once
    /// the new build succeeded).
    pub force: bool,
}

impl BuildRequest {
    /// Checks the name, suite and packages without touching the disk.
    pub fn check(&self) -> Result<(), ImageError> {
        validate_name(&self.name)?;
        if self.name == layers::LAYERS_DIR {
            return Err(ImageError::InvalidName(self.name.clone()));
        }
        validate_suite(if self.suite.is_empty() { DEFAULT_SUITE } else { &self.suite })?;
        package_list(&self.packages).map(|_| ())
    }
}

/// Checks an OCI reference (`[registry/]repository[:tag][@digest]`) as far
/// as a record needs: the characters references use, no leading `-` or
/// `/`, at most 255 bytes. The registry is the judge of the rest.
pub fn validate_reference(reference: &str) -> Result<(), ImageError> {
    let bytes = reference.as_bytes();
    let ok = matches!(bytes.first(), Some(c) if c.is_ascii_alphanumeric())
        && bytes.len() <= 255
        && bytes.iter().all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-' | b'/' | b':' | b'@'));
    if ok { Ok(()) } else { Err(ImageError::InvalidReference(reference.to_string())) }
}

/// Everything that can go wrong with images.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The name breaks the naming rule.
    #[error("invalid image name {0:?}: must match ^[a-z0-9][a-z0-9._-]{{0,62}}$")]
    InvalidName(String),
    /// The image is an OCI reference, and the driver asked for cannot pull.
    #[error(
        "image '{name}' is the OCI image {reference}, which only a driver that pulls images boots (the macOS \
         helper's); the {driver} driver boots images built here (`sandbox-mcp image build`)"
    )]
    NeedsPull {
        /// The image.
        name: String,
        /// What it would be pulled from.
        reference: String,
        /// The driver that cannot.
        driver: String,
    },
    /// Not an OCI reference.
    #[error(
        "invalid image reference {0:?}: must be [registry/]repository[:tag][@digest] of [A-Za-z0-9._/:@-], up to 255 \
         characters, starting with a letter or digit"
    )]
    InvalidReference(String),
    /// A package name apt would not accept (or that could smuggle in an option).
    #[error("invalid package name {0:?}: must match ^[a-z0-9][a-z0-9+.:=~-]*$")]
    InvalidPackage(String),
    /// The suite name is not a plain Debian codename.
    #[error("invalid suite {0:?}: must match ^[a-z][a-z0-9-]*$")]
    InvalidSuite(String),
    /// No image of that name in the store.
    #[error("image {0:?} not found")]
    NotFound(String),
    /// An image of that name exists already.
    #[error("image {0:?} already exists")]
    AlreadyExists(String),
    /// Other images record this one as their parent.
    #[error("image '{name}' is the parent of {}: delete those first", quoted(.children))]
    HasChildren {
        /// The image that was to be deleted.
        name: String,
        /// The images committed on top of it.
        children: Vec<String>,
    },
    /// A commit would stack more layers than a VM can mount.
    #[error("image {name:?} would stack more than {max} layers; rebuild or flatten the base instead")]
    TooManyLayers {
        /// The image that was to be committed.
        name: String,
        /// The limit.
        max: usize,
    },
    /// Copying a layer failed.
    #[error("copying {what}: {detail}")]
    CopyFailed {
        /// What was being copied.
        what: String,
        /// The copier's complaint.
        detail: String,
    },
    /// The builder is not installed.
    #[error("mmdebstrap not found: install the `mmdebstrap` package (apt-get install mmdebstrap)")]
    MmdebstrapMissing,
    /// mmdebstrap ran and failed.
    #[error("mmdebstrap failed ({status}); last output:\n{stderr_tail}")]
    BuildFailed {
        /// Its exit status.
        status: String,
        /// The last lines it wrote to stderr.
        stderr_tail: String,
    },
    /// The image's files were unpacked for another id map than this user's
    /// sandboxes use.
    #[error(
        "image '{name}' was built for other ids ({built}) than this user's sandboxes map ({wanted}), e.g. by \
         another user or before the id ranges changed: rebuild it with `sandbox-mcp image build --name {base} \
         --force` (then commit again what was committed on it)"
    )]
    OtherIdMap {
        /// The image.
        name: String,
        /// Its base image, the one to rebuild.
        base: String,
        /// The map it was built for.
        built: String,
        /// The map of this user's sandboxes.
        wanted: String,
    },
    /// Unpacking the built tree through the id map failed.
    #[error("unpacking the image as the sandbox's ids failed: {0}")]
    Unpack(String),
    /// Pulling, importing or unpacking an OCI image failed.
    #[error(transparent)]
    Oci(#[from] oci::OciError),
    /// `image.json` is unreadable or malformed.
    #[error("{path}: bad image metadata: {source}")]
    Metadata {
        /// The metadata file.
        path: PathBuf,
        /// What serde said.
        source: serde_json::Error,
    },
    /// A filesystem or process operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, naming the path.
        context: String,
        /// The OS error.
        source: std::io::Error,
    },
}

impl ImageError {
    fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        ImageError::Io { context: context.into(), source }
    }
}

fn quoted(names: &[String]) -> String {
    names.iter().map(|n| format!("'{n}'")).collect::<Vec<_>>().join(", ")
}

/// Checks an image name: `^[a-z0-9][a-z0-9._-]{0,62}$`. The name becomes a
/// directory, so this is also what keeps `..` and `/` out of the store.
pub fn validate_name(name: &str) -> Result<(), ImageError> {
    let bytes = name.as_bytes();
    let ok = matches!(bytes.first(), Some(c) if c.is_ascii_lowercase() || c.is_ascii_digit())
        && bytes.len() <= 63
        && bytes.iter().all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'.' | b'_' | b'-'));
    if ok { Ok(()) } else { Err(ImageError::InvalidName(name.to_string())) }
}

fn validate_package(name: &str) -> Result<(), ImageError> {
    let bytes = name.as_bytes();
    let ok = matches!(bytes.first(), Some(c) if c.is_ascii_lowercase() || c.is_ascii_digit())
        && bytes.iter().all(|&c| {
            c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'+' | b'.' | b':' | b'=' | b'~' | b'-')
        });
    if ok { Ok(()) } else { Err(ImageError::InvalidPackage(name.to_string())) }
}

fn validate_suite(suite: &str) -> Result<(), ImageError> {
    let bytes = suite.as_bytes();
    let ok = matches!(bytes.first(), Some(c) if c.is_ascii_lowercase())
        && bytes.iter().all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-');
    if ok { Ok(()) } else { Err(ImageError::InvalidSuite(suite.to_string())) }
}

/// The package list actually installed: the request's, plus the required
/// ones, without duplicates, in a stable order.
fn package_list(requested: &[String]) -> Result<Vec<String>, ImageError> {
    let mut out: Vec<String> = Vec::new();
    for p in requested.iter().map(String::as_str).chain(REQUIRED_PACKAGES) {
        validate_package(p)?;
        if !out.iter().any(|q| q == p) {
            out.push(p.to_string());
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_rule() {
        for ok in ["mcp-dev", "a", "0", "x.y_z-1", &"a".repeat(63)] {
            assert!(validate_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-a", ".a", "_a", "A", "a/b", "..", "a b", "é", &"a".repeat(64)] {
            let err = validate_name(bad).unwrap_err();
            assert!(matches!(err, ImageError::InvalidName(_)), "{bad}");
            assert!(err.to_string().contains("^[a-z0-9][a-z0-9._-]{0,62}$"), "{err}");
        }
    }

    #[test]
    fn package_list_adds_required_once_and_rejects_options() {
        let got = package_list(&["python3".into(), "gpgv".into()]).unwrap();
        assert_eq!(got, ["python3", "gpgv", "ca-certificates"]);
        assert!(matches!(package_list(&["--foo".into()]), Err(ImageError::InvalidPackage(_))));
        assert!(matches!(package_list(&["a,b".into()]), Err(ImageError::InvalidPackage(_))));
        assert!(package_list(&["libstdc++6".into(), "g++".into()]).is_ok());
    }

    #[test]
    fn suites_are_plain_codenames() {
        assert!(validate_suite("bookworm").is_ok());
        assert!(validate_suite("bookworm-backports").is_ok());
        for bad in ["", "Bookworm", "../x", "-x", "a b"] {
            assert!(matches!(validate_suite(bad), Err(ImageError::InvalidSuite(_))), "{bad}");
        }
    }

    #[test]
    fn default_packages_include_apt_essentials() {
        let p = default_packages();
        for must in REQUIRED_PACKAGES.iter().chain(&["python3", "git"]) {
            assert!(p.iter().any(|q| q == must), "{must}");
        }
    }
}
