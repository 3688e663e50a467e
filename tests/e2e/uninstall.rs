//! Removing the operator never deletes a record by accident, on the real
//! API server, 200 Ready Pets per path, with the operator running and
//! stopped; the store's own count of DeletePets calls is the judge.
//!
//! - The guard (config/operator/crd-guard.yaml) refuses to delete the Pet
//!   CRD while Pets exist: with the operator running, naming the count and
//!   how to confirm; with it stopped, because nothing answers. A stale
//!   confirmation and a protected Pet are refused too. A confirmation with
//!   the right count deletes the Pets and their records, running or
//!   stopped (then once the operator starts).
//! - Without the guard, a deleted CRD takes its Pets, and the operator
//!   keeps and releases their records instead, with one Event per Pet and
//!   one log line; stopped, it writes nothing until it starts, and
//!   `kubectl petstore plan` shows the release it will make.
//! - While the operator's own namespace is being deleted, a deleted Pet
//!   keeps its record too, operator running or stopped (then once it
//!   starts).
//! - Every kept record is read back: released (no key), its identity kept.
//! - When the operator cannot tell whether the installation is going (it
//!   may not read its namespace), a deleted Pet deletes nothing and is
//!   retried, saying why, until it can.
//! - `kubectl delete -k config/default`, the operator's whole bundle, keeps
//!   every record, operator running or stopped, and leaves the demo store's
//!   bundle (config/petstore) alone; an operator installed again reads
//!   every Pet's record and deletes none.

use std::collections::BTreeMap;
use std::time::Duration;

use fixtures::env::{
    OPERATOR_ACCOUNT, OPERATOR_NAMESPACE, install_crd_and_rbac, install_crd_guard, pet_manifest,
};
use fixtures::{Env, Operator, Storage, wait_for};
use serde_json::Value;

const PETS: usize = 200;
const CRD: &str = "crd/pets.petstore.example.com";
const CONFIRM: &str = "petstore.example.com/confirm-delete-pets";
const PROTECTED: &str = "petstore.example.com/protected";
const GUARD: &str = "validatingwebhookconfiguration/petstore-operator-crd-guard";
/// Where the API server serves them, for the waits that poll in this
/// process.
const CRD_PATH: &str =
    "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/pets.petstore.example.com";
const GUARD_PATH: &str = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/petstore-operator-crd-guard";
const PETS_PATH: &str = "/apis/petstore.example.com/v1/namespaces/default/pets";
const TIMEOUT: Duration = Duration::from_secs(120);
/// The Secret holding the webhook's certificates, in the operator's
/// namespace: an operator cannot start without it.
const WEBHOOK_SECRET: &str = "petstore-operator-webhook-tls";
/// A finalizer of the test's own, to hold objects of a namespace being
/// deleted.
const HOLD: &str = "test.petstore.example.com/hold";

/// True once the API server has no object at `path`.
fn gone(env: &Env, path: &str) -> bool {
    matches!(env.cp.get_if_found(path), Ok(None))
}

/// `n` Pets named `<prefix>-<i>` in `default`, applied at once, then
/// awaited until every one is Ready.
fn ready_pets(env: &Env, prefix: &str, n: usize) -> fixtures::Result<()> {
    let manifests: Vec<String> = (0..n)
        .map(|i| {
            pet_manifest(
                &format!("{prefix}-{i}"),
                &[],
                &format!(" {{name: {prefix}{i}, type: dog, birthday: \"2021-04-01\"}}"),
            )
        })
        .collect();
    env.cp
        .kubectl_stdin(&["apply", "-f", "-"], &manifests.join("---\n"))?;
    let ready = wait_for(TIMEOUT, &format!("{n} Pets Ready"), || {
        let pets = crate::typed::pets(&env.cp, Some("default")).ok()?;
        let ready = pets
            .iter()
            .filter(|pet| crate::typed::is_ready(pet))
            .count();
        (ready == n).then_some(ready)
    })?;
    assert_eq!(ready, n);
    Ok(())
}

fn answered(env: &Env, method: &str) -> f64 {
    env.store.answered(method).expect("the store's /metrics")
}

fn records(env: &Env) -> usize {
    env.store.all_pets().expect("SearchPets").len()
}

/// Every record of the `n` Pets `<prefix>-<i>` (named `<prefix><i>` in the
/// store) is there and released: no key, and its identity, the Pet's
/// `default/<prefix>-<i>`, kept for whoever takes it next.
fn assert_released(env: &Env, prefix: &str, n: usize) -> fixtures::Result<()> {
    let by_name: BTreeMap<String, Value> = env
        .store
        .all_pets()?
        .into_iter()
        .map(|record| {
            (
                record["name"].as_str().unwrap_or_default().to_owned(),
                record,
            )
        })
        .collect();
    for i in 0..n {
        let record = by_name
            .get(&format!("{prefix}{i}"))
            .unwrap_or_else(|| panic!("{prefix}-{i}'s record is gone"));
        assert_eq!(
            record["idempotencyKey"].as_str().unwrap_or_default(),
            "",
            "{prefix}-{i}'s record is not released: {record}"
        );
        assert_eq!(
            record["identity"],
            format!("default/{prefix}-{i}").as_str(),
            "{prefix}-{i}'s record lost its identity: {record}"
        );
    }
    Ok(())
}

/// Adds the test's finalizer to `object` in the operator's namespace, so
/// that namespace's deletion leaves it (and the namespace) in place.
fn hold(env: &Env, object: &str) -> fixtures::Result<String> {
    set_finalizers(
        env,
        object,
        &format!(r#"{{"metadata":{{"finalizers":["{HOLD}"]}}}}"#),
    )
}

/// Removes the test's finalizer from `object`, letting it go.
fn release_hold(env: &Env, object: &str) -> fixtures::Result<String> {
    set_finalizers(env, object, r#"{"metadata":{"finalizers":null}}"#)
}

/// Sets the finalizers of `object`, in the operator's namespace, with the
/// merge patch `patch`.
fn set_finalizers(env: &Env, object: &str, patch: &str) -> fixtures::Result<String> {
    env.cp.kubectl(&[
        "patch",
        object,
        "-n",
        OPERATOR_NAMESPACE,
        "--type=merge",
        "-p",
        patch,
    ])
}

/// `kubectl delete crd` without waiting for the Pets; the error's text when
/// the API server refuses.
fn delete_crd(env: &Env) -> Result<(), String> {
    env.cp
        .kubectl(&["delete", CRD, "--wait=false"])
        .map(drop)
        .map_err(|err| err.to_string())
}

fn wait_crd_gone(env: &Env) -> fixtures::Result<()> {
    wait_for(TIMEOUT, "the Pet CRD to go", || {
        gone(env, CRD_PATH).then_some(())
    })
}

/// Every Pet in `default` shows a deletion timestamp.
fn wait_all_deleting(env: &Env, n: usize) -> fixtures::Result<()> {
    wait_for(TIMEOUT, "every Pet to be deleting", || {
        let pets = env.cp.get(PETS_PATH).ok()?;
        let items = pets["items"].as_array()?;
        (items.len() == n
            && items
                .iter()
                .all(|pet| pet["metadata"]["deletionTimestamp"].is_string()))
        .then_some(())
    })
}

/// Events in `default` whose note contains `needle`.
fn events_saying(env: &Env, needle: &str) -> usize {
    env.cp
        .get("/apis/events.k8s.io/v1/namespaces/default/events")
        .ok()
        .and_then(|list| list["items"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter(|event| event["note"].as_str().is_some_and(|n| n.contains(needle)))
        .count()
}

fn log_lines(operator: &mut Operator, needle: &str) -> usize {
    std::fs::read_to_string(operator.process().log_path())
        .unwrap_or_default()
        .lines()
        .filter(|line| line.contains(needle))
        .count()
}

#[test]
fn the_guard_refuses_to_delete_the_crd_unless_the_count_is_confirmed() -> fixtures::Result<()> {
    let env = Env::start(Storage::Durable)?;
    install_crd_guard(&env.cp)?;
    let mut running = env.start_operator("guarded")?;
    ready_pets(&env, "a", PETS)?;
    let deletes = answered(&env, "DeletePets");

    // Running: refused, with the count and the command that confirms it.
    let refused = delete_crd(&env).expect_err("refused while Pets exist");
    assert!(
        refused.contains(&format!("{PETS} Pets exist"))
            && refused.contains(&format!("{CONFIRM}={PETS}")),
        "{refused}"
    );
    // A confirmation for fewer Pets than there are is stale.
    let stale = format!("{CONFIRM}={}", PETS - 1);
    env.cp.kubectl(&["annotate", CRD, &stale])?;
    let refused = delete_crd(&env).expect_err("refused with a stale count");
    assert!(
        refused.contains(&format!("says \"{}\"", PETS - 1)),
        "{refused}"
    );
    // The right count, but a protected Pet: still refused.
    let confirmed = format!("{CONFIRM}={PETS}");
    env.cp
        .kubectl(&["annotate", CRD, &confirmed, "--overwrite"])?;
    // Matched ignoring case, as the admission policy does.
    env.cp
        .annotate_pet("default", "a-7", &[&format!("{PROTECTED}=True")])?;
    let refused = delete_crd(&env).expect_err("refused while a Pet is protected");
    assert!(refused.contains("1 of them protected"), "{refused}");
    env.cp
        .annotate_pet("default", "a-7", &[&format!("{PROTECTED}-")])?;

    // Stopped: nothing answers for the guard, so the CRD stays, confirmed
    // or not.
    running.kill();
    for confirmation in [confirmed.clone(), format!("{CONFIRM}-")] {
        env.cp
            .kubectl(&["annotate", CRD, &confirmation, "--overwrite"])?;
        let refused = delete_crd(&env).expect_err("refused with no operator to answer");
        assert!(
            refused.contains("crd-guard.petstore.example.com"),
            "{refused}"
        );
    }
    assert_eq!(
        answered(&env, "DeletePets"),
        deletes,
        "0 deletes unconfirmed"
    );
    assert_eq!(records(&env), PETS);

    // Confirmed, running: the Pets go, and their records with them.
    let _confirmed = env.start_operator("confirmed")?;
    env.cp.kubectl(&["annotate", CRD, &confirmed])?;
    delete_crd(&env).expect("a confirmed deletion is let through");
    wait_crd_gone(&env)?;
    assert_eq!(records(&env), 0, "a confirmed deletion deletes the records");
    assert!(answered(&env, "DeletePets") > deletes);
    Ok(())
}

/// Started without waiting for the conversion webhook: with the CRD being
/// deleted, the probe's dry-run create would be refused.
fn start_without_waiting(
    env: &Env,
    identity: &str,
    leader_election: bool,
) -> fixtures::Result<Operator> {
    let mut options = env.operator_options(identity);
    options.leader_election = leader_election;
    Operator::start(&options, &env.cp.dir().join(format!("{identity}.log")))
}

const KEPT_BY_CRD: &str = "the Pet CRD is being deleted without the confirmation";
const KEPT_BY_NAMESPACE: &str = "the operator's namespace is being deleted";
const SAID_ONCE: &str = "the installation is being removed";

#[test]
fn without_the_guard_the_operator_keeps_every_record() -> fixtures::Result<()> {
    let env = Env::start(Storage::Durable)?;
    let (deletes, releases) = (
        answered(&env, "DeletePets"),
        answered(&env, "SetIdempotencyKeys"),
    );

    // Stopped: the CRD goes through (no guard), its Pets wait on their
    // finalizers and nothing is written; started, it releases every record.
    install_crd_guard(&env.cp)?;
    let mut first = env.start_operator("stopped")?;
    ready_pets(&env, "b", PETS)?;
    first.kill();
    // The user goes around the guard on purpose.
    env.cp.kubectl(&["delete", GUARD])?;
    delete_crd(&env).expect("the guard removed");
    wait_all_deleting(&env, PETS)?;
    // No window here: with no operator running, nothing could write. The
    // operator started below is what must not delete.
    assert_eq!(answered(&env, "DeletePets"), deletes);
    assert_eq!(answered(&env, "SetIdempotencyKeys"), releases);
    // `kubectl petstore plan` shows what the operator will do when it
    // starts: release the record, not delete it.
    let manifest = pet_manifest(
        "b-0",
        &[],
        " {name: b0, type: dog, birthday: \"2021-04-01\"}",
    );
    let flags = [
        "--petstore-addr",
        env.store.addr.as_str(),
        "--operator-namespace",
        OPERATOR_NAMESPACE,
    ];
    let planned = env.kubectl_petstore_plan(&manifest, &flags.map(Into::into))?;
    assert_eq!(planned.code, Some(2), "a write planned: {}", planned.stderr);
    assert!(
        planned.stdout.contains(r#""action":"release""#)
            && !planned.stdout.contains(r#""action":"delete""#),
        "a release, not a delete: {}",
        planned.stdout
    );
    let mut started = start_without_waiting(&env, "started", true)?;
    wait_crd_gone(&env)?;
    assert_eq!(answered(&env, "DeletePets"), deletes, "0 deletes");
    assert_eq!(records(&env), PETS);
    assert!(answered(&env, "SetIdempotencyKeys") >= releases + 1.0);
    assert_released(&env, "b", PETS)?;
    wait_for(TIMEOUT, "one Event per Pet", || {
        (events_saying(&env, KEPT_BY_CRD) == PETS).then_some(())
    })?;
    assert_eq!(log_lines(&mut started, SAID_ONCE), 1);
    drop(started);

    // Running: the same, as it happens.
    install_crd_and_rbac(&env.cp)?;
    let _running = env.start_operator("running")?;
    ready_pets(&env, "c", PETS)?;
    delete_crd(&env).expect("the guard removed");
    wait_crd_gone(&env)?;
    assert_eq!(answered(&env, "DeletePets"), deletes, "0 deletes");
    assert_eq!(records(&env), 2 * PETS);
    assert_released(&env, "c", PETS)?;
    drop(_running);

    // The operator's namespace being deleted: Pets deleted meanwhile keep
    // their records. A ConfigMap's finalizer holds the namespace there; the
    // operator runs without a Lease, which the namespace would lose.
    install_crd_and_rbac(&env.cp)?;
    let mut options = env.operator_options("namespace");
    options.leader_election = false;
    let _in_namespace = env.start_operator_with(&options)?;
    ready_pets(&env, "d", PETS)?;
    env.cp.apply(&format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: hold\n  namespace: {OPERATOR_NAMESPACE}\n  finalizers: [{HOLD}]\n"
    ))?;
    env.cp
        .kubectl(&["delete", "namespace", OPERATOR_NAMESPACE, "--wait=false"])?;
    env.cp
        .kubectl(&["delete", "pets", "--all", "-n", "default", "--wait=false"])?;
    wait_all_gone(&env)?;
    assert_eq!(answered(&env, "DeletePets"), deletes, "0 deletes");
    assert_eq!(records(&env), 3 * PETS);
    assert_released(&env, "d", PETS)?;
    wait_for(TIMEOUT, "one Event per Pet", || {
        (events_saying(&env, KEPT_BY_NAMESPACE) == PETS).then_some(())
    })?;
    Ok(())
}

fn wait_all_gone(env: &Env) -> fixtures::Result<()> {
    wait_for(TIMEOUT, "the Pets to go", || {
        let pets = env.cp.get(PETS_PATH).ok()?;
        pets["items"].as_array()?.is_empty().then_some(())
    })
}

/// The operator's namespace deleted while it is stopped: Pets deleted
/// meanwhile wait on their finalizers, nothing is written, and the
/// operator started then keeps and releases their records.
#[test]
fn the_namespace_going_keeps_every_record_operator_stopped() -> fixtures::Result<()> {
    let env = Env::start(Storage::Durable)?;
    let deletes = answered(&env, "DeletePets");
    let mut options = env.operator_options("namespace");
    options.leader_election = false;
    let first = env.start_operator_with(&options)?;
    ready_pets(&env, "f", PETS)?;
    drop(first);
    // The test's finalizers hold the namespace, and in it what an operator
    // needs to start: its webhook Secret, the Role that reads it, and the
    // ServiceAccount it authenticates as (whose tokens the API server
    // still takes for a minute after its deletion began, which this path
    // stays well within).
    let held = [
        format!("secret/{WEBHOOK_SECRET}"),
        format!("role/{WEBHOOK_SECRET}"),
        format!("rolebinding/{WEBHOOK_SECRET}"),
        format!("serviceaccount/{OPERATOR_ACCOUNT}"),
    ];
    for object in &held {
        hold(&env, object)?;
    }
    env.cp
        .kubectl(&["delete", "namespace", OPERATOR_NAMESPACE, "--wait=false"])?;
    env.cp
        .kubectl(&["delete", "pets", "--all", "-n", "default", "--wait=false"])?;
    wait_all_deleting(&env, PETS)?;
    let namespace = env
        .cp
        .kubectl_json(&["get", "namespace", OPERATOR_NAMESPACE])?;
    assert!(
        namespace["metadata"]["deletionTimestamp"].is_string(),
        "{namespace}"
    );
    // No window here: with no operator running, nothing could write.
    assert_eq!(answered(&env, "DeletePets"), deletes);
    options.identity = "namespace-started".into();
    let _started = env.start_operator_with(&options)?;
    wait_all_gone(&env)?;
    assert_eq!(answered(&env, "DeletePets"), deletes, "0 deletes");
    assert_eq!(records(&env), PETS);
    assert_released(&env, "f", PETS)?;
    wait_for(TIMEOUT, "one Event per Pet", || {
        (events_saying(&env, KEPT_BY_NAMESPACE) == PETS).then_some(())
    })?;
    for object in &held {
        release_hold(&env, object)?;
    }
    Ok(())
}

/// The index of the ClusterRole's rule that lets the operator read
/// namespaces.
fn namespaces_rule(env: &Env) -> fixtures::Result<usize> {
    let role = env
        .cp
        .kubectl_json(&["get", "clusterrole", "petstore-operator"])?;
    Ok(role["rules"]
        .as_array()
        .and_then(|rules| {
            rules
                .iter()
                .position(|rule| rule["resources"][0] == "namespaces")
        })
        .expect("the shipped ClusterRole reads namespaces"))
}

/// Reconciles that failed with `reason` (snake_case), by the operator's
/// own metrics.
fn failures(operator: &Operator, reason: &str) -> f64 {
    fixtures::http::sum_series(
        &operator.metrics().unwrap_or_default(),
        "petstore_operator_reconcile_errors_total",
        &format!("reason=\"{reason}\""),
    )
}

#[test]
fn a_deletion_that_cannot_tell_whether_the_installation_goes_deletes_nothing_and_retries()
-> fixtures::Result<()> {
    let env = Env::start(Storage::Durable)?;
    let operator = env.start_operator("probe")?;
    ready_pets(&env, "g", 1)?;
    let deletes = answered(&env, "DeletePets");

    // The operator may no longer read its namespace: the probe fails.
    let rule = namespaces_rule(&env)?;
    env.cp.kubectl(&[
        "patch",
        "clusterrole",
        "petstore-operator",
        "--type=json",
        "-p",
        &format!(r#"[{{"op":"remove","path":"/rules/{rule}"}}]"#),
    ])?;
    env.cp
        .kubectl(&["delete", "pet", "g-0", "-n", "default", "--wait=false"])?;
    let said = crate::typed::wait_deleting(&env.cp, "default", "g-0", TIMEOUT, |synced| {
        synced.status == "False" && synced.reason == "ReconcileError"
    })?;
    assert!(
        said.contains("to tell whether the installation is being removed")
            && said.contains(OPERATOR_NAMESPACE),
        "{said}"
    );
    // Retried, and each attempt deleted nothing.
    let first = failures(&operator, "reconcile_error");
    wait_for(TIMEOUT, "the deletion to be retried", || {
        (failures(&operator, "reconcile_error") >= first + 2.0).then_some(())
    })?;
    assert_eq!(answered(&env, "DeletePets"), deletes, "deleted in doubt");
    assert_eq!(records(&env), 1);
    assert!(env.pet("default", "g-0").is_ok(), "the Pet went in doubt");

    // Readable again: the next retry finds the installation staying, and
    // the deletion goes through, record and all.
    let rbac = fixtures::repo_root().join("config/rbac");
    env.cp.kubectl(&["apply", "-k", &rbac.to_string_lossy()])?;
    env.wait_gone("default", "g-0", TIMEOUT)?;
    assert_eq!(answered(&env, "DeletePets"), deletes + 1.0);
    assert_eq!(records(&env), 0);
    Ok(())
}

/// config/default installed for real (its Deployments stay Pending: this
/// control plane has no node; the operator runs beside it as a process),
/// 200 Ready Pets, then the whole bundle deleted. kubectl deletes the
/// namespaces first and the guard's configuration last, so the CRD's
/// deletion reaches the guard while it is still there: refused by the count
/// (running) or because nothing answers (stopped). The demo store's bundle,
/// config/petstore, installed beside it, is not touched.
fn delete_the_bundle(stop_first: bool) -> fixtures::Result<()> {
    let env = Env::start(Storage::Durable)?;
    let config = fixtures::repo_root().join("config");
    let default = config.join("default");
    for bundle in [&default, &config.join("petstore")] {
        env.cp
            .kubectl(&["apply", "-k", &bundle.to_string_lossy()])?;
    }
    let mut operator = env.start_operator("bundle")?;
    ready_pets(&env, "e", PETS)?;
    if stop_first {
        operator.kill();
    }
    let deletes = answered(&env, "DeletePets");
    let deleted = env
        .cp
        .kubectl(&["delete", "-k", &default.to_string_lossy(), "--wait=false"]);
    let refused = deleted
        .expect_err("the CRD's deletion is refused")
        .to_string();
    assert!(
        refused.contains("crd-guard.petstore.example.com"),
        "{refused}"
    );
    // What the guard let go of went: the operator's namespace and the guard.
    wait_for(TIMEOUT, "the guard's configuration to go", || {
        gone(&env, GUARD_PATH).then_some(())
    })?;
    let crd = env.cp.kubectl_json(&["get", CRD])?;
    assert!(crd["metadata"]["deletionTimestamp"].is_null(), "{crd}");
    let pets = env.cp.kubectl_json(&["get", "pets", "-n", "default"])?;
    assert_eq!(pets["items"].as_array().map(Vec::len), Some(PETS));
    // Installed again, once its namespace is gone, an operator reads every
    // Pet's record and deletes none. (The one that ran through the
    // deletion lost its ServiceAccount with the namespace.)
    drop(operator);
    wait_for(TIMEOUT, "the operator's namespace to go", || {
        gone(&env, &format!("/api/v1/namespaces/{OPERATOR_NAMESPACE}")).then_some(())
    })?;
    // Its namespace and RBAC: the CRD stayed (the operator that ran had
    // pointed its webhook at a local address, which config/ would undo).
    env.cp.ensure_namespace(OPERATOR_NAMESPACE)?;
    env.cp
        .kubectl(&["apply", "-k", &config.join("rbac").to_string_lossy()])?;
    let kubeconfig = env
        .cp
        .service_account_kubeconfig(OPERATOR_NAMESPACE, OPERATOR_ACCOUNT)?;
    let mut options = env.operator_options("back");
    options.kubeconfig = kubeconfig;
    let back = env.start_operator_with(&options)?;
    back.wait_store_reads(0.0, PETS as u32, TIMEOUT)?;
    assert_eq!(answered(&env, "DeletePets"), deletes, "0 deletes");
    assert_eq!(records(&env), PETS);
    // The demo store's namespace, Deployment and volume are all still there.
    let namespace = env.cp.kubectl_json(&["get", "namespace", "petstore"])?;
    assert_eq!(namespace["status"]["phase"], "Active", "{namespace}");
    for object in ["deployment/petstore", "pvc/petstore-data"] {
        let live = env.cp.kubectl_json(&["get", object, "-n", "petstore"])?;
        assert!(live["metadata"]["deletionTimestamp"].is_null(), "{live}");
    }
    Ok(())
}

#[test]
fn deleting_the_install_bundle_keeps_every_record_operator_running() -> fixtures::Result<()> {
    delete_the_bundle(false)
}

#[test]
fn deleting_the_install_bundle_keeps_every_record_operator_stopped() -> fixtures::Result<()> {
    delete_the_bundle(true)
}
