//! The vm's disks. Each image layer becomes a read-only ext4 file, built
//! once by `mke2fs -d` and cached by the layer's identity; the vm's
//! writable layer is an ext4 file of its own.
//!
//! Why disks and not a shared directory: Debian's cloud kernel has no 9p
//! (CONFIG_NET_9P is not set), and a virtiofs share of the image store
//! would hand the guest's kernel a writable view of every image unless
//! virtiofsd enforced read-only, which Debian 12's does not offer. A disk
//! opened `readonly=on` is read-only at qemu. mke2fs runs as root of a user
//! namespace with the helper's id map, so the files in the disk carry the
//! ids the sandbox sees (0 for its root), not the shifted host ids the
//! layer has on the host.
use std::hash::{Hash as _, Hasher as _};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::QemuError;
use sandbox_userns::{IdMapper, pass_fds, run_mapped};

/// The cache file for `layer`: named by its path, inode and change time,
/// so a layer rebuilt in place (an image built again) gets a new disk.
pub fn layer_disk_path(layer: &Path, cache: &Path) -> Result<PathBuf, QemuError> {
    let meta = std::fs::metadata(layer).map_err(|e| QemuError::io(format!("stat layer {}", layer.display()), e))?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    layer.hash(&mut h);
    (meta.dev(), meta.ino(), meta.ctime(), meta.ctime_nsec(), meta.mtime(), meta.mtime_nsec()).hash(&mut h);
    Ok(cache.join(format!("layer-{:016x}.ext4", h.finish())))
}

/// The read-only disk of `layer`, built into `cache` if it is not there.
pub fn layer_disk(layer: &Path, cache: &Path, mapper: &IdMapper) -> Result<PathBuf, QemuError> {
    let disk = layer_disk_path(layer, cache)?;
    if disk.is_file() {
        return Ok(disk);
    }
    std::fs::create_dir_all(cache).map_err(|e| QemuError::io(format!("create {}", cache.display()), e))?;
    // One builder per disk: two boots of one image at once (in one helper,
    // whose temp name below is the same for both, or in two helpers sharing
    // the cache) would otherwise write one file together, and mke2fs fails
    // midway ("Ext2 inode is not a directory"). The second waits, then
    // takes the disk the first built.
    let lock = cache.join(format!(".{}.lock", disk.file_name().unwrap_or_default().to_string_lossy()));
    let _held = super::lock_exclusive(&lock)?;
    if disk.is_file() {
        return Ok(disk);
    }
    let tmp =
        cache.join(format!(".tmp-{}-{}", std::process::id(), disk.file_name().unwrap_or_default().to_string_lossy()));
    let failed = |detail: String| QemuError::Disk { what: layer.display().to_string(), detail };
    std::fs::File::create(&tmp).map_err(|e| QemuError::io(format!("create {}", tmp.display()), e))?;
    // mke2fs writes it as the namespace's root, which is root's range
    // base on the host when the helper is root.
    let (uid, gid) = mapper.id_map().host_root();
    if let Err(e) = nix::unistd::chown(&tmp, Some(uid.into()), Some(gid.into())) {
        let _ = std::fs::remove_file(&tmp);
        return Err(failed(format!("chown the disk file to the namespace's root: {e}")));
    }
    // Sized from the layer (apparent bytes and entries) with room for
    // ext4's own metadata; no journal, the disk is never written. The
    // namespace's root may not pass through the dirs above the layer (an
    // image store in a 0700 dir, or reached through a symlink from one):
    // the layer and the disk come as open fds, reopened through
    // /proc/self/fd by their own permissions (-D, -H: follow that link).
    let script = r#"set -e
kib=$(du -skD --apparent-size "$1" | cut -f1)
entries=$(find -H "$1" -xdev | wc -l)
exec mke2fs -q -F -t ext4 -O ^has_journal -m 0 -E root_owner=0:0 -N $((entries + entries / 4 + 1024)) -d "$1" "$2" "$((kib + kib / 4 + 65536))k""#;
    let mut cmd = Command::new("sh");
    cmd.args(["-c", script, "mke2fs-layer"]);
    if let Err(detail) = mke2fs_mapped(mapper, cmd, layer, &tmp) {
        let _ = std::fs::remove_file(&tmp);
        return Err(failed(detail));
    }
    // Which layer it holds, so the template collector can tell a disk whose
    // image is gone (a layer made again gets a disk of another name).
    std::fs::write(source_file(&disk), layer.as_os_str().as_bytes())
        .map_err(|e| QemuError::io(format!("write {}", source_file(&disk).display()), e))?;
    std::fs::rename(&tmp, &disk).map_err(|e| QemuError::io(format!("rename {}", tmp.display()), e))?;
    Ok(disk)
}

/// The file naming the layer a layer disk was built from.
fn source_file(disk: &Path) -> PathBuf {
    disk.with_extension("source")
}

/// Whether the layer `disk` was built from is gone (its image deleted), or
/// the disk itself is. A disk built before its source was recorded is not
/// known to be gone.
pub fn source_gone(disk: &Path) -> bool {
    if !disk.is_file() {
        return true;
    }
    match std::fs::read(source_file(disk)) {
        Ok(source) => !Path::new(std::ffi::OsStr::from_bytes(&source)).exists(),
        Err(_) => false,
    }
}

/// Makes the vm's writable disk at `path`: a sparse ext4 file of
/// `size_bytes` (the vm's disk quota), root-owned inside.
pub fn upper_disk(path: &Path, size_bytes: u64) -> Result<(), QemuError> {
    let f = std::fs::File::create(path).map_err(|e| QemuError::io(format!("create {}", path.display()), e))?;
    f.set_len(size_bytes).map_err(|e| QemuError::io(format!("size {}", path.display()), e))?;
    drop(f);
    let out = Command::new("mke2fs")
        .args(["-q", "-F", "-t", "ext4", "-m", "0", "-E", "root_owner=0:0,lazy_itable_init=1,lazy_journal_init=1"])
        .arg(path)
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .output()
        .map_err(|e| QemuError::io("run mke2fs", e))?;
    if !out.status.success() {
        return Err(QemuError::Disk {
            what: path.display().to_string(),
            detail: format!("{}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim()),
        });
    }
    Ok(())
}

/// Makes the vm's writable disk at `path` (sparse, `size_bytes`) holding
/// the `upper` and `work` dirs of the VM dir `vm_dir` at its root, where the
/// guest's init expects them: files the helper placed there before the
/// first boot (seeded files, a clone's copy of its source's layer) are in
/// the VM from its start. mke2fs runs under the helper's id map, so the
/// files keep the ids the sandbox sees, as the layer disks do.
pub fn upper_disk_from(path: &Path, size_bytes: u64, vm_dir: &Path, mapper: &IdMapper) -> Result<(), QemuError> {
    let failed = |detail: String| QemuError::Disk { what: path.display().to_string(), detail };
    let f = std::fs::File::create(path).map_err(|e| QemuError::io(format!("create {}", path.display()), e))?;
    f.set_len(size_bytes).map_err(|e| QemuError::io(format!("size {}", path.display()), e))?;
    drop(f);
    let (uid, gid) = mapper.id_map().host_root();
    nix::unistd::chown(path, Some(uid.into()), Some(gid.into()))
        .map_err(|e| failed(format!("chown the disk file to the namespace's root: {e}")))?;
    // mke2fs copies a whole directory: the layer dirs move into one of
    // their own for the copy (the VM dir also holds the disk itself).
    let root = vm_dir.join("disk-root");
    std::fs::create_dir_all(&root).map_err(|e| QemuError::io(format!("create {}", root.display()), e))?;
    nix::unistd::chown(&root, Some(uid.into()), Some(gid.into()))
        .map_err(|e| failed(format!("chown {}: {e}", root.display())))?;
    let subs = ["upper", "work"];
    let mut moved = Vec::new();
    for sub in subs {
        if std::fs::rename(vm_dir.join(sub), root.join(sub)).is_ok() {
            moved.push(sub);
        }
    }
    // The namespace's root may not pass through the helper's state dir
    // (0700): mke2fs gets both by open fds (see mke2fs_mapped).
    let mut cmd = Command::new("mke2fs");
    cmd.args(["-q", "-F", "-t", "ext4", "-m", "0", "-E"])
        .arg("root_owner=0:0,lazy_itable_init=1,lazy_journal_init=1")
        .arg("-d");
    let out = mke2fs_mapped(mapper, cmd, &root, path);
    for sub in moved {
        let _ = std::fs::rename(root.join(sub), vm_dir.join(sub));
    }
    let _ = std::fs::remove_dir(&root);
    let result = out.map_err(failed);
    if result.is_err() {
        let _ = std::fs::remove_file(path);
    }
    result
}

/// Runs `cmd` (an mke2fs filling `disk` from the dir `src`) under `mapper`
/// with both open in it, appended to its arguments as `/proc/self/fd/N`;
/// the error is what went wrong, for the caller's disk error.
fn mke2fs_mapped(mapper: &IdMapper, cmd: Command, src: &Path, disk: &Path) -> Result<(), String> {
    let dir = std::fs::File::open(src).map_err(|e| format!("open {}: {e}", src.display()))?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(disk)
        .map_err(|e| format!("open {}: {e}", disk.display()))?;
    let out = run_mapped_with(mapper, cmd, &[&dir, &file]).map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// Runs `cmd` under `mapper` with `files` open in it, appended to its
/// arguments as `/proc/self/fd/N`: dirs and disks the namespace's root
/// reaches by their own permissions, where their paths may pass through
/// dirs it cannot (the helper's 0700 state dir, a private image store).
pub(super) fn run_mapped_with(
    mapper: &IdMapper,
    mut cmd: Command,
    files: &[&std::fs::File],
) -> Result<std::process::Output, crate::driver::DriverError> {
    let paths = pass_fds(&mut cmd, files);
    cmd.args(paths).env_clear().env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
    Ok(run_mapped(mapper, cmd)?)
}
