//! Re-verification in full calls: the answers due soonest, taken together into one call
//! ([`Cache::due_soonest`]), and that call's answers taken back ([`Cache::refreshed`]); and when
//! an answer taken on trust from a node's record comes due ([`seeded_wait`], [`spread`]).

use super::*;

impl Cache {
    /// For a call about to re-verify an answer that came due in `region`: up to `room` other
    /// answers of that region, those due soonest (overdue first), to be refreshed in the same
    /// call, so a fleet is re-verified in full calls, about `ceil(N/100)` a TTL, however its
    /// nodes' re-checks are spread. Only complete answers of instances EC2 describes (not
    /// settling, not refused: those keep their own schedule). Each one taken is marked as being
    /// refreshed (due again a TTL from `now`, so no other call takes it and its node keeps
    /// reading it) until [`Cache::refreshed`] takes the call's answer. Returned with each entry
    /// as it was.
    pub fn due_soonest(
        &self,
        region: &str,
        except: &str,
        room: usize,
        now: Instant,
    ) -> Vec<(String, Entry)> {
        use std::collections::BinaryHeap;
        if room == 0 {
            return Vec::new();
        }
        let mut inner = self.inner();
        let entries = &mut inner.entries;
        // The `room` soonest: a heap whose top is the latest kept so far.
        let mut soonest: BinaryHeap<(Instant, &str)> = BinaryHeap::with_capacity(room + 1);
        for (id, e) in entries.iter() {
            let State::Known {
                topology,
                refresh_at,
                settling: 0,
                refused: None,
                ..
            } = &e.state
            else {
                continue;
            };
            if **id == *except
                || e.taken
                || soonest.len() == room && soonest.peek().is_some_and(|(at, _)| refresh_at >= at)
            {
                continue;
            }
            if !in_region(topology, region) {
                continue;
            }
            soonest.push((*refresh_at, &**id));
            if soonest.len() > room {
                soonest.pop();
            }
        }
        // Soonest first (the order they join the queue in).
        let ids: Vec<(Instant, String)> = soonest
            .into_sorted_vec()
            .into_iter()
            .map(|(at, id)| (at, id.to_string()))
            .collect();
        let mut taken = Vec::with_capacity(ids.len());
        for (_, id) in ids {
            if let Some(e) = entries.get_mut(id.as_str()) {
                let was = e.clone();
                if let State::Known { refresh_at, .. } = &mut e.state {
                    *refresh_at = now + self.cfg.cache_ttl;
                }
                e.taken = true;
                taken.push((id, was));
            }
        }
        taken
    }

    /// The answer of a call that refreshed `instance_id` ahead of its time (taken by
    /// [`Cache::due_soonest`] as `was`): recorded as any re-verification is, unless the entry
    /// changed meanwhile (a new boot asked about by its node: that answer stands). A failed call
    /// (or none: the batcher stopped) puts the entry back as it was, due when it was. Returns
    /// whether an answer was recorded.
    pub fn refreshed(
        &self,
        instance_id: &str,
        was: Entry,
        answer: Option<Answer>,
        now: Instant,
    ) -> bool {
        let mut inner = self.inner();
        let Some(current) = inner.entries.get(instance_id) else {
            return false;
        };
        // The same answer of the same boot (a boot ID that appeared meanwhile is the same boot).
        let same = !matches!((&was.boot_id, &current.boot_id), (Some(a), Some(b)) if a != b)
            && matches!((&current.state, &was.state),
                (
                    State::Known { topology: a, verified_at: at_a, .. },
                    State::Known { topology: b, verified_at: at_b, .. },
                ) if Arc::ptr_eq(a, b) && at_a == at_b);
        if !same {
            return false;
        }
        // The boot ID the node reports now, if it appeared meanwhile.
        let boot_id = current.boot_id.clone().or_else(|| was.boot_id.clone());
        let next = answer.map(|a| self.next(&mut inner, Some(&was), a, false, now));
        let Some(current) = inner.entries.get_mut(instance_id) else {
            return false;
        };
        let recorded = match next {
            Some((Some(state), _)) => {
                current.state = state;
                current.taken = false;
                true
            }
            // A failed call (or none): as it was, due when it was.
            _ => {
                *current = was;
                false
            }
        };
        current.boot_id = boot_id;
        recorded
    }
}

/// How long a new leader waits to re-verify an answer it took from a node's record, given
/// since when (`at`) EC2 has given it and the wall clock now (`wall`), both in seconds since the
/// Unix epoch. A record first given within the last TTL is due when that TTL ends: EC2 was asked
/// lately (a leader that takes over during a join wave asks nothing about the fleet its
/// predecessor just verified). An older one (re-verifications that find the same answer keep
/// `at`) is due at the instance's own moment of the TTL on the wall clock ([`spread`]): a new
/// leader re-verifies the fleet it took on trust evenly over its first TTL, as in steady state,
/// not all at once. A record from the future (another leader's clock ahead) counts as old.
pub fn seeded_wait(at: u64, instance_id: &str, ttl: Duration, wall: u64) -> Duration {
    let age = Duration::from_secs(wall.saturating_sub(at));
    if at <= wall && age < ttl {
        return ttl - age;
    }
    spread(instance_id, ttl, Duration::from_secs(wall))
}

/// How long from now (`wall`: the wall clock now, since the Unix epoch) until the instance
/// `instance_id` next comes due on its own fixed point of a cycle of `ttl` on the wall clock
/// (a hash of its ID): a fleet taken on trust spreads evenly over the TTL, and every leader
/// puts an instance at the same moments, so a run of short-lived leaders (a crash loop, a
/// rollout every few minutes) still re-verifies each instance once a TTL: whichever leads at
/// that moment asks.
pub fn spread(instance_id: &str, ttl: Duration, wall: Duration) -> Duration {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut h = DefaultHasher::new();
    instance_id.hash(&mut h);
    let cycle = ttl.as_millis().max(1);
    let phase = u128::from(h.finish()) % cycle;
    let into = wall.as_millis() % cycle;
    let wait = (phase + cycle - into) % cycle;
    Duration::from_millis(u64::try_from(wait).unwrap_or(u64::MAX))
}
