//! The change feed every backend publishes to: the store's revision and a
//! bounded, in-memory window of its latest changes, which `WatchPets`
//! streams read. Backends decide revisions (in the same write as the change,
//! so they are durable where the store is); the feed only keeps and
//! announces them.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::watch;

use crate::model::PetRecord;

/// Changes kept by default: at about 300 bytes each in memory, 30 MB when
/// the window is full.
pub const DEFAULT_HISTORY: usize = 100_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangeKind {
    Created,
    Updated,
    Deleted,
    KeyChanged,
}

impl ChangeKind {
    /// The number a stored change keeps (the wire's `PetChange.Kind`).
    pub(crate) fn code(self) -> i16 {
        match self {
            Self::Created => 1,
            Self::Updated => 2,
            Self::Deleted => 3,
            Self::KeyChanged => 4,
        }
    }

    pub(crate) fn from_code(code: i16) -> Option<Self> {
        Some(match code {
            1 => Self::Created,
            2 => Self::Updated,
            3 => Self::Deleted,
            4 => Self::KeyChanged,
            _ => return None,
        })
    }
}

/// One change to one record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub revision: i64,
    pub kind: ChangeKind,
    pub id: String,
    /// The record after the change; for a deletion, the record as it was
    /// just before. `None` only for a deletion read from history written by
    /// a store older than this one.
    pub record: Option<PetRecord>,
}

/// A change whose revision is not decided yet: a backend collects these
/// while it applies a write, then numbers them in the same transaction.
#[derive(Clone, Debug)]
pub(crate) struct PendingChange {
    pub kind: ChangeKind,
    pub id: String,
    pub record: Option<PetRecord>,
}

impl PendingChange {
    pub(crate) fn of(kind: ChangeKind, record: &PetRecord) -> Self {
        Self {
            kind,
            id: record.id.clone(),
            record: Some(record.clone()),
        }
    }

    /// The deletion of `record`, which the change carries as it was just
    /// before, so a watcher can tell whose record went (its key, its
    /// identity), not only its ID.
    pub(crate) fn deleted(record: PetRecord) -> Self {
        Self {
            kind: ChangeKind::Deleted,
            id: record.id.clone(),
            record: Some(record),
        }
    }

    pub(crate) fn at(self, revision: i64) -> Change {
        Change {
            revision,
            kind: self.kind,
            id: self.id,
            record: self.record,
        }
    }
}

/// Why the feed cannot serve a watcher from `after`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FeedError {
    #[error(
        "after_revision {after} is compacted: history starts after revision {compacted_through}; re-read and watch from the current revision"
    )]
    Compacted { after: i64, compacted_through: i64 },
    #[error("after_revision {after} is newer than the store's revision {current}")]
    Ahead { after: i64, current: i64 },
    #[error("after_revision {after} is negative")]
    Negative { after: i64 },
}

struct History {
    changes: VecDeque<Arc<Change>>,
    /// Every revision up to this one has been dropped from the window.
    compacted_through: i64,
}

pub struct ChangeFeed {
    history: Mutex<History>,
    capacity: usize,
    /// The latest published revision; watchers wait on it.
    revision: watch::Sender<i64>,
}

impl std::fmt::Debug for ChangeFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChangeFeed")
            .field("revision", &self.current())
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

impl ChangeFeed {
    /// A feed at `revision`, holding `recent` (ascending, the newest ending
    /// at or before `revision`) as its window. Revisions before the window
    /// count as compacted.
    pub fn new(capacity: usize, revision: i64, recent: Vec<Change>) -> Self {
        let capacity = capacity.max(1);
        let skip = recent.len().saturating_sub(capacity);
        let changes: VecDeque<Arc<Change>> = recent.into_iter().skip(skip).map(Arc::new).collect();
        let compacted_through = changes.front().map_or(revision, |first| first.revision - 1);
        Self {
            history: Mutex::new(History {
                changes,
                compacted_through,
            }),
            capacity,
            revision: watch::Sender::new(revision),
        }
    }

    /// How many changes the window keeps.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    fn history(&self) -> std::sync::MutexGuard<'_, History> {
        // Every update below leaves `History` whole before it can panic.
        self.history.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn current(&self) -> i64 {
        *self.revision.borrow()
    }

    /// Wakes when the revision moves.
    pub fn subscribe(&self) -> watch::Receiver<i64> {
        self.revision.subscribe()
    }

    /// Appends committed changes, in revision order. A backend calls it in
    /// commit order, so revisions arrive ascending; one that does not is a
    /// bug, logged and skipped rather than breaking every watcher's order.
    pub fn publish(&self, changes: impl IntoIterator<Item = Change>) {
        let mut history = self.history();
        let mut latest = self.current();
        for change in changes {
            if change.revision <= latest {
                tracing::error!(
                    revision = change.revision,
                    latest,
                    "change published out of order; skipped"
                );
                continue;
            }
            if change.revision > latest + 1 {
                // Revisions are gapless, so the missing ones were compacted
                // before this replica read them (PostgreSQL drops old rows
                // in the writer's transaction). No start at or before them
                // can be served whole: a watcher there must re-read.
                history.changes.clear();
                history.compacted_through = change.revision - 1;
            }
            latest = change.revision;
            history.changes.push_back(Arc::new(change));
            while history.changes.len() > self.capacity {
                if let Some(dropped) = history.changes.pop_front() {
                    history.compacted_through = dropped.revision;
                }
            }
        }
        drop(history);
        self.revision.send_if_modified(|revision| {
            let moved = *revision != latest;
            *revision = latest;
            moved
        });
    }

    /// Checks where a new watcher starts: 0 is now, else a revision within
    /// the window (or the current one).
    pub fn start(&self, after: i64) -> Result<i64, FeedError> {
        let current = self.current();
        match after {
            0 => Ok(current),
            after if after < 0 => Err(FeedError::Negative { after }),
            after if after > current => Err(FeedError::Ahead { after, current }),
            after => {
                self.read_after(after, 0)?;
                Ok(after)
            }
        }
    }

    /// Up to `max` changes after revision `after`, oldest first.
    pub fn read_after(&self, after: i64, max: usize) -> Result<Vec<Arc<Change>>, FeedError> {
        let history = self.history();
        if after < history.compacted_through {
            return Err(FeedError::Compacted {
                after,
                compacted_through: history.compacted_through,
            });
        }
        let start = history
            .changes
            .partition_point(|change| change.revision <= after);
        Ok(history.changes.range(start..).take(max).cloned().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(revision: i64) -> Change {
        Change {
            revision,
            kind: ChangeKind::Deleted,
            id: format!("pet-{revision}"),
            record: None,
        }
    }

    fn revisions(changes: &[Arc<Change>]) -> Vec<i64> {
        changes.iter().map(|c| c.revision).collect()
    }

    #[test]
    fn keeps_the_newest_changes_and_refuses_older_starts() {
        let feed = ChangeFeed::new(3, 0, Vec::new());
        feed.publish((1..=5).map(change));
        assert_eq!(feed.current(), 5);
        assert_eq!(revisions(&feed.read_after(2, 10).expect("kept")), [3, 4, 5]);
        assert_eq!(revisions(&feed.read_after(3, 1).expect("kept")), [4]);
        assert_eq!(
            feed.read_after(1, 10),
            Err(FeedError::Compacted {
                after: 1,
                compacted_through: 2
            })
        );
        assert_eq!(feed.start(0), Ok(5));
        assert_eq!(feed.start(5), Ok(5));
        assert_eq!(
            feed.start(6),
            Err(FeedError::Ahead {
                after: 6,
                current: 5
            })
        );
        assert_eq!(feed.start(-1), Err(FeedError::Negative { after: -1 }));
    }

    #[test]
    fn a_reopened_feed_starts_at_its_window() {
        let feed = ChangeFeed::new(10, 9, (7..=9).map(change).collect());
        assert_eq!(revisions(&feed.read_after(6, 10).expect("kept")), [7, 8, 9]);
        assert!(feed.read_after(5, 10).is_err());
        let empty = ChangeFeed::new(10, 9, Vec::new());
        assert!(empty.read_after(9, 10).expect("current").is_empty());
        assert!(empty.read_after(8, 10).is_err());
    }

    #[test]
    fn revisions_compacted_before_they_were_read_refuse_starts_before_them() {
        // A replica read revision 1, then found 4 to 6: 2 and 3 were
        // compacted in between. A watcher after 1 would miss them.
        let feed = ChangeFeed::new(3, 0, Vec::new());
        feed.publish([change(1)]);
        feed.publish((4..=6).map(change));
        assert_eq!(
            feed.read_after(1, 10),
            Err(FeedError::Compacted {
                after: 1,
                compacted_through: 3
            })
        );
        assert_eq!(revisions(&feed.read_after(3, 10).expect("kept")), [4, 5, 6]);
    }

    #[test]
    fn out_of_order_changes_are_skipped() {
        let feed = ChangeFeed::new(10, 0, Vec::new());
        feed.publish([change(1), change(2)]);
        feed.publish([change(2), change(3)]);
        assert_eq!(revisions(&feed.read_after(0, 10).expect("kept")), [1, 2, 3]);
    }
}
