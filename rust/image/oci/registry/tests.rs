//! Unit tests of endpoint choice, error reading, and manifest and platform handling.
use serde::Deserialize;

use super::RegistryConfig;
use super::endpoint::{Scheme, endpoints, plain_http_allowed};
use super::errors::{HOSTILE_TEXT_MAX, certificate_problem, chain, clean, speaks_no_tls};
use super::manifest::{Descriptor, Manifest, Platform, choose_platform, is_index};
use crate::oci::reference::Reference;
use crate::oci::{OciError, media};

fn cfg(mirrors: &[(&str, &[&str])], insecure: &[&str]) -> RegistryConfig {
    RegistryConfig {
        mirrors: mirrors.iter().map(|(k, v)| (k.to_string(), v.iter().map(|m| m.to_string()).collect())).collect(),
        insecure: insecure.iter().map(|s| s.to_string()).collect(),
    }
}

#[test]
fn plain_http_only_for_loopback_and_listed_registries() {
    let c = cfg(&[], &["reg.lan:5000"]);
    for host in ["localhost", "localhost:5000", "127.0.0.1:5000", "127.9.9.9", "[::1]:5000", "[::1]", "reg.lan:5000"] {
        assert!(plain_http_allowed(host, &c), "{host}");
    }
    let remote = "reg.lan reg.lan:5001 ghcr.io 10.0.0.1:5000 [::2]:5000 localhost.evil.com 127.0.0.1.nip.io";
    for host in remote.split(' ') {
        assert!(!plain_http_allowed(host, &c), "{host}");
    }
}

#[test]
fn mirrors_come_first_and_plain_http_is_checked_before_any_request() {
    let r = Reference::parse("python:3").unwrap();
    let c = cfg(&[("docker.io", &["https://mirror.gcr.io/", "localhost:5001", "http://127.0.0.1:5002"])], &[]);
    let e = endpoints(&r, &c).unwrap();
    let got: Vec<_> = e.iter().map(|e| (e.host.as_str(), e.scheme, e.mirror)).collect();
    assert_eq!(
        got,
        [
            ("mirror.gcr.io", Scheme::Https, true),
            ("localhost:5001", Scheme::HttpsOrHttp, true),
            ("127.0.0.1:5002", Scheme::Http, true),
            ("registry-1.docker.io", Scheme::Https, false)
        ]
    );
    let bad = cfg(&[("docker.io", &["http://mirror.example.com"])], &[]);
    let err = endpoints(&r, &bad).unwrap_err();
    assert!(err.to_string().contains("plain HTTP is refused"), "{err}");
    let allowed = cfg(
        &[("docker.io", &["http://mirror.example.com", "mirror.example.com", "https://mirror.example.com"])],
        &["mirror.example.com"],
    );
    let schemes: Vec<_> = endpoints(&r, &allowed).unwrap().iter().map(|e| e.scheme).collect();
    assert_eq!(schemes, [Scheme::Http, Scheme::HttpsOrHttp, Scheme::Https, Scheme::Https]);
    for wrong in ["ftp://m.io", "m.io/path", "m.io:port"] {
        assert!(endpoints(&r, &cfg(&[("docker.io", &[wrong])], &[])).is_err(), "{wrong}");
    }
    let local = Reference::parse("127.0.0.1:5000/a").unwrap();
    assert_eq!(endpoints(&local, &RegistryConfig::default()).unwrap()[0].scheme, Scheme::HttpsOrHttp);
    let listed = Reference::parse("reg.lan:5000/a").unwrap();
    assert_eq!(endpoints(&listed, &cfg(&[], &["reg.lan:5000"])).unwrap()[0].scheme, Scheme::HttpsOrHttp);
    let remote = Reference::parse("ghcr.io/a/b").unwrap();
    assert_eq!(endpoints(&remote, &RegistryConfig::default()).unwrap()[0].scheme, Scheme::Https);
}

/// An error with a cause, as reqwest's are.
#[derive(Debug)]
struct Chained(&'static str, Option<Box<Chained>>);

impl std::fmt::Display for Chained {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for Chained {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.1.as_deref().map(|e| e as _)
    }
}

#[test]
fn only_a_server_that_speaks_no_tls_is_spoken_to_in_plain_http() {
    let request = |cause: &'static str| {
        Chained(
            "error sending request",
            Some(Box::new(Chained("client error (Connect)", Some(Box::new(Chained(cause, None)))))),
        )
    };
    assert!(speaks_no_tls(&request("received corrupt message of type InvalidContentType")));
    assert!(speaks_no_tls(&request("tls handshake eof")));
    for tls in [
        "invalid peer certificate: UnknownIssuer",
        "invalid peer certificate: certificate not valid for name \"x\"; certificate is only valid for y",
        "received fatal alert: HandshakeFailure",
        "peer is incompatible: Tls12NotOffered",
        "Connection refused (os error 111)",
    ] {
        assert!(!speaks_no_tls(&request(tls)), "{tls}");
    }
    let text = chain(&request("invalid peer certificate: UnknownIssuer"));
    assert_eq!(certificate_problem(&text), Some("invalid peer certificate: UnknownIssuer"));
    assert_eq!(certificate_problem("Connection refused"), None);
}

#[test]
fn config_reads_from_toml() {
    let text =
        "[registries]\ninsecure = [\"reg.lan:5000\"]\n[registries.mirrors]\n\"docker.io\" = [\"mirror.gcr.io\"]\n";
    #[derive(Deserialize)]
    struct File {
        registries: RegistryConfig,
    }
    let f: File = toml::from_str(text).unwrap();
    assert_eq!(f.registries, cfg(&[("docker.io", &["mirror.gcr.io"])], &["reg.lan:5000"]));
    assert!(toml::from_str::<File>("[registries]\nmirrorz = {}\n").is_err());
}

fn entry(os: &str, arch: &str, variant: Option<&str>) -> Descriptor {
    Descriptor {
        media_type: media::OCI_MANIFEST.to_string(),
        digest: format!("sha256:{}", "0".repeat(64)),
        size: 1,
        platform: Some(Platform { architecture: arch.into(), os: os.into(), variant: variant.map(Into::into) }),
    }
}

#[test]
fn an_index_resolves_to_this_platform_or_says_what_it_has() {
    let r = Reference::parse("x").unwrap();
    let entries =
        vec![entry("linux", "arm", Some("v7")), entry("linux", "arm64", Some("v8")), entry("linux", "amd64", None)];
    let amd = choose_platform(&entries, ("amd64", None), &r).unwrap();
    assert_eq!(amd.platform.as_ref().unwrap().architecture, "amd64");
    let arm = choose_platform(&entries, ("arm64", Some("v8")), &r).unwrap();
    assert_eq!(arm.platform.as_ref().unwrap().variant.as_deref(), Some("v8"));
    let only = vec![entry("windows", "amd64", None), entry("linux", "s390x", None)];
    match choose_platform(&only, ("amd64", None), &r) {
        Err(OciError::NoPlatform { platform, available, .. }) => {
            assert_eq!(platform, "linux/amd64");
            assert_eq!(available, "windows/amd64, linux/s390x");
        }
        other => panic!("{:?}", other.map(|_| ())),
    }
}

#[test]
fn a_registrys_text_is_cleaned_and_capped() {
    assert_eq!(clean("bad\x1b[31m red\r\n\tline\u{202e}gnp.exe"), "bad [31m red linegnp.exe");
    let long = clean(&"x".repeat(1000));
    assert_eq!(long.chars().count(), HOSTILE_TEXT_MAX + 1);
    assert!(long.ends_with('…'));
}

#[test]
fn manifests_are_told_apart_by_media_type_or_fields() {
    let m = |j: &str| serde_json::from_str::<Manifest>(j).unwrap();
    let typed = |t: &str| m(&format!(r#"{{"schemaVersion":2,"mediaType":"{t}"}}"#));
    assert!(is_index(&typed(media::OCI_INDEX), "x").unwrap());
    assert!(!is_index(&typed(media::DOCKER_MANIFEST), "x").unwrap());
    assert!(is_index(&m(r#"{"schemaVersion":2,"manifests":[]}"#), "x").unwrap());
    assert!(is_index(&m(r#"{"schemaVersion":1}"#), "x").is_err());
    assert!(is_index(&m(r#"{"schemaVersion":2,"mediaType":"text/html"}"#), "x").is_err());
}
