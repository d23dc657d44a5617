//! Layer bookkeeping: staging and installing a committed layer with its
//! image, deleting images, and removing layers nothing uses any more.
//!
//! A layer is named by its path relative to the store root: `layers/<hex>`
//! for committed layers, `<name>/rootfs` for base images. Who uses a layer is
//! recomputed from every `image.json` plus the references every live helper
//! sharing the store keeps for its VMs (see [`super::refs`]), so a crash can
//! at worst leave an unused layer behind for the next collection.
use std::collections::HashSet;
use std::fs;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use super::store::{INFO_FILE, ROOTFS_DIR, parse_info, remove_tree, write_info};
use super::{ImageError, ImageInfo, ImageStore, validate_name};

/// Directory of committed layers under the store root; not usable as an
/// image name.
pub(super) const LAYERS_DIR: &str = "layers";
/// Most layers an image may stack. overlayfs takes up to 500 lower layers,
/// but its options must fit one page, and each layer costs ~14 bytes there
/// (`/tmp/lower<i>:`); this leaves ample room for the rest.
pub const MAX_LAYERS: usize = 128;
/// Prefix of a layer being copied: `.tmp-<pid>-<hex>`.
const TMP_PREFIX: &str = ".tmp-";

/// A layer being copied into the store: a path under `<store>/layers/` that
/// [`crate::copy_tree`] fills. Removed on drop unless installed.
#[derive(Debug)]
pub struct StagedLayer {
    path: PathBuf,
    id: String,
    installed: bool,
}

impl StagedLayer {
    /// Where the layer's content goes (does not exist yet).
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for StagedLayer {
    fn drop(&mut self) {
        if !self.installed {
            remove_tree(&self.path);
        }
    }
}

impl ImageStore {
    /// Absolute directories of an image's layers, bottom first.
    pub fn layer_paths(&self, layers: &[String]) -> Vec<PathBuf> {
        layers.iter().map(|l| self.root().join(l)).collect()
    }

    /// A fresh staging path for a layer.
    pub fn stage_layer(&self) -> Result<StagedLayer, ImageError> {
        let dir = self.root().join(LAYERS_DIR);
        fs::create_dir_all(&dir).map_err(|e| ImageError::io(format!("creating {}", dir.display()), e))?;
        let id = random_hex()?;
        let path = dir.join(format!("{TMP_PREFIX}{}-{id}", std::process::id()));
        Ok(StagedLayer { path, id, installed: false })
    }

    /// Installs `staged` as the top layer of `info` (appended to
    /// `info.layers`) and writes the image. Fails with `AlreadyExists` if the
    /// name was taken meanwhile; nothing stays behind on any failure.
    pub fn install_layer(&self, mut staged: StagedLayer, mut info: ImageInfo) -> Result<ImageInfo, ImageError> {
        validate_name(&info.name)?;
        if info.name == LAYERS_DIR {
            return Err(ImageError::InvalidName(info.name));
        }
        if info.layers.len() >= MAX_LAYERS {
            return Err(ImageError::TooManyLayers { name: info.name, max: MAX_LAYERS });
        }
        let _guard = self.lock();
        let dir = self.root().join(&info.name);
        let created = match fs::create_dir(&dir) {
            Ok(()) => true,
            // A deleted base image whose rootfs is still in use keeps its
            // directory; the name itself is free.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && !dir.join(INFO_FILE).exists() => false,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(ImageError::AlreadyExists(info.name));
            }
            Err(e) => return Err(ImageError::io(format!("creating {}", dir.display()), e)),
        };
        let rel = format!("{LAYERS_DIR}/{}", staged.id);
        let target = self.root().join(&rel);
        let undo_dir = || {
            if created {
                let _ = fs::remove_dir(&dir);
            }
        };
        if let Err(e) = fs::rename(&staged.path, &target) {
            undo_dir();
            return Err(ImageError::io(format!("renaming layer into {}", target.display()), e));
        }
        info.layers.push(rel);
        if let Err(e) = write_info(&dir.join(INFO_FILE), &info) {
            remove_tree(&target);
            undo_dir();
            return Err(e);
        }
        staged.installed = true;
        Ok(info)
    }

    /// Deletes an image, refusing while others name it as their parent, then
    /// collects layers nothing uses. A symlinked image directory loses only
    /// the link.
    pub fn delete(&self, name: &str) -> Result<(), ImageError> {
        {
            let _guard = self.lock();
            self.get(name)?;
            self.refuse_with_children(name)?;
            let dir = self.root().join(name);
            let is_link = dir.symlink_metadata().is_ok_and(|m| m.file_type().is_symlink());
            let victim = if is_link { dir.clone() } else { dir.join(INFO_FILE) };
            fs::remove_file(&victim).map_err(|e| ImageError::io(format!("removing {}", victim.display()), e))?;
            if !is_link {
                // Only succeeds once empty: a base image's rootfs stays for `gc`.
                let _ = fs::remove_dir(&dir);
            }
        }
        self.gc()?;
        Ok(())
    }

    /// `HasChildren` while another image names `name` as its parent: their
    /// layers stand on its own, so it can be neither deleted nor replaced.
    /// Callers hold the store's lock.
    pub(super) fn refuse_with_children(&self, name: &str) -> Result<(), ImageError> {
        let children: Vec<String> =
            self.list()?.into_iter().filter(|i| i.parent == name && i.name != name).map(|i| i.name).collect();
        if children.is_empty() { Ok(()) } else { Err(ImageError::HasChildren { name: name.to_string(), children }) }
    }

    /// Removes every layer that no image and no VM of a live helper sharing
    /// the store uses: committed layers, copies left by dead processes, and
    /// the rootfs of deleted base images. Symlinked image directories are
    /// never entered. Collects nothing if an `image.json` or a VM reference
    /// cannot be read, since its layers would look unused. Returns the
    /// layers removed.
    pub fn gc(&self) -> Result<Vec<String>, ImageError> {
        let _guard = self.lock();
        // Candidates first: anything that appears later is not one.
        let candidates = self.layer_candidates();
        let mut used = self.references()?;
        used.extend(self.vm_references()?);
        let mut removed = Vec::new();
        for layer in candidates.into_iter().filter(|l| !used.contains(l)) {
            let path = self.root().join(&layer);
            remove_tree(&path);
            if let Some(image_dir) = layer.strip_suffix(&format!("/{ROOTFS_DIR}")) {
                // Only succeeds once the directory holds nothing else.
                let _ = fs::remove_dir(self.root().join(image_dir));
            }
            removed.push(layer);
        }
        Ok(removed)
    }

    /// Every layer directory that could be collected, relative to the root.
    fn layer_candidates(&self) -> Vec<String> {
        let mut out = Vec::new();
        for entry in fs::read_dir(self.root().join(LAYERS_DIR)).into_iter().flatten().flatten() {
            let Some(name) = entry.file_name().to_str().map(String::from) else { continue };
            let live_copy = name.strip_prefix(TMP_PREFIX).and_then(|rest| rest.split('-').next()).is_some_and(running);
            if !live_copy {
                out.push(format!("{LAYERS_DIR}/{name}"));
            }
        }
        for entry in fs::read_dir(self.root()).into_iter().flatten().flatten() {
            let Some(name) = entry.file_name().to_str().map(String::from) else { continue };
            let real_dir = entry.file_type().is_ok_and(|t| t.is_dir());
            if real_dir && validate_name(&name).is_ok() && entry.path().join(ROOTFS_DIR).is_dir() {
                out.push(format!("{name}/{ROOTFS_DIR}"));
            }
        }
        out
    }

    /// The layers every stored image uses; an unreadable `image.json` is an
    /// error rather than a reason to treat its layers as free.
    fn references(&self) -> Result<HashSet<String>, ImageError> {
        let mut used = HashSet::new();
        let entries = match fs::read_dir(self.root()) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(used),
            Err(e) => return Err(ImageError::io(format!("reading {}", self.root().display()), e)),
        };
        for entry in entries.flatten() {
            let path = entry.path().join(INFO_FILE);
            let text = match fs::read_to_string(&path) {
                Ok(t) => t,
                Err(e) if matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory) => {
                    continue;
                }
                Err(e) => return Err(ImageError::io(format!("reading {}", path.display()), e)),
            };
            let info = parse_info(&path, &text)?;
            used.extend(info.layers());
        }
        Ok(used)
    }
}

/// Whether the process `pid` (a copy's owner) still runs: ours, or one whose
/// `/proc` entry is not a zombie's. A helper killed while its parent is gone
/// stays a zombie until init or a subreaper reaps it, which may take a while
/// (or forever, under a PID 1 that never reaps): its copy is dead all the same.
fn running(pid: &str) -> bool {
    if pid == std::process::id().to_string() {
        return true;
    }
    pid.parse().ok().and_then(sandbox_base::proc::state).is_some_and(|state| !matches!(state, 'Z' | 'X'))
}

pub(super) fn random_hex() -> Result<String, ImageError> {
    let mut bytes = [0u8; 8];
    fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| ImageError::io("reading /dev/urandom", e))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::IdMap;
    use crate::store::test_dir::TempDir;

    fn base(store: &ImageStore, name: &str) -> ImageInfo {
        let info = ImageInfo { name: name.into(), id_map: IdMap::shifted(100_000, 65_536), ..ImageInfo::default() };
        fs::create_dir_all(store.rootfs(name)).unwrap();
        write_info(&store.root().join(name).join(INFO_FILE), &info).unwrap();
        info
    }

    fn commit(store: &ImageStore, from: &ImageInfo, name: &str) -> ImageInfo {
        let staged = store.stage_layer().unwrap();
        fs::create_dir(staged.path()).unwrap();
        fs::write(staged.path().join(name), name).unwrap();
        let info = ImageInfo { name: name.into(), parent: from.name.clone(), layers: from.layers(), ..from.clone() };
        store.install_layer(staged, info).unwrap()
    }

    #[test]
    fn old_image_json_loads_with_the_base_layout() {
        let t = TempDir::new("oldjson");
        let store = ImageStore::new(t.path().to_path_buf());
        fs::create_dir_all(store.rootfs("old")).unwrap();
        let old = r#"{"name":"old","size_bytes":1,"created_at_ms":2,"shell":"/bin/sh","package_manager":"apt",
                      "uid_base":100000,"id_count":65536}"#;
        fs::write(store.root().join("old").join(INFO_FILE), old).unwrap();
        let info = store.get("old").unwrap();
        assert_eq!(info.layers(), ["old/rootfs"]);
        assert_eq!(info.id_map, IdMap::shifted(100_000, 65_536), "the old single range, uids and gids alike");
        assert!(info.parent.is_empty() && info.labels.is_empty() && info.config.env.is_empty());
        assert_eq!(store.layer_paths(&info.layers()), [store.rootfs("old")]);
    }

    #[test]
    fn committed_images_chain_layers_and_delete_in_order() {
        let t = TempDir::new("chain");
        let store = ImageStore::new(t.path().to_path_buf());
        let b = base(&store, "base");
        let c1 = commit(&store, &b, "one");
        let c2 = commit(&store, &c1, "two");
        assert_eq!(c2.layers.len(), 3);
        assert_eq!(&c2.layers[..2], &c1.layers[..]);
        assert_eq!(store.get("two").unwrap(), c2);

        let err = store.delete("base").unwrap_err();
        assert_eq!(err.to_string(), "image 'base' is the parent of 'one': delete those first");
        assert!(matches!(store.delete("one"), Err(ImageError::HasChildren { .. })));
        assert!(matches!(store.delete("nope"), Err(ImageError::NotFound(_))));

        store.delete("two").unwrap();
        assert!(!store.root().join(&c2.layers[2]).exists(), "the top layer went with its image");
        assert!(!store.root().join("two").exists(), "no empty directory left for a deleted image");
        assert!(store.root().join(&c1.layers[1]).exists());
        store.delete("one").unwrap();
        // The base's rootfs survives as long as a VM runs on it.
        let store = store.with_holder().unwrap();
        let _lock = store.lock();
        store.add_vm_ref("vm", &["base/rootfs".to_string()]).unwrap();
        drop(_lock);
        store.delete("base").unwrap();
        assert!(store.rootfs("base").exists() && store.get("base").is_err());
        store.remove_vm_ref("vm");
        store.gc().unwrap();
        assert!(!store.root().join("base").exists());
        assert_eq!(fs::read_dir(store.root().join(LAYERS_DIR)).unwrap().count(), 0);
    }

    #[test]
    fn gc_collects_the_copy_of_a_zombie() {
        let t = TempDir::new("gc-zombie");
        let store = ImageStore::new(t.path().to_path_buf());
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let stat = format!("/proc/{}/stat", child.id());
        let zombie = (0..2000).any(|_| {
            let done =
                fs::read_to_string(&stat).is_ok_and(|s| s.rsplit_once(')').unwrap().1.trim_start().starts_with('Z'));
            if !done {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            done
        });
        assert!(zombie, "the child never became a zombie");
        let copy = store.root().join(LAYERS_DIR).join(format!(".tmp-{}-00", child.id()));
        fs::create_dir_all(&copy).unwrap();
        let removed = store.gc().unwrap();
        child.wait().unwrap();
        assert_eq!(removed, [format!("layers/.tmp-{}-00", child.id())]);
    }

    #[test]
    fn gc_keeps_layers_used_by_vms_and_skips_live_copies() {
        let t = TempDir::new("gc");
        let store = ImageStore::new(t.path().to_path_buf());
        let b = base(&store, "base");
        let c = commit(&store, &b, "kept");
        let orphan = store.root().join(LAYERS_DIR).join("0123456789abcdef");
        let vm_only = store.root().join(LAYERS_DIR).join("fedcba9876543210");
        let dead_copy = store.root().join(LAYERS_DIR).join(".tmp-4000000-00");
        let live = store.stage_layer().unwrap();
        for d in [&orphan, &vm_only, &dead_copy, &live.path().to_path_buf()] {
            fs::create_dir_all(d).unwrap();
        }
        // Another helper sharing the store runs a VM on `vm_only`.
        let other = ImageStore::new(store.root().to_path_buf()).with_holder().unwrap();
        other.add_vm_ref("vm", &["layers/fedcba9876543210".to_string()]).unwrap();
        let mut removed = store.gc().unwrap();
        removed.sort();
        assert_eq!(removed, ["layers/.tmp-4000000-00", "layers/0123456789abcdef"]);
        assert!(vm_only.exists() && live.path().exists() && store.root().join(&c.layers[1]).exists());
        drop(live);
        assert_eq!(fs::read_dir(store.root().join(LAYERS_DIR)).unwrap().count(), 2);
        // That helper dies: its lock goes, and its VMs' layers with the next collection.
        drop(other);
        assert_eq!(store.gc().unwrap(), ["layers/fedcba9876543210"]);
    }

    /// A helper killed with `kill -9` leaves its lock file and references;
    /// nobody holds the lock, so they pin nothing and are removed.
    #[test]
    fn gc_drops_the_references_of_a_dead_helper() {
        let t = TempDir::new("gcdead");
        let store = ImageStore::new(t.path().to_path_buf());
        let layer = store.root().join(LAYERS_DIR).join("00aa");
        fs::create_dir_all(&layer).unwrap();
        let dead = store.root().join(super::super::refs::REFS_DIR);
        fs::create_dir_all(dead.join("1-dead")).unwrap();
        fs::write(dead.join("1-dead.lock"), "").unwrap();
        fs::write(dead.join("1-dead").join("vm"), "layers/00aa\n").unwrap();
        assert_eq!(store.gc().unwrap(), ["layers/00aa"]);
        assert!(!dead.join("1-dead").exists() && !dead.join("1-dead.lock").exists());
    }

    #[test]
    fn gc_collects_nothing_while_an_image_json_is_broken() {
        let t = TempDir::new("gcbroken");
        let store = ImageStore::new(t.path().to_path_buf());
        let orphan = store.root().join(LAYERS_DIR).join("00");
        fs::create_dir_all(&orphan).unwrap();
        fs::create_dir_all(store.root().join("bad")).unwrap();
        fs::write(store.root().join("bad").join(INFO_FILE), "{").unwrap();
        assert!(matches!(store.gc(), Err(ImageError::Metadata { .. })));
        assert!(orphan.exists());
    }

    #[test]
    fn symlinked_base_lists_commits_and_deletes_as_a_link() {
        let t = TempDir::new("link");
        let shared = ImageStore::new(t.path().join("shared"));
        let b = base(&shared, "img");
        let store = ImageStore::new(t.path().join("store"));
        fs::create_dir_all(store.root()).unwrap();
        std::os::unix::fs::symlink(shared.root().join("img"), store.root().join("img")).unwrap();
        assert_eq!(store.list().unwrap(), std::slice::from_ref(&b));
        let c = commit(&store, &b, "child");
        assert!(store.layer_paths(&c.layers)[0].join(".").is_dir(), "lower path through the link");
        store.delete("child").unwrap();
        store.delete("img").unwrap();
        assert!(store.root().join("img").symlink_metadata().is_err(), "link removed");
        assert!(shared.rootfs("img").is_dir(), "shared image untouched");
        assert!(shared.get("img").is_ok());
    }

    #[test]
    fn install_refuses_a_taken_name_and_cleans_up() {
        let t = TempDir::new("taken");
        let store = ImageStore::new(t.path().to_path_buf());
        let b = base(&store, "base");
        let staged = store.stage_layer().unwrap();
        fs::create_dir(staged.path()).unwrap();
        let path = staged.path().to_path_buf();
        let err = store.install_layer(staged, ImageInfo { name: "base".into(), ..b.clone() }).unwrap_err();
        assert!(matches!(err, ImageError::AlreadyExists(_)), "{err}");
        assert!(!path.exists());
        let staged = store.stage_layer().unwrap();
        fs::create_dir(staged.path()).unwrap();
        let deep = ImageInfo { name: "deep".into(), layers: vec!["layers/x".into(); MAX_LAYERS], ..b.clone() };
        let err = store.install_layer(staged, deep).unwrap_err();
        assert!(matches!(err, ImageError::TooManyLayers { .. }), "{err}");
        assert!(!store.root().join("deep").exists());
        assert_eq!(fs::read_dir(store.root().join(LAYERS_DIR)).unwrap().count(), 0);
    }
}
