// Included by every crate's build script (`include!`): one definition of
// `cfg(linux_host)` for the whole workspace.

/// `cfg(linux_host)`: the build runs on a Linux host, so the Linux-only
/// parts are in (the namespace and qemu drivers, seccomp, cgroups, host
/// setup, the in-guest entries). A Mac build leaves them out. No machine
/// here has an Apple target's standard library, so Linux checks that the
/// rest stands without them: `SANDBOX_MCP_PORTABLE_CHECK=1` builds as a
/// Mac would (`make check-portable`).
fn linux_host_cfg() {
    println!("cargo::rustc-check-cfg=cfg(linux_host)");
    println!("cargo:rerun-if-env-changed=SANDBOX_MCP_PORTABLE_CHECK");
    let linux = std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux");
    if linux && std::env::var_os("SANDBOX_MCP_PORTABLE_CHECK").is_none() {
        println!("cargo::rustc-cfg=linux_host");
    }
}
