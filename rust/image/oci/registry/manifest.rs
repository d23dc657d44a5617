//! Manifests, indexes and image configs as read from a registry's bytes,
//! and the choice of this host's platform among an index's entries.
use serde::Deserialize;

use super::errors::clean;
use crate::oci::reference::Reference;
use crate::oci::{OciError, media};

/// A manifest or index, as much of either as we read.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Manifest {
    pub(super) schema_version: u32,
    #[serde(default)]
    pub(super) media_type: Option<String>,
    #[serde(default)]
    pub(super) config: Option<Descriptor>,
    #[serde(default)]
    pub(super) layers: Vec<Descriptor>,
    #[serde(default)]
    pub(super) manifests: Option<Vec<Descriptor>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Descriptor {
    pub(super) media_type: String,
    pub(super) digest: String,
    pub(super) size: u64,
    #[serde(default)]
    pub(super) platform: Option<Platform>,
}

#[derive(Deserialize)]
pub(super) struct Platform {
    pub(super) architecture: String,
    pub(super) os: String,
    #[serde(default)]
    pub(super) variant: Option<String>,
}

/// An image config, as much as we read.
#[derive(Deserialize)]
pub(super) struct ImageConfig {
    pub(super) rootfs: RootFs,
}

#[derive(Deserialize)]
pub(super) struct RootFs {
    #[serde(rename = "type")]
    pub(super) kind: String,
    pub(super) diff_ids: Vec<String>,
}

/// Whether parsed manifest bytes are an index (true) or an image manifest.
pub(super) fn is_index(m: &Manifest, what: &str) -> Result<bool, OciError> {
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
pub(super) fn host_platform() -> (&'static str, Option<&'static str>) {
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
pub(super) fn choose_platform<'a>(
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

pub(super) fn platform_name(entry: &Descriptor) -> String {
    entry.platform.as_ref().map_or_else(String::new, |p| clean(&format!("{}/{}", p.os, p.architecture)))
}

pub(super) fn parse<T: for<'de> Deserialize<'de>>(what: &str, bytes: &[u8]) -> Result<T, OciError> {
    serde_json::from_slice(bytes).map_err(|e| OciError::malformed(what, clean(&e.to_string())))
}
