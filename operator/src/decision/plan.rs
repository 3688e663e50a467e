//! The vocabulary of the decision step: the steps and decisions it returns,
//! and the stories that say what a plan did and why.

use std::time::Duration;

use super::{Facts, Uninstall};
use crate::status::Outcome;
use crate::store::{Lookup, Operation, Owner};

/// When to look at the Pet again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Only when the Pet changes.
    AwaitChange,
    /// At the next drift poll.
    Poll,
    /// After this long.
    After(Duration),
    /// With backoff, counted as a failure.
    Retry,
}

/// What to do before reading the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing to do and nothing to write.
    Wait(Next),
    /// Touch nothing in the store; show `outcome` in the conditions.
    Hold { outcome: Outcome, next: Next },
    /// Persist the finalizer, then take the first step again.
    AddFinalizer,
    /// Read the store: the record with ID `id` (if any) and the record keyed
    /// by the Pet's UID, then [`decide`](super::decide).
    Observe { id: Option<String> },
    /// No ID is known: create a record keyed by the Pet's UID without reading
    /// first, then [`after_create`](super::after_create). The create is
    /// idempotent by that key, and it says whether the key already named a
    /// record.
    Create,
}

/// What reading the store found.
// One per reconcile, moved straight into `decide`: boxing the three records
// would add an allocation and save nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Observation {
    Found(Lookup),
    /// The store does not offer the extension RPC behind this operation
    /// (the original store).
    StoreLacks {
        missing: Operation,
    },
}

impl Observation {
    /// The records read; none when the store lacks the read.
    pub fn lookup(&self) -> Lookup {
        match self {
            Observation::Found(lookup) => lookup.clone(),
            Observation::StoreLacks { .. } => Lookup::default(),
        }
    }
}

/// What to do with the store: the decision a [`Plan`](super::Plan) is
/// made of, and what follows its writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Touch nothing in the store; show `outcome` in the conditions.
    Hold { outcome: Outcome, next: Next },
    /// Bring the record in line, then record its ID in status.
    Sync(Sync),
    /// Deletion: these store changes, then release the finalizer.
    Finish(Finish),
    /// Hand the record (if the Pet still owns one) over to another
    /// installation, then hold: this Pet writes it no more.
    HandOver(HandOver),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HandOver {
    /// The Pet's record, released to `to` by compare-and-set.
    pub release: Option<String>,
    pub to: String,
}

impl HandOver {
    pub fn story(&self) -> Story {
        Story::HandedOver {
            id: self.release.clone(),
            to: self.to.clone(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sync {
    pub target: Target,
    /// Take ownership first: set the record's key from this owner (nobody;
    /// the Pet itself when only the identity is missing) to the Pet's, and
    /// its identity to the Pet's, by compare-and-set.
    pub claim: Option<Owner>,
    /// Write the spec to the record.
    pub update: bool,
    pub story: Story,
    /// A problem to show in Synced although the record is in line.
    pub warning: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// This record, which is (or is being claimed as, or was just created
    /// by [`Step::Create`] as) this Pet's.
    Existing(String),
    /// A new record keyed by the Pet's UID.
    Create,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finish {
    /// Orphan: clear this record's key (UID -> empty) so it can be adopted.
    pub release: Option<String>,
    /// Release it to this installation instead (a handover).
    pub hand_to: Option<String>,
    pub delete: Option<String>,
    pub story: Story,
}

/// What happened, for the Event and (sometimes) the conditions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Story {
    InSync,
    Updated,
    Created,
    /// status.id named a record that no longer exists, and the Pet had no
    /// other: a new one was created.
    Recreated {
        lost: String,
    },
    /// status.id was empty; the record created under the UID was found.
    FoundByKey,
    /// The record named by the external-id annotation is now this Pet's.
    Adopted,
    /// The record an earlier Pet of this namespace and name kept on its
    /// deletion (Orphan, or an uninstall) is this Pet's again.
    Reclaimed,
    /// The record belonged to a Pet of this namespace and name in this
    /// installation with another UID (`from`): the cluster was rebuilt or
    /// restored, and that Pet is gone. Or it was handed over to this
    /// installation (`from` is the handover).
    TakenOver {
        from: Owner,
    },
    /// This Pet had handed its record over to the installation `to`, and
    /// took it back before a Pet there took it.
    HandOverCancelled {
        to: String,
    },
    /// status.id named a record that is not this Pet's (`foreign`) or that
    /// does not exist; the Pet's own record was found by UID or created.
    Corrected {
        stale: String,
        foreign: bool,
        created: bool,
    },
    Deleted {
        id: Option<String>,
    },
    /// Orphan: `id` was kept and released (its key cleared).
    Orphaned {
        id: Option<String>,
    },
    /// `changePolicy: Observe`: the Pet went and its record (if any) was
    /// left exactly as it was.
    LeftAlone {
        id: Option<String>,
    },
    /// Orphan on a store without keys: nothing to release.
    OrphanedUnkeyed {
        status_id: Option<String>,
        missing: Operation,
    },
    /// Delete, but the installation is going away: `id` was kept and
    /// released, as an Orphan's is.
    KeptOnUninstall {
        id: Option<String>,
        why: Uninstall,
    },
    /// The hand-over-to annotation: `id` was released to the installation
    /// `to`.
    HandedOver {
        id: Option<String>,
        to: String,
    },
}

/// Why the store was written: the `cause` label of `store_actions_total`,
/// the change log's `cause` and the start of a drift Event's note.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Cause {
    /// The Pet's first record.
    NewPet,
    /// The Pet's spec was edited.
    SpecChange,
    /// The record (or status.id) was changed outside the operator.
    Drift,
    /// An existing record became the Pet's.
    Adoption,
    /// The Pet is being deleted.
    Deletion,
    /// The record goes to another installation (hand-over-to).
    HandOver,
}

impl Cause {
    pub const fn as_str(self) -> &'static str {
        match self {
            Cause::NewPet => "new_pet",
            Cause::SpecChange => "spec_change",
            Cause::Drift => "drift",
            Cause::Adoption => "adoption",
            Cause::Deletion => "deletion",
            Cause::HandOver => "handover",
        }
    }
}

impl Story {
    /// Why the story's writes were made.
    pub fn cause(&self, facts: &Facts) -> Cause {
        match self {
            Story::Created | Story::FoundByKey => Cause::NewPet,
            Story::Adopted | Story::Reclaimed | Story::TakenOver { .. } => Cause::Adoption,
            Story::Recreated { .. } | Story::Corrected { .. } => Cause::Drift,
            // In line, the only write is giving the record its identity.
            Story::InSync => Cause::Adoption,
            Story::Updated if facts.spec_changed => Cause::SpecChange,
            Story::Updated => Cause::Drift,
            Story::Deleted { .. }
            | Story::Orphaned { .. }
            | Story::OrphanedUnkeyed { .. }
            | Story::KeptOnUninstall { .. }
            | Story::LeftAlone { .. } => Cause::Deletion,
            Story::HandedOver { .. } | Story::HandOverCancelled { .. } => Cause::HandOver,
        }
    }

    /// The Event's action. kube's recorder folds Events with the same reason
    /// and action into one series that keeps the first note, so stories
    /// that say different things get different actions: a repeated Event
    /// never shows a note about something else.
    pub fn action(&self) -> &'static str {
        match self {
            Story::InSync => "Observe",
            Story::Updated => "Update",
            Story::Created => "Create",
            Story::Recreated { .. } => "Recreate",
            Story::FoundByKey => "AdoptByUid",
            Story::Adopted => "AdoptNamedRecord",
            Story::Reclaimed => "ReclaimKeptRecord",
            Story::TakenOver { .. } => "TakeOverFromLostPet",
            Story::Corrected { foreign: true, .. } => "IgnoreForeignRecord",
            Story::Corrected { foreign: false, .. } => "ReplaceUnknownId",
            Story::Deleted { .. } => "Delete",
            Story::Orphaned { .. } | Story::OrphanedUnkeyed { .. } => "Orphan",
            Story::LeftAlone { .. } => "LeaveAlone",
            Story::KeptOnUninstall { .. } => "KeepOnUninstall",
            Story::HandedOver { .. } => "HandOver",
            Story::HandOverCancelled { .. } => "CancelHandOver",
        }
    }
}

/// Why the store is not touched: each hold with the data its message
/// needs. [`Hold::outcome`] tells it; the rules only choose it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hold {
    /// The paused annotation is "true".
    Paused,
    /// An annotation's value is misspelled.
    Misspelled {
        annotation: String,
        value: String,
        setting: Misspelled,
    },
    /// The store does not offer an extension RPC this operator needs.
    StoreLacksExtensions { missing: Operation, deleting: bool },
    /// The external-id annotation names `external`, but another record,
    /// `holder` (owned by `key`), carries the Pet's identity. With
    /// `takeable`, the Pet could take that one without the annotation.
    NameHeldByAnother {
        external: String,
        holder: String,
        key: Owner,
        identity: String,
        takeable: bool,
    },
    /// The external-id annotation names `external`, but the Pet already
    /// owns record `mine` under `key`.
    OwnsAnother {
        external: String,
        mine: String,
        key: Owner,
    },
    /// The external-id annotation names a record that does not exist.
    RecordNotFound { external: String },
    /// The record `id` the external-id annotation names (`external`) is
    /// owned by `key`, which this Pet may not take.
    NamedRecordOwnedElsewhere {
        external: String,
        id: String,
        key: Owner,
    },
    /// Record `id` carries the Pet's identity but is owned by `key`, of
    /// `holder`, not this installation (`installation`).
    NameOwnedElsewhere {
        id: String,
        identity: String,
        key: Owner,
        holder: ForeignHolder,
        installation: String,
    },
}

/// Which annotation is misspelled: each has its own allowed values and
/// effect while misspelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Misspelled {
    Paused,
    HandOverTo,
    /// The deletion policy of a Pet being deleted.
    DeletionPolicy,
}

/// Who, not of this installation, holds a record carrying a Pet's identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ForeignHolder {
    /// A handover to the installation `to`.
    HandOver { to: String },
    /// A Pet of another installation.
    Installation(String),
    /// A key no operator writes.
    Unknown,
}

impl Hold {
    /// When to look again: a hold before the store read waits for the Pet
    /// to change; a store without the extensions is retried; the others
    /// are polled, as the store may change.
    pub fn next(&self) -> Next {
        match self {
            Hold::Paused | Hold::Misspelled { .. } => Next::AwaitChange,
            Hold::StoreLacksExtensions { .. } => Next::Retry,
            Hold::NameHeldByAnother { .. }
            | Hold::OwnsAnother { .. }
            | Hold::RecordNotFound { .. }
            | Hold::NamedRecordOwnedElsewhere { .. }
            | Hold::NameOwnedElsewhere { .. } => Next::Poll,
        }
    }

    pub fn step(&self) -> Step {
        Step::Hold {
            outcome: self.outcome(),
            next: self.next(),
        }
    }

    pub fn decision(&self) -> Decision {
        Decision::Hold {
            outcome: self.outcome(),
            next: self.next(),
        }
    }
}
