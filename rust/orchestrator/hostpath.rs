//! Host path roots: upload, download, sync, collect_artifacts and
//! validate_config may only touch host paths under configured roots (default:
//! the directory the server was started in), never sandbox-mcp's own directories.
//!
//! A path is placed under a root lexically (`..` is dropped before the
//! check, so it cannot lead out); it is then opened with [`super::hostfs`]
//! from `/`, through the root, component by component: no symlink is
//! followed on the way or at the end, and a walk that reaches one of
//! sandbox-mcp's own directories (where every sandbox's `/workspace` lives)
//! is refused. A root that lies inside those directories is kept, but
//! every path under it is refused that way; a root that contains them (the
//! home directory) serves everything else.
//!
//! Writes are also put to the host write guard ([`super::hostguard`]): the
//! whole destination before any missing directory is created, then every
//! directory and file again as [`super::hostfs`] makes it.
use std::{
    ffi::OsString,
    fs::File,
    path::{Component, Path, PathBuf},
    sync::Arc,
};

use super::{
    error::OrchestratorError,
    hostfs::{Dir, HostFsError, Kind, OwnDirs, Stat},
    hostguard::{HostGuard, Refusal},
    text::escaped_path,
};

/// The directories host-side file tools may use.
#[derive(Debug, Clone)]
pub struct HostRoots {
    /// Canonical paths, walked to.
    roots: Vec<PathBuf>,
    /// The same roots as configured (absolute, lexically clean), matched as
    /// well so that a root named through a symlink (`/tmp` on some systems)
    /// accepts paths spelled the way it was configured.
    given: Vec<PathBuf>,
    /// sandbox-mcp's own directories, never reachable.
    own: Arc<[PathBuf]>,
    /// Where sandbox files may not be written.
    guard: Arc<HostGuard>,
}

pub(super) fn expand_home(path: &str) -> PathBuf {
    match path.strip_prefix("~") {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => {
            let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/"));
            home.join(rest.trim_start_matches('/'))
        }
        _ => PathBuf::from(path),
    }
}

/// Make `path` absolute and drop `.` and `..` lexically (no symlink is ever
/// resolved), so the error messages show what the caller meant.
fn absolute(path: &Path) -> Result<PathBuf, HostFsError> {
    let p = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(|e| HostFsError::Io { path: "the current directory".into(), source: e })?
            .join(path)
    };
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
            _ => {}
        }
    }
    Ok(out)
}

/// A host path placed under a root, not opened yet: each use walks to it
/// afresh from `/` (through the root), so nothing checked earlier is
/// trusted later.
#[derive(Debug, Clone)]
pub struct HostPath {
    /// The root's canonical path.
    root: PathBuf,
    /// The root as it appears in `shown`.
    shown_root: PathBuf,
    /// Below the root.
    rel: PathBuf,
    /// The whole path as the caller gave it (absolute, lexically clean).
    shown: PathBuf,
    own: Arc<[PathBuf]>,
    guard: Arc<HostGuard>,
}

/// An existing host file or directory, opened.
#[derive(Debug)]
pub enum Entry {
    /// A directory.
    Dir(Dir),
    /// A regular file, with its `fstat`.
    File(File, Stat),
}

/// Where a file is to be written.
#[derive(Debug)]
pub enum Target {
    /// The path is an existing directory.
    Dir(Dir),
    /// The name `.1` (absent or a regular file) in the directory `.0`.
    Name(Dir, OsString),
}

impl HostPath {
    /// The path as the caller gave it (absolute).
    pub fn shown(&self) -> &Path {
        &self.shown
    }

    /// The root's directory, reached from `/`.
    fn root_dir(&self) -> Result<Dir, HostFsError> {
        Ok(Dir::open_absolute(&self.root, Arc::new(OwnDirs::prepare(&self.own)))?
            .named(self.shown_root.clone())
            .guarded(self.guard.clone()))
    }

    /// Whether the host write guard lets `below` (relative to this path,
    /// empty for the path itself) be written, as given and as resolved.
    pub fn may_write(&self, below: &Path) -> Result<(), Refusal> {
        self.guard.check(&[&self.shown.join(below), &self.root.join(&self.rel).join(below)])
    }

    /// Refuse a destination the host write guard denies before anything is
    /// opened or created for it.
    pub fn check_write(&self) -> Result<(), HostFsError> {
        self.may_write(Path::new(""))
            .map_err(|refusal| HostFsError::Refused { path: escaped_path(&self.shown), refusal })
    }

    /// Open the existing file or directory.
    pub fn open(&self) -> Result<Entry, HostFsError> {
        let open = || {
            let (Some(parent), Some(name)) = (self.rel.parent(), self.rel.file_name()) else {
                return self.root_dir().map(Entry::Dir);
            };
            let dir = self.root_dir()?.walk(parent)?;
            match dir.child(name)? {
                Some(st) if st.kind == Kind::Dir => dir.open_dir(name).map(Entry::Dir),
                _ => dir.open_file(name).map(|(f, st)| Entry::File(f, st)),
            }
        };
        open().map_err(|e| e.naming(&self.shown))
    }

    /// Open the existing directory.
    pub fn open_dir(&self) -> Result<Dir, HostFsError> {
        self.root_dir().and_then(|d| d.walk(&self.rel)).map_err(|e| e.naming(&self.shown))
    }

    /// Open the directory, creating it and its missing parents.
    pub fn create_dir(&self) -> Result<Dir, HostFsError> {
        self.check_write()?;
        self.root_dir().and_then(|d| d.create_dirs(&self.rel)).map_err(|e| e.naming(&self.shown))
    }

    /// Where a file given this path goes: into it if it is an existing
    /// directory, else under its own name (missing parents created).
    pub fn target(&self) -> Result<Target, HostFsError> {
        self.check_write()?;
        let open = || {
            let (Some(parent), Some(name)) = (self.rel.parent(), self.rel.file_name()) else {
                return self.root_dir().map(Target::Dir);
            };
            let dir = self.root_dir()?.create_dirs(parent)?;
            match dir.child(name)? {
                Some(st) if st.kind == Kind::Dir => dir.open_dir(name).map(Target::Dir),
                Some(st) if st.kind != Kind::File => Err(st.kind.not_a_file(&self.shown)),
                _ => Ok(Target::Name(dir, name.to_os_string())),
            }
        };
        open().map_err(|e| e.naming(&self.shown))
    }
}

impl HostRoots {
    /// Roots from explicit paths (each must exist; they are canonicalized).
    pub fn new(paths: &[PathBuf]) -> Result<Self, OrchestratorError> {
        Self::with_own_dirs(paths, sandbox_base::paths::own_dirs())
    }

    /// Roots that keep away from `own` (sandbox-mcp's own directories;
    /// tests pass their own).
    pub fn with_own_dirs(paths: &[PathBuf], own: Vec<PathBuf>) -> Result<Self, OrchestratorError> {
        let (mut roots, mut given) = (Vec::new(), Vec::new());
        for p in paths {
            let c = p.canonicalize().map_err(|e| {
                OrchestratorError::InvalidArgument(format!("host root {} is not usable: {e}", p.display()))
            })?;
            if let Some(own) = own.iter().find(|d| c.starts_with(d)) {
                tracing::warn!(
                    "host root {} is inside sandbox-mcp's own data ({}): host-path tools will refuse every path under it",
                    c.display(),
                    own.display()
                );
            }
            given.push(absolute(p).unwrap_or_else(|_| c.clone()));
            roots.push(c);
        }
        Ok(Self { roots, given, own: own.into(), guard: HostGuard::shared_builtin() })
    }

    /// The same roots, writes under them checked against `guard` (the
    /// configured rules) instead of the built-in ones.
    pub fn guarded(self, guard: HostGuard) -> Self {
        Self { guard: Arc::new(guard), ..self }
    }

    /// The configured roots.
    pub fn roots(&self) -> &[PathBuf] {
        &self.roots
    }

    /// Place `path` under the root it is in (the deepest, should roots
    /// nest), or refuse it. Nothing is opened yet.
    pub fn locate(&self, path: &str) -> Result<HostPath, HostFsError> {
        if path.is_empty() {
            return Err(HostFsError::Empty);
        }
        let shown = absolute(&expand_home(path))?;
        let mut best: Option<(&PathBuf, &PathBuf)> = None;
        for (root, given) in self.roots.iter().zip(&self.given) {
            for spelled in [root, given] {
                if shown.starts_with(spelled)
                    && best.is_none_or(|(_, b)| spelled.as_os_str().len() > b.as_os_str().len())
                {
                    best = Some((root, spelled));
                }
            }
        }
        let Some((root, spelled)) = best else {
            let roots: Vec<String> = self.roots.iter().map(|r| escaped_path(r)).collect();
            return Err(HostFsError::Denied { path: escaped_path(&shown), roots: roots.join(", ") });
        };
        let rel = shown.strip_prefix(spelled).unwrap_or(Path::new("")).to_path_buf();
        Ok(HostPath {
            root: root.clone(),
            shown_root: spelled.clone(),
            rel,
            shown,
            own: self.own.clone(),
            guard: self.guard.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("smcp-hostpath-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("root/sub")).unwrap();
        d
    }

    #[test]
    fn reads_inside_roots_only() {
        let d = tmp("read");
        std::fs::write(d.join("root/sub/f"), "x").unwrap();
        std::fs::write(d.join("outside"), "x").unwrap();
        std::os::unix::fs::symlink(d.join("outside"), d.join("root/link")).unwrap();
        let roots = HostRoots::with_own_dirs(&[d.join("root")], vec![d.join("own")]).unwrap();
        let open = |p: &str| roots.locate(p).and_then(|p| p.open());
        match open(d.join("root/sub/f").to_str().unwrap()).unwrap() {
            Entry::File(mut f, st) => {
                let mut s = String::new();
                f.read_to_string(&mut s).unwrap();
                assert_eq!((s.as_str(), st.size), ("x", 1));
            }
            Entry::Dir(_) => panic!("a file"),
        }
        assert!(matches!(open(d.join("root").to_str().unwrap()), Ok(Entry::Dir(_))));
        assert!(matches!(open("/etc/shadow"), Err(HostFsError::Denied { .. })));
        let dotdot = format!("{}/root/../outside", d.display());
        assert!(matches!(open(&dotdot), Err(HostFsError::Denied { .. })));
        assert!(matches!(open(d.join("root/link").to_str().unwrap()), Err(HostFsError::Symlink(_))));
        let missing = d.join("root/nope/deeper");
        assert!(
            matches!(open(missing.to_str().unwrap()), Err(HostFsError::Missing(p)) if p == missing.to_str().unwrap())
        );
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn write_targets_never_through_symlinks() {
        let d = tmp("write");
        std::os::unix::fs::symlink(d.join("elsewhere"), d.join("root/planted")).unwrap();
        std::os::unix::fs::symlink("/etc", d.join("root/etc")).unwrap();
        let roots = HostRoots::with_own_dirs(&[d.join("root")], vec![d.join("root/own")]).unwrap();
        let target = |p: &Path| roots.locate(p.to_str().unwrap()).and_then(|p| p.target());
        match target(&d.join("root/new/deeper/file")).unwrap() {
            Target::Name(dir, name) => {
                assert_eq!((dir.path(), name.to_str().unwrap()), (d.join("root/new/deeper").as_path(), "file"))
            }
            Target::Dir(_) => panic!("a new name"),
        }
        assert!(matches!(target(&d.join("root/sub")), Ok(Target::Dir(_))));
        assert!(matches!(target(&d.join("root/planted")), Err(HostFsError::Symlink(_))));
        assert!(matches!(target(&d.join("root/etc/passwd")), Err(HostFsError::Symlink(_))));
        assert!(!d.join("elsewhere").exists());
        assert!(matches!(roots.locate("/tmp/../etc/x"), Err(HostFsError::Denied { .. })));
        // sandbox-mcp's own directory, not there yet, cannot be planted.
        let own = d.join("root/own/config.toml");
        assert!(matches!(target(&own), Err(HostFsError::OwnData { path, .. }) if path == own.to_str().unwrap()));
        assert!(!own.exists());
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn guarded_destinations_refused_before_parents_are_made() {
        let d = tmp("guard");
        let roots = HostRoots::with_own_dirs(&[d.join("root")], vec![d.join("own")]).unwrap();
        for p in ["new/.git/hooks/pre-commit", "new/.Vscode/settings.json", "new/deeper/.sandbox-mcp.toml"] {
            let e = roots.locate(d.join("root").join(p).to_str().unwrap()).unwrap().target().unwrap_err();
            assert!(matches!(e, HostFsError::Refused { .. }), "{p}: {e}");
        }
        let e = roots.locate(d.join("root/x/.claude").to_str().unwrap()).unwrap().create_dir().unwrap_err();
        assert!(matches!(e, HostFsError::Refused { .. }), "{e}");
        assert!(!d.join("root/new").exists() && !d.join("root/x").exists());
        // The configured rules replace the built-in ones.
        let guard = HostGuard::new(&[], &[".git".into()], Path::new("/c.toml")).unwrap();
        let roots = roots.guarded(guard);
        assert!(roots.locate(d.join("root/new/.git/x").to_str().unwrap()).unwrap().target().is_ok());
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn roots_named_through_a_symlink_accept_both_spellings() {
        let d = tmp("spelled");
        std::os::unix::fs::symlink(d.join("root"), d.join("alias")).unwrap();
        let roots = HostRoots::with_own_dirs(&[d.join("alias")], vec![d.join("own")]).unwrap();
        let p = roots.locate(d.join("alias/sub").to_str().unwrap()).unwrap();
        assert_eq!(p.open_dir().unwrap().path(), d.join("alias/sub"));
        assert!(roots.locate(d.join("root/sub").to_str().unwrap()).unwrap().open_dir().is_ok());
        std::fs::remove_dir_all(d).unwrap();
    }
}
