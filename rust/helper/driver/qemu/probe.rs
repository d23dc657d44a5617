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
///
/// The answer is kept in `memo` for this boot of the host and this guest
/// kernel: where KVM stalls, the probe waits out [`KVM_BOOT_TIMEOUT`], which
/// every new helper (a restart, an upgrade) and `doctor` would pay again. A
/// reboot or another kernel probes afresh (a module loaded, a group joined).
pub async fn detect(assets: &Assets, run_dir: &Path, memo: &Path) -> Accel {
    let host_boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let key = format!("{}\n{}\n", host_boot.trim(), assets.release);
    if let Some(accel) = std::fs::read_to_string(memo).ok().and_then(|text| remembered(&text, &key)) {
        return accel;
    }
    let accel = match kvm_boots(assets, run_dir, KVM_BOOT_TIMEOUT).await {
        Ok(()) => Accel::Kvm,
        Err(kvm_unusable) => {
            tracing::info!(reason = %kvm_unusable, "KVM unusable for vm sandboxes; using TCG");
            Accel::Tcg { kvm_unusable }
        }
    };
    let text = match &accel {
        Accel::Kvm => format!("{key}kvm\n"),
        Accel::Tcg { kvm_unusable } => format!("{key}tcg\n{}\n", kvm_unusable.replace('\n', " ")),
    };
    // Replaced whole, so a helper and doctor probing at once never read half of it.
    let tmp = memo.with_extension(format!("{}.tmp", std::process::id()));
    if std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, memo)).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    accel
}

/// The accelerator `text` (a memo [`detect`] wrote) holds for `key`, if it
/// was written for it.
fn remembered(text: &str, key: &str) -> Option<Accel> {
    let rest = text.strip_prefix(key)?;
    let mut lines = rest.lines();
    match (lines.next(), lines.next(), lines.next()) {
        (Some("kvm"), None, None) => Some(Accel::Kvm),
        (Some("tcg"), Some(why), None) if !why.is_empty() => Some(Accel::Tcg { kvm_unusable: why.to_string() }),
        _ => None,
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
        memory: super::ram::Backing::Memfd,
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
    let mut child = spawn(&machine)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "3f1c\n6.1.0-57-cloud-amd64\n";

    #[test]
    fn a_memo_serves_only_its_own_host_boot_and_kernel() {
        assert_eq!(remembered(&format!("{KEY}kvm\n"), KEY), Some(Accel::Kvm));
        let tcg = remembered(&format!("{KEY}tcg\n/dev/kvm: stalled\n"), KEY);
        assert_eq!(tcg, Some(Accel::Tcg { kvm_unusable: "/dev/kvm: stalled".into() }));
        // Another boot or kernel, a torn or altered file: probe again.
        for stale in [
            "9e2a\n6.1.0-57-cloud-amd64\nkvm\n".to_string(),
            format!("{KEY}kv"),
            format!("{KEY}tcg\n"),
            format!("{KEY}kvm\nextra\n"),
            format!("{KEY}qemu\n"),
            String::new(),
        ] {
            assert_eq!(remembered(&stale, KEY), None, "{stale:?}");
        }
    }
}
