//! The Linux VM helper: serves the `VmHelper` gRPC contract on a Unix socket
//! and runs each "VM" as a namespace sandbox with an agent inside.
//!
//! - [`server`]: socket, health, reflection, signals.
//! - [`service`]: the gRPC trait impl; the only place with proto types.
//! - [`vm`]: the registry and lifecycle state machine.
//! - [`spec`]: validated VM specs with defaults.
//! - [`storage`]: the VM's host files (layers, agent socket, shared dirs).
//! - [`seed`]: files placed in a new VM's writable layer before it starts.
//! - [`agent_link`]: the one multiplexed connection to each VM's agent.
//! - [`exec`]: the helper's side of an Exec (a stream on that connection).
//! - [`guest`]: the helper's side of copies, background processes, dials
//!   to guest ports and the guest's own usage readings.
//! - [`stats`]: a running VM's resource usage (the agent's reading plus
//!   the host's limits).
//! - [`netstack`]: egress through a user-mode network stack, under the VM's policy.
//! - [`driver`]: the driver seam ([`driver::Driver`], [`driver::Instance`]),
//!   the namespace driver (namespaces, cgroups, seccomp, rootfs, the VM's
//!   network link), the qemu one, and the swift one (a VM layer across
//!   swift-bridge).
//! - [`error`]: [`HelperError`], mapped to gRPC codes in `service::status`.
//!
//! The id map every VM and image gets on Linux is `sandbox_userns`'s; what
//! PID 1 sets up in a sandbox's network, `sandbox_net::setup`.
pub mod agent_link;
pub mod driver;
pub mod error;
pub mod exec;
pub mod guest;
#[cfg(linux_host)]
pub mod leftovers;
pub mod netstack;
pub mod quota;
pub mod seed;
pub mod server;
pub mod service;
pub mod spec;
pub mod stats;
pub mod storage;
pub mod vm;

pub use error::HelperError;
pub use server::serve;

/// Entry point of the hidden `__vm-init` subcommand (a VM's launcher; its
/// config arrives on stdin); `eth0`: create eth0's tun. Must run before
/// anything starts a thread; returns the exit code.
#[cfg(linux_host)]
pub fn vm_init(eth0: bool) -> i32 {
    driver::namespace::init::run(eth0)
}
