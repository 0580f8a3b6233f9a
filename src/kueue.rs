//! A Kueue `Topology` whose levels are our labels, created and owned by us.
//!
//! Kueue's levels are immutable: an existing Topology with other levels is never changed, only
//! reported (log, Event, metric). `kueue.x-k8s.io/v1beta2` is used where served, else `v1beta1`.

use kube::{
    Api, Client, Resource,
    api::{ApiResource, DynamicObject, Patch, PatchParams},
    discovery::{Discovery, verbs},
};
use serde_json::{Value, json};

use crate::{
    FIELD_MANAGER,
    labels::{LabelScheme, LayerNumbering},
};

pub const GROUP: &str = "kueue.x-k8s.io";
pub const HOSTNAME: &str = "kubernetes.io/hostname";

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

/// The Topology object to apply.
pub fn topology_object(api_version: &str, name: &str, levels: &[String]) -> Value {
    let levels: Vec<Value> = levels.iter().map(|l| json!({ "nodeLabel": l })).collect();
    json!({
        "apiVersion": api_version,
        "kind": "Topology",
        "metadata": {
            "name": name,
            "labels": { crate::volcano::MANAGED_BY.0: crate::volcano::MANAGED_BY.1 }
        },
        "spec": { "levels": levels }
    })
}

/// Levels of a Topology object.
pub fn levels_of(obj: &DynamicObject) -> Vec<String> {
    obj.data["spec"]["levels"]
        .as_array()
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
}

/// The Topology API the cluster serves, preferring v1beta2.
pub async fn topology_resource(client: &Client) -> Result<Option<ApiResource>, kube::Error> {
    let discovery = Discovery::new(client.clone())
        .filter(&[GROUP])
        .run()
        .await?;
    let Some(group) = discovery.groups().find(|g| g.name() == GROUP) else {
        return Ok(None);
    };
    for version in ["v1beta2", "v1beta1"] {
        if let Some((ar, caps)) = group
            .versioned_resources(version)
            .into_iter()
            .find(|(ar, _)| ar.kind == "Topology")
            && caps.supports_operation(verbs::PATCH)
        {
            return Ok(Some(ar));
        }
    }
    Ok(None)
}

/// Create the Topology if it is missing; never change an existing one's levels.
pub async fn ensure(
    client: &Client,
    name: &str,
    levels: &[String],
) -> Result<(Outcome, Option<DynamicObject>), kube::Error> {
    let Some(ar) = topology_resource(client).await? else {
        return Ok((Outcome::NotServed, None));
    };
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    if let Some(existing) = api.get_opt(name).await? {
        let have = levels_of(&existing);
        return Ok(if have == levels {
            (Outcome::UpToDate, Some(existing))
        } else {
            (Outcome::Mismatch { have }, Some(existing))
        });
    }
    let obj = topology_object(&ar.api_version, name, levels);
    let created = api
        .patch(name, &PatchParams::apply(FIELD_MANAGER), &Patch::Apply(obj))
        .await?;
    Ok((Outcome::Created, Some(created)))
}

/// A reference for Events about the Topology.
pub fn object_ref(
    obj: &DynamicObject,
    ar: &ApiResource,
) -> k8s_openapi::api::core::v1::ObjectReference {
    obj.object_ref(ar)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_are_coarsest_first_and_end_with_the_hostname() {
        let s = LabelScheme::default();
        assert_eq!(
            levels(&s, 3, true),
            vec![
                "topology.k8s.aws/network-node-layer-1",
                "topology.k8s.aws/network-node-layer-2",
                "topology.k8s.aws/network-node-layer-3",
                "kubernetes.io/hostname"
            ]
        );
        assert_eq!(levels(&s, 4, false).len(), 4);
        let leaf_first = LabelScheme {
            numbering: LayerNumbering::LeafFirst,
            layer_prefix: "example.com/tier-".into(),
            ..LabelScheme::default()
        };
        assert_eq!(
            levels(&leaf_first, 3, false),
            vec![
                "example.com/tier-3",
                "example.com/tier-2",
                "example.com/tier-1"
            ]
        );
    }

    #[test]
    fn the_object_names_its_levels_in_order() {
        let obj = topology_object(
            "kueue.x-k8s.io/v1beta2",
            "aws-network",
            &levels(&LabelScheme::default(), 3, true),
        );
        assert_eq!(
            obj["spec"]["levels"][3]["nodeLabel"],
            "kubernetes.io/hostname"
        );
        assert_eq!(obj["kind"], "Topology");
        let dynamic: DynamicObject = serde_json::from_value(obj).unwrap();
        assert_eq!(levels_of(&dynamic).len(), 4);
    }
}
