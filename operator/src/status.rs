//! Computes the Pet's next `.status` from the outcome of a reconcile. Pure, so
//! the condition rules (and "write nothing when nothing changed") are tested
//! without an API server.

use chrono::{DateTime, Utc};

use crate::crd::{Condition, PAUSED_ANNOTATION, PetStatus};

pub const READY: &str = "Ready";
pub const SYNCED: &str = "Synced";

/// Condition reasons. Each tells the user what to do next; the README lists
/// them all.
pub mod reason {
    /// Ready=True: the store record matches the spec.
    pub const AVAILABLE: &str = "Available";
    /// Synced=True: the last reconciliation succeeded.
    pub const RECONCILE_SUCCESS: &str = "ReconcileSuccess";
    /// The pet store cannot be reached; the operator retries with backoff.
    pub const STORE_UNAVAILABLE: &str = "StoreUnavailable";
    /// The store rejected the spec; fix the spec to retry.
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// Another error; the operator retries with backoff.
    pub const RECONCILE_ERROR: &str = "ReconcileError";
    /// The paused annotation is set; nothing is reconciled.
    pub const RECONCILE_PAUSED: &str = "ReconcilePaused";
    /// Ready is not known yet (paused before the first reconcile).
    pub const PENDING: &str = "Pending";
}

/// How a reconcile ended, as far as the user should know.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Synced,
    StoreUnavailable(String),
    InvalidSpec(String),
    Failed(String),
    Paused,
}

impl Outcome {
    /// The reason this outcome gives the Synced condition.
    pub fn synced_reason(&self) -> &'static str {
        self.conditions().3
    }

    /// (Ready status, Ready reason, Synced status, Synced reason, message)
    fn conditions(
        &self,
    ) -> (
        Option<&'static str>,
        &'static str,
        &'static str,
        &'static str,
        String,
    ) {
        match self {
            Outcome::Synced => (
                Some("True"),
                reason::AVAILABLE,
                "True",
                reason::RECONCILE_SUCCESS,
                "the store record matches the spec".into(),
            ),
            Outcome::StoreUnavailable(message) => (
                Some("False"),
                reason::STORE_UNAVAILABLE,
                "False",
                reason::STORE_UNAVAILABLE,
                format!("cannot reach the pet store, retrying with backoff: {message}"),
            ),
            Outcome::InvalidSpec(message) => (
                Some("False"),
                reason::INVALID_SPEC,
                "False",
                reason::INVALID_SPEC,
                format!("the pet store rejected this spec; edit the Pet to retry: {message}"),
            ),
            Outcome::Failed(message) => (
                Some("False"),
                reason::RECONCILE_ERROR,
                "False",
                reason::RECONCILE_ERROR,
                format!("retrying with backoff: {message}"),
            ),
            // Paused leaves Ready as it was: the record is untouched.
            Outcome::Paused => (
                None,
                reason::PENDING,
                "False",
                reason::RECONCILE_PAUSED,
                format!("reconciliation is paused by the annotation {PAUSED_ANNOTATION}=\"true\""),
            ),
        }
    }
}

fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: DateTime<Utc>,
) {
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(existing) => {
            if existing.status != status {
                existing.last_transition_time = now;
                existing.status = status.to_owned();
            }
            existing.reason = reason.to_owned();
            existing.message = message.to_owned();
            existing.observed_generation = generation;
        }
        None => conditions.push(Condition {
            type_: type_.to_owned(),
            status: status.to_owned(),
            reason: reason.to_owned(),
            message: message.to_owned(),
            last_transition_time: now,
            observed_generation: generation,
        }),
    }
}

/// The status after a reconcile: `id` is the record ID to publish (`None`
/// keeps the current one). Transition times change only when a condition's
/// status does, so an unchanged outcome yields an identical status and no
/// API write.
pub fn next_status(
    current: Option<&PetStatus>,
    generation: Option<i64>,
    id: Option<&str>,
    outcome: &Outcome,
    now: DateTime<Utc>,
) -> PetStatus {
    let mut status = current.cloned().unwrap_or_default();
    if let Some(id) = id {
        status.id = Some(id.to_owned());
    }
    let (ready, ready_reason, synced, synced_reason, message) = outcome.conditions();
    match ready {
        Some(ready) => set_condition(
            &mut status.conditions,
            READY,
            ready,
            ready_reason,
            &message,
            generation,
            now,
        ),
        None if !status.conditions.iter().any(|c| c.type_ == READY) => set_condition(
            &mut status.conditions,
            READY,
            "Unknown",
            ready_reason,
            "not reconciled yet",
            generation,
            now,
        ),
        None => {}
    }
    set_condition(
        &mut status.conditions,
        SYNCED,
        synced,
        synced_reason,
        &message,
        generation,
        now,
    );
    // Keep a stable order so equal statuses compare equal.
    status.conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
    if *outcome != Outcome::Paused {
        status.observed_generation = generation;
    }
    status
}

/// True when the Pet already shows a terminal rejection of this generation:
/// retrying the store cannot help until the spec changes.
pub fn rejected_this_generation(status: Option<&PetStatus>, generation: Option<i64>) -> bool {
    status.is_some_and(|s| {
        s.conditions.iter().any(|c| {
            c.type_ == SYNCED
                && c.reason == reason::INVALID_SPEC
                && c.observed_generation == generation
        })
    })
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    fn at(seconds: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_700_000_000 + seconds, 0)
            .single()
            .expect("valid time")
    }

    fn condition<'a>(status: &'a PetStatus, type_: &str) -> &'a Condition {
        status
            .conditions
            .iter()
            .find(|c| c.type_ == type_)
            .expect("condition present")
    }

    #[test]
    fn synced_sets_id_generation_and_both_conditions_true() {
        let s = next_status(None, Some(3), Some("id-1"), &Outcome::Synced, at(0));
        assert_eq!(s.id.as_deref(), Some("id-1"));
        assert_eq!(s.observed_generation, Some(3));
        let ready = condition(&s, READY);
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("True", "Available")
        );
        assert_eq!(ready.observed_generation, Some(3));
        assert_eq!(condition(&s, SYNCED).reason, "ReconcileSuccess");
    }

    #[test]
    fn unchanged_outcome_gives_an_identical_status() {
        let first = next_status(None, Some(1), Some("id-1"), &Outcome::Synced, at(0));
        let again = next_status(
            Some(&first),
            Some(1),
            Some("id-1"),
            &Outcome::Synced,
            at(60),
        );
        assert_eq!(first, again, "no API write in steady state");
    }

    #[test]
    fn transition_time_moves_only_when_status_flips() {
        let ok = next_status(None, Some(1), Some("id-1"), &Outcome::Synced, at(0));
        let down = next_status(
            Some(&ok),
            Some(1),
            None,
            &Outcome::StoreUnavailable("connection refused".into()),
            at(10),
        );
        let ready = condition(&down, READY);
        assert_eq!(ready.status, "False");
        assert_eq!(ready.reason, "StoreUnavailable");
        assert!(ready.message.contains("connection refused"));
        assert_eq!(ready.last_transition_time, at(10));
        assert_eq!(down.id.as_deref(), Some("id-1"), "the ID is kept");

        let still_down = next_status(
            Some(&down),
            Some(1),
            None,
            &Outcome::Failed("boom".into()),
            at(20),
        );
        assert_eq!(condition(&still_down, READY).last_transition_time, at(10));
        assert_eq!(condition(&still_down, READY).reason, "ReconcileError");
    }

    #[test]
    fn invalid_spec_is_terminal_for_its_generation_only() {
        let s = next_status(
            None,
            Some(2),
            None,
            &Outcome::InvalidSpec("pets[0].name: too long".into()),
            at(0),
        );
        assert_eq!(condition(&s, SYNCED).reason, "InvalidSpec");
        assert!(rejected_this_generation(Some(&s), Some(2)));
        assert!(!rejected_this_generation(Some(&s), Some(3)));
        let ok = next_status(Some(&s), Some(3), Some("id"), &Outcome::Synced, at(1));
        assert!(!rejected_this_generation(Some(&ok), Some(3)));
    }

    #[test]
    fn paused_keeps_ready_and_says_why_in_synced() {
        let ok = next_status(None, Some(1), Some("id-1"), &Outcome::Synced, at(0));
        let paused = next_status(Some(&ok), Some(2), None, &Outcome::Paused, at(5));
        assert_eq!(condition(&paused, READY).status, "True");
        let synced = condition(&paused, SYNCED);
        assert_eq!(
            (synced.status.as_str(), synced.reason.as_str()),
            ("False", "ReconcilePaused")
        );
        assert!(synced.message.contains(PAUSED_ANNOTATION));
        assert_eq!(
            paused.observed_generation,
            Some(1),
            "paused observes nothing new"
        );

        let fresh = next_status(None, Some(1), None, &Outcome::Paused, at(0));
        assert_eq!(condition(&fresh, READY).status, "Unknown");
    }
}
