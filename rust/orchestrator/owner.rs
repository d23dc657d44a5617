//! Which server process made something (a build VM, a sandbox being
//! created), recorded as a label, and whether that process still runs: a
//! server that starts after a crash removes what a dead server left half
//! made, and never touches what another live server is working on.

/// `<pid>:<start time>` of a process: the start time tells a reused pid
/// apart.
fn identity(pid: u32) -> Option<String> {
    Some(format!("{pid}:{}", start_time(pid)?))
}

/// In clock ticks since boot, from /proc.
#[cfg(linux_host)]
use sandbox_base::proc::start_time;

#[cfg(not(linux_host))]
fn start_time(pid: u32) -> Option<String> {
    start_time_by_ps(pid)
}

/// As `ps` prints it (a Mac has no /proc): to the second, which tells a
/// pid reused after a crash apart all the same. A Mac's; Linux's tests
/// run it too.
#[cfg_attr(linux_host, allow(dead_code))]
fn start_time_by_ps(pid: u32) -> Option<String> {
    let out = std::process::Command::new("ps").args(["-o", "lstart=", "-p", &pid.to_string()]).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let start = text.split_whitespace().collect::<Vec<_>>().join("_");
    (out.status.success() && !start.is_empty()).then_some(start)
}

/// This server process.
pub fn me() -> String {
    // Read once per process (a `ps` run on a Mac), by pid: a forked child
    // is another process.
    static ME: std::sync::Mutex<Option<(u32, String)>> = std::sync::Mutex::new(None);
    let pid = std::process::id();
    let mut me = ME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    match &*me {
        Some((p, id)) if *p == pid => id.clone(),
        _ => {
            let id = identity(pid).unwrap_or_default();
            *me = Some((pid, id.clone()));
            id
        }
    }
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

    #[test]
    fn ps_tells_a_process_by_its_start_and_nothing_for_no_process() {
        let pid = std::process::id();
        let start = start_time_by_ps(pid).expect("this process's start");
        assert!(!start.contains(char::is_whitespace), "{start:?}");
        assert_eq!(start_time_by_ps(pid), Some(start));
        assert_eq!(start_time_by_ps(4_194_305), None, "beyond pid_max");
    }
}
