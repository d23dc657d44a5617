//! Snapshot and image tools: snapshot, restore, list_snapshots,
//! delete_snapshot, images, build_image, pull_image, clone. `build_image`
//! reports each step as a progress notification and stops (removing its
//! build VMs and intermediate images) when the client cancels; `pull_image`
//! reports each layer's bytes and stops the helper's pull.
use sandbox_orchestrator::names;
use std::{
    collections::BTreeMap,
    time::{Duration, SystemTime},
};

use rmcp::{
    RoleServer,
    handler::server::wrapper::Parameters,
    model::{CallToolResult, ContentBlock},
    schemars,
    service::RequestContext,
    tool, tool_router,
};
use serde::Deserialize;
use tokio::sync::mpsc;

use super::{
    SandboxServer, default_sandbox, fail, ok,
    progress::{Progress, supervise_with},
};
use sandbox_orchestrator::{
    build::BuildSpec,
    helper_client::{ImageSummary, PullEvent},
    images::{ImagesError, KIND_LABEL, SOURCE_LABEL},
    text::{human_size, is_invisible},
};

/// Parameters of `snapshot` and `restore`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct SnapshotParams {
    /// Snapshot name: lowercase letters, digits, '.', '_', '-' (at most 54).
    pub snapshot_name: String,
    /// Sandbox name.
    #[serde(default = "default_sandbox")]
    pub sandbox: String,
}

/// Parameters of `delete_snapshot`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct DeleteSnapshotParams {
    /// Snapshot to delete.
    pub snapshot_name: String,
}

/// Parameters of `pull_image`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct PullImageParams {
    /// The image: `python:3.12` (Docker Hub), `ghcr.io/org/app:1.0`, `registry.example:5000/app@sha256:<64 hex>`.
    pub reference: String,
    /// Name of the new local image (lowercase: ^[a-z0-9][a-z0-9._-]{0,62}$). Default: from the reference, `python:3.12` → `python-3.12`.
    #[serde(default)]
    pub name: String,
    /// Replace an existing image of that name once the pull succeeded.
    #[serde(default)]
    pub force: bool,
}

/// Parameters of `build_image`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct BuildImageParams {
    /// Name of the new image (lowercase: ^[a-z0-9][a-z0-9._-]{0,62}$).
    pub name: String,
    /// Containerfile text. Supported: FROM <local image or registry reference with a tag, digest or registry>, RUN, COPY/ADD (from heredocs or `context`), ENV, ARG, WORKDIR, USER, LABEL.
    pub containerfile: String,
    /// Files COPY/ADD can read: relative path → content.
    #[serde(default)]
    pub context: BTreeMap<String, String>,
    /// Replace an existing image of that name once the build succeeded.
    #[serde(default)]
    pub force: bool,
}

/// Parameters of `clone`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct CloneParams {
    /// Sandbox to copy (root filesystem changes and /workspace).
    pub source: String,
    /// Name of the new sandbox.
    pub target: String,
}

/// A failure whose text carries its own prefix (`Error building image: …`).
fn fail_as(prefix: &str, e: impl std::fmt::Display) -> Result<CallToolResult, rmcp::ErrorData> {
    Ok(CallToolResult::error(vec![ContentBlock::text(format!("{prefix}: {e}"))]))
}

fn age(ms: i64) -> String {
    let at = SystemTime::UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64);
    let secs = SystemTime::now().duration_since(at).unwrap_or_default().as_secs();
    match secs {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m", s / 60),
        s if s < 86_400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

fn kind(i: &ImageSummary) -> String {
    if i.parent.is_empty() && !i.reference.is_empty() && !i.labels.contains_key(KIND_LABEL) {
        return format!("pulled {}", i.reference);
    }
    if i.parent.is_empty() && !i.source.is_empty() {
        return format!("from {}", i.source);
    }
    let kind = i.labels.get(KIND_LABEL).map(String::as_str).unwrap_or(if i.parent.is_empty() { "base" } else { "" });
    match (kind, i.parent.as_str()) {
        (k, "") => k.to_string(),
        ("", p) => format!("<- {p}"),
        (k, p) => format!("{k} <- {p}"),
    }
}

/// Turns a pull's layer events into MCP progress reports: bytes of all
/// layers (strictly increasing, as MCP requires), at most every
/// [`REPORT_EVERY`] unless a layer finished, then one per unpacking line.
struct PullReport {
    tx: mpsc::UnboundedSender<(f64, Option<f64>, String)>,
    /// Per layer: (bytes done, size, finished).
    layers: Vec<(u64, u64, bool)>,
    /// The last value sent.
    sent: f64,
    last: Option<std::time::Instant>,
    /// (fetched, already present) layers, for the result.
    fetched: std::sync::Arc<std::sync::Mutex<(usize, usize)>>,
}

/// How often byte counts are reported while a layer downloads.
const REPORT_EVERY: Duration = Duration::from_millis(250);

impl PullReport {
    fn new(tx: mpsc::UnboundedSender<(f64, Option<f64>, String)>) -> Self {
        Self { tx, layers: Vec::new(), sent: 0.0, last: None, fetched: Default::default() }
    }

    fn on_event(&mut self, event: PullEvent) {
        match event {
            PullEvent::Blob { layer, layers, digest, done, total, present } => {
                if self.layers.len() < layers {
                    self.layers.resize(layers, (0, 0, false));
                }
                let Some(slot) = self.layers.get_mut(layer) else { return };
                let finished = present || (total > 0 && done >= total);
                let newly_finished = finished && !slot.2;
                *slot = (if present { total } else { done }, total, finished);
                if newly_finished {
                    let mut counts = self.fetched.lock().unwrap_or_else(|e| e.into_inner());
                    if present { counts.1 += 1 } else { counts.0 += 1 }
                }
                let due = self.last.is_none_or(|t| t.elapsed() >= REPORT_EVERY);
                if !(newly_finished || due) {
                    return;
                }
                let short = digest.get(..19).unwrap_or(&digest);
                let state = if present {
                    "already present".to_string()
                } else {
                    format!("{} of {}", human_size(done), human_size(total))
                };
                let (done, total) = self.layers.iter().fold((0, 0), |(d, t), l| (d + l.0, t + l.1));
                self.send(done as f64, Some(total as f64), format!("layer {}/{layers} {short}…: {state}", layer + 1));
            }
            PullEvent::Log(line) => self.send(self.sent + 1.0, None, line),
        }
    }

    fn send(&mut self, value: f64, total: Option<f64>, text: String) {
        if value <= self.sent {
            return;
        }
        self.sent = value;
        self.last = Some(std::time::Instant::now());
        let _ = self.tx.send((value, total, text));
    }
}

fn images_table(images: &[ImageSummary]) -> String {
    let width = images.iter().map(|i| i.name.len()).max().unwrap_or(0).max(4);
    let mut lines =
        vec![format!("{:<width$}  {:>8}  {:>8}  {:>6}  KIND / PARENT", "NAME", "SIZE", "CREATED", "LAYERS")];
    for i in images {
        lines.push(format!(
            "{:<width$}  {:>8}  {:>8}  {:>6}  {}",
            i.name,
            human_size(i.size_bytes),
            format!("{} ago", age(i.created_at_ms)),
            i.layer_count,
            kind(i)
        ));
        lines.extend(recorded(i));
    }
    lines.join("\n")
}

/// Longest detail line under an image: what an image's config says is its
/// author's text, so it is shown JSON-escaped and bounded.
const DETAIL_MAX: usize = 300;

/// `v` as JSON (which escapes control characters and quotes), with the
/// invisible characters JSON leaves as they are escaped too.
fn json(v: &impl serde::Serialize) -> String {
    let text = serde_json::to_string(v).unwrap_or_default();
    // All of them are in the Basic Multilingual Plane: one \uXXXX each.
    text.chars().map(|c| if is_invisible(c) { format!("\\u{:04x}", c as u32) } else { c.to_string() }).collect()
}

/// The line under a pulled or imported image: what its config recorded
/// beyond the env (workdir, user, entrypoint, cmd, ports, labels).
fn recorded(i: &ImageSummary) -> Option<String> {
    if i.source.is_empty() {
        return None;
    }
    let c = &i.config;
    let mut parts = Vec::new();
    for (what, shown) in [
        ("workdir", (!c.workdir.is_empty()).then(|| json(&c.workdir))),
        ("user", (!c.user.is_empty()).then(|| json(&c.user))),
        ("entrypoint", (!c.entrypoint.is_empty()).then(|| json(&c.entrypoint))),
        ("cmd", (!c.cmd.is_empty()).then(|| json(&c.cmd))),
        ("ports", (!c.exposed_ports.is_empty()).then(|| json(&c.exposed_ports))),
        ("labels", (!i.labels.is_empty()).then(|| json(&i.labels.iter().collect::<BTreeMap<_, _>>()))),
    ] {
        if let Some(shown) = shown {
            parts.push(format!("{what} {shown}"));
        }
    }
    if parts.is_empty() {
        return None;
    }
    let line = format!("  {}", parts.join("  "));
    Some(match line.char_indices().nth(DETAIL_MAX) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line,
    })
}

#[tool_router(router = images_router, vis = "pub(super)")]
impl SandboxServer {
    #[tool(
        description = "Save a sandbox's root filesystem (installed packages, files outside /workspace, env) as a named snapshot. Incremental: only what changed since its image is stored. /workspace is never part of a snapshot, nor, on a vm sandbox, Docker's images and containers.",
        annotations(destructive_hint = false, idempotent_hint = false, open_world_hint = false)
    )]
    async fn snapshot(&self, Parameters(p): Parameters<SnapshotParams>) -> Result<CallToolResult, rmcp::ErrorData> {
        match self.manager.snapshot(&p.snapshot_name, &p.sandbox).await {
            Ok((s, layer, took)) => ok(format!(
                "Snapshot '{}' saved from {} (incremental, {}, {}ms)",
                s.name,
                names::display(&p.sandbox),
                human_size(layer),
                took.as_millis()
            )),
            Err(e) => fail(e),
        }
    }

    #[tool(
        description = "Replace a sandbox (and its children) with a fresh one booted from a snapshot. /workspace is kept; port forwards and sync jobs follow the new sandbox.",
        annotations(destructive_hint = true, idempotent_hint = true, open_world_hint = false)
    )]
    async fn restore(&self, Parameters(p): Parameters<SnapshotParams>) -> Result<CallToolResult, rmcp::ErrorData> {
        match self.manager.restore(&p.snapshot_name, &p.sandbox).await {
            Ok(s) => ok(format!("Restored '{}' as '{}': {}", p.snapshot_name, s.shown(), s.vm_id())),
            Err(ImagesError::Restoring(e)) => fail_as("Error restoring", e),
            Err(e) => fail(e),
        }
    }

    #[tool(description = "List saved snapshots.", annotations(read_only_hint = true, open_world_hint = false))]
    async fn list_snapshots(&self) -> Result<CallToolResult, rmcp::ErrorData> {
        match self.manager.snapshots().await {
            Ok(list) if list.is_empty() => ok("No snapshots saved. Use snapshot('name') to create one."),
            Ok(list) => {
                let mut lines = vec!["Available snapshots:".to_string()];
                lines.extend(list.iter().map(|s| {
                    let from = s
                        .image
                        .labels
                        .get(SOURCE_LABEL)
                        .map(|f| format!(", from '{}'", names::display(f)))
                        .unwrap_or_default();
                    format!(
                        "  - {} ({} layer, {} in all{from}, {} ago)",
                        s.name,
                        human_size(s.layer_bytes),
                        human_size(s.image.size_bytes),
                        age(s.image.created_at_ms)
                    )
                }));
                ok(lines.join("\n"))
            }
            Err(e) => fail(e),
        }
    }

    #[tool(
        description = "Delete a snapshot. Refused while snapshots or images built on it exist. Sandboxes running on it keep working.",
        annotations(destructive_hint = true, idempotent_hint = false, open_world_hint = false)
    )]
    async fn delete_snapshot(
        &self,
        Parameters(p): Parameters<DeleteSnapshotParams>,
    ) -> Result<CallToolResult, rmcp::ErrorData> {
        match self.manager.delete_snapshot(&p.snapshot_name).await {
            Ok(()) => ok(format!("Deleted snapshot '{}'", p.snapshot_name)),
            Err(e) => fail(e),
        }
    }

    #[tool(
        description = "Every local image: name, size, age, layers, and what it is (base, snapshot, built) with its parent.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn images(&self) -> Result<CallToolResult, rmcp::ErrorData> {
        match self.manager.images().await {
            Ok(list) if list.is_empty() => ok("No images found"),
            Ok(list) => ok(images_table(&list)),
            Err(e) => fail_as("Error listing images", e),
        }
    }

    #[tool(
        description = "Build an image from a Containerfile, one layer per step, on a local image or a registry image (FROM python:3.12, pulled first unless pulled before). Supported: FROM, RUN, COPY/ADD (heredocs `COPY <<EOF /path` or files given in `context`), ENV, ARG, WORKDIR, USER, LABEL. RUN has network access. Sandboxes boot it via a profile or .sandbox-mcp.toml `image`. Progress is reported per step.",
        annotations(destructive_hint = false, idempotent_hint = false, open_world_hint = true)
    )]
    async fn build_image(
        &self,
        Parameters(p): Parameters<BuildImageParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, rmcp::ErrorData> {
        let spec = BuildSpec { name: p.name, containerfile: p.containerfile, context: p.context, force: p.force };
        let (tx, steps) = mpsc::unbounded_channel::<(usize, usize, String)>();
        let on_step = move |k: usize, total: usize, text: &str| {
            let _ = tx.send((k, total, text.to_string()));
        };
        let work = self.manager.build_image(&spec, &on_step);
        let Some(result) = supervise_with(&ctx, "build_image", work, Progress::Steps(steps)).await else {
            return fail("cancelled by the client; the build VM and intermediate images are removed");
        };
        match result {
            Ok(b) => ok(format!(
                "Built image '{}' ({} steps, {}, {}ms)",
                b.image.name,
                b.steps,
                human_size(b.image.size_bytes),
                b.elapsed.as_millis()
            )),
            Err(e) => fail_as("Error building image", e),
        }
    }

    #[tool(
        description = "Pull an image from an OCI registry (Docker Hub short names like `python:3.12`, any registry, tags or @sha256 digests) and unpack it as a local image; sandboxes boot it via a profile or .sandbox-mcp.toml `image`. Every digest is verified; layers already stored are not fetched again. Credentials come from the user's docker/podman logins; mirrors and plain-HTTP registries from the user's config. Progress is reported per layer; cancelling stops the pull.",
        annotations(destructive_hint = false, idempotent_hint = false, open_world_hint = true)
    )]
    async fn pull_image(
        &self,
        Parameters(p): Parameters<PullImageParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, rmcp::ErrorData> {
        let (tx, reports) = mpsc::unbounded_channel();
        let mut layers = PullReport::new(tx);
        let fetched = std::sync::Arc::clone(&layers.fetched);
        let work = self.manager.pull_image(&p.reference, Some(&p.name), p.force, |e| layers.on_event(e));
        let Some(result) = supervise_with(&ctx, "pull_image", work, Progress::Reports(reports)).await else {
            return fail("cancelled by the client; nothing of the pull was kept but verified layers");
        };
        match result {
            Ok(pulled) => {
                let (fetched, present) = *fetched.lock().unwrap_or_else(|e| e.into_inner());
                ok(format!(
                    "Pulled image '{}' from {} ({} layers: {fetched} fetched, {present} already present; {}, {}ms)",
                    pulled.image.name,
                    pulled.image.source,
                    fetched + present,
                    human_size(pulled.image.size_bytes),
                    pulled.elapsed.as_millis()
                ))
            }
            Err(e) => fail_as("Error pulling image", e),
        }
    }

    #[tool(
        name = "clone",
        description = "Create sandbox `target` as a copy of `source`: its root filesystem changes (copied with the source briefly frozen) and its /workspace.",
        annotations(destructive_hint = false, idempotent_hint = false, open_world_hint = false)
    )]
    async fn clone_sandbox(&self, Parameters(p): Parameters<CloneParams>) -> Result<CallToolResult, rmcp::ErrorData> {
        match self.manager.clone_sandbox(&p.source, &p.target).await {
            Ok(c) => ok(format!(
                "Cloned '{}' -> '{}': {} ({}, {}ms)",
                names::display(&p.source),
                names::display(&p.target),
                c.sandbox.shown(),
                human_size(c.workspace_bytes),
                c.elapsed.as_millis()
            )),
            Err(e) => fail(e),
        }
    }
}
