//! Networking tools: expose, unexpose, network_info. Forwards live in the
//! orchestrator's [`ForwardManager`](crate::orchestrator::forward::ForwardManager);
//! this file only maps parameters in and results to the reference's text.
use rmcp::{handler::server::wrapper::Parameters, model::CallToolResult, schemars, tool, tool_router};
use serde::Deserialize;

use super::{SandboxServer, default_sandbox, fail, ok};
use crate::orchestrator::{
    Sandbox,
    forward::{Exposed, ForwardInfo},
    helper_client::Network,
};

/// Parameters of `expose`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ExposeParams {
    /// TCP port inside the sandbox (1-65535).
    pub port: i64,
    /// Port on the host's 127.0.0.1; 0 means the same as `port`.
    #[serde(default)]
    pub host_port: i64,
    /// Sandbox name.
    #[serde(default = "default_sandbox")]
    pub sandbox: String,
}

/// Parameters of `unexpose`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct UnexposeParams {
    /// Host port of the forward to stop.
    pub port: i64,
}

/// What the agent reads after a successful `expose`.
fn exposed_text(e: &Exposed) -> String {
    let f = &e.forward;
    let mut lines = vec![
        format!("Forwarding localhost:{} -> '{}':{}", f.host_port, f.sandbox, f.port),
        format!("  URL:  http://localhost:{}", f.host_port),
        format!("  curl: curl http://localhost:{}", f.host_port),
    ];
    if !e.listening {
        lines.push(format!("  Warning: port {} is not yet listening in the sandbox", f.port));
    }
    lines.join("\n")
}

fn unexposed_text(f: &ForwardInfo) -> String {
    format!(
        "Stopped forwarding localhost:{} -> '{}':{} ({} connections served)",
        f.host_port, f.sandbox, f.port, f.connections
    )
}

/// Sandboxes have no routable address, so each line shows the network mode
/// where the reference showed an IP; and since sandboxes are isolated from
/// each other by construction, that fact replaces the reference's pings.
fn network_text(rows: &[(&Sandbox, bool, Network)], forwards: &[ForwardInfo]) -> String {
    if rows.is_empty() {
        return "No active sandboxes.".to_string();
    }
    let mut lines = Vec::new();
    for (s, alive, net) in rows {
        let net = match net {
            Network::Egress => "egress",
            Network::None => "none",
        };
        lines.push(format!("{:<12}  {}  net:{net}  shell:{}", s.name, s.name, if *alive { "alive" } else { "dead" }));
        for f in forwards.iter().filter(|f| f.sandbox == s.name) {
            lines.push(format!("  forward localhost:{} -> :{} ({} connections)", f.host_port, f.port, f.connections));
        }
    }
    lines.push(
        "Sandboxes are isolated from each other and from the host's loopback services (separate network \
         namespaces; egress goes through the helper's policy-checked network stack, which never reaches the host). Use expose() to reach a \
         sandbox port from the host."
            .to_string(),
    );
    lines.join("\n")
}

#[tool_router(router = network_router, vis = "pub(super)")]
impl SandboxServer {
    #[tool(
        description = "Forward a port on the host's localhost (127.0.0.1 only) to a TCP port inside a sandbox, e.g. to open a dev server. host_port 0 uses the same number. The forward follows the sandbox across reset.",
        annotations(destructive_hint = false, idempotent_hint = false, open_world_hint = false)
    )]
    async fn expose(&self, Parameters(p): Parameters<ExposeParams>) -> Result<CallToolResult, rmcp::ErrorData> {
        if self.manager.get(&p.sandbox).is_ok_and(|s| !self.spawns.may_forward(&s)) {
            return fail("port forwarding not permitted on child sandboxes");
        }
        match self.forwards.expose(&p.sandbox, p.port, p.host_port).await {
            Ok(e) => ok(exposed_text(&e)),
            Err(e) => fail(e),
        }
    }

    #[tool(
        description = "Stop the port forward on a host port. Connections already open finish on their own.",
        annotations(destructive_hint = true, idempotent_hint = false, open_world_hint = false)
    )]
    async fn unexpose(&self, Parameters(p): Parameters<UnexposeParams>) -> Result<CallToolResult, rmcp::ErrorData> {
        match self.forwards.unexpose(p.port).await {
            Ok(f) => ok(unexposed_text(&f)),
            Err(e) => fail(e),
        }
    }

    #[tool(
        description = "Each sandbox's network mode (egress or none) and its port forwards.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn network_info(&self) -> Result<CallToolResult, rmcp::ErrorData> {
        let m = &self.manager;
        let sandboxes = m.list();
        let running = if sandboxes.is_empty() {
            Default::default()
        } else {
            match m.running().await {
                Ok(r) => r,
                Err(e) => return fail(e),
            }
        };
        let rows: Vec<(&Sandbox, bool, Network)> = sandboxes
            .iter()
            .map(|s| {
                let alive = running.get(&s.name).copied().unwrap_or(false);
                (s.as_ref(), alive, m.config().profile_for(&s.name).network)
            })
            .collect();
        ok(network_text(&rows, &self.forwards.list()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fwd(connections: u64) -> ForwardInfo {
        ForwardInfo { host_port: 8080, sandbox: "web".into(), port: 8000, connections }
    }

    #[test]
    fn texts_keep_the_reference_shapes() {
        let e = Exposed { forward: fwd(0), listening: false };
        assert_eq!(
            exposed_text(&e),
            "Forwarding localhost:8080 -> 'web':8000\n  URL:  http://localhost:8080\n  curl: curl http://localhost:8080\n  Warning: port 8000 is not yet listening in the sandbox"
        );
        assert!(!exposed_text(&Exposed { forward: fwd(0), listening: true }).contains("Warning"));
        assert_eq!(unexposed_text(&fwd(3)), "Stopped forwarding localhost:8080 -> 'web':8000 (3 connections served)");
        assert_eq!(network_text(&[], &[]), "No active sandboxes.");
    }
}
