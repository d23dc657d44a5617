//! # sandbox-mcp
//!
//! Local, VM-grade sandboxes for AI agents, served as an MCP server.
//!
//! This package is the top of the workspace (README, Architecture): the
//! binaries (`rust/bin`) and what only they use, over the crates below.
//! - [`daemon`]: the per-user orchestrator daemon and the front-ends MCP clients start.
//! - [`doctor`]: host checks behind `sandbox-mcp doctor`.
//! - [`hostsetup`]: what root does once for ordinary users (`sandbox-mcp host-setup`).
#![warn(missing_docs)]

pub mod daemon;
pub mod doctor;
#[cfg(linux_host)]
pub mod hostsetup;
