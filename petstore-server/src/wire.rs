//! The domain as the wire shows it, for answers. The other direction, with
//! its checks, is `validate`.

use petstore_proto::petstore as pb;

use crate::model::PetRecord;
use crate::storage::{Change, ChangeKind};

pub fn to_proto(record: &PetRecord) -> pb::Pet {
    pb::Pet {
        id: record.id.clone(),
        name: record.fields.name.clone(),
        r#type: record.fields.pet_type.into(),
        birthday: Some(record.fields.birthday.into()),
        idempotency_key: record.idempotency_key.clone().unwrap_or_default(),
        identity: record.identity.clone().unwrap_or_default(),
    }
}

pub fn change_to_proto(change: &Change) -> pb::PetChange {
    let kind = match change.kind {
        ChangeKind::Created => pb::pet_change::Kind::Created,
        ChangeKind::Updated => pb::pet_change::Kind::Updated,
        ChangeKind::Deleted => pb::pet_change::Kind::Deleted,
        ChangeKind::KeyChanged => pb::pet_change::Kind::KeyChanged,
    };
    pb::PetChange {
        kind: kind.into(),
        revision: change.revision,
        pet: change.record.as_ref().map(to_proto),
        id: change.id.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate;

    #[test]
    fn a_validated_pet_comes_back_as_it_was_sent() {
        let sent = pb::Pet {
            idempotency_key: "uid-1".into(),
            identity: "default/thor".into(),
            ..validate::tests::thor()
        };
        let new = validate::add_request(&pb::AddPetsReq {
            pets: vec![sent.clone()],
        })
        .expect("valid")
        .remove(0);
        let record = PetRecord {
            id: "abc".into(),
            fields: new.fields,
            idempotency_key: new.idempotency_key,
            identity: new.identity,
            tenant: "default".into(),
        };
        assert_eq!(
            to_proto(&record),
            pb::Pet {
                id: "abc".into(),
                ..sent
            }
        );
        let keyless = PetRecord {
            idempotency_key: None,
            identity: None,
            ..record
        };
        assert_eq!(to_proto(&keyless).idempotency_key, "");
        assert_eq!(to_proto(&keyless).identity, "");
    }
}
