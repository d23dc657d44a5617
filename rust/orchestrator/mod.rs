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
//! - [`text`]: output bytes to client text.

pub mod audit;
pub mod env;
pub mod error;
pub mod exec;
pub mod files;
pub mod helper_client;
pub mod names;
pub mod packages;
pub mod sandbox;
pub mod text;

pub use error::OrchestratorError;
pub use sandbox::{Command, ManagerConfig, Sandbox, SandboxManager};
