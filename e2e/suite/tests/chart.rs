//! The Helm chart: lint, render with default and all-features values, and check what it renders
//! against the binary itself — every `config:` key becomes a flag the binary accepts, RBAC is
//! exactly what the code uses, the Pod runs locked down. Also where the chart's
//! `values.schema.json` is generated, from the same flag structs the binary parses, so the
//! chart's `config:` block and the flags cannot drift (`make schema` rewrites it; a test checks
//! it). Generated here, not in the controller: it is a build-time concern.

use std::collections::BTreeMap;

use clap::Parser;
use e2e::helm::{chart, helm};
use ec2_topology_labeler::config::{
    Cli, ControllerArgs, Ec2Args, GateArgs, LabelArgs, LookupArgs, PublishArgs,
};
use schemars::{JsonSchema, generate::SchemaSettings};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

fn render(sets: &[String]) -> Vec<Value> {
    let chart = chart();
    let mut args = vec![
        "template",
        "ec2-topology-labeler",
        chart.to_str().unwrap(),
        "--namespace",
        "ec2-topology-labeler",
    ];
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
    match (schema["type"].as_str(), schema["type"].as_array()) {
        (Some("boolean"), _) => "false".into(),
        (Some("integer"), _) => "7".into(),
        (_, Some(types)) if types.iter().any(|t| t == "integer") => "4".into(),
        (Some("number"), _) => "4".into(),
        _ if schema.get("pattern").is_some() => "90s".into(),
        _ if key.ends_with("Key") => format!("example.com/{}", key.to_lowercase()),
        _ if key == "layerLabelPrefix" => "example.com/tier-".into(),
        _ => "us-east-2".into(),
    }
}

#[test]
fn every_config_key_becomes_a_flag_the_binary_accepts() {
    let schema = config_schema();
    let props = schema["properties"].as_object().expect("properties");
    let sets: Vec<String> = props
        .iter()
        .map(|(k, v)| format!("config.{k}={}", example(k, v)))
        .collect();
    let docs = render(&sets);
    let args = args_of(&docs);
    let cli = Cli::try_parse_from(
        std::iter::once("ec2-topology-labeler".to_string()).chain(args.clone()),
    );
    assert!(cli.is_ok(), "{args:?}: {:?}", cli.err());
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
        command: ec2_topology_labeler::config::Command::Run(run),
        ..
    }) = cli
    else {
        panic!("run")
    };
    assert_eq!(run.ec2.ec2_rate, 4.0, "values arrive as given");
    assert_eq!(run.lookup.batch_window.0.as_secs(), 90);
}

#[test]
fn schema_refuses_unknown_config_keys_and_bad_durations() {
    let chart = chart();
    let chart = chart.to_str().unwrap();
    for bad in ["config.batchWindw=1s", "config.batchWindow=soon"] {
        let r = helm(None, &["template", "x", chart, "--set", bad]);
        assert!(r.is_err(), "{bad} was accepted");
    }
}

#[test]
fn rbac_is_exactly_what_the_code_uses() {
    let docs = render(&[]);
    let rules = &kind(&docs, "ClusterRole")[0]["rules"];
    let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in rules.as_array().unwrap() {
        for res in r["resources"].as_array().unwrap() {
            let verbs = r["verbs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap().to_string())
                .collect();
            seen.insert(res.as_str().unwrap().to_string(), verbs);
        }
    }
    assert_eq!(seen["nodes"], ["get", "list", "watch", "patch"]);
    assert_eq!(
        seen["events"],
        ["create"],
        "Events are created, never patched (no series)"
    );
    assert_eq!(seen.len(), 2, "nothing else cluster-wide: {seen:?}");
    let lease_rules = &kind(&docs, "Role")[0]["rules"];
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
    assert!(
        verbs_for("nodes/status").is_empty(),
        "no status writes without the condition"
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
    assert!(kind(&docs, "Role").is_empty());
    assert!(kind(&docs, "PodDisruptionBudget").is_empty());
    assert_eq!(
        kind(&docs, "ClusterRole")[0]["rules"]
            .as_array()
            .unwrap()
            .len(),
        1
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

/// What the release workflow publishes is what the chart pulls: the image repository in
/// values.yaml, the chart's name in the OCI repository, on version tags only.
#[test]
fn release_workflow_publishes_the_image_the_chart_pulls() {
    let root = e2e::repo_root();
    let read = |p: &str| std::fs::read_to_string(root.join(p)).expect(p);
    let workflow: Value =
        serde_saphyr::from_str(&read(".github/workflows/release.yaml")).expect("workflow YAML");
    let values: Value =
        serde_saphyr::from_str(&read("charts/ec2-topology-labeler/values.yaml")).expect("values");
    assert_eq!(workflow["env"]["IMAGE"], values["image"]["repository"]);
    assert!(
        workflow["env"]["CHART_REPO"]
            .as_str()
            .is_some_and(|r| r.starts_with("oci://")),
        "the chart is pushed as an OCI artifact"
    );
    let tags = &workflow["on"]["push"]["tags"];
    assert!(tags.is_array() && workflow["on"]["push"]["branches"].is_null());
    let platforms = workflow["jobs"]["image"]["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .find_map(|s| s["with"]["platforms"].as_str())
        .expect("a multi-platform build");
    assert_eq!(platforms, "linux/amd64,linux/arm64");
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

/// `envFrom`, `extraVolumes` and `extraVolumeMounts` (named as the AWS Load Balancer
/// Controller's chart names them) reach the pod as given: what IRSA outside EKS, or credentials
/// from a Secret, need.
#[test]
fn env_from_and_extra_volumes_reach_the_pod() {
    let docs = render(&[
        "envFrom[0].secretRef.name=aws-creds".into(),
        "extraVolumes[0].name=aws-iam-token".into(),
        "extraVolumes[0].projected.sources[0].serviceAccountToken.audience=sts.amazonaws.com".into(),
        "extraVolumes[0].projected.sources[0].serviceAccountToken.path=token".into(),
        "extraVolumeMounts[0].name=aws-iam-token".into(),
        "extraVolumeMounts[0].mountPath=/var/run/secrets/eks.amazonaws.com/serviceaccount".into(),
        "extraVolumeMounts[0].readOnly=true".into(),
    ]);
    let pod = &kind(&docs, "Deployment")[0]["spec"]["template"]["spec"];
    assert_eq!(
        pod["volumes"],
        json!([{ "name": "aws-iam-token", "projected": { "sources": [
            { "serviceAccountToken": { "audience": "sts.amazonaws.com", "path": "token" } }
        ] } }])
    );
    let c = container(&docs);
    assert_eq!(c["envFrom"], json!([{ "secretRef": { "name": "aws-creds" } }]));
    assert_eq!(
        c["volumeMounts"],
        json!([{ "name": "aws-iam-token", "readOnly": true,
                 "mountPath": "/var/run/secrets/eks.amazonaws.com/serviceaccount" }])
    );
    // None of them by default.
    let docs = render(&[]);
    let c = container(&docs);
    assert!(c["envFrom"].is_null() && c["volumeMounts"].is_null());
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
}

/// JSON Schema (draft-07, what Helm validates) of the `config:` block. Every key is optional;
/// unknown keys are refused (a typo must not be silently ignored).
pub fn config_schema() -> Value {
    let settings = SchemaSettings::draft07().with(|s| {
        s.inline_subschemas = true;
        s.meta_schema = None;
    });
    let schema = settings
        .into_generator()
        .into_root_schema_for::<ChartConfig>();
    let mut v = schema.to_value();
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
    v
}

fn string() -> Value {
    json!({ "type": "string" })
}

fn object() -> Value {
    json!({ "type": "object" })
}

fn array() -> Value {
    json!({ "type": "array" })
}

/// A list of Kubernetes objects (volumes, mounts, `envFrom` sources), passed through as given.
fn objects() -> Value {
    json!({ "type": "array", "items": { "type": "object" } })
}

/// The whole `values.schema.json`.
pub fn values_schema() -> Value {
    json!({
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "ec2-topology-labeler Helm values",
        "type": "object",
        "additionalProperties": false,
        "properties": {
            "nameOverride": string(),
            "fullnameOverride": string(),
            "image": {
                "type": "object",
                "additionalProperties": false,
                "properties": {
                    "repository": string(),
                    "tag": string(),
                    "pullPolicy": { "enum": ["Always", "IfNotPresent", "Never"] }
                }
            },
            "imagePullSecrets": array(),
            "replicaCount": { "type": "integer", "minimum": 0 },
            "leaderElection": {
                "type": "object",
                "additionalProperties": false,
                "properties": {
                    "enabled": { "type": "boolean" },
                    "leaseName": string(),
                    "leaseDuration": string(),
                    "renewGrace": string()
                }
            },
            "events": {
                "type": "object",
                "additionalProperties": false,
                "properties": { "enabled": { "type": "boolean" } }
            },
            "podDisruptionBudget": {
                "type": "object",
                "additionalProperties": false,
                "properties": {
                    "enabled": { "type": "boolean" },
                    "maxUnavailable": { "type": ["integer", "string"] }
                }
            },
            "serviceAccount": {
                "type": "object",
                "additionalProperties": false,
                "properties": {
                    "create": { "type": "boolean" },
                    "name": string(),
                    "annotations": object()
                }
            },
            "config": config_schema(),
            "extraEnv": array(),
            "envFrom": objects(),
            "extraVolumes": objects(),
            "extraVolumeMounts": objects(),
            "logFormat": { "enum": ["json", "text"] },
            "logLevel": string(),
            "metrics": {
                "type": "object",
                "additionalProperties": false,
                "properties": {
                    "port": { "type": "integer", "minimum": 1, "maximum": 65535 },
                    "serviceMonitor": {
                        "type": "object",
                        "additionalProperties": false,
                        "properties": {
                            "enabled": { "type": "boolean" },
                            "interval": string(),
                            "labels": object()
                        }
                    }
                }
            },
            "resources": object(),
            "podSecurityContext": object(),
            "securityContext": object(),
            "priorityClassName": string(),
            "nodeSelector": object(),
            "tolerations": array(),
            "affinity": object(),
            "terminationGracePeriodSeconds": { "type": "integer", "minimum": 0 },
            "podAnnotations": object(),
            "podLabels": object()
        }
    })
}

#[test]
fn chart_values_schema_matches_the_flags() {
    let mut want = serde_json::to_string_pretty(&values_schema()).unwrap_or_default();
    want.push('\n');
    let path = e2e::repo_root().join("charts/ec2-topology-labeler/values.schema.json");
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
