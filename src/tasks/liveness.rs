//! What `/livez` reports: the conditions and tasks the process cannot work without.
//!
//! Owns: those checks. Never restarts anything (the kubelet does, when `/livez` fails).

use std::sync::{
    Arc, Mutex,
    atomic::{AtomicBool, Ordering},
};

type Check = Box<dyn Fn() -> bool + Send + Sync>;

/// What `/livez` checks: named conditions that hold while the process can do its work (the
/// EC2 batcher runs, the leader election runs…). Once one fails the process is of no use
/// until restarted, and the kubelet restarts it.
#[derive(Clone, Default)]
pub(crate) struct Liveness {
    checks: Arc<Mutex<Vec<(&'static str, Check)>>>,
}

impl Liveness {
    /// Add a condition that must keep holding.
    pub(crate) fn check(
        &self,
        name: &'static str,
        alive: impl Fn() -> bool + Send + Sync + 'static,
    ) {
        self.checks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((name, Box::new(alive)));
    }

    /// A task that must keep running: it holds the returned guard for its whole life (a panic
    /// drops it too).
    pub(crate) fn task(&self, name: &'static str) -> TaskGuard {
        let flag = Arc::new(AtomicBool::new(true));
        let seen = flag.clone();
        self.check(name, move || seen.load(Ordering::SeqCst));
        TaskGuard(flag)
    }

    /// The names of the conditions that no longer hold.
    pub(crate) fn failing(&self) -> Vec<&'static str> {
        self.checks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(_, alive)| !alive())
            .map(|(name, _)| *name)
            .collect()
    }
}

/// Held by a task that must keep running; marks it ended when dropped.
pub struct TaskGuard(Arc<AtomicBool>);

impl Drop for TaskGuard {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}
