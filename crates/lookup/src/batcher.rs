//! The batcher: one task that turns every lookup's miss into few `DescribeInstanceTopology`
//! calls. IDs of one region wait in a queue that goes out when 100 wait, when the burst they
//! belong to has gone quiet, or at the latest after the max wait — and only when the shared
//! limiter has a token. A call EC2 refuses for one ID is split to find it; a throttled call is
//! sent again after the limiter's pause; while EC2 fails, the last failed call is repeated as a
//! probe, so its recovery is noticed at once.
//!
//! Owns: the queues, the calls in flight, EC2's health. Never touches the cache or the
//! Kubernetes API: answers go back to the waiting lookups.

use std::{
    collections::{BTreeMap, HashMap, VecDeque, hash_map::Entry},
    sync::Arc,
    time::Duration,
};

use futures::{StreamExt, stream::FuturesUnordered};
use tokio::{
    sync::{mpsc, oneshot, watch},
    time::Instant,
};
use tracing::{debug, warn};

use super::{Answer, LookupConfig, Request, limiter::Limiter};
use crate::{
    Observer,
    topology::{Ec2Error, InstanceTopology, MAX_IDS_PER_CALL, TopologySource},
};

pub(super) struct Batcher<S> {
    source: Arc<S>,
    limiter: Arc<Limiter>,
    cfg: LookupConfig,
    observer: Arc<dyn Observer>,
    health: Arc<Health>,
}

/// Which regions' EC2 calls are failing (errors, or throttling that outlasted its re-sends),
/// to notice the moment they stop. Per region: a region that never answers (one named by a
/// hostile providerID, `aws:///zz-north-1a/i-…`) is that region's failure only, and a success
/// elsewhere is no recovery.
pub(super) struct Health {
    failing: std::sync::Mutex<std::collections::HashSet<String>>,
    recovered: watch::Sender<u64>,
}

impl Health {
    pub(super) fn new(recovered: watch::Sender<u64>) -> Self {
        Self {
            failing: std::sync::Mutex::default(),
            recovered,
        }
    }

    fn regions(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<String>> {
        // A set of names changed by single inserts and removals: whole after any panic.
        self.failing.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn failed(&self, region: &str) {
        let mut regions = self.regions();
        if !regions.contains(region) {
            regions.insert(region.to_string());
        }
    }

    /// Whether any region's calls are failing (a probe is due).
    fn any_failing(&self) -> bool {
        !self.regions().is_empty()
    }

    /// A call to `region` was answered: if its calls were failing, every node waiting out a
    /// per-node backoff can be re-checked now.
    fn answered(&self, region: &str) {
        let was_failing = self.regions().remove(region);
        if was_failing {
            self.recovered.send_modify(|n| *n += 1);
        }
    }
}

/// One call's worth of instance IDs of one region.
#[derive(Debug, Clone)]
struct Batch {
    region: String,
    ids: Vec<String>,
    /// How often EC2 throttled this very batch so far.
    throttled: u32,
}

type BatchResult = (Batch, Result<Vec<InstanceTopology>, Ec2Error>);

/// A throttled batch is sent again (after the shared limiter's pause, ahead of new calls) this
/// many times before its waiters get the error: throttling is a request to slow down, not a
/// failure of the instances, so it costs their nodes a short wait, not a per-node backoff.
pub(super) const THROTTLED_RESENDS: u32 = 5;

/// IDs of one region waiting for a call.
struct Waiting {
    /// IDs whose node is joining (new, or held back by a startup taint): each call takes
    /// these first, so a join never waits behind a walk, a resync or an install.
    urgent: Vec<String>,
    /// The others, in arrival order.
    ids: Vec<String>,
    /// When the oldest of `ids` arrived.
    first_at: Instant,
    last_at: Instant,
    /// The burst these IDs belong to: when it began and how many IDs have arrived since,
    /// counting those already sent in full calls. A full call that empties the queue keeps
    /// this, so the rest of a burst that arrives in clumps is judged by the burst's rate.
    burst_at: Instant,
    burst_len: usize,
    /// When the first of `urgent` arrived.
    urgent_at: Option<Instant>,
}

impl Waiting {
    fn len(&self) -> usize {
        self.urgent.len() + self.ids.len()
    }

    fn is_empty(&self) -> bool {
        self.urgent.is_empty() && self.ids.is_empty()
    }

    /// `id`, queued as not urgent, is urgent after all (its node's reconcile asked about it).
    fn promote(&mut self, id: &str, now: Instant) {
        if let Some(at) = self.ids.iter().position(|i| i == id) {
            let id = self.ids.remove(at);
            self.urgent.push(id);
            self.urgent_at.get_or_insert(now);
        }
    }

    /// The next call's IDs: the urgent ones first, then the longest waiting.
    fn take(&mut self, max_batch: usize) -> Vec<String> {
        let urgent = self.urgent.len().min(max_batch);
        let mut batch: Vec<String> = self.urgent.drain(..urgent).collect();
        let rest = self.ids.len().min(max_batch - urgent);
        batch.extend(self.ids.drain(..rest));
        batch
    }

    /// When this queue should be sent, seen at `now`: at once when full; otherwise after a
    /// quiet `window` since the last arrival — unless the queue has been filling so fast that,
    /// at that rate, it would be full within a few windows (a burst that stalled for a moment:
    /// a busy machine delays watch events in clumps; the rate is the burst's, counting IDs
    /// already sent) — then until three windows after the last arrival at most; never later
    /// than `max_wait` after the oldest waiting ID arrived, nor later than two windows after
    /// the first urgent ID (a joining node: a node waiting for its labels is capacity standing
    /// idle, worth a less full call), three when only joiners wait and at the burst's rate they
    /// would fill the call within three windows.
    fn due(&self, cfg: &LookupConfig, max_batch: usize, now: Instant) -> Instant {
        let len = self.len();
        if len >= max_batch {
            return self.first_at;
        }
        let window = cfg.batch_window;
        // At the burst's rate, how long until the queue is full (`None`: no burst to judge).
        let elapsed = now.saturating_duration_since(self.burst_at).as_secs_f64();
        let to_fill = (self.burst_len >= 2 && elapsed > 0.0).then(|| {
            let rate = (self.burst_len - 1) as f64 / elapsed;
            Duration::from_secs_f64((max_batch - len) as f64 / rate)
        });
        let fills = to_fill.filter(|t| *t <= window.saturating_mul(3));
        let mut cap = self.first_at + cfg.batch_max_wait;
        if let Some(urgent) = self.urgent_at {
            // A joiner waits two windows at most; three while a burst of joiners alone is about
            // to fill its call (nodes created together are all joining, and arrive in clumps:
            // sent at two windows, their calls would go out part full). Behind a walk, a resync
            // or an install (IDs not urgent queued too) it waits two.
            let windows = if fills.is_some() && self.ids.is_empty() {
                3
            } else {
                2
            };
            cap = cap.min(urgent + window.saturating_mul(windows).min(cfg.batch_max_wait));
        }
        let quiet = self.last_at + window;
        match fills {
            Some(to_fill) if now >= quiet => {
                // Held for a stall, not for a burst that has ended: three windows after the
                // last arrival at most.
                let stall = self.last_at + window.saturating_mul(3);
                (now + to_fill).min(cap).min(stall)
            }
            _ => quiet.min(cap),
        }
    }
}

impl<S: TopologySource> Batcher<S> {
    pub(super) fn new(
        source: Arc<S>,
        limiter: Arc<Limiter>,
        cfg: LookupConfig,
        observer: Arc<dyn Observer>,
        health: Arc<Health>,
    ) -> Self {
        Self {
            source,
            limiter,
            cfg,
            observer,
            health,
        }
    }

    pub(super) async fn run(self, mut rx: mpsc::UnboundedReceiver<Request>) {
        // Waiters per (region, instance): queued or in flight. A second ask for an instance that
        // is already on its way joins the first.
        let mut waiting: HashMap<(String, String), Vec<oneshot::Sender<Answer>>> = HashMap::new();
        // Per (region, refused): IDs EC2 refused when last asked wait in a queue of their own,
        // batched like any other, so they can fail only each other's calls.
        let mut queued: BTreeMap<(String, bool), Waiting> = BTreeMap::new();
        // The shared limiter has no token before this: IDs keep joining the queue meanwhile, so a
        // throttled or rate-limited period produces fuller calls rather than more of them.
        let mut blocked_until: Option<Instant> = None;
        let mut in_flight = FuturesUnordered::new();
        let mut open = true;
        let max_batch = self.cfg.max_batch.clamp(1, MAX_IDS_PER_CALL);
        // Calls to send as they are (never merged back into a queue), before anything else:
        // the parts of a call EC2 refused for one of its instance IDs, and throttled calls.
        let mut splits: VecDeque<Batch> = VecDeque::new();
        // While EC2 fails (down, erroring), the last failed batch is sent again every probe
        // interval when nothing else goes out, so the moment EC2 answers again is noticed (and
        // every waiting node re-checked) within that interval.
        let mut probe: Option<Batch> = None;
        let mut last_sent = Instant::now();
        let probe_interval = self.cfg.batch_max_wait.max(Duration::from_millis(500));

        loop {
            let now = Instant::now();
            if blocked_until.is_none_or(|b| now >= b) {
                blocked_until = None;
                while !splits.is_empty() {
                    if let Err(wait) = self.limiter.try_acquire() {
                        blocked_until = Some(now + wait);
                        break;
                    }
                    if let Some(batch) = splits.pop_front() {
                        last_sent = now;
                        in_flight.push(self.call(batch));
                    }
                }
                if probe.is_some()
                    && in_flight.is_empty()
                    && blocked_until.is_none()
                    && now >= last_sent + probe_interval
                    && self.health.any_failing()
                {
                    match self.limiter.try_acquire() {
                        Err(wait) => blocked_until = Some(now + wait),
                        Ok(()) => {
                            if let Some(batch) = probe.take() {
                                debug!(region = %batch.region, "EC2 has been failing; probing with the last failed call");
                                last_sent = now;
                                in_flight.push(self.call(batch));
                            }
                        }
                    }
                }
                while blocked_until.is_none() {
                    // Send the queue that is due with urgent IDs, else the longest-waiting one
                    // that is due (all are due once closing).
                    let next = queued
                        .iter()
                        .filter(|(_, w)| !w.is_empty())
                        .filter(|(_, w)| !open || w.due(&self.cfg, max_batch, now) <= now)
                        .min_by_key(|(_, w)| (w.urgent.is_empty(), w.first_at))
                        .map(|(region, _)| region.clone());
                    let Some(key) = next else { break };
                    if let Err(wait) = self.limiter.try_acquire() {
                        blocked_until = Some(now + wait);
                        break;
                    }
                    let Some(w) = queued.get_mut(&key) else {
                        break;
                    };
                    let batch = w.take(max_batch);
                    let take = batch.len();
                    // Urgent IDs may remain (a burst of joins): they wait at most as long again.
                    w.urgent_at = w.urgent_at.filter(|_| !w.urgent.is_empty()).map(|_| now);
                    // An emptied queue is kept (for its burst) only after a full call.
                    if w.is_empty() && take < max_batch {
                        queued.remove(&key);
                    }
                    last_sent = now;
                    in_flight.push(self.call(Batch {
                        region: key.0,
                        ids: batch,
                        throttled: 0,
                    }));
                }
            }
            if !open
                && queued.values().all(Waiting::is_empty)
                && in_flight.is_empty()
                && splits.is_empty()
            {
                return;
            }
            let wake = blocked_until.or_else(|| {
                if !splits.is_empty() {
                    return Some(now);
                }
                let probe_at = probe
                    .as_ref()
                    .filter(|_| open)
                    .map(|_| (last_sent + probe_interval).max(now));
                queued
                    .values()
                    .filter(|w| !w.is_empty())
                    .map(|w| {
                        if open {
                            w.due(&self.cfg, max_batch, now)
                        } else {
                            now
                        }
                    })
                    .chain(probe_at)
                    .min()
            });
            tokio::select! {
                req = rx.recv(), if open => {
                    let Some(req) = req else {
                        // Nobody can ask any more: send what is queued, then stop.
                        open = false;
                        continue;
                    };
                    self.enqueue(req, &mut waiting, &mut queued);
                    // Everything asked already joins its queue before any queue is judged due:
                    // a batcher that fell behind (a busy machine) must not send the first IDs
                    // of a burst alone because taking in the rest outlasted the batch window.
                    while let Ok(req) = rx.try_recv() {
                        self.enqueue(req, &mut waiting, &mut queued);
                    }
                }
                _ = tokio::time::sleep_until(wake.unwrap_or(now)), if wake.is_some() => {}
                Some((batch, result)) = in_flight.next(), if !in_flight.is_empty() => {
                    let Batch { region, ids, throttled } = batch;
                    match result {
                        // One ID EC2 refuses (terminated, another account or region) is EC2
                        // answering about that ID, not EC2 failing: its waiters get the refusal
                        // (and their backoff), nothing is probed, health is untouched.
                        Err(e) if e.is_instance_id_error() && ids.len() == 1 => {
                            deliver(&mut waiting, &region, &ids, Err(e));
                        }
                        Err(e) if e.is_instance_id_error() => {
                            let (refused, rest) = isolate(&e, ids);
                            warn!(%region, error = %e, refused = refused.len(), resent = rest.iter().map(Vec::len).sum::<usize>(),
                                "EC2 refused a call for one of its instance IDs; sending the others again without it");
                            deliver(&mut waiting, &region, &refused, Err(e));
                            splits.extend(rest.into_iter().map(|ids| Batch {
                                region: region.clone(),
                                ids,
                                throttled: 0,
                            }));
                        }
                        Err(e) if e.is_throttle() && throttled < THROTTLED_RESENDS && open => {
                            // Sent again once the limiter's pause is over, ahead of new calls.
                            splits.push_back(Batch { region, ids, throttled: throttled + 1 });
                        }
                        Err(e) => {
                            if !e.is_throttle() {
                                probe = Some(Batch {
                                    region: region.clone(),
                                    ids: ids.clone(),
                                    throttled: 0,
                                });
                            }
                            self.health.failed(&region);
                            deliver(&mut waiting, &region, &ids, Err(e));
                        }
                        Ok(found) => {
                            // EC2 answers: no probe (a region that never answers, named by
                            // a hostile providerID, is not probed for ever; its own nodes ask
                            // again on their backoff).
                            probe = None;
                            deliver(&mut waiting, &region, &ids, Ok(found));
                        }
                    }
                }
            }
        }
    }

    /// Take one ask into its queue (or join the ask already on its way for that instance).
    fn enqueue(
        &self,
        req: Request,
        waiting: &mut HashMap<(String, String), Vec<oneshot::Sender<Answer>>>,
        queued: &mut BTreeMap<(String, bool), Waiting>,
    ) {
        match waiting.entry((req.region.clone(), req.instance_id.clone())) {
            Entry::Occupied(mut e) => {
                e.get_mut().push(req.reply);
                if req.urgent {
                    // Queued by a walk or a resync before its node's own reconcile
                    // asked: it goes ahead now (unless its call is on its way).
                    if let Some(w) = queued.get_mut(&(req.region, req.alone)) {
                        w.promote(&req.instance_id, Instant::now());
                    }
                }
            }
            Entry::Vacant(e) => {
                e.insert(vec![req.reply]);
                let now = Instant::now();
                let w = queued
                    .entry((req.region, req.alone))
                    .or_insert_with(|| Waiting {
                        urgent: Vec::new(),
                        ids: Vec::new(),
                        first_at: now,
                        last_at: now,
                        burst_at: now,
                        burst_len: 0,
                        urgent_at: None,
                    });
                if w.is_empty() {
                    w.first_at = now;
                    if now > w.last_at + self.cfg.batch_window {
                        // Quiet since the last full call: a new burst.
                        w.burst_at = now;
                        w.burst_len = 0;
                    }
                }
                if req.urgent {
                    w.urgent.push(req.instance_id);
                    w.urgent_at.get_or_insert(now);
                } else {
                    w.ids.push(req.instance_id);
                }
                w.last_at = now;
                w.burst_len += 1;
            }
        }
    }

    fn call(
        &self,
        batch: Batch,
    ) -> impl std::future::Future<Output = BatchResult> + Send + 'static {
        let source = self.source.clone();
        let limiter = self.limiter.clone();
        let observer = self.observer.clone();
        let health = self.health.clone();
        async move {
            let (region, ids) = (&batch.region, &batch.ids);
            let started = std::time::Instant::now();
            let result = source.describe(region, ids).await;
            observer.ec2_call(region, ids.len(), started.elapsed(), result.as_ref().err());
            // A refused instance ID is EC2 answering too (about that ID): it ends an outage.
            if result
                .as_ref()
                .map_or_else(Ec2Error::is_instance_id_error, |_| true)
            {
                health.answered(region);
            }
            match &result {
                Ok(found) => {
                    limiter.on_success();
                    debug!(%region, asked = ids.len(), described = found.len(), "DescribeInstanceTopology");
                }
                Err(e) if e.is_throttle() => {
                    let pause = limiter.on_throttle();
                    warn!(%region, asked = ids.len(), pause_ms = pause.as_millis() as u64, "EC2 throttled DescribeInstanceTopology; every caller pauses");
                }
                Err(e) => {
                    warn!(%region, asked = ids.len(), error = %e, "DescribeInstanceTopology failed")
                }
            }
            (batch, result)
        }
    }
}

/// A call of several IDs failed for one (or some) of them: the IDs the error names are refused;
/// the rest go out again, whole when the culprits are named, else in two halves (bisection,
/// about 2·log2(n) more calls for one bad ID in n).
fn isolate(e: &Ec2Error, ids: Vec<String>) -> (Vec<String>, Vec<Vec<String>>) {
    let (named, rest): (Vec<String>, Vec<String>) =
        ids.into_iter().partition(|id| e.names_instance(id));
    if !named.is_empty() {
        let rest = if rest.is_empty() { vec![] } else { vec![rest] };
        return (named, rest);
    }
    let mut first = rest;
    let second = first.split_off(first.len() / 2);
    (vec![], vec![first, second])
}

fn deliver(
    waiting: &mut HashMap<(String, String), Vec<oneshot::Sender<Answer>>>,
    region: &str,
    ids: &[String],
    result: Result<Vec<InstanceTopology>, Ec2Error>,
) {
    match result {
        Ok(found) => {
            let mut by_id: HashMap<String, InstanceTopology> = HashMap::with_capacity(found.len());
            for t in found {
                match by_id.entry(t.instance_id.clone()) {
                    Entry::Vacant(e) => {
                        e.insert(t);
                    }
                    Entry::Occupied(e) if *e.get() != t => {
                        warn!(instance = %t.instance_id, "EC2 described an instance twice, differently; keeping the first answer");
                    }
                    Entry::Occupied(_) => {}
                }
            }
            for id in ids {
                let answer = by_id.get(id).cloned();
                for reply in waiting
                    .remove(&(region.to_string(), id.clone()))
                    .unwrap_or_default()
                {
                    // A reconcile that gave up (node deleted, shutdown) no longer listens.
                    let _ = reply.send(Ok(answer.clone()));
                }
            }
        }
        Err(e) => {
            for id in ids {
                for reply in waiting
                    .remove(&(region.to_string(), id.clone()))
                    .unwrap_or_default()
                {
                    let _ = reply.send(Err(e.clone()));
                }
            }
        }
    }
}
