//! Events are published from a bounded background queue, as client-go's
//! event broadcaster does: they are best-effort, so a reconcile never waits
//! for one, and a burst of Events cannot slow down the status writes users
//! wait for. When the queue is full, new Events are dropped and counted.
//!
//! The operator writes through [`EventWriter`], not kube's `Recorder`: the
//! Recorder keeps every Event it wrote for six minutes (to count repeats
//! into a series) and scans that whole cache on every publish. With one
//! Event per Pet that is memory and CPU growing with N, and N² scans while
//! a large batch converges, for series our Events rarely form (each reason
//! is published once per change).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::{Notify, mpsc};

use crate::metrics::Metrics;

type PublishFuture<'a> = Pin<Box<dyn Future<Output = Result<(), kube::Error>> + Send + 'a>>;

/// Something that writes one Event to the API server.
pub trait Publish: Send + Sync + 'static {
    fn publish<'a>(&'a self, event: &'a Event, regarding: &'a ObjectReference)
    -> PublishFuture<'a>;
}

impl Publish for Recorder {
    fn publish<'a>(
        &'a self,
        event: &'a Event,
        regarding: &'a ObjectReference,
    ) -> PublishFuture<'a> {
        Box::pin(Recorder::publish(self, event, regarding))
    }
}

/// Creates each Event as a new `events.k8s.io/v1` object and keeps nothing.
pub struct EventWriter {
    client: Client,
    reporter: Reporter,
}

impl EventWriter {
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Self { client, reporter }
    }

    /// The object kube's Recorder would create for a first occurrence.
    pub fn event_object(
        &self,
        event: &Event,
        regarding: &ObjectReference,
        now: Timestamp,
    ) -> K8sEvent {
        let controller = &self.reporter.controller;
        K8sEvent {
            action: Some(event.action.clone()),
            reason: Some(event.reason.clone()),
            note: event.note.clone(),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            related: event.secondary.clone(),
            metadata: ObjectMeta {
                namespace: regarding.namespace.clone(),
                name: Some(format!(
                    "{}.{:x}",
                    regarding.name.as_deref().unwrap_or(controller),
                    now.as_nanosecond()
                )),
                ..ObjectMeta::default()
            },
            reporting_controller: Some(controller.clone()),
            reporting_instance: Some(
                self.reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| controller.clone()),
            ),
            type_: Some(
                match event.type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .into(),
            ),
            ..K8sEvent::default()
        }
    }
}

impl Publish for EventWriter {
    fn publish<'a>(
        &'a self,
        event: &'a Event,
        regarding: &'a ObjectReference,
    ) -> PublishFuture<'a> {
        Box::pin(async move {
            let object = self.event_object(event, regarding, Timestamp::now());
            let namespace = regarding.namespace.as_deref().unwrap_or("default");
            Api::<K8sEvent>::namespaced(self.client.clone(), namespace)
                .create(&PostParams::default(), &object)
                .await
                .map(drop)
        })
    }
}

/// Events waiting to be written before new ones are dropped.
pub const QUEUE_CAPACITY: usize = 4096;

#[derive(Clone)]
pub struct EventQueue {
    queue: mpsc::Sender<(Event, ObjectReference)>,
    pending: Arc<AtomicUsize>,
    drained: Arc<Notify>,
    metrics: Arc<Metrics>,
}

impl EventQueue {
    /// Starts the background writer on the current Tokio runtime.
    pub fn start(recorder: impl Publish, metrics: Arc<Metrics>) -> Self {
        let (queue, mut events) = mpsc::channel::<(Event, ObjectReference)>(QUEUE_CAPACITY);
        let pending = Arc::new(AtomicUsize::new(0));
        let drained = Arc::new(Notify::new());
        let (worker_pending, worker_drained) = (Arc::clone(&pending), Arc::clone(&drained));
        let worker_metrics = Arc::clone(&metrics);
        tokio::spawn(async move {
            while let Some((event, reference)) = events.recv().await {
                // Refused in a terminating namespace, for one; never fatal.
                if let Err(err) = Publish::publish(&recorder, &event, &reference).await {
                    tracing::debug!(error = %err, reason = %event.reason, "could not publish event");
                }
                worker_metrics.event_written();
                if worker_pending.fetch_sub(1, Ordering::AcqRel) == 1 {
                    worker_drained.notify_waiters();
                }
            }
        });
        Self {
            queue,
            pending,
            drained,
            metrics,
        }
    }

    pub fn publish(&self, event: Event, reference: ObjectReference) {
        self.pending.fetch_add(1, Ordering::AcqRel);
        self.metrics.event_queued();
        if self.queue.try_send((event, reference)).is_err() {
            self.pending.fetch_sub(1, Ordering::AcqRel);
            self.metrics.event_written();
            self.metrics.event_dropped();
            tracing::debug!("event queue full; dropping an event");
        }
    }

    /// Events queued but not yet written.
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::Acquire)
    }

    /// Resolves once every queued Event has been written (or refused).
    pub async fn flush(&self) {
        loop {
            let drained = self.drained.notified();
            if self.pending() == 0 {
                return;
            }
            drained.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A Client needs a runtime to start, though this test sends nothing.
    #[tokio::test]
    async fn writes_what_the_recorder_would_for_a_first_event() {
        let writer = EventWriter::new(
            Client::new(
                tower_test::mock::pair::<
                    http::Request<kube::client::Body>,
                    http::Response<kube::client::Body>,
                >()
                .0,
                "default",
            ),
            Reporter {
                controller: "petstore-operator".into(),
                instance: Some("replica-1".into()),
            },
        );
        let regarding = ObjectReference {
            name: Some("thor".into()),
            namespace: Some("pets".into()),
            kind: Some("Pet".into()),
            ..ObjectReference::default()
        };
        let event = Event {
            type_: EventType::Warning,
            reason: "Recreated".into(),
            note: Some("record was missing".into()),
            action: "Reconcile".into(),
            secondary: None,
        };
        let now = Timestamp::from_second(1_700_000_000).expect("valid timestamp");
        let object = writer.event_object(&event, &regarding, now);
        assert_eq!(object.metadata.namespace.as_deref(), Some("pets"));
        assert_eq!(
            object.metadata.name,
            Some(format!("thor.{:x}", now.as_nanosecond()))
        );
        assert_eq!(object.type_.as_deref(), Some("Warning"));
        assert_eq!(object.reason.as_deref(), Some("Recreated"));
        assert_eq!(object.note.as_deref(), Some("record was missing"));
        assert_eq!(object.regarding, Some(regarding));
        assert_eq!(
            object.reporting_controller.as_deref(),
            Some("petstore-operator")
        );
        assert_eq!(object.reporting_instance.as_deref(), Some("replica-1"));
        assert!(object.series.is_none());
    }
}
