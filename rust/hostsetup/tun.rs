//! /dev/net/tun for ordinary users: EGRESS networking (ours and pasta's)
//! creates a tun inside the sandbox's user + network namespace, which needs
//! the device world-usable, as distributions' udev rules ship it (0666).
//! Hosts without udev (containers, minimal VMs) leave it 0600.
use std::{os::unix::fs::PermissionsExt as _, path::Path};

use super::{HostSetupError, Outcome};

const DEVICE: &str = "/dev/net/tun";
/// Where the rule goes when udev exists, so the mode survives a reboot.
const RULE_FILE: &str = "/etc/udev/rules.d/60-sandbox-mcp-tun.rules";
/// The rule systemd's 50-udev-default.rules has for the device.
const RULE: &str = "# Installed by `sandbox-mcp host-setup`: ordinary users' sandboxes create tun devices\n\
                    # in their own user + network namespace (EGRESS networking).\n\
                    KERNEL==\"tun\", MODE=\"0666\", OPTIONS+=\"static_node=net/tun\"\n";

/// Makes the device 0666 and installs the udev rule where udev exists.
pub fn ensure(dry_run: bool) -> Result<Vec<Outcome>, HostSetupError> {
    let mut out = Vec::new();
    match std::fs::metadata(DEVICE) {
        Err(e) => out.push(Outcome::Missing(format!(
            "{DEVICE}: {e}; load the tun module (modprobe tun) and rerun, until then sandboxes keep network='none'"
        ))),
        Ok(m) if m.permissions().mode() & 0o666 == 0o666 => {
            out.push(Outcome::Done(format!("{DEVICE}: already mode 0666")));
        }
        Ok(m) if dry_run => {
            out.push(Outcome::Would(format!("{DEVICE}: chmod 0666 (now {:04o})", m.permissions().mode() & 0o7777)))
        }
        Ok(m) => {
            let was = m.permissions().mode() & 0o7777;
            std::fs::set_permissions(DEVICE, std::fs::Permissions::from_mode(0o666))
                .map_err(|e| HostSetupError::io(format!("chmod 0666 {DEVICE}"), e))?;
            out.push(Outcome::Did(format!("{DEVICE}: mode {was:04o} -> 0666")));
        }
    }
    if !Path::new("/etc/udev").is_dir() {
        out.push(Outcome::Done("udev: not installed here; the mode lasts until the next reboot".into()));
        return Ok(out);
    }
    out.push(super::write_file(Path::new(RULE_FILE), RULE, dry_run)?);
    Ok(out)
}
