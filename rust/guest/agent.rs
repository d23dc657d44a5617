//! Starts the agent on the virtio-serial port and stays PID 1: reaps every
//! orphan (the agent's spawned processes' children end up here) and powers
//! the VM off once the agent is gone, so qemu exits and the host sees it.
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid, fork};

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

/// The probe's answer on the agent port (see
/// [`crate::helper::driver::qemu::probe`]).
pub fn answer_probe() -> Result<(), GuestError> {
    use std::io::Write as _;
    let port = port(AGENT_PORT)?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(&port)
        .map_err(|e| GuestError::io(format!("open {}", port.display()), e))?;
    f.write_all(crate::helper::driver::qemu::probe::PROBE_OK)
        .map_err(|e| GuestError::io("write the probe answer", e))?;
    // Let the port drain before the power goes.
    std::thread::sleep(Duration::from_millis(100));
    Ok(())
}

/// Forks the agent, then reaps until it exits and powers off. Returns only
/// if the agent could not be started. The agent stays in init's cgroup and
/// starts every process in the sandbox's `group` ([`super::cgroup`]).
///
/// The agent is this very binary's `agent` role, entered in the forked
/// child itself rather than exec'd: the child already has the binary and
/// its libraries mapped and relocated (under TCG an exec of the 12 MB
/// binary through the loader costs more than the rest of a restore's
/// hand-out), and it runs with the initramfs's libraries whatever libc the
/// image has, as the exec'd agent did.
pub fn serve(group: &std::path::Path) -> Result<std::convert::Infallible, GuestError> {
    if let Err(e) = crate::helper::driver::network::loopback_up() {
        eprintln!("guest-init: {e}");
    }
    let port = port(AGENT_PORT)?;
    // SAFETY: the process is single-threaded here (PID 1 before any
    // thread), so the child may change its environment and start a
    // runtime.
    let agent = match unsafe { fork() }.map_err(|e| GuestError::sys("fork the agent", e))? {
        ForkResult::Child => {
            let inherited: Vec<_> = std::env::vars_os().map(|(k, _)| k).collect();
            // SAFETY: single-threaded (see above).
            unsafe {
                for k in inherited {
                    std::env::remove_var(k);
                }
                std::env::set_var("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
                std::env::set_var("HOME", "/root");
            }
            if let Err(e) = crate::agent::group::confine_to(group) {
                eprintln!("guest-init: the agent: {e}");
                std::process::exit(1);
            }
            let e = crate::agent::serve(crate::agent::listen::Address::Serial(port));
            eprintln!("guest-init: the agent: {e}");
            std::process::exit(1);
        }
        ForkResult::Parent { child } => child,
    };
    reap(agent);
    power_off()
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
