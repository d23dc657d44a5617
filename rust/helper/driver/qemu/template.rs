//! Memory snapshots of a vm booted to guest init's handshake, one per
//! [`Shape`] (image, cpus, memory, kernel, initramfs, accel): the state a
//! new vm is restored from instead of booting its kernel.
//!
//! A template is a vm started with [`Start::Template`] (no writable disk,
//! no `/workspace`: qemu 7.2 refuses to save or load a vm with a
//! vhost-user-fs device), saved with QMP `migrate` to a file once guest
//! init says it is ready, then ended. Its guest RAM is a file beside the
//! state (`vm.ram`, sparse where the guest never wrote), left out of the
//! state; a restore starts from a copy of its written pages
//! ([`super::ram`]). A shape with a network card
//! (EGRESS) is saved with it: its host end is the build's own socket,
//! accepted and left unread until the build's vm ends (guest init brings
//! eth0 up only after its "go", so the card is idle until then), and each
//! restore connects its own.
//! Its directory under the templates root is named by the image's layers,
//! size and network card; a `key` file names all of
//! the shape (the kernel's and initramfs's files, so a new kernel or helper
//! build makes it stale) and the state is used only when the key matches.
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use sha2::{Digest as _, Sha256};

use super::instance::{Instance, READY_WAIT, Shape, Start};
use super::{QemuError, disks};
use crate::driver::cgroup::VmCgroup;

/// Bumped when what a template holds changes meaning (the machine's
/// devices, the handshake), so older states are stale.
const FORMAT: &str = "smcp-vm-template-2";

fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Where one shape's template lives.
#[derive(Debug, Clone)]
pub struct Template {
    dir: PathBuf,
    key: String,
}

impl Template {
    /// The template of `shape` under `root`.
    pub fn of(root: &Path, shape: &Shape) -> Self {
        let mut slot = Sha256::new();
        for l in &shape.layers {
            slot.update(l.as_os_str().as_encoded_bytes());
            slot.update([0]);
        }
        slot.update(format!("{} {} {}", shape.cpus, shape.memory_mib, shape.network));
        let dir = root.join(&hex(&slot.finalize())[..24]);
        let mut key = Sha256::new();
        key.update(FORMAT);
        for f in [&shape.kernel, &shape.initramfs].into_iter().chain(&shape.layers) {
            let meta = std::fs::metadata(f).ok();
            let mtime = meta.as_ref().and_then(|m| m.modified().ok()).map(|t| format!("{t:?}")).unwrap_or_default();
            key.update(format!("{}|{}|{mtime}\n", f.display(), meta.map_or(0, |m| m.len())));
        }
        key.update(format!("{} {} {} {}", shape.accel.name(), shape.cpus, shape.memory_mib, shape.network));
        Template { dir, key: hex(&key.finalize()) }
    }

    /// What the key file holds when the state is current.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The state file.
    pub fn state(&self) -> PathBuf {
        self.dir.join("vm.state")
    }

    /// The guest's RAM file ([`ram_of`] the state).
    fn ram(&self) -> PathBuf {
        ram_of(&self.state())
    }

    /// The shape itself, so a helper that starts can fill its pool
    /// ([`Template::collect`]'s `current`).
    fn shape_file(&self) -> PathBuf {
        self.dir.join("shape.json")
    }

    /// The file naming the shape the state was saved for.
    pub fn key_file(&self) -> PathBuf {
        self.dir.join("key")
    }

    /// The state file, if it was saved for this very shape.
    pub fn current(&self) -> Option<PathBuf> {
        let key = std::fs::read_to_string(self.key_file()).ok()?;
        (key.trim() == self.key && self.state().is_file() && self.ram().is_file()).then(|| self.state())
    }

    /// Why there is no usable state (for the cold boot's reason).
    pub fn why_not(&self) -> String {
        match std::fs::read_to_string(self.key_file()) {
            Err(_) => "no memory snapshot of this image and size yet".into(),
            Ok(k) if k.trim() != self.key => {
                "the memory snapshot is stale (kernel, initramfs, helper or image changed)".into()
            }
            Ok(_) if !self.state().is_file() => format!("{} is missing", self.state().display()),
            Ok(_) => format!("{} is missing", self.ram().display()),
        }
    }

    /// The file a build holds locked (exclusively) while it works.
    fn lock_file(&self) -> PathBuf {
        self.dir.join("lock")
    }

    /// Removes the templates under `root` that can no longer serve this
    /// helper, whose vms boot `kernel` and `initramfs`: those of another
    /// kernel or helper build (the initramfs is named by the helper's build
    /// id), of an image that is gone, stale ones (a file of the shape
    /// changed) and the leftovers of an interrupted build. Never one in
    /// use: a build holds its `lock` file and a restore its state file
    /// ([`Instance::start`]) locked, and a template either is locked is
    /// left. Says what it removed and the shapes whose templates are
    /// current, whose pools a starting helper fills.
    pub fn collect(root: &Path, kernel: &Path, initramfs: &Path) -> Swept {
        let mut swept = Swept::default();
        let Ok(dirs) = std::fs::read_dir(root) else { return swept };
        for dir in dirs.flatten().map(|d| d.path()).filter(|d| d.is_dir()) {
            // Locked first, judged after: a build that ends in between
            // cannot make a removed template current.
            let held = unused(&dir);
            match (verdict(root, &dir, kernel, initramfs), held) {
                (Ok(shape), _) => swept.current.push(shape),
                (Err(_), None) => {}
                (Err(why), Some(_held)) => match std::fs::remove_dir_all(&dir) {
                    Ok(()) => {
                        tracing::info!(template = %dir.display(), %why, "stale vm template removed");
                        swept.removed.push(dir);
                    }
                    Err(e) => tracing::warn!(template = %dir.display(), error = %e, "stale vm template not removed"),
                },
            }
        }
        swept
    }

    /// Removes the state and its RAM (they failed to load).
    pub fn discard(&self) {
        let _ = std::fs::remove_file(self.key_file());
        let _ = std::fs::remove_file(self.state());
        let _ = std::fs::remove_file(self.ram());
    }

    /// Boots a vm of `shape` to guest init's handshake in `run_dir`, saves
    /// its memory state here and ends it. The state appears whole or not
    /// at all (written aside, then renamed).
    /// qemu runs in `cgroup` when given.
    pub async fn build(&self, shape: &Shape, run_dir: &Path, cgroup: Option<&VmCgroup>) -> Result<(), QemuError> {
        std::fs::create_dir_all(&self.dir).map_err(|e| QemuError::io(format!("create {}", self.dir.display()), e))?;
        let lock = self.lock_file();
        let _held = super::lock_exclusive(&lock)?;
        let ram = self.dir.join(format!("vm.ram.{}", std::process::id()));
        let _ = std::fs::remove_file(&ram);
        let mut vm = match Instance::start(shape, run_dir, Start::Template(&ram), cgroup).await {
            Ok(vm) => vm,
            Err(e) => {
                let _ = std::fs::remove_file(&ram);
                return Err(e);
            }
        };
        let tmp = self.dir.join(format!("vm.state.{}", std::process::id()));
        let saved = async {
            vm.wait_ready(READY_WAIT).await?;
            let file =
                std::fs::File::create(&tmp).map_err(|e| QemuError::io(format!("create {}", tmp.display()), e))?;
            vm.qmp().await?.migrate_to_file(&file).await
        }
        .await;
        vm.kill().await;
        let _ = std::fs::remove_dir_all(run_dir);
        if let Err(e) = saved {
            let _ = std::fs::remove_file(&tmp);
            let _ = std::fs::remove_file(&ram);
            return Err(e);
        }
        let _ = std::fs::remove_file(self.key_file());
        std::fs::rename(&ram, self.ram()).map_err(|e| QemuError::io(format!("rename {}", ram.display()), e))?;
        std::fs::rename(&tmp, self.state()).map_err(|e| QemuError::io(format!("rename {}", tmp.display()), e))?;
        let shape_json = serde_json::to_vec(shape).map_err(|e| QemuError::io("describe the shape", e.into()))?;
        std::fs::write(self.shape_file(), shape_json)
            .map_err(|e| QemuError::io(format!("write {}", self.shape_file().display()), e))?;
        std::fs::write(self.key_file(), &self.key)
            .map_err(|e| QemuError::io(format!("write {}", self.key_file().display()), e))
    }
}

/// The guest RAM file of the template whose state is `state`: the memory
/// the state leaves out (see super::ram).
pub fn ram_of(state: &Path) -> PathBuf {
    state.with_file_name("vm.ram")
}

/// Locks on `dir`'s build lock and state file, taken only if nobody holds
/// either (a build or a restore in progress); `None` if somebody does.
fn unused(dir: &Path) -> Option<Vec<Flock<std::fs::File>>> {
    let mut held = Vec::new();
    for name in ["lock", "vm.state"] {
        let Ok(file) = std::fs::File::open(dir.join(name)) else { continue };
        held.push(Flock::lock(file, FlockArg::LockExclusiveNonblock).ok()?);
    }
    Some(held)
}

/// What [`Template::collect`] did.
#[derive(Debug, Default)]
pub struct Swept {
    /// The template directories removed.
    pub removed: Vec<PathBuf>,
    /// The shapes whose templates are current.
    pub current: Vec<Shape>,
}

/// The shape of the template in `dir` (under `root`) if it can serve vms
/// of `kernel` and `initramfs`, else why it cannot.
fn verdict(root: &Path, dir: &Path, kernel: &Path, initramfs: &Path) -> Result<Shape, String> {
    let Some(shape) =
        std::fs::read(dir.join("shape.json")).ok().and_then(|json| serde_json::from_slice::<Shape>(&json).ok())
    else {
        return Err("no shape saved (an interrupted build)".into());
    };
    if shape.kernel != kernel || shape.initramfs != initramfs {
        return Err(format!("made for {} and {}", shape.kernel.display(), shape.initramfs.display()));
    }
    if let Some(layer) = shape.layers.iter().find(|l| disks::source_gone(l)) {
        return Err(format!("the image of {} is gone", layer.display()));
    }
    let template = Template::of(root, &shape);
    if template.dir != dir {
        return Err("not where its shape's template goes".into());
    }
    match template.current() {
        Some(_) => Ok(shape),
        None => Err(template.why_not()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::qemu::Accel;

    /// A directory removed when the test ends.
    struct Scratch(PathBuf);

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// Saves a template of `shape` under `root` as a build does (without
    /// the vm): its state, shape and key.
    fn save(root: &Path, shape: &Shape) -> PathBuf {
        let t = Template::of(root, shape);
        std::fs::create_dir_all(&t.dir).unwrap();
        std::fs::write(t.state(), b"state").unwrap();
        std::fs::write(t.ram(), b"ram").unwrap();
        std::fs::write(t.shape_file(), serde_json::to_vec(shape).unwrap()).unwrap();
        std::fs::write(t.key_file(), t.key()).unwrap();
        assert!(t.current().is_some());
        t.dir
    }

    /// A layer disk file under `dir` recording `source` as its layer.
    fn layer_disk(dir: &Path, name: &str, source: &Path) -> PathBuf {
        let disk = dir.join(format!("{name}.ext4"));
        std::fs::write(&disk, b"disk").unwrap();
        std::fs::write(disk.with_extension("source"), source.as_os_str().as_encoded_bytes()).unwrap();
        disk
    }

    #[test]
    fn collect_removes_what_this_helper_cannot_use_and_never_one_in_use() {
        let scratch = Scratch(std::env::temp_dir().join(format!("template-gc-{}", std::process::id())));
        let (dir, root) = (scratch.0.clone(), scratch.0.join("templates"));
        std::fs::create_dir_all(dir.join("layers/kept")).unwrap();
        for f in ["vmlinux", "initramfs-new.cpio.gz", "initramfs-old.cpio.gz"] {
            std::fs::write(dir.join(f), f).unwrap();
        }
        let kept_layer = layer_disk(&dir, "kept", &dir.join("layers/kept"));
        let gone_layer = layer_disk(&dir, "gone", &dir.join("layers/deleted"));
        let shape = |initramfs: &str, layer: &Path, cpus: u32| Shape {
            kernel: dir.join("vmlinux"),
            initramfs: dir.join(initramfs),
            accel: Accel::Tcg { kvm_unusable: "test".into() },
            layers: vec![layer.to_path_buf()],
            cpus,
            memory_mib: 256,
            network: false,
        };
        let current = save(&root, &shape("initramfs-new.cpio.gz", &kept_layer, 1));
        // The directory is the image's and size's: each case has a size of its own.
        let old_build = save(&root, &shape("initramfs-old.cpio.gz", &kept_layer, 4));
        let deleted_image = save(&root, &shape("initramfs-new.cpio.gz", &gone_layer, 1));
        let changed = save(&root, &shape("initramfs-new.cpio.gz", &kept_layer, 2));
        std::fs::write(changed.join("key"), "a kernel rebuilt in place").unwrap();
        let interrupted = root.join("interrupted");
        std::fs::create_dir_all(&interrupted).unwrap();
        std::fs::write(interrupted.join("vm.state.123"), b"half").unwrap();
        // In use: a stale state being restored, a build under way.
        let restoring = save(&root, &shape("initramfs-old.cpio.gz", &kept_layer, 3));
        let state = std::fs::File::open(restoring.join("vm.state")).unwrap();
        let _restore = Flock::lock(state, FlockArg::LockShared).unwrap();
        let building = root.join("building");
        std::fs::create_dir_all(&building).unwrap();
        let lock = std::fs::File::create(building.join("lock")).unwrap();
        let _build = Flock::lock(lock, FlockArg::LockExclusive).unwrap();

        let swept = Template::collect(&root, &dir.join("vmlinux"), &dir.join("initramfs-new.cpio.gz"));
        let mut removed = swept.removed;
        removed.sort();
        let mut expected = vec![old_build, deleted_image, changed, interrupted];
        expected.sort();
        assert_eq!(removed, expected);
        for kept in [&current, &restoring, &building] {
            assert!(kept.is_dir(), "{} was removed", kept.display());
        }
        // The one a starting helper's pool fills from.
        assert_eq!(swept.current, vec![shape("initramfs-new.cpio.gz", &kept_layer, 1)]);
    }

    #[test]
    fn a_network_card_makes_a_template_of_its_own() {
        let root = Path::new("/templates");
        let plain = Shape {
            kernel: "/vmlinux".into(),
            initramfs: "/initramfs.cpio.gz".into(),
            accel: Accel::Tcg { kvm_unusable: "test".into() },
            layers: vec!["/l0.ext4".into()],
            cpus: 1,
            memory_mib: 512,
            network: false,
        };
        let egress = Shape { network: true, ..plain.clone() };
        let (a, b) = (Template::of(root, &plain), Template::of(root, &egress));
        assert_ne!(a.state(), b.state(), "a restored vm has exactly its template's devices");
        assert_ne!(a.key(), b.key());
    }
}
