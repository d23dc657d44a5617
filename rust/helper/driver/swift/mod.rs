//! The swift driver: VMs whose layer lives across the swift-bridge
//! boundary. On a Mac that is Swift on Apple's containerization, linking
//! this crate as a static library; elsewhere [`double`] exports the same
//! symbols on the namespace driver, so the Rust half runs end to end in CI.
//!
//! - [`bridge`]: the `#[swift_bridge::bridge]` contract (build.rs makes
//!   the Swift and C glue from it).
//! - [`convert`]: the bridge's types to and from the seam's.
//! - [`driver`]: [`SwiftDriver`], the seam over the bridge calls.
//! - [`main`]: `helper_main`, the whole helper as the Swift `main` runs it.
//! - [`double`]: the Linux layer behind the same symbols.
pub mod bridge;
pub mod convert;
#[cfg(linux_host)]
pub mod double;
pub mod driver;
pub mod main;

pub use driver::SwiftDriver;
