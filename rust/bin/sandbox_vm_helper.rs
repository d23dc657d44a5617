//! `sandbox-vm-helper`: the Linux VM helper. `serve` runs the gRPC service in
//! the foreground (the orchestrator daemonizes it; `--through-bridge` runs
//! it as the macOS Swift helper does, through swift-bridge's C ABI); `agent` is the in-guest
//! agent's standalone entry (a VM's init starts it); `__vm-init`, `__vm-keep` and
//! `__copy-layer` are internal (and `guest-init`, `__archive-layer` run in a
//! `vm` guest): the helper re-executes itself with them to
//! launch each VM and, when not root, to copy a VM's layer as the VM's root.
#[cfg(linux_host)]
use std::path::PathBuf;
use std::process::ExitCode;

#[cfg(linux_host)]
use clap::{Parser, Subcommand};
#[cfg(linux_host)]
use sandbox_helper::server::Drivers;

#[cfg(linux_host)]
#[derive(Parser)]
#[command(name = "sandbox-vm-helper", version, about = "Runs sandbox-mcp VMs as Linux namespace sandboxes")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[cfg(linux_host)]
#[derive(Subcommand)]
enum Command {
    /// Serve the VmHelper gRPC service on a Unix socket.
    Serve {
        /// Socket path (default: the runtime dir's helper.sock).
        #[arg(long)]
        socket: Option<PathBuf>,
        /// Run VMs on the VM layer across swift-bridge, entering through
        /// the bridge's `helper_main` C symbol as the Swift executable does
        /// (on Linux the layer is the namespace driver behind the Rust double).
        #[arg(long)]
        through_bridge: bool,
    },
    /// Run the in-guest agent: serve the helper's multiplexed connection on
    /// `unix:PATH`, `fd:N`, `serial:PATH` (a virtio-serial port) or
    /// `vsock:PORT`.
    Agent {
        /// Where the helper's connection comes from.
        #[arg(long, value_name = "ADDR")]
        listen: sandbox_agent::listen::Address,
    },
    /// Launch one VM (internal; started by `serve`, config on stdin).
    #[command(name = "__vm-init", hide = true)]
    VmInit {
        /// Create eth0 as a tun for the helper's network stack.
        #[arg(long)]
        eth0: bool,
    },
    /// Start a vm's qemu and keep it through the helper's death (internal;
    /// started by `serve` for each vm, fds inherited by number).
    #[command(name = "__vm-keep", hide = true)]
    VmKeep {
        /// The keeper's end of its control socket.
        #[arg(long)]
        control: i32,
        /// The helper's end of the network card, for an adopter.
        #[arg(long)]
        link: Option<i32>,
        /// An fd qemu's arguments name.
        #[arg(long)]
        pass: Vec<i32>,
        /// The helper's pid.
        #[arg(long)]
        helper: i32,
        /// Where to listen for a new helper.
        #[arg(long)]
        socket: PathBuf,
        /// qemu's arguments.
        #[arg(last = true)]
        qemu: Vec<std::ffi::OsString>,
    },
    /// PID 1 of a `vm` driver microVM (internal; the guest kernel runs it
    /// from the initramfs scripts/vm-initramfs.sh builds).
    #[command(name = "guest-init", hide = true)]
    GuestInit,
    /// Write a `vm` guest's writable layer to stdout as a tar archive, its
    /// filesystem frozen meanwhile (internal; the helper runs it in the
    /// guest for a snapshot).
    #[command(name = "__archive-layer", hide = true)]
    ArchiveLayer,
    /// Measure the vm driver's create paths (cold, from the memory
    /// snapshot, from the warm pool) and idle memory on an image; prints
    /// the samples as JSON (bench/bench.py reads them).
    #[command(name = "vm-bench")]
    VmBench {
        /// The image store.
        #[arg(long)]
        store: PathBuf,
        /// The image.
        #[arg(long)]
        image: String,
        /// Samples of each restore figure (a quarter as many cold boots).
        #[arg(long, default_value_t = 10)]
        runs: usize,
    },
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

/// Everything this binary does runs on Linux (a host's helper, a guest's
/// init and agent); a Mac's helper is the Swift executable (swift/), and
/// the agent it runs in its guests is this binary built for Linux.
#[cfg(not(linux_host))]
fn main() -> ExitCode {
    eprintln!("sandbox-vm-helper runs on Linux; on a Mac the helper is swift/'s (`make helper`)");
    ExitCode::from(2)
}

#[cfg(linux_host)]
fn main() -> ExitCode {
    sandbox_image::oci::run_layer_applier_if_asked();
    let cli = Cli::parse();
    match cli.command {
        // No runtime and no threads before this point: the launcher must be
        // single-threaded to enter a new user namespace.
        Command::VmInit { eth0 } => ExitCode::from(u8::try_from(sandbox_helper::vm_init(eth0)).unwrap_or(1)),
        Command::VmKeep { control, link, pass, helper, socket, qemu } => {
            use sandbox_helper::driver::qemu::keeper::{KeepArgs, run};
            let code = run(KeepArgs { control, link, pass, helper, socket, qemu });
            ExitCode::from(u8::try_from(code).unwrap_or(1))
        }
        Command::GuestInit => {
            let e = sandbox_guest::run();
            eprintln!("guest-init: {e}");
            sandbox_guest::agent::power_off()
        }
        Command::ArchiveLayer => ExitCode::from(u8::try_from(sandbox_guest::layer_archive::run()).unwrap_or(2)),
        Command::Agent { listen } => {
            let e = sandbox_agent::serve(listen);
            eprintln!("sandbox-vm-helper agent: {e}");
            ExitCode::FAILURE
        }
        Command::VmBench { store, image, runs } => {
            let store = sandbox_image::ImageStore::new(store);
            let layers = match store.get(&image) {
                Ok(info) => {
                    std::iter::once(store.rootfs(&image)).chain(store.layer_paths(&info.layers)).collect::<Vec<_>>()
                }
                Err(e) => {
                    eprintln!("vm-bench: image {image}: {e}");
                    return ExitCode::FAILURE;
                }
            };
            // Under /tmp: virtiofsd runs as the sandbox's root, which must
            // reach the workspace (a home directory may be closed to it).
            let work = std::env::temp_dir().join(format!("smcp-vm-bench-{}", std::process::id()));
            let figures = tokio::runtime::Runtime::new().map_err(|e| e.to_string()).and_then(|rt| {
                rt.block_on(sandbox_helper::driver::qemu::bench::run(&layers, runs, &work)).map_err(|e| e.to_string())
            });
            let _ = std::fs::remove_dir_all(&work);
            match figures {
                Ok(f) => {
                    println!("{}", serde_json::to_string(&f).unwrap_or_default());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("vm-bench: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::CopyLayer { src, dst } => match sandbox_image::copy_tree(&src, &dst) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("{e}");
                ExitCode::FAILURE
            }
        },
        Command::Serve { socket, through_bridge: false } => {
            ExitCode::from(u8::try_from(sandbox_helper::server::run(socket, Drivers::Local)).unwrap_or(1))
        }
        Command::Serve { socket, through_bridge: true } => {
            ExitCode::from(u8::try_from(bridge::helper_main(socket)).unwrap_or(1))
        }
    }
}

/// The bridge's entry as Swift's `main` calls it: the arguments built with
/// swift-bridge's own `Vec<RustString>` exports, handed to the
/// `__swift_bridge__$helper_main` symbol by its C ABI.
#[cfg(linux_host)]
mod bridge {
    use std::ffi::c_void;
    use std::path::PathBuf;

    /// swift-bridge's `RustStr`: a borrowed UTF-8 slice.
    #[repr(C)]
    struct RustStr {
        start: *const u8,
        len: usize,
    }

    unsafe extern "C" {
        #[link_name = "__swift_bridge__$Vec_RustString$new"]
        fn vec_new() -> *mut c_void;
        #[link_name = "__swift_bridge__$Vec_RustString$push"]
        fn vec_push(vec: *mut c_void, item: *mut c_void);
        #[link_name = "__swift_bridge__$RustString$new_with_str"]
        fn string_new(s: RustStr) -> *mut c_void;
        #[link_name = "__swift_bridge__$helper_main"]
        fn helper_main_c(args: *mut c_void) -> i32;
    }

    /// Runs `helper_main(["sandbox-vm-helper", "serve", "--socket", …])`.
    pub fn helper_main(socket: Option<PathBuf>) -> i32 {
        let mut args = vec!["sandbox-vm-helper".to_owned(), "serve".to_owned()];
        if let Some(socket) = socket {
            let Some(socket) = socket.to_str() else {
                eprintln!("sandbox-vm-helper: the socket path must be UTF-8 to cross the bridge: {socket:?}");
                return 2;
            };
            args.extend(["--socket".to_owned(), socket.to_owned()]);
        }
        // SAFETY: the calls and types are swift-bridge 0.1.59's (pinned):
        // `new` returns an owned vec, `push` takes ownership of a string
        // `new_with_str` copied, and `helper_main` takes the vec.
        unsafe {
            let vec = vec_new();
            for a in &args {
                vec_push(vec, string_new(RustStr { start: a.as_ptr(), len: a.len() }));
            }
            helper_main_c(vec)
        }
    }
}
