//! Processes a helper starts that can outlive it (a namespace VM's
//! launcher, a vm's qemu) are recorded in a file beside their VM: their
//! pid and start time, and their helper's. A helper starting after one
//! that died reads these records and kills what the dead one left
//! running; what a live helper sharing the directories runs is left alone.
use std::path::Path;

use sandbox_base::proc::{parent, start_time, state};

pub use crate::driver::Orphan;

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
    if let Some(start) = start_time(pid) {
        record_owned(file, &Orphan { pid, start });
    }
}

/// Records `process` as this helper's (an orphan it adopted), under the
/// start time it was found with: read again, it could name a process that
/// took the pid since.
pub fn record_owned(file: &Path, process: &Orphan) {
    let Some(own) = start_time(std::process::id()) else { return };
    let line = format!("{} {} {} {own}\n", process.pid, process.start, std::process::id());
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
    // A zombie has ended: a killed helper its parent has not reaped yet
    // owns nothing any more.
    let running = |pid: u32, start: Option<&&str>| {
        start.is_some_and(|s| start_time(pid).as_deref() == Some(*s)) && state(pid) != Some('Z')
    };
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

/// The process recorded in `file` if it runs and the helper that started
/// it is gone: one a new helper may adopt.
pub fn orphan(file: &Path) -> Option<Orphan> {
    read_record(file).filter(|r| !r.owned).map(|r| Orphan { pid: r.pid, start: r.start })
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
        // Its children first: a launcher's is the sandbox's PID 1, which
        // code in the sandbox can keep from dying with its launcher (its
        // parent-death signal cleared through ptrace). Each pidfd names
        // the child if the pid is still the process's child once opened.
        let children: Vec<_> = sandbox_base::proc::children(pid)
            .into_iter()
            .filter_map(|c| crate::driver::network::pidfd_open(c as i32).ok().filter(|_| parent(c) == Some(pid)))
            .collect();
        for child in &children {
            crate::driver::network::pidfd_kill(child, libc::SIGKILL);
        }
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
    fn a_helper_killed_but_not_reaped_owns_nothing() {
        let file = record_file("a_helper_kil");
        let mut child = sleeper();
        let mut helper = sleeper();
        let owner = format!("{} {}", helper.id(), start_time(helper.id()).unwrap());
        helper.kill().unwrap();
        while state(helper.id()) != Some('Z') {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        std::fs::write(&file, format!("{} {} {owner}\n", child.id(), start_time(child.id()).unwrap())).unwrap();
        assert_eq!(orphan(&file).map(|o| o.pid), Some(child.id()));
        assert_eq!(reap(&file), Reaped::Killed(child.id()));
        child.wait().unwrap();
        helper.wait().unwrap();
        std::fs::remove_dir(file.parent().unwrap()).unwrap();
    }

    #[test]
    fn a_killed_leftover_takes_its_children_first() {
        // A launcher and its PID 1, which need not die with it (code in a
        // sandbox can clear its parent-death signal): a shell and its sleep.
        let file = record_file("a_killed_lef");
        let mut shell = std::process::Command::new("sh").args(["-c", "sleep 60 & wait"]).spawn().unwrap();
        let child = loop {
            if let Some(c) = sandbox_base::proc::children(shell.id()).first() {
                break *c;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        let child_start = start_time(child).unwrap();
        let mut helper = sleeper();
        let owner = format!("{} {}", helper.id(), start_time(helper.id()).unwrap());
        helper.kill().unwrap();
        helper.wait().unwrap();
        std::fs::write(&file, format!("{} {} {owner}\n", shell.id(), start_time(shell.id()).unwrap())).unwrap();
        assert_eq!(reap(&file), Reaped::Killed(shell.id()));
        shell.wait().unwrap();
        // Reaped by init (its parent is gone): gone, or a zombie for a moment.
        let gone = || {
            start_time(child).as_deref() != Some(child_start.as_str()) || sandbox_base::proc::state(child) == Some('Z')
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !gone() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(gone(), "the leftover's child lives on");
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
