//! The JSON state file earlier versions wrote (`state.json`, schema v2),
//! imported into the database once and then renamed to
//! `state.json.imported`, so it is never imported twice and never lost.
use std::{collections::BTreeMap, path::Path};

use rusqlite::Connection;
use serde::Deserialize;

use super::{AuditRecord, ForwardRecord, SandboxRecord, StateError, SyncRecord, ops};
use crate::spawn::SpawnState;

/// The whole file, as schema v2 wrote it.
#[derive(Debug, Default, Deserialize)]
struct StateFile {
    #[serde(default)]
    schema_version: u32,
    #[serde(flatten)]
    spawn: SpawnState,
    #[serde(default)]
    sandboxes: BTreeMap<String, FileSandbox>,
    #[serde(default)]
    forwards: Vec<ForwardRecord>,
    #[serde(default)]
    sync_jobs: Vec<SyncRecord>,
    #[serde(default)]
    lost: BTreeMap<String, String>,
}

/// One sandbox of the file.
#[derive(Debug, Default, Deserialize)]
struct FileSandbox {
    #[serde(default)]
    image: String,
    #[serde(default)]
    parent: Option<String>,
    #[serde(default)]
    created_at: f64,
    #[serde(default)]
    expires_at: Option<f64>,
    #[serde(default)]
    cpus: u32,
    #[serde(default)]
    memory_mb: u64,
    #[serde(default)]
    generation: u32,
    #[serde(default)]
    audit: Vec<AuditRecord>,
}

/// Set in `meta` in the transaction that imported the file.
const IMPORTED_KEY: &str = "imported_state_json";

/// What became of the file.
#[derive(Debug, PartialEq, Eq)]
pub enum Imported {
    /// There was none.
    Nothing,
    /// Its contents are in the database now.
    Done,
}

/// Import `file` into the database in one transaction, then rename it to
/// `<file>.imported`. A file that is not v2 JSON is renamed aside too (its
/// contents stay on disk) and reported; v1 files (no version) held nothing
/// the helper does not know.
pub fn import(conn: &mut Connection, file: &Path) -> Result<Imported, StateError> {
    let io = |what| {
        let path = file.display().to_string();
        move |source| StateError::Io { what, path, source }
    };
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Imported::Nothing),
        Err(e) => return Err(io("reading")(e)),
    };
    let imported = file.with_file_name(format!(
        "{}.imported",
        file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
    ));
    let parsed = match serde_json::from_str::<serde_json::Value>(&text) {
        Ok(v) if v.get("schema_version").is_none() => Ok(StateFile::default()),
        Ok(v) => {
            serde_json::from_value::<StateFile>(v).map_err(|e| e.to_string()).and_then(|s| match s.schema_version {
                2 => Ok(s),
                n => Err(format!("unknown schema_version {n}")),
            })
        }
        Err(e) => Err(e.to_string()),
    };
    let state = match parsed {
        Ok(state) => state,
        Err(reason) => {
            std::fs::rename(file, &imported).map_err(io("renaming"))?;
            return Err(StateError::Unimportable {
                path: file.display().to_string(),
                reason,
                moved_to: imported.display().to_string(),
            });
        }
    };
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    // Imported already (a crash came between the commit and the rename):
    // only the rename is left to do.
    let done: bool = tx.query_row("SELECT EXISTS (SELECT 1 FROM meta WHERE key = ?1)", [IMPORTED_KEY], |r| r.get(0))?;
    if !done {
        for (name, s) in &state.sandboxes {
            let record = SandboxRecord {
                name: name.clone(),
                image: s.image.clone(),
                parent: s.parent.clone(),
                created_at: s.created_at,
                expires_at: s.expires_at,
                cpus: s.cpus,
                memory_mb: s.memory_mb,
                generation: s.generation,
                project: None,
            };
            ops::put_sandbox(&tx, &record)?;
            for a in &s.audit {
                ops::add_history(&tx, name, a)?;
            }
        }
        for f in &state.forwards {
            ops::put_forward(&tx, f)?;
        }
        for j in &state.sync_jobs {
            ops::put_sync(&tx, j)?;
        }
        for (name, why) in &state.lost {
            ops::put_lost(&tx, name, why)?;
        }
        ops::put_spawn(&tx, &state.spawn)?;
        tx.execute("INSERT INTO meta (key, value) VALUES (?1, ?2)", (IMPORTED_KEY, file.display().to_string()))?;
    }
    tx.commit()?;
    std::fs::rename(file, &imported).map_err(io("renaming"))?;
    Ok(Imported::Done)
}
