//! Subordinate id ranges (/etc/subuid, /etc/subgid): the ids 1-65535 of a
//! user's sandboxes come from its range, mapped by newuidmap/newgidmap.
//! A missing range is added the way `useradd` would: 65536 ids from 100000
//! up, overlapping no other entry of either file.
use std::path::Path;

pub use sandbox_userns::subid::{Entry, parse};

use super::{HostSetupError, Outcome, User};

/// How many ids a user gets (useradd's SUB_UID_COUNT).
pub const COUNT: u64 = 65536;
/// Where ranges start (useradd's SUB_UID_MIN).
const MIN: u64 = 100_000;
/// Where they end (useradd's SUB_UID_MAX).
const MAX: u64 = 600_100_000;

/// The first range of `user` (by name or uid) with at least [`COUNT`] ids, as newuidmap reads it.
pub fn find<'a>(entries: &'a [Entry], user: &User) -> Option<&'a Entry> {
    let uid = user.uid.to_string();
    entries.iter().find(|e| (e.owner == user.name || e.owner == uid) && e.count >= COUNT)
}

/// The lowest start of [`COUNT`] free ids at or above 100000 that overlap
/// no entry of any of `files` (so the same range can go in both).
pub fn allocate(files: &[&[Entry]]) -> Option<u64> {
    let mut taken: Vec<(u64, u64)> =
        files.iter().flat_map(|f| f.iter()).map(|e| (e.start, e.start.saturating_add(e.count))).collect();
    taken.sort_unstable();
    let mut start = MIN;
    for (lo, hi) in taken {
        if lo >= start.saturating_add(COUNT) {
            break;
        }
        start = start.max(hi);
    }
    (start.saturating_add(COUNT) <= MAX).then_some(start)
}

/// Adds the missing subuid/subgid ranges of `user` with usermod, and
/// says if the tools that map them are missing.
pub fn ensure(user: &User, dry_run: bool) -> Result<Vec<Outcome>, HostSetupError> {
    let read = |p: &str| match std::fs::read_to_string(p) {
        Ok(t) => Ok(parse(&t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(HostSetupError::io(format!("read {p}"), e)),
    };
    let (uids, gids) = (read("/etc/subuid")?, read("/etc/subgid")?);
    let start = allocate(&[&uids, &gids]).ok_or(HostSetupError::NoFreeRange)?;
    let range = format!("{start}-{}", start + COUNT - 1);
    let mut out = Vec::new();
    for (file, entries, flag) in [("/etc/subuid", &uids, "--add-subuids"), ("/etc/subgid", &gids, "--add-subgids")] {
        if let Some(e) = find(entries, user) {
            out.push(Outcome::Done(format!("{file}: {} already has {}-{}", user.name, e.start, e.start + e.count - 1)));
        } else if dry_run {
            out.push(Outcome::Would(format!("{file}: add {range} for {} (usermod {flag} {range})", user.name)));
        } else {
            super::run_tool(usermod(), &[flag, &range, &user.name])?;
            out.push(Outcome::Did(format!("{file}: added {range} for {}", user.name)));
        }
    }
    // The ranges are of no use without the setuid tools that map them.
    for tool in ["newuidmap", "newgidmap"] {
        if sandbox_userns::find_in_path(tool).is_none() {
            out.push(Outcome::Missing(format!("{tool} not found: apt-get install uidmap")));
        }
    }
    Ok(out)
}

/// usermod lives in sbin, which an ordinary PATH may lack.
fn usermod() -> &'static str {
    ["/usr/sbin/usermod", "/sbin/usermod"].into_iter().find(|p| Path::new(p).exists()).unwrap_or("usermod")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user() -> User {
        User { name: "alice".into(), uid: 1001, gid: 1001 }
    }

    #[test]
    fn parses_entries_and_skips_junk() {
        let e = parse("root:100000:65536\n# comment\nbroken\nbob:x:1\n1001:300000:65536\n");
        assert_eq!(e.len(), 2);
        assert_eq!(e[1], Entry { owner: "1001".into(), start: 300_000, count: 65536 });
    }

    #[test]
    fn finds_by_name_or_uid_and_ignores_short_ranges() {
        let e = parse("alice:100000:10\n1001:300000:65536\n");
        assert_eq!(find(&e, &user()).map(|e| e.start), Some(300_000));
        assert!(find(&parse("bob:100000:65536\n"), &user()).is_none());
    }

    #[test]
    fn allocates_the_first_gap_free_in_both_files() {
        assert_eq!(allocate(&[&[], &[]]), Some(100_000));
        let uids = parse("root:100000:65536\nbob:165536:65536\n");
        let gids = parse("carol:231072:65536\n");
        assert_eq!(allocate(&[&uids, &gids]), Some(296_608));
        // A gap too small for 65536 ids is skipped; a big enough one is used.
        let gappy = parse("a:100000:1000\nb:110000:65536\nc:300000:10\n");
        assert_eq!(allocate(&[&gappy]), Some(175_536));
        let gap_fits = parse("a:300000:65536\n");
        assert_eq!(allocate(&[&gap_fits]), Some(100_000));
    }

    #[test]
    fn overlapping_and_unsorted_entries_are_all_avoided() {
        let e = parse("x:200000:100000\ny:100000:150000\n");
        assert_eq!(allocate(&[&e]), Some(300_000));
    }

    #[test]
    fn no_range_when_the_id_space_is_full() {
        let full = parse(&format!("all:{MIN}:{}\n", MAX - MIN));
        assert_eq!(allocate(&[&full]), None);
    }
}
