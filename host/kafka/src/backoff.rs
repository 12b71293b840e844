//! The one backoff primitive: exponential with full jitter, capped, optionally bounded by a
//! deadline. Every retry loop in sharehost uses it so retry behaviour is tuned in one place.

use std::time::Duration;

use rand::Rng;
use tokio::time::Instant;

/// Settings for [`Backoff`]; the defaults mirror the Java client's `retry.backoff.ms` (100) and
/// `retry.backoff.max.ms` (1000).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BackoffConfig {
    /// First delay.
    pub initial: Duration,
    /// Largest delay.
    pub max: Duration,
    /// Growth per attempt.
    pub factor: f64,
}

impl Default for BackoffConfig {
    fn default() -> Self {
        BackoffConfig {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(1000),
            factor: 2.0,
        }
    }
}

/// Yields growing, jittered delays; `reset` after a success.
#[derive(Debug, Clone)]
pub struct Backoff {
    config: BackoffConfig,
    attempt: u32,
    deadline: Option<Instant>,
}

impl Backoff {
    /// A backoff without a deadline.
    pub fn new(config: BackoffConfig) -> Self {
        Backoff {
            config,
            attempt: 0,
            deadline: None,
        }
    }

    /// A backoff that refuses to wait past `deadline`.
    pub fn with_deadline(config: BackoffConfig, deadline: Instant) -> Self {
        Backoff {
            config,
            attempt: 0,
            deadline: Some(deadline),
        }
    }

    /// The next delay, or `None` when waiting it would pass the deadline.
    pub fn next_delay(&mut self) -> Option<Duration> {
        let ceiling = self.ceiling();
        self.attempt = self.attempt.saturating_add(1);
        // Full jitter: uniformly in [ceiling/2, ceiling] so concurrent clients spread out while
        // the delay still grows.
        let half = ceiling / 2;
        let jitter = rand::rng().random_range(0..=half.as_millis().max(1) as u64);
        let delay = half + Duration::from_millis(jitter);
        match self.deadline {
            Some(d) if Instant::now() + delay > d => None,
            _ => Some(delay),
        }
    }

    /// Sleeps for the next delay; returns `false` (without sleeping) past the deadline.
    pub async fn wait(&mut self) -> bool {
        match self.next_delay() {
            Some(d) => {
                tokio::time::sleep(d).await;
                true
            }
            None => false,
        }
    }

    /// Starts over after a success.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }

    /// Attempts made since the last reset.
    pub fn attempts(&self) -> u32 {
        self.attempt
    }

    fn ceiling(&self) -> Duration {
        let grown = self.config.initial.as_secs_f64()
            * self.config.factor.powi(self.attempt.min(30) as i32);
        Duration::from_secs_f64(grown.min(self.config.max.as_secs_f64()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_and_stay_under_the_cap() {
        let cfg = BackoffConfig {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(800),
            factor: 2.0,
        };
        let mut b = Backoff::new(cfg);
        let mut ceilings = Vec::new();
        for _ in 0..8 {
            let c = b.ceiling();
            let d = b.next_delay().expect("no deadline");
            assert!(d <= c && d >= c / 2, "{d:?} not in [{:?}, {c:?}]", c / 2);
            ceilings.push(c);
        }
        assert_eq!(ceilings[0], Duration::from_millis(100));
        assert_eq!(ceilings[3], Duration::from_millis(800));
        assert_eq!(
            *ceilings.last().expect("8 items"),
            Duration::from_millis(800)
        );
        b.reset();
        assert_eq!(b.attempts(), 0);
        assert_eq!(b.ceiling(), Duration::from_millis(100));
    }

    #[tokio::test(start_paused = true)]
    async fn deadline_stops_the_backoff() {
        let mut b = Backoff::with_deadline(
            BackoffConfig::default(),
            Instant::now() + Duration::from_millis(250),
        );
        let mut waits = 0;
        while b.wait().await {
            waits += 1;
        }
        assert!(waits >= 1, "at least one wait fits before the deadline");
        assert!(
            Instant::now() <= b.deadline.expect("set"),
            "never slept past the deadline"
        );
    }
}
