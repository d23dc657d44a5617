//! Which server process made something (a build VM, a sandbox being
//! created), recorded as a label, and whether that process still runs: a
//! server that starts after a crash removes what a dead server left half
//! made, and never touches what another live server is working on.

/// `<pid>:<start time in clock ticks>` of a process, from /proc: the start
/// time tells a reused pid apart.
fn identity(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 22 (starttime), counted after the parenthesised command name,
    // which may itself contain spaces.
    let start = stat.rsplit_once(')')?.1.split_whitespace().nth(19)?;
    Some(format!("{pid}:{start}"))
}

/// This server process.
pub fn me() -> String {
    identity(std::process::id()).unwrap_or_default()
}

/// Whether the process `owner` names (see [`me`]) still runs.
pub fn alive(owner: &str) -> bool {
    let pid = owner.split(':').next().and_then(|p| p.parse().ok());
    pid.and_then(identity).as_deref() == Some(owner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alive_only_while_that_very_process_runs() {
        assert!(alive(&me()));
        let pid = std::process::id();
        assert!(!alive(&format!("{pid}:0")), "same pid, other start time: a reused pid");
        assert!(!alive("4194305:1"), "beyond pid_max");
        assert!(!alive("garbage"));
    }
}
