//! The pure decision step: the whole reconcile policy, with no I/O. The
//! controller gathers [`Facts`] about a Pet, asks [`first_step`] whether the
//! store needs to be read at all, reads it if so, and asks [`decide`] for a
//! [`Plan`] (or, after a create that stood in for the read, asks
//! [`after_create`]); then it only executes the plan and records the outcome.
//!
//! A create has two shapes, for its two moments: [`Step::Create`] before
//! any read (the create is the read), and [`Target::Create`] in a plan made
//! after one.
//! Every branch is covered by the table tests below.
//!
//! Ownership: a record is this Pet's only if its idempotency key is the
//! Pet's key (its installation and UID, [`Facts::key`]). Creating sets that
//! key; adopting a record named by the external-id annotation sets it by
//! compare-and-set from empty, so a record owned by anyone else is never
//! taken, and of two Pets racing for one record exactly one wins. No plan
//! ever updates or deletes a record whose key is not the Pet's, whatever
//! `status.id` says.
//!
//! A record also carries its Pet's identity, `<namespace>/<name>`, which
//! outlives the UID. A Pet with no record under its key takes the record
//! holding its identity by the same compare-and-set: from empty (an Orphan
//! deletion left it), or from a key of this installation (the cluster was
//! rebuilt or restored: in one installation, namespace and name name one
//! live Pet, so that key's Pet is gone). A record of another installation
//! is never taken: the Pet is held, naming it.
//!
//! [`preview`] turns a plan into the store writes it makes, which a
//! reconcile either executes or, by the change policy, shows as
//! `status.plan` ([`preview::gate`]).
//!
//! [`feed`] judges what a change on the store's change feed means for its
//! Pet.

use std::time::Duration;

use crate::crd::{
    CONFIRM_DELETE_PETS_ANNOTATION, ChangePolicy, DELETION_POLICY_ANNOTATION, DeletionPolicy,
    EXTERNAL_ID_ANNOTATION, HAND_OVER_TO_ANNOTATION, PAUSED_ANNOTATION, Setting,
};
use crate::status::{Outcome, Reason};
use crate::store::{Changes, Created, Holder, Lookup, Operation, Owner, PetData, Record};

pub mod feed;
pub mod preview;

pub use preview::{Gate, Preview, StoreAction, Write, gate, preview};

/// What the controller knows about a Pet before any store call.
#[derive(Clone, Debug, PartialEq)]
pub struct Facts {
    pub uid: String,
    /// The operator's `--installation`; empty for the unnamed one.
    pub installation: String,
    /// `<namespace>/<name>`: the record's identity in the store.
    pub identity: String,
    pub desired: PetData,
    pub deleting: bool,
    pub has_finalizer: bool,
    pub paused: Setting<bool>,
    pub deletion_policy: Setting<DeletionPolicy>,
    /// The record ID named by the external-id annotation, for adoption.
    pub external_id: Option<String>,
    pub status_id: Option<String>,
    /// The Pet already shows that the store rejected this generation.
    pub rejected_this_generation: bool,
    /// The spec changed since the operator last handled the Pet (its
    /// status does not observe this generation): a difference in the
    /// record is the edit's, not drift.
    pub spec_changed: bool,
    /// This generation was synced a moment ago: the time left until its
    /// next poll.
    pub recently_synced: Option<Duration>,
    /// The store's create has been seen to say whether the key already named
    /// a record, so for a Pet with no known ID the create is the read.
    pub create_observes: bool,
    /// The Pet's metadata.generation, which a plan's hash names.
    pub generation: Option<i64>,
    pub change_policy: ChangePolicy,
    /// The plan hash the approve-plan annotation names.
    pub approved_plan: Option<String>,
    /// The hash of the approved plan last applied (status.appliedPlan).
    pub applied_plan: Option<String>,
    /// The Pet shows a plan (status.plan): it was read, and the plan may be
    /// other than a create (a record of its name to take back).
    pub plan_shown: bool,
    /// Looked up only for a Pet being deleted: the installation is going
    /// away, so its deletion keeps the record whatever the policy says.
    pub uninstalling: Option<Uninstall>,
    /// The installation the hand-over-to annotation names.
    pub hand_over_to: Option<Setting<String>>,
}

/// Why a deletion keeps and releases its record although the Pet's policy
/// is Delete: removing the operator is not asking for the records to go.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Uninstall {
    /// The Pet CRD is being deleted without the confirmation
    /// [`CONFIRM_DELETE_PETS_ANNOTATION`] (its guard was removed, or the
    /// deletion went around it).
    CrdDeleting,
    /// The operator's own namespace is being deleted.
    NamespaceDeleting,
}

impl Facts {
    /// The idempotency key that marks a record as this Pet's:
    /// `<installation>/<uid>`, or the bare UID in the unnamed installation
    /// (every key before installations).
    pub fn key(&self) -> String {
        self.owner().to_string()
    }

    /// The owner [`Facts::key`] names.
    pub fn owner(&self) -> Owner {
        Owner::pet(&self.installation, &self.uid)
    }

    /// Who holds a record with this owner, seen from this Pet.
    pub fn holder<'a>(&self, owner: &'a Owner) -> Holder<'a> {
        owner.holder(&self.installation, Some(&self.uid))
    }

    /// The other installation this Pet's record is being handed over to;
    /// naming its own installation cancels a handover not yet taken.
    pub fn handing_over(&self) -> Option<&str> {
        match &self.hand_over_to {
            Some(Setting::Valid(to)) if *to != self.installation => Some(to),
            _ => None,
        }
    }

    /// A deletion that would delete its record unless the installation is
    /// going away: only then is [`Facts::uninstalling`] worth reading.
    /// Observe never writes, so it never asks.
    pub fn deletion_would_delete_record(&self) -> bool {
        self.deleting
            && self.has_finalizer
            && self.deletion_policy == Setting::Valid(DeletionPolicy::Delete)
            && self.change_policy != ChangePolicy::Observe
    }

    /// What the user asked for: the spec, the deletion, and the
    /// annotations. A watch event that changes none of it (the echo of the
    /// operator's own status write) cannot cut a backoff short.
    pub fn intent(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::hash::DefaultHasher::new();
        (
            &self.desired,
            self.deleting,
            &self.paused,
            &self.deletion_policy,
            &self.external_id,
            self.change_policy,
            &self.approved_plan,
            &self.hand_over_to,
        )
            .hash(&mut hasher);
        hasher.finish()
    }
}

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
    /// by the Pet's UID, then [`decide`].
    Observe { id: Option<String> },
    /// No ID is known: create a record keyed by the Pet's UID without reading
    /// first, then [`after_create`]. The create is idempotent by that key,
    /// and it says whether the key already named a record.
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

/// The plan for the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
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

    /// What the conditions show once it is done: the Pet stalls until a
    /// person deletes it (its record stays) or takes the annotation off.
    pub fn outcome(&self, status_id: Option<&str>) -> Outcome {
        let record = self.release.as_deref().or(status_id).map_or_else(
            || "its store record".to_owned(),
            |id| format!("store record {id}"),
        );
        Outcome::failed(
            Reason::HandedOver,
            format!(
                "{record} is handed over to the installation {:?} (the annotation {HAND_OVER_TO_ANNOTATION}): a Pet there with this namespace and name takes it, and this Pet writes it no more. Delete this Pet (its record stays), or cancel before it is taken by setting the annotation to this installation's name",
                self.to
            ),
        )
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

    /// The Event to publish once the step is done; `id` is the record's ID
    /// (the new one after a create).
    pub fn notice(&self, id: Option<&str>) -> Option<(Reason, String)> {
        let id = id.unwrap_or("(none)");
        Some(match self {
            Story::InSync => return None,
            Story::Updated => (
                Reason::Updated,
                format!("updated store record {id} to match the spec"),
            ),
            Story::Created => (Reason::Created, format!("created store record {id}")),
            Story::Recreated { lost } => (
                Reason::Recreated,
                format!("store record {lost} was missing; created {id} in its place"),
            ),
            Story::FoundByKey => (
                Reason::Adopted,
                format!("found store record {id} by this Pet's UID and recorded its ID"),
            ),
            Story::Adopted => (
                Reason::Adopted,
                format!(
                    "took ownership of store record {id}, named by the annotation {EXTERNAL_ID_ANNOTATION}"
                ),
            ),
            Story::Reclaimed => (
                Reason::Adopted,
                format!(
                    "took back store record {id}, which an earlier Pet of this namespace and name kept when it was deleted"
                ),
            ),
            Story::TakenOver {
                from: from @ Owner::HandedOver { .. },
            } => (
                Reason::Adopted,
                format!(
                    "took over store record {id}, handed over to this installation (its key was {:?})",
                    from.to_string()
                ),
            ),
            Story::TakenOver { from } => (
                Reason::Adopted,
                format!(
                    "took over store record {id} from the Pet of this namespace and name that held it as {:?}, gone from this installation (the cluster was rebuilt or restored)",
                    from.to_string()
                ),
            ),
            Story::HandOverCancelled { to } => (
                Reason::Adopted,
                format!(
                    "took back store record {id}, which this Pet had handed over to the installation {to:?} and which no Pet there had taken yet: the handover is cancelled"
                ),
            ),
            Story::Corrected {
                stale,
                foreign,
                created,
            } => {
                let what = if *foreign {
                    "which belongs to another owner; left it untouched"
                } else {
                    "which does not exist"
                };
                let then = if *created {
                    format!("created {id} for this Pet")
                } else {
                    format!("recorded this Pet's own record {id}, found by its UID")
                };
                (
                    Reason::StatusIdCorrected,
                    format!("status.id named store record {stale}, {what}; {then}"),
                )
            }
            Story::Deleted { id: Some(id) } => {
                (Reason::Deleted, format!("deleted store record {id}"))
            }
            Story::Deleted { id: None } => (
                Reason::Deleted,
                "no store record belonged to this Pet; nothing to delete".into(),
            ),
            Story::Orphaned { id: Some(id) } => (
                Reason::Orphaned,
                format!(
                    "deletion policy is Orphan: kept store record {id} and released it; a new Pet can adopt it with the annotation {EXTERNAL_ID_ANNOTATION}: {id}"
                ),
            ),
            Story::Orphaned { id: None } => (
                Reason::Orphaned,
                "deletion policy is Orphan, and no store record belongs to this Pet any more; nothing to release".into(),
            ),
            Story::LeftAlone { id } => (
                Reason::Orphaned,
                format!(
                    "changePolicy is Observe: left store record {} exactly as it was",
                    id.as_deref().unwrap_or("(none)")
                ),
            ),
            Story::KeptOnUninstall { id, why } => {
                let because = match why {
                    Uninstall::CrdDeleting => format!(
                        "the Pet CRD is being deleted without the confirmation {CONFIRM_DELETE_PETS_ANNOTATION}"
                    ),
                    Uninstall::NamespaceDeleting => {
                        "the operator's namespace is being deleted".to_owned()
                    }
                };
                let kept = match id {
                    Some(id) => format!(
                        "kept store record {id} and released it instead of deleting it; a new Pet can adopt it with the annotation {EXTERNAL_ID_ANNOTATION}: {id}"
                    ),
                    None => "no store record belongs to this Pet; nothing to keep".to_owned(),
                };
                (Reason::Orphaned, format!("{because}: {kept}"))
            }
            Story::HandedOver { id: Some(id), to } => (
                Reason::HandedOver,
                format!(
                    "handed store record {id} over to the installation {to:?}: a Pet there with this namespace and name takes it; this Pet writes it no more"
                ),
            ),
            Story::HandedOver { id: None, to } => (
                Reason::HandedOver,
                format!(
                    "no store record belongs to this Pet any more; nothing to hand over to the installation {to:?}"
                ),
            ),
            Story::OrphanedUnkeyed { status_id, missing } => (
                Reason::Orphaned,
                format!(
                    "deletion policy is Orphan: kept store record {}; the store does not implement {}, so its ownership was not cleared",
                    status_id.as_deref().unwrap_or("(none)"),
                    missing.rpc()
                ),
            ),
        })
    }
}

impl Story {
    /// The Event for a finished step: [`Story::notice`], told with its
    /// cause and the fields the write changed, so that `kubectl describe
    /// pet` answers "why did the record change?" without the logs.
    pub fn event(
        &self,
        id: Option<&str>,
        cause: Cause,
        changes: &Changes,
    ) -> Option<(Reason, String)> {
        let (reason, note) = self.notice(id)?;
        let id = id.unwrap_or("(none)");
        let note = match (self, cause) {
            (Story::Updated, Cause::Drift) => format!(
                "drift corrected: {changes} (store record {id} was changed outside the operator)"
            ),
            (Story::Updated, _) => format!("spec change applied to store record {id}: {changes}"),
            (Story::Recreated { lost }, _) => format!(
                "drift corrected: store record {lost} was deleted outside the operator; created {id} in its place"
            ),
            _ if !changes.is_empty() => format!("{note}; updated {changes}"),
            _ => note,
        };
        Some((reason, note))
    }
}

impl Sync {
    /// The conditions once the record is in line; `id` is its ID.
    pub fn outcome(&self, id: &str) -> Outcome {
        if let Some(warning) = &self.warning {
            return Outcome::synced_but(Reason::InvalidAnnotation, warning.clone());
        }
        match (&self.story, self.story.notice(Some(id))) {
            (Story::Corrected { .. }, Some((reason, note))) => Outcome::synced_noting(reason, note),
            _ => Outcome::synced(),
        }
    }
}

fn invalid(annotation: &str, value: &str, allowed: &str, effect: &str) -> String {
    format!("the annotation {annotation} is {value:?}, which is not {allowed}; {effect}")
}

/// Held until a misspelled annotation is fixed.
fn invalid_hold(annotation: &str, value: &str, allowed: &str, effect: &str) -> Step {
    Step::Hold {
        outcome: Outcome::held(
            Reason::InvalidAnnotation,
            invalid(annotation, value, allowed, effect),
        ),
        next: Next::AwaitChange,
    }
}

/// Before any store call: paused, finalizer, deletion policy, and the
/// reconciles that need no store read.
pub fn first_step(facts: &Facts) -> Step {
    match &facts.paused {
        Setting::Valid(true) => {
            return Step::Hold {
                outcome: Outcome::held(
                    Reason::ReconcilePaused,
                    format!(
                        "reconciliation is paused by the annotation {PAUSED_ANNOTATION}=\"true\""
                    ),
                ),
                next: Next::AwaitChange,
            };
        }
        Setting::Invalid { annotation, value } => {
            return invalid_hold(
                annotation,
                value,
                "\"true\" or \"false\"",
                "treated as paused: nothing is reconciled (deletion included) until it is fixed",
            );
        }
        Setting::Valid(false) => {}
    }
    if let Some(Setting::Invalid { annotation, value }) = &facts.hand_over_to {
        return invalid_hold(
            annotation,
            value,
            "an installation name (a lowercase DNS label)",
            "nothing is handed over or written, deletion included, until it is fixed",
        );
    }
    if facts.deleting {
        if !facts.has_finalizer {
            return Step::Wait(Next::AwaitChange);
        }
        if let Setting::Invalid { annotation, value } = &facts.deletion_policy {
            return invalid_hold(
                annotation,
                value,
                "Delete or Orphan",
                "deletion waits, and the store record is kept, until it is fixed",
            );
        }
        // Ownership is by key alone; status.id is read only to name an
        // already released record in the Orphaned Event.
        return Step::Observe {
            id: facts.status_id.clone(),
        };
    }
    if !facts.has_finalizer {
        return Step::AddFinalizer;
    }
    if facts.handing_over().is_some() {
        return Step::Observe {
            id: facts.status_id.clone(),
        };
    }
    if facts.rejected_this_generation {
        return Step::Wait(Next::AwaitChange);
    }
    if let Some(left) = facts.recently_synced {
        return Step::Wait(Next::After(left));
    }
    // Only Automatic may write before the plan is known, and only for a
    // Pet with no plan shown: a Pet switched to Automatic writes the plan
    // it showed, which may take over a record of its name.
    if facts.create_observes
        && facts.change_policy == ChangePolicy::Automatic
        && facts.external_id.is_none()
        && facts.status_id.is_none()
        && !facts.plan_shown
    {
        return Step::Create;
    }
    Step::Observe {
        id: facts
            .external_id
            .clone()
            .or_else(|| facts.status_id.clone()),
    }
}

/// After [`Step::Create`]: recording the new record, or `None` to read the
/// store after all ([`read_after_create`] with nothing read before).
pub fn after_create(facts: &Facts, created: &Created) -> Option<Sync> {
    if read_after_create(created, false) {
        return None;
    }
    Some(Sync {
        target: Target::Existing(created.id().to_owned()),
        claim: None,
        update: false,
        story: Story::Created,
        warning: policy_warning(facts),
    })
}

/// Whether a create's answer sends the reconcile to read the store before
/// it records anything: the key already named a record, so nothing was
/// created and that record may hold an older spec (left by a create whose
/// ID never reached status, or one that committed after its timeout, even
/// after a read found nothing); or the store did not say, and nothing was
/// read under the key before the create.
pub fn read_after_create(created: &Created, read_before: bool) -> bool {
    match created {
        Created::New(_) => false,
        Created::Existing(_) => true,
        Created::Unknown(_) => !read_before,
    }
}

/// Shown in Synced while the record is in line but the policy is misspelled.
fn policy_warning(facts: &Facts) -> Option<String> {
    match &facts.deletion_policy {
        Setting::Invalid { annotation, value } => Some(invalid(
            annotation,
            value,
            "Delete or Orphan",
            "the record is in line with the spec, but deleting this Pet will wait until the annotation is fixed",
        )),
        Setting::Valid(_) => None,
    }
}

/// After reading the store: what to do with it.
pub fn decide(facts: &Facts, observation: Observation) -> Plan {
    let lookup = match observation {
        Observation::Found(lookup) => lookup,
        Observation::StoreLacks { missing } => return lacks_extensions(facts, missing),
    };
    if facts.deleting {
        return finish(facts, lookup);
    }
    let owner = facts.owner();
    let mine = lookup.by_key.clone().filter(|r| r.key == owner);
    if let Some(to) = facts.handing_over() {
        return Plan::HandOver(HandOver {
            release: mine.map(|r| r.id),
            to: to.to_owned(),
        });
    }
    let named = lookup.by_id.clone();
    let drift = |r: &Record| r.data != facts.desired;
    let warning = policy_warning(facts);
    let sync = |target, claim, update, story| {
        Plan::Sync(Sync {
            target,
            claim,
            update,
            story,
            warning: warning.clone(),
        })
    };
    let hold = |reason, message| Plan::Hold {
        outcome: Outcome::failed(reason, message),
        next: Next::Poll,
    };
    // The record holding this Pet's identity, if it is not the Pet's own.
    let by_name = lookup.by_identity.clone().filter(|r| r.key != owner);
    // The Pet's own record still lacks the identity (made before
    // identities): give it in the same compare-and-set, unless another
    // record holds it.
    let stamp = |record: &Record| {
        (lookup.identities && record.identity != facts.identity && by_name.is_none())
            .then(|| owner.clone())
    };
    // A record holding this Pet's identity that it takes without an
    // annotation, and the story of taking it; `None` when it is another
    // installation's.
    let take = |record: &Record| match facts.holder(&record.key) {
        Holder::Nobody => Some(Story::Reclaimed),
        Holder::ThisPet | Holder::SameInstallation { .. } | Holder::HandedOverHere => {
            Some(Story::TakenOver {
                from: record.key.clone(),
            })
        }
        Holder::HandedOverByThisPet { to } => Some(Story::HandOverCancelled { to: to.to_owned() }),
        Holder::Elsewhere { .. } | Holder::Unknown => None,
    };

    if let Some(external) = &facts.external_id {
        if let Some(holder) = by_name.as_ref().filter(|r| r.id != *external) {
            let advice = if take(holder).is_some() {
                format!(
                    "Remove the annotation to use record {}; or, to adopt record {external}, release record {} and clear its identity first: {}",
                    holder.id,
                    holder.id,
                    release_by_hand(&holder.id, &holder.key, true)
                )
            } else {
                format!(
                    "This Pet can take neither while that installation's Pet holds its name: delete that Pet with deletionPolicy Delete (its record goes with it), then this Pet adopts record {external}"
                )
            };
            return hold(
                Reason::AdoptionConflict,
                format!(
                    "the annotation {EXTERNAL_ID_ANNOTATION} names store record {external}, but store record {} already carries this Pet's identity {:?}{}; a Pet owns one record. {advice}",
                    holder.id,
                    facts.identity,
                    owned_by(&holder.key),
                ),
            );
        }
        return match (mine, named) {
            (Some(mine), _) if mine.id == *external => {
                let story = if facts.status_id.as_deref() != Some(external) {
                    Story::Adopted
                } else if drift(&mine) {
                    Story::Updated
                } else {
                    Story::InSync
                };
                sync(
                    Target::Existing(mine.id.clone()),
                    stamp(&mine),
                    drift(&mine),
                    story,
                )
            }
            (Some(mine), _) => hold(
                Reason::AdoptionConflict,
                format!(
                    "the annotation {EXTERNAL_ID_ANNOTATION} names store record {external}, but this Pet already owns record {}; a Pet owns one record. Remove the annotation, or release record {} and clear its identity first: {}",
                    mine.id,
                    mine.id,
                    release_by_hand(&mine.id, &owner, true)
                ),
            ),
            (None, None) => hold(
                Reason::RecordNotFound,
                format!(
                    "the annotation {EXTERNAL_ID_ANNOTATION} names store record {external}, which does not exist; nothing was created. Fix or remove the annotation"
                ),
            ),
            (None, Some(record)) if record.key.is_nobody() => sync(
                Target::Existing(record.id.clone()),
                Some(Owner::Nobody),
                drift(&record),
                Story::Adopted,
            ),
            // Named, and holding this Pet's identity under a key it takes
            // without the annotation (a lost Pet's of this installation, a
            // handover): taken as without it.
            (None, Some(record)) => {
                match take(&record).filter(|_| record.identity == facts.identity) {
                    Some(story) => sync(
                        Target::Existing(record.id.clone()),
                        Some(record.key.clone()),
                        drift(&record),
                        story,
                    ),
                    None => hold(
                        Reason::RecordOwnedElsewhere,
                        format!(
                            "store record {external}, named by the annotation {EXTERNAL_ID_ANNOTATION}, is owned by {:?} (its idempotency key), not by this Pet; it was not touched. If nothing owns it any more, release it: {}",
                            record.key.to_string(),
                            release_by_hand(&record.id, &record.key, false)
                        ),
                    ),
                }
            }
        };
    }

    if mine.is_none()
        && let Some(record) = by_name
    {
        let Some(story) = take(&record) else {
            let holder = match (&record.key, facts.holder(&record.key)) {
                (Owner::HandedOver { to, .. }, _) => {
                    format!("a handover to the installation {to:?}")
                }
                (_, Holder::Elsewhere { installation }) => {
                    format!("a Pet of the installation {installation:?}")
                }
                _ => "a key no operator writes".to_owned(),
            };
            return hold(
                Reason::RecordOwnedElsewhere,
                format!(
                    "store record {} carries this Pet's identity {:?}, but it is owned by {:?}, {holder}, not this one ({:?}); it was not touched. One record holds one namespace and name across every cluster that shares the store: delete the Pet in one of them",
                    record.id,
                    facts.identity,
                    record.key.to_string(),
                    facts.installation
                ),
            );
        };
        return sync(
            Target::Existing(record.id.clone()),
            Some(record.key.clone()),
            drift(&record),
            story,
        );
    }

    match (facts.status_id.as_deref(), named, mine) {
        (Some(id), Some(named), _) if named.key == owner => {
            let update = drift(&named);
            let story = if update {
                Story::Updated
            } else {
                Story::InSync
            };
            sync(
                Target::Existing(id.to_owned()),
                stamp(&named),
                update,
                story,
            )
        }
        (Some(stale), named, Some(mine)) => sync(
            Target::Existing(mine.id.clone()),
            stamp(&mine),
            drift(&mine),
            Story::Corrected {
                stale: stale.to_owned(),
                foreign: named.is_some(),
                created: false,
            },
        ),
        (Some(stale), Some(_), None) => sync(
            Target::Create,
            None,
            false,
            Story::Corrected {
                stale: stale.to_owned(),
                foreign: true,
                created: true,
            },
        ),
        (Some(lost), None, None) => sync(
            Target::Create,
            None,
            false,
            Story::Recreated {
                lost: lost.to_owned(),
            },
        ),
        (None, _, Some(mine)) => sync(
            Target::Existing(mine.id.clone()),
            stamp(&mine),
            drift(&mine),
            Story::FoundByKey,
        ),
        (None, _, None) => sync(Target::Create, None, false, Story::Created),
    }
}

/// Who holds a record, for a message: " (owned by <key>)", or kept and
/// owned by nobody.
fn owned_by(owner: &Owner) -> String {
    match owner {
        Owner::Nobody => " (kept by an earlier Pet of this name, owned by nobody now)".into(),
        Owner::HandedOver { to, .. } => format!(
            " (handed over to the installation {to:?}, its key {:?})",
            owner.to_string()
        ),
        _ => format!(" (owned by {:?})", owner.to_string()),
    }
}

/// The `SetIdempotencyKeys` request that releases record `id` from `owner`
/// by hand (to nobody), and with `clear_identity` frees the Pet's name it
/// carries too, which a Pet that should adopt another record needs: a
/// released record that keeps the name is the Pet's to take back.
pub fn release_by_hand(id: &str, owner: &Owner, clear_identity: bool) -> String {
    let identity = if clear_identity {
        r#","newIdentity":"""#
    } else {
        ""
    };
    format!(
        r#"grpcurl -d '{{"changes":[{{"id":{id:?},"expectedKey":{:?},"newKey":""{identity}}}]}}' <store> petstore.PetStore/SetIdempotencyKeys"#,
        owner.to_string()
    )
}

fn finish(facts: &Facts, lookup: Lookup) -> Plan {
    let owner = facts.owner();
    let mine = lookup.by_key.filter(|r| r.key == owner).map(|r| r.id);
    if facts.change_policy == ChangePolicy::Observe {
        // Observe never writes: not even the release an Orphan would make.
        return Plan::Finish(Finish {
            hand_to: None,
            release: None,
            delete: None,
            story: Story::LeftAlone {
                id: mine.or_else(|| facts.status_id.clone()),
            },
        });
    }
    if let Some(to) = facts.handing_over() {
        return Plan::Finish(Finish {
            release: mine.clone(),
            hand_to: Some(to.to_owned()),
            delete: None,
            story: Story::HandedOver {
                id: mine,
                to: to.to_owned(),
            },
        });
    }
    // A retry after the release (the finalizer removal failed) still names
    // the released record, so the user can adopt it.
    let kept = || {
        mine.clone().or(lookup
            .by_id
            .clone()
            .filter(|r| r.key.is_nobody() && facts.status_id.as_ref() == Some(&r.id))
            .map(|r| r.id))
    };
    Plan::Finish(match (&facts.deletion_policy, facts.uninstalling) {
        (Setting::Valid(DeletionPolicy::Orphan), _) => Finish {
            hand_to: None,
            release: mine.clone(),
            delete: None,
            story: Story::Orphaned { id: kept() },
        },
        (Setting::Valid(DeletionPolicy::Delete), Some(why)) => Finish {
            hand_to: None,
            release: mine.clone(),
            delete: None,
            story: Story::KeptOnUninstall { id: kept(), why },
        },
        // first_step never observes for deletion with an invalid policy;
        // should it happen, keeping the record is the safe side.
        (Setting::Invalid { .. }, _) => Finish {
            hand_to: None,
            release: None,
            delete: None,
            story: Story::Orphaned { id: None },
        },
        (Setting::Valid(DeletionPolicy::Delete), None) => Finish {
            hand_to: None,
            release: None,
            delete: mine.clone(),
            story: Story::Deleted { id: mine },
        },
    })
}

fn lacks_extensions(facts: &Facts, missing: Operation) -> Plan {
    if facts.deleting && facts.deletion_policy == Setting::Valid(DeletionPolicy::Orphan) {
        // The original store keeps no keys: there is no ownership to clear.
        return Plan::Finish(Finish {
            hand_to: None,
            release: None,
            delete: None,
            story: Story::OrphanedUnkeyed {
                status_id: facts.status_id.clone(),
                missing,
            },
        });
    }
    if let (true, Some(why)) = (facts.deleting, facts.uninstalling) {
        // No keys to clear, and nothing may be deleted: let the Pet go.
        return Plan::Finish(Finish {
            hand_to: None,
            release: None,
            delete: None,
            story: Story::KeptOnUninstall {
                id: facts.status_id.clone(),
                why,
            },
        });
    }
    let hint = if facts.deleting {
        format!(
            " To let this Pet go and keep whatever record it has, change its deletion policy to Orphan, which is allowed while it is being deleted: set spec.deletionPolicy: Orphan, or the annotation {DELETION_POLICY_ANNOTATION}: Orphan."
        )
    } else {
        String::new()
    };
    Plan::Hold {
        outcome: Outcome::failed(
            Reason::StoreLacksExtensions,
            format!(
                "the pet store does not implement {}, an extension RPC this operator needs (GetPets, SetIdempotencyKeys and AddPets with idempotency_key); point --petstore-addr at this project's petstore-server.{hint}",
                missing.rpc()
            ),
        ),
        next: Next::Retry,
    }
}

#[cfg(test)]
mod tests;
