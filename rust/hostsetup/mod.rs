//! `sandbox-mcp host-setup`: what root does once so that an ordinary user's
//! sandboxes work: subordinate id ranges, a usable /dev/net/tun, a delegated
//! cgroup subtree and, where AppArmor restricts user namespaces, a profile
//! for the helper. Idempotent: each step prints one line, saying what it did
//! or that it was already done.
pub mod apparmor;
pub mod cgroup;
pub mod subid;
pub mod tun;

use std::path::{Path, PathBuf};

/// Why host-setup stopped.
#[derive(Debug, thiserror::Error)]
pub enum HostSetupError {
    /// Changing the host needs root.
    #[error("host-setup changes the host and must run as root: sudo sandbox-mcp host-setup --user {0}")]
    NotRoot(String),
    /// No user was named and sudo did not say who called it.
    #[error("no user to set up: pass --user NAME (or run it through sudo, which sets SUDO_USER)")]
    NoUser,
    /// The named user does not exist.
    #[error("no such user: {0}")]
    UnknownUser(String),
    /// Every subordinate id is taken.
    #[error("no free range of 65536 subordinate ids in /etc/subuid and /etc/subgid between 100000 and 600100000")]
    NoFreeRange,
    /// A file could not be read or written.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A tool (usermod, apparmor_parser) failed.
    #[error("{command} failed: {detail}")]
    Tool {
        /// The command line.
        command: String,
        /// Its exit status and stderr, or why it did not start.
        detail: String,
    },
}

impl HostSetupError {
    fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        HostSetupError::Io { what: what.into(), source }
    }
}

/// The user being set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// Login name.
    pub name: String,
    /// uid.
    pub uid: u32,
    /// Primary gid.
    pub gid: u32,
}

impl User {
    /// Looks `name` up in the passwd database.
    pub fn lookup(name: &str) -> Result<Self, HostSetupError> {
        match nix::unistd::User::from_name(name) {
            Ok(Some(u)) => Ok(User { name: u.name, uid: u.uid.as_raw(), gid: u.gid.as_raw() }),
            _ => Err(HostSetupError::UnknownUser(name.to_string())),
        }
    }

    /// The effective user of this process.
    pub fn current() -> Result<Self, HostSetupError> {
        let uid = nix::unistd::geteuid();
        match nix::unistd::User::from_uid(uid) {
            Ok(Some(u)) => Ok(User { name: u.name, uid: u.uid.as_raw(), gid: u.gid.as_raw() }),
            _ => Err(HostSetupError::UnknownUser(format!("uid {uid}"))),
        }
    }

    /// The command that sets this user up.
    pub fn setup_fix(&self) -> String {
        sandbox_helper::driver::cgroup::delegation_fix(&self.name)
    }
}

/// The outcome of one step: one output line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Changed the host.
    Did(String),
    /// Nothing to do.
    Done(String),
    /// `--dry-run`: what it would change.
    Would(String),
    /// Cannot be done here; sandboxes work with less.
    Missing(String),
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Did(s) => write!(f, "done     {s}"),
            Outcome::Done(s) => write!(f, "ok       {s}"),
            Outcome::Would(s) => write!(f, "would    {s}"),
            Outcome::Missing(s) => write!(f, "WARN     {s}"),
        }
    }
}

/// What to set up.
#[derive(Debug, Clone)]
pub struct Options {
    /// `--user`, else $SUDO_USER.
    pub user: Option<String>,
    /// The helper binary the AppArmor profile is for.
    pub helper: PathBuf,
    /// Print what would change, change nothing.
    pub dry_run: bool,
}

/// Runs every step, printing one line per outcome as it happens.
pub fn run(opts: &Options) -> Result<(), HostSetupError> {
    let name = opts
        .user
        .clone()
        .or_else(|| std::env::var("SUDO_USER").ok().filter(|u| !u.is_empty()))
        .ok_or(HostSetupError::NoUser)?;
    if !nix::unistd::geteuid().is_root() && !opts.dry_run {
        return Err(HostSetupError::NotRoot(name));
    }
    let user = User::lookup(&name)?;
    if user.uid == 0 {
        println!("{}", Outcome::Done("root needs no setup: its helper maps ids and makes cgroups itself".into()));
        return Ok(());
    }
    let print = |outcomes: Vec<Outcome>| outcomes.iter().for_each(|o| println!("{o}"));
    print(subid::ensure(&user, opts.dry_run)?);
    print(tun::ensure(opts.dry_run)?);
    print(cgroup::ensure(&user, opts.dry_run)?);
    print(apparmor::ensure(&user, &opts.helper, opts.dry_run)?);
    Ok(())
}

/// Writes `text` to `path` unless it already holds exactly that.
fn write_file(path: &Path, text: &str, dry_run: bool) -> Result<Outcome, HostSetupError> {
    if std::fs::read_to_string(path).is_ok_and(|t| t == text) {
        return Ok(Outcome::Done(format!("{}: up to date", path.display())));
    }
    if dry_run {
        return Ok(Outcome::Would(format!("write {}", path.display())));
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| HostSetupError::io(format!("create {}", dir.display()), e))?;
    }
    std::fs::write(path, text).map_err(|e| HostSetupError::io(format!("write {}", path.display()), e))?;
    Ok(Outcome::Did(format!("wrote {}", path.display())))
}

/// Runs a tool to completion; its stderr is the error when it fails.
fn run_tool(program: &str, args: &[&str]) -> Result<(), HostSetupError> {
    let command = std::iter::once(program).chain(args.iter().copied()).collect::<Vec<_>>().join(" ");
    match std::process::Command::new(program).args(args).output() {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(HostSetupError::Tool {
            command,
            detail: format!("{}: {}", o.status, String::from_utf8_lossy(&o.stderr).trim()),
        }),
        Err(e) => Err(HostSetupError::Tool { command, detail: e.to_string() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_file_writes_once_and_a_dry_run_writes_nothing() {
        let dir = std::env::temp_dir().join(format!("hostsetup-write-{}", std::process::id()));
        let file = dir.join("sub/rule");
        assert!(matches!(write_file(&file, "x\n", true).unwrap(), Outcome::Would(_)));
        assert!(!file.exists());
        assert!(matches!(write_file(&file, "x\n", false).unwrap(), Outcome::Did(_)));
        assert_eq!(write_file(&file, "x\n", false).unwrap(), Outcome::Done(format!("{}: up to date", file.display())));
        assert!(matches!(write_file(&file, "y\n", false).unwrap(), Outcome::Did(_)));
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "y\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_failing_tool_is_an_error_naming_the_command() {
        let e = run_tool("sh", &["-c", "echo no range >&2; exit 3"]).unwrap_err();
        assert_eq!(e.to_string(), "sh -c echo no range >&2; exit 3 failed: exit status: 3: no range");
        let e = run_tool("/nonexistent/usermod", &["--add-subuids"]).unwrap_err();
        assert!(e.to_string().starts_with("/nonexistent/usermod --add-subuids failed: No such file"), "{e}");
        run_tool("true", &[]).unwrap();
    }

    #[test]
    fn outcomes_print_as_one_aligned_line() {
        assert_eq!(Outcome::Did("a".into()).to_string(), "done     a");
        assert_eq!(Outcome::Done("b".into()).to_string(), "ok       b");
        assert_eq!(Outcome::Would("c".into()).to_string(), "would    c");
        assert_eq!(Outcome::Missing("d".into()).to_string(), "WARN     d");
    }
}
