//! petstore-operator: reconciles `Pet` resources into the gRPC pet store.
//!
//! - [`crd`]: the `Pet` custom resource types.
//! - [`decision`]: the pure decision step (desired vs observed -> plan).
//! - [`status`]: the pure status and condition rules.
//! - [`store`]: the external-client contract and its gRPC implementation.
//! - [`controller`]: the Kubernetes glue: watch, finalizer, status, events.
//! - [`events`]: the background Event queue.
//! - [`leader`]: Lease-based leader election.
//! - [`metrics`]: Prometheus metrics and health endpoints.

pub mod controller;
pub mod crd;
pub mod decision;
pub mod events;
pub mod leader;
pub mod metrics;
pub mod status;
pub mod store;

use store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Store(#[from] StoreError),

    #[error("writing the status of Pet {name}: {source}")]
    WriteStatus {
        name: String,
        #[source]
        source: kube::Error,
    },

    #[error("adding the finalizer to Pet {name}: {source}")]
    AddFinalizer {
        name: String,
        #[source]
        source: kube::Error,
    },

    #[error("Pet {0} has no namespace or UID")]
    MalformedPet(String),

    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
}

impl Error {
    /// A short, bounded label for the errors metric.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Store(StoreError::Unavailable { .. }) => "store_unavailable",
            Error::Store(StoreError::Rejected { .. }) => "store_rejected",
            Error::Store(StoreError::NotFound { .. }) => "store_not_found",
            Error::Store(StoreError::Failed { .. }) => "store_failed",
            Error::WriteStatus { .. } => "status_write",
            Error::AddFinalizer { .. } => "add_finalizer",
            Error::MalformedPet(_) => "malformed_pet",
            Error::Finalizer(inner) => match inner.as_ref() {
                kube::runtime::finalizer::Error::ApplyFailed(e)
                | kube::runtime::finalizer::Error::CleanupFailed(e) => e.metric_label(),
                kube::runtime::finalizer::Error::AddFinalizer(_) => "add_finalizer",
                kube::runtime::finalizer::Error::RemoveFinalizer(_) => "remove_finalizer",
                _ => "finalizer",
            },
        }
    }
}
