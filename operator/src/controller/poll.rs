//! When each in-sync Pet is next read from the store to look for drift.
//!
//! Spread: a Pet is polled once per interval at a fixed phase within it,
//! taken from a hash of its UID. However the Pets were created (20,000 in
//! two minutes, say) and however often the operator restarted, the polls
//! fall evenly over the interval, so the store sees a steady N / interval
//! reads per second instead of the creation burst repeated every interval.
//!
//! Audit: while the change feed of a Pet's store is followed, drift is
//! found from the feed within a second, and the poll only audits, at the
//! longer audit interval (see `--audit-interval`). Each store's feed counts
//! for its own Pets only: a store whose feed is down, absent or refused
//! has its Pets polled at the poll interval, whatever the other stores'
//! feeds do.
//!
//! Bound: when N / interval would exceed `max_rate`, the interval stretches
//! to N / max_rate, so the drift poll alone never asks the store for more
//! than `max_rate` reads per second on average, at any N. Bursts are bounded
//! by the controller's concurrency.
//!
//! A read begun before the feed was followed (a start, a reconnect from
//! now) may have missed a change the feed will never tell: the Pet it
//! synced is polled once more at the poll interval, not audited.
//!
//! Delivery: a Pet's next poll is kept in the controller's memory, and a
//! sweep hands the due ones to kube's controller (at most a sixtieth of the
//! interval late), rather than kube's scheduler holding an entry for every
//! Pet.

use std::collections::HashSet;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{OnceLock, PoisonError, RwLock};
use std::time::{Duration, Instant};

use kube::runtime::reflector::Store;

use crate::crd::Pet;
use crate::stores::StoreId;

/// The shortest interval used, whatever the settings say.
const MIN_INTERVAL: Duration = Duration::from_millis(100);

pub struct PollSchedule {
    interval: Duration,
    /// The interval while the change feed is followed.
    audit_interval: Duration,
    /// The operator's own store's feed is followed now.
    own_feed_live: AtomicBool,
    /// The other stores whose feeds are followed now: at most one entry per
    /// open store, removed when its follower stops.
    feeds_live: RwLock<HashSet<StoreId>>,
    /// How many times any feed started or stopped being followed: a read
    /// that saw no change of it ran while its store's feed was followed.
    feed_turns: AtomicU64,
    max_rate: f64,
    epoch: Instant,
    /// The watch cache, to count the Pets; unset until the controller runs.
    pets: OnceLock<Store<Pet>>,
}

impl PollSchedule {
    pub fn new(interval: Duration, max_rate: f64) -> Self {
        Self {
            interval: interval.max(MIN_INTERVAL),
            audit_interval: interval.max(MIN_INTERVAL),
            own_feed_live: AtomicBool::new(false),
            feeds_live: RwLock::default(),
            feed_turns: AtomicU64::new(0),
            max_rate,
            epoch: Instant::now(),
            pets: OnceLock::new(),
        }
    }

    /// The interval while the change feed is followed (never shorter than
    /// the poll interval).
    pub fn with_audit_interval(mut self, audit_interval: Duration) -> Self {
        self.audit_interval = audit_interval.max(self.interval);
        self
    }

    /// Whether the change feed of `store` is followed now.
    pub fn set_feed_live(&self, store: &StoreId, live: bool) {
        let turned = if *store == StoreId::Own {
            self.own_feed_live.swap(live, Ordering::SeqCst) != live
        } else {
            let mut feeds = self
                .feeds_live
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            if live {
                feeds.insert(store.clone())
            } else {
                feeds.remove(store)
            }
        };
        if turned {
            self.feed_turns.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Taken before a reconcile reads the store, and handed to
    /// [`PollSchedule::delay_after`] once it is done.
    pub fn mark(&self) -> FeedMark {
        FeedMark(self.feed_turns.load(Ordering::SeqCst))
    }

    /// Whether the feed of `store` is followed now; `None`, a store that
    /// cannot be told, is polled.
    fn feed_live(&self, store: Option<&StoreId>) -> bool {
        match store {
            None => false,
            Some(StoreId::Own) => self.own_feed_live.load(Ordering::Relaxed),
            Some(store) => self
                .feeds_live
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .contains(store),
        }
    }

    /// Counts Pets in this cache from now on (the first call wins).
    pub fn track(&self, pets: Store<Pet>) {
        let _ = self.pets.set(pets);
    }

    /// The Pets whose records are in `store`, of `namespace` only if
    /// given: a walk of the cache.
    pub fn pets_on(&self, store: &StoreId, namespace: Option<&str>) -> usize {
        self.pets.get().map_or(0, |pets| {
            // Allocation-free: at 100,000 Pets, building each Pet's StoreId
            // to compare made this walk the most of a recreate's time.
            pets.state()
                .iter()
                .filter(|pet| {
                    namespace.is_none_or(|ns| pet.metadata.namespace.as_deref() == Some(ns))
                })
                .filter(|pet| super::context::on_store(pet, store))
                .count()
        })
    }

    fn pet_count(&self) -> usize {
        self.pets.get().map_or(0, Store::len)
    }

    /// The interval for the Pets of `store`, stretched so that `pets` polls
    /// per interval stay within `max_rate` per second.
    pub fn interval_for(&self, store: Option<&StoreId>, pets: usize) -> Duration {
        let base = if self.feed_live(store) {
            self.audit_interval
        } else {
            self.interval
        };
        if !(self.max_rate.is_finite() && self.max_rate > 0.0) {
            return base;
        }
        let needed =
            Duration::try_from_secs_f64(pets as f64 / self.max_rate).unwrap_or(Duration::MAX);
        base.max(needed)
    }

    /// The interval in effect now for the Pets of the operator's own store
    /// (what the poll sweep and `poll_interval_seconds` follow).
    pub fn interval(&self) -> Duration {
        self.interval_for(Some(&StoreId::Own), self.pet_count())
    }

    /// How long until the Pet with this UID, on `store`, is next polled:
    /// the next time at its phase that is at least half an interval away.
    pub fn delay(&self, store: Option<&StoreId>, uid: &str) -> Duration {
        let interval = self.interval_for(store, self.pet_count());
        self.delay_at(uid, interval, Instant::now())
    }

    /// As [`PollSchedule::delay`], for a Pet whose reads began at `mark`: a
    /// feed that started being followed since cannot tell what changed
    /// between those reads and its start (its first batch counts from
    /// then), so the Pet is polled at the poll interval once more.
    pub fn delay_after(&self, store: Option<&StoreId>, uid: &str, mark: FeedMark) -> Duration {
        if self.mark() == mark {
            return self.delay(store, uid);
        }
        let interval = self.interval_for(None, self.pet_count());
        self.delay_at(uid, interval, Instant::now())
    }

    fn delay_at(&self, uid: &str, interval: Duration, now: Instant) -> Duration {
        let period = interval.as_secs_f64();
        let phase = phase(uid) * period;
        let elapsed = now.saturating_duration_since(self.epoch).as_secs_f64();
        let earliest = elapsed + period / 2.0;
        let turns = ((earliest - phase) / period).ceil();
        let at = phase + turns * period;
        Duration::try_from_secs_f64(at - elapsed).unwrap_or(interval)
    }
}

/// Which feeds were followed when a reconcile began: see
/// [`PollSchedule::mark`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FeedMark(u64);

/// A fraction in [0, 1) fixed for each UID.
fn phase(uid: &str) -> f64 {
    // DefaultHasher::new() uses fixed keys: the same phase every run.
    let mut hasher = DefaultHasher::new();
    uid.hash(&mut hasher);
    (hasher.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uid(i: usize) -> String {
        format!("6f1c0a52-0000-4000-8000-{i:012}")
    }

    #[test]
    fn next_poll_is_between_half_and_one_and_a_half_intervals_away() {
        let schedule = PollSchedule::new(Duration::from_secs(300), 100.0);
        let interval = Duration::from_secs(300);
        for i in 0..1000 {
            for offset in [0, 7, 150, 299, 1234] {
                let now = schedule.epoch + Duration::from_secs(offset);
                let delay = schedule.delay_at(&uid(i), interval, now);
                assert!(
                    delay >= interval / 2 - Duration::from_millis(1),
                    "{delay:?}"
                );
                assert!(
                    delay <= interval * 3 / 2 + Duration::from_millis(1),
                    "{delay:?}"
                );
            }
        }
    }

    #[test]
    fn each_pet_keeps_its_phase() {
        let schedule = PollSchedule::new(Duration::from_secs(60), 100.0);
        let interval = Duration::from_secs(60);
        let first = schedule.epoch + Duration::from_secs(5);
        let at = first + schedule.delay_at(&uid(7), interval, first);
        // Polled at its phase, the next poll is exactly one interval later.
        let next = at + schedule.delay_at(&uid(7), interval, at);
        let gap = next.duration_since(at).as_secs_f64();
        assert!((gap - 60.0).abs() < 1e-6, "{gap}");
    }

    #[test]
    fn polls_of_pets_created_together_are_spread_evenly() {
        // 20,000 Pets synced within the same second: their first polls land
        // in every tenth of the interval, about equally.
        let schedule = PollSchedule::new(Duration::from_secs(300), 100.0);
        let interval = Duration::from_secs(300);
        let now = schedule.epoch;
        let mut buckets = [0usize; 10];
        for i in 0..20_000 {
            let delay = schedule.delay_at(&uid(i), interval, now).as_secs_f64();
            let slot = ((delay - 150.0) / 30.0).floor().clamp(0.0, 9.0) as usize;
            buckets[slot] += 1;
        }
        for count in buckets {
            assert!((1800..=2200).contains(&count), "{buckets:?}");
        }
    }

    #[test]
    fn the_interval_stretches_to_bound_the_read_rate() {
        let schedule = PollSchedule::new(Duration::from_secs(300), 100.0);
        let own = Some(&StoreId::Own);
        assert_eq!(schedule.interval_for(own, 0), Duration::from_secs(300));
        assert_eq!(schedule.interval_for(own, 20_000), Duration::from_secs(300));
        assert_eq!(schedule.interval_for(own, 60_000), Duration::from_secs(600));
        // Without a tracked cache the configured interval holds.
        assert_eq!(schedule.interval(), Duration::from_secs(300));
        let unbounded = PollSchedule::new(Duration::from_secs(10), 0.0);
        assert_eq!(
            unbounded.interval_for(own, 1_000_000),
            Duration::from_secs(10)
        );
    }

    #[test]
    fn the_audit_interval_holds_while_the_feed_is_followed() {
        let schedule = PollSchedule::new(Duration::from_secs(300), 100.0)
            .with_audit_interval(Duration::from_secs(3600));
        let own = Some(&StoreId::Own);
        assert_eq!(schedule.interval_for(own, 1_000), Duration::from_secs(300));
        schedule.set_feed_live(&StoreId::Own, true);
        assert_eq!(schedule.interval_for(own, 1_000), Duration::from_secs(3600));
        // The read-rate bound still stretches it.
        assert_eq!(
            schedule.interval_for(own, 720_000),
            Duration::from_secs(7200)
        );
        schedule.set_feed_live(&StoreId::Own, false);
        assert_eq!(schedule.interval_for(own, 1_000), Duration::from_secs(300));
        // An audit never comes more often than the poll would.
        let short = PollSchedule::new(Duration::from_secs(300), 100.0)
            .with_audit_interval(Duration::from_secs(60));
        short.set_feed_live(&StoreId::Own, true);
        assert_eq!(short.interval_for(own, 1_000), Duration::from_secs(300));
    }

    #[test]
    fn a_read_begun_before_its_feed_was_followed_is_polled_once_more_not_audited() {
        let poll = Duration::from_secs(300);
        let schedule = PollSchedule::new(poll, 0.0).with_audit_interval(Duration::from_secs(3600));
        let own = Some(&StoreId::Own);
        let read_before = schedule.mark();
        schedule.set_feed_live(&StoreId::Own, true);
        let read_after = schedule.mark();
        assert!(schedule.delay_after(own, "uid-1", read_before) <= poll);
        assert!(schedule.delay_after(own, "uid-1", read_after) > poll);
        // Told live again while live: no turn, nothing to miss.
        schedule.set_feed_live(&StoreId::Own, true);
        assert!(schedule.delay_after(own, "uid-1", read_after) > poll);
        // Another store's feed turning counts too: rare, and cheaper than a
        // mark per store.
        schedule.set_feed_live(&StoreId::cluster("b"), true);
        assert!(schedule.delay_after(own, "uid-1", read_after) <= poll);
    }

    #[test]
    fn pets_are_counted_on_their_store_and_namespace() {
        use crate::crd::Pet;
        use kube::runtime::{reflector, watcher};
        let (cache, mut writer) = reflector::store();
        let pets = [
            ("a", "team-a", None),
            ("b", "team-a", Some("PetStore/shared")),
            ("c", "team-b", Some("PetStore/shared")),
            ("d", "team-a", Some("ClusterPetStore/shared")),
            ("e", "team-b", Some("ClusterPetStore/shared")),
        ];
        for (name, namespace, store) in pets {
            let mut pet = Pet::test().with_status(serde_json::json!({ "store": store }));
            pet.metadata.name = Some(name.into());
            pet.metadata.namespace = Some(namespace.into());
            writer.apply_watcher_event(&watcher::Event::Apply(pet));
        }
        let schedule = PollSchedule::new(Duration::from_secs(300), 100.0);
        assert_eq!(schedule.pets_on(&StoreId::Own, None), 0, "no cache yet");
        schedule.track(cache);
        let cluster = StoreId::cluster("shared");
        let team_a = StoreId::namespaced("team-a", "shared");
        // (row, store, namespace, Pets)
        let rows: [(&str, &StoreId, Option<&str>, usize); 6] = [
            ("the own store", &StoreId::Own, None, 1),
            ("a ClusterPetStore, every namespace", &cluster, None, 2),
            (
                "a ClusterPetStore, one namespace",
                &cluster,
                Some("team-b"),
                1,
            ),
            ("a PetStore is its namespace's alone", &team_a, None, 1),
            (
                "a PetStore asked for another namespace",
                &team_a,
                Some("team-b"),
                0,
            ),
            ("a namespace with none", &StoreId::Own, Some("team-b"), 0),
        ];
        for (row, store, namespace, expected) in rows {
            assert_eq!(schedule.pets_on(store, namespace), expected, "{row}");
        }
    }

    #[test]
    fn each_stores_feed_decides_the_poll_of_its_own_pets_only() {
        let poll = Duration::from_secs(300);
        let audit = Duration::from_secs(3600);
        let b = StoreId::cluster("b");
        let a_namespaced = StoreId::namespaced("team-a", "b");
        // (row, the stores whose feeds are live, the store asked, interval)
        let rows: [(&str, &[&StoreId], Option<&StoreId>, Duration); 8] = [
            ("no feed live: polled", &[], Some(&b), poll),
            ("its own feed live: audited", &[&b], Some(&b), audit),
            (
                "another store's feed live: polled",
                &[&StoreId::Own],
                Some(&b),
                poll,
            ),
            (
                "the own store's feed alone",
                &[&StoreId::Own],
                Some(&StoreId::Own),
                audit,
            ),
            (
                "b live does not audit the own store",
                &[&b],
                Some(&StoreId::Own),
                poll,
            ),
            (
                "a PetStore named like a ClusterPetStore is another store",
                &[&b],
                Some(&a_namespaced),
                poll,
            ),
            (
                "every feed live",
                &[&StoreId::Own, &b, &a_namespaced],
                Some(&a_namespaced),
                audit,
            ),
            (
                "a store that cannot be told is polled",
                &[&StoreId::Own, &b],
                None,
                poll,
            ),
        ];
        for (row, live, asked, want) in rows {
            let schedule = PollSchedule::new(poll, 100.0).with_audit_interval(audit);
            for store in live {
                schedule.set_feed_live(store, true);
            }
            assert_eq!(schedule.interval_for(asked, 1_000), want, "{row}");
            // The next poll follows the same interval: within one and a half.
            let delay = schedule.delay(asked, "uid");
            assert!(
                delay >= want / 2 && delay <= want * 3 / 2,
                "{row}: {delay:?}"
            );
        }
    }

    #[test]
    fn a_feed_that_stops_leaves_no_trace() {
        let schedule = PollSchedule::new(Duration::from_secs(300), 100.0)
            .with_audit_interval(Duration::from_secs(3600));
        for i in 0..100 {
            schedule.set_feed_live(&StoreId::cluster(&format!("s-{i}")), true);
        }
        for i in 0..100 {
            schedule.set_feed_live(&StoreId::cluster(&format!("s-{i}")), false);
        }
        let live = schedule.feeds_live.read().expect("lock").len();
        assert_eq!(live, 0, "one entry per live feed, gone with it");
        assert_eq!(
            schedule.interval_for(Some(&StoreId::cluster("s-7")), 1_000),
            Duration::from_secs(300)
        );
    }
}
