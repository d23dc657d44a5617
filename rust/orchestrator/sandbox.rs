//! Named sandboxes: the registry, auto-creation on first use, attach to the
//! helper's running VMs after an orchestrator restart, destroy and reset, and
//! running commands with the sandbox's persistent env and audit log.
use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant, SystemTime},
};

use super::{
    adopt::Creating,
    audit::AuditLog,
    config::{Config, Profile},
    error::OrchestratorError,
    exec::{self, ExecResult},
    helper_client::{HelperClient, HelperError, ProcessConfig, VmConfig, VmInfo, VmState},
    isolation::Isolation,
    names::{self, validate_key},
    network::Network,
    shell,
    state::Pending,
};

/// Label on every VM the orchestrator creates, holding the sandbox name.
pub(super) const NAME_LABEL: &str = "sandbox-mcp.name";
/// Label holding the canonical path of the sandbox's project directory
/// (absent on sandboxes made before names belonged to projects: `legacy`).
const PROJECT_LABEL: &str = "sandbox-mcp.project";
/// Label of a child sandbox's VM: its parent's name.
pub(super) const PARENT_LABEL: &str = "sandbox-mcp.parent";
/// Label of a child sandbox's VM: its generation (1 = child, 2 = grandchild).
const GENERATION_LABEL: &str = "sandbox-mcp.generation";
/// How long a live sandbox's agent may take to answer a liveness check.
const AGENT_ANSWER_TIMEOUT: Duration = Duration::from_secs(3);

/// Label holding the sandbox's network and egress policy (see
/// [`Network::to_label`]): children inherit it, also after a restart.
const NETWORK_LABEL: &str = "sandbox-mcp.network";
/// Reaped children whose explanation is kept (see `gone_children`).
pub(super) const MAX_GONE_CHILDREN: usize = 256;
/// Where a sandbox's workspace volume is mounted.
pub const WORKSPACE: &str = "/workspace";

/// Per-sandbox package caches: (volume subdirectory, path inside). They live
/// beside the workspace, so they survive `reset` and make reinstalls fast.
const CACHE_VOLUMES: [(&str, &str); 3] =
    [("cache/apt", "/var/cache/apt/archives"), ("cache/pip", "/root/.cache/pip"), ("cache/npm", "/root/.npm")];

/// One live sandbox.
#[derive(Debug)]
pub struct Sandbox {
    /// Key: `<project tag>-<plain name>` (see [`names::key`]), also the VM
    /// id and the volume directory. Users see [`Self::plain`].
    pub name: String,
    /// The project's directory; `None` for the legacy project.
    pub project_dir: Option<PathBuf>,
    /// Image it runs.
    pub image: String,
    /// Shell used for `-c` commands.
    pub shell: String,
    /// CPU limit.
    pub cpus: u32,
    /// Memory limit in bytes.
    pub memory_bytes: u64,
    /// Network mode and egress policy it was created with.
    pub network: Network,
    /// When the VM was started.
    pub started_at: SystemTime,
    /// Persistent env applied to every command; mirrored inside the sandbox
    /// so it survives an orchestrator restart.
    pub(super) env: Mutex<BTreeMap<String, String>>,
    /// Recent commands.
    pub(super) audit: Mutex<AuditLog>,
    /// Held by state-changing operations on this sandbox (env set/unset)
    /// across their read-modify-write, so concurrent calls take turns and
    /// none overwrites another's change.
    pub(super) ops: tokio::sync::Mutex<()>,
    last_activity: Mutex<Instant>,
    /// Commands running now: a sandbox in the middle of a long command is
    /// busy, however long ago it started.
    running: AtomicUsize,
    /// When the lease ends (see [`super::lease`]); a child's TTL is its lease.
    pub(super) lease: Mutex<Option<SystemTime>>,
    /// The sandbox that spawned this one (children only).
    pub parent: Option<String>,
    /// 0 for a sandbox created by a tool, parent's + 1 for a child.
    pub generation: u32,
    /// The helper driver it runs on.
    pub isolation: Isolation,
}

impl Sandbox {
    pub(super) fn from_vm(vm: &VmInfo, name: String) -> Self {
        let started_at = SystemTime::UNIX_EPOCH + Duration::from_millis(vm.started_at_ms.max(0) as u64);
        // The label is the orchestrator's own record; a VM without one was
        // created before policies existed and has the mode the helper reports.
        // One it cannot read gets no network at all: never a wider one.
        let network = match vm.labels.get(NETWORK_LABEL) {
            Some(label) => Network::from_label(label).unwrap_or_else(|| {
                tracing::warn!(sandbox = %name, "unreadable network label {label:?}: treating the network as none");
                Network::None
            }),
            None => vm.network.clone(),
        };
        let project_dir = vm.labels.get(PROJECT_LABEL).map(PathBuf::from);
        // Seen from now on: its id can be shown and written as a qualifier,
        // also by sessions of other projects before one of its own starts.
        if let Some(dir) = &project_dir {
            super::project::Project::of(dir).remember();
        }
        Self {
            network,
            project_dir,
            parent: vm.labels.get(PARENT_LABEL).cloned(),
            generation: vm.labels.get(GENERATION_LABEL).and_then(|g| g.parse().ok()).unwrap_or(0),
            // A driver this orchestrator has no name for runs no sandbox
            // it made; the helper's own name is kept in its status.
            isolation: Isolation::from_driver(&vm.driver).unwrap_or_default(),
            name,
            image: vm.image.clone(),
            shell: vm.shell.clone(),
            cpus: vm.cpus,
            memory_bytes: vm.memory_bytes,
            started_at,
            env: Mutex::default(),
            audit: Mutex::default(),
            ops: tokio::sync::Mutex::default(),
            last_activity: Mutex::new(Instant::now()),
            running: AtomicUsize::new(0),
            lease: Mutex::default(),
        }
    }

    /// The name users know it by, within its project.
    pub fn plain(&self) -> &str {
        names::plain(&self.name)
    }

    /// Its name as the session serving this task sees it (see
    /// [`names::display`]).
    pub fn shown(&self) -> String {
        names::display(&self.name)
    }

    /// The id of its project (`legacy` for sandboxes from before projects).
    pub fn project_id(&self) -> String {
        super::project::Project::id_of_tag(names::split_key(&self.name).0)
    }

    /// Time since the last command ended; zero while one runs.
    pub fn idle(&self) -> Duration {
        if self.running.load(Ordering::SeqCst) > 0 {
            return Duration::ZERO;
        }
        self.last_activity.lock().map(|t| t.elapsed()).unwrap_or_default()
    }

    fn touch(&self) {
        if let Ok(mut t) = self.last_activity.lock() {
            *t = Instant::now();
        }
    }

    /// Add an entry to the audit log; returns it as recorded (redacted).
    pub fn record(&self, command: &str, exit_code: i32, duration: Duration) -> super::audit::AuditEntry {
        self.audit.lock().unwrap_or_else(|p| p.into_inner()).record(command, exit_code, duration)
    }

    /// Number of commands in the audit log.
    pub fn command_count(&self) -> usize {
        self.audit.lock().map(|a| a.len()).unwrap_or(0)
    }

    /// The newest `limit` audit entries, newest first.
    pub fn history(&self, limit: usize) -> Vec<super::audit::AuditEntry> {
        self.audit.lock().map(|a| a.newest(limit)).unwrap_or_default()
    }

    pub(super) fn restore_audit(&self, entries: Vec<super::audit::AuditEntry>) {
        if let Ok(mut audit) = self.audit.lock() {
            audit.restore(entries);
        }
    }

    /// A copy of the persistent env.
    pub fn env(&self) -> BTreeMap<String, String> {
        self.env.lock().map(|e| e.clone()).unwrap_or_default()
    }
}

/// A command to run in a sandbox.
#[derive(Debug, Clone)]
pub struct Command {
    /// argv (use [`Command::shell`] for a shell command line).
    pub argv: ShellOrArgv,
    /// Working directory, created if missing.
    pub cwd: String,
    /// Bytes for stdin; EOF follows.
    pub stdin: Vec<u8>,
    /// Wall-clock limit.
    pub timeout: Duration,
    /// Text to record in the audit log, or `None` to leave no trace.
    pub audit_as: Option<String>,
    /// User to run as; empty means the image's default user.
    pub user: String,
    /// Bytes the command reads once on descriptor 3, never stored anywhere
    /// (a git_clone token for its credential helper).
    pub secret: Vec<u8>,
}

/// What to run: a shell command line (run with the sandbox's shell `-c`) or
/// an exact argv.
#[derive(Debug, Clone)]
pub enum ShellOrArgv {
    /// `<shell> -c <line>`.
    Shell(String),
    /// Exactly this argv.
    Argv(Vec<String>),
}

impl Command {
    /// A shell command line in `/workspace`, audited as itself.
    pub fn shell(line: &str, timeout: Duration) -> Self {
        Self {
            argv: ShellOrArgv::Shell(line.to_string()),
            cwd: WORKSPACE.to_string(),
            stdin: Vec::new(),
            timeout,
            audit_as: Some(line.to_string()),
            user: String::new(),
            secret: Vec::new(),
        }
    }

    /// An exact argv in `/workspace`, not audited.
    pub fn argv<S: Into<String>>(argv: impl IntoIterator<Item = S>, timeout: Duration) -> Self {
        Self {
            argv: ShellOrArgv::Argv(argv.into_iter().map(Into::into).collect()),
            cwd: WORKSPACE.to_string(),
            stdin: Vec::new(),
            timeout,
            audit_as: None,
            user: String::new(),
            secret: Vec::new(),
        }
    }
}

/// A command counted as running in its sandbox until dropped.
struct Running<'a>(&'a Sandbox);

impl<'a> Running<'a> {
    fn start(sandbox: &'a Sandbox) -> Self {
        sandbox.running.fetch_add(1, Ordering::SeqCst);
        Self(sandbox)
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
        self.0.touch();
    }
}

/// A working directory as the tools document it: relative ones are under
/// `/workspace`, like relative file paths.
fn resolve_cwd(cwd: String) -> String {
    if cwd.starts_with('/') { cwd } else { format!("{WORKSPACE}/{cwd}") }
}

fn cmd_argv(sandbox: &Sandbox, argv: ShellOrArgv) -> Vec<String> {
    match argv {
        ShellOrArgv::Shell(line) => vec![sandbox.shell.clone(), "-c".to_string(), line],
        ShellOrArgv::Argv(argv) => argv,
    }
}

/// Where a new sandbox comes from, beyond what its name's profile says.
#[derive(Debug, Clone, Default)]
pub struct Origin {
    /// Image to boot instead of the profile's (restore, spawn).
    pub image: Option<String>,
    /// Start from a copy of this running sandbox's root filesystem (clone).
    pub clone_from: Option<String>,
    /// CPU limit instead of the profile's.
    pub cpus: Option<u32>,
    /// Memory limit instead of the profile's.
    pub memory_bytes: Option<u64>,
    /// The parent of a child sandbox.
    pub parent: Option<String>,
    /// Lease instead of the configured default (a child's TTL).
    pub lease: Option<Duration>,
    /// Isolation instead of the profile's (spawn); a child without one
    /// takes its parent's.
    pub isolation: Option<Isolation>,
}

/// A future returned by a [`SandboxListener`] hook.
pub type HookFuture<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), OrchestratorError>> + Send + 'a>>;

/// Told when a sandbox is created, goes away or is replaced, so what hangs
/// off it (port forwards, sync jobs, the sandbox-ctl socket) follows.
pub trait SandboxListener: Send + Sync {
    /// The sandbox was destroyed or reaped.
    fn destroyed(&self, name: &str);
    /// The sandbox was replaced by a fresh VM of the same name (reset, restore).
    fn replaced(&self, _name: &str) {}
    /// Host directories to mount into a sandbox about to be created:
    /// (host dir, guest dir, read-only).
    fn mounts(&self, _name: &str, _parent: Option<&str>) -> Vec<(PathBuf, String, bool)> {
        Vec::new()
    }
    /// The sandbox was booted; runs before anyone else can use it, and an
    /// error undoes the creation.
    fn created<'a>(&'a self, _sandbox: &'a Arc<Sandbox>) -> HookFuture<'a> {
        Box::pin(async { Ok(()) })
    }
}

/// The registry of sandboxes, shared by every MCP session.
pub struct SandboxManager {
    listeners: Mutex<Vec<Arc<dyn SandboxListener>>>,
    pub(super) helper: HelperClient,
    /// The daemon's own configuration: what sessions fall back on and what
    /// work outside any session (restore, reaping) uses.
    pub(super) config: Arc<Config>,
    sandboxes: Mutex<BTreeMap<String, Arc<Sandbox>>>,
    /// One lock per name so concurrent first uses create a sandbox once.
    lifecycle_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Creations in progress, counted against `max_sandboxes`.
    pub(super) creating: AtomicUsize,
    /// The state database every change is recorded in.
    pub(super) state: super::state::StateHandle,
    /// Sandboxes whose VM went away without being destroyed, with why. A
    /// lost name is never silently re-created: tools report it until
    /// `reset` or `destroy` acknowledges the loss.
    lost: Mutex<BTreeMap<String, String>>,
    /// Child sandboxes the reaper destroyed, with what happened. A child's
    /// name is never created by first use, so a later use says why it is
    /// gone and how to get a new one rather than just "no such sandbox"
    /// (also after a restart: they are in the state database).
    gone_children: Mutex<BTreeMap<String, String>>,
    /// VMs of creations that failed while the helper could not be reached
    /// (it died mid-creation): their writable layers wait for a helper that
    /// answers to delete them (see [`Self::discard_vm`]).
    unfreed: Mutex<BTreeSet<String>>,
    /// Running VMs whose creating server died before it cleared its marker,
    /// waiting for the state database to say whether their creation was
    /// committed (see [`Self::settle_unfinished`]).
    pub(super) unfinished: Mutex<Vec<super::helper_client::VmInfo>>,
    /// The host's CA certificates, for sandboxes that trust them.
    host_ca: super::ca_trust::HostCaCache,
    /// What host CA trust writes into a sandbox, per image.
    pub(super) ca_seeds: super::ca_trust::SeedCache,
}

impl SandboxManager {
    /// Connect the registry to a helper and attach every running VM that a
    /// previous orchestrator created, with its persistent env.
    pub async fn start(helper: HelperClient, config: Config) -> Result<Self, OrchestratorError> {
        let manager = Self {
            listeners: Mutex::default(),
            helper,
            config: Arc::new(config),
            sandboxes: Mutex::default(),
            lifecycle_locks: Mutex::default(),
            creating: AtomicUsize::new(0),
            state: Default::default(),
            lost: Mutex::default(),
            gone_children: Mutex::default(),
            unfreed: Mutex::default(),
            unfinished: Mutex::default(),
            host_ca: Default::default(),
            ca_seeds: Default::default(),
        };
        for vm in manager.helper.list_vms().await? {
            let Some(name) = vm.labels.get(NAME_LABEL).cloned() else {
                continue;
            };
            if vm.state != VmState::Running {
                // A VM we created that is no longer running holds only a
                // writable layer; the workspace is a volume and stays.
                tracing::info!(sandbox = %name, "removing stopped sandbox VM left from an earlier run");
                manager.helper.delete_vm(&vm.id).await.ok();
                continue;
            }
            match Creating::owner(&manager.config.volumes_dir.join(&name)) {
                // Another live server is creating it right now: its sandbox.
                Some(creator) if super::owner::alive(&creator) => continue,
                // Its creator died: finished only if the state database
                // recorded it, which [`Self::settle_unfinished`] asks.
                Some(_) => {
                    manager.unfinished.lock().unwrap_or_else(|p| p.into_inner()).push(vm);
                    continue;
                }
                None => {}
            }
            manager.attach(&vm, name).await;
        }
        // A child whose parent is gone was orphaned by a crash mid-cascade:
        // nothing may run outside its parent's budget.
        loop {
            let orphan = manager
                .list()
                .into_iter()
                .find(|s| s.parent.as_ref().is_some_and(|p| !manager.lock_map().contains_key(p)));
            let Some(orphan) = orphan else { break };
            tracing::info!(sandbox = %orphan.name, "removing child sandbox whose parent is gone");
            manager.helper.delete_vm(&orphan.name).await.ok();
            manager.lock_map().remove(&orphan.name);
        }
        Ok(manager)
    }

    /// Register for destroy/replace events.
    pub fn subscribe(&self, listener: Arc<dyn SandboxListener>) {
        self.listeners.lock().unwrap_or_else(|p| p.into_inner()).push(listener);
    }

    fn listeners(&self) -> Vec<Arc<dyn SandboxListener>> {
        self.listeners.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn notify(&self, event: impl Fn(&dyn SandboxListener)) {
        for l in self.listeners() {
            event(l.as_ref());
        }
    }

    /// Count outside use (e.g. traffic through a port forward) as activity.
    pub fn touch(&self, name: &str) {
        if let Some(s) = self.lock_map().get(name) {
            s.touch();
        }
    }

    /// The configuration sandboxes are created with: the calling session's
    /// (its client's environment and start directory), else the daemon's.
    pub fn config(&self) -> Arc<Config> {
        super::config::session().unwrap_or_else(|| self.config.clone())
    }

    pub(super) fn lock_map(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Arc<Sandbox>>> {
        self.sandboxes.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn lifecycle_lock(&self, name: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.lifecycle_locks.lock().unwrap_or_else(|p| p.into_inner());
        locks.entry(name.to_string()).or_default().clone()
    }

    /// Every sandbox, sorted by name.
    pub fn list(&self) -> Vec<Arc<Sandbox>> {
        self.lock_map().values().cloned().collect()
    }

    /// The sandboxes of the calling session's project, sorted by name.
    pub fn list_own(&self) -> Vec<Arc<Sandbox>> {
        let tag = self.config().project.tag.clone();
        self.lock_map().values().filter(|s| names::split_key(&s.name).0 == tag).cloned().collect()
    }

    /// The key of the sandbox a client of `project` names `name` in
    /// argument `arg`: a plain name belongs to `project`; another
    /// project's sandbox is reached only by its qualified name
    /// `<project-id>:<name>` (`list_all(all_projects=true)` shows them).
    pub fn resolve(&self, own: &super::project::Project, arg: &str, name: &str) -> Result<String, OrchestratorError> {
        let Some((project, plain)) = name.split_once(names::QUALIFIER_SEPARATOR) else {
            names::validate_sandbox_name(name)?;
            let key = names::key(&own.tag, name);
            names::validate_key(&key)?;
            return Ok(key);
        };
        let malformed = |why: &str| OrchestratorError::MalformedName {
            arg: arg.to_string(),
            value: name.to_string(),
            why: why.to_string(),
        };
        if project.is_empty() || plain.is_empty() || plain.contains(names::QUALIFIER_SEPARATOR) {
            return Err(malformed("a qualified name is <project-id>:<name>, one of each"));
        }
        let Some(tag) = super::project::Project::tag_of_id(project) else {
            return Err(malformed("the project id before ':' is <directory name>-<6 hex digits> or 'legacy'"));
        };
        names::validate_sandbox_name(plain)?;
        let known = tag.is_empty() || super::project::Project::by_tag(tag).is_some_and(|p| p.id == project);
        if !known {
            return Err(OrchestratorError::UnknownProject { arg: arg.to_string(), project: project.to_string() });
        }
        let key = names::key(tag, plain);
        names::validate_key(&key)?;
        Ok(key)
    }

    /// An existing sandbox (never creates one).
    pub fn get(&self, name: &str) -> Result<Arc<Sandbox>, OrchestratorError> {
        validate_key(name)?;
        if let Some(s) = self.lock_map().get(name) {
            return Ok(s.clone());
        }
        self.check_lost(name)?;
        Err(self.no_such(name))
    }

    /// The error for a name that has no sandbox: a child the reaper took
    /// says so.
    fn no_such(&self, name: &str) -> OrchestratorError {
        match self.gone_children.lock().unwrap_or_else(|p| p.into_inner()).get(name) {
            Some(why) => OrchestratorError::ChildGone(why.clone()),
            None => OrchestratorError::NoSuchSandbox(name.to_string()),
        }
    }

    /// Remember that the children in `name`'s subtree (and `name` itself,
    /// if it is a child) go away because of `cause`; call before destroying.
    pub(super) fn remember_reaped(&self, name: &str, cause: &str) {
        let mut subtree: Vec<Arc<Sandbox>> = self.lock_map().get(name).cloned().into_iter().collect();
        let mut i = 0;
        while let Some(s) = subtree.get(i) {
            let children = self.children(&s.name);
            subtree.extend(children);
            i += 1;
        }
        let mut gone = self.gone_children.lock().unwrap_or_else(|p| p.into_inner());
        for child in subtree {
            let Some(parent) = &child.parent else { continue };
            let segment = child.name.rsplit(names::CHILD_SEPARATOR).next().unwrap_or(&child.name);
            let (parent, child_name) = (names::plain(parent), child.plain());
            // Bounded: a long-lived server reaping many children keeps only
            // the most recent explanations that fit.
            if gone.len() >= MAX_GONE_CHILDREN {
                gone.pop_first();
            }
            let message = format!(
                "sandbox '{child_name}' was a child of '{parent}' and is gone: {cause} (at {}), which destroys its children \
                 too. A child's name is never created by first use: spawn(parent='{parent}', name='{segment}') \
                 starts a new one (its /workspace starts empty)",
                super::watchdog::clock()
            );
            self.record_gone_child(&child.name, &message).in_background();
            gone.insert(child.name.clone(), message);
        }
    }

    /// Add the reaped children's explanations the state database kept; one
    /// remembered since this start is newer and stays.
    pub(super) fn set_gone_children(&self, saved: BTreeMap<String, String>) {
        let mut gone = self.gone_children.lock().unwrap_or_else(|p| p.into_inner());
        for (name, message) in saved {
            if gone.len() >= MAX_GONE_CHILDREN {
                break;
            }
            gone.entry(name).or_insert(message);
        }
    }

    /// Sandboxes lost without being destroyed, with why.
    pub fn lost(&self) -> BTreeMap<String, String> {
        self.lost.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(super) fn set_lost(&self, lost: BTreeMap<String, String>) {
        *self.lost.lock().unwrap_or_else(|p| p.into_inner()) = lost;
    }

    /// Record that a sandbox's VM went away on its own: forget it, stop what
    /// hangs off it, and make later uses of the name say so.
    pub(super) fn mark_lost(&self, name: &str, why: &str) {
        if self.lock_map().remove(name).is_none() {
            return;
        }
        tracing::warn!(sandbox = %name, "sandbox lost: {why}");
        self.lost.lock().unwrap_or_else(|p| p.into_inner()).insert(name.to_string(), why.to_string());
        self.notify(|l| l.destroyed(name));
        self.record_lost(name, why).in_background();
    }

    /// Acknowledge a lost sandbox: the name is free again. `None` if it
    /// was not lost.
    fn forget_lost(&self, name: &str) -> Option<Pending> {
        let removed = self.lost.lock().unwrap_or_else(|p| p.into_inner()).remove(name).is_some();
        removed.then(|| self.record_found(name))
    }

    /// Acknowledge a lost sandbox (see [`Self::forget_lost`]) and free the
    /// disk its VM held: the writable layer a dead helper left behind, which
    /// the helper running now deletes by the VM's id. False if it was not
    /// lost.
    pub async fn acknowledge_lost(&self, name: &str) -> Result<bool, OrchestratorError> {
        let Some(saved) = self.forget_lost(name) else { return Ok(false) };
        // Acknowledged when the caller hears so: a crash from here on must
        // not report the sandbox lost again.
        saved.saved().await.map_err(|source| OrchestratorError::NotSaved {
            source: Box::new(source),
            done: format!("Forgot sandbox '{}' (its VM was already gone)", names::display(name)),
            after_restart: "after a restart of the server it is listed as lost again".into(),
        })?;
        match self.helper.delete_vm(name).await {
            Ok(()) | Err(HelperError::NotFound(_)) => {}
            Err(e) => tracing::warn!(sandbox = %name, error = %e, "cannot free the disk of a lost sandbox"),
        }
        Ok(true)
    }

    /// Deletes the VM of a creation that failed. When the helper cannot be
    /// reached (it died mid-creation: the next one knows nothing of the VM,
    /// but its directory stays), the name waits in `unfreed` until a helper
    /// answers ([`Self::free_unfreed`]).
    async fn discard_vm(&self, name: &str) {
        match self.helper.delete_vm(name).await {
            Ok(()) | Err(HelperError::NotFound(_)) => {}
            Err(e) => {
                tracing::warn!(sandbox = %name, error = %e, "cannot delete the VM of a failed creation yet; will once the helper answers");
                self.unfreed.lock().unwrap_or_else(|p| p.into_inner()).insert(name.to_string());
            }
        }
    }

    /// Deletes the VMs [`Self::discard_vm`] could not, unless their name was
    /// created again meanwhile (then the directory is that sandbox's).
    pub(super) async fn free_unfreed(&self) {
        let names: Vec<String> = self.unfreed.lock().unwrap_or_else(|p| p.into_inner()).iter().cloned().collect();
        for name in names {
            let lock = self.lifecycle_lock(&name);
            let Ok(_guard) = lock.try_lock() else { continue };
            let freed = self.lock_map().contains_key(&name)
                || matches!(self.helper.delete_vm(&name).await, Ok(()) | Err(HelperError::NotFound(_)));
            if freed {
                self.unfreed.lock().unwrap_or_else(|p| p.into_inner()).remove(&name);
            }
        }
    }

    fn check_lost(&self, name: &str) -> Result<(), OrchestratorError> {
        match self.lost.lock().unwrap_or_else(|p| p.into_inner()).get(name) {
            Some(why) => Err(OrchestratorError::Lost { name: name.to_string(), why: why.clone() }),
            None => Ok(()),
        }
    }

    /// The named sandbox, created and booted on first use.
    pub async fn get_or_create(&self, name: &str) -> Result<Arc<Sandbox>, OrchestratorError> {
        validate_key(name)?;
        if let Some(s) = self.lock_map().get(name) {
            return Ok(s.clone());
        }
        self.check_lost(name)?;
        // Only a parent's spawn makes a child: first use of a child's name
        // is a typo or a child that is gone, never a new sandbox.
        if names::is_child_name(name) {
            return Err(self.no_such(name));
        }
        let lock = self.lifecycle_lock(name);
        let _guard = lock.lock().await;
        if let Some(s) = self.lock_map().get(name) {
            return Ok(s.clone());
        }
        self.create_locked(name, &Origin::default(), None).await
    }

    /// Create a sandbox that must not exist yet (spawn, clone). A child is
    /// created under its parent's lifecycle lock, so a parent being
    /// destroyed or reset never leaves a child behind.
    pub async fn create(&self, name: &str, origin: &Origin) -> Result<Arc<Sandbox>, OrchestratorError> {
        validate_key(name)?;
        let parent_lock = origin.parent.as_deref().map(|p| self.lifecycle_lock(p));
        let _parent_guard = match &parent_lock {
            Some(l) => Some(l.lock().await),
            None => None,
        };
        if let Some(parent) = &origin.parent {
            self.get(parent)?;
        }
        let lock = self.lifecycle_lock(name);
        let _guard = lock.lock().await;
        if self.lock_map().contains_key(name) {
            return Err(OrchestratorError::AlreadyExists(name.to_string()));
        }
        self.create_locked(name, origin, None).await
    }

    /// Replace a sandbox (and its subtree) with a new VM from `origin`,
    /// keeping its workspace: restore. Creates it if it did not exist.
    pub async fn recreate(&self, name: &str, origin: &Origin) -> Result<Arc<Sandbox>, OrchestratorError> {
        self.replace(name, origin, false).await
    }

    /// Direct children of `name`, sorted by name.
    pub fn children(&self, name: &str) -> Vec<Arc<Sandbox>> {
        self.lock_map().values().filter(|s| s.parent.as_deref() == Some(name)).cloned().collect()
    }

    /// Destroy every descendant of `name` (its lifecycle lock is held),
    /// deepest first. A child's own children are listed under the child's
    /// lock: a grandchild being spawned (under that lock) is waited for and
    /// destroyed too, never left running without a parent.
    pub(super) async fn destroy_subtree(&self, name: &str) {
        for child in self.children(name) {
            let lock = self.lifecycle_lock(&child.name);
            let _guard = lock.lock().await;
            self.record_destroying(&child.name).in_background();
            Box::pin(self.destroy_subtree(&child.name)).await;
            if let Err(e) = self.remove_vm(&child.name).await {
                tracing::warn!(sandbox = %child.name, "could not destroy child sandbox: {e}");
            }
        }
    }

    /// Delete a sandbox's VM and forget it; its lock is held.
    async fn remove_vm(&self, name: &str) -> Result<(), OrchestratorError> {
        match self.helper.delete_vm(name).await {
            Ok(()) | Err(HelperError::NotFound(_)) => {}
            Err(e) => return Err(e.into()),
        }
        if self.lock_map().remove(name).is_some() {
            self.notify(|l| l.destroyed(name));
            self.record_removed(name).saved().await?;
        }
        Ok(())
    }

    /// Host directory of a sandbox's workspace volume.
    pub fn workspace_dir(&self, name: &str) -> PathBuf {
        self.config.volumes_dir.join(name).join("workspace")
    }

    /// Create `name` (its lock is held) within the capacity `reserved` for
    /// it, or checked now when `None`.
    async fn create_locked(
        &self,
        name: &str,
        origin: &Origin,
        reserved: Option<super::lease::CreateSlot<'_>>,
    ) -> Result<Arc<Sandbox>, OrchestratorError> {
        // The two namespaces never mix: a child's name is its parent's
        // `<parent>..<segment>`, a top-level name never has that form.
        let in_namespace = match &origin.parent {
            Some(parent) => names::is_child_of(name, parent),
            None => names::validate_top_level_key(name).is_ok(),
        };
        if !in_namespace {
            return Err(OrchestratorError::InvalidName(names::plain(name).to_string()));
        }
        // A child never takes a profile by its own name: it runs under its
        // root's, with the spawn's image and size and its parent's network.
        let (profile, project) = self.planned_profile(name, origin)?;
        // A child's project is its parent's business: only top-level
        // sandboxes get the project's env and services.
        let project = project.filter(|_| origin.parent.is_none() && origin.clone_from.is_none());
        let _slot = match reserved {
            Some(slot) => slot,
            None => self.preflight(name, &profile, &[])?,
        };
        let volume = self.config.volumes_dir.join(name);
        let mut mounts = vec![(self.workspace_dir(name), WORKSPACE.to_string(), false)];
        // A child starts with an empty workspace: what an earlier child of
        // the same name left is not handed to a new worker.
        if origin.parent.is_some() {
            let dir = self.workspace_dir(name);
            if dir.exists() {
                std::fs::remove_dir_all(&dir)
                    .map_err(|source| OrchestratorError::Volume { path: dir.display().to_string(), source })?;
            }
        }
        // Children are short-lived workers: caches would only cost disk.
        // The vm driver shares only /workspace into its guest.
        if origin.parent.is_none() && profile.isolation == Isolation::Namespaces {
            mounts.extend(CACHE_VOLUMES.iter().map(|(sub, guest)| (volume.join(sub), guest.to_string(), false)));
        }
        for (dir, _, _) in &mounts {
            std::fs::create_dir_all(dir)
                .map_err(|source| OrchestratorError::Volume { path: dir.display().to_string(), source })?;
        }
        let _creating = Creating::mark(&volume)?;
        for l in self.listeners() {
            mounts.extend(l.mounts(name, origin.parent.as_deref()));
        }
        let mut labels = HashMap::from([
            (NAME_LABEL.to_string(), name.to_string()),
            (NETWORK_LABEL.to_string(), profile.network.to_label()),
        ]);
        if let Some(project) = super::project::Project::by_tag(names::split_key(name).0) {
            labels.insert(PROJECT_LABEL.to_string(), project.dir.display().to_string());
        }
        let generation = match &origin.parent {
            Some(parent) => {
                let generation = self.get(parent)?.generation + 1;
                labels.insert(PARENT_LABEL.to_string(), parent.clone());
                labels.insert(GENERATION_LABEL.to_string(), generation.to_string());
                generation
            }
            None => 0,
        };
        // Read before the VM exists: its base env points at the bundle only
        // when there is a host bundle to write.
        let host_ca = if profile.trust_host_ca { self.host_ca.get() } else { None };
        // A sandbox of an image whose trust files are known gets them in its
        // layer before it starts; a clone's layer already holds its source's.
        let seed =
            host_ca.as_ref().filter(|_| origin.clone_from.is_none()).and_then(|h| self.ca_seeds.get(&profile.image, h));
        let cfg = |files| VmConfig {
            id: name.to_string(),
            image: if origin.clone_from.is_some() { String::new() } else { profile.image.clone() },
            cpus: profile.cpus,
            memory_bytes: profile.memory_bytes,
            pids: profile.pids,
            mounts: mounts.clone(),
            network: profile.network.clone(),
            env: host_ca.as_ref().map(|_| super::ca_trust::env()).unwrap_or_default(),
            disk_bytes: profile.disk_bytes,
            labels: labels.clone(),
            clone_from: origin.clone_from.clone(),
            files,
            isolation: profile.isolation,
        };
        let t0 = Instant::now();
        let created =
            match self.helper.create_vm(cfg(seed.as_ref().map(|s| s.files.to_vec()).unwrap_or_default())).await {
                Ok(created) => created,
                // The helper went away mid-call: it may have made the VM's
                // directory before it died. A connection cut mid-stream can
                // surface as an internal error (h2's INTERNAL_ERROR) as well
                // as unavailable or unknown; a VM that failed to be created
                // is deleted in every such case.
                Err(e @ (HelperError::Unavailable { .. } | HelperError::Other(_) | HelperError::Internal(_))) => {
                    self.discard_vm(name).await;
                    return Err(e.into());
                }
                Err(e) => return Err(e.into()),
            };
        let seeded = match &seed {
            Some(s) if s.image_created_at_ms == created.image_created_at_ms => true,
            Some(_) => {
                // The image was rebuilt since: the files are its old bundle.
                self.ca_seeds.forget(&profile.image);
                self.helper.delete_vm(name).await?;
                self.helper.create_vm(cfg(Vec::new())).await?;
                false
            }
            None => false,
        };
        let t1 = Instant::now();
        let vm = match self.helper.start_vm(name).await {
            Ok(vm) => vm,
            Err(e) => {
                // Never leave a half-made VM behind (the reference leaked these).
                self.discard_vm(name).await;
                return Err(e.into());
            }
        };
        let sandbox = Arc::new(Sandbox::from_vm(&vm, name.to_string()));
        debug_assert_eq!(sandbox.generation, generation);
        let t2 = Instant::now();
        let trust = host_ca.as_ref().filter(|_| !seeded).map(|h| {
            let image = origin.clone_from.is_none().then_some((profile.image.as_str(), vm.image_created_at_ms));
            (h, image)
        });
        if let Err(e) = self.prepare(&sandbox, origin, project.as_ref(), trust).await {
            self.discard_vm(name).await;
            return Err(e);
        }
        // Where creation time goes (the create benchmark reads these).
        tracing::debug!(sandbox = %name, seeded, create = ?(t1 - t0), start = ?(t2 - t1), prepare = ?t2.elapsed(), "creation steps");
        let lease = origin.lease.or(self.config().limits.lease_ttl);
        sandbox.set_lease(lease.map(|t| SystemTime::now() + t));
        // Saved before anyone can use it: a sandbox a restart would not know
        // is not created.
        if let Err(e) = self.record_created(&sandbox).saved().await {
            self.discard_vm(name).await;
            return Err(e.into());
        }
        self.lock_map().insert(name.to_string(), sandbox.clone());
        self.gone_children.lock().unwrap_or_else(|p| p.into_inner()).remove(name);
        tracing::info!(sandbox = %name, "created sandbox");
        Ok(sandbox)
    }

    /// What `name` is created from `origin` with, and the project file. A
    /// child never takes a profile by its own name: it runs under its
    /// root's, with the spawn's image and size and its parent's network.
    pub(super) fn planned_profile(
        &self,
        name: &str,
        origin: &Origin,
    ) -> Result<(Profile, Option<super::project::ProjectConfig>), OrchestratorError> {
        let (mut profile, project) = self.creation_profile(names::root_of_name(name))?;
        if let Some(image) = &origin.image {
            profile.image = image.clone();
        }
        profile.cpus = origin.cpus.unwrap_or(profile.cpus);
        profile.memory_bytes = origin.memory_bytes.unwrap_or(profile.memory_bytes);
        if let Some(parent) = &origin.parent {
            let parent = self.get(parent)?;
            profile.network = Network::for_child(&parent.network);
            profile.isolation = parent.isolation;
        }
        // A clone runs where its source's layer is.
        if let Some(source) = &origin.clone_from {
            profile.isolation = self.get(source)?.isolation;
        }
        if let Some(isolation) = origin.isolation {
            profile.isolation = isolation;
        }
        Ok((profile, project))
    }

    /// Make a booted sandbox ready: the host's CA trust (`trust`: the host's
    /// certificates and, to keep what was written, the image's name and build
    /// time; `None` when not wanted or already placed), its env (carried by
    /// a snapshot or clone in its root filesystem), the project's env and
    /// services, listeners.
    async fn prepare(
        &self,
        sandbox: &Arc<Sandbox>,
        origin: &Origin,
        project: Option<&super::project::ProjectConfig>,
        trust: Option<(&Arc<super::ca_trust::HostCa>, Option<super::ca_trust::ImageBuild<'_>>)>,
    ) -> Result<(), OrchestratorError> {
        // First: the project's services may well speak TLS.
        if let Some((host_ca, image)) = trust {
            self.trust_host_ca(sandbox, host_ca, image).await?;
        }
        if origin.image.is_some() || origin.clone_from.is_some() {
            *sandbox.env.lock().unwrap_or_else(|p| p.into_inner()) = self.load_env(sandbox).await?;
        }
        if let Some(project) = project {
            self.apply_project(sandbox, project).await?;
        }
        for l in self.listeners() {
            l.created(sandbox).await?;
        }
        Ok(())
    }

    /// Destroy a sandbox's VM and those of all its descendants. Workspace
    /// volumes are kept.
    pub async fn destroy(&self, name: &str) -> Result<Arc<Sandbox>, OrchestratorError> {
        self.destroy_keeping(name, true).await
    }

    /// Destroy a throwaway sandbox (the child of a sandbox-ctl `run`) and
    /// free its volumes too: nothing can come back for its workspace.
    pub async fn discard(&self, name: &str) -> Result<(), OrchestratorError> {
        self.destroy_keeping(name, false).await.map(|_| ())
    }

    async fn destroy_keeping(&self, name: &str, keep_volumes: bool) -> Result<Arc<Sandbox>, OrchestratorError> {
        let lock = self.lifecycle_lock(name);
        let _guard = lock.lock().await;
        let sandbox = self.get(name)?;
        // Durable before anything is destroyed: a crash from here on never
        // brings the sandbox back as lost. A full disk does not stop a
        // destroy (it frees space); the answer says what a restart believes.
        let marked = self.record_destroying(name).saved().await;
        self.destroy_subtree(name).await;
        let removed = self.remove_vm(name).await;
        match (removed, marked) {
            (Err(OrchestratorError::State(source)), marked) => {
                let after_restart = if marked.is_ok() {
                    "a restart of the server finishes the destroy"
                } else {
                    "after a restart of the server it is listed as lost; destroy it again then"
                };
                return Err(OrchestratorError::NotSaved {
                    done: format!("Destroyed sandbox '{}'", sandbox.shown()),
                    after_restart: after_restart.into(),
                    source: Box::new(source),
                });
            }
            (removed, _) => removed?,
        }
        if !keep_volumes {
            let dir = self.config.volumes_dir.join(name);
            std::fs::remove_dir_all(&dir)
                .map_err(|source| OrchestratorError::Volume { path: dir.display().to_string(), source })?;
        }
        Ok(sandbox)
    }

    /// Destroy sandboxes idle longer than the configured TTL, except
    /// `default`; returns their names. A sandbox is idle when nothing in its
    /// subtree ran a command within the TTL, runs one now or has a live
    /// background process: a dev server started with `bg` and a parent
    /// whose child works are in use.
    pub async fn reap_idle(&self) -> Vec<String> {
        let Some(ttl) = self.config.idle_ttl else { return Vec::new() };
        let candidates: Vec<Arc<Sandbox>> =
            self.list().into_iter().filter(|s| s.plain() != "default" && s.idle() > ttl).collect();
        let mut reaped = Vec::new();
        for sandbox in candidates {
            let name = sandbox.name.clone();
            // Gone with a parent reaped earlier in this sweep.
            if !self.lock_map().contains_key(&name) || self.in_use(&sandbox, ttl).await {
                continue;
            }
            let plain = names::plain(&name);
            self.remember_reaped(&name, &format!("'{plain}' was reaped after {}s idle", ttl.as_secs()));
            match self.destroy(&name).await {
                Ok(_) => {
                    tracing::info!(sandbox = %name, "reaped idle sandbox");
                    reaped.push(name);
                }
                Err(e) => tracing::warn!(sandbox = %name, "could not reap idle sandbox: {e}"),
            }
        }
        reaped
    }

    /// Whether anything in `sandbox`'s subtree was active within `ttl`, runs
    /// a command now or has a live background process. A helper that cannot
    /// list the processes leaves the answer to the idle time (the watchdog
    /// deals with a VM that went away).
    async fn in_use(&self, sandbox: &Arc<Sandbox>, ttl: Duration) -> bool {
        let mut pending = vec![sandbox.clone()];
        while let Some(s) = pending.pop() {
            if s.idle() <= ttl {
                return true;
            }
            if self.helper.list_background(&s.name).await.is_ok_and(|bg| bg.iter().any(|b| b.running)) {
                return true;
            }
            pending.extend(self.children(&s.name));
        }
        false
    }

    /// Run [`Self::reap_idle`] and [`Self::reap_expired`] periodically until
    /// the manager is dropped.
    pub fn spawn_reaper(self: &Arc<Self>) {
        let every = self.reap_interval();
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                let Some(manager) = weak.upgrade() else { break };
                manager.reap_idle().await;
                manager.reap_expired().await;
            }
        });
    }

    /// Replace a sandbox with a fresh one from its image (creating it if it did
    /// not exist). The workspace is kept unless `wipe_workspace`.
    pub async fn reset(&self, name: &str, wipe_workspace: bool) -> Result<Arc<Sandbox>, OrchestratorError> {
        self.replace(name, &Origin::default(), wipe_workspace).await
    }

    async fn replace(
        &self,
        name: &str,
        origin: &Origin,
        wipe_workspace: bool,
    ) -> Result<Arc<Sandbox>, OrchestratorError> {
        validate_key(name)?;
        let lock = self.lifecycle_lock(name);
        let _guard = lock.lock().await;
        let old = self.lock_map().get(name).cloned();
        if old.as_ref().is_some_and(|s| s.parent.is_some()) {
            return Err(OrchestratorError::NotPermitted(format!(
                "'{shown}' is a child sandbox; destroy_child('{shown}') and spawn a new one instead",
                shown = names::display(name)
            )));
        }
        // Everything that can refuse the new sandbox is checked while the
        // old one still runs: a broken project file, a missing image or a
        // full host must not cost it its processes and root filesystem.
        let slot = self.check_replacement(name, origin).await?;
        // The new sandbox's row replaces the loss (`record_created`).
        if let Some(found) = self.forget_lost(name) {
            found.in_background();
        }
        let existed = old.is_some();
        if existed {
            self.destroy_subtree(name).await;
            self.helper.delete_vm(name).await?;
            self.lock_map().remove(name);
        }
        if wipe_workspace {
            let dir = self.workspace_dir(name);
            if dir.exists() {
                std::fs::remove_dir_all(&dir)
                    .map_err(|source| OrchestratorError::Volume { path: dir.display().to_string(), source })?;
            }
        }
        let fresh = match self.create_locked(name, origin, Some(slot)).await {
            Ok(fresh) => fresh,
            Err(e) => {
                // The old VM is gone (the helper failed to make the new
                // one): what hung off it must follow, and a restart must not
                // report it lost.
                if existed {
                    self.notify(|l| l.destroyed(name));
                    self.record_removed(name).in_background();
                }
                return Err(e);
            }
        };
        // A reset replaces the VM, not the lease: it must not extend it.
        if existed {
            self.notify(|l| l.replaced(name));
        }
        if let Some(lease) = old.and_then(|s| s.lease_expires()) {
            fresh.set_lease(Some(lease));
            self.record_sandbox(&fresh).saved().await.map_err(|source| OrchestratorError::NotSaved {
                source: Box::new(source),
                done: format!("Sandbox '{}' was replaced", fresh.shown()),
                after_restart:
                    "after a restart of the server its lease starts over instead of ending when the old one did".into(),
            })?;
        }
        Ok(fresh)
    }

    /// Refuse a replacement of `name` from `origin` that [`Self::create_locked`]
    /// would refuse: its name, its project file and settings, its image, the
    /// capacity (counted as if `name` and its subtree were gone already),
    /// which is reserved for it.
    async fn check_replacement(
        &self,
        name: &str,
        origin: &Origin,
    ) -> Result<super::lease::CreateSlot<'_>, OrchestratorError> {
        names::validate_top_level_key(name)?;
        let (profile, _) = self.planned_profile(name, origin)?;
        let image = &profile.image;
        if !self.helper.list_images().await?.iter().any(|i| &i.name == image) {
            return Err(OrchestratorError::InvalidArgument(format!(
                "cannot replace sandbox '{}': image '{image}' does not exist (see images); the sandbox is unchanged",
                names::display(name)
            )));
        }
        let subtree = format!("{name}{}", names::CHILD_SEPARATOR);
        let replaced: Vec<_> =
            self.list().into_iter().filter(|s| s.name == name || s.name.starts_with(&subtree)).collect();
        self.preflight(name, &profile, &replaced)
    }

    /// Run a command in the named sandbox (created on first use), with the
    /// sandbox's persistent env, and record it in the audit log.
    pub async fn run(&self, name: &str, cmd: Command) -> Result<(Arc<Sandbox>, ExecResult), OrchestratorError> {
        let sandbox = self.get_or_create(name).await?;
        let result = self.run_in(&sandbox, cmd).await?;
        Ok((sandbox, result))
    }

    /// Run a command in a known sandbox.
    pub async fn run_in(&self, sandbox: &Sandbox, cmd: Command) -> Result<ExecResult, OrchestratorError> {
        self.run_with_env(sandbox, cmd, sandbox.env()).await
    }

    /// Run an internal probe: not audited and not counted as activity, so
    /// health checks never keep an idle sandbox alive.
    pub(super) async fn probe(&self, sandbox: &Sandbox, cmd: Command) -> Result<ExecResult, OrchestratorError> {
        let process = ProcessConfig {
            argv: cmd_argv(sandbox, cmd.argv),
            env: Default::default(),
            cwd: resolve_cwd(cmd.cwd),
            create_cwd: false,
            user: cmd.user,
            secret: cmd.secret,
        };
        Ok(exec::run(&self.helper, &sandbox.name, process, &cmd.stdin, cmd.timeout).await?)
    }

    /// Run a command with an explicit environment (the persistent env plus
    /// per-call secrets that must not be stored anywhere).
    pub async fn run_with_env(
        &self,
        sandbox: &Sandbox,
        cmd: Command,
        env: BTreeMap<String, String>,
    ) -> Result<ExecResult, OrchestratorError> {
        if cmd.timeout.is_zero() {
            return Err(OrchestratorError::InvalidArgument("timeout must be greater than 0".into()));
        }
        if let ShellOrArgv::Shell(line) = &cmd.argv {
            shell::check_length(line)?;
        }
        let direct = match &cmd.argv {
            ShellOrArgv::Shell(line) => shell::direct_argv(line),
            ShellOrArgv::Argv(_) => None,
        };
        let process = ProcessConfig {
            argv: cmd_argv(sandbox, cmd.argv),
            env: env.into_iter().collect(),
            cwd: resolve_cwd(cmd.cwd),
            create_cwd: true,
            user: cmd.user,
            secret: cmd.secret,
        };
        sandbox.touch();
        let _running = Running::start(sandbox);
        let mut result = None;
        if let Some(argv) = direct {
            let attempt = ProcessConfig { argv, ..process.clone() };
            match exec::run(&self.helper, &sandbox.name, attempt, &cmd.stdin, cmd.timeout).await {
                // Refused before it ran (no such program, …): let the shell
                // run it and word the error as a shell would.
                Err(HelperError::InvalidArgument(_)) => {}
                other => result = Some(other?),
            }
        }
        let mut result = match result {
            Some(r) => r,
            None => exec::run(&self.helper, &sandbox.name, process, &cmd.stdin, cmd.timeout).await?,
        };
        if let Some(text) = cmd.audit_as {
            let entry = sandbox.record(&text, result.exit_code(), result.duration);
            if let Err(e) = self.save_history(&sandbox.name, &entry).await {
                tracing::warn!(sandbox = %sandbox.name, error = %e, "could not save a history entry");
                result.history_unsaved = Some(format!("the change was not saved: {e}"));
            }
        }
        Ok(result)
    }

    /// Which sandboxes are really alive: their VM runs (the helper says so)
    /// and their agent answers a request within [`AGENT_ANSWER_TIMEOUT`]. A
    /// VM the helper still calls running may be frozen or have lost its
    /// agent (a stopped sandbox used to show `shell:alive`). Asked of every
    /// sandbox at once; not counted as activity.
    pub async fn running(&self) -> Result<HashMap<String, bool>, OrchestratorError> {
        let mut asks = tokio::task::JoinSet::new();
        for v in self.helper.list_vms().await? {
            let helper = self.helper.clone();
            asks.spawn(async move {
                let answers = v.state == VmState::Running
                    && matches!(
                        tokio::time::timeout(AGENT_ANSWER_TIMEOUT, helper.list_background(&v.id)).await,
                        Ok(Ok(_))
                    );
                (v.id, answers)
            });
        }
        Ok(asks.join_all().await.into_iter().collect())
    }
}
