//! The image store: listing and looking up images (the build sequence is
//! `build`, Linux only).
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::refs::Holder;
use super::{IdMap, ImageError, ImageInfo, validate_name};

pub(super) const INFO_FILE: &str = "image.json";
pub(super) const ROOTFS_DIR: &str = "rootfs";
/// The OCI blob store under the store root; not usable as an image name.
pub(super) const BLOBS_DIR: &str = "blobs";

/// A directory of images, `<root>/<name>/{rootfs,image.json}`.
#[derive(Debug, Clone)]
pub struct ImageStore {
    pub(super) root: PathBuf,
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
    /// A store rooted at `root` (usually [`sandbox_base::paths::image_store`]). The
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
            if validate_name(&name).is_err()
                || name == BLOBS_DIR
                || !fs::metadata(entry.path()).is_ok_and(|m| m.is_dir())
            {
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

    /// Records image `name` as the OCI `reference`, which the VM layer pulls
    /// at the first boot (a Mac's helper; Linux's drivers refuse it), with
    /// the shell and package manager the image is known to have (nothing
    /// here can look inside it). With `force` it replaces such a record of
    /// that name that nothing is committed on; an image built here is
    /// deleted through the helper instead (its VMs may use its files).
    pub fn add_reference(
        &self,
        name: &str,
        reference: &str,
        shell: &str,
        package_manager: &str,
        force: bool,
    ) -> Result<ImageInfo, ImageError> {
        validate_name(name)?;
        if name == super::layers::LAYERS_DIR || name == BLOBS_DIR {
            return Err(ImageError::InvalidName(name.to_string()));
        }
        super::validate_reference(reference)?;
        fs::create_dir_all(&self.root).map_err(|e| ImageError::io(format!("creating {}", self.root.display()), e))?;
        let _guard = self.lock();
        match self.get(name) {
            Ok(old) if !force || old.reference.is_empty() => return Err(ImageError::AlreadyExists(name.to_string())),
            Ok(_) => self.refuse_with_children(name)?,
            Err(ImageError::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
        let info = ImageInfo {
            name: name.to_string(),
            created_at_ms: sandbox_base::clock::unix_ms(),
            shell: shell.to_string(),
            package_manager: package_manager.to_string(),
            reference: reference.to_string(),
            ..ImageInfo::default()
        };
        let dir = self.root.join(name);
        fs::create_dir_all(&dir).map_err(|e| ImageError::io(format!("creating {}", dir.display()), e))?;
        write_info(&dir.join(INFO_FILE), &info)?;
        Ok(info)
    }

    /// Root filesystem directory of an image (whether or not it exists).
    pub fn rootfs(&self, name: &str) -> PathBuf {
        self.root.join(name).join(ROOTFS_DIR)
    }
}

/// Best-effort recursive removal (never following symlinks): a leftover
/// only costs disk space, and the next build of that name (or the next layer
/// collection) removes it if its process is gone.
pub(super) fn remove_tree(path: &Path) {
    if let Err(e) = sandbox_userns::remove_tree(path) {
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
pub(super) mod tests {
    use super::test_dir::TempDir;
    use super::*;

    pub(crate) fn info(name: &str) -> ImageInfo {
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

    pub(crate) fn put(store: &ImageStore, i: &ImageInfo) {
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
    fn a_reference_is_recorded_listed_and_replaced_only_as_asked() {
        let t = TempDir::new("refs");
        let store = ImageStore::new(t.path().join("images"));
        let r = "docker.io/library/python:3.12-bookworm";
        let rec = store.add_reference("py", r, "/bin/bash", "apt", false).unwrap();
        assert_eq!((rec.reference.as_str(), rec.shell.as_str(), rec.package_manager.as_str()), (r, "/bin/bash", "apt"));
        assert!(rec.layers().is_empty(), "no rootfs here: the VM layer pulls it");
        assert_eq!(store.get("py").unwrap(), rec);
        assert_eq!(store.list().unwrap(), std::slice::from_ref(&rec));
        assert!(matches!(store.add_reference("py", r, "/bin/sh", "", false), Err(ImageError::AlreadyExists(_))));
        let again = store.add_reference("py", "ghcr.io/o/img@sha256:00ff", "/bin/sh", "", true).unwrap();
        assert_eq!(store.get("py").unwrap().reference, again.reference);
        // An image built here is not replaced by a record (its VMs use its files).
        put(&store, &info("built"));
        assert!(matches!(store.add_reference("built", r, "/bin/sh", "", true), Err(ImageError::AlreadyExists(_))));
        // Nor a reference something was committed on.
        put(&store, &ImageInfo { parent: "py".into(), reference: again.reference.clone(), ..info("child") });
        assert!(matches!(store.add_reference("py", r, "/bin/sh", "", true), Err(ImageError::HasChildren { .. })));
    }

    #[test]
    fn bad_references_and_names_are_refused_before_anything_is_written() {
        let t = TempDir::new("badrefs");
        let store = ImageStore::new(t.path().join("images"));
        for bad in ["", "-rm", "/abs", "a b", "a\nb", "x;y", &"a".repeat(256)] {
            let e = store.add_reference("ok", bad, "/bin/sh", "", false).unwrap_err();
            assert!(matches!(e, ImageError::InvalidReference(_)), "{bad:?}: {e}");
            assert!(e.to_string().contains("[registry/]repository"), "{e}");
        }
        assert!(matches!(store.add_reference("Bad", "alpine", "/bin/sh", "", false), Err(ImageError::InvalidName(_))));
        assert!(matches!(
            store.add_reference("layers", "alpine", "/bin/sh", "", false),
            Err(ImageError::InvalidName(_))
        ));
        assert!(!store.root().exists(), "nothing written");
    }
}
