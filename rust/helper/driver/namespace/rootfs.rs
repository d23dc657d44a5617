//! The sandbox's filesystem view: overlay root, shared host dirs, /proc,
//! /dev, /sys, resolv.conf, then pivot_root so nothing of the host tree stays
//! reachable.
//!
//! Everything happens inside the VM's user namespace (which is what lets an
//! ordinary user do it at all), in steps, because the mapped root may not be
//! able to reach the VM's host paths (e.g. under /root, mode 0700), and
//! mounts can only be used from the mount namespace they live in:
//! - [`open_host_paths`] runs in the launcher while it still has the
//!   helper's host ids, in a private mount namespace of its own.
//! - [`stage`] runs in the launcher as root of the user namespace: it binds
//!   every opened path onto fixed, world-traversable points under a tmpfs
//!   at /tmp.
//! - [`setup`] runs as the sandbox's PID 1 (in a copy of that mount table)
//!   and builds the root from those points.
use std::path::{Component, Path, PathBuf};

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sys::statvfs::{FsFlags, statvfs};

use super::DriverError;
use super::init::InitConfig;

/// Root of the staging tmpfs, in the launcher's own mount namespace only.
const STAGE: &str = "/tmp";
/// Prefix of the image layers (overlay lower layers): `/tmp/lower<i>`, 0 at
/// the bottom.
const LOWER: &str = "/tmp/lower";
/// The VM's dir on the host: holds `upper` and `work`, which overlayfs
/// wants under one mount.
const VM: &str = "/tmp/vm";
/// The generated resolv.conf.
const RESOLV: &str = "/tmp/resolv.conf";
/// Where the overlay is mounted before pivot_root.
const NEW_ROOT: &str = "/tmp/root";

/// Device nodes shared from the host's /dev.
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

fn shared(i: usize) -> PathBuf {
    PathBuf::from(format!("{STAGE}/m{i}"))
}

fn lower(i: usize) -> PathBuf {
    PathBuf::from(format!("{LOWER}{i}"))
}

/// The overlay `lowerdir` value: overlayfs lists the top layer first.
fn lowerdir(count: usize) -> String {
    (0..count).rev().map(|i| lower(i).display().to_string()).collect::<Vec<_>>().join(":")
}

/// The host paths a VM needs, opened (`O_PATH`) in the launcher's staging
/// mount namespace.
pub struct HostPaths {
    lowers: Vec<std::fs::File>,
    vm: std::fs::File,
    mounts: Vec<std::fs::File>,
    resolv: Option<std::fs::File>,
}

/// Launcher step, in the VM's user namespace but still with the helper's
/// host ids: a private mount namespace of the launcher's own, and every host
/// path of `config` opened in it. Opening happens here because the helper's
/// ids may reach paths the VM's root cannot (a root helper's state under
/// /root, mode 0700), and a bind mount's source must live in the mount
/// namespace it is mounted into.
pub fn open_host_paths(config: &InitConfig) -> Result<HostPaths, DriverError> {
    let none: Option<&str> = None;
    let sys = |what: &'static str| move |source| DriverError::sys(what, source);
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).map_err(sys("unshare staging mount namespace"))?;
    mnt(none, "/", none, MsFlags::MS_REC | MsFlags::MS_PRIVATE, none)?;
    let vm_dir = config
        .upper
        .parent()
        .filter(|p| Some(*p) == config.work.parent())
        .ok_or_else(|| DriverError::InitFailed("upper and work must share a parent dir".into()))?;
    if config.lowers.is_empty() {
        return Err(DriverError::InitFailed("the image has no layers".into()));
    }
    Ok(HostPaths {
        lowers: config.lowers.iter().map(|l| open_path(l)).collect::<Result<_, _>>()?,
        vm: open_path(vm_dir)?,
        mounts: config.mounts.iter().map(|m| open_path(&m.host)).collect::<Result<_, _>>()?,
        resolv: config.resolv_conf.as_deref().map(open_path).transpose()?,
    })
}

/// Launcher step, as root of the VM's user namespace: binds every opened
/// path onto fixed, world-traversable points under a tmpfs at /tmp. The fds
/// stay usable across the tmpfs mount, which may hide their paths (tests
/// keep their state under /tmp).
pub fn stage(paths: HostPaths) -> Result<(), DriverError> {
    // Only empty mount points live here (an inode each), whatever the
    // number of layers and mounts.
    mnt(Some("tmpfs"), STAGE, Some("tmpfs"), MsFlags::MS_NOSUID | MsFlags::MS_NODEV, Some("mode=0755,size=64k"))?;
    for dir in [VM, NEW_ROOT] {
        mkdir(Path::new(dir))?;
    }
    for (i, fd) in paths.lowers.iter().enumerate() {
        mkdir(&lower(i))?;
        bind(&fd_path(fd), &lower(i), false)?;
    }
    bind(&fd_path(&paths.vm), Path::new(VM), false)?;
    for (i, fd) in paths.mounts.iter().enumerate() {
        mkdir(&shared(i))?;
        bind(&fd_path(fd), &shared(i), false)?;
    }
    if let Some(fd) = paths.resolv {
        std::fs::File::create(RESOLV).map_err(|e| DriverError::io("create staged resolv.conf", e))?;
        bind(&fd_path(&fd), Path::new(RESOLV), false)?;
    }
    Ok(())
}

fn open_path(p: &Path) -> Result<std::fs::File, DriverError> {
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
        .open(p)
        .map_err(|e| DriverError::io(format!("open {}", p.display()), e))
}

fn fd_path(f: &std::fs::File) -> String {
    use std::os::fd::AsRawFd as _;
    format!("/proc/self/fd/{}", f.as_raw_fd())
}

/// PID 1 step: builds the root filesystem from the staged paths and pivots
/// into it. Runs as root of the user namespace, in a fresh mount namespace.
pub fn setup(config: &InitConfig) -> Result<(), DriverError> {
    let none: Option<&str> = None;
    mnt(none, "/", none, MsFlags::MS_REC | MsFlags::MS_PRIVATE, none)?;
    let overlay = format!("lowerdir={},upperdir={VM}/upper,workdir={VM}/work,userxattr", lowerdir(config.lowers.len()));
    mnt(Some("overlay"), NEW_ROOT, Some("overlay"), MsFlags::empty(), Some(overlay.as_str()))?;
    let root = Path::new(NEW_ROOT);

    for (i, m) in config.mounts.iter().enumerate() {
        let target = target(root, &m.guest, Kind::Dir)?;
        bind(&shared(i).display().to_string(), &target, m.read_only)?;
    }

    let proc = target(root, Path::new("/proc"), Kind::Dir)?;
    let nosuid_nodev_noexec = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mnt(Some("proc"), &proc, Some("proc"), nosuid_nodev_noexec, none)?;
    dev(&target(root, Path::new("/dev"), Kind::Dir)?, config.shm_bytes)?;
    // sysfs needs a network namespace we own, which we have; a kernel that
    // still refuses just leaves /sys empty.
    let sys = target(root, Path::new("/sys"), Kind::Dir)?;
    if let Err(e) = mnt(Some("sysfs"), &sys, Some("sysfs"), nosuid_nodev_noexec | MsFlags::MS_RDONLY, none) {
        tracing::debug!(error = %e, "no sysfs in the sandbox");
    }
    if config.resolv_conf.is_some() {
        let etc_resolv = root.join("etc/resolv.conf");
        if etc_resolv.symlink_metadata().map(|m| m.file_type().is_symlink()).unwrap_or(false) {
            std::fs::remove_file(&etc_resolv).map_err(|e| DriverError::io("replace /etc/resolv.conf symlink", e))?;
        }
        bind(RESOLV, &target(root, Path::new("/etc/resolv.conf"), Kind::File)?, true)?;
    }
    if let Err(e) = hosts(root, &config.hostname) {
        tracing::warn!(error = %e, "no /etc/hosts in the sandbox");
    }
    pivot(root)
}

/// First line of an /etc/hosts this driver wrote: a later start rewrites it
/// (a clone or a restored snapshot gets its own hostname), while one the
/// image or the sandbox's user wrote is left alone.
const HOSTS_MARK: &str = "# written by sandbox-mcp at start";

/// Gives the sandbox an /etc/hosts naming localhost and its own hostname
/// when it has none of its own: images usually ship without one, and then
/// `localhost` does not resolve.
fn hosts(root: &Path, hostname: &str) -> Result<(), DriverError> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let etc = target(root, Path::new("/etc"), Kind::Dir)?;
    let path = etc.join("hosts");
    match path.symlink_metadata() {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Ok(m) if m.is_file() && std::fs::read_to_string(&path).is_ok_and(|t| t.starts_with(HOSTS_MARK)) => {}
        _ => return Ok(()),
    }
    let text = format!(
        "{HOSTS_MARK}\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t{hostname}\n"
    );
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .and_then(|mut f| std::io::Write::write_all(&mut f, text.as_bytes()))
        .map_err(|e| DriverError::io("write /etc/hosts", e))
}

fn dev(dev: &Path, shm_bytes: u64) -> Result<(), DriverError> {
    let none: Option<&str> = None;
    mnt(Some("tmpfs"), dev, Some("tmpfs"), MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC, Some("mode=0755,size=64k"))?;
    for name in DEVICES {
        let node = dev.join(name);
        std::fs::File::create(&node).map_err(|e| DriverError::io(format!("create /dev/{name}"), e))?;
        mnt(Some(format!("/dev/{name}").as_str()), &node, none, MsFlags::MS_BIND, none)?;
    }
    let pts = dev.join("pts");
    mkdir(&pts)?;
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC;
    // gid=5 (tty) only exists when the image's groups are mapped; retry
    // without it rather than fail the whole VM.
    if mnt(Some("devpts"), &pts, Some("devpts"), flags, Some("newinstance,ptmxmode=0666,mode=0620,gid=5")).is_err() {
        mnt(Some("devpts"), &pts, Some("devpts"), flags, Some("newinstance,ptmxmode=0666,mode=0620"))?;
    }
    let shm = dev.join("shm");
    mkdir(&shm)?;
    // Capped: its pages count against the VM's memory and no kill frees them
    // (see `oom::shm_bytes`).
    let shm_options = match shm_bytes {
        0 => "mode=1777".to_string(),
        n => format!("mode=1777,size={n}"),
    };
    mnt(Some("tmpfs"), &shm, Some("tmpfs"), MsFlags::MS_NOSUID | MsFlags::MS_NODEV, Some(shm_options.as_str()))?;
    for (link, to) in [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        std::os::unix::fs::symlink(to, dev.join(link))
            .map_err(|e| DriverError::io(format!("symlink /dev/{link}"), e))?;
    }
    Ok(())
}

fn bind(source: &str, target: &Path, read_only: bool) -> Result<(), DriverError> {
    let none: Option<&str> = None;
    mnt(Some(source), target, none, MsFlags::MS_BIND | MsFlags::MS_REC, none)?;
    if read_only {
        // A remount inside a user namespace must keep the flags the source
        // mount was locked with, or the kernel refuses it.
        let locked = statvfs(target)
            .map_err(|source| DriverError::sys(format!("statvfs {}", target.display()), source))?
            .flags();
        let mut flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY;
        for (st, ms) in [
            (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
            (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
            (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
            (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
            (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
            (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
        ] {
            if locked.contains(st) {
                flags |= ms;
            }
        }
        mnt(none, target, none, flags, none)?;
    }
    Ok(())
}

fn pivot(root: &Path) -> Result<(), DriverError> {
    let sys = |what: &'static str| move |source| DriverError::sys(what, source);
    nix::unistd::chdir(root).map_err(sys("chdir new root"))?;
    nix::unistd::pivot_root(".", ".").map_err(sys("pivot_root"))?;
    umount2(".", MntFlags::MNT_DETACH).map_err(sys("detach old root"))?;
    nix::unistd::chdir("/").map_err(sys("chdir /"))
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Dir,
    File,
}

/// `guest` under `root`, created if missing. Symlinks on the way are
/// refused: the writable layer is under the sandbox's control, and a link
/// there must not redirect a mount (or a mkdir) onto the host's tree.
fn target(root: &Path, guest: &Path, kind: Kind) -> Result<PathBuf, DriverError> {
    let comps: Vec<_> = guest.components().filter(|c| !matches!(c, Component::RootDir)).collect();
    let mut path = root.to_path_buf();
    for (i, c) in comps.iter().enumerate() {
        let Component::Normal(name) = c else {
            return Err(DriverError::InitFailed(format!("guest path {} is not normalized", guest.display())));
        };
        path.push(name);
        let last = i + 1 == comps.len();
        match path.symlink_metadata() {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(DriverError::InitFailed(format!(
                    "guest path {} crosses a symlink inside the VM",
                    guest.display()
                )));
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if last && kind == Kind::File {
                    std::fs::File::create(&path)
                        .map_err(|e| DriverError::io(format!("create {}", guest.display()), e))?;
                } else {
                    mkdir(&path)?;
                }
            }
            Err(e) => return Err(DriverError::io(format!("stat {}", guest.display()), e)),
        }
    }
    Ok(path)
}

fn mkdir(p: &Path) -> Result<(), DriverError> {
    match std::fs::create_dir(p) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
            Err(DriverError::io(format!("mkdir {}", p.display()), e))
        }
        _ => Ok(()),
    }
}

fn mnt<P: AsRef<Path> + ?Sized>(
    source: Option<&str>,
    target: &P,
    fstype: Option<&str>,
    flags: MsFlags,
    data: Option<&str>,
) -> Result<(), DriverError> {
    mount(source, target.as_ref(), fstype, flags, data).map_err(|e| {
        DriverError::sys(
            format!("mount {} on {}", source.or(fstype).unwrap_or("(remount)"), target.as_ref().display()),
            e,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lowerdir_lists_the_top_layer_first() {
        assert_eq!(lowerdir(1), "/tmp/lower0");
        assert_eq!(lowerdir(3), "/tmp/lower2:/tmp/lower1:/tmp/lower0");
    }
}
