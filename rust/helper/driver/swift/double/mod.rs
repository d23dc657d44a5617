//! The Linux double of the Swift VM layer: it exports the very
//! `__swift_bridge__$layer_*` symbols the Swift package exports on a Mac,
//! with swift-bridge 0.1.59's C ABI (read from the generated glue:
//! strings as owned `*mut RustString`, shared structs by value, async
//! functions as a callback wrapper plus `extern "C"` completion callbacks),
//! and runs each VM on an in-process [`NamespaceDriver`], by id. The
//! helper's Rust half thus links and runs end to end on Linux, every call
//! crossing the bridge's ABI.
//!
//! Like Swift's `Task { … }`, async calls return at once and complete on
//! a task of their own (on the caller's tokio runtime: the helper's).
use std::collections::HashMap;
use std::ffi::c_void;
use std::os::fd::{FromRawFd as _, IntoRawFd as _, OwnedFd};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use swift_bridge::string::RustString;

use super::bridge::ffi;
use crate::driver::namespace::NamespaceDriver;
use crate::driver::{BootSpec, Driver, Egress, Exit, Instance};

/// The layer: its driver (or why there is none) and its running VMs.
struct Layer {
    driver: Result<Arc<NamespaceDriver>, String>,
    vms: Mutex<HashMap<String, Vm>>,
}

/// One VM the layer booted.
struct Vm {
    instance: Arc<dyn Instance>,
    /// The instance's exit, until `layer_wait_exit` takes it.
    exit: Option<Exit>,
}

fn layer() -> &'static Layer {
    static LAYER: OnceLock<Layer> = OnceLock::new();
    LAYER.get_or_init(|| Layer {
        driver: NamespaceDriver::detect().map(Arc::new).map_err(|e| e.to_string()),
        vms: Mutex::new(HashMap::new()),
    })
}

impl Layer {
    fn vms(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vm>> {
        self.vms.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn instance(&self, id: &str) -> Option<Arc<dyn Instance>> {
        self.vms().get(id).map(|vm| vm.instance.clone())
    }

    fn driver(&self) -> Result<&Arc<NamespaceDriver>, ffi::LayerError> {
        self.driver.as_ref().map_err(|why| ffi::LayerError::Unavailable(why.clone()))
    }
}

/// An owned string the caller boxed for us.
///
/// SAFETY (of every use): swift-bridge passes `String` arguments as a
/// `Box<RustString>` whose ownership moves to the callee.
unsafe fn take_string(s: *mut RustString) -> String {
    unsafe { Box::from_raw(s).0 }
}

/// A raw pointer moved to the task completing an async call. The wrapper
/// is the caller's oneshot sender, valid until completed exactly once.
struct Completion(*mut c_void);
// SAFETY: the wrapper is only handed back once, from whichever thread.
unsafe impl Send for Completion {}

/// Runs `f` as a task of its own on the caller's runtime; without one (a
/// caller outside tokio) it runs on a thread with a runtime of its own.
fn spawn(f: impl Future<Output = ()> + Send + 'static) {
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => {
            rt.spawn(f);
        }
        Err(_) => {
            std::thread::spawn(move || match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt.block_on(f),
                Err(e) => tracing::error!(error = %e, "vm layer double: no runtime for an async call"),
            });
        }
    }
}

/// Runs `work` as a task of its own and hands its outcome to `done`
/// exactly once, a panic in it included (as a message): the caller across
/// the bridge waits for that completion, as for a Swift `Task` that throws.
fn complete<R: Send + 'static>(
    work: impl Future<Output = R> + Send + 'static,
    done: impl FnOnce(Result<R, String>) + Send + 'static,
) {
    spawn(async move {
        let outcome = tokio::spawn(work).await.map_err(|e| format!("the vm layer double failed: {e}"));
        done(outcome);
    });
}

#[unsafe(export_name = "__swift_bridge__$layer_info")]
extern "C" fn layer_info() -> ffi::__swift_bridge__LayerInfo {
    let info = match &layer().driver {
        Ok(d) => ffi::LayerInfo {
            name: d.name().into(),
            unavailable_reason: d.unavailable_reason().unwrap_or_default(),
            capabilities: (&d.capabilities()).into(),
        },
        Err(why) => ffi::LayerInfo {
            name: "namespaces".into(),
            unavailable_reason: why.clone(),
            capabilities: (&crate::driver::Capabilities::default()).into(),
        },
    };
    info.into_ffi_repr()
}

#[unsafe(export_name = "__swift_bridge__$layer_boot")]
extern "C" fn layer_boot(
    wrapper: *mut c_void,
    on_success: extern "C" fn(*mut c_void),
    on_error: extern "C" fn(*mut c_void, ffi::__swift_bridge__LayerError),
    request: ffi::__swift_bridge__BootRequest,
) {
    let request = request.into_rust_repr();
    let wrapper = Completion(wrapper);
    complete(boot(request), move |outcome| {
        let wrapper = wrapper;
        match outcome {
            Ok(Ok(())) => on_success(wrapper.0),
            Ok(Err(e)) => on_error(wrapper.0, e.into_ffi_repr()),
            Err(panicked) => on_error(wrapper.0, ffi::LayerError::Failed(panicked).into_ffi_repr()),
        }
    });
}

async fn boot(request: ffi::BootRequest) -> Result<(), ffi::LayerError> {
    // The layer owns the frame socket from here on. The namespace VM's
    // eth0 is relayed onto it as a Mac guest's card puts its frames there,
    // so the helper's stack behind it serves both alike.
    let frames = match request.network.fd {
        -1 => None,
        fd => Some(take_frame_socket(fd)?),
    };
    check_card(&request.network)?;
    let layer = layer();
    let driver = layer.driver()?.clone();
    let mut spec = BootSpec::try_from(request)?;
    if layer.vms().contains_key(&spec.id) {
        return Err(ffi::LayerError::Failed(format!("vm {:?} is already running", spec.id)));
    }
    spec.egress = frames.map(|fd| Egress::Frames(Arc::new(fd)));
    let instance = driver.boot(&spec).await.map_err(ffi::LayerError::from)?;
    let exit = instance.take_exit();
    layer.vms().insert(spec.id, Vm { instance, exit });
    Ok(())
}

/// The double's card is the namespace driver's eth0, relayed: its MAC and
/// addresses are the stack's own, and a request for another card is
/// refused rather than booted unreachable.
fn check_card(card: &ffi::LayerNetwork) -> Result<(), ffi::LayerError> {
    let want = super::convert::network_card(card.fd);
    let describe =
        |c: &ffi::LayerNetwork| format!("{} {} via {} dns {} mtu {}", c.mac, c.address, c.gateway, c.nameserver, c.mtu);
    if describe(card) == describe(&want) {
        Ok(())
    } else {
        Err(ffi::LayerError::Unavailable(format!(
            "the double's card is {}, not the requested {}",
            describe(&want),
            describe(card)
        )))
    }
}

/// Takes the frame socket `fd` and checks it is a datagram socket (what
/// a VZFileHandleNetworkDeviceAttachment needs).
fn take_frame_socket(fd: i32) -> Result<OwnedFd, ffi::LayerError> {
    use nix::sys::socket::{SockType, getsockopt, sockopt};
    if fd < 0 {
        return Err(ffi::LayerError::Unavailable(format!("network.fd {fd}: not a descriptor (-1 is no network)")));
    }
    // SAFETY: the request hands the layer this descriptor to own.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    match getsockopt(&owned, sockopt::SockType) {
        Ok(SockType::Datagram) => Ok(owned),
        Ok(other) => Err(ffi::LayerError::Unavailable(format!(
            "network.fd {fd} is a {other:?} socket; the frames need a datagram socket"
        ))),
        Err(e) => Err(ffi::LayerError::Unavailable(format!("network.fd {fd} is not a socket: {e}"))),
    }
}

#[unsafe(export_name = "__swift_bridge__$layer_dial_agent")]
extern "C" fn layer_dial_agent(
    wrapper: *mut c_void,
    on_success: extern "C" fn(*mut c_void, i32),
    on_error: extern "C" fn(*mut c_void, ffi::__swift_bridge__LayerError),
    id: *mut RustString,
) {
    // SAFETY: see `take_string`.
    let id = unsafe { take_string(id) };
    let wrapper = Completion(wrapper);
    complete(async move { dial_agent(&id).await }, move |outcome| {
        let wrapper = wrapper;
        match outcome {
            Ok(Ok(fd)) => on_success(wrapper.0, fd),
            Ok(Err(e)) => on_error(wrapper.0, e.into_ffi_repr()),
            Err(panicked) => on_error(wrapper.0, ffi::LayerError::Failed(panicked).into_ffi_repr()),
        }
    });
}

/// A new connection to the agent's socket, as a Mac's layer dials its
/// vsock port. (The namespace instance keeps the connection it pinged at
/// boot; it stays idle, and goes with the instance.)
async fn dial_agent(id: &str) -> Result<i32, ffi::LayerError> {
    if layer().instance(id).is_none() {
        return Err(ffi::LayerError::NotFound(id.to_owned()));
    }
    let path = crate::storage::agent_socket(id);
    let stream = tokio::net::UnixStream::connect(&path)
        .await
        .map_err(|e| ffi::LayerError::Failed(format!("connect {}: {e}", path.display())))?;
    let stream = stream.into_std().map_err(|e| ffi::LayerError::Failed(format!("agent stream: {e}")))?;
    Ok(stream.into_raw_fd())
}

#[unsafe(export_name = "__swift_bridge__$layer_request_stop")]
extern "C" fn layer_request_stop(id: *mut RustString) {
    // SAFETY: see `take_string`.
    let id = unsafe { take_string(id) };
    match layer().instance(&id) {
        Some(vm) => vm.request_stop(),
        None => tracing::warn!(vm = %id.escape_debug(), "vm layer double: stop of an unknown vm"),
    }
}

#[unsafe(export_name = "__swift_bridge__$layer_kill")]
extern "C" fn layer_kill(id: *mut RustString) {
    // SAFETY: see `take_string`.
    let id = unsafe { take_string(id) };
    match layer().instance(&id) {
        Some(vm) => vm.kill(),
        None => tracing::warn!(vm = %id.escape_debug(), "vm layer double: kill of an unknown vm"),
    }
}

#[unsafe(export_name = "__swift_bridge__$layer_wait_exit")]
extern "C" fn layer_wait_exit(
    wrapper: *mut c_void,
    callback: extern "C" fn(*mut c_void, *mut RustString),
    id: *mut RustString,
) {
    // SAFETY: see `take_string`.
    let id = unsafe { take_string(id) };
    let exit = layer().vms().get_mut(&id).map(|vm| vm.exit.take());
    let wrapper = Completion(wrapper);
    let wait = async move {
        match exit {
            Some(Some(exit)) => exit.await,
            Some(None) => "the layer's wait was taken already".to_owned(),
            None => format!("no vm {:?} in the layer", id),
        }
    };
    complete(wait, move |how| {
        let wrapper = wrapper;
        callback(wrapper.0, RustString(how.unwrap_or_else(|panicked| panicked)).box_into_raw());
    });
}

#[unsafe(export_name = "__swift_bridge__$layer_snapshot")]
extern "C" fn layer_snapshot(
    id: *mut RustString,
    upper: *mut RustString,
    dst: *mut RustString,
) -> ffi::ResultVoidAndLayerError {
    // SAFETY: see `take_string`.
    let (id, upper, dst) = unsafe { (take_string(id), take_string(upper), take_string(dst)) };
    let result = match layer().instance(&id) {
        None => Err(ffi::LayerError::NotFound(id)),
        Some(_) if upper.contains('\0') || dst.contains('\0') => {
            Err(ffi::LayerError::Unavailable("snapshot paths hold a NUL byte".into()))
        }
        Some(vm) => vm.snapshot_layer(upper.as_ref(), dst.as_ref()).map_err(|e| ffi::LayerError::Failed(e.to_string())),
    };
    match result {
        Ok(()) => ffi::ResultVoidAndLayerError::Ok,
        Err(e) => ffi::ResultVoidAndLayerError::Err(e.into_ffi_repr()),
    }
}

#[unsafe(export_name = "__swift_bridge__$layer_host_facts")]
extern "C" fn layer_host_facts(id: *mut RustString) -> ffi::__swift_bridge__LayerHostFacts {
    // SAFETY: see `take_string`.
    let id = unsafe { take_string(id) };
    let facts = layer().instance(&id).map(|vm| vm.host_facts()).unwrap_or_default();
    ffi::LayerHostFacts::from(facts).into_ffi_repr()
}

#[unsafe(export_name = "__swift_bridge__$layer_host_processes")]
extern "C" fn layer_host_processes(id: *mut RustString) -> ffi::__swift_bridge__LayerHostProcesses {
    // SAFETY: see `take_string`.
    let id = unsafe { take_string(id) };
    ffi::LayerHostProcesses::from(layer().instance(&id).and_then(|vm| vm.host_processes())).into_ffi_repr()
}

#[unsafe(export_name = "__swift_bridge__$layer_limits_not_enforced")]
extern "C" fn layer_limits_not_enforced(id: *mut RustString) -> *mut RustString {
    // SAFETY: see `take_string`.
    let id = unsafe { take_string(id) };
    RustString(layer().instance(&id).map(|vm| vm.limits_not_enforced()).unwrap_or_default()).box_into_raw()
}

#[unsafe(export_name = "__swift_bridge__$layer_cleanup")]
extern "C" fn layer_cleanup(id: *mut RustString) {
    // SAFETY: see `take_string`.
    let id = unsafe { take_string(id) };
    let vm = layer().vms().remove(&id);
    if let Some(vm) = vm {
        vm.instance.cleanup();
    }
}

#[unsafe(export_name = "__swift_bridge__$layer_keep_warm")]
extern "C" fn layer_keep_warm() {
    if let Ok(d) = &layer().driver {
        d.keep_warm();
    }
}

#[unsafe(export_name = "__swift_bridge__$layer_release")]
extern "C" fn layer_release(wrapper: *mut c_void, callback: extern "C" fn(*mut c_void)) {
    let wrapper = Completion(wrapper);
    let release = async {
        if let Ok(d) = &layer().driver {
            d.release().await;
        }
    };
    complete(release, move |_| {
        let wrapper = wrapper;
        callback(wrapper.0);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_call_whose_work_panics_still_completes_with_the_failure() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        complete(async { panic!("boom") }, move |outcome: Result<(), String>| {
            let _ = tx.send(outcome);
        });
        let outcome = tokio::time::timeout(std::time::Duration::from_secs(10), rx).await.expect("completed").unwrap();
        let failure = outcome.expect_err("the panic is the outcome");
        assert!(failure.contains("the vm layer double failed") && failure.contains("panicked"), "{failure}");
    }

    fn request(id: &str) -> ffi::BootRequest {
        ffi::BootRequest {
            id: id.into(),
            hostname: "h".into(),
            layers: vec![],
            dir: "/nonexistent".into(),
            mount_hosts: vec![],
            mount_guests: vec![],
            mount_read_only: vec![],
            cpus: 1,
            memory_bytes: 1 << 28,
            pids: 64,
            disk_bytes: 1 << 28,
            network: crate::driver::swift::convert::network_card(-1),
            image_reference: String::new(),
        }
    }

    // These go through the generated Rust side of the bridge (ffi::*),
    // which calls the exported symbols above by their link names.

    #[tokio::test]
    async fn an_unknown_id_is_not_found_on_every_call() {
        let e = ffi::layer_dial_agent("no-such-vm".into()).await.unwrap_err();
        assert!(matches!(e, ffi::LayerError::NotFound(id) if id == "no-such-vm"));
        assert!(matches!(
            ffi::layer_snapshot("no-such-vm".into(), "/a".into(), "/b".into()),
            Err(ffi::LayerError::NotFound(_))
        ));
        assert_eq!(ffi::layer_wait_exit("no-such-vm".into()).await, "no vm \"no-such-vm\" in the layer");
        assert_eq!(ffi::layer_limits_not_enforced("no-such-vm".into()), "");
        let facts = ffi::layer_host_facts("no-such-vm".into());
        assert_eq!((facts.memory_limit_bytes, facts.pids_limit, facts.oom_killed), (0, 0, false));
        let p = ffi::layer_host_processes("no-such-vm".into());
        assert_eq!((p.pid1, p.agent), (-1, -1));
        ffi::layer_request_stop("no-such-vm".into());
        ffi::layer_kill("no-such-vm".into());
        ffi::layer_cleanup("no-such-vm".into());
    }

    #[tokio::test]
    async fn a_network_fd_that_is_not_a_socket_is_refused() {
        let (r, w) = nix::unistd::pipe().unwrap();
        let mut req = request("fd-not-socket");
        req.network.fd = r.into_raw_fd();
        let e = ffi::layer_boot(req).await.unwrap_err();
        assert!(matches!(&e, ffi::LayerError::Unavailable(m) if m.contains("is not a socket")), "{:?}", msg(&e));
        drop(w);
        let mut req = request("fd-stream");
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        req.network.fd = OwnedFd::from(a).into_raw_fd();
        let e = ffi::layer_boot(req).await.unwrap_err();
        assert!(matches!(&e, ffi::LayerError::Unavailable(m) if m.contains("datagram")), "{:?}", msg(&e));
        let mut req = request("fd-negative");
        req.network.fd = -7;
        assert!(matches!(ffi::layer_boot(req).await, Err(ffi::LayerError::Unavailable(_))));
    }

    #[tokio::test]
    async fn a_card_with_other_addresses_is_refused_naming_both() {
        let (a, _b) = std::os::unix::net::UnixDatagram::pair().unwrap();
        let mut req = request("card-other");
        req.network.fd = OwnedFd::from(a).into_raw_fd();
        req.network.mac = "02:00:00:00:00:01".into();
        let e = ffi::layer_boot(req).await.unwrap_err();
        assert!(
            matches!(&e, ffi::LayerError::Unavailable(m) if m.contains("52:54:00:0a:00:0f") && m.contains("02:00:00:00:00:01")),
            "{:?}",
            msg(&e)
        );
    }

    #[tokio::test]
    async fn hostile_strings_cross_and_are_refused_cleanly() {
        let mut req = request("vm\0/../../etc/passwd");
        let e = ffi::layer_boot(req).await.unwrap_err();
        assert!(matches!(&e, ffi::LayerError::Unavailable(m) if m.contains("NUL")), "{:?}", msg(&e));
        req = request("ok");
        req.mount_hosts = vec!["/a".into()];
        let e = ffi::layer_boot(req).await.unwrap_err();
        assert!(matches!(&e, ffi::LayerError::Unavailable(m) if m.contains("differ in length")), "{:?}", msg(&e));
        // 16 MiB ids go through whole (swift-bridge strings are pointer and
        // length) and name no vm.
        let huge = "x".repeat(16 << 20);
        let e = ffi::layer_dial_agent(huge.clone()).await.unwrap_err();
        assert!(matches!(e, ffi::LayerError::NotFound(id) if id.len() == huge.len()));
        assert!(matches!(ffi::layer_snapshot(huge, "\0".into(), "/b".into()), Err(ffi::LayerError::NotFound(_))));
    }

    #[test]
    fn the_layer_reports_the_namespace_driver() {
        let info = ffi::layer_info();
        assert_eq!(info.name, "namespaces");
    }

    fn msg(e: &ffi::LayerError) -> &str {
        match e {
            ffi::LayerError::Unavailable(m) | ffi::LayerError::NotFound(m) | ffi::LayerError::Failed(m) => m,
        }
    }
}
