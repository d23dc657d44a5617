//! The `sandbox-ctl` command line (internals §16): parse the arguments,
//! send one request, print the result. Exit codes: 0 ok, 1 usage or request
//! error, and for `exec`/`run` the remote exit code (negative or above 255
//! becomes 1).
use std::{io::Write, time::Duration};

use serde_json::{Map, Value, json};

use super::client;

/// Printed for `-h` and after usage errors.
pub const USAGE: &str = "\
Usage: sandbox-ctl [--json] <command> [args]

Commands:
  ping                                        check the connection
  spawn [--image I] [--name N] [--cpus N] [--memory M]
                                              start a child sandbox, print its name
  list                                        list this sandbox's children
  destroy NAME                                destroy a child
  exec NAME [--timeout N] [--workdir D] -- CMD [ARGS...]
                                              run a command in a child
  run [--image I] [--timeout N] [--workdir D] -- CMD [ARGS...]
                                              run a command in a throwaway child

Global flags (before the command):
  --json      print the raw result as JSON
  -h, --help  show this help

Socket: $SANDBOX_CTL_SOCK or /run/sandbox-ctl.sock";

/// Deadline of a request without `--timeout`.
const BASE_DEADLINE: Duration = Duration::from_secs(300);
/// Slack beyond a command's own timeout.
const TIMEOUT_SLACK: Duration = Duration::from_secs(60);

/// A parsed command line.
#[derive(Debug, Clone, PartialEq)]
pub enum Invocation {
    /// `-h`/`--help`.
    Help,
    /// A request to send.
    Request {
        /// Print raw JSON.
        json: bool,
        /// Method name (also the command name).
        method: String,
        /// Its parameters.
        params: Map<String, Value>,
    },
}

/// Split `--flag value` / `--flag=value` options of `allowed` off the
/// front of `args`, stopping at `--` or the first positional.
fn flags<'a>(args: &'a [String], allowed: &[&str], out: &mut Map<String, Value>) -> Result<&'a [String], String> {
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        if a == "--" || !a.starts_with('-') || a == "-" {
            break;
        }
        let bare = a.trim_start_matches('-');
        let (name, inline) = match bare.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (bare, None),
        };
        if !allowed.contains(&name) {
            return Err(format!("unknown flag: {a}"));
        }
        let value = match inline {
            Some(v) => v,
            None => {
                i += 1;
                args.get(i).cloned().ok_or_else(|| format!("flag needs an argument: -{name}"))?
            }
        };
        let value = match name {
            "cpus" | "timeout" => {
                let n: i64 = value.parse().map_err(|_| format!("invalid value \"{value}\" for flag -{name}"))?;
                // Only non-zero numbers are sent.
                if n == 0 {
                    i += 1;
                    continue;
                }
                json!(n)
            }
            _ if value.is_empty() => {
                i += 1;
                continue;
            }
            _ => json!(value),
        };
        out.insert(name.to_string(), value);
        i += 1;
    }
    Ok(&args[i..])
}

/// Quote each argument for `sh` and join them.
pub fn shell_join(argv: &[String]) -> String {
    argv.iter().map(|a| format!("'{}'", a.replace('\'', "'\\''"))).collect::<Vec<_>>().join(" ")
}

/// `-- CMD [ARGS...]` into `params.command`.
fn command(rest: &[String], params: &mut Map<String, Value>) -> Result<(), String> {
    match rest.split_first() {
        Some((dd, argv)) if dd == "--" && !argv.is_empty() => {
            params.insert("command".into(), json!(shell_join(argv)));
            Ok(())
        }
        Some((dd, _)) if dd == "--" => Err("missing command after --".into()),
        _ => Err("usage: the command must follow --".into()),
    }
}

/// Parse the arguments (without the program name).
pub fn parse(args: &[String]) -> Result<Invocation, String> {
    let mut json = false;
    let mut i = 0;
    while let Some(a) = args.get(i).filter(|a| a.starts_with('-')) {
        match a.as_str() {
            "--json" | "-json" => json = true,
            "-h" | "--help" | "-help" => return Ok(Invocation::Help),
            other => return Err(format!("unknown flag: {other}")),
        }
        i += 1;
    }
    let Some(cmd) = args.get(i) else { return Err("no command given".into()) };
    let rest = &args[i + 1..];
    let mut params = Map::new();
    match cmd.as_str() {
        "ping" | "list" => {
            if !rest.is_empty() {
                return Err(format!("{cmd} takes no arguments"));
            }
        }
        "spawn" => {
            if !flags(rest, &["image", "name", "cpus", "memory"], &mut params)?.is_empty() {
                return Err("spawn takes no positional arguments".into());
            }
        }
        "destroy" => match rest {
            [name] if !name.starts_with('-') => {
                params.insert("name".into(), json!(name));
            }
            _ => return Err("usage: sandbox-ctl destroy NAME".into()),
        },
        "run" => {
            let rest = flags(rest, &["image", "timeout", "workdir"], &mut params)?;
            command(rest, &mut params)?;
        }
        "exec" => {
            let Some((name, rest)) = rest.split_first().filter(|(n, _)| !n.starts_with('-')) else {
                return Err("usage: sandbox-ctl exec NAME [--timeout N] [--workdir D] -- CMD [ARGS...]".into());
            };
            params.insert("name".into(), json!(name));
            let rest = flags(rest, &["timeout", "workdir"], &mut params)?;
            command(rest, &mut params)?;
        }
        other => return Err(format!("unknown command: {other}")),
    }
    Ok(Invocation::Request { json, method: cmd.clone(), params })
}

/// A child's remaining lifetime as the list shows it.
pub fn format_ttl(expires_at: Option<f64>, now: f64) -> String {
    let Some(at) = expires_at else { return "-".into() };
    let left = (at - now).floor();
    if left <= 0.0 {
        return "expired".into();
    }
    let s = left as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{}s", s / 60, s % 60),
        _ => format!("{}h{}m", s / 3600, s % 3600 / 60),
    }
}

/// The `list` table: left-aligned columns two spaces apart.
pub fn list_table(children: &[Value], now: f64) -> String {
    let mut rows = vec![["NAME", "IMAGE", "CPUS", "MEM(MB)", "TTL"].map(String::from).to_vec()];
    for c in children {
        let s = |k: &str| {
            c.get(k).map(|v| v.as_str().map(String::from).unwrap_or_else(|| v.to_string())).unwrap_or_default()
        };
        rows.push(vec![s("name"), s("image"), s("cpus"), s("memory_mb"), format_ttl(c["expires_at"].as_f64(), now)]);
    }
    let widths: Vec<usize> = (0..5).map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for r in rows {
        let cells: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(i, c)| if i < 4 { format!("{c:<w$}", w = widths[i]) } else { c.clone() })
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// The process exit code for a remote exit code.
pub fn normalize_exit(code: i64) -> i32 {
    if (0..=255).contains(&code) { code as i32 } else { 1 }
}

fn now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// Print an exec result: stdout verbatim (newline added if missing), each
/// stderr line as `[stderr] <line>`; returns the exit code.
fn print_exec(result: &Value, out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    let stdout = result["stdout"].as_str().unwrap_or("");
    let _ = out.write_all(stdout.as_bytes());
    if !stdout.is_empty() && !stdout.ends_with('\n') {
        let _ = out.write_all(b"\n");
    }
    for line in result["stderr"].as_str().unwrap_or("").lines().filter(|l| !l.is_empty()) {
        let _ = writeln!(err, "[stderr] {line}");
    }
    normalize_exit(result["exit_code"].as_i64().unwrap_or(1))
}

/// Run the CLI; returns the process exit code.
pub fn run(args: &[String], out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    let (json, method, params) = match parse(args) {
        Ok(Invocation::Help) => {
            let _ = writeln!(out, "{USAGE}");
            return 0;
        }
        Ok(Invocation::Request { json, method, params }) => (json, method, params),
        Err(msg) => {
            let _ = writeln!(err, "sandbox-ctl: {msg}\n{USAGE}");
            return 1;
        }
    };
    let name_arg = params.get("name").and_then(Value::as_str).unwrap_or_default().to_string();
    let deadline = match params.get("timeout").and_then(Value::as_u64) {
        Some(t) => BASE_DEADLINE.max(Duration::from_secs(t) + TIMEOUT_SLACK),
        None => BASE_DEADLINE,
    };
    let result = match client::call(&client::socket_path(), &method, Value::Object(params), deadline) {
        Ok(r) => r,
        Err(e) => {
            let _ = writeln!(err, "sandbox-ctl: {e}");
            return 1;
        }
    };
    let exec_like = matches!(method.as_str(), "exec" | "run");
    if json {
        let _ = writeln!(out, "{result}");
        return if exec_like { normalize_exit(result["result"]["exit_code"].as_i64().unwrap_or(1)) } else { 0 };
    }
    match method.as_str() {
        "ping" => {
            let _ = match result["parent"].as_str() {
                Some(p) => writeln!(out, "ok (parent: {p})"),
                None => writeln!(out, "ok"),
            };
        }
        "spawn" => {
            let _ = writeln!(out, "{}", result["name"].as_str().unwrap_or_default());
        }
        "destroy" => {
            let _ = writeln!(out, "{name_arg}");
        }
        "list" => {
            let children = result["children"].as_array().cloned().unwrap_or_default();
            let _ = out.write_all(list_table(&children, now()).as_bytes());
        }
        _ => return print_exec(&result["result"], out, err),
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Invocation, String> {
        parse(&args.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    fn req(args: &[&str]) -> (bool, String, Value) {
        match p(args).unwrap() {
            Invocation::Request { json, method, params } => (json, method, Value::Object(params)),
            Invocation::Help => panic!("help"),
        }
    }

    #[test]
    fn commands_and_flags() {
        assert_eq!(req(&["ping"]), (false, "ping".into(), json!({})));
        assert_eq!(req(&["--json", "list"]), (true, "list".into(), json!({})));
        assert_eq!(
            req(&["spawn", "--image", "img", "--cpus=2", "--memory", "256M", "--name", ""]),
            (false, "spawn".into(), json!({"image": "img", "cpus": 2, "memory": "256M"}))
        );
        assert_eq!(req(&["spawn", "--cpus", "0"]).2, json!({}));
        assert_eq!(req(&["destroy", "c1"]).2, json!({"name": "c1"}));
        assert_eq!(
            req(&["exec", "c1", "--timeout", "5", "--workdir", "/tmp", "--", "echo", "it's"]).2,
            json!({"name": "c1", "timeout": 5, "workdir": "/tmp", "command": "'echo' 'it'\\''s'"})
        );
        assert_eq!(req(&["run", "--", "ls", "-l"]).2, json!({"command": "'ls' '-l'"}));
        assert_eq!(p(&["-h"]).unwrap(), Invocation::Help);
        assert_eq!(p(&["--help", "ping"]).unwrap(), Invocation::Help);
    }

    #[test]
    fn usage_errors() {
        for bad in [
            &[][..],
            &["--bogus", "ping"],
            &["frobnicate"],
            &["ping", "extra"],
            &["spawn", "pos"],
            &["spawn", "--what", "x"],
            &["spawn", "--cpus", "many"],
            &["spawn", "--image"],
            &["destroy"],
            &["destroy", "a", "b"],
            &["exec", "c1", "echo"],
            &["exec", "--", "echo"],
            &["run", "echo"],
            &["run", "--"],
            &["list", "--json"],
        ] {
            assert!(p(bad).is_err(), "{bad:?} parsed");
        }
        assert_eq!(p(&["frobnicate"]).unwrap_err(), "unknown command: frobnicate");
    }

    #[test]
    fn ttl_formatting() {
        assert_eq!(format_ttl(None, 100.0), "-");
        assert_eq!(format_ttl(Some(100.0), 100.0), "expired");
        assert_eq!(format_ttl(Some(90.0), 100.0), "expired");
        assert_eq!(format_ttl(Some(145.5), 100.0), "45s");
        assert_eq!(format_ttl(Some(100.0 + 299.0), 100.0), "4m59s");
        assert_eq!(format_ttl(Some(100.0 + 7320.0), 100.0), "2h2m");
    }

    #[test]
    fn exit_codes_and_table() {
        assert_eq!((normalize_exit(0), normalize_exit(3), normalize_exit(-1), normalize_exit(256)), (0, 3, 1, 1));
        let t = list_table(
            &[json!({"name": "p-child-0001", "image": "img", "cpus": 1, "memory_mb": 256, "expires_at": null})],
            0.0,
        );
        assert_eq!(t, "NAME          IMAGE  CPUS  MEM(MB)  TTL\np-child-0001  img    1     256      -\n");
    }

    #[test]
    fn exec_output_shape() {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = print_exec(&json!({"stdout": "hi", "stderr": "a\n\nb\n", "exit_code": 300}), &mut out, &mut err);
        assert_eq!(
            (String::from_utf8(out).unwrap(), String::from_utf8(err).unwrap(), code),
            ("hi\n".into(), "[stderr] a\n[stderr] b\n".into(), 1)
        );
    }

    #[test]
    fn help_and_usage_exit_codes() {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        assert_eq!(run(&["-h".to_string()], &mut out, &mut err), 0);
        assert!(String::from_utf8(out).unwrap().starts_with("Usage: sandbox-ctl"));
        let (mut out, mut err) = (Vec::new(), Vec::new());
        assert_eq!(run(&["nope".to_string()], &mut out, &mut err), 1);
        assert!(String::from_utf8(err).unwrap().starts_with("sandbox-ctl: unknown command: nope\nUsage:"));
    }
}
