//! Docker tools for vm sandboxes: docker_build, docker_run, docker_exec,
//! docker_logs, docker_compose, docker_ps, docker_images, docker_cleanup.
//! Each turns its parameters into a request of
//! [`sandbox_orchestrator::docker`], which validates them and builds the argv;
//! results read like exec's, after the docker command line that ran.
use std::collections::BTreeMap;

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
    SandboxServer, default_sandbox, fail, format,
    progress::{CANCELLED, supervise},
};
use sandbox_orchestrator::docker::{self, DockerCommand};

fn yes() -> bool {
    true
}
fn default_tail() -> i64 {
    500
}
fn default_exec_timeout() -> f64 {
    600.0
}
fn default_mode() -> String {
    "safe".to_string()
}

/// Parameters of `docker_build`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct BuildParams {
    /// Build context directory, relative to /workspace unless absolute.
    pub context_path: String,
    /// Tag of the image built (name[:tag], e.g. 'app:1.0').
    pub image_tag: String,
    /// Dockerfile path, relative to /workspace unless absolute (default: the context's Dockerfile).
    #[serde(default)]
    pub dockerfile: Option<String>,
    /// Build arguments (--build-arg KEY=VALUE); keys are variable names.
    #[serde(default)]
    pub build_args: Option<BTreeMap<String, String>>,
    /// Stage to build (--target).
    #[serde(default)]
    pub target: Option<String>,
    /// Build without the layer cache.
    #[serde(default)]
    pub no_cache: bool,
    /// Sandbox name (a vm sandbox).
    #[serde(default = "default_sandbox")]
    pub sandbox: String,
}

/// Parameters of `docker_run`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct RunParams {
    /// Image reference.
    pub image: String,
    /// Command and arguments, split into words as a shell would (quotes kept, no expansion); for shell syntax pass "sh -c '…'".
    #[serde(default)]
    pub command: Option<String>,
    /// Container name.
    #[serde(default)]
    pub name: Option<String>,
    /// Environment variables (-e KEY=VALUE).
    #[serde(default)]
    pub env: Option<BTreeMap<String, String>>,
    /// Volumes, SOURCE:DEST[:ro|rw]. SOURCE is a path in the sandbox (relative to /workspace unless absolute; the host is out of reach) or a volume name.
    #[serde(default)]
    pub volumes: Option<Vec<String>>,
    /// Published ports, [IP:][HOST_PORT:]CONTAINER_PORT[/tcp|udp], on the sandbox's own addresses.
    #[serde(default)]
    pub ports: Option<Vec<String>>,
    /// Working directory inside the container (absolute).
    #[serde(default)]
    pub workdir: Option<String>,
    /// Run in the background and print the container id (-d).
    #[serde(default = "yes")]
    pub detach: bool,
    /// Give the container every capability and device of the sandbox's VM (never of the host).
    #[serde(default)]
    pub privileged: bool,
    /// Sandbox name (a vm sandbox).
    #[serde(default = "default_sandbox")]
    pub sandbox: String,
}

/// Parameters of `docker_exec`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ExecParams {
    /// Container name or id.
    pub container: String,
    /// Shell command line, run as `sh -c` in the container.
    pub command: String,
    /// Seconds before the command is killed (max 3600).
    #[serde(default = "default_exec_timeout")]
    pub timeout_seconds: f64,
    /// Sandbox name (a vm sandbox).
    #[serde(default = "default_sandbox")]
    pub sandbox: String,
}

/// Parameters of `docker_logs`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct LogsParams {
    /// Container name or id.
    pub container: String,
    /// Last lines to show; 0 or less shows all.
    #[serde(default = "default_tail")]
    pub tail: i64,
    /// Keep reading new output for up to 30 s.
    #[serde(default)]
    pub follow: bool,
    /// Only output since this time (a duration like '10m' or a timestamp).
    #[serde(default)]
    pub since: Option<String>,
    /// Sandbox name (a vm sandbox).
    #[serde(default = "default_sandbox")]
    pub sandbox: String,
}

/// Parameters of `docker_compose`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ComposeParams {
    /// The compose project's directory, relative to /workspace unless absolute.
    pub project_dir: String,
    /// What to do.
    #[schemars(extend("enum" = ["up", "down", "ps", "logs", "pull", "build", "restart", "stop", "exec"]))]
    pub action: String,
    /// Compose file, relative to project_dir unless absolute (default: compose's own search).
    #[serde(default)]
    pub file: Option<String>,
    /// Services to act on; exec runs in the first.
    #[serde(default)]
    pub services: Option<Vec<String>>,
    /// up: start in the background (-d).
    #[serde(default = "yes")]
    pub detach: bool,
    /// exec: shell command line, run as `sh -lc` in the service's container.
    #[serde(default)]
    pub command: Option<String>,
    /// logs: keep reading new output for up to 30 s.
    #[serde(default)]
    pub follow: bool,
    /// logs: only output since this time.
    #[serde(default)]
    pub since: Option<String>,
    /// logs: last lines per service; 0 or less shows all.
    #[serde(default)]
    pub tail: Option<i64>,
    /// Sandbox name (a vm sandbox).
    #[serde(default = "default_sandbox")]
    pub sandbox: String,
}

/// Parameters of `docker_ps`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct PsParams {
    /// Include stopped containers.
    #[serde(default)]
    pub all: bool,
    /// Sandbox name (a vm sandbox).
    #[serde(default = "default_sandbox")]
    pub sandbox: String,
}

/// Parameters of `docker_images`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ImagesParams {
    /// Sandbox name (a vm sandbox).
    #[serde(default = "default_sandbox")]
    pub sandbox: String,
}

/// Parameters of `docker_cleanup`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct CleanupParams {
    /// `safe`: stopped containers and dangling images; `aggressive`: also every unused image, network and volume.
    #[serde(default = "default_mode")]
    #[schemars(extend("enum" = ["safe", "aggressive"]))]
    pub mode: String,
    /// Sandbox name (a vm sandbox).
    #[serde(default = "default_sandbox")]
    pub sandbox: String,
}

/// The structured result of a docker tool: exec's, with the command line.
#[derive(Debug, serde::Serialize, schemars::JsonSchema)]
pub struct DockerOutput {
    /// The docker command line that ran (each argument one argv element).
    pub command: String,
    /// Its output and status, as exec reports them.
    #[serde(flatten)]
    pub result: format::ExecOutput,
}

fn pairs(map: Option<BTreeMap<String, String>>) -> Vec<(String, String)> {
    map.unwrap_or_default().into_iter().collect()
}

impl SandboxServer {
    /// Runs the docker commands in turn (stopping at the first that fails)
    /// with progress and cancellation; each reads `$ <command line>` then
    /// exec's text. The structured result is the last command's.
    async fn run_docker(
        &self,
        ctx: &RequestContext<RoleServer>,
        label: &str,
        sandbox: &str,
        commands: Result<Vec<DockerCommand>, sandbox_orchestrator::OrchestratorError>,
    ) -> Result<CallToolResult, rmcp::ErrorData> {
        let commands = match commands {
            Ok(c) => c,
            Err(e) => return fail(e),
        };
        let mut texts = Vec::new();
        let mut last = None;
        for cmd in &commands {
            let Some(result) = supervise(ctx, label, self.manager.docker(sandbox, cmd)).await else {
                return fail(CANCELLED);
            };
            let r = match result {
                Ok(r) => r,
                Err(e) => return fail(e),
            };
            texts.push(format!("$ {}\n{}", cmd.display(), format::exec_result(&r, cmd.timeout.as_secs_f64())));
            let failed = r.exit_code() != 0;
            last = Some(DockerOutput { command: cmd.display(), result: format::ExecOutput::from(&r) });
            if failed {
                break;
            }
        }
        let mut out = CallToolResult::success(vec![ContentBlock::text(texts.join("\n"))]);
        out.structured_content = last.and_then(|l| serde_json::to_value(l).ok());
        Ok(out)
    }
}

#[tool_router(router = docker_router, vis = "pub(super)")]
impl SandboxServer {
    #[tool(
        description = "Build a Docker image in a vm sandbox (docker build -t image_tag …; 1800 s). Docker runs inside the sandbox's VM, never on the host; the sandbox's image must have Docker Engine. Output like exec's, after the command line.",
        annotations(destructive_hint = false, idempotent_hint = true, open_world_hint = true),
        output_schema = rmcp::handler::server::tool::schema_for_output::<DockerOutput>()
    )]
    async fn docker_build(
        &self,
        Parameters(p): Parameters<BuildParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, rmcp::ErrorData> {
        let request = docker::BuildRequest {
            context_path: p.context_path,
            image_tag: p.image_tag,
            dockerfile: p.dockerfile,
            build_args: pairs(p.build_args),
            target: p.target,
            no_cache: p.no_cache,
        };
        self.run_docker(&ctx, "docker_build", &p.sandbox, docker::build(&request).map(|c| vec![c])).await
    }

    #[tool(
        description = "Run a container in a vm sandbox (docker run; detached by default, printing its id; 1200 s). Volumes and ports are the sandbox VM's, and privileged means privileged inside the VM only.",
        annotations(destructive_hint = true, idempotent_hint = false, open_world_hint = true),
        output_schema = rmcp::handler::server::tool::schema_for_output::<DockerOutput>()
    )]
    async fn docker_run(
        &self,
        Parameters(p): Parameters<RunParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, rmcp::ErrorData> {
        let request = docker::RunRequest {
            image: p.image,
            command: p.command,
            name: p.name,
            env: pairs(p.env),
            volumes: p.volumes.unwrap_or_default(),
            ports: p.ports.unwrap_or_default(),
            workdir: p.workdir,
            detach: p.detach,
            privileged: p.privileged,
        };
        self.run_docker(&ctx, "docker_run", &p.sandbox, docker::run(&request).map(|c| vec![c])).await
    }

    #[tool(
        description = "Run a shell command in a running container of a vm sandbox (docker exec CONTAINER sh -c COMMAND).",
        annotations(destructive_hint = true, idempotent_hint = false, open_world_hint = true),
        output_schema = rmcp::handler::server::tool::schema_for_output::<DockerOutput>()
    )]
    async fn docker_exec(
        &self,
        Parameters(p): Parameters<ExecParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, rmcp::ErrorData> {
        let cmd = docker::exec(&p.container, &p.command, p.timeout_seconds).map(|c| vec![c]);
        self.run_docker(&ctx, "docker_exec", &p.sandbox, cmd).await
    }

    #[tool(
        description = "Show a container's output in a vm sandbox (docker logs --tail N; follow reads new output for up to 30 s).",
        annotations(read_only_hint = true, open_world_hint = false),
        output_schema = rmcp::handler::server::tool::schema_for_output::<DockerOutput>()
    )]
    async fn docker_logs(
        &self,
        Parameters(p): Parameters<LogsParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, rmcp::ErrorData> {
        let request = docker::LogsRequest { container: p.container, tail: p.tail, follow: p.follow, since: p.since };
        self.run_docker(&ctx, "docker_logs", &p.sandbox, docker::logs(&request).map(|c| vec![c])).await
    }

    #[tool(
        description = "Docker Compose in a vm sandbox, in project_dir: up (detached by default), down, ps, logs, pull, build, restart, stop, exec (services[0], command). 1200 s; logs with follow 30 s.",
        annotations(destructive_hint = true, idempotent_hint = false, open_world_hint = true),
        output_schema = rmcp::handler::server::tool::schema_for_output::<DockerOutput>()
    )]
    async fn docker_compose(
        &self,
        Parameters(p): Parameters<ComposeParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, rmcp::ErrorData> {
        let request = docker::ComposeRequest {
            project_dir: p.project_dir,
            action: p.action,
            file: p.file,
            services: p.services.unwrap_or_default(),
            detach: p.detach,
            command: p.command,
            follow: p.follow,
            since: p.since,
            tail: p.tail,
        };
        self.run_docker(&ctx, "docker_compose", &p.sandbox, docker::compose(&request).map(|c| vec![c])).await
    }

    #[tool(
        description = "List the containers of a vm sandbox (docker ps; all includes stopped ones).",
        annotations(read_only_hint = true, open_world_hint = false),
        output_schema = rmcp::handler::server::tool::schema_for_output::<DockerOutput>()
    )]
    async fn docker_ps(
        &self,
        Parameters(p): Parameters<PsParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, rmcp::ErrorData> {
        self.run_docker(&ctx, "docker_ps", &p.sandbox, Ok(vec![docker::ps(p.all)])).await
    }

    #[tool(
        description = "List the Docker images of a vm sandbox (docker images).",
        annotations(read_only_hint = true, open_world_hint = false),
        output_schema = rmcp::handler::server::tool::schema_for_output::<DockerOutput>()
    )]
    async fn docker_images(
        &self,
        Parameters(p): Parameters<ImagesParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, rmcp::ErrorData> {
        self.run_docker(&ctx, "docker_images", &p.sandbox, Ok(vec![docker::images()])).await
    }

    #[tool(
        description = "Free Docker space in a vm sandbox: mode 'safe' prunes stopped containers and dangling images; 'aggressive' also every unused image, network and volume.",
        annotations(destructive_hint = true, idempotent_hint = true, open_world_hint = false),
        output_schema = rmcp::handler::server::tool::schema_for_output::<DockerOutput>()
    )]
    async fn docker_cleanup(
        &self,
        Parameters(p): Parameters<CleanupParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, rmcp::ErrorData> {
        self.run_docker(&ctx, "docker_cleanup", &p.sandbox, docker::cleanup(&p.mode)).await
    }
}
