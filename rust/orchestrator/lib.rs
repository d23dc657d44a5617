//! The orchestrator: sandboxes by name on top of a VM helper. It owns
//! everything that is policy or state (names, env, audit, exec semantics);
//! the MCP layer only translates tool calls into calls here.
//!
//! - [`helper_client`]: the helper connection and the only proto conversion.
//! - [`sandbox`]: the registry, lifecycle, running commands.
//! - [`exec`]: one process to completion with timeout and output caps.
//! - [`env`], [`files`], [`packages`]: persistent env, file I/O, `install`.
//! - [`audit`]: command history with secret redaction.
//! - [`names`]: validation of client-supplied names.
//! - [`config`]: defaults, profiles, idle TTL, host roots.
//! - [`network`]: network modes, egress policies, the child rule and the
//!   `network_info` report; [`ca_trust`]: the host's CA bundle in sandboxes.
//! - [`hostpath`]: the host-roots policy for host paths; [`hostfs`]: the
//!   race-free, fd-based file operations every host-path tool goes through;
//!   [`hostguard`]: the places on the host no sandbox file may be written.
//! - [`text`]: output bytes to client text.
//! - [`spawn`]: child sandboxes under spawn policies; [`ctl`]: the
//!   sandbox-ctl server that lets a sandbox spawn its own children.
//! - [`state`]: the state database (leases, history, env, forwards, sync
//!   jobs, spawn counters, lost sandboxes) and putting it back after a restart.
//! - [`watchdog`]: restarting the helper and reporting lost sandboxes.
//! - [`images`], [`build`], [`containerfile`]: snapshots, restore, clone and
//!   `build_image`.
//! - [`docker`]: the `docker_*` tools' argvs, run in vm sandboxes.

pub mod adopt;
pub mod artifacts;
pub mod audit;
pub mod background;
pub mod build;
pub mod ca_trust;
pub mod config;
pub mod containerfile;
pub mod ctl;
pub mod docker;
pub mod env;
pub mod error;
pub mod exec;
pub mod files;
pub mod forward;
pub mod helper_client;
pub mod hostfs;
pub mod hostguard;
pub mod hostpath;
pub mod images;
pub mod isolation;
pub mod lease;
pub mod names;
pub mod network;
pub mod observe;
pub mod owner;
pub mod packages;
pub mod project;
pub mod sandbox;
pub mod shell;
pub mod spawn;
pub mod state;
pub mod sync;
pub mod tarstream;
pub mod text;
pub mod transfer;
pub mod watchdog;

pub use config::Config;
use std::sync::Arc;

use ctl::CtlServer;
use forward::ForwardManager;
use sandbox::SandboxListener;
use spawn::SpawnManager;
use sync::SyncManager;

pub use error::OrchestratorError;
pub use sandbox::{Command, Sandbox, SandboxManager};

/// The orchestrator's long-lived services, shared by every MCP session.
pub struct Orchestrator {
    /// Named sandboxes.
    pub sandboxes: Arc<SandboxManager>,
    /// Port forwards.
    pub forwards: Arc<ForwardManager>,
    /// Host → sandbox sync jobs.
    pub syncs: Arc<SyncManager>,
    /// Child sandboxes and their bookkeeping.
    pub spawns: Arc<SpawnManager>,
    /// The sandbox-ctl sockets.
    pub ctl: Arc<CtlServer>,
    /// Held shared by every tool call in progress; held exclusively by a
    /// daemon draining for a newer build, so it exits between calls.
    pub calls: Arc<tokio::sync::RwLock<()>>,
}

impl Orchestrator {
    /// Wire the services together: forwards and sync jobs follow their
    /// sandbox's destruction (reset keeps both: a forward dials the new VM, a
    /// sync job re-pushes), spawn bookkeeping and sandbox-ctl sockets follow
    /// too, and idle sandboxes are reaped. Sandboxes attached at start get
    /// their sandbox-ctl sockets back here.
    pub fn new(sandboxes: Arc<SandboxManager>) -> Self {
        let forwards = Arc::new(ForwardManager::new(sandboxes.clone()));
        let syncs = Arc::new(SyncManager::new(sandboxes.clone()));
        let spawns = Arc::new(SpawnManager::new(sandboxes.clone()));
        let ctl = CtlServer::new(spawns.clone());
        sandboxes.subscribe(Arc::new(FollowSandboxes { forwards: forwards.clone(), syncs: syncs.clone() }));
        sandboxes.subscribe(Arc::new(spawn::FollowSpawns(spawns.clone())));
        sandboxes.subscribe(Arc::new(ctl::FollowCtl(ctl.clone())));
        ctl.reattach();
        sandboxes.spawn_reaper();
        Self { sandboxes, forwards, syncs, spawns, ctl, calls: Arc::default() }
    }

    /// Pick up where the previous server left off: open the state database
    /// at `db` (see [`state::path`]) and put it back (leases, history, env,
    /// forwards, sync jobs, lost sandboxes, destroys to finish); every change
    /// from now on is committed to it as it happens. Then watch the helper.
    pub async fn resume(self: &Arc<Self>, db: std::path::PathBuf, respawn: watchdog::Respawn) {
        state::restore(self, db).await;
        // When the state database could not be read, no creation cut short
        // by a crash can be shown to have committed.
        self.sandboxes.settle_unfinished(|_| false).await;
        build::remove_orphans(&self.sandboxes.helper).await;
        self.sandboxes.reap_expired().await;
        self.sandboxes.spawn_watchdog(respawn);
    }
}

/// Stops a destroyed sandbox's forwards and sync jobs.
struct FollowSandboxes {
    forwards: Arc<ForwardManager>,
    syncs: Arc<SyncManager>,
}

impl FollowSandboxes {
    fn stop(&self, name: &str, keep: bool) {
        let (forwards, syncs, name) = (self.forwards.clone(), self.syncs.clone(), name.to_string());
        tokio::spawn(async move {
            forwards.sandbox_gone(&name, keep).await;
            syncs.stop_for(&name, keep).await;
        });
    }
}

impl SandboxListener for FollowSandboxes {
    fn destroyed(&self, name: &str) {
        self.stop(name, false);
    }

    fn lost(&self, name: &str) {
        self.stop(name, true);
    }

    fn came_back<'a>(&'a self, sandbox: &'a Arc<Sandbox>, kept: &'a state::kept::Kept) -> sandbox::NotesFuture<'a> {
        Box::pin(async move {
            let mut notes = Vec::new();
            for f in &kept.forwards {
                match self.forwards.expose(&sandbox.name, f.port.into(), f.host_port.into()).await {
                    Ok(_) => notes.push(Ok(format!("port forward localhost:{} -> {}", f.host_port, f.port))),
                    Err(e) => notes.push(Err(format!("port forward localhost:{} -> {} ({e})", f.host_port, f.port))),
                }
            }
            for j in &kept.syncs {
                match self.syncs.resume(&j.id, &j.local, &j.dir, &sandbox.name, j.files_synced).await {
                    Ok(_) => notes.push(Ok(format!("sync job {}", j.id))),
                    Err(e) => notes.push(Err(format!("sync job {} ({e})", j.id))),
                }
            }
            notes
        })
    }
}
