//! How the backends keep a record: the bytes of the durable store's `pets`
//! table, and the species number both it and PostgreSQL's `species` column
//! hold. Existing files and databases fix these formats, so they are
//! declared here rather than borrowed from the wire messages, which may
//! change on their own terms.

use chrono::NaiveDate;
use prost::Message;

use super::StorageError;
use super::feed::{Change, ChangeKind};
use crate::model::{PetFields, PetRecord, ValidPetType};

/// A record in the durable store: byte for byte the `petstore.Pet` (with its
/// `google.type.Date`) that the store has always written, so every file
/// written before still opens, and still opens in an older server.
#[derive(Clone, PartialEq, Message)]
struct StoredPet {
    #[prost(string, tag = "1")]
    id: String,
    #[prost(string, tag = "2")]
    name: String,
    /// [`species_code`]; an enum field on the wire is an int32.
    #[prost(int32, tag = "3")]
    species: i32,
    #[prost(message, optional, tag = "4")]
    birthday: Option<StoredDate>,
    /// Empty for none.
    #[prost(string, tag = "5")]
    idempotency_key: String,
    /// Empty for none. Records written before identities existed lack the
    /// field and so decode without one; an older server skips it.
    #[prost(string, tag = "6")]
    identity: String,
    /// The owning tenant's namespace; empty for none. Records written
    /// before tenancy lack the field and so decode without a tenant; an
    /// older server skips it (and a record it rewrites loses it).
    #[prost(string, tag = "7")]
    tenant: String,
}

#[derive(Clone, PartialEq, Message)]
struct StoredDate {
    #[prost(int32, tag = "1")]
    year: i32,
    #[prost(int32, tag = "2")]
    month: i32,
    #[prost(int32, tag = "3")]
    day: i32,
}

/// A species as records hold it: its `PetType` number (1 to 4), which
/// protobuf's own compatibility rules already keep from changing.
pub(crate) fn species_code(species: ValidPetType) -> i32 {
    i32::from(species)
}

pub(crate) fn species_from_code(code: i32) -> Result<ValidPetType, StorageError> {
    ValidPetType::from_wire(code).ok_or_else(|| corrupt(format!("unknown species {code}")))
}

/// A stored record that does not decode: the file or the table was written
/// by something else.
pub(crate) fn corrupt(why: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> StorageError {
    StorageError::engine("decoding a stored pet", why)
}

/// A change in the durable store's `changes` table (keyed by revision): its
/// kind (the wire's `PetChange.Kind` number), the record's ID, and the
/// record after it as a [`StoredPet`]; for a deletion, the record as it was
/// just before. Deletions written by a store older than this lack the field
/// and decode without a record; an older server reads the field in a
/// deletion as it reads it in any change (it was always optional).
#[derive(Clone, PartialEq, Message)]
struct StoredChange {
    #[prost(int32, tag = "1")]
    kind: i32,
    #[prost(string, tag = "2")]
    id: String,
    #[prost(message, optional, tag = "3")]
    pet: Option<StoredPet>,
}

pub(crate) fn encode_change(change: &Change) -> Vec<u8> {
    StoredChange {
        kind: i32::from(change.kind.code()),
        id: change.id.clone(),
        pet: change.record.as_ref().map(stored),
    }
    .encode_to_vec()
}

pub(crate) fn decode_change(revision: i64, bytes: &[u8]) -> Result<Change, StorageError> {
    let stored = StoredChange::decode(bytes).map_err(corrupt)?;
    let kind = i16::try_from(stored.kind)
        .ok()
        .and_then(ChangeKind::from_code)
        .ok_or_else(|| {
            corrupt(format!(
                "change {revision} has unknown kind {}",
                stored.kind
            ))
        })?;
    Ok(Change {
        revision,
        kind,
        id: stored.id,
        record: stored.pet.map(from_stored).transpose()?,
    })
}

pub(crate) fn encode(record: &PetRecord) -> Vec<u8> {
    stored(record).encode_to_vec()
}

fn stored(record: &PetRecord) -> StoredPet {
    use chrono::Datelike;
    let birthday = record.fields.birthday;
    StoredPet {
        id: record.id.clone(),
        name: record.fields.name.clone(),
        species: species_code(record.fields.pet_type),
        birthday: Some(StoredDate {
            year: birthday.year(),
            // Both are at most 31, so the casts are lossless.
            month: birthday.month() as i32,
            day: birthday.day() as i32,
        }),
        idempotency_key: record.idempotency_key.clone().unwrap_or_default(),
        identity: record.identity.clone().unwrap_or_default(),
        tenant: record.tenant.clone(),
    }
}

pub(crate) fn decode(bytes: &[u8]) -> Result<PetRecord, StorageError> {
    from_stored(StoredPet::decode(bytes).map_err(corrupt)?)
}

fn from_stored(stored: StoredPet) -> Result<PetRecord, StorageError> {
    let birthday = stored
        .birthday
        .and_then(|d| {
            NaiveDate::from_ymd_opt(
                d.year,
                u32::try_from(d.month).ok()?,
                u32::try_from(d.day).ok()?,
            )
        })
        .ok_or_else(|| corrupt(format!("pet {:?} has no real birthday", stored.id)))?;
    Ok(PetRecord {
        fields: PetFields {
            name: stored.name,
            pet_type: species_from_code(stored.species)?,
            birthday,
        },
        idempotency_key: Some(stored.idempotency_key).filter(|key| !key.is_empty()),
        identity: Some(stored.identity).filter(|identity| !identity.is_empty()),
        tenant: stored.tenant,
        id: stored.id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record as the release before identities wrote it: Thor, key
    /// "uid-old", fields 1 to 5 only. Spelled out byte by byte, so a change
    /// to `StoredPet` cannot change what this test expects.
    const OLD_PET: &[u8] = b"\x0a\x06old-id\x12\x04Thor\x18\x01\
        \x22\x07\x08\xe5\x0f\x10\x04\x18\x01\x2a\x07uid-old";
    /// A KEY_CHANGED change of that release, holding that record.
    const OLD_CHANGE: &[u8] = b"\x08\x04\x12\x06old-id\x1a\x22\x0a\x06old-id\x12\x04Thor\x18\x01\
        \x22\x07\x08\xe5\x0f\x10\x04\x18\x01\x2a\x07uid-old";
    /// A DELETED change of that release: kind 3 and the ID, no record.
    const OLD_DELETE: &[u8] = b"\x08\x03\x12\x06old-id";

    fn old_record() -> PetRecord {
        PetRecord {
            id: "old-id".into(),
            fields: PetFields {
                name: "Thor".into(),
                pet_type: ValidPetType::Canine,
                birthday: NaiveDate::from_ymd_opt(2021, 4, 1).expect("date"),
            },
            idempotency_key: Some("uid-old".into()),
            identity: None,
            tenant: String::new(),
        }
    }

    #[test]
    fn records_from_before_identities_decode_and_encode_the_same() {
        let record = decode(OLD_PET).expect("an old record decodes");
        assert_eq!(record, old_record());
        assert_eq!(encode(&record), OLD_PET, "no identity adds no byte");
    }

    #[test]
    fn changes_from_before_identities_decode_and_encode_the_same() {
        let change = decode_change(7, OLD_CHANGE).expect("an old change decodes");
        assert_eq!(
            change,
            Change {
                revision: 7,
                kind: ChangeKind::KeyChanged,
                id: "old-id".into(),
                record: Some(old_record()),
            }
        );
        assert_eq!(encode_change(&change), OLD_CHANGE);
    }

    #[test]
    fn deletions_from_before_they_carried_the_record_decode_without_one() {
        let change = decode_change(9, OLD_DELETE).expect("an old deletion decodes");
        assert_eq!(
            change,
            Change {
                revision: 9,
                kind: ChangeKind::Deleted,
                id: "old-id".into(),
                record: None,
            }
        );
        assert_eq!(encode_change(&change), OLD_DELETE);
    }

    #[test]
    fn a_deletion_keeps_the_record_as_it_was() {
        let record = PetRecord {
            identity: Some("default/thor".into()),
            ..old_record()
        };
        let change = Change {
            revision: 9,
            kind: ChangeKind::Deleted,
            id: record.id.clone(),
            record: Some(record),
        };
        let bytes = encode_change(&change);
        assert_eq!(decode_change(9, &bytes).expect("decodes"), change);
        // The old deletion's bytes, then the record as field 3, the field
        // every other kind of change has always had: a server that wrote
        // deletions without it reads this one as it reads those.
        assert_eq!(&bytes[..OLD_DELETE.len()], OLD_DELETE);
        let old_shape = StoredChange::decode(&bytes[..]).expect("decodes");
        let pet = old_shape.pet.expect("the record");
        assert_eq!(
            (pet.idempotency_key.as_str(), pet.identity.as_str()),
            ("uid-old", "default/thor")
        );
    }

    #[test]
    fn a_tenant_is_field_7_and_records_without_one_keep_their_bytes() {
        let record = PetRecord {
            identity: Some("default/thor".into()),
            tenant: "default".into(),
            ..old_record()
        };
        let bytes = encode(&record);
        assert_eq!(decode(&bytes).expect("decodes"), record);
        let untenanted = encode(&PetRecord {
            tenant: String::new(),
            ..record
        });
        assert_eq!(&bytes[..untenanted.len()], untenanted.as_slice());
        assert_eq!(&bytes[untenanted.len()..], b"\x3a\x07default");
        // The release before tenancy reads it as a petstore.Pet, skipping
        // the field it does not know.
        use petstore_proto::petstore as pb;
        let pet = pb::Pet::decode(bytes.as_slice()).expect("a petstore.Pet");
        assert_eq!(pet.identity, "default/thor");
    }

    #[test]
    fn an_identity_is_field_6_of_a_petstore_pet() {
        use petstore_proto::petstore as pb;
        let record = PetRecord {
            identity: Some("default/thor".into()),
            ..old_record()
        };
        let bytes = encode(&record);
        assert_eq!(decode(&bytes).expect("decodes"), record);
        let pet = pb::Pet::decode(bytes.as_slice()).expect("a petstore.Pet");
        assert_eq!(
            (pet.identity.as_str(), pet.idempotency_key.as_str()),
            ("default/thor", "uid-old")
        );
        assert_eq!(&bytes[..OLD_PET.len()], OLD_PET, "appended after field 5");
    }
}
