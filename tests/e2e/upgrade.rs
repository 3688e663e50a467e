//! The in-place upgrade from the previous release (built from a pinned
//! commit, see `fixtures::previous_release`) to this tree, and the rollback,
//! on the real API server with a durable store holding 500 Ready Pets: the
//! upgrade and the rollback write nothing, neither to the store nor to the
//! Pets, and lose or duplicate no record.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use fixtures::env::{OPERATOR_ACCOUNT, OPERATOR_NAMESPACE, is_ready};
use fixtures::petstore::grpcurl;
use fixtures::previous_release::PreviousRelease;
use fixtures::{
    ControlPlane, Operator, OperatorOptions, Process, cargo_bin, free_port, repo_root, wait_for,
};
use serde_json::Value;

const NAMESPACE: &str = "herd";
const PETS: usize = 500;
/// Pets created at once (one kubectl apply each).
const CREATORS: usize = 16;
const READY_TIMEOUT: Duration = Duration::from_secs(300);
/// After an operator has reconciled every Pet once, how long it is watched
/// for writes: several drift polls (`poll_interval` of the options, 2 s).
const QUIET_WINDOW: Duration = Duration::from_secs(8);
/// Every Pet name, as the API server lists them.
const PETS_RESOURCE: &str = "pets.v1alpha1.petstore.example.com";

/// What the upgrade may do to the Pets stored in the API server.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum PetRewrites {
    /// Nothing: every Pet keeps its resourceVersion.
    None,
    /// A documented storage-version migration rewrites each Pet once (a
    /// new resourceVersion), changing nothing else a client can read.
    StorageMigration,
}

/// The upgrade from the previous release makes v1 the storage version: the
/// new operator rewrites every Pet once in it (see docs/upgrading.md).
const UPGRADE_REWRITES: PetRewrites = PetRewrites::StorageMigration;

/// The store's RPCs that write.
const STORE_WRITES: [&str; 4] = ["AddPets", "UpdatePets", "DeletePets", "SetIdempotencyKeys"];

/// A durable store process on a fixed address, so operators find it again
/// after a restart with another binary, as through a Service.
struct Store {
    process: Process,
    addr: String,
    metrics_addr: String,
}

impl Store {
    fn start(binary: &Path, addr: &str, data_file: &Path, log: &Path) -> fixtures::Result<Self> {
        let metrics_addr = format!("127.0.0.1:{}", free_port()?);
        let mut command = Command::new(binary);
        command
            .args(["--listen", addr, "--storage", "durable", "--data-file"])
            .arg(data_file)
            .args(["--metrics-listen", &metrics_addr]);
        let mut process = Process::spawn("petstore-server", command, log)?;
        wait_for(Duration::from_secs(30), "the pet store SERVING", || {
            assert!(
                process.is_running(),
                "the pet store exited:\n{}",
                process.log_tail(20)
            );
            grpcurl(addr, "grpc.health.v1.Health/Check", "{}")
                .ok()
                .filter(|out| out.first().is_some_and(|v| v["status"] == "SERVING"))
        })?;
        Ok(Self {
            process,
            addr: addr.to_owned(),
            metrics_addr,
        })
    }

    /// The store's write RPCs answered since it started, by its /metrics.
    fn writes(&self) -> fixtures::Result<f64> {
        let metrics = fixtures::http::scrape(&self.metrics_addr)?;
        Ok(STORE_WRITES
            .iter()
            .map(|method| {
                sum_series(
                    &metrics,
                    "petstore_server_rpc_duration_seconds_count",
                    &format!("method=\"{method}\""),
                )
            })
            .sum())
    }

    /// Every record, sorted by ID, one JSON line each, as SearchPets gives
    /// them.
    fn records(&self) -> fixtures::Result<Vec<Value>> {
        let mut records = grpcurl(&self.addr, "petstore.PetStore/SearchPets", "{}")?;
        records.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
        Ok(records)
    }

    fn stop(&mut self) {
        self.process.terminate(Duration::from_secs(10));
    }
}

/// An operator of either release, and where its metrics are.
struct RunningOperator {
    release: Release,
    metrics_addr: String,
}

enum Release {
    Previous(Process),
    Current(Operator),
}

impl RunningOperator {
    /// The previous release's operator binary, with the flags of that
    /// release (`Operator::start` follows this tree's).
    fn previous(binary: &Path, options: &OperatorOptions, log: &Path) -> fixtures::Result<Self> {
        let metrics_addr = format!("127.0.0.1:{}", free_port()?);
        let mut command = Command::new(binary);
        command
            .env("KUBECONFIG", &options.kubeconfig)
            .env("RUST_LOG", options.log_filter)
            .args(["--petstore-addr", &options.store_addr])
            .args(["--metrics-addr", &metrics_addr])
            .args(["--poll-interval", options.poll_interval])
            .args(["--backoff-base", "200ms", "--backoff-max"])
            .arg(options.backoff_max)
            .args(["--petstore-timeout", "2s"])
            .args(["--lease-namespace", &options.lease_namespace])
            .args(["--lease-duration", "4s"])
            .args(["--identity", &options.identity])
            .arg(format!("--leader-election={}", options.leader_election));
        Ok(Self {
            release: Release::Previous(Process::spawn(&options.identity, command, log)?),
            metrics_addr,
        })
    }

    /// This tree's operator, started as every other test starts it.
    fn current(options: &OperatorOptions, log: &Path) -> fixtures::Result<Self> {
        let operator = Operator::start(options, log)?;
        Ok(Self {
            metrics_addr: operator.metrics_addr.clone(),
            release: Release::Current(operator),
        })
    }

    fn process(&mut self) -> &mut Process {
        match &mut self.release {
            Release::Previous(process) => process,
            Release::Current(operator) => operator.process(),
        }
    }

    fn metrics(&self) -> fixtures::Result<String> {
        fixtures::http::scrape(&self.metrics_addr)
    }

    /// `petstore_operator_store_actions_total`, every action and cause.
    fn store_actions(&self) -> fixtures::Result<f64> {
        Ok(sum_series(
            &self.metrics()?,
            "petstore_operator_store_actions_total",
            "",
        ))
    }

    fn reconciles(&self) -> fixtures::Result<f64> {
        Ok(sum_series(
            &self.metrics()?,
            "petstore_operator_reconciles_total",
            "",
        ))
    }

    /// Like a rolling update: SIGTERM, then the grace period.
    fn stop(&mut self) {
        self.process().terminate(Duration::from_secs(10));
    }
}

/// The sum of every sample of `name` whose labels contain `label`.
fn sum_series(metrics: &str, name: &str, label: &str) -> f64 {
    metrics
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            let (labels, value) = match rest.strip_prefix('{') {
                Some(rest) => rest.split_once("} ")?,
                None => ("", rest.strip_prefix(' ')?),
            };
            labels
                .contains(label)
                .then(|| value.trim().parse::<f64>().ok())?
        })
        .sum()
}

/// Every Pet in every namespace, read as v1alpha1, by `namespace/name`.
fn pets(cp: &ControlPlane) -> fixtures::Result<BTreeMap<String, Value>> {
    let list = cp.kubectl_json(&["get", PETS_RESOURCE, "-A"])?;
    Ok(list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|pet| {
            let key = format!(
                "{}/{}",
                pet["metadata"]["namespace"].as_str().unwrap_or_default(),
                pet["metadata"]["name"].as_str().unwrap_or_default()
            );
            (key, pet.clone())
        })
        .collect())
}

/// A Pet without what a storage rewrite may change: its resourceVersion
/// and the managed-fields bookkeeping.
fn readable(pet: &Value) -> Value {
    let mut pet = pet.clone();
    if let Some(metadata) = pet["metadata"].as_object_mut() {
        metadata.remove("resourceVersion");
        metadata.remove("managedFields");
    }
    pet
}

/// What the test compares before and after a change of binaries.
struct Snapshot {
    pets: BTreeMap<String, Value>,
    records: Vec<Value>,
}

impl Snapshot {
    fn take(cp: &ControlPlane, store: &Store) -> fixtures::Result<Self> {
        Ok(Self {
            pets: pets(cp)?,
            records: store.records()?,
        })
    }

    /// Every Pet Ready with an ID, and exactly one record per Pet, keyed by
    /// the Pet's UID and named by its status.id.
    fn assert_consistent(&self, expected_pets: usize) {
        assert_eq!(self.pets.len(), expected_pets, "Pets in the API server");
        assert_eq!(self.records.len(), expected_pets, "records in the store");
        let keys: BTreeSet<&str> = self
            .records
            .iter()
            .filter_map(|r| r["idempotencyKey"].as_str())
            .collect();
        assert_eq!(keys.len(), expected_pets, "one record per UID key");
        for (key, pet) in &self.pets {
            assert!(is_ready(pet), "{key} not Ready: {}", pet["status"]);
            let id = pet["status"]["id"].as_str().unwrap_or_default();
            let record = self.records.iter().find(|r| r["id"] == id);
            let record = record.unwrap_or_else(|| panic!("{key}: no record {id}"));
            assert_eq!(
                record["idempotencyKey"], pet["metadata"]["uid"],
                "{key}: record {id} is not keyed by the Pet's UID"
            );
        }
    }

    /// The same records byte for byte, and the same Pets, allowing only
    /// `rewrites`.
    fn assert_unchanged_since(&self, before: &Snapshot, rewrites: PetRewrites, what: &str) {
        let render = |records: &[Value]| {
            records
                .iter()
                .map(Value::to_string)
                .collect::<Vec<_>>()
                .join("\n")
        };
        assert_eq!(
            render(&self.records),
            render(&before.records),
            "{what}: the store's records changed"
        );
        assert_eq!(
            self.pets.keys().collect::<Vec<_>>(),
            before.pets.keys().collect::<Vec<_>>(),
            "{what}: Pets appeared or vanished"
        );
        let mut rewritten = 0;
        for (key, pet) in &self.pets {
            let old = &before.pets[key];
            assert_eq!(readable(pet), readable(old), "{what}: {key} changed");
            if pet["metadata"]["resourceVersion"] != old["metadata"]["resourceVersion"] {
                rewritten += 1;
            }
        }
        match rewrites {
            PetRewrites::None => assert_eq!(
                rewritten, 0,
                "{what}: {rewritten} Pets written (a new resourceVersion)"
            ),
            // A new resourceVersion is allowed; what clients read is
            // still compared above.
            PetRewrites::StorageMigration => {}
        }
    }
}

fn pet_yaml(n: usize) -> String {
    let kind = ["dog", "cat", "bird", "reptile"][n % 4];
    format!(
        "---\napiVersion: petstore.example.com/v1alpha1\nkind: Pet\nmetadata:\n  name: pet-{n:03}\n  namespace: {NAMESPACE}\nspec:\n  name: Animal {n}\n  type: {kind}\n  birthday: 2020-01-{:02}T00:00:00Z\n",
        n % 28 + 1
    )
}

/// Creates the Pets, [`CREATORS`] kubectl applies at a time.
fn create_pets(cp: &ControlPlane) -> fixtures::Result<()> {
    let per_creator = PETS.div_ceil(CREATORS);
    std::thread::scope(|scope| {
        let creators: Vec<_> = (0..PETS)
            .step_by(per_creator)
            .map(|first| {
                scope.spawn(move || {
                    let yaml: String = (first..(first + per_creator).min(PETS))
                        .map(pet_yaml)
                        .collect();
                    cp.kubectl_stdin(&["apply", "-f", "-"], &yaml)
                })
            })
            .collect();
        for creator in creators {
            match creator.join() {
                Ok(result) => {
                    result?;
                }
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        Ok(())
    })
}

/// Waits until `count` Pets are Ready.
fn wait_all_ready(cp: &ControlPlane, count: usize) -> fixtures::Result<()> {
    wait_for(READY_TIMEOUT, &format!("{count} Pets Ready"), || {
        let pets = pets(cp).ok()?;
        (pets.len() == count && pets.values().all(is_ready)).then_some(())
    })
}

/// Waits until `operator` has reconciled every Pet once, then watches it
/// for [`QUIET_WINDOW`]: neither it nor `store` may write meanwhile.
fn assert_quiet(operator: &mut RunningOperator, store: &Store, pets: usize, what: &str) {
    let seen = wait_for(
        READY_TIMEOUT,
        &format!("{what}: the operator to reconcile every Pet"),
        || {
            operator
                .reconciles()
                .ok()
                .filter(|&n| n >= pets as f64)
                .map(drop)
        },
    );
    if let Err(err) = seen {
        panic!("{err}\n{}", operator.process().log_tail(40));
    }
    let until = Instant::now() + QUIET_WINDOW;
    while Instant::now() < until {
        let actions = operator.store_actions().unwrap_or(f64::NAN);
        assert_eq!(actions, 0.0, "{what}: the operator wrote to the store");
        let writes = store.writes().unwrap_or(f64::NAN);
        assert_eq!(writes, 0.0, "{what}: the store was written");
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn upgrading_from_the_previous_release_and_back_writes_nothing_and_loses_nothing()
-> fixtures::Result<()> {
    let started = Instant::now();
    let previous = PreviousRelease::get()?;
    let built = started.elapsed();

    let cp = ControlPlane::start()?;
    let dir = cp.dir().to_path_buf();
    let config = repo_root().join("config");
    // The previous release's CRD, and the RBAC of this tree (both releases
    // ask for the same).
    cp.kubectl(&["apply", "-f", &previous.crd().to_string_lossy()])?;
    cp.ensure_namespace(OPERATOR_NAMESPACE)?;
    cp.kubectl(&["apply", "-k", &config.join("rbac").to_string_lossy()])?;
    let established = [
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/pets.petstore.example.com",
    ];
    cp.kubectl(&established)?;
    cp.ensure_namespace(NAMESPACE)?;
    let options = OperatorOptions {
        kubeconfig: cp.service_account_kubeconfig(OPERATOR_NAMESPACE, OPERATOR_ACCOUNT)?,
        store_addr: format!("127.0.0.1:{}", free_port()?),
        leader_election: true,
        lease_namespace: OPERATOR_NAMESPACE.into(),
        identity: "operator".into(),
        poll_interval: "2s",
        backoff_max: "2s",
        fault: None,
        log_filter: "info",
        extra_args: Vec::new(),
    };
    let data_file = dir.join("petstore.redb");
    let store_log = dir.join("petstore.log");
    let previous_options = |identity: &str| OperatorOptions {
        identity: identity.into(),
        ..options.clone()
    };

    // The previous release, with 500 Ready Pets.
    let mut store = Store::start(
        &previous.bin("petstore-server"),
        &options.store_addr,
        &data_file,
        &store_log,
    )?;
    let mut operator = RunningOperator::previous(
        &previous.bin("petstore-operator"),
        &previous_options("operator-previous"),
        &dir.join("operator-previous.log"),
    )?;
    let creating = Instant::now();
    create_pets(&cp)?;
    wait_all_ready(&cp, PETS)?;
    let created = creating.elapsed();
    let before = Snapshot::take(&cp, &store)?;
    before.assert_consistent(PETS);
    // The counters the upgrade must leave at zero count these writes, so a
    // zero later means nothing was written, not that nothing was counted.
    assert_eq!(operator.store_actions()?, PETS as f64, "one create per Pet");
    assert!(store.writes()? >= PETS as f64, "{}", store.writes()?);

    // The upgrade: the operator stopped, the new CRD, the new store on the
    // same data, the new operator.
    let upgrading = Instant::now();
    operator.stop();
    cp.kubectl(&["apply", "-k", &config.join("crd").to_string_lossy()])?;
    cp.kubectl(&established)?;
    store.stop();
    let mut store = Store::start(
        &cargo_bin("petstore-server")?,
        &options.store_addr,
        &data_file,
        &store_log,
    )?;
    let current_options = OperatorOptions {
        identity: "operator-current".into(),
        extra_args: fixtures::env::webhook_args()?,
        ..options.clone()
    };
    let mut operator =
        RunningOperator::current(&current_options, &dir.join("operator-current.log"))?;
    assert_quiet(&mut operator, &store, PETS, "upgrade");
    // The new leader's storage migration: every Pet stored as v1, and the
    // CRD lists v1 alone.
    let stored = wait_for(
        Duration::from_secs(120),
        "status.storedVersions [v1]",
        || {
            let versions = cp
                .kubectl(&[
                    "get",
                    "crd",
                    "pets.petstore.example.com",
                    "-o",
                    "jsonpath={.status.storedVersions}",
                ])
                .ok()?;
            (versions.trim() == r#"["v1"]"#).then_some(versions)
        },
    );
    if let Err(err) = stored {
        panic!("{err}\n{}", operator.process().log_tail(40));
    }
    let upgraded = Snapshot::take(&cp, &store)?;
    upgraded.assert_consistent(PETS);
    upgraded.assert_unchanged_since(&before, UPGRADE_REWRITES, "upgrade");
    let upgrade_took = upgrading.elapsed();

    // The book's commands still work against the new release.
    let listed = cp.kubectl(&["get", PETS_RESOURCE, "-n", NAMESPACE, "-o", "name"])?;
    assert_eq!(listed.lines().count(), PETS, "{listed}");
    let sample = config.join("samples/petstore_v1alpha1_pet.yaml");
    cp.kubectl(&["apply", "-f", &sample.to_string_lossy()])?;
    wait_all_ready(&cp, PETS + 2)?;
    let with_samples = Snapshot::take(&cp, &store)?;
    with_samples.assert_consistent(PETS + 2);

    // The rollback: the previous release's store and operator again, on
    // the new CRD. The previous operator reads v1alpha1, which only the new
    // operator's webhook converts from the stored v1: with the new operator
    // gone it refuses to start, saying why, and writes nothing. Rolling
    // forward again finds everything as it was. See docs/upgrading.md.
    let rolling_back = Instant::now();
    operator.stop();
    // The webhook down (every operator gone): the storage version lists as
    // before. A v1alpha1 list is served from the API server's watch cache,
    // which holds every Pet converted while the webhook answered (the list
    // snapshot of Kubernetes 1.34); a v1alpha1 write needs the webhook, and
    // is refused naming it. (-A: the samples are in the default namespace.)
    let listed = cp.kubectl(&["get", "pets.v1.petstore.example.com", "-A", "-o", "name"])?;
    assert_eq!(listed.lines().count(), PETS + 2, "v1 with the webhook down");
    let listed = cp.kubectl(&["get", PETS_RESOURCE, "-A", "-o", "name"])?;
    assert_eq!(
        listed.lines().count(),
        PETS + 2,
        "v1alpha1 from the watch cache with the webhook down"
    );
    let pet = format!("{PETS_RESOURCE}/pet-000");
    match cp.kubectl(&["annotate", &pet, "-n", NAMESPACE, "example.com/touched=yes"]) {
        Ok(out) => panic!("a v1alpha1 write went through with the webhook down: {out}"),
        Err(err) => assert!(
            err.to_string().contains("conversion webhook"),
            "a v1alpha1 write with the webhook down: {err}"
        ),
    }
    store.stop();
    let mut store = Store::start(
        &previous.bin("petstore-server"),
        &options.store_addr,
        &data_file,
        &store_log,
    )?;
    let mut operator = RunningOperator::previous(
        &previous.bin("petstore-operator"),
        &previous_options("operator-rollback"),
        &dir.join("operator-rollback.log"),
    )?;
    // Its reads of v1alpha1 need the new operator's conversion webhook,
    // which is gone: they are answered 500 (at start-up or later, as the
    // API server's caches allow) and retried. Whatever it manages to read,
    // it must not write.
    std::thread::sleep(QUIET_WINDOW);
    assert!(
        operator.metrics().is_err() || operator.store_actions()? == 0.0,
        "rollback: the previous operator wrote to the store"
    );
    operator.stop();
    assert_eq!(store.writes()?, 0.0, "rollback: the store was written");
    store.stop();
    let store = Store::start(
        &cargo_bin("petstore-server")?,
        &options.store_addr,
        &data_file,
        &store_log,
    )?;
    let forward_options = OperatorOptions {
        identity: "operator-forward".into(),
        extra_args: fixtures::env::webhook_args()?,
        ..options.clone()
    };
    let mut operator =
        RunningOperator::current(&forward_options, &dir.join("operator-forward.log"))?;
    assert_quiet(&mut operator, &store, PETS + 2, "roll forward");
    let rolled_back = Snapshot::take(&cp, &store)?;
    rolled_back.assert_consistent(PETS + 2);
    rolled_back.assert_unchanged_since(&with_samples, PetRewrites::None, "rollback");
    eprintln!(
        "upgrade test: previous release ready in {} s, {PETS} Pets Ready in {} s, \
         upgrade checked in {} s, rollback checked in {} s, {} s in all",
        built.as_secs(),
        created.as_secs(),
        upgrade_took.as_secs(),
        rolling_back.elapsed().as_secs(),
        started.elapsed().as_secs()
    );
    Ok(())
}
