//! In-memory backend: fast and volatile. Everything is lost on restart.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;
use std::sync::{PoisonError, RwLock};

use super::feed::{ChangeFeed, ChangeKind, DEFAULT_HISTORY, PendingChange};
use super::{
    Cursor, Found, LookupBy, PageFill, PageRequest, SearchPage, Storage, StorageError, changes_pet,
    check_add, check_key_access, check_key_changes, check_record, check_update_access, names_from,
    new_id,
};
use crate::model::{
    Added, ClaimOutcome, InstallationClaim, KeyChange, NewPet, PetRecord, PetUpdate,
    now_unix_millis,
};
use crate::tenancy::Access;

pub struct MemoryStorage {
    inner: RwLock<Inner>,
    feed: ChangeFeed,
}

impl Default for MemoryStorage {
    fn default() -> Self {
        Self::with_history(DEFAULT_HISTORY)
    }
}

#[derive(Default)]
struct Inner {
    /// Ordered by ID so a search can resume after the last ID it returned.
    pets: BTreeMap<String, PetRecord>,
    ids_by_key: HashMap<String, String>,
    ids_by_identity: HashMap<String, String>,
    /// (name, ID) of every pet: the name index.
    by_name: BTreeSet<(String, String)>,
    /// The revision of the latest change.
    revision: i64,
    /// Installation -> (holder, expiry in ms since the epoch).
    claims: HashMap<String, (String, i64)>,
}

impl MemoryStorage {
    /// An empty store whose feed keeps the latest `history` changes.
    pub fn with_history(history: usize) -> Self {
        Self {
            inner: RwLock::default(),
            feed: ChangeFeed::new(history, 0, Vec::new()),
        }
    }

    /// Numbers `changes` after the store's revision and publishes them.
    /// Called with the write lock held, so revisions follow write order.
    fn publish(&self, inner: &mut Inner, changes: Vec<PendingChange>) {
        if changes.is_empty() {
            return;
        }
        let first = inner.revision + 1;
        inner.revision += changes.len() as i64;
        self.feed.publish(
            changes
                .into_iter()
                .zip(first..)
                .map(|(change, revision)| change.at(revision)),
        );
    }

    // A panic while holding the lock cannot leave `Inner` half-written (every
    // write validates before mutating), so a poisoned lock is safe to reuse.
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(PoisonError::into_inner)
    }
    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(PoisonError::into_inner)
    }
}

#[tonic::async_trait]
impl Storage for MemoryStorage {
    async fn add(&self, access: &Access, pets: &[NewPet]) -> Result<Vec<Added>, StorageError> {
        let mut inner = self.write();
        check_add(
            access,
            pets,
            |key| {
                Ok(inner
                    .ids_by_key
                    .get(key)
                    .and_then(|id| inner.pets.get(id))
                    .cloned())
            },
            |identity| {
                Ok(inner
                    .ids_by_identity
                    .get(identity)
                    .and_then(|id| inner.pets.get(id))
                    .cloned())
            },
        )?;
        let mut ids = Vec::with_capacity(pets.len());
        let mut changes = Vec::new();
        for pet in pets {
            // The key first, then the identity; an earlier pet of this batch
            // is already in the indexes.
            let existing = pet
                .idempotency_key
                .as_ref()
                .and_then(|key| inner.ids_by_key.get(key))
                .or_else(|| {
                    pet.identity
                        .as_ref()
                        .and_then(|identity| inner.ids_by_identity.get(identity))
                });
            if let Some(existing) = existing {
                ids.push(Added::existing(existing.clone()));
                continue;
            }
            let id = new_id();
            if let Some(key) = &pet.idempotency_key {
                inner.ids_by_key.insert(key.clone(), id.clone());
            }
            if let Some(identity) = &pet.identity {
                inner.ids_by_identity.insert(identity.clone(), id.clone());
            }
            inner.by_name.insert((pet.fields.name.clone(), id.clone()));
            let record = PetRecord {
                id: id.clone(),
                fields: pet.fields.clone(),
                idempotency_key: pet.idempotency_key.clone(),
                identity: pet.identity.clone(),
                tenant: access.new_record_tenant().to_owned(),
            };
            changes.push(PendingChange::of(ChangeKind::Created, &record));
            inner.pets.insert(id.clone(), record);
            ids.push(Added::new(id));
        }
        self.publish(&mut inner, changes);
        Ok(ids)
    }

    async fn update(&self, access: &Access, pets: &[PetUpdate]) -> Result<(), StorageError> {
        let mut inner = self.write();
        let stamps = check_update_access(access, pets, |id| inner.pets.get(id))?;
        let inner = &mut *inner;
        let mut changes = Vec::new();
        for (update, stamp) in pets.iter().zip(stamps) {
            if let Some(record) = inner.pets.get_mut(&update.id) {
                stamp.apply(record);
                // Identical values change nothing, so nothing is announced.
                if record.fields == update.fields {
                    continue;
                }
                if record.fields.name != update.fields.name {
                    let old = (std::mem::take(&mut record.fields.name), update.id.clone());
                    inner.by_name.remove(&old);
                    inner
                        .by_name
                        .insert((update.fields.name.clone(), update.id.clone()));
                }
                record.fields = update.fields.clone();
                changes.push(PendingChange::of(ChangeKind::Updated, record));
            }
        }
        self.publish(inner, changes);
        Ok(())
    }

    async fn delete(&self, access: &Access, ids: &[String]) -> Result<(), StorageError> {
        let mut inner = self.write();
        for (index, id) in ids.iter().enumerate() {
            if let Some(record) = inner.pets.get(id) {
                check_record(access, record, || format!("ids[{index}]"))?;
            }
        }
        let mut changes = Vec::new();
        for id in ids {
            if let Some(record) = inner.pets.remove(id) {
                if let Some(key) = &record.idempotency_key {
                    inner.ids_by_key.remove(key);
                }
                if let Some(identity) = &record.identity {
                    inner.ids_by_identity.remove(identity);
                }
                inner
                    .by_name
                    .remove(&(record.fields.name.clone(), record.id.clone()));
                changes.push(PendingChange::deleted(record));
            }
        }
        self.publish(&mut inner, changes);
        Ok(())
    }

    async fn find(&self, by: LookupBy, values: &[String]) -> Found {
        let inner = self.read();
        let index = match by {
            LookupBy::Id => None,
            LookupBy::Key => Some(&inner.ids_by_key),
            LookupBy::Identity => Some(&inner.ids_by_identity),
        };
        let found = values
            .iter()
            .map(|value| {
                let id = match index {
                    None => Some(value),
                    Some(index) => index.get(value),
                };
                id.and_then(|id| inner.pets.get(id)).cloned()
            })
            .collect();
        Ok(found)
    }

    async fn set_keys(&self, access: &Access, changes: &[KeyChange]) -> Result<(), StorageError> {
        let mut inner = self.write();
        let stamps = check_key_access(access, changes, |id| Ok(inner.pets.get(id).cloned()))?;
        let refusal = check_key_changes(
            changes,
            |id| {
                Ok(inner
                    .pets
                    .get(id)
                    .map(|p| p.idempotency_key.clone().unwrap_or_default()))
            },
            |key| Ok(inner.ids_by_key.get(key).cloned()),
            |identity| Ok(inner.ids_by_identity.get(identity).cloned()),
        )?;
        if let Some(refusal) = refusal {
            return Err(refusal);
        }
        let inner = &mut *inner;
        // Release every old key (and every identity being replaced) first,
        // so they can move between pets within one batch.
        for change in changes {
            if !change.expected_key.is_empty() {
                inner.ids_by_key.remove(&change.expected_key);
            }
            if change.new_identity.is_some()
                && let Some(old) = inner.pets.get(&change.id).and_then(|p| p.identity.as_ref())
            {
                inner.ids_by_identity.remove(old);
            }
        }
        let mut published = Vec::new();
        for (change, stamp) in changes.iter().zip(&stamps) {
            if !change.new_key.is_empty() {
                inner
                    .ids_by_key
                    .insert(change.new_key.clone(), change.id.clone());
            }
            if let Some(identity) = change.identity_to_hold() {
                inner
                    .ids_by_identity
                    .insert(identity.to_owned(), change.id.clone());
            }
            if let Some(record) = inner.pets.get_mut(&change.id) {
                stamp.apply(record);
                // Setting the key and identity a pet already has changes nothing.
                let changed = changes_pet(change, &change.expected_key, record.identity.as_deref());
                record.idempotency_key = Some(change.new_key.clone()).filter(|key| !key.is_empty());
                if let Some(identity) = &change.new_identity {
                    record.identity = Some(identity.clone()).filter(|i| !i.is_empty());
                }
                if changed {
                    published.push(PendingChange::of(ChangeKind::KeyChanged, record));
                }
            }
        }
        self.publish(inner, published);
        Ok(())
    }

    async fn search_page(&self, page: PageRequest<'_>) -> Result<SearchPage, StorageError> {
        let inner = self.read();
        let (filter, after, limit) = (page.filter, page.after, page.limit);
        let mut fill = PageFill::new(page.access, filter, limit);
        if filter.names.is_empty() {
            let start = match &after {
                Some(c) => Bound::Excluded(c.id.clone()),
                None => Bound::Unbounded,
            };
            for (_, record) in inner.pets.range((start, Bound::Unbounded)) {
                if fill.is_full() {
                    return Ok(fill.resume_later());
                }
                fill.scan(Cursor::after(record, false), Some(Cow::Borrowed(record)));
            }
            return Ok(fill.end());
        }
        for name in names_from(filter, after.as_ref()) {
            let start = match &after {
                Some(c) if c.name == name => Bound::Excluded((name.to_owned(), c.id.clone())),
                _ => Bound::Included((name.to_owned(), String::new())),
            };
            let same_name = inner
                .by_name
                .range((start, Bound::Unbounded))
                .take_while(|(n, _)| n == name);
            for (_, id) in same_name {
                if fill.is_full() {
                    return Ok(fill.resume_later());
                }
                let cursor = Cursor {
                    name: name.to_owned(),
                    id: id.clone(),
                };
                fill.scan(cursor, inner.pets.get(id).map(Cow::Borrowed));
            }
        }
        Ok(fill.end())
    }

    async fn claim_installation(
        &self,
        claim: &InstallationClaim,
    ) -> Result<ClaimOutcome, StorageError> {
        let mut inner = self.write();
        let held = inner
            .claims
            .get(&claim.installation)
            .map(|(holder, expires)| (holder.as_str(), *expires));
        let outcome = ClaimOutcome::decide(claim, held, now_unix_millis());
        if outcome.granted {
            inner.claims.insert(
                claim.installation.clone(),
                (outcome.holder.clone(), outcome.expires_at_unix_millis),
            );
        }
        Ok(outcome)
    }

    fn feed(&self) -> &ChangeFeed {
        &self.feed
    }
}
