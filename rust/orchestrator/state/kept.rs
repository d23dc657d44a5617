//! What a lost sandbox keeps in the database for its comeback (its row,
//! env, history, forwards, sync jobs), and the background processes marked
//! to start again then (`bg(restart=true)`). A lost sandbox's rows stay
//! until it comes back, is reset or is destroyed.
use std::collections::BTreeMap;

use rusqlite::{Connection, OptionalExtension as _};

use super::{AuditRecord, ForwardRecord, SandboxRecord, StateError, SyncRecord, ops, seal::SealKey};
use crate::sandbox::SandboxManager;

/// A background process to start again when its sandbox comes back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestartJob {
    /// Its id.
    pub name: String,
    /// The shell line.
    pub command: String,
    /// Its working directory.
    pub workdir: String,
}

/// What the database kept of one sandbox.
#[derive(Debug, Default, Clone)]
pub struct Kept {
    /// Its row: image, size, lease. `None` when the database never saw it.
    pub record: Option<SandboxRecord>,
    /// Its env; `None` when none was recorded or it did not open.
    pub env: Option<BTreeMap<String, String>>,
    /// Its history, oldest first.
    pub history: Vec<AuditRecord>,
    /// Its port forwards.
    pub forwards: Vec<ForwardRecord>,
    /// Its sync jobs.
    pub syncs: Vec<SyncRecord>,
    /// Its background processes marked to restart.
    pub restart: Vec<RestartJob>,
}

/// The sealed name a restart job's command is bound to: it cannot be moved
/// to another job or sandbox, or read as an env value.
fn sealed_name(job: &str) -> String {
    format!("bg:{job}")
}

/// One sandbox's kept state, read in one transaction.
fn read(c: &mut Connection, key: &SealKey, name: &str) -> rusqlite::Result<Kept> {
    let tx = c.transaction()?;
    let mut kept = Kept {
        record: tx
            .query_row(
                &format!("SELECT {} FROM sandboxes WHERE name = ?1 AND destroying = 0", SandboxRecord::COLUMNS),
                [name],
                SandboxRecord::read,
            )
            .optional()?,
        // A value sealed under another key is not handed back: the sandbox
        // comes back without its env, and the notice says so.
        env: ops::env(&tx, key, name).ok().flatten(),
        ..Kept::default()
    };
    {
        let mut q =
            tx.prepare("SELECT command, exit_code, duration_ms, at FROM history WHERE sandbox = ?1 ORDER BY id")?;
        kept.history = q
            .query_map([name], |r| {
                Ok(AuditRecord {
                    command: r.get(0)?,
                    exit_code: r.get(1)?,
                    duration_ms: r.get::<_, i64>(2)? as u64,
                    at: r.get(3)?,
                })
            })?
            .collect::<rusqlite::Result<_>>()?;
        let mut q = tx.prepare("SELECT host_port, port FROM forwards WHERE sandbox = ?1 ORDER BY host_port")?;
        kept.forwards = q
            .query_map([name], |r| {
                Ok(ForwardRecord { host_port: r.get(0)?, sandbox: name.to_string(), port: r.get(1)? })
            })?
            .collect::<rusqlite::Result<_>>()?;
        let mut q = tx.prepare("SELECT id, local, dir, files_synced FROM sync_jobs WHERE sandbox = ?1 ORDER BY id")?;
        kept.syncs = q
            .query_map([name], |r| {
                Ok(SyncRecord {
                    id: r.get(0)?,
                    local: r.get::<_, String>(1)?.into(),
                    sandbox: name.to_string(),
                    dir: r.get(2)?,
                    files_synced: r.get::<_, i64>(3)? as u64,
                })
            })?
            .collect::<rusqlite::Result<_>>()?;
        let mut q = tx.prepare("SELECT name, command, workdir FROM bg_restart WHERE sandbox = ?1 ORDER BY name")?;
        let rows: Vec<(String, String, String)> =
            q.query_map([name], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?.collect::<rusqlite::Result<_>>()?;
        for (job, sealed, workdir) in rows {
            match key.open(name, &sealed_name(&job), &sealed) {
                Ok(command) => kept.restart.push(RestartJob { name: job, command, workdir }),
                Err(e) => tracing::warn!(sandbox = %name, job = %job, "a background process to restart is not: {e}"),
            }
        }
    }
    tx.finish()?;
    Ok(kept)
}

/// Put back what a comeback keeps (history, env, restart marks) in the
/// transaction that records its new row, which cleared them; `fresh` is the
/// env it started with, saved when none was kept.
pub(super) fn write_back(
    c: &Connection,
    key: &SealKey,
    name: &str,
    kept: &Kept,
    fresh: &BTreeMap<String, String>,
) -> rusqlite::Result<()> {
    for entry in &kept.history {
        ops::add_history(c, name, entry)?;
    }
    ops::put_env(c, key, name, kept.env.as_ref().unwrap_or(fresh))?;
    for job in &kept.restart {
        put_restart(c, key, name, &job.name, &job.command, &job.workdir)?;
    }
    Ok(())
}

/// Mark a background process to restart (replacing an earlier mark).
fn put_restart(
    c: &Connection,
    key: &SealKey,
    sandbox: &str,
    job: &str,
    command: &str,
    workdir: &str,
) -> rusqlite::Result<()> {
    let sealed = key
        .seal(sandbox, &sealed_name(job), command)
        .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
    c.execute(
        "INSERT OR REPLACE INTO bg_restart (sandbox, name, command, workdir) VALUES (?1, ?2, ?3, ?4)",
        (sandbox, job, sealed, workdir),
    )?;
    Ok(())
}

impl SandboxManager {
    /// What the database kept of `name`: empty when there is no database.
    pub(crate) async fn kept(&self, name: &str) -> Result<Kept, StateError> {
        let Some(store) = self.state.store.get() else { return Ok(Kept::default()) };
        let (name, key) = (name.to_string(), store.key().clone());
        store.call(move |c| read(c, &key, &name)).await
    }

    /// Mark (`Some`) or unmark a background process to start again when
    /// its sandbox comes back after a loss.
    pub(crate) async fn record_restart(
        &self,
        sandbox: &str,
        job: &str,
        restart: Option<(&str, &str)>,
    ) -> Result<(), StateError> {
        let (sandbox, job) = (sandbox.to_string(), job.to_string());
        let restart = restart.map(|(command, workdir)| (command.to_string(), workdir.to_string()));
        self.state
            .submit_sealed("a background process to restart", move |c, key| match restart {
                Some((command, workdir)) => put_restart(c, key, &sandbox, &job, &command, &workdir),
                None => {
                    c.execute("DELETE FROM bg_restart WHERE sandbox = ?1 AND name = ?2", (&sandbox, &job)).map(drop)
                }
            })
            .saved()
            .await
    }
}
