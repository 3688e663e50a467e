//! Conversions between the CRD's types and the store's wire types.

use chrono::{Datelike, NaiveDate};
use petstore_proto::google::r#type::Date;
use petstore_proto::petstore::{self as pb, PetType};

use super::{PetData, Record};
use crate::crd::PetKind;

pub fn pet_type(kind: PetKind) -> PetType {
    match kind {
        PetKind::Dog => PetType::PtCanine,
        PetKind::Cat => PetType::PtFeline,
        PetKind::Bird => PetType::PtBird,
        PetKind::Reptile => PetType::PtReptile,
    }
}

pub fn pet_kind(value: i32) -> Option<PetKind> {
    match PetType::try_from(value).ok()? {
        PetType::PtUnknown => None,
        PetType::PtCanine => Some(PetKind::Dog),
        PetType::PtFeline => Some(PetKind::Cat),
        PetType::PtBird => Some(PetKind::Bird),
        PetType::PtReptile => Some(PetKind::Reptile),
    }
}

pub fn to_date(date: NaiveDate) -> Date {
    Date {
        year: date.year(),
        // month() and day() are at most 31, so the casts are lossless.
        month: date.month() as i32,
        day: date.day() as i32,
    }
}

pub fn from_date(date: &Date) -> Option<NaiveDate> {
    NaiveDate::from_ymd_opt(
        date.year,
        u32::try_from(date.month).ok()?,
        u32::try_from(date.day).ok()?,
    )
}

pub fn to_proto(id: &str, key: &str, pet: &PetData) -> pb::Pet {
    pb::Pet {
        id: id.to_owned(),
        name: pet.name.clone(),
        r#type: pet_type(pet.kind).into(),
        birthday: Some(to_date(pet.birthday)),
        idempotency_key: key.to_owned(),
    }
}

/// `None` if the store returned something no valid Pet can describe.
pub fn from_proto(pet: &pb::Pet) -> Option<Record> {
    Some(Record {
        id: pet.id.clone(),
        // Ownership is decided by the key, so it must never be dropped here.
        key: pet.idempotency_key.clone(),
        data: PetData {
            name: pet.name.clone(),
            kind: pet_kind(pet.r#type)?,
            birthday: from_date(pet.birthday.as_ref()?)?,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::PetSpec;

    #[test]
    fn every_kind_round_trips_and_matches_the_wire_names() {
        let expected = [
            (PetKind::Dog, "PTCanine"),
            (PetKind::Cat, "PTFeline"),
            (PetKind::Bird, "PTBird"),
            (PetKind::Reptile, "PTReptile"),
        ];
        for (kind, wire) in expected {
            assert_eq!(pet_type(kind).as_str_name(), wire);
            assert_eq!(pet_kind(pet_type(kind).into()), Some(kind));
        }
        assert_eq!(pet_kind(PetType::PtUnknown.into()), None);
        assert_eq!(pet_kind(99), None);
    }

    #[test]
    fn birthday_uses_the_date_as_written_in_its_own_offset() {
        let spec = |birthday: &str| -> PetSpec {
            serde_json::from_value(serde_json::json!({
                "name": "Thor", "type": "dog", "birthday": birthday
            }))
            .expect("valid spec")
        };
        let date = |s: &str| to_date(PetData::from(&spec(s)).birthday);
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
        let data = PetData {
            name: "Tron".into(),
            kind: PetKind::Cat,
            birthday: NaiveDate::from_ymd_opt(2020, 6, 25).expect("date"),
        };
        let proto = to_proto("id-1", "uid-1", &data);
        assert_eq!(proto.idempotency_key, "uid-1");
        let record = from_proto(&proto).expect("valid record");
        assert_eq!(record.id, "id-1");
        assert_eq!(record.key, "uid-1", "the owner's key is kept");
        assert_eq!(record.data, data);
    }

    #[test]
    fn invalid_store_data_is_not_mistaken_for_a_pet() {
        let mut proto = to_proto(
            "id",
            "",
            &PetData {
                name: "x".into(),
                kind: PetKind::Bird,
                birthday: NaiveDate::from_ymd_opt(2020, 1, 1).expect("date"),
            },
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
