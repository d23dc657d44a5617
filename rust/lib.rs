//! # sandbox-mcp
//!
//! Local, VM-grade sandboxes for AI agents, served as an MCP server.
//!
//! # Layout
//! - [`proto`]: the generated helper contract (`proto/sandbox_mcp/helper/v1/helper.proto`).
//! - [`paths`]: where every file lives (XDG dirs, sockets), shared by all binaries.
//! - [`clock`]: wall-clock stamps (Unix milliseconds and seconds).
//! - [`image`]: the local image store and the mmdebstrap image builder.
//! - [`helper`]: the Linux VM helper: the gRPC service and its namespace driver.
//! - [`agent`]: the in-sandbox agent that runs one process per Exec.
//! - [`guest`]: PID 1 of a `vm` driver microVM (`sandbox-vm-helper guest-init`).
//! - [`orchestrator`]: sandboxes by name, exec semantics, env, audit; talks to a helper.
//! - [`mcp`]: the MCP tool surface, a thin layer over the orchestrator.
//! - [`daemon`]: the per-user orchestrator daemon and the front-ends MCP clients start.
//! - [`netpolicy`]: the egress policy (parse and decide), shared by helper and orchestrator.
//! - [`doctor`]: host checks behind `sandbox-mcp doctor`.
//! - [`hostsetup`]: what root does once for ordinary users (`sandbox-mcp host-setup`).
//! - [`ctl`]: the sandbox-ctl protocol and the in-sandbox CLI.
#![warn(missing_docs)]

pub mod agent;
pub mod clock;
pub mod ctl;
pub mod daemon;
pub mod doctor;
pub mod guest;
pub mod helper;
#[cfg(linux_host)]
pub mod hostsetup;
pub mod image;
pub mod mcp;
pub mod netpolicy;
pub mod orchestrator;
pub mod paths;
pub mod proto;
#[cfg(test)]
mod test_support;
