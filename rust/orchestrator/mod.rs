//! The orchestrator: sandboxes by name on top of a VM helper. It owns
//! everything that is policy or state (names, env, audit, exec semantics);
//! the MCP layer only translates tool calls into calls here.
//!
//! - [`helper_client`]: the helper connection and the only proto conversion.
//! - [`sandbox`]: the registry, lifecycle, running commands.
//! - [`exec`]: one process to completion with timeout and output caps.
//! - [`env`], [`files`], [`packages`]: persistent env, file I/O, `install`.
//! - [`audit`]: command history with secret redaction.
//! - [`names`]: validation of client-supplied names.
//! - [`config`]: defaults, profiles, idle TTL, host roots.
//! - [`hostpath`]: the host-roots policy for host paths.
//! - [`text`]: output bytes to client text.

pub mod audit;
pub mod background;
pub mod config;
pub mod env;
pub mod error;
pub mod exec;
pub mod files;
pub mod forward;
pub mod helper_client;
pub mod hostpath;
pub mod names;
pub mod observe;
pub mod packages;
pub mod sandbox;
pub mod sync;
pub mod shell;
pub mod tarstream;
pub mod text;
pub mod transfer;

pub use config::Config;
pub use error::OrchestratorError;
pub use sandbox::{Command, Sandbox, SandboxManager};
