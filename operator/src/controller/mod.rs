//! The Kubernetes glue: watches Pets, gathers the facts about each one,
//! asks the pure decision step ([`crate::decision`]) what to do, executes
//! that plan against the store and the API server, and records the outcome
//! (status, Events, metrics). No policy lives here.
//!
//! Ordering that makes a crash at any point safe:
//! 1. the finalizer is persisted before anything exists in the store;
//! 2. creates carry the Pet's UID as idempotency key, so a create repeated
//!    after a crash returns the first record instead of a duplicate;
//! 3. the ID is written to status straight after the create; if that write is
//!    lost, the next reconcile finds the record by key and adopts it;
//! 4. adoption and Orphan release change the record's key by compare-and-set,
//!    so whatever step a crash interrupts, the record has exactly one owner.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use chrono::Utc;
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use tracing::{debug, info, warn};

use crate::crd::{FINALIZER, Pet, PetStatus};
use crate::{Error, Fault};
// `Sync` would shadow the marker trait.
use crate::decision::{
    Facts, Finish, Next, Observation, Plan, Step, Story, Sync as SyncPlan, Target, after_create,
    decide, first_step,
};
use crate::events::EventQueue;
use crate::metrics::{Metrics, StoreAction};
use crate::status::{self, Outcome, Reason, next_status};
use crate::store::{Created, PetData, PetStore, StoreError};
use poll::PollSchedule;

mod poll;

/// Status writes retried after a 409 before giving up (and retrying the
/// whole reconcile with backoff, which never creates again: see step 3).
const STATUS_WRITE_ATTEMPTS: u32 = 5;

/// Observations per reconcile: a record that vanishes before an update, or
/// whose key changes before a compare-and-set, is observed again at once
/// rather than after a backoff.
const OBSERVE_ATTEMPTS: u32 = 3;

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
    /// A crash-test fault; `None` outside the end-to-end tests.
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
    /// Consecutive failures per Pet UID, for exponential backoff. Keyed by
    /// UID, so a Pet deleted and created again under its name starts clean.
    failures: Mutex<HashMap<String, u32>>,
    /// When each Pet (by UID) was last found in sync, and for which
    /// generation: lets the reconcile triggered by our own status write skip
    /// a store read that cannot tell anything new.
    last_sync: Mutex<HashMap<String, LastSync>>,
    /// The last create said whether its key already named a record: until
    /// one has, every create is read for first (see [`Step::Create`]), so a
    /// store that ignores keys never gets a create without a read.
    create_observes: AtomicBool,
}

/// The generation found in sync, and when.
type LastSync = (Option<i64>, Instant);

fn uid_of(pet: &Pet) -> Result<String, Error> {
    pet.uid().ok_or_else(|| Error::MalformedPet(pet.name_any()))
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
            poll: PollSchedule::new(settings.poll_interval, settings.poll_max_rate),
            client,
            store,
            events,
            metrics,
            settings,
            failures: Mutex::default(),
            last_sync: Mutex::default(),
            create_observes: AtomicBool::new(false),
        }
    }

    fn last_sync(&self) -> std::sync::MutexGuard<'_, HashMap<String, LastSync>> {
        self.last_sync
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// If this generation was synced, and its status written, less than half
    /// a poll interval ago, the time left until the next poll. The watch
    /// cache may not show that status write yet; the write succeeded, so
    /// its event is on the way, and syncing again from the stale copy would
    /// only repeat the write.
    fn recently_synced(&self, uid: &str, generation: Option<i64>) -> Option<Duration> {
        let (synced_generation, at) = *self.last_sync().get(uid)?;
        let age = at.elapsed();
        (synced_generation == generation && age < self.settings.poll_interval / 2)
            .then(|| self.poll_delay(uid))
    }

    fn failures(&self) -> std::sync::MutexGuard<'_, HashMap<String, u32>> {
        // The map only holds counters; a panic elsewhere cannot corrupt it.
        self.failures.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Until this Pet's next drift poll: spread by UID and rate-bounded
    /// (see [`poll`]).
    fn poll_delay(&self, uid: &str) -> Duration {
        let interval = self.poll.interval();
        self.metrics.set_poll_interval(interval);
        self.poll.delay(uid)
    }

    /// False for the watch events of our own writes, the finalizer and the
    /// status, to a Pet synced a moment ago: the reconcile would only wait
    /// for the poll, which the reconcile that wrote them already scheduled.
    /// Anything else (deletion, pausing, a new generation) still reconciles.
    fn needs_reconcile(&self, pet: &Pet) -> bool {
        !matches!(
            self.facts(pet).map(|facts| first_step(&facts)),
            Ok(Step::Wait(Next::After(_)))
        )
    }

    /// Everything the decision step needs to know about the Pet.
    fn facts(&self, pet: &Pet) -> Result<Facts, Error> {
        let uid = uid_of(pet)?;
        Ok(Facts {
            recently_synced: self.recently_synced(&uid, pet.metadata.generation),
            uid,
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
            create_observes: self.create_observes.load(Ordering::Relaxed),
        })
    }

    /// The controller action for `next`; `Retry` is handled by the caller.
    fn action(&self, next: Next, uid: &str) -> Action {
        match next {
            Next::AwaitChange => Action::await_change(),
            Next::Poll | Next::Retry => Action::requeue(self.poll_delay(uid)),
            Next::After(delay) => Action::requeue(delay),
        }
    }

    /// Queues an Event; it is written in the background (best effort).
    fn publish(&self, pet: &Pet, reason: Reason, note: String) {
        self.publish_action(pet, reason, "Reconcile", note);
    }

    fn publish_action(&self, pet: &Pet, reason: Reason, action: &str, note: String) {
        let event = Event {
            type_: if reason.is_warning() {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.as_str().to_owned(),
            note: Some(note),
            action: action.into(),
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
            match patch_status(&self.client, pet, &name, &next).await {
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

    /// Shows a problem on the Pet: conditions always, a Warning Event only
    /// when the reason changes, so a long outage does not flood the API.
    async fn report(&self, api: &Api<Pet>, pet: &Pet, outcome: &Outcome) {
        let previous = pet
            .condition(status::SYNCED)
            .map(|c| c.reason.clone())
            .unwrap_or_default();
        if let Err(write_error) = self.write_outcome(api, pet, None, outcome).await {
            debug!(error = %write_error, "could not record the outcome in status");
        }
        let reason = outcome.synced_reason();
        if reason.is_warning() && reason.as_str() != previous {
            self.publish(pet, reason, outcome.message.clone());
        }
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
        .applied_objects()
        .try_filter({
            let ctx = Arc::clone(&ctx);
            move |pet| std::future::ready(ctx.needs_reconcile(pet))
        });
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

/// Logs need no span of their own here: kube's controller runs each
/// reconcile inside its `reconciling object` span, which names the Pet.
pub async fn reconcile(pet: Arc<Pet>, ctx: Arc<Context>) -> Result<Action, Error> {
    // Queued Events wait while Pets are being reconciled (see crate::events).
    let _reconciling = ctx.events.reconciling();
    ctx.metrics.reconcile_started();
    let started = Instant::now();
    let result = reconcile_pet(Arc::clone(&pet), &ctx).await;
    ctx.metrics.reconcile_finished(started.elapsed());
    if result.is_ok()
        && let Some(uid) = pet.uid()
    {
        ctx.failures().remove(&uid);
    }
    result
}

async fn reconcile_pet(mut pet: Arc<Pet>, ctx: &Context) -> Result<Action, Error> {
    let namespace = pet
        .namespace()
        .ok_or_else(|| Error::MalformedPet(pet.name_any()))?;
    let api: Api<Pet> = Api::namespaced(ctx.client.clone(), &namespace);
    // Twice at most: once more after adding the finalizer, carrying on with
    // the object the API server returned instead of waiting for its watch
    // event (one round trip less per new Pet).
    for _ in 0..2 {
        let facts = ctx.facts(&pet)?;
        match first_step(&facts) {
            Step::Wait(next) => return Ok(ctx.action(next, &facts.uid)),
            Step::Hold { outcome, next } => {
                return hold(&api, &pet, ctx, &facts, outcome, next).await;
            }
            Step::AddFinalizer => pet = Arc::new(add_finalizer(&api, &pet).await?),
            Step::Observe { id } => return execute(&api, &pet, ctx, &facts, id.as_deref()).await,
            Step::Create => return create_first(&api, &pet, ctx, &facts).await,
        }
    }
    Err(Error::MalformedPet(pet.name_any()))
}

/// Touches nothing in the store; shows why.
async fn hold(
    api: &Api<Pet>,
    pet: &Pet,
    ctx: &Context,
    facts: &Facts,
    outcome: Outcome,
    next: Next,
) -> Result<Action, Error> {
    ctx.last_sync().remove(&facts.uid);
    ctx.report(api, pet, &outcome).await;
    let reason = outcome.synced_reason();
    if reason.is_warning() {
        info!(%reason, message = %outcome.message, "holding: nothing touched in the store");
    }
    match next {
        // Counted as a failure, with backoff.
        Next::Retry => Err(Error::Held(reason, outcome.message)),
        next => {
            if reason.is_warning() {
                ctx.metrics.reconcile_failed(reason);
            }
            Ok(ctx.action(next, &facts.uid))
        }
    }
}

/// Observes the store, decides, and runs the plan. A record that vanished
/// or changed owner meanwhile is observed again at once.
async fn execute(
    api: &Api<Pet>,
    pet: &Pet,
    ctx: &Context,
    facts: &Facts,
    id: Option<&str>,
) -> Result<Action, Error> {
    let mut attempt = 1;
    loop {
        let result = match ctx.store.observe(id, &facts.uid).await {
            Err(StoreError::Unimplemented { operation }) => {
                Ok(Observation::StoreLacks { missing: operation })
            }
            other => other.map(Observation::Found),
        };
        let result = match result {
            Ok(observation) => {
                let plan = decide(facts, observation);
                debug!(?plan, "decided");
                match plan {
                    Plan::Hold { outcome, next } => {
                        return hold(api, pet, ctx, facts, outcome, next).await;
                    }
                    Plan::Sync(sync) => run_sync(api, pet, ctx, facts, &sync).await,
                    Plan::Finish(finish) => run_finish(api, pet, ctx, facts, &finish).await,
                }
            }
            Err(error) => Err(Error::Store(error)),
        };
        match result {
            Err(Error::Store(
                ref error @ (StoreError::NotFound { .. } | StoreError::KeyConflict { .. }),
            )) if attempt < OBSERVE_ATTEMPTS => {
                info!(%error, "the record changed since it was observed; observing again");
                attempt += 1;
            }
            Err(error) => return fail(api, pet, ctx, facts, error).await,
            Ok(action) => return Ok(action),
        }
    }
}

/// Creates without reading first ([`Step::Create`]), and reads after all
/// when the key already named a record.
async fn create_first(
    api: &Api<Pet>,
    pet: &Pet,
    ctx: &Context,
    facts: &Facts,
) -> Result<Action, Error> {
    let created = match create(pet, ctx, facts).await {
        Ok(created) => created,
        Err(error) => return fail(api, pet, ctx, facts, error).await,
    };
    let Some(sync) = after_create(facts, &created) else {
        info!(
            id = created.id(),
            "the Pet's UID already named a store record; reading it"
        );
        return execute(api, pet, ctx, facts, None).await;
    };
    ctx.metrics.store_action(StoreAction::Create);
    match run_sync(api, pet, ctx, facts, &sync).await {
        Ok(action) => Ok(action),
        Err(error) => fail(api, pet, ctx, facts, error).await,
    }
}

/// Shows a failure; a spec the store rejected waits for a change, anything
/// else is retried with backoff.
async fn fail(
    api: &Api<Pet>,
    pet: &Pet,
    ctx: &Context,
    facts: &Facts,
    error: Error,
) -> Result<Action, Error> {
    ctx.last_sync().remove(&facts.uid);
    let reason = error.reason();
    ctx.report(api, pet, &Outcome::from_error(reason, &error.to_string()))
        .await;
    if reason == Reason::InvalidSpec {
        info!(%error, "spec rejected by the store; waiting for a change");
        ctx.metrics.reconcile_failed(reason);
        return Ok(Action::await_change());
    }
    Err(error)
}

/// Brings the store in line with the Pet, then records the ID and outcome.
async fn run_sync(
    api: &Api<Pet>,
    pet: &Pet,
    ctx: &Context,
    facts: &Facts,
    sync: &SyncPlan,
) -> Result<Action, Error> {
    let id = match &sync.target {
        Target::Existing(id) => {
            if sync.claim {
                ctx.store.set_key(id, "", &facts.uid).await?;
                ctx.metrics.store_action(StoreAction::Claim);
                info!(%id, "took ownership of the store record");
            }
            if sync.update {
                ctx.store.update(id, &facts.desired).await?;
                ctx.metrics.store_action(StoreAction::Update);
            }
            id.clone()
        }
        Target::Create => {
            let id = create(pet, ctx, facts).await?.id().to_owned();
            let recreated = matches!(sync.story, Story::Recreated { .. });
            ctx.metrics.store_action(if recreated {
                StoreAction::Recreate
            } else {
                StoreAction::Create
            });
            id
        }
    };
    let outcome = sync.outcome(&id);
    ctx.write_outcome(api, pet, Some(&id), &outcome).await?;
    // A problem shown although the record is in line (a misspelled
    // annotation) gets its Warning once, like any failure.
    let previous = pet.condition(status::SYNCED).map(|c| c.reason.as_str());
    let reason = outcome.synced_reason();
    if sync.warning.is_some() && previous != Some(reason.as_str()) {
        ctx.publish(pet, reason, outcome.message.clone());
    }
    ctx.last_sync()
        .insert(facts.uid.clone(), (pet.metadata.generation, Instant::now()));
    // After the status write, so Ready is never held up by an Event.
    if let Some((reason, note)) = sync.story.notice(Some(&id)) {
        if reason.is_warning() {
            warn!(%reason, "{note}");
        }
        ctx.publish_action(pet, reason, sync.story.action(), note);
    }
    Ok(Action::requeue(ctx.poll_delay(&facts.uid)))
}

async fn create(pet: &Pet, ctx: &Context, facts: &Facts) -> Result<Created, Error> {
    let created = ctx.store.create(&facts.uid, &facts.desired).await?;
    ctx.create_observes
        .store(created.is_known(), Ordering::Relaxed);
    let id = created.id();
    match &created {
        Created::Existing(_) => {
            info!(%id, "found the store record created earlier with this Pet's UID")
        }
        Created::New(_) | Created::Unknown(_) => info!(%id, "created store record"),
    }
    if ctx.settings.fault == Some(Fault::HangAfterCreate) {
        warn!(%id, pet = %pet.name_any(), "fault injection: hanging after create, before the ID reaches status");
        std::future::pending::<()>().await;
    }
    Ok(created)
}

/// Deletion: deletes or releases the record, then the finalizer.
async fn run_finish(
    api: &Api<Pet>,
    pet: &Pet,
    ctx: &Context,
    facts: &Facts,
    finish: &Finish,
) -> Result<Action, Error> {
    if let Some(id) = &finish.release {
        ctx.store.set_key(id, &facts.uid, "").await?;
        ctx.metrics.store_action(StoreAction::Release);
    }
    if let Some(id) = &finish.delete {
        ctx.store.delete(id).await?;
        ctx.metrics.store_action(StoreAction::Delete);
    }
    ctx.last_sync().remove(&facts.uid);
    // The store change is done, so the Event is true even if removing the
    // finalizer fails and the deletion is retried.
    if let Some((reason, note)) = finish.story.notice(None) {
        ctx.publish_action(pet, reason, finish.story.action(), note);
    }
    remove_finalizer(api, pet).await?;
    Ok(Action::await_change())
}

/// Adds our finalizer. The resourceVersion precondition makes the API server
/// refuse (409) if anyone changed the Pet since we read it, so no other
/// finalizer is ever overwritten.
async fn add_finalizer(api: &Api<Pet>, pet: &Pet) -> Result<Pet, Error> {
    let mut finalizers = pet.finalizers().to_vec();
    finalizers.push(FINALIZER.to_owned());
    patch_finalizers(api, pet, finalizers)
        .await
        .map_err(|source| Error::AddFinalizer {
            name: pet.name_any(),
            source,
        })
}

/// Removes our finalizer, with the same precondition.
async fn remove_finalizer(api: &Api<Pet>, pet: &Pet) -> Result<Pet, Error> {
    let finalizers = pet
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    patch_finalizers(api, pet, finalizers)
        .await
        .map_err(|source| Error::RemoveFinalizer {
            name: pet.name_any(),
            source,
        })
}

/// Merge-patches the Pet's status. The reply (the whole Pet, managedFields
/// and all) is not decoded: nothing reads it, and the watch brings the same
/// object to the cache anyway. Errors, a 409 among them, are kube's as usual.
async fn patch_status(
    client: &Client,
    pet: &Pet,
    name: &str,
    status: &PetStatus,
) -> Result<(), kube::Error> {
    let patch = Patch::Merge(serde_json::json!({ "status": status }));
    let request = kube::core::Request::new(Pet::url_path(&(), pet.namespace().as_deref()))
        .patch_subresource("status", name, &PatchParams::default(), &patch)
        .map_err(kube::Error::BuildRequest)?;
    client.request_text(request).await.map(drop)
}

async fn patch_finalizers(
    api: &Api<Pet>,
    pet: &Pet,
    finalizers: Vec<String>,
) -> Result<Pet, kube::Error> {
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
    ctx.metrics.reconcile_failed(error.reason());
    let failures = {
        let mut failures = ctx.failures();
        let count = failures.entry(pet.uid().unwrap_or_default()).or_insert(0);
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
