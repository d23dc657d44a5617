//! What every crate of sandbox-mcp shares: where files live ([`paths`]:
//! XDG dirs, sockets), wall-clock stamps ([`clock`]), sizes as answers
//! print them ([`size`]) and the error of a system step ([`error::SysError`]).
#![warn(missing_docs)]

pub mod clock;
pub mod disk;
pub mod error;
pub mod paths;
pub mod proc;
pub mod size;
pub mod test_support;
