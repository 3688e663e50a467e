//! `petstore.example.com/v1alpha1`, the first version: still served, and
//! deprecated in favour of [`super::v1`]. The operator never reads or writes
//! it; these types give the CRD its v1alpha1 schema, and the conversion
//! webhook turns v1alpha1 objects into v1 and back ([`super::conversion`]).

// Each printcolumn(...) repeats `type_ = "string"`, which this lint mistakes
// for a duplicated attribute.
#![allow(clippy::duplicated_attributes)]

use chrono::{DateTime, FixedOffset, NaiveDate};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{DeletionPolicy, MAX_NAME_CHARS, PetKind, PetStatus};

/// Printed by kubectl on every request that uses v1alpha1.
pub const DEPRECATION_WARNING: &str =
    "petstore.example.com/v1alpha1 Pet is deprecated; use petstore.example.com/v1";

/// The desired state of a pet in the pet store.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "petstore.example.com",
    version = "v1alpha1",
    kind = "Pet",
    plural = "pets",
    namespaced,
    doc = "A pet kept in the pet store. The operator creates a store record for it (or adopts the unowned record named by the annotation petstore.example.com/external-id), keeps that record in line with spec, writes the record's ID to status.id, and deletes the record when the Pet is deleted (unless spec.deletionPolicy is Orphan, which keeps the record and releases it for adoption).",
    status = "PetStatus",
    derive = "PartialEq",
    shortname = "pt",
    deprecated = "petstore.example.com/v1alpha1 Pet is deprecated; use petstore.example.com/v1",
    category = "petstore",
    printcolumn(
        name = "Pet Name",
        type_ = "string",
        json_path = ".spec.name",
        description = "The pet's name in the store"
    ),
    printcolumn(name = "Type", type_ = "string", json_path = ".spec.type"),
    printcolumn(name = "Birthday", type_ = "string", json_path = ".spec.birthday"),
    printcolumn(
        name = "Store ID",
        type_ = "string",
        json_path = ".status.id",
        description = "ID of the pet's record in the store"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].reason",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
pub struct PetSpec {
    /// The pet's name, as stored in the pet store: 1 to 128 characters, not
    /// only whitespace. Renaming a Pet renames its existing store record.
    #[schemars(length(min = 1, max = MAX_NAME_CHARS), regex(pattern = r"\S"))]
    pub name: String,

    /// The kind of animal: one of dog, cat, bird or reptile.
    #[serde(rename = "type")]
    pub kind: PetKind,

    /// The pet's date of birth, as an RFC 3339 timestamp such as
    /// 2021-04-01T00:00:00Z. Only the calendar date, as written, is stored.
    pub birthday: DateTime<FixedOffset>,

    /// What happens to the store record when the Pet is deleted: Delete
    /// (the default) deletes it; Orphan keeps it and clears its owner, so
    /// another Pet can adopt it with the annotation
    /// petstore.example.com/external-id.
    #[serde(
        default,
        rename = "deletionPolicy",
        skip_serializing_if = "Option::is_none"
    )]
    pub deletion_policy: Option<DeletionPolicy>,
}

impl PetSpec {
    /// The calendar date of birth as the user wrote it, in the timestamp's own
    /// offset, so `2021-04-01T00:00:00+02:00` is 1 April, not 31 March.
    pub fn birth_date(&self) -> NaiveDate {
        self.birthday.date_naive()
    }
}
