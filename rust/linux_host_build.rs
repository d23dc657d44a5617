//! The build script of every crate of the workspace that has Linux-only
//! parts: `cfg(linux_host)`, defined once (`linux_host_cfg.rs`).
include!("linux_host_cfg.rs");

fn main() {
    linux_host_cfg();
}
