//! Dial inside the VM: the agent connects to `127.0.0.1:port` in the guest
//! and relays bytes over its stream, with TCP half-close (`End`) both ways.
//! The guest sees a plain loopback client, on every driver: no port mapping
//! and no listener on any host interface.
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use super::mux::{StreamReceiver, StreamSender};
use super::protocol::{FailKind, Frame, MAX_DATA};

/// A loopback connect answers at once; this only bounds a guest whose
/// listen backlog is full (the kernel then drops our SYNs and retries).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Connects and relays until both directions are closed or the helper
/// cancels the stream.
pub async fn serve(port: u16, tx: StreamSender, mut rx: StreamReceiver) {
    let connected = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(("127.0.0.1", port))).await;
    let stream = match connected {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            let kind =
                if e.kind() == std::io::ErrorKind::ConnectionRefused { FailKind::Refused } else { FailKind::Internal };
            let _ = tx.send(Frame::Fail { kind, message: format!("connect to 127.0.0.1:{port}: {e}") }).await;
            return;
        }
        Err(_) => {
            let message = format!("connect to 127.0.0.1:{port}: no answer within {CONNECT_TIMEOUT:?}");
            let _ = tx.send(Frame::Fail { kind: FailKind::Internal, message }).await;
            return;
        }
    };
    let _ = stream.set_nodelay(true);
    if tx.send(Frame::Connected).await.is_err() {
        return;
    }
    let (mut guest_rd, mut guest_wr) = stream.into_split();
    let to_helper = async {
        let mut buf = vec![0u8; MAX_DATA];
        loop {
            match guest_rd.read(&mut buf).await {
                Ok(0) | Err(_) => {
                    let _ = tx.send(Frame::End).await;
                    return;
                }
                Ok(n) => {
                    if tx.send(Frame::Data(buf[..n].to_vec())).await.is_err() {
                        return;
                    }
                }
            }
        }
    };
    let to_guest = async {
        loop {
            match rx.next().await {
                Ok(Some(Frame::Data(b))) => {
                    if guest_wr.write_all(&b).await.is_err() {
                        return false;
                    }
                }
                Ok(Some(Frame::End)) => {
                    let _ = guest_wr.shutdown().await;
                    return true;
                }
                Ok(Some(_)) => {}
                // Cancelled or lost: drop the guest connection at once.
                Ok(None) | Err(_) => return false,
            }
        }
    };
    tokio::pin!(to_helper, to_guest);
    tokio::select! {
        () = &mut to_helper => {
            // The guest closed its side; the helper may still send.
            let _ = (&mut to_guest).await;
        }
        half_closed = &mut to_guest => {
            if half_closed {
                to_helper.await;
            }
        }
    }
}
