//! Resource limits: one cgroup per VM, written directly to cgroupfs.
//!
//! The layout is detected from /proc/self/mountinfo because hosts differ:
//! pure v1, hybrid (v1 controllers plus an empty v2 mount, as on the CI
//! machines) and pure v2. Hybrid is treated as v1, since its v2 mount has no
//! controllers to delegate.
use std::path::{Path, PathBuf};

use super::DriverError;

const GROUP: &str = "sandbox-mcp";

/// The parent group of this helper's VMs: `sandbox-mcp-<hash of the state
/// dir>`. cgroup paths are global to the host, so two helpers (a user's and a
/// test run's, each with its own XDG dirs) must never share a VM's group.
fn group_name() -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    crate::paths::state_dir().hash(&mut h);
    format!("{GROUP}-{:08x}", h.finish() as u32)
}

/// Where the VM cgroups live on this host.
#[derive(Debug, Clone)]
pub enum CgroupLayout {
    /// One hierarchy per controller.
    V1 {
        /// `<memory mount>/sandbox-mcp`.
        memory: PathBuf,
        /// `<cpu mount>/sandbox-mcp`.
        cpu: PathBuf,
        /// `<pids mount>/sandbox-mcp`.
        pids: PathBuf,
        /// `<cpuacct mount>/sandbox-mcp`, when cpuacct has a hierarchy of
        /// its own (co-mounted with cpu, the cpu group already counts).
        cpuacct: Option<PathBuf>,
    },
    /// The unified hierarchy: `<our cgroup>/sandbox-mcp` with the three
    /// controllers enabled for its children.
    V2 {
        /// The parent of every VM cgroup.
        base: PathBuf,
    },
}

/// Limits applied to one VM.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Whole CPUs.
    pub cpus: u32,
    /// Bytes of memory.
    pub memory_bytes: u64,
    /// Processes plus threads.
    pub pids: u32,
}

impl CgroupLayout {
    /// Finds a usable layout and prepares its `sandbox-mcp` parent group;
    /// `None` (with the reason) when limits cannot be enforced here.
    pub fn detect() -> Result<Self, String> {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").map_err(|e| format!("mountinfo: {e}"))?;
        let mut v1 = (None, None, None);
        let mut cpuacct = None;
        let mut v2 = None;
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
                        v1.0 = Some(p.clone());
                    }
                    if has("cpu") {
                        v1.1 = Some(p.clone());
                    }
                    if has("pids") {
                        v1.2 = Some(p.clone());
                    }
                    if has("cpuacct") && !has("cpu") {
                        cpuacct = Some(p);
                    }
                }
                "cgroup2" => v2 = Some(PathBuf::from(mount_point)),
                _ => {}
            }
        }
        let group = group_name();
        let layout = match (v1, v2) {
            ((Some(m), Some(c), Some(p)), _) => CgroupLayout::V1 {
                memory: m.join(&group),
                cpu: c.join(&group),
                pids: p.join(&group),
                cpuacct: cpuacct.map(|a| a.join(&group)),
            },
            (_, Some(root)) => CgroupLayout::V2 { base: v2_base(&root)? },
            _ => return Err("no cgroup hierarchy with memory, cpu and pids controllers".into()),
        };
        layout.prepare()?;
        Ok(layout)
    }

    /// Capability name reported in GetInfo.
    pub fn capability(&self) -> &'static str {
        match self {
            CgroupLayout::V1 { .. } => "cgroups.v1",
            CgroupLayout::V2 { .. } => "cgroups.v2",
        }
    }

    fn prepare(&self) -> Result<(), String> {
        match self {
            CgroupLayout::V1 { memory, cpu, pids, cpuacct } => {
                for dir in [memory, cpu, pids].into_iter().chain(cpuacct) {
                    mkdir(dir)?;
                }
            }
            CgroupLayout::V2 { base } => {
                mkdir(base)?;
                write(&base.join("cgroup.subtree_control"), "+memory +cpu +pids").map_err(|e| e.to_string())?;
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

    /// Creates the VM's cgroup with its limits.
    pub fn create(&self, id: &str, limits: Limits) -> Result<VmCgroup, DriverError> {
        let cg = VmCgroup {
            dirs: match self {
                CgroupLayout::V1 { memory, cpu, pids, cpuacct } => {
                    let mut dirs = vec![memory.join(id), cpu.join(id), pids.join(id)];
                    dirs.extend(cpuacct.iter().map(|a| a.join(id)));
                    dirs
                }
                CgroupLayout::V2 { base } => vec![base.join(id)],
            },
            v2: matches!(self, CgroupLayout::V2 { .. }),
        };
        for d in &cg.dirs {
            // A group left by a crashed helper still carries its counters (an
            // old OOM kill would show on the new VM): start from a fresh one.
            // Removal fails only while processes remain in it.
            let _ = std::fs::remove_dir(d);
            mkdir(d).map_err(DriverError::Cgroup)?;
        }
        let quota = u64::from(limits.cpus) * 100_000;
        let result = match self {
            CgroupLayout::V1 { .. } => {
                let (m, c, p) = (&cg.dirs[0], &cg.dirs[1], &cg.dirs[2]);
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
            CgroupLayout::V2 { .. } => {
                let d = &cg.dirs[0];
                write(&d.join("memory.max"), &limits.memory_bytes.to_string())
                    .and_then(|()| write(&d.join("memory.swap.max"), "0").or(Ok(())))
                    .and_then(|()| write(&d.join("cpu.max"), &format!("{quota} 100000")))
                    .and_then(|()| write(&d.join("pids.max"), &limits.pids.to_string()))
            }
        };
        if let Err(e) = result {
            cg.remove();
            return Err(e);
        }
        Ok(cg)
    }
}

/// The cgroup of one VM (one dir per v1 controller, or one v2 dir).
#[derive(Debug)]
pub struct VmCgroup {
    /// v1: memory, cpu, pids, then cpuacct if separate; v2: the one dir.
    dirs: Vec<PathBuf>,
    v2: bool,
}

/// Where a VM's usage counters live, for Stats.
#[derive(Debug, Clone)]
pub enum UsageFiles {
    /// One dir per controller; `cpu` is the dir holding cpuacct.usage.
    V1 {
        /// The memory controller's dir.
        memory: PathBuf,
        /// The pids controller's dir.
        pids: PathBuf,
        /// The dir with cpuacct.usage.
        cpu: PathBuf,
    },
    /// The unified dir.
    V2(PathBuf),
}

impl VmCgroup {
    /// The files Stats reads.
    pub fn usage_files(&self) -> UsageFiles {
        if self.v2 {
            return UsageFiles::V2(self.dirs[0].clone());
        }
        UsageFiles::V1 {
            memory: self.dirs[0].clone(),
            pids: self.dirs[2].clone(),
            cpu: self.dirs.get(3).unwrap_or(&self.dirs[1]).clone(),
        }
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

fn v2_base(root: &Path) -> Result<PathBuf, String> {
    let own = std::fs::read_to_string("/proc/self/cgroup").map_err(|e| format!("/proc/self/cgroup: {e}"))?;
    let rel = own.lines().find_map(|l| l.strip_prefix("0::")).ok_or("not in a cgroup v2 hierarchy")?;
    let controllers = std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
    for c in ["memory", "cpu", "pids"] {
        if !controllers.split_whitespace().any(|x| x == c) {
            return Err(format!("cgroup v2 has no {c} controller"));
        }
    }
    Ok(root.join(rel.trim_start_matches('/')).join(group_name()))
}

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

#[cfg(test)]
mod tests {
    use super::*;

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
