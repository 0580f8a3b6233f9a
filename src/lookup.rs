//! Topology lookups: a cache in front of a batcher in front of EC2.
//!
//! Every reconcile asks [`Lookup::resolve`] for its instance. Cached answers are returned at once
//! (keyed by instance ID and the node's boot ID: a new boot means the instance may have moved).
//! Misses from all reconciles are coalesced by one batcher task into `DescribeInstanceTopology`
//! calls of at most 100 IDs, sent when 100 are waiting or the batch window has passed, through the
//! shared [`Limiter`]. Instances EC2 does not describe are retried with capped exponential backoff
//! and otherwise remembered, so they never cost a call per reconcile.

use std::{
    collections::{BTreeMap, HashMap, VecDeque, hash_map::Entry},
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::{StreamExt, stream::FuturesUnordered};
use tokio::{
    sync::{mpsc, oneshot},
    time::Instant,
};
use tracing::{debug, warn};

use crate::{
    limiter::Limiter,
    metrics::Metrics,
    topology::{Ec2Error, InstanceTopology, MAX_IDS_PER_CALL, TopologySource},
};

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LookupConfig {
    /// A call goes out once no new ID has joined the waiting ones for this long (a burst keeps
    /// filling one call), or as soon as `max_batch` are waiting.
    pub batch_window: Duration,
    /// Longest any ID waits for its call to fill, however steadily others keep arriving.
    pub batch_max_wait: Duration,
    /// IDs per call (EC2 allows at most 100).
    pub max_batch: usize,
    /// Answers older than this are refreshed on the next reconcile (normally the periodic resync).
    pub cache_ttl: Duration,
    /// First retry after EC2 did not describe an instance; doubles per attempt.
    pub not_described_retry: Duration,
    /// Longest wait between asks about an instance EC2 does not describe (unsupported type).
    pub not_described_ttl: Duration,
}

impl Default for LookupConfig {
    fn default() -> Self {
        Self {
            batch_window: Duration::from_millis(200),
            batch_max_wait: Duration::from_secs(2),
            max_batch: MAX_IDS_PER_CALL,
            cache_ttl: Duration::from_secs(6 * 3600),
            not_described_retry: Duration::from_secs(15),
            not_described_ttl: Duration::from_secs(3600),
        }
    }
}

/// What we know about an instance, as far as the reconciler is concerned.
#[derive(Debug, Clone, PartialEq)]
pub enum Resolved {
    /// EC2 described the instance with its network nodes.
    Topology {
        topology: Arc<InstanceTopology>,
        /// A refresh of an older answer failed; this is the older answer.
        refresh_error: Option<Ec2Error>,
        /// The answer lacks a field EC2 fills in late (see [`InstanceTopology::settling`]): it
        /// is asked for again this soon, and the node should be re-checked then.
        recheck_in: Option<Duration>,
    },
    /// EC2 left the instance out or gave it no network nodes (unsupported type, not running
    /// yet, eventual consistency). Ask again no sooner than `retry_in`.
    NotDescribed { retry_in: Duration, attempts: u32 },
    /// EC2 refused this instance ID (`InvalidInstanceID.*`: malformed, or unknown to this
    /// account, which can also be a moment after launch). It is kept out of other calls, so it
    /// cannot fail them, and asked about alone again no sooner than `retry_in`.
    Rejected {
        error: Ec2Error,
        retry_in: Duration,
        attempts: u32,
    },
}

#[derive(Debug, Clone)]
enum State {
    Known {
        topology: Arc<InstanceTopology>,
        /// Asked again from here: after the cache TTL, or soon while `settling`.
        refresh_at: Instant,
        /// Answers in a row that lacked a late field (0: complete).
        settling: u32,
    },
    /// Not described, or refused (`refused`): asked again at `retry_at`.
    NotDescribed {
        retry_at: Instant,
        attempts: u32,
        refused: Option<Ec2Error>,
    },
}

#[derive(Debug, Clone)]
struct CacheEntry {
    boot_id: Option<String>,
    state: State,
    /// Answers for this boot that could not be turned into labels (see [`Lookup::reject`]).
    rejected: u32,
}

type Answer = Result<Option<InstanceTopology>, Ec2Error>;

struct Request {
    region: String,
    instance_id: String,
    reply: oneshot::Sender<Answer>,
}

/// Handle to the cache and the batcher. Cheap to clone.
#[derive(Clone)]
pub struct Lookup {
    cfg: LookupConfig,
    cache: Arc<Mutex<HashMap<String, CacheEntry>>>,
    requests: mpsc::UnboundedSender<Request>,
    metrics: Arc<Metrics>,
    recoveries: tokio::sync::watch::Receiver<u64>,
    /// Retries are due on a grid of `not_described_retry` steps from here (see [`Self::next_ask`]).
    epoch: Instant,
    /// False once the batcher task has ended (it never should): `/livez` reports it.
    batcher_alive: Arc<std::sync::atomic::AtomicBool>,
}

/// Sets its flag false when dropped: held by a task for its whole life, panics included.
struct AliveGuard(Arc<std::sync::atomic::AtomicBool>);

impl Drop for AliveGuard {
    fn drop(&mut self) {
        self.0.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Lookup {
    /// Start the batcher task for `source` and return the handle.
    pub fn spawn<S: TopologySource>(
        source: S,
        limiter: Arc<Limiter>,
        cfg: LookupConfig,
        metrics: Arc<Metrics>,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let (recovered, recoveries) = tokio::sync::watch::channel(0);
        let batcher = Batcher {
            source: Arc::new(source),
            limiter,
            cfg,
            metrics: metrics.clone(),
            health: Arc::new(Health {
                failing: std::sync::atomic::AtomicBool::new(false),
                recovered,
            }),
        };
        let batcher_alive = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let guard = AliveGuard(batcher_alive.clone());
        tokio::spawn(async move {
            let _alive = guard;
            batcher.run(rx).await;
        });
        Self {
            cfg,
            cache: Arc::default(),
            requests: tx,
            metrics,
            recoveries,
            epoch: Instant::now(),
            batcher_alive,
        }
    }

    /// Whether the batcher task still runs: without it every lookup fails.
    pub fn batcher_running(&self) -> bool {
        self.batcher_alive.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// When to ask again about an instance EC2 did not describe (or refused) `attempts` times:
    /// after the capped exponential backoff, rounded up to a multiple of that same backoff on a
    /// clock shared by every instance. Instances that joined at different moments are then
    /// asked about together, one call per round rather than one each: at one backoff level they
    /// share the same ticks, and the ticks of each level (15, 30, 60 s… apart) fall on ticks of
    /// the levels below; at the cap (the not-described TTL) every instance shares one tick.
    fn next_ask(&self, now: Instant, attempts: u32) -> (Instant, Duration) {
        let backoff = self.not_described_backoff(attempts);
        let earliest = now + backoff;
        let step = backoff.max(Duration::from_millis(100)).as_nanos();
        let since = earliest.saturating_duration_since(self.epoch).as_nanos();
        let steps = since.div_ceil(step);
        let at = self.epoch
            + Duration::from_nanos(u64::try_from(steps.saturating_mul(step)).unwrap_or(u64::MAX));
        (at, at.saturating_duration_since(now))
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, HashMap<String, CacheEntry>> {
        // Entries are replaced whole; a panic elsewhere cannot leave one half-written.
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The topology of `instance_id` (in `region`) during the boot `boot_id`.
    pub async fn resolve(
        &self,
        region: &str,
        instance_id: &str,
        boot_id: Option<&str>,
    ) -> Result<Resolved, Ec2Error> {
        self.resolve_expecting(region, instance_id, boot_id, false)
            .await
    }

    /// As [`Self::resolve`]; `capacity_block_expected` when the node carries a capacity-block
    /// label already, so an answer without one is asked for again soon.
    pub async fn resolve_expecting(
        &self,
        region: &str,
        instance_id: &str,
        boot_id: Option<&str>,
        capacity_block_expected: bool,
    ) -> Result<Resolved, Ec2Error> {
        let now = Instant::now();
        let stale = {
            let mut cache = self.cache();
            match cache.get_mut(instance_id) {
                Some(e) if !rebooted(e.boot_id.as_deref(), boot_id) => {
                    if e.boot_id.is_none() {
                        e.boot_id = boot_id.map(str::to_owned);
                    }
                    match &e.state {
                        State::Known {
                            topology,
                            refresh_at,
                            settling,
                        } if now < *refresh_at
                            // A complete answer without a capacity block, for a node that has
                            // one: ask again now, then on the settling schedule.
                            && !(*settling == 0 && topology.settling(capacity_block_expected)) =>
                        {
                            self.metrics.cache_hit();
                            return Ok(Resolved::Topology {
                                topology: topology.clone(),
                                refresh_error: None,
                                recheck_in: (*settling > 0).then(|| *refresh_at - now),
                            });
                        }
                        State::NotDescribed {
                            retry_at,
                            attempts,
                            refused,
                        } if now < *retry_at => {
                            self.metrics.cache_hit();
                            let (retry_in, attempts) = (*retry_at - now, *attempts);
                            return Ok(match refused {
                                Some(error) => Resolved::Rejected {
                                    error: error.clone(),
                                    retry_in,
                                    attempts,
                                },
                                None => Resolved::NotDescribed { retry_in, attempts },
                            });
                        }
                        _ => Some(e.clone()),
                    }
                }
                _ => None,
            }
        };
        self.metrics.cache_miss();

        let (reply, answer) = oneshot::channel();
        self.requests
            .send(Request {
                region: region.to_string(),
                instance_id: instance_id.to_string(),
                reply,
            })
            .map_err(|_| Ec2Error::Transport("topology batcher has stopped".into()))?;
        let answer = answer
            .await
            .map_err(|_| Ec2Error::Transport("topology batcher dropped the request".into()))?;

        let now = Instant::now();
        let previous_topology = match &stale {
            Some(CacheEntry {
                state: State::Known { topology, .. },
                ..
            }) => Some(topology.clone()),
            _ => None,
        };
        let previous_settling = match &stale {
            Some(CacheEntry {
                state: State::Known { settling, .. },
                ..
            }) => *settling,
            _ => 0,
        };
        let previous_attempts = match &stale {
            Some(CacheEntry {
                state: State::NotDescribed { attempts, .. },
                ..
            }) => *attempts,
            _ => 0,
        };
        // EC2 refused this very ID (the batcher isolates refused IDs, so the error is this
        // instance's alone): remember it, with the not-described backoff, unless EC2 described
        // it before in this boot (then the earlier answer stands, as for any failed refresh).
        let answer = match answer {
            Err(e) if e.is_instance_id_error() && previous_topology.is_none() => {
                let attempts = previous_attempts.saturating_add(1);
                let (retry_at, retry_in) = self.next_ask(now, attempts);
                self.cache().insert(
                    instance_id.to_string(),
                    CacheEntry {
                        boot_id: boot_id.map(str::to_owned),
                        state: State::NotDescribed {
                            retry_at,
                            attempts,
                            refused: Some(e.clone()),
                        },
                        rejected: stale.as_ref().map_or(0, |e| e.rejected),
                    },
                );
                return Ok(Resolved::Rejected {
                    error: e,
                    retry_in,
                    attempts,
                });
            }
            other => other,
        };
        let (state, resolved) = match answer {
            Ok(Some(t)) if !t.network_nodes.is_empty() => {
                // Within one boot, fields EC2 left out of this answer keep their earlier values.
                let t = match &previous_topology {
                    Some(earlier) => t.filled_from(earlier),
                    None => t,
                };
                let (refresh_at, settling, recheck_in) = if t.settling(capacity_block_expected) {
                    let settling = previous_settling.saturating_add(1);
                    let (at, recheck_in) = self.next_ask(now, settling);
                    (at, settling, Some(recheck_in))
                } else {
                    (now + self.cfg.cache_ttl, 0, None)
                };
                let topology = Arc::new(t);
                (
                    State::Known {
                        topology: topology.clone(),
                        refresh_at,
                        settling,
                    },
                    Resolved::Topology {
                        topology,
                        refresh_error: None,
                        recheck_in,
                    },
                )
            }
            Ok(_) => match previous_topology {
                // Described before in this boot, not now: EC2 is lagging or wrong. Keep what we
                // knew (labels are never stripped on EC2's word alone) and ask again after a TTL.
                Some(topology) => (
                    State::Known {
                        topology: topology.clone(),
                        refresh_at: now + self.cfg.cache_ttl,
                        settling: 0,
                    },
                    Resolved::Topology {
                        topology,
                        refresh_error: None,
                        recheck_in: None,
                    },
                ),
                None => {
                    let attempts = previous_attempts.saturating_add(1);
                    let (retry_at, retry_in) = self.next_ask(now, attempts);
                    (
                        State::NotDescribed {
                            retry_at,
                            attempts,
                            refused: None,
                        },
                        Resolved::NotDescribed { retry_in, attempts },
                    )
                }
            },
            Err(e) => {
                return match previous_topology {
                    Some(topology) => Ok(Resolved::Topology {
                        topology,
                        refresh_error: Some(e),
                        recheck_in: None,
                    }),
                    None => Err(e),
                };
            }
        };
        let rejected = stale.as_ref().map_or(0, |e| e.rejected);
        self.cache().insert(
            instance_id.to_string(),
            CacheEntry {
                boot_id: boot_id.map(str::to_owned),
                state,
                rejected,
            },
        );
        Ok(resolved)
    }

    fn not_described_backoff(&self, attempts: u32) -> Duration {
        let exp = attempts.saturating_sub(1).min(20);
        self.cfg
            .not_described_retry
            .saturating_mul(1u32 << exp)
            .min(self.cfg.not_described_ttl)
    }

    /// The cached answer for `instance_id` cannot be used (labels cannot be derived from it):
    /// forget it, and ask again after the not-described backoff. Returns that wait.
    pub fn reject(&self, instance_id: &str) -> Duration {
        let now = Instant::now();
        let mut cache = self.cache();
        let Some(e) = cache.get_mut(instance_id) else {
            return self.cfg.not_described_retry;
        };
        e.rejected = e.rejected.saturating_add(1);
        let (retry_at, retry_in) = self.next_ask(now, e.rejected);
        e.state = State::NotDescribed {
            retry_at,
            attempts: e.rejected,
            refused: None,
        };
        retry_in
    }

    /// Keep only the entries of instances some node still runs on; returns how many went.
    /// Age plays no part: an instance retried with a long backoff keeps its backoff.
    pub fn retain_instances(&self, live: &std::collections::HashSet<String>) -> usize {
        let mut cache = self.cache();
        let before = cache.len();
        cache.retain(|id, _| live.contains(id));
        before - cache.len()
    }

    /// Changes each time EC2 answers again after calls failed: nodes waiting out a per-node
    /// backoff can be re-checked at once instead of one by one.
    pub fn recoveries(&self) -> tokio::sync::watch::Receiver<u64> {
        self.recoveries.clone()
    }

    /// Number of cached instances.
    pub fn cached(&self) -> usize {
        self.cache().len()
    }
}

/// Only a change from one known boot to another counts: a boot ID that appears for the first
/// time (kubelet reports it shortly after registration) is the same boot we looked up.
fn rebooted(cached: Option<&str>, now: Option<&str>) -> bool {
    matches!((cached, now), (Some(a), Some(b)) if a != b)
}

struct Batcher<S> {
    source: Arc<S>,
    limiter: Arc<Limiter>,
    cfg: LookupConfig,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
}

/// Whether EC2 calls are failing (errors, or throttling that outlasted its re-sends), to notice
/// the moment they stop.
struct Health {
    failing: std::sync::atomic::AtomicBool,
    recovered: tokio::sync::watch::Sender<u64>,
}

impl Health {
    fn failed(&self) {
        self.failing
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// A call succeeded: if calls were failing, every node waiting out a per-node backoff can
    /// be re-checked now.
    fn answered(&self) {
        if self
            .failing
            .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
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
const THROTTLED_RESENDS: u32 = 5;

/// IDs of one region waiting for a call.
struct Waiting {
    ids: Vec<String>,
    /// When the oldest of `ids` arrived.
    first_at: Instant,
    last_at: Instant,
    /// The burst these IDs belong to: when it began and how many IDs have arrived since,
    /// counting those already sent in full calls. A full call that empties the queue keeps
    /// this, so the rest of a burst that arrives in clumps is judged by the burst's rate.
    burst_at: Instant,
    burst_len: usize,
}

impl Waiting {
    /// When this queue should be sent, seen at `now`: at once when full; otherwise after a
    /// quiet `window` since the last arrival — unless the queue has been filling so fast that,
    /// at that rate, it would be full within a few windows (a burst that stalled for a moment:
    /// a busy machine delays watch events in clumps; the rate is the burst's, counting IDs
    /// already sent) — then until three windows after the last arrival at most; never later
    /// than `max_wait` after the oldest waiting ID arrived.
    fn due(&self, cfg: &LookupConfig, max_batch: usize, now: Instant) -> Instant {
        let len = self.ids.len();
        if len >= max_batch {
            return self.first_at;
        }
        let cap = self.first_at + cfg.batch_max_wait;
        let quiet = self.last_at + cfg.batch_window;
        if now < quiet || self.burst_len < 2 {
            return quiet.min(cap);
        }
        let elapsed = now.saturating_duration_since(self.burst_at).as_secs_f64();
        if elapsed <= 0.0 {
            return quiet.min(cap);
        }
        let rate = (self.burst_len - 1) as f64 / elapsed;
        let to_fill = Duration::from_secs_f64((max_batch - len) as f64 / rate);
        if to_fill <= cfg.batch_window.saturating_mul(3) {
            // Held for a stall, not for a burst that has ended: three windows after the last
            // arrival at most.
            let stall = self.last_at + cfg.batch_window.saturating_mul(3);
            (now + to_fill).min(cap).min(stall)
        } else {
            quiet.min(cap)
        }
    }
}

impl<S: TopologySource> Batcher<S> {
    async fn run(self, mut rx: mpsc::UnboundedReceiver<Request>) {
        // Waiters per (region, instance): queued or in flight. A second ask for an instance that
        // is already on its way joins the first.
        let mut waiting: HashMap<(String, String), Vec<oneshot::Sender<Answer>>> = HashMap::new();
        let mut queued: BTreeMap<String, Waiting> = BTreeMap::new();
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
                    && self
                        .health
                        .failing
                        .load(std::sync::atomic::Ordering::SeqCst)
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
                    // Send the longest-waiting queue that is due (all are due once closing).
                    let next = queued
                        .iter()
                        .filter(|(_, w)| !w.ids.is_empty())
                        .filter(|(_, w)| !open || w.due(&self.cfg, max_batch, now) <= now)
                        .min_by_key(|(_, w)| w.first_at)
                        .map(|(region, _)| region.clone());
                    let Some(region) = next else { break };
                    if let Err(wait) = self.limiter.try_acquire() {
                        blocked_until = Some(now + wait);
                        break;
                    }
                    let Some(w) = queued.get_mut(&region) else {
                        break;
                    };
                    let take = w.ids.len().min(max_batch);
                    let batch: Vec<String> = w.ids.drain(..take).collect();
                    // An emptied queue is kept (for its burst) only after a full call.
                    if w.ids.is_empty() && take < max_batch {
                        queued.remove(&region);
                    }
                    last_sent = now;
                    in_flight.push(self.call(Batch {
                        region,
                        ids: batch,
                        throttled: 0,
                    }));
                }
            }
            if !open
                && queued.values().all(|w| w.ids.is_empty())
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
                    .filter(|w| !w.ids.is_empty())
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
                    match waiting.entry((req.region.clone(), req.instance_id.clone())) {
                        Entry::Occupied(mut e) => e.get_mut().push(req.reply),
                        Entry::Vacant(e) => {
                            e.insert(vec![req.reply]);
                            let now = Instant::now();
                            let w = queued.entry(req.region).or_insert_with(|| Waiting {
                                ids: Vec::new(),
                                first_at: now,
                                last_at: now,
                                burst_at: now,
                                burst_len: 0,
                            });
                            if w.ids.is_empty() {
                                w.first_at = now;
                                if now > w.last_at + self.cfg.batch_window {
                                    // Quiet since the last full call: a new burst.
                                    w.burst_at = now;
                                    w.burst_len = 0;
                                }
                            }
                            w.ids.push(req.instance_id);
                            w.last_at = now;
                            w.burst_len += 1;
                        }
                    }
                }
                _ = tokio::time::sleep_until(wake.unwrap_or(now)), if wake.is_some() => {}
                Some((batch, result)) = in_flight.next(), if !in_flight.is_empty() => {
                    let Batch { region, ids, throttled } = batch;
                    match result {
                        Err(e) if e.is_instance_id_error() && ids.len() > 1 => {
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
                            self.health.failed();
                            deliver(&mut waiting, &region, &ids, Err(e));
                        }
                        Ok(found) => {
                            probe = None;
                            deliver(&mut waiting, &region, &ids, Ok(found));
                        }
                    }
                }
            }
        }
    }

    fn call(
        &self,
        batch: Batch,
    ) -> impl std::future::Future<Output = BatchResult> + Send + 'static {
        let source = self.source.clone();
        let limiter = self.limiter.clone();
        let metrics = self.metrics.clone();
        let health = self.health.clone();
        async move {
            let (region, ids) = (&batch.region, &batch.ids);
            let started = std::time::Instant::now();
            let result = source.describe(region, ids).await;
            metrics.ec2_call(region, ids.len(), started.elapsed(), result.as_ref().err());
            if result.is_ok() {
                health.answered();
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::LimiterConfig;
    use std::sync::atomic::{AtomicUsize, Ordering};

    type CallLog = Arc<Mutex<Vec<(String, Vec<String>)>>>;

    /// A fake EC2: describes instances with an even number, records each call. A call that
    /// holds a poisoned ID fails whole with `InvalidInstanceID.NotFound`, naming the ID only when
    /// `name_poison` is set (EC2 names it; a client must not rely on it).
    #[derive(Clone, Default)]
    struct Fake {
        calls: CallLog,
        fail_next: Arc<AtomicUsize>,
        layer: Arc<Mutex<String>>,
        poison: Arc<Mutex<Vec<String>>>,
        name_poison: Arc<std::sync::atomic::AtomicBool>,
        /// What the next `fail_next` calls fail with (throttling when unset).
        fail_with: Arc<Mutex<Option<Ec2Error>>>,
        /// Every answer's instance type (p5 when unset) and capacity block.
        instance_type: Arc<Mutex<String>>,
        capacity_block: Arc<Mutex<Option<String>>>,
    }

    impl Fake {
        fn calls(&self) -> Vec<(String, Vec<String>)> {
            self.calls.lock().unwrap().clone()
        }
    }

    impl TopologySource for Fake {
        async fn describe(
            &self,
            region: &str,
            ids: &[String],
        ) -> Result<Vec<InstanceTopology>, Ec2Error> {
            self.calls
                .lock()
                .unwrap()
                .push((region.to_string(), ids.to_vec()));
            tokio::time::sleep(Duration::from_millis(50)).await;
            if self.fail_next.load(Ordering::SeqCst) > 0 {
                self.fail_next.fetch_sub(1, Ordering::SeqCst);
                return Err(self
                    .fail_with
                    .lock()
                    .unwrap()
                    .clone()
                    .unwrap_or_else(|| Ec2Error::from_code("RequestLimitExceeded", "slow down")));
            }
            let poisoned: Vec<String> = {
                let poison = self.poison.lock().unwrap();
                ids.iter()
                    .filter(|id| poison.contains(id))
                    .cloned()
                    .collect()
            };
            if !poisoned.is_empty() {
                let message = if self.name_poison.load(Ordering::SeqCst) {
                    format!("The instance IDs '{}' do not exist", poisoned.join(", "))
                } else {
                    "The request refers to an instance that does not exist".to_string()
                };
                return Err(Ec2Error::from_code("InvalidInstanceID.NotFound", &message));
            }
            let layer = self.layer.lock().unwrap().clone();
            Ok(ids
                .iter()
                .filter(|id| u64::from_str_radix(&id[2..], 16).is_ok_and(|n| n % 2 == 0))
                .map(|id| InstanceTopology {
                    instance_id: id.clone(),
                    instance_type: Some(self.instance_type.lock().unwrap().clone()),
                    zone_id: Some("usw2-az1".into()),
                    capacity_block_id: self.capacity_block.lock().unwrap().clone(),
                    network_nodes: vec!["nn-top".into(), "nn-mid".into(), layer.clone()],
                    ..InstanceTopology::default()
                })
                .collect())
        }
    }

    fn id(n: usize) -> String {
        format!("i-{n:017x}")
    }

    fn internal_error() -> Ec2Error {
        Ec2Error::from_code("InternalError", "An internal error has occurred.")
    }

    fn lookup(fake: &Fake) -> Lookup {
        *fake.layer.lock().unwrap() = "nn-leaf-1".into();
        *fake.instance_type.lock().unwrap() = "p5.48xlarge".into();
        Lookup::spawn(
            fake.clone(),
            Arc::new(Limiter::new(LimiterConfig {
                rate: 1000.0,
                burst: 1000.0,
                ..LimiterConfig::default()
            })),
            LookupConfig::default(),
            Arc::new(Metrics::default()),
        )
    }

    /// Ask for instances `0..n`, the k-th `at(k)` ms after the start; every one must be
    /// answered. Returns the sizes of the calls EC2 saw.
    async fn arrivals(fake: &Fake, l: &Lookup, n: usize, at: impl Fn(usize) -> u64) -> Vec<usize> {
        let asks = (0..n).map(|k| {
            let l = l.clone();
            let delay = Duration::from_millis(at(k));
            async move {
                tokio::time::sleep(delay).await;
                l.resolve("r", &id(k * 2), None).await
            }
        });
        let answers = futures::future::join_all(asks).await;
        assert!(answers.iter().all(Result::is_ok), "every lookup answered");
        fake.calls().iter().map(|(_, ids)| ids.len()).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_lookups_are_coalesced_into_calls_of_at_most_100() {
        let fake = Fake::default();
        let l = lookup(&fake);
        let asks = (0..250).map(|n| {
            let l = l.clone();
            async move { l.resolve("us-west-2", &id(n * 2), Some("boot")).await }
        });
        let answers = futures::future::join_all(asks).await;
        assert!(
            answers
                .iter()
                .all(|a| matches!(a, Ok(Resolved::Topology { .. })))
        );
        let calls = fake.calls();
        assert_eq!(calls.len(), 3, "250 lookups cost 3 calls");
        assert!(calls.iter().all(|(_, ids)| ids.len() <= 100));
        assert_eq!(calls.iter().map(|(_, ids)| ids.len()).sum::<usize>(), 250);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_lookup_waits_only_the_batch_window() {
        let fake = Fake::default();
        let l = lookup(&fake);
        let start = Instant::now();
        l.resolve("us-west-2", &id(2), None).await.unwrap();
        let took = start.elapsed();
        assert!(
            took >= Duration::from_millis(250) && took < Duration::from_millis(300),
            "{took:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_of_arrivals_fills_calls_instead_of_sending_many_small_ones() {
        let fake = Fake::default();
        let l = lookup(&fake);
        // 150 nodes arriving 10 ms apart (1.5 s): each arrival restarts the quiet window.
        let sizes = arrivals(&fake, &l, 150, |k| 10 * k as u64).await;
        assert_eq!(sizes, vec![100, 50]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_arriving_in_clumps_is_sent_in_full_calls() {
        let fake = Fake::default();
        let l = lookup(&fake);
        // A busy API server delivers watch events in clumps: 116 at once every 400 ms. Each
        // clump fills a call and leaves 16; those wait for the next clump rather than going
        // out alone after the quiet window.
        let start = Instant::now();
        let sizes = arrivals(&fake, &l, 580, |k| 400 * (k / 116) as u64).await;
        assert_eq!(
            sizes,
            vec![100, 100, 100, 100, 100, 80],
            "ceil(580/100) calls"
        );
        let last_clump = Duration::from_millis(1600);
        assert!(
            start.elapsed() < last_clump + Duration::from_secs(1),
            "the last 80 are not held long: {:?}",
            start.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_stall_inside_a_burst_does_not_split_its_call() {
        let fake = Fake::default();
        let l = lookup(&fake);
        // 60 arrivals 5 ms apart, a 300 ms stall (longer than the 200 ms window), 40 more.
        let sizes = arrivals(&fake, &l, 100, |k| {
            5 * k as u64 + if k >= 60 { 300 } else { 0 }
        })
        .await;
        assert_eq!(sizes, vec![100], "one full call despite the stall");
    }

    #[tokio::test(start_paused = true)]
    async fn a_small_burst_is_not_held_for_a_fill_that_will_not_come() {
        let fake = Fake::default();
        let l = lookup(&fake);
        // Three nodes 10 ms apart: at that rate 97 more would take ~1 s, so the quiet window
        // applies and they go out ~200 ms after the last one.
        let start = Instant::now();
        let sizes = arrivals(&fake, &l, 3, |k| 10 * k as u64).await;
        assert_eq!(sizes, vec![3]);
        assert!(
            start.elapsed() < Duration::from_millis(300),
            "{:?}",
            start.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_steady_trickle_waits_at_most_the_max_wait() {
        let fake = Fake::default();
        let l = lookup(&fake);
        // One arrival every 150 ms for 3 s never leaves a 200 ms quiet gap.
        let asks = (0..20).map(|n| {
            let l = l.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(150 * n as u64)).await;
                let asked = Instant::now();
                l.resolve("r", &id(n * 2), None)
                    .await
                    .map(|_| asked.elapsed())
            }
        });
        let waits: Vec<Duration> = futures::future::join_all(asks)
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
        assert!(
            waits.iter().all(|w| *w <= Duration::from_millis(2050 + 10)),
            "{waits:?}"
        );
        assert_eq!(fake.calls().len(), 2, "two calls for 20 instances over 3 s");
    }

    #[tokio::test(start_paused = true)]
    async fn while_the_limiter_has_no_token_calls_keep_filling() {
        let fake = Fake::default();
        let l = Lookup::spawn(
            fake.clone(),
            Arc::new(Limiter::new(LimiterConfig {
                rate: 1.0,
                burst: 1.0,
                ..LimiterConfig::default()
            })),
            LookupConfig::default(),
            Arc::new(Metrics::default()),
        );
        // Ten arrivals 300 ms apart: the first call takes the only token; the other nine wait
        // for the next token (1/s) and share calls.
        let asks = (0..10).map(|n| {
            let l = l.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(300 * n as u64)).await;
                l.resolve("r", &id(n * 2), None).await
            }
        });
        assert!(
            futures::future::join_all(asks)
                .await
                .iter()
                .all(Result::is_ok)
        );
        let calls = fake.calls();
        assert!(calls.len() <= 4, "{} calls: {calls:?}", calls.len());
        assert_eq!(calls.iter().map(|(_, ids)| ids.len()).sum::<usize>(), 10);
    }

    #[tokio::test(start_paused = true)]
    async fn regions_are_never_mixed_in_one_call() {
        let fake = Fake::default();
        let l = lookup(&fake);
        let (i2, i4) = (id(2), id(4));
        let (a, b) = tokio::join!(
            l.resolve("us-west-2", &i2, None),
            l.resolve("us-east-1", &i4, None)
        );
        assert!(a.is_ok() && b.is_ok());
        let mut regions: Vec<String> = fake.calls().into_iter().map(|(r, _)| r).collect();
        regions.sort();
        assert_eq!(regions, vec!["us-east-1", "us-west-2"]);
    }

    #[tokio::test(start_paused = true)]
    async fn cached_answers_cost_nothing_until_the_boot_id_changes() {
        let fake = Fake::default();
        let l = lookup(&fake);
        l.resolve("r", &id(2), Some("boot-1")).await.unwrap();
        for _ in 0..5 {
            l.resolve("r", &id(2), Some("boot-1")).await.unwrap();
        }
        assert_eq!(fake.calls().len(), 1);
        *fake.layer.lock().unwrap() = "nn-leaf-2".into();
        let moved = l.resolve("r", &id(2), Some("boot-2")).await.unwrap();
        assert_eq!(fake.calls().len(), 2, "a new boot ID forces a new lookup");
        match moved {
            Resolved::Topology { topology, .. } => {
                assert_eq!(topology.network_nodes[2], "nn-leaf-2")
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_boot_id_appearing_for_the_first_time_is_not_a_reboot() {
        let fake = Fake::default();
        let l = lookup(&fake);
        l.resolve("r", &id(2), None).await.unwrap();
        l.resolve("r", &id(2), Some("boot-1")).await.unwrap();
        assert_eq!(fake.calls().len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn instances_ec2_does_not_describe_are_not_asked_again_within_their_backoff() {
        let fake = Fake::default();
        let l = lookup(&fake);
        let first = l.resolve("r", &id(1), Some("b")).await.unwrap();
        let Resolved::NotDescribed { retry_in, attempts } = first else {
            panic!("{first:?}")
        };
        // The 15 s backoff, rounded up to the next multiple of 15 s on the shared clock.
        assert_eq!(attempts, 1);
        assert!(
            retry_in >= Duration::from_secs(15) && retry_in <= Duration::from_secs(30),
            "{retry_in:?}"
        );
        for _ in 0..10 {
            assert!(matches!(
                l.resolve("r", &id(1), Some("b")).await.unwrap(),
                Resolved::NotDescribed { .. }
            ));
        }
        assert_eq!(fake.calls().len(), 1, "no call per reconcile");
        tokio::time::advance(retry_in - Duration::from_millis(10)).await;
        l.resolve("r", &id(1), Some("b")).await.unwrap();
        assert_eq!(fake.calls().len(), 1, "not before its time");
        tokio::time::advance(Duration::from_millis(20)).await;
        let second = l.resolve("r", &id(1), Some("b")).await.unwrap();
        assert_eq!(fake.calls().len(), 2);
        assert!(
            matches!(second, Resolved::NotDescribed { attempts: 2, retry_in }
                if retry_in >= Duration::from_secs(30) && retry_in < Duration::from_secs(60)),
            "{second:?}"
        );
        // The backoff is capped at the not-described TTL (1h).
        for _ in 0..12 {
            tokio::time::advance(Duration::from_secs(3601)).await;
            l.resolve("r", &id(1), Some("b")).await.unwrap();
        }
        let last = l.resolve("r", &id(1), Some("b")).await.unwrap();
        assert!(
            matches!(last, Resolved::NotDescribed { retry_in, .. } if retry_in <= Duration::from_secs(3600))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn stale_answers_are_refreshed_and_kept_when_the_refresh_fails() {
        let fake = Fake::default();
        let l = lookup(&fake);
        l.resolve("r", &id(2), Some("b")).await.unwrap();
        tokio::time::advance(LookupConfig::default().cache_ttl + Duration::from_secs(1)).await;
        *fake.fail_with.lock().unwrap() = Some(internal_error());
        fake.fail_next.store(1, Ordering::SeqCst);
        let r = l.resolve("r", &id(2), Some("b")).await.unwrap();
        match r {
            Resolved::Topology {
                refresh_error: Some(e),
                topology,
                ..
            } => {
                assert_eq!(e.category(), "service");
                assert_eq!(topology.network_nodes.len(), 3, "the older answer is kept");
            }
            other => panic!("{other:?}"),
        }
        l.resolve("r", &id(2), Some("b")).await.unwrap();
        assert_eq!(fake.calls().len(), 3, "refreshed once the failure cleared");
    }

    #[tokio::test(start_paused = true)]
    async fn errors_reach_every_waiter_and_are_not_cached() {
        let fake = Fake::default();
        let l = lookup(&fake);
        *fake.fail_with.lock().unwrap() = Some(internal_error());
        fake.fail_next.store(1, Ordering::SeqCst);
        let (i2, i4) = (id(2), id(4));
        let (a, b) = tokio::join!(l.resolve("r", &i2, None), l.resolve("r", &i4, None));
        assert_eq!(
            (a.unwrap_err().category(), b.unwrap_err().category()),
            ("service", "service")
        );
        assert_eq!(l.cached(), 0);
        assert!(l.resolve("r", &id(2), None).await.is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn the_same_instance_asked_twice_at_once_is_sent_once() {
        let fake = Fake::default();
        let l = lookup(&fake);
        let i2 = id(2);
        let (a, b) = tokio::join!(l.resolve("r", &i2, None), l.resolve("r", &i2, None));
        assert!(a.is_ok() && b.is_ok());
        assert_eq!(fake.calls(), vec![("r".to_string(), vec![id(2)])]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_rejected_answer_is_asked_again_after_a_backoff() {
        let fake = Fake::default();
        let l = lookup(&fake);
        l.resolve("r", &id(2), Some("b")).await.unwrap();
        let wait = l.reject(&id(2));
        assert!(
            wait >= Duration::from_secs(15) && wait <= Duration::from_secs(30),
            "{wait:?}"
        );
        assert!(matches!(
            l.resolve("r", &id(2), Some("b")).await.unwrap(),
            Resolved::NotDescribed { .. }
        ));
        assert_eq!(fake.calls().len(), 1, "not asked again before the backoff");
        tokio::time::advance(wait + Duration::from_millis(10)).await;
        assert!(matches!(
            l.resolve("r", &id(2), Some("b")).await.unwrap(),
            Resolved::Topology { .. }
        ));
        assert_eq!(fake.calls().len(), 2);
        assert!(
            l.reject(&id(2)) >= Duration::from_secs(30),
            "a second rejection waits longer"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn recovery_after_failures_is_signalled_once() {
        let fake = Fake::default();
        let l = lookup(&fake);
        let mut rx = l.recoveries();
        l.resolve("r", &id(2), None).await.unwrap();
        assert!(!rx.has_changed().unwrap(), "no failure, no recovery");
        *fake.fail_with.lock().unwrap() = Some(internal_error());
        fake.fail_next.store(2, Ordering::SeqCst);
        assert!(l.resolve("r", &id(4), None).await.is_err());
        assert!(l.resolve("r", &id(4), None).await.is_err());
        assert!(!rx.has_changed().unwrap());
        l.resolve("r", &id(4), None).await.unwrap();
        assert!(rx.has_changed().unwrap(), "recovered");
        rx.mark_unchanged();
        l.resolve("r", &id(6), None).await.unwrap();
        assert!(!rx.has_changed().unwrap(), "once");
    }

    /// An UltraServer instance whose first answers lack its capacity block: asked for again on
    /// the short schedule (not after the 6 h cache TTL) until EC2 has it; once known in a boot,
    /// an answer without it does not lose it.
    #[tokio::test(start_paused = true)]
    async fn a_capacity_block_that_arrives_late_is_asked_for_until_it_comes() {
        let fake = Fake::default();
        let l = lookup(&fake);
        *fake.instance_type.lock().unwrap() = "p6e-gb200.36xlarge".into();
        let first = l.resolve("r", &id(2), Some("b")).await.unwrap();
        let Resolved::Topology {
            topology,
            recheck_in: Some(recheck_in),
            ..
        } = first
        else {
            panic!("a settling answer is to be re-checked soon: {first:?}")
        };
        assert_eq!(topology.capacity_block_id, None);
        assert!(recheck_in <= Duration::from_secs(30), "{recheck_in:?}");
        *fake.capacity_block.lock().unwrap() = Some("cr-0123456789abcdef0".into());
        tokio::time::advance(recheck_in + Duration::from_millis(10)).await;
        let second = l.resolve("r", &id(2), Some("b")).await.unwrap();
        assert_eq!(fake.calls().len(), 2);
        let Resolved::Topology {
            topology,
            recheck_in: None,
            ..
        } = second
        else {
            panic!("complete now: {second:?}")
        };
        assert_eq!(
            topology.capacity_block_id.as_deref(),
            Some("cr-0123456789abcdef0")
        );
        // Refreshed after the TTL, EC2 leaves it out again: the boot's known value stays.
        *fake.capacity_block.lock().unwrap() = None;
        tokio::time::advance(LookupConfig::default().cache_ttl + Duration::from_secs(1)).await;
        match l.resolve("r", &id(2), Some("b")).await.unwrap() {
            Resolved::Topology { topology, .. } => assert_eq!(
                topology.capacity_block_id.as_deref(),
                Some("cr-0123456789abcdef0")
            ),
            other => panic!("{other:?}"),
        }
    }

    /// A node that carries a capacity-block label while EC2's answer has none: asked again
    /// soon rather than trusting the answer for the cache TTL.
    #[tokio::test(start_paused = true)]
    async fn a_node_with_a_capacity_block_label_gets_its_answer_checked_again_soon() {
        let fake = Fake::default();
        let l = lookup(&fake);
        l.resolve("r", &id(2), Some("b")).await.unwrap();
        let again = l
            .resolve_expecting("r", &id(2), Some("b"), true)
            .await
            .unwrap();
        assert_eq!(fake.calls().len(), 2, "asked again at once");
        assert!(
            matches!(
                again,
                Resolved::Topology {
                    recheck_in: Some(_),
                    ..
                }
            ),
            "{again:?}"
        );
    }

    /// 20 unsupported instances whose nodes joined over 10 s (their first asks are separate
    /// calls), each re-asked exactly when told: every later round is one call for all of them.
    #[tokio::test(start_paused = true)]
    async fn retries_of_instances_ec2_does_not_describe_share_calls() {
        let fake = Fake::default();
        let l = lookup(&fake);
        let asks = (0..20).map(|k| {
            let l = l.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(500 * k)).await;
                let until = Instant::now() + Duration::from_secs(125);
                while Instant::now() < until {
                    match l.resolve("r", &id(2 * k as usize + 1), Some("b")).await {
                        Ok(Resolved::NotDescribed { retry_in, .. }) => {
                            tokio::time::sleep(retry_in).await
                        }
                        other => panic!("{other:?}"),
                    }
                }
            }
        });
        futures::future::join_all(asks).await;
        let calls = fake.calls();
        let first_round = calls.iter().take_while(|(_, ids)| ids.len() == 1).count();
        let later: Vec<usize> = calls[first_round..]
            .iter()
            .map(|(_, ids)| ids.len())
            .collect();
        // Rounds at the 30 s, 60 s and 120 s grid steps (backoff 15, 30, 60 s), one call each.
        assert!(
            later.len() <= 4,
            "{} calls after the first round: {later:?}",
            later.len()
        );
        assert!(later.contains(&20), "a round asks about all 20: {later:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_throttled_call_is_sent_again_and_its_waiters_answered() {
        let fake = Fake::default();
        let l = lookup(&fake);
        fake.fail_next.store(2, Ordering::SeqCst);
        let (i2, i4) = (id(2), id(4));
        let started = Instant::now();
        let (a, b) = tokio::join!(l.resolve("r", &i2, None), l.resolve("r", &i4, None));
        assert!(
            matches!(a, Ok(Resolved::Topology { .. }))
                && matches!(b, Ok(Resolved::Topology { .. }))
        );
        assert_eq!(
            fake.calls().len(),
            3,
            "throttled twice, then answered: the same batch three times"
        );
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "waited the limiter's pauses, not a per-node backoff: {:?}",
            started.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn throttling_that_outlasts_the_resends_reaches_the_waiters() {
        let fake = Fake::default();
        let l = lookup(&fake);
        fake.fail_next.store(100, Ordering::SeqCst);
        let e = l.resolve("r", &id(2), None).await.unwrap_err();
        assert!(e.is_throttle());
        assert_eq!(fake.calls().len(), 1 + THROTTLED_RESENDS as usize);
    }

    /// EC2 down, then back: the batcher notices within its probe interval, by itself, so every
    /// node waiting out a per-node backoff can be re-checked at once.
    #[tokio::test(start_paused = true)]
    async fn the_end_of_an_outage_is_noticed_without_waiting_for_a_reconcile() {
        let fake = Fake::default();
        let l = lookup(&fake);
        let rx = l.recoveries();
        *fake.fail_with.lock().unwrap() = Some(Ec2Error::Transport("connection refused".into()));
        fake.fail_next.store(1_000, Ordering::SeqCst);
        assert!(l.resolve("r", &id(2), None).await.is_err());
        tokio::time::sleep(Duration::from_secs(10)).await;
        let probes = fake.calls().len() - 1;
        assert!(
            (3..=6).contains(&probes),
            "probed every ~2 s while down: {probes} probes in 10 s"
        );
        assert!(!rx.has_changed().unwrap());
        fake.fail_next.store(0, Ordering::SeqCst);
        let back = Instant::now();
        while !rx.has_changed().unwrap() {
            assert!(
                back.elapsed() < Duration::from_secs(3),
                "recovery not noticed"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let calls = fake.calls().len();
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(fake.calls().len(), calls, "no probes once EC2 answers");
    }

    /// 100 instances asked at once, one of which EC2 refuses: every other one is answered in
    /// the same pass, the refused one is reported as such, and it is not asked about again
    /// within its backoff. Returns the sizes of the calls.
    async fn one_refused_id_in_a_full_batch(fake: &Fake) -> Vec<usize> {
        let l = lookup(fake);
        let bad = id(2 * 37);
        fake.poison.lock().unwrap().push(bad.clone());
        let asks = (0..100).map(|n| {
            let l = l.clone();
            async move { (id(n * 2), l.resolve("r", &id(n * 2), Some("b")).await) }
        });
        for (i, answer) in futures::future::join_all(asks).await {
            match answer {
                Ok(Resolved::Rejected { error, .. }) if i == bad => {
                    assert!(error.is_instance_id_error())
                }
                Ok(Resolved::Topology { .. }) if i != bad => {}
                other => panic!("{i}: {other:?}"),
            }
        }
        let sizes: Vec<usize> = fake.calls().iter().map(|(_, ids)| ids.len()).collect();
        for _ in 0..5 {
            assert!(matches!(
                l.resolve("r", &bad, Some("b")).await,
                Ok(Resolved::Rejected { .. })
            ));
        }
        assert_eq!(
            fake.calls().len(),
            sizes.len(),
            "not asked again within its backoff"
        );
        sizes
    }

    #[tokio::test(start_paused = true)]
    async fn an_id_ec2_refuses_and_names_costs_one_more_call() {
        let fake = Fake::default();
        fake.name_poison.store(true, Ordering::SeqCst);
        let sizes = one_refused_id_in_a_full_batch(&fake).await;
        assert_eq!(
            sizes,
            vec![100, 99],
            "the named ID dropped, the rest sent again"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_id_ec2_refuses_without_naming_it_is_found_by_halving() {
        let fake = Fake::default();
        let sizes = one_refused_id_in_a_full_batch(&fake).await;
        // 100, then two halves per level down to the culprit: 1 + 2 * ceil(log2 100) at most.
        assert!(sizes.len() <= 15, "{sizes:?}");
        assert_eq!(sizes[0], 100);
    }

    #[tokio::test(start_paused = true)]
    async fn entries_go_with_their_instances_and_keep_their_backoff() {
        let fake = Fake::default();
        let l = lookup(&fake);
        l.resolve("r", &id(2), None).await.unwrap();
        // An unsupported instance, asked about three times: its next ask is a minute away.
        for _ in 0..3 {
            let Resolved::NotDescribed { retry_in, .. } =
                l.resolve("r", &id(1), None).await.unwrap()
            else {
                panic!("not described")
            };
            tokio::time::advance(retry_in + Duration::from_millis(10)).await;
        }
        let calls = fake.calls().len();
        tokio::time::advance(Duration::from_secs(3 * 3600)).await;
        let live = [id(1)].into_iter().collect();
        assert_eq!(
            l.retain_instances(&live),
            1,
            "the other instance's node is gone"
        );
        assert_eq!(l.cached(), 1);
        let r = l.resolve("r", &id(1), None).await.unwrap();
        assert!(
            matches!(r, Resolved::NotDescribed { attempts: 4, .. }),
            "however old, the entry kept its attempts: {r:?}"
        );
        assert_eq!(fake.calls().len(), calls + 1);
    }
}
