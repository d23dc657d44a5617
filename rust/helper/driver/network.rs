//! Sandbox networking: loopback (every VM) and pasta for EGRESS.
//!
//! Every VM has its own network namespace. NONE leaves it with only `lo`.
//! EGRESS attaches pasta (user-mode TCP/UDP stack) to it: the sandbox gets
//! eth0 and outbound connections, while `--no-map-gw` keeps the host's own
//! loopback services unreachable.
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use tokio::process::Command;

use super::DriverError;

/// Brings `lo` up in the calling process's network namespace.
pub fn loopback_up() -> Result<(), DriverError> {
    let sys = |what: &str| DriverError::Sys { what: what.into(), source: nix::errno::Errno::last() };
    // SAFETY: plain socket/ioctl calls on a zeroed ifreq we own.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(sys("socket for lo"));
        }
        let fd = OwnedFd::from_raw_fd(fd);
        let mut req: libc::ifreq = std::mem::zeroed();
        for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
            *dst = *src as libc::c_char;
        }
        if libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) < 0 {
            return Err(sys("SIOCGIFFLAGS lo"));
        }
        req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        if libc::ioctl(fd.as_raw_fd(), libc::SIOCSIFFLAGS, &req) < 0 {
            return Err(sys("SIOCSIFFLAGS lo"));
        }
    }
    Ok(())
}

/// Writes the VM's resolv.conf from the host's current one, so name
/// resolution follows the host's network as it is when the VM starts.
pub fn write_resolv_conf(dest: &Path) -> Result<(), DriverError> {
    let host = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    std::fs::write(dest, host).map_err(|e| DriverError::io(format!("write {}", dest.display()), e))
}

/// A running pasta attached to one VM.
#[derive(Debug)]
pub struct Pasta {
    pidfd: OwnedFd,
    /// Kept while pasta runs, so a helper restarted after a crash can find
    /// and stop it ([`reap_stale`]).
    pid_file: PathBuf,
}

impl Pasta {
    /// Attaches pasta to the namespaces of `pid` and returns once the
    /// sandbox's interface is configured (pasta forks to the background only
    /// after that).
    pub async fn start(pasta: &Path, pid: i32, pid_file: &Path) -> Result<Self, DriverError> {
        let mut cmd = Command::new(pasta);
        cmd.args(["-q", "--config-net", "-4", "-u", "none", "-t", "none", "-T", "none", "-U", "none", "--no-map-gw"]);
        if nix::unistd::geteuid().is_root() {
            // Otherwise pasta switches to nobody and can no longer enter the
            // sandbox's namespaces.
            cmd.args(["--runas", "0"]);
        }
        cmd.arg("-P").arg(pid_file).arg(pid.to_string());
        cmd.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::piped());
        let out = cmd.output().await.map_err(|e| DriverError::io(format!("run {}", pasta.display()), e))?;
        if !out.status.success() {
            return Err(DriverError::Network(format!(
                "pasta failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        let text = std::fs::read_to_string(pid_file).map_err(|e| DriverError::io("read pasta pid file", e))?;
        let daemon: i32 =
            text.trim().parse().map_err(|_| DriverError::Network(format!("pasta pid file holds {text:?}")))?;
        Ok(Pasta { pidfd: pidfd_open(daemon)?, pid_file: pid_file.to_path_buf() })
    }

    /// Stops pasta (it would also quit once the namespace is gone, but we
    /// do not rely on that).
    pub fn stop(&self) {
        pidfd_kill(&self.pidfd, libc::SIGTERM);
        let _ = std::fs::remove_file(&self.pid_file);
    }
}

/// Stops pasta processes left by a helper that died without cleaning up
/// (its VMs died with it through their lifeline; pasta does not notice). A
/// process is only signalled if its command line names the pid file, so a
/// recycled pid is never hit.
pub fn reap_stale(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for path in entries.flatten().map(|e| e.path()) {
        if !path.to_string_lossy().ends_with(".pasta.pid") {
            continue;
        }
        let pid = std::fs::read_to_string(&path).ok().and_then(|t| t.trim().parse::<i32>().ok());
        if let Some(pid) = pid {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let names_file = cmdline.split(|&b| b == 0).any(|arg| arg == path.as_os_str().as_encoded_bytes());
            if names_file {
                tracing::info!(pid, "stopping pasta left by an earlier helper");
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM);
            }
        }
        let _ = std::fs::remove_file(&path);
    }
}

/// A pidfd for `pid`: signals through it can never hit a recycled pid.
pub fn pidfd_open(pid: i32) -> Result<OwnedFd, DriverError> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(DriverError::Sys { what: format!("pidfd_open {pid}"), source: nix::errno::Errno::last() });
    }
    // SAFETY: the kernel just returned this fd to us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Sends `signal` through a pidfd.
pub fn pidfd_kill(pidfd: &OwnedFd, signal: i32) {
    // SAFETY: pidfd_send_signal on a pidfd we own; the siginfo pointer is null.
    unsafe {
        libc::syscall(libc::SYS_pidfd_send_signal, pidfd.as_raw_fd(), signal, std::ptr::null::<u8>(), 0);
    }
}

/// The pasta binary, if installed.
pub fn find_pasta() -> Option<PathBuf> {
    super::userns::find_in_path("pasta")
}
