//! `explain NODE`: why a node has (or lacks) its topology labels, in one place. Run it where the
//! controller runs (`kubectl exec` into the leader's Pod) and it reads the same configuration as
//! the controller: the flags the chart passes to the container's first process, read from
//! `/proc/1/cmdline` (elsewhere, the flags and environment given to `explain` itself):
//!
//! - the Node: its providerID, how it parses, its labels, taints and condition;
//! - the controller's own view, from its admin server on loopback (`/debug/nodes/NODE`): where
//!   it stands (state and reason), failures and the last error, when it looks again, what its EC2
//!   cache holds and how old it is — or, on a follower, which replica leads;
//! - EC2's answer now (one call, like `plan`), the labels it gives, what would change, and what
//!   the startup taint and condition would become;
//! - a verdict in one sentence.
//!
//! Owns: the report. Never writes to the cluster; the admin endpoint answers loopback only.

use std::{io::Write, net::SocketAddr, sync::Arc, time::Duration};

use clap::Args;
use k8s_openapi::api::{coordination::v1::Lease, core::v1::Node};
use kube::{Api, Client, ResourceExt};
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{
    Error, Result,
    flags::{
        DecideArgs, LeaderArgs, Output, OutputFormat, OwnFlags, RunArgs,
        in_the_controllers_container,
    },
    lookup::lookup_from,
    node::LiteNode,
    node::watch::prune,
    provider_id,
    reconcile::gate::Gate,
    reconcile::planning::{NodePlan, plan_nodes},
    reconcile::view::ControllerView,
};

#[derive(Debug, Clone, Args)]
pub struct ExplainArgs {
    /// The node's name.
    pub node: String,
    #[command(flatten)]
    pub decide: DecideArgs,
    /// Where to find the Lease, to name the leader.
    #[command(flatten)]
    pub leader: LeaderArgs,
    /// Where the controller serves its view of the nodes (`run`'s `--debug-addr`; in the
    /// controller's Pod its own value is used).
    #[arg(long, env = "LABELER_DEBUG_ADDR", default_value = "127.0.0.1:8081")]
    pub debug_addr: std::net::SocketAddr,
    #[command(flatten)]
    pub own: OwnFlags,
    /// Do not ask EC2: show only the node and the controller's view.
    #[arg(long, env = "LABELER_EXPLAIN_NO_EC2", action = clap::ArgAction::SetTrue)]
    pub(crate) no_ec2: bool,
    #[command(flatten)]
    pub output: Output,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    pub node: String,
    pub provider_id: String,
    /// The instance, or why the providerID gives none.
    pub instance: std::result::Result<provider_id::InstanceRef, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance_type: Option<String>,
    /// The holder of the Lease, when leader election is on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leader: Option<String>,
    /// The controller's view, or why it could not be had.
    pub controller: std::result::Result<ControllerView, String>,
    /// What `plan` says about the node now (EC2 asked once), unless `--no-ec2`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub now: Option<NodePlan>,
    /// The node's current topology labels.
    pub labels: std::collections::BTreeMap<String, String>,
    /// What a new leader makes of the node's verification record.
    pub record: String,
    /// Its UltraServer (capacity block) against its NVLink clique, when it is in one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nvlink: Option<String>,
    /// Its UltraServer's shape (`--ultraserver-shape`), when it is in a capacity block.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ultraserver: Option<String>,
    pub verdict: String,
}

/// The node's UltraServer shape as its labels say (`--ultraserver-shape`); `None` unless it is
/// in a capacity block.
fn ultraserver(scheme: &crate::labels::LabelScheme, node: &Node) -> Option<String> {
    use crate::publish::shape::{END_KEY, SIZE_KEY, TYPE_KEY};
    let key = scheme.capacity_block_key.as_deref()?;
    let block = node.labels().get(key).filter(|b| !b.is_empty())?;
    let (kind, size) = (node.labels().get(TYPE_KEY), node.labels().get(SIZE_KEY));
    let end = node.annotations().get(END_KEY);
    if kind.is_none() && size.is_none() && end.is_none() {
        return Some(format!(
            "capacity block {block}; no shape labels (--ultraserver-shape off, or EC2 not asked about the block yet)"
        ));
    }
    let mut parts = vec![format!("capacity block {block}")];
    if let Some(k) = kind {
        parts.push(format!("type {k}"));
    }
    if let Some(n) = size {
        parts.push(format!("{n} instances"));
    }
    if let Some(e) = end {
        parts.push(format!("ends {e}"));
    }
    Some(parts.join(", "))
}

/// The node's capacity block against its NVLink clique (GPU Feature Discovery's label), from
/// the nodes that share either (two label-selected lists); `None` unless it is in a capacity
/// block.
async fn nvlink(
    client: &Client,
    scheme: &crate::labels::LabelScheme,
    node: &Node,
) -> Option<String> {
    use crate::publish::cliques::{CLIQUE_LABEL, mismatches};
    let key = scheme.capacity_block_key.as_deref()?;
    let labels = node.labels();
    let block = labels.get(key).filter(|b| !b.is_empty())?;
    let Some(clique) = labels.get(CLIQUE_LABEL).filter(|c| !c.is_empty()) else {
        return Some(format!(
            "capacity block {block}; no {CLIQUE_LABEL} label (GPU Feature Discovery not installed, or the NVLink fabric not complete yet): not compared"
        ));
    };
    let api: Api<Node> = Api::all(client.clone());
    let mut views: std::collections::BTreeMap<String, crate::tree::NodeView> = Default::default();
    for selector in [format!("{key}={block}"), format!("{CLIQUE_LABEL}={clique}")] {
        let list = match api
            .list_metadata(&kube::api::ListParams::default().labels(&selector))
            .await
        {
            Ok(l) => l,
            Err(e) => return Some(format!("cannot list the nodes with {selector}: {e}")),
        };
        for m in list.items {
            let name = m.name_any();
            views.insert(
                name.clone(),
                crate::tree::NodeView {
                    name,
                    ready: None,
                    labels: m.metadata.labels.unwrap_or_default(),
                    note: None,
                    tainted: false,
                },
            );
        }
    }
    let views: Vec<crate::tree::NodeView> = views.into_values().collect();
    let me = node.name_any();
    let found: Vec<String> = mismatches(scheme, &views)
        .iter()
        .filter(|m| m.nodes().contains(me.as_str()))
        .map(|m| m.note(&me))
        .collect();
    Some(if found.is_empty() {
        format!(
            "capacity block {block} is NVLink clique {clique} ({} nodes)",
            views.len()
        )
    } else {
        found.join("; ")
    })
}

/// Ask the controller on `addr` (its admin server; loopback) for its view of `node`.
async fn ask_controller(
    addr: SocketAddr,
    node: &str,
) -> std::result::Result<ControllerView, String> {
    // A wildcard address is reached on IPv4 loopback (a dual-stack socket takes it too).
    let target = if addr.ip().is_unspecified() {
        SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), addr.port())
    } else {
        addr
    };
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(target).await?;
        // Node names are DNS subdomains: nothing to escape in a path.
        let request = format!(
            "GET /debug/nodes/{node} HTTP/1.0\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        Ok::<_, std::io::Error>(response)
    };
    let response = match tokio::time::timeout(Duration::from_secs(5), exchange).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            return Err(format!(
                "no controller answers on {target} ({e}): run explain inside the controller's Pod (kubectl exec), or pass --debug-addr"
            ));
        }
        Err(_) => {
            return Err(format!(
                "the controller on {target} did not answer within 5s"
            ));
        }
    };
    let text = String::from_utf8_lossy(&response);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| "the controller's answer has no body".to_string())?;
    let status = head.split_whitespace().nth(1).unwrap_or_default();
    match status {
        "200" => serde_json::from_str(body)
            .map_err(|e| format!("cannot read the controller's answer: {e}")),
        "404" => Err(format!(
            "the controller has no node {node} in its cache (deleted, or not seen yet)"
        )),
        other => Err(format!("the controller answered {other}: {}", body.trim())),
    }
}

/// The holder of the Lease, if any.
async fn leader(client: &Client, args: &ExplainArgs) -> Option<String> {
    if !args.leader.leader_election {
        return None;
    }
    let ns = args
        .leader
        .leader_election_namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_string());
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    leases
        .get_opt(&args.leader.leader_election_lease_name)
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec?.holder_identity)
        .filter(|h| !h.is_empty())
}

/// One sentence: why the node has, or lacks, its labels.
pub fn verdict(e: &Explanation) -> String {
    let instance = match &e.instance {
        Ok(i) => i.instance_id.clone(),
        Err(why) => return format!("Not labelled, by design: {why}."),
    };
    if let Ok(view) = &e.controller
        && let Some(r) = &view.record
        && let Some(err) = &r.last_error
    {
        return format!(
            "Failing: the controller's last attempt failed ({err}); labels are left as they are and it retries{}.",
            r.next_look_in_s
                .map(|s| format!(" in {s}s"))
                .unwrap_or_default()
        );
    }
    if let Ok(view) = &e.controller
        && let Some(r) = &view.record
        && r.held_for_conflict
    {
        return "Held: another writer keeps changing our labels on this node; we stopped correcting it for a while (see its TopologyLabelConflict Event).".to_string();
    }
    let Some(plan) = &e.now else {
        return match &e.controller {
            Ok(ControllerView {
                record: Some(r), ..
            }) => format!(
                "The controller says {}{}.",
                r.state.as_deref().unwrap_or("unknown"),
                r.reason
                    .as_deref()
                    .map(|x| format!(" ({x})"))
                    .unwrap_or_default()
            ),
            _ => "EC2 was not asked (--no-ec2) and the controller's view is not available.".into(),
        };
    };
    match plan.status {
        "up-to-date" => format!("Labelled: the labels match EC2's answer for {instance}."),
        "change" => match &e.controller {
            Ok(v) if !v.leading => format!(
                "Labels differ from EC2's answer for {instance}; this replica follows{}: ask the leader.",
                e.leader
                    .as_deref()
                    .map(|l| format!(" (the leader is {l})"))
                    .unwrap_or_default()
            ),
            _ => format!(
                "Labels differ from EC2's answer for {instance}: the controller writes them at its next look at this node (if this persists, see its Events and the controller's log)."
            ),
        },
        "not-described" => match e
            .instance_type
            .as_deref()
            .map(|t| crate::state::NotDescribed::of(Some(t)))
        {
            Some(crate::state::NotDescribed::UnsupportedType) => format!(
                "Not labelled: EC2 describes no network topology for instance type {}; nothing to fix here (only some types have it).",
                e.instance_type.as_deref().unwrap_or_default()
            ),
            _ => format!(
                "Not labelled yet: EC2 does not describe {instance} (not running, too new, or a type without topology); the controller asks again with backoff."
            ),
        },
        "rejected" => format!(
            "Not labelled: EC2 refuses the instance ID {instance} ({}): terminated, in another account or region (check --region), or too new.",
            plan.reason.as_deref().unwrap_or_default()
        ),
        "invalid" => format!(
            "Not labelled: EC2's answer cannot be turned into labels ({}).",
            plan.reason.as_deref().unwrap_or_default()
        ),
        "skipped" => format!(
            "Not labelled, by design: {}.",
            plan.reason.as_deref().unwrap_or_default()
        ),
        _ => format!(
            "Cannot tell: asking EC2 failed ({}).",
            plan.reason.as_deref().unwrap_or_default()
        ),
    }
}

/// `args` with the controller's label, gate, EC2, cache, Lease and admin-address flags.
pub fn adopt(mut args: ExplainArgs, run: RunArgs) -> ExplainArgs {
    args.leader = run.leader.clone();
    args.debug_addr = run.serve.debug_addr;
    args.decide = run.into();
    args
}

pub async fn run(args: ExplainArgs) -> Result<()> {
    let args = match in_the_controllers_container(&args.own) {
        Some(run) => adopt(args, run),
        None => args,
    };
    let scheme = args.decide.labels.scheme().map_err(Error::Config)?;
    let client = crate::client::connect_default().await?;
    let full: Api<Node> = Api::all(client.clone());
    let node = full
        .get_opt(&args.node)
        .await?
        .ok_or_else(|| Error::Config(format!("no node named {:?}", args.node)))?;
    // The Node as the controller reads it (the same pruning as its cache).
    let mut lite: LiteNode = serde_json::to_value(&node)
        .and_then(serde_json::from_value)
        .map_err(|e| Error::Config(format!("cannot read node {}: {e}", args.node)))?;
    prune(&mut lite, &scheme);
    let pid = lite.provider_id().to_string();
    let instance = provider_id::parse(&pid).map_err(|r| r.explain().to_string());
    let instance_type = lite.label(crate::reconcile::gate::INSTANCE_TYPE_LABEL);
    let controller = ask_controller(args.debug_addr, &args.node).await;
    let now = if args.no_ec2 {
        None
    } else {
        let lookup = lookup_from(&args.decide.ec2, &args.decide.lookup, Arc::new(()))
            .await
            .map_err(crate::Error::Config)?;
        let gate = Gate::from(&args.decide.gate);
        plan_nodes(
            std::slice::from_ref(&lite),
            &scheme,
            args.decide.ec2.region.as_deref(),
            &lookup,
            &gate,
        )
        .await
        .pop()
    };
    let labels = lite
        .labels()
        .iter()
        .filter(|(k, _)| scheme.is_family_label(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let key = args.decide.lookup.record_key().map_err(Error::Config)?;
    let record = match crate::reconcile::target(&lite, &scheme, args.decide.ec2.region.as_deref()) {
        Ok(Ok(t)) => {
            match crate::ledger::keep::record_of(&client, &args.leader, &args.node, key.as_ref())
                .await
            {
                Err(why) => format!(
                    "{why}; a new leader judges the record an earlier version left on the node, if any, or asks EC2 at once"
                ),
                Ok(recorded) => {
                    match crate::reconcile::trusted(&lite, &scheme, &t, key.as_ref(), recorded) {
                        Ok(v) => format!(
                            "trusted (EC2 has given this answer for {}s): a new leader takes it, no EC2 call, and asks again within --cache-ttl",
                            crate::lookup::cache::unix_now().saturating_sub(v.at)
                        ),
                        Err(why) => format!(
                            "not trusted: {}; a new leader asks EC2 at once",
                            why.explain()
                        ),
                    }
                }
            }
        }
        _ => "-".into(),
    };
    let mut e = Explanation {
        node: node.name_any(),
        provider_id: pid,
        instance,
        instance_type,
        leader: leader(&client, &args).await,
        controller,
        now,
        labels,
        record,
        nvlink: nvlink(&client, &scheme, &node).await,
        ultraserver: ultraserver(&scheme, &node),
        verdict: String::new(),
    };
    e.verdict = verdict(&e);
    let text = match args.output.format {
        OutputFormat::Table => render(&e, &args),
        OutputFormat::Json => {
            let mut s = serde_json::to_string_pretty(&e)
                .map_err(|err| Error::Config(format!("cannot render JSON: {err}")))?;
            s.push('\n');
            s
        }
    };
    std::io::stdout().write_all(text.as_bytes())?;
    Ok(())
}

/// The report as text, one fact per line, the verdict first.
pub fn render(e: &Explanation, args: &ExplainArgs) -> String {
    let mut out = String::new();
    let mut line = |k: &str, v: String| out.push_str(&format!("{k:<15}{v}\n"));
    line("Node", e.node.clone());
    line("Verdict", e.verdict.clone());
    line(
        "providerID",
        match &e.instance {
            Ok(i) => format!(
                "{:?} -> instance {}{}",
                e.provider_id,
                i.instance_id,
                i.zone
                    .as_deref()
                    .map(|z| format!(" in {z}"))
                    .unwrap_or_default()
            ),
            Err(why) => format!("{:?}: {why}", e.provider_id),
        },
    );
    line(
        "Instance type",
        e.instance_type
            .clone()
            .unwrap_or_else(|| "(no node.kubernetes.io/instance-type label yet)".into()),
    );
    match (&e.leader, &e.controller) {
        (Some(l), Ok(v)) if !v.leading => line(
            "Leader",
            format!(
                "{l} (this replica, {}, follows: for the controller's own view run kubectl exec -n <namespace> {l} -- /app explain {})",
                v.identity, e.node
            ),
        ),
        (Some(l), _) => line("Leader", l.clone()),
        (None, _) if args.leader.leader_election => line("Leader", "none holds the Lease".into()),
        _ => {}
    }
    match &e.controller {
        Ok(v) => {
            let who = format!(
                "{} ({})",
                v.identity,
                if v.leading { "leader" } else { "follower" }
            );
            match &v.record {
                Some(r) => {
                    line(
                        "Controller",
                        format!(
                            "{who}: {}{}, {} failure(s) in a row{}{}",
                            r.state.as_deref().unwrap_or("not reconciled yet"),
                            r.reason
                                .as_deref()
                                .map(|x| format!(" ({x})"))
                                .unwrap_or_default(),
                            r.failures,
                            if r.write_pending {
                                ", its last write not in the watch cache yet"
                            } else {
                                ""
                            },
                            if r.held_for_conflict {
                                ", writes held (label conflict)"
                            } else {
                                ""
                            },
                        ),
                    );
                    if let Some(err) = &r.last_error {
                        line("Last error", err.clone());
                    }
                    line(
                        "Next look",
                        r.next_look_in_s
                            .map(|s| format!("in {s}s"))
                            .unwrap_or_else(|| {
                                "when the node changes, or at its resync slot (--resync-period)"
                                    .into()
                            }),
                    );
                }
                None if v.leading => line(
                    "Controller",
                    format!(
                        "{who}: not reconciled yet{}",
                        if v.cached {
                            ""
                        } else {
                            " (not in its node cache)"
                        }
                    ),
                ),
                None => line("Controller", format!("{who}: followers do not reconcile")),
            }
            match &v.lookup {
                Some(c) => line(
                    "EC2 cache",
                    format!(
                        "{}{}; asked again in {}s{}{}",
                        c.state,
                        c.age_s
                            .map(|a| format!(", answered {a}s ago"))
                            .unwrap_or_default(),
                        c.ask_again_in_s,
                        if c.attempts > 0 {
                            format!(" (attempt {})", c.attempts)
                        } else {
                            String::new()
                        },
                        c.refused
                            .as_deref()
                            .map(|r| format!(": {r}"))
                            .unwrap_or_default()
                    ),
                ),
                None if v.leading => line("EC2 cache", "nothing cached for its instance".into()),
                None => {}
            }
        }
        Err(why) => line("Controller", why.clone()),
    }
    line("Record", e.record.clone());
    match &e.now {
        Some(p) => {
            line(
                "EC2 now",
                format!(
                    "{}{}",
                    p.status,
                    p.reason
                        .as_deref()
                        .map(|r| format!(": {r}"))
                        .unwrap_or_default()
                ),
            );
            let changes = p.labels.lines();
            line(
                "Would change",
                if changes.is_empty() {
                    "nothing".into()
                } else {
                    changes.join(" ")
                },
            );
            if let Some(t) = &p.startup_taint {
                line("Startup taint", t.clone());
            }
            if let Some(c) = &p.condition {
                line("Condition", c.clone());
            }
        }
        None => line("EC2 now", "not asked (--no-ec2)".into()),
    }
    if let Some(n) = &e.nvlink {
        line("NVLink", n.clone());
    }
    if let Some(u) = &e.ultraserver {
        line("UltraServer", u.clone());
    }
    line(
        "Labels now",
        if e.labels.is_empty() {
            "none of ours".into()
        } else {
            e.labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" ")
        },
    );
    out
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::{
        cmd::{Cli, Command},
        flags::run_args_of,
    };

    fn cmdline(args: &[&str]) -> Vec<u8> {
        args.iter().flat_map(|a| a.bytes().chain([0])).collect()
    }

    #[test]
    fn the_ultraserver_line_says_what_the_shape_labels_say() {
        use crate::publish::shape::{END_KEY, SIZE_KEY, TYPE_KEY};
        let scheme = crate::labels::LabelScheme::default();
        let node = |labels: &[(&str, &str)], end: Option<&str>| Node {
            metadata: kube::api::ObjectMeta {
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                annotations: end.map(|e| [(END_KEY.to_string(), e.to_string())].into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let block = crate::labels::CAPACITY_BLOCK_KEY;
        assert_eq!(ultraserver(&scheme, &node(&[], None)), None);
        let bare = ultraserver(&scheme, &node(&[(block, "cr-1")], None)).unwrap_or_default();
        assert!(bare.contains("no shape labels"), "{bare}");
        assert_eq!(
            ultraserver(
                &scheme,
                &node(
                    &[
                        (block, "cr-1"),
                        (TYPE_KEY, "u-p6e-gb200x72"),
                        (SIZE_KEY, "18")
                    ],
                    Some("2026-12-31T11:30:00Z")
                )
            )
            .as_deref(),
            Some(
                "capacity block cr-1, type u-p6e-gb200x72, 18 instances, ends 2026-12-31T11:30:00Z"
            )
        );
    }

    /// `kubectl exec deploy/... -- ec2-topology-labeler explain NODE` (or `tree`, `plan`) sees
    /// the chart's flags: they are read from the controller's command line (PID 1 in its
    /// container).
    #[test]
    fn explain_in_the_controllers_container_uses_its_flags() {
        let pid1 = cmdline(&[
            "/ec2-topology-labeler",
            "run",
            "--debug-addr=127.0.0.1:9090",
            "--layer-label-prefix=example.com/layer-",
            "--region=eu-west-1",
            "--leader-election-lease-name=other",
        ]);
        let run = run_args_of(&pid1).expect("a run command line");
        let cli = Cli::try_parse_from(["ec2-topology-labeler", "explain", "node-a"])
            .expect("explain parses");
        let Command::Explain(mine) = cli.command else {
            panic!("explain command");
        };
        let adopted = adopt(mine, run);
        assert_eq!(adopted.node, "node-a");
        assert_eq!(adopted.debug_addr.port(), 9090);
        assert_eq!(adopted.decide.ec2.region.as_deref(), Some("eu-west-1"));
        assert_eq!(adopted.leader.leader_election_lease_name, "other");
        let scheme = adopted.decide.labels.scheme().expect("scheme");
        assert!(scheme.is_family_label("example.com/layer-1"));
        // `tree` and `plan` there read its label keys (and `plan` its EC2 settings) too.
        let run = run_args_of(&pid1).expect("a run command line");
        let Command::Tree(tree) = Cli::try_parse_from(["ec2-topology-labeler", "tree"])
            .expect("tree parses")
            .command
        else {
            panic!("tree command");
        };
        let tree = crate::cmd::tree::adopt(tree, run.clone());
        assert!(
            tree.labels
                .scheme()
                .expect("scheme")
                .is_family_label("example.com/layer-1")
        );
        let Command::Plan(plan) =
            Cli::try_parse_from(["ec2-topology-labeler", "plan", "-o", "json"])
                .expect("plan parses")
                .command
        else {
            panic!("plan command");
        };
        let plan = crate::cmd::plan::adopt(plan, run);
        assert!(
            plan.decide
                .labels
                .scheme()
                .expect("scheme")
                .is_family_label("example.com/layer-1")
        );
        assert_eq!(plan.decide.ec2.region.as_deref(), Some("eu-west-1"));
        assert_eq!(
            plan.output.format,
            OutputFormat::Json,
            "its own output format stays"
        );
        // Not the controller: a shell, another subcommand, garbage.
        assert!(run_args_of(&cmdline(&["/bin/sh", "-c", "sleep 1"])).is_none());
        assert!(run_args_of(&cmdline(&["/ec2-topology-labeler", "tree"])).is_none());
        assert!(run_args_of(b"\xff\xfe").is_none());
    }
}
