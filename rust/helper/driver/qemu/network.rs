//! A vm's EGRESS network: a virtio-net card whose host end is qemu's
//! `-netdev dgram` on one end of a datagram socket pair, one Ethernet frame
//! per datagram; the helper serves the other end with the same stack and
//! policy as a namespace sandbox's tun ([`crate::netstack`],
//! [`LinkKind::EthernetDatagrams`]).
//!
//! The pair is made before qemu starts and qemu inherits its end, so no
//! socket file exists for anything else to reach, and a guest that escaped
//! into qemu reaches only this socket, which speaks frames to a stack that
//! re-checks every flow. The card is part of the vm's shape, so template
//! and pool vms have it too: the netdev backend is host-side, not migrated
//! state, so a restored vm's qemu gets a pair of its own. The helper's end
//! ([`Connected`]) waits unread until the sandbox's policy is known, at
//! hand-out; guest init brings eth0 up only after its "go", so before that
//! the guest sends nothing (qemu's own announce after a restore, a RARP
//! frame, waits in the socket and the stack drops it).
//!
//! Datagrams, not qemu's length-prefixed stream, because the vm outlives
//! its helper ([`super::keeper`]): qemu keeps its end, the keeper a copy of
//! the helper's, and a new helper reads on from the next whole frame, where
//! a stream cut mid-frame by a helper's death would stay out of step.
use std::os::fd::OwnedFd;
use std::sync::Arc;

use super::QemuError;
use crate::netstack::NetStack;
use crate::netstack::device::{LinkKind, frame_socket};
use crate::netstack::events::Events;
use sandbox_net::policy::NetworkPolicy;

/// The helper's end of a vm's network card, not yet served.
#[derive(Debug)]
pub struct Connected(OwnedFd);

impl From<OwnedFd> for Connected {
    fn from(fd: OwnedFd) -> Self {
        Connected(fd)
    }
}

/// A card's socket pair: qemu's end (close-on-exec: its keeper passes it
/// on by number) and the helper's.
pub fn pair() -> Result<(OwnedFd, Connected), QemuError> {
    let (qemu, helper) = frame_socket().map_err(|e| QemuError::io("the network card's socket pair", e))?;
    Ok((qemu, Connected(helper)))
}

impl Connected {
    /// The fd, for the keeper's copy.
    pub fn fd(&self) -> &OwnedFd {
        &self.0
    }

    /// Serves the card's frames under `policy`, recording in `events`.
    pub fn serve(self, policy: NetworkPolicy, events: Arc<Events>) -> Result<NetStack, QemuError> {
        NetStack::start(self.0, LinkKind::EthernetDatagrams, policy, events)
            .map_err(|e| QemuError::io("start the vm's network stack", e))
    }
}
