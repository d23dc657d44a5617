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

/// `n thing` or `n things`.
fn count(n: usize, thing: &str) -> String {
    if n == 1 { format!("1 {thing}") } else { format!("{n} {thing}s") }
}

impl SandboxManager {
    /// Boot `name` again if it is a lost top-level sandbox, and say what its
    /// loss cost in one line; `None` when it was not lost (or another call
    /// brought it back first). A child never comes back on its own: its
    /// parent's spawn made it, and `destroy_child` forgets it.
    pub async fn revive(&self, name: &str) -> Result<Option<Comeback>, OrchestratorError> {
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
        let could_not = |e: OrchestratorError| {
            OrchestratorError::NotPermitted(format!(
                "sandbox '{}' was lost ({why}) and could not be started again: {e}. Its /workspace is kept; \
                 destroy('{0}') forgets it",
                names::display(name)
            ))
        };
        let kept = self.kept(name).await.map_err(|e| could_not(e.into()))?;
        let mut origin = Origin::default();
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
        self.lost.lock().unwrap_or_else(|p| p.into_inner()).remove(name);
        let mut comeback = Comeback {
            name: name.to_string(),
            image: sandbox.image.clone(),
            why,
            kept: vec!["/workspace".into()],
            back: Vec::new(),
            not_back: image_note.into_iter().collect(),
        };
        self.put_back(&sandbox, kept, &mut comeback).await;
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
    /// sandboxes `names` that serve something: a background process marked
    /// to restart, or a port forward. Their notice waits for the next call
    /// on them. Called for losses the sandbox did not cause (its helper
    /// died, the machine restarted), so a sandbox that crashes its own VM
    /// is not started again in a loop.
    pub fn revive_serving(self: &Arc<Self>, names: Vec<String>) {
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            for name in names {
                let Some(manager) = me.upgrade() else { return };
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
    /// it, noting in `comeback` what is back and what is not.
    async fn put_back(&self, sandbox: &Arc<Sandbox>, mut kept: Kept, comeback: &mut Comeback) {
        let env = kept.env.take();
        match &env {
            // The saved env is the truth, also when empty: not the copy a
            // restored snapshot's root filesystem carries.
            Some(env) => match self.adopt_env(sandbox, env.clone()).await {
                Ok(()) if env.is_empty() => {}
                Ok(()) => comeback.kept.push(format!("env ({})", count(env.len(), "key"))),
                Err(e) => comeback.not_back.push(format!("env ({e})")),
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
        let (history, restart) = (std::mem::take(&mut kept.history), std::mem::take(&mut kept.restart));
        if let Err(e) = self.save_kept(&sandbox.name, Kept { history, env, ..Kept::default() }).await {
            comeback.not_back.push(format!("a saved record of its env and history ({e})"));
        }
        for job in restart {
            match self.start_background(sandbox, &job.name, &job.command, &job.workdir, true).await {
                Ok(_) => comeback.back.push(format!("background process '{}'", job.name)),
                Err(e) => comeback.not_back.push(format!("background process '{}' ({e})", job.name)),
            }
        }
        for l in self.listeners() {
            for item in l.came_back(sandbox, &kept).await {
                match item {
                    Ok(back) => comeback.back.push(back),
                    Err(not) => comeback.not_back.push(not),
                }
            }
        }
    }
}
