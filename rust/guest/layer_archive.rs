//! `sandbox-vm-helper __archive-layer`: run inside a `vm` guest by the
//! helper for a snapshot. Writes the VM's writable layer ([`LAYER_VIEW`]) to
//! stdout as a GNU tar archive (extended attributes included: the agent's
//! own copy-out drops them, and `user.overlay.opaque` marks are part of a
//! layer) while the layer's filesystem is frozen, so the archive is one
//! instant of the layer however busy the sandbox is, as the namespace
//! driver freezes its sandbox's cgroup. Writers wait meanwhile; reads go on.
//!
//! A frozen filesystem left behind would hang the sandbox: a watchdog
//! forked before the freeze thaws it when this process ends, however it
//! ends (the helper hung up and the agent killed it, say): its pipe closes.
use std::os::fd::AsRawFd as _;
use std::process::Command;

use nix::fcntl::OFlag;
use nix::sys::wait::waitpid;
use nix::unistd::{ForkResult, fork, pipe2, read};

use super::{AGENT_DIR, LAYER_VIEW};

/// `FIFREEZE` and `FITHAW` (`_IOWR('X', 119/120, int)`).
const FIFREEZE: libc::c_ulong = 0xC004_5877;
const FITHAW: libc::c_ulong = 0xC004_5878;

/// The command line that runs this role in the guest, as a process the
/// agent starts in the sandbox's root: the binary with the initramfs's
/// loader and libraries, whatever libc the image has.
pub fn argv() -> Vec<String> {
    [
        format!("{AGENT_DIR}/ld.so"),
        "--library-path".into(),
        AGENT_DIR.into(),
        format!("{AGENT_DIR}/sandbox-vm-helper"),
        "__archive-layer".into(),
    ]
    .into()
}

/// What the archiver tells its watchdog: about to freeze; the freeze
/// failed (nothing of its own to thaw).
const FREEZING: u8 = b'f';
const NOT_MINE: u8 = b'n';

/// GNU tar's words when a file changed under it (a layer that was not frozen).
pub const CHANGED: &str = "as we read it";

/// Archives the layer; the exit code is tar's, or 2 with the reason on
/// stderr when the layer cannot be frozen.
pub fn run() -> i32 {
    let layer = match std::fs::File::open(LAYER_VIEW) {
        Ok(f) => f,
        Err(e) => return fail(&format!("open {LAYER_VIEW}: {e}")),
    };
    // Close-on-exec: tar must not hold the watchdog's pipe open past this
    // process's end.
    let (watch_r, watch_w) = match pipe2(OFlag::O_CLOEXEC) {
        Ok(p) => p,
        Err(e) => return fail(&format!("pipe: {e}")),
    };
    // SAFETY: single-threaded (a fresh process, no runtime).
    let watchdog = match unsafe { fork() } {
        Ok(ForkResult::Child) => {
            drop(watch_w);
            // Told apart from the archiver in `ps` (and by a test that
            // kills the archiver alone).
            let _ = nix::sys::prctl::set_name(c"layer-thaw");
            // FREEZING, then NOT_MINE or the end: only a freeze this
            // process made is thawed (another snapshot's is not).
            let mut mine = false;
            loop {
                let mut byte = [0u8; 1];
                match read(&watch_r, &mut byte) {
                    Ok(1) if byte[0] == FREEZING => mine = true,
                    Ok(1) => mine = false,
                    Err(nix::errno::Errno::EINTR) => {}
                    _ => break,
                }
            }
            if !mine {
                std::process::exit(0);
            }
            // EINVAL when it is not frozen (the archiver thawed it): fine.
            // SAFETY: an ioctl on an fd this process owns.
            unsafe { libc::ioctl(layer.as_raw_fd(), FITHAW, 0) };
            std::process::exit(0);
        }
        Ok(ForkResult::Parent { child }) => child,
        Err(e) => return fail(&format!("fork the watchdog: {e}")),
    };
    drop(watch_r);
    let tell = |byte: u8| {
        let _ = nix::unistd::write(&watch_w, &[byte]);
    };
    tell(FREEZING);
    // SAFETY: an ioctl on an fd this process owns.
    let code = if unsafe { libc::ioctl(layer.as_raw_fd(), FIFREEZE, 0) } != 0 {
        let e = std::io::Error::last_os_error();
        tell(NOT_MINE);
        if e.raw_os_error() == Some(libc::EBUSY) {
            fail("the writable layer is already frozen: another snapshot of this sandbox is under way; retry")
        } else {
            fail(&format!("freeze the writable layer: {e}"))
        }
    } else {
        let status = Command::new("tar")
            .args(["--xattrs", "--xattrs-include=*", "--numeric-owner", "-C", LAYER_VIEW, "-cf", "-", "."])
            .status();
        // SAFETY: as above.
        unsafe { libc::ioctl(layer.as_raw_fd(), FITHAW, 0) };
        match status {
            Ok(s) => s.code().unwrap_or(2),
            Err(e) => fail(&format!("run tar (the image needs GNU tar for snapshots): {e}")),
        }
    };
    drop(watch_w);
    let _ = waitpid(watchdog, None);
    code
}

fn fail(why: &str) -> i32 {
    eprintln!("archive the writable layer: {why}");
    2
}
