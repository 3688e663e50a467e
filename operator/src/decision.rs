//! The pure decision step: from what the Pet wants and what the store holds,
//! pick the next action. No I/O, so every branch is unit-tested directly.

use crate::store::{PetData, Record};

/// What reconciliation observed in the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Observed {
    /// `status.id` was set; the record under that ID, if it still exists.
    ById { id: String, record: Option<Record> },
    /// `status.id` was empty; the record created with the Pet's UID as its
    /// idempotency key, if any.
    ByKey { record: Option<Record> },
}

/// The next action against the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Nothing exists yet: create a record keyed by the Pet's UID.
    Create,
    /// `status.id` names a record that is gone (out-of-band delete, or a
    /// store that lost its data): create it again.
    Recreate { lost_id: String },
    /// The ID never reached status (a crash or failed status write after the
    /// create), but the record exists: record its ID instead of creating a
    /// duplicate, and update it if it drifted meanwhile.
    Adopt { id: String, update: bool },
    /// The record exists and differs from the spec.
    Update { id: String },
    /// The record matches the spec: no store write.
    InSync { id: String },
}

pub fn decide(desired: &PetData, observed: Observed) -> Plan {
    match observed {
        Observed::ById { id, record: None } => Plan::Recreate { lost_id: id },
        Observed::ById {
            id,
            record: Some(record),
        } => {
            if record.data == *desired {
                Plan::InSync { id }
            } else {
                Plan::Update { id }
            }
        }
        Observed::ByKey { record: None } => Plan::Create,
        Observed::ByKey {
            record: Some(record),
        } => Plan::Adopt {
            update: record.data != *desired,
            id: record.id,
        },
    }
}

#[cfg(test)]
mod tests {
    use chrono::NaiveDate;

    use super::*;
    use crate::crd::PetKind;

    fn thor() -> PetData {
        PetData {
            name: "Thor".into(),
            kind: PetKind::Dog,
            birthday: NaiveDate::from_ymd_opt(2021, 4, 1).expect("date"),
        }
    }

    fn record(id: &str, data: PetData) -> Option<Record> {
        Some(Record {
            id: id.into(),
            data,
        })
    }

    #[test]
    fn nothing_recorded_and_nothing_found_creates() {
        assert_eq!(
            decide(&thor(), Observed::ByKey { record: None }),
            Plan::Create
        );
    }

    #[test]
    fn recorded_id_that_vanished_recreates() {
        let observed = Observed::ById {
            id: "gone".into(),
            record: None,
        };
        assert_eq!(
            decide(&thor(), observed),
            Plan::Recreate {
                lost_id: "gone".into()
            }
        );
    }

    #[test]
    fn matching_record_needs_no_write() {
        let observed = Observed::ById {
            id: "a".into(),
            record: record("a", thor()),
        };
        assert_eq!(decide(&thor(), observed), Plan::InSync { id: "a".into() });
    }

    #[test]
    fn any_differing_field_updates_the_same_id() {
        let renamed = PetData {
            name: "Thorbert".into(),
            ..thor()
        };
        let retyped = PetData {
            kind: PetKind::Cat,
            ..thor()
        };
        let reborn = PetData {
            birthday: NaiveDate::from_ymd_opt(2021, 4, 2).expect("date"),
            ..thor()
        };
        for desired in [renamed, retyped, reborn] {
            let observed = Observed::ById {
                id: "a".into(),
                record: record("a", thor()),
            };
            assert_eq!(decide(&desired, observed), Plan::Update { id: "a".into() });
        }
    }

    #[test]
    fn lost_id_is_adopted_not_duplicated() {
        let observed = Observed::ByKey {
            record: record("a", thor()),
        };
        assert_eq!(
            decide(&thor(), observed),
            Plan::Adopt {
                id: "a".into(),
                update: false
            }
        );
    }

    #[test]
    fn adopted_record_that_drifted_is_also_updated() {
        let observed = Observed::ByKey {
            record: record("a", thor()),
        };
        let renamed = PetData {
            name: "Thorbert".into(),
            ..thor()
        };
        assert_eq!(
            decide(&renamed, observed),
            Plan::Adopt {
                id: "a".into(),
                update: true
            }
        );
    }
}
