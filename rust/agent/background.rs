//! Background processes: owned by the agent, not by any connection, so they
//! outlive the helper's clients. Each keeps its combined output in a bounded
//! ring; records of exited processes stay listable until replaced, stopped
//! or pushed out by the record cap.
use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::AsyncReadExt as _;
use tokio::sync::watch;

use super::AgentError;
use super::process::{SpawnedBackground, spawn_background};
use super::protocol::{BackgroundRecord, BackgroundReply, ExitStatus, StartSpec};
use super::tree;

/// Output kept per process; older bytes are dropped (and counted).
pub const RING_BYTES: usize = 1 << 20;
/// Records kept per VM; beyond it the oldest exited one goes.
pub const MAX_RECORDS: usize = 64;
/// After the KILL, how long a stop waits for the last output to arrive.
const FINAL_DRAIN: Duration = Duration::from_millis(200);
/// How often the tree is rescanned while a stop waits out its grace.
const RESCAN: Duration = Duration::from_millis(50);
/// Bound on waiting for a killed group's leader to be reaped.
const REAP_TIMEOUT: Duration = Duration::from_secs(5);

const CHUNK: usize = 64 * 1024;

/// Every background process of this VM, in start order.
#[derive(Default)]
pub struct Registry {
    records: Mutex<Vec<Arc<Record>>>,
}

struct Record {
    name: String,
    pid: i32,
    argv: Vec<String>,
    started_at_ms: i64,
    output: Mutex<Ring>,
    /// `Some` once the process exited.
    exit: watch::Receiver<Option<ExitStatus>>,
    /// `true` once the output pipe reached EOF.
    drained: watch::Receiver<bool>,
}

/// The last [`RING_BYTES`] of output and how much was dropped before them.
#[derive(Default)]
struct Ring {
    bytes: VecDeque<u8>,
    dropped: u64,
}

impl Ring {
    fn push(&mut self, chunk: &[u8]) {
        let keep = &chunk[chunk.len().saturating_sub(RING_BYTES)..];
        self.dropped += (chunk.len() - keep.len()) as u64;
        let overflow = (self.bytes.len() + keep.len()).saturating_sub(RING_BYTES);
        self.bytes.drain(..overflow);
        self.dropped += overflow as u64;
        self.bytes.extend(keep);
    }

    /// The last `lines` lines (0 = everything kept). A trailing newline
    /// ends the last line rather than starting an empty one.
    fn tail(&self, lines: u32) -> Vec<u8> {
        let all: Vec<u8> = self.bytes.iter().copied().collect();
        if lines == 0 {
            return all;
        }
        let body = all.strip_suffix(b"\n").unwrap_or(&all);
        let start = body
            .iter()
            .enumerate()
            .rev()
            .filter(|&(_, &b)| b == b'\n')
            .nth(lines as usize - 1)
            .map_or(0, |(i, _)| i + 1);
        all[start..].to_vec()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Record {
    fn snapshot(&self) -> BackgroundRecord {
        BackgroundRecord {
            name: self.name.clone(),
            pid: self.pid,
            argv: self.argv.clone(),
            started_at_ms: self.started_at_ms,
            exit: *self.exit.borrow(),
        }
    }

    fn running(&self) -> bool {
        self.exit.borrow().is_none()
    }
}

impl Registry {
    fn records(&self) -> MutexGuard<'_, Vec<Arc<Record>>> {
        lock(&self.records)
    }

    fn find(&self, name: &str) -> Result<Arc<Record>, AgentError> {
        self.records()
            .iter()
            .find(|r| r.name == name)
            .cloned()
            .ok_or_else(|| AgentError::NotFound(format!("no background process named {name:?}")))
    }

    /// Starts `spec` as `name`, replacing an exited record of that name.
    pub fn start(&self, name: String, spec: &StartSpec) -> Result<BackgroundRecord, AgentError> {
        super::protocol::check_name(&name)?;
        let mut records = self.records();
        if records.iter().any(|r| r.name == name && r.running()) {
            return Err(AgentError::AlreadyExists(format!("background process {name:?} is already running")));
        }
        records.retain(|r| r.name != name);
        if records.len() >= MAX_RECORDS {
            let oldest_exited = records.iter().position(|r| !r.running()).ok_or_else(|| {
                AgentError::Exhausted(format!("{MAX_RECORDS} background processes are running already"))
            })?;
            records.remove(oldest_exited);
        }
        let SpawnedBackground { child, pid, output } = spawn_background(spec)?;
        let (exit_tx, exit) = watch::channel(None);
        let (drained_tx, drained) = watch::channel(false);
        let record = Arc::new(Record {
            name,
            pid,
            argv: spec.argv.clone(),
            started_at_ms: sandbox_base::clock::unix_ms(),
            output: Mutex::new(Ring::default()),
            exit,
            drained,
        });
        tokio::spawn(async move {
            let mut child = child;
            let status = match child.wait().await {
                Ok(st) => super::session::exit_status(st),
                Err(_) => ExitStatus::Code(-1),
            };
            let _ = exit_tx.send(Some(status));
        });
        let weak = Arc::downgrade(&record);
        tokio::spawn(async move {
            collect_output(output, weak).await;
            let _ = drained_tx.send(true);
        });
        records.push(record.clone());
        Ok(record.snapshot())
    }

    /// Every record, oldest first.
    pub fn list(&self) -> BackgroundReply {
        BackgroundReply { processes: self.records().iter().map(|r| r.snapshot()).collect(), dropped_bytes: 0 }
    }

    /// One record with the tail of its output.
    pub fn log(&self, name: &str, tail_lines: u32) -> Result<(BackgroundReply, Vec<u8>), AgentError> {
        let record = self.find(name)?;
        let ring = lock(&record.output);
        let reply = BackgroundReply { processes: vec![record.snapshot()], dropped_bytes: ring.dropped };
        Ok((reply, ring.tail(tail_lines)))
    }

    /// TERM the whole tree, KILL it after `grace`, then drop the record and
    /// return its final state with the tail of its output.
    pub async fn stop(
        &self,
        name: &str,
        grace: Duration,
        tail_lines: u32,
    ) -> Result<(BackgroundReply, Vec<u8>), AgentError> {
        let record = self.find(name)?;
        let group = Pid::from_raw(record.pid);
        let mut exit = record.exit.clone();
        // `running()` means "not reaped yet" (the reaper task records the
        // exit right after the wait, with no await between), so while it
        // holds the pid is still the process's and its tree can be walked.
        // The tree's members are remembered as they are seen: if the leader
        // dies of the TERM first, those that ignore it reparent away and
        // are found again by identity for the KILL.
        let mut seen = tree::Seen::default();
        if record.running() {
            seen.record(record.pid);
            tree::signal(record.pid, Signal::SIGTERM);
            let deadline = tokio::time::Instant::now() + grace;
            while record.running() && tokio::time::Instant::now() < deadline {
                let _ = tokio::time::timeout_at(
                    deadline.min(tokio::time::Instant::now() + RESCAN),
                    exit.wait_for(Option::is_some),
                )
                .await;
                if record.running() {
                    seen.record(record.pid);
                }
            }
        }
        let mut victims = tree::Victims::default();
        if record.running() {
            victims = tree::kill(record.pid);
        }
        seen.kill(&mut victims);
        // Also when the leader is gone, as long as something still holds its
        // output pipe: children it left in the group (a shell's `sleep &`)
        // belong to the process being stopped. Once the pipe is closed the
        // group is presumed empty, and its id may belong to someone else.
        if !*record.drained.borrow() {
            let _ = killpg(group, Signal::SIGKILL);
        }
        let _ = tokio::time::timeout(REAP_TIMEOUT, exit.wait_for(Option::is_some)).await;
        tree::wait_gone(&victims, REAP_TIMEOUT).await;
        let mut drained = record.drained.clone();
        let _ = tokio::time::timeout(FINAL_DRAIN, drained.wait_for(|d| *d)).await;
        self.records().retain(|r| !Arc::ptr_eq(r, &record));
        let ring = lock(&record.output);
        let reply = BackgroundReply { processes: vec![record.snapshot()], dropped_bytes: ring.dropped };
        Ok((reply, ring.tail(tail_lines)))
    }
}

/// Moves output into the record's ring until EOF; stops early once the
/// record is gone, which closes the pipe (writers then get EPIPE).
async fn collect_output(output: OwnedFd, record: std::sync::Weak<Record>) {
    let Ok(mut pipe) = tokio::net::unix::pipe::Receiver::from_owned_fd(output) else {
        return;
    };
    let mut buf = vec![0u8; CHUNK];
    loop {
        match pipe.read(&mut buf).await {
            Ok(n) if n > 0 => match record.upgrade() {
                Some(r) => lock(&r.output).push(&buf[..n]),
                None => return,
            },
            _ => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_the_last_mebibyte_and_counts_the_rest() {
        let mut r = Ring::default();
        r.push(&vec![b'a'; RING_BYTES - 10]);
        r.push(&[b'b'; 20]);
        assert_eq!((r.bytes.len(), r.dropped), (RING_BYTES, 10));
        r.push(&vec![b'c'; RING_BYTES + 5]);
        assert_eq!((r.bytes.len(), r.dropped), (RING_BYTES, 10 + RING_BYTES as u64 + 5));
        assert!(r.bytes.iter().all(|&b| b == b'c'));
    }

    #[test]
    fn tail_counts_lines_from_the_end() {
        let mut r = Ring::default();
        r.push(b"one\ntwo\nthree\n");
        assert_eq!(r.tail(0), b"one\ntwo\nthree\n");
        assert_eq!(r.tail(1), b"three\n");
        assert_eq!(r.tail(2), b"two\nthree\n");
        assert_eq!(r.tail(9), b"one\ntwo\nthree\n");
        r.push(b"partial");
        assert_eq!(r.tail(1), b"partial");
    }
}
