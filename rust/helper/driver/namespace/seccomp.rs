//! The sandbox's seccomp deny-list, installed by its PID 1 (after
//! no_new_privs) and inherited by every process in the sandbox.
//!
//! A deny-list, not an allow-list: the sandbox must run arbitrary Debian
//! software (compilers, package managers, debuggers: ptrace stays allowed),
//! so we only remove what lets a process reshape its isolation or touch
//! host-global kernel state.
use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule, TargetArch,
};

use super::DriverError;

/// Syscalls refused with EPERM, grouped by why.
const DENIED: &[(&str, &[i64])] = &[
    // Mount table changes: the root, the workspace bind and the read-only
    // views were arranged by init; nobody inside may rearrange them.
    (
        "mounts",
        &[
            libc::SYS_mount,
            libc::SYS_umount2,
            libc::SYS_pivot_root,
            libc::SYS_open_tree,
            libc::SYS_move_mount,
            libc::SYS_fsopen,
            libc::SYS_fsconfig,
            libc::SYS_fsmount,
            libc::SYS_fspick,
            libc::SYS_mount_setattr,
        ],
    ),
    // New or foreign namespaces would undo the isolation (or widen the
    // kernel surface reachable by an unprivileged root).
    ("namespaces", &[libc::SYS_setns, libc::SYS_unshare]),
    // Host-global machine state: swap, power, the running kernel.
    (
        "machine",
        &[
            libc::SYS_swapon,
            libc::SYS_swapoff,
            libc::SYS_reboot,
            libc::SYS_kexec_load,
            libc::SYS_kexec_file_load,
            libc::SYS_init_module,
            libc::SYS_finit_module,
            libc::SYS_delete_module,
            libc::SYS_acct,
            libc::SYS_quotactl,
            libc::SYS_quotactl_fd,
        ],
    ),
    // Large kernel attack surface with a history of privilege escalations,
    // and nothing a sandboxed dev workload needs.
    ("kernel surface", &[libc::SYS_bpf, libc::SYS_perf_event_open, libc::SYS_userfaultfd, libc::SYS_open_by_handle_at]),
    // The kernel keyring is not namespaced: keys would leak between
    // sandboxes and the host user.
    ("keyring", &[libc::SYS_keyctl, libc::SYS_add_key, libc::SYS_request_key]),
    // Raw port I/O.
    ("io ports", &[libc::SYS_iopl, libc::SYS_ioperm]),
    // The clock is host-global.
    ("clock", &[libc::SYS_settimeofday, libc::SYS_clock_settime, libc::SYS_clock_adjtime, libc::SYS_adjtimex]),
];

/// clone() flags that create namespaces (CLONE_NEWTIME is left out: in
/// clone() that bit is part of the exit-signal field).
const CLONE_NS_FLAGS: &[i32] = &[
    libc::CLONE_NEWNS,
    libc::CLONE_NEWUTS,
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWUSER,
    libc::CLONE_NEWPID,
    libc::CLONE_NEWNET,
    libc::CLONE_NEWCGROUP,
];

/// clone(CLONE_PARENT) makes the new process a sibling of its caller: a
/// command the agent started would give its child to the agent itself, out
/// of the tree a timeout or `kill` ends (the child subreaper only catches
/// orphans, and this child is no orphan). Nothing ordinary asks for it:
/// glibc's fork, vfork and posix_spawn, musl and Go's runtime never pass it.
/// With CLONE_THREAD the flag is harmless (a thread shares its caller's
/// process), so only the process-making form is refused.
const CLONE_PARENT_PROCESS: (u64, u64) = ((libc::CLONE_PARENT | libc::CLONE_THREAD) as u64, libc::CLONE_PARENT as u64);

/// io_uring: its submitted operations (open, connect, read, write…) run in
/// the kernel without passing through seccomp, so a ring would reopen every
/// door this filter closes. Refused with ENOSYS, what a kernel built without
/// io_uring answers: programs and runtimes that probe it (liburing users,
/// tokio-uring, newer glibc/libuv/Node builds) fall back to plain syscalls on
/// ENOSYS, while EPERM is taken as a hard failure by some of them.
const IO_URING: &[i64] = &[libc::SYS_io_uring_setup, libc::SYS_io_uring_enter, libc::SYS_io_uring_register];

/// The low bits of socket()'s type argument; SOCK_CLOEXEC and SOCK_NONBLOCK
/// are OR'ed into the bits above.
const SOCK_TYPE_MASK: u64 = 0xf;

/// The obsolete packet-socket type; libc marks its constant deprecated,
/// but the filter must still recognise it.
const SOCK_PACKET: i32 = 10;

/// socket() calls refused with EPERM, what the kernel answers a process
/// without CAP_NET_RAW (so ping and friends take their unprivileged path):
/// - AF_PACKET sees and forges whole frames on any interface of the netns;
/// - raw IPv4/IPv6 sockets forge arbitrary IP headers (ICMP redirects,
///   spoofed sources) at whatever the sandbox's network reaches; ping's
///   ICMP datagram sockets (SOCK_DGRAM, IPPROTO_ICMP) stay allowed;
/// - SOCK_PACKET with AF_INET is the pre-2.2 spelling of a packet socket:
///   the kernel turns it into AF_PACKET before any family's code runs, so
///   it is refused like AF_PACKET (AF_INET6 too, though that kernel path
///   only knows AF_INET, so no family spells it another way);
/// - AF_VSOCK is not network-namespaced: it reaches the hypervisor when the
///   host is itself a VM (Docker's default profile refuses it too).
///
/// AF_NETLINK raw sockets stay: `ip` and glibc's getifaddrs need them, and
/// netlink only reaches the sandbox's own network namespace.
fn socket_rules() -> Result<Vec<SeccompRule>, seccompiler::BackendError> {
    let domain = |family: i32| SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, family as u64);
    let kind =
        |ty: i32| SeccompCondition::new(1, SeccompCmpArgLen::Dword, SeccompCmpOp::MaskedEq(SOCK_TYPE_MASK), ty as u64);
    Ok(vec![
        SeccompRule::new(vec![domain(libc::AF_PACKET)?])?,
        SeccompRule::new(vec![domain(libc::AF_VSOCK)?])?,
        SeccompRule::new(vec![domain(libc::AF_INET)?, kind(libc::SOCK_RAW)?])?,
        SeccompRule::new(vec![domain(libc::AF_INET6)?, kind(libc::SOCK_RAW)?])?,
        SeccompRule::new(vec![domain(libc::AF_INET)?, kind(SOCK_PACKET)?])?,
        SeccompRule::new(vec![domain(libc::AF_INET6)?, kind(SOCK_PACKET)?])?,
    ])
}

/// prctl(PR_SET_CHILD_SUBREAPER, 0) is refused with EPERM: the agent makes
/// every process it starts a child subreaper so that a timeout or `kill`
/// finds (through the parent chain) everything it started, however
/// detached; clearing the flag would let its orphans reparent to PID 1,
/// out of the tree. Setting it (any other argument) stays allowed.
fn prctl_rules() -> Result<Vec<SeccompRule>, seccompiler::BackendError> {
    // The kernel reads the option as an int and the flag as a whole
    // unsigned long (any non-zero value sets it).
    Ok(vec![SeccompRule::new(vec![
        SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, libc::PR_SET_CHILD_SUBREAPER as u64)?,
        SeccompCondition::new(1, SeccompCmpArgLen::Qword, SeccompCmpOp::Eq, 0)?,
    ])?])
}

/// Builds and installs the filters on the calling thread; its children
/// inherit them. no_new_privs must be set first.
pub fn install() -> Result<(), DriverError> {
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(|e| DriverError::Seccomp(e.to_string()))?;
    let err = |e: seccompiler::BackendError| DriverError::Seccomp(e.to_string());

    let mut eperm: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for (_, calls) in DENIED {
        for &nr in *calls {
            eperm.insert(nr, Vec::new());
        }
    }
    // clone() creating a namespace is unshare() by another name.
    let mut clone_rules = Vec::new();
    for &flag in CLONE_NS_FLAGS {
        let flag = flag as u64;
        let cond =
            SeccompCondition::new(0, SeccompCmpArgLen::Qword, SeccompCmpOp::MaskedEq(flag), flag).map_err(err)?;
        clone_rules.push(SeccompRule::new(vec![cond]).map_err(err)?);
    }
    let (mask, value) = CLONE_PARENT_PROCESS;
    let cond = SeccompCondition::new(0, SeccompCmpArgLen::Qword, SeccompCmpOp::MaskedEq(mask), value).map_err(err)?;
    clone_rules.push(SeccompRule::new(vec![cond]).map_err(err)?);
    eperm.insert(libc::SYS_clone, clone_rules);
    eperm.insert(libc::SYS_socket, socket_rules().map_err(err)?);
    eperm.insert(libc::SYS_prctl, prctl_rules().map_err(err)?);
    let deny =
        SeccompFilter::new(eperm, SeccompAction::Allow, SeccompAction::Errno(libc::EPERM as u32), arch).map_err(err)?;

    // clone3 passes its flags in memory that seccomp cannot inspect, so it
    // is refused as "not implemented": libc then falls back to clone(),
    // which the filter above can check. io_uring likewise (see IO_URING).
    let not_implemented = std::iter::once(libc::SYS_clone3).chain(IO_URING.iter().copied());
    let enosys = SeccompFilter::new(
        not_implemented.map(|nr| (nr, Vec::new())).collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )
    .map_err(err)?;

    for filter in [deny, enosys] {
        let prog: BpfProgram = filter.try_into().map_err(err)?;
        seccompiler::apply_filter(&prog).map_err(|e| DriverError::Seccomp(e.to_string()))?;
    }
    if cfg!(target_arch = "x86_64") {
        seccompiler::apply_filter(&x32_guard()).map_err(|e| DriverError::Seccomp(e.to_string()))?;
    }
    Ok(())
}

/// The x32 ABI shares x86_64's audit arch but numbers its syscalls from
/// 0x40000000, so the rules above, which match x86_64 numbers, would not
/// see `unshare` or `mount` called through it. Kernels built with
/// CONFIG_X86_X32_ABI (and booted with it on) accept those; refuse every
/// x32 call as not implemented, which is what other kernels answer.
fn x32_guard() -> BpfProgram {
    use seccompiler::sock_filter;
    const X32_SYSCALL_BIT: u32 = 0x4000_0000;
    const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
    const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
    let op = |code: u32, jt: u8, jf: u8, k: u32| sock_filter { code: code as u16, jt, jf, k };
    vec![
        // A = seccomp_data.nr (offset 0)
        op(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0, 0, 0),
        // if A >= X32_SYSCALL_BIT: ERRNO(ENOSYS) else ALLOW
        op(libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K, 0, 1, X32_SYSCALL_BIT),
        op(libc::BPF_RET | libc::BPF_K, 0, 0, SECCOMP_RET_ERRNO | libc::ENOSYS as u32),
        op(libc::BPF_RET | libc::BPF_K, 0, 0, SECCOMP_RET_ALLOW),
    ]
}

#[cfg(test)]
mod tests {
    fn errno_of(ret: i64) -> Option<i32> {
        (ret == -1).then(|| std::io::Error::last_os_error().raw_os_error()).flatten()
    }

    #[test]
    fn denied_calls_fail_and_ordinary_ones_work() {
        // Filters and no_new_privs are per thread: confine a scratch thread.
        std::thread::spawn(|| {
            // SAFETY: prctl/syscall with integer or null arguments.
            unsafe {
                assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
                super::install().unwrap();
                assert_eq!(errno_of(libc::unshare(libc::CLONE_NEWUSER).into()), Some(libc::EPERM));
                assert_eq!(errno_of(libc::syscall(libc::SYS_setns, -1, 0)), Some(libc::EPERM));
                assert_eq!(errno_of(libc::syscall(libc::SYS_bpf, 0, 0, 0)), Some(libc::EPERM));
                assert_eq!(errno_of(libc::syscall(libc::SYS_clone3, std::ptr::null::<u8>(), 0)), Some(libc::ENOSYS));
                // A sibling process is refused; CLONE_PARENT on a thread passes
                // the filter (the kernel then answers EINVAL: CLONE_THREAD
                // without CLONE_SIGHAND), so no child is ever made here.
                let sibling = (libc::CLONE_PARENT | libc::SIGCHLD) as libc::c_long;
                assert_eq!(errno_of(libc::syscall(libc::SYS_clone, sibling, 0, 0, 0, 0)), Some(libc::EPERM));
                let thread = (libc::CLONE_PARENT | libc::CLONE_THREAD) as libc::c_long;
                assert_eq!(errno_of(libc::syscall(libc::SYS_clone, thread, 0, 0, 0, 0)), Some(libc::EINVAL));
                let none = std::ptr::null::<libc::c_char>();
                assert_eq!(
                    errno_of(libc::mount(none, c"/".as_ptr(), none, 0, std::ptr::null()).into()),
                    Some(libc::EPERM)
                );
                assert!(libc::getpid() > 0);
                // Clearing the child-subreaper flag is refused, setting it is not.
                assert_eq!(errno_of(libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0).into()), Some(libc::EPERM));
                assert_eq!(libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), 0);
                assert_eq!(libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 2, 0, 0, 0), 0);
                let mut flag: libc::c_int = 0;
                assert_eq!(libc::prctl(libc::PR_GET_CHILD_SUBREAPER, &mut flag as *mut libc::c_int, 0, 0, 0), 0);
                assert_eq!(flag, 1);
            }
            // SAFETY: socket/close/syscall with integer or null arguments.
            unsafe {
                let refused = [
                    (libc::AF_PACKET, libc::SOCK_RAW, 0),
                    (libc::AF_PACKET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0),
                    (libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_ICMP),
                    (libc::AF_INET, libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, libc::IPPROTO_RAW),
                    (libc::AF_INET6, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::IPPROTO_ICMPV6),
                    (libc::AF_INET, super::SOCK_PACKET, 0x0300),
                    (libc::AF_INET, super::SOCK_PACKET | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0x0300),
                    (libc::AF_INET6, super::SOCK_PACKET | libc::SOCK_CLOEXEC, 0x0300),
                    (libc::AF_VSOCK, libc::SOCK_STREAM, 0),
                ];
                for (domain, ty, proto) in refused {
                    assert_eq!(errno_of(libc::socket(domain, ty, proto).into()), Some(libc::EPERM), "{domain} {ty}");
                }
                #[cfg(target_arch = "x86_64")]
                assert_eq!(
                    errno_of(libc::syscall(0x4000_0000 | libc::SYS_unshare, libc::CLONE_NEWUSER)),
                    Some(libc::ENOSYS)
                );
                for nr in [libc::SYS_io_uring_setup, libc::SYS_io_uring_enter, libc::SYS_io_uring_register] {
                    assert_eq!(errno_of(libc::syscall(nr, 0, 0, 0, 0, 0)), Some(libc::ENOSYS), "{nr}");
                }
                let allowed = [
                    (libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0),
                    (libc::AF_INET6, libc::SOCK_DGRAM, 0),
                    (libc::AF_UNIX, libc::SOCK_SEQPACKET, 0),
                    (libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::NETLINK_ROUTE),
                ];
                for (domain, ty, proto) in allowed {
                    let fd = libc::socket(domain, ty, proto);
                    assert!(fd >= 0, "{domain} {ty}: {}", std::io::Error::last_os_error());
                    libc::close(fd);
                }
            }
            // Plain forks and threads (clone without namespace flags) still work.
            let out = std::process::Command::new("true").status().unwrap();
            assert!(out.success());
            std::thread::spawn(|| ()).join().unwrap();
        })
        .join()
        .unwrap();
        // The subreaper flag belongs to the whole test process; this thread
        // has no filter and takes it off again.
        // SAFETY: prctl with integer arguments.
        assert_eq!(unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0) }, 0);
    }
}
