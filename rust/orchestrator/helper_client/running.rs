//! What the orchestrator asks of a running VM beyond lifecycle: dials to its
//! ports, copies in and out, background processes, usage and the refusals
//! of its egress policy.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::{StreamExt, wrappers::ReceiverStream};
use tonic::{Code, Streaming};

use sandbox_contract::v1 as pb;

use super::convert::{background_info, process_spec};
use super::{
    BackgroundInfo, HelperClient, HelperError, NetworkEvents, PAYLOAD_CHUNK, ProcessConfig, RefusedFlow, VmStats,
};
use crate::isolation::Isolation;

/// The sending half of a Dial pipe.
#[derive(Clone)]
pub struct DialWriter {
    tx: mpsc::Sender<pb::DialRequest>,
}

impl DialWriter {
    /// Bytes for the guest; false once the pipe is gone.
    pub async fn write(&self, data: Vec<u8>) -> bool {
        self.tx.send(pb::DialRequest { msg: Some(pb::dial_request::Msg::Data(data)) }).await.is_ok()
    }

    /// Half-close towards the guest.
    pub async fn close_write(&self) {
        let _ = self.tx.send(pb::DialRequest { msg: Some(pb::dial_request::Msg::CloseWrite(pb::CloseStdin {})) }).await;
    }
}

/// The receiving half of a Dial pipe.
pub struct DialReader {
    rx: Streaming<pb::DialResponse>,
}

impl DialReader {
    /// Next bytes from the guest; `None` at EOF.
    pub async fn read(&mut self) -> Result<Option<Vec<u8>>, HelperError> {
        loop {
            match self.rx.message().await? {
                None => return Ok(None),
                Some(pb::DialResponse { msg: Some(pb::dial_response::Msg::Data(d)) }) => return Ok(Some(d)),
                Some(_) => continue,
            }
        }
    }
}

impl HelperClient {
    /// Open a byte pipe to `port` inside the VM, which runs on `isolation`'s
    /// driver; returns once the guest accepted.
    pub async fn dial(
        &self,
        vm_id: &str,
        isolation: Isolation,
        port: u16,
    ) -> Result<(DialWriter, DialReader), HelperError> {
        let driver = self.features(isolation)?;
        driver.require(driver.dial, "port forwarding")?;
        let (tx, rx) = mpsc::channel(16);
        let start = pb::DialStart { vm_id: vm_id.into(), port: port.into() };
        tx.send(pb::DialRequest { msg: Some(pb::dial_request::Msg::Start(start)) })
            .await
            .map_err(|_| HelperError::Other("dial stream closed".into()))?;
        let mut rx = self.client.clone().dial(ReceiverStream::new(rx)).await?.into_inner();
        match rx.message().await? {
            Some(pb::DialResponse { msg: Some(pb::dial_response::Msg::Connected(_)) }) => {}
            _ => {
                return Err(HelperError::Other(format!("VM {vm_id} did not confirm the connection to port {port}")));
            }
        }
        Ok((DialWriter { tx }, DialReader { rx }))
    }

    /// Extract a tar archive (given in chunks) into `dest_dir` inside the VM.
    /// Returns (files, bytes) written.
    pub async fn copy_in(
        &self,
        vm_id: &str,
        dest_dir: &str,
        chunks: mpsc::Receiver<Vec<u8>>,
    ) -> Result<(u64, u64), HelperError> {
        let start = pb::CopyInRequest {
            msg: Some(pb::copy_in_request::Msg::Start(pb::CopyInStart {
                vm_id: vm_id.into(),
                dest_dir: dest_dir.into(),
            })),
        };
        let data =
            ReceiverStream::new(chunks).map(|d| pb::CopyInRequest { msg: Some(pb::copy_in_request::Msg::Data(d)) });
        let stream = tokio_stream::once(start).chain(data);
        let r = self.client.clone().copy_in(stream).await?.into_inner();
        Ok((r.files, r.bytes))
    }

    /// [`Self::copy_in`] of an archive already in memory.
    pub async fn copy_in_archive(
        &self,
        vm_id: &str,
        dest_dir: &str,
        archive: Vec<u8>,
    ) -> Result<(u64, u64), HelperError> {
        let chunks: Vec<Vec<u8>> = archive.chunks(PAYLOAD_CHUNK).map(<[u8]>::to_vec).collect();
        let (tx, rx) = mpsc::channel(chunks.len().max(1));
        for chunk in chunks {
            // Room for every chunk, and the receiver is alive until copy_in
            // consumes it: this cannot fail.
            let _ = tx.try_send(chunk);
        }
        drop(tx);
        self.copy_in(vm_id, dest_dir, rx).await
    }

    /// A tar archive of `path` inside the VM, as a stream of chunks.
    pub async fn copy_out(&self, vm_id: &str, path: &str) -> Result<CopyOutReader, HelperError> {
        let rx = self
            .client
            .clone()
            .copy_out(pb::CopyOutRequest { vm_id: vm_id.into(), path: path.into() })
            .await?
            .into_inner();
        Ok(CopyOutReader { rx })
    }

    /// Resource usage of a running VM.
    pub async fn stats(&self, vm_id: &str) -> Result<VmStats, HelperError> {
        let s = self.client.clone().stats(pb::StatsRequest { vm_id: vm_id.into() }).await?.into_inner();
        Ok(VmStats {
            cpu_usage_ns: s.cpu_usage_ns,
            memory_used: s.memory_used_bytes,
            memory_limit: s.memory_limit_bytes,
            pids: s.pids,
            net_rx: s.net_rx_bytes,
            net_tx: s.net_tx_bytes,
            uptime: Duration::from_millis(s.uptime_ms),
            oom_killed: s.oom_killed,
            disk_used: s.disk_used_bytes,
            disk_limit: s.disk_limit_bytes,
            disk_quota_exceeded: Some(s.disk_quota_exceeded).filter(|r| !r.is_empty()),
            limits_not_enforced: Some(s.limits_not_enforced).filter(|r| !r.is_empty()),
        })
    }

    /// Start a background process owned by the VM.
    pub async fn start_background(
        &self,
        vm_id: &str,
        name: &str,
        p: ProcessConfig,
    ) -> Result<BackgroundInfo, HelperError> {
        let process = process_spec(vm_id, p);
        let r = self
            .client
            .clone()
            .start_background(pb::StartBackgroundRequest { process: Some(process), name: name.into() })
            .await?
            .into_inner();
        background_info(r.process)
    }

    /// Every background process record of a VM.
    pub async fn list_background(&self, vm_id: &str) -> Result<Vec<BackgroundInfo>, HelperError> {
        let r =
            self.client.clone().list_background(pb::ListBackgroundRequest { vm_id: vm_id.into() }).await?.into_inner();
        r.processes.into_iter().map(|p| background_info(Some(p))).collect()
    }

    /// A background process and the tail of its output.
    pub async fn read_background_log(
        &self,
        vm_id: &str,
        name: &str,
        tail_lines: u32,
    ) -> Result<(BackgroundInfo, Vec<u8>), HelperError> {
        let r = self
            .client
            .clone()
            .read_background_log(pb::ReadBackgroundLogRequest { vm_id: vm_id.into(), name: name.into(), tail_lines })
            .await?
            .into_inner();
        Ok((background_info(r.process)?, r.output))
    }

    /// Stop a background process (TERM, grace, KILL to its group); returns its last output.
    pub async fn stop_background(
        &self,
        vm_id: &str,
        name: &str,
        tail_lines: u32,
    ) -> Result<(BackgroundInfo, Vec<u8>), HelperError> {
        let r = self
            .client
            .clone()
            .stop_background(pb::StopBackgroundRequest {
                vm_id: vm_id.into(),
                name: name.into(),
                grace_ms: 0,
                tail_lines,
            })
            .await?
            .into_inner();
        Ok((background_info(r.process)?, r.output))
    }
}

impl HelperClient {
    /// The refusals of a VM's egress policy; `None` when this helper does not
    /// implement the RPC (it reports nothing, which is not an error).
    pub async fn network_events(&self, vm_id: &str) -> Result<Option<NetworkEvents>, HelperError> {
        let req = pb::NetworkEventsRequest { vm_id: vm_id.into() };
        let r = match self.client.clone().network_events(req).await {
            Ok(r) => r.into_inner(),
            Err(s) if s.code() == Code::Unimplemented => return Ok(None),
            Err(s) => return Err(s.into()),
        };
        Ok(Some(NetworkEvents {
            refused: r
                .refused
                .into_iter()
                .map(|e| RefusedFlow {
                    at_ms: e.at_ms,
                    protocol: e.protocol,
                    destination: e.destination,
                    name: e.name,
                    reason: e.reason,
                })
                .collect(),
            refused_total: r.refused_total,
            allowed_total: r.allowed_total,
        }))
    }
}

/// Chunks of a CopyOut tar stream.
pub struct CopyOutReader {
    rx: Streaming<pb::CopyOutResponse>,
}

impl CopyOutReader {
    /// Next chunk; `None` at the end.
    pub async fn next(&mut self) -> Result<Option<Vec<u8>>, HelperError> {
        Ok(self.rx.message().await?.map(|m| m.data))
    }

    /// Forward every chunk to `tx` (closing it at the end, or early if the
    /// receiver stops reading); returns the bytes received.
    pub async fn pump(mut self, tx: mpsc::Sender<Vec<u8>>) -> Result<u64, HelperError> {
        let mut received = 0u64;
        while let Some(chunk) = self.next().await? {
            received += chunk.len() as u64;
            if tx.send(chunk).await.is_err() {
                break;
            }
        }
        Ok(received)
    }
}
