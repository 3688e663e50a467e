//! Two stateless store replicas on one real PostgreSQL database, behind a
//! round-robin forwarder (as behind a Service), with the operator in front.
//! One replica is killed with `kill -9` during a burst of Pet creates: every
//! Pet must converge with exactly one record, and nothing may be lost.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use fixtures::env::create_config_namespaces;
use fixtures::petstore::grpcurl;
use fixtures::{ControlPlane, Env, wait_for};
use petstore_operator::crd::Pet;

use crate::typed::{self, is_ready};

/// Pets per wave; two waves, the second applied right after the kill.
const WAVE: usize = 100;
const PETS: usize = 2 * WAVE;
const TIMEOUT: Duration = Duration::from_secs(120);

fn burst(range: std::ops::Range<usize>) -> String {
    range
        .map(|n| {
            format!(
                "apiVersion: petstore.example.com/v1\nkind: Pet\nmetadata:\n  name: burst-{n}\n  namespace: default\nspec:\n  name: Burst {n}\n  type: {}\n  birthday: \"2021-04-{:02}\"\n",
                ["dog", "cat", "bird", "reptile"][n % 4],
                1 + n % 28
            )
        })
        .collect::<Vec<_>>()
        .join("---\n")
}

fn pets(env: &Env) -> fixtures::Result<Vec<Pet>> {
    typed::pets(&env.cp, Some("default"))
}

#[test]
fn kill_9_of_one_replica_during_a_burst_loses_and_duplicates_nothing() -> fixtures::Result<()> {
    // Both replicas start at once, so their schema migrations race (the
    // advisory lock must serialise them).
    let (env, replicas) = Env::start_postgres_replicas()?;
    let (a, mut b, service) = (&env.store, replicas.other, replicas.service);

    // A record written through one replica is read through the other.
    let added = grpcurl(
        &a.addr,
        "petstore.PetStore/AddPets",
        r#"{"pets":[{"name":"Canary","type":"PTBird","birthday":{"year":2020,"month":1,"day":1},"idempotencyKey":"canary"}]}"#,
    )?;
    let canary = added[0]["ids"][0].as_str().unwrap_or_default().to_owned();
    let seen = grpcurl(
        &b.addr,
        "petstore.PetStore/GetPets",
        r#"{"idempotencyKeys":["canary"]}"#,
    )?;
    assert_eq!(seen[0]["pets"][0]["id"], canary.as_str());
    grpcurl(
        &b.addr,
        "petstore.PetStore/DeletePets",
        &format!(r#"{{"ids":["{canary}"]}}"#),
    )?;

    let _operator = env.start_operator_on("operator", &service.addr)?;

    // The first wave is applied from another thread (kubectl creates the
    // Pets one by one, and the operator reconciles them as they come), while
    // this one kills -9 the replica the operator is talking to once some,
    // not all, of the wave have records.
    let (victim, with_records) = std::thread::scope(|scope| {
        let applying = scope.spawn(|| env.cp.apply(&burst(0..WAVE)));
        let found = wait_for(TIMEOUT, "the first wave partly created", || {
            let with_records = pets(&env)
                .ok()?
                .iter()
                .filter(|p| typed::id(p).is_some())
                .count();
            (1..WAVE).contains(&with_records).then_some(())?;
            let busy = (0..2).find(|&i| service.open_connections(i) > 0)?;
            Some((busy, with_records))
        });
        if let Ok((busy, _)) = found {
            // Killed from here, mid-burst (`kill` needs no &mut: by PID).
            let pid = if busy == 0 {
                env.store.process().pid()
            } else {
                b.process().pid()
            };
            if let Some(pid) = pid {
                let _ = std::process::Command::new("kill")
                    .args(["-9", &pid.to_string()])
                    .status();
            }
        }
        let applied = applying.join().map_err(|_| fixtures::Error::Command {
            command: "kubectl apply (first wave)".into(),
            status: "panicked".into(),
            stderr: String::new(),
        })?;
        applied?;
        found
    })?;
    let mut env = env;
    if victim == 0 {
        env.store.kill();
    } else {
        b.kill();
    }
    env.cp.apply(&burst(WAVE..PETS))?;
    eprintln!("killed replica {victim} when {with_records} of the first {WAVE} Pets had records");
    // The survivor carries the rest of the burst alone for a while; then
    // the victim comes back, as Kubernetes would restart it.
    std::thread::sleep(Duration::from_secs(3));
    if victim == 0 {
        env.store.restart(fixtures::Storage::Postgres)?;
    } else {
        b.restart(fixtures::Storage::Postgres)?;
    }

    let converged = wait_for(TIMEOUT, "every Pet Ready", || {
        let all = pets(&env).ok()?;
        (all.len() == PETS && all.iter().all(is_ready)).then_some(all)
    })?;
    let want: BTreeMap<String, String> = converged
        .iter()
        .map(|p| {
            (
                p.metadata.uid.clone().unwrap_or_default(),
                typed::id(p).unwrap_or_default().to_owned(),
            )
        })
        .collect();

    // Exactly one record per Pet, keyed by its UID, with the ID in its
    // status; read through each replica.
    for store in [&env.store, &b] {
        let records = store.all_pets()?;
        let keys: Vec<&str> = records
            .iter()
            .filter_map(|r| r["idempotencyKey"].as_str())
            .collect();
        assert_eq!(records.len(), PETS, "one record per Pet, none extra");
        assert_eq!(
            keys.iter().collect::<BTreeSet<_>>().len(),
            PETS,
            "no key twice"
        );
        let got: BTreeMap<String, String> = records
            .iter()
            .map(|r| {
                (
                    r["idempotencyKey"].as_str().unwrap_or_default().to_owned(),
                    r["id"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect();
        assert_eq!(got, want, "each Pet's status.id is its record's ID");
    }
    assert!(
        service.total_connections(1 - victim) > 0,
        "the survivor took over the operator's traffic"
    );
    Ok(())
}

/// config/overlays/postgres against the real API server: two replicas, a
/// PodDisruptionBudget, the URL and password from the user's Secret, no
/// volume claim.
#[test]
fn postgres_overlay_installs_two_replicas_with_a_budget() -> fixtures::Result<()> {
    let cp = ControlPlane::start()?;
    let overlay = fixtures::repo_root().join("config/overlays/postgres");
    create_config_namespaces(&cp)?;
    cp.kubectl(&[
        "create",
        "secret",
        "generic",
        "petstore-postgres",
        "-n",
        "petstore",
        "--from-literal=url=postgres://petstore@db.example:5432/petstore",
        "--from-literal=password=secret",
    ])?;
    let applied = cp.kubectl(&["apply", "-k", &overlay.to_string_lossy()])?;
    assert!(
        applied.contains("poddisruptionbudget.policy/petstore created"),
        "{applied}"
    );
    assert!(!applied.contains("persistentvolumeclaim"), "{applied}");
    let deployment = cp.kubectl_json(&["get", "deployment", "petstore", "-n", "petstore"])?;
    assert_eq!(deployment["spec"]["replicas"], 2);
    assert_eq!(deployment["spec"]["strategy"]["type"], "RollingUpdate");
    let pod = &deployment["spec"]["template"]["spec"];
    let env = pod["containers"][0]["env"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let var = |name: &str| env.iter().find(|v| v["name"] == name).cloned();
    assert_eq!(
        var("PETSTORE_STORAGE").map(|v| v["value"].clone()),
        Some("postgres".into())
    );
    assert_eq!(
        var("PETSTORE_POSTGRES_URL").map(|v| v["valueFrom"]["secretKeyRef"]["name"].clone()),
        Some("petstore-postgres".into())
    );
    assert!(var("PETSTORE_DATA_FILE").is_none(), "{env:?}");
    // No data volume: the database holds everything. The password's
    // Secret, and what the store trusts (its certificate, the token issuer).
    let volumes = pod["volumes"].as_array().cloned().unwrap_or_default();
    let volume = |name: &str| volumes.iter().find(|v| v["name"] == name).cloned();
    assert_eq!(
        volume("postgres").map(|v| v["secret"]["secretName"].clone()),
        Some("petstore-postgres".into())
    );
    let mut names: Vec<&str> = volumes.iter().filter_map(|v| v["name"].as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["postgres", "tls", "token-issuer"], "{volumes:?}");
    let budget = cp.kubectl(&[
        "get",
        "pdb",
        "petstore",
        "-n",
        "petstore",
        "-o",
        "jsonpath={.spec.minAvailable}",
    ])?;
    assert_eq!(budget, "1");
    Ok(())
}
