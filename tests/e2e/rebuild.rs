//! A record outlives its cluster. Against one store, with real API servers:
//! a cluster rebuilt from the same manifests, one restored with its Pets'
//! old status, and a Pet deleted with Orphan and applied again all find
//! their records by namespace and name: new UIDs, no create, no duplicate,
//! the same IDs. Two clusters on one store, each its own installation,
//! never write each other's records: a Pet of the same name in both is held
//! in the later one, naming the other installation. A handover moves the
//! records from one live cluster to the other under users' edits, and
//! survives `kill -9` of blue's operator between its releases and their
//! status, and of green's before its claims or in the middle of them (each
//! kill at a point a fault holds the operator at, checked in the store);
//! a record that waits for a Pet the new cluster lacks holds up no other,
//! and its Pet takes it back when the handover is cancelled. Every count
//! is the store's own.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use fixtures::env::pet_manifest;
use fixtures::{ControlPlane, Env, Operator, Storage, wait_for};
use petstore_operator::crd::Pet;
use serde_json::Value;

use crate::typed::{self, is_ready};

const TIMEOUT: Duration = Duration::from_secs(90);
const PETS: usize = 10;

fn spec(name: &str, extra: &str) -> String {
    format!("\n  name: {name}\n  type: dog\n  birthday: \"2021-04-01\"{extra}")
}

/// The manifests a team keeps in Git: `PETS` Pets, the last one kept on
/// deletion (Orphan).
fn manifests() -> String {
    (0..PETS)
        .map(|i| {
            let extra = if i == PETS - 1 {
                "\n  deletionPolicy: Orphan"
            } else {
                ""
            };
            pet_manifest(&format!("pet-{i}"), &[], &spec(&format!("Pet {i}"), extra))
        })
        .collect::<Vec<_>>()
        .join("---\n")
}

/// Every Pet in `default`, by name.
pub(crate) fn pets(cp: &ControlPlane) -> fixtures::Result<BTreeMap<String, Pet>> {
    Ok(typed::pets(cp, Some("default"))?
        .into_iter()
        .map(|pet| (pet.metadata.name.clone().unwrap_or_default(), pet))
        .collect())
}

/// Waits until all `PETS` are Ready; their IDs by name.
fn all_ready(cp: &ControlPlane, what: &str) -> fixtures::Result<BTreeMap<String, String>> {
    all_n_ready(cp, what, PETS)
}

/// Waits until `n` Pets in `default` are Ready; their IDs by name.
pub(crate) fn all_n_ready(
    cp: &ControlPlane,
    what: &str,
    n: usize,
) -> fixtures::Result<BTreeMap<String, String>> {
    wait_for(TIMEOUT, what, || {
        let pets = pets(cp).ok()?;
        (pets.len() == n && pets.values().all(is_ready)).then(|| {
            pets.iter()
                .map(|(name, pet)| (name.clone(), ready_id(pet).to_owned()))
                .collect()
        })
    })
}

/// The store's answered calls of each write RPC, and its records.
#[derive(Debug, PartialEq)]
struct StoreCounts {
    add: f64,
    update: f64,
    delete: f64,
    set_key: f64,
    records: usize,
}

fn counts(env: &Env) -> fixtures::Result<StoreCounts> {
    Ok(StoreCounts {
        add: env.store.answered("AddPets")?,
        update: env.store.answered("UpdatePets")?,
        delete: env.store.answered("DeletePets")?,
        set_key: env.store.answered("SetIdempotencyKeys")?,
        records: env.store.all_pets()?.len(),
    })
}

/// The records in the store by ID: (key, identity).
fn records(env: &Env) -> fixtures::Result<BTreeMap<String, (String, String)>> {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    Ok(env
        .store
        .all_pets()?
        .iter()
        .map(|r| {
            (
                text(&r["id"]),
                (text(&r["idempotencyKey"]), text(&r["identity"])),
            )
        })
        .collect())
}

/// The operator of the environment's own cluster, in `installation`.
fn start_operator(env: &Env, identity: &str, installation: &str) -> fixtures::Result<Operator> {
    let mut options = env.operator_options(identity);
    options
        .extra_args
        .push(format!("--installation={installation}").into());
    env.start_operator_with(&options)
}

/// Blue's operator and green's, each of its own installation, as the
/// live handovers run them.
fn start_both_operators(
    env: &Env,
    green: &fixtures::env::Cluster,
) -> fixtures::Result<(Operator, Operator)> {
    let blue_operator = start_operator(env, "operator-blue", "blue")?;
    let green_operator =
        env.start_operator_in(green, "operator-green", &["--installation=green"])?;
    Ok((blue_operator, green_operator))
}

fn uid(pet: &Pet) -> String {
    pet.metadata.uid.clone().unwrap_or_default()
}

/// The ID of a Pet that [`is_ready`] passed, which has one.
fn ready_id(pet: &Pet) -> &str {
    typed::id(pet).unwrap_or_default()
}

/// The ID of the Pet `name` in `default`, once it is Ready.
fn ready_pet_id(cp: &ControlPlane, name: &str) -> Option<String> {
    pets(cp)
        .ok()?
        .get(name)
        .filter(|pet| is_ready(pet))
        .map(|pet| ready_id(pet).to_owned())
}

/// The cluster is lost: its Pets go without their finalizers running (the
/// operator is stopped, and the finalizers removed by hand), as when a
/// cluster is torn down or its etcd lost.
fn lose_pets(cp: &ControlPlane) -> fixtures::Result<()> {
    for name in pets(cp)?.keys() {
        cp.patch_pet(
            "default",
            name,
            &["--type=merge", "-p", r#"{"metadata":{"finalizers":null}}"#],
        )?;
    }
    cp.kubectl(&["delete", "pets", "--all", "-n", "default", "--wait=true"])?;
    Ok(())
}

#[test]
fn a_cluster_rebuilt_from_git_or_restored_finds_every_record() -> fixtures::Result<()> {
    let env = Env::start(Storage::Durable)?;
    let installation = ["--installation=prod"];
    let old = &env.cp;
    let mut operator = start_operator(&env, "operator-old", "prod")?;
    old.kubectl_stdin(&["apply", "-f", "-"], &manifests())?;
    let ids = all_ready(old, "the first cluster's Pets Ready")?;
    let old_uids: Vec<String> = pets(old)?.values().map(uid).collect();
    for (id, (key, identity)) in records(&env)? {
        assert!(
            key.starts_with("prod/"),
            "{id}: key {key:?} names the installation"
        );
        assert!(
            identity.starts_with("default/pet-"),
            "{id}: identity {identity:?}"
        );
    }

    // The cluster is lost; a new one is built from the same manifests,
    // with an operator of the same installation on the same store.
    operator.kill();
    lose_pets(old)?;
    let rebuilt = env.another_cluster()?;
    let before = counts(&env)?;
    let mut operator = env.start_operator_in(&rebuilt, "operator-rebuilt", &installation)?;
    rebuilt
        .cp
        .kubectl_stdin(&["apply", "-f", "-"], &manifests())?;
    assert_eq!(
        all_ready(&rebuilt.cp, "the rebuilt cluster's Pets Ready")?,
        ids,
        "every Pet found its record: the same IDs"
    );
    let after = counts(&env)?;
    assert_eq!(
        after,
        StoreCounts {
            set_key: before.set_key + PETS as f64,
            ..before
        },
        "one key claim per Pet, and no create, update or delete"
    );
    let new_uids: BTreeMap<String, String> = pets(&rebuilt.cp)?
        .into_iter()
        .map(|(name, pet)| (name, uid(&pet)))
        .collect();
    for (id, (key, _)) in records(&env)? {
        assert!(
            new_uids.values().any(|uid| key == format!("prod/{uid}")),
            "{id}: key {key:?} is a new Pet's"
        );
        assert!(!old_uids.iter().any(|uid| key.ends_with(uid.as_str())));
    }
    let taken = rebuilt.cp.kubectl(&["get", "events", "-n", "default"])?;
    assert!(taken.contains("took over store record"), "{taken}");

    // Restored as Velero does: new UIDs, and the old status written back
    // before the operator runs.
    operator.kill();
    lose_pets(&rebuilt.cp)?;
    rebuilt
        .cp
        .kubectl_stdin(&["apply", "-f", "-"], &manifests())?;
    for (name, id) in &ids {
        rebuilt.cp.patch_pet(
            "default",
            name,
            &[
                "--subresource=status",
                "--type=merge",
                "-p",
                &format!(r#"{{"status":{{"id":"{id}"}}}}"#),
            ],
        )?;
    }
    let before = counts(&env)?;
    let _operator = env.start_operator_in(&rebuilt, "operator-restored", &installation)?;
    assert_eq!(
        all_ready(&rebuilt.cp, "the restored Pets Ready")?,
        ids,
        "restored with status: the same IDs"
    );
    assert_eq!(
        counts(&env)?,
        StoreCounts {
            set_key: before.set_key + PETS as f64,
            ..before
        },
        "restored: one key claim per Pet, nothing else"
    );

    // Deleted with Orphan and applied again: the record it kept is its own
    // again.
    let kept = format!("pet-{}", PETS - 1);
    rebuilt
        .cp
        .kubectl(&["delete", "pet", &kept, "-n", "default", "--wait=true"])?;
    let released = records(&env)?;
    let (key, identity) = &released[&ids[&kept]];
    assert_eq!(
        (key.as_str(), identity.as_str()),
        ("", format!("default/{kept}").as_str()),
        "released, and still named"
    );
    let before = counts(&env)?;
    rebuilt
        .cp
        .kubectl_stdin(&["apply", "-f", "-"], &manifests())?;
    assert_eq!(all_ready(&rebuilt.cp, "the Orphan Pet back")?, ids);
    assert_eq!(
        counts(&env)?,
        StoreCounts {
            set_key: before.set_key + 1.0,
            ..before
        },
        "the kept record claimed back, nothing created"
    );
    Ok(())
}

#[test]
fn two_clusters_on_one_store_never_write_each_others_records() -> fixtures::Result<()> {
    let env = Env::start(Storage::Durable)?;
    let blue = &env.cp;
    let green = env.another_cluster()?;
    let _blue_operator = start_operator(&env, "operator-blue", "blue")?;
    // Green audits every 2 s: its held Pet's record is read again and again
    // while the test watches for writes (with the change feed, the poll
    // comes only once an audit interval).
    let green_operator = env.start_operator_in(
        &green,
        "operator-green",
        &["--installation=green", "--audit-interval=2s"],
    )?;
    let shared = |name: &str| pet_manifest("shared", &[], &spec(name, ""));
    blue.kubectl_stdin(&["apply", "-f", "-"], &shared("Blue's"))?;
    let blue_id = wait_for(TIMEOUT, "blue's Pet Ready", || ready_pet_id(blue, "shared"))?;

    // The same namespace and name in green: held, naming blue.
    let before = counts(&env)?;
    green
        .cp
        .kubectl_stdin(&["apply", "-f", "-"], &shared("Green's"))?;
    let message = wait_for(TIMEOUT, "green's Pet held", || {
        let pets = pets(&green.cp).ok()?;
        let synced = pets.get("shared")?.condition("Synced")?;
        (synced.reason == "RecordOwnedElsewhere").then(|| synced.message.clone())
    })?;
    assert!(
        message.contains("\"blue\"") && message.contains(&blue_id),
        "{message}"
    );
    // Two more of green's audits read the store, and write nothing.
    let reads = green_operator.store_reads()?;
    green_operator.wait_store_reads(reads, 2, TIMEOUT)?;
    assert_eq!(counts(&env)?, before, "green wrote nothing");
    let record = env.store.record(&blue_id)?.expect("blue's record");
    assert_eq!(record["name"], "Blue's", "blue's record keeps blue's spec");
    assert!(
        record["idempotencyKey"]
            .as_str()
            .is_some_and(|key| key.starts_with("blue/"))
    );

    // Once blue's Pet goes (and its record with it), green's makes its own.
    blue.kubectl(&["delete", "pet", "shared", "-n", "default", "--wait=true"])?;
    let green_id = wait_for(TIMEOUT, "green's Pet Ready on a record of its own", || {
        ready_pet_id(&green.cp, "shared")
    })?;
    assert_ne!(green_id, blue_id);
    let (key, identity) = records(&env)?.remove(&green_id).expect("green's record");
    assert!(key.starts_with("green/"), "{key}");
    assert_eq!(identity, "default/shared");
    assert_eq!(
        env.store.all_pets()?.len(),
        1,
        "blue's record deleted, green's made"
    );
    Ok(())
}

/// grpcurl following the store's change feed, each message stamped with
/// when grpcurl printed it; killed when dropped.
struct TimedFeed {
    child: std::process::Child,
    messages: std::sync::Arc<std::sync::Mutex<Vec<(Instant, Value)>>>,
}

impl TimedFeed {
    fn start(addr: &str) -> fixtures::Result<Self> {
        use std::io::BufRead as _;
        let mut child = std::process::Command::new(fixtures::Tools::get()?.bin("grpcurl"))
            .args(["-plaintext", "-d", r#"{"after_revision": 0}"#, addr])
            .arg("petstore.PetStore/WatchPets")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(fixtures::io("starting grpcurl WatchPets"))?;
        let stdout = child.stdout.take().expect("piped stdout");
        let messages = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = std::sync::Arc::clone(&messages);
        std::thread::spawn(move || {
            // grpcurl prints each message as indented JSON that ends with a
            // "}" alone at the start of a line.
            let mut text = String::new();
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                text.push_str(&line);
                text.push('\n');
                if line == "}" {
                    if let Ok(message) = serde_json::from_str::<Value>(&text) {
                        sink.lock()
                            .expect("feed lock")
                            .push((Instant::now(), message));
                    }
                    text.clear();
                }
            }
        });
        // The first message is the progress that says the stream is open.
        wait_for(TIMEOUT, "the change feed open", || {
            (!messages.lock().ok()?.is_empty()).then_some(())
        })?;
        Ok(Self { child, messages })
    }

    /// Every change so far with when it was printed: (time, kind, record
    /// ID, key).
    fn changes(&self) -> Vec<(Instant, String, String, String)> {
        let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
        self.messages
            .lock()
            .map(|messages| {
                messages
                    .iter()
                    .flat_map(|(at, message)| {
                        message["changes"]
                            .as_array()
                            .cloned()
                            .unwrap_or_default()
                            .into_iter()
                            .map(move |c| {
                                (
                                    *at,
                                    text(&c["kind"]),
                                    text(&c["id"]),
                                    text(&c["pet"]["idempotencyKey"]),
                                )
                            })
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for TimedFeed {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Two clusters on one store: blue's Pets Ready, the same manifests
/// applied in green (held). Returns blue's IDs.
fn blue_and_green(
    env: &Env,
    green: &fixtures::env::Cluster,
) -> fixtures::Result<BTreeMap<String, String>> {
    env.cp.kubectl_stdin(&["apply", "-f", "-"], &manifests())?;
    let ids = all_ready(&env.cp, "blue's Pets Ready")?;
    green
        .cp
        .kubectl_stdin(&["apply", "-f", "-"], &manifests())?;
    wait_for(TIMEOUT, "green's Pets held by blue's records", || {
        let pets = pets(&green.cp).ok()?;
        (pets.len() == PETS
            && pets.values().all(|pet| {
                pet.condition("Synced")
                    .is_some_and(|c| c.reason == "RecordOwnedElsewhere")
            }))
        .then_some(())
    })?;
    Ok(ids)
}

/// Whether `key` is a green Pet's, not a handover's (`green/from:<uid>`).
fn is_greens_pet(key: &str) -> bool {
    key.strip_prefix("green/")
        .is_some_and(|uid| !uid.is_empty() && !uid.starts_with("from:"))
}

/// `kubectl annotate pets --all hand-over-to=green` in blue.
fn hand_over_to_green(env: &Env) -> fixtures::Result<String> {
    env.cp.kubectl(&[
        "annotate",
        "pets",
        "--all",
        "-n",
        "default",
        "petstore.example.com/hand-over-to=green",
    ])
}

/// After a handover: green's Pets Ready on blue's records, each with the
/// last name green's users gave it; blue's Pets say HandedOver, and
/// deleting them touches no record.
fn assert_handed_over(
    env: &Env,
    green: &fixtures::env::Cluster,
    ids: &BTreeMap<String, String>,
    before: &StoreCounts,
) -> fixtures::Result<()> {
    assert_eq!(
        &all_ready(&green.cp, "green's Pets Ready")?,
        ids,
        "the same records"
    );
    let after = counts(env)?;
    assert_eq!(
        (after.add, after.delete, after.records),
        (before.add, before.delete, PETS),
        "nothing created or deleted: {before:?} -> {after:?}"
    );
    let uids: BTreeMap<String, String> = pets(&green.cp)?
        .into_iter()
        .map(|(name, pet)| (name, uid(&pet)))
        .collect();
    let names: BTreeMap<String, String> = pets(&green.cp)?
        .into_iter()
        .map(|(name, pet)| (name, pet.spec.name))
        .collect();
    let stored: BTreeMap<String, Value> = env
        .store
        .all_pets()?
        .into_iter()
        .map(|r| (r["id"].as_str().unwrap_or_default().to_owned(), r))
        .collect();
    for (name, id) in ids {
        let record = &stored[id];
        assert_eq!(
            record["idempotencyKey"],
            format!("green/{}", uids[name]).as_str(),
            "{name}"
        );
        assert_eq!(
            record["name"],
            names[name].as_str(),
            "{name}: green's last edit"
        );
    }
    // Blue's operator may be a moment behind (restarted after a kill, it
    // waits for its Lease): its Pets say so once it has looked.
    wait_for(TIMEOUT, "blue's Pets HandedOver", || {
        let blue = pets(&env.cp).ok()?;
        blue.values()
            .all(|pet| {
                pet.condition("Synced")
                    .is_some_and(|c| c.reason == "HandedOver")
            })
            .then_some(())
    })?;
    let before_delete = counts(env)?;
    env.cp
        .kubectl(&["delete", "pets", "--all", "-n", "default", "--wait=true"])?;
    let after_delete = counts(env)?;
    assert_eq!(
        (
            after_delete.add,
            after_delete.update,
            after_delete.delete,
            after_delete.set_key
        ),
        (
            before_delete.add,
            before_delete.update,
            before_delete.delete,
            before_delete.set_key
        ),
        "deleting blue's Pets wrote nothing"
    );
    assert_eq!(after_delete.records, PETS);
    Ok(())
}

/// Renames green's Pets over and over until `stop`, as users would while
/// the handover runs.
fn edit_in_green(
    cp: &ControlPlane,
    stop: &std::sync::atomic::AtomicBool,
    made: &std::sync::atomic::AtomicUsize,
) -> fixtures::Result<usize> {
    let mut edits = 0;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let pet = format!("pet-{}", edits % PETS);
        cp.patch_pet(
            "default",
            &pet,
            &[
                "--type=merge",
                "-p",
                &format!(r#"{{"spec":{{"name":"Edited in green {edits}"}}}}"#),
            ],
        )?;
        edits += 1;
        made.store(edits, std::sync::atomic::Ordering::Relaxed);
    }
    Ok(edits)
}

#[test]
fn a_handover_between_two_live_clusters_under_edits() -> fixtures::Result<()> {
    let env = Env::start(Storage::Durable)?;
    let green = env.another_cluster()?;
    let (_blue_operator, _green_operator) = start_both_operators(&env, &green)?;
    let ids = blue_and_green(&env, &green)?;
    let feed = TimedFeed::start(&env.store.addr)?;
    let before = counts(&env)?;
    let stop = std::sync::atomic::AtomicBool::new(false);
    let made = std::sync::atomic::AtomicUsize::new(0);
    let mut before_handover = 0;
    let edits = std::thread::scope(|scope| {
        let editor = scope.spawn(|| edit_in_green(&green.cp, &stop, &made));
        // Users are editing when the handover starts.
        let editing = wait_for(TIMEOUT, "users editing in green", || {
            (made.load(std::sync::atomic::Ordering::Relaxed) >= 3).then_some(())
        });
        before_handover = made.load(std::sync::atomic::Ordering::Relaxed);
        let handed = editing
            .and_then(|()| hand_over_to_green(&env))
            .and_then(|_| {
                wait_for(TIMEOUT, "every record claimed in green", || {
                    let claimed = feed
                        .changes()
                        .iter()
                        .filter(|(_, kind, _, key)| kind == "KEY_CHANGED" && is_greens_pet(key))
                        .count();
                    (claimed >= PETS).then_some(())
                })
            });
        // Edits go on a moment after the last claim.
        std::thread::sleep(Duration::from_secs(1));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        handed.and_then(|()| editor.join().expect("editor thread"))
    })?;
    assert!(
        before_handover >= 3 && edits > before_handover,
        "users edited before and during the handover: {before_handover}, then {edits} in all"
    );

    // Per record, from the store's own feed: blue's key, then green's
    // handover key, then a green Pet's, with no other write between the
    // release and the claim, and at most a second between them.
    let changes = feed.changes();
    let mut slowest = Duration::ZERO;
    for (name, id) in &ids {
        let mine: Vec<&(Instant, String, String, String)> =
            changes.iter().filter(|c| c.2 == *id).collect();
        let released = mine
            .iter()
            .position(|c| c.1 == "KEY_CHANGED" && c.3.starts_with("green/from:"))
            .unwrap_or_else(|| panic!("{name}: never released to green: {mine:?}"));
        let claimed = &mine[released + 1];
        assert!(
            claimed.1 == "KEY_CHANGED" && is_greens_pet(&claimed.3),
            "{name}: the change after the release is green's claim: {mine:?}"
        );
        assert!(
            mine[..released]
                .iter()
                .all(|c| c.1 != "KEY_CHANGED" || c.3.starts_with("blue/")),
            "{name}: blue's until the release: {mine:?}"
        );
        slowest = slowest.max(claimed.0.duration_since(mine[released].0));
    }
    eprintln!(
        "handover: {PETS} records, {edits} edits in green, longest gap between release and claim {slowest:?}"
    );
    assert!(slowest <= Duration::from_secs(1), "longest gap {slowest:?}");
    assert_handed_over(&env, &green, &ids, &before)
}

/// What the faults binary logs as it hangs (`petstore_operator::Fault`).
const HANGS_AFTER_RELEASE: &str = "fault injection: hanging after a release";
const HANGS_BEFORE_CLAIM: &str = "fault injection: hanging before a claim";
const HANGS_AFTER_LAST_CLAIM: &str = "fault injection: hanging after the last claim let through";

/// An operator in `installation`, for `cluster` (`None`: the
/// environment's own), with `fault` if any.
fn start_in(
    env: &Env,
    cluster: Option<&fixtures::env::Cluster>,
    identity: &str,
    installation: &str,
    fault: Option<&'static str>,
) -> fixtures::Result<Operator> {
    let mut options = env.operator_options(identity);
    options
        .extra_args
        .push(format!("--installation={installation}").into());
    options.fault = fault;
    match cluster {
        Some(cluster) => env.start_operator_in_with(cluster, &options),
        None => env.start_operator_with(&options),
    }
}

/// How many lines of `operator`'s log say `marker`.
fn logged(operator: &mut Operator, marker: &str) -> usize {
    std::fs::read_to_string(operator.process().log_path())
        .map(|text| text.lines().filter(|line| line.contains(marker)).count())
        .unwrap_or(0)
}

/// Each record's key, by the name of the Pet its identity names.
fn keys_by_name(env: &Env) -> fixtures::Result<BTreeMap<String, String>> {
    Ok(records(env)?
        .into_values()
        .map(|(key, identity)| {
            let name = identity.strip_prefix("default/").unwrap_or(&identity);
            (name.to_owned(), key)
        })
        .collect())
}

/// Each of blue's Pets' handover key, `green/from:<its UID>`, by name.
fn handover_keys(env: &Env) -> fixtures::Result<BTreeMap<String, String>> {
    Ok(pets(&env.cp)?
        .into_iter()
        .map(|(name, pet)| (name, format!("green/from:{}", uid(&pet))))
        .collect())
}

/// What the kill -9 stories read before the handover starts.
struct Handover {
    /// Blue's IDs, by name.
    ids: BTreeMap<String, String>,
    /// Each Pet's handover key, by name.
    waiting: BTreeMap<String, String>,
    before: StoreCounts,
}

/// The kill -9 stories' start, their operators running: blue's Pets Ready
/// and green's held, then the handover asked for.
fn begin_handover(env: &Env, green: &fixtures::env::Cluster) -> fixtures::Result<Handover> {
    let ids = blue_and_green(env, green)?;
    let waiting = handover_keys(env)?;
    let before = counts(env)?;
    hand_over_to_green(env)?;
    Ok(Handover {
        ids,
        waiting,
        before,
    })
}

#[test]
fn a_handover_survives_kill_9_of_blue_after_its_releases_and_of_green_before_its_claims()
-> fixtures::Result<()> {
    let env = Env::start(Storage::Durable)?;
    let green = env.another_cluster()?;
    let mut blue = start_in(
        &env,
        None,
        "operator-blue-0",
        "blue",
        Some("hang-after-release"),
    )?;
    let mut green_operator = start_in(
        &env,
        Some(&green),
        "operator-green-0",
        "green",
        Some("hang-before-claim"),
    )?;
    let handover = begin_handover(&env, &green)?;

    // Blue's kill lands between each release and its status: every record
    // is under its handover key in the store, and no Pet of blue's says
    // HandedOver. Green hangs before each claim it planned.
    wait_for(
        TIMEOUT,
        "blue hung after each release, green before each claim",
        || {
            (logged(&mut blue, HANGS_AFTER_RELEASE) >= PETS
                && logged(&mut green_operator, HANGS_BEFORE_CLAIM) >= PETS)
                .then_some(())
        },
    )?;
    assert_eq!(logged(&mut blue, HANGS_AFTER_RELEASE), PETS);
    assert_eq!(
        keys_by_name(&env)?,
        handover.waiting,
        "every record released to green, none claimed"
    );
    for name in pets(&env.cp)?.keys() {
        let reason = synced_reason(&env.cp, name);
        assert_ne!(
            reason.as_deref(),
            Some("HandedOver"),
            "{name}: released, but its status not yet written"
        );
    }
    blue.kill(); // kill -9
    let _blue = start_in(&env, None, "operator-blue-1", "blue", None)?;
    wait_for(TIMEOUT, "the restarted blue to say HandedOver", || {
        pets(&env.cp)
            .ok()?
            .keys()
            .all(|name| synced_reason(&env.cp, name).as_deref() == Some("HandedOver"))
            .then_some(())
    })?;

    // Green's kill lands between the releases and its claims: every record
    // still waits under its handover key.
    assert_eq!(
        logged(&mut green_operator, HANGS_BEFORE_CLAIM),
        PETS,
        "one hung claim per Pet"
    );
    assert_eq!(
        keys_by_name(&env)?,
        handover.waiting,
        "at green's kill, every record waits under its handover key"
    );
    green_operator.kill(); // kill -9
    let _green = start_in(&env, Some(&green), "operator-green-1", "green", None)?;
    assert_handed_over(&env, &green, &handover.ids, &handover.before)
}

#[test]
fn a_handover_survives_kill_9_of_green_in_the_middle_of_its_claims() -> fixtures::Result<()> {
    const CLAIMED: usize = 4;
    let env = Env::start(Storage::Durable)?;
    let green = env.another_cluster()?;
    let _blue = start_in(&env, None, "operator-blue", "blue", None)?;
    let mut green_operator = start_in(
        &env,
        Some(&green),
        "operator-green-0",
        "green",
        Some("hang-after-claims=4"),
    )?;
    let handover = begin_handover(&env, &green)?;

    // Green's kill lands in the middle of the batch: CLAIMED records under
    // green Pets' keys, the rest released and waiting for a claim that hung
    // before its compare-and-set.
    wait_for(
        TIMEOUT,
        "green hung after its last claim and before the rest",
        || {
            (logged(&mut green_operator, HANGS_AFTER_LAST_CLAIM) >= 1
                && logged(&mut green_operator, HANGS_BEFORE_CLAIM) >= PETS - CLAIMED)
                .then_some(())
        },
    )?;
    let keys = keys_by_name(&env)?;
    let claimed: Vec<&String> = keys
        .iter()
        .filter(|(_, key)| is_greens_pet(key))
        .map(|(name, _)| name)
        .collect();
    assert_eq!(claimed.len(), CLAIMED, "claimed at the kill: {keys:?}");
    for (name, key) in &keys {
        assert!(
            is_greens_pet(key) || *key == handover.waiting[name],
            "{name}: claimed, or waiting under its handover key: {key}"
        );
    }
    green_operator.kill(); // kill -9
    let _green = start_in(&env, Some(&green), "operator-green-1", "green", None)?;
    assert_handed_over(&env, &green, &handover.ids, &handover.before)
}

/// The Synced reason of blue's Pet `name`.
fn synced_reason(cp: &ControlPlane, name: &str) -> Option<String> {
    let pets = pets(cp).ok()?;
    pets.get(name)?
        .condition("Synced")
        .map(|c| c.reason.clone())
}

#[test]
fn a_handover_moves_every_pet_although_one_waits_and_its_pet_takes_it_back() -> fixtures::Result<()>
{
    let env = Env::start(Storage::Durable)?;
    let green = env.another_cluster()?;
    let (_blue_operator, _green_operator) = start_both_operators(&env, &green)?;
    let ids = blue_and_green(&env, &green)?;
    // A Pet that green does not have.
    let lone = "only-in-blue";
    env.cp.kubectl_stdin(
        &["apply", "-f", "-"],
        &pet_manifest(lone, &[], &spec("Lone", "")),
    )?;
    let lone_id = wait_for(TIMEOUT, "blue's lone Pet Ready", || {
        ready_pet_id(&env.cp, lone)
    })?;
    let lone_uid = uid(&pets(&env.cp)?[lone]);
    let before = counts(&env)?;

    // It is handed over first, and waits: no Pet in green takes it.
    env.cp.annotate_pet(
        "default",
        lone,
        &["petstore.example.com/hand-over-to=green"],
    )?;
    let waiting = format!("green/from:{lone_uid}");
    wait_for(TIMEOUT, "the lone record released to green", || {
        let (key, _) = records(&env).ok()?.remove(&lone_id)?;
        (key == waiting && synced_reason(&env.cp, lone).as_deref() == Some("HandedOver"))
            .then_some(())
    })?;

    // The others move while it waits.
    env.cp.kubectl(&[
        "annotate",
        "--overwrite",
        "pets",
        "--all",
        "-n",
        "default",
        "petstore.example.com/hand-over-to=green",
    ])?;
    let moved = all_ready(&green.cp, "green's Pets Ready")?;
    assert_eq!(moved, ids, "the same records");
    let stored = records(&env)?;
    for pet in pets(&green.cp)?.values() {
        let id = ready_id(pet);
        assert_eq!(
            stored[id].0,
            format!("green/{}", uid(pet)),
            "{}",
            typed::shown(pet)
        );
    }
    assert_eq!(stored[&lone_id].0, waiting, "the lone record still waits");

    // Cancelled: blue's lone Pet takes its record back.
    env.cp.kubectl(&[
        "annotate",
        "--overwrite",
        "pet",
        lone,
        "-n",
        "default",
        "petstore.example.com/hand-over-to=blue",
    ])?;
    wait_for(TIMEOUT, "the lone Pet Ready on its record again", || {
        let pets = pets(&env.cp).ok()?;
        let pet = pets.get(lone)?;
        (is_ready(pet) && typed::id(pet) == Some(lone_id.as_str())).then_some(())
    })?;
    let (key, identity) = records(&env)?.remove(&lone_id).expect("the lone record");
    assert_eq!(
        (key, identity),
        (
            format!("blue/{lone_uid}"),
            "default/only-in-blue".to_owned()
        )
    );
    let after = counts(&env)?;
    assert_eq!(
        (after.add, after.delete, after.records),
        (before.add, before.delete, PETS + 1),
        "nothing created or deleted: {before:?} -> {after:?}"
    );
    Ok(())
}
