//! How virtiofsd reaches a vm's `/workspace` when the helper runs as root.
//!
//! virtiofsd runs as root of a user namespace with the helper's id map
//! (see [`super::virtiofsd`]): for a root helper that is an unprivileged
//! host uid, which cannot pass through root's private directories (the
//! volumes live under root's 0700 data dir). The workspace is bind-mounted
//! at a path every uid can pass through (`/run/sandbox-mcp-vfs`, 0711) for
//! the VM's run; its own permissions still decide who may read it. An
//! ordinary user's helper maps the user itself to the namespace's root,
//! which reaches its own directories: it shares the path as it is.
use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags};

use super::QemuError;

/// Where root helpers mount workspaces for virtiofsd.
const BASE: &str = "/run/sandbox-mcp-vfs";

/// A workspace as virtiofsd can reach it; unmounted on drop.
#[derive(Debug)]
pub struct Share {
    path: PathBuf,
    mounted: bool,
}

impl Share {
    /// The workspace `host` of vm `id`, mounted where virtiofsd reaches it
    /// when the helper is root.
    pub fn of(host: &Path, id: &str) -> Result<Self, QemuError> {
        if !nix::unistd::geteuid().is_root() {
            return Ok(Share { path: host.to_path_buf(), mounted: false });
        }
        let create = |dir: &Path| {
            std::fs::DirBuilder::new()
                .mode(0o711)
                .create(dir)
                .or_else(|e| if e.kind() == std::io::ErrorKind::AlreadyExists { Ok(()) } else { Err(e) })
                .map_err(|e| QemuError::io(format!("create {}", dir.display()), e))
        };
        create(Path::new(BASE))?;
        // Several helpers (state dirs) may run VMs of one id.
        let path = Path::new(BASE).join(format!("{}-{id}", std::process::id()));
        create(&path)?;
        nix::mount::mount(Some(host), &path, None::<&str>, MsFlags::MS_BIND, None::<&str>).map_err(|e| {
            let _ = std::fs::remove_dir(&path);
            QemuError::io(format!("bind {} at {}", host.display(), path.display()), e.into())
        })?;
        Ok(Share { path, mounted: true })
    }

    /// The mount a helper that died made at `path` for a vm this one
    /// adopted: unmounted on drop.
    pub fn kept(path: PathBuf) -> Self {
        Share { path, mounted: true }
    }

    /// Whether `path` is where [`of`](Self::of) mounts vm `id`'s workspace.
    pub fn is_made_for(path: &Path, id: &str) -> bool {
        path.parent() == Some(Path::new(BASE))
            && path.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.strip_suffix(id).and_then(|p| p.strip_suffix('-')).is_some_and(|pid| pid.parse::<u32>().is_ok())
            })
    }

    /// Whether this is a mount of the helper's own (a root helper's).
    pub fn is_mounted(&self) -> bool {
        self.mounted
    }

    /// The path to give virtiofsd.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        if self.mounted {
            let _ = nix::mount::umount2(&self.path, MntFlags::MNT_DETACH);
            let _ = std::fs::remove_dir(&self.path);
        }
    }
}
