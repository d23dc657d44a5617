//! `sandbox-mcp`: the MCP server (stdio by default) and its admin commands.
use std::{path::PathBuf, process::ExitCode, sync::Arc};

use clap::{Parser, Subcommand};
use sandbox_mcp::{
    image::{self, BuildRequest, ImageStore},
    mcp::SandboxServer,
    orchestrator::{Config, Orchestrator, SandboxManager, helper_client::HelperClient},
    paths,
};

#[derive(Parser)]
#[command(name = "sandbox-mcp", version, about = "Local, VM-grade sandboxes for AI agents, served over MCP")]
struct Cli {
    #[command(subcommand)]
    command: Option<Cmd>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Serve MCP on stdin/stdout (the default).
    Serve,
    /// Manage local images.
    #[command(subcommand)]
    Image(ImageCmd),
}

#[derive(Subcommand)]
enum ImageCmd {
    /// Build an image from Debian packages with mmdebstrap.
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

async fn serve() -> Result<(), String> {
    let helper =
        HelperClient::connect_or_spawn(&paths::helper_socket(), &helper_bin()).await.map_err(|e| e.to_string())?;
    let config = Config::load().map_err(|e| e.to_string())?;
    let manager = Arc::new(SandboxManager::start(helper, config).await.map_err(|e| e.to_string())?);
    SandboxServer::new(&Orchestrator::new(manager)).serve_stdio().await.map_err(|e| e.to_string())
}

fn image_cmd(cmd: ImageCmd) -> Result<(), String> {
    let store_at = |s: Option<PathBuf>| ImageStore::new(s.unwrap_or_else(paths::image_store));
    match cmd {
        ImageCmd::Build { name, packages, suite, store, force } => {
            let store = store_at(store);
            let req = BuildRequest { name, suite, packages: packages.unwrap_or_else(image::default_packages), force };
            let info = store.build(&req, &mut |line| eprintln!("{line}")).map_err(|e| e.to_string())?;
            println!("image {} ready in {} ({} MB)", info.name, store.root().display(), info.size_bytes >> 20);
        }
        ImageCmd::List { store } => {
            for i in store_at(store).list().map_err(|e| e.to_string())? {
                println!("{}\t{} MB\t{}\t{}", i.name, i.size_bytes >> 20, i.package_manager, i.shell);
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    // stdout belongs to the MCP stdio transport: logs go to stderr only.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
    let cli = Cli::parse();
    let result = match cli.command.unwrap_or(Cmd::Serve) {
        // Multi-threaded: a single thread measured the same exec latency but
        // cost a sixth of port-forward throughput.
        Cmd::Serve => tokio::runtime::Runtime::new().map_err(|e| e.to_string()).and_then(|rt| rt.block_on(serve())),
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
