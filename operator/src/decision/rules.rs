//! The rules: what to do before the store is read ([`first_step`]), after
//! it is read ([`decide`], and [`finish`] for a deletion), and after a
//! create that stood in for the read ([`after_create`]). They choose; the
//! words are in [`super::prose`].

use super::prose::policy_warning;
use super::{
    Decision, Facts, Finish, ForeignHolder, HandOver, Hold, Misspelled, Next, Observation, Step,
    Story, Sync, Target,
};
use crate::crd::{ChangePolicy, DeletionPolicy, Setting};
use crate::store::{Created, Holder, Lookup, Operation, Owner, Record};

/// Held until a misspelled annotation is fixed.
fn misspelled(annotation: &str, value: &str, setting: Misspelled) -> Step {
    Hold::Misspelled {
        annotation: annotation.to_owned(),
        value: value.to_owned(),
        setting,
    }
    .step()
}

/// Before any store call: paused, finalizer, deletion policy, and the
/// reconciles that need no store read.
pub fn first_step(facts: &Facts) -> Step {
    match &facts.paused {
        Setting::Valid(true) => return Hold::Paused.step(),
        Setting::Invalid { annotation, value } => {
            return misspelled(annotation, value, Misspelled::Paused);
        }
        Setting::Valid(false) => {}
    }
    if let Some(Setting::Invalid { annotation, value }) = &facts.hand_over_to {
        return misspelled(annotation, value, Misspelled::HandOverTo);
    }
    if facts.deleting {
        if !facts.has_finalizer {
            return Step::Wait(Next::AwaitChange);
        }
        if let Setting::Invalid { annotation, value } = &facts.deletion_policy {
            return misspelled(annotation, value, Misspelled::DeletionPolicy);
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

/// After reading the store: what to do with it.
pub fn decide(facts: &Facts, observation: Observation) -> Decision {
    let lookup = match observation {
        Observation::Found(lookup) => lookup,
        Observation::StoreLacks { missing } => return lacks_extensions(facts, missing),
    };
    if facts.deleting {
        return finish(facts, lookup);
    }
    let seen = Seen::new(facts, lookup);
    if let Some(to) = facts.handing_over() {
        return Decision::HandOver(HandOver {
            release: seen.mine.map(|r| r.id),
            to: to.to_owned(),
        });
    }
    let planned = match (&facts.external_id, &seen.mine, &seen.by_name) {
        (Some(external), _, _) => seen.adopt(external),
        (None, None, Some(record)) => seen.take_name(record),
        (None, _, _) => Ok(seen.by_status_id()),
    };
    planned.unwrap_or_else(|hold| hold.decision())
}

/// What [`decide`] plans from, for a Pet not being deleted: its facts and
/// the records the store read found that matter to them.
struct Seen<'a> {
    facts: &'a Facts,
    owner: Owner,
    /// The Pet's own record, found by its key.
    mine: Option<Record>,
    /// The record the external-id annotation or status.id names.
    named: Option<Record>,
    /// The record holding this Pet's identity, if it is not the Pet's own.
    by_name: Option<Record>,
    /// The store keeps records' identities.
    identities: bool,
    warning: Option<String>,
}

// A hold is made into a plan at once, once per reconcile: boxing it would
// add an allocation and save nothing.
#[allow(clippy::result_large_err)]
impl<'a> Seen<'a> {
    fn new(facts: &'a Facts, lookup: Lookup) -> Self {
        let owner = facts.owner();
        Seen {
            facts,
            mine: lookup.by_key.filter(|r| r.key == owner),
            named: lookup.by_id,
            by_name: lookup.by_identity.filter(|r| r.key != owner),
            identities: lookup.identities,
            warning: policy_warning(facts),
            owner,
        }
    }

    fn drift(&self, record: &Record) -> bool {
        record.data != self.facts.desired
    }

    fn sync(&self, target: Target, claim: Option<Owner>, update: bool, story: Story) -> Decision {
        Decision::Sync(Sync {
            target,
            claim,
            update,
            story,
            warning: self.warning.clone(),
        })
    }

    /// Creates a new record keyed by the Pet's key.
    fn create(&self, story: Story) -> Decision {
        self.sync(Target::Create, None, false, story)
    }

    /// Brings `record` in line, claiming it from `claim`.
    fn sync_record(&self, record: &Record, claim: Option<Owner>, story: Story) -> Decision {
        self.sync(
            Target::Existing(record.id.clone()),
            claim,
            self.drift(record),
            story,
        )
    }

    /// The Pet's own record still lacks the identity (made before
    /// identities): give it in the same compare-and-set, unless another
    /// record holds it.
    fn stamp(&self, record: &Record) -> Option<Owner> {
        (self.identities && record.identity != self.facts.identity && self.by_name.is_none())
            .then(|| self.owner.clone())
    }

    /// A record holding this Pet's identity that it takes without an
    /// annotation, and the story of taking it; `None` when it is another
    /// installation's.
    fn take(&self, record: &Record) -> Option<Story> {
        match self.facts.holder(&record.key) {
            Holder::Nobody => Some(Story::Reclaimed),
            Holder::ThisPet | Holder::SameInstallation { .. } | Holder::HandedOverHere => {
                Some(Story::TakenOver {
                    from: record.key.clone(),
                })
            }
            Holder::HandedOverByThisPet { to } => {
                Some(Story::HandOverCancelled { to: to.to_owned() })
            }
            Holder::Elsewhere { .. } | Holder::Unknown => None,
        }
    }

    /// The external-id annotation names the record `external`.
    fn adopt(&self, external: &str) -> Result<Decision, Hold> {
        if let Some(holder) = self.by_name.as_ref().filter(|r| r.id != external) {
            return Err(Hold::NameHeldByAnother {
                external: external.to_owned(),
                holder: holder.id.clone(),
                key: holder.key.clone(),
                identity: self.facts.identity.clone(),
                takeable: self.take(holder).is_some(),
            });
        }
        match (&self.mine, &self.named) {
            (Some(mine), _) if mine.id == external => Ok(self.keep_adopted(mine, external)),
            (Some(mine), _) => Err(Hold::OwnsAnother {
                external: external.to_owned(),
                mine: mine.id.clone(),
                key: self.owner.clone(),
            }),
            (None, None) => Err(Hold::RecordNotFound {
                external: external.to_owned(),
            }),
            (None, Some(record)) if record.key.is_nobody() => {
                Ok(self.sync_record(record, Some(Owner::Nobody), Story::Adopted))
            }
            (None, Some(record)) => self.adopt_held(external, record),
        }
    }

    /// The record the annotation names is already the Pet's own.
    fn keep_adopted(&self, mine: &Record, external: &str) -> Decision {
        let story = if self.facts.status_id.as_deref() != Some(external) {
            Story::Adopted
        } else if self.drift(mine) {
            Story::Updated
        } else {
            Story::InSync
        };
        self.sync_record(mine, self.stamp(mine), story)
    }

    /// The record the annotation names has an owner: taken only if it
    /// holds this Pet's identity under a key the Pet takes without the
    /// annotation (a lost Pet's of this installation, a handover).
    fn adopt_held(&self, external: &str, record: &Record) -> Result<Decision, Hold> {
        match self
            .take(record)
            .filter(|_| record.identity == self.facts.identity)
        {
            Some(story) => Ok(self.sync_record(record, Some(record.key.clone()), story)),
            None => Err(Hold::NamedRecordOwnedElsewhere {
                external: external.to_owned(),
                id: record.id.clone(),
                key: record.key.clone(),
            }),
        }
    }

    /// The Pet has no record under its key, and `record` holds its
    /// identity: reclaimed or taken over, unless another installation's.
    fn take_name(&self, record: &Record) -> Result<Decision, Hold> {
        let Some(story) = self.take(record) else {
            let holder = match (&record.key, self.facts.holder(&record.key)) {
                (Owner::HandedOver { to, .. }, _) => ForeignHolder::HandOver { to: to.clone() },
                (_, Holder::Elsewhere { installation }) => {
                    ForeignHolder::Installation(installation.to_owned())
                }
                _ => ForeignHolder::Unknown,
            };
            return Err(Hold::NameOwnedElsewhere {
                id: record.id.clone(),
                identity: self.facts.identity.clone(),
                key: record.key.clone(),
                holder,
                installation: self.facts.installation.clone(),
            });
        };
        Ok(self.sync_record(record, Some(record.key.clone()), story))
    }

    /// No annotation and no record of the Pet's name to take: the record
    /// status.id names, the Pet's own found by key, or a new one.
    fn by_status_id(&self) -> Decision {
        match (self.facts.status_id.as_deref(), &self.mine) {
            (Some(id), _) => self.by_known_id(id),
            (None, Some(mine)) => self.sync_record(mine, self.stamp(mine), Story::FoundByKey),
            (None, None) => self.create(Story::Created),
        }
    }

    /// status.id names `id`: kept if the Pet's, else corrected to the
    /// Pet's own record (found by key or created).
    fn by_known_id(&self, id: &str) -> Decision {
        match (&self.named, &self.mine) {
            (Some(named), _) if named.key == self.owner => {
                let update = self.drift(named);
                let story = if update {
                    Story::Updated
                } else {
                    Story::InSync
                };
                self.sync(
                    Target::Existing(id.to_owned()),
                    self.stamp(named),
                    update,
                    story,
                )
            }
            (named, Some(mine)) => self.sync_record(
                mine,
                self.stamp(mine),
                Story::Corrected {
                    stale: id.to_owned(),
                    foreign: named.is_some(),
                    created: false,
                },
            ),
            (Some(_), None) => self.create(Story::Corrected {
                stale: id.to_owned(),
                foreign: true,
                created: true,
            }),
            (None, None) => self.create(Story::Recreated {
                lost: id.to_owned(),
            }),
        }
    }
}

/// For a Pet being deleted: release, hand over, delete or leave its
/// record, by its policies.
pub(super) fn finish(facts: &Facts, lookup: Lookup) -> Decision {
    let owner = facts.owner();
    let mine = lookup.by_key.filter(|r| r.key == owner).map(|r| r.id);
    if facts.change_policy == ChangePolicy::Observe {
        // Observe never writes: not even the release an Orphan would make.
        return Decision::Finish(Finish {
            hand_to: None,
            release: None,
            delete: None,
            story: Story::LeftAlone {
                id: mine.or_else(|| facts.status_id.clone()),
            },
        });
    }
    if let Some(to) = facts.handing_over() {
        return Decision::Finish(Finish {
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
    Decision::Finish(match (&facts.deletion_policy, facts.uninstalling) {
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

/// The store lacks an extension RPC: a deletion that touches no record
/// goes on; anything else waits for a store that has it.
fn lacks_extensions(facts: &Facts, missing: Operation) -> Decision {
    if facts.deleting && facts.deletion_policy == Setting::Valid(DeletionPolicy::Orphan) {
        // The original store keeps no keys: there is no ownership to clear.
        return Decision::Finish(Finish {
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
        return Decision::Finish(Finish {
            hand_to: None,
            release: None,
            delete: None,
            story: Story::KeptOnUninstall {
                id: facts.status_id.clone(),
                why,
            },
        });
    }
    Hold::StoreLacksExtensions {
        missing,
        deleting: facts.deleting,
    }
    .decision()
}
