//! The daemon's Unix socket and its guards: a private runtime directory
//! (0700), the socket itself (0600), only the daemon's own user let in
//! (`SO_PEERCRED`), a lock held for the daemon's lifetime so no two run, and
//! the pid file.
use std::{
    fs::{OpenOptions, Permissions},
    os::unix::fs::{OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
};

use nix::fcntl::{Flock, FlockArg};
use tokio::net::{UnixListener, UnixStream};

use super::DaemonError;

/// Creates `dir` (and parents) private to the user, tightening an existing one.
pub fn private_dir(dir: &Path) -> Result<(), DaemonError> {
    sandbox_base::paths::make_private(dir).map_err(|source| DaemonError::Io {
        what: "create the runtime directory",
        path: dir.to_path_buf(),
        source,
    })
}

/// Takes the lock file at `path`: blocking (`wait`) or failing with
/// [`DaemonError::AlreadyRunning`] when another process holds it.
pub fn lock(path: &Path, wait: bool) -> Result<Flock<std::fs::File>, DaemonError> {
    let io = |source| DaemonError::Io { what: "open the lock", path: path.to_path_buf(), source };
    let file = OpenOptions::new().create(true).truncate(false).write(true).mode(0o600).open(path).map_err(io)?;
    let how = if wait { FlockArg::LockExclusive } else { FlockArg::LockExclusiveNonblock };
    Flock::lock(file, how).map_err(|(_, e)| match e {
        nix::errno::Errno::EWOULDBLOCK if !wait => DaemonError::AlreadyRunning(path.to_path_buf()),
        e => io(e.into()),
    })
}

/// Binds the socket at `path`, replacing a stale one (the caller holds the
/// daemon lock, so no live daemon owns it), readable and writable by the
/// user only.
pub fn bind(path: &Path) -> Result<UnixListener, DaemonError> {
    let io = |what, source| DaemonError::Io { what, path: path.to_path_buf(), source };
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io("remove the stale socket", e)),
        _ => {}
    }
    let listener = UnixListener::bind(path).map_err(|e| io("bind the socket", e))?;
    std::fs::set_permissions(path, Permissions::from_mode(0o600)).map_err(|e| io("restrict the socket", e))?;
    Ok(listener)
}

/// Whether the peer runs as this process's user: another user must not
/// drive our sandboxes, whatever the file modes say.
pub fn same_user(stream: &UnixStream) -> Result<bool, std::io::Error> {
    Ok(stream.peer_cred()?.uid() == nix::unistd::geteuid().as_raw())
}

/// A pid file, removed when dropped.
pub struct PidFile(PathBuf);

impl PidFile {
    /// Writes this process's pid to `path`.
    pub fn write(path: &Path) -> Result<Self, DaemonError> {
        std::fs::write(path, format!("{}\n", std::process::id())).map_err(|source| DaemonError::Io {
            what: "write the pid file",
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Self(path.to_path_buf()))
    }
}

impl Drop for PidFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
