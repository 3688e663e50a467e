//! What the controller remembers about each Pet between its reconciles, in
//! one entry per Pet UID: how often it has failed in a row (its backoff) and
//! when it was last found in sync (so the reconcile its own status write
//! triggers can skip the store). Keyed by UID, so a Pet deleted and created
//! again under its name starts clean.
//!
//! An entry exists only while there is something to remember, and goes with
//! its Pet: when a reconcile lets the Pet go, when the watch reports it
//! deleted, and when a relist no longer shows it. A reconcile that ends
//! after its Pet went (the watch can report the deletion meanwhile) does not
//! bring the entry back: a new entry is made only for a Pet still in the
//! watch cache.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Instant;

use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::crd::Pet;

#[derive(Default)]
pub struct Memory {
    pets: Mutex<HashMap<String, Remembered>>,
    /// The watch cache; unset until the controller runs (and in tests).
    cache: OnceLock<Store<Pet>>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Remembered {
    /// Consecutive failures.
    failures: u32,
    /// The generation last found in sync, and when.
    synced: Option<Synced>,
}

/// A generation found in sync (its status written), and when.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Synced {
    pub generation: Option<i64>,
    pub at: Instant,
}

impl Memory {
    /// Checks new entries against this cache from now on (the first call
    /// wins).
    pub fn track(&self, cache: Store<Pet>) {
        let _ = self.cache.set(cache);
    }

    fn pets(&self) -> MutexGuard<'_, HashMap<String, Remembered>> {
        // Entries are plain values; a panic elsewhere cannot corrupt them.
        self.pets.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn synced(&self, uid: &str) -> Option<Synced> {
        self.pets().get(uid)?.synced
    }

    pub fn failures(&self, uid: &str) -> u32 {
        self.pets().get(uid).map_or(0, |pet| pet.failures)
    }

    /// The Pet's generation was found in sync and its status written now:
    /// its failures are over.
    pub fn in_sync(&self, pet: &Pet, uid: &str, generation: Option<i64>) {
        self.update(pet, uid, |remembered| {
            *remembered = Remembered {
                failures: 0,
                synced: Some(Synced {
                    generation,
                    at: Instant::now(),
                }),
            };
        });
    }

    /// The reconcile failed and is retried: returns the failures in a row.
    pub fn failed(&self, pet: &Pet, uid: &str) -> u32 {
        let mut failures = 1;
        self.update(pet, uid, |remembered| {
            remembered.failures = remembered.failures.saturating_add(1);
            remembered.synced = None;
            failures = remembered.failures;
        });
        failures
    }

    /// The reconcile had nothing to do: any failures are over.
    pub fn succeeded(&self, uid: &str) {
        let mut pets = self.pets();
        if let Some(remembered) = pets.get_mut(uid) {
            remembered.failures = 0;
            if *remembered == Remembered::default() {
                pets.remove(uid);
            }
        }
    }

    /// The Pet is gone or let go, or held: nothing to remember.
    pub fn forget(&self, uid: &str) {
        self.pets().remove(uid);
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
        let live: HashSet<String> = cache.state().iter().filter_map(|pet| pet.uid()).collect();
        self.pets().retain(|uid, _| live.contains(uid));
    }

    /// How many Pets are remembered.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.pets().len()
    }

    fn update(&self, pet: &Pet, uid: &str, change: impl FnOnce(&mut Remembered)) {
        let mut pets = self.pets();
        if let Some(remembered) = pets.get_mut(uid) {
            change(remembered);
            if *remembered == Remembered::default() {
                pets.remove(uid);
            }
            return;
        }
        let mut remembered = Remembered::default();
        change(&mut remembered);
        // Under the lock: the watch removes a deleted Pet from the cache
        // before it forgets the Pet, so either this sees it gone or the
        // forgetting comes after.
        if remembered != Remembered::default() && self.is_cached(pet) {
            pets.insert(uid.to_owned(), remembered);
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

    #[test]
    fn one_entry_per_pet_only_while_there_is_something_to_remember() {
        let memory = Memory::default();
        let thor = pet("thor");
        assert_eq!(memory.failed(&thor, "thor"), 1);
        assert_eq!(memory.failed(&thor, "thor"), 2);
        assert_eq!(memory.failures("thor"), 2);
        memory.in_sync(&thor, "thor", Some(3));
        assert_eq!(memory.failures("thor"), 0, "a sync ends the failures");
        assert_eq!(memory.synced("thor").map(|s| s.generation), Some(Some(3)));
        memory.succeeded("thor");
        assert!(
            memory.synced("thor").is_some(),
            "nothing to do keeps the sync"
        );
        memory.failed(&thor, "thor");
        assert_eq!(memory.synced("thor"), None, "a failure ends the sync");
        memory.forget("thor");
        assert_eq!(memory.len(), 0);
        memory.failed(&thor, "thor");
        memory.succeeded("thor");
        assert_eq!(memory.len(), 0, "nothing left to remember");
    }

    #[test]
    fn a_pet_that_went_is_not_remembered_again() {
        let memory = Memory::default();
        let (cache, mut writer) = reflector::store();
        memory.track(cache);
        let thor = pet("thor");
        writer.apply_watcher_event(&watcher::Event::Apply(thor.clone()));
        memory.failed(&thor, "thor");
        assert_eq!(memory.len(), 1);

        // Deleted while a reconcile was in flight: the watch removes it from
        // the cache and forgets it, and the reconcile ends after.
        writer.apply_watcher_event(&watcher::Event::Delete(thor.clone()));
        memory.forget("thor");
        memory.failed(&thor, "thor");
        memory.in_sync(&thor, "thor", Some(1));
        assert_eq!(memory.len(), 0);
    }

    #[test]
    fn a_relist_forgets_the_pets_deleted_while_the_watch_was_down() {
        let memory = Memory::default();
        let (cache, mut writer) = reflector::store();
        memory.track(cache);
        let (thor, loki) = (pet("thor"), pet("loki"));
        for pet in [&thor, &loki] {
            writer.apply_watcher_event(&watcher::Event::Apply(pet.clone()));
            memory.failed(pet, pet.metadata.uid.as_deref().expect("uid"));
        }
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitApply(loki.clone()));
        writer.apply_watcher_event(&watcher::Event::InitDone);
        memory.forget_all_but_cached();
        assert_eq!(memory.failures("thor"), 0);
        assert_eq!(memory.failures("loki"), 1);
        assert_eq!(memory.len(), 1);
    }
}
