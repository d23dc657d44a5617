//! Background processes (`bg`, `logs`, `kill`). The VM's agent owns them and
//! keeps their output in a bounded ring, so they keep running and keep their
//! logs across MCP server restarts; the orchestrator only names and asks.
use super::{
    error::OrchestratorError,
    helper_client::{BackgroundInfo, HelperError, ProcessConfig},
    names::{random_hex, validate_process_name},
    sandbox::{Sandbox, SandboxManager},
};

impl SandboxManager {
    /// Start `command` (a shell line) in the background under `name`
    /// (generated as `bg-<6 hex>` when empty). With `restart`, it starts
    /// again when the sandbox comes back after a loss (a reboot, a crash);
    /// without, a mark an earlier process of that name had goes.
    pub async fn start_background(
        &self,
        sandbox: &Sandbox,
        name: &str,
        command: &str,
        workdir: &str,
        restart: bool,
    ) -> Result<BackgroundInfo, OrchestratorError> {
        let name = if name.is_empty() { format!("bg-{}", random_hex(6)) } else { name.to_string() };
        validate_process_name(&name)?;
        if restart && sandbox.parent.is_some() {
            return Err(OrchestratorError::InvalidArgument(format!(
                "restart=true is for top-level sandboxes: a child ('{}') never comes back after a loss; its parent \
                 spawns a new one",
                sandbox.shown()
            )));
        }
        super::shell::check_length(command)?;
        let process = ProcessConfig {
            argv: vec![sandbox.shell.clone(), "-c".into(), command.into()],
            env: sandbox.env().into_iter().collect(),
            cwd: workdir.into(),
            create_cwd: true,
            user: String::new(),
            secret: Vec::new(),
        };
        let info = self.helper.start_background(&sandbox.name, &name, process).await.map_err(|e| match e {
            HelperError::AlreadyExists(_) => OrchestratorError::InvalidArgument(format!(
                "background process '{name}' is still running in '{}'; kill('{name}') first or pick another name",
                sandbox.shown()
            )),
            other => other.into(),
        })?;
        sandbox.record(&format!("bg[{name}]: {command}"), 0, std::time::Duration::ZERO);
        let mark = restart.then_some((command, workdir));
        self.record_restart(&sandbox.name, &name, mark).await.map_err(|source| OrchestratorError::NotSaved {
            source: Box::new(source),
            done: format!("Started [{name}] PID {}", info.pid),
            after_restart: if restart {
                "it does not start again when the sandbox comes back after a loss".into()
            } else {
                "an earlier process of this name marked to restart still would".into()
            },
        })?;
        Ok(info)
    }

    /// Map the helper's NOT_FOUND for a process to the reference's message,
    /// which lists the ids that do exist.
    async fn no_such_process(&self, sandbox: &Sandbox, name: &str, e: HelperError) -> OrchestratorError {
        if !matches!(e, HelperError::NotFound(_)) {
            return e.into();
        }
        let running: Vec<String> = match self.helper.list_background(&sandbox.name).await {
            Ok(list) => list.into_iter().map(|p| p.name).collect(),
            Err(_) => Vec::new(),
        };
        let running = if running.is_empty() { "none".to_string() } else { running.join(", ") };
        OrchestratorError::NoSuchProcess { name: name.into(), sandbox: sandbox.name.clone(), running }
    }

    /// A background process and the last `tail` lines of its output (0 = all kept).
    pub async fn background_log(
        &self,
        sandbox: &Sandbox,
        name: &str,
        tail: u32,
    ) -> Result<(BackgroundInfo, Vec<u8>), OrchestratorError> {
        match self.helper.read_background_log(&sandbox.name, name, tail).await {
            Ok(r) => Ok(r),
            Err(e) => Err(self.no_such_process(sandbox, name, e).await),
        }
    }

    /// Stop a background process's whole group (TERM, grace, KILL); returns
    /// its last 20 lines.
    pub async fn stop_background(
        &self,
        sandbox: &Sandbox,
        name: &str,
    ) -> Result<(BackgroundInfo, Vec<u8>), OrchestratorError> {
        let stopped = self.helper.stop_background(&sandbox.name, name, 20).await;
        // Killed on purpose (or not running: one marked to restart that did
        // not come back): it does not come back with the sandbox.
        let unmarked = self.record_restart(&sandbox.name, name, None).await;
        let stopped = match stopped {
            Ok(r) => r,
            Err(e) => return Err(self.no_such_process(sandbox, name, e).await),
        };
        unmarked.map_err(|source| OrchestratorError::NotSaved {
            source: Box::new(source),
            done: format!("Stopped [{name}]"),
            after_restart: "it starts again if the sandbox comes back after a loss".into(),
        })?;
        Ok(stopped)
    }

    /// Every background process record of a sandbox.
    pub async fn list_background(&self, sandbox: &Sandbox) -> Result<Vec<BackgroundInfo>, OrchestratorError> {
        Ok(self.helper.list_background(&sandbox.name).await?)
    }
}
