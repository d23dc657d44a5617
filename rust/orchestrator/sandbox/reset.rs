//! Sandboxes replaced or taken away: idle reaping, reset and the checks a
//! replacement passes first.
use std::{sync::Arc, time::Duration};

use super::{Origin, Sandbox, SandboxManager};
use crate::{
    error::OrchestratorError,
    names::{self, validate_key},
};

impl SandboxManager {
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
    pub(crate) async fn in_use(&self, sandbox: &Arc<Sandbox>, ttl: Duration) -> bool {
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

    pub(crate) async fn replace(
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
        self.drop_comeback_notice(name);
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
        // Nor the history: the commands run before are the same sandbox's
        // (their rows in the state file stay under its name).
        if let Some(old) = &old {
            fresh.restore_audit(old.history(usize::MAX).into_iter().rev().collect());
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
    pub(crate) async fn check_replacement(
        &self,
        name: &str,
        origin: &Origin,
    ) -> Result<crate::lease::CreateSlot<'_>, OrchestratorError> {
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
}
