//! Image references as Docker reads them: `python:3.12` is
//! `docker.io/library/python:3.12`, `user/repo` is `docker.io/user/repo:latest`,
//! and a first component with a dot, a colon or `localhost` names a registry
//! (`ghcr.io/o/r:tag`, `localhost:5000/x`, `127.0.0.1:5000/a/b@sha256:…`).
//! Everything is checked here, before any of it reaches a URL or a path.
use std::fmt;
use std::str::FromStr;

use super::OciError;
use super::blobs::digest_hex;

/// Docker Hub's name in references.
pub const DOCKER_HUB: &str = "docker.io";
/// The host that serves Docker Hub's registry API.
pub const DOCKER_HUB_API: &str = "registry-1.docker.io";
/// Docker's limit on a repository's full name (registry and path).
const NAME_MAX: usize = 255;
/// Docker's limit on a tag.
const TAG_MAX: usize = 128;

/// A parsed image reference: where the image lives and which one.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Reference {
    registry: String,
    repository: String,
    tag: Option<String>,
    digest: Option<String>,
}

impl Reference {
    /// Parses `reference` the way `docker pull` does.
    pub fn parse(reference: &str) -> Result<Self, OciError> {
        let bad = |why: &str| OciError::InvalidReference { reference: reference.to_string(), why: why.to_string() };
        if reference.is_empty() {
            return Err(bad("it is empty"));
        }
        if reference.len() > NAME_MAX + 1 + TAG_MAX + 1 + 71 {
            return Err(bad("it is too long"));
        }
        let (name_tag, digest) = match reference.split_once('@') {
            Some((name_tag, digest)) => {
                digest_hex(digest).map_err(|_| bad("the digest must be sha256: and 64 lowercase hex digits"))?;
                (name_tag, Some(digest.to_string()))
            }
            None => (reference, None),
        };
        // A tag follows the last ':' after the last '/'; an earlier ':' is a registry's port.
        let last_slash = name_tag.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match name_tag[last_slash..].rfind(':') {
            Some(i) => (&name_tag[..last_slash + i], Some(&name_tag[last_slash + i + 1..])),
            None => (name_tag, None),
        };
        if let Some(tag) = tag {
            check_tag(tag).map_err(bad)?;
        }
        let (registry, path) = split_registry(name);
        check_registry(&registry).map_err(bad)?;
        if path.is_empty() {
            return Err(bad("the repository name is empty"));
        }
        let repository =
            if registry == DOCKER_HUB && !path.contains('/') { format!("library/{path}") } else { path.to_string() };
        for component in repository.split('/') {
            check_component(component).map_err(bad)?;
        }
        if registry.len() + 1 + repository.len() > NAME_MAX {
            return Err(bad("the repository name is longer than 255 characters"));
        }
        let tag = match (tag, &digest) {
            (Some(tag), _) => Some(tag.to_string()),
            (None, Some(_)) => None,
            (None, None) => Some("latest".to_string()),
        };
        Ok(Reference { registry, repository, tag, digest })
    }

    /// The registry as named in references: `docker.io`, `ghcr.io`, `localhost:5000`.
    pub fn registry(&self) -> &str {
        &self.registry
    }

    /// The host[:port] that serves the registry's API (`registry-1.docker.io` for Docker Hub).
    pub fn api_host(&self) -> &str {
        if self.registry == DOCKER_HUB { DOCKER_HUB_API } else { &self.registry }
    }

    /// The repository path: `library/python`, `o/r`.
    pub fn repository(&self) -> &str {
        &self.repository
    }

    /// The tag: `latest` when neither a tag nor a digest was given.
    pub fn tag(&self) -> Option<&str> {
        self.tag.as_deref()
    }

    /// The digest, `sha256:<hex>`, when one was given; it wins over the tag.
    pub fn digest(&self) -> Option<&str> {
        self.digest.as_deref()
    }

    /// The image name a pull of this reference gets unless told otherwise:
    /// the repository's last component and the tag (`python:3.12` →
    /// `python-3.12`), or the digest's first 12 hex digits, folded into the
    /// image naming rule (lowercase letters, digits, `.`, `_`, `-`; at most
    /// 63 characters, starting with a letter or digit).
    pub fn image_name(&self) -> String {
        let base = self.repository.rsplit('/').next().unwrap_or(&self.repository);
        let which = match (&self.tag, &self.digest) {
            (_, Some(digest)) => digest.trim_start_matches("sha256:").chars().take(12).collect(),
            (Some(tag), None) => tag.clone(),
            (None, None) => "latest".to_string(),
        };
        let folded: String = format!("{base}-{which}")
            .chars()
            .map(|c| c.to_ascii_lowercase())
            .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '-' })
            .skip_while(|c| !c.is_ascii_alphanumeric())
            .take(63)
            .collect();
        if folded.is_empty() { "image".to_string() } else { folded }
    }

    /// The same reference pinned to `digest` (already checked by the caller).
    pub fn with_digest(&self, digest: &str) -> Self {
        Reference { digest: Some(digest.to_string()), ..self.clone() }
    }
}

impl FromStr for Reference {
    type Err = OciError;

    fn from_str(s: &str) -> Result<Self, OciError> {
        Reference::parse(s)
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

/// Splits off the registry like Docker: the first component is one when it
/// has a '.' or a ':', is `localhost`, or has an uppercase letter (which no
/// repository may have). `index.docker.io` is Docker Hub's old name.
fn split_registry(name: &str) -> (String, &str) {
    match name.split_once('/') {
        Some((first, rest))
            if first.contains(['.', ':']) || first == "localhost" || first.bytes().any(|b| b.is_ascii_uppercase()) =>
        {
            let registry = if first == "index.docker.io" { DOCKER_HUB } else { first };
            (registry.to_string(), rest)
        }
        _ => (DOCKER_HUB.to_string(), name),
    }
}

/// `host[:port]`: DNS labels (letters, digits, inner '-'), an IPv4 address,
/// or a bracketed IPv6 address.
pub(crate) fn check_registry(registry: &str) -> Result<(), &'static str> {
    let (host, port) = if let Some(rest) = registry.strip_prefix('[') {
        let (v6, after) = rest.split_once(']').ok_or("the registry's IPv6 address lacks its ']'")?;
        v6.parse::<std::net::Ipv6Addr>().map_err(|_| "the registry's IPv6 address is malformed")?;
        match after {
            "" => ("", None),
            _ => ("", Some(after.strip_prefix(':').ok_or("the registry has text after its IPv6 address")?)),
        }
    } else {
        match registry.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (registry, None),
        }
    };
    if let Some(port) = port
        && (port.is_empty() || port.len() > 5 || !port.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err("the registry's port must be a number");
    }
    if registry.starts_with('[') {
        return Ok(());
    }
    if host.is_empty() {
        return Err("the registry's host name is empty");
    }
    for label in host.split('.') {
        if label.is_empty() {
            return Err("the registry's host name has an empty label");
        }
        if !label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
            return Err("the registry's host name may hold only letters, digits, '.' and '-'");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err("a label of the registry's host name starts or ends with '-'");
        }
    }
    Ok(())
}

/// A path component: lowercase letters and digits, separated by one '.',
/// one or two '_', or any number of '-' (Docker's grammar).
fn check_component(component: &str) -> Result<(), &'static str> {
    if component.is_empty() {
        return Err("the repository has an empty path component");
    }
    if component.bytes().any(|b| b.is_ascii_uppercase()) {
        return Err("the repository name must be lowercase");
    }
    let bytes = component.as_bytes();
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    if !alnum(bytes[0]) || !alnum(bytes[bytes.len() - 1]) {
        return Err("a repository path component must start and end with a letter or digit");
    }
    let mut i = 0;
    while i < bytes.len() {
        if alnum(bytes[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && !alnum(bytes[i]) {
            i += 1;
        }
        let sep = &component[start..i];
        let ok = sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|b| b == b'-');
        if !ok {
            return Err("the repository may hold only lowercase letters, digits and single '.', '_', '__' or '-' runs");
        }
    }
    Ok(())
}

/// A tag: a word character, then up to 127 word characters, '.' or '-'.
fn check_tag(tag: &str) -> Result<(), &'static str> {
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    match tag.as_bytes().first() {
        None => Err("the tag is empty"),
        Some(_) if tag.len() > TAG_MAX => Err("the tag is longer than 128 characters"),
        Some(&first) if !word(first) => Err("the tag must start with a letter, digit or '_'"),
        Some(_) if !tag.bytes().all(|b| word(b) || b == b'.' || b == b'-') => {
            Err("the tag may hold only letters, digits, '_', '.' and '-'")
        }
        Some(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_names_follow_the_naming_rule() {
        let name = |r: &str| Reference::parse(r).unwrap().image_name();
        assert_eq!(name("python:3.12"), "python-3.12");
        assert_eq!(name("python"), "python-latest");
        assert_eq!(name("ghcr.io/org/tool:V1.2_rc"), "tool-v1.2_rc");
        assert_eq!(name("localhost:5000/a/b:_x"), "b-_x");
        let digest = format!("sha256:{}", "ab".repeat(32));
        assert_eq!(name(&format!("busybox:1@{digest}")), "busybox-abababababab");
        let long = format!("r/{}:{}", "a".repeat(60), "t".repeat(60));
        let got = name(&long);
        assert!(got.len() == 63 && crate::validate_name(&got).is_ok(), "{got}");
    }

    fn parts(r: &str) -> (String, String, Option<String>, Option<String>, String) {
        let p = Reference::parse(r).unwrap_or_else(|e| panic!("{r}: {e}"));
        (
            p.registry().to_string(),
            p.repository().to_string(),
            p.tag().map(str::to_string),
            p.digest().map(str::to_string),
            p.to_string(),
        )
    }

    #[test]
    fn docker_hub_short_names() {
        let (reg, repo, tag, digest, full) = parts("python:3.12");
        assert_eq!(
            (reg.as_str(), repo.as_str(), tag.as_deref(), digest),
            ("docker.io", "library/python", Some("3.12"), None)
        );
        assert_eq!(full, "docker.io/library/python:3.12");
        assert_eq!(Reference::parse("python:3.12").unwrap().api_host(), "registry-1.docker.io");
        assert_eq!(parts("user/repo").4, "docker.io/user/repo:latest");
        assert_eq!(parts("busybox").4, "docker.io/library/busybox:latest");
        assert_eq!(parts("docker.io/busybox").4, "docker.io/library/busybox:latest");
        assert_eq!(parts("index.docker.io/user/repo:1").4, "docker.io/user/repo:1");
    }

    #[test]
    fn other_registries_ports_and_digests() {
        let hex = "a".repeat(64);
        assert_eq!(parts("ghcr.io/o/r:tag").4, "ghcr.io/o/r:tag");
        assert_eq!(Reference::parse("ghcr.io/o/r:tag").unwrap().api_host(), "ghcr.io");
        let (reg, repo, tag, _, full) = parts("localhost:5000/x");
        assert_eq!((reg.as_str(), repo.as_str(), tag.as_deref()), ("localhost:5000", "x", Some("latest")));
        assert_eq!(full, "localhost:5000/x:latest");
        assert_eq!(parts("localhost/x").0, "localhost");
        let (reg, repo, tag, digest, full) = parts(&format!("127.0.0.1:5000/a/b@sha256:{hex}"));
        assert_eq!((reg.as_str(), repo.as_str(), tag), ("127.0.0.1:5000", "a/b", None));
        assert_eq!(digest.as_deref(), Some(format!("sha256:{hex}").as_str()));
        assert_eq!(full, format!("127.0.0.1:5000/a/b@sha256:{hex}"));
        let both = format!("ghcr.io/o/r:v1.2-rc_3@sha256:{hex}");
        let (_, _, tag, digest, full) = parts(&both);
        assert_eq!(tag.as_deref(), Some("v1.2-rc_3"));
        assert!(digest.is_some());
        assert_eq!(full, both);
        assert_eq!(parts("[::1]:5000/x:y").4, "[::1]:5000/x:y");
        assert_eq!(parts("a__b/c-----d/e.f_g:T").1, "a__b/c-----d/e.f_g");
        let pinned = Reference::parse("x:1").unwrap().with_digest(&format!("sha256:{hex}"));
        assert_eq!(pinned.to_string(), format!("docker.io/library/x:1@sha256:{hex}"));
    }

    #[test]
    fn malformed_references_say_why() {
        let long = format!("{}/x", "a".repeat(260));
        let cases: &[(&str, &str)] = &[
            ("", "empty"),
            ("Python:3", "lowercase"),
            ("ghcr.io/Owner/r", "lowercase"),
            ("foo/", "empty path component"),
            ("/foo", "empty"),
            ("foo//bar", "empty path component"),
            ("foo:", "tag is empty"),
            ("foo@", "digest"),
            ("foo@sha256:abc", "digest"),
            ("foo@md5:0123", "digest"),
            ("-foo", "start and end"),
            ("foo/-bar", "start and end"),
            ("foo:-tag", "tag must start"),
            ("foo:t@g", "digest"),
            ("foo bar", "may hold only"),
            ("a..b/c", "empty label"),
            ("-x.io/c", "starts or ends"),
            ("x.io:port/c", "port"),
            ("localhost:/c", "port"),
            ("[::1/x", "lacks"),
            ("foo_._bar", "may hold only"),
            ("foo___bar", "may hold only"),
            (&long, "longer than 255"),
        ];
        for (input, why) in cases {
            match Reference::parse(input) {
                Err(OciError::InvalidReference { reference, why: got }) => {
                    assert_eq!(&reference, input);
                    assert!(got.contains(why), "{input:?}: {got:?} lacks {why:?}");
                }
                other => panic!("{input:?}: {other:?}"),
            }
        }
        let long_tag = format!("x:{}", "t".repeat(129));
        assert!(Reference::parse(&long_tag).is_err());
    }
}
