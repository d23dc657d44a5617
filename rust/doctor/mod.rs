//! `sandbox-mcp doctor`: checks this host the way sandboxes will use it and
//! prints one line per check, `ok`, `WARN` or `FAIL`, with the fix. Probes are
//! real and run as the current user (a namespace unshare, an id map through
//! newuidmap, a cgroup made and entered, a KVM guest, a tun in a user +
//! network namespace, a helper GetInfo), never just file existence, and none
//! changes the host beyond starting the helper a server would start anyway.
//! For an ordinary user most fixes are one command run once by root:
//! `sudo sandbox-mcp host-setup --user NAME`.
//!
//! The Linux host's own checks are in `linux`; elsewhere (a Mac) the helper's
//! GetInfo says what its VM layer can do, and the rest (image, sandbox-ctl,
//! disk) is checked alike.
#[cfg(linux_host)]
pub mod kvm;
#[cfg(linux_host)]
mod linux;
#[cfg(linux_host)]
mod vm;

use std::path::Path;

use sandbox_base::paths;
use sandbox_image::ImageStore;
use sandbox_orchestrator::{Config, helper_client::HelperClient};

/// Below this much free space in the data dir, images and volumes may not fit.
const MIN_FREE_BYTES: u64 = 5 << 30;

/// How one check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Works.
    Ok,
    /// Works with less (a feature is missing or a limit is near).
    Warn,
    /// Sandboxes cannot work until this is fixed.
    Fail,
}

/// One line of the report.
#[derive(Debug, Clone)]
pub struct Check {
    /// Short name of what was checked.
    pub name: &'static str,
    /// The outcome.
    pub status: Status,
    /// What was found.
    pub detail: String,
    /// What to do about a WARN or FAIL.
    pub fix: Option<String>,
}

impl Check {
    fn ok(name: &'static str, detail: impl Into<String>) -> Self {
        Self { name, status: Status::Ok, detail: detail.into(), fix: None }
    }
    fn warn(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Self { name, status: Status::Warn, detail: detail.into(), fix: Some(fix.into()) }
    }
    fn fail(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Self { name, status: Status::Fail, detail: detail.into(), fix: Some(fix.into()) }
    }
}

impl std::fmt::Display for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let status = match self.status {
            Status::Ok => "ok",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        };
        write!(f, "{status:<4}  {:<10} {}", self.name, self.detail)?;
        if let Some(fix) = &self.fix {
            write!(f, "; fix: {fix}")?;
        }
        Ok(())
    }
}

/// Every check, in order.
#[derive(Debug, Default)]
pub struct Report {
    /// The checks.
    pub checks: Vec<Check>,
}

impl Report {
    /// True when nothing failed (warnings allowed).
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.status != Status::Fail)
    }
}

/// Runs every check, printing each line to stdout as it completes.
pub async fn run(helper_bin: &Path) -> Report {
    let mut report = Report::default();
    let mut add = |c: Check| {
        println!("{c}");
        report.checks.push(c);
    };
    #[cfg(linux_host)]
    let user = match linux::user() {
        Ok(user) => user,
        Err(check) => {
            add(check);
            return report;
        }
    };
    add(helper(helper_bin).await);
    // A Mac's helper is the Swift one on Virtualization.framework: the host
    // has none of these to check, and the helper's GetInfo says what it can.
    #[cfg(linux_host)]
    linux::host_checks(user.as_ref(), helper_bin, &mut add);
    #[cfg(linux_host)]
    add(vm::check(helper_bin).await);
    add(default_image());
    add(sandbox_ctl());
    add(disk_space(&paths::data_dir()));
    add(disk_quota(&paths::data_dir()));
    report
}

async fn helper(helper_bin: &Path) -> Check {
    let socket = paths::helper_socket();
    if let Ok(mut c) = HelperClient::connect(&socket).await {
        return match c.info().await {
            Ok(info) => Check::ok("helper", format!("running at {} ({info})", socket.display())),
            Err(e) => Check::fail("helper", format!("GetInfo failed: {e}"), "restart it: kill the helper, then rerun"),
        };
    }
    match HelperClient::connect_or_spawn(&socket, helper_bin).await {
        Ok(mut c) => match c.info().await {
            Ok(info) => {
                Check::ok("helper", format!("started {} at {} ({info})", helper_bin.display(), socket.display()))
            }
            Err(e) => Check::fail("helper", format!("GetInfo failed: {e}"), "see the helper log"),
        },
        Err(e) => Check::fail(
            "helper",
            e.to_string(),
            format!(
                "install sandbox-vm-helper next to sandbox-mcp (`make install`) or set SANDBOX_VM_HELPER_BIN; log: {}",
                paths::helper_log_file().display()
            ),
        ),
    }
}

fn sandbox_ctl() -> Check {
    match sandbox_orchestrator::ctl::host_binary() {
        Some(p) => {
            Check::ok("sandbox-ctl", format!("{} (installed into sandboxes whose policy has inject_ctl)", p.display()))
        }
        None => Check::warn(
            "sandbox-ctl",
            "binary not found (SANDBOX_CTL_BIN or next to sandbox-mcp): sandboxes start without sandbox-ctl",
            "`make install` installs it beside sandbox-mcp",
        ),
    }
}

/// How an image comes to be here: built on Linux, recorded as a reference
/// elsewhere (a Mac's helper pulls it).
#[cfg(linux_host)]
const IMAGE_MAKER: &str = "build";
#[cfg(not(linux_host))]
const IMAGE_MAKER: &str = "pull REFERENCE";

fn default_image() -> Check {
    let config = match Config::load() {
        Ok(c) => c,
        Err(e) => return Check::fail("image", format!("config: {e}"), format!("fix {}", Config::path().display())),
    };
    let name = config.defaults().image.clone();
    let store = ImageStore::new(paths::image_store());
    match store.get(&name) {
        Ok(info) => Check::ok(
            "image",
            format!("default image {name} in {} ({} MB)", store.root().display(), info.size_bytes >> 20),
        ),
        Err(e) => Check::fail(
            "image",
            format!("default image {name}: {e} (store {})", store.root().display()),
            format!("`make install`, or `sandbox-mcp image {IMAGE_MAKER} --name {name}`"),
        ),
    }
}

fn disk_space(dir: &Path) -> Check {
    // The data dir may not exist yet: measure the filesystem it will live on.
    match sandbox_base::disk::free_bytes(dir) {
        Some(free) => {
            let detail = format!("{} GiB free for {}", free >> 30, dir.display());
            if free < MIN_FREE_BYTES {
                Check::warn("disk", detail, "free space there or set XDG_DATA_HOME to a larger disk (want >= 5 GiB)")
            } else {
                Check::ok("disk", detail)
            }
        }
        None => {
            Check::warn("disk", format!("cannot measure the free space for {}", dir.display()), "check the data dir")
        }
    }
}

/// The mode of the sandboxes' disk quotas (see `helper::quota`): the
/// helper measures and stops a sandbox's processes past its quota; no hard
/// (filesystem) quota is used on any host.
fn disk_quota(dir: &Path) -> Check {
    let existing = dir.ancestors().find(|p| p.exists()).unwrap_or(Path::new("/"));
    Check::ok(
        "quota",
        format!(
            "measured: the helper sums each sandbox's writable layer and writable mounts about once a second and \
             stops its processes past the quota (default 10 GiB); no hard quota under {}",
            existing.display()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_fails_only_on_fail() {
        let mut r = Report::default();
        r.checks.push(Check::ok("a", "fine"));
        r.checks.push(Check::warn("b", "meh", "do x"));
        assert!(r.passed());
        r.checks.push(Check::fail("c", "broken", "do y"));
        assert!(!r.passed());
        assert_eq!(r.checks[2].to_string(), "FAIL  c          broken; fix: do y");
    }

    #[test]
    fn disk_space_measures_the_nearest_existing_ancestor() {
        let c = disk_space(Path::new("/nonexistent/deeper/sandbox-mcp"));
        assert_ne!(c.status, Status::Fail);
        assert!(c.detail.contains("GiB free"), "{}", c.detail);
    }
}
