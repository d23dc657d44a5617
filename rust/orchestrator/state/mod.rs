//! What the orchestrator knows that the helper cannot tell it after a
//! restart — leases, command history, persistent env, port forwards, sync
//! jobs, spawn counters and derived policies, sandboxes that were lost or
//! were being destroyed, reaped children's explanations — kept in a SQLite database (`state.db`, WAL), and
//! putting it back at start.
//!
//! Every change is a small transaction of its own, committed before the tool
//! that made it answers, which says so when it could not be (a full disk):
//! see [`Pending`]. Changes that read
//! what they modify (env) do so inside one write transaction, so several
//! server processes sharing the file never lose each other's updates.
//! Which sandboxes exist is never taken from the database: the helper's VMs
//! (and their labels) are the truth, so a stale or damaged database can
//! neither resurrect a sandbox nor orphan one.
//!
//! - [`store`]: opening, schema migrations, a damaged file set aside, the
//!   database thread.
//! - [`import`]: the JSON state file of earlier versions, imported once.
//! - [`seal`]: env values sealed at rest, and the key they are sealed with.
//! - [`restore()`]: what the database holds, put back at start.
//! - [`kept`]: what a lost sandbox keeps for its comeback, and background
//!   processes marked to restart.
pub mod import;
pub mod kept;
mod restore;
pub mod seal;
pub mod store;

use std::{
    collections::BTreeMap,
    future::Future,
    path::PathBuf,
    pin::Pin,
    sync::{Mutex, OnceLock},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use rusqlite::{Connection, OptionalExtension as _, Transaction, TransactionBehavior};
use serde::Deserialize;

use super::{audit::AuditEntry, sandbox::Sandbox, sandbox::SandboxManager, spawn::SpawnState};
pub use restore::restore;
use seal::SealKey;
pub use store::Store;

/// Where the database lives.
pub fn path() -> PathBuf {
    sandbox_base::paths::state_dir().join("state.db")
}

/// The JSON state file earlier versions wrote beside it.
fn legacy_path(db: &std::path::Path) -> PathBuf {
    db.with_file_name("state.json")
}

/// Everything that can go wrong with the database.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// A file operation failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file or directory.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// The database could not be opened (busy, permissions).
    #[error("cannot open the state database {path}: {source}")]
    Open {
        /// The file.
        path: String,
        /// The error.
        source: rusqlite::Error,
    },
    /// Even a fresh database could not be used.
    #[error("the state database {path} is unreadable: {reason}")]
    Damaged {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// A newer sandbox-mcp wrote it; it is left untouched.
    #[error(
        "the state database {path} has schema version {version}, written by a newer sandbox-mcp; it is left untouched and nothing is saved until that version runs again"
    )]
    Newer {
        /// The file.
        path: String,
        /// Its `user_version`.
        version: u32,
    },
    /// The old JSON state file was not a state we know.
    #[error("the old state file {path} is unreadable ({reason}); it was moved to {moved_to} and is ignored")]
    Unimportable {
        /// The file.
        path: String,
        /// Why.
        reason: String,
        /// Where it is now.
        moved_to: String,
    },
    /// The key env values are sealed with is missing, exposed or unreadable.
    #[error(transparent)]
    Key(#[from] seal::SealError),
    /// A statement failed.
    #[error("state database: {0}")]
    Db(#[from] rusqlite::Error),
    /// The database thread is gone (the server is shutting down).
    #[error("the state database is closed")]
    Closed,
}

/// One sandbox's row.
#[derive(Debug, Clone, Default)]
pub struct SandboxRecord {
    /// Sandbox name (also the VM id).
    pub name: String,
    /// Image it runs.
    pub image: String,
    /// Parent of a child.
    pub parent: Option<String>,
    /// Unix seconds of its start.
    pub created_at: f64,
    /// Unix seconds when its lease (a child's TTL) ends.
    pub expires_at: Option<f64>,
    /// CPU limit.
    pub cpus: u32,
    /// Memory limit in MiB.
    pub memory_mb: u64,
    /// 0 top level, 1 child, 2 grandchild.
    pub generation: u32,
    /// Canonical path of its project's directory; `None`: the legacy project.
    pub project: Option<String>,
}

/// One history entry.
#[derive(Debug, Clone, Deserialize)]
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
#[derive(Debug, Clone, Deserialize)]
pub struct ForwardRecord {
    /// Port on the host's loopback.
    pub host_port: u16,
    /// Sandbox name.
    pub sandbox: String,
    /// Port inside the sandbox.
    pub port: u16,
}

/// One sync job.
#[derive(Debug, Clone, Deserialize)]
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

fn secs(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

pub(crate) fn time_of(secs: f64) -> SystemTime {
    UNIX_EPOCH + Duration::try_from_secs_f64(secs).unwrap_or_default()
}

impl AuditRecord {
    fn of(e: &AuditEntry) -> Self {
        Self {
            command: e.command.clone(),
            exit_code: e.exit_code,
            duration_ms: e.duration.as_millis() as u64,
            at: secs(e.at),
        }
    }

    pub(crate) fn entry(&self) -> AuditEntry {
        AuditEntry {
            command: self.command.clone(),
            exit_code: self.exit_code,
            duration: Duration::from_millis(self.duration_ms),
            at: time_of(self.at),
        }
    }
}

impl SandboxRecord {
    /// The columns [`Self::read`] reads, in its order.
    const COLUMNS: &'static str = "name, image, parent, created_at, expires_at, cpus, memory_mb, generation, project";

    /// A row selected with [`Self::COLUMNS`] first.
    fn read(r: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            name: r.get(0)?,
            image: r.get(1)?,
            parent: r.get(2)?,
            created_at: r.get(3)?,
            expires_at: r.get(4)?,
            cpus: r.get(5)?,
            memory_mb: r.get::<_, i64>(6)? as u64,
            generation: r.get(7)?,
            project: r.get(8)?,
        })
    }

    fn of(s: &Sandbox) -> Self {
        Self {
            name: s.name.clone(),
            image: s.image.clone(),
            parent: s.parent.clone(),
            created_at: secs(s.started_at),
            expires_at: s.lease_expires().map(secs),
            cpus: s.cpus,
            memory_mb: s.memory_bytes >> 20,
            generation: s.generation,
            project: s.project_dir.as_ref().map(|d| d.display().to_string()),
        }
    }
}

/// The statements, each given an open transaction (or connection).
pub(crate) mod ops {
    use super::*;

    /// Insert or update a sandbox's row; its `destroying` mark is kept.
    pub fn put_sandbox(c: &Connection, r: &SandboxRecord) -> rusqlite::Result<()> {
        c.execute(
            "INSERT INTO sandboxes (name, image, parent, created_at, expires_at, cpus, memory_mb, generation, project)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
             ON CONFLICT (name) DO UPDATE SET image = excluded.image, parent = excluded.parent,
                 created_at = excluded.created_at, expires_at = excluded.expires_at, cpus = excluded.cpus,
                 memory_mb = excluded.memory_mb, generation = excluded.generation, project = excluded.project",
            (
                &r.name,
                &r.image,
                &r.parent,
                r.created_at,
                r.expires_at,
                r.cpus,
                r.memory_mb as i64,
                r.generation,
                &r.project,
            ),
        )?;
        Ok(())
    }

    /// Append a history entry, keeping the newest [`AUDIT_LOG_SIZE`](crate::audit::AUDIT_LOG_SIZE).
    pub fn add_history(c: &Connection, sandbox: &str, a: &AuditRecord) -> rusqlite::Result<()> {
        c.execute(
            "INSERT INTO history (sandbox, command, exit_code, duration_ms, at) VALUES (?1, ?2, ?3, ?4, ?5)",
            (sandbox, &a.command, a.exit_code, a.duration_ms as i64, a.at),
        )?;
        c.execute(
            "DELETE FROM history WHERE sandbox = ?1 AND id <= (
                 SELECT id FROM history WHERE sandbox = ?1 ORDER BY id DESC LIMIT 1 OFFSET ?2)",
            (sandbox, crate::audit::AUDIT_LOG_SIZE as i64),
        )?;
        Ok(())
    }

    /// Record a forward (replacing one on the same host port).
    pub fn put_forward(c: &Connection, f: &ForwardRecord) -> rusqlite::Result<()> {
        c.execute(
            "INSERT OR REPLACE INTO forwards (host_port, sandbox, port) VALUES (?1, ?2, ?3)",
            (f.host_port, &f.sandbox, f.port),
        )?;
        Ok(())
    }

    /// Record a sync job.
    pub fn put_sync(c: &Connection, j: &SyncRecord) -> rusqlite::Result<()> {
        c.execute(
            "INSERT OR REPLACE INTO sync_jobs (id, local, sandbox, dir, files_synced) VALUES (?1, ?2, ?3, ?4, ?5)",
            (&j.id, j.local.to_string_lossy(), &j.sandbox, &j.dir, j.files_synced as i64),
        )?;
        Ok(())
    }

    /// Record a lost sandbox. Its row, history, env, forwards, sync jobs and
    /// restartable background processes stay: its next use brings it back
    /// with them ([`kept`](super::kept)).
    pub fn put_lost(c: &Connection, name: &str, why: &str) -> rusqlite::Result<()> {
        c.execute("INSERT OR REPLACE INTO lost (name, reason) VALUES (?1, ?2)", (name, why))?;
        // A child never comes back (its parent's spawn made it): nothing is
        // kept for it.
        if crate::names::is_child_name(name) {
            c.execute("DELETE FROM forwards WHERE sandbox = ?1", [name])?;
            c.execute("DELETE FROM sync_jobs WHERE sandbox = ?1", [name])?;
            forget_sandbox(c, name)?;
        }
        Ok(())
    }

    /// Forget a sandbox's row, history, env and restartable background
    /// processes.
    pub fn forget_sandbox(c: &Connection, name: &str) -> rusqlite::Result<()> {
        for table in [
            "DELETE FROM sandboxes WHERE name = ?1",
            "DELETE FROM history WHERE sandbox = ?1",
            "DELETE FROM bg_restart WHERE sandbox = ?1",
        ] {
            c.execute(table, [name])?;
        }
        forget_env(c, name)
    }

    /// Leave no record of a sandbox's env.
    pub fn forget_env(c: &Connection, name: &str) -> rusqlite::Result<()> {
        c.execute("DELETE FROM env WHERE sandbox = ?1", [name])?;
        c.execute("DELETE FROM env_known WHERE sandbox = ?1", [name])?;
        Ok(())
    }

    /// Replace a sandbox's env, every value sealed with `key`.
    pub fn put_env(c: &Connection, key: &SealKey, name: &str, env: &BTreeMap<String, String>) -> rusqlite::Result<()> {
        forget_env(c, name)?;
        c.execute("INSERT INTO env_known (sandbox) VALUES (?1)", [name])?;
        for (k, v) in env {
            let sealed = key.seal(name, k, v).map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
            c.execute("INSERT INTO env (sandbox, key, value) VALUES (?1, ?2, ?3)", (name, k, sealed))?;
        }
        Ok(())
    }

    /// A sandbox's env, if it was ever recorded, its values opened with
    /// `key`. A value that does not open is a `FromSqlConversionFailure`
    /// holding the [`seal::SealError`].
    pub fn env(c: &Connection, key: &SealKey, name: &str) -> rusqlite::Result<Option<BTreeMap<String, String>>> {
        let known: bool =
            c.query_row("SELECT EXISTS (SELECT 1 FROM env_known WHERE sandbox = ?1)", [name], |r| r.get(0))?;
        if !known {
            return Ok(None);
        }
        let mut stmt = c.prepare_cached("SELECT key, value FROM env WHERE sandbox = ?1")?;
        let rows = stmt.query_map([name], |r| {
            let (k, stored): (String, String) = (r.get(0)?, r.get(1)?);
            let value = key
                .open(name, &k, &stored)
                .map_err(|e| rusqlite::Error::FromSqlConversionFailure(1, rusqlite::types::Type::Text, Box::new(e)))?;
            Ok((k, value))
        })?;
        rows.collect::<rusqlite::Result<_>>().map(Some)
    }

    /// Remember what a later use of a reaped child's name is told, keeping
    /// the newest [`MAX_GONE_CHILDREN`](crate::sandbox::MAX_GONE_CHILDREN).
    pub fn put_gone_child(c: &Connection, name: &str, message: &str) -> rusqlite::Result<()> {
        // REPLACE gives the row a new rowid: the newest has the highest.
        c.execute("INSERT OR REPLACE INTO gone_children (name, message) VALUES (?1, ?2)", (name, message))?;
        c.execute(
            "DELETE FROM gone_children WHERE rowid NOT IN (
                 SELECT rowid FROM gone_children ORDER BY rowid DESC LIMIT ?1)",
            [crate::sandbox::MAX_GONE_CHILDREN as i64],
        )?;
        Ok(())
    }

    /// Save the spawn bookkeeping.
    pub fn put_spawn(c: &Connection, s: &SpawnState) -> rusqlite::Result<()> {
        let json = serde_json::to_string(s).map_err(|e| rusqlite::Error::ToSqlConversionFailure(e.into()))?;
        c.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('spawn', ?1)", [json])?;
        Ok(())
    }
}

/// The state as the database holds it.
#[derive(Debug, Default)]
struct Snapshot {
    sandboxes: Vec<(SandboxRecord, bool)>,
    history: BTreeMap<String, Vec<AuditRecord>>,
    env: BTreeMap<String, BTreeMap<String, String>>,
    /// Sandboxes whose saved env did not open with this key.
    unopened_env: Vec<String>,
    forwards: Vec<ForwardRecord>,
    sync_jobs: Vec<SyncRecord>,
    lost: BTreeMap<String, String>,
    gone_children: BTreeMap<String, String>,
    spawn: SpawnState,
}

fn load(c: &mut Connection, key: &SealKey) -> rusqlite::Result<Snapshot> {
    let tx = c.transaction()?;
    let mut s = Snapshot::default();
    {
        let mut q = tx.prepare(&format!("SELECT {}, destroying FROM sandboxes", SandboxRecord::COLUMNS))?;
        let rows = q.query_map([], |r| Ok((SandboxRecord::read(r)?, r.get::<_, bool>(9)?)))?;
        s.sandboxes = rows.collect::<rusqlite::Result<_>>()?;
        let mut q = tx.prepare("SELECT sandbox, command, exit_code, duration_ms, at FROM history ORDER BY id")?;
        let mut rows = q.query([])?;
        while let Some(r) = rows.next()? {
            s.history.entry(r.get(0)?).or_default().push(AuditRecord {
                command: r.get(1)?,
                exit_code: r.get(2)?,
                duration_ms: r.get::<_, i64>(3)? as u64,
                at: r.get(4)?,
            });
        }
        let mut q = tx.prepare("SELECT sandbox FROM env_known")?;
        let known: Vec<String> = q.query_map([], |r| r.get(0))?.collect::<rusqlite::Result<_>>()?;
        for name in known {
            match ops::env(&tx, key, &name) {
                Ok(env) => drop(s.env.insert(name.clone(), env.unwrap_or_default())),
                // Left out, the sandbox's own copy of its env is used and
                // saved again (`apply`).
                Err(rusqlite::Error::FromSqlConversionFailure(_, _, e)) => {
                    tracing::warn!(sandbox = %name, "the saved env is not used: {e}; the sandbox's own copy is");
                    s.unopened_env.push(name);
                }
                Err(e) => return Err(e),
            }
        }
        let mut q = tx.prepare("SELECT host_port, sandbox, port FROM forwards")?;
        s.forwards = q
            .query_map([], |r| Ok(ForwardRecord { host_port: r.get(0)?, sandbox: r.get(1)?, port: r.get(2)? }))?
            .collect::<rusqlite::Result<_>>()?;
        let mut q = tx.prepare("SELECT id, local, sandbox, dir, files_synced FROM sync_jobs")?;
        s.sync_jobs = q
            .query_map([], |r| {
                Ok(SyncRecord {
                    id: r.get(0)?,
                    local: PathBuf::from(r.get::<_, String>(1)?),
                    sandbox: r.get(2)?,
                    dir: r.get(3)?,
                    files_synced: r.get::<_, i64>(4)? as u64,
                })
            })?
            .collect::<rusqlite::Result<_>>()?;
        let mut q = tx.prepare("SELECT name, reason FROM lost")?;
        s.lost = q.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect::<rusqlite::Result<_>>()?;
        let mut q = tx.prepare("SELECT name, message FROM gone_children")?;
        s.gone_children = q.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect::<rusqlite::Result<_>>()?;
        let spawn: Option<String> =
            tx.query_row("SELECT value FROM meta WHERE key = 'spawn'", [], |r| r.get(0)).optional()?;
        if let Some(json) = spawn {
            match serde_json::from_str(&json) {
                Ok(state) => s.spawn = state,
                Err(e) => tracing::warn!("ignoring unreadable spawn bookkeeping in the state database: {e}"),
            }
        }
    }
    tx.finish()?;
    Ok(s)
}

/// A change handed to the database thread, queued in order. A caller that
/// answers a tool awaits [`Pending::saved`] and says when it failed (a full
/// disk): success is never claimed for a change a restart would not know.
/// Changes made on nobody's behalf (reaping, restoring, bookkeeping that is
/// rewritten whole by the next change) go [`Pending::in_background`]; their
/// failures are logged.
#[must_use = "await `.saved()` before answering, or say `.in_background()`"]
pub(super) struct Pending(Option<Commit>);

/// The database thread's answer to one queued change.
type Commit = Pin<Box<dyn Future<Output = Result<(), StateError>> + Send>>;

impl Pending {
    /// Waits until the change is committed; its error when it was not.
    pub(super) async fn saved(self) -> Result<(), StateError> {
        match self.0 {
            Some(done) => done.await,
            None => Ok(()),
        }
    }

    /// Nobody waits for it: a failure is only logged.
    pub(super) fn in_background(self) {}
}

/// The database as the sandbox registry holds it: opened at
/// [`Orchestrator::resume`]; until then (and when it cannot be opened)
/// changes are not saved, and [`Self::notice`] says why.
#[derive(Default)]
pub struct StateHandle {
    store: OnceLock<Store>,
    notice: Mutex<Option<String>>,
}

impl StateHandle {
    fn submit(
        &self,
        what: &'static str,
        f: impl FnOnce(&Transaction<'_>) -> rusqlite::Result<()> + Send + 'static,
    ) -> Pending {
        let Some(store) = self.store.get() else { return Pending(None) };
        // Queued now, run in order: a later read or write sees it.
        let done = store.call(move |c| {
            let done = c.transaction_with_behavior(TransactionBehavior::Immediate).and_then(|tx| {
                f(&tx)?;
                tx.commit()
            });
            if let Err(e) = &done {
                tracing::warn!("could not save {what} in the state database: {e}");
            }
            done
        });
        Pending(Some(Box::pin(done)))
    }

    /// What a problem with the database means for the user, if there is one.
    pub fn notice(&self) -> Option<String> {
        self.notice.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// [`Self::submit`] for a change that seals env values.
    fn submit_sealed(
        &self,
        what: &'static str,
        f: impl FnOnce(&Transaction<'_>, &SealKey) -> rusqlite::Result<()> + Send + 'static,
    ) -> Pending {
        let Some(key) = self.store.get().map(|s| s.key().clone()) else { return Pending(None) };
        self.submit(what, move |c| f(c, &key))
    }

    fn set_notice(&self, text: String) {
        tracing::warn!("{text}");
        *self.notice.lock().unwrap_or_else(|p| p.into_inner()) = Some(text);
    }
}

impl SandboxManager {
    /// Wait until every change queued so far ran (restoring, before
    /// serving).
    async fn committed(&self) {
        if let Some(store) = self.state.store.get() {
            let _ = store.call(|_| Ok(())).await;
        }
    }

    /// At shutdown: wait for every change, then move the WAL's contents into
    /// the database file, so the file alone is the whole state.
    pub async fn close_state(&self) {
        if let Some(store) = self.state.store.get() {
            let done = store.call(|c| c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))).await;
            if let Err(e) = done {
                tracing::warn!("could not checkpoint the state database: {e}");
            }
        }
    }

    /// A problem with the state database, for `status` and `health`.
    pub fn state_notice(&self) -> Option<String> {
        self.state.notice()
    }

    /// A sandbox's row changed (its lease).
    pub(super) fn record_sandbox(&self, s: &Sandbox) -> Pending {
        let r = SandboxRecord::of(s);
        self.state.submit("a sandbox's lease", move |c| ops::put_sandbox(c, &r))
    }

    /// A sandbox was created (or replaced by reset/restore): a new row, no
    /// history, its env as it starts, no loss. A lost sandbox coming back
    /// keeps, in the same transaction, what was `kept` for it: a crash can
    /// leave it lost or back, never back without its env and history.
    pub(super) fn record_created(&self, s: &Sandbox, kept: Option<std::sync::Arc<kept::Kept>>) -> Pending {
        let (r, env) = (SandboxRecord::of(s), s.env());
        self.state.submit_sealed("a new sandbox", move |c, key| {
            ops::forget_sandbox(c, &r.name)?;
            c.execute("DELETE FROM lost WHERE name = ?1", [&r.name])?;
            c.execute("DELETE FROM gone_children WHERE name = ?1", [&r.name])?;
            ops::put_sandbox(c, &r)?;
            match &kept {
                Some(kept) => kept::write_back(c, key, &r.name, kept, &env),
                None => ops::put_env(c, key, &r.name, &env),
            }
        })
    }

    /// A sandbox is about to be destroyed: if the server dies before it is
    /// gone, the next one finishes the job instead of reporting it lost.
    pub(super) fn record_destroying(&self, name: &str) -> Pending {
        let name = name.to_string();
        self.state.submit("a destroy", move |c| {
            c.execute("UPDATE sandboxes SET destroying = 1 WHERE name = ?1", [&name]).map(drop)
        })
    }

    /// A sandbox is gone (destroyed or reaped).
    pub(super) fn record_removed(&self, name: &str) -> Pending {
        let name = name.to_string();
        self.state.submit("a destroy", move |c| ops::forget_sandbox(c, &name))
    }

    /// A child was reaped: what a later use of its name is told.
    pub(super) fn record_gone_child(&self, name: &str, message: &str) -> Pending {
        let (name, message) = (name.to_string(), message.to_string());
        self.state.submit("a reaped child", move |c| ops::put_gone_child(c, &name, &message))
    }

    /// A command finished: its history entry, committed before the command's
    /// answer, which says so when it could not be (a full disk).
    pub(super) async fn save_history(&self, name: &str, entry: &AuditEntry) -> Result<(), StateError> {
        let (name, a) = (name.to_string(), AuditRecord::of(entry));
        self.state.submit("a history entry", move |c| ops::add_history(c, &name, &a)).saved().await
    }

    /// A sandbox was lost.
    pub(super) fn record_lost(&self, name: &str, why: &str) -> Pending {
        let (name, why) = (name.to_string(), why.to_string());
        self.state.submit("a lost sandbox", move |c| ops::put_lost(c, &name, &why))
    }

    /// A lost sandbox was destroyed or reset: nothing it kept for a
    /// comeback stays (its forwards and sync jobs neither).
    pub(super) fn record_forgotten(&self, name: &str) -> Pending {
        let name = name.to_string();
        self.state.submit("an acknowledged loss", move |c| {
            c.execute("DELETE FROM lost WHERE name = ?1", [&name])?;
            c.execute("DELETE FROM forwards WHERE sandbox = ?1", [&name])?;
            c.execute("DELETE FROM sync_jobs WHERE sandbox = ?1", [&name])?;
            ops::forget_sandbox(c, &name)
        })
    }

    /// A sandbox reported lost was found running after all.
    pub(super) fn record_found(&self, name: &str) -> Pending {
        let name = name.to_string();
        self.state
            .submit("an acknowledged loss", move |c| c.execute("DELETE FROM lost WHERE name = ?1", [&name]).map(drop))
    }

    /// A port forward started.
    pub(super) fn record_forward(&self, f: ForwardRecord) -> Pending {
        self.state.submit("a port forward", move |c| ops::put_forward(c, &f))
    }

    /// A port forward ended.
    pub(super) fn record_unforward(&self, host_port: u16) -> Pending {
        self.state.submit("a port forward", move |c| {
            c.execute("DELETE FROM forwards WHERE host_port = ?1", [host_port]).map(drop)
        })
    }

    /// A sync job started.
    pub(super) fn record_sync(&self, j: SyncRecord) -> Pending {
        self.state.submit("a sync job", move |c| ops::put_sync(c, &j))
    }

    /// A sync job ended.
    pub(super) fn record_unsync(&self, id: &str) -> Pending {
        let id = id.to_string();
        self.state.submit("a sync job", move |c| c.execute("DELETE FROM sync_jobs WHERE id = ?1", [&id]).map(drop))
    }

    /// The spawn bookkeeping changed.
    pub(super) fn record_spawn(&self, s: &SpawnState) -> Pending {
        let s = s.clone();
        self.state.submit("spawn bookkeeping", move |c| ops::put_spawn(c, &s))
    }

    /// Change one env key inside one write transaction and return the whole
    /// env after it: a change made meanwhile by another server process is
    /// kept, never overwritten. `current` is the env when the database has
    /// no record of it (or there is no database).
    pub(super) async fn change_env(
        &self,
        name: &str,
        key: &str,
        value: Option<&str>,
        current: BTreeMap<String, String>,
        commit: bool,
    ) -> Result<BTreeMap<String, String>, StateError> {
        let apply = {
            let (key, value) = (key.to_string(), value.map(str::to_string));
            move |env: &mut BTreeMap<String, String>| match &value {
                Some(v) => drop(env.insert(key.clone(), v.clone())),
                None => drop(env.remove(&key)),
            }
        };
        let Some(store) = self.state.store.get() else {
            let mut env = current;
            apply(&mut env);
            return Ok(env);
        };
        let (name, key) = (name.to_string(), store.key().clone());
        store
            .call(move |c| {
                let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let mut env = ops::env(&tx, &key, &name)?.unwrap_or(current);
                apply(&mut env);
                if commit {
                    ops::put_env(&tx, &key, &name, &env)?;
                    tx.commit()?;
                }
                Ok(env)
            })
            .await
    }
}

#[cfg(test)]
mod tests;
