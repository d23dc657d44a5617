//! Processes a helper starts that can outlive it (a namespace VM's
//! launcher, a vm's qemu) are recorded in a file beside their VM: their
//! pid and start time, and their helper's. A helper starting after one
//! that died reads these records and kills what the dead one left
//! running; what a live helper sharing the directories runs is left alone.
use std::path::Path;

use sandbox_base::proc::{parent, start_time};

/// What [`reap`] found behind a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reaped {
    /// No record, or its process is gone (the record is removed).
    Gone,
    /// A live helper runs it: left alone, the record kept.
    Owned,
    /// Its helper is gone: killed, the record removed.
    Killed(u32),
}

/// Records `pid`, started by this helper, in `file`. Not fatal: the record
/// only matters if the helper dies and the process does not die with it.
pub fn record(file: &Path, pid: u32) {
    let (Some(start), Some(own)) = (start_time(pid), start_time(std::process::id())) else { return };
    let line = format!("{pid} {start} {} {own}\n", std::process::id());
    if let Err(e) = std::fs::write(file, line) {
        tracing::warn!(path = %file.display(), error = %e, "cannot record a process the helper started");
    }
}

/// The process recorded in `file`: its pid and start time, and whether a
/// live helper runs it.
struct Record {
    pid: u32,
    start: String,
    owned: bool,
}

/// `None`: no record, a garbled one (removed), or its process is gone or
/// its pid names another process now (removed: the usual case).
fn read_record(file: &Path) -> Option<Record> {
    let text = std::fs::read_to_string(file).ok()?;
    let fields: Vec<&str> = text.split_whitespace().collect();
    let running = |pid: u32, start: Option<&&str>| start.is_some_and(|s| start_time(pid).as_deref() == Some(*s));
    let Some(pid) = fields.first().and_then(|p| p.parse::<u32>().ok()).filter(|p| running(*p, fields.get(1))) else {
        let _ = std::fs::remove_file(file);
        return None;
    };
    let owned = match fields.get(2).and_then(|o| o.parse::<u32>().ok()) {
        Some(owner) => running(owner, fields.get(3)),
        // A record of a helper from before owners were recorded: only
        // launchers, run by their helper's own binary.
        None => parent_is_helper(pid),
    };
    Some(Record { pid, start: fields[1].to_string(), owned })
}

/// The pid of the process recorded in `file` if it runs and the helper
/// that started it is gone: one a new helper may adopt.
pub fn orphan(file: &Path) -> Option<u32> {
    read_record(file).filter(|r| !r.owned).map(|r| r.pid)
}

/// Kills the process recorded in `file` if the helper that started it is
/// gone; see [`Reaped`].
pub fn reap(file: &Path) -> Reaped {
    let Some(record) = read_record(file) else { return Reaped::Gone };
    if record.owned {
        return Reaped::Owned;
    }
    let pid = record.pid;
    let Ok(fd) = crate::driver::network::pidfd_open(pid as i32) else { return Reaped::Gone };
    // Checked again through the pidfd's process: the signal cannot reach a
    // process that took the pid meanwhile.
    let killed = start_time(pid).as_deref() == Some(record.start.as_str());
    if killed {
        crate::driver::network::pidfd_kill(&fd, libc::SIGKILL);
    }
    let _ = std::fs::remove_file(file);
    if killed { Reaped::Killed(pid) } else { Reaped::Gone }
}

/// The parent of `pid` runs the same binary as `pid` (a launcher is an
/// exec of its helper's): it is the helper, not init or a subreaper that
/// adopted an orphan. When that cannot be told, it counts as a helper.
fn parent_is_helper(pid: u32) -> bool {
    let Some(parent) = parent(pid).filter(|p| *p > 1) else { return false };
    let exe = |p: u32| std::fs::read_link(format!("/proc/{p}/exe"));
    match (exe(pid), exe(parent)) {
        (Ok(launcher), Ok(parent)) => launcher == parent,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record file's path in a directory of the test's own.
    fn record_file(test: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("leftovers-{}-{test}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir.join("qemu")
    }

    fn sleeper() -> std::process::Child {
        std::process::Command::new("sleep").arg("60").spawn().unwrap()
    }

    #[test]
    fn a_process_of_a_live_helper_is_left_alone() {
        let file = record_file("a_process_of");
        let mut child = sleeper();
        record(&file, child.id());
        assert_eq!(reap(&file), Reaped::Owned, "this process recorded it and runs");
        assert!(file.exists());
        assert!(child.try_wait().unwrap().is_none());
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(reap(&file), Reaped::Gone);
        assert!(!file.exists());
        std::fs::remove_dir(file.parent().unwrap()).unwrap();
    }

    #[test]
    fn a_process_whose_helper_is_gone_is_killed() {
        let file = record_file("a_process_wh");
        let mut child = sleeper();
        let mut helper = sleeper();
        let (pid, start) = (child.id(), start_time(child.id()).unwrap());
        let owner = format!("{} {}", helper.id(), start_time(helper.id()).unwrap());
        helper.kill().unwrap();
        helper.wait().unwrap();
        std::fs::write(&file, format!("{pid} {start} {owner}\n")).unwrap();
        assert_eq!(reap(&file), Reaped::Killed(pid));
        let status = child.wait().unwrap();
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGKILL));
        assert!(!file.exists());
        std::fs::remove_dir(file.parent().unwrap()).unwrap();
    }

    #[test]
    fn a_record_naming_a_recycled_pid_or_garbage_kills_nothing() {
        let file = record_file("a_record_nam");
        let mut child = sleeper();
        std::fs::write(&file, format!("{} 1 1 1\n", child.id())).unwrap();
        assert_eq!(reap(&file), Reaped::Gone, "another start time: another process");
        assert!(child.try_wait().unwrap().is_none());
        std::fs::write(&file, "not a pid\n").unwrap();
        assert_eq!(reap(&file), Reaped::Gone);
        assert!(!file.exists());
        child.kill().unwrap();
        child.wait().unwrap();
        std::fs::remove_dir(file.parent().unwrap()).unwrap();
    }
}
