//! A record belongs to one Pet: a wrong status.id is corrected without
//! touching anyone else's record; records are adopted explicitly (made with
//! grpcurl, or kept by an Orphan deletion), and of two Pets racing for one
//! record exactly one wins; a misspelled deletion policy never deletes; and a
//! store without the extension RPCs is named as such. All through kubectl
//! and grpcurl, as a user would.

use std::time::{Duration, Instant};

use fixtures::env::pet_manifest;
use fixtures::forwarder::Forwarder;
use fixtures::legacy_store::LegacyStore;
use fixtures::{Env, Storage, wait_for};
use petstore_operator::crd::{Condition, Pet};
use serde_json::Value;

use crate::typed::{self, is_ready};

const TIMEOUT: Duration = Duration::from_secs(60);
const EXTERNAL_ID: &str = "petstore.example.com/external-id";

fn pet_yaml(name: &str, pet_name: &str, annotations: &[(&str, &str)], extra_spec: &str) -> String {
    let spec =
        format!("\n  name: {pet_name}\n  type: dog\n  birthday: \"2021-04-01\"\n{extra_spec}");
    pet_manifest(name, annotations, spec.trim_end_matches('\n'))
}

/// Every Event as (reason, object, note).
fn events(env: &Env) -> fixtures::Result<Vec<(String, String, String)>> {
    let list = env
        .cp
        .kubectl_json(&["get", "events.events.k8s.io", "-n", "default"])?;
    Ok(list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
            (
                text(&e["reason"]),
                text(&e["regarding"]["name"]),
                text(&e["note"]),
            )
        })
        .collect())
}

fn event_note(env: &Env, reason: &str, pet: &str) -> Option<String> {
    events(env)
        .ok()?
        .into_iter()
        .find(|e| e.0 == reason && e.1 == pet)
        .map(|e| e.2)
}

fn record<'a>(records: &'a [Value], id: &str) -> Option<&'a Value> {
    records.iter().find(|r| r["id"] == id)
}

fn uid(env: &Env, name: &str) -> fixtures::Result<String> {
    Ok(env.pet("default", name)?["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_owned())
}

fn set_status_id(env: &Env, name: &str, id: &str) -> fixtures::Result<String> {
    env.cp.kubectl(&[
        "patch",
        "pet",
        name,
        "--subresource=status",
        "--type=merge",
        "-p",
        &format!(r#"{{"status":{{"id":"{id}"}}}}"#),
    ])
}

/// Waits until the Pet's Synced condition has this reason; returns its
/// message.
fn wait_synced_reason(env: &Env, name: &str, reason: &str) -> fixtures::Result<String> {
    let what = format!("Synced reason {reason}");
    typed::wait_pet(&env.cp, "default", name, TIMEOUT, &what, |pet| {
        let synced = pet.condition("Synced")?;
        (synced.reason == reason).then(|| synced.message.clone())
    })
}

fn message_contains(condition: &Condition, fragment: &str) -> bool {
    condition.message.contains(fragment)
}

#[test]
fn a_status_id_that_is_not_the_pets_own_is_corrected_and_touches_nothing_foreign()
-> fixtures::Result<()> {
    let env = Env::start(Storage::Durable)?;
    let operator = env.start_operator("operator")?;
    env.cp.apply(&pet_yaml("alpha", "Alpha", &[], ""))?;
    env.cp.apply(&pet_yaml("beta", "Beta", &[], ""))?;
    let alpha = env.wait_ready("default", "alpha", TIMEOUT)?;
    let beta = env.wait_ready("default", "beta", TIMEOUT)?;

    // beta's status.id is set to alpha's record, as a restore tool could.
    set_status_id(&env, "beta", &alpha)?;
    let note = wait_for(TIMEOUT, "beta's status.id corrected", || {
        let pet = typed::pet(&env.cp, "default", "beta").ok()?;
        let note = event_note(&env, "StatusIdCorrected", "beta")?;
        (typed::id(&pet) == Some(beta.as_str())).then_some(note)
    })?;
    assert!(
        note.contains(&alpha) && note.contains("belongs to another owner"),
        "{note}"
    );
    // Several polls (2 s each) pass: alpha's record keeps alpha's name.
    for _ in 0..3 {
        std::thread::sleep(Duration::from_secs(2));
        let records = env.store_pets()?;
        assert_eq!(records.len(), 2, "nothing leaked: {records:?}");
        assert_eq!(record(&records, &alpha).expect("alpha")["name"], "Alpha");
        assert_eq!(record(&records, &beta).expect("beta")["name"], "Beta");
    }

    // An ID that names no record: beta finds its own record again by UID,
    // and the Event does not claim a create.
    set_status_id(&env, "beta", "00000000-0000-4000-8000-000000000000")?;
    wait_for(TIMEOUT, "the unknown ID corrected", || {
        let pet = typed::pet(&env.cp, "default", "beta").ok()?;
        let notes: Vec<String> = events(&env)
            .ok()?
            .into_iter()
            .filter(|e| e.0 == "StatusIdCorrected" && e.1 == "beta")
            .map(|e| e.2)
            .collect();
        (typed::id(&pet) == Some(beta.as_str())
            && notes.iter().any(|n| n.contains("does not exist")))
        .then_some(())
    })?;
    assert_eq!(env.store_pets()?.len(), 2);
    assert!(
        !events(&env)?.iter().any(|e| e.0 == "Recreated"),
        "nothing was recreated"
    );

    // Deleting beta (with status.id pointing at alpha's record once more)
    // deletes only beta's own record.
    set_status_id(&env, "beta", &alpha)?;
    env.cp
        .kubectl(&["delete", "pet", "beta", "--wait=true", "--timeout=60s"])?;
    let records = env.store_pets()?;
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0]["id"], alpha.as_str());
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(env.wait_ready("default", "alpha", TIMEOUT)?, alpha);
    assert!(!events(&env)?.iter().any(|e| e.0 == "Recreated"));
    let metrics = operator.metrics()?;
    assert!(
        metrics.contains(
            "petstore_operator_store_actions_total{action=\"create\",cause=\"new_pet\"} 2"
        ),
        "{metrics}"
    );
    Ok(())
}

#[test]
fn records_are_adopted_explicitly_and_only_one_pet_wins_a_race() -> fixtures::Result<()> {
    let env = Env::start(Storage::Durable)?;
    let _operator = env.start_operator("operator")?;

    // 1. A record made with grpcurl, outside Kubernetes, is adopted.
    let rex = env.store.add_unowned("Rex")?;
    env.cp.apply(&pet_yaml(
        "rex",
        "Rex the Second",
        &[(EXTERNAL_ID, &rex)],
        "",
    ))?;
    assert_eq!(env.wait_ready("default", "rex", TIMEOUT)?, rex);
    let records = env.store_pets()?;
    assert_eq!(records.len(), 1, "adopted, not duplicated: {records:?}");
    assert_eq!(
        records[0]["name"], "Rex the Second",
        "kept in line with the spec"
    );
    assert_eq!(records[0]["idempotencyKey"], uid(&env, "rex")?.as_str());
    assert!(event_note(&env, "Adopted", "rex").is_some());

    // 2. Orphan deletion keeps and releases the record; the Event names the
    //    ID; the Pet created again adopts the same record.
    env.cp
        .apply(&pet_yaml("tron", "Tron", &[], "  deletionPolicy: Orphan\n"))?;
    let tron = env.wait_ready("default", "tron", TIMEOUT)?;
    env.cp
        .kubectl(&["delete", "pet", "tron", "--wait=true", "--timeout=60s"])?;
    let kept = env.store_pets()?;
    let released = record(&kept, &tron).expect("the record is kept");
    assert!(
        released["idempotencyKey"]
            .as_str()
            .unwrap_or_default()
            .is_empty(),
        "released: {released}"
    );
    let note = wait_for(TIMEOUT, "the Orphaned Event", || {
        event_note(&env, "Orphaned", "tron")
    })?;
    assert!(note.contains(&format!("{EXTERNAL_ID}: {tron}")), "{note}");
    env.cp
        .apply(&pet_yaml("tron", "Tron", &[(EXTERNAL_ID, &tron)], ""))?;
    assert_eq!(env.wait_ready("default", "tron", TIMEOUT)?, tron);
    let records = env.store_pets()?;
    assert_eq!(records.len(), 2, "no second Tron: {records:?}");
    assert_eq!(
        record(&records, &tron).expect("tron")["idempotencyKey"],
        uid(&env, "tron")?.as_str()
    );

    // 3. A record owned by a live Pet is never taken.
    env.cp
        .apply(&pet_yaml("thief", "Thief", &[(EXTERNAL_ID, &rex)], ""))?;
    let message = wait_synced_reason(&env, "thief", "RecordOwnedElsewhere")?;
    assert!(message.contains("SetIdempotencyKeys"), "{message}");
    assert_eq!(env.store_pets()?.len(), 2);
    env.cp
        .kubectl(&["delete", "pet", "thief", "--wait=true", "--timeout=60s"])?;
    assert_eq!(
        env.store_pets()?.len(),
        2,
        "deleting the loser deletes nothing"
    );
    assert_eq!(env.wait_ready("default", "rex", TIMEOUT)?, rex);

    // 4. Two Pets race for one unowned record: exactly one wins.
    let prize = env.store.add_unowned("Prize")?;
    let both = format!(
        "{}---\n{}",
        pet_yaml("left", "Left", &[(EXTERNAL_ID, &prize)], ""),
        pet_yaml("right", "Right", &[(EXTERNAL_ID, &prize)], "")
    );
    env.cp.apply(&both)?;
    let (winner, loser) = wait_for(TIMEOUT, "one winner, one loser", || {
        let left = typed::pet(&env.cp, "default", "left").ok()?;
        let right = typed::pet(&env.cp, "default", "right").ok()?;
        let lost = |p: &Pet| {
            p.condition("Synced")
                .is_some_and(|c| c.reason == "RecordOwnedElsewhere")
        };
        match (is_ready(&left), is_ready(&right)) {
            (true, false) if lost(&right) => Some(("left", "right")),
            (false, true) if lost(&left) => Some(("right", "left")),
            _ => None,
        }
    })?;
    // It stays that way over several polls.
    for _ in 0..3 {
        std::thread::sleep(Duration::from_secs(2));
        let records = env.store_pets()?;
        assert_eq!(records.len(), 3, "{records:?}");
        let prize_record = record(&records, &prize).expect("prize");
        assert_eq!(prize_record["idempotencyKey"], uid(&env, winner)?.as_str());
        let loser_pet = typed::pet(&env.cp, "default", loser)?;
        assert!(
            typed::id(&loser_pet).is_none(),
            "{}",
            typed::shown(&loser_pet)
        );
    }
    Ok(())
}

/// Eight Pets applied at once, each held: four name a record that does not
/// exist, four a record another Pet owns. Each gets one Warning. The
/// reconcile that the finalizer's watch event queues often reads the Pet
/// before its status write has reached the watch cache; judged by that copy
/// alone, about half of them got a second Warning.
#[test]
fn each_held_pet_gets_one_warning_however_its_reconciles_fall() -> fixtures::Result<()> {
    let env = Env::start(Storage::Durable)?;
    let _operator = env.start_operator("operator")?;
    env.cp.apply(&pet_yaml("owner", "Owner", &[], ""))?;
    let owned = env.wait_ready("default", "owner", TIMEOUT)?;
    let missing = "00000000-0000-4000-8000-000000000000";
    let mut held = Vec::new();
    let mut yaml = Vec::new();
    for i in 0..4 {
        for (name, named, reason) in [
            (format!("missing-{i}"), missing, "RecordNotFound"),
            (format!("taken-{i}"), owned.as_str(), "RecordOwnedElsewhere"),
        ] {
            yaml.push(pet_yaml(&name, "Held", &[(EXTERNAL_ID, named)], ""));
            held.push((name, reason));
        }
    }
    env.cp.apply(&yaml.join("---\n"))?;
    for (name, reason) in &held {
        wait_synced_reason(&env, name, reason)?;
    }
    wait_for(TIMEOUT, "a Warning for every held Pet", || {
        let events = events(&env).ok()?;
        held.iter()
            .all(|(name, reason)| events.iter().any(|e| e.1 == *name && e.0 == *reason))
            .then_some(())
    })?;
    // A second Warning came within tens of milliseconds; the polls (2 s
    // apart) must add none either.
    std::thread::sleep(Duration::from_secs(5));
    let events = events(&env)?;
    let told: Vec<(&str, Vec<&str>)> = held
        .iter()
        .map(|(name, _)| {
            let reasons = events
                .iter()
                .filter(|e| e.1 == *name)
                .map(|e| e.0.as_str())
                .collect();
            (name.as_str(), reasons)
        })
        .collect();
    let expected: Vec<(&str, Vec<&str>)> = held
        .iter()
        .map(|(name, reason)| (name.as_str(), vec![*reason]))
        .collect();
    assert_eq!(told, expected, "one Event per held Pet");
    assert_eq!(env.store_pets()?.len(), 1, "nothing created for them");
    Ok(())
}

#[test]
fn a_misspelled_deletion_policy_never_deletes() -> fixtures::Result<()> {
    let env = Env::start(Storage::Durable)?;
    let _operator = env.start_operator("operator")?;

    // The spec field is an enum the API server checks.
    let refused = env
        .cp
        .apply(&pet_yaml("typo", "Typo", &[], "  deletionPolicy: Orhpan\n"))
        .expect_err("refused");
    let text = refused.to_string();
    assert!(
        text.contains("spec.deletionPolicy") && text.contains("Unsupported value: \"Orhpan\""),
        "{text}"
    );

    // The compatibility annotation cannot be checked by the API server: the
    // operator keeps the record in line, says so, and never deletes it.
    env.cp.apply(&pet_yaml(
        "typo",
        "Typo",
        &[("petstore.example.com/deletion-policy", "Orhpan")],
        "",
    ))?;
    let id = env.wait_ready("default", "typo", TIMEOUT)?;
    let message = wait_synced_reason(&env, "typo", "InvalidAnnotation")?;
    assert!(message.contains("\"Orhpan\""), "{message}");
    env.cp.kubectl(&["delete", "pet", "typo", "--wait=false"])?;
    let message = typed::wait_deleting(&env.cp, "default", "typo", TIMEOUT, |synced| {
        message_contains(synced, "deletion waits")
    })?;
    assert!(message.contains("Delete or Orphan"), "{message}");
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        record(&env.store_pets()?, &id).is_some(),
        "the record is kept"
    );
    assert!(env.pet("default", "typo").is_ok(), "the Pet waits");

    // Fixing the annotation lets the deletion finish as the user meant.
    env.cp.kubectl(&[
        "annotate",
        "pet",
        "typo",
        "--overwrite",
        "petstore.example.com/deletion-policy=Orphan",
    ])?;
    env.wait_gone("default", "typo", TIMEOUT)?;
    assert!(record(&env.store_pets()?, &id).is_some(), "Orphan kept it");
    Ok(())
}

#[test]
fn a_store_without_the_extensions_is_named_and_orphan_lets_go() -> fixtures::Result<()> {
    let env = Env::start(Storage::Durable)?;
    let (legacy, _operator) = env.start_operator_on_legacy_store("operator")?;

    env.cp.apply(&pet_yaml("old", "Old", &[], ""))?;
    let message = wait_synced_reason(&env, "old", "StoreLacksExtensions")?;
    assert!(
        message.contains("petstore.PetStore/GetPets") && message.contains("extension"),
        "{message}"
    );
    let pet = typed::pet(&env.cp, "default", "old")?;
    assert_eq!(
        pet.condition("Ready").map(|c| c.reason.as_str()),
        Some("StoreLacksExtensions")
    );
    assert!(event_note(&env, "StoreLacksExtensions", "old").is_some());
    assert!(legacy.ids().is_empty(), "nothing created without keys");

    // Deleting waits, and says how to let the Pet go.
    env.cp.kubectl(&["delete", "pet", "old", "--wait=false"])?;
    typed::wait_deleting(&env.cp, "default", "old", TIMEOUT, |synced| {
        message_contains(synced, "Orphan")
    })?;
    env.cp.kubectl(&[
        "annotate",
        "pet",
        "old",
        "petstore.example.com/deletion-policy=Orphan",
    ])?;
    env.wait_gone("default", "old", TIMEOUT)?;
    Ok(())
}

/// Against the book's store a failure counts once per attempt that was due,
/// not once per watch event of the operator's own writes, and shows one
/// Warning; our store taking its address releases the waiting Pet at the
/// next probe, not at the end of its backoff.
#[test]
fn backoff_counts_attempts_and_our_store_in_place_of_the_books_releases_the_pet()
-> fixtures::Result<()> {
    let env = Env::start(Storage::Durable)?;
    let legacy = LegacyStore::start()?;
    let front = Forwarder::start(vec![legacy.addr.clone()])?;
    let mut options = env.operator_options("operator");
    options.store_addr = front.addr.clone();
    // The default cap, not the tests' short one: the backoff must grow.
    options.backoff_max = "5m";
    let mut operator = env.start_operator_with(&options)?;

    env.cp.apply(&pet_yaml("early", "Early", &[], ""))?;
    wait_synced_reason(&env, "early", "StoreLacksExtensions")?;
    // With the fixtures' 200 ms backoff base, doubling, attempts fall at
    // about 0, 0.2, 0.6, 1.4, 3, 6.2, 12.6 and 25.4 s (up to 10% later):
    // 8 in 30 s, and the next not before 51 s.
    std::thread::sleep(Duration::from_secs(30));
    let metrics = operator.metrics()?;
    let failures: f64 = metrics
        .lines()
        .find_map(|line| {
            line.strip_prefix(
                r#"petstore_operator_reconcile_errors_total{reason="store_lacks_extensions"} "#,
            )
        })
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_default();
    assert!(
        (1.0..=8.0).contains(&failures),
        "{failures} failures counted in 30 s, for 8 attempts at most"
    );
    let warnings = events(&env)?
        .into_iter()
        .filter(|e| e.0 == "StoreLacksExtensions" && e.1 == "early")
        .count();
    assert_eq!(warnings, 1, "one Warning per change of reason");
    // The book's store has no change feed: polled, and said once, after
    // the operator has asked for the feed again (once a minute) at least
    // once, so that saying it at every recheck would show.
    wait_for(Duration::from_secs(90), "a second WatchPets call", || {
        (legacy.watch_calls() >= 2).then_some(())
    })?;
    // The refusal's answer, and a line the operator would write on it.
    std::thread::sleep(Duration::from_secs(1));
    let log = std::fs::read_to_string(operator.process().log_path())
        .map_err(fixtures::io("reading the operator's log"))?;
    assert_eq!(
        log.matches("offers no change feed").count(),
        1,
        "the fallback to polling is logged once:\n{log}"
    );

    // Our store takes the address: the Pet is Ready long before its next
    // attempt was due.
    let addr = front.addr.clone();
    drop(front);
    drop(legacy);
    let _ours = Forwarder::start_on(&addr, None, std::slice::from_ref(&env.store.addr))?;
    let replaced = Instant::now();
    env.wait_ready("default", "early", TIMEOUT)?;
    let took = replaced.elapsed();
    assert!(
        took < Duration::from_secs(6),
        "Ready {took:?} after our store took the address"
    );
    Ok(())
}

/// The request an advice gives, as `grpcurl -d '<request>' <store> <method>`.
fn advised_request(message: &str) -> Option<(&str, &str)> {
    let (_, rest) = message.split_once("grpcurl -d '")?;
    let (request, rest) = rest.split_once("' <store> ")?;
    let method = rest.split_whitespace().next()?;
    Some((request, method))
}

#[test]
fn an_adoption_conflicts_advice_followed_literally_adopts_the_named_record() -> fixtures::Result<()>
{
    let env = Env::start(Storage::Durable)?;
    let _operator = env.start_operator("operator")?;
    env.cp.apply(&pet_yaml("rex", "Rex", &[], ""))?;
    let own = env.wait_ready("default", "rex", TIMEOUT)?;
    let named = env.store.add_unowned("Named")?;

    // Annotated after it was reconciled: it names a second record.
    env.cp
        .kubectl(&["annotate", "pet", "rex", &format!("{EXTERNAL_ID}={named}")])?;
    let message = wait_synced_reason(&env, "rex", "AdoptionConflict")?;
    let (request, method) =
        advised_request(&message).unwrap_or_else(|| panic!("no request in {message:?}"));
    assert!(
        request.contains(&own),
        "it releases its own record: {message}"
    );

    // Followed as written: the Pet adopts the named record.
    env.store.grpcurl(method, request)?;
    typed::wait_pet(
        &env.cp,
        "default",
        "rex",
        TIMEOUT,
        "Ready on the named record",
        |pet| (is_ready(pet) && typed::id(pet) == Some(named.as_str())).then_some(()),
    )?;
    let records = env.store_pets()?;
    assert_eq!(records.len(), 2, "nothing created: {records:?}");
    let uid = uid(&env, "rex")?;
    let named_record = record(&records, &named).expect("the named record");
    assert_eq!(named_record["idempotencyKey"], uid.as_str());
    assert_eq!(named_record["identity"], "default/rex");
    assert_eq!(named_record["name"], "Rex", "kept in line with the spec");
    let old = record(&records, &own).expect("the old record stays");
    assert_eq!(
        (
            old["idempotencyKey"].as_str().unwrap_or_default(),
            old["identity"].as_str().unwrap_or_default()
        ),
        ("", ""),
        "released, with no name"
    );
    Ok(())
}
