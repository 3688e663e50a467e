//! Scenarios 4, 5, 7 and 9: store restarts, an operator killed at the worst
//! moment, an unreachable store, and leader election.

use std::time::Duration;

use fixtures::{Env, Storage, repo_root, wait_for};
use serde_json::Value;

use crate::typed::{self};

const TIMEOUT: Duration = Duration::from_secs(60);

fn ids(pets: &[Value]) -> Vec<String> {
    let mut ids: Vec<String> = pets
        .iter()
        .filter_map(|p| p["id"].as_str().map(str::to_owned))
        .collect();
    ids.sort();
    ids
}

/// The store's records are exactly those with these IDs.
#[track_caller]
fn assert_store_holds(env: &Env, mut expected: Vec<String>) -> fixtures::Result<()> {
    expected.sort();
    assert_eq!(ids(&env.store_pets()?), expected);
    Ok(())
}

#[test]
fn memory_store_restart_recreates_every_pet_with_new_ids() -> fixtures::Result<()> {
    let mut env = Env::start(Storage::Memory)?;
    let _operator = env.start_operator("operator")?;
    let (thor, tron) = env.apply_samples()?;

    env.store.restart(Storage::Memory)?;
    // Memory storage lost everything. The operator follows the feed, which
    // breaks with the restart, and may have made both records again before
    // this reads: so the check is that neither old record is there.
    let after_restart = ids(&env.store_pets()?);
    assert!(
        !after_restart.contains(&thor) && !after_restart.contains(&tron),
        "memory storage lost everything: {after_restart:?}"
    );

    // The drift poll notices and recreates both, recording the new IDs.
    let (new_thor, new_tron) = wait_for(TIMEOUT, "new IDs in status", || {
        let a = typed::pet(&env.cp, "default", "pet-sample1").ok()?;
        let b = typed::pet(&env.cp, "default", "pet-sample2").ok()?;
        let a = typed::id(&a)?.to_owned();
        let b = typed::id(&b)?.to_owned();
        (a != thor && b != tron).then_some((a, b))
    })?;
    env.wait_ready("default", "pet-sample1", TIMEOUT)?;
    env.wait_ready("default", "pet-sample2", TIMEOUT)?;
    assert_store_holds(&env, vec![new_thor, new_tron])?;
    env.wait_event("Recreated/pet-sample1", TIMEOUT)?;
    env.wait_event("Recreated/pet-sample2", TIMEOUT)?;
    Ok(())
}

#[test]
fn durable_store_restart_changes_nothing() -> fixtures::Result<()> {
    let mut env = Env::start(Storage::Durable)?;
    let operator = env.start_operator("operator")?;
    let (thor, tron) = env.apply_samples()?;
    let before = env.store_pets()?;

    env.store.kill();
    env.store.restart(Storage::Durable)?;
    // Several poll intervals (2s each) pass over the restarted store.
    std::thread::sleep(Duration::from_secs(7));
    assert_eq!(env.store_pets()?, before);
    assert_eq!(env.wait_ready("default", "pet-sample1", TIMEOUT)?, thor);
    assert_eq!(env.wait_ready("default", "pet-sample2", TIMEOUT)?, tron);
    assert!(!env.event_reasons()?.contains("Recreated"));
    let metrics = operator.metrics()?;
    assert!(!metrics.contains("action=\"recreate\""), "{metrics}");
    assert!(
        !metrics.contains("action=\"update\""),
        "no store writes: {metrics}"
    );
    Ok(())
}

#[test]
fn operator_killed_between_create_and_status_leaves_no_duplicate() -> fixtures::Result<()> {
    let env = Env::start(Storage::Durable)?;
    let mut options = env.operator_options("doomed");
    options.fault = Some("hang-after-create");
    let mut doomed = env.start_operator_with(&options)?;

    let samples = repo_root().join("config/samples/pet-sample1.yaml");
    env.cp
        .kubectl(&["apply", "-f", &samples.to_string_lossy()])?;
    wait_for(TIMEOUT, "the operator to create and hang", || {
        doomed
            .log_contains("fault injection: hanging after create")
            .then_some(())
    })?;
    let created = env.store_pets()?;
    assert_eq!(created.len(), 1, "the record exists");
    let pet = typed::pet(&env.cp, "default", "pet-sample1")?;
    assert!(
        typed::id(&pet).is_none(),
        "but its ID never reached status: {}",
        typed::shown(&pet)
    );

    doomed.kill(); // kill -9
    let _successor = env.start_operator("successor")?;
    let id = env.wait_ready("default", "pet-sample1", TIMEOUT)?;
    let after = env.store_pets()?;
    assert_eq!(after.len(), 1, "no duplicate: {after:?}");
    assert_eq!(after[0]["id"], id.as_str(), "the first record was adopted");
    assert_eq!(created[0]["id"], id.as_str());
    env.wait_event("Adopted/pet-sample1", TIMEOUT)?;
    Ok(())
}

#[test]
fn unreachable_store_is_reported_then_converges() -> fixtures::Result<()> {
    let mut env = Env::start(Storage::Durable)?;
    let _operator = env.start_operator("operator")?;
    env.store.kill();

    let samples = repo_root().join("config/samples");
    env.cp
        .kubectl(&["apply", "-k", &samples.to_string_lossy()])?;
    for name in ["pet-sample1", "pet-sample2"] {
        let what = "StoreUnavailable conditions";
        let message = typed::wait_pet(&env.cp, "default", name, TIMEOUT, what, |pet| {
            let ready = pet.condition("Ready")?;
            let synced = pet.condition("Synced")?;
            (ready.status == "False"
                && ready.reason == "StoreUnavailable"
                && synced.status == "False"
                && synced.reason == "StoreUnavailable")
                .then(|| ready.message.clone())
        })?;
        assert!(message.contains("cannot reach the pet store"), "{message}");
    }
    // Events are written beside the status, not before it.
    env.wait_event("StoreUnavailable/pet-sample1", TIMEOUT)?;

    env.store.restart(Storage::Durable)?;
    let thor = env.wait_ready("default", "pet-sample1", TIMEOUT)?;
    let tron = env.wait_ready("default", "pet-sample2", TIMEOUT)?;
    assert_store_holds(&env, vec![thor, tron])?;
    Ok(())
}

#[test]
fn only_the_leader_reconciles_and_killing_it_hands_over() -> fixtures::Result<()> {
    let env = Env::start(Storage::Durable)?;
    let mut first = env.start_operator("replica-1")?;
    wait_for(TIMEOUT, "replica-1 to lead", || {
        first.log_contains("became leader").then_some(())
    })?;
    let second = env.start_operator("replica-2")?;
    wait_for(TIMEOUT, "replica-2 to stand by", || {
        second.log_contains("waiting for leadership").then_some(())
    })?;
    env.apply_samples()?;

    assert_eq!(env.lease_holder()?, "replica-1");
    assert!(!second.log_contains("became leader"));
    let standby = second.metrics()?;
    assert!(
        standby.contains("petstore_operator_reconciles_total 0"),
        "{standby}"
    );
    assert!(standby.contains("petstore_operator_leader 0"), "{standby}");
    assert!(first.metrics()?.contains("petstore_operator_leader 1"));

    first.kill(); // kill -9: no graceful release, the lease must expire
    wait_for(TIMEOUT, "replica-2 to take over", || {
        second.log_contains("became leader").then_some(())
    })?;
    assert_eq!(env.lease_holder()?, "replica-2");
    env.rename("default", "pet-sample2", "Tronald")?;
    wait_for(TIMEOUT, "the new leader to apply the rename", || {
        env.store_pets()
            .ok()?
            .iter()
            .any(|p| p["name"] == "Tronald")
            .then_some(())
    })?;
    assert_eq!(env.store_pets()?.len(), 2);
    Ok(())
}
