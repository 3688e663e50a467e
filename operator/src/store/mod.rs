//! The external-client contract the reconciler depends on, after Crossplane's
//! managed-resource clients: observe by ID, find by idempotency key, create,
//! update, delete. [`grpc::GrpcPetStore`] is the real one; tests use a fake.

pub mod grpc;
pub mod mapping;

#[cfg(test)]
pub mod fake;

use chrono::NaiveDate;

use crate::crd::{PetKind, PetSpec};

/// A pet's data as the store holds it; what reconciliation compares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PetData {
    pub name: String,
    pub kind: PetKind,
    pub birthday: NaiveDate,
}

impl From<&PetSpec> for PetData {
    fn from(spec: &PetSpec) -> Self {
        Self {
            name: spec.name.clone(),
            kind: spec.kind,
            birthday: spec.birth_date(),
        }
    }
}

/// A record observed in the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub id: String,
    pub data: PetData,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store could not be reached or did not answer in time; retry later.
    #[error("pet store unavailable during {operation}: {message}")]
    Unavailable {
        operation: &'static str,
        message: String,
    },
    /// The store refused the request as invalid; retrying the same spec
    /// cannot succeed.
    #[error("pet store rejected {operation}: {message}")]
    Rejected {
        operation: &'static str,
        message: String,
    },
    /// The record to update does not exist (deleted meanwhile).
    #[error("pet store has no record {id:?}")]
    NotFound { id: String },
    /// Any other failure; treated as transient.
    #[error("pet store failed during {operation}: {message}")]
    Failed {
        operation: &'static str,
        message: String,
    },
}

impl StoreError {
    /// True when only a change of the Pet's spec can help.
    pub fn is_terminal(&self) -> bool {
        matches!(self, Self::Rejected { .. })
    }
}

/// The operations reconciliation needs from the pet store. Every one is
/// idempotent, so a retry after a crash or timeout is always safe.
#[tonic::async_trait]
pub trait PetStore: Send + Sync + 'static {
    /// The record with this ID, or `None` if it does not exist.
    async fn observe(&self, id: &str) -> Result<Option<Record>, StoreError>;
    /// The record created with this idempotency key, if any.
    async fn find_by_key(&self, key: &str) -> Result<Option<Record>, StoreError>;
    /// Creates a record, or returns the ID of the one already created with
    /// this key.
    async fn create(&self, key: &str, pet: &PetData) -> Result<String, StoreError>;
    /// Replaces the record's data.
    async fn update(&self, id: &str, pet: &PetData) -> Result<(), StoreError>;
    /// Deletes the record; a missing record counts as deleted.
    async fn delete(&self, id: &str) -> Result<(), StoreError>;
}
