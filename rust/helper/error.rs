//! The helper's error type. Each variant corresponds to one gRPC status code
//! of the contract; `service::status` is the single place that maps them.
use super::driver::DriverError;
use super::vm::VmState;
use sandbox_agent::protocol::FailKind;
use sandbox_image::ImageError;

/// Everything a helper RPC can fail with.
#[derive(Debug, thiserror::Error)]
pub enum HelperError {
    /// The request is malformed; `field` names the offending field.
    #[error("{field}: {reason}")]
    InvalidArgument {
        /// Dotted field path, e.g. `spec.mounts[0].host_path`.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No VM with this id.
    #[error("vm {0:?} not found")]
    VmNotFound(String),
    /// No image with this name.
    #[error("image {0:?} not found")]
    ImageNotFound(String),
    /// A VM with this id exists already.
    #[error("vm {0:?} already exists")]
    AlreadyExists(String),
    /// The VM is in the wrong state for the operation.
    #[error("cannot {op} vm {id:?}: it is {state}")]
    WrongState {
        /// The operation, e.g. "start".
        op: &'static str,
        /// The VM.
        id: String,
        /// Its current state.
        state: VmState,
    },
    /// The process could not be started (bad cwd, unknown program).
    #[error("{0}")]
    ExecRejected(String),
    /// A process could not start because the sandbox's cgroup holds as
    /// many tasks as its limit allows (or nearly: some may have ended
    /// between the refused fork and the reading).
    #[error(
        "cannot start the process: the sandbox is at its process limit (pids = {pids} of {limit}); kill background \
         processes or raise its limit (`pids` in sandbox-mcp's config, [defaults] or [profiles.<name>])"
    )]
    ProcessLimit {
        /// Tasks in the sandbox's cgroup just after the refusal.
        pids: u64,
        /// Its `pids.max`.
        limit: u64,
    },
    /// The agent refused a copy or background request; `kind` decides the
    /// status code.
    #[error("{message}")]
    Guest {
        /// Which kind of refusal.
        kind: FailKind,
        /// The agent's explanation.
        message: String,
    },
    /// Nothing listens on the port inside the VM.
    #[error("connection refused to port {port} in VM {vm}")]
    DialRefused {
        /// The VM.
        vm: String,
        /// The guest port.
        port: u32,
    },
    /// This host cannot run VMs (or this kind of VM).
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The driver a VM asks for cannot run VMs on this host; `reason` names
    /// the fix.
    #[error("the {driver} driver is not usable here: {reason}")]
    DriverUnusable {
        /// The driver's name (`spec.driver`).
        driver: String,
        /// Why, as the driver reports it.
        reason: String,
    },
    /// The driver failed.
    #[error("driver: {0}")]
    Driver(#[from] DriverError),
    /// The connection to the VM's agent died (and could not be made
    /// again): the agent, or the VM, is gone.
    #[error("the connection to vm {vm:?}'s agent was lost: {reason}")]
    AgentLost {
        /// The VM.
        vm: String,
        /// Why.
        reason: String,
    },
    /// The image store refused or failed; the variant decides the code.
    #[error("{0}")]
    Image(#[from] ImageError),
    /// Host file or socket I/O failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The underlying error.
        source: std::io::Error,
    },
}

/// An id-map failure is the driver's, as when user namespaces lived in it.
impl From<sandbox_userns::UserNsError> for HelperError {
    fn from(e: sandbox_userns::UserNsError) -> Self {
        HelperError::Driver(e.into())
    }
}

impl HelperError {
    /// An invalid-argument error for `field`.
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        HelperError::InvalidArgument { field: field.into(), reason: reason.into() }
    }

    /// An I/O error with context.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        HelperError::Io { what: what.into(), source }
    }
}
