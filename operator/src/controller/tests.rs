//! The reconcile path against a mock API server (tower-test) and a fake store:
//! ordering, status writes, conflict retry, crash recovery and deletion.

use std::collections::VecDeque;
use std::pin::pin;
use std::sync::{Arc, Mutex};

use chrono::NaiveDate;
use http::{Method, Request, Response};
use kube::Client;
use kube::client::Body;
use kube::runtime::events::{Recorder, Reporter};
use serde_json::{Value, json};

use super::*;
use crate::crd::{DELETION_POLICY_ANNOTATION, PAUSED_ANNOTATION, PetKind};
use crate::store::fake::FakeStore;

const UID: &str = "8d3c7c51-uid";
const PETS: &str = "/apis/petstore.example.com/v1alpha1/namespaces/default/pets/thor";

#[derive(Clone, Debug)]
struct Call {
    method: Method,
    path: String,
    body: Value,
}

/// A scripted API server: answers every request sensibly, except those
/// matched by a queued failure, and records them all.
#[derive(Clone, Default)]
struct MockApi {
    calls: Arc<Mutex<Vec<Call>>>,
    failures: Arc<Mutex<VecDeque<(Method, String, u16)>>>,
}

impl MockApi {
    fn start(&self, pet: Value) -> Client {
        // What the API server returns for a metadata patch: the Pet with our
        // finalizer added.
        let mut with_finalizer = pet.clone();
        with_finalizer["metadata"]["finalizers"] = json!([FINALIZER]);
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let api = self.clone();
        tokio::spawn(async move {
            let mut handle = pin!(handle);
            while let Some((request, send)) = handle.next_request().await {
                let method = request.method().clone();
                let path = request.uri().path().to_owned();
                let bytes = request
                    .into_body()
                    .collect_bytes()
                    .await
                    .expect("request body");
                let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                api.calls.lock().expect("calls").push(Call {
                    method: method.clone(),
                    path: path.clone(),
                    body: body.clone(),
                });
                let failure = {
                    let mut failures = api.failures.lock().expect("failures");
                    match failures.front() {
                        Some((m, p, _)) if *m == method && *p == path => failures.pop_front(),
                        _ => None,
                    }
                };
                let (code, reply) = match failure {
                    Some((_, _, code)) => {
                        let reason = if code == 409 {
                            "Conflict"
                        } else {
                            "InternalError"
                        };
                        let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                            "message": "scripted failure", "reason": reason, "code": code});
                        (code, status)
                    }
                    None if path.contains("/events") => (201, body),
                    None if method == Method::PATCH && !path.ends_with("/status") => {
                        (200, with_finalizer.clone())
                    }
                    None => (200, pet.clone()),
                };
                let response = Response::builder()
                    .status(code)
                    .body(Body::from(serde_json::to_vec(&reply).expect("json")))
                    .expect("response");
                send.send_response(response);
            }
        });
        Client::new(service, "default")
    }

    fn fail_next(&self, method: Method, path: &str, code: u16) {
        self.failures
            .lock()
            .expect("failures")
            .push_back((method, path.to_owned(), code));
    }

    /// Calls other than Event publication, as "METHOD path".
    fn writes(&self) -> Vec<String> {
        self.calls
            .lock()
            .expect("calls")
            .iter()
            .filter(|c| !c.path.contains("/events"))
            .map(|c| format!("{} {}", c.method, c.path))
            .collect()
    }

    fn status_patches(&self) -> Vec<Value> {
        self.calls
            .lock()
            .expect("calls")
            .iter()
            .filter(|c| c.method == Method::PATCH && c.path.ends_with("/status"))
            .map(|c| c.body["status"].clone())
            .collect()
    }

    fn event_reasons(&self) -> Vec<String> {
        self.calls
            .lock()
            .expect("calls")
            .iter()
            .filter(|c| c.path.contains("/events"))
            .map(|c| c.body["reason"].as_str().unwrap_or_default().to_owned())
            .collect()
    }
}

fn pet_json(finalizer: bool, status: Option<Value>, annotations: Value, deleting: bool) -> Value {
    let mut pet = json!({
        "apiVersion": "petstore.example.com/v1alpha1",
        "kind": "Pet",
        "metadata": {
            "name": "thor", "namespace": "default", "uid": UID, "generation": 1,
            "resourceVersion": "1", "annotations": annotations,
        },
        "spec": {"name": "Thor", "type": "dog", "birthday": "2021-04-01T00:00:00Z"},
    });
    if finalizer {
        pet["metadata"]["finalizers"] = json!([FINALIZER]);
    }
    if deleting {
        pet["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    }
    if let Some(status) = status {
        pet["status"] = status;
    }
    pet
}

fn thor_data() -> PetData {
    PetData {
        name: "Thor".into(),
        kind: PetKind::Dog,
        birthday: NaiveDate::from_ymd_opt(2021, 4, 1).expect("date"),
    }
}

struct Harness {
    api: MockApi,
    store: Arc<FakeStore>,
    ctx: Arc<Context>,
    pet: Arc<Pet>,
}

fn harness(pet: Value) -> Harness {
    let api = MockApi::default();
    let client = api.start(pet.clone());
    let store = Arc::new(FakeStore::default());
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "petstore-operator".into(),
            instance: None,
        },
    );
    let metrics = Arc::new(Metrics::default());
    let ctx = Arc::new(Context::new(
        client,
        store.clone(),
        crate::events::EventQueue::start(recorder, Arc::clone(&metrics)),
        metrics,
        Settings::default(),
    ));
    let pet = Arc::new(serde_json::from_value(pet).expect("valid pet"));
    Harness {
        api,
        store,
        ctx,
        pet,
    }
}

impl Harness {
    /// One reconcile, then the Event queue drained so assertions see them.
    async fn reconcile(&self) -> Result<Action, Error> {
        let result = reconcile(Arc::clone(&self.pet), Arc::clone(&self.ctx)).await;
        self.ctx.events.flush().await;
        result
    }
}

fn ready(status: &Value) -> (String, String) {
    let ready = status["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
        .expect("Ready condition");
    (
        ready["status"].as_str().unwrap_or_default().to_owned(),
        ready["reason"].as_str().unwrap_or_default().to_owned(),
    )
}

#[tokio::test]
async fn finalizer_is_persisted_before_anything_reaches_the_store() {
    // If the finalizer cannot be written, nothing is created.
    let h = harness(pet_json(false, None, json!({}), false));
    h.api.fail_next(Method::PATCH, PETS, 500);
    let err = h.reconcile().await.expect_err("finalizer write failed");
    assert_eq!(err.metric_label(), "add_finalizer");
    assert!(
        h.store.calls().is_empty(),
        "no store call without the finalizer"
    );

    // Once it is written (with a resourceVersion precondition), the same
    // reconcile goes on to create.
    let h = harness(pet_json(false, None, json!({}), false));
    h.reconcile().await.expect("reconcile");
    assert_eq!(
        h.api.writes(),
        [format!("PATCH {PETS}"), format!("PATCH {PETS}/status")]
    );
    let patch = &h.api.calls.lock().expect("calls")[0].body;
    assert_eq!(patch["metadata"]["finalizers"], json!([FINALIZER]));
    assert_eq!(patch["metadata"]["resourceVersion"], "1");
    assert_eq!(
        h.store.calls(),
        [format!("find_by_key:{UID}"), format!("create:{UID}")]
    );
}

#[tokio::test]
async fn create_uses_the_uid_and_writes_the_id_at_once() {
    let h = harness(pet_json(true, None, json!({}), false));
    h.reconcile().await.expect("reconcile");
    assert_eq!(
        h.store.calls(),
        [format!("find_by_key:{UID}"), format!("create:{UID}")]
    );
    let patches = h.api.status_patches();
    assert_eq!(patches.len(), 1);
    assert_eq!(patches[0]["id"], "id-1");
    assert_eq!(patches[0]["observedGeneration"], 1);
    assert_eq!(ready(&patches[0]), ("True".into(), "Available".into()));
    assert!(h.api.event_reasons().contains(&"Created".to_owned()));
}

#[tokio::test]
async fn status_conflict_is_retried_without_creating_again() {
    let h = harness(pet_json(true, None, json!({}), false));
    h.api
        .fail_next(Method::PATCH, &format!("{PETS}/status"), 409);
    h.reconcile()
        .await
        .expect("reconcile succeeds after the retry");
    assert_eq!(
        h.api.writes(),
        [
            format!("PATCH {PETS}/status"),
            format!("GET {PETS}/status"),
            format!("PATCH {PETS}/status"),
        ]
    );
    let creates = h
        .store
        .calls()
        .iter()
        .filter(|c| c.starts_with("create"))
        .count();
    assert_eq!(creates, 1);
    assert_eq!(h.api.status_patches()[1]["id"], "id-1");
}

#[tokio::test]
async fn a_lost_status_write_is_recovered_by_key_not_by_a_second_create() {
    let h = harness(pet_json(true, None, json!({}), false));
    h.api
        .fail_next(Method::PATCH, &format!("{PETS}/status"), 500);
    let first = h.reconcile().await;
    assert!(
        first.is_err(),
        "the failed status write surfaces: {:?} {:?}",
        first,
        h.api.writes()
    );
    assert_eq!(h.store.records().len(), 1);

    // The next reconcile still sees no status.id (the write was lost).
    h.reconcile().await.expect("second reconcile");
    let creates = h
        .store
        .calls()
        .iter()
        .filter(|c| c.starts_with("create"))
        .count();
    assert_eq!(
        creates, 1,
        "never create again because a status write failed"
    );
    assert_eq!(h.store.records().len(), 1);
    let last = h.api.status_patches().pop().expect("a status write");
    assert_eq!(last["id"], "id-1");
    assert!(h.api.event_reasons().contains(&"Adopted".to_owned()));
}

#[tokio::test]
async fn steady_state_makes_no_writes() {
    let h0 = harness(pet_json(true, None, json!({}), false));
    h0.reconcile().await.expect("first reconcile");
    let synced = h0.api.status_patches().pop().expect("status");

    let h = harness(pet_json(true, Some(synced), json!({}), false));
    h.store.insert(UID, thor_data());
    h.reconcile().await.expect("reconcile");
    assert_eq!(
        h.store.calls(),
        ["observe:id-1"],
        "one read, no store write"
    );
    assert!(
        h.api.writes().is_empty(),
        "no API write: {:?}",
        h.api.writes()
    );
    assert!(h.api.event_reasons().is_empty());
}

#[tokio::test]
async fn drift_is_put_back_on_the_same_id() {
    let h0 = harness(pet_json(true, None, json!({}), false));
    h0.reconcile().await.expect("first reconcile");
    let synced = h0.api.status_patches().pop().expect("status");

    let h = harness(pet_json(true, Some(synced), json!({}), false));
    h.store.insert(
        UID,
        PetData {
            name: "Changed out of band".into(),
            ..thor_data()
        },
    );
    h.reconcile().await.expect("reconcile");
    assert_eq!(h.store.calls(), ["observe:id-1", "update:id-1"]);
    assert_eq!(h.store.records()[0].data, thor_data());
}

#[tokio::test]
async fn unreachable_store_sets_conditions_and_backs_off() {
    let h = harness(pet_json(true, None, json!({}), false));
    h.store.set_unavailable(true);
    let err = h.reconcile().await.expect_err("store down");
    assert_eq!(err.metric_label(), "store_unavailable");
    let patch = h.api.status_patches().pop().expect("status");
    assert_eq!(ready(&patch), ("False".into(), "StoreUnavailable".into()));
    assert!(
        h.api
            .event_reasons()
            .contains(&"StoreUnavailable".to_owned())
    );

    let first = error_policy(Arc::clone(&h.pet), &err, Arc::clone(&h.ctx));
    let mut last = first.clone();
    for _ in 0..12 {
        last = error_policy(Arc::clone(&h.pet), &err, Arc::clone(&h.ctx));
    }
    let delay = |a: &Action| format!("{a:?}");
    assert_ne!(delay(&first), delay(&last));
    // Capped at backoff_max (+10% jitter).
    assert!(backoff(&h.ctx.settings, 30) <= Duration::from_secs(330));
    assert!(backoff(&h.ctx.settings, 1) < Duration::from_secs(2));
    assert!(backoff(&h.ctx.settings, 4) >= Duration::from_secs(8));
}

#[tokio::test]
async fn rejection_is_terminal_until_the_spec_changes() {
    let h = harness(pet_json(true, None, json!({}), false));
    h.store.set_reject_creates(true);
    let action = h
        .reconcile()
        .await
        .expect("terminal errors are not retried");
    assert_eq!(action, Action::await_change());
    let rejected = h.api.status_patches().pop().expect("status");
    assert_eq!(ready(&rejected), ("False".into(), "InvalidSpec".into()));

    // Same generation, rejection already shown: no store call at all.
    let h2 = harness(pet_json(true, Some(rejected.clone()), json!({}), false));
    h2.reconcile().await.expect("reconcile");
    assert!(h2.store.calls().is_empty());

    // A new generation is tried again.
    let mut edited = pet_json(true, Some(rejected), json!({}), false);
    edited["metadata"]["generation"] = json!(2);
    let h3 = harness(edited);
    h3.reconcile().await.expect("reconcile");
    assert!(!h3.store.calls().is_empty());
}

#[tokio::test]
async fn deletion_deletes_the_record_then_releases_the_finalizer() {
    let status = json!({"id": "id-1"});
    let h = harness(pet_json(true, Some(status), json!({}), true));
    h.store.insert(UID, thor_data());
    h.reconcile().await.expect("reconcile");
    assert_eq!(h.store.calls(), ["delete:id-1"]);
    assert!(h.store.records().is_empty());
    assert_eq!(h.api.writes(), [format!("PATCH {PETS}")]);
    assert!(h.api.event_reasons().contains(&"Deleted".to_owned()));
}

#[tokio::test]
async fn deletion_without_a_recorded_id_still_finds_the_record() {
    let h = harness(pet_json(true, None, json!({}), true));
    h.store.insert(UID, thor_data());
    h.reconcile().await.expect("reconcile");
    assert_eq!(
        h.store.calls(),
        [format!("find_by_key:{UID}"), "delete:id-1".into()]
    );
    assert!(h.store.records().is_empty(), "nothing leaks");
}

#[tokio::test]
async fn orphan_policy_keeps_the_record() {
    let annotations = json!({ DELETION_POLICY_ANNOTATION: "Orphan" });
    let h = harness(pet_json(
        true,
        Some(json!({"id": "id-1"})),
        annotations,
        true,
    ));
    h.store.insert(UID, thor_data());
    h.reconcile().await.expect("reconcile");
    assert!(h.store.calls().is_empty());
    assert_eq!(h.store.records().len(), 1);
    assert_eq!(
        h.api.writes(),
        [format!("PATCH {PETS}")],
        "finalizer released"
    );
    assert!(h.api.event_reasons().contains(&"Orphaned".to_owned()));
}

#[tokio::test]
async fn paused_touches_nothing_and_says_so() {
    let annotations = json!({ PAUSED_ANNOTATION: "true" });
    let h = harness(pet_json(true, None, annotations, true));
    h.store.insert(UID, thor_data());
    let action = h.reconcile().await.expect("reconcile");
    assert_eq!(action, Action::await_change());
    assert!(h.store.calls().is_empty());
    assert_eq!(
        h.api.writes(),
        [format!("PATCH {PETS}/status")],
        "no finalizer removal"
    );
    let synced = h.api.status_patches()[0]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Synced").cloned())
        .expect("Synced");
    assert_eq!(synced["reason"], "ReconcilePaused");
}

#[tokio::test]
async fn a_vanished_record_is_recreated_with_a_warning() {
    let h = harness(pet_json(
        true,
        Some(json!({"id": "lost-id"})),
        json!({}),
        false,
    ));
    h.reconcile().await.expect("reconcile");
    assert_eq!(
        h.store.calls(),
        ["observe:lost-id".to_owned(), format!("create:{UID}")]
    );
    assert_eq!(h.api.status_patches()[0]["id"], "id-1");
    assert!(h.api.event_reasons().contains(&"Recreated".to_owned()));
}

#[tokio::test]
async fn the_reconcile_after_our_own_status_write_skips_the_store() {
    let h = harness(pet_json(true, None, json!({}), false));
    h.reconcile().await.expect("create");
    let synced = h.api.status_patches().pop().expect("status");
    let calls_after_create = h.store.calls().len();

    // The watch event of that status write triggers another reconcile.
    let updated: Pet =
        serde_json::from_value(pet_json(true, Some(synced), json!({}), false)).expect("pet");
    let action = reconcile(Arc::new(updated.clone()), Arc::clone(&h.ctx))
        .await
        .expect("reconcile");
    assert_eq!(h.store.calls().len(), calls_after_create, "no store call");
    assert_eq!(h.api.status_patches().len(), 1, "no API write");
    assert!(
        action != Action::await_change(),
        "the drift poll stays scheduled"
    );

    // A new generation is synced at once.
    let mut edited = updated;
    edited.metadata.generation = Some(2);
    reconcile(Arc::new(edited), Arc::clone(&h.ctx))
        .await
        .expect("reconcile");
    assert!(h.store.calls().len() > calls_after_create);
}
