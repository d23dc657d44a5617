//! The image store: listing and looking up images, and the build sequence.
//!
//! A build happens in `<root>/.<name>.building-<pid>` and is renamed into
//! place only when complete, so readers never see a half-built image and a
//! crashed build leaves nothing that `list` would report.
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use super::mmdebstrap::{self, Mode};
use super::refs::Holder;
use super::{BuildRequest, DEFAULT_SUITE, IdMap, ImageError, ImageInfo, inspect, package_list, unpack, validate_name};
use crate::helper::driver::userns::{self, IdMapper};

pub(super) const INFO_FILE: &str = "image.json";
pub(super) const ROOTFS_DIR: &str = "rootfs";
/// mmdebstrap's output in a build directory, removed once unpacked.
const TARBALL: &str = "rootfs.tar";

/// A directory of images, `<root>/<name>/{rootfs,image.json}`.
#[derive(Debug, Clone)]
pub struct ImageStore {
    root: PathBuf,
    /// Serializes what changes which layers are referenced (installing a
    /// committed image, deleting one, registering a VM) against garbage
    /// collection, which must never see a layer between its rename into
    /// place and the image.json naming it; see [`ImageStore::lock`], which
    /// adds a file lock for the other processes sharing the store.
    pub(super) mutex: Arc<Mutex<()>>,
    /// This process's references to layers on disk (a helper's store).
    pub(super) holder: Option<Arc<Holder>>,
}

impl ImageStore {
    /// A store rooted at `root` (usually [`crate::paths::image_store`]). The
    /// directory is created by the first build.
    pub fn new(root: PathBuf) -> Self {
        ImageStore { root, mutex: Arc::new(Mutex::new(())), holder: None }
    }

    /// The store's directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Every image, sorted by name. Directories that are not images (no or
    /// unreadable `image.json`, builds in progress) are left out, so one
    /// damaged image does not hide the others; `get` reports what is wrong.
    pub fn list(&self) -> Result<Vec<ImageInfo>, ImageError> {
        let entries = match fs::read_dir(&self.root) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(ImageError::io(format!("reading {}", self.root.display()), e)),
        };
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| ImageError::io(format!("reading {}", self.root.display()), e))?;
            let Some(name) = entry.file_name().to_str().map(String::from) else { continue };
            // Through symlinks: a test store links its base image to a shared copy.
            if validate_name(&name).is_err() || !fs::metadata(entry.path()).is_ok_and(|m| m.is_dir()) {
                continue;
            }
            match self.get(&name) {
                Ok(info) => out.push(info),
                Err(ImageError::NotFound(_)) => {}
                Err(e) => tracing::warn!(image = %name, error = %e, "skipping unreadable image"),
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// One image by name.
    pub fn get(&self, name: &str) -> Result<ImageInfo, ImageError> {
        validate_name(name)?;
        let path = self.root.join(name).join(INFO_FILE);
        let text = match fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory) => {
                return Err(ImageError::NotFound(name.to_string()));
            }
            Err(e) => return Err(ImageError::io(format!("reading {}", path.display()), e)),
        };
        parse_info(&path, &text)
    }

    /// Root filesystem directory of an image (whether or not it exists).
    pub fn rootfs(&self, name: &str) -> PathBuf {
        self.root.join(name).join(ROOTFS_DIR)
    }

    /// Builds an image with mmdebstrap for sandboxes mapped by `mapper`, or
    /// returns the existing one unless `req.force` (or it was built for
    /// another map, which no sandbox here could use). Each line mmdebstrap
    /// prints, and each step of ours, goes to `progress`. Blocks for the
    /// whole build (tens of seconds to minutes).
    pub fn build(
        &self,
        req: &BuildRequest,
        mapper: &IdMapper,
        progress: &mut dyn FnMut(&str),
    ) -> Result<ImageInfo, ImageError> {
        req.check()?;
        let suite = if req.suite.is_empty() { DEFAULT_SUITE } else { req.suite.as_str() };
        let packages = package_list(&req.packages)?;
        let mut force = req.force;
        if !force {
            match self.get(&req.name) {
                Ok(info) if info.check_id_map(mapper.id_map()).is_ok() => return Ok(info),
                Ok(info) => {
                    progress(&format!(
                        "rebuilding image {}: it was built for other ids ({})",
                        info.name,
                        info.id_map.describe()
                    ));
                    force = true;
                }
                Err(ImageError::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        fs::create_dir_all(&self.root).map_err(|e| ImageError::io(format!("creating {}", self.root.display()), e))?;
        self.remove_stale_builds(&req.name);

        let work = BuildDir::create(self.root.join(format!(".{}.building-{}", req.name, std::process::id())))?;
        let rootfs = work.0.join(ROOTFS_DIR);
        let tarball = work.0.join(TARBALL);
        let sources = mmdebstrap::host_sources(Path::new("/etc/apt"));
        progress(&format!("building image {} ({suite}: {})", req.name, packages.join(" ")));
        let mode = Mode::current();
        let args = mmdebstrap::args(mode, suite, &packages, &tarball, &sources);
        let tmpdir = mmdebstrap::tmpdir(mode, &std::env::temp_dir(), &[Path::new("/var/tmp"), Path::new("/tmp")]);
        mmdebstrap::run("mmdebstrap", &args, tmpdir.as_deref(), progress)?;
        progress(&format!("unpacking for the sandbox's ids ({})", mapper.id_map().describe()));
        unpack::unpack(mapper, &tarball, &rootfs)?;
        fs::remove_file(&tarball).map_err(|e| ImageError::io(format!("removing {}", tarball.display()), e))?;
        let info = ImageInfo {
            name: req.name.clone(),
            size_bytes: inspect::disk_usage(&rootfs),
            created_at_ms: now_ms(),
            shell: inspect::shell(&rootfs),
            package_manager: inspect::package_manager(&rootfs),
            id_map: mapper.id_map().clone(),
            ..ImageInfo::default()
        };
        write_info(&work.0.join(INFO_FILE), &info)?;
        self.install(work, &req.name, force)?;
        progress(&format!("image {} ready ({} MB)", info.name, info.size_bytes / 1_000_000));
        if force { Ok(info) } else { self.get(&req.name) }
    }

    /// Moves a finished build into place. With `force` the old image is moved
    /// aside first and deleted after, so the name is never without an image
    /// for longer than two renames. Without `force`, a concurrent build that
    /// finished first wins and ours is discarded.
    fn install(&self, work: BuildDir, name: &str, force: bool) -> Result<(), ImageError> {
        let target = self.root.join(name);
        let old = self.root.join(format!(".{name}.old-{}", std::process::id()));
        let replaced = force && target.exists();
        if replaced {
            fs::rename(&target, &old).map_err(|e| ImageError::io(format!("moving {} aside", target.display()), e))?;
        }
        match fs::rename(&work.0, &target) {
            Ok(()) => work.keep(),
            Err(_) if !force && target.join(INFO_FILE).exists() => {}
            Err(e) => {
                if replaced {
                    let _ = fs::rename(&old, &target);
                }
                return Err(ImageError::io(format!("renaming build into {}", target.display()), e));
            }
        }
        if replaced {
            remove_tree(&old);
        }
        Ok(())
    }

    /// Removes `.<name>.building-<pid>` / `.<name>.old-<pid>` left by
    /// processes that no longer exist (a crash or kill mid-build).
    fn remove_stale_builds(&self, name: &str) {
        let Ok(entries) = fs::read_dir(&self.root) else { return };
        for entry in entries.flatten() {
            let file = entry.file_name();
            let Some(file) = file.to_str() else { continue };
            let pid = [".building-", ".old-"]
                .iter()
                .find_map(|sep| file.strip_prefix(&format!(".{name}{sep}")))
                .and_then(|p| p.parse::<u32>().ok());
            if let Some(pid) = pid
                && !Path::new(&format!("/proc/{pid}")).exists()
            {
                remove_tree(&entry.path());
            }
        }
    }
}

/// A build directory that is deleted on drop unless kept: every early return
/// of a failed build cleans up without repeating itself.
struct BuildDir(PathBuf);

impl BuildDir {
    fn create(path: PathBuf) -> Result<Self, ImageError> {
        if path.exists() {
            remove_tree(&path);
        }
        fs::create_dir(&path).map_err(|e| ImageError::io(format!("creating {}", path.display()), e))?;
        Ok(BuildDir(path))
    }

    fn keep(self) {
        std::mem::forget(self);
    }
}

impl Drop for BuildDir {
    fn drop(&mut self) {
        remove_tree(&self.0);
    }
}

/// Best-effort recursive removal (never following symlinks): a leftover
/// only costs disk space, and the next build of that name (or the next layer
/// collection) removes it if its process is gone.
pub(super) fn remove_tree(path: &Path) {
    if let Err(e) = userns::remove_tree(path) {
        tracing::warn!(path = %path.display(), error = %e, "cannot remove");
    }
}

/// Reads `image.json`. One written before id maps were recorded describes
/// its single range as `uid_base`/`id_count`, uids and gids alike.
pub(super) fn parse_info(path: &Path, text: &str) -> Result<ImageInfo, ImageError> {
    let bad = |source| ImageError::Metadata { path: path.to_path_buf(), source };
    let mut value: serde_json::Value = serde_json::from_str(text).map_err(bad)?;
    if let Some(obj) = value.as_object_mut()
        && !obj.contains_key("id_map")
    {
        let id = |key: &str| obj.get(key).and_then(serde_json::Value::as_u64).and_then(|v| u32::try_from(v).ok());
        let map = IdMap::shifted(id("uid_base").unwrap_or(0), id("id_count").unwrap_or(0));
        obj.insert("id_map".into(), serde_json::to_value(map).map_err(bad)?);
    }
    serde_json::from_value(value).map_err(bad)
}

/// Writes `image.json` through a temp file and a rename, so a reader (or a
/// crash) never sees half of it.
pub(super) fn write_info(path: &Path, info: &ImageInfo) -> Result<(), ImageError> {
    let mut text = serde_json::to_string_pretty(info)
        .map_err(|source| ImageError::Metadata { path: path.to_path_buf(), source })?;
    text.push('\n');
    let tmp = path.with_extension(format!("json.tmp-{}", std::process::id()));
    fs::write(&tmp, text).map_err(|e| ImageError::io(format!("writing {}", tmp.display()), e))?;
    fs::rename(&tmp, path).map_err(|e| {
        let _ = fs::remove_file(&tmp);
        ImageError::io(format!("renaming {} into place", path.display()), e)
    })
}

pub(super) fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// A self-removing temporary directory for tests (the crate has no tempfile
/// dependency).
#[cfg(test)]
pub(super) mod test_dir {
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicU32, Ordering};

    static NEXT: AtomicU32 = AtomicU32::new(0);

    pub(crate) struct TempDir(PathBuf);

    impl TempDir {
        pub(crate) fn new(tag: &str) -> Self {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let p = std::env::temp_dir().join(format!("smcp-image-{tag}-{}-{n}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            TempDir(p)
        }

        pub(crate) fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_dir::TempDir;
    use super::*;

    fn info(name: &str) -> ImageInfo {
        ImageInfo {
            name: name.into(),
            size_bytes: 123,
            created_at_ms: 1_700_000_000_000,
            shell: "/bin/bash".into(),
            package_manager: "apt".into(),
            id_map: IdMap::shifted(100_000, 65_536),
            ..ImageInfo::default()
        }
    }

    /// This user's mapper (the unit tests run as root or as a user with a
    /// subordinate range).
    fn mapper() -> IdMapper {
        IdMapper::detect().expect("an id map for the test user")
    }

    fn put(store: &ImageStore, i: &ImageInfo) {
        fs::create_dir_all(store.rootfs(&i.name)).unwrap();
        write_info(&store.root().join(&i.name).join(INFO_FILE), i).unwrap();
    }

    #[test]
    fn info_round_trips_and_list_is_sorted_and_skips_non_images() {
        let t = TempDir::new("store");
        let store = ImageStore::new(t.path().join("images"));
        assert!(store.list().unwrap().is_empty(), "a missing store is empty");
        for n in ["zeta", "alpha", "mcp-dev"] {
            put(&store, &info(n));
        }
        fs::create_dir_all(store.root().join(".alpha.building-1/rootfs")).unwrap();
        fs::create_dir_all(store.root().join("no-metadata")).unwrap();
        fs::create_dir_all(store.root().join("broken")).unwrap();
        fs::write(store.root().join("broken").join(INFO_FILE), "{not json").unwrap();
        fs::create_dir_all(store.root().join("Upper")).unwrap();
        fs::write(store.root().join("build.log"), "not an image").unwrap();

        let names: Vec<_> = store.list().unwrap().into_iter().map(|i| i.name).collect();
        assert_eq!(names, ["alpha", "mcp-dev", "zeta"]);
        assert_eq!(store.get("mcp-dev").unwrap(), info("mcp-dev"));
        assert_eq!(store.rootfs("mcp-dev"), t.path().join("images/mcp-dev/rootfs"));
        assert!(matches!(store.get("broken"), Err(ImageError::Metadata { .. })));
        assert!(matches!(store.get("build.log"), Err(ImageError::NotFound(_))));
    }

    #[test]
    fn get_reports_missing_and_invalid_names() {
        let t = TempDir::new("get");
        let store = ImageStore::new(t.path().to_path_buf());
        assert!(matches!(store.get("nope"), Err(ImageError::NotFound(n)) if n == "nope"));
        assert!(matches!(store.get("../etc"), Err(ImageError::InvalidName(_))));
    }

    #[test]
    fn list_of_unreadable_root_is_an_error() {
        let t = TempDir::new("notdir");
        let file = t.path().join("file");
        fs::write(&file, b"").unwrap();
        assert!(matches!(ImageStore::new(file).list(), Err(ImageError::Io { .. })));
    }

    #[test]
    fn build_of_existing_image_returns_it_without_building() {
        let t = TempDir::new("idem");
        let store = ImageStore::new(t.path().to_path_buf());
        let mapper = mapper();
        let built = ImageInfo { id_map: mapper.id_map().clone(), ..info("mcp-dev") };
        put(&store, &built);
        let req = BuildRequest { name: "mcp-dev".into(), suite: String::new(), packages: vec![], force: false };
        let mut lines = 0;
        assert_eq!(store.build(&req, &mapper, &mut |_| lines += 1).unwrap(), built);
        assert_eq!(lines, 0);
    }

    #[test]
    fn build_rejects_bad_requests_before_touching_disk() {
        let t = TempDir::new("badreq");
        let store = ImageStore::new(t.path().join("images"));
        let req = |name: &str, suite: &str, pkg: &str| BuildRequest {
            name: name.into(),
            suite: suite.into(),
            packages: vec![pkg.into()],
            force: true,
        };
        let (mut p, m) = (|_: &str| {}, mapper());
        assert!(matches!(store.build(&req("Bad", "", "x"), &m, &mut p), Err(ImageError::InvalidName(_))));
        assert!(matches!(store.build(&req("ok", "../s", "x"), &m, &mut p), Err(ImageError::InvalidSuite(_))));
        assert!(matches!(store.build(&req("ok", "", "-o=x"), &m, &mut p), Err(ImageError::InvalidPackage(_))));
        assert!(!store.root().exists());
    }

    #[test]
    fn failed_build_leaves_nothing_behind_and_explains() {
        if !Path::new("/usr/bin/mmdebstrap").exists() || !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs mmdebstrap and root");
            return;
        }
        let t = TempDir::new("fail");
        let store = ImageStore::new(t.path().join("images"));
        let req = BuildRequest {
            name: "broken".into(),
            suite: "bookworm".into(),
            packages: vec!["no-such-package-sandbox-mcp".into()],
            force: false,
        };
        let err = store.build(&req, &mapper(), &mut |_| {}).unwrap_err();
        assert!(matches!(err, ImageError::BuildFailed { .. }), "{err}");
        assert!(err.to_string().contains("no-such-package-sandbox-mcp"), "{err}");
        assert_eq!(fs::read_dir(store.root()).unwrap().count(), 0, "temp build dir must be removed");
    }

    #[test]
    fn stale_builds_of_dead_processes_are_removed() {
        let t = TempDir::new("stale");
        let store = ImageStore::new(t.path().to_path_buf());
        let dead = t.path().join(".img.building-4000000");
        let old = t.path().join(".img.old-4000001");
        let live = t.path().join(format!(".img.building-{}", std::process::id()));
        let other = t.path().join(".other.building-4000000");
        for d in [&dead, &old, &live, &other] {
            fs::create_dir_all(d.join("rootfs")).unwrap();
        }
        store.remove_stale_builds("img");
        assert!(!dead.exists() && !old.exists());
        assert!(live.exists() && other.exists());
    }
}
