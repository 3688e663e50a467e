//! What one change on the store's change feed means for the Pet it
//! concerns: policy, like the rest of [`crate::decision`]. The feed's
//! follower (`controller/feed.rs`) finds the Pet and acts on the verdict;
//! the metrics count it.

use kube::ResourceExt;

use crate::crd::Pet;
use crate::store::{PetData, RecordChange};

/// What one change in the store means for the Pet it concerns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// No Pet owns or names the record.
    Unrelated,
    /// The record is as its Pet wants it (most often the echo of the
    /// operator's own write), or the Pet is being deleted, which its own
    /// reconcile handles.
    InSync,
    /// The record no longer matches its Pet, or the Pet shows a plan made
    /// from the record as it was: reconcile it now.
    Drifted,
}

impl Verdict {
    pub const fn as_str(self) -> &'static str {
        match self {
            Verdict::Unrelated => "unrelated",
            Verdict::InSync => "in_sync",
            Verdict::Drifted => "drifted",
        }
    }
}

/// Pure: what `change` means for `pet` (see [`Verdict`]).
pub fn verdict(change: &RecordChange, pet: Option<&Pet>) -> Verdict {
    let Some(pet) = pet else {
        return Verdict::Unrelated;
    };
    // A plan shown (Approve, Observe) describes the record as it was read:
    // any change makes it stale, even one back to what the spec asks.
    let shows_plan = pet.status.as_ref().is_some_and(|s| s.plan.is_some());
    if shows_plan {
        return Verdict::Drifted;
    }
    if pet.metadata.deletion_timestamp.is_some() {
        return Verdict::InSync;
    }
    // A change to a record holding this Pet's name that is not its own
    // (kept by an earlier Pet of the name, owned by another installation,
    // handed over) may free it for this Pet: look again.
    let named = !change.identity.is_empty() && change.identity == pet.identity();
    let Some(record) = &change.record else {
        // Deleted: drift only if it was the Pet's record; a look again if
        // it held the Pet's name.
        return if pet.status_id() == Some(change.id.as_str()) || named {
            Verdict::Drifted
        } else {
            Verdict::InSync
        };
    };
    // UIDs are unique across clusters, so the key's UID alone names the
    // owner; a record of another installation never matches.
    let owned = record
        .key
        .pet_uid()
        .is_some_and(|owner| pet.uid().as_deref() == Some(owner));
    let named = pet.status_id().is_none_or(|id| id == record.id);
    if owned && named && record.data == PetData::from(&pet.spec) {
        Verdict::InSync
    } else {
        Verdict::Drifted
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{RECORD_ID as ID, UID};

    /// Thor, whose record is `ID`, owned by `UID`.
    fn pet() -> Pet {
        Pet::test().with_status_id(ID)
    }

    #[test]
    fn verdicts() {
        let deleting = pet().deleted();
        // Created, but no status written yet.
        let unsynced = Pet::test();
        let planning = pet().showing_plan();
        let deleting_planning = pet().deleted().showing_plan();
        let cases: [(&str, RecordChange, Option<&Pet>, Verdict); 15] = [
            (
                "a record no Pet owns or names",
                RecordChange::changed("other", "", "Rex"),
                None,
                Verdict::Unrelated,
            ),
            (
                "the echo of our own write",
                RecordChange::changed(ID, UID, "Thor"),
                Some(&pet()),
                Verdict::InSync,
            ),
            (
                "our create, before the status names it",
                RecordChange::changed(ID, UID, "Thor"),
                Some(&unsynced),
                Verdict::InSync,
            ),
            (
                "renamed out of band",
                RecordChange::changed(ID, UID, "Loki"),
                Some(&pet()),
                Verdict::Drifted,
            ),
            (
                "its key taken away",
                RecordChange::changed(ID, "", "Thor"),
                Some(&pet()),
                Verdict::Drifted,
            ),
            (
                "another record with its key",
                RecordChange::changed("record-2", UID, "Thor"),
                Some(&pet()),
                Verdict::Drifted,
            ),
            (
                "its record deleted out of band",
                RecordChange::deleted(ID),
                Some(&pet()),
                Verdict::Drifted,
            ),
            (
                "a record it no longer names deleted",
                RecordChange::deleted("record-0"),
                Some(&pet()),
                Verdict::InSync,
            ),
            (
                "deleted while the Pet is deleted",
                RecordChange::deleted(ID),
                Some(&deleting),
                Verdict::InSync,
            ),
            (
                "changed while the Pet is deleted",
                RecordChange::changed(ID, "", "Thor"),
                Some(&deleting),
                Verdict::InSync,
            ),
            (
                "back to what the spec asks while a plan shows it otherwise",
                RecordChange::changed(ID, UID, "Thor"),
                Some(&planning),
                Verdict::Drifted,
            ),
            (
                "a record of its name, not its own, deleted: look again",
                RecordChange::deleted("theirs").named("default/thor"),
                Some(&unsynced),
                Verdict::Drifted,
            ),
            (
                "a record of another name deleted",
                RecordChange::deleted("theirs").named("default/loki"),
                Some(&unsynced),
                Verdict::InSync,
            ),
            (
                "a record of its name handed over to its installation",
                RecordChange::changed("theirs", "green/", "Thor").named("default/thor"),
                Some(&unsynced),
                Verdict::Drifted,
            ),
            (
                "changed while a deleted Pet's plan waits",
                RecordChange::changed(ID, UID, "Loki"),
                Some(&deleting_planning),
                Verdict::Drifted,
            ),
        ];
        for (name, change, pet, expected) in cases {
            assert_eq!(verdict(&change, pet), expected, "{name}");
        }
    }
}
