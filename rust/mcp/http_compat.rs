//! Where rmcp's Streamable HTTP service answers clients in ways they trip
//! over and offers no setting to change it, this layer in front of it
//! adjusts the answer:
//! - A session `DELETE` gets 200, not rmcp's 202: the official Python client
//!   logs "Session termination failed: 202" at every close otherwise.
//! - SSE priming events (an `id` and `retry` with empty data, SEP-1699) go
//!   only to clients that negotiated protocol 2025-11-25 or later, which
//!   know them. Older clients read the empty data as a message, fail to
//!   parse it and log a traceback per stream (Python `mcp` 1.x).
//! - A client that drops the connection of a request still running cancels
//!   that request, as a `notifications/cancelled` would: rmcp keeps the
//!   handler running with no one to answer, so an `exec` went on until its
//!   timeout. A client may instead resume the stream (`Last-Event-ID`) after
//!   a dropped connection, so the cancellation waits [`RESUME_GRACE`] and is
//!   not sent when the session resumed a stream meanwhile.
//! - A request's stream that ended without an answer (the request was
//!   cancelled) has nothing more to give: resuming it (`Last-Event-ID`) gets
//!   204 No Content, which tells an SSE client to stop reconnecting. rmcp
//!   replays such a stream and closes it again, and the TypeScript SDK
//!   reconnects after every close, so it re-fetched every 3 s until rmcp
//!   forgot the stream a minute later.
use axum::{
    body::{Body, Bytes},
    extract::{Request, State},
    http::{HeaderMap, HeaderValue, Method, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};
use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use rmcp::transport::streamable_http_server::{StreamableHttpService, session::local::LocalSessionManager};
use tokio_stream::StreamExt;

use super::SandboxServer;

/// The first protocol version whose clients expect priming events.
const PRIMING_SINCE: &str = "2025-11-25";

/// How long a dropped request waits for its session to resume a stream
/// before it is cancelled: a few of the 3 s reconnection delays rmcp asks
/// clients for.
pub const RESUME_GRACE: Duration = Duration::from_secs(10);

/// Ended streams remembered per session: the newest ones, which are those
/// a client still tries to resume.
const ENDED_PER_SESSION: usize = 64;

/// The MCP service behind this layer, which cancellations are sent to.
pub type McpService = StreamableHttpService<SandboxServer, LocalSessionManager>;

/// What the layer keeps: the service, when each session last resumed a
/// stream, and each session's request streams that ended without an answer
/// (by the request part of their event ids).
#[derive(Clone)]
pub struct Compat {
    service: McpService,
    resumed: Arc<Mutex<HashMap<String, Instant>>>,
    ended: Arc<Mutex<HashMap<String, VecDeque<String>>>>,
}

impl Compat {
    /// The layer's state over `service`.
    pub fn new(service: McpService) -> Self {
        Self { service, resumed: Arc::default(), ended: Arc::default() }
    }

    fn ended(&self) -> std::sync::MutexGuard<'_, HashMap<String, VecDeque<String>>> {
        self.ended.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn has_ended(&self, session: &str, stream: &str) -> bool {
        self.ended().get(session).is_some_and(|streams| streams.iter().any(|s| s == stream))
    }

    fn mark_ended(&self, session: &str, stream: String) {
        let mut ended = self.ended();
        let streams = ended.entry(session.to_string()).or_default();
        if !streams.contains(&stream) {
            if streams.len() >= ENDED_PER_SESSION {
                streams.pop_front();
            }
            streams.push_back(stream);
        }
    }

    /// The largest request body rmcp takes, and so the most read here.
    fn body_limit(&self) -> usize {
        self.service.config.max_request_body_bytes
    }

    fn resumed(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        self.resumed.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The layer: see the module documentation.
pub async fn adjust(State(compat): State<Compat>, request: Request<Body>, next: Next) -> Response {
    let delete = request.method() == Method::DELETE;
    // rmcp replays a resumed stream from the event the client already has
    // (`Last-Event-ID`) on, not after it.
    let replayed = (request.method() == Method::GET)
        .then(|| request.headers().get("last-event-id")?.to_str().ok().map(str::to_string))
        .flatten();
    let session = request.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()).map(str::to_string);
    if let Some(session) = &session {
        if delete {
            compat.resumed().remove(session);
            compat.ended().remove(session);
        } else if let Some(id) = &replayed {
            if stream_of(id.as_bytes()).is_some_and(|s| compat.has_ended(session, s)) {
                return StatusCode::NO_CONTENT.into_response();
            }
            compat.resumed().insert(session.clone(), Instant::now());
        }
    }
    let (request, wants_priming) = match knows_priming(request, compat.body_limit()).await {
        Ok(checked) => checked,
        Err(response) => return response,
    };
    let (request, cancel) = match cancellation_for(request, compat.body_limit()).await {
        Ok(found) => found,
        Err(response) => return response,
    };
    let mut response = next.run(request).await;
    if delete && response.status() == StatusCode::ACCEPTED {
        *response.status_mut() = StatusCode::OK;
    }
    if is_event_stream(response.headers()) && (!wants_priming || cancel.is_some() || replayed.is_some()) {
        let filter = EventFilter::new(!wants_priming, replayed);
        let watch = session.map(|session| Watch { compat, session, cancel });
        response = response.map(|body| relay(body, filter, watch));
    }
    response
}

/// For a request within a session, the `notifications/cancelled` that
/// stands for its client going away (rebuilt with the headers rmcp checks).
async fn cancellation_for(
    request: Request<Body>,
    limit: usize,
) -> Result<(Request<Body>, Option<Request<Body>>), Response> {
    if request.method() != Method::POST || !request.headers().contains_key("mcp-session-id") {
        return Ok((request, None));
    }
    let (parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, limit).await.map_err(|_| too_large(limit))?;
    let id = super::stdio::leading_id(&bytes);
    let request = Request::from_parts(parts, Body::from(bytes));
    let Some(id) = id else {
        return Ok((request, None));
    };
    let notice = serde_json::json!({
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": {"requestId": id, "reason": "the client disconnected"},
    });
    let mut cancel = Request::builder().method(Method::POST).uri(request.uri().clone());
    for name in [header::HOST, header::CONTENT_TYPE, header::ACCEPT] {
        if let Some(value) = request.headers().get(&name) {
            cancel = cancel.header(name, value);
        }
    }
    for name in ["mcp-session-id", "mcp-protocol-version"] {
        if let Some(value) = request.headers().get(name) {
            cancel = cancel.header(name, value);
        }
    }
    Ok((request, cancel.body(Body::from(notice.to_string())).ok()))
}

/// What rmcp answers a body over its limit, which a body read here must
/// not get past either.
fn too_large(limit: usize) -> Response {
    (StatusCode::PAYLOAD_TOO_LARGE, format!("Payload Too Large: the limit is {limit} bytes\n")).into_response()
}

/// Whether the client behind `request` negotiated a protocol that knows
/// priming events: the `MCP-Protocol-Version` header on a session's
/// requests (clients older than 2025-06-18 send none), the version asked for
/// in an `initialize` (the server takes it, or its own newer latest one).
async fn knows_priming(request: Request<Body>, limit: usize) -> Result<(Request<Body>, bool), Response> {
    if request.method() != Method::POST || request.headers().contains_key("mcp-session-id") {
        let version = request.headers().get("mcp-protocol-version").and_then(|v| v.to_str().ok());
        let knows = version.is_some_and(|v| v >= PRIMING_SINCE);
        return Ok((request, knows));
    }
    let (parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, limit).await.map_err(|_| too_large(limit))?;
    let asked = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|v| v.pointer("/params/protocolVersion")?.as_str().map(str::to_string));
    let knows = asked.is_none_or(|v| v.as_str() >= PRIMING_SINCE);
    Ok((Request::from_parts(parts, Body::from(bytes)), knows))
}

fn is_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v: &HeaderValue| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

/// A session's stream as it is relayed: how it ended matters.
struct Watch {
    compat: Compat,
    session: String,
    /// The cancellation of its request (a POST's stream), for when its
    /// client goes away.
    cancel: Option<Request<Body>>,
}

impl Watch {
    /// The client went away: sends the cancellation after [`RESUME_GRACE`],
    /// unless the session resumed a stream meanwhile.
    async fn client_gone(self, dropped: Instant) {
        let Some(request) = self.cancel else { return };
        tokio::time::sleep(RESUME_GRACE).await;
        if self.compat.resumed().get(&self.session).is_some_and(|at| *at >= dropped) {
            return;
        }
        let answer = self.compat.service.handle(request).await;
        tracing::debug!(status = %answer.status(), "cancelled a request whose client disconnected");
    }

    /// The stream ended: with no answer on it, a resume gets nothing more.
    fn stream_ended(&self, filter: &EventFilter) {
        if let (false, Some(stream)) = (filter.answered, &filter.stream) {
            self.compat.mark_ended(&self.session, stream.clone());
        }
    }
}

/// The SSE body relayed as it comes, through `filter`; `watch` learns how a
/// session's stream ended.
fn relay(body: Body, mut filter: EventFilter, watch: Option<Watch>) -> Body {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, axum::Error>>(16);
    tokio::spawn(async move {
        let mut chunks = body.into_data_stream();
        loop {
            let chunk = tokio::select! {
                chunk = chunks.next() => chunk,
                () = tx.closed() => break,
            };
            let Some(chunk) = chunk else {
                if let Some(watch) = &watch {
                    watch.stream_ended(&filter);
                }
                return;
            };
            let out = chunk.map(|bytes| Bytes::from(filter.push(&bytes)));
            if matches!(&out, Ok(kept) if kept.is_empty()) {
                continue;
            }
            if tx.send(out).await.is_err() {
                break;
            }
        }
        // The client went away with the stream still open.
        drop(chunks);
        if let Some(watch) = watch {
            watch.client_gone(Instant::now()).await;
        }
    });
    Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
}

/// Splits SSE text into events and drops priming events (when asked to)
/// and the event a resumed stream repeats; notes which request's stream it
/// is and whether an answer went by.
#[derive(Default)]
pub struct EventFilter {
    pending: Vec<u8>,
    drop_priming: bool,
    replayed: Option<String>,
    /// The request part of the stream's event ids.
    stream: Option<String>,
    /// Whether a JSON-RPC response went by.
    answered: bool,
}

impl EventFilter {
    /// A filter dropping priming events if `drop_priming`, and the event
    /// whose id is `replayed`.
    pub fn new(drop_priming: bool, replayed: Option<String>) -> Self {
        let stream = replayed.as_deref().and_then(|id| stream_of(id.as_bytes())).map(str::to_string);
        Self { pending: Vec::new(), drop_priming, replayed, stream, answered: false }
    }

    /// Takes the next bytes of the stream; returns the complete events kept.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<u8> {
        self.pending.extend_from_slice(bytes);
        let mut kept = Vec::new();
        while let Some(end) = self.pending.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = self.pending.drain(..end + 2).collect();
            if let Some(stream) = event_id(&event).and_then(stream_of) {
                self.stream = Some(stream.to_string());
            }
            self.answered |= is_response(&event);
            let repeated = self.replayed.as_deref().is_some_and(|id| event_id(&event) == Some(id.as_bytes()));
            let dropped = repeated || (self.drop_priming && is_priming(&event));
            if !dropped {
                kept.extend_from_slice(&event);
            }
        }
        kept
    }
}

/// The value of an event's `id` field.
fn event_id(event: &[u8]) -> Option<&[u8]> {
    event.split(|b| *b == b'\n').find_map(|line| line.strip_prefix(b"id:")).map(<[u8]>::trim_ascii)
}

/// The request part of an rmcp event id (`<index>/<request>`); the
/// session's standalone stream has none.
fn stream_of(id: &[u8]) -> Option<&str> {
    let (_, stream) = std::str::from_utf8(id).ok()?.split_once('/')?;
    Some(stream)
}

/// Whether an event carries a JSON-RPC response (a result or an error).
fn is_response(event: &[u8]) -> bool {
    let data: Vec<&[u8]> =
        event.split(|b| *b == b'\n').filter_map(|line| line.strip_prefix(b"data:")).map(<[u8]>::trim_ascii).collect();
    let Ok(message) = serde_json::from_slice::<serde_json::Value>(&data.join(&b'\n')) else { return false };
    message.get("id").is_some() && (message.get("result").is_some() || message.get("error").is_some())
}

/// An event with no data and no name: only `id`/`retry` fields.
fn is_priming(event: &[u8]) -> bool {
    let mut fields = event.split(|b| *b == b'\n').filter(|l| !l.is_empty()).peekable();
    fields.peek().is_some()
        && fields.all(|line| {
            line.starts_with(b"id:")
                || line.starts_with(b"retry:")
                || line.strip_prefix(b"data:").is_some_and(|d| d.trim_ascii().is_empty())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priming_events_go_and_the_rest_stays_whole() {
        let mut f = EventFilter::new(true, None);
        assert_eq!(f.push(b"id: 0\nretry: 3000\ndata:\n\n"), b"");
        assert_eq!(f.push(b"retry: 3000\n\n:\n\nid: 1\nda"), b":\n\n");
        assert_eq!(f.push(b"ta: {\"a\":1}\n\n"), b"id: 1\ndata: {\"a\":1}\n\n");
        assert_eq!(f.push(b"event: x\ndata:\n\n"), b"event: x\ndata:\n\n");
    }

    #[test]
    fn notes_the_stream_and_whether_it_was_answered() {
        let mut f = EventFilter::new(false, None);
        f.push(b"id: 0/3\nretry: 3000\ndata:\n\n");
        f.push(b"id: 1/3\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\n\n");
        assert_eq!((f.stream.as_deref(), f.answered), (Some("3"), false));
        f.push(b"id: 2/3\ndata: {\"jsonrpc\":\"2.0\",\"id\":5,\"result\":{}}\n\n");
        assert!(f.answered);
        let resumed = EventFilter::new(false, Some("4/7".into()));
        assert_eq!(resumed.stream.as_deref(), Some("7"));
        assert_eq!(EventFilter::new(false, Some("4".into())).stream, None);
    }

    #[test]
    fn a_resumed_stream_does_not_repeat_the_last_event_seen() {
        let mut f = EventFilter::new(false, Some("1/0".into()));
        assert_eq!(f.push(b"data: a\nid: 1/0\n\ndata: b\nid: 2/0\n\n"), b"data: b\nid: 2/0\n\n");
        assert_eq!(f.push(b"data: \nid: 0/0\nretry: 3000\n\n"), b"data: \nid: 0/0\nretry: 3000\n\n");
    }
}
