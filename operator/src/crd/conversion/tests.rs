use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;
use crate::crd::{v1, v1alpha1};
use crate::store::PetData;

fn alpha(birthday: &str) -> Value {
    json!({
        "apiVersion": V1ALPHA1,
        "kind": "Pet",
        "metadata": {"name": "thor", "namespace": "default", "uid": "u-1", "resourceVersion": "7"},
        "spec": {"name": "Thor", "type": "dog", "birthday": birthday},
    })
}

fn v1_pet(birthday: &str) -> Value {
    let mut pet = alpha(birthday);
    pet["apiVersion"] = V1.into();
    pet
}

fn annotation(pet: &Value) -> Option<&str> {
    pet["metadata"]["annotations"][V1ALPHA1_BIRTHDAY_ANNOTATION].as_str()
}

#[test]
fn the_books_midnight_utc_becomes_a_date_with_no_annotation() {
    let pet = convert(alpha("2021-04-01T00:00:00Z"), V1).expect("converts");
    assert_eq!(pet["apiVersion"], V1);
    assert_eq!(pet["spec"]["birthday"], "2021-04-01");
    assert!(pet["metadata"].get("annotations").is_none(), "{pet}");
    assert_eq!(
        convert(pet, V1ALPHA1).expect("back"),
        alpha("2021-04-01T00:00:00Z")
    );
}

#[test]
fn a_timestamp_with_an_offset_keeps_its_own_date_and_travels_in_the_annotation() {
    let written = "2021-04-01T23:30:00-05:00";
    let pet = convert(alpha(written), V1).expect("converts");
    // 1 April in its own offset, though it is already 2 April in UTC.
    assert_eq!(pet["spec"]["birthday"], "2021-04-01");
    assert_eq!(annotation(&pet), Some(written));
    let back = convert(pet, V1ALPHA1).expect("back");
    assert_eq!(back, alpha(written));
}

#[test]
fn the_string_as_written_survives_even_where_it_means_the_same_instant() {
    for written in [
        "2021-04-01T00:00:00+00:00",
        "2021-04-01T00:00:00.000Z",
        "2021-04-01T00:00:00.5+02:00",
    ] {
        let pet = convert(alpha(written), V1).expect("converts");
        assert_eq!(annotation(&pet), Some(written));
        assert_eq!(convert(pet, V1ALPHA1).expect("back"), alpha(written));
    }
}

#[test]
fn a_changed_v1_date_drops_the_annotation_that_no_longer_applies() {
    let mut pet = convert(alpha("2021-04-01T23:30:00-05:00"), V1).expect("converts");
    pet["spec"]["birthday"] = "2021-05-02".into();
    let back = convert(pet, V1ALPHA1).expect("back");
    assert_eq!(back, alpha("2021-05-02T00:00:00Z"));
}

#[test]
fn a_changed_v1alpha1_timestamp_rewrites_or_removes_the_annotation() {
    let mut pet = convert(alpha("2021-04-01T23:30:00-05:00"), V1).expect("converts");
    // A v1alpha1 client reads it, edits the birthday and writes it back.
    let mut edited = convert(pet.clone(), V1ALPHA1).expect("down");
    edited["spec"]["birthday"] = "2021-04-01T00:00:00Z".into();
    pet = convert(edited, V1).expect("up");
    assert_eq!(annotation(&pet), None, "{pet}");
    assert_eq!(pet["spec"]["birthday"], "2021-04-01");
}

#[test]
fn other_annotations_stay_and_an_emptied_map_goes() {
    let mut pet = alpha("2021-04-01T10:00:00+02:00");
    pet["metadata"]["annotations"] = json!({"team": "blue"});
    let up = convert(pet.clone(), V1).expect("up");
    assert_eq!(up["metadata"]["annotations"]["team"], "blue");
    assert_eq!(convert(up, V1ALPHA1).expect("down"), pet);
}

#[test]
fn the_store_ref_and_the_resolved_store_survive_both_ways_and_read_as_typed() {
    let mut pet = v1_pet("2021-04-01");
    pet["spec"]["storeRef"] = json!({"kind": "ClusterPetStore", "name": "shared"});
    pet["status"] = json!({"id": "r-1", "store": "ClusterPetStore/shared"});
    let down = convert(pet.clone(), V1ALPHA1).expect("down");
    // v1alpha1 has the same fields, so nothing needs an annotation.
    assert_eq!(down["spec"]["storeRef"], pet["spec"]["storeRef"]);
    assert_eq!(down["status"]["store"], "ClusterPetStore/shared");
    assert!(down["metadata"].get("annotations").is_none(), "{down}");
    let typed: v1alpha1::PetSpec = serde_json::from_value(down["spec"].clone()).expect("spec");
    assert_eq!(
        typed.store_ref.map(|store| store.to_string()).as_deref(),
        Some("ClusterPetStore/shared")
    );
    assert_eq!(convert(down, V1).expect("up"), pet);
}

#[test]
fn same_version_is_returned_untouched() {
    let pet = alpha("not even a timestamp");
    assert_eq!(convert(pet.clone(), V1ALPHA1), Ok(pet));
}

#[test]
fn what_cannot_be_converted_is_an_error_naming_the_value() {
    let err = convert(alpha("next tuesday"), V1).expect_err("not a timestamp");
    assert!(err.to_string().contains("next tuesday"), "{err}");
    let err = convert(v1_pet("2021-4-1"), V1ALPHA1).expect_err("not a date");
    assert!(err.to_string().contains("2021-4-1"), "{err}");
    let err = convert(alpha("2021-04-01T00:00:00Z"), "petstore.example.com/v2").expect_err("v2");
    assert!(err.to_string().contains("v2"), "{err}");
    let mut pet = alpha("2021-04-01T00:00:00Z");
    pet["kind"] = "Dog".into();
    assert!(matches!(
        convert(pet, V1),
        Err(ConversionError::NotAPet { .. })
    ));
    assert!(matches!(
        convert(json!([1, 2]), V1),
        Err(ConversionError::NotAPet { .. })
    ));
    let mut pet = alpha("");
    pet["spec"]["birthday"] = json!(20210401);
    assert!(matches!(
        convert(pet, V1),
        Err(ConversionError::BirthdayNotAString(_))
    ));
}

/// A v1alpha1 birthday as users write them: any offset, with or without
/// fractions, `Z` or `+00:00`.
fn timestamp() -> impl Strategy<Value = String> {
    (
        (1i32..=9999, 1u32..=12, 1u32..=28),
        (0u32..24, 0u32..60, 0u32..60),
        prop_oneof![Just(None), (1u32..1_000_000_000).prop_map(Some)],
        prop_oneof![
            Just("Z".to_owned()),
            Just("+00:00".to_owned()),
            (-14i32..=14, prop_oneof![Just(0), Just(30), Just(45)]).prop_map(|(h, m)| format!(
                "{}{:02}:{:02}",
                if h < 0 { '-' } else { '+' },
                h.abs(),
                m
            )),
        ],
    )
        .prop_map(|((y, mo, d), (h, mi, s), nanos, offset)| {
            let fraction = nanos.map(|n| format!(".{n:09}")).unwrap_or_default();
            format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}{fraction}{offset}")
        })
}

fn date() -> impl Strategy<Value = NaiveDate> {
    (1i32..=9999, 1u32..=366)
        .prop_filter_map("a real day", |(y, day)| NaiveDate::from_yo_opt(y, day))
}

fn text() -> impl Strategy<Value = String> {
    "\\PC{1,20}"
}

/// Annotations and labels other than the conversion's own: absent or not
/// empty, as the API server sends them.
fn string_map() -> impl Strategy<Value = Option<Value>> {
    proptest::option::of(
        proptest::collection::btree_map("[a-z./-]{1,20}", text(), 1..4).prop_map(|map| {
            Value::Object(
                map.into_iter()
                    .filter(|(key, _)| key != V1ALPHA1_BIRTHDAY_ANNOTATION)
                    .map(|(k, v)| (k, Value::String(v)))
                    .collect(),
            )
        }),
    )
}

/// `spec.storeRef` as the schema allows it.
fn store_ref() -> impl Strategy<Value = Value> {
    (
        prop_oneof![Just("PetStore"), Just("ClusterPetStore")],
        "[a-z0-9][a-z0-9.-]{0,30}",
    )
        .prop_map(|(kind, name)| json!({"kind": kind, "name": name}))
}

fn status() -> impl Strategy<Value = Option<Value>> {
    proptest::option::of(
        (
            proptest::option::of(text()),
            proptest::collection::vec((text(), text(), text()), 0..3),
            proptest::option::of(store_ref()),
        )
            .prop_map(|(id, conditions, store)| {
                let store = store.map(|store| {
                    format!(
                        "{}/{}",
                        store["kind"].as_str().unwrap_or_default(),
                        store["name"].as_str().unwrap_or_default()
                    )
                });
                json!({
                    "id": id,
                    "store": store,
                    "observedGeneration": 3,
                    "conditions": conditions.into_iter().map(|(type_, status, reason)| json!({
                        "type": type_, "status": status, "reason": reason,
                        "lastTransitionTime": "2024-01-02T03:04:05Z",
                    })).collect::<Vec<_>>(),
                })
            }),
    )
}

/// An arbitrary Pet in `api_version` with `birthday` and, maybe, more
/// fields the conversion knows nothing of.
fn pet(
    api_version: &'static str,
    birthday: impl Strategy<Value = String>,
) -> impl Strategy<Value = Value> {
    (
        birthday,
        text(),
        prop_oneof![Just("dog"), Just("cat"), Just("bird"), Just("reptile")],
        proptest::option::of(prop_oneof![Just("Delete"), Just("Orphan")]),
        string_map(),
        string_map(),
        status(),
        proptest::option::of(text()),
        proptest::option::of(store_ref()),
    )
        .prop_map(
            move |(birthday, name, kind, policy, annotations, labels, status, unknown, store)| {
                let mut pet = json!({
                    "apiVersion": api_version,
                    "kind": "Pet",
                    "metadata": {"name": "p", "namespace": "n", "uid": "u", "generation": 2},
                    "spec": {"name": name, "type": kind, "birthday": birthday},
                });
                if let Some(policy) = policy {
                    pet["spec"]["deletionPolicy"] = policy.into();
                }
                if let Some(annotations) = annotations {
                    pet["metadata"]["annotations"] = annotations;
                }
                if let Some(labels) = labels {
                    pet["metadata"]["labels"] = labels;
                }
                if let Some(status) = status {
                    pet["status"] = status;
                }
                if let Some(unknown) = unknown {
                    pet["spec"]["futureField"] = unknown.into();
                }
                if let Some(store) = store {
                    pet["spec"]["storeRef"] = store;
                }
                pet
            },
        )
}

/// A v1 Pet as the API server stores it: its annotation, if any, is one
/// the conversion wrote (a timestamp on the same date that is not its
/// midnight UTC).
fn stored_v1_pet() -> impl Strategy<Value = Value> {
    (pet(V1, date().prop_map(|d| d.to_string())), timestamp()).prop_map(|(mut pet, written)| {
        if let Some(kept) = parse_timestamp(&written) {
            let date = kept.date_naive();
            if written != midnight_utc(date) {
                pet["spec"]["birthday"] = date.to_string().into();
                let metadata = pet["metadata"].as_object_mut().expect("metadata");
                let annotations = metadata.entry("annotations").or_insert_with(|| json!({}));
                annotations[V1ALPHA1_BIRTHDAY_ANNOTATION] = written.into();
            }
        }
        pet
    })
}

/// The store's record for a Pet of either version, through the typed spec.
fn record(pet: &Value) -> PetData {
    let spec = pet["spec"].clone();
    if pet["apiVersion"] == V1 {
        PetData::from(&serde_json::from_value::<v1::PetSpec>(spec).expect("a v1 spec"))
    } else {
        // What the store would keep: the date as written, in its offset.
        let spec: v1alpha1::PetSpec = serde_json::from_value(spec).expect("a v1alpha1 spec");
        let birthday = spec.birth_date();
        PetData {
            name: spec.name,
            pet_type: spec.pet_type,
            birthday,
        }
    }
}

proptest! {
    #[test]
    fn v1alpha1_to_v1_and_back_is_identical(pet in pet(V1ALPHA1, timestamp())) {
        let up = convert(pet.clone(), V1).expect("up");
        prop_assert_eq!(&up["apiVersion"], V1);
        prop_assert!(parse_date(up["spec"]["birthday"].as_str().unwrap_or_default()).is_some());
        // The store sees the same calendar date through either version.
        prop_assert_eq!(record(&up), record(&pet));
        let down = convert(up, V1ALPHA1).expect("down");
        prop_assert_eq!(down, pet);
    }

    #[test]
    fn v1_to_v1alpha1_and_back_is_identical(pet in stored_v1_pet()) {
        let down = convert(pet.clone(), V1ALPHA1).expect("down");
        prop_assert_eq!(&down["apiVersion"], V1ALPHA1);
        prop_assert_eq!(annotation(&down), None);
        prop_assert_eq!(record(&down), record(&pet));
        let up = convert(down, V1).expect("up");
        prop_assert_eq!(up, pet);
    }
}
