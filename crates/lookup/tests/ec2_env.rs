#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
//! The standard `AWS_ENDPOINT_URL_EC2` override reaches our client through the default chain.
//! One test in its own binary: it sets process environment variables.

use std::time::Duration;

use ec2_topology_core::topology::TopologySource;
use ec2_topology_lookup::ec2::AwsTopology;
use mock_ec2::{Instance, MockEc2, Scenario};

#[tokio::test]
async fn aws_endpoint_url_ec2_and_env_credentials_are_honoured() {
    let mock = MockEc2::new(Scenario {
        instances: vec![Instance {
            instance_id: "i-0123456789abcdef0".into(),
            instance_type: "trn2.48xlarge".into(),
            availability_zone: "us-east-2b".into(),
            zone_id: "use2-az2".into(),
            network_nodes: vec!["nn-1".into(), "nn-2".into(), "nn-3".into()],
            group_name: None,
            capacity_block_id: None,
            state: "running".into(),
        }],
        ..Default::default()
    });
    let url = mock_ec2::spawn(mock.clone()).await.unwrap();
    // SAFETY: this test binary holds this one test; nothing else reads the environment
    // concurrently.
    unsafe {
        std::env::set_var("AWS_ENDPOINT_URL_EC2", &url);
        std::env::set_var("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "secret");
        std::env::remove_var("AWS_PROFILE");
        std::env::set_var("AWS_CONFIG_FILE", "/nonexistent");
        std::env::set_var("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent");
        std::env::set_var("AWS_EC2_METADATA_DISABLED", "true");
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let ec2 = AwsTopology::from_env(Duration::from_secs(5)).await;
    let found = ec2
        .describe("us-east-2", &["i-0123456789abcdef0".to_string()])
        .await
        .expect("described through the endpoint override");
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].network_nodes, vec!["nn-1", "nn-2", "nn-3"]);
    assert_eq!(mock.stats().calls, 1);
}
