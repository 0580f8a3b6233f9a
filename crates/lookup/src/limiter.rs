//! One limiter shared by every EC2 call the process makes.
//!
//! EC2 meters non-mutating calls per account and region with a token bucket (about 100 burst,
//! 20/s refill) that every other tool in the account draws from too. We keep our own, smaller
//! bucket so we never take more than our share, and when EC2 still says `RequestLimitExceeded`
//! every caller waits out one shared, jittered, exponentially growing pause — no retry storms.
//!
//! Owns: the pace of EC2 calls. Never calls EC2 itself.

use std::{sync::Mutex, time::Duration};

use tokio::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LimiterConfig {
    /// Sustained calls per second.
    pub rate: f64,
    /// Calls allowed back to back after a quiet period.
    pub burst: f64,
    /// First pause after a throttle; doubles with each consecutive throttle.
    pub backoff_base: Duration,
    /// Longest pause.
    pub backoff_cap: Duration,
}

impl Default for LimiterConfig {
    fn default() -> Self {
        Self {
            rate: 5.0,
            burst: 20.0,
            backoff_base: Duration::from_millis(500),
            backoff_cap: Duration::from_secs(30),
        }
    }
}

#[derive(Debug)]
struct State {
    tokens: f64,
    refilled_at: Instant,
    paused_until: Instant,
    consecutive_throttles: u32,
}

#[derive(Debug)]
pub struct Limiter {
    cfg: LimiterConfig,
    state: Mutex<State>,
}

impl Limiter {
    pub fn new(cfg: LimiterConfig) -> Self {
        let now = Instant::now();
        Self {
            cfg: LimiterConfig {
                rate: cfg.rate.max(0.001),
                burst: cfg.burst.max(1.0),
                ..cfg
            },
            state: Mutex::new(State {
                tokens: cfg.burst.max(1.0),
                refilled_at: now,
                paused_until: now,
                consecutive_throttles: 0,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is a few numbers, each always consistent on its own: recover from poison.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Take a token if a call may be made now; otherwise say how long until one may.
    pub fn try_acquire(&self) -> Result<(), Duration> {
        let mut s = self.lock();
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(s.refilled_at).as_secs_f64();
        s.tokens = (s.tokens + elapsed * self.cfg.rate).min(self.cfg.burst);
        s.refilled_at = now;
        if now < s.paused_until {
            Err(s.paused_until - now)
        } else if s.tokens >= 1.0 {
            s.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - s.tokens) / self.cfg.rate)
                .max(Duration::from_millis(1)))
        }
    }

    /// Wait until a call may be made, and take its token.
    pub async fn acquire(&self) {
        while let Err(wait) = self.try_acquire() {
            tokio::time::sleep(wait).await;
        }
    }

    /// EC2 throttled a call: pause every caller. Returns the pause.
    pub fn on_throttle(&self) -> Duration {
        let mut s = self.lock();
        s.consecutive_throttles = s.consecutive_throttles.saturating_add(1);
        let full = crate::backoff::capped(
            self.cfg.backoff_base,
            s.consecutive_throttles,
            self.cfg.backoff_cap,
        );
        // At least half the pause, so a throttled fleet spreads out but still waits.
        let pause = crate::backoff::equal_jitter(full);
        let until = Instant::now() + pause;
        if until > s.paused_until {
            s.paused_until = until;
        }
        // Spend the bucket too: what EC2 refused is what we thought we had.
        s.tokens = 0.0;
        pause
    }

    /// A call went through: the next throttle starts from the base pause again.
    pub fn on_success(&self) {
        self.lock().consecutive_throttles = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn burst_then_rate() {
        let l = Limiter::new(LimiterConfig {
            rate: 2.0,
            burst: 3.0,
            ..LimiterConfig::default()
        });
        let start = Instant::now();
        for _ in 0..3 {
            l.acquire().await;
        }
        assert_eq!(start.elapsed(), Duration::ZERO, "the burst is immediate");
        l.acquire().await;
        l.acquire().await;
        let e = start.elapsed();
        assert!(
            e >= Duration::from_millis(999) && e <= Duration::from_millis(1100),
            "two more at 2/s take ~1s, took {e:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn throttles_pause_every_caller_with_growing_jittered_backoff() {
        let l = Limiter::new(LimiterConfig {
            rate: 1000.0,
            burst: 1000.0,
            backoff_base: Duration::from_secs(1),
            backoff_cap: Duration::from_secs(8),
        });
        let p1 = l.on_throttle();
        assert!(p1 >= Duration::from_millis(500) && p1 <= Duration::from_secs(1));
        let p2 = l.on_throttle();
        assert!(p2 >= Duration::from_secs(1) && p2 <= Duration::from_secs(2));
        for _ in 0..10 {
            l.on_throttle();
        }
        let capped = l.on_throttle();
        assert!(
            capped <= Duration::from_secs(8),
            "capped at 8s, got {capped:?}"
        );
        let start = Instant::now();
        l.acquire().await;
        assert!(
            start.elapsed() >= Duration::from_secs(4),
            "callers wait out the pause"
        );
        l.on_success();
        let again = l.on_throttle();
        assert!(
            again <= Duration::from_secs(1),
            "success resets the backoff"
        );
    }
}
