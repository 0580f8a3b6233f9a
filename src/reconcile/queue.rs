//! Which node's reconcile runs when: a queue keyed by node name, and the loop that drives it.
//!
//! kube-runtime's `Controller` does this for any resource, and pays for its generality per
//! node: each queued request holds an `ObjectRef` (name, UID and resourceVersion copied again)
//! twice, once in its scheduler's map and once in its timer wheel, and it can only read objects
//! from its own reflector store of whole typed objects. Ours holds one shared name per node and
//! reads the node from the controller's own cache through a closure, so the cache can keep only
//! what a reconcile reads.
//!
//! The rules are kube-runtime's: a node is reconciled by at most one task at a time (a request
//! that arrives meanwhile runs once that task ends); requests for a node that is waiting merge
//! (the earliest time wins); the reconcile's [`Action`] says when to look again; nothing starts
//! before `ready` resolves (the controller's resolves at once: its cache serves the first list's
//! nodes as they come); on SIGTERM or SIGINT no new reconcile starts and the running
//! ones finish.
//!
//! Owns: when a node's reconcile runs, and how many run at once. Never reconciles.

use std::{
    collections::{BTreeSet, HashMap, HashSet, VecDeque},
    future::Future,
    panic::AssertUnwindSafe,
    sync::Arc,
    time::Duration,
};

use futures::{FutureExt, Stream, StreamExt};
use tokio::{task::JoinSet, time::Instant};

/// A node's name, shared by every place the queue keeps it.
pub(crate) type Key = Arc<str>;

/// When a reconcile panicked, its node is looked at again after this long (a bug, not a
/// condition that passes quickly: once a minute keeps the log readable and the node in hand).
pub(crate) const AFTER_PANIC: Duration = Duration::from_secs(60);

/// What a reconcile asks for next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Action {
    requeue_after: Option<Duration>,
}

impl Action {
    /// Look at the node again after `after`, even if it does not change.
    pub(crate) const fn requeue(after: Duration) -> Self {
        Self {
            requeue_after: Some(after),
        }
    }

    /// Look at the node again when it changes (or at its resync slot).
    pub const fn await_change() -> Self {
        Self {
            requeue_after: None,
        }
    }

    pub(crate) const fn requeue_after(&self) -> Option<Duration> {
        self.requeue_after
    }
}

/// The queue's state: each node is in at most one of `ready` (waiting to start) and `running`,
/// and may have one timer besides.
#[derive(Debug, Default)]
pub(crate) struct Queue {
    /// To start, first come first served.
    ready: VecDeque<Key>,
    /// The names in `ready`.
    queued: HashSet<Key>,
    /// Reconciling now.
    running: HashSet<Key>,
    /// Asked for while running: queued again when that reconcile ends.
    again: HashSet<Key>,
    /// Requeues, by time.
    timers: BTreeSet<(Instant, Key)>,
    /// Each node's timer in `timers`.
    due_at: HashMap<Key, Instant>,
}

impl Queue {
    /// Reconcile `key` as soon as a slot is free (once, however often asked).
    pub(crate) fn now(&mut self, key: Key) {
        if let Some(at) = self.due_at.remove(&key) {
            self.timers.remove(&(at, key.clone()));
        }
        if self.running.contains(&key) {
            self.again.insert(key);
        } else if self.queued.insert(key.clone()) {
            self.ready.push_back(key);
        }
    }

    /// Reconcile `key` at `at`, unless it is asked for sooner.
    pub(crate) fn at(&mut self, key: Key, at: Instant) {
        if self.queued.contains(&key) || self.again.contains(&key) {
            return;
        }
        match self.due_at.get(&key) {
            Some(t) if *t <= at => return,
            Some(t) => {
                self.timers.remove(&(*t, key.clone()));
            }
            None => {}
        }
        self.timers.insert((at, key.clone()));
        self.due_at.insert(key, at);
    }

    /// Move every timer due by `now` to the ready queue.
    pub(crate) fn fire(&mut self, now: Instant) {
        while let Some((at, _)) = self.timers.first() {
            if *at > now {
                break;
            }
            if let Some((_, key)) = self.timers.pop_first() {
                self.due_at.remove(&key);
                self.now(key);
            }
        }
    }

    /// When the next timer is due.
    pub(crate) fn next_timer(&self) -> Option<Instant> {
        self.timers.first().map(|(at, _)| *at)
    }

    /// The next node to reconcile; it counts as running until [`Queue::done`].
    pub(crate) fn start(&mut self) -> Option<Key> {
        let key = self.ready.pop_front()?;
        self.queued.remove(&key);
        self.running.insert(key.clone());
        Some(key)
    }

    /// `key`'s reconcile ended at `now`, asking for `next`.
    pub(crate) fn done(&mut self, key: &Key, next: Action, now: Instant) {
        self.running.remove(key);
        if self.again.remove(key) {
            self.now(key.clone());
        } else if let Some(after) = next.requeue_after() {
            self.at(key.clone(), now + after);
        }
    }

    /// Reconciles running.
    #[cfg(test)]
    pub(crate) fn running(&self) -> usize {
        self.running.len()
    }

    /// Nodes waiting for a slot.
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> usize {
        self.ready.len()
    }
}

/// What the loop is given to work with.
pub(crate) struct Sources<R, A, Rd, S> {
    /// Nodes to reconcile now: the watch's changes, the resync's slots, an election's sweep.
    pub requests: R,
    /// Every node in the cache, now (on each item).
    pub all: A,
    /// Resolves once `get` can serve the nodes asked for; nothing starts before.
    pub ready: Rd,
    /// Resolves when the controller is to stop.
    pub(crate) shutdown: S,
    /// At most this many reconciles at once.
    pub concurrency: usize,
}

/// Run reconciles until `shutdown` resolves (then the running ones finish) or `requests` ends.
/// `get` reads a node from the cache (a node gone from it is skipped); `names` lists the cache;
/// `work` reconciles one node and says what next (errors are the caller's to turn into one).
pub(crate) async fn run<T, R, A, Rd, S, G, N, W, F>(
    sources: Sources<R, A, Rd, S>,
    get: G,
    names: N,
    work: W,
) where
    T: Send + Sync + 'static,
    R: Stream<Item = Key>,
    A: Stream<Item = ()>,
    Rd: Future<Output = ()>,
    S: Future<Output = ()>,
    G: Fn(&str) -> Option<Arc<T>>,
    N: Fn() -> Vec<Key>,
    W: Fn(Arc<T>) -> F,
    F: Future<Output = Action> + Send + 'static,
{
    let Sources {
        requests,
        all,
        ready,
        shutdown,
        concurrency,
    } = sources;
    let concurrency = concurrency.max(1);
    let mut queue = Queue::default();
    let mut tasks: JoinSet<(Key, Action)> = JoinSet::new();
    let mut requests = std::pin::pin!(requests);
    let mut all = std::pin::pin!(all);
    let mut ready = std::pin::pin!(ready);
    let mut shutdown = std::pin::pin!(shutdown);
    let mut synced = false;
    let mut stopping = false;
    loop {
        // Take every change the watch has ready before anything else: the cache and the
        // records stay current however busy the reconciles are.
        while !stopping {
            match requests.next().now_or_never() {
                Some(Some(key)) => queue.now(key),
                Some(None) => stopping = true,
                None => break,
            }
        }
        if synced && !stopping {
            while tasks.len() < concurrency {
                let Some(key) = queue.start() else { break };
                match get(&key) {
                    Some(node) => {
                        // A panic is caught inside the task so that its node leaves `running`
                        // (a JoinError does not say which node it was) and is tried again.
                        let job = AssertUnwindSafe(work(node)).catch_unwind();
                        tasks.spawn(async move {
                            let next = match job.await {
                                Ok(next) => next,
                                Err(panic) => {
                                    tracing::error!(
                                        node = %key,
                                        panic = panic_message(panic.as_ref()),
                                        retry_in = ?AFTER_PANIC,
                                        "reconcile panicked; this is a bug, please report it"
                                    );
                                    Action::requeue(AFTER_PANIC)
                                }
                            };
                            (key, next)
                        });
                    }
                    // Gone from the cache since it was asked for: nothing to do.
                    None => queue.done(&key, Action::await_change(), Instant::now()),
                }
            }
        }
        if stopping && tasks.is_empty() {
            return;
        }
        let timer = queue.next_timer();
        // Unbiased: while reconciles end back to back, the watch's changes must still be read
        // (a queue that favoured finished tasks left every write's echo waiting for its event
        // until the install was over: 19 MB more at its peak at 10,000 nodes).
        tokio::select! {
            () = &mut shutdown, if !stopping => stopping = true,
            Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                // Tasks are never aborted and catch their own panics, so every one ends Ok.
                if let Ok((key, next)) = done {
                    queue.done(&key, next, Instant::now());
                }
            }
            () = &mut ready, if !synced => synced = true,
            key = requests.next(), if !stopping => match key {
                Some(key) => queue.now(key),
                None => stopping = true,
            },
            Some(()) = all.next(), if !stopping => {
                for key in names() {
                    queue.now(key);
                }
            }
            () = sleep_until(timer), if timer.is_some() && !stopping => queue.fire(Instant::now()),
        }
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(not a string)")
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Resolves on SIGTERM or SIGINT.
pub(crate) async fn signalled() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(s: &str) -> Key {
        Arc::from(s)
    }

    #[test]
    fn a_node_asked_for_many_times_runs_once() {
        let mut q = Queue::default();
        q.now(k("a"));
        q.now(k("b"));
        q.now(k("a"));
        assert_eq!(q.start(), Some(k("a")));
        assert_eq!(q.start(), Some(k("b")));
        assert_eq!(q.start(), None);
    }

    #[test]
    fn a_node_asked_for_while_running_runs_again_after_and_not_alongside() {
        let mut q = Queue::default();
        let t = Instant::now();
        q.now(k("a"));
        assert_eq!(q.start(), Some(k("a")));
        q.now(k("a"));
        assert_eq!(q.start(), None, "never two reconciles of one node at once");
        // Its requeue is superseded by the request that came meanwhile.
        q.done(&k("a"), Action::requeue(Duration::from_secs(60)), t);
        assert_eq!(q.start(), Some(k("a")));
        q.done(&k("a"), Action::await_change(), t);
        assert_eq!(q.next_timer(), None);
        assert_eq!(q.start(), None);
    }

    #[test]
    fn the_earliest_time_wins_and_a_request_now_cancels_the_timer() {
        let mut q = Queue::default();
        let t = Instant::now();
        q.at(k("a"), t + Duration::from_secs(10));
        q.at(k("a"), t + Duration::from_secs(30));
        assert_eq!(q.next_timer(), Some(t + Duration::from_secs(10)));
        q.at(k("a"), t + Duration::from_secs(5));
        assert_eq!(q.next_timer(), Some(t + Duration::from_secs(5)));
        q.fire(t + Duration::from_secs(4));
        assert_eq!(q.start(), None, "not due yet");
        q.now(k("a"));
        assert_eq!(q.next_timer(), None);
        assert_eq!(q.start(), Some(k("a")));
    }

    #[test]
    fn a_requeue_comes_due_at_its_time() {
        let mut q = Queue::default();
        let t = Instant::now();
        q.now(k("a"));
        assert_eq!(q.start(), Some(k("a")));
        q.done(&k("a"), Action::requeue(Duration::from_secs(2)), t);
        assert_eq!(q.running(), 0);
        q.fire(t + Duration::from_secs(1));
        assert_eq!(q.waiting(), 0);
        q.fire(t + Duration::from_secs(2));
        assert_eq!(q.start(), Some(k("a")));
    }

    #[tokio::test(start_paused = true)]
    async fn the_loop_holds_concurrency_waits_for_the_cache_and_lets_running_reconciles_finish() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let (tx, rx) = futures::channel::mpsc::unbounded::<Key>();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<()>();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let finished = Arc::new(AtomicUsize::new(0));
        for i in 0..20 {
            tx.unbounded_send(k(&format!("n{i}"))).ok();
        }
        let (r, m, f) = (running.clone(), most.clone(), finished.clone());
        let lp = tokio::spawn(run(
            Sources {
                requests: rx,
                all: futures::stream::pending(),
                ready: async {
                    ready_rx.await.ok();
                },
                shutdown: async {
                    stop_rx.await.ok();
                },
                concurrency: 3,
            },
            |name: &str| Some(Arc::new(name.to_string())),
            Vec::new,
            move |_node| {
                let (r, m, f) = (r.clone(), m.clone(), f.clone());
                async move {
                    let now = r.fetch_add(1, Ordering::SeqCst) + 1;
                    m.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    r.fetch_sub(1, Ordering::SeqCst);
                    f.fetch_add(1, Ordering::SeqCst);
                    Action::await_change()
                }
            },
        ));
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(
            finished.load(Ordering::SeqCst),
            0,
            "nothing before the cache syncs"
        );
        ready_tx.send(()).ok();
        tokio::time::sleep(Duration::from_millis(2500)).await;
        assert_eq!(most.load(Ordering::SeqCst), 3);
        assert_eq!(finished.load(Ordering::SeqCst), 6);
        // Stopping: the three running finish, nothing more starts.
        stop_tx.send(()).ok();
        lp.await.ok();
        assert_eq!(finished.load(Ordering::SeqCst), 9);
        assert_eq!(running.load(Ordering::SeqCst), 0);
    }

    type Running = tokio::task::JoinHandle<()>;
    type Calls = Arc<std::sync::atomic::AtomicUsize>;

    /// A loop of one reconcile at a time whose first reconcile panics; its requests, the
    /// reconciles started so far, and the loop.
    fn first_reconcile_panics() -> (futures::channel::mpsc::UnboundedSender<Key>, Calls, Running) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let (tx, rx) = futures::channel::mpsc::unbounded::<Key>();
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        let lp = tokio::spawn(run(
            Sources {
                requests: rx,
                all: futures::stream::pending(),
                ready: async {},
                shutdown: std::future::pending(),
                concurrency: 1,
            },
            |name: &str| Some(Arc::new(name.to_string())),
            Vec::new,
            move |_node| {
                let c = c.clone();
                async move {
                    if c.fetch_add(1, Ordering::SeqCst) == 0 {
                        panic!("first reconcile fails");
                    }
                    Action::await_change()
                }
            },
        ));
        (tx, calls, lp)
    }

    #[tokio::test(start_paused = true)]
    async fn a_reconcile_that_panics_does_not_keep_its_node_forever() {
        use std::sync::atomic::Ordering;
        let (tx, calls, lp) = first_reconcile_panics();
        tx.unbounded_send(k("a")).ok();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        // The node is not stuck as running: a change runs it at once, and the loop lives on.
        tx.unbounded_send(k("a")).ok();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(
            calls.load(Ordering::SeqCst),
            2,
            "a change after the panic runs"
        );
        assert!(!lp.is_finished());
        lp.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_reconcile_that_panics_is_tried_again_after_a_while() {
        use std::sync::atomic::Ordering;
        let (tx, calls, lp) = first_reconcile_panics();
        tx.unbounded_send(k("a")).ok();
        tokio::time::sleep(AFTER_PANIC - Duration::from_secs(1)).await;
        assert_eq!(
            calls.load(Ordering::SeqCst),
            1,
            "not at once: a panic is a bug"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(
            calls.load(Ordering::SeqCst),
            2,
            "tried again with no change"
        );
        lp.abort();
        drop(tx);
    }
}
