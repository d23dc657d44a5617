//! Where a VM's files live on the host, and preparing them at CreateVm:
//! the writable layer under the state dir, the agent socket under the
//! runtime dir, and ownership of shared directories. Each running VM's
//! launcher is recorded in its directory, so that a helper starting after
//! one that died can kill what it left running.
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use super::error::HelperError;
use super::spec::VmConfig;
use sandbox_image::ImageInfo;

/// The VM's directory: the overlay upper and work dirs, resolv.conf.
pub fn vm_dir(id: &str) -> PathBuf {
    sandbox_base::paths::state_dir().join("vms").join(id)
}

/// The agent's socket: in the runtime dir, never inside the VM.
pub fn agent_socket(id: &str) -> PathBuf {
    sandbox_base::paths::runtime_dir().join("vms").join(format!("{id}.sock"))
}

/// Creates the VM's directory with empty layers owned by the image's
/// mapped root; a directory left by an earlier helper is replaced.
pub fn prepare_dir(dir: &Path, image: &ImageInfo) -> Result<(), HelperError> {
    use std::os::unix::fs::{DirBuilderExt as _, chown};
    if dir.exists() {
        // Left behind by an earlier helper: a new VM starts from the image.
        sandbox_userns::remove_tree(dir).map_err(|e| HelperError::io(format!("remove stale {}", dir.display()), e))?;
    }
    // 0711: the VM's root (when the helper is root, an unmapped "other"
    // here) must be able to pass through to its layers, but not list them.
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o711)
        .create(dir)
        .map_err(|e| HelperError::io(format!("create {}", dir.display()), e))?;
    for sub in ["upper", "work"] {
        let p = dir.join(sub);
        std::fs::DirBuilder::new()
            .mode(0o755)
            .create(&p)
            .map_err(|e| HelperError::io(format!("create {}", p.display()), e))?;
        // Root inside the VM must own its layers (overlayfs in a user
        // namespace checks ownership against the mapped ids). For an
        // ordinary user that is the user itself, so this changes nothing.
        let (uid, gid) = image.id_map.host_root();
        chown(&p, Some(uid), Some(gid)).map_err(|e| HelperError::io(format!("chown {}", p.display()), e))?;
    }
    Ok(())
}

/// Hands each shared directory's top level to the VM's root, so root
/// inside can write there. Only directories the helper's user owns, never
/// read-only ones, and never a top-level system directory such as /tmp.
/// Only a root helper does anything: an ordinary user's VMs have the user
/// as their root, who owns those directories already.
pub fn share_mounts(config: &VmConfig, image: &ImageInfo) {
    let me = nix::unistd::geteuid();
    if !me.is_root() {
        return;
    }
    let (uid, gid) = image.id_map.host_root();
    for m in config.mounts.iter().filter(|m| !m.read_only) {
        let Ok(canonical) = m.host_path.canonicalize() else {
            continue;
        };
        if canonical.components().count() < 3 {
            continue;
        }
        match canonical.metadata() {
            Ok(meta) if meta.uid() == me.as_raw() => {
                if let Err(e) = std::os::unix::fs::chown(&canonical, Some(uid), Some(gid)) {
                    tracing::warn!(path = %canonical.display(), error = %e, "cannot hand the mount to the vm's root");
                }
            }
            _ => {}
        }
    }
}

/// Names the launcher (pid and start time) of the VM whose directory is
/// `dir`.
#[cfg(linux_host)]
const LAUNCHER_FILE: &str = "launcher";

/// Records `pid` as the launcher of the VM whose directory is `dir`; see
/// [`kill_leftovers`]. Not fatal: the record only matters if the helper dies
/// and the VM does not die with it.
#[cfg(linux_host)]
pub fn record_launcher(dir: &Path, pid: u32) {
    let Some(start) = start_time(pid) else { return };
    let path = dir.join(LAUNCHER_FILE);
    if let Err(e) = std::fs::write(&path, format!("{pid} {start}\n")) {
        tracing::warn!(path = %path.display(), error = %e, "cannot record the vm's launcher");
    }
}

/// At helper start: kills every launcher recorded under the state dir that
/// still runs without a helper as its parent. Its helper died, and its VM
/// did not go along (a helper from before launchers watched their helper,
/// with the VM frozen by a snapshot; or the launcher itself stopped).
/// Killing the launcher kills PID 1 (its parent-death signal), and with it
/// the VM. Launchers of a live helper sharing the state dir are left alone.
#[cfg(linux_host)]
pub fn kill_leftovers() {
    let root = sandbox_base::paths::state_dir().join("vms");
    for entry in std::fs::read_dir(&root).into_iter().flatten().flatten() {
        let path = entry.path().join(LAUNCHER_FILE);
        let Ok(text) = std::fs::read_to_string(&path) else { continue };
        let Some((pid, start)) = text.split_once(' ').and_then(|(p, s)| Some((p.parse::<u32>().ok()?, s.trim())))
        else {
            continue;
        };
        if start_time(pid).as_deref() != Some(start) {
            // Gone (the usual case), or the pid now names another process.
            let _ = std::fs::remove_file(&path);
            continue;
        }
        if parent_is_helper(pid) {
            continue;
        }
        let Ok(fd) = crate::driver::network::pidfd_open(pid as i32) else { continue };
        // Checked again through the pidfd's process: the signal cannot
        // reach a process that took the pid meanwhile.
        if start_time(pid).as_deref() == Some(start) {
            crate::driver::network::pidfd_kill(&fd, libc::SIGKILL);
            tracing::warn!(vm = %entry.file_name().to_string_lossy(), launcher = pid, "killed a vm a dead helper left running");
        }
        let _ = std::fs::remove_file(&path);
    }
}

/// Field 22 of /proc/<pid>/stat (start time in clock ticks since boot).
#[cfg(linux_host)]
fn start_time(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(19).map(String::from)
}

/// The parent of `pid` runs the same binary as `pid` (a launcher is an
/// exec of its helper's): it is the helper, not init or a subreaper that
/// adopted an orphan. When that cannot be told, it counts as a helper.
#[cfg(linux_host)]
fn parent_is_helper(pid: u32) -> bool {
    let parent = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse::<u32>().ok());
    let Some(parent) = parent.filter(|p| *p > 1) else { return false };
    let exe = |p: u32| std::fs::read_link(format!("/proc/{p}/exe"));
    match (exe(pid), exe(parent)) {
        (Ok(launcher), Ok(parent)) => launcher == parent,
        _ => true,
    }
}
