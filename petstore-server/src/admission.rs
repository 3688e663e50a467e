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
//!
//! Applied as a tower layer ([`AdmissionLayer`]) around the gRPC server: a
//! call holds its place until its answer, body included, is sent or
//! dropped, so a search holds it for as long as its stream lasts.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body::{Frame, SizeHint};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::Status;
use tonic::body::Body;
use tonic::codegen::{Bytes, http};
use tonic::metadata::{MetadataMap, MetadataValue};
use tower::{Layer, Service};

use crate::rpc;

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

/// Bounds the pet store's calls by an [`Admission`], or lets every call
/// through with none.
#[derive(Clone, Debug, Default)]
pub struct AdmissionLayer(pub Option<Admission>);

impl<S> Layer<S> for AdmissionLayer {
    type Service = Admitting<S>;

    fn layer(&self, inner: S) -> Admitting<S> {
        Admitting {
            inner,
            admission: self.0.clone(),
        }
    }
}

/// A service whose pet store calls (but `WatchPets`) need a place.
#[derive(Clone, Debug)]
pub struct Admitting<S> {
    inner: S,
    admission: Option<Admission>,
}

/// Whether a call to `path` takes a place: the pet store's RPCs but
/// `WatchPets`.
fn counted(path: &str) -> bool {
    rpc::by_path(path).is_some_and(|rpc| rpc.method != "WatchPets")
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> Service<http::Request<B>> for Admitting<S>
where
    S: Service<http::Request<B>, Response = http::Response<Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<http::Response<Body>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let admitted = match &self.admission {
            Some(admission) if counted(request.uri().path()) => admission.admit(),
            _ => return Box::pin(self.inner.call(request)),
        };
        match admitted {
            Err(refusal) => Box::pin(std::future::ready(Ok(refusal.into_http()))),
            Ok(place) => {
                let answer = self.inner.call(request);
                Box::pin(async move {
                    let response = answer.await?;
                    Ok(response.map(|body| {
                        Body::new(Holding {
                            body,
                            _place: place,
                        })
                    }))
                })
            }
        }
    }
}

/// An answer's body that holds its call's place until it is dropped.
struct Holding {
    body: Body,
    _place: Admitted,
}

impl http_body::Body for Holding {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
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

    #[test]
    fn every_pet_store_call_but_a_watch_takes_a_place() {
        assert!(counted("/petstore.PetStore/AddPets"));
        assert!(counted("/petstore.PetStore/SearchPets"));
        assert!(!counted("/petstore.PetStore/WatchPets"));
        assert!(!counted("/grpc.health.v1.Health/Check"));
        assert!(!counted(
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"
        ));
    }
}
