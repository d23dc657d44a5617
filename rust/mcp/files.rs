//! File tools: write_file, read_file, batch_write. Everything is written
//! inside the sandbox; the host filesystem is never touched.
use rmcp::{handler::server::wrapper::Parameters, model::CallToolResult, schemars, tool, tool_router};
use serde::Deserialize;

use super::{SandboxServer, default_sandbox, fail, format, reply};
use sandbox_orchestrator::{OrchestratorError, text::render};

/// Parameters of `write_file`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct WriteFileParams {
    /// Path in the sandbox; relative paths are under /workspace. Parents are created.
    pub path: String,
    /// UTF-8 text to write.
    pub content: String,
    /// Sandbox name.
    #[serde(default = "default_sandbox")]
    pub sandbox: String,
}

/// Parameters of `read_file`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ReadFileParams {
    /// Path in the sandbox; relative paths are under /workspace.
    pub path: String,
    /// Sandbox name.
    #[serde(default = "default_sandbox")]
    pub sandbox: String,
}

/// Parameters of `batch_write`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct BatchWriteParams {
    /// A JSON object (as a string) mapping paths to contents, e.g. {"src/a.py": "print(1)"}.
    pub files: String,
    /// Sandbox name.
    #[serde(default = "default_sandbox")]
    pub sandbox: String,
}

/// Parse batch_write's JSON into (path, content) pairs in input order.
fn parse_files(json: &str) -> Result<Vec<(String, Vec<u8>)>, OrchestratorError> {
    let value: serde_json::Value =
        serde_json::from_str(json).map_err(|e| OrchestratorError::InvalidArgument(format!("invalid JSON: {e}")))?;
    let shape = "files must be a JSON object mapping paths to contents";
    let serde_json::Value::Object(map) = value else {
        return Err(OrchestratorError::InvalidArgument(shape.into()));
    };
    if map.is_empty() {
        return Err(OrchestratorError::InvalidArgument(format!("{shape} (got an empty object)")));
    }
    map.into_iter()
        .map(|(path, v)| match v {
            serde_json::Value::String(s) => Ok((path, s.into_bytes())),
            _ => Err(OrchestratorError::InvalidArgument(format!("{shape} (the value for '{path}' is not a string)"))),
        })
        .collect()
}

#[tool_router(router = files_router, vis = "pub(super)")]
impl SandboxServer {
    #[tool(
        description = "Write a text file in a sandbox (parents created; relative paths under /workspace). Returns 'Wrote N bytes to PATH'.",
        annotations(destructive_hint = true, idempotent_hint = true, open_world_hint = false)
    )]
    async fn write_file(&self, Parameters(p): Parameters<WriteFileParams>) -> Result<CallToolResult, rmcp::ErrorData> {
        let m = &self.manager;
        let result = async {
            let sandbox = m.get_or_create(&p.sandbox).await?;
            let n = p.content.len();
            m.write_files(&sandbox, &[(p.path.clone(), p.content.into_bytes())]).await?;
            Ok(format!("Wrote {n} bytes to {}", p.path))
        };
        reply(result.await)
    }

    #[tool(
        description = "Read a file from a sandbox as text (bytes that are not UTF-8 shown as U+FFFD; capped at 50,000 bytes with a note).",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn read_file(&self, Parameters(p): Parameters<ReadFileParams>) -> Result<CallToolResult, rmcp::ErrorData> {
        let m = &self.manager;
        let result = async {
            // Reading from a sandbox never creates one: there is nothing to read yet.
            let sandbox = m.get(&p.sandbox)?;
            let data = m.read_file(&sandbox, &p.path).await?;
            Ok(render(&data))
        };
        reply(result.await)
    }

    #[tool(
        description = "Write many files in one call. `files` is a JSON object string {path: content}; relative paths are under /workspace. Nothing is written on the host.",
        annotations(destructive_hint = true, idempotent_hint = true, open_world_hint = false)
    )]
    async fn batch_write(
        &self,
        Parameters(p): Parameters<BatchWriteParams>,
    ) -> Result<CallToolResult, rmcp::ErrorData> {
        let files = match parse_files(&p.files) {
            Ok(f) => f,
            Err(e) => return fail(e),
        };
        let m = &self.manager;
        let started = std::time::Instant::now();
        let result = async {
            let sandbox = m.get_or_create(&p.sandbox).await?;
            m.write_files(&sandbox, &files).await?;
            let names: Vec<&str> = files.iter().map(|(p, _)| p.as_str()).collect();
            Ok(format!("Wrote {} files ({}): {}", files.len(), format::ms(started.elapsed()), names.join(", ")))
        };
        reply(result.await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_json_errors_name_the_problem() {
        assert!(parse_files("{").unwrap_err().to_string().starts_with("invalid JSON"));
        assert!(parse_files("[1]").unwrap_err().to_string().contains("JSON object"));
        assert!(parse_files("{}").unwrap_err().to_string().contains("empty"));
        assert!(parse_files(r#"{"a": 1}"#).unwrap_err().to_string().contains("'a'"));
        let ok = parse_files(r#"{"z": "1", "a": "2"}"#).unwrap();
        assert_eq!(ok[0].0, "z");
        assert_eq!(ok[1].0, "a");
    }
}
