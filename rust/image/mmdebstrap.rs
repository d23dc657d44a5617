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

/// The argument list for building `suite` with `packages` into the tarball
/// `target`.
/// Package lists are kept (`--skip=cleanup/apt/lists`) so `apt-get install`
/// works in a fresh sandbox without first downloading them again.
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
    a.push(suite.into());
    a.push(target.into());
    a.extend(sources.iter().map(OsString::from));
    a
}

/// Runs `program args`, handing each stderr line (mmdebstrap's progress) to
/// `progress`. On failure the error carries the last lines of stderr.
pub(super) fn run(program: &str, args: &[OsString], progress: &mut dyn FnMut(&str)) -> Result<(), ImageError> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => ImageError::MmdebstrapMissing,
            _ => ImageError::io(format!("starting {program}"), e),
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
    use crate::image::store::test_dir::TempDir;

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
                "bookworm",
                "/s/.x/rootfs.tar",
                "/etc/apt/sources.list.d/debian.sources"
            ]
        );
    }

    #[test]
    fn missing_program_names_the_package() {
        let err = run("/nonexistent/mmdebstrap", &[], &mut |_| {}).unwrap_err();
        assert!(matches!(err, ImageError::MmdebstrapMissing));
        assert!(err.to_string().contains("apt-get install mmdebstrap"));
    }

    #[test]
    fn failure_streams_progress_and_keeps_the_stderr_tail() {
        let script = "for i in $(seq 1 40); do echo \"I: step $i\" >&2; done; echo 'E: boom' >&2; exit 3";
        let mut lines = Vec::new();
        let err = run("sh", &["-c".into(), script.into()], &mut |l| lines.push(l.to_string())).unwrap_err();
        assert_eq!(lines.len(), 41);
        assert_eq!(lines[0], "I: step 1");
        let ImageError::BuildFailed { status, stderr_tail } = &err else { panic!("{err}") };
        assert!(status.contains('3'), "{status}");
        assert!(stderr_tail.ends_with("E: boom"), "{stderr_tail}");
        assert!(!stderr_tail.contains("I: step 16\n"), "tail must be bounded: {stderr_tail}");
        assert_eq!(stderr_tail.lines().count(), TAIL_LINES);
    }
}
