//! What every call to the store shares, as one tower layer on the client's
//! channel ([`StoreCallLayer`]): its place in the store's limits
//! (`--store-qps`, and the adaptive limit of calls at once: see
//! [`crate::store::limiter`]), which hear how it ended, its
//! `store.<Method>` client span, the W3C context that
//! makes the store's span that span's child, and its latency in
//! `petstore_operator_store_call_duration_seconds{method,outcome}`.
//!
//! The outcome is the gRPC code the call ends with, read as tonic reads it:
//! from the answer's headers when the store answered with them alone,
//! otherwise from the trailers at the end of the body (or, without a
//! `grpc-status` there, from the HTTP status). A call is timed from when
//! its limits let it go until that code is known.
//!
//! `WatchPets` carries the trace context only: its stream lasts as long as
//! the operator, so a span or latency of it would say nothing, and it must
//! not wait behind the limits.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::task::{Context, Poll, ready};
use std::time::Instant;

use http_body::{Body, Frame, SizeHint};
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tonic::codegen::http::{self, HeaderMap, StatusCode};
use tonic::codegen::{Bytes, StdError};
use tonic::{Code, Status};
use tower::{Layer, Service, ServiceExt as _};
use tracing::{Instrument, Span};

use crate::store::limiter::{Answer, Permit, ShowLimits, StoreLimiter};
use crate::store::{Credentials, Operation};

/// The metrics the store's calls record: a handle of their own, so the
/// store client depends on no more of the operator's metrics than it
/// writes. Clones share their series; the operator registers one in its
/// registry, and a client whose calls nobody scrapes (`kubectl petstore`)
/// keeps an unregistered one.
#[derive(Clone, Debug)]
pub struct StoreCallMetrics {
    calls: Family<StoreCallLabels, Histogram, fn() -> Histogram>,
    concurrency_limits: Family<StoreLabels, Gauge<f64, AtomicU64>>,
    rate_caps: Family<StoreLabels, Gauge<f64, AtomicU64>>,
    tokens: Family<TokenLabels, Counter>,
    tls_reloads: Family<ReloadLabels, Counter>,
    tls_connections: Family<ReloadLabels, Counter>,
}

/// How a reload of the TLS files, or a TLS connection, ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadLabels {
    /// `ok` or `failed`.
    outcome: &'static str,
}

/// Whose token a TokenRequest asked for, and how it ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TokenLabels {
    /// `tenant` (a namespace's, for its Pets' calls) or `observer` (the
    /// operator's own, for the change feeds).
    account: &'static str,
    /// `minted` or `failed`.
    outcome: &'static str,
}

/// One store, by its address.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StoreLabels {
    store: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StoreCallLabels {
    method: Operation,
    /// The gRPC code, named as grpc-go names it (`OK`, `Unavailable`), so
    /// dashboards built for Go services read it too.
    outcome: &'static str,
}

/// The label value is the RPC's method name.
impl EncodeLabelValue for Operation {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        std::fmt::Write::write_str(encoder, self.method())
    }
}

impl Default for StoreCallMetrics {
    fn default() -> Self {
        Self {
            calls: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.0005, 2.0, 14))
            }),
            concurrency_limits: Family::default(),
            rate_caps: Family::default(),
            tokens: Family::default(),
            tls_reloads: outcomes(),
            tls_connections: outcomes(),
        }
    }
}

/// A counter by outcome with both outcomes from the start: an alert on
/// `failed` reads 0, not an absent series.
fn outcomes() -> Family<ReloadLabels, Counter> {
    let family = Family::<ReloadLabels, Counter>::default();
    for outcome in ["ok", "failed"] {
        family.get_or_create(&ReloadLabels { outcome }).inc_by(0);
    }
    family
}

/// Counts one outcome, `ok` or `failed`, in a family [`outcomes`] made.
fn count_outcome(family: &Family<ReloadLabels, Counter>, ok: bool) {
    let outcome = if ok { "ok" } else { "failed" };
    family.get_or_create(&ReloadLabels { outcome }).inc();
}

impl StoreCallMetrics {
    /// Adds `store_call_duration_seconds` to `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "store_call_duration_seconds",
            "Latency of pet store RPCs, by method and outcome",
            self.calls.clone(),
        );
        registry.register(
            "store_concurrency_limit",
            "The adaptive limit of calls at once to each store, by its address (--store-concurrency): it grows while the store answers quickly, halves when the store refuses (RESOURCE_EXHAUSTED) or times out, and falls by a tenth when answers queue",
            self.concurrency_limits.clone(),
        );
        registry.register(
            "store_rate_cap",
            "Calls a second each store is held to since it refused by rate, by its address; 0 while uncapped (only --store-qps bounds the rate)",
            self.rate_caps.clone(),
        );
        registry.register(
            "store_token_requests",
            "TokenRequests for the tokens store calls carry, by account (tenant, observer) and outcome; tokens are kept until a fifth of their life is left and renewed when a call needs one, so this grows by at most one per namespace and store every 8 minutes, not per call",
            self.tokens.clone(),
        );
        registry.register(
            "tls_reloads",
            "Reloads of the store's TLS files (--petstore-ca-file, --petstore-cert-file, --petstore-key-file) after they changed, by outcome: ok (the next store call opens a connection with them), failed (a file missing, unreadable or not matching the others: the certificates in use stay until the files change again)",
            self.tls_reloads.clone(),
        );
        registry.register(
            "store_tls_connections",
            "Connections opened to the store with TLS from files, by outcome: ok, failed (TCP or the handshake); one more after each reload of the files, as the next call opens a connection with them",
            self.tls_connections.clone(),
        );
    }

    /// The metrics text, registered as the operator registers them.
    #[cfg(test)]
    pub(crate) fn encode(&self) -> String {
        crate::fixtures::metrics_text(|registry| self.register(registry))
    }

    /// Where a limiter of the store at `address` shows its limits; the
    /// series go with it.
    pub fn limits_of(&self, address: &str) -> Box<dyn ShowLimits> {
        let labels = StoreLabels {
            store: address.to_owned(),
        };
        Box::new(LimitGauges {
            limit: self.concurrency_limits.get_or_create(&labels).clone(),
            rate_cap: self.rate_caps.get_or_create(&labels).clone(),
            labels,
            metrics: self.clone(),
        })
    }

    /// One connection to the store with TLS from files: made or not.
    pub fn tls_connection(&self, ok: bool) {
        count_outcome(&self.tls_connections, ok);
    }

    /// One reload of the TLS files that changed: `ok` or not.
    pub fn tls_reloaded(&self, ok: bool) {
        count_outcome(&self.tls_reloads, ok);
    }

    /// One TokenRequest, for a tenant's or the observer's token.
    pub fn token_request(&self, tenant: bool, minted: bool) {
        self.tokens
            .get_or_create(&TokenLabels {
                account: if tenant { "tenant" } else { "observer" },
                outcome: if minted { "minted" } else { "failed" },
            })
            .inc();
    }

    /// One call to `method`, which ended with `outcome` after `took`.
    pub fn observe(&self, method: Operation, outcome: &'static str, took: std::time::Duration) {
        self.calls
            .get_or_create(&StoreCallLabels { method, outcome })
            .observe(took.as_secs_f64());
    }
}

/// One limiter's series.
struct LimitGauges {
    /// Looked up once: they are set after every call to the store.
    limit: Gauge<f64, AtomicU64>,
    rate_cap: Gauge<f64, AtomicU64>,
    labels: StoreLabels,
    metrics: StoreCallMetrics,
}

impl ShowLimits for LimitGauges {
    fn show(&self, limit: f64, rate_cap: Option<f64>) {
        self.limit.set(limit);
        self.rate_cap.set(rate_cap.unwrap_or_default());
    }
}

impl Drop for LimitGauges {
    fn drop(&mut self) {
        self.metrics.concurrency_limits.remove(&self.labels);
        self.metrics.rate_caps.remove(&self.labels);
    }
}

/// Wraps the store's channel in [`StoreCalls`].
#[derive(Clone)]
pub struct StoreCallLayer {
    pub metrics: StoreCallMetrics,
    pub limiter: Arc<StoreLimiter>,
    /// The bearer token each call carries, for a store that checks who
    /// calls (a tenant's); `None` sends none.
    pub credentials: Option<Arc<dyn Credentials>>,
}

impl StoreCallLayer {
    /// Puts the caller's token on the request: a call that has none fails
    /// as the store would answer it, `UNAUTHENTICATED`, with the reason.
    async fn authorize<B>(&self, request: &mut http::Request<B>) -> Result<(), Status> {
        let Some(credentials) = &self.credentials else {
            return Ok(());
        };
        let value = credentials
            .authorization()
            .await
            .map_err(Status::unauthenticated)?;
        request
            .headers_mut()
            .insert(http::header::AUTHORIZATION, value);
        Ok(())
    }

    /// The store refused the token (expired early, a key rotated): the
    /// next call gets a fresh one.
    fn answered(&self, code: Code) {
        if code == Code::Unauthenticated
            && let Some(credentials) = &self.credentials
        {
            credentials.refused();
        }
    }
}

impl<S> Layer<S> for StoreCallLayer {
    type Service = StoreCalls<S>;

    fn layer(&self, inner: S) -> StoreCalls<S> {
        StoreCalls {
            inner,
            layer: self.clone(),
        }
    }
}

/// The store's channel, each call budgeted, traced and timed; see the module.
#[derive(Clone)]
pub struct StoreCalls<S> {
    inner: S,
    layer: StoreCallLayer,
}

/// The operation a request path names; `None` for `WatchPets` (and any
/// path that is no operation).
fn operation(path: &str) -> Option<Operation> {
    let method = path.strip_prefix("/petstore.PetStore/")?;
    [
        Operation::Observe,
        Operation::Create,
        Operation::Update,
        Operation::Delete,
        Operation::SetKey,
        Operation::Claim,
    ]
    .into_iter()
    .find(|operation| operation.method() == method)
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, R> Service<http::Request<B>> for StoreCalls<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<StdError>,
    B: Send + 'static,
    R: Body<Data = Bytes, Error = Status> + Unpin + Send + 'static,
{
    type Response = http::Response<Observed<R>>;
    type Error = Status;
    type Future = BoxFuture<Result<Self::Response, Status>>;

    // Readiness is awaited in `call`, after the limits: a call waiting for
    // its place must not hold a place in the channel's queue.
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        let inner = self.inner.clone();
        let Some(operation) = operation(request.uri().path()) else {
            petstore_telemetry::inject(&Span::current(), request.headers_mut());
            let layer = self.layer.clone();
            return Box::pin(async move {
                layer.authorize(&mut request).await?;
                let response = inner
                    .oneshot(request)
                    .await
                    .map_err(|err| Status::from_error(err.into()))?;
                Ok(response.map(|body| Observed {
                    body,
                    pending: None,
                    http_status: StatusCode::OK,
                }))
            });
        };
        let layer = self.layer.clone();
        Box::pin(async move {
            let permit = layer.limiter.acquire(operation).await;
            let span = store_call_span(operation);
            // With spans off, the caller's own span (if exported elsewhere)
            // is the parent to name.
            let parent = if span.is_none() {
                Span::current()
            } else {
                span.clone()
            };
            petstore_telemetry::inject(&parent, request.headers_mut());
            layer.authorize(&mut request).await?;
            let pending = Pending {
                operation,
                metrics: layer.metrics.clone(),
                started: Instant::now(),
                span,
                permit,
            };
            let answered = inner
                .oneshot(request)
                .instrument(pending.span.clone())
                .await;
            let response = match answered {
                Ok(response) => response,
                Err(err) => {
                    // The status tonic would make of it; handed on as is.
                    let status = Status::from_error(err.into());
                    pending.finish(status.code(), None);
                    return Err(status);
                }
            };
            let http_status = response.status();
            let pending = match Status::from_header_map(response.headers()) {
                // Headers alone: the call ends here.
                Some(status) => {
                    layer.answered(status.code());
                    pending.finish(status.code(), pushback(response.headers()));
                    None
                }
                None => Some(pending),
            };
            Ok(response.map(|body| Observed {
                body,
                pending,
                http_status,
            }))
        })
    }
}

/// A call whose code is not known yet. Dropped unfinished (its answer's
/// body dropped), its permit gives the place back and teaches nothing.
struct Pending {
    operation: Operation,
    metrics: StoreCallMetrics,
    started: Instant,
    span: Span,
    permit: Permit,
}

impl Pending {
    fn finish(self, code: Code, pushback: Option<std::time::Duration>) {
        let took = self.started.elapsed();
        self.permit.answered(Answer {
            code,
            took,
            pushback,
        });
        self.metrics.observe(
            self.operation,
            petstore_telemetry::grpc_code_name(code),
            took,
        );
        self.span.record("rpc.grpc.status_code", code as i64);
        if code != Code::Ok {
            self.span.record("otel.status_code", "ERROR");
        }
    }
}

/// An answer's body that finishes its call when the code arrives.
pub struct Observed<B> {
    body: B,
    pending: Option<Pending>,
    http_status: StatusCode,
}

impl<B> Observed<B> {
    fn finish(&mut self, code: Code, pushback: Option<std::time::Duration>) {
        if let Some(pending) = self.pending.take() {
            pending.finish(code, pushback);
        }
    }
}

/// The store's `grpc-retry-pushback-ms`, in the headers or trailers that
/// end a call: how long it asks callers to wait. gRPC says a negative or
/// unreadable value means not to retry; then no pause.
pub(crate) fn pushback(headers: &HeaderMap) -> Option<std::time::Duration> {
    let millis: i64 = headers
        .get("grpc-retry-pushback-ms")?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    u64::try_from(millis)
        .ok()
        .map(std::time::Duration::from_millis)
}

impl<B> Body for Observed<B>
where
    B: Body<Data = Bytes, Error = Status> + Unpin,
{
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let frame = ready!(Pin::new(&mut self.body).poll_frame(cx));
        match &frame {
            Some(Ok(frame)) => {
                if let Some(trailers) = frame.trailers_ref() {
                    let code = final_code(Some(trailers), self.http_status);
                    self.finish(code, pushback(trailers));
                }
            }
            Some(Err(status)) => self.finish(status.code(), pushback(status.metadata().as_ref())),
            None => {
                let code = final_code(None, self.http_status);
                self.finish(code, None);
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The code a call ends with, as tonic infers it from the trailers and the
/// HTTP status (gRPC's HTTP to gRPC status mapping when there is no
/// `grpc-status`).
fn final_code(trailers: Option<&HeaderMap>, http_status: StatusCode) -> Code {
    if let Some(status) = trailers.and_then(Status::from_header_map) {
        return status.code();
    }
    match http_status {
        StatusCode::BAD_REQUEST => Code::Internal,
        StatusCode::UNAUTHORIZED => Code::Unauthenticated,
        StatusCode::FORBIDDEN => Code::PermissionDenied,
        StatusCode::NOT_FOUND => Code::Unimplemented,
        StatusCode::TOO_MANY_REQUESTS
        | StatusCode::BAD_GATEWAY
        | StatusCode::SERVICE_UNAVAILABLE
        | StatusCode::GATEWAY_TIMEOUT => Code::Unavailable,
        _ => Code::Unknown,
    }
}

/// The client span of one store call: `store.<Method>` with the OTel
/// semantic `rpc.*` attributes; its status code is recorded at the end.
fn store_call_span(operation: Operation) -> Span {
    let method = operation.method();
    petstore_telemetry::span(|| {
        tracing::info_span!(
            "store_call",
            otel.name = %format_args!("store.{method}"),
            otel.kind = "client",
            rpc.system = "grpc",
            rpc.service = "petstore.PetStore",
            rpc.method = method,
            rpc.grpc.status_code = tracing::field::Empty,
            // Declared, so that a failure can be recorded as the span's status.
            otel.status_code = tracing::field::Empty,
        )
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    type Answer = http::Response<tonic::body::Body>;

    /// A channel that keeps each request's headers and answers with
    /// `status` in headers alone.
    fn channel(
        status: Status,
        seen: Arc<Mutex<Vec<HeaderMap>>>,
    ) -> impl Service<
        http::Request<()>,
        Response = Answer,
        Error = std::convert::Infallible,
        Future = std::future::Ready<Result<Answer, std::convert::Infallible>>,
    > + Clone
    + Send
    + 'static {
        tower::service_fn(move |request: http::Request<()>| {
            seen.lock().expect("lock").push(request.headers().clone());
            std::future::ready(Ok(status.clone().into_http()))
        })
    }

    async fn send<S>(service: &mut S, method: &str) -> Result<S::Response, S::Error>
    where
        S: Service<http::Request<()>>,
    {
        let request = http::Request::builder()
            .uri(format!("http://store/petstore.PetStore/{method}"))
            .body(())
            .expect("request");
        service.ready().await?.call(request).await
    }

    /// One `method` call through the layer to a channel answering `status`,
    /// which adds the headers it is sent to `seen`.
    async fn call_through(
        metrics: &StoreCallMetrics,
        status: Status,
        seen: &Arc<Mutex<Vec<HeaderMap>>>,
        method: &str,
    ) {
        let mut service = layer(metrics).layer(channel(status, Arc::clone(seen)));
        send(&mut service, method).await.expect("answered");
    }

    fn layer(metrics: &StoreCallMetrics) -> StoreCallLayer {
        StoreCallLayer {
            metrics: metrics.clone(),
            limiter: Arc::new(StoreLimiter::unlimited()),
            credentials: None,
        }
    }

    /// A token per call, or a reason there is none; counts refusals.
    struct Token {
        value: Result<&'static str, &'static str>,
        refused: std::sync::atomic::AtomicU32,
    }

    impl Token {
        fn new(value: Result<&'static str, &'static str>) -> Arc<Token> {
            Arc::new(Token {
                value,
                refused: Default::default(),
            })
        }

        fn refusals(&self) -> u32 {
            self.refused.load(std::sync::atomic::Ordering::Relaxed)
        }
    }

    #[tonic::async_trait]
    impl Credentials for Token {
        async fn authorization(&self) -> Result<http::HeaderValue, String> {
            self.value
                .map(http::HeaderValue::from_static)
                .map_err(str::to_owned)
        }

        fn refused(&self) {
            self.refused
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    fn with_token(metrics: &StoreCallMetrics, token: &Arc<Token>) -> StoreCallLayer {
        StoreCallLayer {
            credentials: Some(Arc::clone(token) as Arc<dyn Credentials>),
            ..layer(metrics)
        }
    }

    #[tokio::test]
    async fn every_call_and_the_feed_carry_the_callers_token() {
        let metrics = StoreCallMetrics::default();
        let token = Token::new(Ok("Bearer tenant-a"));
        let seen = Arc::default();
        let mut service =
            with_token(&metrics, &token).layer(channel(Status::ok(""), Arc::clone(&seen)));
        for method in ["GetPets", "AddPets", "WatchPets"] {
            send(&mut service, method).await.expect("answered");
        }
        let seen = seen.lock().expect("lock");
        assert_eq!(seen.len(), 3);
        for headers in seen.iter() {
            assert_eq!(headers[http::header::AUTHORIZATION], "Bearer tenant-a");
        }
        assert_eq!(token.refusals(), 0);
    }

    #[tokio::test]
    async fn a_refused_token_is_renewed_and_a_missing_one_is_never_sent() {
        let metrics = StoreCallMetrics::default();
        let token = Token::new(Ok("Bearer expired"));
        let seen = Arc::default();
        let mut service = with_token(&metrics, &token).layer(channel(
            Status::unauthenticated("token expired"),
            Arc::clone(&seen),
        ));
        send(&mut service, "UpdatePets").await.expect("answered");
        assert_eq!(token.refusals(), 1, "the next call mints afresh");

        let none = Token::new(Err("no ServiceAccount team-a/petstore-tenant"));
        let seen = Arc::default();
        let mut service =
            with_token(&metrics, &none).layer(channel(Status::ok(""), Arc::clone(&seen)));
        let Err(status) = send(&mut service, "AddPets").await else {
            panic!("a call without a token must fail");
        };
        assert_eq!(status.code(), Code::Unauthenticated);
        crate::fixtures::assert_mentions(status.message(), &["petstore-tenant"]);
        assert!(
            seen.lock().expect("lock").is_empty(),
            "nothing reached the store"
        );
    }

    #[tokio::test]
    async fn a_refusal_with_pushback_halves_the_store_limit_its_gauge_shows_it_and_it_goes_with_the_limiter()
     {
        use crate::store::limiter::ConcurrencyLimit;
        let metrics = StoreCallMetrics::default();
        let limiter = StoreLimiter::new(ConcurrencyLimit::default(), 0.0, 1)
            .showing_in(metrics.limits_of("https://store:50051"));
        let layer = StoreCallLayer {
            limiter: Arc::new(limiter),
            ..layer(&metrics)
        };
        let series = "petstore_operator_store_concurrency_limit{store=\"https://store:50051\"}";
        crate::fixtures::assert_mentions(&metrics.encode(), &[&format!("{series} 8.0")]);
        let mut refused = Status::resource_exhausted("busy");
        refused
            .metadata_mut()
            .insert("grpc-retry-pushback-ms", "5".parse().expect("ascii"));
        let mut service = layer.layer(channel(refused, Arc::default()));
        send(&mut service, "GetPets").await.expect("answered");
        crate::fixtures::assert_mentions(
            &metrics.encode(),
            &[
                &format!("{series} 4.0"),
                "petstore_operator_store_rate_cap{store=\"https://store:50051\"} 1.0",
            ],
        );
        assert_eq!(layer.limiter.current().0, 4.0);
        drop((service, layer));
        assert!(
            !metrics.encode().contains("https://store:50051"),
            "a closed store's series go"
        );
    }

    // The store's RPC span can only become the child of `store.<Method>` if
    // the request carries that span's own IDs.
    #[tokio::test]
    async fn calls_carry_their_span_as_traceparent_and_are_timed_by_outcome() {
        petstore_telemetry::enable_spans_for_tests();
        crate::fixtures::scoped_subscribers_see_everything();
        let spans = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(spans.clone())
            .build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        let _default = tracing::subscriber::set_default(subscriber);

        let metrics = StoreCallMetrics::default();
        let seen = Arc::default();
        call_through(&metrics, Status::ok(""), &seen, "AddPets").await;
        call_through(
            &metrics,
            Status::resource_exhausted("busy"),
            &seen,
            "GetPets",
        )
        .await;

        let finished = spans.get_finished_spans().expect("spans");
        let [add, get] = finished.as_slice() else {
            panic!("expected two spans, got {finished:?}");
        };
        assert_eq!(add.name, "store.AddPets");
        assert_eq!(get.name, "store.GetPets");
        let seen = seen.lock().expect("lock");
        let traceparent = seen[0]
            .get("traceparent")
            .and_then(|value| value.to_str().ok())
            .expect("a traceparent");
        assert_eq!(
            traceparent,
            format!(
                "00-{}-{}-01",
                add.span_context.trace_id(),
                add.span_context.span_id()
            )
        );
        let status = |span: &opentelemetry_sdk::trace::SpanData| {
            span.attributes
                .iter()
                .find(|kv| kv.key.as_str() == "rpc.grpc.status_code")
                .map(|kv| kv.value.to_string())
        };
        assert_eq!(status(add).as_deref(), Some("0"));
        assert_eq!(status(get).as_deref(), Some("8"));
        let text = metrics.encode();
        crate::fixtures::assert_mentions(
            &text,
            &[
                "petstore_operator_store_call_duration_seconds_count{method=\"AddPets\",outcome=\"OK\"} 1",
                "petstore_operator_store_call_duration_seconds_count{method=\"GetPets\",outcome=\"ResourceExhausted\"} 1",
            ],
        );
    }

    #[tokio::test]
    async fn the_feed_is_neither_timed_nor_given_a_span() {
        let metrics = StoreCallMetrics::default();
        let seen = Arc::default();
        call_through(&metrics, Status::ok(""), &seen, "WatchPets").await;
        assert_eq!(seen.lock().expect("lock").len(), 1, "sent");
        let text = metrics.encode();
        assert!(!text.contains("WatchPets"), "{text}");
    }

    #[tokio::test]
    async fn without_tracing_no_traceparent_is_sent() {
        let metrics = StoreCallMetrics::default();
        let seen = Arc::default();
        call_through(&metrics, Status::ok(""), &seen, "AddPets").await;
        assert!(seen.lock().expect("lock")[0].get("traceparent").is_none());
    }

    #[test]
    fn every_operation_but_the_feed_is_found_by_its_path() {
        for operation in [
            Operation::Observe,
            Operation::Create,
            Operation::Update,
            Operation::Delete,
            Operation::SetKey,
        ] {
            let path = format!("/petstore.PetStore/{}", operation.method());
            assert_eq!(super::operation(&path), Some(operation), "{path}");
        }
        assert_eq!(super::operation("/petstore.PetStore/WatchPets"), None);
        assert_eq!(super::operation("/grpc.health.v1.Health/Check"), None);
    }

    #[test]
    fn a_missing_grpc_status_is_mapped_from_the_http_status_as_tonic_does() {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", http::HeaderValue::from_static("14"));
        assert_eq!(
            final_code(Some(&trailers), StatusCode::OK),
            Code::Unavailable
        );
        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
        assert_eq!(final_code(Some(&trailers), StatusCode::OK), Code::Ok);
        assert_eq!(final_code(None, StatusCode::OK), Code::Unknown);
        assert_eq!(
            final_code(None, StatusCode::SERVICE_UNAVAILABLE),
            Code::Unavailable
        );
        assert_eq!(final_code(None, StatusCode::NOT_FOUND), Code::Unimplemented);
        assert_eq!(
            final_code(Some(&HeaderMap::new()), StatusCode::FORBIDDEN),
            Code::PermissionDenied
        );
    }
}
