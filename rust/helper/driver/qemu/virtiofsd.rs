//! virtiofsd serving one vm's `/workspace` (the sandbox's volume dir).
//!
//! It runs as root of a user namespace with the helper's id map, the same
//! map the namespace driver gives its sandboxes: the guest's root then
//! writes files the user owns (an ordinary user's helper) exactly as in a
//! namespace sandbox, and virtiofsd can build its own mount and pid
//! namespaces without any host privilege. It ends when qemu closes its
//! vhost-user connection. The helper makes the listening socket and hands
//! it over (`--fd`): virtiofsd, as root of the namespace, has no right to
//! its own pid file in /run or to the vm's run dir.
use std::os::fd::AsRawFd as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::QemuError;
use crate::driver::cgroup::VmCgroup;
use sandbox_userns::{IdMapper, run_mapped};

/// Debian 12 ships virtiofsd with qemu (package qemu-system-common).
pub const VIRTIOFSD: &str = "/usr/lib/qemu/virtiofsd";

/// A running virtiofsd.
pub struct Virtiofsd {
    socket: PathBuf,
    waiter: Option<std::thread::JoinHandle<Result<std::process::Output, String>>>,
}

impl Virtiofsd {
    /// Starts serving `source` on `socket`, inside `cgroup` when given.
    pub fn start(
        source: &Path,
        socket: &Path,
        mapper: &IdMapper,
        cgroup: Option<&VmCgroup>,
    ) -> Result<Self, QemuError> {
        if !Path::new(VIRTIOFSD).is_file() {
            return Err(QemuError::NotInstalled(format!("{VIRTIOFSD} is missing: {}", super::INSTALL_HINT)));
        }
        let _ = std::fs::remove_file(socket);
        let listener = std::os::unix::net::UnixListener::bind(socket)
            .map_err(|e| QemuError::io(format!("bind {}", socket.display()), e))?;
        let fd = listener.as_raw_fd();
        // It joins the VM's cgroup itself, before it leaves the helper's
        // user namespace (where the helper may move processes there).
        let procs: Vec<std::ffi::CString> = cgroup
            .map(VmCgroup::procs_files)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|p| std::ffi::CString::new(p.into_os_string().into_encoded_bytes()).ok())
            .collect();
        let mut cmd = Command::new(VIRTIOFSD);
        // SAFETY: fcntl, open, write and close on fds we own or open, with
        // paths allocated before the fork, between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                for path in &procs {
                    let f = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                    if f < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    let written = libc::write(f, b"0".as_ptr().cast(), 1);
                    libc::close(f);
                    if written != 1 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        // Its messages go to a file beside the socket, not to a pipe to the
        // helper: it outlives a helper that dies (it serves until qemu
        // closes its connection), and a write to a closed pipe would end it.
        let log = socket.with_extension("log");
        let log = std::fs::File::create(&log).map_err(|e| QemuError::io(format!("create {}", log.display()), e))?;
        cmd.stdout(std::process::Stdio::null()).stderr(log);
        cmd.arg(format!("--fd={fd}"))
            .arg("-o")
            .arg(format!("source={}", source.display()))
            // The guest sees the host's writes at once: /workspace is shared
            // with host tools (sync, upload) while the vm runs.
            .args(["-o", "cache=none", "-o", "no_posix_lock", "--rlimit-nofile=0"])
            .env_clear();
        let mapper = mapper.clone();
        // The listener stays open here until virtiofsd ends: a connection
        // made before it starts waits in the backlog.
        let waiter = std::thread::spawn(move || {
            let out = run_mapped(&mapper, cmd).map_err(|e| e.to_string());
            drop(listener);
            out
        });
        Ok(Virtiofsd { socket: socket.to_path_buf(), waiter: Some(waiter) })
    }

    /// Its socket, for qemu.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Ends it if qemu never connected (a connection that closes at once
    /// ends a waiting virtiofsd; one serving qemu ends with qemu), then
    /// waits for it.
    pub fn stop(&mut self) {
        if let Some(w) = &self.waiter
            && !w.is_finished()
        {
            drop(std::os::unix::net::UnixStream::connect(&self.socket));
        }
        if let Some(waiter) = self.waiter.take() {
            let _ = waiter.join();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl Drop for Virtiofsd {
    fn drop(&mut self) {
        if self.waiter.is_some() {
            self.stop();
        }
    }
}
