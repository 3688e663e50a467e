//! The switchable sampler: what the store's `ChangeSampler` RPC changes.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use opentelemetry::trace::{Link, SpanKind, TraceContextExt, TraceId, TraceState};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{Sampler, SamplingDecision, SamplingResult, ShouldSample};

/// Span attribute that, set to `true` when the span is created, samples its
/// trace whatever the setting: the store sets it on a call whose metadata
/// carries a `trace` key, as the book's store does.
pub const FORCE_SAMPLING_ATTRIBUTE: &str = "petstore.force_sampling";

/// Which new traces are recorded.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SamplerSetting {
    Never,
    Always,
    /// A fraction in (0, 1] of the trace IDs.
    Ratio(f64),
}

impl SamplerSetting {
    /// 0 for never, 1 for always, else the ratio: the number a gauge shows.
    pub fn ratio(self) -> f64 {
        match self {
            Self::Never => 0.0,
            Self::Always => 1.0,
            Self::Ratio(ratio) => ratio,
        }
    }

    /// Whether `ratio` is a valid [`SamplerSetting::Ratio`]: in (0, 1], so
    /// NaN is not.
    pub fn is_valid_ratio(ratio: f64) -> bool {
        ratio > 0.0 && ratio <= 1.0
    }

    fn from_ratio(ratio: f64) -> Self {
        if ratio <= 0.0 {
            Self::Never
        } else if ratio >= 1.0 {
            Self::Always
        } else {
            Self::Ratio(ratio)
        }
    }
}

impl fmt::Display for SamplerSetting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Never => f.write_str("never"),
            Self::Always => f.write_str("always"),
            Self::Ratio(ratio) => write!(f, "{ratio}"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not a sampler: give never, always or a ratio in (0, 1] such as 0.25")]
pub struct ParseSamplerError(String);

impl FromStr for SamplerSetting {
    type Err = ParseSamplerError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim() {
            "never" => Ok(Self::Never),
            "always" => Ok(Self::Always),
            other => match other.parse::<f64>() {
                Ok(ratio) if Self::is_valid_ratio(ratio) => Ok(Self::from_ratio(ratio)),
                _ => Err(ParseSamplerError(text.to_owned())),
            },
        }
    }
}

/// A cloneable handle on one switchable sampler: every clone sees a
/// [`SharedSampler::set`] at once, including the tracer provider's copy.
///
/// Parent-based: a span under a sampled parent is sampled; under a local
/// unsampled parent it is not (no orphans); the setting decides only for a
/// root span or one under an unsampled remote parent. A span created with
/// [`FORCE_SAMPLING_ATTRIBUTE`] `= true` is always sampled.
#[derive(Clone, Debug)]
pub struct SharedSampler {
    // The setting as the bits of its ratio (see `SamplerSetting::ratio`): one
    // atomic, so sampling a span takes no lock.
    ratio_bits: Arc<AtomicU64>,
}

/// `never`, the book's store's starting sampler.
impl Default for SharedSampler {
    fn default() -> Self {
        Self::new(SamplerSetting::Never)
    }
}

impl SharedSampler {
    pub fn new(setting: SamplerSetting) -> Self {
        Self {
            ratio_bits: Arc::new(AtomicU64::new(setting.ratio().to_bits())),
        }
    }

    pub fn set(&self, setting: SamplerSetting) {
        self.ratio_bits
            .store(setting.ratio().to_bits(), Ordering::Relaxed);
    }

    pub fn get(&self) -> SamplerSetting {
        SamplerSetting::from_ratio(f64::from_bits(self.ratio_bits.load(Ordering::Relaxed)))
    }
}

fn decision(sampled: bool, trace_state: TraceState) -> SamplingResult {
    SamplingResult {
        decision: if sampled {
            SamplingDecision::RecordAndSample
        } else {
            SamplingDecision::Drop
        },
        attributes: Vec::new(),
        trace_state,
    }
}

impl ShouldSample for SharedSampler {
    fn should_sample(
        &self,
        parent_context: Option<&Context>,
        trace_id: TraceId,
        name: &str,
        span_kind: &SpanKind,
        attributes: &[KeyValue],
        links: &[Link],
    ) -> SamplingResult {
        let parent = parent_context
            .filter(|cx| cx.has_active_span())
            .map(|cx| cx.span().span_context().clone())
            .filter(|parent| parent.is_valid());
        let trace_state = parent
            .as_ref()
            .map(|parent| parent.trace_state().clone())
            .unwrap_or_default();
        if let Some(parent) = &parent {
            if parent.is_sampled() {
                return decision(true, trace_state);
            }
            if !parent.is_remote() {
                return decision(false, trace_state);
            }
        }
        let forced = attributes.iter().any(|attribute| {
            attribute.key.as_str() == FORCE_SAMPLING_ATTRIBUTE
                && attribute.value == opentelemetry::Value::Bool(true)
        });
        let sampled = forced
            || match self.get() {
                SamplerSetting::Never => false,
                SamplerSetting::Always => true,
                SamplerSetting::Ratio(ratio) => {
                    // The SDK's trace-ID ratio rule, so every service that
                    // uses it agrees on the same trace. No parent is passed:
                    // the parent rules were applied above.
                    let by_ratio = Sampler::TraceIdRatioBased(ratio)
                        .should_sample(None, trace_id, name, span_kind, attributes, links);
                    by_ratio.decision == SamplingDecision::RecordAndSample
                }
            };
        decision(sampled, trace_state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse_from_flags() {
        assert_eq!(
            "never".parse::<SamplerSetting>().ok(),
            Some(SamplerSetting::Never)
        );
        assert_eq!(
            "always".parse::<SamplerSetting>().ok(),
            Some(SamplerSetting::Always)
        );
        assert_eq!(
            "0.25".parse::<SamplerSetting>().ok(),
            Some(SamplerSetting::Ratio(0.25))
        );
        for bad in ["0", "1.5", "NaN", "-0.1", "sometimes", ""] {
            assert!(bad.parse::<SamplerSetting>().is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn every_clone_sees_a_change() {
        let sampler = SharedSampler::new(SamplerSetting::Never);
        let clone = sampler.clone();
        sampler.set(SamplerSetting::Ratio(0.5));
        assert_eq!(clone.get(), SamplerSetting::Ratio(0.5));
        clone.set(SamplerSetting::Always);
        assert_eq!(sampler.get(), SamplerSetting::Always);
    }
}
