//! Topology lookups: a cache in front of a batcher in front of EC2.
//!
//! Every reconcile asks [`Lookup::resolve`] for its instance. The `cache` answers when it can
//! (keyed by instance ID and the node's boot ID: a new boot means the instance may have moved).
//! Misses from all reconciles are coalesced by one `batcher` task into `DescribeInstanceTopology`
//! calls of at most 100 IDs, through the shared [`limiter`], to the [`ec2`] client (or any other
//! [`TopologySource`]).
//!
//! Owns: what we know about instances, and every EC2 call. Never touches the Kubernetes API: a
//! crate of its own, with no Kubernetes dependency, so that it cannot. What it reports goes
//! through [`Observer`], which the controller's metrics implement.

mod batcher;
pub mod cache;
pub mod capacity_blocks;
pub mod ec2;
pub mod limiter;
mod query;
mod reservations;
#[cfg(test)]
mod tests;

use crate::bounds::{Bound, DAY, millis, secs};
use std::{
    collections::HashSet,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use clap::Args;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio::{
    sync::{mpsc, oneshot, watch},
    time::Instant,
};

// The core's and the kit's modules, named as the rest of the workspace names them.
use ec2_topology_core::{provider_id, topology, verified};
use ec2_topology_kit::{backoff, bounds, compact, duration, intern};

use crate::{
    duration::HumanDuration,
    ec2::{AwsTopology, Ec2Args},
    topology::{Ec2Error, InstanceTopology, MAX_IDS_PER_CALL, TopologySource},
    verified::RecordKey,
};
use batcher::{Batcher, Health};
use cache::{Answer, Cache, Check};
use limiter::Limiter;

/// What the lookup reports as it works, for the controller's metrics: the lookup keeps no
/// metrics of its own and knows nothing of how they are exported.
pub trait Observer: Send + Sync {
    /// One EC2 call of `ids` instances in `region` ended after `took`, failed with `error` or not.
    fn ec2_call(&self, region: &str, ids: usize, took: Duration, error: Option<&Ec2Error>);
    /// A resolve answered from the cache.
    fn cache_hit(&self);
    /// A resolve that had to ask EC2.
    fn cache_miss(&self);
    /// `n` answers asked again before their time, riding along in a call that had room.
    fn reverified_early(&self, n: usize);
}

/// Reports nothing: for tests and commands that keep no metrics.
impl Observer for () {
    fn ec2_call(&self, _: &str, _: usize, _: Duration, _: Option<&Ec2Error>) {}
    fn cache_hit(&self) {}
    fn cache_miss(&self) {}
    fn reverified_early(&self, _: usize) {}
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LookupConfig {
    /// A call goes out once no new ID has joined the waiting ones for this long (a burst keeps
    /// filling one call), or as soon as `max_batch` are waiting.
    pub batch_window: Duration,
    /// Longest any ID waits for its call to fill, however steadily others keep arriving.
    pub batch_max_wait: Duration,
    /// IDs per call (EC2 allows at most 100).
    pub max_batch: usize,
    /// How often each answer is asked again, at its node's next reconcile (normally the
    /// periodic resync), with the answers due soonest after it in the same call.
    pub cache_ttl: Duration,
    /// First retry after EC2 did not describe an instance; doubles per attempt.
    pub not_described_retry: Duration,
    /// Longest wait between asks about an instance EC2 does not describe (unsupported type).
    pub not_described_ttl: Duration,
}

/// The lookup flags' defaults, written once: the flags show them, [`LookupConfig::default`]
/// takes them.
const BATCH_WINDOW: Duration = Duration::from_millis(200);
const BATCH_MAX_WAIT: Duration = Duration::from_secs(2);
const CACHE_TTL: Duration = Duration::from_secs(6 * 3600);
const NOT_DESCRIBED_RETRY: Duration = Duration::from_secs(15);
const NOT_DESCRIBED_TTL: Duration = Duration::from_secs(3600);

impl Default for LookupConfig {
    fn default() -> Self {
        Self {
            batch_window: BATCH_WINDOW,
            batch_max_wait: BATCH_MAX_WAIT,
            max_batch: MAX_IDS_PER_CALL,
            cache_ttl: CACHE_TTL,
            not_described_retry: NOT_DESCRIBED_RETRY,
            not_described_ttl: NOT_DESCRIBED_TTL,
        }
    }
}

/// What we know about an instance, as far as the reconciler is concerned.
#[derive(Debug, Clone, PartialEq)]
pub enum Resolved {
    /// EC2 described the instance with its network nodes.
    Topology {
        /// EC2's answer without its instance ID (the one asked about: an empty
        /// `instance_id`), shared with every instance the same answer was given for: handed
        /// out without a copy (a resync asks about every node).
        answer: Arc<InstanceTopology>,
        /// A refresh of an older answer failed; this is the older answer.
        refresh_error: Option<Ec2Error>,
        /// The answer lacks a field EC2 fills in late (see [`InstanceTopology::settling`]): it
        /// is asked for again this soon, and the node should be re-checked then.
        recheck_in: Option<Duration>,
        /// Since when EC2 has given this answer in this boot (seconds since the Unix epoch):
        /// the node's verification record says so (see [`crate::verified`]).
        verified_at: u64,
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

struct Request {
    region: String,
    instance_id: String,
    /// Its node is joining (new, or held back from scheduling by a startup taint until
    /// labelled): it goes ahead of the other waiting IDs, and its call is not held for long
    /// to fill (see `Waiting::due`).
    urgent: bool,
    /// EC2 refused this ID when last asked: it waits in a queue of its own (with the other IDs
    /// refused before), so that the calls of the other instances do not fail for it.
    alone: bool,
    reply: oneshot::Sender<Answer>,
}

/// `--batch-window`'s range.
pub const BATCH_WINDOW_RANGE: Bound = Bound::duration("batch-window", millis(1), secs(60));
/// `--batch-max-wait`'s range.
pub const BATCH_MAX_WAIT_RANGE: Bound = Bound::duration("batch-max-wait", millis(1), secs(600));
/// `--cache-ttl`'s range.
pub const CACHE_TTL_RANGE: Bound = Bound::duration("cache-ttl", secs(1), secs(30 * DAY));
/// `--not-described-retry`'s range.
pub const NOT_DESCRIBED_RETRY_RANGE: Bound =
    Bound::duration("not-described-retry", millis(100), secs(DAY));
/// `--not-described-ttl`'s range.
pub const NOT_DESCRIBED_TTL_RANGE: Bound =
    Bound::duration("not-described-ttl", secs(1), secs(30 * DAY));

/// Batching and caching of topology answers.
#[derive(Debug, Clone, Args, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LookupArgs {
    /// A DescribeInstanceTopology call goes out once no new instance has joined the waiting
    /// ones for this long (a burst of new nodes keeps filling one call), or as soon as 100 wait.
    #[arg(long, value_parser = BATCH_WINDOW_RANGE.durations(), env = "LABELER_BATCH_WINDOW", default_value_t = HumanDuration(BATCH_WINDOW))]
    pub batch_window: HumanDuration,
    /// Longest an instance waits for its call to fill while others keep arriving (an instance
    /// whose node is joining or carries the startup taint: two batch windows at most, three
    /// while only joining nodes wait and their burst is about to fill the call).
    #[arg(long, value_parser = BATCH_MAX_WAIT_RANGE.durations(), env = "LABELER_BATCH_MAX_WAIT", default_value_t = HumanDuration(BATCH_MAX_WAIT))]
    pub batch_max_wait: HumanDuration,
    /// How often each instance's answer is asked again (re-verified), in full calls: when one
    /// comes due at its node's next reconcile, the answers due soonest ride its call.
    #[arg(long, value_parser = CACHE_TTL_RANGE.durations(), env = "LABELER_CACHE_TTL", default_value_t = HumanDuration(CACHE_TTL))]
    pub cache_ttl: HumanDuration,
    /// First retry after EC2 did not describe an instance (doubles per attempt).
    #[arg(long, value_parser = NOT_DESCRIBED_RETRY_RANGE.durations(), env = "LABELER_NOT_DESCRIBED_RETRY", default_value_t = HumanDuration(NOT_DESCRIBED_RETRY))]
    pub not_described_retry: HumanDuration,
    /// Longest wait before asking again about an instance EC2 does not describe (an unsupported
    /// instance type).
    #[arg(long, value_parser = NOT_DESCRIBED_TTL_RANGE.durations(), env = "LABELER_NOT_DESCRIBED_TTL", default_value_t = HumanDuration(NOT_DESCRIBED_TTL))]
    pub not_described_ttl: HumanDuration,
    /// A file holding the key verification records are sealed with (an HMAC key of at least 32
    /// bytes; the chart mounts one from a Secret it creates). A record is trusted only if sealed
    /// with this key: whoever may patch a node cannot forge one. Without it, records are
    /// neither written nor trusted (every start asks EC2 about every instance).
    #[arg(long, env = "LABELER_RECORD_KEY_FILE")]
    #[serde(skip)]
    #[schemars(skip)]
    pub record_key_file: Option<std::path::PathBuf>,
    /// A file of the keys of earlier rotations, one per line, newest first: records sealed with
    /// them are still trusted (never sealed with), so a rotation costs no EC2 call and no write.
    /// A file that does not exist holds none (the chart mounts the Secret's `previous`, which
    /// it has only after a rotation).
    #[arg(
        long,
        env = "LABELER_PREVIOUS_RECORD_KEY_FILE",
        requires = "record_key_file"
    )]
    #[serde(skip)]
    #[schemars(skip)]
    pub previous_record_key_file: Option<std::path::PathBuf>,
}

impl LookupArgs {
    /// The key of `--record-key-file`, if given: the file's bytes, a trailing newline left out.
    pub fn record_key(&self) -> Result<Option<RecordKey>, String> {
        let Some(path) = &self.record_key_file else {
            return Ok(None);
        };
        let bytes = std::fs::read(path)
            .map_err(|e| format!("cannot read --record-key-file {}: {e}", path.display()))?;
        let secret = bytes.strip_suffix(b"\n").unwrap_or(&bytes);
        let key = RecordKey::new(secret)
            .map_err(|e| format!("--record-key-file {}: {e}", path.display()))?;
        Ok(Some(key.with_previous(self.previous_record_keys()?)))
    }

    /// The keys of `--previous-record-key-file`, newest first (none when it is not given or the
    /// file does not exist). A line that is no key is an error naming its line, never its text.
    fn previous_record_keys(&self) -> Result<Vec<RecordKey>, String> {
        let Some(path) = &self.previous_record_key_file else {
            return Ok(Vec::new());
        };
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => {
                return Err(format!(
                    "cannot read --previous-record-key-file {}: {e}",
                    path.display()
                ));
            }
        };
        bytes
            .split(|b| *b == b'\n')
            .map(|line| line.strip_suffix(b"\r").unwrap_or(line))
            .enumerate()
            .filter(|(_, line)| !line.is_empty())
            .map(|(i, line)| {
                RecordKey::new(line).map_err(|e| {
                    format!(
                        "--previous-record-key-file {} line {}: {e}",
                        path.display(),
                        i + 1
                    )
                })
            })
            .collect()
    }

    pub fn lookup(&self) -> LookupConfig {
        LookupConfig {
            batch_window: self.batch_window.0,
            batch_max_wait: self.batch_max_wait.0,
            cache_ttl: self.cache_ttl.0,
            not_described_retry: self.not_described_retry.0,
            not_described_ttl: self.not_described_ttl.0,
            ..LookupConfig::default()
        }
    }
}

/// Handle to the cache and the batcher. Cheap to clone.
#[derive(Clone)]
pub struct Lookup {
    cache: Arc<Cache>,
    /// The key verification records are sealed and opened with (none: records are neither
    /// written nor trusted).
    record_key: Option<Arc<RecordKey>>,
    /// IDs per call (EC2 allows at most 100).
    max_batch: usize,
    requests: mpsc::UnboundedSender<Request>,
    observer: Arc<dyn Observer>,
    recoveries: watch::Receiver<u64>,
    /// False once the batcher task has ended (it never should): `/livez` reports it.
    batcher_alive: Arc<AtomicBool>,
}

/// Sets its flag false when dropped: held by a task for its whole life, panics included.
struct AliveGuard(Arc<AtomicBool>);

impl Drop for AliveGuard {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

impl Lookup {
    /// Start the batcher task for `source` and return the handle.
    pub fn spawn<S: TopologySource>(
        source: S,
        limiter: Arc<Limiter>,
        cfg: LookupConfig,
        observer: Arc<dyn Observer>,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let (recovered, recoveries) = watch::channel(0);
        let batcher = Batcher::new(
            Arc::new(source),
            limiter,
            cfg,
            observer.clone(),
            Arc::new(Health::new(recovered)),
        );
        let batcher_alive = Arc::new(AtomicBool::new(true));
        let guard = AliveGuard(batcher_alive.clone());
        tokio::spawn(async move {
            let _alive = guard;
            batcher.run(rx).await;
        });
        Self {
            cache: Arc::new(Cache::new(cfg, Instant::now())),
            record_key: None,
            max_batch: cfg.max_batch,
            requests: tx,
            observer,
            recoveries,
            batcher_alive,
        }
    }

    /// Seal and open verification records with `key` (none: records are neither written nor
    /// trusted).
    pub fn with_record_key(mut self, key: Option<RecordKey>) -> Self {
        self.record_key = key.map(Arc::new);
        self
    }

    /// The key verification records are sealed and opened with.
    pub fn record_key(&self) -> Option<&RecordKey> {
        self.record_key.as_deref()
    }

    /// Whether the batcher task still runs: without it every lookup fails.
    pub fn batcher_running(&self) -> bool {
        self.batcher_alive.load(Ordering::SeqCst)
    }

    /// The topology of `instance_id` (in `region`) during the boot `boot_id`.
    pub async fn resolve(
        &self,
        region: &str,
        instance_id: &str,
        boot_id: Option<&str>,
    ) -> Result<Resolved, Ec2Error> {
        self.resolve_expecting(region, instance_id, boot_id, false, false)
            .await
    }

    /// As [`Self::resolve`]; `capacity_block_expected` when the node carries a capacity-block
    /// label already, so an answer without one is asked for again soon; `urgent` when the node
    /// is joining (new, or held back from scheduling by a startup taint until labelled), so it
    /// goes ahead of whatever else waits and its call is sent after a short wait rather than
    /// held to fill.
    pub async fn resolve_expecting(
        &self,
        region: &str,
        instance_id: &str,
        boot_id: Option<&str>,
        capacity_block_expected: bool,
        urgent: bool,
    ) -> Result<Resolved, Ec2Error> {
        self.ask(
            region,
            instance_id,
            boot_id,
            capacity_block_expected,
            urgent,
        )
        .answer()
        .await
    }

    /// As [`Self::resolve_expecting`], but the cache is consulted and a miss handed to the
    /// batcher now, when this is called, not when the returned [`Asked`] is first awaited: a
    /// caller that asks about many instances in one go (the walk at start) puts them all in
    /// the batcher's queue before it next runs, so they fill whole calls whatever the timing.
    pub fn ask(
        &self,
        region: &str,
        instance_id: &str,
        boot_id: Option<&str>,
        capacity_block_expected: bool,
        urgent: bool,
    ) -> Asked {
        let stale = match self.cache.check(
            instance_id,
            boot_id,
            capacity_block_expected,
            Instant::now(),
        ) {
            Check::Answered(resolved) => {
                self.observer.cache_hit();
                return Asked(AskedState::Known(Ok(resolved)));
            }
            Check::Ask { stale } => stale,
        };
        self.observer.cache_miss();
        let (reply, answer) = oneshot::channel();
        let alone = stale.as_ref().is_some_and(cache::Entry::refused);
        let sent = self.requests.send(Request {
            region: region.to_string(),
            instance_id: instance_id.to_string(),
            urgent,
            alone,
            reply,
        });
        if sent.is_err() {
            return Asked(AskedState::Known(Err(Ec2Error::Transport(
                "topology batcher has stopped".into(),
            ))));
        }
        if stale.as_ref().is_some_and(cache::Entry::reverifies) {
            self.take_along(region, instance_id);
        }
        Asked(AskedState::Sent {
            cache: self.cache.clone(),
            answer,
            instance_id: instance_id.to_string(),
            boot_id: boot_id.map(str::to_owned),
            stale,
            capacity_block_expected,
        })
    }

    /// `instance_id`'s answer came due and is being asked again: the answers of `region` due
    /// soonest after it fill its call (up to 100 IDs in all), and are taken into the cache
    /// when it comes back. A fleet is then re-verified in about `ceil(N/100)` calls a TTL,
    /// however its nodes' re-checks fall, instead of a call for each few that come due together.
    fn take_along(&self, region: &str, instance_id: &str) {
        use futures::{StreamExt, stream::FuturesUnordered};
        let room = self.max_batch.saturating_sub(1);
        let taken = self
            .cache
            .due_soonest(region, instance_id, room, Instant::now());
        if taken.is_empty() {
            return;
        }
        let pending = FuturesUnordered::new();
        for (id, was) in taken {
            let (reply, answer) = oneshot::channel();
            let sent = self.requests.send(Request {
                region: region.to_string(),
                instance_id: id.clone(),
                urgent: false,
                alone: false,
                reply,
            });
            if sent.is_err() {
                self.cache.refreshed(&id, was, None, Instant::now());
                continue;
            }
            pending.push(async move { (id, was, answer.await.ok()) });
        }
        let (cache, observer) = (self.cache.clone(), self.observer.clone());
        tokio::spawn(pending.for_each(move |(id, was, answer)| {
            if cache.refreshed(&id, was, answer, Instant::now()) {
                observer.reverified_early(1);
            }
            std::future::ready(())
        }));
    }

    /// Take the answer a node's verification record holds (trusted by the caller: the
    /// controller's `reconcile::assess::adopt`) when nothing is known about its instance yet; returns
    /// whether it was taken.
    pub fn adopt(&self, verified: crate::verified::Verified) -> bool {
        self.cache.seed(verified, Instant::now())
    }

    /// Whether anything is known about `instance_id` (an answer, or a backoff).
    pub fn knows(&self, instance_id: &str) -> bool {
        self.cache.knows(instance_id)
    }

    /// The cached answer for `instance_id` cannot be used (labels cannot be derived from it):
    /// forget it, and ask again after the not-described backoff. Returns that wait.
    pub fn reject(&self, instance_id: &str) -> Duration {
        self.cache.reject(instance_id, Instant::now())
    }

    /// Keep only the entries of instances some node still runs on; returns how many went.
    /// Age plays no part: an instance retried with a long backoff keeps its backoff.
    pub fn retain_instances(&self, live: &HashSet<String>) -> usize {
        self.cache.retain(live)
    }

    /// Changes each time EC2 answers again after calls failed: nodes waiting out a per-node
    /// backoff can be re-checked at once instead of one by one.
    pub fn recoveries(&self) -> watch::Receiver<u64> {
        self.recoveries.clone()
    }

    /// Number of cached instances.
    pub fn cached(&self) -> usize {
        self.cache.len()
    }

    /// What the cache holds about `instance_id` (for `explain`); asks nobody.
    pub fn inspect(&self, instance_id: &str) -> Option<cache::CacheView> {
        self.cache.inspect(instance_id, Instant::now())
    }
}

/// A lookup handed to the batcher (or answered from the cache) by [`Lookup::ask`].
pub struct Asked(AskedState);

enum AskedState {
    Known(Result<Resolved, Ec2Error>),
    Sent {
        cache: Arc<Cache>,
        answer: oneshot::Receiver<Answer>,
        instance_id: String,
        boot_id: Option<String>,
        stale: Option<cache::Entry>,
        capacity_block_expected: bool,
    },
}

impl Asked {
    /// The answer, once its call has come back; recorded in the cache.
    pub async fn answer(self) -> Result<Resolved, Ec2Error> {
        match self.0 {
            AskedState::Known(known) => known,
            AskedState::Sent {
                cache,
                answer,
                instance_id,
                boot_id,
                stale,
                capacity_block_expected,
            } => {
                let answer = answer.await.map_err(|_| {
                    Ec2Error::Transport("topology batcher dropped the request".into())
                })?;
                cache.record(
                    &instance_id,
                    boot_id.as_deref(),
                    stale,
                    answer,
                    capacity_block_expected,
                    Instant::now(),
                )
            }
        }
    }
}

/// Build the lookup stack: EC2 client, shared limiter, batching cache. Fails only on a
/// configuration the flags' parsers could not refuse alone (the record key's file).
pub async fn lookup_from(
    ec2: &Ec2Args,
    lookup: &LookupArgs,
    observer: Arc<dyn Observer>,
) -> Result<Lookup, String> {
    lookup_sharing(ec2, lookup, observer, Arc::new(Limiter::new(ec2.limiter()))).await
}

/// [`lookup_from`], pacing its calls with `limiter` (which other EC2 callers share).
pub async fn lookup_sharing(
    ec2: &Ec2Args,
    lookup: &LookupArgs,
    observer: Arc<dyn Observer>,
    limiter: Arc<Limiter>,
) -> Result<Lookup, String> {
    let key = lookup.record_key()?;
    let source = AwsTopology::from_env(ec2.ec2_timeout.0)
        .await
        .with_limiter(limiter.clone());
    Ok(Lookup::spawn(source, limiter, lookup.lookup(), observer).with_record_key(key))
}
