//! The warm launcher: one launcher ([`Prepared`]) kept ready ahead of the
//! next start, so that a start only does the work that depends on its VM.
//!
//! Preparing is mostly waiting on the kernel: on cgroup v1, moving a process
//! into a cgroup write-locks the global cgroup_threadgroup_rwsem, which waits
//! for an RCU grace period (5-20 ms) unless another move happened within the
//! last one. A start that finds a warm launcher skips that wait; the next one
//! is prepared in the background once the start is over, so it competes with
//! no start for the two locks and the CPU.
//!
//! A warm launcher is no VM: it is in no registry, has no limits and no
//! config. It dies with the helper (its end of the control socket closes),
//! and [`Launchers::close`] kills it and removes its cgroup at shutdown.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::DriverError;
use super::launch::{Prepared, Spawner};

/// The helper's warm launcher and how to make the next one.
#[derive(Debug)]
pub struct Launchers {
    spawner: Spawner,
    ready: Mutex<Option<Prepared>>,
    /// Held while a launcher is being prepared in the background: one at a
    /// time, and [`Launchers::close`] waits for it.
    filling: tokio::sync::Mutex<()>,
    closed: AtomicBool,
}

impl Launchers {
    /// No launcher is prepared until [`Launchers::refill`].
    pub fn new(spawner: Spawner) -> Arc<Self> {
        Arc::new(Launchers {
            spawner,
            ready: Mutex::new(None),
            filling: tokio::sync::Mutex::new(()),
            closed: AtomicBool::new(false),
        })
    }

    fn ready(&self) -> std::sync::MutexGuard<'_, Option<Prepared>> {
        self.ready.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The warm launcher if there is a live one, else one prepared now.
    pub async fn take(&self) -> Result<Prepared, DriverError> {
        let warm = self.ready().take();
        if let Some(mut p) = warm {
            if !p.is_dead() {
                return Ok(p);
            }
            tracing::warn!("the warm vm launcher died while waiting; preparing another");
            p.discard().await;
        }
        self.spawner.prepare().await
    }

    /// Prepares the next launcher in the background, unless one is ready,
    /// being prepared, or the helper is shutting down. Failures are only
    /// logged: the next start then prepares its own and reports them.
    pub fn refill(self: &Arc<Self>) {
        if self.closed.load(Ordering::SeqCst) {
            return;
        }
        let me = self.clone();
        tokio::spawn(async move {
            let Ok(_filling) = me.filling.try_lock() else { return };
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
