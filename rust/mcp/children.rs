//! Child sandbox tools: spawn, children, destroy_child. Policies and budgets
//! live in the orchestrator's [`SpawnManager`](sandbox_orchestrator::spawn::SpawnManager);
//! this file maps parameters in and results to the reference's text.
use rmcp::{handler::server::wrapper::Parameters, model::CallToolResult, schemars, tool, tool_router};
use sandbox_orchestrator::names;
use serde::Deserialize;

use super::{SandboxServer, default_sandbox, fail, ok, reply};
use sandbox_orchestrator::{OrchestratorError, Sandbox, spawn::SpawnRequest};

/// Parameters of `spawn`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct SpawnParams {
    /// Image for the child; empty: the parent policy's first allowed image.
    #[serde(default)]
    pub image: String,
    /// Parent sandbox (must exist and have a spawn policy).
    #[serde(default = "default_sandbox")]
    pub parent: String,
    /// The child's own name; empty: `child-<NNNN>`. Its full name, the one other tools take as `sandbox`, is
    /// `<parent>..<name>`: children live in their parent's namespace.
    #[serde(default)]
    pub name: String,
    /// CPUs; 0: the policy's per-child maximum (larger values are clamped to it).
    #[serde(default)]
    pub cpus: i64,
    /// Memory like `256M` or `1G`; empty: the policy's per-child maximum.
    #[serde(default)]
    pub memory: String,
    /// `namespaces` (shares the host's kernel, fast) or `vm` (a microVM with its own kernel); empty: the
    /// parent's. The parent's spawn policy may restrict it (`allowed_isolation`).
    #[serde(default)]
    pub isolation: String,
}

/// Parameters of `children`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ChildrenParams {
    /// Parent sandbox.
    #[serde(default = "default_sandbox")]
    pub parent: String,
}

/// Parameters of `destroy_child`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct DestroyChildParams {
    /// Child sandbox to destroy (with its own children).
    pub name: String,
}

fn spawned_text(parent: &str, c: &Sandbox) -> String {
    let mut lines = vec![
        format!("Spawned child '{}': {}", c.shown(), c.shown()),
        format!("  Parent: {}", names::display(parent)),
        format!("  Image: {}", c.image),
        format!("  Resources: {} CPUs, {}MB", c.cpus, c.memory_bytes >> 20),
        format!("  Isolation: {}", c.isolation),
    ];
    if let Some(left) = c.lease_remaining() {
        lines.push(format!("  TTL: {}s remaining", left.as_secs()));
    }
    lines.join("\n")
}

fn child_line(c: &Sandbox) -> String {
    let ttl = c.lease_remaining().map(|l| format!(" [TTL={}s]", l.as_secs())).unwrap_or_default();
    format!(
        "  {}: {} ({} CPUs, {}MB, image={}){ttl} idle={}s",
        c.shown(),
        c.shown(),
        c.cpus,
        c.memory_bytes >> 20,
        c.image,
        c.idle().as_secs()
    )
}

#[tool_router(router = children_router, vis = "pub(super)")]
impl SandboxServer {
    #[tool(
        description = "Spawn a child sandbox of an existing parent, within the parent's spawn policy (allowed images, \
                       per-child and total CPU/memory budgets, concurrent and lifetime limits, TTL). Children run \
                       without package caches and are destroyed with their parent.",
        annotations(destructive_hint = false, idempotent_hint = false, open_world_hint = false)
    )]
    async fn spawn(&self, Parameters(p): Parameters<SpawnParams>) -> Result<CallToolResult, rmcp::ErrorData> {
        let req = SpawnRequest { image: p.image, name: p.name, cpus: p.cpus, memory: p.memory, isolation: p.isolation };
        match self.spawns.spawn(&p.parent, &req).await {
            Ok(child) => ok(spawned_text(&p.parent, &child)),
            Err(e) => fail(format!("{}: {e}", e.class())),
        }
    }

    #[tool(
        description = "List a parent's live child sandboxes with their resources, TTL and the lifetime spawn count.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn children(&self, Parameters(p): Parameters<ChildrenParams>) -> Result<CallToolResult, rmcp::ErrorData> {
        let children = self.manager.children(&p.parent);
        let policy = self.spawns.effective_policy(&p.parent);
        let used = self.spawns.spawns_used(&p.parent);
        if children.is_empty() {
            return ok(match policy {
                Some(pol) => {
                    format!(
                        "No active children for '{}' ({used}/{} lifetime spawns used)",
                        names::display(&p.parent),
                        pol.max_total
                    )
                }
                None => {
                    format!("No active children for '{}' (no spawn policy configured)", names::display(&p.parent))
                }
            });
        }
        let mut lines = vec![format!("Children of '{}' ({} active):", names::display(&p.parent), children.len())];
        lines.extend(children.iter().map(|c| child_line(c)));
        let max = policy.map(|pol| pol.max_total.to_string()).unwrap_or_else(|| "?".into());
        lines.push(format!("Lifetime spawns: {used}/{max}"));
        ok(lines.join("\n"))
    }

    #[tool(
        description = "Destroy a child sandbox (and its own children). Use destroy for top-level sandboxes.",
        annotations(destructive_hint = true, idempotent_hint = false, open_world_hint = false)
    )]
    async fn destroy_child(
        &self,
        Parameters(p): Parameters<DestroyChildParams>,
    ) -> Result<CallToolResult, rmcp::ErrorData> {
        let destroyed = self.spawns.destroy_child(&p.name).await;
        // A child lost with its VM (its helper died, its init was killed) is
        // acknowledged here as `destroy` does for a top-level one.
        if matches!(destroyed, Err(OrchestratorError::Lost { .. })) {
            match self.manager.acknowledge_lost(&p.name).await {
                Ok(true) => {
                    return ok(format!("Forgot child sandbox '{}': its VM was already gone.", names::display(&p.name)));
                }
                Ok(false) => {}
                Err(e) => return fail(e),
            }
        }
        reply(destroyed.map(|s| format!("Destroyed sandbox '{}' ({})", s.shown(), s.vm_id())))
    }
}
