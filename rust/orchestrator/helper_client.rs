//! The orchestrator's side of the helper contract: connects to a helper over
//! its Unix socket (starting the Linux helper as a detached daemon when none
//! is running) and converts between proto messages and the domain types the
//! rest of the orchestrator uses. No other orchestrator module sees proto types.
use std::{
    collections::HashMap,
    fs::OpenOptions,
    os::unix::{fs::OpenOptionsExt, process::CommandExt},
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use hyper_util::rt::TokioIo;
use tokio::{net::UnixStream, sync::mpsc};
use tokio_stream::{StreamExt, wrappers::ReceiverStream};
use tonic::{Code, Streaming, transport::Channel};

use super::isolation::Isolation;
use super::network::{EgressPolicy, Network};
use crate::proto::v1::{self as pb, vm_helper_client::VmHelperClient};

/// Longest path a Unix socket binds: `sun_path` with its NUL (108 bytes on
/// Linux, 104 on macOS).
const MAX_SOCKET_PATH: usize =
    std::mem::size_of::<libc::sockaddr_un>() - std::mem::offset_of!(libc::sockaddr_un, sun_path) - 1;

/// Failures talking to the helper, already phrased for a user.
#[derive(Debug, thiserror::Error)]
pub enum HelperError {
    /// The helper could not be reached or started, or it answered that
    /// what the call needs (a VM's agent) is gone.
    #[error("{}", unavailable(socket, reason))]
    Unavailable {
        /// Socket we tried; empty when the helper itself answered.
        socket: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The helper has no such VM or image.
    #[error("{0}")]
    NotFound(String),
    /// A VM with that id already exists.
    #[error("{0}")]
    AlreadyExists(String),
    /// The helper rejected the request as malformed.
    #[error("{0}")]
    InvalidArgument(String),
    /// The VM is in the wrong state for the request.
    #[error("{0}")]
    FailedPrecondition(String),
    /// The sandbox is at one of its limits (its task limit, its number of
    /// background processes); the message names it and the way out.
    #[error("{0}")]
    Exhausted(String),
    /// The helper's driver or the VM's agent failed; the message says where.
    #[error("VM helper failed: {0}")]
    Internal(String),
    /// The helper's driver lacks a capability the request needs (GetInfo's
    /// typed capabilities); checked before the request is sent.
    #[error(
        "{feature} is not available: the VM helper's {driver:?} driver does not support it{}",
        other_isolation(driver)
    )]
    Unsupported {
        /// What the request needed, as an agent would name it.
        feature: &'static str,
        /// The driver VMs run on.
        driver: String,
    },
    /// A registry refused our credentials, or what it sent does not match
    /// its digest; the message names the registry and the way out.
    #[error("{0}")]
    Refused(String),
    /// Anything else the helper reported.
    #[error("VM helper error: {0}")]
    Other(String),
}

/// The text of [`HelperError::Unavailable`]: the helper's own words when
/// it answered, else where it was not found.
fn unavailable(socket: &std::path::Path, reason: &str) -> String {
    if socket.as_os_str().is_empty() {
        reason.to_string()
    } else {
        format!("VM helper unavailable at {}: {reason}", socket.display())
    }
}

impl From<tonic::Status> for HelperError {
    fn from(s: tonic::Status) -> Self {
        let msg = s.message().to_string();
        match s.code() {
            Code::NotFound => Self::NotFound(msg),
            Code::AlreadyExists => Self::AlreadyExists(msg),
            Code::InvalidArgument => Self::InvalidArgument(msg),
            Code::FailedPrecondition => Self::FailedPrecondition(msg),
            Code::ResourceExhausted => Self::Exhausted(msg),
            Code::Unavailable => Self::Unavailable { socket: PathBuf::new(), reason: msg },
            Code::Internal => Self::Internal(msg),
            Code::PermissionDenied | Code::DataLoss => Self::Refused(msg),
            code => Self::Other(format!("{code:?}: {msg}")),
        }
    }
}

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
    pub registries: crate::image::oci::RegistryConfig,
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

/// Most bytes of user payload (file contents, stdin) in one message. gRPC
/// refuses a message over 4 MiB by default, on either end; bigger payloads
/// go as a stream of pieces this size.
const PAYLOAD_CHUNK: usize = 1 << 20;

/// The input side of a running process: stdin and signals. Cloneable so
/// stdin can be fed while another task reads the output.
#[derive(Clone)]
pub struct ProcessInput {
    tx: mpsc::Sender<pb::ExecRequest>,
}

/// The output side of a running process.
pub struct ProcessEvents {
    rx: Streaming<pb::ExecResponse>,
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

/// The fix an [`HelperError::Unsupported`] names: the other isolation.
fn other_isolation(driver: &str) -> String {
    match Isolation::from_driver(driver) {
        Some(Isolation::Vm) => format!(" (it works with isolation = {:?})", Isolation::Namespaces.as_str()),
        _ => String::new(),
    }
}

/// A connection to a helper.
#[derive(Clone)]
pub struct HelperClient {
    client: VmHelperClient<Channel>,
    /// What the helper's default driver can do, from GetInfo at connect.
    driver: std::sync::Arc<DriverFeatures>,
    /// What each of its drivers can do, usable or not, by name.
    drivers: std::sync::Arc<Vec<DriverFeatures>>,
}

/// The default driver's name and typed capabilities, as GetInfo gave them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DriverFeatures {
    /// Its name ("namespaces", "vm", …).
    pub name: String,
    /// NETWORK_MODE_EGRESS works.
    pub network_egress: bool,
    /// Dial reaches guest ports (port forwarding).
    pub dial: bool,
    /// A running VM's writable layer can be copied (snapshot, clone).
    pub snapshot: bool,
    /// Containers run inside (the docker_* tools).
    pub containers: bool,
}

impl DriverFeatures {
    /// The default driver's features from a GetInfo answer. A helper from
    /// before typed capabilities lists no drivers: it is the namespace
    /// driver, which always had dial and snapshots, and named egress in
    /// its flat list.
    pub fn from_info(i: &pb::GetInfoResponse) -> Self {
        match i.drivers.iter().find(|d| d.is_default) {
            Some(d) => Self::of_driver(d),
            None => DriverFeatures {
                name: i.driver.clone(),
                network_egress: i.capabilities.iter().any(|c| c == "network.egress"),
                dial: true,
                snapshot: true,
                containers: false,
            },
        }
    }

    /// Every driver of a GetInfo answer (an old helper's one default driver).
    pub fn all_from_info(i: &pb::GetInfoResponse) -> Vec<Self> {
        if i.drivers.is_empty() {
            return vec![Self::from_info(i)];
        }
        i.drivers.iter().map(Self::of_driver).collect()
    }

    fn of_driver(d: &pb::DriverInfo) -> Self {
        let c = d.capabilities.clone().unwrap_or_default();
        DriverFeatures {
            name: d.name.clone(),
            network_egress: c.network_egress,
            dial: c.dial,
            snapshot: c.snapshot,
            containers: c.containers,
        }
    }

    /// `Ok` when `has`; else the error naming `feature`.
    fn require(&self, has: bool, feature: &'static str) -> Result<(), HelperError> {
        if has { Ok(()) } else { Err(HelperError::Unsupported { feature, driver: self.name.clone() }) }
    }
}

impl HelperClient {
    /// Connect to the helper at `socket`, starting `helper_bin` as a detached
    /// daemon first if nothing answers there. The helper outlives this process,
    /// so sandboxes survive an MCP client restarting its server.
    pub async fn connect_or_spawn(socket: &Path, helper_bin: &Path) -> Result<Self, HelperError> {
        if let Ok(c) = Self::connect(socket).await {
            return Ok(c);
        }
        let unavailable = |reason: String| HelperError::Unavailable { socket: socket.to_path_buf(), reason };
        // A path the kernel cannot bind would only show as a helper that
        // never answers, 15 s later.
        let len = socket.as_os_str().len();
        if len > MAX_SOCKET_PATH {
            return Err(unavailable(format!(
                "the socket path is {len} bytes, over the {MAX_SOCKET_PATH} a Unix socket allows: set XDG_RUNTIME_DIR to a shorter directory"
            )));
        }
        // One orchestrator at a time decides to spawn: two MCP servers starting
        // together must not start two helpers fighting over one socket.
        let _lock = spawn_lock(socket).map_err(|e| unavailable(format!("lock: {e}")))?;
        if let Ok(c) = Self::connect(socket).await {
            return Ok(c);
        }
        spawn_helper(socket, helper_bin)
            .map_err(|e| unavailable(format!("cannot start {}: {e}", helper_bin.display())))?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            match Self::connect(socket).await {
                Ok(c) => return Ok(c),
                Err(e) if tokio::time::Instant::now() >= deadline => {
                    return Err(unavailable(format!(
                        "started {} but it did not answer within 15 s ({e}); see {}",
                        helper_bin.display(),
                        crate::paths::helper_log_file().display()
                    )));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }

    /// Connect to a running helper; fails fast if none answers.
    pub async fn connect(socket: &Path) -> Result<Self, HelperError> {
        let path = socket.to_path_buf();
        let unavailable = |reason: String| HelperError::Unavailable { socket: path.clone(), reason };
        // Dial once up front so a dead socket fails here instead of on first use.
        UnixStream::connect(socket).await.map_err(|e| unavailable(e.to_string()))?;
        let dial = path.clone();
        // Port forwards stream through this channel: large HTTP/2 windows keep
        // flow control from capping throughput far below the socket's.
        let channel = tonic::transport::Endpoint::try_from("http://localhost")
            .map_err(|e| unavailable(e.to_string()))?
            .initial_stream_window_size(8 << 20)
            .initial_connection_window_size(32 << 20)
            .max_frame_size(1 << 20)
            .connect_with_connector(tower::service_fn(move |_| {
                let dial = dial.clone();
                async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(dial).await?)) }
            }))
            .await
            .map_err(|e| unavailable(e.to_string()))?;
        let mut client = VmHelperClient::new(channel);
        let info = client.get_info(pb::GetInfoRequest {}).await?.into_inner();
        Ok(Self {
            client,
            driver: std::sync::Arc::new(DriverFeatures::from_info(&info)),
            drivers: std::sync::Arc::new(DriverFeatures::all_from_info(&info)),
        })
    }

    /// Helper platform/driver/version line for status output.
    pub async fn info(&mut self) -> Result<String, HelperError> {
        let i = self.client.get_info(pb::GetInfoRequest {}).await?.into_inner();
        Ok(format!("{} {} {}", i.platform, i.driver, i.version))
    }

    /// What the helper's default driver can do.
    pub fn driver(&self) -> &DriverFeatures {
        &self.driver
    }

    /// What the driver behind `isolation` can do; a helper without that
    /// driver (one from before it) cannot run such a sandbox.
    pub fn features(&self, isolation: Isolation) -> Result<&DriverFeatures, HelperError> {
        self.drivers.iter().find(|d| d.name == isolation.as_str()).ok_or_else(|| HelperError::Unsupported {
            feature: match isolation {
                Isolation::Namespaces => "isolation = \"namespaces\"",
                Isolation::Vm => "isolation = \"vm\"",
            },
            driver: self.driver.name.clone(),
        })
    }

    /// Create a VM (not started).
    pub async fn create_vm(&self, cfg: VmConfig) -> Result<VmInfo, HelperError> {
        let driver = self.features(cfg.isolation)?;
        if matches!(cfg.network, Network::Egress(_)) {
            driver.require(driver.network_egress, "network egress (network = \"egress\")")?;
        }
        if cfg.clone_from.is_some() {
            driver.require(driver.snapshot, "cloning a running sandbox")?;
        }
        let spec = pb::VmSpec::from(cfg);
        let vm = self.client.clone().create_vm(pb::CreateVmRequest { spec: Some(spec) }).await?.into_inner().vm;
        vm_info(vm)
    }

    /// Boot a VM; returns once Exec works.
    pub async fn start_vm(&self, id: &str) -> Result<VmInfo, HelperError> {
        vm_info(self.client.clone().start_vm(pb::StartVmRequest { id: id.into() }).await?.into_inner().vm)
    }

    /// Delete a VM (stopping it first); volumes are kept.
    pub async fn delete_vm(&self, id: &str) -> Result<(), HelperError> {
        self.client.clone().delete_vm(pb::DeleteVmRequest { id: id.into() }).await?;
        Ok(())
    }

    /// Every VM of the helper.
    pub async fn list_vms(&self) -> Result<Vec<VmInfo>, HelperError> {
        let vms = self.client.clone().list_vms(pb::ListVmsRequest {}).await?.into_inner().vms;
        vms.into_iter().map(|v| vm_info(Some(v))).collect()
    }

    /// Images the helper can boot.
    pub async fn list_images(&self) -> Result<Vec<ImageSummary>, HelperError> {
        let images = self.client.clone().list_images(pb::ListImagesRequest {}).await?.into_inner().images;
        Ok(images.into_iter().map(image_summary).collect())
    }

    /// Commit a running VM's writable layer as a new image; `isolation`
    /// is the VM's own (its driver must take snapshots, whatever the
    /// helper's default driver can do).
    pub async fn commit_vm(
        &self,
        vm_id: &str,
        isolation: Isolation,
        c: CommitConfig,
    ) -> Result<ImageSummary, HelperError> {
        let driver = self.features(isolation)?;
        driver.require(driver.snapshot, "snapshotting a running sandbox")?;
        let req = pb::CommitVmRequest {
            vm_id: vm_id.into(),
            image: c.image,
            config: c.config.map(image_config_to_proto),
            parent: c.parent,
            labels: c.labels,
        };
        let image = self.client.clone().commit_vm(req).await?.into_inner().image;
        image.map(image_summary).ok_or_else(|| HelperError::Other("helper answered without an image".into()))
    }

    /// Delete an image (refused while other images name it as parent).
    pub async fn delete_image(&self, name: &str) -> Result<(), HelperError> {
        self.client.clone().delete_image(pb::DeleteImageRequest { name: name.into() }).await?;
        Ok(())
    }

    /// Build a base image; `on_event` sees each output line, then the image.
    pub async fn build_image(
        &self,
        name: &str,
        release: &str,
        packages: Vec<String>,
        force: bool,
        mut on_event: impl FnMut(BuildEvent),
    ) -> Result<ImageSummary, HelperError> {
        use pb::build_image_response::Msg;
        let req = pb::BuildImageRequest { name: name.into(), release: release.into(), packages, force };
        let mut stream = self.client.clone().build_image(req).await?.into_inner();
        while let Some(msg) = stream.message().await? {
            match msg.msg {
                Some(Msg::Log(line)) => on_event(BuildEvent::Log(line)),
                Some(Msg::Image(image)) => {
                    let image = image_summary(image);
                    on_event(BuildEvent::Done(Box::new(image.clone())));
                    return Ok(image);
                }
                None => {}
            }
        }
        Err(HelperError::Other("image build stream ended without an image".into()))
    }

    /// Pull an image from a registry and unpack it; `on_event` hears each
    /// layer's progress. Dropping the future cancels the pull in the helper.
    pub async fn pull_image(
        &self,
        spec: PullSpec,
        mut on_event: impl FnMut(PullEvent),
    ) -> Result<ImageSummary, HelperError> {
        use pb::pull_image_response::Msg;
        let req = pb::PullImageRequest {
            reference: spec.reference,
            name: spec.name,
            force: spec.force,
            mirrors: spec
                .registries
                .mirrors
                .into_iter()
                .map(|(registry, mirrors)| pb::RegistryMirrors { registry, mirrors })
                .collect(),
            insecure_registries: spec.registries.insecure,
        };
        let mut stream = self.client.clone().pull_image(req).await?.into_inner();
        while let Some(msg) = stream.message().await? {
            match msg.msg {
                Some(Msg::Blob(b)) => on_event(PullEvent::Blob {
                    layer: b.layer as usize,
                    layers: b.layers as usize,
                    digest: b.digest,
                    done: b.done,
                    total: b.total,
                    present: b.present,
                }),
                Some(Msg::Log(line)) => on_event(PullEvent::Log(line)),
                Some(Msg::Image(image)) => return Ok(image_summary(image)),
                None => {}
            }
        }
        Err(HelperError::Other("image pull stream ended without an image".into()))
    }

    /// Start a process in a VM and return its handle once the helper accepted
    /// it. `stdin`, when given, is sent with the start request and followed
    /// by end-of-input: the common small-input case costs no extra messages.
    pub async fn spawn(
        &self,
        vm_id: &str,
        p: ProcessConfig,
        stdin: Option<&[u8]>,
    ) -> Result<(ProcessInput, ProcessEvents), HelperError> {
        use pb::exec_request::Msg;
        let mut first = vec![Msg::Start(process_spec(vm_id, p))];
        if let Some(data) = stdin {
            first.extend(data.chunks(PAYLOAD_CHUNK).map(|c| Msg::Stdin(c.to_vec())));
            first.push(Msg::CloseStdin(pb::CloseStdin {}));
        }
        // Room for everything sent before the stream is handed to the
        // helper, and for stdin written later.
        let (tx, rx) = mpsc::channel(first.len() + 64);
        for msg in first {
            tx.send(pb::ExecRequest { msg: Some(msg) })
                .await
                .map_err(|_| HelperError::Other("exec stream closed".into()))?;
        }
        let rx = self.client.clone().exec(ReceiverStream::new(rx)).await?.into_inner();
        Ok((ProcessInput { tx }, ProcessEvents { rx }))
    }
}

impl From<VmConfig> for pb::VmSpec {
    fn from(cfg: VmConfig) -> Self {
        Self {
            id: cfg.id.clone(),
            image: cfg.image,
            cpus: cfg.cpus,
            memory_bytes: cfg.memory_bytes,
            pids_limit: cfg.pids,
            mounts: cfg
                .mounts
                .into_iter()
                .map(|(h, g, read_only)| pb::Mount {
                    host_path: h.to_string_lossy().into_owned(),
                    guest_path: g,
                    read_only,
                })
                .collect(),
            env: cfg.env,
            hostname: super::names::hostname(super::names::plain(&cfg.id)),
            network: pb::NetworkMode::from(&cfg.network) as i32,
            network_policy: Option::<pb::NetworkPolicy>::from(&cfg.network),
            labels: cfg.labels,
            clone_from: cfg.clone_from.unwrap_or_default(),
            disk_bytes: cfg.disk_bytes,
            files: cfg.files.into_iter().map(pb::RootfsFile::from).collect(),
            driver: cfg.isolation.as_str().into(),
        }
    }
}

impl From<&Network> for pb::NetworkMode {
    fn from(n: &Network) -> Self {
        match n {
            Network::None => Self::None,
            Network::Egress(_) => Self::Egress,
        }
    }
}

/// The policy to send: unset for `none` and for the default policy (the
/// contract's "unset means the default").
impl From<&Network> for Option<pb::NetworkPolicy> {
    fn from(n: &Network) -> Self {
        match n {
            Network::Egress(p) if !p.is_default() => {
                Some(pb::NetworkPolicy { allow: p.allow.clone(), deny: p.deny.clone() })
            }
            _ => None,
        }
    }
}

impl From<&pb::VmSpec> for Network {
    fn from(spec: &pb::VmSpec) -> Self {
        match pb::NetworkMode::try_from(spec.network) {
            Ok(pb::NetworkMode::None) => Self::None,
            _ => Self::Egress(
                spec.network_policy
                    .as_ref()
                    .map(|p| EgressPolicy { allow: p.allow.clone(), deny: p.deny.clone() })
                    .unwrap_or_default(),
            ),
        }
    }
}

fn process_spec(vm_id: &str, p: ProcessConfig) -> pb::ProcessSpec {
    pb::ProcessSpec {
        vm_id: vm_id.into(),
        argv: p.argv,
        env: p.env,
        cwd: p.cwd,
        create_cwd: p.create_cwd,
        tty: false,
        tty_cols: 0,
        tty_rows: 0,
        user: p.user,
        secret: p.secret,
        secret_fd: 0,
    }
}

fn image_config_to_proto(c: ImageConfig) -> pb::ImageConfig {
    pb::ImageConfig {
        env: c.env,
        workdir: c.workdir,
        user: c.user,
        entrypoint: c.entrypoint,
        cmd: c.cmd,
        exposed_ports: c.exposed_ports,
    }
}

fn image_summary(i: pb::Image) -> ImageSummary {
    let c = i.config.unwrap_or_default();
    ImageSummary {
        name: i.name,
        package_manager: i.package_manager,
        size_bytes: i.size_bytes,
        created_at_ms: i.created_at_ms,
        parent: i.parent,
        layer_count: i.layer_count,
        labels: i.labels,
        config: ImageConfig {
            env: c.env,
            workdir: c.workdir,
            user: c.user,
            entrypoint: c.entrypoint,
            cmd: c.cmd,
            exposed_ports: c.exposed_ports,
        },
        reference: i.reference,
        source: i.source,
    }
}

fn vm_info(vm: Option<pb::Vm>) -> Result<VmInfo, HelperError> {
    let vm = vm.ok_or_else(|| HelperError::Other("helper answered without a VM".into()))?;
    let spec = vm.spec.unwrap_or_default();
    let state = match pb::VmState::try_from(vm.state) {
        Ok(pb::VmState::Created) => VmState::Created,
        Ok(pb::VmState::Running) => VmState::Running,
        Ok(pb::VmState::Stopped) => VmState::Stopped,
        _ => VmState::Unknown,
    };
    Ok(VmInfo {
        network: Network::from(&spec),
        id: spec.id,
        image: spec.image,
        labels: spec.labels,
        state,
        shell: if vm.shell.is_empty() { "/bin/sh".into() } else { vm.shell },
        cpus: spec.cpus,
        memory_bytes: spec.memory_bytes,
        started_at_ms: vm.started_at_ms,
        image_created_at_ms: vm.image_created_at_ms,
        limits_not_enforced: Some(vm.limits_not_enforced).filter(|r| !r.is_empty()),
        stop_reason: Some(vm.stop_reason).filter(|r| !r.is_empty()),
        driver: if spec.driver.is_empty() { Isolation::Namespaces.as_str().into() } else { spec.driver },
    })
}

fn spawn_lock(socket: &Path) -> std::io::Result<nix::fcntl::Flock<std::fs::File>> {
    let dir = socket.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(dir)?;
    let f =
        OpenOptions::new().create(true).truncate(false).write(true).mode(0o600).open(socket.with_extension("lock"))?;
    nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive).map_err(|(_, e)| std::io::Error::from(e))
}

fn spawn_helper(socket: &Path, helper_bin: &Path) -> std::io::Result<()> {
    let log_path = crate::paths::helper_log_file();
    if let Some(dir) = log_path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let log = OpenOptions::new().create(true).append(true).mode(0o600).open(&log_path)?;
    let mut cmd = std::process::Command::new(helper_bin);
    cmd.arg("serve").arg("--socket").arg(socket).stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log);
    // SAFETY: setsid is async-signal-safe; it detaches the helper from our
    // session so it survives the MCP client killing our process group.
    unsafe {
        cmd.pre_exec(|| nix::unistd::setsid().map(|_| ()).map_err(std::io::Error::from));
    }
    let child = cmd.spawn()?;
    // Reap it in the background if it exits early; a daemon is never waited for.
    std::thread::spawn(move || {
        let mut child = child;
        let _ = child.wait();
    });
    Ok(())
}

// ------------------------------------------------------------- issue 3 RPCs

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

fn exit_status(e: Option<pb::Exited>) -> Option<ExitStatus> {
    e.and_then(|e| e.status).map(|s| match s {
        pb::exited::Status::Code(c) => ExitStatus::Code(c),
        pb::exited::Status::Signal(s) => ExitStatus::Signal(s),
    })
}

fn background_info(p: Option<pb::BackgroundProcess>) -> Result<BackgroundInfo, HelperError> {
    let p = p.ok_or_else(|| HelperError::Other("helper answered without a process".into()))?;
    Ok(BackgroundInfo { name: p.name, pid: p.pid, argv: p.argv, running: p.running, exit: exit_status(p.exit) })
}

/// The sending half of a Dial pipe.
#[derive(Clone)]
pub struct DialWriter {
    tx: mpsc::Sender<pb::DialRequest>,
}

impl DialWriter {
    /// Bytes for the guest; false once the pipe is gone.
    pub async fn write(&self, data: Vec<u8>) -> bool {
        self.tx.send(pb::DialRequest { msg: Some(pb::dial_request::Msg::Data(data)) }).await.is_ok()
    }

    /// Half-close towards the guest.
    pub async fn close_write(&self) {
        let _ = self.tx.send(pb::DialRequest { msg: Some(pb::dial_request::Msg::CloseWrite(pb::CloseStdin {})) }).await;
    }
}

/// The receiving half of a Dial pipe.
pub struct DialReader {
    rx: Streaming<pb::DialResponse>,
}

impl DialReader {
    /// Next bytes from the guest; `None` at EOF.
    pub async fn read(&mut self) -> Result<Option<Vec<u8>>, HelperError> {
        loop {
            match self.rx.message().await? {
                None => return Ok(None),
                Some(pb::DialResponse { msg: Some(pb::dial_response::Msg::Data(d)) }) => return Ok(Some(d)),
                Some(_) => continue,
            }
        }
    }
}

impl HelperClient {
    /// Open a byte pipe to `port` inside the VM, which runs on `isolation`'s
    /// driver; returns once the guest accepted.
    pub async fn dial(
        &self,
        vm_id: &str,
        isolation: Isolation,
        port: u16,
    ) -> Result<(DialWriter, DialReader), HelperError> {
        let driver = self.features(isolation)?;
        driver.require(driver.dial, "port forwarding")?;
        let (tx, rx) = mpsc::channel(16);
        let start = pb::DialStart { vm_id: vm_id.into(), port: port.into() };
        tx.send(pb::DialRequest { msg: Some(pb::dial_request::Msg::Start(start)) })
            .await
            .map_err(|_| HelperError::Other("dial stream closed".into()))?;
        let mut rx = self.client.clone().dial(ReceiverStream::new(rx)).await?.into_inner();
        match rx.message().await? {
            Some(pb::DialResponse { msg: Some(pb::dial_response::Msg::Connected(_)) }) => {}
            _ => {
                return Err(HelperError::Other(format!("VM {vm_id} did not confirm the connection to port {port}")));
            }
        }
        Ok((DialWriter { tx }, DialReader { rx }))
    }

    /// Extract a tar archive (given in chunks) into `dest_dir` inside the VM.
    /// Returns (files, bytes) written.
    pub async fn copy_in(
        &self,
        vm_id: &str,
        dest_dir: &str,
        chunks: mpsc::Receiver<Vec<u8>>,
    ) -> Result<(u64, u64), HelperError> {
        let start = pb::CopyInRequest {
            msg: Some(pb::copy_in_request::Msg::Start(pb::CopyInStart {
                vm_id: vm_id.into(),
                dest_dir: dest_dir.into(),
            })),
        };
        let data =
            ReceiverStream::new(chunks).map(|d| pb::CopyInRequest { msg: Some(pb::copy_in_request::Msg::Data(d)) });
        let stream = tokio_stream::once(start).chain(data);
        let r = self.client.clone().copy_in(stream).await?.into_inner();
        Ok((r.files, r.bytes))
    }

    /// [`Self::copy_in`] of an archive already in memory.
    pub async fn copy_in_archive(
        &self,
        vm_id: &str,
        dest_dir: &str,
        archive: Vec<u8>,
    ) -> Result<(u64, u64), HelperError> {
        let chunks: Vec<Vec<u8>> = archive.chunks(PAYLOAD_CHUNK).map(<[u8]>::to_vec).collect();
        let (tx, rx) = mpsc::channel(chunks.len().max(1));
        for chunk in chunks {
            // Room for every chunk, and the receiver is alive until copy_in
            // consumes it: this cannot fail.
            let _ = tx.try_send(chunk);
        }
        drop(tx);
        self.copy_in(vm_id, dest_dir, rx).await
    }

    /// A tar archive of `path` inside the VM, as a stream of chunks.
    pub async fn copy_out(&self, vm_id: &str, path: &str) -> Result<CopyOutReader, HelperError> {
        let rx = self
            .client
            .clone()
            .copy_out(pb::CopyOutRequest { vm_id: vm_id.into(), path: path.into() })
            .await?
            .into_inner();
        Ok(CopyOutReader { rx })
    }

    /// Resource usage of a running VM.
    pub async fn stats(&self, vm_id: &str) -> Result<VmStats, HelperError> {
        let s = self.client.clone().stats(pb::StatsRequest { vm_id: vm_id.into() }).await?.into_inner();
        Ok(VmStats {
            cpu_usage_ns: s.cpu_usage_ns,
            memory_used: s.memory_used_bytes,
            memory_limit: s.memory_limit_bytes,
            pids: s.pids,
            net_rx: s.net_rx_bytes,
            net_tx: s.net_tx_bytes,
            uptime: Duration::from_millis(s.uptime_ms),
            oom_killed: s.oom_killed,
            disk_used: s.disk_used_bytes,
            disk_limit: s.disk_limit_bytes,
            disk_quota_exceeded: Some(s.disk_quota_exceeded).filter(|r| !r.is_empty()),
            limits_not_enforced: Some(s.limits_not_enforced).filter(|r| !r.is_empty()),
        })
    }

    /// Start a background process owned by the VM.
    pub async fn start_background(
        &self,
        vm_id: &str,
        name: &str,
        p: ProcessConfig,
    ) -> Result<BackgroundInfo, HelperError> {
        let process = process_spec(vm_id, p);
        let r = self
            .client
            .clone()
            .start_background(pb::StartBackgroundRequest { process: Some(process), name: name.into() })
            .await?
            .into_inner();
        background_info(r.process)
    }

    /// Every background process record of a VM.
    pub async fn list_background(&self, vm_id: &str) -> Result<Vec<BackgroundInfo>, HelperError> {
        let r =
            self.client.clone().list_background(pb::ListBackgroundRequest { vm_id: vm_id.into() }).await?.into_inner();
        r.processes.into_iter().map(|p| background_info(Some(p))).collect()
    }

    /// A background process and the tail of its output.
    pub async fn read_background_log(
        &self,
        vm_id: &str,
        name: &str,
        tail_lines: u32,
    ) -> Result<(BackgroundInfo, Vec<u8>), HelperError> {
        let r = self
            .client
            .clone()
            .read_background_log(pb::ReadBackgroundLogRequest { vm_id: vm_id.into(), name: name.into(), tail_lines })
            .await?
            .into_inner();
        Ok((background_info(r.process)?, r.output))
    }

    /// Stop a background process (TERM, grace, KILL to its group); returns its last output.
    pub async fn stop_background(
        &self,
        vm_id: &str,
        name: &str,
        tail_lines: u32,
    ) -> Result<(BackgroundInfo, Vec<u8>), HelperError> {
        let r = self
            .client
            .clone()
            .stop_background(pb::StopBackgroundRequest {
                vm_id: vm_id.into(),
                name: name.into(),
                grace_ms: 0,
                tail_lines,
            })
            .await?
            .into_inner();
        Ok((background_info(r.process)?, r.output))
    }
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

impl HelperClient {
    /// The refusals of a VM's egress policy; `None` when this helper does not
    /// implement the RPC (it reports nothing, which is not an error).
    pub async fn network_events(&self, vm_id: &str) -> Result<Option<NetworkEvents>, HelperError> {
        let req = pb::NetworkEventsRequest { vm_id: vm_id.into() };
        let r = match self.client.clone().network_events(req).await {
            Ok(r) => r.into_inner(),
            Err(s) if s.code() == Code::Unimplemented => return Ok(None),
            Err(s) => return Err(s.into()),
        };
        Ok(Some(NetworkEvents {
            refused: r
                .refused
                .into_iter()
                .map(|e| RefusedFlow {
                    at_ms: e.at_ms,
                    protocol: e.protocol,
                    destination: e.destination,
                    name: e.name,
                    reason: e.reason,
                })
                .collect(),
            refused_total: r.refused_total,
            allowed_total: r.allowed_total,
        }))
    }
}

/// Chunks of a CopyOut tar stream.
pub struct CopyOutReader {
    rx: Streaming<pb::CopyOutResponse>,
}

impl CopyOutReader {
    /// Next chunk; `None` at the end.
    pub async fn next(&mut self) -> Result<Option<Vec<u8>>, HelperError> {
        Ok(self.rx.message().await?.map(|m| m.data))
    }

    /// Forward every chunk to `tx` (closing it at the end, or early if the
    /// receiver stops reading); returns the bytes received.
    pub async fn pump(mut self, tx: mpsc::Sender<Vec<u8>>) -> Result<u64, HelperError> {
        let mut received = 0u64;
        while let Some(chunk) = self.next().await? {
            received += chunk.len() as u64;
            if tx.send(chunk).await.is_err() {
                break;
            }
        }
        Ok(received)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_features_come_from_the_default_driver_or_the_flat_list() {
        let caps = pb::DriverCapabilities {
            network_egress: false,
            dial: true,
            snapshot: false,
            containers: true,
            ..Default::default()
        };
        let typed = pb::GetInfoResponse {
            driver: "vm".into(),
            drivers: vec![
                pb::DriverInfo { name: "namespaces".into(), ..Default::default() },
                pb::DriverInfo { name: "vm".into(), is_default: true, capabilities: Some(caps), ..Default::default() },
            ],
            ..Default::default()
        };
        let f = DriverFeatures::from_info(&typed);
        assert_eq!(
            f,
            DriverFeatures { name: "vm".into(), network_egress: false, dial: true, snapshot: false, containers: true }
        );
        let e = f.require(f.snapshot, "snapshotting a running sandbox").unwrap_err();
        assert_eq!(
            e.to_string(),
            "snapshotting a running sandbox is not available: the VM helper's \"vm\" driver does not support it \
             (it works with isolation = \"namespaces\")"
        );
        assert!(f.require(f.dial, "port forwarding").is_ok());
        let all = DriverFeatures::all_from_info(&typed);
        assert_eq!(all.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(), ["namespaces", "vm"]);
        let old = pb::GetInfoResponse {
            driver: "namespaces".into(),
            capabilities: vec!["exec".into(), "network.egress".into()],
            ..Default::default()
        };
        let f = DriverFeatures::from_info(&old);
        assert!(f.network_egress && f.dial && f.snapshot && !f.containers && f.name == "namespaces", "{f:?}");
        // A helper from before drivers has only the namespace driver.
        assert_eq!(DriverFeatures::all_from_info(&old), vec![f]);
    }

    /// A client of a helper that answered GetInfo with `info`, whose channel
    /// never connects: the gates answer before any request is sent.
    fn client_of(info: &pb::GetInfoResponse) -> HelperClient {
        let channel = tonic::transport::Endpoint::try_from("http://localhost").unwrap().connect_with_connector_lazy(
            tower::service_fn(|_| async {
                Err::<TokioIo<UnixStream>, _>(std::io::Error::other("no helper in this test"))
            }),
        );
        HelperClient {
            client: VmHelperClient::new(channel),
            driver: std::sync::Arc::new(DriverFeatures::from_info(info)),
            drivers: std::sync::Arc::new(DriverFeatures::all_from_info(info)),
        }
    }

    #[tokio::test]
    async fn snapshots_and_dials_are_gated_on_the_sandboxs_own_driver() {
        let lacking = pb::DriverCapabilities { dial: false, snapshot: false, ..Default::default() };
        let full = pb::DriverCapabilities { dial: true, snapshot: true, ..Default::default() };
        let commit =
            || CommitConfig { image: "snap".into(), config: None, parent: String::new(), labels: HashMap::new() };
        // Each driver in turn is the default, the other lacks dial and
        // snapshots: a sandbox on the lacking one is refused, naming it,
        // and one on the full one passes the gate (to fail only for want
        // of a helper).
        for (default_is_vm, lacking_one) in [(false, Isolation::Vm), (true, Isolation::Namespaces)] {
            let (ns, vm) = if lacking_one == Isolation::Vm { (&full, &lacking) } else { (&lacking, &full) };
            let info = pb::GetInfoResponse {
                drivers: vec![
                    pb::DriverInfo {
                        name: "namespaces".into(),
                        is_default: !default_is_vm,
                        capabilities: Some(ns.clone()),
                        ..Default::default()
                    },
                    pb::DriverInfo {
                        name: "vm".into(),
                        is_default: default_is_vm,
                        capabilities: Some(vm.clone()),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            };
            let client = client_of(&info);
            let other = if lacking_one == Isolation::Vm { Isolation::Namespaces } else { Isolation::Vm };
            let name = lacking_one.as_str();
            let e = client.commit_vm("vm-1", lacking_one, commit()).await.unwrap_err();
            assert!(
                matches!(&e, HelperError::Unsupported { feature: "snapshotting a running sandbox", driver } if driver == name),
                "{e}"
            );
            let e = client.dial("vm-1", lacking_one, 8080).await.err().expect("dial refused");
            assert!(
                matches!(&e, HelperError::Unsupported { feature: "port forwarding", driver } if driver == name),
                "{e}"
            );
            let e = client.commit_vm("vm-1", other, commit()).await.unwrap_err();
            assert!(!matches!(e, HelperError::Unsupported { .. }), "{e}");
            let e = client.dial("vm-1", other, 8080).await.err().expect("no helper to dial");
            assert!(!matches!(e, HelperError::Unsupported { .. }), "{e}");
        }
    }

    fn config(network: Network) -> VmConfig {
        VmConfig {
            id: "vm".into(),
            image: "img".into(),
            cpus: 1,
            memory_bytes: 256 << 20,
            pids: 0,
            mounts: Vec::new(),
            network,
            env: HashMap::from([("SSL_CERT_FILE".into(), "/etc/x".into())]),
            disk_bytes: 20 << 30,
            labels: HashMap::new(),
            clone_from: None,
            files: Vec::new(),
            isolation: Isolation::Namespaces,
        }
    }

    #[test]
    fn the_spec_carries_mode_policy_disk_and_env() {
        let policy = EgressPolicy { allow: vec!["pypi.org".into()], deny: vec!["10.0.0.0/8".into()] };
        let spec = pb::VmSpec::from(config(Network::Egress(policy.clone())));
        assert_eq!(spec.network, pb::NetworkMode::Egress as i32);
        assert_eq!(spec.network_policy, Some(pb::NetworkPolicy { allow: policy.allow, deny: policy.deny }));
        assert_eq!(spec.disk_bytes, 20 << 30);
        assert_eq!(spec.env["SSL_CERT_FILE"], "/etc/x");
        assert_eq!(
            Network::from(&spec),
            Network::Egress(EgressPolicy { allow: vec!["pypi.org".into()], deny: vec!["10.0.0.0/8".into()] })
        );
        // The default policy and `none` leave the policy unset.
        let spec = pb::VmSpec::from(config(Network::default()));
        assert_eq!((spec.network, spec.network_policy), (pb::NetworkMode::Egress as i32, None));
        let spec = pb::VmSpec::from(config(Network::None));
        assert_eq!((spec.network, spec.network_policy.clone()), (pb::NetworkMode::None as i32, None));
        assert_eq!(Network::from(&spec), Network::None);
    }
}
