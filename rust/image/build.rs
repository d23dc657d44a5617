//! The build sequence of the image store (Linux: mmdebstrap, then an
//! unpack through the helper's id map).
//!
//! A build happens in `<root>/.<name>.building-<pid>` and is renamed into
//! place only when complete, so readers never see a half-built image and a
//! crashed build leaves nothing that `list` would report.
use std::fs;
use std::path::{Path, PathBuf};

use sandbox_base::size::human_size;

use super::mmdebstrap::{self, Mode};
use super::store::{INFO_FILE, ROOTFS_DIR, remove_tree, write_info};
use super::{BuildRequest, DEFAULT_SUITE, ImageError, ImageInfo, ImageStore, RECIPE, inspect, package_list, unpack};
use sandbox_userns::IdMapper;

/// mmdebstrap's output in a build directory, removed once unpacked.
const TARBALL: &str = "rootfs.tar";

impl ImageStore {
    /// Builds an image with mmdebstrap for sandboxes mapped by `mapper`, or
    /// returns the existing one unless `req.force` (or it was built for
    /// another map, which no sandbox here could use). Each line mmdebstrap
    /// prints, and each step of ours, goes to `progress`. Blocks for the
    /// whole build (tens of seconds to minutes).
    pub fn build(
        &self,
        req: &BuildRequest,
        mapper: &IdMapper,
        progress: &mut dyn FnMut(&str),
    ) -> Result<ImageInfo, ImageError> {
        req.check()?;
        let suite = if req.suite.is_empty() { DEFAULT_SUITE } else { req.suite.as_str() };
        let packages = package_list(&req.packages)?;
        let mut force = req.force;
        if !force {
            match self.get(&req.name) {
                Ok(info) if info.check_id_map(mapper.id_map()).is_ok() && info.recipe >= RECIPE => return Ok(info),
                Ok(info) if info.check_id_map(mapper.id_map()).is_ok() => {
                    progress(&format!(
                        "rebuilding image {}: it was built by an older sandbox-mcp (recipe {} of {RECIPE}: \
                         without /etc/pip.conf)",
                        info.name, info.recipe
                    ));
                    force = true;
                }
                Ok(info) => {
                    progress(&format!(
                        "rebuilding image {}: it was built for other ids ({})",
                        info.name,
                        info.id_map.describe()
                    ));
                    force = true;
                }
                Err(ImageError::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        fs::create_dir_all(&self.root).map_err(|e| ImageError::io(format!("creating {}", self.root.display()), e))?;
        self.remove_stale_builds(&req.name);

        let work = BuildDir::create(self.root.join(format!(".{}.building-{}", req.name, std::process::id())))?;
        let rootfs = work.0.join(ROOTFS_DIR);
        let tarball = work.0.join(TARBALL);
        let sources = mmdebstrap::host_sources(Path::new("/etc/apt"));
        progress(&format!("building image {} ({suite}: {})", req.name, packages.join(" ")));
        let mode = Mode::current();
        let args = mmdebstrap::args(mode, suite, &packages, &tarball, &sources);
        let tmpdir = mmdebstrap::tmpdir(mode, &std::env::temp_dir(), &[Path::new("/var/tmp"), Path::new("/tmp")]);
        mmdebstrap::run("mmdebstrap", &args, tmpdir.as_deref(), progress)?;
        progress(&format!("unpacking for the sandbox's ids ({})", mapper.id_map().describe()));
        unpack::unpack(mapper, &tarball, &rootfs)?;
        fs::remove_file(&tarball).map_err(|e| ImageError::io(format!("removing {}", tarball.display()), e))?;
        let info = ImageInfo {
            name: req.name.clone(),
            size_bytes: inspect::disk_usage(&rootfs),
            created_at_ms: sandbox_base::clock::unix_ms(),
            shell: inspect::shell(&rootfs),
            package_manager: inspect::package_manager(&rootfs),
            id_map: mapper.id_map().clone(),
            recipe: RECIPE,
            ..ImageInfo::default()
        };
        write_info(&work.0.join(INFO_FILE), &info)?;
        self.install(work, &req.name, force)?;
        progress(&format!("image {} ready ({})", info.name, human_size(info.size_bytes)));
        if force { Ok(info) } else { self.get(&req.name) }
    }

    /// Moves a finished build into place. With `force` the old image is moved
    /// aside first and deleted after, so the name is never without an image
    /// for longer than two renames. Without `force`, a concurrent build that
    /// finished first wins and ours is discarded.
    pub(super) fn install(&self, work: BuildDir, name: &str, force: bool) -> Result<(), ImageError> {
        let target = self.root.join(name);
        let old = self.root.join(format!(".{name}.old-{}", std::process::id()));
        let replaced = force && target.exists();
        if replaced {
            fs::rename(&target, &old).map_err(|e| ImageError::io(format!("moving {} aside", target.display()), e))?;
        }
        match fs::rename(&work.0, &target) {
            Ok(()) => work.keep(),
            Err(_) if !force && target.join(INFO_FILE).exists() => {}
            Err(e) => {
                if replaced {
                    let _ = fs::rename(&old, &target);
                }
                return Err(ImageError::io(format!("renaming build into {}", target.display()), e));
            }
        }
        if replaced {
            remove_tree(&old);
        }
        Ok(())
    }

    /// Removes `.<name>.building-<pid>` / `.<name>.old-<pid>` left by
    /// processes that no longer exist (a crash or kill mid-build).
    pub(super) fn remove_stale_builds(&self, name: &str) {
        let Ok(entries) = fs::read_dir(&self.root) else { return };
        for entry in entries.flatten() {
            let file = entry.file_name();
            let Some(file) = file.to_str() else { continue };
            let pid = [".building-", ".old-"]
                .iter()
                .find_map(|sep| file.strip_prefix(&format!(".{name}{sep}")))
                .and_then(|p| p.parse::<u32>().ok());
            if let Some(pid) = pid
                && !Path::new(&format!("/proc/{pid}")).exists()
            {
                remove_tree(&entry.path());
            }
        }
    }
}

/// A build directory that is deleted on drop unless kept: every early return
/// of a failed build cleans up without repeating itself.
pub(super) struct BuildDir(pub(super) PathBuf);

impl BuildDir {
    pub(super) fn create(path: PathBuf) -> Result<Self, ImageError> {
        if path.exists() {
            remove_tree(&path);
        }
        fs::create_dir(&path).map_err(|e| ImageError::io(format!("creating {}", path.display()), e))?;
        Ok(BuildDir(path))
    }

    fn keep(self) {
        std::mem::forget(self);
    }
}

impl Drop for BuildDir {
    fn drop(&mut self) {
        remove_tree(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::super::store::test_dir::TempDir;
    use super::super::store::tests::{info, put};
    use super::*;

    /// This user's mapper (the unit tests run as root or as a user with a
    /// subordinate range).
    fn mapper() -> IdMapper {
        IdMapper::detect().expect("an id map for the test user")
    }

    #[test]
    fn build_of_existing_image_returns_it_without_building() {
        let t = TempDir::new("idem");
        let store = ImageStore::new(t.path().to_path_buf());
        let mapper = mapper();
        let built = ImageInfo { id_map: mapper.id_map().clone(), recipe: RECIPE, ..info("mcp-dev") };
        put(&store, &built);
        let req = BuildRequest { name: "mcp-dev".into(), suite: String::new(), packages: vec![], force: false };
        let mut lines = 0;
        assert_eq!(store.build(&req, &mapper, &mut |_| lines += 1).unwrap(), built);
        assert_eq!(lines, 0);
    }

    #[test]
    fn build_rejects_bad_requests_before_touching_disk() {
        let t = TempDir::new("badreq");
        let store = ImageStore::new(t.path().join("images"));
        let req = |name: &str, suite: &str, pkg: &str| BuildRequest {
            name: name.into(),
            suite: suite.into(),
            packages: vec![pkg.into()],
            force: true,
        };
        let (mut p, m) = (|_: &str| {}, mapper());
        assert!(matches!(store.build(&req("Bad", "", "x"), &m, &mut p), Err(ImageError::InvalidName(_))));
        assert!(matches!(store.build(&req("ok", "../s", "x"), &m, &mut p), Err(ImageError::InvalidSuite(_))));
        assert!(matches!(store.build(&req("ok", "", "-o=x"), &m, &mut p), Err(ImageError::InvalidPackage(_))));
        assert!(!store.root().exists());
    }

    #[test]
    fn failed_build_leaves_nothing_behind_and_explains() {
        if !Path::new("/usr/bin/mmdebstrap").exists() || !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs mmdebstrap and root");
            return;
        }
        let t = TempDir::new("fail");
        let store = ImageStore::new(t.path().join("images"));
        let req = BuildRequest {
            name: "broken".into(),
            suite: "bookworm".into(),
            packages: vec!["no-such-package-sandbox-mcp".into()],
            force: false,
        };
        let err = store.build(&req, &mapper(), &mut |_| {}).unwrap_err();
        assert!(matches!(err, ImageError::BuildFailed { .. }), "{err}");
        assert!(err.to_string().contains("no-such-package-sandbox-mcp"), "{err}");
        assert_eq!(fs::read_dir(store.root()).unwrap().count(), 0, "temp build dir must be removed");
    }

    #[test]
    fn stale_builds_of_dead_processes_are_removed() {
        let t = TempDir::new("stale");
        let store = ImageStore::new(t.path().to_path_buf());
        let dead = t.path().join(".img.building-4000000");
        let old = t.path().join(".img.old-4000001");
        let live = t.path().join(format!(".img.building-{}", std::process::id()));
        let other = t.path().join(".other.building-4000000");
        for d in [&dead, &old, &live, &other] {
            fs::create_dir_all(d.join("rootfs")).unwrap();
        }
        store.remove_stale_builds("img");
        assert!(!dead.exists() && !old.exists());
        assert!(live.exists() && other.exists());
    }
}
