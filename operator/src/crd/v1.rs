//! `petstore.example.com/v1`, the storage version: what the operator reads
//! and writes, and what `kubectl get pets` shows. It differs from
//! [`super::v1alpha1`] only in `spec.birthday`, a calendar date (see
//! docs/versions.md).

// Each printcolumn(...) repeats `type_ = "string"`, which this lint mistakes
// for a duplicated attribute.
#![allow(clippy::duplicated_attributes)]

use chrono::NaiveDate;

use super::{ChangePolicy, DeletionPolicy, MAX_NAME_CHARS, PetStatus, PetType, StoreRef};

pet_version! {
    version = "v1",
    /// The pet's date of birth, a calendar date such as 2021-04-01.
    birthday: NaiveDate,
}

impl PetSpec {
    /// The calendar date of birth, as the store keeps it.
    pub fn birth_date(&self) -> NaiveDate {
        self.birthday
    }
}
