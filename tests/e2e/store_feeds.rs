//! The change feed of every store in use, read as the stores' observer
//! (docs/tenancy.md): one operator, the real API server, and three stores
//! with tenancy. Stores A and B name the operator's own ServiceAccount an
//! observer; store C does not. The operator polls every 10 minutes, so
//! whatever it puts back within seconds it found on a feed.
//!
//! - An out-of-band change in B is put back within seconds.
//! - B's two store objects (a `ClusterPetStore` and team-b's default
//!   `PetStore`, one endpoint and audience) read one feed: B serves one
//!   stream, and a change for either one's Pet is put back from it.
//! - A change in A to a record whose ID a Pet of B names queues nothing in
//!   B: B is not read.
//! - C is told of once in the log, counted as `refused`, and its Pets are
//!   polled.
//! - With B stopped, A's Pets keep reconciling and A's feed is still
//!   followed.

use std::time::{Duration, Instant};

use fixtures::env::{OPERATOR_ACCOUNT, OPERATOR_NAMESPACE};
use fixtures::{ControlPlane, Env, Operator, PetStoreServer, Storage, wait_for};
use petstore_operator::crd::Pet;
use serde_json::Value;

use crate::typed::{self, is_ready};

const TIMEOUT: Duration = Duration::from_secs(90);
/// Far longer than the story: a Pet's first poll is at least half of it
/// away.
const POLL_INTERVAL: &str = "10m";
/// How soon a change in a followed store is put back: a feed message and a
/// reconcile away, with room for a machine twice as slow under load. The
/// poll is minutes away.
const FROM_THE_FEED: Duration = Duration::from_secs(15);
/// How soon a new Pet is Ready on a store that answers.
const READY_WITHIN: Duration = Duration::from_secs(20);

fn pet(
    namespace: &str,
    name: &str,
    store_ref: Option<(&str, &str)>,
    external_id: Option<&str>,
) -> String {
    let annotations = external_id
        .map(|id| format!("\n  annotations:\n    petstore.example.com/external-id: \"{id}\""))
        .unwrap_or_default();
    let store_ref = store_ref
        .map(|(kind, store)| format!("\n  storeRef: {{kind: {kind}, name: {store}}}"))
        .unwrap_or_default();
    format!(
        "apiVersion: petstore.example.com/v1\nkind: Pet\nmetadata:\n  name: {name}\n  namespace: {namespace}{annotations}\nspec:\n  name: {name}\n  type: dog\n  birthday: \"2021-04-01\"{store_ref}\n"
    )
}

/// A store with tenancy for `audience`, naming the operator an observer if
/// `observer`.
fn tenancy_store(
    cp: &ControlPlane,
    issuer: &str,
    audience: &str,
    observer: bool,
) -> fixtures::Result<PetStoreServer> {
    let mut flags = fixtures::TenancyFlags::new(issuer, audience);
    if observer {
        flags = flags.operator_observer();
    }
    PetStoreServer::start_in(&cp.dir().join(audience), Storage::Memory, &flags.args())
}

/// grpcurl against `store` as a tenant, answering the messages.
fn grpcurl_as(
    store: &PetStoreServer,
    token: &str,
    method: &str,
    data: &str,
) -> fixtures::Result<Vec<Value>> {
    fixtures::petstore::grpcurl_with_token(
        &store.addr,
        token,
        &format!("petstore.PetStore/{method}"),
        data,
    )
}

/// The name of record `id`, as the tenant reads it.
fn record_name(store: &PetStoreServer, token: &str, id: &str) -> fixtures::Result<String> {
    let answer = grpcurl_as(store, token, "GetPets", &format!(r#"{{"ids":["{id}"]}}"#))?;
    Ok(answer
        .first()
        .and_then(|reply| reply["pets"][0]["name"].as_str())
        .unwrap_or_default()
        .to_owned())
}

/// Renames record `id` out of band, as the tenant.
fn rename(store: &PetStoreServer, token: &str, id: &str, name: &str) -> fixtures::Result<()> {
    grpcurl_as(
        store,
        token,
        "UpdatePets",
        &format!(
            r#"{{"pets":[{{"id":"{id}","name":"{name}","type":"PTCanine","birthday":{{"year":2021,"month":4,"day":1}}}}]}}"#
        ),
    )
    .map(drop)
}

/// Renames the record out of band and waits until it is put back; how long
/// that took.
fn put_back_after(
    store: &PetStoreServer,
    token: &str,
    id: &str,
    name: &str,
) -> fixtures::Result<Duration> {
    let changed = Instant::now();
    rename(store, token, id, "Tampered")?;
    wait_for(TIMEOUT, &format!("record {id} put back to {name}"), || {
        (record_name(store, token, id).ok()? == name).then_some(())
    })?;
    Ok(changed.elapsed())
}

fn get(cp: &ControlPlane, namespace: &str, name: &str) -> Option<Value> {
    cp.pet(namespace, name).ok()
}

fn wait_ready(cp: &ControlPlane, namespace: &str, name: &str) -> fixtures::Result<Pet> {
    typed::wait_pet(cp, namespace, name, TIMEOUT, "Ready", |pet| {
        is_ready(pet).then(|| pet.clone())
    })
}

fn status_id(pet: &Pet) -> String {
    typed::id(pet).unwrap_or_default().to_owned()
}

/// `status.store`, when set.
fn status_store(pet: &Pet) -> Option<&str> {
    pet.status.as_ref()?.store.as_deref()
}

/// The Pet's record ID, once its `status.store` is asserted to name `store`.
#[track_caller]
fn id_in(pet: &Pet, store: &str) -> String {
    assert_eq!(status_store(pet), Some(store), "{}", typed::shown(pet));
    status_id(pet)
}

/// The operator's `change_feed_stores{state}`.
fn feeds_in(operator: &Operator, state: &str) -> f64 {
    operator_series(
        operator,
        "petstore_operator_change_feed_stores",
        &format!("state=\"{state}\""),
    )
}

/// The operator's `change_feed_changes_total{verdict}`.
fn feed_changes(operator: &Operator, verdict: &str) -> f64 {
    operator_series(
        operator,
        "petstore_operator_change_feed_changes_total",
        &format!("verdict=\"{verdict}\""),
    )
}

/// The sum of the operator's series `name` with `labels`, or -1 (no
/// count) while its metrics cannot be read.
fn operator_series(operator: &Operator, name: &str, labels: &str) -> f64 {
    operator.metrics().map_or(-1.0, |scrape| {
        fixtures::http::sum_series(&scrape, name, labels)
    })
}

#[test]
fn every_stores_feed_is_followed_and_each_holds_only_its_own_pets() -> fixtures::Result<()> {
    let env = Env::start(Storage::Memory)?;
    let cp = &env.cp;
    let issuer = cp.token_issuer_flag()?;
    let store_a = tenancy_store(cp, &issuer, "store-a", true)?;
    let mut store_b = tenancy_store(cp, &issuer, "store-b", true)?;
    let store_c = tenancy_store(cp, &issuer, "store-c", false)?;
    for namespace in ["team-a", "team-b", "team-c"] {
        cp.ensure_namespace(namespace)?;
        cp.apply(&format!(
            "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: petstore-tenant\n  namespace: {namespace}\n"
        ))?;
    }
    let team_a = cp.tenant_token("team-a", "store-a")?;
    let team_b = cp.tenant_token("team-b", "store-b")?;
    // A record of team-a's in A that no Pet owns; a Pet of B names its ID.
    let added = grpcurl_as(
        &store_a,
        &team_a,
        "AddPets",
        r#"{"pets":[{"name":"Stray","type":"PTFeline","birthday":{"year":2019,"month":5,"day":6}}]}"#,
    )?;
    let stray = fixtures::petstore::added_id(&added)
        .unwrap_or_default()
        .to_owned();
    assert!(!stray.is_empty(), "AddPets answered no ID: {added:?}");
    let stores = [
        format!(
            "apiVersion: petstore.example.com/v1\nkind: PetStore\nmetadata:\n  name: default\n  namespace: team-a\nspec:\n  address: http://{}\n  audience: store-a\n",
            store_a.addr
        ),
        format!(
            "apiVersion: petstore.example.com/v1\nkind: ClusterPetStore\nmetadata:\n  name: b\nspec:\n  address: http://{}\n  audience: store-b\n  allowedNamespaces:\n    names: [team-b]\n",
            store_b.addr
        ),
        format!(
            "apiVersion: petstore.example.com/v1\nkind: PetStore\nmetadata:\n  name: default\n  namespace: team-c\nspec:\n  address: http://{}\n  audience: store-c\n",
            store_c.addr
        ),
        // A second object on B's endpoint and audience: it shares B's feed.
        format!(
            "apiVersion: petstore.example.com/v1\nkind: PetStore\nmetadata:\n  name: default\n  namespace: team-b\nspec:\n  address: http://{}\n  audience: store-b\n",
            store_b.addr
        ),
    ];
    cp.apply(&stores.join("---\n"))?;
    let mut options = env.operator_options("store-feeds");
    options.poll_interval = POLL_INTERVAL;
    let operator = env.start_operator_with(&options)?;
    let on_b = Some(("ClusterPetStore", "b"));
    cp.apply(
        &[
            pet("team-a", "rex", None, None),
            pet("team-b", "fido", on_b, None),
            pet("team-b", "watcher", on_b, Some(&stray)),
            pet("team-b", "fido-2", None, None),
            pet("team-c", "tom", None, None),
        ]
        .join("---\n"),
    )?;
    let rex = status_id(&wait_ready(cp, "team-a", "rex")?);
    let fido = id_in(&wait_ready(cp, "team-b", "fido")?, "ClusterPetStore/b");
    let fido_2 = id_in(&wait_ready(cp, "team-b", "fido-2")?, "PetStore/default");
    wait_ready(cp, "team-c", "tom")?;
    // The watcher names a record B does not have (it is A's): held.
    typed::wait_pet(
        cp,
        "team-b",
        "watcher",
        TIMEOUT,
        "held RecordNotFound",
        |pet| (pet.condition("Ready")?.reason == "RecordNotFound").then_some(()),
    )?;

    // A and B are followed; C, which does not name the operator an
    // observer, is refused, and says which flag it needs. The count is of
    // store objects: B's two are live, on one stream.
    wait_for(TIMEOUT, "A and B's two objects followed, C refused", || {
        (feeds_in(&operator, "live") == 3.0 && feeds_in(&operator, "refused") == 1.0).then_some(())
    })?;
    let streams = fixtures::http::sum_series(
        &fixtures::http::scrape(&store_b.metrics_addr)?,
        "petstore_server_watchers",
        "",
    );
    assert_eq!(streams, 1.0, "one feed for B's two store objects");
    let needs = format!(
        "start it with `--observer system:serviceaccount:{OPERATOR_NAMESPACE}:{OPERATOR_ACCOUNT}`"
    );
    assert!(
        operator.log_contains(&needs),
        "the log names the flag C needs"
    );

    // An out-of-band change in B, put back from B's feed.
    let took = put_back_after(&store_b, &team_b, &fido, "fido")?;
    assert!(
        took <= FROM_THE_FEED,
        "B's change put back after {took:?}, not within {FROM_THE_FEED:?}"
    );
    let took = put_back_after(&store_b, &team_b, &fido_2, "fido-2")?;
    assert!(
        took <= FROM_THE_FEED,
        "the change to fido-2 (team-b's default store, on B's feed) put back after {took:?}"
    );

    // A's record that B's watcher names by ID changes: A's feed judges it
    // unrelated, and B is not read for it. Then A's own Pet's record
    // changes and is put back: A's feed, behind the first change, is done
    // with it by then.
    let judged = |verdict: &str| feed_changes(&operator, verdict);
    let (unrelated, drifted) = (judged("unrelated"), judged("drifted"));
    let b_reads = store_b.answered("GetPets")?;
    let watcher_version =
        get(cp, "team-b", "watcher").map(|watcher| watcher["metadata"]["resourceVersion"].clone());
    rename(&store_a, &team_a, &stray, "Stray Cat")?;
    wait_for(TIMEOUT, "A's feed to judge the stray record", || {
        (judged("unrelated") + judged("drifted") > unrelated + drifted).then_some(())
    })?;
    assert_eq!(
        (judged("unrelated"), judged("drifted")),
        (unrelated + 1.0, drifted),
        "the stray record concerns no Pet of A, and no Pet of B may be judged for it"
    );
    let took = put_back_after(&store_a, &team_a, &rex, "rex")?;
    assert!(took <= FROM_THE_FEED, "A's change put back after {took:?}");
    assert_eq!(
        store_b.answered("GetPets")?,
        b_reads,
        "a change in A reconciled a Pet of B"
    );
    assert_eq!(
        get(cp, "team-b", "watcher").map(|watcher| watcher["metadata"]["resourceVersion"].clone()),
        watcher_version,
        "B's watcher was not written"
    );
    assert_eq!(record_name(&store_b, &team_b, &fido)?, "fido");

    // B stops: its feed breaks, A's is still followed, and A's Pets keep
    // reconciling: a change there is put back, a new Pet there is Ready.
    store_b.kill();
    wait_for(TIMEOUT, "B's feed broken, A's still live", || {
        (feeds_in(&operator, "broken") == 2.0 && feeds_in(&operator, "live") == 1.0).then_some(())
    })?;
    let took = put_back_after(&store_a, &team_a, &rex, "rex")?;
    assert!(
        took <= FROM_THE_FEED,
        "A's change put back after {took:?} with B down"
    );
    let applied = Instant::now();
    cp.apply(&pet("team-a", "rex-2", None, None))?;
    let rex_2 = wait_ready(cp, "team-a", "rex-2")?;
    let took = applied.elapsed();
    assert!(
        took <= READY_WITHIN,
        "rex-2 Ready after {took:?} with B down"
    );
    let rex_2 = id_in(&rex_2, "PetStore/default");
    assert_eq!(record_name(&store_a, &team_a, &rex_2)?, "rex-2");
    Ok(())
}
