//! The warm launcher: one launcher ([`Prepared`]) kept ready ahead of the
//! next start, so that a start only does the work that depends on its VM.
//!
//! Preparing is mostly waiting on the kernel: on cgroup v1, moving a process
//! into a cgroup write-locks the global cgroup_threadgroup_rwsem, which waits
//! for an RCU grace period (5-20 ms) unless another move happened within the
//! last one. A start that finds a warm launcher skips that wait. The next one
//! is prepared in the background as soon as a start takes the warm one, not
//! once that start is over: back-to-back starts (an agent creating several
//! sandboxes) then each find one ready, or one nearly ready to wait for,
//! instead of every start after the first preparing its own. That
//! preparation overlaps the start's own work, which costs the start far less
//! than the wait it saves the next one.
//!
//! A warm launcher is no VM: it is in no registry, has no limits and no
//! config. It dies with the helper (its end of the control socket closes),
//! and [`Launchers::close`] kills it and removes its cgroup at shutdown.
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::DriverError;
use super::launch::{Prepared, Spawner};

/// The helper's warm launcher and how to make the next one.
#[derive(Debug)]
pub struct Launchers {
    spawner: Spawner,
    ready: Mutex<Option<Prepared>>,
    /// Held while a launcher is being prepared in the background: one at a
    /// time; [`Launchers::take`] and [`Launchers::close`] wait for it.
    filling: Arc<tokio::sync::Mutex<()>>,
    closed: AtomicBool,
    counts: LaunchCounts,
}

/// How the starts since the helper started got their launcher.
#[derive(Debug, Default)]
pub struct LaunchCounts {
    /// Starts that got a launcher prepared ahead.
    pub warm: AtomicU64,
    /// Starts that had to prepare their own (none was ready or being
    /// prepared, or the ready one had died).
    pub cold: AtomicU64,
}

impl Launchers {
    /// No launcher is prepared until [`Launchers::refill`].
    pub fn new(spawner: Spawner) -> Arc<Self> {
        Arc::new(Launchers {
            spawner,
            ready: Mutex::new(None),
            filling: Arc::new(tokio::sync::Mutex::new(())),
            closed: AtomicBool::new(false),
            counts: LaunchCounts::default(),
        })
    }

    fn ready(&self) -> std::sync::MutexGuard<'_, Option<Prepared>> {
        self.ready.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The warm launcher if there is a live one (waiting for the one being
    /// prepared, which is never slower than preparing another), else one
    /// prepared now; `Ok((launcher, true))` for a warm one.
    pub async fn take(&self) -> Result<(Prepared, bool), DriverError> {
        let warm = {
            let _filled = self.filling.lock().await;
            self.ready().take()
        };
        if let Some(mut p) = warm {
            if !p.is_dead() {
                self.counts.warm.fetch_add(1, Ordering::Relaxed);
                return Ok((p, true));
            }
            tracing::warn!("the warm vm launcher died while waiting; preparing another");
            p.discard().await;
        }
        Ok((self.prepare_now().await?, false))
    }

    /// A launcher prepared for this start alone.
    pub async fn prepare_now(&self) -> Result<Prepared, DriverError> {
        self.counts.cold.fetch_add(1, Ordering::Relaxed);
        self.spawner.prepare().await
    }

    /// Prepares the next launcher in the background, unless one is ready,
    /// being prepared, or the helper is shutting down. Failures are only
    /// logged: the next start then prepares its own and reports them.
    pub fn refill(self: &Arc<Self>) {
        if self.closed.load(Ordering::SeqCst) {
            return;
        }
        // Taken here, not in the task: a `take` right after this call must
        // see the preparation under way and wait for it.
        let Ok(filling) = self.filling.clone().try_lock_owned() else { return };
        let me = self.clone();
        tokio::spawn(async move {
            let _filling = filling;
            if me.closed.load(Ordering::SeqCst) || me.ready().is_some() {
                return;
            }
            match me.spawner.prepare().await {
                Ok(p) => {
                    let old = me.ready().replace(p);
                    if let Some(old) = old {
                        old.discard().await;
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cannot prepare a vm launcher ahead; starts prepare their own"),
            }
        });
    }

    /// How the starts so far got their launcher.
    pub fn counts(&self) -> &LaunchCounts {
        &self.counts
    }

    /// Stops preparing launchers and discards the warm one (helper
    /// shutdown).
    pub async fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let _filling = self.filling.lock().await;
        let warm = self.ready().take();
        if let Some(p) = warm {
            p.discard().await;
        }
    }
}
