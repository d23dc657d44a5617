//! The HTTP bearer token: checked when given by flag or environment, else
//! generated once (32 random bytes, hex) and kept in
//! `<config dir>/http-token` with mode 0600 so later runs reuse it.
use std::{
    fs::{self, OpenOptions},
    io::{Read, Write},
    os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
};

use super::http::{HttpError, MCP_PATH};

/// Shorter tokens are refused: they could be guessed over the network.
const MIN_TOKEN_LEN: usize = 16;

/// Where the generated token is stored.
pub fn token_path() -> PathBuf {
    sandbox_base::paths::config_dir().join("http-token")
}

/// A token given explicitly, trimmed, if it is long enough and fits in a header.
pub fn validate(token: &str) -> Result<String, HttpError> {
    let token = token.trim();
    if token.len() < MIN_TOKEN_LEN {
        return Err(HttpError::InvalidToken(format!("it must be at least {MIN_TOKEN_LEN} characters")));
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(HttpError::InvalidToken("it must be printable ASCII without spaces".into()));
    }
    Ok(token.to_string())
}

/// The stored token, or a new one written to `path` (and announced on stderr,
/// the only time it is printed).
pub fn load_or_create(path: &Path) -> Result<String, HttpError> {
    let io = |source| HttpError::TokenFile { path: path.to_path_buf(), source };
    match fs::read_to_string(path) {
        Ok(text) => {
            let mode = fs::metadata(path).map_err(io)?.permissions().mode();
            if mode & 0o077 != 0 {
                tracing::warn!(path = %path.display(), "token file was readable by others; restricting it to 0600");
                fs::set_permissions(path, fs::Permissions::from_mode(0o600)).map_err(io)?;
            }
            let token = validate(&text).map_err(|e| {
                HttpError::InvalidToken(format!("{} holds an unusable token ({e}); delete it", path.display()))
            })?;
            eprintln!("sandbox-mcp: using the bearer token stored in {}", path.display());
            return Ok(token);
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(e)),
    }
    let token = generate().map_err(io)?;
    if let Some(dir) = path.parent() {
        fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(io)?;
    }
    // Written whole under a private name, then linked into place: two
    // servers starting together (every HTTP server needs the token now,
    // loopback ones too) never overwrite each other's token, and the loser
    // reads the winner's complete file rather than failing or reading half.
    let tmp = path.with_extension(format!("tmp-{}", &token[..16]));
    let mut file = OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp).map_err(io)?;
    file.write_all(format!("{token}\n").as_bytes()).map_err(io)?;
    let linked = fs::hard_link(&tmp, path);
    let _ = fs::remove_file(&tmp);
    match linked {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return load_or_create(path),
        Err(e) => return Err(io(e)),
    }
    eprintln!(
        "sandbox-mcp: generated a bearer token for HTTP clients (stored in {path}, mode 0600):\n  {token}\n\
         Clients must send it with every request:\n  Authorization: Bearer {token}\n\
         e.g. claude mcp add --transport http sandbox http://HOST:PORT{MCP_PATH} --header \"Authorization: Bearer {token}\"\n\
         (`sandbox-mcp config claude --http URL` prints this with the stored token)",
        path = path.display()
    );
    Ok(token)
}

fn generate() -> std::io::Result<String> {
    let mut bytes = [0u8; 32];
    fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_or_spaced_tokens_are_refused() {
        assert!(validate("short").is_err());
        assert!(validate("has a space in the middle").is_err());
        assert_eq!(validate("  0123456789abcdef\n").unwrap(), "0123456789abcdef");
    }

    #[test]
    fn token_is_generated_once_with_mode_0600_then_reused() {
        let dir = std::env::temp_dir().join(format!("smcp-token-{}", std::process::id()));
        let path = dir.join("cfg/http-token");
        let first = load_or_create(&path).unwrap();
        assert_eq!(first.len(), 64);
        assert!(first.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(load_or_create(&path).unwrap(), first);
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(load_or_create(&path).unwrap(), first);
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        fs::write(&path, "x\n").unwrap();
        assert!(matches!(load_or_create(&path), Err(HttpError::InvalidToken(_))));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn servers_starting_together_agree_on_one_token() {
        let dir = std::env::temp_dir().join(format!("smcp-token-race-{}", std::process::id()));
        let path = dir.join("http-token");
        let tokens: Vec<String> = std::thread::scope(|s| {
            let runs: Vec<_> = (0..8).map(|_| s.spawn(|| load_or_create(&path).unwrap())).collect();
            runs.into_iter().map(|r| r.join().unwrap()).collect()
        });
        assert!(tokens.iter().all(|t| t == &tokens[0] && t.len() == 64), "{tokens:?}");
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 1, "no temp files left");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn unreadable_token_path_is_an_error() {
        let dir = std::env::temp_dir().join(format!("smcp-token-dir-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        // A directory where the file should be: reading it fails, not NotFound.
        assert!(matches!(load_or_create(&dir), Err(HttpError::TokenFile { .. })));
        fs::remove_dir_all(&dir).unwrap();
    }
}
