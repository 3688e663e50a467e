//! Logging and tracing for both binaries: a `tracing` subscriber that logs
//! to stdout and, when an OTLP endpoint is configured, exports spans with
//! OpenTelemetry; the switchable sampler the store's `ChangeSampler` RPC
//! drives; W3C context propagation over gRPC metadata; and the HTTP
//! endpoint that serves each binary's Prometheus metrics.

mod metrics_http;
mod propagation;
mod sampler;

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

pub use metrics_http::{OPENMETRICS_CONTENT_TYPE, OpenMetrics, metrics_router, serve_http};
pub use propagation::{extract, inject};
pub use sampler::{FORCE_SAMPLING_ATTRIBUTE, ParseSamplerError, SamplerSetting, SharedSampler};

/// The span field [`record_trace_id`] fills: declare it on a root span as
/// `trace_id = tracing::field::Empty` and every log line inside it shows
/// the trace to look up.
pub const TRACE_ID_FIELD: &str = "trace_id";

/// Set by [`init`] when spans are exported.
static SPANS_EXPORTED: AtomicBool = AtomicBool::new(false);

/// Whether this process exports spans.
pub fn spans_exported() -> bool {
    SPANS_EXPORTED.load(Ordering::Relaxed)
}

/// `make()` when spans are exported, else a disabled span. For spans that
/// exist only for the trace: with export off, a span still costs the log
/// layer its allocation and field formatting on every reconcile.
pub fn span(make: impl FnOnce() -> tracing::Span) -> tracing::Span {
    if spans_exported() {
        make()
    } else {
        tracing::Span::none()
    }
}

/// Makes [`span`] open spans, for tests that install their own exporting
/// subscriber instead of calling [`init`].
pub fn enable_spans_for_tests() {
    SPANS_EXPORTED.store(true, Ordering::Relaxed);
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("building the OTLP span exporter: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
    #[error("OTEL_EXPORTER_OTLP_PROTOCOL={0:?} is not supported: only grpc is")]
    Protocol(String),
    #[error("installing the tracing subscriber: {0}")]
    Subscriber(#[from] tracing_subscriber::util::TryInitError),
}

/// Flushes and shuts the span exporter down when dropped or on
/// [`TelemetryGuard::shutdown`], so the last spans are sent before exit.
#[must_use = "dropping the guard at once stops the span export"]
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
}

impl TelemetryGuard {
    /// Whether spans are exported.
    pub fn is_exporting(&self) -> bool {
        self.provider.is_some()
    }

    /// Flushes and shuts down, blocking this thread. On a thread that
    /// drives a Tokio runtime, use [`TelemetryGuard::shutdown_async`]: the
    /// exporter needs that runtime to send.
    pub fn shutdown(mut self) {
        self.shut_down();
    }

    /// Flushes and shuts down from async code, off the runtime's threads.
    pub async fn shutdown_async(mut self) {
        if let Some(provider) = self.provider.take() {
            let guard = TelemetryGuard {
                provider: Some(provider),
            };
            if let Err(err) = tokio::task::spawn_blocking(move || guard.shutdown()).await {
                eprintln!("flushing spans at exit failed: {err}");
            }
        }
    }

    fn shut_down(&mut self) {
        if let Some(provider) = self.provider.take()
            && let Err(err) = provider.shutdown()
        {
            // The subscriber may already be going away; stderr always works.
            eprintln!("flushing spans at exit failed: {err}");
        }
    }
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        self.shut_down();
    }
}

fn env_set(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|value| !value.is_empty())
}

/// Whether the OTLP exporter's environment asks for span export.
pub fn export_configured() -> bool {
    env_set("OTEL_EXPORTER_OTLP_ENDPOINT") || env_set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
}

/// The exporting tracer provider, configured from the standard `OTEL_*`
/// environment. Must run inside a Tokio runtime: the gRPC exporter's
/// channel lives on it.
fn tracer_provider(
    service_name: &str,
    sampler: Option<SharedSampler>,
) -> Result<SdkTracerProvider, Error> {
    let protocol = std::env::var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        .or_else(|_| std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL"))
        .unwrap_or_default();
    if !matches!(protocol.as_str(), "" | "grpc") {
        return Err(Error::Protocol(protocol));
    }
    // The tonic exporter reads the endpoint, headers, timeout and
    // compression from OTEL_EXPORTER_OTLP_* itself.
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .build()?;
    // OTEL_SERVICE_NAME wins over the built-in name; `Resource::builder`
    // adds OTEL_RESOURCE_ATTRIBUTES.
    let service_name = std::env::var("OTEL_SERVICE_NAME")
        .ok()
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| service_name.to_owned());
    let resource = Resource::builder().with_service_name(service_name).build();
    let mut builder = SdkTracerProvider::builder()
        .with_resource(resource)
        .with_batch_exporter(exporter);
    if let Some(sampler) = sampler {
        builder = builder.with_sampler(sampler);
    }
    Ok(builder.build())
}

/// Installs the global subscriber: logs on stdout (text, coloured only on a
/// terminal, or JSON) at the level of `RUST_LOG` (default `info`), plus,
/// only when `OTEL_EXPORTER_OTLP_ENDPOINT` or
/// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set, span export over OTLP/gRPC
/// with `service.name` from `OTEL_SERVICE_NAME` or `service_name`. With
/// export, call it inside a Tokio runtime. `sampler` decides which traces
/// are kept (default: every trace without an unsampled parent).
pub fn init(
    service_name: &str,
    log_format: LogFormat,
    sampler: Option<SharedSampler>,
) -> Result<TelemetryGuard, Error> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let fmt = tracing_subscriber::fmt::layer().with_ansi(std::io::stdout().is_terminal());
    let fmt = match log_format {
        LogFormat::Text => fmt.boxed(),
        LogFormat::Json => fmt.json().boxed(),
    };
    let provider = if export_configured() {
        Some(tracer_provider(service_name, sampler)?)
    } else {
        None
    };
    // Off means no layer at all, not a layer that drops everything.
    let otel = provider.as_ref().map(|provider| {
        tracing_opentelemetry::layer().with_tracer(provider.tracer(service_name.to_owned()))
    });
    tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .with(otel)
        .try_init()?;
    SPANS_EXPORTED.store(provider.is_some(), Ordering::Relaxed);
    Ok(TelemetryGuard { provider })
}

/// [`init`] for a binary's `main`: a failure is said on stderr, as no
/// logger exists yet, and gives `None`, for `main` to exit with a failure.
pub fn init_for_main(
    service_name: &str,
    log_format: LogFormat,
    sampler: Option<SharedSampler>,
) -> Option<TelemetryGuard> {
    init(service_name, log_format, sampler)
        .inspect_err(|err| eprintln!("cannot set up logging and tracing: {err}"))
        .ok()
}

/// Records the span's trace ID in its [`TRACE_ID_FIELD`] field, so log lines
/// lead to the trace. Does nothing unless the span is sampled for export.
pub fn record_trace_id(span: &tracing::Span) {
    let context = span.context();
    let span_context = context.span().span_context().clone();
    if span_context.is_valid() && span_context.is_sampled() {
        span.record(TRACE_ID_FIELD, span_context.trace_id().to_string());
    }
}

/// A gRPC code's name as grpc-go prints it (`OK`, `InvalidArgument`,
/// `Canceled`, ...), the label value dashboards share across languages.
pub fn grpc_code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "Canceled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}
