//! Drift found from the stores' change feeds instead of polling.
//!
//! The leader follows the feed of every store in use: the operator's own
//! (`--petstore-addr`), and each `PetStore` and `ClusterPetStore` open
//! because a Pet uses it, started when the store opens and stopped when it
//! closes. A change to a Pet's record that leaves it unlike the Pet (an
//! out-of-band update, key change or delete) queues that Pet at once, and
//! its reconcile reads the store and corrects the record. The operator's
//! own writes come back on the feed too, and match their Pets, so they
//! queue nothing. The per-Pet poll of that store's Pets then only audits,
//! at `--audit-interval`.
//!
//! One feed is followed per store server, not per store object: the open
//! objects naming one endpoint with one audience share it
//! ([`crate::stores::FeedSource`]), and a change on it is judged against
//! the Pets whose `status.store` names any of them. Record IDs are the
//! server's, so they are unique across those objects. A change concerns
//! only the Pets of its feed's objects: an ID two servers share never
//! crosses from one to the other. Objects join and leave a running feed as
//! they open and close, without restarting it: a member that joins has
//! its synced Pets read once (the feed is new to them), as has one that
//! leaves.
//!
//! A store with tenancy shows a tenant only its own records, so another
//! store's feed is read with a token of the operator's own ServiceAccount,
//! which the store must name an observer (`--observer`). A store that
//! takes the operator for a tenant, or refuses its token, is told of once
//! in the log, polled, and asked again every minute.
//!
//! Each feed is on its own: one that breaks is resumed from the last
//! revision seen. One that cannot be resumed (the store compacted that
//! history, or restarted without it) is watched again from now, and every
//! Pet of its store objects already synced is read once more, so no
//! change in the gap is missed. A store without the feed (the book's) is polled
//! as before, and told once in the log. Whatever one store's feed does,
//! the other stores' Pets keep their schedule.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures::StreamExt as _;
use futures::channel::mpsc::UnboundedSender;
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::watch;
use tokio::task::JoinHandle;
// Tokio's clock: the index's age and the retry of missed changes share one.
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::Context;
use super::context::{on_store, store_of};
use crate::crd::Pet;
use crate::decision::feed::{Verdict, verdict};
use crate::store::{Feed, PetStore, RecordChange, StoreError};
use crate::stores::{FeedSource, Feeds, StoreId};

/// How long to wait before asking a store without a feed again: it may be
/// replaced by one with it (the book's store by ours) at the same address.
/// A store that does not take the operator as its observer is asked again
/// as often: it may be restarted with `--observer`.
const FEED_RECHECK: Duration = Duration::from_secs(60);
/// First and longest wait before reconnecting a broken feed.
const RECONNECT_FIRST: Duration = Duration::from_millis(200);
const RECONNECT_MAX: Duration = Duration::from_secs(10);
/// The Pet index is rebuilt (a pass over every cached Pet) at most this
/// often. Rebuilding it for every batch made drift at N = 20,000 wait
/// about 40 s behind a thousand one-change batches. A change whose Pet the
/// index misses (a Pet newer than the index) waits for the next rebuild,
/// at most this long, and is judged again then.
const INDEX_REFRESH: Duration = Duration::from_secs(1);
/// How often the stores that have Pets are kept open: their Pets are only
/// audited while the feed is followed, and a store closes after 10 minutes
/// without a call.
const KEEP_OPEN_EVERY: Duration = Duration::from_secs(60);

/// The Pets a batch of changes may concern, found by the record's key (the
/// owner's UID) or by the ID in their status, else in their external-id
/// annotation (a record watched by a Pet in Observe is not keyed to it).
/// A record's identity names its Pet directly: the cache finds that one.
/// One index holds the Pets of one feed's store objects.
pub struct PetIndex {
    by_uid: HashMap<String, Arc<Pet>>,
    by_record: HashMap<String, Arc<Pet>>,
}

impl PetIndex {
    pub fn new(pets: impl IntoIterator<Item = Arc<Pet>>) -> Self {
        let mut by_uid = HashMap::new();
        let mut by_record = HashMap::new();
        for pet in pets {
            if let Some(id) = pet.status_id().or_else(|| pet.external_id()) {
                by_record.insert(id.to_owned(), Arc::clone(&pet));
            }
            if let Some(uid) = pet.uid() {
                by_uid.insert(uid, pet);
            }
        }
        Self { by_uid, by_record }
    }

    /// The index of the Pets of any of `stores` among `pets`.
    fn of_stores(pets: impl IntoIterator<Item = Arc<Pet>>, stores: &BTreeSet<StoreId>) -> Self {
        Self::new(pets.into_iter().filter(|pet| on_any(pet, stores)))
    }

    /// Whether `change` concerns `pet`, as [`PetIndex::pet_for`] finds it.
    pub fn concerns(pet: &Pet, change: &RecordChange) -> bool {
        let owner = change.record.as_ref().is_some_and(|record| {
            record
                .key
                .pet_uid()
                .is_some_and(|uid| pet.uid().as_deref() == Some(uid))
        });
        let named = !change.identity.is_empty() && change.identity == pet.identity();
        owner || named || pet.status_id().or_else(|| pet.external_id()) == Some(change.id.as_str())
    }

    /// The Pet the change concerns: the record's owner, else the Pet whose
    /// status (or external-id annotation) names the record.
    pub fn pet_for(&self, change: &RecordChange) -> Option<&Arc<Pet>> {
        change
            .record
            .as_ref()
            .and_then(|record| record.key.pet_uid())
            .and_then(|uid| self.by_uid.get(uid))
            .or_else(|| self.by_record.get(&change.id))
    }
}

/// Follows the feed of every store in use until `stop`: the operator's own,
/// and one per source of the other stores `feeds` holds open
/// ([`crate::stores::Stores::feeds`]), for its store objects as they join
/// and leave, queueing the Pets whose records drifted on `reconcile`.
pub async fn follow_stores(
    ctx: Arc<Context>,
    mut feeds: watch::Receiver<Feeds>,
    cache: Store<Pet>,
    reconcile: UnboundedSender<ObjectRef<Pet>>,
    stop: CancellationToken,
) {
    let own = tokio::spawn(follow(
        Arc::clone(&ctx),
        StoreId::Own,
        Arc::clone(&ctx.store),
        cache.clone(),
        reconcile.clone(),
        stop.child_token(),
    ));
    let mut followers: HashMap<FeedSource, Following> = HashMap::new();
    let mut keep_open = tokio::time::interval(KEEP_OPEN_EVERY);
    loop {
        let open = feeds.borrow_and_update().clone();
        // The members whose feed is new to them, or gone: their Pets were
        // only audited, or were synced before this feed was followed for
        // them. A member that moved (its spec changed) is read once.
        let mut read_again: BTreeSet<StoreId> = BTreeSet::new();
        // A group with a new client was emptied and made anew: each of its
        // members joined since, so its feed starts anew too.
        let gone: Vec<FeedSource> = followers
            .iter()
            .filter(|(source, following)| {
                open.get(*source)
                    .is_none_or(|group| !Arc::ptr_eq(&group.client, &following.client))
            })
            .map(|(source, _)| source.clone())
            .collect();
        for source in gone {
            if let Some(following) = followers.remove(&source) {
                read_again.extend(following.members().iter().cloned());
                following.stop().await;
            }
        }
        // Every member leaves first, so one that moves between feeds is
        // live only in its new one.
        for (source, following) in &followers {
            if let Some(group) = open.get(source) {
                read_again.extend(following.group.lock().retain(&ctx, &group.members));
            }
        }
        for (source, group) in open {
            match followers.get(&source) {
                // Joined in place: the feed goes on from where it is.
                Some(following) => {
                    read_again.extend(following.group.lock().join(&ctx, &group.members));
                }
                // A new feed: its members' synced Pets are read once it is
                // followed, from now.
                None => {
                    let shared = Shared::new(&ctx, group.members.clone());
                    let stop = stop.child_token();
                    let task = tokio::spawn(follow_group(
                        Arc::clone(&ctx),
                        Arc::clone(&shared),
                        Arc::clone(&group.client),
                        cache.clone(),
                        reconcile.clone(),
                        stop.clone(),
                    ));
                    followers.insert(
                        source,
                        Following {
                            group: shared,
                            client: group.client,
                            stop,
                            task,
                        },
                    );
                }
            }
        }
        if !read_again.is_empty() {
            reread_synced(&ctx, &cache, &reconcile, &read_again);
        }
        tokio::select! {
            () = stop.cancelled() => break,
            changed = feeds.changed() => {
                if changed.is_err() {
                    // The stores are gone: only the stop is left to wait for.
                    stop.cancelled().await;
                    break;
                }
            }
            _ = keep_open.tick() => ctx.stores.keep_open(&stores_with_pets(&cache)),
        }
    }
    for following in followers.into_values() {
        following.stop().await;
    }
    let _ = own.await;
}

/// The store objects one feed is followed for, and the feed's state, which
/// each member's poll and its count in `change_feed_stores` follow. Changed
/// by [`follow_stores`] as members join and leave, and by the follower as
/// the feed's state moves, under one lock: a member's live flag is never
/// set after it left.
struct Group {
    /// Replaced, not changed, on each join or leave: the follower's index
    /// is of one set of members.
    members: Arc<BTreeSet<StoreId>>,
    state: State,
    /// The operator's own store: not counted in `change_feed_stores`.
    own: bool,
}

/// A group shared by its follower and [`follow_stores`].
struct Shared(Mutex<Group>);

impl Shared {
    /// A feed not followed yet, counted as connecting for each member from
    /// here: before a leave can uncount one.
    fn new(ctx: &Context, members: BTreeSet<StoreId>) -> Arc<Self> {
        let own = members.contains(&StoreId::Own);
        let group = Group {
            members: Arc::new(members),
            state: State::Starting,
            own,
        };
        for id in group.members.iter() {
            group.count(ctx, id, None, Some(State::Starting));
        }
        Arc::new(Self(Mutex::new(group)))
    }

    fn lock(&self) -> MutexGuard<'_, Group> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Group {
    /// Keeps only the members in `members`; returns those that left, whose
    /// poll no longer waits for this feed.
    fn retain(&mut self, ctx: &Context, members: &BTreeSet<StoreId>) -> Vec<StoreId> {
        let left: Vec<StoreId> = self.members.difference(members).cloned().collect();
        if left.is_empty() {
            return left;
        }
        for id in &left {
            self.count(ctx, id, Some(self.state), None);
            ctx.poll.set_feed_live(id, false);
        }
        self.members = Arc::new(self.members.intersection(members).cloned().collect());
        left
    }

    /// Adds the members of `members` it lacks; returns those that joined,
    /// whose poll waits for this feed if it is live.
    fn join(&mut self, ctx: &Context, members: &BTreeSet<StoreId>) -> Vec<StoreId> {
        let joined: Vec<StoreId> = members.difference(&self.members).cloned().collect();
        if joined.is_empty() {
            return joined;
        }
        for id in &joined {
            self.count(ctx, id, None, Some(self.state));
            if self.state == State::Live {
                ctx.poll.set_feed_live(id, true);
            }
        }
        self.members = Arc::new(self.members.union(members).cloned().collect());
        joined
    }

    /// The feed moved to `state`: each member's poll and count follow.
    fn move_to(&mut self, ctx: &Context, state: State) {
        let live = state == State::Live;
        if self.state == state {
            return;
        }
        for id in self.members.iter() {
            self.count(ctx, id, Some(self.state), Some(state));
            ctx.poll.set_feed_live(id, live);
        }
        if self.own {
            ctx.metrics.set_feed_connected(live);
        }
        self.state = state;
    }

    /// The follower stopped: no member's poll waits for it, and none is
    /// counted.
    fn stopped(&mut self, ctx: &Context) {
        for id in self.members.iter() {
            self.count(ctx, id, Some(self.state), None);
            ctx.poll.set_feed_live(id, false);
        }
        if self.own {
            ctx.metrics.set_feed_connected(false);
        }
        self.members = Arc::default();
    }

    /// `change_feed_stores` counts the other store objects by the state of
    /// the feed they read; the own store's is `change_feed_connected`.
    fn count(&self, ctx: &Context, id: &StoreId, from: Option<State>, to: Option<State>) {
        if *id != StoreId::Own {
            ctx.metrics
                .store_feed_moved(from.map(State::as_str), to.map(State::as_str));
        }
    }
}

/// One feed source's follower.
struct Following {
    group: Arc<Shared>,
    /// The client it reads the feed with.
    client: Arc<dyn PetStore>,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Following {
    fn members(&self) -> Arc<BTreeSet<StoreId>> {
        Arc::clone(&self.group.lock().members)
    }

    /// Stops it, and waits until it has let go of its members' live flags.
    async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

/// The other stores (`PetStore`, `ClusterPetStore`) that hold Pets'
/// records.
fn stores_with_pets(cache: &Store<Pet>) -> HashSet<StoreId> {
    cache
        .state()
        .iter()
        .filter_map(|pet| store_of(pet))
        .filter(|store| *store != StoreId::Own)
        .collect()
}

/// Follows the feed of `store`, read with `client`, until `stop`, queueing
/// the Pets of that store whose records drifted on `reconcile`.
pub async fn follow(
    ctx: Arc<Context>,
    store: StoreId,
    client: Arc<dyn PetStore>,
    cache: Store<Pet>,
    reconcile: UnboundedSender<ObjectRef<Pet>>,
    stop: CancellationToken,
) {
    let group = Shared::new(&ctx, BTreeSet::from([store]));
    follow_group(ctx, group, client, cache, reconcile, stop).await;
}

/// Follows one feed, read with `client`, for the members of `group` as
/// they change, until `stop`.
async fn follow_group(
    ctx: Arc<Context>,
    group: Arc<Shared>,
    client: Arc<dyn PetStore>,
    cache: Store<Pet>,
    reconcile: UnboundedSender<ObjectRef<Pet>>,
    stop: CancellationToken,
) {
    let mut follower = Follower {
        ctx,
        group,
        client,
        cache,
        reconcile,
        revision: 0,
        index: None,
        missed: Vec::new(),
    };
    tokio::select! {
        () = stop.cancelled() => {}
        () = follower.run() => {}
    }
    if let Some(echoes) = follower.client.echoes() {
        echoes.set_enabled(false);
    }
    follower.group.lock().stopped(&follower.ctx);
}

/// Queues the Pet for a reconcile that reads the store.
fn queue(ctx: &Context, reconcile: &UnboundedSender<ObjectRef<Pet>>, pet: &Arc<Pet>) {
    if let Some(uid) = pet.uid() {
        ctx.memory.suspect_drift(pet, &uid);
    }
    // Fails only when the controller has stopped.
    let _ = reconcile.unbounded_send(ObjectRef::from_obj(&**pet));
}

/// Whether the Pet's record is in any of `stores`; [`on_store`] for one.
fn on_any(pet: &Pet, stores: &BTreeSet<StoreId>) -> bool {
    match stores.first() {
        Some(store) if stores.len() == 1 => on_store(pet, store),
        _ => store_of(pet).is_some_and(|store| stores.contains(&store)),
    }
}

/// One line for the members of a feed, for the log.
fn described(stores: &BTreeSet<StoreId>) -> String {
    match (stores.first(), stores.len()) {
        (None, _) => "no store".to_owned(),
        (Some(first), 1) => first.to_string(),
        (Some(first), n) => format!("{first} and {} more on its endpoint", n - 1),
    }
}

/// Queues every synced Pet of `stores`, but for those queued to read it
/// already: what their feed would have told is read from the store
/// instead.
fn reread_synced(
    ctx: &Context,
    cache: &Store<Pet>,
    reconcile: &UnboundedSender<ObjectRef<Pet>>,
    stores: &BTreeSet<StoreId>,
) {
    let mut queued = 0;
    for pet in cache.state() {
        if on_any(&pet, stores)
            && pet
                .uid()
                .and_then(|uid| ctx.memory.synced(&uid))
                .is_some_and(|synced| !synced.store_read_due)
        {
            queue(ctx, reconcile, &pet);
            queued += 1;
        }
    }
    if queued > 0 {
        info!(
            store = %described(stores),
            pets = queued,
            "reading again the Pets synced while the store's feed was not followed"
        );
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Starting,
    Live,
    /// The store has no feed: polling.
    Absent,
    /// The feed broke; reconnecting.
    Broken,
    /// The store does not take the operator as its observer: polling.
    Refused,
}

impl State {
    /// The `state` label of `change_feed_stores`.
    const fn as_str(self) -> &'static str {
        match self {
            State::Starting => "connecting",
            State::Live => "live",
            State::Absent => "absent",
            State::Broken => "broken",
            State::Refused => "refused",
        }
    }
}

struct Follower {
    ctx: Arc<Context>,
    /// The store objects followed, and the feed's state: only their Pets
    /// are judged.
    group: Arc<Shared>,
    /// Its client for the feed: the own store's, or one that carries the
    /// operator's observer token.
    client: Arc<dyn PetStore>,
    cache: Store<Pet>,
    reconcile: UnboundedSender<ObjectRef<Pet>>,
    /// The last revision seen; 0 before the first, and after history was
    /// lost.
    revision: i64,
    /// The members' Pets by UID and record ID, the members it holds, and
    /// when that was read from the cache; entries are checked against the
    /// cache's current copy. A join or leave makes it stale.
    index: Option<(PetIndex, Arc<BTreeSet<StoreId>>, Instant)>,
    /// Changes whose Pet the index missed, to judge again once it may be
    /// rebuilt.
    missed: Vec<RecordChange>,
}

/// When to try a feed that could not be opened again.
enum Retry {
    /// After FEED_RECHECK: the store has no feed, or refuses the operator.
    Recheck,
    /// After the reconnect's wait, which grows each time.
    Backoff,
}

/// Waits `wait`, and doubles it for the next time, up to RECONNECT_MAX.
async fn back_off(wait: &mut Duration) {
    tokio::time::sleep(*wait).await;
    *wait = (*wait * 2).min(RECONNECT_MAX);
}

impl Follower {
    /// Another store than the operator's own: read as its observer.
    fn reads_as_observer(&self) -> bool {
        !self.group.lock().own
    }

    fn state(&self) -> State {
        self.group.lock().state
    }

    fn members(&self) -> Arc<BTreeSet<StoreId>> {
        Arc::clone(&self.group.lock().members)
    }

    /// The members, for the log.
    fn store(&self) -> String {
        described(&self.members())
    }

    async fn run(&mut self) {
        let mut wait = RECONNECT_FIRST;
        loop {
            let from_now = self.revision == 0;
            let mut feed = match self.open().await {
                Ok(feed) => feed,
                Err(Retry::Recheck) => {
                    tokio::time::sleep(FEED_RECHECK).await;
                    continue;
                }
                Err(Retry::Backoff) => {
                    back_off(&mut wait).await;
                    continue;
                }
            };
            let mut first = true;
            loop {
                let message = match self.retry_at() {
                    None => feed.next().await,
                    Some(at) => tokio::select! {
                        message = feed.next() => message,
                        () = tokio::time::sleep_until(at) => {
                            self.judge_missed();
                            continue;
                        }
                    },
                };
                let Some(message) = message else {
                    break;
                };
                match message {
                    Ok(batch) => {
                        wait = RECONNECT_FIRST;
                        if first {
                            first = false;
                            self.connected(from_now);
                        }
                        self.handle(&batch.changes);
                        self.revision = self.revision.max(batch.revision);
                    }
                    Err(error) => {
                        self.broken(&error);
                        break;
                    }
                }
            }
            if !first && self.state() == State::Live {
                // The store ended the stream (a restart, say): resume.
                debug!(store = %self.store(), revision = self.revision, "the change feed ended; resuming");
            }
            back_off(&mut wait).await;
        }
    }

    /// Opens the change feed, after checking that another store lets the
    /// operator read every tenant's changes; or tells why not, and when to
    /// try again.
    async fn open(&mut self) -> Result<Feed, Retry> {
        if self.reads_as_observer() {
            match self.client.reads_every_tenant().await {
                Ok(true) => {}
                Ok(false) => {
                    self.refused(None);
                    return Err(Retry::Recheck);
                }
                Err(error) => return Err(self.not_opened(error)),
            }
        }
        match self.client.watch(self.revision).await {
            Ok(feed) => Ok(feed),
            Err(StoreError::Unimplemented { .. }) => {
                if self.state() != State::Absent {
                    info!(
                        store = %self.store(),
                        poll_interval = ?self.ctx.settings.poll_interval,
                        "the pet store offers no change feed (petstore.PetStore/WatchPets is unimplemented); drift is found by polling each Pet every poll interval"
                    );
                    self.stopped_following(State::Absent);
                }
                Err(Retry::Recheck)
            }
            Err(error) => Err(self.not_opened(error)),
        }
    }

    /// The store refused another store's observer, or failed: told, and
    /// when to try again.
    fn not_opened(&mut self, error: StoreError) -> Retry {
        match error {
            StoreError::Denied { message, .. } if self.reads_as_observer() => {
                self.refused(Some(&message));
                Retry::Recheck
            }
            error => {
                self.broken(&error);
                Retry::Backoff
            }
        }
    }

    fn connected(&mut self, from_now: bool) {
        if self.state() != State::Live {
            info!(
                store = %self.store(),
                revision = self.revision,
                audit_interval = ?self.ctx.settings.audit_interval,
                "following the pet store's change feed; each Pet is also audited every audit interval"
            );
        }
        // From now on, after a start or a lost history: whatever changed
        // before is found by reading each Pet once more. At a start those
        // are only the Pets synced already; the rest have their first
        // reconcile coming.
        if from_now {
            self.reread_synced();
        }
        self.move_to(State::Live);
    }

    fn broken(&mut self, error: &StoreError) {
        if let StoreError::HistoryLost { .. } = error {
            warn!(store = %self.store(), %error, "watching the change feed from now, and reading every Pet again");
            self.revision = 0;
        } else if self.state() == State::Live {
            warn!(store = %self.store(), %error, revision = self.revision, "the change feed broke; resuming");
        } else {
            debug!(store = %self.store(), %error, "the change feed is not available yet");
        }
        // New schedules use the poll interval until the feed is back; the
        // gap itself is replayed on resume, or re-read if history is lost.
        if matches!(self.state(), State::Live | State::Starting) {
            self.move_to(State::Broken);
        }
    }

    /// The store does not show the operator every tenant's changes: it
    /// takes the operator for a tenant, or refuses its token (`why`). Told
    /// once, until the feed is followed again.
    fn refused(&mut self, why: Option<&str>) {
        if self.state() == State::Refused {
            return;
        }
        let observer = self.ctx.stores.observer().map_or_else(
            || "<the operator's ServiceAccount>".to_owned(),
            |a| a.subject(),
        );
        warn!(
            store = %self.store(),
            refused = why.unwrap_or("the store takes the operator for a tenant"),
            poll_interval = ?self.ctx.settings.poll_interval,
            "the store does not let the operator read every tenant's changes: start it with `--observer {observer}`, trusting its tokens' issuer and audience; until then its Pets are polled every poll interval, and the store is asked again every minute"
        );
        self.stopped_following(State::Refused);
    }

    /// The feed is not followed, and will not be until the store changes:
    /// the Pets scheduled for an audit while it was are read again now, so
    /// each is polled at the poll interval from here on.
    fn stopped_following(&mut self, state: State) {
        let was_live = self.state() == State::Live;
        self.move_to(state);
        if was_live {
            self.reread_synced();
        }
    }

    /// Whether the index was built too recently to be built again, for
    /// the members there are now.
    fn index_is_fresh(&self) -> bool {
        let members = self.members();
        self.index.as_ref().is_some_and(|(_, of, built)| {
            Arc::ptr_eq(of, &members) && built.elapsed() < INDEX_REFRESH
        })
    }

    /// The current Pet `change` concerns, among this store's. The kept
    /// index finds it; the cache's current copy confirms it, so a stale
    /// entry never decides a verdict. A miss rebuilds the index, at most
    /// every INDEX_REFRESH.
    fn current_pet_for(&mut self, change: &RecordChange) -> Option<Arc<Pet>> {
        let members = self.members();
        let stores = &*members;
        let found = |index: &PetIndex, cache: &Store<Pet>| {
            index
                .pet_for(change)
                .and_then(|pet| cache.get(&ObjectRef::from_obj(&**pet)))
                .filter(|pet| on_any(pet, stores) && PetIndex::concerns(pet, change))
        };
        if let Some(pet) = self
            .index
            .as_ref()
            .and_then(|(index, _, _)| found(index, &self.cache))
        {
            return Some(pet);
        }
        // A record holding a Pet's name (kept by an earlier Pet of that
        // name, or owned by another installation, or deleted) concerns that
        // Pet, if its record is in this store.
        if let Some(pet) = change
            .identity
            .split_once('/')
            .and_then(|(namespace, name)| self.cache.get(&ObjectRef::new(name).within(namespace)))
            .filter(|pet| on_any(pet, stores))
        {
            return Some(pet);
        }
        if self.index_is_fresh() {
            return None;
        }
        let index = PetIndex::of_stores(self.cache.state(), stores);
        let pet = found(&index, &self.cache);
        self.index = Some((index, Arc::clone(&members), Instant::now()));
        pet
    }

    /// When the changes the index missed can be judged again.
    fn retry_at(&self) -> Option<Instant> {
        if self.missed.is_empty() {
            return None;
        }
        let built = self
            .index
            .as_ref()
            .map_or_else(Instant::now, |(_, _, built)| *built);
        Some(built + INDEX_REFRESH)
    }

    /// Judges again the changes the index missed, with a fresh index; a
    /// change that finds no Pet now concerns none.
    fn judge_missed(&mut self) {
        let drifted: Vec<Arc<Pet>> = std::mem::take(&mut self.missed)
            .iter()
            .filter_map(|change| self.judge(change, false))
            .collect();
        self.queue_drifted(&drifted);
    }

    /// Queues the Pets whose records drifted, each counted toward its
    /// store object's drift storm first: a batch that makes a storm (a
    /// restore the feed reports) is braked before its first write.
    fn queue_drifted(&self, pets: &[Arc<Pet>]) {
        for pet in pets {
            if let (Some(uid), Some(store)) = (pet.uid(), store_of(pet)) {
                self.ctx.drift_noticed(&store, &uid);
            }
        }
        for pet in pets {
            self.queue(pet);
        }
    }

    fn handle(&mut self, changes: &[RecordChange]) {
        // Our own writes coming back, recognised in O(1) (see
        // crate::store::echoes); only the rest look for their Pet.
        let echoes = self.client.echoes();
        let others: Vec<&RecordChange> = changes
            .iter()
            .filter(|change| {
                let echo = echoes.is_some_and(|echoes| echoes.is_echo(change));
                if echo {
                    self.ctx.metrics.feed_change(Verdict::InSync);
                }
                !echo
            })
            .collect();
        if others.is_empty() {
            return;
        }
        let drifted: Vec<Arc<Pet>> = others
            .into_iter()
            .filter_map(|change| self.judge(change, true))
            .collect();
        self.queue_drifted(&drifted);
    }

    /// The Pet `change` drifted, if any, to queue; counts the verdict. With
    /// `defer`, a change whose Pet the index cannot find yet is kept for
    /// [`Follower::judge_missed`].
    fn judge(&mut self, change: &RecordChange, defer: bool) -> Option<Arc<Pet>> {
        // A lookup on a stale index rebuilds it: a miss then is final.
        let could_rebuild = !self.index_is_fresh();
        let pet = self.current_pet_for(change);
        if pet.is_none() && defer && !could_rebuild {
            self.missed.push(change.clone());
            return None;
        }
        let verdict = verdict(change, pet.as_deref());
        self.ctx.metrics.feed_change(verdict);
        let pet = pet.filter(|_| verdict == Verdict::Drifted)?;
        debug!(
            store = %self.store(),
            id = %change.id,
            revision = change.revision,
            pet = %pet.name_any(),
            "the store changed a Pet's record; reconciling it"
        );
        Some(pet)
    }

    /// Queues the Pet for a reconcile that reads the store.
    fn queue(&self, pet: &Arc<Pet>) {
        queue(&self.ctx, &self.reconcile, pet);
    }

    fn reread_synced(&self) {
        reread_synced(&self.ctx, &self.cache, &self.reconcile, &self.members());
    }

    /// The feed moved to `state`; only a live one notes the operator's
    /// writes to meet their echoes, and only its members' Pets are just
    /// audited.
    fn move_to(&mut self, state: State) {
        if let Some(echoes) = self.client.echoes() {
            echoes.set_enabled(state == State::Live);
        }
        self.group.lock().move_to(&self.ctx, state);
    }
}

#[cfg(test)]
mod tests {
    use futures::channel::mpsc::UnboundedReceiver;
    use kube::runtime::events::Reporter;
    use kube::runtime::{reflector, watcher};

    use super::*;
    use crate::controller::Settings;
    use crate::events::{EventQueue, EventWriter};
    use crate::fixtures::{RECORD_ID as ID, UID};
    use crate::metrics::Metrics;
    use crate::store::FeedBatch;
    use crate::store::fake::FakeStore;

    /// Thor, whose record is `ID`, owned by `UID`.
    fn pet() -> Pet {
        Pet::test().with_status_id(ID)
    }

    /// The follower against a fake store whose feed each test scripts, with
    /// the Pets in its watch cache; what it queues arrives on `queued`.
    struct Following {
        store: Arc<FakeStore>,
        ctx: Arc<Context>,
        queued: UnboundedReceiver<ObjectRef<Pet>>,
        stop: CancellationToken,
        /// Adds Pets to the follower's watch cache.
        cache: reflector::store::Writer<Pet>,
    }

    /// The context, with the fake as the operator's own store, and a watch
    /// cache holding `pets`.
    fn context(
        pets: &[Pet],
    ) -> (
        Arc<Context>,
        Arc<FakeStore>,
        Store<Pet>,
        reflector::store::Writer<Pet>,
    ) {
        let (service, _handle) = tower_test::mock::pair::<
            http::Request<kube::client::Body>,
            http::Response<kube::client::Body>,
        >();
        // The follower never calls the API server.
        let client = kube::Client::new(service, "default");
        let metrics = Arc::new(Metrics::default());
        let store = Arc::new(FakeStore::default());
        let writer = EventWriter::new(
            client.clone(),
            Reporter {
                controller: "petstore-operator".into(),
                instance: None,
            },
        );
        let ctx = Arc::new(Context::new(
            client,
            store.clone(),
            EventQueue::start(writer, Arc::clone(&metrics)),
            metrics,
            Settings::default(),
        ));
        let (cache, mut writer) = reflector::store();
        for pet in pets {
            writer.apply_watcher_event(&watcher::Event::Apply(pet.clone()));
        }
        ctx.memory.track(cache.clone());
        (ctx, store, cache, writer)
    }

    fn following(pets: &[Pet]) -> Following {
        let (ctx, store, cache, writer) = context(pets);
        let (queue, queued) = futures::channel::mpsc::unbounded();
        let stop = CancellationToken::new();
        spawn_follower(&ctx, StoreId::Own, store.clone(), &cache, &queue, &stop);
        Following {
            store,
            ctx,
            queued,
            stop,
            cache: writer,
        }
    }

    /// Follows `store`'s feed in the background until `stop`.
    fn spawn_follower(
        ctx: &Arc<Context>,
        id: StoreId,
        store: Arc<FakeStore>,
        cache: &Store<Pet>,
        queue: &UnboundedSender<ObjectRef<Pet>>,
        stop: &CancellationToken,
    ) {
        tokio::spawn(follow(
            Arc::clone(ctx),
            id,
            store,
            cache.clone(),
            queue.clone(),
            stop.clone(),
        ));
    }

    /// A feed the test writes to.
    fn scripted_feed(store: &FakeStore) -> UnboundedSender<Result<FeedBatch, StoreError>> {
        let (feed, messages) = futures::channel::mpsc::unbounded();
        store.answer_next_watch(Ok(messages.boxed()));
        feed
    }

    fn batch(revision: i64) -> Result<FeedBatch, StoreError> {
        batch_of(revision, Vec::new())
    }

    fn batch_of(revision: i64, changes: Vec<RecordChange>) -> Result<FeedBatch, StoreError> {
        Ok(FeedBatch { revision, changes })
    }

    /// Lets the follower run until it is idle (time is paused: until it
    /// waits on the feed or a timer).
    async fn settle() {
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
    }

    fn watches(store: &FakeStore) -> Vec<String> {
        store
            .calls()
            .into_iter()
            .filter(|c| c.starts_with("watch:"))
            .collect()
    }

    fn synced_pets() -> Vec<Pet> {
        ["uid-a", "uid-b"]
            .into_iter()
            .map(|uid| {
                let mut pet = Pet::test()
                    .with_uid(uid)
                    .with_status_id(&format!("{uid}-record"));
                pet.metadata.name = Some(format!("pet-{uid}"));
                pet
            })
            .collect()
    }

    fn queued_now(queued: &mut UnboundedReceiver<ObjectRef<Pet>>) -> Vec<String> {
        let mut names = Vec::new();
        while let Ok(pet) = queued.try_recv() {
            names.push(pet.name);
        }
        names.sort();
        names
    }

    /// Notes `pet` as a reconcile that found it in sync does.
    fn synced(ctx: &Context, pet: &Pet) {
        let uid = pet.metadata.uid.as_deref().expect("uid");
        ctx.memory.started(uid);
        ctx.memory.in_sync(pet, uid, (Some(1), 0), "r", None);
    }

    /// Follows the [`synced_pets`] over a feed that brings these revisions,
    /// then, once the Pets are synced, breaks with `error`; returns the
    /// follower, its Pets, and the feed it then takes, which the test
    /// writes to.
    async fn broken_after(
        revisions: &[i64],
        error: StoreError,
    ) -> (
        Following,
        Vec<Pet>,
        UnboundedSender<Result<FeedBatch, StoreError>>,
    ) {
        let pets = synced_pets();
        let mut f = following(&pets);
        let first = scripted_feed(&f.store);
        let second = scripted_feed(&f.store);
        settle().await;
        for revision in revisions {
            first.unbounded_send(batch(*revision)).expect("send");
        }
        settle().await;
        // Synced since: the changes a lost history held may concern them.
        for pet in &pets {
            synced(&f.ctx, pet);
        }
        queued_now(&mut f.queued);
        first.unbounded_send(Err(error)).expect("send");
        // Past the reconnect's wait.
        tokio::time::sleep(Duration::from_secs(1)).await;
        (f, pets, second)
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_for_a_pet_newer_than_the_index_is_judged_once_it_is_rebuilt() {
        let mut f = following(&[]);
        let feed = scripted_feed(&f.store);
        settle().await;
        // The index is built for this change, before the Pet exists.
        let unrelated = RecordChange::changed("r-other", "", "Rex");
        feed.unbounded_send(batch_of(1, vec![unrelated]))
            .expect("send");
        settle().await;
        // A Pet in Observe watching a record it does not own, created now,
        // and its record changed out of band within the index's refresh.
        let mut observer = Pet::test()
            .with_uid("uid-o")
            .annotated(crate::crd::EXTERNAL_ID_ANNOTATION, "r-obs");
        observer.metadata.name = Some("observer".into());
        f.cache
            .apply_watcher_event(&watcher::Event::Apply(observer));
        let edited = RecordChange::changed("r-obs", "", "Older Tom");
        feed.unbounded_send(batch_of(2, vec![edited]))
            .expect("send");
        settle().await;
        assert!(queued_now(&mut f.queued).is_empty(), "not before a rebuild");
        tokio::time::sleep(INDEX_REFRESH).await;
        settle().await;
        assert_eq!(queued_now(&mut f.queued), ["observer"]);
        f.stop.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_broken_feed_resumes_after_the_last_revision_seen() {
        let reset = StoreError::Unavailable {
            operation: crate::store::Operation::Watch,
            message: "connection reset".into(),
            retry_after: None,
        };
        let (mut f, _, second) = broken_after(&[5, 9], reset).await;
        second.unbounded_send(batch(12)).expect("send");
        settle().await;
        assert_eq!(watches(&f.store), ["watch:0", "watch:9"]);
        assert!(
            queued_now(&mut f.queued).is_empty(),
            "nothing missed: nothing read again"
        );
        f.stop.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_feed_whose_history_is_gone_is_followed_from_now_and_every_synced_pet_read_again() {
        let compacted = StoreError::HistoryLost {
            message: "revision 5 was compacted".into(),
        };
        let (mut f, pets, second) = broken_after(&[5], compacted).await;
        assert!(
            queued_now(&mut f.queued).is_empty(),
            "not before the feed is back"
        );
        second.unbounded_send(batch(40)).expect("send");
        settle().await;
        assert_eq!(watches(&f.store), ["watch:0", "watch:0"]);
        assert_eq!(queued_now(&mut f.queued), ["pet-uid-a", "pet-uid-b"]);
        for pet in &pets {
            let uid = pet.metadata.uid.as_deref().expect("uid");
            assert!(
                f.ctx
                    .memory
                    .synced(uid)
                    .is_some_and(|synced| synced.store_read_due),
                "{uid}: its reconcile reads the store"
            );
        }
        f.stop.cancel();
    }

    /// Log lines written while the test runs, on this thread.
    #[derive(Clone, Default)]
    struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Captured {
        /// Captures what is logged at `level` or above on this thread, while
        /// the guard lives.
        fn on_this_thread(level: tracing::Level) -> (Self, tracing::subscriber::DefaultGuard) {
            let log = Self::default();
            let subscriber = tracing_subscriber::fmt()
                .with_writer({
                    let log = log.clone();
                    move || log.clone()
                })
                .with_max_level(level)
                .finish();
            crate::fixtures::scoped_subscribers_see_everything();
            (log, tracing::subscriber::set_default(subscriber))
        }

        fn text(&self) -> String {
            let bytes = self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            String::from_utf8_lossy(&bytes).into_owned()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_store_without_a_feed_is_told_once_and_asked_again_each_minute() {
        let (log, _guard) = Captured::on_this_thread(tracing::Level::DEBUG);
        let start = tokio::time::Instant::now();
        let f = following(&[]);
        settle().await;
        tokio::time::sleep(FEED_RECHECK - Duration::from_secs(1)).await;
        assert_eq!(
            f.store.watched_at().len(),
            1,
            "not asked again within the minute"
        );
        tokio::time::sleep(FEED_RECHECK * 3).await;
        let asked: Vec<Duration> = f
            .store
            .watched_at()
            .into_iter()
            .map(|at| at - start)
            .collect();
        let minutes: Vec<Duration> = (0..4).map(|i| FEED_RECHECK * i).collect();
        assert_eq!(asked, minutes);
        let told = log.text().matches("offers no change feed").count();
        assert_eq!(told, 1, "{}", log.text());
        assert!(
            f.ctx
                .metrics
                .encode()
                .expect("metrics")
                .contains("feed_connected 0"),
            "the poll goes on"
        );
        f.stop.cancel();
    }

    #[test]
    fn a_change_finds_its_pet_by_owner_then_by_status() {
        let thor = Arc::new(pet());
        let index = PetIndex::new([Arc::clone(&thor)]);
        let found = |change: &RecordChange| index.pet_for(change).map(|pet| pet.name_any());
        assert_eq!(
            found(&RecordChange::changed("record-9", UID, "Thor")).as_deref(),
            Some("thor")
        );
        assert_eq!(
            found(&RecordChange::changed(ID, "", "Thor")).as_deref(),
            Some("thor")
        );
        assert_eq!(found(&RecordChange::deleted(ID)).as_deref(), Some("thor"));
        assert_eq!(
            found(&RecordChange::changed("record-9", "someone-else", "Rex")),
            None
        );
        assert_eq!(found(&RecordChange::deleted("record-9")), None);
        // The same rule confirms a kept entry against the current copy.
        assert!(PetIndex::concerns(
            &thor,
            &RecordChange::changed("record-9", UID, "Thor")
        ));
        assert!(PetIndex::concerns(&thor, &RecordChange::deleted(ID)));
        assert!(!PetIndex::concerns(
            &thor,
            &RecordChange::deleted("record-9")
        ));
        assert!(!PetIndex::concerns(
            &thor,
            &RecordChange::changed("record-9", "someone-else", "Rex")
        ));
    }

    /// A Pet named `name` in namespace `team`, whose record is `id` in the
    /// store `status.store` names (`None`: the operator's own).
    fn pet_on(store: Option<&str>, name: &str, id: Option<&str>) -> Pet {
        let mut pet = Pet::test().with_uid(&format!("uid-{name}"));
        pet.metadata.name = Some(name.into());
        pet.metadata.namespace = Some("team".into());
        let status = pet.status.get_or_insert_default();
        status.id = id.map(str::to_owned);
        status.store = store.map(str::to_owned);
        pet
    }

    /// Followers of the own store, ClusterPetStore `a` and PetStore `b` (in
    /// namespace `team`), each on a fake store of its own whose feed the
    /// test writes to, over one watch cache; what they queue arrives on
    /// the receiver.
    struct ThreeStores {
        ctx: Arc<Context>,
        feeds: HashMap<&'static str, UnboundedSender<Result<FeedBatch, StoreError>>>,
        queued: UnboundedReceiver<ObjectRef<Pet>>,
        stop: CancellationToken,
    }

    fn three_stores(pets: &[Pet]) -> ThreeStores {
        let (ctx, own, cache, _writer) = context(pets);
        let (queue, queued) = futures::channel::mpsc::unbounded();
        let stop = CancellationToken::new();
        let b = StoreId::namespaced("team", "b");
        let mut feeds = HashMap::new();
        for (label, id, store) in [
            ("own", StoreId::Own, own),
            ("a", StoreId::cluster("a"), Arc::new(FakeStore::default())),
            ("b", b, Arc::new(FakeStore::default())),
        ] {
            feeds.insert(label, scripted_feed(&store));
            spawn_follower(&ctx, id, store, &cache, &queue, &stop);
        }
        ThreeStores {
            ctx,
            feeds,
            queued,
            stop,
        }
    }

    /// Record IDs are the store's: a change reaches the Pets of the store
    /// it came from only, however it names a Pet of another.
    #[tokio::test(start_paused = true)]
    async fn a_change_queues_only_pets_whose_record_is_in_its_store() {
        let pets = [
            pet_on(Some("ClusterPetStore/a"), "pet-a", Some("record-1")),
            pet_on(Some("PetStore/b"), "pet-b", Some("record-1")),
            pet_on(None, "pet-own", Some("record-2")),
            pet_on(Some("PetStore/b"), "watching", None)
                .annotated(crate::crd::EXTERNAL_ID_ANNOTATION, "record-3"),
        ];
        // A change to the record `id` that names no Pet.
        let rex = |id: &str| RecordChange::changed(id, "", "Rex");
        let rows: [(&str, &str, RecordChange, &[&str]); 9] = [
            (
                "a's record-1 concerns a's Pet",
                "a",
                rex("record-1"),
                &["pet-a"],
            ),
            (
                "b's record-1 concerns b's Pet",
                "b",
                rex("record-1"),
                &["pet-b"],
            ),
            (
                "the own store's record-1 concerns neither",
                "own",
                rex("record-1"),
                &[],
            ),
            (
                "a's record-1 deleted",
                "a",
                RecordChange::deleted("record-1"),
                &["pet-a"],
            ),
            (
                "a record in a keyed to b's Pet",
                "a",
                RecordChange::changed("record-9", "uid-pet-b", "Rex"),
                &[],
            ),
            (
                "a record in a holding b's Pet's name",
                "a",
                rex("record-9").named("team/pet-b"),
                &[],
            ),
            (
                "a's record-3, which a Pet of b names",
                "a",
                rex("record-3"),
                &[],
            ),
            (
                "b's record-3, which that Pet names",
                "b",
                rex("record-3"),
                &["watching"],
            ),
            (
                "the own store's record-2",
                "own",
                rex("record-2"),
                &["pet-own"],
            ),
        ];
        for (row, from, change, want) in rows {
            let mut stores = three_stores(&pets);
            settle().await;
            stores.feeds[from]
                .unbounded_send(batch_of(1, vec![change]))
                .expect("send");
            settle().await;
            // Past any deferred judgement.
            tokio::time::sleep(INDEX_REFRESH * 2).await;
            settle().await;
            assert_eq!(queued_now(&mut stores.queued), want, "{row}");
            let verdict = if want.is_empty() {
                "unrelated"
            } else {
                "drifted"
            };
            let counted = format!("change_feed_changes_total{{verdict=\"{verdict}\"}} 1");
            let metrics = stores.ctx.metrics.encode().expect("metrics");
            assert!(metrics.contains(&counted), "{row}: {metrics}");
            stores.stop.cancel();
        }
    }

    /// Each store's feed decides the poll of its own Pets: one live, one
    /// down, one that has none, one that takes the operator for a tenant.
    #[tokio::test(start_paused = true)]
    async fn each_stores_feed_state_sets_the_poll_of_its_own_pets() {
        let (log, _guard) = Captured::on_this_thread(tracing::Level::INFO);
        let (ctx, own, cache, _writer) = context(&[]);
        let (queue, _queued) = futures::channel::mpsc::unbounded();
        let stop = CancellationToken::new();
        let live = Arc::new(FakeStore::default());
        let _live_feed = scripted_feed(&live);
        let down = Arc::new(FakeStore::default());
        down.set_unavailable(true);
        // No feed scripted: the store has none.
        let absent = Arc::new(FakeStore::default());
        let tenant_only = Arc::new(FakeStore::default());
        tenant_only.set_tenant_only(true);
        let _own_feed = scripted_feed(&own);
        let stores: [(StoreId, Arc<FakeStore>); 5] = [
            (StoreId::Own, Arc::clone(&own)),
            (StoreId::cluster("live"), Arc::clone(&live)),
            (StoreId::cluster("down"), down),
            (StoreId::cluster("absent"), absent),
            (StoreId::cluster("tenant-only"), Arc::clone(&tenant_only)),
        ];
        for (id, store) in stores {
            spawn_follower(&ctx, id, store, &cache, &queue, &stop);
        }
        settle().await;
        _live_feed.unbounded_send(batch(3)).expect("send");
        _own_feed.unbounded_send(batch(3)).expect("send");
        settle().await;
        let poll = Settings::default().poll_interval;
        let audit = Settings::default().audit_interval;
        let rows: [(&str, StoreId, Duration); 5] = [
            ("the own store's feed is followed", StoreId::Own, audit),
            ("a live feed", StoreId::cluster("live"), audit),
            ("a store that is down", StoreId::cluster("down"), poll),
            ("a store without a feed", StoreId::cluster("absent"), poll),
            (
                "a store that takes the operator for a tenant",
                StoreId::cluster("tenant-only"),
                poll,
            ),
        ];
        for (row, store, want) in &rows {
            assert_eq!(ctx.poll.interval_for(Some(store), 10), *want, "{row}");
        }
        let metrics = ctx.metrics.encode().expect("metrics");
        for state in [
            "state=\"live\"} 1",
            "state=\"broken\"} 1",
            "state=\"absent\"} 1",
            "state=\"refused\"} 1",
            "state=\"connecting\"} 0",
        ] {
            assert!(
                metrics.contains(&format!("change_feed_stores{{{state}")),
                "{state}: {metrics}"
            );
        }
        // The refusal is told once, naming the flag the store needs, and
        // the store is asked again every minute.
        tokio::time::sleep(FEED_RECHECK * 3 + Duration::from_secs(1)).await;
        settle().await;
        let told = log.text();
        assert_eq!(
            told.matches("start it with `--observer").count(),
            1,
            "{told}"
        );
        let asked = tenant_only
            .calls()
            .iter()
            .filter(|call| *call == "reads_every_tenant")
            .count();
        assert_eq!(asked, 4, "at the start and once a minute since");
        assert!(
            watches(&tenant_only).is_empty(),
            "a feed that would show one tenant is not read"
        );
        // Once restarted with --observer for the operator, it is followed.
        let _feed = scripted_feed(&tenant_only);
        tenant_only.set_tenant_only(false);
        tokio::time::sleep(FEED_RECHECK).await;
        _feed.unbounded_send(batch(5)).expect("send");
        settle().await;
        assert_eq!(
            ctx.poll
                .interval_for(Some(&StoreId::cluster("tenant-only")), 10),
            audit
        );
        assert!(
            ctx.metrics
                .encode()
                .expect("metrics")
                .contains("change_feed_stores{state=\"refused\"} 0")
        );
        // Stopped, every follower lets go of its store.
        stop.cancel();
        settle().await;
        for (row, store, _) in &rows {
            assert_eq!(ctx.poll.interval_for(Some(store), 10), poll, "{row}");
        }
        let metrics = ctx.metrics.encode().expect("metrics");
        assert!(
            !metrics.lines().any(
                |line| line.starts_with("petstore_operator_change_feed_stores{")
                    && !line.ends_with(" 0")
            ),
            "{metrics}"
        );
    }

    #[tokio::test]
    async fn the_stores_kept_open_are_those_holding_records_of_pets() {
        let (_, _, cache, _writer) = context(&[
            pet_on(None, "own", Some("r-1")),
            pet_on(Some("ClusterPetStore/a"), "on-a", Some("r-1")),
            pet_on(Some("ClusterPetStore/a"), "also-on-a", Some("r-2")),
            pet_on(Some("PetStore/b"), "on-b", None),
        ]);
        let b = StoreId::namespaced("team", "b");
        assert_eq!(
            stores_with_pets(&cache),
            HashSet::from([StoreId::cluster("a"), b])
        );
    }

    /// Where the test's feeds are read from: `address`, audience
    /// `petstore`.
    fn source(address: &str) -> FeedSource {
        FeedSource {
            channel: crate::stores::channels::ChannelKey {
                address: address.into(),
                ca: None,
                server_name: None,
            },
            audience: "petstore".into(),
        }
    }

    /// The feeds with `members` of `source` reading `client`'s feed.
    fn put_group(
        feeds: &mut Feeds,
        source: FeedSource,
        client: &Arc<FakeStore>,
        members: &[&StoreId],
    ) {
        feeds.insert(
            source,
            crate::stores::FeedGroup {
                client: Arc::clone(client) as Arc<dyn PetStore>,
                members: members.iter().map(|id| (*id).clone()).collect(),
            },
        );
    }

    /// `follow_stores` over the feeds `open` sends, with the Pets cached;
    /// what it queues arrives on `queued`.
    struct FollowingStores {
        ctx: Arc<Context>,
        open: watch::Sender<Feeds>,
        queued: UnboundedReceiver<ObjectRef<Pet>>,
        stop: CancellationToken,
        /// The own store's feed, open and quiet.
        _own_feed: UnboundedSender<Result<FeedBatch, StoreError>>,
    }

    fn following_stores(pets: &[Pet]) -> FollowingStores {
        let (ctx, own, cache, _writer) = context(pets);
        let (queue, queued) = futures::channel::mpsc::unbounded();
        let stop = CancellationToken::new();
        let (open, feeds) = watch::channel(Feeds::new());
        let own_feed = scripted_feed(&own);
        tokio::spawn(follow_stores(
            Arc::clone(&ctx),
            feeds,
            cache,
            queue,
            stop.clone(),
        ));
        FollowingStores {
            ctx,
            open,
            queued,
            stop,
            _own_feed: own_feed,
        }
    }

    /// A store's follower runs while the store is open, and goes with it;
    /// a store opened again on another endpoint (a new spec) moves to that
    /// endpoint's feed, from now.
    #[tokio::test(start_paused = true)]
    async fn a_follower_runs_while_its_store_is_open() {
        let pets = [pet_on(Some("ClusterPetStore/a"), "pet-a", Some("record-1"))];
        let mut f = following_stores(&pets);
        synced(&f.ctx, &pets[0]);
        settle().await;
        let audit = Settings::default().audit_interval;
        let poll = Settings::default().poll_interval;
        let a = StoreId::cluster("a");
        assert_eq!(f.ctx.poll.interval_for(Some(&a), 1), poll, "not open yet");

        let first = Arc::new(FakeStore::default());
        let first_feed = scripted_feed(&first);
        f.open
            .send_modify(|feeds| put_group(feeds, source("one:6742"), &first, &[&a]));
        settle().await;
        first_feed.unbounded_send(batch(4)).expect("send");
        settle().await;
        assert_eq!(f.ctx.poll.interval_for(Some(&a), 1), audit, "followed");
        assert_eq!(watches(&first), ["watch:0"]);
        // Followed from now: the Pet synced before is read once more.
        assert_eq!(queued_now(&mut f.queued), ["pet-a"]);

        // Its reconcile found it in sync.
        synced(&f.ctx, &pets[0]);

        // Opened again with a new spec naming another endpoint: that
        // endpoint's feed, on the new client; the first, left without
        // members, stops.
        let second = Arc::new(FakeStore::default());
        let second_feed = scripted_feed(&second);
        f.open.send_modify(|feeds| {
            feeds.clear();
            put_group(feeds, source("two:6742"), &second, &[&a]);
        });
        settle().await;
        second_feed.unbounded_send(batch(1)).expect("send");
        settle().await;
        assert_eq!(watches(&second), ["watch:0"]);
        assert_eq!(f.ctx.poll.interval_for(Some(&a), 1), audit);
        assert!(
            first_feed.is_closed(),
            "the first follower let go of its feed"
        );
        assert_eq!(
            queued_now(&mut f.queued),
            ["pet-a"],
            "followed from now again"
        );

        synced(&f.ctx, &pets[0]);

        // Closed (its object deleted, say): polled again, and its Pets,
        // which were only audited, are read now.
        f.open.send_modify(Feeds::clear);
        settle().await;
        assert_eq!(f.ctx.poll.interval_for(Some(&a), 1), poll, "closed");
        assert_eq!(queued_now(&mut f.queued), ["pet-a"], "read on closing");
        assert_eq!(
            f.ctx.poll.interval_for(Some(&StoreId::Own), 1),
            poll,
            "the own store's feed was never live here"
        );
        f.stop.cancel();
    }

    /// Store objects on one endpoint share one feed: one watch, whose
    /// changes reach the Pets of each of them; another endpoint has its
    /// own. A member joins the running feed without reopening it, a
    /// member leaves it, and the last to leave stops it.
    #[tokio::test(start_paused = true)]
    async fn store_objects_on_one_endpoint_share_one_feed_as_they_join_and_leave() {
        let pets = [
            pet_on(Some("ClusterPetStore/a"), "pet-a", Some("record-1")),
            pet_on(Some("PetStore/b"), "pet-b", Some("record-2")),
            pet_on(Some("ClusterPetStore/c"), "pet-c", Some("record-1")),
            pet_on(Some("PetStore/d"), "pet-d", Some("record-3")),
        ];
        let mut f = following_stores(&pets);
        let [a, b, c, d] = [
            StoreId::cluster("a"),
            StoreId::namespaced("team", "b"),
            StoreId::cluster("c"),
            StoreId::namespaced("team", "d"),
        ];
        let audit = Settings::default().audit_interval;
        let poll = Settings::default().poll_interval;
        let shared = Arc::new(FakeStore::default());
        let shared_feed = scripted_feed(&shared);
        // Were a second feed opened on it, it would be this one.
        let _reopened = scripted_feed(&shared);
        let other = Arc::new(FakeStore::default());
        let other_feed = scripted_feed(&other);
        f.open.send_modify(|feeds| {
            put_group(feeds, source("one:6742"), &shared, &[&a, &b]);
            put_group(feeds, source("two:6742"), &other, &[&c]);
        });
        settle().await;
        shared_feed.unbounded_send(batch(1)).expect("send");
        other_feed.unbounded_send(batch(1)).expect("send");
        settle().await;
        assert_eq!(watches(&shared), ["watch:0"], "one feed for a and b");
        assert_eq!(
            watches(&other),
            ["watch:0"],
            "c's endpoint: a feed of its own"
        );
        for store in [&a, &b, &c] {
            assert_eq!(f.ctx.poll.interval_for(Some(store), 1), audit, "{store}");
        }
        let live = |ctx: &Context, n: usize| {
            let metrics = ctx.metrics.encode().expect("metrics");
            assert!(
                metrics.contains(&format!("change_feed_stores{{state=\"live\"}} {n}")),
                "{n} store objects live: {metrics}"
            );
        };
        live(&f.ctx, 3);
        let rex = |id: &str| RecordChange::changed(id, "", "Rex");
        // One change on the shared feed for each of its objects' records:
        // each queues its own Pet, and c's record-1 is not this server's.
        shared_feed
            .unbounded_send(batch_of(2, vec![rex("record-1"), rex("record-2")]))
            .expect("send");
        settle().await;
        assert_eq!(queued_now(&mut f.queued), ["pet-a", "pet-b"]);

        // d opens on the same endpoint: it joins the running feed, which
        // goes on from where it was.
        synced(&f.ctx, &pets[3]);
        f.open
            .send_modify(|feeds| put_group(feeds, source("one:6742"), &shared, &[&a, &b, &d]));
        settle().await;
        assert_eq!(watches(&shared), ["watch:0"], "not reopened");
        assert_eq!(
            f.ctx.poll.interval_for(Some(&d), 1),
            audit,
            "d's poll waits for the feed"
        );
        assert_eq!(
            queued_now(&mut f.queued),
            ["pet-d"],
            "the feed is new to d's synced Pets"
        );
        live(&f.ctx, 4);
        shared_feed
            .unbounded_send(batch_of(3, vec![rex("record-3")]))
            .expect("send");
        settle().await;
        assert_eq!(
            queued_now(&mut f.queued),
            ["pet-d"],
            "d's change after its join"
        );

        // a closes: it leaves, its synced Pet is read, and the feed no
        // longer judges for it.
        synced(&f.ctx, &pets[0]);
        f.open
            .send_modify(|feeds| put_group(feeds, source("one:6742"), &shared, &[&b, &d]));
        settle().await;
        assert_eq!(f.ctx.poll.interval_for(Some(&a), 1), poll, "a is polled");
        assert_eq!(queued_now(&mut f.queued), ["pet-a"], "read on leaving");
        live(&f.ctx, 3);
        shared_feed
            .unbounded_send(batch_of(4, vec![rex("record-1")]))
            .expect("send");
        tokio::time::sleep(INDEX_REFRESH * 2).await;
        settle().await;
        assert!(
            queued_now(&mut f.queued).is_empty(),
            "a's record is no longer followed"
        );
        assert_eq!(watches(&shared), ["watch:0"]);

        // The last members leave: the feed stops; c's goes on.
        f.open
            .send_modify(|feeds| drop(feeds.remove(&source("one:6742"))));
        settle().await;
        assert!(shared_feed.is_closed(), "the shared feed stopped");
        assert_eq!(watches(&shared), ["watch:0"]);
        for store in [&b, &d] {
            assert_eq!(f.ctx.poll.interval_for(Some(store), 1), poll, "{store}");
        }
        assert_eq!(f.ctx.poll.interval_for(Some(&c), 1), audit);
        live(&f.ctx, 1);
        f.stop.cancel();
    }
}
