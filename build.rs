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
    let out = PathBuf::from(env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("helper_descriptor.bin"))
        .compile_protos(&[proto], &["proto"])?;
    // The glue does not depend on the target (CARGO_CFG_TARGET_OS): the
    // same text serves the Mac build and the Linux check.
    swift_bridge_build::parse_bridges([BRIDGE]).write_all_concatenated(out.join("swift-glue"), env!("CARGO_PKG_NAME"));
    Ok(())
}
