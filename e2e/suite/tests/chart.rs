//! The Helm chart: lint, render with default and all-features values, and check what it renders
//! against the binary itself — every `config:` key becomes a flag the binary accepts, RBAC is
//! exactly what the code uses, the Pod runs locked down. Also where the chart's
//! `values.schema.json` is generated, from the same flag structs the binary parses, so the
//! chart's `config:` block and the flags cannot drift (`make schema` rewrites it; a test checks
//! it). Generated here, not in the controller: it is a build-time concern.

#![recursion_limit = "256"]

use std::collections::BTreeMap;

use clap::Parser;
use e2e::helm::{chart, helm};
use ec2_topology_labeler::bounds::Range;
use ec2_topology_labeler::cmd::Cli;
use ec2_topology_labeler::flags::{
    ControllerArgs, Ec2Args, GateArgs, LabelArgs, LookupArgs, PublishArgs,
};
use schemars::{JsonSchema, generate::SchemaSettings};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

fn render(sets: &[String]) -> Vec<Value> {
    render_with(&[], sets)
}

/// The API the admission policy needs, as a live API server (1.30 and later) lists it.
const VAP_API: &str = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy";

/// `helm template` with `extra` arguments (`--api-versions`, `--kube-version`) and `sets`.
fn render_with(extra: &[&str], sets: &[String]) -> Vec<Value> {
    let chart = chart();
    let mut args = vec![
        "template",
        "ec2-topology-labeler",
        chart.to_str().unwrap(),
        "--namespace",
        "ec2-topology-labeler",
    ];
    args.extend_from_slice(extra);
    for s in sets {
        args.push("--set");
        args.push(s);
    }
    let out = helm(None, &args).expect("helm template");
    serde_saphyr::from_multiple::<Value>(&out)
        .expect("rendered YAML parses")
        .into_iter()
        .filter(Value::is_object)
        .collect()
}

/// `helm template` with `sets`, the error kept (a value the chart or its schema refuses).
fn render_result(sets: &[String]) -> anyhow::Result<String> {
    let chart = chart();
    let mut args = vec![
        "template".to_string(),
        "ec2-topology-labeler".into(),
        chart.to_string_lossy().to_string(),
        "--namespace".into(),
        "ec2-topology-labeler".into(),
    ];
    for s in sets {
        args.push("--set".into());
        args.push(s.clone());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    helm(None, &args)
}

/// `helm template` with these arguments (`-f FILE`, ...), parsed.
fn render_args(extra: &[String]) -> Vec<Value> {
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    render_with(&extra, &[])
}

/// What stays in the cluster: the documents that are not Helm hooks.
fn standing(docs: &[Value]) -> Vec<Value> {
    docs.iter()
        .filter(|d| d["metadata"]["annotations"]["helm.sh/hook"].is_null())
        .cloned()
        .collect()
}

fn kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn container(docs: &[Value]) -> Value {
    kind(docs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0].clone()
}

fn args_of(docs: &[Value]) -> Vec<String> {
    container(docs)["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("string arg").to_string())
        .collect()
}

#[test]
fn chart_lints() {
    let chart = chart();
    helm(None, &["lint", chart.to_str().unwrap(), "--strict"]).expect("helm lint --strict");
}

#[test]
fn default_render_is_accepted_by_the_binary() {
    let docs = render(&[]);
    let args = args_of(&docs);
    let cli = Cli::try_parse_from(
        std::iter::once("ec2-topology-labeler".to_string()).chain(args.clone()),
    );
    assert!(cli.is_ok(), "{args:?}: {:?}", cli.err());
    assert_eq!(kind(&docs, "Deployment")[0]["spec"]["replicas"], 2);
    assert!(args.contains(&"--leader-election=true".to_string()));
}

/// A value of the right shape for each property of the generated schema.
fn example(key: &str, schema: &Value) -> String {
    if let Some(one_of) = schema["oneOf"].as_array() {
        return one_of
            .last()
            .and_then(|v| v["const"].as_str())
            .unwrap_or_default()
            .to_string();
    }
    if let Some(values) = schema["enum"].as_array() {
        return values
            .last()
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
    }
    if key == "slurmTopologyConfigmap" {
        return "slurm/slurm-topology".into();
    }
    if key == "startupTaint" {
        return "example.com/pending:NoSchedule".into();
    }
    if key == "region" {
        return "us-east-2".into();
    }
    match (schema["type"].as_str(), schema["type"].as_array()) {
        (Some("boolean"), _) => "false".into(),
        (Some("integer"), _) => "7".into(),
        (_, Some(types)) if types.iter().any(|t| t == "integer") => "4".into(),
        (Some("number"), _) => "4".into(),
        // Inside every duration flag's range (ec2_topology_labeler::bounds).
        _ if schema.get("pattern").is_some() => "45s".into(),
        _ if key.ends_with("Key") => format!("example.com/{}", key.to_lowercase()),
        _ if key == "layerLabelPrefix" => "example.com/tier-".into(),
        _ => "us-east-2".into(),
    }
}

#[test]
fn every_config_key_becomes_a_flag_the_binary_accepts() {
    let schema = config_schema();
    let props = schema["properties"].as_object().expect("properties");
    let mut sets: Vec<String> = props
        .iter()
        .map(|(k, v)| format!("config.{k}={}", example(k, v)))
        .collect();
    // uniformDepth takes top-first numbering only (the topograph preset numbers leaf-first).
    sets.push("config.labelPreset=hyperpod".into());
    sets.push("config.layerNumbering=top-first".into());
    let docs = render(&sets);
    let args = args_of(&docs);
    let cli = Cli::try_parse_from(
        std::iter::once("ec2-topology-labeler".to_string()).chain(args.clone()),
    );
    assert!(cli.is_ok(), "{args:?}: {:?}", cli.err());
    if let Ok(cli) = &cli {
        assert_eq!(cli.check(), Ok(()), "{args:?}");
    }
    for key in props.keys() {
        let kebab: String = key
            .chars()
            .flat_map(|c| {
                if c.is_ascii_uppercase() {
                    vec!['-', c.to_ascii_lowercase()]
                } else {
                    vec![c]
                }
            })
            .collect();
        assert!(
            args.iter().any(|a| a.starts_with(&format!("--{kebab}="))),
            "config.{key} gave no --{kebab}: {args:?}"
        );
    }
    let Ok(Cli {
        command: ec2_topology_labeler::cmd::Command::Run(run),
        ..
    }) = cli
    else {
        panic!("run")
    };
    assert_eq!(run.ec2.ec2_rate, 4.0, "values arrive as given");
    assert_eq!(run.lookup.batch_window.0.as_secs(), 45);
}

/// Values that would crash-loop the controller (or run two writers) are refused when the chart
/// is rendered: by `helm template` (and so `helm install`) and by `helm lint`, each with a
/// message naming the value.
#[test]
fn schema_refuses_what_the_controller_would_not_run_with() {
    let chart = chart();
    let chart = chart.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        // Malformed durations.
        (
            &["leaderElection.leaseDuration=banana"],
            "at '/leaderElection/leaseDuration': 'banana' does not match",
        ),
        (
            &["leaderElection.renewGrace=5 parsecs"],
            "at '/leaderElection/renewGrace'",
        ),
        (&["config.batchWindow=soon"], "at '/config/batchWindow'"),
        // An exemption from exclusive keys names someone.
        (
            &["admissionPolicy.exclusiveKeysExempt[0]="],
            "at '/admissionPolicy/exclusiveKeysExempt/0'",
        ),
        (
            &["config.resyncPeriod=5bananas"],
            "at '/config/resyncPeriod'",
        ),
        // Malformed startup taints.
        (
            &["config.startupTaint=example.com/pending"],
            "at '/config/startupTaint'",
        ),
        (
            &["config.startupTaint=example.com/pending:NoWay"],
            "at '/config/startupTaint'",
        ),
        (
            &["config.startupTaint=bad key:NoSchedule"],
            "at '/config/startupTaint'",
        ),
        (
            &["config.startupTaint=example.com/pending=:NoSchedule"],
            "at '/config/startupTaint'",
        ),
        // A null flag (rendered `--region=`) and malformed regions.
        (
            &["config.region=null"],
            "at '/config/region': got null, want string",
        ),
        (
            &["config.startupTaint=null"],
            "at '/config/startupTaint': got null, want string",
        ),
        (
            &["config.region=banana"],
            "at '/config/region': 'banana' does not match",
        ),
        (&["config.region=us-west-2b"], "at '/config/region'"),
        // Counts outside the range the binary checks (ec2_topology_labeler::bounds).
        (&["config.concurrency=0"], "at '/config/concurrency'"),
        (
            &["config.writeConcurrency=100000"],
            "at '/config/writeConcurrency'",
        ),
        (&["config.ec2Rate=0"], "at '/config/ec2Rate'"),
        // Two writers: more than one replica without leader election.
        (
            &["leaderElection.enabled=false"],
            "at '/leaderElection/enabled': value must be true",
        ),
        (
            &["leaderElection.enabled=false", "replicaCount=3"],
            "at '/leaderElection/enabled': value must be true",
        ),
        // Unknown keys, where the chart knows the shape.
        (
            &["config.batchWindw=1s"],
            "additional properties 'batchWindw' not allowed",
        ),
        (
            &["imag.repository=x"],
            "additional properties 'imag' not allowed",
        ),
        (&["image.digest=sha256:abc"], "at '/image/digest'"),
        (
            &["leaderElection.leaseDuraton=1m"],
            "additional properties 'leaseDuraton' not allowed",
        ),
        (
            &["metrics.serviceMonitor.relabellings[0].action=drop"],
            "additional properties 'relabellings' not allowed",
        ),
        (
            &["resources.limit.memory=1Gi"],
            "additional properties 'limit' not allowed",
        ),
        (&["extraArgs[0]=run"], "at '/extraArgs/0'"),
        (
            &["metrics.serviceMonitor.interval=soon"],
            "at '/metrics/serviceMonitor/interval'",
        ),
    ];
    for (sets, message) in cases {
        let mut set_args = Vec::new();
        for s in *sets {
            set_args.extend(["--set", *s]);
        }
        for command in ["template", "lint"] {
            let mut args = vec![command];
            if command == "template" {
                args.push("x");
            }
            args.push(chart);
            args.extend(&set_args);
            // `helm lint` reports on stdout, `helm template` on stderr.
            let out = std::process::Command::new(e2e::helm::helm_bin().unwrap())
                .args(&args)
                .output()
                .unwrap();
            let said = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(!out.status.success(), "helm {command} accepted {sets:?}");
            assert!(
                said.contains(message),
                "helm {command} {sets:?}: no {message:?} in: {said}"
            );
        }
    }
    // A flag given twice (the binary refuses to start): refused by the template, so by `helm
    // template` and `helm install` (`helm lint` only reports a template's `fail` as INFO).
    for (sets, message) in [
        (
            [
                "config.resyncPeriod=30m",
                "extraArgs[0]=--resync-period=45m",
            ],
            "extraArgs: --resync-period is already set by the chart",
        ),
        (
            [
                "logLevel=info",
                "extraArgs[0]=--leader-election-lease-duration=1m",
            ],
            "extraArgs: --leader-election-lease-duration is already set",
        ),
    ] {
        let err = helm(
            None,
            &["template", "x", chart, "--set", sets[0], "--set", sets[1]],
        )
        .expect_err("a repeated flag was rendered");
        assert!(format!("{err:#}").contains(message), "{sets:?}: {err:#}");
    }
    // What is refused above in combination is fine alone.
    for sets in [
        vec![
            "leaderElection.enabled=false".to_string(),
            "replicaCount=1".into(),
        ],
        vec!["config.region=us-gov-west-1".into()],
        vec!["config.startupTaint=example.com/pending=yes:NoExecute".into()],
        vec!["leaderElection.leaseDuration=1m30s".into()],
    ] {
        render(&sets);
    }
}

/// `helm template` with one `--set-string` value: whether the schema takes it (the chart's
/// own checks, of ranges, may refuse it after).
fn schema_accepts(key: &str, value: &str) -> bool {
    let chart = chart();
    let set = format!("{key}={value}");
    helm(
        None,
        &[
            "template",
            "x",
            chart.to_str().unwrap(),
            "--show-only",
            "templates/service.yaml",
            "--set-string",
            &set,
        ],
    )
    .map_or_else(|e| !format!("{e:#}").contains("schema"), |_| true)
}

/// The schema's patterns (durations, regions, taints) accept exactly what the binary's parsers
/// accept, on both sides of every edge the parsers have.
#[test]
fn schema_patterns_agree_with_the_binary() {
    use ec2_topology_labeler::{
        duration::HumanDuration, provider_id::is_region_name, reconcile::gate::StartupTaint,
    };
    use std::str::FromStr;
    for d in [
        "200ms", "15s", "1h30m", "1h 30m", "2d", "1.5h", "10 min", "3secs", "1M", "0s", "90",
        "soon", "5bananas", "1h30", "-5s", "1..5s", "s", "",
    ] {
        assert_eq!(
            schema_accepts("config.batchWindow", d),
            HumanDuration::from_str(d).is_ok(),
            "duration {d:?}"
        );
    }
    // Up to 6 digits of a fraction (the chart adds up its durations exactly in those).
    assert!(schema_accepts("config.batchWindow", "1.123456s"));
    assert!(!schema_accepts("config.batchWindow", "1.1234567s"));
    for r in [
        "us-west-2",
        "us-gov-west-1",
        "us-isob-east-1",
        "eusc-de-east-1",
        "ap-southeast-5",
        "mx-central-1",
        "cn-northwest-1",
        "us-west-2b",
        "us-west",
        "banana",
        "US-WEST-2",
        "us-west-100",
        "us-middle-1",
        "",
    ] {
        assert_eq!(
            schema_accepts("config.region", r),
            is_region_name(r),
            "region {r:?}"
        );
    }
    let long = "a".repeat(64);
    for t in [
        "ec2-topology-labeler.io/topology-pending:NoSchedule".to_string(),
        "example.com/pending=yes:NoExecute".into(),
        "pending:PreferNoSchedule".into(),
        "a.b.c/x_y.z-1=v_1.2-3:NoSchedule".into(),
        "example.com/pending".into(),
        "example.com/pending:NoWay".into(),
        "example.com/pending=:NoSchedule".into(),
        "Example.com/pending:NoSchedule".into(),
        "example.com/-pending:NoSchedule".into(),
        "bad key:NoSchedule".into(),
        format!("example.com/{long}:NoSchedule"),
        format!("example.com/p={long}:NoSchedule"),
        ":NoSchedule".into(),
    ] {
        assert_eq!(
            schema_accepts("config.startupTaint", &t),
            StartupTaint::from_str(&t).is_ok(),
            "taint {t:?}"
        );
    }
}

#[test]
fn rbac_is_exactly_what_the_code_uses() {
    let docs = render(&[]);
    let rules = &kind(&docs, "ClusterRole")[0]["rules"];
    let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in rules.as_array().unwrap() {
        let group = r["apiGroups"][0].as_str().unwrap();
        for res in r["resources"].as_array().unwrap() {
            let verbs = r["verbs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap().to_string())
                .collect();
            seen.insert(format!("{group}/{}", res.as_str().unwrap()), verbs);
        }
    }
    assert_eq!(seen["/nodes"], ["get", "list", "watch", "patch"]);
    assert_eq!(
        seen["events.k8s.io/events"],
        ["create"],
        "Events are created, never patched (no series)"
    );
    // The condition an earlier configuration left is removed at start-up. No right on a
    // scheduler object's kind while its feature is off (the retire hook holds those).
    assert_eq!(seen["/nodes/status"], ["patch"]);
    assert_eq!(seen.len(), 3, "nothing else cluster-wide: {seen:?}");
    let role = |name: &str| -> Value {
        kind(&docs, "Role")
            .into_iter()
            .find(|r| r["metadata"]["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("the Role {name}"))
    };
    // The verification ledger: its 64 shards by name; `create` (which RBAC cannot limit by
    // name) is limited by the ConfigMap admission policy.
    let shards: Vec<String> = (0..64)
        .map(|k| format!("ec2-topology-labeler-records-{k:02}"))
        .collect();
    assert_eq!(
        role("ec2-topology-labeler-ledger")["rules"],
        json!([
            { "apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"] },
            { "apiGroups": [""], "resources": ["configmaps"], "resourceNames": shards,
              "verbs": ["get", "patch"] }
        ])
    );
    for k in [0, 63] {
        assert_eq!(
            ec2_topology_labeler::ledger::shard_name("ec2-topology-labeler", k),
            shards[k],
            "the names the binary writes"
        );
    }
    assert_eq!(ec2_topology_labeler::ledger::SHARDS, shards.len());
    let lease_rules = &role("ec2-topology-labeler-leader-election")["rules"];
    let verbs: Vec<&str> = lease_rules
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| {
            r["verbs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap())
        })
        .collect();
    assert_eq!(verbs, ["create", "get", "update"]);
    // Publishers add exactly their own rules.
    let docs = render(&[
        "config.kueueTopology=true".into(),
        "config.volcanoHypernodes=true".into(),
    ]);
    let rules = kind(&docs, "ClusterRole")[0]["rules"]
        .as_array()
        .unwrap()
        .clone();
    let verbs_for = |res: &str| -> Vec<String> {
        rules
            .iter()
            .find(|r| r["resources"][0] == res)
            .map(|r| {
                r["verbs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_str().unwrap().to_string())
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(verbs_for("topologies"), ["get", "create", "patch"]);
    assert_eq!(
        verbs_for("hypernodes"),
        ["list", "create", "patch", "delete"]
    );
    assert_eq!(
        verbs_for("nodes/status"),
        ["patch"],
        "the condition's removal at start-up without it"
    );
    // KAI's Topology: its own group, the same verbs; the Slurm ConfigMap: a Role in its
    // namespace, get and patch limited to its name.
    let docs = render(&[
        "config.kaiTopology=true".into(),
        "config.slurmTopologyConfigmap=slurm/slurm-topology".into(),
    ]);
    let kai: Vec<&Value> = kind(&docs, "ClusterRole")[0]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["apiGroups"][0] == "kai.scheduler")
        .collect();
    assert_eq!(kai.len(), 1);
    assert_eq!(kai[0]["resources"], serde_json::json!(["topologies"]));
    assert_eq!(
        kai[0]["verbs"],
        serde_json::json!(["get", "create", "patch"])
    );
    let role = kind(&docs, "Role")
        .into_iter()
        .find(|r| r["metadata"]["namespace"] == "slurm")
        .expect("a Role in the ConfigMap's namespace");
    assert_eq!(
        role["rules"],
        serde_json::json!([
            { "apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"] },
            { "apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["slurm-topology"], "verbs": ["get", "patch"] }
        ])
    );
    assert!(
        kind(&docs, "RoleBinding")
            .iter()
            .any(|b| b["metadata"]["namespace"] == "slurm"
                && b["roleRef"]["name"] == role["metadata"]["name"]),
        "bound to the ServiceAccount"
    );
    // The TopologyLabeled condition adds exactly nodes/status patch; the startup taint needs
    // nothing more than the nodes patch already there.
    let docs = render(&[
        "config.nodeCondition=true".into(),
        "config.startupTaint=example.com/pending:NoSchedule".into(),
    ]);
    let rules = kind(&docs, "ClusterRole")[0]["rules"]
        .as_array()
        .unwrap()
        .clone();
    let status: Vec<&Value> = rules
        .iter()
        .filter(|r| r["resources"][0] == "nodes/status")
        .collect();
    assert_eq!(status.len(), 1);
    assert_eq!(status[0]["verbs"], serde_json::json!(["patch"]));
    assert_eq!(rules.len(), 3, "nodes, nodes/status, events: {rules:?}");
    // With events off, and one replica without leader election, those rules are gone.
    let docs = render(&[
        "events.enabled=false".into(),
        "leaderElection.enabled=false".into(),
        "replicaCount=1".into(),
    ]);
    let docs = standing(&docs);
    let roles: Vec<&Value> = kind(&docs, "Role")
        .into_iter()
        .map(|r| &r["metadata"]["name"])
        .collect();
    assert_eq!(
        roles,
        ["ec2-topology-labeler-ledger"],
        "the ledger's only: it is kept without an election too"
    );
    assert!(kind(&docs, "PodDisruptionBudget").is_empty());
    assert_eq!(
        kind(&docs, "ClusterRole")[0]["rules"]
            .as_array()
            .unwrap()
            .len(),
        2,
        "nodes and nodes/status only"
    );
}

/// The controller releases the startup taint, so it must run on nodes still carrying it (on a
/// new cluster, every node may); the user's own tolerations stay.
#[test]
fn the_controller_tolerates_the_startup_taint_it_releases() {
    let tolerations = |sets: &[String]| {
        let docs = render(sets);
        kind(&docs, "Deployment")[0]["spec"]["template"]["spec"]["tolerations"].clone()
    };
    assert_eq!(tolerations(&[]), Value::Null, "none by default");
    let t = tolerations(&[
        "config.startupTaint=example.com/pending=yes:NoSchedule".into(),
        "tolerations[0].key=gpu".into(),
        "tolerations[0].operator=Exists".into(),
    ]);
    assert_eq!(
        t,
        serde_json::json!([
            {"key": "gpu", "operator": "Exists"},
            {"key": "example.com/pending", "operator": "Exists"}
        ])
    );
}

#[test]
fn the_pod_runs_locked_down() {
    let docs = render(&[]);
    let pod = &kind(&docs, "Deployment")[0]["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let c = container(&docs);
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    assert_eq!(
        c["securityContext"]["capabilities"]["drop"],
        serde_json::json!(["ALL"])
    );
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/livez");
    assert_eq!(c["startupProbe"]["httpGet"]["path"], "/livez");
}

/// What the release workflow publishes is what the chart pulls: it runs `make release` (the
/// path the kind suite runs for real) into the registry of values.yaml's image repository, the
/// chart as an OCI artifact beside it, on version tags only, with no emulation.
#[test]
fn release_workflow_publishes_the_image_the_chart_pulls() {
    let root = e2e::repo_root();
    let read = |p: &str| std::fs::read_to_string(root.join(p)).expect(p);
    let text = read(".github/workflows/release.yaml");
    let workflow: Value = serde_saphyr::from_str(&text).expect("workflow YAML");
    let values: Value =
        serde_saphyr::from_str(&read("charts/ec2-topology-labeler/values.yaml")).expect("values");
    assert_eq!(workflow["env"]["IMAGE"], values["image"]["repository"]);
    let registry = workflow["env"]["REGISTRY"].as_str().expect("REGISTRY");
    assert_eq!(
        format!("{registry}/ec2-topology-labeler"),
        workflow["env"]["IMAGE"].as_str().unwrap_or_default(),
        "release.sh pushes the image to $REGISTRY/ec2-topology-labeler"
    );
    assert_eq!(
        workflow["env"]["CHART_REPO"].as_str(),
        Some(format!("oci://{registry}/charts").as_str()),
        "release.sh pushes the chart to oci://$REGISTRY/charts"
    );
    let tags = &workflow["on"]["push"]["tags"];
    assert!(tags.is_array() && workflow["on"]["push"]["branches"].is_null());
    let runs: Vec<String> = workflow["jobs"]
        .as_object()
        .expect("jobs")
        .values()
        .flat_map(|j| j["steps"].as_array().cloned().unwrap_or_default())
        .filter_map(|s| s["run"].as_str().map(str::to_string))
        .collect();
    assert!(
        runs.iter().any(|r| r.starts_with("make release ")),
        "the workflow runs make release: {runs:?}"
    );
    for emulation in [
        "setup-qemu-action",
        "setup-buildx-action",
        "build-push-action",
    ] {
        assert!(
            !text.contains(emulation),
            "the workflow builds with {emulation}"
        );
    }
}

/// The PrometheusRule carries every alert of alerts/rules.yaml (the file promtool tests), each
/// with a runbook link under `prometheusRule.runbookBaseUrl` whose anchor docs/operations.md has.
#[test]
fn prometheus_rule_is_the_tested_alerts_with_runbooks() {
    assert!(
        kind(&render(&[]), "PrometheusRule").is_empty(),
        "off by default"
    );
    let docs = render(&[
        "prometheusRule.enabled=true".into(),
        "prometheusRule.namespace=monitoring".into(),
        "prometheusRule.labels.release=kube-prometheus-stack".into(),
        "prometheusRule.runbookBaseUrl=https://wiki.example.com/labeler".into(),
    ]);
    let rule = kind(&docs, "PrometheusRule")[0];
    assert_eq!(rule["metadata"]["namespace"], "monitoring");
    assert_eq!(
        rule["metadata"]["labels"]["release"],
        "kube-prometheus-stack"
    );
    let file: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(chart().join("alerts/rules.yaml")).expect("alerts/rules.yaml"),
    )
    .expect("rules parse");
    let names = |v: &Value| -> Vec<String> {
        v["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .filter_map(|r| r["alert"].as_str().map(str::to_string))
            .collect()
    };
    assert_eq!(names(&rule["spec"]), names(&file));
    assert!(names(&file).len() >= 8);
    let operations =
        std::fs::read_to_string(e2e::repo_root().join("docs/operations.md")).expect("operations");
    for r in rule["spec"]["groups"][0]["rules"]
        .as_array()
        .expect("rules")
    {
        let url = r["annotations"]["runbook_url"]
            .as_str()
            .expect("runbook_url");
        let anchor = url
            .strip_prefix("https://wiki.example.com/labeler#")
            .unwrap_or_else(|| panic!("{url} is not under the base URL"));
        let heading = operations.lines().any(|l| {
            l.starts_with('#')
                && l.trim_start_matches('#')
                    .trim()
                    .to_lowercase()
                    .replace(' ', "-")
                    .chars()
                    .filter(|c| c.is_alphanumeric() || *c == '-')
                    .collect::<String>()
                    == anchor
        });
        assert!(heading, "docs/operations.md has no section #{anchor}");
    }
}

/// `promtool test rules` (the pinned Prometheus): every alert of alerts/rules.yaml fires from
/// recorded series in e2e/suite/tests/alerts/rules.test.yaml, and a healthy installation fires
/// none.
#[test]
fn alerts_fire_from_recorded_series() {
    let tests = e2e::repo_root().join("e2e/suite/tests/alerts/rules.test.yaml");
    let promtool = e2e::built_by("e2e/tools/promtool/build.sh", "E2E_PROMTOOL")
        .expect("promtool")
        .join("promtool");
    let out = std::process::Command::new(&promtool)
        .args(["test", "rules"])
        .arg(&tests)
        .output()
        .expect("promtool runs");
    assert!(
        out.status.success(),
        "promtool test rules failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Each alert is shown firing at least once (not only "does not fire").
    let file: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(chart().join("alerts/rules.yaml")).expect("alerts/rules.yaml"),
    )
    .expect("rules parse");
    let recorded: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(&tests).expect("rules.test.yaml"))
            .expect("tests parse");
    let fired: Vec<String> = recorded["tests"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|t| t["alert_rule_test"].as_array().cloned().unwrap_or_default())
        .filter(|a| a["exp_alerts"].as_array().is_some_and(|e| !e.is_empty()))
        .filter_map(|a| a["alertname"].as_str().map(str::to_string))
        .collect();
    for group in file["groups"].as_array().expect("groups") {
        for rule in group["rules"].as_array().expect("rules") {
            let name = rule["alert"].as_str().expect("alert name");
            assert!(
                fired.iter().any(|f| f == name),
                "{name} is never shown firing"
            );
        }
    }
}

/// The dashboard ConfigMap holds the JSON the metrics test checks, labelled for Grafana's sidecar.
#[test]
fn dashboard_configmap_is_the_checked_dashboard() {
    let docs = render(&[
        "dashboard.enabled=true".into(),
        "dashboard.annotations.grafana_folder=Training".into(),
    ]);
    let cm = kind(&docs, "ConfigMap")
        .into_iter()
        .find(|c| c["metadata"]["name"] == "ec2-topology-labeler-dashboard")
        .expect("dashboard ConfigMap");
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(cm["metadata"]["annotations"]["grafana_folder"], "Training");
    let json = cm["data"]["ec2-topology-labeler.json"]
        .as_str()
        .expect("data");
    let file = std::fs::read_to_string(chart().join("dashboards/ec2-topology-labeler.json"))
        .expect("dashboard");
    let parsed: Value = serde_json::from_str(json).expect("dashboard JSON parses");
    assert_eq!(
        parsed,
        serde_json::from_str::<Value>(&file).expect("file parses")
    );
}

/// The post-delete hook runs a command line the binary accepts, with the Lease, HyperNode prefix
/// and startup taint the controller was given, under a ServiceAccount of its own.
/// The verification records' key: a Secret the chart creates (a random key the binary accepts)
/// or one the user names, mounted read-only into the controller and named by
/// `LABELER_RECORD_KEY_FILE` (an environment variable, which `explain` in the Pod inherits); the
/// controller's RBAC grants nothing on Secrets. Off, nothing of it is rendered.
#[test]
fn record_key_is_a_secret_only_the_controllers_pods_mount() {
    const FILE: &str = "/etc/ec2-topology-labeler/record-key/key";
    let env_of = |docs: &[Value]| -> Option<String> {
        container(docs)["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == "LABELER_RECORD_KEY_FILE")
            .map(|e| e["value"].as_str().unwrap().to_string())
    };
    let secret_volume = |docs: &[Value]| -> Option<Value> {
        pod_spec(docs)["volumes"]
            .as_array()
            .and_then(|v| v.iter().find(|v| v["name"] == "record-key").cloned())
    };
    let docs = render(&[]);
    let secrets = kind(&docs, "Secret");
    assert_eq!(secrets.len(), 1);
    assert_eq!(
        secrets[0]["metadata"]["name"],
        "ec2-topology-labeler-record-key"
    );
    let b64 = secrets[0]["data"]["key"].as_str().unwrap();
    // (A ByteString reads the base64 a Secret's data holds.)
    let key: k8s_openapi::ByteString = serde_json::from_value(json!(b64)).unwrap();
    let key = String::from_utf8(key.0).unwrap();
    assert_eq!(key.len(), 64);
    assert!(ec2_topology_labeler::verified::RecordKey::new(key.as_bytes()).is_ok());
    assert_ne!(
        b64,
        kind(&render(&[]), "Secret")[0]["data"]["key"]
            .as_str()
            .unwrap(),
        "random at each install (kept across upgrades by lookup)"
    );
    assert_eq!(env_of(&docs).as_deref(), Some(FILE));
    let volume = secret_volume(&docs).expect("the key's volume");
    assert_eq!(
        volume["secret"]["secretName"],
        "ec2-topology-labeler-record-key"
    );
    // Every item of the Secret: `key`, and `previous` once a rotation made it (an item that
    // may be missing cannot be listed).
    assert_eq!(volume["secret"]["items"], Value::Null);
    let previous = container(&docs)["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "LABELER_PREVIOUS_RECORD_KEY_FILE")
        .map(|e| e["value"].as_str().unwrap().to_string());
    assert_eq!(
        previous.as_deref(),
        Some("/etc/ec2-topology-labeler/record-key/previous")
    );
    assert!(
        secrets[0]["data"].get("previous").is_none(),
        "no previous key before a rotation"
    );
    assert_eq!(
        secrets[0]["metadata"]["annotations"]["ec2-topology-labeler.io/rotation"],
        "0"
    );
    let mount = container(&docs)["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "record-key")
        .cloned()
        .expect("mounted");
    assert_eq!(mount["readOnly"], true);
    assert_eq!(
        format!("{}/key", mount["mountPath"].as_str().unwrap()),
        FILE
    );
    // A rotated key (a new Secret) rolls the replicas: the checksum is of the very keys the
    // Secret holds (one key per render; the next upgrade, reading it back, does not roll them).
    let pod_annotations =
        &kind(&docs, "Deployment")[0]["spec"]["template"]["metadata"]["annotations"];
    let digest = {
        use sha2::Digest;
        sha2::Sha256::digest(format!("{b64}/").as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    assert_eq!(pod_annotations["checksum/record-key"], json!(digest));
    // Nothing on Secrets for the controller.
    for role in kind(&docs, "ClusterRole")
        .into_iter()
        .chain(kind(&docs, "Role"))
    {
        for r in role["rules"].as_array().unwrap() {
            assert!(
                !r["resources"]
                    .as_array()
                    .unwrap()
                    .contains(&json!("secrets")),
                "{r}"
            );
        }
    }
    // The user's own Secret, with the user's volumes beside it.
    let docs = render(&[
        "recordKey.existingSecret=team-key".into(),
        "extraVolumes[0].name=scratch".into(),
        "extraVolumes[0].emptyDir.medium=Memory".into(),
    ]);
    assert!(kind(&docs, "Secret").is_empty());
    assert_eq!(
        secret_volume(&docs).unwrap()["secret"]["secretName"],
        "team-key"
    );
    assert_eq!(pod_spec(&docs)["volumes"].as_array().unwrap().len(), 2);
    assert_eq!(env_of(&docs).as_deref(), Some(FILE));
    // Off: no key at all (records neither written nor trusted).
    let docs = render(&["recordKey.enabled=false".into()]);
    assert!(kind(&docs, "Secret").is_empty());
    assert!(secret_volume(&docs).is_none());
    assert_eq!(env_of(&docs), None);
}

fn uninstall_job(docs: &[Value]) -> &Value {
    kind(docs, "Job")
        .into_iter()
        .find(|j| j["metadata"]["name"] == "ec2-topology-labeler-uninstall")
        .expect("the uninstall Job")
}

/// With a scheduler feature off, what an earlier configuration published is retired by a
/// post-upgrade Job under a ServiceAccount of its own, whose rights are exactly the kinds of the
/// features turned off; the controller holds none of them. Its command is `retire` with this
/// configuration's publishing flags, which the binary accepts.
#[test]
fn retire_hook_holds_rights_for_exactly_the_features_turned_off() {
    let hook = |docs: &[Value]| -> Vec<Value> {
        docs.iter()
            .filter(|d| d["metadata"]["annotations"]["helm.sh/hook"] == "post-upgrade")
            .cloned()
            .collect()
    };
    let rights = |docs: &[Value]| -> BTreeMap<String, Vec<String>> {
        let mut seen = BTreeMap::new();
        for role in kind(docs, "ClusterRole") {
            for r in role["rules"].as_array().unwrap() {
                for res in r["resources"].as_array().unwrap() {
                    let verbs = r["verbs"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|v| v.as_str().unwrap().to_string())
                        .collect();
                    seen.insert(
                        format!(
                            "{}/{}",
                            r["apiGroups"][0].as_str().unwrap(),
                            res.as_str().unwrap()
                        ),
                        verbs,
                    );
                }
            }
        }
        seen
    };
    let docs = render(&[]);
    let h = hook(&docs);
    assert_eq!(
        h.iter()
            .map(|d| d["kind"].as_str().unwrap())
            .collect::<Vec<_>>(),
        [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "Job"
        ]
    );
    let seen = rights(&h);
    assert_eq!(seen["topology.volcano.sh/hypernodes"], ["list", "delete"]);
    assert_eq!(seen["kueue.x-k8s.io/topologies"], ["list", "delete"]);
    assert_eq!(seen["kueue.x-k8s.io/resourceflavors"], ["list"]);
    assert_eq!(seen["kai.scheduler/topologies"], ["list"], "reported only");
    assert_eq!(seen.len(), 4, "{seen:?}");
    // Its rights go once it has run, succeeded or failed; the Job (no rights of its own) stays
    // until the next upgrade for its log, whichever way it ended.
    for d in &h {
        let policy = d["metadata"]["annotations"]["helm.sh/hook-delete-policy"]
            .as_str()
            .unwrap();
        if d["kind"] == "Job" {
            assert_eq!(policy, "before-hook-creation");
        } else {
            assert_eq!(policy, "before-hook-creation,hook-succeeded,hook-failed");
        }
    }
    // Its pod is not one of the controller's (the Service, the PodDisruptionBudget, kubectl -l
    // select those by the Deployment's selector).
    let both = render(&["uninstallHook.enabled=true".into()]);
    let selector = kind(&both, "Deployment")[0]["spec"]["selector"]["matchLabels"].clone();
    assert_eq!(
        kind(&both, "Job").len(),
        2,
        "the retire and the uninstall hooks"
    );
    for job in kind(&both, "Job") {
        let labels = &job["spec"]["template"]["metadata"]["labels"];
        let matches = selector
            .as_object()
            .unwrap()
            .iter()
            .all(|(k, v)| &labels[k] == v);
        assert!(
            !matches,
            "{} pod labels {labels} match the controller's selector {selector}",
            job["metadata"]["name"]
        );
    }
    let role = h.iter().find(|d| d["kind"] == "Role").unwrap();
    assert_eq!(
        role["rules"],
        json!([{ "apiGroups": ["apps"], "resources": ["deployments"],
                 "resourceNames": ["ec2-topology-labeler"], "verbs": ["get"] }]),
        "reads the controller's Deployment only, to wait for its rollout"
    );
    // The binary accepts the Job's arguments, and they carry this configuration.
    let docs = render(&[
        "config.kueueTopology=true".into(),
        "config.kaiTopologyName=team-net".into(),
        "config.volcanoHypernodePrefix=team".into(),
        "leaderElection.leaseName=team-lease".into(),
        "extraArgs={--leader-election-namespace=leases}".into(),
    ]);
    let h = hook(&docs);
    let seen = rights(&h);
    assert!(
        !seen.contains_key("kueue.x-k8s.io/topologies"),
        "Kueue is on: {seen:?}"
    );
    assert!(!seen.contains_key("kueue.x-k8s.io/resourceflavors"));
    let job = kind(&h, "Job")[0];
    assert_eq!(
        job["spec"]["template"]["spec"]["serviceAccountName"],
        "ec2-topology-labeler-retire"
    );
    let args: Vec<String> = job["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    let cli = Cli::try_parse_from(std::iter::once("ec2-topology-labeler".to_string()).chain(args))
        .expect("the binary accepts the hook's arguments");
    let ec2_topology_labeler::cmd::Command::Retire(r) = cli.command else {
        panic!("the hook runs retire");
    };
    assert!(
        r.publish.kueue.kueue_topology
            && !r.publish.volcano.volcano_hypernodes
            && !r.publish.kai.kai_topology
    );
    assert_eq!(r.publish.kai.kai_topology_name, "team-net");
    assert_eq!(r.publish.volcano.volcano_hypernode_prefix, "team");
    assert_eq!(r.leader.leader_election_lease_name, "team-lease");
    assert_eq!(
        r.leader.leader_election_namespace.as_deref(),
        Some("leases")
    );
    assert_eq!(
        r.wait_for_rollout.as_deref(),
        Some("ec2-topology-labeler/ec2-topology-labeler")
    );
    assert!(!r.dry_run);
    // Every feature on, the hook off, or RBAC brought along: no hook.
    for sets in [
        vec![
            "config.kueueTopology=true".to_string(),
            "config.kaiTopology=true".into(),
            "config.volcanoHypernodes=true".into(),
        ],
        vec!["retireHook.enabled=false".into()],
        vec!["rbac.create=false".into()],
    ] {
        assert!(hook(&render(&sets)).is_empty(), "{sets:?}");
    }
}

#[test]
fn uninstall_hook_runs_the_uninstall_command_as_configured() {
    let hooks = |docs: &[Value]| {
        docs.iter()
            .filter(|d| d["metadata"]["annotations"]["helm.sh/hook"] == "post-delete")
            .count()
    };
    assert_eq!(hooks(&render(&[])), 0, "off by default");
    let docs = render(&[
        "uninstallHook.enabled=true".into(),
        "leaderElection.leaseName=my-lease".into(),
        "config.volcanoHypernodes=true".into(),
        "config.volcanoHypernodePrefix=team".into(),
        "config.startupTaint=example.com/pending:NoSchedule".into(),
    ]);
    assert_eq!(
        hooks(&docs),
        6,
        "ServiceAccount, ClusterRole(Binding), Role(Binding), Job"
    );
    let job = uninstall_job(&docs);
    let pod = &job["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "ec2-topology-labeler-uninstall");
    let args: Vec<String> = pod["containers"][0]["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("arg").to_string())
        .collect();
    let cli = Cli::try_parse_from(std::iter::once("ec2-topology-labeler".to_string()).chain(args))
        .expect("the binary accepts the hook's arguments");
    let ec2_topology_labeler::cmd::Command::Uninstall(u) = cli.command else {
        panic!("the hook runs uninstall");
    };
    assert_eq!(u.leader.leader_election_lease_name, "my-lease");
    assert_eq!(u.plugins.volcano.volcano_hypernode_prefix, "team");
    assert!(u.taint.startup_taint.is_some());
    assert!(!u.labels && !u.force && !u.dry_run);
    assert!(u.wait_for_lease.0 >= std::time::Duration::from_secs(30));
    // No Slurm ConfigMap configured: none looked for, and no ConfigMap permission at all.
    assert_eq!(
        u.plugins.slurm.slurm_topology_configmap,
        Some(ec2_topology_labeler::publish::SlurmConfigMaps::None)
    );
    let configmap_rules = |docs: &[Value]| -> Vec<Value> {
        docs.iter()
            .filter(|d| d["metadata"]["annotations"]["helm.sh/hook"] == "post-delete")
            .filter(|d| d["kind"] == "ClusterRole" || d["kind"] == "Role")
            .flat_map(|d| {
                let ns = d["metadata"]["namespace"].clone();
                d["rules"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|r| r["resources"][0] == "configmaps")
                    .map(move |r| serde_json::json!({"namespace": ns, "rule": r}))
            })
            .collect()
    };
    // The verification ledger's shards (beside the Lease, by name): the only ConfigMaps
    // without a Slurm one configured.
    let ledger = |lease: &str| -> Value {
        let shards: Vec<String> = (0..ec2_topology_labeler::ledger::SHARDS)
            .map(|k| ec2_topology_labeler::ledger::shard_name(lease, k))
            .collect();
        serde_json::json!({"namespace": "ec2-topology-labeler", "rule": {
            "apiGroups": [""], "resources": ["configmaps"],
            "resourceNames": shards, "verbs": ["get", "delete"]}})
    };
    assert_eq!(configmap_rules(&docs), vec![ledger("my-lease")]);
    // Nodes: listed; read and patched only where it has something to remove there beyond our
    // conditions (nodes/status): our label keys (uninstallHook.labels), the interconnect taint
    // (config.ultraserverHealthTaint).
    let node_verbs = |sets: &[&str]| -> Value {
        let docs = render(
            &std::iter::once("uninstallHook.enabled=true")
                .chain(sets.iter().copied())
                .map(String::from)
                .collect::<Vec<_>>(),
        );
        docs.iter()
            .filter(|d| d["metadata"]["annotations"]["helm.sh/hook"] == "post-delete")
            .filter(|d| d["kind"] == "ClusterRole")
            .flat_map(|d| d["rules"].as_array().cloned().unwrap_or_default())
            .find(|r| r["resources"] == json!(["nodes"]))
            .map(|r| r["verbs"].clone())
            .unwrap_or_default()
    };
    assert_eq!(node_verbs(&[]), json!(["list"]));
    assert_eq!(
        node_verbs(&["uninstallHook.labels=true"]),
        json!(["list", "get", "patch"])
    );
    assert_eq!(
        node_verbs(&[
            "config.ultraserverHealth=true",
            "config.ultraserverHealthTaint=true"
        ]),
        json!(["list", "get", "patch"])
    );
    // The configured one: by name, in a Role of its namespace (never every ConfigMap).
    let docs = render(&[
        "uninstallHook.enabled=true".into(),
        "config.slurmTopologyConfigmap=slurm/slurm-topology".into(),
    ]);
    assert_eq!(
        configmap_rules(&docs),
        vec![
            ledger("ec2-topology-labeler"),
            serde_json::json!({"namespace": "slurm", "rule": {
            "apiGroups": [""], "resources": ["configmaps"],
            "resourceNames": ["slurm-topology"], "verbs": ["get", "delete"]}})
        ]
    );
    let job = uninstall_job(&docs);
    let args = job["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .expect("args")
        .clone();
    assert!(
        args.contains(&serde_json::json!(
            "--slurm-topology-configmap=slurm/slurm-topology"
        )),
        "{args:?}"
    );
}

/// The admin server listens on every address family by default (the kubelet probes an IPv6
/// cluster's pods on IPv6), on IPv4 only if asked.
#[test]
fn metrics_bind_address_takes_every_family_by_default() {
    let addr = |sets: &[String]| {
        let args = args_of(&render(sets));
        let cli = Cli::try_parse_from(
            std::iter::once("ec2-topology-labeler".to_string()).chain(args.clone()),
        )
        .expect("the binary accepts the args");
        let ec2_topology_labeler::cmd::Command::Run(run) = cli.command else {
            panic!("run");
        };
        run.serve.metrics_addr
    };
    assert_eq!(addr(&[]), "[::]:8080".parse().expect("addr"));
    assert_eq!(
        addr(&[
            "metrics.bindAddress=0.0.0.0".into(),
            "metrics.port=9090".into()
        ]),
        "0.0.0.0:9090".parse().expect("addr")
    );
}

#[test]
fn all_features_render() {
    let docs = render(&[
        "metrics.serviceMonitor.enabled=true".into(),
        "serviceAccount.annotations.eks\\.amazonaws\\.com/role-arn=arn:aws:iam::111122223333:role/labeler".into(),
        "priorityClassName=system-cluster-critical".into(),
        "config.region=us-west-2".into(),
    ]);
    assert_eq!(kind(&docs, "ServiceMonitor").len(), 1);
    assert_eq!(kind(&docs, "PodDisruptionBudget").len(), 1);
    assert_eq!(
        kind(&docs, "ServiceAccount")[0]["metadata"]["annotations"]["eks.amazonaws.com/role-arn"],
        "arn:aws:iam::111122223333:role/labeler"
    );
    assert!(args_of(&docs).contains(&"--region=us-west-2".to_string()));
}

fn pod_spec(docs: &[Value]) -> Value {
    kind(docs, "Deployment")[0]["spec"]["template"]["spec"].clone()
}

/// The image by tag (the chart's appVersion by default), or by digest alone when one is given:
/// what a release packages the chart with.
#[test]
fn image_digest_pins_the_image() {
    let image = |sets: &[String]| container(&render(sets))["image"].clone();
    let chart: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(chart().join("Chart.yaml")).expect("Chart.yaml"),
    )
    .expect("Chart.yaml parses");
    let repo = "ghcr.io/ec2-topology-labeler/ec2-topology-labeler";
    assert_eq!(
        image(&[]),
        format!("{repo}:{}", chart["appVersion"].as_str().unwrap())
    );
    assert_eq!(image(&["image.tag=1.2.3".into()]), format!("{repo}:1.2.3"));
    let digest = format!("sha256:{}", "ab".repeat(32));
    assert_eq!(
        image(&["image.tag=1.2.3".into(), format!("image.digest={digest}")]),
        format!("{repo}@{digest}")
    );
    // The helm test pod runs the same image.
    let docs = render(&[format!("image.digest={digest}")]);
    assert_eq!(
        kind(&docs, "Pod")[0]["spec"]["containers"][0]["image"],
        format!("{repo}@{digest}")
    );
}

/// Karpenter's and the AWS Load Balancer Controller's defaults: this pod gates every new node
/// when the startup taint is on, so it is cluster-critical; Linux nodes only; old ReplicaSets
/// kept for a rollback. Each can be changed or emptied.
#[test]
fn scheduling_defaults_and_their_overrides() {
    let docs = render(&[]);
    let pod = pod_spec(&docs);
    assert_eq!(pod["priorityClassName"], "system-cluster-critical");
    assert_eq!(pod["nodeSelector"], json!({ "kubernetes.io/os": "linux" }));
    // Replicas spread across zones where they can (soft), by the pods' own labels.
    let selector = &kind(&docs, "Deployment")[0]["spec"]["selector"]["matchLabels"];
    assert_eq!(
        pod["topologySpreadConstraints"],
        json!([{ "maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                 "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": { "matchLabels": selector } }])
    );
    assert!(
        pod_spec(&render(&["topologySpreadConstraints=null".into()]))["topologySpreadConstraints"]
            .is_null()
    );
    assert_eq!(
        kind(&docs, "Deployment")[0]["spec"]["revisionHistoryLimit"],
        10
    );
    let docs = render(&[
        "priorityClassName=".into(),
        "nodeSelector=null".into(),
        "revisionHistoryLimit=2".into(),
        "podLabels.team=ml".into(),
        "topologySpreadConstraints[0].maxSkew=1".into(),
        "topologySpreadConstraints[0].topologyKey=topology.kubernetes.io/zone".into(),
        "topologySpreadConstraints[0].whenUnsatisfiable=ScheduleAnyway".into(),
        "topologySpreadConstraints[1].maxSkew=1".into(),
        "topologySpreadConstraints[1].topologyKey=kubernetes.io/hostname".into(),
        "topologySpreadConstraints[1].whenUnsatisfiable=DoNotSchedule".into(),
        "topologySpreadConstraints[1].labelSelector.matchLabels.custom=yes".into(),
    ]);
    let pod = pod_spec(&docs);
    assert!(pod["priorityClassName"].is_null() && pod["nodeSelector"].is_null());
    assert_eq!(
        kind(&docs, "Deployment")[0]["spec"]["revisionHistoryLimit"],
        2
    );
    let template = &kind(&docs, "Deployment")[0]["spec"]["template"];
    assert_eq!(template["metadata"]["labels"]["team"], "ml");
    let selector = &kind(&docs, "Deployment")[0]["spec"]["selector"]["matchLabels"];
    // A constraint without a selector spreads the controller's own pods; one with keeps it.
    assert_eq!(
        pod["topologySpreadConstraints"],
        json!([
            { "maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
              "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": { "matchLabels": selector } },
            { "maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
              "whenUnsatisfiable": "DoNotSchedule", "labelSelector": { "matchLabels": { "custom": "yes" } } }
        ])
    );
}

/// `extraArgs` follow the flags of `config:` and reach the binary as given (one that repeats a
/// flag the chart sets is refused: the binary would refuse to start, see
/// `schema_refuses_what_the_controller_would_not_run_with`).
#[test]
fn extra_args_reach_the_binary() {
    let docs = render(&[
        "config.resyncPeriod=30m".into(),
        "extraArgs[0]=--cache-ttl=12h".into(),
        "extraArgs[1]=--ec2-timeout=3s".into(),
    ]);
    let args = args_of(&docs);
    assert_eq!(
        &args[args.len() - 2..],
        ["--cache-ttl=12h", "--ec2-timeout=3s"]
    );
    let cli = Cli::try_parse_from(std::iter::once("ec2-topology-labeler".to_string()).chain(args));
    assert!(cli.is_ok(), "{:?}", cli.err());
}

/// The ServiceMonitor: in another namespace if asked (selecting the Service in the release's),
/// with the relabelings given.
#[test]
fn service_monitor_namespace_and_relabelings() {
    let docs = render(&[
        "metrics.serviceMonitor.enabled=true".into(),
        "metrics.serviceMonitor.namespace=monitoring".into(),
        "metrics.serviceMonitor.relabelings[0].action=replace".into(),
        "metrics.serviceMonitor.relabelings[0].targetLabel=cluster".into(),
        "metrics.serviceMonitor.relabelings[0].replacement=prod".into(),
        "metrics.serviceMonitor.metricRelabelings[0].action=drop".into(),
        "metrics.serviceMonitor.metricRelabelings[0].sourceLabels[0]=__name__".into(),
        "metrics.serviceMonitor.metricRelabelings[0].regex=go_.*".into(),
    ]);
    let sm = kind(&docs, "ServiceMonitor")[0];
    assert_eq!(sm["metadata"]["namespace"], "monitoring");
    assert_eq!(
        sm["spec"]["namespaceSelector"]["matchNames"],
        json!(["ec2-topology-labeler"])
    );
    let endpoint = &sm["spec"]["endpoints"][0];
    assert_eq!(
        endpoint["relabelings"],
        json!([{ "action": "replace", "targetLabel": "cluster", "replacement": "prod" }])
    );
    assert_eq!(
        endpoint["metricRelabelings"],
        json!([{ "action": "drop", "sourceLabels": ["__name__"], "regex": "go_.*" }])
    );
    let service = kind(&docs, "Service")[0];
    for (k, v) in sm["spec"]["selector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(
            &service["metadata"]["labels"][k], v,
            "the Service carries {k}"
        );
    }
    let docs = render(&["metrics.serviceMonitor.enabled=true".into()]);
    assert_eq!(
        kind(&docs, "ServiceMonitor")[0]["metadata"]["namespace"],
        "ec2-topology-labeler"
    );
}

/// `rbac.create=false` and `serviceAccount.create=false`: nothing of theirs is rendered, and the
/// pod runs as the ServiceAccount named.
#[test]
fn rbac_and_service_account_can_be_brought_along() {
    let docs = render(&[
        "rbac.create=false".into(),
        "serviceAccount.create=false".into(),
        "serviceAccount.name=platform-labeler".into(),
        "config.slurmTopologyConfigmap=slurm/topo".into(),
    ]);
    for k in [
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "ServiceAccount",
    ] {
        assert!(kind(&docs, k).is_empty(), "{k} rendered");
    }
    assert_eq!(pod_spec(&docs)["serviceAccountName"], "platform-labeler");
    // The controller's, and the `helm test` Pod's (read-only).
    let docs = standing(&render(&[]));
    assert_eq!(kind(&docs, "ServiceAccount").len(), 2);
    assert_eq!(kind(&docs, "ClusterRole").len(), 2);
    let docs = standing(&render(&["tests.enabled=false".into()]));
    assert_eq!(kind(&docs, "ServiceAccount").len(), 1);
    assert_eq!(kind(&docs, "ClusterRole").len(), 1);
    // An empty name is the release's full name (Karpenter's convention).
    let docs = render(&["serviceAccount.name=".into()]);
    assert_eq!(
        kind(&docs, "ServiceAccount")[0]["metadata"]["name"],
        pod_spec(&docs)["serviceAccountName"]
    );
    assert_eq!(
        pod_spec(&docs)["serviceAccountName"],
        "ec2-topology-labeler"
    );
}

/// An umbrella chart with this one as a dependency renders, with no values at all and with
/// `global` values (which Helm hands every dependency); the dependency's schema still refuses
/// nonsense given through the umbrella.
#[test]
fn chart_works_as_a_dependency_of_an_umbrella_chart() {
    let dir = std::env::temp_dir().join(format!("ec2tl-umbrella-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let sub = dir.join("charts/ec2-topology-labeler");
    std::fs::create_dir_all(&sub).unwrap();
    let copy = std::process::Command::new("cp")
        .arg("-r")
        .arg(format!("{}/.", chart().display()))
        .arg(&sub)
        .status()
        .unwrap();
    assert!(copy.success());
    std::fs::write(
        dir.join("Chart.yaml"),
        "apiVersion: v2\nname: platform\nversion: 1.0.0\ndependencies:\n  - name: ec2-topology-labeler\n    version: \">=0.0.0-0\"\n",
    )
    .unwrap();
    let umbrella = dir.to_str().unwrap();
    let template = |values: &str| {
        let file = dir.join("values.yaml");
        std::fs::write(&file, values).unwrap();
        helm(
            None,
            &[
                "template",
                "platform",
                umbrella,
                "-f",
                file.to_str().unwrap(),
            ],
        )
    };
    for values in [
        "",
        "global: {}\n",
        "global:\n  imageRegistry: registry.example.com\n  clusterName: prod\n",
        "global:\n  team: ml\nec2-topology-labeler:\n  replicaCount: 1\n  leaderElection:\n    enabled: false\n",
    ] {
        let out = template(values).unwrap_or_else(|e| panic!("{values:?}: {e:#}"));
        assert!(out.contains("kind: Deployment"), "{values:?}");
    }
    let refused = template("ec2-topology-labeler:\n  leaderElection:\n    leaseDuration: banana\n");
    assert!(
        refused.is_err_and(|e| format!("{e:#}").contains("leaseDuration")),
        "the dependency's schema applies through the umbrella"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// No policy of the chart declares `variables`: kube-apiserver before 1.36 shares one type for
/// every policy's variables, writes it while compiling a policy that has some and reads it while
/// evaluating one, and dies with "concurrent map read and map write"
/// (kubernetes/kubernetes#135757). Our make test hit it at 1.30.14: a Node patch through the
/// nodes policy while another scenario installed the chart. Every optional policy is rendered.
#[test]
fn admission_policies_declare_no_variables() {
    let docs = render_with(
        &["--api-versions", VAP_API],
        &[
            "admissionPolicy.exclusiveKeys=true".into(),
            "config.slurmTopologyConfigmap=slurm/topology".into(),
            "config.startupTaint=example.com/pending:NoSchedule".into(),
        ],
    );
    let policies = kind(&docs, "ValidatingAdmissionPolicy");
    assert_eq!(
        policies.len(),
        4,
        "the nodes, scheduler objects, ConfigMaps and exclusive keys"
    );
    for p in policies {
        let name = &p["metadata"]["name"];
        assert!(
            p["spec"].get("variables").is_none(),
            "{name} declares variables"
        );
        let text = serde_json::to_string(&p["spec"]).unwrap();
        assert!(
            !text.contains("variables."),
            "{name} reads variables: {text}"
        );
    }
}

/// The ValidatingAdmissionPolicy: rendered only where the API server serves the API (Helm asks
/// the cluster; `helm template` knows it from `--api-versions`), and off when asked; its CEL
/// names exactly the configured keys, the startup taint and the ServiceAccount. (The e2e suite
/// runs it in a real API server.)
#[test]
fn admission_policy_follows_the_api_and_the_configuration() {
    use ec2_topology_labeler::labels::{
        CAPACITY_BLOCK_KEY, EKS_LAYER_PREFIX, EKS_ZONE_ID_KEY, PLACEMENT_GROUP_KEY, SLINKY_SPEC_KEY,
    };
    // Rendered without `--api-versions` too (the chart requires 1.30, where the API is GA):
    // a render that does not know the cluster must not ship without the policies.
    let names = |docs: &[Value], k: &str| -> Vec<String> {
        kind(docs, k)
            .iter()
            .map(|d| d["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    };
    let want = [
        "ec2-topology-labeler-nodes",
        "ec2-topology-labeler-scheduler-objects",
        "ec2-topology-labeler-configmaps",
    ];
    let docs = render(&[]);
    assert_eq!(names(&docs, "ValidatingAdmissionPolicy"), want);
    assert_eq!(names(&docs, "ValidatingAdmissionPolicyBinding"), want);
    assert_eq!(
        names(&standing(&docs), "ValidatingAdmissionPolicy"),
        want,
        "not hooks"
    );
    let api = ["--api-versions", VAP_API];
    let policies = |docs: &[Value]| -> Vec<Value> {
        docs.iter()
            .filter(|d| {
                d["kind"]
                    .as_str()
                    .is_some_and(|k| k.starts_with("ValidatingAdmissionPolicy"))
            })
            .cloned()
            .collect()
    };
    assert_eq!(
        policies(&render_with(&api, &[])),
        policies(&docs),
        "the same with the API listed"
    );
    let docs = render_with(&api, &["admissionPolicy.enabled=false".into()]);
    assert!(
        kind(&docs, "ValidatingAdmissionPolicy").is_empty(),
        "turned off"
    );
    let docs = render_with(&api, &[]);
    let policy = kind(&docs, "ValidatingAdmissionPolicy")[0];
    let binding = kind(&docs, "ValidatingAdmissionPolicyBinding")[0];
    assert_eq!(binding["spec"]["policyName"], policy["metadata"]["name"]);
    assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
    assert_eq!(policy["spec"]["failurePolicy"], "Fail");
    assert_eq!(
        policy["spec"]["matchConstraints"]["resourceRules"][0]["resources"],
        json!(["nodes", "nodes/status"])
    );
    assert_eq!(
        policy["spec"]["matchConditions"][0]["expression"],
        r#"request.userInfo.username == "system:serviceaccount:ec2-topology-labeler:ec2-topology-labeler""#
    );
    let cel = |p: &Value| -> String {
        p["spec"]["validations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| {
                let text = |k: &str| v[k].as_str().unwrap_or_default().to_string();
                format!("{} {}", text("expression"), text("message"))
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    // The chart's defaults are the binary's.
    let text = cel(policy);
    for key in [
        EKS_LAYER_PREFIX,
        EKS_ZONE_ID_KEY,
        CAPACITY_BLOCK_KEY,
        PLACEMENT_GROUP_KEY,
    ] {
        assert!(
            text.contains(&format!("\"{key}\"")),
            "{key} missing:\n{text}"
        );
    }
    assert!(text.contains("may only remove ec2-topology-labeler.io/interconnect-impaired:NoSchedule from a Node's taints (config.startupTaint is not set, config.ultraserverHealthTaint is off)"));
    // Slinky's annotation and UltraServer shape off: they may only be removed.
    let end = "ec2-topology-labeler.io/capacity-block-end";
    assert!(
        text.contains(&format!("k in [\"{SLINKY_SPEC_KEY}\",\"{end}\"])")),
        "{text}"
    );
    // The verification record earlier versions kept on Nodes: still settable for one release
    // (the previous version's leader during a rollout writes it; issue 60 moved it).
    assert!(
        text.contains(".all(k, k in [\"ec2-topology-labeler.io/placement-group\",\"ec2-topology-labeler.io/verified\"])"),
        "{text}"
    );
    let shape_labels = "\"ec2-topology-labeler.io/ultraserver-type\",\"ec2-topology-labeler.io/capacity-block-size\"]";
    let retired_line = |text: &str| {
        text.lines()
            .find(|l| l.starts_with("((oldObject.metadata.?labels"))
            .unwrap_or_default()
            .to_string()
    };
    let set_line = |text: &str| {
        text.lines()
            .find(|l| l.starts_with("((object.metadata.?labels"))
            .unwrap_or_default()
            .to_string()
    };
    assert!(
        !set_line(&text).contains(shape_labels) && retired_line(&text).contains(shape_labels),
        "{text}"
    );
    // On: set too.
    let on = cel(kind(
        &render_with(&api, &["config.ultraserverShape=true".into()]),
        "ValidatingAdmissionPolicy",
    )[0]);
    assert!(set_line(&on).contains(shape_labels), "{on}");
    assert!(on.contains(&format!("\"{end}\"]")), "{on}");
    let docs = render_with(
        &api,
        &[
            "config.layerLabelPrefix=example.com/tier-".into(),
            "config.zoneIdLabelKey=example.com/zone".into(),
            "config.startupTaint=example.com/pending=yes:NoExecute".into(),
            "config.slinkyAnnotation=true".into(),
            "serviceAccount.name=labeler".into(),
        ],
    );
    let policy = kind(&docs, "ValidatingAdmissionPolicy")[0];
    let text = cel(policy);
    assert!(
        text.contains(r#"k.startsWith("example.com/tier-") && k.substring(17)"#),
        "{text}"
    );
    assert!(text.contains(r#""example.com/zone""#));
    assert!(text.contains(r#"t.key == "example.com/pending" && t.effect == "NoExecute""#));
    // The defaults this configuration replaced may still be removed (the controller retires them).
    assert!(text.contains(&format!(r#"k.startsWith("{EKS_LAYER_PREFIX}")"#)));
    assert!(
        text.contains(&format!(r#"k in ["{EKS_ZONE_ID_KEY}","#)),
        "{text}"
    );
    assert!(
        policy["spec"]["matchConditions"][0]["expression"]
            .as_str()
            .unwrap()
            .ends_with(r#""system:serviceaccount:ec2-topology-labeler:labeler""#)
    );
    // A label preset: its keys are the controller's own (topograph's tiers numbered from 0);
    // the default family and the other presets' keys may only be removed.
    let docs = render_with(&api, &["config.labelPreset=topograph".into()]);
    let text = cel(kind(&docs, "ValidatingAdmissionPolicy")[0]);
    let (set, removed) = text
        .split_once("\n((oldObject.metadata.?labels.orValue({})).filter(")
        .unwrap_or((&text, ""));
    assert!(
        set.contains(r#"k.startsWith("fabric.topograph.run/tier-") && k.substring(26).matches('^([0-9]|1[0-5])$')"#),
        "{text}"
    );
    assert!(
        set.contains(r#""accelerator.topograph.run/domain""#),
        "{text}"
    );
    assert!(
        !set.contains(&format!(r#"k.startsWith("{EKS_LAYER_PREFIX}")"#)),
        "{set}"
    );
    assert!(
        removed.contains(&format!(r#"k.startsWith("{EKS_LAYER_PREFIX}")"#)),
        "{removed}"
    );
    assert!(
        removed.contains(&format!(r#""{CAPACITY_BLOCK_KEY}""#)),
        "{removed}"
    );
    let docs = render_with(&api, &["config.labelPreset=hyperpod".into()]);
    let text = cel(kind(&docs, "ValidatingAdmissionPolicy")[0]);
    let (set, removed) = text
        .split_once("\n((oldObject.metadata.?labels.orValue({})).filter(")
        .unwrap_or((&text, ""));
    assert!(
        set.contains(r#""topology.k8s.aws/ultraserver-id""#),
        "{set}"
    );
    assert!(
        removed.contains(r#"k.startsWith("fabric.topograph.run/tier-")"#),
        "{removed}"
    );
}

/// The scheduler-objects policy: rendered with the Node one, it binds the controller's
/// ServiceAccount on HyperNodes and Kueue and KAI Topologies (create, update, delete) to the
/// owner annotation the controller writes: this installation's Lease, `<namespace>/<leaseName>`,
/// following `leaderElection.leaseName` and a `--leader-election-namespace` in `extraArgs` (the
/// e2e suite runs it in a real API server).
#[test]
fn scheduler_objects_policy_names_this_installation() {
    let api = ["--api-versions", VAP_API];
    let policy = |sets: &[String]| -> Value {
        let docs = render_with(&api, sets);
        let binding = kind(&docs, "ValidatingAdmissionPolicyBinding")
            .into_iter()
            .find(|d| d["metadata"]["name"] == "ec2-topology-labeler-scheduler-objects")
            .cloned()
            .expect("its binding");
        assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
        kind(&docs, "ValidatingAdmissionPolicy")
            .into_iter()
            .find(|d| d["metadata"]["name"] == "ec2-topology-labeler-scheduler-objects")
            .cloned()
            .expect("the scheduler-objects policy")
    };
    // The owner, as the first validation compares the old object's annotation with it.
    let owner = |p: &Value| -> String {
        let e = p["spec"]["validations"][0]["expression"].as_str().unwrap();
        e.rsplit_once(".orValue('') == ").unwrap().1.to_string()
    };
    let p = policy(&[]);
    assert_eq!(p["spec"]["failurePolicy"], "Fail");
    let rules = &p["spec"]["matchConstraints"]["resourceRules"];
    assert_eq!(rules[0]["apiGroups"], json!(["topology.volcano.sh"]));
    assert_eq!(rules[0]["resources"], json!(["hypernodes"]));
    assert_eq!(
        rules[1]["apiGroups"],
        json!(["kueue.x-k8s.io", "kai.scheduler"])
    );
    assert_eq!(rules[1]["resources"], json!(["topologies"]));
    for r in rules.as_array().unwrap() {
        assert_eq!(r["operations"], json!(["CREATE", "UPDATE", "DELETE"]));
    }
    assert_eq!(
        p["spec"]["matchConditions"][0]["expression"],
        r#"request.userInfo.username in ["system:serviceaccount:ec2-topology-labeler:ec2-topology-labeler","system:serviceaccount:ec2-topology-labeler:ec2-topology-labeler-retire"]"#
    );
    assert_eq!(owner(&p), r#""ec2-topology-labeler/ec2-topology-labeler""#);
    let v = p["spec"]["validations"].to_string();
    assert_eq!(
        v.matches(r#"\"ec2-topology-labeler/ec2-topology-labeler\""#)
            .count(),
        4,
        "{v}"
    );
    let p = policy(&[
        "leaderElection.leaseName=team-a".into(),
        "extraArgs={--leader-election-namespace=leases}".into(),
    ]);
    assert_eq!(owner(&p), r#""leases/team-a""#);
    let docs = render_with(&api, &["admissionPolicy.enabled=false".into()]);
    assert!(kind(&docs, "ValidatingAdmissionPolicy").is_empty());
}

/// `admissionPolicy.exclusiveKeys`: off by default; on, a second policy and its binding match
/// every writer of Nodes (create and update) but the controller, the uninstall hook and the
/// exempt, and name this configuration's keys (the e2e suite runs it in a real API server).
#[test]
fn exclusive_keys_policy_is_opt_in_and_exempts_the_controller() {
    let api = ["--api-versions", VAP_API];
    let named = |docs: &[Value], kind_: &str| -> usize {
        kind(docs, kind_)
            .iter()
            .filter(|d| {
                d["metadata"]["name"]
                    .as_str()
                    .unwrap()
                    .ends_with("-exclusive-keys")
            })
            .count()
    };
    let docs = render_with(&api, &[]);
    assert_eq!(
        named(&docs, "ValidatingAdmissionPolicy"),
        0,
        "off by default"
    );
    let docs = render_with(
        &api,
        &[
            "admissionPolicy.exclusiveKeys=true".into(),
            "admissionPolicy.exclusiveKeysExempt={breakglass}".into(),
            "config.layerLabelPrefix=example.com/layer-".into(),
        ],
    );
    assert_eq!(named(&docs, "ValidatingAdmissionPolicy"), 1);
    assert_eq!(named(&docs, "ValidatingAdmissionPolicyBinding"), 1);
    let policy = kind(&docs, "ValidatingAdmissionPolicy")
        .into_iter()
        .find(|d| d["metadata"]["name"] == "ec2-topology-labeler-exclusive-keys")
        .unwrap();
    assert_eq!(
        policy["spec"]["matchConstraints"]["resourceRules"][0]["operations"],
        json!(["CREATE", "UPDATE"])
    );
    let condition = policy["spec"]["matchConditions"][0]["expression"]
        .as_str()
        .unwrap();
    for who in [
        "system:serviceaccount:ec2-topology-labeler:ec2-topology-labeler",
        "system:serviceaccount:ec2-topology-labeler:ec2-topology-labeler-uninstall",
        "breakglass",
    ] {
        assert!(
            condition.contains(&format!("\"{who}\"")),
            "{who} exempt: {condition}"
        );
    }
    let cel = policy["spec"]["validations"].to_string();
    assert!(
        cel.contains(r#"k.startsWith(\"example.com/layer-\")"#),
        "{cel}"
    );
    assert!(
        !cel.contains("network-node-layer-"),
        "the default family is not this configuration's: {cel}"
    );
    assert!(cel.contains("ec2-topology-labeler.io/verified"), "{cel}");
}

/// `helm test`: the pod runs `tree --min-labelled=1` with the configuration's label flags (all
/// the binary's `tree` reads, and nothing else: the binary parses them), the controller's image
/// under a ServiceAccount of its own, and not the controller's selector labels (its ReplicaSet
/// would adopt it).
#[test]
fn helm_test_pod_reads_the_labels_as_configured() {
    let label_keys: Vec<String> =
        generator().into_root_schema_for::<LabelArgs>().to_value()["properties"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
    let all = config_schema();
    let mut sets: Vec<String> = label_keys
        .iter()
        .map(|k| format!("config.{k}={}", example(k, &all["properties"][k])))
        .collect();
    sets.push("config.startupTaint=example.com/pending:NoSchedule".into());
    sets.push("config.resyncPeriod=5m".into());
    sets.push("config.layerNumbering=top-first".into());
    sets.push("config.labelPreset=hyperpod".into());
    let docs = render(&sets);
    let pods = kind(&docs, "Pod");
    assert_eq!(pods.len(), 1);
    let pod = pods[0];
    assert_eq!(pod["metadata"]["annotations"]["helm.sh/hook"], "test");
    let args: Vec<String> = pod["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    assert_eq!(&args[..2], ["tree", "--min-labelled=1"]);
    let cli = Cli::try_parse_from(
        std::iter::once("ec2-topology-labeler".to_string()).chain(args.clone()),
    );
    assert!(cli.is_ok(), "{args:?}: {:?}", cli.err());
    for key in label_keys.iter().chain([&"startupTaint".to_string()]) {
        let flag = format!("--{}=", kebab(key));
        assert!(
            args.iter().any(|a| a.starts_with(&flag)),
            "{key}: no {flag} in {args:?}"
        );
    }
    assert!(
        !args.iter().any(|a| a.starts_with("--resync-period")),
        "{args:?}"
    );
    assert_eq!(
        pod["spec"]["serviceAccountName"],
        "ec2-topology-labeler-test"
    );
    assert_eq!(pod["spec"]["restartPolicy"], "Never");
    let selector = kind(&docs, "Deployment")[0]["spec"]["selector"]["matchLabels"].clone();
    let labels = &pod["metadata"]["labels"];
    assert!(
        selector
            .as_object()
            .unwrap()
            .iter()
            .any(|(k, v)| &labels[k] != v),
        "the test pod matches the controller's selector: {labels}"
    );
    // It tolerates the startup taint like the controller: it must run on a fresh cluster too.
    assert_eq!(
        pod["spec"]["tolerations"],
        json!([{ "key": "example.com/pending", "operator": "Exists" }])
    );
    assert!(kind(&render(&["tests.enabled=false".into()]), "Pod").is_empty());
}

/// `helm test` does not run as the controller: its Pod has a ServiceAccount of its own, bound
/// to a ClusterRole that may only read Nodes (what `tree` lists). Those three are installed
/// with the release, not as test hooks: `helm test --logs` (Helm 3) fetches the logs of every
/// test hook as a Pod's and fails on any other kind.
#[test]
fn helm_test_runs_under_a_read_only_service_account_of_its_own() {
    let docs = render(&[]);
    let test: Vec<&Value> = docs
        .iter()
        .filter(|d| d["metadata"]["annotations"]["helm.sh/hook"] == "test")
        .collect();
    assert_eq!(
        test.iter().map(|d| d["kind"].clone()).collect::<Vec<_>>(),
        ["Pod"],
        "only Pods are test hooks (helm test --logs)"
    );
    let pod = test[0];
    let sa = pod["spec"]["serviceAccountName"].as_str().unwrap();
    assert_ne!(
        sa,
        kind(&docs, "Deployment")[0]["spec"]["template"]["spec"]["serviceAccountName"]
            .as_str()
            .unwrap(),
        "the test Pod runs as the controller"
    );
    let standing = standing(&docs);
    let named = |k: &str| -> Value {
        kind(&standing, k)
            .into_iter()
            .find(|d| d["metadata"]["name"] == sa)
            .cloned()
            .unwrap_or_else(|| panic!("the test's {k}"))
    };
    named("ServiceAccount");
    let role = named("ClusterRole");
    assert_eq!(
        role["rules"],
        json!([{ "apiGroups": [""], "resources": ["nodes"], "verbs": ["list"] }]),
        "reads Nodes, nothing else"
    );
    let read_only = ["get", "list", "watch"];
    for r in role["rules"].as_array().unwrap() {
        for v in r["verbs"].as_array().unwrap() {
            assert!(read_only.contains(&v.as_str().unwrap()), "write verb {v}");
        }
    }
    let binding = named("ClusterRoleBinding");
    assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
    assert_eq!(
        binding["subjects"],
        json!([{ "kind": "ServiceAccount", "name": sa, "namespace": "ec2-topology-labeler" }])
    );
    // No Role or RoleBinding names it (no rights in any namespace).
    assert!(
        kind(&standing, "RoleBinding")
            .iter()
            .all(|b| !b["subjects"].to_string().contains(&format!("\"{sa}\"")))
    );
    // Kept for `helm test --logs`, replaced by the next run.
    assert_eq!(
        pod["metadata"]["annotations"]["helm.sh/hook-delete-policy"],
        "before-hook-creation"
    );
    // With RBAC brought along there is no test, and none of its objects; nor with tests off.
    for sets in [["rbac.create=false"], ["tests.enabled=false"]] {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        let docs = render(&sets);
        assert!(kind(&docs, "Pod").is_empty(), "{sets:?}");
        assert!(docs.iter().all(|d| d["metadata"]["name"] != sa), "{sets:?}");
    }
}

/// Every hook's ServiceAccount and RBAC is deleted when its hook fails too (`hook-failed`), not
/// only when it succeeds; the Jobs themselves hold no rights and stay for their logs.
#[test]
fn hook_rbac_goes_when_the_hook_fails() {
    let docs = render(&[
        "uninstallHook.enabled=true".into(),
        "config.slurmTopologyConfigmap=slurm/slurm-topology".into(),
    ]);
    let hooks: Vec<&Value> = docs
        .iter()
        .filter(|d| !d["metadata"]["annotations"]["helm.sh/hook"].is_null())
        .collect();
    let mut rbac = 0;
    for d in &hooks {
        let kind_ = d["kind"].as_str().unwrap();
        let policy = d["metadata"]["annotations"]["helm.sh/hook-delete-policy"]
            .as_str()
            .unwrap_or_default();
        let name = d["metadata"]["name"].as_str().unwrap();
        match kind_ {
            "ServiceAccount" | "ClusterRole" | "ClusterRoleBinding" | "Role" | "RoleBinding" => {
                rbac += 1;
                let policies: Vec<&str> = policy.split(',').collect();
                for p in ["before-hook-creation", "hook-succeeded", "hook-failed"] {
                    assert!(policies.contains(&p), "{kind_} {name}: {policy}");
                }
            }
            // Kept when they fail, for `kubectl logs`.
            "Job" | "Pod" => assert!(!policy.contains("hook-failed"), "{kind_} {name}: {policy}"),
            other => panic!("unexpected hook {other} {name}"),
        }
    }
    // retire: SA, ClusterRole + binding, Role + binding; uninstall: the same and the Slurm
    // Role + binding.
    assert_eq!(rbac, 5 + 7, "{hooks:#?}");
}

/// The controller never falls back to the node's instance role unless asked: its container
/// has `AWS_EC2_METADATA_DISABLED=true` by default, not with `aws.useNodeRole`; an `extraEnv`
/// entry of that name is taken instead of the chart's (never twice), and one that would turn
/// IMDS back on is refused.
#[test]
fn imds_is_off_unless_the_node_role_is_asked_for() {
    let imds = |docs: &[Value]| -> Vec<Value> {
        container(docs)["env"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["name"] == "AWS_EC2_METADATA_DISABLED")
            .map(|e| e["value"].clone())
            .collect()
    };
    assert_eq!(imds(&render(&[])), [json!("true")]);
    let on = render(&["aws.useNodeRole=true".into()]);
    assert!(imds(&on).is_empty(), "the node role asked for");
    let given = render_args(&[
        "--set".into(),
        "extraEnv[0].name=AWS_EC2_METADATA_DISABLED".into(),
        "--set-string".into(),
        "extraEnv[0].value=true".into(),
    ]);
    assert_eq!(imds(&given), [json!("true")], "once, not twice");
    let refused = render_result(&[
        "extraEnv[0].name=AWS_EC2_METADATA_DISABLED".into(),
        "extraEnv[0].value=false".into(),
    ]);
    assert!(
        refused.is_err_and(|e| format!("{e:#}").contains("aws.useNodeRole")),
        "IMDS turned on through extraEnv"
    );
    // The kind suite's values (static keys, IRSA, Pod Identity to stand-ins) name it
    // themselves: each renders with it once.
    let kind_dir = e2e::repo_root().join("e2e/kind");
    for values in [
        "values.yaml",
        "values-irsa.yaml",
        "values-pod-identity.yaml",
    ] {
        let mut args = vec![];
        for f in ["values.yaml", values] {
            args.push("-f".to_string());
            args.push(kind_dir.join(f).to_string_lossy().to_string());
        }
        let docs = render_args(&args);
        assert_eq!(imds(&docs), [json!("true")], "{values}");
    }
}

/// `networkPolicy.enabled`: off by default; on, a NetworkPolicy on the controller's Pods only:
/// in, the metrics port (from the configured peers); out, DNS, the API server's CIDRs and ports,
/// AWS over 443, the Pod Identity agent, IMDS only with `aws.useNodeRole`, and `extra`.
#[test]
fn network_policy_is_opt_in_and_allows_only_what_the_controller_calls() {
    assert!(
        kind(&render(&[]), "NetworkPolicy").is_empty(),
        "off by default"
    );
    let docs = render(&["networkPolicy.enabled=true".into()]);
    let np = kind(&docs, "NetworkPolicy");
    assert_eq!(np.len(), 1);
    let spec = &np[0]["spec"];
    assert_eq!(
        spec["podSelector"]["matchLabels"],
        kind(&docs, "Deployment")[0]["spec"]["selector"]["matchLabels"]
    );
    assert_eq!(spec["policyTypes"], json!(["Ingress", "Egress"]));
    assert_eq!(
        spec["ingress"],
        json!([{ "ports": [{ "protocol": "TCP", "port": 8080 }] }]),
        "the metrics and probes' port, from anyone"
    );
    let any = json!([{ "ipBlock": { "cidr": "0.0.0.0/0" } }, { "ipBlock": { "cidr": "::/0" } }]);
    assert_eq!(
        spec["egress"],
        json!([
            { "ports": [{ "protocol": "UDP", "port": 53 }, { "protocol": "TCP", "port": 53 }] },
            { "ports": [{ "protocol": "TCP", "port": 443 }, { "protocol": "TCP", "port": 6443 }], "to": any },
            { "ports": [{ "protocol": "TCP", "port": 443 }], "to": any },
            { "ports": [{ "protocol": "TCP", "port": 80 }],
              "to": [{ "ipBlock": { "cidr": "169.254.170.23/32" } }, { "ipBlock": { "cidr": "fd00:ec2::23/128" } }] }
        ])
    );
    // Every egress rule names its ports: nothing but these ports leaves the Pods.
    for rule in spec["egress"].as_array().unwrap() {
        assert!(!rule["ports"].as_array().unwrap().is_empty(), "{rule}");
    }
    let docs = render(&[
        "networkPolicy.enabled=true".into(),
        "networkPolicy.ingress.from[0].namespaceSelector.matchLabels.name=monitoring".into(),
        "networkPolicy.egress.apiServerCIDRs={10.0.0.0/16}".into(),
        "networkPolicy.egress.apiServerPorts={443}".into(),
        "networkPolicy.egress.awsCIDRs={10.0.128.0/20,2600:1f14::/56}".into(),
        "networkPolicy.egress.dnsTo[0].namespaceSelector.matchLabels.name=kube-system".into(),
        "networkPolicy.egress.podIdentityAgent=false".into(),
        "networkPolicy.egress.extra[0].to[0].podSelector.matchLabels.app=mock-ec2".into(),
        "networkPolicy.egress.extra[0].ports[0].port=8080".into(),
        "aws.useNodeRole=true".into(),
        "metrics.port=9090".into(),
    ]);
    let spec = &kind(&docs, "NetworkPolicy")[0]["spec"];
    assert_eq!(
        spec["ingress"],
        json!([{ "ports": [{ "protocol": "TCP", "port": 9090 }],
                 "from": [{ "namespaceSelector": { "matchLabels": { "name": "monitoring" } } }] }])
    );
    assert_eq!(
        spec["egress"],
        json!([
            { "ports": [{ "protocol": "UDP", "port": 53 }, { "protocol": "TCP", "port": 53 }],
              "to": [{ "namespaceSelector": { "matchLabels": { "name": "kube-system" } } }] },
            { "ports": [{ "protocol": "TCP", "port": 443 }], "to": [{ "ipBlock": { "cidr": "10.0.0.0/16" } }] },
            { "ports": [{ "protocol": "TCP", "port": 443 }],
              "to": [{ "ipBlock": { "cidr": "10.0.128.0/20" } }, { "ipBlock": { "cidr": "2600:1f14::/56" } }] },
            { "ports": [{ "protocol": "TCP", "port": 80 }],
              "to": [{ "ipBlock": { "cidr": "169.254.169.254/32" } }, { "ipBlock": { "cidr": "fd00:ec2::254/128" } }] },
            { "to": [{ "podSelector": { "matchLabels": { "app": "mock-ec2" } } }], "ports": [{ "port": 8080 }] }
        ])
    );
    // An empty list would leave a rule without `to` (every destination); a malformed CIDR or
    // port is refused at render time.
    for bad in [
        "networkPolicy.egress.awsCIDRs=null",
        "networkPolicy.egress.apiServerCIDRs={}",
        "networkPolicy.egress.apiServerPorts={}",
        "networkPolicy.egress.awsCIDRs={10.0.0.0}",
        "networkPolicy.egress.awsCIDRs={300.0.0.0/8}",
        "networkPolicy.egress.apiServerPorts={0}",
        "networkPolicy.egres.extra={}",
    ] {
        assert!(
            render_result(&["networkPolicy.enabled=true".into(), bad.into()]).is_err(),
            "{bad} accepted"
        );
    }
}

/// The ConfigMap policy: the controller's ServiceAccount may create, update and delete only the
/// ConfigMap `config.slurmTopologyConfigmap` names (RBAC cannot limit `create` by name); with
/// none configured, no ConfigMap at all.
#[test]
fn configmap_policy_names_the_configured_slurm_configmap() {
    let policy = |sets: &[String]| -> Value {
        let docs = render(sets);
        let binding = kind(&docs, "ValidatingAdmissionPolicyBinding")
            .into_iter()
            .find(|d| d["metadata"]["name"] == "ec2-topology-labeler-configmaps")
            .cloned()
            .expect("its binding");
        assert_eq!(
            binding["spec"]["policyName"],
            "ec2-topology-labeler-configmaps"
        );
        assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
        kind(&docs, "ValidatingAdmissionPolicy")
            .into_iter()
            .find(|d| d["metadata"]["name"] == "ec2-topology-labeler-configmaps")
            .cloned()
            .expect("the ConfigMap policy")
    };
    let p = policy(&["config.slurmTopologyConfigmap=slurm/slurm-topology".into()]);
    assert_eq!(p["spec"]["failurePolicy"], "Fail");
    assert_eq!(
        p["spec"]["matchConstraints"]["resourceRules"],
        json!([{ "apiGroups": [""], "apiVersions": ["v1"],
                 "operations": ["CREATE", "UPDATE", "DELETE"], "resources": ["configmaps"] }])
    );
    assert_eq!(
        p["spec"]["matchConditions"][0]["expression"],
        r#"request.userInfo.username == "system:serviceaccount:ec2-topology-labeler:ec2-topology-labeler""#
    );
    let check = p["spec"]["validations"][0]["expression"].as_str().unwrap();
    for part in [
        r#""slurm-topology" != ''"#,
        r#"request.namespace == "slurm""#,
        r#"object == null || object.metadata.name == "slurm-topology""#,
        r#"oldObject == null || oldObject.metadata.name == "slurm-topology""#,
    ] {
        assert!(check.contains(part), "{part}: {check}");
    }
    // The same name the Role's get and patch are limited to.
    let docs = render(&["config.slurmTopologyConfigmap=slurm/slurm-topology".into()]);
    let role = kind(&docs, "Role")
        .into_iter()
        .find(|r| r["metadata"]["namespace"] == "slurm")
        .unwrap();
    assert_eq!(role["rules"][1]["resourceNames"], json!(["slurm-topology"]));
    // Another name and ServiceAccount follow the values.
    let p = policy(&[
        "config.slurmTopologyConfigmap=hpc/topo".into(),
        "serviceAccount.name=labeler".into(),
    ]);
    let check = p["spec"]["validations"][0]["expression"].as_str().unwrap();
    assert!(check.contains(r#"request.namespace == "hpc""#), "{check}");
    assert!(
        check.contains(r#"object.metadata.name == "topo""#),
        "{check}"
    );
    assert!(
        p["spec"]["matchConditions"][0]["expression"]
            .as_str()
            .unwrap()
            .ends_with(r#":labeler""#)
    );
    // None configured: every ConfigMap write by the controller is refused but its ledger's
    // shards (created and updated, never deleted), in its own namespace, by name.
    let p = policy(&[]);
    let check = p["spec"]["validations"][0]["expression"].as_str().unwrap();
    assert!(check.starts_with(r#"("" != ''"#), "{check}");
    assert!(
        check.ends_with(
            r#"("^ec2-topology-labeler-records-[0-5][0-9]$|^ec2-topology-labeler-records-6[0-3]$" != '' && request.operation != 'DELETE' && request.namespace == "ec2-topology-labeler" && object.metadata.name.matches("^ec2-topology-labeler-records-[0-5][0-9]$|^ec2-topology-labeler-records-6[0-3]$"))"#
        ),
        "{check}"
    );
    let message = p["spec"]["validations"][0]["messageExpression"]
        .as_str()
        .unwrap();
    assert!(
        message.contains("config.slurmTopologyConfigmap is not set")
            && message.contains(
                "its verification ledger (ec2-topology-labeler/ec2-topology-labeler-records-NN)"
            ),
        "{message}"
    );
    // Without a record key there is no ledger: no ConfigMap at all.
    let p = policy(&["recordKey.enabled=false".into()]);
    let check = p["spec"]["validations"][0]["expression"].as_str().unwrap();
    assert!(
        check.contains(r#"("" != '' && request.operation"#),
        "{check}"
    );
}

/// The Node policy compares a Node's spec and status whole, but for the taints (their own
/// rule) and the TopologyLabeled condition: no list of fields that misses one Kubernetes adds.
#[test]
fn node_policy_compares_spec_and_status_whole() {
    let docs = render(&[]);
    let p = kind(&docs, "ValidatingAdmissionPolicy")
        .into_iter()
        .find(|d| d["metadata"]["name"] == "ec2-topology-labeler-nodes")
        .unwrap();
    let validations = p["spec"]["validations"].to_string();
    let old = "(dyn(oldObject).?status.orValue({}))";
    let new = "(dyn(object).?status.orValue({}))";
    let changed_status = format!(
        "({new}.filter(k, k != 'conditions' && !(k in {old} && {old}[k] == {new}[k])) + \
         {old}.filter(k, k != 'conditions' && !(k in {new})))"
    );
    let old = "(dyn(oldObject).?spec.orValue({}))";
    let new = "(dyn(object).?spec.orValue({}))";
    let changed_spec = format!(
        "({new}.filter(k, k != 'taints' && !(k in {old} && {old}[k] == {new}[k])) + \
         {old}.filter(k, k != 'taints' && !(k in {new})))"
    );
    let text: Vec<&str> = p["spec"]["validations"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["expression"].as_str())
        .collect();
    for check in [
        format!("{changed_status}.size() == 0"),
        format!("{changed_spec}.size() == 0"),
        "(object.?status.?conditions.orValue([]).filter(c, c.type != 'TopologyLabeled' && c.type != 'UltraServerInterconnectImpaired')) == \
         (oldObject.?status.?conditions.orValue([]).filter(c, c.type != 'TopologyLabeled' && c.type != 'UltraServerInterconnectImpaired'))"
            .to_string(),
    ] {
        assert!(text.contains(&check.as_str()), "{check}: {text:#?}");
    }
    for field in [
        "capacity",
        "allocatable",
        "nodeInfo",
        "podCIDR",
        "providerID",
    ] {
        assert!(
            !validations.contains(&format!("?{field}")),
            "{field} listed one by one: {validations}"
        );
    }
    // The UltraServerInterconnectImpaired condition is set only with config.ultraserverHealth;
    // without it, it may only be removed (the controller takes it off at start-up).
    let condition_rules = |sets: &[String]| -> Vec<String> {
        let docs = render(sets);
        let p = kind(&docs, "ValidatingAdmissionPolicy")
            .into_iter()
            .find(|d| d["metadata"]["name"] == "ec2-topology-labeler-nodes")
            .unwrap();
        p["spec"]["validations"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|v| v["expression"].as_str())
            .filter(|e| e.contains("conditions.orValue([])"))
            .map(str::to_string)
            .collect()
    };
    let only_removed = "filter(c, c.type == 'UltraServerInterconnectImpaired').all(c,";
    let off = condition_rules(&[]);
    assert!(
        off.iter().any(|r| r.contains(only_removed)),
        "without config.ultraserverHealth the condition may only be removed: {off:#?}"
    );
    let on = condition_rules(&["config.ultraserverHealth=true".into()]);
    assert!(
        !on.iter().any(|r| r.contains(only_removed)),
        "with config.ultraserverHealth the condition is written: {on:#?}"
    );
}

fn kebab(key: &str) -> String {
    key.chars()
        .flat_map(|c| {
            if c.is_ascii_uppercase() {
                vec!['-', c.to_ascii_lowercase()]
            } else {
                vec![c]
            }
        })
        .collect()
}

/// The chart's README is what helm-docs makes of values.yaml and README.md.gotmpl now, and every
/// value in its table is described.
#[test]
fn chart_readme_is_generated_from_the_values() {
    let tools = e2e::built_by("e2e/tools/build.sh", "E2E_TOOLS").expect("tools");
    let out = std::process::Command::new(tools.join("helm-docs"))
        .args([
            "--chart-search-root",
            ".",
            "--skip-version-footer",
            "--dry-run",
            "--log-level",
            "error",
        ])
        .current_dir(chart())
        .output()
        .expect("helm-docs runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let want = String::from_utf8(out.stdout).unwrap();
    let path = chart().join("README.md");
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have.trim_end() == want.trim_end(),
        "{} is stale: run `make chart-docs`",
        path.display()
    );
    let rows: Vec<&str> = have
        .lines()
        .skip_while(|l| !l.starts_with("## Values"))
        .filter(|l| l.starts_with("| ") && !l.starts_with("| Key"))
        .collect();
    assert!(rows.len() > 40, "{} value rows", rows.len());
    for row in rows {
        let description = row
            .trim_end_matches('|')
            .rsplit(" | ")
            .next()
            .unwrap_or("")
            .trim();
        assert!(!description.is_empty(), "undocumented value: {row}");
    }
}

/// One row of docs/benchmarks-scale.csv (or -everything.csv): its columns by name.
struct Row(BTreeMap<String, String>);

impl Row {
    fn get(&self, col: &str) -> &str {
        self.0
            .get(col)
            .map(String::as_str)
            .unwrap_or_else(|| panic!("no column {col}"))
    }
    fn num(&self, col: &str) -> f64 {
        self.get(col)
            .parse()
            .unwrap_or_else(|e| panic!("{col}={:?}: {e}", self.get(col)))
    }
    fn nodes(&self) -> u64 {
        self.get("nodes").parse().expect("nodes")
    }
    /// The resident sizes after each steady resync, lowest and highest.
    fn at_rest(&self, col: &str) -> (f64, f64) {
        let v: Vec<f64> = self
            .get(col)
            .split(';')
            .map(|x| x.parse().expect("steady RSS"))
            .collect();
        (
            v.iter().copied().fold(f64::MAX, f64::min),
            v.iter().copied().fold(0.0, f64::max),
        )
    }
}

fn csv_rows(file: &str) -> Vec<Row> {
    let csv = std::fs::read_to_string(e2e::repo_root().join(file)).unwrap();
    let header: Vec<&str> = csv.lines().next().unwrap_or_default().split(',').collect();
    csv.lines()
        .skip(1)
        .map(|l| {
            Row(header
                .iter()
                .zip(l.split(','))
                .map(|(h, v)| (h.to_string(), v.to_string()))
                .collect())
        })
        .collect()
}

/// A whole number with thousands separated by commas (`20,000`).
fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The smallest of Kubernetes' usual memory sizes at or above `mib`.
fn quantity_at_least(mib: f64) -> u64 {
    [96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048]
        .into_iter()
        .find(|&q| q as f64 >= mib)
        .unwrap_or(4096)
}

fn mebibytes(q: &str) -> f64 {
    let q = q.trim().trim_matches('`');
    if let Some(g) = q.strip_suffix("Gi") {
        g.parse::<f64>().unwrap() * 1024.0
    } else {
        q.strip_suffix("Mi")
            .unwrap_or_else(|| panic!("{q}"))
            .parse()
            .unwrap()
    }
}

/// The chart README's "Sizing" figures, written from the measurements (docs/benchmarks-scale.csv
/// and docs/benchmarks-scale-everything.csv) and the chart's defaults (values.yaml): per size
/// the shipped binary's (`musl`) peak where there is one, else the latest other build's; a
/// request that covers every build's peak at that size (at least the default) and a limit half as
/// much again (at least 256Mi).
fn sizing_section() -> String {
    let rows = csv_rows("docs/benchmarks-scale.csv");
    let mut sizes: Vec<u64> = rows.iter().map(Row::nodes).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let shown = |n: u64| -> &Row {
        // The install into unlabelled nodes (an EKS-labelled row of the same size beside it
        // writes as much and keeps what the unlabelled one does; its peak counts in `highest`).
        let at: Vec<&Row> = rows
            .iter()
            .filter(|r| r.nodes() == n && !r.get("shape").starts_with("Eks"))
            .collect();
        at.iter()
            .filter(|r| r.get("build") == "musl")
            .max_by_key(|r| r.get("date").to_string())
            .or_else(|| at.iter().max_by_key(|r| r.get("date").to_string()))
            .copied()
            .expect("a row")
    };
    let highest = |n: u64| {
        rows.iter()
            .filter(|r| r.nodes() == n)
            .map(|r| r.num("peak_rss_mib"))
            .fold(0.0, f64::max)
    };
    let values: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(chart().join("values.yaml")).unwrap())
            .unwrap();
    let request = mebibytes(values["resources"]["requests"]["memory"].as_str().unwrap());
    let limit = mebibytes(values["resources"]["limits"]["memory"].as_str().unwrap());
    let mut s = String::from(
        "| Nodes | Peak RSS measured | `resources.requests.memory` | `resources.limits.memory` |\n\
         | ---: | ---: | ---: | ---: |\n",
    );
    for &n in &sizes {
        let r = shown(n);
        let which = if r.get("build") == "musl" {
            "the image's binary".to_string()
        } else {
            format!("a {} build", r.get("build"))
        };
        let (lo, hi) = r.at_rest("steady_rss_mib");
        let (lo, hi) = (lo.round(), hi.round());
        let rest = if lo == hi {
            format!("{lo}")
        } else {
            format!("{lo}-{hi}")
        };
        // The light shape: Nodes without container images in their status.
        let shape = if r.get("shape") == "Light" {
            ", Nodes without images"
        } else {
            ""
        };
        s += &format!(
            "| {} | {:.0} MiB ({which}, {}{shape}; {rest} at rest) | {}Mi | {}Mi |\n",
            thousands(n),
            r.num("peak_rss_mib").round(),
            r.get("date"),
            quantity_at_least(highest(n).max(request)),
            quantity_at_least((1.5 * highest(n)).max(256.0)),
        );
    }
    let others: Vec<String> = sizes
        .iter()
        .flat_map(|&n| {
            let kept = shown(n).get("build").to_string();
            rows.iter()
                .filter(move |r| r.nodes() == n && r.get("build") != kept)
                .map(|r| {
                    format!(
                        "{} MiB at {} ({}, {})",
                        r.num("peak_rss_mib").round(),
                        thousands(r.nodes()),
                        r.get("build"),
                        r.get("date")
                    )
                })
                .collect::<Vec<_>>()
        })
        .collect();
    let covered: Vec<u64> = sizes
        .iter()
        .copied()
        .filter(|&n| highest(n) <= request)
        .collect();
    let all_held = sizes.iter().all(|&n| limit >= 1.5 * highest(n));
    let largest = *sizes.last().expect("a size");
    let smallest = sizes[0];
    s += &format!(
        "\n- Requests cover the highest peak measured at that size (of any build), so the scheduler\n  \
         places the pod where that much memory is free. Limits leave at least half as much again: a\n  \
         watch that has to list every Node again builds the new list beside the old cache until it\n  \
         completes. Each row's figure is the binary the image ships (static musl) where it was\n  \
         measured, else the build named; the other builds measured: {}.\n",
        if others.is_empty() {
            "none".to_string()
        } else {
            others.join("; ")
        }
    );
    s += &format!(
        "- The defaults (requests {}Mi, limits {}Mi) {} every size measured up to {} Nodes.{}\n  \
         Below {} Nodes (a peak of {:.0} MiB at {}) `requests.memory: 96Mi` and\n  \
         `limits.memory: 256Mi` are enough.\n",
        request,
        limit,
        if all_held { "hold" } else { "do not hold" },
        thousands(largest),
        covered
            .last()
            .map(|&n| format!(
                " Up to {} Nodes they request what is used; above, raise the request as in\n  \
                 the table.",
                thousands(n)
            ))
            .unwrap_or_default(),
        thousands(smallest),
        highest(smallest).round(),
        thousands(smallest),
    );
    if let Some(e) = csv_rows("docs/benchmarks-scale-everything.csv")
        .into_iter()
        .max_by_key(|r| r.get("date").to_string())
    {
        s += &format!(
            "- Everything on (Kueue, Volcano, KAI, Slurm, Slinky, the condition, the startup taint and\n  \
             UltraServer health: the \"Everything on\" section of `docs/benchmarks-scale.md`) costs more\n  \
             while nodes join: at {} Nodes the {} peaked at {:.0} MiB ({:.0} at rest); request\n  \
             `{}Mi` there. At rest its publishers cost {:.2} CPU-seconds per publish interval (5 s) at\n  \
             that size, and write nothing.\n",
            thousands(e.nodes()),
            if e.get("build") == "musl" {
                "image's binary".to_string()
            } else {
                format!("{} build", e.get("build"))
            },
            e.num("peak_rss_mib").round(),
            e.num("steady_rss_end_mib").round(),
            quantity_at_least(e.num("peak_rss_mib")),
            e.num("cpu_per_publish_s"),
        );
    }
    let shipped: Vec<&Row> = sizes.iter().map(|&n| shown(n)).collect();
    let per_10k = shipped
        .iter()
        .map(|r| r.num("steady_cpu_s") * 10_000.0 / r.nodes() as f64)
        .fold(0.0, f64::max);
    let per_1k: Vec<f64> = shipped
        .iter()
        .map(|r| r.num("cpu_s") * 1000.0 / r.nodes() as f64)
        .collect();
    let cores: Vec<f64> = shipped
        .iter()
        .map(|r| r.num("cpu_s") / r.num("install_s"))
        .collect();
    let range = |v: &[f64], digits: usize| {
        let (lo, hi) = (
            v.iter().copied().fold(f64::MAX, f64::min),
            v.iter().copied().fold(0.0, f64::max),
        );
        if format!("{lo:.digits$}") == format!("{hi:.digits$}") {
            format!("{lo:.digits$}")
        } else {
            format!("{lo:.digits$}-{hi:.digits$}")
        }
    };
    s += &format!(
        "- CPU: `requests.cpu: {}` covers the steady state (every Node re-checked once per resync\n  \
         period, 1 h by default, from the cache: at most {per_10k:.1} CPU-seconds per 10,000 Nodes each\n  \
         time). A first install uses {} of a core while it labels ({} CPU-seconds per 1,000\n  \
         Nodes); with no CPU limit it takes what is free.\n",
        values["resources"]["requests"]["cpu"]
            .as_str()
            .unwrap_or_default(),
        range(&cores, 2),
        range(&per_1k, 2),
    );
    s
}

/// The chart README's "Sizing" section is written from the measurements (`UPDATE_DOCS=1`
/// rewrites it in README.md.gotmpl, then `make chart-docs`), its requests hold every build's
/// peak and its limits half as much again, and the defaults in values.yaml hold what their
/// comment says.
#[test]
fn sizing_follows_the_measurements() {
    let want = sizing_section();
    e2e::generated::check(
        "charts/ec2-topology-labeler/README.md.gotmpl",
        "sizing",
        &want,
        "cargo test --workspace --test chart -- sizing, then make chart-docs",
    );
    for row in want
        .lines()
        .filter(|l| l.starts_with("| ") && l.chars().nth(2).is_some_and(|c| c.is_ascii_digit()))
    {
        let f: Vec<&str> = row.trim_matches('|').split('|').map(str::trim).collect();
        let nodes: u64 = f[0].replace(',', "").parse().unwrap();
        let highest = csv_rows("docs/benchmarks-scale.csv")
            .iter()
            .filter(|r| r.nodes() == nodes)
            .map(|r| r.num("peak_rss_mib"))
            .fold(0.0, f64::max);
        assert!(mebibytes(f[2]) >= highest, "{row}: request below {highest}");
        assert!(
            mebibytes(f[3]) >= 1.5 * highest,
            "{row}: limit below 1.5 × {highest}"
        );
    }
    // values.yaml's comment on the defaults: "up to N nodes (peak P MiB ...": the largest size
    // measured and the highest peak there.
    let values = std::fs::read_to_string(chart().join("values.yaml")).unwrap();
    let rows = csv_rows("docs/benchmarks-scale.csv");
    let largest = rows.iter().map(Row::nodes).max().unwrap();
    let highest = rows
        .iter()
        .filter(|r| r.nodes() == largest)
        .map(|r| r.num("peak_rss_mib"))
        .fold(0.0, f64::max);
    let said = format!(
        "up to {} nodes (peak {:.0} MiB",
        thousands(largest),
        highest
    );
    assert!(
        values.contains(&said),
        "values.yaml's resources comment should say {said:?}"
    );
}

/// Every action a workflow uses is pinned by a full commit SHA, with the release it is in a
/// comment (a tag can be moved; a commit cannot).
#[test]
fn workflow_actions_are_pinned_by_commit() {
    let dir = e2e::repo_root().join(".github/workflows");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        for line in std::fs::read_to_string(&path).unwrap().lines() {
            let Some((_, used)) = line.split_once("uses:") else {
                continue;
            };
            let used = used.trim();
            if used.starts_with("./") || used.starts_with("docker://") {
                continue;
            }
            seen += 1;
            let (action, rest) = used.split_once('@').unwrap_or((used, ""));
            let (sha, comment) = rest.split_once(" # ").unwrap_or((rest, ""));
            assert!(
                sha.len() == 40
                    && sha
                        .chars()
                        .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()),
                "{}: {action} is not pinned by a commit SHA: {line}",
                path.display()
            );
            assert!(
                comment.trim().starts_with('v'),
                "{}: {action}: say which release the commit is in (`# vX.Y.Z`): {line}",
                path.display()
            );
        }
    }
    assert!(seen > 0, "no actions found");
}

/// `envFrom`, `extraVolumes` and `extraVolumeMounts` (named as the AWS Load Balancer
/// Controller's chart names them) reach the pod as given: what IRSA outside EKS, or credentials
/// from a Secret, need.
#[test]
fn env_from_and_extra_volumes_reach_the_pod() {
    let docs = render(&[
        "envFrom[0].secretRef.name=aws-creds".into(),
        "extraVolumes[0].name=aws-iam-token".into(),
        "extraVolumes[0].projected.sources[0].serviceAccountToken.audience=sts.amazonaws.com"
            .into(),
        "extraVolumes[0].projected.sources[0].serviceAccountToken.path=token".into(),
        "extraVolumeMounts[0].name=aws-iam-token".into(),
        "extraVolumeMounts[0].mountPath=/var/run/secrets/eks.amazonaws.com/serviceaccount".into(),
        "extraVolumeMounts[0].readOnly=true".into(),
    ]);
    // (The record key's volume comes first: see record_key_is_a_secret_only_the_controllers_pods_mount.)
    let theirs = |list: &Value| -> Value {
        Value::Array(
            list.as_array()
                .unwrap()
                .iter()
                .filter(|v| v["name"] != "record-key")
                .cloned()
                .collect(),
        )
    };
    let pod = &kind(&docs, "Deployment")[0]["spec"]["template"]["spec"];
    assert_eq!(
        theirs(&pod["volumes"]),
        json!([{ "name": "aws-iam-token", "projected": { "sources": [
            { "serviceAccountToken": { "audience": "sts.amazonaws.com", "path": "token" } }
        ] } }])
    );
    let c = container(&docs);
    assert_eq!(
        c["envFrom"],
        json!([{ "secretRef": { "name": "aws-creds" } }])
    );
    assert_eq!(
        theirs(&c["volumeMounts"]),
        json!([{ "name": "aws-iam-token", "readOnly": true,
                 "mountPath": "/var/run/secrets/eks.amazonaws.com/serviceaccount" }])
    );
    // None of them by default (the record key's alone).
    let docs = render(&[]);
    let c = container(&docs);
    assert!(c["envFrom"].is_null() && theirs(&c["volumeMounts"]) == json!([]));
    assert_eq!(
        theirs(&kind(&docs, "Deployment")[0]["spec"]["template"]["spec"]["volumes"]),
        json!([])
    );
    // And none at all without the record key.
    let docs = render(&["recordKey.enabled=false".into()]);
    assert!(container(&docs)["volumeMounts"].is_null());
    assert!(kind(&docs, "Deployment")[0]["spec"]["template"]["spec"]["volumes"].is_null());
}

/// The `config:` block: every user-facing flag of `run`, camelCase (the chart passes each as
/// `--kebab-case=value`).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
struct ChartConfig {
    #[serde(flatten)]
    labels: LabelArgs,
    #[serde(flatten)]
    ec2: Ec2Args,
    #[serde(flatten)]
    lookup: LookupArgs,
    #[serde(flatten)]
    controller: ControllerArgs,
    #[serde(flatten)]
    gate: GateArgs,
    #[serde(flatten)]
    publish: PublishArgs,
    #[serde(flatten)]
    reservations: ec2_topology_labeler::publish::reserved::ReservationArgs,
    #[serde(flatten)]
    health: ec2_topology_labeler::publish::interconnect::HealthArgs,
    #[serde(flatten)]
    shape: ec2_topology_labeler::publish::shape::ShapeArgs,
}

/// JSON Schema (draft-07, what Helm validates) of the `config:` block. Every key is optional;
/// unknown keys are refused (a typo must not be silently ignored), and so is `null`: the chart
/// would render it as an empty flag (`--region=`).
pub fn config_schema() -> Value {
    let mut v = generator().into_root_schema_for::<ChartConfig>().to_value();
    if let Some(obj) = v.as_object_mut() {
        obj.remove("required");
        obj.remove("title");
        obj.insert("additionalProperties".into(), Value::Bool(false));
        obj.insert(
            "description".into(),
            "Controller flags (`ec2-topology-labeler run --help`), passed as --kebab-case=value"
                .into(),
        );
    }
    for (key, prop) in v["properties"]
        .as_object_mut()
        .into_iter()
        .flat_map(|p| p.iter_mut())
    {
        // The range the binary checks at start, from the same table: counts and numbers as
        // minimum and maximum (Helm refuses a value outside), durations in words.
        match ec2_topology_labeler::cmd::bound(&kebab(key)) {
            Some(Range::Count { min, max }) => {
                prop["minimum"] = min.into();
                prop["maximum"] = max.into();
            }
            Some(Range::Number { min, max }) => {
                prop["minimum"] = min.into();
                prop["maximum"] = max.into();
            }
            Some(r @ Range::Duration { .. }) => {
                let d = prop["description"].as_str().unwrap_or_default().to_string();
                prop["description"] = format!("{d} Range: {}.", r.describe()).into();
            }
            None => {}
        }
        let types = prop["type"].as_array().cloned();
        if let Some(types) = types {
            let types: Vec<Value> = types.into_iter().filter(|t| t != "null").collect();
            prop["type"] = match types.as_slice() {
                [one] => one.clone(),
                _ => Value::Array(types),
            };
        }
    }
    v
}

fn generator() -> schemars::SchemaGenerator {
    SchemaSettings::draft07()
        .with(|s| {
            s.inline_subschemas = true;
            s.meta_schema = None;
        })
        .into_generator()
}

/// A duration as the binary parses it (`15s`, `1h30m`): the binary's own schema of it.
fn duration() -> Value {
    let mut v = generator()
        .into_root_schema_for::<ec2_topology_labeler::duration::HumanDuration>()
        .to_value();
    if let Some(obj) = v.as_object_mut() {
        obj.remove("title");
    }
    v
}

fn string() -> Value {
    json!({ "type": "string" })
}

fn boolean() -> Value {
    json!({ "type": "boolean" })
}

fn object() -> Value {
    json!({ "type": "object" })
}

/// Labels, annotations, a node selector: strings by strings.
fn string_map() -> Value {
    json!({ "type": "object", "additionalProperties": { "type": "string" } })
}

/// A list of Kubernetes objects (volumes, mounts, `envFrom` sources), passed through as given.
fn objects() -> Value {
    json!({ "type": "array", "items": { "type": "object" } })
}

/// An object with exactly these properties (unknown keys refused: a typo is not ignored).
fn closed(properties: Value) -> Value {
    json!({ "type": "object", "additionalProperties": false, "properties": properties })
}

/// A Kubernetes object name (DNS subdomain).
fn dns_name() -> Value {
    json!({
        "type": "string",
        "maxLength": 253,
        "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
    })
}

/// A non-empty list of CIDRs (IPv4 or IPv6), as a NetworkPolicy `ipBlock` takes them: an empty
/// list would leave a rule without `to`, which allows every destination.
fn cidrs() -> Value {
    json!({
        "type": "array",
        "minItems": 1,
        "uniqueItems": true,
        "items": {
            "type": "string",
            "pattern": "^(((25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])\\.){3}(25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])/([0-9]|[12][0-9]|3[0-2])|[0-9a-fA-F:.]*:[0-9a-fA-F:.]*/([0-9]|[1-9][0-9]|1[01][0-9]|12[0-8]))$"
        }
    })
}

/// The whole `values.schema.json`.
pub fn values_schema() -> Value {
    json!({
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "ec2-topology-labeler Helm values",
        "type": "object",
        "additionalProperties": false,
        "properties": {
            // An umbrella chart passes `global` to every dependency.
            "global": object(),
            "nameOverride": string(),
            "fullnameOverride": string(),
            "image": closed(json!({
                "repository": { "type": "string", "minLength": 1 },
                "tag": string(),
                "digest": { "type": "string", "pattern": "^(sha256:[a-f0-9]{64})?$" },
                "pullPolicy": { "enum": ["Always", "IfNotPresent", "Never"] }
            })),
            "imagePullSecrets": objects(),
            "replicaCount": { "type": "integer", "minimum": 0 },
            "revisionHistoryLimit": { "type": "integer", "minimum": 0 },
            "leaderElection": closed(json!({
                "enabled": boolean(),
                "leaseName": dns_name(),
                "leaseDuration": duration(),
                "renewGrace": duration()
            })),
            "events": closed(json!({ "enabled": boolean() })),
            "podDisruptionBudget": closed(json!({
                "enabled": boolean(),
                "maxUnavailable": { "type": ["integer", "string"] }
            })),
            "rbac": closed(json!({ "create": boolean() })),
            "serviceAccount": closed(json!({
                "create": boolean(),
                // Empty: the release's full name.
                "name": { "anyOf": [dns_name(), { "const": "" }] },
                "annotations": string_map()
            })),
            "admissionPolicy": closed(json!({
                "enabled": boolean(),
                "exclusiveKeys": boolean(),
                // Usernames or groups (a username may hold ':'; none is empty).
                "exclusiveKeysExempt": {
                    "type": "array",
                    "items": { "type": "string", "minLength": 1, "maxLength": 253 },
                    "uniqueItems": true
                }
            })),
            "aws": closed(json!({ "useNodeRole": boolean() })),
            "config": config_schema(),
            "extraArgs": { "type": "array", "items": { "type": "string", "pattern": "^--[a-z]" } },
            "extraEnv": objects(),
            "envFrom": objects(),
            "extraVolumes": objects(),
            "extraVolumeMounts": objects(),
            "logFormat": { "enum": ["json", "text"] },
            "logLevel": string(),
            "metrics": closed(json!({
                "bindAddress": { "enum": ["::", "0.0.0.0"] },
                "port": { "type": "integer", "minimum": 1, "maximum": 65535 },
                "serviceMonitor": closed(json!({
                    "enabled": boolean(),
                    "namespace": string(),
                    // The Prometheus Operator's Duration.
                    "interval": {
                        "type": "string",
                        "pattern": "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
                    },
                    "labels": string_map(),
                    "relabelings": objects(),
                    "metricRelabelings": objects()
                }))
            })),
            "resources": closed(json!({
                "requests": object(),
                "limits": object(),
                "claims": objects()
            })),
            "podSecurityContext": object(),
            "securityContext": object(),
            "priorityClassName": string(),
            "nodeSelector": string_map(),
            "tolerations": objects(),
            "affinity": object(),
            "topologySpreadConstraints": objects(),
            "terminationGracePeriodSeconds": { "type": "integer", "minimum": 0 },
            "podAnnotations": string_map(),
            "podLabels": string_map(),
            "tests": closed(json!({ "enabled": boolean() })),
            "networkPolicy": closed(json!({
                "enabled": boolean(),
                "ingress": closed(json!({ "from": objects() })),
                "egress": closed(json!({
                    "dnsTo": objects(),
                    "apiServerCIDRs": cidrs(),
                    "apiServerPorts": {
                        "type": "array",
                        "minItems": 1,
                        "uniqueItems": true,
                        "items": { "type": "integer", "minimum": 1, "maximum": 65535 }
                    },
                    "awsCIDRs": cidrs(),
                    "podIdentityAgent": boolean(),
                    "extra": objects()
                }))
            })),
            "prometheusRule": closed(json!({
                "enabled": boolean(),
                "namespace": string(),
                "labels": string_map(),
                "runbookBaseUrl": { "type": "string", "pattern": "^https?://" }
            })),
            "dashboard": closed(json!({
                "enabled": boolean(),
                "namespace": string(),
                "label": { "type": "string", "minLength": 1 },
                "labelValue": string(),
                "annotations": string_map()
            })),
            "uninstallHook": closed(json!({
                "enabled": boolean(),
                "labels": boolean(),
                "waitForLease": duration()
            })),
            "retireHook": closed(json!({
                "enabled": boolean()
            })),
            "recordKey": closed(json!({
                "enabled": boolean(),
                "rotation": { "type": "integer", "minimum": 0 },
                "existingSecret": string()
            }))
        },
        // Two replicas without leader election would both write.
        "if": { "properties": { "replicaCount": { "minimum": 2 } } },
        "then": { "properties": { "leaderElection": { "properties": { "enabled": { "const": true } } } } }
    })
}

/// Every value of the chart that is a duration the binary bounds: its key in the values and
/// its flag (every `config` key whose flag is in the table, and the election's two).
fn bounded_durations() -> Vec<(String, String)> {
    let config = config_schema();
    let keys = config["properties"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    keys.keys()
        .map(|k| (format!("config.{k}"), kebab(k)))
        .chain([
            (
                "leaderElection.leaseDuration".into(),
                "leader-election-lease-duration".into(),
            ),
            (
                "leaderElection.renewGrace".into(),
                "leader-election-renew-grace".into(),
            ),
            // The uninstall hook's own (a flag of `uninstall`).
            ("uninstallHook.waitForLease".into(), "wait-for-lease".into()),
        ])
        .filter(|(_, flag)| {
            matches!(
                ec2_topology_labeler::cmd::bound(flag),
                Some(Range::Duration { .. })
            )
        })
        .collect()
}

/// templates/_bounds.tpl: the range of every duration in [`bounded_durations`], in
/// nanoseconds, from the binary's table (the chart's checks read it when they render).
fn duration_bounds_template() -> String {
    let mut table = serde_json::Map::new();
    for (key, flag) in bounded_durations() {
        if let Some(r @ Range::Duration { min, max }) = ec2_topology_labeler::cmd::bound(&flag) {
            table.insert(
                key,
                json!({
                    "flag": flag,
                    "min": u64::try_from(min.as_nanos()).unwrap_or(u64::MAX),
                    "max": u64::try_from(max.as_nanos()).unwrap_or(u64::MAX),
                    "range": r.describe(),
                }),
            );
        }
    }
    format!(
        "{{{{- /* Generated by `make schema` from the flags' ranges (src/cmd/mod.rs BOUNDS; chart.rs fails when it\n\
         differs): the range of every duration the chart passes to the controller, in nanoseconds,\n\
         for the checks in _checks.tpl. */ -}}}}\n\
         {{{{- define \"ec2tl.durationBounds\" -}}}}\n{}\n{{{{- end -}}}}\n",
        serde_json::to_string_pretty(&Value::Object(table)).unwrap_or_default()
    )
}

#[test]
fn chart_values_schema_matches_the_flags() {
    let mut want = serde_json::to_string_pretty(&values_schema()).unwrap_or_default();
    want.push('\n');
    let chart = e2e::repo_root().join("charts/ec2-topology-labeler");
    for (path, want) in [
        (chart.join("values.schema.json"), want),
        (
            chart.join("templates/_bounds.tpl"),
            duration_bounds_template(),
        ),
    ] {
        if std::env::var_os("UPDATE_CHART_SCHEMA").is_some() {
            std::fs::write(&path, &want).unwrap();
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            have == want,
            "{} is stale: the flags changed. Run `make schema`.",
            path.display()
        );
    }
}

/// Whether the binary starts with the chart's default command line changed by `sets` (values
/// keys as `--set` takes them): each flag parsed with its range, then `run`'s checks across
/// flags; the uninstall hook's wait by `uninstall`, which the hook runs.
fn binary_takes(sets: &[(&str, &str)]) -> Result<(), String> {
    let mut args = args_of(&render(&[]));
    let parse = |args: Vec<String>| -> Result<(), String> {
        Cli::try_parse_from(std::iter::once("ec2-topology-labeler".to_string()).chain(args))
            .map_err(|e| e.to_string())?
            .check()
    };
    for (key, value) in sets {
        let flag = match key.split_once('.') {
            Some(("config", k)) => format!("--{}", kebab(k)),
            Some(("leaderElection", "leaseDuration")) => "--leader-election-lease-duration".into(),
            Some(("leaderElection", "renewGrace")) => "--leader-election-renew-grace".into(),
            Some(("uninstallHook", "enabled")) => continue,
            // Only a hook that is on runs `uninstall`.
            Some(("uninstallHook", "waitForLease")) => {
                if sets.contains(&("uninstallHook.enabled", "true")) {
                    parse(vec![
                        "uninstall".into(),
                        format!("--wait-for-lease={value}"),
                    ])?;
                }
                continue;
            }
            _ => panic!("no flag for {key}"),
        };
        args.retain(|a| !a.starts_with(&format!("{flag}=")));
        args.push(format!("{flag}={value}"));
    }
    parse(args)
}

/// A duration one nanosecond from `d` (below when `below`), as humantime writes it.
fn next_to(d: std::time::Duration, below: bool) -> Option<String> {
    let one = std::time::Duration::from_nanos(1);
    let d = if below { d.checked_sub(one)? } else { d + one };
    Some(ec2_topology_labeler::duration::HumanDuration(d).to_string())
}

/// The chart refuses, when it renders, exactly what the binary refuses when it starts: every
/// bounded duration at both ends of its range and a nanosecond beyond each, in other units and
/// with fractions; the election's timings; the label keys as a whole; the Slurm ConfigMap's
/// name. A refusal names the value.
#[test]
fn the_chart_refuses_what_the_binary_refuses() {
    let mut cases: Vec<Vec<(String, String)>> = Vec::new();
    let one = |k: &str, v: &str| vec![(k.to_string(), v.to_string())];
    for (key, flag) in bounded_durations() {
        let Some(Range::Duration { min, max }) = ec2_topology_labeler::cmd::bound(&flag) else {
            continue;
        };
        let paired = |v: String| {
            let mut case = vec![(key.clone(), v)];
            // Each of the election's two alone cannot move far without breaking the rule
            // between them: the other goes to its own end of the range.
            if key == "leaderElection.leaseDuration" {
                case.push(("leaderElection.renewGrace".into(), "1s".into()));
            } else if key == "leaderElection.renewGrace" {
                case.push(("leaderElection.leaseDuration".into(), "1h".into()));
            } else if key == "uninstallHook.waitForLease" {
                case.push(("uninstallHook.enabled".into(), "true".into()));
            }
            case
        };
        for v in [
            Some(ec2_topology_labeler::duration::HumanDuration(min).to_string()),
            Some(ec2_topology_labeler::duration::HumanDuration(max).to_string()),
            next_to(min, true),
            next_to(max, false),
            Some(format!("{}s", max.as_secs() + 1)),
            Some(format!("{}ms", max.as_millis())),
        ]
        .into_iter()
        .flatten()
        {
            cases.push(paired(v));
        }
    }
    for (k, v) in [
        ("config.cacheTtl", "4.2w"),
        ("config.cacheTtl", "4.3w"),
        ("config.cacheTtl", "1M"),
        ("config.cacheTtl", "0.98M"),
        ("config.cacheTtl", "720h"),
        ("config.cacheTtl", "720.001h"),
        ("config.cacheTtl", "1 h 30 m"),
        ("config.batchWindow", "0.5us"),
        ("config.batchWindow", "0.001s"),
        ("config.batchWindow", "0.000999s"),
        ("config.batchWindow", "1.5ns"),
        ("config.batchWindow", "07.5s"),
        ("config.batchWindow", "60.000001s"),
        ("config.ec2Timeout", "0.1s"),
        ("config.ec2Timeout", "0.099999s"),
        ("config.publishInterval", "0.3s"),
        ("config.uniformDepth", "4"),
        ("config.labelPreset", "hyperpod"),
        ("config.labelPreset", "topograph"),
        ("config.layerLabelPrefix", "example.com/tier-"),
        ("config.layerLabelPrefix", "Example.com/tier-"),
        ("config.layerLabelPrefix", "example.com/-tier-"),
        (
            "config.zoneIdLabelKey",
            "topology.k8s.aws/network-node-layer-2",
        ),
        (
            "config.zoneIdLabelKey",
            "topology.k8s.aws/network-node-layer-0",
        ),
        (
            "config.zoneIdLabelKey",
            "topology.k8s.aws/network-node-layer-17",
        ),
        (
            "config.zoneIdLabelKey",
            "topology.k8s.aws/network-node-layer-02",
        ),
        ("config.zoneIdLabelKey", "example.com/"),
        ("config.zoneIdLabelKey", "a/b/c"),
        (
            "config.capacityBlockLabelKey",
            "ec2-topology-labeler.io/placement-group",
        ),
        ("config.placementGroupLabelKey", "topology.k8s.aws/zone-id"),
        ("config.slurmTopologyConfigmap", "slurm/slurm-topology"),
        ("config.slurmTopologyConfigmap", "slurm/topology.v1"),
        ("config.slurmTopologyConfigmap", "slurm"),
        ("config.slurmTopologyConfigmap", "a.b/topology"),
        ("config.slurmTopologyConfigmap", "slurm/Topology"),
    ] {
        cases.push(one(k, v));
    }
    // A key set to nothing is passed as nothing, and refused.
    for k in [
        "zoneIdLabelKey",
        "capacityBlockLabelKey",
        "placementGroupLabelKey",
        "layerLabelPrefix",
    ] {
        cases.push(vec![(format!("config.{k}"), String::new())]);
    }
    let segment = "a".repeat(64);
    cases.push(one("config.zoneIdLabelKey", &format!("{segment}.com/zone")));
    cases.push(one(
        "config.zoneIdLabelKey",
        &format!("example.com/{segment}"),
    ));
    for case in [
        &[
            ("config.ultraserverLevel", "always"),
            ("config.capacityBlockLabel", "false"),
        ][..],
        &[
            ("config.ultraserverLevel", "auto"),
            ("config.capacityBlockLabel", "false"),
        ],
        &[("config.ultraserverLevel", "never")],
        &[
            ("config.nvlinkCliqueLevel", "true"),
            ("config.ultraserverLevel", "never"),
        ],
        &[
            ("config.nvlinkCliqueLevel", "true"),
            ("config.capacityBlockLabel", "false"),
        ],
        &[("config.nvlinkCliqueLevel", "true")],
        &[("config.ultraserverHealthTaint", "true")],
        &[
            ("config.ultraserverHealthTaint", "true"),
            ("config.ultraserverHealth", "true"),
        ],
        &[
            ("config.ultraserverHealth", "true"),
            ("config.capacityBlockLabel", "false"),
        ],
        &[
            ("config.uniformDepth", "4"),
            ("config.layerNumbering", "leaf-first"),
        ],
        &[
            ("config.uniformDepth", "4"),
            ("config.labelPreset", "topograph"),
        ],
        &[
            (
                "config.zoneIdLabelKey",
                "topology.k8s.aws/network-node-layer-2",
            ),
            ("config.zoneIdLabel", "false"),
        ],
        &[
            ("config.labelPreset", "topograph"),
            ("config.zoneIdLabelKey", "fabric.topograph.run/tier-0"),
        ],
        &[
            ("config.labelPreset", "topograph"),
            ("config.zoneIdLabelKey", "fabric.topograph.run/tier-16"),
        ],
        &[
            ("config.labelPreset", "hyperpod"),
            ("config.zoneIdLabelKey", "topology.k8s.aws/ultraserver-id"),
        ],
        &[
            ("config.labelPreset", "hyperpod"),
            ("config.zoneIdLabelKey", "topology.k8s.aws/ultraserver-id"),
            ("config.capacityBlockLabel", "false"),
        ],
        &[
            ("leaderElection.leaseDuration", "15s"),
            ("leaderElection.renewGrace", "5s"),
        ],
        &[
            ("leaderElection.leaseDuration", "6s"),
            ("leaderElection.renewGrace", "4s"),
        ],
        &[
            ("leaderElection.leaseDuration", "12s"),
            ("leaderElection.renewGrace", "4s"),
        ],
        &[
            ("leaderElection.leaseDuration", "11s"),
            ("leaderElection.renewGrace", "4s"),
        ],
        &[
            ("leaderElection.leaseDuration", "3s"),
            ("leaderElection.renewGrace", "1s"),
        ],
        &[
            ("leaderElection.leaseDuration", "2s"),
            ("leaderElection.renewGrace", "1s"),
        ],
        &[
            ("leaderElection.leaseDuration", "10s"),
            ("leaderElection.renewGrace", "10s"),
        ],
        &[
            ("leaderElection.leaseDuration", "1500ms"),
            ("leaderElection.renewGrace", "1s"),
        ],
        &[
            ("leaderElection.leaseDuration", "15s"),
            ("leaderElection.renewGrace", "2.5s"),
        ],
        &[
            ("leaderElection.leaseDuration", "1h"),
            ("leaderElection.renewGrace", "59m"),
        ],
        &[
            ("leaderElection.leaseDuration", "1h"),
            ("leaderElection.renewGrace", "59m 52s"),
        ],
        &[
            ("config.layerLabelPrefix", ""),
            ("config.zoneIdLabelKey", "3"),
        ],
        &[
            ("config.labelPreset", "topograph"),
            ("config.layerLabelPrefix", ""),
            ("config.zoneIdLabelKey", "fabric.topograph.run/tier-0"),
        ],
        &[
            ("config.slinkyAnnotation", "true"),
            ("config.slurmTopologyName", "topo switch"),
        ],
        &[
            ("config.slinkyAnnotation", "true"),
            ("config.slurmTopologyName", ""),
        ],
        &[
            ("config.slinkyAnnotation", "true"),
            ("config.slinkyBlockTopology", "topo,block"),
        ],
        &[
            ("config.slinkyAnnotation", "true"),
            ("config.slinkyBlockTopology", "topo-block"),
        ],
        &[
            ("config.slinkyAnnotation", "false"),
            ("config.slurmTopologyName", "topo switch"),
        ],
        &[
            ("uninstallHook.enabled", "true"),
            ("uninstallHook.waitForLease", "90m"),
        ],
        &[
            ("uninstallHook.enabled", "false"),
            ("uninstallHook.waitForLease", "90m"),
        ],
    ] {
        cases.push(
            case.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
    }
    let (mut taken, mut refused) = (0, 0);
    for case in &cases {
        let sets: Vec<String> = case.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let borrowed: Vec<(&str, &str)> =
            case.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let binary = binary_takes(&borrowed);
        match render_result(&sets) {
            Ok(rendered) => {
                assert!(
                    binary.is_ok(),
                    "{sets:?}: the chart renders it, the binary refuses it: {binary:?}"
                );
                // And what the chart rendered starts: the Deployment's arguments themselves.
                let docs: Vec<Value> = serde_saphyr::from_multiple::<Value>(&rendered)
                    .unwrap_or_default()
                    .into_iter()
                    .filter(Value::is_object)
                    .collect();
                let args = args_of(&docs);
                let cli = Cli::try_parse_from(
                    std::iter::once("ec2-topology-labeler".to_string()).chain(args.clone()),
                )
                .map_err(|e| e.to_string())
                .and_then(|c| c.check());
                assert!(
                    cli.is_ok(),
                    "{sets:?}: the rendered {args:?} refused: {cli:?}"
                );
                taken += 1;
            }
            Err(chart) => {
                assert!(
                    binary.is_err(),
                    "{sets:?}: the binary takes it, the chart refuses it: {chart}"
                );
                let chart = chart.to_string();
                assert!(
                    case.iter()
                        .any(|(k, v)| chart.contains(k.rsplit('.').next().unwrap_or(k))
                            || chart.contains(v.as_str())),
                    "{sets:?}: the chart's refusal does not name the value: {chart}"
                );
                refused += 1;
            }
        }
    }
    assert!(
        taken > 20 && refused > 20,
        "taken {taken}, refused {refused}"
    );
}

#[test]
fn config_schema_lists_every_user_facing_flag_in_camel_case() {
    let schema = config_schema();
    let props = schema["properties"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    for key in [
        "layerLabelPrefix",
        "region",
        "ec2Rate",
        "batchWindow",
        "cacheTtl",
        "resyncPeriod",
        "concurrency",
    ] {
        assert!(props.contains_key(key), "{key} missing");
    }
    assert_eq!(props["batchWindow"]["type"], "string");
    let numbering: Vec<&Value> = props["layerNumbering"]["oneOf"]
        .as_array()
        .map(|a| a.iter().map(|v| &v["const"]).collect())
        .unwrap_or_default();
    assert_eq!(numbering, vec!["top-first", "leaf-first"]);
    assert!(
        !props.contains_key("metricsAddr"),
        "the chart owns metricsAddr"
    );
    assert_eq!(schema["additionalProperties"], false);
}

/// `kubeVersion` refuses a cluster older than every API the chart uses (ValidatingAdmissionPolicy
/// is GA in 1.30) at render time, and takes 1.30 and the version we test on.
#[test]
fn kube_version_refuses_clusters_older_than_1_30() {
    let chart = chart();
    let chart = chart.to_str().unwrap();
    let refused = helm(None, &["template", "x", chart, "--kube-version", "1.29.9"])
        .expect_err("1.29 accepted");
    assert!(
        refused.to_string().contains("kubeVersion"),
        "not refused for its kubeVersion: {refused}"
    );
    for accepted in ["1.30.0", "1.36.3"] {
        helm(None, &["template", "x", chart, "--kube-version", accepted])
            .unwrap_or_else(|e| panic!("{accepted} refused: {e}"));
    }
}
