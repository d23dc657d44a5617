//! `sandbox-mcp`: the MCP front-end (stdio by default, or HTTP), the per-user
//! daemon behind it, and the admin commands.
use std::{io::IsTerminal, net::SocketAddr, path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand, ValueEnum};
use sandbox_base::{paths, size::human_size};
use sandbox_image::ImageStore;
#[cfg(linux_host)]
use sandbox_image::{self as image, BuildRequest};
#[cfg(linux_host)]
use sandbox_mcp::hostsetup;
use sandbox_mcp::{
    daemon::{frontend, hello::Mode, relay, server},
    doctor,
};
use sandbox_mcp_tools::{
    http::{self, HttpOptions},
    http_token,
    registration::{self, HttpTarget},
};
use sandbox_orchestrator::{Config, config::ConfigSource};

#[derive(Parser)]
#[command(name = "sandbox-mcp", version, about = "Local, VM-grade sandboxes for AI agents, served over MCP")]
struct Cli {
    #[command(subcommand)]
    command: Option<Cmd>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Serve MCP on stdin/stdout (the default), or over Streamable HTTP, through the user's daemon.
    Serve(ServeArgs),
    /// Run the user's orchestrator daemon in the foreground (front-ends start it on demand).
    Daemon,
    /// Print the registration for an MCP client.
    Config {
        /// The client to register with.
        client: ClientArg,
        /// Register a running HTTP server at this URL (e.g. http://127.0.0.1:8765/mcp) instead of this binary.
        #[arg(long, value_name = "URL")]
        http: Option<String>,
        /// Bearer token of that HTTP server (default: the stored one).
        #[arg(long, env = "SANDBOX_MCP_TOKEN", hide_env_values = true, requires = "http")]
        token: Option<String>,
    },
    /// Check this host and print one line per check with its fix.
    Doctor,
    /// As root: prepare this host for an ordinary user's sandboxes (subordinate ids, /dev/net/tun, cgroup
    /// delegation, AppArmor profile), printing one line per step. Safe to rerun.
    #[cfg(linux_host)]
    HostSetup {
        /// The user to set up (default: $SUDO_USER).
        #[arg(long, value_name = "NAME")]
        user: Option<String>,
        /// The helper binary the AppArmor profile is for (default: sandbox-vm-helper next to this binary).
        #[arg(long, value_name = "PATH")]
        helper: Option<PathBuf>,
        /// Print what would change without changing anything.
        #[arg(long)]
        dry_run: bool,
    },
    /// Manage local images.
    #[command(subcommand)]
    Image(ImageCmd),
}

#[derive(clap::Args, Default)]
struct ServeArgs {
    /// Serve MCP Streamable HTTP at /mcp on ADDR instead of stdio.
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = http::DEFAULT_ADDR)]
    http: Option<SocketAddr>,
    /// Bearer token clients must send (default: the stored one, generated on first use; loopback too).
    #[arg(long, env = "SANDBOX_MCP_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Serve HTTP without a token: any local process or user can then drive the server.
    #[arg(long = "no-auth", requires = "http", conflicts_with = "token")]
    no_auth: bool,
    /// Also accept this name in Host and Origin headers (repeatable), e.g. the name clients use to reach ADDR.
    #[arg(long = "allowed-host", value_name = "HOST[:PORT]", requires = "http")]
    allowed_hosts: Vec<String>,
}

#[derive(Clone, Copy, ValueEnum)]
enum ClientArg {
    /// Claude Code.
    Claude,
    /// Cursor.
    Cursor,
    /// Claude Desktop.
    Desktop,
}

#[derive(Subcommand)]
enum ImageCmd {
    /// Build an image from Debian packages with mmdebstrap.
    #[cfg(linux_host)]
    Build {
        /// Image name.
        #[arg(long, default_value = image::DEFAULT_IMAGE)]
        name: String,
        /// Packages (comma-separated) on top of minbase; default: the mcp-dev set.
        #[arg(long, value_delimiter = ',')]
        packages: Option<Vec<String>>,
        /// Debian suite.
        #[arg(long, default_value = image::DEFAULT_SUITE)]
        suite: String,
        /// Image store directory.
        #[arg(long)]
        store: Option<PathBuf>,
        /// Rebuild even if the image exists.
        #[arg(long)]
        force: bool,
    },
    /// Pull an image from a registry into the store, unpacked for this user's sandboxes (mirrors and
    /// plain-HTTP registries from `[registries]` in config.toml).
    #[cfg(linux_host)]
    Pull {
        /// The image, e.g. python:3.12-bookworm or ghcr.io/owner/repo@sha256:….
        reference: String,
        /// Image name (default: from the reference, python:3.12 → python-3.12).
        #[arg(long)]
        name: Option<String>,
        /// Image store directory.
        #[arg(long)]
        store: Option<PathBuf>,
        /// Replace an image of that name.
        #[arg(long)]
        force: bool,
    },
    /// Record an image as an OCI reference, pulled by the VM layer at its first boot (the macOS
    /// helper).
    #[cfg(not(linux_host))]
    Pull {
        /// The image, e.g. docker.io/library/python:3.12-bookworm.
        reference: String,
        /// Image name.
        #[arg(long, default_value = sandbox_image::DEFAULT_IMAGE)]
        name: String,
        /// Shell for `sh -c` style commands in it.
        #[arg(long, default_value = "/bin/sh")]
        shell: String,
        /// Its package manager ("apt", "apk", "dnf"), if it has one.
        #[arg(long, default_value = "")]
        package_manager: String,
        /// Image store directory.
        #[arg(long)]
        store: Option<PathBuf>,
        /// Replace a recorded reference of that name.
        #[arg(long)]
        force: bool,
    },
    /// Import an image from an OCI image layout (a directory or a tar of one) or a `docker save` archive.
    #[cfg(linux_host)]
    Import {
        /// The layout directory or archive.
        path: PathBuf,
        /// Image name.
        #[arg(long)]
        name: String,
        /// Which image of an archive holding several (its ref name or repo:tag).
        #[arg(long)]
        tag: Option<String>,
        /// Image store directory.
        #[arg(long)]
        store: Option<PathBuf>,
        /// Replace an image of that name.
        #[arg(long)]
        force: bool,
    },
    /// Export an image (or a snapshot) as an OCI image layout tar: `export NAME PATH` or
    /// `export --snapshot SNAP PATH`.
    #[cfg(linux_host)]
    Export {
        /// NAME PATH, or PATH alone with --snapshot; PATH must not exist.
        #[arg(value_name = "[NAME] PATH", num_args = 1..=2, required = true)]
        args: Vec<PathBuf>,
        /// Export this snapshot instead of an image.
        #[arg(long, value_name = "SNAP")]
        snapshot: Option<String>,
        /// Image store directory.
        #[arg(long)]
        store: Option<PathBuf>,
    },
    /// List images.
    List {
        /// Image store directory.
        #[arg(long)]
        store: Option<PathBuf>,
    },
}

/// The helper binary: `SANDBOX_VM_HELPER_BIN`, else next to this binary, else PATH.
fn helper_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("SANDBOX_VM_HELPER_BIN").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("sandbox-vm-helper")))
        .filter(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("sandbox-vm-helper"))
}

/// The front-end: the session's configuration is checked here first (a bad
/// one stops the server before anything starts, as it always did), then the
/// daemon serves the session.
async fn serve(args: ServeArgs) -> Result<(), String> {
    let source = ConfigSource::current();
    Config::load_from(&source).map_err(|e| e.to_string())?;
    let Some(addr) = args.http else {
        let conn = frontend::open(source.clone(), Mode::Stdio).await.map_err(|e| e.to_string())?;
        return relay::relay_stdio(conn, source).await.map_err(|e| e.to_string());
    };
    let options = HttpOptions { addr, token: args.token, no_auth: args.no_auth, allowed_hosts: args.allowed_hosts };
    let listen = options.resolve().map_err(|e| e.to_string())?;
    let token_required = listen.token.is_some();
    let conn = frontend::open(source.clone(), Mode::Http(listen.clone())).await.map_err(|e| e.to_string())?;
    frontend::hold_http(conn, token_required, source, listen).await.map_err(|e| e.to_string())
}

/// Logs of the daemon: its log file, and stderr too when run by hand from a
/// terminal (started by a front-end, its stderr is that file already).
fn init_daemon_logs() -> Result<(), String> {
    use tracing_subscriber::{Layer, layer::SubscriberExt, util::SubscriberInitExt};
    let path = paths::daemon_log_file();
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let by_hand = std::io::stderr().is_terminal();
    let to_file = tracing_subscriber::fmt::layer().with_ansi(false).with_writer(std::sync::Mutex::new(file));
    let to_stderr =
        by_hand.then(|| tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_filter(log_filter()));
    tracing_subscriber::registry().with(to_file.with_filter(log_filter())).with(to_stderr).init();
    Ok(())
}

/// `config <client>`: the registration on stdout, where it goes on stderr.
fn config_cmd(client: ClientArg, url: Option<String>, token: Option<String>) -> Result<(), String> {
    let binary = std::env::current_exe()
        .and_then(|p| p.canonicalize())
        .map_err(|e| format!("cannot locate this binary: {e}"))?;
    let client = match client {
        ClientArg::Claude => registration::Client::Claude,
        ClientArg::Cursor => registration::Client::Cursor,
        ClientArg::Desktop => registration::Client::Desktop,
    };
    let target = url.map(|url| {
        let token = token.or_else(stored_token);
        HttpTarget { url, token }
    });
    let reg = registration::render(client, &binary, target.as_ref());
    println!("{}", reg.text);
    eprintln!("{}", reg.hint);
    Ok(())
}

/// The stored token: every HTTP server requires one unless started with
/// `--no-auth`, loopback ones too.
fn stored_token() -> Option<String> {
    let path = http_token::token_path();
    match std::fs::read_to_string(&path) {
        Ok(t) => Some(t.trim().to_string()),
        Err(_) => {
            eprintln!("no token stored in {}: pass --token (the server prints it on first start)", path.display());
            None
        }
    }
}

fn image_cmd(cmd: ImageCmd) -> Result<(), String> {
    let store_at = |s: Option<PathBuf>| ImageStore::new(s.unwrap_or_else(paths::image_store));
    match cmd {
        #[cfg(linux_host)]
        ImageCmd::Build { name, packages, suite, store, force } => {
            let store = store_at(store);
            sandbox_orchestrator::images::new_image_name(&name)?;
            let req = BuildRequest { name, suite, packages: packages.unwrap_or_else(image::default_packages), force };
            let mapper = sandbox_userns::IdMapper::detect()?;
            let info = store.build(&req, &mapper, &mut |line| eprintln!("{line}")).map_err(|e| e.to_string())?;
            println!("image {} ready in {} ({})", info.name, store.root().display(), human_size(info.size_bytes));
        }
        #[cfg(linux_host)]
        ImageCmd::Pull { reference, name, store, force } => {
            let store = store_at(store);
            let reference = image::oci::Reference::parse(&reference).map_err(|e| e.to_string())?;
            let name = name.unwrap_or_else(|| reference.image_name());
            // Refused before any download: a taken name is known now.
            image_free(&store, &name, force)?;
            let registries = Config::load_from(&ConfigSource::current()).map_err(|e| e.to_string())?.registries;
            let mapper = sandbox_userns::IdMapper::detect()?;
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
            let installed = rt.block_on(pull_image(&store, &reference, &name, force, &registries, mapper));
            let info = installed.map_err(|e| image_error(e, &name))?;
            println!("image {} ready from {} ({})", info.name, info.source, human_size(info.size_bytes));
        }
        #[cfg(not(linux_host))]
        ImageCmd::Pull { reference, name, shell, package_manager, store, force } => {
            let store = store_at(store);
            let info =
                store.add_reference(&name, &reference, &shell, &package_manager, force).map_err(|e| e.to_string())?;
            println!("image {} is {} (pulled at its first boot)", info.name, info.reference);
        }
        #[cfg(linux_host)]
        ImageCmd::Import { path, name, tag, store, force } => {
            let store = store_at(store);
            image_free(&store, &name, force)?;
            let mapper = sandbox_userns::IdMapper::detect()?;
            let blobs = store.blobs();
            let mut log = |line: &str| eprintln!("{line}");
            let fetched = image::oci::archive::import(&path, &blobs, tag.as_deref(), &mut log)
                .map_err(|e| format!("cannot import {}: {e}", path.display()))?;
            let info =
                store.add_oci(&name, &fetched, &blobs, &mapper, force, &mut log).map_err(|e| image_error(e, &name))?;
            println!("image {} ready from {} ({})", info.name, info.source, human_size(info.size_bytes));
        }
        #[cfg(linux_host)]
        ImageCmd::Export { args, snapshot, store } => {
            let (name, dest) = match (snapshot, args.as_slice()) {
                (Some(snap), [dest]) => {
                    (format!("{}{snap}", sandbox_orchestrator::images::SNAPSHOT_PREFIX), dest.clone())
                }
                (None, [name, dest]) => (name.to_string_lossy().into_owned(), dest.clone()),
                (Some(_), _) => return Err("with --snapshot SNAP give only the PATH to write".into()),
                (None, _) => return Err("give the image and the file to write: image export NAME PATH".into()),
            };
            let store = store_at(store);
            let mapper = sandbox_userns::IdMapper::detect()?;
            image::oci::archive::export(&store, &name, &mapper, &dest, &mut |line| eprintln!("{line}"))
                .map_err(|e| format!("cannot export {}: {e}", sandbox_orchestrator::images::display_name(&name)))?;
            println!("{} written to {}", sandbox_orchestrator::images::display_name(&name), dest.display());
        }
        ImageCmd::List { store } => {
            for i in store_at(store).list().map_err(|e| e.to_string())? {
                // Where its files came from: pulled or imported here, or pulled by the VM layer.
                let from = [&i.source, &i.reference].into_iter().find(|s| !s.is_empty());
                let from = from.map(|s| format!("\t{s}")).unwrap_or_default();
                println!("{}\t{}\t{}\t{}{from}", i.name, human_size(i.size_bytes), i.package_manager, i.shell);
            }
        }
    }
    Ok(())
}

/// Refuses a name a new image may not have, and a taken one without
/// `force`, saying how to replace it.
#[cfg(linux_host)]
fn image_free(store: &ImageStore, name: &str, force: bool) -> Result<(), String> {
    sandbox_orchestrator::images::new_image_name(name)?;
    match store.get(name) {
        Ok(_) if !force => Err(format!("image {name:?} already exists: pass --force to replace it")),
        _ => Ok(()),
    }
}

/// An image command's error as one line; a name taken meanwhile says how to replace it.
#[cfg(linux_host)]
fn image_error(e: image::ImageError, name: &str) -> String {
    match e {
        image::ImageError::AlreadyExists(_) => format!("image {name:?} already exists: pass --force to replace it"),
        image::ImageError::Oci(image::oci::OciError::Cancelled) => {
            format!("cancelled: nothing was installed as image {name:?}")
        }
        e => e.to_string(),
    }
}

/// Pulls `reference` into the store's blobs with a progress line per layer
/// on stderr, then installs it as `name`. Ctrl-C cancels the download (no
/// partial blob is kept); during the unpack it stops the unpacking child
/// (the terminal signals the whole process group) and `add_oci` removes what
/// it had unpacked, or, if the unpack finishes first, the image is installed.
#[cfg(linux_host)]
async fn pull_image(
    store: &ImageStore,
    reference: &image::oci::Reference,
    name: &str,
    force: bool,
    registries: &image::oci::RegistryConfig,
    mapper: sandbox_userns::IdMapper,
) -> Result<sandbox_image::ImageInfo, image::ImageError> {
    use image::oci::{LayerState, OciError, PullProgress};
    let cancel = tokio_util::sync::CancellationToken::new();
    // Registered before the first request: a Ctrl-C at any point of the pull cancels it.
    let mut interrupt = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .map_err(|source| OciError::Io { context: "listening for Ctrl-C".into(), source })?;
    let on_ctrl_c = {
        let cancel = cancel.clone();
        tokio::spawn(async move {
            if interrupt.recv().await.is_some() {
                eprintln!("cancelling");
                cancel.cancel();
            }
        })
    };
    // Byte counts of a layer at most once a second; its end always.
    let last = std::sync::Mutex::new((usize::MAX, std::time::Instant::now()));
    let progress = |p: PullProgress| {
        let head = format!("layer {}/{} {}", p.layer + 1, p.layers, short_digest(&p.digest));
        match p.state {
            LayerState::Present => eprintln!("{head} already present"),
            LayerState::Done => eprintln!("{head} {} done", megabytes(p.total)),
            LayerState::Downloading => {
                let mut last = last.lock().unwrap_or_else(|e| e.into_inner());
                if last.0 != p.layer || last.1.elapsed() >= std::time::Duration::from_secs(1) {
                    *last = (p.layer, std::time::Instant::now());
                    eprintln!("{head} {} of {}", megabytes(p.done), megabytes(p.total));
                }
            }
        }
    };
    let blobs = store.blobs();
    let fetched = image::oci::pull(reference, registries, &blobs, &progress, &cancel).await;
    let fetched = match fetched {
        Ok(_) if cancel.is_cancelled() => Err(OciError::Cancelled),
        other => other,
    }?;
    let (store, name) = (store.clone(), name.to_string());
    let installed = tokio::task::spawn_blocking(move || {
        store.add_oci(&name, &fetched, &blobs, &mapper, force, &mut |line| eprintln!("{line}"))
    })
    .await
    .unwrap_or_else(|e| Err(image::ImageError::Unpack(format!("the unpacking task failed: {e}"))));
    on_ctrl_c.abort();
    match installed {
        Err(_) if cancel.is_cancelled() => Err(OciError::Cancelled.into()),
        other => other,
    }
}

/// `sha256:` and the first 12 hex digits, as docker shows layers.
#[cfg(linux_host)]
fn short_digest(digest: &str) -> String {
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    format!("sha256:{}…", &hex[..hex.len().min(12)])
}

#[cfg(linux_host)]
fn megabytes(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

/// The log level: RUST_LOG, else INFO. rmcp logs each session's whole
/// peer_info, every notification and each HTTP session's creation at INFO:
/// per-request detail for debugging. It cannot be re-levelled from here, so
/// below DEBUG rmcp shows warnings only, unless RUST_LOG asks for rmcp by name.
fn log_filter() -> tracing_subscriber::EnvFilter {
    use tracing_subscriber::{EnvFilter, filter::LevelFilter};
    let mut filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let names_rmcp = std::env::var("RUST_LOG").is_ok_and(|v| v.contains("rmcp"));
    if !names_rmcp
        && filter.max_level_hint().is_none_or(|max| max < LevelFilter::DEBUG)
        && let Ok(quiet) = "rmcp=warn".parse()
    {
        filter = filter.add_directive(quiet);
    }
    filter
}

/// Logs to stderr only (stdout belongs to the MCP stdio transport), coloured
/// only on a terminal: clients such as Claude Desktop write stderr to log
/// files, where escape codes are clutter.
fn init_logging() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(log_filter())
        .init();
}

fn main() -> ExitCode {
    #[cfg(linux_host)]
    sandbox_image::oci::run_layer_applier_if_asked();
    let cli = Cli::parse();
    let command = cli.command.unwrap_or(Cmd::Serve(ServeArgs::default()));
    if !matches!(command, Cmd::Daemon) {
        init_logging();
    }
    let result = match command {
        // One thread: the front-end only relays bytes.
        Cmd::Serve(args) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())
            .map(|rt| {
                let served = rt.block_on(serve(args));
                // Reading stdin blocks a thread that only the client's EOF ends.
                rt.shutdown_background();
                served
            })
            .and_then(|r| r),
        // Multi-threaded: a single thread measured the same exec latency but
        // cost a sixth of port-forward throughput.
        Cmd::Daemon => init_daemon_logs().and_then(|()| {
            let rt = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
            let ran = rt.block_on(server::run(helper_bin())).map_err(|e| e.to_string());
            // Sessions still open are cut; blocking work is not waited for.
            rt.shutdown_timeout(std::time::Duration::from_secs(1));
            if let Err(e) = &ran {
                tracing::error!("{e}");
            }
            ran
        }),
        Cmd::Config { client, http, token } => config_cmd(client, http, token),
        Cmd::Doctor => {
            let report = tokio::runtime::Runtime::new()
                .map_err(|e| e.to_string())
                .map(|rt| rt.block_on(doctor::run(&helper_bin())));
            return match report {
                Ok(r) if r.passed() => ExitCode::SUCCESS,
                Ok(_) => ExitCode::FAILURE,
                Err(e) => {
                    eprintln!("sandbox-mcp: {e}");
                    ExitCode::FAILURE
                }
            };
        }
        #[cfg(linux_host)]
        Cmd::HostSetup { user, helper, dry_run } => {
            let helper = helper.unwrap_or_else(helper_bin);
            let helper = helper.canonicalize().unwrap_or(helper);
            hostsetup::run(&hostsetup::Options { user, helper, dry_run }).map_err(|e| e.to_string())
        }
        Cmd::Image(cmd) => image_cmd(cmd),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sandbox-mcp: {e}");
            ExitCode::FAILURE
        }
    }
}
