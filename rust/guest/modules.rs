//! Loads the modules the guest kernel needs (virtio transport, console,
//! block, virtiofs, overlay), in the order `scripts/vm-kernel.sh` wrote:
//! dependencies first, so no modprobe or modules.dep is needed.
use std::path::Path;

use super::GuestError;

/// Loads every module named in `dir/order` from `dir/NAME.ko`. One the
/// kernel already has (EEXIST) counts as loaded.
pub fn load_all(dir: &Path) -> Result<(), GuestError> {
    let order = std::fs::read_to_string(dir.join("order")).map_err(|e| GuestError::io("read the module order", e))?;
    for name in order.lines().map(str::trim).filter(|n| !n.is_empty()) {
        let path = dir.join(format!("{name}.ko"));
        let file = std::fs::File::open(&path).map_err(|e| GuestError::io(format!("open {}", path.display()), e))?;
        match nix::kmod::finit_module(&file, c"", nix::kmod::ModuleInitFlags::empty()) {
            Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
            Err(e) => return Err(GuestError::sys(format!("load module {name}"), e)),
        }
    }
    Ok(())
}
