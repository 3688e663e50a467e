//! The controller's settings and what every reconcile shares: the clients,
//! the Pets' memory and drift-poll schedule, and the watch-event filter
//! that decides which events become reconciles.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};

use super::drift_storm::{DriftStorms, Storm, StormThreshold};
use super::memory::Memory;
use super::poll::{FeedMark, PollSchedule};
use super::{facts_of, uninstall};
use crate::crd::Pet;
use crate::decision::{Facts, Next, Step, first_step};
use crate::events::EventQueue;
use crate::metrics::Metrics;
use crate::store::PetStore;
use crate::stores::{StoreId, Stores};
use crate::{Error, Fault};

/// A status write's watch event later than this is not waited for: the Pet
/// is synced again (idempotent) rather than left unpolled if the watch lost
/// the event.
const LATE_ECHO_LIMIT: Duration = Duration::from_secs(60);

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
    /// When many drifted records at once brake a store's writes
    /// ([`super::drift_storm`]).
    pub drift_storm: StormThreshold,
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
            drift_storm: StormThreshold::DEFAULT,
            fault: None,
        }
    }
}

/// What every reconcile shares.
pub struct Context {
    pub client: Client,
    /// The operator's own store (`--petstore-addr`): the store of every
    /// Pet that names none and whose namespace has no default.
    pub store: Arc<dyn PetStore>,
    /// Which store each Pet uses, and their clients.
    pub stores: Arc<Stores>,
    pub events: EventQueue,
    pub metrics: Arc<Metrics>,
    pub settings: Settings,
    pub(super) poll: PollSchedule,
    pub(super) memory: Memory,
    pub(super) drift_storms: DriftStorms,
    /// The last create said whether its key already named a record: until
    /// one has, every create is read for first (see [`Step::Create`]), so a
    /// store that ignores keys never gets a create without a read.
    pub(super) create_observes: AtomicBool,
    /// Claims begun so far, for [`Fault::HangAfterClaims`].
    pub(super) fault_claims: AtomicU32,
    /// Set in a real run: a Pet deleted while the installation goes keeps
    /// its record.
    pub(super) uninstall: Option<uninstall::UninstallProbe>,
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
            drift_storms: DriftStorms::new(settings.drift_storm),
            poll: PollSchedule::new(settings.poll_interval, settings.poll_max_rate)
                .with_audit_interval(settings.audit_interval),
            stores: Stores::own_only(client.clone(), Arc::clone(&store)),
            client,
            store,
            events,
            metrics,
            settings,
            memory: Memory::default(),
            create_observes: AtomicBool::new(false),
            fault_claims: AtomicU32::new(0),
            uninstall: None,
        }
    }

    /// Pets use the stores `stores` resolves (its own store is this
    /// context's).
    pub fn with_stores(mut self, stores: Arc<Stores>) -> Self {
        self.store = Arc::clone(stores.own());
        self.stores = stores;
        self
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
    /// The very copy the sync was decided from is stale however long ago:
    /// under load a watch event came more than a second late (the tests'
    /// poll is 2 s), and the stale copy's create was sent again. A change
    /// the change feed told since makes the echo read the store, and
    /// leaves that copy stale.
    fn recently_synced(&self, pet: &Pet, facts: &Facts) -> Option<Duration> {
        let uid = &facts.uid;
        let synced = self.memory.synced(uid)?;
        let same_intent = synced.generation == facts.generation.and_then(std::num::NonZeroI64::new)
            && synced.intent == facts.intent();
        let echo_due = !synced.store_read_due
            && synced.explains(facts.status_id.as_deref())
            && synced.at.elapsed() < self.settings.poll_interval / 2;
        let stale_copy = synced.decided_from(pet) && synced.at.elapsed() < LATE_ECHO_LIMIT;
        (same_intent && (echo_due || stale_copy))
            .then(|| self.poll_delay(store_of(pet).as_ref(), uid))
    }

    /// Until the next drift poll of this Pet, on `store`: spread by UID and
    /// rate-bounded, at the audit interval while that store's change feed
    /// is followed (see [`super::poll`]).
    pub(super) fn poll_delay(&self, store: Option<&StoreId>, uid: &str) -> Duration {
        self.poll_delay_after(store, uid, self.poll.mark())
    }

    /// As [`Context::poll_delay`], after reads that began at `mark`.
    pub(super) fn poll_delay_after(
        &self,
        store: Option<&StoreId>,
        uid: &str,
        mark: FeedMark,
    ) -> Duration {
        if store == Some(&StoreId::Own) {
            self.metrics.set_poll_interval(self.poll.interval());
        }
        self.poll.delay_after(store, uid, mark)
    }

    /// A Pet of `store` is about to write its drift back: whether that
    /// store is in a drift storm, this drift included.
    pub(super) fn drift_noticed(&self, store: &StoreId, uid: &str) -> Storm {
        let now = std::time::Instant::now();
        let storm = self
            .drift_storms
            .noticed(store, uid, || self.poll.pets_on(store, None), now);
        if matches!(storm, Storm::Braking { .. }) {
            self.refresh_drift_storms(now);
        }
        storm
    }

    /// A Pet of `store` in `namespace` found its record gone: if that
    /// namespace has at least the storm's minimum of Pets on the store and
    /// the store, as this Pet's client sees it, holds no record at all, the
    /// store came back empty, and that is a storm at once.
    pub(super) async fn record_gone(
        &self,
        store: &StoreId,
        namespace: &str,
        client: &dyn crate::store::PetStore,
    ) -> Storm {
        let min = self.settings.drift_storm.min;
        // With the brake off nothing is counted: counting walks the cache.
        if min == 0 {
            return Storm::Calm;
        }
        let pets = self.poll.pets_on(store, Some(namespace));
        if pets < min {
            return Storm::Calm;
        }
        match client.holds_no_records().await {
            Ok(true) => {
                let now = std::time::Instant::now();
                let storm = self.drift_storms.declare(store, pets, now);
                self.refresh_drift_storms(now);
                storm
            }
            // Records there, or no answer: judged as any drift.
            Ok(false) | Err(_) => Storm::Calm,
        }
    }

    /// Sets the drift-storm gauge to the stores braking now (a storm ends
    /// by time, so the poll sweep calls this too).
    pub(super) fn refresh_drift_storms(&self, now: std::time::Instant) {
        let braking = self.drift_storms.braking(now);
        self.metrics.set_drift_storms(braking.len());
    }

    /// The Pet a watch event asks to reconcile, if any, as the fair queue
    /// holds it (see [`for_trigger`]). A Pet the watch no longer holds is
    /// forgotten.
    pub(super) fn to_reconcile(&self, event: watcher::Event<Pet>) -> Option<ObjectRef<Pet>> {
        match event {
            watcher::Event::Apply(pet) | watcher::Event::InitApply(pet) => {
                if !self.needs_reconcile(&pet) {
                    return None;
                }
                if let Some(uid) = &pet.metadata.uid {
                    self.memory.triggered(&pet, uid);
                }
                Some(for_trigger(&pet))
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
    pub(super) fn needs_reconcile(&self, pet: &Pet) -> bool {
        let Ok(facts) = self.facts(pet) else {
            return true;
        };
        if self.memory.backing_off_from(&facts) {
            return false;
        }
        !matches!(first_step(&facts), Step::Wait(Next::After(_)))
    }

    /// Everything the decision step needs to know about the Pet.
    pub(super) fn facts(&self, pet: &Pet) -> Result<Facts, Error> {
        let mut facts = facts_of(pet, &self.settings.installation)?;
        facts.recently_synced = self.recently_synced(pet, &facts);
        facts.create_observes = self.create_observes.load(Ordering::Relaxed);
        Ok(facts)
    }

    /// The controller action for `next`, for a Pet on `store` whose reads
    /// began at `mark`; a failure's backoff comes from
    /// [`super::error_policy`].
    pub(super) fn action(
        &self,
        next: Next,
        store: Option<&StoreId>,
        pet: &Pet,
        (uid, mark): (&str, FeedMark),
    ) -> Action {
        match next {
            Next::AwaitChange => Action::await_change(),
            Next::Poll | Next::Retry => {
                self.requeue(pet, uid, self.poll_delay_after(store, uid, mark))
            }
            Next::After(delay) => self.requeue(pet, uid, delay),
        }
    }

    /// Requeues the Pet: its memory keeps when it is due, and the poll
    /// sweep ([`super::hand_over_due_polls`]) hands it to kube then, so kube's
    /// scheduler holds none of these (see [`Memory::take_due_polls`]).
    pub(super) fn requeue(&self, pet: &Pet, uid: &str, delay: Duration) -> Action {
        self.memory.requeued(pet, uid, delay);
        Action::await_change()
    }
}

/// The store the Pet's record is in, as its `status.store` says (unset: the
/// operator's own); `None` for a value that names no store kind.
pub(super) fn store_of(pet: &Pet) -> Option<StoreId> {
    let namespace = pet.metadata.namespace.as_deref().unwrap_or_default();
    let value = pet
        .status
        .as_ref()
        .and_then(|status| status.store.as_deref());
    StoreId::from_status(namespace, value)
}

/// Whether [`store_of`] the Pet is `store`, without building it: the feed
/// asks this of every cached Pet when it rebuilds a store's index.
pub(super) fn on_store(pet: &Pet, store: &StoreId) -> bool {
    let value = pet
        .status
        .as_ref()
        .and_then(|status| status.store.as_deref())
        .filter(|value| !value.is_empty());
    match (store, value) {
        (StoreId::Own, None) => true,
        (StoreId::Namespaced { namespace, name }, Some(value)) => {
            value.strip_prefix("PetStore/") == Some(name.as_str())
                && pet.metadata.namespace.as_deref() == Some(namespace.as_str())
        }
        (StoreId::Cluster { name }, Some(value)) => {
            value.strip_prefix("ClusterPetStore/") == Some(name.as_str())
        }
        _ => false,
    }
}

/// The reference the fair queue holds: the reconcile reads the Pet from
/// the watch cache, and references compare by name and namespace alone.
/// Without the UID and resourceVersion, every reference held is two strings
/// lighter: 3.5 MiB less peak RSS at N = 20,000 (measured when kube's
/// scheduler still held each Pet's next poll).
fn for_trigger(pet: &Pet) -> ObjectRef<Pet> {
    let reference = ObjectRef::new(&pet.name_any());
    match &pet.metadata.namespace {
        Some(namespace) => reference.within(namespace),
        None => reference,
    }
}
