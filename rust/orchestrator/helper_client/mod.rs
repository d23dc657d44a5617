//! The orchestrator's side of the helper contract: connects to a helper over
//! its Unix socket (starting the Linux helper as a detached daemon when none
//! is running) and converts between proto messages and the domain types the
//! rest of the orchestrator uses. No other orchestrator module sees proto types.
use std::{
    fs::OpenOptions,
    os::unix::{fs::OpenOptionsExt, process::CommandExt},
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use hyper_util::rt::TokioIo;
use tokio::{net::UnixStream, sync::mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, transport::Channel};

use super::isolation::Isolation;
use super::network::Network;
use sandbox_contract::v1::{self as pb, vm_helper_client::VmHelperClient};

mod convert;
mod running;
mod types;

use convert::{image_summary, process_spec, vm_info};

pub use running::{CopyOutReader, DialReader, DialWriter};
pub use types::{
    BackgroundInfo, BuildEvent, CommitConfig, ExitStatus, ImageConfig, ImageSummary, NetworkEvents, ProcessConfig,
    ProcessEvent, ProcessEvents, ProcessInput, PullEvent, PullSpec, RefusedFlow, RootfsFile, VmConfig, VmInfo, VmState,
    VmStats,
};

/// Longest path a Unix socket binds: `sun_path` with its NUL (108 bytes on
/// Linux, 104 on macOS).
const MAX_SOCKET_PATH: usize =
    std::mem::size_of::<libc::sockaddr_un>() - std::mem::offset_of!(libc::sockaddr_un, sun_path) - 1;

/// Most bytes of user payload (file contents, stdin) in one message. gRPC
/// refuses a message over 4 MiB by default, on either end; bigger payloads
/// go as a stream of pieces this size.
const PAYLOAD_CHUNK: usize = 1 << 20;

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
            // No answer at all (a transport error is the status's source):
            // the helper died, and the watchdog starts it again within a
            // few seconds. Whether the call reached it is unknown.
            Code::Unavailable if std::error::Error::source(&s).is_some() => Self::Unavailable {
                socket: PathBuf::new(),
                reason: format!(
                    "the VM helper did not answer ({msg}); it is being started again: retry in a few seconds \
                     (a call cut off mid-way may or may not have run)"
                ),
            },
            Code::Unavailable => Self::Unavailable { socket: PathBuf::new(), reason: msg },
            Code::Internal => Self::Internal(msg),
            Code::PermissionDenied | Code::DataLoss => Self::Refused(msg),
            code => Self::Other(format!("{code:?}: {msg}")),
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
                        sandbox_base::paths::helper_log_file().display()
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
            config: c.config.map(pb::ImageConfig::from),
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

fn spawn_lock(socket: &Path) -> std::io::Result<nix::fcntl::Flock<std::fs::File>> {
    let dir = socket.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(dir)?;
    let f =
        OpenOptions::new().create(true).truncate(false).write(true).mode(0o600).open(socket.with_extension("lock"))?;
    nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive).map_err(|(_, e)| std::io::Error::from(e))
}

fn spawn_helper(socket: &Path, helper_bin: &Path) -> std::io::Result<()> {
    let log_path = sandbox_base::paths::helper_log_file();
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

#[cfg(test)]
mod tests;
