//! `image::oci::registry::pull` against a real registry on loopback:
//! Debian's `docker-registry` (distribution v2), filled by `skopeo copy`
//! from OCI layouts these tests write (two tar+gzip layers and a tar+zstd
//! one), served in plain HTTP or over TLS with a test CA `openssl` makes.
//! Each test starts its own registry on a free 127.0.0.1 port, in its own
//! temporary directory, and kills it when done; nothing goes to the
//! network beyond loopback, and nothing needs root. Without docker-registry
//! or skopeo (or openssl, for TLS) each test says why and passes.
//!
//! The tests have a file each for plain HTTP and TLS registries under
//! `oci_registry/`; the registry, layouts and helpers they share are here.
use std::collections::BTreeSet;
use std::ffi::OsString;
use std::io::{Read as _, Write as _};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use sandbox_image::oci::blobs::sha256_of;
use sandbox_image::oci::registry::{LayerState, PullProgress, RegistryConfig, pull};
use sandbox_image::oci::{BlobStore, FetchedImage, OciError, Reference, media};
use serde_json::json;
use tokio_util::sync::CancellationToken;

#[path = "oci_registry/pulls.rs"]
mod pulls;
#[path = "oci_registry/tls.rs"]
mod tls;

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

fn base64_encode(text: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(text)
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
