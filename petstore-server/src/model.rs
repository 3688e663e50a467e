//! The store's domain types and documented limits, independent of the wire
//! format and of any storage engine.

use chrono::NaiveDate;

// The valid types (`PetType` without `PTUnknown`, which is never valid) and the
// longest name, key and identity are shared with the operator's client, so
// both ends of the wire agree on them.
pub use petstore_proto::convert::{
    MAX_IDENTITY_CHARS, MAX_KEY_CHARS, MAX_NAME_CHARS, ValidPetType,
};

/// Most pets, IDs, keys or identities accepted in one repeated request field.
pub const MAX_BATCH: usize = 1000;
/// Largest gRPC message the server decodes or encodes.
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// The mutable part of a pet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PetFields {
    pub name: String,
    pub pet_type: ValidPetType,
    pub birthday: NaiveDate,
}

/// A pet to add.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewPet {
    pub fields: PetFields,
    pub idempotency_key: Option<String>,
    /// Unique in the store; a pet whose identity is held is not added.
    pub identity: Option<String>,
}

/// What adding one pet did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Added {
    pub id: String,
    /// False when the idempotency key (checked first) or the identity
    /// already named the pet `id`, which was left as it was.
    pub created: bool,
}

impl Added {
    pub fn new(id: String) -> Self {
        Self { id, created: true }
    }

    pub fn existing(id: String) -> Self {
        Self { id, created: false }
    }
}

/// A stored pet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PetRecord {
    pub id: String,
    pub fields: PetFields,
    pub idempotency_key: Option<String>,
    /// Unique in the store; kept when the key is released.
    pub identity: Option<String>,
    /// The namespace of the tenant that owns it (see `crate::tenancy`);
    /// empty for a record made with tenancy off, or before it existed.
    pub tenant: String,
}

/// A replacement of an existing pet's fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PetUpdate {
    pub id: String,
    pub fields: PetFields,
}

/// A conditional change of one pet's idempotency key, and optionally of its
/// identity: it applies only if the stored key is still `expected_key`. An
/// empty key means "no key".
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyChange {
    pub id: String,
    pub expected_key: String,
    pub new_key: String,
    /// `None` keeps the identity, `Some("")` clears it, else it is set.
    pub new_identity: Option<String>,
}

impl KeyChange {
    /// The identity this change gives its pet, if it gives one.
    pub fn identity_to_hold(&self) -> Option<&str> {
        self.new_identity.as_deref().filter(|i| !i.is_empty())
    }
}

/// A search: every non-empty criterion narrows the result.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SearchFilter {
    pub names: Vec<String>,
    pub types: Vec<ValidPetType>,
    /// Inclusive lower bound.
    pub born_on_or_after: Option<NaiveDate>,
    /// Exclusive upper bound.
    pub born_before: Option<NaiveDate>,
}

impl SearchFilter {
    pub fn matches(&self, pet: &PetFields) -> bool {
        (self.names.is_empty() || self.names.contains(&pet.name))
            && (self.types.is_empty() || self.types.contains(&pet.pet_type))
            && self
                .born_on_or_after
                .is_none_or(|start| pet.birthday >= start)
            && self.born_before.is_none_or(|end| pet.birthday < end)
    }
}

/// Longest installation name and holder a claim accepts.
pub const MAX_CLAIM_CHARS: usize = 128;
/// Longest claim, in seconds: an hour.
pub const MAX_CLAIM_TTL_SECONDS: i64 = 3600;

/// A request to claim an installation's name (see `ClaimInstallation`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstallationClaim {
    pub installation: String,
    pub holder: String,
    /// 1 to [`MAX_CLAIM_TTL_SECONDS`].
    pub ttl_seconds: i64,
}

/// Who holds an installation's name after a claim, and until when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimOutcome {
    /// The claimant holds it now.
    pub granted: bool,
    pub holder: String,
    /// Milliseconds since the Unix epoch, by the store's clock.
    pub expires_at_unix_millis: i64,
    /// From the store's now until then.
    pub remaining_millis: i64,
}

impl ClaimOutcome {
    /// The decision every backend makes on the claim held now (`None`:
    /// never claimed), at `now` (ms since the epoch, the store's clock):
    /// the claimant wins a free or expired name, or renews its own.
    pub fn decide(
        claim: &InstallationClaim,
        held: Option<(&str, i64)>,
        now_unix_millis: i64,
    ) -> Self {
        match held {
            Some((holder, expires)) if holder != claim.holder && expires > now_unix_millis => {
                Self {
                    granted: false,
                    holder: holder.to_owned(),
                    expires_at_unix_millis: expires,
                    remaining_millis: expires - now_unix_millis,
                }
            }
            _ => {
                let ttl = claim.ttl_seconds.saturating_mul(1000);
                Self {
                    granted: true,
                    holder: claim.holder.clone(),
                    expires_at_unix_millis: now_unix_millis.saturating_add(ttl),
                    remaining_millis: ttl,
                }
            }
        }
    }
}

/// The store's clock, for the backends that keep their own (PostgreSQL
/// reads the database's).
pub fn now_unix_millis() -> i64 {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since_epoch.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pet(name: &str, pet_type: ValidPetType, y: i32, m: u32, d: u32) -> PetFields {
        PetFields {
            name: name.into(),
            pet_type,
            birthday: NaiveDate::from_ymd_opt(y, m, d).expect("valid test date"),
        }
    }

    #[test]
    fn empty_filter_matches_everything() {
        assert!(SearchFilter::default().matches(&pet("Thor", ValidPetType::Canine, 2021, 4, 1)));
    }

    #[test]
    fn every_criterion_narrows() {
        let thor = pet("Thor", ValidPetType::Canine, 2021, 4, 1);
        let by_name = SearchFilter {
            names: vec!["Tron".into()],
            ..Default::default()
        };
        assert!(!by_name.matches(&thor));
        let by_type = SearchFilter {
            types: vec![ValidPetType::Feline, ValidPetType::Bird],
            ..Default::default()
        };
        assert!(!by_type.matches(&thor));
        let both = SearchFilter {
            names: vec!["Thor".into()],
            types: vec![ValidPetType::Canine],
            ..Default::default()
        };
        assert!(both.matches(&thor));
    }

    #[test]
    fn birthday_range_is_start_inclusive_end_exclusive() {
        let day = |d| NaiveDate::from_ymd_opt(2021, 4, d).expect("valid test date");
        let range = SearchFilter {
            born_on_or_after: Some(day(1)),
            born_before: Some(day(3)),
            ..Default::default()
        };
        assert!(range.matches(&pet("a", ValidPetType::Bird, 2021, 4, 1)));
        assert!(range.matches(&pet("b", ValidPetType::Bird, 2021, 4, 2)));
        assert!(!range.matches(&pet("c", ValidPetType::Bird, 2021, 4, 3)));
        assert!(!range.matches(&pet("d", ValidPetType::Bird, 2021, 3, 31)));
    }

    #[test]
    fn a_claim_wins_a_free_or_expired_name_or_renews_its_own() {
        let claim = |holder: &str| InstallationClaim {
            installation: "blue".into(),
            holder: holder.into(),
            ttl_seconds: 60,
        };
        let granted = ClaimOutcome::decide(&claim("a"), None, 1_000);
        assert_eq!(
            granted,
            ClaimOutcome {
                granted: true,
                holder: "a".into(),
                expires_at_unix_millis: 61_000,
                remaining_millis: 60_000,
            }
        );
        // Renewal runs from now, not from the old expiry.
        let renewed = ClaimOutcome::decide(&claim("a"), Some(("a", 61_000)), 30_000);
        assert_eq!(
            (renewed.granted, renewed.expires_at_unix_millis),
            (true, 90_000)
        );
        let refused = ClaimOutcome::decide(&claim("b"), Some(("a", 61_000)), 30_000);
        assert_eq!(
            refused,
            ClaimOutcome {
                granted: false,
                holder: "a".into(),
                expires_at_unix_millis: 61_000,
                remaining_millis: 31_000,
            }
        );
        // Expired at its expiry instant, not a millisecond later.
        let taken = ClaimOutcome::decide(&claim("b"), Some(("a", 61_000)), 61_000);
        assert_eq!((taken.granted, taken.holder.as_str()), (true, "b"));
    }
}
