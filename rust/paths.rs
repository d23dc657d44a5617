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
use std::path::PathBuf;

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
