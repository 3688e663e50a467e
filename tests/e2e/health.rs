//! Health as GitOps tools read it, judged by kstatus itself (the library
//! behind Flux's health checks and the conventions `kubectl wait` follows)
//! on Pets read from the real API server:
//!
//! - 1,000 update races: a spec edit, the Pet as the edit's answer shows
//!   it, read again at once and on until it settles. kstatus says Current
//!   only for a generation whose Ready the operator has written, and every
//!   edit's own answer reads InProgress. With the store down, edits read
//!   InProgress (`Reconciling`) for as long as it lasts.
//! - Each reason a Pet stalls on reads as Failed, InvalidSpec included (a
//!   Pet stored under a CRD schema looser than the store, as a hand-edited
//!   CRD allows, which the store refuses) and `HandedOver` (a record
//!   handed to another installation); a paused Pet does not.
//! - Argo CD's health check (config/health/argocd, run by gopher-lua as
//!   Argo CD runs it) and Flux's healthCheckExprs (config/health/flux, by
//!   cel-go as Flux evaluates them) on Pets captured in each state:
//!   Healthy, Progressing (an edit not yet reconciled, and `Reconciling`
//!   with the store down), Degraded, Suspended (paused, a plan waiting for
//!   approval, and `RecordDiffers` in Observe). The committed test data
//!   and its expectations hold for the live captures too.

use std::time::{Duration, Instant};

use fixtures::env::pet_manifest;
use fixtures::health::{argocd, flux, kstatus};
use fixtures::{Env, Storage, wait_for};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use petstore_operator::crd::Pet;
use serde_json::{Value, json};

use crate::typed::{self, wait_pet_served};

const RACERS: usize = 10;
const RACES: usize = 1_000;
/// Edits made while the store is down.
const OUTAGE_EDITS: usize = 5;
const TIMEOUT: Duration = Duration::from_secs(60);
const EXTERNAL_ID: &str = "petstore.example.com/external-id";
const PAUSED: &str = "petstore.example.com/paused";
const HAND_OVER_TO: &str = "petstore.example.com/hand-over-to";

type Error = Box<dyn std::error::Error + Send + Sync>;

fn spec(pet_name: &str) -> String {
    format!(" {{name: {pet_name}, type: dog, birthday: \"2021-04-01\"}}")
}

async fn pets_api(env: &Env) -> Result<Api<DynamicObject>, Error> {
    let gvk = GroupVersionKind::gvk("petstore.example.com", "v1", "Pet");
    Ok(Api::namespaced_with(
        crate::admin_client(env).await?,
        "default",
        &ApiResource::from_gvk(&gvk),
    ))
}

/// The operator has finished this generation: Ready for it, and
/// `status.observedGeneration` naming it.
fn finished(pet: &Pet) -> bool {
    let generation = pet.metadata.generation;
    typed::observed_generation(pet) == generation
        && pet
            .condition("Ready")
            .is_some_and(|c| c.status == "True" && c.observed_generation == generation)
}

/// Reconciling=True because the store is down, for the current generation.
fn reconciling(pet: &Pet) -> bool {
    pet.condition("Reconciling").is_some_and(|c| {
        c.status == "True"
            && c.reason == "StoreUnavailable"
            && c.observed_generation == pet.metadata.generation
    })
}

/// An object as served, typed for the checks on its status.
fn typed_of(object: &Value) -> Result<Pet, Error> {
    Ok(typed::from_value(object.clone())?)
}

/// One edit: the edit's answer, then reads until the operator has finished
/// it (or `settle` passes). Every object, in order.
async fn race(
    api: &Api<DynamicObject>,
    name: &str,
    pet_name: &str,
    settle: Duration,
    until: impl Fn(&Pet) -> bool,
) -> Result<Vec<Value>, Error> {
    let patch = json!({"spec": {"name": pet_name}});
    let answer = api
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let mut seen = vec![serde_json::to_value(&answer)?];
    let deadline = Instant::now() + settle;
    loop {
        let pet = serde_json::to_value(api.get(name).await?)?;
        let done = until(&typed_of(&pet)?);
        seen.push(pet);
        if done || Instant::now() > deadline {
            return Ok(seen);
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[test]
fn kstatus_says_current_only_once_the_operator_has_finished_the_generation() -> Result<(), Error> {
    let env = Env::start(Storage::Durable)?;
    let _operator = env.start_operator("health")?;
    let names: Vec<String> = (0..RACERS).map(|i| format!("racer-{i}")).collect();
    for name in &names {
        env.cp.apply(&pet_manifest(name, &[], &spec("Start")))?;
    }
    for name in &names {
        env.wait_ready("default", name, TIMEOUT)?;
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let api = rt.block_on(pets_api(&env))?;

    // The races, RACERS Pets at a time.
    let races: Vec<Vec<Value>> = rt.block_on(async {
        let mut all = Vec::with_capacity(RACES);
        for round in 0..RACES / RACERS {
            let edits = names.iter().map(|name| {
                let pet_name = format!("Pet{round}");
                let api = &api;
                async move { race(api, name, &pet_name, TIMEOUT, finished).await }
            });
            for seen in futures::future::join_all(edits).await {
                all.push(seen?);
            }
        }
        Ok::<_, Error>(all)
    })?;
    assert_eq!(races.len(), RACES);
    let objects: Vec<Value> = races.iter().flatten().cloned().collect();
    let verdicts = kstatus(&objects)?;
    let mut current = 0;
    for (object, (status, message)) in objects.iter().zip(&verdicts) {
        if status == "Current" {
            current += 1;
            assert!(
                finished(&typed_of(object)?),
                "kstatus says Current ({message}) for a generation the operator has not finished: {object}"
            );
        }
    }
    // Each edit's own answer carries the new generation and the old status.
    let mut at = 0;
    for seen in &races {
        let (status, message) = &verdicts[at];
        assert_eq!(status, "InProgress", "the edit's answer: {message}");
        let (status, message) = &verdicts[at + seen.len() - 1];
        assert_eq!(status, "Current", "once settled: {message}");
        at += seen.len();
    }
    eprintln!(
        "{RACES} races, {} objects read, {current} Current, every one finished",
        objects.len()
    );

    // The store down: each edit reads InProgress, with Reconciling, until
    // it comes back.
    let mut env = env;
    env.store.kill();
    let outage: Vec<Vec<Value>> = rt.block_on(async {
        let mut all = Vec::new();
        for edit in 0..OUTAGE_EDITS {
            let pet_name = format!("Down{edit}");
            all.push(race(&api, &names[0], &pet_name, TIMEOUT, reconciling).await?);
        }
        Ok::<_, Error>(all)
    })?;
    let objects: Vec<Value> = outage.iter().flatten().cloned().collect();
    for (object, (status, message)) in objects.iter().zip(kstatus(&objects)?) {
        assert_eq!(status, "InProgress", "store down: {message}: {object}");
    }
    for seen in &outage {
        let last = seen.last().ok_or("no read")?;
        assert!(
            typed_of(last)?
                .condition("Reconciling")
                .is_some_and(|c| c.status == "True"),
            "Reconciling while the store is down: {last}"
        );
    }
    env.store.restart(Storage::Durable)?;
    let what = "finished once the store is back";
    let back = wait_pet_served(&env.cp, "default", &names[0], TIMEOUT, what, finished)?;
    assert!(
        typed_of(&back)?.condition("Reconciling").is_none(),
        "{back}"
    );
    assert_eq!(kstatus(&[back])?[0].0, "Current");
    Ok(())
}

/// Waits until the Pet's Synced reason is `reason`; returns the Pet.
fn wait_synced(env: &Env, name: &str, reason: &str) -> fixtures::Result<Value> {
    let what = format!("Synced {reason}");
    wait_pet_served(&env.cp, "default", name, TIMEOUT, &what, |pet| {
        pet.condition("Synced").is_some_and(|c| c.reason == reason)
    })
}

#[test]
fn kstatus_reads_each_stalled_reason_as_failed() -> Result<(), Error> {
    let env = Env::start(Storage::Durable)?;
    let _operator = env.start_operator("health")?;
    // Owned by another Pet, and a Pet that owns a record and names another.
    env.cp.apply(&pet_manifest("owner", &[], &spec("Owner")))?;
    let owned = env.wait_ready("default", "owner", TIMEOUT)?;
    let unowned = env.store.add_unowned("Loose")?;
    env.cp
        .apply(&pet_manifest("holder", &[], &spec("Holder")))?;
    env.wait_ready("default", "holder", TIMEOUT)?;
    // Handed to another installation: this Pet writes its record no more.
    env.cp
        .apply(&pet_manifest("handed", &[], &spec("Handed")))?;
    env.wait_ready("default", "handed", TIMEOUT)?;
    env.cp
        .annotate_pet("default", "handed", &[&format!("{HAND_OVER_TO}=green")])?;
    let cases = [
        (
            "named-missing",
            vec![(
                EXTERNAL_ID,
                "0b3a5f1e-7c2d-4e8f-9a6b-1c2d3e4f5a6b".to_owned(),
            )],
            "RecordNotFound",
        ),
        (
            "named-owned",
            vec![(EXTERNAL_ID, owned)],
            "RecordOwnedElsewhere",
        ),
        (
            "typo",
            vec![(PAUSED, "yes".to_owned())],
            "InvalidAnnotation",
        ),
    ];
    for (name, annotations, _) in &cases {
        let annotations: Vec<(&str, &str)> =
            annotations.iter().map(|(k, v)| (*k, v.as_str())).collect();
        env.cp
            .apply(&pet_manifest(name, &annotations, &spec("Stuck")))?;
    }
    env.cp
        .annotate_pet("default", "holder", &[&format!("{EXTERNAL_ID}={unowned}")])?;
    // The store refuses a name longer than 128 characters, and so does the
    // CRD. With its limit taken out (as a hand-edited or older CRD might
    // be), the API server stores such a Pet and the store refuses it.
    env.cp.kubectl(&[
        "patch",
        "crd",
        "pets.petstore.example.com",
        "--type=json",
        "-p",
        r#"[{"op":"remove","path":"/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/name/maxLength"}]"#,
    ])?;
    let too_long = "N".repeat(129);
    wait_for(TIMEOUT, "the CRD to admit a 129-character name", || {
        env.cp
            .apply(&pet_manifest("too-long", &[], &spec(&too_long)))
            .ok()
    })?;
    let mut stalled: Vec<(&str, Value)> = Vec::new();
    let refused = wait_synced(&env, "too-long", "InvalidSpec")?;
    let message = typed_of(&refused)?
        .condition("Synced")
        .map(|c| c.message.clone());
    assert!(
        message.as_deref().is_some_and(|m| m.contains("name")),
        "the store's refusal names the field: {refused}"
    );
    stalled.push(("InvalidSpec", refused));
    for (name, _, reason) in &cases {
        stalled.push((reason, wait_synced(&env, name, reason)?));
    }
    stalled.push((
        "AdoptionConflict",
        wait_synced(&env, "holder", "AdoptionConflict")?,
    ));
    stalled.push(("HandedOver", wait_synced(&env, "handed", "HandedOver")?));
    let objects: Vec<Value> = stalled.iter().map(|(_, pet)| pet.clone()).collect();
    for ((reason, pet), (status, message)) in stalled.iter().zip(kstatus(&objects)?) {
        assert_eq!(status, "Failed", "{reason}: {message}: {pet}");
        assert!(
            typed_of(pet)?
                .condition("Stalled")
                .is_some_and(|c| c.reason == *reason),
            "{pet}"
        );
    }

    // A store without the extension RPCs (the book's): the operator,
    // pointed at it alone, says so, and waits for a person.
    drop(_operator);
    let (_legacy, _on_legacy) = env.start_operator_on_legacy_store("on-the-books-store")?;
    env.cp.apply(&pet_manifest("bookish", &[], &spec("Book")))?;
    let bookish = wait_synced(&env, "bookish", "StoreLacksExtensions")?;
    let (status, message) = kstatus(std::slice::from_ref(&bookish))?.remove(0);
    assert_eq!(
        status, "Failed",
        "StoreLacksExtensions: {message}: {bookish}"
    );

    // Paused on purpose is not a failure.
    env.cp
        .apply(&pet_manifest("resting", &[(PAUSED, "true")], &spec("Rest")))?;
    let paused = wait_synced(&env, "resting", "ReconcilePaused")?;
    let (status, message) = kstatus(std::slice::from_ref(&paused))?.remove(0);
    assert_ne!(status, "Failed", "{message}: {paused}");
    Ok(())
}

/// The states, by the test data file each is captured into, and what Flux
/// makes of each.
const STATES: [(&str, &str); 7] = [
    ("healthy", "Current"),
    ("progressing", "InProgress"),
    ("degraded", "Failed"),
    ("suspended-paused", "InProgress"),
    ("suspended-plan", "InProgress"),
    ("suspended-observe", "InProgress"),
    ("progressing-reconciling", "InProgress"),
];

/// What an API server adds that says nothing about health and changes on
/// every run.
fn captured(mut pet: Value) -> Value {
    if let Some(metadata) = pet["metadata"].as_object_mut() {
        for noise in [
            "managedFields",
            "uid",
            "resourceVersion",
            "creationTimestamp",
        ] {
            metadata.remove(noise);
        }
        if let Some(annotations) = metadata
            .get_mut("annotations")
            .and_then(Value::as_object_mut)
        {
            annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
        }
    }
    pet
}

#[test]
fn argo_cd_and_flux_read_each_state_right() -> Result<(), Error> {
    let mut env = Env::start(Storage::Durable)?;
    let _operator = env.start_operator("health")?;
    env.cp.apply(&pet_manifest("healthy", &[], &spec("Fine")))?;
    env.cp
        .apply(&pet_manifest("progressing", &[], &spec("Busy")))?;
    env.cp.apply(&pet_manifest(
        "degraded",
        &[(EXTERNAL_ID, "0b3a5f1e-7c2d-4e8f-9a6b-1c2d3e4f5a6b")],
        &spec("Lost"),
    ))?;
    env.cp.apply(&pet_manifest(
        "suspended-paused",
        &[(PAUSED, "true")],
        &spec("Rest"),
    ))?;
    env.cp.apply(&pet_manifest(
        "suspended-plan",
        &[],
        " {name: Wait, type: dog, birthday: \"2021-04-01\", changePolicy: Approve}",
    ))?;
    // Observed, naming a record that differs from its spec.
    let differs = env.store.add_unowned("Elsewhere")?;
    env.cp.apply(&pet_manifest(
        "suspended-observe",
        &[(EXTERNAL_ID, &differs)],
        " {name: Here, type: cat, birthday: \"2019-05-06\", changePolicy: Observe}",
    ))?;
    env.cp
        .apply(&pet_manifest("progressing-reconciling", &[], &spec("Calm")))?;
    env.wait_ready("default", "healthy", TIMEOUT)?;
    let healthy = captured(env.pet("default", "healthy")?);
    env.wait_ready("default", "progressing", TIMEOUT)?;
    // An edit's answer: the new generation, the old status.
    let edited = env.cp.patch_pet(
        "default",
        "progressing",
        &[
            "--type=merge",
            "-p",
            r#"{"spec":{"name":"Busier"}}"#,
            "-o",
            "json",
        ],
    )?;
    let progressing = captured(serde_json::from_str(&edited)?);
    let degraded = captured(wait_synced(&env, "degraded", "RecordNotFound")?);
    let paused = captured(wait_synced(&env, "suspended-paused", "ReconcilePaused")?);
    let plan = captured(wait_synced(&env, "suspended-plan", "PlanPending")?);
    let observed = captured(wait_synced(&env, "suspended-observe", "RecordDiffers")?);
    // Retrying: the store down, an edit waits with Reconciling.
    env.wait_ready("default", "progressing-reconciling", TIMEOUT)?;
    env.store.kill();
    env.rename("default", "progressing-reconciling", "Restless")?;
    let reconciling = captured(wait_pet_served(
        &env.cp,
        "default",
        "progressing-reconciling",
        TIMEOUT,
        "Reconciling with the store down",
        reconciling,
    )?);
    let live = [
        healthy,
        progressing,
        degraded,
        paused,
        plan,
        observed,
        reconciling,
    ];

    let committed = fixtures::repo_root().join("config/health/argocd/petstore.example.com/Pet");
    if let Some(dir) = std::env::var_os("PETSTORE_CAPTURE_HEALTH") {
        // Refreshes the committed test data from this run.
        for ((state, _), pet) in STATES.iter().zip(&live) {
            let path = std::path::Path::new(&dir).join(format!("{state}.yaml"));
            std::fs::write(path, serde_json::to_string_pretty(pet)? + "\n")?;
        }
    }
    // Argo CD: the committed suite, then the same expectations on the live
    // captures.
    let report = argocd(&committed)?;
    assert_eq!(report.lines().count(), STATES.len(), "{report}");
    let scratch = tempfile::tempdir()?;
    std::fs::copy(
        committed.join("health.lua"),
        scratch.path().join("health.lua"),
    )?;
    std::fs::copy(
        committed.join("health_test.yaml"),
        scratch.path().join("health_test.yaml"),
    )?;
    std::fs::create_dir(scratch.path().join("testdata"))?;
    for ((state, _), pet) in STATES.iter().zip(&live) {
        let path = scratch.path().join(format!("testdata/{state}.yaml"));
        std::fs::write(path, serde_json::to_string_pretty(pet)?)?;
    }
    let report = argocd(scratch.path())?;
    assert_eq!(report.lines().count(), STATES.len(), "{report}");
    for (state, _) in STATES {
        let status = match state.split('-').next() {
            Some("healthy") => "Healthy",
            Some("progressing") => "Progressing",
            Some("degraded") => "Degraded",
            _ => "Suspended",
        };
        assert!(
            report.contains(&format!("testdata/{state}.yaml\t{status}\t")),
            "{state}: {report}"
        );
    }

    // Flux, on the same objects.
    let exprs = fixtures::repo_root().join("config/health/flux/pet.yaml");
    let verdicts = flux(&exprs, &live)?;
    let expected: Vec<&str> = STATES.iter().map(|(_, flux)| *flux).collect();
    assert_eq!(verdicts, expected);
    Ok(())
}
