//! The error of one system step, shared by the crates that make such steps
//! (a sandbox's network setup, user-namespace maps): what was being done,
//! and the errno or I/O error it met. The helper's driver errors take it in
//! as their own `Sys` and `Io`.

/// A system call or file operation that failed, with what it was for.
#[derive(Debug, thiserror::Error)]
pub enum SysError {
    /// A system call failed.
    #[error("{what}: {source}")]
    Sys {
        /// What was being done.
        what: String,
        /// The errno.
        source: nix::errno::Errno,
    },
    /// File or process I/O failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The underlying error.
        source: std::io::Error,
    },
}

impl SysError {
    /// A failed system call, with what it was for.
    pub fn sys(what: impl Into<String>, source: nix::errno::Errno) -> Self {
        SysError::Sys { what: what.into(), source }
    }

    /// An I/O error, with what it was for.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        SysError::Io { what: what.into(), source }
    }
}
