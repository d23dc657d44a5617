//! Observability tools: stats, health.
use rmcp::{handler::server::wrapper::Parameters, model::CallToolResult, schemars, tool, tool_router};
use serde::Deserialize;

use super::{SandboxServer, default_sandbox, fail, format, ok_structured, reply};
use sandbox_orchestrator::OrchestratorError;

/// Parameters of `stats`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct StatsParams {
    /// Sandbox name.
    #[serde(default = "default_sandbox")]
    pub sandbox: String,
}

#[tool_router(router = observe_router, vis = "pub(super)")]
impl SandboxServer {
    #[tool(
        description = "Resource usage of a sandbox: memory used/limit, CPU time, network bytes, pids, /workspace disk, uptime, background processes, history size.",
        annotations(read_only_hint = true, open_world_hint = false),
        output_schema = rmcp::handler::server::tool::schema_for_output::<format::StatsOutput>()
    )]
    async fn stats(&self, Parameters(p): Parameters<StatsParams>) -> Result<CallToolResult, rmcp::ErrorData> {
        let m = &self.manager;
        let result = async {
            // Reporting on a sandbox never creates one (the reference booted a
            // VM just to describe it).
            let sandbox = m.get(&p.sandbox)?;
            let obs = m.observe_with_usage(&sandbox).await?;
            let bg = m.list_background(&sandbox).await.unwrap_or_default();
            Ok::<_, OrchestratorError>((
                format::stats(&sandbox, &obs, &bg),
                format::StatsOutput::new(&sandbox, &obs, &bg),
            ))
        };
        match result.await {
            Ok((text, data)) => ok_structured(text, data),
            Err(e) => fail(e),
        }
    }

    #[tool(
        description = "Health of every sandbox: agent alive, disk and memory use (HIGH at 80%, FULL/OOM at 95% or after an OOM kill), uptime, processes.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn health(&self) -> Result<CallToolResult, rmcp::ErrorData> {
        let m = &self.manager;
        let result = async {
            let mut rows = Vec::new();
            for sandbox in m.list_own() {
                let obs = m.observe(&sandbox).await?;
                rows.push((sandbox, obs));
            }
            let notice = m.state_notice().map(|n| format!("{n}\n")).unwrap_or_default();
            Ok(format!("{notice}{}", format::health(&rows)))
        };
        reply(result.await)
    }
}
