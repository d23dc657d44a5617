//! qemu's command line for one vm, and the guest kernel's.
use std::ffi::OsString;
use std::path::PathBuf;

use sandbox_guest::handshake::CONTROL_PORT;
use sandbox_guest::{AGENT_PORT, LAYER_SERIAL};

use super::ram::Backing;

/// The PCIe root port the writable disk is attached to, and `/workspace`'s.
/// Both are there from the start, empty, so a VM restored from a memory
/// snapshot taken before either existed can get them (microvm has no
/// hotplug for its virtio-mmio slots; a root port takes `device_add`, and
/// the guest finds the device by rescanning the bus). Without a power
/// controller the slot is live at once, no guest hotplug driver needed.
pub const UPPER_PORT: &str = "rpupper";
/// See [`UPPER_PORT`].
pub const WORKSPACE_PORT: &str = "rpws";

/// Everything the command line says about one vm.
#[derive(Debug, Clone)]
pub struct Machine {
    /// `-accel`: "kvm" or "tcg".
    pub accel: &'static str,
    /// `-smp`.
    pub cpus: u32,
    /// `-m`, MiB.
    pub memory_mib: u64,
    /// What holds the guest's RAM ([`Backing`]).
    pub memory: Backing,
    /// The PVH ELF kernel.
    pub kernel: PathBuf,
    /// The initramfs.
    pub initramfs: PathBuf,
    /// The guest kernel's command line ([`cmdline`]).
    pub cmdline: String,
    /// The image's layers as ext4 files, bottom first (read-only disks).
    pub layers: Vec<PathBuf>,
    /// The socket the helper listens on for the agent's port.
    pub agent_socket: PathBuf,
    /// The socket the helper listens on for guest init's control port (the
    /// "go" handshake, [`sandbox_guest::handshake`]); none for the probe.
    pub control_socket: Option<PathBuf>,
    /// qemu's end of the network card's socket pair (EGRESS), an fd qemu
    /// inherits: the virtio-net card's frames go there.
    pub network: Option<std::os::fd::RawFd>,
    /// QMP's socket (qemu listens).
    pub qmp_socket: PathBuf,
    /// The guest console (kernel messages, guest-init's errors).
    pub console_log: PathBuf,
    /// Wait for an incoming migration (a restore) instead of booting.
    pub incoming: bool,
    /// Start with the CPUs stopped (`-S`): devices are attached over QMP
    /// first, then `cont`.
    pub paused: bool,
}

/// The guest kernel's command line. `quiet` and no timer calibration keep a
/// TCG boot short; microvm has no PIT or HPET to calibrate the TSC against,
/// and the stock kernel stalls without `tsc_early_khz`. `panic=-1` with
/// qemu's `-no-reboot` turns a guest panic into qemu's exit. Parameters
/// after `--` go to init as arguments, `smcp_*=` ones as its environment.
/// Only what every VM of the image shares is here (a memory snapshot of
/// one serves them all); the sandbox's own parameters come in the "go"
/// line ([`sandbox_guest::handshake::Go`]).
pub fn cmdline(layers: usize, probe: bool) -> String {
    let mut c = String::from(
        "console=ttyS0 quiet loglevel=3 tsc_early_khz=2600000 tsc=reliable panic=-1 cryptomgr.notests random.trust_cpu=on",
    );
    if probe {
        c.push_str(" smcp_probe=1");
    } else {
        c.push_str(&format!(" smcp_layers={layers}"));
    }
    c.push_str(" -- guest-init");
    c
}

impl Machine {
    /// qemu's arguments (without the program name).
    pub fn argv(&self) -> Vec<OsString> {
        let mut a: Vec<OsString> = Vec::new();
        let mut push = |parts: &[&str]| a.extend(parts.iter().map(OsString::from));
        // vhost-user (virtiofsd) maps the guest's memory, so it must be
        // shared, always (see super::ram): `/workspace` may be attached
        // after a restore. The
        // RTC stays: the guest's clock is set from it at boot. PCIe carries
        // the devices attached after a restore (see [`UPPER_PORT`]).
        let machine = "microvm,x-option-roms=off,pit=off,pic=off,pcie=on,memory-backend=mem";
        push(&["-M", machine, "-accel", self.accel, "-cpu", if self.accel == "kvm" { "host" } else { "max" }]);
        push(&["-nodefaults", "-no-user-config", "-display", "none", "-no-reboot"]);
        // qemu's own seccomp filter: no exec, no privilege changes, no
        // obsolete syscalls, no resource control.
        push(&["-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"]);
        push(&["-smp", &self.cpus.max(1).to_string(), "-m", &format!("{}M", self.memory_mib)]);
        push(&["-global", "virtio-mmio.force-legacy=false"]);
        push(&["-object", &self.memory.object(self.memory_mib)]);
        let path = |p: &PathBuf| p.to_string_lossy().replace(',', ",,");
        push(&["-kernel", &path(&self.kernel), "-initrd", &path(&self.initramfs), "-append", &self.cmdline]);
        push(&["-serial", &format!("file:{}", path(&self.console_log))]);
        for (i, layer) in self.layers.iter().enumerate() {
            push(&["-drive", &format!("file={},if=none,id=layer{i},format=raw,readonly=on", path(layer))]);
            push(&["-device", &format!("virtio-blk-device,drive=layer{i},serial={LAYER_SERIAL}{i}")]);
        }
        for (i, port) in [UPPER_PORT, WORKSPACE_PORT].iter().enumerate() {
            let n = i + 1;
            push(&[
                "-device",
                &format!("pcie-root-port,id={port},bus=pcie.0,chassis={n},slot={n},power_controller_present=off"),
            ]);
        }
        // The helper listens; qemu connects, and reconnects to a helper that
        // took over after its keeper outlived the one before.
        push(&["-device", "virtio-serial-device"]);
        push(&["-chardev", &format!("socket,id=agent,path={},reconnect=1", path(&self.agent_socket))]);
        push(&["-device", &format!("virtserialport,chardev=agent,name={AGENT_PORT}")]);
        if let Some(control) = &self.control_socket {
            push(&["-chardev", &format!("socket,id=control,path={},reconnect=1", path(control))]);
            push(&["-device", &format!("virtserialport,chardev=control,name={CONTROL_PORT}")]);
        }
        if let Some(fd) = self.network {
            // One frame per datagram on the socket pair the helper made; the
            // card's MAC is the one the stack sends to.
            push(&["-netdev", &format!("dgram,id=net0,local.type=fd,local.str={fd}")]);
            let mac = crate::netstack::GUEST_MAC.0.map(|b| format!("{b:02x}")).join(":");
            push(&["-device", &format!("virtio-net-device,netdev=net0,mac={mac}")]);
        }
        push(&["-qmp", &format!("unix:{},server=on,wait=off", path(&self.qmp_socket))]);
        if self.paused {
            push(&["-S"]);
        }
        if self.incoming {
            push(&["-incoming", "defer"]);
        }
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine() -> Machine {
        Machine {
            accel: "tcg",
            cpus: 2,
            memory_mib: 512,
            memory: Backing::Memfd,
            kernel: "/k/vmlinux".into(),
            initramfs: "/k/initramfs.cpio.gz".into(),
            cmdline: cmdline(2, false),
            layers: vec!["/l/0.ext4".into(), "/l/1,x.ext4".into()],
            agent_socket: "/v/agent.sock".into(),
            control_socket: Some("/v/control.sock".into()),
            network: None,
            qmp_socket: "/v/qmp.sock".into(),
            console_log: "/v/console.log".into(),
            incoming: false,
            paused: true,
        }
    }

    fn joined(m: &Machine) -> String {
        m.argv().iter().map(|a| a.to_string_lossy().into_owned()).collect::<Vec<_>>().join(" ")
    }

    #[test]
    fn argv_maps_cpus_memory_layers_and_sockets() {
        let a = joined(&machine());
        for want in [
            "-accel tcg",
            "-smp 2 -m 512M",
            "-sandbox on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
            "file=/l/0.ext4,if=none,id=layer0,format=raw,readonly=on",
            "drive=layer0,serial=layer0",
            // A comma in a path is doubled, or qemu would read an option.
            "file=/l/1,,x.ext4,if=none,id=layer1,format=raw,readonly=on",
            "memory-backend-memfd,id=mem,size=512M,share=on",
            "pcie=on,memory-backend=mem",
            "pcie-root-port,id=rpupper,bus=pcie.0,chassis=1,slot=1,power_controller_present=off",
            "pcie-root-port,id=rpws,bus=pcie.0,chassis=2,slot=2,power_controller_present=off",
            "socket,id=agent,path=/v/agent.sock,reconnect=1",
            "virtserialport,chardev=agent,name=agent",
            "socket,id=control,path=/v/control.sock,reconnect=1",
            "virtserialport,chardev=control,name=smcp-control",
            "-no-reboot",
            "-S",
        ] {
            assert!(a.contains(want), "{want:?} missing from {a}");
        }
        assert!(!a.contains("-incoming"), "{a}");
        assert!(!a.contains("-netdev"), "no network card without EGRESS: {a}");
    }

    #[test]
    fn egress_adds_a_card_whose_frames_go_to_the_helpers_socket() {
        let mut m = machine();
        m.network = Some(17);
        let a = joined(&m);
        for want in [
            "-netdev dgram,id=net0,local.type=fd,local.str=17",
            "-device virtio-net-device,netdev=net0,mac=52:54:00:0a:00:0f",
        ] {
            assert!(a.contains(want), "{want:?} missing from {a}");
        }
    }

    #[test]
    fn a_restore_waits_for_its_state_and_the_probe_has_no_control_port() {
        let mut m = machine();
        m.incoming = true;
        m.control_socket = None;
        let a = joined(&m);
        assert!(a.ends_with("-S -incoming defer"), "{a}");
        assert!(!a.contains("smcp-control"), "{a}");
    }

    #[test]
    fn cmdline_hands_init_only_what_the_image_shares() {
        let c = cmdline(3, false);
        assert!(c.contains(" smcp_layers=3 -- guest-init"), "{c}");
        assert!(c.contains("panic=-1") && !c.contains("hostname"), "{c}");
        let p = cmdline(0, true);
        assert!(p.contains("smcp_probe=1") && !p.contains("smcp_layers"), "{p}");
    }
}
