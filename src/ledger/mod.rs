//! The verification ledger: what each node's labels were last verified against (its
//! [`Verified`] record), kept with the controller rather than on the Node.
//!
//! A record on the Node cost a write to every Node whose labels were already right (an install
//! into a fleet EKS labelled, a reboot with an unchanged answer, a key rotation), each one
//! delivered to every node watcher in the cluster, and ~350 bytes on every Node that every node
//! list and watch paid for. The ledger keeps the records in [`SHARDS`] ConfigMaps in the
//! controller's namespace (`<lease name>-records-00` … `-63`, a node's shard by a stable hash
//! of its name), each sealed whole with the record key (see [`RecordKey::seal_text`]):
//!
//! - **written by the leader only**, through the fenced client (no write lands after the lease
//!   is lost), and **in batches**: a shard with news is written whole, by server-side apply,
//!   once no news came for [`QUIET`], or once its oldest news is [`FLUSH_EVERY`] old while news
//!   keeps coming (an install), and never sooner after its last write than its size allows at
//!   [`WRITE_PACE`]; once more at shutdown. A record not yet written when the leader
//!   dies costs its node one re-verification by the next leader, never false trust.
//! - **read whole** when a replica starts leading, before its first reconcile looks at a
//!   record ([`Ledger::ready`]). A shard whose seal does not open (edited, forged, sealed with a
//!   key no longer held) is not trusted: its nodes are asked about.
//! - **trusted as the Node's annotation was**: a record vouches for a node only about the
//!   instance and boot it runs now, of a complete answer, and while the node's labels are what
//!   that answer makes of them (see `reconcile::assess::trusted`). A record that is stale
//!   (another leader's newer answer, a shard written before a failover) can only fail those
//!   checks and cost a re-verification.
//!
//! Sized for 100,000 nodes: a record is a line of ~130 bytes (name, instance ID, boot ID, time,
//! the index of its answer) and an answer is kept once per shard however many nodes share it;
//! ~1,600 nodes a shard is ~300 kB, under the API server's 1 MiB an object. A shard that would
//! pass [`MAX_SHARD_BYTES`] is not written (said in the log): its nodes are re-verified by the
//! next leader.
//!
//! Owns: the records, their shards' format and when a shard is written. Never decides what to
//! trust (the reconciler does, with the node).

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::{
    compact::{BootId, InstanceId},
    intern::Interner,
    topology::InstanceTopology,
    verified::{RecordError, RecordKey, Verified},
};

pub mod keep;

/// How many shards the records are kept in: a key rotation rewrites at most this many objects.
pub const SHARDS: usize = 64;

/// A shard with news is written once no news came for this long (a node joined, a reboot: its
/// record is in the shard about a second later)…
pub const QUIET: Duration = Duration::from_secs(1);

/// …or, while news keeps coming (an install), once its oldest news is this old: each shard is
/// written at most about this often.
pub const FLUSH_EVERY: Duration = Duration::from_secs(10);

/// The pace a shard is written at, at most, in bytes a second: a shard of `b` bytes is written
/// again no sooner than `b / WRITE_PACE` after it was last (between [`QUIET`] and
/// [`FLUSH_EVERY`]), so that news trickling into every shard (a join wave over a large fleet)
/// costs etcd at most ~2 MiB a second over the 64 shards, and a small ledger's records are
/// written within about a second.
pub const WRITE_PACE: usize = 32 * 1024;

/// The largest shard written (bytes of its records): the API server refuses objects past 1 MiB.
pub const MAX_SHARD_BYTES: usize = 900 * 1024;

/// The shard format this build writes and reads.
pub const FORMAT: u32 = 1;

/// The ConfigMap key of a shard's records.
pub const RECORDS_KEY: &str = "records";
/// The ConfigMap key of a shard's seal.
pub const SEAL_KEY: &str = "seal";
/// The label every shard carries (its value: the installation's lease name).
pub const LEDGER_LABEL: &str = "ec2-topology-labeler.io/ledger";

/// The shard a node's record is kept in: FNV-1a of its name (stable across builds and
/// platforms, unlike the standard library's hasher), modulo [`SHARDS`].
pub fn shard_of(name: &str) -> usize {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (h % SHARDS as u64) as usize
}

/// The name of shard `k` of the installation whose Lease is `lease`.
pub fn shard_name(lease: &str, k: usize) -> String {
    format!("{lease}-records-{k:02}")
}

/// A record as the ledger keeps it: the answer without its instance ID, shared by every record
/// that has it, and what is the node's own.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    instance_id: InstanceId,
    boot_id: BootId,
    at: u64,
    answer: Arc<InstanceTopology>,
}

impl Entry {
    fn verified(&self) -> Verified {
        Verified {
            topology: InstanceTopology {
                instance_id: self.instance_id.to_string(),
                ..(*self.answer).clone()
            },
            boot_id: Some(self.boot_id.to_string()),
            at: self.at,
        }
    }

    /// Whether this entry holds just this record (`answer` without its instance ID).
    fn holds(&self, instance_id: &str, boot_id: &str, at: u64, answer: &InstanceTopology) -> bool {
        self.at == at
            && self.instance_id == instance_id
            && self.boot_id.is(boot_id)
            && answer_matches(&self.answer, answer)
    }
}

/// Whether `shared` (an answer without its instance ID) is `full`'s answer.
fn answer_matches(shared: &InstanceTopology, full: &InstanceTopology) -> bool {
    shared.instance_type == full.instance_type
        && shared.availability_zone == full.availability_zone
        && shared.zone_id == full.zone_id
        && shared.network_nodes == full.network_nodes
        && shared.group_name == full.group_name
        && shared.capacity_block_id == full.capacity_block_id
}

#[derive(Debug, Default)]
struct Shard {
    entries: HashMap<Box<str>, Entry>,
    /// Changed since it was last written (or read): since when, and when last.
    dirty: Option<(Instant, Instant)>,
    /// When it was last taken to be written, and how many bytes it was.
    written: Option<(Instant, usize)>,
}

impl Shard {
    fn touch(&mut self) {
        let now = Instant::now();
        self.dirty = Some((self.dirty.map_or(now, |(since, _)| since), now));
    }
}

/// The records of every node this replica verified or read, in their shards.
#[derive(Debug)]
pub struct Ledger {
    key: Option<RecordKey>,
    shards: [Mutex<Shard>; SHARDS],
    answers: Mutex<Interner<InstanceTopology>>,
    /// Whether the shards were read in this term as leader (or need not be: kept in memory
    /// only, or no key).
    loaded: tokio::sync::watch::Sender<bool>,
    /// Held while shards are written: one writer at a time (the keeper and the last write at
    /// shutdown), so that an older copy of a shard never lands after a newer one.
    pub(crate) writing: tokio::sync::Mutex<()>,
    /// Whether its shards were read in this term: only then is one written (a write would drop
    /// the records not read).
    writable: std::sync::atomic::AtomicBool,
    /// Counts the reads that took records in: they may hold nodes gone since they were written
    /// (see `reconcile::housekeeping`).
    merged: std::sync::atomic::AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere while holding it leaves the data as consistent as any step: go on.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Ledger {
    /// A ledger whose shards are still to be read ([`keep::keep`] reads and writes them).
    pub fn new(key: Option<RecordKey>) -> Self {
        let loaded = key.is_none();
        Self {
            key,
            shards: std::array::from_fn(|_| Mutex::default()),
            answers: Mutex::default(),
            loaded: tokio::sync::watch::Sender::new(loaded),
            writing: tokio::sync::Mutex::new(()),
            writable: std::sync::atomic::AtomicBool::new(false),
            merged: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// A ledger kept in memory only (ready at once; nothing reads or writes its shards).
    pub fn in_memory(key: Option<RecordKey>) -> Self {
        let ledger = Self::new(key);
        ledger.loaded.send_replace(true);
        ledger
    }

    /// The key its shards are sealed with.
    pub fn key(&self) -> Option<&RecordKey> {
        self.key.as_ref()
    }

    /// Whether records are kept at all (a record key is configured).
    pub fn enabled(&self) -> bool {
        self.key.is_some()
    }

    /// Whether its shards have been read in this term (or need not be).
    pub fn is_ready(&self) -> bool {
        *self.loaded.borrow()
    }

    /// Completes once its shards have been read in this term, or after `at_most` (then records
    /// not read yet are simply not known: their nodes are asked about).
    pub async fn ready(&self, at_most: Duration) {
        if self.is_ready() {
            return;
        }
        let mut rx = self.loaded.subscribe();
        let _ = tokio::time::timeout(at_most, rx.wait_for(|l| *l)).await;
    }

    pub(crate) fn set_loaded(&self, loaded: bool) {
        self.loaded.send_replace(loaded);
    }

    /// Its shards were read in this term: they may be written.
    pub(crate) fn set_writable(&self) {
        self.writable
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    pub(crate) fn is_writable(&self) -> bool {
        self.writable.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Shard `k` (`0..SHARDS`, as [`shard_of`] gives), locked.
    fn shard(&self, k: usize) -> MutexGuard<'_, Shard> {
        let [first, ..] = &self.shards;
        lock(self.shards.get(k).unwrap_or(first))
    }

    /// `name`'s record, if the ledger holds one.
    pub fn get(&self, name: &str) -> Option<Verified> {
        self.shard(shard_of(name))
            .entries
            .get(name)
            .map(Entry::verified)
    }

    /// Keep `v` as `name`'s record (to be written with its shard): as [`Ledger::put_answer`].
    pub fn put(&self, name: &str, v: &Verified) -> bool {
        let answer = Arc::new(InstanceTopology {
            instance_id: String::new(),
            ..v.topology.clone()
        });
        // (The copy made here is shared no further: `put_answer` keeps its own.)
        self.put_answer(
            name,
            &v.topology.instance_id,
            v.boot_id.as_deref(),
            v.at,
            &answer,
        )
    }

    /// Keep as `name`'s record that EC2 has given `answer` (without its instance ID: shared,
    /// here as in the lookup's cache) about `instance_id` in the boot `boot_id` since `at`, to
    /// be written with its shard. Nothing without a key or a boot ID (a record that cannot
    /// tell a reboot is never trusted, so never kept), or when it holds just that already (a
    /// resync's reconcile: nothing allocated). Returns whether it changed.
    pub fn put_answer(
        &self,
        name: &str,
        instance_id: &str,
        boot_id: Option<&str>,
        at: u64,
        answer: &Arc<InstanceTopology>,
    ) -> bool {
        // Not leading (or not yet read): the next leader reads what was written.
        if self.key.is_none() || !self.is_ready() {
            return false;
        }
        let Some(boot_id) = boot_id else {
            return false;
        };
        let k = shard_of(name);
        if self
            .shard(k)
            .entries
            .get(name)
            .is_some_and(|e| e.holds(instance_id, boot_id, at, answer))
        {
            return false;
        }
        let answer = lock(&self.answers).share_copy(answer);
        let entry = Entry {
            instance_id: InstanceId::from(instance_id),
            boot_id: BootId::new(boot_id),
            at,
            answer,
        };
        let mut shard = self.shard(k);
        shard.entries.insert(name.into(), entry);
        shard.touch();
        true
    }

    /// Forget `name`'s record.
    pub fn forget(&self, name: &str) {
        let mut shard = self.shard(shard_of(name));
        if shard.entries.remove(name).is_some() {
            shard.touch();
        }
    }

    /// Forget the records of nodes not in `live` (deleted).
    pub fn retain<S: std::borrow::Borrow<str> + std::hash::Hash + Eq>(&self, live: &HashSet<S>) {
        for shard in self.shards.iter() {
            let mut shard = lock(shard);
            let before = shard.entries.len();
            shard.entries.retain(|name, _| live.contains(&**name));
            if shard.entries.len() != before {
                shard.touch();
            }
        }
    }

    /// How many records it holds.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).entries.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forget everything (this replica stopped leading: the next leader writes the shards).
    pub(crate) fn clear(&self) {
        self.writable
            .store(false, std::sync::atomic::Ordering::SeqCst);
        for shard in self.shards.iter() {
            *lock(shard) = Shard::default();
        }
        lock(&self.answers).sweep();
    }

    /// Take what was read of shard `k`: records this replica holds already (newer) stay.
    pub(crate) fn merge(&self, k: usize, read: Vec<(String, Verified)>) -> usize {
        let mut taken = 0;
        for (name, v) in read {
            // A record filed under another shard (written by a build that hashed otherwise)
            // is kept where this build looks for it, and that shard rewritten.
            let here = shard_of(&name);
            let Some(boot_id) = v.boot_id.as_deref() else {
                continue;
            };
            let answer = self.share(&v.topology);
            let mut shard = self.shard(here);
            if shard.entries.contains_key(name.as_str()) {
                continue;
            }
            shard.entries.insert(
                name.into(),
                Entry {
                    instance_id: InstanceId::from(v.topology.instance_id.as_str()),
                    boot_id: BootId::new(boot_id),
                    at: v.at,
                    answer,
                },
            );
            if here != k {
                shard.touch();
            }
            taken += 1;
        }
        if taken > 0 {
            self.merged
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        taken
    }

    /// Moves each time a read took records in (see `merged`).
    pub(crate) fn merges(&self) -> u64 {
        self.merged.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Mark shard `k` as to be written.
    pub(crate) fn mark_dirty(&self, k: usize) {
        self.shard(k).touch();
    }

    /// The shards with news that are due: quiet for [`QUIET`] (no news since), or with news
    /// older than [`FLUSH_EVERY`] (news still coming: an install); every shard with news when
    /// `all`. Each one's records (encoded) and seal, marked clean; put back with
    /// [`Ledger::mark_dirty`] when the write fails.
    pub(crate) fn take_dirty(&self, all: bool) -> Vec<(usize, String, String)> {
        let Some(key) = &self.key else {
            return Vec::new();
        };
        let now = Instant::now();
        let mut out = Vec::new();
        for (k, shard) in self.shards.iter().enumerate() {
            let mut shard = lock(shard);
            let Some((since, last)) = shard.dirty else {
                continue;
            };
            let paced = shard.written.is_none_or(|(at, bytes)| {
                let gap = Duration::from_secs_f64(bytes as f64 / WRITE_PACE as f64)
                    .clamp(QUIET, FLUSH_EVERY);
                now - at >= gap
            });
            let due = all || (paced && (now - last >= QUIET || now - since >= FLUSH_EVERY));
            if !due {
                continue;
            }
            shard.dirty = None;
            let text = encode(&shard.entries);
            shard.written = Some((now, text.len()));
            drop(shard);
            let seal = key.seal_text(&text);
            out.push((k, text, seal));
        }
        out
    }

    fn share(&self, t: &InstanceTopology) -> Arc<InstanceTopology> {
        let answer = Arc::new(InstanceTopology {
            instance_id: String::new(),
            ..t.clone()
        });
        lock(&self.answers).share(answer)
    }
}

/// A shard's records as written: its answers once each, and per node (by name, in order) its
/// instance ID, boot ID, since when, and the index of its answer.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Wire {
    v: u32,
    answers: Vec<WireAnswer>,
    nodes: BTreeMap<String, (String, String, u64, usize)>,
}

#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct WireAnswer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    instance_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    availability_zone: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    zone_id: Option<String>,
    network_nodes: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    group_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    capacity_block_id: Option<String>,
}

impl From<&InstanceTopology> for WireAnswer {
    fn from(t: &InstanceTopology) -> Self {
        Self {
            instance_type: t.instance_type.clone(),
            availability_zone: t.availability_zone.clone(),
            zone_id: t.zone_id.clone(),
            network_nodes: t.network_nodes.clone(),
            group_name: t.group_name.clone(),
            capacity_block_id: t.capacity_block_id.clone(),
        }
    }
}

/// A shard's records as text (the same records always give the same text).
fn encode(entries: &HashMap<Box<str>, Entry>) -> String {
    let mut answers: Vec<WireAnswer> = Vec::new();
    let mut index: HashMap<*const InstanceTopology, usize> = HashMap::new();
    let mut by_value: HashMap<WireAnswer, usize> = HashMap::new();
    let mut sorted: Vec<(&Box<str>, &Entry)> = entries.iter().collect();
    sorted.sort_unstable_by(|a, b| a.0.cmp(b.0));
    let mut nodes = BTreeMap::new();
    for (name, e) in sorted {
        let i = *index.entry(Arc::as_ptr(&e.answer)).or_insert_with(|| {
            let wire = WireAnswer::from(&*e.answer);
            *by_value.entry(wire.clone()).or_insert_with(|| {
                answers.push(wire);
                answers.len() - 1
            })
        });
        nodes.insert(
            name.to_string(),
            (e.instance_id.to_string(), e.boot_id.to_string(), e.at, i),
        );
    }
    // Serialising strings and numbers cannot fail.
    serde_json::to_string(&Wire {
        v: FORMAT,
        answers,
        nodes,
    })
    .unwrap_or_default()
}

/// A shard's records, read without the key (the seal is not checked: see [`open`]).
pub fn decode(text: &str) -> Result<Vec<(String, Verified)>, RecordError> {
    let any: serde_json::Value =
        serde_json::from_str(text).map_err(|e| RecordError::Unreadable(e.to_string()))?;
    match any.get("v").and_then(serde_json::Value::as_u64) {
        Some(v) if v == u64::from(FORMAT) => {}
        Some(v) => return Err(RecordError::OtherVersion(v)),
        None => return Err(RecordError::Unreadable("no format version".into())),
    }
    let wire: Wire =
        serde_json::from_value(any).map_err(|e| RecordError::Unreadable(e.to_string()))?;
    wire.nodes
        .into_iter()
        .map(|(name, (instance_id, boot_id, at, i))| {
            let a = wire.answers.get(i).ok_or_else(|| {
                RecordError::Unreadable(format!("{name}'s answer {i} is not in the shard"))
            })?;
            Ok((
                name,
                Verified {
                    topology: InstanceTopology {
                        instance_id,
                        instance_type: a.instance_type.clone(),
                        availability_zone: a.availability_zone.clone(),
                        zone_id: a.zone_id.clone(),
                        network_nodes: a.network_nodes.clone(),
                        group_name: a.group_name.clone(),
                        capacity_block_id: a.capacity_block_id.clone(),
                    },
                    boot_id: Some(boot_id),
                    at,
                },
            ))
        })
        .collect()
}

/// The records of a shard's data, read without the key (see [`decode`]).
pub fn read_unchecked(
    data: &BTreeMap<String, String>,
) -> Result<Vec<(String, Verified)>, RecordError> {
    decode(data.get(RECORDS_KEY).map_or("", String::as_str))
}

/// A shard's records, when its seal opens with `key` (or an earlier key it holds); and
/// whether it was sealed with an earlier key (then it is written again, sealed with this one).
pub fn open(
    data: &BTreeMap<String, String>,
    key: &RecordKey,
) -> Result<(Vec<(String, Verified)>, bool), RecordError> {
    let text = data
        .get(RECORDS_KEY)
        .ok_or_else(|| RecordError::Unreadable(format!("no {RECORDS_KEY:?} key")))?;
    let seal = data.get(SEAL_KEY).ok_or(RecordError::Tampered)?;
    let current = key.open_text(text, seal)?;
    Ok((decode(text)?, !current))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> RecordKey {
        RecordKey::new(b"the ledger tests' key of 32 bytes or more").unwrap()
    }

    fn verified(id: &str, boot: &str, switch: &str) -> Verified {
        Verified {
            topology: InstanceTopology {
                instance_id: id.into(),
                instance_type: Some("p5.48xlarge".into()),
                zone_id: Some("usw2-az1".into()),
                network_nodes: vec!["nn-a".into(), "nn-b".into(), switch.into()],
                ..InstanceTopology::default()
            },
            boot_id: Some(boot.into()),
            at: 1_796_300_000,
        }
    }

    fn written(ledger: &Ledger) -> BTreeMap<usize, BTreeMap<String, String>> {
        ledger
            .take_dirty(true)
            .into_iter()
            .map(|(k, text, seal)| {
                (
                    k,
                    BTreeMap::from([(RECORDS_KEY.into(), text), (SEAL_KEY.into(), seal)]),
                )
            })
            .collect()
    }

    #[test]
    fn records_read_back_from_their_shards_as_they_were_put() {
        let ledger = Ledger::in_memory(Some(key()));
        let mut put = BTreeMap::new();
        for n in 0..500 {
            let name = format!("ip-10-0-{}-{}.internal", n / 200, n % 200);
            let v = verified(
                &format!("i-{n:017x}"),
                &format!("boot-{n}"),
                &format!("nn-{}", n % 7),
            );
            assert!(ledger.put(&name, &v));
            assert!(!ledger.put(&name, &v), "the same record again is no news");
            put.insert(name, v);
        }
        assert_eq!(ledger.len(), 500);
        let shards = written(&ledger);
        assert!(
            shards.len() > SHARDS / 2,
            "spread over the shards: {}",
            shards.len()
        );
        assert!(written(&ledger).is_empty(), "written shards are clean");
        let read = Ledger::in_memory(Some(key()));
        for (k, data) in &shards {
            let (records, older) = open(data, &key()).expect("a shard we sealed");
            assert!(!older);
            for (name, _) in &records {
                assert_eq!(shard_of(name), *k, "{name} kept in its own shard");
            }
            read.merge(*k, records);
        }
        for (name, v) in &put {
            assert_eq!(read.get(name).as_ref(), Some(v), "{name}");
        }
        assert!(written(&read).is_empty(), "nothing read is news");
    }

    #[test]
    fn an_answer_is_kept_as_the_ledgers_own_and_the_same_record_is_no_news() {
        let ledger = Ledger::in_memory(Some(key()));
        let v = verified("i-0000000000000000a", "b", "nn-c");
        let answer = Arc::new(InstanceTopology {
            instance_id: String::new(),
            ..v.topology.clone()
        });
        let id = v.topology.instance_id.as_str();
        assert!(ledger.put_answer("node-a", id, Some("b"), v.at, &answer));
        // The lookup's cache holds its answers in a set of its own: sharing one of them would
        // keep it in use for both sets, and swept by neither.
        assert_eq!(Arc::strong_count(&answer), 1, "a copy of its own");
        assert_eq!(ledger.get("node-a"), Some(v.clone()), "reads back whole");
        // As every resync's reconcile puts it again: no news, the shard not touched.
        written(&ledger);
        assert!(!ledger.put_answer("node-a", id, Some("b"), v.at, &answer));
        assert!(written(&ledger).is_empty());
        // Any part of it changed is news.
        let other = Arc::new(InstanceTopology {
            network_nodes: vec!["nn-a".into(), "nn-b".into(), "nn-z".into()],
            ..(*answer).clone()
        });
        assert!(ledger.put_answer("node-a", id, Some("b"), v.at, &other));
        assert!(ledger.put_answer("node-a", id, Some("b2"), v.at, &other));
        assert!(ledger.put_answer("node-a", id, Some("b2"), v.at + 1, &other));
        assert!(ledger.put_answer(
            "node-a",
            "i-0000000000000000b",
            Some("b2"),
            v.at + 1,
            &other
        ));
        assert!(!ledger.put_answer("node-a", "i-0000000000000000b", None, v.at + 1, &other));
    }

    #[test]
    fn an_answer_many_nodes_share_is_written_once_per_shard() {
        let ledger = Ledger::in_memory(Some(key()));
        for n in 0..2_000 {
            ledger.put(
                &format!("node-{n}"),
                &verified(&format!("i-{n:017x}"), "b", "nn-c"),
            );
        }
        for (_, data) in written(&ledger) {
            let text = &data[RECORDS_KEY];
            assert_eq!(text.matches("p5.48xlarge").count(), 1, "{text}");
        }
    }

    #[test]
    fn a_shard_edited_or_sealed_with_another_key_is_not_opened() {
        let ledger = Ledger::in_memory(Some(key()));
        ledger.put("node-a", &verified("i-0000000000000000a", "b", "nn-c"));
        let (_, mut data) = written(&ledger).into_iter().next().unwrap();
        let edited = data[RECORDS_KEY].replace("nn-c", "nn-z");
        let mut tampered = data.clone();
        tampered.insert(RECORDS_KEY.into(), edited);
        assert_eq!(open(&tampered, &key()).err(), Some(RecordError::Tampered));
        let other = RecordKey::new(b"someone else's key, thirty-two bytes").unwrap();
        assert!(matches!(open(&data, &other), Err(RecordError::OtherKey(_))));
        // After a rotation the old seal still opens, and says so (the shard is sealed anew).
        let rotated = other.with_previous([key()]);
        let (records, older) = open(&data, &rotated).expect("opened with the previous key");
        assert!(older);
        assert_eq!(records.len(), 1);
        data.remove(SEAL_KEY);
        assert_eq!(open(&data, &key()).err(), Some(RecordError::Tampered));
    }

    #[test]
    fn what_cannot_tell_a_reboot_or_be_sealed_is_not_kept() {
        let ledger = Ledger::in_memory(Some(key()));
        let mut v = verified("i-0000000000000000a", "b", "nn-c");
        v.boot_id = None;
        assert!(!ledger.put("node-a", &v));
        let unkeyed = Ledger::in_memory(None);
        assert!(!unkeyed.put("node-a", &verified("i-0000000000000000a", "b", "nn-c")));
        assert!(ledger.is_empty() && unkeyed.is_empty());
    }

    #[test]
    fn a_deleted_nodes_record_goes_and_its_shard_is_rewritten() {
        let ledger = Ledger::in_memory(Some(key()));
        ledger.put("node-a", &verified("i-0000000000000000a", "b", "nn-c"));
        ledger.put("node-b", &verified("i-0000000000000000b", "b", "nn-c"));
        written(&ledger);
        ledger.retain(&HashSet::from(["node-b".to_string()]));
        assert_eq!(ledger.get("node-a"), None);
        assert!(ledger.get("node-b").is_some());
        let shards = written(&ledger);
        assert_eq!(
            shards.keys().copied().collect::<Vec<_>>(),
            vec![shard_of("node-a")]
        );
    }

    #[test]
    fn records_this_replica_holds_win_over_those_read() {
        let ledger = Ledger::in_memory(Some(key()));
        let newer = verified("i-0000000000000000a", "boot-2", "nn-c");
        ledger.put("node-a", &newer);
        let k = shard_of("node-a");
        let taken = ledger.merge(
            k,
            vec![
                (
                    "node-a".into(),
                    verified("i-0000000000000000a", "boot-1", "nn-c"),
                ),
                (
                    "node-b".into(),
                    verified("i-0000000000000000b", "boot-1", "nn-c"),
                ),
            ],
        );
        assert_eq!(taken, 1);
        assert_eq!(ledger.get("node-a"), Some(newer));
        assert!(ledger.get("node-b").is_some());
    }

    /// A shard is written a second after its last news, or, while news keeps coming, once its
    /// oldest is ten seconds old: a joiner's record is in its shard at once, an install's shards
    /// are written about every ten seconds each.
    #[tokio::test(start_paused = true)]
    async fn a_shard_is_written_when_quiet_or_when_its_news_is_old() {
        let ledger = Ledger::in_memory(Some(key()));
        let second = Duration::from_secs(1);
        ledger.put("node-a", &verified("i-0000000000000000a", "b", "nn-c"));
        assert!(ledger.take_dirty(false).is_empty(), "news just now");
        tokio::time::advance(second).await;
        assert_eq!(ledger.take_dirty(false).len(), 1, "quiet for a second");
        // News every half second into one shard: written once its oldest is 10 s old.
        let names: Vec<String> = (0..10_000)
            .map(|n| format!("node-{n}"))
            .filter(|n| shard_of(n) == shard_of("node-a"))
            .take(30)
            .collect();
        let mut written_at = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let id = format!("i-{i:017x}");
            ledger.put(name, &verified(&id, "b", "nn-c"));
            tokio::time::advance(second / 2).await;
            if !ledger.take_dirty(false).is_empty() {
                written_at.push(i);
            }
        }
        assert_eq!(written_at, vec![19], "once, 10 s after the first news");
        assert!(!ledger.take_dirty(true).is_empty(), "all: the rest at once");
    }

    /// News trickling in a little slower than once a second (a join wave spread over a large
    /// fleet) does not rewrite a large shard every second: it waits its size's worth of pace.
    #[tokio::test(start_paused = true)]
    async fn a_large_shard_is_written_no_faster_than_its_pace() {
        let ledger = Ledger::in_memory(Some(key()));
        let names: Vec<String> = (0..200_000)
            .map(|n| format!("ip-10-0-{}-{}.us-west-2.compute.internal", n / 250, n % 250))
            .filter(|n| shard_of(n) == 7)
            .take(900)
            .collect();
        for (i, name) in names.iter().enumerate().take(800) {
            ledger.put(
                name,
                &verified(&format!("i-{i:017x}"), "boot-1", &format!("nn-{i}")),
            );
        }
        let bytes = ledger.take_dirty(true)[0].1.len();
        let gap = Duration::from_secs_f64(bytes as f64 / WRITE_PACE as f64);
        assert!(gap > Duration::from_secs(2), "{bytes} bytes");
        let mut written_at = Vec::new();
        let started = Instant::now();
        for (i, name) in names.iter().enumerate().skip(800).take(20) {
            ledger.put(name, &verified(&format!("i-{i:017x}"), "boot-1", "nn-x"));
            for _ in 0..12 {
                tokio::time::advance(Duration::from_millis(100)).await;
                if !ledger.take_dirty(false).is_empty() {
                    written_at.push(started.elapsed());
                }
            }
        }
        assert!(written_at.len() >= 2, "{written_at:?}");
        for pair in written_at.windows(2) {
            assert!(pair[1] - pair[0] >= gap, "{written_at:?} (gap {gap:?})");
        }
    }

    #[test]
    fn the_shard_of_a_name_is_stable() {
        // Fixed values: shards written by one build are read by the next.
        assert_eq!(shard_of(""), (0xcbf2_9ce4_8422_2325u64 % 64) as usize);
        assert_eq!(
            shard_of("ip-10-0-0-1.us-west-2.compute.internal"),
            shard_of("ip-10-0-0-1.us-west-2.compute.internal")
        );
        let spread: HashSet<usize> = (0..1_000).map(|n| shard_of(&format!("node-{n}"))).collect();
        assert_eq!(spread.len(), SHARDS);
    }

    #[test]
    fn a_100000_node_fleet_fits_its_shards() {
        // EKS's names, one answer per 16 nodes (a switch each): every shard under the limit.
        let ledger = Ledger::in_memory(Some(key()));
        for n in 0..100_000u32 {
            let name = format!(
                "ip-10-{}-{}-{}.us-west-2.compute.internal",
                n >> 16,
                (n >> 8) & 255,
                n & 255
            );
            let v = verified(
                &format!("i-{n:017x}"),
                &format!("{:08x}-1b2c-4d5e-8f90-{n:012x}", n),
                &format!("nn-{:017x}", n / 16),
            );
            ledger.put(&name, &v);
        }
        let biggest = ledger
            .take_dirty(true)
            .into_iter()
            .map(|(_, text, _)| text.len())
            .max()
            .unwrap();
        assert!(biggest < MAX_SHARD_BYTES / 2, "{biggest} bytes");
    }
}
