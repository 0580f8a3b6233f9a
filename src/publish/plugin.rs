//! A scheduler's publisher as a plug-in: built when its flags turn it on, and finding and
//! removing what it left in the cluster (for `retire`, when its feature is turned off, and for
//! `uninstall`). Adding a scheduler is one file implementing [`Plugin`] (with its flags, flattened
//! into [`super::PublishArgs`], and its `uninstall` flags, if any, into
//! [`super::UninstallFlags`]) and one entry in [`super::PLUGINS`].
//!
//! Owns: the shape of a plug-in and of what it leaves ([`Item`], [`Scope`], [`Purpose`]), and
//! the list and delete calls the plug-ins share ([`labelled`], [`delete`]). Never decides what
//! to remove (each plug-in does, through [`Plugin::leftovers`] and [`Plugin::remove`]).

use std::sync::Arc;

use futures::future::BoxFuture;
use kube::{
    Api, Client, ResourceExt,
    api::{ApiResource, DeleteParams, DynamicObject, ListParams},
};
use serde::Serialize;

use super::{PublishArgs, Publisher, owner};
use crate::{labels::LabelScheme, leader::Leadership, metrics::Metrics};

/// What every publisher is built from.
pub(crate) struct Setup<'a> {
    pub client: &'a Client,
    pub args: &'a PublishArgs,
    /// This installation's Lease (`<namespace>/<name>`), marked on what is ours.
    pub owner: &'a str,
    pub scheme: &'a LabelScheme,
    /// How Slurm's files are drawn.
    pub(crate) slurm_files: &'a crate::slurm::Files,
    pub metrics: &'a Arc<Metrics>,
    pub events: &'a crate::admin::events::Events,
    pub leader: &'a Leadership,
}

/// One scheduler's publisher.
pub(crate) trait Plugin: Sync {
    /// The kind its objects are listed under (`hypernode`, `kueue-topology`, ...).
    fn kind(&self) -> &'static str;
    /// Its publishers (none, one, or more when parts of it read different inputs), as
    /// `setup.args` turns it on; a malformed flag of its own is an error.
    fn build(&self, setup: &Setup<'_>) -> Result<Vec<Box<dyn Publisher>>, String>;
    /// What it left in the cluster, each to remove or kept with why: for `purpose`, of the
    /// objects `scope` takes as this installation's.
    fn leftovers<'a>(
        &'a self,
        client: &'a Client,
        scope: Scope<'a>,
        purpose: Purpose<'a>,
    ) -> BoxFuture<'a, Result<Vec<Item>, kube::Error>>;
    /// Remove one of its objects, by the name it was listed under (already gone: done).
    fn remove<'a>(
        &'a self,
        client: &'a Client,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Removed, kube::Error>>;
}

/// What a removal came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Removed {
    /// Gone (or gone already).
    Gone,
    /// Marked for deletion, and kept by the API server until these finalizers are taken off by
    /// the controllers that put them there (Kueue's `kueue.x-k8s.io/resource-in-use` on a
    /// Topology: taken off by Kueue, while it runs, once no ResourceFlavor names the Topology).
    Held(Vec<String>),
}

impl Removed {
    /// What a delete call answered: the object itself while finalizers hold it, a Status once
    /// gone; a 404 is gone already.
    pub(crate) fn of<K: kube::Resource>(
        r: Result<either::Either<K, kube::core::Status>, kube::Error>,
    ) -> Result<Self, kube::Error> {
        match r {
            Ok(either::Either::Left(o))
                if !o
                    .meta()
                    .finalizers
                    .as_deref()
                    .unwrap_or_default()
                    .is_empty() =>
            {
                Ok(Removed::Held(
                    o.meta().finalizers.clone().unwrap_or_default(),
                ))
            }
            Ok(_) => Ok(Removed::Gone),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(Removed::Gone),
            Err(e) => Err(e),
        }
    }
}

/// Why a plug-in's leftovers are looked for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Purpose<'a> {
    /// `retire` (the chart's post-upgrade hook): its feature is off in these flags (a plug-in
    /// whose feature is on has no leftovers). What cannot hurt a running workload goes; what a
    /// workload or another component may still name is listed as kept, with why.
    TurnedOff(&'a PublishArgs),
    /// `uninstall`: everything of this installation's.
    Uninstall(&'a Uninstall<'a>),
}

/// What `uninstall` was told, for the plug-ins.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Uninstall<'a> {
    /// Remove even what is still named (a Kueue Topology a ResourceFlavor names).
    pub(crate) force: bool,
    /// Each plug-in's own flags.
    pub(crate) flags: &'a super::UninstallFlags,
}

/// One thing of ours, and what happens to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Item {
    /// `condition`, `hypernode`, `kueue-topology`, `kai-topology`, `configmap`, `lease`,
    /// `labels`.
    pub kind: &'static str,
    /// `NAME` or `NAMESPACE/NAME` (for `condition` and `labels`: the node).
    pub name: String,
    /// Kept, and why (`None`: removed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kept: Option<String>,
}

impl Item {
    pub fn remove(kind: &'static str, name: impl Into<String>) -> Self {
        Self {
            kind,
            name: name.into(),
            kept: None,
        }
    }

    pub fn keep(kind: &'static str, name: impl Into<String>, why: impl Into<String>) -> Self {
        Self {
            kind,
            name: name.into(),
            kept: Some(why.into()),
        }
    }
}

/// Which of the scheduler objects of our label a cleanup takes as its own.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Scope<'a> {
    /// The running controller: only those annotated as this installation's (its Lease,
    /// `<namespace>/<name>`; the chart's admission policy refuses its ServiceAccount any other).
    Annotated(&'a str),
    /// `uninstall`, under its own ServiceAccount: also those without the annotation (written by
    /// hand or by a build before it), never another installation's.
    Labelled(&'a str),
}

impl Scope<'_> {
    /// Whether `o` is ours in this scope: `Ok` when it is, `Err(Some(why))` when it is kept
    /// and listed (`uninstall` lists another installation's), `Err(None)` when it is not ours
    /// to list (the controller leaves anything not annotated as its own out).
    pub(crate) fn ours(&self, o: &DynamicObject) -> Result<(), Option<String>> {
        match (self, owner::claim(o, self.installation())) {
            (_, owner::Claim::Ours) | (Scope::Labelled(_), owner::Claim::Unclaimed) => Ok(()),
            (Scope::Annotated(_), _) => Err(None),
            (Scope::Labelled(_), owner::Claim::Other(owner)) => Err(Some(format!(
                "another installation's ({owner}, annotation {}): if it is this installation's under an older Lease, pass that Lease's --leader-election-lease-name and --leader-election-namespace",
                owner::OWNER
            ))),
        }
    }

    fn installation(&self) -> &str {
        let (Scope::Annotated(me) | Scope::Labelled(me)) = *self;
        me
    }

    /// `o` as an item of `kind`: removed, or kept with why; `None` when not ours to list.
    pub(crate) fn item(&self, kind: &'static str, o: &DynamicObject) -> Option<Item> {
        match self.ours(o) {
            Ok(()) => Some(Item::remove(kind, o.name_any())),
            Err(Some(why)) => Some(Item::keep(kind, o.name_any(), why)),
            Err(None) => None,
        }
    }
}

/// Objects per page of the lists of our scheduler objects (HyperNodes are one per network node:
/// thousands in a large fleet, never one response).
pub(crate) const PAGE: u32 = 500;

/// Objects of `ar` (cluster-scoped) with our managed-by label, page by page; none when the API
/// is not served.
pub(crate) async fn labelled(
    client: &Client,
    ar: &ApiResource,
) -> Result<Vec<DynamicObject>, kube::Error> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), ar);
    let mut out = Vec::new();
    let listed = crate::client::pages::each_page(
        ListParams::default().labels(&owner::selector()),
        PAGE,
        |p| {
            let api = api.clone();
            async move { api.list(&p).await }
        },
        |items| out.extend(items),
    )
    .await;
    match listed {
        Ok(()) => Ok(out),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// Delete the cluster-scoped object `name` of `ar` (`None`: the API is not served; nothing to
/// delete); already gone is done.
pub(crate) async fn delete(
    client: &Client,
    ar: Option<ApiResource>,
    name: &str,
) -> Result<Removed, kube::Error> {
    let Some(ar) = ar else {
        return Ok(Removed::Gone);
    };
    Removed::of(
        Api::<DynamicObject>::all_with(client.clone(), &ar)
            .delete(name, &DeleteParams::default())
            .await,
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use clap::Parser;
    use http::{Request, Response};
    use kube::client::Body;

    use super::*;
    use crate::publish::{PLUGINS, Publishers};

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        publish: PublishArgs,
    }

    pub(crate) fn flags(args: &[&str]) -> PublishArgs {
        Flags::try_parse_from(std::iter::once("t").chain(args.iter().copied()))
            .expect("flags parse")
            .publish
    }

    const ALL_ON: [&str; 8] = [
        "--kueue-topology",
        "true",
        "--kai-topology",
        "true",
        "--volcano-hypernodes",
        "true",
        "--slurm-topology-configmap",
        "slurm/topology",
    ];

    /// A client whose API server answers nothing: any request fails.
    pub(crate) fn unreachable() -> Client {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        drop(handle);
        Client::new(service, "default")
    }

    /// A delete answered with the object (finalizers hold it) is held by them, by name; one
    /// answered with a Status, or a 404, is gone; any other error stays an error.
    #[test]
    fn a_removal_held_by_finalizers_says_which() {
        use k8s_openapi::api::coordination::v1::Lease;
        let held = |finalizers: Option<Vec<String>>| {
            let mut l = Lease::default();
            l.metadata.finalizers = finalizers;
            Removed::of::<Lease>(Ok(either::Either::Left(l))).map_err(|e| e.to_string())
        };
        let f = "kueue.x-k8s.io/resource-in-use".to_string();
        assert_eq!(held(Some(vec![f.clone()])), Ok(Removed::Held(vec![f])));
        assert_eq!(held(None), Ok(Removed::Gone));
        assert_eq!(held(Some(Vec::new())), Ok(Removed::Gone));
        let status = |code: u16| {
            kube::Error::Api(Box::new(
                kube::core::Status::failure("x", "NotFound").with_code(code),
            ))
        };
        assert_eq!(
            Removed::of::<Lease>(Err(status(404))).map_err(|e| e.to_string()),
            Ok(Removed::Gone)
        );
        assert!(Removed::of::<Lease>(Err(status(403))).is_err());
        assert_eq!(
            Removed::of::<Lease>(Ok(either::Either::Right(kube::core::Status::success())))
                .map_err(|e| e.to_string()),
            Ok(Removed::Gone)
        );
    }

    fn built(args: &PublishArgs) -> Result<Option<Vec<&'static str>>, String> {
        let (client, metrics) = (unreachable(), Arc::new(Metrics::new()));
        let publishers = Publishers::new(
            &client,
            args,
            "ns/lease",
            &LabelScheme::default(),
            crate::slurm::Files {
                tree_topology: "default".into(),
                switches_only: false,
            },
            &metrics,
            crate::admin::events::Events::default(),
            &Leadership::always(),
        )?;
        Ok(publishers.map(|p| p.names()))
    }

    #[test]
    fn each_kind_is_one_plugins_and_none_is_cleanups_own() {
        let kinds: Vec<&str> = PLUGINS.iter().map(|p| p.kind()).collect();
        let distinct: std::collections::BTreeSet<&str> = kinds.iter().copied().collect();
        assert_eq!(distinct.len(), kinds.len(), "{kinds:?}");
        for own in ["condition", "lease", "labels"] {
            assert!(!distinct.contains(own), "{own} is cleanup's");
        }
    }

    #[tokio::test]
    async fn the_flags_build_the_publishers_they_turn_on_in_order() {
        assert_eq!(built(&flags(&[])), Ok(None));
        // Kueue's two: the Topologies every node fits, and (--ultraserver-level=auto) the
        // UltraServer members' once one is seen; last, the UltraServers checked against the
        // NVLink cliques (wherever something is published, unless the level is never).
        assert_eq!(
            built(&flags(&ALL_ON)),
            Ok(Some(vec![
                "kueue",
                "kueue",
                "kai",
                "slurm",
                "volcano",
                "nvlink-cliques"
            ]))
        );
        let never: Vec<&str> = ALL_ON
            .iter()
            .copied()
            .chain(["--ultraserver-level", "never"])
            .collect();
        assert_eq!(
            built(&flags(&never)),
            Ok(Some(vec!["kueue", "kai", "slurm", "volcano"]))
        );
        assert_eq!(
            built(&flags(&["--volcano-hypernodes", "true"])),
            Ok(Some(vec!["volcano", "nvlink-cliques"]))
        );
        let bad = built(&flags(&["--slurm-topology-configmap", "no-slash"]));
        assert!(
            bad.as_ref()
                .is_err_and(|e| e.contains("is not NAMESPACE/NAME")),
            "{bad:?}"
        );
    }

    #[tokio::test]
    async fn a_feature_turned_on_leaves_nothing_and_asks_nothing() {
        // The API server answers nothing: a plug-in that asked would fail.
        let (client, args) = (unreachable(), flags(&ALL_ON));
        for p in PLUGINS {
            let left = p
                .leftovers(
                    &client,
                    Scope::Annotated("ns/lease"),
                    Purpose::TurnedOff(&args),
                )
                .await;
            assert!(
                left.as_ref().is_ok_and(Vec::is_empty),
                "{}: {left:?}",
                p.kind()
            );
        }
    }

    #[tokio::test]
    async fn uninstall_asks_the_api_server() {
        // With nothing answering, every plug-in but a Slurm told `none` reports the failure.
        let client = unreachable();
        let flags = crate::publish::UninstallFlags {
            volcano: crate::publish::volcano::VolcanoUninstallFlags {
                volcano_hypernode_prefix: "ec2tl".into(),
            },
            slurm: crate::publish::slurm::SlurmUninstallFlags {
                slurm_topology_configmap: Some(crate::publish::slurm::ConfigMaps::None),
            },
        };
        let told = Uninstall {
            force: false,
            flags: &flags,
        };
        for p in PLUGINS {
            let left = p
                .leftovers(
                    &client,
                    Scope::Labelled("ns/lease"),
                    Purpose::Uninstall(&told),
                )
                .await;
            if p.kind() == "configmap" {
                assert!(left.as_ref().is_ok_and(Vec::is_empty), "{left:?}");
            } else {
                assert!(left.is_err(), "{}: {left:?}", p.kind());
            }
        }
    }
}
