//! A sandbox's network, as both sides of it agree: the egress policy
//! ([`policy`]: parsed from config, decided per connection by the helper's
//! stack), the addressing plan ([`plan`]) and what the sandbox's PID 1 sets
//! up on its side ([`setup`]).
#![warn(missing_docs)]

pub mod plan;
pub mod policy;
#[cfg(linux_host)]
pub mod setup;
