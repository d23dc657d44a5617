//! Long tool calls: MCP progress notifications while they run (when the
//! client sent a progress token) and cancellation. A cancelled call's future
//! is dropped, which closes its exec stream; the helper then kills the
//! process group, so cancelling really stops the work in the sandbox.
use std::{future::Future, time::Duration};

use rmcp::{RoleServer, model::ProgressNotificationParam, service::RequestContext};
use tokio::{sync::mpsc, time::Instant};

/// How often a running call reports progress.
const INTERVAL: Duration = Duration::from_secs(1);

/// Where a long call's progress reports come from.
pub enum Progress {
    /// `<label>: <N>s` every second.
    Clock,
    /// The work's own steps, `(k, total, text)`, reported as `Step k/total: text`.
    Steps(mpsc::UnboundedReceiver<(usize, usize, String)>),
    /// The work's own reports, `(progress, total, text)`, as they are; the
    /// sender keeps `progress` increasing, as MCP requires.
    Reports(mpsc::UnboundedReceiver<(f64, Option<f64>, String)>),
}

/// Run `work`, reporting `<label>: <N>s` every second to a client that asked
/// for progress. Returns `None` if the client cancelled the call.
pub async fn supervise<F: Future>(ctx: &RequestContext<RoleServer>, label: &str, work: F) -> Option<F::Output> {
    supervise_with(ctx, label, work, Progress::Clock).await
}

/// [`supervise`] with the progress reports coming from `progress`.
pub async fn supervise_with<F: Future>(
    ctx: &RequestContext<RoleServer>,
    label: &str,
    work: F,
    mut progress: Progress,
) -> Option<F::Output> {
    let Some(token) = ctx.meta.get_progress_token() else {
        // No progress wanted: only cancellation to watch, no timer on the hot path.
        return tokio::select! {
            out = work => Some(out),
            _ = ctx.ct.cancelled() => {
                tracing::info!(%label, "call cancelled by the client");
                None
            }
        };
    };
    let started = Instant::now();
    let mut tick = tokio::time::interval_at(started + INTERVAL, INTERVAL);
    tokio::pin!(work);
    loop {
        let next = async {
            match &mut progress {
                Progress::Clock => {
                    tick.tick().await;
                    let secs = started.elapsed().as_secs();
                    Some(
                        ProgressNotificationParam::new(token.clone(), secs as f64)
                            .with_message(format!("{label}: {secs}s")),
                    )
                }
                Progress::Steps(steps) => steps.recv().await.map(|(k, total, text)| {
                    ProgressNotificationParam::new(token.clone(), k as f64)
                        .with_total(total as f64)
                        .with_message(format!("Step {k}/{total}: {text}"))
                }),
                Progress::Reports(reports) => reports.recv().await.map(|(done, total, text)| {
                    let param = ProgressNotificationParam::new(token.clone(), done).with_message(text);
                    match total {
                        Some(total) => param.with_total(total),
                        None => param,
                    }
                }),
            }
        };
        tokio::select! {
            out = &mut work => return Some(out),
            _ = ctx.ct.cancelled() => {
                tracing::info!(%label, "call cancelled by the client");
                return None;
            }
            Some(param) = next => {
                // A client that went away cannot be told; the work goes on.
                let _ = ctx.peer.notify_progress(param).await;
            }
        }
    }
}

/// The tool text for a cancelled call.
pub const CANCELLED: &str = "cancelled by the client; the command's process group was killed";
