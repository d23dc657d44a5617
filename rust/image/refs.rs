//! Who uses which layers, kept on disk so that every helper sharing a store
//! counts every other's VMs, and the store lock that orders it all.
//!
//! A helper holds `<store>/.refs/<token>.lock` (an flock, kept for its whole
//! life) and writes one file per VM under `<store>/.refs/<token>/`, naming
//! that VM's layers one per line. Layer collection, under the store lock,
//! counts the references of every holder whose lock is held. A holder whose
//! lock it can take itself is dead (the kernel drops an flock with the last
//! descriptor of its holder, however that process ended), and so are its
//! VMs: its references are removed instead of pinning layers forever.
use std::collections::HashSet;
use std::fs::{self, File};
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::MutexGuard;

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use super::layers::random_hex;
use super::{ImageError, ImageStore};

/// Directory of the holders' references under the store root; not a valid
/// image name.
pub(super) const REFS_DIR: &str = ".refs";
/// The store lock's file under the store root.
const STORE_LOCK: &str = ".lock";
const LOCK_SUFFIX: &str = ".lock";

/// One helper's claim on the store: its lock and its directory of VM
/// references. Removed when dropped (a helper that dies leaves them for the
/// next collection, which recognizes them by the lock nobody holds).
#[derive(Debug)]
pub struct Holder {
    dir: PathBuf,
    lock_path: PathBuf,
    _lock: Flock<File>,
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
        let _ = fs::remove_file(&self.lock_path);
    }
}

/// The store lock, held by the guard: a mutex among this process's threads
/// and an flock on `<store>/.lock` among the processes sharing the store.
pub struct StoreGuard<'a> {
    _flock: Option<Flock<File>>,
    _mutex: MutexGuard<'a, ()>,
}

impl ImageStore {
    /// Holds the store lock; see [`ImageStore::gc`]. A store whose lock file
    /// cannot be opened (it does not exist yet, or is read-only to us) is
    /// locked among this process's threads only: nobody can change it then.
    pub fn lock(&self) -> StoreGuard<'_> {
        let mutex = self.mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let path = self.root().join(STORE_LOCK);
        let file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .open(&path)
            .or_else(|_| File::open(&path));
        let flock = match file {
            Ok(f) => match Flock::lock(f, FlockArg::LockExclusive) {
                Ok(l) => Some(l),
                Err((_, e)) => {
                    tracing::warn!(path = %path.display(), error = %e, "cannot lock the image store");
                    None
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                tracing::debug!(path = %path.display(), error = %e, "image store lock unavailable");
                None
            }
        };
        StoreGuard { _flock: flock, _mutex: mutex }
    }

    /// This store, with references to its layers recorded on disk for this
    /// process (see the module documentation): what a helper uses.
    pub fn with_holder(mut self) -> Result<Self, ImageError> {
        let refs = self.root().join(REFS_DIR);
        let io = |what: String| move |e| ImageError::io(what, e);
        let guard = self.lock();
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(&refs)
            .map_err(io(format!("creating {}", refs.display())))?;
        let token = format!("{}-{}", std::process::id(), random_hex()?);
        let lock_path = refs.join(format!("{token}{LOCK_SUFFIX}"));
        let file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&lock_path)
            .map_err(io(format!("creating {}", lock_path.display())))?;
        let lock = Flock::lock(file, FlockArg::LockExclusiveNonblock)
            .map_err(|(_, e)| ImageError::io(format!("locking {}", lock_path.display()), e.into()))?;
        let dir = refs.join(&token);
        let holder = Holder { dir, lock_path, _lock: lock };
        fs::DirBuilder::new()
            .mode(0o755)
            .create(&holder.dir)
            .map_err(io(format!("creating {}", holder.dir.display())))?;
        drop(guard);
        self.holder = Some(std::sync::Arc::new(holder));
        Ok(self)
    }

    /// Records that VM `vm` uses `layers`; the caller holds the store lock.
    /// Nothing to do for a store without a holder.
    pub fn add_vm_ref(&self, vm: &str, layers: &[String]) -> Result<(), ImageError> {
        let Some(holder) = &self.holder else { return Ok(()) };
        let path = holder.dir.join(vm);
        let tmp = holder.dir.join(format!(".{vm}.tmp"));
        let mut text = layers.join("\n");
        text.push('\n');
        fs::write(&tmp, text).map_err(|e| ImageError::io(format!("writing {}", tmp.display()), e))?;
        fs::rename(&tmp, &path).map_err(|e| {
            let _ = fs::remove_file(&tmp);
            ImageError::io(format!("renaming {} into place", path.display()), e)
        })
    }

    /// Forgets VM `vm`'s layers; the next collection may take them.
    pub fn remove_vm_ref(&self, vm: &str) {
        let Some(holder) = &self.holder else { return };
        let path = holder.dir.join(vm);
        if let Err(e) = fs::remove_file(&path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %path.display(), error = %e, "cannot remove a layer reference");
        }
    }

    /// The layers the VMs of every live holder use; removes the references
    /// of dead holders. The caller holds the store lock. An unreadable
    /// reference is an error, not a reason to treat its layers as free.
    pub(super) fn vm_references(&self) -> Result<HashSet<String>, ImageError> {
        let refs = self.root().join(REFS_DIR);
        let mut used = HashSet::new();
        let entries = match fs::read_dir(&refs) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(used),
            Err(e) => return Err(ImageError::io(format!("reading {}", refs.display()), e)),
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(token) = name.to_str().and_then(|n| n.strip_suffix(LOCK_SUFFIX)) else { continue };
            let dir = refs.join(token);
            let file = match File::open(entry.path()) {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(ImageError::io(format!("opening {}", entry.path().display()), e)),
            };
            match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(dead) => {
                    tracing::info!(holder = token, "removing the layer references of a helper that is gone");
                    let _ = fs::remove_dir_all(&dir);
                    let _ = fs::remove_file(entry.path());
                    drop(dead);
                }
                Err((_, Errno::EWOULDBLOCK)) => used.extend(read_refs(&dir)?),
                Err((_, e)) => {
                    return Err(ImageError::io(format!("locking {}", entry.path().display()), e.into()));
                }
            }
        }
        Ok(used)
    }
}

/// The layers named by the reference files in one holder's directory.
fn read_refs(dir: &Path) -> Result<HashSet<String>, ImageError> {
    let mut used = HashSet::new();
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        // A holder between taking its lock and making its directory.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(used),
        Err(e) => return Err(ImageError::io(format!("reading {}", dir.display()), e)),
    };
    for entry in entries.flatten() {
        if entry.file_name().to_str().is_some_and(|n| n.starts_with('.')) {
            continue;
        }
        let text = match fs::read_to_string(entry.path()) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(ImageError::io(format!("reading {}", entry.path().display()), e)),
        };
        used.extend(text.lines().filter(|l| !l.is_empty()).map(String::from));
    }
    Ok(used)
}
