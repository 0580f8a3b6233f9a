//! The lookup against a fake EC2 (paused time): batching, caching, backoff, refused IDs,
//! throttling, recovery.

use super::*;
use super::{batcher::THROTTLED_RESENDS, limiter::LimiterConfig};
use std::sync::{
    Mutex,
    atomic::{AtomicUsize, Ordering},
};

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
    /// Every answer's availability zone (none when unset).
    zone: Arc<Mutex<Option<String>>>,
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
                availability_zone: self.zone.lock().unwrap().clone(),
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
    observed(fake, Arc::new(()))
}

/// [`lookup`], reporting to `observer`.
fn observed(fake: &Fake, observer: Arc<dyn Observer>) -> Lookup {
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
        observer,
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

/// Nodes created in a burst are all joining; the watch delivers them in clumps with stalls
/// between (a busy API server): 60 every 200 ms, every fourth gap 500 ms. Held two windows
/// at most, the joiners went out in 15 calls, 6 of them part full; held a third window while
/// the burst fills the call, 13, 3 part full (a stall that ends more than three windows after
/// the last full call still splits one). No joiner waits more than three windows.
#[tokio::test(start_paused = true)]
async fn a_burst_of_joining_nodes_arriving_in_clumps_makes_mostly_full_calls() {
    let fake = Fake::default();
    let l = lookup(&fake);
    let clump_at = |c: u64| c * 200 + (c / 4) * 300;
    let waits = std::sync::Mutex::new(Vec::new());
    let asks = (0..1200).map(|k| {
        let l = l.clone();
        let waits = &waits;
        let delay = Duration::from_millis(clump_at(k as u64 / 60));
        async move {
            tokio::time::sleep(delay).await;
            let asked = Instant::now();
            let answer = l
                .resolve_expecting("r", &id(k * 2), None, false, true)
                .await;
            waits.lock().unwrap().push(asked.elapsed());
            answer
        }
    });
    let answers = futures::future::join_all(asks).await;
    assert!(answers.iter().all(Result::is_ok), "every lookup answered");
    let sizes: Vec<usize> = fake.calls().iter().map(|(_, ids)| ids.len()).collect();
    let part_full = sizes.iter().filter(|s| **s < 100).count();
    assert!(
        sizes.len() <= 13 && part_full <= 3,
        "{} calls, {part_full} part full, for 1,200 joining nodes (ceil(N/100) = 12): {sizes:?}",
        sizes.len()
    );
    let longest = waits.into_inner().unwrap().into_iter().max();
    assert!(
        longest.is_some_and(|w| w <= Duration::from_millis(650 + 10)),
        "no joiner waits more than three windows (600 ms) and the call (50 ms): {longest:?}"
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

/// One arrival every 150 ms for 3 s (never a 200 ms quiet gap), `urgent` or not: how long each
/// waited for its answer.
async fn trickle(l: &Lookup, urgent: bool) -> Vec<Duration> {
    let asks = (0..20).map(|n| {
        let l = l.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(150 * n as u64)).await;
            let asked = Instant::now();
            l.resolve_expecting("r", &id(n * 2), None, false, urgent)
                .await
                .map(|_| asked.elapsed())
        }
    });
    futures::future::join_all(asks)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_steady_trickle_waits_at_most_the_max_wait() {
    let fake = Fake::default();
    let waits = trickle(&lookup(&fake), false).await;
    assert!(
        waits.iter().all(|w| *w <= Duration::from_millis(2050 + 10)),
        "{waits:?}"
    );
    assert_eq!(fake.calls().len(), 2, "two calls for 20 instances over 3 s");
}

/// A node held back by its startup taint is idle capacity: in a trickle that never leaves a
/// quiet window, its call goes out two windows after it asked, not at the max wait.
#[tokio::test(start_paused = true)]
async fn a_held_node_is_not_kept_waiting_for_a_fuller_call() {
    let fake = Fake::default();
    let waits = trickle(&lookup(&fake), true).await;
    // Two windows (400 ms) and the call's 50 ms.
    assert!(
        waits.iter().all(|w| *w <= Duration::from_millis(450 + 10)),
        "{waits:?}"
    );
    let calls = fake.calls().len();
    assert!(
        (6..=10).contains(&calls),
        "{calls} calls for 20 held instances over 3 s: a few per call, not one each"
    );
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
        Arc::new(()),
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
        Resolved::Topology {
            answer: topology, ..
        } => {
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
            answer: topology,
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
        answer: topology,
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
        answer: topology,
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
        Resolved::Topology {
            answer: topology, ..
        } => assert_eq!(
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
        .resolve_expecting("r", &id(2), Some("b"), true, false)
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
        matches!(a, Ok(Resolved::Topology { .. })) && matches!(b, Ok(Resolved::Topology { .. }))
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
        let Resolved::NotDescribed { retry_in, .. } = l.resolve("r", &id(1), None).await.unwrap()
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

/// Issue 26.1: one Node whose instance EC2 refuses (terminated, another account or region), in a
/// quiet cluster: asked once, answered as refused, and then not asked again within its backoff.
/// A refused ID is EC2 answering, not EC2 failing: no probe resends it every few seconds, and
/// no "EC2 answers again" follows.
#[tokio::test(start_paused = true)]
async fn a_lone_refused_id_is_not_resent_as_a_probe() {
    let fake = Fake::default();
    let l = lookup(&fake);
    let rx = l.recoveries();
    let bad = id(2 * 41);
    fake.poison.lock().unwrap().push(bad.clone());
    assert!(matches!(
        l.resolve("r", &bad, Some("b")).await,
        Ok(Resolved::Rejected { .. })
    ));
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(
        fake.calls().len(),
        1,
        "a refused ID asked once in a quiet minute, not probed: {:?}",
        fake.calls()
    );
    // Another instance is then looked up as usual, and nothing counts as a recovery.
    assert!(matches!(
        l.resolve("r", &id(4), None).await,
        Ok(Resolved::Topology { .. })
    ));
    assert!(!rx.has_changed().unwrap(), "no recovery after an answer");
}

/// An outage whose last failed call was for one instance EC2 then refuses (terminated meanwhile):
/// the probe's refusal is EC2 answering, so the end of the outage is noticed from it.
#[tokio::test(start_paused = true)]
async fn a_refusal_ends_an_outage() {
    let fake = Fake::default();
    let l = lookup(&fake);
    let rx = l.recoveries();
    let gone = id(2 * 43);
    *fake.fail_with.lock().unwrap() = Some(Ec2Error::Transport("connection refused".into()));
    fake.fail_next.store(1, Ordering::SeqCst);
    assert!(l.resolve("r", &gone, None).await.is_err());
    // EC2 is back, and the instance was terminated meanwhile.
    fake.poison.lock().unwrap().push(gone.clone());
    let back = Instant::now();
    while !rx.has_changed().unwrap() {
        assert!(
            back.elapsed() < Duration::from_secs(10),
            "the end of the outage was not noticed: {:?}",
            fake.calls()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Issue 26.6: at their retry, refused IDs are asked about in a call of their own (together:
/// the retries share a grid): the call of the other instances due at the same moment does not
/// carry them, so does not fail for them (and is not split to find them).
#[tokio::test(start_paused = true)]
async fn a_refused_id_is_asked_alone_at_its_retry() {
    let fake = Fake::default();
    let l = lookup(&fake);
    let (bad, bad2) = (id(2 * 45), id(2 * 46));
    fake.poison
        .lock()
        .unwrap()
        .extend([bad.clone(), bad2.clone()]);
    fake.name_poison.store(true, Ordering::SeqCst);
    let (first, second) = tokio::join!(l.resolve("r", &bad, None), l.resolve("r", &bad2, None));
    let Ok(Resolved::Rejected { retry_in, .. }) = first else {
        panic!("the ID is refused: {first:?}");
    };
    assert!(
        matches!(second, Ok(Resolved::Rejected { .. })),
        "{second:?}"
    );
    tokio::time::sleep(retry_in + Duration::from_millis(10)).await;
    let before = fake.calls().len();
    let others: Vec<String> = (1..=5).map(|k| id(2 * k)).collect();
    let (again, again2, answers) = tokio::join!(
        l.resolve("r", &bad, None),
        l.resolve("r", &bad2, None),
        futures::future::join_all(others.iter().map(|i| l.resolve("r", i, None)))
    );
    assert!(matches!(again, Ok(Resolved::Rejected { .. })), "{again:?}");
    assert!(
        matches!(again2, Ok(Resolved::Rejected { .. })),
        "{again2:?}"
    );
    assert!(
        answers
            .iter()
            .all(|a| matches!(a, Ok(Resolved::Topology { .. }))),
        "{answers:?}"
    );
    let calls = fake.calls()[before..].to_vec();
    assert!(
        calls.iter().all(|(_, ids)| {
            let refused = ids.iter().filter(|i| **i == bad || **i == bad2).count();
            refused == 0 || refused == ids.len()
        }),
        "a refused ID rode in another call: {calls:?}"
    );
    assert_eq!(
        calls.len(),
        2,
        "one call for the refused IDs together, one for the others: {calls:?}"
    );
}

/// Issue 26.6: an instance EC2 described and later refuses (terminated since, or EC2 lagging)
/// keeps its answer — the labels stand — and is then asked about with the refused IDs, on their
/// backoff: not in the next ordinary call, which it would fail, and not at every reconcile.
#[tokio::test(start_paused = true)]
async fn an_id_described_then_refused_keeps_its_answer_and_is_asked_alone() {
    let fake = Fake::default();
    let l = lookup(&fake);
    let gone = id(2 * 47);
    assert!(matches!(
        l.resolve("r", &gone, Some("b")).await,
        Ok(Resolved::Topology { .. })
    ));
    tokio::time::advance(LookupConfig::default().cache_ttl + Duration::from_secs(1)).await;
    fake.poison.lock().unwrap().push(gone.clone());
    fake.name_poison.store(true, Ordering::SeqCst);
    let refreshed = l.resolve("r", &gone, Some("b")).await;
    assert!(
        matches!(&refreshed, Ok(Resolved::Topology { refresh_error: Some(e), answer: topology, .. })
            if e.is_instance_id_error() && topology.network_nodes.len() == 3),
        "the earlier answer stands: {refreshed:?}"
    );
    let asked = fake.calls().len();
    // Reconciled again at once (an event on the node): the cache answers; EC2 is not asked.
    assert!(matches!(
        l.resolve("r", &gone, Some("b")).await,
        Ok(Resolved::Topology { .. })
    ));
    assert_eq!(fake.calls().len(), asked, "asked again within its backoff");
    let view = l.inspect(&gone).expect("an entry");
    assert_eq!(view.state, "refused");
    assert!(view.topology.is_some(), "{view:?}");
    // At its retry it does not ride in the call of the other instances due then.
    tokio::time::advance(Duration::from_secs(view.ask_again_in_s + 1)).await;
    let others: Vec<String> = (1..=3).map(|k| id(2 * k)).collect();
    let (again, answers) = tokio::join!(
        l.resolve("r", &gone, Some("b")),
        futures::future::join_all(others.iter().map(|i| l.resolve("r", i, None)))
    );
    assert!(matches!(again, Ok(Resolved::Topology { .. })), "{again:?}");
    assert!(
        answers
            .iter()
            .all(|a| matches!(a, Ok(Resolved::Topology { .. }))),
        "{answers:?}"
    );
    let calls = fake.calls()[asked..].to_vec();
    assert!(
        calls
            .iter()
            .all(|(_, ids)| !ids.contains(&gone) || ids.len() == 1),
        "the refused ID rode in another call: {calls:?}"
    );
    assert_eq!(calls.len(), 2, "{calls:?}");
}

#[tokio::test(start_paused = true)]
async fn an_ask_is_queued_before_its_answer_is_awaited() {
    // The walk at start hands a call's worth of IDs over in one go and awaits their answers
    // later: each must reach the batcher when asked, or a pause between their first polls
    // splits them over calls.
    let fake = Fake::default();
    let l = lookup(&fake);
    let asked: Vec<Asked> = (0..MAX_IDS_PER_CALL)
        .map(|k| l.ask("r", &id(k * 2), None, false, false))
        .collect();
    // Nothing awaits the answers for a while: the call goes out all the same, full.
    tokio::time::sleep(LookupConfig::default().batch_max_wait * 2).await;
    let calls = fake.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].1.len(), MAX_IDS_PER_CALL);
    for a in asked {
        assert!(matches!(a.answer().await, Ok(Resolved::Topology { .. })));
    }
    assert_eq!(fake.calls().len(), 1, "the answers came from that call");
    // Asked again: answered from the cache, no call.
    assert!(matches!(
        l.ask("r", &id(0), None, false, false).answer().await,
        Ok(Resolved::Topology { .. })
    ));
    assert_eq!(fake.calls().len(), 1);
}

/// A lookup at EC2's default pace (5 calls a second) with its burst spent after one call.
fn paced_lookup(fake: &Fake) -> Lookup {
    *fake.layer.lock().unwrap() = "nn-leaf-1".into();
    *fake.instance_type.lock().unwrap() = "p5.48xlarge".into();
    Lookup::spawn(
        fake.clone(),
        Arc::new(Limiter::new(LimiterConfig {
            burst: 1.0,
            ..LimiterConfig::default()
        })),
        LookupConfig::default(),
        Arc::new(()),
    )
}

/// A joining node's lookup never waits behind a walk, a resync or an install: with ten calls'
/// worth queued at EC2's default pace (5 calls a second, burst spent), the joiner's ID rides
/// in the next call that goes out, whatever was queued before it.
#[tokio::test(start_paused = true)]
async fn a_joining_node_goes_ahead_of_what_is_queued() {
    let fake = Fake::default();
    let l = paced_lookup(&fake);
    // The walk's thousand, then the fleet's resyncs: all queued at once.
    let queued: Vec<Asked> = (0..2_000)
        .map(|k| l.ask("r", &id(k * 2), None, false, false))
        .collect();
    // Let the first call go (it takes the only token).
    tokio::time::sleep(Duration::from_millis(10)).await;
    let joiner = id(100_000);
    let asked = Instant::now();
    let answer = l
        .ask("r", &joiner, None, false, true)
        .answer()
        .await
        .expect("answered");
    let waited = asked.elapsed();
    assert!(matches!(answer, Resolved::Topology { .. }));
    let calls = fake.calls();
    let rode_in = calls
        .iter()
        .position(|(_, ids)| ids.contains(&joiner))
        .expect("the joiner was asked");
    assert_eq!(rode_in, 1, "in the call after the one on its way");
    assert_eq!(
        calls[rode_in].1.len(),
        MAX_IDS_PER_CALL,
        "a full call all the same"
    );
    // One token's wait (200 ms at 5 a second) and the call's 50 ms: well inside two windows.
    assert!(waited <= Duration::from_millis(260), "waited {waited:?}");
    drop(queued);
}

/// A walk fast enough to fill calls does not hold a joiner a third window: that is for bursts
/// of joiners alone. 150 walked at once (one full call, 50 left), a joiner 10 ms later, the
/// walk's next 40 a few at a time: the joiner's call leaves two windows after it asked.
#[tokio::test(start_paused = true)]
async fn a_joiner_behind_a_fast_walk_waits_two_windows_not_three() {
    let fake = Fake::default();
    let l = lookup(&fake);
    let mut walked: Vec<Asked> = (0..150)
        .map(|k| l.ask("r", &id(k * 2), None, false, false))
        .collect();
    tokio::time::sleep(Duration::from_millis(10)).await;
    let asked = Instant::now();
    let joiner = async {
        l.ask("r", &id(100_000), None, false, true)
            .answer()
            .await
            .expect("answered");
        asked.elapsed()
    };
    let walk_on = async {
        for k in 0..40 {
            tokio::time::sleep(Duration::from_millis(15)).await;
            walked.push(l.ask("r", &id(1_000 + k * 2), None, false, false));
        }
    };
    let (waited, ()) = futures::join!(joiner, walk_on);
    assert!(
        waited <= Duration::from_millis(450 + 10),
        "two windows (400 ms) and the call (50 ms): waited {waited:?}"
    );
    drop(walked);
}

/// The walk at start asks about every node, a joining one included, before that node's own
/// reconcile does: the reconcile's urgent ask moves the queued ID ahead.
#[tokio::test(start_paused = true)]
async fn a_joiner_the_walk_queued_is_moved_ahead_when_its_reconcile_asks() {
    let fake = Fake::default();
    let l = paced_lookup(&fake);
    let joiner = id(2 * 1_500);
    let walk: Vec<Asked> = (0..2_000)
        .map(|k| l.ask("r", &id(k * 2), None, false, false))
        .collect();
    tokio::time::sleep(Duration::from_millis(10)).await;
    l.ask("r", &joiner, None, false, true)
        .answer()
        .await
        .expect("answered");
    let calls = fake.calls();
    let rode_in = calls.iter().position(|(_, ids)| ids.contains(&joiner));
    assert_eq!(
        rode_in,
        Some(1),
        "not the 16th call, where the walk had put it"
    );
    assert_eq!(
        calls
            .iter()
            .filter(|(_, ids)| ids.contains(&joiner))
            .count(),
        1,
        "asked once"
    );
    drop(walk);
}

// ---------------------------------------------------------------------------------------------
// Re-verification: nothing written when nothing changed, and in full calls.

/// A lookup with a short TTL (as the e2e runs it) and the usual batching, for answers in
/// us-west-2.
fn short_ttl_lookup(fake: &Fake, ttl: Duration) -> Lookup {
    *fake.layer.lock().unwrap() = "nn-leaf-1".into();
    *fake.instance_type.lock().unwrap() = "p5.48xlarge".into();
    *fake.zone.lock().unwrap() = Some("us-west-2a".into());
    Lookup::spawn(
        fake.clone(),
        Arc::new(Limiter::new(LimiterConfig {
            rate: 1000.0,
            burst: 1000.0,
            ..LimiterConfig::default()
        })),
        LookupConfig {
            cache_ttl: ttl,
            ..LookupConfig::default()
        },
        Arc::new(()),
    )
}

/// A complete answer about `instance_id` in us-west-2a, under the leaf switch `leaf`.
fn answer_in_us_west_2(instance_id: &str, leaf: &str) -> InstanceTopology {
    InstanceTopology {
        instance_id: instance_id.to_string(),
        instance_type: Some("p5.48xlarge".into()),
        zone_id: Some("usw2-az1".into()),
        availability_zone: Some("us-west-2a".into()),
        network_nodes: vec!["nn-top".into(), "nn-mid".into(), leaf.into()],
        ..InstanceTopology::default()
    }
}

/// The cache alone, answers kept for `ttl`.
fn short_ttl_cache(ttl: Duration) -> cache::Cache {
    cache::Cache::new(
        LookupConfig {
            cache_ttl: ttl,
            ..LookupConfig::default()
        },
        Instant::now(),
    )
}

fn verified_at(r: &Resolved) -> u64 {
    match r {
        Resolved::Topology { verified_at, .. } => *verified_at,
        other => panic!("{other:?}"),
    }
}

/// The record says since when EC2 has given the answer: a re-verification that finds the same
/// answer keeps that time (the node's record, and the node, stay as they are), and one that
/// finds another answer takes the time of the new one.
#[tokio::test(start_paused = true)]
async fn a_re_verification_that_finds_the_same_answer_keeps_the_records_time() {
    let fake = Fake::default();
    let ttl = Duration::from_secs(60);
    let l = short_ttl_lookup(&fake, ttl);
    let answer = |layer: &str| answer_in_us_west_2(&id(2), layer);
    // Taken from a record written long ago, as a new leader does.
    let since = 1_700_000_000;
    assert!(l.adopt(crate::verified::Verified {
        topology: answer("nn-leaf-1"),
        boot_id: Some("b".into()),
        at: since,
    }));
    for ttls in 1..=3 {
        tokio::time::advance(ttl + Duration::from_secs(1)).await;
        let r = l.resolve("us-west-2", &id(2), Some("b")).await.unwrap();
        assert_eq!(
            verified_at(&r),
            since,
            "re-verified {ttls} times, unchanged"
        );
    }
    assert_eq!(fake.calls().len(), 3, "EC2 was asked at each TTL");
    // The switch changed: the record takes the new answer's time.
    *fake.layer.lock().unwrap() = "nn-leaf-2".into();
    tokio::time::advance(ttl + Duration::from_secs(1)).await;
    let r = l.resolve("us-west-2", &id(2), Some("b")).await.unwrap();
    assert_ne!(verified_at(&r), since);
    assert!(cache::unix_now().abs_diff(verified_at(&r)) <= 5);
}

/// Re-check `n` instances for `periods` resync periods (`resync` apart), each at its own slot
/// of the period (instance k at k/n of it), as the resync walk does; returns the sizes of the
/// calls EC2 saw meanwhile.
async fn resyncs(fake: &Fake, l: &Lookup, n: usize, resync: Duration, periods: u32) -> Vec<usize> {
    let before = fake.calls().len();
    let start = tokio::time::Instant::now();
    let checks = (0..n).map(|k| {
        let l = l.clone();
        async move {
            for p in 0..periods {
                let at = start + resync * p + resync.mul_f64(k as f64 / n as f64);
                tokio::time::sleep_until(at).await;
                assert!(l.resolve("us-west-2", &id(k * 2), Some("b")).await.is_ok());
            }
        }
    });
    futures::future::join_all(checks).await;
    fake.calls()[before..]
        .iter()
        .map(|(_, ids)| ids.len())
        .collect()
}

/// 380 instances whose answers came in at scattered moments (joined over a minute, a few at a
/// time), re-checked every 30 s with a 60 s TTL: each answer that comes due takes along those
/// due soonest after it, so three TTLs cost at most ceil(380/100) + 1 calls each, not a call
/// for every few that come due together.
#[tokio::test(start_paused = true)]
async fn answers_that_came_in_at_scattered_moments_are_re_verified_in_full_calls() {
    let fake = Fake::default();
    let ttl = Duration::from_secs(60);
    let l = short_ttl_lookup(&fake, ttl);
    let n = 380;
    // Joined one every 150 ms: answered in many small calls, due at as many moments.
    let joined = arrivals_in(&fake, &l, n, |k| 150 * k as u64).await;
    assert!(joined.len() > 10, "{joined:?}");
    let calls = resyncs(&fake, &l, n, Duration::from_secs(30), 6).await;
    let per_ttl = n.div_ceil(100) + 1;
    eprintln!(
        "re-verification over 3 TTLs: {} calls {calls:?}",
        calls.len()
    );
    assert!(
        calls.len() <= 3 * per_ttl,
        "{} calls over three TTLs ({calls:?}); at most {per_ttl} a TTL",
        calls.len()
    );
    // And EC2 was asked about every instance meanwhile.
    assert!(calls.iter().sum::<usize>() >= 2 * n, "{calls:?}");
}

/// [`arrivals`] in us-west-2, with the boot ID the resync checks use.
async fn arrivals_in(fake: &Fake, l: &Lookup, n: usize, at: impl Fn(usize) -> u64) -> Vec<usize> {
    let asks = (0..n).map(|k| {
        let l = l.clone();
        let delay = Duration::from_millis(at(k));
        async move {
            tokio::time::sleep(delay).await;
            l.resolve("us-west-2", &id(k * 2), Some("b")).await
        }
    });
    let answers = futures::future::join_all(asks).await;
    assert!(answers.iter().all(Result::is_ok), "every lookup answered");
    fake.calls().iter().map(|(_, ids)| ids.len()).collect()
}

/// A new leader takes 380 answers from the nodes' records at once: it asks EC2 nothing then,
/// and re-verifies them spread over its first TTL, in full calls, as in steady state.
#[tokio::test(start_paused = true)]
async fn a_new_leaders_trusted_answers_are_re_verified_over_its_first_ttl_in_full_calls() {
    let fake = Fake::default();
    let ttl = Duration::from_secs(60);
    let l = short_ttl_lookup(&fake, ttl);
    let n = 380;
    for k in 0..n {
        assert!(l.adopt(crate::verified::Verified {
            topology: answer_in_us_west_2(&id(k * 2), "nn-leaf-1"),
            boot_id: Some("b".into()),
            at: 1_700_000_000,
        }));
    }
    // Checked every 30 s: every answer re-verified within the first TTL and one resync.
    let first = resyncs(&fake, &l, n, Duration::from_secs(30), 3).await;
    let asked: HashSet<String> = fake.calls().into_iter().flat_map(|(_, ids)| ids).collect();
    assert_eq!(asked.len(), n, "every trusted answer re-verified");
    let per_ttl = n.div_ceil(100) + 1;
    eprintln!("first TTL and a resync: {first:?}");
    assert!(first.len() <= 2 * per_ttl, "{first:?}");
    let after = resyncs(&fake, &l, n, Duration::from_secs(30), 4).await;
    eprintln!("two TTLs after: {after:?}");
    assert!(after.len() <= 2 * per_ttl, "{after:?}");
}

/// An answer taken along whose call fails keeps its answer and is due when it was: its own
/// node's next check asks EC2 again.
#[tokio::test(start_paused = true)]
async fn an_answer_taken_along_in_a_failed_call_is_due_as_before() {
    let fake = Fake::default();
    let ttl = Duration::from_secs(60);
    let l = short_ttl_lookup(&fake, ttl);
    l.resolve("us-west-2", &id(2), Some("b")).await.unwrap();
    tokio::time::advance(Duration::from_secs(10)).await;
    l.resolve("us-west-2", &id(4), Some("b")).await.unwrap();
    // id(2) comes due first, takes id(4) along, and the call fails.
    tokio::time::advance(ttl - Duration::from_secs(5)).await;
    *fake.fail_with.lock().unwrap() = Some(internal_error());
    fake.fail_next.store(1, Ordering::SeqCst);
    let r = l.resolve("us-west-2", &id(2), Some("b")).await.unwrap();
    assert!(matches!(
        r,
        Resolved::Topology {
            refresh_error: Some(_),
            ..
        }
    ));
    let calls = fake.calls();
    assert_eq!(calls.last().map(|(_, ids)| ids.len()), Some(2), "{calls:?}");
    // Let the taken-along answer be handed back.
    tokio::task::yield_now().await;
    tokio::time::advance(Duration::from_secs(10)).await;
    // id(4) is due now (60 s after its answer), as before the failed call.
    let before = fake.calls().len();
    l.resolve("us-west-2", &id(4), Some("b")).await.unwrap();
    assert_eq!(
        fake.calls().len(),
        before + 1,
        "asked again at its own check"
    );
}

/// Every leader puts an instance at the same moment of a TTL-long cycle on the wall clock: ten
/// leaders that each live a tenth of the TTL, one after another, between them re-verify every
/// instance exactly once (a run of short-lived leaders does not leave any answer unverified).
#[test]
fn successive_short_lived_leaders_re_verify_every_instance_once_a_ttl() {
    let ttl = Duration::from_secs(6 * 3600);
    let start = Duration::from_secs(1_796_300_000);
    let ids: Vec<String> = (0..1_000).map(id).collect();
    let mut due_in = vec![0u32; ids.len()];
    for k in 0..10u32 {
        let born = start + ttl / 10 * k;
        for (i, id) in ids.iter().enumerate() {
            let wait = cache::spread(id, ttl, born);
            assert!(wait < ttl, "{wait:?}");
            if wait < ttl / 10 {
                due_in[i] += 1;
            }
        }
    }
    assert!(due_in.iter().all(|n| *n == 1), "{due_in:?}");
    // And any one of them finds about a tenth of the fleet due in its life.
    let first = ids
        .iter()
        .filter(|id| cache::spread(id, ttl, start) < ttl / 10)
        .count();
    assert!((60..=140).contains(&first), "{first}");
}

/// What one call took along is not taken again by another (two answers of a small fleet come
/// due at once, on two threads): each ID rides one call, and when that call fails every answer
/// it took is due as before, not a TTL later.
#[test]
fn what_one_call_took_along_is_not_taken_again() {
    let ttl = Duration::from_secs(60);
    let cache = short_ttl_cache(ttl);
    let t0 = Instant::now();
    for k in 0..50 {
        let answer = answer_in_us_west_2(&id(k), "nn-leaf-1");
        cache
            .record(&id(k), Some("b"), None, Ok(Some(answer)), false, t0)
            .unwrap();
    }
    let due = t0 + ttl + Duration::from_secs(1);
    let first = cache.due_soonest("us-west-2", &id(0), 99, due);
    assert_eq!(first.len(), 49, "the rest of the fleet");
    // The second takes none of those (only the first's own, which its node asks about: the
    // batcher sends an ID asked twice at once once).
    let second: Vec<String> = cache
        .due_soonest("us-west-2", &id(1), 99, due)
        .into_iter()
        .map(|(i, _)| i)
        .collect();
    assert_eq!(second, [id(0)], "taken again");
    // Another region's are never taken.
    assert!(cache.due_soonest("eu-west-1", &id(0), 99, due).is_empty());
    // The call failed: each is put back as it was, due, and can be taken again.
    for (i, was) in first {
        assert!(!cache.refreshed(&i, was, Some(Err(internal_error())), due));
    }
    assert_eq!(cache.due_soonest("us-west-2", &id(0), 99, due).len(), 49);
}

/// A node's boot ID that appears while its answer rides another's call (the kubelet reports it
/// shortly after registration) is the same boot: the call's answer is taken, not dropped.
#[test]
fn a_boot_id_that_appears_while_taken_along_keeps_the_answer() {
    let ttl = Duration::from_secs(60);
    let cache = short_ttl_cache(ttl);
    let t0 = Instant::now();
    let answer = answer_in_us_west_2(&id(1), "nn-leaf-1");
    cache
        .record(&id(1), None, None, Ok(Some(answer.clone())), false, t0)
        .unwrap();
    let due = t0 + ttl + Duration::from_secs(1);
    let mut taken = cache.due_soonest("us-west-2", &id(0), 99, due);
    let (i, was) = taken.pop().expect("taken along");
    // Its node is looked at meanwhile, now with a boot ID: a cache hit.
    assert!(matches!(
        cache.check(&id(1), Some("b"), false, due),
        cache::Check::Answered(_)
    ));
    assert!(cache.refreshed(&i, was, Some(Ok(Some(answer))), due));
    // Fresh for a TTL from the call, in the boot it now knows.
    assert!(matches!(
        cache.check(&id(1), Some("b"), false, due + ttl - Duration::from_secs(1)),
        cache::Check::Answered(_)
    ));
}

/// A record EC2 gave within the last TTL is re-verified when that TTL ends, not earlier (a
/// leader that takes over during a join wave asks nothing about the fleet its predecessor just
/// verified); an older one, or one from a clock ahead of ours, falls at the instance's own
/// moment of the wall-clock cycle.
#[test]
fn a_record_given_within_the_last_ttl_is_due_when_that_ttl_ends() {
    let ttl = Duration::from_secs(6 * 3600);
    let wall = 1_796_300_000u64;
    for k in 0..200 {
        let i = id(k);
        assert_eq!(
            cache::seeded_wait(wall - 60, &i, ttl, wall),
            ttl - Duration::from_secs(60)
        );
        assert_eq!(cache::seeded_wait(wall, &i, ttl, wall), ttl);
        let cycle = cache::spread(&i, ttl, Duration::from_secs(wall));
        assert_eq!(
            cache::seeded_wait(wall - ttl.as_secs(), &i, ttl, wall),
            cycle
        );
        assert_eq!(cache::seeded_wait(1_700_000_000, &i, ttl, wall), cycle);
        assert_eq!(cache::seeded_wait(wall + 60, &i, ttl, wall), cycle);
    }
    // Old records spread: some of 200 fall within the first hour (the fresh ones never do).
    let soon = (0..200)
        .filter(|k| cache::seeded_wait(1_700_000_000, &id(*k), ttl, wall) < ttl / 6)
        .count();
    assert!((10..=60).contains(&soon), "{soon}");
}

/// Instances that EC2 places alike (one type, one zone, one switch) share one kept answer;
/// each still reads its own instance ID back, from an answer EC2 gave or a record taken; and
/// an answer no instance holds any more goes with housekeeping.
#[test]
fn answers_alike_but_for_the_instance_are_kept_once() {
    let cache = short_ttl_cache(Duration::from_secs(600));
    let t0 = Instant::now();
    for k in 0..30 {
        let leaf = if k < 20 { "nn-leaf-1" } else { "nn-leaf-2" };
        let answer = answer_in_us_west_2(&id(k), leaf);
        cache
            .record(&id(k), Some("b"), None, Ok(Some(answer)), false, t0)
            .unwrap();
    }
    assert!(cache.seed(
        crate::verified::Verified {
            topology: answer_in_us_west_2(&id(30), "nn-leaf-2"),
            boot_id: Some("b".into()),
            at: 1_700_000_000,
        },
        t0,
    ));
    assert_eq!(cache.len(), 31);
    assert_eq!(cache.shapes(), 2, "two switches, two answers kept");
    for k in [0, 19, 20, 30] {
        let cache::Check::Answered(Resolved::Topology {
            answer: topology, ..
        }) = cache.check(&id(k), Some("b"), false, t0)
        else {
            panic!("{k} is known");
        };
        let leaf = if k < 20 { "nn-leaf-1" } else { "nn-leaf-2" };
        // The answer without its instance ID (the one asked about).
        assert_eq!(
            *topology,
            InstanceTopology {
                instance_id: String::new(),
                ..answer_in_us_west_2(&id(k), leaf)
            }
        );
        let view = cache.inspect(&id(k), t0).unwrap();
        assert_eq!(view.topology.unwrap().instance_id, id(k));
    }
    // The instances under the second switch are gone: so is its answer.
    let live: HashSet<String> = (0..20).map(id).collect();
    assert_eq!(cache.retain(&live), 11);
    assert_eq!(cache.shapes(), 1);
}

/// Issue 55.5: `--previous-record-key-file` adds the keys of earlier rotations (one per line,
/// blank lines and CRLF tolerated); a file that does not exist holds none; a line too short to
/// be a key is an error naming the file and line, never the text.
#[test]
fn previous_record_keys_are_read_one_per_line() {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        lookup: LookupArgs,
    }
    let dir = std::env::temp_dir().join(format!("ec2tl-keys-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let key = dir.join("key");
    let previous = dir.join("previous");
    std::fs::write(&key, "k".repeat(40) + "\n").expect("key");
    let args = |prev: &std::path::Path| {
        Cli::parse_from([
            "x",
            "--record-key-file",
            key.to_str().unwrap_or_default(),
            "--previous-record-key-file",
            prev.to_str().unwrap_or_default(),
        ])
        .lookup
    };
    let none = args(&dir.join("absent"))
        .record_key()
        .expect("no file, no keys");
    assert!(!none.expect("a key").has_previous());
    std::fs::write(
        &previous,
        format!("{}\r\n\n{}\n", "a".repeat(40), "b".repeat(32)),
    )
    .expect("previous");
    let k = args(&previous).record_key().expect("keys").expect("a key");
    assert_eq!(k.previous_ids().len(), 2);
    std::fs::write(&previous, format!("{}\nshort-secret\n", "a".repeat(40))).expect("previous");
    let err = args(&previous).record_key().expect_err("a short key");
    assert!(
        err.contains("line 2") && !err.contains("short-secret"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 55.4: a region that does not exist (a hostile providerID's zone) fails every call.
/// That is its own failure: the real region's answers between its failures are no recovery,
/// so no fleet-wide re-check is signalled, however often both are asked.
#[tokio::test(start_paused = true)]
async fn a_region_that_never_answers_is_its_own_failure() {
    let fake = Fake::default();
    let l = lookup(&fake);
    let rx = l.recoveries();
    *fake.fail_with.lock().unwrap() = Some(Ec2Error::Transport(
        "dns error: failed to lookup address information".into(),
    ));
    for k in 0..5 {
        // The fake region's call fails (the fake fails the next call, whichever it is).
        fake.fail_next.store(1, Ordering::SeqCst);
        assert!(
            l.resolve("zz-north-1", &id(1000 + 2 * k), None)
                .await
                .is_err()
        );
        l.resolve("us-west-2", &id(2 * k), None)
            .await
            .expect("the real region answers");
    }
    assert!(
        !rx.has_changed().unwrap(),
        "a success in us-west-2 is no recovery of zz-north-1: no fleet-wide re-check"
    );
    // The real region failing and answering again is a recovery, signalled once.
    fake.fail_next.store(1, Ordering::SeqCst);
    assert!(l.resolve("us-west-2", &id(20), None).await.is_err());
    l.resolve("us-west-2", &id(22), None).await.unwrap();
    assert!(rx.has_changed().unwrap(), "us-west-2 recovered");
}

/// What the lookup reported, in order.
#[derive(Default)]
struct Recorder(Mutex<Vec<String>>);

impl Observer for Recorder {
    fn ec2_call(&self, region: &str, ids: usize, _: Duration, error: Option<&Ec2Error>) {
        let outcome = error.map_or("ok", Ec2Error::category);
        self.0
            .lock()
            .unwrap()
            .push(format!("call {region} {ids} {outcome}"));
    }
    fn cache_hit(&self) {
        self.0.lock().unwrap().push("hit".into());
    }
    fn cache_miss(&self) {
        self.0.lock().unwrap().push("miss".into());
    }
    fn reverified_early(&self, n: usize) {
        self.0.lock().unwrap().push(format!("early {n}"));
    }
}

#[tokio::test(start_paused = true)]
async fn the_observer_hears_each_miss_call_and_hit() {
    let fake = Fake::default();
    let recorder = Arc::new(Recorder::default());
    let l = observed(&fake, recorder.clone());
    assert!(l.resolve("r", &id(2), None).await.is_ok());
    assert!(l.resolve("r", &id(2), None).await.is_ok());
    fake.fail_next.store(1, Ordering::SeqCst);
    *fake.fail_with.lock().unwrap() = Some(internal_error());
    assert!(l.resolve("r", &id(4), None).await.is_err());
    let heard = recorder.0.lock().unwrap().clone();
    assert_eq!(
        heard,
        ["miss", "call r 1 ok", "hit", "miss", "call r 1 service"],
        "one miss and one call per instance first asked, one hit per answer from the cache"
    );
}
