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
//! case-insensitive file systems open `.GIT/hooks` as `.git/hooks`; trailing
//! dots and spaces are dropped too, since FAT and exFAT open `.git.` and
//! `.git ` as `.git` (see [`fold`]). User rules
//! come from the user's config file (`host_write_deny`, `host_write_allow`),
//! never from the project file: a project file is something a sandbox or a
//! cloned repository could have written.
//!
//! Files from a sandbox also lose their exec bits unless the call asks for
//! them ([`ExecBits`]), and never keep setuid, setgid or sticky bits.
use super::text::escaped_path as escaped;
use std::{
    collections::HashMap,
    fmt,
    path::{Component, Path, PathBuf},
    sync::{Arc, LazyLock},
};

/// Why a built-in rule exists: the sentence an agent reads in a refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// git's own files and what git obeys in a work tree.
    Git,
    /// Other version control tools' repositories (Mercurial, Jujutsu).
    Vcs,
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
    /// Python start-up code.
    Python,
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
            Self::Vcs => "a version control tool (Mercurial, Jujutsu) runs hooks and obeys settings found there",
            Self::OnPath => "programs there run in place of commands on the PATH",
            Self::Python => "Python runs it at every interpreter start when it is in a site-packages directory",
            Self::User => "host_write_deny in the config file denies it",
        })
    }
}

/// The built-in rules. A trailing `/` marks a directory for readers; matching
/// is the same (the name itself and everything below it). The rules are
/// disjoint where they can be, so that `host_write_allow` lifts exactly the
/// place it names.
const BUILTIN: &[(&str, Reason)] = &[
    // A `.git` file (a gitdir pointer) is as dangerous as the directory.
    (".git/", Reason::Git),
    // Bare repositories and mirrors (`foo.git`): git's discovery accepts a
    // bare repository's directory as a git directory, and its `config`
    // (`core.fsmonitor`) runs on the next `git status`, which shell prompts
    // run on entering it. `?*` (not `*`) keeps `.git` itself to the rule
    // above, so allowing `.git/` lifts it alone.
    ("?*.git/", Reason::Git),
    // git recognises a directory as a git directory (bare or not, under any
    // name) only when it holds a valid `HEAD` file, so with `HEAD` denied a
    // sandbox's `HEAD` + `objects/` + `refs/` + `config` layout is never a
    // repository on the host, wherever it lands.
    ("HEAD", Reason::Git),
    (".gitconfig", Reason::Git),
    (".config/git/", Reason::Git),
    (".gitmodules", Reason::Git),
    // Selects filter, diff and merge drivers the host's git runs on files.
    (".gitattributes", Reason::Git),
    // git-lfs reads it from the work tree (endpoints, transfer agents).
    (".lfsconfig", Reason::Git),
    (".hg/", Reason::Vcs),
    (".jj/", Reason::Vcs),
    (".githooks/", Reason::CommitHooks),
    (".husky/", Reason::CommitHooks),
    (".pre-commit-config.yaml", Reason::CommitHooks),
    // Lefthook; each name matches anywhere, so `.config/lefthook.yml` is
    // `lefthook.yml`'s. Its script directories run from the hooks too.
    ("lefthook.yml", Reason::CommitHooks),
    (".lefthook.yml", Reason::CommitHooks),
    ("lefthook.yaml", Reason::CommitHooks),
    (".lefthook.yaml", Reason::CommitHooks),
    ("lefthook-local.yml", Reason::CommitHooks),
    ("lefthook-local.yaml", Reason::CommitHooks),
    (".lefthook-local.yml", Reason::CommitHooks),
    (".lefthook-local.yaml", Reason::CommitHooks),
    (".lefthook/", Reason::CommitHooks),
    (".lefthook-local/", Reason::CommitHooks),
    (".sandbox-mcp.toml", Reason::OwnPolicy),
    (".config/sandbox-mcp/", Reason::OwnPolicy),
    (".bashrc", Reason::Shell),
    (".bashrc.d/", Reason::Shell),
    (".bash_profile", Reason::Shell),
    (".bash_login", Reason::Shell),
    (".bash_logout", Reason::Shell),
    (".bash_aliases", Reason::Shell),
    (".bash_completion", Reason::Shell),
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
    // The prompt runs its `custom` modules' commands at every prompt.
    (".config/starship.toml", Reason::Shell),
    // tmux runs its `run-shell` and `if-shell` commands when it starts.
    (".tmux.conf", Reason::Shell),
    (".config/tmux/", Reason::Shell),
    (".envrc", Reason::AutoRun),
    (".config/direnv/", Reason::AutoRun),
    // mise runs `[env]` templates, hooks and tasks' sources on entering the
    // directory (`mise.toml` covers `.config/mise.toml`).
    (".mise.toml", Reason::AutoRun),
    ("mise.toml", Reason::AutoRun),
    ("mise.local.toml", Reason::AutoRun),
    (".mise.local.toml", Reason::AutoRun),
    (".mise/", Reason::AutoRun),
    (".config/mise/", Reason::AutoRun),
    ("mise/config.toml", Reason::AutoRun),
    (".xprofile", Reason::AutoRun),
    (".xinitrc", Reason::AutoRun),
    (".xsessionrc", Reason::AutoRun),
    // Environment for the login session (`LD_PRELOAD`, `PATH`).
    (".pam_environment", Reason::AutoRun),
    (".config/environment.d/", Reason::AutoRun),
    (".config/autostart/", Reason::AutoRun),
    (".config/systemd/", Reason::AutoRun),
    ("Library/LaunchAgents/", Reason::AutoRun),
    (".vscode/", Reason::Editor),
    (".idea/", Reason::Editor),
    (".zed/", Reason::Editor),
    // Its `initializeCommand` runs on the host when the folder is opened in a container.
    (".devcontainer/", Reason::Editor),
    (".vimrc", Reason::Editor),
    (".vim/", Reason::Editor),
    (".exrc", Reason::Editor),
    (".nvimrc", Reason::Editor),
    (".nvim.lua", Reason::Editor),
    (".config/nvim/", Reason::Editor),
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
    ("GEMINI.md", Reason::Agent),
    (".github/copilot-instructions.md", Reason::Agent),
    (".cursorrules", Reason::Agent),
    (".windsurfrules", Reason::Agent),
    // A file or a directory of rule files.
    (".clinerules", Reason::Agent),
    (".aider.conf.yml", Reason::Agent),
    (".ssh/", Reason::Credentials),
    (".gnupg/", Reason::Credentials),
    (".netrc", Reason::Credentials),
    (".aws/", Reason::Credentials),
    (".kube/", Reason::Credentials),
    (".docker/", Reason::Credentials),
    // gh's token and its aliases (shell commands).
    (".config/gh/", Reason::Credentials),
    (".npmrc", Reason::Packages),
    (".yarnrc", Reason::Packages),
    (".yarnrc.yml", Reason::Packages),
    // pnpm runs its hooks at every install.
    (".pnpmfile.cjs", Reason::Packages),
    ("bunfig.toml", Reason::Packages),
    (".pypirc", Reason::Packages),
    ("pip.conf", Reason::Packages),
    // `.cargo/config.toml` sets runners and wrappers; `~/.cargo/bin` is on the PATH.
    (".cargo/", Reason::Packages),
    // Init scripts (`init.d/`) and properties for every build; Maven's settings and extensions.
    (".gradle/", Reason::Packages),
    (".m2/", Reason::Packages),
    (".local/bin/", Reason::OnPath),
    // Activate scripts, which editors' terminals source on their own, and the
    // interpreters on the PATH once they are.
    (".venv/bin/", Reason::OnPath),
    ("venv/bin/", Reason::OnPath),
    // Python runs `import` lines of every `.pth` in a site-packages directory,
    // and imports `sitecustomize`/`usercustomize`, at every interpreter start.
    ("*.pth", Reason::Python),
    ("sitecustomize.py", Reason::Python),
    ("usercustomize.py", Reason::Python),
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

/// `name` as a case-insensitive file system compares it: lowercase, without
/// the code points HFS+ ignores in names (the list git checks for `.git`),
/// so `.G\u{200c}IT` is `.git`, and without trailing dots and spaces, which
/// FAT and exFAT (and Windows) drop, so `.git.` and `.git ` open `.git`.
///
/// `to_lowercase` is simple case mapping, but ext4's case-insensitive
/// directories (`+F`) and APFS compare names with full case folding, where
/// `ß` is `ss` and a ligature is its letters: there `.gitconﬁg` opens
/// `.gitconfig`. The few full foldings that make ASCII are [`FULL_FOLDS`],
/// applied after lowercasing (which already maps `ẞ` to `ß` and the Kelvin
/// sign to `k`).
fn fold(name: &str) -> String {
    const IGNORED: &[char] = &[
        '\u{200c}', '\u{200d}', '\u{200e}', '\u{200f}', '\u{202a}', '\u{202b}', '\u{202c}', '\u{202d}', '\u{202e}',
        '\u{206a}', '\u{206b}', '\u{206c}', '\u{206d}', '\u{206e}', '\u{206f}', '\u{feff}',
    ];
    let mut folded = String::with_capacity(name.len());
    for c in name.chars().filter(|c| !IGNORED.contains(c)).flat_map(char::to_lowercase) {
        match FULL_FOLDS.iter().find(|(from, _)| *from == c) {
            Some((_, to)) => folded.push_str(to),
            None => folded.push(c),
        }
    }
    let kept = folded.trim_end_matches(['.', ' ']).len();
    folded.truncate(kept);
    folded
}

/// Full case foldings (Unicode CaseFolding.txt, status F, and the long s)
/// that `to_lowercase` leaves alone and that end in ASCII letters, the only
/// ones that can spell a rule's name.
const FULL_FOLDS: &[(char, &str)] = &[
    ('ſ', "s"),
    ('ß', "ss"),
    ('ﬀ', "ff"),
    ('ﬁ', "fi"),
    ('ﬂ', "fl"),
    ('ﬃ', "ffi"),
    ('ﬄ', "ffl"),
    ('ﬅ', "st"),
    ('ﬆ', "st"),
];

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
/// path where their rule matched (a refused `.git/` directory and the files
/// below it are one group). Groups are found by a map, so a tree of many
/// refused places costs one lookup per entry; at most [`Refused::SHOWN`]
/// are listed, and at most [`Refused::TRACKED`] are kept (past that,
/// entries are only counted).
#[derive(Debug, Default)]
pub struct Refused {
    // Boxed: this rides in `HostFsError`, which is returned everywhere.
    inner: Box<RefusedInner>,
}

#[derive(Debug, Default)]
struct RefusedInner {
    /// In the order they were first seen.
    groups: Vec<Group>,
    /// (rule, path where it matched) → index in `groups`.
    index: HashMap<(String, PathBuf), usize>,
    /// Each refusal's rule, parsed once, to find where it matched.
    rules: HashMap<String, Option<Rule>>,
    /// Entries in no kept group.
    untracked: u64,
    /// All entries.
    total: u64,
    config: String,
}

#[derive(Debug)]
struct Group {
    path: PathBuf,
    rule: String,
    reason: Reason,
    entries: u64,
}

impl Refused {
    /// Groups listed in the message.
    pub const SHOWN: usize = 20;
    /// Groups kept.
    pub const TRACKED: usize = 10_000;

    /// Record that `path` (as shown to the caller) was not written.
    pub fn add(&mut self, path: PathBuf, refusal: Refusal) {
        let this = &mut *self.inner;
        this.total += 1;
        if this.config.is_empty() {
            this.config = refusal.config.clone();
        }
        let rule = this
            .rules
            .entry(refusal.rule.clone())
            .or_insert_with(|| Rule::parse(&refusal.rule, refusal.reason).ok())
            .as_ref();
        let top = rule.and_then(|r| matched_prefix(&path, r)).unwrap_or(path);
        let key = (refusal.rule, top);
        if let Some(&i) = this.index.get(&key) {
            this.groups[i].entries += 1;
        } else if this.groups.len() < Self::TRACKED {
            this.index.insert(key.clone(), this.groups.len());
            this.groups.push(Group { path: key.1, rule: key.0, reason: refusal.reason, entries: 1 });
        } else {
            this.untracked += 1;
        }
    }

    /// Whether nothing was refused.
    pub fn is_empty(&self) -> bool {
        self.inner.total == 0
    }

    /// How many entries were refused.
    pub fn count(&self) -> u64 {
        self.inner.total
    }
}

/// `path` up to the end of the first run of components `rule` matches, as
/// [`Rule::matches`] compares them (plain components, folded).
fn matched_prefix(path: &Path, rule: &Rule) -> Option<PathBuf> {
    let all: Vec<Component<'_>> = path.components().collect();
    let plain: Vec<(usize, String)> = all
        .iter()
        .enumerate()
        .filter_map(|(i, c)| match c {
            Component::Normal(n) => Some((i, fold(&n.to_string_lossy()))),
            _ => None,
        })
        .collect();
    let n = rule.parts.len();
    let start = plain.windows(n).position(|w| w.iter().zip(&rule.parts).all(|((_, c), p)| wildcard(p, c)))?;
    let end = plain[start + n - 1].0;
    Some(all[..=end].iter().collect())
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.count();
        let this = &*self.inner;
        write!(f, "{n} {} refused by the host write guard: ", if n == 1 { "entry" } else { "entries" })?;
        for (i, g) in this.groups.iter().take(Self::SHOWN).enumerate() {
            let sep = if i == 0 { "" } else { "; " };
            let more = if g.entries > 1 { format!(", {} entries", g.entries) } else { String::new() };
            write!(f, "{sep}{} ({}: rule \"{}\"{more})", escaped(&g.path), g.reason, g.rule)?;
        }
        let hidden = &this.groups[this.groups.len().min(Self::SHOWN)..];
        let entries = hidden.iter().map(|g| g.entries).sum::<u64>() + this.untracked;
        if this.untracked > 0 {
            write!(f, "; and {entries} more entries in more than {} other places", hidden.len())?;
        } else if !hidden.is_empty() {
            let places = if hidden.len() == 1 { "place" } else { "places" };
            write!(f, "; and {} more {places} ({entries} entries)", hidden.len())?;
        }
        write!(f, "; to allow a rule, add it to host_write_allow in {}", this.config)
    }
}

#[cfg(test)]
mod tests;
