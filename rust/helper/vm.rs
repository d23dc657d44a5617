//! The VM registry and lifecycle: CREATED → RUNNING ⇄ STOPPED, any → deleted.
//!
//! Each VM has two locks: `op` serializes lifecycle operations on that VM
//! (a start or a stop with its grace period may take a while) and holds the
//! running instance; `data` is a short-lived lock for the state everyone
//! reads (GetVm, ListVms, Exec), so reads never wait behind a slow stop.
//!
//! A VM keeps its own copy of its image's record (layers, config), so it
//! runs on after the image is deleted, and its layers count as used until
//! the VM is deleted. Commit and clone live in [`images`].
//!
//! Each VM runs on the driver its spec names (`VmConfig::driver`, the
//! first driver when empty), chosen at creation and kept for every start,
//! stop, exec and copy after.
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::agent_link::AgentLink;
use super::driver::{BindMount, BootSpec, Driver, DriverError, Egress, Instance, Limits};
use super::error::HelperError;
use super::netstack::events::{Events, Snapshot};
use super::quota;
use super::seed::{self, SeedFile};
use super::spec::{Network, VmConfig};
use super::storage::{prepare_dir, share_mounts, vm_dir};
use sandbox_image::{ImageError, ImageInfo, ImageStore};
use sandbox_userns::IdMapper;

mod adopt;
mod images;

pub use images::CommitRequest;

/// Where a VM is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VmState {
    /// Filesystem prepared, never started.
    Created,
    /// Booted; the agent accepts Exec.
    Running,
    /// Was running; everything in it is gone.
    Stopped,
}

impl VmState {
    /// StartVm is valid.
    pub fn can_start(self) -> bool {
        matches!(self, VmState::Created | VmState::Stopped)
    }
    /// StopVm is valid.
    pub fn can_stop(self) -> bool {
        self == VmState::Running
    }
    /// Exec is valid.
    pub fn can_exec(self) -> bool {
        self == VmState::Running
    }
}

impl std::fmt::Display for VmState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            VmState::Created => "created",
            VmState::Running => "running",
            VmState::Stopped => "stopped",
        })
    }
}

/// A snapshot of one VM.
#[derive(Debug, Clone)]
pub struct VmInfo {
    /// Its spec, with defaults applied.
    pub config: VmConfig,
    /// Lifecycle state.
    pub state: VmState,
    /// Unix ms.
    pub created_at_ms: i64,
    /// Unix ms of the last start, 0 if never.
    pub started_at_ms: i64,
    /// The image's shell.
    pub shell: String,
    /// Why it stopped on its own; empty otherwise.
    pub stop_reason: String,
    /// When its image (a clone's: its source's) was built, Unix ms.
    pub image_created_at_ms: i64,
    /// Why its current or last run has no cgroup limits; empty otherwise.
    pub limits_not_enforced: String,
}

/// What Exec needs to reach a running VM's agent.
#[derive(Debug, Clone)]
pub struct ExecTarget {
    /// The connection to its agent.
    pub agent: Arc<AgentLink>,
    /// The image's environment, then the VM's, applied before the
    /// process's own.
    pub env: Vec<(String, String)>,
    /// The image's default user; empty means root.
    pub user: String,
}

/// What Dial, Stats and commits need from a running VM.
#[derive(Debug, Clone)]
pub struct RunHandles {
    /// The connection to its agent.
    pub agent: Arc<AgentLink>,
    /// The driver's instance.
    pub instance: Arc<dyn Instance>,
    /// When this run started.
    pub started: Instant,
    /// Its disk usage and quota.
    pub quota: Arc<quota::Watch>,
}

struct Data {
    info: VmInfo,
    /// Set while running.
    run: Option<RunHandles>,
    /// The egress decisions of the current or last run.
    events: Arc<Events>,
    /// Bumped on every start, so a late exit notice of an older run cannot
    /// stop a newer one.
    generation: u64,
}

struct Run {
    instance: Arc<dyn Instance>,
    /// Ends the disk quota watcher with the run.
    _quota: tokio_util::task::AbortOnDropHandle<()>,
    /// Set once the launcher exited, with a description of how.
    exited: watch::Receiver<Option<String>>,
}

struct Slot {
    id: String,
    /// The driver it boots with.
    driver: Arc<dyn Driver>,
    /// The image as it was when the VM was created (a clone's: its source's).
    image: ImageInfo,
    dir: PathBuf,
    op: tokio::sync::Mutex<Option<Run>>,
    data: Mutex<Data>,
}

impl Slot {
    fn data(&self) -> std::sync::MutexGuard<'_, Data> {
        self.data.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Every VM this helper knows, in creation order.
pub struct VmManager {
    /// The id map this helper's images are unpacked for and its VMs get
    /// (whichever driver runs them), or why there is none (not Linux, or no
    /// subordinate ids for this user).
    ids: Result<IdMapper, String>,
    /// Every driver, the default first.
    drivers: Vec<Arc<dyn Driver>>,
    images: ImageStore,
    vms: Mutex<Vec<Arc<Slot>>>,
    me: Weak<VmManager>,
}

impl VmManager {
    /// A manager with no VMs, booting with the first of `drivers` unless a
    /// VM names another, with the id map `ids`.
    pub fn new(ids: Result<IdMapper, String>, drivers: Vec<Arc<dyn Driver>>, images: ImageStore) -> Arc<Self> {
        assert!(!drivers.is_empty(), "a helper runs its vms on at least one driver");
        Arc::new_cyclic(|me| VmManager { ids, drivers, images, vms: Mutex::new(Vec::new()), me: me.clone() })
    }

    /// The id map images are unpacked for, or why there is none.
    pub fn id_mapper(&self) -> Result<&IdMapper, &str> {
        self.ids.as_ref().map_err(String::as_str)
    }

    /// Every driver this helper has, for GetInfo.
    pub fn drivers(&self) -> &[Arc<dyn Driver>] {
        &self.drivers
    }

    /// The driver named `name` (the default when empty), if it can run VMs
    /// here: an unknown name is the request's mistake, an unusable driver
    /// the host's.
    fn driver_named(&self, name: &str) -> Result<Arc<dyn Driver>, HelperError> {
        let name = if name.is_empty() { self.drivers[0].name() } else { name };
        let Some(driver) = self.drivers.iter().find(|d| d.name() == name) else {
            let known: Vec<_> = self.drivers.iter().map(|d| d.name()).collect();
            return Err(HelperError::invalid(
                "spec.driver",
                format!("{name:?} is not a driver of this helper (it has: {})", known.join(", ")),
            ));
        };
        if let Some(reason) = driver.unavailable_reason() {
            return Err(HelperError::DriverUnusable { driver: name.into(), reason });
        }
        Ok(driver.clone())
    }

    /// The image store.
    pub fn images(&self) -> &ImageStore {
        &self.images
    }

    fn list_slots(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Slot>>> {
        self.vms.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn slot(&self, id: &str) -> Result<Arc<Slot>, HelperError> {
        self.list_slots().iter().find(|s| s.id == id).cloned().ok_or_else(|| HelperError::VmNotFound(id.into()))
    }

    /// Registers a VM and prepares its writable layer (a copy of another
    /// VM's with `clone_from`), with `files` placed in it.
    pub async fn create(&self, config: VmConfig, files: Vec<SeedFile>) -> Result<VmInfo, HelperError> {
        let mut config = config.validate()?;
        seed::validate(&files)?;
        if self.slot(&config.id).is_ok() {
            return Err(HelperError::AlreadyExists(config.id));
        }
        if !config.clone_from.is_empty() {
            if !files.is_empty() {
                return Err(HelperError::invalid("spec.files", "not with spec.clone_from"));
            }
            return self.create_clone(config).await;
        }
        let driver = self.driver_named(&config.driver)?;
        config.driver = driver.name().into();
        // Held until the VM is registered, so a layer collection in between
        // cannot take the image's layers away.
        let _store = self.images.lock();
        let image = self.images.get(&config.image).map_err(|e| match e {
            ImageError::NotFound(name) => HelperError::ImageNotFound(name),
            other => HelperError::Image(other),
        })?;
        if !image.reference.is_empty() {
            // Pulled by the VM layer, into the guest's own disk: no host
            // files, so no id map to match.
            if !driver.capabilities().pull_images {
                return Err(ImageError::NeedsPull {
                    name: image.name,
                    reference: image.reference,
                    driver: driver.name().into(),
                }
                .into());
            }
        } else if let Ok(mapper) = self.id_mapper() {
            image.check_id_map(mapper.id_map())?;
        }
        let dir = vm_dir(&config.id);
        prepare_dir(&dir, &image)?;
        // Seeded files go to the writable layer dir on every driver, owned
        // by the VM's root as the helper's id map shows it: the namespace
        // driver mounts that dir, the vm driver builds its writable disk
        // from it under the same map.
        if !files.is_empty() {
            let mut layers = self.images.layer_paths(&image.layers());
            layers.reverse();
            let owner = nix::unistd::geteuid().is_root().then_some(image.id_map.host_root().0);
            let placed = seed::place(&dir.join("upper"), &layers, owner, &files).and_then(|hand_over| {
                match (hand_over.is_empty(), self.id_mapper()) {
                    #[cfg(linux_host)]
                    (false, Ok(mapper)) => Ok(sandbox_userns::chown_mapped(mapper, &hand_over)?),
                    _ => Ok(()),
                }
            });
            if let Err(e) = placed {
                let _ = sandbox_userns::remove_tree(&dir);
                return Err(e);
            }
        }
        share_mounts(&config, &image);
        self.register(config, driver, image, dir)
    }

    /// Adds a VM whose directory is prepared; the caller holds the image
    /// store's lock.
    fn register(
        &self,
        config: VmConfig,
        driver: Arc<dyn Driver>,
        image: ImageInfo,
        dir: PathBuf,
    ) -> Result<VmInfo, HelperError> {
        let info = VmInfo {
            shell: image.shell.clone(),
            config,
            state: VmState::Created,
            created_at_ms: sandbox_base::clock::unix_ms(),
            started_at_ms: 0,
            stop_reason: String::new(),
            image_created_at_ms: image.created_at_ms,
            limits_not_enforced: String::new(),
        };
        let slot = Arc::new(Slot {
            id: info.config.id.clone(),
            driver,
            image,
            dir,
            op: tokio::sync::Mutex::new(None),
            data: Mutex::new(Data { info: info.clone(), run: None, events: Default::default(), generation: 0 }),
        });
        let mut vms = self.list_slots();
        if vms.iter().any(|s| s.id == slot.id) {
            return Err(HelperError::AlreadyExists(slot.id.clone()));
        }
        self.images.add_vm_ref(&slot.id, &slot.image.layers())?;
        vms.push(slot);
        Ok(info)
    }

    /// Boots a created or stopped VM; returns once its agent answers.
    pub async fn start(&self, id: &str) -> Result<VmInfo, HelperError> {
        let slot = self.slot(id)?;
        let mut op = slot.op.lock().await;
        let (config, state) = {
            let d = slot.data();
            (d.info.config.clone(), d.info.state)
        };
        if !state.can_start() {
            return Err(HelperError::WrongState { op: "start", id: id.into(), state });
        }
        let events = Arc::new(Events::default());
        let spec = self.boot_spec(&slot, &config, &events);
        adopt::forget(&slot.dir);
        let instance = slot.driver.boot(&spec).await.map_err(|e| match e {
            DriverError::Unavailable(reason) => HelperError::Unavailable(reason),
            other => HelperError::Driver(other),
        })?;
        let info = self.begin_run(&slot, &mut op, instance, events);
        adopt::record(&slot.dir, &info, &slot.image);
        Ok(info)
    }

    /// What the driver boots (or adopts) for VM `slot` with `config`.
    fn boot_spec(&self, slot: &Slot, config: &VmConfig, events: &Arc<Events>) -> BootSpec {
        BootSpec {
            id: slot.id.clone(),
            hostname: config.hostname.clone(),
            layers: self.images.layer_paths(&slot.image.layers()),
            image_reference: Some(slot.image.reference.clone()).filter(|r| !r.is_empty()),
            dir: slot.dir.clone(),
            mounts: config
                .mounts
                .iter()
                .map(|m| BindMount { host: m.host_path.clone(), guest: m.guest_path.clone(), read_only: m.read_only })
                .collect(),
            limits: Limits { cpus: config.cpus, memory_bytes: config.memory_bytes, pids: config.pids_limit },
            disk_bytes: config.disk_bytes,
            egress: (config.network == Network::Egress)
                .then(|| Egress::Stack(config.network_policy.clone(), events.clone())),
        }
    }

    /// Makes `instance` (booted or adopted) VM `slot`'s run: its agent link,
    /// disk quota watcher and exit watch; returns the VM, running.
    fn begin_run(
        &self,
        slot: &Arc<Slot>,
        op: &mut Option<Run>,
        instance: Arc<dyn Instance>,
        events: Arc<Events>,
    ) -> VmInfo {
        let config = slot.data().info.config.clone();
        let id = slot.id.as_str();
        let exit = instance.take_exit();
        let agent = AgentLink::new(id, instance.connection(), instance.agent_dialer());
        let (writers, parts) = match instance.host_processes() {
            #[cfg(linux_host)]
            Some(p) => (quota::Writers::Host { pid1: p.pid1, agent: p.agent }, disk_parts(Some(&slot.dir), &config)),
            _ => {
                (quota::Writers::Guest { agent: agent.clone(), instance: instance.clone() }, disk_parts(None, &config))
            }
        };
        let (quota, quota_task) = quota::watch(config.disk_bytes, parts, writers);
        let handles = RunHandles { agent, instance: instance.clone(), started: Instant::now(), quota };
        let limits_not_enforced = instance.limits_not_enforced();
        let generation = {
            let mut d = slot.data();
            d.run = Some(handles);
            d.events = events;
            d.generation += 1;
            d.info.state = VmState::Running;
            d.info.started_at_ms = sandbox_base::clock::unix_ms();
            d.info.stop_reason.clear();
            d.info.limits_not_enforced = limits_not_enforced;
            d.generation
        };
        let (tx, rx) = watch::channel(None);
        *op = Some(Run { instance, _quota: quota_task, exited: rx });
        let (me, id_owned) = (self.me.clone(), id.to_string());
        tokio::spawn(async move {
            let how = match exit {
                Some(exit) => exit.await,
                None => "the driver lost track of the vm".into(),
            };
            let _ = tx.send(Some(how.clone()));
            if let Some(me) = me.upgrade() {
                me.on_exit(&id_owned, generation, how).await;
            }
        });
        slot.data().info.clone()
    }

    /// The launcher of run `generation` exited without being asked to.
    async fn on_exit(&self, id: &str, generation: u64, how: String) {
        let Ok(slot) = self.slot(id) else { return };
        let mut op = slot.op.lock().await;
        if slot.data().generation != generation {
            return;
        }
        if let Some(run) = op.take() {
            tracing::warn!(vm = id, reason = %how, "vm stopped on its own");
            run.instance.cleanup();
            let mut d = slot.data();
            // The quota watcher ends a VM whose writes outlive its kill
            // rounds by killing init: its reason is the better one.
            let quota = d.run.take().map(|r| r.quota.reading()).filter(|r| r.stopped_vm);
            d.info.state = VmState::Stopped;
            d.info.stop_reason = quota.map_or(how, |r| r.exceeded);
        }
    }

    /// Stops a running VM: TERM everything, KILL after `grace`.
    pub async fn stop(&self, id: &str, grace: Duration) -> Result<VmInfo, HelperError> {
        let slot = self.slot(id)?;
        let mut op = slot.op.lock().await;
        let state = slot.data().info.state;
        let run = match op.take() {
            Some(run) if state.can_stop() => run,
            other => {
                *op = other;
                return Err(HelperError::WrongState { op: "stop", id: id.into(), state });
            }
        };
        stop_run(run, grace).await;
        let mut d = slot.data();
        d.run = None;
        d.info.state = VmState::Stopped;
        d.info.stop_reason.clear();
        Ok(d.info.clone())
    }

    /// Stops (if running) and removes a VM with its writable layer. A VM
    /// this helper does not know is still NOT_FOUND, but the writable layer
    /// a helper that died left under its id goes: deleting a VM lost with
    /// its helper is how a client frees its disk.
    pub async fn delete(&self, id: &str) -> Result<(), HelperError> {
        let slot = match self.slot(id) {
            Ok(slot) => slot,
            Err(e) => {
                if super::spec::is_vm_id(id) {
                    remove_vm_dir(vm_dir(id)).await?;
                }
                return Err(e);
            }
        };
        let mut op = slot.op.lock().await;
        if let Some(run) = op.take() {
            // The filesystem is about to go: nothing inside needs a grace period.
            stop_run(run, Duration::ZERO).await;
        }
        self.list_slots().retain(|s| !Arc::ptr_eq(s, &slot));
        self.images.remove_vm_ref(id);
        remove_vm_dir(slot.dir.clone()).await?;
        self.collect_layers().await;
        Ok(())
    }

    /// What VM `id`'s egress policy decided during its current (or last)
    /// run; empty for a VM that never ran or has no egress.
    pub fn network_events(&self, id: &str) -> Result<Snapshot, HelperError> {
        Ok(self.slot(id)?.data().events.snapshot())
    }

    /// One VM.
    pub fn get(&self, id: &str) -> Result<VmInfo, HelperError> {
        Ok(self.slot(id)?.data().info.clone())
    }

    /// Every VM, in creation order.
    pub fn list(&self) -> Vec<VmInfo> {
        let slots: Vec<_> = self.list_slots().clone();
        slots.iter().map(|s| s.data().info.clone()).collect()
    }

    /// Where to run a process in VM `id`, which must be running.
    pub fn exec_target(&self, id: &str) -> Result<ExecTarget, HelperError> {
        let slot = self.slot(id)?;
        let d = slot.data();
        let agent = match &d.run {
            Some(run) if d.info.state.can_exec() => run.agent.clone(),
            _ => return Err(HelperError::WrongState { op: "exec in", id: id.into(), state: d.info.state }),
        };
        let image_env = slot.image.config.env.iter();
        Ok(ExecTarget {
            agent,
            env: image_env.chain(&d.info.config.env).map(|(k, v)| (k.clone(), v.clone())).collect(),
            user: slot.image.config.user.clone(),
        })
    }

    /// The handles of running VM `id`, for `op` (named in the error).
    pub fn run_handles(&self, id: &str, op: &'static str) -> Result<RunHandles, HelperError> {
        let slot = self.slot(id)?;
        let d = slot.data();
        match &d.run {
            Some(run) if d.info.state == VmState::Running => Ok(run.clone()),
            _ => Err(HelperError::WrongState { op, id: id.into(), state: d.info.state }),
        }
    }

    /// Stops every running VM (helper shutdown).
    pub async fn shutdown(&self, grace: Duration) {
        let slots: Vec<_> = self.list_slots().clone();
        for slot in slots {
            let mut op = slot.op.lock().await;
            if let Some(run) = op.take() {
                stop_run(run, grace).await;
                let mut d = slot.data();
                d.run = None;
                d.info.state = VmState::Stopped;
            }
        }
        for driver in &self.drivers {
            driver.release().await;
        }
    }
}

/// Removes a VM's directory (its writable layer), if there is one. A
/// writable layer can hold many files: the walk stays off the runtime's
/// worker threads.
async fn remove_vm_dir(dir: PathBuf) -> Result<(), HelperError> {
    let walk = dir.clone();
    let removed = tokio::task::spawn_blocking(move || sandbox_userns::remove_tree(&walk))
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e)));
    match removed {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(HelperError::io(format!("remove {}", dir.display()), e))
        }
        _ => Ok(()),
    }
}

/// What counts against a VM's disk quota on the host: its writable layer
/// when that is a host directory in `dir` (/tmp is part of it), and its
/// writable mounts.
fn disk_parts(dir: Option<&std::path::Path>, config: &VmConfig) -> Vec<quota::Part> {
    let layer = dir.map(|d| quota::Part { label: "writable layer".into(), path: d.join("upper") });
    let mounts = config
        .mounts
        .iter()
        .filter(|m| !m.read_only)
        .map(|m| quota::Part { label: m.guest_path.display().to_string(), path: m.host_path.clone() });
    layer.into_iter().chain(mounts).collect()
}

async fn stop_run(run: Run, grace: Duration) {
    let Run { instance, mut exited, .. } = run;
    if grace.is_zero() {
        instance.kill();
    } else {
        instance.request_stop();
        if tokio::time::timeout(grace, exited.wait_for(Option::is_some)).await.is_err() {
            instance.kill();
        }
    }
    let _ = exited.wait_for(Option::is_some).await;
    instance.cleanup();
}
