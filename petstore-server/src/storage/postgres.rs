//! PostgreSQL backend: any number of stateless store replicas serve one
//! database. Every request is one transaction, so batches stay all or
//! nothing; a unique constraint on the idempotency key makes concurrent
//! creates with the same key, from any replicas, produce one record.

use std::borrow::Cow;
use std::collections::HashMap;
use std::time::Duration;

use chrono::NaiveDate;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use futures::future::try_join_all;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{NoTls, Row};

use super::codec::{self, corrupt};
use super::{
    Cursor, OrEngine, PageFill, SearchPage, Storage, StorageError, check_key_changes, new_id,
};
use crate::model::{
    Added, KeyChange, NewPet, PetFields, PetRecord, PetUpdate, SearchFilter, Species,
};

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
];

const COLUMNS: &str = "id, name, species, birthday, idempotency_key";

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
}

impl PostgresStorage {
    /// Connects (retrying while the database is unreachable, up to the
    /// configured time) and brings the schema up to date.
    pub async fn open(config: &PostgresConfig) -> Result<Self, StorageError> {
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
        let storage = Self { pool };
        let deadline = tokio::time::Instant::now() + config.connect_timeout;
        loop {
            match storage.migrate().await {
                Ok(()) => return Ok(storage),
                Err(err) if tokio::time::Instant::now() < deadline => {
                    tracing::warn!(error = %err, "database not ready; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(err) => return Err(err),
            }
        }
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, StorageError> {
        self.pool
            .get()
            .await
            .or_engine("getting a database connection")
    }

    async fn migrate(&self) -> Result<(), StorageError> {
        let mut client = self.client().await?;
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
}

fn species_code(species: Species) -> i16 {
    // Species codes are 1 to 4, so the cast is lossless.
    codec::species_code(species) as i16
}

fn record(row: &Row) -> Result<PetRecord, StorageError> {
    let species: i16 = row.try_get(2).map_err(corrupt)?;
    Ok(PetRecord {
        id: row.try_get(0).map_err(corrupt)?,
        fields: PetFields {
            name: row.try_get(1).map_err(corrupt)?,
            species: codec::species_from_code(i32::from(species))?,
            birthday: row.try_get::<_, NaiveDate>(3).map_err(corrupt)?,
        },
        idempotency_key: row.try_get(4).map_err(corrupt)?,
    })
}

#[tonic::async_trait]
impl Storage for PostgresStorage {
    async fn add(&self, pets: &[NewPet]) -> Result<Vec<Added>, StorageError> {
        let mut client = self.client().await?;
        let insert = client
            .prepare_cached(
                "INSERT INTO petstore_pets (id, name, species, birthday, idempotency_key)
                 VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (idempotency_key) DO NOTHING
                 RETURNING id",
            )
            .await
            .or_engine("preparing an insert")?;
        let by_key = client
            .prepare_cached("SELECT id FROM petstore_pets WHERE idempotency_key = $1")
            .await
            .or_engine("preparing a lookup")?;
        let txn = client.transaction().await.or_engine("starting an add")?;
        let new_ids: Vec<String> = pets.iter().map(|_| new_id()).collect();
        let rows: Vec<(String, String, i16, NaiveDate, Option<String>)> = pets
            .iter()
            .zip(&new_ids)
            .map(|(pet, id)| {
                (
                    id.clone(),
                    pet.fields.name.clone(),
                    species_code(pet.fields.species),
                    pet.fields.birthday,
                    pet.idempotency_key.clone(),
                )
            })
            .collect();
        // Pipelined: the statements are sent together and run in order, so a
        // key repeated later in the batch meets the earlier row.
        let params: Vec<[&(dyn ToSql + Sync); 5]> = rows
            .iter()
            .map(|(id, name, species, birthday, key)| {
                [id as &(dyn ToSql + Sync), name, species, birthday, key]
            })
            .collect();
        let inserted = try_join_all(params.iter().map(|p| txn.query_opt(&insert, p)))
            .await
            .or_engine("adding pets")?;
        let mut ids = Vec::with_capacity(pets.len());
        for (row, (_, _, _, _, key)) in inserted.into_iter().zip(&rows) {
            match (row, key) {
                (Some(row), _) => ids.push(Added::new(row.try_get(0).or_engine("reading an ID")?)),
                // The key was taken (by a committed transaction, which the
                // unique index waited for, or earlier in this batch).
                (None, Some(key)) => {
                    let row = txn
                        .query_one(&by_key, &[key])
                        .await
                        .or_engine("looking up a key")?;
                    ids.push(Added::existing(row.try_get(0).or_engine("reading an ID")?));
                }
                (None, None) => {
                    return Err(StorageError::engine(
                        "adding pets",
                        "an insert without a key returned no row",
                    ));
                }
            }
        }
        txn.commit().await.or_engine("committing an add")?;
        Ok(ids)
    }

    async fn update(&self, pets: &[PetUpdate]) -> Result<(), StorageError> {
        let mut client = self.client().await?;
        let statement = client
            .prepare_cached(
                "UPDATE petstore_pets SET name = $2, species = $3, birthday = $4 WHERE id = $1",
            )
            .await
            .or_engine("preparing an update")?;
        let txn = client.transaction().await.or_engine("starting an update")?;
        let codes: Vec<i16> = pets
            .iter()
            .map(|p| species_code(p.fields.species))
            .collect();
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
        let counts = try_join_all(params.iter().map(|p| txn.execute(&statement, p)))
            .await
            .or_engine("updating pets")?;
        if let Some(index) = counts.iter().position(|&n| n == 0) {
            // Dropping the transaction rolls it back: nothing changes.
            return Err(StorageError::NotFound {
                index,
                id: pets[index].id.clone(),
            });
        }
        txn.commit().await.or_engine("committing an update")
    }

    async fn delete(&self, ids: &[String]) -> Result<(), StorageError> {
        let client = self.client().await?;
        let statement = client
            .prepare_cached("DELETE FROM petstore_pets WHERE id = ANY($1)")
            .await
            .or_engine("preparing a delete")?;
        // One statement is one transaction: all or nothing.
        client
            .execute(&statement, &[&ids])
            .await
            .or_engine("deleting pets")?;
        Ok(())
    }

    async fn get(&self, ids: &[String]) -> Result<Vec<Option<PetRecord>>, StorageError> {
        self.lookup("id", ids).await
    }

    async fn get_by_keys(&self, keys: &[String]) -> Result<Vec<Option<PetRecord>>, StorageError> {
        self.lookup("idempotency_key", keys).await
    }

    async fn set_keys(&self, changes: &[KeyChange]) -> Result<(), StorageError> {
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
        // Locks the pets in ID order (two requests cannot deadlock), so
        // their keys cannot change between this check and the write.
        let rows = txn
            .query(
                "SELECT id, idempotency_key FROM petstore_pets WHERE id = ANY($1) ORDER BY id FOR UPDATE",
                &[&ids],
            )
            .await
            .or_engine("reading keys")?;
        let mut current: HashMap<String, String> = HashMap::with_capacity(rows.len());
        for row in &rows {
            let id: String = row.try_get(0).or_engine("reading keys")?;
            let key: Option<String> = row.try_get(1).or_engine("reading keys")?;
            current.insert(id, key.unwrap_or_default());
        }
        let rows = txn
            .query(
                "SELECT idempotency_key, id FROM petstore_pets WHERE idempotency_key = ANY($1)",
                &[&new_keys],
            )
            .await
            .or_engine("reading keys")?;
        let mut holders: HashMap<String, String> = HashMap::with_capacity(rows.len());
        for row in &rows {
            holders.insert(
                row.try_get(0).or_engine("reading keys")?,
                row.try_get(1).or_engine("reading keys")?,
            );
        }
        // The same decision as every other backend.
        if let Some(refusal) = check_key_changes(
            changes,
            |id| Ok(current.get(id).cloned()),
            |key| Ok(holders.get(key).cloned()),
        )? {
            return Err(refusal);
        }
        // Clear first, so keys may move between pets of this request without
        // tripping the unique constraint midway.
        txn.execute(
            "UPDATE petstore_pets SET idempotency_key = NULL WHERE id = ANY($1)",
            &[&ids],
        )
        .await
        .or_engine("changing keys")?;
        for (index, change) in changes.iter().enumerate() {
            if change.new_key.is_empty() {
                continue;
            }
            if let Err(err) = txn
                .execute(
                    "UPDATE petstore_pets SET idempotency_key = $2 WHERE id = $1",
                    &[&change.id, &change.new_key],
                )
                .await
            {
                // A key taken since the check, by a create on any replica
                // (the unique index waited for it to commit). Dropping the
                // transaction rolls everything back.
                return Err(if is_unique_violation(&err) {
                    StorageError::KeyTaken {
                        index,
                        key: change.new_key.clone(),
                    }
                } else {
                    StorageError::engine("changing keys", err)
                });
            }
        }
        txn.commit().await.or_engine("committing key changes")
    }

    async fn search_page(
        &self,
        filter: &SearchFilter,
        after: Option<Cursor>,
        limit: usize,
    ) -> Result<SearchPage, StorageError> {
        let client = self.client().await?;
        let by_name = !filter.names.is_empty();
        let after = after.unwrap_or_default();
        // The walk's next `limit` entries and one more, which tells whether
        // the walk goes on. The filter is applied below, as in the other
        // backends, not in SQL: a query for a page of matches could scan
        // the whole table for a selective filter.
        let fetch = i64::try_from(limit.max(1).saturating_add(1)).unwrap_or(i64::MAX);
        let rows = if by_name {
            let statement = client
                .prepare_cached(&format!(
                    "SELECT {COLUMNS} FROM petstore_pets
                     WHERE name = ANY($1) AND (name, id) > ($2, $3)
                     ORDER BY name, id LIMIT $4"
                ))
                .await
                .or_engine("preparing a search")?;
            client
                .query(&statement, &[&filter.names, &after.name, &after.id, &fetch])
                .await
        } else {
            let statement = client
                .prepare_cached(&format!(
                    "SELECT {COLUMNS} FROM petstore_pets WHERE id > $1 ORDER BY id LIMIT $2"
                ))
                .await
                .or_engine("preparing a search")?;
            client.query(&statement, &[&after.id, &fetch]).await
        }
        .or_engine("searching")?;
        let mut fill = PageFill::new(filter, limit);
        for row in &rows {
            if fill.is_full() {
                return Ok(fill.resume_later());
            }
            let record = record(row)?;
            fill.scan(Cursor::after(&record, by_name), Some(Cow::Owned(record)));
        }
        Ok(fill.end())
    }
}

impl PostgresStorage {
    async fn lookup(
        &self,
        column: &'static str,
        values: &[String],
    ) -> Result<Vec<Option<PetRecord>>, StorageError> {
        let client = self.client().await?;
        let statement = client
            .prepare_cached(&format!(
                "SELECT {COLUMNS} FROM petstore_pets WHERE {column} = ANY($1)"
            ))
            .await
            .or_engine("preparing a lookup")?;
        let rows = client
            .query(&statement, &[&values])
            .await
            .or_engine("looking up pets")?;
        let mut found: HashMap<String, PetRecord> = HashMap::with_capacity(rows.len());
        for row in &rows {
            let record = record(row)?;
            let by = if column == "id" {
                record.id.clone()
            } else {
                record.idempotency_key.clone().unwrap_or_default()
            };
            found.insert(by, record);
        }
        Ok(values.iter().map(|v| found.get(v).cloned()).collect())
    }
}

/// True for a unique-constraint violation (a key another pet holds).
fn is_unique_violation(err: &tokio_postgres::Error) -> bool {
    err.code() == Some(&SqlState::UNIQUE_VIOLATION)
}
