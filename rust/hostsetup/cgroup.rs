//! cgroup delegation: the subtree in which an ordinary user's helper may
//! create its VMs' groups (see `helper::driver::cgroup`).
//! - v1 (and hybrid): `sandbox-mcp.<user>` under each of the memory, cpu,
//!   cpuacct and pids hierarchies, owned by the user, with its `tasks` and
//!   `cgroup.procs` so the user's processes can move into its children.
//! - v2 with systemd: nothing per user; systemd delegates `user@UID.service`
//!   and the server runs in a `systemd-run --user --scope -p Delegate=yes` scope.
//! - v2 without systemd: `sandbox-mcp.<user>` under the root with the
//!   controllers enabled, chowned as the kernel's delegation docs say.
use std::{
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

use super::{HostSetupError, Outcome, User};
use sandbox_helper::driver::cgroup::{Mounts, delegated_name};

/// The files a delegatee must own in v1 to move processes into the group's children.
const V1_FILES: [&str; 2] = ["tasks", "cgroup.procs"];
/// The files the kernel's cgroup-v2 docs ("Delegation") say to chown.
const V2_FILES: [&str; 3] = ["cgroup.procs", "cgroup.subtree_control", "cgroup.threads"];

/// What delegation looks like for a host's cgroup mounts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Chown these `sandbox-mcp.<user>` dirs (one per v1 hierarchy).
    V1(Vec<PathBuf>),
    /// systemd delegates; check `user@UID.service`.
    V2Systemd,
    /// Create this dir under the v2 root and enable the controllers for it.
    V2(PathBuf),
    /// No hierarchy with the controllers.
    None,
}

/// The delegation plan for `user` on these mounts; `systemd` when systemd is
/// the init (it owns the v2 tree then).
pub fn plan(mounts: &Mounts, user: &str, systemd: bool) -> Plan {
    if let Some(v1) = mounts.v1() {
        let mut dirs: Vec<PathBuf> = v1.into_iter().map(|m| m.join(delegated_name(user))).collect();
        dirs.dedup();
        return Plan::V1(dirs);
    }
    match &mounts.v2 {
        Some(_) if systemd => Plan::V2Systemd,
        Some(root) => Plan::V2(root.join(delegated_name(user))),
        None => Plan::None,
    }
}

/// Sets up the delegation for `user`.
pub fn ensure(user: &User, dry_run: bool) -> Result<Vec<Outcome>, HostSetupError> {
    let mounts = Mounts::read().map_err(|e| HostSetupError::io("read /proc/self/mountinfo", e))?;
    let systemd = Path::new("/run/systemd/system").is_dir();
    match plan(&mounts, &user.name, systemd) {
        Plan::V1(dirs) => dirs.iter().map(|d| delegate(d, &V1_FILES, user, dry_run)).collect(),
        Plan::V2Systemd => Ok(vec![systemd_delegation(user)]),
        Plan::V2(dir) => {
            let root = dir.parent().unwrap_or(Path::new("/"));
            let mut out = vec![enable_controllers(root, dry_run)?];
            out.push(delegate(&dir, &V2_FILES, user, dry_run)?);
            Ok(out)
        }
        Plan::None => Ok(vec![Outcome::Missing(
            "cgroup: no hierarchy with memory, cpu and pids controllers; sandboxes run without limits".into(),
        )]),
    }
}

/// Creates `dir` and gives it and `files` in it to the user.
fn delegate(dir: &Path, files: &[&str], user: &User, dry_run: bool) -> Result<Outcome, HostSetupError> {
    let paths: Vec<PathBuf> = std::iter::once(dir.to_path_buf()).chain(files.iter().map(|f| dir.join(f))).collect();
    let owned = |p: &PathBuf| std::fs::metadata(p).is_ok_and(|m| m.uid() == user.uid && m.gid() == user.gid);
    if paths.iter().all(owned) {
        return Ok(Outcome::Done(format!("cgroup: {} already delegated to {}", dir.display(), user.name)));
    }
    if dry_run {
        return Ok(Outcome::Would(format!("cgroup: create {} and chown it to {}", dir.display(), user.name)));
    }
    match std::fs::create_dir(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
            return Err(HostSetupError::io(format!("create {}", dir.display()), e));
        }
        _ => {}
    }
    for p in &paths {
        std::os::unix::fs::chown(p, Some(user.uid), Some(user.gid))
            .map_err(|e| HostSetupError::io(format!("chown {} to {}", p.display(), user.name), e))?;
    }
    Ok(Outcome::Did(format!("cgroup: delegated {} to {}", dir.display(), user.name)))
}

/// v2 without systemd: the controllers must be on in the root's
/// subtree_control for the user's group to have them.
fn enable_controllers(root: &Path, dry_run: bool) -> Result<Outcome, HostSetupError> {
    let file = root.join("cgroup.subtree_control");
    let enabled = std::fs::read_to_string(&file).unwrap_or_default();
    let missing: Vec<&str> =
        ["memory", "cpu", "pids"].into_iter().filter(|c| !enabled.split_whitespace().any(|x| x == *c)).collect();
    if missing.is_empty() {
        return Ok(Outcome::Done(format!("cgroup: memory, cpu and pids already enabled in {}", file.display())));
    }
    let line = missing.iter().map(|c| format!("+{c}")).collect::<Vec<_>>().join(" ");
    if dry_run {
        return Ok(Outcome::Would(format!("cgroup: write '{line}' to {}", file.display())));
    }
    std::fs::write(&file, &line).map_err(|e| HostSetupError::io(format!("write '{line}' to {}", file.display()), e))?;
    Ok(Outcome::Did(format!("cgroup: enabled {} in {}", missing.join(", "), file.display())))
}

/// v2 with systemd: reports whether `user@UID.service` is delegated.
fn systemd_delegation(user: &User) -> Outcome {
    let unit = format!("user@{}.service", user.uid);
    let shown = std::process::Command::new("systemctl").args(["show", &unit, "-p", "Delegate"]).output();
    let delegated = shown.as_ref().is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "Delegate=yes");
    let how = "the helper runs its VMs in the cgroup of a `systemd-run --user --scope -p Delegate=yes` scope; \
               start the server as `systemd-run --user --scope -p Delegate=yes sandbox-mcp` for limits";
    if delegated {
        Outcome::Done(format!("cgroup: v2 with systemd, {unit} is delegated; {how}"))
    } else {
        Outcome::Missing(format!(
            "cgroup: v2 with systemd, {unit} is not delegated (or not running: log in as {} first); \
             add `Delegate=cpu memory pids` in /etc/systemd/system/user@.service.d/delegate.conf, \
             `systemctl daemon-reload`; then {how}",
            user.name
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_helper::driver::cgroup::mountinfo::{HYBRID, V2};

    #[test]
    fn hybrid_delegates_each_v1_hierarchy() {
        let plan = plan(&Mounts::parse(HYBRID), "alice", false);
        let want = ["memory", "cpu", "pids", "cpuacct"]
            .map(|c| PathBuf::from(format!("/sys/fs/cgroup/{c}/sandbox-mcp.alice")));
        assert_eq!(plan, Plan::V1(want.to_vec()));
    }

    #[test]
    fn comounted_cpu_and_cpuacct_are_one_dir() {
        let m = "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n\
                 35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n\
                 39 31 0:36 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n";
        let Plan::V1(dirs) = plan(&Mounts::parse(m), "bob", false) else { panic!("not v1") };
        assert_eq!(dirs.len(), 3);
        assert!(dirs.contains(&PathBuf::from("/sys/fs/cgroup/cpu,cpuacct/sandbox-mcp.bob")));
    }

    #[test]
    fn pure_v2_depends_on_systemd() {
        assert_eq!(plan(&Mounts::parse(V2), "alice", true), Plan::V2Systemd);
        assert_eq!(plan(&Mounts::parse(V2), "alice", false), Plan::V2("/sys/fs/cgroup/sandbox-mcp.alice".into()));
        assert_eq!(plan(&Mounts::parse(""), "alice", false), Plan::None);
    }
}
