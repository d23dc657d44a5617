//! The subordinate id files (/etc/subuid, /etc/subgid) as newuidmap reads
//! them: the ranges an ordinary user's sandboxes map their ids 1-65535 to.
//! Adding a range is host setup's (`hostsetup::subid`).

/// One `name:start:count` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// A login name or a numeric uid.
    pub owner: String,
    /// First id.
    pub start: u64,
    /// Number of ids.
    pub count: u64,
}

/// The entries of a subuid/subgid file; malformed lines and comments are skipped.
pub fn parse(text: &str) -> Vec<Entry> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.trim().splitn(3, ':');
            let owner = f.next().filter(|o| !o.is_empty() && !o.starts_with('#'))?;
            let start = f.next()?.parse().ok()?;
            let count = f.next()?.parse().ok()?;
            Some(Entry { owner: owner.to_string(), start, count })
        })
        .collect()
}
