//! Registry credentials from the files users already have: the ones
//! `podman login` and `skopeo login` write (`$REGISTRY_AUTH_FILE`,
//! `$XDG_RUNTIME_DIR/containers/auth.json`, `~/.config/containers/auth.json`)
//! and `docker login`'s `~/.docker/config.json`, first match wins. Only
//! inline credentials are read (`auth`, or `username` + `password`):
//! credential helpers (`credsStore`, `credHelpers`) run external programs,
//! which a server answering agents does not do on its own; such users can
//! `podman login` (inline in auth.json) instead. Credentials never go into
//! logs or errors: `Credentials` has no Debug and Display.
use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde::Deserialize;

use super::reference::{DOCKER_HUB, DOCKER_HUB_API};

/// A user name and password for a registry.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The user name.
    pub username: String,
    /// The password or access token.
    pub password: String,
}

#[derive(Deserialize, Default)]
struct AuthFile {
    #[serde(default)]
    auths: std::collections::BTreeMap<String, AuthEntry>,
}

#[derive(Deserialize, Default)]
struct AuthEntry {
    #[serde(default)]
    auth: String,
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
}

/// The auth files to read, in order, from the environment's values.
fn auth_files(
    registry_auth_file: Option<PathBuf>,
    runtime_dir: Option<PathBuf>,
    home: Option<PathBuf>,
) -> Vec<PathBuf> {
    let mut files = Vec::new();
    files.extend(registry_auth_file);
    files.extend(runtime_dir.map(|d| d.join("containers/auth.json")));
    if let Some(home) = home {
        files.push(home.join(".config/containers/auth.json"));
        files.push(home.join(".docker/config.json"));
    }
    files
}

/// Credentials for `host` (a registry as named in references, or a mirror's
/// host[:port]) and `repository`, from the user's auth files.
pub fn lookup(host: &str, repository: &str) -> Option<Credentials> {
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    let files = auth_files(env("REGISTRY_AUTH_FILE"), env("XDG_RUNTIME_DIR"), env("HOME"));
    files.iter().find_map(|file| lookup_in(file, host, repository))
}

/// Credentials for `host`/`repository` in one auth file. An unreadable or
/// malformed file is skipped (noting which, never its content).
fn lookup_in(file: &Path, host: &str, repository: &str) -> Option<Credentials> {
    let text = std::fs::read(file).ok()?;
    let parsed: AuthFile = match serde_json::from_slice(&text) {
        Ok(parsed) => parsed,
        Err(_) => {
            tracing::warn!(file = %file.display(), "registry auth file is not valid JSON; skipped");
            return None;
        }
    };
    keys(host, repository).iter().find_map(|key| parsed.auths.get(key.as_str()).and_then(decode))
}

/// The keys an entry for `host` may have, most specific first: podman's
/// per-repository keys (`host/ns/repo`, `host/ns`), the host, the host as a
/// URL, and for Docker Hub the names docker writes.
fn keys(host: &str, repository: &str) -> Vec<String> {
    let hub = host == DOCKER_HUB || host == DOCKER_HUB_API || host == "index.docker.io";
    let mut keys = Vec::new();
    let mut path = repository;
    loop {
        keys.push(format!("{host}/{path}"));
        match path.rsplit_once('/') {
            Some((parent, _)) => path = parent,
            None => break,
        }
    }
    keys.push(host.to_string());
    keys.push(format!("https://{host}"));
    keys.push(format!("http://{host}"));
    if hub {
        for k in ["docker.io", "index.docker.io", "registry-1.docker.io", "https://index.docker.io/v1/"] {
            keys.push(k.to_string());
        }
    }
    keys
}

fn decode(entry: &AuthEntry) -> Option<Credentials> {
    if !entry.auth.is_empty() {
        let raw = base64::engine::general_purpose::STANDARD.decode(entry.auth.trim()).ok()?;
        let text = String::from_utf8(raw).ok()?;
        let (username, password) = text.split_once(':')?;
        return Some(Credentials { username: username.to_string(), password: password.to_string() });
    }
    if !entry.username.is_empty() {
        return Some(Credentials { username: entry.username.clone(), password: entry.password.clone() });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::test_dir::TempDir;

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    #[test]
    fn files_are_read_in_podman_then_docker_order() {
        let files = auth_files(Some("/a.json".into()), Some("/run/u".into()), Some("/h".into()));
        let want: Vec<PathBuf> =
            ["/a.json", "/run/u/containers/auth.json", "/h/.config/containers/auth.json", "/h/.docker/config.json"]
                .iter()
                .map(PathBuf::from)
                .collect();
        assert_eq!(files, want);
        assert!(auth_files(None, None, None).is_empty());
    }

    #[test]
    fn entries_match_by_host_repository_and_docker_hub_aliases() {
        let t = TempDir::new("auth");
        let file = t.path().join("auth.json");
        let json = serde_json::json!({
            "auths": {
                "https://index.docker.io/v1/": {"auth": b64("hub:hubpw")},
                "ghcr.io/team": {"auth": b64("team:teampw")},
                "ghcr.io": {"auth": b64("any:anypw")},
                "localhost:5000": {"username": "u", "password": "p:w"},
                "bad.io": {"auth": "%%%"}
            },
            "credsStore": "desktop"
        });
        std::fs::write(&file, json.to_string()).unwrap();
        let get = |host: &str, repo: &str| lookup_in(&file, host, repo).map(|c| (c.username, c.password));
        assert_eq!(get("docker.io", "library/python"), Some(("hub".into(), "hubpw".into())));
        assert_eq!(get("ghcr.io", "team/app"), Some(("team".into(), "teampw".into())));
        assert_eq!(get("ghcr.io", "other/app"), Some(("any".into(), "anypw".into())));
        assert_eq!(get("localhost:5000", "x"), Some(("u".into(), "p:w".into())));
        assert_eq!(get("bad.io", "x"), None);
        assert_eq!(get("quay.io", "x"), None);
        std::fs::write(&file, "not json").unwrap();
        assert_eq!(get("ghcr.io", "x"), None);
    }
}
