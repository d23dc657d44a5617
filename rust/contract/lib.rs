//! The generated helper contract. Only `orchestrator::helper_client` and
//! `helper::service` touch these types; everything else uses domain types.
#![allow(missing_docs)]

/// `sandbox_mcp.helper.v1`: messages and the `VmHelper` client and server.
pub mod v1 {
    tonic::include_proto!("sandbox_mcp.helper.v1");
}

/// Encoded file descriptor set of the contract, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("helper_descriptor");
