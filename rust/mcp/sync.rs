//! Sync tools: sync_start, sync_stop. Jobs live in the orchestrator's
//! [`SyncManager`](sandbox_orchestrator::sync::SyncManager); this file only
//! maps parameters in and results to the reference's text.
use rmcp::{
    RoleServer, handler::server::wrapper::Parameters, model::CallToolResult, schemars, service::RequestContext, tool,
    tool_router,
};
use serde::Deserialize;

use super::{SandboxServer, default_sandbox, fail, ok, progress::supervise};
use sandbox_orchestrator::sync::{IGNORED_NAMES, SyncInfo};

fn default_sandbox_dir() -> String {
    "/workspace".to_string()
}

/// Parameters of `sync_start`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct SyncStartParams {
    /// Host directory to mirror (`~` expanded; must be under the host roots).
    pub local_dir: String,
    /// Directory inside the sandbox; relative paths are under /workspace.
    #[serde(default = "default_sandbox_dir")]
    pub sandbox_dir: String,
    /// Sandbox name.
    #[serde(default = "default_sandbox")]
    pub sandbox: String,
}

/// Parameters of `sync_stop`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct SyncStopParams {
    /// Job id returned by sync_start (`sync-xxxxxx`).
    pub job_id: String,
}

fn started_text(job: &SyncInfo, initial: u64) -> String {
    format!(
        "Sync started [{}]: {} -> {}:{}\nInitial sync: {initial} files\nWatching for changes (ignoring {}, plus .gitignore)",
        job.id,
        job.local.display(),
        sandbox_orchestrator::names::display(&job.sandbox),
        job.dir,
        IGNORED_NAMES.join(", ")
    )
}

fn stopped_text(job: &SyncInfo) -> String {
    format!(
        "Stopped sync [{}]: {} -> {}:{} ({} files synced total)",
        job.id,
        job.local.display(),
        sandbox_orchestrator::names::display(&job.sandbox),
        job.dir,
        job.files_synced
    )
}

#[tool_router(router = sync_router, vis = "pub(super)")]
impl SandboxServer {
    #[tool(
        description = "Mirror a host directory into a sandbox, one way (host -> sandbox): a full push now, then every change (create, edit, rename, delete) within milliseconds. Skips .git, node_modules, __pycache__, .venv, venv, .DS_Store and what the directory's .gitignore ignores. Returns a job id for sync_stop.",
        annotations(destructive_hint = true, idempotent_hint = false, open_world_hint = false)
    )]
    async fn sync_start(
        &self,
        Parameters(p): Parameters<SyncStartParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, rmcp::ErrorData> {
        // The initial push can be large: it reports progress and a cancelled
        // call starts no job.
        let start = self.syncs.start(&p.local_dir, &p.sandbox_dir, &p.sandbox);
        let Some(result) = supervise(&ctx, "initial sync", start).await else {
            return fail("cancelled by the client; no sync job was started");
        };
        match result {
            Ok((job, initial)) => ok(started_text(&job, initial)),
            Err(e) => fail(e),
        }
    }

    #[tool(
        description = "Stop a sync job started by sync_start.",
        annotations(destructive_hint = false, idempotent_hint = true, open_world_hint = false)
    )]
    async fn sync_stop(&self, Parameters(p): Parameters<SyncStopParams>) -> Result<CallToolResult, rmcp::ErrorData> {
        match self.syncs.stop(&p.job_id).await {
            Ok(job) => ok(stopped_text(&job)),
            Err(e) => fail(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_keep_the_reference_shapes() {
        let job = SyncInfo {
            id: "sync-0a1b2c".into(),
            local: "/src/app".into(),
            sandbox: "default".into(),
            dir: "/workspace".into(),
            files_synced: 7,
            errors: 0,
        };
        assert_eq!(
            started_text(&job, 5),
            "Sync started [sync-0a1b2c]: /src/app -> default:/workspace\nInitial sync: 5 files\nWatching for changes (ignoring .DS_Store, .git, .venv, __pycache__, node_modules, venv, plus .gitignore)"
        );
        assert_eq!(
            stopped_text(&job),
            "Stopped sync [sync-0a1b2c]: /src/app -> default:/workspace (7 files synced total)"
        );
    }
}
