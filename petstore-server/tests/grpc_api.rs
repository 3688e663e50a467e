//! The same suite runs against every storage backend, through a real server
//! on loopback TCP and a tonic client.

use std::sync::Arc;

use petstore_proto::PetStoreClient;
use petstore_proto::petstore::{self as pb, PetType};
use petstore_server::admission::{Admission, PUSHBACK_TRAILER};
use petstore_server::model::{NewPet, PetFields, PetRecord, SearchFilter, ValidPetType};
use petstore_server::server::ServeOptions;
use petstore_server::storage::{Cursor, PageRequest, Storage, StorageConfig, search_all};
use petstore_server::tenancy::Access;
use tonic::Code;
use tonic::transport::Channel;

#[macro_use]
mod support;

use support::{
    Backend, Running, add, assert_metrics, assert_refused, assert_status, date, keyed, pet, thor,
    tron,
};

async fn start_with(storage: Arc<dyn Storage>, dir: tempfile::TempDir) -> Running {
    start_with_options(storage, dir, ServeOptions::default()).await
}

async fn start_with_options(
    storage: Arc<dyn Storage>,
    dir: tempfile::TempDir,
    options: ServeOptions,
) -> Running {
    Running::serve(storage, Arc::new(dir), options).await
}

async fn open(backend: Backend, dir: &tempfile::TempDir) -> Arc<dyn Storage> {
    let config = backend.config(dir, "conformance").await;
    config.open().await.expect("open storage")
}

async fn start(backend: Backend) -> Running {
    let dir = tempfile::tempdir().expect("tempdir");
    let storage = open(backend, &dir).await;
    start_with(storage, dir).await
}

/// A search for the pets with any of `names`.
fn by_names(names: &[&str]) -> pb::SearchPetsReq {
    pb::SearchPetsReq {
        names: names.iter().map(|name| (*name).to_owned()).collect(),
        ..Default::default()
    }
}

/// Every pet the search finds, sorted by name.
async fn search(client: &mut PetStoreClient<Channel>, req: pb::SearchPetsReq) -> Vec<pb::Pet> {
    let mut pets = support::searched(client, req).await.expect("search");
    pets.sort_by(|a, b| a.name.cmp(&b.name));
    pets
}

async fn all(client: &mut PetStoreClient<Channel>) -> Vec<pb::Pet> {
    search(client, pb::SearchPetsReq::default()).await
}

async fn add_rejected(client: &mut PetStoreClient<Channel>, pets: Vec<pb::Pet>) -> tonic::Status {
    client
        .add_pets(pb::AddPetsReq { pets })
        .await
        .expect_err("request should be rejected")
}

/// One call per input, all at once, each on its own client of the
/// server's connection (spawned before any is awaited, so they race); the
/// answers in the inputs' order.
async fn at_once<I, T, Call, Answer>(
    s: &Running,
    inputs: impl IntoIterator<Item = I>,
    call: Call,
) -> Vec<T>
where
    Call: Fn(PetStoreClient<Channel>, I) -> Answer,
    Answer: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let tasks: Vec<_> = inputs
        .into_iter()
        .map(|input| tokio::spawn(call(PetStoreClient::new(s.channel.clone()), input)))
        .collect();
    let mut answers = Vec::with_capacity(tasks.len());
    for task in tasks {
        answers.push(task.await.expect("task"));
    }
    answers
}

/// The answers of a race that were granted; every other must be the
/// refusal `refused` asserts.
fn winners<T>(answers: Vec<Result<T, tonic::Status>>, refused: impl Fn(&tonic::Status)) -> Vec<T> {
    let mut granted = Vec::new();
    for answer in answers {
        match answer {
            Ok(winner) => granted.push(winner),
            Err(status) => refused(&status),
        }
    }
    granted
}

async fn update_rejected(
    client: &mut PetStoreClient<Channel>,
    pets: Vec<pb::Pet>,
) -> tonic::Status {
    client
        .update_pets(pb::UpdatePetsReq { pets })
        .await
        .expect_err("request should be rejected")
}

// ---- the suite -------------------------------------------------------------

async fn add_returns_ids_in_request_order(backend: Backend) {
    let mut s = start(backend).await;
    let ids = add(&mut s.client, vec![thor(), tron()]).await;
    assert_eq!(ids.len(), 2);
    assert_ne!(ids[0], ids[1]);
    let found = all(&mut s.client).await;
    assert_eq!(found.len(), 2);
    assert_eq!((found[0].name.as_str(), &found[0].id), ("Thor", &ids[0]));
    assert_eq!((found[1].name.as_str(), &found[1].id), ("Tron", &ids[1]));
    assert_eq!(found[0].birthday, date(2021, 4, 1));
    assert_eq!(found[1].r#type, i32::from(PetType::PtFeline));
    s.stop().await;
}

async fn update_replaces_fields_and_unknown_id_changes_nothing(backend: Backend) {
    let mut s = start(backend).await;
    let ids = add(&mut s.client, vec![thor(), tron()]).await;
    let mut thorbert = pet("Thorbert", PetType::PtCanine, date(2021, 4, 2));
    thorbert.id = ids[0].clone();
    s.client
        .update_pets(pb::UpdatePetsReq {
            pets: vec![thorbert.clone()],
        })
        .await
        .expect("update");
    let found = all(&mut s.client).await;
    assert_eq!(found[0].name, "Thorbert");
    assert_eq!(found[0].id, ids[0]);
    assert_eq!(found[0].birthday, date(2021, 4, 2));

    // One known and one unknown ID: NOT_FOUND, and the known one is untouched.
    let mut renamed = thorbert.clone();
    renamed.name = "Changed".into();
    let mut ghost = tron();
    ghost.id = "no-such-id".into();
    let err = update_rejected(&mut s.client, vec![renamed, ghost]).await;
    assert_status(&err, Code::NotFound, "pets[1].id");
    assert_eq!(all(&mut s.client).await[0].name, "Thorbert");
    s.stop().await;
}

async fn delete_is_idempotent(backend: Backend) {
    let mut s = start(backend).await;
    let ids = add(&mut s.client, vec![thor(), tron()]).await;
    for _ in 0..2 {
        s.client
            .delete_pets(pb::DeletePetsReq {
                ids: vec![ids[0].clone(), "never-existed".into()],
            })
            .await
            .expect("delete");
    }
    let left = all(&mut s.client).await;
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].id, ids[1]);
    s.stop().await;
}

async fn search_filters_narrow_and_range_is_half_open(backend: Backend) {
    let mut s = start(backend).await;
    add(
        &mut s.client,
        vec![
            thor(),
            tron(),
            pet("Polly", PetType::PtBird, date(2021, 4, 2)),
            pet("Rex", PetType::PtReptile, date(2021, 3, 31)),
            pet("Thor", PetType::PtFeline, date(2019, 1, 1)),
        ],
    )
    .await;
    let names = |pets: Vec<pb::Pet>| pets.into_iter().map(|p| p.name).collect::<Vec<_>>();

    assert_eq!(all(&mut s.client).await.len(), 5);
    let by_name = search(&mut s.client, by_names(&["Thor"])).await;
    assert_eq!(by_name.len(), 2);
    let by_name_and_type = search(
        &mut s.client,
        pb::SearchPetsReq {
            names: vec!["Thor".into()],
            types: vec![PetType::PtCanine.into()],
            ..Default::default()
        },
    )
    .await;
    assert_eq!(names(by_name_and_type), ["Thor"]);
    let by_types = search(
        &mut s.client,
        pb::SearchPetsReq {
            types: vec![PetType::PtBird.into(), PetType::PtReptile.into()],
            ..Default::default()
        },
    )
    .await;
    assert_eq!(names(by_types), ["Polly", "Rex"]);

    // [2021-04-01, 2021-04-02): includes Thor (04-01), excludes Polly (04-02)
    // and Rex (03-31).
    let range = |start, end| pb::SearchPetsReq {
        birthdate_range: Some(pb::DateRange { start, end }),
        ..Default::default()
    };
    let day = search(&mut s.client, range(date(2021, 4, 1), date(2021, 4, 2))).await;
    assert_eq!(names(day), ["Thor"]);
    let open_end = search(&mut s.client, range(date(2021, 4, 1), None)).await;
    assert_eq!(names(open_end), ["Polly", "Thor"]);
    let open_start = search(&mut s.client, range(None, date(2021, 4, 1))).await;
    assert_eq!(names(open_start), ["Rex", "Thor", "Tron"]);

    let err = s
        .client
        .search_pets(range(date(2021, 2, 30), None))
        .await
        .expect_err("bad range");
    assert_status(&err, Code::InvalidArgument, "birthdate_range.start");
    let err = s
        .client
        .search_pets(pb::SearchPetsReq {
            types: vec![PetType::PtUnknown.into()],
            ..Default::default()
        })
        .await
        .expect_err("unknown type filter");
    assert!(err.message().contains("types[0]"), "{}", err.message());
    s.stop().await;
}

async fn every_validation_rule_names_field_and_pet_and_stores_nothing(backend: Backend) {
    let mut s = start(backend).await;
    let with_id = pb::Pet {
        id: "preset".into(),
        ..thor()
    };
    let cases: Vec<(pb::Pet, &str)> = vec![
        (with_id, "pets[1].id"),
        (pet("", PetType::PtCanine, date(2021, 4, 1)), "pets[1].name"),
        (
            pet(" \t ", PetType::PtCanine, date(2021, 4, 1)),
            "pets[1].name",
        ),
        (
            pet(&"x".repeat(129), PetType::PtCanine, date(2021, 4, 1)),
            "pets[1].name",
        ),
        (
            pet("Nemo", PetType::PtUnknown, date(2021, 4, 1)),
            "pets[1].type",
        ),
        (
            pet("Nemo", PetType::PtCanine, date(2021, 13, 1)),
            "pets[1].birthday",
        ),
        (
            pet("Nemo", PetType::PtCanine, date(2021, 2, 31)),
            "pets[1].birthday",
        ),
        (pet("Nemo", PetType::PtCanine, None), "pets[1].birthday"),
        (
            pb::Pet {
                idempotency_key: "k".repeat(129),
                ..thor()
            },
            "pets[1].idempotency_key",
        ),
        (
            pb::Pet {
                identity: "i".repeat(321),
                ..thor()
            },
            "pets[1].identity",
        ),
    ];
    for (bad, field) in cases {
        // A valid pet first: the whole batch must be refused.
        let err = add_rejected(&mut s.client, vec![tron(), bad.clone()]).await;
        assert_refused(&err, Code::InvalidArgument, field);
        assert!(err.message().contains("pet #1"), "{}", err.message());
    }
    assert!(all(&mut s.client).await.is_empty(), "nothing may be stored");

    // Update: missing ID, and a batch with one invalid pet changes nothing.
    let ids = add(&mut s.client, vec![thor()]).await;
    let err = update_rejected(&mut s.client, vec![tron()]).await;
    assert_refused(&err, Code::InvalidArgument, "pets[0].id");
    let mut renamed = thor();
    renamed.id = ids[0].clone();
    renamed.name = "Renamed".into();
    let mut invalid = renamed.clone();
    invalid.r#type = PetType::PtUnknown.into();
    let err = update_rejected(&mut s.client, vec![renamed, invalid]).await;
    assert!(
        err.message().starts_with("pets[1].type"),
        "{}",
        err.message()
    );
    assert_eq!(all(&mut s.client).await[0].name, "Thor");

    // Batches over the documented size.
    let err = add_rejected(&mut s.client, vec![thor(); 1001]).await;
    assert_refused(&err, Code::InvalidArgument, "pets:");
    let err = s
        .client
        .delete_pets(pb::DeletePetsReq {
            ids: vec!["x".into(); 1001],
        })
        .await
        .expect_err("too many ids");
    assert!(err.message().starts_with("ids:"), "{}", err.message());
    assert_eq!(all(&mut s.client).await.len(), 1);
    s.stop().await;
}

async fn idempotency_keys_deduplicate_and_are_findable(backend: Backend) {
    let mut s = start(backend).await;
    let keyed = |key: &str| pb::Pet {
        idempotency_key: key.into(),
        ..thor()
    };
    let first = add(&mut s.client, vec![keyed("uid-1")]).await;
    let again = add(
        &mut s.client,
        vec![keyed("uid-1"), keyed("uid-2"), keyed("uid-2")],
    )
    .await;
    assert_eq!(again[0], first[0], "same key, same record");
    assert_eq!(again[1], again[2], "a key repeated within one batch");
    assert_eq!(all(&mut s.client).await.len(), 2);

    // The reply says which pets this call added: a client that sent a key
    // learns whether the record was already there (and may hold other data).
    let renamed = pb::Pet {
        name: "Someone else".into(),
        ..keyed("uid-2")
    };
    let answer = s
        .client
        .add_pets(pb::AddPetsReq {
            pets: vec![renamed, keyed("uid-3"), keyed("uid-3"), thor()],
        })
        .await
        .expect("add")
        .into_inner();
    assert_eq!(answer.ids[0], again[1]);
    assert_eq!(answer.created, [false, true, false, true]);

    let got = s
        .client
        .get_pets(pb::GetPetsReq {
            ids: vec![first[0].clone(), "missing-id".into()],
            idempotency_keys: vec!["uid-2".into(), "uid-1".into(), "missing-key".into()],
            ..Default::default()
        })
        .await
        .expect("get")
        .into_inner();
    let got_ids: Vec<_> = got.pets.iter().map(|p| p.id.as_str()).collect();
    assert_eq!(got_ids, [first[0].as_str(), again[1].as_str()]);
    assert_eq!(got.pets[0].idempotency_key, "uid-1");
    assert_eq!(got.missing_ids, ["missing-id"]);
    assert_eq!(got.missing_idempotency_keys, ["missing-key"]);

    // Deleting a record frees its key: the next create makes a new record.
    s.client
        .delete_pets(pb::DeletePetsReq {
            ids: vec![first[0].clone()],
        })
        .await
        .expect("delete");
    let recreated = add(&mut s.client, vec![keyed("uid-1")]).await;
    assert_ne!(recreated[0], first[0]);
    s.stop().await;
}

async fn concurrent_adds_get_unique_ids_and_all_are_found(backend: Backend) {
    let s = start(backend).await;
    let added = at_once(&s, 0..32, |mut client, task| async move {
        let mut ids = Vec::new();
        for n in 0..20 {
            let name = format!("pet-{task}-{n}");
            ids.extend(
                add(
                    &mut client,
                    vec![pet(&name, PetType::PtBird, date(2020, 1, 1))],
                )
                .await,
            );
        }
        ids
    })
    .await;
    let mut ids = std::collections::HashSet::new();
    for id in added.into_iter().flatten() {
        assert!(ids.insert(id), "duplicate id");
    }
    assert_eq!(ids.len(), 640);
    let mut client = PetStoreClient::new(s.channel.clone());
    let req = pb::GetPetsReq {
        ids: ids.iter().take(1000).cloned().collect(),
        ..Default::default()
    };
    let found = get(&mut client, req).await;
    assert_eq!(found.pets.len(), 640);
    assert!(found.missing_ids.is_empty());
    s.stop().await;
}

async fn oversized_message_is_rejected_cleanly(backend: Backend) {
    let mut s = start(backend).await;
    let huge = pb::DeletePetsReq {
        ids: vec!["x".repeat(8 * 1024 * 1024)],
    };
    let err = s.client.delete_pets(huge).await.expect_err("too large");
    assert_eq!(err.code(), Code::OutOfRange, "{err:?}");
    // The server is still healthy afterwards.
    assert!(all(&mut s.client).await.is_empty());
    s.stop().await;
}

fn change(id: &str, expected_key: &str, new_key: &str) -> pb::KeyChange {
    pb::KeyChange {
        id: id.into(),
        expected_key: expected_key.into(),
        new_key: new_key.into(),
        new_identity: None,
    }
}

async fn set_keys(
    client: &mut PetStoreClient<Channel>,
    changes: Vec<pb::KeyChange>,
) -> Result<(), tonic::Status> {
    client
        .set_idempotency_keys(pb::SetIdempotencyKeysReq { changes })
        .await
        .map(drop)
}

/// A GetPets that must be answered.
async fn get(client: &mut PetStoreClient<Channel>, req: pb::GetPetsReq) -> pb::GetPetsResp {
    client.get_pets(req).await.expect("get").into_inner()
}

/// The pets with `ids`, every one of which must be found.
async fn found_ids(client: &mut PetStoreClient<Channel>, ids: &[String]) -> Vec<pb::Pet> {
    let req = pb::GetPetsReq {
        ids: ids.to_vec(),
        ..Default::default()
    };
    let found = get(client, req).await;
    assert!(found.missing_ids.is_empty(), "{:?}", found.missing_ids);
    found.pets
}

/// The key each ID holds now, read back through GetPets.
async fn keys_of(client: &mut PetStoreClient<Channel>, ids: &[String]) -> Vec<String> {
    let found = found_ids(client, ids).await;
    found.into_iter().map(|p| p.idempotency_key).collect()
}

async fn key_changes_are_compare_and_set(backend: Backend) {
    let mut s = start(backend).await;
    let keyed = |key: &str| pb::Pet {
        idempotency_key: key.into(),
        ..thor()
    };
    let ids = add(&mut s.client, vec![thor(), keyed("uid-b")]).await;
    let (free, owned) = (ids[0].clone(), ids[1].clone());

    // Claiming an unkeyed pet succeeds once; the same claim again is a no-op
    // success only with the new key as the expected one.
    set_keys(&mut s.client, vec![change(&free, "", "uid-a")])
        .await
        .expect("claim");
    let lost = set_keys(&mut s.client, vec![change(&free, "", "uid-c")])
        .await
        .expect_err("a second claim with a stale expected key");
    assert_refused(&lost, Code::FailedPrecondition, "changes[0].expected_key:");
    assert!(lost.message().contains("uid-a"), "{}", lost.message());
    set_keys(&mut s.client, vec![change(&free, "uid-a", "uid-a")])
        .await
        .expect("setting the key it has");

    // The key now finds the pet, and AddPets with it creates nothing.
    assert_eq!(
        add(&mut s.client, vec![keyed("uid-a")]).await,
        std::slice::from_ref(&free)
    );

    // A key may move between pets in one batch: released by one, taken by
    // the other.
    set_keys(
        &mut s.client,
        vec![change(&free, "uid-a", ""), change(&owned, "uid-b", "uid-a")],
    )
    .await
    .expect("a key released and taken in one batch");
    assert_eq!(keys_of(&mut s.client, &ids).await, ["", "uid-a"]);
    set_keys(
        &mut s.client,
        vec![change(&free, "", "uid-x"), change(&owned, "uid-a", "uid-b")],
    )
    .await
    .expect("two independent changes");
    set_keys(
        &mut s.client,
        vec![
            change(&free, "uid-x", "uid-y"),
            change(&owned, "uid-b", "uid-x"),
        ],
    )
    .await
    .expect("a swap through a released key");
    assert_eq!(keys_of(&mut s.client, &ids).await, ["uid-y", "uid-x"]);

    let err = set_keys(
        &mut s.client,
        vec![
            change(&free, "uid-y", ""),
            change(&owned, "uid-x", "uid-z"),
            change(&free, "", ""),
        ],
    )
    .await
    .expect_err("the same pet twice");
    assert_refused(&err, Code::InvalidArgument, "changes[2].id:");
    // A key another pet holds is refused, and the batch changes nothing.
    add(&mut s.client, vec![keyed("uid-held")]).await;
    let err = set_keys(
        &mut s.client,
        vec![
            change(&free, "uid-y", "uid-q"),
            change(&owned, "uid-x", "uid-held"),
        ],
    )
    .await
    .expect_err("a key held by another pet");
    assert_refused(&err, Code::AlreadyExists, "changes[1].new_key:");
    assert_eq!(keys_of(&mut s.client, &ids).await, ["uid-y", "uid-x"]);

    // An unknown ID is NOT_FOUND and the rest of the batch is not applied.
    let err = set_keys(
        &mut s.client,
        vec![change(&free, "uid-y", ""), change("no-such-id", "", "k")],
    )
    .await
    .expect_err("unknown id");
    assert_refused(&err, Code::NotFound, "changes[1].id:");
    assert_eq!(keys_of(&mut s.client, &ids).await, ["uid-y", "uid-x"]);

    // Released keys no longer find anything; a released pet is claimable.
    set_keys(&mut s.client, vec![change(&free, "uid-y", "")])
        .await
        .expect("release");
    let released = pb::GetPetsReq {
        idempotency_keys: vec!["uid-y".into(), "uid-a".into()],
        ..Default::default()
    };
    let found = get(&mut s.client, released).await;
    assert!(found.pets.is_empty(), "{:?}", found.pets);
    let err = set_keys(&mut s.client, vec![change(&free, "", &"k".repeat(129))])
        .await
        .expect_err("key too long");
    assert_refused(&err, Code::InvalidArgument, "changes[0].new_key:");
    s.stop().await;
}

/// Many clients race to claim one unkeyed pet: exactly one wins.
async fn racing_claims_have_one_winner(backend: Backend) {
    let mut s = start(backend).await;
    let id = add(&mut s.client, vec![thor()]).await.remove(0);
    let answers = at_once(&s, 0..16, |mut client, n| {
        let id = id.clone();
        async move {
            let key = format!("uid-{n}");
            set_keys(&mut client, vec![change(&id, "", &key)])
                .await
                .map(|()| key)
        }
    })
    .await;
    let winners = winners(answers, |status| {
        assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    });
    assert_eq!(winners.len(), 1, "{winners:?}");
    assert_eq!(keys_of(&mut s.client, &[id]).await, winners);
    s.stop().await;
}

/// A dog born when Thor was, with idempotency key `key` and identity
/// `identity` (either may be empty).
fn identified(key: &str, identity: &str) -> pb::Pet {
    pb::Pet {
        idempotency_key: key.into(),
        identity: identity.into(),
        ..thor()
    }
}

async fn add_answer(client: &mut PetStoreClient<Channel>, pets: Vec<pb::Pet>) -> pb::AddPetsResp {
    client
        .add_pets(pb::AddPetsReq { pets })
        .await
        .expect("add")
        .into_inner()
}

async fn get_identities(
    client: &mut PetStoreClient<Channel>,
    identities: &[&str],
) -> pb::GetPetsResp {
    let req = pb::GetPetsReq {
        identities: identities.iter().map(|i| (*i).to_owned()).collect(),
        ..Default::default()
    };
    get(client, req).await
}

/// Asserts the (key, identity) each of `ids` holds now, read back through
/// GetPets.
async fn assert_held(
    client: &mut PetStoreClient<Channel>,
    ids: &[String],
    expected: &[(&str, &str)],
) {
    let found = found_ids(client, ids).await;
    let held: Vec<(&str, &str)> = found
        .iter()
        .map(|p| (p.idempotency_key.as_str(), p.identity.as_str()))
        .collect();
    assert_eq!(held, expected, "the (key, identity) of {ids:?}");
}

async fn identities_deduplicate_and_are_findable(backend: Backend) {
    let mut s = start(backend).await;
    let created = add_answer(&mut s.client, vec![identified("uid-1", "ns/thor")]).await;
    assert_eq!(created.created, [true]);
    let thor_id = created.ids[0].clone();

    // An identity a record holds returns that record and creates nothing,
    // whatever key the pet brings; a repeat within the batch is the same
    // record, as a repeated key is.
    let answer = add_answer(
        &mut s.client,
        vec![
            identified("uid-2", "ns/thor"),
            identified("", "ns/thor"),
            pb::Pet {
                name: "Tron".into(),
                ..identified("uid-3", "ns/tron")
            },
            identified("uid-4", "ns/tron"),
            identified("", "ns/tron"),
        ],
    )
    .await;
    let tron_id = answer.ids[2].clone();
    assert_eq!(
        answer.ids,
        [&thor_id, &thor_id, &tron_id, &tron_id, &tron_id].map(String::as_str)
    );
    assert_eq!(answer.created, [false, false, true, false, false]);
    // The key is checked first: a known key wins over another's identity.
    let answer = add_answer(
        &mut s.client,
        vec![identified("uid-1", "ns/tron"), identified("uid-3", "")],
    )
    .await;
    assert_eq!(answer.ids, [thor_id.as_str(), tron_id.as_str()]);
    assert_eq!(answer.created, [false, false]);
    assert_eq!(all(&mut s.client).await.len(), 2, "nothing more created");
    // The records are as created: the keys the refused pets brought were
    // not stored.
    assert_held(
        &mut s.client,
        &[thor_id.clone(), tron_id.clone()],
        &[("uid-1", "ns/thor"), ("uid-3", "ns/tron")],
    )
    .await;

    // By ID, then key, then identity; each pet once, where first found.
    let got = s
        .client
        .get_pets(pb::GetPetsReq {
            ids: vec![tron_id.clone()],
            idempotency_keys: vec!["uid-2".into()],
            identities: vec![
                "ns/nobody".into(),
                "ns/thor".into(),
                "ns/tron".into(),
                String::new(),
            ],
        })
        .await
        .expect("get")
        .into_inner();
    let got_ids: Vec<_> = got.pets.iter().map(|p| p.id.as_str()).collect();
    assert_eq!(got_ids, [&tron_id, &thor_id]);
    assert_eq!(got.pets[1].identity, "ns/thor");
    assert_eq!(got.pets[1].name, "Thor");
    assert!(got.missing_ids.is_empty());
    assert_eq!(got.missing_idempotency_keys, ["uid-2"]);
    assert_eq!(got.missing_identities, ["ns/nobody", ""]);
    // Search shows the identity too.
    let tron = search(&mut s.client, by_names(&["Tron"])).await;
    assert_eq!(tron[0].identity, "ns/tron");

    // Deleting a record frees its identity: the next create makes a new one.
    s.client
        .delete_pets(pb::DeletePetsReq {
            ids: vec![thor_id.clone()],
        })
        .await
        .expect("delete");
    assert_eq!(
        get_identities(&mut s.client, &["ns/thor"])
            .await
            .missing_identities,
        ["ns/thor"]
    );
    let recreated = add_answer(&mut s.client, vec![identified("", "ns/thor")]).await;
    assert_eq!(recreated.created, [true]);
    assert_ne!(recreated.ids[0], thor_id);
    let found = get_identities(&mut s.client, &["ns/thor"]).await;
    assert_eq!(found.pets[0].id, recreated.ids[0]);

    // Lookups are validated like the rest of the request.
    let long = "i".repeat(321);
    let err = s
        .client
        .get_pets(pb::GetPetsReq {
            identities: vec!["a".into(), "b".into(), "c".into(), long],
            ..Default::default()
        })
        .await
        .expect_err("identity too long");
    assert_refused(
        &err,
        Code::InvalidArgument,
        "identities[3]: must be at most 320 characters, got 321",
    );
    let err = s
        .client
        .get_pets(pb::GetPetsReq {
            identities: vec!["x".into(); 1001],
            ..Default::default()
        })
        .await
        .expect_err("too many identities");
    assert_refused(&err, Code::InvalidArgument, "identities:");
    s.stop().await;
}

fn with_identity(change: pb::KeyChange, identity: &str) -> pb::KeyChange {
    pb::KeyChange {
        new_identity: Some(identity.into()),
        ..change
    }
}

async fn identities_change_with_keys_all_or_nothing(backend: Backend) {
    let mut s = start(backend).await;
    let ids = add(
        &mut s.client,
        vec![identified("uid-a", ""), identified("uid-b", "ns/b")],
    )
    .await;
    let (a, b) = (ids[0].clone(), ids[1].clone());

    // The identity alone, the key kept (expected_key = new_key); the same
    // again changes nothing and succeeds.
    for _ in 0..2 {
        set_keys(
            &mut s.client,
            vec![with_identity(change(&a, "uid-a", "uid-a"), "ns/a")],
        )
        .await
        .expect("set the identity alone");
    }
    assert_held(&mut s.client, &ids, &[("uid-a", "ns/a"), ("uid-b", "ns/b")]).await;

    // An identity another pet holds: ALREADY_EXISTS naming it, and the
    // rest of the batch is not applied.
    let err = set_keys(
        &mut s.client,
        vec![
            change(&a, "uid-a", "uid-a2"),
            with_identity(change(&b, "uid-b", "uid-b"), "ns/a"),
        ],
    )
    .await
    .expect_err("an identity held by another pet");
    assert_refused(&err, Code::AlreadyExists, "changes[1].new_identity:");
    assert!(err.message().contains("\"ns/a\""), "{}", err.message());
    // The key is still compared.
    let err = set_keys(
        &mut s.client,
        vec![with_identity(change(&a, "stale", "uid-a"), "ns/z")],
    )
    .await
    .expect_err("a stale expected key");
    assert_refused(&err, Code::FailedPrecondition, "changes[0].expected_key:");
    assert_held(&mut s.client, &ids, &[("uid-a", "ns/a"), ("uid-b", "ns/b")]).await;

    // A release (the key cleared, the identity unset) keeps the identity,
    // which still finds the record, for AddPets too.
    set_keys(&mut s.client, vec![change(&a, "uid-a", "")])
        .await
        .expect("release");
    assert_held(&mut s.client, &ids, &[("", "ns/a"), ("uid-b", "ns/b")]).await;
    let again = add_answer(&mut s.client, vec![identified("uid-new", "ns/a")]).await;
    assert_eq!((again.ids, again.created), (vec![a.clone()], vec![false]));

    // Identities move between pets in one batch, as keys do: b gives up
    // ns/b, which a takes.
    set_keys(
        &mut s.client,
        vec![
            with_identity(change(&a, "", "uid-a"), "ns/b"),
            with_identity(change(&b, "uid-b", "uid-b"), "ns/c"),
        ],
    )
    .await
    .expect("an identity released and taken in one batch");
    assert_held(&mut s.client, &ids, &[("uid-a", "ns/b"), ("uid-b", "ns/c")]).await;
    // An empty identity clears it.
    set_keys(
        &mut s.client,
        vec![with_identity(change(&b, "uid-b", "uid-b"), "")],
    )
    .await
    .expect("clear");
    assert_held(&mut s.client, &ids, &[("uid-a", "ns/b"), ("uid-b", "")]).await;
    assert_eq!(
        get_identities(&mut s.client, &["ns/c"])
            .await
            .missing_identities,
        ["ns/c"]
    );

    // Validation names the field.
    let err = set_keys(
        &mut s.client,
        vec![
            with_identity(change(&a, "uid-a", "uid-a"), "ns/x"),
            with_identity(change(&b, "uid-b", "uid-b"), "ns/x"),
        ],
    )
    .await
    .expect_err("one identity for two pets");
    assert_refused(&err, Code::InvalidArgument, "changes[1].new_identity:");
    let err = set_keys(
        &mut s.client,
        vec![with_identity(
            change(&a, "uid-a", "uid-a"),
            &"i".repeat(321),
        )],
    )
    .await
    .expect_err("identity too long");
    assert_refused(
        &err,
        Code::InvalidArgument,
        "changes[0].new_identity: must be at most 320 characters, got 321",
    );

    // Deleting a frees ns/b for b.
    s.client
        .delete_pets(pb::DeletePetsReq {
            ids: vec![a.clone()],
        })
        .await
        .expect("delete");
    set_keys(
        &mut s.client,
        vec![with_identity(change(&b, "uid-b", "uid-b"), "ns/b")],
    )
    .await
    .expect("a freed identity");
    assert_held(&mut s.client, &[b], &[("uid-b", "ns/b")]).await;
    s.stop().await;
}

/// Clients racing for one identity: concurrent creates make one record,
/// and of concurrent changes giving it to different pets, one wins and the
/// others are ALREADY_EXISTS.
async fn racing_identity_claims_have_one_winner(backend: Backend) {
    let mut s = start(backend).await;
    let answers = at_once(&s, 0..8, |mut client, n| async move {
        add_answer(&mut client, vec![identified(&format!("uid-{n}"), "ns/one")]).await
    })
    .await;
    let created: Vec<_> = answers
        .iter()
        .map(|answer| (answer.ids[0].clone(), answer.created[0]))
        .collect();
    assert_eq!(
        created.iter().filter(|(_, new)| *new).count(),
        1,
        "{created:?}"
    );
    assert!(
        created.iter().all(|(id, _)| *id == created[0].0),
        "{created:?}"
    );

    let pets = add(&mut s.client, vec![thor(); 8]).await;
    let answers = at_once(&s, pets, |mut client, id| async move {
        set_keys(
            &mut client,
            vec![with_identity(change(&id, "", ""), "ns/two")],
        )
        .await
        .map(|()| id)
    })
    .await;
    let winners = winners(answers, |status| {
        assert_refused(status, Code::AlreadyExists, "changes[0].new_identity:");
    });
    assert_eq!(winners.len(), 1, "{winners:?}");
    let found = get_identities(&mut s.client, &["ns/two"]).await;
    assert_eq!(found.pets[0].id, winners[0]);
    s.stop().await;
}

/// Every filter shape (names through the name index, species, dates, and
/// combinations), at page sizes small enough that pages split runs of one
/// name, must return exactly what a full scan filtered by
/// `SearchFilter::matches` returns; and renames and deletes must move the
/// index with the data.
async fn search_equals_a_full_scan_page_by_page(backend: Backend) {
    let dir = tempfile::tempdir().expect("tempdir");
    let storage = open(backend, &dir).await;
    let names = ["Ada", "Bo", "Cy", "Dee", "Bo ", "bo", "Zoë"];
    let species = [
        ValidPetType::Canine,
        ValidPetType::Feline,
        ValidPetType::Bird,
        ValidPetType::Reptile,
    ];
    let day = |n: u32| chrono::NaiveDate::from_ymd_opt(2020, 1 + n % 12, 1 + n % 28).expect("date");
    let pets: Vec<_> = (0..240u32)
        .map(|n| NewPet {
            fields: PetFields {
                name: names[(n as usize * 7 + n as usize / 5) % names.len()].into(),
                pet_type: species[n as usize % 4],
                birthday: day(n),
            },
            idempotency_key: None,
            identity: None,
        })
        .collect();
    let ids: Vec<String> = storage
        .add(&Access::All, &pets)
        .await
        .expect("add")
        .into_iter()
        .map(|added| added.id)
        .collect();
    // Renames and deletes after the fact: the index must follow them.
    let renamed: Vec<_> = ids
        .iter()
        .step_by(9)
        .map(|id| petstore_server::model::PetUpdate {
            id: id.clone(),
            fields: PetFields {
                name: "Renamed".into(),
                pet_type: ValidPetType::Bird,
                birthday: day(3),
            },
        })
        .collect();
    storage
        .update(&Access::All, &renamed)
        .await
        .expect("rename");
    let deleted: Vec<_> = ids.iter().skip(4).step_by(11).cloned().collect();
    storage
        .delete(&Access::All, &deleted)
        .await
        .expect("delete");

    let everything = search_all(&*storage, &Access::All, &SearchFilter::default(), 1000)
        .await
        .expect("full scan");
    assert_eq!(everything.len(), 240 - 22);
    let mut seen = std::collections::HashSet::new();
    assert!(
        everything.iter().all(|p| seen.insert(p.id.clone())),
        "no duplicates"
    );

    let filters = vec![
        SearchFilter::default(),
        SearchFilter {
            names: vec!["Bo".into()],
            ..Default::default()
        },
        SearchFilter {
            names: vec!["Renamed".into(), "Ada".into(), "Ada".into()],
            ..Default::default()
        },
        SearchFilter {
            names: vec!["Zoë".into(), "nobody".into()],
            types: vec![ValidPetType::Feline],
            ..Default::default()
        },
        SearchFilter {
            types: vec![ValidPetType::Bird, ValidPetType::Reptile],
            ..Default::default()
        },
        SearchFilter {
            born_on_or_after: Some(day(3)),
            born_before: Some(day(7)),
            ..Default::default()
        },
        SearchFilter {
            names: vec!["Cy".into(), "Dee".into(), "bo".into()],
            types: vec![ValidPetType::Canine, ValidPetType::Bird],
            born_on_or_after: Some(day(2)),
            ..Default::default()
        },
        SearchFilter {
            names: vec!["nobody".into()],
            ..Default::default()
        },
    ];
    for filter in &filters {
        let mut expected: Vec<_> = everything
            .iter()
            .filter(|p| filter.matches(&p.fields))
            .map(|p| p.id.clone())
            .collect();
        expected.sort();
        for page in [1, 3, 7, 64, 1000] {
            let mut got: Vec<_> = search_all(&*storage, &Access::All, filter, page)
                .await
                .expect("search")
                .into_iter()
                .map(|p| p.id)
                .collect();
            got.sort();
            assert_eq!(got, expected, "filter {filter:?}, page size {page}");
        }
    }
}

/// The gRPC stream reads storage page by page; more records than a page
/// must all arrive, once each, and a selective filter must find exactly its
/// matches even though most pages then hold none.
async fn search_streams_more_than_a_page(backend: Backend) {
    let mut s = start(backend).await;
    let total = petstore_server::service::SEARCH_PAGE * 2 + 17;
    let reptile = |n: usize| n % 100 == 42;
    let mut added = std::collections::HashSet::new();
    for chunk in 0..total.div_ceil(500) {
        let pets = (chunk * 500..(chunk * 500 + 500).min(total))
            .map(|n| {
                pet(
                    if n % 2 == 0 { "Even" } else { "Odd" },
                    if reptile(n) {
                        PetType::PtReptile
                    } else {
                        PetType::PtBird
                    },
                    date(2020, 1, 1),
                )
            })
            .collect();
        added.extend(add(&mut s.client, pets).await);
    }
    let streamed = all(&mut s.client).await;
    let ids: std::collections::HashSet<_> = streamed.iter().map(|p| p.id.clone()).collect();
    assert_eq!(streamed.len(), total);
    assert_eq!(ids, added);
    let evens = search(&mut s.client, by_names(&["Even"])).await;
    assert_eq!(evens.len(), total.div_ceil(2));
    assert!(evens.iter().all(|p| p.name == "Even"));

    // The same pets whatever the order they come in.
    let ids_of = |pets: &[pb::Pet]| {
        let mut ids: Vec<_> = pets.iter().map(|p| p.id.clone()).collect();
        ids.sort();
        ids
    };
    let is_reptile = |p: &&pb::Pet| p.r#type == i32::from(PetType::PtReptile);
    let reptiles: Vec<_> = streamed.iter().filter(is_reptile).cloned().collect();
    assert_eq!(reptiles.len(), (0..total).filter(|&n| reptile(n)).count());
    let types = vec![PetType::PtReptile.into()];
    let found = search(
        &mut s.client,
        pb::SearchPetsReq {
            types: types.clone(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(
        ids_of(&found),
        ids_of(&reptiles),
        "reptiles, walking every record"
    );
    let even_reptiles: Vec<_> = reptiles.into_iter().filter(|p| p.name == "Even").collect();
    let found = search(
        &mut s.client,
        pb::SearchPetsReq {
            names: vec!["Even".into()],
            types,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(
        ids_of(&found),
        ids_of(&even_reptiles),
        "reptiles named Even, walking the name index"
    );
    s.stop().await;
}

/// A page bounds the entries it scans, not the pets it returns (the
/// contract on `Storage::search_page`): each page covers exactly the next
/// `limit` entries of the walk (every record by ID, or the name index's
/// entries by name then ID) and returns the matches among them, so a
/// selective filter gets empty pages that do not end the search, and only
/// the page with nothing after it does.
async fn a_page_scans_limit_entries_whatever_matches(backend: Backend) {
    const LIMIT: usize = 8;
    let dir = tempfile::tempdir().expect("tempdir");
    let storage = open(backend, &dir).await;
    let born = chrono::NaiveDate::from_ymd_opt(2020, 1, 1).expect("date");
    let names = ["Ada", "Bo", "Cy"];
    // 60 pets, 20 of each name, one in twenty a reptile.
    let pets: Vec<_> = (0..60usize)
        .map(|n| NewPet {
            fields: PetFields {
                name: names[n % 3].into(),
                pet_type: if n % 20 == 7 {
                    ValidPetType::Reptile
                } else {
                    ValidPetType::Canine
                },
                birthday: born,
            },
            idempotency_key: None,
            identity: None,
        })
        .collect();
    storage.add(&Access::All, &pets).await.expect("add");
    let everything = search_all(&*storage, &Access::All, &SearchFilter::default(), 1000)
        .await
        .expect("full scan");
    assert_eq!(everything.len(), pets.len());

    let reptiles = SearchFilter {
        types: vec![ValidPetType::Reptile],
        ..Default::default()
    };
    let nobody = SearchFilter {
        born_before: Some(born),
        ..Default::default()
    };
    let filters = [
        reptiles.clone(),
        nobody.clone(),
        SearchFilter {
            names: vec!["Cy".into(), "Bo".into()],
            ..reptiles
        },
        SearchFilter {
            names: vec!["Ada".into()],
            ..nobody
        },
    ];
    for filter in &filters {
        let by_name = !filter.names.is_empty();
        // The walk the contract describes, from the full scan.
        let mut walk: Vec<(Cursor, &PetRecord)> = everything
            .iter()
            .filter(|p| !by_name || filter.names.contains(&p.fields.name))
            .map(|p| {
                let name = if by_name {
                    p.fields.name.clone()
                } else {
                    String::new()
                };
                (
                    Cursor {
                        name,
                        id: p.id.clone(),
                    },
                    p,
                )
            })
            .collect();
        walk.sort_by(|(a, _), (b, _)| (&a.name, &a.id).cmp(&(&b.name, &b.id)));

        let pages = walk.len().div_ceil(LIMIT);
        let mut after = None;
        let mut empty_yet_not_last = 0;
        for (number, entries) in walk.chunks(LIMIT).enumerate() {
            let page = storage
                .search_page(PageRequest::new(&Access::All, filter, after, LIMIT))
                .await
                .expect("page");
            let want: Vec<&str> = entries
                .iter()
                .filter(|(_, p)| filter.matches(&p.fields))
                .map(|(_, p)| p.id.as_str())
                .collect();
            let got: Vec<&str> = page.pets.iter().map(|p| p.id.as_str()).collect();
            assert_eq!(
                got, want,
                "{filter:?}: page {number}, the matches among its entries"
            );
            if number + 1 == pages {
                assert_eq!(page.next, None, "{filter:?}: the last page ends the search");
            } else {
                let last = &entries[LIMIT - 1].0;
                assert_eq!(
                    page.next.as_ref(),
                    Some(last),
                    "{filter:?}: page {number} stops after {LIMIT} entries"
                );
                if page.pets.is_empty() {
                    empty_yet_not_last += 1;
                }
            }
            after = page.next;
        }
        assert!(
            empty_yet_not_last > 0,
            "{filter:?}: an empty page must not end the search"
        );
    }
}

async fn claim(
    client: &mut PetStoreClient<Channel>,
    installation: &str,
    holder: &str,
    ttl_seconds: i64,
) -> Result<pb::ClaimInstallationResp, tonic::Status> {
    client
        .claim_installation(pb::ClaimInstallationReq {
            installation: installation.into(),
            holder: holder.into(),
            ttl_seconds,
        })
        .await
        .map(tonic::Response::into_inner)
}

/// A claim that must be answered, granted or not.
async fn claimed(
    client: &mut PetStoreClient<Channel>,
    installation: &str,
    holder: &str,
    ttl_seconds: i64,
) -> pb::ClaimInstallationResp {
    claim(client, installation, holder, ttl_seconds)
        .await
        .expect("answered")
}

fn unix_millis_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after the epoch")
        .as_millis() as i64
}

/// A name is one holder's until its claim expires; the holder renews it,
/// another is refused and told who holds it until when; names are
/// independent; claims are no records.
async fn installation_claims_exclude_other_holders(backend: Backend) {
    let mut s = start(backend).await;
    let before = unix_millis_now();
    let first = claimed(&mut s.client, "blue", "cluster-a", 60).await;
    assert!(first.granted, "{first:?}");
    assert_eq!(first.holder, "cluster-a");
    assert_eq!(first.remaining_millis, 60_000);
    // The store's clock is this machine's (or its database's, here too).
    let expected = before + 60_000;
    assert!(
        (first.expires_at_unix_millis - expected).abs() < 10_000,
        "{first:?} vs {expected}"
    );

    let refused = claimed(&mut s.client, "blue", "cluster-b", 60).await;
    assert!(!refused.granted, "{refused:?}");
    assert_eq!(refused.holder, "cluster-a");
    assert_eq!(refused.expires_at_unix_millis, first.expires_at_unix_millis);
    assert!(
        refused.remaining_millis > 0 && refused.remaining_millis <= 60_000,
        "{refused:?}"
    );

    let renewed = claimed(&mut s.client, "blue", "cluster-a", 120).await;
    assert!(renewed.granted, "{renewed:?}");
    assert!(renewed.expires_at_unix_millis > first.expires_at_unix_millis);
    let other_name = claimed(&mut s.client, "green", "cluster-b", 60).await;
    assert!(other_name.granted, "{other_name:?}");

    // An expired claim is anyone's: the first holder is then refused.
    let short = claimed(&mut s.client, "short", "cluster-a", 1).await;
    assert!(short.granted);
    let held = claimed(&mut s.client, "short", "cluster-b", 60).await;
    if held.granted {
        // Only if this machine took over a second to answer.
        assert!(unix_millis_now() >= short.expires_at_unix_millis);
    } else {
        assert_eq!(held.holder, "cluster-a");
    }
    tokio::time::sleep(std::time::Duration::from_millis(1_200)).await;
    let taken = claimed(&mut s.client, "short", "cluster-b", 60).await;
    assert!(taken.granted, "{taken:?}");
    let lost = claimed(&mut s.client, "short", "cluster-a", 1).await;
    assert!(!lost.granted, "{lost:?}");
    assert_eq!(lost.holder, "cluster-b");

    for (request, field) in [
        (("", "cluster-a", 60), "installation:"),
        (("blue", "", 60), "holder:"),
        (("blue", "cluster-a", 0), "ttl_seconds:"),
        (("blue", "cluster-a", 3601), "ttl_seconds:"),
    ] {
        let err = claim(&mut s.client, request.0, request.1, request.2)
            .await
            .expect_err("invalid");
        assert_refused(&err, Code::InvalidArgument, field);
    }
    // A refused renewal changed nothing: blue is still cluster-a's.
    let still = claimed(&mut s.client, "blue", "cluster-b", 60).await;
    assert_eq!((still.granted, still.holder.as_str()), (false, "cluster-a"));
    assert!(all(&mut s.client).await.is_empty(), "claims are no records");
    s.stop().await;
}

/// Many holders race for one free name: exactly one wins, and every other
/// is told it is the winner's.
async fn racing_installation_claims_have_one_winner(backend: Backend) {
    let s = start(backend).await;
    let answers = at_once(&s, 0..16, |mut client, n| async move {
        let holder = format!("cluster-{n}");
        let answer = claimed(&mut client, "blue", &holder, 60).await;
        (holder, answer)
    })
    .await;
    let mut winners = Vec::new();
    let mut named = Vec::new();
    for (holder, answer) in answers {
        if answer.granted {
            assert_eq!(answer.holder, holder);
            winners.push(holder);
        } else {
            named.push(answer.holder);
        }
    }
    assert_eq!(winners.len(), 1, "{winners:?}");
    assert_eq!(named.len(), 15);
    assert!(
        named.iter().all(|holder| *holder == winners[0]),
        "{named:?}"
    );
    s.stop().await;
}

suite!(
    add_returns_ids_in_request_order,
    update_replaces_fields_and_unknown_id_changes_nothing,
    delete_is_idempotent,
    search_filters_narrow_and_range_is_half_open,
    every_validation_rule_names_field_and_pet_and_stores_nothing,
    idempotency_keys_deduplicate_and_are_findable,
    concurrent_adds_get_unique_ids_and_all_are_found,
    oversized_message_is_rejected_cleanly,
    key_changes_are_compare_and_set,
    racing_claims_have_one_winner,
    identities_deduplicate_and_are_findable,
    identities_change_with_keys_all_or_nothing,
    racing_identity_claims_have_one_winner,
    search_equals_a_full_scan_page_by_page,
    search_streams_more_than_a_page,
    a_page_scans_limit_entries_whatever_matches,
    installation_claims_exclude_other_holders,
    racing_installation_claims_have_one_winner,
);

// ---- durable-only ----------------------------------------------------------

/// A server on the durable store at `path`: called again on the same file,
/// as after a restart.
async fn reopen_durable(path: &std::path::Path) -> Running {
    let storage = StorageConfig::durable(path).open().await.expect("open");
    start_with(storage, tempfile::tempdir().expect("tempdir")).await
}

#[tokio::test]
async fn durable_store_keeps_pets_and_keys_across_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("pets.redb");
    let reopen = || reopen_durable(&path);
    let mut s = reopen().await;
    let ids = add(&mut s.client, vec![keyed("Thor", "uid-1")]).await;
    s.stop().await;

    let mut s = reopen().await;
    let again = add(&mut s.client, vec![keyed("Thor", "uid-1")]).await;
    assert_eq!(again, ids);
    assert_eq!(all(&mut s.client).await.len(), 1);
    // A changed key is durable too.
    set_keys(&mut s.client, vec![change(&ids[0], "uid-1", "uid-2")])
        .await
        .expect("change key");
    s.stop().await;

    let mut s = reopen().await;
    assert_eq!(keys_of(&mut s.client, &ids).await, ["uid-2"]);
    assert_eq!(add(&mut s.client, vec![keyed("Thor", "uid-2")]).await, ids);
    // So is an identity, with its index.
    set_keys(
        &mut s.client,
        vec![with_identity(change(&ids[0], "uid-2", "uid-2"), "ns/thor")],
    )
    .await
    .expect("set identity");
    s.stop().await;

    let mut s = reopen().await;
    let found = get_identities(&mut s.client, &["ns/thor"]).await;
    assert_eq!(found.pets.len(), 1, "{found:?}");
    assert_eq!(found.pets[0].id, ids[0]);
    assert_eq!(
        add(&mut s.client, vec![identified("", "ns/thor")]).await,
        ids
    );
    s.stop().await;
    drop(dir);
}

/// A claim is written to the file: a restarted store still refuses
/// another holder.
#[tokio::test]
async fn durable_store_keeps_installation_claims_across_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("pets.redb");
    let reopen = || reopen_durable(&path);
    let mut s = reopen().await;
    let held = claimed(&mut s.client, "blue", "cluster-a", 600).await;
    assert!(held.granted);
    s.stop().await;

    let mut s = reopen().await;
    let refused = claimed(&mut s.client, "blue", "cluster-b", 60).await;
    assert_eq!(
        (
            refused.granted,
            refused.holder.as_str(),
            refused.expires_at_unix_millis
        ),
        (false, "cluster-a", held.expires_at_unix_millis)
    );
    s.stop().await;
    drop(dir);
}

/// The durable file's format is the one the store has always written: each
/// record a `petstore.Pet`. A file from before the name index existed opens
/// (the index is built), and what the store writes now still decodes as
/// that message, so an older server can open the file too.
#[tokio::test]
async fn durable_files_keep_their_format() {
    use prost::Message;
    use redb::{ReadableDatabase, TableDefinition};
    const PETS: TableDefinition<&str, &[u8]> = TableDefinition::new("pets");
    const IDS_BY_KEY: TableDefinition<&str, &str> = TableDefinition::new("ids_by_key");

    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("pets.redb");
    let old = pb::Pet {
        id: "old-id".into(),
        idempotency_key: "uid-old".into(),
        ..thor()
    };
    {
        let db = redb::Database::create(&path).expect("create");
        let txn = db.begin_write().expect("write");
        {
            let mut pets = txn.open_table(PETS).expect("pets");
            pets.insert("old-id", old.encode_to_vec().as_slice())
                .expect("insert");
            let mut keys = txn.open_table(IDS_BY_KEY).expect("keys");
            keys.insert("uid-old", "old-id").expect("insert key");
        }
        txn.commit().expect("commit");
    }

    let storage = StorageConfig::durable(path.clone())
        .open()
        .await
        .expect("open a file without the name index");
    let by_key = storage
        .get_by_keys(&Access::All, &["uid-old".to_owned()])
        .await
        .expect("get by key");
    let record = by_key[0].clone().expect("the old record");
    assert_eq!(record.id, "old-id");
    assert_eq!(record.fields.name, "Thor");
    assert_eq!(record.fields.pet_type, ValidPetType::Canine);
    let by_name = SearchFilter {
        names: vec!["Thor".into()],
        ..Default::default()
    };
    let found = search_all(&*storage, &Access::All, &by_name, 10)
        .await
        .expect("search");
    assert_eq!(found, [record]);
    // It has no identity, and the identity index starts empty.
    assert_eq!(found[0].identity, None);
    assert_eq!(
        storage
            .get_by_identities(&Access::All, &[String::new(), "ns/old".to_owned()])
            .await
            .expect("get by identity"),
        [None, None]
    );

    let added = storage
        .add(
            &Access::All,
            &[NewPet {
                fields: PetFields {
                    name: "Tron".into(),
                    pet_type: ValidPetType::Feline,
                    birthday: chrono::NaiveDate::from_ymd_opt(2020, 6, 25).expect("date"),
                },
                idempotency_key: Some("uid-new".into()),
                identity: Some("ns/tron".into()),
            }],
        )
        .await
        .expect("add");
    drop(storage);

    let db = redb::Database::create(&path).expect("reopen the file directly");
    let txn = db.begin_read().expect("read");
    let pets = txn.open_table(PETS).expect("pets");
    let stored = pets
        .get(added[0].id.as_str())
        .expect("get")
        .expect("the new record");
    let expected = pb::Pet {
        id: added[0].id.clone(),
        idempotency_key: "uid-new".into(),
        identity: "ns/tron".into(),
        ..tron()
    };
    assert_eq!(
        pb::Pet::decode(stored.value()).expect("a petstore.Pet"),
        expected
    );
    assert_eq!(stored.value(), expected.encode_to_vec(), "byte for byte");
}

/// An older server run on a later file (a rollback) keeps records but not
/// the identity index: it may delete a record, or rewrite one without its
/// identity, and leave the index entry behind. Such an entry names no one:
/// lookups miss it, and the identity is free to take.
#[tokio::test]
async fn durable_identity_entries_an_older_server_left_behind_are_ignored() {
    use prost::Message;
    use redb::TableDefinition;
    const PETS: TableDefinition<&str, &[u8]> = TableDefinition::new("pets");

    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("pets.redb");
    let storage = StorageConfig::durable(path.clone())
        .open()
        .await
        .expect("open");
    let new = |name: &str, identity: &str| NewPet {
        fields: PetFields {
            name: name.into(),
            pet_type: ValidPetType::Canine,
            birthday: chrono::NaiveDate::from_ymd_opt(2021, 4, 1).expect("date"),
        },
        idempotency_key: None,
        identity: Some(identity.into()),
    };
    let added = storage
        .add(
            &Access::All,
            &[new("Gone", "ns/gone"), new("Stripped", "ns/stripped")],
        )
        .await
        .expect("add");
    let (gone, stripped) = (added[0].id.clone(), added[1].id.clone());
    drop(storage);
    {
        // What the older server does: it knows fields 1 to 5 only.
        let db = redb::Database::create(&path).expect("open the file directly");
        let txn = db.begin_write().expect("write");
        {
            let mut pets = txn.open_table(PETS).expect("pets");
            pets.remove(gone.as_str()).expect("delete");
            let without_identity = pb::Pet {
                id: stripped.clone(),
                name: "Stripped".into(),
                ..thor()
            };
            pets.insert(
                stripped.as_str(),
                without_identity.encode_to_vec().as_slice(),
            )
            .expect("rewrite");
        }
        txn.commit().expect("commit");
    }

    let storage = StorageConfig::durable(path.clone())
        .open()
        .await
        .expect("reopen");
    let identities = ["ns/gone".to_owned(), "ns/stripped".to_owned()];
    assert_eq!(
        storage
            .get_by_identities(&Access::All, &identities)
            .await
            .expect("get by identity"),
        [None, None]
    );
    let again = storage
        .add(&Access::All, &[new("Back", "ns/gone")])
        .await
        .expect("add over a stale entry");
    assert!(again[0].created, "{again:?}");
    storage
        .set_keys(
            &Access::All,
            &[petstore_server::model::KeyChange {
                id: stripped.clone(),
                expected_key: String::new(),
                new_key: String::new(),
                new_identity: Some("ns/stripped".into()),
            }],
        )
        .await
        .expect("take an identity over a stale entry");
    let found = storage
        .get_by_identities(&Access::All, &identities)
        .await
        .expect("get by identity");
    let found: Vec<_> = found.iter().map(|r| r.as_ref().map(|r| &r.id)).collect();
    assert_eq!(found, [Some(&again[0].id), Some(&stripped)]);
}

/// A PostgreSQL database from before identities (the tables as that release
/// created them, with a record and a change) gains the identity columns when
/// this release opens it: the record and the change read unchanged, and
/// identities work. Opening it again changes nothing.
#[tokio::test]
async fn postgres_tables_from_before_identities_gain_the_column() {
    let config = tokio::task::spawn_blocking(|| support::postgres_config("before-identities"))
        .await
        .expect("postgres config");
    let (client, connection) = support::postgres_client(&config).await;
    client
        .batch_execute(
            "CREATE TABLE petstore_pets (
                 id text COLLATE \"C\" PRIMARY KEY,
                 name text COLLATE \"C\" NOT NULL,
                 species smallint NOT NULL,
                 birthday date NOT NULL,
                 idempotency_key text COLLATE \"C\" UNIQUE
             );
             CREATE INDEX petstore_pets_by_name ON petstore_pets (name, id);
             CREATE TABLE petstore_revision (
                 singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
                 revision bigint NOT NULL
             );
             INSERT INTO petstore_revision VALUES (true, 1);
             CREATE TABLE petstore_changes (
                 revision bigint PRIMARY KEY,
                 kind smallint NOT NULL,
                 id text COLLATE \"C\" NOT NULL,
                 name text COLLATE \"C\",
                 species smallint,
                 birthday date,
                 idempotency_key text COLLATE \"C\"
             );
             INSERT INTO petstore_pets VALUES ('old-id', 'Thor', 1, '2021-04-01', 'uid-old');
             INSERT INTO petstore_changes
                 VALUES (1, 1, 'old-id', 'Thor', 1, '2021-04-01', 'uid-old');",
        )
        .await
        .expect("the previous release's schema");
    drop(client);
    let _ = connection.await;

    let open = || async {
        StorageConfig::Postgres(Box::new(config.clone()))
            .open()
            .await
            .expect("open")
    };
    let storage = open().await;
    let old = storage
        .get(&Access::All, &["old-id".to_owned()])
        .await
        .expect("get")
        .remove(0)
        .expect("the old record");
    assert_eq!(
        (old.idempotency_key.as_deref(), old.identity.as_deref()),
        (Some("uid-old"), None)
    );
    // Nor a tenant: it was made before tenancy.
    assert_eq!(old.tenant, "");
    let history = storage.feed().read_after(0, 10).expect("history");
    assert_eq!(history.len(), 1);
    assert_eq!(history[0].record.as_ref(), Some(&old));

    storage
        .set_keys(
            &Access::All,
            &[petstore_server::model::KeyChange {
                id: "old-id".into(),
                expected_key: "uid-old".into(),
                new_key: "uid-old".into(),
                new_identity: Some("ns/thor".into()),
            }],
        )
        .await
        .expect("set an identity");
    drop(storage);
    let storage = open().await;
    let found = storage
        .get_by_identities(&Access::All, &["ns/thor".to_owned()])
        .await
        .expect("get by identity");
    assert_eq!(found[0].as_ref().map(|r| r.id.as_str()), Some("old-id"));
    let added = storage
        .add(
            &Access::All,
            &[NewPet {
                fields: old.fields.clone(),
                idempotency_key: None,
                identity: Some("ns/thor".into()),
            }],
        )
        .await
        .expect("add");
    assert_eq!(added[0].id, "old-id");
    assert!(!added[0].created);
}

/// Beyond `--max-calls-per-second` a call is refused at once with
/// RESOURCE_EXHAUSTED and a pushback of the wait for the next token, and
/// counted under that code; a watch and a health check are not counted.
#[tokio::test]
async fn beyond_the_rate_a_call_is_throttled_with_a_pushback() {
    let dir = tempfile::tempdir().expect("tempdir");
    let storage = open(Backend::Memory, &dir).await;
    let options = ServeOptions {
        // A burst of one, then a token every 5 s: far longer than two
        // calls take, even on a slow machine.
        max_calls_per_second: 0.2,
        ..Default::default()
    };
    let mut running = start_with_options(storage, dir, options).await;
    add(&mut running.client, vec![thor()]).await;
    let refused = running
        .client
        .add_pets(pb::AddPetsReq { pets: vec![tron()] })
        .await
        .expect_err("throttled");
    assert_status(&refused, Code::ResourceExhausted, "--max-calls-per-second");
    let pushback: u64 = refused
        .metadata()
        .get(PUSHBACK_TRAILER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no pushback: {refused:?}"));
    assert!((1..=5000).contains(&pushback), "{refused:?}");

    running
        .client
        .watch_pets(pb::WatchPetsReq { after_revision: 0 })
        .await
        .expect("a watch is not counted");
    tonic_health::pb::health_client::HealthClient::new(running.channel.clone())
        .check(tonic_health::pb::HealthCheckRequest::default())
        .await
        .expect("a health check is not counted");
    assert_metrics(
        &running.observability.metrics.encode().expect("encode"),
        &[
            "petstore_server_rpc_duration_seconds_count{method=\"AddPets\",code=\"ResourceExhausted\"} 1",
        ],
    );
    running.stop().await;
}

/// Beyond `--max-concurrent-requests` a request is refused at once with
/// RESOURCE_EXHAUSTED and a pushback, and stores nothing; a search holds
/// its place until its stream ends; a watch is not counted.
#[tokio::test]
async fn beyond_the_bound_a_request_is_shed_with_a_pushback() {
    let dir = tempfile::tempdir().expect("tempdir");
    let storage = open(Backend::Memory, &dir).await;
    let options = ServeOptions {
        // The whole bound, not one client's share of it (below).
        admission: Some(Admission::new(1).with_per_client(0)),
        ..Default::default()
    };
    let mut running = start_with_options(storage, dir, options).await;
    // More than HTTP/2's flow-control windows and the search's buffer hold
    // (about 6 MB of long names), so an unread search stays open.
    let long = "x".repeat(120);
    for batch in 0..40 {
        let pets = (0..1000)
            .map(|i| {
                pet(
                    &format!("{long} {batch}-{i}"),
                    PetType::PtBird,
                    date(2020, 1, 1),
                )
            })
            .collect();
        add(&mut running.client, pets).await;
    }
    let mut held = running
        .client
        .search_pets(pb::SearchPetsReq::default())
        .await
        .expect("search")
        .into_inner();
    held.message().await.expect("stream").expect("a first pet");

    let refused = running
        .client
        .add_pets(pb::AddPetsReq { pets: vec![thor()] })
        .await
        .expect_err("shed while the search holds the only place");
    assert_status(
        &refused,
        Code::ResourceExhausted,
        "--max-concurrent-requests",
    );
    assert_eq!(
        refused
            .metadata()
            .get(PUSHBACK_TRAILER)
            .and_then(|v| v.to_str().ok()),
        Some("100"),
        "{refused:?}"
    );
    running
        .client
        .watch_pets(pb::WatchPetsReq { after_revision: 0 })
        .await
        .expect("a watch is not counted");

    // The place is freed once the search's stream is gone.
    drop(held);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match running
            .client
            .add_pets(pb::AddPetsReq { pets: vec![thor()] })
            .await
        {
            Ok(_) => break,
            Err(status) if status.code() == Code::ResourceExhausted => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the search's place was never freed"
                );
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            Err(status) => panic!("{status:?}"),
        }
    }
    let thors = search(
        &mut running.client,
        pb::SearchPetsReq {
            names: vec!["Thor".into()],
            ..Default::default()
        },
    )
    .await;
    assert_eq!(thors.len(), 1, "the refused add stored nothing: {thors:?}");
    running.stop().await;
}
