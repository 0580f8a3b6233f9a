//! Whether the Node watch works: told by the client when a Node watch request is answered and
//! by the watcher when it fails; read by readiness (`/readyz`) and the
//! `node_watch_unhealthy_seconds` gauge.
//!
//! Owns: that verdict and when a failure counts as over. Never talks to the API server.

/// How long after its last error a failing watch counts as recovered without an event or a
/// watch started (the client tells [`WatchHealth::ok`] when a Node watch request is answered):
/// longer than the watcher's longest pause between attempts (30 s, jittered up to twice that)
/// plus an attempt's own bounds (connect 10 s, request 30 s), so a failure that lasts keeps
/// counting.
pub(crate) const RECOVERED_AFTER: std::time::Duration = std::time::Duration::from_secs(180);

/// Whether the Node watch works: failing from the first error with no event since, while errors
/// keep coming. Read by readiness and the `node_watch_unhealthy_seconds` gauge.
#[derive(Debug, Default)]
pub(crate) struct WatchHealth {
    /// The first error of the current run of errors, and the latest.
    failing: std::sync::Mutex<Option<(tokio::time::Instant, tokio::time::Instant)>>,
    /// Whether `failing` holds a run: every watch event calls [`WatchHealth::ok`], which
    /// reads this alone while the watch works (no lock on the event path).
    any: std::sync::atomic::AtomicBool,
}

impl WatchHealth {
    /// An event arrived: the watch works.
    pub(crate) fn ok(&self) {
        use std::sync::atomic::Ordering;
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        // Both under the lock, as `error` sets them: a concurrent error is never lost.
        let mut failing = self.failing.lock().unwrap_or_else(|e| e.into_inner());
        *failing = None;
        self.any.store(false, Ordering::Release);
    }

    /// The watch failed (it restarts with backoff).
    pub(crate) fn error(&self) {
        let now = tokio::time::Instant::now();
        let mut failing = self.failing.lock().unwrap_or_else(|e| e.into_inner());
        *failing = match *failing {
            Some((since, last)) if last.elapsed() < RECOVERED_AFTER => Some((since, now)),
            _ => Some((now, now)),
        };
        self.any.store(true, std::sync::atomic::Ordering::Release);
    }

    /// How long the watch has been failing (zero while it works).
    pub(crate) fn unhealthy_for(&self) -> std::time::Duration {
        match *self.failing.lock().unwrap_or_else(|e| e.into_inner()) {
            Some((since, last)) if last.elapsed() < RECOVERED_AFTER => since.elapsed(),
            _ => std::time::Duration::ZERO,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::WatchHealth;

    /// A persistent failure (a revoked `watch`: a 403 at every retry, up to 90 s apart) is
    /// unhealthy from its first error on; an event (or a watch started) makes it healthy at
    /// once; errors that stop count as recovered after 180 s.
    #[tokio::test(start_paused = true)]
    async fn a_watch_is_unhealthy_while_errors_keep_coming_and_healthy_after() {
        let health = WatchHealth::default();
        assert_eq!(health.unhealthy_for(), Duration::ZERO);
        for _ in 0..10 {
            health.error();
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
        assert_eq!(health.unhealthy_for(), Duration::from_secs(300));
        health.ok();
        assert_eq!(health.unhealthy_for(), Duration::ZERO, "an event: healthy");
        health.error();
        tokio::time::sleep(Duration::from_secs(90)).await;
        health.error();
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(
            health.unhealthy_for(),
            Duration::from_secs(150),
            "errors 90 s apart (the longest backoff and an attempt's bounds) keep counting"
        );
        tokio::time::sleep(Duration::from_secs(121)).await;
        assert_eq!(
            health.unhealthy_for(),
            Duration::ZERO,
            "no error for 180 s: the watch resumed"
        );
        health.error();
        assert_eq!(
            health.unhealthy_for(),
            Duration::ZERO,
            "a new run starts now"
        );
    }
}
