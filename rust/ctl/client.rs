//! One sandbox-ctl request: connect, send one line, read one line. Only a
//! failed connect is retried (once, after 500 ms): once the request is
//! written it may have acted (spawned a child), so it is never sent twice.
//! The 1 MiB response cap is enforced while reading.
use std::{
    io::{Read, Write},
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use serde_json::{Value, json};

use super::protocol::{GUEST_SOCKET, MAX_RESPONSE_LINE};

/// Pause before the single connect retry.
const RETRY_DELAY: Duration = Duration::from_millis(500);

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The socket could not be reached (twice).
    #[error("cannot connect to {path}: {source}")]
    Connect {
        /// Socket path.
        path: String,
        /// The second attempt's error.
        source: std::io::Error,
    },
    /// Sending or receiving failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// No complete response before the deadline.
    #[error("timed out waiting for a response")]
    Timeout,
    /// The response line passed the cap.
    #[error("response exceeds {MAX_RESPONSE_LINE} bytes")]
    TooLong,
    /// The server closed without answering.
    #[error("empty response")]
    Empty,
    /// The response was not a protocol object.
    #[error("bad response: {0}")]
    BadResponse(String),
    /// The response answered another request.
    #[error("response id {got} does not match request id {want}")]
    IdMismatch {
        /// Sent id.
        want: String,
        /// Received id.
        got: String,
    },
    /// The server refused the request.
    #[error("{code}: {message}")]
    Remote {
        /// Protocol error code.
        code: String,
        /// Its message.
        message: String,
    },
}

/// The socket: `SANDBOX_CTL_SOCK`, else `/run/sandbox-ctl.sock`.
pub fn socket_path() -> PathBuf {
    std::env::var_os("SANDBOX_CTL_SOCK").filter(|v| !v.is_empty()).map(PathBuf::from).unwrap_or(GUEST_SOCKET.into())
}

/// A random UUIDv4 string.
pub fn request_id() -> String {
    let mut b = [0u8; 16];
    if std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)).is_err() {
        // No urandom: time and pid still make ids unique per call.
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        b = (t ^ (u128::from(std::process::id()) << 64)).to_le_bytes();
    }
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

fn connect(path: &Path) -> Result<UnixStream, ClientError> {
    match UnixStream::connect(path) {
        Ok(s) => Ok(s),
        Err(_) => {
            std::thread::sleep(RETRY_DELAY);
            UnixStream::connect(path)
                .map_err(|source| ClientError::Connect { path: path.display().to_string(), source })
        }
    }
}

/// Read one line (without its newline) of at most [`MAX_RESPONSE_LINE`]
/// bytes before `deadline`.
fn read_line(stream: &mut UnixStream, deadline: Instant) -> Result<Vec<u8>, ClientError> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16384];
    loop {
        let left =
            deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()).ok_or(ClientError::Timeout)?;
        stream.set_read_timeout(Some(left))?;
        let n = match stream.read(&mut chunk) {
            Ok(n) => n,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return Err(ClientError::Timeout);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        };
        if n == 0 {
            return Ok(buf);
        }
        let start = buf.len();
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf[start..].iter().position(|b| *b == b'\n') {
            buf.truncate(start + i);
            return Ok(buf);
        }
        if buf.len() > MAX_RESPONSE_LINE {
            return Err(ClientError::TooLong);
        }
    }
}

/// Send `method` with `params` to the socket at `path`; the `result` on
/// success. The whole exchange must finish within `limit`.
pub fn call(path: &Path, method: &str, params: Value, limit: Duration) -> Result<Value, ClientError> {
    let deadline = Instant::now() + limit;
    let id = request_id();
    let mut stream = connect(path)?;
    let mut line = json!({"id": id, "method": method, "params": params}).to_string();
    line.push('\n');
    stream.write_all(line.as_bytes())?;
    let reply = read_line(&mut stream, deadline)?;
    if reply.is_empty() {
        return Err(ClientError::Empty);
    }
    if reply.len() > MAX_RESPONSE_LINE {
        return Err(ClientError::TooLong);
    }
    let Ok(Value::Object(mut obj)) = serde_json::from_slice::<Value>(&reply) else {
        return Err(ClientError::BadResponse(String::from_utf8_lossy(&reply).chars().take(200).collect()));
    };
    let got = obj.remove("id").unwrap_or(Value::Null);
    if let Some(err) = obj.remove("error") {
        // A request the server could not parse is answered with a null id.
        if got == Value::String(id.clone()) || got.is_null() {
            let field = |k: &str| err.get(k).and_then(Value::as_str).unwrap_or("").to_string();
            return Err(ClientError::Remote { code: field("code"), message: field("message") });
        }
    }
    if got != Value::String(id.clone()) {
        return Err(ClientError::IdMismatch { want: id, got: got.to_string() });
    }
    obj.remove("result").ok_or_else(|| ClientError::BadResponse("missing result".into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    #[test]
    fn ids_are_uuid_v4() {
        let id = request_id();
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "4");
        assert_ne!(id, request_id());
    }

    fn serve_once(reply: impl Fn(&Value) -> Vec<u8> + Send + 'static) -> (tempdir::Dir, PathBuf) {
        let dir = tempdir::Dir::new();
        let path = dir.0.join("s.sock");
        let listener = UnixListener::bind(&path).unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = Vec::new();
            let mut b = [0u8; 1];
            while s.read(&mut b).unwrap() == 1 && b[0] != b'\n' {
                buf.push(b[0]);
            }
            let req: Value = serde_json::from_slice(&buf).unwrap();
            let _ = s.write_all(&reply(&req));
        });
        (dir, path)
    }

    mod tempdir {
        pub struct Dir(pub std::path::PathBuf);
        impl Dir {
            pub fn new() -> Self {
                let p = std::env::temp_dir().join(format!("ctl-client-{}", super::request_id()));
                std::fs::create_dir_all(&p).unwrap();
                Self(p)
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    #[test]
    fn results_errors_and_limits() {
        let t = Duration::from_secs(10);
        let (_d, p) = serve_once(|r| format!("{}\n", json!({"id": r["id"], "result": {"ok": true}})).into_bytes());
        assert_eq!(call(&p, "ping", json!({}), t).unwrap(), json!({"ok": true}));
        let (_d, p) =
            serve_once(|_| b"{\"id\":null,\"error\":{\"code\":\"INVALID_REQUEST\",\"message\":\"m\"}}\n".to_vec());
        assert_eq!(call(&p, "x", json!({}), t).unwrap_err().to_string(), "INVALID_REQUEST: m");
        let (_d, p) = serve_once(|_| b"{\"id\":\"other\",\"result\":{}}\n".to_vec());
        assert!(matches!(call(&p, "ping", json!({}), t), Err(ClientError::IdMismatch { .. })));
        let (_d, p) = serve_once(|_| vec![b'x'; MAX_RESPONSE_LINE + 10]);
        assert!(matches!(call(&p, "ping", json!({}), t), Err(ClientError::TooLong)));
        let (_d, p) = serve_once(|_| Vec::new());
        assert!(matches!(call(&p, "ping", json!({}), t), Err(ClientError::Empty)));
        let (_d, p) = serve_once(|r| format!("{}\n", json!({"id": r["id"]})).into_bytes());
        assert!(call(&p, "ping", json!({}), t).unwrap_err().to_string().contains("missing result"));
        let missing = std::env::temp_dir().join("no-such-ctl.sock");
        assert!(matches!(call(&missing, "ping", json!({}), t), Err(ClientError::Connect { .. })));
    }

    #[test]
    fn a_written_request_is_never_retried() {
        let dir = tempdir::Dir::new();
        let path = dir.0.join("s.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let server = std::thread::spawn(move || {
            listener.set_nonblocking(false).unwrap();
            let (mut first, _) = listener.accept().unwrap();
            let mut b = [0u8; 256];
            let _ = first.read(&mut b);
            drop(first);
            listener.set_nonblocking(true).unwrap();
            std::thread::sleep(Duration::from_millis(1500));
            listener.accept().is_ok()
        });
        assert!(matches!(call(&path, "spawn", json!({}), Duration::from_secs(10)), Err(ClientError::Empty)));
        assert!(!server.join().unwrap(), "the client connected a second time");
    }
}
