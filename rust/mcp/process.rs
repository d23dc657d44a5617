//! Background process tools: bg, logs, kill.
use rmcp::{handler::server::wrapper::Parameters, model::CallToolResult, schemars, tool, tool_router};
use serde::Deserialize;

use super::{SandboxServer, default_sandbox, format, reply};

fn default_workdir() -> String {
    "/workspace".to_string()
}
fn default_tail() -> i64 {
    50
}

/// Parameters of `bg`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct BgParams {
    /// Shell command line to run in the background.
    pub command: String,
    /// Id for logs/kill; generated as bg-xxxxxx when empty.
    #[serde(default)]
    pub name: String,
    /// Working directory (created if missing).
    #[serde(default = "default_workdir")]
    pub workdir: String,
    /// Start it again when the sandbox comes back after a loss (a reboot,
    /// a crash of the VM); kill() ends that.
    #[serde(default)]
    pub restart: bool,
    /// Sandbox name.
    #[serde(default = "default_sandbox")]
    pub sandbox: String,
}

/// Parameters of `logs`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct LogsParams {
    /// Background process id.
    pub name: String,
    /// Last lines to show; 0 or less shows everything kept (the last 1 MiB).
    #[serde(default = "default_tail")]
    pub tail: i64,
    /// Sandbox name.
    #[serde(default = "default_sandbox")]
    pub sandbox: String,
}

/// Parameters of `kill`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct KillParams {
    /// Background process id.
    pub name: String,
    /// Sandbox name.
    #[serde(default = "default_sandbox")]
    pub sandbox: String,
}

#[tool_router(router = process_router, vis = "pub(super)")]
impl SandboxServer {
    #[tool(
        description = "Start a long-running command (server, watcher) in the background. The sandbox owns it: it keeps running and keeps its output (last 1 MiB) across MCP server restarts; with restart=true it also starts again when the sandbox comes back after a loss (reboot, crash). Returns its id for logs/kill.",
        annotations(destructive_hint = false, idempotent_hint = false, open_world_hint = true)
    )]
    async fn bg(&self, Parameters(p): Parameters<BgParams>) -> Result<CallToolResult, rmcp::ErrorData> {
        let m = &self.manager;
        let result = async {
            let sandbox = m.get_or_create(&p.sandbox).await?;
            let info = m.start_background(&sandbox, &p.name, &p.command, &p.workdir, p.restart).await?;
            Ok(format!(
                "Started [{0}] PID {1}\nUse logs('{0}') to read output, kill('{0}') to stop.",
                info.name, info.pid
            ))
        };
        reply(result.await)
    }

    #[tool(
        description = "Show a background process's state and the last `tail` lines of its output (stdout and stderr interleaved).",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn logs(&self, Parameters(p): Parameters<LogsParams>) -> Result<CallToolResult, rmcp::ErrorData> {
        let m = &self.manager;
        let result = async {
            let sandbox = m.get(&p.sandbox)?;
            let (info, output) = m.background_log(&sandbox, &p.name, p.tail.clamp(0, u32::MAX.into()) as u32).await?;
            Ok(format::process_log(&info, &output))
        };
        reply(result.await)
    }

    #[tool(
        description = "Stop a background process and everything it started (TERM, 2 s grace, KILL to its process group). Returns its last output.",
        annotations(destructive_hint = true, idempotent_hint = false, open_world_hint = false)
    )]
    async fn kill(&self, Parameters(p): Parameters<KillParams>) -> Result<CallToolResult, rmcp::ErrorData> {
        let m = &self.manager;
        let result = async {
            let sandbox = m.get(&p.sandbox)?;
            let (info, output) = m.stop_background(&sandbox, &p.name).await?;
            Ok(format::killed(&info, &output))
        };
        reply(result.await)
    }
}
