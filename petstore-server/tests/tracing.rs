//! ChangeSampler with the book's message shapes, and the store's spans: a
//! real server on loopback TCP, its spans caught by the SDK's in-memory
//! exporter. Each test runs on a single-threaded runtime, so the server's
//! tasks see the subscriber the test installs for its own thread only, and
//! tests run side by side without sharing spans or samplers.

use std::sync::Arc;

use opentelemetry::trace::{SpanId, TraceId, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use petstore_proto::PetStoreClient;
use petstore_proto::petstore::{self as pb, SamplerType};
use petstore_server::server::ServeOptions;
use petstore_server::service::Observability;
use petstore_server::storage::StorageConfig;
use petstore_telemetry::{SamplerSetting, SharedSampler};
use tonic::Code;
use tonic::transport::Channel;
use tracing::subscriber::DefaultGuard;
use tracing_subscriber::layer::SubscriberExt;

mod support;

use support::Running;

const ADD_PETS_SPAN: &str = "petstore.PetStore/AddPets";

struct Store {
    client: PetStoreClient<Channel>,
    spans: InMemorySpanExporter,
    observability: Observability,
    /// Serves until the test ends.
    _server: Running,
    _provider: SdkTracerProvider,
    _subscriber: DefaultGuard,
}

/// A memory store with tracing on, starting with the sampler `never`.
async fn start() -> Store {
    let sampler = SharedSampler::new(SamplerSetting::Never);
    let spans = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_sampler(sampler.clone())
        .with_simple_exporter(spans.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
    let guard = tracing::subscriber::set_default(subscriber);

    let storage = StorageConfig::Memory.open().await.expect("memory storage");
    let options = ServeOptions {
        observability: Observability::new(sampler, true),
        ..Default::default()
    };
    let dir = Arc::new(tempfile::tempdir().expect("tempdir"));
    let server = Running::serve(storage, dir, options).await;
    Store {
        client: server.client.clone(),
        spans,
        observability: server.observability.clone(),
        _server: server,
        _provider: provider,
        _subscriber: guard,
    }
}

fn add_request() -> pb::AddPetsReq {
    pb::AddPetsReq {
        pets: vec![support::thor()],
    }
}

fn sampler(kind: SamplerType, float_value: f64) -> pb::ChangeSamplerReq {
    pb::ChangeSamplerReq {
        sampler: Some(pb::Sampler {
            r#type: kind.into(),
            float_value,
        }),
    }
}

impl Store {
    async fn change_sampler(&mut self, request: pb::ChangeSamplerReq) -> Result<(), tonic::Status> {
        self.client.change_sampler(request).await.map(|_| ())
    }

    /// ChangeSampler, which must succeed.
    async fn set_sampler(&mut self, kind: SamplerType, float_value: f64) {
        self.change_sampler(sampler(kind, float_value))
            .await
            .unwrap_or_else(|status| panic!("{kind:?} {float_value}: {status:?}"));
    }

    async fn add_pets(&mut self, count: usize) {
        for _ in 0..count {
            self.client.add_pets(add_request()).await.expect("AddPets");
        }
    }

    fn finished(&self, name: &str) -> Vec<SpanData> {
        self.spans
            .get_finished_spans()
            .expect("spans")
            .into_iter()
            .filter(|span| span.name == name)
            .collect()
    }

    fn sampler_gauge(&self) -> String {
        let text = self.observability.metrics.encode().expect("metrics");
        text.lines()
            .find_map(|line| line.strip_prefix("petstore_server_trace_sampler_ratio "))
            .expect("sampler gauge")
            .to_owned()
    }
}

#[tokio::test]
async fn never_and_always_switch_new_traces_off_and_on() {
    let mut store = start().await;
    store.add_pets(20).await;
    assert_eq!(
        store.finished(ADD_PETS_SPAN).len(),
        0,
        "the default is never"
    );

    store.set_sampler(SamplerType::StAlways, 0.0).await;
    assert_eq!(store.sampler_gauge(), "1.0");
    store.add_pets(20).await;
    assert_eq!(store.finished(ADD_PETS_SPAN).len(), 20);

    store.set_sampler(SamplerType::StNever, 0.0).await;
    assert_eq!(store.sampler_gauge(), "0.0");
    store.add_pets(20).await;
    assert_eq!(store.finished(ADD_PETS_SPAN).len(), 20, "no new traces");

    let text = store.observability.metrics.encode().expect("metrics");
    assert!(
        text.contains(
            "petstore_server_rpc_duration_seconds_count{method=\"AddPets\",code=\"OK\"} 60"
        ),
        "{text}"
    );
}

#[tokio::test]
async fn a_float_sampler_samples_about_that_fraction() {
    let mut store = start().await;
    store.set_sampler(SamplerType::StFloat, 0.2).await;
    assert_eq!(store.sampler_gauge(), "0.2");
    // 0.2, not 0.5, so a sampler that keeps 1 - p of the traces fails too.
    // Each call is a new trace with a random ID, so the count is
    // Binomial(400, 0.2): mean 80, standard deviation 8. 48..=112 is 4
    // standard deviations either side: a correct sampler falls outside it
    // with probability 5.6e-5 (exact binomial tails). One keeping 0.8 falls
    // inside with probability 3e-111, one keeping 0.5 with 3e-19.
    store.add_pets(400).await;
    let sampled = store.finished(ADD_PETS_SPAN).len();
    assert!((48..=112).contains(&sampled), "sampled {sampled} of 400");
}

#[tokio::test]
async fn invalid_samplers_are_rejected_naming_the_field() {
    let mut store = start().await;
    store.set_sampler(SamplerType::StFloat, 0.25).await;
    let cases = [
        (sampler(SamplerType::StUnknown, 0.5), "sampler.type"),
        (sampler(SamplerType::StFloat, 0.0), "sampler.float_value"),
        (sampler(SamplerType::StFloat, 1.5), "sampler.float_value"),
        (
            sampler(SamplerType::StFloat, f64::NAN),
            "sampler.float_value",
        ),
        (sampler(SamplerType::StFloat, -0.5), "sampler.float_value"),
        (
            pb::ChangeSamplerReq { sampler: None },
            "sampler: is required",
        ),
    ];
    for (request, field) in cases {
        let status = store
            .change_sampler(request)
            .await
            .expect_err(&format!("{request:?} accepted"));
        assert_eq!(status.code(), Code::InvalidArgument, "{request:?}");
        assert!(
            status.message().contains(field),
            "{request:?}: {:?} does not name {field}",
            status.message()
        );
    }
    assert_eq!(
        store.sampler_gauge(),
        "0.25",
        "a rejected request changes nothing"
    );
}

#[tokio::test]
async fn a_sampled_parent_is_followed_and_becomes_the_parent() {
    let mut store = start().await;
    let trace_id = TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").expect("trace ID");
    let parent_id = SpanId::from_hex("00f067aa0ba902b7").expect("span ID");
    let mut request = tonic::Request::new(add_request());
    request.metadata_mut().insert(
        "traceparent",
        format!("00-{trace_id}-{parent_id}-01")
            .parse()
            .expect("metadata"),
    );
    store.client.add_pets(request).await.expect("AddPets");

    // Sampled although the store's sampler is `never`.
    let rpc = store.finished(ADD_PETS_SPAN);
    let [rpc] = rpc.as_slice() else {
        panic!("expected one AddPets span, got {rpc:?}");
    };
    assert_eq!(rpc.span_context.trace_id(), trace_id);
    assert_eq!(rpc.parent_span_id, parent_id);
    assert!(rpc.parent_span_is_remote);
    let attribute = |key: &str| {
        rpc.attributes
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| kv.value.to_string())
    };
    assert_eq!(attribute("rpc.system").as_deref(), Some("grpc"));
    assert_eq!(
        attribute("rpc.service").as_deref(),
        Some("petstore.PetStore")
    );
    assert_eq!(attribute("rpc.method").as_deref(), Some("AddPets"));
    assert_eq!(attribute("rpc.grpc.status_code").as_deref(), Some("0"));

    let storage = store.finished("storage.add_pets");
    let [storage] = storage.as_slice() else {
        panic!("expected one storage span, got {storage:?}");
    };
    assert_eq!(storage.span_context.trace_id(), trace_id);
    assert_eq!(storage.parent_span_id, rpc.span_context.span_id());
}

#[tokio::test]
async fn a_trace_key_in_the_metadata_is_sampled_under_never() {
    let mut store = start().await;
    store.add_pets(5).await;
    let mut request = tonic::Request::new(add_request());
    request
        .metadata_mut()
        .insert("trace", "1".parse().expect("metadata"));
    store.client.add_pets(request).await.expect("AddPets");
    store.add_pets(5).await;

    let rpc = store.finished(ADD_PETS_SPAN);
    assert_eq!(rpc.len(), 1, "only the call with a trace key: {rpc:?}");
    assert_eq!(rpc[0].parent_span_id, SpanId::INVALID, "a root span");
    assert_eq!(store.finished("storage.add_pets").len(), 1);
}
