//! The text shapes of tool results, kept identical to the reference server's
//! so prompts written for it keep working (`[exit code N]`, `(12.3ms)`, the
//! status and history tables).
use sandbox_orchestrator::names;
use std::{
    borrow::Cow,
    time::{Duration, SystemTime},
};

use rmcp::{model::CallToolResult, schemars};

use sandbox_orchestrator::{
    Config, Sandbox,
    audit::AuditEntry,
    exec::{ExecResult, Outcome},
    helper_client::{BackgroundInfo, ExitStatus},
    network::Network,
    observe::{FULL_PCT, HIGH_PCT, Observation},
    text::{human_size, lossy, render},
};

/// Milliseconds with one decimal, as `(63.2ms)` prints them.
pub fn ms(d: Duration) -> String {
    format!("{:.1}ms", d.as_secs_f64() * 1000.0)
}

/// Seconds the way Python prints a float (`30.0`, `2.5`), as the reference's
/// `Timed out after 30.0s` does.
pub fn seconds(s: f64) -> String {
    if s.fract() == 0.0 { format!("{s:.1}") } else { format!("{s}") }
}

/// Output as one part of a result's lines: its final newline becomes the
/// line break before the next part, every other newline (blank lines at the
/// end included) stays, so the text shows what the structured result holds.
fn without_final_newline(mut text: String) -> String {
    if text.ends_with('\n') {
        text.pop();
    }
    text
}

/// A command's result: stdout, `[stderr] …`, `[exit code N]` when non-zero,
/// and the duration.
pub fn exec_result(r: &ExecResult, timeout_secs: f64) -> String {
    let mut lines = Vec::new();
    if !r.stdout.bytes.is_empty() {
        lines.push(without_final_newline(render(&r.stdout)));
    }
    let mut stderr = if r.stderr.bytes.is_empty() { String::new() } else { without_final_newline(render(&r.stderr)) };
    if r.outcome == Outcome::TimedOut {
        if !r.stderr.bytes.is_empty() {
            stderr.push('\n');
        }
        stderr.push_str(&format!(
            "Timed out after {}s (process group killed; output so far shown)",
            seconds(timeout_secs)
        ));
    }
    if !r.stderr.bytes.is_empty() || r.outcome == Outcome::TimedOut {
        lines.push(format!("[stderr] {stderr}"));
    }
    let code = r.exit_code();
    if code != 0 {
        match r.outcome {
            Outcome::Exited(ExitStatus::Signal(sig)) => {
                lines.push(format!("[exit code {code}] (killed by signal {sig})"))
            }
            _ => lines.push(format!("[exit code {code}]")),
        }
    }
    if let Some(why) = &r.history_unsaved {
        lines.push(format!("[history entry not saved: {why}]"));
    }
    lines.push(format!("({})", ms(r.duration)));
    lines.join("\n")
}

/// The structured result of exec and python, beside the text.
#[derive(Debug, serde::Serialize, schemars::JsonSchema)]
pub struct ExecOutput {
    /// Standard output (first 50,000 bytes; bytes that are not UTF-8 as U+FFFD).
    pub stdout: String,
    /// Standard error, same rules.
    pub stderr: String,
    /// The exact bytes of stdout, base64, when they are not valid UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stdout_base64: Option<String>,
    /// The exact bytes of stderr, base64, when they are not valid UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stderr_base64: Option<String>,
    /// Exit code; 128+N when killed by signal N; -1 on timeout.
    pub exit_code: i32,
    /// Wall-clock duration in milliseconds.
    pub duration_ms: f64,
    /// Whether stdout or stderr was cut at 50,000 bytes.
    pub truncated: bool,
    /// Whether the timeout killed the command.
    pub timed_out: bool,
    /// Why the command's history entry was not saved (a full disk), if not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub history_unsaved: Option<String>,
}

/// Bytes as base64 when the text alone would not carry them exactly.
fn exact_bytes(bytes: &[u8]) -> Option<String> {
    use base64::Engine as _;
    std::str::from_utf8(bytes).is_err().then(|| base64::engine::general_purpose::STANDARD.encode(bytes))
}

impl From<&ExecResult> for ExecOutput {
    fn from(r: &ExecResult) -> Self {
        Self {
            stdout: lossy(&r.stdout.bytes),
            stderr: lossy(&r.stderr.bytes),
            stdout_base64: exact_bytes(&r.stdout.bytes),
            stderr_base64: exact_bytes(&r.stderr.bytes),
            exit_code: r.exit_code(),
            duration_ms: (r.duration.as_secs_f64() * 10_000.0).round() / 10.0,
            truncated: r.stdout.truncated() || r.stderr.truncated(),
            timed_out: r.outcome == Outcome::TimedOut,
            history_unsaved: r.history_unsaved.clone(),
        }
    }
}

/// The structured result of `stats`.
#[derive(Debug, serde::Serialize, schemars::JsonSchema)]
pub struct StatsOutput {
    /// Sandbox name.
    pub sandbox: String,
    /// CPU limit.
    pub cpus: u32,
    /// Memory limit in bytes.
    pub memory_limit_bytes: u64,
    /// Memory in use in bytes (absent when the helper could not say).
    pub memory_used_bytes: Option<u64>,
    /// CPU time used, in seconds.
    pub cpu_seconds: Option<f64>,
    /// Processes now.
    pub pids: Option<u64>,
    /// Network bytes received and sent.
    pub net_rx_bytes: Option<u64>,
    /// Network bytes sent.
    pub net_tx_bytes: Option<u64>,
    /// Bytes the sandbox's own /workspace takes.
    pub disk_used_bytes: Option<u64>,
    /// Size in bytes of the filesystem holding /workspace.
    pub disk_size_bytes: Option<u64>,
    /// Disk counted against the quota (writable layer, /tmp, /workspace), in bytes.
    pub quota_used_bytes: Option<u64>,
    /// The disk quota in bytes.
    pub quota_limit_bytes: Option<u64>,
    /// Why the sandbox's writers were last stopped for the quota, if they were.
    pub quota_exceeded: Option<String>,
    /// Why cpu, memory and pids limits are not enforced, if they are not.
    pub limits_not_enforced: Option<String>,
    /// Seconds since the sandbox started.
    pub uptime_seconds: Option<u64>,
    /// A process was killed for exceeding the memory limit.
    pub oom_killed: bool,
    /// Running background process ids.
    pub background: Vec<String>,
    /// Commands in the history.
    pub history_commands: usize,
}

impl StatsOutput {
    /// The figures of `stats` as data.
    pub fn new(s: &Sandbox, obs: &Observation, bg: &[BackgroundInfo]) -> Self {
        let st = obs.stats.as_ref();
        Self {
            sandbox: s.shown(),
            cpus: s.cpus,
            memory_limit_bytes: s.memory_bytes,
            memory_used_bytes: st.map(|x| x.memory_used),
            cpu_seconds: st.map(|x| x.cpu_usage_ns as f64 / 1e9),
            pids: st.map(|x| x.pids),
            net_rx_bytes: st.map(|x| x.net_rx),
            net_tx_bytes: st.map(|x| x.net_tx),
            disk_used_bytes: obs.workspace_used,
            disk_size_bytes: obs.disk.map(|d| d.size),
            quota_used_bytes: st.filter(|x| x.disk_limit > 0).map(|x| x.disk_used),
            quota_limit_bytes: st.map(|x| x.disk_limit).filter(|&l| l > 0),
            quota_exceeded: st.and_then(|x| x.disk_quota_exceeded.clone()),
            limits_not_enforced: st.and_then(|x| x.limits_not_enforced.clone()),
            uptime_seconds: st.map(|x| x.uptime.as_secs()),
            oom_killed: st.is_some_and(|x| x.oom_killed),
            background: bg.iter().filter(|b| b.running).map(|b| b.name.clone()).collect(),
            history_commands: s.command_count(),
        }
    }
}

/// One command of the structured `history`.
#[derive(Debug, serde::Serialize, schemars::JsonSchema)]
pub struct HistoryEntry {
    /// The command (redacted, at most 200 characters).
    pub command: String,
    /// Its exit code (-1 for a timeout).
    pub exit_code: i32,
    /// How long it ran, in milliseconds.
    pub duration_ms: f64,
    /// Seconds since it finished.
    pub seconds_ago: u64,
}

/// The structured result of `history`, newest first.
#[derive(Debug, serde::Serialize, schemars::JsonSchema)]
pub struct HistoryOutput {
    /// Sandbox name.
    pub sandbox: String,
    /// Entries, newest first.
    pub entries: Vec<HistoryEntry>,
}

impl HistoryOutput {
    /// The history entries as data.
    pub fn new(sandbox: &str, entries: &[AuditEntry]) -> Self {
        let now = SystemTime::now();
        Self {
            sandbox: sandbox.to_string(),
            entries: entries
                .iter()
                .map(|e| HistoryEntry {
                    command: e.command.clone(),
                    exit_code: e.exit_code,
                    duration_ms: (e.duration.as_secs_f64() * 10_000.0).round() / 10.0,
                    seconds_ago: now.duration_since(e.at).unwrap_or_default().as_secs(),
                })
                .collect(),
        }
    }
}

/// Memory as `512M` / `2G`.
pub fn memory(bytes: u64) -> String {
    let mib = bytes >> 20;
    if mib >= 1024 && mib.is_multiple_of(1024) { format!("{}G", mib / 1024) } else { format!("{mib}M") }
}

/// One `status` line for a sandbox; `unlimited` says why its cpu, memory
/// and pids limits are not enforced, if they are not.
pub fn status_line(s: &Sandbox, alive: bool, unlimited: Option<&str>) -> String {
    let mut fields = vec![
        format!("  {:<12} {}", s.shown(), s.shown()),
        format!("shell:{}", if alive { "alive" } else { "dead" }),
        format!("idle:{}s", s.idle().as_secs()),
        format!("{}cpu/{}", s.cpus, memory(s.memory_bytes)),
        format!("isolation:{}", s.isolation),
    ];
    if let Some(parent) = &s.parent {
        fields.push(format!("parent:{}", names::display(parent)));
    }
    let cmds = s.command_count();
    if cmds > 0 {
        fields.push(format!("cmds:{cmds}"));
    }
    if let Some(left) = s.lease_remaining() {
        fields.push(format!("lease:{}m{}s", left.as_secs() / 60, left.as_secs() % 60));
    }
    if let Some(why) = unlimited {
        fields.push(limits_not_enforced(why));
    }
    fields.join("  ")
}

fn network(n: &Network) -> String {
    match n {
        Network::None => "none (loopback only)".to_string(),
        Network::Egress(p) if p.is_default() => "egress (outbound only)".to_string(),
        Network::Egress(p) => format!("egress (outbound only, {})", p.summary()),
    }
}

/// The lines under the sandbox list in `status`.
pub fn status_footer(c: &Config) -> Vec<String> {
    let d = c.defaults();
    let mut lines = vec![
        format!("Image:    {}", d.image),
        // The vm driver shares only /workspace into its guest.
        "Volumes:  per-sandbox (workspace; apt/pip/npm caches on namespace sandboxes, none on vm ones)".to_string(),
        format!("Network:  {}", network(&d.network)),
    ];
    let mut profiles: Vec<String> = c
        .profiles()
        .map(|(n, p)| format!("{n}({}cpu/{}, {})", p.cpus, memory(p.memory_bytes), network(&p.network)))
        .collect();
    if !profiles.is_empty() {
        profiles.sort();
        lines.push(format!("Profiles: {}", profiles.join(", ")));
    }
    lines
}

/// The `Port forwards:`, `Sync jobs:` and `Lost:` blocks of `status` (each
/// only when it has entries).
pub fn status_blocks(
    forwards: &[sandbox_orchestrator::forward::ForwardInfo],
    syncs: &[sandbox_orchestrator::sync::SyncInfo],
    lost: &std::collections::BTreeMap<String, String>,
) -> Vec<String> {
    let mut lines = Vec::new();
    if !forwards.is_empty() {
        lines.push("Port forwards:".to_string());
        lines.extend(forwards.iter().map(|f| {
            format!(
                "  localhost:{} -> '{}':{} ({} conns)",
                f.host_port,
                names::display(&f.sandbox),
                f.port,
                f.connections
            )
        }));
    }
    if !syncs.is_empty() {
        lines.push("Sync jobs:".to_string());
        lines.extend(syncs.iter().map(|j| {
            format!(
                "  {}: {} -> {}:{} ({} files, running)",
                j.id,
                j.local.display(),
                names::display(&j.sandbox),
                j.dir,
                j.files_synced
            )
        }));
    }
    if !lost.is_empty() {
        lines.push("Lost (the next call on one starts it again; destroy forgets it):".to_string());
        lines.extend(lost.iter().map(|(name, why)| format!("  {}: {why}", names::display(name))));
    }
    lines
}

/// The `list_all` table.
pub fn list_table(rows: &[(std::sync::Arc<Sandbox>, bool)]) -> String {
    let mut out = vec![
        format!(
            "{:<12}  {:<16}  {:<6}  {:>8}  {:<10}  {:<10}  {}",
            "Name", "Container", "Shell", "Idle", "Resources", "Isolation", "Project"
        ),
        "─".repeat(102),
    ];
    for (s, alive) in rows {
        let dir = s.project_dir.as_ref().map(|d| d.display().to_string()).unwrap_or_else(|| "(before projects)".into());
        out.push(format!(
            "{:<12}  {:<16}  {:<6}  {:>8}  {:<10}  {:<10}  {}:{} {dir}",
            s.shown(),
            s.shown(),
            if *alive { "alive" } else { "dead" },
            format!("{}s", s.idle().as_secs()),
            format!("{}cpu/{}", s.cpus, memory(s.memory_bytes)),
            s.isolation.as_str(),
            s.project_id(),
            s.plain()
        ));
    }
    out.join("\n")
}

/// The `history` listing, newest first.
pub fn history(sandbox: &str, entries: &[AuditEntry]) -> String {
    let now = SystemTime::now();
    let mut out = vec![format!("Recent commands in '{sandbox}' ({} shown):", entries.len())];
    for (i, e) in entries.iter().enumerate() {
        let status = if e.exit_code == 0 { "ok".to_string() } else { format!("exit:{}", e.exit_code) };
        let ago = now.duration_since(e.at).unwrap_or_default().as_secs();
        out.push(format!(
            "  {:>2}. [{status}] {:.0}ms {ago}s ago  {}",
            i + 1,
            e.duration.as_secs_f64() * 1000.0,
            e.command
        ));
    }
    out.join("\n")
}

/// The `env list` text.
pub fn env_list(sandbox: &str, env: &std::collections::BTreeMap<String, String>) -> String {
    if env.is_empty() {
        return "No persistent env vars set. Use env(action='set', key='FOO', value='bar').".to_string();
    }
    format!("Persistent env vars in '{sandbox}':\n{}", sandbox_orchestrator::env::profile_script(env).trim_end())
}

/// The last lines of an install that say what was installed.
pub fn install_summary(stdout: &str, packages: &[String]) -> String {
    let lines: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("Setting up") || l.starts_with("OK:") || l.to_lowercase().contains("installing"))
        .collect();
    if lines.is_empty() {
        format!("Installed {}", packages.join(" "))
    } else {
        lines[lines.len().saturating_sub(5)..].join("\n")
    }
}

/// The command of a background process as the user gave it.
fn process_command(info: &BackgroundInfo) -> String {
    match info.argv.as_slice() {
        [_, flag, line] if flag == "-c" => line.clone(),
        argv => argv.join(" "),
    }
}

fn process_state(info: &BackgroundInfo) -> String {
    match (info.running, info.exit) {
        (true, _) => "alive".to_string(),
        (false, Some(ExitStatus::Code(c))) => format!("dead, exit code {c}"),
        (false, Some(ExitStatus::Signal(s))) => format!("dead, killed by signal {s}"),
        (false, None) => "dead".to_string(),
    }
}

/// The `logs` text.
pub fn process_log(info: &BackgroundInfo, output: &[u8]) -> String {
    let text = lossy(output);
    let body = if text.is_empty() { "(no output yet)".to_string() } else { text.trim_end_matches('\n').to_string() };
    format!(
        "[{}] PID {} ({}) — {}\n{}\n{body}",
        info.name,
        info.pid,
        process_state(info),
        process_command(info),
        "─".repeat(40)
    )
}

/// The `kill` text.
pub fn killed(info: &BackgroundInfo, output: &[u8]) -> String {
    let text = lossy(output);
    let text = text.trim_end_matches('\n');
    let mut out = format!("Killed [{}] PID {}", info.name, info.pid);
    if !text.is_empty() {
        out.push_str(&format!("\nLast output:\n{text}"));
    }
    out
}

fn uptime(d: Duration) -> String {
    format!("{}m {}s", d.as_secs() / 60, d.as_secs() % 60)
}

/// How `status`, `stats` and `health` say a sandbox has no cgroup limits.
fn limits_not_enforced(why: &str) -> String {
    format!("limits: not enforced ({why})")
}

/// The `stats` text.
pub fn stats(s: &Sandbox, obs: &Observation, bg: &[BackgroundInfo]) -> String {
    let mut lines = vec![format!("Sandbox: {} ('{}', {}cpu/{})", s.shown(), s.shown(), s.cpus, memory(s.memory_bytes))];
    match &obs.stats {
        Some(st) => {
            let pct = obs.mem_pct().map(|p| format!(" ({p}%)")).unwrap_or_default();
            lines.push(format!("Memory:  {} / {}{pct}", human_size(st.memory_used), human_size(st.memory_limit)));
            lines.push(format!("CPU:     {:.2}s total", st.cpu_usage_ns as f64 / 1e9));
            lines.push(format!("Net:     {} rx / {} tx", human_size(st.net_rx), human_size(st.net_tx)));
            lines.push(format!("PIDs:    {}", st.pids));
            if st.oom_killed {
                lines.push("OOM:     a process was killed for exceeding the memory limit".to_string());
            }
            if let Some(pct) = obs.quota_pct() {
                let (used, limit) = (human_size(st.disk_used), human_size(st.disk_limit));
                lines.push(format!("Quota:   {used} / {limit} ({pct}%; writable layer, /tmp and /workspace)"));
            }
            if let Some(reason) = &st.disk_quota_exceeded {
                lines.push(format!("Quota:   {reason}"));
            }
            if let Some(why) = &st.limits_not_enforced {
                lines.push(format!("Limits:  {}", limits_not_enforced(why)));
            }
        }
        None => lines.push("Stats:   unavailable".to_string()),
    }
    if let Some(d) = obs.disk {
        let own =
            obs.workspace_used.map(|u| format!("{} in /workspace; filesystem ", human_size(u))).unwrap_or_default();
        lines.push(format!("Disk:    {own}{}/{} ({}% used)", human_size(d.used), human_size(d.size), d.pct()));
    }
    if let Some(st) = &obs.stats {
        lines.push(format!("Uptime:  {}", uptime(st.uptime)));
    }
    let running: Vec<&str> = bg.iter().filter(|b| b.running).map(|b| b.name.as_str()).collect();
    if !running.is_empty() {
        lines.push(format!("BgProcs: {}", running.join(", ")));
    }
    lines.push(format!("History: {} commands", s.command_count()));
    lines.join("\n")
}

fn mark(pct: u64, full: &str) -> &'static str {
    if pct >= FULL_PCT {
        if full == "OOM" { " OOM" } else { " FULL" }
    } else if pct >= HIGH_PCT {
        " HIGH"
    } else {
        ""
    }
}

/// The `health` text.
pub fn health(rows: &[(std::sync::Arc<Sandbox>, Observation)]) -> String {
    if rows.is_empty() {
        return "No active sandboxes".to_string();
    }
    let mut issues = 0;
    let mut lines = Vec::new();
    for (s, obs) in rows {
        let mut fields = vec![
            format!("{}:", s.shown()),
            format!("shell={}", if obs.alive { "ok" } else { "DEAD" }),
            format!("isolation={}", s.isolation),
        ];
        if !obs.alive {
            issues += 1;
        }
        if let Some(d) = obs.disk {
            let pct = d.pct();
            issues += usize::from(pct >= HIGH_PCT);
            fields.push(format!("disk={pct}%{}", mark(pct, "FULL")));
        }
        if let Some(pct) = obs.mem_pct() {
            let oom = obs.stats.as_ref().is_some_and(|st| st.oom_killed);
            issues += usize::from(pct >= HIGH_PCT || oom);
            let m = if oom { " OOM" } else { mark(pct, "OOM") };
            fields.push(format!("mem={pct}%{m}"));
        }
        if let Some(pct) = obs.quota_pct() {
            issues += usize::from(pct >= HIGH_PCT);
            fields.push(format!("quota={pct}%{}", mark(pct, "FULL")));
        }
        if let Some(st) = &obs.stats {
            fields.push(format!("up={}m{}s", st.uptime.as_secs() / 60, st.uptime.as_secs() % 60));
            fields.push(format!("procs={}", st.pids));
            if let Some(why) = &st.limits_not_enforced {
                fields.push(limits_not_enforced(why));
            }
        }
        lines.push(fields.join("  "));
    }
    let mut out = vec![format!("{} sandbox(es), {issues} issue(s)", rows.len())];
    out.extend(lines);
    out.join("\n")
}

/// Whether `c` is a terminal control character that must not reach a
/// client's terminal raw: C0 except newline, carriage return and tab; DEL;
/// C1 (`ESC ]0;…BEL` retitles a terminal, `CSI 2J` clears it, C1 `CSI`
/// does the same in one character on some terminals).
fn is_terminal_control(c: char) -> bool {
    matches!(c, '\0'..='\x08' | '\x0b' | '\x0c' | '\x0e'..='\x1f' | '\x7f' | '\u{80}'..='\u{9f}')
}

/// `text` with terminal control characters as visible escapes: `\x1b`,
/// `\x07`, `\x7f` for C0 and DEL, `\u009b` for C1; `\n`, `\r`, `\t` stay.
pub fn visible_controls(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_terminal_control) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            c if c <= '\x7f' && is_terminal_control(c) => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if is_terminal_control(c) => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Put the notices of sandboxes a call brought back (see
/// `SandboxManager::revive`) into its answer's text.
pub fn add_notices(result: &mut CallToolResult, notices: &[String]) {
    if notices.is_empty() {
        return;
    }
    // A block of its own, never merged into the tool's text (a file's
    // content, a command's output). A success leads with it; a failure
    // keeps its `Error: …` first, where clients look for it.
    let notice = notices.join("\n");
    if result.is_error == Some(true) {
        result.content.push(rmcp::model::ContentBlock::text(format!("\n{notice}")));
    } else {
        result.content.insert(0, rmcp::model::ContentBlock::text(format!("{notice}\n")));
    }
}

/// Apply [`visible_controls`] to every text block of a tool result: the one
/// place tool text leaves the server (called from `call_tool`), so sandbox
/// bytes reach no terminal raw whichever tool carried them. The
/// `structuredContent` stays exact: it is data for programs (exit codes,
/// byte-exact stdout), and JSON already carries control characters as
/// `\u001b` escapes; a client that prints it must escape it itself.
pub fn make_controls_visible(result: &mut CallToolResult) {
    for block in &mut result.content {
        if let rmcp::model::ContentBlock::Text(t) = block
            && let Cow::Owned(escaped) = visible_controls(&t.text)
        {
            t.text = escaped;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_orchestrator::exec::Captured;

    #[test]
    fn terminal_controls_become_visible() {
        assert_eq!(visible_controls("\x1b]0;pwned\x07\x1b[2J"), "\\x1b]0;pwned\\x07\\x1b[2J");
        assert_eq!(visible_controls("a\nb\r\tc ü €"), "a\nb\r\tc ü €");
        assert!(matches!(visible_controls("plain\n"), Cow::Borrowed(_)));
        assert_eq!(visible_controls("\0\x7f\u{9b}2J\u{85}"), "\\x00\\x7f\\u009b2J\\u0085");
        let mut r = CallToolResult::success(vec![rmcp::model::ContentBlock::text("\x1b[31mred")]);
        r.structured_content = Some(serde_json::json!({"stdout": "\x1b[31mred"}));
        make_controls_visible(&mut r);
        assert_eq!(r.content[0].as_text().map(|t| t.text.as_str()), Some("\\x1b[31mred"));
        assert_eq!(r.structured_content.unwrap()["stdout"], "\x1b[31mred");
    }

    fn result(out: &str, err: &str, outcome: Outcome) -> ExecResult {
        let cap = |s: &str| Captured { bytes: s.as_bytes().to_vec(), total: s.len() as u64 };
        ExecResult {
            stdout: cap(out),
            stderr: cap(err),
            outcome,
            duration: Duration::from_micros(1234),
            history_unsaved: None,
        }
    }

    #[test]
    fn exec_shapes() {
        assert_eq!(exec_result(&result("hi\n", "", Outcome::Exited(ExitStatus::Code(0))), 30.0), "hi\n(1.2ms)");
        assert_eq!(
            exec_result(&result("", "bad\n", Outcome::Exited(ExitStatus::Code(2))), 30.0),
            "[stderr] bad\n[exit code 2]\n(1.2ms)"
        );
        let t = exec_result(&result("part", "", Outcome::TimedOut), 2.0);
        assert!(t.starts_with("part\n[stderr] Timed out after 2.0s"), "{t}");
        assert!(t.contains("[exit code -1]"), "{t}");
        let k = exec_result(&result("", "", Outcome::Exited(ExitStatus::Signal(9))), 1.0);
        assert!(k.starts_with("[exit code 137] (killed by signal 9)"), "{k}");
    }

    #[test]
    fn helpers() {
        assert_eq!(seconds(30.0), "30.0");
        assert_eq!(seconds(2.5), "2.5");
        assert_eq!(memory(512 << 20), "512M");
        assert_eq!(memory(2 << 30), "2G");
        assert_eq!(install_summary("x\nSetting up jq (1.6)\n", &["jq".into()]), "Setting up jq (1.6)");
        assert_eq!(install_summary("", &["jq".into()]), "Installed jq");
    }
}
