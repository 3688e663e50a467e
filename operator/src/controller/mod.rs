//! The Kubernetes glue: watches Pets, gathers the facts about each one,
//! asks the pure decision step ([`crate::decision`]) what to do, executes
//! that plan against the store and the API server, and records the outcome
//! (status, Events, metrics). No policy lives here.
//!
//! - `mod.rs`: the watch, the controller's settings and shared context, and
//!   kube's two hooks, [`reconcile()`] and [`error_policy`];
//! - `reconcile.rs`: one reconcile of one Pet, as one object that acts and
//!   then records how it ended, in one place;
//! - `memory.rs`: what is remembered about each Pet between reconciles;
//! - `finalizer.rs` and `status_write.rs`: the two writes to the Pet;
//! - `poll.rs`: when an in-sync Pet is next checked for drift.
//!
//! Ordering that makes a crash at any point safe:
//! 1. the finalizer is persisted before anything exists in the store;
//! 2. creates carry the Pet's UID as idempotency key, so a create repeated
//!    after a crash returns the first record instead of a duplicate;
//! 3. the ID is written to status straight after the create; if that write is
//!    lost, the next reconcile finds the record by key and adopts it;
//! 4. adoption and Orphan release change the record's key by compare-and-set,
//!    so whatever step a crash interrupts, the record has exactly one owner.

use std::future::ready;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use kube::api::Api;
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info};

use crate::crd::{FINALIZER, Pet};
use crate::decision::{Cause, Facts, Next, Observation, Step, first_step};
use crate::events::EventQueue;
use crate::metrics::Metrics;
use crate::status;
use crate::store::{PetData, PetStore, Probe, StoreError};
use crate::{Error, Fault};
use memory::Memory;
use poll::PollSchedule;
use reconcile::{Problem, Reconcile};

mod feed;
mod finalizer;
mod memory;
mod poll;
mod reconcile;
mod status_write;
pub mod uninstall;

/// Pets reconciled at once unless told otherwise. A reconcile spends part
/// of its time waiting on the store (its create gathers for
/// `--create-batch-wait`, then the store fsyncs), not on the API server, so
/// it takes more reconciles in flight than a client that only patches to
/// keep the API server busy. At 16 the API server waited between bursts and
/// spent those moments converting Pets for its `v1alpha1` watch cache, work
/// that otherwise comes after convergence; docs/performance.md measures both.
pub const DEFAULT_CONCURRENCY: u16 = 32;

#[derive(Clone, Debug)]
pub struct Settings {
    /// How often an in-sync Pet is checked against the store for drift.
    pub poll_interval: Duration,
    /// Most drift-poll store reads per second, on average: with more Pets
    /// than `poll_interval` allows at this rate, the interval stretches.
    pub poll_max_rate: f64,
    /// The poll's interval while the store's change feed is followed: an
    /// audit for what the feed cannot see.
    pub audit_interval: Duration,
    /// Follow the store's change feed; without it drift is found by the
    /// poll alone.
    pub follow_store_changes: bool,
    /// First retry delay after a failure; doubles per consecutive failure.
    pub backoff_base: Duration,
    /// Longest retry delay.
    pub backoff_max: Duration,
    /// Pets reconciled at once ([`DEFAULT_CONCURRENCY`]).
    pub concurrency: u16,
    /// This installation's name (`--installation`): part of every key it
    /// gives a record; empty for the unnamed installation.
    pub installation: String,
    /// A crash-test fault; `None` outside the end-to-end tests.
    pub fault: Option<Fault>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            poll_interval: Duration::from_secs(300),
            poll_max_rate: 100.0,
            audit_interval: Duration::from_secs(3600),
            follow_store_changes: true,
            backoff_base: Duration::from_secs(1),
            backoff_max: Duration::from_secs(300),
            concurrency: DEFAULT_CONCURRENCY,
            installation: String::new(),
            fault: None,
        }
    }
}

/// What every reconcile shares.
pub struct Context {
    pub client: Client,
    pub store: Arc<dyn PetStore>,
    pub events: EventQueue,
    pub metrics: Arc<Metrics>,
    pub settings: Settings,
    poll: PollSchedule,
    memory: Memory,
    /// The last create said whether its key already named a record: until
    /// one has, every create is read for first (see [`Step::Create`]), so a
    /// store that ignores keys never gets a create without a read.
    create_observes: AtomicBool,
    /// Set in a real run: a Pet deleted while the installation goes keeps
    /// its record.
    uninstall: Option<uninstall::UninstallProbe>,
}

impl Context {
    pub fn new(
        client: Client,
        store: Arc<dyn PetStore>,
        events: EventQueue,
        metrics: Arc<Metrics>,
        settings: Settings,
    ) -> Self {
        Self {
            poll: PollSchedule::new(settings.poll_interval, settings.poll_max_rate)
                .with_audit_interval(settings.audit_interval),
            client,
            store,
            events,
            metrics,
            settings,
            memory: Memory::default(),
            create_observes: AtomicBool::new(false),
            uninstall: None,
        }
    }

    /// Keeps records when the Pet CRD (unconfirmed) or `namespace`, the
    /// operator's own, is being deleted.
    pub fn watching_uninstall(mut self, namespace: String) -> Self {
        self.uninstall = Some(uninstall::UninstallProbe::new(
            self.client.clone(),
            namespace,
        ));
        self
    }

    /// If this generation was synced, and its status written, less than half
    /// a poll interval ago, the time left until the next poll. The watch
    /// cache may not show that status write yet; the write succeeded, so
    /// its event is on the way, and syncing again from the stale copy would
    /// only repeat the write.
    /// A status naming another record than the one synced (a restore
    /// tool's, say) is not that write's echo.
    /// An annotation edit since (an external-id added, say) is not an echo.
    fn recently_synced(&self, facts: &Facts) -> Option<Duration> {
        let uid = &facts.uid;
        let synced = self.memory.synced(uid)?;
        (synced.generation == facts.generation.and_then(std::num::NonZeroI64::new)
            && synced.intent == facts.intent()
            && synced.explains(facts.status_id.as_deref())
            && synced.at.elapsed() < self.settings.poll_interval / 2)
            .then(|| self.poll_delay(uid))
    }

    /// Until this Pet's next drift poll: spread by UID and rate-bounded
    /// (see [`poll`]).
    fn poll_delay(&self, uid: &str) -> Duration {
        let interval = self.poll.interval();
        self.metrics.set_poll_interval(interval);
        self.poll.delay(uid)
    }

    /// The Pet a watch event asks to reconcile, if any, as kube's trigger
    /// needs it (see [`for_trigger`]). A Pet the watch no longer holds is
    /// forgotten.
    fn to_reconcile(&self, event: watcher::Event<Pet>) -> Option<Pet> {
        match event {
            watcher::Event::Apply(pet) | watcher::Event::InitApply(pet) => {
                if !self.needs_reconcile(&pet) {
                    return None;
                }
                if let Some(uid) = &pet.metadata.uid {
                    self.memory.triggered(&pet, uid);
                }
                Some(for_trigger(pet))
            }
            watcher::Event::Delete(pet) => {
                if let Some(uid) = &pet.metadata.uid {
                    self.memory.forget(uid);
                }
                None
            }
            watcher::Event::InitDone => {
                self.memory.forget_all_but_cached();
                None
            }
            watcher::Event::Init => None,
        }
    }

    /// False for the watch events of our own writes, the finalizer and the
    /// status, to a Pet synced a moment ago: the reconcile would only wait
    /// for the poll, which the reconcile that wrote them already scheduled.
    /// Anything else (deletion, pausing, a new generation) still reconciles.
    ///
    /// False too while the Pet backs off from a failure and nothing the user
    /// asked for changed: the watch event is the echo of our own status
    /// write, and reconciling it would count one more failure for one
    /// attempt (against a store without the extensions, 8 failures and a
    /// 130 s delay in 35 s). The scheduled retry comes anyway.
    fn needs_reconcile(&self, pet: &Pet) -> bool {
        let Ok(facts) = self.facts(pet) else {
            return true;
        };
        if self.memory.backing_off_from(&facts) {
            return false;
        }
        !matches!(first_step(&facts), Step::Wait(Next::After(_)))
    }

    /// Everything the decision step needs to know about the Pet.
    fn facts(&self, pet: &Pet) -> Result<Facts, Error> {
        let mut facts = facts_of(pet, &self.settings.installation)?;
        facts.recently_synced = self.recently_synced(&facts);
        facts.create_observes = self.create_observes.load(Ordering::Relaxed);
        Ok(facts)
    }

    /// The controller action for `next`; a failure's backoff comes from
    /// [`error_policy`].
    fn action(&self, next: Next, pet: &Pet, uid: &str) -> Action {
        match next {
            Next::AwaitChange => Action::await_change(),
            Next::Poll | Next::Retry => self.requeue(pet, uid, self.poll_delay(uid)),
            Next::After(delay) => self.requeue(pet, uid, delay),
        }
    }

    /// Requeues the Pet: its memory keeps when it is due, and the poll
    /// sweep ([`hand_over_due_polls`]) hands it to kube then, so kube's
    /// scheduler holds none of these (see [`Memory::take_due_polls`]).
    fn requeue(&self, pet: &Pet, uid: &str, delay: Duration) -> Action {
        self.memory.requeued(pet, uid, delay);
        Action::await_change()
    }
}

/// The copy of a Pet kube's trigger turns into the reference it queues:
/// the reconcile reads the Pet from the watch cache, and references compare
/// by name and namespace alone. Without its UID and resourceVersion, every
/// reference kube holds is two strings lighter: 3.5 MiB less peak RSS at
/// N = 20,000 (measured when kube's scheduler still held each Pet's next
/// poll).
fn for_trigger(mut pet: Pet) -> Pet {
    pet.metadata.uid = None;
    pet.metadata.resource_version = None;
    pet
}

/// Runs the controller until `stop` is cancelled, then lets the reconciles
/// in flight finish.
pub async fn run(ctx: Arc<Context>, stop: CancellationToken) {
    let pets: Api<Pet> = Api::all(ctx.client.clone());
    let weak = Arc::downgrade(&ctx);
    ctx.metrics.gauges_from(move || {
        weak.upgrade()
            .map(|ctx| ctx.memory.gauges())
            .unwrap_or_default()
    });
    let (reader, writer) = reflector::store();
    ctx.poll.track(reader.clone());
    ctx.memory.track(reader.clone());
    let stream = watcher(pets, watcher::Config::default())
        .default_backoff()
        // The cache holds every Pet. managedFields and kubectl's copy of the
        // last applied object are most of each one, and nothing reads them.
        .modify(|pet| {
            pet.managed_fields_mut().clear();
            pet.annotations_mut().remove(LAST_APPLIED_ANNOTATION);
        })
        .reflect(writer)
        .try_filter_map({
            let ctx = Arc::clone(&ctx);
            move |event| ready(Ok(ctx.to_reconcile(event)))
        });
    let config = controller::Config::default().concurrency(ctx.settings.concurrency);
    let (released, retry_now) = futures::channel::mpsc::unbounded();
    // Once per leadership; idempotent, so a leader lost part-way is no harm.
    tokio::spawn(migrate_storage(
        ctx.client.clone(),
        Arc::clone(&ctx.metrics),
    ));
    if ctx.settings.follow_store_changes {
        tokio::spawn(feed::follow(
            Arc::clone(&ctx),
            reader.clone(),
            released.clone(),
            stop.clone(),
        ));
    } else {
        info!(
            poll_interval = ?ctx.settings.poll_interval,
            "not following the store's change feed (--follow-store-changes=false); drift is found by polling each Pet every poll interval"
        );
    }
    tokio::spawn(hand_over_due_polls(
        Arc::clone(&ctx),
        released.clone(),
        stop.clone(),
    ));
    tokio::spawn(release_on_store_recovery(
        Arc::clone(&ctx),
        released,
        stop.clone(),
    ));
    Controller::for_stream(stream, reader)
        .with_config(config)
        .reconcile_on(retry_now)
        .graceful_shutdown_on(stop.cancelled_owned())
        .run(reconcile, error_policy, ctx)
        // Failures are already logged (and rate-limited) by the reconcile.
        .for_each(|result| async move {
            if let Err(err) = result {
                debug!(error = %err, "reconcile ended with an error");
            }
        })
        .await;
}

/// Rewrites Pets stored in an older version after an upgrade (see
/// [`crate::migration`]).
async fn migrate_storage(client: Client, metrics: Arc<Metrics>) {
    use kube::CustomResourceExt as _;
    crate::migration::run(&client, Pet::crd_name(), &metrics.migration).await;
}

/// The longest a due poll waits for the sweep that hands it over: a
/// sixtieth of the interval (5 s of the default 5 minutes), at least 20 ms.
/// A sweep that finds a poll due walks the whole watch cache to name it,
/// so sweeps are not made every moment.
fn sweep_period(interval: Duration) -> Duration {
    (interval / 60).clamp(Duration::from_millis(20), Duration::from_secs(5))
}

/// Sends the Pets `find` returns to kube's controller, once a `period`,
/// until `stop` (or until the controller is gone).
async fn trigger_every<Fut>(
    period: impl Fn() -> Duration,
    mut find: impl FnMut() -> Fut,
    trigger: futures::channel::mpsc::UnboundedSender<reflector::ObjectRef<Pet>>,
    stop: CancellationToken,
) where
    Fut: std::future::Future<Output = Vec<reflector::ObjectRef<Pet>>>,
{
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(period()) => {}
        }
        for pet in find().await {
            if trigger.unbounded_send(pet).is_err() {
                return;
            }
        }
    }
}

/// Hands each Pet whose poll has come to kube's controller, once a sweep
/// period. A sweep walks the memory, and the watch cache only when a poll
/// is due.
async fn hand_over_due_polls(
    ctx: Arc<Context>,
    trigger: futures::channel::mpsc::UnboundedSender<reflector::ObjectRef<Pet>>,
    stop: CancellationToken,
) {
    let period = || sweep_period(ctx.poll.interval());
    let find = || ready(ctx.memory.take_due_polls(std::time::Instant::now()));
    trigger_every(period, find, trigger, stop).await;
}

/// How often the store is probed while Pets wait for it to answer again.
const STORE_PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// While Pets back off because the store did not answer, probes it every
/// second and, once it answers, retries them at once rather than after
/// backoffs of up to `--backoff-max`.
async fn release_on_store_recovery(
    ctx: Arc<Context>,
    trigger: futures::channel::mpsc::UnboundedSender<reflector::ObjectRef<Pet>>,
    stop: CancellationToken,
) {
    let find = || async {
        let pets = release_if_store_answers(&ctx).await;
        pets.iter()
            .map(|pet| reflector::ObjectRef::from_obj(&**pet))
            .collect()
    };
    trigger_every(|| STORE_PROBE_INTERVAL, find, trigger, stop).await;
}

/// One probe, if any Pet waits on the store: the Pets it releases. A store
/// that answers again releases those that found it down; a store with the
/// extensions (ours, in place of the book's) also those that found it
/// without.
async fn release_if_store_answers(ctx: &Context) -> Vec<Arc<Pet>> {
    if !ctx.memory.waiting_on_store() {
        return Vec::new();
    }
    let found = ctx.store.probe().await;
    let pets = ctx.memory.release_store_waiters(found);
    if !pets.is_empty() {
        tracing::info!(
            pets = pets.len(),
            store = ?found,
            "the store answers; retrying the Pets that waited for it"
        );
    }
    pets
}

const LAST_APPLIED_ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// kube's reconcile hook. kube's controller runs each reconcile inside its
/// `reconciling object` span, which names the Pet and is the root of the
/// reconcile's trace.
pub async fn reconcile(pet: Arc<Pet>, ctx: Arc<Context>) -> Result<Action, Error> {
    // kube's span cannot take a field after it is made; this one carries
    // the trace ID into every log line of the reconcile, when traced.
    let span = petstore_telemetry::span(|| {
        tracing::info_span!("reconcile", trace_id = tracing::field::Empty)
    });
    petstore_telemetry::record_trace_id(&span);
    reconcile_in_span(pet, ctx).instrument(span).await
}

async fn reconcile_in_span(pet: Arc<Pet>, ctx: Arc<Context>) -> Result<Action, Error> {
    // Queued Events wait while Pets are being reconciled (see crate::events).
    let _reconciling = ctx.events.reconciling();
    let _timer = ctx.metrics.reconcile_timer();
    if let Some(uid) = &pet.metadata.uid {
        ctx.memory.started(uid);
    }
    match Reconcile::new(&pet, &ctx) {
        Ok(reconcile) => reconcile.run().await,
        // Never from the API server, where every Pet has both.
        Err(error) => reconcile::count(&ctx, &pet, None, Problem::unshown(error)),
    }
}

/// kube's hook after a failed reconcile. The reconcile has already shown
/// and counted the failure; this only turns the Pet's failures in a row into
/// its backoff.
pub fn error_policy(pet: Arc<Pet>, error: &Error, ctx: Arc<Context>) -> Action {
    let Some(uid) = pet.metadata.uid.as_deref() else {
        return Action::requeue(backoff(&ctx.settings, 1));
    };
    // Never sooner than the store asked (its pushback).
    let pushback = error.retry_after();
    let delay = backoff(&ctx.settings, ctx.memory.failures(uid)).max(pushback.unwrap_or_default());
    if let Ok(facts) = ctx.facts(&pet) {
        let waits_for = match error.reason() {
            // A store that asked for time is not hurried by its probe.
            _ if pushback.is_some() => None,
            status::Reason::StoreUnavailable => Some(Probe::Answers),
            status::Reason::StoreLacksExtensions => Some(Probe::Extended),
            _ => None,
        };
        ctx.memory
            .backing_off(&pet, uid, facts.intent(), delay, waits_for);
    }
    ctx.memory.retrying(&pet, uid, delay);
    Action::requeue(delay)
}

/// Exponential backoff per Pet: base * 2^(failures-1), capped, with jitter.
pub fn backoff(settings: &Settings, failures: u32) -> Duration {
    let exponent = failures.saturating_sub(1).min(20);
    let delay = settings
        .backoff_base
        .saturating_mul(1u32 << exponent)
        .min(settings.backoff_max);
    // Up to 10% extra, so Pets failing together do not retry together.
    delay.mul_f64(1.0 + fastrand::f64() * 0.1)
}

#[cfg(test)]
mod tests;

/// Whether the spec changed since the operator last acted on the Pet: its
/// status does not observe this generation, or it shows a plan made for
/// this generation's spec change and not yet written (showing the plan
/// observed the generation; the change is still the edit's, not drift).
fn spec_changed(pet: &Pet) -> bool {
    let generation = pet.metadata.generation;
    let Some(status) = &pet.status else {
        return true;
    };
    // Ready's, not status.observedGeneration: a generation held as Stalled
    // is observed without its spec having reached the record.
    let handled = pet
        .condition(status::READY)
        .map_or(status.observed_generation, |ready| {
            ready.observed_generation
        });
    handled != generation
        || status.plan.as_ref().is_some_and(|plan| {
            plan.generation == generation && plan.cause == Cause::SpecChange.as_str()
        })
}

/// Reads the store for [`crate::decision::decide`]: the record with ID `id`
/// and the one keyed `key`; a store without the read is an observation
/// too. For a reconcile and for `kubectl petstore plan`.
pub async fn observe(
    store: &dyn PetStore,
    id: Option<&str>,
    facts: &Facts,
) -> Result<Observation, StoreError> {
    match store.observe(id, &facts.key(), Some(&facts.identity)).await {
        Ok(lookup) => Ok(Observation::Found(lookup)),
        Err(StoreError::Unimplemented { operation }) => {
            Ok(Observation::StoreLacks { missing: operation })
        }
        Err(error) => Err(error),
    }
}

/// What the decision step knows from the Pet alone, without this process's
/// memory: for a reconcile ([`Context::facts`] adds the memory) and for
/// `kubectl petstore plan`, so both plan from the same facts.
pub fn facts_of(pet: &Pet, installation: &str) -> Result<Facts, Error> {
    let uid = pet
        .uid()
        .ok_or_else(|| Error::MalformedPet(pet.name_any()))?;
    Ok(Facts {
        recently_synced: None,
        uid,
        installation: installation.to_owned(),
        identity: pet.identity(),
        desired: PetData::from(&pet.spec),
        deleting: pet.meta().deletion_timestamp.is_some(),
        has_finalizer: pet.finalizers().iter().any(|f| f == FINALIZER),
        paused: pet.paused(),
        deletion_policy: pet.deletion_policy(),
        external_id: pet.external_id().map(str::to_owned),
        status_id: pet.status_id().map(str::to_owned),
        rejected_this_generation: status::rejected_this_generation(
            pet.status.as_ref(),
            pet.metadata.generation,
        ),
        spec_changed: spec_changed(pet),
        create_observes: false,
        generation: pet.metadata.generation,
        change_policy: pet.change_policy(),
        approved_plan: pet.approved_plan().map(str::to_owned),
        // Looked up by the reconcile, and only for a Pet being deleted.
        uninstalling: None,
        hand_over_to: pet.hand_over_to(),
        applied_plan: pet.status.as_ref().and_then(|s| s.applied_plan.clone()),
        plan_shown: pet.status.as_ref().is_some_and(|s| s.plan.is_some()),
    })
}
