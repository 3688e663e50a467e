//! In-memory backend: fast and volatile. Everything is lost on restart.

use std::collections::HashMap;
use std::sync::{PoisonError, RwLock};

use super::{Storage, StorageError, check_key_changes, new_id};
use crate::model::{KeyChange, NewPet, PetRecord, PetUpdate, SearchFilter};

#[derive(Default)]
pub struct MemoryStorage {
    inner: RwLock<Inner>,
}

#[derive(Default)]
struct Inner {
    pets: HashMap<String, PetRecord>,
    ids_by_key: HashMap<String, String>,
}

impl MemoryStorage {
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
    async fn add(&self, pets: Vec<NewPet>) -> Result<Vec<String>, StorageError> {
        let mut inner = self.write();
        let mut ids = Vec::with_capacity(pets.len());
        for pet in pets {
            if let Some(existing) = pet
                .idempotency_key
                .as_ref()
                .and_then(|key| inner.ids_by_key.get(key))
            {
                ids.push(existing.clone());
                continue;
            }
            let id = new_id();
            if let Some(key) = &pet.idempotency_key {
                inner.ids_by_key.insert(key.clone(), id.clone());
            }
            inner.pets.insert(
                id.clone(),
                PetRecord {
                    id: id.clone(),
                    fields: pet.fields,
                    idempotency_key: pet.idempotency_key,
                },
            );
            ids.push(id);
        }
        Ok(ids)
    }

    async fn update(&self, pets: Vec<PetUpdate>) -> Result<(), StorageError> {
        let mut inner = self.write();
        if let Some((index, missing)) = pets
            .iter()
            .enumerate()
            .find(|(_, p)| !inner.pets.contains_key(&p.id))
        {
            return Err(StorageError::NotFound {
                index,
                id: missing.id.clone(),
            });
        }
        for update in pets {
            if let Some(record) = inner.pets.get_mut(&update.id) {
                record.fields = update.fields;
            }
        }
        Ok(())
    }

    async fn delete(&self, ids: Vec<String>) -> Result<(), StorageError> {
        let mut inner = self.write();
        for id in ids {
            if let Some(key) = inner.pets.remove(&id).and_then(|r| r.idempotency_key) {
                inner.ids_by_key.remove(&key);
            }
        }
        Ok(())
    }

    async fn get(&self, ids: Vec<String>) -> Result<Vec<Option<PetRecord>>, StorageError> {
        let inner = self.read();
        Ok(ids.iter().map(|id| inner.pets.get(id).cloned()).collect())
    }

    async fn get_by_keys(&self, keys: Vec<String>) -> Result<Vec<Option<PetRecord>>, StorageError> {
        let inner = self.read();
        Ok(keys
            .iter()
            .map(|key| {
                inner
                    .ids_by_key
                    .get(key)
                    .and_then(|id| inner.pets.get(id))
                    .cloned()
            })
            .collect())
    }

    async fn set_keys(&self, changes: Vec<KeyChange>) -> Result<(), StorageError> {
        let mut inner = self.write();
        let refusal = check_key_changes(
            &changes,
            |id| {
                Ok(inner
                    .pets
                    .get(id)
                    .map(|p| p.idempotency_key.clone().unwrap_or_default()))
            },
            |key| Ok(inner.ids_by_key.get(key).cloned()),
        )?;
        if let Some(refusal) = refusal {
            return Err(refusal);
        }
        // Release every old key first, so keys can move between pets within
        // one batch.
        for change in &changes {
            if !change.expected_key.is_empty() {
                inner.ids_by_key.remove(&change.expected_key);
            }
        }
        for change in changes {
            if !change.new_key.is_empty() {
                inner
                    .ids_by_key
                    .insert(change.new_key.clone(), change.id.clone());
            }
            if let Some(record) = inner.pets.get_mut(&change.id) {
                record.idempotency_key = Some(change.new_key).filter(|key| !key.is_empty());
            }
        }
        Ok(())
    }

    async fn search(&self, filter: SearchFilter) -> Result<Vec<PetRecord>, StorageError> {
        let inner = self.read();
        Ok(inner
            .pets
            .values()
            .filter(|p| filter.matches(&p.fields))
            .cloned()
            .collect())
    }
}
