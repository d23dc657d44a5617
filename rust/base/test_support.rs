//! What the crate's unit tests share.
use std::path::PathBuf;

/// An empty directory of its own for one test, made anew under the system's
/// temp dir (named by `tag` and the test process); the test removes it at
/// its end.
pub fn scratch_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sandbox-mcp-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
