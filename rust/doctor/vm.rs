//! Whether `isolation = "vm"` works here, and how fast: the vm driver's own
//! readiness check (qemu, virtiofsd, the guest kernel and the initramfs of
//! the helper binary doctor starts, the id map), then its own KVM probe, a
//! boot of that kernel under KVM. The answer is remembered per host boot
//! (the driver's memo), so this costs the probe once, not every time.
use std::path::Path;

use sandbox_helper::driver::Driver as _;
use sandbox_helper::driver::qemu::{
    Accel,
    assets::{Assets, build_id, vm_dir},
    driver::QemuDriver,
};

use super::Check;

/// What `make` target puts the vm driver's parts in place.
const FIX: &str = "make install (or `make vm` in the checkout) builds the guest kernel and initramfs and installs qemu";

pub(super) async fn check(helper_bin: &Path) -> Check {
    let id = match build_id(helper_bin) {
        Ok(Some(id)) => id,
        Ok(None) => return Check::warn("vm", format!("{} has no GNU build id", helper_bin.display()), FIX),
        Err(e) => return Check::warn("vm", e.to_string(), FIX),
    };
    let unable = |reason: String| Check::warn("vm", format!("isolation = \"vm\" cannot run: {reason}"), FIX);
    let assets = match Assets::locate(&vm_dir(), &id) {
        Ok(assets) => assets,
        Err(e) => return unable(e.to_string()),
    };
    let driver = QemuDriver::with_assets(Ok(assets.clone()));
    if let Some(reason) = driver.unavailable_reason() {
        return unable(reason);
    }
    let kernel = &assets.release;
    match driver.accel(&assets).await {
        Accel::Kvm => Check::ok("vm", format!("ready: guest kernel {kernel} under KVM")),
        // It works, only slower: not a warning about the host's setup.
        Accel::Tcg { kvm_unusable } => Check::ok(
            "vm",
            format!(
                "ready: guest kernel {kernel} under TCG, qemu's software CPU, several times slower ({kvm_unusable})"
            ),
        ),
    }
}
