//! The manager's table of sandboxes: attaching a helper's VMs at start,
//! listeners, lookup by name (and by project), sandboxes found lost, and
//! creation on first use.
use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::{Arc, Mutex, atomic::AtomicUsize},
};

use super::{MAX_GONE_CHILDREN, NAME_LABEL, Origin, Sandbox, SandboxListener, SandboxManager};
use crate::{
    adopt::Creating,
    config::Config,
    error::OrchestratorError,
    helper_client::{HelperClient, HelperError, VmState},
    names::{self, validate_key},
    state::Pending,
};

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
            comeback_notices: Mutex::default(),
            helper_settled: tokio::sync::watch::Sender::new(true),
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
                Some(creator) if crate::owner::alive(&creator) => continue,
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

    pub(crate) fn listeners(&self) -> Vec<Arc<dyn SandboxListener>> {
        self.listeners.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(crate) fn notify(&self, event: impl Fn(&dyn SandboxListener)) {
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
        crate::config::session().unwrap_or_else(|| self.config.clone())
    }

    pub(crate) fn lock_map(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Arc<Sandbox>>> {
        self.sandboxes.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn lifecycle_lock(&self, name: &str) -> Arc<tokio::sync::Mutex<()>> {
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
    pub fn resolve(&self, own: &crate::project::Project, arg: &str, name: &str) -> Result<String, OrchestratorError> {
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
        let Some(tag) = crate::project::Project::tag_of_id(project) else {
            return Err(malformed("the project id before ':' is <directory name>-<6 hex digits> or 'legacy'"));
        };
        names::validate_sandbox_name(plain)?;
        let known = tag.is_empty() || crate::project::Project::by_tag(tag).is_some_and(|p| p.id == project);
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
    pub(crate) fn no_such(&self, name: &str) -> OrchestratorError {
        match self.gone_children.lock().unwrap_or_else(|p| p.into_inner()).get(name) {
            Some(why) => OrchestratorError::ChildGone(why.clone()),
            None => OrchestratorError::NoSuchSandbox(name.to_string()),
        }
    }

    /// Remember that the children in `name`'s subtree (and `name` itself,
    /// if it is a child) go away because of `cause`; call before destroying.
    pub(crate) fn remember_reaped(&self, name: &str, cause: &str) {
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
                crate::watchdog::clock()
            );
            self.record_gone_child(&child.name, &message).in_background();
            gone.insert(child.name.clone(), message);
        }
    }

    /// Add the reaped children's explanations the state database kept; one
    /// remembered since this start is newer and stays.
    pub(crate) fn set_gone_children(&self, saved: BTreeMap<String, String>) {
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

    pub(crate) fn set_lost(&self, lost: BTreeMap<String, String>) {
        *self.lost.lock().unwrap_or_else(|p| p.into_inner()) = lost;
    }

    /// Record that a sandbox's VM went away on its own: forget it, stop what
    /// hangs off it, and make later uses of the name say so.
    pub(crate) fn mark_lost(&self, name: &str, why: &str) {
        if self.lock_map().remove(name).is_none() {
            return;
        }
        tracing::warn!(sandbox = %name, "sandbox lost: {why}");
        self.drop_comeback_notice(name);
        self.lost.lock().unwrap_or_else(|p| p.into_inner()).insert(name.to_string(), why.to_string());
        self.notify(|l| l.lost(name));
        self.record_lost(name, why).in_background();
    }

    /// Acknowledge a lost sandbox: the name is free again. `None` if it
    /// was not lost.
    pub(crate) fn forget_lost(&self, name: &str) -> Option<Pending> {
        let removed = self.lost.lock().unwrap_or_else(|p| p.into_inner()).remove(name).is_some();
        self.drop_comeback_notice(name);
        removed.then(|| self.record_forgotten(name))
    }

    /// Acknowledge a lost sandbox (see [`Self::forget_lost`]) and free the
    /// disk its VM held: the writable layer a dead helper left behind, which
    /// the helper running now deletes by the VM's id. False if it was not
    /// lost.
    pub async fn acknowledge_lost(&self, name: &str) -> Result<bool, OrchestratorError> {
        // Under the name's lock: a comeback in progress finishes first (and
        // then the name is no longer lost), and none starts until the
        // writable layer is deleted.
        let lock = self.lifecycle_lock(name);
        let _guard = lock.lock().await;
        if self.lock_map().contains_key(name) {
            return Ok(false);
        }
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
    pub(crate) async fn discard_vm(&self, name: &str) {
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
    pub(crate) async fn free_unfreed(&self) {
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

    pub(crate) fn check_lost(&self, name: &str) -> Result<(), OrchestratorError> {
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
    pub(crate) async fn destroy_subtree(&self, name: &str) {
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
    pub(crate) async fn remove_vm(&self, name: &str) -> Result<(), OrchestratorError> {
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
}
