//! Admission to kube's scheduler, one namespace at a time.
//!
//! kube's controller runs triggers in the order they come. Without this,
//! 10,000 Pets created at once in one namespace would make a Pet of any
//! other namespace wait behind all of them: one tenant's burst would stall
//! every other tenant. Here each namespace has a queue of its own, and kube
//! is handed the next Pet of each namespace in turn, and only as many as
//! can run at once, so kube's own queue never grows long.
//!
//! A Pet triggered while it is admitted (queued in kube or running) is
//! marked and queued again once that run ends, as kube's scheduler would
//! hold it: nothing is lost, and no Pet runs twice at once. Each Pet is held
//! at most once, so the memory is bounded by the number of Pets.
//!
//! kube's own retries and requeues (backoffs, polls scheduled by a
//! reconcile) go straight to its scheduler: they are timed, not a burst.
//!
//! Each Pet admitted says how long it waited here, from its first trigger
//! not yet run: the queue wait of the operator's service levels.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use futures::Stream;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::Notify;
use tokio::time::{Duration, Instant};

use crate::crd::Pet;

/// A namespace's name; `None` never comes from the API server (Pets are
/// namespaced), but an `ObjectRef` allows it.
type Namespace = Option<String>;

pub struct FairQueue {
    state: Mutex<State>,
    /// One waiter only: the stream of [`FairQueue::admitted`]. `notify_one`
    /// keeps a permit when nobody waits, so no wakeup is lost.
    wake: Notify,
    /// Pets admitted and not yet finished, at most.
    limit: usize,
}

/// A Pet handed to kube, and how long it waited for its turn.
pub struct Admitted {
    pub pet: ObjectRef<Pet>,
    pub waited: Duration,
}

#[derive(Default)]
struct State {
    /// Each with when it was first triggered.
    waiting: HashMap<Namespace, VecDeque<(ObjectRef<Pet>, Instant)>>,
    /// The namespaces with waiting Pets, in the order of their turns.
    turns: VecDeque<Namespace>,
    /// Every Pet in `waiting`, to keep each once.
    queued: HashSet<ObjectRef<Pet>>,
    /// Handed to kube, and not yet finished.
    admitted: HashSet<ObjectRef<Pet>>,
    /// Admitted Pets triggered again meanwhile, with when first.
    again: HashMap<ObjectRef<Pet>, Instant>,
}

impl State {
    /// A Pet already waiting keeps its place and its first trigger's time.
    fn enqueue(&mut self, pet: ObjectRef<Pet>, since: Instant) {
        if !self.queued.insert(pet.clone()) {
            return;
        }
        let namespace = pet.namespace.clone();
        let queue = self.waiting.entry(namespace.clone()).or_default();
        if queue.is_empty() {
            self.turns.push_back(namespace);
        }
        queue.push_back((pet, since));
    }

    /// The first Pet of the namespace whose turn it is.
    fn next_turn(&mut self) -> Option<(ObjectRef<Pet>, Instant)> {
        let namespace = self.turns.pop_front()?;
        let queue = self.waiting.get_mut(&namespace)?;
        let (pet, since) = queue.pop_front()?;
        if queue.is_empty() {
            self.waiting.remove(&namespace);
        } else {
            self.turns.push_back(namespace);
        }
        self.queued.remove(&pet);
        Some((pet, since))
    }
}

impl FairQueue {
    /// `limit`: how many Pets kube may hold at once, its concurrency.
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::default(),
            wake: Notify::new(),
            limit: limit.max(1),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Nothing here panics while holding the lock; if something did, the
        // sets are still consistent enough to go on with.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Asks for `pet` to be reconciled.
    pub fn push(&self, pet: ObjectRef<Pet>) {
        let now = Instant::now();
        let mut state = self.state();
        if state.admitted.contains(&pet) {
            state.again.entry(pet).or_insert(now);
            return;
        }
        state.enqueue(pet, now);
        drop(state);
        self.wake.notify_one();
    }

    /// A run of `pet` by kube ended (however it ended). Runs kube made on
    /// its own (retries) end here too, and are ignored.
    pub fn finished(&self, pet: &ObjectRef<Pet>) {
        let mut state = self.state();
        if !state.admitted.remove(pet) {
            return;
        }
        if let Some(since) = state.again.remove(pet) {
            state.enqueue(pet.clone(), since);
        }
        drop(state);
        self.wake.notify_one();
    }

    /// The Pets waiting for their turn.
    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.state().queued.len()
    }

    fn try_admit(&self) -> Option<Admitted> {
        let mut state = self.state();
        if state.admitted.len() >= self.limit {
            return None;
        }
        let (pet, since) = state.next_turn()?;
        state.admitted.insert(pet.clone());
        Some(Admitted {
            pet,
            waited: since.elapsed(),
        })
    }

    /// The Pets to hand to kube, in their turns, each once there is room.
    /// Never ends: end it with the controller's shutdown.
    pub fn admitted(self: Arc<Self>) -> impl Stream<Item = Admitted> {
        futures::stream::unfold(self, |queue| async move {
            loop {
                if let Some(pet) = queue.try_admit() {
                    return Some((pet, queue));
                }
                queue.wake.notified().await;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::time::Duration;

    use futures::StreamExt;

    use super::*;

    fn pet(namespace: &str, name: &str) -> ObjectRef<Pet> {
        ObjectRef::new(name).within(namespace)
    }

    /// A queue admitting `limit` at once, with the Pets `names` of one
    /// namespace pushed in this order, and its admitted stream.
    fn queue_of(
        limit: usize,
        names: &[&str],
    ) -> (
        Arc<FairQueue>,
        Pin<Box<impl Stream<Item = Admitted> + use<>>>,
    ) {
        let queue = FairQueue::new(limit);
        for name in names {
            queue.push(pet("ns", name));
        }
        let admitted = Box::pin(Arc::clone(&queue).admitted());
        (queue, admitted)
    }

    /// Takes what the queue admits now, without waiting for more.
    async fn take_now(stream: &mut (impl Stream<Item = Admitted> + Unpin)) -> Vec<Admitted> {
        let mut taken = Vec::new();
        while let Ok(Some(admitted)) =
            tokio::time::timeout(Duration::from_millis(20), stream.next()).await
        {
            taken.push(admitted);
        }
        taken
    }

    /// The `namespace/name` of each Pet admitted now.
    async fn admit_now(stream: &mut (impl Stream<Item = Admitted> + Unpin)) -> Vec<String> {
        take_now(stream)
            .await
            .into_iter()
            .map(|Admitted { pet, .. }| {
                format!("{}/{}", pet.namespace.unwrap_or_default(), pet.name)
            })
            .collect()
    }

    #[tokio::test]
    async fn a_burst_in_one_namespace_takes_turns_with_the_others() {
        let queue = FairQueue::new(4);
        for i in 0..100 {
            queue.push(pet("burst", &format!("p{i}")));
        }
        queue.push(pet("quiet", "one"));
        queue.push(pet("other", "two"));
        let mut admitted = Box::pin(Arc::clone(&queue).admitted());
        assert_eq!(
            admit_now(&mut admitted).await,
            ["burst/p0", "quiet/one", "other/two", "burst/p1"],
            "one Pet of each namespace in turn, up to the limit"
        );
        assert_eq!(queue.waiting(), 98);
    }

    #[tokio::test]
    async fn no_more_than_the_limit_is_admitted_until_a_run_finishes() {
        let (queue, mut admitted) = queue_of(2, &["a", "b", "c"]);
        assert_eq!(admit_now(&mut admitted).await, ["ns/a", "ns/b"]);
        queue.finished(&pet("ns", "a"));
        assert_eq!(admit_now(&mut admitted).await, ["ns/c"]);
    }

    #[tokio::test]
    async fn a_pet_triggered_twice_while_waiting_runs_once() {
        let (_queue, mut admitted) = queue_of(8, &["a", "a"]);
        assert_eq!(admit_now(&mut admitted).await, ["ns/a"]);
    }

    #[tokio::test]
    async fn a_pet_triggered_while_admitted_runs_again_after_that_run() {
        let (queue, mut admitted) = queue_of(8, &["a"]);
        assert_eq!(admit_now(&mut admitted).await, ["ns/a"]);
        queue.push(pet("ns", "a"));
        queue.push(pet("ns", "a"));
        assert!(
            admit_now(&mut admitted).await.is_empty(),
            "not twice at once"
        );
        queue.finished(&pet("ns", "a"));
        assert_eq!(admit_now(&mut admitted).await, ["ns/a"], "and not lost");
        queue.finished(&pet("ns", "a"));
        assert!(admit_now(&mut admitted).await.is_empty(), "and once");
    }

    /// The wait of each Pet admitted now, from its first trigger, in
    /// whole seconds.
    async fn waits_now(stream: &mut (impl Stream<Item = Admitted> + Unpin)) -> Vec<u64> {
        take_now(stream)
            .await
            .iter()
            .map(|admitted| admitted.waited.as_secs())
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn each_pet_admitted_says_how_long_it_waited_since_its_first_trigger() {
        let (queue, mut admitted) = queue_of(1, &["a", "b"]);
        assert_eq!(waits_now(&mut admitted).await, [0], "a at once");
        tokio::time::advance(Duration::from_secs(3)).await;
        // Triggered again while it waits: it keeps its first trigger's time.
        queue.push(pet("ns", "b"));
        // And a, again while it runs: from this trigger, not from its run's end.
        queue.push(pet("ns", "a"));
        tokio::time::advance(Duration::from_secs(2)).await;
        queue.finished(&pet("ns", "a"));
        assert_eq!(waits_now(&mut admitted).await, [5], "b waited 5 s");
        queue.finished(&pet("ns", "b"));
        assert_eq!(waits_now(&mut admitted).await, [2], "a waited 2 s");
    }

    #[tokio::test]
    async fn runs_kube_made_on_its_own_free_no_room() {
        let (queue, mut admitted) = queue_of(1, &["a", "b"]);
        assert_eq!(admit_now(&mut admitted).await, ["ns/a"]);
        // A retry of another Pet ended: "a" still runs.
        queue.finished(&pet("ns", "x"));
        assert!(admit_now(&mut admitted).await.is_empty());
        queue.finished(&pet("ns", "a"));
        assert_eq!(admit_now(&mut admitted).await, ["ns/b"]);
    }
}
