//! Importing OCI image layouts and `docker save` archives into the blob
//! store, and exporting an image as an OCI image layout tar.
//!
//! An archive is hostile like a layer: its member names may hold `..`,
//! absolute paths or symlinks. It is never extracted. A tar is read twice
//! as a stream: once for its names and small JSON members, once to pour the
//! chosen blobs straight into the [`BlobStore`], each verified against its
//! digest as it arrives. A layout directory is read with `openat2` beneath
//! it and without following any symlink. On failure, the blobs this import
//! added are removed again.
//!
//! An export flattens the image's stacked layers into one layer in the
//! confined child (the files belong to the sandbox's ids; their owners are
//! written as the ids inside), and writes layout, index, manifest and config
//! around it into a tar that `skopeo copy oci-archive:` reads.
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

use sandbox_base::size::human_size;

use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
use serde_json::{Value, json};

use super::blobs::{digest_hex, sha256_of};
use super::confined::{self, Job, RESULT_PREFIX};
use super::flatten::FlatLayer;
use super::layers::{components, open_path_dir};
use super::{BlobStore, FetchedImage, LayerRef, OciError, RunConfig, media};
use crate::ImageStore;
use sandbox_userns::IdMapper;

/// Members up to this size are kept in memory by the first pass (index,
/// manifests, configs); larger ones are only ever streamed.
const SMALL: u64 = 4 << 20;
/// Memory the first pass may spend on small members in all.
const SMALL_BUDGET: u64 = 64 << 20;
/// Annotation naming an image in an OCI index.
const REF_NAME: &str = "org.opencontainers.image.ref.name";
/// containerd's (and Docker's) annotation with the full name.
const CONTAINERD_NAME: &str = "io.containerd.image.name";
const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const OCI_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
const OCI_TAR_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
const OCI_TAR_ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";

/// Imports the image in the OCI image layout or `docker save` archive at
/// `path` (a directory, or a tar of one) into `blobs`. With several images
/// in it, `tag` picks one by name, else this host's platform decides.
pub fn import(
    path: &Path,
    blobs: &BlobStore,
    tag: Option<&str>,
    progress: &mut dyn FnMut(&str),
) -> Result<FetchedImage, OciError> {
    let mut layout = Layout::open(path)?;
    let mut added = Vec::new();
    let result = import_from(&mut layout, path, blobs, tag, progress, &mut added);
    if result.is_err() {
        for digest in added {
            if let Ok(p) = blobs.path(&digest) {
                let _ = std::fs::remove_file(p);
            }
        }
    }
    result
}

fn import_from(
    layout: &mut Layout,
    path: &Path,
    blobs: &BlobStore,
    tag: Option<&str>,
    progress: &mut dyn FnMut(&str),
    added: &mut Vec<String>,
) -> Result<FetchedImage, OciError> {
    let what = path.display().to_string();
    let (manifest_digest, manifest, layer_paths, config_bytes) = if let Some(index) = layout.small("index.json")? {
        let (digest, bytes) = oci_manifest(layout, &what, &index, tag)?;
        let manifest = parse(&what, "its manifest", &bytes)?;
        put_small(blobs, "the manifest", &digest, &bytes, added)?;
        let paths = descriptors(&manifest["layers"])
            .map(|d| digest_hex(d["digest"].as_str().unwrap_or("")).map(|h| format!("blobs/sha256/{h}")))
            .collect::<Result<Vec<_>, _>>()?;
        let config = layout.blob(&what, "its config", manifest["config"]["digest"].as_str().unwrap_or(""))?;
        (digest, manifest, paths, config)
    } else if let Some(list) = layout.small("manifest.json")? {
        docker_manifest(layout, &what, &list, tag, blobs, added)?
    } else {
        return Err(OciError::malformed(
            what,
            "neither an OCI image layout (no index.json) nor a docker save archive (no manifest.json)",
        ));
    };
    let config_digest = manifest["config"]["digest"].as_str().unwrap_or("").to_string();
    put_small(blobs, "the config", &config_digest, &config_bytes, added)?;
    let config = parse(&what, "its config", &config_bytes)?;
    let diff_ids: Vec<String> = config["rootfs"]["diff_ids"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|d| d.as_str().map(String::from))
        .collect();
    let descs: Vec<&Value> = descriptors(&manifest["layers"]).collect();
    if descs.len() != diff_ids.len() {
        return Err(OciError::malformed(
            what,
            format!("the manifest lists {} layers but the config {} diff_ids", descs.len(), diff_ids.len()),
        ));
    }
    let mut layers = Vec::new();
    for (d, diff_id) in descs.iter().zip(diff_ids) {
        digest_hex(&diff_id)?;
        let digest = d["digest"].as_str().unwrap_or("").to_string();
        digest_hex(&digest)?;
        let media_type = d["mediaType"].as_str().unwrap_or(OCI_TAR).to_string();
        layers.push(LayerRef { digest, media_type, size: d["size"].as_u64().unwrap_or(0), diff_id });
    }
    let wanted: Vec<(String, String)> = layer_paths.into_iter().zip(layers.iter().map(|l| l.digest.clone())).collect();
    for (_, digest) in &wanted {
        if !blobs.contains(digest) {
            added.push(digest.clone());
        }
    }
    layout.store(&what, &wanted, blobs, progress)?;
    // Pinned like a pulled image's source: the manifest names what was installed.
    let source = format!("{what}@{manifest_digest}");
    Ok(FetchedImage { source, manifest_digest, config_digest, layers, run: RunConfig::from_config(&config["config"]) })
}

fn parse(what: &str, member: &str, bytes: &[u8]) -> Result<Value, OciError> {
    serde_json::from_slice(bytes).map_err(|e| OciError::malformed(what, format!("{member} is not valid JSON: {e}")))
}

fn descriptors(v: &Value) -> impl Iterator<Item = &Value> {
    v.as_array().into_iter().flatten()
}

fn put_small(
    blobs: &BlobStore,
    what: &str,
    digest: &str,
    bytes: &[u8],
    added: &mut Vec<String>,
) -> Result<(), OciError> {
    if !blobs.contains(digest) {
        blobs.put_bytes(what, digest, bytes)?;
        added.push(digest.to_string());
    }
    Ok(())
}

/// The manifest an OCI index leads to, following nested indexes, and its digest.
fn oci_manifest(
    layout: &mut Layout,
    what: &str,
    index: &[u8],
    tag: Option<&str>,
) -> Result<(String, Vec<u8>), OciError> {
    let mut doc = parse(what, "index.json", index)?;
    let mut tag = tag;
    for _ in 0..4 {
        let chosen = choose(what, &doc["manifests"], tag)?;
        tag = None;
        let digest = chosen["digest"].as_str().unwrap_or("").to_string();
        let bytes = layout.blob(what, "a manifest", &digest)?;
        let parsed = parse(what, "a manifest", &bytes)?;
        let kind = chosen["mediaType"].as_str().or(parsed["mediaType"].as_str()).unwrap_or("");
        if kind == media::OCI_INDEX || kind == media::DOCKER_LIST || parsed.get("manifests").is_some() {
            doc = parsed;
            continue;
        }
        return Ok((digest, bytes));
    }
    Err(OciError::malformed(what, "indexes nested more than 4 deep"))
}

/// This host's platform as OCI names it.
fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

/// The descriptor of `manifests` named `tag`, else the only one, else the
/// first for this host's platform.
fn choose<'a>(what: &str, manifests: &'a Value, tag: Option<&str>) -> Result<&'a Value, OciError> {
    let all: Vec<&Value> = descriptors(manifests).collect();
    let name_of = |d: &Value, key: &str| d["annotations"][key].as_str().unwrap_or("").to_string();
    if let Some(tag) = tag {
        let matches = |d: &&&Value| {
            let (short, full) = (name_of(d, REF_NAME), name_of(d, CONTAINERD_NAME));
            short == tag || full == tag || full.ends_with(&format!(":{tag}")) || short.ends_with(&format!(":{tag}"))
        };
        return all.iter().find(matches).copied().ok_or_else(|| {
            let names: Vec<String> = all.iter().map(|d| name_of(d, REF_NAME)).filter(|n| !n.is_empty()).collect();
            OciError::malformed(what, format!("no image named {tag:?} (it has: {})", names.join(", ")))
        });
    }
    if let [only] = all.as_slice() {
        return Ok(only);
    }
    let arch = host_arch();
    fn platform(d: &Value) -> (&str, &str) {
        let p = &d["platform"];
        (p["os"].as_str().unwrap_or(""), p["architecture"].as_str().unwrap_or(""))
    }
    all.iter().find(|d| platform(d) == ("linux", arch)).copied().ok_or_else(|| OciError::NoPlatform {
        reference: what.to_string(),
        platform: format!("linux/{arch}"),
        available: all.iter().map(|d| format!("{}/{}", platform(d).0, platform(d).1)).collect::<Vec<_>>().join(", "),
    })
}

/// From a `docker save` manifest.json: the manifest it implies (stored, as
/// an OCI manifest), its digest, the members holding the layers, and the config.
fn docker_manifest(
    layout: &mut Layout,
    what: &str,
    list: &[u8],
    tag: Option<&str>,
    blobs: &BlobStore,
    added: &mut Vec<String>,
) -> Result<(String, Value, Vec<String>, Vec<u8>), OciError> {
    let list = parse(what, "manifest.json", list)?;
    let images: Vec<&Value> = descriptors(&list).collect();
    let tags = |d: &Value| descriptors(&d["RepoTags"]).filter_map(|t| t.as_str().map(String::from)).collect::<Vec<_>>();
    let image = match (tag, images.as_slice()) {
        (Some(tag), _) => images.iter().find(|d| tags(d).iter().any(|t| t == tag || t.ends_with(&format!(":{tag}")))),
        (None, [only]) => Some(only),
        (None, _) => None,
    };
    let image = image.ok_or_else(|| {
        let all: Vec<String> = images.iter().flat_map(|d| tags(d)).collect();
        OciError::malformed(what, format!("name the image to import: it holds {} ({})", images.len(), all.join(", ")))
    })?;
    let config_path = image["Config"].as_str().unwrap_or("");
    let config = layout.small(config_path)?.ok_or_else(|| missing(what, config_path))?;
    let config_digest = sha256_of(&config);
    // Its name says its digest (`<hex>.json`, `blobs/sha256/<hex>`).
    let named = config_path.rsplit('/').next().unwrap_or("").trim_end_matches(".json");
    if named.len() == 64 && format!("sha256:{named}") != config_digest {
        return Err(OciError::DigestMismatch {
            what: format!("{what}: {config_path}"),
            expected: format!("sha256:{named}"),
            actual: config_digest,
        });
    }
    let diff_ids: Vec<String> = descriptors(&parse(what, "its config", &config)?["rootfs"]["diff_ids"])
        .filter_map(|d| d.as_str().map(String::from))
        .collect();
    let paths: Vec<String> = descriptors(&image["Layers"]).filter_map(|p| p.as_str().map(String::from)).collect();
    let mut layers = Vec::new();
    for (i, p) in paths.iter().enumerate() {
        let (size, magic) = layout.probe(p)?.ok_or_else(|| missing(what, p))?;
        let media_type = match magic {
            [0x1f, 0x8b, ..] => OCI_TAR_GZIP,
            [0x28, 0xb5, 0x2f, 0xfd] => OCI_TAR_ZSTD,
            _ => OCI_TAR,
        };
        let digest = match p.strip_prefix("blobs/sha256/") {
            Some(hex) => format!("sha256:{hex}"),
            // The old layout's `<id>/layer.tar` is an uncompressed tar,
            // whose digest is its diff_id.
            None if media_type == OCI_TAR => diff_ids.get(i).cloned().unwrap_or_default(),
            None => return Err(OciError::malformed(what, format!("{p} is compressed but not named by its digest"))),
        };
        layers.push(json!({"mediaType": media_type, "digest": digest, "size": size}));
    }
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": media::OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": config_digest, "size": config.len()},
        "layers": layers,
    });
    let bytes = serde_json::to_vec(&manifest).map_err(|e| OciError::malformed(what, e.to_string()))?;
    let digest = sha256_of(&bytes);
    put_small(blobs, "the manifest", &digest, &bytes, added)?;
    Ok((digest, manifest, paths, config))
}

fn missing(what: &str, member: &str) -> OciError {
    OciError::malformed(what, format!("{member:?} is missing (or not a regular file)"))
}

/// A regular member of a tar: its size, first bytes, and whole content if small.
struct Member {
    size: u64,
    magic: [u8; 4],
    content: Option<Vec<u8>>,
}

/// Where an import reads from.
enum Layout {
    /// A layout directory, every member opened beneath it without symlinks.
    Dir(std::os::fd::OwnedFd),
    /// A tar (maybe gzipped): its regular members, and its path for the second pass.
    Tar(HashMap<String, Member>, std::path::PathBuf),
}

/// `path` (a tar, maybe gzipped) as a stream of its uncompressed bytes.
fn tar_stream(path: &Path) -> Result<Box<dyn Read>, OciError> {
    let mut file =
        BufReader::new(File::open(path).map_err(|e| OciError::io(format!("opening {}", path.display()), e))?);
    let head =
        std::io::BufRead::fill_buf(&mut file).map_err(|e| OciError::io(format!("reading {}", path.display()), e))?;
    Ok(if head.starts_with(&[0x1f, 0x8b]) { Box::new(flate2::read::MultiGzDecoder::new(file)) } else { Box::new(file) })
}

/// A member name, normalized; `..` and absolute names fail the archive.
fn member_name(what: &str, raw: &[u8]) -> Result<String, OciError> {
    let shown = String::from_utf8_lossy(raw);
    let comps = components(raw).map_err(|why| OciError::malformed(what, format!("member {shown:?} {why}")))?;
    Ok(comps.iter().map(|c| String::from_utf8_lossy(c)).collect::<Vec<_>>().join("/"))
}

impl Layout {
    fn open(path: &Path) -> Result<Self, OciError> {
        let md = std::fs::metadata(path).map_err(|e| OciError::io(format!("reading {}", path.display()), e))?;
        if md.is_dir() {
            return open_path_dir(path).map(Layout::Dir);
        }
        let what = path.display().to_string();
        let bad = |e: std::io::Error| OciError::malformed(&what, format!("not a readable tar: {e}"));
        let mut members = HashMap::new();
        let mut budget = SMALL_BUDGET;
        let mut archive = tar::Archive::new(tar_stream(path)?);
        for entry in archive.entries().map_err(bad)? {
            let mut entry = entry.map_err(bad)?;
            let name = member_name(&what, &entry.path_bytes())?;
            if !entry.header().entry_type().is_file() {
                continue;
            }
            let size = entry.size();
            let mut magic = [0u8; 4];
            let content = if size <= SMALL && size <= budget {
                budget -= size;
                let mut buf = Vec::with_capacity(size as usize);
                entry.read_to_end(&mut buf).map_err(bad)?;
                let n = buf.len().min(4);
                magic[..n].copy_from_slice(&buf[..n]);
                Some(buf)
            } else {
                let mut got = 0;
                while got < 4 {
                    match entry.read(&mut magic[got..]).map_err(bad)? {
                        0 => break,
                        n => got += n,
                    }
                }
                None
            };
            members.insert(name, Member { size, magic, content });
        }
        Ok(Layout::Tar(members, path.to_path_buf()))
    }

    /// A member opened beneath the layout directory, never through a symlink.
    fn open_member(dir: &std::os::fd::OwnedFd, name: &str) -> Result<Option<File>, OciError> {
        let how =
            OpenHow::new().flags(OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK).resolve(
                ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_NO_MAGICLINKS,
            );
        match openat2(dir, name, how) {
            Ok(fd) => {
                let file = File::from(fd);
                let regular = file.metadata().is_ok_and(|m| m.is_file());
                Ok(regular.then_some(file))
            }
            Err(nix::errno::Errno::ENOENT) => Ok(None),
            Err(e) => Err(OciError::io(format!("opening {name}"), e.into())),
        }
    }

    /// A small member's content, `None` if there is no such regular file.
    fn small(&mut self, name: &str) -> Result<Option<Vec<u8>>, OciError> {
        let name = member_name("the archive", name.as_bytes())?;
        match self {
            Layout::Tar(members, path) => match members.get(&name) {
                Some(Member { content: Some(c), .. }) => Ok(Some(c.clone())),
                Some(_) => Err(OciError::malformed(path.display().to_string(), format!("{name} is too large"))),
                None => Ok(None),
            },
            Layout::Dir(dir) => {
                let Some(file) = Self::open_member(dir, &name)? else { return Ok(None) };
                let mut buf = Vec::new();
                file.take(SMALL + 1).read_to_end(&mut buf).map_err(|e| OciError::io(format!("reading {name}"), e))?;
                if buf.len() as u64 > SMALL {
                    return Err(OciError::malformed(name, "too large for a manifest or config"));
                }
                Ok(Some(buf))
            }
        }
    }

    /// A small blob by digest, checked against it.
    fn blob(&mut self, what: &str, member: &str, digest: &str) -> Result<Vec<u8>, OciError> {
        let path = format!("blobs/sha256/{}", digest_hex(digest)?);
        let bytes = self.small(&path)?.ok_or_else(|| missing(what, &path))?;
        let actual = sha256_of(&bytes);
        if actual != digest {
            return Err(OciError::DigestMismatch {
                what: format!("{what}: {member}"),
                expected: digest.into(),
                actual,
            });
        }
        Ok(bytes)
    }

    /// A member's size and first bytes.
    fn probe(&mut self, name: &str) -> Result<Option<(u64, [u8; 4])>, OciError> {
        let name = member_name("the archive", name.as_bytes())?;
        match self {
            Layout::Tar(members, _) => Ok(members.get(&name).map(|m| (m.size, m.magic))),
            Layout::Dir(dir) => {
                let Some(mut file) = Self::open_member(dir, &name)? else { return Ok(None) };
                let size = file.metadata().map_err(|e| OciError::io(format!("reading {name}"), e))?.len();
                let mut magic = [0u8; 4];
                let n = file.read(&mut magic).map_err(|e| OciError::io(format!("reading {name}"), e))?;
                magic[n..].fill(0);
                Ok(Some((size, magic)))
            }
        }
    }

    /// Streams the members `wanted` (name, digest) into `blobs`, each
    /// verified on the way in.
    fn store(
        &mut self,
        what: &str,
        wanted: &[(String, String)],
        blobs: &BlobStore,
        progress: &mut dyn FnMut(&str),
    ) -> Result<(), OciError> {
        let total = wanted.len();
        let label = |i: usize, d: &str| format!("layer {}/{total} ({d}) of {what}", i + 1);
        match self {
            Layout::Dir(dir) => {
                for (i, (name, digest)) in wanted.iter().enumerate() {
                    let mut file = Self::open_member(dir, name)?.ok_or_else(|| missing(what, name))?;
                    progress(&format!("storing {}", label(i, digest)));
                    blobs.put(&label(i, digest), digest, |_| Ok(()), &mut file)?;
                }
            }
            Layout::Tar(members, path) => {
                for (name, _) in wanted {
                    if !members.contains_key(&member_name(what, name.as_bytes())?) {
                        return Err(missing(what, name));
                    }
                }
                let bad = |e: std::io::Error| OciError::malformed(what, format!("not a readable tar: {e}"));
                let mut archive = tar::Archive::new(tar_stream(path)?);
                for entry in archive.entries().map_err(bad)? {
                    let mut entry = entry.map_err(bad)?;
                    if !entry.header().entry_type().is_file() {
                        continue;
                    }
                    let name = member_name(what, &entry.path_bytes())?;
                    for (i, (_, digest)) in wanted.iter().enumerate().filter(|(_, (n, _))| *n == name) {
                        if blobs.contains(digest) {
                            continue;
                        }
                        progress(&format!("storing {}", label(i, digest)));
                        blobs.put(&label(i, digest), digest, |_| Ok(()), &mut entry)?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// Writes image `name` of `store` as an OCI image layout tar at `dest`
/// (which must not exist): one gzipped layer holding the image's files as
/// its sandboxes see them, owners as the ids inside, named `name` in the
/// index. Reading the files takes the sandbox's ids, so `mapper`'s.
pub fn export(
    store: &ImageStore,
    name: &str,
    mapper: &IdMapper,
    dest: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<(), OciError> {
    let image_err = |e: crate::ImageError| OciError::malformed(format!("image '{name}'"), e.to_string());
    let info = store.get(name).map_err(image_err)?;
    info.check_id_map(mapper.id_map()).map_err(image_err)?;
    if !info.reference.is_empty() {
        return Err(OciError::malformed(
            format!("image '{name}'"),
            format!("its files are the VM layer's ({}), not on this host", info.reference),
        ));
    }
    if dest.symlink_metadata().is_ok() {
        return Err(OciError::io(
            format!("exporting to {}", dest.display()),
            std::io::Error::new(std::io::ErrorKind::AlreadyExists, "refusing to overwrite it"),
        ));
    }
    let (dir, file) = match (dest.parent(), dest.file_name()) {
        (Some(d), Some(f)) => (if d.as_os_str().is_empty() { Path::new(".") } else { d }, f.to_string_lossy()),
        _ => return Err(OciError::malformed(dest.display().to_string(), "not a file path")),
    };
    let temp = Temp(vec![
        dir.join(format!(".{file}.layer-{}", std::process::id())),
        dir.join(format!(".{file}.partial-{}", std::process::id())),
    ]);
    let layer_dirs = store
        .layer_paths(&info.layers())
        .iter()
        .map(|p| open_path_dir(p).map(File::from))
        .collect::<Result<Vec<_>, _>>()?;
    let create = |p: &Path| {
        File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(p)
            .map_err(|e| OciError::io(format!("creating {}", p.display()), e))
    };
    let out = create(&temp.0[0])?;
    progress(&format!("flattening the {} layers of image {name}", layer_dirs.len()));
    let job = Job::Flatten { layers: layer_dirs.iter().map(confined::fd_of).collect(), out: confined::fd_of(&out) };
    let mut handed: Vec<&File> = layer_dirs.iter().collect();
    handed.push(&out);
    let stdout = confined::run(mapper, &job, &handed)?;
    let flat: FlatLayer = stdout
        .lines()
        .find_map(|l| l.strip_prefix(RESULT_PREFIX))
        .and_then(|l| serde_json::from_str(l).ok())
        .ok_or_else(|| OciError::malformed("the flattened layer", "the confined job reported no result"))?;
    let c = &info.config;
    let config = serde_json::to_vec(&json!({
        "architecture": host_arch(),
        "os": "linux",
        "config": {
            "Env": c.env.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>(),
            "WorkingDir": c.workdir,
            "User": c.user,
        },
        "rootfs": {"type": "layers", "diff_ids": [flat.diff_id]},
        "history": [{"created_by": format!("sandbox-mcp image export {name}")}],
    }))
    .map_err(|e| OciError::malformed("the config", e.to_string()))?;
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": media::OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": sha256_of(&config), "size": config.len()},
        "layers": [{"mediaType": OCI_TAR_GZIP, "digest": flat.digest, "size": flat.size}],
    }))
    .map_err(|e| OciError::malformed("the manifest", e.to_string()))?;
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": media::OCI_INDEX,
        "manifests": [{
            "mediaType": media::OCI_MANIFEST,
            "digest": sha256_of(&manifest),
            "size": manifest.len(),
            "annotations": {REF_NAME: name},
        }],
    }))
    .map_err(|e| OciError::malformed("the index", e.to_string()))?;
    let tar_err = |e: std::io::Error| OciError::io(format!("writing {}", temp.0[1].display()), e);
    let mut tar = tar::Builder::new(create(&temp.0[1])?);
    let mut add = |path: String, size: u64, data: &mut dyn Read| {
        let mut h = tar::Header::new_ustar();
        let dir = path.ends_with('/');
        h.set_entry_type(if dir { tar::EntryType::Directory } else { tar::EntryType::Regular });
        h.set_mode(if dir { 0o755 } else { 0o644 });
        h.set_size(size);
        // The exporter's own ids, and directories listed: skopeo, unpacking
        // the archive as an ordinary user, chowns each entry to the ids
        // recorded, and a directory it has to make up to root's.
        h.set_uid(u64::from(nix::unistd::geteuid().as_raw()));
        h.set_gid(u64::from(nix::unistd::getegid().as_raw()));
        tar.append_data(&mut h, path, data).map_err(tar_err)
    };
    add("blobs/".into(), 0, &mut std::io::empty())?;
    add("blobs/sha256/".into(), 0, &mut std::io::empty())?;
    add("oci-layout".into(), 30, &mut &br#"{"imageLayoutVersion":"1.0.0"}"#[..])?;
    add("index.json".into(), index.len() as u64, &mut &index[..])?;
    for blob in [&config, &manifest] {
        add(format!("blobs/sha256/{}", digest_hex(&sha256_of(blob))?), blob.len() as u64, &mut &blob[..])?;
    }
    let mut layer = File::open(&temp.0[0]).map_err(|e| OciError::io(format!("reading {}", temp.0[0].display()), e))?;
    add(format!("blobs/sha256/{}", digest_hex(&flat.digest)?), flat.size, &mut layer)?;
    let written = tar.into_inner().map_err(tar_err)?;
    written.sync_all().map_err(tar_err)?;
    // A link, not a rename: it fails rather than replace a file that
    // appeared at `dest` meanwhile.
    std::fs::hard_link(&temp.0[1], dest).map_err(|e| OciError::io(format!("creating {}", dest.display()), e))?;
    progress(&format!("exported image {name} to {} ({})", dest.display(), human_size(flat.size)));
    Ok(())
}

/// Files removed when the export ends, whichever way.
struct Temp(Vec<std::path::PathBuf>);

impl Drop for Temp {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

#[cfg(test)]
#[path = "archive_tests.rs"]
mod tests;
