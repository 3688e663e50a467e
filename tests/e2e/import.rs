//! `kubectl petstore import` on the real API server and store: 1,000
//! records made with grpcurl become manifests that, applied, adopt them
//! safely: observed only (no store write at all), then, switched to
//! `Automatic`, one key claim per record and nothing else. Records a live
//! Pet or another installation owns are left out, and a record claimed by
//! someone else between import and apply is held, never overwritten.

use std::time::{Duration, Instant};

use fixtures::env::pet_manifest;
use fixtures::{Env, Storage, THOUSANDS_POLL, wait_for, wait_for_every};
use petstore_operator::crd::Pet;
use serde_json::Value;

use crate::typed::{self, is_ready};

const RECORDS: usize = 1000;
const TIMEOUT: Duration = Duration::from_secs(180);

/// Adds `count` records with grpcurl in one AddPets, as a team that kept
/// pets in the store before Kubernetes would have; their IDs.
fn add_records(env: &Env, count: usize) -> fixtures::Result<Vec<String>> {
    let pets: Vec<String> = (0..count)
        .map(|i| {
            format!(
                r#"{{"name":"Stray {i}","type":"PTFeline","birthday":{{"year":2019,"month":5,"day":{}}}}}"#,
                i % 28 + 1
            )
        })
        .collect();
    let reply = env.store.grpcurl(
        "petstore.PetStore/AddPets",
        &format!(r#"{{"pets":[{}]}}"#, pets.join(",")),
    )?;
    Ok(reply
        .first()
        .and_then(|r| r["ids"].as_array())
        .into_iter()
        .flatten()
        .filter_map(|id| id.as_str().map(str::to_owned))
        .collect())
}

fn writes(env: &Env) -> fixtures::Result<[f64; 4]> {
    Ok([
        env.store.answered("AddPets")?,
        env.store.answered("UpdatePets")?,
        env.store.answered("DeletePets")?,
        env.store.answered("SetIdempotencyKeys")?,
    ])
}

fn pets(env: &Env) -> fixtures::Result<Vec<Pet>> {
    typed::pets(&env.cp, Some("imported"))
}

fn import(env: &Env, extra: &[&str]) -> fixtures::Result<(String, String)> {
    let mut args: Vec<std::ffi::OsString> = ["import", "-n", "imported", "--petstore-addr"]
        .iter()
        .map(Into::into)
        .collect();
    args.push(env.store.addr.clone().into());
    args.extend(extra.iter().map(Into::into));
    let out = env.kubectl_petstore(&args)?;
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    Ok((out.stdout, out.stderr))
}

#[test]
fn imported_records_are_adopted_with_one_key_claim_each_and_nothing_else() -> fixtures::Result<()> {
    let env = Env::start(Storage::Durable)?;
    let _operator = env.start_operator("operator")?;
    env.cp.ensure_namespace("imported")?;
    let ids = add_records(&env, RECORDS)?;
    assert_eq!(ids.len(), RECORDS);
    // Left out: a record a live Pet owns, and one of another installation.
    env.cp.apply(&pet_manifest(
        "managed",
        &[],
        "\n  name: Managed\n  type: dog\n  birthday: \"2021-04-01\"",
    ))?;
    env.wait_ready("default", "managed", TIMEOUT)?;
    env.store.grpcurl(
        "petstore.PetStore/AddPets",
        r#"{"pets":[{"name":"Theirs","type":"PTCanine","birthday":{"year":2020,"month":1,"day":1},"idempotencyKey":"green/some-uid"}]}"#,
    )?;

    let started = Instant::now();
    let (yaml, summary) = import(&env, &[])?;
    let took = started.elapsed();
    eprintln!("import: {RECORDS} records as manifests in {took:?}");
    assert!(
        summary.contains(&format!("{RECORDS} of {} records", RECORDS + 2))
            && summary.contains("1 owned by Pets of this cluster, 1 by other installations"),
        "{summary}"
    );
    assert_eq!(yaml.matches("kind: Pet").count(), RECORDS);
    assert_eq!(yaml.matches("changePolicy: Observe").count(), RECORDS);
    assert_eq!(yaml.matches("deletionPolicy: Orphan").count(), RECORDS);
    // The filters are the store's own: by name, and by type and birthday
    // (the strays are cats born on the 1st to the 28th of May 2019).
    let (one, _) = import(&env, &["--name", "Stray 7"])?;
    assert_eq!(one.matches("kind: Pet").count(), 1, "{one}");
    assert!(one.contains("name: Stray 7"), "{one}");
    let (late, _) = import(&env, &["--type", "cat", "--born-from", "2019-05-28"])?;
    let born_on_the_28th = (0..RECORDS).filter(|i| i % 28 + 1 == 28).count();
    assert_eq!(
        late.matches("kind: Pet").count(),
        born_on_the_28th,
        "{late}"
    );
    let (dogs, _) = import(&env, &["--type", "dog"])?;
    assert_eq!(
        dogs.matches("kind: Pet").count(),
        0,
        "the two dogs are left out"
    );

    // Applied: observed only, so nothing is written, and each Pet shows the
    // claim it would make.
    let before = writes(&env)?;
    env.cp.kubectl_stdin(&["apply", "-f", "-"], &yaml)?;
    wait_for_every(
        THOUSANDS_POLL,
        TIMEOUT,
        "every imported Pet showing its claim",
        || {
            let pets = pets(&env).ok()?;
            (pets.len() == RECORDS
                && pets.iter().all(|pet| {
                    let plan = pet.status.as_ref().and_then(|s| s.plan.as_ref());
                    plan.and_then(|p| p.actions.first())
                        .is_some_and(|a| a.action == "claim")
                        && pet
                            .condition("Synced")
                            .is_some_and(|c| c.reason == "RecordDiffers")
                }))
            .then_some(())
        },
    )?;
    assert_eq!(writes(&env)?, before, "Observe wrote to the store");

    // Someone else claims one record before the switch: it is held, and
    // its record untouched.
    let taken = &ids[0];
    env.store.grpcurl(
        "petstore.PetStore/SetIdempotencyKeys",
        &format!(r#"{{"changes":[{{"id":"{taken}","expectedKey":"","newKey":"someone-else"}}]}}"#),
    )?;
    let before = writes(&env)?;
    let claims_before = env.store.answered_ok("SetIdempotencyKeys")?;
    let (yaml, _) = import(&env, &["--change-policy", "Automatic"])?;
    assert_eq!(
        yaml.matches("kind: Pet").count(),
        RECORDS - 1,
        "the record claimed meanwhile is left out of a new import"
    );
    // Applied over the first: the same Pets, now Automatic, as a user would
    // after reviewing their plans. The one claimed meanwhile stays in
    // Observe, and is held all the same.
    env.cp.kubectl_stdin(&["apply", "-f", "-"], &yaml)?;
    wait_for_every(
        THOUSANDS_POLL,
        TIMEOUT,
        "the imported Pets Ready, the claimed one held",
        || {
            let pets = pets(&env).ok()?;
            let ready = pets.iter().filter(|pet| is_ready(pet)).count();
            let held = pets
                .iter()
                .filter(|pet| {
                    pet.condition("Synced")
                        .is_some_and(|c| c.reason == "RecordOwnedElsewhere")
                })
                .count();
            (ready == RECORDS - 1 && held == 1).then_some(())
        },
    )?;
    let after = writes(&env)?;
    assert_eq!(
        [after[0], after[1], after[2]],
        [before[0], before[1], before[2]],
        "no create, update or delete"
    );
    // Claims the store refused and the operator sent again are not claims
    // made: only those answered OK count. A Pet can show Ready a moment
    // before the store has counted its claim's answer, so the count is
    // waited for; a second claim of a record could only add to it.
    let claims = claims_before + (RECORDS - 1) as f64;
    let counted = || env.store.answered_ok("SetIdempotencyKeys");
    // Its timeout is not the failure: the count it stopped at is.
    let _ = wait_for(Duration::from_secs(30), "the claims counted", || {
        (counted().ok()? >= claims).then_some(())
    });
    assert_eq!(counted()?, claims, "one key claim per record");
    for pet in pets(&env)? {
        if is_ready(&pet) {
            let annotations = pet.metadata.annotations.as_ref();
            let adopted = annotations.and_then(|a| a.get("petstore.example.com/external-id"));
            assert_eq!(typed::id(&pet), adopted.map(String::as_str));
        }
    }
    let record = env
        .store
        .record(taken)?
        .expect("the record claimed by someone else");
    assert_eq!(
        (&record["idempotencyKey"], &record["name"]),
        (&Value::from("someone-else"), &Value::from("Stray 0")),
        "never overwritten"
    );
    Ok(())
}
