//! Persistent environment variables of a sandbox. The orchestrator applies
//! them to every later command as process environment (so `unset` really
//! unsets: no long-lived shell keeps stale exports), and mirrors them inside
//! the sandbox: a JSON file it reads back after a restart, and a profile.d
//! script so interactive login shells see them too.
use std::{collections::BTreeMap, time::Duration};

use super::{
    error::OrchestratorError,
    names::validate_env_key,
    sandbox::{Command, Sandbox, SandboxManager},
};

/// The machine-readable copy, read back on attach.
const ENV_JSON: &str = "/etc/sandbox-mcp/env.json";
/// The copy login shells source.
const ENV_PROFILE: &str = "/etc/profile.d/mcp-env.sh";

fn shell_quote(value: &str) -> String {
    format!("'{}'", value.replace('\'', r"'\''"))
}

/// The env as `export KEY='value'` lines, the form login shells source.
pub fn profile_script(env: &BTreeMap<String, String>) -> String {
    env.iter().map(|(k, v)| format!("export {k}={}\n", shell_quote(v))).collect()
}

impl SandboxManager {
    /// Set `key` for every later command in the sandbox.
    pub async fn set_env(&self, sandbox: &Sandbox, key: &str, value: &str) -> Result<(), OrchestratorError> {
        validate_env_key(key)?;
        // The value goes into every later process's environment, where a NUL
        // cannot be passed: accepting one would make each command fail to start.
        if value.contains('\0') {
            return Err(OrchestratorError::InvalidArgument(format!(
                "the value of env key '{key}' contains a NUL byte, which no environment variable can hold"
            )));
        }
        self.change_env_key(sandbox, key, Some(value)).await
    }

    /// Remove `key` (a no-op when it was not set).
    pub async fn unset_env(&self, sandbox: &Sandbox, key: &str) -> Result<(), OrchestratorError> {
        validate_env_key(key)?;
        self.change_env_key(sandbox, key, None).await
    }

    /// Set (`Some`) or remove one key. Changes to one sandbox's env take
    /// turns (its `ops` lock), so none is overwritten by another in flight.
    /// The new env is written inside the sandbox first, then committed to
    /// the state database (re-read in the same transaction, so a key another
    /// server process set meanwhile is kept), and adopted in memory.
    async fn change_env_key(&self, sandbox: &Sandbox, key: &str, value: Option<&str>) -> Result<(), OrchestratorError> {
        let _turn = sandbox.ops.lock().await;
        let planned = self.change_env(&sandbox.name, key, value, sandbox.env(), false).await?;
        self.mirror_env(sandbox, &planned).await?;
        let env = self.change_env(&sandbox.name, key, value, planned, true).await?;
        *sandbox.env.lock().unwrap_or_else(|p| p.into_inner()) = env;
        Ok(())
    }

    /// Make `env` the sandbox's env (a sandbox that came back after a loss):
    /// written inside it and adopted in memory; the caller saves it.
    pub(crate) async fn adopt_env(
        &self,
        sandbox: &Sandbox,
        env: BTreeMap<String, String>,
    ) -> Result<(), OrchestratorError> {
        let _turn = sandbox.ops.lock().await;
        self.mirror_env(sandbox, &env).await?;
        *sandbox.env.lock().unwrap_or_else(|p| p.into_inner()) = env;
        Ok(())
    }

    /// The env's copies inside the sandbox.
    async fn mirror_env(&self, sandbox: &Sandbox, env: &BTreeMap<String, String>) -> Result<(), OrchestratorError> {
        let json = serde_json::to_vec_pretty(env)
            .map_err(|e| OrchestratorError::InvalidArgument(format!("cannot encode env: {e}")))?;
        let files = [(ENV_JSON.to_string(), json), (ENV_PROFILE.to_string(), profile_script(env).into_bytes())];
        self.write_files(sandbox, &files).await
    }

    /// Read the env a previous orchestrator stored in the sandbox.
    pub(super) async fn load_env(&self, sandbox: &Sandbox) -> Result<BTreeMap<String, String>, OrchestratorError> {
        let cmd = Command::argv(["cat", ENV_JSON], Duration::from_secs(10));
        let result = self.run_in(sandbox, cmd).await?;
        if result.exit_code() != 0 {
            return Ok(BTreeMap::new());
        }
        serde_json::from_slice(&result.stdout.bytes)
            .map_err(|e| OrchestratorError::InvalidArgument(format!("{ENV_JSON} is not valid JSON: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_quotes_values() {
        let env = BTreeMap::from([("A".to_string(), "it's $x\nline".to_string())]);
        assert_eq!(profile_script(&env), "export A='it'\\''s $x\nline'\n");
    }
}
