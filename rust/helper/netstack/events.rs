//! What a VM's policy decided: the most recent refusals (a bounded ring,
//! served by the NetworkEvents RPC) and counters since the VM started.
use std::sync::Mutex;

/// How many refusals are kept per VM.
pub const RING: usize = 256;

/// One refused flow or query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Unix time in milliseconds.
    pub at_ms: i64,
    /// "tcp", "udp" or "dns".
    pub protocol: &'static str,
    /// "ip:port" as the VM addressed it, or the queried name.
    pub destination: String,
    /// The name the flow was tied to (DNS pin, SNI, Host), if any.
    pub name: String,
    /// Why.
    pub reason: String,
}

/// A snapshot for the RPC.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Oldest first.
    pub refused: Vec<Refusal>,
    /// Refusals since the VM started.
    pub refused_total: u64,
    /// Allowed flows and queries since the VM started.
    pub allowed_total: u64,
}

/// The ring and counters of one VM; shared between its stack and the service.
#[derive(Debug, Default)]
pub struct Events {
    inner: Mutex<Snapshot>,
}

impl Events {
    /// Records a refusal (and logs it).
    pub fn refused(&self, protocol: &'static str, destination: String, name: Option<&str>, reason: String) {
        tracing::info!(protocol, %destination, name, %reason, "egress refused");
        let at_ms = sandbox_base::clock::unix_ms();
        let mut s = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        // A Vec ring: removing the oldest of 256 rare entries is cheap, and
        // the snapshot stays a plain clone.
        if s.refused.len() == RING {
            s.refused.remove(0);
        }
        s.refused.push(Refusal { at_ms, protocol, destination, name: name.unwrap_or_default().to_string(), reason });
        s.refused_total += 1;
    }

    /// Counts an allowed flow or query.
    pub fn allowed(&self) {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).allowed_total += 1;
    }

    /// What has been recorded so far.
    pub fn snapshot(&self) -> Snapshot {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_keeps_the_latest_and_counts_all() {
        let e = Events::default();
        for i in 0..(RING + 10) {
            e.refused("tcp", format!("10.0.0.1:{i}"), None, "r".into());
        }
        e.allowed();
        let s = e.snapshot();
        assert_eq!(s.refused.len(), RING);
        assert_eq!(s.refused[0].destination, "10.0.0.1:10");
        assert_eq!(s.refused_total, (RING + 10) as u64);
        assert_eq!(s.allowed_total, 1);
    }
}
