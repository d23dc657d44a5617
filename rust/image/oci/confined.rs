//! The confined child that touches an image's files: applying layers into a
//! new root filesystem, and reading an image's layers back for an export.
//!
//! Layers are hostile, and an image's files belong to the sandbox's ids
//! (subordinate ids, for an ordinary user). So that work never runs in the
//! caller's process: the current binary is re-executed with a hidden first
//! argument ([`HIDDEN_ARG`]) as root of a user namespace carrying the
//! sandbox's id map ([`run_mapped`]), where it owns exactly the image's ids
//! and no host file it does not own. The applier then chroots into the new
//! root filesystem before it reads a single tar entry, and resolves every
//! path inside it again (`openat2` with `RESOLVE_IN_ROOT`). The directories
//! and blobs are handed over as open descriptors ([`pass_fds`]): the store
//! may lie under Debian's 0700 `/root`, which the namespace's root cannot
//! traverse. The job itself travels in an environment variable, the
//! child's failure back on stderr as one JSON line, its results on stdout.
use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};

use super::OciError;
use sandbox_userns::{IdMapper, pass_fds, run_mapped};

/// First argument that makes `sandbox-mcp` and `sandbox-vm-helper` run the
/// confined child instead of their command line.
pub const HIDDEN_ARG: &str = "__apply-oci-layers";
/// Environment variable carrying the [`Job`] as JSON.
const JOB_ENV: &str = "SANDBOX_MCP_OCI_JOB";
/// Prefix of the child's stderr line that carries its failure.
const FAILURE_PREFIX: &str = "oci-job-failure: ";
/// Prefix of the child's stdout lines that report progress.
pub(super) const PROGRESS_PREFIX: &str = "oci-job-progress: ";
/// Prefix of the child's stdout line that carries its result.
pub(super) const RESULT_PREFIX: &str = "oci-job-result: ";
/// Heap the child may use. Decompressors and tar's long names are bounded
/// by it, so a layer crafted to exhaust memory fails this process alone.
const DATA_LIMIT: u64 = 2 << 30;

/// What the confined child does. File descriptors are the child's (the
/// parent's, kept open across exec).
#[derive(Debug, Serialize, Deserialize)]
pub(super) enum Job {
    /// Apply `layers`, bottom first, into the directory `root`.
    Apply {
        /// The new root filesystem (an `O_PATH` descriptor).
        root: RawFd,
        /// The layers.
        layers: Vec<LayerJob>,
    },
    /// Flatten the stacked layer directories `layers` (bottom first) into
    /// one gzipped tar written to `out`.
    Flatten {
        /// The layer directories (`O_PATH` descriptors).
        layers: Vec<RawFd>,
        /// Where the tar.gz goes.
        out: RawFd,
    },
}

/// One layer blob to apply.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct LayerJob {
    /// The blob, open for reading.
    pub fd: RawFd,
    /// How it is compressed.
    pub media_type: String,
    /// `sha256:` of its uncompressed tar, checked while it is read.
    pub diff_id: String,
    /// Its digest, for messages.
    pub digest: String,
}

/// A failure as the child reports it, rebuilt into an [`OciError`] by the
/// parent so callers can tell a digest mismatch from a malformed layer.
#[derive(Debug, Serialize, Deserialize)]
enum Failure {
    Digest { what: String, expected: String, actual: String },
    Malformed { what: String, why: String },
    Io { context: String, message: String },
}

impl From<&OciError> for Failure {
    fn from(e: &OciError) -> Self {
        match e {
            OciError::DigestMismatch { what, expected, actual } => {
                Failure::Digest { what: what.clone(), expected: expected.clone(), actual: actual.clone() }
            }
            OciError::Malformed { what, why } => Failure::Malformed { what: what.clone(), why: why.clone() },
            OciError::Io { context, source } => Failure::Io { context: context.clone(), message: source.to_string() },
            other => Failure::Malformed { what: "the confined layer job".into(), why: other.to_string() },
        }
    }
}

impl From<Failure> for OciError {
    fn from(f: Failure) -> Self {
        match f {
            Failure::Digest { what, expected, actual } => OciError::DigestMismatch { what, expected, actual },
            Failure::Malformed { what, why } => OciError::Malformed { what, why },
            Failure::Io { context, message } => OciError::io(context, std::io::Error::other(message)),
        }
    }
}

/// Runs the confined child and exits if this process was started as one
/// (first argument [`HIDDEN_ARG`]); returns at once otherwise. The binaries
/// call it first thing in `main`, before any thread or runtime exists.
pub fn run_layer_applier_if_asked() {
    if std::env::args_os().nth(1).as_deref() == Some(OsStr::new(HIDDEN_ARG)) {
        std::process::exit(child_main());
    }
}

/// The child: runs the job from the environment, reports a failure on
/// stderr, and returns the exit code.
pub(super) fn child_main() -> i32 {
    let result = std::env::var(JOB_ENV)
        .map_err(|_| OciError::malformed("the confined layer job", format!("{JOB_ENV} is not set")))
        .and_then(|text| {
            serde_json::from_str::<Job>(&text).map_err(|e| OciError::malformed("the confined layer job", e.to_string()))
        })
        .and_then(run_job);
    match result {
        Ok(()) => 0,
        Err(e) => {
            let line = serde_json::to_string(&Failure::from(&e)).unwrap_or_else(|_| format!("{e:?}"));
            eprintln!("{FAILURE_PREFIX}{line}");
            1
        }
    }
}

fn run_job(job: Job) -> Result<(), OciError> {
    let limit = nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_DATA, DATA_LIMIT, DATA_LIMIT);
    limit.map_err(|e| OciError::io("limiting the applier's memory", e.into()))?;
    match job {
        Job::Apply { root, layers } => {
            let root = take_fd(root)?;
            // From here on `/` is the new root filesystem: no path the
            // layers name can reach anything else.
            nix::unistd::fchdir(&root).map_err(|e| OciError::io("entering the root filesystem", e.into()))?;
            nix::unistd::chroot(".").map_err(|e| OciError::io("chrooting into the root filesystem", e.into()))?;
            nix::unistd::chdir("/").map_err(|e| OciError::io("entering the chroot", e.into()))?;
            nix::sys::stat::umask(nix::sys::stat::Mode::empty());
            let root = super::layers::open_root("/")?;
            let total = layers.len();
            for (i, layer) in layers.into_iter().enumerate() {
                let file = File::from(take_fd(layer.fd)?);
                let what = format!("layer {}/{total} ({})", i + 1, layer.digest);
                let entries = super::layers::apply_blob(&root, &what, &layer.media_type, &layer.diff_id, file)?;
                println!("{PROGRESS_PREFIX}{what}: {entries} entries applied");
            }
            Ok(())
        }
        Job::Flatten { layers, out } => {
            let layers = layers.into_iter().map(take_fd).collect::<Result<Vec<_>, _>>()?;
            let out = File::from(take_fd(out)?);
            let flat = super::flatten::flatten(&layers, out)?;
            let line =
                serde_json::to_string(&flat).map_err(|e| OciError::malformed("the flattened layer", e.to_string()))?;
            println!("{RESULT_PREFIX}{line}");
            Ok(())
        }
    }
}

/// Takes ownership of a descriptor the parent handed over, after checking
/// it is open (a job naming another number would otherwise act on whatever
/// the process has there).
fn take_fd(fd: RawFd) -> Result<OwnedFd, OciError> {
    // SAFETY: F_GETFD only reads the descriptor's flags.
    if fd < 3 || unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(OciError::malformed("the confined layer job", format!("descriptor {fd} is not open")));
    }
    // SAFETY: the parent passed this descriptor for the job alone, and
    // each one is taken once.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The command that starts the child: this binary with [`HIDDEN_ARG`].
#[cfg(not(test))]
fn child_command() -> Command {
    let mut cmd = Command::new("/proc/self/exe");
    cmd.arg(HIDDEN_ARG);
    cmd
}

/// In unit tests `/proc/self/exe` is the test harness, whose `main` is
/// libtest's: the child is the one test that runs [`child_main`] when the
/// job variable is set.
#[cfg(test)]
fn child_command() -> Command {
    let mut cmd = Command::new("/proc/self/exe");
    cmd.args(["--exact", "oci::confined::tests::confined_child", "--nocapture", "--test-threads=1", "-q"]);
    cmd
}

/// Runs `job` in the confined child, with `files` (the descriptors the job
/// names) kept open for it. Returns its stdout.
pub(super) fn run(mapper: &IdMapper, job: &Job, files: &[&File]) -> Result<String, OciError> {
    let text = serde_json::to_string(job).map_err(|e| OciError::malformed("the confined layer job", e.to_string()))?;
    let mut cmd = child_command();
    pass_fds(&mut cmd, files);
    cmd.env(JOB_ENV, text).stdin(Stdio::null());
    let out = run_mapped(mapper, cmd)
        .map_err(|e| OciError::io("starting the confined layer job", std::io::Error::other(e.to_string())))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        return Ok(stdout);
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    if let Some(failure) = stderr
        .lines()
        .find_map(|l| l.strip_prefix(FAILURE_PREFIX))
        .and_then(|l| serde_json::from_str::<Failure>(l).ok())
    {
        return Err(failure.into());
    }
    let tail: Vec<&str> = stderr.lines().rev().take(10).collect();
    let tail = tail.into_iter().rev().collect::<Vec<_>>().join("\n");
    Err(OciError::malformed("the confined layer job", format!("{}: {tail}", out.status)))
}

/// The descriptor number a job names for `file`.
pub(super) fn fd_of(file: &File) -> RawFd {
    file.as_raw_fd()
}

#[cfg(test)]
mod tests {
    /// Not a test of its own: the entry point of the confined child when
    /// the harness runs as one (see `child_command`); passes otherwise.
    #[test]
    fn confined_child() {
        if std::env::var_os(super::JOB_ENV).is_some() {
            std::process::exit(super::child_main());
        }
    }
}
