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
//!
//! One client (an IP address) may hold only a share of those places
//! (`--max-concurrent-requests-per-client`, half the bound by default), so
//! a client that floods the store is refused its excess while the others,
//! the operator among them, still find places.

use std::future::Future;
use std::net::IpAddr;
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
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
use tower::{Layer, Service};

use crate::per_client::{ClientCounts, ClientPlace};
use crate::rpc;

/// The default bound: far above what the operator sends (its own budget
/// bursts to 500), low enough that a flood is refused, not queued.
pub const DEFAULT_MAX_CONCURRENT_REQUESTS: usize = 1024;
/// How long a refused client is asked to wait before trying again.
pub const RETRY_PUSHBACK: Duration = Duration::from_millis(100);
/// gRPC's retry pushback trailer (gRFC A6).
pub const PUSHBACK_TRAILER: &str = "grpc-retry-pushback-ms";

/// Admits up to `limit` requests at once, and up to `per_client` of them
/// from one client; see the module's documentation.
#[derive(Clone, Debug)]
pub struct Admission {
    permits: Arc<Semaphore>,
    limit: usize,
    /// 0: no share, a client may take every place.
    per_client: usize,
    /// The places each client holds now.
    clients: Arc<ClientCounts>,
}

/// Holds a request's place until dropped (for a search, with its stream).
#[derive(Debug)]
pub struct Admitted {
    _permit: OwnedSemaphorePermit,
    _client: Option<ClientPlace>,
}

/// `RESOURCE_EXHAUSTED` saying `why`, with the pushback trailer.
fn refusal(why: String) -> Status {
    let mut trailers = MetadataMap::new();
    trailers.insert(
        PUSHBACK_TRAILER,
        MetadataValue::from(RETRY_PUSHBACK.as_millis() as u64),
    );
    Status::with_metadata(
        tonic::Code::ResourceExhausted,
        format!("{why}; retry after {} ms", RETRY_PUSHBACK.as_millis()),
        trailers,
    )
}

impl Admission {
    /// `limit` places, and by default half of them for one client.
    pub fn new(limit: usize) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(limit)),
            limit,
            per_client: (limit / 2).max(1),
            clients: Arc::default(),
        }
    }

    /// At most `per_client` places for one client; 0: no share.
    #[must_use]
    pub fn with_per_client(mut self, per_client: usize) -> Self {
        self.per_client = per_client;
        self
    }

    /// A place for one request of `client` (an unknown client takes no
    /// share), or the refusal to send.
    pub fn admit(&self, client: Option<IpAddr>) -> Result<Admitted, Status> {
        let place = match client {
            Some(client) if self.per_client > 0 => Some(self.client_place(client)?),
            _ => None,
        };
        // A refusal here drops `place`, giving the client's share back.
        let permit = Arc::clone(&self.permits).try_acquire_owned().map_err(|_| {
            refusal(format!(
                "the pet store is answering its limit of {} requests at once (--max-concurrent-requests)",
                self.limit
            ))
        })?;
        Ok(Admitted {
            _permit: permit,
            _client: place,
        })
    }

    fn client_place(&self, client: IpAddr) -> Result<ClientPlace, Status> {
        self.clients.take(client, self.per_client).ok_or_else(|| {
            refusal(format!(
                "the pet store is answering {} requests at once from {client}, as many as one client may have (--max-concurrent-requests-per-client)",
                self.per_client
            ))
        })
    }
}

impl Default for Admission {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_CONCURRENT_REQUESTS)
    }
}

/// The address a request came from, as the server's plaintext or TLS
/// connection saw it.
fn client_of<B>(request: &http::Request<B>) -> Option<IpAddr> {
    let extensions = request.extensions();
    extensions
        .get::<TcpConnectInfo>()
        .and_then(TcpConnectInfo::remote_addr)
        .or_else(|| {
            extensions
                .get::<TlsConnectInfo<TcpConnectInfo>>()
                .and_then(|tls| tls.get_ref().remote_addr())
        })
        .map(|addr| addr.ip())
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
            Some(admission) if counted(request.uri().path()) => {
                admission.admit(client_of(&request))
            }
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

    /// A call shed by a bound: RESOURCE_EXHAUSTED, its message saying each
    /// of `says`, and the pushback trailer that spaces out the retries.
    fn assert_shed(refused: &Status, says: &[&str]) {
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        for said in says {
            assert!(refused.message().contains(said), "{said}: {refused:?}");
        }
        let pushback = refused
            .metadata()
            .get(PUSHBACK_TRAILER)
            .and_then(|v| v.to_str().ok());
        assert_eq!(pushback, Some("100"), "{refused:?}");
    }

    /// `count` places for `client`, each of which must be granted.
    fn take(admission: &Admission, client: Option<IpAddr>, count: usize) -> Vec<Admitted> {
        (0..count)
            .map(|n| {
                admission
                    .admit(client)
                    .unwrap_or_else(|refused| panic!("place {n}: {refused:?}"))
            })
            .collect()
    }

    /// A place given back (one of `held`) is granted to `client` again.
    fn assert_freed_place_retaken(
        admission: &Admission,
        held: &mut Vec<Admitted>,
        client: Option<IpAddr>,
    ) {
        drop(held.pop());
        assert!(
            admission.admit(client).is_ok(),
            "a freed place is taken again"
        );
    }

    #[test]
    fn beyond_the_limit_a_request_is_refused_with_a_pushback_until_one_ends() {
        let admission = Admission::new(2).with_per_client(0);
        let mut held = take(&admission, None, 2);
        let refused = admission.admit(None).expect_err("third");
        assert_shed(&refused, &["limit of 2"]);
        assert_freed_place_retaken(&admission, &mut held, None);
    }

    #[test]
    fn one_client_takes_only_its_share_and_the_others_find_places() {
        let flood = Some(IpAddr::from([127, 0, 0, 1]));
        let other = Some(IpAddr::from([127, 0, 0, 2]));
        assert_eq!(Admission::new(4).per_client, 2, "half the bound by default");
        let admission = Admission::new(4).with_per_client(3);
        let mut held = take(&admission, flood, 3);
        let refused = admission.admit(flood).expect_err("beyond its share");
        assert_shed(
            &refused,
            &[
                "3 requests at once from 127.0.0.1",
                "--max-concurrent-requests-per-client",
            ],
        );
        let _elsewhere = admission
            .admit(other)
            .expect("another client finds a place");
        // Every place is taken now: refused by the whole bound, and the
        // share it was given for a moment is given back.
        let full = admission.admit(other).expect_err("every place taken");
        assert_shed(&full, &["limit of 4"]);
        assert_eq!(admission.clients.held_by(IpAddr::from([127, 0, 0, 2])), 1);
        assert_freed_place_retaken(&admission, &mut held, flood);
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
