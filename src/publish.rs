//! Publishers for schedulers, run by the leader beside the reconciler: a Kueue `Topology` and
//! Volcano `HyperNode`s. Both compare before they write, so a steady cluster costs nothing.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use kube::{
    Client, ResourceExt,
    runtime::{
        events::{Event, EventType, Recorder},
        reflector::Store,
    },
};
use tracing::{error, info, warn};

use crate::{
    config::PublishArgs,
    kueue::{self, Outcome},
    labels::LabelScheme,
    metrics::Metrics,
    tree::{Conflict, NodeView},
    volcano::{self, HyperNodeSync},
};

/// An existing Kueue Topology is checked again every this many publish intervals.
const KUEUE_RECHECK_INTERVALS: u32 = 12;

pub struct Publishers {
    pub client: Client,
    pub args: PublishArgs,
    pub scheme: LabelScheme,
    pub reader: Store<crate::node::LiteNode>,
    pub leader: crate::leader::Leadership,
    /// Set once the node cache has synced.
    pub synced: Arc<AtomicBool>,
    pub metrics: Arc<Metrics>,
    pub recorder: Option<Recorder>,
    /// The last publishing error logged (to log each distinct one once).
    pub last_error: std::sync::Mutex<Option<String>>,
}

impl Publishers {
    pub fn enabled(args: &PublishArgs) -> bool {
        args.kueue_topology || args.volcano_hypernodes
    }

    /// Publish until the process stops; `_alive` tells `/livez` this task still runs.
    pub async fn run(self, _alive: crate::http::TaskGuard) {
        let mut tick =
            tokio::time::interval(self.args.publish_interval.0.max(Duration::from_millis(100)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut hypernodes = HyperNodeSync::new(
            self.client.clone(),
            &self.args.volcano_hypernode_prefix,
            self.leader.clone(),
        );
        let mut kueue_checked: Option<Instant> = None;
        let mut kueue_reported: Option<Vec<String>> = None;
        let mut last_conflicts: Vec<Conflict> = Vec::new();
        loop {
            tick.tick().await;
            if !self.leader.is_leader() {
                // A new leader compares with the cluster afresh.
                hypernodes.reset();
                kueue_checked = None;
                continue;
            }
            let recheck = self
                .args
                .publish_interval
                .0
                .saturating_mul(KUEUE_RECHECK_INTERVALS);
            if self.args.kueue_topology && kueue_checked.is_none_or(|t| t.elapsed() >= recheck) {
                kueue_checked = Some(Instant::now());
                self.kueue(&mut kueue_reported).await;
            }
            if self.args.volcano_hypernodes && self.synced.load(Ordering::SeqCst) {
                self.volcano(&mut hypernodes, &mut last_conflicts).await;
            }
        }
    }

    fn topologies(&self) -> Vec<(String, Vec<String>)> {
        let hostname = self.args.kueue_topology_hostname_level;
        let mut out = vec![(
            self.args.kueue_topology_name.clone(),
            kueue::levels(&self.scheme, 3, hostname),
        )];
        if self.args.kueue_topology_four_layer {
            out.push((
                self.args.kueue_topology_four_layer_name.clone(),
                kueue::levels(&self.scheme, 4, hostname),
            ));
        }
        out
    }

    async fn kueue(&self, reported: &mut Option<Vec<String>>) {
        let mut mismatched = Vec::new();
        for (name, levels) in self.topologies() {
            match kueue::ensure(&self.client, &name, &levels).await {
                Ok((Outcome::Created, _)) => {
                    info!(topology = %name, ?levels, "created Kueue Topology");
                    self.metrics.kueue_topology_mismatch(&name, false);
                }
                Ok((Outcome::UpToDate, _)) => self.metrics.kueue_topology_mismatch(&name, false),
                Ok((Outcome::Mismatch { have }, obj)) => {
                    self.metrics.kueue_topology_mismatch(&name, true);
                    mismatched.push(name.clone());
                    if reported.as_ref().is_none_or(|r| !r.contains(&name)) {
                        warn!(topology = %name, have = ?have, want = ?levels, "Kueue Topology exists with other levels; levels are immutable, so it is left alone: delete it to let us recreate it, or point ResourceFlavors at another name");
                        if let (Some(recorder), Some(obj)) = (&self.recorder, obj)
                            && let Ok(Some(ar)) = kueue::topology_resource(&self.client).await
                        {
                            let event = Event {
                                type_: EventType::Warning,
                                reason: "TopologyLevelsMismatch".into(),
                                note: Some(format!(
                                    "levels {have:?} differ from the labels ec2-topology-labeler writes {levels:?}; levels are immutable, left alone"
                                )),
                                action: "PublishTopology".into(),
                                secondary: None,
                            };
                            let _ = recorder
                                .publish(&event, &kueue::object_ref(&obj, &ar))
                                .await;
                        }
                    }
                }
                Ok((Outcome::NotServed, _)) => {
                    if reported.is_none() {
                        error!(
                            "--kueue-topology is on but the cluster serves no kueue.x-k8s.io Topology API (is Kueue installed?)"
                        );
                    }
                    self.metrics.publish_failed("kueue");
                }
                Err(e) => {
                    warn!(topology = %name, error = %e, "cannot check the Kueue Topology; trying again later");
                    self.metrics.publish_failed("kueue");
                }
            }
        }
        *reported = Some(mismatched);
    }

    async fn volcano(&self, sync: &mut HyperNodeSync, last_conflicts: &mut Vec<Conflict>) {
        let views: Vec<NodeView> = self
            .reader
            .state()
            .iter()
            .map(|n| NodeView {
                name: n.name_any(),
                ready: None,
                labels: n.metadata.labels.clone().unwrap_or_default(),
            })
            .collect();
        match volcano::desired(&self.scheme, &views, &self.args.volcano_hypernode_prefix) {
            Ok(desired) => {
                last_conflicts.clear();
                self.metrics.hypernode_conflicts(0);
                match sync.sync(&desired).await {
                    Ok(stats) => {
                        self.metrics
                            .hypernodes(desired.len(), stats.applied, stats.deleted);
                        self.last_error
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .take();
                    }
                    Err(e) => {
                        sync.reset();
                        self.metrics.publish_failed("volcano");
                        // Once per distinct error, not once per interval.
                        let text = e.to_string();
                        if self
                            .last_error
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .replace(text.clone())
                            != Some(text)
                        {
                            warn!(error = %e, "cannot sync Volcano HyperNodes; trying again every interval");
                        }
                    }
                }
            }
            Err(conflicts) => {
                self.metrics.hypernode_conflicts(conflicts.len());
                if conflicts != *last_conflicts {
                    volcano::report_conflicts(&conflicts);
                    *last_conflicts = conflicts;
                }
            }
        }
    }
}
