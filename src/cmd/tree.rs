//! `tree`: the cluster's topology as its labels describe it (reads Nodes, and EC2 with
//! `--reservations`; writes nothing).
//!
//! Owns: the `tree` output. Never writes to the cluster.

use crate::bounds::Bound;
use std::io::Write;

use clap::{Args, ValueEnum};
use k8s_openapi::api::core::v1::Node;
use kube::{Api, ResourceExt, api::ListParams};

use crate::{
    Error, Result,
    coverage::Coverage,
    flags::{LabelArgs, OwnFlags},
    node::LiteNode,
    picture,
    reconcile::gate::{self, StartupTaint},
    tree::{Forest, NodeView},
    vouch::Unvouched,
};

/// `--min-labelled`'s range.
pub(crate) const MIN_LABELLED_RANGE: Bound = Bound::count("min-labelled", 0, 10_000_000);

#[derive(Debug, Clone, Args)]
pub struct TreeArgs {
    #[command(flatten)]
    pub labels: LabelArgs,
    /// Nodes still carrying the startup taint are pointed out (unset: the chart's).
    #[command(flatten)]
    pub taint: crate::reconcile::gate::StartupTaintFlag,
    /// Output format: the tree, JSON, a picture (`dot`: Graphviz, `dot -Tsvg`; `mermaid`: a
    /// Mermaid flowchart, drawn where Markdown is), or Slurm's topology file (`slurm`:
    /// `topology.conf` for the tree plugin; `slurm-yaml`: `topology.yaml`, Slurm 25.05 and later).
    #[arg(
        short = 'o',
        long = "output",
        env = "LABELER_OUTPUT",
        value_enum,
        default_value_t
    )]
    pub output: TreeFormat,
    /// Fail (exit status 1, after printing) when fewer than this many nodes carry complete
    /// topology labels: the chart's `helm test` runs `tree --min-labelled=1` in the cluster.
    #[arg(long, value_parser = MIN_LABELLED_RANGE.counts::<usize>(), env = "LABELER_MIN_LABELLED", default_value_t = 0)]
    pub(crate) min_labelled: usize,
    /// Draw every node's topology labels as found. By default, when the controller's ledger
    /// (beside its Lease) can be read and holds verification records, a node whose labels no
    /// record vouches for (labelled by hand or by
    /// another tool, or rewritten since the controller verified them) is listed without
    /// topology and says why, as the controller leaves it out of what it publishes. (Read
    /// without the record key: only the controller can tell a forged record.)
    #[arg(long, env = "LABELER_INCLUDE_UNVERIFIED")]
    pub(crate) include_unverified: bool,
    /// Instead of the tree: the account's Capacity Reservations under the network nodes EC2
    /// places them at (known before any instance runs), with instances reserved, in use, and
    /// the nodes that joined from each (by Karpenter's
    /// `karpenter.k8s.aws/capacity-reservation-id` label). Asks EC2 with the AWS credentials at
    /// hand: needs `ec2:DescribeCapacityReservationTopology` and
    /// `ec2:DescribeCapacityReservations`. Table or JSON.
    #[arg(long, env = "LABELER_TREE_RESERVATIONS")]
    pub reservations: bool,
    /// The region whose reservations `--reservations` shows; by default each region the nodes'
    /// `topology.kubernetes.io/region` labels name.
    #[arg(long, env = "AWS_REGION", value_parser = crate::lookup::ec2::parse_region)]
    pub region: Option<String>,
    /// Where the Lease is: the verification ledger's shards are beside it (read, when this
    /// identity may, to tell which labels a record vouches for).
    #[command(flatten)]
    pub leader: crate::leader::LeaderArgs,
    #[command(flatten)]
    pub own: OwnFlags,
}

/// What `tree` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum TreeFormat {
    #[default]
    Table,
    Json,
    Dot,
    Mermaid,
    Slurm,
    SlurmYaml,
}

fn ready(node: &Node) -> Option<bool> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status == "True")
}

/// The node's startup taint and `TopologyLabeled` condition, in words, and whether it carries
/// the taint.
fn note(taint: Option<&StartupTaint>, node: &Node) -> (Option<String>, bool) {
    // Read as the controller reads it (taints, our condition only).
    let Ok(lite) = serde_json::to_value(node).and_then(serde_json::from_value::<LiteNode>) else {
        return (None, false);
    };
    (gate::note(taint, &lite), taint.is_some_and(|t| t.on(&lite)))
}

/// `args` with the running controller's label keys and startup taint (`tree` run in its
/// container with `kubectl exec`).
pub fn adopt(args: TreeArgs, run: crate::flags::RunArgs) -> TreeArgs {
    TreeArgs {
        labels: run.labels,
        taint: run.gate.taint,
        leader: run.leader,
        ..args
    }
}

/// The taint `tree` points out: the controller's when run in its container (none when it runs
/// without one), else the one given, else the chart's.
fn taint_to_point_out(given: Option<StartupTaint>, adopted: bool) -> Option<StartupTaint> {
    given.or_else(|| {
        (!adopted)
            .then(|| crate::reconcile::gate::CHART_TAINT.parse().ok())
            .flatten()
    })
}

/// Whether a verification record vouches for `node`'s topology labels (see
/// [`crate::vouch`]): the ledger's (`ledger`), or else the one an earlier version left on the
/// node; a node without any topology label is not asked.
fn vouch(
    scheme: &crate::labels::LabelScheme,
    node: &Node,
    ledger: &std::collections::HashMap<String, crate::verified::Verified>,
) -> Result<(), Unvouched> {
    let labels = node.labels();
    if !labels.keys().any(|k| scheme.layer_index(k).is_some()) {
        return Ok(());
    }
    let provider_id = node
        .spec
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .unwrap_or_default();
    let boot_id = node
        .status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .map(|i| i.boot_id.as_str());
    match ledger.get(&node.name_any()) {
        Some(v) => crate::vouch::vouched_by(scheme, labels, v, provider_id, boot_id),
        None => crate::vouch::vouched(
            scheme,
            labels,
            node.annotations()
                .get(crate::verified::VERIFIED_KEY)
                .map(String::as_str),
            provider_id,
            boot_id,
        ),
    }
}

/// Draw the nodes no record vouches for without topology, each saying why, as the controller
/// leaves them out of what it publishes; said once on stderr. Only when the controller's ledger
/// was read and holds records: without them (records off, no controller yet, no access) the
/// labels are drawn as found.
fn leave_out_unvouched(
    scheme: &crate::labels::LabelScheme,
    views: &mut [NodeView],
    vouching: &[Result<(), Unvouched>],
) {
    let mut left = 0;
    for (view, why) in views.iter_mut().zip(vouching) {
        if let Err(why) = why {
            view.labels.retain(|k, _| !scheme.is_family_label(k));
            let said = format!("topology labels with {}: left out", why.explain());
            view.note = Some(match view.note.take() {
                Some(n) => format!("{n}; {said}"),
                None => said,
            });
            left += 1;
        }
    }
    if left > 0 {
        eprintln!(
            "{left} node(s) carry topology labels no verification record vouches for: listed without topology (--include-unverified draws their labels as found)"
        );
    }
}

pub async fn run(args: TreeArgs) -> Result<()> {
    let (args, adopted) = match crate::flags::in_the_controllers_container(&args.own) {
        Some(run) => (adopt(args, run), true),
        None => (args, false),
    };
    let taint = taint_to_point_out(args.taint.startup_taint.clone(), adopted);
    let scheme = args.labels.scheme().map_err(Error::Config)?;
    let client = crate::client::connect_default().await?;
    let api: Api<Node> = Api::all(client.clone());
    // The ledger's records, when this identity may read them (the controller's may; `helm
    // test`'s may not): without them, only records an earlier version left on nodes are seen.
    let ledger = if args.include_unverified || args.reservations {
        Default::default()
    } else {
        match crate::ledger::keep::every_record(&client, &args.leader).await {
            Ok(records) => records,
            Err(e) => {
                eprintln!(
                    "cannot read the verification ledger ({e}): every node's topology labels are drawn as found"
                );
                Default::default()
            }
        }
    };
    let ledger = &ledger;
    let mut views = Vec::new();
    let api = &api;
    // Per node: whether a verification record vouches for its labels (read without the key).
    let mut vouching: Vec<Result<(), Unvouched>> = Vec::new();
    crate::client::pages::each_page(
        ListParams::default(),
        crate::client::pages::PAGE,
        |p| async move { api.list(&p).await },
        |items| {
            views.extend(items.iter().map(|n| {
                let (note, tainted) = note(taint.as_ref(), n);
                vouching.push(vouch(&scheme, n, ledger));
                NodeView {
                    name: n.name_any(),
                    ready: ready(n),
                    labels: n.labels().clone(),
                    note,
                    tainted,
                }
            }))
        },
    )
    .await?;
    // Only against a ledger read whole and not empty: without it (no read access, another
    // namespace, records off) a node's missing record says nothing.
    if !args.include_unverified && !args.reservations && !ledger.is_empty() {
        leave_out_unvouched(&scheme, &mut views, &vouching);
    }
    if args.reservations {
        let text = reservations(&args, &views).await?;
        std::io::stdout().write_all(text.as_bytes())?;
        return Ok(());
    }
    let forest = Forest::build(&scheme, &views);
    let coverage = Coverage::build(&scheme, &views);
    let text = match args.output {
        TreeFormat::Table => format!("{}\n{}", forest.render(), coverage.render()),
        TreeFormat::Dot => picture::dot(&forest),
        TreeFormat::Mermaid => picture::mermaid(&forest),
        TreeFormat::Slurm | TreeFormat::SlurmYaml => {
            let files = crate::publish::slurm::Files {
                tree_topology: args.labels.slurm_topology_name.clone(),
                switches_only: args.labels.slurm_switches_only,
            };
            let data =
                crate::publish::slurm::data(&scheme, &files, &views).map_err(|problems| {
                    let list: Vec<String> = problems.iter().map(|p| format!("  {p}")).collect();
                    Error::Config(format!(
                        "the labels give no Slurm topology slurmctld would load:\n{}",
                        list.join("\n")
                    ))
                })?;
            let want = match args.output {
                TreeFormat::Slurm => "topology.conf",
                _ => "topology.yaml",
            };
            match data.into_iter().find(|(k, _)| k == want) {
                Some((_, text)) => text,
                None => {
                    return Err(Error::Config(
                        "no topology.conf in switches-only mode (--slurm-switches-only): use -o slurm-yaml".into(),
                    ));
                }
            }
        }
        TreeFormat::Json => {
            #[derive(serde::Serialize)]
            struct Out<'a> {
                #[serde(flatten)]
                forest: &'a Forest,
                coverage: &'a Coverage,
            }
            let out = Out {
                forest: &forest,
                coverage: &coverage,
            };
            let mut s = serde_json::to_string_pretty(&out)
                .map_err(|e| Error::Config(format!("cannot render JSON: {e}")))?;
            s.push('\n');
            s
        }
    };
    std::io::stdout().write_all(text.as_bytes())?;
    let labelled = forest.nodes_labelled();
    if labelled < args.min_labelled {
        return Err(Error::Config(format!(
            "{labelled} of {} nodes carry complete topology labels; --min-labelled asks for {}",
            views.len(),
            args.min_labelled
        )));
    }
    Ok(())
}

/// The node label naming a node's region (set by the cloud provider).
const REGION_LABEL: &str = "topology.kubernetes.io/region";

/// `tree --reservations`: the reservations of `args.region`, or of each region the nodes name,
/// beside the nodes that joined from them.
async fn reservations(args: &TreeArgs, views: &[NodeView]) -> Result<String> {
    use crate::reservations::{Member, RESERVATION_LABEL, view};
    if !matches!(args.output, TreeFormat::Table | TreeFormat::Json) {
        return Err(Error::Config(format!(
            "--reservations prints a table or JSON, not {:?} (-o table or -o json)",
            args.output
        )));
    }
    let regions: std::collections::BTreeSet<String> = match &args.region {
        Some(region) => [region.clone()].into(),
        None => views
            .iter()
            .filter_map(|v| v.labels.get(REGION_LABEL))
            .filter(|r| crate::provider_id::is_region_name(r))
            .cloned()
            .collect(),
    };
    if regions.is_empty() {
        return Err(Error::Config(format!(
            "--reservations: no node names its region ({REGION_LABEL}); say which with --region"
        )));
    }
    let ec2 = crate::lookup::ec2::AwsTopology::from_env(std::time::Duration::from_secs(10)).await;
    let mut all = Vec::new();
    for region in &regions {
        all.extend(ec2.reservations(region).await?);
    }
    let members: Vec<Member> = views
        .iter()
        .map(|v| Member {
            name: v.name.clone(),
            reservation: v.labels.get(RESERVATION_LABEL).cloned(),
        })
        .collect();
    let shown = view(&all, &members);
    match args.output {
        TreeFormat::Table => Ok(shown.render()),
        TreeFormat::Json => {
            let mut s = serde_json::to_string_pretty(&shown)
                .map_err(|e| Error::Config(format!("cannot render JSON: {e}")))?;
            s.push('\n');
            Ok(s)
        }
        // Refused before EC2 was asked (above).
        _ => Err(Error::Config(
            "--reservations prints a table or JSON".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 55.1: with records in the cluster, a node no record vouches for is drawn without
    /// topology and says why; the others are drawn as they are.
    #[test]
    fn nodes_no_record_vouches_for_are_left_out_when_records_exist() {
        let s = crate::labels::LabelScheme::default();
        let views = || {
            vec![
                NodeView::labelled("ok", &s, &["nn-s", "nn-a", "nn-l"]),
                NodeView::labelled("forged", &s, &["nn-s", "nn-b", "nn-l"]),
            ]
        };
        let mut v = views();
        leave_out_unvouched(&s, &mut v, &[Ok(()), Err(Unvouched::NoRecord)]);
        let forest = Forest::build(&s, &v);
        assert_eq!(forest.nodes_labelled(), 1);
        assert!(
            forest.conflicts.is_empty(),
            "the forged parent is not drawn"
        );
        assert_eq!(forest.missing, ["forged"]);
        assert!(
            forest.missing_notes["forged"].contains("no verification record"),
            "{:?}",
            forest.missing_notes
        );
    }

    #[test]
    fn points_out_the_given_taint_else_the_charts_unless_the_controller_has_none() {
        let chart: StartupTaint = crate::reconcile::gate::CHART_TAINT
            .parse()
            .expect("the chart's taint parses");
        let given: StartupTaint = "example.com/wait:NoExecute".parse().expect("parses");
        assert_eq!(taint_to_point_out(None, false), Some(chart));
        assert_eq!(
            taint_to_point_out(Some(given.clone()), false),
            Some(given.clone())
        );
        // In the controller's container its own setting holds: none is none.
        assert_eq!(taint_to_point_out(None, true), None);
        assert_eq!(taint_to_point_out(Some(given.clone()), true), Some(given));
    }
}
