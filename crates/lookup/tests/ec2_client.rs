#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
//! The real EC2 client (EC2's Query API, `crates/lookup/src/query.rs`) against mock-ec2, a real HTTP server speaking EC2's query
//! protocol: answers, pagination, throttling, error XML, broken bodies, timeouts, no server.

use std::{sync::Arc, time::Duration};

use aws_config::Region;
use aws_credential_types::Credentials;
use ec2_topology_core::topology::{Ec2Error, TopologySource};
use ec2_topology_lookup::{
    Lookup, LookupConfig, Resolved,
    ec2::AwsTopology,
    limiter::{Limiter, LimiterConfig},
};
use mock_ec2::{Faults, Instance, MockEc2, Scenario};

fn instance(n: usize, nodes: &[&str]) -> Instance {
    Instance {
        instance_id: format!("i-{n:017x}"),
        instance_type: "p5.48xlarge".into(),
        availability_zone: "us-west-2a".into(),
        zone_id: "usw2-az1".into(),
        network_nodes: nodes.iter().map(|s| s.to_string()).collect(),
        group_name: None,
        capacity_block_id: None,
        state: "running".into(),
    }
}

fn id(n: usize) -> String {
    format!("i-{n:017x}")
}

/// The SDK's configuration as the controller loads it, pointed at `url` with static keys.
async fn sdk_config(url: &str, timeout: Duration) -> aws_config::SdkConfig {
    let _ = rustls::crypto::ring::default_provider().install_default();
    AwsTopology::loader(timeout)
        .endpoint_url(url)
        .region(Region::new("us-west-2"))
        .credentials_provider(Credentials::new(
            "AKIDEXAMPLE",
            "secret",
            None,
            None,
            "test",
        ))
        .load()
        .await
}

async fn client_for(url: &str, timeout: Duration) -> AwsTopology {
    AwsTopology::new(sdk_config(url, timeout).await)
}

async fn start(instances: Vec<Instance>) -> (MockEc2, AwsTopology) {
    let mock = MockEc2::new(Scenario {
        instances,
        ..Default::default()
    });
    let url = mock_ec2::spawn(mock.clone())
        .await
        .expect("mock-ec2 starts");
    let client = client_for(&url, Duration::from_secs(5)).await;
    (mock, client)
}

#[tokio::test]
async fn describes_three_and_four_layers_capacity_blocks_and_groups() {
    let mut ultra = instance(3, &["nn-a", "nn-b", "nn-c", "nn-d"]);
    ultra.instance_type = "p6e-gb200.36xlarge".into();
    ultra.capacity_block_id = Some("cr-0123456789abcdef0".into());
    ultra.group_name = Some("my group".into());
    let (mock, ec2) = start(vec![instance(1, &["nn-a", "nn-b", "nn-c"]), ultra]).await;

    let found = ec2
        .describe("us-west-2", &[id(1), id(3), id(9)])
        .await
        .expect("described");
    assert_eq!(found.len(), 2, "an unknown instance is simply absent");
    let three = found.iter().find(|t| t.instance_id == id(1)).unwrap();
    assert_eq!(three.network_nodes, vec!["nn-a", "nn-b", "nn-c"]);
    assert_eq!(three.zone_id.as_deref(), Some("usw2-az1"));
    assert_eq!(three.instance_type.as_deref(), Some("p5.48xlarge"));
    let four = found.iter().find(|t| t.instance_id == id(3)).unwrap();
    assert_eq!(four.network_nodes.len(), 4);
    assert_eq!(
        four.capacity_block_id.as_deref(),
        Some("cr-0123456789abcdef0")
    );
    assert_eq!(four.group_name.as_deref(), Some("my group"));
    assert_eq!(mock.stats().ids_per_call, vec![3]);
}

#[tokio::test]
async fn follows_next_token_pages() {
    let instances: Vec<Instance> = (0..7).map(|n| instance(n, &["a", "b", "c"])).collect();
    let (mock, ec2) = start(instances).await;
    mock.set_faults(Faults {
        page_size: Some(3),
        ..Faults::default()
    });
    let ids: Vec<String> = (0..7).map(id).collect();
    let found = ec2.describe("us-west-2", &ids).await.expect("described");
    assert_eq!(found.len(), 7);
    assert_eq!(mock.stats().calls, 3, "three pages of at most 3");
}

/// Issue 26.9: every page is a call against the account's EC2 budget: pages after the first
/// (the batcher already took the first one's token) take a token of the shared limiter each.
#[tokio::test]
async fn each_further_page_takes_a_token() {
    use ec2_topology_lookup::limiter::{Limiter, LimiterConfig};
    let instances: Vec<Instance> = (0..7).map(|n| instance(n, &["a", "b", "c"])).collect();
    let (mock, ec2) = start(instances).await;
    // Two tokens, refilled so slowly that none comes back during the test.
    let limiter = Arc::new(Limiter::new(LimiterConfig {
        rate: 0.001,
        burst: 2.0,
        ..LimiterConfig::default()
    }));
    let ec2 = ec2.with_limiter(limiter.clone());
    mock.set_faults(Faults {
        page_size: Some(3),
        ..Faults::default()
    });
    let ids: Vec<String> = (0..7).map(id).collect();
    let found = ec2.describe("us-west-2", &ids).await.expect("described");
    assert_eq!(found.len(), 7);
    assert_eq!(mock.stats().calls, 3, "three pages");
    assert!(
        limiter.try_acquire().is_err(),
        "pages 2 and 3 took the limiter's two tokens"
    );
}

#[tokio::test]
async fn throttling_is_classified_as_throttled() {
    let (mock, ec2) = start(vec![instance(1, &["a"])]).await;
    mock.set_faults(Faults {
        throttle_fraction: 1.0,
        ..Faults::default()
    });
    let err = ec2.describe("us-west-2", &[id(1)]).await.unwrap_err();
    assert!(err.is_throttle(), "{err:?}");
    assert_eq!(
        mock.stats().calls,
        1,
        "the SDK does not retry behind our back"
    );
}

#[tokio::test]
async fn unauthorized_names_the_missing_permission() {
    let (mock, ec2) = start(vec![]).await;
    mock.set_faults(Faults {
        unauthorized: true,
        ..Faults::default()
    });
    let err = ec2.describe("us-west-2", &[id(1)]).await.unwrap_err();
    assert!(matches!(err, Ec2Error::Unauthorized { .. }), "{err:?}");
    assert!(err.to_string().contains("ec2:DescribeInstanceTopology"));
    assert!(err.needs_operator());
}

#[tokio::test]
async fn server_errors_and_rejected_requests_are_told_apart() {
    let (mock, ec2) = start(vec![]).await;
    mock.set_faults(Faults {
        error_5xx_fraction: 1.0,
        ..Faults::default()
    });
    let err = ec2.describe("us-west-2", &[id(1)]).await.unwrap_err();
    assert!(
        matches!(err, Ec2Error::Service { ref code, .. } if code == "InternalError"),
        "{err:?}"
    );
    mock.set_faults(Faults::default());
    let too_many: Vec<String> = (0..101).map(id).collect();
    let err = ec2.describe("us-west-2", &too_many).await.unwrap_err();
    assert!(matches!(err, Ec2Error::InvalidRequest { .. }), "{err:?}");
}

#[tokio::test]
async fn malformed_and_truncated_xml_are_errors_not_empty_answers() {
    let (mock, ec2) = start(vec![instance(1, &["a", "b", "c"])]).await;
    for faults in [
        Faults {
            malformed_fraction: 1.0,
            ..Faults::default()
        },
        Faults {
            truncated_fraction: 1.0,
            ..Faults::default()
        },
    ] {
        mock.set_faults(faults.clone());
        let result = ec2.describe("us-west-2", &[id(1)]).await;
        assert!(result.is_err(), "{faults:?} gave {result:?}");
    }
}

#[tokio::test]
async fn slow_answers_time_out() {
    let mock = MockEc2::new(Scenario::default());
    mock.set_faults(Faults {
        timeout_fraction: 1.0,
        timeout_hold_ms: 3_000,
        ..Faults::default()
    });
    let url = mock_ec2::spawn(mock).await.unwrap();
    let ec2 = client_for(&url, Duration::from_millis(300)).await;
    let started = std::time::Instant::now();
    let err = ec2.describe("us-west-2", &[id(1)]).await.unwrap_err();
    assert!(matches!(err, Ec2Error::Timeout(_)), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn no_server_is_a_transport_error() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let ec2 = client_for(&url, Duration::from_secs(2)).await;
    let err = ec2.describe("us-west-2", &[id(1)]).await.unwrap_err();
    assert!(
        matches!(err, Ec2Error::Transport(_) | Ec2Error::Timeout(_)),
        "{err:?}"
    );
}

#[tokio::test]
async fn the_lookup_stack_batches_250_instances_into_3_calls() {
    let instances: Vec<Instance> = (0..250).map(|n| instance(n, &["a", "b", "c"])).collect();
    let (mock, ec2) = start(instances).await;
    let lookup = Lookup::spawn(
        ec2,
        Arc::new(Limiter::new(LimiterConfig::default())),
        LookupConfig::default(),
        Arc::new(()),
    );
    let asks = (0..250).map(|n| {
        let lookup = lookup.clone();
        async move { lookup.resolve("us-west-2", &id(n), Some("boot")).await }
    });
    let answers = futures::future::join_all(asks).await;
    assert!(
        answers
            .iter()
            .all(|a| matches!(a, Ok(Resolved::Topology { .. })))
    );
    let stats = mock.stats();
    assert_eq!(stats.calls, 3);
    assert!(stats.ids_per_call.iter().all(|n| *n <= 100));
}

/// mock-ec2's Capacity Block calls as the controller reads them: every field it uses parses,
/// and an interconnect that turns impaired is what the next status call says (what UltraServer
/// health polling relies on).
#[tokio::test]
async fn capacity_block_calls_parse() {
    use ec2_topology_lookup::capacity_blocks::Interconnect;
    use mock_ec2::capacity_blocks::CapacityBlock;
    let blocks: Vec<CapacityBlock> = (1..=3u32)
        .map(|n| CapacityBlock {
            capacity_block_id: format!("cb-{n:017x}"),
            ultraserver_type: (n != 2).then(|| "u-p6e-gb200x72".to_string()),
            availability_zone: "us-west-2a".into(),
            availability_zone_id: "usw2-az1".into(),
            capacity_reservation_ids: vec![format!("cr-{n:017x}")],
            start_date: Some("2026-12-05T11:30:00.000Z".into()),
            end_date: Some("2026-12-19T11:30:00.000Z".into()),
            create_date: None,
            state: "active".into(),
            interconnect_status: "ok".into(),
            total_capacity: 18,
            total_available_capacity: 0,
            total_unavailable_capacity: 1,
        })
        .collect();
    let ids: Vec<String> = blocks.iter().map(|b| b.capacity_block_id.clone()).collect();
    let mock = MockEc2::new(Scenario {
        capacity_blocks: blocks,
        ..Default::default()
    });
    let url = mock_ec2::spawn(mock.clone())
        .await
        .expect("mock-ec2 starts");
    let ec2 = client_for(&url, Duration::from_secs(5)).await;
    let shapes = ec2.shapes("us-west-2", &ids).await;
    assert!(shapes.failed.is_empty(), "{:?}", shapes.failed);
    assert_eq!(shapes.blocks.len(), 3);
    let first = &shapes.blocks["cb-00000000000000001"];
    assert_eq!(first.ultraserver_type.as_deref(), Some("u-p6e-gb200x72"));
    assert_eq!(first.state.as_deref(), Some("active"));
    assert_eq!(first.end.as_deref(), Some("2026-12-19T11:30:00Z"));
    assert_eq!(
        shapes.blocks["cb-00000000000000002"].ultraserver_type, None,
        "a block of instances"
    );
    let one = vec!["cb-00000000000000001".to_string()];
    let ok = ec2.interconnects("us-west-2", &one).await;
    assert!(ok.failed.is_empty(), "{:?}", ok.failed);
    assert_eq!(ok.statuses[&one[0]], Interconnect::Ok);
    assert_eq!(ok.capacities[&one[0]], 18);
    assert!(mock.set_interconnect_status("cb-00000000000000001", "impaired"));
    assert_eq!(
        ec2.interconnects("us-west-2", &one).await.statuses[&one[0]],
        Interconnect::Impaired
    );
    let stats = mock.capacity_block_stats();
    assert_eq!(
        (stats.blocks_calls, stats.status_calls, stats.failed),
        (1, 2, 0)
    );
}

/// Calls are signed as EC2 checks them (Signature Version 4, recomputed by mock-ec2 with the
/// SDK's own signer): accepted with the key EC2 knows, refused (`AuthFailure`, the operator's to
/// fix) with a secret it does not.
#[tokio::test]
async fn calls_are_signed_as_ec2_checks_them() {
    use mock_ec2::auth::{AuthConfig, StaticCredential};
    let (mock, ec2) = start(vec![instance(1, &["a", "b", "c"])]).await;
    mock.set_auth(AuthConfig {
        verify_signatures: true,
        static_credentials: vec![StaticCredential {
            access_key_id: "AKIDEXAMPLE".into(),
            secret_access_key: "secret".into(),
        }],
        ..AuthConfig::default()
    });
    let found = ec2.describe("us-west-2", &[id(1)]).await.expect("signed");
    assert_eq!(found[0].network_nodes, ["a", "b", "c"]);
    mock.set_auth(AuthConfig {
        verify_signatures: true,
        static_credentials: vec![StaticCredential {
            access_key_id: "AKIDEXAMPLE".into(),
            secret_access_key: "another".into(),
        }],
        ..AuthConfig::default()
    });
    let err = ec2.describe("us-west-2", &[id(1)]).await.unwrap_err();
    assert!(matches!(err, Ec2Error::Unauthorized { .. }), "{err:?}");
    assert!(err.needs_operator());
}
