//! What the decision step knows about a Pet before any store call, and how
//! it is read from the Pet.

use std::time::Duration;

use kube::{Resource, ResourceExt};

use super::Cause;
use crate::Error;
use crate::crd::{ChangePolicy, DeletionPolicy, FINALIZER, Pet, Setting};
use crate::status::{self, Reason};
use crate::store::{Holder, Owner, PetData};

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
    /// Why drift is not written back by itself now, if it is not.
    pub drift_brake: Option<DriftBrake>,
}

/// Why a drift-caused plan waits for approval whatever the change policy
/// (see `controller::drift_storm`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DriftBrake {
    /// `drifted` of the store's `pets` Pets drifted within the window.
    Storm { drifted: usize, pets: usize },
    /// The Pet was held in a storm and its plan is not approved yet.
    HeldInStorm,
}

/// Why a deletion keeps and releases its record although the Pet's policy
/// is Delete: removing the operator is not asking for the records to go.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Uninstall {
    /// The Pet CRD is being deleted without the confirmation
    /// [`CONFIRM_DELETE_PETS_ANNOTATION`](crate::crd::CONFIRM_DELETE_PETS_ANNOTATION) (its guard was removed, or the
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

/// What the decision step knows from the Pet alone, without this process's
/// memory: for a reconcile ([`crate::controller::Context::facts`] adds the
/// memory) and for `kubectl petstore plan`, so both plan from the same
/// facts.
pub fn facts_of(pet: &Pet, installation: &str) -> Result<Facts, Error> {
    let uid = pet
        .uid()
        .ok_or_else(|| Error::MalformedPet(pet.name_any()))?;
    Ok(Facts {
        recently_synced: None,
        uid,
        installation: installation.to_owned(),
        identity: pet.identity(),
        desired: PetData::from(&pet.spec),
        deleting: pet.meta().deletion_timestamp.is_some(),
        has_finalizer: pet.finalizers().iter().any(|f| f == FINALIZER),
        paused: pet.paused(),
        deletion_policy: pet.deletion_policy(),
        external_id: pet.external_id().map(str::to_owned),
        status_id: pet.status_id().map(str::to_owned),
        rejected_this_generation: status::rejected_this_generation(
            pet.status.as_ref(),
            pet.metadata.generation,
        ),
        spec_changed: spec_changed(pet),
        create_observes: false,
        generation: pet.metadata.generation,
        change_policy: pet.change_policy(),
        approved_plan: pet.approved_plan().map(str::to_owned),
        // Looked up by the reconcile, and only for a Pet being deleted.
        uninstalling: None,
        hand_over_to: pet.hand_over_to(),
        applied_plan: pet.status.as_ref().and_then(|s| s.applied_plan.clone()),
        plan_shown: pet.status.as_ref().is_some_and(|s| s.plan.is_some()),
        // Kept in the Pet's own status, so a restart does not release it.
        drift_brake: pet
            .condition(status::SYNCED)
            .is_some_and(|synced| synced.reason == Reason::DriftStorm.as_str())
            .then_some(DriftBrake::HeldInStorm),
    })
}

/// Whether the spec changed since the operator last acted on the Pet: its
/// status does not observe this generation, or it shows a plan made for
/// this generation's spec change and not yet written (showing the plan
/// observed the generation; the change is still the edit's, not drift).
fn spec_changed(pet: &Pet) -> bool {
    let generation = pet.metadata.generation;
    let Some(status) = &pet.status else {
        return true;
    };
    // Ready's, not status.observedGeneration: a generation held as Stalled
    // is observed without its spec having reached the record.
    let handled = pet
        .condition(status::READY)
        .map_or(status.observed_generation, |ready| {
            ready.observed_generation
        });
    handled != generation
        || status.plan.as_ref().is_some_and(|plan| {
            plan.generation == generation && plan.cause == Cause::SpecChange.as_str()
        })
}
