//! One storage contract, several engines. The gRPC layer only sees
//! [`Storage`]; the same conformance tests run against every backend.

mod codec;
mod durable;
mod feed;
mod memory;
mod postgres;

use std::borrow::Cow;
use std::path::PathBuf;
use std::sync::Arc;

pub use durable::DurableStorage;
pub use feed::{Change, ChangeFeed, ChangeKind, DEFAULT_HISTORY, FeedError};
pub use memory::MemoryStorage;
pub use postgres::{PostgresConfig, PostgresStorage};

use crate::model::{
    Added, ClaimOutcome, InstallationClaim, KeyChange, NewPet, PetRecord, PetUpdate, SearchFilter,
};

#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// An update named a pet that does not exist; nothing was changed.
    #[error("no pet with ID {id:?}")]
    NotFound { index: usize, id: String },
    /// A key change found another key than the caller expected; nothing was
    /// changed.
    #[error("pet {id:?} has key {actual:?}, not the expected {expected:?}")]
    KeyMismatch {
        index: usize,
        id: String,
        expected: String,
        actual: String,
    },
    /// A key change would give a key that another pet already holds; nothing
    /// was changed.
    #[error("key {key:?} already belongs to another pet")]
    KeyTaken { index: usize, key: String },
    /// A key change would give an identity that another pet already holds;
    /// nothing was changed.
    #[error("identity {identity:?} already belongs to another pet")]
    IdentityTaken { index: usize, identity: String },
    #[error("storage engine failed while {action}: {source}")]
    Engine {
        action: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("storage writer has stopped")]
    WriterGone,
}

impl StorageError {
    pub(crate) fn engine(
        action: &'static str,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self::Engine {
            action,
            source: source.into(),
        }
    }
}

/// Names what the store was doing when its engine failed, as
/// `.or_engine("reading the name index")?`: the action appears in the error.
pub(crate) trait OrEngine<T> {
    fn or_engine(self, action: &'static str) -> Result<T, StorageError>;
}

impl<T, E> OrEngine<T> for Result<T, E>
where
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn or_engine(self, action: &'static str) -> Result<T, StorageError> {
        self.map_err(|source| StorageError::engine(action, source))
    }
}

/// A pet store backend. Every write is atomic: it applies whole or not at all.
/// Batches are borrowed: the caller keeps its request, and a backend copies
/// only what it stores.
#[tonic::async_trait]
pub trait Storage: Send + Sync + 'static {
    /// Adds pets and returns their IDs in order. A pet whose idempotency key is
    /// already stored (or appears earlier in the same batch) gets the existing
    /// ID, marked as not created, and is not added again; failing that, the
    /// same for its identity.
    async fn add(&self, pets: &[NewPet]) -> Result<Vec<Added>, StorageError>;
    /// Replaces the fields of existing pets; fails with `NotFound`, changing
    /// nothing, if any ID is unknown.
    async fn update(&self, pets: &[PetUpdate]) -> Result<(), StorageError>;
    /// Deletes pets (freeing their keys and identities); unknown IDs are
    /// ignored.
    async fn delete(&self, ids: &[String]) -> Result<(), StorageError>;
    /// Looks pets up by ID; `None` where an ID is unknown.
    async fn get(&self, ids: &[String]) -> Result<Vec<Option<PetRecord>>, StorageError>;
    /// Looks pets up by idempotency key; `None` where a key is unknown.
    async fn get_by_keys(&self, keys: &[String]) -> Result<Vec<Option<PetRecord>>, StorageError>;
    /// Looks pets up by identity; `None` where an identity is unknown.
    async fn get_by_identities(
        &self,
        identities: &[String],
    ) -> Result<Vec<Option<PetRecord>>, StorageError>;
    /// Changes pets' idempotency keys (and identities, where a change gives
    /// one), each only if its current key (empty for none) equals
    /// `expected_key`. All or nothing.
    async fn set_keys(&self, changes: &[KeyChange]) -> Result<(), StorageError>;
    /// One page of a search. A search walks entries in one order: with
    /// names in the filter, the name index's entries for those names, by
    /// name then ID (cost in proportion to the answer); without, every
    /// record by ID.
    ///
    /// A page bounds the entries it scans, not the pets it returns, so that
    /// every page costs bounded work and memory whatever the filter and
    /// the store hold. It scans the next `limit` entries (at least one) of
    /// the walk after `after`, or all that are left if fewer, and returns
    /// the pets among them that match the filter, in walk order: few or
    /// none when the filter is selective. `next` is the last entry scanned
    /// when more entries follow it, to pass as `after` for the next page,
    /// and `None` when the walk is done. Only `None` ends a search; an empty
    /// page does not.
    async fn search_page(&self, page: PageRequest<'_>) -> Result<SearchPage, StorageError>;
    /// Claims an installation's name for `claim.holder`, by this store's
    /// clock: granted when unclaimed, expired or held by the same holder
    /// (the claim then runs `ttl_seconds` from now), else refused with the
    /// holder and expiry, changing nothing ([`ClaimOutcome::decide`]).
    /// Atomic: of claimants racing for one name, one wins. Claims are no
    /// records: they neither appear in the change feed nor count as a
    /// revision.
    async fn claim_installation(
        &self,
        claim: &InstallationClaim,
    ) -> Result<ClaimOutcome, StorageError>;
    /// The feed of this store's changes: every write that changes records
    /// publishes one change per record to it, in revision order, after it
    /// commits.
    fn feed(&self) -> &ChangeFeed;
    /// Brings the feed up to date with changes committed elsewhere (by
    /// other replicas of a shared database) before a watcher starts, so a
    /// revision seen on one replica is never "ahead" on another.
    async fn catch_up(&self) -> Result<(), StorageError> {
        Ok(())
    }
}

/// Where a paged search resumes: after this record in the order the search
/// walks (by name then ID with a name filter, else by ID).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cursor {
    /// The last record's name; empty for a walk in ID order.
    pub name: String,
    pub id: String,
}

impl Cursor {
    pub(crate) fn after(record: &PetRecord, by_name: bool) -> Self {
        Self {
            name: if by_name {
                record.fields.name.clone()
            } else {
                String::new()
            },
            id: record.id.clone(),
        }
    }
}

/// What one call of [`Storage::search_page`] asks for.
#[derive(Clone, Debug)]
pub struct PageRequest<'f> {
    pub filter: &'f SearchFilter,
    /// The previous page's `next`; `None` starts the walk.
    pub after: Option<Cursor>,
    /// Entries to scan, at least one.
    pub limit: usize,
}

impl<'f> PageRequest<'f> {
    pub fn new(filter: &'f SearchFilter, after: Option<Cursor>, limit: usize) -> Self {
        Self {
            filter,
            after,
            limit,
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct SearchPage {
    pub pets: Vec<PetRecord>,
    pub next: Option<Cursor>,
}

/// One page being filled from the walk's entries in order. Every backend
/// feeds its walk through it, so all keep [`Storage::search_page`]'s
/// contract the same way: `limit` entries scanned, matching or not, and the
/// next page resumes after the last of them.
pub(crate) struct PageFill<'f> {
    filter: &'f SearchFilter,
    limit: usize,
    scanned: usize,
    last: Option<Cursor>,
    pets: Vec<PetRecord>,
}

impl<'f> PageFill<'f> {
    pub(crate) fn new(filter: &'f SearchFilter, limit: usize) -> Self {
        Self {
            filter,
            limit: limit.max(1),
            scanned: 0,
            last: None,
            pets: Vec::new(),
        }
    }

    /// `limit` entries are scanned: a caller holding one more ends the page
    /// with [`Self::resume_later`].
    pub(crate) fn is_full(&self) -> bool {
        self.scanned >= self.limit
    }

    /// Scans the entry at `cursor`. Its record, unless it vanished after
    /// the index was read, joins the page if it matches the filter.
    pub(crate) fn scan(&mut self, cursor: Cursor, record: Option<Cow<'_, PetRecord>>) {
        self.scanned += 1;
        self.last = Some(cursor);
        if let Some(record) = record
            && self.filter.matches(&record.fields)
        {
            self.pets.push(record.into_owned());
        }
    }

    /// This page, with more entries after it.
    pub(crate) fn resume_later(self) -> SearchPage {
        SearchPage {
            pets: self.pets,
            next: self.last,
        }
    }

    /// The last page.
    pub(crate) fn end(self) -> SearchPage {
        SearchPage {
            pets: self.pets,
            next: None,
        }
    }
}

/// Every match, page by page: for tests and small stores. The gRPC layer
/// streams pages instead.
pub async fn search_all(
    storage: &dyn Storage,
    filter: &SearchFilter,
    page: usize,
) -> Result<Vec<PetRecord>, StorageError> {
    let mut found = Vec::new();
    let mut after = None;
    loop {
        let SearchPage { pets, next } = storage
            .search_page(PageRequest::new(filter, after, page))
            .await?;
        found.extend(pets);
        match next {
            Some(cursor) => after = Some(cursor),
            None => return Ok(found),
        }
    }
}

/// The distinct names of a name search, in index order, from the cursor's
/// name on.
pub(crate) fn names_from<'a>(
    filter: &'a SearchFilter,
    after: Option<&Cursor>,
) -> impl Iterator<Item = &'a str> {
    let names: std::collections::BTreeSet<&str> = filter.names.iter().map(String::as_str).collect();
    let start = after.map(|c| c.name.clone()).unwrap_or_default();
    names
        .into_iter()
        .filter(move |name| *name >= start.as_str())
}

/// Which backend to open.
#[derive(Clone, Debug)]
pub enum StorageConfig {
    Memory,
    Durable { path: PathBuf, cache_bytes: usize },
    Postgres(Box<PostgresConfig>),
}

impl StorageConfig {
    /// The durable store at `path` with the default page cache.
    pub fn durable(path: impl Into<PathBuf>) -> Self {
        Self::Durable {
            path: path.into(),
            cache_bytes: durable::DEFAULT_CACHE_BYTES,
        }
    }

    pub async fn open(&self) -> Result<Arc<dyn Storage>, StorageError> {
        self.open_with_history(DEFAULT_HISTORY).await
    }

    /// Opens the store keeping the latest `history` changes for watchers.
    pub async fn open_with_history(
        &self,
        history: usize,
    ) -> Result<Arc<dyn Storage>, StorageError> {
        Ok(match self {
            Self::Memory => Arc::new(MemoryStorage::with_history(history)),
            Self::Durable { path, cache_bytes } => Arc::new(DurableStorage::open_with_history(
                path,
                *cache_bytes,
                history,
            )?),
            Self::Postgres(config) => {
                Arc::new(PostgresStorage::open_with_history(config, history).await?)
            }
        })
    }
}

/// Decides a batch of key changes against the current keys, the same way for
/// every backend: `current_key(id)` is `None` for an unknown pet and
/// `Some("")` for a pet without a key; `key_holder(key)` and
/// `identity_holder(identity)` are the pet that holds a key or an identity.
/// Returns the error that refuses the whole batch, if any. The request was
/// validated, so IDs, non-empty new keys and non-empty new identities are
/// unique within it.
pub(crate) fn check_key_changes(
    changes: &[KeyChange],
    mut current_key: impl FnMut(&str) -> Result<Option<String>, StorageError>,
    mut key_holder: impl FnMut(&str) -> Result<Option<String>, StorageError>,
    mut identity_holder: impl FnMut(&str) -> Result<Option<String>, StorageError>,
) -> Result<Option<StorageError>, StorageError> {
    for (index, change) in changes.iter().enumerate() {
        let Some(actual) = current_key(&change.id)? else {
            return Ok(Some(StorageError::NotFound {
                index,
                id: change.id.clone(),
            }));
        };
        if actual != change.expected_key {
            return Ok(Some(StorageError::KeyMismatch {
                index,
                id: change.id.clone(),
                expected: change.expected_key.clone(),
                actual,
            }));
        }
    }
    for (index, change) in changes.iter().enumerate() {
        if !change.new_key.is_empty() {
            // A key held by a pet that gives it up in this same batch is free.
            if let Some(holder) = key_holder(&change.new_key)? {
                let released = changes
                    .iter()
                    .any(|other| other.id == holder && other.new_key != change.new_key);
                if holder != change.id && !released {
                    return Ok(Some(StorageError::KeyTaken {
                        index,
                        key: change.new_key.clone(),
                    }));
                }
            }
        }
        if let Some(identity) = change.identity_to_hold() {
            // Likewise an identity whose holder takes another (or none) here.
            if let Some(holder) = identity_holder(identity)? {
                let released = changes.iter().any(|other| {
                    other.id == holder
                        && other
                            .new_identity
                            .as_deref()
                            .is_some_and(|other| other != identity)
                });
                if holder != change.id && !released {
                    return Ok(Some(StorageError::IdentityTaken {
                        index,
                        identity: identity.to_owned(),
                    }));
                }
            }
        }
    }
    Ok(None)
}

/// Whether a key change changes its pet, which held `old_key` and
/// `old_identity`: a change that sets what the pet has announces nothing.
pub(crate) fn changes_pet(change: &KeyChange, old_key: &str, old_identity: Option<&str>) -> bool {
    change.new_key != old_key
        || change
            .new_identity
            .as_deref()
            .is_some_and(|new| new != old_identity.unwrap_or_default())
}

fn new_id() -> String {
    uuid::Uuid::new_v4().to_string()
}
