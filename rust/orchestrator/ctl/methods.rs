//! The sandbox-ctl methods (internals §15): ping, spawn, list, destroy,
//! exec, run, each acting for the parent whose socket the request came in on.
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value, json};

use sandbox_ctl::protocol::ErrorCode;

use crate::{
    error::OrchestratorError,
    exec::{ExecResult, Outcome},
    sandbox::{Command, Sandbox, WORKSPACE},
    spawn::{SpawnError, SpawnManager, SpawnRequest},
    text,
};

/// Default exec/run timeout, seconds.
const DEFAULT_TIMEOUT: f64 = 30.0;
/// Longest exec/run timeout a sandbox may ask for, seconds.
pub const MAX_TIMEOUT: f64 = 3600.0;

/// A method's failure: the code and message sent back.
pub(super) type Failure = (ErrorCode, String);

fn invalid(msg: impl Into<String>) -> Failure {
    (ErrorCode::InvalidRequest, msg.into())
}

impl From<SpawnError> for (ErrorCode, String) {
    fn from(e: SpawnError) -> Self {
        let code = match &e {
            SpawnError::Permission(_) => ErrorCode::PermissionDenied,
            SpawnError::Value(_) => ErrorCode::InvalidRequest,
            SpawnError::Limit(_) => ErrorCode::LimitReached,
            SpawnError::NotFound(_) => ErrorCode::NotFound,
            SpawnError::Runtime(_) => ErrorCode::InternalError,
        };
        (code, e.to_string())
    }
}

fn orchestrator_failure(e: OrchestratorError) -> Failure {
    SpawnError::from(e).into()
}

/// A string parameter; absent or null is empty.
fn string(params: &Map<String, Value>, key: &str) -> Result<String, Failure> {
    match params.get(key) {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(invalid(format!("params.{key} must be a string"))),
    }
}

fn required(params: &Map<String, Value>, key: &str) -> Result<String, Failure> {
    let s = string(params, key)?;
    if s.is_empty() { Err(invalid(format!("params.{key} required"))) } else { Ok(s) }
}

/// `cpus`, coerced to an integer as the reference's `int()` does.
fn cpus(params: &Map<String, Value>) -> Result<i64, Failure> {
    match params.get("cpus") {
        None | Some(Value::Null) => Ok(0),
        Some(Value::Number(n)) => {
            n.as_i64().or_else(|| n.as_f64().map(|f| f as i64)).ok_or_else(|| invalid("bad cpus"))
        }
        Some(Value::String(s)) => s.trim().parse().map_err(|_| invalid(format!("cpus must be an integer, not '{s}'"))),
        Some(_) => Err(invalid("cpus must be an integer")),
    }
}

fn timeout(params: &Map<String, Value>) -> Result<Duration, Failure> {
    let secs = match params.get("timeout") {
        None | Some(Value::Null) => DEFAULT_TIMEOUT,
        Some(Value::Number(n)) => n.as_f64().unwrap_or(0.0),
        Some(Value::String(s)) => {
            s.trim().parse().map_err(|_| invalid(format!("timeout must be a number, not '{s}'")))?
        }
        Some(_) => return Err(invalid("timeout must be a number")),
    };
    if !(secs > 0.0 && secs <= MAX_TIMEOUT) {
        return Err(invalid(format!("timeout must be greater than 0 and at most {MAX_TIMEOUT} seconds")));
    }
    Ok(Duration::from_secs_f64(secs))
}

fn epoch(t: Option<SystemTime>) -> Value {
    t.map(|t| json!(t.duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0))).unwrap_or(Value::Null)
}

fn child_json(s: &Sandbox) -> Value {
    json!({
        "name": s.plain(), "container": s.plain(), "image": s.image, "cpus": s.cpus,
        "memory_mb": s.memory_bytes >> 20, "expires_at": epoch(s.lease_expires()),
    })
}

fn exec_json(r: &ExecResult, timeout: Duration) -> Value {
    let mut stderr = text::render(&r.stderr);
    if r.outcome == Outcome::TimedOut {
        if !stderr.is_empty() && !stderr.ends_with('\n') {
            stderr.push('\n');
        }
        stderr.push_str(&format!("Timed out after {}s", timeout.as_secs_f64()));
    }
    let mut out = json!({
        "stdout": text::render(&r.stdout), "stderr": stderr,
        "exit_code": r.exit_code(), "duration_ms": r.duration.as_millis() as u64,
    });
    if let Some(why) = &r.history_unsaved {
        out["history_unsaved"] = json!(why);
    }
    out
}

/// Run one method for `parent`.
pub(super) async fn call(
    spawns: &SpawnManager,
    parent: &str,
    method: &str,
    params: &Map<String, Value>,
) -> Result<Value, Failure> {
    match method {
        "ping" => Ok(json!({"ok": true, "parent": crate::names::plain(parent)})),
        "spawn" => {
            let req = SpawnRequest {
                image: string(params, "image")?,
                name: string(params, "name")?,
                cpus: cpus(params)?,
                memory: string(params, "memory")?,
                isolation: string(params, "isolation")?,
            };
            let child = spawns.spawn(parent, &req).await?;
            let mut out = child_json(&child);
            out["ip"] = Value::Null;
            Ok(out)
        }
        "list" => {
            let children: Vec<Value> = spawns.sandboxes().children(parent).iter().map(|c| child_json(c)).collect();
            Ok(json!({"children": children}))
        }
        "destroy" => {
            let name = required(params, "name")?;
            let child = spawns.destroy_own_child(parent, &name).await?;
            Ok(json!({"ok": true, "message": format!("Destroyed sandbox '{}' ({})", child.plain(), child.vm_id())}))
        }
        "exec" => {
            let name = required(params, "name")?;
            let command = required(params, "command")?;
            let (timeout, workdir) = (timeout(params)?, string(params, "workdir")?);
            let child = spawns.own_child(parent, &name)?;
            let result = exec_in(spawns, &child, &command, timeout, &workdir).await?;
            Ok(json!({"name": child.plain(), "result": result}))
        }
        "run" => {
            let command = required(params, "command")?;
            let (timeout, workdir) = (timeout(params)?, string(params, "workdir")?);
            let req =
                SpawnRequest { image: string(params, "image")?, name: string(params, "name")?, ..Default::default() };
            let child = spawns.spawn(parent, &req).await?;
            let result = exec_in(spawns, &child, &command, timeout, &workdir).await;
            // The child is ephemeral whatever happened to the command.
            if let Err(e) = spawns.sandboxes().discard(&child.name).await {
                tracing::warn!(sandbox = %child.name, "could not destroy ctl run child: {e}");
            }
            Ok(json!({"name": child.plain(), "result": result?}))
        }
        other => Err(invalid(format!("Unknown method: {other}"))),
    }
}

/// Run a shell command in a child through the normal exec path (audited
/// in the child); the working directory is created if missing.
async fn exec_in(
    spawns: &SpawnManager,
    child: &Sandbox,
    command: &str,
    timeout: Duration,
    workdir: &str,
) -> Result<Value, Failure> {
    let mut cmd = Command::shell(command, timeout);
    cmd.cwd = if workdir.is_empty() { WORKSPACE.to_string() } else { workdir.to_string() };
    let result = spawns.sandboxes().run_in(child, cmd).await.map_err(orchestrator_failure)?;
    Ok(exec_json(&result, timeout))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn timeouts_are_bounded() {
        assert_eq!(timeout(&params(json!({}))).unwrap(), Duration::from_secs(30));
        assert_eq!(timeout(&params(json!({"timeout": 3600}))).unwrap(), Duration::from_secs(3600));
        assert_eq!(timeout(&params(json!({"timeout": "5"}))).unwrap(), Duration::from_secs(5));
        for bad in [json!(0), json!(-1), json!(3601), json!("x"), json!([1])] {
            assert_eq!(timeout(&params(json!({ "timeout": bad }))).unwrap_err().0, ErrorCode::InvalidRequest);
        }
    }

    #[test]
    fn parameters_are_coerced_or_refused() {
        assert_eq!(cpus(&params(json!({"cpus": "2"}))).unwrap(), 2);
        assert_eq!(cpus(&params(json!({"cpus": 1.0}))).unwrap(), 1);
        assert!(cpus(&params(json!({"cpus": "two"}))).is_err());
        assert!(required(&params(json!({})), "command").is_err());
        assert_eq!(required(&params(json!({"name": ""})), "name").unwrap_err().1, "params.name required");
        assert!(string(&params(json!({"image": 3})), "image").is_err());
    }
}
