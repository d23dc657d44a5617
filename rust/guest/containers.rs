//! Docker Engine in the guest, for images that have it (`/usr/sbin/dockerd`):
//! what dockerd needs from init, then dockerd itself, started once at boot
//! so the `docker_*` tools find it running. Images without dockerd are left
//! exactly as before. A failure here is logged on the console and the VM
//! goes on without Docker (the tools then say dockerd is not running and
//! where its log is).
//!
//! - **cgroup2** at `/sys/fs/cgroup`, mounted by [`super::cgroup`] before
//!   dockerd starts: the guest kernel is the VM's own, so dockerd and runc
//!   create their groups in the whole hierarchy. dockerd runs in the root
//!   group, outside the sandbox's: its containers' tasks and memory are
//!   bounded by the VM, not by the sandbox's pids and memory limits.
//! - **/var/lib/docker on the VM's disk, outside the overlay**: overlayfs
//!   cannot take an overlay upper dir (dockerd's overlay2 driver) on another
//!   overlay, so the writable disk is mounted a second time (the same ext4
//!   superblock) and its `docker` directory bound there. Its size counts
//!   against the sandbox's disk; it is not part of the writable layer, so
//!   snapshots and clones do not carry Docker's images and containers.
//! - **Networking without netfilter**: dockerd runs with `--iptables=false`.
//!   Its default bridge (modules `bridge`, `veth`) connects containers to
//!   each other and to the guest, and published ports go through
//!   docker-proxy on the guest's addresses. The NAT and filter rules it
//!   would otherwise write guard nothing here: the VM is the boundary and
//!   its only way out is the helper's network stack and its egress policy,
//!   and the guest kernel would need a dozen netfilter modules more.
use std::path::Path;

use nix::mount::{MntFlags, MsFlags, mount, umount2};

use super::{GuestError, UPPER_SERIAL, rootfs};

/// The engine; its absence means the image does not want Docker.
const DOCKERD: &str = "/usr/sbin/dockerd";
/// Where dockerd keeps images and containers.
const DATA_ROOT: &str = "/var/lib/docker";
/// The writable disk's second mount, only until the bind is made.
const DISK: &str = "/run/sandbox-mcp-disk";
/// dockerd's output (the tools' error names it).
const LOG: &str = "/var/log/dockerd.log";

/// Prepares and starts dockerd when the image has it; never fails the boot.
pub fn start() {
    if !Path::new(DOCKERD).exists() {
        return;
    }
    if let Err(e) = prepare().and_then(|()| spawn()) {
        eprintln!("guest-init: docker: {e}");
    }
}

fn prepare() -> Result<(), GuestError> {
    let sys = |what: &str, e| GuestError::sys(what, e);
    let io = |what: &str, e| GuestError::io(what, e);
    let disk = rootfs::disk(UPPER_SERIAL)?;
    std::fs::create_dir_all(DISK).map_err(|e| io("mkdir the disk's mount point", e))?;
    mount(Some(&disk), DISK, Some("ext4"), MsFlags::MS_NOATIME, None::<&str>)
        .map_err(|e| sys("mount the writable disk again", e))?;
    let data = Path::new(DISK).join("docker");
    std::fs::create_dir_all(&data).map_err(|e| io("mkdir docker's directory on the disk", e))?;
    std::fs::create_dir_all(DATA_ROOT).map_err(|e| io("mkdir /var/lib/docker", e))?;
    mount(Some(&data), DATA_ROOT, None::<&str>, MsFlags::MS_BIND, None::<&str>)
        .map_err(|e| sys("bind docker's directory on /var/lib/docker", e))?;
    umount2(DISK, MntFlags::MNT_DETACH).map_err(|e| sys("unmount the disk's second mount", e))?;
    std::fs::remove_dir(DISK).map_err(|e| io("remove the disk's mount point", e))
}

fn spawn() -> Result<(), GuestError> {
    use std::os::unix::process::CommandExt as _;
    let io = |what: &str, e| GuestError::io(what, e);
    std::fs::create_dir_all("/var/log").map_err(|e| io("mkdir /var/log", e))?;
    let log =
        std::fs::OpenOptions::new().create(true).append(true).open(LOG).map_err(|e| io("open the dockerd log", e))?;
    let err = log.try_clone().map_err(|e| io("dup the dockerd log", e))?;
    // Reaped by init's loop like any orphan; its own process group, so no
    // signal meant for another group reaches it.
    std::process::Command::new(DOCKERD)
        .args(["--iptables=false", "--data-root", DATA_ROOT])
        .env_clear()
        .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        .env("HOME", "/root")
        .current_dir("/")
        .stdin(std::process::Stdio::null())
        .stdout(log)
        .stderr(err)
        .process_group(0)
        .spawn()
        .map_err(|e| io("start dockerd", e))?;
    Ok(())
}
