//! The control plane the e2e suite builds and starts: up in seconds, two at once do not
//! collide, and stopping leaves no process behind.

use std::time::{Duration, Instant};

use e2e::cluster::ControlPlane;

fn running(pid: u32) -> bool {
    // A zombie would still have a /proc entry: check its state too.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.split_whitespace().nth(2).is_none_or(|state| state != "Z"))
        .unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_control_planes_start_side_by_side_and_stop_cleanly() {
    e2e::init_tls();
    let (a, b) = (
        e2e::work_dir("ec2tl-cp-a").unwrap(),
        e2e::work_dir("ec2tl-cp-b").unwrap(),
    );
    let started = Instant::now();
    let (mut one, mut two) =
        tokio::try_join!(ControlPlane::start(&a), ControlPlane::start(&b)).expect("both start");
    let took = started.elapsed();
    eprintln!("two control planes ready in {:.1}s", took.as_secs_f64());
    assert!(took < Duration::from_secs(60));
    assert_ne!(one.server, two.server, "each on its own port");
    for cp in [&one, &two] {
        let client = cp.admin_client().await.expect("client");
        let v = client.apiserver_version().await.expect("/version");
        assert!(
            v.git_version.starts_with("v1.36"),
            "stamped version: {}",
            v.git_version
        );
    }
    let pids: Vec<u32> = one.pids().into_iter().chain(two.pids()).collect();
    assert_eq!(pids.len(), 4, "etcd and kube-apiserver each");
    assert!(pids.iter().all(|p| running(*p)));
    one.stop();
    two.stop();
    assert!(pids.iter().all(|p| !running(*p)), "no process left behind");
    e2e::remove_work_dir(&a, true);
    e2e::remove_work_dir(&b, true);
}
