//! Tools that run things: exec, python, install, env.
use std::time::Duration;

use rmcp::{
    RoleServer,
    handler::server::wrapper::Parameters,
    model::{CallToolResult, ContentBlock},
    schemars,
    service::RequestContext,
    tool, tool_router,
};
use serde::Deserialize;

use super::{
    SandboxServer, default_sandbox, fail, format, ok,
    progress::{CANCELLED, supervise},
    reply,
};
use sandbox_orchestrator::{Command, OrchestratorError, packages::parse_packages, text::render};

/// Longest timeout a call may ask for.
const MAX_TIMEOUT_SECS: f64 = 3600.0;

fn default_timeout() -> f64 {
    30.0
}
fn default_workdir() -> String {
    "/workspace".to_string()
}
fn default_action() -> String {
    "list".to_string()
}

fn timeout(secs: f64) -> Result<Duration, OrchestratorError> {
    if secs.is_finite() && secs > 0.0 && secs <= MAX_TIMEOUT_SECS {
        Ok(Duration::from_secs_f64(secs))
    } else {
        Err(OrchestratorError::InvalidArgument(format!(
            "timeout must be greater than 0 and at most {MAX_TIMEOUT_SECS} seconds (got {secs})"
        )))
    }
}

/// Parameters of `exec`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ExecParams {
    /// Shell command line, run as `<shell> -c` in a fresh process.
    pub command: String,
    /// Seconds before the whole process group is killed (max 3600).
    #[serde(default = "default_timeout")]
    pub timeout: f64,
    /// Working directory (created if missing).
    #[serde(default = "default_workdir")]
    pub workdir: String,
    /// Text fed to the command's stdin (EOF follows; empty means EOF at once).
    #[serde(default)]
    pub stdin: String,
    /// Sandbox name.
    #[serde(default = "default_sandbox")]
    pub sandbox: String,
}

/// Parameters of `python`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct PythonParams {
    /// Python 3 source to run.
    pub code: String,
    /// Seconds before it is killed (max 3600).
    #[serde(default = "default_timeout")]
    pub timeout: f64,
    /// Sandbox name.
    #[serde(default = "default_sandbox")]
    pub sandbox: String,
}

/// Parameters of `install`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct InstallParams {
    /// Package names separated by spaces or commas.
    pub packages: String,
    /// Sandbox name.
    #[serde(default = "default_sandbox")]
    pub sandbox: String,
}

/// Parameters of `env`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct EnvParams {
    /// `set`, `unset` or `list`.
    #[serde(default = "default_action")]
    #[schemars(extend("enum" = ["set", "unset", "list"]))]
    pub action: String,
    /// Variable name ([A-Za-z_][A-Za-z0-9_]*).
    #[serde(default)]
    pub key: String,
    /// Value for `set`.
    #[serde(default)]
    pub value: String,
    /// Sandbox name.
    #[serde(default = "default_sandbox")]
    pub sandbox: String,
}

impl SandboxServer {
    /// Run a command for exec/python: progress and cancellation, the
    /// reference's text, and the structured result beside it.
    async fn run_command(
        &self,
        ctx: &RequestContext<RoleServer>,
        label: &str,
        sandbox: &str,
        cmd: Command,
        timeout_secs: f64,
    ) -> Result<CallToolResult, rmcp::ErrorData> {
        let Some(result) = supervise(ctx, label, self.manager.run(sandbox, cmd)).await else {
            return fail(CANCELLED);
        };
        match result {
            Ok((_, r)) => {
                let mut out = CallToolResult::success(vec![ContentBlock::text(format::exec_result(&r, timeout_secs))]);
                out.structured_content = serde_json::to_value(format::ExecOutput::from(&r)).ok();
                Ok(out)
            }
            Err(e) => fail(e),
        }
    }
}

#[tool_router(router = core_router, vis = "pub(super)")]
impl SandboxServer {
    #[tool(
        description = "Run a shell command in a sandbox (created on first use). Each call is a fresh process: `#` comments, heredocs, `exit`, commands reading stdin and binary output behave as in a normal shell. Output: stdout, `[stderr] ...`, `[exit code N]` when non-zero, `(duration)`; structured: stdout, stderr, exit_code, duration_ms, truncated, timed_out. Reports progress every second and stops the command if the call is cancelled.",
        annotations(destructive_hint = true, idempotent_hint = false, open_world_hint = true),
        output_schema = rmcp::handler::server::tool::schema_for_output::<format::ExecOutput>()
    )]
    async fn exec(
        &self,
        Parameters(p): Parameters<ExecParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, rmcp::ErrorData> {
        let limit = match timeout(p.timeout) {
            Ok(t) => t,
            Err(e) => return fail(e),
        };
        let mut cmd = Command::shell(&p.command, limit);
        cmd.cwd = p.workdir;
        cmd.stdin = p.stdin.into_bytes();
        self.run_command(&ctx, "exec", &p.sandbox, cmd, p.timeout).await
    }

    #[tool(
        description = "Run Python 3 code in a sandbox (in /workspace, code passed on stdin, no temp file). Same output (text and structured) as exec.",
        annotations(destructive_hint = true, idempotent_hint = false, open_world_hint = true),
        output_schema = rmcp::handler::server::tool::schema_for_output::<format::ExecOutput>()
    )]
    async fn python(
        &self,
        Parameters(p): Parameters<PythonParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, rmcp::ErrorData> {
        let limit = match timeout(p.timeout) {
            Ok(t) => t,
            Err(e) => return fail(e),
        };
        let mut cmd = Command::argv(["python3", "-"], limit);
        cmd.stdin = p.code.as_bytes().to_vec();
        cmd.audit_as = Some(format!("python: {}", p.code));
        self.run_command(&ctx, "python", &p.sandbox, cmd, p.timeout).await
    }

    #[tool(
        description = "Install packages with the image's package manager (apt-get on Debian images). Names are validated and passed as arguments, never through a shell.",
        annotations(destructive_hint = false, idempotent_hint = true, open_world_hint = true)
    )]
    async fn install(
        &self,
        Parameters(p): Parameters<InstallParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, rmcp::ErrorData> {
        let packages = match parse_packages(&p.packages) {
            Ok(list) => list,
            Err(e) => return fail(e),
        };
        let sandbox = match self.manager.get_or_create(&p.sandbox).await {
            Ok(s) => s,
            Err(e) => return fail(e),
        };
        let Some(result) = supervise(&ctx, "install", self.manager.install(&sandbox, &packages)).await else {
            return fail(CANCELLED);
        };
        match result {
            Ok(r) if r.exit_code() == 0 => {
                ok(format!("{}\n({})", format::install_summary(&render(&r.stdout), &packages), format::ms(r.duration)))
            }
            Ok(r) => fail(format!(
                "{}\n[exit code {}]\n({})",
                render(&r.stderr).trim_end(),
                r.exit_code(),
                format::ms(r.duration)
            )),
            Err(e) => fail(e),
        }
    }

    #[tool(
        description = "Persistent environment variables for every later command in a sandbox: action 'set' (key, value), 'unset' (key) or 'list'.",
        annotations(destructive_hint = false, idempotent_hint = true, open_world_hint = false)
    )]
    async fn env(&self, Parameters(p): Parameters<EnvParams>) -> Result<CallToolResult, rmcp::ErrorData> {
        let m = &self.manager;
        let result = async {
            if matches!(p.action.as_str(), "set" | "unset") && p.key.is_empty() {
                return Err(OrchestratorError::InvalidArgument(format!("key is required for {}", p.action)));
            }
            // Listing never creates a sandbox; setting creates it on first use.
            let sandbox = match p.action.as_str() {
                "set" | "unset" => m.get_or_create(&p.sandbox).await?,
                _ => m.get(&p.sandbox)?,
            };
            match p.action.as_str() {
                "set" => m
                    .set_env(&sandbox, &p.key, &p.value)
                    .await
                    .map(|_| format!("Set {} in '{}' (persists across commands)", p.key, sandbox.shown())),
                "unset" => {
                    m.unset_env(&sandbox, &p.key).await.map(|_| format!("Unset {} in '{}'", p.key, sandbox.shown()))
                }
                _ => Ok(format::env_list(&sandbox.shown(), &sandbox.env())),
            }
        };
        reply(result.await)
    }
}
