//! What Kueue's and KAI's Topology publishers share: a Topology object's levels (from the
//! label scheme), the object as we create it, finding the API a cluster serves, and creating a
//! Topology when missing without ever changing an existing one's levels.
//!
//! Owns: those steps and their [`Outcome`]. Never decides which Topologies to publish.

use kube::{
    Api, Client, Resource,
    api::{ApiResource, DynamicObject, Patch, PatchParams},
    discovery::{Discovery, verbs},
};
use serde_json::{Value, json};

use crate::{
    FIELD_MANAGER,
    labels::{LabelScheme, LayerNumbering},
    leader::Leadership,
};

pub(crate) const HOSTNAME: &str = "kubernetes.io/hostname";

/// Whether the Kueue and KAI Topologies get an UltraServer level: the capacity block's label
/// (EC2's `capacityBlockId`, set only for UltraServer instances: one NVLink domain) between the
/// deepest network layer and the hostname.
///
/// Kueue and KAI leave out of a Topology every node lacking one of its level labels, so the
/// level never goes into the Topology every node uses: UltraServer members get a Topology of
/// their own beside it (Kueue: `--kueue-topology-ultraserver-name`; KAI: `<name>-ultraserver`),
/// which their ResourceFlavors or workloads name. Domains are named by every level above, so an
/// UltraServer whose instances sit under two leaves is two domains, never one.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    serde::Serialize,
    serde::Deserialize,
    clap::ValueEnum,
    schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum UltraServerLevel {
    /// Once a published node carries a capacity block (a verified EC2 answer gave one).
    #[default]
    Auto,
    /// From the start (refused when the capacity block label is turned off).
    Always,
    /// Never. (Not `on`/`off`: a values file reads those as booleans.)
    Never,
}

/// [`levels`] with the capacity block's label between the deepest layer and the hostname (and
/// with `clique`, GPU Feature Discovery's NVLink clique under it); `None` when no capacity block
/// label is written (`--capacity-block-label=false`).
pub fn ultraserver_levels(
    scheme: &LabelScheme,
    depth: usize,
    hostname: bool,
    clique: bool,
) -> Option<Vec<String>> {
    let key = scheme.capacity_block_key.as_ref()?;
    let mut out = levels(scheme, depth, false);
    out.push(key.clone());
    if clique {
        out.push(super::cliques::CLIQUE_LABEL.into());
    }
    if hostname {
        out.push(HOSTNAME.into());
    }
    Some(out)
}

/// Whether a published node is in an UltraServer: it carries the capacity block's label (only
/// nodes an EC2 answer vouches for carry topology in what the publishers see).
pub(crate) fn in_ultraserver(scheme: &LabelScheme, node: &crate::tree::NodeView) -> bool {
    scheme
        .capacity_block_key
        .as_ref()
        .is_some_and(|k| node.labels.get(k).is_some_and(|v| !v.is_empty()))
}

/// Levels, coarsest first, for instances `depth` layers deep: the layer labels, then (if asked,
/// as Kueue advises) `kubernetes.io/hostname`.
pub fn levels(scheme: &LabelScheme, depth: usize, hostname: bool) -> Vec<String> {
    let mut out: Vec<String> = match scheme.numbering {
        LayerNumbering::TopFirst => (1..=depth).map(|n| scheme.layer_key(n)).collect(),
        LayerNumbering::LeafFirst => (1..=depth).rev().map(|n| scheme.layer_key(n)).collect(),
    };
    if hostname {
        out.push(HOSTNAME.into());
    }
    out
}

/// The Topology object to apply, annotated as the installation `owner`'s (the chart's admission
/// policy lets our ServiceAccount create only Topologies so annotated, and change or delete no
/// other).
pub(crate) fn topology_object(
    api_version: &str,
    name: &str,
    levels: &[String],
    owner: &str,
) -> Value {
    let levels: Vec<Value> = levels.iter().map(|l| json!({ "nodeLabel": l })).collect();
    json!({
        "apiVersion": api_version,
        "kind": "Topology",
        "metadata": {
            "name": name,
            "labels": { super::owner::MANAGED_BY.0: super::owner::MANAGED_BY.1 },
            "annotations": { super::owner::OWNER: owner }
        },
        "spec": { "levels": levels }
    })
}

/// Levels of a Topology object.
pub(crate) fn levels_of(obj: &DynamicObject) -> Vec<String> {
    obj.data
        .pointer("/spec/levels")
        .and_then(|v| v.as_array())
        .map(|ls| {
            ls.iter()
                .filter_map(|l| l["nodeLabel"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Created,
    UpToDate,
    /// It exists with other levels; left alone (levels are immutable in Kueue).
    Mismatch {
        have: Vec<String>,
    },
    /// The cluster serves no Kueue Topology API.
    NotServed,
    /// Missing, but this replica no longer leads: not created (the leader will).
    NotLeading,
}

/// `kind` of `group` as the cluster serves it (patchable), in the first of `versions` served.
pub(crate) async fn served_resource(
    client: &Client,
    group_name: &str,
    versions: &[&str],
    kind: &str,
) -> Result<Option<ApiResource>, kube::Error> {
    let discovery = Discovery::new(client.clone())
        .filter(&[group_name])
        .run()
        .await?;
    let Some(group) = discovery.groups().find(|g| g.name() == group_name) else {
        return Ok(None);
    };
    for version in versions {
        if let Some((ar, caps)) = group
            .versioned_resources(version)
            .into_iter()
            .find(|(ar, _)| ar.kind == kind)
            && caps.supports_operation(verbs::PATCH)
        {
            return Ok(Some(ar));
        }
    }
    Ok(None)
}

/// The Warning Event on a Topology (Kueue's or KAI's) of our name whose levels differ.
pub(crate) fn report_mismatch(
    events: &crate::admin::events::Events,
    obj: &DynamicObject,
    ar: &ApiResource,
    have: &[String],
    want: &[String],
) {
    events.publish(
        crate::admin::events::Reason::TopologyLevelsMismatch,
        "PublishTopology",
        &format!(
            "levels {have:?} differ from the labels ec2-topology-labeler writes {want:?}; levels are immutable, left alone"
        ),
        obj.object_ref(ar),
    );
}

/// [`super::kueue::ensure`] for a Topology kind of any group with `spec.levels[].nodeLabel`
/// (Kueue's, KAI's), served as `ar`, created as the installation `owner`'s. `leader` is checked
/// right before the write (the reads before it take time, in which the lease can pass to another
/// replica).
pub(crate) async fn ensure_in(
    client: &Client,
    ar: &ApiResource,
    name: &str,
    levels: &[String],
    owner: &str,
    leader: &Leadership,
) -> Result<(Outcome, Option<DynamicObject>), kube::Error> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), ar);
    if let Some(existing) = api.get_opt(name).await? {
        let have = levels_of(&existing);
        return Ok(if have == levels {
            (Outcome::UpToDate, Some(existing))
        } else {
            (Outcome::Mismatch { have }, Some(existing))
        });
    }
    if !leader.is_leader() {
        return Ok((Outcome::NotLeading, None));
    }
    let obj = topology_object(&ar.api_version, name, levels, owner);
    let created = api
        .patch(name, &PatchParams::apply(FIELD_MANAGER), &Patch::Apply(obj))
        .await?;
    Ok((Outcome::Created, Some(created)))
}
