//! Reading and writing the ledger's shards: read whole each time this replica starts leading,
//! then each shard with news written when due (see [`Ledger::take_dirty`]) until the lease is
//! lost (then the records held are dropped: the next leader reads what was written).
//!
//! Owns: when the shards are read and written. Never decides what a record says.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use serde_json::json;
use tracing::{debug, info, warn};

use super::{
    LEDGER_LABEL, Ledger, MAX_SHARD_BYTES, RECORDS_KEY, SEAL_KEY, SHARDS, open, shard_name,
};
use crate::{FIELD_MANAGER, leader::Leadership, metrics::Metrics};

/// Shards read at once.
const READ_CONCURRENCY: usize = 8;

/// The longest a new leader's read of its shards may take: after it, the reconciles go on
/// without the records not read (asking EC2 about their nodes), and the read is tried again.
const READ_WITHIN: Duration = Duration::from_secs(20);

/// Where the shards are: their namespace's API and the installation's Lease name.
#[derive(Clone)]
pub struct Shards {
    pub api: Api<ConfigMap>,
    pub lease: String,
}

/// Read the shards each time this replica starts leading, write those with news while it
/// leads. Runs forever.
pub async fn keep(shards: Shards, ledger: Arc<Ledger>, leader: Leadership, metrics: Arc<Metrics>) {
    if !ledger.enabled() {
        return std::future::pending().await;
    }
    loop {
        // Looked at often: a new leader's first reconciles wait for the shards.
        while !leader.is_leader() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Until the shards are read, nothing is written (a write would drop the records not
        // read); the reconciles go on meanwhile, asking EC2 about what no record vouches for.
        let mut read_yet = false;
        let mut attempt = 0;
        loop {
            if !read_yet {
                // Bounded as a whole: the reconciles wait for it (at most 30 s each).
                let read = tokio::time::timeout(READ_WITHIN, read(&shards, &ledger, &metrics))
                    .await
                    .unwrap_or_else(|_| Err(format!("not read within {}s", READ_WITHIN.as_secs())));
                match read {
                    Ok((records, found)) => {
                        read_yet = true;
                        attempt = 0;
                        ledger.set_writable();
                        info!(
                            records,
                            shards = found,
                            "read the verification ledger: its records vouch for nodes this leader asks EC2 nothing about"
                        );
                    }
                    Err(e) => {
                        attempt += 1;
                        warn!(error = %e,
                            "cannot read the verification ledger's shards: every node is asked about meanwhile, and no shard is written until they are read");
                    }
                }
                // Either way the reconciles go on.
                ledger.set_loaded(true);
            }
            // Shards are looked at every `QUIET`; after a failed read or write, later.
            let wait = if attempt == 0 {
                super::QUIET
            } else {
                crate::backoff::equal_jitter(crate::backoff::capped(
                    Duration::from_secs(1),
                    attempt,
                    Duration::from_secs(30),
                ))
            };
            tokio::select! {
                _ = leader.lost() => break,
                _ = tokio::time::sleep(wait) => {}
            }
            if read_yet {
                if write(&shards, &ledger, &metrics, false).await > 0 {
                    attempt += 1;
                } else {
                    attempt = 0;
                }
            }
        }
        ledger.set_loaded(false);
        ledger.clear();
        debug!("no longer leading: the ledger's records are dropped until the next term");
    }
}

/// At shutdown: the shards with news written once more while this replica still leads (a
/// rollout then costs the next leader no re-verification), within `at_most`.
pub async fn last_write(shards: &Shards, ledger: &Ledger, metrics: &Metrics, at_most: Duration) {
    if !ledger.is_writable() {
        return;
    }
    if tokio::time::timeout(at_most, write(shards, ledger, metrics, true))
        .await
        .is_err()
    {
        warn!(
            "the verification ledger's last write did not finish before shutdown: the next leader re-verifies what it did not hold"
        );
    }
}

/// Read every shard into `ledger`; returns the records taken and the shards found.
async fn read(
    shards: &Shards,
    ledger: &Ledger,
    metrics: &Metrics,
) -> Result<(usize, usize), String> {
    let Some(key) = ledger.key() else {
        return Ok((0, 0));
    };
    let mut found = 0;
    let mut records = 0;
    let mut reads = fetch(&shards.api, &shards.lease);
    while let Some((k, name, got)) = reads.next().await {
        let Some(cm) = got.map_err(|e| e.to_string())? else {
            continue;
        };
        found += 1;
        metrics.ledger_shard("read");
        let data = cm.data.unwrap_or_default();
        match open(&data, key) {
            Ok((read, older)) => {
                records += read.len();
                ledger.merge(k, read);
                if older {
                    // Sealed with an earlier key: sealed anew with this one.
                    ledger.mark_dirty(k);
                }
            }
            Err(e) => {
                metrics.ledger_shard("refused");
                warn!(shard = %name, error = %e,
                    "a verification ledger shard is not trusted: its nodes are asked about, and it is written anew");
                ledger.mark_dirty(k);
            }
        }
    }
    Ok((records, found))
}

/// Write every shard with news (one server-side apply each); a shard whose write fails is
/// written at the next flush.
async fn write(shards: &Shards, ledger: &Ledger, metrics: &Metrics, all: bool) -> usize {
    let _one_writer = ledger.writing.lock().await;
    let mut failed = 0;
    for (k, text, seal) in ledger.take_dirty(all) {
        let name = shard_name(&shards.lease, k);
        if text.len() > MAX_SHARD_BYTES {
            metrics.ledger_shard("too_large");
            warn!(shard = %name, bytes = text.len(), limit = MAX_SHARD_BYTES,
                "a verification ledger shard is too large to write: its nodes are re-verified by the next leader");
            continue;
        }
        let body = json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "labels": {
                    LEDGER_LABEL: shards.lease,
                    "app.kubernetes.io/managed-by": FIELD_MANAGER,
                },
            },
            "data": BTreeMap::from([(RECORDS_KEY, text), (SEAL_KEY, seal)]),
        });
        let params = PatchParams::apply(FIELD_MANAGER).force();
        // Metadata back only: a shard is up to hundreds of kB.
        let written = match kube::core::Request::new(shards.api.resource_url()).patch_metadata(
            &name,
            &params,
            &Patch::Apply(&body),
        ) {
            Ok(req) => shards
                .api
                .clone()
                .into_client()
                .request::<kube::core::PartialObjectMeta<ConfigMap>>(req)
                .await
                .map(|_| ()),
            Err(e) => Err(kube::Error::BuildRequest(e)),
        };
        match written {
            Ok(()) => metrics.ledger_shard("written"),
            Err(e) => {
                metrics.ledger_shard("write_failed");
                ledger.mark_dirty(k);
                failed += 1;
                debug!(shard = %name, error = %e, "writing a verification ledger shard failed");
            }
        }
    }
    if failed > 0 {
        warn!(
            failed,
            "verification ledger shards not written: tried again shortly"
        );
    }
    failed
}

/// The ledger's record of node `node`, as the operator's commands read it: its shard in the
/// namespace of the installation `leader` names, opened with `key` (without one, read without
/// checking the seal). `Err` says why it cannot be read (no access, a shard not trusted).
pub async fn record_of(
    client: &kube::Client,
    leader: &crate::leader::LeaderArgs,
    node: &str,
    key: Option<&crate::verified::RecordKey>,
) -> Result<Option<crate::verified::Verified>, String> {
    let ns = crate::leader::lease_namespace(leader, client);
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let name = shard_name(&leader.leader_election_lease_name, super::shard_of(node));
    let Some(cm) = api
        .get_opt(&name)
        .await
        .map_err(|e| format!("cannot read the ledger shard {ns}/{name}: {e}"))?
    else {
        return Ok(None);
    };
    let data = cm.data.unwrap_or_default();
    let records = match key {
        Some(key) => open(&data, key)
            .map(|(r, _)| r)
            .map_err(|e| format!("the ledger shard {ns}/{name} is not trusted: {e}"))?,
        None => super::read_unchecked(&data)
            .map_err(|e| format!("the ledger shard {ns}/{name} cannot be read: {e}"))?,
    };
    Ok(records
        .into_iter()
        .find_map(|(n, v)| (n == node).then_some(v)))
}

/// Every record of the installation `leader` names, read without checking the seals (what
/// `tree` can tell without the key); shards that cannot be read are left out.
pub async fn every_record(
    client: &kube::Client,
    leader: &crate::leader::LeaderArgs,
) -> Result<std::collections::HashMap<String, crate::verified::Verified>, kube::Error> {
    let ns = crate::leader::lease_namespace(leader, client);
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let mut reads = fetch(&api, &leader.leader_election_lease_name);
    let mut all = std::collections::HashMap::new();
    while let Some((_, _, got)) = reads.next().await {
        let Some(cm) = got? else { continue };
        if let Ok(records) = super::read_unchecked(&cm.data.unwrap_or_default()) {
            all.extend(records);
        }
    }
    Ok(all)
}

/// Every shard of the installation whose Lease is `lease`, [`READ_CONCURRENCY`] at a time:
/// its index, its name and what the API server answered (`None`: not written yet).
fn fetch(
    api: &Api<ConfigMap>,
    lease: &str,
) -> impl futures::Stream<Item = (usize, String, Result<Option<ConfigMap>, kube::Error>)> + use<> {
    let (api, lease) = (api.clone(), lease.to_owned());
    futures::stream::iter((0..SHARDS).map(move |k| {
        let api = api.clone();
        let name = shard_name(&lease, k);
        async move {
            let got = api.get_opt(&name).await;
            (k, name, got)
        }
    }))
    .buffer_unordered(READ_CONCURRENCY)
}
