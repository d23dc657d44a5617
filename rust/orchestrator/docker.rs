//! Docker workloads in vm sandboxes: the `docker_*` tools' requests turned
//! into docker / docker compose argvs, validated argument by argument, and
//! run inside the sandbox through the ordinary exec path (timeouts, output
//! caps, history).
//!
//! User input only ever becomes argv elements, never shell text: every
//! command runs as `sh -c PRELUDE sandbox-docker ARGS…`, where the prelude
//! is a fixed script that checks the image has Docker Engine, waits for the
//! guest's dockerd (started at boot by the guest init, see
//! `rust/guest/containers.rs`) and then `exec`s `docker "$@"` (or
//! `docker-compose "$@"` for compose, Debian bookworm's Compose). Values an
//! argument parser would take for options (a leading `-`) are refused where
//! docker would read them as options.
//!
//! Containers need their own kernel: on the namespace driver dockerd would
//! need the host's privileges, so the tools refuse there and name the fix.
use std::net::IpAddr;
use std::sync::LazyLock;
use std::time::Duration;

use regex::Regex;

use super::{
    OrchestratorError, SandboxManager,
    exec::ExecResult,
    names,
    sandbox::{Command, Origin, WORKSPACE},
};

/// The fixed script every docker command runs under (`$@` is the docker
/// argv). 125 is docker's own "the daemon failed" status.
const PRELUDE: &str = r#"command -v docker >/dev/null 2>&1 || { echo "this sandbox's image has no Docker Engine (no docker command): build one with the docker.io and docker-compose packages and use it as the sandbox's image" >&2; exit 127; }
i=0
while [ ! -S /var/run/docker.sock ]; do
  i=$((i+1))
  if [ "$i" -gt 1200 ]; then echo "dockerd is not running in this sandbox (no /var/run/docker.sock after 120 s); its log is /var/log/dockerd.log" >&2; exit 125; fi
  sleep 0.1
done
if [ "$1" = compose ] && command -v docker-compose >/dev/null 2>&1; then shift; exec docker-compose "$@"; fi
exec docker "$@""#;

/// `$0` of the prelude, as `ps` and error messages show it.
const PRELUDE_NAME: &str = "sandbox-docker";

/// Timeouts, as the reference's tools had them.
const BUILD_TIMEOUT: Duration = Duration::from_secs(1800);
const RUN_TIMEOUT: Duration = Duration::from_secs(1200);
const LOGS_TIMEOUT: Duration = Duration::from_secs(600);
const FOLLOW_TIMEOUT: Duration = Duration::from_secs(30);
const COMPOSE_TIMEOUT: Duration = Duration::from_secs(1200);
const LIST_TIMEOUT: Duration = Duration::from_secs(120);
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(600);
/// Longest `timeout_seconds` a docker_exec may ask for.
pub const MAX_EXEC_TIMEOUT_SECS: f64 = 3600.0;

/// What `docker_compose` can do.
pub const COMPOSE_ACTIONS: [&str; 9] = ["up", "down", "ps", "logs", "pull", "build", "restart", "stop", "exec"];
/// What `docker_cleanup` can do.
pub const CLEANUP_MODES: [&str; 2] = ["safe", "aggressive"];

/// A docker command ready to run in a sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DockerCommand {
    /// The docker argv after `docker` (`compose …` for compose).
    pub args: Vec<String>,
    /// Working directory in the guest.
    pub cwd: String,
    /// Wall-clock limit.
    pub timeout: Duration,
    /// Whether it may create the sandbox on first use (build, run,
    /// compose); the others only read or act on what exists, and, like
    /// every read-only tool, never create one.
    pub creates_sandbox: bool,
}

impl DockerCommand {
    fn new(args: Vec<String>, timeout: Duration) -> Self {
        Self { args, cwd: WORKSPACE.to_string(), timeout, creates_sandbox: false }
    }

    fn creating(self) -> Self {
        Self { creates_sandbox: true, ..self }
    }

    /// The command as a shell would read it (`docker build -t app .`), for
    /// the result and the history.
    pub fn display(&self) -> String {
        let words = std::iter::once("docker").chain(self.args.iter().map(String::as_str));
        shlex::try_join(words).unwrap_or_else(|_| format!("docker {}", self.args.join(" ")))
    }
}

/// `docker_build`'s request.
#[derive(Debug, Clone, Default)]
pub struct BuildRequest {
    /// The build context, relative to /workspace unless absolute.
    pub context_path: String,
    /// The tag of the image built.
    pub image_tag: String,
    /// The Dockerfile, relative to /workspace unless absolute.
    pub dockerfile: Option<String>,
    /// `--build-arg KEY=VALUE` pairs.
    pub build_args: Vec<(String, String)>,
    /// The stage to build.
    pub target: Option<String>,
    /// `--no-cache`.
    pub no_cache: bool,
}

/// `docker_run`'s request.
#[derive(Debug, Clone, Default)]
pub struct RunRequest {
    /// Image reference.
    pub image: String,
    /// Command and arguments, split into words as a shell would (no
    /// expansion).
    pub command: Option<String>,
    /// Container name.
    pub name: Option<String>,
    /// `-e KEY=VALUE` pairs.
    pub env: Vec<(String, String)>,
    /// `SOURCE:DEST[:ro|rw]` bind mounts and named volumes.
    pub volumes: Vec<String>,
    /// `[IP:][HOST_PORT:]CONTAINER_PORT[/PROTO]` publications.
    pub ports: Vec<String>,
    /// Working directory inside the container.
    pub workdir: Option<String>,
    /// `-d`.
    pub detach: bool,
    /// `--privileged`.
    pub privileged: bool,
}

/// `docker_logs`'s request.
#[derive(Debug, Clone, Default)]
pub struct LogsRequest {
    /// Container name or id.
    pub container: String,
    /// Last lines; 0 or less shows all.
    pub tail: i64,
    /// Follow for up to 30 s.
    pub follow: bool,
    /// `--since`.
    pub since: Option<String>,
}

/// `docker_compose`'s request.
#[derive(Debug, Clone, Default)]
pub struct ComposeRequest {
    /// The project's directory, relative to /workspace unless absolute.
    pub project_dir: String,
    /// One of [`COMPOSE_ACTIONS`].
    pub action: String,
    /// The compose file, relative to the project directory unless absolute.
    pub file: Option<String>,
    /// Services to act on (exec: the first).
    pub services: Vec<String>,
    /// `up -d`.
    pub detach: bool,
    /// exec: the shell command line.
    pub command: Option<String>,
    /// logs: follow for up to 30 s.
    pub follow: bool,
    /// logs: `--since`.
    pub since: Option<String>,
    /// logs: `--tail`.
    pub tail: Option<i64>,
}

fn invalid(arg: &str, what: impl std::fmt::Display) -> OrchestratorError {
    OrchestratorError::InvalidArgument(format!("argument `{arg}`: {what}"))
}

/// Text that can be an argv element at all.
fn plain(arg: &str, value: &str) -> Result<(), OrchestratorError> {
    if value.contains('\0') {
        return Err(invalid(arg, "contains a NUL byte"));
    }
    Ok(())
}

/// A value docker would otherwise parse as an option.
fn not_an_option(arg: &str, value: &str) -> Result<(), OrchestratorError> {
    plain(arg, value)?;
    if value.is_empty() {
        return Err(invalid(arg, "is empty"));
    }
    if value.starts_with('-') {
        return Err(invalid(arg, format!("'{value}' starts with '-' (docker would read it as an option)")));
    }
    Ok(())
}

/// A path in the guest: relative ones are under /workspace (the command's
/// working directory).
fn guest_path(arg: &str, value: &str) -> Result<String, OrchestratorError> {
    not_an_option(arg, value)?;
    Ok(value.to_string())
}

/// An image reference: `[registry[:port]/]name[:tag][@digest]`, docker's
/// grammar (lowercase path components).
static IMAGE_REF: LazyLock<Regex> = LazyLock::new(|| {
    let domain = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])(?:\.(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]))*(?::[0-9]+)?";
    let component = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*";
    let tag = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}";
    Regex::new(&format!(r"^(?:{domain}/)?{component}(?:/{component})*(?::{tag})?(?:@sha256:[a-f0-9]{{64}})?$"))
        .expect("image reference regex")
});

/// Container, service, stage and volume names: docker's `[a-zA-Z0-9][a-zA-Z0-9_.-]*`.
static NAME: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]*$").expect("name regex"));

fn image_ref(arg: &str, value: &str, digest_allowed: bool) -> Result<(), OrchestratorError> {
    plain(arg, value)?;
    let ok = value.len() <= 255 && IMAGE_REF.is_match(value) && (digest_allowed || !value.contains('@'));
    if ok {
        Ok(())
    } else {
        Err(invalid(
            arg,
            format!(
                "'{value}' is not an image reference (name[:tag]: lowercase letters, digits and separators . _ - in \
                 the name, at most 128 characters of letters, digits, . _ - in the tag, e.g. 'app:1.0'{})",
                if digest_allowed { ", or name@sha256:<digest>" } else { "" }
            ),
        ))
    }
}

fn name(arg: &str, value: &str) -> Result<(), OrchestratorError> {
    plain(arg, value)?;
    if NAME.is_match(value) {
        Ok(())
    } else {
        Err(invalid(arg, format!("'{value}' is not a valid name (must match [a-zA-Z0-9][a-zA-Z0-9_.-]*)")))
    }
}

/// A `KEY=VALUE` pair for `-e` or `--build-arg`: the key cannot hold '='.
fn key_value(arg: &str, key: &str, value: &str) -> Result<String, OrchestratorError> {
    plain(arg, value)?;
    if names::validate_env_key(key).is_err() {
        return Err(invalid(
            arg,
            format!("key '{key}' is not a variable name (must match [A-Za-z_][A-Za-z0-9_]*, no '=')"),
        ));
    }
    Ok(format!("{key}={value}"))
}

fn since(arg: &str, value: &str) -> Result<(), OrchestratorError> {
    not_an_option(arg, value)?;
    if value.chars().all(|c| c.is_ascii_alphanumeric() || ":.+-".contains(c)) {
        Ok(())
    } else {
        Err(invalid(
            arg,
            format!("'{value}' is not a time (a duration like '10m' or a timestamp like '2026-12-01T00:00:00')"),
        ))
    }
}

/// A port or a range `a-b`, each 1–65535.
fn port_range(text: &str) -> bool {
    let port = |p: &str| {
        !p.is_empty()
            && p.len() <= 5
            && p.bytes().all(|b| b.is_ascii_digit())
            && (1..=65535).contains(&p.parse::<u32>().unwrap_or(0))
    };
    match text.split_once('-') {
        Some((a, b)) => port(a) && port(b) && a.parse::<u32>().ok() <= b.parse::<u32>().ok(),
        None => port(text),
    }
}

/// `[IP:][HOST_PORT:]CONTAINER_PORT[/tcp|udp|sctp]`; IPv6 addresses in brackets.
fn port_spec(value: &str) -> Result<(), OrchestratorError> {
    let bad = |why: &str| {
        invalid(
            "ports",
            format!(
                "'{value}' {why} (expected [IP:][HOST_PORT:]CONTAINER_PORT[/tcp|udp], ports 1-65535, e.g. '8080:80')"
            ),
        )
    };
    plain("ports", value)?;
    let (spec, proto) = match value.rsplit_once('/') {
        Some((s, p)) => (s, Some(p)),
        None => (value, None),
    };
    if proto.is_some_and(|p| !matches!(p, "tcp" | "udp" | "sctp")) {
        return Err(bad("names an unknown protocol"));
    }
    let (ip, rest) = match spec.strip_prefix('[') {
        Some(v6) => match v6.split_once("]:") {
            Some((ip, rest)) => (Some(ip), rest),
            None => return Err(bad("has an unclosed IPv6 address")),
        },
        None => {
            let parts: Vec<&str> = spec.split(':').collect();
            match parts.len() {
                3 => (Some(parts[0]), &spec[parts[0].len() + 1..]),
                1 | 2 => (None, spec),
                _ => return Err(bad("has too many ':'")),
            }
        }
    };
    if ip.is_some_and(|ip| ip.parse::<IpAddr>().is_err()) {
        return Err(bad("has an IP address that does not parse"));
    }
    let ok = match rest.split_once(':') {
        // `IP::80` publishes on a port docker picks.
        Some((host, container)) => (host.is_empty() && ip.is_some() || port_range(host)) && port_range(container),
        None => port_range(rest),
    };
    if ok { Ok(()) } else { Err(bad("has a port that is not a number from 1 to 65535")) }
}

/// `SOURCE:DEST[:ro|rw]`. The source is a path in the VM (the sandbox's
/// own filesystem: docker runs in the guest and never sees the host), a
/// path relative to /workspace (no `..`), or a named volume.
fn volume_spec(value: &str) -> Result<String, OrchestratorError> {
    let bad = |why: String| {
        invalid(
            "volumes",
            format!(
                "'{value}' {why} (expected SOURCE:DEST[:ro|rw] with an absolute DEST; SOURCE a path in the sandbox, \
                 relative to /workspace unless absolute, or a volume name)"
            ),
        )
    };
    plain("volumes", value)?;
    let parts: Vec<&str> = value.split(':').collect();
    let (source, dest, mode) = match parts.as_slice() {
        [s, d] => (*s, *d, None),
        [s, d, m] => (*s, *d, Some(*m)),
        _ => return Err(bad("does not have two or three ':'-separated parts".into())),
    };
    if let Some(m) = mode.filter(|m| !matches!(*m, "ro" | "rw")) {
        return Err(bad(format!("has mode '{m}', not ro or rw")));
    }
    if !dest.starts_with('/') {
        return Err(bad(format!("has destination '{dest}', which is not absolute")));
    }
    let source = if source.starts_with('/') {
        source.to_string()
    } else if source.contains('/') || source == "." {
        if source.split('/').any(|c| c == "..") {
            return Err(bad(format!("has source '{source}', which leaves /workspace through '..'")));
        }
        format!("{WORKSPACE}/{}", source.trim_start_matches("./"))
    } else if NAME.is_match(source) {
        source.to_string()
    } else {
        return Err(bad(format!("has source '{source}', neither a path nor a volume name")));
    };
    Ok(match mode {
        Some(m) => format!("{source}:{dest}:{m}"),
        None => format!("{source}:{dest}"),
    })
}

/// `docker build`.
pub fn build(r: &BuildRequest) -> Result<DockerCommand, OrchestratorError> {
    image_ref("image_tag", &r.image_tag, false)?;
    let context = guest_path("context_path", &r.context_path)?;
    let mut args = vec!["build".to_string(), "-t".into(), r.image_tag.clone()];
    if let Some(f) = &r.dockerfile {
        args.extend(["-f".into(), guest_path("dockerfile", f)?]);
    }
    for (k, v) in &r.build_args {
        args.extend(["--build-arg".into(), key_value("build_args", k, v)?]);
    }
    if let Some(t) = &r.target {
        name("target", t)?;
        args.extend(["--target".into(), t.clone()]);
    }
    if r.no_cache {
        args.push("--no-cache".into());
    }
    args.push(context);
    Ok(DockerCommand::new(args, BUILD_TIMEOUT).creating())
}

/// `docker run`.
pub fn run(r: &RunRequest) -> Result<DockerCommand, OrchestratorError> {
    image_ref("image", &r.image, true)?;
    let mut args = vec!["run".to_string()];
    if r.detach {
        args.push("-d".into());
    }
    if let Some(n) = &r.name {
        name("name", n)?;
        args.extend(["--name".into(), n.clone()]);
    }
    for (k, v) in &r.env {
        args.extend(["-e".into(), key_value("env", k, v)?]);
    }
    for v in &r.volumes {
        args.extend(["-v".into(), volume_spec(v)?]);
    }
    for p in &r.ports {
        port_spec(p)?;
        args.extend(["-p".into(), p.clone()]);
    }
    if let Some(w) = &r.workdir {
        plain("workdir", w)?;
        if !w.starts_with('/') {
            return Err(invalid("workdir", format!("'{w}' is not an absolute path in the container")));
        }
        args.extend(["-w".into(), w.clone()]);
    }
    if r.privileged {
        // Privileged inside the VM only: the guest kernel is the boundary.
        args.push("--privileged".into());
    }
    args.push(r.image.clone());
    if let Some(c) = &r.command {
        plain("command", c)?;
        let words = shlex::split(c).ok_or_else(|| invalid("command", "has an unclosed quote or a trailing '\\'"))?;
        args.extend(words);
    }
    Ok(DockerCommand::new(args, RUN_TIMEOUT).creating())
}

/// `docker exec CONTAINER sh -c COMMAND`.
pub fn exec(container: &str, command: &str, timeout_secs: f64) -> Result<DockerCommand, OrchestratorError> {
    name("container", container)?;
    plain("command", command)?;
    if command.trim().is_empty() {
        return Err(invalid("command", "is empty"));
    }
    if !(timeout_secs.is_finite() && timeout_secs > 0.0 && timeout_secs <= MAX_EXEC_TIMEOUT_SECS) {
        return Err(invalid(
            "timeout_seconds",
            format!("must be greater than 0 and at most {MAX_EXEC_TIMEOUT_SECS} (got {timeout_secs})"),
        ));
    }
    let args = ["exec", container, "sh", "-c", command].map(String::from).to_vec();
    Ok(DockerCommand::new(args, Duration::from_secs_f64(timeout_secs)))
}

/// `docker logs`.
pub fn logs(r: &LogsRequest) -> Result<DockerCommand, OrchestratorError> {
    name("container", &r.container)?;
    let tail = if r.tail > 0 { r.tail.to_string() } else { "all".to_string() };
    let mut args = vec!["logs".to_string(), "--tail".into(), tail];
    if let Some(s) = &r.since {
        since("since", s)?;
        args.extend(["--since".into(), s.clone()]);
    }
    if r.follow {
        args.push("--follow".into());
    }
    args.push(r.container.clone());
    Ok(DockerCommand::new(args, if r.follow { FOLLOW_TIMEOUT } else { LOGS_TIMEOUT }))
}

/// `docker compose` (Debian bookworm's `docker-compose` when the image has
/// it), run in the project's directory.
pub fn compose(r: &ComposeRequest) -> Result<DockerCommand, OrchestratorError> {
    if !COMPOSE_ACTIONS.contains(&r.action.as_str()) {
        return Err(invalid(
            "action",
            format!("unknown compose action '{}' (one of: {})", r.action, COMPOSE_ACTIONS.join(", ")),
        ));
    }
    let dir = guest_path("project_dir", &r.project_dir)?;
    for s in &r.services {
        name("services", s)?;
    }
    let mut args = vec!["compose".to_string()];
    if let Some(f) = &r.file {
        args.extend(["-f".into(), guest_path("file", f)?]);
    }
    args.push(r.action.clone());
    let mut timeout = COMPOSE_TIMEOUT;
    match r.action.as_str() {
        "up" if r.detach => args.push("-d".into()),
        "logs" => {
            if let Some(t) = r.tail {
                args.extend(["--tail".into(), if t > 0 { t.to_string() } else { "all".into() }]);
            }
            if let Some(s) = &r.since {
                since("since", s)?;
                args.extend(["--since".into(), s.clone()]);
            }
            if r.follow {
                args.push("--follow".into());
                timeout = FOLLOW_TIMEOUT;
            }
        }
        "exec" => {
            let service = r
                .services
                .first()
                .ok_or_else(|| invalid("services", "exec needs the service to run in as services[0]"))?;
            let command = r.command.as_deref().filter(|c| !c.trim().is_empty());
            let command = command.ok_or_else(|| invalid("command", "exec needs the command to run"))?;
            plain("command", command)?;
            args.extend(["-T".into(), service.clone(), "sh".into(), "-lc".into(), command.to_string()]);
            return Ok(DockerCommand { cwd: dir, ..DockerCommand::new(args, timeout).creating() });
        }
        _ => {}
    }
    if r.action != "down" {
        args.extend(r.services.iter().cloned());
    }
    Ok(DockerCommand { cwd: dir, ..DockerCommand::new(args, timeout).creating() })
}

/// `docker ps`.
pub fn ps(all: bool) -> DockerCommand {
    let mut args = vec!["ps".to_string()];
    if all {
        args.push("-a".into());
    }
    DockerCommand::new(args, LIST_TIMEOUT)
}

/// `docker images`.
pub fn images() -> DockerCommand {
    DockerCommand::new(vec!["images".into()], LIST_TIMEOUT)
}

/// `docker system`-style pruning: `safe` removes stopped containers and
/// dangling images; `aggressive` also every unused image, network and
/// volume. Each step is its own docker command; the first failure stops.
pub fn cleanup(mode: &str) -> Result<Vec<DockerCommand>, OrchestratorError> {
    let steps: &[&[&str]] = match mode {
        "safe" => &[&["container", "prune", "-f"], &["image", "prune", "-f"]],
        "aggressive" => &[
            &["container", "prune", "-f"],
            &["image", "prune", "-a", "-f"],
            &["network", "prune", "-f"],
            &["volume", "prune", "-f"],
        ],
        other => {
            return Err(invalid(
                "mode",
                format!("unknown cleanup mode '{other}' (one of: {})", CLEANUP_MODES.join(", ")),
            ));
        }
    };
    Ok(steps.iter().map(|s| DockerCommand::new(s.iter().map(|a| a.to_string()).collect(), CLEANUP_TIMEOUT)).collect())
}

impl SandboxManager {
    /// Refuses docker on a sandbox whose driver cannot run containers,
    /// naming the fix. Checked before the sandbox is created, so a refused
    /// call creates nothing.
    fn check_containers(&self, sandbox: &str) -> Result<(), OrchestratorError> {
        // A sandbox that runs keeps its isolation; a new one gets its profile's.
        let isolation = match self.get(sandbox) {
            Ok(s) => s.isolation,
            Err(_) => self.planned_profile(sandbox, &Origin::default())?.0.isolation,
        };
        if self.helper.features(isolation)?.containers {
            Ok(())
        } else {
            Err(OrchestratorError::NeedsVm { sandbox: sandbox.to_string(), driver: isolation.as_str().to_string() })
        }
    }

    /// Runs `cmd` in the named sandbox (created on first use when `cmd`
    /// may create it), recorded in its history as the docker command line.
    pub async fn docker(&self, sandbox: &str, cmd: &DockerCommand) -> Result<ExecResult, OrchestratorError> {
        self.check_containers(sandbox)?;
        let sandbox = if cmd.creates_sandbox { self.get_or_create(sandbox).await? } else { self.get(sandbox)? };
        let argv =
            [vec!["sh".to_string(), "-c".into(), PRELUDE.into(), PRELUDE_NAME.into()], cmd.args.clone()].concat();
        let mut run = Command::argv(argv, cmd.timeout);
        run.cwd = cmd.cwd.clone();
        run.audit_as = Some(cmd.display());
        self.run_in(&sandbox, run).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(r: Result<DockerCommand, OrchestratorError>) -> String {
        r.unwrap_err().to_string()
    }

    #[test]
    fn build_makes_an_argv_and_names_bad_arguments() {
        let r = BuildRequest {
            context_path: "app".into(),
            image_tag: "localhost:5000/team/app:1.0".into(),
            dockerfile: Some("app/Dockerfile.dev".into()),
            build_args: vec![("VERSION".into(), "1 2; rm -rf /".into())],
            target: Some("final".into()),
            no_cache: true,
        };
        let c = build(&r).unwrap();
        assert_eq!(
            c.args,
            [
                "build",
                "-t",
                "localhost:5000/team/app:1.0",
                "-f",
                "app/Dockerfile.dev",
                "--build-arg",
                "VERSION=1 2; rm -rf /",
                "--target",
                "final",
                "--no-cache",
                "app"
            ]
        );
        assert_eq!(
            c.display(),
            "docker build -t localhost:5000/team/app:1.0 -f app/Dockerfile.dev --build-arg 'VERSION=1 2; rm -rf /' --target final --no-cache app"
        );
        for tag in ["App:1", "app:", "app:-x", "-app", "a b", "app@sha256:00"] {
            let e = err(build(&BuildRequest { image_tag: tag.into(), ..r.clone() }));
            assert!(e.starts_with("argument `image_tag`:"), "{tag}: {e}");
        }
        let e = err(build(&BuildRequest { build_args: vec![("A=B".into(), "c".into())], ..r.clone() }));
        assert!(e.starts_with("argument `build_args`: key 'A=B'"), "{e}");
        let e = err(build(&BuildRequest { context_path: "--file=/etc/passwd".into(), ..r.clone() }));
        assert!(e.starts_with("argument `context_path`:"), "{e}");
        let e = err(build(&BuildRequest { target: Some("a b".into()), ..r }));
        assert!(e.starts_with("argument `target`:"), "{e}");
    }

    #[test]
    fn run_makes_an_argv_and_names_bad_arguments() {
        let r = RunRequest {
            image: "busybox:latest".into(),
            command: Some("sh -c 'echo $HOME; id'".into()),
            name: Some("web.1".into()),
            env: vec![("MODE".into(), "a=b".into())],
            volumes: vec!["./data:/data:ro".into(), "/:/host".into(), "cache:/cache".into()],
            ports: vec!["8080:80".into(), "127.0.0.1:9000:9000/udp".into(), "[::1]::53".into(), "7000-7002".into()],
            workdir: Some("/srv".into()),
            detach: true,
            privileged: true,
        };
        let c = run(&r).unwrap();
        let want = "run -d --name web.1 -e MODE=a=b -v /workspace/data:/data:ro -v /:/host -v cache:/cache -p 8080:80 \
                    -p 127.0.0.1:9000:9000/udp -p [::1]::53 -p 7000-7002 -w /srv --privileged busybox:latest sh -c";
        assert_eq!(c.args[..c.args.len() - 1].join(" "), want);
        assert_eq!(c.args.last().unwrap(), "echo $HOME; id");
        for (field, bad) in [
            ("ports", RunRequest { ports: vec!["80:0".into()], ..r.clone() }),
            ("ports", RunRequest { ports: vec!["99999".into()], ..r.clone() }),
            ("ports", RunRequest { ports: vec!["x:80:80".into()], ..r.clone() }),
            ("ports", RunRequest { ports: vec!["80/icmp".into()], ..r.clone() }),
            ("env", RunRequest { env: vec![("A=B".into(), "1".into())], ..r.clone() }),
            ("volumes", RunRequest { volumes: vec!["../etc:/x".into()], ..r.clone() }),
            ("volumes", RunRequest { volumes: vec!["/a:rel".into()], ..r.clone() }),
            ("volumes", RunRequest { volumes: vec!["/a:/b:rshared".into()], ..r.clone() }),
            ("volumes", RunRequest { volumes: vec!["/a".into()], ..r.clone() }),
            ("name", RunRequest { name: Some("-x".into()), ..r.clone() }),
            ("image", RunRequest { image: "--privileged".into(), ..r.clone() }),
            ("workdir", RunRequest { workdir: Some("srv".into()), ..r.clone() }),
            ("command", RunRequest { command: Some("echo 'open".into()), ..r.clone() }),
        ] {
            let e = err(run(&bad));
            assert!(e.starts_with(&format!("argument `{field}`:")), "{field}: {e}");
        }
    }

    #[test]
    fn compose_actions_and_their_arguments() {
        let r = ComposeRequest { project_dir: "proj".into(), action: "up".into(), detach: true, ..Default::default() };
        let c = compose(&r).unwrap();
        assert_eq!((c.args.join(" ").as_str(), c.cwd.as_str()), ("compose up -d", "proj"));
        let c = compose(&ComposeRequest {
            action: "logs".into(),
            follow: true,
            tail: Some(5),
            services: vec!["web".into()],
            ..r.clone()
        })
        .unwrap();
        assert_eq!(c.args.join(" "), "compose logs --tail 5 --follow web");
        assert_eq!(c.timeout, FOLLOW_TIMEOUT);
        let c = compose(&ComposeRequest {
            action: "exec".into(),
            services: vec!["web".into()],
            command: Some("echo hi".into()),
            file: Some("c.yml".into()),
            ..r.clone()
        })
        .unwrap();
        assert_eq!(c.args, ["compose", "-f", "c.yml", "exec", "-T", "web", "sh", "-lc", "echo hi"]);
        let e = err(compose(&ComposeRequest { action: "explode".into(), ..r.clone() }));
        assert!(e.starts_with("argument `action`: unknown compose action 'explode' (one of: up, down"), "{e}");
        let e = err(compose(&ComposeRequest { action: "exec".into(), command: Some("x".into()), ..r.clone() }));
        assert!(e.starts_with("argument `services`:"), "{e}");
        let e = err(compose(&ComposeRequest { action: "exec".into(), services: vec!["web".into()], ..r.clone() }));
        assert!(e.starts_with("argument `command`:"), "{e}");
        let e = err(compose(&ComposeRequest { project_dir: String::new(), ..r }));
        assert!(e.starts_with("argument `project_dir`:"), "{e}");
    }

    #[test]
    fn logs_exec_and_cleanup() {
        let c =
            logs(&LogsRequest { container: "web".into(), tail: 0, follow: false, since: Some("10m".into()) }).unwrap();
        assert_eq!(c.args.join(" "), "logs --tail all --since 10m web");
        let e =
            err(logs(&LogsRequest { container: "web".into(), tail: 1, follow: false, since: Some("$(id)".into()) }));
        assert!(e.starts_with("argument `since`:"), "{e}");
        let c = exec("web", "echo $((1+1)) | cat", 5.0).unwrap();
        assert_eq!(c.args, ["exec", "web", "sh", "-c", "echo $((1+1)) | cat"]);
        assert!(err(exec("web", "x", 0.0)).starts_with("argument `timeout_seconds`:"));
        assert!(err(exec("a;b", "x", 1.0)).starts_with("argument `container`:"));
        assert_eq!(cleanup("safe").unwrap().len(), 2);
        assert_eq!(cleanup("aggressive").unwrap()[1].args, ["image", "prune", "-a", "-f"]);
        assert!(cleanup("all").unwrap_err().to_string().starts_with("argument `mode`:"));
    }
}
