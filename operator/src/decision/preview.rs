//! A plan: the list of typed store writes [`plan`] makes from
//! [`decide`](super::decide)'s decision, with the decision itself. One
//! value is what `status.plan` shows a person and what the reconcile
//! executes, so a plan shown under `changePolicy: Approve` or `Observe` is
//! exactly what `Automatic` writes for the same Pet and record. [`gate`]
//! then decides, by the change policy and the approval, whether the list is
//! written now.

use super::{Cause, Decision, Facts, Story, Target};
use crate::crd::{APPROVE_PLAN_ANNOTATION, ChangePolicy, PlanStatus, PlannedAction, PlannedChange};
use crate::status::{Outcome, Reason};
use crate::store::{Changes, Field, FieldChange, Lookup, Owner, PetData, Record};

/// A write to the store: the `action` label of `store_actions_total`, the
/// change log's `action`, and a plan's `actions[].action`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StoreAction {
    Create,
    /// A create in place of a record that vanished from the store.
    Recreate,
    Update,
    /// Adoption: the record's key set to the Pet's (from empty, or from a
    /// lost Pet's of this installation), with the Pet's identity.
    Claim,
    /// Orphan: the record's key cleared.
    Release,
    Delete,
}

impl StoreAction {
    pub const fn label(self) -> &'static str {
        match self {
            StoreAction::Create => "create",
            StoreAction::Recreate => "recreate",
            StoreAction::Update => "update",
            StoreAction::Claim => "claim",
            StoreAction::Release => "release",
            StoreAction::Delete => "delete",
        }
    }

    /// For the change log: "store record created".
    pub const fn past_tense(self) -> &'static str {
        match self {
            StoreAction::Create => "created",
            StoreAction::Recreate => "recreated",
            StoreAction::Update => "updated",
            StoreAction::Claim => "claimed",
            StoreAction::Release => "released",
            StoreAction::Delete => "deleted",
        }
    }
}

/// One store write of a plan, carrying exactly what making it needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    /// A new record keyed by the Pet's UID, with these fields; `recreate`
    /// when it stands in for a record that vanished (its `changes` then say
    /// which, first).
    Create {
        changes: Changes,
        recreate: bool,
    },
    /// The spec written to `record`; `changes` are each field's value
    /// before and after.
    Update {
        record: String,
        changes: Changes,
    },
    /// Adoption: `record`'s key set from `expected` to `new` by
    /// compare-and-set, with `identity` (`None` leaves it).
    Claim {
        record: String,
        expected: Owner,
        new: Owner,
        identity: Option<String>,
        changes: Changes,
    },
    /// `record`'s key set from `from` to `to` (empty: nobody) by
    /// compare-and-set; the identity stays.
    Release {
        record: String,
        from: Owner,
        to: Owner,
    },
    Delete {
        record: String,
    },
}

impl Write {
    pub fn action(&self) -> StoreAction {
        match self {
            Write::Create {
                recreate: false, ..
            } => StoreAction::Create,
            Write::Create { recreate: true, .. } => StoreAction::Recreate,
            Write::Update { .. } => StoreAction::Update,
            Write::Claim { .. } => StoreAction::Claim,
            Write::Release { .. } => StoreAction::Release,
            Write::Delete { .. } => StoreAction::Delete,
        }
    }

    /// The record written; `None` for a create, whose ID the store mints.
    pub fn record(&self) -> Option<&str> {
        match self {
            Write::Create { .. } => None,
            Write::Update { record, .. }
            | Write::Claim { record, .. }
            | Write::Release { record, .. }
            | Write::Delete { record } => Some(record),
        }
    }

    /// Each field's value before and after, as the change log tells it.
    pub fn changes(&self) -> Changes {
        match self {
            Write::Create { changes, .. }
            | Write::Update { changes, .. }
            | Write::Claim { changes, .. } => changes.clone(),
            Write::Release { from, to, .. } => key_change(from, to),
            Write::Delete { record } => Changes(vec![FieldChange {
                field: Field::Record,
                from: record.clone(),
                to: "(none)".into(),
            }]),
        }
    }
}

/// A plan: the store writes [`decide`](super::decide)'s decision makes, in
/// the order they are made, what identifies them, and the decision itself
/// (what follows the writes). One value is shown as `status.plan` and
/// executed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub writes: Vec<Write>,
    /// Why the writes would be made; `None` when there are none.
    pub cause: Option<Cause>,
    /// The metadata.generation the plan was made for.
    pub generation: Option<i64>,
    /// Identifies these writes against this generation and the records as
    /// read: a change to the spec or to the record gives another hash.
    /// Empty when there are no writes: nothing to approve.
    pub hash: String,
    /// What the writes are for, and what follows them.
    pub decision: Decision,
}

/// The plan for `decision`; `observed` is the store as read for it.
pub fn plan(facts: &Facts, decision: Decision, observed: &Lookup) -> Plan {
    let key = facts.owner();
    // A handover's key names this Pet: one of its own, so that many wait at
    // once, and one this Pet may take back.
    let handover = |to: &str| Owner::handed_over(to, &facts.uid);
    let (writes, story) = match &decision {
        Decision::Hold { .. } => (Vec::new(), None),
        Decision::HandOver(hand_over) => {
            let writes = hand_over
                .release
                .iter()
                .map(|id| release(id, &key, &handover(&hand_over.to)))
                .collect();
            (writes, Some(hand_over.story()))
        }
        Decision::Sync(sync) => {
            let mut writes = Vec::new();
            match &sync.target {
                Target::Existing(id) => {
                    if let Some(expected) = &sync.claim {
                        // A store older than identities keeps none: give none.
                        let identity = observed.identities.then(|| facts.identity.clone());
                        let held = find(observed, id).map_or("", |r| r.identity.as_str());
                        let mut changes = Changes::default();
                        if *expected != key {
                            changes.0.extend(key_change(expected, &key).0);
                        }
                        if let Some(identity) = identity.as_ref().filter(|i| *i != held) {
                            changes.0.push(FieldChange {
                                field: Field::Identity,
                                from: format!("{held:?}"),
                                to: format!("{identity:?}"),
                            });
                        }
                        writes.push(Write::Claim {
                            record: id.clone(),
                            expected: expected.clone(),
                            new: key.clone(),
                            identity,
                            changes,
                        });
                    }
                    if sync.update {
                        let changes = match find(observed, id) {
                            Some(record) => record.data.changes_to(&facts.desired),
                            None => created_fields(&facts.desired),
                        };
                        writes.push(Write::Update {
                            record: id.clone(),
                            changes,
                        });
                    }
                }
                Target::Create => {
                    let mut changes = created_fields(&facts.desired);
                    let recreate = match &sync.story {
                        Story::Recreated { lost } => {
                            changes.0.insert(
                                0,
                                FieldChange {
                                    field: Field::Record,
                                    from: "(none)".into(),
                                    to: format!("{lost} recreated"),
                                },
                            );
                            true
                        }
                        _ => false,
                    };
                    writes.push(Write::Create { changes, recreate });
                }
            }
            (writes, Some(sync.story.clone()))
        }
        Decision::Finish(finish) => {
            let mut writes = Vec::new();
            if let Some(id) = &finish.release {
                let to = finish.hand_to.as_deref().map(handover).unwrap_or_default();
                writes.push(release(id, &key, &to));
            }
            if let Some(id) = &finish.delete {
                writes.push(Write::Delete { record: id.clone() });
            }
            (writes, Some(finish.story.clone()))
        }
    };
    let cause = story.filter(|_| !writes.is_empty()).map(|s| s.cause(facts));
    // Most reconciles find the record in line: they hash nothing.
    let hash = if writes.is_empty() {
        String::new()
    } else {
        plan_hash(facts, &writes, cause, observed)
    };
    Plan {
        writes,
        cause,
        generation: facts.generation,
        hash,
        decision,
    }
}

/// Releases record `id` from `key` to `to` (empty: to nobody; or a
/// handover's key). The identity stays: a later Pet of this name, here or
/// in the installation handed to, takes the record back.
fn release(id: &str, key: &Owner, to: &Owner) -> Write {
    Write::Release {
        record: id.to_owned(),
        from: key.clone(),
        to: to.clone(),
    }
}

fn find<'a>(observed: &'a Lookup, id: &str) -> Option<&'a Record> {
    observed.records().find(|record| record.id == id)
}

/// FNV-1a, 64 bits, over a canonical text of the plan: stable across
/// builds and platforms (std's hasher promises neither), so a hash shown
/// by one operator is approved against another, and short enough to type.
fn plan_hash(facts: &Facts, writes: &[Write], cause: Option<Cause>, observed: &Lookup) -> String {
    // The last plan applied is part of it: a plan that comes back after
    // an approval (the same writes against the same record) is a new one,
    // not the spent approval's.
    let mut text = format!(
        "generation={:?};uid={};cause={};after={};",
        facts.generation,
        facts.uid,
        cause.map_or("none", Cause::as_str),
        facts.applied_plan.as_deref().unwrap_or("")
    );
    for write in writes {
        text.push_str(&format!(
            "write={},{},{};",
            write.action().label(),
            write.record().unwrap_or(""),
            write.changes()
        ));
    }
    // By ID and key as before identities, so a hash shown by an older
    // operator still approves the same plan; the identity's record and an
    // identity are added only when there is one.
    let by_identity = observed.by_identity.iter().filter(|r| {
        ![&observed.by_id, &observed.by_key]
            .iter()
            .any(|o| o.as_ref() == Some(*r))
    });
    for record in [&observed.by_id, &observed.by_key]
        .into_iter()
        .flatten()
        .chain(by_identity)
    {
        let PetData {
            name,
            pet_type,
            birthday,
        } = &record.data;
        text.push_str(&format!(
            "record={},{:?},{name:?},{},{birthday};",
            record.id,
            record.key.to_string(),
            pet_type.as_str()
        ));
        if !record.identity.is_empty() {
            text.push_str(&format!("identity={:?};", record.identity));
        }
    }
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{hash:016x}")
}

impl Plan {
    /// Whether the plan writes nothing.
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }

    /// One line for `kubectl get pets`: `none`, `create`, `update
    /// name,type`, `claim, update name`, `release`, `delete`.
    pub fn summary(&self) -> String {
        if self.writes.is_empty() {
            return "none".into();
        }
        self.writes
            .iter()
            .map(|write| match write {
                Write::Update { changes, .. } => {
                    let fields: Vec<&str> = changes.fields().map(Field::as_str).collect();
                    format!("update {}", fields.join(","))
                }
                Write::Create { .. } => "create".into(),
                write => write.action().label().into(),
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Each write and its fields, for a condition or an Event.
    pub fn describe(&self) -> String {
        self.writes
            .iter()
            .map(|write| {
                let record = write
                    .record()
                    .map_or_else(|| "a new record".to_owned(), |id| format!("record {id}"));
                format!("{} {record} ({})", write.action().label(), write.changes())
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// As `status.plan` shows it.
    pub fn to_status(&self) -> PlanStatus {
        PlanStatus {
            actions: self
                .writes
                .iter()
                .map(|write| PlannedAction {
                    action: write.action().label().to_owned(),
                    record_id: write.record().map(str::to_owned),
                    changes: write
                        .changes()
                        .0
                        .into_iter()
                        .map(|change| PlannedChange {
                            field: change.field.as_str().to_owned(),
                            from: change.from,
                            to: change.to,
                        })
                        .collect(),
                })
                .collect(),
            hash: self.hash.clone(),
            summary: self.summary(),
            cause: self.cause.map_or("none", Cause::as_str).to_owned(),
            ..nothing_planned(self.generation)
        }
    }
}

/// `status.plan` when nothing is planned before the store is read (a
/// paused Pet, say): no writes, for this generation.
pub fn nothing_planned(generation: Option<i64>) -> PlanStatus {
    PlanStatus {
        hash: String::new(),
        summary: "none".into(),
        cause: "none".into(),
        generation,
        actions: Vec::new(),
    }
}

/// Whether a plan is written now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Gate {
    /// Write it; `approved` is the approval it uses up, if any.
    Apply { approved: Option<String> },
    /// Write nothing: show the plan and `outcome`. `stale` is an approval
    /// that names another plan than this one.
    Show {
        outcome: Outcome,
        stale: Option<String>,
    },
}

/// By the change policy: `Automatic` writes every plan; `Approve` writes a
/// plan whose hash the annotation names, once; `Observe` never writes. A
/// plan that writes nothing is always "applied" (the status is brought in
/// line).
///
/// In a drift storm ([`Facts::drift_brake`]) a plan caused by drift waits
/// for its approval as under `Approve`, whatever the policy.
pub fn gate(facts: &Facts, plan: &Plan) -> Gate {
    let used = |hash: &str| facts.applied_plan.as_deref() == Some(hash);
    if let Some(brake) = facts.drift_brake
        && plan.cause == Some(Cause::Drift)
        && !plan.is_empty()
        && facts.change_policy != ChangePolicy::Observe
    {
        return match facts.approved_plan.as_deref() {
            Some(hash) if hash == plan.hash && !used(hash) => Gate::Apply {
                approved: Some(hash.to_owned()),
            },
            approved => Gate::Show {
                outcome: Outcome::failed(
                    Reason::DriftStorm,
                    super::prose::drift_braked(brake, plan),
                ),
                stale: approved.filter(|hash| !used(hash)).map(str::to_owned),
            },
        };
    }
    if plan.is_empty() || facts.change_policy == ChangePolicy::Automatic {
        return Gate::Apply { approved: None };
    }
    let what = plan.describe();
    if facts.change_policy == ChangePolicy::Observe {
        return Gate::Show {
            outcome: Outcome::failed(
                Reason::RecordDiffers,
                format!(
                    "changePolicy is Observe, so nothing is written; bringing the store in line would {what}"
                ),
            ),
            stale: None,
        };
    }
    match facts.approved_plan.as_deref() {
        Some(hash) if hash == plan.hash && !used(hash) => Gate::Apply {
            approved: Some(hash.to_owned()),
        },
        approved => Gate::Show {
            outcome: Outcome::failed(
                Reason::PlanPending,
                format!(
                    "changePolicy is Approve: plan {} waits for approval: {what}. Approve it with the annotation {APPROVE_PLAN_ANNOTATION}={}",
                    plan.hash, plan.hash
                ),
            ),
            stale: approved.filter(|hash| !used(hash)).map(str::to_owned),
        },
    }
}

/// A new record's fields, each from nothing.
pub fn created_fields(data: &PetData) -> Changes {
    let new = |field, to: String| FieldChange {
        field,
        from: "(none)".into(),
        to,
    };
    Changes(vec![
        new(Field::Name, format!("{:?}", data.name)),
        new(Field::Type, data.pet_type.as_str().to_owned()),
        new(Field::Birthday, data.birthday.to_string()),
    ])
}

/// An ownership change: the record's idempotency key.
pub fn key_change(from: &Owner, to: &Owner) -> Changes {
    Changes(vec![FieldChange {
        field: Field::Key,
        from: format!("{:?}", from.to_string()),
        to: format!("{:?}", to.to_string()),
    }])
}

#[cfg(test)]
mod tests;
