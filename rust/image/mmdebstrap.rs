//! Running mmdebstrap: the argument list, the mirrors (the host's own apt
//! sources, so no mirror host name lives in this repository and builds use
//! whatever mirror or proxy the host is configured for), and streaming its
//! progress. It writes a tarball whose owners are the ids inside the chroot;
//! the store unpacks it through the sandbox's id map.
use std::collections::VecDeque;
use std::ffi::OsString;
use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::ImageError;

/// Lines of mmdebstrap's stderr kept for the error message of a failed build.
const TAIL_LINES: usize = 25;

/// How mmdebstrap gets root's powers for the chroot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// We are root.
    Root,
    /// An ordinary user: mmdebstrap maps the user's subordinate ids itself.
    Unshare,
}

impl Mode {
    /// The mode for the current user.
    pub(super) fn current() -> Self {
        if nix::unistd::geteuid().is_root() { Mode::Root } else { Mode::Unshare }
    }
}

/// The host's apt source files under `etc_apt`, in the order apt reads them.
/// `sources.list` counts only if it has an entry, as many hosts ship it empty
/// or all comments, and mmdebstrap rejects a file it cannot classify.
pub(super) fn host_sources(etc_apt: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let main = etc_apt.join("sources.list");
    let has_entry = fs::read_to_string(&main)
        .map(|c| c.lines().any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#')))
        .unwrap_or(false);
    if has_entry {
        out.push(main);
    }
    let mut parts: Vec<PathBuf> = fs::read_dir(etc_apt.join("sources.list.d"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file() && matches!(p.extension().and_then(|e| e.to_str()), Some("list" | "sources")))
        .collect();
    parts.sort();
    out.extend(parts);
    out
}

/// What every image's `/etc/pip.conf` says: `pip install` works as an
/// agent types it. Debian marks its Python externally managed (PEP 668),
/// which makes a plain `pip install` fail; in a sandbox, which is its own
/// throwaway system, pip installs for root into /usr/local, apart from
/// Debian's own packages under /usr/lib. (Images pulled from a registry
/// keep whatever their Python does.)
pub const PIP_CONF: &str = "[global]\nbreak-system-packages = true\nroot-user-action = ignore\n";

/// The argument list for building `suite` with `packages` into the tarball
/// `target`.
/// Package lists are kept (`--skip=cleanup/apt/lists`) so `apt-get install`
/// works in a fresh sandbox without first downloading them again; a hook
/// writes [`PIP_CONF`].
pub(super) fn args(mode: Mode, suite: &str, packages: &[String], target: &Path, sources: &[PathBuf]) -> Vec<OsString> {
    let mode = match mode {
        Mode::Root => "--mode=root",
        Mode::Unshare => "--mode=unshare",
    };
    let mut a: Vec<OsString> = [mode, "--variant=minbase", "--format=tar", "--skip=cleanup/apt/lists"]
        .into_iter()
        .map(OsString::from)
        .collect();
    a.push(format!("--include={}", packages.join(",")).into());
    a.push(format!("--customize-hook=printf '{}' > \"$1/etc/pip.conf\"", PIP_CONF.replace('\n', "\\n")).into());
    a.push(suite.into());
    a.push(target.into());
    a.extend(sources.iter().map(OsString::from));
    a
}

/// Where mmdebstrap may keep its chroot in `mode`: `None` keeps the
/// environment's temp dir.
///
/// In unshare mode the chroot is built by the user's subordinate root,
/// which is "other" to every directory of the user: a temp dir behind a
/// 0700 directory (a private `TMPDIR`, a home without o+x) makes every write
/// fail with "Permission denied". Such a temp dir is swapped for the first
/// of `fallbacks` that everyone may enter (/var/tmp, then /tmp).
pub(super) fn tmpdir(mode: Mode, current: &Path, fallbacks: &[&Path]) -> Option<PathBuf> {
    if mode == Mode::Root || others_can_enter(current) {
        return None;
    }
    fallbacks.iter().find(|d| others_can_enter(d)).map(|d| d.to_path_buf())
}

/// Whether a user outside every group may reach `dir` and work in it: each
/// ancestor searchable by others, `dir` itself open to them (o+wx).
fn others_can_enter(dir: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    let mode = |p: &Path| fs::metadata(p).map(|m| m.permissions().mode()).unwrap_or(0);
    mode(dir) & 0o003 == 0o003 && dir.ancestors().skip(1).all(|a| mode(a) & 0o001 != 0)
}

/// Runs `program args`, handing each stderr line (mmdebstrap's progress) to
/// `progress`, with `TMPDIR` set to `tmpdir` when given. On failure the error
/// carries the last lines of stderr.
pub(super) fn run(
    program: &str,
    args: &[OsString],
    tmpdir: Option<&Path>,
    progress: &mut dyn FnMut(&str),
) -> Result<(), ImageError> {
    let mut command = Command::new(program);
    if let Some(dir) = tmpdir {
        command.env("TMPDIR", dir);
    }
    let mut child =
        command.args(args).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().map_err(|e| {
            match e.kind() {
                std::io::ErrorKind::NotFound => ImageError::MmdebstrapMissing,
                _ => ImageError::io(format!("starting {program}"), e),
            }
        })?;
    let mut tail = VecDeque::with_capacity(TAIL_LINES);
    if let Some(stderr) = child.stderr.take() {
        for line in BufReader::new(stderr).split(b'\n') {
            let line = line.map_err(|e| ImageError::io(format!("reading {program} output"), e))?;
            let line = String::from_utf8_lossy(&line);
            let line = line.trim_end_matches('\r');
            progress(line);
            if tail.len() == TAIL_LINES {
                tail.pop_front();
            }
            tail.push_back(line.to_string());
        }
    }
    let status = child.wait().map_err(|e| ImageError::io(format!("waiting for {program}"), e))?;
    if status.success() {
        return Ok(());
    }
    Err(ImageError::BuildFailed { status: status.to_string(), stderr_tail: Vec::from(tail).join("\n") })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::test_dir::TempDir;

    #[test]
    fn host_sources_takes_list_and_sources_files_only() {
        let t = TempDir::new("apt");
        let d = t.path().join("sources.list.d");
        fs::create_dir_all(&d).unwrap();
        fs::write(t.path().join("sources.list"), "# only comments\n\n").unwrap();
        for f in ["b.sources", "a.list", "c.list.disabled", "d.save"] {
            fs::write(d.join(f), "deb x y z\n").unwrap();
        }
        assert_eq!(host_sources(t.path()), [d.join("a.list"), d.join("b.sources")]);
        fs::write(t.path().join("sources.list"), "deb file:/repo bookworm main\n").unwrap();
        assert_eq!(host_sources(t.path())[0], t.path().join("sources.list"));
        assert!(host_sources(&t.path().join("absent")).is_empty());
    }

    #[test]
    fn a_temp_dir_the_sub_ids_cannot_enter_is_swapped_for_a_shared_one() {
        use std::os::unix::fs::PermissionsExt as _;
        let t = TempDir::new("tmpdir");
        let chmod = |p: &Path, m: u32| fs::set_permissions(p, fs::Permissions::from_mode(m)).unwrap();
        let (private, shared, open) = (t.path().join("private"), t.path().join("shared"), t.path().join("open"));
        for d in [&private, &shared, &open] {
            fs::create_dir(d).unwrap();
        }
        chmod(t.path(), 0o711);
        chmod(&private, 0o700);
        chmod(&shared, 0o1777);
        chmod(&open, 0o755);
        let fallbacks = [open.as_path(), shared.as_path()];
        assert_eq!(tmpdir(Mode::Unshare, &private, &fallbacks), Some(shared.clone()), "0755 is no place to write");
        assert_eq!(tmpdir(Mode::Unshare, &shared, &fallbacks), None, "an open temp dir is kept");
        assert_eq!(tmpdir(Mode::Root, &private, &fallbacks), None, "root's chroot is built by root");
        // Behind a directory others cannot search, an open temp dir is closed
        // too; with no better place the environment's is kept (mmdebstrap
        // then names the problem).
        chmod(t.path(), 0o700);
        assert_eq!(tmpdir(Mode::Unshare, &shared, &[shared.as_path(), Path::new("/tmp")]), Some("/tmp".into()));
        assert_eq!(tmpdir(Mode::Unshare, &shared, &[shared.as_path()]), None);
        chmod(t.path(), 0o711);
    }

    #[test]
    fn args_put_options_before_suite_target_and_mirrors() {
        let a = args(
            Mode::Root,
            "bookworm",
            &["python3".into(), "gpgv".into()],
            Path::new("/s/.x/rootfs.tar"),
            &[PathBuf::from("/etc/apt/sources.list.d/debian.sources")],
        );
        let a: Vec<_> = a.iter().map(|s| s.to_str().unwrap()).collect();
        assert_eq!(
            a,
            [
                "--mode=root",
                "--variant=minbase",
                "--format=tar",
                "--skip=cleanup/apt/lists",
                "--include=python3,gpgv",
                "--customize-hook=printf '[global]\\nbreak-system-packages = true\\nroot-user-action = ignore\\n' > \"$1/etc/pip.conf\"",
                "bookworm",
                "/s/.x/rootfs.tar",
                "/etc/apt/sources.list.d/debian.sources"
            ]
        );
    }

    #[test]
    fn missing_program_names_the_package() {
        let err = run("/nonexistent/mmdebstrap", &[], None, &mut |_| {}).unwrap_err();
        assert!(matches!(err, ImageError::MmdebstrapMissing));
        assert!(err.to_string().contains("apt-get install mmdebstrap"));
    }

    #[test]
    fn failure_streams_progress_and_keeps_the_stderr_tail() {
        let script = "for i in $(seq 1 40); do echo \"I: step $i\" >&2; done; echo 'E: boom' >&2; exit 3";
        let mut lines = Vec::new();
        let err = run("sh", &["-c".into(), script.into()], None, &mut |l| lines.push(l.to_string())).unwrap_err();
        assert_eq!(lines.len(), 41);
        assert_eq!(lines[0], "I: step 1");
        let ImageError::BuildFailed { status, stderr_tail } = &err else { panic!("{err}") };
        assert!(status.contains('3'), "{status}");
        assert!(stderr_tail.ends_with("E: boom"), "{stderr_tail}");
        assert!(!stderr_tail.contains("I: step 16\n"), "tail must be bounded: {stderr_tail}");
        assert_eq!(stderr_tail.lines().count(), TAIL_LINES);
    }
}
