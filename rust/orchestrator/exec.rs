//! Running one process to completion: feeding stdin, capturing each output
//! stream up to [`MAX_OUTPUT`] bytes while still draining the rest, and
//! enforcing a wall-clock timeout that kills the whole process group and
//! keeps the output produced so far.
use std::time::{Duration, Instant};

use super::helper_client::{ExitStatus, HelperClient, HelperError, ProcessConfig, ProcessEvent};

/// Bytes kept per stream; the rest is counted and reported, not kept.
pub const MAX_OUTPUT: usize = 50_000;

/// Stdin is sent in chunks of this size so a large input never becomes one
/// huge gRPC message.
const STDIN_CHUNK: usize = 64 * 1024;

/// After the timeout's SIGKILL, how long to wait for the exit report.
const KILL_GRACE: Duration = Duration::from_secs(2);

/// One output stream: its first bytes and its total length.
#[derive(Debug, Default, Clone)]
pub struct Captured {
    /// The first [`MAX_OUTPUT`] bytes.
    pub bytes: Vec<u8>,
    /// Everything the process wrote, in bytes.
    pub total: u64,
}

impl Captured {
    fn push(&mut self, data: &[u8]) {
        self.total += data.len() as u64;
        let room = MAX_OUTPUT.saturating_sub(self.bytes.len());
        self.bytes.extend_from_slice(&data[..data.len().min(room)]);
    }

    /// Whether bytes were dropped.
    pub fn truncated(&self) -> bool {
        self.total > self.bytes.len() as u64
    }
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The process exited or was killed by a signal on its own.
    Exited(ExitStatus),
    /// The timeout fired and the process group was killed.
    TimedOut,
}

/// Result of [`run`].
#[derive(Debug, Clone)]
pub struct ExecResult {
    /// Captured stdout.
    pub stdout: Captured,
    /// Captured stderr.
    pub stderr: Captured,
    /// How it ended.
    pub outcome: Outcome,
    /// Wall-clock time from request to exit.
    pub duration: Duration,
    /// Why the command's history entry was not saved, if it was not (the
    /// command ran; a restart will not show it in `history`).
    pub history_unsaved: Option<String>,
}

impl ExecResult {
    /// Exit code in the reference's convention: the code, 128+signal when
    /// killed by a signal (as a shell reports it), -1 on timeout.
    pub fn exit_code(&self) -> i32 {
        match self.outcome {
            Outcome::Exited(ExitStatus::Code(c)) => c,
            Outcome::Exited(ExitStatus::Signal(s)) => 128 + s,
            Outcome::TimedOut => -1,
        }
    }
}

/// Run `process` in VM `vm_id`, give it `stdin` then EOF, and wait at most
/// `timeout` for it to exit.
pub async fn run(
    helper: &HelperClient,
    vm_id: &str,
    process: ProcessConfig,
    stdin: &[u8],
    timeout: Duration,
) -> Result<ExecResult, HelperError> {
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + timeout;
    let inline = stdin.len() <= STDIN_CHUNK;
    let (input, mut events) = helper.spawn(vm_id, process, inline.then_some(stdin)).await.map_err(|e| match e {
        // The VM stopped under us (its agent or init died, e.g. killed from
        // inside): say how to get going again rather than retrying silently.
        HelperError::FailedPrecondition(m) => HelperError::FailedPrecondition(format!(
            "{m}; reset(sandbox='{}') starts a fresh sandbox (its /workspace is kept)",
            super::names::display(vm_id)
        )),
        other => other,
    })?;
    // Larger stdin is fed concurrently with reading output: a process that
    // writes a lot before reading its input would otherwise deadlock against us.
    // Aborted on drop, so every way out of this function stops feeding.
    let _feeder = (!inline).then(|| {
        let input = input.clone();
        let stdin = stdin.to_vec();
        tokio_util::task::AbortOnDropHandle::new(tokio::spawn(async move {
            for chunk in stdin.chunks(STDIN_CHUNK) {
                input.write_stdin(chunk.to_vec()).await?;
            }
            input.close_stdin().await
        }))
    });
    let (mut stdout, mut stderr) = (Captured::default(), Captured::default());
    let mut status = None;
    let mut timed_out = false;
    loop {
        match tokio::time::timeout_at(deadline, events.next()).await {
            Ok(Ok(Some(ProcessEvent::Stdout(b)))) => stdout.push(&b),
            Ok(Ok(Some(ProcessEvent::Stderr(b)))) => stderr.push(&b),
            Ok(Ok(Some(ProcessEvent::Started(_)))) => {}
            Ok(Ok(Some(ProcessEvent::Exited(s)))) => {
                status = Some(s);
                break;
            }
            Ok(Ok(None)) => {
                return Err(HelperError::Other("the helper ended the exec stream without an exit status".into()));
            }
            Ok(Err(e)) => {
                return Err(e);
            }
            Err(_) => {
                timed_out = true;
                break;
            }
        }
    }
    if timed_out {
        input.signal_group(libc::SIGKILL).await.ok();
        // Collect what was still in flight so the caller sees all output up
        // to the kill, then give up waiting.
        let drain = async {
            while let Ok(Some(ev)) = events.next().await {
                match ev {
                    ProcessEvent::Stdout(b) => stdout.push(&b),
                    ProcessEvent::Stderr(b) => stderr.push(&b),
                    ProcessEvent::Exited(_) => break,
                    ProcessEvent::Started(_) => {}
                }
            }
        };
        let _ = tokio::time::timeout(KILL_GRACE, drain).await;
    }
    let outcome = match (timed_out, status) {
        (false, Some(s)) => Outcome::Exited(s),
        _ => Outcome::TimedOut,
    };
    Ok(ExecResult { stdout, stderr, outcome, duration: started.elapsed(), history_unsaved: None })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capture_keeps_prefix_and_counts_all() {
        let mut c = Captured::default();
        c.push(&vec![b'a'; MAX_OUTPUT - 10]);
        c.push(&[b'b'; 100]);
        assert_eq!(c.bytes.len(), MAX_OUTPUT);
        assert_eq!(c.total, MAX_OUTPUT as u64 + 90);
        assert!(c.truncated());
        assert_eq!(&c.bytes[MAX_OUTPUT - 10..], &[b'b'; 10]);
    }

    #[test]
    fn exit_code_conventions() {
        let r = |outcome| ExecResult {
            stdout: Captured::default(),
            stderr: Captured::default(),
            outcome,
            duration: Duration::ZERO,
            history_unsaved: None,
        };
        assert_eq!(r(Outcome::Exited(ExitStatus::Code(3))).exit_code(), 3);
        assert_eq!(r(Outcome::Exited(ExitStatus::Signal(9))).exit_code(), 137);
        assert_eq!(r(Outcome::TimedOut).exit_code(), -1);
    }
}
