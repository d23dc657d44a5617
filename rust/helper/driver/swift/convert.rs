//! Conversions between the bridge's types ([`ffi`]) and the driver seam's,
//! both ways: the helper's side builds requests and reads answers, the
//! Linux double ([`super::double`]) reads requests and builds answers.
use std::path::{Path, PathBuf};

use super::bridge::ffi;
use crate::driver::{BindMount, BootSpec, Capabilities, DriverError, HostFacts, HostProcesses, Limits};

/// Why a value cannot cross the bridge.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConvertError {
    /// Paths cross as UTF-8 strings (what Swift's `String` holds).
    #[error("{what} is not UTF-8: {path:?}")]
    NotUtf8 {
        /// Which path.
        what: &'static str,
        /// The path, lossily.
        path: String,
    },
    /// The three mount lists of a request differ in length.
    #[error("mount lists differ in length: {hosts} hosts, {guests} guest paths, {read_only} read-only flags")]
    MountLists {
        /// Host paths.
        hosts: usize,
        /// Guest paths.
        guests: usize,
        /// Read-only flags.
        read_only: usize,
    },
    /// A NUL byte: no system call takes such an id or path.
    #[error("{what} holds a NUL byte")]
    Nul {
        /// Which value.
        what: &'static str,
    },
}

/// The card the helper's stack serves on frame socket `fd` (-1: no card):
/// its MAC and addresses are the stack's ([`crate::netstack`]), so
/// the layer's guest is addressed as every Linux driver's is.
pub fn network_card(fd: i32) -> ffi::LayerNetwork {
    use crate::netstack::{DNS, GATEWAY, GUEST, GUEST_MAC, PREFIX, device::ETHERNET_MTU};
    let mac = GUEST_MAC.0.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":");
    ffi::LayerNetwork {
        fd,
        mac,
        address: format!("{GUEST}/{PREFIX}"),
        gateway: GATEWAY.to_string(),
        nameserver: DNS.to_string(),
        mtu: ETHERNET_MTU as u32,
    }
}

fn utf8(what: &'static str, path: &Path) -> Result<String, ConvertError> {
    path.to_str().map(str::to_owned).ok_or_else(|| ConvertError::NotUtf8 { what, path: path.display().to_string() })
}

impl TryFrom<&BootSpec> for ffi::BootRequest {
    type Error = ConvertError;

    /// The request without a network card (`network.fd` -1): the driver
    /// sets the frame socket when the VM has EGRESS.
    fn try_from(spec: &BootSpec) -> Result<Self, ConvertError> {
        let layers = spec.layers.iter().map(|l| utf8("an image layer", l)).collect::<Result<_, _>>()?;
        let mut mount_hosts = Vec::with_capacity(spec.mounts.len());
        let mut mount_guests = Vec::with_capacity(spec.mounts.len());
        for m in &spec.mounts {
            mount_hosts.push(utf8("a mount's host path", &m.host)?);
            mount_guests.push(utf8("a mount's guest path", &m.guest)?);
        }
        Ok(ffi::BootRequest {
            id: spec.id.clone(),
            hostname: spec.hostname.clone(),
            layers,
            dir: utf8("the vm directory", &spec.dir)?,
            mount_hosts,
            mount_guests,
            mount_read_only: spec.mounts.iter().map(|m| m.read_only).collect(),
            cpus: spec.limits.cpus,
            memory_bytes: spec.limits.memory_bytes,
            pids: spec.limits.pids,
            disk_bytes: spec.disk_bytes,
            network: network_card(-1),
            image_reference: spec.image_reference.clone().unwrap_or_default(),
        })
    }
}

impl TryFrom<ffi::BootRequest> for BootSpec {
    type Error = ConvertError;

    /// The layer's reading of a request, without EGRESS: the policy does
    /// not cross the bridge (on a Mac it is enforced on the frames).
    fn try_from(r: ffi::BootRequest) -> Result<Self, ConvertError> {
        if r.mount_hosts.len() != r.mount_guests.len() || r.mount_hosts.len() != r.mount_read_only.len() {
            return Err(ConvertError::MountLists {
                hosts: r.mount_hosts.len(),
                guests: r.mount_guests.len(),
                read_only: r.mount_read_only.len(),
            });
        }
        let no_nul = |what, s: &str| if s.contains('\0') { Err(ConvertError::Nul { what }) } else { Ok(()) };
        no_nul("the vm id", &r.id)?;
        no_nul("the hostname", &r.hostname)?;
        no_nul("the vm directory", &r.dir)?;
        for s in r.layers.iter().chain(&r.mount_hosts).chain(&r.mount_guests) {
            no_nul("a path", s)?;
        }
        no_nul("the image reference", &r.image_reference)?;
        let mounts = r
            .mount_hosts
            .into_iter()
            .zip(r.mount_guests)
            .zip(r.mount_read_only)
            .map(|((host, guest), read_only)| BindMount { host: host.into(), guest: guest.into(), read_only })
            .collect();
        Ok(BootSpec {
            id: r.id,
            hostname: r.hostname,
            layers: r.layers.into_iter().map(PathBuf::from).collect(),
            dir: r.dir.into(),
            mounts,
            limits: Limits { cpus: r.cpus, memory_bytes: r.memory_bytes, pids: r.pids },
            image_reference: Some(r.image_reference).filter(|r| !r.is_empty()),
            disk_bytes: r.disk_bytes,
            egress: None,
        })
    }
}

impl From<ffi::LayerError> for DriverError {
    fn from(e: ffi::LayerError) -> Self {
        match e {
            ffi::LayerError::Unavailable(why) => DriverError::Unavailable(why),
            ffi::LayerError::NotFound(id) => DriverError::LayerNotFound(id),
            ffi::LayerError::Failed(why) => DriverError::LayerFailed(why),
        }
    }
}

impl From<DriverError> for ffi::LayerError {
    /// What the layer tells the helper: what the host cannot do stays
    /// `Unavailable`, the rest failed (with the driver's message).
    fn from(e: DriverError) -> Self {
        match e {
            DriverError::Unavailable(why) => ffi::LayerError::Unavailable(why),
            DriverError::LayerNotFound(id) => ffi::LayerError::NotFound(id),
            other => ffi::LayerError::Failed(other.to_string()),
        }
    }
}

impl From<ConvertError> for ffi::LayerError {
    /// A request the layer cannot read is refused, not failed: nothing ran.
    fn from(e: ConvertError) -> Self {
        ffi::LayerError::Unavailable(format!("boot request: {e}"))
    }
}

/// The cgroup flavours GetInfo names (`Capabilities::cgroups` is static).
const CGROUPS: [&str; 2] = ["cgroups.v1", "cgroups.v2"];

impl From<ffi::LayerCapabilities> for Capabilities {
    /// An unknown cgroup flavour reads as none: GetInfo lists only those
    /// the orchestrator knows.
    fn from(c: ffi::LayerCapabilities) -> Self {
        Capabilities {
            tty: c.tty,
            network_egress: c.network_egress,
            limits: c.limits,
            cgroups: CGROUPS.into_iter().find(|&k| k == c.cgroups),
            seccomp: c.seccomp,
            own_kernel: c.own_kernel,
            dial: c.dial,
            snapshot: c.snapshot,
            containers: c.containers,
            pull_images: c.pull_images,
        }
    }
}

impl From<&Capabilities> for ffi::LayerCapabilities {
    fn from(c: &Capabilities) -> Self {
        ffi::LayerCapabilities {
            tty: c.tty,
            network_egress: c.network_egress,
            limits: c.limits,
            cgroups: c.cgroups.unwrap_or_default().into(),
            seccomp: c.seccomp,
            own_kernel: c.own_kernel,
            dial: c.dial,
            snapshot: c.snapshot,
            containers: c.containers,
            pull_images: c.pull_images,
        }
    }
}

impl From<ffi::LayerHostFacts> for HostFacts {
    /// The bridge carries limits only: a Mac's VMs are counted by their
    /// guest's own group ([`crate::stats`]), so the host's counters
    /// would go unused there; across it they are unknown.
    fn from(f: ffi::LayerHostFacts) -> Self {
        HostFacts {
            memory_limit_bytes: f.memory_limit_bytes,
            pids_limit: f.pids_limit,
            oom_killed: f.oom_killed,
            usage: None,
        }
    }
}

impl From<HostFacts> for ffi::LayerHostFacts {
    fn from(f: HostFacts) -> Self {
        ffi::LayerHostFacts {
            memory_limit_bytes: f.memory_limit_bytes,
            pids_limit: f.pids_limit,
            oom_killed: f.oom_killed,
        }
    }
}

impl From<ffi::LayerHostProcesses> for Option<HostProcesses> {
    /// -1 (or any pid below 1) is "not on the host".
    fn from(p: ffi::LayerHostProcesses) -> Self {
        (p.pid1 > 0 && p.agent > 0).then_some(HostProcesses { pid1: p.pid1, agent: p.agent })
    }
}

impl From<Option<HostProcesses>> for ffi::LayerHostProcesses {
    fn from(p: Option<HostProcesses>) -> Self {
        p.map_or(ffi::LayerHostProcesses { pid1: -1, agent: -1 }, |p| ffi::LayerHostProcesses {
            pid1: p.pid1,
            agent: p.agent,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::ffi::OsStrExt as _;

    use super::*;

    fn spec() -> BootSpec {
        BootSpec {
            id: "vm-1".into(),
            hostname: "box".into(),
            layers: vec!["/store/rootfs".into(), "/store/l1".into()],
            dir: "/run/vms/vm-1".into(),
            mounts: vec![
                BindMount { host: "/home/u/ws".into(), guest: "/workspace".into(), read_only: false },
                BindMount { host: "/data".into(), guest: "/data".into(), read_only: true },
            ],
            limits: Limits { cpus: 2, memory_bytes: 1 << 30, pids: 512 },
            image_reference: Some("docker.io/library/python:3.12-bookworm".into()),
            disk_bytes: 4 << 30,
            egress: None,
        }
    }

    /// `spec()` as a request (the bridge's structs have no Debug to unwrap with).
    fn request() -> ffi::BootRequest {
        ffi::BootRequest::try_from(&spec()).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_spec_crosses_and_comes_back_the_same() {
        let request = request();
        assert_eq!(request.network.fd, -1);
        assert_eq!(request.mount_guests, ["/workspace", "/data"]);
        assert_eq!(request.mount_read_only, [false, true]);
        let back = BootSpec::try_from(request).unwrap();
        let want = spec();
        assert_eq!(
            (back.id, back.hostname, back.layers, back.dir, back.mounts, back.limits, back.disk_bytes),
            (want.id, want.hostname, want.layers, want.dir, want.mounts, want.limits, want.disk_bytes)
        );
        assert_eq!(back.image_reference, want.image_reference);
        let mut none = spec();
        none.image_reference = None;
        let request = ffi::BootRequest::try_from(&none).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(request.image_reference, "", "no reference crosses as empty");
        assert_eq!(BootSpec::try_from(request).unwrap().image_reference, None);
        assert!(back.egress.is_none());
    }

    #[test]
    fn the_card_has_the_stacks_mac_and_addresses() {
        let card = network_card(7);
        assert_eq!(card.fd, 7);
        assert_eq!(card.mac, "52:54:00:0a:00:0f");
        assert_eq!(
            (card.address.as_str(), card.gateway.as_str(), card.nameserver.as_str()),
            ("10.0.2.15/24", "10.0.2.2", "10.0.2.3")
        );
        assert_eq!(card.mtu, 1500);
    }

    #[test]
    fn a_path_that_is_not_utf8_is_refused_naming_it() {
        let mut s = spec();
        s.mounts[1].host = PathBuf::from(std::ffi::OsStr::from_bytes(b"/da\xfft"));
        let e = ffi::BootRequest::try_from(&s).err().unwrap();
        assert!(matches!(e, ConvertError::NotUtf8 { what: "a mount's host path", .. }), "{e}");
        let mut s = spec();
        s.layers[0] = PathBuf::from(std::ffi::OsStr::from_bytes(b"\x80"));
        assert!(matches!(ffi::BootRequest::try_from(&s), Err(ConvertError::NotUtf8 { what: "an image layer", .. })));
    }

    #[test]
    fn mount_lists_of_different_lengths_are_refused() {
        let mut r = request();
        r.mount_read_only.pop();
        let e = BootSpec::try_from(r).unwrap_err();
        assert_eq!(e, ConvertError::MountLists { hosts: 2, guests: 2, read_only: 1 });
    }

    #[test]
    fn a_nul_in_an_id_or_path_is_refused() {
        let mut r = request();
        r.id = "vm\0../../etc".into();
        assert_eq!(BootSpec::try_from(r).unwrap_err(), ConvertError::Nul { what: "the vm id" });
        let mut r = request();
        r.mount_guests[0] = "/work\0space".into();
        assert_eq!(BootSpec::try_from(r).unwrap_err(), ConvertError::Nul { what: "a path" });
    }

    #[test]
    fn layer_errors_map_to_what_callers_branch_on() {
        assert!(matches!(
            DriverError::from(ffi::LayerError::Unavailable("no entitlement".into())),
            DriverError::Unavailable(m) if m == "no entitlement"
        ));
        assert!(
            matches!(DriverError::from(ffi::LayerError::NotFound("vm-9".into())), DriverError::LayerNotFound(id) if id == "vm-9")
        );
        let failed = DriverError::from(ffi::LayerError::Failed("vz: boot failed".into()));
        assert_eq!(failed.to_string(), "vm layer: vz: boot failed");
        // And back, as the double reports the namespace driver's errors.
        assert!(matches!(
            ffi::LayerError::from(DriverError::Timeout("the agent")),
            ffi::LayerError::Failed(m) if m == "timed out waiting for the agent"
        ));
        assert!(
            matches!(ffi::LayerError::from(DriverError::Unavailable("x".into())), ffi::LayerError::Unavailable(m) if m == "x")
        );
        assert!(matches!(
            ffi::LayerError::from(ConvertError::Nul { what: "the vm id" }),
            ffi::LayerError::Unavailable(m) if m == "boot request: the vm id holds a NUL byte"
        ));
    }

    #[test]
    fn capabilities_cross_both_ways_and_unknown_cgroups_read_as_none() {
        let caps = Capabilities {
            tty: true,
            network_egress: true,
            limits: true,
            cgroups: Some("cgroups.v2"),
            seccomp: false,
            own_kernel: true,
            dial: true,
            snapshot: true,
            containers: false,
            pull_images: true,
        };
        assert_eq!(Capabilities::from(ffi::LayerCapabilities::from(&caps)), caps);
        let mut odd = ffi::LayerCapabilities::from(&caps);
        odd.cgroups = "cgroups.v3".into();
        assert_eq!(Capabilities::from(odd).cgroups, None);
    }

    #[test]
    fn host_facts_and_processes_cross_and_minus_one_is_none() {
        let facts = HostFacts { memory_limit_bytes: 7, pids_limit: 9, oom_killed: true, usage: None };
        assert_eq!(HostFacts::from(ffi::LayerHostFacts::from(facts)), facts);
        let counted = HostFacts { usage: Some(crate::driver::GroupUsage::default()), ..facts };
        assert_eq!(HostFacts::from(ffi::LayerHostFacts::from(counted)), facts, "counters do not cross");
        let p = HostProcesses { pid1: 10, agent: 11 };
        assert_eq!(Option::<HostProcesses>::from(ffi::LayerHostProcesses::from(Some(p))), Some(p));
        assert_eq!(Option::<HostProcesses>::from(ffi::LayerHostProcesses::from(None)), None);
        assert_eq!(Option::<HostProcesses>::from(ffi::LayerHostProcesses { pid1: 0, agent: 3 }), None);
    }
}
