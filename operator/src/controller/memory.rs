//! What the controller remembers about each Pet between its reconciles, in
//! one entry per Pet UID: how often it has failed in a row (its backoff),
//! when it was last found in sync (so the reconcile its own status write
//! triggers can skip the store), since when it has waited to be Ready, when
//! its next reconcile is due (the drift polls are handed to kube from
//! here: [`Memory::take_due_polls`]), its last drift corrections (the last three
//! for the metrics), and the Warning its status was last given (see
//! [`Memory::shown`]). Keyed by UID, so a Pet deleted and created again under
//! its name starts clean.
//!
//! An entry exists only while there is something to remember, and goes with
//! its Pet: when a reconcile lets the Pet go, when the watch reports it
//! deleted, and when a relist no longer shows it. A reconcile that ends
//! after its Pet went (the watch can report the deletion meanwhile) does not
//! bring the entry back: a new entry is made only for a Pet still in the
//! watch cache.
//!
//! An entry is kept small, since there is one per Pet (measured at N =
//! 5,000: 193 bytes a slot, the largest of the operator's own per-Pet
//! maps): the UID is held as a UUID's 16 bytes, times as 8-byte
//! [`Moment`]s, and what only a failing or drifting Pet needs in a box of
//! its own.

use std::collections::{HashMap, HashSet};
use std::num::{NonZeroI64, NonZeroU64};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::crd::{ConditionStatus, Pet};
use crate::decision::Facts;
use crate::metrics::PetGauges;
use crate::status::{READY, Reason};
use crate::store::Probe;

/// Drift corrections this many times within [`REPEATED_DRIFT_WINDOW`] mark
/// a Pet whose record something else keeps writing.
const REPEATED_DRIFT: usize = 3;
const REPEATED_DRIFT_WINDOW: Duration = Duration::from_secs(3600);

#[derive(Default)]
pub struct Memory {
    pets: Mutex<HashMap<UidKey, Remembered>>,
    /// The watch cache; unset until the controller runs (and in tests).
    cache: OnceLock<Store<Pet>>,
}

#[derive(Clone, Debug, Default, PartialEq)]
struct Remembered {
    /// Consecutive failures.
    failures: u32,
    /// The generation last found in sync, and when.
    synced: Option<Synced>,
    /// Since the Pet's creation or spec change, while it is not Ready.
    not_ready_since: Option<Moment>,
    /// When its next reconcile is due; `None` while one runs, or while it
    /// waits for a change.
    due: Option<Moment>,
    /// `due` is a requeue's (a drift poll's), which the poll sweep hands to
    /// the controller when it comes ([`Memory::take_due_polls`]); false
    /// once handed over, and while `due` is a watch event's, which reaches
    /// the controller by itself.
    poll_pending: bool,
    /// The change feed saw its record drift since its reconcile started:
    /// that reconcile may have read the record before the change, so what
    /// it finds in sync is not remembered as synced.
    drift_suspected: bool,
    /// Only while it backs off, or drifted within the window.
    rare: Option<Box<Rare>>,
    /// The warning reason its status was last given here, and a Warning
    /// Event published for; `None` once it is shown anything else.
    warned: Option<Reason>,
}

/// What few Pets need: a box of its own, not a slot in every entry.
#[derive(Clone, Debug, Default, PartialEq)]
struct Rare {
    /// Its last drift corrections, oldest first.
    drifts: [Option<Moment>; REPEATED_DRIFT],
    /// After a failure: until when it backs off, and the intent
    /// ([`crate::decision::Facts::intent`]) that failed.
    backoff: Option<Backoff>,
    /// While it shows a plan it has not written (changePolicy Approve or
    /// Observe).
    plan: Option<PendingPlan>,
}

/// A plan shown and not written.
#[derive(Clone, Copy, Debug, PartialEq)]
struct PendingPlan {
    /// A hash of the plan's hash: its Event is written once.
    hash: u64,
    /// Since when the Pet has shown a plan, whichever: the oldest-plan gauge.
    since: Moment,
    /// A hash of the stale approval last warned of: warned once.
    stale_warned: Option<u64>,
}

/// What is new about a plan shown: each is told once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PlanNews {
    pub new_plan: bool,
    pub new_stale_approval: bool,
}

impl Remembered {
    fn backoff(&self) -> Option<Backoff> {
        self.rare.as_ref()?.backoff
    }

    fn drifts(&self) -> &[Option<Moment>; REPEATED_DRIFT] {
        const NONE: [Option<Moment>; REPEATED_DRIFT] = [None; REPEATED_DRIFT];
        self.rare.as_ref().map_or(&NONE, |rare| &rare.drifts)
    }

    fn rare(&mut self) -> &mut Rare {
        self.rare.get_or_insert_with(Box::default)
    }

    fn end_backoff(&mut self) {
        if let Some(rare) = &mut self.rare {
            rare.backoff = None;
        }
        self.tidy();
    }

    /// Drops the box once it holds nothing.
    fn tidy(&mut self) {
        if self.rare.as_deref() == Some(&Rare::default()) {
            self.rare = None;
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct Backoff {
    until: Moment,
    intent: u64,
    /// What the store lacked, if that was the failure: the Pet is
    /// released as soon as a probe finds it.
    waits_for: Option<Probe>,
}

/// A generation found in sync (its status written), and when.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Synced {
    /// Non-zero (the API server starts at 1), so `None` costs no space:
    /// the room [`Synced::intent`] takes.
    pub generation: Option<NonZeroI64>,
    /// [`crate::decision::Facts::intent`] as synced: an annotation edit
    /// (external-id, say) changes it without a new generation.
    pub intent: u64,
    pub at: Moment,
    /// A hash of the resourceVersion of the copy synced from, if the status
    /// write replaced it (0 if not, or if it had none): that copy, seen
    /// again, is stale however late its echo comes.
    pub from_version: u32,
    /// A hash of the record ID the status was given: a status that names
    /// another record is not that write's echo.
    pub id: u32,
    /// A hash of the ID the status named before the write: the cache may
    /// still show that copy (after a create, no ID at all), and it is stale,
    /// not a change.
    pub previous_id: u32,
    /// The change feed told of a change to the record since this sync
    /// began: the next reconcile reads the store, even from the write's
    /// echo. What is stale stays stale ([`Synced::decided_from`]): a feed
    /// event of the operator's own write once cleared this sync, and the
    /// stale copy's create was sent again.
    pub store_read_due: bool,
}

impl Synced {
    /// Whether a copy whose status names `status_id` is this write's echo
    /// or the stale copy it replaced, and not someone else's change.
    pub fn explains(&self, status_id: Option<&str>) -> bool {
        let seen = short_hash(status_id);
        seen == self.id || seen == self.previous_id
    }

    /// Whether `pet` is the very copy this sync was decided from, which the
    /// watch cache still holds until the status write's event arrives: a
    /// slow watch (an API server short of CPU) delivers it seconds late.
    pub fn decided_from(&self, pet: &Pet) -> bool {
        self.from_version != 0 && self.from_version == version_hash(pet)
    }
}

/// The hash [`Synced::from_version`] holds (four bytes: one copy of a Pet
/// told from its next few, not from every version there is).
fn version_hash(pet: &Pet) -> u32 {
    pet.metadata
        .resource_version
        .as_deref()
        .map_or(0, |version| short_hash(Some(version)).max(1))
}

/// Four bytes of [`id_hash`]: what [`Synced`] keeps of an ID (one Pet's
/// status ID told from another's, not from every ID there is).
fn short_hash(id: Option<&str>) -> u32 {
    let hash = id_hash(id);
    (hash ^ (hash >> 32)) as u32
}

/// The hash [`Synced::id`] holds: eight bytes per Pet, not the ID.
pub fn id_hash(id: Option<&str>) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::hash::DefaultHasher::new();
    id.hash(&mut hasher);
    hasher.finish()
}

impl Memory {
    /// Checks new entries against this cache from now on (the first call
    /// wins).
    pub fn track(&self, cache: Store<Pet>) {
        let _ = self.cache.set(cache);
    }

    fn pets(&self) -> MutexGuard<'_, HashMap<UidKey, Remembered>> {
        // Entries are plain values; a panic elsewhere cannot corrupt them.
        self.pets.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn synced(&self, uid: &str) -> Option<Synced> {
        self.pets().get(&UidKey::new(uid))?.synced
    }

    pub fn failures(&self, uid: &str) -> u32 {
        self.pets()
            .get(&UidKey::new(uid))
            .map_or(0, |pet| pet.failures)
    }

    /// The Pet's generation, with what the user asked for hashed as
    /// `intent`, was found in sync and its status shows record `id` now:
    /// its failures are over. `written` is the resourceVersion the status
    /// write gave the Pet, if it wrote: when that replaced `pet`, the copy
    /// the sync was decided from, that copy is stale from now on
    /// ([`Synced::decided_from`]); a write that changed nothing leaves it
    /// current. Returns how long the Pet waited to be Ready, if it was
    /// waiting.
    pub fn in_sync(
        &self,
        pet: &Pet,
        uid: &str,
        (generation, intent): (Option<i64>, u64),
        id: &str,
        written: Option<&str>,
    ) -> Option<Duration> {
        let previous_id = short_hash(pet.status_id());
        let replaced = written
            .is_some_and(|version| Some(version) != pet.metadata.resource_version.as_deref());
        let from_version = if replaced { version_hash(pet) } else { 0 };
        let mut waited = None;
        self.update(pet, uid, |remembered| {
            waited = remembered.not_ready_since.take().map(Moment::elapsed);
            remembered.failures = 0;
            if let Some(rare) = &mut remembered.rare {
                rare.plan = None;
            }
            remembered.end_backoff();
            remembered.synced = Some(Synced {
                generation: generation.and_then(NonZeroI64::new),
                intent,
                at: Moment::now(),
                from_version,
                id: short_hash(Some(id)),
                previous_id,
                // Read before a drift the feed has told since: the reconcile
                // queued for it must read the store, not take this for an
                // echo.
                store_read_due: std::mem::take(&mut remembered.drift_suspected),
            });
        });
        waited
    }

    /// A watch event asks to reconcile the Pet: it is due now, and if it
    /// does not show Ready for its generation, it starts waiting to be
    /// Ready (a new Pet since its creation).
    pub fn triggered(&self, pet: &Pet, uid: &str) {
        let now = Instant::now();
        let waiting_since = (!shows_ready(pet)).then(|| Moment::from(waiting_since(pet, now)));
        let now = Moment::from(now);
        self.update(pet, uid, |remembered| {
            if remembered.due.is_none_or(|due| now < due) {
                remembered.due = Some(now);
                remembered.poll_pending = false;
            }
            if remembered.not_ready_since.is_none() {
                remembered.not_ready_since = waiting_since;
            }
        });
    }

    /// Its last failure ([`Memory::failed`]) waits `delay` before the next
    /// attempt, and with `waits_for`, only until a probe finds the store so.
    /// kube's error policy sets this straight after the failed reconcile,
    /// which had the facts to name the intent that failed.
    pub fn backing_off(&self, uid: &str, delay: Duration, waits_for: Option<Probe>) {
        let until = Moment::from(Instant::now() + delay);
        let mut pets = self.pets();
        let backoff = pets
            .get_mut(&UidKey::new(uid))
            .and_then(|remembered| remembered.rare.as_mut()?.backoff.as_mut());
        if let Some(backoff) = backoff {
            backoff.until = until;
            backoff.waits_for = waits_for;
        }
    }

    /// Whether any Pet waits for the store to answer, or to answer with the
    /// extensions.
    pub fn waiting_on_store(&self) -> bool {
        self.pets()
            .values()
            .any(|remembered| remembered.backoff().is_some_and(|b| b.waits_for.is_some()))
    }

    /// The store was found `found`: ends the backoff of every Pet that
    /// waited for that much, and returns them (from the watch cache) to
    /// reconcile now.
    pub fn release_store_waiters(&self, found: Probe) -> Vec<Arc<Pet>> {
        let satisfied = |wanted: Probe| match wanted {
            Probe::Down => false,
            Probe::Answers => found != Probe::Down,
            Probe::Extended => found == Probe::Extended,
        };
        let mut released = HashSet::new();
        for (uid, remembered) in self.pets().iter_mut() {
            if remembered
                .backoff()
                .and_then(|b| b.waits_for)
                .is_some_and(satisfied)
            {
                remembered.end_backoff();
                released.insert(uid.clone());
            }
        }
        let Some(cache) = self.cache.get() else {
            return Vec::new();
        };
        cache
            .state()
            .into_iter()
            .filter(|pet| {
                pet.metadata
                    .uid
                    .as_deref()
                    .is_some_and(|uid| released.contains(&UidKey::new(uid)))
            })
            .collect()
    }

    /// Whether it is backing off from a failure of this same intent: then a
    /// watch event is only the echo of a write, not a reason to try again
    /// before the retry that is already scheduled.
    pub fn backing_off_from(&self, facts: &Facts) -> bool {
        self.backoff_left(facts).is_some()
    }

    /// The rest of its backoff from a failure of this same intent. The
    /// intent is hashed only for a Pet that is backing off.
    pub fn backoff_left(&self, facts: &Facts) -> Option<Duration> {
        let backoff = self.pets().get(&UidKey::new(&facts.uid))?.backoff()?;
        let left = backoff
            .until
            .instant()
            .checked_duration_since(Instant::now())?;
        (!left.is_zero() && backoff.intent == facts.intent()).then_some(left)
    }

    /// The change feed saw its record drift: it is due now, and its
    /// reconcile reads the store however recently it was synced.
    pub fn suspect_drift(&self, pet: &Pet, uid: &str) {
        self.triggered(pet, uid);
        if let Some(remembered) = self.pets().get_mut(&UidKey::new(uid)) {
            if let Some(synced) = &mut remembered.synced {
                synced.store_read_due = true;
            }
            remembered.drift_suspected = true;
        }
    }

    /// Its reconcile started.
    pub fn started(&self, uid: &str) {
        if let Some(remembered) = self.pets().get_mut(&UidKey::new(uid)) {
            remembered.due = None;
            remembered.poll_pending = false;
            remembered.drift_suspected = false;
        }
    }

    /// Its next reconcile is due after `delay` (or sooner, if a watch event
    /// already made it due): [`Memory::take_due_polls`] hands it over then.
    pub fn requeued(&self, pet: &Pet, uid: &str, delay: Duration) {
        self.due_after(pet, uid, delay, true);
    }

    /// It failed and kube retries it after `delay` (its backoff, kept in
    /// kube's scheduler: few Pets fail at once); due then, for the gauges.
    pub fn retrying(&self, pet: &Pet, uid: &str, delay: Duration) {
        self.due_after(pet, uid, delay, false);
    }

    /// Due after `delay` unless due sooner already; `poll_pending` says
    /// whether the sweep hands it over.
    fn due_after(&self, pet: &Pet, uid: &str, delay: Duration, poll_pending: bool) {
        let at = Moment::from(Instant::now() + delay);
        self.update(pet, uid, |remembered| {
            if remembered.due.is_none_or(|due| at < due) {
                remembered.due = Some(at);
                remembered.poll_pending = poll_pending;
            }
        });
    }

    /// The Pets whose requeue has come, each handed over once, from the
    /// watch cache: references with only the name and namespace, as kube
    /// compares them.
    ///
    /// The requeues are kept here rather than in kube's scheduler, which
    /// holds a delay-queue slot, a map slot and two copies of the Pet's
    /// reference for each: at N = 5,000 that was 3.6 MB of a 13.4 MB heap,
    /// where `due` here is 8 bytes already paid for.
    pub fn take_due_polls(&self, now: Instant) -> Vec<ObjectRef<Pet>> {
        let now = Moment::from(now);
        let mut due = HashSet::new();
        for (uid, remembered) in self.pets().iter_mut() {
            if remembered.poll_pending && remembered.due.is_some_and(|at| at <= now) {
                remembered.poll_pending = false;
                due.insert(uid.clone());
            }
        }
        let Some(cache) = self.cache.get().filter(|_| !due.is_empty()) else {
            return Vec::new();
        };
        cache
            .state()
            .iter()
            .filter(|pet| {
                pet.metadata
                    .uid
                    .as_deref()
                    .is_some_and(|uid| due.contains(&UidKey::new(uid)))
            })
            .map(|pet| {
                let meta = &pet.metadata;
                ObjectRef::new(meta.name.as_deref().unwrap_or_default())
                    .within(meta.namespace.as_deref().unwrap_or_default())
            })
            .collect()
    }

    /// Its record was corrected for drift: returns whether that has now
    /// happened [`REPEATED_DRIFT`] times within the window.
    pub fn drift_corrected(&self, pet: &Pet, uid: &str) -> bool {
        let now = Instant::now();
        let mut repeated = false;
        self.update(pet, uid, |remembered| {
            let drifts = &mut remembered.rare().drifts;
            drifts.rotate_left(1);
            drifts[REPEATED_DRIFT - 1] = Some(Moment::from(now));
            repeated = is_repeated(drifts, now);
        });
        repeated
    }

    /// The scrape-time gauges: the due Pets (the work queue), the Pets
    /// waiting to be Ready, and the Pets drifting again and again.
    pub fn gauges(&self) -> PetGauges {
        let now = Instant::now();
        let mut gauges = PetGauges::default();
        for remembered in self.pets().values() {
            if let Some(due) = remembered
                .due
                .map(Moment::instant)
                .filter(|due| *due <= now)
            {
                gauges.queue_depth += 1;
                gauges.queue_oldest_age = gauges.queue_oldest_age.max(now - due);
            }
            if let Some(since) = remembered.not_ready_since.map(Moment::instant) {
                gauges.not_ready += 1;
                gauges.not_ready_oldest = gauges.not_ready_oldest.max(now - since);
            }
            if is_repeated(remembered.drifts(), now) {
                gauges.repeated_drift += 1;
            }
            if let Some(plan) = remembered.rare.as_ref().and_then(|rare| rare.plan) {
                gauges.plans_pending += 1;
                gauges.plan_oldest_age = gauges.plan_oldest_age.max(now - plan.since.instant());
            }
        }
        gauges
    }

    /// The reconcile of this intent ([`crate::decision::Facts::intent`])
    /// failed and is retried: returns the failures in a row. Its backoff
    /// starts now and ends now until [`Memory::backing_off`] gives it its
    /// length.
    pub fn failed(&self, pet: &Pet, uid: &str, intent: u64) -> u32 {
        let mut failures = 1;
        let now = Moment::now();
        self.update(pet, uid, |remembered| {
            remembered.failures = remembered.failures.saturating_add(1);
            remembered.synced = None;
            remembered.rare().backoff = Some(Backoff {
                until: now,
                intent,
                waits_for: None,
            });
            failures = remembered.failures;
        });
        failures
    }

    /// The reconcile had nothing to do: any failures are over.
    pub fn succeeded(&self, uid: &str) {
        let key = UidKey::new(uid);
        let mut pets = self.pets();
        if let Some(remembered) = pets.get_mut(&key) {
            remembered.failures = 0;
            remembered.end_backoff();
            if *remembered == Remembered::default() {
                pets.remove(&key);
            }
        }
    }

    /// Its status was just given `reason` (its Synced reason): returns the
    /// warning it was given before, if this process remembers one.
    ///
    /// The reconcile that follows a write can read a copy from the watch
    /// cache that does not show the write yet: the finalizer's watch event
    /// queues a reconcile that runs as soon as the first one ends, often
    /// before the status write's own event arrives. Judged by that copy, a
    /// Pet held for a warning would get its Warning a second time. What
    /// this process wrote last is newer than any copy the cache holds.
    pub fn shown(&self, pet: &Pet, uid: &str, reason: Reason) -> Option<Reason> {
        let now = reason.is_warning().then_some(reason);
        let mut before = None;
        self.update(pet, uid, |remembered| {
            before = std::mem::replace(&mut remembered.warned, now);
        });
        before
    }

    /// It shows plan `hash` and wrote nothing; `stale` is an approval that
    /// names another plan. Says which of the two it has not told before.
    ///
    /// `pet` is the Pet as read before this plan's status write. A plan it
    /// already showed, with the same hash, was announced by whichever
    /// process wrote it (this one before a restart, or an earlier leader):
    /// it is not new, and it has waited since `status.planPendingSince`.
    pub fn plan_shown(&self, pet: &Pet, uid: &str, hash: &str, stale: Option<&str>) -> PlanNews {
        let status = pet.status.as_ref();
        let shown_before = status.and_then(|s| s.plan.as_ref());
        let announced = shown_before.is_some_and(|plan| plan.hash == hash);
        let shown_since = status
            .and_then(|s| s.plan_pending_since)
            .map(|since| moment_of(since, Instant::now()));
        let (hash, stale) = (id_hash(Some(hash)), stale.map(|s| id_hash(Some(s))));
        let mut news = PlanNews::default();
        self.update(pet, uid, |remembered| {
            let rare = remembered.rare();
            news.new_plan = match rare.plan {
                Some(plan) => plan.hash != hash,
                None => !announced,
            };
            let plan = rare.plan.get_or_insert(PendingPlan {
                hash,
                since: shown_since.unwrap_or_else(Moment::now),
                stale_warned: None,
            });
            plan.hash = hash;
            if stale.is_some() && plan.stale_warned != stale {
                news.new_stale_approval = true;
                plan.stale_warned = stale;
            }
        });
        news
    }

    /// Held until a change or the next poll: neither in sync nor failing,
    /// so all but the warning it was shown and the plan it shows is
    /// forgotten.
    pub fn held(&self, uid: &str) {
        let key = UidKey::new(uid);
        let mut pets = self.pets();
        if let Some(remembered) = pets.get_mut(&key) {
            let plan = remembered.rare.as_ref().and_then(|rare| rare.plan);
            *remembered = Remembered {
                warned: remembered.warned,
                rare: plan.map(|plan| {
                    Box::new(Rare {
                        plan: Some(plan),
                        ..Rare::default()
                    })
                }),
                ..Remembered::default()
            };
            if *remembered == Remembered::default() {
                pets.remove(&key);
            }
        }
    }

    /// The Pet is gone or let go: nothing to remember.
    pub fn forget(&self, uid: &str) {
        self.pets().remove(&UidKey::new(uid));
    }

    /// After a relist: forgets every Pet the cache no longer holds (deleted
    /// while the watch was down, so never reported deleted).
    pub fn forget_all_but_cached(&self) {
        let Some(cache) = self.cache.get() else {
            return;
        };
        if self.pets().is_empty() {
            return;
        }
        let live: HashSet<UidKey> = cache
            .state()
            .iter()
            .filter_map(|pet| pet.metadata.uid.as_deref().map(UidKey::new))
            .collect();
        self.pets().retain(|uid, _| live.contains(uid));
    }

    /// As if its backoff were over: what it waited for (a store's setup)
    /// changed.
    pub fn end_backoff(&self, uid: &str) {
        if let Some(remembered) = self.pets().get_mut(&UidKey::new(uid)) {
            remembered.end_backoff();
        }
    }

    /// When its requeue is due, if one waits for the poll sweep.
    #[cfg(test)]
    pub fn poll_due(&self, uid: &str) -> Option<Instant> {
        let pets = self.pets();
        let remembered = pets.get(&UidKey::new(uid))?;
        remembered
            .poll_pending
            .then_some(remembered.due?)
            .map(Moment::instant)
    }

    /// How many Pets are remembered.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.pets().len()
    }

    fn update(&self, pet: &Pet, uid: &str, change: impl FnOnce(&mut Remembered)) {
        let key = UidKey::new(uid);
        let mut pets = self.pets();
        if let Some(remembered) = pets.get_mut(&key) {
            change(remembered);
            remembered.tidy();
            if *remembered == Remembered::default() {
                pets.remove(&key);
            }
            return;
        }
        let mut remembered = Remembered::default();
        change(&mut remembered);
        remembered.tidy();
        // Under the lock: the watch removes a deleted Pet from the cache
        // before it forgets the Pet, so either this sees it gone or the
        // forgetting comes after.
        if remembered != Remembered::default() && self.is_cached(pet) {
            pets.insert(key, remembered);
        }
    }

    /// Whether the watch cache still holds this Pet (true without a cache).
    fn is_cached(&self, pet: &Pet) -> bool {
        let Some(cache) = self.cache.get() else {
            return true;
        };
        let meta = &pet.metadata;
        let key = ObjectRef::new(meta.name.as_deref().unwrap_or_default())
            .within(meta.namespace.as_deref().unwrap_or_default());
        cache
            .get(&key)
            .is_some_and(|cached| cached.metadata.uid == meta.uid)
    }
}

/// The Pet shows Ready=True for its current generation.
fn shows_ready(pet: &Pet) -> bool {
    let observed = pet.status.as_ref().and_then(|s| s.observed_generation);
    observed == pet.metadata.generation
        && pet
            .condition(READY)
            .is_some_and(|c| c.status == ConditionStatus::True)
}

/// The moment a wall-clock time of the status names, by its age now; a
/// time in the future (clock skew) is now.
fn moment_of(at: chrono::DateTime<chrono::Utc>, now: Instant) -> Moment {
    let age = (chrono::Utc::now() - at).to_std().unwrap_or_default();
    Moment::from(now.checked_sub(age).unwrap_or(now))
}

/// A Pet never reconciled has waited since its creation; any other since
/// now, when its change is seen.
fn waiting_since(pet: &Pet, now: Instant) -> Instant {
    let created = pet
        .metadata
        .creation_timestamp
        .as_ref()
        .filter(|_| pet.status.is_none());
    created
        .and_then(|created| Duration::try_from(Timestamp::now().duration_since(created.0)).ok())
        .and_then(|age| now.checked_sub(age))
        .unwrap_or(now)
}

fn is_repeated(drifts: &[Option<Moment>; REPEATED_DRIFT], now: Instant) -> bool {
    drifts[0].is_some_and(|oldest| now.duration_since(oldest.instant()) < REPEATED_DRIFT_WINDOW)
}

/// A Pet's UID as the key of its entry: the API server's UIDs are UUIDs,
/// held as their 16 bytes rather than 36 characters on the heap; any other
/// text (a test's, say) as it is. Only the lowercase form a UUID is
/// written in by the API server parses, so two keys are equal exactly when
/// their texts are.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum UidKey {
    Uuid([u8; 16]),
    Text(Box<str>),
}

impl UidKey {
    fn new(uid: &str) -> Self {
        parse_uuid(uid).map_or_else(|| Self::Text(uid.into()), Self::Uuid)
    }
}

/// The 16 bytes of a UUID written `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`
/// in lowercase hexadecimal.
fn parse_uuid(text: &str) -> Option<[u8; 16]> {
    let text = text.as_bytes();
    if text.len() != 36 {
        return None;
    }
    let mut bytes = [0u8; 16];
    let mut nibble = 0;
    for (i, &c) in text.iter().enumerate() {
        if matches!(i, 8 | 13 | 18 | 23) {
            if c != b'-' {
                return None;
            }
            continue;
        }
        let value = match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            _ => return None,
        };
        bytes[nibble / 2] |= if nibble % 2 == 0 { value << 4 } else { value };
        nibble += 1;
    }
    Some(bytes)
}

/// A point in time in 8 bytes, where an `Instant` takes 16: nanoseconds
/// from a process-wide origin, offset so that any moment within a century
/// either side of it is positive (and `Option<Moment>` is 8 bytes too).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Moment(NonZeroU64);

/// 2^62 ns, about 146 years.
const MOMENT_OFFSET: u64 = 1 << 62;

impl Moment {
    fn origin() -> Instant {
        static ORIGIN: OnceLock<Instant> = OnceLock::new();
        *ORIGIN.get_or_init(Instant::now)
    }

    pub fn now() -> Self {
        Self::from(Instant::now())
    }

    pub fn instant(self) -> Instant {
        let origin = Self::origin();
        let nanos = self.0.get();
        if nanos >= MOMENT_OFFSET {
            origin + Duration::from_nanos(nanos - MOMENT_OFFSET)
        } else {
            let before = Duration::from_nanos(MOMENT_OFFSET - nanos);
            origin.checked_sub(before).unwrap_or(origin)
        }
    }

    pub fn elapsed(self) -> Duration {
        self.instant().elapsed()
    }
}

impl From<Instant> for Moment {
    fn from(at: Instant) -> Self {
        let origin = Self::origin();
        let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let value = match at.checked_duration_since(origin) {
            Some(after) => MOMENT_OFFSET.saturating_add(nanos(after)),
            None => MOMENT_OFFSET.saturating_sub(nanos(origin.duration_since(at))),
        };
        Self(NonZeroU64::new(value).unwrap_or(NonZeroU64::MIN))
    }
}

#[cfg(test)]
mod tests {
    use kube::runtime::{reflector, watcher};

    use super::*;

    /// A Pet of its own name and UID.
    fn pet(uid: &str) -> Pet {
        let mut pet = Pet::test().with_uid(uid);
        pet.metadata.name = Some(format!("pet-{uid}"));
        pet
    }

    /// A memory that tracks a watch cache holding `pets`, and the cache's
    /// writer.
    fn tracking(pets: &[&Pet]) -> (Memory, reflector::store::Writer<Pet>) {
        let memory = Memory::default();
        let (cache, mut writer) = reflector::store();
        memory.track(cache);
        for pet in pets {
            writer.apply_watcher_event(&watcher::Event::Apply((*pet).clone()));
        }
        (memory, writer)
    }

    #[test]
    fn one_entry_per_pet_only_while_there_is_something_to_remember() {
        let memory = Memory::default();
        let thor = pet("thor");
        assert_eq!(memory.failed(&thor, "thor", 0), 1);
        assert_eq!(memory.failed(&thor, "thor", 0), 2);
        assert_eq!(memory.failures("thor"), 2);
        memory.in_sync(&thor, "thor", (Some(3), 0), "record-1", None);
        assert_eq!(memory.failures("thor"), 0, "a sync ends the failures");
        assert_eq!(
            memory.synced("thor").map(|s| s.generation),
            Some(NonZeroI64::new(3))
        );
        memory.succeeded("thor");
        assert!(
            memory.synced("thor").is_some(),
            "nothing to do keeps the sync"
        );
        memory.failed(&thor, "thor", 0);
        assert_eq!(memory.synced("thor"), None, "a failure ends the sync");
        memory.forget("thor");
        assert_eq!(memory.len(), 0);
        memory.failed(&thor, "thor", 0);
        memory.succeeded("thor");
        assert_eq!(memory.len(), 0, "nothing left to remember");
    }

    #[test]
    fn a_sync_explains_its_echo_and_the_stale_copy_but_not_another_record() {
        let memory = Memory::default();
        // Created: the copy reconciled had no ID, the status now names r-1.
        memory.in_sync(&pet("thor"), "thor", (Some(1), 0), "r-1", None);
        let synced = memory.synced("thor").expect("remembered");
        assert!(synced.explains(Some("r-1")), "the echo of the write");
        assert!(synced.explains(None), "the stale copy from before it");
        assert!(!synced.explains(Some("r-2")), "someone else's status");
        // Synced again from a copy naming r-1: a copy without an ID is now
        // someone's change, not stale.
        memory.in_sync(
            &pet("thor").with_status_id("r-1"),
            "thor",
            (Some(2), 0),
            "r-1",
            None,
        );
        let synced = memory.synced("thor").expect("remembered");
        assert!(synced.explains(Some("r-1")));
        assert!(!synced.explains(None));
    }

    #[test]
    fn a_pet_that_went_is_not_remembered_again() {
        let thor = pet("thor");
        let (memory, mut writer) = tracking(&[&thor]);
        memory.failed(&thor, "thor", 0);
        assert_eq!(memory.len(), 1);

        // Deleted while a reconcile was in flight: the watch removes it from
        // the cache and forgets it, and the reconcile ends after.
        writer.apply_watcher_event(&watcher::Event::Delete(thor.clone()));
        memory.forget("thor");
        memory.failed(&thor, "thor", 0);
        memory.in_sync(&thor, "thor", (Some(1), 0), "record-1", None);
        assert_eq!(memory.len(), 0);
    }

    #[test]
    fn a_relist_forgets_the_pets_deleted_while_the_watch_was_down() {
        let (thor, loki) = (pet("thor"), pet("loki"));
        let (memory, mut writer) = tracking(&[&thor, &loki]);
        for pet in [&thor, &loki] {
            memory.failed(pet, pet.metadata.uid.as_deref().expect("uid"), 0);
        }
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitApply(loki.clone()));
        writer.apply_watcher_event(&watcher::Event::InitDone);
        memory.forget_all_but_cached();
        assert_eq!(memory.failures("thor"), 0);
        assert_eq!(memory.failures("loki"), 1);
        assert_eq!(memory.len(), 1);
    }

    #[test]
    fn the_queue_gauges_count_only_the_pets_that_are_due() {
        let memory = Memory::default();
        let (thor, loki) = (pet("thor"), pet("loki"));
        memory.triggered(&thor, "thor");
        memory.requeued(&loki, "loki", Duration::from_secs(300));
        let gauges = memory.gauges();
        assert_eq!(gauges.queue_depth, 1, "loki is due only in 5 minutes");
        memory.started("thor");
        assert_eq!(memory.gauges().queue_depth, 0);
        // A watch event during a requeue's wait makes it due at once.
        memory.triggered(&loki, "loki");
        assert_eq!(memory.gauges().queue_depth, 1);
    }

    /// The feed tells of a drift while a reconcile that read the record
    /// before it is still running: that reconcile's in-sync is remembered
    /// as owing a read, so the one queued for the drift reads the store;
    /// the copy it replaced stays stale.
    #[test]
    fn a_drift_told_while_a_reconcile_runs_is_not_covered_by_its_in_sync() {
        let thor = pet("thor");
        let (memory, _writer) = tracking(&[&thor]);
        memory.triggered(&thor, "thor");

        memory.started("thor");
        memory.suspect_drift(&thor, "thor");
        memory.in_sync(&thor, "thor", (Some(1), 0), "r", Some("2"));
        let synced = memory.synced("thor").expect("remembered");
        assert!(synced.store_read_due, "the drift's reconcile must read");
        assert!(synced.decided_from(&thor), "its copy is stale all the same");

        // Told after the sync, before the watch event of its write: the same.
        memory.started("thor");
        memory.in_sync(&thor, "thor", (Some(1), 0), "r", Some("2"));
        assert!(!memory.synced("thor").expect("remembered").store_read_due);
        memory.suspect_drift(&thor, "thor");
        let synced = memory.synced("thor").expect("remembered");
        assert!(synced.store_read_due && synced.decided_from(&thor));

        // That reconcile starts after the drift: what it finds is remembered.
        memory.started("thor");
        memory.in_sync(&thor, "thor", (Some(1), 0), "r", None);
        assert!(!memory.synced("thor").expect("remembered").store_read_due);
    }

    #[test]
    fn a_due_poll_is_handed_over_once_and_a_watch_event_is_left_to_kube() {
        let (thor, loki, odin) = (pet("thor"), pet("loki"), pet("odin"));
        let (memory, mut writer) = tracking(&[&thor, &loki, &odin]);
        memory.requeued(&thor, "thor", Duration::ZERO);
        memory.requeued(&loki, "loki", Duration::from_secs(300));
        // A watch event reaches kube by itself; its poll is not handed over.
        memory.requeued(&odin, "odin", Duration::from_secs(300));
        memory.triggered(&odin, "odin");
        let now = Instant::now();
        let names = |refs: Vec<ObjectRef<Pet>>| -> Vec<String> {
            refs.into_iter().map(|r| r.name).collect()
        };
        assert_eq!(names(memory.take_due_polls(now)), ["pet-thor"]);
        assert!(memory.take_due_polls(now).is_empty(), "handed over once");
        assert_eq!(memory.gauges().queue_depth, 2, "thor and odin wait to run");
        let later = now + Duration::from_secs(301);
        assert_eq!(names(memory.take_due_polls(later)), ["pet-loki"]);
        // Its reconcile starts and requeues it: due again, handed over again.
        memory.started("loki");
        memory.requeued(&loki, "loki", Duration::ZERO);
        assert_eq!(names(memory.take_due_polls(later)), ["pet-loki"]);
        // A Pet the cache no longer holds is not handed over.
        memory.started("thor");
        memory.requeued(&thor, "thor", Duration::ZERO);
        writer.apply_watcher_event(&watcher::Event::Delete(thor.clone()));
        assert!(memory.take_due_polls(later).is_empty());
        let first = ObjectRef::<Pet>::new("pet-loki").within("default");
        assert_eq!(first.extra.uid, None, "a reference without its UID");
    }

    #[test]
    fn a_pet_waits_to_be_ready_from_its_trigger_until_in_sync() {
        let memory = Memory::default();
        let thor = pet("thor");
        memory.triggered(&thor, "thor");
        assert_eq!(memory.gauges().not_ready, 1);
        let waited = memory.in_sync(&thor, "thor", (Some(1), 0), "record-1", None);
        assert!(
            waited.is_some_and(|w| w < Duration::from_secs(5)),
            "{waited:?}"
        );
        assert_eq!(memory.gauges().not_ready, 0);
        assert_eq!(
            memory.in_sync(&thor, "thor", (Some(1), 0), "record-1", None),
            None,
            "told once"
        );
        // A Pet that shows Ready for its generation is not waiting.
        let ready = pet("loki").ready("r-1");
        memory.triggered(&ready, "loki");
        assert_eq!(memory.gauges().not_ready, 0);
    }

    #[test]
    fn a_new_pet_has_waited_since_its_creation() {
        let mut thor = pet("thor");
        let created = Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(30);
        thor.metadata.creation_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(created),
        );
        let memory = Memory::default();
        memory.triggered(&thor, "thor");
        let oldest = memory.gauges().not_ready_oldest;
        assert!(oldest >= Duration::from_secs(29), "{oldest:?}");
    }

    #[test]
    fn the_warning_shown_outlasts_a_hold_and_ends_with_any_other_reason() {
        let memory = Memory::default();
        let thor = pet("thor");
        assert_eq!(memory.shown(&thor, "thor", Reason::RecordNotFound), None);
        memory.held("thor");
        assert_eq!(
            memory.shown(&thor, "thor", Reason::RecordNotFound),
            Some(Reason::RecordNotFound),
            "kept through the hold"
        );
        assert_eq!(
            memory.shown(&thor, "thor", Reason::ReconcileSuccess),
            Some(Reason::RecordNotFound)
        );
        assert_eq!(memory.shown(&thor, "thor", Reason::RecordNotFound), None);
        memory.forget("thor");
        memory.shown(&thor, "thor", Reason::ReconcileSuccess);
        memory.held("thor");
        assert_eq!(memory.len(), 0, "nothing left to remember");
    }

    #[test]
    fn an_entry_stays_small() {
        // One per Pet: at N = 20,000 each byte of a slot is about 32 KiB.
        let slot = std::mem::size_of::<(UidKey, Remembered)>();
        assert!(slot <= 96, "{slot} bytes");
    }

    #[test]
    fn a_uuid_key_is_its_bytes_and_any_other_uid_its_text() {
        let uid = "0f8e3a52-9b1c-4d7e-a6f0-123456789abc";
        assert_eq!(
            UidKey::new(uid),
            UidKey::Uuid([
                0x0f, 0x8e, 0x3a, 0x52, 0x9b, 0x1c, 0x4d, 0x7e, 0xa6, 0xf0, 0x12, 0x34, 0x56, 0x78,
                0x9a, 0xbc
            ])
        );
        // Not the API server's form: kept as written, so never equal to it.
        for other in [
            "0F8E3A52-9B1C-4D7E-A6F0-123456789ABC",
            "0f8e3a529b1c4d7ea6f0123456789abc",
            "0f8e3a52-9b1c-4d7e-a6f0-123456789abg",
            "0f8e3a52+9b1c-4d7e-a6f0-123456789abc",
            "thor",
        ] {
            assert_eq!(UidKey::new(other), UidKey::Text(other.into()), "{other}");
        }
    }

    #[test]
    fn a_moment_is_the_instant_it_was_made_from() {
        let now = Instant::now();
        for at in [
            now,
            now + Duration::from_secs(3600),
            now.checked_sub(Duration::from_secs(60)).unwrap_or(now),
        ] {
            assert_eq!(Moment::from(at).instant(), at);
        }
        let (earlier, later) = (
            Moment::from(now),
            Moment::from(now + Duration::from_nanos(1)),
        );
        assert!(earlier < later);
    }

    /// A failure holds nothing back until the error policy gives its
    /// backoff a length; then it holds back the intent that failed, and
    /// only that one.
    #[test]
    fn a_failures_backoff_holds_its_intent_once_given_a_length() {
        let memory = Memory::default();
        let thor = pet("thor");
        let facts = crate::controller::facts_of(&thor, "").expect("facts");
        memory.failed(&thor, "thor", facts.intent());
        assert_eq!(memory.backoff_left(&facts), None, "no length yet");
        assert!(!memory.waiting_on_store());
        memory.backing_off("thor", Duration::from_secs(60), Some(Probe::Answers));
        let left = memory.backoff_left(&facts).expect("backing off");
        assert!(left <= Duration::from_secs(60), "{left:?}");
        assert!(memory.waiting_on_store());
        let mut renamed = thor.clone();
        renamed.spec.name = "Thorbert".into();
        let other = crate::controller::facts_of(&renamed, "").expect("facts");
        assert_eq!(memory.backoff_left(&other), None, "another intent");
        // Without a failure counted there is no backoff to give a length.
        memory.backing_off("loki", Duration::from_secs(60), None);
        assert_eq!(memory.len(), 1);
    }

    #[test]
    fn the_box_for_rare_things_goes_when_they_do() {
        let memory = Memory::default();
        let thor = pet("thor");
        memory.failed(&thor, "thor", 7);
        memory.backing_off("thor", Duration::from_secs(60), None);
        assert!(memory.pets().values().all(|r| r.rare.is_some()));
        memory.succeeded("thor");
        assert_eq!(memory.len(), 0, "nothing left to remember");
        memory.drift_corrected(&thor, "thor");
        memory.in_sync(&thor, "thor", (Some(1), 0), "record-1", None);
        assert!(
            memory.pets().values().all(|r| r.rare.is_some()),
            "the drift is kept for the window"
        );
    }

    #[test]
    fn the_third_drift_within_an_hour_marks_the_pet() {
        let memory = Memory::default();
        let thor = pet("thor");
        assert!(!memory.drift_corrected(&thor, "thor"));
        assert!(!memory.drift_corrected(&thor, "thor"));
        assert!(memory.drift_corrected(&thor, "thor"));
        assert_eq!(memory.gauges().repeated_drift, 1);
        memory.forget("thor");
        assert_eq!(memory.gauges().repeated_drift, 0);
    }

    /// A Pet whose status shows plan `hash`, pending for `age`: as a
    /// restarted operator, or a new leader, first reads it.
    fn showing(uid: &str, hash: &str, age: Duration) -> Pet {
        let mut pet = pet(uid).showing_plan();
        let status = pet.status.as_mut().expect("showing_plan shows one");
        if let Some(plan) = status.plan.as_mut() {
            plan.hash = hash.into();
        }
        let age = chrono::Duration::from_std(age).expect("a small age");
        status.plan_pending_since = Some(chrono::Utc::now() - age);
        pet
    }

    #[test]
    fn a_plan_shown_before_a_restart_is_not_announced_again_and_keeps_its_age() {
        let memory = Memory::default();
        let age = Duration::from_secs(300);
        let rex = showing("rex", "aaaa", age);
        assert!(!memory.plan_shown(&rex, "rex", "aaaa", None).new_plan);
        let gauges = memory.gauges();
        assert_eq!(gauges.plans_pending, 1);
        assert!(
            gauges.plan_oldest_age >= age && gauges.plan_oldest_age < age * 2,
            "{:?}",
            gauges.plan_oldest_age
        );
        // Another plan is news, but the Pet has waited since the first.
        assert!(memory.plan_shown(&rex, "rex", "bbbb", None).new_plan);
        assert!(memory.gauges().plan_oldest_age >= age);
    }

    #[test]
    fn a_plan_is_announced_once_and_a_changed_plan_again() {
        let memory = Memory::default();
        let thor = pet("thor");
        assert!(memory.plan_shown(&thor, "thor", "aaaa", None).new_plan);
        assert!(!memory.plan_shown(&thor, "thor", "aaaa", None).new_plan);
        assert!(memory.plan_shown(&thor, "thor", "bbbb", None).new_plan);
        // Restarted after the plan changed: the status shows the old one.
        let fido = showing("fido", "aaaa", Duration::from_secs(5));
        assert!(memory.plan_shown(&fido, "fido", "cccc", None).new_plan);
    }
}
