//! Drift found from the store's change feed instead of polling.
//!
//! When the store offers `WatchPets`, the leader follows it: a change to a
//! Pet's record that leaves it unlike the Pet (an out-of-band update, key
//! change or delete) queues that Pet at once, and its reconcile reads the
//! store and corrects the record. The operator's own writes come back on
//! the feed too, and match their Pets, so they queue nothing. The per-Pet
//! poll then only audits, at `--audit-interval`.
//!
//! A feed that breaks is resumed from the last revision seen. One that
//! cannot be resumed (the store compacted that history, or restarted
//! without it) is watched again from now, and every Pet already synced is
//! read once more, so no change in the gap is missed. A store without the
//! feed (the book's) is polled as before, and told once in the log.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use futures::channel::mpsc::UnboundedSender;
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};
// Tokio's clock: the index's age and the retry of missed changes share one.
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::Context;
use crate::crd::Pet;
use crate::decision::feed::{Verdict, verdict};
use crate::store::{RecordChange, StoreError};

/// How long to wait before asking a store without a feed again: it may be
/// replaced by one with it (the book's store by ours) at the same address.
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

/// The Pets a batch of changes may concern, found by the record's key (the
/// owner's UID) or by the ID in their status, else in their external-id
/// annotation (a record watched by a Pet in Observe is not keyed to it).
/// A record's identity names its Pet directly: the cache finds that one.
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

/// Follows the feed until `stop`, queueing the Pets whose records drifted
/// on `reconcile`.
pub async fn follow(
    ctx: Arc<Context>,
    cache: Store<Pet>,
    reconcile: UnboundedSender<ObjectRef<Pet>>,
    stop: CancellationToken,
) {
    let mut follower = Follower {
        ctx,
        cache,
        reconcile,
        revision: 0,
        state: State::Starting,
        index: None,
        missed: Vec::new(),
    };
    tokio::select! {
        () = stop.cancelled() => {}
        () = follower.run() => {}
    }
    follower.set_live(false);
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Starting,
    Live,
    /// The store has no feed: polling.
    Absent,
    /// The feed broke; reconnecting.
    Broken,
}

struct Follower {
    ctx: Arc<Context>,
    cache: Store<Pet>,
    reconcile: UnboundedSender<ObjectRef<Pet>>,
    /// The last revision seen; 0 before the first, and after history was
    /// lost.
    revision: i64,
    state: State,
    /// The Pets by UID and record ID, and when that was read from the
    /// cache; entries are checked against the cache's current copy.
    index: Option<(PetIndex, Instant)>,
    /// Changes whose Pet the index missed, to judge again once it may be
    /// rebuilt.
    missed: Vec<RecordChange>,
}

impl Follower {
    async fn run(&mut self) {
        let mut wait = RECONNECT_FIRST;
        loop {
            let from_now = self.revision == 0;
            let mut feed = match self.ctx.store.watch(self.revision).await {
                Ok(feed) => feed,
                Err(StoreError::Unimplemented { .. }) => {
                    if self.state != State::Absent {
                        info!(
                            poll_interval = ?self.ctx.settings.poll_interval,
                            "the pet store offers no change feed (petstore.PetStore/WatchPets is unimplemented); drift is found by polling each Pet every poll interval"
                        );
                        self.state = State::Absent;
                        self.set_live(false);
                    }
                    tokio::time::sleep(FEED_RECHECK).await;
                    continue;
                }
                Err(error) => {
                    self.broken(&error);
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(RECONNECT_MAX);
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
            if !first && self.state == State::Live {
                // The store ended the stream (a restart, say): resume.
                debug!(revision = self.revision, "the change feed ended; resuming");
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(RECONNECT_MAX);
        }
    }

    fn connected(&mut self, from_now: bool) {
        if self.state != State::Live {
            info!(
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
        self.state = State::Live;
        self.set_live(true);
    }

    fn broken(&mut self, error: &StoreError) {
        if let StoreError::HistoryLost { .. } = error {
            warn!(%error, "watching the change feed from now, and reading every Pet again");
            self.revision = 0;
        } else if self.state == State::Live {
            warn!(%error, revision = self.revision, "the change feed broke; resuming");
        } else {
            debug!(%error, "the change feed is not available yet");
        }
        if self.state == State::Live {
            self.state = State::Broken;
        }
        // New schedules use the poll interval until the feed is back; the
        // gap itself is replayed on resume, or re-read if history is lost.
        self.set_live(false);
    }

    /// Whether the index was built too recently to be built again.
    fn index_is_fresh(&self) -> bool {
        self.index
            .as_ref()
            .is_some_and(|(_, built)| built.elapsed() < INDEX_REFRESH)
    }

    /// The current Pet `change` concerns. The kept index finds it; the
    /// cache's current copy confirms it, so a stale entry never decides a
    /// verdict. A miss rebuilds the index, at most every INDEX_REFRESH.
    fn current_pet_for(&mut self, change: &RecordChange) -> Option<Arc<Pet>> {
        let found = |index: &PetIndex, cache: &Store<Pet>| {
            index
                .pet_for(change)
                .and_then(|pet| cache.get(&ObjectRef::from_obj(&**pet)))
                .filter(|pet| PetIndex::concerns(pet, change))
        };
        if let Some(pet) = self
            .index
            .as_ref()
            .and_then(|(index, _)| found(index, &self.cache))
        {
            return Some(pet);
        }
        // A record holding a Pet's name (kept by an earlier Pet of that
        // name, or owned by another installation, or deleted) concerns that
        // Pet.
        if let Some(pet) = change
            .identity
            .split_once('/')
            .and_then(|(namespace, name)| self.cache.get(&ObjectRef::new(name).within(namespace)))
        {
            return Some(pet);
        }
        if self
            .index
            .as_ref()
            .is_some_and(|(_, built)| built.elapsed() < INDEX_REFRESH)
        {
            return None;
        }
        let index = PetIndex::new(self.cache.state());
        let pet = found(&index, &self.cache);
        self.index = Some((index, Instant::now()));
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
            .map_or_else(Instant::now, |(_, built)| *built);
        Some(built + INDEX_REFRESH)
    }

    /// Judges again the changes the index missed, with a fresh index; a
    /// change that finds no Pet now concerns none.
    fn judge_missed(&mut self) {
        for change in std::mem::take(&mut self.missed) {
            self.judge(&change, false);
        }
    }

    fn handle(&mut self, changes: &[RecordChange]) {
        // Our own writes coming back, recognised in O(1) (see
        // crate::store::echoes); only the rest look for their Pet.
        let echoes = self.ctx.store.echoes();
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
        for change in others {
            self.judge(change, true);
        }
    }

    /// Queues the Pet `change` drifted, if any; counts the verdict. With
    /// `defer`, a change whose Pet the index cannot find yet is kept for
    /// [`Follower::judge_missed`].
    fn judge(&mut self, change: &RecordChange, defer: bool) {
        // A lookup on a stale index rebuilds it: a miss then is final.
        let could_rebuild = !self.index_is_fresh();
        let pet = self.current_pet_for(change);
        if pet.is_none() && defer && !could_rebuild {
            self.missed.push(change.clone());
            return;
        }
        let pet = pet.as_ref();
        let verdict = verdict(change, pet.map(Arc::as_ref));
        self.ctx.metrics.feed_change(verdict);
        if let (Verdict::Drifted, Some(pet)) = (verdict, pet) {
            debug!(
                id = %change.id,
                revision = change.revision,
                pet = %pet.name_any(),
                "the store changed a Pet's record; reconciling it"
            );
            self.queue(pet);
        }
    }

    /// Queues the Pet for a reconcile that reads the store.
    fn queue(&self, pet: &Arc<Pet>) {
        if let Some(uid) = pet.uid() {
            self.ctx.memory.suspect_drift(pet, &uid);
        }
        // Fails only when the controller has stopped.
        let _ = self.reconcile.unbounded_send(ObjectRef::from_obj(&**pet));
    }

    fn reread_synced(&self) {
        let mut queued = 0;
        for pet in self.cache.state() {
            if pet
                .uid()
                .is_some_and(|uid| self.ctx.memory.synced(&uid).is_some())
            {
                self.queue(&pet);
                queued += 1;
            }
        }
        if queued > 0 {
            info!(
                pets = queued,
                "reading again the Pets synced before the feed was followed"
            );
        }
    }

    fn set_live(&self, live: bool) {
        if let Some(echoes) = self.ctx.store.echoes() {
            echoes.set_enabled(live);
        }
        self.ctx.poll.set_feed_live(live);
        self.ctx.metrics.set_feed_connected(live);
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

    fn following(pets: &[Pet]) -> Following {
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
        let (queue, queued) = futures::channel::mpsc::unbounded();
        let stop = CancellationToken::new();
        tokio::spawn(follow(Arc::clone(&ctx), cache, queue, stop.clone()));
        Following {
            store,
            ctx,
            queued,
            stop,
            cache: writer,
        }
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

    /// Follows a feed that brings these revisions, then, once `pets` are
    /// synced, breaks with `error`; returns the feed the follower then
    /// takes, which the test writes to.
    async fn broken_after(
        f: &mut Following,
        pets: &[Pet],
        revisions: &[i64],
        error: StoreError,
    ) -> UnboundedSender<Result<FeedBatch, StoreError>> {
        let first = scripted_feed(&f.store);
        let second = scripted_feed(&f.store);
        settle().await;
        for revision in revisions {
            first.unbounded_send(batch(*revision)).expect("send");
        }
        settle().await;
        // Synced since: the changes a lost history held may concern them.
        for pet in pets {
            let uid = pet.metadata.uid.as_deref().expect("uid");
            f.ctx.memory.in_sync(pet, uid, (Some(1), 0), "r");
        }
        queued_now(&mut f.queued);
        first.unbounded_send(Err(error)).expect("send");
        // Past the reconnect's wait.
        tokio::time::sleep(Duration::from_secs(1)).await;
        second
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
        let pets = synced_pets();
        let mut f = following(&pets);
        let reset = StoreError::Unavailable {
            operation: crate::store::Operation::Watch,
            message: "connection reset".into(),
            retry_after: None,
        };
        let second = broken_after(&mut f, &pets, &[5, 9], reset).await;
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
        let pets = synced_pets();
        let mut f = following(&pets);
        let compacted = StoreError::HistoryLost {
            message: "revision 5 was compacted".into(),
        };
        let second = broken_after(&mut f, &pets, &[5], compacted).await;
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
                f.ctx.memory.synced(uid).is_none(),
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
        let log = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer({
                let log = log.clone();
                move || log.clone()
            })
            .with_max_level(tracing::Level::DEBUG)
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);
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
}
