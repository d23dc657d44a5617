//! Child sandboxes: spawning under a parent's [`SpawnPolicy`], the spawn
//! bookkeeping (lifetime counters, parent generations, derived policies),
//! destroy_child, and the hand-off of that bookkeeping to the state file.
//!
//! Every budget check and the reservation it leads to happen under one
//! orchestrator-wide lock ([`budget`]), so concurrent spawns anywhere in a
//! tree can never jointly exceed a budget; the boot itself runs unlocked.
mod budget;
pub mod policy;

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use serde::{Deserialize, Serialize};

pub use policy::SpawnPolicy;

use super::{
    error::OrchestratorError,
    names,
    sandbox::{Origin, Sandbox, SandboxListener, SandboxManager},
};

/// Deepest generation that may exist: root 0, child 1, grandchild 2.
pub const MAX_SPAWN_GENERATION: u32 = 2;

/// Why a spawn was refused; the class names are the reference's exception
/// classes, which clients match on (`Error: <Class>: <message>`).
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// Not allowed by policy.
    #[error("{0}")]
    Permission(String),
    /// A parameter was wrong.
    #[error("{0}")]
    Value(String),
    /// A count or budget is used up.
    #[error("{0}")]
    Limit(String),
    /// No such child under this parent.
    #[error("{0}")]
    NotFound(String),
    /// Creating or running the sandbox failed.
    #[error("{0}")]
    Runtime(OrchestratorError),
}

impl SpawnError {
    /// The reference's exception class for this error.
    pub fn class(&self) -> &'static str {
        match self {
            Self::Permission(_) => "PermissionError",
            Self::Value(_) => "ValueError",
            Self::Limit(_) => "SpawnLimitError",
            Self::NotFound(_) => "FileNotFoundError",
            Self::Runtime(_) => "RuntimeError",
        }
    }
}

impl From<OrchestratorError> for SpawnError {
    fn from(e: OrchestratorError) -> Self {
        match e {
            OrchestratorError::AlreadyExists(n) => Self::Value(format!("Sandbox '{n}' already exists")),
            OrchestratorError::NoSuchSandbox(n) => Self::Value(format!("No active sandbox '{n}'")),
            OrchestratorError::InvalidArgument(m) => Self::Value(m),
            other => Self::Runtime(other),
        }
    }
}

/// What a spawn asks for; empty or zero fields take the policy's defaults.
#[derive(Debug, Clone, Default)]
pub struct SpawnRequest {
    /// Image (default: the policy's first allowed image).
    pub image: String,
    /// The child's own segment of its name (default: `child-<seq>`); its
    /// full name is `<parent>..<segment>`.
    pub name: String,
    /// CPUs (0: the policy's child_max_cpus).
    pub cpus: i64,
    /// Memory like `256M` (empty: the policy's child_max_memory).
    pub memory: String,
    /// `namespaces` or `vm` (empty: the parent's).
    pub isolation: String,
}

/// The spawn bookkeeping the state file keeps (field names as state.json v2).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SpawnState {
    /// Children each parent has spawned over its lifetime.
    #[serde(default)]
    pub spawn_seqs: BTreeMap<String, u64>,
    /// How often each parent was replaced (reset, restore).
    #[serde(default)]
    pub parent_generations: BTreeMap<String, u64>,
    /// Policies of children allowed to spawn grandchildren.
    #[serde(default)]
    pub derived_policies: BTreeMap<String, SpawnPolicy>,
}

/// Spawning and the bookkeeping behind it.
pub struct SpawnManager {
    sandboxes: Arc<SandboxManager>,
    /// Policies from the config file (or the built-in one for `default`).
    policies: BTreeMap<String, SpawnPolicy>,
    book: Mutex<budget::Book>,
}

impl SpawnManager {
    /// A manager over `sandboxes` with the configured policies.
    pub fn new(sandboxes: Arc<SandboxManager>) -> Self {
        let policies = sandboxes.config().spawn_policies.clone();
        Self { sandboxes, policies, book: Mutex::default() }
    }

    fn book(&self) -> MutexGuard<'_, budget::Book> {
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The bookkeeping to save in the state file.
    pub fn export_state(&self) -> SpawnState {
        self.book().state.clone()
    }

    /// Restore saved bookkeeping (after a restart, before serving). Derived
    /// policies of sandboxes that no longer exist are dropped.
    pub fn import_state(&self, mut state: SpawnState) {
        state.derived_policies.retain(|name, _| self.sandboxes.get(name).is_ok());
        let mut book = self.book();
        book.state = state;
        self.sandboxes.record_spawn(&book.state);
    }

    /// The configured policy of the top-level sandbox keyed `key`: policies
    /// name sandboxes by their plain names, in every project.
    pub(super) fn policy(&self, key: &str) -> Option<&SpawnPolicy> {
        self.policies.get(names::plain(key))
    }

    /// The policy `name` spawns under: its configured one, else the one it
    /// was derived as a child allowed to spawn.
    pub fn effective_policy(&self, name: &str) -> Option<SpawnPolicy> {
        self.effective_in(&mut self.book(), name)
    }

    fn effective_in(&self, book: &mut budget::Book, name: &str) -> Option<SpawnPolicy> {
        // A configured policy is a top-level sandbox's: a child never takes
        // one by its name, whatever it is called.
        let is_child = names::is_child_name(name) || self.sandboxes.get(name).is_ok_and(|s| s.parent.is_some());
        if let Some(p) = self.policy(name).filter(|_| !is_child) {
            return Some(p.clone());
        }
        if let Some(p) = book.state.derived_policies.get(name) {
            return Some(p.clone());
        }
        // A child attached without saved bookkeeping gets its policy back
        // from its parent's configured one.
        let sandbox = self.sandboxes.get(name).ok()?;
        let parent_policy = self.policy(sandbox.parent.as_deref()?)?;
        if !parent_policy.child_can_spawn || sandbox.generation >= MAX_SPAWN_GENERATION {
            return None;
        }
        let derived = parent_policy.derive(sandbox.lease_remaining().map(|d| d.as_secs()));
        book.state.derived_policies.insert(name.to_string(), derived.clone());
        self.sandboxes.record_spawn(&book.state);
        Some(derived)
    }

    /// Whether `sandbox` gets sandbox-ctl: a top-level sandbox whose
    /// configured policy says `inject_ctl`, or a child of one that also says
    /// `child_can_spawn` (its children may spawn, through ctl).
    pub fn wants_ctl(&self, name: &str, parent: Option<&str>) -> bool {
        match parent {
            None => !names::is_child_name(name) && self.policy(name).is_some_and(|p| p.inject_ctl),
            Some(parent) => {
                self.sandboxes.get(parent).is_ok_and(|p| p.generation + 1 < MAX_SPAWN_GENERATION)
                    && self.policy(parent).is_some_and(|p| p.inject_ctl && p.child_can_spawn)
            }
        }
    }

    /// Whether a child may `expose` ports (its parent's policy says so); a
    /// top-level sandbox always may.
    pub fn may_forward(&self, sandbox: &Sandbox) -> bool {
        match &sandbox.parent {
            None => true,
            Some(parent) => self.effective_policy(parent).is_some_and(|p| p.child_allow_port_forward),
        }
    }

    /// Children `parent` has spawned over its lifetime.
    pub fn spawns_used(&self, parent: &str) -> u64 {
        self.book().state.spawn_seqs.get(parent).copied().unwrap_or(0)
    }

    /// Spawn a child of `parent`: check the policy and budgets and reserve
    /// the child's share atomically, boot it, register it.
    pub async fn spawn(&self, parent: &str, req: &SpawnRequest) -> Result<Arc<Sandbox>, SpawnError> {
        let reserved = self.reserve(parent, req)?;
        let plan = &reserved.plan;
        let origin = Origin {
            image: Some(plan.image.clone()),
            cpus: Some(plan.cpus),
            memory_bytes: Some(plan.memory_mb << 20),
            parent: Some(parent.to_string()),
            lease: (plan.ttl > 0).then(|| Duration::from_secs(plan.ttl)),
            isolation: Some(plan.isolation),
            ..Origin::default()
        };
        let child = self.sandboxes.create(&plan.name, &origin).await?;
        reserved.register(&child);
        self.sandboxes.committed().await;
        tracing::info!(sandbox = %child.name, parent, "spawned child sandbox");
        Ok(child)
    }

    /// Destroy a child sandbox and its subtree (the destroy_child tool).
    pub async fn destroy_child(&self, name: &str) -> Result<Arc<Sandbox>, OrchestratorError> {
        let sandbox = self.sandboxes.get(name)?;
        let Some(parent) = &sandbox.parent else {
            return Err(OrchestratorError::NotPermitted(format!(
                "'{}' is not a child sandbox (use destroy instead)",
                names::display(name)
            )));
        };
        if self.effective_policy(parent).is_none() {
            return Err(OrchestratorError::NotPermitted(format!(
                "parent of '{}' has no spawn policy",
                names::display(name)
            )));
        }
        self.sandboxes.destroy(name).await
    }

    /// Destroy `name` if it is a direct child of `parent` (sandbox-ctl).
    pub async fn destroy_own_child(&self, parent: &str, name: &str) -> Result<Arc<Sandbox>, SpawnError> {
        let child = self.own_child(parent, name)?;
        Ok(self.sandboxes.destroy(&child.name).await?)
    }

    /// `name` (a full name, or a segment under `parent`) if it is a live
    /// direct child of `parent`.
    pub fn own_child(&self, parent: &str, name: &str) -> Result<Arc<Sandbox>, SpawnError> {
        // Inside a sandbox names are plain: its own project's, never another's.
        let (tag, parent_plain) = names::split_key(parent);
        let full = if names::is_child_of(name, parent_plain) {
            Some(names::key(tag, name))
        } else {
            names::child_name(parent, name).ok()
        };
        match full.map(|n| self.sandboxes.get(&n)) {
            Some(Ok(s)) if s.parent.as_deref() == Some(parent) => Ok(s),
            _ => Err(SpawnError::NotFound(format!("Child '{name}' not found under '{parent_plain}'"))),
        }
    }

    /// The sandbox registry.
    pub fn sandboxes(&self) -> &Arc<SandboxManager> {
        &self.sandboxes
    }
}

/// Keeps the bookkeeping in step with the registry: a destroyed sandbox's
/// derived policy goes (its lifetime counter too, unless a configured policy
/// names it), and a replaced one's generation goes up.
pub(super) struct FollowSpawns(pub(super) Arc<SpawnManager>);

impl SandboxListener for FollowSpawns {
    fn destroyed(&self, name: &str) {
        let m = &self.0;
        {
            let mut book = m.book();
            book.state.derived_policies.remove(name);
            if m.policy(name).is_none() {
                book.state.spawn_seqs.remove(name);
                book.state.parent_generations.remove(name);
            }
            m.sandboxes.record_spawn(&book.state);
        }
    }

    fn replaced(&self, name: &str) {
        let mut book = self.0.book();
        *book.state.parent_generations.entry(name.to_string()).or_default() += 1;
        self.0.sandboxes.record_spawn(&book.state);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_uses_the_reference_field_names() {
        let mut s = SpawnState::default();
        s.spawn_seqs.insert("default".into(), 3);
        s.parent_generations.insert("default".into(), 1);
        s.derived_policies.insert("kid".into(), SpawnPolicy::builtin("img").derive(None));
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["spawn_seqs"]["default"], 3);
        assert_eq!(v["parent_generations"]["default"], 1);
        assert_eq!(v["derived_policies"]["kid"]["max_total"], 5);
        assert_eq!(v["derived_policies"]["kid"]["child_max_memory"], "512M");
        assert_eq!(serde_json::from_value::<SpawnState>(v).unwrap(), s);
        // The reference's policies carry keys we do not use.
        let reference = serde_json::json!({"derived_policies": {"kid": {
            "max_concurrent": 1, "max_total": 5, "total_child_cpus": 3, "total_child_memory_mb": 768,
            "child_max_cpus": 2, "child_max_memory": "512M", "allowed_images": ["mcp-dev"], "child_ttl": 300,
            "child_can_spawn": false, "child_network_peers": "family", "child_can_be_cloned": false,
            "child_can_be_snapshotted": false, "child_allow_port_forward": false, "inject_ctl": false}}});
        let s: SpawnState = serde_json::from_value(reference).unwrap();
        assert_eq!(s.derived_policies["kid"].total_child_cpus, 3);
        assert!(s.spawn_seqs.is_empty());
    }
}
