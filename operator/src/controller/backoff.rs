//! How long a failing Pet waits before its next attempt.

use std::time::Duration;

use super::Settings;

/// Exponential backoff per Pet: base * 2^(failures-1), capped, with jitter.
pub fn backoff(settings: &Settings, failures: u32) -> Duration {
    let exponent = failures.saturating_sub(1).min(20);
    let delay = settings
        .backoff_base
        .saturating_mul(1u32 << exponent)
        .min(settings.backoff_max);
    // Up to 10% extra, so Pets failing together do not retry together.
    delay.mul_f64(1.0 + fastrand::f64() * 0.1)
}
