//! The spawn checks of internals §8, in the reference's order and words,
//! and the reservations that make them atomic: a child's slot, CPUs and
//! memory are reserved under the one book lock before its boot, and the
//! reservation is consumed by its registration or released if the boot fails.
use std::{collections::BTreeMap, sync::Arc};

use super::{
    MAX_SPAWN_GENERATION, SpawnError, SpawnManager, SpawnRequest, SpawnState,
    policy::{MIN_CHILD_MEMORY_MB, parse_child_memory},
};
use crate::{
    isolation::Isolation,
    names::{self, ChildNameError, child_name},
    sandbox::Sandbox,
    state::Pending,
};

/// The spawn bookkeeping plus the children being booted right now.
#[derive(Debug, Default)]
pub(super) struct Book {
    pub(super) state: SpawnState,
    reservations: BTreeMap<String, Reservation>,
}

/// A child being booted: what it holds of its parent's and root's budgets.
#[derive(Debug)]
struct Reservation {
    parent: String,
    root: String,
    cpus: u32,
    memory_mb: u64,
}

/// What a checked spawn will create.
#[derive(Debug)]
pub(super) struct Plan {
    pub(super) name: String,
    pub(super) image: String,
    pub(super) cpus: u32,
    pub(super) memory_mb: u64,
    /// Seconds the child lives; 0: no limit.
    pub(super) ttl: u64,
    /// The helper driver it runs on.
    pub(super) isolation: Isolation,
    /// The child's own policy, if it may spawn grandchildren.
    derived: Option<super::SpawnPolicy>,
}

/// A reservation held while the child boots; dropped unregistered, it is
/// released.
pub(super) struct Reserved<'a> {
    manager: &'a SpawnManager,
    pub(super) plan: Plan,
}

impl Reserved<'_> {
    /// The child exists: count it, store its derived policy and drop the
    /// reservation in one step (its share is now counted from the registry).
    pub(super) fn register(self, child: &Arc<Sandbox>) -> Pending {
        let m = self.manager;
        {
            let mut book = m.book();
            let parent = child.parent.clone().unwrap_or_default();
            *book.state.spawn_seqs.entry(parent).or_default() += 1;
            if let Some(mut derived) = self.plan.derived.clone() {
                if let Some(left) = child.lease_remaining().filter(|_| derived.child_ttl > 0) {
                    derived.child_ttl = derived.child_ttl.min(left.as_secs());
                }
                book.state.derived_policies.insert(child.name.clone(), derived);
            }
            book.reservations.remove(&self.plan.name);
            m.sandboxes.record_spawn(&book.state)
        }
    }
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        self.manager.book().reservations.remove(&self.plan.name);
    }
}

/// CPUs and MiB of a set of sandboxes plus reservations, each counted once.
fn usage<'a>(
    live: impl Iterator<Item = &'a Arc<Sandbox>>,
    reserved: impl Iterator<Item = &'a Reservation>,
    book: &Book,
) -> (u64, u64) {
    let (mut cpus, mut mem) = (0u64, 0u64);
    for s in live.filter(|s| !book.reservations.contains_key(&s.name)) {
        cpus += u64::from(s.cpus);
        mem += s.memory_bytes >> 20;
    }
    for r in reserved {
        cpus += u64::from(r.cpus);
        mem += r.memory_mb;
    }
    (cpus, mem)
}

impl SpawnManager {
    /// Run every check of §8 and reserve the child's share, all under the
    /// book lock.
    pub(super) fn reserve(&self, parent: &str, req: &SpawnRequest) -> Result<Reserved<'_>, SpawnError> {
        let mut book = self.book();
        let all = self.sandboxes.list();
        let find = |n: &str| all.iter().find(|s| s.name == n);
        let parent_sb =
            find(parent).ok_or_else(|| SpawnError::Value(format!("No active sandbox '{}'", names::plain(parent))))?;
        if parent_sb.generation >= MAX_SPAWN_GENERATION {
            return Err(SpawnError::Permission(format!(
                "Sandbox '{}' is at generation {} (max spawn depth is {MAX_SPAWN_GENERATION})",
                names::plain(parent),
                parent_sb.generation
            )));
        }
        let policy = self.effective_in(&mut book, parent).ok_or_else(|| {
            SpawnError::Permission(format!("Sandbox '{}' is not permitted to spawn children", names::plain(parent)))
        })?;
        let Some(default_image) = policy.allowed_images.first() else {
            return Err(SpawnError::Permission(format!(
                "Sandbox '{}' has no allowed child images configured",
                names::plain(parent)
            )));
        };
        let image = if req.image.is_empty() { default_image.clone() } else { req.image.clone() };
        if !policy.allowed_images.contains(&image) {
            return Err(SpawnError::Permission(format!(
                "Image '{image}' not allowed for children of '{}'",
                names::plain(parent)
            )));
        }
        let isolation = if req.isolation.is_empty() {
            parent_sb.isolation
        } else {
            Isolation::parse(&req.isolation).map_err(|e| SpawnError::Value(format!("isolation {e}")))?
        };
        if !policy.allows_isolation(isolation) {
            return Err(SpawnError::Permission(format!(
                "Isolation '{isolation}' not allowed for children of '{}' (allowed: {})",
                names::plain(parent),
                policy.allowed_isolation.join(", ")
            )));
        }
        let cpus = if req.cpus == 0 { i64::from(policy.child_max_cpus) } else { req.cpus };
        let cpus = cpus.min(i64::from(policy.child_max_cpus));
        if cpus < 1 {
            return Err(SpawnError::Value("cpus must be >= 1".into()));
        }
        let cpus = cpus as u32;
        let memory = if req.memory.is_empty() { policy.child_max_memory.as_str() } else { req.memory.as_str() };
        let memory_mb = parse_child_memory(memory)
            .ok_or_else(|| SpawnError::Value(format!("Invalid memory string: {memory}")))?
            .min(policy.child_max_memory_mb());
        if memory_mb < MIN_CHILD_MEMORY_MB {
            return Err(SpawnError::Value("memory must be >= 64M".into()));
        }
        let used = book.state.spawn_seqs.get(parent).copied().unwrap_or(0);
        let pending: Vec<&Reservation> = book.reservations.values().filter(|r| r.parent == parent).collect();
        if used + pending.len() as u64 >= policy.max_total {
            return Err(SpawnError::Limit("Lifetime spawn limit reached".into()));
        }
        let live: Vec<&Arc<Sandbox>> = all.iter().filter(|s| s.parent.as_deref() == Some(parent)).collect();
        let live_unreserved = live.iter().filter(|s| !book.reservations.contains_key(&s.name)).count();
        if live_unreserved + pending.len() >= policy.max_concurrent as usize {
            return Err(SpawnError::Limit("Concurrent child limit reached".into()));
        }
        let (dc, dm) = usage(live.iter().copied(), pending.iter().copied(), &book);
        if dc + u64::from(cpus) > u64::from(policy.total_child_cpus) {
            return Err(SpawnError::Limit("Aggregate child CPU budget exceeded".into()));
        }
        if dm + memory_mb > policy.total_child_memory_mb {
            return Err(SpawnError::Limit("Aggregate child memory budget exceeded".into()));
        }
        let root = root_of(&all, parent);
        if let Some(root_policy) = self.policy(&root) {
            let tree = all.iter().filter(|s| s.parent.is_some() && root_of(&all, &s.name) == root);
            let (tc, tm) = usage(tree, book.reservations.values().filter(|r| r.root == root), &book);
            if tc + u64::from(cpus) > u64::from(root_policy.total_child_cpus) {
                return Err(SpawnError::Limit("CPU budget exceeded".into()));
            }
            if tm + memory_mb > root_policy.total_child_memory_mb {
                return Err(SpawnError::Limit("Memory budget exceeded".into()));
            }
        }
        // Names differing only by case are one name: volume directories may
        // live on a case-insensitive file system.
        let taken = |n: &str| {
            all.iter().any(|s| s.name.eq_ignore_ascii_case(n))
                || book.reservations.keys().any(|r| r.eq_ignore_ascii_case(n))
        };
        let name = if req.name.is_empty() {
            // Skip names in use (a child of a restarted server's earlier run).
            (used + pending.len() as u64 + 1..)
                .map(|seq| child_name(parent, &format!("child-{seq:04}")))
                .find(|n| !n.as_ref().is_ok_and(|n| taken(n)))
                .unwrap_or_else(|| Err(ChildNameError::Invalid(String::new())))
        } else {
            child_name(parent, &req.name)
        }
        .map_err(|e| SpawnError::Value(e.to_string()))?;
        if taken(&name) {
            return Err(SpawnError::Value(format!("Sandbox '{}' already exists", names::plain(&name))));
        }
        let generation = parent_sb.generation + 1;
        let derived = (policy.child_can_spawn && generation < MAX_SPAWN_GENERATION).then(|| policy.derive(None));
        book.reservations.insert(name.clone(), Reservation { parent: parent.to_string(), root, cpus, memory_mb });
        drop(book);
        Ok(Reserved {
            manager: self,
            plan: Plan { name, image, cpus, memory_mb, ttl: policy.child_ttl, isolation, derived },
        })
    }
}

/// The top of `name`'s tree (following parent links among live sandboxes).
fn root_of(all: &[Arc<Sandbox>], name: &str) -> String {
    let mut current = name.to_string();
    // Bounded: generations stop at 2, and a cycle cannot be built.
    for _ in 0..=MAX_SPAWN_GENERATION + 1 {
        match all.iter().find(|s| s.name == current).and_then(|s| s.parent.clone()) {
            Some(p) => current = p,
            None => break,
        }
    }
    current
}
