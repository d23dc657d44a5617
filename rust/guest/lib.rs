//! The guest side of the `vm` driver: `sandbox-vm-helper guest-init`, PID 1
//! of a qemu microVM, started by the kernel from the initramfs that
//! `scripts/vm-initramfs.sh` builds around this very binary.
//!
//! - [`modules`]: loads the kernel modules the initramfs carries.
//! - [`rootfs`]: the image's layers (read-only disks) under an overlay whose
//!   writable layer is the VM's own disk, `/workspace` over virtiofs, and the
//!   switch into that root.
//! - [`network`]: eth0 and the resolver, when the VM has a network card.
//! - [`cgroup`]: the guest's cgroup hierarchy and the sandbox's group, where
//!   its task and memory limits hold.
//! - [`containers`]: dockerd, in images that have Docker Engine.
//! - [`agent`]: starts the agent on the virtio-serial port before the "go"
//!   (a memory snapshot holds it started), has it enter the sandbox's root
//!   after, reaps orphans and powers the VM off when the agent ends.
//!
//! - [`layer_archive`]: a snapshot's archive of the writable layer, frozen.
//! - [`handshake`]: waits for the host's "go" (hostname, clock, RNG seed)
//!   before anything sandbox-specific, the point a memory snapshot is taken.
//!
//! What is the same for every VM of an image passes on the kernel command
//! line as `smcp_*=` parameters, which the kernel hands to init as
//! environment variables (see [`BootConfig`]); what is the sandbox's own
//! comes in the [`handshake::Go`] line.
//!
//! The constants below are the contract the host side shares with the
//! guest, so they build everywhere; the rest runs only in a Linux guest.
#[cfg(linux_host)]
pub mod agent;
#[cfg(linux_host)]
pub mod cgroup;
#[cfg(linux_host)]
pub mod containers;
#[cfg(linux_host)]
pub mod handshake;
#[cfg(linux_host)]
pub mod layer_archive;
#[cfg(linux_host)]
pub mod modules;
#[cfg(linux_host)]
pub mod network;
#[cfg(linux_host)]
pub mod rootfs;

/// Where the initramfs keeps this binary, its loader, its libraries and the
/// modules; bound read-only into the sandbox's root at [`AGENT_DIR`]. The
/// agent is guest init's own fork ([`agent::serve`]), so it runs with these
/// libraries whatever libc the image has.
pub const LIB_DIR: &str = "/lib/sandbox-mcp";
/// [`LIB_DIR`] as the sandbox's root shows it.
pub const AGENT_DIR: &str = "/run/sandbox-mcp";
pub use sandbox_agent::LAYER_VIEW;
/// The virtio-serial port the agent serves (qemu's `virtserialport` name).
pub const AGENT_PORT: &str = "agent";
/// What guest-init writes on the agent port in probe mode (the helper's
/// KVM probe waits for it).
pub const PROBE_OK: &[u8] = b"sandbox-mcp probe ok\n";
/// Disk serials: `layer0` (the image's bottom layer) … and the VM's own
/// writable disk.
pub const LAYER_SERIAL: &str = "layer";
/// The writable disk's serial.
pub const UPPER_SERIAL: &str = "upper";
/// The virtiofs tag of `/workspace`.
pub const WORKSPACE_TAG: &str = "workspace";
/// Where the guest mounts its cgroup2 hierarchy.
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// The sandbox's group under [`CGROUP_ROOT`] (see `cgroup`).
pub const SANDBOX_GROUP: &str = "sandbox";

/// Why the guest could not become a sandbox.
#[cfg(linux_host)]
#[derive(Debug, thiserror::Error)]
pub enum GuestError {
    /// A system call failed.
    #[error("{what}: {source}")]
    Sys {
        /// What was being done.
        what: String,
        /// The errno.
        source: nix::errno::Errno,
    },
    /// The kernel command line lacks or garbles a parameter.
    #[error("kernel command line: {0}")]
    Config(String),
    /// The network card could not be configured.
    #[error("eth0: {0}")]
    Network(String),
    /// A device the host should have attached never appeared.
    #[error("no {0} appeared")]
    Missing(String),
}

#[cfg(linux_host)]
impl GuestError {
    fn sys(what: impl Into<String>, source: nix::errno::Errno) -> Self {
        GuestError::Sys { what: what.into(), source }
    }
    fn io(what: impl Into<String>, e: std::io::Error) -> Self {
        GuestError::sys(what, nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))
    }
}

/// What the host asks of this boot, from `smcp_*` kernel parameters.
#[cfg(linux_host)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootConfig {
    /// How many layer disks there are (`smcp_layers`), at least one.
    pub layers: usize,
    /// A boot probe (`smcp_probe=1`): answer on the agent port once the
    /// modules are loaded, then power off (no disks, no agent).
    pub probe: bool,
}

#[cfg(linux_host)]
impl BootConfig {
    /// Reads the parameters from `vars` (the process environment at boot).
    pub fn from_vars(vars: impl IntoIterator<Item = (String, String)>) -> Result<Self, GuestError> {
        let (mut layers, mut probe) = (None, false);
        for (k, v) in vars {
            match k.as_str() {
                "smcp_layers" => {
                    let n: usize =
                        v.parse().map_err(|_| GuestError::Config(format!("smcp_layers={v} is not a number")))?;
                    if n == 0 {
                        return Err(GuestError::Config("smcp_layers=0: an image has at least one layer".into()));
                    }
                    layers = Some(n);
                }
                "smcp_probe" => probe = v == "1",
                _ => {}
            }
        }
        let layers = match (layers, probe) {
            (Some(n), _) => n,
            (None, true) => 0,
            (None, false) => return Err(GuestError::Config("smcp_layers is missing".into())),
        };
        Ok(BootConfig { layers, probe })
    }
}

/// PID 1's whole life; returns only on failure (the caller powers off).
#[cfg(linux_host)]
pub fn run() -> GuestError {
    let step = || -> Result<std::convert::Infallible, GuestError> {
        let config = BootConfig::from_vars(std::env::vars())?;
        rootfs::mount_early()?;
        modules::load_all(std::path::Path::new(LIB_DIR).join("modules").as_path())?;
        if config.probe {
            agent::answer_probe()?;
            agent::power_off();
        }
        rootfs::mount_layers(&config)?;
        let mut agent = agent::start()?;
        let (go, mut control) = handshake::wait_for_go()?;
        handshake::apply(&go)?;
        handshake::rescan_pci()?;
        rootfs::assemble(&config, &go)?;
        let group = cgroup::sandbox_group(&go.limits)?;
        network::up()?;
        containers::start();
        agent.enter_root(&group)?;
        handshake::say_rooted(&mut control)?;
        agent.supervise()
    };
    match step() {
        Ok(never) => match never {},
        Err(e) => e,
    }
}

#[cfg(all(test, linux_host))]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn boot_config_reads_the_smcp_parameters() {
        let c = BootConfig::from_vars(vars(&[("smcp_layers", "3"), ("TERM", "linux")])).unwrap();
        assert_eq!(c, BootConfig { layers: 3, probe: false });
        let p = BootConfig::from_vars(vars(&[("smcp_probe", "1")])).unwrap();
        assert!(p.probe && p.layers == 0);
    }

    #[test]
    fn boot_config_names_the_bad_parameter() {
        let e = BootConfig::from_vars(vars(&[("smcp_layers", "x")])).unwrap_err().to_string();
        assert!(e.contains("smcp_layers=x"), "{e}");
        let e = BootConfig::from_vars(vars(&[("smcp_layers", "0")])).unwrap_err().to_string();
        assert!(e.contains("smcp_layers=0"), "{e}");
        let e = BootConfig::from_vars(vars(&[])).unwrap_err().to_string();
        assert!(e.contains("smcp_layers is missing"), "{e}");
    }
}
