//! Whose a published object is: the label on everything this controller publishes (HyperNodes,
//! Kueue and KAI Topologies, Slurm ConfigMaps) and the annotation naming the installation that
//! wrote it, shared by every publisher, `cleanup`, `uninstall` and `retire`.
//!
//! Owns: [`MANAGED_BY`], [`OWNER`] and reading a claim. Never talks to the API server.

use kube::{ResourceExt, api::DynamicObject};

use crate::FIELD_MANAGER;

/// Label on every object we publish. Never Volcano's own `volcano.sh/network-topology-source`:
/// Volcano's label discovery deletes HyperNodes carrying that label that it did not find.
pub(crate) const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", FIELD_MANAGER);

/// Annotation naming the installation that wrote an object: its Lease, `<namespace>/<name>`
/// (two installations in one cluster cannot share one, or they would be one installation).
/// Our label and name prefix alone do not tell two installations apart when they share a prefix.
pub(crate) const OWNER: &str = "ec2-topology-labeler.io/owner";

/// `MANAGED_BY` as a label selector.
pub(crate) fn selector() -> String {
    format!("{}={}", MANAGED_BY.0, MANAGED_BY.1)
}

/// Whose an object of our label (and name prefix) is, to the installation `me`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Claim {
    /// Annotated with `me`.
    Ours,
    /// Not annotated (written by hand, or by a build before the annotation): not ours to change
    /// or delete; annotating it with our Lease makes it ours.
    Unclaimed,
    /// Annotated with another installation's Lease: never written or deleted.
    Other(String),
}

/// The claim on `object` of the installation `me`.
pub(crate) fn claim(object: &DynamicObject, me: &str) -> Claim {
    match object.annotations().get(OWNER).map(String::as_str) {
        None | Some("") => Claim::Unclaimed,
        Some(o) if o == me => Claim::Ours,
        Some(o) => Claim::Other(o.to_string()),
    }
}
