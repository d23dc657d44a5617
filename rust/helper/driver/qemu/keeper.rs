//! qemu's keeper: the process a vm's qemu hangs from, which keeps it
//! through its helper's death as a namespace VM's launcher keeps PID 1
//! ([`crate::driver::keep`], issue 25).
//!
//! The helper runs itself as `__vm-keep` for every vm it starts (a
//! sandbox's, a template's, a pool's). The keeper starts qemu with itself
//! as qemu's parent-death target, sends the helper qemu's pid and pidfd
//! (`qemu:<pid>`, or `error:`/`missing:` and why not), then does what a
//! launcher does: watches its helper by pidfd, and when it dies waits
//! [`ADOPT_WAIT`] for a new one to take qemu's pidfd and the helper's end
//! of the network card, killing qemu if nobody comes. It exits with qemu's
//! status (128 + the signal, for a signal), told first to an adopter.
//!
//! What else a vm needs outlives its helper without help: qemu serves QMP
//! on its socket and reconnects the agent's port to whoever listens on the
//! agent socket next; virtiofsd serves until qemu closes its connection;
//! the network card is a datagram socket pair, so frames sent while no
//! helper reads wait whole, never torn ([`super::network`]). The keeper
//! hands an adopter no control socket: its helper has nothing to tell it.
use std::ffi::OsString;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};

use super::QemuError;
use crate::driver::DriverError;
use crate::driver::keep::{ADOPT_WAIT, Keeper, Keeps, bind_keeper, recv_message, report_exit, send_with_fds};
use crate::driver::network::pidfd_open;

/// The keeper's socket in a vm's run dir, where a new helper asks for it.
pub const KEEP_SOCKET: &str = "keep.sock";
/// How long the keeper has to report qemu started.
const START_WAIT: Duration = Duration::from_secs(30);

/// What `__vm-keep` is given: fds it inherited, by number, and qemu's
/// command line.
#[derive(Debug)]
pub struct KeepArgs {
    /// The keeper's end of its control socket (`qemu:` goes there).
    pub control: RawFd,
    /// The helper's end of the network card (EGRESS), handed to an adopter.
    pub link: Option<RawFd>,
    /// Fds qemu's command line names (its RAM, its end of the card): qemu
    /// inherits them; the keeper closes its copies.
    pub pass: Vec<RawFd>,
    /// The helper's pid (checked to be the keeper's parent).
    pub helper: i32,
    /// Where the keeper listens for a new helper.
    pub socket: PathBuf,
    /// qemu's arguments.
    pub qemu: Vec<OsString>,
}

/// The program run as the keeper: this binary, unless a test process
/// named the helper binary ([`use_program`]).
static PROGRAM: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Runs `program` (a helper binary) as the keeper instead of this process's
/// own binary: for a test process that drives the vm driver itself.
pub fn use_program(program: &Path) {
    let _ = PROGRAM.set(program.to_path_buf());
}

/// Entry point of `__vm-keep`; returns the exit code.
pub fn run(args: KeepArgs) -> i32 {
    // Nothing this process did not open itself reaches qemu but what it
    // names: another thread of the helper may have forked this process
    // while an fd of another vm was open without close-on-exec.
    // SAFETY: close_range with integer arguments; it only sets flags.
    unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, libc::CLOSE_RANGE_CLOEXEC) };
    // SAFETY: the helper left this fd open for us; nothing else here owns it.
    let control = unsafe { OwnedFd::from_raw_fd(args.control) };
    let socket = args.socket.clone();
    match keep(&control, args) {
        Ok(code) => code,
        Err(e) => {
            let word = if matches!(e, KeepError::Missing(_)) { "missing" } else { "error" };
            let _ = send_with_fds(&control, format!("{word}:{e}").as_bytes(), &[]);
            let _ = std::fs::remove_file(&socket);
            1
        }
    }
}

/// Why the keeper could not start qemu.
#[derive(Debug, thiserror::Error)]
enum KeepError {
    /// qemu is not installed.
    #[error("{0}")]
    Missing(String),
    /// Anything else.
    #[error("{0}")]
    Failed(String),
}

impl From<DriverError> for KeepError {
    fn from(e: DriverError) -> Self {
        KeepError::Failed(e.to_string())
    }
}

fn keep(control: &OwnedFd, args: KeepArgs) -> Result<i32, KeepError> {
    // SAFETY: inherited from the helper for us, as `control` was (and
    // close-on-exec since the start).
    let link = args.link.map(|fd| unsafe { OwnedFd::from_raw_fd(fd) });
    // Watched by pidfd from here; it must still be our parent, or it died
    // before the pidfd named it.
    let helper = pidfd_open(args.helper)?;
    if nix::unistd::getppid().as_raw() != args.helper {
        return Err(DriverError::InitFailed("the helper exited while the vm started".into()).into());
    }
    // Out of the helper's session: a terminal's Ctrl-C to a helper run by
    // hand is not for its vms.
    let _ = nix::unistd::setsid();
    let listener = bind_keeper(&args.socket)?;
    // This process is single-threaded: qemu's parent-death signal follows
    // the keeper itself.
    let mut child = super::command(&args.qemu, args.pass.clone()).spawn().map_err(|e| match super::spawn_error(e) {
        QemuError::NotInstalled(why) => KeepError::Missing(why),
        other => KeepError::Failed(other.to_string()),
    })?;
    for fd in args.pass {
        // SAFETY: inherited for qemu, which has its own copy now.
        drop(unsafe { OwnedFd::from_raw_fd(fd) });
    }
    let pid = child.id() as i32;
    // Our child, not yet reaped: the pid is qemu's.
    let qemu = pidfd_open(pid)?;
    send_with_fds(control, format!("qemu:{pid}").as_bytes(), &[qemu.as_raw_fd()])
        .map_err(|source| DriverError::sys("report qemu to the helper", source))?;
    let keeper = Keeper { listener, helper_end: None, link, keeps: Keeps::Qemu };
    let adopter = keeper.keep(nix::unistd::Pid::from_raw(pid), &qemu, Some(helper), ADOPT_WAIT);
    let status = child.wait().map_err(|e| DriverError::io("wait for qemu", e))?;
    let code = status.code().unwrap_or_else(|| 128 + std::os::unix::process::ExitStatusExt::signal(&status).unwrap_or(0));
    if let Some(adopter) = adopter {
        report_exit(&adopter, code);
    }
    let _ = std::fs::remove_file(&args.socket);
    Ok(code)
}

/// qemu started under its keeper.
pub struct Kept {
    /// The keeper, this helper's child: it exits with qemu's status.
    pub keeper: tokio::process::Child,
    /// qemu's pid.
    pub pid: u32,
    /// qemu's pidfd.
    pub pidfd: OwnedFd,
}

/// Starts qemu with `argv` under a keeper listening at `socket`, qemu's
/// stdio `log` for stderr. `pass`: the fds `argv` names, which must be
/// open here; `link`: the helper's end of the network card, kept for an
/// adopter.
pub async fn start(
    argv: Vec<OsString>,
    pass: &[RawFd],
    link: Option<&OwnedFd>,
    socket: &Path,
    log: Stdio,
) -> Result<Kept, QemuError> {
    let (ours, theirs) = socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)
        .map_err(|e| QemuError::io("keeper socketpair", e.into()))?;
    let program = PROGRAM.get().cloned().unwrap_or_else(|| PathBuf::from("/proc/self/exe"));
    let mut cmd = tokio::process::Command::new(program);
    let num = |fd: RawFd| fd.to_string();
    cmd.arg0("sandbox-vm-keep").arg("__vm-keep");
    cmd.args(["--control", &num(theirs.as_raw_fd())]);
    cmd.args(["--helper", &std::process::id().to_string()]).arg("--socket").arg(socket);
    if let Some(link) = link {
        cmd.args(["--link", &num(link.as_raw_fd())]);
    }
    for fd in pass {
        cmd.args(["--pass", &num(*fd)]);
    }
    cmd.arg("--").args(argv);
    let mut inherited = vec![theirs.as_raw_fd()];
    inherited.extend(link.map(|l| l.as_raw_fd()));
    inherited.extend_from_slice(pass);
    // SAFETY: only fcntl, async-signal-safe, between fork and exec, on fds
    // open in this process.
    unsafe {
        cmd.pre_exec(move || {
            for fd in &inherited {
                if libc::fcntl(*fd, libc::F_SETFD, 0) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    // The keeper's environment is qemu's: none of the helper's.
    cmd.env_clear();
    if let Some(v) = std::env::var_os("RUST_LOG") {
        cmd.env("RUST_LOG", v);
    }
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(log).kill_on_drop(true);
    let mut keeper = cmd.spawn().map_err(|e| QemuError::io("start qemu's keeper", e))?;
    drop(theirs);
    let heard = tokio::task::spawn_blocking(move || recv_message(&ours, START_WAIT))
        .await
        .map_err(|e| QemuError::io("hear from qemu's keeper", std::io::Error::other(e)))?;
    let started = match heard {
        Some((text, mut fds)) => match text.strip_prefix("qemu:").and_then(|p| p.parse::<u32>().ok()) {
            Some(pid) if fds.len() == 1 => Ok((pid, fds.remove(0))),
            _ => match (text.strip_prefix("missing:"), text.strip_prefix("error:")) {
                (Some(why), _) => Err(QemuError::NotInstalled(why.to_string())),
                (_, Some(why)) => Err(QemuError::Exited(format!("qemu's keeper could not start it: {why}"))),
                _ => Err(QemuError::Exited(format!("qemu's keeper said {text:?}"))),
            },
        },
        None => Err(QemuError::Exited("qemu's keeper exited before it started qemu".into())),
    };
    match started {
        Ok((pid, pidfd)) => Ok(Kept { keeper, pid, pidfd }),
        Err(e) => {
            let _ = keeper.start_kill();
            let _ = keeper.wait().await;
            Err(e)
        }
    }
}

/// qemu's status from its keeper's: the keeper exits with qemu's code, or
/// 128 + the signal that killed qemu; a keeper killed itself took qemu
/// along (its parent-death signal).
pub fn qemu_status(keeper: std::process::ExitStatus) -> std::process::ExitStatus {
    match keeper.code() {
        Some(code) => from_code(code),
        None => keeper,
    }
}

/// The status a keeper's or launcher's `code` stands for.
pub fn from_code(code: i32) -> std::process::ExitStatus {
    use std::os::unix::process::ExitStatusExt as _;
    if (129..=192).contains(&code) {
        std::process::ExitStatus::from_raw(code - 128)
    } else {
        std::process::ExitStatus::from_raw((code & 0xff) << 8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keepers_code_reads_as_qemus_status() {
        assert_eq!(from_code(0).to_string(), "exit status: 0");
        assert_eq!(from_code(1).to_string(), "exit status: 1");
        assert_eq!(from_code(137).to_string(), "signal: 9 (SIGKILL)");
        use std::os::unix::process::ExitStatusExt as _;
        let killed_keeper = std::process::ExitStatus::from_raw(9);
        assert_eq!(qemu_status(killed_keeper).to_string(), "signal: 9 (SIGKILL)");
    }
}
