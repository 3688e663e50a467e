//! Events are published from a bounded background queue, as client-go's
//! event broadcaster does: they are best-effort, so a reconcile never waits
//! for one, and a burst of Events cannot slow down the status writes users
//! wait for. When the queue is full, new Events are dropped and counted.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, Recorder};
use tokio::sync::{Notify, mpsc};

use crate::metrics::Metrics;

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
    pub fn start(recorder: Recorder, metrics: Arc<Metrics>) -> Self {
        let (queue, mut events) = mpsc::channel::<(Event, ObjectReference)>(QUEUE_CAPACITY);
        let pending = Arc::new(AtomicUsize::new(0));
        let drained = Arc::new(Notify::new());
        let (worker_pending, worker_drained) = (Arc::clone(&pending), Arc::clone(&drained));
        let worker_metrics = Arc::clone(&metrics);
        tokio::spawn(async move {
            while let Some((event, reference)) = events.recv().await {
                // Refused in a terminating namespace, for one; never fatal.
                if let Err(err) = recorder.publish(&event, &reference).await {
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
