//! MCP's newline-delimited JSON-RPC framing over any byte stream pair (stdin
//! and stdout, or a Unix socket a front-end relays), as an rmcp
//! [`Transport`].
//!
//! rmcp's own stream transport drops what it cannot decode: unparsable lines
//! and lines over its size limit get no reply, an ill-shaped request is
//! answered without its id, and a known method whose params do not fit falls
//! through to "method not found". A client then waits for an answer that
//! never comes. This transport answers every line it cannot deliver, as
//! JSON-RPC 2.0 asks: `-32700` for bytes that are not JSON, `-32600` for JSON
//! that is not a JSON-RPC message and for a line over [`MAX_LINE_BYTES`]
//! (with the request's id whenever it can be read), `-32602` for a standard
//! method whose params do not match it. Well-formed messages take the same
//! fast path as before: one `serde_json` pass straight into rmcp's types.
use std::sync::Arc;

use rmcp::{
    RoleServer,
    model::{ClientRequest, ErrorData, JsonRpcMessage, RequestId},
    service::{RxJsonRpcMessage, TxJsonRpcMessage},
    transport::Transport,
};
use serde::Deserialize;
use tokio::{
    io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader},
    sync::Mutex,
    task::JoinSet,
};

/// Longest line (one JSON-RPC message) accepted: rmcp's limit, and the
/// largest SSE event its HTTP client takes, so what fits over HTTP fits here.
pub const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;

/// How much of an oversized line is kept to find its request id in: clients
/// put `id` before `params`, well inside this.
const ID_SCAN_BYTES: usize = 4096;

/// UTF-8 byte order mark, which RFC 8259 lets a parser skip.
const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";

/// Methods rmcp decodes into typed requests. One of these that still comes
/// out as a custom request had params that do not fit the method.
const TYPED_METHODS: &[&str] = &[
    "initialize",
    "ping",
    "completion/complete",
    "logging/setLevel",
    "prompts/get",
    "prompts/list",
    "resources/list",
    "resources/read",
    "resources/subscribe",
    "resources/unsubscribe",
    "resources/templates/list",
    "tools/call",
    "tools/list",
];

/// What one line of input amounts to.
#[derive(Debug)]
pub enum Decoded {
    /// A message for the MCP service.
    Message(Box<RxJsonRpcMessage<RoleServer>>),
    /// Nothing to do: a blank line, or an ill-formed notification (which
    /// JSON-RPC never answers).
    Skip,
    /// An error reply to send back in place of the message.
    Reply(Box<TxJsonRpcMessage<RoleServer>>),
}

fn reply(error: ErrorData, id: Option<RequestId>) -> Decoded {
    Decoded::Reply(Box::new(TxJsonRpcMessage::<RoleServer>::error(error, id)))
}

/// Decodes one line (its `\n` and a `\r` before it optional).
pub fn decode_line(line: &[u8]) -> Decoded {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let line = line.strip_prefix(UTF8_BOM).unwrap_or(line);
    if line.trim_ascii().is_empty() {
        return Decoded::Skip;
    }
    let text = match std::str::from_utf8(line) {
        Ok(text) => text,
        Err(e) => {
            let at = e.valid_up_to();
            return reply(ErrorData::parse_error(format!("Parse error: invalid UTF-8 at byte {at}"), None), None);
        }
    };
    match serde_json::from_str::<RxJsonRpcMessage<RoleServer>>(text) {
        Ok(JsonRpcMessage::Request(request)) => match &request.request {
            ClientRequest::CustomRequest(custom) if TYPED_METHODS.contains(&custom.method.as_str()) => {
                let message = params_mismatch(&custom.method, custom.params.as_ref());
                reply(ErrorData::invalid_params(message, None), Some(request.id))
            }
            _ => Decoded::Message(Box::new(JsonRpcMessage::Request(request))),
        },
        Ok(message) => Decoded::Message(Box::new(message)),
        Err(e) if matches!(e.classify(), serde_json::error::Category::Syntax | serde_json::error::Category::Eof) => {
            reply(ErrorData::parse_error(format!("Parse error: {e}"), None), None)
        }
        Err(e) => not_a_message(text, &e),
    }
}

/// Valid JSON that is not a message rmcp takes: an Invalid Request answered
/// with the request's id when it has a usable one.
fn not_a_message(text: &str, error: &serde_json::Error) -> Decoded {
    let Ok(value) = serde_json::from_str::<serde_json::Value>(text) else {
        return reply(ErrorData::parse_error(format!("Parse error: {error}"), None), None);
    };
    let object = value.as_object();
    let id = object.and_then(|o| o.get("id"));
    if id.is_none() && object.and_then(|o| o.get("method")).is_some_and(|m| m.is_string()) {
        return Decoded::Skip;
    }
    let detail = if value.is_array() {
        "batches are not supported, send one message per line".to_string()
    } else {
        error.to_string()
    };
    let id = id.and_then(|id| RequestId::deserialize(id).ok());
    reply(ErrorData::invalid_request(format!("Invalid Request: {detail}"), None), id)
}

/// Why the params of a typed method did not decode, as precisely as cheap.
fn params_mismatch(method: &str, params: Option<&serde_json::Value>) -> String {
    if method == "tools/call" {
        let arguments = params.and_then(|p| p.get("arguments")).filter(|a| !a.is_null());
        if let Some(arguments) = arguments.filter(|a| !a.is_object()) {
            return format!(
                "Invalid params: `arguments` must be an object of the tool's named arguments, not {}",
                json_kind(arguments)
            );
        }
        if let Err(e) = rmcp::model::CallToolRequestParams::deserialize(params.unwrap_or(&serde_json::Value::Null)) {
            return format!("Invalid params for tools/call: {e}");
        }
    }
    format!("Invalid params: they do not match what `{method}` takes")
}

fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// The reply to a line over [`MAX_LINE_BYTES`]; `head` is its start, where
/// the request id usually is.
pub fn oversized_reply(head: &[u8]) -> TxJsonRpcMessage<RoleServer> {
    let message = format!(
        "Invalid Request: the message is longer than the {} MiB limit; send large content in smaller pieces",
        MAX_LINE_BYTES >> 20
    );
    TxJsonRpcMessage::<RoleServer>::error(ErrorData::invalid_request(message, None), leading_id(head))
}

/// The top-level `id` of a JSON object whose text may be cut short: the
/// members before the cut are read one by one until `id` turns up.
pub fn leading_id(head: &[u8]) -> Option<RequestId> {
    let head = &head[..head.len().min(ID_SCAN_BYTES)];
    let text = match std::str::from_utf8(head) {
        Ok(t) => t,
        Err(e) => std::str::from_utf8(&head[..e.valid_up_to()]).ok()?,
    };
    let mut rest = text.trim_start().strip_prefix('{')?;
    loop {
        rest = rest.trim_start();
        let mut keys = serde_json::Deserializer::from_str(rest).into_iter::<String>();
        let key = keys.next()?.ok()?;
        rest = rest[keys.byte_offset()..].trim_start().strip_prefix(':')?.trim_start();
        if key == "id" {
            let mut values = serde_json::Deserializer::from_str(rest).into_iter::<serde_json::Value>();
            return RequestId::deserialize(values.next()?.ok()?).ok();
        }
        let mut values = serde_json::Deserializer::from_str(rest).into_iter::<serde::de::IgnoredAny>();
        values.next()?.ok()?;
        rest = rest[values.byte_offset()..].trim_start().strip_prefix(',')?;
    }
}

/// Splits a byte stream into lines of at most `max` bytes, fed whatever the
/// reader has buffered. Synchronous so the caller can consume exactly what
/// was taken with no await in between, which keeps a cancelled read safe.
#[derive(Debug)]
pub struct LineSplitter {
    max: usize,
    line: Vec<u8>,
    /// The start of an oversized line, kept while its rest is skipped.
    head: Option<Vec<u8>>,
}

/// What [`LineSplitter::feed`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Split {
    /// Need more input.
    More,
    /// A whole line (with its `\n`).
    Line(Vec<u8>),
    /// A line over the limit ended; its first bytes.
    Oversized(Vec<u8>),
}

impl LineSplitter {
    /// A splitter for lines of at most `max` bytes.
    pub fn new(max: usize) -> Self {
        Self { max, line: Vec::new(), head: None }
    }

    /// Takes bytes from `input` up to the end of a line or of `input`;
    /// returns how many it took and what that completed.
    pub fn feed(&mut self, input: &[u8]) -> (usize, Split) {
        let newline = input.iter().position(|b| *b == b'\n');
        let take = newline.map_or(input.len(), |i| i + 1);
        let chunk = &input[..take];
        match &mut self.head {
            Some(head) => head.extend_from_slice(&chunk[..chunk.len().min(ID_SCAN_BYTES.saturating_sub(head.len()))]),
            None if self.line.len().saturating_add(take) > self.max => {
                let mut head = self.line[..self.line.len().min(ID_SCAN_BYTES)].to_vec();
                head.extend_from_slice(&chunk[..chunk.len().min(ID_SCAN_BYTES.saturating_sub(head.len()))]);
                // Give back the memory of the part read so far.
                self.line = Vec::new();
                self.head = Some(head);
            }
            None => self.line.extend_from_slice(chunk),
        }
        if newline.is_none() {
            return (take, Split::More);
        }
        match self.head.take() {
            Some(head) => (take, Split::Oversized(head)),
            None => (take, Split::Line(std::mem::take(&mut self.line))),
        }
    }

    /// What is left at end of input: an unterminated line, if any.
    pub fn finish(&mut self) -> Split {
        match self.head.take() {
            Some(head) => Split::Oversized(head),
            None if !self.line.is_empty() => Split::Line(std::mem::take(&mut self.line)),
            None => Split::More,
        }
    }
}

/// The transport: lines in from `R`, messages out to `W`.
pub struct LineTransport<R, W> {
    read: BufReader<R>,
    splitter: LineSplitter,
    eof: bool,
    write: Arc<Mutex<Option<W>>>,
    /// Error replies on their way out: written by tasks of their own, since
    /// `receive` may be cancelled at any await and a reply must not be lost
    /// or cut in half.
    replies: JoinSet<()>,
}

impl<R, W> LineTransport<R, W>
where
    R: AsyncRead + Send + Unpin,
    W: AsyncWrite + Send + Unpin + 'static,
{
    /// A transport reading `read` and writing `write`.
    pub fn new(read: R, write: W) -> Self {
        Self {
            read: BufReader::new(read),
            splitter: LineSplitter::new(MAX_LINE_BYTES),
            eof: false,
            write: Arc::new(Mutex::new(Some(write))),
            replies: JoinSet::new(),
        }
    }

    fn answer(&mut self, message: TxJsonRpcMessage<RoleServer>) {
        let send = self.send(message);
        self.replies.spawn(async move {
            if let Err(e) = send.await {
                tracing::debug!("could not answer an undeliverable message: {e}");
            }
        });
    }

    /// The next split-off piece of input, `None` at end of input.
    async fn next_piece(&mut self) -> Option<Split> {
        if self.eof {
            return None;
        }
        loop {
            let available = match self.read.fill_buf().await {
                Ok(available) => available,
                Err(e) => {
                    tracing::error!("reading MCP input: {e}");
                    self.eof = true;
                    return Some(self.splitter.finish());
                }
            };
            if available.is_empty() {
                self.eof = true;
                return Some(self.splitter.finish());
            }
            let (taken, split) = self.splitter.feed(available);
            self.read.consume(taken);
            if split != Split::More {
                return Some(split);
            }
        }
    }
}

impl<R, W> Transport<RoleServer> for LineTransport<R, W>
where
    R: AsyncRead + Send + Unpin,
    W: AsyncWrite + Send + Unpin + 'static,
{
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let write = self.write.clone();
        async move {
            let mut line = serde_json::to_vec(&item).map_err(std::io::Error::other)?;
            line.push(b'\n');
            let mut guard = write.lock().await;
            let Some(out) = guard.as_mut() else {
                return Err(std::io::Error::new(std::io::ErrorKind::NotConnected, "the MCP transport is closed"));
            };
            out.write_all(&line).await?;
            out.flush().await
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        loop {
            match self.next_piece().await? {
                Split::More => {}
                Split::Oversized(head) => {
                    tracing::warn!(max_bytes = MAX_LINE_BYTES, "refused an MCP message over the size limit");
                    self.answer(oversized_reply(&head));
                }
                Split::Line(line) => match decode_line(&line) {
                    Decoded::Message(message) => return Some(*message),
                    Decoded::Skip => {}
                    Decoded::Reply(error) => {
                        tracing::debug!("answered an undeliverable MCP message with an error");
                        self.answer(*error);
                    }
                },
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        // Error replies still being written go out before the writer does.
        while self.replies.join_next().await.is_some() {}
        let mut guard = self.write.lock().await;
        if let Some(mut out) = guard.take() {
            out.shutdown().await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error_of(decoded: Decoded) -> (i32, Option<RequestId>, String) {
        match decoded {
            Decoded::Reply(reply) => match *reply {
                JsonRpcMessage::Error(e) => (e.error.code.0, e.id, e.error.message.to_string()),
                other => panic!("not an error reply: {other:?}"),
            },
            other => panic!("not a reply: {other:?}"),
        }
    }

    #[test]
    fn unparsable_lines_are_parse_errors_without_id() {
        for line in [&b"{not json\n"[..], b"{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/li\n", b"\xff\xfe\n"] {
            let (code, id, _) = error_of(decode_line(line));
            assert_eq!((code, id), (-32700, None), "{line:?}");
        }
    }

    #[test]
    fn ill_shaped_request_is_answered_with_its_id() {
        let (code, id, _) = error_of(decode_line(br#"{"jsonrpc":"2.0","id":3,"method":7}"#));
        assert_eq!((code, id), (-32600, Some(RequestId::Number(3))));
        let (code, id, msg) = error_of(decode_line(br#"[{"jsonrpc":"2.0","id":3,"method":"ping"}]"#));
        assert_eq!((code, id), (-32600, None));
        assert!(msg.contains("batches"), "{msg}");
    }

    #[test]
    fn arguments_as_a_list_are_invalid_params() {
        let line = br#"{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"env","arguments":[1]}}"#;
        let (code, id, msg) = error_of(decode_line(line));
        assert_eq!((code, id), (-32602, Some(RequestId::String("a".into()))));
        assert!(msg.contains("`arguments` must be an object"), "{msg}");
    }

    #[test]
    fn good_messages_and_blank_lines_pass() {
        let ping = br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
        assert!(matches!(decode_line(ping), Decoded::Message(_)));
        assert!(matches!(decode_line(b"\r\n"), Decoded::Skip));
        assert!(matches!(decode_line(br#"{"jsonrpc":"2.0","method":"x/y","params":5}"#), Decoded::Skip));
    }

    #[test]
    fn leading_id_is_found_in_a_cut_line() {
        let head = br#"{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"arguments":{"content":"aaaa"#;
        assert_eq!(leading_id(head), Some(RequestId::Number(42)));
        let head = br#" { "method" : "tools/call", "id" : "x-1", "params": {"#;
        assert_eq!(leading_id(head), Some(RequestId::String("x-1".into())));
        assert_eq!(leading_id(br#"{"params":{"id":1,"#), None);
        assert_eq!(leading_id(b"[1,2"), None);
    }

    #[test]
    fn splitter_cuts_long_lines_and_keeps_going() {
        let mut s = LineSplitter::new(8);
        assert_eq!(s.feed(b"ab\ncd"), (3, Split::Line(b"ab\n".to_vec())));
        assert_eq!(s.feed(b"cd"), (2, Split::More));
        assert_eq!(s.feed(b"0123456789"), (10, Split::More));
        assert_eq!(s.feed(b"xy\nok\n"), (3, Split::Oversized(b"cd0123456789xy\n".to_vec())));
        assert_eq!(s.feed(b"ok\n"), (3, Split::Line(b"ok\n".to_vec())));
        assert_eq!(s.feed(b"tail"), (4, Split::More));
        assert_eq!(s.finish(), Split::Line(b"tail".to_vec()));
        assert_eq!(s.finish(), Split::More);
    }
}
