//! Per-sandbox command history: the last [`AUDIT_LOG_SIZE`] commands with
//! their exit codes and durations, with obvious secrets redacted before they
//! are stored (so they never reach `history` output or any later persistence).
use std::{
    collections::VecDeque,
    sync::LazyLock,
    time::{Duration, SystemTime},
};

use regex::Regex;

/// Entries kept per sandbox.
pub const AUDIT_LOG_SIZE: usize = 100;
/// Characters of a command kept per entry.
const MAX_COMMAND_CHARS: usize = 200;
const REDACTED: &str = "***";

/// One recorded command.
#[derive(Debug, Clone)]
pub struct AuditEntry {
    /// The command, redacted and cut to 200 characters.
    pub command: String,
    /// Exit code (-1 for a timeout).
    pub exit_code: i32,
    /// How long it ran.
    pub duration: Duration,
    /// When it finished.
    pub at: SystemTime,
}

/// A bounded, newest-last command log.
#[derive(Debug, Default)]
pub struct AuditLog {
    entries: VecDeque<AuditEntry>,
}

impl AuditLog {
    /// Record a command (redacted here, once, so nothing downstream sees the secret).
    pub fn record(&mut self, command: &str, exit_code: i32, duration: Duration) {
        if self.entries.len() == AUDIT_LOG_SIZE {
            self.entries.pop_front();
        }
        let command: String = redact(command).chars().take(MAX_COMMAND_CHARS).collect();
        self.entries.push_back(AuditEntry { command, exit_code, duration, at: SystemTime::now() });
    }

    /// Number of entries kept.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Every entry, oldest first.
    pub fn entries(&self) -> Vec<AuditEntry> {
        self.entries.iter().cloned().collect()
    }

    /// Replace the log with saved entries (oldest first), keeping the newest
    /// [`AUDIT_LOG_SIZE`].
    pub fn restore(&mut self, entries: Vec<AuditEntry>) {
        let skip = entries.len().saturating_sub(AUDIT_LOG_SIZE);
        // A file written before a pattern existed is redacted on the way in.
        self.entries =
            entries.into_iter().skip(skip).map(|e| AuditEntry { command: redact(&e.command), ..e }).collect();
    }

    /// The newest `limit` entries, newest first.
    pub fn newest(&self, limit: usize) -> Vec<AuditEntry> {
        self.entries.iter().rev().take(limit).cloned().collect()
    }
}

/// A secret value: quoted as a whole, or up to a space, quote or separator.
macro_rules! value {
    () => {
        r#"(?P<s>'[^']*'|"[^"]*"|[^\s'"&;|]+)"#
    };
}

/// Patterns whose matched secret part (capture group `s`) is replaced.
static SECRET_PATTERNS: LazyLock<Vec<Regex>> = LazyLock::new(|| {
    [
        // user:password@ in URLs
        r"(?i)[a-z][a-z0-9+.-]*://[^/\s:@]*:(?P<s>[^@\s/]+)@".to_string(),
        // Authorization headers, whatever the scheme (or none)
        concat!(r"(?i)authorization:\s*(?:(?:bearer|basic|token|digest|negotiate)\s+)?", value!()).to_string(),
        // NAME=value / NAME: value for secret-sounding names: *TOKEN*,
        // *SECRET*, *PASSWORD*, credentials, and KEY as a word of the name
        // (`API_KEY`, `key`, not `monkey` or `keyboard`)
        concat!(
            r"(?i)\b(?:[a-z0-9_]*(?:token|secret|passw(?:or)?d|credentials?|api[_-]?key|access[_-]?key|private[_-]?key)",
            r"[a-z0-9_]*|(?:[a-z0-9_]*_)?key(?:_[a-z0-9_]*)?)\s*[=:]\s*",
            value!()
        )
        .to_string(),
        // --password=value, --password value, --api-key value, --token …
        concat!(r"(?i)--(?:[a-z0-9-]*(?:token|secret|password|passwd|api-key|apikey))(?:=|\s+)", value!()).to_string(),
        // mysql-style -pSECRET (attached), for the MySQL/MariaDB clients only:
        // elsewhere -pX means something else (`ssh -p22`, `tar -pxf`)
        concat!(r"(?i)\b(?:mysql[a-z]*|mariadb[a-z-]*)\b[^;&|\n]*?\s-p", value!()).to_string(),
        // Well-known token shapes
        r"(?P<s>\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|glpat-[A-Za-z0-9_-]{20,}|sk-[A-Za-z0-9_-]{20,}|xox[abprs]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16})\b)".to_string(),
    ]
    .iter()
    .map(|p| Regex::new(p).expect("static redaction pattern"))
    .collect()
});

/// Replace obvious secrets in `text` with `***`.
pub fn redact(text: &str) -> String {
    let mut out = text.to_string();
    for re in SECRET_PATTERNS.iter() {
        let mut result = String::with_capacity(out.len());
        let mut last = 0;
        for caps in re.captures_iter(&out) {
            if let Some(m) = caps.name("s") {
                result.push_str(&out[last..m.start()]);
                result.push_str(REDACTED);
                last = m.end();
            }
        }
        result.push_str(&out[last..]);
        out = result;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_common_secret_shapes() {
        let cases = [
            ("git clone https://bob:hunter2@example.com/r.git", "hunter2"),
            ("curl -H 'Authorization: Bearer abc.def.ghi' x", "abc.def.ghi"),
            ("export GITHUB_TOKEN=ghp_aaaaaaaaaaaaaaaaaaaaaaaa", "ghp_aaaa"),
            ("mysql --password=s3cr3t -u root", "s3cr3t"),
            ("AWS_SECRET_ACCESS_KEY='wJalrXUtnFEMI' aws s3 ls", "wJalrXUtnFEMI"),
            ("echo sk-proj-abcdefghijklmnopqrstuvwxyz0123", "sk-proj-abc"),
            ("deploy --api-key xyz789", "xyz789"),
            ("mysql -u root -psecretpw db", "secretpw"),
            ("mysqldump -h h -pPa55 --all-databases > x", "Pa55"),
            ("mysql --password secretpw", "secretpw"),
            ("mysql --password='two words' db", "two words"),
            ("curl 'https://x/api?token=abc123&q=1'", "abc123"),
            ("curl -H 'Authorization: abc.def' x", "abc.def"),
            ("curl -H \"authorization: token t0k\" x", "t0k"),
            ("FOO_TOKEN=x1y2 ./run", "x1y2"),
            ("MY_SECRET=s1 DB_PASSWORD=\"p w\" API_KEY=k1 cmd", "s1"),
            ("DB_PASSWORD=\"p w\" cmd", "p w"),
            ("API_KEY=k1k1 cmd", "k1k1"),
            ("export key=kv9", "kv9"),
            ("python: password = 'hunter2'", "hunter2"),
        ];
        for (input, secret) in cases {
            let r = redact(input);
            assert!(!r.contains(secret), "{input:?} -> {r:?}");
            assert!(r.contains(REDACTED), "{input:?} -> {r:?}");
        }
        assert_eq!(redact("echo hello world"), "echo hello world");
        // The rest of the command stays readable, and look-alikes are left alone.
        assert_eq!(redact("mysql -u root -psecretpw db"), "mysql -u root -p*** db");
        assert_eq!(redact("FOO_TOKEN=x1y2 ./run --verbose"), "FOO_TOKEN=*** ./run --verbose");
        for plain in ["ssh -p22 host", "tar -pxf a.tar", "mkdir -p /x", "monkey=1 keyboard=2 ./go", "sort -k2 f"] {
            assert_eq!(redact(plain), plain);
        }
    }

    #[test]
    fn log_is_bounded_and_newest_first() {
        let mut log = AuditLog::default();
        for i in 0..150 {
            log.record(&format!("cmd {i}"), 0, Duration::ZERO);
        }
        assert_eq!(log.len(), AUDIT_LOG_SIZE);
        let newest = log.newest(2);
        assert_eq!(newest[0].command, "cmd 149");
        assert_eq!(newest[1].command, "cmd 148");
        log.record(&"x".repeat(500), 1, Duration::ZERO);
        assert_eq!(log.newest(1)[0].command.len(), MAX_COMMAND_CHARS);
    }
}
