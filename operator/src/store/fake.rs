//! An in-process [`PetStore`] for unit tests: records every call, and can be
//! told to fail.

use std::collections::HashMap;
use std::sync::Mutex;

use super::{PetData, PetStore, Record, StoreError};

#[derive(Default)]
pub struct FakeStore {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    records: HashMap<String, (String, PetData)>,
    calls: Vec<String>,
    next_id: u32,
    unavailable: bool,
    reject_creates: bool,
}

impl FakeStore {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("fake store lock")
    }

    /// Every call so far, such as `create:uid-1`.
    pub fn calls(&self) -> Vec<String> {
        self.state().calls.clone()
    }

    pub fn records(&self) -> Vec<Record> {
        let mut records: Vec<_> = self
            .state()
            .records
            .iter()
            .map(|(id, (_, data))| Record {
                id: id.clone(),
                data: data.clone(),
            })
            .collect();
        records.sort_by(|a, b| a.id.cmp(&b.id));
        records
    }

    pub fn insert(&self, key: &str, data: PetData) -> String {
        let mut state = self.state();
        state.next_id += 1;
        let id = format!("id-{}", state.next_id);
        state.records.insert(id.clone(), (key.to_owned(), data));
        id
    }

    pub fn set_unavailable(&self, unavailable: bool) {
        self.state().unavailable = unavailable;
    }

    pub fn set_reject_creates(&self, reject: bool) {
        self.state().reject_creates = reject;
    }

    fn enter(&self, call: String) -> Result<std::sync::MutexGuard<'_, State>, StoreError> {
        let mut state = self.state();
        state.calls.push(call);
        if state.unavailable {
            return Err(StoreError::Unavailable {
                operation: "fake",
                message: "connection refused".into(),
            });
        }
        Ok(state)
    }
}

#[tonic::async_trait]
impl PetStore for FakeStore {
    async fn observe(&self, id: &str) -> Result<Option<Record>, StoreError> {
        let state = self.enter(format!("observe:{id}"))?;
        Ok(state.records.get(id).map(|(_, data)| Record {
            id: id.to_owned(),
            data: data.clone(),
        }))
    }

    async fn find_by_key(&self, key: &str) -> Result<Option<Record>, StoreError> {
        let state = self.enter(format!("find_by_key:{key}"))?;
        Ok(state
            .records
            .iter()
            .find(|(_, (k, _))| k == key)
            .map(|(id, (_, data))| Record {
                id: id.clone(),
                data: data.clone(),
            }))
    }

    async fn create(&self, key: &str, pet: &PetData) -> Result<String, StoreError> {
        let mut state = self.enter(format!("create:{key}"))?;
        if state.reject_creates {
            return Err(StoreError::Rejected {
                operation: "create",
                message: "pets[0].name: rejected by the fake".into(),
            });
        }
        if let Some((id, _)) = state.records.iter().find(|(_, (k, _))| k == key) {
            return Ok(id.clone());
        }
        state.next_id += 1;
        let id = format!("id-{}", state.next_id);
        state
            .records
            .insert(id.clone(), (key.to_owned(), pet.clone()));
        Ok(id)
    }

    async fn update(&self, id: &str, pet: &PetData) -> Result<(), StoreError> {
        let mut state = self.enter(format!("update:{id}"))?;
        match state.records.get_mut(id) {
            Some((_, data)) => {
                *data = pet.clone();
                Ok(())
            }
            None => Err(StoreError::NotFound { id: id.to_owned() }),
        }
    }

    async fn delete(&self, id: &str) -> Result<(), StoreError> {
        let mut state = self.enter(format!("delete:{id}"))?;
        state.records.remove(id);
        Ok(())
    }
}
