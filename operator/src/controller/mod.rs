//! The Kubernetes glue: watches Pets, holds the finalizer, runs the decision
//! step against the store, writes status and publishes Events.
//!
//! Ordering that makes a crash at any point safe:
//! 1. the finalizer is persisted before anything exists in the store;
//! 2. creates carry the Pet's UID as idempotency key, so a create repeated
//!    after a crash returns the first record instead of a duplicate;
//! 3. the ID is written to status straight after the create; if that write is
//!    lost, the next reconcile finds the record by key and adopts it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use chrono::Utc;
use futures::StreamExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::events::{Event, EventType};
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use tracing::{Instrument, debug, info, info_span, warn};

use crate::Error;
use crate::crd::{FINALIZER, Pet};
use crate::decision::{Observed, Plan, decide};
use crate::events::EventQueue;
use crate::metrics::Metrics;
use crate::status::{self, Outcome, next_status};
use crate::store::{PetData, PetStore, StoreError};
use poll::PollSchedule;

mod poll;

/// Status writes retried after a 409 before giving up (and retrying the
/// whole reconcile with backoff, which never creates again: see step 3).
const STATUS_WRITE_ATTEMPTS: u32 = 5;

/// Test-only faults, to prove crash safety end to end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// After a successful create, hang before the ID reaches status, so a
    /// test can `kill -9` the operator at the worst moment.
    HangAfterCreate,
}

#[derive(Clone, Debug)]
pub struct Settings {
    /// How often an in-sync Pet is checked against the store for drift.
    pub poll_interval: Duration,
    /// Most drift-poll store reads per second, on average: with more Pets
    /// than `poll_interval` allows at this rate, the interval stretches.
    pub poll_max_rate: f64,
    /// First retry delay after a failure; doubles per consecutive failure.
    pub backoff_base: Duration,
    /// Longest retry delay.
    pub backoff_max: Duration,
    /// Pets reconciled at once.
    pub concurrency: u16,
    pub fault: Option<Fault>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            poll_interval: Duration::from_secs(300),
            poll_max_rate: 100.0,
            backoff_base: Duration::from_secs(1),
            backoff_max: Duration::from_secs(300),
            concurrency: 16,
            fault: None,
        }
    }
}

pub struct Context {
    pub client: Client,
    pub store: Arc<dyn PetStore>,
    pub events: EventQueue,
    pub metrics: Arc<Metrics>,
    pub settings: Settings,
    poll: PollSchedule,
    /// Consecutive failures per Pet, for exponential backoff.
    failures: Mutex<HashMap<ObjectRef<Pet>, u32>>,
    /// When each Pet's record was last found in sync, and for which
    /// generation: lets the reconcile triggered by our own status write skip
    /// a store read that cannot tell anything new.
    last_sync: Mutex<HashMap<ObjectRef<Pet>, LastSync>>,
}

/// The generation found in sync, and when.
type LastSync = (Option<i64>, Instant);

impl Context {
    pub fn new(
        client: Client,
        store: Arc<dyn PetStore>,
        events: EventQueue,
        metrics: Arc<Metrics>,
        settings: Settings,
    ) -> Self {
        Self {
            poll: PollSchedule::new(settings.poll_interval, settings.poll_max_rate),
            client,
            store,
            events,
            metrics,
            settings,
            failures: Mutex::default(),
            last_sync: Mutex::default(),
        }
    }

    fn last_sync(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectRef<Pet>, LastSync>> {
        self.last_sync
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// If this generation was synced, and its status written, less than half
    /// a poll interval ago, the time left until the next poll. The watch
    /// cache may not show that status write yet; the write succeeded, so
    /// its event is on the way, and syncing again from the stale copy would
    /// only repeat the write.
    fn recently_synced(&self, pet: &Pet) -> Option<Duration> {
        let (generation, at) = *self.last_sync().get(&ObjectRef::from(pet))?;
        let age = at.elapsed();
        (generation == pet.metadata.generation && age < self.settings.poll_interval / 2)
            .then(|| self.poll_delay(pet))
    }

    fn failures(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectRef<Pet>, u32>> {
        // The map only holds counters; a panic elsewhere cannot corrupt it.
        self.failures.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Until this Pet's next drift poll: spread by UID and rate-bounded
    /// (see [`poll`]).
    fn poll_delay(&self, pet: &Pet) -> Duration {
        let interval = self.poll.interval();
        self.metrics.set_poll_interval(interval);
        self.poll
            .delay(pet.metadata.uid.as_deref().unwrap_or_default())
    }

    /// Queues an Event; it is written in the background (best effort).
    fn publish(&self, pet: &Pet, type_: EventType, reason: &str, note: String) {
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(note),
            action: "Reconcile".into(),
            secondary: None,
        };
        self.events.publish(event, pet.object_ref(&()));
    }

    /// Writes the status for `outcome` if it differs from what the Pet shows.
    /// On a 409 it re-reads the Pet and recomputes from the fresh status.
    async fn write_outcome(
        &self,
        api: &Api<Pet>,
        pet: &Pet,
        id: Option<&str>,
        outcome: &Outcome,
    ) -> Result<(), Error> {
        let name = pet.name_any();
        // The generation acted upon, even if a re-read shows a newer one.
        let generation = pet.metadata.generation;
        let mut current = pet.status.clone();
        let mut attempt = 1;
        loop {
            let next = next_status(current.as_ref(), generation, id, outcome, Utc::now());
            if current.as_ref() == Some(&next) {
                return Ok(());
            }
            let patch = Patch::Merge(serde_json::json!({ "status": next }));
            match api
                .patch_status(&name, &PatchParams::default(), &patch)
                .await
            {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(status))
                    if status.is_conflict() && attempt < STATUS_WRITE_ATTEMPTS =>
                {
                    debug!(attempt, "status write conflicted; re-reading the Pet");
                    attempt += 1;
                    current = api
                        .get_status(&name)
                        .await
                        .map_err(|source| Error::WriteStatus {
                            name: name.clone(),
                            source,
                        })?
                        .status;
                }
                Err(source) => return Err(Error::WriteStatus { name, source }),
            }
        }
    }

    fn fail_outcome(error: &Error) -> Outcome {
        match error {
            Error::Store(StoreError::Unavailable { message, .. }) => {
                Outcome::StoreUnavailable(message.clone())
            }
            Error::Store(e @ StoreError::Rejected { .. }) => Outcome::InvalidSpec(e.to_string()),
            other => Outcome::Failed(other.to_string()),
        }
    }

    /// Records a failure on the Pet: conditions always, an Event only when
    /// the reason changes, so a long outage does not flood the API.
    async fn report_failure(&self, api: &Api<Pet>, pet: &Pet, error: &Error) -> Outcome {
        let outcome = Self::fail_outcome(error);
        let previous = pet
            .condition(status::SYNCED)
            .map(|c| c.reason.clone())
            .unwrap_or_default();
        if let Err(write_error) = self.write_outcome(api, pet, None, &outcome).await {
            debug!(error = %write_error, "could not record the failure in status");
        }
        let reason = outcome.synced_reason();
        if reason != previous {
            self.publish(pet, EventType::Warning, reason, error.to_string());
        }
        outcome
    }
}

/// Runs the controller until `shutdown` resolves.
pub async fn run(ctx: Arc<Context>, shutdown: impl Future<Output = ()> + Send + Sync + 'static) {
    let pets: Api<Pet> = Api::all(ctx.client.clone());
    let (reader, writer) = reflector::store();
    ctx.poll.track(reader.clone());
    let stream = watcher(pets, watcher::Config::default())
        .default_backoff()
        // The cache holds every Pet. managedFields and kubectl's copy of the
        // last applied object are most of each one, and nothing reads them.
        .modify(|pet| {
            pet.managed_fields_mut().clear();
            pet.annotations_mut().remove(LAST_APPLIED_ANNOTATION);
        })
        .reflect(writer)
        .applied_objects();
    let config = controller::Config::default().concurrency(ctx.settings.concurrency);
    Controller::for_stream(stream, reader)
        .with_config(config)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        // Outcomes are already logged (and rate-limited) in error_policy.
        .for_each(|result| async move {
            if let Err(err) = result {
                debug!(error = %err, "reconcile ended with an error");
            }
        })
        .await;
}

const LAST_APPLIED_ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";

pub async fn reconcile(pet: Arc<Pet>, ctx: Arc<Context>) -> Result<Action, Error> {
    let span = info_span!(
        "reconcile",
        namespace = pet.namespace().unwrap_or_default(),
        name = pet.name_any()
    );
    async move {
        ctx.metrics.reconcile_started();
        let started = Instant::now();
        let result = reconcile_pet(Arc::clone(&pet), &ctx).await;
        ctx.metrics.reconcile_finished(started.elapsed());
        if result.is_ok() {
            ctx.failures().remove(&ObjectRef::from(&*pet));
        }
        result
    }
    .instrument(span)
    .await
}

async fn reconcile_pet(pet: Arc<Pet>, ctx: &Context) -> Result<Action, Error> {
    let namespace = pet
        .namespace()
        .ok_or_else(|| Error::MalformedPet(pet.name_any()))?;
    let api: Api<Pet> = Api::namespaced(ctx.client.clone(), &namespace);

    // Paused means hands off entirely, deletion included.
    if pet.is_paused() {
        ctx.write_outcome(&api, &pet, None, &Outcome::Paused)
            .await?;
        return Ok(Action::await_change());
    }

    // Persist the finalizer first, and carry on with the object the API
    // server returned instead of waiting for its watch event: one round trip
    // less per new Pet. kube's finalizer helper then only sees Pets that
    // have it, and runs Apply or Cleanup.
    let pet = if pet.meta().deletion_timestamp.is_none()
        && !pet.finalizers().iter().any(|f| f == FINALIZER)
    {
        Arc::new(add_finalizer(&api, &pet).await?)
    } else {
        pet
    };

    finalizer(&api, FINALIZER, pet, |event| async {
        match event {
            FinalizerEvent::Apply(pet) => apply(&api, &pet, ctx).await,
            FinalizerEvent::Cleanup(pet) => cleanup(&api, &pet, ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))
}

/// Adds our finalizer. The resourceVersion precondition makes the API server
/// refuse (409) if anyone changed the Pet since we read it, so no other
/// finalizer is ever overwritten.
async fn add_finalizer(api: &Api<Pet>, pet: &Pet) -> Result<Pet, Error> {
    let mut finalizers = pet.finalizers().to_vec();
    finalizers.push(FINALIZER.to_owned());
    let patch = serde_json::json!({
        "metadata": {
            "finalizers": finalizers,
            "resourceVersion": pet.resource_version(),
        }
    });
    api.patch(
        &pet.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .map_err(|source| Error::AddFinalizer {
        name: pet.name_any(),
        source,
    })
}

async fn apply(api: &Api<Pet>, pet: &Pet, ctx: &Context) -> Result<Action, Error> {
    // A rejected spec stays rejected until it changes (a new generation).
    if status::rejected_this_generation(pet.status.as_ref(), pet.metadata.generation) {
        return Ok(Action::await_change());
    }
    if let Some(next_poll) = ctx.recently_synced(pet) {
        return Ok(Action::requeue(next_poll));
    }
    match sync(pet, ctx).await {
        Ok((id, notice)) => {
            ctx.write_outcome(api, pet, Some(&id), &Outcome::Synced)
                .await?;
            ctx.last_sync().insert(
                ObjectRef::from(pet),
                (pet.metadata.generation, Instant::now()),
            );
            // After the status write, so Ready is never held up by an Event.
            if let Some(Notice(type_, reason, note)) = notice {
                ctx.publish(pet, type_, reason, note);
            }
            Ok(Action::requeue(ctx.poll_delay(pet)))
        }
        Err(error) => {
            ctx.last_sync().remove(&ObjectRef::from(pet));
            let outcome = ctx.report_failure(api, pet, &error).await;
            if matches!(outcome, Outcome::InvalidSpec(_)) {
                info!(error = %error, "spec rejected by the store; waiting for a change");
                return Ok(Action::await_change());
            }
            Err(error)
        }
    }
}

/// An Event to publish once the status is written.
struct Notice(EventType, &'static str, String);

/// Brings the store in line with the Pet and returns the record's ID, and
/// what to tell the user about it.
async fn sync(pet: &Pet, ctx: &Context) -> Result<(String, Option<Notice>), Error> {
    let uid = pet
        .uid()
        .ok_or_else(|| Error::MalformedPet(pet.name_any()))?;
    let desired = PetData::from(&pet.spec);
    let observed = match pet.status_id() {
        Some(id) => Observed::ById {
            id: id.to_owned(),
            record: ctx.store.observe(id).await?,
        },
        None => Observed::ByKey {
            record: ctx.store.find_by_key(&uid).await?,
        },
    };
    let plan = decide(&desired, observed);
    debug!(?plan, "decided");
    Ok(match plan {
        Plan::InSync { id } => (id, None),
        Plan::Update { id } => {
            ctx.store.update(&id, &desired).await?;
            ctx.metrics.store_action("update");
            let note = format!("updated store record {id} to match the spec");
            (id, Some(Notice(EventType::Normal, "Updated", note)))
        }
        Plan::Adopt { id, update } => {
            if update {
                ctx.store.update(&id, &desired).await?;
                ctx.metrics.store_action("update");
            }
            let note = format!("found store record {id} by this Pet's UID and recorded its ID");
            (id, Some(Notice(EventType::Normal, "Adopted", note)))
        }
        Plan::Create => {
            let id = create(pet, ctx, &uid, &desired).await?;
            ctx.metrics.store_action("create");
            let note = format!("created store record {id}");
            (id, Some(Notice(EventType::Normal, "Created", note)))
        }
        Plan::Recreate { lost_id } => {
            let id = create(pet, ctx, &uid, &desired).await?;
            ctx.metrics.store_action("recreate");
            warn!(%lost_id, %id, "store record was missing; recreated it");
            let note = format!("store record {lost_id} was missing; created {id} in its place");
            (id, Some(Notice(EventType::Warning, "Recreated", note)))
        }
    })
}

async fn create(pet: &Pet, ctx: &Context, uid: &str, desired: &PetData) -> Result<String, Error> {
    let id = ctx.store.create(uid, desired).await?;
    info!(%id, "created store record");
    if ctx.settings.fault == Some(Fault::HangAfterCreate) {
        warn!(%id, pet = %pet.name_any(), "fault injection: hanging after create, before the ID reaches status");
        std::future::pending::<()>().await;
    }
    Ok(id)
}

async fn cleanup(api: &Api<Pet>, pet: &Pet, ctx: &Context) -> Result<Action, Error> {
    ctx.last_sync().remove(&ObjectRef::from(pet));
    if pet.orphans_on_delete() {
        let id = pet.status_id().unwrap_or("(none)");
        ctx.publish(
            pet,
            EventType::Normal,
            "Orphaned",
            format!("deletion-policy is Orphan: kept store record {id}"),
        );
        return Ok(Action::await_change());
    }
    let result = async {
        // If the ID never reached status, the record may still exist under
        // the Pet's UID: find it, so deleting the Pet leaks nothing.
        let id = match pet.status_id() {
            Some(id) => Some(id.to_owned()),
            None => {
                let uid = pet
                    .uid()
                    .ok_or_else(|| Error::MalformedPet(pet.name_any()))?;
                ctx.store.find_by_key(&uid).await?.map(|record| record.id)
            }
        };
        if let Some(id) = &id {
            ctx.store.delete(id).await?;
            ctx.metrics.store_action("delete");
        }
        Ok::<_, Error>(id)
    }
    .await;
    match result {
        Ok(id) => {
            let note = match id {
                Some(id) => format!("deleted store record {id}"),
                None => "no store record existed".into(),
            };
            ctx.publish(pet, EventType::Normal, "Deleted", note);
            Ok(Action::await_change())
        }
        Err(error) => {
            ctx.report_failure(api, pet, &error).await;
            Err(error)
        }
    }
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

pub fn error_policy(pet: Arc<Pet>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.reconcile_failed(error.metric_label());
    let failures = {
        let mut failures = ctx.failures();
        let count = failures.entry(ObjectRef::from(&*pet)).or_insert(0);
        *count = count.saturating_add(1);
        *count
    };
    let delay = backoff(&ctx.settings, failures);
    // Log the first failure and then only at powers of two: no log flood.
    if failures.is_power_of_two() {
        warn!(
            namespace = pet.namespace().unwrap_or_default(),
            name = pet.name_any(),
            failures,
            retry_in = ?delay,
            error = %error,
            "reconcile failed"
        );
    } else {
        debug!(name = pet.name_any(), failures, error = %error, "reconcile failed again");
    }
    Action::requeue(delay)
}

#[cfg(test)]
mod tests;
