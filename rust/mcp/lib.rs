//! The MCP tool surface: a thin layer that turns tool calls into orchestrator
//! calls and orchestrator results into the reference's text shapes. No policy
//! or state lives here. Tools are grouped by topic, one router per file:
//! [`core`] (exec, python, install, env), [`files`], [`lifecycle`].
pub mod args;
pub mod children;
pub mod core;
pub mod docker;
pub mod files;
pub mod format;
pub mod http;
pub mod http_compat;
pub mod http_token;
pub mod images;
pub mod lease;
pub mod lifecycle;
pub mod network;
pub mod observe;
pub mod process;
pub mod progress;
pub mod registration;
pub mod schema;
pub mod stdio;
pub mod sync;
pub mod transfer;

use std::sync::Arc;

use rmcp::{
    ServerHandler, ServiceExt,
    handler::server::router::tool::ToolRouter,
    model::{CallToolResult, ContentBlock, Implementation, ServerCapabilities, ServerConfig},
    tool_handler,
};

use sandbox_orchestrator::{
    Config, Orchestrator, OrchestratorError, SandboxManager, config, forward::ForwardManager, spawn::SpawnManager,
    sync::SyncManager,
};

/// What the server tells the agent about the sandbox model on connect.
const INSTRUCTIONS: &str = "\
Isolated Linux sandboxes (Debian, root inside, no privilege on the host) for running code. \
Every tool takes `sandbox` (default 'default'); a sandbox is created on first use in a few tens of ms. \
Each exec runs one fresh process (`<shell> -c`), so `cd` and `export` do not carry over: pass `workdir`, \
and use env(action='set') for variables every later command should see. /workspace is a per-sandbox \
volume that survives reset and destroy; everything else is reset by reset(). Install packages with \
install(). Output is capped at 50,000 bytes per stream; timeouts kill the whole process group.";

/// The MCP server: the tool routers over the orchestrator's shared services.
#[derive(Clone)]
pub struct SandboxServer {
    manager: Arc<SandboxManager>,
    forwards: Arc<ForwardManager>,
    syncs: Arc<SyncManager>,
    spawns: Arc<SpawnManager>,
    /// The session's configuration (its client's environment and start
    /// directory), which every tool call runs under.
    session: Arc<Config>,
    /// The daemon's gauge of calls in progress (see [`Orchestrator::calls`]).
    calls: Arc<tokio::sync::RwLock<()>>,
    tool_router: ToolRouter<Self>,
}

impl SandboxServer {
    /// A server over `orchestrator` (shared by every MCP session) for a
    /// session configured by `session`.
    pub fn new(orchestrator: &Orchestrator, session: Arc<Config>) -> Self {
        let mut tool_router = Self::core_router()
            + Self::files_router()
            + Self::lifecycle_router()
            + Self::process_router()
            + Self::transfer_router()
            + Self::observe_router()
            + Self::network_router()
            + Self::sync_router()
            + Self::lease_router()
            + Self::images_router()
            + Self::children_router()
            + Self::docker_router();
        for route in tool_router.map.values_mut() {
            schema::standardize(Arc::make_mut(&mut route.attr.input_schema));
            if let Some(output) = &mut route.attr.output_schema {
                schema::standardize(Arc::make_mut(output));
            }
        }
        Self {
            manager: orchestrator.sandboxes.clone(),
            forwards: orchestrator.forwards.clone(),
            syncs: orchestrator.syncs.clone(),
            spawns: orchestrator.spawns.clone(),
            session,
            calls: orchestrator.calls.clone(),
            tool_router,
        }
    }

    /// Serve one MCP session of newline-delimited JSON-RPC over a byte stream
    /// (a front-end's connection) until the client disconnects.
    pub async fn serve_stream<R, W>(self, read: R, write: W) -> Result<(), std::io::Error>
    where
        R: tokio::io::AsyncRead + Send + Unpin + 'static,
        W: tokio::io::AsyncWrite + Send + Unpin + 'static,
    {
        let transport = stdio::LineTransport::new(read, write);
        let service = self.serve(transport).await.map_err(std::io::Error::other)?;
        service.waiting().await.map_err(std::io::Error::other)?;
        Ok(())
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for SandboxServer {
    /// Every tool call, with its text made safe for a terminal once, here.
    async fn call_tool(
        &self,
        mut request: rmcp::model::CallToolRequestParams,
        context: rmcp::service::RequestContext<rmcp::RoleServer>,
    ) -> Result<rmcp::model::CallToolResponse, rmcp::ErrorData> {
        let _in_progress = self.calls.read().await;
        let mut notices = Vec::new();
        // Arguments first fit the tool's schema, so a mistake reads `Error: argument …`.
        if let Some(tool) = self.tool_router.get(&request.name) {
            let mut arguments = request.arguments.take().unwrap_or_default();
            if let Err(e) = args::conform(&tool.input_schema, &mut arguments) {
                return fail(e).map(Into::into);
            }
            let named = match self.resolve_names(&request.name, &tool.input_schema, &mut arguments) {
                Ok(named) => named,
                Err(e) => return fail(e).map(Into::into),
            };
            match config::with_session(self.session.clone(), self.revive_named(&request.name, &named)).await {
                Ok(found) => notices = found,
                Err(e) => {
                    // The reason can quote a VM's console: shown like any
                    // other sandbox-made text.
                    let mut result = CallToolResult::error(vec![ContentBlock::text(format!("Error: {e}"))]);
                    format::make_controls_visible(&mut result);
                    return Ok(result.into());
                }
            }
            request.arguments = Some(arguments);
        }
        let tcc = rmcp::handler::server::tool::ToolCallContext::new(self, request, context);
        let mut response = config::with_session(self.session.clone(), self.tool_router.call(tcc)).await?;
        if let rmcp::model::CallToolResponse::Complete(result) = &mut response {
            args::prefix_decode_error(result);
            format::add_notices(result, &notices);
            format::make_controls_visible(result);
        }
        Ok(response)
    }

    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("sandbox-mcp", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }
}

/// Arguments that name a sandbox (`name` only in `destroy_child`).
const SANDBOX_ARGUMENTS: [&str; 4] = ["sandbox", "parent", "source", "target"];

impl SandboxServer {
    /// Turn the sandbox names in a call's arguments into the orchestrator's
    /// keys, in this session's project (see [`SandboxManager::resolve`]),
    /// once here for every tool: no tool can reach another project's
    /// sandbox by a plain name. An absent `sandbox` is `default`. Returns
    /// the keys, by argument.
    fn resolve_names(
        &self,
        tool: &str,
        schema: &rmcp::model::JsonObject,
        args: &mut rmcp::model::JsonObject,
    ) -> Result<Vec<(&'static str, String)>, OrchestratorError> {
        let mut named = Vec::new();
        let Some(properties) = schema.get("properties").and_then(serde_json::Value::as_object) else {
            return Ok(named);
        };
        let arguments = SANDBOX_ARGUMENTS.into_iter().chain((tool == "destroy_child").then_some("name"));
        for arg in arguments.filter(|a| properties.contains_key(*a)) {
            let default = properties[arg].get("default").and_then(serde_json::Value::as_str);
            let given = match (args.get(arg), default) {
                (Some(serde_json::Value::String(s)), _) => s.clone(),
                (None, Some(default)) => default.to_string(),
                (None, None) if arg == "sandbox" => default_sandbox(),
                // Other types were refused by `args::conform`.
                _ => continue,
            };
            let key = self.manager.resolve(&self.session.project, arg, &given)?;
            args.insert(arg.to_string(), serde_json::Value::String(key.clone()));
            named.push((arg, key));
        }
        Ok(named)
    }
}

/// Tools that act on a lost sandbox as lost: they list or forget it. Every
/// other tool naming one brings it back first (`reset` and `restore` too,
/// so its forwards and sync jobs follow the new sandbox as they would a
/// live one's).
const KEEP_LOST: [&str; 5] = ["destroy", "status", "health", "list_all", "destroy_child"];
/// Tools that replace the sandbox anyway: when it cannot come back as it
/// was, they go on and make a fresh one.
const REPLACE_LOST: [&str; 2] = ["reset", "restore"];

impl SandboxServer {
    /// Bring back the lost sandboxes a call names, by the keys
    /// [`Self::resolve_names`] resolved (see [`SandboxManager::revive`]);
    /// what each lost, one line each. `target` names a sandbox to be made
    /// (clone) or no sandbox at all (a Dockerfile stage): never brought back.
    async fn revive_named(&self, tool: &str, named: &[(&str, String)]) -> Result<Vec<String>, OrchestratorError> {
        let mut notices = Vec::new();
        if KEEP_LOST.contains(&tool) {
            return Ok(notices);
        }
        for (_, key) in named.iter().filter(|(arg, _)| *arg != "target") {
            match self.manager.revive(key).await {
                Ok(comeback) => notices.extend(comeback.map(|c| c.notice())),
                Err(e) if REPLACE_LOST.contains(&tool) => tracing::info!(sandbox = %key, "{e}; replacing it afresh"),
                Err(e) => return Err(e),
            }
        }
        Ok(notices)
    }
}

/// A successful tool result.
fn ok(text: impl Into<String>) -> Result<CallToolResult, rmcp::ErrorData> {
    Ok(CallToolResult::success(vec![ContentBlock::text(text.into())]))
}

/// A successful tool result with `structuredContent` beside the text (the
/// tool declares the matching `outputSchema`).
fn ok_structured(text: String, value: impl serde::Serialize) -> Result<CallToolResult, rmcp::ErrorData> {
    let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
    result.structured_content = serde_json::to_value(value).ok();
    Ok(result)
}

/// A failed tool result: `Error: …` text (what the reference's clients match
/// on) with `isError` set. The single place orchestrator errors meet MCP.
fn fail(text: impl std::fmt::Display) -> Result<CallToolResult, rmcp::ErrorData> {
    Ok(CallToolResult::error(vec![ContentBlock::text(format!("Error: {text}"))]))
}

/// `ok` for a successful text, `fail` for an orchestrator error.
fn reply(r: Result<String, OrchestratorError>) -> Result<CallToolResult, rmcp::ErrorData> {
    match r {
        Ok(text) => ok(text),
        Err(e) => fail(e),
    }
}

fn default_sandbox() -> String {
    "default".to_string()
}
