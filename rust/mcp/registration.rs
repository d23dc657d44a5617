//! `sandbox-mcp config <client>`: the exact registration each MCP client
//! needs, for the stdio server (this binary) or an HTTP one (its URL and, when
//! it requires one, the bearer token). The text goes to stdout so it can be
//! piped or pasted; where to put it is returned separately as a hint.
use std::path::Path;

use serde_json::{Value, json};

/// The name every client registers the server under.
const SERVER_NAME: &str = "sandbox";

/// An MCP client that can be registered with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Client {
    /// Claude Code (`claude mcp add`).
    Claude,
    /// Cursor (`~/.cursor/mcp.json`).
    Cursor,
    /// Claude Desktop (`claude_desktop_config.json`).
    Desktop,
}

/// A running HTTP server to register instead of the stdio binary.
#[derive(Debug, Clone)]
pub struct HttpTarget {
    /// The endpoint, e.g. `http://127.0.0.1:8765/mcp`.
    pub url: String,
    /// The bearer token, when the server requires one.
    pub token: Option<String>,
}

/// What to print: the registration itself and where it goes.
#[derive(Debug, Clone)]
pub struct Registration {
    /// The command to run or the JSON to merge (stdout).
    pub text: String,
    /// Where the text goes (stderr).
    pub hint: String,
}

/// The registration of `binary` (stdio) or of `http` with `client`.
pub fn render(client: Client, binary: &Path, http: Option<&HttpTarget>) -> Registration {
    let bin = binary.display().to_string();
    match (client, http) {
        (Client::Claude, None) => Registration {
            text: format!("claude mcp add {SERVER_NAME} -- {}", shell_quote(&bin)),
            hint: "Run this in a shell (add `--scope user` to register it for every project).".into(),
        },
        (Client::Claude, Some(h)) => {
            let mut text = format!("claude mcp add --transport http {SERVER_NAME} {}", shell_quote(&h.url));
            if let Some(t) = &h.token {
                text.push_str(&format!(" --header {}", shell_quote(&format!("Authorization: Bearer {t}"))));
            }
            Registration { text, hint: "Run this in a shell while `sandbox-mcp serve --http` is running.".into() }
        }
        (Client::Cursor, None) => {
            Registration { text: servers(json!({ "command": bin, "args": [] })), hint: cursor_hint() }
        }
        (Client::Cursor, Some(h)) => {
            let mut entry = json!({ "url": h.url });
            if let Some(t) = &h.token {
                entry["headers"] = json!({ "Authorization": format!("Bearer {t}") });
            }
            Registration { text: servers(entry), hint: cursor_hint() }
        }
        (Client::Desktop, None) => {
            Registration { text: servers(json!({ "command": bin, "args": [] })), hint: desktop_hint() }
        }
        // Claude Desktop's config file only launches stdio servers; mcp-remote
        // bridges one to an HTTP endpoint. The header value rides in an env
        // variable because some platforms split arguments at spaces.
        (Client::Desktop, Some(h)) => {
            let mut args = vec![json!("-y"), json!("mcp-remote"), json!(h.url)];
            if h.token.is_some() {
                args.extend([json!("--header"), json!("Authorization:${SANDBOX_MCP_AUTH}")]);
            }
            let mut entry = json!({ "command": "npx", "args": args });
            if let Some(t) = &h.token {
                entry["env"] = json!({ "SANDBOX_MCP_AUTH": format!("Bearer {t}") });
            }
            Registration {
                text: servers(entry),
                hint: format!("{} It bridges to the HTTP server with npx mcp-remote (needs Node.js).", desktop_hint()),
            }
        }
    }
}

fn servers(entry: Value) -> String {
    let doc = json!({ "mcpServers": { SERVER_NAME: entry } });
    serde_json::to_string_pretty(&doc).unwrap_or_default()
}

fn cursor_hint() -> String {
    "Merge into ~/.cursor/mcp.json (all projects) or <project>/.cursor/mcp.json.".into()
}

fn desktop_hint() -> String {
    "Merge into claude_desktop_config.json (macOS: ~/Library/Application Support/Claude/, \
     Windows: %APPDATA%\\Claude\\, Linux: ~/.config/Claude/) and restart Claude Desktop."
        .into()
}

/// Single-quotes `s` for a POSIX shell when it holds anything but safe characters.
fn shell_quote(s: &str) -> String {
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"/._-:+=@,".contains(&b)) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bin() -> &'static Path {
        Path::new("/opt/my tools/sandbox-mcp")
    }

    #[test]
    fn claude_stdio_is_an_add_command_with_the_quoted_path() {
        let r = render(Client::Claude, bin(), None);
        assert_eq!(r.text, "claude mcp add sandbox -- '/opt/my tools/sandbox-mcp'");
    }

    #[test]
    fn claude_http_carries_the_token_header() {
        let h = HttpTarget { url: "http://127.0.0.1:8765/mcp".into(), token: Some("abc".into()) };
        let r = render(Client::Claude, bin(), Some(&h));
        assert_eq!(
            r.text,
            "claude mcp add --transport http sandbox http://127.0.0.1:8765/mcp --header 'Authorization: Bearer abc'"
        );
    }

    #[test]
    fn json_clients_get_mcp_servers_documents() {
        let v: Value = serde_json::from_str(&render(Client::Desktop, bin(), None).text).unwrap();
        assert_eq!(v["mcpServers"]["sandbox"]["command"], "/opt/my tools/sandbox-mcp");
        let h = HttpTarget { url: "http://h:1/mcp".into(), token: Some("t".into()) };
        let v: Value = serde_json::from_str(&render(Client::Cursor, bin(), Some(&h)).text).unwrap();
        assert_eq!(v["mcpServers"]["sandbox"]["url"], "http://h:1/mcp");
        assert_eq!(v["mcpServers"]["sandbox"]["headers"]["Authorization"], "Bearer t");
        let v: Value = serde_json::from_str(&render(Client::Desktop, bin(), Some(&h)).text).unwrap();
        assert_eq!(v["mcpServers"]["sandbox"]["command"], "npx");
        assert_eq!(v["mcpServers"]["sandbox"]["env"]["SANDBOX_MCP_AUTH"], "Bearer t");
    }
}
