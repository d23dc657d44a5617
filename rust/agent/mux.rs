//! Many concurrent streams over one agent connection (a Unix socket, a
//! virtio-serial port, a vsock): the stream table, the reader and writer
//! tasks, and flow control. Both ends use it: the helper opens streams
//! ([`Mux::open`]), the agent accepts them ([`Mux::serve`]).
//!
//! Flow control, per stream and direction: the sender may have at most
//! [`WINDOW`] bytes of data frames (`Stdin`, `Stdout`, `Stderr`, `Data`)
//! that the receiving *consumer* has not yet taken; the receiver returns
//! credit (`Credit`) as its consumer takes them. So the reader task never
//! waits on a slow consumer (it only queues, within the window), one busy
//! stream (a big copy-out) cannot stall the others or grow memory, and a
//! peer that overruns its window or floods a stream with control frames is
//! a broken peer: the connection is dropped, failing every stream.
//!
//! A stream ends for its holder when both of its halves are dropped: the
//! peer gets `Cancel` (it kills what the stream ran). When the connection
//! dies, every open stream gets [`MuxError::Lost`] with the reason.
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _};
use tokio::sync::{Semaphore, mpsc};

use super::protocol::{Frame, FrameReader, MAX_DATA, ProtocolError, StreamId};

/// Data bytes a stream's sender may have outstanding (per direction).
pub const WINDOW: usize = 1 << 20;
/// Credit is returned once this much was consumed: fewer Credit frames,
/// still far from stalling a sender (4 batches per window).
const CREDIT_BATCH: usize = WINDOW / 4;
/// Control frames a consumer may leave untaken before its peer counts as
/// flooding it (a legitimate stream has a handful, or signals taken at once).
const MAX_QUEUED_CONTROL: usize = 1024;
/// Bytes the writer task gathers into one write when frames queue up.
const WRITE_BATCH: usize = 512 * 1024;

/// Why a stream operation failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum MuxError {
    /// The connection is gone; every stream on it failed.
    #[error("the agent connection was lost: {0}")]
    Lost(Arc<str>),
    /// The peer ended this stream (it hung up, or finished).
    #[error("the peer closed the stream")]
    Cancelled,
    /// A frame could not be encoded (a request too large for the protocol).
    #[error("{0}")]
    Encode(Arc<ProtocolError>),
}

enum Item {
    Frame(Frame),
    Cancelled,
    Lost(Arc<str>),
}

/// The reader's view of one open stream.
struct Entry {
    tx: mpsc::UnboundedSender<Item>,
    /// Data bytes received and not yet credited back.
    inflight: Arc<AtomicUsize>,
    /// Control frames queued and not yet taken.
    control: Arc<AtomicUsize>,
    /// Our send window: permits are bytes.
    credit: Arc<Semaphore>,
}

struct Shared {
    out: mpsc::UnboundedSender<Vec<u8>>,
    streams: Mutex<HashMap<StreamId, Entry>>,
    /// Set once the connection died, with why.
    dead: Mutex<Option<Arc<str>>>,
    /// New streams the peer opened (serving side only).
    incoming: Mutex<Option<mpsc::UnboundedSender<Stream>>>,
    next_id: AtomicU32,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    fn dead(&self) -> Option<Arc<str>> {
        lock(&self.dead).clone()
    }

    fn send(&self, id: StreamId, frame: &Frame) -> Result<(), MuxError> {
        let mut buf = Vec::new();
        frame.encode(id, &mut buf).map_err(|e| MuxError::Encode(Arc::new(e)))?;
        self.out.send(buf).map_err(|_| self.lost())
    }

    fn lost(&self) -> MuxError {
        MuxError::Lost(self.dead().unwrap_or_else(|| "the connection closed".into()))
    }

    /// Marks the connection dead and fails every open stream.
    fn fail(&self, reason: &str) {
        {
            let mut dead = lock(&self.dead);
            if dead.is_some() {
                return;
            }
            *dead = Some(reason.into());
        }
        let reason: Arc<str> = reason.into();
        let entries: Vec<Entry> = lock(&self.streams).drain().map(|(_, e)| e).collect();
        for e in entries {
            e.credit.close();
            let _ = e.tx.send(Item::Lost(reason.clone()));
        }
        lock(&self.incoming).take();
    }

    fn register(self: &Arc<Self>, id: StreamId) -> Stream {
        let (tx, rx) = mpsc::unbounded_channel();
        let entry =
            Entry { tx, inflight: Arc::default(), control: Arc::default(), credit: Arc::new(Semaphore::new(WINDOW)) };
        let guard = Arc::new(Guard { id, shared: self.clone() });
        let stream = Stream {
            id,
            tx: StreamSender { id, shared: self.clone(), credit: entry.credit.clone(), _guard: guard.clone() },
            rx: StreamReceiver {
                id,
                rx,
                inflight: entry.inflight.clone(),
                control: entry.control.clone(),
                unreturned: 0,
                lost: None,
                shared: self.clone(),
                _guard: guard,
            },
        };
        lock(&self.streams).insert(id, entry);
        stream
    }

    /// Routes one frame from the peer; `Err` means the peer is broken.
    fn route(self: &Arc<Self>, id: StreamId, frame: Frame) -> Result<(), String> {
        let mut streams = lock(&self.streams);
        match frame {
            Frame::Credit(n) => {
                if let Some(e) = streams.get(&id) {
                    e.credit.add_permits(n as usize);
                }
                return Ok(());
            }
            Frame::Cancel => {
                if let Some(e) = streams.remove(&id) {
                    e.credit.close();
                    let _ = e.tx.send(Item::Cancelled);
                }
                return Ok(());
            }
            _ => {}
        }
        if !streams.contains_key(&id) {
            // Late frames of a stream we dropped are expected; only the
            // serving side accepts new streams.
            if !frame.is_opening() {
                return Ok(());
            }
            let Some(incoming) = lock(&self.incoming).clone() else { return Ok(()) };
            drop(streams);
            let stream = self.register(id);
            let _ = incoming.send(stream);
            streams = lock(&self.streams);
        }
        let Some(e) = streams.get(&id) else { return Ok(()) };
        let len = frame.data_len();
        if len > 0 {
            if e.inflight.fetch_add(len, Ordering::SeqCst) + len > WINDOW {
                return Err(format!("the peer overran stream {id}'s flow-control window"));
            }
        } else if e.control.fetch_add(1, Ordering::SeqCst) >= MAX_QUEUED_CONTROL {
            return Err(format!("the peer flooded stream {id} with control frames"));
        }
        let _ = e.tx.send(Item::Frame(frame));
        Ok(())
    }
}

/// Removes the stream when both halves are gone, and tells the peer.
struct Guard {
    id: StreamId,
    shared: Arc<Shared>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        let open = lock(&self.shared.streams).remove(&self.id).is_some();
        if open {
            let _ = self.shared.send(self.id, &Frame::Cancel);
        }
    }
}

/// One connection. Cloning shares it; once every clone is dropped the
/// connection is closed and its streams fail.
#[derive(Clone)]
pub struct Mux {
    conn: Arc<Conn>,
}

impl std::fmt::Debug for Mux {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mux").field("dead", &self.dead()).field("open_streams", &self.open_streams()).finish()
    }
}

struct Conn {
    shared: Arc<Shared>,
    reader: tokio::task::JoinHandle<()>,
    writer: tokio::task::JoinHandle<()>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.reader.abort();
        self.writer.abort();
        self.shared.fail("the connection was closed by this end");
    }
}

/// Streams the peer opened, in order (serving side).
pub type Incoming = mpsc::UnboundedReceiver<Stream>;

impl Mux {
    /// Multiplexes `io` as the opening side (the helper).
    pub fn open_side<S>(io: S) -> Mux
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        Self::start(io, None)
    }

    /// Multiplexes `io` as the serving side (the agent): streams the peer
    /// opens arrive on the returned receiver, which ends with the connection.
    pub fn serve<S>(io: S) -> (Mux, Incoming)
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (tx, rx) = mpsc::unbounded_channel();
        (Self::start(io, Some(tx)), rx)
    }

    fn start<S>(io: S, incoming: Option<mpsc::UnboundedSender<Stream>>) -> Mux
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (rd, wr) = tokio::io::split(io);
        let (out, out_rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            out,
            streams: Mutex::default(),
            dead: Mutex::default(),
            incoming: Mutex::new(incoming),
            next_id: AtomicU32::new(1),
        });
        let reader = tokio::spawn(read_loop(FrameReader::new(rd), shared.clone()));
        let writer = tokio::spawn(write_loop(wr, out_rx, shared.clone()));
        Mux { conn: Arc::new(Conn { shared, reader, writer }) }
    }

    /// Opens a stream with its first frame.
    pub fn open(&self, first: Frame) -> Result<Stream, MuxError> {
        let shared = &self.conn.shared;
        if let Some(reason) = shared.dead() {
            return Err(MuxError::Lost(reason));
        }
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        let stream = shared.register(id);
        shared.send(id, &first)?;
        Ok(stream)
    }

    /// Why the connection died, once it has.
    pub fn dead(&self) -> Option<Arc<str>> {
        self.conn.shared.dead()
    }

    /// Streams now open (tests and diagnostics).
    pub fn open_streams(&self) -> usize {
        lock(&self.conn.shared.streams).len()
    }
}

async fn read_loop<R: AsyncRead + Unpin>(mut reader: FrameReader<R>, shared: Arc<Shared>) {
    let reason = loop {
        match reader.next().await {
            Ok(Some((id, frame))) => {
                if let Err(reason) = shared.route(id, frame) {
                    break reason;
                }
            }
            Ok(None) => break "the peer closed the connection".to_string(),
            Err(e) => break e.to_string(),
        }
    };
    shared.fail(&reason);
}

async fn write_loop<W: AsyncWrite + Unpin>(mut wr: W, mut out: mpsc::UnboundedReceiver<Vec<u8>>, shared: Arc<Shared>) {
    while let Some(mut buf) = out.recv().await {
        while buf.len() < WRITE_BATCH {
            match out.try_recv() {
                Ok(more) => buf.extend_from_slice(&more),
                Err(_) => break,
            }
        }
        if let Err(e) = async {
            wr.write_all(&buf).await?;
            wr.flush().await
        }
        .await
        {
            shared.fail(&format!("write: {e}"));
            return;
        }
    }
}

/// One stream: frames to the peer and from it.
pub struct Stream {
    /// Its id on the connection.
    pub id: StreamId,
    /// Sends frames to the peer.
    pub tx: StreamSender,
    /// Receives the peer's frames.
    pub rx: StreamReceiver,
}

impl Stream {
    /// Sends one frame (see [`StreamSender::send`]).
    pub async fn send(&self, frame: Frame) -> Result<(), MuxError> {
        self.tx.send(frame).await
    }

    /// The next frame (see [`StreamReceiver::next`]).
    pub async fn next(&mut self) -> Result<Option<Frame>, MuxError> {
        self.rx.next().await
    }
}

/// The sending half of a stream; clones share its window.
#[derive(Clone)]
pub struct StreamSender {
    id: StreamId,
    shared: Arc<Shared>,
    credit: Arc<Semaphore>,
    _guard: Arc<Guard>,
}

impl StreamSender {
    /// Sends `frame`, waiting for window when it carries data (larger data
    /// is split into frames of at most [`MAX_DATA`] bytes). Control frames
    /// never wait. Fails once the peer cancelled the stream or the
    /// connection is gone.
    pub async fn send(&self, frame: Frame) -> Result<(), MuxError> {
        if frame.data_len() == 0 {
            return self.shared.send(self.id, &frame);
        }
        let rebuild: fn(Vec<u8>) -> Frame = match &frame {
            Frame::Stdin(_) => Frame::Stdin,
            Frame::Stdout(_) => Frame::Stdout,
            Frame::Stderr(_) => Frame::Stderr,
            _ => Frame::Data,
        };
        let (Frame::Stdin(data) | Frame::Stdout(data) | Frame::Stderr(data) | Frame::Data(data)) = frame else {
            return self.shared.send(self.id, &frame);
        };
        if data.len() <= MAX_DATA {
            return self.send_data(rebuild(data)).await;
        }
        for piece in data.chunks(MAX_DATA) {
            self.send_data(rebuild(piece.to_vec())).await?;
        }
        Ok(())
    }

    async fn send_data(&self, frame: Frame) -> Result<(), MuxError> {
        let len = frame.data_len() as u32;
        match self.credit.acquire_many(len).await {
            Ok(permit) => permit.forget(),
            Err(_) => return Err(self.closed()),
        }
        self.shared.send(self.id, &frame)
    }

    fn closed(&self) -> MuxError {
        match self.shared.dead() {
            Some(reason) => MuxError::Lost(reason),
            None => MuxError::Cancelled,
        }
    }
}

/// The receiving half of a stream.
pub struct StreamReceiver {
    id: StreamId,
    rx: mpsc::UnboundedReceiver<Item>,
    inflight: Arc<AtomicUsize>,
    control: Arc<AtomicUsize>,
    /// Data bytes taken and not yet credited back.
    unreturned: usize,
    lost: Option<Arc<str>>,
    shared: Arc<Shared>,
    _guard: Arc<Guard>,
}

impl StreamReceiver {
    /// The peer's next frame; `None` once the peer cancelled the stream;
    /// [`MuxError::Lost`] once the connection died. Cancel-safe.
    pub async fn next(&mut self) -> Result<Option<Frame>, MuxError> {
        if let Some(reason) = &self.lost {
            return Err(MuxError::Lost(reason.clone()));
        }
        match self.rx.recv().await {
            Some(Item::Frame(frame)) => {
                let len = frame.data_len();
                if len == 0 {
                    self.control.fetch_sub(1, Ordering::SeqCst);
                } else {
                    self.unreturned += len;
                    if self.unreturned >= CREDIT_BATCH {
                        self.return_credit();
                    }
                }
                Ok(Some(frame))
            }
            Some(Item::Cancelled) => Ok(None),
            Some(Item::Lost(reason)) => {
                self.lost = Some(reason.clone());
                Err(MuxError::Lost(reason))
            }
            None => {
                let reason = self.shared.dead().unwrap_or_else(|| "the stream was closed".into());
                self.lost = Some(reason.clone());
                Err(MuxError::Lost(reason))
            }
        }
    }

    fn return_credit(&mut self) {
        let n = std::mem::take(&mut self.unreturned);
        self.inflight.fetch_sub(n, Ordering::SeqCst);
        let _ = self.shared.send(self.id, &Frame::Credit(n as u32));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (Mux, Mux, Incoming) {
        let (a, b) = tokio::io::duplex(64 * 1024);
        let helper = Mux::open_side(a);
        let (agent, incoming) = Mux::serve(b);
        (helper, agent, incoming)
    }

    #[tokio::test]
    async fn streams_are_independent_and_a_busy_one_stalls_nobody() {
        let (helper, _agent, mut incoming) = pair();
        // A stream whose consumer never reads: its sender fills the window
        // and waits, while another stream keeps working.
        let busy = helper.open(Frame::CopyOut("/big".into())).unwrap();
        let quiet = helper.open(Frame::Ping).unwrap();
        let mut busy_agent = incoming.recv().await.unwrap();
        let mut quiet_agent = incoming.recv().await.unwrap();
        assert_eq!(busy_agent.next().await.unwrap(), Some(Frame::CopyOut("/big".into())));
        assert_eq!(quiet_agent.next().await.unwrap(), Some(Frame::Ping));
        let filler = tokio::spawn(async move {
            for _ in 0..(2 * WINDOW / MAX_DATA) {
                busy_agent.send(Frame::Data(vec![7; MAX_DATA])).await.unwrap();
            }
            busy_agent
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!filler.is_finished(), "the sender must wait for window");
        quiet_agent.send(Frame::Pong).await.unwrap();
        let mut quiet = quiet;
        assert_eq!(quiet.next().await.unwrap(), Some(Frame::Pong));
        // Consuming the busy stream releases its sender.
        let mut busy = busy;
        let mut got = 0;
        while got < 2 * WINDOW {
            match busy.next().await.unwrap() {
                Some(Frame::Data(b)) => got += b.len(),
                other => panic!("{other:?}"),
            }
        }
        filler.await.unwrap();
    }

    #[tokio::test]
    async fn dropping_a_stream_cancels_it_at_the_peer() {
        let (helper, _agent, mut incoming) = pair();
        let s = helper.open(Frame::Stats).unwrap();
        let mut peer = incoming.recv().await.unwrap();
        assert_eq!(peer.next().await.unwrap(), Some(Frame::Stats));
        drop(s);
        assert_eq!(peer.next().await.unwrap(), None);
        assert!(matches!(peer.send(Frame::Data(vec![1])).await, Err(MuxError::Cancelled)));
    }

    #[tokio::test]
    async fn a_dead_connection_fails_every_stream() {
        let (helper, agent, mut incoming) = pair();
        let mut streams: Vec<Stream> = (0..5).map(|_| helper.open(Frame::Ping).unwrap()).collect();
        for _ in 0..5 {
            incoming.recv().await.unwrap();
        }
        drop(agent);
        for s in &mut streams {
            assert!(matches!(s.next().await, Err(MuxError::Lost(_))));
        }
        assert!(helper.dead().is_some());
        assert!(matches!(helper.open(Frame::Ping), Err(MuxError::Lost(_))));
    }

    #[tokio::test]
    async fn overrunning_the_window_drops_the_connection() {
        let (a, b) = tokio::io::duplex(4 << 20);
        let (_agent, mut incoming) = Mux::serve(b);
        let (rd, mut wr) = tokio::io::split(a);
        let mut bytes = Vec::new();
        Frame::CopyIn("/x".into()).encode(1, &mut bytes).unwrap();
        for _ in 0..=(WINDOW / MAX_DATA) {
            Frame::Data(vec![0; MAX_DATA]).encode(1, &mut bytes).unwrap();
        }
        wr.write_all(&bytes).await.unwrap();
        let mut s = incoming.recv().await.unwrap();
        let mut result = Ok(None);
        for _ in 0..=(WINDOW / MAX_DATA) + 1 {
            result = s.next().await;
            if result.is_err() {
                break;
            }
        }
        assert!(matches!(result, Err(MuxError::Lost(reason)) if reason.contains("window")));
        drop(rd);
    }
}
