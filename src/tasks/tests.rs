//! The supervisor with tasks that panic or end (paused time).

use std::sync::atomic::{AtomicU32, Ordering};

use super::*;

fn restarts(metrics: &Metrics, task: &str) -> String {
    metrics
        .render()
        .lines()
        .find(|l| {
            l.starts_with(&format!(
                "ec2_topology_labeler_task_restarts_total{{task=\"{task}\"}}"
            ))
        })
        .unwrap_or_default()
        .to_string()
}

/// A forever task that panics on its first two runs is restarted after 1 s, then 2 s, counted
/// each time, and then runs on.
#[tokio::test(start_paused = true)]
async fn a_panicking_task_restarts_with_backoff_and_is_counted() {
    let metrics = Arc::new(Metrics::new());
    let runs = Arc::new(AtomicU32::new(0));
    let seen = runs.clone();
    let started = tokio::time::Instant::now();
    let _task = supervise("coverage", Lifetime::Forever, metrics.clone(), move || {
        let run = seen.fetch_add(1, Ordering::SeqCst);
        async move {
            assert!(run >= 2, "a bug met on run {run}");
            std::future::pending::<()>().await;
        }
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(runs.load(Ordering::SeqCst), 2, "restarted after 1 s");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(runs.load(Ordering::SeqCst), 2, "the second pause is 2 s");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(runs.load(Ordering::SeqCst), 3, "restarted after 2 s more");
    assert!(started.elapsed() < Duration::from_secs(4));
    assert_eq!(
        restarts(&metrics, "coverage"),
        "ec2_topology_labeler_task_restarts_total{task=\"coverage\"} 2"
    );
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert_eq!(runs.load(Ordering::SeqCst), 3, "runs on once it works");
}

/// A one-shot task that ends is done; one that panics runs again until it ends.
#[tokio::test(start_paused = true)]
async fn a_one_shot_task_is_restarted_only_when_it_panics() {
    let metrics = Arc::new(Metrics::new());
    let runs = Arc::new(AtomicU32::new(0));
    let seen = runs.clone();
    let task = supervise(
        "retire at start",
        Lifetime::Once,
        metrics.clone(),
        move || {
            let run = seen.fetch_add(1, Ordering::SeqCst);
            async move { assert!(run >= 1, "panics once") }
        },
    );
    task.await.expect("the supervisor ends with its task");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert!(restarts(&metrics, "retire at start").ends_with(" 1"));
}

/// A forever task that returns is restarted too (it should not end).
#[tokio::test(start_paused = true)]
async fn a_forever_task_that_ends_is_restarted() {
    let metrics = Arc::new(Metrics::new());
    let runs = Arc::new(AtomicU32::new(0));
    let seen = runs.clone();
    let _task = supervise(
        "housekeeping",
        Lifetime::Forever,
        metrics.clone(),
        move || {
            seen.fetch_add(1, Ordering::SeqCst);
            async {}
        },
    );
    tokio::time::sleep(Duration::from_secs(10)).await;
    // Pauses 1, 2, 4 s: runs at 0, 1, 3 and 7 s.
    assert_eq!(runs.load(Ordering::SeqCst), 4);
}
