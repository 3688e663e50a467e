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
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use tracing::{Instrument, debug, info, info_span, warn};

use crate::Error;
use crate::crd::{FINALIZER, Pet};
use crate::decision::{Observed, Plan, decide};
use crate::metrics::Metrics;
use crate::status::{self, Outcome, next_status};
use crate::store::{PetData, PetStore, StoreError};

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
    /// Fraction of `poll_interval` added or removed at random, so Pets
    /// created together do not poll together.
    pub poll_jitter: f64,
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
            poll_jitter: 0.1,
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
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    pub settings: Settings,
    /// Consecutive failures per Pet, for exponential backoff.
    failures: Mutex<HashMap<ObjectRef<Pet>, u32>>,
}

impl Context {
    pub fn new(
        client: Client,
        store: Arc<dyn PetStore>,
        recorder: Recorder,
        metrics: Arc<Metrics>,
        settings: Settings,
    ) -> Self {
        Self {
            client,
            store,
            recorder,
            metrics,
            settings,
            failures: Mutex::default(),
        }
    }

    fn failures(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectRef<Pet>, u32>> {
        // The map only holds counters; a panic elsewhere cannot corrupt it.
        self.failures.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn poll_delay(&self) -> Duration {
        let jitter = self.settings.poll_jitter.clamp(0.0, 1.0);
        let factor = 1.0 + jitter * (fastrand::f64() * 2.0 - 1.0);
        self.settings.poll_interval.mul_f64(factor)
    }

    async fn publish(&self, pet: &Pet, type_: EventType, reason: &str, note: String) {
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(note),
            action: "Reconcile".into(),
            secondary: None,
        };
        // Events are best effort: in a terminating namespace they are refused,
        // and that must not block deletion.
        if let Err(err) = self.recorder.publish(&event, &pet.object_ref(&())).await {
            debug!(error = %err, reason, "could not publish event");
        }
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
        for attempt in 1..=STATUS_WRITE_ATTEMPTS {
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
        unreachable!("the last attempt always returns")
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
        let after = next_status(pet.status.as_ref(), None, None, &outcome, Utc::now());
        let reason = after
            .conditions
            .iter()
            .find(|c| c.type_ == status::SYNCED)
            .map(|c| c.reason.clone())
            .unwrap_or_default();
        if reason != previous {
            self.publish(pet, EventType::Warning, &reason, error.to_string())
                .await;
        }
        outcome
    }
}

/// Runs the controller until `shutdown` resolves.
pub async fn run(ctx: Arc<Context>, shutdown: impl Future<Output = ()> + Send + Sync + 'static) {
    let pets: Api<Pet> = Api::all(ctx.client.clone());
    let config = controller::Config::default().concurrency(ctx.settings.concurrency);
    Controller::new(pets, watcher::Config::default())
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

    finalizer(&api, FINALIZER, pet, |event| async {
        match event {
            FinalizerEvent::Apply(pet) => apply(&api, &pet, ctx).await,
            FinalizerEvent::Cleanup(pet) => cleanup(&api, &pet, ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))
}

async fn apply(api: &Api<Pet>, pet: &Pet, ctx: &Context) -> Result<Action, Error> {
    // A rejected spec stays rejected until it changes (a new generation).
    if status::rejected_this_generation(pet.status.as_ref(), pet.metadata.generation) {
        return Ok(Action::await_change());
    }
    match sync(pet, ctx).await {
        Ok(id) => {
            ctx.write_outcome(api, pet, Some(&id), &Outcome::Synced)
                .await?;
            Ok(Action::requeue(ctx.poll_delay()))
        }
        Err(error) => {
            let outcome = ctx.report_failure(api, pet, &error).await;
            if matches!(outcome, Outcome::InvalidSpec(_)) {
                info!(error = %error, "spec rejected by the store; waiting for a change");
                return Ok(Action::await_change());
            }
            Err(error)
        }
    }
}

/// Brings the store in line with the Pet and returns the record's ID.
async fn sync(pet: &Pet, ctx: &Context) -> Result<String, Error> {
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
    match plan {
        Plan::InSync { id } => Ok(id),
        Plan::Update { id } => {
            ctx.store.update(&id, &desired).await?;
            ctx.metrics.store_action("update");
            ctx.publish(
                pet,
                EventType::Normal,
                "Updated",
                format!("updated store record {id} to match the spec"),
            )
            .await;
            Ok(id)
        }
        Plan::Adopt { id, update } => {
            if update {
                ctx.store.update(&id, &desired).await?;
                ctx.metrics.store_action("update");
            }
            ctx.publish(
                pet,
                EventType::Normal,
                "Adopted",
                format!("found store record {id} by this Pet's UID and recorded its ID"),
            )
            .await;
            Ok(id)
        }
        Plan::Create => {
            let id = create(pet, ctx, &uid, &desired).await?;
            ctx.metrics.store_action("create");
            ctx.publish(
                pet,
                EventType::Normal,
                "Created",
                format!("created store record {id}"),
            )
            .await;
            Ok(id)
        }
        Plan::Recreate { lost_id } => {
            let id = create(pet, ctx, &uid, &desired).await?;
            ctx.metrics.store_action("recreate");
            warn!(%lost_id, %id, "store record was missing; recreated it");
            ctx.publish(
                pet,
                EventType::Warning,
                "Recreated",
                format!("store record {lost_id} was missing; created {id} in its place"),
            )
            .await;
            Ok(id)
        }
    }
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
    if pet.orphans_on_delete() {
        let id = pet.status_id().unwrap_or("(none)");
        ctx.publish(
            pet,
            EventType::Normal,
            "Orphaned",
            format!("deletion-policy is Orphan: kept store record {id}"),
        )
        .await;
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
            ctx.publish(pet, EventType::Normal, "Deleted", note).await;
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
