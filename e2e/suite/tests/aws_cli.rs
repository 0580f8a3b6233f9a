//! AWS's own parsers accept mock-ec2: the AWS CLI (botocore, from PyPI, pinned) pointed at it
//! with `--endpoint-url` lists the scenario, paginated, and surfaces EC2's errors by code.

use std::{path::PathBuf, process::Command};

use mock_ec2::{Instance, MockEc2, Scenario};
use serde_json::Value;

const AWSCLI: &str = "awscli==1.46.3";

/// A virtualenv with the pinned AWS CLI, cached across runs.
fn aws_cli() -> PathBuf {
    let cache = std::env::var("EC2TL_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default())
                .join(".cache/ec2-topology-labeler")
        });
    let venv = cache.join(format!("venv-{}", AWSCLI.replace("==", "-")));
    let aws = venv.join("bin/aws");
    if !aws.exists() {
        let ok = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .is_ok_and(|s| s.success())
            && Command::new(venv.join("bin/pip"))
                .args(["install", "--quiet", "--disable-pip-version-check", AWSCLI])
                .status()
                .is_ok_and(|s| s.success());
        assert!(ok, "installing {AWSCLI} into {} failed", venv.display());
    }
    aws
}

fn instances(n: usize) -> Vec<Instance> {
    (0..n)
        .map(|i| Instance {
            instance_id: format!("i-{i:017x}"),
            instance_type: if i % 2 == 0 {
                "p5.48xlarge".into()
            } else {
                "trn2.48xlarge".into()
            },
            availability_zone: "us-west-2a".into(),
            zone_id: "usw2-az1".into(),
            network_nodes: vec!["nn-a".into(), format!("nn-b{}", i / 10), format!("nn-c{i}")],
            group_name: (i % 3 == 0).then(|| "pg-1".into()),
            capacity_block_id: (i == 4).then(|| "cr-0123456789abcdef0".into()),
            state: "running".into(),
        })
        .collect()
}

fn aws(url: &str, args: &[&str]) -> std::process::Output {
    Command::new(aws_cli())
        .args([
            "ec2",
            "describe-instance-topology",
            "--endpoint-url",
            url,
            "--region",
            "us-west-2",
            "--output",
            "json",
        ])
        .args(args)
        .env("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
        .env("AWS_SECRET_ACCESS_KEY", "secret")
        .env("AWS_CONFIG_FILE", "/dev/null")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .output()
        .expect("aws runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_aws_cli_reads_the_scenario_paginated() {
    let mock = MockEc2::new(Scenario {
        instances: instances(45),
        ..Default::default()
    });
    let url = mock_ec2::spawn(mock.clone()).await.expect("mock-ec2");
    let out = tokio::task::spawn_blocking({
        let url = url.clone();
        move || aws(&url, &["--page-size", "20"])
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let items = v["Instances"].as_array().expect("Instances");
    assert_eq!(items.len(), 45, "all instances, across pages");
    assert_eq!(mock.stats().calls, 3, "20 + 20 + 5");
    let four = items
        .iter()
        .find(|i| i["InstanceId"] == "i-00000000000000004")
        .unwrap();
    assert_eq!(
        four["NetworkNodes"],
        serde_json::json!(["nn-a", "nn-b0", "nn-c4"])
    );
    assert_eq!(four["CapacityBlockId"], "cr-0123456789abcdef0");
    assert_eq!(four["ZoneId"], "usw2-az1");
    assert_eq!(four["InstanceType"], "p5.48xlarge");

    let filtered = tokio::task::spawn_blocking({
        let url = url.clone();
        move || aws(&url, &["--filters", "Name=instance-type,Values=trn2*"])
    })
    .await
    .unwrap();
    let v: Value = serde_json::from_slice(&filtered.stdout).expect("JSON");
    assert_eq!(v["Instances"].as_array().map(Vec::len), Some(22));

    let bad = tokio::task::spawn_blocking(move || {
        aws(
            &url,
            &[
                "--instance-ids",
                "i-00000000000000001",
                "--max-results",
                "5",
            ],
        )
    })
    .await
    .unwrap();
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("InvalidParameterCombination"), "{err}");
}
