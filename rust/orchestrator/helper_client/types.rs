//! The domain types the orchestrator speaks to a helper in: what it asks
//! for (VM and process configs, images to pull) and what it gets back (VM,
//! image, process, usage and refusal reports). Their wire forms are
//! [`super::convert`]'s.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::mpsc;
use tonic::Streaming;

use sandbox_contract::v1 as pb;

use super::{HelperError, PAYLOAD_CHUNK};
use crate::isolation::Isolation;
use crate::network::Network;

/// What the orchestrator asks the helper to create.
#[derive(Debug, Clone)]
pub struct VmConfig {
    /// VM id (the orchestrator uses the sandbox name).
    pub id: String,
    /// Image name.
    pub image: String,
    /// Whole CPUs.
    pub cpus: u32,
    /// Memory limit in bytes.
    pub memory_bytes: u64,
    /// Task limit; 0: the helper's default.
    pub pids: u32,
    /// (host dir, guest dir, read-only) mounts; read-write ones are handed
    /// to the VM's root by the helper.
    pub mounts: Vec<(PathBuf, String, bool)>,
    /// Network access.
    pub network: Network,
    /// Environment every process in the VM starts with.
    pub env: HashMap<String, String>,
    /// Disk quota in bytes; 0: the helper's default.
    pub disk_bytes: u64,
    /// Metadata to find the VM again after a restart.
    pub labels: HashMap<String, String>,
    /// Start from a copy of this running VM's writable layer and image.
    pub clone_from: Option<String>,
    /// Files placed in the new VM's root filesystem before it starts (not
    /// with `clone_from`).
    pub files: Vec<RootfsFile>,
    /// The helper driver it runs on.
    pub isolation: Isolation,
}

/// A file for [`VmConfig::files`], owned by the VM's root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootfsFile {
    /// A regular file (0644).
    File {
        /// Absolute path inside the VM.
        path: String,
        /// Its bytes.
        content: Vec<u8>,
    },
    /// A symlink.
    Link {
        /// Absolute path inside the VM.
        path: String,
        /// Where it points.
        target: String,
    },
}

impl From<RootfsFile> for pb::RootfsFile {
    fn from(f: RootfsFile) -> Self {
        match f {
            RootfsFile::File { path, content } => Self { path, content, ..Default::default() },
            RootfsFile::Link { path, target } => Self { path, symlink_target: target, ..Default::default() },
        }
    }
}

/// Lifecycle state reported by the helper.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VmState {
    /// Prepared, not booted.
    Created,
    /// Booted and accepting Exec.
    Running,
    /// Stopped.
    Stopped,
    /// A state this build does not know.
    Unknown,
}

/// A VM as the helper reports it.
#[derive(Debug, Clone)]
pub struct VmInfo {
    /// VM id.
    pub id: String,
    /// Image it runs.
    pub image: String,
    /// Labels given at creation.
    pub labels: HashMap<String, String>,
    /// Lifecycle state.
    pub state: VmState,
    /// Shell for `-c` commands.
    pub shell: String,
    /// CPU limit.
    pub cpus: u32,
    /// Memory limit in bytes.
    pub memory_bytes: u64,
    /// Network access, as far as the helper reports it (a helper that does
    /// not echo the policy reports the default one).
    pub network: Network,
    /// Unix ms of the last start.
    pub started_at_ms: i64,
    /// When its image was built (Unix ms): tells a rebuilt image of the
    /// same name.
    pub image_created_at_ms: i64,
    /// Why its current or last run has no cpu/memory/pids limits.
    pub limits_not_enforced: Option<String>,
    /// Why it stopped on its own (e.g. "init was killed by signal 9").
    pub stop_reason: Option<String>,
    /// The driver it runs on, as the helper names it ("namespaces", "vm").
    pub driver: String,
}

/// An image the helper can boot.
#[derive(Debug, Clone, Default)]
pub struct ImageSummary {
    /// Image name.
    pub name: String,
    /// Package manager inside ("apt", "apk", "dnf" or "").
    pub package_manager: String,
    /// Size on disk in bytes.
    pub size_bytes: u64,
    /// Unix ms when it was built or committed.
    pub created_at_ms: i64,
    /// Image it was committed on top of ("" for a base image).
    pub parent: String,
    /// Number of read-only layers.
    pub layer_count: u32,
    /// Metadata given at commit.
    pub labels: HashMap<String, String>,
    /// Process defaults.
    pub config: ImageConfig,
    /// The OCI reference its files are pulled from ("" if built here).
    pub reference: String,
    /// Where a pulled or imported image came from (reference@digest, or the
    /// archive); its files are local. "" if built here.
    pub source: String,
}

/// One report of a pull in progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PullEvent {
    /// Where one layer's blob stands.
    Blob {
        /// Its position, bottom first, from 0.
        layer: usize,
        /// How many layers the image has.
        layers: usize,
        /// `sha256:<hex>`.
        digest: String,
        /// Bytes fetched so far.
        done: u64,
        /// Its size.
        total: u64,
        /// It was stored already: nothing fetched.
        present: bool,
    },
    /// A line from unpacking.
    Log(String),
}

/// What to pull, and from where.
#[derive(Debug, Clone)]
pub struct PullSpec {
    /// The reference, as the user wrote it.
    pub reference: String,
    /// Name of the new image.
    pub name: String,
    /// Replace an image of that name.
    pub force: bool,
    /// Mirrors and plain-HTTP registries.
    pub registries: sandbox_image::oci::RegistryConfig,
}

/// Process defaults an image carries (ENV, WORKDIR, USER).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageConfig {
    /// Environment of every process.
    pub env: HashMap<String, String>,
    /// Recorded working directory.
    pub workdir: String,
    /// Default user ("" = root).
    pub user: String,
    /// A pulled image's Entrypoint, recorded.
    pub entrypoint: Vec<String>,
    /// Its Cmd, recorded.
    pub cmd: Vec<String>,
    /// Its ExposedPorts (`8080/tcp`).
    pub exposed_ports: Vec<String>,
}

/// What to commit a VM as.
#[derive(Debug, Clone, Default)]
pub struct CommitConfig {
    /// Name of the new image.
    pub image: String,
    /// Its process defaults; `None` keeps the VM image's.
    pub config: Option<ImageConfig>,
    /// Parent to record; empty means the VM's image.
    pub parent: String,
    /// Metadata.
    pub labels: HashMap<String, String>,
}

/// One message of a base image build.
#[derive(Debug, Clone)]
pub enum BuildEvent {
    /// A line of build output.
    Log(String),
    /// The finished image (last).
    Done(Box<ImageSummary>),
}

/// A process to run in a VM.
#[derive(Debug, Clone, Default)]
pub struct ProcessConfig {
    /// argv; argv[0] is looked up in PATH.
    pub argv: Vec<String>,
    /// Extra environment.
    pub env: HashMap<String, String>,
    /// Working directory.
    pub cwd: String,
    /// Create `cwd` if missing.
    pub create_cwd: bool,
    /// User to run as ("" = the image's user, else root).
    pub user: String,
    /// Bytes the process reads once on descriptor 3 (ProcessSpec.secret):
    /// never in its environment or argv.
    pub secret: Vec<u8>,
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    /// Exited with this code.
    Code(i32),
    /// Killed by this signal.
    Signal(i32),
}

/// One event from a running process.
#[derive(Debug)]
pub enum ProcessEvent {
    /// Started with this in-VM pid.
    Started(i32),
    /// Bytes on stdout.
    Stdout(Vec<u8>),
    /// Bytes on stderr.
    Stderr(Vec<u8>),
    /// The process is gone; no more events follow.
    Exited(ExitStatus),
}

/// The input side of a running process: stdin and signals. Cloneable so
/// stdin can be fed while another task reads the output.
#[derive(Clone)]
pub struct ProcessInput {
    pub(super) tx: mpsc::Sender<pb::ExecRequest>,
}

/// The output side of a running process.
pub struct ProcessEvents {
    pub(super) rx: Streaming<pb::ExecResponse>,
}

impl ProcessInput {
    async fn send(&self, msg: pb::exec_request::Msg) -> Result<(), HelperError> {
        self.tx
            .send(pb::ExecRequest { msg: Some(msg) })
            .await
            .map_err(|_| HelperError::Other("exec stream closed by the helper".into()))
    }

    /// Write to the process's stdin.
    pub async fn write_stdin(&self, data: Vec<u8>) -> Result<(), HelperError> {
        if data.len() <= PAYLOAD_CHUNK {
            return self.send(pb::exec_request::Msg::Stdin(data)).await;
        }
        for chunk in data.chunks(PAYLOAD_CHUNK) {
            self.send(pb::exec_request::Msg::Stdin(chunk.to_vec())).await?;
        }
        Ok(())
    }

    /// Close stdin: the process reads EOF.
    pub async fn close_stdin(&self) -> Result<(), HelperError> {
        self.send(pb::exec_request::Msg::CloseStdin(pb::CloseStdin {})).await
    }

    /// Signal the whole process group.
    pub async fn signal_group(&self, signal: i32) -> Result<(), HelperError> {
        self.send(pb::exec_request::Msg::Signal(pb::Signal { signal, process_group: true })).await
    }
}

impl ProcessEvents {
    /// Next event, or `None` when the helper ended the stream.
    pub async fn next(&mut self) -> Result<Option<ProcessEvent>, HelperError> {
        use pb::exec_response::Msg;
        loop {
            let Some(resp) = self.rx.message().await? else {
                return Ok(None);
            };
            let event = match resp.msg {
                Some(Msg::Started(s)) => ProcessEvent::Started(s.pid),
                Some(Msg::Stdout(b)) => ProcessEvent::Stdout(b),
                Some(Msg::Stderr(b)) => ProcessEvent::Stderr(b),
                Some(Msg::Exited(e)) => ProcessEvent::Exited(match e.status {
                    Some(pb::exited::Status::Signal(s)) => ExitStatus::Signal(s),
                    Some(pb::exited::Status::Code(c)) => ExitStatus::Code(c),
                    None => ExitStatus::Code(-1),
                }),
                None => continue,
            };
            return Ok(Some(event));
        }
    }
}

/// Resource usage of a VM.
#[derive(Debug, Clone, Default)]
pub struct VmStats {
    /// CPU time in nanoseconds.
    pub cpu_usage_ns: u64,
    /// Memory in use, bytes.
    pub memory_used: u64,
    /// Memory limit, bytes.
    pub memory_limit: u64,
    /// Processes now.
    pub pids: u64,
    /// Network bytes received.
    pub net_rx: u64,
    /// Network bytes sent.
    pub net_tx: u64,
    /// Time since start.
    pub uptime: Duration,
    /// Killed for memory at least once.
    pub oom_killed: bool,
    /// Disk in use against the quota (writable layer, /tmp, /workspace), bytes.
    pub disk_used: u64,
    /// The disk quota, bytes (0 if the helper does not report one).
    pub disk_limit: u64,
    /// Why the helper last stopped the sandbox's writers for the quota, if it did.
    pub disk_quota_exceeded: Option<String>,
    /// Why the sandbox runs without cpu/memory/pids limits, if it does.
    pub limits_not_enforced: Option<String>,
}

/// A background process owned by a VM.
#[derive(Debug, Clone)]
pub struct BackgroundInfo {
    /// Its id.
    pub name: String,
    /// Pid (and process group) inside the VM.
    pub pid: i32,
    /// The command as started.
    pub argv: Vec<String>,
    /// Still running?
    pub running: bool,
    /// Exit status once exited.
    pub exit: Option<ExitStatus>,
}

/// One connection the egress policy refused.
#[derive(Debug, Clone, Default)]
pub struct RefusedFlow {
    /// Unix ms.
    pub at_ms: i64,
    /// "tcp", "udp" or "dns".
    pub protocol: String,
    /// Address and port as the sandbox addressed it, or the queried name.
    pub destination: String,
    /// The name the flow was tied to (DNS pin, TLS SNI, HTTP Host), if any.
    pub name: String,
    /// Why it was refused.
    pub reason: String,
}

/// What a VM's egress policy decided.
#[derive(Debug, Clone, Default)]
pub struct NetworkEvents {
    /// The most recent refusals, oldest first.
    pub refused: Vec<RefusedFlow>,
    /// Refused flows since the VM started.
    pub refused_total: u64,
    /// Allowed flows since the VM started.
    pub allowed_total: u64,
}
