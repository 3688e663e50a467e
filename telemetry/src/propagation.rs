//! W3C trace context over gRPC metadata (HTTP/2 headers): `traceparent` and
//! `tracestate`. On headers rather than tonic's metadata, so the tower
//! layers that carry a call's span can read and write it.

use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tonic::codegen::http::HeaderMap;
use tonic::codegen::http::header::{HeaderName, HeaderValue};
use tracing_opentelemetry::OpenTelemetrySpanExt;

struct HeaderInjector<'a>(&'a mut HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        // Both are ASCII by construction; a value that is not is dropped
        // rather than failing the call it rides on.
        if let (Ok(key), Ok(value)) = (
            HeaderName::from_bytes(key.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            self.0.insert(key, value);
        }
    }
}

struct HeaderExtractor<'a>(&'a HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

/// Writes the W3C context of `span` into `headers`, so the callee's spans
/// join its trace. Writes nothing when tracing is off or the span has no
/// OpenTelemetry context.
pub fn inject(span: &tracing::Span, headers: &mut HeaderMap) {
    TraceContextPropagator::new().inject_context(&span.context(), &mut HeaderInjector(headers));
}

/// The caller's W3C context from `headers`; empty when it sent none or an
/// invalid one.
pub fn extract(headers: &HeaderMap) -> Context {
    TraceContextPropagator::new().extract(&HeaderExtractor(headers))
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState,
    };

    use super::*;

    #[test]
    fn a_traceparent_is_read_and_a_bad_one_ignored() {
        let mut headers = HeaderMap::new();
        headers.insert(
            "traceparent",
            HeaderValue::from_static("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        );
        let context = extract(&headers);
        let span = context.span();
        let remote = span.span_context();
        assert_eq!(
            remote.trace_id(),
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").expect("hex")
        );
        assert_eq!(
            remote.span_id(),
            SpanId::from_hex("00f067aa0ba902b7").expect("hex")
        );
        assert!(remote.is_sampled() && remote.is_remote());

        headers.insert("traceparent", HeaderValue::from_static("00-nonsense"));
        assert!(!extract(&headers).span().span_context().is_valid());
    }

    #[test]
    fn an_injected_context_reads_back_the_same() {
        let sent = SpanContext::new(
            TraceId::from_hex("0af7651916cd43dd8448eb211c80319c").expect("hex"),
            SpanId::from_hex("b7ad6b7169203331").expect("hex"),
            TraceFlags::SAMPLED,
            true,
            TraceState::default(),
        );
        let mut headers = HeaderMap::new();
        TraceContextPropagator::new().inject_context(
            &Context::new().with_remote_span_context(sent.clone()),
            &mut HeaderInjector(&mut headers),
        );
        assert_eq!(
            headers.get("traceparent").and_then(|v| v.to_str().ok()),
            Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
        );
        let received = extract(&headers);
        assert_eq!(received.span().span_context().trace_id(), sent.trace_id());
        assert_eq!(received.span().span_context().span_id(), sent.span_id());
    }
}
