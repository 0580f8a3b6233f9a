//! Background tasks under supervision: none dies alone.
//!
//! A task whose inputs can be made again ([`supervise`]) is restarted after it panics or ends
//! when it should not, with a growing pause (1 s, doubling, at most a minute), each restart
//! counted in `task_restarts_total{task}` and logged. A task that owns what it cannot make
//! again (a channel's receiving end) holds a [`TaskGuard`] instead: its end fails
//! `/livez`, and the kubelet restarts the process.
//!
//! Panics unwind (the release profile does not set `panic = "abort"`): a bug met on one odd
//! object in one background task (a publisher, the reservations poll) restarts that task, while
//! the reconciles that keep every node's labels right go on. A panic on the reconcile path is
//! caught by its task as well (tokio isolates task panics) and retried as an error.
//!
//! Owns: restarting tasks. Never decides what a task does.

use std::{panic::AssertUnwindSafe, sync::Arc, time::Duration};

use futures::FutureExt;
use tracing::{error, warn};

use crate::metrics::Metrics;

mod liveness;
pub(crate) use liveness::{Liveness, TaskGuard};

#[cfg(test)]
mod tests;

/// Whether a task's end is expected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lifetime {
    /// Runs until the process stops: any end is restarted.
    Forever,
    /// Does its work once: only a panic is restarted.
    Once,
}

/// Test hook: the task of this name panics once, when it first starts.
pub(crate) const PANIC_ONCE_ENV: &str = "LABELER_TEST_PANIC_ONCE";

/// The first pause before a restart; it doubles with each restart in a row, up to [`MAX_PAUSE`].
pub(crate) const FIRST_PAUSE: Duration = Duration::from_secs(1);
/// The longest pause before a restart.
pub(crate) const MAX_PAUSE: Duration = Duration::from_secs(60);
/// A task that ran this long before it ended starts again from the first pause.
const SETTLED: Duration = Duration::from_secs(300);

/// Run the task `make` builds, under supervision (see the module's comment), on its own tokio
/// task.
pub(crate) fn supervise<F, Fut>(
    name: &'static str,
    lifetime: Lifetime,
    metrics: Arc<Metrics>,
    make: F,
) -> tokio::task::JoinHandle<()>
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    // Its `task_restarts_total` series is created at 0 from TASKS (dashboards need it).
    debug_assert!(
        crate::metrics::TASKS.contains(&name),
        "task {name:?} is not in metrics::TASKS"
    );
    tokio::spawn(run(name, lifetime, metrics, make))
}

async fn run<F, Fut>(name: &'static str, lifetime: Lifetime, metrics: Arc<Metrics>, mut make: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let mut in_a_row = 0u32;
    // Test hook (the e2e suite): the task named here panics once, on its first run.
    let mut panic_once = std::env::var(PANIC_ONCE_ENV).is_ok_and(|t| t == name);
    loop {
        let started = tokio::time::Instant::now();
        let run = async {
            if std::mem::take(&mut panic_once) {
                std::panic::resume_unwind(Box::new(format!("{PANIC_ONCE_ENV}={name}")));
            }
            make().await
        };
        match AssertUnwindSafe(run).catch_unwind().await {
            Ok(()) if lifetime == Lifetime::Once => return,
            Ok(()) => warn!(task = name, "a background task ended; restarting it"),
            Err(panic) => {
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                error!(task = name, panic = %message, "a background task panicked; restarting it (a bug: please report it with this line)");
            }
        }
        metrics.task_restart(name);
        if started.elapsed() >= SETTLED {
            in_a_row = 0;
        }
        in_a_row = in_a_row.saturating_add(1);
        let pause = crate::backoff::capped(FIRST_PAUSE, in_a_row, MAX_PAUSE);
        tokio::time::sleep(pause).await;
    }
}
