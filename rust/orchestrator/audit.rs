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
    /// Record a command (redacted here, once, so nothing downstream sees the
    /// secret); returns the entry as kept.
    pub fn record(&mut self, command: &str, exit_code: i32, duration: Duration) -> AuditEntry {
        if self.entries.len() == AUDIT_LOG_SIZE {
            self.entries.pop_front();
        }
        let command: String = redact(command).chars().take(MAX_COMMAND_CHARS).collect();
        let entry = AuditEntry { command, exit_code, duration, at: SystemTime::now() };
        self.entries.push_back(entry.clone());
        entry
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

/// `user:secret` after a flag, keeping the user (`curl -u alice:***`): the
/// whole pair quoted either way, or bare up to a space, quote or separator.
macro_rules! user_secret {
    () => {
        r#"(?:'[^':]*:(?P<s1>[^']*)'|"[^":]*:(?P<s2>[^"]*)"|[^\s'":]*:(?P<s3>[^\s'"&;|]+))"#
    };
}

/// Header names whose whole value is a secret; a quoted header
/// (`-H 'Cookie: a=1; b=2'`) is redacted to its closing quote, since cookie
/// lists hold `;` and spaces.
macro_rules! secret_headers {
    () => {
        r"(?:set-cookie|cookie|proxy-authorization|x-api-key|x-auth-token)"
    };
}

/// Patterns whose secret parts (capture groups named `s`, `s1`, `s2`…) are
/// replaced.
static SECRET_PATTERNS: LazyLock<Vec<Regex>> = LazyLock::new(|| {
    [
        // user:password@ in URLs
        r"(?i)[a-z][a-z0-9+.-]*://[^/\s:@]*:(?P<s>[^@\s/]+)@".to_string(),
        // a bare token as the URL's user (`https://TOKEN@host/…`): git and
        // the forges take it as the credential. Web URLs only, so that
        // `ssh://git@host` keeps its user.
        r#"(?i)\bhttps?://(?P<s>[^/\s:@'"?#]+)@"#.to_string(),
        // Authorization headers, whatever the scheme (or none)
        concat!(r"(?i)authorization:\s*(?:(?:bearer|basic|token|digest|negotiate)\s+)?", value!()).to_string(),
        // Cookie, API-key and proxy headers, quoted whole or not (also the
        // `"Cookie": "…"` of a JSON or Python dict)
        concat!(
            r"(?i)'",
            secret_headers!(),
            r":\s*(?P<s1>[^']*)'|",
            r#"""#,
            secret_headers!(),
            r#":\s*(?P<s2>[^"]*)"|\b"#,
            secret_headers!(),
            r#"['"]?:\s*"#,
            value!()
        )
        .to_string(),
        // NAME=value / NAME: value for secret-sounding names: *TOKEN*,
        // *SECRET*, *PASSWORD*, credentials, and KEY, PAT (personal access
        // token) or PASS as a word of the name (`API_KEY`, `GH_PAT`,
        // `SSHPASS`; not `monkey`, `keyboard`, `PATH` or `bypass`)
        concat!(
            r"(?i)\b(?:[a-z0-9_]*(?:token|secret|passw(?:or)?d|credentials?|api[_-]?key|access[_-]?key|private[_-]?key)",
            r"[a-z0-9_]*|sshpass|(?:[a-z0-9_]*_)?(?:key|pat|pass)(?:_[a-z0-9_]*)?)\s*[=:]\s*",
            value!()
        )
        .to_string(),
        // --password=value, --password value, --api-key value, --token …
        concat!(
            r"(?i)--(?:[a-z0-9-]*(?:token|secret|password|passwd|api-key|apikey|credentials?|access-key))(?:=|\s+)",
            value!()
        )
        .to_string(),
        // mysql-style -pSECRET (attached), for the MySQL/MariaDB clients only:
        // elsewhere -pX means something else (`ssh -p22`, `tar -pxf`)
        concat!(r"(?i)\b(?:mysql[a-z]*|mariadb[a-z-]*)\b[^;&|\n]*?\s-p", value!()).to_string(),
        // sshpass -p SECRET / -pSECRET (its other flags take no secret)
        concat!(r"(?i)\bsshpass\b[^;&|\n]*?\s-p\s*", value!()).to_string(),
        // curl -u / --user user:password (elsewhere `-u 1000:1000` is a uid)
        concat!(r"(?i)\bcurl\b[^;&|\n]*?\s(?:-u\s*|--user(?:=|\s+))", user_secret!()).to_string(),
        // Well-known token shapes, wherever they appear: GitHub, GitLab,
        // OpenAI/Anthropic, Slack, AWS key ids, npm, Hugging Face, Stripe,
        // and JWTs (header.payload.signature, both JSON parts start `{"`)
        concat!(
            r"(?P<s>\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|glpat-[A-Za-z0-9_-]{20,}",
            r"|sk-[A-Za-z0-9_-]{20,}|xox[abprs]-[A-Za-z0-9-]{10,}|(?:AKIA|ASIA)[0-9A-Z]{16}|npm_[A-Za-z0-9]{30,}",
            r"|hf_[A-Za-z0-9]{30,}|[sr]k_(?:live|test)_[A-Za-z0-9]{16,}",
            r"|eyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*)\b)"
        )
        .to_string(),
    ]
    .iter()
    .map(|p| Regex::new(p).expect("static redaction pattern"))
    .collect()
});

/// Replace obvious secrets in `text` with `***`. The one redaction of
/// commands: history, and the state file that persists it, store only its
/// output.
pub fn redact(text: &str) -> String {
    let mut out = text.to_string();
    for re in SECRET_PATTERNS.iter() {
        let secret_groups: Vec<usize> = re
            .capture_names()
            .enumerate()
            .filter(|(_, name)| name.is_some_and(|n| n.starts_with('s')))
            .map(|(i, _)| i)
            .collect();
        let mut result = String::with_capacity(out.len());
        let mut last = 0;
        for caps in re.captures_iter(&out) {
            // Alternatives name their secret group apart; at most one matched.
            for m in secret_groups.iter().filter_map(|&i| caps.get(i)) {
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
            ("curl -u alice:pw1 http://x", "pw1"),
            ("curl --user alice:pw2 http://x", "pw2"),
            ("curl --user='alice:p w3' http://x", "p w3"),
            ("curl -ualice:pw4 http://x", "pw4"),
            ("sshpass -p pw5 ssh host", "pw5"),
            ("sshpass -ppw6 ssh host", "pw6"),
            ("SSHPASS=pw7 sshpass -e ssh host", "pw7"),
            ("git clone https://tok8@github.com/o/r.git", "tok8"),
            ("curl https://u:pw9@host/x", "pw9"),
            ("curl -H 'Cookie: sid=ck10; other=ck11' x", "ck1"),
            ("curl -H \"set-cookie: sid=ck12\" x", "ck12"),
            ("curl -H Cookie:sid=ck13 x", "ck13"),
            ("curl -H 'X-Api-Key: xk14' x", "xk14"),
            ("curl -H 'Proxy-Authorization: Basic pa15' x", "pa15"),
            ("requests.get(u, headers={\"Cookie\": \"sid=ck16\"})", "ck16"),
            ("export GH_PAT=pat17", "pat17"),
            ("GITHUB_PAT=pat18 ./push", "pat18"),
            ("export SENDGRID_KEY=k19", "k19"),
            ("export OPENAI_API_KEY_2=k20", "k20"),
            ("export GOOGLE_CREDENTIAL_JSON=c21", "c21"),
            ("export AWS_SECRET_ACCESS_KEY=a22", "a22"),
            ("PGPASSWORD=pg23 psql -h db", "pg23"),
            ("tool --token t24", "t24"),
            ("tool --api-key=t25", "t25"),
            ("tool --client-secret t26", "t26"),
            ("echo ghp_0123456789abcdefghijABCDEF", "ghp_0123"),
            ("echo github_pat_11ABCDEFG0123456789_abcdefghij", "github_pat_11"),
            ("echo glpat-abcdefghij0123456789", "glpat-abc"),
            ("echo xoxb-1234567890-abcdef", "xoxb-123"),
            ("echo sk-ant-api03-abcdefghijklmnopqrstuvwxyz", "sk-ant"),
            ("aws configure set aws_access_key_id AKIAIOSFODNN7EXAMPLE", "AKIAIOSFODNN7EXAMPLE"),
            ("echo eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.sigSIGsig", "eyJhbGci"),
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
        // The user of a `user:password` pair stays.
        assert_eq!(redact("curl -u alice:pw1 http://x"), "curl -u alice:*** http://x");
        assert_eq!(redact("curl -s --user 'alice:pw2' x"), "curl -s --user 'alice:***' x");
        assert_eq!(redact("git clone https://tok@h/r.git"), "git clone https://***@h/r.git");
        assert_eq!(redact("curl -H 'Cookie: a=1; b=2' x"), "curl -H 'Cookie: ***' x");
        let plain = [
            "ssh -p22 host",
            "tar -pxf a.tar",
            "mkdir -p /x",
            "cp -p a b",
            "ls -p",
            "grep -p x f",
            "monkey=1 keyboard=2 ./go",
            "sort -k2 f",
            "export PATH=/usr/bin:/bin",
            "bypass=1 ./go",
            "docker run -u 1000:1000 img",
            "curl -u alice http://x",
            "git clone git@github.com:o/r.git",
            "git clone ssh://git@github.com/o/r.git",
            "curl https://example.com/a@b",
            "echo task-abcdefghijklmnopqrstuvwxyz",
        ];
        for plain in plain {
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
