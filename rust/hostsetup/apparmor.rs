//! The AppArmor profile for the helper. Ubuntu 23.10+ sets
//! `kernel.apparmor_restrict_unprivileged_userns=1`: an unconfined program
//! then gets a user namespace without capabilities, and the helper cannot
//! set up a sandbox. Ubuntu ships profiles with the `userns` permission for
//! the programs that need one (browsers, podman); this is the same for ours.
use std::path::Path;

use super::{HostSetupError, Outcome, User};

/// 1 when unprivileged user namespaces are restricted.
pub const SYSCTL: &str = "/proc/sys/kernel/apparmor_restrict_unprivileged_userns";
const PROFILES: &str = "/etc/apparmor.d";

/// The profile's name: one per user, since each user's helper has its own
/// path (`~/.local/bin`) and one name would make their profiles replace
/// each other.
pub fn profile_name(user: &str) -> String {
    format!("sandbox-vm-helper.{user}")
}

/// The profile text for the helper at `helper`: unconfined but for the
/// `userns` permission, as Ubuntu's own profiles for other tools.
pub fn render(name: &str, helper: &Path) -> String {
    // AppArmor takes a path with spaces only quoted.
    let path = helper.display().to_string();
    let path = if path.contains(char::is_whitespace) { format!("\"{path}\"") } else { path };
    format!(
        "# Installed by `sandbox-mcp host-setup`: lets the sandbox helper create user namespaces\n\
         # where kernel.apparmor_restrict_unprivileged_userns=1.\n\
         abi <abi/4.0>,\n\
         include <tunables/global>\n\
         \n\
         profile {name} {path} flags=(unconfined) {{\n\
         \x20 userns,\n\
         \n\
         \x20 include if exists <local/{name}>\n\
         }}\n"
    )
}

/// Whether the restriction is on (an absent sysctl means no AppArmor restriction).
pub fn restricted() -> bool {
    std::fs::read_to_string(SYSCTL).is_ok_and(|s| s.trim() == "1")
}

/// Installs and loads the profile for `helper` where the restriction is on.
pub fn ensure(user: &User, helper: &Path, dry_run: bool) -> Result<Vec<Outcome>, HostSetupError> {
    if !restricted() {
        return Ok(vec![Outcome::Done(
            "apparmor: unprivileged user namespaces are not restricted here; no profile needed".into(),
        )]);
    }
    if !helper.is_absolute() {
        return Ok(vec![Outcome::Missing(format!(
            "apparmor: user namespaces are restricted and the helper {} was not found; \
             rerun with --helper /path/to/sandbox-vm-helper",
            helper.display()
        ))]);
    }
    let name = profile_name(&user.name);
    let file = Path::new(PROFILES).join(&name);
    let written = super::write_file(&file, &render(&name, helper), dry_run)?;
    let changed = !matches!(written, Outcome::Done(_));
    let mut out = vec![written];
    // Loaded profiles do not survive a reboot unless the file is there,
    // and a rewritten file is not in force until it is loaded again.
    let loaded = std::fs::read_to_string("/sys/kernel/security/apparmor/profiles")
        .is_ok_and(|p| p.lines().any(|l| l.split(' ').next() == Some(name.as_str())));
    if loaded && !changed {
        out.push(Outcome::Done(format!("apparmor: profile {name} already loaded")));
    } else if dry_run {
        out.push(Outcome::Would(format!("apparmor: apparmor_parser -r {}", file.display())));
    } else {
        super::run_tool("apparmor_parser", &["-r", &file.display().to_string()])?;
        out.push(Outcome::Did(format!("apparmor: loaded profile {name} for {}", helper.display())));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_the_userns_profile_for_the_helper_path() {
        let text = render("sandbox-vm-helper.alice", Path::new("/home/alice/.local/bin/sandbox-vm-helper"));
        let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()).collect();
        assert_eq!(
            lines,
            [
                "abi <abi/4.0>,",
                "include <tunables/global>",
                "profile sandbox-vm-helper.alice /home/alice/.local/bin/sandbox-vm-helper flags=(unconfined) {",
                "  userns,",
                "  include if exists <local/sandbox-vm-helper.alice>",
                "}",
            ]
        );
    }

    #[test]
    fn quotes_a_path_with_spaces() {
        let text = render("p", Path::new("/opt/my tools/sandbox-vm-helper"));
        assert!(text.contains("profile p \"/opt/my tools/sandbox-vm-helper\" flags=(unconfined) {"), "{text}");
    }
}
