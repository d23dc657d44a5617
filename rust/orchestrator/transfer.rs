//! Moving files between host and sandbox: `upload`, `download`, `git_clone`.
//! Host paths go through the host-roots policy and are only ever used
//! through the fds [`super::hostfs`] opened; archives coming out of a
//! sandbox are unpacked by our own code, which writes only plain files and
//! directories and never follows a symlink, nowhere the host write guard
//! denies ([`super::hostguard`]: those entries are skipped and reported), and
//! without exec bits unless the call asks for them.
use std::{
    ffi::{OsStr, OsString},
    io::{self, Read},
    path::{Component, Path, PathBuf},
    time::{Duration, Instant},
};

use tokio::sync::mpsc;

use super::{
    error::OrchestratorError,
    exec::ExecResult,
    files::resolve,
    helper_client::HelperError,
    hostfs::Dir,
    hostguard::{ExecBits, Refused},
    hostpath::{Entry, Target},
    sandbox::{Command, Sandbox, SandboxManager},
    tarstream::{self, ChunkReader},
};

/// What an upload did.
#[derive(Debug)]
pub struct Uploaded {
    /// Where it went in the sandbox.
    pub dest: String,
    /// Regular files written.
    pub files: u64,
    /// Bytes of the archive sent.
    pub archive_bytes: u64,
    /// Whether the source was a directory.
    pub directory: bool,
    /// Time taken.
    pub elapsed: Duration,
}

/// What a download did.
#[derive(Debug)]
pub struct Downloaded {
    /// Where it went on the host.
    pub dest: PathBuf,
    /// Bytes received (file content for a file, the archive for a directory).
    pub bytes: u64,
    /// Whether the source was a directory.
    pub directory: bool,
    /// Symlinks and other special entries not written on the host.
    pub skipped: u64,
    /// Entries of a directory the host write guard kept off the host.
    pub refused: Refused,
    /// Time taken.
    pub elapsed: Duration,
}

fn io_err(what: &str, e: io::Error) -> OrchestratorError {
    OrchestratorError::InvalidArgument(format!("{what}: {e}"))
}

/// Only `Normal` components: no root, `.`, `..`.
fn safe_relative(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            _ => return None,
        }
    }
    (!out.as_os_str().is_empty()).then_some(out)
}

fn extracting(e: io::Error) -> OrchestratorError {
    io_err("Error extracting", e)
}

/// What unpacking a directory did.
#[derive(Debug, Default)]
struct Unpacked {
    files: u64,
    skipped: u64,
    refused: Refused,
}

/// Unpack a sandbox's archive into the host directory `dest`: plain files
/// and directories only, every one created through `dest`'s fd
/// ([`Dir::create_dirs`], [`Dir::write_file`]). Entries the host write guard
/// denies are skipped, not fatal: a tree from a sandbox (a git checkout) is
/// mostly wanted, and the caller is told what was left out and why. The
/// stream is written as it arrives, so refusing the whole call would leave
/// the earlier entries written anyway.
fn unpack_dir(reader: impl Read, dest: &Dir, exec: ExecBits) -> Result<Unpacked, OrchestratorError> {
    let mut done = Unpacked::default();
    let mut archive = tar::Archive::new(reader);
    for entry in archive.entries().map_err(extracting)? {
        let mut entry = entry.map_err(extracting)?;
        let Some(rel) = safe_relative(&entry.path().map_err(extracting)?) else {
            done.skipped += 1;
            continue;
        };
        let kind = entry.header().entry_type();
        if !matches!(kind, tar::EntryType::Directory | tar::EntryType::Regular | tar::EntryType::Continuous) {
            done.skipped += 1;
            continue;
        }
        if let Err(refusal) = dest.may_write(&rel) {
            done.refused.add(dest.path().join(&rel), refusal);
            continue;
        }
        if kind == tar::EntryType::Directory {
            dest.try_clone()?.create_dirs(&rel)?;
            continue;
        }
        let mode = entry.header().mode().unwrap_or(0o644);
        let parent = dest.try_clone()?.create_dirs(rel.parent().unwrap_or(Path::new("")))?;
        let name = rel.file_name().ok_or_else(|| extracting(io::Error::other("entry without a name")))?;
        parent.write_file(name, &mut entry, mode, exec)?;
        done.files += 1;
    }
    Ok(done)
}

/// A `Read` that shows every byte it passes on to `seen`.
struct Observed<'a, R> {
    inner: R,
    seen: &'a mut dyn FnMut(&[u8]),
}

impl<R: Read> Read for Observed<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        (self.seen)(&buf[..n]);
        Ok(n)
    }
}

/// From a one-file archive, write the file's content as `name` in the host
/// directory `dir` (replacing it, never writing through it); `seen` gets
/// every byte written. Returns the size.
pub(super) fn unpack_single(
    reader: impl Read,
    dir: &Dir,
    name: &OsStr,
    exec: ExecBits,
    seen: &mut dyn FnMut(&[u8]),
) -> Result<u64, OrchestratorError> {
    let mut archive = tar::Archive::new(reader);
    for entry in archive.entries().map_err(extracting)? {
        let entry = entry.map_err(extracting)?;
        if entry.header().entry_type().is_file() {
            let mode = entry.header().mode().unwrap_or(0o644);
            return Ok(dir.write_file(name, &mut Observed { inner: entry, seen }, mode, exec)?);
        }
    }
    Err(extracting(io::Error::other("the sandbox sent no file")))
}

/// The directory name `git clone` would pick: the last path segment without
/// a trailing `.git` (only the suffix: `my.github.io` stays as it is).
pub fn clone_dir_name(repo: &str) -> Option<String> {
    let trimmed = repo.trim_end_matches('/');
    let last = trimmed.rsplit(['/', ':']).next()?;
    let name = last.strip_suffix(".git").unwrap_or(last);
    (!name.is_empty() && name != "." && name != "..").then(|| name.to_string())
}

impl SandboxManager {
    /// Copy a host file or directory (under the host roots) into the sandbox.
    /// A file goes into `sandbox_path` if that is a directory (or ends in
    /// `/`), else it becomes `sandbox_path`.
    pub async fn upload(
        &self,
        sandbox: &Sandbox,
        local: &str,
        sandbox_path: &str,
    ) -> Result<Uploaded, OrchestratorError> {
        let started = Instant::now();
        let source = self.config().host_roots.locate(local)?;
        let target = resolve(sandbox_path)?;
        // Opened now and read only through these fds below, however long
        // the `test -d` and the copy take.
        let (file, st) = match source.open()? {
            Entry::Dir(dir) => {
                let (rx, builder) =
                    tarstream::build(move |b| tarstream::append_all(b, &dir, &[PathBuf::new()], &|_, _| false));
                let (files, _) = self.helper.copy_in(&sandbox.name, &target, rx).await?;
                let (_, archive_bytes) =
                    builder.await.map_err(|e| io_err("archive", e.into()))?.map_err(|e| io_err("archive", e))?;
                return Ok(Uploaded {
                    dest: target,
                    files,
                    archive_bytes,
                    directory: true,
                    elapsed: started.elapsed(),
                });
            }
            Entry::File(file, st) => (file, st),
        };
        let base = source.shown().file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let into_dir = target.ends_with('/') || self.is_dir(sandbox, &target).await?;
        let (dir, name) = if into_dir {
            (target.trim_end_matches('/').to_string(), base)
        } else {
            let p = Path::new(&target);
            let dir = p.parent().map(|d| d.to_string_lossy().into_owned()).unwrap_or_else(|| "/".into());
            (dir, p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or(base))
        };
        let dest = format!("{}/{name}", dir.trim_end_matches('/'));
        let (rx, builder) = tarstream::build(move |b| tarstream::append_file(b, file, &st, Path::new(&name)));
        let (files, _) = self.helper.copy_in(&sandbox.name, if dir.is_empty() { "/" } else { &dir }, rx).await?;
        let (_, archive_bytes) =
            builder.await.map_err(|e| io_err("archive", e.into()))?.map_err(|e| io_err("archive", e))?;
        Ok(Uploaded { dest, files, archive_bytes, directory: false, elapsed: started.elapsed() })
    }

    async fn is_dir(&self, sandbox: &Sandbox, path: &str) -> Result<bool, OrchestratorError> {
        let r = self.run_in(sandbox, Command::argv(["test", "-d", path], Duration::from_secs(10))).await?;
        Ok(r.exit_code() == 0)
    }

    /// Copy a sandbox file or directory to a host path under the host roots
    /// (nowhere the host write guard denies; files without exec bits unless
    /// `exec` keeps them).
    pub async fn download(
        &self,
        sandbox: &Sandbox,
        sandbox_path: &str,
        local: &str,
        exec: ExecBits,
    ) -> Result<Downloaded, OrchestratorError> {
        let started = Instant::now();
        let source = resolve(sandbox_path)?;
        let directory = self.is_dir(sandbox, &source).await?;
        let local = self.config().host_roots.locate(local)?;
        local.check_write()?;
        let not_found = |e| match e {
            HelperError::NotFound(_) => {
                OrchestratorError::InvalidArgument(format!("{source} does not exist in sandbox"))
            }
            other => other.into(),
        };
        let stream = self.helper.copy_out(&sandbox.name, &source).await.map_err(not_found)?;
        // The destination is opened (missing directories created) once the
        // sandbox has something to send, and written only through its fd.
        let (dir, name, dest) = if directory {
            (local.create_dir()?, None, local.shown().to_path_buf())
        } else {
            match local.target()? {
                Target::Dir(dir) => {
                    let name = Path::new(&source).file_name().map(OsString::from).unwrap_or_default();
                    let dest = local.shown().join(&name);
                    (dir, Some(name), dest)
                }
                Target::Name(dir, name) => (dir, Some(name), local.shown().to_path_buf()),
            }
        };
        let (tx, rx) = mpsc::channel(8);
        let unpack = tokio::task::spawn_blocking(move || {
            let reader = ChunkReader::new(rx);
            match name {
                None => unpack_dir(reader, &dir, exec).map(|done| (0, done)),
                Some(name) => unpack_single(reader, &dir, &name, exec, &mut |_| {}).map(|n| (n, Unpacked::default())),
            }
        });
        let pumped = stream.pump(tx).await;
        let unpacked = unpack.await.map_err(|e| io_err("extract", e.into()))?;
        let received = pumped.map_err(not_found)?;
        let (file_bytes, done) = unpacked?;
        let bytes = if directory { received } else { file_bytes };
        let (skipped, refused) = (done.skipped, done.refused);
        Ok(Downloaded { dest, bytes, directory, skipped, refused, elapsed: started.elapsed() })
    }

    /// `git clone` inside the sandbox. A token reaches git through a
    /// credential helper that reads it from descriptor 3, a pipe the agent
    /// fills for this one process (and its children) and that is read once:
    /// it is never in any process's environment or argv (which any other
    /// process of the sandbox can read in /proc), never in a file, the remote
    /// URL or history. Only the helper's command travels in GIT_CONFIG_*.
    pub async fn git_clone(
        &self,
        sandbox: &Sandbox,
        repo: &str,
        branch: &str,
        token: &str,
        path: &str,
        shallow: bool,
    ) -> Result<(String, ExecResult), OrchestratorError> {
        if repo.is_empty() || repo.starts_with('-') || repo.chars().any(char::is_whitespace) {
            return Err(OrchestratorError::InvalidArgument(format!("invalid repository '{repo}'")));
        }
        if branch.starts_with('-') || branch.chars().any(char::is_whitespace) {
            return Err(OrchestratorError::InvalidArgument(format!("invalid branch '{branch}'")));
        }
        let name = clone_dir_name(repo).ok_or_else(|| {
            OrchestratorError::InvalidArgument(format!("cannot derive a directory name from '{repo}'"))
        })?;
        let dir = format!("{}/{name}", resolve(path)?.trim_end_matches('/'));
        let mut argv = vec!["git".to_string(), "clone".to_string()];
        if shallow {
            argv.extend(["--depth".to_string(), "1".to_string()]);
        }
        if !branch.is_empty() {
            argv.extend(["--branch".to_string(), branch.to_string()]);
        }
        argv.extend(["--".to_string(), repo.to_string(), dir.clone()]);
        let mut cmd = Command::argv(argv, super::packages::INSTALL_TIMEOUT);
        cmd.audit_as = Some(format!("git clone {repo}"));
        let mut env = sandbox.env();
        env.insert("GIT_TERMINAL_PROMPT".into(), "0".into());
        if !token.is_empty() {
            cmd.secret = credential_answer(token)?;
            // The empty value drops helpers configured in the sandbox, so
            // ours is the only one asked (and nothing stores the token).
            for (i, (key, value)) in
                [("credential.helper", ""), ("credential.helper", CREDENTIAL_HELPER)].iter().enumerate()
            {
                env.insert(format!("GIT_CONFIG_KEY_{i}"), key.to_string());
                env.insert(format!("GIT_CONFIG_VALUE_{i}"), value.to_string());
            }
            env.insert("GIT_CONFIG_COUNT".into(), "2".into());
        }
        let result = self.run_with_env(sandbox, cmd, env).await?;
        Ok((dir, result))
    }
}

impl SandboxManager {
    /// "<last commit oneline>\n<N> files" of a fresh clone.
    pub async fn clone_summary(&self, sandbox: &Sandbox, dir: &str) -> Result<String, OrchestratorError> {
        let script = r#"git -C "$1" log --oneline -1 && echo "$(git -C "$1" ls-files | wc -l) files""#;
        let cmd = Command::argv(["/bin/sh", "-c", script, "sh", dir], Duration::from_secs(30));
        let r = self.run_in(sandbox, cmd).await?;
        Ok(crate::text::render(&r.stdout).trim_end().to_string())
    }
}

/// git's credential helper for a clone with a token: it answers `get` with
/// what descriptor 3 holds (read once; later actions get nothing).
const CREDENTIAL_HELPER: &str = r#"!f() { test "$1" = get && cat <&3; }; f"#;

/// The credential helper's answer for a git_clone token: `USER:TOKEN`, or a
/// bare token as GitHub's `x-access-token`. Control characters are refused:
/// a newline would add lines to git's credential protocol.
fn credential_answer(token: &str) -> Result<Vec<u8>, OrchestratorError> {
    if token.chars().any(char::is_control) {
        return Err(OrchestratorError::InvalidArgument("token must not contain control characters".into()));
    }
    let (user, password) = token.split_once(':').unwrap_or(("x-access-token", token));
    Ok(format!("username={user}\npassword={password}\n").into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clone_names() {
        assert_eq!(clone_dir_name("https://github.com/a/my.github.io").as_deref(), Some("my.github.io"));
        assert_eq!(clone_dir_name("https://x/a/repo.git/").as_deref(), Some("repo"));
        assert_eq!(clone_dir_name("git@host:team/proj.git").as_deref(), Some("proj"));
        assert_eq!(clone_dir_name("https://x/.."), None);
    }

    #[test]
    fn credential_answers() {
        assert_eq!(credential_answer("abc").unwrap(), b"username=x-access-token\npassword=abc\n");
        assert_eq!(credential_answer("me:p:w").unwrap(), b"username=me\npassword=p:w\n");
        assert!(credential_answer("abc\nhost=evil").is_err());
    }

    #[test]
    fn unpack_skips_guarded_entries_and_strips_exec_bits() {
        use std::{fs, os::unix::fs::PermissionsExt};
        let dir = std::env::temp_dir().join(format!("smcp-unpack-guard-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let mut b = tar::Builder::new(Vec::new());
        let mut add = |name: &str, kind: tar::EntryType, mode: u32| {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(kind);
            h.set_mode(mode);
            h.set_size(if kind == tar::EntryType::Directory { 0 } else { 1 });
            let data: &[u8] = if kind == tar::EntryType::Directory { b"" } else { b"x" };
            b.append_data(&mut h, name, data).unwrap();
        };
        add(".git", tar::EntryType::Directory, 0o755);
        add(".git/hooks", tar::EntryType::Directory, 0o755);
        add(".git/hooks/pre-commit", tar::EntryType::Regular, 0o755);
        add("sub/.GIT/config", tar::EntryType::Regular, 0o644);
        add("bin/run.sh", tar::EntryType::Regular, 0o4755);
        let archive = b.into_inner().unwrap();
        let dest = Dir::open_absolute(&dir, Default::default()).unwrap();
        let done = unpack_dir(archive.as_slice(), &dest, ExecBits::Strip).unwrap();
        assert_eq!((done.files, done.skipped, done.refused.count()), (1, 0, 4));
        let text = done.refused.to_string();
        assert!(text.contains(&format!("{}/.git (git runs", dir.display())), "{text}");
        assert!(text.contains("rule \".git/\", 3 entries)"), "{text}");
        assert!(!dir.join(".git").exists() && !dir.join("sub/.GIT").exists());
        assert_eq!(fs::metadata(dir.join("bin/run.sh")).unwrap().permissions().mode() & 0o7111, 0);
        let done = unpack_dir(archive.as_slice(), &dest, ExecBits::Keep).unwrap();
        assert_eq!(done.files, 1);
        assert_eq!(fs::metadata(dir.join("bin/run.sh")).unwrap().permissions().mode() & 0o7100, 0o100);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn unpack_refuses_symlinks_and_escapes() {
        use std::fs;
        let dir = std::env::temp_dir().join(format!("smcp-unpack-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("dest")).unwrap();
        std::os::unix::fs::symlink(dir.join("outside"), dir.join("dest/planted")).unwrap();
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        b.append_link(&mut h, "evil", "/etc").unwrap();
        let mut add = |name: &str, data: &[u8]| {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_entry_type(tar::EntryType::Regular);
            h.set_path("placeholder").unwrap();
            let raw = h.as_old_mut();
            raw.name = [0; 100];
            raw.name[..name.len()].copy_from_slice(name.as_bytes());
            h.set_cksum();
            b.append(&h, data).unwrap();
        };
        add("ok/file.txt", b"hello");
        add("../escape.txt", b"x");
        add("planted", b"through the link");
        let archive = b.into_inner().unwrap();
        let dest = Dir::open_absolute(&dir.join("dest"), Default::default()).unwrap();
        let err = unpack_dir(archive.as_slice(), &dest, ExecBits::Strip).unwrap_err();
        assert!(err.to_string().contains("planted"), "{err}");
        assert_eq!(fs::read_to_string(dir.join("dest/ok/file.txt")).unwrap(), "hello");
        assert!(!dir.join("escape.txt").exists());
        assert!(!dir.join("outside").exists());
        assert!(fs::symlink_metadata(dir.join("dest/evil")).is_err(), "symlinks are not created on the host");
        fs::remove_dir_all(&dir).unwrap();
    }
}
