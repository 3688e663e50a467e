//! The migration against a strict mock API server, in the style of the
//! controller's: the mock answers only the calls a test scripted, in order;
//! any other call, or a scripted call that never came, fails the test.

use http::Method;
use serde_json::{Value, json};

use super::*;
use crate::api_server::{ApiServerVerifier, Call, failure};

const CRD: &str = "pets.petstore.example.com";
const CRD_PATH: &str =
    "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/pets.petstore.example.com";
const LIST: &str = "/apis/petstore.example.com/v1/pets";

/// Where a Pet is read again after a conflict: a list by its name.
const HERD: &str = "/apis/petstore.example.com/v1/namespaces/herd/pets";

fn pet_path(name: &str) -> String {
    format!("/apis/petstore.example.com/v1/namespaces/herd/pets/{name}")
}

fn crd_status_path() -> String {
    format!("{CRD_PATH}/status")
}

fn crd(stored: &[&str]) -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD, "resourceVersion": "1"},
        "spec": {
            "group": "petstore.example.com",
            "names": {"kind": "Pet", "plural": "pets", "singular": "pet", "listKind": "PetList"},
            "scope": "Namespaced",
            "versions": [
                {"name": "v1alpha1", "served": true, "storage": false},
                {"name": "v1", "served": true, "storage": true},
            ],
        },
        "status": {
            "acceptedNames": {"kind": "Pet", "plural": "pets"},
            "conditions": [],
            "storedVersions": stored,
        },
    })
}

fn pet(name: &str, resource_version: &str) -> Value {
    json!({
        "apiVersion": "petstore.example.com/v1",
        "kind": "Pet",
        "metadata": {"name": name, "namespace": "herd", "resourceVersion": resource_version},
        "spec": {"name": name, "type": "dog", "birthday": "2021-04-01"},
    })
}

fn page(items: &[Value], next: Option<&str>) -> Value {
    json!({
        "apiVersion": "petstore.example.com/v1",
        "kind": "PetList",
        "metadata": {"resourceVersion": "100", "continue": next.unwrap_or_default()},
        "items": items,
    })
}

/// The calls received with this method, in order.
fn calls(api: &ApiServerVerifier, method: Method) -> Vec<Call> {
    api.calls(|c| c.method == method)
}

/// A mock API server whose first answer is the CRD read, migration needed.
fn migrating() -> (ApiServerVerifier, kube::Client, MigrationMetrics) {
    let api = ApiServerVerifier::default();
    let client = api.start();
    api.expect(Method::GET, CRD_PATH, 200, crd(&["v1alpha1", "v1"]));
    (api, client, MigrationMetrics::default())
}

/// The migration left `storedVersions` as it was.
fn assert_stored_versions_kept(api: &ApiServerVerifier) {
    assert!(
        calls(api, Method::PATCH).is_empty(),
        "storedVersions not set"
    );
}

/// The metrics hold this exact sample line.
fn assert_sample(metrics: &MigrationMetrics, sample: &str) {
    let text = crate::fixtures::metrics_text(|registry| metrics.register(registry));
    assert!(text.lines().any(|line| line == sample), "{text}");
}

fn stored_versions_set(api: &ApiServerVerifier) {
    api.expect(Method::PATCH, &crd_status_path(), 200, crd(&["v1"]));
}

#[tokio::test]
async fn nothing_to_do_when_the_storage_version_alone_is_stored() {
    let api = ApiServerVerifier::default();
    let client = api.start();
    api.expect(Method::GET, CRD_PATH, 200, crd(&["v1"]));
    let metrics = MigrationMetrics::default();
    let migrated = migrate_storage(&client, CRD, &metrics).await.expect("ok");
    assert_eq!(migrated, None);
    api.verify();
}

#[tokio::test]
async fn every_page_is_rewritten_and_then_stored_versions_is_set() {
    let (api, client, metrics) = migrating();
    api.expect(
        Method::GET,
        LIST,
        200,
        page(&[pet("a", "11"), pet("b", "12")], Some("page-2")),
    );
    // Written: a new resourceVersion.
    api.expect(Method::PUT, &pet_path("a"), 200, pet("a", "101"));
    api.expect(Method::PUT, &pet_path("b"), 200, pet("b", "102"));
    api.expect(Method::GET, LIST, 200, page(&[pet("c", "13")], None));
    // Stored as v1 already: the API server skips the write.
    api.expect(Method::PUT, &pet_path("c"), 200, pet("c", "13"));
    stored_versions_set(&api);

    let migrated = migrate_storage(&client, CRD, &metrics).await.expect("ok");
    api.verify();
    assert_eq!(
        migrated,
        Some(Migrated {
            stored_before: vec!["v1alpha1".into(), "v1".into()],
            rewritten: 2,
            current: 1,
            gone: 0,
        })
    );
    // The second page is asked for with the first page's token.
    let lists = calls(&api, Method::GET);
    let lists: Vec<_> = lists.iter().filter(|c| c.path == LIST).collect();
    assert!(lists[0].query.contains("limit=500"), "{:?}", lists[0]);
    assert!(!lists[0].query.contains("continue"), "{:?}", lists[0]);
    assert!(lists[1].query.contains("continue=page-2"), "{:?}", lists[1]);
    // Each Pet is written back as listed, at the resourceVersion listed.
    let puts = calls(&api, Method::PUT);
    assert_eq!(puts[0].body, pet("a", "11"));
    assert_eq!(puts[2].body, pet("c", "13"));
    let patch = &calls(&api, Method::PATCH)[0];
    assert_eq!(patch.body, json!({"status": {"storedVersions": ["v1"]}}));
    assert_sample(
        &metrics,
        r#"petstore_operator_storage_migration_pets_total{outcome="rewritten"} 2"#,
    );
    assert_sample(
        &metrics,
        r#"petstore_operator_storage_migration_pets_total{outcome="current"} 1"#,
    );
}

#[tokio::test]
async fn a_conflict_is_read_again_and_rewritten_and_a_pet_gone_is_counted() {
    let (api, client, metrics) = migrating();
    api.expect(
        Method::GET,
        LIST,
        200,
        page(&[pet("a", "11"), pet("b", "12"), pet("c", "13")], None),
    );
    // a changed since the list: read again, written at its new version.
    api.expect(Method::PUT, &pet_path("a"), 409, failure(409));
    api.expect(Method::GET, HERD, 200, page(&[pet("a", "50")], None));
    api.expect(Method::PUT, &pet_path("a"), 200, pet("a", "103"));
    // b deleted since the list.
    api.expect(Method::PUT, &pet_path("b"), 404, failure(404));
    // c changed, then deleted before the second read.
    api.expect(Method::PUT, &pet_path("c"), 409, failure(409));
    api.expect(Method::GET, HERD, 200, page(&[], None));
    stored_versions_set(&api);

    let migrated = migrate_storage(&client, CRD, &metrics).await.expect("ok");
    api.verify();
    let migrated = migrated.expect("migrated");
    assert_eq!(
        (migrated.rewritten, migrated.current, migrated.gone),
        (1, 0, 2)
    );
    let puts = calls(&api, Method::PUT);
    assert_eq!(puts[1].body, pet("a", "50"), "the fresh read is written");
    let reads = calls(&api, Method::GET);
    let by_name: Vec<&str> = reads
        .iter()
        .filter(|call| call.path == HERD)
        .map(|call| call.query.trim_start_matches('&'))
        .collect();
    assert_eq!(
        by_name,
        [
            "fieldSelector=metadata.name%3Da",
            "fieldSelector=metadata.name%3Dc"
        ],
        "read again by a list of its name alone"
    );
    assert_sample(
        &metrics,
        r#"petstore_operator_storage_migration_pets_total{outcome="gone"} 2"#,
    );
}

#[tokio::test]
async fn a_pet_that_keeps_conflicting_fails_the_migration_and_stored_versions_stays() {
    let (api, client, metrics) = migrating();
    api.expect(Method::GET, LIST, 200, page(&[pet("a", "11")], None));
    for attempt in 0..ATTEMPTS {
        api.expect(Method::PUT, &pet_path("a"), 409, failure(409));
        if attempt + 1 < ATTEMPTS {
            api.expect(Method::GET, HERD, 200, page(&[pet("a", "11")], None));
        }
    }

    run(&client, CRD, &metrics).await;
    api.verify();
    assert_eq!(calls(&api, Method::PUT).len(), ATTEMPTS);
    assert_stored_versions_kept(&api);
    assert_sample(
        &metrics,
        r#"petstore_operator_storage_migrations_total{result="failed"} 1"#,
    );
}

#[tokio::test]
async fn a_run_that_writes_none_of_the_pets_it_listed_fails() {
    let (api, client, metrics) = migrating();
    api.expect(
        Method::GET,
        LIST,
        200,
        page(&[pet("a", "11"), pet("b", "12")], None),
    );
    api.expect(Method::PUT, &pet_path("a"), 404, failure(404));
    api.expect(Method::PUT, &pet_path("b"), 404, failure(404));

    let err = migrate_storage(&client, CRD, &metrics)
        .await
        .expect_err("nothing migrated");
    api.verify();
    assert!(
        matches!(err, MigrationError::NothingMigrated { listed: 2, gone: 2 }),
        "{err}"
    );
    assert_stored_versions_kept(&api);
}

#[tokio::test]
async fn a_write_refused_otherwise_fails_the_migration() {
    let (api, client, metrics) = migrating();
    api.expect(Method::GET, LIST, 200, page(&[pet("a", "11")], None));
    api.expect(Method::PUT, &pet_path("a"), 500, failure(500));

    let err = migrate_storage(&client, CRD, &metrics)
        .await
        .expect_err("refused");
    api.verify();
    assert!(matches!(err, MigrationError::Rewrite { .. }), "{err}");
    assert_stored_versions_kept(&api);
}
