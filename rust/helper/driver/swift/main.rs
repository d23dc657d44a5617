//! `helper_main`: the helper as the Swift executable's `main` runs it (and
//! `sandbox-vm-helper serve --through-bridge` on Linux, through the same C
//! symbol): the shared gRPC service with the bridged layer as its driver.
use std::path::PathBuf;

use clap::Parser;

/// The arguments Swift's `CommandLine.arguments` carries, program first.
#[derive(Debug, Parser)]
#[command(name = "sandbox-vm-helper", about = "Serves sandbox-mcp VMs from the VM layer across swift-bridge")]
enum Args {
    /// Serve the VmHelper gRPC service on a Unix socket.
    Serve {
        /// Socket path (default: the runtime dir's helper.sock).
        #[arg(long)]
        socket: Option<PathBuf>,
    },
}

/// Serves until SIGTERM or SIGINT; returns the exit status (2: bad
/// arguments, with clap's message on stderr).
pub fn run(args: Vec<String>) -> i32 {
    match Args::try_parse_from(args) {
        Ok(Args::Serve { socket }) => crate::server::run(socket, crate::server::Drivers::Bridged),
        Err(e) => {
            let _ = e.print();
            e.exit_code()
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn bad_arguments_exit_2_without_serving() {
        assert_eq!(super::run(vec!["sandbox-vm-helper".into(), "bogus".into()]), 2);
        assert_eq!(super::run(vec!["sandbox-vm-helper".into(), "serve".into(), "--sock".into()]), 2);
    }
}
