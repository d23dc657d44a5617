//! Starting one user process from a [`StartSpec`]: environment, working
//! directory, pipes or a pseudo-terminal (Exec) or one shared output pipe
//! (background), its own process group, the sandbox's cgroup in a vm's
//! guest ([`super::group`]), and tracking of its whole process tree
//! ([`super::tree`]).
use std::os::fd::OwnedFd;
use std::process::Stdio;

use nix::pty::{Winsize, openpty};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::process::{Child, Command};

use super::AgentError;
use super::protocol::StartSpec;

/// The environment every process starts from, before VM and process env.
const BASE_ENV: &[(&str, &str)] =
    &[("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"), ("HOME", "/root"), ("LANG", "C.UTF-8")];

/// A started process and the host ends of its stdio.
pub struct Spawned {
    /// The process (reaped by tokio).
    pub child: Child,
    /// Its pid, which is also its process group id.
    pub pid: i32,
    /// Where stdin bytes go.
    pub stdin: Box<dyn AsyncWrite + Send + Unpin>,
    /// stdout (or the terminal's output).
    pub stdout: Box<dyn AsyncRead + Send + Unpin>,
    /// stderr; `None` on a tty, where it shares the terminal.
    pub stderr: Option<Box<dyn AsyncRead + Send + Unpin>>,
}

/// Starts the process described by `spec`.
pub fn spawn(spec: &StartSpec) -> Result<Spawned, AgentError> {
    let mut cmd = command(spec)?;
    super::tree::track(&mut cmd);
    let _secret = attach_secret(&mut cmd, spec)?;
    let spawned = if spec.tty { spawn_tty(cmd, spec) } else { spawn_pipes(cmd) };
    spawned.map_err(|e| spawn_error(spec, e))
}

/// A started background process: stdin is /dev/null, stdout and stderr
/// share one pipe so the output stays interleaved as it was written.
pub struct SpawnedBackground {
    /// The process (reaped by tokio).
    pub child: Child,
    /// Its pid, which is also its process group id.
    pub pid: i32,
    /// The read end of its output pipe.
    pub output: OwnedFd,
}

/// Starts `spec` (never on a tty) in its own process group.
pub fn spawn_background(spec: &StartSpec) -> Result<SpawnedBackground, AgentError> {
    if spec.tty {
        return Err(AgentError::Rejected("tty: not supported for background processes".into()));
    }
    let mut cmd = command(spec)?;
    super::tree::track(&mut cmd);
    let _secret = attach_secret(&mut cmd, spec)?;
    let started = (|| {
        let (output, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        cmd.process_group(0).stdin(Stdio::null()).stdout(Stdio::from(write.try_clone()?)).stderr(Stdio::from(write));
        let child = cmd.spawn()?;
        // The command still holds the pipe's write end; the output only
        // reaches EOF once every copy outside the process group is closed.
        drop(cmd);
        let pid = pid_of(&child)?;
        Ok(SpawnedBackground { child, pid, output })
    })();
    started.map_err(|e: std::io::Error| spawn_error(spec, e))
}

/// The command for `spec`: environment, user and a checked working directory.
fn command(spec: &StartSpec) -> Result<Command, AgentError> {
    let program = spec.argv.first().ok_or_else(|| AgentError::Rejected("argv: must not be empty".into()))?;
    let cwd = if spec.cwd.is_empty() { "/" } else { spec.cwd.as_str() };
    let credentials = super::user::resolve(&spec.user)?;
    if spec.create_cwd {
        create_cwd(cwd, credentials.as_ref().map(|c| (c.uid, c.gid)))?;
    } else if !std::path::Path::new(cwd).is_dir() {
        return Err(AgentError::Rejected(format!("cwd: {cwd} does not exist or is not a directory")));
    }
    let mut cmd = Command::new(program);
    super::oom::raise(&mut cmd);
    // Before the closure below drops privileges.
    super::group::place(&mut cmd);
    cmd.args(&spec.argv[1..]).env_clear().envs(BASE_ENV.iter().copied()).current_dir(cwd);
    if spec.tty {
        cmd.env("TERM", "xterm-256color");
    }
    if let Some(c) = credentials {
        cmd.env("HOME", &c.home);
        if let Some(name) = &c.name {
            cmd.env("USER", name).env("LOGNAME", name);
        }
        // Our own closure rather than Command::uid/gid: std sets those after
        // a pre_exec closure could call setgroups, and keeps no groups.
        let (uid, gid, groups) = (c.uid, c.gid, c.groups);
        // SAFETY: setgroups, setgid and setuid are async-signal-safe, and
        // the closure allocates nothing.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setgroups(groups.len(), groups.as_ptr()) != 0
                    || libc::setgid(gid) != 0
                    || libc::setuid(uid) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    cmd.envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    Ok(cmd)
}

/// Hands `spec.secret` to the process on descriptor `spec.secret_fd` (3 if
/// 0): a pipe made for this process only, written in full and its write end
/// closed before the process starts, so the bytes are read once and never
/// sit in the environment, argv or a file another process could read. The
/// returned read end must live until the process is spawned (its copy in
/// the agent is close-on-exec; the child's is not).
fn attach_secret(cmd: &mut Command, spec: &StartSpec) -> Result<Option<OwnedFd>, AgentError> {
    use std::{io::Write, os::fd::AsRawFd};
    if spec.secret.is_empty() {
        return Ok(None);
    }
    let target = if spec.secret_fd == 0 { 3 } else { spec.secret_fd };
    if !(3..=255).contains(&target) {
        return Err(AgentError::Rejected(format!("secret_fd: {target} is not between 3 and 255")));
    }
    if spec.secret.len() > super::protocol::MAX_SECRET {
        return Err(AgentError::Rejected(format!("secret: longer than {} bytes", super::protocol::MAX_SECRET)));
    }
    let io = |source: std::io::Error| AgentError::Io { what: "secret pipe".into(), source };
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| io(e.into()))?;
    std::fs::File::from(write).write_all(&spec.secret).map_err(io)?;
    let (raw, target) = (read.as_raw_fd(), target as i32);
    // SAFETY: dup2 and fcntl are async-signal-safe; nothing is allocated.
    unsafe {
        cmd.pre_exec(move || {
            let moved = if raw == target { libc::fcntl(raw, libc::F_SETFD, 0) } else { libc::dup2(raw, target) };
            if moved < 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) }
        });
    }
    Ok(Some(read))
}

/// mkdir -p `cwd`; the directories it creates belong to `owner` (the
/// process's user), who could not write to them otherwise.
fn create_cwd(cwd: &str, owner: Option<(u32, u32)>) -> Result<(), AgentError> {
    let fail = |e: std::io::Error| AgentError::Rejected(format!("cwd: cannot create {cwd}: {e}"));
    let path = std::path::Path::new(cwd);
    let missing: Vec<&std::path::Path> = path.ancestors().take_while(|p| p.symlink_metadata().is_err()).collect();
    std::fs::create_dir_all(path).map_err(fail)?;
    if let Some((uid, gid)) = owner {
        for dir in missing {
            std::os::unix::fs::lchown(dir, Some(uid), Some(gid)).map_err(fail)?;
        }
    }
    Ok(())
}

fn spawn_error(spec: &StartSpec, e: std::io::Error) -> AgentError {
    let program = spec.argv.first().map(String::as_str).unwrap_or_default();
    if e.raw_os_error() == Some(libc::EAGAIN) {
        return AgentError::ForkRefused(format!("cannot start `{program}`: {e}"));
    }
    match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied => {
            AgentError::Rejected(format!("argv[0]: cannot run `{program}`: {e}"))
        }
        _ => AgentError::Io { what: format!("spawn `{program}`"), source: e },
    }
}

fn spawn_pipes(mut cmd: Command) -> std::io::Result<Spawned> {
    // Own process group, so a group signal reaches a pipeline the way a
    // terminal's Ctrl-C would; ending everything is the tree's job.
    cmd.process_group(0).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn()?;
    let pid = pid_of(&child)?;
    let missing = || std::io::Error::other("child stdio was not captured");
    Ok(Spawned {
        stdin: Box::new(child.stdin.take().ok_or_else(missing)?),
        stdout: Box::new(child.stdout.take().ok_or_else(missing)?),
        stderr: Some(Box::new(child.stderr.take().ok_or_else(missing)?)),
        child,
        pid,
    })
}

fn spawn_tty(mut cmd: Command, spec: &StartSpec) -> std::io::Result<Spawned> {
    let size = Winsize {
        ws_row: if spec.tty_rows == 0 { 24 } else { spec.tty_rows },
        ws_col: if spec.tty_cols == 0 { 80 } else { spec.tty_cols },
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let pty = openpty(Some(&size), None).map_err(std::io::Error::from)?;
    let slave: OwnedFd = pty.slave;
    cmd.stdin(Stdio::from(slave.try_clone()?)).stdout(Stdio::from(slave.try_clone()?)).stderr(Stdio::from(slave));
    // SAFETY: setsid and ioctl are async-signal-safe; nothing else runs here.
    unsafe {
        cmd.pre_exec(|| {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            if libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    let pid = pid_of(&child)?;
    let master = pty.master;
    let writer = std::fs::File::from(master.try_clone()?);
    Ok(Spawned {
        child,
        pid,
        stdin: Box::new(tokio::fs::File::from_std(writer)),
        stdout: Box::new(PtyReader(tokio::fs::File::from_std(std::fs::File::from(master)))),
        stderr: None,
    })
}

fn pid_of(child: &Child) -> std::io::Result<i32> {
    child
        .id()
        .and_then(|p| i32::try_from(p).ok())
        .ok_or_else(|| std::io::Error::other("child exited before its pid was known"))
}

/// A pty master reports EIO once the last slave fd closes; that is the
/// terminal's end of output, so it reads as EOF.
struct PtyReader(tokio::fs::File);

impl AsyncRead for PtyReader {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match std::pin::Pin::new(&mut self.0).poll_read(cx, buf) {
            std::task::Poll::Ready(Err(e)) if e.raw_os_error() == Some(libc::EIO) => std::task::Poll::Ready(Ok(())),
            other => other,
        }
    }
}
