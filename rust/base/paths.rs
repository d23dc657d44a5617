//! Where sandbox-mcp keeps its files. Every binary resolves paths here so the
//! orchestrator, the helper and the tests agree without passing flags around.
//!
//! - data (`$XDG_DATA_HOME/sandbox-mcp`, `~/.local/share/sandbox-mcp`): images and
//!   volumes, which are user data and outlive everything else.
//! - state (`$XDG_STATE_HOME/sandbox-mcp`, `~/.local/state/sandbox-mcp`): per-VM
//!   writable layers, logs, the state file.
//! - runtime (`$XDG_RUNTIME_DIR/sandbox-mcp`, else `<state>/run`): sockets, pid files
//!   and locks of the helper and the orchestrator daemon.
//!
//! Overrides: `SANDBOX_MCP_IMAGE_STORE` (image directory, so test runs can share
//! one built image) and `SANDBOX_MCP_HELPER_SOCKET` (helper socket path).
//!
//! Data, state, configuration and runtime are the user's alone (0700, see
//! [`make_private_dirs`]).
use std::path::{Path, PathBuf};

fn home() -> PathBuf {
    std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/"))
}

fn xdg(var: &str, fallback: &str) -> PathBuf {
    match std::env::var_os(var) {
        Some(v) if !v.is_empty() => PathBuf::from(v),
        _ => home().join(fallback),
    }
}

/// Root of user data: images and volumes.
pub fn data_dir() -> PathBuf {
    xdg("XDG_DATA_HOME", ".local/share").join("sandbox-mcp")
}

/// Root of state: VM layers, logs, state file.
pub fn state_dir() -> PathBuf {
    xdg("XDG_STATE_HOME", ".local/state").join("sandbox-mcp")
}

/// Directory for sockets and pid files; short, because Unix socket paths are
/// limited to 107 bytes.
pub fn runtime_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(v) if !v.is_empty() => PathBuf::from(v).join("sandbox-mcp"),
        _ => state_dir().join("run"),
    }
}

/// The image store.
pub fn image_store() -> PathBuf {
    match std::env::var_os("SANDBOX_MCP_IMAGE_STORE") {
        Some(v) if !v.is_empty() => PathBuf::from(v),
        _ => data_dir().join("images"),
    }
}

/// Per-sandbox volumes (e.g. `<volumes>/<sandbox>/workspace`).
pub fn volumes_dir() -> PathBuf {
    data_dir().join("volumes")
}

/// The helper's gRPC socket.
pub fn helper_socket() -> PathBuf {
    match std::env::var_os("SANDBOX_MCP_HELPER_SOCKET") {
        Some(v) if !v.is_empty() => PathBuf::from(v),
        _ => runtime_dir().join("helper.sock"),
    }
}

/// The helper's pid file, next to its socket.
pub fn helper_pid_file() -> PathBuf {
    helper_socket().with_extension("pid")
}

/// The helper's log file (it runs detached, so stderr goes here).
pub fn helper_log_file() -> PathBuf {
    state_dir().join("helper.log")
}

/// The orchestrator daemon's socket, where front-ends connect.
pub fn daemon_socket() -> PathBuf {
    runtime_dir().join("daemon.sock")
}

/// The daemon's pid file, next to its socket.
pub fn daemon_pid_file() -> PathBuf {
    daemon_socket().with_extension("pid")
}

/// The lock a daemon holds for as long as it runs: no two daemons per user.
pub fn daemon_lock() -> PathBuf {
    daemon_socket().with_extension("lock")
}

/// The lock front-ends take to start a daemon, so they start one, not several.
pub fn daemon_start_lock() -> PathBuf {
    daemon_socket().with_extension("start.lock")
}

/// The daemon's log file.
pub fn daemon_log_file() -> PathBuf {
    state_dir().join("daemon.log")
}

/// User configuration (`$XDG_CONFIG_HOME/sandbox-mcp`, `~/.config/sandbox-mcp`).
pub fn config_dir() -> PathBuf {
    xdg("XDG_CONFIG_HOME", ".config").join("sandbox-mcp")
}

/// Every directory sandbox-mcp keeps its own files in: data (images, the
/// sandboxes' volumes), state, configuration, runtime and the image store.
/// Host-path tools never reach into these (see `orchestrator::hostfs`): a
/// sandbox's own `/workspace` lives here, writable from inside it.
pub fn own_dirs() -> Vec<PathBuf> {
    vec![data_dir(), state_dir(), config_dir(), runtime_dir(), image_store()]
}

/// Makes the data, state, configuration and runtime directories if missing
/// and closes them to every other user (mode 0700, existing ones too): other
/// users of the machine must not list the sandboxes' volumes, logs, state or
/// sockets, even where the directories above are open (`~/.local` and
/// `~/.local/share` are often 0755). The image store is left as it is: it may
/// be shared on purpose, and images hold nothing of a user's. Failures are
/// logged; whatever then needs the directory reports its own error.
pub fn make_private_dirs() {
    for dir in [data_dir(), state_dir(), config_dir(), runtime_dir()] {
        if let Err(e) = make_private(&dir) {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot make the directory private (0700)");
        }
    }
}

/// Makes `dir` (and its parents) if missing and closes it to every other
/// user (0700), tightening an existing one.
pub fn make_private(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent)?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    let mode = std::fs::metadata(dir)?.permissions().mode();
    if mode & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode & 0o7700))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn private_dirs_are_made_0700_and_open_ones_closed() {
        let base = std::env::temp_dir().join(format!("paths-private-{}", std::process::id()));
        let (made, open) = (base.join("a/made"), base.join("open"));
        std::fs::create_dir_all(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        for d in [&made, &open] {
            make_private(d).unwrap();
            assert_eq!(std::fs::metadata(d).unwrap().permissions().mode() & 0o7777, 0o700, "{}", d.display());
        }
        std::fs::remove_dir_all(&base).unwrap();
    }
}
