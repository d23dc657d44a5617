//! Host path roots: upload, download and sync may only touch host paths under
//! configured roots (default: the directory the server was started in). Every
//! path is resolved through symlinks before the check, so neither `..` nor a
//! symlink can lead outside; writes never go through an existing symlink.
use std::path::{Component, Path, PathBuf};

use super::error::OrchestratorError;

/// The directories host-side file tools may use.
#[derive(Debug, Clone)]
pub struct HostRoots {
    roots: Vec<PathBuf>,
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

/// Make `path` absolute and drop `.` and `..` lexically (before any symlink
/// resolution), so the error messages show what the caller meant.
fn absolute(path: &str) -> Result<PathBuf, OrchestratorError> {
    if path.is_empty() {
        return Err(OrchestratorError::InvalidArgument("host path must not be empty".into()));
    }
    let p = expand_home(path);
    let p = if p.is_absolute() {
        p
    } else {
        std::env::current_dir()
            .map_err(|e| OrchestratorError::InvalidArgument(format!("no current directory: {e}")))?
            .join(p)
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

impl HostRoots {
    /// Roots from explicit paths (each must exist; they are canonicalized).
    pub fn new(paths: &[PathBuf]) -> Result<Self, OrchestratorError> {
        let mut roots = Vec::new();
        for p in paths {
            let c = p.canonicalize().map_err(|e| {
                OrchestratorError::InvalidArgument(format!("host root {} is not usable: {e}", p.display()))
            })?;
            roots.push(c);
        }
        Ok(Self { roots })
    }

    /// The configured roots.
    pub fn roots(&self) -> &[PathBuf] {
        &self.roots
    }

    fn outside(&self, path: &Path) -> OrchestratorError {
        let roots: Vec<String> = self.roots.iter().map(|r| r.display().to_string()).collect();
        OrchestratorError::HostPathDenied { path: path.display().to_string(), roots: roots.join(", ") }
    }

    fn check(&self, resolved: &Path, shown: &Path) -> Result<(), OrchestratorError> {
        if self.roots.iter().any(|r| resolved.starts_with(r)) { Ok(()) } else { Err(self.outside(shown)) }
    }

    /// An existing host path to read from, resolved and checked.
    pub fn readable(&self, path: &str) -> Result<PathBuf, OrchestratorError> {
        let abs = absolute(path)?;
        let resolved = abs.canonicalize().map_err(|_| OrchestratorError::HostPathMissing(abs.display().to_string()))?;
        self.check(&resolved, &abs)?;
        Ok(resolved)
    }

    /// A host path to write to (it may not exist yet). The deepest existing
    /// ancestor is resolved and must be under a root; the path itself must not
    /// be a symlink (which a sandbox could have planted through a sync or
    /// an earlier download).
    pub fn writable(&self, path: &str) -> Result<PathBuf, OrchestratorError> {
        let abs = absolute(path)?;
        let mut existing = abs.as_path();
        let mut rest = Vec::new();
        while std::fs::symlink_metadata(existing).is_err() {
            rest.push(existing.file_name().map(PathBuf::from).unwrap_or_default());
            existing = existing.parent().unwrap_or(Path::new("/"));
        }
        if rest.is_empty() && std::fs::symlink_metadata(existing).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(OrchestratorError::InvalidArgument(format!(
                "{} is a symlink; refusing to write through it",
                abs.display()
            )));
        }
        let mut resolved = existing
            .canonicalize()
            .map_err(|e| OrchestratorError::InvalidArgument(format!("cannot resolve {}: {e}", existing.display())))?;
        for part in rest.iter().rev() {
            resolved.push(part);
        }
        self.check(&resolved, &abs)?;
        Ok(resolved)
    }
}

#[cfg(test)]
mod tests {
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
        let roots = HostRoots::new(&[d.join("root")]).unwrap();
        assert!(roots.readable(d.join("root/sub/f").to_str().unwrap()).is_ok());
        assert!(matches!(roots.readable("/etc/shadow"), Err(OrchestratorError::HostPathDenied { .. })));
        let dotdot = format!("{}/root/../outside", d.display());
        assert!(matches!(roots.readable(&dotdot), Err(OrchestratorError::HostPathDenied { .. })));
        let link = d.join("root/link");
        assert!(matches!(roots.readable(link.to_str().unwrap()), Err(OrchestratorError::HostPathDenied { .. })));
        assert!(matches!(
            roots.readable(d.join("root/nope").to_str().unwrap()),
            Err(OrchestratorError::HostPathMissing(_))
        ));
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn writes_never_through_symlinks() {
        let d = tmp("write");
        std::os::unix::fs::symlink(d.join("elsewhere"), d.join("root/planted")).unwrap();
        std::os::unix::fs::symlink("/etc", d.join("root/etc")).unwrap();
        let roots = HostRoots::new(&[d.join("root")]).unwrap();
        let ok = roots.writable(d.join("root/new/deeper/file").to_str().unwrap()).unwrap();
        assert!(ok.starts_with(d.join("root").canonicalize().unwrap()));
        assert!(roots.writable(d.join("root/planted").to_str().unwrap()).is_err());
        assert!(matches!(
            roots.writable(d.join("root/etc/passwd").to_str().unwrap()),
            Err(OrchestratorError::HostPathDenied { .. })
        ));
        assert!(roots.writable("/tmp/../etc/x").is_err());
        std::fs::remove_dir_all(d).unwrap();
    }
}
