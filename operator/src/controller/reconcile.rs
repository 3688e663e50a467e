//! One reconcile of one Pet, as one object. [`Reconcile::act`] plans
//! ([`super::plan::plan`], as `kubectl petstore plan` does) and executes
//! the plan: it touches only the store (and adds the finalizer, which comes
//! before anything else). [`Reconcile::record`] then makes the ending known,
//! in one place: the status, the finalizer's release, Events, the errors
//! metric, the log and the Pet's memory.
//!
//! Every write to the store is told once, by [`Reconcile::wrote`]: one
//! `info` line on the `petstore_operator::changes` target (the change log:
//! the Pet, the record, the cause and each field's old and new value), and
//! `store_actions_total{action,cause}`. The story's Event carries the same
//! cause and fields.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use tracing::{Instrument, debug, info, info_span, warn};

use super::context::store_of;
use super::drift_storm::Storm;
use super::poll::FeedMark;
use super::{Context, finalizer, status_write};
use crate::crd::Pet;
// `Sync` would shadow the marker trait.
use super::plan::{Planned, plan};
use crate::decision::preview::created_fields;
use crate::decision::{
    Cause, Decision, DriftBrake, Facts, Gate, Next, Plan, StoreAction, Story, Sync as SyncPlan,
    Target, Write, after_create, gate, read_after_create,
};
use crate::status::{self, Outcome, PlanUpdate, Reason};
use crate::store::{Changes, Created, Field, PetStore, StoreError};
use crate::stores::StoreId;
use crate::{Error, Fault};

/// Observations per reconcile: a record that vanishes before an update, or
/// whose key changes before a compare-and-set, is observed again at once
/// rather than after a backoff.
const OBSERVE_ATTEMPTS: u32 = 3;

pub struct Reconcile<'a> {
    ctx: &'a Context,
    api: Api<Pet>,
    pet: Arc<Pet>,
    facts: Facts,
    /// The store this Pet uses, with its namespace's identity.
    store: Arc<dyn PetStore>,
    /// Which store that is, once found: its change feed decides the next
    /// poll (the Pet's copy may predate pinning it in `status.store`).
    store_id: Option<StoreId>,
    /// Which feeds were followed before the first read: see
    /// [`super::poll::FeedMark`].
    feed_mark: FeedMark,
}

/// How a reconcile ended, before [`Reconcile::record`] makes it known.
enum Ending {
    /// Nothing to write: look again then.
    Quiet(Next),
    /// The record with this ID is in line with the Pet; `changes` are what
    /// this reconcile wrote to it.
    Synced {
        id: String,
        sync: SyncPlan,
        changes: Changes,
        /// The approval this write used up, if any.
        approved: Option<String>,
    },
    /// The change policy kept the plan from being written: show it.
    Planned {
        plan: Plan,
        outcome: Outcome,
        stale: Option<String>,
    },
    /// The store side of a deletion is done.
    Finished(Story),
    Problem(Problem),
}

/// A reconcile that did not bring the Pet in line: held by the decision
/// step, or failed.
pub struct Problem {
    reason: Reason,
    /// The conditions to show; `None` before the Pet may be shown anything
    /// (its finalizer could not be written, so nothing else was done).
    outcome: Option<Outcome>,
    next: Next,
    /// What failed; a hold that is retried reports [`Error::Held`].
    error: Option<Error>,
}

impl Problem {
    fn held(outcome: Outcome, next: Next) -> Self {
        Self {
            reason: outcome.synced_reason(),
            outcome: Some(outcome),
            next,
            error: None,
        }
    }

    /// A spec the store rejected waits for a change; anything else is
    /// retried with backoff.
    fn failed(error: Error) -> Self {
        let reason = error.reason();
        Self {
            reason,
            outcome: Some(Outcome::from_error(reason, &error.to_string())),
            next: if reason == Reason::InvalidSpec {
                Next::AwaitChange
            } else {
                Next::Retry
            },
            error: Some(error),
        }
    }

    /// Failed before the Pet may be shown anything: retried, nothing written.
    pub fn unshown(error: Error) -> Self {
        Self {
            reason: error.reason(),
            outcome: None,
            next: Next::Retry,
            error: Some(error),
        }
    }
}

impl<'a> Reconcile<'a> {
    pub fn new(pet: &Arc<Pet>, ctx: &'a Context) -> Result<Self, Error> {
        let namespace = pet
            .namespace()
            .ok_or_else(|| Error::MalformedPet(pet.name_any()))?;
        Ok(Self {
            feed_mark: ctx.poll.mark(),
            facts: ctx.facts(pet)?,
            api: Api::namespaced(ctx.client.clone(), &namespace),
            pet: Arc::clone(pet),
            store: Arc::clone(&ctx.store),
            store_id: None,
            ctx,
        })
    }

    /// The store the Pet uses: as found, else as its status says.
    fn store_id(&self) -> Option<StoreId> {
        self.store_id.clone().or_else(|| store_of(&self.pet))
    }

    /// Finds the store the Pet uses, and pins it in `status.store` before
    /// anything is written there: a record is never made in a store the
    /// Pet does not show.
    async fn use_store(&mut self) -> Result<(), Problem> {
        let found = self
            .ctx
            .stores
            .for_pet(&self.pet)
            .await
            .map_err(|refused| Problem::failed(Error::Held(refused.reason, refused.message)))?;
        let pinned = self.pet.status.as_ref().and_then(|s| s.store.clone());
        let wanted = found.id.status_value();
        if wanted.is_some() && pinned != wanted && !self.facts.deleting {
            let pet = status_write::pin_store(&self.api, &self.pet, wanted.as_deref())
                .await
                .map_err(Problem::unshown)?;
            // Went on with the copy from before the pin, the finalizer's
            // write (which carries its resourceVersion) was refused as a
            // conflict once for every new Pet on a store.
            self.facts = self.ctx.facts(&pet).map_err(Problem::unshown)?;
            self.pet = Arc::new(pet);
        }
        self.store = found.store;
        self.store_id = Some(found.id);
        Ok(())
    }

    pub async fn run(mut self) -> Result<Action, Error> {
        // An echo queued while the failed attempt ran (the watch event of
        // its finalizer write, say) waits out the backoff instead of counting
        // a second failure and writing a second Warning for one attempt.
        if let Some(left) = self.ctx.memory.backoff_left(&self.facts) {
            return Ok(Action::requeue(left));
        }
        let ending = match self.use_store().await {
            Ok(()) => self.act().await,
            Err(problem) => Ending::Problem(problem),
        };
        self.record(ending).await
    }

    /// Plans and executes the plan. A record that vanished or changed owner
    /// meanwhile, or that a create found already there, is observed again
    /// at once.
    async fn act(&mut self) -> Ending {
        let mut may_create_first = true;
        let mut finalizer_added = false;
        let mut attempt = 1;
        loop {
            let planned = plan(
                self.store.as_ref(),
                self.ctx.uninstall.as_ref(),
                &mut self.facts,
                may_create_first,
            )
            .await;
            let result = match planned {
                Ok(Planned::Wait(next)) => return Ending::Quiet(next),
                Ok(Planned::Hold { outcome, next }) => {
                    return Ending::Problem(Problem::held(outcome, next));
                }
                // Once: then planning carries on with the object the API
                // server returned (see finalizer.rs).
                Ok(Planned::AddFinalizer) if finalizer_added => {
                    return Ending::Problem(Problem::unshown(Error::MalformedPet(
                        self.pet.name_any(),
                    )));
                }
                Ok(Planned::AddFinalizer) => {
                    let added = finalizer::add(&self.api, &self.pet)
                        .instrument(petstore_telemetry::span(|| {
                            info_span!("kube.add_finalizer")
                        }))
                        .await;
                    match added.and_then(|pet| Ok((self.ctx.facts(&pet)?, pet))) {
                        Ok((facts, pet)) => (self.facts, self.pet) = (facts, Arc::new(pet)),
                        Err(error) => return Ending::Problem(Problem::unshown(error)),
                    }
                    finalizer_added = true;
                    continue;
                }
                Ok(Planned::CreateFirst) => match self.create_first().await {
                    Ok(Some(ending)) => return ending,
                    // The create made no new record: read the store and
                    // bring the record found in line.
                    Ok(None) => {
                        may_create_first = false;
                        continue;
                    }
                    Err(error) => return Ending::Problem(Problem::failed(error)),
                },
                Ok(Planned::Plan(plan)) => {
                    if plan.cause == Some(Cause::Drift) && !plan.is_empty() {
                        self.notice_drift(&plan).await;
                    }
                    match gate(&self.facts, &plan) {
                        Gate::Apply { approved } => self.execute(plan, approved).await,
                        Gate::Show { outcome, stale } => Ok(Some(Ending::Planned {
                            plan,
                            outcome,
                            stale,
                        })),
                    }
                }
                Err(error) => Err(error),
            };
            match result {
                Ok(Some(ending)) => return ending,
                Ok(None) if attempt < OBSERVE_ATTEMPTS => attempt += 1,
                Ok(None) => {
                    let error = Error::Held(
                        Reason::ReconcileError,
                        format!(
                            "each of {OBSERVE_ATTEMPTS} creates found a record under this Pet's UID that the read before it did not; retrying"
                        ),
                    );
                    return Ending::Problem(Problem::failed(error));
                }
                Err(Error::Store(
                    ref error @ (StoreError::NotFound { .. } | StoreError::KeyConflict { .. }),
                )) if attempt < OBSERVE_ATTEMPTS => {
                    info!(%error, "the record changed since it was observed; observing again");
                    attempt += 1;
                }
                Err(error) => return Ending::Problem(Problem::failed(error)),
            }
            // Read again, never create first: the last read or create
            // found a record.
            may_create_first = false;
        }
    }

    /// This reconcile is about to write drift back: counted toward its
    /// store's drift storm, which brakes the write if it is one.
    /// A record gone while the store is calm is asked about once more: a
    /// store that holds no record at all came back empty.
    async fn notice_drift(&mut self, plan: &Plan) {
        let store = self.store_id().unwrap_or(StoreId::Own);
        let mut storm = self.ctx.drift_noticed(&store, &self.facts.uid);
        let recreates = matches!(
            &plan.decision,
            Decision::Sync(sync) if matches!(sync.story, Story::Recreated { .. })
        );
        if storm == Storm::Calm && recreates {
            let namespace = self.pet.namespace().unwrap_or_default();
            storm = self
                .ctx
                .record_gone(&store, &namespace, self.store.as_ref())
                .await;
        }
        if let Storm::Braking { drifted, pets } = storm {
            self.facts.drift_brake = Some(DriftBrake::Storm { drifted, pets });
        }
    }

    /// Executes the plan: its writes, then what its decision says follows
    /// them. `None` when a create found the record already there; read it.
    async fn execute(&self, plan: Plan, approved: Option<String>) -> Result<Option<Ending>, Error> {
        debug!(?plan, "planned");
        let Plan {
            writes, decision, ..
        } = plan;
        Ok(Some(match decision {
            Decision::Hold { outcome, next } => Ending::Problem(Problem::held(outcome, next)),
            Decision::Sync(sync) => {
                let Applied::Done { created, changes } = self.apply(&sync.story, &writes).await?
                else {
                    return Ok(None);
                };
                let id = match (created, &sync.target) {
                    (Some(id), _) => id,
                    (None, Target::Existing(id)) => id.clone(),
                    (None, Target::Create) => {
                        return Err(Error::Held(
                            Reason::ReconcileError,
                            "a plan to create wrote no record".into(),
                        ));
                    }
                };
                Ending::Synced {
                    id,
                    sync,
                    changes,
                    approved,
                }
            }
            Decision::Finish(finish) => {
                self.apply(&finish.story, &writes).await?;
                Ending::Finished(finish.story)
            }
            Decision::HandOver(hand_over) => {
                self.apply(&hand_over.story(), &writes).await?;
                let outcome = hand_over.outcome(self.facts.status_id.as_deref());
                Ending::Problem(Problem::held(outcome, Next::AwaitChange))
            }
        }))
    }

    /// Creates without reading first ([`Planned::CreateFirst`]): `None`
    /// when the key already named a record; read it.
    async fn create_first(&self) -> Result<Option<Ending>, Error> {
        let created = self.create().await?;
        let Some(sync) = after_create(&self.facts, &created) else {
            self.created_nothing(&created);
            return Ok(None);
        };
        let cause = sync.story.cause(&self.facts);
        let changes = created_fields(&self.facts.desired);
        self.wrote(StoreAction::Create, cause, created.id(), &changes);
        Ok(Some(Ending::Synced {
            id: created.into_id(),
            sync,
            changes,
            approved: None,
        }))
    }

    /// A create made no new record, or may not have ([`read_after_create`]):
    /// nothing is told as written, and the caller reads the store and
    /// brings the record it finds in line.
    fn created_nothing(&self, created: &Created) {
        info!(
            id = created.id(),
            "the create did not make a new record, or the store did not say; reading it"
        );
    }

    /// Makes the plan's writes, in order: the list a pending plan shows is
    /// the list written. A create that finds its record already there
    /// ([`read_after_create`]: an earlier create that committed after its
    /// timeout, which the read that planned this one did not show) stops
    /// it: the record is read again.
    async fn apply(&self, story: &Story, writes: &[Write]) -> Result<Applied, Error> {
        let store = &self.store;
        let cause = story.cause(&self.facts);
        let mut created = None;
        let mut changed = Changes::default();
        for write in writes {
            let mut turn = 0;
            let record = match write {
                Write::Create { changes, .. } => {
                    let answer = self.create().await?;
                    if read_after_create(&answer, true) {
                        self.created_nothing(&answer);
                        return Ok(Applied::ReadAgain);
                    }
                    self.wrote(write.action(), cause, answer.id(), changes);
                    created = Some(answer.into_id());
                    changed = changes.clone();
                    continue;
                }
                Write::Claim {
                    record,
                    expected,
                    new,
                    identity,
                    ..
                } => {
                    turn = self.fault_before_key_write(write.action(), record).await;
                    let (expected, new) = (expected.to_string(), new.to_string());
                    store
                        .set_key(record, &expected, &new, identity.as_deref())
                        .await?;
                    record
                }
                Write::Release { record, from, to } => {
                    store
                        .set_key(record, &from.to_string(), &to.to_string(), None)
                        .await?;
                    record
                }
                Write::Update { record, changes } => {
                    store.update(record, &self.facts.desired).await?;
                    changed = changes.clone();
                    record
                }
                Write::Delete { record } => {
                    store.delete(record).await?;
                    record
                }
            };
            self.wrote(write.action(), cause, record, &write.changes());
            self.fault_after_write(write.action(), record, turn).await;
        }
        Ok(Applied::Done {
            created,
            changes: changed,
        })
    }

    /// The crash-test faults that hang before a claim's compare-and-set.
    /// Returns the claim's turn (from 1) under [`Fault::HangAfterClaims`],
    /// else 0.
    async fn fault_before_key_write(&self, action: StoreAction, record: &str) -> u32 {
        let hang = match (action, self.ctx.settings.fault) {
            (StoreAction::Claim, Some(Fault::HangBeforeClaim)) => true,
            (StoreAction::Claim, Some(Fault::HangAfterClaims(allowed))) => {
                let turn = self.ctx.fault_claims.fetch_add(1, Ordering::Relaxed) + 1;
                if turn <= allowed {
                    return turn;
                }
                true
            }
            _ => false,
        };
        if hang {
            warn!(record_id = record, pet = %self.pet.name_any(), "fault injection: hanging before a claim");
            std::future::pending::<()>().await;
        }
        0
    }

    /// The crash-test faults that hang after a store write, before its
    /// status and Event: [`Fault::HangAfterRelease`], and the last claim
    /// [`Fault::HangAfterClaims`] lets through.
    async fn fault_after_write(&self, action: StoreAction, record: &str, turn: u32) {
        let what = match (action, self.ctx.settings.fault) {
            (StoreAction::Release, Some(Fault::HangAfterRelease)) => "a release",
            (StoreAction::Claim, Some(Fault::HangAfterClaims(allowed))) if turn == allowed => {
                "the last claim let through"
            }
            _ => return,
        };
        warn!(record_id = record, pet = %self.pet.name_any(), "fault injection: hanging after {what}, before its status and Event");
        std::future::pending::<()>().await;
    }

    /// Tells one store write: the change log line, `store_actions_total`,
    /// and for drift, `drift_detected_total` and the Pet's drift memory.
    fn wrote(&self, action: StoreAction, cause: Cause, id: &str, changes: &Changes) {
        let pet = &self.pet;
        info!(
            target: "petstore_operator::changes",
            namespace = pet.namespace().unwrap_or_default(),
            pet = pet.name_any(),
            uid = self.facts.uid,
            record_id = id,
            action = action.label(),
            %cause,
            %changes,
            "store record {}", action.past_tense()
        );
        let metrics = &self.ctx.metrics;
        metrics.store_action(action, cause);
        if cause == Cause::Drift && matches!(action, StoreAction::Update | StoreAction::Recreate) {
            let fields: Vec<Field> = if action == StoreAction::Recreate {
                vec![Field::Record]
            } else {
                changes.fields().collect()
            };
            for field in fields {
                metrics.drift_detected(field);
            }
            if self.ctx.memory.drift_corrected(pet, &self.facts.uid) {
                warn!(
                    record_id = id,
                    "store record corrected for drift again: something outside the operator keeps changing it"
                );
            }
        }
    }

    async fn create(&self) -> Result<Created, Error> {
        let created = self
            .store
            .create(
                &self.facts.key(),
                Some(&self.facts.identity),
                &self.facts.desired,
            )
            .await?;
        self.ctx
            .create_observes
            .store(created.is_known(), Ordering::Relaxed);
        let id = created.id();
        if let Created::Existing(_) = &created {
            info!(%id, "found the store record created earlier with this Pet's UID");
        }
        if self.ctx.settings.fault == Some(Fault::HangAfterCreate) {
            warn!(%id, pet = %self.pet.name_any(), "fault injection: hanging after create, before the ID reaches status");
            std::future::pending::<()>().await;
        }
        Ok(created)
    }

    /// Makes the ending known. A write that fails here (the status, the
    /// finalizer's release) becomes the problem shown.
    async fn record(&self, ending: Ending) -> Result<Action, Error> {
        let uid = &self.facts.uid;
        let problem = match ending {
            Ending::Quiet(next) => {
                if self.facts.deleting && !self.facts.has_finalizer {
                    // Going, with no finalizer of ours to wait for.
                    self.ctx.memory.forget(uid);
                } else {
                    self.ctx.memory.succeeded(uid);
                }
                return Ok(self.ctx.action(
                    next,
                    self.store_id().as_ref(),
                    &self.pet,
                    (uid, self.feed_mark),
                ));
            }
            Ending::Synced {
                id,
                sync,
                changes,
                approved,
            } => match self.record_sync(&id, &sync, &changes, approved).await {
                Ok(()) => {
                    let delay =
                        self.ctx
                            .poll_delay_after(self.store_id().as_ref(), uid, self.feed_mark);
                    return Ok(self.ctx.requeue(&self.pet, uid, delay));
                }
                Err(error) => Problem::failed(error),
            },
            Ending::Finished(story) => match self.record_finish(&story).await {
                Ok(()) => return Ok(Action::await_change()),
                Err(error) => Problem::failed(error),
            },
            Ending::Planned {
                plan,
                outcome,
                stale,
            } => match self.record_plan(&plan, &outcome, stale).await {
                Ok(()) => {
                    let held = Problem::held(outcome, Next::Poll);
                    return count(
                        self.ctx,
                        &self.pet,
                        Some((&self.facts, self.feed_mark)),
                        held,
                    );
                }
                Err(error) => Problem::failed(error),
            },
            Ending::Problem(problem) => problem,
        };
        if let Some(outcome) = &problem.outcome {
            if let Err(error) = self.write_status(None, outcome, &PlanUpdate::Keep).await {
                debug!(%error, "could not record the outcome in status");
            }
            self.show(outcome, true);
        }
        count(
            self.ctx,
            &self.pet,
            Some((&self.facts, self.feed_mark)),
            problem,
        )
    }

    /// The ID and conditions to status, then the story's Event: after the
    /// status write, so Ready is never held up by an Event.
    async fn record_sync(
        &self,
        id: &str,
        sync: &SyncPlan,
        changes: &Changes,
        approved: Option<String>,
    ) -> Result<(), Error> {
        let outcome = sync.outcome(id);
        let plan = PlanUpdate::Clear { applied: approved };
        let written = self.write_status(Some(id), &outcome, &plan).await?;
        // A warning (a misspelled annotation) can be shown although the
        // record is in line; any other is told by the story's Event.
        self.show(&outcome, sync.warning.is_some());
        let synced_as = (self.pet.metadata.generation, self.facts.intent());
        let waited = self.ctx.memory.in_sync(
            &self.pet,
            &self.facts.uid,
            synced_as,
            id,
            written.as_deref(),
        );
        if let Some(waited) = waited {
            self.ctx.metrics.became_ready(waited);
        }
        let cause = sync.story.cause(&self.facts);
        if let Some((reason, note)) = sync.story.event(Some(id), cause, changes) {
            if reason.is_warning() {
                warn!(%reason, "{note}");
            }
            self.publish(reason, sync.story.action(), note);
        }
        Ok(())
    }

    /// The story's Event, then the finalizer's release. The store change is
    /// done, so the Event is true even if the release fails and the deletion
    /// is retried (which would find no record to tell of).
    async fn record_finish(&self, story: &Story) -> Result<(), Error> {
        if let Some((reason, note)) = story.notice(None) {
            self.publish(reason, story.action(), note);
        }
        finalizer::remove(&self.api, &self.pet)
            .instrument(petstore_telemetry::span(|| {
                info_span!("kube.remove_finalizer")
            }))
            .await?;
        self.ctx.memory.forget(&self.facts.uid);
        Ok(())
    }

    /// A plan the change policy keeps from being written: shown in
    /// `status.plan` and the conditions, with one Event per new plan (and
    /// one Warning per stale approval), not per reconcile. Held until the
    /// Pet or its record changes.
    async fn record_plan(
        &self,
        planned: &Plan,
        outcome: &Outcome,
        stale: Option<String>,
    ) -> Result<(), Error> {
        let shown = PlanUpdate::Show(planned.to_status());
        self.write_status(None, outcome, &shown).await?;
        self.ctx
            .memory
            .shown(&self.pet, &self.facts.uid, outcome.synced_reason());
        let news =
            self.ctx
                .memory
                .plan_shown(&self.pet, &self.facts.uid, &planned.hash, stale.as_deref());
        if news.new_stale_approval {
            let stale = stale.as_deref().unwrap_or_default();
            let note = format!(
                "the annotation {} names plan {stale}, but the pending plan is now {}: the spec or the store record changed since; nothing was written. Review status.plan and approve {} to apply it",
                crate::crd::APPROVE_PLAN_ANNOTATION,
                planned.hash,
                planned.hash
            );
            warn!(%stale, plan = %planned.hash, "approval is stale; nothing written");
            self.publish(Reason::ApprovalStale, "RefuseStaleApproval", note);
        }
        if news.new_plan {
            let reason = outcome.synced_reason();
            self.publish(
                reason,
                "ShowPlan",
                format!("plan {}: {}", planned.hash, planned.describe()),
            );
        }
        Ok(())
    }

    async fn write_status(
        &self,
        id: Option<&str>,
        outcome: &Outcome,
        plan: &PlanUpdate,
    ) -> Result<Option<String>, Error> {
        status_write::write(&self.ctx.client, &self.pet, id, outcome, plan)
            .instrument(petstore_telemetry::span(|| info_span!("kube.patch_status")))
            .await
    }

    /// Remembers that the Pet was shown `outcome`, and if `warn`, publishes
    /// a Warning for its reason unless the Pet already showed that reason:
    /// once per change, not per retry, so a long outage does not flood the
    /// API server. What this process last showed decides (the cache's copy
    /// may predate that write: see [`super::memory::Memory::shown`]); after
    /// a restart, or once the Pet was shown something else, the copy does.
    fn show(&self, outcome: &Outcome, warn: bool) {
        let reason = outcome.synced_reason();
        let before = self.ctx.memory.shown(&self.pet, &self.facts.uid, reason);
        if !warn || !reason.is_warning() {
            return;
        }
        let already = match before {
            Some(warned) => warned == reason,
            None => {
                self.pet
                    .condition(status::SYNCED)
                    .map(|c| c.reason.as_str())
                    == Some(reason.as_str())
            }
        };
        if !already {
            self.publish(reason, "Reconcile", outcome.message.clone());
        }
    }

    /// Queues an Event; it is written in the background (best effort).
    fn publish(&self, reason: Reason, action: &str, note: String) {
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
        self.ctx.events.publish(event, self.pet.object_ref(&()));
    }
}

/// Counts a problem: the errors metric for a warning, and for a failure
/// that is retried, the Pet's failures in a row and the intent that failed
/// (from which [`super::error_policy`] makes the backoff, without building
/// the facts again) and a log line at the first failure and then at powers
/// of two, so a long outage does not flood the log. `read` holds the facts
/// the reconcile acted on and the feeds followed before its reads; `None`
/// only for a malformed Pet.
pub fn count(
    ctx: &Context,
    pet: &Pet,
    read: Option<(&Facts, FeedMark)>,
    problem: Problem,
) -> Result<Action, Error> {
    let facts = read.map(|(facts, _)| facts);
    let Problem {
        reason,
        outcome,
        next,
        error,
    } = problem;
    if reason.is_warning() {
        ctx.metrics.reconcile_failed(reason);
    }
    let message = outcome.map(|outcome| outcome.message).unwrap_or_default();
    match read.map(|(facts, mark)| (facts.uid.as_str(), mark)) {
        Some((uid, mark)) if next != Next::Retry => {
            if reason.is_warning() {
                info!(%reason, %message, "not in line; waiting for a change or the next poll");
            }
            // Neither in sync nor failing: only what it was shown.
            ctx.memory.held(uid);
            return Ok(ctx.action(next, store_of(pet).as_ref(), pet, (uid, mark)));
        }
        _ => {}
    }
    let failures = facts.map_or(1, |facts| {
        ctx.memory.failed(pet, &facts.uid, facts.intent())
    });
    let error = error.unwrap_or(Error::Held(reason, message));
    if failures.is_power_of_two() {
        warn!(failures, %error, "reconcile failed; retrying with backoff");
    } else {
        debug!(failures, %error, "reconcile failed again");
    }
    Err(error)
}

/// How [`Reconcile::apply`] ended.
enum Applied {
    /// Every write made: the ID of the record created, if one was, and what
    /// was written to the record's fields.
    Done {
        created: Option<String>,
        changes: Changes,
    },
    /// A create found the record already there: read it, and plan again.
    ReadAgain,
}
