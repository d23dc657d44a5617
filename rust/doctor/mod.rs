//! `sandbox-mcp doctor`: checks this host the way sandboxes will use it and
//! prints one line per check, `ok`, `WARN` or `FAIL`, with the fix. Probes are
//! real (a namespace unshare, a KVM guest, a tun in a user + network namespace, a helper
//! GetInfo), never just file existence, and none changes the host beyond
//! starting the helper a server would start anyway.
pub mod kvm;

use std::{
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use crate::{
    image::ImageStore,
    orchestrator::{Config, helper_client::HelperClient},
    paths,
};

/// Below this much free space in the data dir, images and volumes may not fit.
const MIN_FREE_BYTES: u64 = 5 << 30;

/// How one check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Works.
    Ok,
    /// Works with less (a feature is missing or a limit is near).
    Warn,
    /// Sandboxes cannot work until this is fixed.
    Fail,
}

/// One line of the report.
#[derive(Debug, Clone)]
pub struct Check {
    /// Short name of what was checked.
    pub name: &'static str,
    /// The outcome.
    pub status: Status,
    /// What was found.
    pub detail: String,
    /// What to do about a WARN or FAIL.
    pub fix: Option<String>,
}

impl Check {
    fn ok(name: &'static str, detail: impl Into<String>) -> Self {
        Self { name, status: Status::Ok, detail: detail.into(), fix: None }
    }
    fn warn(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Self { name, status: Status::Warn, detail: detail.into(), fix: Some(fix.into()) }
    }
    fn fail(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Self { name, status: Status::Fail, detail: detail.into(), fix: Some(fix.into()) }
    }
}

impl std::fmt::Display for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let status = match self.status {
            Status::Ok => "ok",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        };
        write!(f, "{status:<4}  {:<10} {}", self.name, self.detail)?;
        if let Some(fix) = &self.fix {
            write!(f, "; fix: {fix}")?;
        }
        Ok(())
    }
}

/// Every check, in order.
#[derive(Debug, Default)]
pub struct Report {
    /// The checks.
    pub checks: Vec<Check>,
}

impl Report {
    /// True when nothing failed (warnings allowed).
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.status != Status::Fail)
    }
}

/// Runs every check, printing each line to stdout as it completes.
pub async fn run(helper_bin: &Path) -> Report {
    let mut report = Report::default();
    let mut add = |c: Check| {
        println!("{c}");
        report.checks.push(c);
    };
    add(helper(helper_bin).await);
    add(user_namespaces());
    add(cgroups());
    add(seccomp());
    add(overlayfs());
    add(kvm_check());
    add(tun());
    add(default_image());
    add(sandbox_ctl());
    add(disk_space(&paths::data_dir()));
    add(disk_quota(&paths::data_dir()));
    report
}

async fn helper(helper_bin: &Path) -> Check {
    let socket = paths::helper_socket();
    if let Ok(mut c) = HelperClient::connect(&socket).await {
        return match c.info().await {
            Ok(info) => Check::ok("helper", format!("running at {} ({info})", socket.display())),
            Err(e) => Check::fail("helper", format!("GetInfo failed: {e}"), "restart it: kill the helper, then rerun"),
        };
    }
    match HelperClient::connect_or_spawn(&socket, helper_bin).await {
        Ok(mut c) => match c.info().await {
            Ok(info) => {
                Check::ok("helper", format!("started {} at {} ({info})", helper_bin.display(), socket.display()))
            }
            Err(e) => Check::fail("helper", format!("GetInfo failed: {e}"), "see the helper log"),
        },
        Err(e) => Check::fail(
            "helper",
            e.to_string(),
            format!(
                "install sandbox-vm-helper next to sandbox-mcp (`make install`) or set SANDBOX_VM_HELPER_BIN; log: {}",
                paths::helper_log_file().display()
            ),
        ),
    }
}

fn user_namespaces() -> Check {
    let max =
        std::fs::read_to_string("/proc/sys/user/max_user_namespaces").ok().and_then(|s| s.trim().parse::<u64>().ok());
    if max == Some(0) {
        return Check::fail("userns", "user namespaces are disabled", "sysctl -w user.max_user_namespaces=15000");
    }
    // The namespaces a sandbox gets, unshared in a child like the driver does.
    let flags = libc::CLONE_NEWUSER
        | libc::CLONE_NEWNS
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUTS
        | libc::CLONE_NEWNET
        | libc::CLONE_NEWCGROUP;
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("/bin/true"));
    let mut cmd = Command::new(exe);
    cmd.arg("--version").stdout(Stdio::null()).stderr(Stdio::null());
    // SAFETY: unshare is async-signal-safe and touches no state shared with
    // the parent; it runs in the forked child before exec.
    unsafe {
        cmd.pre_exec(move || if libc::unshare(flags) == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) });
    }
    match cmd.status() {
        Ok(s) if s.success() => {
            let mapping = match crate::helper::driver::userns::IdMapper::detect() {
                Ok(mapper) => format!("sandboxes map {}", mapper.id_map().describe()),
                Err(reason) => {
                    return Check::fail("userns", reason, "run `sandbox-mcp host-setup --user $USER` as root");
                }
            };
            Check::ok("userns", format!("unshare(user, mount, pid, ipc, uts, net, cgroup) works; {mapping}"))
        }
        Ok(s) => Check::fail("userns", format!("probe exited with {s}"), "run as root or enable user namespaces"),
        Err(e) => Check::fail(
            "userns",
            format!("unshare failed: {e}"),
            "enable unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1) or run as root",
        ),
    }
}

fn cgroups() -> Check {
    let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Check::warn("cgroups", "cannot read /proc/self/mountinfo", "mount /proc");
    };
    let mut v1 = Vec::new();
    let mut v2 = None;
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else { continue };
        let mut fields = right.split(' ');
        let fstype = fields.next().unwrap_or_default();
        let options = fields.nth(1).unwrap_or_default();
        match fstype {
            "cgroup" => v1.extend(options.split(',').map(str::to_string)),
            "cgroup2" => v2 = left.split(' ').nth(4).map(PathBuf::from),
            _ => {}
        }
    }
    let has_v1 = ["memory", "cpu", "pids"].iter().all(|c| v1.iter().any(|o| o == c));
    if has_v1 {
        let kind = if v2.is_some() { "v1 (hybrid: the v2 mount is not used)" } else { "v1" };
        return Check::ok("cgroups", format!("{kind}; memory, cpu and pids limits enforceable"));
    }
    let Some(root) = v2 else {
        return Check::warn(
            "cgroups",
            "no cgroup hierarchy: sandboxes run without cpu/memory/pids limits",
            "mount cgroup2 at /sys/fs/cgroup",
        );
    };
    let controllers = std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
    let missing: Vec<&str> =
        ["memory", "cpu", "pids"].into_iter().filter(|c| !controllers.split_whitespace().any(|x| x == *c)).collect();
    if missing.is_empty() {
        Check::ok("cgroups", "v2; memory, cpu and pids limits enforceable")
    } else {
        Check::warn(
            "cgroups",
            format!("v2 without {}: those limits are not enforced", missing.join(", ")),
            "delegate the controllers (systemd: Delegate=yes) or boot with cgroup v2 controllers enabled",
        )
    }
}

fn seccomp() -> Check {
    match std::fs::read_to_string("/proc/sys/kernel/seccomp/actions_avail") {
        Ok(actions) if actions.split_whitespace().any(|a| a == "errno") => {
            Check::ok("seccomp", "filters available (errno action)")
        }
        Ok(actions) => Check::fail(
            "seccomp",
            format!("no errno action (have: {})", actions.trim()),
            "use a kernel built with CONFIG_SECCOMP_FILTER",
        ),
        Err(e) => {
            Check::fail("seccomp", format!("not available: {e}"), "use a kernel built with CONFIG_SECCOMP_FILTER")
        }
    }
}

fn overlayfs() -> Check {
    let listed = std::fs::read_to_string("/proc/filesystems")
        .map(|s| s.lines().any(|l| l.split_whitespace().last() == Some("overlay")))
        .unwrap_or(false);
    if listed {
        return Check::ok("overlayfs", "in /proc/filesystems");
    }
    let release = nix::sys::utsname::uname().map(|u| u.release().to_string_lossy().into_owned()).unwrap_or_default();
    if Path::new(&format!("/lib/modules/{release}/kernel/fs/overlayfs")).exists() {
        Check::warn("overlayfs", "module not loaded (loads on first mount)", "modprobe overlay")
    } else {
        Check::fail("overlayfs", "not in /proc/filesystems and no module", "use a kernel with CONFIG_OVERLAY_FS")
    }
}

fn kvm_check() -> Check {
    const NOTE: &str = "the namespace driver does not need it";
    match kvm::probe() {
        // Honest about the probe's reach: some hosts (e.g. kvm_pvm) run a
        // real-mode guest yet stall booting a stock Linux kernel.
        kvm::KvmProbe::Boots => {
            Check::ok("kvm", format!("a real-mode test guest ran and halted; a full Linux boot is not probed ({NOTE})"))
        }
        kvm::KvmProbe::Absent => Check::warn(
            "kvm",
            format!("no /dev/kvm ({NOTE})"),
            "enable virtualization in firmware; modprobe kvm_intel or kvm_amd",
        ),
        kvm::KvmProbe::Unusable(why) => Check::warn(
            "kvm",
            format!("/dev/kvm present but no guest runs: {why} ({NOTE})"),
            "enable nested virtualization or run on bare metal; check access to /dev/kvm",
        ),
    }
}

/// What EGRESS sandboxes need: the current user can open /dev/net/tun and
/// create a tun inside a new user + network namespace, as the launcher does.
/// Probed in a child (re-exec of this binary) that really does it.
fn tun() -> Check {
    let fix = "load the tun module (modprobe tun) and make /dev/net/tun usable by this user \
               (sandboxes keep network='none' until then)";
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("/bin/true"));
    let mut cmd = Command::new(exe);
    cmd.arg("--version").stdout(Stdio::null()).stderr(Stdio::null());
    // SAFETY: unshare, open and ioctl are async-signal-safe and touch no
    // state shared with the parent; they run in the forked child before exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::unshare(libc::CLONE_NEWUSER) != 0 || libc::unshare(libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // A zeroed ifreq is valid; name and flags filled in place.
            let mut req: libc::ifreq = std::mem::zeroed();
            for (dst, src) in req.ifr_name.iter_mut().zip(b"eth0\0") {
                *dst = *src as libc::c_char;
            }
            req.ifr_ifru.ifru_flags = 0x0001 | 0x1000; // IFF_TUN | IFF_NO_PI
            let fd = libc::open(c"/dev/net/tun".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
            if fd < 0 || libc::ioctl(fd, libc::TUNSETIFF as _, &req) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    match cmd.status() {
        Ok(s) if s.success() => Check::ok("tun", "a tun opens in a user + network namespace (egress network)"),
        Ok(s) => Check::warn("tun", format!("probe exited with {s}"), fix),
        Err(e) => Check::warn("tun", format!("cannot create a tun in a user + network namespace: {e}"), fix),
    }
}

fn sandbox_ctl() -> Check {
    match crate::orchestrator::ctl::host_binary() {
        Some(p) => {
            Check::ok("sandbox-ctl", format!("{} (installed into sandboxes whose policy has inject_ctl)", p.display()))
        }
        None => Check::warn(
            "sandbox-ctl",
            "binary not found (SANDBOX_CTL_BIN or next to sandbox-mcp): sandboxes start without sandbox-ctl",
            "`make install` installs it beside sandbox-mcp",
        ),
    }
}

fn default_image() -> Check {
    let config = match Config::load() {
        Ok(c) => c,
        Err(e) => return Check::fail("image", format!("config: {e}"), format!("fix {}", Config::path().display())),
    };
    let name = config.defaults().image.clone();
    let store = ImageStore::new(paths::image_store());
    match store.get(&name) {
        Ok(info) => Check::ok(
            "image",
            format!("default image {name} in {} ({} MB)", store.root().display(), info.size_bytes >> 20),
        ),
        Err(e) => Check::fail(
            "image",
            format!("default image {name}: {e} (store {})", store.root().display()),
            format!("`make install`, or `sandbox-mcp image build --name {name}`"),
        ),
    }
}

fn disk_space(dir: &Path) -> Check {
    // The data dir may not exist yet: measure the filesystem it will live on.
    let existing = dir.ancestors().find(|p| p.exists()).unwrap_or(Path::new("/"));
    match nix::sys::statvfs::statvfs(existing) {
        Ok(st) => {
            let free = st.blocks_available() * st.fragment_size();
            let detail = format!("{} GiB free for {}", free >> 30, dir.display());
            if free < MIN_FREE_BYTES {
                Check::warn("disk", detail, "free space there or set XDG_DATA_HOME to a larger disk (want >= 5 GiB)")
            } else {
                Check::ok("disk", detail)
            }
        }
        Err(e) => Check::warn("disk", format!("statvfs {}: {e}", existing.display()), "check the data dir"),
    }
}

/// The mode of the sandboxes' disk quotas (see `helper::quota`): the
/// helper measures and stops a sandbox's processes past its quota; no hard
/// (filesystem) quota is used on any host.
fn disk_quota(dir: &Path) -> Check {
    let existing = dir.ancestors().find(|p| p.exists()).unwrap_or(Path::new("/"));
    Check::ok(
        "quota",
        format!(
            "measured: the helper sums each sandbox's writable layer and writable mounts about once a second and \
             stops its processes past the quota (default 10 GiB); no hard quota under {}",
            existing.display()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_fails_only_on_fail() {
        let mut r = Report::default();
        r.checks.push(Check::ok("a", "fine"));
        r.checks.push(Check::warn("b", "meh", "do x"));
        assert!(r.passed());
        r.checks.push(Check::fail("c", "broken", "do y"));
        assert!(!r.passed());
        assert_eq!(r.checks[2].to_string(), "FAIL  c          broken; fix: do y");
    }

    #[test]
    fn disk_space_measures_the_nearest_existing_ancestor() {
        let c = disk_space(Path::new("/nonexistent/deeper/sandbox-mcp"));
        assert_ne!(c.status, Status::Fail);
        assert!(c.detail.contains("GiB free"), "{}", c.detail);
    }
}
