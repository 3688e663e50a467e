//! Tenancy: its rules in every storage backend (one case per rule, through
//! the `Storage` trait, run against memory, durable and PostgreSQL), then
//! a tenancy-on server with two tenants and an observer, through gRPC.

use std::sync::Arc;

use chrono::NaiveDate;
use petstore_server::model::{KeyChange, NewPet, PetFields, PetRecord, PetUpdate, ValidPetType};
use petstore_server::storage::{ChangeKind, Storage, StorageError, search_all};
use petstore_server::tenancy::{Access, Denial};

#[macro_use]
mod support;

use support::Backend;

// ---- the rules, in every backend --------------------------------------------

async fn open(backend: Backend) -> (Arc<dyn Storage>, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let storage = backend
        .config(&dir, "tenancy")
        .await
        .open()
        .await
        .expect("open storage");
    (storage, dir)
}

fn tenant(ns: &str) -> Access {
    Access::Tenant(ns.into())
}

fn fields(name: &str) -> PetFields {
    PetFields {
        name: name.into(),
        pet_type: ValidPetType::Canine,
        birthday: NaiveDate::from_ymd_opt(2021, 4, 1).expect("date"),
    }
}

fn new_pet(name: &str, key: Option<&str>, identity: Option<&str>) -> NewPet {
    NewPet {
        fields: fields(name),
        idempotency_key: key.map(str::to_owned),
        identity: identity.map(str::to_owned),
    }
}

/// Adds one pet for `access`; its ID.
async fn add_one(storage: &dyn Storage, access: &Access, pet: NewPet) -> String {
    let added = storage.add(access, &[pet]).await.expect("add");
    assert!(added[0].created);
    added[0].id.clone()
}

/// The record as everyone (tenancy off) sees it.
async fn stored(storage: &dyn Storage, id: &str) -> Option<PetRecord> {
    storage
        .get(&Access::All, &[id.to_owned()])
        .await
        .expect("get")
        .remove(0)
}

/// The names `access` finds by a full search, sorted.
async fn names_seen(storage: &dyn Storage, access: &Access) -> Vec<String> {
    let mut names: Vec<String> = search_all(storage, access, &Default::default(), 2)
        .await
        .expect("search")
        .into_iter()
        .map(|r| r.fields.name)
        .collect();
    names.sort();
    names
}

/// The refusal's denial and field.
fn denied(err: StorageError) -> (Denial, String) {
    match err {
        StorageError::Denied { denial, field, .. } => (denial, field),
        other => panic!("expected a tenancy refusal, got {other:?}"),
    }
}

/// The store's revision, with every commit read into the feed (PostgreSQL
/// reads its change table behind the writes).
async fn revision(storage: &dyn Storage) -> i64 {
    storage.catch_up().await.expect("catch up");
    storage.feed().current()
}

fn rename(id: &str, name: &str) -> PetUpdate {
    PetUpdate {
        id: id.into(),
        fields: fields(name),
    }
}

fn key_change(id: &str, expected: &str, new: &str, identity: Option<&str>) -> KeyChange {
    KeyChange {
        id: id.into(),
        expected_key: expected.into(),
        new_key: new.into(),
        new_identity: identity.map(str::to_owned),
    }
}

/// A: its own; B: b's; Legacy: made before tenancy, no identity;
/// LegacyA: before tenancy, identity in a; LegacyB: before, identity in b.
async fn populated(storage: &dyn Storage) -> [String; 5] {
    [
        add_one(
            storage,
            &tenant("a"),
            new_pet("A", Some("key-a"), Some("a/a")),
        )
        .await,
        add_one(
            storage,
            &tenant("b"),
            new_pet("B", Some("key-b"), Some("b/b")),
        )
        .await,
        add_one(
            storage,
            &Access::All,
            new_pet("Legacy", Some("key-legacy"), None),
        )
        .await,
        add_one(
            storage,
            &Access::All,
            new_pet("LegacyA", None, Some("a/legacy")),
        )
        .await,
        add_one(
            storage,
            &Access::All,
            new_pet("LegacyB", None, Some("b/legacy")),
        )
        .await,
    ]
}

async fn a_tenant_reads_its_records_and_unowned_ones_in_its_namespace(backend: Backend) {
    let (storage, _dir) = open(backend).await;
    let [a, b, legacy, legacy_a, legacy_b] = populated(&*storage).await;
    assert_eq!(
        names_seen(&*storage, &tenant("a")).await,
        ["A", "Legacy", "LegacyA"]
    );
    assert_eq!(
        names_seen(&*storage, &tenant("b")).await,
        ["B", "Legacy", "LegacyB"]
    );
    let ids = [a, b.clone(), legacy, legacy_a, legacy_b.clone()].map(String::from);
    let found = storage.get(&tenant("a"), &ids).await.expect("get");
    let seen: Vec<bool> = found.iter().map(Option::is_some).collect();
    assert_eq!(seen, [true, false, true, true, false]);
    let by_key = storage
        .get_by_keys(&tenant("a"), &["key-a".into(), "key-b".into()])
        .await
        .expect("by key");
    assert!(by_key[0].is_some() && by_key[1].is_none());
    let by_identity = storage
        .get_by_identities(
            &tenant("a"),
            &["b/b".into(), "b/legacy".into(), "a/legacy".into()],
        )
        .await
        .expect("by identity");
    let seen: Vec<bool> = by_identity.iter().map(Option::is_some).collect();
    assert_eq!(seen, [false, false, true]);
    // A page scans what it may not return, and goes on.
    let by_name = petstore_server::model::SearchFilter {
        names: vec!["B".into(), "A".into()],
        ..Default::default()
    };
    let found = search_all(&*storage, &tenant("a"), &by_name, 1)
        .await
        .expect("search by name");
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].fields.name, "A");
    assert_eq!(found[0].tenant, "a");
}

async fn an_observer_reads_everything_and_writes_nothing(backend: Backend) {
    let (storage, _dir) = open(backend).await;
    let [a, b, legacy, ..] = populated(&*storage).await;
    assert_eq!(names_seen(&*storage, &Access::Observer).await.len(), 5);
    let found = storage
        .get(&Access::Observer, &[a.clone(), b.clone()])
        .await
        .expect("get");
    assert!(found.iter().all(Option::is_some));
    let observer = Access::Observer;
    let add = storage.add(&observer, &[new_pet("New", None, None)]).await;
    assert_eq!(denied(add.expect_err("add")).0, Denial::ObserverWrite);
    let update = storage.update(&observer, &[rename(&a, "Renamed")]).await;
    assert_eq!(denied(update.expect_err("update")).0, Denial::ObserverWrite);
    let delete = storage.delete(&observer, std::slice::from_ref(&b));
    assert_eq!(
        denied(delete.await.expect_err("delete")).0,
        Denial::ObserverWrite
    );
    let claim = storage
        .set_keys(
            &observer,
            &[key_change(&legacy, "key-legacy", "x", Some("a/x"))],
        )
        .await;
    assert_eq!(
        denied(claim.expect_err("set keys")).0,
        Denial::ObserverWrite
    );
    assert_eq!(
        names_seen(&*storage, &Access::All).await.len(),
        5,
        "nothing changed"
    );
    assert_eq!(stored(&*storage, &a).await.expect("a").fields.name, "A");
}

async fn a_tenants_new_records_are_its_own_and_their_identities_in_its_namespace(backend: Backend) {
    let (storage, _dir) = open(backend).await;
    let id = add_one(
        &*storage,
        &tenant("a"),
        new_pet("Thor", None, Some("a/thor")),
    )
    .await;
    assert_eq!(stored(&*storage, &id).await.expect("thor").tenant, "a");
    // The whole batch is refused, naming the pet whose identity is not a's.
    let err = storage
        .add(
            &tenant("a"),
            &[
                new_pet("Ok", None, Some("a/ok")),
                new_pet("Bad", None, Some("b/bad")),
            ],
        )
        .await
        .expect_err("identity in b");
    let (denial, field) = denied(err);
    assert_eq!(field, "pets[1].identity");
    assert!(matches!(denial, Denial::IdentityNamespace { .. }));
    assert_eq!(names_seen(&*storage, &Access::All).await, ["Thor"]);
    // With tenancy off, records get no tenant.
    let off = add_one(&*storage, &Access::All, new_pet("Off", None, Some("b/off"))).await;
    assert_eq!(stored(&*storage, &off).await.expect("off").tenant, "");
}

async fn an_add_naming_a_record_the_tenant_may_not_write_is_refused_without_its_id(
    backend: Backend,
) {
    let (storage, _dir) = open(backend).await;
    let [a, b, _legacy, legacy_a, _] = populated(&*storage).await;
    // b's key, in a batch with a new pet: refused whole, b's ID untold.
    let err = storage
        .add(
            &tenant("a"),
            &[
                new_pet("Fresh", None, None),
                new_pet("Copy", Some("key-b"), None),
            ],
        )
        .await
        .expect_err("b's key");
    assert!(!err.to_string().contains(&b), "{err}");
    let (denial, field) = denied(err);
    assert_eq!(
        (denial, field.as_str()),
        (Denial::CrossTenant, "pets[1].idempotency_key")
    );
    // A key of a record from before tenancy without an identity: import it instead.
    let err = storage
        .add(&tenant("a"), &[new_pet("Copy", Some("key-legacy"), None)])
        .await
        .expect_err("legacy key");
    assert_eq!(denied(err).0, Denial::Unclaimed);
    assert_eq!(
        names_seen(&*storage, &Access::All).await.len(),
        5,
        "nothing added"
    );
    // Its own key, and an unowned record's identity in its namespace, come back.
    let again = storage
        .add(
            &tenant("a"),
            &[
                new_pet("A", Some("key-a"), None),
                new_pet("LegacyA", None, Some("a/legacy")),
            ],
        )
        .await
        .expect("own records");
    assert_eq!(
        (again[0].id.as_str(), again[0].created),
        (a.as_str(), false)
    );
    assert_eq!(
        (again[1].id.as_str(), again[1].created),
        (legacy_a.as_str(), false)
    );
    // A key a new pet of this batch takes names that pet.
    let batch = storage
        .add(
            &tenant("a"),
            &[
                new_pet("N", Some("key-n"), None),
                new_pet("N", Some("key-n"), Some("b/x")),
            ],
        )
        .await;
    assert!(batch.is_err(), "an identity in b is refused even so");
    let batch = storage
        .add(
            &tenant("a"),
            &[
                new_pet("N", Some("key-n"), None),
                new_pet("N", Some("key-n"), None),
            ],
        )
        .await
        .expect("same key twice");
    assert_eq!(batch[0].id, batch[1].id);
}

async fn cross_tenant_writes_are_refused_whole_and_change_nothing(backend: Backend) {
    let (storage, _dir) = open(backend).await;
    let [a, b, ..] = populated(&*storage).await;
    let before = stored(&*storage, &b).await;
    let at = revision(&*storage).await;

    let err = storage
        .update(&tenant("a"), &[rename(&a, "A2"), rename(&b, "Stolen")])
        .await
        .expect_err("update b's");
    assert_eq!(denied(err), (Denial::CrossTenant, "pets[1].id".to_owned()));
    let err = storage
        .delete(&tenant("a"), &["no-such-id".into(), a.clone(), b.clone()])
        .await
        .expect_err("delete b's");
    assert_eq!(denied(err), (Denial::CrossTenant, "ids[2]".to_owned()));
    let err = storage
        .set_keys(
            &tenant("a"),
            &[
                key_change(&a, "key-a", "key-a2", None),
                key_change(&b, "key-b", "mine", None),
            ],
        )
        .await
        .expect_err("re-key b's");
    assert_eq!(
        denied(err),
        (Denial::CrossTenant, "changes[1].id".to_owned())
    );

    assert_eq!(stored(&*storage, &b).await, before, "b's record unchanged");
    let own = stored(&*storage, &a).await.expect("a's");
    assert_eq!(
        (own.fields.name.as_str(), own.idempotency_key.as_deref()),
        ("A", Some("key-a"))
    );
    assert_eq!(revision(&*storage).await, at, "no change announced");
    // Deleting what is missing stays a success; its own goes.
    storage
        .delete(&tenant("a"), &["no-such-id".into(), a.clone()])
        .await
        .expect("delete its own");
    assert!(stored(&*storage, &a).await.is_none());
}

async fn a_tenants_first_write_stamps_a_record_from_before_tenancy_in_its_namespace(
    backend: Backend,
) {
    let (storage, _dir) = open(backend).await;
    let [_, _, _, legacy_a, legacy_b] = populated(&*storage).await;
    let at = revision(&*storage).await;
    // b may not write a's.
    let err = storage
        .update(&tenant("b"), &[rename(&legacy_a, "Taken")])
        .await
        .expect_err("b writes a's");
    assert_eq!(denied(err).0, Denial::CrossTenant);
    assert_eq!(
        stored(&*storage, &legacy_a).await.expect("record").tenant,
        ""
    );
    // An update to the same values changes nothing but the tenant: no change
    // is announced, and the record is a's from now on.
    storage
        .update(&tenant("a"), &[rename(&legacy_a, "LegacyA")])
        .await
        .expect("a writes its own");
    assert_eq!(
        stored(&*storage, &legacy_a).await.expect("record").tenant,
        "a"
    );
    assert_eq!(revision(&*storage).await, at);
    // A key change stamps too, announcing the record with its tenant.
    storage
        .set_keys(&tenant("b"), &[key_change(&legacy_b, "", "key-lb", None)])
        .await
        .expect("b keys its own");
    let record = stored(&*storage, &legacy_b).await.expect("record");
    assert_eq!(
        (record.tenant.as_str(), record.idempotency_key.as_deref()),
        ("b", Some("key-lb"))
    );
    storage.catch_up().await.expect("catch up");
    let changes = storage.feed().read_after(at, 10).expect("feed");
    assert_eq!(changes.len(), 1);
    assert_eq!(changes[0].kind, ChangeKind::KeyChanged);
    assert_eq!(
        changes[0].record.as_ref().map(|r| r.tenant.as_str()),
        Some("b")
    );
}

async fn a_record_from_before_tenancy_without_identity_is_claimed_only_by_import(backend: Backend) {
    let (storage, _dir) = open(backend).await;
    let [_, _, legacy, ..] = populated(&*storage).await;
    let refused = [
        storage
            .update(&tenant("a"), &[rename(&legacy, "Mine")])
            .await,
        storage
            .delete(&tenant("a"), std::slice::from_ref(&legacy))
            .await,
        storage
            .set_keys(
                &tenant("a"),
                &[key_change(&legacy, "key-legacy", "k2", None)],
            )
            .await,
        storage
            .set_keys(
                &tenant("a"),
                &[key_change(&legacy, "key-legacy", "k2", Some(""))],
            )
            .await,
    ];
    for result in refused {
        assert_eq!(
            denied(result.expect_err("not an import")).0,
            Denial::Unclaimed
        );
    }
    let err = storage
        .set_keys(
            &tenant("a"),
            &[key_change(
                &legacy,
                "key-legacy",
                "key-legacy",
                Some("b/legacy2"),
            )],
        )
        .await
        .expect_err("an identity in b");
    assert_eq!(denied(err).1, "changes[0].new_identity");
    assert_eq!(stored(&*storage, &legacy).await.expect("legacy").tenant, "");
    // The import: an identity in a, in the same compare-and-set.
    storage
        .set_keys(
            &tenant("a"),
            &[key_change(
                &legacy,
                "key-legacy",
                "uid-1",
                Some("a/legacy-thor"),
            )],
        )
        .await
        .expect("import");
    let record = stored(&*storage, &legacy).await.expect("imported");
    assert_eq!(record.tenant, "a");
    assert_eq!(record.identity.as_deref(), Some("a/legacy-thor"));
    // Now a's alone: b no longer sees it, nor claims it.
    assert!(
        !names_seen(&*storage, &tenant("b"))
            .await
            .contains(&"Legacy".to_owned())
    );
    let err = storage
        .set_keys(
            &tenant("b"),
            &[key_change(&legacy, "uid-1", "uid-1", Some("b/thor"))],
        )
        .await
        .expect_err("b claims a's");
    assert_eq!(denied(err).0, Denial::CrossTenant);
}

async fn a_tenant_gives_identities_only_in_its_namespace(backend: Backend) {
    let (storage, _dir) = open(backend).await;
    let [a, ..] = populated(&*storage).await;
    let err = storage
        .set_keys(
            &tenant("a"),
            &[key_change(&a, "key-a", "key-a", Some("b/a"))],
        )
        .await
        .expect_err("identity in b");
    let (denial, field) = denied(err);
    assert_eq!(field, "changes[0].new_identity");
    assert!(denial.to_string().contains("\"b/a\""), "{denial}");
    assert_eq!(
        stored(&*storage, &a).await.expect("a").identity.as_deref(),
        Some("a/a")
    );
    // In its namespace, or none, it may.
    storage
        .set_keys(
            &tenant("a"),
            &[key_change(&a, "key-a", "key-a", Some("a/renamed"))],
        )
        .await
        .expect("identity in a");
    storage
        .set_keys(&tenant("a"), &[key_change(&a, "key-a", "key-a", Some(""))])
        .await
        .expect("identity cleared");
    let record = stored(&*storage, &a).await.expect("a");
    assert_eq!((record.identity, record.tenant.as_str()), (None, "a"));
}

async fn with_tenancy_off_every_record_is_written_as_before(backend: Backend) {
    let (storage, _dir) = open(backend).await;
    let [a, b, legacy, ..] = populated(&*storage).await;
    storage
        .update(
            &Access::All,
            &[rename(&b, "B2"), rename(&legacy, "Legacy2")],
        )
        .await
        .expect("update any");
    storage
        .set_keys(&Access::All, &[key_change(&a, "key-a", "k", Some("z/a"))])
        .await
        .expect("re-key any");
    // Tenants stay as they were: off does not take records from tenants.
    assert_eq!(stored(&*storage, &b).await.expect("b").tenant, "b");
    assert_eq!(stored(&*storage, &legacy).await.expect("legacy").tenant, "");
    let a_record = stored(&*storage, &a).await.expect("a");
    assert_eq!(
        (a_record.tenant.as_str(), a_record.identity.as_deref()),
        ("a", Some("z/a"))
    );
    storage
        .delete(&Access::All, &[a, b])
        .await
        .expect("delete any");
    assert_eq!(names_seen(&*storage, &Access::All).await.len(), 3);
}

async fn the_feed_keeps_each_records_tenant(backend: Backend) {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = backend.config(&dir, "tenancy-feed").await;
    let storage = config.open().await.expect("open");
    let id = add_one(
        &*storage,
        &tenant("a"),
        new_pet("Thor", None, Some("a/thor")),
    )
    .await;
    storage
        .delete(&tenant("a"), std::slice::from_ref(&id))
        .await
        .expect("delete");
    drop(storage);
    if matches!(backend, Backend::Memory) {
        return;
    }
    // Reopened: the history the file or table kept still names the tenant.
    let storage = config.open().await.expect("reopen");
    storage.catch_up().await.expect("catch up");
    let changes = storage.feed().read_after(0, 10).expect("history");
    let tenants: Vec<(ChangeKind, &str)> = changes
        .iter()
        .map(|c| (c.kind, c.record.as_ref().map_or("?", |r| r.tenant.as_str())))
        .collect();
    assert_eq!(
        tenants,
        [(ChangeKind::Created, "a"), (ChangeKind::Deleted, "a")]
    );
}

suite!(
    a_tenant_reads_its_records_and_unowned_ones_in_its_namespace,
    an_observer_reads_everything_and_writes_nothing,
    a_tenants_new_records_are_its_own_and_their_identities_in_its_namespace,
    an_add_naming_a_record_the_tenant_may_not_write_is_refused_without_its_id,
    cross_tenant_writes_are_refused_whole_and_change_nothing,
    a_tenants_first_write_stamps_a_record_from_before_tenancy_in_its_namespace,
    a_record_from_before_tenancy_without_identity_is_claimed_only_by_import,
    a_tenant_gives_identities_only_in_its_namespace,
    with_tenancy_off_every_record_is_written_as_before,
    the_feed_keeps_each_records_tenant,
);

// ---- a tenancy-on server: two tenants and an observer ------------------------

mod grpc {
    use std::io::Write as _;
    use std::sync::Arc;
    use std::time::Duration;

    use petstore_proto::PetStoreClient;
    use petstore_proto::petstore as pb;
    use petstore_server::auth::{Tenancy, TenancyOptions, TrustedIssuer};
    use petstore_server::model::NewPet;
    use petstore_server::server::{ServeError, ServeOptions};
    use petstore_server::service::Observability;
    use petstore_server::storage::{MemoryStorage, Storage};
    use petstore_server::tenancy::Access;
    use petstore_server::watch::WatchOptions;
    use tonic::transport::Channel;
    use tonic::{Code, Request, Status};

    use super::support::tokens::{SigningKey, claims, jwks, unix_now};
    use super::support::{
        Running, assert_metrics, assert_refused, assert_status, keyed, searched, thor, tron,
    };

    const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
    const OBSERVER: &str = "system:serviceaccount:monitoring:reader";
    const PROGRESS: Duration = Duration::from_millis(200);

    /// The trusted issuer's key, its JWKS file, and tokens it signs.
    struct Cluster {
        key: SigningKey,
        jwks: tempfile::NamedTempFile,
    }

    impl Cluster {
        fn new() -> Self {
            let key = SigningKey::ec("cluster-key");
            let mut jwks_file = tempfile::NamedTempFile::new().expect("jwks file");
            jwks_file
                .write_all(jwks(&[&key]).as_bytes())
                .expect("write jwks");
            Self {
                key,
                jwks: jwks_file,
            }
        }

        /// A token for ServiceAccount `name` in `namespace`, for the store.
        fn token(&self, namespace: &str, name: &str) -> String {
            self.key.sign(&claims(
                ISSUER,
                namespace,
                name,
                "petstore",
                unix_now(),
                600,
            ))
        }

        fn tenancy(&self, tenant_namespaces: &[&str], plaintext: bool) -> Tenancy {
            Tenancy::new(TenancyOptions {
                issuers: vec![TrustedIssuer {
                    issuer: ISSUER.into(),
                    jwks: self.jwks.path().to_owned(),
                }],
                audience: "petstore".into(),
                observers: vec![OBSERVER.into()],
                tenant_namespaces: tenant_namespaces.iter().map(|ns| (*ns).into()).collect(),
                allow_plaintext_tokens: plaintext,
                token_max_age: None,
            })
            .expect("tenancy")
        }
    }

    /// A tenancy-on store over `storage`, and its callers' tokens.
    struct Store {
        running: Running,
        storage: Arc<dyn Storage>,
        cluster: Cluster,
        a: String,
        b: String,
        observer: String,
    }

    async fn serve_over(storage: Arc<dyn Storage>, tenant_namespaces: &[&str]) -> Store {
        let cluster = Cluster::new();
        let options = ServeOptions {
            tenancy: Some(Arc::new(cluster.tenancy(tenant_namespaces, true))),
            watch: WatchOptions {
                progress_interval: PROGRESS,
                ..Default::default()
            },
            observability: Observability::default(),
            ..Default::default()
        };
        let dir = Arc::new(tempfile::tempdir().expect("tempdir"));
        let running = Running::serve(Arc::clone(&storage), dir, options).await;
        Store {
            running,
            storage,
            a: cluster.token("team-a", "petstore-operator"),
            b: cluster.token("team-b", "petstore-operator"),
            observer: cluster.token("monitoring", "reader"),
            cluster,
        }
    }

    async fn serve() -> Store {
        serve_over(Arc::new(MemoryStorage::default()), &[]).await
    }

    /// A tenancy-on store over a memory store that holds `pet`, written
    /// before tenancy (no tenant); and the pet's ID.
    async fn serve_with_one_from_before_tenancy(pet: NewPet) -> (Store, String) {
        let storage: Arc<dyn Storage> = Arc::new(MemoryStorage::default());
        let id = super::add_one(&*storage, &Access::All, pet).await;
        (serve_over(storage, &[]).await, id)
    }

    /// `message` with `token` as its bearer token.
    fn as_caller<T>(token: &str, message: T) -> Request<T> {
        let mut request = Request::new(message);
        request.metadata_mut().insert(
            "authorization",
            format!("Bearer {token}").parse().expect("ascii"),
        );
        request
    }

    /// The names a full search with `token` over `client` finds, sorted.
    async fn names(
        client: &mut PetStoreClient<Channel>,
        token: &str,
    ) -> Result<Vec<String>, Status> {
        let pets = searched(client, as_caller(token, pb::SearchPetsReq::default())).await?;
        let mut names: Vec<String> = pets.into_iter().map(|pet| pet.name).collect();
        names.sort();
        Ok(names)
    }

    impl Store {
        fn client(&self) -> PetStoreClient<Channel> {
            self.running.client.clone()
        }

        async fn add(&self, token: &str, pets: Vec<pb::Pet>) -> Result<Vec<String>, Status> {
            Ok(self
                .client()
                .add_pets(as_caller(token, pb::AddPetsReq { pets }))
                .await?
                .into_inner()
                .ids)
        }

        async fn search(&self, token: &str) -> Result<Vec<String>, Status> {
            names(&mut self.client(), token).await
        }

        /// A WatchPets stream of the changes after `after_revision`.
        async fn watch(
            &self,
            token: &str,
            after_revision: i64,
        ) -> Result<tonic::Streaming<pb::WatchPetsResp>, Status> {
            Ok(self
                .client()
                .watch_pets(as_caller(token, pb::WatchPetsReq { after_revision }))
                .await?
                .into_inner())
        }

        async fn get(&self, token: &str, request: pb::GetPetsReq) -> pb::GetPetsResp {
            self.client()
                .get_pets(as_caller(token, request))
                .await
                .expect("get")
                .into_inner()
        }

        async fn update(&self, token: &str, id: &str, name: &str) -> Result<(), Status> {
            let pet = pb::Pet {
                id: id.into(),
                ..super::support::pet(
                    name,
                    pb::PetType::PtCanine,
                    super::support::date(2021, 4, 1),
                )
            };
            self.client()
                .update_pets(as_caller(token, pb::UpdatePetsReq { pets: vec![pet] }))
                .await
                .map(drop)
        }

        async fn delete(&self, token: &str, id: &str) -> Result<(), Status> {
            self.client()
                .delete_pets(as_caller(
                    token,
                    pb::DeletePetsReq {
                        ids: vec![id.into()],
                    },
                ))
                .await
                .map(drop)
        }

        async fn set_keys(&self, token: &str, change: pb::KeyChange) -> Result<(), Status> {
            self.client()
                .set_idempotency_keys(as_caller(
                    token,
                    pb::SetIdempotencyKeysReq {
                        changes: vec![change],
                    },
                ))
                .await
                .map(drop)
        }

        /// A record as the store holds it (tenant included).
        async fn stored(&self, id: &str) -> Option<petstore_server::model::PetRecord> {
            self.storage
                .get(&Access::All, &[id.to_owned()])
                .await
                .expect("get")
                .remove(0)
        }

        fn metrics(&self) -> String {
            self.running.observability.metrics.encode().expect("encode")
        }
    }

    fn identified(name: &str, key: &str, identity: &str) -> pb::Pet {
        pb::Pet {
            identity: identity.into(),
            ..keyed(name, key)
        }
    }

    fn change(id: &str, expected: &str, new: &str, identity: Option<&str>) -> pb::KeyChange {
        pb::KeyChange {
            id: id.into(),
            expected_key: expected.into(),
            new_key: new.into(),
            new_identity: identity.map(str::to_owned),
        }
    }

    /// `metrics` counts tenancy's refusals as each (method, reason, count)
    /// says.
    fn assert_refusals(metrics: &str, counts: &[(&str, &str, u64)]) {
        let series: Vec<String> = counts
            .iter()
            .map(|(method, reason, count)| {
                format!(
                    "petstore_server_tenant_refusals_total{{method=\"{method}\",reason=\"{reason}\"}} {count}"
                )
            })
            .collect();
        assert_metrics(metrics, &series);
    }

    fn assert_code(result: Result<(), Status>, code: Code, fragment: &str) -> Status {
        let status = result.expect_err("refused");
        assert_status(&status, code, fragment);
        status
    }

    /// The next message of a watch with changes, skipping progress; its
    /// changes' (kind, name) and revision.
    async fn next_changes(
        stream: &mut tonic::Streaming<pb::WatchPetsResp>,
    ) -> (Vec<(i32, String)>, i64) {
        loop {
            let message = tokio::time::timeout(Duration::from_secs(5), stream.message())
                .await
                .expect("a message in time")
                .expect("stream")
                .expect("open");
            if !message.changes.is_empty() {
                let changes = message
                    .changes
                    .iter()
                    .map(|c| {
                        (
                            c.kind,
                            c.pet.as_ref().map(|p| p.name.clone()).unwrap_or_default(),
                        )
                    })
                    .collect();
                return (changes, message.revision);
            }
        }
    }

    #[tokio::test]
    async fn another_tenants_records_are_absent_from_get_search_and_watch() {
        let store = serve().await;
        let mut b_watch = store.watch(&store.b, 0).await.expect("b watches");
        let first = b_watch.message().await.expect("stream").expect("progress");
        assert!(first.changes.is_empty());

        let a_ids = store
            .add(
                &store.a,
                vec![identified("Thor", "uid-thor", "team-a/thor")],
            )
            .await
            .expect("a adds");
        let b_ids = store
            .add(
                &store.b,
                vec![identified("Tron", "uid-tron", "team-b/tron")],
            )
            .await
            .expect("b adds");

        assert_eq!(store.search(&store.b).await.expect("search"), ["Tron"]);
        assert_eq!(store.search(&store.a).await.expect("search"), ["Thor"]);
        let got = store
            .get(
                &store.b,
                pb::GetPetsReq {
                    ids: vec![a_ids[0].clone(), b_ids[0].clone()],
                    idempotency_keys: vec!["uid-thor".into()],
                    identities: vec!["team-a/thor".into()],
                },
            )
            .await;
        assert_eq!(got.pets.len(), 1);
        assert_eq!(got.pets[0].name, "Tron");
        assert_eq!(got.missing_ids, [a_ids[0].clone()]);
        assert_eq!(got.missing_idempotency_keys, ["uid-thor"]);
        assert_eq!(got.missing_identities, ["team-a/thor"]);

        // b's feed: only its own change, at the store's revision; a's
        // write, before it, passed over.
        let (changes, revision) = next_changes(&mut b_watch).await;
        assert_eq!(
            changes,
            [(pb::pet_change::Kind::Created as i32, "Tron".to_owned())]
        );
        assert_eq!(revision, 2);
        // a writes again: b hears nothing but progress, which moves on.
        store
            .update(&store.a, &a_ids[0], "Thorbert")
            .await
            .expect("a updates");
        let progress = tokio::time::timeout(Duration::from_secs(5), b_watch.message())
            .await
            .expect("progress in time")
            .expect("stream")
            .expect("open");
        assert!(progress.changes.is_empty(), "{progress:?}");
        assert!(progress.revision >= revision);
        store
            .update(&store.b, &b_ids[0], "Tronald")
            .await
            .expect("b updates");
        let (changes, later) = next_changes(&mut b_watch).await;
        assert_eq!(
            changes,
            [(pb::pet_change::Kind::Updated as i32, "Tronald".to_owned())]
        );
        assert_eq!(later, 4, "revisions are the store's: a's update was 3");

        // A resumed watch of a's from the start carries only a's changes.
        let mut a_watch = store.watch(&store.a, 1).await.expect("a resumes");
        let (changes, revision) = next_changes(&mut a_watch).await;
        assert_eq!(
            changes,
            [(pb::pet_change::Kind::Updated as i32, "Thorbert".to_owned())]
        );
        // The message says how far the stream has gone: past b's update.
        assert_eq!(revision, 4);
        store.running.stop().await;
    }

    #[tokio::test]
    async fn every_cross_tenant_write_is_permission_denied_and_changes_nothing() {
        let store = serve().await;
        let ids = store
            .add(
                &store.a,
                vec![identified("Thor", "uid-thor", "team-a/thor")],
            )
            .await
            .expect("a adds");
        let id = ids[0].clone();
        let before = store.stored(&id).await;

        let status = assert_code(
            store.update(&store.b, &id, "Stolen").await,
            Code::PermissionDenied,
            "pets[0].id: refused for tenant \"team-b\": the record belongs to another tenant",
        );
        assert!(!status.message().contains("team-a"), "{}", status.message());
        assert_code(
            store.delete(&store.b, &id).await,
            Code::PermissionDenied,
            "ids[0]",
        );
        assert_code(
            store
                .set_keys(&store.b, change(&id, "uid-thor", "mine", None))
                .await,
            Code::PermissionDenied,
            "changes[0].id",
        );
        // AddPets with a's key, or its identity (in a's namespace, so
        // refused first for that): refused, a's ID untold.
        for pet in [
            keyed("Copy", "uid-thor"),
            identified("Copy", "", "team-a/thor"),
        ] {
            let status = store.add(&store.b, vec![pet]).await.expect_err("a's key");
            assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
            assert!(!status.message().contains(&id), "{}", status.message());
        }
        let status = store
            .add(&store.b, vec![identified("Mine", "", "team-a/mine")])
            .await
            .expect_err("an identity in a");
        assert_refused(
            &status,
            Code::PermissionDenied,
            "pets[0].identity: refused for tenant \"team-b\"",
        );
        assert_eq!(store.stored(&id).await, before, "a's record unchanged");
        assert_eq!(
            store.search(&store.observer).await.expect("search"),
            ["Thor"]
        );
        // Deleting a missing ID is still a success.
        store
            .delete(&store.b, "no-such-id")
            .await
            .expect("delete missing");
        assert_refusals(
            &store.metrics(),
            &[
                ("UpdatePets", "cross_tenant", 1),
                ("DeletePets", "cross_tenant", 1),
                ("SetIdempotencyKeys", "cross_tenant", 1),
                ("AddPets", "cross_tenant", 1),
                ("AddPets", "identity_namespace", 2),
            ],
        );
        store.running.stop().await;
    }

    #[tokio::test]
    async fn bad_tokens_are_unauthenticated() {
        let store = serve().await;
        let add = |token: Option<String>| {
            let mut client = store.client();
            async move {
                let pets = vec![thor()];
                let request = match token {
                    Some(token) => as_caller(&token, pb::AddPetsReq { pets }),
                    None => Request::new(pb::AddPetsReq { pets }),
                };
                client.add_pets(request).await.map(drop)
            }
        };
        let now = unix_now();
        let cluster = &store.cluster;
        let sign = |key: &SigningKey, issuer: &str, audience: &str, iat: i64, lifetime: i64| {
            key.sign(&claims(issuer, "team-a", "op", audience, iat, lifetime))
        };
        let stranger = SigningKey::ec("stranger");
        let impostor = SigningKey::ec("cluster-key");
        for (token, fragment) in [
            (None, "no token"),
            (Some("not-a-jwt".to_owned()), "malformed token"),
            (
                Some(sign(&cluster.key, ISSUER, "petstore", now - 700, 600)),
                "token expired at",
            ),
            (
                Some(sign(&cluster.key, ISSUER, "other", now, 600)),
                "token audience is [\"other\"], this store needs \"petstore\"",
            ),
            (
                Some(sign(&stranger, ISSUER, "petstore", now, 600)),
                "token key \"stranger\" is not one of issuer",
            ),
            (
                Some(sign(&impostor, ISSUER, "petstore", now, 600)),
                "token signature does not verify",
            ),
            (
                Some(sign(
                    &cluster.key,
                    "https://other.example",
                    "petstore",
                    now,
                    600,
                )),
                "token issuer \"https://other.example\" is not trusted",
            ),
        ] {
            assert_code(add(token).await, Code::Unauthenticated, fragment);
        }
        // Without a token, reads are refused too; nothing was added.
        let status = store.search("").await.expect_err("no token");
        assert_eq!(status.code(), Code::Unauthenticated);
        assert!(
            store
                .storage
                .get_by_keys(&Access::All, &[String::new()])
                .await
                .is_ok()
        );
        assert_eq!(
            store.search(&store.observer).await.expect("search"),
            Vec::<String>::new()
        );
        assert_refusals(&store.metrics(), &[("AddPets", "unauthenticated", 7)]);
        store.running.stop().await;
    }

    #[tokio::test]
    async fn a_tenants_first_write_stamps_a_record_from_before_tenancy() {
        // The operator's identity, no tenant.
        let (store, old) = serve_with_one_from_before_tenancy(super::new_pet(
            "Thor",
            Some("uid-thor"),
            Some("team-a/thor"),
        ))
        .await;
        assert_eq!(
            store.search(&store.b).await.expect("b"),
            Vec::<String>::new()
        );
        assert_code(
            store.update(&store.b, &old, "Stolen").await,
            Code::PermissionDenied,
            "another tenant",
        );
        assert_eq!(store.stored(&old).await.expect("old").tenant, "");
        store
            .update(&store.a, &old, "Thorbert")
            .await
            .expect("a writes");
        let record = store.stored(&old).await.expect("stamped");
        assert_eq!(
            (record.tenant.as_str(), record.fields.name.as_str()),
            ("team-a", "Thorbert")
        );
        store.running.stop().await;
    }

    #[tokio::test]
    async fn a_record_from_before_tenancy_is_claimed_by_import() {
        let (store, old) =
            serve_with_one_from_before_tenancy(super::new_pet("Tron", Some("uid-old"), None)).await;
        // Every tenant finds it, to import it...
        for token in [&store.a, &store.b] {
            let got = store
                .get(
                    token,
                    pb::GetPetsReq {
                        idempotency_keys: vec!["uid-old".into()],
                        ..Default::default()
                    },
                )
                .await;
            assert_eq!(got.pets.len(), 1);
        }
        // ...but writes it only by importing it.
        assert_code(
            store.update(&store.a, &old, "Mine").await,
            Code::PermissionDenied,
            "a record made before tenancy is claimed by import",
        );
        assert_code(
            store
                .set_keys(
                    &store.a,
                    change(&old, "uid-old", "uid-old", Some("team-b/tron")),
                )
                .await,
            Code::PermissionDenied,
            "changes[0].new_identity",
        );
        store
            .set_keys(
                &store.a,
                change(&old, "uid-old", "uid-new", Some("team-a/tron")),
            )
            .await
            .expect("import");
        let record = store.stored(&old).await.expect("imported");
        assert_eq!(record.tenant, "team-a");
        assert_eq!(record.identity.as_deref(), Some("team-a/tron"));
        assert_eq!(
            store.search(&store.b).await.expect("b"),
            Vec::<String>::new()
        );
        assert_code(
            store
                .set_keys(
                    &store.b,
                    change(&old, "uid-new", "uid-new", Some("team-b/tron")),
                )
                .await,
            Code::PermissionDenied,
            "another tenant",
        );
        store.running.stop().await;
    }

    #[tokio::test]
    async fn the_observer_reads_and_watches_every_tenant_but_writes_nothing() {
        let store = serve().await;
        let mut watch = store
            .watch(&store.observer, 0)
            .await
            .expect("observer watches");
        watch.message().await.expect("stream").expect("progress");
        let a = store.add(&store.a, vec![thor()]).await.expect("a")[0].clone();
        store.add(&store.b, vec![tron()]).await.expect("b");
        assert_eq!(
            store.search(&store.observer).await.expect("all"),
            ["Thor", "Tron"]
        );
        let mut seen = Vec::new();
        while seen.len() < 2 {
            seen.extend(
                next_changes(&mut watch)
                    .await
                    .0
                    .into_iter()
                    .map(|(_, name)| name),
            );
        }
        assert_eq!(seen, ["Thor", "Tron"]);

        let refused = [
            store
                .add(&store.observer, vec![keyed("New", "k")])
                .await
                .map(drop),
            store.update(&store.observer, &a, "Renamed").await,
            store.delete(&store.observer, &a).await,
            store
                .set_keys(&store.observer, change(&a, "", "k", None))
                .await,
        ];
        for result in refused {
            assert_code(result, Code::PermissionDenied, "observers may read");
        }
        assert_eq!(
            store.search(&store.observer).await.expect("all"),
            ["Thor", "Tron"]
        );

        // Not records: an observer claims and samples; a tenant claims.
        let claim = |token: &str, holder: &str| {
            as_caller(
                token,
                pb::ClaimInstallationReq {
                    installation: "blue".into(),
                    holder: holder.into(),
                    ttl_seconds: 60,
                },
            )
        };
        let granted = store
            .client()
            .claim_installation(claim(&store.observer, "x"))
            .await
            .expect("observer claims")
            .into_inner();
        assert!(granted.granted);
        store
            .client()
            .claim_installation(claim(&store.a, "y"))
            .await
            .expect("a tenant claims");
        let sampler = |token: &str| {
            as_caller(
                token,
                pb::ChangeSamplerReq {
                    sampler: Some(pb::Sampler {
                        r#type: pb::SamplerType::StAlways.into(),
                        float_value: 0.0,
                    }),
                },
            )
        };
        store
            .client()
            .change_sampler(sampler(&store.observer))
            .await
            .expect("observer samples");
        let status = store
            .client()
            .change_sampler(sampler(&store.a))
            .await
            .expect_err("a tenant does not");
        assert_eq!(status.code(), Code::PermissionDenied);
        assert_refusals(&store.metrics(), &[("AddPets", "observer_write", 1)]);
        store.running.stop().await;
    }

    #[tokio::test]
    async fn only_the_listed_namespaces_use_the_store() {
        let store = serve_over(Arc::new(MemoryStorage::default()), &["team-a"]).await;
        store.add(&store.a, vec![thor()]).await.expect("team-a");
        assert_code(
            store.add(&store.b, vec![tron()]).await.map(drop),
            Code::PermissionDenied,
            "\"team-b\"",
        );
        // Observers are named one by one, whatever their namespace.
        assert_eq!(
            store.search(&store.observer).await.expect("observer"),
            ["Thor"]
        );
        assert_refusals(&store.metrics(), &[("AddPets", "namespace_not_allowed", 1)]);
        store.running.stop().await;
    }

    #[tokio::test]
    async fn tenancy_over_plaintext_is_refused_at_start_without_the_dev_flag() {
        let cluster = Cluster::new();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let served = petstore_server::server::serve(
            listener,
            Arc::new(MemoryStorage::default()),
            ServeOptions {
                tenancy: Some(Arc::new(cluster.tenancy(&[], false))),
                ..Default::default()
            },
            std::future::pending(),
        )
        .await;
        assert!(
            matches!(served, Err(ServeError::PlaintextTokens)),
            "{served:?}"
        );

        // The binary says so, and exits, before it opens anything.
        let issuer = format!("{ISSUER}={}", cluster.jwks.path().display());
        let run = |extra: &[&str]| {
            std::process::Command::new(env!("CARGO_BIN_EXE_petstore-server"))
                .args(["--listen", "127.0.0.1:0", "--metrics-listen", "off"])
                .args([
                    "--storage",
                    "memory",
                    "--tenancy",
                    "--token-issuer",
                    &issuer,
                ])
                .args(extra)
                .output()
                .expect("run petstore-server")
        };
        let out = run(&[]);
        assert!(!out.status.success());
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(said.contains("--allow-plaintext-tokens"), "{said}");
        assert!(said.contains("tenancy without TLS"), "{said}");
    }

    /// The real grpcurl, as a user runs it: no token, then another
    /// namespace's.
    #[tokio::test]
    async fn grpcurl_without_a_token_or_with_another_namespaces() {
        let store = serve().await;
        let id = store.add(&store.a, vec![thor()]).await.expect("a")[0].clone();
        let grpcurl = fixtures::Tools::get().expect("grpcurl").bin("grpcurl");
        let addr = store.running.addr.to_string();
        let run = |headers: Vec<String>, method: &str, data: String| {
            let grpcurl = grpcurl.clone();
            let addr = addr.clone();
            let method = format!("petstore.PetStore/{method}");
            async move {
                tokio::task::spawn_blocking(move || {
                    let mut command = std::process::Command::new(grpcurl);
                    command.args(["-plaintext", "-max-time", "10"]);
                    for header in headers {
                        command.args(["-H", &header]);
                    }
                    let out = command
                        .args(["-d", &data, &addr, &method])
                        .output()
                        .expect("run grpcurl");
                    (
                        out.status.success(),
                        format!(
                            "{}{}",
                            String::from_utf8_lossy(&out.stdout),
                            String::from_utf8_lossy(&out.stderr)
                        ),
                    )
                })
                .await
                .expect("grpcurl task")
            }
        };
        let get = format!(r#"{{"ids":["{id}"]}}"#);
        let (ok, said) = run(Vec::new(), "GetPets", get.clone()).await;
        assert!(
            !ok && said.contains("Code: Unauthenticated") && said.contains("no token"),
            "{said}"
        );
        let b = vec![format!("authorization: Bearer {}", store.b)];
        let (ok, said) = run(b.clone(), "GetPets", get.clone()).await;
        assert!(
            ok && said.contains("missingIds") && !said.contains("Thor"),
            "{said}"
        );
        let update = format!(
            r#"{{"pets":[{{"id":"{id}","name":"Stolen","type":"PTCanine","birthday":{{"year":2021,"month":4,"day":1}}}}]}}"#
        );
        let (ok, said) = run(b, "UpdatePets", update).await;
        assert!(!ok && said.contains("Code: PermissionDenied"), "{said}");
        let a = vec![format!("authorization: Bearer {}", store.a)];
        let (ok, said) = run(a, "GetPets", get).await;
        assert!(ok && said.contains("\"name\": \"Thor\""), "{said}");
        store.running.stop().await;
    }

    /// A tonic client over mutual TLS with the client certificate `client`.
    async fn client_with(
        addr: std::net::SocketAddr,
        ca: &std::path::Path,
        (cert, key): &(std::path::PathBuf, std::path::PathBuf),
    ) -> PetStoreClient<Channel> {
        use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
        let read = |path: &std::path::Path| std::fs::read_to_string(path).expect("read PEM");
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(read(ca)))
            .identity(Identity::from_pem(read(cert), read(key)));
        let channel = Endpoint::from_shared(format!("https://{addr}"))
            .expect("endpoint")
            .tls_config(tls)
            .expect("TLS")
            .connect()
            .await
            .expect("connect");
        PetStoreClient::new(channel)
    }

    // Over real mutual TLS, the token must be one the client certificate
    // may carry: its own account's, or any for an observer. Fails if the
    // store takes a token from any certificate of its CA (the stolen
    // token's write is then accepted).
    #[tokio::test]
    async fn over_mutual_tls_a_certificate_carries_only_its_own_accounts_token_or_as_observer_any()
    {
        const TEAM_A: &str = "system:serviceaccount:team-a:petstore-tenant";
        const TEAM_B: &str = "system:serviceaccount:team-b:petstore-tenant";
        let cluster = Cluster::new();
        let dir = tempfile::tempdir().expect("dir");
        let pki = fixtures::certs::Pki::create(&dir.path().join("pki"), "store", &[]).expect("CA");
        let (cert, key) = pki.issue_server("store").expect("serving");
        let observability = Observability::default();
        let options = ServeOptions {
            tls: Some(petstore_server::server::TlsFiles {
                cert,
                key,
                client_ca: Some(pki.ca_cert.clone()),
            }),
            tenancy: Some(Arc::new(cluster.tenancy(&[], false))),
            observability: observability.clone(),
            ..Default::default()
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let storage: Arc<dyn Storage> = Arc::new(MemoryStorage::default());
        tokio::spawn(petstore_server::server::serve(
            listener,
            Arc::clone(&storage),
            options,
            std::future::pending(),
        ));
        let issue = |name: &str| pki.issue_client(name).expect("client certificate");
        let mut as_b = client_with(addr, &pki.ca_cert, &issue(TEAM_B)).await;
        let mut as_observer = client_with(addr, &pki.ca_cert, &issue(OBSERVER)).await;
        let mut as_old = client_with(addr, &pki.ca_cert, &issue("petstore-operator")).await;
        let a_token = cluster.token("team-a", "petstore-tenant");
        let b_token = cluster.token("team-b", "petstore-tenant");
        let stolen = || pb::AddPetsReq {
            pets: vec![keyed("Stolen", "uid-stolen")],
        };

        // team-b's certificate carrying team-a's token: refused, saying
        // whose certificate, whose token, and what is accepted.
        let refused = as_b
            .add_pets(as_caller(&a_token, stolen()))
            .await
            .expect_err("another account's token");
        assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
        for said in [TEAM_A, TEAM_B, "--observer"] {
            assert!(refused.message().contains(said), "{said}: {refused:?}");
        }
        let read = as_b
            .search_pets(as_caller(&a_token, pb::SearchPetsReq::default()))
            .await
            .expect_err("a read with it too");
        assert_eq!(read.code(), Code::PermissionDenied, "{read:?}");
        // A certificate whose CN names no ServiceAccount carries no one's.
        let unnamed = as_old
            .add_pets(as_caller(&a_token, stolen()))
            .await
            .expect_err("a CN that is not a principal");
        assert_status(&unnamed, Code::PermissionDenied, "names no ServiceAccount");

        // The same certificate with its own account's token: accepted.
        as_b.add_pets(as_caller(&b_token, pb::AddPetsReq { pets: vec![tron()] }))
            .await
            .expect("team-b as itself");
        // The observer's certificate with team-a's token: accepted, as
        // team-a's deputy, which sees team-a's records only.
        as_observer
            .add_pets(as_caller(&a_token, pb::AddPetsReq { pets: vec![thor()] }))
            .await
            .expect("the observer carrying team-a's token");
        assert_eq!(
            names(&mut as_observer, &a_token).await.expect("search"),
            ["Thor"]
        );
        assert_eq!(names(&mut as_b, &b_token).await.expect("search"), ["Tron"]);
        // Nothing the refused calls sent was written.
        let observer_token = cluster.token("monitoring", "reader");
        assert_eq!(
            names(&mut as_observer, &observer_token)
                .await
                .expect("search"),
            ["Thor", "Tron"]
        );

        assert_refusals(
            &observability.metrics.encode().expect("encode"),
            &[
                ("AddPets", "certificate_mismatch", 2),
                ("SearchPets", "certificate_mismatch", 1),
            ],
        );
    }
}
