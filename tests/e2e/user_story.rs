//! Scenarios 1-3: apply the samples, rename Thor, delete the Pets (and the
//! Orphan policy), all through kubectl and grpcurl as a user would.

use std::time::Duration;

use fixtures::env::condition;
use fixtures::{Env, Storage, wait_for};
use serde_json::Value;

const TIMEOUT: Duration = Duration::from_secs(60);

fn names(pets: &[Value]) -> Vec<&str> {
    pets.iter().filter_map(|p| p["name"].as_str()).collect()
}

/// A table's column headers: separated by two spaces or more.
fn columns(header: &str) -> Vec<String> {
    header
        .split("  ")
        .map(str::trim)
        .filter(|column| !column.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The headers of the README's `kubectl get pets` sample.
fn readme_columns() -> Vec<String> {
    let readme = include_str!("../../README.md");
    let header = readme
        .lines()
        .find_map(|line| line.strip_prefix("#   NAME "))
        .expect("the README shows the output of kubectl get pets");
    columns(&format!("NAME  {header}"))
}

#[test]
fn apply_rename_delete_and_orphan() -> fixtures::Result<()> {
    let env = Env::start(Storage::Durable)?;
    let mut operator = env.start_operator("operator-a")?;

    // 1. Apply: both Pets get an ID and Ready=True; the store holds them.
    let (thor_id, tron_id) = env.apply_samples()?;
    let pets = env.store_pets()?;
    assert_eq!(names(&pets), ["Thor", "Tron"]);
    assert_eq!(pets[0]["id"], thor_id.as_str());
    assert_eq!(pets[0]["type"], "PTCanine");
    assert_eq!(
        pets[0]["birthday"],
        serde_json::json!({"year": 2021, "month": 4, "day": 1})
    );
    assert_eq!(pets[1]["id"], tron_id.as_str());
    assert_eq!(pets[1]["type"], "PTFeline");

    let table = env.cp.kubectl(&["get", "pets"])?;
    // The README's sample prints the columns kubectl prints, in order.
    let header = table.lines().next().unwrap_or_default();
    assert_eq!(columns(header), readme_columns(), "{table}");
    assert!(
        table.lines().skip(1).all(|row| row.contains(" none ")),
        "an Automatic Pet in line shows PLAN none:\n{table}"
    );
    assert!(
        table.contains(&thor_id) && table.contains("Thor") && table.contains("True"),
        "{table}"
    );
    // v1: the birthday is the calendar date.
    assert!(table.contains("2021-04-01"), "{table}");
    assert!(!table.contains("T00:00:00Z"), "{table}");
    // The short name and the category read the same way.
    assert!(env.cp.kubectl(&["get", "pt"])?.contains("pet-sample2"));
    assert!(
        env.cp
            .kubectl(&["get", "petstore"])?
            .contains("pet-sample2")
    );

    let pet = env.pet("default", "pet-sample1")?;
    assert_eq!(pet["apiVersion"], "petstore.example.com/v1");
    assert_eq!(pet["spec"]["birthday"], "2021-04-01");
    assert_eq!(pet["metadata"]["finalizers"][0], "pet.petstore.example.com");
    assert_eq!(
        condition(&pet, "Synced").expect("Synced")["reason"],
        "ReconcileSuccess"
    );

    // Events reached the API (the shipped RBAC allows them), and the Lease is
    // held by this operator.
    env.wait_event("Created/pet-sample1", TIMEOUT)?;
    assert_eq!(env.lease_holder()?, "operator-a");

    // 2. Rename: the same record carries the new name; still 2 records.
    env.rename("default", "pet-sample1", "Thorbert")?;
    wait_for(TIMEOUT, "Thorbert in the store", || {
        let pets = env.store_pets().ok()?;
        pets.iter()
            .any(|p| p["name"] == "Thorbert" && p["id"] == thor_id.as_str())
            .then_some(())
    })?;
    assert_eq!(env.wait_ready("default", "pet-sample1", TIMEOUT)?, thor_id);
    assert_eq!(names(&env.store_pets()?), ["Thorbert", "Tron"]);

    // Drift: a change made behind the operator's back is put back by the
    // next poll, on the same record.
    env.store.grpcurl(
        "petstore.PetStore/UpdatePets",
        &format!(
            r#"{{"pets":[{{"id":"{thor_id}","name":"Changed behind its back","type":"PTBird","birthday":{{"year":2000,"month":1,"day":1}}}}]}}"#
        ),
    )?;
    wait_for(TIMEOUT, "the drift to be put back", || {
        let pets = env.store_pets().ok()?;
        pets.iter()
            .any(|p| {
                p["id"] == thor_id.as_str() && p["name"] == "Thorbert" && p["type"] == "PTCanine"
            })
            .then_some(())
    })?;
    assert_eq!(env.store_pets()?.len(), 2);
    // Why the record changed is in `kubectl describe`, without the logs.
    wait_for(TIMEOUT, "the drift correction in kubectl describe", || {
        let described = env.cp.kubectl(&["describe", "pet", "pet-sample1"]).ok()?;
        described
            .contains(r#"drift corrected: name "Changed behind its back" -> "Thorbert", type bird -> dog"#)
            .then_some(())
    })?;

    // 3. Delete: the record goes, the finalizer is released, the object is gone.
    env.cp.kubectl(&[
        "delete",
        "pet",
        "pet-sample1",
        "--wait=true",
        "--timeout=60s",
    ])?;
    assert_eq!(names(&env.store_pets()?), ["Tron"]);
    assert!(env.cp.kubectl(&["get", "pet", "pet-sample1"]).is_err());

    // Orphan: the Pet goes, its record stays.
    env.cp.kubectl(&[
        "annotate",
        "pet",
        "pet-sample2",
        "petstore.example.com/deletion-policy=Orphan",
    ])?;
    env.cp.kubectl(&[
        "delete",
        "pet",
        "pet-sample2",
        "--wait=true",
        "--timeout=60s",
    ])?;
    let left = env.store_pets()?;
    assert_eq!(names(&left), ["Tron"]);
    assert_eq!(left[0]["id"], tron_id.as_str());

    // The operator counted what it did.
    let metrics = operator.metrics()?;
    // Each write by its cause: the rename is a spec change, the repair drift.
    for series in [
        r#"petstore_operator_store_actions_total{action="create",cause="new_pet"} 2"#,
        r#"petstore_operator_store_actions_total{action="delete",cause="deletion"} 1"#,
        r#"petstore_operator_store_actions_total{action="release",cause="deletion"} 1"#,
        r#"petstore_operator_store_actions_total{action="update",cause="spec_change"} 1"#,
        r#"petstore_operator_store_actions_total{action="update",cause="drift"} 1"#,
        r#"petstore_operator_drift_detected_total{field="name"} 1"#,
        r#"petstore_operator_time_to_ready_seconds_count"#,
    ] {
        assert!(metrics.contains(series), "{series} in {metrics}");
    }

    // SIGTERM: a graceful stop, exit status 0.
    assert!(
        operator.process().terminate(Duration::from_secs(10)),
        "graceful exit on SIGTERM"
    );
    Ok(())
}
