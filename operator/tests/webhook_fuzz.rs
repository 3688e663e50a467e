//! The webhook's three routes, fuzzed: the conversion webhook
//! (`ConversionReview`), the Pet CRD's deletion guard and the stores'
//! deletion guard (`AdmissionReview`) take whatever body the network brings.
//! No body may panic them or keep them busy, and each must still answer a
//! review the API server can read: a conversion that says Success or
//! Failure, an admission that says allowed or refused with a message.
//!
//! The seeds are real reviews, kept in `tests/corpus/webhook/` (one JSON
//! file each: add a body there to have it checked, and mutated, on every
//! run). Each run checks what the seeds answer, then arbitrary bytes, then
//! the seeds mutated at random (a node replaced by any JSON value, a key
//! dropped, the text cut short). The case counts bound the run to a few
//! seconds; a case that takes longer than [`DEADLINE`] is a hang.

use std::path::PathBuf;
use std::sync::{LazyLock, mpsc};
use std::time::Duration;

use petstore_operator::crd::StoreRef;
use petstore_operator::webhook::guard::{self, PetCount};
use petstore_operator::webhook::store_guard::{self, PetUse};
use petstore_operator::webhook::{self};
use proptest::prelude::*;
use serde_json::{Value, json};

/// Far above what any body takes (microseconds), far below a test timeout.
const DEADLINE: Duration = Duration::from_secs(10);

/// The seeds, by file name, read once.
fn corpus() -> &'static [(String, Vec<u8>)] {
    static SEEDS: LazyLock<Vec<(String, Vec<u8>)>> = LazyLock::new(read_corpus);
    &SEEDS
}

fn read_corpus() -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/webhook");
    let mut seeds: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .expect("the corpus folder")
        .map(|entry| {
            let path = entry.expect("a corpus entry").path();
            let body = std::fs::read(&path).expect("a corpus file");
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            (name, body)
        })
        .collect();
    seeds.sort();
    seeds
}

/// The Pets the guards are given: one on team-a's default PetStore, one on
/// the ClusterPetStore `shared`.
fn pets_in_use() -> Vec<PetUse> {
    let on = |namespace: &str, name: &str, store: &str| PetUse {
        namespace: namespace.into(),
        name: name.into(),
        store_ref: None,
        status_store: Some(store.into()),
    };
    vec![
        on("team-a", "thor", "PetStore/default"),
        on("team-b", "tron", "ClusterPetStore/shared"),
    ]
}

/// What each route answers to `body`, as JSON: the conversion webhook's,
/// the CRD guard's (with `count` Pets, none protected) and the store
/// guard's (with `pets`). Run on a thread of its own, so that a hang fails
/// the case after [`DEADLINE`] instead of stalling the test.
fn answers(body: Vec<u8>, count: usize, pets: Vec<PetUse>) -> [Value; 3] {
    let (done, answered) = mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime");
        let conversion = serde_json::to_value(webhook::review(&body)).expect("serializable");
        let crd_guard = runtime.block_on(guard::review(&body, || async move {
            Ok(PetCount {
                pets: count,
                protected: 0,
            })
        }));
        let store_guard = runtime.block_on(store_guard::review(&body, |_| async move { Ok(pets) }));
        let _ = done.send([conversion, crd_guard, store_guard]);
    });
    match answered.recv_timeout(DEADLINE) {
        Ok(answers) => answers,
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("a body kept the webhook busy for {DEADLINE:?}")
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("a body panicked the webhook"),
    }
}

/// A conversion answer the API server can read: Success with one object
/// per object sent, each in the version asked for, or Failure with a
/// message.
fn assert_conversion_readable(body: &[u8], answer: &Value) {
    let response = &answer["response"];
    match response["result"]["status"].as_str() {
        Some("Success") => {
            let sent: Value = serde_json::from_slice(body).expect("a converted body was JSON");
            let desired = &sent["request"]["desiredAPIVersion"];
            let converted = response["convertedObjects"]
                .as_array()
                .expect("convertedObjects");
            let objects = sent["request"]["objects"].as_array().map_or(0, Vec::len);
            assert_eq!(converted.len(), objects, "one object per object sent");
            for object in converted {
                assert_eq!(&object["apiVersion"], desired, "{object}");
            }
        }
        Some("Failure") => {
            let message = response["result"]["message"].as_str().unwrap_or_default();
            assert!(!message.is_empty(), "a failure says why: {answer}");
        }
        _ => panic!("neither Success nor Failure: {answer}"),
    }
}

/// An admission answer the API server can read: allowed, or refused with
/// a 403 and a message.
fn assert_admission_readable(answer: &Value) {
    assert_eq!(answer["kind"], "AdmissionReview", "{answer}");
    let response = &answer["response"];
    match response["allowed"].as_bool() {
        Some(true) => {}
        Some(false) => {
            assert_eq!(response["status"]["code"], 403, "{answer}");
            let message = response["status"]["message"].as_str().unwrap_or_default();
            assert!(!message.is_empty(), "a refusal says why: {answer}");
        }
        None => panic!("neither allowed nor refused: {answer}"),
    }
}

fn assert_readable(body: &[u8], [conversion, crd_guard, store_guard]: &[Value; 3]) {
    assert_conversion_readable(body, conversion);
    assert_admission_readable(crd_guard);
    assert_admission_readable(store_guard);
}

/// The seeds are what they say: each conversion succeeds, and each guard
/// refuses the deletion it guards while Pets need it and allows it once
/// none do (or, for the CRD, once their number is confirmed).
#[test]
fn each_seed_is_answered_as_the_api_server_expects() {
    let seeds = corpus();
    assert!(
        seeds.len() >= 6,
        "the corpus: {:?}",
        seeds.iter().map(|s| &s.0).collect::<Vec<_>>()
    );
    for (name, body) in seeds {
        let busy = answers(body.clone(), 3, pets_in_use());
        let idle = answers(body.clone(), 2, Vec::new());
        assert_readable(body, &busy);
        assert_readable(body, &idle);
        let allowed = |answer: &Value| answer["response"]["allowed"] == true;
        if name.starts_with("convert-") {
            assert_eq!(
                busy[0]["response"]["result"]["status"], "Success",
                "{name}: {}",
                busy[0]
            );
        } else if name.starts_with("guard-") {
            // Confirmed for 2 Pets: refused while 3 exist, allowed at 2.
            assert!(!allowed(&busy[1]), "{name}: {}", busy[1]);
            assert!(allowed(&idle[1]), "{name}: {}", idle[1]);
        } else if name.starts_with("store-guard-") {
            assert!(!allowed(&busy[2]), "{name}: {}", busy[2]);
            assert!(allowed(&idle[2]), "{name}: {}", idle[2]);
        } else {
            panic!("{name}: a seed's name says which route it is for");
        }
    }
}

#[test]
fn store_refs_in_the_pets_given_parse() {
    // The store guard matches Pets by these; a typo would make every
    // store-guard seed pass for the wrong reason.
    for pet in pets_in_use() {
        let text = pet.status_store.expect("a store");
        assert!(text.parse::<StoreRef>().is_ok(), "{text}");
    }
}

/// Any JSON value, a few levels deep.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| json!(f)),
        ".{0,40}".prop_map(Value::from),
        // Strings a real review holds, so mutations reach deeper checks.
        prop::sample::select(vec![
            "petstore.example.com/v1",
            "petstore.example.com/v1alpha1",
            "petstore.example.com/v2",
            "DELETE",
            "CREATE",
            "Pet",
            "PetStore",
            "ClusterPetStore",
            "ServiceAccount",
            "petstore-tenant",
            "pets.petstore.example.com",
            "2021-02-30",
            "9999-12-31T23:59:59Z",
            "",
        ])
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::from),
            prop::collection::btree_map(".{0,12}", inner, 0..6)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

/// One change to a review: the node reached by `path` (indexes taken
/// modulo each level's size) replaced by `value`, or dropped from its
/// object.
#[derive(Debug, Clone)]
struct Mutation {
    path: Vec<usize>,
    value: Value,
    drop: bool,
}

fn mutate(node: &mut Value, mutation: &Mutation, depth: usize) {
    let step = mutation.path.get(depth).copied();
    let children = match node {
        Value::Object(map) => map.len(),
        Value::Array(items) => items.len(),
        _ => 0,
    };
    let Some(step) = step.filter(|_| children > 0) else {
        *node = mutation.value.clone();
        return;
    };
    let index = step % children;
    let last = depth + 1 == mutation.path.len();
    match node {
        Value::Object(map) => {
            let key = map.keys().nth(index).cloned().unwrap_or_default();
            if last && mutation.drop {
                map.remove(&key);
            } else if let Some(child) = map.get_mut(&key) {
                mutate(child, mutation, depth + 1);
            }
        }
        Value::Array(items) => {
            if last && mutation.drop {
                items.remove(index);
            } else {
                mutate(&mut items[index], mutation, depth + 1);
            }
        }
        _ => {}
    }
}

fn mutation() -> impl Strategy<Value = Mutation> {
    (
        prop::collection::vec(any::<usize>(), 1..8),
        any_json(),
        any::<bool>(),
    )
        .prop_map(|(path, value, drop)| Mutation { path, value, drop })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_are_answered_and_never_panic(body in prop::collection::vec(any::<u8>(), 0..2048)) {
        let answers = answers(body.clone(), 1, pets_in_use());
        assert_readable(&body, &answers);
    }

    #[test]
    fn arbitrary_json_is_answered_and_never_panics(value in any_json()) {
        let body = serde_json::to_vec(&value).expect("serializable");
        let answers = answers(body.clone(), 1, pets_in_use());
        assert_readable(&body, &answers);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    #[test]
    fn mutated_seeds_are_answered_and_never_panic(
        seed in any::<prop::sample::Index>(),
        mutations in prop::collection::vec(mutation(), 1..4),
        cut in prop::option::weighted(0.2, any::<prop::sample::Index>()),
    ) {
        let seeds = corpus();
        let (_, original) = &seeds[seed.index(seeds.len())];
        let mut review: Value = serde_json::from_slice(original).expect("a seed is JSON");
        for mutation in &mutations {
            mutate(&mut review, mutation, 0);
        }
        let mut body = serde_json::to_vec(&review).expect("serializable");
        if let Some(cut) = cut {
            body.truncate(cut.index(body.len() + 1));
        }
        let answers = answers(body.clone(), 1, pets_in_use());
        assert_readable(&body, &answers);
    }
}
