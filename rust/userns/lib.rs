//! User-namespace id maps, chosen once per helper the way rootless Podman
//! chooses them, and how they are installed.
//!
//! - An ordinary user: root in the sandbox is the user (`0 -> uid`, one id),
//!   so files the sandbox's root writes in a shared directory belong to the
//!   user on the host; ids `1..=N` come from the user's subordinate range in
//!   /etc/subuid and /etc/subgid (N at most 65535). newuidmap/newgidmap
//!   (package uidmap) install it, vouching for the range. Two helpers of the
//!   same user share that range, as two Podman instances of one user do;
//!   two users never share ids, because their ranges are distinct.
//! - root: `0..65536 -> BASE`, BASE being root's own /etc/subuid range if it
//!   has one, else 1000000000 unless a listed range overlaps it, else the
//!   first 65536-aligned range above every listed range, so root's sandboxes
//!   never share host ids with a user's. 1000000000 lies above what `useradd`
//!   hands out (login.defs' SUB_UID_MAX, 600100000): adding users never moves
//!   root's range, which would make every image root built stale.
//!   root writes /proc/PID/{uid,gid}_map itself.
//!
//! Images are extracted through the same map ([`run_mapped`]), so the ids
//! their files carry on the host are exactly the ones the sandbox maps.
#[cfg(linux_host)]
use std::io::{Read as _, Write as _};
#[cfg(linux_host)]
use std::os::fd::{AsRawFd as _, OwnedFd};
#[cfg(linux_host)]
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
#[cfg(linux_host)]
use std::process::Command;

use sandbox_base::error::SysError;
use serde::{Deserialize, Serialize};

#[cfg(linux_host)]
use crate::subid::{Entry, parse as parse_ranges};

pub mod subid;

/// Why an id map could not be installed or a mapped process run.
#[derive(Debug, thiserror::Error)]
pub enum UserNsError {
    /// A system call or I/O failed.
    #[error(transparent)]
    Sys(#[from] SysError),
    /// The map itself could not be written or is not allowed.
    #[error("user namespace: {0}")]
    Map(String),
}

impl UserNsError {
    /// An I/O error with context.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        SysError::io(what, source).into()
    }
}

/// A directory made for the VM that belongs to other host ids than the
/// helper's own: what an ordinary user's helper (the VM's root, not root of
/// the host) can only hand over from inside the VM's id map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandOver {
    /// The directory.
    pub path: PathBuf,
    /// The host uid it must get.
    pub uid: u32,
    /// The host gid it must get.
    pub gid: u32,
}

/// Where the subordinate ranges are listed.
#[cfg(linux_host)]
const SUBUID: &str = "/etc/subuid";
#[cfg(linux_host)]
const SUBGID: &str = "/etc/subgid";
/// Ids a sandbox maps when the helper is root: a full 16-bit range, so
/// `nobody` (65534) still maps.
#[cfg(linux_host)]
const ROOT_ID_COUNT: u32 = 65_536;
/// The base root's sandboxes use unless a listed range is there.
#[cfg(linux_host)]
const ROOT_DEFAULT_BASE: u32 = 1_000_000_000;
/// The most subordinate ids a rootless sandbox maps (inside 1..=65535).
#[cfg(linux_host)]
const MAX_SUB_IDS: u32 = 65_535;
/// What an unprivileged user runs (as root) to get ranges and newuidmap.
#[cfg(linux_host)]
const FIX: &str = "run `sandbox-mcp host-setup --user";

/// One contiguous run of ids: `inside..inside+count` in the namespace are
/// `outside..outside+count` on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdExtent {
    /// First id in the namespace.
    pub inside: u32,
    /// First id on the host.
    pub outside: u32,
    /// Number of ids.
    pub count: u32,
}

/// A user namespace's uid and gid maps.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdMap {
    /// The uid map, one line of /proc/PID/uid_map per extent.
    pub uids: Vec<IdExtent>,
    /// The gid map.
    pub gids: Vec<IdExtent>,
}

impl IdMap {
    /// `0..count -> base..` for uids and gids alike (how images built before
    /// maps were recorded describe themselves).
    pub fn shifted(base: u32, count: u32) -> Self {
        let e = vec![IdExtent { inside: 0, outside: base, count }];
        IdMap { uids: e.clone(), gids: e }
    }

    /// The map of a helper running as the current user.
    #[cfg(linux_host)]
    pub fn for_current_user() -> Result<Self, String> {
        let uid = nix::unistd::geteuid();
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let user = User { uid: uid.as_raw(), gid: nix::unistd::getegid().as_raw(), name: user_name() };
        IdMap::for_user(&user, &read(SUBUID), &read(SUBGID))
    }

    /// The map of `user`'s helper, given the contents of /etc/subuid and
    /// /etc/subgid.
    #[cfg(linux_host)]
    fn for_user(user: &User, subuid: &str, subgid: &str) -> Result<Self, String> {
        if user.uid == 0 {
            return Ok(IdMap { uids: root_map(&parse_ranges(subuid)), gids: root_map(&parse_ranges(subgid)) });
        }
        let name = &user.name;
        let range = |content: &str, file: &str| {
            own_range(&parse_ranges(content), name, user.uid).ok_or_else(|| {
                format!(
                    "user {name:?} has no subordinate id range in {file}, which a sandbox needs for ids other than \
                     root: {FIX} {name}` as root (it adds ranges to /etc/subuid and /etc/subgid)"
                )
            })
        };
        Ok(IdMap {
            uids: rootless_map(user.uid, range(subuid, SUBUID)?),
            gids: rootless_map(user.gid, range(subgid, SUBGID)?),
        })
    }

    /// The host uid and gid of root inside.
    pub fn host_root(&self) -> (u32, u32) {
        (host_id(&self.uids, 0).unwrap_or(u32::MAX), host_id(&self.gids, 0).unwrap_or(u32::MAX))
    }

    /// A readable form for messages: `uids 0->1001 (1), 1->100000 (65535); gids …`.
    pub fn describe(&self) -> String {
        let list = |m: &[IdExtent]| {
            m.iter().map(|e| format!("{}->{} ({})", e.inside, e.outside, e.count)).collect::<Vec<_>>().join(", ")
        };
        format!("uids {}; gids {}", list(&self.uids), list(&self.gids))
    }
}

/// Who a helper runs as.
#[cfg(linux_host)]
struct User {
    uid: u32,
    gid: u32,
    name: String,
}

/// The current user's login name ("" if it has none).
#[cfg(linux_host)]
fn user_name() -> String {
    nix::unistd::User::from_uid(nix::unistd::geteuid()).ok().flatten().map(|u| u.name).unwrap_or_default()
}

fn host_id(map: &[IdExtent], inside: u32) -> Option<u32> {
    map.iter().find(|e| inside >= e.inside && inside - e.inside < e.count).map(|e| e.outside + (inside - e.inside))
}

/// The first entry for the user (by name or uid): the one newuidmap and
/// mmdebstrap use too. An empty range counts as none.
#[cfg(linux_host)]
fn own_range(ranges: &[Entry], name: &str, uid: u32) -> Option<(u32, u32)> {
    let uid = uid.to_string();
    let entry = ranges.iter().find(|r| (r.owner == name || r.owner == uid) && r.count > 0)?;
    Some((u32::try_from(entry.start).ok()?, u32::try_from(entry.count).ok()?))
}

#[cfg(linux_host)]
fn rootless_map(own: u32, (start, count): (u32, u32)) -> Vec<IdExtent> {
    vec![
        IdExtent { inside: 0, outside: own, count: 1 },
        IdExtent { inside: 1, outside: start, count: count.min(MAX_SUB_IDS) },
    ]
}

/// root's map: its own range, else [`ROOT_DEFAULT_BASE`] if free, else above every range.
#[cfg(linux_host)]
fn root_map(ranges: &[Entry]) -> Vec<IdExtent> {
    if let Some((start, count)) = own_range(ranges, "root", 0) {
        return vec![IdExtent { inside: 0, outside: start, count: count.min(ROOT_ID_COUNT) }];
    }
    let default_end = u64::from(ROOT_DEFAULT_BASE) + u64::from(ROOT_ID_COUNT);
    let end = |r: &Entry| r.start.saturating_add(r.count);
    let overlaps = ranges.iter().any(|r| r.start < default_end && end(r) > u64::from(ROOT_DEFAULT_BASE));
    let base = if overlaps {
        let top = ranges.iter().map(end).max().unwrap_or(0);
        let aligned = top.div_ceil(u64::from(ROOT_ID_COUNT)) * u64::from(ROOT_ID_COUNT);
        // Host ids are 32 bits with u32::MAX invalid; a table reaching that
        // high is broken, and the default is the least surprising fallback.
        u32::try_from(aligned).ok().filter(|b| b.checked_add(ROOT_ID_COUNT).is_some()).unwrap_or(ROOT_DEFAULT_BASE)
    } else {
        ROOT_DEFAULT_BASE
    };
    vec![IdExtent { inside: 0, outside: base, count: ROOT_ID_COUNT }]
}

/// How this helper installs its map into a new user namespace.
#[derive(Debug, Clone)]
pub struct IdMapper {
    map: IdMap,
    /// newuidmap and newgidmap; `None` when we are root and write the map
    /// files ourselves.
    #[cfg(linux_host)]
    tools: Option<(PathBuf, PathBuf)>,
}

impl IdMapper {
    /// The map for the current user and the way to install it, or why
    /// sandboxes cannot get a user namespace as this user.
    #[cfg(linux_host)]
    pub fn detect() -> Result<Self, String> {
        let map = IdMap::for_current_user()?;
        if nix::unistd::geteuid().is_root() {
            return Ok(IdMapper { map, tools: None });
        }
        IdMapper::with_tools(map, find_in_path("newuidmap"), find_in_path("newgidmap"), &user_name())
    }

    /// User namespaces are Linux's: elsewhere (a Mac's VMs) images are
    /// not unpacked through a map, and the VMs' ids are their own kernel's.
    #[cfg(not(linux_host))]
    pub fn detect() -> Result<Self, String> {
        Err("id maps need Linux user namespaces: images are built on Linux".into())
    }

    /// An ordinary user's mapper, given where newuidmap and newgidmap are.
    #[cfg(linux_host)]
    fn with_tools(
        map: IdMap,
        newuidmap: Option<PathBuf>,
        newgidmap: Option<PathBuf>,
        name: &str,
    ) -> Result<Self, String> {
        match (newuidmap, newgidmap) {
            (Some(u), Some(g)) => Ok(IdMapper { map, tools: Some((u, g)) }),
            _ => Err(format!(
                "cannot map user ids: the helper is not root and newuidmap/newgidmap are missing: install the \
                 uidmap package or {FIX} {name}` as root"
            )),
        }
    }

    /// The map this helper gives every sandbox.
    pub fn id_map(&self) -> &IdMap {
        &self.map
    }

    /// Installs the map into the user namespace of `pid`, which must have
    /// unshared it and not yet changed its ids.
    #[cfg(linux_host)]
    pub fn map(&self, pid: i32) -> Result<(), UserNsError> {
        let tables = [("uid_map", &self.map.uids), ("gid_map", &self.map.gids)];
        match &self.tools {
            None => {
                for (file, extents) in tables {
                    let text: String =
                        extents.iter().map(|e| format!("{} {} {}\n", e.inside, e.outside, e.count)).collect();
                    let path = format!("/proc/{pid}/{file}");
                    std::fs::write(&path, text).map_err(|e| UserNsError::Map(format!("write {path}: {e}")))?;
                }
                Ok(())
            }
            Some((newuidmap, newgidmap)) => {
                for ((_, extents), tool) in tables.into_iter().zip([newuidmap, newgidmap]) {
                    let mut args = vec![pid.to_string()];
                    for e in extents {
                        args.extend([e.inside.to_string(), e.outside.to_string(), e.count.to_string()]);
                    }
                    let out = Command::new(tool)
                        .args(&args)
                        .output()
                        .map_err(|e| UserNsError::Map(format!("run {}: {e}", tool.display())))?;
                    if !out.status.success() {
                        return Err(UserNsError::Map(format!(
                            "{} {} failed ({}): {}; /etc/subuid and /etc/subgid must list the range for this user \
                             ({FIX} NAME` as root)",
                            tool.display(),
                            args.join(" "),
                            out.status,
                            String::from_utf8_lossy(&out.stderr).trim()
                        )));
                    }
                }
                Ok(())
            }
        }
    }
}

/// Keeps `files` open across `cmd`'s exec and returns their paths there
/// (`/proc/self/fd/N`): dirs and files a mapped namespace's root reaches by
/// their own permissions, where their paths pass through dirs it cannot
/// (the helper's 0700 state dir, a store under Debian's 0700 `/root`).
#[cfg(linux_host)]
pub fn pass_fds(cmd: &mut Command, files: &[&std::fs::File]) -> Vec<String> {
    let fds: Vec<i32> = files.iter().map(|f| f.as_raw_fd()).collect();
    let paths = fds.iter().map(|fd| format!("/proc/self/fd/{fd}")).collect();
    // SAFETY: fcntl on fds the caller keeps open, between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            for &fd in &fds {
                if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    paths
}

/// Runs `cmd` as root (0:0, no supplementary groups) of a new user namespace
/// carrying `mapper`'s map, and waits for it. This is how files get exactly
/// the host ids a sandbox maps without chowning by host id, and how an
/// ordinary user reaches files its sandboxes' other ids own.
#[cfg(linux_host)]
pub fn run_mapped(mapper: &IdMapper, mut cmd: Command) -> Result<std::process::Output, UserNsError> {
    let pipe = || nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|source| sys("pipe", source));
    let (pid_r, pid_w) = pipe()?;
    let (go_r, go_w) = pipe()?;
    let (pid_wfd, go_rfd) = (pid_w.as_raw_fd(), go_r.as_raw_fd());
    let (pid_rfd, go_wfd) = (pid_r.as_raw_fd(), go_w.as_raw_fd());
    // SAFETY: between fork and exec only async-signal-safe system calls on
    // fds and integers: close, unshare, getpid, write, read, setresgid,
    // setgroups, setresuid.
    unsafe {
        cmd.pre_exec(move || {
            // Our copy of the parent's ends: the go pipe must read as end of
            // file once the parent gives up on mapping us.
            libc::close(pid_rfd);
            libc::close(go_wfd);
            let fail = || Err(std::io::Error::last_os_error());
            if libc::unshare(libc::CLONE_NEWUSER) != 0 {
                return fail();
            }
            let pid = libc::getpid().to_ne_bytes();
            if libc::write(pid_wfd, pid.as_ptr().cast(), pid.len()) != pid.len() as isize {
                return fail();
            }
            let mut go = [0u8; 1];
            if libc::read(go_rfd, go.as_mut_ptr().cast(), 1) != 1 {
                return Err(std::io::Error::other("the id map was not installed"));
            }
            if libc::setresgid(0, 0, 0) != 0
                || libc::setgroups(0, std::ptr::null()) != 0
                || libc::setresuid(0, 0, 0) != 0
            {
                return fail();
            }
            Ok(())
        });
    }
    // spawn() returns only after exec, which waits for our map: it runs on
    // its own thread, and only that thread holds the write end of the pid
    // pipe, so a child that dies early shows up here as end of file.
    let spawner = std::thread::spawn(move || {
        let child = cmd.output();
        drop(pid_w);
        drop(go_r);
        child
    });
    let mut pid = [0u8; 4];
    let got_pid = std::fs::File::from(pid_r).read_exact(&mut pid);
    let mapped = match got_pid {
        Ok(()) => mapper.map(i32::from_ne_bytes(pid)),
        Err(e) => Err(UserNsError::io("learn the pid of the mapped child", e)),
    };
    let mut go = std::fs::File::from(go_w);
    let released = match &mapped {
        Ok(()) => go.write_all(b"g").map_err(|e| UserNsError::io("release the mapped child", e)),
        Err(_) => Ok(()),
    };
    drop(go);
    let output = spawner.join().map_err(|_| UserNsError::Map("the spawning thread panicked".into()))?;
    mapped?;
    released?;
    output.map_err(|e| UserNsError::io("run a command in a mapped user namespace", e))
}

/// Runs `cmd` as root (0:0, no supplementary groups) of the existing user
/// namespace `userns` (a VM's), and waits for it: it then has the rights of
/// the VM's root over the VM's files, which an ordinary user's helper lacks
/// outside the namespace. Only a single-threaded process may join a user
/// namespace: the forked child does, before exec.
#[cfg(linux_host)]
pub fn run_joined(userns: &OwnedFd, mut cmd: Command) -> Result<std::process::Output, UserNsError> {
    let fd = userns.as_raw_fd();
    // SAFETY: between fork and exec only async-signal-safe system calls on
    // an fd and integers.
    unsafe {
        cmd.pre_exec(move || {
            // Dies with the helper: a copy left running after its helper was
            // killed would keep its half-copied layer alive (the new helper
            // spares a `.tmp-*` layer while a process is writing it).
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0
                || libc::setns(fd, libc::CLONE_NEWUSER) != 0
                || libc::setresgid(0, 0, 0) != 0
                || libc::setgroups(0, std::ptr::null()) != 0
                || libc::setresuid(0, 0, 0) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.output().map_err(|e| UserNsError::io("run a command in the vm's user namespace", e))
}

/// Gives each directory of `dirs` its host owner, from inside a namespace
/// with `mapper`'s map: how an ordinary user's helper, which is only the
/// sandboxes' root, hands a directory to another of their ids.
#[cfg(linux_host)]
pub fn chown_mapped(mapper: &IdMapper, dirs: &[HandOver]) -> Result<(), UserNsError> {
    let map = mapper.id_map();
    for d in dirs {
        let (Some(uid), Some(gid)) = (inside_id(&map.uids, d.uid), inside_id(&map.gids, d.gid)) else {
            return Err(UserNsError::Map(format!(
                "{} should belong to host ids {}:{}, which this helper's map ({}) does not reach",
                d.path.display(),
                d.uid,
                d.gid,
                map.describe()
            )));
        };
        let mut chown = Command::new("chown");
        chown.arg("--no-dereference").arg(format!("{uid}:{gid}")).arg("--").arg(&d.path);
        chown.stdin(std::process::Stdio::null());
        let out = run_mapped(mapper, chown)?;
        if !out.status.success() {
            return Err(UserNsError::Map(format!(
                "chown {uid}:{gid} {} inside the sandbox's id map: {}: {}",
                d.path.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
    }
    Ok(())
}

/// The id inside a namespace that host id `host` is, if the map reaches it.
#[cfg(linux_host)]
fn inside_id(map: &[IdExtent], host: u32) -> Option<u32> {
    map.iter().find(|e| host >= e.outside && host - e.outside < e.count).map(|e| e.inside + (host - e.outside))
}

/// Removes the tree at `path` (a symlink itself, never its target). An
/// ordinary user cannot remove what its sandboxes' other ids own (apt's
/// `_apt` dirs, say): that part is retried as root of a namespace with this
/// user's map, which owns those ids.
pub fn remove_tree(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        #[cfg(linux_host)]
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied && !nix::unistd::geteuid().is_root() => {
            let Ok(mapper) = IdMapper::detect() else { return Err(e) };
            let mut rm = Command::new("rm");
            rm.args(["-rf", "--one-file-system", "--"]).arg(path).stdin(std::process::Stdio::null());
            let out = run_mapped(&mapper, rm).map_err(std::io::Error::other)?;
            if out.status.success() {
                return Ok(());
            }
            Err(std::io::Error::other(format!("rm {}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim())))
        }
        other => other,
    }
}

#[cfg(linux_host)]
fn sys(what: &str, source: nix::errno::Errno) -> UserNsError {
    SysError::sys(what, source).into()
}

/// First executable called `name` on PATH.
pub fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin".into());
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| {
        use std::os::unix::fs::PermissionsExt as _;
        p.metadata().map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0).unwrap_or(false)
    })
}

#[cfg(all(test, linux_host))]
mod tests {
    use super::*;

    fn ext(inside: u32, outside: u32, count: u32) -> IdExtent {
        IdExtent { inside, outside, count }
    }

    #[test]
    fn subid_entries_by_name_or_uid_first_wins() {
        let r = parse_ranges("# comment\nalice:200000:65536\n1001:300000:1000\nalice:900000:5\nbad:x:1\nz:5:0\n");
        assert_eq!(own_range(&r, "alice", 1000), Some((200_000, 65_536)));
        assert_eq!(own_range(&r, "bob", 1001), Some((300_000, 1000)));
        assert_eq!(own_range(&r, "carol", 1002), None);
        assert_eq!(own_range(&r, "z", 1003), None, "an empty range is none");
        assert!(!r.iter().any(|e| e.owner == "bad"), "malformed entries are ignored");
    }

    #[test]
    fn rootless_maps_root_to_the_user_and_the_rest_to_its_range() {
        assert_eq!(rootless_map(1001, (100_000, 65_536)), [ext(0, 1001, 1), ext(1, 100_000, 65_535)]);
        assert_eq!(rootless_map(1001, (300_000, 1000)), [ext(0, 1001, 1), ext(1, 300_000, 1000)]);
    }

    #[test]
    fn root_uses_its_own_range_first() {
        let r = parse_ranges("alice:100000:65536\nroot:500000:70000\n");
        assert_eq!(root_map(&r), [ext(0, 500_000, 65_536)]);
        let r = parse_ranges("0:400000:65536\n");
        assert_eq!(root_map(&r), [ext(0, 400_000, 65_536)]);
    }

    #[test]
    fn root_keeps_its_default_range_unless_a_listed_range_overlaps_it() {
        let base = 1_000_000_000;
        assert_eq!(root_map(&[]), [ext(0, base, 65_536)]);
        // useradd's users (from 100000 up) never move root's range.
        let users = parse_ranges("alice:100000:65536\nbob:165536:65536\nc:600000000:65536\n");
        assert_eq!(root_map(&users), [ext(0, base, 65_536)]);
        // A range over the default: root moves above every listed range, aligned.
        let r = parse_ranges("alice:100000:65536\nx:1000000005:10\n");
        assert_eq!(root_map(&r), [ext(0, 1_000_013_824, 65_536)]);
        // A range merely touching either end does not overlap.
        let touching = parse_ranges("a:999934464:65536\nb:1000065536:9\n");
        assert_eq!(root_map(&touching), [ext(0, base, 65_536)]);
    }

    #[test]
    fn run_mapped_runs_as_root_of_the_map_and_its_files_get_the_mapped_ids() {
        let mapper = IdMapper::detect().expect("an id map for the test user");
        let dir = std::env::temp_dir().join(format!("smcp-userns-{}", std::process::id()));
        std::fs::create_dir(&dir).unwrap();
        let (uid, gid) = mapper.id_map().host_root();
        std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).unwrap();
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "id -u; id -g; touch \"$0/root\"; touch \"$0/other\" && chown 42:42 \"$0/other\""]).arg(&dir);
        let out = run_mapped(&mapper, cmd).unwrap();
        let owner = |name: &str| {
            use std::os::unix::fs::MetadataExt as _;
            let m = std::fs::metadata(dir.join(name)).unwrap();
            (m.uid(), m.gid())
        };
        let (root, other) = (owner("root"), owner("other"));
        remove_tree(&dir).unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "0\n0\n", "{}", String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success());
        assert_eq!(root, (uid, gid));
        let map = mapper.id_map();
        assert_eq!(other, (host_id(&map.uids, 42).unwrap(), host_id(&map.gids, 42).unwrap()));
    }

    #[test]
    fn a_user_gets_its_own_ranges_for_uids_and_gids() {
        let alice = User { uid: 1001, gid: 1005, name: "alice".into() };
        let map = IdMap::for_user(&alice, "bob:100000:65536\nalice:165536:65536\n", "1001:300000:70000\n").unwrap();
        assert_eq!(map.uids, [ext(0, 1001, 1), ext(1, 165_536, 65_535)]);
        assert_eq!(map.gids, [ext(0, 1005, 1), ext(1, 300_000, 65_535)]);
        let root = User { uid: 0, gid: 0, name: "root".into() };
        assert_eq!(IdMap::for_user(&root, "", "").unwrap(), IdMap::shifted(1_000_000_000, 65_536));
    }

    #[test]
    fn a_user_without_a_range_is_told_to_run_host_setup() {
        let carol = User { uid: 1002, gid: 1002, name: "carol".into() };
        let err = IdMap::for_user(&carol, "alice:100000:65536\n", "carol:100000:65536\n").unwrap_err();
        assert!(err.contains("no subordinate id range in /etc/subuid"), "{err}");
        assert!(err.contains("run `sandbox-mcp host-setup --user carol` as root"), "{err}");
        let err = IdMap::for_user(&carol, "carol:100000:65536\n", "").unwrap_err();
        assert!(err.contains("/etc/subgid"), "{err}");
    }

    #[test]
    fn a_user_without_newuidmap_is_told_what_to_install() {
        let map = IdMap::shifted(1, 1);
        let err = IdMapper::with_tools(map.clone(), None, Some("/usr/bin/newgidmap".into()), "dave").unwrap_err();
        assert!(err.contains("install the uidmap package or run `sandbox-mcp host-setup --user dave`"), "{err}");
        assert!(IdMapper::with_tools(map, Some("/a".into()), Some("/b".into()), "dave").is_ok());
    }

    #[test]
    fn a_refused_map_stops_the_child_before_it_runs() {
        // newuidmap failing (no range for the user, say): the command must never run unmapped.
        let map = IdMapper::detect().expect("an id map for the test user").map;
        let mapper = IdMapper { map, tools: Some(("/bin/false".into(), "/bin/false".into())) };
        let marker = std::env::temp_dir().join(format!("smcp-unmapped-{}", std::process::id()));
        let mut touch = Command::new("touch");
        touch.arg(&marker);
        let err = run_mapped(&mapper, touch).unwrap_err();
        assert!(err.to_string().contains("/etc/subuid and /etc/subgid must list the range"), "{err}");
        assert!(!marker.exists(), "the command ran without its map");
    }

    #[test]
    fn run_mapped_reports_a_program_that_cannot_start() {
        let mapper = IdMapper::detect().expect("an id map for the test user");
        let err = run_mapped(&mapper, Command::new("/nonexistent/program")).unwrap_err();
        assert!(err.to_string().contains("mapped user namespace"), "{err}");
    }

    #[test]
    fn chown_mapped_hands_over_and_names_what_it_cannot() {
        use std::os::unix::fs::MetadataExt as _;
        let mapper = IdMapper::detect().expect("an id map for the test user");
        let dir = std::env::temp_dir().join(format!("userns-chown-{}", std::process::id()));
        std::fs::create_dir(&dir).unwrap();
        // As a rootless helper's directories are: its root's (a root test
        // process's own ids are not in its map).
        let (root_uid, root_gid) = mapper.id_map().host_root();
        std::os::unix::fs::chown(&dir, Some(root_uid), Some(root_gid)).unwrap();
        let hand = |path: &Path, inside: u32| HandOver {
            path: path.to_path_buf(),
            uid: host_id(&mapper.id_map().uids, inside).unwrap(),
            gid: host_id(&mapper.id_map().gids, inside).unwrap(),
        };
        let to_42 = hand(&dir, 42);
        chown_mapped(&mapper, std::slice::from_ref(&to_42)).unwrap();
        let md = std::fs::metadata(&dir).unwrap();
        assert_eq!((md.uid(), md.gid()), (to_42.uid, to_42.gid));
        let unmapped = HandOver { uid: 7, gid: 7, ..to_42.clone() };
        let err = chown_mapped(&mapper, &[unmapped]).unwrap_err().to_string();
        assert!(err.contains("host ids 7:7") && err.contains("does not reach"), "{err}");
        let gone = hand(&dir.join("gone"), 42);
        let err = chown_mapped(&mapper, &[gone]).unwrap_err().to_string();
        assert!(err.contains("chown 42:42") && err.contains("inside the sandbox's id map"), "{err}");
        remove_tree(&dir).unwrap();
    }

    #[test]
    fn host_ids_convert_back_to_the_ids_inside() {
        let map = rootless_map(1001, (100_000, 65_536));
        assert_eq!(inside_id(&map, 1001), Some(0));
        assert_eq!(inside_id(&map, 100_041), Some(42));
        assert_eq!(inside_id(&map, 100_000 + 65_535), None, "65535 ids from the range, not 65536");
        assert_eq!(inside_id(&map, 5), None);
    }

    #[test]
    fn root_of_the_map_and_description() {
        let m = IdMap { uids: vec![ext(0, 1001, 1), ext(1, 100_000, 65_535)], gids: vec![ext(0, 1002, 1)] };
        assert_eq!(m.host_root(), (1001, 1002));
        assert_eq!(host_id(&m.uids, 42), Some(100_041));
        assert_eq!(host_id(&m.uids, 65_536), None);
        assert_eq!(m.describe(), "uids 0->1001 (1), 1->100000 (65535); gids 0->1002 (1)");
        assert_eq!(IdMap::shifted(100_000, 65_536).host_root(), (100_000, 100_000));
    }
}
