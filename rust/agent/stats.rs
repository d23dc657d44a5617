//! Resource usage as the guest sees it, for the `Stats` stream: the same
//! reading on every driver. CPU time and memory are summed over the
//! processes the agent can see (its pid namespace, or the whole guest of a
//! VM); network counters come from the guest's own interfaces. Limits and
//! OOM kills are the sandbox's cgroup's: in a vm's guest the agent reads its
//! group ([`super::group`]); elsewhere the helper's driver adds them from
//! the host.
use super::protocol::GuestStats;

/// Reads the guest's usage now.
pub fn read() -> GuestStats {
    // SAFETY: sysconf has no preconditions.
    let (tick, page) = unsafe { (libc::sysconf(libc::_SC_CLK_TCK), libc::sysconf(libc::_SC_PAGESIZE)) };
    let (tick_ns, page) =
        (1_000_000_000 / u64::try_from(tick).unwrap_or(100).max(1), u64::try_from(page).unwrap_or(4096));
    let mut stats = GuestStats::default();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let name = entry.file_name();
            let Some(pid) = name.to_str().filter(|n| n.bytes().all(|b| b.is_ascii_digit())) else { continue };
            let Some(p) = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok().and_then(|l| parse_stat(&l)) else {
                continue;
            };
            stats.cpu_usage_ns += p.ticks * tick_ns;
            stats.memory_used_bytes += p.rss_pages * page;
            stats.pids += p.threads;
        }
    }
    let dev = std::fs::read_to_string("/proc/net/dev").unwrap_or_default();
    (stats.net_rx_bytes, stats.net_tx_bytes) = net_bytes(&dev);
    stats.disk_used_bytes = writable_disk_used();
    stats.group = super::group::stats();
    stats
}

/// Bytes in use on the filesystem of a vm's writable disk, read at its
/// layer view (absent on the namespace driver, whose host measures its
/// layer itself): the disk's whole filesystem, so Docker's data, which
/// lives beside the layer on it, counts too.
fn writable_disk_used() -> u64 {
    match nix::sys::statfs::statfs(crate::LAYER_VIEW) {
        Ok(fs) => {
            let bsize = u64::try_from(fs.block_size()).unwrap_or(0);
            (fs.blocks().saturating_sub(fs.blocks_free())).saturating_mul(bsize)
        }
        Err(_) => 0,
    }
}

struct ProcStat {
    ticks: u64,
    threads: u64,
    rss_pages: u64,
}

/// CPU ticks, num_threads and rss from a `/proc/PID/stat` line. The ticks
/// are the process's own (utime, stime) and those of its children it
/// reaped (cutime, cstime): processes that already exited count too, once,
/// in whoever waited for them (the agent, a shell, PID 1). The command name
/// may hold spaces and parentheses, so fields are counted from its last `)`.
fn parse_stat(line: &str) -> Option<ProcStat> {
    let rest = &line[line.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state(3) … utime(14) stime(15) cutime(16) cstime(17)
    // … num_threads(20) … rss(24).
    let n = |i: usize| f.get(i - 3).and_then(|v| v.parse::<u64>().ok());
    Some(ProcStat { ticks: n(14)? + n(15)? + n(16)? + n(17)?, threads: n(20)?, rss_pages: n(24)? })
}

/// Received and sent bytes summed over every interface but `lo`.
pub fn net_bytes(dev: &str) -> (u64, u64) {
    dev.lines()
        .skip(2)
        .filter_map(|l| {
            let (name, counters) = l.split_once(':')?;
            if name.trim() == "lo" {
                return None;
            }
            let fields: Vec<u64> = counters.split_whitespace().map(|f| f.parse().unwrap_or(0)).collect();
            Some((*fields.first()?, *fields.get(8)?))
        })
        .fold((0, 0), |(rx, tx), (r, t)| (rx + r, tx + t))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn net_dev_sums_everything_but_loopback() {
        let dev = "Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:  999999      10    0    0    0     0          0         0   999999      10    0    0    0     0       0          0
  eth0:    1500      12    0    0    0     0          0         0      700       9    0    0    0     0       0          0
  eth1:      10       1    0    0    0     0          0         0        5       1    0    0    0     0       0          0
";
        assert_eq!(net_bytes(dev), (1510, 705));
    }

    #[test]
    fn stat_lines_with_odd_names_are_parsed() {
        let line =
            "42 (a) b (c)) S 1 42 42 0 -1 4194560 100 0 0 0 7 5 0 0 20 0 3 0 1000 12345678 250 18446744073709551615";
        let p = parse_stat(line).unwrap();
        assert_eq!((p.ticks, p.threads, p.rss_pages), (12, 3, 250));
    }

    #[test]
    fn this_process_is_counted() {
        let s = read();
        assert!(s.pids >= 1 && s.memory_used_bytes > 0);
    }
}
