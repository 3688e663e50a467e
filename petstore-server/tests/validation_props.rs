//! Property tests of validation at the edge: arbitrary wire bytes and
//! arbitrary pets never panic, and a request is accepted exactly when an
//! independent statement of the rules says it is valid.

use chrono::NaiveDate;
use petstore_proto::google::r#type::Date;
use petstore_proto::petstore as pb;
use petstore_server::model::{MAX_BATCH, MAX_IDENTITY_CHARS, MAX_KEY_CHARS, MAX_NAME_CHARS};
use petstore_server::validate;
use proptest::prelude::*;
use prost::Message;

/// The rules for a pet's fields, written independently of the code under
/// test. (UpdatePets ignores idempotency_key and identity, so they are
/// checked separately.)
fn valid_fields(pet: &pb::Pet) -> bool {
    let name_ok = !pet.name.trim().is_empty() && pet.name.chars().count() <= MAX_NAME_CHARS;
    let type_ok = (1..=4).contains(&pet.r#type);
    let date_ok = pet.birthday.as_ref().is_some_and(|d| {
        (1..=9999).contains(&d.year)
            && d.month > 0
            && d.day > 0
            && NaiveDate::from_ymd_opt(d.year, d.month as u32, d.day as u32).is_some()
    });
    name_ok && type_ok && date_ok
}

fn valid_new_pet(pet: &pb::Pet) -> bool {
    pet.id.is_empty()
        && valid_fields(pet)
        && pet.idempotency_key.chars().count() <= MAX_KEY_CHARS
        && pet.identity.chars().count() <= MAX_IDENTITY_CHARS
}

fn arb_date() -> impl Strategy<Value = Option<Date>> {
    prop_oneof![
        1 => Just(None),
        6 => (-5..10_005i32, -2..15i32, -2..34i32).prop_map(|(year, month, day)| Some(Date { year, month, day })),
        3 => (1900..2100i32, 1..=12i32, 1..=31i32).prop_map(|(year, month, day)| Some(Date { year, month, day })),
    ]
}

fn arb_name() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-zA-Z][a-zA-Z ]{0,20}",
        "[ \t\n]{0,5}",
        "\\PC{0,140}",
        Just("x".repeat(MAX_NAME_CHARS)),
        Just("é".repeat(MAX_NAME_CHARS + 1)),
    ]
}

fn arb_pet() -> impl Strategy<Value = pb::Pet> {
    (
        prop_oneof![4 => Just(String::new()), 1 => "[a-f0-9-]{1,36}"],
        arb_name(),
        prop_oneof![-1..6i32, any::<i32>()],
        arb_date(),
        prop_oneof![4 => Just(String::new()), 1 => "[a-z0-9-]{1,40}", 1 => "k{120,140}"],
        prop_oneof![4 => Just(String::new()), 1 => "[a-z0-9/-]{1,40}", 1 => "é{315,325}"],
    )
        .prop_map(
            |(id, name, r#type, birthday, idempotency_key, identity)| pb::Pet {
                id,
                name,
                r#type,
                birthday,
                idempotency_key,
                identity,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn add_accepts_exactly_the_valid_batches(pets in prop::collection::vec(arb_pet(), 0..6)) {
        let expected = pets.iter().all(valid_new_pet);
        let result = validate::add_request(&pb::AddPetsReq { pets: pets.clone() });
        prop_assert_eq!(result.is_ok(), expected, "{:?} -> {:?}", pets, result);
        if let Err(status) = result {
            prop_assert_eq!(status.code(), tonic::Code::InvalidArgument);
            prop_assert!(status.message().starts_with("pets["), "{}", status.message());
        }
    }

    #[test]
    fn update_accepts_exactly_the_valid_batches(pets in prop::collection::vec(arb_pet(), 0..6)) {
        let expected = pets.iter().all(|p| !p.id.trim().is_empty() && valid_fields(p));
        let result = validate::update_request(&pb::UpdatePetsReq { pets: pets.clone() });
        prop_assert_eq!(result.is_ok(), expected, "{:?} -> {:?}", pets, result);
    }

    #[test]
    fn arbitrary_bytes_never_panic_and_never_yield_an_invalid_pet(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        if let Ok(req) = pb::AddPetsReq::decode(bytes.as_slice())
            && let Ok(pets) = validate::add_request(&req)
        {
            prop_assert_eq!(pets.len(), req.pets.len());
            prop_assert!(req.pets.iter().all(valid_new_pet));
        }
        if let Ok(req) = pb::UpdatePetsReq::decode(bytes.as_slice()) {
            let _ = validate::update_request(&req);
        }
        if let Ok(req) = pb::SearchPetsReq::decode(bytes.as_slice()) {
            let _ = validate::search_request(&req);
        }
    }
}

#[test]
fn batches_over_the_limit_are_refused_before_any_pet_is_examined() {
    let pets = vec![pb::Pet::default(); MAX_BATCH + 1];
    let status = validate::add_request(&pb::AddPetsReq { pets }).expect_err("too many");
    assert!(
        status.message().starts_with("pets: at most 1000"),
        "{}",
        status.message()
    );
}
