//! The drift-storm brake on the real API server and store: a store whose
//! records change all at once (as a restore from an old backup changes
//! them) gets no write from the operator until each plan is approved, and
//! once the storm is over, a lone drift is written back by itself again.

use std::time::Duration;

use fixtures::env::pet_manifest;
use fixtures::{Env, Operator, Storage, wait_for};
use petstore_operator::crd::{Pet, PlanStatus};
use serde_json::{Value, json};

use crate::typed::{self};

const PETS: usize = 40;
/// Records the "restore" changes: more than the brake's minimum below.
const RESTORED: usize = 30;
const STORM_MIN: &str = "20";
/// Short, so that the storm's end is seen within the test.
const STORM_WINDOW: &str = "5s";
const TIMEOUT: Duration = Duration::from_secs(60);
const APPROVE_PLAN: &str = "petstore.example.com/approve-plan";

fn name(i: usize) -> String {
    format!("storm-{i}")
}

fn synced_reason(pet: &Pet) -> String {
    pet.condition("Synced")
        .map(|c| c.reason.clone())
        .unwrap_or_default()
}

fn plan(pet: &Pet) -> Option<&PlanStatus> {
    pet.status.as_ref()?.plan.as_ref()
}

/// Waits until the Pet `name(i)` is held in the storm and `accept` passes.
fn wait_held(env: &Env, i: usize, accept: impl Fn(&Pet) -> bool) -> fixtures::Result<Pet> {
    typed::wait_pet(
        &env.cp,
        "default",
        &name(i),
        TIMEOUT,
        "held in the storm",
        |pet| (synced_reason(pet) == "DriftStorm" && accept(pet)).then(|| pet.clone()),
    )
}

/// Renames the records of these Pets in one `UpdatePets` call, as a
/// restore of the store's data would change them all at once.
fn rename_records(env: &Env, ids: &[String], to: &str) -> fixtures::Result<()> {
    let pets: Vec<Value> = ids
        .iter()
        .map(|id| {
            json!({"id": id, "name": to, "type": 1,
                   "birthday": {"year": 2020, "month": 1, "day": 1}})
        })
        .collect();
    env.store.grpcurl(
        "petstore.PetStore/UpdatePets",
        &json!({ "pets": pets }).to_string(),
    )?;
    Ok(())
}

fn record_name(env: &Env, id: &str) -> fixtures::Result<String> {
    let pets = env.store.all_pets()?;
    Ok(pets
        .iter()
        .find(|pet| pet["id"] == id)
        .and_then(|pet| pet["name"].as_str())
        .unwrap_or_default()
        .to_owned())
}

/// Approves the plan with this hash on Pet `name`, as a person does.
fn approve(env: &Env, name: &str, hash: &str) -> fixtures::Result<()> {
    env.cp
        .annotate_pet("default", name, &[&format!("{APPROVE_PLAN}={hash}")])?;
    Ok(())
}

/// A memory store, an operator with the storm's minimum at [`STORM_MIN`]
/// and its window at [`STORM_WINDOW`], and `pets` Pets Ready: their IDs.
fn storm_ready(pets: usize) -> fixtures::Result<(Env, Operator, Vec<String>)> {
    let env = Env::start(Storage::Memory)?;
    let mut options = env.operator_options("operator");
    options.extra_args.extend([
        format!("--drift-storm-min={STORM_MIN}").into(),
        format!("--drift-storm-window={STORM_WINDOW}").into(),
    ]);
    let operator = env.start_operator_with(&options)?;
    let manifests: Vec<String> = (0..pets)
        .map(|i| {
            pet_manifest(
                &name(i),
                &[],
                " {name: Rex, type: dog, birthday: \"2020-01-01\"}",
            )
        })
        .collect();
    env.cp.apply(&manifests.join("---\n"))?;
    let ids = (0..pets)
        .map(|i| env.wait_ready("default", &name(i), TIMEOUT))
        .collect::<fixtures::Result<_>>()?;
    Ok((env, operator, ids))
}

#[test]
fn a_store_rewritten_at_once_is_not_written_back_until_each_plan_is_approved()
-> fixtures::Result<()> {
    let (env, operator, ids) = storm_ready(PETS)?;
    let writes_before = env.store.writes()?;

    // The "restore": 30 of the 40 records renamed in one call.
    let restored = &ids[..RESTORED];
    rename_records(&env, restored, "Old")?;

    // Each drifted Pet is held with its plan; none is written back.
    let held: Vec<Pet> = (0..RESTORED)
        .map(|i| wait_held(&env, i, |pet| plan(pet).is_some()))
        .collect::<fixtures::Result<_>>()?;
    let message = held[0]
        .condition("Synced")
        .map_or("", |c| c.message.as_str());
    assert!(
        message.contains("drifted at once") && message.contains(APPROVE_PLAN),
        "the hold says why and how to let it: {message}"
    );
    let scrape = operator.metrics()?;
    assert_eq!(
        fixtures::http::sum_series(&scrape, "petstore_operator_drift_storm_stores", ""),
        1.0,
        "the store is shown braking"
    );
    // Every held Pet's reconcile has run (its plan is shown): the only
    // write since is the test's own rename.
    assert_eq!(
        env.store.writes()? - writes_before,
        1.0,
        "the operator wrote to a store in a drift storm"
    );
    for id in restored {
        assert_eq!(
            record_name(&env, id)?,
            "Old",
            "record {id} was written back"
        );
    }
    env.wait_event(&format!("DriftStorm/{}", name(0)), TIMEOUT)?;

    // Approving one Pet's plan writes exactly that plan.
    let hash = plan(&held[0]).map(|p| p.hash.clone()).unwrap_or_default();
    approve(&env, &name(0), &hash)?;
    env.wait_ready("default", &name(0), TIMEOUT)?;
    assert_eq!(record_name(&env, &restored[0])?, "Rex");
    assert_eq!(
        env.store.writes()? - writes_before,
        2.0,
        "the approval wrote its one update"
    );

    // A window with no new drift ends the storm; the Pets held in it stay
    // held until approved, and a lone drift is written back by itself.
    wait_for(TIMEOUT, "the storm to end", || {
        let scrape = operator.metrics().ok()?;
        (fixtures::http::sum_series(&scrape, "petstore_operator_drift_storm_stores", "") == 0.0)
            .then_some(())
    })?;
    let lone = &ids[PETS - 1];
    rename_records(&env, std::slice::from_ref(lone), "Lone")?;
    wait_for(TIMEOUT, "the lone drift written back", || {
        (record_name(&env, lone).ok()? == "Rex").then_some(())
    })?;
    let still_held = typed::pet(&env.cp, "default", &name(1))?;
    assert_eq!(
        synced_reason(&still_held),
        "DriftStorm",
        "{}",
        typed::shown(&still_held)
    );
    assert_eq!(record_name(&env, &restored[1])?, "Old");

    // The rest approved at once, as each shows its plan: exactly one
    // update each, and nothing else.
    let approved = env.kubectl_petstore(&[
        "approve".into(),
        "--all".into(),
        "--reason".into(),
        "DriftStorm".into(),
        "-n".into(),
        "default".into(),
    ])?;
    assert_eq!(approved.code, Some(0), "{}", approved.stderr);
    assert_eq!(
        approved.stdout.lines().count(),
        RESTORED - 1,
        "{}",
        approved.stdout
    );
    for i in 1..RESTORED {
        env.wait_ready("default", &name(i), TIMEOUT)?;
    }
    for id in restored {
        assert_eq!(record_name(&env, id)?, "Rex", "record {id}");
    }
    // The rename, one approval, the lone drift and its correction, and one
    // update for each of the rest.
    assert_eq!(
        env.store.writes()? - writes_before,
        (4 + RESTORED - 1) as f64,
        "the approvals wrote what their plans showed, once each"
    );
    Ok(())
}

/// A store that comes back empty (a memory store restarted, a database
/// wiped) is a storm at once: no record is made again until a plan is
/// approved.
#[test]
fn a_store_come_back_empty_gets_no_record_made_again_until_a_plan_is_approved()
-> fixtures::Result<()> {
    const EMPTIED: usize = 25;
    let (mut env, _operator, _) = storm_ready(EMPTIED)?;

    env.store.restart(Storage::Memory)?;
    let held: Vec<Pet> = (0..EMPTIED)
        .map(|i| wait_held(&env, i, |_| true))
        .collect::<fixtures::Result<_>>()?;
    // Every Pet's reconcile found its record gone and held it: the
    // restarted store was asked for no record.
    assert_eq!(
        env.store.answered("AddPets")?,
        0.0,
        "a record was made again"
    );
    assert!(env.store.all_pets()?.is_empty());
    let shown = plan(&held[0]);
    assert_eq!(
        shown.map(|p| p.summary.as_str()),
        Some("create"),
        "{shown:?}"
    );

    // Approved, that one Pet's record is made again, and only it.
    let hash = shown.map(|p| p.hash.clone()).unwrap_or_default();
    approve(&env, &name(0), &hash)?;
    env.wait_ready("default", &name(0), TIMEOUT)?;
    assert_eq!(env.store.all_pets()?.len(), 1);
    Ok(())
}
