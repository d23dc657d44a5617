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
    audit::AuditLog,
    config::Config,
    error::OrchestratorError,
    helper_client::{HelperClient, VmInfo},
    isolation::Isolation,
    names::{self},
    network::Network,
};

mod create;
mod registry;
mod reset;
mod revive;
pub use revive::Comeback;
mod run;

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

    /// Its VM's id at the helper (what the drop-in answers call its
    /// container): its key, which also names its volume directory.
    pub fn vm_id(&self) -> &str {
        &self.name
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
    /// A lost sandbox coming back: what the state database kept for it,
    /// recorded with its new row in one transaction.
    pub comeback: Option<Arc<crate::state::kept::Kept>>,
}

/// A future returned by a [`SandboxListener`] hook.
pub type HookFuture<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), OrchestratorError>> + Send + 'a>>;

/// What a [`SandboxListener`] put back onto a sandbox that came back after
/// a loss, one item each: what is back, or what is not and why.
pub type NotesFuture<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Vec<Result<String, String>>> + Send + 'a>>;

/// Told when a sandbox is created, goes away or is replaced, so what hangs
/// off it (port forwards, sync jobs, the sandbox-ctl socket) follows.
pub trait SandboxListener: Send + Sync {
    /// The sandbox was destroyed or reaped.
    fn destroyed(&self, name: &str);
    /// The sandbox's VM went away on its own; what hangs off it may come
    /// back with it ([`Self::came_back`]). As destroyed unless overridden.
    fn lost(&self, name: &str) {
        self.destroyed(name);
    }
    /// A lost sandbox was booted again on its next use, with what the
    /// state database `kept` for it.
    fn came_back<'a>(&'a self, _sandbox: &'a Arc<Sandbox>, _kept: &'a crate::state::kept::Kept) -> NotesFuture<'a> {
        Box::pin(async { Vec::new() })
    }
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
    /// lost name is never silently re-created: the next call on it brings
    /// it back and says so ([`Self::revive`]); `destroy` forgets it.
    lost: Mutex<BTreeMap<String, String>>,
    /// What the loss of a sandbox brought back without a call (see
    /// [`Self::revive_serving`]) cost: told by the next call on it.
    comeback_notices: Mutex<BTreeMap<String, revive::Comeback>>,
    /// False while the watchdog restarts a dead helper and sorts out which
    /// sandboxes the new one adopted: calls naming a sandbox wait for it
    /// (see [`Self::revive`]).
    pub(super) helper_settled: tokio::sync::watch::Sender<bool>,
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
