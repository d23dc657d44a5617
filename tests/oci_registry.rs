//! `image::oci::registry::pull` against a real registry on loopback:
//! Debian's `docker-registry` (distribution v2), filled by `skopeo copy`
//! from OCI layouts these tests write (two tar+gzip layers and a tar+zstd
//! one), served in plain HTTP or over TLS with a test CA `openssl` makes.
//! Each test starts its own registry on a free 127.0.0.1 port, in its own
//! temporary directory, and kills it when done; nothing goes to the
//! network beyond loopback, and nothing needs root. Without docker-registry
//! or skopeo (or openssl, for TLS) each test says why and passes.
use std::collections::BTreeSet;
use std::ffi::OsString;
use std::io::{Read as _, Write as _};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use sandbox_mcp::image::oci::blobs::sha256_of;
use sandbox_mcp::image::oci::registry::{LayerState, PullProgress, RegistryConfig, pull};
use sandbox_mcp::image::oci::{BlobStore, FetchedImage, OciError, Reference, media};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const REGISTRY_BIN: &str = "/usr/bin/docker-registry";
const SKOPEO_BIN: &str = "/usr/bin/skopeo";
const GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
const ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";

/// Whether the tools are here; otherwise says which is missing.
fn tools() -> bool {
    for bin in [REGISTRY_BIN, SKOPEO_BIN] {
        if !Path::new(bin).is_file() {
            eprintln!("SKIP: {bin} is not installed (apt-get install docker-registry skopeo)");
            return false;
        }
    }
    true
}

/// A directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("smcp-oci-{}-{tag}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A docker-registry on 127.0.0.1, killed on drop.
struct Registry {
    child: Child,
    port: u16,
    dir: TempDir,
}

/// A server certificate and its key, for a registry served over TLS.
struct ServerCert {
    cert: PathBuf,
    key: PathBuf,
}

impl Registry {
    /// Starts one in plain HTTP, with basic auth from `htpasswd` if given.
    fn start(htpasswd: Option<&str>) -> Registry {
        Registry::start_with(htpasswd, None)
    }

    /// Starts one, with basic auth from `htpasswd` if given, over TLS with
    /// `tls` if given. A port taken between choosing and binding it makes
    /// the registry exit: another is tried.
    fn start_with(htpasswd: Option<&str>, tls: Option<&ServerCert>) -> Registry {
        let dir = TempDir::new("registry");
        if let Some(h) = htpasswd {
            std::fs::write(dir.path().join("htpasswd"), h).unwrap();
        }
        for _ in 0..5 {
            let port = free_port();
            let auth = match htpasswd {
                Some(_) => format!(
                    "auth:\n  htpasswd:\n    realm: test\n    path: {}\n",
                    dir.path().join("htpasswd").display()
                ),
                None => String::new(),
            };
            let tls = match tls {
                Some(c) => format!("  tls:\n    certificate: {}\n    key: {}\n", c.cert.display(), c.key.display()),
                None => String::new(),
            };
            let config = format!(
                "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n{tls}{auth}",
                dir.path().join("storage").display()
            );
            let config_path = dir.path().join("config.yml");
            std::fs::write(&config_path, config).unwrap();
            let log = std::fs::File::create(dir.path().join("registry.log")).unwrap();
            let mut child = clean_env(&mut Command::new(REGISTRY_BIN))
                .arg("serve")
                .arg(&config_path)
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .expect("start docker-registry");
            // Bounded by tries, not by time: the registry is up when it accepts.
            for _ in 0..400 {
                if child.try_wait().unwrap().is_some() {
                    break;
                }
                if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    return Registry { child, port, dir };
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        let log = std::fs::read_to_string(dir.path().join("registry.log")).unwrap_or_default();
        panic!("docker-registry did not start: {log}");
    }

    fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// What the registry logged (its requests, and the TLS handshakes that
    /// failed).
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    /// Where the registry keeps blob `digest`'s bytes.
    fn blob_data(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap();
        self.dir.path().join(format!("storage/docker/registry/v2/blobs/sha256/{}/{hex}/data", &hex[..2]))
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `cmd` without the REGISTRY_* variables: docker-registry reads them as
/// configuration (REGISTRY_AUTH_FILE, which the auth test sets, would be
/// `auth.file`), and skopeo would read that test's auth file.
fn clean_env(cmd: &mut Command) -> &mut Command {
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("REGISTRY_") {
            cmd.env_remove(key);
        }
    }
    cmd
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// An image written into an OCI layout, as the tests expect to find it.
struct Image {
    manifest: String,
    config: String,
    /// (digest, media type, diff_id), bottom first.
    layers: Vec<(String, String, String)>,
}

fn tar_of(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, data) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_mtime(0);
        h.set_cksum();
        b.append_data(&mut h, name, *data).unwrap();
    }
    b.into_inner().unwrap()
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

/// Writes `bytes` as a blob of the layout at `dir`; returns its descriptor.
fn put_blob(dir: &Path, media_type: &str, bytes: &[u8]) -> serde_json::Value {
    let digest = sha256_of(bytes);
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    std::fs::write(blobs.join(digest.strip_prefix("sha256:").unwrap()), bytes).unwrap();
    json!({"mediaType": media_type, "digest": digest, "size": bytes.len()})
}

fn goarch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// Writes an image for `arch` into the layout at `dir`: two tar+gzip
/// layers, and a tar+zstd one if `zstd`; its files say `tag`.
fn write_image(dir: &Path, arch: &str, tag: &str, zstd: bool) -> (serde_json::Value, Image) {
    let mut layers = Vec::new();
    let mut specs = vec![(GZIP, format!("{tag}-one")), (GZIP, format!("{tag}-two"))];
    if zstd {
        specs.push((ZSTD, format!("{tag}-three")));
    }
    let mut descriptors = Vec::new();
    let mut diff_ids = Vec::new();
    for (media_type, text) in &specs {
        let tar = tar_of(&[(&format!("{text}.txt"), text.as_bytes()), ("etc/shared", b"same")]);
        let blob = if *media_type == GZIP { gzip(&tar) } else { zstd::encode_all(&tar[..], 3).unwrap() };
        let d = put_blob(dir, media_type, &blob);
        layers.push((d["digest"].as_str().unwrap().to_string(), media_type.to_string(), sha256_of(&tar)));
        diff_ids.push(sha256_of(&tar));
        descriptors.push(d);
    }
    let config = json!({
        "architecture": arch, "os": "linux",
        "config": {"Env": ["PATH=/usr/bin:/bin", format!("IMAGE={tag}")], "WorkingDir": "/work", "User": "1000", "Cmd": ["sh"]},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    });
    let config = put_blob(dir, "application/vnd.oci.image.config.v1+json", config.to_string().as_bytes());
    let manifest =
        json!({"schemaVersion": 2, "mediaType": media::OCI_MANIFEST, "config": config, "layers": descriptors});
    let mut desc = put_blob(dir, media::OCI_MANIFEST, manifest.to_string().as_bytes());
    desc["platform"] = json!({"architecture": arch, "os": "linux"});
    let image = Image {
        manifest: desc["digest"].as_str().unwrap().to_string(),
        config: config["digest"].as_str().unwrap().to_string(),
        layers,
    };
    (desc, image)
}

/// Writes the layout's index.json naming `desc` `name`.
fn write_layout_index(dir: &Path, name: &str, mut desc: serde_json::Value) {
    desc.as_object_mut().unwrap().remove("platform");
    desc["annotations"] = json!({"org.opencontainers.image.ref.name": name});
    std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    std::fs::write(dir.join("index.json"), json!({"schemaVersion": 2, "manifests": [desc]}).to_string()).unwrap();
}

/// An image for this host in a new layout, tagged `v1`.
fn layout(tag: &str, zstd: bool) -> (TempDir, Image) {
    let dir = TempDir::new("layout");
    let (desc, image) = write_image(dir.path(), goarch(), tag, zstd);
    write_layout_index(dir.path(), "v1", desc);
    (dir, image)
}

/// `skopeo copy` from the layout at `dir` into `dest` (host/repo:tag);
/// TLS is not verified unless `extra` names a `--dest-cert-dir`.
fn push(src: &str, dest: &str, extra: &[&str]) {
    let verify = extra.iter().any(|a| a.starts_with("--dest-cert-dir"));
    let out = clean_env(&mut Command::new(SKOPEO_BIN))
        .args(["--insecure-policy", "copy"])
        .args((!verify).then_some("--dest-tls-verify=false"))
        .args(extra)
        .arg(src)
        .arg(format!("docker://{dest}"))
        .output()
        .expect("run skopeo");
    assert!(out.status.success(), "skopeo copy {src} {dest}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Pulls `reference`, collecting the progress reports.
async fn pull_collect(
    reference: &str,
    cfg: &RegistryConfig,
    store: &BlobStore,
    cancel: &CancellationToken,
) -> (Result<FetchedImage, OciError>, Vec<PullProgress>) {
    let events = Mutex::new(Vec::new());
    let report = |p: PullProgress| events.lock().unwrap().push(p);
    let r = pull(&Reference::parse(reference).unwrap(), cfg, store, &report, cancel).await;
    (r, events.into_inner().unwrap())
}

fn count(events: &[PullProgress], state: LayerState) -> usize {
    events.iter().filter(|e| e.state == state).count()
}

/// The blobs in `store`, and whether anything else (a partial) is there.
fn stored(store: &BlobStore) -> BTreeSet<String> {
    let Ok(dir) = std::fs::read_dir(store.root().join("sha256")) else { return BTreeSet::new() };
    let names: Vec<String> = dir.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    let partials: Vec<_> = names.iter().filter(|n| n.contains("partial")).collect();
    assert!(partials.is_empty(), "partial blobs left: {partials:?}");
    names.into_iter().filter(|n| !n.starts_with('.')).map(|n| format!("sha256:{n}")).collect()
}

fn check_image(got: &FetchedImage, want: &Image, tag: &str) {
    assert_eq!(got.config_digest, want.config);
    let layers: Vec<_> =
        got.layers.iter().map(|l| (l.digest.clone(), l.media_type.clone(), l.diff_id.clone())).collect();
    assert_eq!(layers, want.layers);
    assert_eq!(got.run.env["IMAGE"], tag);
    assert_eq!(got.run.env["PATH"], "/usr/bin:/bin");
    assert_eq!((got.run.workdir.as_str(), got.run.user.as_str()), ("/work", "1000"));
    assert_eq!(got.run.cmd, ["sh"]);
}

#[tokio::test]
async fn pulls_by_tag_and_digest_and_fetches_nothing_twice() {
    if !tools() {
        return;
    }
    let reg = Registry::start(None);
    let (dir, image) = layout("plain", true);
    push(&format!("oci:{}:v1", dir.path().display()), &format!("{}/test/img:v1", reg.host()), &[]);
    let t = TempDir::new("store");
    let store = BlobStore::new(t.path().join("blobs"));
    let cfg = RegistryConfig::default();
    let cancel = CancellationToken::new();
    let tagged = format!("{}/test/img:v1", reg.host());

    let (got, events) = pull_collect(&tagged, &cfg, &store, &cancel).await;
    let got = got.unwrap();
    check_image(&got, &image, "plain");
    assert_eq!(got.manifest_digest, image.manifest, "skopeo kept the manifest as written");
    assert_eq!(got.source, format!("{tagged}@{}", image.manifest));
    assert_eq!((count(&events, LayerState::Done), count(&events, LayerState::Present)), (3, 0));
    assert!(events.iter().all(|e| e.layers == 3 && e.done <= e.total));
    let mut want: BTreeSet<String> = image.layers.iter().map(|l| l.0.clone()).collect();
    want.insert(image.manifest.clone());
    want.insert(image.config.clone());
    assert_eq!(stored(&store), want);
    for digest in &want {
        assert_eq!(&sha256_of(&store.read(digest).unwrap()), digest);
    }

    let (again, events) = pull_collect(&tagged, &cfg, &store, &cancel).await;
    assert_eq!(again.unwrap(), got);
    assert_eq!((count(&events, LayerState::Done), count(&events, LayerState::Present)), (0, 3));

    let t2 = TempDir::new("store");
    let store2 = BlobStore::new(t2.path().join("blobs"));
    let pinned = format!("{}/test/img@{}", reg.host(), image.manifest);
    let (by_digest, events) = pull_collect(&pinned, &cfg, &store2, &cancel).await;
    let by_digest = by_digest.unwrap();
    check_image(&by_digest, &image, "plain");
    assert_eq!(by_digest.manifest_digest, image.manifest);
    assert_eq!(count(&events, LayerState::Done), 3);
    assert_eq!(stored(&store2), want);
    let both = format!("{}/test/img:v1@{}", reg.host(), image.manifest);
    assert_eq!(pull_collect(&both, &cfg, &store2, &cancel).await.0.unwrap().manifest_digest, image.manifest);
    let wrong = format!("{}/test/img@{}", reg.host(), image.config);
    let (err, _) = pull_collect(&wrong, &cfg, &BlobStore::new(t2.path().join("other")), &cancel).await;
    assert!(err.is_err(), "a digest that names no manifest");
}

#[tokio::test]
async fn docker_schema_2_images_pull_with_docker_media_types() {
    if !tools() {
        return;
    }
    let reg = Registry::start(None);
    let (dir, image) = layout("docker", false);
    push(&format!("oci:{}:v1", dir.path().display()), &format!("{}/test/docker:v1", reg.host()), &["--format", "v2s2"]);
    let t = TempDir::new("store");
    let store = BlobStore::new(t.path().join("blobs"));
    let (got, _) = pull_collect(
        &format!("{}/test/docker:v1", reg.host()),
        &RegistryConfig::default(),
        &store,
        &CancellationToken::new(),
    )
    .await;
    let got = got.unwrap();
    let manifest: serde_json::Value = serde_json::from_slice(&store.read(&got.manifest_digest).unwrap()).unwrap();
    assert_eq!(manifest["mediaType"], media::DOCKER_MANIFEST);
    let digests: Vec<_> = got.layers.iter().map(|l| (l.digest.clone(), l.diff_id.clone())).collect();
    let want: Vec<_> = image.layers.iter().map(|l| (l.0.clone(), l.2.clone())).collect();
    assert_eq!(digests, want);
    assert!(got.layers.iter().all(|l| l.media_type == "application/vnd.docker.image.rootfs.diff.tar.gzip"));
    assert_eq!(got.run.env["IMAGE"], "docker");
}

#[tokio::test]
async fn an_index_resolves_to_this_hosts_platform_or_says_what_it_has() {
    if !tools() {
        return;
    }
    let reg = Registry::start(None);
    let other = if goarch() == "s390x" { "ppc64le" } else { "s390x" };
    let dir = TempDir::new("layout");
    let (mine, image) = write_image(dir.path(), goarch(), "mine", true);
    let (theirs, _) = write_image(dir.path(), other, "theirs", false);
    let index = json!({"schemaVersion": 2, "mediaType": media::OCI_INDEX, "manifests": [theirs, mine]});
    let index_desc = put_blob(dir.path(), media::OCI_INDEX, index.to_string().as_bytes());
    write_layout_index(dir.path(), "v1", index_desc.clone());
    push(&format!("oci:{}:v1", dir.path().display()), &format!("{}/test/multi:v1", reg.host()), &["--all"]);

    let t = TempDir::new("store");
    let store = BlobStore::new(t.path().join("blobs"));
    let cancel = CancellationToken::new();
    let (got, _) =
        pull_collect(&format!("{}/test/multi:v1", reg.host()), &RegistryConfig::default(), &store, &cancel).await;
    let got = got.unwrap();
    check_image(&got, &image, "mine");
    assert_eq!(got.manifest_digest, image.manifest);
    let index_digest = index_desc["digest"].as_str().unwrap();
    assert!(got.source.ends_with(index_digest), "{}", got.source);
    assert!(store.contains(index_digest), "the index is stored too");

    let (only_other, _) = write_image(dir.path(), other, "only", false);
    let index = json!({"schemaVersion": 2, "mediaType": media::OCI_INDEX, "manifests": [only_other]});
    write_layout_index(dir.path(), "v2", put_blob(dir.path(), media::OCI_INDEX, index.to_string().as_bytes()));
    push(&format!("oci:{}:v2", dir.path().display()), &format!("{}/test/multi:v2", reg.host()), &["--all"]);
    let (err, _) =
        pull_collect(&format!("{}/test/multi:v2", reg.host()), &RegistryConfig::default(), &store, &cancel).await;
    match err {
        Err(OciError::NoPlatform { platform, available, .. }) => {
            assert!(platform.starts_with(&format!("linux/{}", goarch())), "{platform}");
            assert_eq!(available, format!("linux/{other}"));
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn concurrent_pulls_store_each_blob_once() {
    if !tools() {
        return;
    }
    let reg = Registry::start(None);
    let (dir, image) = layout("both", true);
    push(&format!("oci:{}:v1", dir.path().display()), &format!("{}/test/img:v1", reg.host()), &[]);
    let t = TempDir::new("store");
    let store = BlobStore::new(t.path().join("blobs"));
    let cfg = RegistryConfig::default();
    let cancel = CancellationToken::new();
    let reference = format!("{}/test/img:v1", reg.host());
    let ((a, ea), (b, eb)) =
        tokio::join!(pull_collect(&reference, &cfg, &store, &cancel), pull_collect(&reference, &cfg, &store, &cancel));
    assert_eq!(a.unwrap(), b.unwrap());
    let events: Vec<_> = ea.into_iter().chain(eb).collect();
    assert_eq!(count(&events, LayerState::Done), 3, "each layer fetched once: {events:?}");
    assert_eq!(count(&events, LayerState::Present), 3);
    let mut want: BTreeSet<String> = image.layers.iter().map(|l| l.0.clone()).collect();
    want.extend([image.manifest, image.config]);
    assert_eq!(stored(&store), want);
}

#[tokio::test]
async fn a_tampered_blob_is_refused_and_not_kept() {
    if !tools() {
        return;
    }
    let reg = Registry::start(None);
    let (dir, image) = layout("tamper", true);
    push(&format!("oci:{}:v1", dir.path().display()), &format!("{}/test/img:v1", reg.host()), &[]);
    let victim = &image.layers[1].0;
    let data = reg.blob_data(victim);
    let mut bytes = std::fs::read(&data).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&data, bytes).unwrap();

    let t = TempDir::new("store");
    let store = BlobStore::new(t.path().join("blobs"));
    let (got, _) = pull_collect(
        &format!("{}/test/img:v1", reg.host()),
        &RegistryConfig::default(),
        &store,
        &CancellationToken::new(),
    )
    .await;
    match got {
        Err(OciError::DigestMismatch { expected, .. }) => assert_eq!(&expected, victim),
        other => panic!("{other:?}"),
    }
    assert!(!store.contains(victim));
    assert!(!stored(&store).contains(victim));
}

#[tokio::test]
async fn a_missing_tag_says_so() {
    if !tools() {
        return;
    }
    let reg = Registry::start(None);
    let (dir, _) = layout("missing", false);
    push(&format!("oci:{}:v1", dir.path().display()), &format!("{}/test/img:v1", reg.host()), &[]);
    let t = TempDir::new("store");
    let store = BlobStore::new(t.path().join("blobs"));
    let reference = format!("{}/test/img:nope", reg.host());
    let (got, _) = pull_collect(&reference, &RegistryConfig::default(), &store, &CancellationToken::new()).await;
    match got {
        Err(e @ OciError::Registry { .. }) => {
            let text = e.to_string();
            assert!(text.contains(&format!("{reference} not found")), "{text}");
        }
        other => panic!("{other:?}"),
    }
    assert!(stored(&store).is_empty());
}

#[tokio::test]
async fn basic_auth_with_credentials_from_the_auth_file() {
    if !tools() {
        return;
    }
    let (user, password) = ("tester", "s3cret-pw");
    let hash = bcrypt::hash(password, 4).unwrap();
    let reg = Registry::start(Some(&format!("{user}:{hash}\n")));
    let (dir, image) = layout("auth", false);
    let creds = format!("--dest-creds={user}:{password}");
    push(&format!("oci:{}:v1", dir.path().display()), &format!("{}/test/img:v1", reg.host()), &[&creds]);
    let t = TempDir::new("store");
    let store = BlobStore::new(t.path().join("blobs"));
    let cfg = RegistryConfig::default();
    let cancel = CancellationToken::new();
    let reference = format!("{}/test/img:v1", reg.host());

    let auth_file = t.path().join("auth.json");
    let write_auth = |pw: &str| {
        let auth = base64_encode(&format!("{user}:{pw}"));
        let json = json!({"auths": {reg.host(): {"auth": auth}}});
        std::fs::write(&auth_file, json.to_string()).unwrap();
    };
    let mut env = EnvGuard::lock().await;
    env.set("REGISTRY_AUTH_FILE", Some(auth_file.as_os_str()));

    write_auth("wrong");
    match pull_collect(&reference, &cfg, &store, &cancel).await.0 {
        Err(e @ OciError::Unauthorized { .. }) => assert!(!e.to_string().contains(password)),
        other => panic!("{other:?}"),
    }
    std::fs::remove_file(&auth_file).unwrap();
    assert!(matches!(pull_collect(&reference, &cfg, &store, &cancel).await.0, Err(OciError::Unauthorized { .. })));
    write_auth(password);
    let got = pull_collect(&reference, &cfg, &store, &cancel).await.0.unwrap();
    check_image(&got, &image, "auth");
}

fn base64_encode(text: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(text)
}

#[tokio::test]
async fn mirrors_are_tried_first_and_plain_http_elsewhere_is_refused() {
    if !tools() {
        return;
    }
    // The registry named in the reference lacks the image; the first mirror
    // is down, the second has it.
    let named = Registry::start(None);
    let mirror = Registry::start(None);
    let (dir, image) = layout("mirror", false);
    push(&format!("oci:{}:v1", dir.path().display()), &format!("{}/test/img:v1", mirror.host()), &[]);
    let down = format!("127.0.0.1:{}", free_port());
    let t = TempDir::new("store");
    let store = BlobStore::new(t.path().join("blobs"));
    let cancel = CancellationToken::new();
    let reference = format!("{}/test/img:v1", named.host());
    let mut cfg = RegistryConfig::default();
    cfg.mirrors.insert(named.host(), vec![down.clone(), format!("http://{}", mirror.host())]);
    let got = pull_collect(&reference, &cfg, &store, &cancel).await.0.unwrap();
    check_image(&got, &image, "mirror");
    cfg.mirrors.clear();
    let t2 = TempDir::new("store");
    let (err, _) = pull_collect(&reference, &cfg, &BlobStore::new(t2.path().join("blobs")), &cancel).await;
    assert!(matches!(err, Err(OciError::Registry { .. })), "{err:?}");

    // Plain HTTP to a name that is not loopback is refused before anything
    // is sent (the name could never be resolved anyway).
    cfg.mirrors.insert(named.host(), vec!["http://registry.invalid:5000".to_string()]);
    match pull_collect(&reference, &cfg, &store, &cancel).await.0 {
        Err(e @ OciError::Registry { .. }) => assert!(e.to_string().contains("plain HTTP is refused"), "{e}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_cancelled_pull_keeps_no_partial_blob() {
    if !tools() {
        return;
    }
    let reg = Registry::start(None);
    let (dir, image) = layout("cancel", true);
    push(&format!("oci:{}:v1", dir.path().display()), &format!("{}/test/img:v1", reg.host()), &[]);
    let t = TempDir::new("store");
    let store = BlobStore::new(t.path().join("blobs"));
    let cancel = CancellationToken::new();
    let report = |p: PullProgress| {
        if p.state == LayerState::Downloading && p.layer == 1 {
            cancel.cancel();
        }
    };
    let reference = Reference::parse(&format!("{}/test/img:v1", reg.host())).unwrap();
    let got = pull(&reference, &RegistryConfig::default(), &store, &report, &cancel).await;
    assert!(matches!(got, Err(OciError::Cancelled)), "{got:?}");
    let kept = stored(&store);
    assert!(kept.contains(&image.layers[0].0));
    assert!(!kept.contains(&image.layers[1].0) && !kept.contains(&image.layers[2].0));

    let (before, _) = pull_collect(&reference.to_string(), &RegistryConfig::default(), &store, &cancel).await;
    assert!(matches!(before, Err(OciError::Cancelled)), "a cancelled token stops a pull before it starts");
    assert_eq!(stored(&store), kept);
}

/// The environment the puller reads (the auth file, the CA store), changed
/// by one test at a time: the guard holds a lock across the test's awaits
/// and puts back what it changed when dropped.
struct EnvGuard {
    _lock: tokio::sync::MutexGuard<'static, ()>,
    saved: Vec<(&'static str, Option<OsString>)>,
}

static ENV_LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

impl EnvGuard {
    async fn lock() -> EnvGuard {
        EnvGuard { _lock: ENV_LOCK.lock().await, saved: Vec::new() }
    }

    /// Sets `key` to `value`, or removes it.
    fn set(&mut self, key: &'static str, value: Option<&std::ffi::OsStr>) {
        if !self.saved.iter().any(|(k, _)| *k == key) {
            self.saved.push((key, std::env::var_os(key)));
        }
        set_env(key, value);
    }
}

impl Drop for EnvGuard {
    fn drop(&mut self) {
        for (key, value) in self.saved.drain(..).rev() {
            set_env(key, value.as_deref());
        }
    }
}

fn set_env(key: &str, value: Option<&std::ffi::OsStr>) {
    // SAFETY: the other tests of this binary read the environment only
    // through std (which locks it, getaddrinfo included). What changes is
    // the auth file (naming one test's registry alone) and the CA store,
    // which their plain HTTP registries do not use.
    unsafe {
        match value {
            Some(v) => std::env::set_var(key, v),
            None => std::env::remove_var(key),
        }
    }
}

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
