//! Computes the Pet's next `.status` from the outcome of a reconcile. Pure, so
//! the condition rules (and "write nothing when nothing changed") are tested
//! without an API server.

use chrono::{DateTime, Utc};

use crate::crd::{Condition, ConditionStatus, PetStatus, PlanStatus};

pub const READY: &str = "Ready";
pub const SYNCED: &str = "Synced";
/// kstatus, which Flux and `kubectl wait` follow: present (True) only
/// while the operator retries this generation after a failure. Between an
/// edit and the operator's first status write for it, `status.
/// observedGeneration` lags `metadata.generation`, which says the same.
pub const RECONCILING: &str = "Reconciling";
/// kstatus: present (True) only while the Pet will not progress without a
/// human ([`Reason::stalls`]).
pub const STALLED: &str = "Stalled";

/// Every reason the operator gives, in a condition, an Event or the
/// `reconcile_errors_total{reason}` metric: one type, so the three can
/// never disagree. The README lists them all.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// Ready=True: the store record matches the spec; on a PetStore or
    /// ClusterPetStore, the store answers.
    Available,
    /// Synced=True: the last reconciliation succeeded.
    ReconcileSuccess,
    /// Ready is not known yet (paused before the first reconcile).
    Pending,
    /// The paused annotation is "true"; nothing is reconciled.
    ReconcilePaused,
    /// An annotation has a value the operator does not know; it does
    /// whatever is safe (paused: touch nothing; deletion policy: never delete).
    InvalidAnnotation,
    /// The pet store cannot be reached; retried with backoff (a store
    /// object's: checked again every interval).
    StoreUnavailable,
    /// The store rejected the spec; fix the spec to retry. On a store
    /// object: no client can be made of its address and CA.
    InvalidSpec,
    /// The store lacks the extension RPCs (GetPets, SetIdempotencyKeys)
    /// that the operator needs.
    StoreLacksExtensions,
    /// The record named for adoption belongs to someone else.
    RecordOwnedElsewhere,
    /// The record named for adoption does not exist.
    RecordNotFound,
    /// The Pet already owns a record other than the one named for adoption.
    AdoptionConflict,
    /// Another error; retried with backoff.
    ReconcileError,
    /// changePolicy is Approve: a plan waits for its approval (status.plan).
    PlanPending,
    /// changePolicy is Observe: the record differs from the spec, and is
    /// left as it is (status.plan shows what differs).
    RecordDiffers,
    /// Many of the store's records drifted at once (a restore, a store come
    /// back empty): drift is not written back until its plan is approved.
    DriftStorm,
    /// Event: the approve-plan annotation names a plan that is no longer
    /// the pending one (the spec or the record changed); nothing written.
    ApprovalStale,
    /// Event: a record was created for the Pet.
    Created,
    /// Event: the record was changed to match the spec.
    Updated,
    /// Event: the Pet took a record as its own (found by UID, or named for
    /// adoption).
    Adopted,
    /// Event: the record named by status.id had vanished; a new one was made.
    Recreated,
    /// Event: status.id named a record that is not this Pet's; corrected.
    StatusIdCorrected,
    /// Event: the record was deleted with the Pet.
    Deleted,
    /// Event: the Pet was deleted and its record kept and released.
    Orphaned,
    /// The hand-over-to annotation handed the record to another
    /// installation; this Pet no longer writes it (Event and Synced).
    HandedOver,
    /// The store the Pet names (or its namespace's default) does not
    /// exist; nothing is written until it does.
    StoreNotFound,
    /// The store exists but does not serve the Pet's namespace (a
    /// ClusterPetStore whose allowedNamespaces leaves it out).
    StoreNotAllowed,
    /// The store's TLS trust (its CA Secret or ConfigMap) is missing or
    /// unreadable.
    StoreTrustMissing,
    /// The store refused the Pet's identity or the record (no token could
    /// be minted, the store does not trust it, or the record is another
    /// tenant's); retried with backoff.
    StoreAccessDenied,
}

impl Reason {
    /// The CamelCase word used in conditions and Events.
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::Available => "Available",
            Reason::ReconcileSuccess => "ReconcileSuccess",
            Reason::Pending => "Pending",
            Reason::ReconcilePaused => "ReconcilePaused",
            Reason::InvalidAnnotation => "InvalidAnnotation",
            Reason::StoreUnavailable => "StoreUnavailable",
            Reason::InvalidSpec => "InvalidSpec",
            Reason::StoreLacksExtensions => "StoreLacksExtensions",
            Reason::RecordOwnedElsewhere => "RecordOwnedElsewhere",
            Reason::RecordNotFound => "RecordNotFound",
            Reason::AdoptionConflict => "AdoptionConflict",
            Reason::ReconcileError => "ReconcileError",
            Reason::PlanPending => "PlanPending",
            Reason::RecordDiffers => "RecordDiffers",
            Reason::DriftStorm => "DriftStorm",
            Reason::ApprovalStale => "ApprovalStale",
            Reason::Created => "Created",
            Reason::Updated => "Updated",
            Reason::Adopted => "Adopted",
            Reason::Recreated => "Recreated",
            Reason::StatusIdCorrected => "StatusIdCorrected",
            Reason::Deleted => "Deleted",
            Reason::Orphaned => "Orphaned",
            Reason::HandedOver => "HandedOver",
            Reason::StoreNotFound => "StoreNotFound",
            Reason::StoreNotAllowed => "StoreNotAllowed",
            Reason::StoreTrustMissing => "StoreTrustMissing",
            Reason::StoreAccessDenied => "StoreAccessDenied",
        }
    }

    /// The snake_case label of the errors metric.
    pub const fn metric_label(self) -> &'static str {
        match self {
            Reason::Available => "available",
            Reason::ReconcileSuccess => "reconcile_success",
            Reason::Pending => "pending",
            Reason::ReconcilePaused => "reconcile_paused",
            Reason::InvalidAnnotation => "invalid_annotation",
            Reason::StoreUnavailable => "store_unavailable",
            Reason::InvalidSpec => "invalid_spec",
            Reason::StoreLacksExtensions => "store_lacks_extensions",
            Reason::RecordOwnedElsewhere => "record_owned_elsewhere",
            Reason::RecordNotFound => "record_not_found",
            Reason::AdoptionConflict => "adoption_conflict",
            Reason::ReconcileError => "reconcile_error",
            Reason::PlanPending => "plan_pending",
            Reason::RecordDiffers => "record_differs",
            Reason::DriftStorm => "drift_storm",
            Reason::ApprovalStale => "approval_stale",
            Reason::Created => "created",
            Reason::Updated => "updated",
            Reason::Adopted => "adopted",
            Reason::Recreated => "recreated",
            Reason::StatusIdCorrected => "status_id_corrected",
            Reason::Deleted => "deleted",
            Reason::Orphaned => "orphaned",
            Reason::HandedOver => "handed_over",
            Reason::StoreNotFound => "store_not_found",
            Reason::StoreNotAllowed => "store_not_allowed",
            Reason::StoreTrustMissing => "store_trust_missing",
            Reason::StoreAccessDenied => "store_access_denied",
        }
    }

    /// As the Synced reason: nothing changes until a person does something
    /// (edits the spec or an annotation, frees or creates the record, points
    /// the operator at another store). kstatus reads it as Failed.
    pub const fn stalls(self) -> bool {
        matches!(
            self,
            Reason::InvalidSpec
                | Reason::InvalidAnnotation
                | Reason::RecordOwnedElsewhere
                | Reason::RecordNotFound
                | Reason::AdoptionConflict
                | Reason::StoreLacksExtensions
                | Reason::HandedOver
                | Reason::DriftStorm
                | Reason::StoreNotFound
                | Reason::StoreNotAllowed
                | Reason::StoreTrustMissing
        )
    }

    /// As the Synced reason: the operator is retrying by itself.
    pub const fn retries(self) -> bool {
        matches!(
            self,
            Reason::StoreUnavailable | Reason::ReconcileError | Reason::StoreAccessDenied
        )
    }

    /// Whether an Event with this reason is a Warning.
    pub const fn is_warning(self) -> bool {
        !matches!(
            self,
            Reason::Available
                | Reason::ReconcileSuccess
                | Reason::Pending
                | Reason::ReconcilePaused
                | Reason::PlanPending
                | Reason::RecordDiffers
                | Reason::Created
                | Reason::Updated
                | Reason::Adopted
                | Reason::Deleted
                | Reason::Orphaned
                | Reason::HandedOver
        )
    }
}

/// How a reconcile ended, as far as the user should know: the conditions to
/// show and one message for both.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// Ready's status and reason; `None` leaves Ready as it is (the record
    /// was not looked at).
    ready: Option<(bool, Reason)>,
    synced: (bool, Reason),
    pub message: String,
}

impl Outcome {
    /// The record matches the spec.
    pub fn synced() -> Self {
        Self::synced_noting(
            Reason::ReconcileSuccess,
            "the store record matches the spec".into(),
        )
    }

    /// The record matches the spec, and Synced tells what just happened
    /// (such as a corrected status.id) until the next reconcile.
    pub fn synced_noting(reason: Reason, message: String) -> Self {
        Self {
            ready: Some((true, Reason::Available)),
            synced: (true, reason),
            message,
        }
    }

    /// The record matches the spec, but something needs the user's
    /// attention (Synced=False with `reason`).
    pub fn synced_but(reason: Reason, message: String) -> Self {
        Self {
            ready: Some((true, Reason::Available)),
            synced: (false, reason),
            message,
        }
    }

    /// The record could not be brought in line: Ready and Synced False.
    pub fn failed(reason: Reason, message: String) -> Self {
        Self {
            ready: Some((false, reason)),
            synced: (false, reason),
            message,
        }
    }

    /// Hands off (paused, or an annotation that must be fixed first): Ready
    /// keeps its value and the generation is not marked observed.
    pub fn held(reason: Reason, message: String) -> Self {
        Self {
            ready: None,
            synced: (false, reason),
            message,
        }
    }

    /// A failure from the store or the API server, by its reason.
    pub fn from_error(reason: Reason, error: &str) -> Self {
        let message = match reason {
            Reason::StoreUnavailable => {
                format!("cannot reach the pet store, retrying with backoff: {error}")
            }
            Reason::InvalidSpec => {
                format!("the pet store rejected this spec; edit the Pet to retry: {error}")
            }
            Reason::StoreLacksExtensions => error.to_owned(),
            _ => format!("retrying with backoff: {error}"),
        };
        Self::failed(reason, message)
    }

    /// The reason this outcome gives the Synced condition.
    pub fn synced_reason(&self) -> Reason {
        self.synced.1
    }

    fn observes_generation(&self) -> bool {
        self.ready.is_some()
    }
}

/// Sets a condition that kstatus reads as abnormal when True, or removes
/// it: present only while it holds, as kstatus recommends.
#[allow(clippy::too_many_arguments)]
fn set_abnormal(
    conditions: &mut Vec<Condition>,
    type_: &str,
    holds: bool,
    reason: Reason,
    message: &str,
    generation: Option<i64>,
    now: DateTime<Utc>,
) {
    if holds {
        let status = ConditionStatus::True;
        set_condition(
            conditions,
            type_,
            status,
            reason.as_str(),
            message,
            generation,
            now,
        );
    } else {
        conditions.retain(|c| c.type_ != type_);
    }
}

fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: ConditionStatus,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: DateTime<Utc>,
) {
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(existing) => {
            if existing.status != status {
                existing.last_transition_time = now;
                existing.status = status;
            }
            existing.reason = reason.to_owned();
            existing.message = message.to_owned();
            existing.observed_generation = generation;
        }
        None => conditions.push(Condition {
            type_: type_.to_owned(),
            status,
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
    match outcome.ready {
        Some((ready, reason)) => set_condition(
            &mut status.conditions,
            READY,
            ready.into(),
            reason.as_str(),
            &outcome.message,
            generation,
            now,
        ),
        None if !status.conditions.iter().any(|c| c.type_ == READY) => set_condition(
            &mut status.conditions,
            READY,
            ConditionStatus::Unknown,
            Reason::Pending.as_str(),
            "not reconciled yet",
            generation,
            now,
        ),
        None => {}
    }
    let (synced, synced_reason) = outcome.synced;
    set_condition(
        &mut status.conditions,
        SYNCED,
        synced.into(),
        synced_reason.as_str(),
        &outcome.message,
        generation,
        now,
    );
    let stalled = !synced && synced_reason.stalls();
    let retrying = !synced && synced_reason.retries();
    let message = &outcome.message;
    let conditions = &mut status.conditions;
    set_abnormal(
        conditions,
        STALLED,
        stalled,
        synced_reason,
        message,
        generation,
        now,
    );
    set_abnormal(
        conditions,
        RECONCILING,
        retrying,
        synced_reason,
        message,
        generation,
        now,
    );
    // Keep a stable order so equal statuses compare equal.
    status.conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
    // A stalled generation is observed: kstatus reads Stalled only for the
    // generation status.observedGeneration names.
    if outcome.observes_generation() || stalled {
        status.observed_generation = generation;
    }
    status
}

/// What a status write does to `status.plan` and `status.appliedPlan`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlanUpdate {
    /// Leave both as they are (a failure: the plan shown still waits).
    Keep,
    /// Show this plan: nothing was written.
    Show(PlanStatus),
    /// The store is in line: no plan waits. `applied` is the approval just
    /// used up, if any.
    Clear { applied: Option<String> },
}

impl PlanUpdate {
    /// `now` starts `status.planPendingSince` when the Pet begins showing
    /// a plan; a Pet that already shows one keeps its start.
    pub fn apply_to(&self, status: &mut PetStatus, now: DateTime<Utc>) {
        match self {
            PlanUpdate::Keep => {}
            PlanUpdate::Show(plan) => {
                status.plan = Some(plan.clone());
                status.plan_pending_since.get_or_insert(now);
            }
            PlanUpdate::Clear { applied } => {
                status.plan = None;
                status.plan_pending_since = None;
                if applied.is_some() {
                    status.applied_plan.clone_from(applied);
                }
            }
        }
    }
}

/// True when the Pet already shows a terminal rejection of this generation:
/// retrying the store cannot help until the spec changes.
pub fn rejected_this_generation(status: Option<&PetStatus>, generation: Option<i64>) -> bool {
    status.is_some_and(|s| {
        s.conditions.iter().any(|c| {
            c.type_ == SYNCED
                && c.reason == Reason::InvalidSpec.as_str()
                && c.observed_generation == generation
        })
    })
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;
    use crate::crd::PAUSED_ANNOTATION;

    fn at(seconds: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_700_000_000 + seconds, 0)
            .single()
            .expect("valid time")
    }

    /// The status after a first successful reconcile of generation 1.
    fn synced_at(seconds: i64) -> PetStatus {
        next_status(None, Some(1), Some("id-1"), &Outcome::synced(), at(seconds))
    }

    /// `previous` after a reconcile of generation 1 that failed this way.
    fn failed_at(previous: &PetStatus, reason: Reason, message: &str, seconds: i64) -> PetStatus {
        next_status(
            Some(previous),
            Some(1),
            None,
            &Outcome::from_error(reason, message),
            at(seconds),
        )
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
        let s = next_status(None, Some(3), Some("id-1"), &Outcome::synced(), at(0));
        assert_eq!(s.id.as_deref(), Some("id-1"));
        assert_eq!(s.observed_generation, Some(3));
        let ready = condition(&s, READY);
        assert_eq!(
            (ready.status, ready.reason.as_str()),
            (ConditionStatus::True, "Available")
        );
        assert_eq!(ready.observed_generation, Some(3));
        assert_eq!(condition(&s, SYNCED).reason, "ReconcileSuccess");
    }

    #[test]
    fn unchanged_outcome_gives_an_identical_status() {
        let first = synced_at(0);
        let again = next_status(
            Some(&first),
            Some(1),
            Some("id-1"),
            &Outcome::synced(),
            at(60),
        );
        assert_eq!(first, again, "no API write in steady state");
    }

    #[test]
    fn transition_time_moves_only_when_status_flips() {
        let ok = synced_at(0);
        let down = failed_at(&ok, Reason::StoreUnavailable, "connection refused", 10);
        let ready = condition(&down, READY);
        assert_eq!(ready.status, ConditionStatus::False);
        assert_eq!(ready.reason, "StoreUnavailable");
        assert!(ready.message.contains("connection refused"));
        assert_eq!(ready.last_transition_time, at(10));
        assert_eq!(down.id.as_deref(), Some("id-1"), "the ID is kept");

        let still_down = failed_at(&down, Reason::ReconcileError, "boom", 20);
        assert_eq!(condition(&still_down, READY).last_transition_time, at(10));
        assert_eq!(condition(&still_down, READY).reason, "ReconcileError");
    }

    #[test]
    fn invalid_spec_is_terminal_for_its_generation_only() {
        let s = next_status(
            None,
            Some(2),
            None,
            &Outcome::from_error(Reason::InvalidSpec, "pets[0].name: too long"),
            at(0),
        );
        assert_eq!(condition(&s, SYNCED).reason, "InvalidSpec");
        assert!(rejected_this_generation(Some(&s), Some(2)));
        assert!(!rejected_this_generation(Some(&s), Some(3)));
        let ok = next_status(Some(&s), Some(3), Some("id"), &Outcome::synced(), at(1));
        assert!(!rejected_this_generation(Some(&ok), Some(3)));
    }

    fn paused_outcome() -> Outcome {
        Outcome::held(
            Reason::ReconcilePaused,
            format!("reconciliation is paused by the annotation {PAUSED_ANNOTATION}=\"true\""),
        )
    }

    #[test]
    fn every_reason_has_one_word_and_one_label() {
        use std::collections::HashSet;
        let all = [
            Reason::Available,
            Reason::ReconcileSuccess,
            Reason::Pending,
            Reason::ReconcilePaused,
            Reason::InvalidAnnotation,
            Reason::StoreUnavailable,
            Reason::InvalidSpec,
            Reason::StoreLacksExtensions,
            Reason::RecordOwnedElsewhere,
            Reason::RecordNotFound,
            Reason::AdoptionConflict,
            Reason::ReconcileError,
            Reason::Created,
            Reason::Updated,
            Reason::Adopted,
            Reason::Recreated,
            Reason::StatusIdCorrected,
            Reason::Deleted,
            Reason::Orphaned,
            Reason::HandedOver,
        ];
        let words: HashSet<_> = all.iter().map(|r| r.as_str()).collect();
        let labels: HashSet<_> = all.iter().map(|r| r.metric_label()).collect();
        assert_eq!(words.len(), all.len());
        assert_eq!(labels.len(), all.len());
        for reason in all {
            // The label is the word in snake_case: the two cannot drift apart.
            let snake: String = reason
                .as_str()
                .chars()
                .enumerate()
                .flat_map(|(i, c)| {
                    let sep = (i > 0 && c.is_ascii_uppercase()).then_some('_');
                    sep.into_iter()
                        .chain(std::iter::once(c.to_ascii_lowercase()))
                })
                .collect();
            assert_eq!(reason.metric_label(), snake);
        }
        assert!(Reason::StoreLacksExtensions.is_warning());
        assert!(!Reason::Orphaned.is_warning());
    }

    #[test]
    fn paused_keeps_ready_and_says_why_in_synced() {
        let ok = synced_at(0);
        let paused = next_status(Some(&ok), Some(2), None, &paused_outcome(), at(5));
        assert_eq!(condition(&paused, READY).status, ConditionStatus::True);
        let synced = condition(&paused, SYNCED);
        assert_eq!(
            (synced.status, synced.reason.as_str()),
            (ConditionStatus::False, "ReconcilePaused")
        );
        assert!(synced.message.contains(PAUSED_ANNOTATION));
        assert_eq!(
            paused.observed_generation,
            Some(1),
            "paused observes nothing new"
        );

        let fresh = next_status(None, Some(1), None, &paused_outcome(), at(0));
        assert_eq!(condition(&fresh, READY).status, ConditionStatus::Unknown);
    }

    /// A kstatus condition: type, reason, observedGeneration.
    type Abnormal<'a> = (&'a str, &'a str, Option<i64>);

    fn abnormal(status: &PetStatus) -> Vec<Abnormal<'_>> {
        status
            .conditions
            .iter()
            .filter(|c| c.type_ == STALLED || c.type_ == RECONCILING)
            .map(|c| (c.type_.as_str(), c.reason.as_str(), c.observed_generation))
            .collect()
    }

    #[test]
    fn kstatus_conditions_say_retrying_or_stalled_for_this_generation_only_while_true() {
        let ready = synced_at(0);
        assert_eq!(abnormal(&ready), vec![]);
        let edited = |outcome: &Outcome| next_status(Some(&ready), Some(2), None, outcome, at(1));
        let cases: Vec<(&str, Outcome, Vec<Abnormal>)> = vec![
            (
                "store down: retrying",
                Outcome::from_error(Reason::StoreUnavailable, "refused"),
                vec![(RECONCILING, "StoreUnavailable", Some(2))],
            ),
            (
                "another error: retrying",
                Outcome::from_error(Reason::ReconcileError, "conflict"),
                vec![(RECONCILING, "ReconcileError", Some(2))],
            ),
            (
                "rejected spec: stalled",
                Outcome::from_error(Reason::InvalidSpec, "name too long"),
                vec![(STALLED, "InvalidSpec", Some(2))],
            ),
            (
                "owned elsewhere: stalled",
                Outcome::failed(Reason::RecordOwnedElsewhere, "owned".into()),
                vec![(STALLED, "RecordOwnedElsewhere", Some(2))],
            ),
            (
                "a held typo: stalled",
                Outcome::held(Reason::InvalidAnnotation, "typo".into()),
                vec![(STALLED, "InvalidAnnotation", Some(2))],
            ),
            (
                "in line with a typo to fix: stalled",
                Outcome::synced_but(Reason::InvalidAnnotation, "typo".into()),
                vec![(STALLED, "InvalidAnnotation", Some(2))],
            ),
            ("paused: neither", paused_outcome(), vec![]),
            (
                "a plan waiting: neither",
                Outcome::failed(Reason::PlanPending, "approve".into()),
                vec![],
            ),
            ("in line again: neither", Outcome::synced(), vec![]),
        ];
        for (name, outcome, expected) in cases {
            let status = edited(&outcome);
            assert_eq!(abnormal(&status), expected, "{name}");
            // kstatus compares status.observedGeneration first: Stalled
            // counts only for the generation it names.
            if !expected.is_empty() {
                assert_eq!(status.observed_generation, Some(2), "{name}");
            }
        }
        // Once the cause goes, the condition goes with it.
        let down = edited(&Outcome::from_error(Reason::StoreUnavailable, "refused"));
        let back = next_status(Some(&down), Some(2), None, &Outcome::synced(), at(2));
        assert_eq!(abnormal(&back), vec![]);
        // Paused: the generation is not observed, so kstatus waits.
        assert_eq!(edited(&paused_outcome()).observed_generation, Some(1));
    }

    #[test]
    fn condition_status_is_written_as_the_kubernetes_word() {
        let s = next_status(None, Some(1), None, &paused_outcome(), at(0));
        let json = serde_json::to_value(&s).expect("json");
        let words: Vec<&str> = json["conditions"]
            .as_array()
            .expect("conditions")
            .iter()
            .filter_map(|c| c["status"].as_str())
            .collect();
        assert_eq!(words, ["Unknown", "False"]);
        let read = |word: &str| -> ConditionStatus {
            serde_json::from_value(serde_json::json!(word)).expect("a status")
        };
        assert_eq!(read("True"), ConditionStatus::True);
        assert_eq!(read("False"), ConditionStatus::False);
        // Written by someone else: read, not refused.
        assert_eq!(read("Maybe"), ConditionStatus::Unknown);
        assert!(ConditionStatus::True == "True");
    }
}
