//! `collect_artifacts`: copy the sandbox files matching some globs into one
//! host directory (under the host roots) and say what was written, with
//! sizes and sha256.
//!
//! Matches are flattened by basename into the destination; a name already
//! used by an earlier match of the same call becomes `<n>-<name>` (smallest
//! free n from 2). Existing host files of the same name are replaced (a new
//! file renamed over them, so a hard link elsewhere keeps its content); a
//! symlink of the same name is refused, never written through. Only regular files are copied:
//! symlinks in the sandbox are reported and skipped, directories ignored.
//! A match whose host name the host write guard denies (a `.sandbox-mcp.toml`,
//! a `.bashrc`) is skipped and reported, like a symlink, before anything is
//! written; if every match is, the call fails. Files arrive without exec bits
//! unless the call asks for them.
use std::{
    collections::HashSet,
    ffi::OsString,
    path::{Path, PathBuf},
    time::Duration,
};

use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use super::{
    error::OrchestratorError,
    helper_client::HelperError,
    hostfs::{Dir, HostFsError},
    hostguard::{ExecBits, Refused},
    sandbox::{Command, Sandbox, SandboxManager, WORKSPACE},
    tarstream::ChunkReader,
    transfer::unpack_single,
};

/// Lists matches NUL-separated, each tagged `F` (regular file) or `L`
/// (symlink). Patterns are positional arguments, expanded with IFS empty so
/// they are globbed but never word-split; bash adds `**`.
const FIND_SCRIPT: &str = r#"[ -n "$BASH_VERSION" ] && shopt -s globstar
cd /workspace || exit 1
IFS=
for p; do
  for f in $p; do
    if [ -L "$f" ]; then printf 'L%s\0' "$f"
    elif [ -f "$f" ]; then printf 'F%s\0' "$f"
    fi
  done
done
"#;

/// One file written on the host.
#[derive(Debug)]
pub struct Artifact {
    /// Its path in the sandbox.
    pub source: String,
    /// Where it was written.
    pub path: PathBuf,
    /// Bytes.
    pub size: u64,
    /// Lowercase hex sha256 of the written file.
    pub sha256: String,
}

/// What `collect_artifacts` did.
#[derive(Debug)]
pub struct Collected {
    /// The host directory.
    pub dest: PathBuf,
    /// Files written, in match order.
    pub files: Vec<Artifact>,
    /// Sandbox paths that matched but are symlinks (not copied).
    pub skipped_symlinks: Vec<String>,
    /// Matches the host write guard kept off the host.
    pub refused: Refused,
}

fn io_err(what: impl std::fmt::Display, e: std::io::Error) -> OrchestratorError {
    OrchestratorError::InvalidArgument(format!("{what}: {e}"))
}

/// Lowercase hex of a digest.
fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// A host file name for `source` not yet used in this call.
fn unique_name(source: &str, used: &mut HashSet<String>) -> String {
    let base = Path::new(source).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let mut name = base.clone();
    let mut n = 2;
    while !used.insert(name.clone()) {
        name = format!("{n}-{base}");
        n += 1;
    }
    name
}

impl SandboxManager {
    /// Copy every regular file matching `patterns` (globs relative to
    /// /workspace unless absolute) into the host directory `dest`, with exec
    /// bits only if `exec` keeps them.
    pub async fn collect_artifacts(
        &self,
        sandbox: &Sandbox,
        patterns: &[String],
        dest: &str,
        exec: ExecBits,
    ) -> Result<Collected, OrchestratorError> {
        if patterns.is_empty() || patterns.iter().any(|p| p.trim().is_empty()) {
            return Err(OrchestratorError::InvalidArgument("patterns must be a non-empty list of globs".into()));
        }
        let dest = self.config().host_roots.locate(dest)?;
        dest.check_write()?;
        let mut argv = vec![sandbox.shell.clone(), "-c".into(), FIND_SCRIPT.into(), "sh".into()];
        argv.extend(patterns.iter().cloned());
        let found = self.run_in(sandbox, Command::argv(argv, Duration::from_secs(60))).await?;
        if found.exit_code() != 0 {
            return Err(OrchestratorError::InvalidArgument(format!(
                "finding matches failed: {}",
                super::text::render(&found.stderr).trim_end()
            )));
        }
        let mut seen = HashSet::new();
        let (mut files, mut skipped_symlinks) = (Vec::new(), Vec::new());
        for entry in found.stdout.bytes.split(|b| *b == 0).filter(|e| e.len() > 1) {
            let rel = String::from_utf8_lossy(&entry[1..]).into_owned();
            let path = if rel.starts_with('/') { rel } else { format!("{WORKSPACE}/{rel}") };
            if !seen.insert(path.clone()) {
                continue;
            }
            match entry[0] {
                b'L' => skipped_symlinks.push(path),
                _ => files.push(path),
            }
        }
        if files.is_empty() {
            let symlinks = if skipped_symlinks.is_empty() {
                String::new()
            } else {
                format!(" (only symlinks, which are not copied: {})", skipped_symlinks.join(", "))
            };
            return Err(OrchestratorError::InvalidArgument(format!(
                "no files in sandbox '{}' match {}{symlinks}",
                sandbox.shown(),
                patterns.join(", ")
            )));
        }
        // Names are settled and put to the guard before anything is created
        // (the writes check again).
        let mut used = HashSet::new();
        let mut refused = Refused::default();
        let mut allowed = Vec::with_capacity(files.len());
        for source in files {
            let name = unique_name(&source, &mut used);
            match dest.may_write(Path::new(&name)) {
                Ok(()) => allowed.push((source, name)),
                Err(refusal) => refused.add(dest.shown().join(&name), refusal),
            }
        }
        if allowed.is_empty() {
            return Err(HostFsError::AllRefused(refused).into());
        }
        let dest_dir = dest.create_dir()?;
        let mut written = Vec::with_capacity(allowed.len());
        for (source, name) in allowed {
            let (size, sha256) = self.copy_file_out(sandbox, &source, &dest_dir, OsString::from(&name), exec).await?;
            written.push(Artifact { source, path: dest.shown().join(name), size, sha256 });
        }
        Ok(Collected { dest: dest.shown().to_path_buf(), files: written, skipped_symlinks, refused })
    }

    /// Stream one sandbox file into the host directory `dir` as `name`;
    /// returns its size and the sha256 of what was written.
    async fn copy_file_out(
        &self,
        sandbox: &Sandbox,
        source: &str,
        dir: &Dir,
        name: OsString,
        exec: ExecBits,
    ) -> Result<(u64, String), OrchestratorError> {
        let gone = || OrchestratorError::InvalidArgument(format!("{source} vanished from the sandbox while copying"));
        let stream = self.helper.copy_out(&sandbox.name, source).await.map_err(|e| match e {
            HelperError::NotFound(_) => gone(),
            other => other.into(),
        })?;
        let (tx, rx) = mpsc::channel(8);
        let dir = dir.try_clone()?;
        let unpack = tokio::task::spawn_blocking(move || {
            let mut hasher = Sha256::new();
            let size = unpack_single(ChunkReader::new(rx), &dir, &name, exec, &mut |b| hasher.update(b))?;
            Ok::<_, OrchestratorError>((size, hex(&hasher.finalize())))
        });
        let pumped = stream.pump(tx).await;
        let unpacked = unpack.await.map_err(|e| io_err("extract", e.into()))?;
        pumped.map_err(|e| match e {
            HelperError::NotFound(_) => gone(),
            other => other.into(),
        })?;
        unpacked
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_flatten_with_numbered_collisions() {
        let mut used = HashSet::new();
        assert_eq!(unique_name("/workspace/a/out.txt", &mut used), "out.txt");
        assert_eq!(unique_name("/workspace/b/out.txt", &mut used), "2-out.txt");
        assert_eq!(unique_name("/tmp/out.txt", &mut used), "3-out.txt");
        assert_eq!(unique_name("/x/other", &mut used), "other");
    }

    #[test]
    fn sha256_in_hex() {
        let digest = Sha256::digest(b"abc");
        assert_eq!(hex(&digest), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }
}
