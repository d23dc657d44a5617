//! The guest's filesystems. The host attaches the image's layers as
//! read-only ext4 disks (serials `layer0`… bottom first) and the VM's own
//! writable disk (`upper`); here they become an overlay exactly like the
//! namespace driver's (`userxattr`, so the writable layer's opaque marks and
//! whiteouts have the format of a layer in the image store, and a snapshot
//! is that directory as it is). `/workspace` is the sandbox's volume over
//! virtiofs. Then the overlay becomes `/` (the initramfs cannot be
//! pivoted away from, so the new root is moved over it and chrooted into).
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::mount::{MsFlags, mount};

use super::handshake::Go;
use super::{AGENT_DIR, BootConfig, GuestError, LAYER_SERIAL, LAYER_VIEW, LIB_DIR, UPPER_SERIAL, WORKSPACE_TAG};

/// Where the overlay is assembled before it becomes `/`.
const NEW_ROOT: &str = "/newroot";
/// Mount points of the layers and the writable disk (in the initramfs,
/// invisible once the root moves).
const LAYERS: &str = "/run/layers";
const RW: &str = "/run/rw";
/// How long the disks have to show up after the modules load: virtio-mmio
/// probing is synchronous, so this only covers a slow TCG boot.
const DEVICE_WAIT: Duration = Duration::from_secs(10);

fn mnt(src: &str, target: &Path, fstype: Option<&str>, flags: MsFlags, data: Option<&str>) -> Result<(), GuestError> {
    mount(Some(src), target, fstype, flags, data)
        .map_err(|e| GuestError::sys(format!("mount {src} on {} ({})", target.display(), fstype.unwrap_or("bind")), e))
}

fn mkdir(path: &Path) -> Result<(), GuestError> {
    std::fs::create_dir_all(path).map_err(|e| GuestError::io(format!("mkdir {}", path.display()), e))
}

/// /proc, /sys and /dev of the initramfs, which the module loader and the
/// device search read.
pub fn mount_early() -> Result<(), GuestError> {
    let none = MsFlags::empty();
    mnt("proc", Path::new("/proc"), Some("proc"), none, None)?;
    mnt("sysfs", Path::new("/sys"), Some("sysfs"), none, None)?;
    mnt("devtmpfs", Path::new("/dev"), Some("devtmpfs"), none, None)
}

/// The block device whose virtio serial is `serial`, waiting for it.
pub(super) fn disk(serial: &str) -> Result<PathBuf, GuestError> {
    let deadline = Instant::now() + DEVICE_WAIT;
    loop {
        if let Ok(entries) = std::fs::read_dir("/sys/block") {
            for entry in entries.flatten() {
                let found = std::fs::read_to_string(entry.path().join("serial")).is_ok_and(|s| s.trim() == serial);
                let dev = Path::new("/dev").join(entry.file_name());
                if found && dev.exists() {
                    return Ok(dev);
                }
            }
        }
        if Instant::now() >= deadline {
            return Err(GuestError::Missing(format!("disk with serial {serial}")));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The overlay's `lowerdir`: the top layer first, as overlayfs wants it.
pub fn lowerdir(layers: usize) -> String {
    (0..layers).rev().map(|i| format!("{LAYERS}/{i}")).collect::<Vec<_>>().join(":")
}

/// Mounts the image's layers (read-only disks, part of the machine from
/// its start) where [`assemble`] finds them: before the "go", so a memory
/// snapshot holds them mounted and a restored vm does not mount them again.
pub fn mount_layers(config: &BootConfig) -> Result<(), GuestError> {
    let ro = MsFlags::MS_RDONLY;
    for i in 0..config.layers {
        let dev = disk(&format!("{LAYER_SERIAL}{i}"))?;
        let at = PathBuf::from(format!("{LAYERS}/{i}"));
        mkdir(&at)?;
        // The disk is read-only at qemu too: `noload` skips the journal
        // replay a read-only device cannot take.
        mnt(&dev.to_string_lossy(), &at, Some("ext4"), ro, Some("noload"))?;
    }
    Ok(())
}

/// Builds the sandbox's root at [`NEW_ROOT`] over the layers
/// [`mount_layers`] mounted, and moves it to `/`.
pub fn assemble(config: &BootConfig, go: &Go) -> Result<(), GuestError> {
    let rw = Path::new(RW);
    mkdir(rw)?;
    mnt(&disk(UPPER_SERIAL)?.to_string_lossy(), rw, Some("ext4"), MsFlags::MS_NOATIME, None)?;
    mkdir(&rw.join("upper"))?;
    mkdir(&rw.join("work"))?;
    let root = Path::new(NEW_ROOT);
    mkdir(root)?;
    let data = format!("lowerdir={},upperdir={RW}/upper,workdir={RW}/work,userxattr", lowerdir(config.layers));
    mnt("overlay", root, Some("overlay"), MsFlags::empty(), Some(&data))?;

    let nosuid_nodev_noexec = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    let under = |p: &str| root.join(p.trim_start_matches('/'));
    mkdir(&under("/proc"))?;
    mnt("proc", &under("/proc"), Some("proc"), nosuid_nodev_noexec, None)?;
    mkdir(&under("/sys"))?;
    mnt("sysfs", &under("/sys"), Some("sysfs"), nosuid_nodev_noexec, None)?;
    mkdir(&under("/dev"))?;
    mnt("/dev", &under("/dev"), None, MsFlags::MS_MOVE, None)?;
    mkdir(&under("/dev/pts"))?;
    mnt(
        "devpts",
        &under("/dev/pts"),
        Some("devpts"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("newinstance,ptmxmode=0666"),
    )?;
    mkdir(&under("/dev/shm"))?;
    mnt("tmpfs", &under("/dev/shm"), Some("tmpfs"), MsFlags::MS_NOSUID | MsFlags::MS_NODEV, None)?;
    mkdir(&under("/tmp"))?;
    mnt("tmpfs", &under("/tmp"), Some("tmpfs"), MsFlags::MS_NOSUID | MsFlags::MS_NODEV, Some("mode=1777"))?;
    mkdir(&under("/run"))?;
    mnt("tmpfs", &under("/run"), Some("tmpfs"), MsFlags::MS_NOSUID | MsFlags::MS_NODEV, Some("mode=0755"))?;
    mkdir(&under(AGENT_DIR))?;
    mnt(LIB_DIR, &under(AGENT_DIR), None, MsFlags::MS_BIND, None)?;
    mnt("none", &under(AGENT_DIR), None, MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY, None)?;
    mkdir(&under(LAYER_VIEW))?;
    mnt(&format!("{RW}/upper"), &under(LAYER_VIEW), None, MsFlags::MS_BIND, None)?;
    mnt("none", &under(LAYER_VIEW), None, MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY, None)?;
    if go.workspace {
        mkdir(&under("/workspace"))?;
        mnt(WORKSPACE_TAG, &under("/workspace"), Some("virtiofs"), MsFlags::MS_NODEV, None)?;
    }
    nix::unistd::sethostname(&go.hostname).map_err(|e| GuestError::sys("sethostname", e))?;
    switch_root(root)
}

/// Moves `root` over `/` and enters it.
fn switch_root(root: &Path) -> Result<(), GuestError> {
    nix::unistd::chdir(root).map_err(|e| GuestError::sys("chdir to the new root", e))?;
    mnt(".", Path::new("/"), None, MsFlags::MS_MOVE, None)?;
    nix::unistd::chroot(".").map_err(|e| GuestError::sys("chroot into the new root", e))?;
    nix::unistd::chdir("/").map_err(|e| GuestError::sys("chdir /", e))
}

#[cfg(test)]
mod tests {
    #[test]
    fn lowerdir_lists_the_top_layer_first() {
        assert_eq!(super::lowerdir(3), "/run/layers/2:/run/layers/1:/run/layers/0");
        assert_eq!(super::lowerdir(1), "/run/layers/0");
    }
}
