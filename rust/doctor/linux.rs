//! The Linux host's checks: what namespace and vm sandboxes need of it
//! (user namespaces, subordinate ids, cgroups, seccomp, overlayfs, KVM,
//! tun, AppArmor), each a real probe as the current user.
use std::{
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use super::{Check, kvm};
use sandbox_helper::driver::cgroup;
use sandbox_userns::{IdMapper, find_in_path, run_mapped};

use crate::hostsetup::{self, User, subid};

/// The current user, `None` for root (whose helper needs no subordinate
/// ids or delegation), or the check that says why there is none.
pub(super) fn user() -> Result<Option<User>, Check> {
    match User::current() {
        Ok(u) if u.uid == 0 => Ok(None),
        Ok(u) => Ok(Some(u)),
        Err(e) => Err(Check::fail("user", e.to_string(), "run doctor as a user with a passwd entry")),
    }
}

/// Every host check, each handed to `add` as it completes.
pub(super) fn host_checks(user: Option<&User>, helper_bin: &Path, add: &mut dyn FnMut(Check)) {
    add(user_namespaces(user));
    add(subids(user));
    add(cgroups());
    add(seccomp());
    add(overlayfs(user));
    add(kvm_check(user));
    add(tun(user));
    add(apparmor(user, helper_bin));
}

/// The fix for what `host-setup` sets up, or `fallback` for root.
fn setup_fix(user: Option<&User>, fallback: &str) -> String {
    user.map_or_else(|| fallback.to_string(), User::setup_fix)
}

fn user_namespaces(user: Option<&User>) -> Check {
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
    let restricted = hostsetup::apparmor::restricted();
    let unshare_fix = if restricted {
        setup_fix(user, "run as root")
    } else {
        "enable unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1) or run as root".to_string()
    };
    let failure = match cmd.status() {
        Ok(s) if s.success() => None,
        Ok(s) => Some(format!("probe exited with {s}")),
        Err(e) => Some(format!("unshare failed: {e}")),
    };
    if let Some(failure) = failure {
        // Under the AppArmor restriction this probe (sandbox-mcp, unconfined)
        // is refused even where the helper's own profile allows it: that is
        // the apparmor check's to judge, not proven either way here.
        if restricted && let Some(u) = user {
            return Check::warn(
                "userns",
                format!(
                    "{failure}: AppArmor refuses user namespaces to this unconfined probe; the helper's are allowed \
                     only by its profile (see the apparmor check), not probed here"
                ),
                u.setup_fix(),
            );
        }
        return Check::fail("userns", failure, unshare_fix);
    }
    const UNSHARED: &str = "unshare(user, mount, pid, ipc, uts, net, cgroup) works";
    let Some(user) = user else {
        return Check::ok("userns", format!("{UNSHARED}; root maps ids directly"));
    };
    match map_probe() {
        Ok(map) => Check::ok("userns", format!("{UNSHARED}; newuidmap/newgidmap mapped a child's ids ({map})")),
        Err(why) => Check::fail("userns", format!("{UNSHARED} but ids cannot be mapped: {why}"), user.setup_fix()),
    }
}

/// Subordinate ranges from /etc/subuid and /etc/subgid (absent files: none).
fn subordinate_ranges() -> (Vec<subid::Entry>, Vec<subid::Entry>) {
    let read = |p: &str| subid::parse(&std::fs::read_to_string(p).unwrap_or_default());
    (read("/etc/subuid"), read("/etc/subgid"))
}

/// Maps a user namespace exactly as the helper maps its sandboxes' (the same
/// [`IdMapper`], installed by the same code), and returns the uid map the
/// kernel accepted: a probe with a map of its own could pass where the
/// helper's map is refused.
fn map_probe() -> Result<String, String> {
    let mapper = IdMapper::detect()?;
    let mut cat = Command::new("cat");
    cat.arg("/proc/self/uid_map").stdin(Stdio::null());
    let out = run_mapped(&mapper, cat).map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "reading the uid map inside the namespace: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).split_whitespace().collect::<Vec<_>>().join(" "))
}

/// The subordinate ranges and the setuid tools that map them.
fn subids(user: Option<&User>) -> Check {
    let Some(user) = user else {
        return Check::ok("subids", "root: not needed (the helper writes id maps itself)");
    };
    let (uids, gids) = subordinate_ranges();
    let mut missing = Vec::new();
    for (file, entries) in [("/etc/subuid", &uids), ("/etc/subgid", &gids)] {
        if subid::find(entries, user).is_none() {
            missing.push(format!("no range of 65536 ids for {} in {file}", user.name));
        }
    }
    let tools_missing = ["newuidmap", "newgidmap"].into_iter().filter(|t| find_in_path(t).is_none()).count() > 0;
    if tools_missing {
        missing.push("newuidmap/newgidmap not on PATH".to_string());
    }
    if !missing.is_empty() {
        let fix =
            if tools_missing { format!("sudo apt-get install uidmap; {}", user.setup_fix()) } else { user.setup_fix() };
        return Check::fail("subids", missing.join("; "), fix);
    }
    let range = subid::find(&uids, user).map(|e| format!("{}-{}", e.start, e.start + e.count - 1)).unwrap_or_default();
    Check::ok("subids", format!("{} has subordinate ids {range}; newuidmap and newgidmap installed", user.name))
}

/// Limits as the helper would get them: a group made in this user's
/// delegated subtree (root: anywhere) with a process moved into it.
fn cgroups() -> Check {
    match cgroup::probe() {
        Ok(layout) => Check::ok(
            "cgroups",
            format!(
                "{}: made a group under {} and moved a process into it; memory, cpu and pids limits enforced",
                layout.capability(),
                layout.parent().display()
            ),
        ),
        Err(e) => Check::warn(
            "cgroups",
            format!("limits not enforced: {} (sandboxes run without cpu, memory and pids limits)", e.reason),
            e.fix,
        ),
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

fn overlayfs(user: Option<&User>) -> Check {
    let listed = std::fs::read_to_string("/proc/filesystems")
        .map(|s| s.lines().any(|l| l.split_whitespace().last() == Some("overlay")))
        .unwrap_or(false);
    let release = nix::sys::utsname::uname().map(|u| u.release().to_string_lossy().into_owned()).unwrap_or_default();
    if !listed && !Path::new(&format!("/lib/modules/{release}/kernel/fs/overlayfs")).exists() {
        return Check::fail(
            "overlayfs",
            "not in /proc/filesystems and no module",
            "use a kernel with CONFIG_OVERLAY_FS",
        );
    }
    let how = if user.is_some() { "in a user + mount namespace (userxattr)" } else { "in a mount namespace" };
    match overlay_probe(user) {
        Ok(()) => Check::ok("overlayfs", format!("mounted an overlay {how}")),
        Err(e) if !listed => {
            Check::warn("overlayfs", format!("module not loaded and a mount {how} failed: {e}"), "modprobe overlay")
        }
        Err(e) => Check::fail(
            "overlayfs",
            format!("mounting an overlay {how} failed: {e}"),
            "use a kernel that allows overlayfs in user namespaces (Linux 5.11+)",
        ),
    }
}

/// Mounts an overlay as a sandbox's root is mounted, in a child with a
/// mount namespace of its own (an ordinary user's: inside a user namespace
/// mapping root to itself, where overlayfs needs `userxattr`); the mount
/// dies with the child.
fn overlay_probe(user: Option<&User>) -> Result<(), String> {
    use std::ffi::CString;
    let dir = std::env::temp_dir().join(format!("sandbox-mcp-doctor-{}", std::process::id()));
    let sub = ["lower", "upper", "work", "merged"].map(|d| dir.join(d));
    let made = sub.iter().try_for_each(std::fs::create_dir_all).map_err(|e| format!("{}: {e}", dir.display()));
    let c = |s: String| CString::new(s).map_err(|e| e.to_string());
    let result = made.and_then(|()| {
        let [lower, upper, work, merged] = sub.each_ref().map(|p| p.display().to_string());
        let userxattr = if user.is_some() { ",userxattr" } else { "" };
        let options = c(format!("lowerdir={lower},upperdir={upper},workdir={work}{userxattr}"))?;
        let merged = c(merged)?;
        // Written by the child into its own maps: root inside is this user.
        let maps = user.map(|u| (format!("0 {} 1", u.uid), format!("0 {} 1", u.gid)));
        let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("/bin/true"));
        let mut cmd = Command::new(exe);
        cmd.arg("--version").stdout(Stdio::null()).stderr(Stdio::null());
        // SAFETY: only syscalls on buffers made before the fork run in the
        // child (open, write, close, unshare, mount), all async-signal-safe.
        unsafe {
            cmd.pre_exec(move || {
                let fail = || Err(std::io::Error::last_os_error());
                let flags = if maps.is_some() { libc::CLONE_NEWUSER | libc::CLONE_NEWNS } else { libc::CLONE_NEWNS };
                if libc::unshare(flags) != 0 {
                    return fail();
                }
                if let Some((uid_map, gid_map)) = &maps {
                    for (file, text) in [
                        (c"/proc/self/setgroups", "deny"),
                        (c"/proc/self/uid_map", uid_map.as_str()),
                        (c"/proc/self/gid_map", gid_map.as_str()),
                    ] {
                        let fd = libc::open(file.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                        let wrote = fd >= 0 && libc::write(fd, text.as_ptr().cast(), text.len()) == text.len() as isize;
                        libc::close(fd);
                        if !wrote {
                            return fail();
                        }
                    }
                }
                let private = libc::MS_REC | libc::MS_PRIVATE;
                if libc::mount(std::ptr::null(), c"/".as_ptr(), std::ptr::null(), private, std::ptr::null()) != 0
                    || libc::mount(
                        c"overlay".as_ptr(),
                        merged.as_ptr(),
                        c"overlay".as_ptr(),
                        0,
                        options.as_ptr().cast(),
                    ) != 0
                {
                    return fail();
                }
                Ok(())
            });
        }
        match cmd.status() {
            Ok(s) if s.success() => Ok(()),
            Ok(s) => Err(format!("probe exited with {s}")),
            Err(e) => Err(e.to_string()),
        }
    });
    // overlayfs leaves `work/work` mode 0, which stops an ordinary user's removal.
    use std::os::unix::fs::PermissionsExt as _;
    let _ = std::fs::set_permissions(sub[2].join("work"), std::fs::Permissions::from_mode(0o700));
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn kvm_check(user: Option<&User>) -> Check {
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
        kvm::KvmProbe::Unusable(why) if why.contains("Permission denied") => Check::warn(
            "kvm",
            format!("/dev/kvm present but this user cannot open it: {why} ({NOTE})"),
            match user {
                Some(u) => format!("sudo usermod -aG kvm {}, then log in again", u.name),
                None => "check the mode of /dev/kvm".to_string(),
            },
        ),
        kvm::KvmProbe::Unusable(why) => Check::warn(
            "kvm",
            format!("/dev/kvm present but no guest runs: {why} ({NOTE})"),
            "enable nested virtualization or run on bare metal",
        ),
    }
}

/// What EGRESS sandboxes need: the current user can open /dev/net/tun and
/// create a tun inside a new user + network namespace, as the launcher does.
/// Probed in a child (re-exec of this binary) that really does it.
fn tun(user: Option<&User>) -> Check {
    let fix = match user {
        Some(u) => {
            format!("{} (makes /dev/net/tun mode 0666; sandboxes keep network='none' until then)", u.setup_fix())
        }
        None => "load the tun module (modprobe tun) (sandboxes keep network='none' until then)".to_string(),
    };
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("/bin/true"));
    let mut cmd = Command::new(exe);
    cmd.arg("--version").stdout(Stdio::null()).stderr(Stdio::null());
    // SAFETY: unshare, open and ioctl are async-signal-safe, and the request
    // is built without allocating; nothing touches state shared with the
    // parent. They run in the forked child before exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::unshare(libc::CLONE_NEWUSER) != 0 || libc::unshare(libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let req = sandbox_helper::driver::network::eth0_tun_request();
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

/// Ubuntu 23.10+ restricts unprivileged user namespaces to programs whose
/// AppArmor profile allows them; `host-setup` installs one for the helper.
fn apparmor(user: Option<&User>, helper_bin: &Path) -> Check {
    use hostsetup::apparmor::{SYSCTL, profile_name, render};
    let Some(user) = user else {
        return Check::ok("apparmor", "root: user namespaces are not restricted for root");
    };
    match std::fs::read_to_string(SYSCTL).as_deref().map(str::trim) {
        Err(_) => Check::ok("apparmor", format!("no {SYSCTL}: user namespaces are not restricted")),
        Ok("0") => Check::ok("apparmor", "kernel.apparmor_restrict_unprivileged_userns=0: not restricted"),
        Ok(_) => {
            let name = profile_name(&user.name);
            let file = Path::new("/etc/apparmor.d").join(&name);
            let helper = helper_bin.canonicalize().unwrap_or_else(|_| helper_bin.to_path_buf());
            let fix = format!("sudo sandbox-mcp host-setup --user {} --helper {}", user.name, helper.display());
            match std::fs::read_to_string(&file) {
                Ok(text) if text == render(&name, &helper) => Check::ok(
                    "apparmor",
                    format!("user namespaces restricted; {} allows them for {}", file.display(), helper.display()),
                ),
                Ok(_) => Check::fail(
                    "apparmor",
                    format!(
                        "user namespaces restricted and {} is for another path than {}",
                        file.display(),
                        helper.display()
                    ),
                    fix,
                ),
                Err(_) => Check::fail(
                    "apparmor",
                    format!("kernel.apparmor_restrict_unprivileged_userns=1 and no helper profile {}", file.display()),
                    fix,
                ),
            }
        }
    }
}
