//! Load shedding: a bound on the requests the store answers at once
//! (`--max-concurrent-requests`). A request beyond it is refused at once
//! with `RESOURCE_EXHAUSTED` and a `grpc-retry-pushback-ms` trailer (gRPC's
//! retry pushback, which the operator honours), instead of queueing without
//! bound behind the storage, where every caller's latency and the store's
//! memory would grow together.
//!
//! `WatchPets` streams are not counted (they last as long as their client
//! and have their own bound, see [`crate::watch`]), nor are health checks
//! and reflection, so probes keep answering under load.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::Status;
use tonic::metadata::{MetadataMap, MetadataValue};

/// The default bound: far above what the operator sends (its own budget
/// bursts to 500), low enough that a flood is refused, not queued.
pub const DEFAULT_MAX_CONCURRENT_REQUESTS: usize = 1024;
/// How long a refused client is asked to wait before trying again.
pub const RETRY_PUSHBACK: Duration = Duration::from_millis(100);
/// gRPC's retry pushback trailer (gRFC A6).
pub const PUSHBACK_TRAILER: &str = "grpc-retry-pushback-ms";

/// Admits up to `limit` requests at once; see the module's documentation.
#[derive(Clone, Debug)]
pub struct Admission {
    permits: Arc<Semaphore>,
    limit: usize,
}

/// Holds a request's place until dropped (for a search, with its stream).
pub type Admitted = OwnedSemaphorePermit;

impl Admission {
    pub fn new(limit: usize) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(limit)),
            limit,
        }
    }

    /// A place for one request, or the refusal to send.
    pub fn admit(&self) -> Result<Admitted, Status> {
        Arc::clone(&self.permits).try_acquire_owned().map_err(|_| {
            let mut trailers = MetadataMap::new();
            trailers.insert(
                PUSHBACK_TRAILER,
                MetadataValue::from(RETRY_PUSHBACK.as_millis() as u64),
            );
            Status::with_metadata(
                tonic::Code::ResourceExhausted,
                format!(
                    "the pet store is answering its limit of {} requests at once (--max-concurrent-requests); retry after {} ms",
                    self.limit,
                    RETRY_PUSHBACK.as_millis()
                ),
                trailers,
            )
        })
    }
}

impl Default for Admission {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_CONCURRENT_REQUESTS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn beyond_the_limit_a_request_is_refused_with_a_pushback_until_one_ends() {
        let admission = Admission::new(2);
        let first = admission.admit().expect("first");
        let _second = admission.admit().expect("second");
        let refused = admission.admit().expect_err("third");
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert!(refused.message().contains("limit of 2"), "{refused:?}");
        assert_eq!(
            refused
                .metadata()
                .get(PUSHBACK_TRAILER)
                .and_then(|v| v.to_str().ok()),
            Some("100")
        );
        drop(first);
        assert!(admission.admit().is_ok(), "a place freed is taken again");
    }
}
