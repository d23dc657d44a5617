//! Starts the agent on the virtio-serial port (before the "go"; it enters
//! the sandbox's root once init made it) and stays PID 1: reaps every
//! orphan (the agent's spawned processes' children end up here) and powers
//! the VM off once the agent is gone, so qemu exits and the host sees it.
use std::os::unix::ffi::OsStrExt as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::fcntl::OFlag;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid, fork, pipe2};

use super::{AGENT_PORT, GuestError};

/// How long the port may take to appear after virtio_console loads.
const PORT_WAIT: Duration = Duration::from_secs(10);

/// The device of the virtio-serial port named `name`.
pub fn port(name: &str) -> Result<PathBuf, GuestError> {
    let deadline = Instant::now() + PORT_WAIT;
    loop {
        if let Ok(entries) = std::fs::read_dir("/sys/class/virtio-ports") {
            for entry in entries.flatten() {
                let named = std::fs::read_to_string(entry.path().join("name")).is_ok_and(|n| n.trim() == name);
                let dev = PathBuf::from("/dev").join(entry.file_name());
                if named && dev.exists() {
                    return Ok(dev);
                }
            }
        }
        if Instant::now() >= deadline {
            return Err(GuestError::Missing(format!("virtio-serial port {name}")));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The probe's answer on the agent port (the helper's qemu driver probes
/// whether KVM runs our kernel).
pub fn answer_probe() -> Result<(), GuestError> {
    use std::io::Write as _;
    let port = port(AGENT_PORT)?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(&port)
        .map_err(|e| GuestError::io(format!("open {}", port.display()), e))?;
    f.write_all(super::PROBE_OK).map_err(|e| GuestError::io("write the probe answer", e))?;
    // Let the port drain before the power goes.
    std::thread::sleep(Duration::from_millis(100));
    Ok(())
}

/// The agent, forked before the "go" (see [`start`]).
pub struct Agent {
    pid: Pid,
    /// One byte asks the agent to enter init's root.
    enter: std::os::fd::OwnedFd,
    /// Its answer: `ENTERED`, or the reason it could not.
    entered: std::fs::File,
}

/// What the agent answers once it runs in init's root.
const ENTERED: &[u8] = b"ok";

/// Forks the agent, serving the agent port at once, before the "go": a
/// memory snapshot then holds it started (its runtime made, the port open),
/// and a pool vm has it answering, so a hand-out does not wait for its
/// start. Until [`Agent::enter_root`] it runs in the initramfs, where the
/// host only pings it.
///
/// The agent is this very binary's `agent` role, entered in the forked
/// child itself rather than exec'd: the child already has the binary and
/// its libraries mapped and relocated (under TCG an exec of the 12 MB
/// binary through the loader costs more than the rest of a restore's
/// hand-out), and it runs with the initramfs's libraries whatever libc the
/// image has, as the exec'd agent did.
pub fn start() -> Result<Agent, GuestError> {
    if let Err(e) = sandbox_net::setup::loopback_up() {
        eprintln!("guest-init: {e}");
    }
    let port = port(AGENT_PORT)?;
    let (enter_r, enter_w) = pipe2(OFlag::O_CLOEXEC).map_err(|e| GuestError::sys("pipe", e))?;
    let (entered_r, entered_w) = pipe2(OFlag::O_CLOEXEC).map_err(|e| GuestError::sys("pipe", e))?;
    // SAFETY: the process is single-threaded here (PID 1 before any
    // thread), so the child may change its environment and start a
    // runtime.
    match unsafe { fork() }.map_err(|e| GuestError::sys("fork the agent", e))? {
        ForkResult::Child => {
            drop((enter_w, entered_r));
            let inherited: Vec<_> = std::env::vars_os().map(|(k, _)| k).collect();
            // SAFETY: single-threaded (see above).
            unsafe {
                for k in inherited {
                    std::env::remove_var(k);
                }
                std::env::set_var("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
                std::env::set_var("HOME", "/root");
            }
            std::thread::spawn(move || await_root(enter_r, entered_w));
            let e = sandbox_agent::serve(sandbox_agent::listen::Address::Serial(port));
            eprintln!("guest-init: the agent: {e}");
            std::process::exit(1);
        }
        ForkResult::Parent { child } => {
            Ok(Agent { pid: child, enter: enter_w, entered: std::fs::File::from(entered_r) })
        }
    }
}

/// In the agent: waits for init's word (the sandbox's cgroup), then moves
/// the whole process (every thread shares its root) into init's root, the
/// sandbox's, through `/proc/1/root` (the initramfs's /proc stays mounted
/// under the agent's old root, which the new root was only mounted over),
/// and starts every process from then on in that group
/// ([`sandbox_agent::group`]); the agent itself stays in init's group.
fn await_root(enter: std::os::fd::OwnedFd, entered: std::os::fd::OwnedFd) {
    use std::io::Write as _;
    let mut word = [0u8; 4096];
    let mut entered = std::fs::File::from(entered);
    let n = match nix::unistd::read(&enter, &mut word) {
        Ok(n) if n > 0 => n,
        // Init is gone (the vm powers off): nothing to enter.
        _ => return,
    };
    let group = std::path::PathBuf::from(std::ffi::OsStr::from_bytes(&word[..n]));
    let entering = nix::unistd::chroot("/proc/1/root")
        .and_then(|()| nix::unistd::chdir("/"))
        .map_err(|e| format!("enter the sandbox's root: {e}"))
        .and_then(|()| sandbox_agent::group::confine_to(&group).map_err(|e| e.to_string()));
    let answer = match entering {
        Ok(()) => ENTERED.to_vec(),
        Err(why) => why.into_bytes(),
    };
    let _ = entered.write_all(&answer);
}

impl Agent {
    /// Has the agent enter init's root (the sandbox's, which
    /// [`super::rootfs::assemble`] made) and start its processes in the
    /// sandbox's cgroup `group` ([`super::cgroup`]), and waits until it has.
    pub fn enter_root(&mut self, group: &std::path::Path) -> Result<(), GuestError> {
        use std::io::Read as _;
        use std::os::unix::ffi::OsStrExt as _;
        // One write under PIPE_BUF: the agent reads it whole.
        nix::unistd::write(&self.enter, group.as_os_str().as_bytes())
            .map_err(|e| GuestError::sys("tell the agent its root", e))?;
        let mut answer = Vec::new();
        let _ = (&mut self.entered).take(4096).read_to_end(&mut answer);
        match answer.as_slice() {
            ENTERED => Ok(()),
            [] => Err(GuestError::Missing("the agent (it exited before entering the sandbox's root)".into())),
            why => Err(GuestError::Config(String::from_utf8_lossy(why).into_owned())),
        }
    }

    /// Reaps until the agent exits, then powers off.
    pub fn supervise(self) -> ! {
        drop((self.enter, self.entered));
        reap(self.pid);
        power_off()
    }
}

fn reap(agent: Pid) {
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::__WALL)) {
            Ok(WaitStatus::Exited(pid, code)) if pid == agent => {
                eprintln!("guest-init: the agent exited with {code}");
                return;
            }
            Ok(WaitStatus::Signaled(pid, sig, _)) if pid == agent => {
                eprintln!("guest-init: the agent was killed by {sig}");
                return;
            }
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => {
                eprintln!("guest-init: wait: {e}");
                return;
            }
        }
    }
}

/// Powers the VM off (qemu then exits); syncs the writable disk first.
pub fn power_off() -> ! {
    nix::unistd::sync();
    let _ = nix::sys::reboot::reboot(nix::sys::reboot::RebootMode::RB_POWER_OFF);
    // reboot(2) does not return for PID 1 on success; exiting panics the
    // kernel, which `panic=-1` and `-no-reboot` also turn into qemu's exit.
    std::process::exit(1)
}
