//! Conversions and limits that both ends of the wire share, so the store's
//! validation and the operator's client cannot drift apart: the valid
//! `PetType`s, `google.type.Date` to and from a calendar date, and the
//! longest name, key and identity the store accepts.

use chrono::{Datelike, NaiveDate};

use crate::google::r#type::Date;
use crate::petstore::PetType;

/// Longest pet name, in characters (not bytes).
pub const MAX_NAME_CHARS: usize = 128;
/// Longest idempotency key, in characters.
pub const MAX_KEY_CHARS: usize = 128;
/// Longest identity, in characters: a Kubernetes namespace (63), a slash and
/// a name (253) fit.
pub const MAX_IDENTITY_CHARS: usize = 320;

/// A type the store accepts: the wire's `PetType` without its `PT_UNKNOWN`
/// zero value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ValidPetType {
    Canine,
    Feline,
    Bird,
    Reptile,
}

impl ValidPetType {
    pub const ALL: [ValidPetType; 4] = [
        ValidPetType::Canine,
        ValidPetType::Feline,
        ValidPetType::Bird,
        ValidPetType::Reptile,
    ];

    /// The type a wire `type` field names; `None` for `PT_UNKNOWN` and
    /// for numbers the enum does not define.
    pub fn from_wire(value: i32) -> Option<ValidPetType> {
        match PetType::try_from(value).ok()? {
            PetType::PtUnknown => None,
            PetType::PtCanine => Some(ValidPetType::Canine),
            PetType::PtFeline => Some(ValidPetType::Feline),
            PetType::PtBird => Some(ValidPetType::Bird),
            PetType::PtReptile => Some(ValidPetType::Reptile),
        }
    }
}

impl From<ValidPetType> for PetType {
    fn from(valid: ValidPetType) -> PetType {
        match valid {
            ValidPetType::Canine => PetType::PtCanine,
            ValidPetType::Feline => PetType::PtFeline,
            ValidPetType::Bird => PetType::PtBird,
            ValidPetType::Reptile => PetType::PtReptile,
        }
    }
}

impl From<ValidPetType> for i32 {
    fn from(valid: ValidPetType) -> i32 {
        PetType::from(valid).into()
    }
}

/// Why a `google.type.Date` is not a calendar date the store keeps.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DateError {
    #[error("year {0} is outside 1..=9999")]
    YearOutOfRange(i32),
    #[error("{year:04}-{month:02}-{day:02} is not a real date")]
    NotARealDate { year: i32, month: i32, day: i32 },
}

impl From<NaiveDate> for Date {
    fn from(date: NaiveDate) -> Date {
        Date {
            year: date.year(),
            // month() and day() are at most 31, so the casts are lossless.
            month: date.month() as i32,
            day: date.day() as i32,
        }
    }
}

impl Date {
    /// The calendar date, if every part is set and real. Years are 1..=9999,
    /// as `google.type.Date` defines them; a partial date (a zero part) is
    /// refused, since a birthday is a whole date.
    pub fn to_naive(&self) -> Result<NaiveDate, DateError> {
        if !(1..=9999).contains(&self.year) {
            return Err(DateError::YearOutOfRange(self.year));
        }
        let not_real = || DateError::NotARealDate {
            year: self.year,
            month: self.month,
            day: self.day,
        };
        let month = u32::try_from(self.month).map_err(|_| not_real())?;
        let day = u32::try_from(self.day).map_err(|_| not_real())?;
        NaiveDate::from_ymd_opt(self.year, month, day).ok_or_else(not_real)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_valid_type_round_trips_through_the_wire() {
        for valid in ValidPetType::ALL {
            assert_eq!(ValidPetType::from_wire(i32::from(valid)), Some(valid));
        }
        assert_eq!(ValidPetType::from_wire(PetType::PtUnknown.into()), None);
        assert_eq!(ValidPetType::from_wire(99), None);
    }

    #[test]
    fn dates_round_trip_and_impossible_ones_are_named() {
        let day = NaiveDate::from_ymd_opt(2021, 4, 1).expect("a real date");
        assert_eq!(Date::from(day).to_naive(), Ok(day));
        let bad = Date {
            year: 2021,
            month: 2,
            day: 30,
        };
        assert_eq!(
            bad.to_naive().unwrap_err().to_string(),
            "2021-02-30 is not a real date"
        );
        let negative = Date {
            year: 2021,
            month: -1,
            day: 1,
        };
        assert!(negative.to_naive().is_err());
        let zero_year = Date {
            year: 0,
            month: 1,
            day: 1,
        };
        assert_eq!(zero_year.to_naive(), Err(DateError::YearOutOfRange(0)));
    }
}
