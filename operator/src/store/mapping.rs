//! Conversions between the CRD's types and the store's wire types. The
//! type and date rules are the wire contract's own
//! ([`petstore_proto::convert`]), which the store validates with too.

use petstore_proto::convert::ValidPetType;
use petstore_proto::petstore as pb;

use super::{PetData, Record};
use crate::crd::PetType;

impl From<PetType> for ValidPetType {
    fn from(pet_type: PetType) -> ValidPetType {
        match pet_type {
            PetType::Dog => ValidPetType::Canine,
            PetType::Cat => ValidPetType::Feline,
            PetType::Bird => ValidPetType::Bird,
            PetType::Reptile => ValidPetType::Reptile,
        }
    }
}

impl From<ValidPetType> for PetType {
    fn from(valid: ValidPetType) -> PetType {
        match valid {
            ValidPetType::Canine => PetType::Dog,
            ValidPetType::Feline => PetType::Cat,
            ValidPetType::Bird => PetType::Bird,
            ValidPetType::Reptile => PetType::Reptile,
        }
    }
}

pub fn to_proto(id: &str, key: &str, identity: &str, pet: &PetData) -> pb::Pet {
    pb::Pet {
        id: id.to_owned(),
        name: pet.name.clone(),
        r#type: ValidPetType::from(pet.pet_type).into(),
        birthday: Some(pet.birthday.into()),
        idempotency_key: key.to_owned(),
        identity: identity.to_owned(),
    }
}

/// `None` if the store returned something no valid Pet can describe.
pub fn from_proto(pet: &pb::Pet) -> Option<Record> {
    Some(Record {
        id: pet.id.clone(),
        // Ownership is decided by the key, so it must never be dropped here.
        key: super::Owner::parse(&pet.idempotency_key),
        identity: pet.identity.clone(),
        data: PetData {
            name: pet.name.clone(),
            pet_type: ValidPetType::from_wire(pet.r#type)?.into(),
            birthday: pet.birthday.as_ref()?.to_naive().ok()?,
        },
    })
}

#[cfg(test)]
mod tests {
    use petstore_proto::google::r#type::Date;
    use petstore_proto::petstore::PetType as WirePetType;

    use super::*;
    use crate::crd::v1alpha1::PetSpec;

    #[test]
    fn every_type_round_trips_and_matches_the_wire_names() {
        let expected = [
            (PetType::Dog, "PTCanine"),
            (PetType::Cat, "PTFeline"),
            (PetType::Bird, "PTBird"),
            (PetType::Reptile, "PTReptile"),
        ];
        for (pet_type, wire) in expected {
            assert_eq!(
                WirePetType::from(ValidPetType::from(pet_type)).as_str_name(),
                wire
            );
            assert_eq!(PetType::from(ValidPetType::from(pet_type)), pet_type);
        }
        let data = PetData::named("x").of_type(PetType::Bird).born(2020, 1, 1);
        for unknown in [WirePetType::PtUnknown.into(), 99] {
            let proto = pb::Pet {
                r#type: unknown,
                ..to_proto("id", "", "", &data)
            };
            assert!(from_proto(&proto).is_none(), "type {unknown}");
        }
    }

    #[test]
    fn birthday_uses_the_date_as_written_in_its_own_offset() {
        let spec = |birthday: &str| -> PetSpec {
            serde_json::from_value(serde_json::json!({
                "name": "Thor", "type": "dog", "birthday": birthday
            }))
            .expect("valid spec")
        };
        let date = |s: &str| Date::from(spec(s).birth_date());
        let april_first = Date {
            year: 2021,
            month: 4,
            day: 1,
        };
        assert_eq!(date("2021-04-01T00:00:00Z"), april_first);
        assert_eq!(date("2021-04-01T23:59:59Z"), april_first);
        // Midnight at +02:00 is still 31 March in UTC; the user meant 1 April.
        assert_eq!(date("2021-04-01T00:00:00+02:00"), april_first);
        assert_eq!(date("2021-04-01T22:00:00-05:00"), april_first);
    }

    #[test]
    fn proto_round_trip_keeps_the_data() {
        let data = PetData::named("Tron")
            .of_type(PetType::Cat)
            .born(2020, 6, 25);
        let proto = to_proto("id-1", "uid-1", "default/thor", &data);
        assert_eq!(proto.idempotency_key, "uid-1");
        let record = from_proto(&proto).expect("valid record");
        assert_eq!(record.id, "id-1");
        assert_eq!(record.key, "uid-1", "the owner's key is kept");
        assert_eq!(record.identity, "default/thor", "and its identity");
        assert_eq!(record.data, data);
    }

    #[test]
    fn invalid_store_data_is_not_mistaken_for_a_pet() {
        let mut proto = to_proto(
            "id",
            "",
            "",
            &PetData::named("x").of_type(PetType::Bird).born(2020, 1, 1),
        );
        proto.birthday = Some(Date {
            year: 2021,
            month: 2,
            day: 30,
        });
        assert!(from_proto(&proto).is_none());
        proto.birthday = None;
        assert!(from_proto(&proto).is_none());
    }
}
