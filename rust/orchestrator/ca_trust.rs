//! Host CA trust (`trust_host_ca`, on by default). Companies, and some
//! networks, re-sign TLS with a CA the host trusts and images do not: without
//! this, `pip` and `curl` over HTTPS fail inside a sandbox while they work on
//! the host. At creation the sandbox's trust store becomes the image's bundle
//! plus the host's certificates it lacks, written through one CopyIn (nothing
//! is written on the host) to:
//! - [`BUNDLE`], which the variables of [`env`] (pip, requests, node, git,
//!   curl, OpenSSL) point at from the VM's base environment;
//! - [`SYSTEM`], the Debian/Alpine system store most programs read;
//! - [`LOCAL`], the host's extra certificates alone, so an
//!   `update-ca-certificates` inside (a package install may run it) keeps them.
//!
//! A restored snapshot or clone already holds them: certificates are added
//! only if missing, so doing it again changes nothing.
use std::{
    collections::{HashMap, HashSet},
    io::Read,
    path::PathBuf,
};

use super::{
    error::OrchestratorError,
    helper_client::HelperError,
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
    certs: Vec<Cert>,
}

impl HostCa {
    /// The host's bundle: the server's `SSL_CERT_FILE` (what its own TLS
    /// clients trust) if set, else the first of the usual places. `None`
    /// when there is none or it holds no certificate: there is nothing to add.
    pub fn load() -> Option<Self> {
        let explicit = std::env::var_os("SSL_CERT_FILE").map(PathBuf::from);
        let path = explicit.into_iter().chain(HOST_BUNDLES.iter().map(PathBuf::from)).find(|p| p.is_file())?;
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
        Some(Self { path, certs })
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
    pub(super) async fn trust_host_ca(&self, sandbox: &Sandbox, host: &HostCa) -> Result<(), OrchestratorError> {
        let image = self.image_bundle(sandbox).await?;
        let (bundle, extra) = host.merge(image.as_deref());
        let mut files = vec![(BUNDLE, bundle.as_bytes()), (SYSTEM, bundle.as_bytes())];
        if !extra.is_empty() {
            files.push((LOCAL, extra.as_bytes()));
        }
        let archive = super::tarstream::files_archive(files, 0o644)
            .map_err(|e| OrchestratorError::InvalidArgument(format!("cannot build the CA archive: {e}")))?;
        self.helper.copy_in_archive(&sandbox.name, "/", archive).await?;
        tracing::debug!(sandbox = %sandbox.name, host = %host.path.display(), "trusting the host's CA certificates");
        Ok(())
    }

    /// The text of the image's [`SYSTEM`] bundle, if it is a regular file.
    async fn image_bundle(&self, sandbox: &Sandbox) -> Result<Option<String>, OrchestratorError> {
        let mut reader = match self.helper.copy_out(&sandbox.name, SYSTEM).await {
            Ok(r) => r,
            Err(HelperError::NotFound(_)) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let mut archive = Vec::new();
        loop {
            match reader.next().await {
                Ok(Some(chunk)) => archive.extend_from_slice(&chunk),
                Ok(None) => break,
                Err(HelperError::NotFound(_)) => return Ok(None),
                Err(e) => return Err(e.into()),
            }
            // A bundle this large is not one: the host's certificates alone
            // are better than holding it in memory.
            if archive.len() as u64 > MAX_BUNDLE_BYTES {
                tracing::warn!(sandbox = %sandbox.name, "{SYSTEM} is over {MAX_BUNDLE_BYTES} bytes: not merged");
                return Ok(None);
            }
        }
        Ok(regular_file(&archive))
    }
}

/// The content of the first entry of a tar archive, if it is a regular
/// file of text.
fn regular_file(archive: &[u8]) -> Option<String> {
    let mut tar = tar::Archive::new(archive);
    let mut entry = tar.entries().ok()?.next()?.ok()?;
    if !entry.header().entry_type().is_file() {
        return None;
    }
    let mut text = String::new();
    entry.read_to_string(&mut text).ok()?;
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pem(body: &str) -> String {
        format!("{BEGIN}\n{body}\n{END}\n")
    }

    #[test]
    fn merge_adds_only_missing_certificates() {
        let host = HostCa { path: PathBuf::from("/h"), certs: certs(&(pem("AAAA") + &pem("BB\nBB") + &pem("CCCC"))) };
        // The image has A (wrapped differently) and D.
        let image = format!("# comment\n{}{}", pem("AA\nAA"), pem("DDDD"));
        let (bundle, extra) = host.merge(Some(&image));
        assert_eq!(extra, pem("BB\nBB") + &pem("CCCC"));
        assert_eq!(bundle, image.clone() + &extra);
        // Merging into the result again changes nothing (restore, clone).
        let (again, extra) = host.merge(Some(&bundle));
        assert_eq!((again, extra.as_str()), (bundle, ""));
        // No image bundle: the host's, each certificate once.
        let twice = HostCa { path: PathBuf::from("/h"), certs: certs(&(pem("AAAA") + &pem("AAAA"))) };
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
    fn the_first_entry_must_be_a_regular_file() {
        let archive = crate::orchestrator::tarstream::files_archive([("x.crt", b"abc".as_slice())], 0o644).unwrap();
        assert_eq!(regular_file(&archive).as_deref(), Some("abc"));
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        b.append_link(&mut h, "x.crt", "/elsewhere").unwrap();
        assert_eq!(regular_file(&b.into_inner().unwrap()), None);
        assert_eq!(regular_file(b"not a tar"), None);
    }
}
