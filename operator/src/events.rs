//! Events are published from bounded background queues, as client-go's
//! event broadcaster does: they are best-effort, so a reconcile never waits
//! for one.
//!
//! Warnings are written at once: they tell a person something is wrong.
//! Normal Events (created, updated, deleted) wait until no Pet has been
//! reconciled for a moment ([`QUIET`]): during a burst of new Pets they
//! would compete with the status writes users wait for, on the same API
//! server and the same cores. They are written once the burst ends, or
//! sooner if their queue fills past half. Each keeps the time it happened.
//! When a queue is full, new Events are dropped and counted.
//!
//! The operator writes through [`EventWriter`], not kube's `Recorder`: the
//! Recorder keeps every Event it wrote for six minutes (to count repeats
//! into a series) and scans that whole cache on every publish. With one
//! Event per Pet that is memory and CPU growing with N, and N² scans while
//! a large batch converges, for series our Events rarely form (each reason
//! is published once per change).
//!
//! So nothing here folds repeats: a Warning written twice is two Event
//! objects. The reconcile publishes a Warning only when the Pet's reason
//! changes, judged by what this process last showed the Pet (the
//! controller's memory), not only by the watch cache's copy, which can
//! predate that status write.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, PostParams};
use kube::runtime::events::{Event, EventType, Reporter};
use tokio::sync::{Notify, mpsc};
// Tokio's clock, not std's: the same instant in production, and one a test
// can pause, so the quiet rule is tested by logic rather than by how fast
// the machine is.
use tokio::time::Instant;

use crate::metrics::Metrics;

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

    /// Writes one Event, which happened at `at`.
    pub async fn write(
        &self,
        event: &Event,
        regarding: &ObjectReference,
        at: Timestamp,
    ) -> Result<(), kube::Error> {
        let object = self.event_object(event, regarding, at);
        let namespace = regarding.namespace.as_deref().unwrap_or("default");
        Api::<K8sEvent>::namespaced(self.client.clone(), namespace)
            .create(&PostParams::default(), &object)
            .await
            .map(drop)
    }
}

/// Normal Events waiting to be written before new ones are dropped. Half
/// of it holds a burst of 30,000 new Pets, at about 250 bytes per queued
/// Event, before any is written during the burst.
pub const QUEUE_CAPACITY: usize = 65_536;

/// Warnings waiting to be written. They are not held back, so this only
/// absorbs a moment when the API server is slow.
pub const WARNING_QUEUE_CAPACITY: usize = 4_096;

/// Events of each kind written at once. One at a time could not keep up
/// with a large batch converging.
pub const CONCURRENT_WRITES: usize = 4;

/// How often a waiting Event checks whether the burst is over.
const BUSY_RECHECK: Duration = Duration::from_millis(20);

/// How long no Pet must have been reconciled before Normal Events are
/// written: gaps between the reconciles of a burst are far shorter, so
/// Events do not slip into them.
pub const QUIET: Duration = Duration::from_millis(100);

/// Reconciles running now, and when the last one ended.
struct Load {
    running: AtomicUsize,
    epoch: Instant,
    /// Milliseconds from `epoch` to the end of the latest reconcile.
    last_end_ms: AtomicU64,
}

impl Load {
    fn new() -> Self {
        Self {
            running: AtomicUsize::new(0),
            epoch: Instant::now(),
            last_end_ms: AtomicU64::new(0),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// No reconcile running, and none ended within [`QUIET`].
    fn is_quiet(&self) -> bool {
        self.running.load(Ordering::Acquire) == 0
            && self
                .now_ms()
                .saturating_sub(self.last_end_ms.load(Ordering::Acquire))
                >= QUIET.as_millis() as u64
    }
}

/// Counts one reconcile as running until dropped.
pub struct Reconciling(Arc<Shared>);

impl Drop for Reconciling {
    fn drop(&mut self) {
        let load = &self.0.load;
        load.last_end_ms.store(load.now_ms(), Ordering::Release);
        load.running.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One queued Event, kept small since a burst queues one per Pet: its text
/// fields share one allocation.
struct Queued {
    type_: EventType,
    at: Timestamp,
    text: Box<str>,
    ends: [u32; FIELDS],
}

/// reason, action, note, kind, apiVersion, namespace, name, uid.
const FIELDS: usize = 8;

impl Queued {
    fn new<'a>(event: &'a Event, regarding: &'a ObjectReference, at: Timestamp) -> Self {
        let field = |s: &'a Option<String>| s.as_deref().unwrap_or_default();
        let parts: [&str; FIELDS] = [
            &event.reason,
            &event.action,
            field(&event.note),
            field(&regarding.kind),
            field(&regarding.api_version),
            field(&regarding.namespace),
            field(&regarding.name),
            field(&regarding.uid),
        ];
        let mut text = String::with_capacity(parts.iter().map(|p| p.len()).sum());
        let mut ends = [0u32; FIELDS];
        for (end, part) in ends.iter_mut().zip(&parts) {
            text.push_str(part);
            // An Event's fields are far below 4 GiB (the API server caps an
            // object at a few MiB); saturate rather than panic regardless.
            *end = u32::try_from(text.len()).unwrap_or(u32::MAX);
        }
        Self {
            type_: event.type_,
            at,
            text: text.into_boxed_str(),
            ends,
        }
    }

    fn field(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        self.text
            .get(start..self.ends[i] as usize)
            .unwrap_or_default()
    }

    fn optional(&self, i: usize) -> Option<String> {
        Some(self.field(i))
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    }

    fn event(&self) -> (Event, ObjectReference) {
        let event = Event {
            type_: self.type_,
            reason: self.field(0).to_owned(),
            action: self.field(1).to_owned(),
            note: self.optional(2),
            secondary: None,
        };
        let regarding = ObjectReference {
            kind: self.optional(3),
            api_version: self.optional(4),
            namespace: self.optional(5),
            name: self.optional(6),
            uid: self.optional(7),
            ..ObjectReference::default()
        };
        (event, regarding)
    }
}

#[derive(Clone)]
pub struct EventQueue {
    normal: mpsc::Sender<Queued>,
    warnings: mpsc::Sender<Queued>,
    shared: Arc<Shared>,
}

/// What the queue's handles, the background task and the reconcile guards
/// share.
struct Shared {
    /// Events queued and not yet written, of both kinds.
    pending: AtomicUsize,
    drained: Notify,
    metrics: Arc<Metrics>,
    load: Load,
}

impl Shared {
    /// Normal Events may be written: no Pet has been reconciled for
    /// [`QUIET`], or the queues hold more than half of the Normal queue's
    /// room.
    fn lull(&self) -> bool {
        self.load.is_quiet() || self.pending.load(Ordering::Acquire) >= QUEUE_CAPACITY / 2
    }

    async fn write(&self, writer: &EventWriter, queued: Queued) {
        let (event, regarding) = queued.event();
        // Refused in a terminating namespace, for one; never fatal.
        if let Err(err) = writer.write(&event, &regarding, queued.at).await {
            tracing::debug!(error = %err, reason = %event.reason, "could not publish event");
        }
        self.metrics.event_written();
        if self.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.drained.notify_waiters();
        }
    }
}

/// The background task: writes Warnings as they come and Normal Events in a
/// lull, up to [`CONCURRENT_WRITES`] of each kind at once. It ends when every
/// queue handle is gone and the queues are empty.
async fn write_queued(
    writer: EventWriter,
    shared: Arc<Shared>,
    mut warnings: mpsc::Receiver<Queued>,
    mut normal: mpsc::Receiver<Queued>,
) {
    let write = |queued| shared.write(&writer, queued);
    let mut warning_writes = FuturesUnordered::new();
    let mut normal_writes = FuturesUnordered::new();
    // The next Normal Event, out of its queue and waiting for a lull.
    let mut next_normal = None;
    loop {
        let lull = shared.lull();
        if lull
            && normal_writes.len() < CONCURRENT_WRITES
            && let Some(queued) = next_normal.take()
        {
            normal_writes.push(write(queued));
        }
        tokio::select! {
            Some(queued) = warnings.recv(), if warning_writes.len() < CONCURRENT_WRITES => {
                warning_writes.push(write(queued));
            }
            Some(queued) = normal.recv(), if next_normal.is_none() => next_normal = Some(queued),
            Some(()) = warning_writes.next() => {}
            Some(()) = normal_writes.next() => {}
            // Nothing says when a burst ends: look again shortly.
            () = tokio::time::sleep(BUSY_RECHECK), if next_normal.is_some() && !lull => {}
            else => break,
        }
    }
}

impl EventQueue {
    /// Starts the background writer on the current Tokio runtime.
    pub fn start(writer: EventWriter, metrics: Arc<Metrics>) -> Self {
        let (normal, normal_queue) = mpsc::channel::<Queued>(QUEUE_CAPACITY);
        let (warnings, warning_queue) = mpsc::channel::<Queued>(WARNING_QUEUE_CAPACITY);
        let shared = Arc::new(Shared {
            pending: AtomicUsize::new(0),
            drained: Notify::new(),
            metrics,
            load: Load::new(),
        });
        tokio::spawn(write_queued(
            writer,
            Arc::clone(&shared),
            warning_queue,
            normal_queue,
        ));
        Self {
            normal,
            warnings,
            shared,
        }
    }

    /// Marks a reconcile as running until the returned guard is dropped.
    pub fn reconciling(&self) -> Reconciling {
        self.shared.load.running.fetch_add(1, Ordering::AcqRel);
        Reconciling(Arc::clone(&self.shared))
    }

    pub fn publish(&self, event: Event, regarding: ObjectReference) {
        self.shared.pending.fetch_add(1, Ordering::AcqRel);
        self.shared.metrics.event_queued();
        let queue = match event.type_ {
            EventType::Warning => &self.warnings,
            EventType::Normal => &self.normal,
        };
        if queue
            .try_send(Queued::new(&event, &regarding, Timestamp::now()))
            .is_err()
        {
            self.shared.pending.fetch_sub(1, Ordering::AcqRel);
            self.shared.metrics.event_written();
            self.shared.metrics.event_dropped();
            tracing::debug!("event queue full; dropping an event");
        }
    }

    /// Events queued but not yet written.
    pub fn pending(&self) -> usize {
        self.shared.pending.load(Ordering::Acquire)
    }

    /// Resolves once every queued Event has been written (or refused).
    pub async fn flush(&self) {
        loop {
            let drained = self.shared.drained.notified();
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

    // The queue's tests run on paused time: the clock moves only when every
    // task waits, jumping to the next timer. So a sleep is exact however
    // loaded the machine is, and a timeout fires only when nothing is left
    // to make progress (a lost wakeup), never because the machine is slow.

    /// How long a test waits for the queue. On paused time: the queue went
    /// idle this long without getting there.
    const PATIENCE: Duration = Duration::from_secs(10);

    /// A mock API server that holds every Event write until the test opens
    /// the gate, and records how many were in flight at once.
    struct GatedWrites {
        in_flight: AtomicUsize,
        most_in_flight: AtomicUsize,
        written: AtomicUsize,
        gate: tokio::sync::Semaphore,
        /// Woken on every change of `in_flight` or `written`: the test waits
        /// on it rather than polling (a polling task never lets paused time
        /// move).
        changed: Notify,
    }

    impl GatedWrites {
        fn closed() -> Arc<Self> {
            Arc::new(Self {
                in_flight: AtomicUsize::new(0),
                most_in_flight: AtomicUsize::new(0),
                written: AtomicUsize::new(0),
                gate: tokio::sync::Semaphore::new(0),
                changed: Notify::new(),
            })
        }

        /// A client of this server: each request waits for the gate, then
        /// gets its body back, as the API server answers a create.
        fn client(self: &Arc<Self>) -> Client {
            let (service, handle) = tower_test::mock::pair::<
                http::Request<kube::client::Body>,
                http::Response<kube::client::Body>,
            >();
            let server = Arc::clone(self);
            tokio::spawn(async move {
                let mut handle = std::pin::pin!(handle);
                while let Some((request, reply)) = handle.next_request().await {
                    let server = Arc::clone(&server);
                    tokio::spawn(async move {
                        let now = server.in_flight.fetch_add(1, Ordering::AcqRel) + 1;
                        server.most_in_flight.fetch_max(now, Ordering::AcqRel);
                        server.changed.notify_waiters();
                        server.gate.acquire().await.expect("gate open").forget();
                        let body = request.into_body().collect_bytes().await.expect("body");
                        server.in_flight.fetch_sub(1, Ordering::AcqRel);
                        server.written.fetch_add(1, Ordering::AcqRel);
                        server.changed.notify_waiters();
                        let response = http::Response::builder()
                            .status(201)
                            .body(kube::client::Body::from(body.to_vec()))
                            .expect("response");
                        reply.send_response(response);
                    });
                }
            });
            Client::new(service, "default")
        }

        /// Waits until `n` writes are in flight; false if that never came.
        async fn until_in_flight(&self, n: usize) -> bool {
            self.until(&self.in_flight, n).await
        }

        /// Waits until `n` writes have ended; false if that never came.
        async fn until_written(&self, n: usize) -> bool {
            self.until(&self.written, n).await
        }

        async fn until(&self, counter: &AtomicUsize, n: usize) -> bool {
            tokio::time::timeout(PATIENCE, async {
                loop {
                    // Registered before the check: a change in between
                    // still wakes it.
                    let changed = self.changed.notified();
                    if counter.load(Ordering::Acquire) >= n {
                        return;
                    }
                    changed.await;
                }
            })
            .await
            .is_ok()
        }

        /// The one held Event reaches the server (else fails with `held`),
        /// is let through, and the queue drains.
        async fn writes_the_held_one(&self, queue: &EventQueue, held: &str) {
            assert!(self.until_in_flight(1).await, "{held}");
            self.gate.add_permits(1);
            drained(queue, "written").await;
        }

        /// Writes waiting at the gate now.
        fn in_flight(&self) -> usize {
            self.in_flight.load(Ordering::Acquire)
        }
    }

    fn reporter() -> Reporter {
        Reporter {
            controller: "petstore-operator".into(),
            instance: Some("replica-1".into()),
        }
    }

    fn event(reason: &str) -> Event {
        Event {
            type_: EventType::Normal,
            reason: reason.into(),
            note: None,
            action: "Reconcile".into(),
            secondary: None,
        }
    }

    fn warning(reason: &str) -> Event {
        Event {
            type_: EventType::Warning,
            ..event(reason)
        }
    }

    /// The queue as production starts it, writing to a gated server that
    /// lets no write through yet.
    fn gated() -> (Arc<GatedWrites>, EventQueue) {
        let writes = GatedWrites::closed();
        let queue = EventQueue::start(
            EventWriter::new(writes.client(), reporter()),
            Arc::new(Metrics::default()),
        );
        (writes, queue)
    }

    /// Waits until the queue has written everything.
    async fn drained(queue: &EventQueue, what: &str) {
        tokio::time::timeout(PATIENCE, queue.flush())
            .await
            .expect(what);
    }

    #[tokio::test(start_paused = true)]
    async fn writes_several_events_at_once_but_no_more_than_the_limit() {
        let (writes, queue) = gated();
        let total = CONCURRENT_WRITES * 3;
        for i in 0..total {
            queue.publish(event(&format!("Reason{i}")), ObjectReference::default());
        }
        assert!(
            writes.until_in_flight(CONCURRENT_WRITES).await,
            "never had {CONCURRENT_WRITES} writes in flight"
        );
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            writes.most_in_flight.load(Ordering::Acquire),
            CONCURRENT_WRITES
        );
        assert_eq!(queue.pending(), total);

        writes.gate.add_permits(total);
        drained(&queue, "every event written").await;
        assert_eq!(writes.written.load(Ordering::Acquire), total);
        assert_eq!(queue.pending(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn normal_events_wait_while_any_pet_is_being_reconciled() {
        let (writes, queue) = gated();
        let busy = queue.reconciling();
        queue.publish(event("Created"), ObjectReference::default());
        tokio::time::sleep(BUSY_RECHECK * 5).await;
        assert_eq!(writes.in_flight(), 0, "written while busy");

        // Written once the reconcile has been over for QUIET, at the
        // writer's next look. Paused time makes both bounds exact; the
        // millisecond is the load clock's resolution.
        drop(busy);
        let ended = Instant::now();
        assert!(
            writes.until_in_flight(1).await,
            "not written once the reconcile ended"
        );
        let waited = ended.elapsed();
        let tick = Duration::from_millis(1);
        assert!(
            waited + tick >= QUIET && waited <= QUIET + BUSY_RECHECK + tick,
            "written {waited:?} after the reconcile ended"
        );
        writes.gate.add_permits(1);
        drained(&queue, "written").await;
    }

    #[tokio::test(start_paused = true)]
    async fn normal_events_wait_for_a_quiet_moment_between_reconciles() {
        let (writes, queue) = gated();
        queue.publish(event("Created"), ObjectReference::default());
        // Reconciles that follow one another closely, as in a burst, with
        // none running at the moments the writer looks.
        for _ in 0..10 {
            drop(queue.reconciling());
            tokio::time::sleep(QUIET / 4).await;
            assert_eq!(writes.in_flight(), 0, "written in a gap of a burst");
        }
        writes
            .writes_the_held_one(&queue, "not written once the burst was over")
            .await;
    }

    #[tokio::test(start_paused = true)]
    async fn warnings_are_written_at_once_even_behind_waiting_normal_events() {
        let (writes, queue) = gated();
        let _busy = queue.reconciling();
        // More waiting Normal Events than writers: none may block a Warning.
        for i in 0..CONCURRENT_WRITES * 2 {
            queue.publish(event(&format!("Created{i}")), ObjectReference::default());
        }
        queue.publish(warning("StoreUnavailable"), ObjectReference::default());
        assert!(
            writes.until_in_flight(1).await,
            "the Warning waited for the burst"
        );
        tokio::time::sleep(BUSY_RECHECK * 3).await;
        assert_eq!(
            writes.in_flight(),
            1,
            "only the Warning is written while busy"
        );
        writes.gate.add_permits(1);
        assert!(writes.until_written(1).await, "the Warning was not written");
        assert_eq!(queue.pending(), CONCURRENT_WRITES * 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_filling_queue_is_written_even_while_busy() {
        let (writes, queue) = gated();
        let busy = queue.reconciling();
        let burst = QUEUE_CAPACITY / 2 + CONCURRENT_WRITES;
        for _ in 0..burst {
            queue.publish(event("Created"), ObjectReference::default());
        }
        assert!(
            writes.until_in_flight(CONCURRENT_WRITES).await,
            "a half-full queue waited for the burst to end"
        );
        // Written down to half full, and the rest waits for the burst.
        writes.gate.add_permits(burst);
        assert!(
            writes.until_written(burst - QUEUE_CAPACITY / 2).await,
            "the queue was not written down to half"
        );
        assert!(queue.pending() >= QUEUE_CAPACITY / 2 - CONCURRENT_WRITES);

        drop(busy);
        drained(&queue, "every event written once the burst ended").await;
        assert_eq!(writes.written.load(Ordering::Acquire), burst);
    }

    #[test]
    fn a_queued_event_keeps_every_field_it_writes() {
        let event = Event {
            note: Some("connection refused ✗".into()),
            ..warning("StoreUnavailable")
        };
        let regarding = ObjectReference {
            api_version: Some("petstore.example.com/v1".into()),
            kind: Some("Pet".into()),
            namespace: Some("pets".into()),
            name: Some("thor".into()),
            uid: Some("0b9b3c5e-1f0e-4a57-9d7b-3f2f2f5c8c11".into()),
            ..ObjectReference::default()
        };
        let at = Timestamp::from_second(1_700_000_000).expect("valid timestamp");
        let queued = Queued::new(&event, &regarding, at);
        let (unpacked, reference) = queued.event();
        assert_eq!(fields(&unpacked), fields(&event));
        assert_eq!(reference, regarding);
        assert_eq!(queued.at, at);

        let bare = Event {
            note: None,
            ..event
        };
        let (unpacked, reference) = Queued::new(&bare, &ObjectReference::default(), at).event();
        assert_eq!(fields(&unpacked), fields(&bare));
        assert_eq!(reference, ObjectReference::default());
    }

    /// kube's Event has no PartialEq.
    fn fields(event: &Event) -> (EventType, &str, &str, Option<&str>, bool) {
        (
            event.type_,
            &event.reason,
            &event.action,
            event.note.as_deref(),
            event.secondary.is_none(),
        )
    }

    // A Client needs a runtime to start, though this test sends nothing.
    #[tokio::test]
    async fn writes_what_the_recorder_would_for_a_first_event() {
        let writer = EventWriter::new(GatedWrites::closed().client(), reporter());
        let regarding = ObjectReference {
            name: Some("thor".into()),
            namespace: Some("pets".into()),
            kind: Some("Pet".into()),
            ..ObjectReference::default()
        };
        let event = Event {
            note: Some("record was missing".into()),
            ..warning("Recreated")
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
