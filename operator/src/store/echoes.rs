//! The operator's own writes, expected back on the store's change feed.
//!
//! Every write the operator makes comes back as a change. Telling such an
//! echo apart by finding its Pet would cost a pass over every Pet per change
//! (measured: a quarter of the operator's CPU while converging 5,000 Pets).
//! So each write notes what it expects to see, by record ID, or by key for a
//! create (whose ID the store picks), and the matching change is an echo in
//! O(1). Only a change nobody expected, or one that differs from what was
//! written, goes on to find its Pet.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::{Owner, PetData, RecordChange};

/// An expectation unmet for this long is dropped: its write changed nothing
/// (the store then sends no change), or failed.
const EXPECTED_FOR: Duration = Duration::from_secs(30);
/// Expired expectations are swept once there are this many.
const SWEEP_ABOVE: usize = 1024;
/// Writes to one record expected at once: an adoption's claim and update
/// need two. Beyond this the oldest goes, so a record whose changes never
/// match (a store that rewrites what it is sent) holds no more.
const PER_RECORD: usize = 4;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Expected {
    /// The record with this data (any key).
    Data(PetData),
    /// The record with this key (any data).
    Key(Owner),
    Deleted,
}

#[derive(Default)]
pub struct Echoes {
    /// Only while the feed is followed; otherwise nothing would meet them.
    enabled: AtomicBool,
    expected: Mutex<Expectations>,
}

#[derive(Default)]
struct Expectations {
    /// In the order written: an adoption claims a record and then updates
    /// it, and the claim's change comes first. One slot per ID let the
    /// update's expectation replace the claim's, whose change then read as
    /// a drift.
    by_id: HashMap<String, Vec<(Expected, Instant)>>,
    /// Creates: by idempotency key, with the data sent.
    by_key: HashMap<String, (PetData, Instant)>,
    swept: Option<Instant>,
}

impl Echoes {
    pub fn set_enabled(&self, enabled: bool) {
        self.enabled.store(enabled, Ordering::Relaxed);
        if !enabled {
            let mut expected = self.expected();
            expected.by_id.clear();
            expected.by_key.clear();
        }
    }

    fn expected(&self) -> MutexGuard<'_, Expectations> {
        // Plain maps; a panic elsewhere cannot leave them inconsistent.
        self.expected.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    pub fn create(&self, key: &str, data: &PetData) {
        if self.enabled() && !key.is_empty() {
            let mut expected = self.expected();
            expected
                .by_key
                .insert(key.to_owned(), (data.clone(), Instant::now()));
            expected.sweep();
        }
    }

    pub fn update(&self, id: &str, data: &PetData) {
        self.by_id(id, Expected::Data(data.clone()));
    }

    /// A create answered that its key or identity named a record already:
    /// it made no change to expect. Left, the expectation would take a
    /// later change someone else made to that record, with the same data,
    /// for our own.
    pub fn nothing_created(&self, key: &str) {
        if self.enabled() {
            self.expected().by_key.remove(key);
        }
    }

    pub fn delete(&self, id: &str) {
        self.by_id(id, Expected::Deleted);
    }

    pub fn set_key(&self, id: &str, key: &str) {
        self.by_id(id, Expected::Key(Owner::parse(key)));
    }

    fn by_id(&self, id: &str, what: Expected) {
        if self.enabled() {
            let mut expected = self.expected();
            let writes = expected.by_id.entry(id.to_owned()).or_default();
            if writes.len() == PER_RECORD {
                writes.remove(0);
            }
            writes.push((what, Instant::now()));
            expected.sweep();
        }
    }

    /// Whether `change` is what one of our writes expected; it is then
    /// expected no more.
    pub fn is_echo(&self, change: &RecordChange) -> bool {
        let mut expected = self.expected();
        if let Some(writes) = expected.by_id.get_mut(&change.id) {
            let met = writes
                .iter()
                .position(|(what, _)| match (what, &change.record) {
                    (Expected::Deleted, None) => true,
                    (Expected::Data(data), Some(record)) => record.data == *data,
                    (Expected::Key(key), Some(record)) => record.key == *key,
                    _ => false,
                });
            if let Some(met) = met {
                writes.remove(met);
                if writes.is_empty() {
                    expected.by_id.remove(&change.id);
                }
                return true;
            }
        }
        if let Some(record) = &change.record
            && !record.key.is_nobody()
            && let key = record.key.to_string()
            && let Some((data, _)) = expected.by_key.get(&key)
            && record.data == *data
        {
            expected.by_key.remove(&key);
            return true;
        }
        false
    }
}

impl Expectations {
    fn sweep(&mut self) {
        if self.by_id.len() + self.by_key.len() < SWEEP_ABOVE
            || self.swept.is_some_and(|at| at.elapsed() < EXPECTED_FOR)
        {
            return;
        }
        let now = Instant::now();
        self.by_id.retain(|_, writes| {
            writes.retain(|(_, at)| now.duration_since(*at) < EXPECTED_FOR);
            !writes.is_empty()
        });
        self.by_key
            .retain(|_, (_, at)| now.duration_since(*at) < EXPECTED_FOR);
        self.swept = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Echoes as while the change feed is followed.
    fn followed() -> Echoes {
        let echoes = Echoes::default();
        echoes.set_enabled(true);
        echoes
    }

    #[test]
    fn each_write_meets_its_own_change_once() {
        let echoes = followed();
        echoes.create("uid-1", &PetData::named("Tron"));
        echoes.update("r-2", &PetData::named("Thor"));
        echoes.set_key("r-3", "");
        echoes.delete("r-4");
        assert!(echoes.is_echo(&RecordChange::changed("r-1", "uid-1", "Tron")));
        assert!(echoes.is_echo(&RecordChange::changed("r-2", "uid-2", "Thor")));
        assert!(echoes.is_echo(&RecordChange::changed("r-3", "", "Rex")));
        let deleted = RecordChange::deleted("r-4");
        assert!(echoes.is_echo(&deleted));
        // Met once: the same change again is someone else's.
        assert!(!echoes.is_echo(&RecordChange::changed("r-2", "uid-2", "Thor")));
        assert!(!echoes.is_echo(&deleted));
    }

    #[test]
    fn a_claim_and_the_update_after_it_each_meet_their_own_change() {
        let echoes = followed();
        // An adoption: the record's key claimed, then its data put right,
        // both noted before the feed brings the claim's change.
        echoes.set_key("r-1", "uid-new");
        echoes.update("r-1", &PetData::named("Luna"));
        assert!(
            echoes.is_echo(&RecordChange::changed("r-1", "uid-new", "Bo")),
            "the claim's change, the data not yet put right"
        );
        assert!(echoes.is_echo(&RecordChange::changed("r-1", "uid-new", "Luna")));
        assert!(!echoes.is_echo(&RecordChange::changed("r-1", "uid-new", "Luna")));
    }

    #[test]
    fn a_record_holds_a_few_expected_writes_at_most() {
        let echoes = followed();
        for name in ["A", "B", "C", "D", "E"] {
            echoes.update("r-1", &PetData::named(name));
        }
        assert!(
            !echoes.is_echo(&RecordChange::changed("r-1", "uid-1", "A")),
            "the oldest went"
        );
        for name in ["B", "C", "D", "E"] {
            assert!(echoes.is_echo(&RecordChange::changed("r-1", "uid-1", name)));
        }
    }

    #[test]
    fn a_change_unlike_the_write_is_not_an_echo() {
        let echoes = followed();
        echoes.update("r-2", &PetData::named("Thor"));
        echoes.create("uid-1", &PetData::named("Tron"));
        // Renamed by someone else right after our write.
        assert!(!echoes.is_echo(&RecordChange::changed("r-2", "uid-2", "Loki")));
        assert!(!echoes.is_echo(&RecordChange::changed("r-9", "uid-1", "Loki")));
        // Deleted where we updated.
        let deleted = RecordChange::deleted("r-2");
        assert!(!echoes.is_echo(&deleted));
    }

    #[test]
    fn a_create_that_made_nothing_expects_nothing() {
        let echoes = followed();
        echoes.create("uid-1", &PetData::named("Tron"));
        echoes.nothing_created("uid-1");
        // Someone else's edit of the record found, to the data sent.
        assert!(!echoes.is_echo(&RecordChange::changed("r-1", "uid-1", "Tron")));
    }

    #[test]
    fn nothing_is_expected_while_the_feed_is_not_followed() {
        let echoes = Echoes::default();
        echoes.update("r-2", &PetData::named("Thor"));
        assert!(!echoes.is_echo(&RecordChange::changed("r-2", "uid-2", "Thor")));
        echoes.set_enabled(true);
        echoes.update("r-2", &PetData::named("Thor"));
        echoes.set_enabled(false);
        assert!(!echoes.is_echo(&RecordChange::changed("r-2", "uid-2", "Thor")));
    }
}
