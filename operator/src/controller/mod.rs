//! The Kubernetes glue: watches Pets, gathers the facts about each one,
//! asks the pure decision step ([`crate::decision`]) what to do, executes
//! that plan against the store and the API server, and records the outcome
//! (status, Events, metrics). No policy lives here.
//!
//! - `mod.rs`: the watch and kube's two hooks, [`reconcile()`] and
//!   [`error_policy`];
//! - `fair_queue.rs`: which Pet kube reconciles next, each namespace in
//!   turn, so one namespace's burst does not hold the others;
//! - `context.rs`: the controller's settings and the context every
//!   reconcile shares, with the filter that turns watch events into
//!   reconciles; `backoff.rs`: a failing Pet's retry delay;
//! - `reconcile.rs`: one reconcile of one Pet, as one object that acts and
//!   then records how it ended, in one place;
//! - `memory.rs`: what is remembered about each Pet between reconciles;
//! - `finalizer.rs` and `status_write.rs`: the two writes to the Pet;
//! - `feed.rs`: drift from each store's change feed, the own store's and
//!   every open `PetStore`'s and `ClusterPetStore`'s;
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
use std::time::Duration;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::controller::{self, Action};
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info};

use crate::Error;
use crate::crd::Pet;
pub use crate::decision::facts_of;
use crate::decision::{Facts, Observation};
use crate::metrics::Metrics;
use crate::status;
use crate::store::{PetStore, Probe, StoreError};
use fair_queue::FairQueue;
use reconcile::{Problem, Reconcile};

mod backoff;
mod context;
mod drift_storm;
mod fair_queue;
mod feed;
mod finalizer;
mod memory;
pub mod plan;
mod poll;
mod reconcile;
mod status_write;
pub mod uninstall;

pub use backoff::backoff;
pub use context::{Context, DEFAULT_CONCURRENCY, Settings};
pub use drift_storm::StormThreshold;

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
    let queue = FairQueue::new(match ctx.settings.concurrency {
        0 => usize::MAX,
        bound => usize::from(bound),
    });
    tokio::spawn(queue_watched_pets(
        Arc::clone(&ctx),
        pets,
        writer,
        Arc::clone(&queue),
        stop.clone(),
    ));
    let config = controller::Config::default().concurrency(ctx.settings.concurrency);
    let (released, retry_now) = futures::channel::mpsc::unbounded();
    tokio::spawn(queue_all(retry_now, Arc::clone(&queue)));
    // Once per leadership; idempotent, so a leader lost part-way is no harm.
    tokio::spawn(migrate_storage(
        ctx.client.clone(),
        Arc::clone(&ctx.metrics),
    ));
    if ctx.settings.follow_store_changes {
        tokio::spawn(feed::follow_stores(
            Arc::clone(&ctx),
            ctx.stores.feeds(),
            reader.clone(),
            released.clone(),
            stop.clone(),
        ));
    } else {
        info!(
            poll_interval = ?ctx.settings.poll_interval,
            "not following the stores' change feeds (--follow-store-changes=false); drift is found by polling each Pet every poll interval"
        );
    }
    tokio::spawn(hand_over_due_polls(
        Arc::clone(&ctx),
        released.clone(),
        stop.clone(),
    ));
    tokio::spawn({
        let (stores, stop) = (Arc::clone(&ctx.stores), stop.clone());
        async move { stores.close_idle_until(stop).await }
    });
    tokio::spawn(crate::stores::status::write_until(
        Arc::clone(&ctx.stores),
        reader.clone(),
        stop.clone(),
    ));
    tokio::spawn(release_on_store_change(
        Arc::clone(&ctx),
        reader.clone(),
        released.clone(),
        stop.clone(),
    ));
    tokio::spawn(release_on_store_recovery(
        Arc::clone(&ctx),
        released,
        stop.clone(),
    ));
    let metrics = Arc::clone(&ctx.metrics);
    let admitted = Arc::clone(&queue)
        .admitted()
        .map(move |admitted| {
            metrics.queue_waited(admitted.waited);
            admitted.pet
        })
        .take_until(stop.cancelled_owned())
        .map(Ok::<_, std::convert::Infallible>);
    // kube's applier, not its Controller: the Controller would feed every
    // trigger to the scheduler at once, and the fair queue could not take
    // turns (see fair_queue.rs). The applier ends, letting the reconciles in
    // flight finish, once `admitted` ends at `stop`.
    let reconcile = |pet, ctx| Box::pin(reconcile(pet, ctx));
    controller::applier(reconcile, error_policy, ctx, reader, admitted, config)
        .for_each(|result| {
            if let Some(pet) = ran(&result) {
                queue.finished(&pet);
            }
            // Failures are already logged (and rate-limited) by the reconcile.
            if let Err(err) = result {
                debug!(error = %err, "reconcile ended with an error");
            }
            ready(())
        })
        .await;
}

/// The Pet one run of the applier was for, however it ended.
fn ran(
    result: &Result<
        (reflector::ObjectRef<Pet>, Action),
        controller::Error<Error, std::convert::Infallible>,
    >,
) -> Option<reflector::ObjectRef<Pet>> {
    let erased = match result {
        Ok((pet, _)) => return Some(pet.clone()),
        Err(
            controller::Error::ReconcilerFailed(_, pet) | controller::Error::ObjectNotFound(pet),
        ) => pet,
        Err(_) => return None,
    };
    let pet = reflector::ObjectRef::new(&erased.name);
    Some(match &erased.namespace {
        Some(namespace) => pet.within(namespace),
        None => pet,
    })
}

/// Follows the Pets' watch into the cache every part of the controller
/// reads, and queues the Pets its events ask to reconcile, until `stop`.
async fn queue_watched_pets(
    ctx: Arc<Context>,
    pets: Api<Pet>,
    writer: reflector::store::Writer<Pet>,
    queue: Arc<FairQueue>,
    stop: CancellationToken,
) {
    let stream = watcher(pets, watcher::Config::default())
        .default_backoff()
        // The cache holds every Pet. managedFields and kubectl's copy of the
        // last applied object are most of each one, and nothing reads them.
        .modify(|pet| {
            pet.managed_fields_mut().clear();
            pet.annotations_mut().remove(LAST_APPLIED_ANNOTATION);
        })
        .reflect(writer)
        .take_until(stop.cancelled_owned());
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        match event {
            Ok(event) => {
                if let Some(pet) = ctx.to_reconcile(event) {
                    queue.push(pet);
                }
            }
            // The watcher retries with its backoff.
            Err(err) => debug!(error = %err, "watching Pets failed; retrying"),
        }
    }
}

/// Queues every Pet the controller's other parts ask to reconcile (feeds,
/// due polls, store changes), until they all stop.
async fn queue_all(
    mut triggers: futures::channel::mpsc::UnboundedReceiver<reflector::ObjectRef<Pet>>,
    queue: Arc<FairQueue>,
) {
    while let Some(pet) = triggers.next().await {
        queue.push(pet);
    }
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
    let find = || {
        let now = std::time::Instant::now();
        ctx.refresh_drift_storms(now);
        ready(ctx.memory.take_due_polls(now))
    };
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

/// Reconciles the Pets held on a store (missing, not admitting them, its
/// trust missing) as soon as a store object appears or its spec changes, or
/// a namespace's labels change (see `stores::cache`): a
/// Pet becomes Ready once it is allowed, not after its backoff.
async fn release_on_store_change(
    ctx: Arc<Context>,
    pets: reflector::Store<Pet>,
    trigger: futures::channel::mpsc::UnboundedSender<reflector::ObjectRef<Pet>>,
    stop: CancellationToken,
) {
    use crate::stores::Changed;
    let mut changed = ctx.stores.subscribe();
    loop {
        let change = tokio::select! {
            () = stop.cancelled() => return,
            change = changed.recv() => change,
        };
        let change = match change {
            Ok(change) => Some(change),
            // Missed some: look at every held Pet.
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => None,
            Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
        };
        for pet in pets.state() {
            let in_scope = match &change {
                Some(Changed::Namespace(namespace)) => {
                    pet.metadata.namespace.as_deref() == Some(namespace.as_str())
                }
                Some(Changed::Cluster) | None => true,
            };
            if in_scope && held_on_store(&pet) {
                // What it waited for may have come: not a backoff's echo.
                if let Some(uid) = &pet.metadata.uid {
                    ctx.memory.end_backoff(uid);
                }
                let _ = trigger.unbounded_send(reflector::ObjectRef::from_obj(&*pet));
            }
        }
    }
}

/// The Pet shows that it waits on its store's setup.
fn held_on_store(pet: &Pet) -> bool {
    use crate::status::Reason;
    pet.status.as_ref().is_some_and(|status| {
        status.conditions.iter().any(|condition| {
            condition.type_ == status::READY
                && [
                    Reason::StoreNotFound,
                    Reason::StoreNotAllowed,
                    Reason::StoreTrustMissing,
                    Reason::StoreAccessDenied,
                ]
                .iter()
                .any(|reason| condition.reason == reason.as_str())
        })
    })
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
/// and counted the failure, with the intent it failed for (see
/// [`reconcile::count`]); this only turns the Pet's failures in a row into
/// its backoff, and builds no facts of its own.
pub fn error_policy(pet: Arc<Pet>, error: &Error, ctx: Arc<Context>) -> Action {
    let Some(uid) = pet.metadata.uid.as_deref() else {
        return Action::requeue(backoff(&ctx.settings, 1));
    };
    // Never sooner than the store asked (its pushback).
    let pushback = error.retry_after();
    let delay = backoff(&ctx.settings, ctx.memory.failures(uid)).max(pushback.unwrap_or_default());
    let waits_for = match error.reason() {
        // A store that asked for time is not hurried by its probe.
        _ if pushback.is_some() => None,
        status::Reason::StoreUnavailable => Some(Probe::Answers),
        status::Reason::StoreLacksExtensions => Some(Probe::Extended),
        _ => None,
    };
    ctx.memory.backing_off(uid, delay, waits_for);
    ctx.memory.retrying(&pet, uid, delay);
    Action::requeue(delay)
}

#[cfg(test)]
mod tests;

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
