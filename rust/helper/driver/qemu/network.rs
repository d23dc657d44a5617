//! A vm's EGRESS network: a virtio-net card whose host end is qemu's
//! `-netdev stream` client connected to a Unix socket the helper listens
//! on, carrying length-prefixed Ethernet frames. The helper serves that
//! connection with the same stack and policy as a namespace sandbox's tun
//! ([`crate::netstack`], [`LinkKind::EthernetStream`]).
//!
//! The helper listens before qemu starts and accepts exactly one
//! connection: qemu connects while it sets up its devices, before the
//! guest runs. The card is part of the vm's shape, so template and pool
//! vms have it too: the netdev backend is host-side, not migrated state,
//! so a restored vm's qemu connects to its own new socket. The accepted
//! connection ([`Connected`]) waits unread until the sandbox's policy is
//! known, at hand-out; guest init brings eth0 up only after its "go", so
//! before that the guest sends nothing (qemu's own announce after a
//! restore, a RARP frame, waits in the socket and the stack drops it).
//! A guest that escaped into qemu reaches only this socket, which speaks
//! frames to a stack that re-checks every flow.
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{UnixListener, UnixStream};

use super::QemuError;
use crate::netstack::NetStack;
use crate::netstack::device::LinkKind;
use crate::netstack::events::Events;
use sandbox_net::policy::NetworkPolicy;

/// How long qemu has to connect its network card after the agent's port
/// (both connect while qemu starts, before the guest runs).
const CONNECT_WAIT: Duration = Duration::from_secs(30);

/// The socket qemu's network card connects to, before qemu starts.
pub struct NetLink {
    listener: UnixListener,
    path: PathBuf,
}

/// qemu's connected network card, not yet served.
#[derive(Debug)]
pub struct Connected(UnixStream);

impl NetLink {
    /// Listens on `run_dir/net.sock` (owner only).
    pub fn listen(run_dir: &Path) -> Result<Self, QemuError> {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::create_dir_all(run_dir).map_err(|e| QemuError::io(format!("create {}", run_dir.display()), e))?;
        let path = run_dir.join("net.sock");
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).map_err(|e| QemuError::io(format!("bind {}", path.display()), e))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| QemuError::io(format!("chmod {}", path.display()), e))?;
        Ok(NetLink { listener, path })
    }

    /// The socket's path, for qemu's command line.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Accepts qemu's connection; the socket file goes (a second
    /// connection is never accepted).
    pub async fn accept(self) -> Result<Connected, QemuError> {
        let accepted = tokio::time::timeout(CONNECT_WAIT, self.listener.accept()).await;
        let _ = std::fs::remove_file(&self.path);
        let (stream, _) = accepted
            .map_err(|_| QemuError::Timeout {
                what: "qemu to connect the vm's network card",
                secs: CONNECT_WAIT.as_secs(),
            })?
            .map_err(|e| QemuError::io("accept qemu's network connection", e))?;
        Ok(Connected(stream))
    }

    /// Accepts qemu's connection and serves it under `policy`.
    pub async fn attach(self, policy: NetworkPolicy, events: Arc<Events>) -> Result<NetStack, QemuError> {
        self.accept().await?.serve(policy, events)
    }
}

impl Connected {
    /// Serves the card's frames under `policy`, recording in `events`.
    pub fn serve(self, policy: NetworkPolicy, events: Arc<Events>) -> Result<NetStack, QemuError> {
        let fd: OwnedFd = self.0.into_std().map_err(|e| QemuError::io("take qemu's network connection", e))?.into();
        NetStack::start(fd, LinkKind::EthernetStream, policy, events)
            .map_err(|e| QemuError::io("start the vm's network stack", e))
    }
}
