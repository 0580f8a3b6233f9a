//! The Helm chart's `values.schema.json`, generated from the same flag structs the binary parses,
//! so the chart's `config:` block and the flags cannot drift. `charts/…/values.schema.json` is
//! checked against this in a test; `UPDATE_CHART_SCHEMA=1 cargo test chart` rewrites it.

use schemars::{JsonSchema, generate::SchemaSettings};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::config::{ControllerArgs, Ec2Args, LabelArgs, LookupArgs, PublishArgs};

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

#[cfg(test)]
mod tests {
    use super::*;

    /// The checkout under test: cargo sets `CARGO_MANIFEST_DIR` when it runs a test, and the
    /// compile-time value may name another checkout sharing the same target directory.
    fn schema_path() -> std::path::PathBuf {
        std::env::var_os("CARGO_MANIFEST_DIR")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into())
            .join("charts/ec2-topology-labeler/values.schema.json")
    }

    #[test]
    fn chart_values_schema_matches_the_flags() {
        let mut want = serde_json::to_string_pretty(&values_schema()).unwrap_or_default();
        want.push('\n');
        let path = schema_path();
        if std::env::var_os("UPDATE_CHART_SCHEMA").is_some() {
            std::fs::write(&path, &want).unwrap();
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            have == want,
            "{} is stale: the flags changed. Run `UPDATE_CHART_SCHEMA=1 cargo test chart` (make schema).",
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
}
