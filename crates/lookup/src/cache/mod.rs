//! What we know about each instance, per boot: the state machine behind every lookup.
//!
//! States: **known** (an answer, fresh until its refresh time; refreshed soon while a field EC2
//! fills in late is missing), **not described** (EC2 left it out or gave no network nodes; asked
//! again with capped backoff), **refused** (EC2 refused the ID; same backoff). A new boot ID
//! means the instance may have moved: its entry starts afresh.
//!
//! An answer is kept without its instance ID, once for every instance it describes alike (all
//! instances of one type under one switch in one zone get the same answer but for their ID): at
//! 100,000 nodes, some thousands of answers instead of 100,000 (about 450 bytes each).
//!
//! Owns: the entries and every retry time. Never does I/O: the caller asks EC2 (through the
//! batcher) and hands the answer to [`Cache::record`]; time is passed in.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use tokio::time::Instant;

use super::{LookupConfig, Resolved};
use crate::{
    compact::{BootId, InstanceId},
    intern::Interner,
    topology::{Ec2Error, InstanceTopology},
    verified::Verified,
};

/// What one call said about one instance: described (or not), or the call failed.
pub type Answer = Result<Option<InstanceTopology>, Ec2Error>;

mod reverify;
mod view;
pub use reverify::{seeded_wait, spread};
pub use view::CacheView;

#[derive(Debug, Clone)]
enum State {
    Known {
        /// The answer without its instance ID (the entry's key), shared (see [`Inner::shapes`]).
        topology: Arc<InstanceTopology>,
        /// Asked again from here: after the cache TTL, or soon while `settling`.
        refresh_at: Instant,
        /// Answers in a row that lacked a late field (0: complete).
        settling: u32,
        /// EC2 refused the ID since it described it in this boot (the instance was terminated,
        /// or EC2 lags), and how many times in a row: the answer stands (labels are never
        /// stripped on EC2's word alone) and the ID is asked about with the refused ones, on the
        /// not-described backoff, from `refresh_at`.
        refused: Option<Box<(Ec2Error, u32)>>,
        /// When EC2 gave `topology` (seconds since the Unix epoch): what the node's
        /// verification record says (see [`crate::verified`]).
        verified_at: u64,
    },
    /// Not described, or refused (`refused`): asked again at `retry_at`.
    NotDescribed {
        retry_at: Instant,
        attempts: u32,
        /// Boxed: rare, and an entry of every instance is kept.
        refused: Option<Box<Ec2Error>>,
    },
}

/// An instance's entry, as it was when a lookup found it not fresh.
#[derive(Debug, Clone)]
pub struct Entry {
    boot_id: Option<BootId>,
    state: State,
    /// Answers for this boot that could not be turned into labels (see [`Cache::reject`]).
    rejected: u32,
    /// Taken along in a call that has not come back yet (see [`Cache::due_soonest`]): no
    /// other call takes it meanwhile.
    taken: bool,
}

impl Entry {
    /// EC2 refused this instance ID when last asked.
    pub(super) fn refused(&self) -> bool {
        matches!(
            self.state,
            State::NotDescribed {
                refused: Some(_),
                ..
            } | State::Known {
                refused: Some(_),
                ..
            }
        )
    }

    /// Refusals in a row since EC2 last described the instance.
    fn refusals(&self) -> u32 {
        match &self.state {
            State::Known {
                refused: Some(r), ..
            } => r.1,
            State::NotDescribed {
                refused: Some(_),
                attempts,
                ..
            } => *attempts,
            _ => 0,
        }
    }

    /// A complete answer EC2 gave (not settling, not refused), asked again because it came
    /// due: a re-verification, which takes along the answers due soonest after it.
    pub(super) fn reverifies(&self) -> bool {
        matches!(
            self.state,
            State::Known {
                settling: 0,
                refused: None,
                ..
            }
        )
    }

    /// The answer, without its instance ID.
    fn topology(&self) -> Option<Arc<InstanceTopology>> {
        match &self.state {
            State::Known { topology, .. } => Some(topology.clone()),
            State::NotDescribed { .. } => None,
        }
    }

    fn verified_at(&self) -> u64 {
        match &self.state {
            State::Known { verified_at, .. } => *verified_at,
            State::NotDescribed { .. } => 0,
        }
    }

    fn settling(&self) -> u32 {
        match &self.state {
            State::Known { settling, .. } => *settling,
            State::NotDescribed { .. } => 0,
        }
    }

    fn attempts(&self) -> u32 {
        match &self.state {
            State::NotDescribed { attempts, .. } => *attempts,
            State::Known { .. } => 0,
        }
    }
}

/// The outcome of looking in the cache.
pub enum Check {
    /// The cache answers.
    Answered(Resolved),
    /// EC2 must be asked; `stale` is the entry of this boot, if any (its answer stands when the
    /// new one fails or lacks something).
    Ask { stale: Option<Entry> },
}

pub struct Cache {
    cfg: LookupConfig,
    /// Retries are due on a clock shared by every instance, counted from here (see
    /// [`Cache::next_ask`]).
    epoch: Instant,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<InstanceId, Entry>,
    /// Every answer an entry holds, without its instance ID, once.
    shapes: Interner<InstanceTopology>,
}

impl Inner {
    /// `topology` without its instance ID, shared with every entry that has the same.
    fn intern(&mut self, mut topology: InstanceTopology) -> Arc<InstanceTopology> {
        topology.instance_id = String::new();
        self.shapes.share(Arc::new(topology))
    }
}

impl Cache {
    pub fn new(cfg: LookupConfig, epoch: Instant) -> Self {
        Self {
            cfg,
            epoch,
            inner: Mutex::default(),
        }
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        // Entries are replaced whole; a panic elsewhere cannot leave one half-written.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What the cache knows about `instance_id` in the boot `boot_id`, at `now`.
    pub fn check(
        &self,
        instance_id: &str,
        boot_id: Option<&str>,
        capacity_block_expected: bool,
        now: Instant,
    ) -> Check {
        let mut inner = self.inner();
        let Some(e) = inner.entries.get_mut(instance_id) else {
            return Check::Ask { stale: None };
        };
        if rebooted(e.boot_id.as_ref(), boot_id) {
            return Check::Ask { stale: None };
        }
        if e.boot_id.is_none() {
            e.boot_id = boot_id.map(BootId::new);
        }
        match &e.state {
            State::Known {
                topology,
                refresh_at,
                settling,
                refused,
                verified_at,
            } if now < *refresh_at
                // A complete answer without a capacity block, for a node that has one: ask
                // again now, then on the settling schedule (not while the ID is refused: then
                // on the refused ones' backoff).
                && (refused.is_some()
                    || !(*settling == 0 && topology.settling(capacity_block_expected))) =>
            {
                Check::Answered(Resolved::Topology {
                    answer: topology.clone(),
                    refresh_error: None,
                    recheck_in: (*settling > 0).then(|| *refresh_at - now),
                    verified_at: *verified_at,
                })
            }
            State::NotDescribed {
                retry_at,
                attempts,
                refused,
            } if now < *retry_at => {
                let (retry_in, attempts) = (*retry_at - now, *attempts);
                Check::Answered(match refused {
                    Some(error) => Resolved::Rejected {
                        error: (**error).clone(),
                        retry_in,
                        attempts,
                    },
                    None => Resolved::NotDescribed { retry_in, attempts },
                })
            }
            _ => Check::Ask {
                stale: Some(e.clone()),
            },
        }
    }

    /// Take EC2's `answer` about `instance_id` (asked because of `stale`) into the cache, and
    /// say what it means.
    pub fn record(
        &self,
        instance_id: &str,
        boot_id: Option<&str>,
        stale: Option<Entry>,
        answer: Answer,
        capacity_block_expected: bool,
        now: Instant,
    ) -> Result<Resolved, Ec2Error> {
        let mut inner = self.inner();
        let (state, resolved) = self.next(
            &mut inner,
            stale.as_ref(),
            answer,
            capacity_block_expected,
            now,
        );
        if let Some(state) = state {
            inner.entries.insert(
                instance_id.into(),
                Entry {
                    boot_id: boot_id.map(BootId::new),
                    state,
                    rejected: stale.as_ref().map_or(0, |e| e.rejected),
                    taken: false,
                },
            );
        }
        resolved
    }

    /// What EC2's `answer`, asked because of `stale`, makes of an entry (`None`: the entry
    /// stays as it is: a failed call is not cached) and what it means.
    fn next(
        &self,
        inner: &mut Inner,
        stale: Option<&Entry>,
        answer: Answer,
        capacity_block_expected: bool,
        now: Instant,
    ) -> (Option<State>, Result<Resolved, Ec2Error>) {
        let previous = stale.and_then(Entry::topology);
        let previous_settling = stale.map_or(0, Entry::settling);
        let previous_attempts = stale.map_or(0, Entry::attempts);
        let previous_verified_at = stale.map_or(0, Entry::verified_at);
        let (state, resolved) = match answer {
            // EC2 refused this very ID (the batcher isolates refused IDs, so the error is this
            // instance's alone).
            Err(e) if e.is_instance_id_error() => match previous {
                // Described before in this boot (terminated since, or EC2 lagging): the earlier
                // answer stands, and the ID waits with the refused ones, on their backoff,
                // instead of riding (and failing) the next ordinary call.
                Some(topology) => {
                    let attempts = stale.map_or(0, Entry::refusals).saturating_add(1);
                    let (refresh_at, _) = self.next_ask(now, attempts);
                    (
                        State::Known {
                            topology: topology.clone(),
                            refresh_at,
                            settling: 0,
                            refused: Some(Box::new((e.clone(), attempts))),
                            verified_at: previous_verified_at,
                        },
                        Resolved::Topology {
                            answer: topology.clone(),
                            refresh_error: Some(e),
                            recheck_in: None,
                            verified_at: previous_verified_at,
                        },
                    )
                }
                // Never described in this boot: remembered with the not-described backoff.
                None => {
                    let attempts = previous_attempts.saturating_add(1);
                    let (retry_at, retry_in) = self.next_ask(now, attempts);
                    (
                        State::NotDescribed {
                            retry_at,
                            attempts,
                            refused: Some(Box::new(e.clone())),
                        },
                        Resolved::Rejected {
                            error: e,
                            retry_in,
                            attempts,
                        },
                    )
                }
            },
            Ok(Some(t)) if !t.network_nodes.is_empty() => {
                // Within one boot, fields EC2 left out of this answer keep their earlier values.
                let t = match &previous {
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
                // The record says since when EC2 has given this answer in this boot: an answer
                // asked for again (at its TTL, or while settling) that says nothing new keeps
                // that time, so the node's record, and the node, stay as they are. Nothing in
                // the record moves with time alone: no write without a change, however long.
                let shape = inner.intern(t);
                let verified_at = match &previous {
                    Some(p) if *p == shape && previous_verified_at != 0 => previous_verified_at,
                    _ => unix_now(),
                };
                (
                    State::Known {
                        topology: shape.clone(),
                        refresh_at,
                        settling,
                        refused: None,
                        verified_at,
                    },
                    Resolved::Topology {
                        answer: shape,
                        refresh_error: None,
                        recheck_in,
                        verified_at,
                    },
                )
            }
            Ok(_) => match previous {
                // Described before in this boot, not now: EC2 is lagging or wrong. Keep what we
                // knew (labels are never stripped on EC2's word alone) and ask again after a TTL.
                Some(topology) => (
                    State::Known {
                        topology: topology.clone(),
                        refresh_at: now + self.cfg.cache_ttl,
                        settling: 0,
                        refused: None,
                        verified_at: previous_verified_at,
                    },
                    Resolved::Topology {
                        answer: topology,
                        refresh_error: None,
                        recheck_in: None,
                        verified_at: previous_verified_at,
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
            // A failed call is not cached: the earlier answer of this boot stands.
            Err(e) => {
                return (
                    None,
                    match previous {
                        Some(topology) => Ok(Resolved::Topology {
                            answer: topology.clone(),
                            refresh_error: Some(e),
                            recheck_in: None,
                            verified_at: previous_verified_at,
                        }),
                        None => Err(e),
                    },
                );
            }
        };
        (Some(state), Ok(resolved))
    }

    fn not_described_backoff(&self, attempts: u32) -> Duration {
        crate::backoff::capped(
            self.cfg.not_described_retry,
            attempts,
            self.cfg.not_described_ttl,
        )
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

    /// Take `verified` — the answer a node's verification record holds — as if EC2 had just
    /// given it, when nothing is known about the instance yet (an answer of this process is
    /// never replaced); returns whether it was taken. It is asked again within a TTL of `now`
    /// ([`seeded_wait`]).
    pub fn seed(&self, verified: Verified, now: Instant) -> bool {
        let mut inner = self.inner();
        let instance_id = InstanceId::from(verified.topology.instance_id.as_str());
        if inner.entries.contains_key(&instance_id) {
            return false;
        }
        let refresh_at =
            now + seeded_wait(verified.at, &instance_id, self.cfg.cache_ttl, unix_now());
        let topology = inner.intern(verified.topology);
        inner.entries.insert(
            instance_id,
            Entry {
                boot_id: verified.boot_id.as_deref().map(BootId::new),
                state: State::Known {
                    topology,
                    refresh_at,
                    settling: 0,
                    refused: None,
                    verified_at: verified.at,
                },
                rejected: 0,
                taken: false,
            },
        );
        true
    }

    /// Whether the cache holds anything about `instance_id`.
    pub fn knows(&self, instance_id: &str) -> bool {
        self.inner().entries.contains_key(instance_id)
    }

    /// The answer cached for `instance_id` cannot be used (labels cannot be derived from it):
    /// forget it, and ask again after the not-described backoff. Returns that wait.
    pub fn reject(&self, instance_id: &str, now: Instant) -> Duration {
        let mut inner = self.inner();
        let Some(e) = inner.entries.get_mut(instance_id) else {
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

    /// Keep only the entries of instances some node still runs on (and the answers they
    /// hold); returns how many went. Age plays no part: an instance retried with a long
    /// backoff keeps its backoff.
    pub fn retain(&self, live: &HashSet<String>) -> usize {
        let mut inner = self.inner();
        let before = inner.entries.len();
        inner.entries.retain(|id, _| live.contains(id.as_str()));
        inner.shapes.sweep();
        before - inner.entries.len()
    }

    /// How many distinct answers (without their instance IDs) the entries hold.
    #[cfg(test)]
    pub fn shapes(&self) -> usize {
        self.inner().shapes.len()
    }

    pub fn len(&self) -> usize {
        self.inner().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.inner().entries.is_empty()
    }
}

/// Seconds since the Unix epoch, by the wall clock (what a verification record says).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Whether the instance of `topology` is in `region` (by its zone, as EC2 gave it).
fn in_region(topology: &InstanceTopology, region: &str) -> bool {
    topology
        .availability_zone
        .as_deref()
        .and_then(crate::provider_id::region_of_zone)
        .is_some_and(|r| r == region)
}

/// Only a change from one known boot to another counts: a boot ID that appears for the first
/// time (kubelet reports it shortly after registration) is the same boot we looked up.
fn rebooted(cached: Option<&BootId>, now: Option<&str>) -> bool {
    matches!((cached, now), (Some(a), Some(b)) if !a.is(b))
}
