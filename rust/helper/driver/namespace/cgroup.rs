//! Resource limits: one cgroup per VM, written directly to cgroupfs.
//!
//! The layout is detected from /proc/self/mountinfo because hosts differ:
//! pure v1, hybrid (v1 controllers plus an empty v2 mount, as on the CI
//! machines) and pure v2. Hybrid is treated as v1, since its v2 mount has no
//! controllers to delegate.
//!
//! Root creates its groups anywhere. An ordinary user can only create them
//! in a subtree delegated to it: on v1 the `sandbox-mcp.<user>` group under
//! each controller that `sandbox-mcp host-setup` creates and chowns; on v2 its
//! own cgroup when that is delegated (a `systemd-run --user --scope -p
//! Delegate=yes` scope, or a `sandbox-mcp.<user>` group it was started in).
//! Without one, VMs run without limits and [`CgroupLayout::detect`] says why.
use std::path::{Path, PathBuf};

use super::DriverError;
use crate::driver::{GroupUsage, HostFacts};
use sandbox_agent::group::{V2_INACTIVE, working_set};

const GROUP: &str = "sandbox-mcp";

/// The controllers VMs are limited by.
const CONTROLLERS: [&str; 3] = ["memory", "cpu", "pids"];

/// v2: the leaf an unprivileged helper moves its delegated cgroup's
/// processes into, since a cgroup with processes cannot enable controllers
/// for its children (the "no internal processes" rule).
const V2_LEAF: &str = "sandbox-mcp-procs";

/// The parent group of this helper's VMs: `sandbox-mcp-<hash of the state
/// dir>`. cgroup paths are global to the host, so two helpers (a user's and a
/// test run's, each with its own XDG dirs) must never share a VM's group.
fn group_name() -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    sandbox_base::paths::state_dir().hash(&mut h);
    format!("{GROUP}-{:08x}", h.finish() as u32)
}

/// The group root delegates to `user` (`host-setup`), under each v1
/// controller's mount or the v2 root.
pub fn delegated_name(user: &str) -> String {
    format!("{GROUP}.{user}")
}

/// The fix for a missing delegation, named for `user`.
pub fn delegation_fix(user: &str) -> String {
    format!("sudo sandbox-mcp host-setup --user {user}")
}

/// Why VMs get no cgroup limits here, and what would give them some.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}; fix: {fix}")]
pub struct Unavailable {
    /// What is missing.
    pub reason: String,
    /// The command or setting that provides it.
    pub fix: String,
}

impl Unavailable {
    fn new(reason: impl Into<String>, fix: impl Into<String>) -> Self {
        Unavailable { reason: reason.into(), fix: fix.into() }
    }

    /// An unexpected failure (an unreadable /proc file, a failed mkdir).
    fn failed(reason: impl Into<String>) -> Self {
        Self::new(reason, "see the helper log; `sandbox-mcp doctor` probes the same")
    }
}

/// The fix when the host has no usable hierarchy.
const NO_HIERARCHY_FIX: &str = "mount the cgroup v1 memory, cpu and pids controllers, or boot with cgroup v2 \
                                and those controllers enabled";

/// The cgroup mounts of this host, from mountinfo.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Mounts {
    /// The v1 hierarchy with the memory controller.
    pub memory: Option<PathBuf>,
    /// The v1 hierarchy with the cpu controller.
    pub cpu: Option<PathBuf>,
    /// The v1 hierarchy with the pids controller.
    pub pids: Option<PathBuf>,
    /// The v1 cpuacct hierarchy when it is not co-mounted with cpu.
    pub cpuacct: Option<PathBuf>,
    /// The cgroup2 mount.
    pub v2: Option<PathBuf>,
}

impl Mounts {
    /// Parses /proc/self/mountinfo text.
    pub fn parse(mountinfo: &str) -> Self {
        let mut m = Mounts::default();
        for line in mountinfo.lines() {
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            let Some(mount_point) = left.split(' ').nth(4) else {
                continue;
            };
            let mut fields = right.split(' ');
            let fstype = fields.next().unwrap_or_default();
            let options = fields.nth(1).unwrap_or_default();
            let has = |c: &str| options.split(',').any(|o| o == c);
            match fstype {
                "cgroup" => {
                    let p = PathBuf::from(mount_point);
                    if has("memory") {
                        m.memory = Some(p.clone());
                    }
                    if has("cpu") {
                        m.cpu = Some(p.clone());
                    }
                    if has("pids") {
                        m.pids = Some(p.clone());
                    }
                    if has("cpuacct") && !has("cpu") {
                        m.cpuacct = Some(p);
                    }
                }
                "cgroup2" => m.v2 = Some(PathBuf::from(mount_point)),
                _ => {}
            }
        }
        m
    }

    /// The mounts of this process's mount namespace.
    pub fn read() -> Result<Self, std::io::Error> {
        std::fs::read_to_string("/proc/self/mountinfo").map(|s| Self::parse(&s))
    }

    /// The v1 hierarchies VM limits use (memory, cpu, pids, and cpuacct
    /// when separate); `None` unless memory, cpu and pids all have one.
    pub fn v1(&self) -> Option<Vec<&Path>> {
        let (m, c, p) = (self.memory.as_deref()?, self.cpu.as_deref()?, self.pids.as_deref()?);
        Some([m, c, p].into_iter().chain(self.cpuacct.as_deref()).collect())
    }
}

/// Who the helper runs as: root makes its groups anywhere, a user only in
/// its delegated subtree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Runner {
    /// Root.
    Root,
    /// An ordinary user.
    User {
        /// Its uid.
        uid: u32,
        /// Its login name (names its v1 delegated subtree).
        name: String,
    },
}

impl Runner {
    /// The current effective user.
    pub fn current() -> Result<Self, Unavailable> {
        let uid = nix::unistd::geteuid();
        if uid.is_root() {
            return Ok(Runner::Root);
        }
        let user = nix::unistd::User::from_uid(uid)
            .map_err(|e| Unavailable::failed(format!("look up uid {uid}: {e}")))?
            .ok_or_else(|| Unavailable::new(format!("uid {uid} has no passwd entry"), "add one (useradd)"))?;
        Ok(Runner::User { uid: uid.as_raw(), name: user.name })
    }
}

/// Where the VM cgroups live on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupLayout {
    /// One hierarchy per controller.
    V1 {
        /// `<memory mount>/[sandbox-mcp.<user>/]<group>`.
        memory: PathBuf,
        /// `<cpu mount>/[sandbox-mcp.<user>/]<group>`.
        cpu: PathBuf,
        /// `<pids mount>/[sandbox-mcp.<user>/]<group>`.
        pids: PathBuf,
        /// `<cpuacct mount>/...`, when cpuacct has a hierarchy of
        /// its own (co-mounted with cpu, the cpu group already counts).
        cpuacct: Option<PathBuf>,
    },
    /// The unified hierarchy: `<our cgroup>/<group>` with the three
    /// controllers enabled for its children.
    V2 {
        /// The parent of every VM cgroup.
        base: PathBuf,
    },
}

pub use crate::driver::Limits;

/// Where the groups would go, from the mounts and this process's own
/// cgroup (/proc/self/cgroup text); no file system access.
pub fn plan(mounts: &Mounts, self_cgroup: &str, runner: &Runner, group: &str) -> Result<CgroupLayout, Unavailable> {
    if let Some(v1) = mounts.v1() {
        let parent = |mount: &Path| match runner {
            Runner::Root => mount.join(group),
            Runner::User { name, .. } => mount.join(delegated_name(name)).join(group),
        };
        let cpuacct = (v1.len() == 4).then(|| parent(v1[3]));
        return Ok(CgroupLayout::V1 { memory: parent(v1[0]), cpu: parent(v1[1]), pids: parent(v1[2]), cpuacct });
    }
    let Some(root) = &mounts.v2 else {
        return Err(Unavailable::new("no cgroup hierarchy with memory, cpu and pids controllers", NO_HIERARCHY_FIX));
    };
    let rel = self_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or_else(|| Unavailable::new("this process is in no cgroup v2 group", NO_HIERARCHY_FIX))?;
    Ok(CgroupLayout::V2 { base: root.join(rel.trim_start_matches('/')).join(group) })
}

impl CgroupLayout {
    /// Finds a usable layout and prepares its parent group; the reason
    /// when limits cannot be enforced here (for an ordinary user: naming
    /// the `host-setup` or `systemd-run` fix).
    pub fn detect() -> Result<Self, Unavailable> {
        let mounts = Mounts::read().map_err(|e| Unavailable::failed(format!("/proc/self/mountinfo: {e}")))?;
        let own = std::fs::read_to_string("/proc/self/cgroup")
            .map_err(|e| Unavailable::failed(format!("/proc/self/cgroup: {e}")))?;
        let runner = Runner::current()?;
        let layout = plan(&mounts, &own, &runner, &group_name())?;
        layout.prepare(&runner)?;
        Ok(layout)
    }

    /// The parent group of this helper's VMs (v1: in the memory hierarchy).
    pub fn parent(&self) -> &Path {
        match self {
            CgroupLayout::V1 { memory, .. } => memory,
            CgroupLayout::V2 { base } => base,
        }
    }

    /// Capability name reported in GetInfo.
    pub fn capability(&self) -> &'static str {
        match self {
            CgroupLayout::V1 { .. } => "cgroups.v1",
            CgroupLayout::V2 { .. } => "cgroups.v2",
        }
    }

    fn prepare(&self, runner: &Runner) -> Result<(), Unavailable> {
        match self {
            CgroupLayout::V1 { memory, cpu, pids, cpuacct } => {
                for dir in [memory, cpu, pids].into_iter().chain(cpuacct) {
                    if let (Runner::User { name, .. }, Some(delegated)) = (runner, dir.parent())
                        && !delegated.is_dir()
                    {
                        return Err(Unavailable::new(
                            format!("no cgroup subtree delegated to {name} ({} is missing)", delegated.display()),
                            delegation_fix(name),
                        ));
                    }
                    mkdir(dir).map_err(|e| match runner {
                        Runner::User { name, .. } => Unavailable::new(e, delegation_fix(name)),
                        Runner::Root => Unavailable::failed(e),
                    })?;
                }
            }
            CgroupLayout::V2 { base } => {
                let own = base.parent().unwrap_or(Path::new("/"));
                let controllers = std::fs::read_to_string(own.join("cgroup.controllers")).unwrap_or_default();
                for c in CONTROLLERS {
                    if !controllers.split_whitespace().any(|x| x == c) {
                        return Err(Unavailable::new(
                            format!("cgroup v2 has no {c} controller in {}", own.display()),
                            V2_SCOPE_FIX,
                        ));
                    }
                }
                if let Runner::User { uid, .. } = runner {
                    v2_take_delegated(own, *uid)?;
                }
                mkdir(base).map_err(Unavailable::failed)?;
                write(&base.join("cgroup.subtree_control"), "+memory +cpu +pids")
                    .map_err(|e| Unavailable::failed(e.to_string()))?;
            }
        }
        Ok(())
    }

    /// Removes this helper's parent group once its VMs are gone (at
    /// shutdown), so helpers with short-lived state dirs (test runs) leave
    /// nothing behind. A group still holding VMs stays.
    pub fn remove_parent(&self) {
        let dirs: Vec<&PathBuf> = match self {
            CgroupLayout::V1 { memory, cpu, pids, cpuacct } => [memory, cpu, pids].into_iter().chain(cpuacct).collect(),
            CgroupLayout::V2 { base } => vec![base],
        };
        for d in dirs {
            let _ = std::fs::remove_dir(d);
        }
    }

    /// The group named `name` of a VM a dead helper started, which its new
    /// helper adopts: `None` if it is not there (as left by a helper in
    /// another cgroup).
    pub fn existing(&self, name: &str) -> Option<VmCgroup> {
        let cg = self.group(name);
        cg.dirs.iter().all(|d| d.is_dir()).then_some(cg)
    }

    fn group(&self, name: &str) -> VmCgroup {
        VmCgroup {
            dirs: match self {
                CgroupLayout::V1 { memory, cpu, pids, cpuacct } => {
                    let mut dirs = vec![memory.join(name), cpu.join(name), pids.join(name)];
                    dirs.extend(cpuacct.iter().map(|a| a.join(name)));
                    dirs
                }
                CgroupLayout::V2 { base } => vec![base.join(name)],
            },
            v2: matches!(self, CgroupLayout::V2 { .. }),
        }
    }

    /// Creates the VM's cgroup with its limits.
    pub fn create(&self, id: &str, limits: Limits) -> Result<VmCgroup, DriverError> {
        let cg = self.create_unlimited(id)?;
        if let Err(e) = cg.limit(limits) {
            cg.remove();
            return Err(e);
        }
        Ok(cg)
    }

    /// Creates a group named `name` without limits (a prepared launcher's,
    /// before its VM's config is known).
    pub fn create_unlimited(&self, name: &str) -> Result<VmCgroup, DriverError> {
        let cg = self.group(name);
        for d in &cg.dirs {
            // A group left by a crashed helper still carries its counters (an
            // old OOM kill would show on the new VM): start from a fresh one.
            // Removal fails only while processes remain in it.
            let _ = std::fs::remove_dir(d);
            if let Err(e) = mkdir(d) {
                cg.remove();
                return Err(DriverError::Cgroup(e));
            }
        }
        Ok(cg)
    }
}

/// Proves that limits work for the current user, as a VM would get them:
/// creates a group in this helper's parent group, moves a child process
/// into it, then removes both. The parent group stays: a running helper of
/// the same state dir may be using it.
pub fn probe() -> Result<CgroupLayout, Unavailable> {
    let layout = CgroupLayout::detect()?;
    let fix = match Runner::current()? {
        Runner::User { name, .. } => delegation_fix(&name),
        Runner::Root => "see the helper log".to_string(),
    };
    let id = format!("doctor-probe-{}", std::process::id());
    let limits = Limits { cpus: 1, memory_bytes: 64 << 20, pids: 16 };
    let cg = layout.create(&id, limits).map_err(|e| Unavailable::new(e.to_string(), fix.clone()))?;
    let child = std::process::Command::new("sleep")
        .arg("60")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
    let added = match child {
        Ok(mut child) => {
            let added = i32::try_from(child.id())
                .map_err(|e| e.to_string())
                .and_then(|pid| cg.add(pid).map_err(|e| e.to_string()));
            let _ = child.kill();
            let _ = child.wait();
            added
        }
        Err(e) => Err(format!("spawn sleep: {e}")),
    };
    cg.remove();
    added.map(|()| layout).map_err(|e| Unavailable::new(e, fix))
}

/// The cgroup of one VM (one dir per v1 controller, or one v2 dir).
#[derive(Debug)]
pub struct VmCgroup {
    /// v1: memory, cpu, pids, then cpuacct if separate; v2: the one dir.
    dirs: Vec<PathBuf>,
    v2: bool,
}

/// Where a VM's limits, usage and OOM counter live, for Stats: the
/// figures the kernel enforces the limits against.
#[derive(Debug, Clone)]
pub enum UsageFiles {
    /// One dir per controller.
    V1 {
        /// The memory controller's dir.
        memory: PathBuf,
        /// The pids controller's dir.
        pids: PathBuf,
        /// The dir with `cpuacct.usage`: cpuacct's own, or cpu's when the
        /// two are mounted together.
        cpuacct: PathBuf,
    },
    /// The unified dir.
    V2(PathBuf),
}

impl UsageFiles {
    /// The limits, usage and OOM kills as the cgroup shows them now.
    pub fn facts(&self) -> HostFacts {
        match self {
            UsageFiles::V1 { memory, pids, cpuacct } => HostFacts {
                memory_limit_bytes: number(&memory.join("memory.limit_in_bytes")),
                oom_killed: keyed(&memory.join("memory.oom_control"), "oom_kill") > 0,
                pids_limit: number(&pids.join("pids.max")),
                usage: Some(GroupUsage {
                    memory_used_bytes: working_set(
                        number(&memory.join("memory.usage_in_bytes")),
                        &read(&memory.join("memory.stat")),
                        V1_INACTIVE,
                    ),
                    pids: number(&pids.join("pids.current")),
                    cpu_usage_ns: number(&cpuacct.join("cpuacct.usage")),
                }),
            },
            UsageFiles::V2(dir) => HostFacts {
                memory_limit_bytes: number(&dir.join("memory.max")),
                oom_killed: keyed(&dir.join("memory.events"), "oom_kill") > 0,
                pids_limit: number(&dir.join("pids.max")),
                usage: Some(GroupUsage {
                    memory_used_bytes: working_set(
                        number(&dir.join("memory.current")),
                        &read(&dir.join("memory.stat")),
                        V2_INACTIVE,
                    ),
                    pids: number(&dir.join("pids.current")),
                    cpu_usage_ns: keyed(&dir.join("cpu.stat"), "usage_usec").saturating_mul(1000),
                }),
            },
        }
    }
}

/// v1's `memory.stat` key of the inactive page cache, children included
/// (its plain `inactive_file` is the group's own only).
const V1_INACTIVE: &str = "total_inactive_file";

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// A file holding one number; "max" and unreadable files read as 0
/// (unknown), as the contract says.
fn number(path: &Path) -> u64 {
    std::fs::read_to_string(path).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0)
}

/// The value of `key` in a flat-keyed file (`key value` per line).
fn keyed(path: &Path, key: &str) -> u64 {
    parse_keyed(&read(path), key)
}

fn parse_keyed(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == key).then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0)
}

impl VmCgroup {
    /// The files Stats reads.
    pub fn usage_files(&self) -> UsageFiles {
        if self.v2 {
            return UsageFiles::V2(self.dirs[0].clone());
        }
        // cpuacct's own dir comes last when it has one; else cpu's holds it.
        let cpuacct = self.dirs.get(3).unwrap_or(&self.dirs[1]).clone();
        UsageFiles::V1 { memory: self.dirs[0].clone(), pids: self.dirs[2].clone(), cpuacct }
    }

    /// Writes the VM's limits.
    pub fn limit(&self, limits: Limits) -> Result<(), DriverError> {
        let quota = u64::from(limits.cpus) * 100_000;
        if self.v2 {
            let d = &self.dirs[0];
            return write(&d.join("memory.max"), &limits.memory_bytes.to_string())
                .and_then(|()| write(&d.join("memory.swap.max"), "0").or(Ok(())))
                .and_then(|()| write(&d.join("cpu.max"), &format!("{quota} 100000")))
                .and_then(|()| write(&d.join("pids.max"), &limits.pids.to_string()));
        }
        let (m, c, p) = (&self.dirs[0], &self.dirs[1], &self.dirs[2]);
        write(&m.join("memory.limit_in_bytes"), &limits.memory_bytes.to_string())
            .and_then(|()| {
                // Without this the limit only moves pages to swap.
                let memsw = m.join("memory.memsw.limit_in_bytes");
                if memsw.exists() { write(&memsw, &limits.memory_bytes.to_string()) } else { Ok(()) }
            })
            .and_then(|()| write(&c.join("cpu.cfs_period_us"), "100000"))
            .and_then(|()| write(&c.join("cpu.cfs_quota_us"), &quota.to_string()))
            .and_then(|()| write(&p.join("pids.max"), &limits.pids.to_string()))
    }

    /// Renames the group to `name` (a VM's id) where the hierarchy allows
    /// it: v1 does, v2 refuses renames, and a dir that cannot be renamed
    /// keeps its name (the group is tracked by its dirs, never by name).
    pub fn rename(&mut self, name: &str) {
        for d in &mut self.dirs {
            let to = d.with_file_name(name);
            // A group left by a crashed helper (see `create_unlimited`).
            let _ = std::fs::remove_dir(&to);
            match std::fs::rename(&*d, &to) {
                Ok(()) => *d = to,
                Err(e) => tracing::debug!(dir = %d.display(), error = %e, "cgroup keeps its name"),
            }
        }
    }

    /// The files a process writes `0` to, to move itself into the group
    /// (one per v1 controller): how a child joins between fork and exec.
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|d| d.join("cgroup.procs")).collect()
    }

    /// Moves a process (and its future children) into the VM's cgroup.
    pub fn add(&self, pid: i32) -> Result<(), DriverError> {
        for d in &self.dirs {
            write(&d.join("cgroup.procs"), &pid.to_string())?;
        }
        Ok(())
    }

    /// Removes the cgroup; every process in it must be gone already.
    pub fn remove(&self) {
        for d in &self.dirs {
            // The kernel may still be tearing down the last task right after
            // its parent reaped it; rmdir says EBUSY until then.
            for attempt in 0..50 {
                match std::fs::remove_dir(d) {
                    Err(e) if e.raw_os_error() == Some(libc::EBUSY) && attempt < 49 => {
                        std::thread::sleep(std::time::Duration::from_millis(2));
                    }
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        tracing::warn!(dir = %d.display(), error = %e, "cannot remove cgroup");
                        break;
                    }
                    _ => break,
                }
            }
        }
    }
}

/// Makes an unprivileged helper's own v2 cgroup `own` ready for VM groups:
/// it must be delegated to `uid` (owned by it, as systemd's `Delegate=yes`
/// and `host-setup` leave it); its processes move to a leaf so that
/// controllers can be enabled for its children.
fn v2_take_delegated(own: &Path, uid: u32) -> Result<(), Unavailable> {
    use std::os::unix::fs::MetadataExt as _;
    let owner = std::fs::metadata(own.join("cgroup.subtree_control")).map(|m| m.uid()).unwrap_or(u32::MAX);
    if owner != uid {
        return Err(Unavailable::new(
            format!("this process's cgroup {} is not delegated to uid {uid}", own.display()),
            V2_SCOPE_FIX,
        ));
    }
    let enabled = std::fs::read_to_string(own.join("cgroup.subtree_control")).unwrap_or_default();
    if CONTROLLERS.iter().all(|c| enabled.split_whitespace().any(|x| x == *c)) {
        return Ok(());
    }
    let leaf = own.join(V2_LEAF);
    mkdir(&leaf).map_err(Unavailable::failed)?;
    let procs = std::fs::read_to_string(own.join("cgroup.procs"))
        .map_err(|e| Unavailable::failed(format!("{}: {e}", own.display())))?;
    for pid in procs.split_whitespace() {
        // A process may exit between the read and the move.
        match std::fs::write(leaf.join("cgroup.procs"), pid) {
            Err(e) if e.raw_os_error() != Some(libc::ESRCH) => {
                return Err(Unavailable::failed(format!("move pid {pid} into {}: {e}", leaf.display())));
            }
            _ => {}
        }
    }
    write(&own.join("cgroup.subtree_control"), "+memory +cpu +pids").map_err(|e| Unavailable::failed(e.to_string()))
}

/// The fix on v2: a scope systemd delegates to the user.
const V2_SCOPE_FIX: &str =
    "start the server in a delegated scope: `systemd-run --user --scope -p Delegate=yes sandbox-mcp`";

fn mkdir(dir: &Path) -> Result<(), String> {
    match std::fs::create_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(format!("{}: {e}", dir.display())),
    }
}

fn write(path: &Path, value: &str) -> Result<(), DriverError> {
    std::fs::write(path, value).map_err(|e| DriverError::Cgroup(format!("write {value} to {}: {e}", path.display())))
}

/// mountinfo of the two layouts, for this module's tests and host setup's
/// (another crate's: so not `cfg(test)`, which holds only within one).
pub mod mountinfo {
    /// v1 controllers plus an empty v2 mount, as on the CI machines.
    pub const HYBRID: &str = "\
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    /// Pure v2.
    pub const V2: &str = "35 24 0:30 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
}

#[cfg(test)]
mod tests {
    use super::mountinfo::{HYBRID, V2};
    use super::*;

    #[test]
    fn keyed_files_are_parsed() {
        let oom = "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n";
        assert_eq!(parse_keyed(oom, "oom_kill"), 2);
        assert_eq!(parse_keyed(oom, "missing"), 0);
    }

    /// A temp dir holding `files` (name, text).
    fn fake_group(name: &str, files: &[(&str, &str)]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("cgroup-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (f, text) in files {
            std::fs::write(dir.join(f), text).unwrap();
        }
        dir
    }

    #[test]
    fn v2_facts_are_the_groups_own_counters() {
        let dir = fake_group(
            "v2",
            &[
                ("memory.max", "536870912\n"),
                ("memory.current", "40000000\n"),
                ("memory.stat", "anon 30000000\nfile 9000000\nactive_file 1000000\ninactive_file 8000000\n"),
                ("memory.events", "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n"),
                ("pids.current", "71\n"),
                ("pids.max", "max\n"),
                ("cpu.stat", "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n"),
            ],
        );
        let usage = GroupUsage { memory_used_bytes: 32_000_000, pids: 71, cpu_usage_ns: 2_500_000_000 };
        let want = HostFacts { memory_limit_bytes: 512 << 20, pids_limit: 0, oom_killed: true, usage: Some(usage) };
        assert_eq!(UsageFiles::V2(dir.clone()).facts(), want);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn v1_facts_read_each_controllers_dir() {
        let memory = fake_group(
            "v1-memory",
            &[
                ("memory.limit_in_bytes", "536870912\n"),
                ("memory.usage_in_bytes", "40000000\n"),
                ("memory.stat", "cache 9000000\ninactive_file 1\ntotal_inactive_file 8000000\n"),
                ("memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n"),
            ],
        );
        let pids = fake_group("v1-pids", &[("pids.current", "64\n"), ("pids.max", "64\n")]);
        let cpuacct = fake_group("v1-cpuacct", &[("cpuacct.usage", "123456789\n")]);
        let files = UsageFiles::V1 { memory: memory.clone(), pids: pids.clone(), cpuacct: cpuacct.clone() };
        let usage = GroupUsage { memory_used_bytes: 32_000_000, pids: 64, cpu_usage_ns: 123_456_789 };
        let want = HostFacts { memory_limit_bytes: 512 << 20, pids_limit: 64, oom_killed: false, usage: Some(usage) };
        assert_eq!(files.facts(), want);
        for d in [memory, pids, cpuacct] {
            std::fs::remove_dir_all(d).unwrap();
        }
    }

    #[test]
    fn unreadable_counters_are_unknown() {
        let gone = std::env::temp_dir().join(format!("cgroup-gone-{}", std::process::id()));
        let facts = UsageFiles::V2(gone).facts();
        assert_eq!(facts.usage, Some(GroupUsage::default()));
        assert_eq!((facts.memory_limit_bytes, facts.pids_limit, facts.oom_killed), (0, 0, false));
    }

    const SCOPE: &str = "0::/user.slice/user-1000.slice/user@1000.service/app.slice/run-r1.scope\n";

    fn alice() -> Runner {
        Runner::User { uid: 1000, name: "alice".into() }
    }

    #[test]
    fn v1_groups_go_in_the_users_delegated_subtree() {
        let layout = plan(&Mounts::parse(HYBRID), "0::/\n", &alice(), "g").unwrap();
        let at = |c: &str| PathBuf::from(format!("/sys/fs/cgroup/{c}/sandbox-mcp.alice/g"));
        assert_eq!(
            layout,
            CgroupLayout::V1 { memory: at("memory"), cpu: at("cpu"), pids: at("pids"), cpuacct: Some(at("cpuacct")) }
        );
    }

    #[test]
    fn root_keeps_its_groups_at_the_top() {
        let layout = plan(&Mounts::parse(HYBRID), "0::/\n", &Runner::Root, "g").unwrap();
        assert_eq!(layout.parent(), Path::new("/sys/fs/cgroup/memory/g"));
    }

    #[test]
    fn v2_groups_go_under_the_own_delegated_scope() {
        let layout = plan(&Mounts::parse(V2), SCOPE, &alice(), "g").unwrap();
        let scope = "/sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service/app.slice/run-r1.scope";
        assert_eq!(layout, CgroupLayout::V2 { base: PathBuf::from(scope).join("g") });
    }

    #[test]
    fn no_hierarchy_says_why_and_how() {
        let e = plan(&Mounts::parse(""), "", &alice(), "g").unwrap_err();
        assert!(e.reason.contains("no cgroup hierarchy"), "{e}");
        let e = plan(&Mounts::parse(V2), "1:name=systemd:/\n", &alice(), "g").unwrap_err();
        assert!(e.reason.contains("no cgroup v2 group") && e.to_string().contains("; fix: "), "{e}");
    }

    #[test]
    fn a_user_without_delegation_gets_the_host_setup_fix() {
        // A v1 layout whose delegated dirs do not exist (a fresh temp root).
        let root = std::env::temp_dir().join(format!("cgroup-plan-{}", std::process::id()));
        let layout = CgroupLayout::V1 {
            memory: root.join("memory/sandbox-mcp.alice/g"),
            cpu: root.join("cpu/sandbox-mcp.alice/g"),
            pids: root.join("pids/sandbox-mcp.alice/g"),
            cpuacct: None,
        };
        let e = layout.prepare(&alice()).unwrap_err();
        assert!(e.reason.contains("no cgroup subtree delegated to alice"), "{e}");
        assert_eq!(e.fix, "sudo sandbox-mcp host-setup --user alice");
        assert!(!root.exists(), "nothing is created without the delegation");
    }

    #[test]
    fn limits_are_written_and_the_group_removed() {
        let Ok(layout) = CgroupLayout::detect() else {
            eprintln!("skipped: no usable cgroups here (not root?)");
            return;
        };
        let id = format!("unit-test-{}", std::process::id());
        let limits = Limits { cpus: 2, memory_bytes: 64 << 20, pids: 33 };
        let cg = layout.create(&id, limits).unwrap();
        let read = |f: &str| cg.dirs.iter().find_map(|d| std::fs::read_to_string(d.join(f)).ok()).unwrap_or_default();
        assert_eq!(read("pids.max").trim(), "33");
        match layout {
            CgroupLayout::V1 { .. } => {
                assert_eq!(read("memory.limit_in_bytes").trim(), (64u64 << 20).to_string());
                assert_eq!(read("cpu.cfs_quota_us").trim(), "200000");
            }
            CgroupLayout::V2 { .. } => assert_eq!(read("cpu.max").trim(), "200000 100000"),
        }
        cg.remove();
        assert!(cg.dirs.iter().all(|d| !d.exists()));
        assert!(cg.add(1).is_err(), "adding to a removed group fails");
    }
}
