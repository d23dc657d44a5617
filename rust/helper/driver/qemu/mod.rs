//! The `vm` driver's qemu side: a sandbox as a qemu `-M microvm` guest
//! booting Debian's cloud kernel (PVH) with our initramfs, whose init
//! ([`sandbox_guest`]) builds the sandbox's root and starts the agent on a
//! virtio-serial port. The port's host end is a Unix socket the helper
//! listens on: that connection is the byte stream the agent protocol runs
//! over.
//!
//! - [`assets`]: the kernel and the initramfs made for this helper binary.
//! - [`argv`]: qemu's command line.
//! - [`qmp`]: the QMP client (stop, cont, migrate to a file, quit).
//! - [`ram`]: guest memory, and the copy of a template's a restored vm starts from.
//! - [`probe`]: whether KVM really boots our kernel, else TCG, with the reason.
//! - [`disks`]: the image's layers as read-only ext4 disks and the VM's
//!   writable disk.
//! - [`virtiofsd`]: the daemon serving `/workspace`.
//! - [`share`]: where a root helper's virtiofsd reaches `/workspace`.
//! - [`network`]: the EGRESS network card's link to the helper's stack.
//! - [`instance`]: boot, transport, stop, kill, wait, adopt.
//! - [`keeper`]: the process qemu hangs from, which outlives a helper.
//! - [`adopt`]: a sandbox's vm taken over by the next helper.
//! - [`driver`]: the `vm` driver behind the helper's driver seam.
//! - [`snapshot`]: the writable layer as a layer of the image store.
//! - [`template`]: memory snapshots of a vm waiting at guest init's handshake.
//! - [`bench`]: the create and memory figures `make bench` prints.
//! - [`pool`]: restored vms kept ready, and the templates built behind them.
//!
//! qemu runs as the helper's user with no extra privilege, under
//! `-sandbox on` (its own seccomp filter), in the sandbox's cgroup when the
//! host has cgroups.
pub mod adopt;
pub mod argv;
pub mod assets;
pub mod bench;
pub mod disks;
pub mod driver;
pub mod instance;
pub mod keeper;
pub mod network;
pub mod pool;
pub mod probe;
pub mod qmp;
pub mod ram;
pub mod share;
pub mod snapshot;
pub mod template;
pub mod virtiofsd;

/// Debian's qemu for x86-64 guests (package qemu-system-x86).
pub const QEMU: &str = "qemu-system-x86_64";
/// The apt line that installs what the vm driver runs.
pub const INSTALL_HINT: &str = "apt-get install qemu-system-x86 (or `make vm`)";

/// qemu's command with `args`, none of the caller's environment, no stdin
/// or stdout, and the fds `inherit` open across the exec. qemu dies with
/// the thread that forks it (its parent-death signal), checked against a
/// parent that died first: the keeper, which is single-threaded, or the
/// KVM probe's runtime worker, which lives as long as the helper.
pub fn command<A: AsRef<std::ffi::OsStr>>(
    args: impl IntoIterator<Item = A>,
    inherit: Vec<std::os::fd::RawFd>,
) -> std::process::Command {
    use std::os::unix::process::CommandExt as _;
    let mut cmd = std::process::Command::new(QEMU);
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: only prctl, getppid and fcntl, async-signal-safe, between
    // fork and exec, on fds open in this process.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                return Err(std::io::Error::other("the process starting qemu exited"));
            }
            for fd in &inherit {
                if libc::fcntl(*fd, libc::F_SETFD, 0) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    cmd.args(args).env_clear().stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null());
    cmd
}

/// What a failed start of qemu means.
pub fn spawn_error(e: std::io::Error) -> QemuError {
    match e.kind() {
        std::io::ErrorKind::NotFound => QemuError::NotInstalled(format!("{QEMU} is not installed: {INSTALL_HINT}")),
        _ => QemuError::io(format!("start {QEMU}"), e),
    }
}

/// Why a vm could not be prepared, started or driven.
#[derive(Debug, thiserror::Error)]
pub enum QemuError {
    /// The kernel or the initramfs for this helper is not built.
    #[error("{0}")]
    Assets(String),
    /// qemu or virtiofsd is not installed.
    #[error("{0}")]
    NotInstalled(String),
    /// File or process I/O failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A disk image could not be built.
    #[error("disk {what}: {detail}")]
    Disk {
        /// Which disk.
        what: String,
        /// mke2fs's complaint.
        detail: String,
    },
    /// QMP refused a command or broke the protocol.
    #[error("qmp {command}: {detail}")]
    Qmp {
        /// The command.
        command: String,
        /// qemu's error or what went wrong.
        detail: String,
    },
    /// qemu exited; the reason names its status and the end of its output.
    #[error("qemu exited: {0}")]
    Exited(String),
    /// A step did not finish in time.
    #[error("timed out after {secs} s waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: &'static str,
        /// How long.
        secs: u64,
    },
}

impl QemuError {
    /// An I/O error with context.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        QemuError::Io { what: what.into(), source }
    }
}

/// Creates `path` and holds an exclusive `flock` on it until dropped,
/// waiting for another holder (a thread of this helper or another helper).
pub fn lock_exclusive(path: &std::path::Path) -> Result<nix::fcntl::Flock<std::fs::File>, QemuError> {
    let file = std::fs::File::create(path).map_err(|e| QemuError::io(format!("create {}", path.display()), e))?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| QemuError::io(format!("lock {}", path.display()), e.into()))
}

/// How the guest's CPU runs.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Accel {
    /// Hardware virtualization: a probe VM booted our kernel under it.
    Kvm,
    /// qemu's software CPU; `kvm_unusable` says why not KVM.
    Tcg {
        /// Why KVM is not used here.
        kvm_unusable: String,
    },
}

impl Accel {
    /// qemu's `-accel` value.
    pub fn name(&self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg { .. } => "tcg",
        }
    }
}
