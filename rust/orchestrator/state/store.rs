//! The database: opening it (WAL, busy timeout, schema migrations), setting
//! a damaged one aside, and the one thread that talks to it.
//!
//! SQLite calls block, so they never run on the async runtime: every call is
//! a job for a dedicated thread, handed over through a channel and answered
//! through a oneshot. Jobs run in the order they were submitted, so a change
//! submitted from synchronous code is committed before any change submitted
//! after it is.
use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use std::sync::Arc;

use rusqlite::{Connection, ErrorCode, OpenFlags};

use super::{
    StateError,
    seal::{self, SealKey},
};

/// Each migration takes the schema from version `index` to `index + 1`
/// (`PRAGMA user_version`). Append only: a released step is never edited.
const MIGRATIONS: &[&str] = &[
    // 1: the first schema.
    "CREATE TABLE sandboxes (
         name TEXT PRIMARY KEY,
         image TEXT NOT NULL,
         parent TEXT,
         created_at REAL NOT NULL,
         expires_at REAL,
         cpus INTEGER NOT NULL,
         memory_mb INTEGER NOT NULL,
         generation INTEGER NOT NULL,
         destroying INTEGER NOT NULL DEFAULT 0
     );
     CREATE TABLE history (
         id INTEGER PRIMARY KEY AUTOINCREMENT,
         sandbox TEXT NOT NULL,
         command TEXT NOT NULL,
         exit_code INTEGER NOT NULL,
         duration_ms INTEGER NOT NULL,
         at REAL NOT NULL
     );
     CREATE INDEX history_by_sandbox ON history (sandbox, id);
     CREATE TABLE env (
         sandbox TEXT NOT NULL,
         key TEXT NOT NULL,
         value TEXT NOT NULL,
         PRIMARY KEY (sandbox, key)
     );
     CREATE TABLE env_known (sandbox TEXT PRIMARY KEY);
     CREATE TABLE forwards (host_port INTEGER PRIMARY KEY, sandbox TEXT NOT NULL, port INTEGER NOT NULL);
     CREATE TABLE sync_jobs (
         id TEXT PRIMARY KEY,
         local TEXT NOT NULL,
         sandbox TEXT NOT NULL,
         dir TEXT NOT NULL,
         files_synced INTEGER NOT NULL
     );
     CREATE TABLE lost (name TEXT PRIMARY KEY, reason TEXT NOT NULL);
     CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);",
    // 2: sandbox names belong to a project: the canonical path of its
    // directory. Rows from before (NULL) are the `legacy` project's.
    "ALTER TABLE sandboxes ADD COLUMN project TEXT;",
    // 3: what a later use of a reaped child's name is told, so a restart
    // does not turn it into a bare "no such sandbox".
    "CREATE TABLE gone_children (name TEXT PRIMARY KEY, message TEXT NOT NULL);",
    // 4: env values are sealed (`seal`); plaintext ones are sealed in place
    // on open ([`seal_plaintext_env`]). No statement: the version alone keeps
    // an older sandbox-mcp, which would hand `sealed:v1:…` to commands as
    // the value, from using the file.
    "",
];

/// How long a writer waits for another process's transaction to end.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

type Job = Box<dyn FnOnce(&mut Connection) + Send>;

/// The handle every part of the orchestrator records its changes through.
#[derive(Clone)]
pub struct Store {
    jobs: std::sync::mpsc::Sender<Job>,
    /// What env values are sealed with.
    key: Arc<SealKey>,
}

/// A database that could not be read and was put aside.
#[derive(Debug, Clone)]
pub struct SetAside {
    /// Why it was unreadable.
    pub reason: String,
    /// Where it is now.
    pub moved_to: PathBuf,
}

impl Store {
    /// Open (creating) the database at `path` and start its thread. A
    /// damaged database is set aside under a name no earlier one has, and a
    /// fresh one takes its place; that is reported in the second value.
    /// Without its env key (made on first use) nothing is opened: sealed
    /// values could be neither read nor written.
    pub fn open(path: &Path) -> Result<(Self, Option<SetAside>), StateError> {
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(|source| StateError::Io {
            what: "creating",
            path: dir.display().to_string(),
            source,
        })?;
        let key = Arc::new(SealKey::load_or_create(&seal::key_path(path))?);
        let (conn, set_aside) = match connect(path, &key) {
            Ok(conn) => (conn, None),
            Err(Open::Damaged(reason)) => {
                let moved_to = set_aside(path)?;
                tracing::warn!(
                    "state database {} is unreadable ({reason}); it was moved to {} and a new one started",
                    path.display(),
                    moved_to.display()
                );
                let conn = connect(path, &key).map_err(|e| e.into_error(path))?;
                (conn, Some(SetAside { reason, moved_to }))
            }
            Err(e) => return Err(e.into_error(path)),
        };
        let (jobs, rx) = std::sync::mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("state-db".into())
            .spawn(move || {
                let mut conn = conn;
                for job in rx {
                    job(&mut conn);
                }
            })
            .map_err(|source| StateError::Io {
                what: "starting the thread for",
                path: path.display().to_string(),
                source,
            })?;
        Ok((Self { jobs, key }, set_aside))
    }

    /// What env values are sealed with.
    pub fn key(&self) -> &Arc<SealKey> {
        &self.key
    }

    /// Run `f` on the database thread. It is queued now (also when the
    /// returned future is dropped unpolled); the future ends when it ran.
    pub fn call<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> impl Future<Output = Result<T, StateError>> + Send + 'static {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let queued = self
            .jobs
            .send(Box::new(move |conn: &mut Connection| {
                let _ = tx.send(f(conn));
            }))
            .is_ok();
        async move {
            if !queued {
                return Err(StateError::Closed);
            }
            match rx.await {
                Ok(result) => result.map_err(StateError::from),
                Err(_) => Err(StateError::Closed),
            }
        }
    }
}

/// Why opening failed.
enum Open {
    /// The file is not a database we can use; set it aside.
    Damaged(String),
    /// Written by a newer sandbox-mcp: never touched.
    Newer(u32),
    /// Anything else (busy, permissions): nothing is moved.
    Failed(rusqlite::Error),
}

impl Open {
    fn into_error(self, path: &Path) -> StateError {
        let path = path.display().to_string();
        match self {
            Open::Damaged(reason) => StateError::Damaged { path, reason },
            Open::Newer(version) => StateError::Newer { path, version },
            Open::Failed(source) => StateError::Open { path, source },
        }
    }
}

impl From<rusqlite::Error> for Open {
    fn from(e: rusqlite::Error) -> Self {
        match e.sqlite_error_code() {
            Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => Open::Damaged(e.to_string()),
            _ => Open::Failed(e),
        }
    }
}

fn connect(path: &Path, key: &SealKey) -> Result<Connection, Open> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let mut conn = Connection::open_with_flags(path, flags)?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    // WAL: readers never block the writer, and several server processes can
    // share the file. synchronous=NORMAL commits a transaction by write()
    // into the WAL without an fsync: the data is in the kernel's page cache
    // the moment the commit returns, so a kill -9 of any process loses
    // nothing acknowledged; only a power cut or kernel crash can lose the
    // newest commits (never corrupt the database). FULL would add an fsync
    // to every exec's history entry.
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    // Deleted rows are overwritten, not left in free pages: a plaintext env
    // value sealed in place, a history entry pruned.
    conn.pragma_update(None, "secure_delete", "ON")?;
    let check: String = conn.query_row("PRAGMA quick_check", [], |r| r.get(0))?;
    if check != "ok" {
        return Err(Open::Damaged(format!("integrity check: {check}")));
    }
    migrate(&mut conn)?;
    if seal_plaintext_env(&mut conn, key)? > 0 {
        // The plaintext's pages in the database file are rewritten now
        // rather than at some later checkpoint. Best effort: another
        // process reading keeps the WAL, and the next checkpoint does it.
        let _ = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()));
    }
    Ok(conn)
}

/// Seal, in place, env values a version before sealing stored as plaintext;
/// returns how many there were.
fn seal_plaintext_env(conn: &mut Connection, key: &SealKey) -> Result<usize, Open> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let plain: Vec<(String, String, String)> = {
        let mut q = tx.prepare("SELECT sandbox, key, value FROM env")?;
        let rows = q.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
        rows.filter(|r| r.as_ref().is_ok_and(|(_, _, v): &(String, String, String)| !seal::is_sealed(v)))
            .collect::<rusqlite::Result<_>>()?
    };
    for (sandbox, name, value) in &plain {
        let sealed = key
            .seal(sandbox, name, value)
            .map_err(|e| Open::Failed(rusqlite::Error::ToSqlConversionFailure(Box::new(e))))?;
        tx.execute("UPDATE env SET value = ?3 WHERE sandbox = ?1 AND key = ?2", (sandbox, name, sealed))?;
    }
    tx.commit()?;
    Ok(plain.len())
}

/// Bring the schema up to date in one transaction (another process opening
/// the same file at once waits, then sees the new version).
fn migrate(conn: &mut Connection) -> Result<(), Open> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let version: u32 = tx.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if version as usize > MIGRATIONS.len() {
        return Err(Open::Newer(version));
    }
    for step in &MIGRATIONS[version as usize..] {
        tx.execute_batch(step)?;
    }
    tx.pragma_update(None, "user_version", MIGRATIONS.len() as u32)?;
    tx.commit()?;
    Ok(())
}

/// Move a damaged database (and its WAL and shared-memory files) to
/// `<name>.damaged-<unix seconds>-<pid>-<n>`, the first such name free: an
/// earlier copy is never overwritten (a hard link fails if the name exists).
fn set_aside(path: &Path) -> Result<PathBuf, StateError> {
    let stamp = crate::clock::unix_secs();
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let io = |what, p: &Path| {
        let path = p.display().to_string();
        move |source| StateError::Io { what, path, source }
    };
    for n in 0.. {
        let aside = path.with_file_name(format!("{name}.damaged-{stamp}-{}-{n}", std::process::id()));
        match std::fs::hard_link(path, &aside) {
            Ok(()) => {
                std::fs::remove_file(path).map_err(io("removing", path))?;
                for suffix in ["-wal", "-shm"] {
                    let side = path.with_file_name(format!("{name}{suffix}"));
                    match std::fs::rename(&side, aside.with_file_name(format!("{}{suffix}", aside.display()))) {
                        Ok(()) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(e) => return Err(io("moving aside", &side)(e)),
                    }
                }
                return Ok(aside);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io("moving aside", path)(e)),
        }
    }
    unreachable!("an unbounded counter always finds a free name")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::scratch_dir;

    fn key_beside(db: &Path) -> SealKey {
        SealKey::load_or_create(&seal::key_path(db)).unwrap()
    }

    #[test]
    fn migrates_to_the_newest_version_once() {
        let dir = scratch_dir("store-migrate");
        let path = dir.join("state.db");
        let key = key_beside(&path);
        for _ in 0..2 {
            let conn = connect(&path, &key).ok().unwrap();
            let v: u32 = conn.query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap();
            assert_eq!(v as usize, MIGRATIONS.len());
            let mode: String = conn.query_row("PRAGMA journal_mode", [], |r| r.get(0)).unwrap();
            assert_eq!(mode, "wal");
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_database_from_before_projects_keeps_its_rows_in_the_legacy_project() {
        let dir = scratch_dir("store-v1");
        let path = dir.join("state.db");
        // Written by the build before projects: sandbox `default`, its env and history.
        std::fs::copy(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/state_v1.db"), &path).unwrap();
        let key = key_beside(&path);
        let conn = connect(&path, &key).ok().unwrap();
        let v: u32 = conn.query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap();
        assert_eq!(v as usize, MIGRATIONS.len());
        let project: Option<String> =
            conn.query_row("SELECT project FROM sandboxes WHERE name = 'default'", [], |r| r.get(0)).unwrap();
        assert_eq!(project, None);
        let command: String =
            conn.query_row("SELECT command FROM history WHERE sandbox = 'default'", [], |r| r.get(0)).unwrap();
        assert_eq!(command, "echo made-by-main");
        // Its plaintext env value was sealed in place, and opens again.
        let env: String = conn.query_row("SELECT value FROM env WHERE key = 'OLD'", [], |r| r.get(0)).unwrap();
        assert!(seal::is_sealed(&env), "{env}");
        assert_eq!(key.open("default", "OLD", &env).unwrap(), "1");
        drop(conn);
        // Sealed once: a second open leaves the sealed value as it is.
        let conn = connect(&path, &key).ok().unwrap();
        let again: String = conn.query_row("SELECT value FROM env WHERE key = 'OLD'", [], |r| r.get(0)).unwrap();
        assert_eq!(again, env);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_newer_schema_is_refused_and_left_alone() {
        let dir = scratch_dir("store-newer");
        let path = dir.join("state.db");
        drop(connect(&path, &key_beside(&path)).ok().unwrap());
        Connection::open(&path).unwrap().pragma_update(None, "user_version", 999).unwrap();
        let Err(err) = Store::open(&path) else { panic!("opened a newer schema") };
        assert!(matches!(err, StateError::Newer { version: 999, .. }), "{err}");
        assert!(err.to_string().contains("newer sandbox-mcp"), "{err}");
        assert!(
            std::fs::read_dir(&dir).unwrap().all(|e| !e.unwrap().file_name().to_string_lossy().contains("damaged"))
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn damaged_copies_never_overwrite_each_other() {
        let dir = scratch_dir("store-aside");
        let path = dir.join("state.db");
        std::fs::write(&path, "garbage one, not a database").unwrap();
        let (_store, aside) = Store::open(&path).unwrap();
        let first = aside.expect("set aside").moved_to;
        assert_eq!(std::fs::read_to_string(&first).unwrap(), "garbage one, not a database");
        // The same second, the same process: still a name of its own.
        let second = set_aside(&path).unwrap();
        assert_ne!(first, second);
        assert_eq!(std::fs::read_to_string(&first).unwrap(), "garbage one, not a database");
        assert!(second.exists() && !path.exists());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
