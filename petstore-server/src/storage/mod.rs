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
use crate::tenancy::{Access, Denial, Stamp};

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
    /// Tenancy refused the write (see `crate::tenancy`); nothing was
    /// changed. `field` names where in the request, e.g. `pets[1].identity`.
    #[error("{field}: refused for {}: {denial}", caller_name(tenant))]
    Denied {
        field: String,
        /// The caller's namespace; empty for an observer.
        tenant: String,
        denial: Denial,
    },
    #[error("storage engine failed while {action}: {source}")]
    Engine {
        action: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("storage writer has stopped")]
    WriterGone,
}

fn caller_name(tenant: &str) -> String {
    if tenant.is_empty() {
        "an observer".to_owned()
    } else {
        format!("tenant {tenant:?}")
    }
}

impl StorageError {
    /// `access` may not write where `field` names, for `denial`.
    pub(crate) fn denied(access: &Access, field: String, denial: Denial) -> Self {
        Self::Denied {
            field,
            tenant: access.tenant().unwrap_or_default().to_owned(),
            denial,
        }
    }

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

/// Which of its indexes a backend's point lookup ([`Storage::find`]) reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LookupBy {
    Id,
    /// The idempotency key.
    Key,
    Identity,
}

/// A point lookup's answer: for each value asked, in order, its record or
/// `None`.
pub type Found = Result<Vec<Option<PetRecord>>, StorageError>;

/// A pet store backend. Every write is atomic: it applies whole or not at all.
/// Batches are borrowed: the caller keeps its request, and a backend copies
/// only what it stores.
#[tonic::async_trait]
pub trait Storage: Send + Sync + 'static {
    /// Adds pets and returns their IDs in order. A pet whose idempotency key is
    /// already stored (or appears earlier in the same batch) gets the existing
    /// ID, marked as not created, and is not added again; failing that, the
    /// same for its identity.
    ///
    /// With tenancy (`access` a tenant), a pet's identity must be in the
    /// tenant's namespace, a key or identity that names a record the tenant
    /// may not write refuses the whole batch (`Denied`, without the
    /// record's ID), and new records get the tenant.
    async fn add(&self, access: &Access, pets: &[NewPet]) -> Result<Vec<Added>, StorageError>;
    /// Replaces the fields of existing pets; fails with `NotFound`, changing
    /// nothing, if any ID is unknown, or with `Denied` if `access` may not
    /// write one ([`Access::check_write`]; a write that may stamps the
    /// record's tenant in the same transaction).
    async fn update(&self, access: &Access, pets: &[PetUpdate]) -> Result<(), StorageError>;
    /// Deletes pets (freeing their keys and identities); unknown IDs are
    /// ignored. `Denied`, deleting none, if `access` may not write one.
    async fn delete(&self, access: &Access, ids: &[String]) -> Result<(), StorageError>;
    /// The records stored under `values` in the `by` index, in order,
    /// `None` where a value is unknown, whoever's they are: as the get
    /// methods below with [`Access::All`]. A backend reads its indexes
    /// here; tenancy's filter is the get methods' own, so that it is
    /// applied one way for every backend.
    async fn find(&self, by: LookupBy, values: &[String]) -> Found;
    /// Looks pets up by ID; `None` where an ID is unknown or names a record
    /// `access` may not read.
    async fn get(&self, access: &Access, ids: &[String]) -> Found {
        Ok(readable(access, self.find(LookupBy::Id, ids).await?))
    }
    /// Looks pets up by idempotency key; `None` where a key is unknown or
    /// names a record `access` may not read.
    async fn get_by_keys(&self, access: &Access, keys: &[String]) -> Found {
        Ok(readable(access, self.find(LookupBy::Key, keys).await?))
    }
    /// Looks pets up by identity; `None` where an identity is unknown or
    /// names a record `access` may not read.
    async fn get_by_identities(&self, access: &Access, identities: &[String]) -> Found {
        Ok(readable(
            access,
            self.find(LookupBy::Identity, identities).await?,
        ))
    }
    /// Changes pets' idempotency keys (and identities, where a change gives
    /// one), each only if its current key (empty for none) equals
    /// `expected_key`. All or nothing. Tenancy first ([`check_key_access`]):
    /// `Denied`, changing nothing, if `access` may not write a pet or give
    /// it its new identity.
    async fn set_keys(&self, access: &Access, changes: &[KeyChange]) -> Result<(), StorageError>;
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
    /// page does not. Records `page.access` may not read are scanned but
    /// never returned.
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
    /// Who searches: only records it may read are returned.
    pub access: &'f Access,
    pub filter: &'f SearchFilter,
    /// The previous page's `next`; `None` starts the walk.
    pub after: Option<Cursor>,
    /// Entries to scan, at least one.
    pub limit: usize,
}

impl<'f> PageRequest<'f> {
    pub fn new(
        access: &'f Access,
        filter: &'f SearchFilter,
        after: Option<Cursor>,
        limit: usize,
    ) -> Self {
        Self {
            access,
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
    access: &'f Access,
    filter: &'f SearchFilter,
    limit: usize,
    scanned: usize,
    last: Option<Cursor>,
    pets: Vec<PetRecord>,
}

impl<'f> PageFill<'f> {
    pub(crate) fn new(access: &'f Access, filter: &'f SearchFilter, limit: usize) -> Self {
        Self {
            access,
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
    /// the index was read, joins the page if it matches the filter and the
    /// caller may read it.
    pub(crate) fn scan(&mut self, cursor: Cursor, record: Option<Cow<'_, PetRecord>>) {
        self.scanned += 1;
        self.last = Some(cursor);
        if let Some(record) = record
            && self.filter.matches(&record.fields)
            && self.access.may_read(&record)
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
    access: &Access,
    filter: &SearchFilter,
    page: usize,
) -> Result<Vec<PetRecord>, StorageError> {
    let mut found = Vec::new();
    let mut after = None;
    loop {
        let SearchPage { pets, next } = storage
            .search_page(PageRequest::new(access, filter, after, page))
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

/// The records `access` may read of a lookup's answer; the others read as
/// unknown.
pub(crate) fn readable(access: &Access, found: Vec<Option<PetRecord>>) -> Vec<Option<PetRecord>> {
    if *access == Access::All {
        return found;
    }
    found
        .into_iter()
        .map(|record| record.filter(|record| access.may_read(record)))
        .collect()
}

/// Tenancy's check of an `AddPets` batch before anything is written: every
/// identity in the tenant's namespace, and every pet that would come back
/// as an existing record (its key, then its identity, naming a stored
/// record; `existing` looks one up) naming a record the caller may write.
/// A pet whose key or identity an earlier pet of the batch takes gets that
/// new record, the caller's own. `Ok(())` when every pet may go ahead.
pub(crate) fn check_add(
    access: &Access,
    pets: &[NewPet],
    mut existing_by_key: impl FnMut(&str) -> Result<Option<PetRecord>, StorageError>,
    mut existing_by_identity: impl FnMut(&str) -> Result<Option<PetRecord>, StorageError>,
) -> Result<(), StorageError> {
    if *access == Access::All {
        return Ok(());
    }
    if let Err(denial) = access.check_writer() {
        return Err(StorageError::denied(access, "pets".into(), denial));
    }
    let mut batch_keys = std::collections::HashSet::new();
    let mut batch_identities = std::collections::HashSet::new();
    for (index, pet) in pets.iter().enumerate() {
        if let Some(identity) = &pet.identity
            && let Err(denial) = access.check_identity(identity)
        {
            return Err(StorageError::denied(
                access,
                format!("pets[{index}].identity"),
                denial,
            ));
        }
        let key = pet.idempotency_key.as_deref();
        let identity = pet.identity.as_deref();
        if key.is_some_and(|key| batch_keys.contains(key)) {
            continue;
        }
        let (field, stored) = match key {
            Some(key) => ("idempotency_key", existing_by_key(key)?),
            None => ("idempotency_key", None),
        };
        let (field, stored) = match (stored, identity) {
            (Some(stored), _) => (field, Some(stored)),
            (None, Some(identity)) if batch_identities.contains(identity) => continue,
            (None, Some(identity)) => ("identity", existing_by_identity(identity)?),
            (None, None) => (field, None),
        };
        match stored {
            Some(stored) => {
                if let Err(denial) = access.check_write(&stored) {
                    return Err(StorageError::denied(
                        access,
                        format!("pets[{index}].{field}"),
                        denial,
                    ));
                }
            }
            None => {
                batch_keys.extend(key);
                batch_identities.extend(identity);
            }
        }
    }
    Ok(())
}

/// Tenancy's check of one stored record a write touches: what it does to
/// the record's tenant, or the refusal naming `field`.
pub(crate) fn check_record(
    access: &Access,
    record: &PetRecord,
    field: impl FnOnce() -> String,
) -> Result<Stamp, StorageError> {
    access
        .check_write(record)
        .map_err(|denial| StorageError::denied(access, field(), denial))
}

/// Tenancy's check of an update batch before anything is written: every
/// pet stored (`NotFound` names the first that is not, `stored(id)` being
/// its record) and one `access` may write. The stamps, in the batch's
/// order.
pub(crate) fn check_update_access<'s>(
    access: &Access,
    pets: &[PetUpdate],
    stored: impl Fn(&str) -> Option<&'s PetRecord>,
) -> Result<Vec<Stamp>, StorageError> {
    pets.iter()
        .enumerate()
        .map(|(index, pet)| {
            let record = stored(&pet.id).ok_or_else(|| StorageError::NotFound {
                index,
                id: pet.id.clone(),
            })?;
            check_record(access, record, || format!("pets[{index}].id"))
        })
        .collect()
}

/// Tenancy's check of a batch of key changes, before the keys are
/// compared: every new identity in the caller's namespace, and every
/// pet one the caller may write, or claim by import (a record from before
/// tenancy, without an identity, given one in the caller's namespace).
/// `record(id)` is the stored pet, `None` for an unknown one (which the
/// key check then reports). The stamps, in the changes' order.
pub(crate) fn check_key_access(
    access: &Access,
    changes: &[KeyChange],
    mut record: impl FnMut(&str) -> Result<Option<PetRecord>, StorageError>,
) -> Result<Vec<Stamp>, StorageError> {
    let mut stamps = Vec::with_capacity(changes.len());
    if *access == Access::All {
        stamps.resize(changes.len(), Stamp::Keep);
        return Ok(stamps);
    }
    if let Err(denial) = access.check_writer() {
        return Err(StorageError::denied(access, "changes".into(), denial));
    }
    for (index, change) in changes.iter().enumerate() {
        if let Some(identity) = change.identity_to_hold()
            && let Err(denial) = access.check_identity(identity)
        {
            return Err(StorageError::denied(
                access,
                format!("changes[{index}].new_identity"),
                denial,
            ));
        }
        let stamp = match record(&change.id)? {
            None => Stamp::Keep,
            Some(stored) => access
                .check_claim(&stored, change.identity_to_hold())
                .map_err(|denial| {
                    StorageError::denied(access, format!("changes[{index}].id"), denial)
                })?,
        };
        stamps.push(stamp);
    }
    Ok(stamps)
}

fn new_id() -> String {
    uuid::Uuid::new_v4().to_string()
}
