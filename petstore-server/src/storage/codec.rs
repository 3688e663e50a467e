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
/// record after it as a [`StoredPet`] (absent for a deletion).
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
        id: stored.id,
    })
}
