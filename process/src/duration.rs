//! One grammar for every duration flag of both binaries: a number with a
//! unit (`ms`, `s`, `m`, `h`), several of them largest first (`1h30m`, also
//! spaced: `1h 30m`), the last one possibly a fraction (`1.5m`). ISO 8601
//! (`PT1H30M`) reads too. A bare number is refused: the unit is never
//! guessed. Only `0` needs none, and reads as zero, as Go's durations read
//! it (the flags' help says "0 sends every create alone", say).
//!
//! Not kube's own Duration parser: that one panics on a number too large
//! for a duration, and reads `-5m` as five minutes.

use std::time::Duration;

use jiff::SignedDuration;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("{text:?} is not a duration such as 500ms, 30s, 5m, 1h or 1h30m ({reason})")]
    Syntax { text: String, reason: String },
    #[error("{text:?} is negative")]
    Negative { text: String },
    #[error("{text:?} must be longer than zero")]
    Zero { text: String },
}

/// A duration flag's value, zero allowed; see the module's grammar.
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    if text.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    let signed: SignedDuration =
        text.trim()
            .parse()
            .map_err(|err: jiff::Error| DurationError::Syntax {
                text: text.to_owned(),
                reason: err.to_string(),
            })?;
    Duration::try_from(signed).map_err(|_| DurationError::Negative {
        text: text.to_owned(),
    })
}

/// Like [`parse_duration`], for a flag where zero makes no sense (an
/// interval that would otherwise spin).
pub fn parse_positive_duration(text: &str) -> Result<Duration, DurationError> {
    match parse_duration(text)? {
        Duration::ZERO => Err(DurationError::Zero {
            text: text.to_owned(),
        }),
        duration => Ok(duration),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_documented_form_reads() {
        for (text, expected) in [
            ("200ms", Duration::from_millis(200)),
            ("500ms", Duration::from_millis(500)),
            ("10s", Duration::from_secs(10)),
            ("30s", Duration::from_secs(30)),
            ("1m", Duration::from_secs(60)),
            ("5m", Duration::from_secs(300)),
            ("1h", Duration::from_secs(3600)),
            ("1.5m", Duration::from_secs(90)),
            ("1.5h", Duration::from_secs(5400)),
            ("1h30m", Duration::from_secs(5400)),
            (" 1h 30m ", Duration::from_secs(5400)),
            ("PT1H30M", Duration::from_secs(5400)),
            ("0s", Duration::ZERO),
            ("0", Duration::ZERO),
        ] {
            assert_eq!(parse_duration(text), Ok(expected), "{text:?}");
        }
    }

    #[test]
    fn bad_values_are_refused_with_the_reason() {
        for text in ["", "7", "soon", "5 parsecs", "99999999999999999999h"] {
            match parse_duration(text) {
                Err(DurationError::Syntax { text: named, .. }) => assert_eq!(named, text),
                other => panic!("{text:?} gave {other:?}"),
            }
        }
        assert_eq!(
            parse_duration("-5m"),
            Err(DurationError::Negative { text: "-5m".into() })
        );
        let message = parse_duration("soon").expect_err("soon").to_string();
        assert!(message.contains("\"soon\" is not a duration"), "{message}");
    }

    #[test]
    fn a_positive_duration_refuses_zero_only() {
        assert_eq!(
            parse_positive_duration("0s"),
            Err(DurationError::Zero { text: "0s".into() })
        );
        assert_eq!(parse_positive_duration("1ms"), Ok(Duration::from_millis(1)));
        assert!(matches!(
            parse_positive_duration("-1s"),
            Err(DurationError::Negative { .. })
        ));
    }
}
