//! The guest kernel and the initramfs: built by `scripts/vm-kernel.sh` and
//! `scripts/vm-initramfs.sh` into the vm dir, the initramfs named by the
//! GNU build id of the helper binary inside it. A helper uses only the
//! initramfs of its own build id, so the agent in the guest always speaks
//! the protocol of the helper that talks to it.
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};

use super::QemuError;

/// What boots a vm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assets {
    /// The PVH-bootable ELF kernel.
    pub kernel: PathBuf,
    /// The initramfs holding this helper binary.
    pub initramfs: PathBuf,
    /// The kernel's release (`uname -r` in the guest).
    pub release: String,
}

/// The file in the vm dir that remembers whether KVM runs the guest here
/// (`probe::detect`).
pub const ACCEL_MEMO: &str = "accel";

/// Where the vm assets live: `SANDBOX_MCP_VM_DIR`, else the data dir's `vm`.
pub fn vm_dir() -> PathBuf {
    match std::env::var_os("SANDBOX_MCP_VM_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => sandbox_base::paths::data_dir().join("vm"),
    }
}

impl Assets {
    /// The assets in `dir` for the binary whose build id is `build_id`; the
    /// error names the script that builds what is missing.
    pub fn locate(dir: &Path, build_id: &str) -> Result<Self, QemuError> {
        let kernel = dir.join("vmlinux");
        let release = std::fs::read_to_string(dir.join("kernel.release")).map(|s| s.trim().to_string());
        let (true, Ok(release)) = (kernel.is_file(), release) else {
            return Err(QemuError::Assets(format!(
                "no vm kernel in {}: run scripts/vm-kernel.sh (or `make vm`)",
                dir.display()
            )));
        };
        let initramfs = dir.join(format!("initramfs-{build_id}.cpio.gz"));
        if !initramfs.is_file() {
            return Err(QemuError::Assets(format!(
                "no vm initramfs for this helper binary (build id {build_id}) in {}: run scripts/vm-initramfs.sh {} (or `make vm`)",
                dir.display(),
                std::env::current_exe().map(|p| p.display().to_string()).unwrap_or_else(|_| "HELPER".into())
            )));
        }
        Ok(Assets { kernel, initramfs, release })
    }

    /// The assets for the running binary, in [`vm_dir`].
    pub fn for_this_helper() -> Result<Self, QemuError> {
        let exe = Path::new("/proc/self/exe");
        let id = build_id(exe)?.ok_or_else(|| QemuError::Assets("this helper binary has no GNU build id".into()))?;
        Assets::locate(&vm_dir(), &id)
    }
}

/// The GNU build id of the ELF file at `path`, in hex (what `readelf -n`
/// prints), if it has one. Reads only the program headers and the notes.
pub fn build_id(path: &Path) -> Result<Option<String>, QemuError> {
    let f = std::fs::File::open(path).map_err(|e| QemuError::io(format!("open {}", path.display()), e))?;
    let bad = |what: &str| QemuError::io(format!("read {}", path.display()), std::io::Error::other(what.to_string()));
    let read = |off: u64, len: usize| -> Result<Vec<u8>, QemuError> {
        let mut buf = vec![0u8; len];
        f.read_exact_at(&mut buf, off).map_err(|e| QemuError::io(format!("read {}", path.display()), e))?;
        Ok(buf)
    };
    let u16_at = |b: &[u8], o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
    let u32_at = |b: &[u8], o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap_or([0; 4]));
    let u64_at = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or([0; 8]));
    let header = read(0, 64)?;
    // ELF64, little-endian: the only kind this x86-64 helper can be.
    if &header[..4] != b"\x7fELF" || header[4] != 2 || header[5] != 1 {
        return Err(bad("not a little-endian ELF64 file"));
    }
    let (phoff, phentsize, phnum) = (u64_at(&header, 0x20), u16_at(&header, 0x36), u16_at(&header, 0x38));
    if phentsize < 56 {
        return Err(bad("program headers too small"));
    }
    for i in 0..u64::from(phnum) {
        let ph = read(phoff + i * u64::from(phentsize), 56)?;
        const PT_NOTE: u32 = 4;
        if u32_at(&ph, 0) != PT_NOTE {
            continue;
        }
        let (off, size) = (u64_at(&ph, 8), u64_at(&ph, 0x20));
        let notes = read(off, usize::try_from(size.min(1 << 16)).unwrap_or(0))?;
        let mut at = 0usize;
        while at + 12 <= notes.len() {
            let (namesz, descsz, kind) =
                (u32_at(&notes, at) as usize, u32_at(&notes, at + 4) as usize, u32_at(&notes, at + 8));
            let name_at = at + 12;
            let desc_at = name_at + namesz.div_ceil(4) * 4;
            let end = desc_at + descsz.div_ceil(4) * 4;
            if desc_at + descsz > notes.len() {
                break;
            }
            const NT_GNU_BUILD_ID: u32 = 3;
            if kind == NT_GNU_BUILD_ID && notes[name_at..name_at + namesz] == *b"GNU\0" {
                return Ok(Some(notes[desc_at..desc_at + descsz].iter().map(|b| format!("{b:02x}")).collect()));
            }
            at = end;
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_id_matches_readelf() {
        let exe = std::env::current_exe().unwrap();
        let ours = build_id(&exe).unwrap().expect("rustc links test binaries with a build id");
        let out = std::process::Command::new("readelf").arg("-n").arg(&exe).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(&format!("Build ID: {ours}")), "{ours} not in {text}");
    }

    #[test]
    fn missing_assets_name_the_script_to_run() {
        let dir = std::env::temp_dir().join(format!("smcp-assets-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let e = Assets::locate(&dir, "abc").unwrap_err().to_string();
        assert!(e.contains("scripts/vm-kernel.sh"), "{e}");
        std::fs::write(dir.join("vmlinux"), b"").unwrap();
        std::fs::write(dir.join("kernel.release"), b"6.1.0-x\n").unwrap();
        let e = Assets::locate(&dir, "abc").unwrap_err().to_string();
        assert!(e.contains("scripts/vm-initramfs.sh") && e.contains("abc"), "{e}");
        std::fs::write(dir.join("initramfs-abc.cpio.gz"), b"").unwrap();
        let a = Assets::locate(&dir, "abc").unwrap();
        assert_eq!(a.release, "6.1.0-x");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
