//! The orchestrator's error type. Messages are written for the agent on the
//! other side of MCP: each says what was wrong and, where useful, what to do.
use super::{helper_client::HelperError, names::display};

/// Everything an orchestrator operation can fail with.
#[derive(Debug, thiserror::Error)]
pub enum OrchestratorError {
    /// A sandbox name failed validation.
    #[error(
        "invalid sandbox name '{0}' (must match ^[A-Za-z0-9][A-Za-z0-9._-]*$ without '..', at most 48 characters; a \
         child's full name is <parent>..<name>, at most 63)"
    )]
    InvalidName(String),
    /// No sandbox of that name exists.
    #[error("no active sandbox '{}'", display(.0))]
    NoSuchSandbox(String),
    /// A qualified sandbox name (`<project-id>:<name>`) has the wrong form.
    #[error("argument `{arg}`: '{value}' is not a sandbox name: {why}")]
    MalformedName {
        /// The tool argument.
        arg: String,
        /// What was given.
        value: String,
        /// What is wrong.
        why: String,
    },
    /// A qualified sandbox name names a project this daemon does not know.
    #[error(
        "argument `{arg}`: no project '{project}' (list_all(all_projects=true) shows every project with sandboxes)"
    )]
    UnknownProject {
        /// The tool argument.
        arg: String,
        /// The project id given.
        project: String,
    },
    /// A child sandbox of that name existed and was reaped; the message says
    /// why and how to get a new one.
    #[error("{0}")]
    ChildGone(String),
    /// An env key failed validation.
    #[error("invalid env key '{0}' (must be [A-Za-z_][A-Za-z0-9_]*)")]
    InvalidEnvKey(String),
    /// A parameter was out of range or malformed; the message names it.
    #[error("{0}")]
    InvalidArgument(String),
    /// A sandbox's image is not in the store.
    #[error("{}", missing_image(.0))]
    ImageMissing(String),
    /// The image has no package manager `install` knows.
    #[error("image '{0}' has no supported package manager (apt-get, apk or dnf)")]
    NoPackageManager(String),
    /// A volume directory on the host could not be prepared.
    #[error("cannot prepare volume {path}: {source}")]
    Volume {
        /// The directory.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A host path is outside the host roots, missing, a symlink, inside
    /// sandbox-mcp's own data, or otherwise unusable.
    #[error(transparent)]
    HostPath(#[from] super::hostfs::HostFsError),
    /// A background process id is unknown.
    #[error("no background process '{name}' in sandbox '{}'. Running: {running}", display(sandbox))]
    NoSuchProcess {
        /// The id asked for.
        name: String,
        /// The sandbox.
        sandbox: String,
        /// Ids that exist.
        running: String,
    },
    /// The sandbox's VM went away without being destroyed.
    #[error(
        "sandbox '{shown}' was lost: {why}. Its processes and root filesystem changes are gone; its /workspace is kept. {}",
        lost_hint(&display(name)),
        shown = display(name)
    )]
    Lost {
        /// The sandbox.
        name: String,
        /// What happened.
        why: String,
    },
    /// A sandbox of that name exists already.
    #[error("sandbox '{}' already exists. Reset it first.", display(.0))]
    AlreadyExists(String),
    /// The operation is not allowed on this sandbox (e.g. on a child).
    #[error("{0}")]
    NotPermitted(String),
    /// A `docker_*` tool on a sandbox whose driver cannot run containers.
    #[error(
        "docker_* tools need a vm sandbox: set isolation = \"vm\" (in .sandbox-mcp.toml or the profile) and reset \
         (sandbox '{}' runs on the {driver} driver, which shares the host's kernel)",
        display(sandbox)
    )]
    NeedsVm {
        /// The sandbox.
        sandbox: String,
        /// Its driver.
        driver: String,
    },
    /// The helper failed.
    #[error(transparent)]
    Helper(#[from] HelperError),
    /// A change could not be committed to the state database.
    #[error("the change was not saved: {0}")]
    State(#[from] super::state::StateError),
    /// It was done (and cannot be undone, or undoing it would hurt more),
    /// but the state database does not know it.
    #[error("{done}, but this was not saved ({source}): {after_restart}")]
    NotSaved {
        /// What was done.
        done: String,
        /// What a restart of the server will believe.
        after_restart: String,
        /// Why it was not saved.
        source: Box<super::state::StateError>,
    },
}

/// What acknowledges the loss of `name`: a child (`<parent>..<name>`) is
/// neither reset nor destroyed, only `destroy_child` takes it.
fn lost_hint(name: &str) -> String {
    if super::names::is_child_name(name) {
        format!("destroy_child(name='{name}') forgets it; spawn a new child for a fresh one")
    } else {
        format!(
            "any call on it but status starts it again with its /workspace, env and history; destroy('{name}') forgets it"
        )
    }
}

/// What a sandbox of an image the store lacks is told: how to get it.
fn missing_image(image: &str) -> String {
    if image == sandbox_image::DEFAULT_IMAGE {
        format!(
            "image '{image}' not found: the default image is built once per user with `sandbox-mcp image build` \
             (a few minutes; `make install` runs it), or name another image in a profile or .sandbox-mcp.toml \
             (see images, pull_image)"
        )
    } else {
        format!("image '{image}' not found: see images; pull_image or build_image makes it, or name another image")
    }
}
