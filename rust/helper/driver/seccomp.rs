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
    eperm.insert(libc::SYS_clone, clone_rules);
    let deny =
        SeccompFilter::new(eperm, SeccompAction::Allow, SeccompAction::Errno(libc::EPERM as u32), arch).map_err(err)?;

    // clone3 passes its flags in memory that seccomp cannot inspect, so it
    // is refused as "not implemented": libc then falls back to clone(),
    // which the filter above can check.
    let clone3 = SeccompFilter::new(
        BTreeMap::from([(libc::SYS_clone3, Vec::new())]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )
    .map_err(err)?;

    for filter in [deny, clone3] {
        let prog: BpfProgram = filter.try_into().map_err(err)?;
        seccompiler::apply_filter(&prog).map_err(|e| DriverError::Seccomp(e.to_string()))?;
    }
    Ok(())
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
                let none = std::ptr::null::<libc::c_char>();
                assert_eq!(
                    errno_of(libc::mount(none, c"/".as_ptr(), none, 0, std::ptr::null()).into()),
                    Some(libc::EPERM)
                );
                assert!(libc::getpid() > 0);
            }
            // Plain forks and threads (clone without namespace flags) still work.
            let out = std::process::Command::new("true").status().unwrap();
            assert!(out.success());
            std::thread::spawn(|| ()).join().unwrap();
        })
        .join()
        .unwrap();
    }
}
