//! Whether this host's KVM really runs our guest kernel. An openable
//! /dev/kvm is not enough: on a kvm_pvm host (a PVM-only KVM, as in
//! Firecracker VMs) the device answers but a stock kernel stalls early in
//! boot. So a probe vm boots our kernel and initramfs under KVM and must
//! reach guest-init's probe answer within a timeout; otherwise the driver
//! uses TCG and says why.
use std::path::Path;
use std::time::Duration;

use tokio::io::AsyncReadExt as _;
use tokio::net::UnixListener;

use super::argv::{Machine, cmdline};
use super::assets::Assets;
use super::instance::spawn;
use super::{Accel, QemuError};

pub use sandbox_guest::PROBE_OK;
/// How long a KVM boot may take: one second is typical, a stalled kernel
/// never answers.
pub const KVM_BOOT_TIMEOUT: Duration = Duration::from_secs(15);

/// KVM if a probe vm boots under it (in `run_dir`), else TCG with the reason.
pub async fn detect(assets: &Assets, run_dir: &Path) -> Accel {
    match kvm_boots(assets, run_dir, KVM_BOOT_TIMEOUT).await {
        Ok(()) => Accel::Kvm,
        Err(kvm_unusable) => {
            tracing::info!(reason = %kvm_unusable, "KVM unusable for vm sandboxes; using TCG");
            Accel::Tcg { kvm_unusable }
        }
    }
}

/// Why KVM cannot run our kernel, or `Ok` once a probe vm answered.
pub async fn kvm_boots(assets: &Assets, run_dir: &Path, timeout: Duration) -> Result<(), String> {
    if let Err(e) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/kvm") {
        let fix = if e.kind() == std::io::ErrorKind::PermissionDenied { " (add the user to group kvm)" } else { "" };
        return Err(format!("/dev/kvm: {e}{fix}"));
    }
    boot_probe(assets, run_dir, &Accel::Kvm, timeout).await.map_err(|e| match e {
        QemuError::Timeout { secs, .. } => format!(
            "a probe vm did not boot the guest kernel under KVM within {secs} s (this KVM cannot run a stock \
             kernel, as on kvm_pvm hosts)"
        ),
        other => format!("a probe vm failed under KVM: {other}"),
    })
}

/// Boots the kernel and initramfs alone under `accel` and waits for
/// guest-init's probe answer on the agent port.
pub async fn boot_probe(assets: &Assets, run_dir: &Path, accel: &Accel, timeout: Duration) -> Result<(), QemuError> {
    std::fs::create_dir_all(run_dir).map_err(|e| QemuError::io(format!("create {}", run_dir.display()), e))?;
    let agent_socket = run_dir.join("probe.sock");
    let _ = std::fs::remove_file(&agent_socket);
    let listener =
        UnixListener::bind(&agent_socket).map_err(|e| QemuError::io(format!("bind {}", agent_socket.display()), e))?;
    let machine = Machine {
        accel: accel.name(),
        cpus: 1,
        memory_mib: 256,
        kernel: assets.kernel.clone(),
        initramfs: assets.initramfs.clone(),
        cmdline: cmdline(0, true),
        layers: Vec::new(),
        agent_socket: agent_socket.clone(),
        control_socket: None,
        network: None,
        qmp_socket: run_dir.join("probe-qmp.sock"),
        console_log: run_dir.join("probe-console.log"),
        incoming: false,
        paused: false,
    };
    let (mut child, listener) = spawn(&machine, listener, None)?;
    let answered = async {
        let (mut stream, _) = listener.accept().await.map_err(|e| QemuError::io("accept the probe's port", e))?;
        let mut got = Vec::new();
        while !got.ends_with(PROBE_OK) {
            let mut buf = [0u8; 64];
            let n = stream.read(&mut buf).await.map_err(|e| QemuError::io("read the probe's port", e))?;
            if n == 0 {
                return Err(QemuError::Exited(format!(
                    "the probe's port closed after {:?}",
                    String::from_utf8_lossy(&got)
                )));
            }
            got.extend_from_slice(&buf[..n]);
        }
        Ok(())
    };
    let result = match tokio::time::timeout(timeout, answered).await {
        Ok(r) => r,
        Err(_) => Err(QemuError::Timeout { what: "the probe vm", secs: timeout.as_secs() }),
    };
    let _ = child.start_kill();
    let _ = child.wait().await;
    for f in [&agent_socket, &machine.qmp_socket] {
        let _ = std::fs::remove_file(f);
    }
    result
}
