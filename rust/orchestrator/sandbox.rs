//! Named sandboxes: the registry, auto-creation on first use, attach to the
//! helper's running VMs after an orchestrator restart, destroy and reset, and
//! running commands with the sandbox's persistent env and audit log.
use std::{
    collections::{BTreeMap, HashMap},
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime},
};

use super::{
    audit::AuditLog,
    error::OrchestratorError,
    exec::{self, ExecResult},
    helper_client::{HelperClient, Network, ProcessConfig, VmConfig, VmInfo, VmState},
    names::validate_sandbox_name,
};

/// Label on every VM the orchestrator creates, holding the sandbox name.
const NAME_LABEL: &str = "sandbox-mcp.name";
/// Where a sandbox's workspace volume is mounted.
pub const WORKSPACE: &str = "/workspace";

/// Defaults for new sandboxes.
#[derive(Debug, Clone)]
pub struct ManagerConfig {
    /// Image for primaries (`SANDBOX_MCP_DEFAULT_IMAGE`, default `mcp-dev`).
    pub image: String,
    /// CPUs per sandbox.
    pub cpus: u32,
    /// Memory per sandbox in bytes.
    pub memory_bytes: u64,
    /// Network mode (`SANDBOX_MCP_NETWORK`: `egress` (default) or `none`).
    pub network: Network,
    /// Root of per-sandbox volumes.
    pub volumes_dir: PathBuf,
}

impl ManagerConfig {
    /// Defaults, overridable from the environment.
    pub fn from_env() -> Result<Self, OrchestratorError> {
        let network = match std::env::var("SANDBOX_MCP_NETWORK").as_deref() {
            Err(_) | Ok("") | Ok("egress") => Network::Egress,
            Ok("none") => Network::None,
            Ok(other) => {
                return Err(OrchestratorError::InvalidArgument(format!(
                    "SANDBOX_MCP_NETWORK must be 'egress' or 'none', not '{other}'"
                )));
            }
        };
        Ok(Self {
            image: std::env::var("SANDBOX_MCP_DEFAULT_IMAGE")
                .ok()
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| crate::image::DEFAULT_IMAGE.to_string()),
            cpus: 2,
            memory_bytes: 512 << 20,
            network,
            volumes_dir: crate::paths::volumes_dir(),
        })
    }
}

/// One live sandbox.
#[derive(Debug)]
pub struct Sandbox {
    /// Logical name (also the VM id).
    pub name: String,
    /// Image it runs.
    pub image: String,
    /// Shell used for `-c` commands.
    pub shell: String,
    /// CPU limit.
    pub cpus: u32,
    /// Memory limit in bytes.
    pub memory_bytes: u64,
    /// When the VM was started.
    pub started_at: SystemTime,
    /// Persistent env applied to every command; mirrored inside the sandbox
    /// so it survives an orchestrator restart.
    pub(super) env: Mutex<BTreeMap<String, String>>,
    /// Recent commands.
    pub(super) audit: Mutex<AuditLog>,
    last_activity: Mutex<Instant>,
}

impl Sandbox {
    fn from_vm(vm: &VmInfo, name: String) -> Self {
        let started_at = SystemTime::UNIX_EPOCH + Duration::from_millis(vm.started_at_ms.max(0) as u64);
        Self {
            name,
            image: vm.image.clone(),
            shell: vm.shell.clone(),
            cpus: vm.cpus,
            memory_bytes: vm.memory_bytes,
            started_at,
            env: Mutex::default(),
            audit: Mutex::default(),
            last_activity: Mutex::new(Instant::now()),
        }
    }

    /// Seconds since the last command.
    pub fn idle(&self) -> Duration {
        self.last_activity.lock().map(|t| t.elapsed()).unwrap_or_default()
    }

    fn touch(&self) {
        if let Ok(mut t) = self.last_activity.lock() {
            *t = Instant::now();
        }
    }

    /// Number of commands in the audit log.
    pub fn command_count(&self) -> usize {
        self.audit.lock().map(|a| a.len()).unwrap_or(0)
    }

    /// The newest `limit` audit entries, newest first.
    pub fn history(&self, limit: usize) -> Vec<super::audit::AuditEntry> {
        self.audit.lock().map(|a| a.newest(limit)).unwrap_or_default()
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
        }
    }
}

/// The registry of sandboxes, shared by every MCP session.
pub struct SandboxManager {
    pub(super) helper: HelperClient,
    config: ManagerConfig,
    sandboxes: Mutex<BTreeMap<String, Arc<Sandbox>>>,
    /// One lock per name so concurrent first uses create a sandbox once.
    lifecycle_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl SandboxManager {
    /// Connect the registry to a helper and attach every running VM that a
    /// previous orchestrator created, with its persistent env.
    pub async fn start(helper: HelperClient, config: ManagerConfig) -> Result<Self, OrchestratorError> {
        let manager = Self {
            helper,
            config,
            sandboxes: Mutex::default(),
            lifecycle_locks: Mutex::default(),
        };
        for vm in manager.helper.list_vms().await? {
            let Some(name) = vm.labels.get(NAME_LABEL).cloned() else { continue };
            if vm.state != VmState::Running {
                // A VM we created that is no longer running holds only a
                // writable layer; the workspace is a volume and stays.
                tracing::info!(sandbox = %name, "removing stopped sandbox VM left from an earlier run");
                manager.helper.delete_vm(&vm.id).await.ok();
                continue;
            }
            let sandbox = Arc::new(Sandbox::from_vm(&vm, name.clone()));
            match manager.load_env(&sandbox).await {
                Ok(env) => *sandbox.env.lock().expect("fresh lock") = env,
                Err(e) => tracing::warn!(sandbox = %name, "could not read persistent env: {e}"),
            }
            tracing::info!(sandbox = %name, "attached running sandbox");
            manager.lock_map().insert(name, sandbox);
        }
        Ok(manager)
    }

    /// The defaults new sandboxes get.
    pub fn config(&self) -> &ManagerConfig {
        &self.config
    }

    fn lock_map(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Arc<Sandbox>>> {
        self.sandboxes.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lifecycle_lock(&self, name: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.lifecycle_locks.lock().unwrap_or_else(|p| p.into_inner());
        locks.entry(name.to_string()).or_default().clone()
    }

    /// Every sandbox, sorted by name.
    pub fn list(&self) -> Vec<Arc<Sandbox>> {
        self.lock_map().values().cloned().collect()
    }

    /// An existing sandbox (never creates one).
    pub fn get(&self, name: &str) -> Result<Arc<Sandbox>, OrchestratorError> {
        validate_sandbox_name(name)?;
        self.lock_map().get(name).cloned().ok_or_else(|| OrchestratorError::NoSuchSandbox(name.to_string()))
    }

    /// The named sandbox, created and booted on first use.
    pub async fn get_or_create(&self, name: &str) -> Result<Arc<Sandbox>, OrchestratorError> {
        validate_sandbox_name(name)?;
        if let Some(s) = self.lock_map().get(name) {
            return Ok(s.clone());
        }
        let lock = self.lifecycle_lock(name);
        let _guard = lock.lock().await;
        if let Some(s) = self.lock_map().get(name) {
            return Ok(s.clone());
        }
        self.create_locked(name).await
    }

    /// Host directory of a sandbox's workspace volume.
    pub fn workspace_dir(&self, name: &str) -> PathBuf {
        self.config.volumes_dir.join(name).join("workspace")
    }

    async fn create_locked(&self, name: &str) -> Result<Arc<Sandbox>, OrchestratorError> {
        let workspace = self.workspace_dir(name);
        std::fs::create_dir_all(&workspace)
            .map_err(|source| OrchestratorError::Volume { path: workspace.display().to_string(), source })?;
        let cfg = VmConfig {
            id: name.to_string(),
            image: self.config.image.clone(),
            cpus: self.config.cpus,
            memory_bytes: self.config.memory_bytes,
            mounts: vec![(workspace, WORKSPACE.to_string())],
            network: self.config.network,
            labels: HashMap::from([(NAME_LABEL.to_string(), name.to_string())]),
        };
        self.helper.create_vm(cfg).await?;
        let vm = match self.helper.start_vm(name).await {
            Ok(vm) => vm,
            Err(e) => {
                // Never leave a half-made VM behind (the reference leaked these).
                self.helper.delete_vm(name).await.ok();
                return Err(e.into());
            }
        };
        let sandbox = Arc::new(Sandbox::from_vm(&vm, name.to_string()));
        self.lock_map().insert(name.to_string(), sandbox.clone());
        tracing::info!(sandbox = %name, "created sandbox");
        Ok(sandbox)
    }

    /// Destroy a sandbox's VM. Its workspace volume is kept.
    pub async fn destroy(&self, name: &str) -> Result<Arc<Sandbox>, OrchestratorError> {
        let lock = self.lifecycle_lock(name);
        let _guard = lock.lock().await;
        let sandbox = self.get(name)?;
        self.helper.delete_vm(name).await?;
        self.lock_map().remove(name);
        Ok(sandbox)
    }

    /// Replace a sandbox with a fresh one from its image (creating it if it did
    /// not exist). The workspace is kept unless `wipe_workspace`.
    pub async fn reset(&self, name: &str, wipe_workspace: bool) -> Result<Arc<Sandbox>, OrchestratorError> {
        validate_sandbox_name(name)?;
        let lock = self.lifecycle_lock(name);
        let _guard = lock.lock().await;
        if self.lock_map().contains_key(name) {
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
        self.create_locked(name).await
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
        if cmd.timeout.is_zero() {
            return Err(OrchestratorError::InvalidArgument("timeout must be greater than 0".into()));
        }
        let argv = match cmd.argv {
            ShellOrArgv::Shell(line) => vec![sandbox.shell.clone(), "-c".to_string(), line],
            ShellOrArgv::Argv(argv) => argv,
        };
        let process = ProcessConfig {
            argv,
            env: sandbox.env().into_iter().collect(),
            cwd: cmd.cwd,
            create_cwd: true,
        };
        sandbox.touch();
        let result = exec::run(&self.helper, &sandbox.name, process, &cmd.stdin, cmd.timeout).await?;
        sandbox.touch();
        if let Some(text) = cmd.audit_as {
            if let Ok(mut audit) = sandbox.audit.lock() {
                audit.record(&text, result.exit_code(), result.duration);
            }
        }
        Ok(result)
    }

    /// Which sandboxes' VMs the helper reports as running.
    pub async fn running(&self) -> Result<HashMap<String, bool>, OrchestratorError> {
        let vms = self.helper.list_vms().await?;
        Ok(vms.into_iter().map(|v| (v.id, v.state == VmState::Running)).collect())
    }
}
