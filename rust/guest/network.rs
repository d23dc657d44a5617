//! The guest's network: when the host gave the VM a network card (a
//! sandbox with EGRESS, whose card's other end is the helper's stack), eth0
//! gets the address, route and resolver a namespace sandbox has; without
//! one the VM keeps only loopback. This runs after the "go", never before a
//! memory snapshot: a template with a card has eth0, down, so each vm
//! restored from it configures its own card, whose host end is its own
//! stack.
use std::path::Path;

use super::GuestError;

/// The card qemu's `virtio-net-device` becomes (probed when its module loads).
const ETH0: &str = "/sys/class/net/eth0";
/// The generated resolv.conf, on the sandbox root's /run tmpfs: bound over
/// /etc/resolv.conf, so it never lands in the writable layer.
const RESOLV: &str = "/run/sandbox-mcp.resolv.conf";

/// In the sandbox's root (after the switch): eth0 up and /etc/resolv.conf
/// naming the stack's DNS, when the VM has a card.
pub fn up() -> Result<(), GuestError> {
    if !Path::new(ETH0).exists() {
        return Ok(());
    }
    let failed = |e: sandbox_net::setup::SetupError| GuestError::Network(e.to_string());
    sandbox_net::setup::eth0_up(sandbox_net::plan::ETHERNET_MTU).map_err(failed)?;
    sandbox_net::setup::write_resolv_conf(Path::new(RESOLV)).map_err(failed)?;
    let etc = Path::new("/etc/resolv.conf");
    // A symlink (to systemd-resolved's file, say) would send the bind to
    // a path that may not exist; the file itself replaces it.
    if etc.symlink_metadata().is_ok_and(|m| m.file_type().is_symlink()) {
        std::fs::remove_file(etc).map_err(|e| GuestError::io("replace the /etc/resolv.conf symlink", e))?;
    }
    if !etc.exists() {
        std::fs::write(etc, b"").map_err(|e| GuestError::io("create /etc/resolv.conf", e))?;
    }
    let bind = nix::mount::MsFlags::MS_BIND;
    nix::mount::mount(Some(RESOLV), etc, None::<&str>, bind, None::<&str>)
        .map_err(|e| GuestError::sys("bind the resolv.conf over /etc/resolv.conf", e))?;
    let ro = bind | nix::mount::MsFlags::MS_REMOUNT | nix::mount::MsFlags::MS_RDONLY;
    nix::mount::mount(None::<&str>, etc, None::<&str>, ro, None::<&str>)
        .map_err(|e| GuestError::sys("make /etc/resolv.conf read-only", e))
}
