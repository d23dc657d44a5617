//! Sync jobs: one-way mirroring of a host directory into a sandbox. A job
//! pushes the whole tree once (one tar stream through CopyIn), then watches
//! it with inotify (`notify`) and mirrors each debounced batch of changes:
//! changed paths as one tar, deleted paths as one `rm -rf --` argv. Ignored
//! paths (fixed names plus the root's .gitignore) are never sent.
use std::{
    collections::{BTreeMap, BTreeSet},
    ffi::OsStr,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use ignore::gitignore::{Gitignore, GitignoreBuilder};
use notify::{
    EventKind, RecursiveMode, Watcher,
    event::{AccessKind, AccessMode},
};
use tokio::{
    sync::mpsc,
    task::JoinHandle,
    time::{Instant, timeout},
};

use super::{
    OrchestratorError, Sandbox, SandboxManager,
    files::resolve,
    hostfs::{Dir, HostFsError, Kind},
    hostpath::{Entry, HostPath, expand_home},
    project::ProjectConfig,
    sandbox::Command,
    state::SyncRecord,
    tarstream,
};

/// Names never synced, wherever they appear in the tree (sorted, as shown).
pub const IGNORED_NAMES: [&str; 6] = [".DS_Store", ".git", ".venv", "__pycache__", "node_modules", "venv"];
/// Quiet time that ends a batch: editors write a file in several events.
const DEBOUNCE: Duration = Duration::from_millis(15);
/// Upper bound on one batch, so a tree that never goes quiet still syncs.
const MAX_BATCH: Duration = Duration::from_millis(250);
/// How often an idle job checks that its sandbox still exists.
const CHECK_EVERY: Duration = Duration::from_secs(1);
/// After a failed push, the whole tree goes again this much later, twice
/// as long after each failure in a row, up to [`RETRY_MOST`].
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_MOST: Duration = Duration::from_secs(60);
/// How long a missing sandbox may take to come back (a `reset` in progress).
const GONE_GRACE: Duration = Duration::from_secs(3);
/// Paths per `rm` process, well below ARG_MAX.
const RM_BATCH: usize = 512;
const RM_TIMEOUT: Duration = Duration::from_secs(60);

/// Why a sync job could not be started or found.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// The host path is not a directory.
    #[error("{0} is not a directory")]
    NotADirectory(String),
    /// No job with that id.
    #[error("no sync job '{id}'. Active: {active}")]
    NoSuchJob {
        /// The id asked for.
        id: String,
        /// Ids of running jobs, or `none`.
        active: String,
    },
    /// The directory could not be watched.
    #[error("cannot watch {path}: {source}")]
    Watch {
        /// The host directory.
        path: String,
        /// The watcher's error.
        source: notify::Error,
    },
    /// The initial full push failed; no job was started.
    #[error("initial sync of {path} failed, sync not started: {reason}")]
    InitialPush {
        /// The host directory.
        path: String,
        /// What failed.
        reason: String,
    },
    /// The sandbox could not be found or created, or a path was invalid.
    #[error(transparent)]
    Orchestrator(#[from] OrchestratorError),
}

/// A sync job as reported to clients.
#[derive(Debug, Clone)]
pub struct SyncInfo {
    /// `sync-<6 hex>`.
    pub id: String,
    /// Host directory (resolved).
    pub local: PathBuf,
    /// Sandbox name.
    pub sandbox: String,
    /// Directory inside the sandbox.
    pub dir: String,
    /// Files pushed so far, the initial push included.
    pub files_synced: u64,
    /// Batches that failed (each was logged).
    pub errors: u64,
}

#[derive(Default)]
struct Counters {
    files: AtomicU64,
    errors: AtomicU64,
}

/// What a job mirrors, shared by its task.
struct JobSpec {
    id: String,
    /// The directory as the caller named it.
    root: PathBuf,
    /// Where it is under the host roots: every push walks to it afresh.
    location: HostPath,
    sandbox: String,
    dir: String,
    /// The project file's `sync.exclude`, kept to rebuild the filter when
    /// .gitignore changes.
    exclude: Vec<String>,
    counters: Counters,
}

impl JobSpec {
    fn info(&self) -> SyncInfo {
        SyncInfo {
            id: self.id.clone(),
            local: self.root.clone(),
            sandbox: self.sandbox.clone(),
            dir: self.dir.clone(),
            files_synced: self.counters.files.load(Ordering::Relaxed),
            errors: self.counters.errors.load(Ordering::Relaxed),
        }
    }
}

struct Job {
    spec: Arc<JobSpec>,
    task: JoinHandle<()>,
}

type Jobs = Arc<Mutex<BTreeMap<String, Job>>>;

fn lock(jobs: &Jobs) -> std::sync::MutexGuard<'_, BTreeMap<String, Job>> {
    jobs.lock().unwrap_or_else(|p| p.into_inner())
}

/// Every running sync job.
pub struct SyncManager {
    sandboxes: Arc<SandboxManager>,
    jobs: Jobs,
}

/// Which paths are never sent: [`IGNORED_NAMES`] anywhere, and what the
/// root's .gitignore ignores.
pub struct Filter {
    gitignore: Gitignore,
}

impl Filter {
    /// The filter for the directory `root`: its .gitignore if present (read
    /// through the fd, never followed if a symlink), plus `extra` lines in
    /// gitignore syntax (the project file's `sync.exclude`).
    pub fn load(root: &Dir, extra: &[String]) -> Self {
        let mut builder = GitignoreBuilder::new(root.path());
        for line in extra {
            if let Err(e) = builder.add_line(None, line) {
                tracing::warn!("sync.exclude {line:?}: {e}");
            }
        }
        let file = root.path().join(".gitignore");
        match root.read_to_string(OsStr::new(".gitignore")) {
            Ok(Some(text)) => {
                for line in text.lines() {
                    if let Err(e) = builder.add_line(Some(file.clone()), line) {
                        tracing::warn!("{}: {e} (valid lines still apply)", file.display());
                    }
                }
            }
            Ok(None) => {}
            Err(e) => tracing::warn!("not using .gitignore: {e}"),
        }
        let gitignore = builder.build().unwrap_or_else(|e| {
            tracing::warn!("{}: {e}; ignoring it", file.display());
            Gitignore::empty()
        });
        Self { gitignore }
    }

    /// Whether `rel` (relative to the root) is ignored; `is_dir` is `None`
    /// for a path that no longer exists (ignored if either kind would be).
    pub fn ignored(&self, rel: &Path, is_dir: Option<bool>) -> bool {
        if rel.components().any(|c| IGNORED_NAMES.iter().any(|n| c.as_os_str() == *n)) {
            return true;
        }
        let matches = |d: bool| self.gitignore.matched_path_or_any_parents(rel, d).is_ignore();
        match is_dir {
            Some(d) => matches(d),
            None => matches(false) || matches(true),
        }
    }
}

impl SyncManager {
    /// Sync jobs into the sandboxes of `sandboxes`.
    pub fn new(sandboxes: Arc<SandboxManager>) -> Self {
        Self { sandboxes, jobs: Arc::default() }
    }

    /// Push `local_dir` (under the host roots) to `sandbox_dir` in the sandbox
    /// (created on first use) and keep mirroring it. Returns the job and the
    /// number of files of the initial push; if that push fails, no job runs.
    pub async fn start(&self, local_dir: &str, sandbox_dir: &str, sandbox: &str) -> Result<(SyncInfo, u64), SyncError> {
        self.start_job(local_dir, sandbox_dir, sandbox, None, 0).await
    }

    /// Bring back a job saved before an orchestrator restart, under its id:
    /// a full push first catches whatever changed while nobody watched.
    pub async fn resume(
        &self,
        id: &str,
        local: &Path,
        sandbox_dir: &str,
        sandbox: &str,
        files_synced: u64,
    ) -> Result<SyncInfo, SyncError> {
        let local = local.to_string_lossy();
        Ok(self.start_job(&local, sandbox_dir, sandbox, Some(id.to_string()), files_synced).await?.0)
    }

    async fn start_job(
        &self,
        local_dir: &str,
        sandbox_dir: &str,
        sandbox: &str,
        id: Option<String>,
        files_before: u64,
    ) -> Result<(SyncInfo, u64), SyncError> {
        let location = self.sandboxes.config().host_roots.locate(local_dir).map_err(OrchestratorError::from)?;
        let Entry::Dir(root_dir) = location.open().map_err(OrchestratorError::from)? else {
            return Err(SyncError::NotADirectory(expand_home(local_dir).display().to_string()));
        };
        let root = location.shown().to_path_buf();
        let dir = resolve(sandbox_dir)?;
        let dir = if dir.len() > 1 { dir.trim_end_matches('/').to_string() } else { dir };
        let sb = self.sandboxes.get_or_create(sandbox).await?;
        // Watch before the initial push, so nothing changed during it is missed.
        let (tx, events) = mpsc::unbounded_channel();
        let watch_err = |source| SyncError::Watch { path: root.display().to_string(), source };
        let config = notify::Config::default().with_follow_symlinks(false);
        let mut watcher = notify::RecommendedWatcher::new(event_handler(tx), config).map_err(watch_err)?;
        watcher.watch(&root, RecursiveMode::Recursive).map_err(watch_err)?;
        let exclude = match ProjectConfig::load(&self.sandboxes.config().project_dir)? {
            Some((_, project)) => project.sync_exclude,
            None => Vec::new(),
        };
        let filter = Arc::new(Filter::load(&root_dir, &exclude));
        drop(root_dir);
        let id = match id {
            Some(id) if !lock(&self.jobs).contains_key(&id) => id,
            _ => new_id(&lock(&self.jobs)),
        };
        let spec = Arc::new(JobSpec {
            id: id.clone(),
            root,
            location,
            sandbox: sb.name.clone(),
            dir,
            exclude,
            counters: Counters::default(),
        });
        let initial = push(&self.sandboxes, &spec, &sb, &filter, vec![PathBuf::new()])
            .await
            .map_err(|reason| SyncError::InitialPush { path: spec.root.display().to_string(), reason })?;
        spec.counters.files.store(files_before + initial, Ordering::Relaxed);
        let ctx = JobCtx {
            spec: spec.clone(),
            sandboxes: self.sandboxes.clone(),
            filter,
            current: sb,
            jobs: self.jobs.clone(),
        };
        // Spawned under the lock: a job that ends at once cannot remove
        // itself before it was inserted.
        {
            let mut jobs = lock(&self.jobs);
            let task = tokio::spawn(ctx.run(events, watcher));
            jobs.insert(id.clone(), Job { spec: spec.clone(), task });
        }
        let saved = self.sandboxes.record_sync(SyncRecord {
            id: id.clone(),
            local: spec.root.clone(),
            sandbox: spec.sandbox.clone(),
            dir: spec.dir.clone(),
            files_synced: files_before + initial,
        });
        if let Err(e) = saved.saved().await {
            // Not started: a job a restart would not bring back. The files
            // pushed so far stay in the sandbox.
            let job = lock(&self.jobs).remove(&id);
            if let Some(job) = job {
                end(job).await;
            }
            return Err(OrchestratorError::from(e).into());
        }
        tracing::info!(job = %id, sandbox = %spec.sandbox, local = %spec.root.display(), dir = %spec.dir, initial, "sync started");
        Ok((spec.info(), initial))
    }

    /// Stop a job; it has stopped watching when this returns.
    pub async fn stop(&self, id: &str) -> Result<SyncInfo, SyncError> {
        let no_job = || {
            let jobs = lock(&self.jobs);
            let ids: Vec<&str> = jobs.keys().map(String::as_str).collect();
            let active = if ids.is_empty() { "none".to_string() } else { ids.join(", ") };
            SyncError::NoSuchJob { id: id.to_string(), active }
        };
        if !lock(&self.jobs).contains_key(id) {
            return Err(no_job());
        }
        // Saved before it stops: a job a restart would bring back keeps
        // running, and the answer says why.
        self.sandboxes.record_unsync(id).saved().await.map_err(OrchestratorError::from)?;
        // Another stop may have taken it meanwhile.
        let job = lock(&self.jobs).remove(id);
        match job {
            Some(job) => Ok(end(job).await),
            None => Err(no_job()),
        }
    }

    /// Stop every job into `sandbox` (call when it is destroyed or reaped).
    /// With `keep`, the state database keeps them for the sandbox's
    /// comeback after a loss.
    pub async fn stop_for(&self, sandbox: &str, keep: bool) -> Vec<SyncInfo> {
        let gone: Vec<Job> = {
            let mut jobs = lock(&self.jobs);
            let ids: Vec<String> =
                jobs.iter().filter(|(_, j)| j.spec.sandbox == sandbox).map(|(id, _)| id.clone()).collect();
            ids.iter().filter_map(|id| jobs.remove(id)).collect()
        };
        let mut stopped = Vec::new();
        for job in gone {
            if !keep {
                self.sandboxes.record_unsync(&job.spec.id).in_background();
            }
            stopped.push(end(job).await);
        }
        stopped
    }

    /// Every running job, by id.
    pub fn list(&self) -> Vec<SyncInfo> {
        lock(&self.jobs).values().map(|j| j.spec.info()).collect()
    }
}

async fn end(job: Job) -> SyncInfo {
    job.task.abort();
    let _ = job.task.await;
    tracing::info!(job = %job.spec.id, "sync stopped");
    job.spec.info()
}

fn new_id(jobs: &BTreeMap<String, Job>) -> String {
    loop {
        let id = format!("sync-{}", super::names::random_hex(6));
        if !jobs.contains_key(&id) {
            return id;
        }
    }
}

/// One thing the watcher saw.
enum Change {
    Path(PathBuf),
    /// The kernel dropped events: only a full push is safe.
    Rescan,
}

/// Forwards the watcher's events (on its own thread) to the job's task.
/// Opens and reads are dropped: the job's own tar reads would otherwise
/// trigger it again, forever.
fn event_handler(tx: mpsc::UnboundedSender<Change>) -> impl notify::EventHandler {
    move |res: notify::Result<notify::Event>| match res {
        Ok(ev) => {
            if ev.need_rescan() {
                let _ = tx.send(Change::Rescan);
            }
            if matches!(ev.kind, EventKind::Access(a) if a != AccessKind::Close(AccessMode::Write)) {
                return;
            }
            for p in ev.paths {
                let _ = tx.send(Change::Path(p));
            }
        }
        Err(e) => {
            tracing::warn!("sync watcher: {e}");
            let _ = tx.send(Change::Rescan);
        }
    }
}

/// The running side of a job.
struct JobCtx {
    spec: Arc<JobSpec>,
    sandboxes: Arc<SandboxManager>,
    filter: Arc<Filter>,
    /// The sandbox as of the last push; a different one means it was reset.
    current: Arc<Sandbox>,
    jobs: Jobs,
}

#[derive(Default)]
struct Batch {
    paths: BTreeSet<PathBuf>,
    rescan: bool,
}

impl Batch {
    fn add(&mut self, c: Change) {
        match c {
            Change::Path(p) => {
                self.paths.insert(p);
            }
            Change::Rescan => self.rescan = true,
        }
    }
}

impl JobCtx {
    async fn run(mut self, mut events: mpsc::UnboundedReceiver<Change>, watcher: notify::RecommendedWatcher) {
        let _watcher = watcher;
        let mut tick = tokio::time::interval(CHECK_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // A batch that failed (the helper died mid-push; the next helper
        // keeps the sandbox, so nothing else would push it again) is not
        // lost: a later round pushes the whole tree, a second after the
        // failure, then twice as long after each failure in a row (up to a
        // minute), so a push that keeps failing does not copy the tree every
        // second.
        let mut retry: Option<(Instant, Duration)> = None;
        loop {
            let mut batch = Batch { rescan: retry.is_some_and(|(at, _)| Instant::now() >= at), ..Batch::default() };
            tokio::select! {
                change = events.recv() => match change {
                    Some(c) => batch.add(c),
                    None => break,
                },
                _ = tick.tick() => {}
            }
            if !batch.paths.is_empty() || batch.rescan {
                let deadline = Instant::now() + MAX_BATCH;
                while let Ok(Some(c)) = timeout(DEBOUNCE, events.recv()).await {
                    batch.add(c);
                    if Instant::now() >= deadline {
                        break;
                    }
                }
            }
            let Some(sb) = self.sandbox().await else {
                tracing::info!(job = %self.spec.id, sandbox = %self.spec.sandbox, "sandbox is gone; sync job stops");
                break;
            };
            if !Arc::ptr_eq(&sb, &self.current) {
                // A reset replaced the VM: anything outside volumes is gone.
                batch.rescan = true;
                self.current = sb;
            }
            if batch.paths.is_empty() && !batch.rescan {
                continue;
            }
            let whole = batch.rescan;
            retry = match self.flush(batch).await {
                // A smaller batch leaves the failed one still to push.
                Ok(()) => retry.filter(|_| !whole),
                Err(e) => {
                    self.spec.counters.errors.fetch_add(1, Ordering::Relaxed);
                    let wait = retry.map_or(RETRY_FIRST, |(_, w)| (w * 2).min(RETRY_MOST));
                    tracing::warn!(job = %self.spec.id, "sync batch failed: {e}; the whole tree goes again in {wait:?}");
                    Some((Instant::now() + wait, wait))
                }
            };
        }
        lock(&self.jobs).remove(&self.spec.id);
    }

    /// The sandbox now, waiting out a reset in progress; `None` if it is gone.
    async fn sandbox(&self) -> Option<Arc<Sandbox>> {
        let deadline = Instant::now() + GONE_GRACE;
        loop {
            if let Ok(sb) = self.sandboxes.get(&self.spec.sandbox) {
                return Some(sb);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn flush(&mut self, batch: Batch) -> Result<(), String> {
        let root = &self.spec.root;
        let dir = self.spec.location.open_dir().map_err(|e| e.to_string())?;
        let mut full = batch.rescan;
        if batch.paths.contains(&root.join(".gitignore")) {
            self.filter = Arc::new(Filter::load(&dir, &self.spec.exclude));
            full = true;
        }
        let (pushes, deletes) =
            if full { (vec![PathBuf::new()], Vec::new()) } else { classify(root, &dir, &self.filter, batch.paths) };
        drop(dir);
        if !deletes.is_empty() {
            self.delete(&deletes).await?;
        }
        if !pushes.is_empty() {
            let files = push(&self.sandboxes, &self.spec, &self.current, &self.filter, pushes).await?;
            self.spec.counters.files.fetch_add(files, Ordering::Relaxed);
        }
        Ok(())
    }

    async fn delete(&self, rels: &[PathBuf]) -> Result<(), String> {
        let paths: Vec<String> = rels
            .iter()
            .filter_map(|r| match r.to_str() {
                Some(s) => Some(guest_path(&self.spec.dir, s)),
                None => {
                    tracing::warn!(job = %self.spec.id, "not deleting non-UTF-8 path {}", r.display());
                    None
                }
            })
            .collect();
        for chunk in paths.chunks(RM_BATCH) {
            let argv = ["rm", "-rf", "--"].into_iter().map(String::from).chain(chunk.iter().cloned());
            let r = self
                .sandboxes
                .run_in(&self.current, Command::argv(argv, RM_TIMEOUT))
                .await
                .map_err(|e| e.to_string())?;
            if r.exit_code() != 0 {
                return Err(format!("rm failed: {}", super::text::render(&r.stderr).trim_end()));
            }
        }
        Ok(())
    }
}

/// Split changed paths (as the watcher names them, under `root`) into (to
/// push, to delete), relative to `root`, looked up through `dir` (the root's
/// fd); ignored ones and those under another path of the same list dropped.
fn classify(root: &Path, dir: &Dir, filter: &Filter, paths: BTreeSet<PathBuf>) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let (mut pushes, mut deletes) = (Vec::<PathBuf>::new(), Vec::<PathBuf>::new());
    for abs in paths {
        let Ok(rel) = abs.strip_prefix(root) else { continue };
        let (Some(parent), Some(name)) = (rel.parent(), rel.file_name()) else { continue };
        let found = dir.try_clone().and_then(|d| d.walk(parent)).and_then(|d| d.child(name));
        let (list, is_dir) = match found {
            Ok(Some(st)) => (&mut pushes, Some(st.kind == Kind::Dir)),
            // Under a directory that is gone or was replaced (by a symlink,
            // which the push sends as such): gone from the mirror too.
            Ok(None) => (&mut deletes, None),
            Err(HostFsError::Missing(_) | HostFsError::Symlink(_) | HostFsError::NotADirectory(_)) => {
                (&mut deletes, None)
            }
            Err(e) => {
                tracing::warn!("sync: cannot look at {}: {e}", abs.display());
                continue;
            }
        };
        // Sorted order puts a directory right before what is under it.
        if filter.ignored(rel, is_dir) || list.last().is_some_and(|last| rel.starts_with(last)) {
            continue;
        }
        list.push(rel.to_path_buf());
    }
    (pushes, deletes)
}

fn guest_path(dir: &str, rel: &str) -> String {
    if dir.ends_with('/') { format!("{dir}{rel}") } else { format!("{dir}/{rel}") }
}

/// Send `rels` (files, or directories with everything under them; the empty
/// path is the whole root) as one tar stream built on a blocking thread while
/// the helper extracts it. Returns the files written.
async fn push(
    sandboxes: &SandboxManager,
    spec: &JobSpec,
    sb: &Sandbox,
    filter: &Arc<Filter>,
    rels: Vec<PathBuf>,
) -> Result<u64, String> {
    let dir = spec.location.open_dir().map_err(|e| e.to_string())?;
    let filter = filter.clone();
    let (rx, build) =
        tarstream::build(move |b| tarstream::append_all(b, &dir, &rels, &|rel, is_dir| filter.ignored(rel, is_dir)));
    let (built, copied) = tokio::join!(build, sandboxes.helper.copy_in(&sb.name, &spec.dir, rx));
    let (files, _bytes) = copied.map_err(|e| e.to_string())?;
    built.map_err(|e| e.to_string())?.map_err(|e| format!("reading {}: {e}", spec.root.display()))?;
    Ok(files)
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    fn tree(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("smcp-sync-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("src/deep")).unwrap();
        std::fs::create_dir_all(d.join("node_modules/x")).unwrap();
        std::fs::create_dir_all(d.join("build")).unwrap();
        std::fs::write(d.join("src/deep/a.py"), "print(1)").unwrap();
        std::fs::write(d.join("node_modules/x/i.js"), "x").unwrap();
        std::fs::write(d.join("build/out.o"), "o").unwrap();
        std::fs::write(d.join("app.log"), "log").unwrap();
        std::fs::write(d.join(".gitignore"), "build/\n*.log\n").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", d.join("src/link")).unwrap();
        d
    }

    fn open(root: &Path) -> Dir {
        Dir::open_absolute(root, Default::default()).unwrap()
    }

    fn entries(root: &Path, rels: &[PathBuf]) -> BTreeMap<String, (tar::EntryType, Vec<u8>)> {
        let mut b = tar::Builder::new(Vec::new());
        b.follow_symlinks(false);
        let dir = open(root);
        let filter = Filter::load(&dir, &[]);
        tarstream::append_all(&mut b, &dir, rels, &|rel, is_dir| filter.ignored(rel, is_dir)).unwrap();
        let out = b.into_inner().unwrap();
        let mut archive = tar::Archive::new(out.as_slice());
        archive
            .entries()
            .unwrap()
            .map(|e| {
                let mut e = e.unwrap();
                let path = e.path().unwrap().to_string_lossy().trim_end_matches('/').to_string();
                let kind = e.header().entry_type();
                assert_eq!(e.header().uid().unwrap(), 0);
                let mut data = Vec::new();
                if kind == tar::EntryType::Symlink {
                    data = e.link_name().unwrap().unwrap().to_string_lossy().into_owned().into_bytes();
                } else {
                    e.read_to_end(&mut data).unwrap();
                }
                (path, (kind, data))
            })
            .collect()
    }

    #[test]
    fn full_tar_skips_ignored_paths_and_keeps_symlinks() {
        let d = tree("full");
        let e = entries(&d, &[PathBuf::new()]);
        let names: Vec<&str> = e.keys().map(String::as_str).collect();
        assert_eq!(names, [".gitignore", "src", "src/deep", "src/deep/a.py", "src/link"]);
        assert_eq!(e["src/deep/a.py"], (tar::EntryType::Regular, b"print(1)".to_vec()));
        assert_eq!(e["src/link"], (tar::EntryType::Symlink, b"/etc/passwd".to_vec()));
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn filter_matches_names_gitignore_and_vanished_dirs() {
        let d = tree("filter");
        let f = Filter::load(&open(&d), &[]);
        assert!(f.ignored(Path::new("a/.git/config"), Some(false)));
        assert!(f.ignored(Path::new("pkg/__pycache__"), Some(true)));
        assert!(f.ignored(Path::new("x.log"), Some(false)));
        assert!(f.ignored(Path::new("build/out.o"), Some(false)));
        assert!(f.ignored(Path::new("build"), None), "a deleted path is ignored if it was an ignored dir");
        assert!(!f.ignored(Path::new("build"), Some(false)));
        assert!(!f.ignored(Path::new("src/deep/a.py"), Some(false)));
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn classify_splits_and_drops_covered_paths() {
        let d = tree("classify");
        let f = Filter::load(&open(&d), &[]);
        let paths: BTreeSet<PathBuf> =
            ["src", "src/deep/a.py", "gone", "gone/sub", "app.log", "node_modules/x/i.js", ""]
                .iter()
                .map(|p| d.join(p))
                .collect();
        let (pushes, deletes) = classify(&d, &open(&d), &f, paths);
        assert_eq!(pushes, [PathBuf::from("src")]);
        assert_eq!(deletes, [PathBuf::from("gone")]);
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn vanished_paths_are_skipped() {
        let d = tree("size");
        let e = entries(&d, &[PathBuf::from("src/deep/a.py"), PathBuf::from("missing")]);
        assert_eq!(e.len(), 1);
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn guest_paths_join_once() {
        assert_eq!(guest_path("/", "a"), "/a");
        assert_eq!(guest_path("/workspace", "a/b"), "/workspace/a/b");
    }
}
