//! PostgreSQL backend: any number of stateless store replicas serve one
//! database. Every request is one transaction, so batches stay all or
//! nothing; unique constraints on the idempotency key and on the identity
//! make concurrent creates with the same key or identity, from any
//! replicas, produce one record.
//!
//! The change feed: each write transaction takes its revisions from the one
//! row of `petstore_revision` (`UPDATE ... RETURNING`), writes its changes
//! to `petstore_changes` and sends `NOTIFY petstore_changes`, all before it
//! commits. The row lock is held to the commit, so transactions commit in
//! revision order: a reader that has seen revision 11 can never later find
//! a 10 committing (as it could with a sequence). Every replica LISTENs on
//! its own connection and, when woken (or every second, in case a
//! notification was lost across a reconnect), reads `revision > last` in
//! order into its in-memory feed.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::NaiveDate;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use futures::future::try_join_all;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{AsyncMessage, NoTls, Row};

use super::codec::{self, corrupt};
use super::feed::{Change, ChangeFeed, ChangeKind, DEFAULT_HISTORY, PendingChange};
use super::{
    Cursor, Found, LookupBy, OrEngine, PageFill, PageRequest, SearchPage, Storage, StorageError,
    changes_pet, check_add, check_key_access, check_key_changes, check_record, check_update_access,
    new_id,
};
use crate::model::{
    Added, ClaimOutcome, InstallationClaim, KeyChange, NewPet, PetFields, PetRecord, PetUpdate,
    ValidPetType,
};
use crate::tenancy::{Access, Stamp};

/// Serialises schema changes between replicas that start together.
const MIGRATION_LOCK: i64 = 0x7065_7473_746f_7265; // "petstore"

/// Idempotent: each step checks before it acts, and they run under an
/// advisory lock, so two replicas starting at once cannot both create.
/// `COLLATE "C"` makes ordering and equality byte-wise, as in the other
/// backends, whatever the database's default collation.
const MIGRATIONS: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS petstore_pets (
        id text COLLATE \"C\" PRIMARY KEY,
        name text COLLATE \"C\" NOT NULL,
        species smallint NOT NULL,
        birthday date NOT NULL,
        idempotency_key text COLLATE \"C\" UNIQUE
    )",
    "CREATE INDEX IF NOT EXISTS petstore_pets_by_name ON petstore_pets (name, id)",
    // One row: the store's revision. Its row lock orders the writers.
    "CREATE TABLE IF NOT EXISTS petstore_revision (
        singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
        revision bigint NOT NULL
    )",
    "INSERT INTO petstore_revision (singleton, revision) VALUES (true, 0)
     ON CONFLICT (singleton) DO NOTHING",
    // The latest changes, with the record after each (for a deletion, as it
    // was just before; NULL in a deletion written by an older store).
    "CREATE TABLE IF NOT EXISTS petstore_changes (
        revision bigint PRIMARY KEY,
        kind smallint NOT NULL,
        id text COLLATE \"C\" NOT NULL,
        name text COLLATE \"C\",
        species smallint,
        birthday date,
        idempotency_key text COLLATE \"C\"
    )",
    // Identities came later: a table made before gains the column, NULL
    // (no identity) in every existing row, and the unique index.
    "ALTER TABLE petstore_pets ADD COLUMN IF NOT EXISTS identity text COLLATE \"C\"",
    "CREATE UNIQUE INDEX IF NOT EXISTS petstore_pets_by_identity ON petstore_pets (identity)",
    "ALTER TABLE petstore_changes ADD COLUMN IF NOT EXISTS identity text COLLATE \"C\"",
    // Installations' names claimed by ClaimInstallation, with the holder
    // and the expiry by the database's clock.
    "CREATE TABLE IF NOT EXISTS petstore_installation_claims (
        installation text COLLATE \"C\" PRIMARY KEY,
        holder text COLLATE \"C\" NOT NULL,
        expires_at timestamptz NOT NULL
    )",
    // Tenancy came later still: every existing row gets the empty tenant
    // (made before tenancy), which is what the store reads for none.
    "ALTER TABLE petstore_pets ADD COLUMN IF NOT EXISTS tenant text COLLATE \"C\" NOT NULL DEFAULT ''",
    "ALTER TABLE petstore_changes ADD COLUMN IF NOT EXISTS tenant text COLLATE \"C\"",
];

/// The unique index on identities, named in its violations.
const IDENTITY_INDEX: &str = "petstore_pets_by_identity";

/// The channel every write notifies and every replica listens on.
const CHANNEL: &str = "petstore_changes";
/// A replica reads the change table this often even without a
/// notification: one may be lost while its listening connection reconnects.
const SAFETY_POLL: Duration = Duration::from_secs(1);
/// Most changes one read of the change table takes into the feed.
const READ_BATCH: i64 = 1000;

const COLUMNS: &str = "id, name, species, birthday, idempotency_key, identity, tenant";
/// [`COLUMNS`] of an `UPDATE ... FROM` that names the table `p`.
const RETURNED_COLUMNS: &str =
    "p.id, p.name, p.species, p.birthday, p.idempotency_key, p.identity, p.tenant";

/// How to reach the database.
#[derive(Clone)]
pub struct PostgresConfig {
    pub config: tokio_postgres::Config,
    /// Connections per replica.
    pub pool_size: usize,
    /// How long start-up keeps retrying an unreachable database.
    pub connect_timeout: Duration,
}

impl std::fmt::Debug for PostgresConfig {
    // Never print the password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresConfig")
            .field("hosts", &self.config.get_hosts())
            .field("ports", &self.config.get_ports())
            .field("dbname", &self.config.get_dbname())
            .field("user", &self.config.get_user())
            .field("pool_size", &self.pool_size)
            .finish()
    }
}

pub struct PostgresStorage {
    pool: Pool,
    feed: Arc<FeedReader>,
    history: usize,
    /// The listening and reading tasks, stopped with the store.
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for PostgresStorage {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Brings committed changes from the database into this replica's feed.
struct FeedReader {
    pool: Pool,
    feed: ChangeFeed,
    /// Woken by a notification, a reconnect or this replica's own commit.
    wake: tokio::sync::Notify,
    /// One read at a time, so reads publish in order without overlap.
    reading: tokio::sync::Mutex<()>,
}

impl PostgresStorage {
    /// Connects (retrying while the database is unreachable, up to the
    /// configured time) and brings the schema up to date.
    pub async fn open(config: &PostgresConfig) -> Result<Self, StorageError> {
        Self::open_with_history(config, DEFAULT_HISTORY).await
    }

    /// Like [`Self::open`], keeping the latest `history` changes (in this
    /// replica's memory and in the database) for watchers.
    pub async fn open_with_history(
        config: &PostgresConfig,
        history: usize,
    ) -> Result<Self, StorageError> {
        let manager = Manager::from_config(
            config.config.clone(),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(config.pool_size.max(1))
            .build()
            .or_engine("building the connection pool")?;
        let deadline = tokio::time::Instant::now() + config.connect_timeout;
        loop {
            match migrate(&pool).await {
                Ok(()) => break,
                Err(err) if tokio::time::Instant::now() < deadline => {
                    tracing::warn!(error = %err, "database not ready; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(err) => return Err(err),
            }
        }
        let history = history.max(1);
        let feed = Arc::new(FeedReader {
            feed: load_feed(&pool, history).await?,
            pool: pool.clone(),
            wake: tokio::sync::Notify::new(),
            reading: tokio::sync::Mutex::new(()),
        });
        let tasks = vec![
            tokio::spawn(listen(config.config.clone(), Arc::clone(&feed))),
            tokio::spawn(read_changes(Arc::clone(&feed))),
        ];
        Ok(Self {
            pool,
            feed,
            history,
            tasks,
        })
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, StorageError> {
        connection(&self.pool).await
    }

    /// Wakes this replica's reader after its own commit, so its watchers
    /// need not wait for the notification's round trip.
    fn committed(&self) {
        self.feed.wake.notify_one();
    }
}

/// A connection from the pool, for the store's calls and its own work.
async fn connection(pool: &Pool) -> Result<deadpool_postgres::Object, StorageError> {
    pool.get().await.or_engine("getting a database connection")
}

async fn migrate(pool: &Pool) -> Result<(), StorageError> {
    let mut client = connection(pool).await?;
    let txn = client
        .transaction()
        .await
        .or_engine("starting the migration")?;
    // "already exists, skipping" notices are the normal case.
    txn.batch_execute("SET LOCAL client_min_messages = warning")
        .await
        .or_engine("migrating the schema")?;
    txn.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .or_engine("taking the migration lock")?;
    for step in MIGRATIONS {
        txn.batch_execute(step)
            .await
            .or_engine("migrating the schema")?;
    }
    txn.commit().await.or_engine("migrating the schema")
}

/// The feed as the database holds it: the revision and the latest
/// `history` changes, read in one snapshot.
async fn load_feed(pool: &Pool, history: usize) -> Result<ChangeFeed, StorageError> {
    let mut client = connection(pool).await?;
    let txn = client
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
        .or_engine("reading the change history")?;
    let revision: i64 = txn
        .query_one("SELECT revision FROM petstore_revision", &[])
        .await
        .or_engine("reading the revision")?
        .try_get(0)
        .or_engine("reading the revision")?;
    let limit = i64::try_from(history).unwrap_or(i64::MAX);
    let rows = txn
        .query(
            &format!(
                "SELECT {CHANGE_COLUMNS} FROM petstore_changes ORDER BY revision DESC LIMIT $1"
            ),
            &[&limit],
        )
        .await
        .or_engine("reading the change history")?;
    txn.commit().await.or_engine("reading the change history")?;
    let mut recent = rows.iter().map(change).collect::<Result<Vec<_>, _>>()?;
    recent.reverse();
    Ok(ChangeFeed::new(history, revision, recent))
}

const CHANGE_COLUMNS: &str =
    "revision, kind, id, name, species, birthday, idempotency_key, identity, tenant";

fn change(row: &Row) -> Result<Change, StorageError> {
    let revision: i64 = row.try_get(0).map_err(corrupt)?;
    let kind: i16 = row.try_get(1).map_err(corrupt)?;
    let kind = ChangeKind::from_code(kind)
        .ok_or_else(|| corrupt(format!("change {revision} has unknown kind {kind}")))?;
    let id: String = row.try_get(2).map_err(corrupt)?;
    let name: Option<String> = row.try_get(3).map_err(corrupt)?;
    let species: Option<i16> = row.try_get(4).map_err(corrupt)?;
    let birthday: Option<NaiveDate> = row.try_get(5).map_err(corrupt)?;
    let record = match (name, species, birthday) {
        (Some(name), Some(species), Some(birthday)) => Some(PetRecord {
            id: id.clone(),
            fields: PetFields {
                name,
                pet_type: codec::species_from_code(i32::from(species))?,
                birthday,
            },
            idempotency_key: row.try_get(6).map_err(corrupt)?,
            identity: row.try_get(7).map_err(corrupt)?,
            tenant: row
                .try_get::<_, Option<String>>(8)
                .map_err(corrupt)?
                .unwrap_or_default(),
        }),
        _ => None,
    };
    Ok(Change {
        revision,
        kind,
        id,
        record,
    })
}

impl FeedReader {
    /// Publishes every change committed after the feed's revision.
    async fn read_new(&self) -> Result<(), StorageError> {
        let _reading = self.reading.lock().await;
        let client = connection(&self.pool).await?;
        let statement = client
            .prepare_cached(&format!(
                "SELECT {CHANGE_COLUMNS} FROM petstore_changes
                 WHERE revision > $1 ORDER BY revision LIMIT $2"
            ))
            .await
            .or_engine("preparing a change read")?;
        loop {
            let rows = client
                .query(&statement, &[&self.feed.current(), &READ_BATCH])
                .await
                .or_engine("reading changes")?;
            let full = rows.len() as i64 >= READ_BATCH;
            let changes = rows.iter().map(change).collect::<Result<Vec<_>, _>>()?;
            self.feed.publish(changes);
            if !full {
                return Ok(());
            }
        }
    }
}

/// Reads new changes whenever woken, and every [`SAFETY_POLL`] regardless.
async fn read_changes(reader: Arc<FeedReader>) {
    loop {
        if let Err(err) = reader.read_new().await {
            tracing::warn!(error = %err, "cannot read the change table; retrying");
        }
        tokio::select! {
            () = reader.wake.notified() => {}
            () = tokio::time::sleep(SAFETY_POLL) => {}
        }
    }
}

/// Holds a connection that LISTENs for commits of any replica and wakes
/// the reader; reconnects when it breaks.
async fn listen(config: tokio_postgres::Config, reader: Arc<FeedReader>) {
    use futures::StreamExt;
    loop {
        match config.connect(NoTls).await {
            Ok((client, mut connection)) => {
                let wake = Arc::clone(&reader);
                let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
                let driven = tokio::spawn(async move {
                    while let Some(message) = messages.next().await {
                        match message {
                            Ok(AsyncMessage::Notification(_)) => wake.wake.notify_one(),
                            Ok(_) => {}
                            Err(err) => {
                                tracing::warn!(error = %err, "the listening connection failed");
                                return;
                            }
                        }
                    }
                });
                match client.batch_execute(&format!("LISTEN {CHANNEL}")).await {
                    // Changes committed while not listening are read now.
                    Ok(()) => reader.wake.notify_one(),
                    Err(err) => tracing::warn!(error = %err, "cannot LISTEN for changes"),
                }
                // `client` lives until the connection ends.
                let _ = driven.await;
                drop(client);
            }
            Err(err) => tracing::warn!(error = %err, "cannot connect to listen for changes"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Numbers `pending` with the next revisions and stores them in `txn`,
/// with a notification to every replica; drops changes older than the
/// latest `history`. Call it last before the commit: from here to the
/// commit, the revision row is locked and every other writer waits.
async fn record_changes(
    txn: &tokio_postgres::Transaction<'_>,
    pending: Vec<PendingChange>,
    history: usize,
) -> Result<(), StorageError> {
    if pending.is_empty() {
        return Ok(());
    }
    let count = pending.len() as i64;
    let last: i64 = txn
        .query_one(
            "UPDATE petstore_revision SET revision = revision + $1 RETURNING revision",
            &[&count],
        )
        .await
        .or_engine("taking revisions")?
        .try_get(0)
        .or_engine("taking revisions")?;
    let first = last - count + 1;
    let revisions: Vec<i64> = (first..=last).collect();
    let kinds: Vec<i16> = pending.iter().map(|c| c.kind.code()).collect();
    let ids: Vec<&str> = pending.iter().map(|c| c.id.as_str()).collect();
    let records = || pending.iter().map(|c| c.record.as_ref());
    let names: Vec<Option<&str>> = records()
        .map(|r| r.map(|r| r.fields.name.as_str()))
        .collect();
    let species: Vec<Option<i16>> = records()
        .map(|r| r.map(|r| species_code(r.fields.pet_type)))
        .collect();
    let birthdays: Vec<Option<NaiveDate>> =
        records().map(|r| r.map(|r| r.fields.birthday)).collect();
    let keys: Vec<Option<&str>> = records()
        .map(|r| r.and_then(|r| r.idempotency_key.as_deref()))
        .collect();
    let identities: Vec<Option<&str>> = records()
        .map(|r| r.and_then(|r| r.identity.as_deref()))
        .collect();
    let tenants: Vec<Option<&str>> = records().map(|r| r.map(|r| r.tenant.as_str())).collect();
    txn.execute(
        "INSERT INTO petstore_changes
             (revision, kind, id, name, species, birthday, idempotency_key, identity, tenant)
         SELECT * FROM unnest($1::bigint[], $2::smallint[], $3::text[], $4::text[],
                              $5::smallint[], $6::date[], $7::text[], $8::text[], $9::text[])",
        &[
            &revisions,
            &kinds,
            &ids,
            &names,
            &species,
            &birthdays,
            &keys,
            &identities,
            &tenants,
        ],
    )
    .await
    .or_engine("recording changes")?;
    let keep_after = last.saturating_sub(i64::try_from(history).unwrap_or(i64::MAX));
    if keep_after > 0 {
        txn.execute(
            "DELETE FROM petstore_changes WHERE revision <= $1",
            &[&keep_after],
        )
        .await
        .or_engine("compacting changes")?;
    }
    txn.execute("SELECT pg_notify($1, $2)", &[&CHANNEL, &last.to_string()])
        .await
        .or_engine("notifying replicas")?;
    Ok(())
}

fn species_code(species: ValidPetType) -> i16 {
    // ValidPetType codes are 1 to 4, so the cast is lossless.
    codec::species_code(species) as i16
}

/// The species of each pet of a batch as stored, for its statements'
/// parameters (which borrow them).
fn species_codes<'p>(fields: impl Iterator<Item = &'p PetFields>) -> Vec<i16> {
    fields.map(|fields| species_code(fields.pet_type)).collect()
}

fn record(row: &Row) -> Result<PetRecord, StorageError> {
    let species: i16 = row.try_get(2).map_err(corrupt)?;
    Ok(PetRecord {
        id: row.try_get(0).map_err(corrupt)?,
        fields: PetFields {
            name: row.try_get(1).map_err(corrupt)?,
            pet_type: codec::species_from_code(i32::from(species))?,
            birthday: row.try_get::<_, NaiveDate>(3).map_err(corrupt)?,
        },
        idempotency_key: row.try_get(4).map_err(corrupt)?,
        identity: row.try_get(5).map_err(corrupt)?,
        tenant: row.try_get(6).map_err(corrupt)?,
    })
}

/// The pets `ids` names, locked for the rest of `txn` (in ID order, so two
/// requests cannot deadlock): a tenancy check of a write reads the records
/// it guards, which cannot then change before the write commits.
async fn lock_records(
    txn: &deadpool_postgres::Transaction<'_>,
    ids: &[String],
) -> Result<HashMap<String, PetRecord>, StorageError> {
    let rows = txn
        .query(
            &format!(
                "SELECT {COLUMNS} FROM petstore_pets WHERE id = ANY($1) ORDER BY id FOR UPDATE"
            ),
            &[&ids],
        )
        .await
        .or_engine("reading pets to write")?;
    let mut records = HashMap::with_capacity(rows.len());
    for row in &rows {
        let record = record(row)?;
        records.insert(record.id.clone(), record);
    }
    Ok(records)
}

/// Gives the tenant of each stamp (see `crate::tenancy::Stamp`) to its pet
/// in `ids`, if the pet has none yet: compare-and-set, in the write's
/// transaction.
async fn stamp_tenants(
    txn: &deadpool_postgres::Transaction<'_>,
    ids: &[&str],
    stamps: &[Stamp],
) -> Result<(), StorageError> {
    let mut stamped: HashMap<&str, Vec<&str>> = HashMap::new();
    for (id, stamp) in ids.iter().zip(stamps) {
        if let Some(tenant) = stamp.tenant() {
            stamped.entry(tenant).or_default().push(id);
        }
    }
    for (tenant, ids) in stamped {
        txn.execute(
            "UPDATE petstore_pets SET tenant = $2 WHERE id = ANY($1) AND tenant = ''",
            &[&ids, &tenant],
        )
        .await
        .or_engine("stamping tenants")?;
    }
    Ok(())
}

/// The rows' two text columns as a map, for a key change's checks: the
/// query takes the values as its one parameter, and a NULL second column (a
/// pet without a key) reads as empty, as keys do everywhere else.
async fn text_pairs(
    txn: &deadpool_postgres::Transaction<'_>,
    sql: &str,
    values: &[String],
) -> Result<HashMap<String, String>, StorageError> {
    let rows = txn.query(sql, &[&values]).await.or_engine("reading keys")?;
    let mut pairs = HashMap::with_capacity(rows.len());
    for row in &rows {
        let first: String = row.try_get(0).or_engine("reading keys")?;
        let second: Option<String> = row.try_get(1).or_engine("reading keys")?;
        pairs.insert(first, second.unwrap_or_default());
    }
    Ok(pairs)
}

#[tonic::async_trait]
impl Storage for PostgresStorage {
    async fn add(&self, access: &Access, pets: &[NewPet]) -> Result<Vec<Added>, StorageError> {
        // What needs no records (observers, identities' namespaces) is
        // checked now; an existing record a pet names, below, where the
        // insert found it.
        check_add(access, pets, |_| Ok(None), |_| Ok(None))?;
        let tenant = access.new_record_tenant();
        let mut client = self.client().await?;
        // No conflict target: a row is skipped if its key or its identity is
        // taken, and the lookups below tell which (the key first).
        let insert = client
            .prepare_cached(
                "INSERT INTO petstore_pets
                     (id, name, species, birthday, idempotency_key, identity, tenant)
                 VALUES ($1, $2, $3, $4, $5, $6, $7)
                 ON CONFLICT DO NOTHING
                 RETURNING id",
            )
            .await
            .or_engine("preparing an insert")?;
        let lookup = "preparing a lookup";
        let by_key = prepare_records(&client, "WHERE idempotency_key = $1", lookup).await?;
        let by_identity = prepare_records(&client, "WHERE identity = $1", lookup).await?;
        let txn = client.transaction().await.or_engine("starting an add")?;
        let new_ids: Vec<String> = pets.iter().map(|_| new_id()).collect();
        let codes = species_codes(pets.iter().map(|pet| &pet.fields));
        // Pipelined: the statements are sent together and run in order, so a
        // key or identity repeated later in the batch meets the earlier row.
        let params: Vec<[&(dyn ToSql + Sync); 7]> = pets
            .iter()
            .zip(&new_ids)
            .zip(&codes)
            .map(|((pet, id), code)| {
                [
                    id as &(dyn ToSql + Sync),
                    &pet.fields.name,
                    code,
                    &pet.fields.birthday,
                    &pet.idempotency_key,
                    &pet.identity,
                    &tenant,
                ]
            })
            .collect();
        let inserted = try_join_all(params.iter().map(|p| txn.query_opt(&insert, p)))
            .await
            .or_engine("adding pets")?;
        let mut ids = Vec::with_capacity(pets.len());
        let mut changes = Vec::new();
        for (index, (row, pet)) in inserted.into_iter().zip(pets).enumerate() {
            if let Some(row) = row {
                let id: String = row.try_get(0).or_engine("reading an ID")?;
                changes.push(PendingChange::of(
                    ChangeKind::Created,
                    &PetRecord {
                        id: id.clone(),
                        fields: pet.fields.clone(),
                        idempotency_key: pet.idempotency_key.clone(),
                        identity: pet.identity.clone(),
                        tenant: tenant.to_owned(),
                    },
                ));
                ids.push(Added::new(id));
                continue;
            }
            // The key or the identity was taken (by a committed transaction,
            // which the unique index waited for, or earlier in this batch).
            let mut existing = None;
            let mut field = "idempotency_key";
            if let Some(key) = &pet.idempotency_key {
                existing = txn
                    .query_opt(&by_key, &[key])
                    .await
                    .or_engine("looking up a key")?;
            }
            if existing.is_none()
                && let Some(identity) = &pet.identity
            {
                field = "identity";
                existing = txn
                    .query_opt(&by_identity, &[identity])
                    .await
                    .or_engine("looking up an identity")?;
            }
            let Some(row) = existing else {
                return Err(StorageError::engine(
                    "adding pets",
                    "an insert whose key and identity are free returned no row",
                ));
            };
            let existing = record(&row)?;
            // A record the caller may not write: dropping the transaction
            // rolls the whole batch back, and its ID is not told.
            check_record(access, &existing, || format!("pets[{index}].{field}"))?;
            ids.push(Added::existing(existing.id));
        }
        record_changes(&txn, changes, self.history).await?;
        txn.commit().await.or_engine("committing an add")?;
        self.committed();
        Ok(ids)
    }

    async fn update(&self, access: &Access, pets: &[PetUpdate]) -> Result<(), StorageError> {
        let mut client = self.client().await?;
        let statement = client
            // The old values say whether anything changed: an update to
            // identical values announces no change.
            .prepare_cached(&format!(
                "WITH old AS (
                     SELECT id, name, species, birthday FROM petstore_pets
                     WHERE id = $1 FOR UPDATE
                 )
                 UPDATE petstore_pets p SET name = $2, species = $3, birthday = $4
                 FROM old WHERE p.id = old.id
                 RETURNING {RETURNED_COLUMNS},
                     old.name IS DISTINCT FROM $2::text
                     OR old.species IS DISTINCT FROM $3::smallint
                     OR old.birthday IS DISTINCT FROM $4::date"
            ))
            .await
            .or_engine("preparing an update")?;
        let txn = client.transaction().await.or_engine("starting an update")?;
        if *access != Access::All {
            let ids: Vec<String> = pets.iter().map(|p| p.id.clone()).collect();
            let stored = lock_records(&txn, &ids).await?;
            let stamps = check_update_access(access, pets, |id| stored.get(id))?;
            let ids: Vec<&str> = pets.iter().map(|p| p.id.as_str()).collect();
            stamp_tenants(&txn, &ids, &stamps).await?;
        }
        let codes = species_codes(pets.iter().map(|pet| &pet.fields));
        let params: Vec<[&(dyn ToSql + Sync); 4]> = pets
            .iter()
            .zip(&codes)
            .map(|(pet, code)| {
                [
                    &pet.id as &(dyn ToSql + Sync),
                    &pet.fields.name,
                    code,
                    &pet.fields.birthday,
                ]
            })
            .collect();
        let updated = try_join_all(params.iter().map(|p| txn.query_opt(&statement, p)))
            .await
            .or_engine("updating pets")?;
        let mut changes = Vec::new();
        for (index, row) in updated.iter().enumerate() {
            let Some(row) = row else {
                // Dropping the transaction rolls it back: nothing changes.
                return Err(StorageError::NotFound {
                    index,
                    id: pets[index].id.clone(),
                });
            };
            let changed: bool = row.try_get(7).or_engine("updating pets")?;
            if changed {
                changes.push(PendingChange::of(ChangeKind::Updated, &record(row)?));
            }
        }
        record_changes(&txn, changes, self.history).await?;
        txn.commit().await.or_engine("committing an update")?;
        self.committed();
        Ok(())
    }

    async fn delete(&self, access: &Access, ids: &[String]) -> Result<(), StorageError> {
        let mut client = self.client().await?;
        let statement = client
            .prepare_cached(&format!(
                "DELETE FROM petstore_pets WHERE id = ANY($1) RETURNING {COLUMNS}"
            ))
            .await
            .or_engine("preparing a delete")?;
        let txn = client.transaction().await.or_engine("starting a delete")?;
        if *access != Access::All {
            let stored = lock_records(&txn, ids).await?;
            for (index, id) in ids.iter().enumerate() {
                if let Some(record) = stored.get(id) {
                    check_record(access, record, || format!("ids[{index}]"))?;
                }
            }
        }
        let rows = txn
            .query(&statement, &[&ids])
            .await
            .or_engine("deleting pets")?;
        // Unknown IDs delete nothing and announce nothing. Each deletion
        // carries the row as the DELETE removed it.
        let changes = rows
            .iter()
            .map(|row| record(row).map(PendingChange::deleted))
            .collect::<Result<Vec<_>, _>>()?;
        record_changes(&txn, changes, self.history).await?;
        txn.commit().await.or_engine("committing a delete")?;
        self.committed();
        Ok(())
    }

    async fn find(&self, by: LookupBy, values: &[String]) -> Found {
        match by {
            LookupBy::Id => self.lookup("id", values, |r| Some(&r.id)).await,
            LookupBy::Key => {
                self.lookup("idempotency_key", values, |r| r.idempotency_key.as_ref())
                    .await
            }
            LookupBy::Identity => {
                self.lookup("identity", values, |r| r.identity.as_ref())
                    .await
            }
        }
    }

    async fn set_keys(&self, access: &Access, changes: &[KeyChange]) -> Result<(), StorageError> {
        let mut client = self.client().await?;
        let txn = client
            .transaction()
            .await
            .or_engine("starting a key change")?;
        let ids: Vec<String> = changes.iter().map(|c| c.id.clone()).collect();
        let new_keys: Vec<String> = changes
            .iter()
            .filter(|c| !c.new_key.is_empty())
            .map(|c| c.new_key.clone())
            .collect();
        let new_identities: Vec<String> = changes
            .iter()
            .filter_map(|c| c.identity_to_hold().map(str::to_owned))
            .collect();
        // Locks the pets in ID order (two requests cannot deadlock), so
        // their keys and identities cannot change between this check and the
        // write.
        let stored = lock_records(&txn, &ids).await?;
        let stamps = check_key_access(access, changes, |id| Ok(stored.get(id).cloned()))?;
        let current: HashMap<String, (String, Option<String>)> = stored
            .into_values()
            .map(|r| (r.id, (r.idempotency_key.unwrap_or_default(), r.identity)))
            .collect();
        let key_holders = text_pairs(
            &txn,
            "SELECT idempotency_key, id FROM petstore_pets WHERE idempotency_key = ANY($1)",
            &new_keys,
        )
        .await?;
        let identity_holders = text_pairs(
            &txn,
            "SELECT identity, id FROM petstore_pets WHERE identity = ANY($1)",
            &new_identities,
        )
        .await?;
        // The same decision as every other backend.
        if let Some(refusal) = check_key_changes(
            changes,
            |id| Ok(current.get(id).map(|(key, _)| key.clone())),
            |key| Ok(key_holders.get(key).cloned()),
            |identity| Ok(identity_holders.get(identity).cloned()),
        )? {
            return Err(refusal);
        }
        let stamped_ids: Vec<&str> = changes.iter().map(|c| c.id.as_str()).collect();
        stamp_tenants(&txn, &stamped_ids, &stamps).await?;
        // Clear first, so keys and identities may move between pets of this
        // request without tripping a unique constraint midway.
        let replaced: Vec<&str> = changes
            .iter()
            .filter(|c| c.new_identity.is_some())
            .map(|c| c.id.as_str())
            .collect();
        txn.execute(
            "UPDATE petstore_pets SET idempotency_key = NULL,
                 identity = CASE WHEN id = ANY($2) THEN NULL ELSE identity END
             WHERE id = ANY($1)",
            &[&ids, &replaced],
        )
        .await
        .or_engine("changing keys")?;
        for (index, change) in changes.iter().enumerate() {
            let key = Some(change.new_key.as_str()).filter(|key| !key.is_empty());
            let identity = change.identity_to_hold();
            if key.is_none() && identity.is_none() {
                continue;
            }
            if let Err(err) = txn
                .execute(
                    "UPDATE petstore_pets SET idempotency_key = $2,
                         identity = COALESCE($3, identity)
                     WHERE id = $1",
                    &[&change.id, &key, &identity],
                )
                .await
            {
                // A key or identity taken since the check, by a create on
                // any replica (the unique index waited for it to commit).
                // Dropping the transaction rolls everything back.
                return Err(match unique_violation(&err) {
                    Some(IDENTITY_INDEX) => StorageError::IdentityTaken {
                        index,
                        identity: identity.unwrap_or_default().to_owned(),
                    },
                    Some(_) => StorageError::KeyTaken {
                        index,
                        key: change.new_key.clone(),
                    },
                    None => StorageError::engine("changing keys", err),
                });
            }
        }
        // Setting the key and identity a pet already has changes nothing.
        let changed: Vec<String> = changes
            .iter()
            .filter(|c| {
                current
                    .get(&c.id)
                    .is_some_and(|(key, identity)| changes_pet(c, key, identity.as_deref()))
            })
            .map(|c| c.id.clone())
            .collect();
        let rows = txn
            .query(
                &format!("SELECT {COLUMNS} FROM petstore_pets WHERE id = ANY($1)"),
                &[&changed],
            )
            .await
            .or_engine("reading changed keys")?;
        let mut after: HashMap<String, PetRecord> = HashMap::with_capacity(rows.len());
        for row in &rows {
            let record = record(row)?;
            after.insert(record.id.clone(), record);
        }
        let published = changed
            .iter()
            .filter_map(|id| after.get(id))
            .map(|record| PendingChange::of(ChangeKind::KeyChanged, record))
            .collect();
        record_changes(&txn, published, self.history).await?;
        txn.commit().await.or_engine("committing key changes")?;
        self.committed();
        Ok(())
    }

    async fn search_page(&self, page: PageRequest<'_>) -> Result<SearchPage, StorageError> {
        let client = self.client().await?;
        let (filter, after, limit) = (page.filter, page.after, page.limit);
        let by_name = !filter.names.is_empty();
        let after = after.unwrap_or_default();
        // The walk's next `limit` entries and one more, which tells whether
        // the walk goes on. The filter is applied below, as in the other
        // backends, not in SQL: a query for a page of matches could scan
        // the whole table for a selective filter.
        let fetch = i64::try_from(limit.max(1).saturating_add(1)).unwrap_or(i64::MAX);
        let rows = if by_name {
            let statement = prepare_records(
                &client,
                "WHERE name = ANY($1) AND (name, id) > ($2, $3) ORDER BY name, id LIMIT $4",
                "preparing a search",
            )
            .await?;
            client
                .query(&statement, &[&filter.names, &after.name, &after.id, &fetch])
                .await
        } else {
            let next = "WHERE id > $1 ORDER BY id LIMIT $2";
            let statement = prepare_records(&client, next, "preparing a search").await?;
            client.query(&statement, &[&after.id, &fetch]).await
        }
        .or_engine("searching")?;
        let mut fill = PageFill::new(page.access, filter, limit);
        for row in &rows {
            if fill.is_full() {
                return Ok(fill.resume_later());
            }
            let record = record(row)?;
            fill.scan(Cursor::after(&record, by_name), Some(Cow::Owned(record)));
        }
        Ok(fill.end())
    }

    async fn claim_installation(
        &self,
        claim: &InstallationClaim,
    ) -> Result<ClaimOutcome, StorageError> {
        let client = self.client().await?;
        // One statement, so atomic on any replica: the row is written only
        // when free, expired or the same holder's; otherwise the conflict
        // leaves it (locked to the end of the statement) and nothing is
        // returned. The database's clock decides, the same for every
        // replica.
        let granted = client
            .query_opt(
                "WITH now AS (SELECT clock_timestamp() AS t)
                 INSERT INTO petstore_installation_claims AS c (installation, holder, expires_at)
                 SELECT $1, $2, t + make_interval(secs => $3::bigint::double precision) FROM now
                 ON CONFLICT (installation) DO UPDATE
                     SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at
                     WHERE c.holder = EXCLUDED.holder OR c.expires_at <= (SELECT t FROM now)
                 RETURNING holder, (extract(epoch FROM expires_at) * 1000)::bigint,
                     $3::bigint * 1000",
                &[&claim.installation, &claim.holder, &claim.ttl_seconds],
            )
            .await
            .or_engine("claiming an installation")?;
        if let Some(row) = granted {
            return claim_outcome(true, &row);
        }
        // Refused: who holds it, as committed now. It may have expired
        // since, which the next claim finds.
        let row = client
            .query_one(
                "WITH now AS (SELECT clock_timestamp() AS t)
                 SELECT holder, (extract(epoch FROM expires_at) * 1000)::bigint,
                     greatest((extract(epoch FROM expires_at - t) * 1000)::bigint, 0)
                 FROM petstore_installation_claims, now WHERE installation = $1",
                &[&claim.installation],
            )
            .await
            .or_engine("reading an installation's claim")?;
        claim_outcome(false, &row)
    }

    fn feed(&self) -> &ChangeFeed {
        &self.feed.feed
    }

    async fn catch_up(&self) -> Result<(), StorageError> {
        self.feed.read_new().await
    }
}

impl PostgresStorage {
    /// The records whose `column` holds each of `values`; `by` reads that
    /// column back from a record.
    async fn lookup(
        &self,
        column: &'static str,
        values: &[String],
        by: impl Fn(&PetRecord) -> Option<&String>,
    ) -> Result<Vec<Option<PetRecord>>, StorageError> {
        let client = self.client().await?;
        let any = format!("WHERE {column} = ANY($1)");
        let statement = prepare_records(&client, &any, "preparing a lookup").await?;
        let rows = client
            .query(&statement, &[&values])
            .await
            .or_engine("looking up pets")?;
        let mut found: HashMap<String, PetRecord> = HashMap::with_capacity(rows.len());
        for row in &rows {
            let record = record(row)?;
            if let Some(value) = by(&record) {
                found.insert(value.clone(), record);
            }
        }
        Ok(values.iter().map(|v| found.get(v).cloned()).collect())
    }
}

/// Prepares, once per connection, a query of whole records: the record's
/// columns from `petstore_pets`, then `rest` (its WHERE, ORDER BY, LIMIT).
async fn prepare_records(
    client: &deadpool_postgres::Object,
    rest: &str,
    action: &'static str,
) -> Result<tokio_postgres::Statement, StorageError> {
    client
        .prepare_cached(&format!("SELECT {COLUMNS} FROM petstore_pets {rest}"))
        .await
        .or_engine(action)
}

/// A claim's answer from a row of (holder, expiry in ms, ms remaining).
fn claim_outcome(granted: bool, row: &Row) -> Result<ClaimOutcome, StorageError> {
    Ok(ClaimOutcome {
        granted,
        holder: row.try_get(0).map_err(corrupt)?,
        expires_at_unix_millis: row.try_get(1).map_err(corrupt)?,
        remaining_millis: row.try_get(2).map_err(corrupt)?,
    })
}

/// For a unique-constraint violation (a key or identity another pet holds),
/// the violated constraint's name ("" if the server gave none).
fn unique_violation(err: &tokio_postgres::Error) -> Option<&str> {
    let db = err.as_db_error()?;
    (db.code() == &SqlState::UNIQUE_VIOLATION).then(|| db.constraint().unwrap_or_default())
}
