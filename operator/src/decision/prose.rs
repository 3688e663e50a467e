//! Every human-facing message of the decision step: the Events a story
//! publishes, the conditions a hold or a finished plan shows, and the
//! commands they suggest. Tests and end-to-end tests match on these texts.

use super::{Cause, Facts};
use super::{ForeignHolder, HandOver, Hold, Misspelled, Story, Sync, Uninstall};
use crate::crd::{
    CONFIRM_DELETE_PETS_ANNOTATION, DELETION_POLICY_ANNOTATION, EXTERNAL_ID_ANNOTATION,
    HAND_OVER_TO_ANNOTATION, PAUSED_ANNOTATION, Setting,
};
use crate::status::{Outcome, Reason};
use crate::store::{Changes, Owner};

impl HandOver {
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

impl Story {
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

impl Hold {
    /// The conditions while held: why, and what would let the Pet go on.
    pub fn outcome(&self) -> Outcome {
        match self {
            Hold::Paused => Outcome::held(
                Reason::ReconcilePaused,
                format!("reconciliation is paused by the annotation {PAUSED_ANNOTATION}=\"true\""),
            ),
            Hold::Misspelled {
                annotation,
                value,
                setting,
            } => {
                let (allowed, effect) = match setting {
                    Misspelled::Paused => (
                        "\"true\" or \"false\"",
                        "treated as paused: nothing is reconciled (deletion included) until it is fixed",
                    ),
                    Misspelled::HandOverTo => (
                        "an installation name (a lowercase DNS label)",
                        "nothing is handed over or written, deletion included, until it is fixed",
                    ),
                    Misspelled::DeletionPolicy => (
                        "Delete or Orphan",
                        "deletion waits, and the store record is kept, until it is fixed",
                    ),
                };
                Outcome::held(
                    Reason::InvalidAnnotation,
                    invalid(annotation, value, allowed, effect),
                )
            }
            Hold::StoreLacksExtensions { missing, deleting } => {
                let hint = if *deleting {
                    format!(
                        " To let this Pet go and keep whatever record it has, change its deletion policy to Orphan, which is allowed while it is being deleted: set spec.deletionPolicy: Orphan, or the annotation {DELETION_POLICY_ANNOTATION}: Orphan."
                    )
                } else {
                    String::new()
                };
                Outcome::failed(
                    Reason::StoreLacksExtensions,
                    format!(
                        "the pet store does not implement {}, an extension RPC this operator needs (GetPets, SetIdempotencyKeys and AddPets with idempotency_key); point --petstore-addr at this project's petstore-server.{hint}",
                        missing.rpc()
                    ),
                )
            }
            Hold::NameHeldByAnother {
                external,
                holder,
                key,
                identity,
                takeable,
            } => {
                let advice = if *takeable {
                    format!(
                        "Remove the annotation to use record {holder}; or, to adopt record {external}, release record {holder} and clear its identity first: {}",
                        release_by_hand(holder, key, true)
                    )
                } else {
                    format!(
                        "This Pet can take neither while that installation's Pet holds its name: delete that Pet with deletionPolicy Delete (its record goes with it), then this Pet adopts record {external}"
                    )
                };
                Outcome::failed(
                    Reason::AdoptionConflict,
                    format!(
                        "the annotation {EXTERNAL_ID_ANNOTATION} names store record {external}, but store record {holder} already carries this Pet's identity {identity:?}{}; a Pet owns one record. {advice}",
                        owned_by(key),
                    ),
                )
            }
            Hold::OwnsAnother {
                external,
                mine,
                key,
            } => Outcome::failed(
                Reason::AdoptionConflict,
                format!(
                    "the annotation {EXTERNAL_ID_ANNOTATION} names store record {external}, but this Pet already owns record {mine}; a Pet owns one record. Remove the annotation, or release record {mine} and clear its identity first: {}",
                    release_by_hand(mine, key, true)
                ),
            ),
            Hold::RecordNotFound { external } => Outcome::failed(
                Reason::RecordNotFound,
                format!(
                    "the annotation {EXTERNAL_ID_ANNOTATION} names store record {external}, which does not exist; nothing was created. Fix or remove the annotation"
                ),
            ),
            Hold::NamedRecordOwnedElsewhere { external, id, key } => Outcome::failed(
                Reason::RecordOwnedElsewhere,
                format!(
                    "store record {external}, named by the annotation {EXTERNAL_ID_ANNOTATION}, is owned by {:?} (its idempotency key), not by this Pet; it was not touched. If nothing owns it any more, release it: {}",
                    key.to_string(),
                    release_by_hand(id, key, false)
                ),
            ),
            Hold::NameOwnedElsewhere {
                id,
                identity,
                key,
                holder,
                installation,
            } => {
                let holder = match holder {
                    ForeignHolder::HandOver { to } => {
                        format!("a handover to the installation {to:?}")
                    }
                    ForeignHolder::Installation(installation) => {
                        format!("a Pet of the installation {installation:?}")
                    }
                    ForeignHolder::Unknown => "a key no operator writes".to_owned(),
                };
                Outcome::failed(
                    Reason::RecordOwnedElsewhere,
                    format!(
                        "store record {id} carries this Pet's identity {identity:?}, but it is owned by {:?}, {holder}, not this one ({installation:?}); it was not touched. One record holds one namespace and name across every cluster that shares the store: delete the Pet in one of them",
                        key.to_string(),
                    ),
                )
            }
        }
    }
}

pub(super) fn invalid(annotation: &str, value: &str, allowed: &str, effect: &str) -> String {
    format!("the annotation {annotation} is {value:?}, which is not {allowed}; {effect}")
}

/// Shown in Synced while the record is in line but the policy is misspelled.
pub(super) fn policy_warning(facts: &Facts) -> Option<String> {
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

/// The hold of a drift-caused plan in a drift storm: why nothing is
/// written, what would be, and how to let it.
pub fn drift_braked(brake: super::DriftBrake, plan: &super::Plan) -> String {
    let why = match brake {
        super::DriftBrake::Storm { drifted, pets } => format!(
            "{drifted} of this store's {pets} Pets drifted at once, so the operator writes no drift back to it"
        ),
        super::DriftBrake::HeldInStorm => {
            "this Pet was held in a drift storm on its store".to_owned()
        }
    };
    format!(
        "{why} (a store restored from an old backup, come back empty or serving wrong data looks so): plan {} would {}. Check the store; approve it with the annotation {}={}",
        plan.hash,
        plan.describe(),
        crate::crd::APPROVE_PLAN_ANNOTATION,
        plan.hash
    )
}
