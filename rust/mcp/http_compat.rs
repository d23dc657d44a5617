//! Where rmcp's Streamable HTTP service answers clients in ways they trip
//! over and offers no setting to change it, this layer in front of it
//! adjusts the answer:
//! - A session `DELETE` gets 200, not rmcp's 202: the official Python client
//!   logs "Session termination failed: 202" at every close otherwise.
//! - SSE priming events (an `id` and `retry` with empty data, SEP-1699) go
//!   only to clients that negotiated protocol 2025-11-25 or later, which
//!   know them. Older clients read the empty data as a message, fail to
//!   parse it and log a traceback per stream (Python `mcp` 1.x).
use axum::{
    body::{Body, Bytes},
    extract::Request,
    http::{HeaderMap, HeaderValue, Method, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};
use tokio_stream::StreamExt;

/// The first protocol version whose clients expect priming events.
const PRIMING_SINCE: &str = "2025-11-25";

/// Largest initialize request read here to learn its protocol version
/// (rmcp's own request body limit).
const MAX_INITIALIZE_BYTES: usize = 4 * 1024 * 1024;

/// The layer: see the module documentation.
pub async fn adjust(request: Request<Body>, next: Next) -> Response {
    let delete = request.method() == Method::DELETE;
    let (request, wants_priming) = match knows_priming(request).await {
        Ok(checked) => checked,
        Err(response) => return response,
    };
    let mut response = next.run(request).await;
    if delete && response.status() == StatusCode::ACCEPTED {
        *response.status_mut() = StatusCode::OK;
    }
    if !wants_priming && is_event_stream(response.headers()) {
        response = response.map(without_priming);
    }
    response
}

/// Whether the client behind `request` negotiated a protocol that knows
/// priming events: the `MCP-Protocol-Version` header on a session's
/// requests (clients older than 2025-06-18 send none), the version asked for
/// in an `initialize` (the server takes it, or its own newer latest one).
async fn knows_priming(request: Request<Body>) -> Result<(Request<Body>, bool), Response> {
    if request.method() != Method::POST || request.headers().contains_key("mcp-session-id") {
        let version = request.headers().get("mcp-protocol-version").and_then(|v| v.to_str().ok());
        let knows = version.is_some_and(|v| v >= PRIMING_SINCE);
        return Ok((request, knows));
    }
    let (parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, MAX_INITIALIZE_BYTES).await.map_err(|_| {
        (StatusCode::PAYLOAD_TOO_LARGE, format!("Payload Too Large: the limit is {MAX_INITIALIZE_BYTES} bytes\n"))
            .into_response()
    })?;
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

/// The SSE body with its priming events left out, streamed as it comes.
fn without_priming(body: Body) -> Body {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, axum::Error>>(16);
    tokio::spawn(async move {
        let mut events = EventFilter::default();
        let mut chunks = body.into_data_stream();
        loop {
            let chunk = tokio::select! {
                chunk = chunks.next() => chunk,
                // The client went away: drop rmcp's stream now, as its own
                // response would have been dropped.
                _ = tx.closed() => return,
            };
            let Some(chunk) = chunk else { return };
            let out = chunk.map(|bytes| events.push(&bytes));
            if matches!(&out, Ok(kept) if kept.is_empty()) {
                continue;
            }
            if tx.send(out.map(Bytes::from)).await.is_err() {
                return;
            }
        }
    });
    Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
}

/// Splits SSE text into events and drops those without data.
#[derive(Default)]
pub struct EventFilter {
    pending: Vec<u8>,
}

impl EventFilter {
    /// Takes the next bytes of the stream; returns the complete events kept.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<u8> {
        self.pending.extend_from_slice(bytes);
        let mut kept = Vec::new();
        while let Some(end) = self.pending.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = self.pending.drain(..end + 2).collect();
            if !is_priming(&event) {
                kept.extend_from_slice(&event);
            }
        }
        kept
    }
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
        let mut f = EventFilter::default();
        assert_eq!(f.push(b"id: 0\nretry: 3000\ndata:\n\n"), b"");
        assert_eq!(f.push(b"retry: 3000\n\n:\n\nid: 1\nda"), b":\n\n");
        assert_eq!(f.push(b"ta: {\"a\":1}\n\n"), b"id: 1\ndata: {\"a\":1}\n\n");
        assert_eq!(f.push(b"event: x\ndata:\n\n"), b"event: x\ndata:\n\n");
    }
}
