//! The in-place upgrade from the previous release (built from a pinned
//! commit, see `fixtures::previous_release`) to this tree, and the rollback,
//! on the real API server with a durable store holding 500 Ready Pets: the
//! upgrade writes to the store only each record's identity, once, and
//! rewrites each Pet exactly once (the storage migration, counted in etcd),
//! the rollback's operator runs,
//! leads, fails its conversions and writes nothing, and no record is lost or
//! duplicated.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use fixtures::env::{OPERATOR_ACCOUNT, OPERATOR_NAMESPACE};
use fixtures::petstore::grpcurl;
use fixtures::previous_release::PreviousRelease;
use fixtures::{
    ControlPlane, Operator, OperatorOptions, Process, cargo_bin, free_port, repo_root, wait_for,
};
use petstore_operator::crd::v1alpha1::Pet;
use serde_json::Value;

use crate::typed::status_is_ready;

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
/// Where the API server keeps [`NAMESPACE`]'s Pets in etcd.
const ETCD_PETS: &str = "/registry/petstore.example.com/pets/herd/";
/// The leader Lease, in both releases.
const LEASE: &str = "petstore-operator";

/// What the upgrade may do to the Pets stored in the API server.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum PetRewrites {
    /// Nothing: every Pet keeps its resourceVersion.
    None,
    /// A documented storage-version migration rewrites every Pet (a new
    /// resourceVersion), changing nothing else a client can read; that it
    /// is once each is counted in etcd ([`assert_migrated_once`]).
    StorageMigration,
}

/// The upgrade from the previous release makes v1 the storage version: the
/// new operator rewrites every Pet once in it (see docs/upgrading.md).
const UPGRADE_REWRITES: PetRewrites = PetRewrites::StorageMigration;

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
        fixtures::petstore::write_rpcs_answered(&self.metrics_addr)
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
        let command = options.command(binary, &metrics_addr);
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

    /// `result`'s value, or a panic with its error and this operator's log.
    fn or_log_tail<T>(&mut self, result: fixtures::Result<T>) -> T {
        result.unwrap_or_else(|err| panic!("{err}\n{}", self.process().log_tail(40)))
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
        Ok(fixtures::http::sum_series(
            &self.metrics()?,
            "petstore_operator_store_actions_total",
            "",
        ))
    }

    fn reconciles(&self) -> fixtures::Result<f64> {
        Ok(fixtures::http::sum_series(
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
    // The Plan column's field at its default, which the API server fills on
    // every read under the new CRD: not a change (a write would still show
    // as a new resourceVersion).
    if let Some(status) = pet["status"].as_object_mut()
        && status.get("pendingPlan").is_some_and(|plan| plan == "none")
    {
        status.remove("pendingPlan");
    }
    pet
}

/// A Pet read in v1alpha1 (the version both releases serve), typed for
/// its status, which is the same in every version.
fn typed_pet(key: &str, pet: &Value) -> Pet {
    serde_json::from_value(pet.clone()).unwrap_or_else(|e| panic!("{key}: not a Pet: {e}"))
}

/// `status.id`, when set.
fn status_id(pet: &Pet) -> Option<&str> {
    pet.status.as_ref()?.id.as_deref()
}

/// A Pet as etcd holds it.
#[derive(Debug)]
struct StoredPet {
    /// Writes to the key since it was created (etcd's `version`).
    writes: u64,
    /// The etcd revision of its last write: the Pet's resourceVersion.
    mod_revision: String,
    /// The version it is stored in.
    api_version: String,
}

/// Every Pet of [`NAMESPACE`] as etcd holds it, by `namespace/name`, read
/// from etcd's JSON gateway: the API server's writes, whoever asked for
/// them, and the version each Pet is stored in.
fn stored_pets(cp: &ControlPlane) -> fixtures::Result<BTreeMap<String, StoredPet>> {
    use std::io::{Read, Write};
    let bad = |what: String| fixtures::Error::Command {
        command: format!("etcd range {ETCD_PETS}"),
        status: "unexpected answer".into(),
        stderr: what,
    };
    // The prefix's range: up to the prefix with its last byte incremented.
    let end = format!("{}0", ETCD_PETS.trim_end_matches('/'));
    let body = serde_json::json!({
        "key": base64_encode(ETCD_PETS.as_bytes()),
        "range_end": base64_encode(end.as_bytes()),
    })
    .to_string();
    let mut stream =
        std::net::TcpStream::connect(cp.etcd_addr()).map_err(fixtures::io("connecting to etcd"))?;
    write!(
        stream,
        "POST /v3/kv/range HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .map_err(fixtures::io("asking etcd"))?;
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .map_err(fixtures::io("reading etcd's answer"))?;
    let json = response
        .split_once("\r\n\r\n")
        .and_then(|(_, json)| serde_json::from_str::<Value>(json).ok())
        .ok_or_else(|| bad(response.chars().take(300).collect()))?;
    let text = |kv: &Value, field: &str| -> fixtures::Result<String> {
        kv[field]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| bad(format!("no {field} in {kv}")))
    };
    let decode = |kv: &Value, field: &str| -> fixtures::Result<Vec<u8>> {
        base64_decode(&text(kv, field)?).ok_or_else(|| bad(format!("{field} is not base64")))
    };
    let mut pets = BTreeMap::new();
    for kv in json["kvs"].as_array().into_iter().flatten() {
        let key = String::from_utf8_lossy(&decode(kv, "key")?).into_owned();
        let name = key.strip_prefix(ETCD_PETS).unwrap_or(&key);
        let value: Value = serde_json::from_slice(&decode(kv, "value")?)
            .map_err(|err| bad(format!("{key} is not JSON: {err}")))?;
        let writes = text(kv, "version")?;
        let stored = StoredPet {
            writes: writes
                .parse()
                .map_err(|_| bad(format!("{key}: version {writes}")))?,
            mod_revision: text(kv, "mod_revision")?,
            api_version: value["apiVersion"].as_str().unwrap_or_default().to_owned(),
        };
        pets.insert(format!("{NAMESPACE}/{name}"), stored);
    }
    Ok(pets)
}

/// The storage migration wrote every Pet exactly once, in v1: one more
/// write per key in etcd, that write being the resourceVersion `pets`
/// (read afterwards) show.
fn assert_migrated_once(
    before: &BTreeMap<String, StoredPet>,
    after: &BTreeMap<String, StoredPet>,
    pets: &BTreeMap<String, Value>,
) {
    assert_eq!(
        after.keys().collect::<Vec<_>>(),
        before.keys().collect::<Vec<_>>(),
        "the Pets in etcd"
    );
    for (key, stored) in after {
        let old = &before[key];
        assert_eq!(
            stored.writes,
            old.writes + 1,
            "{key}: etcd's write count went from {} to {}, not up by one",
            old.writes,
            stored.writes
        );
        assert_eq!(
            stored.api_version, "petstore.example.com/v1",
            "{key}: not stored as v1"
        );
        assert_eq!(
            pets.get(key).map(|pet| &pet["metadata"]["resourceVersion"]),
            Some(&Value::from(stored.mod_revision.as_str())),
            "{key}: the API server shows another write than etcd's last"
        );
    }
}

const BASE64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn base64_encode(bytes: &[u8]) -> String {
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            out.push(if i <= chunk.len() {
                char::from(BASE64[(n >> (18 - 6 * i) & 63) as usize])
            } else {
                '='
            });
        }
    }
    out
}

fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let (mut bits, mut count) = (0u32, 0);
    for c in text.bytes().take_while(|&c| c != b'=') {
        let value = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        };
        bits = bits << 6 | u32::from(value);
        count += 6;
        if count >= 8 {
            count -= 8;
            out.push((bits >> count) as u8);
            bits &= (1 << count) - 1;
        }
    }
    Some(out)
}

/// `kubectl -v=6 args...` with `input` on stdin, expected to fail: the
/// error, and each request it sent for a Pet as `VERB status`, so a test
/// can tell which request was refused.
fn kubectl_refused(
    cp: &ControlPlane,
    args: &[&str],
    input: &str,
) -> fixtures::Result<(String, Vec<String>)> {
    let mut verbose = vec!["-v=6"];
    verbose.extend_from_slice(args);
    let err = match cp.kubectl_stdin(&verbose, input) {
        Ok(out) => panic!("kubectl {} went through: {out}", args.join(" ")),
        Err(err) => err.to_string(),
    };
    // kubectl 1.34 logs each response as
    // `"Response" verb="PATCH" url="https://.../pets/pet-000?..." status="500 ..."`.
    let field = |line: &str, name: &str| -> Option<String> {
        let rest = line.split_once(&format!("{name}=\""))?.1;
        Some(rest.split_once('"')?.0.to_owned())
    };
    let requests = err
        .lines()
        .filter(|line| line.contains("\"Response\""))
        .filter_map(|line| {
            let url = field(line, "url")?;
            let path = url.split('?').next().unwrap_or_default();
            // A Pet or the Pets, not the group's OpenAPI (`/apis/petstore...`).
            (path.ends_with("/pets") || path.contains("/pets/")).then(|| {
                let verb = field(line, "verb").unwrap_or_default();
                let status = field(line, "status").unwrap_or_default();
                format!("{verb} {status}")
            })
        })
        .collect();
    Ok((err, requests))
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
            let pet = typed_pet(key, pet);
            assert!(
                status_is_ready(pet.status.as_ref(), pet.metadata.generation),
                "{key} not Ready: {:?}",
                pet.status
            );
            let id = status_id(&pet).unwrap_or_default();
            let record = self.records.iter().find(|r| r["id"] == id);
            let record = record.unwrap_or_else(|| panic!("{key}: no record {id}"));
            assert_eq!(
                record["idempotencyKey"].as_str(),
                pet.metadata.uid.as_deref(),
                "{key}: record {id} is not keyed by the Pet's UID"
            );
        }
    }

    /// Every record carries its Pet's `<namespace>/<name>` as identity
    /// (`given`), or none (made before identities).
    fn assert_identities(&self, given: bool) {
        for (key, pet) in &self.pets {
            let id = status_id(&typed_pet(key, pet))
                .unwrap_or_default()
                .to_owned();
            let record = self.records.iter().find(|r| r["id"] == id);
            let identity = record.map(|r| r["identity"].as_str().unwrap_or_default());
            let namespace = pet["metadata"]["namespace"].as_str().unwrap_or_default();
            let name = pet["metadata"]["name"].as_str().unwrap_or_default();
            let expected = if given {
                format!("{namespace}/{name}")
            } else {
                String::new()
            };
            assert_eq!(identity, Some(expected.as_str()), "{key}: record {id}");
        }
    }

    /// The same records byte for byte (apart from an identity given,
    /// `identities_given`), and the same Pets, allowing only `rewrites`.
    fn assert_unchanged_since(&self, before: &Snapshot, rewrites: PetRewrites, what: &str) {
        self.assert_records_since(before, rewrites, false, what);
    }

    fn assert_records_since(
        &self,
        before: &Snapshot,
        rewrites: PetRewrites,
        identities_given: bool,
        what: &str,
    ) {
        let render = |records: &[Value]| {
            records
                .iter()
                .map(|record| {
                    let mut record = record.clone();
                    if identities_given && let Some(fields) = record.as_object_mut() {
                        fields.remove("identity");
                    }
                    record.to_string()
                })
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
            // What clients read is still compared above.
            PetRewrites::StorageMigration => assert_eq!(
                rewritten,
                self.pets.len(),
                "{what}: every Pet must be rewritten (a new resourceVersion)"
            ),
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
        let ready = |(key, pet): (&String, &Value)| {
            let pet = typed_pet(key, pet);
            status_is_ready(pet.status.as_ref(), pet.metadata.generation)
        };
        (pets.len() == count && pets.iter().all(ready)).then_some(())
    })
}

/// Waits until `operator` has reconciled every Pet once, then watches it
/// for [`QUIET_WINDOW`]: neither it nor `store` may write meanwhile.
fn assert_quiet(operator: &mut RunningOperator, store: &Store, pets: usize, what: &str) {
    assert_writes_then_quiet(operator, store, pets, 0, what);
}

/// As [`assert_quiet`], once `operator` has made exactly `claims` store
/// writes, each a claim (one compare-and-set), and the store answered as
/// many write calls: then neither may write more.
fn assert_writes_then_quiet(
    operator: &mut RunningOperator,
    store: &Store,
    pets: usize,
    claims: usize,
    what: &str,
) {
    let claims = claims as f64;
    let written = wait_for(READY_TIMEOUT, &format!("{what}: {claims} claims"), || {
        let metrics = operator.metrics().ok()?;
        let claimed = fixtures::http::sum_series(
            &metrics,
            "petstore_operator_store_actions_total",
            "action=\"claim\"",
        );
        (claimed >= claims).then_some(())
    });
    operator.or_log_tail(written);
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
    operator.or_log_tail(seen);
    let until = Instant::now() + QUIET_WINDOW;
    while Instant::now() < until {
        let actions = operator.store_actions().unwrap_or(f64::NAN);
        assert_eq!(actions, claims, "{what}: the operator's store writes");
        let writes = store.writes().unwrap_or(f64::NAN);
        assert_eq!(writes, claims, "{what}: the store's write calls");
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn upgrading_from_the_previous_release_and_back_writes_nothing_and_loses_nothing()
-> fixtures::Result<()> {
    let started = Instant::now();
    let previous = PreviousRelease::get()?;
    let built = started.elapsed();

    let mut cp = ControlPlane::start()?;
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
        petstore_timeout: "2s",
        fault: None,
        log_filter: "info",
        extra_args: Vec::new(),
    };
    let data_file = dir.join("petstore.redb");
    let store_log = dir.join("petstore.log");
    let start_store =
        |binary: &Path| Store::start(binary, &options.store_addr, &data_file, &store_log);
    // The previous release's operator, logging to <identity>.log.
    let start_previous = |identity: &str| {
        let options = OperatorOptions {
            identity: identity.into(),
            ..options.clone()
        };
        let log = dir.join(format!("{identity}.log"));
        RunningOperator::previous(&previous.bin("petstore-operator"), &options, &log)
    };
    // This tree's operator, serving the conversion webhook.
    let start_current = |identity: &str| {
        let options = OperatorOptions {
            identity: identity.into(),
            extra_args: fixtures::env::webhook_args()?,
            ..options.clone()
        };
        RunningOperator::current(&options, &dir.join(format!("{identity}.log")))
    };

    // The previous release, with 500 Ready Pets.
    let mut store = start_store(&previous.bin("petstore-server"))?;
    let mut operator = start_previous("operator-previous")?;
    let creating = Instant::now();
    create_pets(&cp)?;
    wait_all_ready(&cp, PETS)?;
    let created = creating.elapsed();
    // The counters the upgrade must leave at zero count these writes, so a
    // zero later means nothing was written, not that nothing was counted.
    // Counted when the create makes a record, so at most once per Pet: a
    // create whose answer was lost under load (a client timeout) is found
    // again by its key on the retry, and not counted then.
    let creates = operator.store_actions()?;
    assert!(
        creates > 0.0 && creates <= PETS as f64,
        "{creates} creates counted for {PETS} Pets"
    );
    assert!(store.writes()? >= PETS as f64, "{}", store.writes()?);

    // The upgrade: the operator stopped, the new CRD, the new store on the
    // same data, the new operator. What it starts from is read once the old
    // operator has stopped: a status write of its own could still land
    // after every Pet showed Ready.
    let upgrading = Instant::now();
    operator.stop();
    let before = Snapshot::take(&cp, &store)?;
    before.assert_consistent(PETS);
    // Stored as v1alpha1, so the upgrade's migration has each to rewrite.
    let stored_before = stored_pets(&cp)?;
    assert_eq!(stored_before.len(), PETS, "Pets in etcd");
    for (key, stored) in &stored_before {
        assert_eq!(
            stored.api_version, "petstore.example.com/v1alpha1",
            "{key} before the upgrade"
        );
    }
    cp.kubectl(&["apply", "-k", &config.join("crd").to_string_lossy()])?;
    cp.kubectl(&established)?;
    store.stop();
    let mut store = start_store(&cargo_bin("petstore-server")?)?;
    let mut operator = start_current("operator-current")?;
    // Records made before identities get their Pet's, once each (see
    // docs/upgrading.md); nothing else is written.
    assert_writes_then_quiet(&mut operator, &store, PETS, PETS, "upgrade");
    // The new leader's storage migration: every Pet stored as v1, and the
    // CRD lists v1 alone.
    let stored = wait_for(
        Duration::from_secs(120),
        "status.storedVersions [v1]",
        || {
            let crd = cp
                .get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/pets.petstore.example.com")
                .ok()?;
            let versions = &crd["status"]["storedVersions"];
            (*versions == serde_json::json!(["v1"])).then(|| versions.to_string())
        },
    );
    operator.or_log_tail(stored);
    let upgraded = Snapshot::take(&cp, &store)?;
    upgraded.assert_consistent(PETS);
    before.assert_identities(false);
    upgraded.assert_identities(true);
    upgraded.assert_records_since(&before, UPGRADE_REWRITES, true, "upgrade");
    // Each Pet written once in etcd, and by the migration, which counted
    // every one as rewritten and finished once.
    assert_migrated_once(&stored_before, &stored_pets(&cp)?, &upgraded.pets);
    // The Plan column's field, which the previous release never wrote and
    // this one did not write either (quiet, above), reads its default.
    let columns = cp.kubectl(&[
        "get",
        "pets.v1.petstore.example.com",
        "-n",
        NAMESPACE,
        "-o",
        "jsonpath={.items[*].status.pendingPlan}",
    ])?;
    let plans: Vec<&str> = columns.split_whitespace().collect();
    assert_eq!(plans.len(), PETS, "{columns}");
    assert!(plans.iter().all(|plan| *plan == "none"), "{columns}");
    let metrics = operator.metrics()?;
    assert_eq!(
        fixtures::http::sum_series(
            &metrics,
            "petstore_operator_storage_migration_pets_total",
            "outcome=\"rewritten\""
        ),
        PETS as f64,
        "Pets the migration rewrote"
    );
    assert_eq!(
        fixtures::http::sum_series(
            &metrics,
            "petstore_operator_storage_migrations_total",
            "result=\"done\""
        ),
        1.0,
        "migrations done"
    );
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
    // The write is a create, which sends no read first (`kubectl patch`
    // and `annotate` GET the Pet first, and that read is refused already):
    // its only request for a Pet is the write, and it is the one refused.
    let listed = cp.kubectl(&["get", "pets.v1.petstore.example.com", "-A", "-o", "name"])?;
    assert_eq!(listed.lines().count(), PETS + 2, "v1 with the webhook down");
    let listed = cp.kubectl(&["get", PETS_RESOURCE, "-A", "-o", "name"])?;
    assert_eq!(
        listed.lines().count(),
        PETS + 2,
        "v1alpha1 from the watch cache with the webhook down"
    );
    let (err, requests) = kubectl_refused(&cp, &["create", "-f", "-"], &pet_yaml(PETS))?;
    assert_eq!(requests, ["POST 500 Internal Server Error"], "{err}");
    assert!(err.contains("conversion webhook"), "create: {err}");
    // Nothing was written.
    let refused_pet = format!("pet-{PETS:03}");
    let found = cp.kubectl(&[
        "get",
        "pets.v1.petstore.example.com",
        &refused_pet,
        "-n",
        NAMESPACE,
        "--ignore-not-found",
    ])?;
    assert_eq!(found.trim(), "", "the refused create made a Pet");
    store.stop();
    let mut store = start_store(&previous.bin("petstore-server"))?;
    let mut operator = start_previous("operator-rollback")?;
    // It runs and leads: the Lease names it.
    let leading = wait_for(
        Duration::from_secs(60),
        "the previous operator to hold the Lease",
        || {
            let lease = cp
                .get(&format!(
                    "/apis/coordination.k8s.io/v1/namespaces/{OPERATOR_NAMESPACE}/leases/{LEASE}"
                ))
                .ok()?;
            // The process sets its gauge just after its Lease write lands;
            // under load a scrape can fall between the two.
            let metrics = operator.metrics().ok()?;
            (lease["spec"]["holderIdentity"] == "operator-rollback"
                && fixtures::http::sum_series(&metrics, "petstore_operator_leader", "") == 1.0)
                .then_some(())
        },
    );
    operator.or_log_tail(leading);
    // While the API server's watch cache holds every Pet converted, its
    // list and watch are answered from there and it finds nothing to do:
    // it writes nothing, still running and leading.
    let until = Instant::now() + QUIET_WINDOW;
    while Instant::now() < until {
        assert!(
            operator.process().is_running(),
            "the previous operator exited: {}",
            operator.process().log_tail(40)
        );
        let metrics = operator.metrics()?;
        assert_eq!(
            fixtures::http::sum_series(&metrics, "petstore_operator_leader", ""),
            1.0,
            "rollback: the previous operator leads"
        );
        assert_eq!(
            operator.store_actions()?,
            0.0,
            "rollback: the previous operator wrote to the store"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    operator.stop();
    // An API server restart (as in any cluster upgrade) empties that cache:
    // then its reads of v1alpha1 need the new operator's conversion
    // webhook, which is gone. They are answered 500 naming the webhook, and
    // it refuses to start, saying so.
    cp.restart_apiserver(&[])?;
    let mut operator = start_previous("operator-rollback-restarted")?;
    let refused = wait_for(
        Duration::from_secs(60),
        "the previous operator's reads answered 500 naming the webhook",
        || {
            let log = std::fs::read_to_string(operator.process().log_path()).ok()?;
            log.lines()
                .any(|line| line.contains("conversion webhook") && line.contains("code: 500"))
                .then_some(())
        },
    );
    operator.or_log_tail(refused);
    operator.stop();
    assert_eq!(store.writes()?, 0.0, "rollback: the store was written");
    store.stop();
    let store = start_store(&cargo_bin("petstore-server")?)?;
    let mut operator = start_current("operator-forward")?;
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
