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
//!
//! Beside it, a bound on the rate (`--max-calls-per-second`, [`Throttle`]):
//! the same calls, from all clients together, a token each from a bucket
//! refilled continuously. A call finding none is refused the same way, its
//! pushback the wait for the next token. The place is taken first and given
//! back if the throttle refuses, so a throttled call holds no place and a
//! call refused a place spends no token.

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

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
/// How long a client refused a place is asked to wait before trying again.
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

/// `RESOURCE_EXHAUSTED` saying `why`, with the pushback trailer asking the
/// client to wait `pushback`.
fn refusal(why: String, pushback: Duration) -> Status {
    let millis = u64::try_from(pushback.as_millis()).unwrap_or(u64::MAX);
    let mut trailers = MetadataMap::new();
    trailers.insert(PUSHBACK_TRAILER, MetadataValue::from(millis));
    Status::with_metadata(
        tonic::Code::ResourceExhausted,
        format!("{why}; retry after {millis} ms"),
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
            refusal(
                format!(
                    "the pet store is answering its limit of {} requests at once (--max-concurrent-requests)",
                    self.limit
                ),
                RETRY_PUSHBACK,
            )
        })?;
        Ok(Admitted {
            _permit: permit,
            _client: place,
        })
    }

    fn client_place(&self, client: IpAddr) -> Result<ClientPlace, Status> {
        self.clients.take(client, self.per_client).ok_or_else(|| {
            refusal(
                format!(
                    "the pet store is answering {} requests at once from {client}, as many as one client may have (--max-concurrent-requests-per-client)",
                    self.per_client
                ),
                RETRY_PUSHBACK,
            )
        })
    }
}

impl Default for Admission {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_CONCURRENT_REQUESTS)
    }
}

/// Admits up to `rate` calls a second, from all clients together: a token
/// bucket refilled continuously, holding a tenth of a second's calls (at
/// least one), so a quiet spell buys only a short burst.
#[derive(Clone, Debug)]
pub struct Throttle {
    rate: f64,
    burst: f64,
    /// Shared by every connection's copy of the layer.
    bucket: Arc<Mutex<Bucket>>,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    /// When `tokens` was last refilled.
    at: Instant,
}

/// Rounding slack, so a call made once its pushback (whole milliseconds)
/// has passed is not refused for a float's last bit.
const TOKEN_SLACK: f64 = 1e-9;

impl Throttle {
    /// `rate` calls a second, its bucket full; `None` for 0 (or anything
    /// not positive and finite): no bound.
    pub fn new(rate: f64) -> Option<Self> {
        Self::starting_at(rate, Instant::now())
    }

    fn starting_at(rate: f64, now: Instant) -> Option<Self> {
        (rate.is_finite() && rate > 0.0).then(|| {
            let burst = (rate / 10.0).max(1.0);
            Self {
                rate,
                burst,
                bucket: Arc::new(Mutex::new(Bucket {
                    tokens: burst,
                    at: now,
                })),
            }
        })
    }

    /// The most tokens the bucket holds: `max(1, rate / 10)`.
    pub fn burst(&self) -> f64 {
        self.burst
    }

    /// A token for one call at `now`, or the refusal whose pushback is the
    /// wait until the next token. A refusal takes nothing.
    fn take(&self, now: Instant) -> Result<(), Status> {
        // Poisoned only if a holder panicked, and the two numbers are
        // always consistent: keep using them.
        let mut bucket = self.bucket.lock().unwrap_or_else(PoisonError::into_inner);
        // A call that read the clock before another took the lock refills
        // nothing, and does not move the bucket's clock back.
        let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * self.rate).min(self.burst);
        bucket.at = bucket.at.max(now);
        if bucket.tokens + TOKEN_SLACK >= 1.0 {
            bucket.tokens = (bucket.tokens - 1.0).max(0.0);
            return Ok(());
        }
        // Multiplied first: exact for whole rates, so the wait for a whole
        // token is exactly 1000 / rate ms.
        let wait_ms = ((1.0 - bucket.tokens) * 1000.0 / self.rate).ceil().max(1.0);
        drop(bucket);
        // `as` saturates: a rate so low the wait overflows asks for the most.
        let pushback = Duration::from_millis(wait_ms as u64);
        Err(refusal(
            format!(
                "the pet store is answering its limit of {} calls a second (--max-calls-per-second)",
                self.rate
            ),
            pushback,
        ))
    }
}

/// A counted call's place under `admission` (`None` without one), once
/// `throttle` has a token for it at `now`. The place is taken first: one
/// refused drops out before a token is spent, and one the throttle refuses
/// gives its place back as it returns.
fn admit(
    admission: Option<&Admission>,
    throttle: Option<&Throttle>,
    client: Option<IpAddr>,
    now: Instant,
) -> Result<Option<Admitted>, Status> {
    let place = admission
        .map(|admission| admission.admit(client))
        .transpose()?;
    if let Some(throttle) = throttle {
        throttle.take(now)?;
    }
    Ok(place)
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

/// Bounds the pet store's calls by an [`Admission`] and a [`Throttle`],
/// each optional; with neither, every call goes through.
#[derive(Clone, Debug, Default)]
pub struct AdmissionLayer {
    pub admission: Option<Admission>,
    pub throttle: Option<Throttle>,
}

impl<S> Layer<S> for AdmissionLayer {
    type Service = Admitting<S>;

    fn layer(&self, inner: S) -> Admitting<S> {
        Admitting {
            inner,
            admission: self.admission.clone(),
            throttle: self.throttle.clone(),
        }
    }
}

/// A service whose pet store calls (but `WatchPets`) need a place and a
/// token.
#[derive(Clone, Debug)]
pub struct Admitting<S> {
    inner: S,
    admission: Option<Admission>,
    throttle: Option<Throttle>,
}

/// Whether a call to `path` takes a place (and a token): the pet store's
/// RPCs but `WatchPets`.
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
        let bounded = self.admission.is_some() || self.throttle.is_some();
        if !(bounded && counted(request.uri().path())) {
            return Box::pin(self.inner.call(request));
        }
        let admitted = admit(
            self.admission.as_ref(),
            self.throttle.as_ref(),
            client_of(&request),
            Instant::now(),
        );
        match admitted {
            Err(refusal) => Box::pin(std::future::ready(Ok(refusal.into_http()))),
            // Throttled only: no place to hold.
            Ok(None) => Box::pin(self.inner.call(request)),
            Ok(Some(place)) => {
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
    /// of `says` and the wait its pushback trailer asks for, which it
    /// returns (in ms).
    fn shed(refused: &Status, says: &[&str]) -> u64 {
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        for said in says {
            assert!(refused.message().contains(said), "{said}: {refused:?}");
        }
        let pushback = refused
            .metadata()
            .get(PUSHBACK_TRAILER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no pushback: {refused:?}"));
        let retry = format!("retry after {pushback} ms");
        assert!(refused.message().ends_with(&retry), "{refused:?}");
        pushback
    }

    /// A call shed by the concurrency bound, with its fixed pushback.
    fn assert_shed(refused: &Status, says: &[&str]) {
        assert_eq!(shed(refused, says), 100, "{refused:?}");
    }

    /// A call shed by the throttle; the pushback it asks for.
    fn throttled(refused: &Status) -> Duration {
        Duration::from_millis(shed(refused, &["calls a second (--max-calls-per-second)"]))
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

    /// `count` tokens of `throttle` at `now`, each of which must be granted.
    fn drain(throttle: &Throttle, now: Instant, count: usize) {
        for n in 0..count {
            if let Err(refused) = throttle.take(now) {
                panic!("token {n}: {refused:?}");
            }
        }
    }

    #[test]
    fn a_burst_of_a_tenth_of_a_second_is_admitted_at_once_then_calls_are_refused_with_the_wait() {
        let start = Instant::now();
        // (rate, calls its burst admits at once)
        for (rate, burst) in [(1000.0, 100), (200.0, 20), (50.0, 5), (15.0, 1), (2.5, 1)] {
            let throttle = Throttle::starting_at(rate, start).expect("a bound");
            assert_eq!(throttle.burst(), f64::max(1.0, rate / 10.0), "rate {rate}");
            drain(&throttle, start, burst);
            let refused = throttle.take(start).expect_err("beyond the burst");
            let pushback = throttled(&refused).as_millis();
            let most = (1000.0 / rate).ceil() as u128;
            assert!((1..=most).contains(&pushback), "rate {rate}: {refused:?}");
            assert!(
                refused
                    .message()
                    .contains(&format!("limit of {rate} calls")),
                "{refused:?}"
            );
        }
    }

    #[test]
    fn once_the_pushback_has_passed_one_more_call_is_admitted() {
        let start = Instant::now();
        let throttle = Throttle::starting_at(50.0, start).expect("a bound");
        drain(&throttle, start, 5);
        let wait = throttled(&throttle.take(start).expect_err("drained"));
        if let Some(early) = wait.checked_sub(Duration::from_millis(1)) {
            assert!(throttle.take(start + early).is_err(), "not yet");
        }
        assert!(throttle.take(start + wait).is_ok(), "its token is due");
        assert!(throttle.take(start + wait).is_err(), "one token, not two");

        // And on the real clock: 1000 a second refill 20 in 20 ms (more on
        // a slower machine, which only helps).
        let throttle = Throttle::starting_at(1000.0, start).expect("a bound");
        drain(&throttle, start, 100);
        assert!(throttle.take(start).is_err(), "drained");
        std::thread::sleep(Duration::from_millis(20));
        assert!(throttle.take(Instant::now()).is_ok(), "refilled");
    }

    #[test]
    fn a_refused_call_takes_neither_a_token_nor_a_place() {
        let start = Instant::now();
        let admission = Admission::new(1).with_per_client(0);
        // 20 a second: a burst of 2, a token every 50 ms.
        let throttle = Throttle::starting_at(20.0, start).expect("a bound");
        let both = |at: Instant| admit(Some(&admission), Some(&throttle), None, at);

        // Refused a place: the token it would have used is left.
        let held = both(start).expect("first");
        let full = both(start).expect_err("the only place is held");
        assert_shed(&full, &["--max-concurrent-requests"]);
        drop(held);
        let held = both(start).expect("the token left, the place given back");
        drop(held);

        // Throttled: it gives its place back, and spends nothing, however
        // often it asks.
        for _ in 0..5 {
            let refused = both(start).expect_err("no token left");
            throttled(&refused);
            assert_eq!(
                admission.permits.available_permits(),
                1,
                "the throttled call gave its place back"
            );
        }
        let place = both(start + Duration::from_millis(50)).expect("one token due");
        assert!(place.is_some(), "the admitted call holds its place");
    }

    #[test]
    fn zero_calls_a_second_is_no_bound() {
        for none in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(Throttle::new(none).is_none(), "{none}");
        }
        let start = Instant::now();
        for _ in 0..10_000 {
            assert!(matches!(admit(None, None, None, start), Ok(None)));
        }
        // With a concurrency bound alone, only places limit.
        let admission = Admission::new(1).with_per_client(0);
        for _ in 0..1000 {
            assert!(admit(Some(&admission), None, None, start).is_ok());
        }
    }
}
