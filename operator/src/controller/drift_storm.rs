//! The brake on drift storms: when many of a store's records drift at
//! once, the store itself is the likelier culprit (restored from an old
//! backup, come back empty, or briefly serving wrong data), and writing
//! every Pet back would overwrite or duplicate what is really there. So
//! once more than a share of a store's Pets (and at least a minimum) have
//! drifted within a window, drift-caused writes to that store stop: each
//! Pet shows the plan it would write, with the reason `DriftStorm`, and
//! writes it only once the plan is approved (the approve-plan annotation).
//!
//! The storm ends once no new Pet of the store drifted for a whole window.
//! A Pet held during a storm stays held until its plan is approved (its
//! Synced condition says `DriftStorm`, which survives restarts); only new
//! drift is written again by itself.
//!
//! Memory: one entry per Pet that drifted within the last window, per store
//! with recent drift; a calm store holds nothing.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::stores::StoreId;

/// When a store's drift is a storm: more than `share` of its Pets, and at
/// least `min`, drifted within `window`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StormThreshold {
    pub share: f64,
    pub min: usize,
    pub window: Duration,
}

impl StormThreshold {
    /// 5% of a store's Pets and at least 50, within 60 s.
    pub const DEFAULT: Self = Self {
        share: 0.05,
        min: 50,
        window: Duration::from_secs(60),
    };

    /// A `min` of 0 turns the brake off.
    fn enabled(&self) -> bool {
        self.min > 0
    }

    /// How many drifted Pets make a storm on a store of `pets` Pets.
    fn trips_at(&self, pets: usize) -> usize {
        let share = (self.share.max(0.0) * pets as f64).floor() as usize + 1;
        share.max(self.min)
    }
}

#[derive(Default)]
struct StoreDrift {
    /// Each Pet that drifted, by UID, and when it was first seen to.
    drifted: HashMap<String, Instant>,
    /// When the storm began; `None` while calm.
    storm_since: Option<Instant>,
    /// When a Pet not seen before last drifted.
    last_new: Option<Instant>,
    /// The store's Pets, as last counted, and when: counted only once
    /// enough Pets drifted to matter, and at most once a second.
    pets: Option<(usize, Instant)>,
    /// The records the store lost at once, if it came back empty.
    emptied: Option<usize>,
}

pub struct DriftStorms {
    threshold: StormThreshold,
    stores: Mutex<HashMap<StoreId, StoreDrift>>,
}

/// What noticing one drift found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Storm {
    Calm,
    /// Writing to the store is braked; `drifted` Pets drifted in the
    /// window, of `pets`.
    Braking {
        drifted: usize,
        pets: usize,
    },
}

impl DriftStorms {
    pub fn new(threshold: StormThreshold) -> Self {
        Self {
            threshold,
            stores: Mutex::default(),
        }
    }

    fn stores(&self) -> MutexGuard<'_, HashMap<StoreId, StoreDrift>> {
        // Plain values; a panic elsewhere cannot leave them half-written.
        self.stores.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A Pet of `store` is about to write because its record drifted: is
    /// the store in a storm, this drift included? `count_pets` counts the
    /// store's Pets (a walk of the cache), called only when the minimum
    /// has drifted.
    pub fn noticed(
        &self,
        store: &StoreId,
        uid: &str,
        count_pets: impl FnOnce() -> usize,
        now: Instant,
    ) -> Storm {
        if !self.threshold.enabled() {
            return Storm::Calm;
        }
        let window = self.threshold.window;
        let mut stores = self.stores();
        let drift = stores.entry(store.clone()).or_default();
        Self::expire(drift, window, now);
        if !drift.drifted.contains_key(uid) {
            drift.drifted.insert(uid.to_owned(), now);
            drift.last_new = Some(now);
        }
        let drifted = drift.drifted.len().max(drift.emptied.unwrap_or(0));
        if drift.storm_since.is_none() && drifted < self.threshold.min {
            return Storm::Calm;
        }
        let pets = match drift.pets {
            Some((pets, at)) if now.saturating_duration_since(at) < Duration::from_secs(1) => pets,
            _ => {
                let pets = count_pets();
                drift.pets = Some((pets, now));
                pets
            }
        };
        if drift.storm_since.is_none() && drifted >= self.threshold.trips_at(pets) {
            drift.storm_since = Some(now);
        }
        match drift.storm_since {
            Some(_) => Storm::Braking { drifted, pets },
            None => Storm::Calm,
        }
    }

    /// The store holds none of its `pets` Pets' records (it came back
    /// empty): a storm now, whatever has drifted so far.
    pub fn declare(&self, store: &StoreId, pets: usize, now: Instant) -> Storm {
        if !self.threshold.enabled() {
            return Storm::Calm;
        }
        let mut stores = self.stores();
        let drift = stores.entry(store.clone()).or_default();
        drift.storm_since.get_or_insert(now);
        drift.last_new = Some(now);
        drift.pets = Some((pets, now));
        drift.emptied = Some(pets);
        Storm::Braking {
            drifted: pets,
            pets,
        }
    }

    /// Ends a storm whose store has had no new drift for a window, and
    /// forgets drift older than a window while calm.
    fn expire(drift: &mut StoreDrift, window: Duration, now: Instant) {
        let quiet = drift
            .last_new
            .is_none_or(|last| now.saturating_duration_since(last) >= window);
        if drift.storm_since.is_some() && quiet {
            drift.storm_since = None;
            drift.emptied = None;
            drift.drifted.clear();
        }
        if drift.storm_since.is_none() {
            drift
                .drifted
                .retain(|_, seen| now.saturating_duration_since(*seen) < window);
        }
    }

    /// The stores braking now, with the Pets drifted in their storm; calm
    /// stores with nothing left to remember are dropped.
    pub fn braking(&self, now: Instant) -> Vec<(StoreId, usize)> {
        let window = self.threshold.window;
        let mut stores = self.stores();
        stores.retain(|_, drift| {
            Self::expire(drift, window, now);
            !drift.drifted.is_empty() || drift.storm_since.is_some()
        });
        stores
            .iter()
            .filter(|(_, drift)| drift.storm_since.is_some())
            .map(|(store, drift)| {
                let drifted = drift.drifted.len().max(drift.emptied.unwrap_or(0));
                (store.clone(), drifted)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    fn storms(min: usize) -> DriftStorms {
        DriftStorms::new(StormThreshold {
            min,
            ..StormThreshold::DEFAULT
        })
    }

    #[test]
    fn a_storm_needs_both_the_share_and_the_minimum() {
        let t = StormThreshold::DEFAULT;
        // 5% of 20,000 is 1,000: more than that trips it.
        assert_eq!(t.trips_at(20_000), 1_001);
        // Few Pets: the minimum decides.
        assert_eq!(t.trips_at(100), 50);
        assert_eq!(t.trips_at(0), 50);
    }

    #[test]
    fn drift_below_the_threshold_is_calm_and_forgotten_after_a_window() {
        let storms = storms(3);
        let own = StoreId::Own;
        let start = Instant::now();
        assert_eq!(storms.noticed(&own, "a", || 10, start), Storm::Calm);
        assert_eq!(storms.noticed(&own, "b", || 10, start), Storm::Calm);
        // The same Pet again is not new drift.
        assert_eq!(
            storms.noticed(&own, "b", || 10, start + SECOND),
            Storm::Calm
        );
        // A window later the first two are forgotten.
        let later = start + 61 * SECOND;
        assert_eq!(storms.noticed(&own, "c", || 10, later), Storm::Calm);
        assert!(storms.braking(later).is_empty());
    }

    #[test]
    fn a_storm_brakes_its_store_only_until_a_window_passes_without_new_drift() {
        let storms = storms(3);
        let own = StoreId::Own;
        let other = StoreId::cluster("other");
        let start = Instant::now();
        storms.noticed(&own, "a", || 10, start);
        storms.noticed(&own, "b", || 10, start);
        assert_eq!(
            storms.noticed(&own, "c", || 10, start + SECOND),
            Storm::Braking {
                drifted: 3,
                pets: 10
            }
        );
        // Another store is not braked by it.
        assert_eq!(
            storms.noticed(&other, "x", || 10, start + SECOND),
            Storm::Calm
        );
        assert_eq!(storms.braking(start + SECOND), vec![(own.clone(), 3)]);
        // A held Pet seen again keeps braking, but adds no new drift.
        let later = start + 40 * SECOND;
        assert!(matches!(
            storms.noticed(&own, "a", || 10, later),
            Storm::Braking { drifted: 3, .. }
        ));
        // A window after the last new drift, the storm is over.
        let calm = start + SECOND + 61 * SECOND;
        assert!(storms.braking(calm).is_empty());
        assert_eq!(storms.noticed(&own, "d", || 10, calm), Storm::Calm);
    }

    #[test]
    fn a_store_come_back_empty_is_a_storm_at_once() {
        let storms = storms(50);
        let now = Instant::now();
        assert_eq!(
            storms.declare(&StoreId::Own, 60, now),
            Storm::Braking {
                drifted: 60,
                pets: 60
            }
        );
        assert!(matches!(
            storms.noticed(&StoreId::Own, "a", || 60, now),
            Storm::Braking { .. }
        ));
        assert_eq!(storms.braking(now), vec![(StoreId::Own, 60)]);
    }

    #[test]
    fn a_minimum_of_zero_turns_the_brake_off() {
        let storms = storms(0);
        let now = Instant::now();
        for uid in ["a", "b", "c", "d"] {
            assert_eq!(storms.noticed(&StoreId::Own, uid, || 4, now), Storm::Calm);
        }
        assert_eq!(storms.declare(&StoreId::Own, 4, now), Storm::Calm);
        assert!(storms.braking(now).is_empty());
    }
}
