//! Lease, artifact and project-config tools: extend_ttl, collect_artifacts,
//! validate_config.
use std::time::SystemTime;

use rmcp::{handler::server::wrapper::Parameters, model::CallToolResult, schemars, tool, tool_router};
use serde::Deserialize;

use super::{SandboxServer, default_sandbox, fail, format, ok, reply};
use sandbox_orchestrator::{
    config::Profile,
    hostguard::ExecBits,
    lease::iso_utc,
    project::{PROJECT_FILE, ProjectConfig, Validation},
    text::human_size,
};

/// Parameters of `extend_ttl`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ExtendTtlParams {
    /// Minutes to add (1 up to the configured max_lease_ttl, default 120).
    pub minutes: u64,
    /// Sandbox name.
    #[serde(default = "default_sandbox")]
    pub sandbox: String,
}

/// Parameters of `collect_artifacts`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct CollectArtifactsParams {
    /// Globs inside the sandbox, relative to /workspace unless absolute (`**` recurses).
    pub patterns: Vec<String>,
    /// Host directory to copy into (under the host roots; created if missing).
    pub dest: String,
    /// Keep the files' exec bits on the host (default false: nothing from a sandbox arrives runnable).
    #[serde(default)]
    pub executable: bool,
    /// Sandbox name.
    #[serde(default = "default_sandbox")]
    pub sandbox: String,
}

/// Parameters of `validate_config`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ValidateConfigParams {
    /// Host path of a project file, or of a directory holding `.sandbox-mcp.toml`;
    /// empty: the project directory's.
    #[serde(default)]
    pub path: String,
}

fn profile_summary(p: &Profile) -> String {
    format!(
        "image={} cpus={} memory={} network={} disk={} trust_host_ca={}",
        p.image,
        p.cpus,
        format::memory(p.memory_bytes),
        p.network.summary(),
        format::memory(p.disk_bytes),
        p.trust_host_ca
    )
}

fn project_summary(project: &ProjectConfig) -> String {
    let mut parts = Vec::new();
    if !project.env.is_empty() {
        parts.push(format!("env={}", project.env.keys().cloned().collect::<Vec<_>>().join(",")));
    }
    if !project.sync_exclude.is_empty() {
        parts.push(format!("sync.exclude={}", project.sync_exclude.join(",")));
    }
    if !project.services.is_empty() {
        parts.push(format!("services={}", project.services.len()));
    }
    parts.iter().map(|p| format!(" {p}")).collect()
}

#[tool_router(router = lease_router, vis = "pub(super)")]
impl SandboxServer {
    #[tool(
        description = "Extend a sandbox's lease (its absolute expiry, besides the idle TTL) by `minutes` from its current end or now, whichever is later. A sandbox without a lease gets one. When a lease ends the sandbox is destroyed (its /workspace volume is kept).",
        annotations(destructive_hint = false, idempotent_hint = false, open_world_hint = false)
    )]
    async fn extend_ttl(&self, Parameters(p): Parameters<ExtendTtlParams>) -> Result<CallToolResult, rmcp::ErrorData> {
        reply(self.manager.extend_lease(&p.sandbox, p.minutes).await.map(|(s, ends)| {
            let left = ends.duration_since(SystemTime::now()).unwrap_or_default();
            format!("Lease of '{}' now ends at {} (in {}m)", s.shown(), iso_utc(ends), left.as_secs().div_ceil(60))
        }))
    }

    #[tool(
        description = "Copy the sandbox files matching `patterns` (globs, relative to /workspace unless absolute) into a host directory under the host roots, flattened by name (`2-<name>` on collisions). Returns a manifest line per file: `<size> <sha256> <host path>`. Symlinks are skipped, and so are names the host would run or trust (.sandbox-mcp.toml, shell rc files, ...). Files arrive without exec bits unless `executable` is true.",
        annotations(destructive_hint = true, idempotent_hint = true, open_world_hint = false)
    )]
    async fn collect_artifacts(
        &self,
        Parameters(p): Parameters<CollectArtifactsParams>,
    ) -> Result<CallToolResult, rmcp::ErrorData> {
        let m = &self.manager;
        let result = async {
            // Reading from a sandbox never creates one: there is nothing to read yet.
            let sandbox = m.get(&p.sandbox)?;
            m.collect_artifacts(&sandbox, &p.patterns, &p.dest, ExecBits::from_flag(p.executable)).await
        };
        reply(result.await.map(|c| {
            let mut lines: Vec<String> =
                c.files.iter().map(|f| format!("{} {} {}", f.size, f.sha256, f.path.display())).collect();
            let total: u64 = c.files.iter().map(|f| f.size).sum();
            let mut summary =
                format!("Collected {} file(s), {} into {}", c.files.len(), human_size(total), c.dest.display());
            if !c.skipped_symlinks.is_empty() {
                summary.push_str(&format!(
                    " ({} symlink(s) skipped: {})",
                    c.skipped_symlinks.len(),
                    c.skipped_symlinks.join(", ")
                ));
            }
            if !c.refused.is_empty() {
                summary.push_str(&format!(" ({})", c.refused));
            }
            lines.push(summary);
            lines.join("\n")
        }))
    }

    #[tool(
        description = "Check a project config file (.sandbox-mcp.toml: image, cpus, memory, network (\"none\", \"egress\" or {allow, deny} rules), disk, trust_host_ca, env, sync.exclude, services) and report every problem with its key, or the settings new sandboxes get.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn validate_config(
        &self,
        Parameters(p): Parameters<ValidateConfigParams>,
    ) -> Result<CallToolResult, rmcp::ErrorData> {
        match self.manager.validate_project(&p.path) {
            Ok(Validation::Valid { path, project, resolved }) => ok(format!(
                "Config OK: {}{} ({})",
                profile_summary(&resolved),
                project_summary(&project),
                path.display()
            )),
            Ok(Validation::Absent { path, resolved }) => ok(format!(
                "No {PROJECT_FILE} at {}; sandboxes use the user config: {}",
                path.display(),
                profile_summary(&resolved)
            )),
            Ok(Validation::Invalid { path, problems }) => fail(format!(
                "{} has {} problem(s):\n{}",
                path.display(),
                problems.len(),
                problems.iter().map(|p| format!("  {p}")).collect::<Vec<_>>().join("\n")
            )),
            Err(e) => fail(e),
        }
    }
}
