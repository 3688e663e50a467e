//! One storage contract, several engines. The gRPC layer only sees
//! [`Storage`]; the same conformance tests run against every backend.

mod durable;
mod memory;

use std::path::PathBuf;
use std::sync::Arc;

pub use durable::DurableStorage;
pub use memory::MemoryStorage;

use crate::model::{NewPet, PetRecord, PetUpdate, SearchFilter};

#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// An update named a pet that does not exist; nothing was changed.
    #[error("no pet with ID {id:?}")]
    NotFound { index: usize, id: String },
    #[error("storage engine failed while {action}: {source}")]
    Engine {
        action: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("storage writer has stopped")]
    WriterGone,
}

impl StorageError {
    pub(crate) fn engine(
        action: &'static str,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self::Engine {
            action,
            source: source.into(),
        }
    }
}

/// A pet store backend. Every write is atomic: it applies whole or not at all.
#[tonic::async_trait]
pub trait Storage: Send + Sync + 'static {
    /// Adds pets and returns their IDs in order. A pet whose idempotency key is
    /// already stored (or appears earlier in the same batch) gets the existing
    /// ID and is not added again.
    async fn add(&self, pets: Vec<NewPet>) -> Result<Vec<String>, StorageError>;
    /// Replaces the fields of existing pets; fails with `NotFound`, changing
    /// nothing, if any ID is unknown.
    async fn update(&self, pets: Vec<PetUpdate>) -> Result<(), StorageError>;
    /// Deletes pets (and their idempotency keys); unknown IDs are ignored.
    async fn delete(&self, ids: Vec<String>) -> Result<(), StorageError>;
    /// Looks pets up by ID; `None` where an ID is unknown.
    async fn get(&self, ids: Vec<String>) -> Result<Vec<Option<PetRecord>>, StorageError>;
    /// Looks pets up by idempotency key; `None` where a key is unknown.
    async fn get_by_keys(&self, keys: Vec<String>) -> Result<Vec<Option<PetRecord>>, StorageError>;
    /// Every pet that matches the filter.
    async fn search(&self, filter: SearchFilter) -> Result<Vec<PetRecord>, StorageError>;
}

/// Which backend to open.
#[derive(Clone, Debug)]
pub enum StorageConfig {
    Memory,
    Durable { path: PathBuf },
}

impl StorageConfig {
    pub fn open(&self) -> Result<Arc<dyn Storage>, StorageError> {
        Ok(match self {
            Self::Memory => Arc::new(MemoryStorage::default()),
            Self::Durable { path } => Arc::new(DurableStorage::open(path)?),
        })
    }
}

fn new_id() -> String {
    uuid::Uuid::new_v4().to_string()
}
