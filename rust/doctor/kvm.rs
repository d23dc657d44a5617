//! Whether KVM can really run a guest, not just whether /dev/kvm exists: a
//! one-page guest that executes `hlt` at the x86 reset vector. Containers and
//! nested setups often expose /dev/kvm where creating or running a VM fails.
//!
//! A fresh vCPU starts in real mode with CS base 0xffff0000 and IP 0xfff0, so
//! the first instruction is fetched from guest-physical 0xfffffff0: mapping
//! one page at 0xfffff000 with `hlt` there needs no register setup at all.
use std::{
    fs::OpenOptions,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    sync::mpsc,
    time::Duration,
};

/// How long the guest gets to reach `hlt` before the probe gives up.
const RUN_TIMEOUT: Duration = Duration::from_secs(5);

// ioctl numbers from <linux/kvm.h> (type 0xAE).
const KVM_GET_API_VERSION: libc::c_ulong = 0xAE00;
const KVM_CREATE_VM: libc::c_ulong = 0xAE01;
const KVM_GET_VCPU_MMAP_SIZE: libc::c_ulong = 0xAE04;
const KVM_CREATE_VCPU: libc::c_ulong = 0xAE41;
// _IOW(0xAE, 0x46, struct kvm_userspace_memory_region) with its 32 bytes.
const KVM_SET_USER_MEMORY_REGION: libc::c_ulong = 0x4020_AE46;
const KVM_RUN: libc::c_ulong = 0xAE80;
const KVM_API_VERSION: i32 = 12;
const KVM_EXIT_HLT: u32 = 5;
const PAGE: usize = 4096;
const GUEST_PAGE_ADDR: u64 = 0xffff_f000;
/// Offset of `exit_reason` in `struct kvm_run`.
const EXIT_REASON_OFFSET: usize = 8;

#[repr(C)]
struct MemoryRegion {
    slot: u32,
    flags: u32,
    guest_phys_addr: u64,
    memory_size: u64,
    userspace_addr: u64,
}

/// What the probe found.
#[derive(Debug, PartialEq, Eq)]
pub enum KvmProbe {
    /// No /dev/kvm.
    Absent,
    /// /dev/kvm exists but a step failed (which one, and why).
    Unusable(String),
    /// A guest ran and halted.
    Boots,
}

/// Runs the probe (on its own thread, so a stuck `KVM_RUN` cannot hang the
/// caller; such a thread is left behind and dies with the process).
pub fn probe() -> KvmProbe {
    let file = match OpenOptions::new().read(true).write(true).open("/dev/kvm") {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return KvmProbe::Absent,
        Err(e) => return KvmProbe::Unusable(format!("open /dev/kvm: {e}")),
    };
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(run_guest(file.as_raw_fd()));
        drop(file);
    });
    match rx.recv_timeout(RUN_TIMEOUT) {
        Ok(Ok(())) => KvmProbe::Boots,
        Ok(Err(step)) => KvmProbe::Unusable(step),
        Err(_) => KvmProbe::Unusable(format!("the guest did not halt within {} s", RUN_TIMEOUT.as_secs())),
    }
}

fn ioctl(fd: i32, request: libc::c_ulong, arg: libc::c_ulong, what: &str) -> Result<i32, String> {
    // SAFETY: every request used here takes an integer or a pointer to a
    // live, correctly laid out struct, as <linux/kvm.h> defines.
    let r = unsafe { libc::ioctl(fd, request, arg) };
    if r < 0 { Err(format!("{what}: {}", std::io::Error::last_os_error())) } else { Ok(r) }
}

fn owned(fd: i32) -> OwnedFd {
    // SAFETY: `fd` was just returned by a successful ioctl and is owned by no one else.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// An anonymous shared mapping, unmapped on drop.
struct Mapping {
    addr: *mut libc::c_void,
    len: usize,
}

impl Mapping {
    fn new(len: usize, fd: i32, what: &str) -> Result<Self, String> {
        let flags = if fd < 0 { libc::MAP_SHARED | libc::MAP_ANONYMOUS } else { libc::MAP_SHARED };
        // SAFETY: a fresh mapping at an address of the kernel's choosing.
        let addr = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags, fd, 0) };
        if addr == libc::MAP_FAILED {
            return Err(format!("{what}: {}", std::io::Error::last_os_error()));
        }
        Ok(Self { addr, len })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping was created by `new` and is not used after this.
        unsafe { libc::munmap(self.addr, self.len) };
    }
}

fn run_guest(kvm: i32) -> Result<(), String> {
    let version = ioctl(kvm, KVM_GET_API_VERSION, 0, "KVM_GET_API_VERSION")?;
    if version != KVM_API_VERSION {
        return Err(format!("KVM API version {version}, expected {KVM_API_VERSION}"));
    }
    let vm = owned(ioctl(kvm, KVM_CREATE_VM, 0, "KVM_CREATE_VM")?);
    let memory = Mapping::new(PAGE, -1, "guest memory")?;
    // SAFETY: the mapping is PAGE bytes long and writable.
    unsafe { *(memory.addr as *mut u8).add(0xff0) = 0xf4 };
    let region = MemoryRegion {
        slot: 0,
        flags: 0,
        guest_phys_addr: GUEST_PAGE_ADDR,
        memory_size: PAGE as u64,
        userspace_addr: memory.addr as u64,
    };
    let region_ptr = &region as *const MemoryRegion as libc::c_ulong;
    ioctl(vm.as_raw_fd(), KVM_SET_USER_MEMORY_REGION, region_ptr, "KVM_SET_USER_MEMORY_REGION")?;
    let vcpu = owned(ioctl(vm.as_raw_fd(), KVM_CREATE_VCPU, 0, "KVM_CREATE_VCPU")?);
    let run_size = ioctl(kvm, KVM_GET_VCPU_MMAP_SIZE, 0, "KVM_GET_VCPU_MMAP_SIZE")? as usize;
    let run = Mapping::new(run_size, vcpu.as_raw_fd(), "mmap kvm_run")?;
    ioctl(vcpu.as_raw_fd(), KVM_RUN, 0, "KVM_RUN")?;
    // SAFETY: kvm_run is at least a page long; exit_reason is a u32 at offset 8.
    let exit = unsafe { std::ptr::read_volatile((run.addr as *const u8).add(EXIT_REASON_OFFSET) as *const u32) };
    if exit == KVM_EXIT_HLT { Ok(()) } else { Err(format!("the guest exited with reason {exit}, not HLT")) }
}
