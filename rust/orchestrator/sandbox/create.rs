//! Creating a sandbox (its VM, volumes and hooks) and destroying one,
//! with or without its volumes.
use std::{
    collections::HashMap,
    sync::Arc,
    time::{Instant, SystemTime},
};

use super::{
    CACHE_VOLUMES, GENERATION_LABEL, NAME_LABEL, NETWORK_LABEL, Origin, PARENT_LABEL, PROJECT_LABEL, Sandbox,
    SandboxManager, WORKSPACE,
};
use crate::{
    adopt::Creating,
    config::Profile,
    error::OrchestratorError,
    helper_client::{HelperError, VmConfig},
    isolation::Isolation,
    names::{self},
    network::Network,
};

impl SandboxManager {
    /// Create `name` (its lock is held) within the capacity `reserved` for
    /// it, or checked now when `None`.
    pub(crate) async fn create_locked(
        &self,
        name: &str,
        origin: &Origin,
        reserved: Option<crate::lease::CreateSlot<'_>>,
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
        if let Some(project) = crate::project::Project::by_tag(names::split_key(name).0) {
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
            env: host_ca.as_ref().map(|_| crate::ca_trust::env()).unwrap_or_default(),
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
                // The store lacks the image (a clone names none).
                Err(HelperError::NotFound(_)) if origin.clone_from.is_none() => {
                    return Err(OrchestratorError::ImageMissing(profile.image.clone()));
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
        if let Err(e) = self.record_created(&sandbox, origin.comeback.clone()).saved().await {
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
    pub(crate) fn planned_profile(
        &self,
        name: &str,
        origin: &Origin,
    ) -> Result<(Profile, Option<crate::project::ProjectConfig>), OrchestratorError> {
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
    pub(crate) async fn prepare(
        &self,
        sandbox: &Arc<Sandbox>,
        origin: &Origin,
        project: Option<&crate::project::ProjectConfig>,
        trust: Option<(&Arc<crate::ca_trust::HostCa>, Option<crate::ca_trust::ImageBuild<'_>>)>,
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

    pub(crate) async fn destroy_keeping(
        &self,
        name: &str,
        keep_volumes: bool,
    ) -> Result<Arc<Sandbox>, OrchestratorError> {
        let lock = self.lifecycle_lock(name);
        let _guard = lock.lock().await;
        let sandbox = self.get(name)?;
        self.drop_comeback_notice(name);
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
}
