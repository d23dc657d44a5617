//! Host ↔ sandbox file tools: upload, download, git_clone. Host paths must be
//! under the configured host roots.
use rmcp::{
    RoleServer, handler::server::wrapper::Parameters, model::CallToolResult, schemars, service::RequestContext, tool,
    tool_router,
};
use serde::Deserialize;

use super::{
    SandboxServer, default_sandbox, fail, format, ok,
    progress::{CANCELLED, supervise},
};
use sandbox_orchestrator::{
    hostguard::ExecBits,
    text::{human_size, render},
};

fn default_workspace() -> String {
    "/workspace".to_string()
}
fn default_true() -> bool {
    true
}

/// Parameters of `upload`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct UploadParams {
    /// Host file or directory (must be under the host roots; `~` expands).
    pub local_path: String,
    /// Sandbox directory to copy into, or the full destination path for a file.
    #[serde(default = "default_workspace")]
    pub sandbox_path: String,
    /// Sandbox name.
    #[serde(default = "default_sandbox")]
    pub sandbox: String,
}

/// Parameters of `download`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct DownloadParams {
    /// File or directory in the sandbox.
    pub sandbox_path: String,
    /// Host destination (must be under the host roots; never written through a symlink).
    pub local_path: String,
    /// Keep the files' exec bits on the host (default false: nothing from a sandbox arrives runnable).
    #[serde(default)]
    pub executable: bool,
    /// Sandbox name.
    #[serde(default = "default_sandbox")]
    pub sandbox: String,
}

/// Parameters of `git_clone`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct GitCloneParams {
    /// Repository URL.
    pub repo: String,
    /// Branch or tag (default: the remote's default).
    #[serde(default)]
    pub branch: String,
    /// Access token ("TOKEN" or "USER:TOKEN"); given to git for this call only, never stored.
    #[serde(default)]
    pub token: String,
    /// Directory to clone into (a subdirectory named after the repo is created).
    #[serde(default = "default_workspace")]
    pub path: String,
    /// Clone with --depth 1.
    #[serde(default = "default_true")]
    pub shallow: bool,
    /// Sandbox name.
    #[serde(default = "default_sandbox")]
    pub sandbox: String,
}

#[tool_router(router = transfer_router, vis = "pub(super)")]
impl SandboxServer {
    #[tool(
        description = "Copy a host file or directory into a sandbox. Only host paths under the configured host roots (default: the server's start directory) are allowed.",
        annotations(destructive_hint = true, idempotent_hint = true, open_world_hint = false)
    )]
    async fn upload(&self, Parameters(p): Parameters<UploadParams>) -> Result<CallToolResult, rmcp::ErrorData> {
        let m = &self.manager;
        let result = async {
            let sandbox = m.get_or_create(&p.sandbox).await?;
            m.upload(&sandbox, &p.local_path, &p.sandbox_path).await
        };
        match result.await {
            Ok(u) if u.directory => ok(format!(
                "Uploaded {}/ -> {} ({} files, {} tar, {})",
                p.local_path.trim_end_matches('/'),
                u.dest,
                u.files,
                human_size(u.archive_bytes),
                format::ms(u.elapsed)
            )),
            Ok(u) => ok(format!(
                "Uploaded {} -> {} ({}, {})",
                p.local_path,
                u.dest,
                human_size(u.archive_bytes),
                format::ms(u.elapsed)
            )),
            Err(e) => fail(e),
        }
    }

    #[tool(
        description = "Copy a sandbox file or directory to the host (under the host roots). Only plain files and directories are written; symlinks from the sandbox are skipped and never followed. Places the host would run or trust (.git/, shell rc files, .sandbox-mcp.toml, editor and agent settings, ...) are refused, or skipped inside a directory. Files arrive without exec bits unless `executable` is true.",
        annotations(destructive_hint = true, idempotent_hint = true, open_world_hint = false)
    )]
    async fn download(&self, Parameters(p): Parameters<DownloadParams>) -> Result<CallToolResult, rmcp::ErrorData> {
        let m = &self.manager;
        let result = async {
            // Reading from a sandbox never creates one: there is nothing to read yet.
            let sandbox = m.get(&p.sandbox)?;
            m.download(&sandbox, &p.sandbox_path, &p.local_path, ExecBits::from_flag(p.executable)).await
        };
        match result.await {
            Ok(d) => {
                let skipped = if d.skipped > 0 {
                    format!(", {} symlinks/special files skipped", d.skipped)
                } else {
                    String::new()
                };
                let (slash, kind) = if d.directory { ("/", " tar") } else { ("", "") };
                let refused = if d.refused.is_empty() { String::new() } else { format!(". {}", d.refused) };
                ok(format!(
                    "Downloaded {}{slash} -> {} ({}{kind}, {}{skipped}){refused}",
                    p.sandbox_path.trim_end_matches('/'),
                    d.dest.display(),
                    human_size(d.bytes),
                    format::ms(d.elapsed)
                ))
            }
            Err(e) => fail(e),
        }
    }

    #[tool(
        description = "git clone a repository into the sandbox. A token is passed to git through this process's environment only: never written to a file, the remote URL or history.",
        annotations(destructive_hint = false, idempotent_hint = false, open_world_hint = true)
    )]
    async fn git_clone(
        &self,
        Parameters(p): Parameters<GitCloneParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, rmcp::ErrorData> {
        let m = &self.manager;
        let result = async {
            let sandbox = m.get_or_create(&p.sandbox).await?;
            let (dir, r) = m.git_clone(&sandbox, &p.repo, &p.branch, &p.token, &p.path, p.shallow).await?;
            let summary = if r.exit_code() == 0 { Some(m.clone_summary(&sandbox, &dir).await?) } else { None };
            Ok::<_, sandbox_orchestrator::OrchestratorError>((dir, r, summary))
        };
        let Some(result) = supervise(&ctx, "git clone", result).await else {
            return fail(CANCELLED);
        };
        match result {
            Ok((dir, r, Some(summary))) => {
                ok(format!("Cloned {} -> {dir}\n{summary}\n({})", p.repo, format::ms(r.duration)))
            }
            Ok((_, r, None)) => fail(format!(
                "cloning: {}{}\n({})",
                render(&r.stderr).trim_end(),
                local_path_hint(&p.repo),
                format::ms(r.duration)
            )),
            Err(e) => fail(e),
        }
    }
}

/// What a failed clone of what looks like a local path adds: the path was
/// read inside the sandbox, and how a host repository gets there.
fn local_path_hint(repo: &str) -> String {
    let local = ["/", "./", "../", "~", "file:"].iter().any(|p| repo.starts_with(p));
    if !local {
        return String::new();
    }
    let name = repo.trim_end_matches('/').rsplit('/').next().filter(|n| !n.is_empty()).unwrap_or("repo");
    format!(
        "\n'{repo}' was read inside the sandbox, not on the host. A host repository gets in, .git and all, with \
         upload(local_path='{repo}', sandbox_path='/workspace/{name}'), or sync_start to keep it in step."
    )
}
