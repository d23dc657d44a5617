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
    // on open ([`seal_plaintext_env`]), and the file is then rewritten once
    // ([`scrub_if_pending`]) so no old value is left in it. No statement: the version alone keeps
    // an older sandbox-mcp, which would hand `sealed:v1:…` to commands as
    // the value, from using the file.
    "",
    // 5: background processes to start again when their sandbox comes back
    // after a loss (`bg(restart=true)`); the command is sealed like env.
    "CREATE TABLE bg_restart (
         sandbox TEXT NOT NULL,
         name TEXT NOT NULL,
         command TEXT NOT NULL,
         workdir TEXT NOT NULL,
         PRIMARY KEY (sandbox, name)
     );",
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
    seal_plaintext_env(&mut conn, key)?;
    scrub_if_pending(&conn);
    Ok(conn)
}

/// The schema version from which env values are sealed: a database from
/// before it may hold plaintext ones, current or left over.
const SEALED_ENV_VERSION: u32 = 4;

/// The `meta` row that says old plaintext may still be in the file and
/// [`scrub_if_pending`] has to run; set in the transaction that sealed it
/// (or migrated past [`SEALED_ENV_VERSION`]), removed once scrubbed, so the
/// cost is paid once and a crash in between only makes it run again.
const SCRUB_PENDING: &str = "scrub_plaintext_env";

/// Rewrite the whole file once plaintext env values were found: sealing
/// rewrites only the current rows, and `secure_delete` only what is deleted
/// from now on, but the put_env of earlier versions deleted and inserted a
/// row on every change, so values set before (and the current ones' old
/// cells) lie in free pages and freed cells. VACUUM (with `secure_delete`
/// on) builds the file anew from its live rows; a TRUNCATE checkpoint then
/// copies that over the old pages, cuts the file to size and empties the
/// WAL. Best effort: a VACUUM that fails (a full disk) leaves the mark for
/// the next open, and a reader in another process can hold the checkpoint
/// off until a later one. Returns whether the VACUUM ran.
fn scrub_if_pending(conn: &Connection) -> bool {
    let pending = conn.query_row("SELECT EXISTS (SELECT 1 FROM meta WHERE key = ?1)", [SCRUB_PENDING], |r| r.get(0));
    if !pending.unwrap_or(false) {
        return false;
    }
    if let Err(e) = conn.execute_batch("VACUUM") {
        tracing::warn!(
            "state database: VACUUM after sealing plaintext env values failed ({e}); tried again next start"
        );
        return false;
    }
    if let Err(e) = conn.execute("DELETE FROM meta WHERE key = ?1", [SCRUB_PENDING]) {
        tracing::warn!("state database: cannot clear the scrub mark ({e}); the VACUUM runs again next start");
    }
    match conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get::<_, i64>(0)) {
        Ok(0) => {}
        Ok(_) => tracing::info!("state database: another process holds the WAL; a later checkpoint empties it"),
        Err(e) => tracing::warn!("state database: checkpoint after VACUUM failed: {e}"),
    }
    true
}

/// Seal, in place, env values a version before sealing stored as plaintext;
/// returns how many there were. Marks the file for [`scrub_if_pending`]
/// when there were any.
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
    if !plain.is_empty() {
        tx.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?1, '')", [SCRUB_PENDING])?;
    }
    tx.commit()?;
    Ok(plain.len())
}

/// Bring the schema up to date in one transaction (another process opening
/// the same file at once waits, then sees the new version). A database from
/// before sealed env values is marked for [`scrub_if_pending`] even when no
/// env row is left to seal: a deleted one may still be in a free page.
fn migrate(conn: &mut Connection) -> Result<(), Open> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let version: u32 = tx.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if version as usize > MIGRATIONS.len() {
        return Err(Open::Newer(version));
    }
    for step in &MIGRATIONS[version as usize..] {
        tx.execute_batch(step)?;
    }
    if (1..SEALED_ENV_VERSION).contains(&version) {
        tx.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?1, '')", [SCRUB_PENDING])?;
    }
    tx.pragma_update(None, "user_version", MIGRATIONS.len() as u32)?;
    tx.commit()?;
    Ok(())
}

/// Move a damaged database (and its WAL and shared-memory files) to
/// `<name>.damaged-<unix seconds>-<pid>-<n>`, the first such name free: an
/// earlier copy is never overwritten (a hard link fails if the name exists).
fn set_aside(path: &Path) -> Result<PathBuf, StateError> {
    let stamp = sandbox_base::clock::unix_secs();
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
    use sandbox_base::test_support::scratch_dir;

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
            assert!(!scrub_if_pending(&conn), "a new database has no plaintext to scrub");
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_database_from_before_projects_keeps_its_rows_in_the_legacy_project() {
        let dir = scratch_dir("store-v1");
        let path = dir.join("state.db");
        // Written by the build before projects: sandbox `default`, its env and history.
        std::fs::copy(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/state_v1.db"), &path).unwrap();
        // An env value changed twice as put_env did before sealing: each
        // change deleted the row and inserted it anew, without
        // secure_delete. The first value is long enough to spill into
        // overflow pages, which the change left on the free list; the
        // second one's cell stays in its page, freed (the shorter third
        // takes only the end of it).
        let first = "first-plaintext-value-".repeat(300);
        let second = "second-plaintext-value-".repeat(10);
        let values = [first.as_str(), second.as_str(), "third-plaintext-value"];
        let old = Connection::open(&path).unwrap();
        old.pragma_update(None, "secure_delete", "OFF").unwrap();
        for value in values {
            old.execute("DELETE FROM env WHERE sandbox = 'default' AND key = 'TOKEN'", []).unwrap();
            old.execute("INSERT INTO env (sandbox, key, value) VALUES ('default', 'TOKEN', ?1)", [value]).unwrap();
        }
        let free: u32 = old.query_row("PRAGMA freelist_count", [], |r| r.get(0)).unwrap();
        assert!(free > 0, "the first value's pages are free");
        drop(old);
        let wal = path.with_file_name("state.db-wal");
        let head = |value: &str| value[..value.len().min(22)].to_string();
        let holds = |file: &Path, value: &str| {
            let bytes = std::fs::read(file).unwrap_or_default();
            bytes.windows(head(value).len()).any(|w| w == head(value).as_bytes())
        };
        for value in values {
            assert!(holds(&path, value), "before: {}", head(value));
        }
        let key = key_beside(&path);
        let conn = connect(&path, &key).ok().unwrap();
        // None of them is left anywhere in the files: not the current one
        // (sealed), nor the older ones (the file was rewritten), nor in the WAL.
        for value in values {
            assert!(!holds(&path, value) && !holds(&wal, value), "after: {}", head(value));
        }
        let token: String = conn.query_row("SELECT value FROM env WHERE key = 'TOKEN'", [], |r| r.get(0)).unwrap();
        assert_eq!(key.open("default", "TOKEN", &token).unwrap(), "third-plaintext-value");
        assert!(!scrub_if_pending(&conn), "scrubbed once, then not again");
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
    fn a_database_from_before_sealing_is_scrubbed_with_no_plaintext_row_left() {
        let dir = scratch_dir("store-v1-deleted");
        let path = dir.join("state.db");
        std::fs::copy(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/state_v1.db"), &path).unwrap();
        // Every env value was removed before the upgrade: nothing to seal,
        // but a removed value still lies in the file's free pages.
        let gone = "removed-plaintext-value-".repeat(300);
        let old = Connection::open(&path).unwrap();
        old.pragma_update(None, "secure_delete", "OFF").unwrap();
        old.execute("INSERT INTO env (sandbox, key, value) VALUES ('default', 'GONE', ?1)", [&gone]).unwrap();
        old.execute("DELETE FROM env", []).unwrap();
        drop(old);
        let holds = |file: &Path| {
            let bytes = std::fs::read(file).unwrap_or_default();
            bytes.windows(24).any(|w| w == b"removed-plaintext-value-")
        };
        assert!(holds(&path));
        let conn = connect(&path, &key_beside(&path)).ok().unwrap();
        assert!(!holds(&path) && !holds(&path.with_file_name("state.db-wal")));
        assert!(!scrub_if_pending(&conn));
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
