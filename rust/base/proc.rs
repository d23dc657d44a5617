//! What /proc/<pid>/stat says of a process (Linux; elsewhere every answer
//! is `None`).

/// Field `n` of /proc/<pid>/stat as proc(5) numbers them (3, the state,
/// onwards), counted after the parenthesised command name, which may itself
/// hold spaces and parentheses.
pub fn stat_field(pid: u32, n: usize) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(n.checked_sub(3)?).map(String::from)
}

/// The one-letter state (`R`, `S`, `D`, `T`, `Z`, ...).
pub fn state(pid: u32) -> Option<char> {
    stat_field(pid, 3)?.chars().next()
}

/// The parent's pid.
pub fn parent(pid: u32) -> Option<u32> {
    stat_field(pid, 4)?.parse().ok()
}

/// The start time, in clock ticks since boot: with the pid, it names one
/// process, never another that reused the pid.
pub fn start_time(pid: u32) -> Option<String> {
    stat_field(pid, 22)
}

/// The children of every thread of `pid` (each thread's `children` list).
pub fn children(pid: u32) -> Vec<u32> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten();
    tasks
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|list| list.split_whitespace().filter_map(|c| c.parse().ok()).collect::<Vec<u32>>())
        .collect()
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn fields_of_this_process() {
        let me = std::process::id();
        // The process's state is its main thread's: the harness's, waiting.
        assert!(matches!(state(me), Some('R' | 'S')), "{:?}", state(me));
        assert_eq!(parent(me), Some(std::os::unix::process::parent_id()));
        assert!(start_time(me).is_some_and(|t| t.parse::<u64>().is_ok()));
        assert_eq!(stat_field(me, 2), None, "the command name is not a field here");
        assert_eq!(state(u32::MAX), None);
        let mut child = std::process::Command::new("sleep").arg("60").spawn().unwrap();
        assert!(children(me).contains(&child.id()));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!children(me).contains(&child.id()));
    }
}
