//! The external-client contract the reconciler depends on, after Crossplane's
//! managed-resource clients: observe by ID and by idempotency key, create,
//! update, delete, and change a record's key (ownership) atomically.
//! [`grpc::GrpcPetStore`] is the real one; tests use a fake.

pub mod budget;
pub mod echoes;
pub mod grpc;
pub mod limiter;
pub mod mapping;
pub mod owner;

#[cfg(test)]
pub mod fake;

use chrono::NaiveDate;

use crate::crd::{PetSpec, PetType};
pub use owner::{Holder, Owner};

/// A pet's data as the store holds it; what reconciliation compares.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PetData {
    pub name: String,
    pub pet_type: PetType,
    pub birthday: NaiveDate,
}

impl From<&PetSpec> for PetData {
    fn from(spec: &PetSpec) -> Self {
        Self {
            name: spec.name.clone(),
            pet_type: spec.pet_type,
            birthday: spec.birth_date(),
        }
    }
}

impl PetData {
    /// The fields that differ from `to`, in the order the spec lists them.
    pub fn changes_to(&self, to: &PetData) -> Changes {
        let mut changes = Vec::new();
        if self.name != to.name {
            changes.push(FieldChange {
                field: Field::Name,
                from: format!("{:?}", self.name),
                to: format!("{:?}", to.name),
            });
        }
        if self.pet_type != to.pet_type {
            changes.push(FieldChange {
                field: Field::Type,
                from: self.pet_type.as_str().to_owned(),
                to: to.pet_type.as_str().to_owned(),
            });
        }
        if self.birthday != to.birthday {
            changes.push(FieldChange {
                field: Field::Birthday,
                from: self.birthday.to_string(),
                to: to.birthday.to_string(),
            });
        }
        Changes(changes)
    }
}

/// A spec field that can drift in its record; the `field` label of
/// `drift_detected_total`. `Record` stands for the whole record (it
/// vanished).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Field {
    Name,
    /// The spec's `type` (the wire's `PetType`).
    Type,
    Birthday,
    /// The idempotency key: who owns the record (never drift).
    Key,
    /// The identity: which Pet name finds the record (never drift).
    Identity,
    Record,
}

impl Field {
    pub const fn as_str(self) -> &'static str {
        match self {
            Field::Name => "name",
            Field::Type => "type",
            Field::Birthday => "birthday",
            Field::Key => "key",
            Field::Identity => "identity",
            Field::Record => "record",
        }
    }
}

/// One field's old and new value, as a person reads them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldChange {
    pub field: Field,
    pub from: String,
    pub to: String,
}

/// What a write changed, shown as `name "Thorbert" -> "Thor", type cat -> dog`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changes(pub Vec<FieldChange>);

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn fields(&self) -> impl Iterator<Item = Field> + '_ {
        self.0.iter().map(|change| change.field)
    }
}

impl std::fmt::Display for Changes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, change) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(
                f,
                "{} {} -> {}",
                change.field.as_str(),
                change.from,
                change.to
            )?;
        }
        Ok(())
    }
}

/// A record observed in the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub id: String,
    /// Its idempotency key, parsed: the Pet that owns it, nobody (made
    /// outside Kubernetes, or released by Orphan), or a handover.
    pub key: Owner,
    /// The `<namespace>/<name>` of the Pet it was last owned by, kept when
    /// it is released; empty for a record made outside Kubernetes or by an
    /// operator older than identities.
    pub identity: String,
    pub data: PetData,
}

/// One change to a record, as the store's change feed reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordChange {
    /// The store's revision of this change; it only grows.
    pub revision: i64,
    pub id: String,
    /// The record after the change; `None` when it was deleted.
    pub record: Option<Record>,
    /// The record's identity: after the change, or, for a delete, as it was
    /// before (empty from a store that does not say).
    pub identity: String,
}

/// One message of the change feed: the store's revision, and the changes
/// up to it (none in a progress message).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FeedBatch {
    pub revision: i64,
    pub changes: Vec<RecordChange>,
}

/// The change feed, until the store ends it or an error.
pub type Feed = futures::stream::BoxStream<'static, Result<FeedBatch, StoreError>>;

/// One observation: the record with the asked ID, the record with the
/// asked key and the record with the asked identity (one record may be all
/// three).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Lookup {
    pub by_id: Option<Record>,
    pub by_key: Option<Record>,
    pub by_identity: Option<Record>,
    /// The store looked the identity up: it found it or said it was
    /// missing. A store older than identities does neither, and keeps none.
    pub identities: bool,
}

impl Lookup {
    /// Every distinct record read, in the order by ID, key, identity.
    pub fn records(&self) -> impl Iterator<Item = &Record> {
        let mut seen: Vec<&str> = Vec::with_capacity(3);
        [&self.by_id, &self.by_key, &self.by_identity]
            .into_iter()
            .flatten()
            .filter(move |record| {
                let new = !seen.contains(&record.id.as_str());
                seen.push(&record.id);
                new
            })
    }
}

/// What a create did, as far as the store says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Created {
    /// This call created the record.
    New(String),
    /// The key already named this record: nothing was created, and its data
    /// may differ from what was sent.
    Existing(String),
    /// The store did not say which (a store that predates the answer).
    Unknown(String),
}

impl Created {
    pub fn id(&self) -> &str {
        match self {
            Created::New(id) | Created::Existing(id) | Created::Unknown(id) => id,
        }
    }

    pub fn into_id(self) -> String {
        match self {
            Created::New(id) | Created::Existing(id) | Created::Unknown(id) => id,
        }
    }

    /// Whether the store said if the record already existed.
    pub fn is_known(&self) -> bool {
        !matches!(self, Created::Unknown(_))
    }
}

/// One of the store operations below, as errors and metrics name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Operation {
    Observe,
    Create,
    Update,
    Delete,
    SetKey,
    Watch,
    /// `kubectl petstore import`'s read; the operator never searches.
    Search,
    /// The claim on the installation's name (see
    /// [`PetStore::claim_installation`]).
    Claim,
}

impl Operation {
    /// The word in error messages.
    pub const fn as_str(self) -> &'static str {
        match self {
            Operation::Observe => "observe",
            Operation::Create => "create",
            Operation::Update => "update",
            Operation::Delete => "delete",
            Operation::SetKey => "set key",
            Operation::Watch => "watch",
            Operation::Search => "search",
            Operation::Claim => "claim installation",
        }
    }

    /// The method of the RPC behind it, which labels the store call metric.
    pub const fn method(self) -> &'static str {
        match self {
            Operation::Observe => "GetPets",
            Operation::Create => "AddPets",
            Operation::Update => "UpdatePets",
            Operation::Delete => "DeletePets",
            Operation::SetKey => "SetIdempotencyKeys",
            Operation::Watch => "WatchPets",
            Operation::Search => "SearchPets",
            Operation::Claim => "ClaimInstallation",
        }
    }

    /// The RPC's full name, for the message about a store that lacks it.
    pub const fn rpc(self) -> &'static str {
        match self {
            Operation::Observe => "petstore.PetStore/GetPets",
            Operation::Create => "petstore.PetStore/AddPets",
            Operation::Update => "petstore.PetStore/UpdatePets",
            Operation::Delete => "petstore.PetStore/DeletePets",
            Operation::SetKey => "petstore.PetStore/SetIdempotencyKeys",
            Operation::Watch => "petstore.PetStore/WatchPets",
            Operation::Search => "petstore.PetStore/SearchPets",
            Operation::Claim => "petstore.PetStore/ClaimInstallation",
        }
    }
}

#[derive(Clone, Debug, thiserror::Error)]
pub enum StoreError {
    /// The store could not be reached or did not answer in time; retry later.
    #[error("pet store unavailable during {operation}: {message}")]
    Unavailable {
        operation: Operation,
        message: String,
        /// How long the store asked callers to wait (its
        /// `grpc-retry-pushback-ms`), if it did.
        retry_after: Option<std::time::Duration>,
    },
    /// The store refused the request as invalid; retrying the same spec
    /// cannot succeed.
    #[error("pet store rejected {operation}: {message}")]
    Rejected {
        operation: Operation,
        message: String,
    },
    /// The record to update does not exist (deleted meanwhile).
    #[error("pet store has no record {id:?}")]
    NotFound { id: String },
    /// A key change lost a race: the record's key is no longer what was
    /// observed, or the new key already belongs to another record.
    #[error("pet store refused to change the key of record {id:?}: {message}")]
    KeyConflict { id: String, message: String },
    /// The store does not offer an extension RPC the operator needs (the
    /// original pet store has only AddPets, UpdatePets, DeletePets and
    /// SearchPets).
    #[error(
        "the pet store does not implement {}, an extension this operator needs (GetPets, SetIdempotencyKeys and AddPets with idempotency_key); run this project's petstore-server",
        .operation.rpc()
    )]
    Unimplemented { operation: Operation },
    /// The change feed cannot resume from the asked revision: the store no
    /// longer keeps that history (as Kubernetes answers 410 Gone), or never
    /// had it (a store restarted without its history). Re-read, then watch
    /// from now.
    #[error("pet store cannot resume its change feed: {message}")]
    HistoryLost { message: String },
    /// The store did not accept who the call said it came from (no token,
    /// or one it does not trust), or refused it the record (another
    /// tenant's): retrying the same call cannot succeed until someone
    /// changes the setup.
    #[error("pet store refused {operation}: {message}")]
    Denied {
        operation: Operation,
        message: String,
    },
    /// Any other failure; treated as transient.
    #[error("pet store failed during {operation}: {message}")]
    Failed {
        operation: Operation,
        message: String,
    },
}

/// The operations reconciliation needs from the pet store. Every one is
/// idempotent, so a retry after a crash or timeout is always safe.
#[tonic::async_trait]
pub trait PetStore: Send + Sync + 'static {
    /// In one read: the record with ID `id` (if asked), the record whose
    /// idempotency key is `key`, and the record holding `identity` (if
    /// asked).
    async fn observe(
        &self,
        id: Option<&str>,
        key: &str,
        identity: Option<&str>,
    ) -> Result<Lookup, StoreError>;
    /// Creates a record with this key and identity, or returns the one that
    /// already holds either, saying which if the store tells.
    async fn create(
        &self,
        key: &str,
        identity: Option<&str>,
        pet: &PetData,
    ) -> Result<Created, StoreError>;
    /// Replaces the record's data.
    async fn update(&self, id: &str, pet: &PetData) -> Result<(), StoreError>;
    /// Deletes the record; a missing record counts as deleted.
    async fn delete(&self, id: &str) -> Result<(), StoreError>;
    /// Sets the record's key to `new` only if it is still `expected` (empty
    /// for none), and its identity to `identity` if given:
    /// [`StoreError::KeyConflict`] otherwise, or when another record holds
    /// the identity. Setting the key it already has succeeds.
    async fn set_key(
        &self,
        id: &str,
        expected: &str,
        new: &str,
        identity: Option<&str>,
    ) -> Result<(), StoreError>;

    /// The store's change feed: every change after `after_revision`, or,
    /// with 0, from now on (the first batch then carries the current
    /// revision and no changes). [`StoreError::Unimplemented`] from a store
    /// without one, such as the book's.
    async fn watch(&self, after_revision: i64) -> Result<Feed, StoreError> {
        let _ = after_revision;
        Err(StoreError::Unimplemented {
            operation: Operation::Watch,
        })
    }

    /// Whether the store holds no record this client can read: the first
    /// answer of an unfiltered search. False from a store that cannot tell.
    async fn holds_no_records(&self) -> Result<bool, StoreError> {
        Ok(false)
    }

    /// Whether this client's reads show every tenant's records: true from
    /// a store that checks no tenants, and from one that names the caller
    /// an observer (`--observer`); false from one that takes the caller
    /// for a tenant, whose change feed shows that tenant's records only.
    async fn reads_every_tenant(&self) -> Result<bool, StoreError> {
        Ok(true)
    }

    /// Claims the installation's name `installation` in the store for
    /// `holder` (this cluster) for `ttl`, or renews this holder's claim:
    /// refused while another holder's claim lasts.
    /// [`StoreError::Unimplemented`] from a store without claims, such as
    /// the book's.
    async fn claim_installation(
        &self,
        installation: &str,
        holder: &str,
        ttl: std::time::Duration,
    ) -> Result<InstallationClaim, StoreError> {
        let _ = (installation, holder, ttl);
        Err(StoreError::Unimplemented {
            operation: Operation::Claim,
        })
    }

    /// The operator's own writes, noted for the change feed to recognise
    /// (see [`echoes`]); `None` for a store that does not note them.
    fn echoes(&self) -> Option<&echoes::Echoes> {
        None
    }

    /// Whether the store answers, and with the extensions: one read by a
    /// key no Pet has.
    async fn probe(&self) -> Probe {
        match self.observe(None, PROBE_KEY, None).await {
            Ok(_) => Probe::Extended,
            Err(StoreError::Unavailable { .. }) => Probe::Down,
            Err(_) => Probe::Answers,
        }
    }
}

/// Who the store is told the caller is: the bearer token each call
/// carries to a store that checks it (docs/tenancy.md).
#[tonic::async_trait]
pub trait Credentials: Send + Sync + 'static {
    /// The `authorization` header for the next call, or why there is none
    /// (a person can act on it: the ServiceAccount to create, say).
    async fn authorization(&self) -> Result<tonic::codegen::http::HeaderValue, String>;
    /// The store refused the last token: the next call gets a fresh one.
    fn refused(&self);
}

/// The store's answer to a claim on an installation's name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstallationClaim {
    /// The claimant holds the name now.
    pub granted: bool,
    /// Who holds it: the claimant if granted, else the other holder.
    pub holder: String,
    /// When that claim expires, by the store's clock.
    pub expires_at: chrono::DateTime<chrono::Utc>,
    /// How long until then, as the store answered (whatever this
    /// machine's clock says).
    pub remaining: std::time::Duration,
}

/// What [`PetStore::probe`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    /// No answer.
    Down,
    /// An answer, but not the extensions' (the book's store).
    Answers,
    /// This project's store, extensions and all.
    Extended,
}

/// The key [`PetStore::probe`] looks up; no Pet's UID looks like it.
const PROBE_KEY: &str = "petstore-operator-probe";
