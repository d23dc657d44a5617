//! `sandbox-vm-helper`: the Linux VM helper. `serve` runs the gRPC service in
//! the foreground (the orchestrator daemonizes it); `agent` is the in-guest
//! agent's standalone entry (a VM's init starts it); `__vm-init` and
//! `__copy-layer` are internal: the helper re-executes itself with them to
//! launch each VM and, when not root, to copy a VM's layer as the VM's root.
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "sandbox-vm-helper", version, about = "Runs sandbox-mcp VMs as Linux namespace sandboxes")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the VmHelper gRPC service on a Unix socket.
    Serve {
        /// Socket path (default: the runtime dir's helper.sock).
        #[arg(long)]
        socket: Option<PathBuf>,
    },
    /// Run the in-guest agent: serve the helper's multiplexed connection on
    /// `unix:PATH`, `fd:N`, `serial:PATH` (a virtio-serial port) or
    /// `vsock:PORT`.
    Agent {
        /// Where the helper's connection comes from.
        #[arg(long, value_name = "ADDR")]
        listen: sandbox_mcp::agent::listen::Address,
    },
    /// Launch one VM (internal; started by `serve`, config on stdin).
    #[command(name = "__vm-init", hide = true)]
    VmInit {
        /// Create eth0 as a tun for the helper's network stack.
        #[arg(long)]
        eth0: bool,
    },
    /// PID 1 of a `vm` driver microVM (internal; the guest kernel runs it
    /// from the initramfs scripts/vm-initramfs.sh builds).
    #[command(name = "guest-init", hide = true)]
    GuestInit,
    /// Copy a VM's writable layer (internal; run by `serve` inside the VM's
    /// user namespace when the helper is not root).
    #[command(name = "__copy-layer", hide = true)]
    CopyLayer {
        /// The layer.
        src: PathBuf,
        /// The copy, which must not exist.
        dst: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        // No runtime and no threads before this point: the launcher must be
        // single-threaded to enter a new user namespace.
        Command::VmInit { eth0 } => ExitCode::from(u8::try_from(sandbox_mcp::helper::vm_init(eth0)).unwrap_or(1)),
        Command::GuestInit => {
            let e = sandbox_mcp::guest::run();
            eprintln!("guest-init: {e}");
            sandbox_mcp::guest::agent::power_off()
        }
        Command::Agent { listen } => {
            let e = sandbox_mcp::agent::serve(listen);
            eprintln!("sandbox-vm-helper agent: {e}");
            ExitCode::FAILURE
        }
        Command::CopyLayer { src, dst } => match sandbox_mcp::image::copy_tree(&src, &dst) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("{e}");
                ExitCode::FAILURE
            }
        },
        Command::Serve { socket } => {
            tracing_subscriber::fmt()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_default_env()
                        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
                )
                .init();
            let socket = socket.unwrap_or_else(sandbox_mcp::paths::helper_socket);
            sandbox_mcp::paths::make_private_dirs();
            let runtime = match tokio::runtime::Runtime::new() {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("sandbox-vm-helper: cannot start the runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match runtime.block_on(sandbox_mcp::helper::serve(&socket)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!(error = %e, "helper failed");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
