//! sandbox-ctl: the NDJSON protocol between a sandbox and the orchestrator
//! (internals §15) and the small in-sandbox CLI that speaks it (§16).
//!
//! - [`protocol`]: request/response shapes, error codes, limits and paths,
//!   shared by the orchestrator's server (`orchestrator::ctl`) and the CLI.
//! - [`client`]: one request over the Unix socket.
//! - [`cli`]: argument parsing and output of the `sandbox-ctl` binary.
pub mod cli;
pub mod client;
pub mod protocol;
