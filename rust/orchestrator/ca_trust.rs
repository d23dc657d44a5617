//! Host CA trust (`trust_host_ca`, on by default). Companies, and some
//! networks, re-sign TLS with a CA the host trusts and images do not: without
//! this, `pip` and `curl` over HTTPS fail inside a sandbox while they work on
//! the host. At creation the sandbox's trust store becomes the image's bundle
//! plus the host's certificates it lacks (nothing is written on the host):
//! - [`SYSTEM`], the Debian/Alpine system store most programs read (a
//!   regular file, replacing a symlink there);
//! - [`BUNDLE`], a symlink to it, which the variables of [`env`] (pip,
//!   requests, node, git, curl, OpenSSL) name from the VM's base environment;
//! - [`LOCAL`], the host's extra certificates alone, so an
//!   `update-ca-certificates` inside (a package install may run it)
//!   rebuilds [`SYSTEM`] with them, and [`BUNDLE`] follows.
//!
//! The first sandbox of an image reads the image's bundle with one CopyOut
//! after its start and writes the files with one CopyIn (~6 ms). What it
//! wrote is kept per image ([`SeedCache`]; images do not change under their
//! name without a new build time): later sandboxes of that image get the
//! same files placed in their writable layer by the helper before they start
//! (`VmSpec.files`), at no cost on the create path.
//!
//! A restored snapshot or clone already holds them: certificates are added
//! only if missing, so doing it again changes nothing.
use std::{
    collections::{HashMap, HashSet},
    io::Read,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::SystemTime,
};

use super::{
    error::OrchestratorError,
    helper_client::{HelperError, RootfsFile},
    sandbox::{Sandbox, SandboxManager},
};

/// The sandbox's full bundle, named by the variables of [`env`].
pub const BUNDLE: &str = "/etc/sandbox-mcp/ca-bundle.crt";
/// The system store of Debian-like images, replaced by the full bundle.
pub const SYSTEM: &str = "/etc/ssl/certs/ca-certificates.crt";
/// The host's certificates the image lacks, where update-ca-certificates
/// picks them up again.
pub const LOCAL: &str = "/usr/local/share/ca-certificates/sandbox-mcp-host.crt";
/// Where hosts keep their bundle, in order (after `SSL_CERT_FILE`).
const HOST_BUNDLES: [&str; 3] =
    ["/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem"];
/// Variables that make TLS clients read [`BUNDLE`].
const VARIABLES: [&str; 6] =
    ["SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT", "NODE_EXTRA_CA_CERTS", "GIT_SSL_CAINFO", "CURL_CA_BUNDLE"];
/// Larger bundles are not read (a real one is well under 1 MiB).
const MAX_BUNDLE_BYTES: u64 = 16 << 20;
/// Symlinks followed to the image's bundle (Fedora-like images chain two).
const MAX_LINKS: usize = 4;
/// Images whose files are kept ([`SeedCache`]): ~250 KB each.
const SEED_IMAGES: usize = 16;
/// Larger merged bundles are copied in after the start each time rather
/// than sent in a CreateVm (whose message size the helper bounds).
const MAX_SEED_BYTES: usize = 2 << 20;

const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
const END: &str = "-----END CERTIFICATE-----";

/// The base environment of a sandbox that trusts the host's CAs.
pub fn env() -> HashMap<String, String> {
    VARIABLES.iter().map(|k| (k.to_string(), BUNDLE.to_string())).collect()
}

/// One PEM certificate: its text and its body without whitespace (what
/// makes two copies the same certificate).
#[derive(Debug, Clone)]
struct Cert {
    pem: String,
    body: String,
}

/// Every `CERTIFICATE` block of a PEM text, in order.
fn certs(text: &str) -> Vec<Cert> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(BEGIN) {
        let after = &rest[start + BEGIN.len()..];
        let Some(end) = after.find(END) else { break };
        let body: String = after[..end].chars().filter(|c| !c.is_whitespace()).collect();
        out.push(Cert { pem: format!("{BEGIN}\n{}\n{END}\n", after[..end].trim()), body });
        rest = &after[end + END.len()..];
    }
    out
}

/// The host's CA certificates.
#[derive(Debug, Clone)]
pub struct HostCa {
    /// The bundle they were read from.
    pub path: PathBuf,
    /// Its size and modification time when read.
    stamp: (u64, Option<SystemTime>),
    certs: Vec<Cert>,
}

/// The host's bundle: the server's `SSL_CERT_FILE` (what its own TLS
/// clients trust) if set, else the first of the usual places; with its stamp.
fn host_bundle() -> Option<(PathBuf, (u64, Option<SystemTime>))> {
    let explicit = std::env::var_os("SSL_CERT_FILE").map(PathBuf::from);
    explicit.into_iter().chain(HOST_BUNDLES.iter().map(PathBuf::from)).find_map(|p| {
        let meta = std::fs::metadata(&p).ok().filter(|m| m.is_file())?;
        Some((p, (meta.len(), meta.modified().ok())))
    })
}

/// The host's certificates, read again only when its bundle changes (a
/// creation must not parse it each time).
#[derive(Debug, Default)]
pub struct HostCaCache(Mutex<Option<Arc<HostCa>>>);

impl HostCaCache {
    /// The host's certificates now; `None` when there is no bundle or it
    /// holds no certificate: there is nothing to add.
    pub fn get(&self) -> Option<Arc<HostCa>> {
        let (path, stamp) = host_bundle()?;
        let mut cached = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = cached.as_ref().filter(|c| c.path == path && c.stamp == stamp) {
            return Some(c.clone());
        }
        let fresh = HostCa::load(path, stamp).map(Arc::new);
        cached.clone_from(&fresh);
        fresh
    }
}

/// An image's name and build time, which [`SeedCache`] keeps files for.
pub type ImageBuild<'a> = (&'a str, i64);

/// The files host CA trust wrote into a sandbox of one image, by image name.
#[derive(Debug, Default)]
pub struct SeedCache(Mutex<HashMap<String, Seed>>);

/// The files for sandboxes of one image build and one host bundle.
#[derive(Debug, Clone)]
pub struct Seed {
    /// The image's build time ([`super::helper_client::VmInfo::image_created_at_ms`]).
    pub image_created_at_ms: i64,
    host: Arc<HostCa>,
    /// What to place.
    pub files: Arc<Vec<RootfsFile>>,
}

impl SeedCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Seed>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The files for a sandbox of `image` trusting `host`, if a sandbox of
    /// that image was given them since the host's bundle last changed.
    pub fn get(&self, image: &str, host: &Arc<HostCa>) -> Option<Seed> {
        self.lock().get(image).filter(|s| Arc::ptr_eq(&s.host, host)).cloned()
    }

    /// `image` was rebuilt since its files were kept.
    pub fn forget(&self, image: &str) {
        self.lock().remove(image);
    }

    fn put(&self, image: &str, image_created_at_ms: i64, host: &Arc<HostCa>, files: &[(&str, &[u8])]) {
        if files.iter().map(|(_, data)| data.len()).sum::<usize>() > MAX_SEED_BYTES {
            return;
        }
        let mut files: Vec<RootfsFile> = files
            .iter()
            .map(|(path, data)| RootfsFile::File { path: path.to_string(), content: data.to_vec() })
            .collect();
        files.push(RootfsFile::Link { path: BUNDLE.into(), target: SYSTEM.into() });
        let mut seeds = self.lock();
        if seeds.len() >= SEED_IMAGES && !seeds.contains_key(image) {
            // Any one: a sandbox of it pays the CopyOut once more.
            if let Some(old) = seeds.keys().next().cloned() {
                seeds.remove(&old);
            }
        }
        let seed = Seed { image_created_at_ms, host: host.clone(), files: Arc::new(files) };
        seeds.insert(image.to_string(), seed);
    }
}

impl HostCa {
    fn load(path: PathBuf, stamp: (u64, Option<SystemTime>)) -> Option<Self> {
        let text = match std::fs::File::open(&path).and_then(|f| {
            let mut text = String::new();
            f.take(MAX_BUNDLE_BYTES).read_to_string(&mut text).map(|_| text)
        }) {
            Ok(text) => text,
            Err(e) => {
                tracing::warn!("cannot read the host's CA bundle {}: {e}; sandboxes get none of it", path.display());
                return None;
            }
        };
        let certs = certs(&text);
        if certs.is_empty() {
            tracing::warn!("the host's CA bundle {} holds no certificate", path.display());
            return None;
        }
        Some(Self { path, stamp, certs })
    }

    /// The image's bundle (`None`: it has none) plus the host's
    /// certificates it lacks, and those alone.
    fn merge(&self, image: Option<&str>) -> (String, String) {
        let image = image.unwrap_or_default();
        let image_certs = certs(image);
        let mut seen: HashSet<&str> = image_certs.iter().map(|c| c.body.as_str()).collect();
        let extra: String =
            self.certs.iter().filter(|c| seen.insert(c.body.as_str())).map(|c| c.pem.as_str()).collect();
        let mut bundle = image.to_string();
        if !bundle.is_empty() && !bundle.ends_with('\n') {
            bundle.push('\n');
        }
        bundle.push_str(&extra);
        (bundle, extra)
    }
}

impl SandboxManager {
    /// Give a booted sandbox the host's CA certificates: read the image's
    /// system bundle (CopyOut, no exec), write the merged one (one CopyIn).
    /// With `keep` (the image's name and build time; not for a clone, whose
    /// layer is its source's), what was written is kept for its next sandboxes.
    pub(super) async fn trust_host_ca(
        &self,
        sandbox: &Sandbox,
        host: &Arc<HostCa>,
        keep: Option<ImageBuild<'_>>,
    ) -> Result<(), OrchestratorError> {
        let image = self.image_bundle(sandbox).await?;
        let (bundle, extra) = host.merge(image.as_deref());
        let mut files = vec![(SYSTEM, bundle.as_bytes())];
        if !extra.is_empty() {
            files.push((LOCAL, extra.as_bytes()));
        }
        let failed = |e: &dyn std::fmt::Display| {
            OrchestratorError::InvalidArgument(format!(
                "cannot add the host's CA certificates to sandbox '{}' (trust_host_ca = false turns this off): {e}",
                sandbox.shown()
            ))
        };
        let archive = archive(&files).map_err(|e| failed(&e))?;
        self.helper.copy_in_archive(&sandbox.name, "/", archive).await.map_err(|e| failed(&e))?;
        if let Some((image, built)) = keep {
            self.ca_seeds.put(image, built, host, &files);
        }
        tracing::debug!(sandbox = %sandbox.name, host = %host.path.display(), "trusting the host's CA certificates");
        Ok(())
    }

    /// The text of the image's [`SYSTEM`] bundle, following symlinks inside
    /// the sandbox; `None` if there is none (or it is not a bundle).
    async fn image_bundle(&self, sandbox: &Sandbox) -> Result<Option<String>, OrchestratorError> {
        let mut path = PathBuf::from(SYSTEM);
        for _ in 0..MAX_LINKS {
            let Some(archive) = self.copy_out_small(sandbox, &path).await? else { return Ok(None) };
            match first_entry(&archive) {
                Some(Entry::File(text)) => return Ok(Some(text)),
                Some(Entry::Link(target)) => path = path.parent().unwrap_or(Path::new("/")).join(target),
                None => return Ok(None),
            }
        }
        Ok(None)
    }

    /// A CopyOut of one path, whole; `None` if it does not exist or is
    /// larger than any bundle (the host's certificates alone are better
    /// than holding that in memory).
    async fn copy_out_small(&self, sandbox: &Sandbox, path: &Path) -> Result<Option<Vec<u8>>, OrchestratorError> {
        let path = path.to_string_lossy();
        let mut reader = match self.helper.copy_out(&sandbox.name, &path).await {
            Ok(r) => r,
            Err(HelperError::NotFound(_)) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let mut archive = Vec::new();
        loop {
            match reader.next().await {
                Ok(Some(chunk)) => archive.extend_from_slice(&chunk),
                Ok(None) => return Ok(Some(archive)),
                Err(HelperError::NotFound(_)) => return Ok(None),
                Err(e) => return Err(e.into()),
            }
            if archive.len() as u64 > MAX_BUNDLE_BYTES {
                tracing::warn!(sandbox = %sandbox.name, "{path} is over {MAX_BUNDLE_BYTES} bytes: not merged");
                return Ok(None);
            }
        }
    }
}

/// The archive to copy in: `files` (root-owned, 0644) and [`BUNDLE`] as a
/// symlink to [`SYSTEM`].
fn archive(files: &[(&str, &[u8])]) -> std::io::Result<Vec<u8>> {
    let now = sandbox_base::clock::unix_secs();
    let header = |kind: tar::EntryType, size: usize, mode: u32| {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(size as u64);
        h.set_mode(mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(now);
        h
    };
    let mut b = tar::Builder::new(Vec::new());
    for (path, data) in files {
        b.append_data(&mut header(tar::EntryType::Regular, data.len(), 0o644), path.trim_start_matches('/'), *data)?;
    }
    b.append_link(&mut header(tar::EntryType::Symlink, 0, 0o777), BUNDLE.trim_start_matches('/'), SYSTEM)?;
    b.into_inner()
}

/// The first entry of a CopyOut archive.
#[derive(Debug, PartialEq, Eq)]
enum Entry {
    /// A regular file of text.
    File(String),
    /// A symlink, to this target.
    Link(PathBuf),
}

fn first_entry(archive: &[u8]) -> Option<Entry> {
    let mut tar = tar::Archive::new(archive);
    let mut entry = tar.entries().ok()?.next()?.ok()?;
    let kind = entry.header().entry_type();
    if kind.is_symlink() {
        return Some(Entry::Link(entry.link_name().ok()??.into_owned()));
    }
    if !kind.is_file() {
        return None;
    }
    let mut text = String::new();
    entry.read_to_string(&mut text).ok()?;
    Some(Entry::File(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pem(body: &str) -> String {
        format!("{BEGIN}\n{body}\n{END}\n")
    }

    #[test]
    fn merge_adds_only_missing_certificates() {
        let host = |text: &str| HostCa { path: PathBuf::from("/h"), stamp: (0, None), certs: certs(text) };
        let host = host(&(pem("AAAA") + &pem("BB\nBB") + &pem("CCCC")));
        // The image has A (wrapped differently) and D.
        let image = format!("# comment\n{}{}", pem("AA\nAA"), pem("DDDD"));
        let (bundle, extra) = host.merge(Some(&image));
        assert_eq!(extra, pem("BB\nBB") + &pem("CCCC"));
        assert_eq!(bundle, image.clone() + &extra);
        // Merging into the result again changes nothing (restore, clone).
        let (again, extra) = host.merge(Some(&bundle));
        assert_eq!((again, extra.as_str()), (bundle, ""));
        // No image bundle: the host's, each certificate once.
        let twice = HostCa { path: PathBuf::from("/h"), stamp: (0, None), certs: certs(&(pem("AAAA") + &pem("AAAA"))) };
        assert_eq!(twice.merge(None), (pem("AAAA"), pem("AAAA")));
        // An image bundle without a final newline stays a valid PEM file.
        let (bundle, _) = host.merge(Some(pem("DDDD").trim_end()));
        assert!(bundle.starts_with(&(pem("DDDD") + BEGIN)), "{bundle}");
    }

    #[test]
    fn certificates_are_found_in_any_text() {
        let text = format!("junk\n{}middle\n{}-----BEGIN CERTIFICATE-----\nunterminated", pem("X1"), pem(" X2 "));
        let found = certs(&text);
        assert_eq!(found.iter().map(|c| c.body.as_str()).collect::<Vec<_>>(), ["X1", "X2"]);
        assert_eq!(found[1].pem, pem("X2"));
        assert_eq!(env().len(), 6);
        assert!(env().values().all(|v| v == BUNDLE));
    }

    #[test]
    fn the_first_entry_is_a_file_or_a_link() {
        let files = [("etc/x.crt", b"abc".as_slice())];
        let a = archive(&files).unwrap();
        assert_eq!(first_entry(&a), Some(Entry::File("abc".into())));
        let mut entries = tar::Archive::new(a.as_slice());
        let names: Vec<(String, Option<PathBuf>)> = entries
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let link = e.link_name().unwrap().map(|l| l.into_owned());
                (e.path().unwrap().display().to_string(), link)
            })
            .collect();
        assert_eq!(names, [("etc/x.crt".to_string(), None), (BUNDLE[1..].to_string(), Some(PathBuf::from(SYSTEM)))]);
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        b.append_link(&mut h, "x.crt", "../y.pem").unwrap();
        assert_eq!(first_entry(&b.into_inner().unwrap()), Some(Entry::Link(PathBuf::from("../y.pem"))));
        assert_eq!(first_entry(b"not a tar"), None);
    }
}
