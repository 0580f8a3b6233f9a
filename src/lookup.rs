//! Topology lookups: a cache in front of a batcher in front of EC2.
//!
//! Every reconcile asks [`Lookup::resolve`] for its instance. Cached answers are returned at once
//! (keyed by instance ID and the node's boot ID: a new boot means the instance may have moved).
//! Misses from all reconciles are coalesced by one batcher task into `DescribeInstanceTopology`
//! calls of at most 100 IDs, sent when 100 are waiting or the batch window has passed, through the
//! shared [`Limiter`]. Instances EC2 does not describe are retried with capped exponential backoff
//! and otherwise remembered, so they never cost a call per reconcile.

use std::{
    collections::{BTreeMap, HashMap, hash_map::Entry},
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
    },
    /// EC2 left the instance out or gave it no network nodes (unsupported type, not running
    /// yet, eventual consistency). Ask again no sooner than `retry_in`.
    NotDescribed { retry_in: Duration, attempts: u32 },
}

#[derive(Debug, Clone)]
enum State {
    Known {
        topology: Arc<InstanceTopology>,
        fetched_at: Instant,
    },
    NotDescribed {
        retry_at: Instant,
        attempts: u32,
    },
}

#[derive(Debug, Clone)]
struct CacheEntry {
    boot_id: Option<String>,
    state: State,
    used_at: Instant,
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
        tokio::spawn(batcher.run(rx));
        Self {
            cfg,
            cache: Arc::default(),
            requests: tx,
            metrics,
            recoveries,
        }
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
        let now = Instant::now();
        let stale = {
            let mut cache = self.cache();
            match cache.get_mut(instance_id) {
                Some(e) if !rebooted(e.boot_id.as_deref(), boot_id) => {
                    e.used_at = now;
                    if e.boot_id.is_none() {
                        e.boot_id = boot_id.map(str::to_owned);
                    }
                    match &e.state {
                        State::Known {
                            topology,
                            fetched_at,
                        } if now.saturating_duration_since(*fetched_at) < self.cfg.cache_ttl => {
                            self.metrics.cache_hit();
                            return Ok(Resolved::Topology {
                                topology: topology.clone(),
                                refresh_error: None,
                            });
                        }
                        State::NotDescribed { retry_at, attempts } if now < *retry_at => {
                            self.metrics.cache_hit();
                            return Ok(Resolved::NotDescribed {
                                retry_in: *retry_at - now,
                                attempts: *attempts,
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
        let previous_attempts = match &stale {
            Some(CacheEntry {
                state: State::NotDescribed { attempts, .. },
                ..
            }) => *attempts,
            _ => 0,
        };
        let (state, resolved) = match answer {
            Ok(Some(t)) if !t.network_nodes.is_empty() => {
                let topology = Arc::new(t);
                (
                    State::Known {
                        topology: topology.clone(),
                        fetched_at: now,
                    },
                    Resolved::Topology {
                        topology,
                        refresh_error: None,
                    },
                )
            }
            Ok(_) => match previous_topology {
                // Described before in this boot, not now: EC2 is lagging or wrong. Keep what we
                // knew (labels are never stripped on EC2's word alone) and ask again after a TTL.
                Some(topology) => (
                    State::Known {
                        topology: topology.clone(),
                        fetched_at: now,
                    },
                    Resolved::Topology {
                        topology,
                        refresh_error: None,
                    },
                ),
                None => {
                    let attempts = previous_attempts.saturating_add(1);
                    let retry_in = self.not_described_backoff(attempts);
                    (
                        State::NotDescribed {
                            retry_at: now + retry_in,
                            attempts,
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
                used_at: now,
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
        let retry_in = self.not_described_backoff(e.rejected);
        e.state = State::NotDescribed {
            retry_at: now + retry_in,
            attempts: e.rejected,
        };
        retry_in
    }

    /// Drop entries no reconcile has asked about for `unused_for` (deleted nodes).
    pub fn evict_unused(&self, unused_for: Duration) -> usize {
        let now = Instant::now();
        let mut cache = self.cache();
        let before = cache.len();
        cache.retain(|_, e| now.saturating_duration_since(e.used_at) < unused_for);
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

/// Whether EC2 calls are failing, to notice the moment they stop.
struct Health {
    failing: std::sync::atomic::AtomicBool,
    recovered: tokio::sync::watch::Sender<u64>,
}

type BatchResult = (String, Vec<String>, Result<Vec<InstanceTopology>, Ec2Error>);

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

        loop {
            let now = Instant::now();
            if blocked_until.is_none_or(|b| now >= b) {
                blocked_until = None;
                loop {
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
                    in_flight.push(self.call(region, batch));
                }
            }
            if !open && queued.values().all(|w| w.ids.is_empty()) && in_flight.is_empty() {
                return;
            }
            let wake = blocked_until.or_else(|| {
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
                Some((region, ids, result)) = in_flight.next(), if !in_flight.is_empty() => {
                    deliver(&mut waiting, &region, &ids, result);
                }
            }
        }
    }

    fn call(
        &self,
        region: String,
        ids: Vec<String>,
    ) -> impl std::future::Future<Output = BatchResult> + Send + 'static {
        let source = self.source.clone();
        let limiter = self.limiter.clone();
        let metrics = self.metrics.clone();
        let health = self.health.clone();
        async move {
            let started = std::time::Instant::now();
            let result = source.describe(&region, &ids).await;
            metrics.ec2_call(&region, ids.len(), started.elapsed(), result.as_ref().err());
            let ok = result.is_ok();
            if health
                .failing
                .swap(!ok, std::sync::atomic::Ordering::SeqCst)
                && ok
            {
                health.recovered.send_modify(|n| *n += 1);
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
            (region, ids, result)
        }
    }
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

    /// A fake EC2: describes instances with an even number, records each call.
    #[derive(Clone, Default)]
    struct Fake {
        calls: CallLog,
        fail_next: Arc<AtomicUsize>,
        layer: Arc<Mutex<String>>,
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
                return Err(Ec2Error::from_code("RequestLimitExceeded", "slow down"));
            }
            let layer = self.layer.lock().unwrap().clone();
            Ok(ids
                .iter()
                .filter(|id| u64::from_str_radix(&id[2..], 16).is_ok_and(|n| n % 2 == 0))
                .map(|id| InstanceTopology {
                    instance_id: id.clone(),
                    network_nodes: vec!["nn-top".into(), "nn-mid".into(), layer.clone()],
                    ..InstanceTopology::default()
                })
                .collect())
        }
    }

    fn id(n: usize) -> String {
        format!("i-{n:017x}")
    }

    fn lookup(fake: &Fake) -> Lookup {
        *fake.layer.lock().unwrap() = "nn-leaf-1".into();
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
        assert_eq!((retry_in, attempts), (Duration::from_secs(15), 1));
        for _ in 0..10 {
            assert!(matches!(
                l.resolve("r", &id(1), Some("b")).await.unwrap(),
                Resolved::NotDescribed { .. }
            ));
        }
        assert_eq!(fake.calls().len(), 1, "no call per reconcile");
        tokio::time::advance(Duration::from_secs(16)).await;
        let second = l.resolve("r", &id(1), Some("b")).await.unwrap();
        assert_eq!(fake.calls().len(), 2);
        assert!(
            matches!(second, Resolved::NotDescribed { attempts: 2, retry_in } if retry_in == Duration::from_secs(30))
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
        fake.fail_next.store(1, Ordering::SeqCst);
        let r = l.resolve("r", &id(2), Some("b")).await.unwrap();
        match r {
            Resolved::Topology {
                refresh_error: Some(e),
                topology,
            } => {
                assert!(e.is_throttle());
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
        fake.fail_next.store(1, Ordering::SeqCst);
        let (i2, i4) = (id(2), id(4));
        let (a, b) = tokio::join!(l.resolve("r", &i2, None), l.resolve("r", &i4, None));
        assert!(a.unwrap_err().is_throttle() && b.unwrap_err().is_throttle());
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
        assert_eq!(l.reject(&id(2)), Duration::from_secs(15));
        assert!(matches!(
            l.resolve("r", &id(2), Some("b")).await.unwrap(),
            Resolved::NotDescribed { .. }
        ));
        assert_eq!(fake.calls().len(), 1, "not asked again before the backoff");
        tokio::time::advance(Duration::from_secs(16)).await;
        assert!(matches!(
            l.resolve("r", &id(2), Some("b")).await.unwrap(),
            Resolved::Topology { .. }
        ));
        assert_eq!(fake.calls().len(), 2);
        assert_eq!(
            l.reject(&id(2)),
            Duration::from_secs(30),
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

    #[tokio::test(start_paused = true)]
    async fn unused_entries_are_evicted() {
        let fake = Fake::default();
        let l = lookup(&fake);
        l.resolve("r", &id(2), None).await.unwrap();
        tokio::time::advance(Duration::from_secs(10)).await;
        l.resolve("r", &id(4), None).await.unwrap();
        assert_eq!(l.evict_unused(Duration::from_secs(5)), 1);
        assert_eq!(l.cached(), 1);
    }
}
