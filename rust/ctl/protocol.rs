//! The sandbox-ctl wire format: one JSON object per line, one request and one
//! response per connection. `{"id", "method", "params"}` in;
//! `{"id", "result"}` or `{"id", "error": {"code", "message"}}` out.
use serde_json::{Map, Value, json};

/// Longest request line the server reads, newline excluded.
pub const MAX_REQUEST_LINE: usize = 64 * 1024;
/// Longest response line the CLI accepts.
pub const MAX_RESPONSE_LINE: usize = 1 << 20;
/// The socket path inside a sandbox (a symlink into [`GUEST_SOCKET_DIR`]).
pub const GUEST_SOCKET: &str = "/run/sandbox-ctl.sock";
/// The directory mounted into a sandbox that holds its socket; a directory
/// mount keeps working when the orchestrator re-creates the socket.
pub const GUEST_SOCKET_DIR: &str = "/run/sandbox-ctl";
/// The socket's file name, on the host and in [`GUEST_SOCKET_DIR`].
pub const SOCKET_FILE: &str = "ctl.sock";
/// Where the CLI is installed inside a sandbox.
pub const GUEST_BINARY: &str = "/usr/local/bin/sandbox-ctl";

/// Error codes of the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// Malformed request or bad parameter.
    InvalidRequest,
    /// The policy forbids it.
    PermissionDenied,
    /// No such child of this parent.
    NotFound,
    /// A spawn count or budget is used up.
    LimitReached,
    /// Anything else.
    InternalError,
}

impl ErrorCode {
    /// The code as sent.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidRequest => "INVALID_REQUEST",
            Self::PermissionDenied => "PERMISSION_DENIED",
            Self::NotFound => "NOT_FOUND",
            Self::LimitReached => "LIMIT_REACHED",
            Self::InternalError => "INTERNAL_ERROR",
        }
    }
}

/// A parsed request.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// Echoed in the response, whatever its JSON type.
    pub id: Value,
    /// Method name.
    pub method: String,
    /// Parameters (`{}` when null or absent).
    pub params: Map<String, Value>,
}

/// A request that could not be parsed: the id to answer with (null unless
/// the line was an object carrying one) and the message.
#[derive(Debug, Clone, PartialEq)]
pub struct BadRequest {
    /// Id to echo.
    pub id: Value,
    /// What was wrong.
    pub message: String,
}

/// Parse one request line (without its newline).
pub fn parse_request(line: &[u8]) -> Result<Request, BadRequest> {
    let bad = |id: Value, message: String| BadRequest { id, message };
    let value: Value = serde_json::from_slice(line).map_err(|e| bad(Value::Null, format!("Invalid JSON: {e}")))?;
    let Value::Object(mut obj) = value else {
        return Err(bad(Value::Null, "Request must be a JSON object".into()));
    };
    let id = obj.remove("id").unwrap_or(Value::Null);
    let method = match obj.remove("method") {
        Some(Value::String(m)) => m,
        _ => return Err(bad(id, "Missing method".into())),
    };
    let params = match obj.remove("params") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(p)) => p,
        Some(_) => return Err(bad(id, "params must be an object".into())),
    };
    Ok(Request { id, method, params })
}

/// A success response line, newline included.
pub fn result_line(id: &Value, result: Value) -> String {
    format!("{}\n", json!({"id": id, "result": result}))
}

/// An error response line, newline included.
pub fn error_line(id: &Value, code: ErrorCode, message: &str) -> String {
    format!("{}\n", json!({"id": id, "error": {"code": code.as_str(), "message": message}}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects_like_the_reference() {
        let r = parse_request(br#"{"id": 7, "method": "ping"}"#).unwrap();
        assert_eq!((r.id, r.method.as_str(), r.params.len()), (json!(7), "ping", 0));
        let r = parse_request(br#"{"id": "a", "method": "spawn", "params": {"cpus": 1}}"#).unwrap();
        assert_eq!(r.params["cpus"], json!(1));
        assert!(parse_request(b"{nope").unwrap_err().message.starts_with("Invalid JSON: "));
        assert_eq!(parse_request(b"[1]").unwrap_err().message, "Request must be a JSON object");
        let e = parse_request(br#"{"id": "x", "method": 3}"#).unwrap_err();
        assert_eq!((e.id, e.message.as_str()), (json!("x"), "Missing method"));
        assert_eq!(
            parse_request(br#"{"method": "ping", "params": []}"#).unwrap_err().message,
            "params must be an object"
        );
        assert!(parse_request(br#"{"method": "ping", "params": null}"#).is_ok());
    }

    #[test]
    fn response_lines_are_compact() {
        assert_eq!(result_line(&json!("i"), json!({"ok": true})), "{\"id\":\"i\",\"result\":{\"ok\":true}}\n");
        assert_eq!(
            error_line(&Value::Null, ErrorCode::NotFound, "gone"),
            "{\"id\":null,\"error\":{\"code\":\"NOT_FOUND\",\"message\":\"gone\"}}\n"
        );
    }
}
