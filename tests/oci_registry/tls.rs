//! Registries over TLS with a test CA: basic auth when the CA is trusted,
//! an untrusted certificate refused naming the registry, a TLS registry
//! never downgraded to plain HTTP, and a plain loopback registry reached
//! over HTTPS first.
use super::*;

/// Whether openssl is here too (for the TLS tests); otherwise says so.
fn tls_tools() -> bool {
    if !tools() {
        return false;
    }
    let found = Command::new("openssl").arg("version").output().is_ok_and(|o| o.status.success());
    if !found {
        eprintln!("SKIP: openssl is not installed (apt-get install openssl)");
    }
    found
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl").current_dir(dir).args(args).output().expect("run openssl");
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A test CA, `{name}.pem` and `{name}.key` in `dir`; returns the
/// certificate's path.
fn make_ca(dir: &Path, name: &str) -> PathBuf {
    let (pem, key) = (format!("{name}.pem"), format!("{name}.key"));
    let subject = format!("/CN=sandbox-mcp test CA {name}");
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &pem,
            "-days",
            "2",
            "-subj",
            &subject,
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
    );
    dir.join(pem)
}

/// A server certificate for `sans` (`IP:127.0.0.1,DNS:localhost`) issued
/// by CA `ca` (made by `make_ca` in `dir`).
fn make_server_cert(dir: &Path, ca: &str, name: &str, sans: &str) -> ServerCert {
    let (csr, ext) = (format!("{name}.csr"), format!("{name}.ext"));
    let (cert, key) = (format!("{name}.pem"), format!("{name}.key"));
    let extensions = format!(
        "subjectAltName={sans}\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n\
         extendedKeyUsage=serverAuth\n"
    );
    std::fs::write(dir.join(&ext), extensions).unwrap();
    openssl(
        dir,
        &[
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            "/CN=sandbox-mcp test registry",
        ],
    );
    let (ca_pem, ca_key) = (format!("{ca}.pem"), format!("{ca}.key"));
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &ca_pem,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-out",
            &cert,
            "-days",
            "2",
            "-extfile",
            &ext,
        ],
    );
    ServerCert { cert: dir.join(cert), key: dir.join(key) }
}

/// `--dest-cert-dir` for skopeo: a directory with CA `ca` as `ca.crt`.
fn skopeo_cert_dir(ca: &Path) -> String {
    let dir = ca.with_extension("skopeo");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(ca, dir.join("ca.crt")).unwrap();
    format!("--dest-cert-dir={}", dir.display())
}

/// A TCP relay on 127.0.0.1 in front of a registry, noting the first byte
/// each connection sent: 0x16 opens a TLS handshake, `G` a plain HTTP
/// `GET`. It stops accepting when dropped.
struct Tap {
    port: u16,
    firsts: Arc<Mutex<Vec<u8>>>,
    stop: Arc<AtomicBool>,
}

const TLS_HANDSHAKE: u8 = 0x16;

impl Tap {
    fn start(upstream: u16) -> Tap {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (firsts, stop) = (Arc::new(Mutex::new(Vec::new())), Arc::new(AtomicBool::new(false)));
        let (noted, stopped) = (firsts.clone(), stop.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stopped.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(mut conn) = conn else { continue };
                let noted = noted.clone();
                std::thread::spawn(move || {
                    let mut first = [0u8; 1];
                    if conn.read_exact(&mut first).is_err() {
                        return;
                    }
                    noted.lock().unwrap().push(first[0]);
                    let Ok(mut up) = TcpStream::connect(("127.0.0.1", upstream)) else { return };
                    if up.write_all(&first).is_err() {
                        return;
                    }
                    let (mut down, mut back) = (conn.try_clone().unwrap(), up.try_clone().unwrap());
                    let replies = std::thread::spawn(move || {
                        let _ = std::io::copy(&mut back, &mut down);
                        let _ = down.shutdown(Shutdown::Write);
                    });
                    let _ = std::io::copy(&mut conn, &mut up);
                    let _ = up.shutdown(Shutdown::Write);
                    let _ = replies.join();
                });
            }
        });
        Tap { port, firsts, stop }
    }

    fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The first byte of each connection so far.
    fn firsts(&self) -> Vec<u8> {
        self.firsts.lock().unwrap().clone()
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// An auth file at `path` with `user`:`password` for each of `hosts`.
fn write_auth_file(path: &Path, hosts: &[String], user: &str, password: &str) {
    let auth = base64_encode(&format!("{user}:{password}"));
    let auths: serde_json::Map<String, serde_json::Value> =
        hosts.iter().map(|h| (h.clone(), json!({"auth": auth}))).collect();
    std::fs::write(path, json!({"auths": auths}).to_string()).unwrap();
}

#[tokio::test]
async fn tls_with_basic_auth_pulls_when_the_ca_is_trusted() {
    if !tls_tools() {
        return;
    }
    let pki = TempDir::new("pki");
    let ca = make_ca(pki.path(), "ca");
    let cert = make_server_cert(pki.path(), "ca", "server", "IP:127.0.0.1,DNS:localhost");
    let (user, password) = ("tls-tester", "tls-s3cret");
    let hash = bcrypt::hash(password, 4).unwrap();
    let reg = Registry::start_with(Some(&format!("{user}:{hash}\n")), Some(&cert));
    let (dir, image) = layout("tls", true);
    let creds = format!("--dest-creds={user}:{password}");
    let src = format!("oci:{}:v1", dir.path().display());
    push(&src, &format!("{}/test/img:v1", reg.host()), &[&skopeo_cert_dir(&ca), &creds]);

    let tap = Tap::start(reg.port);
    let by_name = format!("localhost:{}", tap.port);
    let t = TempDir::new("store");
    let auth_file = t.path().join("auth.json");
    write_auth_file(&auth_file, &[tap.host(), by_name.clone()], user, password);
    let mut env = EnvGuard::lock().await;
    env.set("REGISTRY_AUTH_FILE", Some(auth_file.as_os_str()));
    env.set("SSL_CERT_DIR", None);
    env.set("SSL_CERT_FILE", Some(ca.as_os_str()));
    let cancel = CancellationToken::new();

    // By address and by name: the certificate names both.
    for (i, host) in [tap.host(), by_name].iter().enumerate() {
        let store = BlobStore::new(t.path().join(format!("blobs{i}")));
        let reference = format!("{host}/test/img:v1");
        let (got, events) = pull_collect(&reference, &RegistryConfig::default(), &store, &cancel).await;
        let got = got.unwrap_or_else(|e| panic!("{reference}: {e}"));
        check_image(&got, &image, "tls");
        assert_eq!(got.source, format!("{reference}@{}", image.manifest));
        assert_eq!(count(&events, LayerState::Done), 3);
    }

    // As a mirror (a bare host[:port] on loopback), with its own credentials.
    let mut cfg = RegistryConfig::default();
    cfg.mirrors.insert("registry.invalid".to_string(), vec![tap.host()]);
    let store = BlobStore::new(t.path().join("mirrored"));
    let got = pull_collect("registry.invalid/test/img:v1", &cfg, &store, &cancel).await.0.unwrap();
    check_image(&got, &image, "tls");

    // Without credentials the registry refuses, over TLS still.
    std::fs::remove_file(&auth_file).unwrap();
    let store = BlobStore::new(t.path().join("anonymous"));
    let reference = format!("{}/test/img:v1", tap.host());
    match pull_collect(&reference, &RegistryConfig::default(), &store, &cancel).await.0 {
        Err(OciError::Unauthorized { registry, .. }) => assert_eq!(registry, tap.host()),
        other => panic!("{other:?}"),
    }
    assert!(stored(&store).is_empty());
    let firsts = tap.firsts();
    assert!(!firsts.is_empty() && firsts.iter().all(|&b| b == TLS_HANDSHAKE), "only TLS: {firsts:?}");
}

#[tokio::test]
async fn an_untrusted_certificate_is_an_error_naming_the_registry_and_nothing_is_kept() {
    if !tls_tools() {
        return;
    }
    let pki = TempDir::new("pki");
    let ca = make_ca(pki.path(), "ca");
    let other = make_ca(pki.path(), "other");
    let cert = make_server_cert(pki.path(), "ca", "server", "IP:127.0.0.1,DNS:localhost");
    let reg = Registry::start_with(None, Some(&cert));
    let (dir, _) = layout("untrusted", false);
    push(&format!("oci:{}:v1", dir.path().display()), &format!("{}/test/img:v1", reg.host()), &[&skopeo_cert_dir(&ca)]);
    let tap = Tap::start(reg.port);
    let t = TempDir::new("store");
    let store = BlobStore::new(t.path().join("blobs"));
    let reference = format!("{}/test/img:v1", tap.host());
    let pushed = reg.log().len();
    let mut env = EnvGuard::lock().await;
    env.set("SSL_CERT_DIR", None);
    // The host's CA store is another CA alone.
    env.set("SSL_CERT_FILE", Some(other.as_os_str()));

    let got = pull_collect(&reference, &RegistryConfig::default(), &store, &CancellationToken::new()).await.0;
    match got {
        Err(e @ OciError::Registry { .. }) => {
            let text = e.to_string();
            assert!(text.starts_with(&format!("registry {}: ", tap.host())), "{text}");
            assert!(text.contains(&format!("the TLS certificate of {} is not trusted", tap.host())), "{text}");
            assert!(text.contains("UnknownIssuer") && text.contains("SSL_CERT_FILE"), "{text}");
        }
        other => panic!("{other:?}"),
    }
    assert!(stored(&store).is_empty(), "nothing stored");
    let firsts = tap.firsts();
    assert!(!firsts.is_empty() && firsts.iter().all(|&b| b == TLS_HANDSHAKE), "no plain HTTP: {firsts:?}");
    // The registry saw the handshake refused, and no request.
    // (It logs the handshake when its side of it ends: bounded by tries.)
    let mut log = String::new();
    for _ in 0..100 {
        log = reg.log()[pushed..].to_string();
        if log.contains("TLS handshake error") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(log.contains("TLS handshake error"), "{log}");
    assert!(!log.contains("\"GET "), "{log}");
}

#[tokio::test]
async fn a_tls_registry_is_never_downgraded_to_plain_http() {
    if !tls_tools() {
        return;
    }
    // A certificate from a trusted CA, for another name: a certificate
    // error, from a server that speaks TLS.
    let pki = TempDir::new("pki");
    let ca = make_ca(pki.path(), "ca");
    let cert = make_server_cert(pki.path(), "ca", "server", "DNS:registry.example");
    let reg = Registry::start_with(None, Some(&cert));
    let tap = Tap::start(reg.port);
    let t = TempDir::new("store");
    let store = BlobStore::new(t.path().join("blobs"));
    let mut env = EnvGuard::lock().await;
    env.set("SSL_CERT_DIR", None);
    env.set("SSL_CERT_FILE", Some(ca.as_os_str()));
    let cancel = CancellationToken::new();

    let reference = format!("{}/test/img:v1", tap.host());
    match pull_collect(&reference, &RegistryConfig::default(), &store, &cancel).await.0 {
        Err(e @ OciError::Registry { .. }) => {
            let text = e.to_string();
            assert!(text.contains(&format!("the TLS certificate of {} is not trusted", tap.host())), "{text}");
            assert!(text.contains("not valid for name"), "{text}");
        }
        other => panic!("{other:?}"),
    }
    // Nor as a mirror: it fails (over TLS), and the registry named, down,
    // has the last word.
    let down = format!("127.0.0.1:{}", free_port());
    let mut cfg = RegistryConfig::default();
    cfg.mirrors.insert(down.clone(), vec![tap.host()]);
    let got = pull_collect(&format!("{down}/test/img:v1"), &cfg, &store, &cancel).await.0;
    match got {
        Err(OciError::Registry { registry, .. }) => assert_eq!(registry, down),
        other => panic!("{other:?}"),
    }
    assert!(stored(&store).is_empty());
    let firsts = tap.firsts();
    assert!(firsts.len() >= 2 && firsts.iter().all(|&b| b == TLS_HANDSHAKE), "no plain HTTP: {firsts:?}");
    assert!(!reg.log().contains("\"GET "), "no request reached the registry: {}", reg.log());
}

#[tokio::test]
async fn a_plain_loopback_registry_is_tried_over_https_first_then_plain_http() {
    if !tools() {
        return;
    }
    let reg = Registry::start(None);
    let (dir, image) = layout("fallback", false);
    push(&format!("oci:{}:v1", dir.path().display()), &format!("{}/test/img:v1", reg.host()), &[]);
    let tap = Tap::start(reg.port);
    let t = TempDir::new("store");
    let cancel = CancellationToken::new();
    let reference = format!("{}/test/img:v1", tap.host());
    let store = BlobStore::new(t.path().join("blobs"));
    let got = pull_collect(&reference, &RegistryConfig::default(), &store, &cancel).await.0.unwrap();
    check_image(&got, &image, "fallback");
    let firsts = tap.firsts();
    assert!(firsts.len() >= 2, "{firsts:?}");
    assert_eq!(firsts[0], TLS_HANDSHAKE, "HTTPS first: {firsts:?}");
    assert!(firsts[1..].iter().all(|&b| b == b'G'), "then plain HTTP: {firsts:?}");

    // An http:// mirror is spoken to in plain HTTP alone.
    let before = firsts.len();
    let mut cfg = RegistryConfig::default();
    cfg.mirrors.insert("registry.invalid".to_string(), vec![format!("http://{}", tap.host())]);
    let store = BlobStore::new(t.path().join("mirrored"));
    let got = pull_collect("registry.invalid/test/img:v1", &cfg, &store, &cancel).await.0.unwrap();
    check_image(&got, &image, "fallback");
    let firsts = tap.firsts();
    assert!(firsts.len() > before && firsts[before..].iter().all(|&b| b == b'G'), "{firsts:?}");
}

/// A host without any CA certificate (an empty bundle and no directory):
/// no client can be made, for a plain loopback registry too (the HTTP
/// library loads them for every client); the pull says so and how to fix it,
/// and nothing is stored.
#[tokio::test]
async fn no_ca_certificates_at_all_is_an_error_naming_the_fix() {
    if !tools() {
        return;
    }
    let reg = Registry::start(None);
    let (dir, _) = layout("noca", false);
    push(&format!("oci:{}:v1", dir.path().display()), &format!("{}/test/img:v1", reg.host()), &[]);
    let t = TempDir::new("store");
    let empty = t.path().join("empty.pem");
    std::fs::write(&empty, "").unwrap();
    std::fs::create_dir(t.path().join("no-certs")).unwrap();
    let store = BlobStore::new(t.path().join("blobs"));
    let mut env = EnvGuard::lock().await;
    env.set("SSL_CERT_FILE", Some(empty.as_os_str()));
    env.set("SSL_CERT_DIR", Some(t.path().join("no-certs").as_os_str()));
    let reference = format!("{}/test/img:v1", reg.host());
    match pull_collect(&reference, &RegistryConfig::default(), &store, &CancellationToken::new()).await.0 {
        Err(e @ OciError::Registry { .. }) => {
            let text = e.to_string();
            assert!(text.contains("this host has no CA certificates"), "{text}");
            assert!(text.contains("ca-certificates") && text.contains("SSL_CERT_FILE"), "{text}");
        }
        other => panic!("{other:?}"),
    }
    assert!(stored(&store).is_empty(), "nothing stored");
}
