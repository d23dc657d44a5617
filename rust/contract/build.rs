//! Generates the Rust side of the helper contract (proto/) and the
//! descriptor set that feeds gRPC server reflection.
use std::{env, path::PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "../../proto/sandbox_mcp/helper/v1/helper.proto";
    println!("cargo:rerun-if-changed={proto}");
    let out = PathBuf::from(env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("helper_descriptor.bin"))
        .compile_protos(&[proto], &["../../proto"])?;
    Ok(())
}
