//! Generates the Rust side of the helper contract (proto/) and the
//! descriptor set that feeds gRPC server reflection, and the swift-bridge
//! glue (C header and Swift) for the Swift VM layer, on every OS: the glue
//! is pure text, and the committed copy under swift/ is checked against it
//! (tests/swift_glue.rs).
use std::{env, path::PathBuf};

/// The file holding the `#[swift_bridge::bridge]` module.
const BRIDGE: &str = "rust/helper/driver/swift/bridge.rs";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/sandbox_mcp/helper/v1/helper.proto";
    println!("cargo:rerun-if-changed={proto}");
    println!("cargo:rerun-if-changed={BRIDGE}");
    linux_host_cfg();
    let out = PathBuf::from(env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("helper_descriptor.bin"))
        .compile_protos(&[proto], &["proto"])?;
    // The glue does not depend on the target (CARGO_CFG_TARGET_OS): the
    // same text serves the Mac build and the Linux check.
    swift_bridge_build::parse_bridges([BRIDGE]).write_all_concatenated(out.join("swift-glue"), env!("CARGO_PKG_NAME"));
    Ok(())
}

/// `cfg(linux_host)`: the build runs on a Linux host, so the Linux-only
/// parts are in (the namespace and qemu drivers, seccomp, cgroups, host
/// setup, the in-guest entries). A Mac build leaves them out. No machine
/// here has an Apple target's standard library, so Linux checks that the
/// rest stands without them: `SANDBOX_MCP_PORTABLE_CHECK=1` builds as a
/// Mac would (`make check-portable`).
fn linux_host_cfg() {
    println!("cargo::rustc-check-cfg=cfg(linux_host)");
    println!("cargo:rerun-if-env-changed=SANDBOX_MCP_PORTABLE_CHECK");
    let linux = env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux");
    if linux && env::var_os("SANDBOX_MCP_PORTABLE_CHECK").is_none() {
        println!("cargo::rustc-cfg=linux_host");
    }
}
