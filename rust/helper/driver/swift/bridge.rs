//! The swift-bridge contract between the shared Rust helper and a VM layer
//! on the other side of the bridge (Swift on a Mac, on Apple's
//! containerization; the Rust double on Linux). It mirrors the driver seam
//! ([`crate::driver`]) one to one and nothing more: everything
//! else (exec, copies, dial to guest ports, stats) goes through the agent
//! protocol on the stream `layer_dial_agent` hands back.
//!
//! Names are the contract: the Swift side implements the `extern "Swift"`
//! functions under these names, and build.rs generates the glue from this
//! file. Every call names its VM by the id Rust booted it with. Paths cross
//! as UTF-8 strings (Foundation's `URL(fileURLWithPath:)` needs no more).
// The generated FFI-side items carry no docs; the comments here are what
// the Swift developer reads.
#![allow(missing_docs)]
// The generated `extern "C"` entry points take swift-bridge's raw pointers
// by design (the C ABI); they are safe to call only from the glue.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

#[swift_bridge::bridge]
pub mod ffi {
    // What the layer can do here ([`crate::driver::Capabilities`]).
    #[swift_bridge(swift_repr = "struct")]
    pub struct LayerCapabilities {
        pub tty: bool,
        pub network_egress: bool,
        pub limits: bool,
        // The cgroup flavour enforcing the limits (`cgroups.v2`), empty if none.
        pub cgroups: String,
        pub seccomp: bool,
        pub own_kernel: bool,
        pub dial: bool,
        pub snapshot: bool,
        pub containers: bool,
        // Boots images by OCI reference (`BootRequest.image_reference`).
        pub pull_images: bool,
    }

    // The layer as the helper lists it in GetInfo.
    #[swift_bridge(swift_repr = "struct")]
    pub struct LayerInfo {
        // The driver name VMs ask for (`vm` on a Mac).
        pub name: String,
        // Why it cannot run VMs on this host; empty when it can.
        pub unavailable_reason: String,
        pub capabilities: LayerCapabilities,
    }

    // The guest's network card on the helper's network stack: the frame
    // socket, and the card the stack expects at its other end (the same
    // addresses as the Linux drivers' guests).
    #[swift_bridge(swift_repr = "struct")]
    pub struct LayerNetwork {
        // The datagram socket carrying the card's Ethernet frames, one per
        // datagram (a VZFileHandleNetworkDeviceAttachment on a Mac); -1: no
        // card. The layer owns it from here on.
        pub fd: i32,
        // The card's MAC (`52:54:00:0a:00:0f`): the stack sends the guest's
        // frames to it.
        pub mac: String,
        // The guest's address with its prefix (`10.0.2.15/24`), its
        // gateway and its resolver (both the stack).
        pub address: String,
        pub gateway: String,
        pub nameserver: String,
        // The card's MTU (no offloads).
        pub mtu: u32,
    }

    // Everything the layer needs to boot one VM
    // ([`crate::driver::BootSpec`]).
    #[swift_bridge(swift_repr = "struct")]
    pub struct BootRequest {
        // The VM id every later call names.
        pub id: String,
        pub hostname: String,
        // The image's read-only layers, bottom first.
        pub layers: Vec<String>,
        // The VM's own directory (writable layer `upper`, `work`).
        pub dir: String,
        // Host directories shared in (the workspace among them), as three
        // lists of one length: swift-bridge 0.1.59 has no Vec of shared
        // structs. `mount_guests` are absolute paths inside the guest.
        pub mount_hosts: Vec<String>,
        pub mount_guests: Vec<String>,
        pub mount_read_only: Vec<bool>,
        pub cpus: u32,
        pub memory_bytes: u64,
        pub pids: u32,
        // The writable disk's size.
        pub disk_bytes: u64,
        // The guest's network card (`network.fd` -1: none).
        pub network: LayerNetwork,
        // An OCI reference to pull the root filesystem from instead of
        // `layers` (which then hold only what was committed on it, disk
        // layers); empty: the layers are the whole image.
        pub image_reference: String,
    }

    // A running VM's limits and OOM kills ([`crate::driver::HostFacts`]).
    #[swift_bridge(swift_repr = "struct")]
    pub struct LayerHostFacts {
        pub memory_limit_bytes: u64,
        pub pids_limit: u64,
        pub oom_killed: bool,
    }

    // Where a VM's processes show on the host, -1 each when they do not (a
    // Mac's guests run their own kernel): the disk quota watcher stops the
    // writers there, sparing the agent
    // ([`crate::driver::HostProcesses`]).
    #[swift_bridge(swift_repr = "struct")]
    pub struct LayerHostProcesses {
        pub pid1: i32,
        pub agent: i32,
    }

    // Why a layer call failed: the variants are what the helper branches
    // on, the message what the user reads.
    pub enum LayerError {
        // The layer cannot do that on this host (no entitlement, no
        // kernel, a refused spec); gRPC `UNAVAILABLE` with the message.
        Unavailable(String),
        // No VM with that id (the helper's own registry answers unknown
        // ids first; this is the layer disagreeing).
        NotFound(String),
        // The call was made but failed; gRPC `INTERNAL`.
        Failed(String),
    }

    extern "Swift" {
        // The layer's name, availability and capabilities.
        fn layer_info() -> LayerInfo;
        // Boots a VM; resolves once it runs (the agent is dialled next).
        async fn layer_boot(request: BootRequest) -> Result<(), LayerError>;
        // A new connected stream to the VM's agent (vsock on a Mac); the
        // caller owns the fd.
        async fn layer_dial_agent(id: String) -> Result<i32, LayerError>;
        // Asks the guest to shut down; returns at once.
        fn layer_request_stop(id: String);
        // Ends the VM now.
        fn layer_kill(id: String);
        // Resolves once the VM is gone, with how it ended.
        async fn layer_wait_exit(id: String) -> String;
        // Copies the writable layer `upper` to `dst` with the guest
        // paused. Blocking: the helper calls it off its runtime.
        fn layer_snapshot(id: String, upper: String, dst: String) -> Result<(), LayerError>;
        // Limits and OOM kills as the host sees them.
        fn layer_host_facts(id: String) -> LayerHostFacts;
        // Where the VM's processes show on the host.
        fn layer_host_processes(id: String) -> LayerHostProcesses;
        // Why this VM's limits are not enforced; empty when they are.
        fn layer_limits_not_enforced(id: String) -> String;
        // Releases what the VM held; called once it is gone.
        fn layer_cleanup(id: String);
        // Prepares whatever makes the next boot faster.
        fn layer_keep_warm();
        // Releases host-wide resources (helper exit).
        async fn layer_release();
    }

    extern "Rust" {
        // The helper's whole life: the Swift executable's `main` calls it
        // with its arguments (`serve --socket PATH`) and exits with the
        // status it returns.
        fn helper_main(args: Vec<String>) -> i32;
    }
}

/// `extern "Rust"`'s implementation: the generated glue calls it by name.
fn helper_main(args: Vec<String>) -> i32 {
    super::main::run(args)
}
