//! A lost sandbox comes back on its next use: after a reboot, or when its
//! VM died with a helper that could not keep it, the next call on it boots
//! it again from its image with its kept `/workspace`, env, history, lease,
//! port forwards, sync jobs and the background processes marked to restart,
//! and the call's answer says in one line what was lost. No call needs
//! `reset` first.
use std::{sync::Arc, time::SystemTime};

use super::{Origin, Sandbox, SandboxManager};
use crate::{
    audit::AuditEntry,
    error::OrchestratorError,
    names,
    state::{AuditRecord, kept::Kept},
};

/// A lost sandbox that came back, for the one-line notice the next call on
/// it answers with.
#[derive(Debug, Clone)]
pub struct Comeback {
    name: String,
    image: String,
    why: String,
    /// What it kept ("/workspace", "env (2 keys)").
    kept: Vec<String>,
    /// What came back with it (a background process, a port forward).
    back: Vec<String>,
    /// What did not, each with why.
    not_back: Vec<String>,
}

impl Comeback {
    /// The notice, with the name as the session asking sees it.
    pub fn notice(&self) -> String {
        let mut line = format!(
            "Note: sandbox '{}' was lost and was started again from image '{}'. Gone: its processes and its root \
             filesystem changes since it started. Kept: {}.",
            names::display(&self.name),
            self.image,
            self.kept.join(", ")
        );
        if !self.back.is_empty() {
            line.push_str(&format!(" Back: {}.", self.back.join(", ")));
        }
        if !self.not_back.is_empty() {
            line.push_str(&format!(" Not back: {}.", self.not_back.join("; ")));
        }
        line.push_str(&format!(" Why: {}.", self.why));
        line
    }
}

/// `text` on one line and at most [`MAX_REASON`] characters: a loss's reason
/// can quote a VM's console, which the sandbox wrote.
fn one_line(text: &str) -> String {
    let flat: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match flat.char_indices().nth(MAX_REASON) {
        Some((at, _)) => format!("{}…", &flat[..at]),
        None => flat,
    }
}

/// See [`one_line`].
const MAX_REASON: usize = 400;
/// Bound on a call's wait for a helper restart to be sorted out (starting
/// a helper and adopting its VMs take well under this).
const SETTLE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// `n thing` or `n things`.
fn count(n: usize, thing: &str) -> String {
    if n == 1 { format!("1 {thing}") } else { format!("{n} {thing}s") }
}

impl SandboxManager {
    /// Boot `name` again if it is a lost top-level sandbox, and say what its
    /// loss cost in one line; `None` when it was not lost (or another call
    /// brought it back first). A child never comes back on its own: its
    /// parent's spawn made it, and `destroy_child` forgets it.
    ///
    /// While a dead helper is being replaced it first waits (up to
    /// [`SETTLE_WAIT`]) until the watchdog knows which sandboxes the new
    /// helper adopted and which are lost: a call in between would reach a
    /// new helper that does not know a VM its sandbox still names.
    pub async fn revive(&self, name: &str) -> Result<Option<Comeback>, OrchestratorError> {
        let mut settled = self.helper_settled.subscribe();
        let _ = tokio::time::timeout(SETTLE_WAIT, settled.wait_for(|s| *s)).await;
        self.bring_back(name, false).await
    }

    /// [`Self::revive`]; with `stash`, the notice waits for the next call
    /// (kept before the name's lock is let go, so a call waiting on it
    /// finds the notice).
    async fn bring_back(&self, name: &str, stash: bool) -> Result<Option<Comeback>, OrchestratorError> {
        let stashed = || self.comeback_notices.lock().unwrap_or_else(|p| p.into_inner()).remove(name);
        if let Some(comeback) = stashed() {
            return Ok(Some(comeback));
        }
        if names::is_child_name(name) || !self.lost.lock().unwrap_or_else(|p| p.into_inner()).contains_key(name) {
            return Ok(None);
        }
        let lock = self.lifecycle_lock(name);
        let _guard = lock.lock().await;
        if let Some(comeback) = stashed() {
            return Ok(Some(comeback));
        }
        let Some(why) = self.lost.lock().unwrap_or_else(|p| p.into_inner()).get(name).cloned() else {
            return Ok(None);
        };
        if self.lock_map().contains_key(name) {
            return Ok(None);
        }
        let why = one_line(&why);
        let could_not = |e: OrchestratorError| {
            OrchestratorError::NotPermitted(format!(
                "sandbox '{}' was lost ({why}) and could not be started again: {}. Its /workspace is kept; \
                 destroy('{0}') forgets it",
                names::display(name),
                one_line(&e.to_string())
            ))
        };
        let kept = Arc::new(self.kept(name).await.map_err(|e| could_not(e.into()))?);
        let mut origin = Origin { comeback: Some(kept.clone()), ..Origin::default() };
        let mut image_note = None;
        if let Some(record) = &kept.record {
            let images = self.helper.list_images().await.map_err(|e| could_not(e.into()))?;
            if images.iter().any(|i| i.name == record.image) {
                origin.image = Some(record.image.clone());
            } else {
                image_note = Some(format!("image '{}' (deleted; its profile's image runs instead)", record.image));
            }
            origin.cpus = Some(record.cpus);
            origin.memory_bytes = Some(record.memory_mb << 20);
        }
        let sandbox = self.create_locked(name, &origin, None).await.map_err(could_not)?;
        let mut comeback = Comeback {
            name: name.to_string(),
            image: sandbox.image.clone(),
            why: why.clone(),
            kept: vec!["/workspace".into()],
            back: Vec::new(),
            not_back: image_note.into_iter().collect(),
        };
        self.put_back(&sandbox, &kept, &mut comeback).await;
        // Only now: a call that finds the name no longer lost runs on a
        // sandbox with its env and history back.
        self.lost.lock().unwrap_or_else(|p| p.into_inner()).remove(name);
        tracing::info!(sandbox = %name, "a lost sandbox came back");
        if stash {
            self.comeback_notices.lock().unwrap_or_else(|p| p.into_inner()).insert(name.to_string(), comeback);
            return Ok(None);
        }
        Ok(Some(comeback))
    }

    /// Forget the notice of a sandbox brought back without a call (it is
    /// destroyed or replaced: the notice no longer holds).
    pub(crate) fn drop_comeback_notice(&self, name: &str) {
        self.comeback_notices.lock().unwrap_or_else(|p| p.into_inner()).remove(name);
    }

    /// Bring back at once, without waiting for a call, those of the lost
    /// sandboxes `names` that serve something (a background process marked
    /// to restart, or a port forward) and belong to the daemon's project.
    /// Their notice waits for the next call on them. Called for losses the sandbox did not cause (its helper
    /// died, the machine restarted), so a sandbox that crashes its own VM
    /// is not started again in a loop.
    pub fn revive_serving(self: &Arc<Self>, names: Vec<String>) {
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            for name in names {
                let Some(manager) = me.upgrade() else { return };
                // No call brings it back, so no session says which project's
                // settings it takes: only the daemon's own project's
                // sandboxes come back here; another project's wait for a
                // call from that project.
                if names::split_key(&name).0 != manager.config.project.tag {
                    continue;
                }
                match manager.kept(&name).await {
                    Ok(kept) if !kept.restart.is_empty() || !kept.forwards.is_empty() => {}
                    _ => continue,
                }
                match manager.bring_back(&name, true).await {
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(sandbox = %name, "a lost sandbox that serves something did not come back: {e}")
                    }
                }
            }
        });
    }

    /// Put back onto a sandbox that came back what the database kept for
    /// it (already saved with its new row), noting in `comeback` what is
    /// back and what is not.
    async fn put_back(&self, sandbox: &Arc<Sandbox>, kept: &Kept, comeback: &mut Comeback) {
        match &kept.env {
            // The saved env is the truth, also when empty: not the copy a
            // restored snapshot's root filesystem carries.
            Some(env) => match self.adopt_env(sandbox, env.clone()).await {
                Ok(()) if env.is_empty() => {}
                Ok(()) => comeback.kept.push(format!("env ({})", count(env.len(), "key"))),
                Err(e) => comeback.not_back.push(format!("env ({})", one_line(&e.to_string()))),
            },
            None if kept.record.is_some() => comeback.not_back.push("env (its saved copy does not open)".into()),
            None => {}
        }
        if !kept.history.is_empty() {
            sandbox.restore_audit(kept.history.iter().map(AuditRecord::entry).collect::<Vec<AuditEntry>>());
            comeback.kept.push(format!("history ({})", count(kept.history.len(), "command")));
        }
        if let Some(ends) = kept.record.as_ref().and_then(|r| r.expires_at).map(crate::state::time_of) {
            // A lease that ran out while the sandbox was gone ends now: the
            // reaper takes it as it would have.
            sandbox.set_lease(Some(ends.max(SystemTime::now())));
            self.record_sandbox(sandbox).in_background();
        }
        // A job that does not start keeps its mark: it is tried again at
        // the next comeback.
        for job in &kept.restart {
            match self.start_background(sandbox, &job.name, &job.command, &job.workdir, true).await {
                Ok(_) => comeback.back.push(format!("background process '{}'", job.name)),
                Err(e) => {
                    comeback.not_back.push(format!("background process '{}' ({})", job.name, one_line(&e.to_string())))
                }
            }
        }
        for l in self.listeners() {
            for item in l.came_back(sandbox, kept).await {
                match item {
                    Ok(back) => comeback.back.push(back),
                    Err(not) => comeback.not_back.push(one_line(&not)),
                }
            }
        }
    }
}
