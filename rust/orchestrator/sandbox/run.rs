//! Running commands in a sandbox with its persistent env, recorded in the
//! audit log.
use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use super::{AGENT_ANSWER_TIMEOUT, Command, Running, Sandbox, SandboxManager, ShellOrArgv, cmd_argv, resolve_cwd};
use crate::{
    error::OrchestratorError,
    exec::{self, ExecResult},
    helper_client::{HelperError, ProcessConfig, VmState},
    shell,
};

impl SandboxManager {
    /// Run a command in the named sandbox (created on first use), with the
    /// sandbox's persistent env, and record it in the audit log.
    pub async fn run(&self, name: &str, cmd: Command) -> Result<(Arc<Sandbox>, ExecResult), OrchestratorError> {
        let sandbox = self.get_or_create(name).await?;
        let result = self.run_in(&sandbox, cmd).await?;
        Ok((sandbox, result))
    }

    /// Run a command in a known sandbox.
    pub async fn run_in(&self, sandbox: &Sandbox, cmd: Command) -> Result<ExecResult, OrchestratorError> {
        self.run_with_env(sandbox, cmd, sandbox.env()).await
    }

    /// Run an internal probe: not audited and not counted as activity, so
    /// health checks never keep an idle sandbox alive.
    pub(crate) async fn probe(&self, sandbox: &Sandbox, cmd: Command) -> Result<ExecResult, OrchestratorError> {
        let process = ProcessConfig {
            argv: cmd_argv(sandbox, cmd.argv),
            env: Default::default(),
            cwd: resolve_cwd(cmd.cwd),
            create_cwd: false,
            user: cmd.user,
            secret: cmd.secret,
        };
        Ok(exec::run(&self.helper, &sandbox.name, process, &cmd.stdin, cmd.timeout).await?)
    }

    /// Run a command with an explicit environment (the persistent env plus
    /// per-call secrets that must not be stored anywhere).
    pub async fn run_with_env(
        &self,
        sandbox: &Sandbox,
        cmd: Command,
        env: BTreeMap<String, String>,
    ) -> Result<ExecResult, OrchestratorError> {
        if cmd.timeout.is_zero() {
            return Err(OrchestratorError::InvalidArgument("timeout must be greater than 0".into()));
        }
        if let ShellOrArgv::Shell(line) = &cmd.argv {
            shell::check_length(line)?;
        }
        let direct = match &cmd.argv {
            ShellOrArgv::Shell(line) => shell::direct_argv(line),
            ShellOrArgv::Argv(_) => None,
        };
        let process = ProcessConfig {
            argv: cmd_argv(sandbox, cmd.argv),
            env: env.into_iter().collect(),
            cwd: resolve_cwd(cmd.cwd),
            create_cwd: true,
            user: cmd.user,
            secret: cmd.secret,
        };
        sandbox.touch();
        let _running = Running::start(sandbox);
        let mut result = None;
        if let Some(argv) = direct {
            let attempt = ProcessConfig { argv, ..process.clone() };
            match exec::run(&self.helper, &sandbox.name, attempt, &cmd.stdin, cmd.timeout).await {
                // Refused before it ran (no such program, …): let the shell
                // run it and word the error as a shell would.
                Err(HelperError::InvalidArgument(_)) => {}
                other => result = Some(other?),
            }
        }
        let mut result = match result {
            Some(r) => r,
            None => exec::run(&self.helper, &sandbox.name, process, &cmd.stdin, cmd.timeout).await?,
        };
        if let Some(text) = cmd.audit_as {
            let entry = sandbox.record(&text, result.exit_code(), result.duration);
            if let Err(e) = self.save_history(&sandbox.name, &entry).await {
                tracing::warn!(sandbox = %sandbox.name, error = %e, "could not save a history entry");
                result.history_unsaved = Some(format!("the change was not saved: {e}"));
            }
        }
        Ok(result)
    }

    /// Which sandboxes are really alive: their VM runs (the helper says so)
    /// and their agent answers a request within [`AGENT_ANSWER_TIMEOUT`]. A
    /// VM the helper still calls running may be frozen or have lost its
    /// agent (a stopped sandbox used to show `shell:alive`). Asked of every
    /// sandbox at once; not counted as activity.
    pub async fn running(&self) -> Result<HashMap<String, bool>, OrchestratorError> {
        let mut asks = tokio::task::JoinSet::new();
        for v in self.helper.list_vms().await? {
            let helper = self.helper.clone();
            asks.spawn(async move {
                let answers = v.state == VmState::Running
                    && matches!(
                        tokio::time::timeout(AGENT_ANSWER_TIMEOUT, helper.list_background(&v.id)).await,
                        Ok(Ok(_))
                    );
                (v.id, answers)
            });
        }
        Ok(asks.join_all().await.into_iter().collect())
    }
}
