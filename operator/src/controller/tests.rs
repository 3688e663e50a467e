//! The reconcile path against the strict mock API server and a fake store:
//! an unscripted call fails the test, and so does a scripted call that never
//! came or an Event the test did not name.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use http::Method;
use kube::runtime::events::Reporter;
use kube::runtime::{reflector, watcher};
use serde_json::{Value, json};

use super::*;
use crate::api_server::{ApiServerVerifier, failure};
use crate::crd::{
    APPROVE_PLAN_ANNOTATION, ChangePolicy, DELETION_POLICY_ANNOTATION, DeletionPolicy,
    EXTERNAL_ID_ANNOTATION, FINALIZER, PAUSED_ANNOTATION,
};
use crate::fixtures::{IDENTITY, UID};
use crate::status::{Outcome, Reason, next_status};
use crate::store::PetData;
use crate::store::fake::FakeStore;

const OTHER_UID: &str = "0f1e2d3c-other";
const PETS: &str = "/apis/petstore.example.com/v1/namespaces/default/pets/thor";

fn status_path() -> String {
    format!("{PETS}/status")
}

/// What the reconcile tests read back from the mock's calls.
trait ReconcileCalls {
    fn status_patches(&self) -> Vec<Value>;
    fn metadata_patches(&self) -> Vec<Value>;
    fn events(&self) -> Vec<Written>;
}

impl ReconcileCalls for ApiServerVerifier {
    fn status_patches(&self) -> Vec<Value> {
        self.calls(|c| c.method == Method::PATCH && c.path.ends_with("/status"))
            .into_iter()
            .map(|c| c.body["status"].clone())
            .collect()
    }

    fn metadata_patches(&self) -> Vec<Value> {
        self.calls(|c| c.method == Method::PATCH && c.path == PETS)
            .into_iter()
            .map(|c| c.body)
            .collect()
    }

    fn events(&self) -> Vec<Written> {
        self.calls(|c| c.path.contains("/events"))
            .into_iter()
            .map(|c| {
                let text = |k: &str| c.body[k].as_str().unwrap_or_default().to_owned();
                Written {
                    reason: text("reason"),
                    type_: text("type"),
                    action: text("action"),
                    note: text("note"),
                }
            })
            .collect()
    }
}

/// An Event as the writer POSTed it.
#[derive(Debug)]
struct Written {
    reason: String,
    type_: String,
    action: String,
    note: String,
}

struct Harness {
    api: ApiServerVerifier,
    store: Arc<FakeStore>,
    ctx: Arc<Context>,
}

fn harness() -> Harness {
    harness_with(Settings::default())
}

fn harness_with(settings: Settings) -> Harness {
    let api = ApiServerVerifier::with_events();
    let client = api.start();
    // The writer production uses: the mock sees its Event POSTs.
    let writer = crate::events::EventWriter::new(
        client.clone(),
        Reporter {
            controller: "petstore-operator".into(),
            instance: None,
        },
    );
    let metrics = Arc::new(Metrics::default());
    let store = Arc::new(FakeStore::default());
    let ctx = Arc::new(Context::new(
        client,
        store.clone(),
        crate::events::EventQueue::start(writer, Arc::clone(&metrics)),
        metrics,
        settings,
    ));
    Harness { api, store, ctx }
}

/// A harness whose store already holds the Pet's record, under its UID,
/// with `data`; and that record's ID.
fn harness_with_record(data: PetData) -> (Harness, String) {
    let h = harness();
    let id = h.store.insert_with_identity(UID, IDENTITY, data);
    (h, id)
}

/// The finalized test Pet, naming store record `id` for adoption.
fn adopting(id: &str) -> Pet {
    Pet::test()
        .annotated(EXTERNAL_ID_ANNOTATION, id)
        .finalized()
}

impl Harness {
    /// The API server accepts a status write.
    fn expect_status_write(&self, pet: &Pet) {
        self.api
            .expect(Method::PATCH, &status_path(), 200, pet.json());
    }

    /// The API server refuses a status write with this code.
    fn refuse_status_write(&self, code: u16) {
        self.api
            .expect(Method::PATCH, &status_path(), code, failure(code));
    }

    /// The API server accepts a finalizer change and returns `after`.
    fn expect_finalizer_write(&self, after: &Pet) {
        self.api.expect(Method::PATCH, PETS, 200, after.json());
    }

    /// The metrics text holds each of these series.
    fn assert_metrics(&self, present: &[&str]) {
        let metrics = self.ctx.metrics.encode().expect("metrics");
        for series in present {
            assert!(metrics.contains(series), "{series} in {metrics}");
        }
    }

    /// The metrics text holds no series with this text.
    fn assert_no_metric(&self, absent: &str) {
        let metrics = self.ctx.metrics.encode().expect("metrics");
        assert!(!metrics.contains(absent), "no {absent} in {metrics}");
    }

    /// One reconcile that writes the Pet's status and succeeds.
    async fn reconcile_writing_status(&self, pet: &Pet) -> Action {
        self.expect_status_write(pet);
        self.reconcile(pet).await.expect("reconcile")
    }

    /// One reconcile of a Pet being deleted that ends by releasing its
    /// finalizer (the API server returns it without one).
    async fn reconcile_releasing(&self, pet: &Pet) -> Action {
        let mut released = pet.clone();
        released.metadata.finalizers = None;
        self.expect_finalizer_write(&released);
        self.reconcile(pet).await.expect("reconcile")
    }

    /// One reconcile, then the Event queue drained so assertions see them.
    async fn reconcile(&self, pet: &Pet) -> Result<Action, Error> {
        let result = reconcile(Arc::new(pet.clone()), Arc::clone(&self.ctx)).await;
        self.ctx.events.flush().await;
        result
    }

    /// The store's only writes took record `id` over from the key `from`
    /// (one compare-and-set) and then brought it in line with the spec; the
    /// record is the Pet's, holds its spec, and the first status names it.
    fn assert_taken_over(&self, id: &str, from: &str) {
        assert_eq!(
            store_writes(&self.store),
            [
                format!("set_key:{id}:{from}->{UID}"),
                format!("update:{id}")
            ]
        );
        let record = self.store.record(id).expect("record");
        assert_eq!(
            (record.key.to_string().as_str(), record.data),
            (UID, PetData::test())
        );
        assert_eq!(self.api.status_patches()[0]["id"], id);
    }

    /// Record `id` is still another Pet's, and the first status's `type_`
    /// condition says so.
    fn assert_owned_elsewhere(&self, id: &str, type_: &str) {
        assert_eq!(
            self.store.record(id).expect("record").key.to_string(),
            OTHER_UID
        );
        assert_eq!(
            condition(&self.api.status_patches()[0], type_).1,
            "RecordOwnedElsewhere"
        );
    }

    /// Fails unless every scripted call came, nothing else did, and the
    /// Events are exactly `reasons`, in order.
    fn verify(&self, reasons: &[&str]) {
        self.api.verify();
        let events: Vec<String> = self.api.events().into_iter().map(|e| e.reason).collect();
        assert_eq!(events, reasons, "Events: {:?}", self.api.events());
    }

    /// The first Event with this reason.
    fn event(&self, reason: &str) -> Written {
        let events = self.api.events();
        let found = events.iter().position(|e| e.reason == reason);
        match found {
            Some(at) => events.into_iter().nth(at).expect("found"),
            None => panic!("no {reason} Event in {events:?}"),
        }
    }

    fn event_note(&self, reason: &str) -> String {
        self.event(reason).note
    }

    /// The first Event with this reason is of this type and action; its note,
    /// for the checks of what it says.
    fn assert_event(&self, reason: &str, type_: &str, action: &str) -> String {
        let event = self.event(reason);
        assert_eq!(
            (event.type_.as_str(), event.action.as_str()),
            (type_, action),
            "{event:?}"
        );
        event.note
    }
}

fn condition(status: &Value, type_: &str) -> (String, String, String) {
    let c = status["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == type_))
        .unwrap_or_else(|| panic!("{type_} condition in {status}"));
    let text = |k: &str| c[k].as_str().unwrap_or_default().to_owned();
    (text("status"), text("reason"), text("message"))
}

/// The condition of this type has this status and reason; its message.
fn assert_condition(status: &Value, type_: &str, want: &str, reason: &str) -> String {
    let (got, got_reason, message) = condition(status, type_);
    assert_eq!(
        (got.as_str(), got_reason.as_str()),
        (want, reason),
        "{type_}: {message}"
    );
    message
}

fn store_writes(store: &FakeStore) -> Vec<String> {
    store
        .calls()
        .into_iter()
        .filter(|c| !c.starts_with("observe"))
        .collect()
}

#[tokio::test]
async fn finalizer_is_persisted_before_anything_reaches_the_store() {
    // If the finalizer cannot be written, nothing is created.
    let h = harness();
    h.api.expect(Method::PATCH, PETS, 500, failure(500));
    let err = h
        .reconcile(&Pet::test())
        .await
        .expect_err("finalizer write failed");
    assert_eq!(err.reason(), Reason::ReconcileError);
    assert!(matches!(err, Error::AddFinalizer { .. }), "{err}");
    assert!(
        h.store.calls().is_empty(),
        "no store call without the finalizer"
    );
    h.verify(&[]);

    // Once it is written (with a resourceVersion precondition), the same
    // reconcile goes on to create.
    let h = harness();
    h.expect_finalizer_write(&Pet::test().finalized());
    h.expect_status_write(&Pet::test().finalized());
    h.reconcile(&Pet::test()).await.expect("reconcile");
    let patch = &h.api.metadata_patches()[0];
    assert_eq!(patch["metadata"]["finalizers"], json!([FINALIZER]));
    assert_eq!(patch["metadata"]["resourceVersion"], "1");
    assert_eq!(
        h.store.calls(),
        [format!("observe:-:{UID}"), format!("create:{UID}")]
    );
    h.verify(&["Created"]);
}

#[tokio::test]
async fn create_uses_the_uid_and_writes_the_id_at_once() {
    let h = harness();
    let pet = Pet::test().finalized();
    h.reconcile_writing_status(&pet).await;
    assert_eq!(store_writes(&h.store), [format!("create:{UID}")]);
    let patches = h.api.status_patches();
    assert_eq!(patches[0]["id"], "id-1");
    assert_eq!(patches[0]["observedGeneration"], 1);
    assert_eq!(condition(&patches[0], "Ready").1, "Available");
    h.assert_event("Created", "Normal", "Create");
    h.verify(&["Created"]);
}

// A merge patch of the status carries no resourceVersion, so the API
// server never answers 409 to it; any refusal fails the reconcile, with no
// re-read (the strict verifier would fail on a GET): the Pet says why, and
// the retry finds the record by key (next test).
#[tokio::test]
async fn a_refused_status_write_fails_the_reconcile_without_a_re_read() {
    let h = harness();
    let pet = Pet::test().finalized();
    h.refuse_status_write(409);
    h.expect_status_write(&pet);
    let failed = h.reconcile(&pet).await;
    assert!(failed.is_err(), "{failed:?}");
    assert_eq!(store_writes(&h.store), [format!("create:{UID}")]);
    let said = &h.api.status_patches()[1];
    assert_eq!(condition(said, "Ready").1, "ReconcileError", "{said}");
    h.verify(&["ReconcileError"]);
}

#[tokio::test]
async fn a_lost_status_write_is_recovered_by_key_not_by_a_second_record() {
    let h = harness();
    let pet = Pet::test().finalized();
    h.refuse_status_write(500);
    // The failure is then shown in status.
    h.expect_status_write(&pet);
    let first = h.reconcile(&pet).await;
    assert!(matches!(first, Err(Error::WriteStatus { .. })), "{first:?}");
    assert_eq!(h.store.records().len(), 1);

    // The next reconcile still sees no status.id (the write was lost). Its
    // create, keyed by the UID, finds the first record, which it then reads.
    h.reconcile_writing_status(&pet).await;
    assert_eq!(h.store.records().len(), 1, "never a second record");
    assert_eq!(
        h.store.calls(),
        [
            format!("observe:-:{UID}"),
            format!("create:{UID}"),
            format!("create:{UID}"),
            format!("observe:-:{UID}")
        ]
    );
    assert_eq!(h.api.status_patches().pop().expect("status")["id"], "id-1");
    h.assert_event("ReconcileError", "Warning", "Reconcile");
    h.assert_event("Adopted", "Normal", "AdoptByUid");
    h.verify(&["ReconcileError", "Adopted"]);
}

#[tokio::test]
async fn steady_state_makes_no_writes() {
    let (h, id) = harness_with_record(PetData::test());
    let synced = next_status(None, Some(1), Some(&id), &Outcome::synced(), Utc::now());
    let pet = Pet::test()
        .finalized()
        .with_status(serde_json::to_value(synced).expect("json"));
    h.reconcile(&pet).await.expect("reconcile");
    assert_eq!(
        h.store.calls(),
        [format!("observe:{id}:{UID}")],
        "one read, no store write"
    );
    h.verify(&[]);
}

#[tokio::test]
async fn drift_is_put_back_on_the_same_id() {
    let (h, id) = harness_with_record(PetData::named("Changed out of band"));
    let pet = Pet::test().finalized().with_status_id(&id);
    h.reconcile_writing_status(&pet).await;
    assert_eq!(store_writes(&h.store), [format!("update:{id}")]);
    assert_eq!(h.store.records()[0].data, PetData::test());
    h.assert_event("Updated", "Normal", "Update");
    h.verify(&["Updated"]);
}

#[tokio::test]
async fn drift_is_told_with_its_cause_and_fields_in_the_event_and_metrics() {
    let (h, id) = harness_with_record(PetData::named("Thorbert"));
    // Ready at this generation: the difference was made outside.
    let pet = Pet::test().finalized().ready(&id);
    h.reconcile_writing_status(&pet).await;
    assert_eq!(
        h.event_note("Updated"),
        format!(
            "drift corrected: name \"Thorbert\" -> \"Thor\" (store record {id} was changed outside the operator)"
        )
    );
    h.assert_metrics(&[
        "petstore_operator_store_actions_total{action=\"update\",cause=\"drift\"} 1",
        "petstore_operator_drift_detected_total{field=\"name\"} 1",
    ]);
    h.verify(&["Updated"]);
}

#[tokio::test]
async fn a_spec_edit_is_told_as_one_not_as_drift() {
    let (h, id) = harness_with_record(PetData::named("Thorbert"));
    // The spec was edited: generation 2, status still shows generation 1.
    let pet = Pet::test().finalized().ready(&id).with_generation(2);
    h.reconcile_writing_status(&pet).await;
    assert_eq!(
        h.event_note("Updated"),
        format!("spec change applied to store record {id}: name \"Thorbert\" -> \"Thor\"")
    );
    h.assert_metrics(&[
        "petstore_operator_store_actions_total{action=\"update\",cause=\"spec_change\"} 1",
    ]);
    h.assert_no_metric("drift_detected_total{");
    h.verify(&["Updated"]);
}

#[tokio::test]
async fn a_new_pet_is_counted_from_its_first_trigger_until_ready() {
    let h = harness();
    let pet = Pet::test().finalized();
    h.ctx.memory.triggered(&pet, UID);
    let gauges = h.ctx.memory.gauges();
    assert_eq!((gauges.queue_depth, gauges.not_ready), (1, 1));
    h.reconcile_writing_status(&pet).await;
    let gauges = h.ctx.memory.gauges();
    assert_eq!(
        (gauges.queue_depth, gauges.not_ready),
        (0, 0),
        "started, then Ready, and requeued for its poll in the future"
    );
    h.assert_metrics(&[
        "petstore_operator_time_to_ready_seconds_count 1",
        "petstore_operator_store_actions_total{action=\"create\",cause=\"new_pet\"} 1",
    ]);
    h.verify(&["Created"]);
}

#[tokio::test]
async fn an_update_whose_record_vanished_recreates_at_once() {
    let (h, id) = harness_with_record(PetData::named("Changed out of band"));
    h.store.vanish_before_next_update();
    let pet = Pet::test().finalized().with_status_id(&id);
    h.expect_status_write(&pet);
    h.reconcile(&pet)
        .await
        .expect("NOT_FOUND is handled in the same reconcile, not after a backoff");
    assert_eq!(
        store_writes(&h.store),
        [format!("update:{id}"), format!("create:{UID}")]
    );
    assert_eq!(h.api.status_patches()[0]["id"], "id-2");
    h.assert_event("Recreated", "Warning", "Recreate");
    h.verify(&["Recreated"]);
}

#[tokio::test]
async fn unreachable_store_sets_conditions_and_backs_off() {
    let h = harness();
    let pet = Pet::test().finalized();
    h.store.set_unavailable(true);
    h.expect_status_write(&pet);
    let err = h.reconcile(&pet).await.expect_err("store down");
    assert_eq!(err.reason(), Reason::StoreUnavailable);
    let patch = h.api.status_patches().pop().expect("status");
    assert_eq!(condition(&patch, "Ready").1, "StoreUnavailable");
    let first = error_policy(Arc::new(pet.clone()), &err, Arc::clone(&h.ctx));

    // The outage goes on. The Pet shows it already, so nothing more is
    // written, but every failure is counted and the backoff grows.
    let showing = Pet::test().finalized().with_status(patch);
    let mut last = first.clone();
    for _ in 0..12 {
        // Each retry comes when its backoff is over.
        h.ctx.memory.end_backoff(UID);
        let err = h.reconcile(&showing).await.expect_err("store down");
        last = error_policy(Arc::new(showing.clone()), &err, Arc::clone(&h.ctx));
    }
    assert_ne!(format!("{first:?}"), format!("{last:?}"));
    assert_eq!(h.ctx.memory.failures(UID), 13);
    // Capped at backoff_max (+10% jitter).
    assert!(backoff(&h.ctx.settings, 30) <= Duration::from_secs(330));
    assert!(backoff(&h.ctx.settings, 1) < Duration::from_secs(2));
    assert!(backoff(&h.ctx.settings, 4) >= Duration::from_secs(8));
    h.assert_metrics(&["reconcile_errors_total{reason=\"store_unavailable\"} 13"]);
    h.assert_event("StoreUnavailable", "Warning", "Reconcile");
    h.verify(&["StoreUnavailable"]);
}

/// The status a Pet shows once the store has been found down.
async fn showing_the_store_down(h: &Harness, pet: &Pet) -> Value {
    h.store.set_unavailable(true);
    h.expect_status_write(pet);
    h.reconcile(pet).await.expect_err("store down");
    h.api.status_patches().pop().expect("status")
}

#[tokio::test]
async fn failure_counts_are_per_uid_so_a_recreated_pet_starts_clean() {
    let h = harness();
    let down = showing_the_store_down(&h, &Pet::test().finalized()).await;
    let old = Pet::test().finalized().with_status(down.clone());
    for _ in 1..10 {
        h.reconcile(&old).await.expect_err("store down");
    }
    // Same name and namespace, new UID: its own count starts at one.
    let new = Pet::test()
        .finalized()
        .with_uid("a-new-uid")
        .with_status(down);
    let err = h.reconcile(&new).await.expect_err("store down");
    assert_eq!(h.ctx.memory.failures(UID), 10);
    assert_eq!(h.ctx.memory.failures("a-new-uid"), 1);
    // The backoff of a first failure: base (1 s) plus up to 10% jitter.
    let retry = format!(
        "{:?}",
        error_policy(Arc::new(new.clone()), &err, Arc::clone(&h.ctx))
    );
    assert!(retry.contains("Some(1."), "{retry}");
    h.verify(&["StoreUnavailable"]);
}

#[tokio::test]
async fn the_queue_holds_a_reference_without_the_uid_or_resource_version() {
    let h = harness();
    let pet = Pet::test();
    let reference = h
        .ctx
        .to_reconcile(watcher::Event::Apply(pet.clone()))
        .expect("a new Pet is reconciled");
    assert_eq!(reference, reflector::ObjectRef::from_obj(&pet));
    assert_eq!(reference.extra.uid, None);
    assert_eq!(reference.extra.resource_version, None);
    assert_eq!(h.ctx.memory.gauges().queue_depth, 1, "remembered by UID");
}

#[tokio::test]
async fn the_echo_of_a_failures_status_write_does_not_count_another_failure() {
    let h = harness();
    let pet = Pet::test().finalized();
    let down = showing_the_store_down(&h, &pet).await;
    let err = Error::Held(crate::status::Reason::StoreUnavailable, String::new());
    error_policy(Arc::new(pet.clone()), &err, Arc::clone(&h.ctx));
    // The watch event of that status write: the same intent, backing off.
    let echo = pet.clone().with_status(down);
    assert_eq!(
        h.ctx.to_reconcile(watcher::Event::Apply(echo.clone())),
        None
    );
    assert_eq!(h.ctx.memory.failures(UID), 1, "one attempt, one failure");
    // A change the user made is tried at once, backoff or not.
    let renamed = {
        let mut pet = echo.clone().with_generation(2);
        pet.spec.name = "Thorbert".into();
        pet
    };
    assert!(h.ctx.to_reconcile(watcher::Event::Apply(renamed)).is_some());
    let paused = echo.annotated(crate::crd::PAUSED_ANNOTATION, "true");
    assert!(h.ctx.to_reconcile(watcher::Event::Apply(paused)).is_some());
    // An echo queued before the backoff began (the finalizer write's) runs
    // no attempt: no store call, no second Warning, no second failure.
    let calls = h.store.calls();
    h.reconcile(&pet).await.expect("waits out the backoff");
    assert_eq!(h.store.calls(), calls);
    assert_eq!(h.ctx.memory.failures(UID), 1);
    h.verify(&["StoreUnavailable"]);
}

#[tokio::test]
async fn a_store_that_answers_again_releases_the_pets_waiting_on_it() {
    let h = harness();
    let (cache, mut writer) = reflector::store();
    h.ctx.memory.track(cache);
    let pet = Pet::test().finalized();
    writer.apply_watcher_event(&watcher::Event::Apply(pet.clone()));
    h.store.set_unavailable(true);
    h.expect_status_write(&pet);
    let err = h.reconcile(&pet).await.expect_err("store down");
    error_policy(Arc::new(pet.clone()), &err, Arc::clone(&h.ctx));
    assert!(
        release_if_store_answers(&h.ctx).await.is_empty(),
        "still down: nobody is released"
    );
    h.store.set_unavailable(false);
    let released = release_if_store_answers(&h.ctx).await;
    assert_eq!(
        released.len(),
        1,
        "released at the first probe that answers"
    );
    assert_eq!(released[0].metadata.uid.as_deref(), Some(UID));
    assert!(!h.ctx.memory.waiting_on_store());
    h.verify(&["StoreUnavailable"]);

    // A Pet that found the book's store waits for the extensions: an
    // answer without them releases nothing, our store in its place does.
    let h = harness();
    let (cache, mut writer) = reflector::store();
    h.ctx.memory.track(cache);
    writer.apply_watcher_event(&watcher::Event::Apply(pet.clone()));
    h.store.set_without_extensions(true);
    h.expect_status_write(&pet);
    let err = h.reconcile(&pet).await.expect_err("no extensions");
    error_policy(Arc::new(pet.clone()), &err, Arc::clone(&h.ctx));
    assert!(release_if_store_answers(&h.ctx).await.is_empty());
    h.store.set_without_extensions(false);
    assert_eq!(release_if_store_answers(&h.ctx).await.len(), 1);
    h.verify(&["StoreLacksExtensions"]);
}

#[tokio::test]
async fn a_pet_that_goes_while_failing_is_forgotten() {
    // Deleted while the store is down, and then gone without a finish: its
    // finalizer removed by hand, say. The watch reports it deleted.
    let h = harness();
    let pet = Pet::test().finalized().deleted();
    showing_the_store_down(&h, &pet).await;
    assert_eq!(h.ctx.memory.failures(UID), 1);
    assert_eq!(
        h.ctx.to_reconcile(watcher::Event::Delete(pet.clone())),
        None
    );
    assert_eq!(h.ctx.memory.len(), 0, "nothing left of the Pet");
    h.verify(&["StoreUnavailable"]);

    // Or the store comes back and the deletion finishes.
    let h = harness();
    let pet = Pet::test().finalized().deleted();
    showing_the_store_down(&h, &pet).await;
    h.store.set_unavailable(false);
    h.reconcile_releasing(&pet).await;
    assert_eq!(h.ctx.memory.len(), 0);
    h.verify(&["StoreUnavailable", "Deleted"]);
}

#[tokio::test]
async fn a_synced_pet_is_remembered_until_it_goes() {
    let h = harness();
    let pet = Pet::test().finalized();
    h.reconcile_writing_status(&pet).await;
    assert!(h.ctx.memory.synced(UID).is_some());
    // Its namespace deleted, its finalizer stripped: gone without a finish.
    assert_eq!(
        h.ctx.to_reconcile(watcher::Event::Delete(pet.clone())),
        None
    );
    assert_eq!(h.ctx.memory.len(), 0);

    // A Pet going without our finalizer has nothing for us to wait for.
    let h = harness();
    h.reconcile_writing_status(&pet).await;
    let action = h
        .reconcile(&Pet::test().deleted())
        .await
        .expect("reconcile");
    assert_eq!(action, Action::await_change());
    assert_eq!(h.ctx.memory.len(), 0);
    h.verify(&["Created"]);
}

#[tokio::test]
async fn rejection_is_terminal_until_the_spec_changes() {
    let h = harness();
    let pet = Pet::test().finalized();
    h.store.set_reject_creates(true);
    h.expect_status_write(&pet);
    let action = h
        .reconcile(&pet)
        .await
        .expect("terminal errors are not retried");
    assert_eq!(action, Action::await_change());
    let rejected = h.api.status_patches().pop().expect("status");
    assert_eq!(condition(&rejected, "Ready").1, "InvalidSpec");
    h.assert_event("InvalidSpec", "Warning", "Reconcile");
    h.verify(&["InvalidSpec"]);

    // Same generation, rejection already shown: no store call at all.
    let h2 = harness();
    h2.reconcile(&Pet::test().finalized().with_status(rejected.clone()))
        .await
        .expect("reconcile");
    assert!(h2.store.calls().is_empty());
    h2.verify(&[]);

    // A new generation is tried again.
    let h3 = harness();
    let edited = Pet::test()
        .finalized()
        .with_status(rejected)
        .with_generation(2);
    h3.expect_status_write(&edited);
    h3.reconcile(&edited).await.expect("reconcile");
    assert_eq!(store_writes(&h3.store), [format!("create:{UID}")]);
    h3.verify(&["Created"]);
}

#[tokio::test]
async fn deletion_deletes_this_pets_record_then_releases_the_finalizer() {
    let (h, id) = harness_with_record(PetData::test());
    let pet = Pet::test().finalized().with_status_id(&id).deleted();
    h.reconcile_releasing(&pet).await;
    assert_eq!(store_writes(&h.store), [format!("delete:{id}")]);
    assert!(h.store.records().is_empty());
    assert_eq!(
        h.api.metadata_patches()[0]["metadata"]["finalizers"],
        json!([])
    );
    h.assert_event("Deleted", "Normal", "Delete");
    h.verify(&["Deleted"]);
}

#[tokio::test]
async fn deletion_without_a_recorded_id_still_finds_the_record() {
    let h = harness();
    h.store.insert_with_identity(UID, IDENTITY, PetData::test());
    let pet = Pet::test().finalized().deleted();
    h.reconcile_releasing(&pet).await;
    assert_eq!(store_writes(&h.store), ["delete:id-1"]);
    assert!(h.store.records().is_empty(), "nothing leaks");
    h.verify(&["Deleted"]);
}

#[tokio::test]
async fn deletion_never_deletes_a_record_status_id_wrongly_names() {
    let h = harness();
    let alpha = h.store.insert(OTHER_UID, PetData::test());
    let pet = Pet::test().finalized().with_status_id(&alpha).deleted();
    h.reconcile_releasing(&pet).await;
    assert!(store_writes(&h.store).is_empty(), "{:?}", h.store.calls());
    assert_eq!(h.store.records().len(), 1, "alpha's record is untouched");
    assert!(h.event_note("Deleted").contains("nothing to delete"));
    h.verify(&["Deleted"]);
}

#[tokio::test]
async fn orphan_keeps_the_record_and_releases_it_for_adoption() {
    for pet in [
        Pet::test().annotated(DELETION_POLICY_ANNOTATION, "Orphan"),
        Pet::test().with_deletion_policy(DeletionPolicy::Orphan),
    ] {
        let (h, id) = harness_with_record(PetData::test());
        h.expect_finalizer_write(&pet.clone().with_status_id(&id).deleted());
        h.reconcile(&pet.finalized().with_status_id(&id).deleted())
            .await
            .expect("reconcile");
        assert_eq!(store_writes(&h.store), [format!("set_key:{id}:{UID}->")]);
        let kept = h.store.record(&id).expect("the record stays");
        assert_eq!(kept.key, "", "released: nobody owns it now");
        let note = h.assert_event("Orphaned", "Normal", "Orphan");
        assert!(
            note.contains(&format!("{EXTERNAL_ID_ANNOTATION}: {id}")),
            "{note}"
        );
        h.verify(&["Orphaned"]);
    }
}

#[tokio::test]
async fn a_misspelled_deletion_policy_stops_deletion_and_says_why() {
    let (h, id) = harness_with_record(PetData::test());
    let pet = Pet::test()
        .annotated(DELETION_POLICY_ANNOTATION, "Orhpan")
        .finalized()
        .with_status_id(&id)
        .deleted();
    let action = h.reconcile_writing_status(&pet).await;
    assert_eq!(action, Action::await_change());
    assert!(h.store.calls().is_empty(), "nothing deleted, nothing read");
    let message = assert_condition(
        &h.api.status_patches()[0],
        "Synced",
        "False",
        "InvalidAnnotation",
    );
    assert!(message.contains("\"Orhpan\""), "{message}");
    h.verify(&["InvalidAnnotation"]);
}

#[tokio::test]
async fn paused_touches_nothing_and_says_so() {
    for value in ["true", "yes"] {
        let h = harness();
        h.store.insert_with_identity(UID, IDENTITY, PetData::test());
        let pet = Pet::test()
            .annotated(PAUSED_ANNOTATION, value)
            .finalized()
            .deleted();
        let action = h.reconcile_writing_status(&pet).await;
        assert_eq!(action, Action::await_change());
        assert!(h.store.calls().is_empty());
        let (_, reason, message) = condition(&h.api.status_patches()[0], "Synced");
        if value == "true" {
            assert_eq!(reason, "ReconcilePaused");
            h.verify(&[]);
        } else {
            assert_eq!(reason, "InvalidAnnotation");
            assert!(message.contains("treated as paused"), "{message}");
            h.verify(&["InvalidAnnotation"]);
        }
    }
}

#[tokio::test]
async fn a_vanished_record_is_recreated_with_a_warning() {
    let h = harness();
    let pet = Pet::test().finalized().with_status_id("lost-id");
    h.reconcile_writing_status(&pet).await;
    assert_eq!(store_writes(&h.store), [format!("create:{UID}")]);
    assert_eq!(h.api.status_patches()[0]["id"], "id-1");
    h.verify(&["Recreated"]);
}

#[tokio::test]
async fn a_status_id_naming_another_pets_record_is_corrected_and_theirs_untouched() {
    let h = harness();
    let alpha = h.store.insert(OTHER_UID, PetData::named("Alpha"));
    let mine = h.store.insert_with_identity(UID, IDENTITY, PetData::test());
    let pet = Pet::test().finalized().with_status_id(&alpha);
    h.reconcile_writing_status(&pet).await;
    assert!(store_writes(&h.store).is_empty(), "{:?}", h.store.calls());
    assert_eq!(h.store.record(&alpha).expect("alpha").data.name, "Alpha");
    let status = &h.api.status_patches()[0];
    assert_eq!(status["id"], mine.as_str());
    assert_condition(status, "Synced", "True", "StatusIdCorrected");
    let note = h.assert_event("StatusIdCorrected", "Warning", "IgnoreForeignRecord");
    assert!(note.contains("belongs to another owner"), "{note}");
    h.verify(&["StatusIdCorrected"]);
}

#[tokio::test]
async fn a_status_id_naming_nothing_finds_the_pets_own_record_without_claiming_a_create() {
    let (h, mine) = harness_with_record(PetData::test());
    let pet = Pet::test().finalized().with_status_id("nowhere");
    h.reconcile_writing_status(&pet).await;
    assert!(
        store_writes(&h.store).is_empty(),
        "no create: {:?}",
        h.store.calls()
    );
    assert_eq!(h.api.status_patches()[0]["id"], mine.as_str());
    let note = h.assert_event("StatusIdCorrected", "Warning", "ReplaceUnknownId");
    assert!(
        note.contains("does not exist") && !note.contains("created"),
        "{note}"
    );
    h.verify(&["StatusIdCorrected"]);
}

#[tokio::test]
async fn an_unowned_record_named_for_adoption_is_claimed_and_kept_in_line() {
    let h = harness();
    let loose = h.store.insert("", PetData::named("Made with grpcurl"));
    h.reconcile_writing_status(&adopting(&loose)).await;
    h.assert_taken_over(&loose, "");
    h.assert_event("Adopted", "Normal", "AdoptNamedRecord");
    h.verify(&["Adopted"]);
}

#[tokio::test]
async fn a_record_owned_by_another_pet_is_never_taken() {
    let h = harness();
    let theirs = h.store.insert(OTHER_UID, PetData::test());
    h.reconcile_writing_status(&adopting(&theirs)).await;
    assert!(store_writes(&h.store).is_empty(), "{:?}", h.store.calls());
    h.assert_owned_elsewhere(&theirs, "Ready");
    let status = &h.api.status_patches()[0];
    assert!(status["id"].is_null(), "no ID claimed: {status}");
    h.assert_event("RecordOwnedElsewhere", "Warning", "Reconcile");
    h.verify(&["RecordOwnedElsewhere"]);
}

#[tokio::test]
async fn losing_an_adoption_race_touches_nothing() {
    let h = harness();
    let loose = h.store.insert("", PetData::test());
    // Between our observation and our compare-and-set, another Pet wins.
    h.store.rekey_before_next_set_key(OTHER_UID);
    h.reconcile_writing_status(&adopting(&loose)).await;
    assert_eq!(
        store_writes(&h.store),
        [format!("set_key:{loose}:->{UID}")],
        "the failed claim only, no update"
    );
    h.assert_owned_elsewhere(&loose, "Synced");
    h.verify(&["RecordOwnedElsewhere"]);
}

#[tokio::test]
async fn a_store_without_the_extensions_gets_its_own_reason_and_orphan_still_releases() {
    let h = harness();
    h.store.set_without_extensions(true);
    let pet = Pet::test().finalized();
    h.expect_status_write(&pet);
    let err = h.reconcile(&pet).await.expect_err("retried with backoff");
    assert_eq!(err.reason(), Reason::StoreLacksExtensions);
    let (_, reason, message) = condition(&h.api.status_patches()[0], "Ready");
    assert_eq!(reason, "StoreLacksExtensions");
    assert!(message.contains("petstore.PetStore/GetPets"), "{message}");
    h.verify(&["StoreLacksExtensions"]);

    // Deleting with Delete waits and says how to let go: Orphan.
    let h = harness();
    h.store.set_without_extensions(true);
    let pet = Pet::test().finalized().with_status_id("old-id").deleted();
    h.expect_status_write(&pet);
    h.reconcile(&pet).await.expect_err("deletion waits");
    let (_, _, message) = condition(&h.api.status_patches()[0], "Synced");
    assert!(message.contains("Orphan"), "{message}");
    h.verify(&["StoreLacksExtensions"]);

    // Orphan lets the Pet go.
    let h = harness();
    h.store.set_without_extensions(true);
    let pet = Pet::test()
        .with_deletion_policy(DeletionPolicy::Orphan)
        .with_status_id("old-id")
        .deleted();
    h.expect_finalizer_write(&pet);
    h.reconcile(&pet.clone().finalized())
        .await
        .expect("released");
    assert!(h.event_note("Orphaned").contains("old-id"));
    h.verify(&["Orphaned"]);
}

#[tokio::test]
async fn the_reconcile_after_our_own_status_write_skips_the_store() {
    let h = harness();
    let pet = Pet::test().finalized();
    h.reconcile_writing_status(&pet).await;
    let synced = h.api.status_patches().pop().expect("status");
    let calls_after_create = h.store.calls().len();

    // The watch event of that status write triggers another reconcile.
    let updated = Pet::test().finalized().with_status(synced);
    let action = h.reconcile(&updated).await.expect("reconcile");
    assert_eq!(h.store.calls().len(), calls_after_create, "no store call");
    assert_eq!(
        action,
        Action::await_change(),
        "kube's scheduler holds nothing"
    );
    let poll = h
        .ctx
        .memory
        .poll_due(UID)
        .expect("the drift poll stays scheduled");
    assert!(
        poll > std::time::Instant::now() + Settings::default().poll_interval / 4,
        "the poll is at least half an interval away, less the creation's"
    );

    // A Pet re-created under the same name (a new UID) is synced at once.
    // Its memory is by UID; the store is one older than identities, so the
    // old record is not taken over (that is for the decision's tests).
    h.store.set_without_identities(true);
    let recreated = Pet::test().finalized().with_uid("a-new-uid");
    h.reconcile_writing_status(&recreated).await;
    assert!(h.store.calls().len() > calls_after_create);
    let calls_now = h.store.calls().len();

    // So is a new generation.
    let edited = updated.with_generation(2);
    h.reconcile_writing_status(&edited).await;
    assert!(h.store.calls().len() > calls_now);
    h.verify(&["Created", "Created"]);
}

#[tokio::test]
async fn the_watch_events_of_our_own_writes_are_not_reconciled_again() {
    let h = harness();
    let pet = Pet::test().finalized();
    assert!(h.ctx.needs_reconcile(&pet), "a new Pet");
    h.reconcile_writing_status(&pet).await;
    let written = pet.clone().with_status_id("id-1");
    assert!(
        !h.ctx.needs_reconcile(&written),
        "the event of our own status write"
    );
    assert!(
        h.ctx.needs_reconcile(&written.clone().with_generation(2)),
        "a new generation"
    );
    assert!(
        h.ctx.needs_reconcile(&written.clone().deleted()),
        "deletion"
    );
    assert!(
        h.ctx
            .needs_reconcile(&written.clone().annotated(PAUSED_ANNOTATION, "true")),
        "pausing"
    );
    assert!(
        h.ctx.needs_reconcile(&written.clone().with_uid(OTHER_UID)),
        "another Pet of the same name"
    );
    h.verify(&["Created"]);
}

#[tokio::test]
async fn the_copy_a_sync_was_decided_from_is_stale_however_late_its_echo_comes() {
    // No time for an echo at all: only the copy itself can say it is stale.
    let h = harness_with(Settings {
        poll_interval: Duration::ZERO,
        ..Settings::default()
    });
    let pet = Pet::test().finalized().with_resource_version("41");
    h.expect_status_write(&pet.clone().with_resource_version("42"));
    h.reconcile(&pet).await.expect("create");
    assert!(
        !h.ctx.needs_reconcile(&pet),
        "the copy the create was decided from, its status write's event not yet come"
    );
    assert!(
        h.ctx
            .needs_reconcile(&pet.clone().with_resource_version("43")),
        "another copy without the ID, the echo's time over: someone's change"
    );

    // A sync that wrote nothing leaves its copy current: polled again.
    let synced = h.api.status_patches().pop().expect("status");
    let current = Pet::test()
        .finalized()
        .with_status(synced)
        .with_resource_version("42");
    h.reconcile(&current)
        .await
        .expect("in sync, nothing written");
    assert!(
        h.ctx.needs_reconcile(&current),
        "the next poll reads the store"
    );

    // A write the API server took as no change (the reply names the copy's
    // own version) leaves the copy current too. (Without an ID, this copy
    // finds the record by the Pet's UID: an adoption.)
    let unchanged = Pet::test().finalized().with_resource_version("50");
    h.expect_status_write(&unchanged);
    h.reconcile(&unchanged).await.expect("synced again");
    assert!(
        h.ctx.needs_reconcile(&unchanged),
        "a copy no write replaced is not stale"
    );
    h.verify(&["Created", "Adopted"]);
}

/// Under load the feed's event of a sync's own write came before the
/// watch event of its status write, and the stale copy's create was sent
/// again: a change the feed tells makes the echo read the store, never the
/// stale copy current.
#[tokio::test]
async fn a_change_the_feed_tells_does_not_make_the_stale_copy_current() {
    let h = harness();
    let pet = Pet::test().finalized().with_resource_version("41");
    h.expect_status_write(&pet.clone().with_resource_version("42"));
    h.reconcile(&pet).await.expect("create");
    let echo = Pet::test()
        .finalized()
        .with_status(h.api.status_patches().pop().expect("status"))
        .with_resource_version("42");
    assert!(
        !h.ctx.needs_reconcile(&echo),
        "the echo, nothing told since"
    );

    h.ctx.memory.suspect_drift(&pet, UID);
    assert!(
        !h.ctx.needs_reconcile(&pet),
        "the copy the create was decided from is still stale"
    );
    assert!(
        h.ctx.needs_reconcile(&echo),
        "the echo reads the store, for the change the feed told"
    );
    h.verify(&["Created"]);
}

#[tokio::test]
async fn a_misspelled_deletion_policy_on_a_live_pet_is_shown_while_the_record_is_kept_in_line() {
    let (h, id) = harness_with_record(PetData::named("Drifted"));
    let pet = Pet::test()
        .annotated(DELETION_POLICY_ANNOTATION, "Orhpan")
        .finalized()
        .with_status_id(&id);
    h.reconcile_writing_status(&pet).await;
    assert_eq!(store_writes(&h.store), [format!("update:{id}")]);
    let status = &h.api.status_patches()[0];
    assert_eq!(condition(status, "Ready").0, "True");
    let message = assert_condition(status, "Synced", "False", "InvalidAnnotation");
    assert!(message.contains("deleting this Pet will wait"), "{message}");
    h.verify(&["InvalidAnnotation", "Updated"]);
}

/// The harness after one create, from which it has learnt that the store's
/// create says whether the key already named a record.
async fn harness_after_a_create() -> Harness {
    let h = harness();
    let first = Pet::test().with_uid("first-uid").finalized();
    h.expect_status_write(&first);
    h.reconcile(&first).await.expect("first create");
    assert_eq!(
        h.store.calls(),
        ["observe:-:first-uid", "create:first-uid"],
        "the first create is read for first"
    );
    // That Pet went with its record: the next Pet of its name starts anew.
    h.store.remove("id-1");
    h
}

#[tokio::test]
async fn once_the_store_says_what_a_create_found_a_new_pet_is_created_without_a_read() {
    let h = harness_after_a_create().await;
    let pet = Pet::test().finalized();
    h.reconcile_writing_status(&pet).await;
    assert_eq!(h.store.calls()[2..], [format!("create:{UID}")]);
    let status = h.api.status_patches().pop().expect("status");
    assert_eq!(status["id"], "id-2");
    assert_eq!(condition(&status, "Ready").1, "Available");
    let created: Vec<String> = h.api.events().into_iter().map(|e| e.note).collect();
    assert!(created[1].contains("id-2"), "{created:?}");
    h.verify(&["Created", "Created"]);
}

#[tokio::test]
async fn a_create_that_finds_the_record_of_an_interrupted_create_reads_it_and_brings_it_in_line() {
    // A create whose ID never reached status left a record under the UID,
    // with the spec of the time.
    let h = harness_after_a_create().await;
    let left =
        h.store
            .insert_with_identity(UID, IDENTITY, PetData::named("Thor, as first written"));
    let pet = Pet::test().finalized();
    h.reconcile_writing_status(&pet).await;
    assert_eq!(
        h.store.calls()[2..],
        [
            format!("create:{UID}"),
            format!("observe:-:{UID}"),
            format!("update:{left}")
        ]
    );
    assert_eq!(h.store.record(&left).expect("record").data, PetData::test());
    assert_eq!(h.store.records().len(), 1, "nothing created twice");
    assert_eq!(h.api.status_patches()[1]["id"], left.as_str());
    h.verify(&["Created", "Adopted"]);
}

#[tokio::test]
async fn a_store_that_stops_saying_what_a_create_found_is_read_first_again() {
    // The store is replaced by one that ignores keys (the original store).
    let h = harness_after_a_create().await;
    h.store.set_without_extensions(true);
    let pet = Pet::test().finalized();
    h.expect_status_write(&pet);
    let err = h.reconcile(&pet).await.expect_err("held");
    assert_eq!(err.reason(), Reason::StoreLacksExtensions);
    assert_eq!(
        h.store.calls()[2..],
        [format!("create:{UID}"), format!("observe:-:{UID}")]
    );

    // From now on nothing is created before a read, which this store refuses.
    let other = Pet::test().with_uid(OTHER_UID).finalized();
    h.expect_status_write(&other);
    h.reconcile(&other).await.expect_err("held");
    assert_eq!(h.store.calls()[4..], [format!("observe:-:{OTHER_UID}")]);
    h.verify(&["Created", "StoreLacksExtensions", "StoreLacksExtensions"]);
}

/// A new Pet that names `named` for adoption, and the record it names: one
/// owned by another Pet, or none at all.
fn naming(h: &Harness, owned_elsewhere: bool) -> (Pet, &'static str) {
    let named = if owned_elsewhere {
        h.store.insert(OTHER_UID, PetData::test())
    } else {
        "no-such-record".to_owned()
    };
    let reason = if owned_elsewhere {
        "RecordOwnedElsewhere"
    } else {
        "RecordNotFound"
    };
    (
        Pet::test().annotated(EXTERNAL_ID_ANNOTATION, &named),
        reason,
    )
}

#[tokio::test]
async fn a_held_pets_warning_is_written_once_though_the_next_reconcile_reads_a_stale_copy() {
    for owned_elsewhere in [true, false] {
        let h = harness();
        let (pet, reason) = naming(&h, owned_elsewhere);
        // The first reconcile adds the finalizer, then shows the hold.
        h.expect_finalizer_write(&pet.clone().finalized());
        h.reconcile_writing_status(&pet).await;
        let shown = h.api.status_patches().pop().expect("status");
        assert_eq!(condition(&shown, "Synced").1, reason);
        // The finalizer's watch event queued another reconcile, which kube
        // runs as soon as the first ends, from the watch cache: often before
        // the status write's own event has reached it.
        let stale = pet.finalized();
        h.expect_status_write(&stale);
        h.reconcile(&stale).await.expect("held");
        // Then the status write's echo, and a poll.
        let echo = stale.with_status(shown);
        h.reconcile(&echo).await.expect("held");
        h.reconcile(&echo).await.expect("held");
        h.verify(&[reason]);
    }
}

#[tokio::test]
async fn a_held_pet_is_warned_again_for_each_change_of_reason_even_from_a_stale_copy() {
    let h = harness();
    let (not_found, _) = naming(&h, false);
    let (owned, _) = naming(&h, true);
    let not_found = not_found.finalized();
    let owned = owned.finalized();
    h.expect_status_write(&not_found);
    h.reconcile(&not_found).await.expect("held");
    let shows_not_found = h.api.status_patches().pop().expect("status");
    // The annotation now names a record another Pet owns.
    let renamed = owned.with_status(shows_not_found.clone());
    h.expect_status_write(&renamed);
    h.reconcile(&renamed).await.expect("held");
    // And back, read from a copy that still shows the first reason: this
    // process has since shown another, so it is a change.
    // (It computes the same status as that copy shows, so writes none.)
    let back = not_found.with_status(shows_not_found);
    h.reconcile(&back).await.expect("held");
    h.verify(&["RecordNotFound", "RecordOwnedElsewhere", "RecordNotFound"]);
}

#[tokio::test]
async fn a_create_after_a_read_that_finds_its_record_already_there_reads_it_and_brings_it_in_line()
{
    // The first create timed out and committed afterwards, after the read
    // that the retry makes first: that read finds nothing, and the retry's
    // create, keyed by the UID, answers with the record the first one made.
    let h = harness();
    let pet = Pet::test().finalized();
    h.store.commit_next_create_late();
    h.expect_status_write(&pet);
    let err = h.reconcile(&pet).await.expect_err("the create timed out");
    assert_eq!(err.reason(), Reason::StoreUnavailable);
    // Meanwhile the spec changed: that record holds the old name.
    let renamed = {
        let mut pet = pet.with_generation(2);
        pet.spec.name = "Thorbert".into();
        pet
    };
    h.reconcile_writing_status(&renamed).await;
    let id = h.store.records()[0].id.clone();
    assert_eq!(
        h.store.calls(),
        [
            format!("observe:-:{UID}"),
            format!("create:{UID}"),
            format!("observe:-:{UID}"),
            format!("create:{UID}"),
            format!("observe:-:{UID}"),
            format!("update:{id}"),
        ]
    );
    assert_eq!(h.store.records().len(), 1, "nothing created twice");
    assert_eq!(h.store.records()[0].data, PetData::named("Thorbert"));
    assert_eq!(
        h.api.status_patches().pop().expect("status")["id"],
        id.as_str()
    );
    // The create that made nothing is neither logged nor counted as one.
    h.assert_metrics(&["petstore_operator_store_actions_total{action=\"update\""]);
    h.assert_no_metric("action=\"create\"");
    h.verify(&["StoreUnavailable", "Adopted"]);
}

/// A Pet in Approve whose spec renames its record: the plan, as the
/// reconcile wrote it to status.
async fn approve_pending_rename(h: &Harness, id: &str) -> (Pet, Value) {
    let mut pet = Pet::test()
        .finalized()
        .with_change_policy(ChangePolicy::Approve)
        .with_status_id(id);
    pet.spec.name = "Thorbert".into();
    h.reconcile_writing_status(&pet).await;
    let status = h.api.status_patches().pop().expect("a status write");
    (pet, status)
}

#[tokio::test]
async fn approve_shows_the_plan_and_writes_nothing_until_its_hash_is_approved() {
    let (h, id) = harness_with_record(PetData::test());
    let (pet, status) = approve_pending_rename(&h, &id).await;
    assert!(store_writes(&h.store).is_empty(), "{:?}", h.store.calls());
    let plan = &status["plan"];
    assert_eq!(plan["summary"], "update name");
    assert_eq!(status["pendingPlan"], "update name", "the Plan column");
    assert_eq!(plan["cause"], "spec_change");
    assert_eq!(
        plan["actions"][0]["changes"][0],
        json!({"field": "name", "from": "\"Thor\"", "to": "\"Thorbert\""})
    );
    let hash = plan["hash"].as_str().expect("a hash").to_owned();
    assert_condition(&status, "Ready", "False", "PlanPending");
    let note = h.assert_event("PlanPending", "Normal", "ShowPlan");
    assert!(note.contains(&hash), "{note}");
    h.verify(&["PlanPending"]);

    // The same plan again: no second Event.
    let shown = pet.clone().with_status(status.clone());
    h.reconcile(&shown).await.expect("reconcile");
    h.verify(&["PlanPending"]);

    // Another plan's hash: nothing written, one Warning.
    let stale = shown
        .clone()
        .annotated(APPROVE_PLAN_ANNOTATION, "0123456789abcdef");
    h.reconcile(&stale).await.expect("reconcile");
    h.reconcile(&stale).await.expect("reconcile");
    assert!(store_writes(&h.store).is_empty(), "{:?}", h.store.calls());
    h.verify(&["PlanPending", "ApprovalStale"]);
    let note = h.assert_event("ApprovalStale", "Warning", "RefuseStaleApproval");
    assert!(note.contains(&hash), "{note}");

    // This plan's hash: exactly its write, and the approval is used up.
    let approved = shown.annotated(APPROVE_PLAN_ANNOTATION, &hash);
    h.reconcile_writing_status(&approved).await;
    assert_eq!(store_writes(&h.store), [format!("update:{id}")]);
    let status = h.api.status_patches().pop().expect("a status write");
    assert_eq!(status["plan"], Value::Null, "the plan is cleared: {status}");
    // Removed, so that the API server fills its default, `none`.
    assert_eq!(status["pendingPlan"], Value::Null, "{status}");
    assert!(
        status
            .as_object()
            .is_some_and(|s| s.contains_key("pendingPlan")),
        "a merge patch removes only what it sets to null: {status}"
    );
    assert_eq!(status["appliedPlan"], hash.as_str());
    assert_condition(&status, "Ready", "True", "Available");
}

#[tokio::test]
async fn an_approval_is_used_once() {
    let (h, id) = harness_with_record(PetData::test());
    let (pet, status) = approve_pending_rename(&h, &id).await;
    let hash = status["plan"]["hash"].as_str().expect("a hash").to_owned();
    // The record was put back out of band after the approved write: the
    // same writes again, but a new plan with a hash of its own (it follows
    // the applied one); the spent approval does not apply it.
    let spent = pet
        .with_status(json!({"id": id, "appliedPlan": hash}))
        .annotated(APPROVE_PLAN_ANNOTATION, &hash);
    h.reconcile_writing_status(&spent).await;
    assert!(store_writes(&h.store).is_empty(), "{:?}", h.store.calls());
    let status = h.api.status_patches().pop().expect("a status write");
    assert_eq!(status["plan"]["summary"], "update name");
    assert_ne!(status["plan"]["hash"], hash.as_str(), "the spent hash");
    // Each plan told once: the approved one, then this one.
    h.verify(&["PlanPending", "PlanPending"]);
}

#[tokio::test]
async fn observe_never_writes_not_even_when_the_pet_goes() {
    let (h, id) = harness_with_record(PetData::named("Changed outside"));
    let pet = Pet::test()
        .finalized()
        .with_change_policy(ChangePolicy::Observe)
        .with_status_id(&id);
    h.reconcile_writing_status(&pet).await;
    let status = h.api.status_patches().pop().expect("a status write");
    assert_eq!(status["plan"]["summary"], "update name");
    assert_condition(&status, "Ready", "False", "RecordDiffers");
    // Even approved, Observe writes nothing.
    let hash = status["plan"]["hash"].as_str().expect("a hash").to_owned();
    let shown = pet.with_status(status.clone());
    let approved = shown.clone().annotated(APPROVE_PLAN_ANNOTATION, &hash);
    h.reconcile(&approved).await.expect("reconcile");
    // Deleted: the finalizer goes, the record stays as it was, keyed.
    h.reconcile_releasing(&shown.deleted()).await;
    assert!(store_writes(&h.store).is_empty(), "{:?}", h.store.calls());
    let record = h.store.record(&id).expect("the record is kept");
    assert_eq!(
        (record.key.to_string().as_str(), record.data.name.as_str()),
        (UID, "Changed outside")
    );
    h.verify(&["RecordDiffers", "Orphaned"]);
}

#[tokio::test]
async fn a_pet_of_a_rebuilt_cluster_takes_over_its_record_and_creates_nothing() {
    let h = harness();
    let lost = "uid-of-the-pet-the-old-cluster-had";
    let old = h
        .store
        .insert_with_identity(lost, IDENTITY, PetData::named("Thor, before"));
    h.reconcile_writing_status(&Pet::test().finalized()).await;
    h.assert_taken_over(&old, lost);
    assert_eq!(h.store.records().len(), 1, "no record created");
    assert!(h.event("Adopted").note.contains(lost));
    h.verify(&["Adopted"]);
}

#[tokio::test]
async fn a_record_made_before_identities_is_given_its_pets_identity_with_its_own_key() {
    let h = harness();
    let id = h.store.insert(UID, PetData::test());
    let pet = Pet::test().finalized();
    h.reconcile_writing_status(&pet).await;
    assert_eq!(
        store_writes(&h.store),
        [format!("set_key:{id}:{UID}->{UID}")]
    );
    let record = h.store.record(&id).expect("record");
    assert_eq!(
        (record.key.to_string().as_str(), record.identity.as_str()),
        (UID, IDENTITY)
    );
    h.verify(&["Adopted"]);
}

#[tokio::test]
async fn a_record_of_another_installation_with_the_same_name_is_held_untouched() {
    let h = harness_with(Settings {
        installation: "blue".into(),
        ..Settings::default()
    });
    let theirs = h
        .store
        .insert_with_identity("green/uid-x", IDENTITY, PetData::test());
    let pet = Pet::test().finalized();
    h.reconcile_writing_status(&pet).await;
    assert!(store_writes(&h.store).is_empty(), "{:?}", h.store.calls());
    let status = h.api.status_patches().pop().expect("status");
    let message = assert_condition(&status, "Synced", "False", "RecordOwnedElsewhere");
    assert!(
        message.contains("\"green\"") && message.contains(&theirs),
        "{message}"
    );
    h.verify(&["RecordOwnedElsewhere"]);
}

#[test]
fn a_due_poll_is_handed_over_within_a_sixtieth_of_its_interval() {
    assert_eq!(
        sweep_period(Duration::from_secs(300)),
        Duration::from_secs(5)
    );
    assert_eq!(
        sweep_period(Duration::from_secs(3600)),
        Duration::from_secs(5),
        "the audit's hour waits no longer"
    );
    assert_eq!(
        sweep_period(Duration::from_secs(6)),
        Duration::from_millis(100)
    );
    assert_eq!(
        sweep_period(Duration::from_millis(100)),
        Duration::from_millis(20)
    );
}
