//! The warm pool: per [`Shape`], up to `size` vms restored from the shape's
//! template and left paused at guest init's handshake, each waiting for a
//! sandbox's disk, `/workspace` and "go" (and, a shape with a network card,
//! for the sandbox's stack to take the card's connection: the policy is
//! known only then). [`Warm::take`] hands one out and
//! the pool refills in the background; templates are built in the
//! background too, the first time a shape boots cold. Idle vms are killed
//! by [`Warm::drain`] (the helper's exit).
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use super::instance::{Instance, Shape, Start};
use super::template::Template;
use crate::driver::cgroup::{CgroupLayout, VmCgroup};

/// The helper's setting for the pool's size per shape (default 1; 0: no
/// pool, vms are restored from the template on demand).
pub const POOL_SIZE_ENV: &str = "SANDBOX_MCP_VM_POOL";
/// The default pool size per shape.
pub const DEFAULT_POOL_SIZE: usize = 1;

/// The pool size the helper was configured with.
pub fn configured_size() -> usize {
    std::env::var(POOL_SIZE_ENV).ok().and_then(|v| v.trim().parse().ok()).unwrap_or(DEFAULT_POOL_SIZE)
}

/// A restored vm waiting in the pool, with its own run directory.
pub struct Pooled {
    /// The vm (paused, state loaded).
    pub vm: Instance,
    /// Its directory (sockets, console).
    pub run_dir: PathBuf,
    /// Its cgroup while it waits (a cold vm's limits for its shape), to be
    /// removed once qemu moved into its sandbox's or ended.
    pub cgroup: Option<VmCgroup>,
}

/// Templates and the pool of one driver.
pub struct Warm {
    size: usize,
    templates: PathBuf,
    run_root: PathBuf,
    vms: Mutex<HashMap<PathBuf, Vec<Pooled>>>,
    /// Shapes whose template or pool is being worked on (one task each).
    busy: Mutex<HashSet<PathBuf>>,
    /// Where template and pool vms get cgroups of their own, if anywhere.
    cgroups: OnceLock<CgroupLayout>,
}

/// Numbers the run dirs of vms started for no sandbox: process-wide, as
/// several drivers (tests) may share one run root.
static RUN_DIRS: AtomicU64 = AtomicU64::new(0);

impl std::fmt::Debug for Warm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Warm").field("size", &self.size).field("templates", &self.templates).finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Warm {
    /// Templates under `templates`, pool vms' run dirs under `run_root`.
    pub fn new(size: usize, templates: PathBuf, run_root: PathBuf) -> Self {
        Warm {
            size,
            templates,
            run_root,
            vms: Mutex::new(HashMap::new()),
            busy: Mutex::new(HashSet::new()),
            cgroups: OnceLock::new(),
        }
    }

    /// Runs template and pool vms in cgroups of `layout`, each with the
    /// limits a cold vm of its shape gets (a template build is bounded as
    /// one sandbox's vm is).
    pub fn limit(&self, layout: CgroupLayout) {
        let _ = self.cgroups.set(layout);
    }

    /// A cgroup for a vm of `shape` started for no sandbox in `run_dir`
    /// (named after it); none without a layout, or if it cannot be made
    /// (the vm then runs in the helper's group, as it would without one).
    fn cgroup(&self, shape: &Shape, run_dir: &Path) -> Option<VmCgroup> {
        let layout = self.cgroups.get()?;
        let name = run_dir.file_name()?.to_string_lossy();
        let limits = super::driver::host_limits(shape.cpus, shape.memory_mib << 20);
        layout
            .create(&name, limits)
            .inspect_err(|e| tracing::warn!(error = %e, "a warm vm runs without its cgroup"))
            .ok()
    }

    /// The template of `shape`.
    pub fn template(&self, shape: &Shape) -> Template {
        Template::of(&self.templates, shape)
    }

    /// A pooled vm of `shape`, if one waits.
    pub fn take(&self, shape: &Shape) -> Option<Pooled> {
        lock(&self.vms).get_mut(&self.template(shape).state()).and_then(Vec::pop)
    }

    /// How many vms of `shape` wait in the pool.
    pub fn ready(&self, shape: &Shape) -> usize {
        lock(&self.vms).get(&self.template(shape).state()).map_or(0, Vec::len)
    }

    /// A fresh run directory for a vm the driver starts on its own.
    pub fn run_dir(&self, what: &str) -> PathBuf {
        self.run_root.join(format!("{what}-{}-{}", std::process::id(), RUN_DIRS.fetch_add(1, Ordering::Relaxed)))
    }

    /// Removes the templates vms of `assets` cannot use
    /// ([`Template::collect`]), then, in the background, fills the pool of
    /// every shape with a current template (the helper starts).
    pub fn keep_warm(self: &Arc<Self>, assets: &super::assets::Assets) {
        let swept = Template::collect(&self.templates, &assets.kernel, &assets.initramfs);
        if self.size > 0 {
            for shape in swept.current {
                self.warm_up(shape);
            }
        }
    }

    /// In the background: builds `shape`'s template if it has none that is
    /// current, then fills its pool. One task per shape at a time.
    pub fn warm_up(self: &Arc<Self>, shape: Shape) {
        let template = self.template(&shape);
        if !lock(&self.busy).insert(template.state()) {
            return;
        }
        let warm = self.clone();
        tokio::spawn(async move {
            warm.fill(&shape, &template).await;
            lock(&warm.busy).remove(&template.state());
        });
    }

    async fn fill(&self, shape: &Shape, template: &Template) {
        if template.current().is_none() {
            let run_dir = self.run_dir("template");
            let cgroup = self.cgroup(shape, &run_dir);
            let built = template.build(shape, &run_dir, cgroup.as_ref()).await;
            if let Some(cg) = cgroup {
                cg.remove();
            }
            match built {
                Ok(()) => tracing::info!(state = %template.state().display(), "vm template saved"),
                Err(e) => {
                    tracing::warn!(error = %e, "vm template not saved; vms of this image boot cold");
                    return;
                }
            }
        }
        while self.ready(shape) < self.size {
            let Some(state) = template.current() else { return };
            let run_dir = self.run_dir("pool");
            let cgroup = self.cgroup(shape, &run_dir);
            let restored = async {
                let mut vm = Instance::start(shape, &run_dir, Start::Restore(&state), cgroup.as_ref()).await?;
                if let Err(e) = vm.warm_agent().await {
                    vm.kill().await;
                    return Err(e);
                }
                Ok(vm)
            };
            match restored.await {
                Ok(vm) => lock(&self.vms).entry(template.state()).or_default().push(Pooled { vm, run_dir, cgroup }),
                Err(e) => {
                    tracing::warn!(error = %e, "a pool vm did not restore; the template is discarded");
                    template.discard();
                    let _ = std::fs::remove_dir_all(&run_dir);
                    if let Some(cg) = cgroup {
                        cg.remove();
                    }
                    return;
                }
            }
        }
    }

    /// Returns once no template is being built and no pool filled.
    pub async fn idle(&self) {
        while !lock(&self.busy).is_empty() {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }

    /// Kills every idle vm (the helper exits).
    pub async fn drain(&self) {
        let all: Vec<Pooled> = lock(&self.vms).drain().flat_map(|(_, v)| v).collect();
        for mut p in all {
            p.vm.kill().await;
            let _ = std::fs::remove_dir_all(&p.run_dir);
            if let Some(cg) = p.cgroup {
                cg.remove();
            }
        }
    }
}
