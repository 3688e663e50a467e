//! The budget of calls to the store: a token bucket shared by every caller
//! (reconciles, the audit, the re-reads after a lost change feed), so that
//! however many Pets want the store at once, it gets at most `rate` calls a
//! second on average and `burst` at once.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

pub struct CallBudget {
    /// Calls per second; `None` for no limit.
    rate: Option<f64>,
    burst: f64,
    bucket: Mutex<Bucket>,
}

struct Bucket {
    /// May go below zero: callers that took a token in advance wait for it.
    tokens: f64,
    refilled: Instant,
}

impl CallBudget {
    /// `rate` calls a second (0: no limit), at most `burst` at once (at
    /// least 1).
    pub fn new(rate: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            rate: (rate.is_finite() && rate > 0.0).then_some(rate),
            burst,
            bucket: Mutex::new(Bucket {
                tokens: burst,
                refilled: Instant::now(),
            }),
        }
    }

    pub fn unlimited() -> Self {
        Self::new(0.0, 1)
    }

    /// Takes one call's token: how long the caller must wait before making
    /// the call (zero when a token was there).
    pub fn take(&self, now: Instant) -> Duration {
        let Some(rate) = self.rate else {
            return Duration::ZERO;
        };
        // Plain numbers inside; a panic elsewhere cannot corrupt them.
        let mut bucket = self.bucket.lock().unwrap_or_else(PoisonError::into_inner);
        let elapsed = now.saturating_duration_since(bucket.refilled).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * rate).min(self.burst);
        bucket.refilled = bucket.refilled.max(now);
        bucket.tokens -= 1.0;
        if bucket.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-bucket.tokens / rate)
        }
    }

    /// Waits until a call fits in the budget.
    pub async fn acquire(&self) {
        let wait = self.take(Instant::now());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_passes_then_calls_are_spaced_at_the_rate() {
        let budget = CallBudget::new(100.0, 5);
        let start = Instant::now();
        for _ in 0..5 {
            assert_eq!(budget.take(start), Duration::ZERO);
        }
        // The sixth waits one token (10 ms), the seventh two.
        let sixth = budget.take(start);
        let seventh = budget.take(start);
        assert!((sixth.as_secs_f64() - 0.010).abs() < 1e-9, "{sixth:?}");
        assert!((seventh.as_secs_f64() - 0.020).abs() < 1e-9, "{seventh:?}");
        // A second later the bucket is full again, never fuller than the
        // burst.
        let later = start + Duration::from_secs(1);
        for _ in 0..5 {
            assert_eq!(budget.take(later), Duration::ZERO);
        }
        assert!(budget.take(later) > Duration::ZERO);
    }

    #[test]
    fn over_time_the_rate_holds() {
        let budget = CallBudget::new(50.0, 10);
        let start = Instant::now();
        // 1,000 calls asked for at once are spread over about 20 s.
        let last = (0..1_000)
            .map(|_| budget.take(start))
            .max()
            .unwrap_or_default();
        let expected = (1_000.0 - 10.0) / 50.0;
        assert!((last.as_secs_f64() - expected).abs() < 1e-6, "{last:?}");
    }

    #[test]
    fn no_rate_means_no_wait() {
        let budget = CallBudget::unlimited();
        let now = Instant::now();
        assert!((0..10_000).all(|_| budget.take(now).is_zero()));
        let zero = CallBudget::new(0.0, 0);
        assert!(zero.take(now).is_zero());
    }
}
