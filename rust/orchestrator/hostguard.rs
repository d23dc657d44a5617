//! The host write guard: files a sandbox may not put on the host because the
//! host would run or trust them on its own, without anyone choosing to run
//! them (issue 22). A `pre-commit` downloaded into `.git/hooks/` runs at the
//! next `git commit`; a `.sandbox-mcp.toml` collected into the project
//! changes the policy of every later sandbox.
//!
//! Scope: a place is denied when something on the host reads or runs what is
//! there *implicitly* — git (its directory, config, attributes, submodules and
//! the hook managers that run on commit), login and interactive shells, tools
//! that act on entering a directory (direnv, mise), editors and IDEs that run
//! tasks or trust settings from a folder, AI agents that take a file as their
//! own instructions or settings (hooks, MCP servers), credentials and the
//! helpers they name (ssh, gpg, cloud and cluster tools), package managers'
//! registries and wrappers, directories on the PATH, and sandbox-mcp's own
//! configuration. Files a user runs by choice (`Makefile`, `package.json`,
//! scripts) are the ordinary product of sandbox work and stay writable: the
//! user reviews them before running them. `.env` stays writable too: tools
//! read it as data, and it is often what a sandbox was asked to produce.
//!
//! A rule is a sequence of path components (`.git`, `.config/fish`) that
//! matches wherever it appears in the destination: relative to the host root
//! and in the absolute path (so `~/.ssh` is caught when the root is the home
//! directory). Components are compared case-folded, with the code points
//! HFS+ ignores removed (git's CVE-2014-9390), because macOS and other
//! case-insensitive file systems open `.GIT/hooks` as `.git/hooks`. User rules
//! come from the user's config file (`host_write_deny`, `host_write_allow`),
//! never from the project file: a project file is something a sandbox or a
//! cloned repository could have written.
//!
//! Files from a sandbox also lose their exec bits unless the call asks for
//! them ([`ExecBits`]), and never keep setuid, setgid or sticky bits.
use std::{
    fmt,
    path::{Component, Path, PathBuf},
    sync::{Arc, LazyLock},
};

/// Why a built-in rule exists: the sentence an agent reads in a refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// git's own files and what git obeys in a work tree.
    Git,
    /// Hook managers that run project files on commit.
    CommitHooks,
    /// sandbox-mcp's own configuration.
    OwnPolicy,
    /// Shell start-up files.
    Shell,
    /// Files a tool runs on entering a directory or at login.
    AutoRun,
    /// Editor and IDE settings.
    Editor,
    /// AI agent instructions and settings.
    Agent,
    /// Credentials and their helpers.
    Credentials,
    /// Package manager configuration.
    Packages,
    /// Directories on the PATH.
    OnPath,
    /// A rule from `host_write_deny`.
    User,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Git => "git runs hooks and obeys settings found there, so it could run on the next git command",
            Self::CommitHooks => "a hook manager runs what it names on the next git commit",
            Self::OwnPolicy => "it is sandbox-mcp's own configuration and would change what later sandboxes may do",
            Self::Shell => "a shell runs it when it starts",
            Self::AutoRun => "a tool runs it on its own, on entering the directory or at login",
            Self::Editor => "an editor or IDE runs tasks and trusts settings found there",
            Self::Agent => "an AI agent on the host takes it as its own instructions or settings (hooks, MCP servers)",
            Self::Credentials => "ssh, gpg, cloud and cluster tools trust it and run the helpers it names",
            Self::Packages => "a package manager trusts it (registries, indexes, the shells and wrappers it runs)",
            Self::OnPath => "programs there run in place of commands on the PATH",
            Self::User => "host_write_deny in the config file denies it",
        })
    }
}

/// The built-in rules. A trailing `/` marks a directory for readers; matching
/// is the same (the name itself and everything below it).
const BUILTIN: &[(&str, Reason)] = &[
    // A `.git` file (a gitdir pointer) is as dangerous as the directory.
    (".git/", Reason::Git),
    (".gitconfig", Reason::Git),
    (".config/git/", Reason::Git),
    (".gitmodules", Reason::Git),
    // Selects filter, diff and merge drivers the host's git runs on files.
    (".gitattributes", Reason::Git),
    (".githooks/", Reason::CommitHooks),
    (".husky/", Reason::CommitHooks),
    (".pre-commit-config.yaml", Reason::CommitHooks),
    ("lefthook.yml", Reason::CommitHooks),
    (".lefthook.yml", Reason::CommitHooks),
    (".sandbox-mcp.toml", Reason::OwnPolicy),
    (".config/sandbox-mcp/", Reason::OwnPolicy),
    (".bashrc", Reason::Shell),
    (".bash_profile", Reason::Shell),
    (".bash_login", Reason::Shell),
    (".bash_logout", Reason::Shell),
    (".bash_aliases", Reason::Shell),
    (".profile", Reason::Shell),
    (".zshrc", Reason::Shell),
    (".zshenv", Reason::Shell),
    (".zprofile", Reason::Shell),
    (".zlogin", Reason::Shell),
    (".zlogout", Reason::Shell),
    (".cshrc", Reason::Shell),
    (".tcshrc", Reason::Shell),
    (".login", Reason::Shell),
    (".kshrc", Reason::Shell),
    (".mkshrc", Reason::Shell),
    (".inputrc", Reason::Shell),
    (".config/fish/", Reason::Shell),
    (".envrc", Reason::AutoRun),
    (".mise.toml", Reason::AutoRun),
    ("mise.toml", Reason::AutoRun),
    (".xprofile", Reason::AutoRun),
    (".xinitrc", Reason::AutoRun),
    (".xsessionrc", Reason::AutoRun),
    (".config/autostart/", Reason::AutoRun),
    (".config/systemd/", Reason::AutoRun),
    ("Library/LaunchAgents/", Reason::AutoRun),
    (".vscode/", Reason::Editor),
    (".idea/", Reason::Editor),
    (".vimrc", Reason::Editor),
    (".exrc", Reason::Editor),
    (".nvimrc", Reason::Editor),
    (".nvim.lua", Reason::Editor),
    (".emacs", Reason::Editor),
    (".emacs.d/", Reason::Editor),
    // Agents load these at every session start as the user's own words or
    // settings: text from a sandbox there is a prompt injection with the
    // user's authority, and settings can add hooks and MCP servers (commands).
    (".claude/", Reason::Agent),
    (".cursor/", Reason::Agent),
    (".codex/", Reason::Agent),
    (".gemini/", Reason::Agent),
    (".mcp.json", Reason::Agent),
    ("CLAUDE.md", Reason::Agent),
    ("CLAUDE.local.md", Reason::Agent),
    ("AGENTS.md", Reason::Agent),
    (".cursorrules", Reason::Agent),
    (".ssh/", Reason::Credentials),
    (".gnupg/", Reason::Credentials),
    (".netrc", Reason::Credentials),
    (".aws/", Reason::Credentials),
    (".kube/", Reason::Credentials),
    (".docker/", Reason::Credentials),
    (".npmrc", Reason::Packages),
    (".yarnrc", Reason::Packages),
    (".yarnrc.yml", Reason::Packages),
    (".pypirc", Reason::Packages),
    ("pip.conf", Reason::Packages),
    // `.cargo/config.toml` sets runners and wrappers; `~/.cargo/bin` is on the PATH.
    (".cargo/", Reason::Packages),
    (".local/bin/", Reason::OnPath),
];

/// A denied place.
#[derive(Debug, Clone)]
struct Rule {
    /// As written (for messages and the allow list).
    pattern: String,
    /// Folded components; `*` and `?` are wildcards within one component.
    parts: Vec<String>,
    reason: Reason,
}

impl Rule {
    fn parse(pattern: &str, reason: Reason) -> Result<Self, String> {
        let trimmed = pattern.trim().trim_end_matches('/');
        if trimmed.starts_with('/') || trimmed.starts_with('~') {
            return Err("rules match anywhere in a path; write it without a leading / or ~".into());
        }
        let parts: Vec<String> = trimmed.split('/').map(fold).collect();
        if parts.iter().any(|p| p.is_empty() || p == "." || p == ".." || p.contains('\0')) {
            return Err("must be path components separated by / (no empty, . or .. components)".into());
        }
        Ok(Self { pattern: pattern.trim().to_string(), parts, reason })
    }

    /// Whether the folded `components` contain this rule's parts in a row.
    fn matches(&self, components: &[String]) -> bool {
        components.windows(self.parts.len()).any(|w| w.iter().zip(&self.parts).all(|(c, p)| wildcard(p, c)))
    }
}

/// `name` as a case-insensitive file system compares it: lowercase, long s
/// as s, and without the code points HFS+ ignores in names (the list git
/// checks for `.git`), so `.G\u{200c}IT` is `.git`.
fn fold(name: &str) -> String {
    const IGNORED: &[char] = &[
        '\u{200c}', '\u{200d}', '\u{200e}', '\u{200f}', '\u{202a}', '\u{202b}', '\u{202c}', '\u{202d}', '\u{202e}',
        '\u{206a}', '\u{206b}', '\u{206c}', '\u{206d}', '\u{206e}', '\u{206f}', '\u{feff}',
    ];
    name.chars()
        .filter(|c| !IGNORED.contains(c))
        .flat_map(char::to_lowercase)
        .map(|c| if c == 'ſ' { 's' } else { c })
        .collect()
}

/// Whether `name` matches `pattern`, where `*` is any run of characters and
/// `?` one character.
fn wildcard(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    // Classic two-pointer glob: remember the last `*` and retry from there.
    let (mut i, mut j, mut star, mut mark) = (0, 0, None, 0);
    while j < n.len() {
        if i < p.len() && (p[i] == '?' || p[i] == n[j]) {
            i += 1;
            j += 1;
        } else if i < p.len() && p[i] == '*' {
            star = Some(i);
            mark = j;
            i += 1;
        } else if let Some(s) = star {
            i = s + 1;
            mark += 1;
            j = mark;
        } else {
            return false;
        }
    }
    p[i..].iter().all(|c| *c == '*')
}

/// The folded plain components of `path`.
fn components(path: &Path) -> Vec<String> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(fold(&n.to_string_lossy())),
            _ => None,
        })
        .collect()
}

/// A rule in the config file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum GuardConfigError {
    /// A pattern that is not a component sequence.
    #[error("config {key}: {pattern:?}: {why}")]
    BadPattern {
        /// `host_write_deny` or `host_write_allow`.
        key: &'static str,
        /// The pattern.
        pattern: String,
        /// What is wrong with it.
        why: String,
    },
    /// An allow entry that names no deny rule (a typo would otherwise
    /// silently leave the rule in force).
    #[error("config host_write_allow: {0:?} is not a deny rule; the rules are: {1}")]
    UnknownRule(String, String),
}

/// Why one write was refused. Shown after the path it concerns.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{reason} (rule \"{rule}\"); to allow it, add \"{rule}\" to host_write_allow in {config}")]
pub struct Refusal {
    /// The rule's pattern.
    pub rule: String,
    /// Why the rule exists.
    pub reason: Reason,
    /// The config file that can allow it.
    pub config: String,
}

/// The rules in force for one configuration.
#[derive(Debug, Clone)]
pub struct HostGuard {
    rules: Vec<Rule>,
    /// The user's config file, named in refusals.
    config: String,
}

/// The built-in rules, for host paths opened without a configuration
/// (unit tests, and any `Dir` not reached through the host roots).
static BUILTIN_GUARD: LazyLock<Arc<HostGuard>> = LazyLock::new(|| Arc::new(HostGuard::builtin("the config file")));

impl HostGuard {
    /// The built-in rules, naming `config` in refusals.
    fn builtin(config: &str) -> Self {
        let rules = BUILTIN.iter().map(|(p, r)| Rule::parse(p, *r).expect("built-in rules parse")).collect();
        Self { rules, config: config.to_string() }
    }

    /// The shared built-in guard.
    pub fn shared_builtin() -> Arc<Self> {
        BUILTIN_GUARD.clone()
    }

    /// The built-in rules plus `deny`, minus the rules `allow` names
    /// (compared case-folded, a trailing `/` ignored), for the config file
    /// at `config`.
    pub fn new(deny: &[String], allow: &[String], config: &Path) -> Result<Self, GuardConfigError> {
        let mut guard = Self::builtin(&config.display().to_string());
        for pattern in deny {
            let rule = Rule::parse(pattern, Reason::User).map_err(|why| GuardConfigError::BadPattern {
                key: "host_write_deny",
                pattern: pattern.clone(),
                why,
            })?;
            guard.rules.push(rule);
        }
        for pattern in allow {
            let wanted = Rule::parse(pattern, Reason::User)
                .map_err(|why| GuardConfigError::BadPattern { key: "host_write_allow", pattern: pattern.clone(), why })?
                .parts;
            let before = guard.rules.len();
            guard.rules.retain(|r| r.parts != wanted);
            if guard.rules.len() == before {
                let names: Vec<&str> = guard.rules.iter().map(|r| r.pattern.as_str()).collect();
                return Err(GuardConfigError::UnknownRule(pattern.clone(), names.join(" ")));
            }
        }
        Ok(guard)
    }

    /// The first rule that denies writing at any of `paths` (spellings of
    /// one destination: as given and as resolved).
    pub fn check(&self, paths: &[&Path]) -> Result<(), Refusal> {
        for path in paths {
            let parts = components(path);
            if let Some(rule) = self.rules.iter().find(|r| r.matches(&parts)) {
                return Err(Refusal { rule: rule.pattern.clone(), reason: rule.reason, config: self.config.clone() });
            }
        }
        Ok(())
    }
}

/// Whether a file from a sandbox keeps its exec bits on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecBits {
    /// Drop them (the default: nothing from a sandbox is runnable by accident).
    Strip,
    /// Keep them (the call asked with `executable`).
    Keep,
}

impl ExecBits {
    /// From a tool's `executable` argument.
    pub fn from_flag(executable: bool) -> Self {
        if executable { Self::Keep } else { Self::Strip }
    }

    /// The permission bits a sandbox file with `mode` gets on the host
    /// (before the umask): never setuid, setgid or sticky; exec bits only
    /// when kept.
    pub fn apply(self, mode: u32) -> u32 {
        match self {
            Self::Strip => mode & 0o666,
            Self::Keep => mode & 0o777,
        }
    }
}

/// Entries of one call the guard kept off the host, grouped under the
/// topmost refused path (a refused `.git/` directory and the files below it
/// are one line).
#[derive(Debug, Default)]
pub struct Refused {
    groups: Vec<Group>,
    config: String,
}

#[derive(Debug)]
struct Group {
    path: PathBuf,
    refusal: Refusal,
    entries: u64,
}

impl Refused {
    /// Record that `path` (as shown to the caller) was not written.
    pub fn add(&mut self, path: PathBuf, refusal: Refusal) {
        if let Some(g) = self.groups.iter_mut().find(|g| path.starts_with(&g.path) && g.refusal.rule == refusal.rule) {
            g.entries += 1;
            return;
        }
        self.config = refusal.config.clone();
        self.groups.push(Group { path, refusal, entries: 1 });
    }

    /// Whether nothing was refused.
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// How many entries were refused.
    pub fn count(&self) -> u64 {
        self.groups.iter().map(|g| g.entries).sum()
    }
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.count();
        write!(f, "{n} {} refused by the host write guard: ", if n == 1 { "entry" } else { "entries" })?;
        for (i, g) in self.groups.iter().enumerate() {
            let sep = if i == 0 { "" } else { "; " };
            let more = if g.entries > 1 { format!(", {} entries", g.entries) } else { String::new() };
            write!(f, "{sep}{} ({}: rule \"{}\"{more})", g.path.display(), g.refusal.reason, g.refusal.rule)?;
        }
        write!(f, "; to allow a rule, add it to host_write_allow in {}", self.config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn denied(guard: &HostGuard, path: &str) -> Option<String> {
        guard.check(&[Path::new(path)]).err().map(|r| r.rule)
    }

    #[test]
    fn builtin_rules_match_anywhere_and_case_folded() {
        let g = HostGuard::shared_builtin();
        for (path, rule) in [
            ("proj/.git/hooks/pre-commit", ".git/"),
            ("/home/u/proj/.git", ".git/"),
            ("proj/.GIT/hooks/pre-commit", ".git/"),
            ("proj/.Git/config", ".git/"),
            ("proj/.g\u{200c}it/config", ".git/"),
            ("sub/.sandbox-mcp.toml", ".sandbox-mcp.toml"),
            ("/home/u/.SSH/authorized_keys", ".ssh/"),
            ("/home/u/.config/fish/config.fish", ".config/fish/"),
            ("/home/u/.CONFIG/Fish", ".config/fish/"),
            ("/home/u/.config/sandbox-mcp/config.toml", ".config/sandbox-mcp/"),
            ("proj/.vscode/tasks.json", ".vscode/"),
            ("proj/claude.md", "CLAUDE.md"),
            ("/home/u/.bashrc", ".bashrc"),
            ("/home/u/.\u{17f}sh/config", ".ssh/"),
            ("/home/u/.local/bin/git", ".local/bin/"),
        ] {
            assert_eq!(denied(&g, path).as_deref(), Some(rule), "{path}");
        }
        for path in [
            "proj/src/main.rs",
            "proj/.gitignore",
            "proj/git/hooks",
            "proj/.git-old/x",
            "proj/.github/workflows/ci.yml",
            "proj/.env",
            "/home/u/.local/share/x",
            "/home/u/.config/other/fish",
            "proj/Makefile",
            "proj/fish/.config",
        ] {
            assert_eq!(denied(&g, path), None, "{path}");
        }
    }

    #[test]
    fn config_adds_rules_and_allows_one_by_name() {
        let cfg = Path::new("/cfg/config.toml");
        let g = HostGuard::new(&["*.pem".into(), "secrets/keys".into()], &[".GIT".into()], cfg).unwrap();
        assert_eq!(denied(&g, "proj/.git/hooks/pre-commit"), None);
        assert_eq!(denied(&g, "proj/.gitconfig").as_deref(), Some(".gitconfig"));
        assert_eq!(denied(&g, "proj/out/server.PEM").as_deref(), Some("*.pem"));
        assert_eq!(denied(&g, "a/secrets/keys/k").as_deref(), Some("secrets/keys"));
        assert_eq!(denied(&g, "a/secrets/other"), None);
        let r = g.check(&[Path::new("x/.bashrc")]).unwrap_err();
        assert_eq!(
            r.to_string(),
            "a shell runs it when it starts (rule \".bashrc\"); to allow it, add \".bashrc\" to host_write_allow in /cfg/config.toml"
        );
        // A user rule can be allowed again (a later line wins over nothing: it is removed).
        assert!(HostGuard::new(&["x".into()], &["x/".into()], cfg).is_ok());
        let e = HostGuard::new(&[], &[".gti/".into()], cfg).unwrap_err();
        assert!(e.to_string().starts_with("config host_write_allow: \".gti/\" is not a deny rule"), "{e}");
        for bad in ["/etc", "~/.ssh", "a//b", "../x", ""] {
            let e = HostGuard::new(&[bad.into()], &[], cfg).unwrap_err();
            assert!(e.to_string().starts_with("config host_write_deny: "), "{bad}: {e}");
        }
    }

    #[test]
    fn every_spelling_is_checked() {
        let g = HostGuard::shared_builtin();
        assert!(g.check(&[Path::new("/r/alias/x"), Path::new("/r/.vscode/x")]).is_err());
    }

    #[test]
    fn wildcards() {
        assert!(wildcard("*.pem", "a.pem"));
        assert!(wildcard("*.pem", ".pem"));
        assert!(!wildcard("*.pem", "a.pem.bak"));
        assert!(wildcard("a?c*", "abcdef"));
        assert!(wildcard("*a*b", "xxaxxb"));
        assert!(!wildcard("*a*b", "xxaxxbx"));
    }

    #[test]
    fn exec_bits_and_special_bits() {
        assert_eq!(ExecBits::Strip.apply(0o4755), 0o644);
        assert_eq!(ExecBits::Keep.apply(0o6755), 0o755);
        assert_eq!(ExecBits::Keep.apply(0o1777), 0o777);
        assert_eq!(ExecBits::Strip.apply(0o600), 0o600);
    }

    #[test]
    fn refused_entries_group_under_the_topmost_path() {
        let g = HostGuard::new(&[], &[], Path::new("/c.toml")).unwrap();
        let mut refused = Refused::default();
        for p in ["t/.git", "t/.git/hooks", "t/.git/hooks/pre-commit", "t/.envrc"] {
            refused.add(PathBuf::from(p), g.check(&[Path::new(p)]).unwrap_err());
        }
        assert_eq!(refused.count(), 4);
        let text = refused.to_string();
        assert!(text.starts_with("4 entries refused by the host write guard: t/.git (git runs"), "{text}");
        assert!(text.contains("rule \".git/\", 3 entries); t/.envrc ("), "{text}");
        assert!(text.ends_with("; to allow a rule, add it to host_write_allow in /c.toml"), "{text}");
    }
}
