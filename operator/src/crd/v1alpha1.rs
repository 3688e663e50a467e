//! `petstore.example.com/v1alpha1`, the first version: still served, and
//! deprecated in favour of [`super::v1`]. The operator never reads or writes
//! it; these types give the CRD its v1alpha1 schema, and the conversion
//! webhook turns v1alpha1 objects into v1 and back ([`super::conversion`]).

// Each printcolumn(...) repeats `type_ = "string"`, which this lint mistakes
// for a duplicated attribute.
#![allow(clippy::duplicated_attributes)]

use chrono::{DateTime, FixedOffset, NaiveDate};

use super::{ChangePolicy, DeletionPolicy, MAX_NAME_CHARS, PetStatus, PetType, StoreRef};

/// Printed by kubectl on every request that uses v1alpha1.
pub const DEPRECATION_WARNING: &str =
    "petstore.example.com/v1alpha1 Pet is deprecated; use petstore.example.com/v1";

pet_version! {
    version = "v1alpha1",
    deprecated = "petstore.example.com/v1alpha1 Pet is deprecated; use petstore.example.com/v1",
    /// The pet's date of birth, as an RFC 3339 timestamp such as
    /// 2021-04-01T00:00:00Z. Only the calendar date, as written, is stored.
    birthday: DateTime<FixedOffset>,
}

impl PetSpec {
    /// The calendar date of birth as the user wrote it, in the timestamp's own
    /// offset, so `2021-04-01T00:00:00+02:00` is 1 April, not 31 March.
    pub fn birth_date(&self) -> NaiveDate {
        self.birthday.date_naive()
    }
}
