//! The state file: what the orchestrator knows that the helper cannot tell
//! it after a restart — leases, command history, port forwards, sync jobs,
//! spawn counters and derived policies, sandboxes that were lost — and
//! putting it back.
//!
//! The file keeps the reference's schema v2 fields (`schema_version`,
//! `written_at`, `spawn_seqs`, `parent_generations`, `derived_policies`,
//! `sandboxes.<name>.{container, image, role, parent, created_at,
//! expires_at, cpus, memory_mb, generation}`) and adds ours beside them.
//! Which sandboxes exist is never taken from the file: the helper's VMs (and
//! their labels) are the truth, so a stale or damaged file can neither
//! resurrect a sandbox nor orphan one.
//!
//! Writes are atomic and durable: temp file, fsync, rename, fsync of the
//! directory; a writer task coalesces bursts of changes into one write.
use std::{
    collections::BTreeMap,
    io::Write as _,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use serde::{Deserialize, Serialize};

use super::{Orchestrator, audit::AuditEntry, sandbox::Sandbox, spawn::SpawnState};

/// The schema this build writes; files without a version are read as v1.
const SCHEMA_VERSION: u32 = 2;
/// Changes arriving within this window share one write.
const COALESCE: Duration = Duration::from_millis(50);
/// How long new command history may wait for a write.
const HISTORY_DELAY: Duration = Duration::from_secs(1);

/// The whole file.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct StateFile {
    /// Always [`SCHEMA_VERSION`] when written by us.
    #[serde(default)]
    pub schema_version: u32,
    /// Unix seconds.
    #[serde(default)]
    pub written_at: f64,
    /// Spawn counters and derived policies (`spawn_seqs`,
    /// `parent_generations`, `derived_policies`).
    #[serde(flatten)]
    pub spawn: SpawnState,
    /// Per sandbox.
    #[serde(default)]
    pub sandboxes: BTreeMap<String, SandboxRecord>,
    /// Active port forwards.
    #[serde(default)]
    pub forwards: Vec<ForwardRecord>,
    /// Active sync jobs.
    #[serde(default)]
    pub sync_jobs: Vec<SyncRecord>,
    /// Sandboxes whose VM went away without being destroyed, with why.
    #[serde(default)]
    pub lost: BTreeMap<String, String>,
}

/// One sandbox.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct SandboxRecord {
    /// VM id (the sandbox name here).
    #[serde(default)]
    pub container: String,
    /// Image it runs.
    #[serde(default)]
    pub image: String,
    /// "primary" or "child".
    #[serde(default)]
    pub role: String,
    /// Parent of a child.
    #[serde(default)]
    pub parent: Option<String>,
    /// Unix seconds of its start.
    #[serde(default)]
    pub created_at: f64,
    /// Unix seconds when its lease (a child's TTL) ends.
    #[serde(default)]
    pub expires_at: Option<f64>,
    /// CPU limit.
    #[serde(default)]
    pub cpus: u32,
    /// Memory limit in MiB.
    #[serde(default)]
    pub memory_mb: u64,
    /// 0 top level, 1 child, 2 grandchild.
    #[serde(default)]
    pub generation: u32,
    /// Recent commands, oldest first.
    #[serde(default)]
    pub audit: Vec<AuditRecord>,
}

/// One audit entry.
#[derive(Debug, Serialize, Deserialize)]
pub struct AuditRecord {
    /// Redacted command.
    pub command: String,
    /// Exit code.
    pub exit_code: i32,
    /// Milliseconds.
    pub duration_ms: u64,
    /// Unix seconds when it finished.
    pub at: f64,
}

/// One port forward.
#[derive(Debug, Serialize, Deserialize)]
pub struct ForwardRecord {
    /// Port on the host's loopback.
    pub host_port: u16,
    /// Sandbox name.
    pub sandbox: String,
    /// Port inside the sandbox.
    pub port: u16,
}

/// One sync job.
#[derive(Debug, Serialize, Deserialize)]
pub struct SyncRecord {
    /// Job id, kept across restarts.
    pub id: String,
    /// Host directory.
    pub local: PathBuf,
    /// Sandbox name.
    pub sandbox: String,
    /// Directory inside the sandbox.
    pub dir: String,
    /// Files pushed so far.
    #[serde(default)]
    pub files_synced: u64,
}

/// Where the state file lives.
pub fn path() -> PathBuf {
    crate::paths::state_dir().join("state.json")
}

fn secs(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

fn time(secs: f64) -> SystemTime {
    UNIX_EPOCH + Duration::try_from_secs_f64(secs).unwrap_or_default()
}

impl AuditRecord {
    fn from_entry(e: &AuditEntry) -> Self {
        Self {
            command: e.command.clone(),
            exit_code: e.exit_code,
            duration_ms: e.duration.as_millis() as u64,
            at: secs(e.at),
        }
    }

    fn entry(&self) -> AuditEntry {
        AuditEntry {
            command: self.command.clone(),
            exit_code: self.exit_code,
            duration: Duration::from_millis(self.duration_ms),
            at: time(self.at),
        }
    }
}

impl SandboxRecord {
    fn of(s: &Sandbox) -> Self {
        Self {
            container: s.name.clone(),
            image: s.image.clone(),
            role: if s.parent.is_some() { "child" } else { "primary" }.into(),
            parent: s.parent.clone(),
            created_at: secs(s.started_at),
            expires_at: s.lease_expires().map(secs),
            cpus: s.cpus,
            memory_mb: s.memory_bytes >> 20,
            generation: s.generation,
            audit: s.audit_entries().iter().map(AuditRecord::from_entry).collect(),
        }
    }
}

/// Everything that can go wrong reading or writing the file.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// Reading or writing failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file or directory.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// The file is not JSON of a schema we know.
    #[error("state file {path} is unreadable ({reason}); it was moved to {moved_to} and is ignored")]
    Damaged {
        /// The file.
        path: String,
        /// Why.
        reason: String,
        /// Where it was put aside.
        moved_to: String,
    },
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> StateError {
    let path = path.display().to_string();
    move |source| StateError::Io { what, path, source }
}

impl StateFile {
    /// Read the file; a missing file is an empty state. A damaged one is
    /// moved aside (never deleted: it may be the only record of something)
    /// and reported.
    pub fn load(path: &Path) -> Result<Self, StateError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(e) => return Err(io("reading", path)(e)),
        };
        let parsed: Result<serde_json::Value, _> = serde_json::from_str(&text);
        let reason = match parsed {
            Ok(v) => match v.get("schema_version").and_then(|v| v.as_u64()) {
                Some(2) => match serde_json::from_value(v) {
                    Ok(state) => return Ok(state),
                    Err(e) => e.to_string(),
                },
                // v1 (no version) holds nothing we restore: names and
                // images only, and the helper knows both.
                None => return Ok(Self::default()),
                Some(n) => format!("unknown schema_version {n}"),
            },
            Err(e) => e.to_string(),
        };
        let aside = path.with_extension(format!("json.damaged-{}", secs(SystemTime::now()) as u64));
        std::fs::rename(path, &aside).map_err(io("moving aside", path))?;
        Err(StateError::Damaged { path: path.display().to_string(), reason, moved_to: aside.display().to_string() })
    }

    /// Write atomically and durably: a crash at any point leaves either the
    /// old file or the new one.
    pub fn save(&mut self, path: &Path) -> Result<(), StateError> {
        self.schema_version = SCHEMA_VERSION;
        self.written_at = secs(SystemTime::now());
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(io("creating", dir))?;
        let tmp = dir.join(format!(".state.json.{}.tmp", std::process::id()));
        let text = serde_json::to_vec_pretty(self).map_err(|e| io("encoding", path)(e.into()))?;
        let mut f = std::fs::File::create(&tmp).map_err(io("creating", &tmp))?;
        f.write_all(&text).map_err(io("writing", &tmp))?;
        f.sync_all().map_err(io("syncing", &tmp))?;
        drop(f);
        std::fs::rename(&tmp, path).map_err(io("replacing", path))?;
        std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io("syncing", dir))
    }
}

/// Gather the current state of every service.
pub fn capture(o: &Orchestrator) -> StateFile {
    StateFile {
        sandboxes: o.sandboxes.list().iter().map(|s| (s.name.clone(), SandboxRecord::of(s))).collect(),
        forwards: o
            .forwards
            .list()
            .into_iter()
            .map(|f| ForwardRecord { host_port: f.host_port, sandbox: f.sandbox, port: f.port })
            .collect(),
        sync_jobs: o
            .syncs
            .list()
            .into_iter()
            .map(|j| SyncRecord {
                id: j.id,
                local: j.local,
                sandbox: j.sandbox,
                dir: j.dir,
                files_synced: j.files_synced,
            })
            .collect(),
        lost: o.sandboxes.lost(),
        spawn: o.spawns.export_state(),
        ..Default::default()
    }
}

/// Put a saved state back onto freshly attached sandboxes: leases, history,
/// lost sandboxes, then forwards and sync jobs (which need their sandbox
/// running). Problems are logged and skipped: a forward whose port is now
/// taken must not keep the others from coming back.
pub async fn restore(o: &Orchestrator, state: StateFile) {
    let attached: BTreeMap<String, Arc<Sandbox>> =
        o.sandboxes.list().into_iter().map(|s| (s.name.clone(), s)).collect();
    let mut lost = state.lost.clone();
    for (name, record) in &state.sandboxes {
        match attached.get(name) {
            Some(s) => {
                s.set_lease(record.expires_at.map(time));
                s.restore_audit(record.audit.iter().map(AuditRecord::entry).collect());
            }
            None => {
                lost.entry(name.clone()).or_insert_with(|| {
                    "its VM was gone when the server restarted (the VM helper stopped or the machine rebooted)".into()
                });
            }
        }
    }
    lost.retain(|name, _| !attached.contains_key(name));
    o.sandboxes.set_lost(lost);
    o.spawns.import_state(state.spawn);
    for f in state.forwards.iter().filter(|f| attached.contains_key(&f.sandbox)) {
        if let Err(e) = o.forwards.expose(&f.sandbox, f.port.into(), f.host_port.into()).await {
            tracing::warn!(sandbox = %f.sandbox, host_port = f.host_port, "could not restore port forward: {e}");
        }
    }
    for j in state.sync_jobs.iter().filter(|j| attached.contains_key(&j.sandbox)) {
        if let Err(e) = o.syncs.resume(&j.id, &j.local, &j.dir, &j.sandbox, j.files_synced).await {
            tracing::warn!(job = %j.id, sandbox = %j.sandbox, "could not resume sync job: {e}");
        }
    }
    o.sandboxes.state_changed();
}

/// Write the current state now (at shutdown: the writer task may still be
/// inside its coalescing window).
pub fn save_now(o: &Orchestrator, path: &Path) {
    if let Err(e) = capture(o).save(path) {
        tracing::warn!("could not write the state file: {e}");
    }
}

/// Write the file whenever something in it changed (within [`COALESCE`];
/// new command history within [`HISTORY_DELAY`]), until the orchestrator is
/// dropped.
pub fn spawn_writer(o: &Arc<Orchestrator>, path: PathBuf) {
    let dirty = o.sandboxes.dirty.clone();
    let history = o.sandboxes.history_dirty.clone();
    let weak = Arc::downgrade(o);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(HISTORY_DELAY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = dirty.notified() => tokio::time::sleep(COALESCE).await,
                _ = tick.tick() => {
                    if !history.swap(false, std::sync::atomic::Ordering::Relaxed) {
                        continue;
                    }
                }
            }
            // This write carries whatever history there is.
            history.store(false, std::sync::atomic::Ordering::Relaxed);
            let Some(o) = weak.upgrade() else { break };
            let mut state = capture(&o);
            drop(o);
            let path = path.clone();
            let written = tokio::task::spawn_blocking(move || state.save(&path)).await;
            match written {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!("could not write the state file: {e}"),
                Err(e) => tracing::warn!("state file writer failed: {e}"),
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("sandbox-mcp-state-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn round_trips_and_keeps_reference_fields() {
        let dir = temp_dir("rt");
        let path = dir.join("state.json");
        let mut s = StateFile::default();
        s.spawn.spawn_seqs.insert("default".into(), 3);
        s.sandboxes.insert(
            "default".into(),
            SandboxRecord { container: "default".into(), role: "primary".into(), cpus: 2, ..Default::default() },
        );
        s.forwards.push(ForwardRecord { host_port: 8080, sandbox: "default".into(), port: 8000 });
        s.save(&path).unwrap();
        let raw: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(raw["schema_version"], 2);
        assert_eq!(raw["sandboxes"]["default"]["role"], "primary");
        assert_eq!(raw["spawn_seqs"]["default"], 3);
        let back = StateFile::load(&path).unwrap();
        assert_eq!(back.forwards[0].host_port, 8080);
        assert_eq!(back.sandboxes["default"].cpus, 2);
        assert!(std::fs::read_dir(&dir).unwrap().all(|e| !e.unwrap().file_name().to_string_lossy().ends_with(".tmp")));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn missing_is_empty_and_v1_is_ignored() {
        let dir = temp_dir("v1");
        let path = dir.join("state.json");
        assert!(StateFile::load(&path).unwrap().sandboxes.is_empty());
        std::fs::write(&path, r#"{"default": {"container": "mcp-sb-abc123", "image": "mcp-dev"}}"#).unwrap();
        assert!(StateFile::load(&path).unwrap().sandboxes.is_empty());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn damaged_file_is_moved_aside_not_deleted() {
        let dir = temp_dir("bad");
        let path = dir.join("state.json");
        for text in ["{not json", r#"{"schema_version": 7}"#, r#"{"schema_version": 2, "sandboxes": 5}"#] {
            std::fs::write(&path, text).unwrap();
            let err = StateFile::load(&path).unwrap_err();
            let StateError::Damaged { moved_to, .. } = &err else { panic!("{err}") };
            assert_eq!(std::fs::read_to_string(moved_to).unwrap(), text);
            assert!(!path.exists());
            assert!(err.to_string().contains("is ignored"), "{err}");
            std::fs::remove_file(moved_to).unwrap();
        }
        std::fs::remove_dir_all(dir).unwrap();
    }
}
