//! Prometheus metrics and the HTTP endpoints `/metrics`, `/healthz` and
//! `/readyz`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::decision::feed::Verdict as FeedVerdict;
use crate::decision::{Cause, StoreAction};
use crate::status::Reason;
use crate::store::Field;
use crate::store::grpc::StoreCallMetrics;

/// Each type's label value is the word it already has for itself.
macro_rules! label_values {
    ($($(#[$doc:meta])* $kind:ty => $word:ident;)*) => {$(
        $(#[$doc])*
        impl EncodeLabelValue for $kind {
            fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
                std::fmt::Write::write_str(encoder, self.$word())
            }
        }
    )*};
}

label_values! {
    StoreAction => label;
    /// The snake_case reason, as conditions and Events give it in CamelCase.
    Reason => metric_label;
    Cause => as_str;
    Field => as_str;
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    reason: Reason,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActionLabels {
    action: StoreAction,
    cause: Cause,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DriftLabels {
    field: Field,
}

/// What the controller knows about its Pets at a scrape: see
/// [`Metrics::gauges_from`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PetGauges {
    pub queue_depth: i64,
    pub queue_oldest_age: Duration,
    pub not_ready: i64,
    pub not_ready_oldest: Duration,
    pub repeated_drift: i64,
    /// Pets showing a plan they have not written.
    pub plans_pending: i64,
    pub plan_oldest_age: Duration,
}

type GaugeSource = Box<dyn Fn() -> PetGauges + Send + Sync>;

pub struct Metrics {
    registry: Registry,
    reconciles: Counter,
    reconcile_errors: Family<ErrorLabels, Counter>,
    reconcile_duration: Histogram,
    queue_wait: Histogram,
    store_calls: StoreCallMetrics,
    store_actions: Family<ActionLabels, Counter>,
    time_to_ready: Histogram,
    drift_detected: Family<DriftLabels, Counter>,
    queue_depth: Gauge,
    drift_storms: Gauge,
    queue_oldest_age: Gauge<f64, AtomicU64>,
    not_ready: Gauge,
    not_ready_oldest: Gauge<f64, AtomicU64>,
    repeated_drift: Gauge,
    plans_pending: Gauge,
    plan_oldest_age: Gauge<f64, AtomicU64>,
    gauge_source: OnceLock<GaugeSource>,
    leader: Gauge,
    installation_claimed: Gauge,
    events_dropped: Counter,
    events_pending: Gauge,
    poll_interval: Gauge<f64, AtomicU64>,
    feed_connected: Gauge,
    feed_changes: Family<FeedLabels, Counter>,
    store_feeds: Family<FeedStateLabels, Gauge>,
    pub migration: crate::migration::MigrationMetrics,
    ready: AtomicBool,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FeedLabels {
    /// What the change meant: `drifted`, `in_sync` or `unrelated`.
    verdict: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FeedStateLabels {
    /// `connecting`, `live`, `broken`, `absent` or `refused`.
    state: &'static str,
}

/// One reconcile in progress; see [`Metrics::reconcile_timer`].
pub struct ReconcileTimer<'a> {
    metrics: &'a Metrics,
    started: Instant,
}

impl Drop for ReconcileTimer<'_> {
    fn drop(&mut self) {
        self.metrics
            .reconcile_duration
            .observe(self.started.elapsed().as_secs_f64());
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("petstore_operator");
        let reconciles = Counter::default();
        let reconcile_errors = Family::<ErrorLabels, Counter>::default();
        let reconcile_duration = Histogram::new(exponential_buckets(0.001, 2.0, 14));
        // 1 ms to about 33 s: the service level is 1 s at the p99.
        let queue_wait = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        let store_calls = StoreCallMetrics::default();
        let store_actions = Family::<ActionLabels, Counter>::default();
        // 50 ms to about 3.6 hours: a Pet is usually Ready in well under a
        // second, and a store outage can hold it for hours.
        let time_to_ready = Histogram::new(exponential_buckets(0.05, 2.0, 19));
        let drift_detected = Family::<DriftLabels, Counter>::default();
        let queue_depth = Gauge::default();
        let drift_storms = Gauge::default();
        let queue_oldest_age = Gauge::<f64, AtomicU64>::default();
        let not_ready = Gauge::default();
        let not_ready_oldest = Gauge::<f64, AtomicU64>::default();
        let repeated_drift = Gauge::default();
        let plans_pending = Gauge::default();
        let plan_oldest_age = Gauge::<f64, AtomicU64>::default();
        let leader = Gauge::default();
        let installation_claimed = Gauge::default();
        let events_dropped = Counter::default();
        let events_pending = Gauge::default();
        let poll_interval = Gauge::<f64, AtomicU64>::default();
        let feed_connected = Gauge::default();
        registry.register(
            "change_feed_connected",
            "1 while the store's change feed is followed (drift found from it, the poll only audits); 0 while polling",
            feed_connected.clone(),
        );
        let feed_changes = Family::<FeedLabels, Counter>::default();
        registry.register(
            "change_feed_changes",
            "Record changes read from the store's change feed, by what they meant for their Pet",
            feed_changes.clone(),
        );
        let store_feeds = Family::<FeedStateLabels, Gauge>::default();
        // Every state from the start, at 0: an alert on `refused` reads 0,
        // not an absent series, while every store is followed.
        for state in ["connecting", "live", "broken", "absent", "refused"] {
            store_feeds.get_or_create(&FeedStateLabels { state }).set(0);
        }
        registry.register(
            "change_feed_stores",
            "PetStores and ClusterPetStores open, by the state of their change feed: connecting, live (followed; their Pets are only audited), broken (reconnecting), absent (the store has no feed) or refused (the store does not take the operator as its --observer); their Pets are polled unless live",
            store_feeds.clone(),
        );
        registry.register(
            "poll_interval_seconds",
            "Drift-poll interval in effect (stretched when the Pets outnumber the poll rate bound)",
            poll_interval.clone(),
        );
        registry.register(
            "events_pending",
            "Events queued and not yet written",
            events_pending.clone(),
        );
        registry.register(
            "events_dropped",
            "Events dropped because the Event queue was full",
            events_dropped.clone(),
        );
        registry.register("reconciles", "Reconciliations started", reconciles.clone());
        registry.register(
            "reconcile_errors",
            "Reconciliations that failed, by reason",
            reconcile_errors.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Time spent in one reconciliation",
            reconcile_duration.clone(),
        );
        registry.register(
            "queue_wait_seconds",
            "Time a Pet waited for its reconcile's turn, from the first trigger not yet run (a watch event, a change on the store's feed, a due poll) to its hand-over to the reconciler",
            queue_wait.clone(),
        );
        store_calls.register(&mut registry);
        registry.register(
            "store_actions",
            "Store changes made by the reconciler: create, recreate, update, claim (adoption), release (Orphan), delete; by cause: new_pet, spec_change, drift, adoption, deletion",
            store_actions.clone(),
        );
        registry.register(
            "time_to_ready_seconds",
            "Time from a Pet's creation or spec change to Ready=True",
            time_to_ready.clone(),
        );
        registry.register(
            "drift_detected",
            "Changes made outside the operator and corrected, by field (record: the record vanished)",
            drift_detected.clone(),
        );
        registry.register(
            "drift_storm_stores",
            "Stores in a drift storm: so many of their records drifted at once that drift is not written back to them until each plan is approved",
            drift_storms.clone(),
        );
        registry.register(
            "queue_depth",
            "Pets due for a reconcile that has not started",
            queue_depth.clone(),
        );
        registry.register(
            "queue_oldest_age_seconds",
            "How long the longest-waiting Pet due for a reconcile has waited",
            queue_oldest_age.clone(),
        );
        registry.register(
            "not_ready_pets",
            "Pets being brought in line that are not Ready yet (paused or rejected Pets wait for a change and are not counted)",
            not_ready.clone(),
        );
        registry.register(
            "not_ready_oldest_seconds",
            "How long the longest-waiting of the not_ready_pets has not been Ready",
            not_ready_oldest.clone(),
        );
        registry.register(
            "repeated_drift_pets",
            "Pets whose record was corrected for drift 3 or more times in the last hour: something else writes to it",
            repeated_drift.clone(),
        );
        registry.register(
            "plans_pending",
            "Pets showing a plan (status.plan) that is not written: changePolicy Approve waiting for approval, or Observe with a record that differs",
            plans_pending.clone(),
        );
        registry.register(
            "plan_oldest_age_seconds",
            "How long the longest-waiting of the plans_pending Pets has shown a plan",
            plan_oldest_age.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica holds the leader lease",
            leader.clone(),
        );
        registry.register(
            "installation_claimed",
            "1 while this replica reconciles under its cluster's claim on the installation's name in the store; 0 while another live cluster holds it (the log says which), and for the unnamed installation or a store without claims",
            installation_claimed.clone(),
        );
        let migration = crate::migration::MigrationMetrics::default();
        migration.register(&mut registry);
        Self {
            registry,
            reconciles,
            reconcile_errors,
            reconcile_duration,
            queue_wait,
            store_calls,
            store_actions,
            time_to_ready,
            drift_detected,
            queue_depth,
            drift_storms,
            queue_oldest_age,
            not_ready,
            not_ready_oldest,
            repeated_drift,
            plans_pending,
            plan_oldest_age,
            gauge_source: OnceLock::new(),
            leader,
            installation_claimed,
            events_dropped,
            events_pending,
            poll_interval,
            feed_connected,
            feed_changes,
            store_feeds,
            migration,
            ready: AtomicBool::new(false),
        }
    }
}

impl Metrics {
    /// Counts a reconcile, and observes how long it took when dropped.
    pub fn reconcile_timer(&self) -> ReconcileTimer<'_> {
        self.reconciles.inc();
        ReconcileTimer {
            metrics: self,
            started: Instant::now(),
        }
    }

    /// A Pet's turn came after `waited` in the fair queue.
    pub fn queue_waited(&self, waited: Duration) {
        self.queue_wait.observe(waited.as_secs_f64());
    }

    pub fn reconcile_failed(&self, reason: Reason) {
        self.reconcile_errors
            .get_or_create(&ErrorLabels { reason })
            .inc();
    }

    /// The store client's own handle, sharing this registry's series.
    pub fn store_calls(&self) -> StoreCallMetrics {
        self.store_calls.clone()
    }

    pub fn store_action(&self, action: StoreAction, cause: Cause) {
        self.store_actions
            .get_or_create(&ActionLabels { action, cause })
            .inc();
    }

    pub fn drift_detected(&self, field: Field) {
        self.drift_detected
            .get_or_create(&DriftLabels { field })
            .inc();
    }

    pub fn became_ready(&self, after: Duration) {
        self.time_to_ready.observe(after.as_secs_f64());
    }

    /// The Pet gauges are read from `source` at each scrape rather than kept
    /// up to date on every reconcile (the first call wins).
    pub fn gauges_from(&self, source: impl Fn() -> PetGauges + Send + Sync + 'static) {
        let _ = self.gauge_source.set(Box::new(source));
    }

    pub fn event_queued(&self) {
        self.events_pending.inc();
    }

    pub fn event_written(&self) {
        self.events_pending.dec();
    }

    pub fn event_dropped(&self) {
        self.events_dropped.inc();
    }

    pub fn set_poll_interval(&self, interval: Duration) {
        self.poll_interval.set(interval.as_secs_f64());
    }

    pub fn set_drift_storms(&self, stores: usize) {
        self.drift_storms
            .set(i64::try_from(stores).unwrap_or(i64::MAX));
    }

    pub fn set_feed_connected(&self, connected: bool) {
        self.feed_connected.set(i64::from(connected));
    }

    /// A store's change feed moved from state `from` to `to` (`None`: not
    /// counted, before its follower starts and after it stops).
    pub fn store_feed_moved(&self, from: Option<&'static str>, to: Option<&'static str>) {
        if from == to {
            return;
        }
        if let Some(state) = from {
            self.store_feeds
                .get_or_create(&FeedStateLabels { state })
                .dec();
        }
        if let Some(state) = to {
            self.store_feeds
                .get_or_create(&FeedStateLabels { state })
                .inc();
        }
    }

    pub fn feed_change(&self, verdict: FeedVerdict) {
        self.feed_changes
            .get_or_create(&FeedLabels {
                verdict: verdict.as_str(),
            })
            .inc();
    }

    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }

    pub fn set_installation_claimed(&self, claimed: bool) {
        self.installation_claimed.set(i64::from(claimed));
    }

    /// Ready once the Kubernetes client works; standby replicas are ready too,
    /// so a rollout does not wait for leadership.
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Relaxed);
    }

    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        if let Some(source) = self.gauge_source.get() {
            let gauges = source();
            self.queue_depth.set(gauges.queue_depth);
            self.queue_oldest_age
                .set(gauges.queue_oldest_age.as_secs_f64());
            self.not_ready.set(gauges.not_ready);
            self.not_ready_oldest
                .set(gauges.not_ready_oldest.as_secs_f64());
            self.repeated_drift.set(gauges.repeated_drift);
            self.plans_pending.set(gauges.plans_pending);
            self.plan_oldest_age
                .set(gauges.plan_oldest_age.as_secs_f64());
        }
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

impl petstore_telemetry::OpenMetrics for Metrics {
    fn encode(&self) -> Result<String, std::fmt::Error> {
        Metrics::encode(self)
    }
}

async fn readyz(State(metrics): State<Arc<Metrics>>) -> StatusCode {
    if metrics.ready.load(Ordering::Relaxed) {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `listener` until
/// `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let probes = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(Arc::clone(&metrics));
    let app = petstore_telemetry::metrics_router(metrics).merge(probes);
    petstore_telemetry::serve_http(listener, app, "metrics and health", shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The end-to-end tests, dashboards and the README name these series.
    #[test]
    fn labels_are_the_documented_words() {
        let metrics = Metrics::default();
        let actions = [
            StoreAction::Create,
            StoreAction::Recreate,
            StoreAction::Update,
            StoreAction::Claim,
            StoreAction::Release,
            StoreAction::Delete,
        ];
        for action in actions {
            metrics.store_action(action, Cause::Drift);
        }
        metrics.store_action(StoreAction::Update, Cause::SpecChange);
        metrics.reconcile_failed(Reason::StoreUnavailable);
        metrics.store_calls().observe(
            crate::store::Operation::SetKey,
            "OK",
            Duration::from_millis(1),
        );
        metrics.drift_detected(Field::Name);
        metrics.store_calls().tls_reloaded(false);
        metrics.store_calls().tls_connection(true);
        metrics.became_ready(Duration::from_millis(80));
        metrics.queue_waited(Duration::from_millis(700));
        metrics.gauges_from(|| PetGauges {
            queue_depth: 3,
            queue_oldest_age: Duration::from_millis(1500),
            not_ready: 2,
            not_ready_oldest: Duration::from_secs(61),
            repeated_drift: 1,
            plans_pending: 4,
            plan_oldest_age: Duration::from_secs(90),
        });
        let text = metrics.encode().expect("metrics");
        for action in ["create", "recreate", "update", "claim", "release", "delete"] {
            let series = format!(
                "petstore_operator_store_actions_total{{action=\"{action}\",cause=\"drift\"}} 1"
            );
            assert!(text.contains(&series), "{series} in {text}");
        }
        for series in [
            "petstore_operator_store_actions_total{action=\"update\",cause=\"spec_change\"} 1",
            "petstore_operator_drift_detected_total{field=\"name\"} 1",
            "petstore_operator_tls_reloads_total{outcome=\"ok\"} 0",
            "petstore_operator_tls_reloads_total{outcome=\"failed\"} 1",
            "petstore_operator_store_tls_connections_total{outcome=\"ok\"} 1",
            "petstore_operator_store_tls_connections_total{outcome=\"failed\"} 0",
            "petstore_operator_time_to_ready_seconds_bucket{le=\"0.1\"} 1",
            "petstore_operator_queue_wait_seconds_bucket{le=\"0.512\"} 0",
            "petstore_operator_queue_wait_seconds_bucket{le=\"1.024\"} 1",
            "petstore_operator_queue_depth 3",
            "petstore_operator_queue_oldest_age_seconds 1.5",
            "petstore_operator_not_ready_pets 2",
            "petstore_operator_not_ready_oldest_seconds 61.0",
            "petstore_operator_repeated_drift_pets 1",
            "petstore_operator_plans_pending 4",
            "petstore_operator_plan_oldest_age_seconds 90.0",
        ] {
            assert!(text.contains(series), "{series} in {text}");
        }
        assert!(
            text.contains(
                "petstore_operator_reconcile_errors_total{reason=\"store_unavailable\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "petstore_operator_store_call_duration_seconds_count{method=\"SetIdempotencyKeys\",outcome=\"OK\"} 1"
            ),
            "{text}"
        );
    }
}
