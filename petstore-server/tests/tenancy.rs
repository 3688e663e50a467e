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
