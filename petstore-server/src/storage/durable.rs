//! Durable backend on redb: one file, ACID, copy-on-write, so a `kill -9` at
//! any moment leaves either the old or the new state. Every acknowledged write
//! has been fsynced.
//!
//! Writes go through a single writer thread that commits whatever requests
//! are queued as one transaction (group commit): one fsync then covers many
//! concurrent callers, while each caller's request still applies all or
//! nothing.
//!
//! Each change to a record gets the next revision in the same transaction:
//! the `changes` table holds it and `meta`'s "revision" counts, so the
//! change feed after a `kill -9` is exactly the committed writes. The table
//! keeps the latest `history` changes; each commit drops older ones.

use std::borrow::Cow;
use std::path::Path;
use std::sync::Arc;
use std::sync::mpsc;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction};
use tokio::sync::oneshot;

use super::codec::{decode, decode_change, encode, encode_change};
use super::feed::{Change, ChangeFeed, ChangeKind, DEFAULT_HISTORY, PendingChange};
use super::{
    Cursor, Found, LookupBy, OrEngine, PageFill, PageRequest, SearchPage, Storage, StorageError,
    changes_pet, check_add, check_key_access, check_key_changes, check_record, names_from, new_id,
};
use crate::model::{
    Added, ClaimOutcome, InstallationClaim, KeyChange, NewPet, PetRecord, PetUpdate, SearchFilter,
    now_unix_millis,
};
use crate::tenancy::Access;

/// Pet ID -> the record, encoded by `codec` (a `petstore.Pet`, idempotency
/// key included).
const PETS: TableDefinition<&str, &[u8]> = TableDefinition::new("pets");
/// Idempotency key -> pet ID.
const IDS_BY_KEY: TableDefinition<&str, &str> = TableDefinition::new("ids_by_key");
/// Identity -> pet ID. A file from before identities gets it empty at open,
/// which is right: none of its records has one. An older server opening a
/// later file keeps its records but not this table, so an entry is trusted
/// only while its record still holds the identity (see [`identity_holder`]).
const IDS_BY_IDENTITY: TableDefinition<&str, &str> = TableDefinition::new("ids_by_identity");
/// (name, pet ID): the name index. Written in the same transaction as the
/// pet, so it holds exactly the committed pets, after a `kill -9` too.
const PETS_BY_NAME: TableDefinition<(&str, &str), ()> = TableDefinition::new("pets_by_name");
/// "schema" -> version, so a file written before an index existed gets it
/// built once, at open; "revision" -> the latest change's revision.
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// Revision -> the change (`codec::encode_change`), the latest `history`.
const CHANGES: TableDefinition<u64, &[u8]> = TableDefinition::new("changes");
/// Installation -> (holder, expiry in ms since the epoch): the names
/// claimed by `ClaimInstallation`. Created at open, so a file from before
/// claims gets it empty; an older server opening a later file ignores it.
const CLAIMS: TableDefinition<&str, (&str, i64)> = TableDefinition::new("installation_claims");
const SCHEMA_VERSION: u64 = 2;

/// redb's page cache. Its own default (1 GiB) let one full-store stream of
/// 1,000,000 pets grow the server by 161 MiB; pages beyond the cache are
/// still in the kernel's page cache, which the kernel can reclaim.
pub const DEFAULT_CACHE_BYTES: usize = 32 * 1024 * 1024;

/// Most queued requests folded into one transaction.
const MAX_GROUP: usize = 512;

pub struct DurableStorage {
    db: Arc<Database>,
    feed: Arc<ChangeFeed>,
    writer: Option<mpsc::Sender<Job>>,
    writer_thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for DurableStorage {
    // Closing the queue lets the writer finish what is queued; joining it
    // releases the file lock before a reopen in the same process.
    fn drop(&mut self) {
        self.writer.take();
        if let Some(thread) = self.writer_thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the writer thread panicked");
        }
    }
}

enum WriteOp {
    Add(Vec<NewPet>),
    Update(Vec<PetUpdate>),
    Delete(Vec<String>),
    SetKeys(Vec<KeyChange>),
}

struct Job {
    /// Whom the op acts for (see `crate::tenancy`).
    access: Access,
    op: WriteOp,
    reply: oneshot::Sender<Applied>,
}

impl DurableStorage {
    pub fn open(path: &Path, cache_bytes: usize) -> Result<Self, StorageError> {
        Self::open_with_history(path, cache_bytes, DEFAULT_HISTORY)
    }

    /// Opens the store keeping the latest `history` changes for watchers.
    pub fn open_with_history(
        path: &Path,
        cache_bytes: usize,
        history: usize,
    ) -> Result<Self, StorageError> {
        let db = Database::builder()
            .set_cache_size(cache_bytes)
            .create(path)
            .or_engine("opening the file")?;
        migrate(&db)?;
        let feed = Arc::new(load_feed(&db, history.max(1))?);

        let db = Arc::new(db);
        let (writer, jobs) = mpsc::channel();
        let writer_db = Arc::clone(&db);
        let writer_feed = Arc::clone(&feed);
        let writer_thread = std::thread::Builder::new()
            .name("petstore-writer".into())
            .spawn(move || write_loop(&writer_db, &jobs, &writer_feed))
            .or_engine("starting the writer thread")?;
        Ok(Self {
            db,
            feed,
            writer: Some(writer),
            writer_thread: Some(writer_thread),
        })
    }

    /// Hands `op` to the writer thread, which outlives any borrow: the op
    /// owns a copy of the batch.
    async fn write(&self, access: &Access, op: WriteOp) -> Applied {
        let (reply, answer) = oneshot::channel();
        let access = access.clone();
        self.writer
            .as_ref()
            .ok_or(StorageError::WriterGone)?
            .send(Job { access, op, reply })
            .map_err(|_| StorageError::WriterGone)?;
        answer.await.map_err(|_| StorageError::WriterGone)?
    }

    async fn read<T: Send + 'static>(
        &self,
        read: impl FnOnce(&Database) -> Result<T, StorageError> + Send + 'static,
    ) -> Result<T, StorageError> {
        let db = Arc::clone(&self.db);
        tokio::task::spawn_blocking(move || read(&db))
            .await
            .or_engine("running a read")?
    }
}

/// Creates the tables up front (so readers never see them missing) and
/// builds the name index for a file from before it existed, all in one
/// transaction: a crash midway leaves the old file, and the next open
/// builds it again.
fn migrate(db: &Database) -> Result<(), StorageError> {
    let txn = db.begin_write().or_engine("initialising tables")?;
    {
        let pets = txn.open_table(PETS).or_engine("initialising tables")?;
        txn.open_table(IDS_BY_KEY)
            .or_engine("initialising tables")?;
        txn.open_table(IDS_BY_IDENTITY)
            .or_engine("initialising tables")?;
        txn.open_table(CHANGES).or_engine("initialising tables")?;
        txn.open_table(CLAIMS).or_engine("initialising tables")?;
        let mut by_name = txn
            .open_table(PETS_BY_NAME)
            .or_engine("initialising tables")?;
        let mut meta = txn.open_table(META).or_engine("initialising tables")?;
        let version = meta
            .get("schema")
            .or_engine("initialising tables")?
            .map_or(1, |v| v.value());
        if version < SCHEMA_VERSION {
            let mut indexed = 0u64;
            for entry in pets.iter().or_engine("initialising tables")? {
                let (_, stored) = entry.or_engine("initialising tables")?;
                let record = decode(stored.value())?;
                by_name
                    .insert((record.fields.name.as_str(), record.id.as_str()), ())
                    .or_engine("initialising tables")?;
                indexed += 1;
            }
            meta.insert("schema", SCHEMA_VERSION)
                .or_engine("initialising tables")?;
            tracing::info!(indexed, "built the name index");
        }
    }
    txn.commit().or_engine("initialising tables")
}

/// The feed as the file left it: its revision and its latest changes.
fn load_feed(db: &Database, history: usize) -> Result<ChangeFeed, StorageError> {
    let txn = db.begin_read().or_engine("reading the change history")?;
    let meta = txn
        .open_table(META)
        .or_engine("reading the change history")?;
    let revision = meta
        .get("revision")
        .or_engine("reading the change history")?
        .map_or(0, |v| v.value());
    let changes = txn
        .open_table(CHANGES)
        .or_engine("reading the change history")?;
    let mut recent = Vec::new();
    for entry in changes
        .range::<u64>(..)
        .or_engine("reading the change history")?
        .rev()
        .take(history)
    {
        let (revision, stored) = entry.or_engine("reading the change history")?;
        recent.push(decode_change(
            revision_number(revision.value())?,
            stored.value(),
        )?);
    }
    recent.reverse();
    Ok(ChangeFeed::new(history, revision_number(revision)?, recent))
}

/// Revisions are u64 in the file and i64 on the wire; 2^63 writes is out of
/// reach, but a corrupt file is not.
fn revision_number(revision: u64) -> Result<i64, StorageError> {
    i64::try_from(revision).map_err(|_| super::codec::corrupt(format!("revision {revision}")))
}

fn write_loop(db: &Database, jobs: &mpsc::Receiver<Job>, feed: &ChangeFeed) {
    while let Ok(first) = jobs.recv() {
        let mut group = vec![first];
        while group.len() < MAX_GROUP {
            match jobs.try_recv() {
                Ok(job) => group.push(job),
                Err(_) => break,
            }
        }
        let ops: Vec<(&Access, &WriteOp)> =
            group.iter().map(|job| (&job.access, &job.op)).collect();
        match commit_group(db, &ops, feed.capacity()) {
            Ok((results, changes)) => {
                // Published after the commit, before any caller hears back:
                // a watcher never sees a change that could still be lost.
                feed.publish(changes);
                for (job, result) in group.into_iter().zip(results) {
                    // A caller that gave up (cancelled RPC) no longer listens.
                    let _ = job.reply.send(result);
                }
            }
            Err(failure) => {
                tracing::error!(error = %failure, requests = group.len(), "commit failed");
                let message = failure.to_string();
                for job in group {
                    let _ = job
                        .reply
                        .send(Err(StorageError::engine("committing", message.clone())));
                }
            }
        }
    }
}

/// Applies every op in one transaction, with the changes they make and the
/// store's revision. An op that is refused (unknown ID) writes nothing and
/// gets its own error; an engine failure fails the group.
fn commit_group(
    db: &Database,
    ops: &[(&Access, &WriteOp)],
    history: usize,
) -> Result<(Vec<Applied>, Vec<Change>), StorageError> {
    let txn = db.begin_write().or_engine("starting a write")?;
    let mut results = Vec::with_capacity(ops.len());
    let mut pending = Vec::new();
    for (access, op) in ops {
        results.push(apply(&txn, access, op, &mut pending)?);
    }
    let changes = record_changes(&txn, pending, history)?;
    txn.commit().or_engine("committing")?;
    Ok((results, changes))
}

/// Numbers `pending` after the stored revision, stores them with the new
/// revision, and drops changes older than the latest `history`.
fn record_changes(
    txn: &WriteTransaction,
    pending: Vec<PendingChange>,
    history: usize,
) -> Result<Vec<Change>, StorageError> {
    if pending.is_empty() {
        return Ok(Vec::new());
    }
    let mut meta = txn.open_table(META).or_engine("recording changes")?;
    let mut table = txn.open_table(CHANGES).or_engine("recording changes")?;
    let mut revision = meta
        .get("revision")
        .or_engine("recording changes")?
        .map_or(0, |v| v.value());
    let mut changes = Vec::with_capacity(pending.len());
    for change in pending {
        revision += 1;
        let change = change.at(revision_number(revision)?);
        table
            .insert(revision, encode_change(&change).as_slice())
            .or_engine("recording changes")?;
        changes.push(change);
    }
    meta.insert("revision", revision)
        .or_engine("recording changes")?;
    let keep_after = revision.saturating_sub(history as u64);
    if keep_after > 0 {
        table
            .retain_in(..=keep_after, |_, _| false)
            .or_engine("compacting changes")?;
    }
    Ok(changes)
}

/// One request's result: for an add, what happened to each pet; empty
/// for the other writes.
type Applied = Result<Vec<Added>, StorageError>;

/// Applies one op for `access`, adding the changes it makes to `published`:
/// one per record that changed, none for a write that changes nothing. An
/// op refused (unknown ID, tenancy) is refused before it writes anything,
/// as the other ops of its group share the transaction.
fn apply(
    txn: &WriteTransaction,
    access: &Access,
    op: &WriteOp,
    published: &mut Vec<PendingChange>,
) -> Result<Applied, StorageError> {
    let mut pets = txn.open_table(PETS).or_engine("writing")?;
    let mut keys = txn.open_table(IDS_BY_KEY).or_engine("writing")?;
    let mut identities = txn.open_table(IDS_BY_IDENTITY).or_engine("writing")?;
    let mut by_name = txn.open_table(PETS_BY_NAME).or_engine("writing")?;
    match op {
        WriteOp::Add(new_pets) => {
            let checked = check_add(
                access,
                new_pets,
                |key| {
                    let Some(id) = keys.get(key).or_engine("writing")? else {
                        return Ok(None);
                    };
                    pets.get(id.value())
                        .or_engine("writing")?
                        .map(|stored| decode(stored.value()))
                        .transpose()
                },
                |identity| identity_holder(&pets, &identities, identity),
            );
            if let Err(refusal) = checked {
                return refused(refusal);
            }
            let mut ids = Vec::with_capacity(new_pets.len());
            for pet in new_pets {
                // The key first, then the identity; an earlier pet of this
                // batch is already in the tables.
                if let Some(key) = &pet.idempotency_key
                    && let Some(existing) = keys.get(key.as_str()).or_engine("writing")?
                {
                    ids.push(Added::existing(existing.value().to_owned()));
                    continue;
                }
                if let Some(identity) = &pet.identity
                    && let Some(holder) = identity_holder(&pets, &identities, identity)?
                {
                    ids.push(Added::existing(holder.id));
                    continue;
                }
                let record = PetRecord {
                    id: new_id(),
                    fields: pet.fields.clone(),
                    idempotency_key: pet.idempotency_key.clone(),
                    identity: pet.identity.clone(),
                    tenant: access.new_record_tenant().to_owned(),
                };
                pets.insert(record.id.as_str(), encode(&record).as_slice())
                    .or_engine("writing")?;
                if let Some(key) = &record.idempotency_key {
                    keys.insert(key.as_str(), record.id.as_str())
                        .or_engine("writing")?;
                }
                if let Some(identity) = &record.identity {
                    identities
                        .insert(identity.as_str(), record.id.as_str())
                        .or_engine("writing")?;
                }
                by_name
                    .insert((record.fields.name.as_str(), record.id.as_str()), ())
                    .or_engine("writing")?;
                published.push(PendingChange::of(ChangeKind::Created, &record));
                ids.push(Added::new(record.id));
            }
            Ok(Ok(ids))
        }
        WriteOp::Update(updates) => {
            // Check every ID before writing any, so a refused request changes nothing.
            let mut records = Vec::with_capacity(updates.len());
            for (index, update) in updates.iter().enumerate() {
                let Some(stored) = pets.get(update.id.as_str()).or_engine("writing")? else {
                    return Ok(Err(StorageError::NotFound {
                        index,
                        id: update.id.clone(),
                    }));
                };
                let mut record = decode(stored.value())?;
                let stamp = match check_record(access, &record, || format!("pets[{index}].id")) {
                    Ok(stamp) => stamp,
                    Err(refusal) => return refused(refusal),
                };
                let stamped = stamp.apply(&mut record);
                let old = std::mem::replace(&mut record.fields, update.fields.clone());
                // Identical values change nothing: no change, and no write
                // unless the record gained its tenant.
                let changed = old != record.fields;
                if changed || stamped {
                    records.push((old.name, record, changed));
                }
            }
            for (old_name, record, changed) in records {
                if changed {
                    published.push(PendingChange::of(ChangeKind::Updated, &record));
                }
                pets.insert(record.id.as_str(), encode(&record).as_slice())
                    .or_engine("writing")?;
                if old_name != record.fields.name {
                    by_name
                        .remove((old_name.as_str(), record.id.as_str()))
                        .or_engine("writing")?;
                    by_name
                        .insert((record.fields.name.as_str(), record.id.as_str()), ())
                        .or_engine("writing")?;
                }
            }
            Ok(Ok(Vec::new()))
        }
        WriteOp::Delete(ids) => {
            if *access != Access::All {
                for (index, id) in ids.iter().enumerate() {
                    if let Some(stored) = pets.get(id.as_str()).or_engine("writing")? {
                        let record = decode(stored.value())?;
                        if let Err(refusal) =
                            check_record(access, &record, || format!("ids[{index}]"))
                        {
                            return refused(refusal);
                        }
                    }
                }
            }
            for id in ids {
                let removed = pets.remove(id.as_str()).or_engine("writing")?;
                if let Some(stored) = removed {
                    let record = decode(stored.value())?;
                    if let Some(key) = &record.idempotency_key {
                        keys.remove(key.as_str()).or_engine("writing")?;
                    }
                    if let Some(identity) = &record.identity {
                        release_identity(&mut identities, identity, id)?;
                    }
                    by_name
                        .remove((record.fields.name.as_str(), id.as_str()))
                        .or_engine("writing")?;
                    published.push(PendingChange::deleted(record));
                }
            }
            Ok(Ok(Vec::new()))
        }
        WriteOp::SetKeys(changes) => {
            let mut stored = std::collections::HashMap::with_capacity(changes.len());
            for change in changes {
                if let Some(found) = pets.get(change.id.as_str()).or_engine("writing")? {
                    stored.insert(change.id.as_str(), decode(found.value())?);
                }
            }
            let stamps = match check_key_access(access, changes, |id| Ok(stored.get(id).cloned())) {
                Ok(stamps) => stamps,
                Err(refusal) => return refused(refusal),
            };
            let mut records = Vec::with_capacity(changes.len());
            let refusal = check_key_changes(
                changes,
                |id| {
                    let Some(record) = stored.remove(id) else {
                        return Ok(None);
                    };
                    let key = record.idempotency_key.clone().unwrap_or_default();
                    records.push(record);
                    Ok(Some(key))
                },
                |key| {
                    Ok(keys
                        .get(key)
                        .or_engine("writing")?
                        .map(|id| id.value().to_owned()))
                },
                |identity| Ok(identity_holder(&pets, &identities, identity)?.map(|r| r.id)),
            )?;
            if let Some(refusal) = refusal {
                return Ok(Err(refusal));
            }
            // Release every old key (and every identity being replaced)
            // first, so they can move between pets within one batch. No
            // refusal: `records` holds every change's pet, in order.
            for (change, record) in changes.iter().zip(&records) {
                if !change.expected_key.is_empty() {
                    keys.remove(change.expected_key.as_str())
                        .or_engine("writing")?;
                }
                if change.new_identity.is_some()
                    && let Some(old) = &record.identity
                {
                    release_identity(&mut identities, old, &record.id)?;
                }
            }
            for ((change, mut record), stamp) in changes.iter().zip(records).zip(&stamps) {
                stamp.apply(&mut record);
                if !change.new_key.is_empty() {
                    keys.insert(change.new_key.as_str(), change.id.as_str())
                        .or_engine("writing")?;
                }
                if let Some(identity) = change.identity_to_hold() {
                    identities
                        .insert(identity, change.id.as_str())
                        .or_engine("writing")?;
                }
                // Setting the key and identity a pet already has changes nothing.
                let changed = changes_pet(change, &change.expected_key, record.identity.as_deref());
                record.idempotency_key = Some(change.new_key.clone()).filter(|k| !k.is_empty());
                if let Some(identity) = &change.new_identity {
                    record.identity = Some(identity.clone()).filter(|i| !i.is_empty());
                }
                pets.insert(record.id.as_str(), encode(&record).as_slice())
                    .or_engine("writing")?;
                if changed {
                    published.push(PendingChange::of(ChangeKind::KeyChanged, &record));
                }
            }
            Ok(Ok(Vec::new()))
        }
    }
}

/// An op refused before it wrote anything: its own error, not the group's.
fn refused(refusal: StorageError) -> Result<Applied, StorageError> {
    Ok(Err(refusal))
}

/// Decides and records a claim in a write transaction of its own, which
/// waits for any other (the writer thread's) to commit: claims are rare (a
/// cluster's one every third of its TTL), so they skip the group commit.
fn claim(db: &Database, claim: &InstallationClaim) -> Result<ClaimOutcome, StorageError> {
    let txn = db.begin_write().or_engine("claiming an installation")?;
    let outcome = {
        let mut claims = txn
            .open_table(CLAIMS)
            .or_engine("claiming an installation")?;
        let held = claims
            .get(claim.installation.as_str())
            .or_engine("claiming an installation")?
            .map(|entry| {
                let (holder, expires) = entry.value();
                (holder.to_owned(), expires)
            });
        let outcome = ClaimOutcome::decide(
            claim,
            held.as_ref()
                .map(|(holder, expires)| (holder.as_str(), *expires)),
            now_unix_millis(),
        );
        if outcome.granted {
            claims
                .insert(
                    claim.installation.as_str(),
                    (outcome.holder.as_str(), outcome.expires_at_unix_millis),
                )
                .or_engine("claiming an installation")?;
        }
        outcome
    };
    if outcome.granted {
        txn.commit().or_engine("claiming an installation")?;
    }
    Ok(outcome)
}

fn read_by_ids(db: &Database, ids: &[String]) -> Result<Vec<Option<PetRecord>>, StorageError> {
    let txn = db.begin_read().or_engine("reading")?;
    let pets = txn.open_table(PETS).or_engine("reading")?;
    ids.iter()
        .map(|id| {
            pets.get(id.as_str())
                .or_engine("reading")?
                .map(|stored| decode(stored.value()))
                .transpose()
        })
        .collect()
}

fn read_by_keys(db: &Database, keys: &[String]) -> Result<Vec<Option<PetRecord>>, StorageError> {
    let txn = db.begin_read().or_engine("reading")?;
    let ids_by_key = txn.open_table(IDS_BY_KEY).or_engine("reading")?;
    let pets = txn.open_table(PETS).or_engine("reading")?;
    keys.iter()
        .map(|key| {
            let Some(id) = ids_by_key.get(key.as_str()).or_engine("reading")? else {
                return Ok(None);
            };
            pets.get(id.value())
                .or_engine("reading")?
                .map(|stored| decode(stored.value()))
                .transpose()
        })
        .collect()
}

fn read_by_identities(
    db: &Database,
    identities: &[String],
) -> Result<Vec<Option<PetRecord>>, StorageError> {
    let txn = db.begin_read().or_engine("reading")?;
    let ids_by_identity = txn.open_table(IDS_BY_IDENTITY).or_engine("reading")?;
    let pets = txn.open_table(PETS).or_engine("reading")?;
    identities
        .iter()
        .map(|identity| identity_holder(&pets, &ids_by_identity, identity))
        .collect()
}

/// The pet that holds `identity`: the index's entry, while its record still
/// holds the identity. A server from before identities, run on this file,
/// may have deleted the record or rewritten it without the field, leaving
/// the entry behind; such an entry names no one.
fn identity_holder(
    pets: &impl ReadableTable<&'static str, &'static [u8]>,
    ids_by_identity: &impl ReadableTable<&'static str, &'static str>,
    identity: &str,
) -> Result<Option<PetRecord>, StorageError> {
    let Some(id) = ids_by_identity
        .get(identity)
        .or_engine("reading the identity index")?
    else {
        return Ok(None);
    };
    let Some(stored) = pets
        .get(id.value())
        .or_engine("reading the identity index")?
    else {
        return Ok(None);
    };
    let record = decode(stored.value())?;
    Ok(record
        .identity
        .as_deref()
        .is_some_and(|held| held == identity)
        .then_some(record))
}

/// Drops `identity`'s index entry if it names `id`: one left behind by an
/// older server may name another pet by now.
fn release_identity(
    ids_by_identity: &mut redb::Table<&str, &str>,
    identity: &str,
    id: &str,
) -> Result<(), StorageError> {
    let held = ids_by_identity
        .get(identity)
        .or_engine("writing")?
        .is_some_and(|holder| holder.value() == id);
    if held {
        ids_by_identity.remove(identity).or_engine("writing")?;
    }
    Ok(())
}

#[tonic::async_trait]
impl Storage for DurableStorage {
    async fn add(&self, access: &Access, pets: &[NewPet]) -> Result<Vec<Added>, StorageError> {
        self.write(access, WriteOp::Add(pets.to_vec())).await
    }

    async fn update(&self, access: &Access, pets: &[PetUpdate]) -> Result<(), StorageError> {
        self.write(access, WriteOp::Update(pets.to_vec()))
            .await
            .map(drop)
    }

    async fn delete(&self, access: &Access, ids: &[String]) -> Result<(), StorageError> {
        self.write(access, WriteOp::Delete(ids.to_vec()))
            .await
            .map(drop)
    }

    async fn set_keys(&self, access: &Access, changes: &[KeyChange]) -> Result<(), StorageError> {
        self.write(access, WriteOp::SetKeys(changes.to_vec()))
            .await
            .map(drop)
    }

    // Point lookups run inline: a read transaction over cached pages takes
    // microseconds, less than the hop to a blocking thread would.
    async fn find(&self, by: LookupBy, values: &[String]) -> Found {
        match by {
            LookupBy::Id => read_by_ids(&self.db, values),
            LookupBy::Key => read_by_keys(&self.db, values),
            LookupBy::Identity => read_by_identities(&self.db, values),
        }
    }

    async fn search_page(&self, page: PageRequest<'_>) -> Result<SearchPage, StorageError> {
        let filter = page.filter.clone();
        let access = page.access.clone();
        let (after, limit) = (page.after, page.limit.max(1));
        self.read(move |db| search_page(db, &access, &filter, after.as_ref(), limit))
            .await
    }

    async fn claim_installation(
        &self,
        request: &InstallationClaim,
    ) -> Result<ClaimOutcome, StorageError> {
        let request = request.clone();
        self.read(move |db| claim(db, &request)).await
    }

    fn feed(&self) -> &ChangeFeed {
        &self.feed
    }
}

fn search_page(
    db: &Database,
    access: &Access,
    filter: &SearchFilter,
    after: Option<&Cursor>,
    limit: usize,
) -> Result<SearchPage, StorageError> {
    let txn = db.begin_read().or_engine("searching")?;
    let pets = txn.open_table(PETS).or_engine("searching")?;
    let mut fill = PageFill::new(access, filter, limit);
    if filter.names.is_empty() {
        let start = match after {
            Some(c) => std::ops::Bound::Excluded(c.id.as_str()),
            None => std::ops::Bound::Unbounded,
        };
        let range = pets
            .range::<&str>((start, std::ops::Bound::Unbounded))
            .or_engine("searching")?;
        for entry in range {
            if fill.is_full() {
                return Ok(fill.resume_later());
            }
            let (_, stored) = entry.or_engine("searching")?;
            let record = decode(stored.value())?;
            fill.scan(Cursor::after(&record, false), Some(Cow::Owned(record)));
        }
        return Ok(fill.end());
    }
    let by_name = txn.open_table(PETS_BY_NAME).or_engine("searching")?;
    for name in names_from(filter, after) {
        let start = match after {
            Some(c) if c.name == name => std::ops::Bound::Excluded((name, c.id.as_str())),
            _ => std::ops::Bound::Included((name, "")),
        };
        let range = by_name
            .range::<(&str, &str)>((start, std::ops::Bound::Unbounded))
            .or_engine("searching")?;
        for entry in range {
            let (key, _) = entry.or_engine("searching")?;
            let (entry_name, id) = key.value();
            if entry_name != name {
                break;
            }
            if fill.is_full() {
                return Ok(fill.resume_later());
            }
            let record = match pets.get(id).or_engine("searching")? {
                Some(stored) => Some(Cow::Owned(decode(stored.value())?)),
                None => None,
            };
            let cursor = Cursor {
                name: name.to_owned(),
                id: id.to_owned(),
            };
            fill.scan(cursor, record);
        }
    }
    Ok(fill.end())
}
