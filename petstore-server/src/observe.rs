//! What every pet store RPC is observed by, as one tower layer around the
//! gRPC server: its server span (a child of the caller's W3C context), its
//! place in `petstore_server_rpcs_in_flight`, and its duration in
//! `petstore_server_rpc_duration_seconds` by method and gRPC code. The
//! handlers in [`crate::service`] see none of it.
//!
//! A call is timed until its handler answers (for a stream, until it
//! starts); the code is the one the answer carries in its headers (a
//! failed call is answered with headers alone), `OK` otherwise.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use petstore_telemetry::FORCE_SAMPLING_ATTRIBUTE;
use tonic::codegen::http;
use tower::{Layer, Service};
use tracing::{Instrument, Span};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::metrics::ServerMetrics;
use crate::rpc::{self, Rpc};

/// Wraps the server's services in [`Observed`].
#[derive(Clone, Debug)]
pub struct ObserveLayer {
    metrics: Arc<ServerMetrics>,
    /// Whether calls open spans: only when spans are exported, as a span
    /// per call costs the log layer measurable time for nothing otherwise.
    spans: bool,
}

impl ObserveLayer {
    pub fn new(metrics: Arc<ServerMetrics>, spans: bool) -> Self {
        Self { metrics, spans }
    }
}

impl<S> Layer<S> for ObserveLayer {
    type Service = Observed<S>;

    fn layer(&self, inner: S) -> Observed<S> {
        Observed {
            inner,
            layer: self.clone(),
        }
    }
}

/// A service whose pet store calls are observed; see the module.
#[derive(Clone, Debug)]
pub struct Observed<S> {
    inner: S,
    layer: ObserveLayer,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, R> Service<http::Request<B>> for Observed<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    R: 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let Some(rpc) = rpc::by_path(request.uri().path()) else {
            return Box::pin(self.inner.call(request));
        };
        let span = if self.layer.spans {
            rpc_span(rpc, request.headers())
        } else {
            Span::none()
        };
        let in_flight = self.layer.metrics.in_flight();
        let metrics = Arc::clone(&self.layer.metrics);
        let started = Instant::now();
        let answer = span.in_scope(|| self.inner.call(request));
        Box::pin(async move {
            // Counted until the handler answers, or the call is dropped.
            let _in_flight = in_flight;
            let mut abandoned = Abandoned {
                metrics: Some(Arc::clone(&metrics)),
                method: rpc.method,
                started,
            };
            let result = answer.instrument(span.clone()).await;
            abandoned.metrics = None;
            if let Ok(response) = &result {
                let code = code(response.headers());
                span.record("rpc.grpc.status_code", code as i64);
                metrics.observe_rpc(rpc.method, code, started.elapsed());
            }
            result
        })
    }
}

/// A call its client gave up on (a deadline, a cancelled request) is
/// dropped before its answer, but was received and may have been done (a
/// write committed): it is timed as `Canceled` (gRPC's CANCELLED) rather than left out, so
/// the calls counted are the calls made.
struct Abandoned {
    /// `None` once answered.
    metrics: Option<Arc<ServerMetrics>>,
    method: &'static str,
    started: Instant,
}

impl Drop for Abandoned {
    fn drop(&mut self) {
        if let Some(metrics) = self.metrics.take() {
            metrics.observe_rpc(self.method, tonic::Code::Cancelled, self.started.elapsed());
        }
    }
}

/// The gRPC code an answer's headers carry: only a failed call's do.
fn code(headers: &http::HeaderMap) -> tonic::Code {
    tonic::Status::from_header_map(headers).map_or(tonic::Code::Ok, |status| status.code())
}

/// The server span of one RPC, a child of the caller's span when its
/// metadata carries a W3C `traceparent`. A `trace` key in the metadata
/// samples it whatever the sampler says, as in the book's store.
fn rpc_span(rpc: &'static Rpc, headers: &http::HeaderMap) -> Span {
    let force_sampling = headers.contains_key("trace");
    let span = tracing::info_span!(
        "rpc",
        otel.name = rpc.full_name,
        otel.kind = "server",
        rpc.system = "grpc",
        rpc.service = rpc::SERVICE,
        rpc.method = rpc.method,
        rpc.grpc.status_code = tracing::field::Empty,
        { FORCE_SAMPLING_ATTRIBUTE } = force_sampling,
        trace_id = tracing::field::Empty,
    );
    // Fails only when no OpenTelemetry layer is installed: nothing to link.
    let _ = span.set_parent(petstore_telemetry::extract(headers));
    petstore_telemetry::record_trace_id(&span);
    span
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use tower::ServiceExt as _;

    use super::*;

    /// Answers every call with `status` in its headers, or `OK` without.
    fn answering(
        status: Option<tonic::Status>,
    ) -> impl Service<
        http::Request<()>,
        Response = http::Response<tonic::body::Body>,
        Error = Infallible,
        Future = std::future::Ready<Result<http::Response<tonic::body::Body>, Infallible>>,
    > + Clone {
        tower::service_fn(move |_: http::Request<()>| {
            std::future::ready(Ok(match &status {
                Some(status) => status.clone().into_http(),
                None => http::Response::new(tonic::body::Body::empty()),
            }))
        })
    }

    async fn call(service: impl Service<http::Request<()>, Error = Infallible>, path: &str) {
        let request = http::Request::builder()
            .uri(format!("http://store{path}"))
            .body(())
            .expect("request");
        let _ = service.oneshot(request).await;
    }

    #[tokio::test]
    async fn pet_store_calls_are_timed_by_method_and_code_and_others_are_not() {
        let metrics = Arc::new(ServerMetrics::default());
        let layer = ObserveLayer::new(Arc::clone(&metrics), false);
        call(layer.layer(answering(None)), "/petstore.PetStore/GetPets").await;
        let refused = tonic::Status::resource_exhausted("busy");
        call(
            layer.layer(answering(Some(refused))),
            "/petstore.PetStore/AddPets",
        )
        .await;
        call(layer.layer(answering(None)), "/grpc.health.v1.Health/Check").await;
        let text = metrics.encode().expect("encode");
        for series in [
            "petstore_server_rpc_duration_seconds_count{method=\"GetPets\",code=\"OK\"} 1",
            "petstore_server_rpc_duration_seconds_count{method=\"AddPets\",code=\"ResourceExhausted\"} 1",
            "petstore_server_rpcs_in_flight 0",
        ] {
            assert!(text.contains(series), "no {series:?} in\n{text}");
        }
        assert!(!text.contains("Check"), "{text}");
    }

    #[tokio::test]
    async fn a_call_its_client_gives_up_on_is_counted_as_cancelled() {
        let metrics = Arc::new(ServerMetrics::default());
        let never = tower::service_fn(|_: http::Request<()>| {
            std::future::pending::<Result<http::Response<tonic::body::Body>, Infallible>>()
        });
        let service = ObserveLayer::new(Arc::clone(&metrics), false).layer(never);
        let gave_up = tokio::time::timeout(
            std::time::Duration::from_millis(10),
            call(service, "/petstore.PetStore/SetIdempotencyKeys"),
        )
        .await;
        assert!(gave_up.is_err(), "the handler never answers");
        let text = metrics.encode().expect("encode");
        assert!(
            text.contains(
                "petstore_server_rpc_duration_seconds_count{method=\"SetIdempotencyKeys\",code=\"Canceled\"} 1"
            ),
            "{text}"
        );
        assert!(text.contains("petstore_server_rpcs_in_flight 0"), "{text}");
    }

    #[tokio::test]
    async fn a_call_is_in_flight_until_its_handler_answers() {
        let metrics = Arc::new(ServerMetrics::default());
        let (answer, answered) = tokio::sync::oneshot::channel::<()>();
        let answered = Arc::new(tokio::sync::Mutex::new(Some(answered)));
        let slow = tower::service_fn(move |_: http::Request<()>| {
            let answered = Arc::clone(&answered);
            async move {
                if let Some(answered) = answered.lock().await.take() {
                    let _ = answered.await;
                }
                Ok::<_, Infallible>(http::Response::new(tonic::body::Body::empty()))
            }
        });
        let service = ObserveLayer::new(Arc::clone(&metrics), false).layer(slow);
        let pending = tokio::spawn(call(service, "/petstore.PetStore/SearchPets"));
        let in_flight = || {
            metrics
                .encode()
                .expect("encode")
                .contains("petstore_server_rpcs_in_flight 1")
        };
        let deadline = Instant::now() + std::time::Duration::from_secs(5);
        while !in_flight() {
            assert!(Instant::now() < deadline, "never counted in flight");
            tokio::task::yield_now().await;
        }
        let _ = answer.send(());
        pending.await.expect("call");
        let text = metrics.encode().expect("encode");
        assert!(text.contains("petstore_server_rpcs_in_flight 0"), "{text}");
        assert!(
            text.contains(
                "petstore_server_rpc_duration_seconds_count{method=\"SearchPets\",code=\"OK\"} 1"
            ),
            "{text}"
        );
    }
}
