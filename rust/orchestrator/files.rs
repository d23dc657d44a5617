//! Files in sandboxes: write one or many (as a tar stream the sandbox's agent
//! extracts, so nothing is ever written on the host), and read one back.
//! Relative paths resolve against `/workspace`.
use std::time::Duration;

use super::{
    error::OrchestratorError,
    exec::{Captured, ExecResult},
    helper_client::HelperError,
    sandbox::{Command, Sandbox, SandboxManager, WORKSPACE},
};

/// Time allowed for a file write or read.
const FILE_TIMEOUT: Duration = Duration::from_secs(60);

/// Resolve a sandbox path the way the file tools document it.
pub fn resolve(path: &str) -> Result<String, OrchestratorError> {
    if path.is_empty() {
        return Err(OrchestratorError::InvalidArgument("path must not be empty".into()));
    }
    if path.contains('\0') {
        return Err(OrchestratorError::InvalidArgument(format!("path {path:?} contains a NUL byte")));
    }
    Ok(if path.starts_with('/') { path.to_string() } else { format!("{WORKSPACE}/{path}") })
}

/// Why a command that handles files failed, from its stderr.
fn failure(result: &ExecResult) -> OrchestratorError {
    let text = crate::text::render(&result.stderr);
    let text = text.trim_end();
    OrchestratorError::InvalidArgument(if text.is_empty() {
        format!("command failed with exit code {}", result.exit_code())
    } else {
        text.to_string()
    })
}

impl SandboxManager {
    /// Write files (absolute or /workspace-relative path → content) into a
    /// sandbox in one round trip. Parent directories are created.
    pub async fn write_files(&self, sandbox: &Sandbox, files: &[(String, Vec<u8>)]) -> Result<(), OrchestratorError> {
        let resolved: Vec<(String, &[u8])> = files
            .iter()
            .map(|(path, data)| Ok((resolve(path)?, data.as_slice())))
            .collect::<Result<_, OrchestratorError>>()?;
        let archive = super::tarstream::files_archive(resolved.iter().map(|(p, d)| (p.as_str(), *d)), 0o644)
            .map_err(|e| OrchestratorError::InvalidArgument(format!("cannot build archive: {e}")))?;
        self.helper.copy_in_archive(&sandbox.name, "/", archive).await.map_err(|e| match e {
            // The agent's reason (e.g. "Is a directory") names the path.
            HelperError::InvalidArgument(m) | HelperError::Internal(m) => OrchestratorError::InvalidArgument(m),
            other => other.into(),
        })?;
        Ok(())
    }

    /// Read a file; its bytes up to the output cap.
    pub async fn read_file(&self, sandbox: &Sandbox, path: &str) -> Result<Captured, OrchestratorError> {
        let full = resolve(path)?;
        let mut cmd = Command::argv(["cat", "--", &full], FILE_TIMEOUT);
        cmd.audit_as = Some(format!("cat '{full}'"));
        let result = self.run_in(sandbox, cmd).await?;
        if result.exit_code() != 0 {
            return Err(failure(&result));
        }
        Ok(result.stdout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_relative_to_workspace() {
        assert_eq!(resolve("a/b.txt").unwrap(), "/workspace/a/b.txt");
        assert_eq!(resolve("/etc/x").unwrap(), "/etc/x");
        assert!(resolve("").is_err());
        assert!(resolve("a\0b").is_err());
    }
}
