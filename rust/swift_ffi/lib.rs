//! The static library the Swift package links (`libsandbox_helper_ffi.a`,
//! built with `cargo build -p sandbox-helper-ffi --target
//! aarch64-apple-darwin`). It holds the whole Rust helper: the gRPC
//! service and `__swift_bridge__$helper_main`, which the Swift `main`
//! calls, plus swift-bridge's own runtime symbols (`RustString`, `Vec`).
//! The `__swift_bridge__$layer_*` symbols it needs come from the Swift side;
//! on Linux the double in the main crate provides them.
//!
//! Left out of the workspace's default members: Linux builds do not pay
//! for an archive of every dependency.

// The bridge module is what makes the linker keep the exported symbols:
// naming it here ties the archive to the helper crate's bridge.
pub use sandbox_helper::driver::swift::bridge::ffi;
