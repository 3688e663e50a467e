//! An in-process [`PetStore`] for unit tests: records every call, and can be
//! told to fail. Keys and identities behave as in the real store: unique,
//! and changed only by compare-and-set.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

use super::{
    Created, Feed, InstallationClaim, Lookup, Operation, PetData, PetStore, Record, StoreError,
};

#[derive(Default)]
pub struct FakeStore {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    records: BTreeMap<String, Stored>,
    /// Emulates a store older than identities: keeps none, finds none.
    without_identities: bool,
    calls: Vec<String>,
    next_id: u32,
    unavailable: bool,
    reject_creates: bool,
    /// Emulates the original store: no GetPets, no SetIdempotencyKeys.
    without_extensions: bool,
    /// Races: the next update finds its record deleted by someone else.
    vanish_before_update: bool,
    /// Races: before the next key change, this key is set on its record.
    rekey_before_set_key: Option<String>,
    /// Races: the next create times out, and its record is committed later.
    commit_next_create_late: bool,
    /// That record, committed once the next observe has answered.
    late_create: Option<Stored>,
    /// The answers to the next calls of `watch`, in order; once they run
    /// out, the store has no feed (as the book's).
    watch_answers: VecDeque<Result<Feed, StoreError>>,
    /// When each `watch` was called (Tokio's clock, which tests may pause).
    watched_at: Vec<tokio::time::Instant>,
    /// Emulates a store with tenancy that takes the caller for a tenant,
    /// not its observer.
    tenant_only: bool,
    /// The answers to the next claims, in order, the last one repeated;
    /// none scripted: the store has no claims (as the book's).
    claim_answers: VecDeque<Result<InstallationClaim, StoreError>>,
}

#[derive(Clone, Debug)]
struct Stored {
    key: String,
    identity: String,
    data: PetData,
}

impl State {
    fn record(&self, id: &str) -> Option<Record> {
        self.records.get(id).map(|stored| Record {
            id: id.to_owned(),
            key: super::Owner::parse(&stored.key),
            identity: stored.identity.clone(),
            data: stored.data.clone(),
        })
    }

    /// Adds a record with this key and identity (empty: none) and returns
    /// its ID.
    fn add(&mut self, stored: Stored) -> String {
        self.next_id += 1;
        let id = format!("id-{}", self.next_id);
        self.records.insert(id.clone(), stored);
        id
    }

    fn id_of_key(&self, key: &str) -> Option<String> {
        (!key.is_empty())
            .then(|| self.records.iter().find(|(_, stored)| stored.key == key))
            .flatten()
            .map(|(id, _)| id.clone())
    }

    fn id_of_identity(&self, identity: &str) -> Option<String> {
        (!identity.is_empty() && !self.without_identities)
            .then(|| {
                self.records
                    .iter()
                    .find(|(_, stored)| stored.identity == identity)
            })
            .flatten()
            .map(|(id, _)| id.clone())
    }
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
        let state = self.state();
        state
            .records
            .keys()
            .filter_map(|id| state.record(id))
            .collect()
    }

    pub fn record(&self, id: &str) -> Option<Record> {
        self.state().record(id)
    }

    /// Adds a record with this key (empty: unowned) and no identity, as an
    /// operator older than identities made them, and returns its ID.
    pub fn insert(&self, key: &str, data: PetData) -> String {
        self.insert_with_identity(key, "", data)
    }

    /// Adds a record with this key and identity and returns its ID.
    pub fn insert_with_identity(&self, key: &str, identity: &str, data: PetData) -> String {
        self.state().add(Stored {
            key: key.to_owned(),
            identity: identity.to_owned(),
            data,
        })
    }

    /// Removes a record without a call, as another client would.
    pub fn remove(&self, id: &str) {
        self.state().records.remove(id);
    }

    /// Behave as a store older than identities: keep and find none.
    pub fn set_without_identities(&self, without: bool) {
        self.state().without_identities = without;
    }

    pub fn set_unavailable(&self, unavailable: bool) {
        self.state().unavailable = unavailable;
    }

    pub fn set_reject_creates(&self, reject: bool) {
        self.state().reject_creates = reject;
    }

    /// The next update's record is deleted just before it (by someone else).
    pub fn vanish_before_next_update(&self) {
        self.state().vanish_before_update = true;
    }

    /// Just before the next key change, someone else sets `key` on its
    /// record (another Pet winning a race).
    pub fn rekey_before_next_set_key(&self, key: &str) {
        self.state().rekey_before_set_key = Some(key.to_owned());
    }

    /// The next create times out (its caller sees the store unavailable),
    /// but its record is committed after all, just after the next observe
    /// answers: that read finds nothing, and the create after it finds the
    /// record already there.
    pub fn commit_next_create_late(&self) {
        self.state().commit_next_create_late = true;
    }

    /// The answer to the next `watch` not yet scripted.
    pub fn answer_next_watch(&self, answer: Result<Feed, StoreError>) {
        self.state().watch_answers.push_back(answer);
    }

    /// When each `watch` was called.
    pub fn watched_at(&self) -> Vec<tokio::time::Instant> {
        self.state().watched_at.clone()
    }

    /// Take the caller for a tenant, not an observer (a store started
    /// without `--observer` for it).
    pub fn set_tenant_only(&self, tenant_only: bool) {
        self.state().tenant_only = tenant_only;
    }

    /// The answers to the claims from now on, in order; the last one
    /// answers every claim after it.
    pub fn answer_claims(&self, answers: Vec<Result<InstallationClaim, StoreError>>) {
        self.state().claim_answers = answers.into();
    }

    pub fn set_without_extensions(&self, without: bool) {
        self.state().without_extensions = without;
    }

    fn enter(
        &self,
        operation: Operation,
        call: String,
    ) -> Result<std::sync::MutexGuard<'_, State>, StoreError> {
        let mut state = self.state();
        state.calls.push(call);
        if state.unavailable {
            return Err(StoreError::Unavailable {
                operation,
                message: "connection refused".into(),
                retry_after: None,
            });
        }
        Ok(state)
    }
}

#[tonic::async_trait]
impl PetStore for FakeStore {
    async fn holds_no_records(&self) -> Result<bool, StoreError> {
        let state = self.enter(Operation::Search, "search".into())?;
        Ok(state.records.is_empty())
    }

    async fn observe(
        &self,
        id: Option<&str>,
        key: &str,
        identity: Option<&str>,
    ) -> Result<Lookup, StoreError> {
        let mut state = self.enter(
            Operation::Observe,
            format!("observe:{}:{key}", id.unwrap_or("-")),
        )?;
        if state.without_extensions {
            return Err(StoreError::Unimplemented {
                operation: Operation::Observe,
            });
        }
        let lookup = Lookup {
            by_id: id.and_then(|id| state.record(id)),
            by_key: state.id_of_key(key).and_then(|id| state.record(&id)),
            by_identity: identity
                .and_then(|identity| state.id_of_identity(identity))
                .and_then(|id| state.record(&id)),
            identities: identity.is_some() && !state.without_identities,
        };
        if let Some(stored) = state.late_create.take() {
            state.add(stored);
        }
        Ok(lookup)
    }

    async fn create(
        &self,
        key: &str,
        identity: Option<&str>,
        pet: &PetData,
    ) -> Result<Created, StoreError> {
        let mut state = self.enter(Operation::Create, format!("create:{key}"))?;
        if state.reject_creates {
            return Err(StoreError::Rejected {
                operation: Operation::Create,
                message: "pets[0].name: rejected by the fake".into(),
            });
        }
        let identity = match state.without_identities {
            true => "",
            false => identity.unwrap_or(""),
        };
        let stored = Stored {
            key: key.to_owned(),
            identity: identity.to_owned(),
            data: pet.clone(),
        };
        if std::mem::take(&mut state.commit_next_create_late) {
            state.late_create = Some(stored);
            return Err(StoreError::Unavailable {
                operation: Operation::Create,
                message: "deadline exceeded".into(),
                retry_after: None,
            });
        }
        if state.without_extensions {
            // The original store drops the key and never says what it did.
            return Ok(Created::Unknown(state.add(Stored {
                key: String::new(),
                identity: String::new(),
                data: pet.clone(),
            })));
        }
        if let Some(id) = state
            .id_of_key(key)
            .or_else(|| state.id_of_identity(identity))
        {
            return Ok(Created::Existing(id));
        }
        Ok(Created::New(state.add(stored)))
    }

    async fn watch(&self, after_revision: i64) -> Result<Feed, StoreError> {
        let mut state = self.enter(Operation::Watch, format!("watch:{after_revision}"))?;
        state.watched_at.push(tokio::time::Instant::now());
        state
            .watch_answers
            .pop_front()
            .unwrap_or(Err(StoreError::Unimplemented {
                operation: Operation::Watch,
            }))
    }

    async fn claim_installation(
        &self,
        installation: &str,
        holder: &str,
        ttl: std::time::Duration,
    ) -> Result<InstallationClaim, StoreError> {
        let mut state = self.enter(
            Operation::Claim,
            format!("claim:{installation}:{holder}:{ttl:?}"),
        )?;
        let answers = &mut state.claim_answers;
        match answers.len() {
            0 => Err(StoreError::Unimplemented {
                operation: Operation::Claim,
            }),
            1 => answers.front().cloned().expect("an answer"),
            _ => answers.pop_front().expect("an answer"),
        }
    }

    async fn reads_every_tenant(&self) -> Result<bool, StoreError> {
        let state = self.enter(Operation::Watch, "reads_every_tenant".into())?;
        Ok(!state.tenant_only)
    }

    async fn update(&self, id: &str, pet: &PetData) -> Result<(), StoreError> {
        let mut state = self.enter(Operation::Update, format!("update:{id}"))?;
        if std::mem::take(&mut state.vanish_before_update) {
            state.records.remove(id);
        }
        match state.records.get_mut(id) {
            Some(stored) => {
                stored.data = pet.clone();
                Ok(())
            }
            None => Err(StoreError::NotFound { id: id.to_owned() }),
        }
    }

    async fn delete(&self, id: &str) -> Result<(), StoreError> {
        let mut state = self.enter(Operation::Delete, format!("delete:{id}"))?;
        state.records.remove(id);
        Ok(())
    }

    async fn set_key(
        &self,
        id: &str,
        expected: &str,
        new: &str,
        identity: Option<&str>,
    ) -> Result<(), StoreError> {
        let mut state = self.enter(Operation::SetKey, format!("set_key:{id}:{expected}->{new}"))?;
        if state.without_extensions {
            return Err(StoreError::Unimplemented {
                operation: Operation::SetKey,
            });
        }
        if let Some(key) = state.rekey_before_set_key.take()
            && let Some(stored) = state.records.get_mut(id)
        {
            stored.key = key;
        }
        let conflict = |message: String| StoreError::KeyConflict {
            id: id.to_owned(),
            message,
        };
        let current = match state.records.get(id) {
            Some(stored) => stored.key.clone(),
            None => return Err(StoreError::NotFound { id: id.to_owned() }),
        };
        if current != expected {
            return Err(conflict(format!("key is {current:?}, not {expected:?}")));
        }
        if state.id_of_key(new).is_some_and(|owner| owner != id) {
            return Err(conflict(format!("key {new:?} belongs to another pet")));
        }
        let identity = identity.filter(|_| !state.without_identities);
        if let Some(identity) = identity
            && state
                .id_of_identity(identity)
                .is_some_and(|holder| holder != id)
        {
            return Err(conflict(format!(
                "identity {identity:?} belongs to another pet"
            )));
        }
        if let Some(stored) = state.records.get_mut(id) {
            stored.key = new.to_owned();
            if let Some(identity) = identity {
                stored.identity = identity.to_owned();
            }
        }
        Ok(())
    }
}
