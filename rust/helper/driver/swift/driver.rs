//! [`SwiftDriver`]: the driver seam served by the VM layer across the
//! bridge. It only calls [`ffi`] functions; the agent connection is the
//! layer's stream fd under the same [`Mux`] as every other driver's.
use std::os::fd::{FromRawFd as _, IntoRawFd as _, OwnedFd};
use std::path::Path;
use std::sync::Arc;

use super::bridge::ffi;
use crate::HelperError;
use crate::agent_link::Dialer;
use crate::driver::{BootSpec, Capabilities, Driver, DriverError, Egress, Exit, HostFacts, HostProcesses, Instance};
use crate::netstack::{NetStack, device};
use sandbox_agent::mux::Mux;
use sandbox_agent::protocol::Frame;

/// The layer across the bridge, under the name it reports.
#[derive(Debug)]
pub struct SwiftDriver {
    /// What `layer_info` named the layer when the helper started: a
    /// driver's name is fixed for the helper's life (`isolation` settings
    /// and GetInfo name it).
    name: &'static str,
}

impl SwiftDriver {
    /// Asks the layer its name.
    pub fn new() -> Self {
        let info = ffi::layer_info();
        tracing::info!(name = %info.name, unavailable = %info.unavailable_reason, "vm layer across the bridge");
        // Leaked once per helper: `Driver::name` is `&'static str`.
        SwiftDriver { name: Box::leak(info.name.into_boxed_str()) }
    }
}

impl Default for SwiftDriver {
    fn default() -> Self {
        Self::new()
    }
}

#[tonic::async_trait]
impl Driver for SwiftDriver {
    fn name(&self) -> &'static str {
        self.name
    }

    fn unavailable_reason(&self) -> Option<String> {
        Some(ffi::layer_info().unavailable_reason).filter(|r| !r.is_empty())
    }

    fn capabilities(&self) -> Capabilities {
        ffi::layer_info().capabilities.into()
    }

    async fn boot(&self, spec: &BootSpec) -> Result<Arc<dyn Instance>, DriverError> {
        let mut request =
            ffi::BootRequest::try_from(spec).map_err(|e| DriverError::Unavailable(format!("boot request: {e}")))?;
        let net = match &spec.egress {
            None => None,
            Some(Egress::Stack(policy, events)) => {
                let (stack, card) = frame_socket(policy, events)?;
                // The layer owns the card's end from the call on, whatever
                // becomes of it.
                request.network.fd = card.into_raw_fd();
                Some(stack)
            }
            Some(Egress::Frames(_)) => {
                return Err(DriverError::Unavailable("the swift driver serves its VMs' cards itself".into()));
            }
        };
        ffi::layer_boot(request).await?;
        match connect(&spec.id).await {
            Ok(connection) => Ok(Arc::new(SwiftInstance {
                id: spec.id.clone(),
                connection,
                exit_taken: std::sync::atomic::AtomicBool::new(false),
                net: std::sync::Mutex::new(net),
            })),
            // A VM whose agent does not answer is no use: end it here, as
            // no one else holds it.
            Err(e) => {
                ffi::layer_kill(spec.id.clone());
                let _ = ffi::layer_wait_exit(spec.id.clone()).await;
                ffi::layer_cleanup(spec.id.clone());
                Err(e)
            }
        }
    }

    fn keep_warm(&self) {
        ffi::layer_keep_warm();
    }

    async fn release(&self) {
        ffi::layer_release().await;
    }
}

/// The VM's card on this helper's stack: a frame socket (one Ethernet frame
/// per datagram, what a Mac's `VZFileHandleNetworkDeviceAttachment` takes)
/// whose one end the stack serves under the sandbox's policy; the other
/// end is the card's, for the layer. The policy never crosses the bridge.
fn frame_socket(
    policy: &sandbox_net::policy::NetworkPolicy,
    events: &Arc<crate::netstack::events::Events>,
) -> Result<(NetStack, OwnedFd), DriverError> {
    let (stack, card) = device::frame_socket().map_err(|e| DriverError::io("make the vm's frame socket", e))?;
    let stack = NetStack::start(stack, device::LinkKind::EthernetDatagrams, policy.clone(), events.clone())
        .map_err(|e| DriverError::io("start the vm's network stack", e))?;
    Ok((stack, card))
}

/// A new connection to the agent of VM `id`, through the layer's dial.
async fn dial(id: &str) -> Result<Mux, DriverError> {
    // In a task of its own: a caller that goes away mid-dial (a client
    // hanging up) would drop the layer's answer and leave its fd open.
    let id = id.to_owned();
    let stream = tokio::spawn(async move { stream_from_fd(ffi::layer_dial_agent(id).await?) })
        .await
        .map_err(|e| DriverError::LayerFailed(format!("agent dial: {e}")))??;
    Ok(Mux::open_side(stream))
}

/// The agent's stream from a descriptor the layer handed over: checked to
/// be a stream socket before it is trusted as one.
fn stream_from_fd(fd: i32) -> Result<tokio::net::UnixStream, DriverError> {
    use nix::sys::socket::{SockType, getsockopt, sockopt};
    if fd < 0 {
        return Err(DriverError::LayerFailed(format!("the layer dialled the agent as fd {fd}")));
    }
    // SAFETY: the layer hands the caller its own descriptor (the
    // contract of `layer_dial_agent`); nothing else owns or closes it.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    match getsockopt(&owned, sockopt::SockType) {
        Ok(SockType::Stream) => {}
        Ok(other) => {
            return Err(DriverError::LayerFailed(format!("the agent's fd {fd} is a {other:?} socket, not a stream")));
        }
        Err(e) => return Err(DriverError::LayerFailed(format!("the agent's fd {fd} is not a socket: {e}"))),
    }
    let std = std::os::unix::net::UnixStream::from(owned);
    std.set_nonblocking(true).map_err(|e| DriverError::io("agent stream", e))?;
    tokio::net::UnixStream::from_std(std).map_err(|e| DriverError::io("agent stream", e))
}

/// How long an agent the layer reports listening has to answer its first
/// ping (the layer's boot already waited for the guest).
const FIRST_PING: std::time::Duration = std::time::Duration::from_secs(60);

/// Dials and makes one round trip, so a boot returns only when Exec works.
async fn connect(id: &str) -> Result<Mux, DriverError> {
    let mux = dial(id).await?;
    let mut stream = mux.open(Frame::Ping)?;
    let answer = tokio::time::timeout(FIRST_PING, stream.next())
        .await
        .map_err(|_| DriverError::Timeout("the agent's first answer"))?;
    match answer? {
        Some(Frame::Pong) => Ok(mux),
        other => Err(DriverError::InitFailed(format!("agent answered {other:?} to a ping"))),
    }
}

/// A VM the layer runs, known to it by id.
#[derive(Debug)]
struct SwiftInstance {
    id: String,
    /// The connection opened (and pinged) at boot.
    connection: Mux,
    /// `take_exit` hands out the layer's wait once.
    exit_taken: std::sync::atomic::AtomicBool,
    /// The stack serving its card (EGRESS), until cleanup.
    net: std::sync::Mutex<Option<NetStack>>,
}

impl Instance for SwiftInstance {
    fn connection(&self) -> Mux {
        self.connection.clone()
    }

    fn agent_dialer(&self) -> Dialer {
        let id = self.id.clone();
        Arc::new(move || {
            let id = id.clone();
            Box::pin(async move { dial(&id).await.map_err(std::io::Error::other) })
        })
    }

    fn request_stop(&self) {
        ffi::layer_request_stop(self.id.clone());
    }

    fn kill(&self) {
        ffi::layer_kill(self.id.clone());
    }

    fn take_exit(&self) -> Option<Exit> {
        if self.exit_taken.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return None;
        }
        Some(Box::pin(ffi::layer_wait_exit(self.id.clone())))
    }

    fn snapshot_layer(&self, upper: &Path, dst: &Path) -> Result<(), HelperError> {
        let path = |p: &Path| {
            p.to_str()
                .map(str::to_owned)
                .ok_or_else(|| HelperError::invalid("snapshot path", format!("{p:?} is not UTF-8")))
        };
        ffi::layer_snapshot(self.id.clone(), path(upper)?, path(dst)?).map_err(|e| HelperError::Driver(e.into()))
    }

    fn host_facts(&self) -> HostFacts {
        ffi::layer_host_facts(self.id.clone()).into()
    }

    fn limits_not_enforced(&self) -> String {
        ffi::layer_limits_not_enforced(self.id.clone())
    }

    fn host_processes(&self) -> Option<HostProcesses> {
        ffi::layer_host_processes(self.id.clone()).into()
    }

    fn cleanup(&self) {
        ffi::layer_cleanup(self.id.clone());
        drop(self.net.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take());
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::IntoRawFd as _;

    use super::*;

    fn message(r: Result<tokio::net::UnixStream, DriverError>) -> String {
        match r {
            Ok(_) => panic!("accepted"),
            Err(e) => e.to_string(),
        }
    }

    #[tokio::test]
    async fn an_agent_fd_that_is_not_a_stream_socket_is_refused_naming_it() {
        let (r, _w) = nix::unistd::pipe().unwrap();
        let fd = r.into_raw_fd();
        assert!(message(stream_from_fd(fd)).contains(&format!("fd {fd} is not a socket")));
        let (a, _b) = std::os::unix::net::UnixDatagram::pair().unwrap();
        assert!(message(stream_from_fd(a.into_raw_fd())).contains("Datagram socket, not a stream"));
        assert!(message(stream_from_fd(-1)).contains("as fd -1"));
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        assert!(stream_from_fd(a.into_raw_fd()).is_ok());
    }

    #[tokio::test]
    async fn the_exit_is_handed_out_once_and_resolves_through_the_layer() {
        let (a, _b) = tokio::net::UnixStream::pair().unwrap();
        let instance = SwiftInstance {
            id: "no-such-vm".into(),
            connection: Mux::open_side(a),
            exit_taken: std::sync::atomic::AtomicBool::new(false),
            net: std::sync::Mutex::new(None),
        };
        let exit = instance.take_exit().expect("the first take");
        assert!(instance.take_exit().is_none(), "the second take");
        // The layer (the double here) knows no such VM, and says so.
        assert_eq!(exit.await, "no vm \"no-such-vm\" in the layer");
    }
}
