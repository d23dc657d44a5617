//! Guest memory: where a vm's RAM lives, and the copy a restored vm starts
//! from.
//!
//! A vm's RAM is always a shared file mapping (`share=on`): virtiofsd
//! (`/workspace`, a vhost-user device) maps the guest's memory itself, so a
//! private copy-on-write mapping of a template cannot back it. What keeps an
//! idle restored vm small instead is what its RAM starts with:
//!
//! - A template ([`super::template`]) is booted with its RAM in a file of
//!   its own beside its state, and saved with `x-ignore-shared`: the state
//!   holds the devices only, the RAM file holds the memory, sparse where the
//!   guest never wrote.
//! - A restore gets a fresh memfd holding only the template's non-zero pages
//!   ([`from_template`]) and loads the devices from the state, again with
//!   `x-ignore-shared`, so qemu never reads the RAM while loading.
//!
//! A restore through the migration stream instead (the whole RAM in the
//! state) touches every page of a shared mapping: qemu reads each page it
//! is sent as zero to skip writing it, and a read fault on a hole of a
//! shared memory file allocates the page. That made every restored vm hold
//! its whole `-m` in host memory, where a booted guest has used a tenth.
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt as _;
use std::path::Path;

use nix::sys::memfd::{MFdFlags, memfd_create};
use nix::unistd::{Whence, ftruncate, lseek};

use super::QemuError;

/// What a page of guest memory is, for the zero check.
const PAGE: usize = 4096;
/// How much of the template is read at once.
const CHUNK: usize = 1 << 20;

/// How a vm's RAM is backed: qemu's `-object memory-backend-*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backing {
    /// An anonymous memfd qemu makes (a cold boot).
    Memfd,
    /// The file at this path (a template's RAM file, or a restore's memfd
    /// as `/dev/fd/N`).
    File(std::path::PathBuf),
}

impl Backing {
    /// qemu's `-object` argument for `size_mib` of RAM with id `mem`.
    pub fn object(&self, size_mib: u64) -> String {
        match self {
            Backing::Memfd => format!("memory-backend-memfd,id=mem,size={size_mib}M,share=on"),
            Backing::File(path) => format!(
                "memory-backend-file,id=mem,size={size_mib}M,share=on,mem-path={}",
                path.to_string_lossy().replace(',', ",,")
            ),
        }
    }
}

/// A memfd of `size` bytes holding the template RAM file `template`'s
/// non-zero pages at their offsets, holes elsewhere: what a restored vm's
/// RAM starts as. Only the template's data extents are read (SEEK_DATA),
/// and a page of zeros in them is left a hole too, so the copy costs host
/// memory only for pages the template's guest wrote with something.
pub fn from_template(template: &Path, size: u64) -> Result<OwnedFd, QemuError> {
    let what = |step: &str| format!("{step} {}", template.display());
    let source = File::open(template).map_err(|e| QemuError::io(what("open"), e))?;
    let len = source.metadata().map_err(|e| QemuError::io(what("stat"), e))?.len();
    if len != size {
        return Err(QemuError::io(
            what("use"),
            std::io::Error::other(format!("it holds {len} bytes of RAM, the vm has {size}")),
        ));
    }
    let ram = memfd_create(c"smcp-vm-ram", MFdFlags::MFD_CLOEXEC)
        .map_err(|e| QemuError::io("create the vm's memory", e.into()))?;
    ftruncate(&ram, i64::try_from(size).unwrap_or(i64::MAX))
        .map_err(|e| QemuError::io("size the vm's memory", e.into()))?;
    let target = File::from(ram);
    let mut buf = vec![0u8; CHUNK];
    let mut at: i64 = 0;
    let end = i64::try_from(size).unwrap_or(i64::MAX);
    while at < end {
        // ENXIO: no data past `at`.
        let Ok(data) = lseek(&source, at, Whence::SeekData) else { break };
        let hole = lseek(&source, data, Whence::SeekHole).unwrap_or(end).min(end);
        let mut off = data;
        while off < hole {
            let n = usize::try_from(hole - off).unwrap_or(CHUNK).min(CHUNK);
            let read = &mut buf[..n];
            source.read_exact_at(read, off as u64).map_err(|e| QemuError::io(what("read"), e))?;
            write_nonzero(&target, read, off as u64)?;
            off += n as i64;
        }
        at = hole;
    }
    Ok(target.into())
}

/// Writes the runs of non-zero pages of `data` (read from offset `at`) to
/// `target` at the same offsets.
fn write_nonzero(target: &File, data: &[u8], at: u64) -> Result<(), QemuError> {
    let mut run: Option<usize> = None;
    let flush = |from: usize, to: usize| {
        target.write_all_at(&data[from..to], at + from as u64).map_err(|e| QemuError::io("write the vm's memory", e))
    };
    for (i, page) in data.chunks(PAGE).enumerate() {
        let zero = page.iter().all(|&b| b == 0);
        match (zero, run) {
            (false, None) => run = Some(i * PAGE),
            (true, Some(from)) => {
                flush(from, i * PAGE)?;
                run = None;
            }
            _ => {}
        }
    }
    if let Some(from) = run {
        flush(from, data.len())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt as _;

    use super::*;

    #[test]
    fn a_restore_copies_only_the_templates_non_zero_pages() {
        let dir = std::env::temp_dir().join(format!("ram-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let template = dir.join("vm.ram");
        let size: u64 = 64 << 20;
        let f = File::create(&template).unwrap();
        f.set_len(size).unwrap();
        // Two written pages far apart, one page of written zeros between
        // them, and a run of three pages across a chunk's end.
        f.write_all_at(&[7u8; PAGE], 0).unwrap();
        f.write_all_at(&[0u8; PAGE], 8 << 20).unwrap();
        f.write_all_at(&[9u8; PAGE], 40 << 20).unwrap();
        f.write_all_at(&[5u8; 3 * PAGE], (CHUNK - PAGE) as u64).unwrap();
        drop(f);
        let ram = File::from(from_template(&template, size).unwrap());
        let meta = ram.metadata().unwrap();
        assert_eq!(meta.len(), size);
        // Five pages written, nothing for the zeros or the holes.
        assert_eq!(meta.blocks() * 512, 5 * PAGE as u64, "the copy allocated more than the non-zero pages");
        let mut page = vec![0u8; PAGE];
        for (at, byte) in [(0u64, 7u8), (8 << 20, 0), (40 << 20, 9), ((CHUNK + PAGE) as u64, 5), (20 << 20, 0)] {
            ram.read_exact_at(&mut page, at).unwrap();
            assert!(page.iter().all(|&b| b == byte), "page at {at} is not all {byte}");
        }
        // A template of another size is refused, naming both.
        let e = from_template(&template, size * 2).unwrap_err().to_string();
        assert!(e.contains("holds 67108864 bytes of RAM, the vm has 134217728"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_backing_is_named_for_qemu_with_commas_doubled() {
        assert_eq!(Backing::Memfd.object(512), "memory-backend-memfd,id=mem,size=512M,share=on");
        assert_eq!(
            Backing::File("/t/a,b/vm.ram".into()).object(256),
            "memory-backend-file,id=mem,size=256M,share=on,mem-path=/t/a,,b/vm.ram"
        );
    }
}
