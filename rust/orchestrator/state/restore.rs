//! Putting the database's state back onto the sandboxes the helper still
//! has, at start.
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;

use super::{AuditRecord, Snapshot, Store, import, legacy_path, load, ops, time_of};
use crate::{Orchestrator, Sandbox};

/// Open the database at `db` (importing an old `state.json` beside it once),
/// and put what it holds back onto the freshly attached sandboxes: leases,
/// history, env, lost sandboxes, destroys to finish, then forwards and sync
/// jobs (which need their sandbox running). Problems are logged, and those
/// the user must know of are shown by `status` and `health`; a forward whose
/// port is now taken must not keep the others from coming back.
pub async fn restore(o: &Orchestrator, db: PathBuf) {
    let state = &o.sandboxes.state;
    let opened = tokio::task::spawn_blocking(move || Store::open(&db).map(|s| (s, db))).await;
    let (store, db) = match opened {
        Ok(Ok(((store, set_aside), db))) => {
            if let Some(aside) = set_aside {
                state.set_notice(format!(
                    "The state database was unreadable ({}) and was moved to {}; a new one was started, so leases, history and env saved before were not restored.",
                    aside.reason,
                    aside.moved_to.display()
                ));
            }
            (store, db)
        }
        Ok(Err(e)) => {
            state.set_notice(format!("State is not being saved: {e}"));
            return;
        }
        Err(e) => {
            state.set_notice(format!("State is not being saved: the database could not be opened: {e}"));
            return;
        }
    };
    let legacy = legacy_path(&db);
    match store.call(move |c| Ok(import::import(c, &legacy))).await {
        Ok(Ok(import::Imported::Done)) => tracing::info!("imported the old state file into {}", db.display()),
        Ok(Ok(import::Imported::Nothing)) => {}
        Ok(Err(e)) => state.set_notice(e.to_string()),
        Err(e) => state.set_notice(e.to_string()),
    }
    let key = store.key().clone();
    let snapshot = match store.call(move |c| load(c, &key)).await {
        Ok(s) => s,
        Err(e) => {
            state.set_notice(format!("State is not being saved: reading the state database failed: {e}"));
            return;
        }
    };
    if !snapshot.unopened_env.is_empty() {
        let names: Vec<String> = snapshot.unopened_env.iter().map(|n| crate::names::display(n)).collect();
        state.set_notice(format!(
            "The env saved for {} could not be opened: {} was replaced or damaged since it was sealed. A running \
             sandbox's own copy of its env is used and saved again; a sandbox that is not running lost its saved env.",
            names.join(", "),
            super::seal::key_path(&db).display()
        ));
    }
    let _ = state.store.set(store);
    apply(o, snapshot).await;
    o.sandboxes.committed().await;
}

async fn apply(o: &Orchestrator, mut saved: Snapshot) {
    let m = &o.sandboxes;
    // A creation recorded just before its server died was finished.
    // A lost sandbox's row is kept for its comeback: a VM whose comeback the
    // crash cut short (its marker left, the loss not yet cleared) was not.
    m.settle_unfinished(|n| {
        saved.sandboxes.iter().any(|(r, destroying)| r.name == n && !destroying) && !saved.lost.contains_key(n)
    })
    .await;
    let attached: BTreeMap<String, Arc<Sandbox>> = m.list().into_iter().map(|s| (s.name.clone(), s)).collect();
    let mut lost = saved.lost.clone();
    let mut recorded = BTreeSet::new();
    // Lost at this start (the machine restarted, the helper died with the
    // last daemon): the ones that serve something come back at once. A loss
    // recorded before had its chance then; one whose VM stopped on its own
    // waits for a call, so no daemon start restarts it in a loop.
    let mut lost_now = Vec::new();
    for (record, destroying) in &saved.sandboxes {
        let name = &record.name;
        recorded.insert(name.clone());
        match (attached.get(name), destroying) {
            // The server that was destroying it died first: finish the job.
            (Some(_), true) => {
                tracing::info!(sandbox = %name, "finishing a destroy cut short by a crash");
                if let Err(e) = m.destroy(name).await {
                    tracing::warn!(sandbox = %name, "could not finish destroying: {e}");
                }
            }
            (None, true) => m.record_removed(name).in_background(),
            (Some(s), false) => {
                s.set_lease(record.expires_at.map(time_of));
                let history = saved.history.remove(name).unwrap_or_default();
                s.restore_audit(history.iter().map(AuditRecord::entry).collect());
            }
            (None, false) => {
                if !lost.contains_key(name) {
                    lost_now.push(name.clone());
                }
                let why = "its VM was gone when the server restarted (the VM helper stopped or the machine rebooted)";
                let why = lost.entry(name.clone()).or_insert_with(|| why.into());
                m.record_lost(name, why).in_background();
            }
        }
    }
    let attached: BTreeMap<String, Arc<Sandbox>> = m.list().into_iter().map(|s| (s.name.clone(), s)).collect();
    for (name, s) in &attached {
        match saved.env.remove(name) {
            Some(env) => *s.env.lock().unwrap_or_else(|p| p.into_inner()) = env,
            // Attached for the first time since this database exists: what
            // the sandbox holds is the env.
            None => {
                let env = s.env();
                let name = name.clone();
                m.state
                    .submit_sealed("a sandbox's env", move |c, key| ops::put_env(c, key, &name, &env))
                    .in_background();
            }
        }
        if !recorded.contains(name) {
            m.record_sandbox(s).in_background();
        }
    }
    for name in lost.keys().filter(|n| attached.contains_key(*n)) {
        m.record_found(name).in_background();
    }
    lost.retain(|name, _| !attached.contains_key(name));
    m.set_lost(lost);
    m.revive_serving(lost_now);
    saved.gone_children.retain(|name, _| !attached.contains_key(name));
    m.set_gone_children(saved.gone_children);
    o.spawns.import_state(saved.spawn);
    for f in saved.forwards.iter().filter(|f| attached.contains_key(&f.sandbox)) {
        if let Err(e) = o.forwards.expose(&f.sandbox, f.port.into(), f.host_port.into()).await {
            tracing::warn!(sandbox = %f.sandbox, host_port = f.host_port, "could not restore port forward: {e}");
        }
    }
    for j in saved.sync_jobs.iter().filter(|j| attached.contains_key(&j.sandbox)) {
        if let Err(e) = o.syncs.resume(&j.id, &j.local, &j.dir, &j.sandbox, j.files_synced).await {
            tracing::warn!(job = %j.id, sandbox = %j.sandbox, "could not resume sync job: {e}");
        }
    }
}
