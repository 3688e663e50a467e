//! Two live clusters with one installation name on one store: the second
//! is refused the claim on the name, so it reconciles nothing and writes
//! nothing to the store, and says why (its log names the installation and
//! the other cluster, its metric stays 0). Once the first is killed
//! (`kill -9`), the second takes the name over when the dead claim expires,
//! within the TTL, and its Pets take their records back by namespace and
//! name. Every count is the store's own.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::rebuild::pets;
use crate::typed::is_ready;
use fixtures::env::pet_manifest;
use fixtures::{ControlPlane, Env, Operator, Storage, wait_for};

const TIMEOUT: Duration = Duration::from_secs(90);
const PETS: usize = 3;
/// The fixtures' `--installation-claim-ttl`.
const TTL: Duration = Duration::from_secs(6);
const INSTALLATION: &str = "--installation=blue";

fn manifests() -> String {
    (0..PETS)
        .map(|i| {
            pet_manifest(
                &format!("pet-{i}"),
                &[],
                &format!("\n  name: Pet {i}\n  type: dog\n  birthday: \"2021-04-01\""),
            )
        })
        .collect::<Vec<_>>()
        .join("---\n")
}

/// Waits until all `PETS` are Ready; their IDs by name.
fn all_ready(cp: &ControlPlane, what: &str) -> fixtures::Result<BTreeMap<String, String>> {
    crate::rebuild::all_n_ready(cp, what, PETS)
}

/// The store's answered calls of each write RPC, and its records' keys.
#[derive(Debug, PartialEq)]
struct Writes {
    add: f64,
    update: f64,
    delete: f64,
    set_key: f64,
    keys: Vec<String>,
}

impl Writes {
    /// Whether every record's key is `blue/<UID>` of one of these Pets.
    fn keyed_by(&self, uids: &[String]) -> bool {
        self.keys
            .iter()
            .all(|key| uids.iter().any(|uid| *key == format!("blue/{uid}")))
    }
}

fn writes(env: &Env) -> fixtures::Result<Writes> {
    let mut keys: Vec<String> = env
        .store
        .all_pets()?
        .iter()
        .map(|r| r["idempotencyKey"].as_str().unwrap_or_default().to_owned())
        .collect();
    keys.sort();
    Ok(Writes {
        add: env.store.answered("AddPets")?,
        update: env.store.answered("UpdatePets")?,
        delete: env.store.answered("DeletePets")?,
        set_key: env.store.answered("SetIdempotencyKeys")?,
        keys,
    })
}

/// The cluster's identity in the claim: its kube-system Namespace's UID.
fn cluster_uid(cp: &ControlPlane) -> fixtures::Result<String> {
    let namespace = cp.kubectl_json(&["get", "namespace", "kube-system"])?;
    Ok(namespace["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_owned())
}

/// The operator's `petstore_operator_<name>` gauge, if scraped.
fn gauge(operator: &Operator, name: &str) -> Option<f64> {
    fixtures::http::series_value(
        &operator.metrics().ok()?,
        &format!("petstore_operator_{name}"),
    )
}

fn uids(cp: &ControlPlane) -> fixtures::Result<Vec<String>> {
    Ok(pets(cp)?
        .values()
        .map(|pet| pet.metadata.uid.clone().unwrap_or_default())
        .collect())
}

#[test]
fn a_second_live_cluster_with_the_same_installation_is_refused_until_the_first_dies()
-> fixtures::Result<()> {
    let env = Env::start(Storage::Durable)?;
    let mut options = env.operator_options("operator-first");
    options.extra_args.push(INSTALLATION.into());
    let mut first = env.start_operator_with(&options)?;
    env.cp.kubectl_stdin(&["apply", "-f", "-"], &manifests())?;
    let ids = all_ready(&env.cp, "the first cluster's Pets Ready")?;
    let first_uid = cluster_uid(&env.cp)?;

    // A second live cluster, the same manifests, the same installation
    // name, the same store.
    let second = env.another_cluster()?;
    let second_uid = cluster_uid(&second.cp)?;
    assert_ne!(first_uid, second_uid, "two clusters, two identities");
    second
        .cp
        .kubectl_stdin(&["apply", "-f", "-"], &manifests())?;
    let before = writes(&env)?;
    let mut second_operator = env.start_operator_in(&second, "operator-second", &[INSTALLATION])?;
    let refusal = format!(
        "the installation \"blue\" is claimed in the store by another live cluster (kube-system UID {first_uid}) until "
    );
    wait_for(TIMEOUT, "the second cluster refused, saying why", || {
        second_operator.log_contains(&refusal).then_some(())
    })?;
    assert!(second_operator.log_contains(&format!(
        "give this one (kube-system UID {second_uid}) its own --installation, or stop the other"
    )));
    // It leads its own cluster, but reconciles under no claim.
    wait_for(TIMEOUT, "the second operator leading", || {
        (gauge(&second_operator, "leader") == Some(1.0)).then_some(())
    })?;
    assert_eq!(gauge(&second_operator, "installation_claimed"), Some(0.0));
    assert_eq!(gauge(&first, "installation_claimed"), Some(1.0));
    // Long enough for the first to renew and the second to retry twice.
    std::thread::sleep(TTL * 2);
    assert_eq!(
        writes(&env)?,
        before,
        "the refused cluster wrote nothing to the store"
    );
    assert!(
        pets(&second.cp)?.values().all(|pet| !is_ready(pet)),
        "the refused cluster reconciled nothing"
    );
    assert_eq!(gauge(&second_operator, "installation_claimed"), Some(0.0));
    let first_uids = uids(&env.cp)?;
    assert!(
        before.keyed_by(&first_uids),
        "{:?}: every record still the first cluster's",
        before.keys
    );

    // The first cluster dies. Its claim, last renewed at most a third of
    // the TTL before, expires two thirds to one TTL later; the second
    // takes the name over then, not before.
    first.kill();
    let killed = Instant::now();
    wait_for(TIMEOUT, "the second cluster claims the name", || {
        (gauge(&second_operator, "installation_claimed") == Some(1.0)).then_some(())
    })?;
    let took = killed.elapsed();
    assert!(
        took >= TTL * 2 / 3 - Duration::from_millis(500),
        "took the name over after {took:?}, before the dead cluster's claim expired"
    );
    assert!(
        took <= TTL * 2,
        "took the name over after {took:?}: more than the TTL"
    );
    assert_eq!(
        all_ready(&second.cp, "the second cluster's Pets Ready")?,
        ids,
        "the same records, found by namespace and name"
    );
    let after = writes(&env)?;
    let second_uids = uids(&second.cp)?;
    assert_eq!(
        (after.add, after.update, after.delete, after.set_key),
        (
            before.add,
            before.update,
            before.delete,
            before.set_key + PETS as f64
        ),
        "one key claim per Pet, nothing created, updated or deleted"
    );
    assert!(
        after.keyed_by(&second_uids),
        "{:?}: every record now the second cluster's",
        after.keys
    );

    // A restart within the same cluster renews its own claim: no wait.
    second_operator.kill();
    let again = env.start_operator_in(&second, "operator-second-again", &[INSTALLATION])?;
    wait_for(TIMEOUT, "the restarted operator holds the claim", || {
        (gauge(&again, "installation_claimed") == Some(1.0)).then_some(())
    })?;
    assert!(again.log_contains("claimed the installation's name in the store"));
    assert!(
        !again.log_contains("is claimed in the store by another live cluster"),
        "the same cluster was refused its own claim"
    );
    Ok(())
}
