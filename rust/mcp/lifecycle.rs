//! Lifecycle and observability tools: status, list_all, destroy, reset, history.
use rmcp::{handler::server::wrapper::Parameters, model::CallToolResult, schemars, tool, tool_router};
use sandbox_orchestrator::names;
use serde::Deserialize;

use super::{SandboxServer, default_sandbox, fail, format, ok, ok_structured, reply};
use sandbox_orchestrator::OrchestratorError;

/// Parameters of `destroy`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct DestroyParams {
    /// Sandbox to destroy (its /workspace volume is kept).
    pub sandbox: String,
}

/// Parameters of `reset`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ResetParams {
    /// Also delete everything in /workspace.
    #[serde(default)]
    pub wipe_workspace: bool,
    /// Sandbox name.
    #[serde(default = "default_sandbox")]
    pub sandbox: String,
}

/// Parameters of `history`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct HistoryParams {
    /// Most recent entries to show.
    #[serde(default = "default_limit")]
    pub limit: u32,
    /// Sandbox name.
    #[serde(default = "default_sandbox")]
    pub sandbox: String,
}

/// Parameters of `list_all`.
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
pub struct ListAllParams {
    /// Also list other projects' sandboxes (reach one as `<project-id>:<name>`); by default only this
    /// session's project's.
    #[serde(default)]
    pub all_projects: bool,
}

fn default_limit() -> u32 {
    20
}

#[tool_router(router = lifecycle_router, vis = "pub(super)")]
impl SandboxServer {
    #[tool(
        description = "Show every sandbox of this session's project with its state, idle time, resources and command count.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn status(&self) -> Result<CallToolResult, rmcp::ErrorData> {
        let m = &self.manager;
        let result = async {
            let sandboxes = m.list_own();
            let lost = m.lost();
            let notice = m.state_notice().map(|n| format!("{n}\n")).unwrap_or_default();
            if sandboxes.is_empty() && lost.is_empty() {
                return Ok(format!("{notice}No active sandboxes (boot on first use)"));
            }
            let running = m.running().await?;
            let unlimited = m.unenforced_limits().await?;
            let mut lines: Vec<String> = sandboxes
                .iter()
                .map(|s| {
                    let alive = running.get(&s.name).copied().unwrap_or(false);
                    format::status_line(s, alive, unlimited.get(&s.name).map(String::as_str))
                })
                .collect();
            lines.extend(format::status_footer(&m.config()));
            lines.extend(format::status_blocks(&self.forwards.list(), &self.syncs.list(), &lost));
            Ok(format!("{notice}{}", lines.join("\n")))
        };
        reply(result.await)
    }

    #[tool(
        description = "Table of this session's project's sandboxes, with their project. all_projects=true lists every project's; another project's sandbox is reached as `<project-id>:<name>`.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn list_all(&self, Parameters(p): Parameters<ListAllParams>) -> Result<CallToolResult, rmcp::ErrorData> {
        let m = &self.manager;
        let result = async {
            let sandboxes = if p.all_projects { m.list() } else { m.list_own() };
            if sandboxes.is_empty() {
                return Ok("No active sandboxes. Use any sandbox tool to auto-create 'default'.".to_string());
            }
            let running = m.running().await?;
            let rows: Vec<_> = sandboxes
                .into_iter()
                .map(|s| {
                    let alive = running.get(&s.name).copied().unwrap_or(false);
                    (s, alive)
                })
                .collect();
            Ok(format::list_table(&rows))
        };
        reply(result.await)
    }

    #[tool(
        description = "Destroy a sandbox. Its /workspace volume is kept and reappears if the name is used again.",
        annotations(destructive_hint = true, idempotent_hint = false, open_world_hint = false)
    )]
    async fn destroy(&self, Parameters(p): Parameters<DestroyParams>) -> Result<CallToolResult, rmcp::ErrorData> {
        if self.manager.get(&p.sandbox).is_ok_and(|s| s.parent.is_some()) {
            return fail("use destroy_child to destroy child sandboxes");
        }
        let destroyed = self.manager.destroy(&p.sandbox).await;
        if matches!(destroyed, Err(OrchestratorError::Lost { .. })) {
            match self.manager.acknowledge_lost(&p.sandbox).await {
                Ok(true) => {
                    return ok(format!(
                        "Forgot sandbox '{}': its VM was already gone. Its /workspace is kept.",
                        names::display(&p.sandbox)
                    ));
                }
                Ok(false) => {}
                Err(e) => return fail(e),
            }
        }
        reply(destroyed.map(|s| format!("Destroyed sandbox '{}' ({})", s.shown(), s.vm_id())))
    }

    #[tool(
        description = "Replace a sandbox with a fresh one from its image (env and installed packages are reset). /workspace is kept unless wipe_workspace.",
        annotations(destructive_hint = true, idempotent_hint = true, open_world_hint = false)
    )]
    async fn reset(&self, Parameters(p): Parameters<ResetParams>) -> Result<CallToolResult, rmcp::ErrorData> {
        if self.manager.get(&p.sandbox).is_ok_and(|s| s.parent.is_some()) {
            return fail("reset not permitted on child sandboxes (use destroy_child instead)");
        }
        let kept = if p.wipe_workspace { "workspace wiped" } else { "workspace preserved" };
        reply(
            self.manager
                .reset(&p.sandbox, p.wipe_workspace)
                .await
                .map(|s| format!("Fresh sandbox '{}' ready: {} ({kept})", s.shown(), s.shown())),
        )
    }

    #[tool(
        description = "Recent commands run in a sandbox, newest first (secrets redacted).",
        annotations(read_only_hint = true, open_world_hint = false),
        output_schema = rmcp::handler::server::tool::schema_for_output::<format::HistoryOutput>()
    )]
    async fn history(&self, Parameters(p): Parameters<HistoryParams>) -> Result<CallToolResult, rmcp::ErrorData> {
        let entries = match self.manager.get(&p.sandbox) {
            Ok(s) => s.history(p.limit as usize),
            Err(sandbox_orchestrator::OrchestratorError::NoSuchSandbox(_)) => Vec::new(),
            Err(e) => return fail(e),
        };
        let text = if entries.is_empty() {
            format!("No command history for '{}'.", names::display(&p.sandbox))
        } else {
            format::history(&names::display(&p.sandbox), &entries)
        };
        ok_structured(text, format::HistoryOutput::new(&names::display(&p.sandbox), &entries))
    }
}
