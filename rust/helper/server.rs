//! The helper process: the gRPC socket, health, reflection, pid file and
//! signal handling around [`HelperService`], with its VMs on this host's
//! drivers or on the VM layer across swift-bridge ([`Drivers`]).
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UnixListener;
use tokio::signal::unix::{SignalKind, signal};
use tokio_stream::wrappers::UnixListenerStream;

use super::driver::Driver;
#[cfg(linux_host)]
use super::driver::namespace::NamespaceDriver;
#[cfg(linux_host)]
use super::driver::qemu::driver::QemuDriver;
use super::driver::swift::SwiftDriver;
use super::error::HelperError;
use super::service::HelperService;
use super::vm::VmManager;
use sandbox_contract::v1::vm_helper_server::VmHelperServer;
use sandbox_image::ImageStore;

/// Grace period for VMs when the helper itself is asked to stop.
const SHUTDOWN_GRACE: Duration = Duration::from_millis(2000);
/// HTTP/2 flow-control windows. The defaults (64 KiB) cap a Dial or copy
/// stream at a few hundred MB/s on loopback; these let a stream keep
/// several large chunks in flight.
const STREAM_WINDOW: u32 = 8 << 20;
const CONNECTION_WINDOW: u32 = 32 << 20;
/// How long clients get to hang up once every VM is stopped.
const CLIENT_DRAIN: Duration = Duration::from_millis(500);

/// Which drivers run the helper's VMs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drivers {
    /// This host's: the namespace driver (the default) and the vm driver.
    #[cfg(linux_host)]
    Local,
    /// Only the VM layer across swift-bridge
    /// ([`super::driver::swift::SwiftDriver`]), under the name it reports.
    Bridged,
}

/// The helper's whole life in the foreground: logs to stderr, the private
/// dirs, a runtime, [`serve`] on `socket` (default: the runtime dir's);
/// returns the exit status. `sandbox-vm-helper serve` and the bridge's
/// `helper_main` both come here.
pub fn run(socket: Option<PathBuf>, drivers: Drivers) -> i32 {
    // A second call in one process (the bridge's tests) keeps the first
    // subscriber.
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .try_init();
    let socket = socket.unwrap_or_else(sandbox_base::paths::helper_socket);
    sandbox_base::paths::make_private_dirs();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the runtime");
            return 1;
        }
    };
    match runtime.block_on(serve(&socket, drivers)) {
        Ok(()) => 0,
        Err(e) => {
            tracing::error!(error = %e, "helper failed");
            1
        }
    }
}

/// Serves the helper on `socket` until SIGTERM or SIGINT, then stops every
/// VM and removes the socket and pid file.
pub async fn serve(socket: &Path, drivers: Drivers) -> Result<(), HelperError> {
    let io = |what: String| move |e| HelperError::io(what, e);
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir).map_err(io(format!("create {}", dir.display())))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(io(format!("chmod {}", dir.display())))?;
    }
    match std::fs::remove_file(socket) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(io(format!("remove stale {}", socket.display()))(e));
        }
        _ => {}
    }
    let listener = UnixListener::bind(socket).map_err(io(format!("bind {}", socket.display())))?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))
        .map_err(io(format!("chmod {}", socket.display())))?;
    let pid_file = pid_file_for(socket);
    std::fs::write(&pid_file, format!("{}\n", std::process::id()))
        .map_err(io(format!("write {}", pid_file.display())))?;

    raise_nofile_limit();
    #[cfg(linux_host)]
    let mut qemu = None;
    // No VM runs without an id map: a helper started before host-setup gave
    // this user one waits for it (see `host_set_up`).
    let awaiting_ids = cfg!(linux_host) && sandbox_userns::IdMapper::detect().is_err();
    let drivers: Vec<Arc<dyn Driver>> = match drivers {
        #[cfg(linux_host)]
        Drivers::Local => {
            let namespaces = Arc::new(NamespaceDriver::detect()?);
            let vm = Arc::new(QemuDriver::detect().with_cgroups(namespaces.cgroup_layout()));
            qemu = Some(vm.clone());
            vec![namespaces, vm]
        }
        Drivers::Bridged => vec![Arc::new(SwiftDriver::new())],
    };
    #[cfg(linux_host)]
    if let Some(vm) = &qemu {
        vm.kill_idle_leftovers();
    }
    // Whichever drivers run the VMs, images are unpacked for one id map.
    let vms = VmManager::new(sandbox_userns::IdMapper::detect(), drivers, helper_store());
    // What a helper that died left running: kept where its driver can, the
    // rest killed (idle vms before, sandboxes' VMs after the adoption).
    vms.adopt_left().await;
    #[cfg(linux_host)]
    {
        super::storage::kill_leftovers();
        if let Some(vm) = qemu {
            vm.kill_leftovers();
        }
    }
    // Copies and references a helper killed mid-snapshot left behind; the
    // other helpers sharing the store keep theirs.
    vms.collect_layers().await;
    for driver in vms.drivers() {
        driver.keep_warm();
    }
    let (health_reporter, health) = tonic_health::server::health_reporter();
    health_reporter.set_serving::<VmHelperServer<HelperService>>().await;
    let reflection = |b: tonic_reflection::server::Builder<'static>| {
        b.register_encoded_file_descriptor_set(sandbox_contract::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection(tonic_reflection::server::Builder::configure())
        .build_v1()
        .map_err(|e| HelperError::io("reflection", std::io::Error::other(e)))?;
    let reflection_v1alpha = reflection(tonic_reflection::server::Builder::configure())
        .build_v1alpha()
        .map_err(|e| HelperError::io("reflection", std::io::Error::other(e)))?;

    tracing::info!(socket = %socket.display(), drivers = ?vms.drivers(), "helper serving");
    let stopper = vms.clone();
    let (stopped_tx, stopped_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tonic::transport::Server::builder()
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_frame_size(1 << 20)
        .add_service(health)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(VmHelperServer::new(HelperService::new(vms)))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
            let why = shutdown_signal(awaiting_ids).await;
            tracing::info!(signal = why, "stopping every vm");
            // Stopping VMs first ends their Exec streams, so the server's
            // graceful shutdown has nothing left to wait for.
            stopper.shutdown(SHUTDOWN_GRACE).await;
            let _ = stopped_tx.send(());
        });
    // Graceful shutdown waits for clients to hang up; an idle orchestrator
    // connection must not keep the helper alive forever.
    let result = tokio::select! {
        r = server => r,
        () = async {
            let _ = stopped_rx.await;
            tokio::time::sleep(CLIENT_DRAIN).await;
        } => Ok(()),
    };
    let _ = std::fs::remove_file(socket);
    let _ = std::fs::remove_file(&pid_file);
    result.map_err(|e| HelperError::io("grpc server", std::io::Error::other(e)))
}

/// The image store, with this helper's layer references kept on disk for
/// the other helpers sharing it. A store we cannot write to works without
/// them: nobody can collect its layers then either.
fn helper_store() -> ImageStore {
    let store = ImageStore::new(sandbox_base::paths::image_store());
    match store.clone().with_holder() {
        Ok(held) => held,
        Err(e) => {
            tracing::warn!(error = %e, "image store: cannot record which layers this helper's vms use");
            store
        }
    }
}

/// The pid file that goes with `socket`: the default one for the default
/// socket, else next to the socket.
fn pid_file_for(socket: &Path) -> PathBuf {
    if socket == sandbox_base::paths::helper_socket() {
        sandbox_base::paths::helper_pid_file()
    } else {
        socket.with_extension("pid")
    }
}

/// What stops the helper: SIGTERM, SIGINT, or (`awaiting_ids`) the id map
/// this user lacked at its start ([`host_set_up`]).
async fn shutdown_signal(awaiting_ids: bool) -> &'static str {
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        tracing::error!("cannot install signal handlers; the helper only stops when killed");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
        () = host_set_up(), if awaiting_ids => "host-setup gave this user an id map",
    }
}

/// Returns once this user has an id map, which it lacked when the helper
/// started (`sandbox-mcp doctor` started the helper, then `sudo sandbox-mcp
/// host-setup` ran): the helper then stops, with no VM to lose (none runs
/// without a map), and the next one (the daemon's watchdog starts it at
/// once) sees the map and the cgroups host-setup delegated. Reading
/// /etc/subuid every two seconds costs nothing.
async fn host_set_up() {
    loop {
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        if sandbox_userns::IdMapper::detect().is_ok() {
            return;
        }
    }
}

/// macOS's per-process open files cap (`OPEN_MAX`).
const OPEN_MAX: nix::sys::resource::rlim_t = 10240;

/// Raises the soft descriptor limit to the hard one: every VM holds
/// sockets and pipes, and the usual soft 1024 would let a few busy VMs
/// starve the rest (EMFILE on exec and on new VMs).
fn raise_nofile_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        // macOS refuses a soft limit above OPEN_MAX (an unlimited hard
        // limit included): there the cap is what Go and Rust's std raise to.
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard)
            .map(|()| hard)
            .or_else(|_| setrlimit(Resource::RLIMIT_NOFILE, hard.min(OPEN_MAX), hard).map(|()| hard.min(OPEN_MAX)))
        {
            Ok(to) => tracing::info!(from = soft, to, "raised the open files limit"),
            Err(e) => tracing::warn!(error = %e, soft, hard, "cannot raise the open files limit"),
        },
        Ok((soft, _)) => tracing::info!(limit = soft, "open files limit"),
        Err(e) => tracing::warn!(error = %e, "cannot read the open files limit"),
    }
}
