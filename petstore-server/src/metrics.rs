//! The store's Prometheus metrics (prefix `petstore_server_`) and the HTTP
//! endpoint that serves them.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use petstore_telemetry::SamplerSetting;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};
use tokio::net::TcpListener;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RpcLabels {
    /// The RPC's name, e.g. `AddPets`.
    method: &'static str,
    /// The gRPC code as grpc-go names it, e.g. `OK`, `InvalidArgument`.
    code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TerminationLabels {
    /// Why the store ended a watch stream: `slow`, `compacted`, `shutdown`.
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadLabels {
    /// `ok` (in use from the next handshake) or `failed` (the certificates
    /// in use stay).
    outcome: &'static str,
}

impl ReloadLabels {
    /// The label a reload's outcome is counted under, in the one spelling
    /// both the counter and its zeroed start use.
    fn of(ok: bool) -> Self {
        Self {
            outcome: if ok { "ok" } else { "failed" },
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusalLabels {
    /// The RPC's name, e.g. `AddPets`.
    method: &'static str,
    /// Why tenancy refused it: `unauthenticated`, `namespace_not_allowed`,
    /// `observer_only`, `cross_tenant`, `unclaimed`, `observer_write`,
    /// `identity_namespace`, `certificate_mismatch`.
    reason: &'static str,
}

pub struct ServerMetrics {
    registry: Registry,
    rpc_duration: Family<RpcLabels, Histogram>,
    in_flight: Gauge,
    sampler_ratio: Gauge<f64, AtomicU64>,
    watchers: Gauge,
    watch_revision: Gauge,
    watch_terminated: Family<TerminationLabels, Counter>,
    tenant_refusals: Family<RefusalLabels, Counter>,
    tls_reloads: Family<ReloadLabels, Counter>,
    connections_refused: Counter,
    /// Whether the pet store service answers: `/readyz`, for a probe that
    /// cannot speak the TLS the gRPC port may require.
    serving: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for ServerMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerMetrics").finish_non_exhaustive()
    }
}

impl Default for ServerMetrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("petstore_server");
        // 50 µs (an in-memory call) to about 13 s (a stalled database).
        let rpc_duration = Family::<RpcLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.00005, 2.5, 15))
        });
        registry.register_with_unit(
            "rpc_duration",
            "Time to answer a pet store RPC (for SearchPets, until the stream starts), by method and gRPC code",
            Unit::Seconds,
            rpc_duration.clone(),
        );
        let in_flight = Gauge::default();
        registry.register(
            "rpcs_in_flight",
            "Pet store RPCs being answered now",
            in_flight.clone(),
        );
        let sampler_ratio = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "trace_sampler_ratio",
            "Fraction of new traces the store samples: 0 never, 1 always (ChangeSampler sets it)",
            sampler_ratio.clone(),
        );
        let watchers = Gauge::default();
        registry.register("watchers", "WatchPets streams open now", watchers.clone());
        let watch_revision = Gauge::default();
        registry.register(
            "watch_revision",
            "The store's latest revision, as its change feed (WatchPets) knows it",
            watch_revision.clone(),
        );
        let watch_terminated = Family::<TerminationLabels, Counter>::default();
        registry.register(
            "watch_terminated",
            "WatchPets streams the store ended, by reason: slow (the client's buffer filled), compacted (it fell behind the kept history), shutdown",
            watch_terminated.clone(),
        );
        let tenant_refusals = Family::<RefusalLabels, Counter>::default();
        registry.register(
            "tenant_refusals",
            "Calls tenancy refused, by method and reason: unauthenticated (no or a bad token), namespace_not_allowed, observer_only, cross_tenant, unclaimed (a record from before tenancy, claimed only by import), observer_write, identity_namespace, certificate_mismatch (a token the client certificate may not carry)",
            tenant_refusals.clone(),
        );
        let tls_reloads = Family::<ReloadLabels, Counter>::default();
        // Both outcomes from the start: an alert on `failed` reads 0, not
        // an absent series.
        for ok in [true, false] {
            tls_reloads.get_or_create(&ReloadLabels::of(ok)).inc_by(0);
        }
        registry.register(
            "tls_reloads",
            "Reloads of the TLS files (--tls-cert, --tls-key, --tls-client-ca) after they changed, by outcome: ok (used from the next handshake on), failed (a file missing, unreadable or not matching the others: the certificates in use stay until the files change again)",
            tls_reloads.clone(),
        );
        let connections_refused = Counter::default();
        registry.register(
            "connections_refused",
            "Connections closed as soon as accepted, because their client (an IP address) held as many as --max-connections-per-client allows",
            connections_refused.clone(),
        );
        Self {
            registry,
            rpc_duration,
            in_flight,
            sampler_ratio,
            watchers,
            watch_revision,
            watch_terminated,
            tenant_refusals,
            tls_reloads,
            connections_refused,
            serving: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

/// Counts one RPC as in flight until dropped.
pub struct InFlight(Gauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl ServerMetrics {
    pub fn observe_rpc(&self, method: &'static str, code: tonic::Code, elapsed: Duration) {
        self.rpc_duration
            .get_or_create(&RpcLabels {
                method,
                code: petstore_telemetry::grpc_code_name(code),
            })
            .observe(elapsed.as_secs_f64());
    }

    pub fn in_flight(&self) -> InFlight {
        self.in_flight.inc();
        InFlight(self.in_flight.clone())
    }

    /// Counts one watch stream as open until dropped.
    pub fn watcher_opened(&self) -> InFlight {
        self.watchers.inc();
        InFlight(self.watchers.clone())
    }

    pub fn set_watch_revision(&self, revision: i64) {
        self.watch_revision.set(revision);
    }

    /// Counts one watch stream the store ended, by `reason` (the caller's
    /// label for why: metrics records reasons, the watch defines them).
    pub fn watch_terminated(&self, reason: &'static str) {
        self.watch_terminated
            .get_or_create(&TerminationLabels { reason })
            .inc();
    }

    /// Counts one call tenancy refused, by `reason` (the label tenancy
    /// names it by).
    pub fn tenant_refused(&self, method: &'static str, reason: &'static str) {
        self.tenant_refusals
            .get_or_create(&RefusalLabels { method, reason })
            .inc();
    }

    /// Counts one reload of the TLS files that changed: `ok` or not.
    /// A connection closed because its client held too many.
    pub fn connection_refused(&self) {
        self.connections_refused.inc();
    }

    pub fn tls_reloaded(&self, ok: bool) {
        self.tls_reloads.get_or_create(&ReloadLabels::of(ok)).inc();
    }

    pub fn set_sampler(&self, setting: SamplerSetting) {
        self.sampler_ratio.set(setting.ratio());
    }

    /// Said by the server as its health service says SERVING or
    /// NOT_SERVING.
    pub fn set_serving(&self, serving: bool) {
        self.serving
            .store(serving, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn is_serving(&self) -> bool {
        self.serving.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The metrics in the Prometheus text format.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

impl petstore_telemetry::OpenMetrics for ServerMetrics {
    fn encode(&self) -> Result<String, std::fmt::Error> {
        ServerMetrics::encode(self)
    }
}

/// `/readyz`: 200 while the pet store service is SERVING, as the gRPC
/// health service says, else 503.
async fn readyz(
    axum::extract::State(metrics): axum::extract::State<Arc<ServerMetrics>>,
) -> (axum::http::StatusCode, &'static str) {
    if metrics.is_serving() {
        (axum::http::StatusCode::OK, "ok\n")
    } else {
        (axum::http::StatusCode::SERVICE_UNAVAILABLE, "not serving\n")
    }
}

/// Serves `GET /metrics`, and the probes `GET /healthz` (the process
/// answers) and `GET /readyz` (the pet store service is serving), on
/// `listener` until `shutdown` resolves. Plain HTTP: a kubelet probe
/// cannot present the client certificate a store with mutual TLS asks for
/// on its gRPC port.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<ServerMetrics>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let probes = axum::Router::new()
        .route("/healthz", axum::routing::get(|| async { "ok\n" }))
        .route("/readyz", axum::routing::get(readyz))
        .with_state(Arc::clone(&metrics));
    let app = petstore_telemetry::metrics_router(metrics).merge(probes);
    petstore_telemetry::serve_http(listener, app, "metrics", shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_have_the_documented_names() {
        let metrics = ServerMetrics::default();
        metrics.observe_rpc("AddPets", tonic::Code::Ok, Duration::from_millis(1));
        metrics.observe_rpc(
            "ChangeSampler",
            tonic::Code::InvalidArgument,
            Duration::from_millis(1),
        );
        metrics.set_sampler(SamplerSetting::Ratio(0.25));
        let in_flight = metrics.in_flight();
        let watcher = metrics.watcher_opened();
        metrics.set_watch_revision(42);
        metrics.watch_terminated("slow");
        metrics.tenant_refused("UpdatePets", "cross_tenant");
        metrics.tls_reloaded(true);
        let text = metrics.encode().expect("encode");
        for series in [
            "petstore_server_rpc_duration_seconds_count{method=\"AddPets\",code=\"OK\"} 1",
            "petstore_server_rpc_duration_seconds_count{method=\"ChangeSampler\",code=\"InvalidArgument\"} 1",
            "petstore_server_rpcs_in_flight 1",
            "petstore_server_trace_sampler_ratio 0.25",
            "petstore_server_watchers 1",
            "petstore_server_watch_revision 42",
            "petstore_server_watch_terminated_total{reason=\"slow\"} 1",
            "petstore_server_tenant_refusals_total{method=\"UpdatePets\",reason=\"cross_tenant\"} 1",
            "petstore_server_tls_reloads_total{outcome=\"ok\"} 1",
            "petstore_server_tls_reloads_total{outcome=\"failed\"} 0",
            "# HELP petstore_server_rpc_duration_seconds ",
            "# HELP petstore_server_rpcs_in_flight ",
            "# HELP petstore_server_trace_sampler_ratio ",
        ] {
            assert!(text.contains(series), "no {series:?} in\n{text}");
        }
        drop(in_flight);
        drop(watcher);
        assert!(
            metrics
                .encode()
                .expect("encode")
                .contains("petstore_server_rpcs_in_flight 0")
        );
    }

    /// GET `path` on `addr`: the status line's code.
    async fn status_of(addr: std::net::SocketAddr, path: &str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let request = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.expect("send");
        let mut response = String::new();
        stream.read_to_string(&mut response).await.expect("read");
        response
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_owned()
    }

    #[tokio::test]
    async fn readyz_follows_the_health_service_and_healthz_the_process() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let metrics = Arc::new(ServerMetrics::default());
        let server = tokio::spawn(serve(
            listener,
            Arc::clone(&metrics),
            std::future::pending(),
        ));
        assert_eq!(status_of(addr, "/readyz").await, "503");
        assert_eq!(status_of(addr, "/healthz").await, "200");
        metrics.set_serving(true);
        assert_eq!(status_of(addr, "/readyz").await, "200");
        assert_eq!(status_of(addr, "/metrics").await, "200");
        metrics.set_serving(false);
        assert_eq!(status_of(addr, "/readyz").await, "503");
        server.abort();
    }
}
