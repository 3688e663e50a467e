//! WatchPets, the store's change feed: one suite run against every backend
//! through a real server on loopback TCP and a tonic client, plus what only
//! one backend can show (two PostgreSQL replicas, a durable reopen) and
//! what the service does the same for all (slow watchers, shutdown).

use std::sync::Arc;
use std::time::Duration;

use petstore_proto::PetStoreClient;
use petstore_proto::petstore::{self as pb, pet_change::Kind};
use petstore_server::server::ServeOptions;
use petstore_server::service::Observability;
use petstore_server::storage::{Storage, StorageConfig};
use petstore_server::watch::WatchOptions;
use tonic::transport::Channel;
use tonic::{Code, Streaming};

/// Progress on idle streams comes this often in these tests.
const PROGRESS: Duration = Duration::from_millis(200);
/// Longest wait for any one expected message.
const PATIENCE: Duration = Duration::from_secs(10);

#[macro_use]
mod support;

use support::{Backend, Running, add, assert_metrics, assert_refused, assert_status, keyed};

async fn serve(
    storage: Arc<dyn Storage>,
    dir: Arc<tempfile::TempDir>,
    watch: WatchOptions,
) -> Running {
    let options = ServeOptions {
        observability: Observability::default(),
        watch,
        ..Default::default()
    };
    Running::serve(storage, dir, options).await
}

fn watch_options() -> WatchOptions {
    WatchOptions {
        progress_interval: PROGRESS,
        ..Default::default()
    }
}

/// Serves the store `config` opens on `dir`'s data; each call opens it
/// again, as a restarted server does.
async fn serve_opened(config: &StorageConfig, dir: &Arc<tempfile::TempDir>) -> Running {
    serve(
        config.open().await.expect("open"),
        Arc::clone(dir),
        watch_options(),
    )
    .await
}

/// A new store on `backend` that a test can stop and open again: its
/// directory and its configuration.
async fn reopenable(backend: Backend) -> (Arc<tempfile::TempDir>, StorageConfig) {
    let dir = Arc::new(tempfile::tempdir().expect("tempdir"));
    let config = backend.config(&dir, "watch").await;
    (dir, config)
}

async fn start_with_history(backend: Backend, history: usize) -> Running {
    let dir = tempfile::tempdir().expect("tempdir");
    let storage = backend
        .config(&dir, "watch")
        .await
        .open_with_history(history)
        .await
        .expect("open storage");
    serve(storage, Arc::new(dir), watch_options()).await
}

async fn start(backend: Backend) -> Running {
    start_with_history(backend, 1000).await
}

async fn watch(
    client: &mut PetStoreClient<Channel>,
    after_revision: i64,
) -> Streaming<pb::WatchPetsResp> {
    client
        .watch_pets(pb::WatchPetsReq { after_revision })
        .await
        .expect("watch")
        .into_inner()
}

async fn watch_refused(client: &mut PetStoreClient<Channel>, after_revision: i64) -> tonic::Status {
    match client.watch_pets(pb::WatchPetsReq { after_revision }).await {
        Err(status) => status,
        // The status may come as the stream's first item.
        Ok(response) => response
            .into_inner()
            .message()
            .await
            .expect_err("the watch should be refused"),
    }
}

async fn next(stream: &mut Streaming<pb::WatchPetsResp>) -> pb::WatchPetsResp {
    tokio::time::timeout(PATIENCE, stream.message())
        .await
        .expect("a message in time")
        .expect("the stream goes on")
        .expect("the stream is open")
}

/// Reads until `count` changes have arrived, checking that each message's
/// changes are in order and that none comes twice.
async fn changes(stream: &mut Streaming<pb::WatchPetsResp>, count: usize) -> Vec<pb::PetChange> {
    let mut seen: Vec<pb::PetChange> = Vec::new();
    while seen.len() < count {
        let message = next(stream).await;
        for change in message.changes {
            assert!(
                message.revision >= change.revision,
                "a message's revision covers its changes"
            );
            seen.push(change);
        }
    }
    assert_increasing(&seen);
    assert_eq!(seen.len(), count, "no more changes than made: {seen:?}");
    seen
}

fn assert_increasing(changes: &[pb::PetChange]) {
    for pair in changes.windows(2) {
        assert!(
            pair[0].revision < pair[1].revision,
            "revisions strictly increase: {changes:?}"
        );
    }
}

/// A watch from the start, past the progress message that says where the
/// store is.
async fn watch_from_start(client: &mut PetStoreClient<Channel>) -> Streaming<pb::WatchPetsResp> {
    let mut stream = watch(client, 0).await;
    progress(&mut stream).await;
    stream
}

/// Waits for a progress message (one without changes), failing on any
/// change: the writes so far must all have been seen.
async fn progress(stream: &mut Streaming<pb::WatchPetsResp>) -> i64 {
    let message = next(stream).await;
    assert!(
        message.changes.is_empty(),
        "unexpected changes: {message:?}"
    );
    message.revision
}

fn kinds(changes: &[pb::PetChange]) -> Vec<Kind> {
    changes.iter().map(|c| c.kind()).collect()
}

/// UpdatePets, which must succeed: the pet `id` becomes a keyless dog
/// named `name`.
async fn update(client: &mut PetStoreClient<Channel>, id: &str, name: &str) {
    client
        .update_pets(pb::UpdatePetsReq {
            pets: vec![pb::Pet {
                id: id.to_owned(),
                ..keyed(name, "")
            }],
        })
        .await
        .unwrap_or_else(|status| panic!("update {id} to {name}: {status:?}"));
}

/// Tron as [`one_of_each`] creates (and deletes) him: keyed, with an
/// identity.
fn keyed_tron() -> pb::Pet {
    pb::Pet {
        identity: "ns/tron".into(),
        ..keyed("Tron", "uid-tron")
    }
}

/// Makes one change of each kind: creates two pets, updates the first,
/// gives it a key and deletes the second. Returns the two IDs.
async fn one_of_each(client: &mut PetStoreClient<Channel>) -> Vec<String> {
    let ids = add(client, vec![keyed("Thor", ""), keyed_tron()]).await;
    update(client, &ids[0], "Thor II").await;
    client
        .set_idempotency_keys(pb::SetIdempotencyKeysReq {
            changes: vec![pb::KeyChange {
                id: ids[0].clone(),
                expected_key: String::new(),
                new_key: "uid-thor".into(),
                new_identity: None,
            }],
        })
        .await
        .expect("set key");
    client
        .delete_pets(pb::DeletePetsReq {
            ids: vec![ids[1].clone()],
        })
        .await
        .expect("delete");
    ids
}

/// Writes that change no record: each must announce nothing.
async fn no_ops(client: &mut PetStoreClient<Channel>, id: &str) {
    // Same values as stored.
    update(client, id, "Thor II").await;
    // A missing ID.
    client
        .delete_pets(pb::DeletePetsReq {
            ids: vec!["no-such-pet".into()],
        })
        .await
        .expect("delete missing");
    // The key it has.
    client
        .set_idempotency_keys(pb::SetIdempotencyKeysReq {
            changes: vec![pb::KeyChange {
                id: id.to_owned(),
                expected_key: "uid-thor".into(),
                new_key: "uid-thor".into(),
                new_identity: None,
            }],
        })
        .await
        .expect("same key");
    // A key that already names a pet: AddPets creates nothing.
    add(client, vec![keyed("Thor", "uid-thor")]).await;
    // A refused update.
    client
        .update_pets(pb::UpdatePetsReq {
            pets: vec![
                pb::Pet {
                    id: id.to_owned(),
                    ..keyed("Changed", "")
                },
                pb::Pet {
                    id: "no-such-pet".into(),
                    ..keyed("Ghost", "")
                },
            ],
        })
        .await
        .expect_err("unknown ID");
}

// ---- the suite -------------------------------------------------------------

async fn every_kind_arrives_once_in_order(backend: Backend) {
    let mut s = start(backend).await;
    let mut stream = watch(&mut s.client, 0).await;
    let start = progress(&mut stream).await;
    assert_eq!(start, 0, "an empty store is at revision 0");

    let ids = one_of_each(&mut s.client).await;
    no_ops(&mut s.client, &ids[0]).await;
    let seen = changes(&mut stream, 5).await;
    assert_eq!(
        kinds(&seen),
        [
            Kind::Created,
            Kind::Created,
            Kind::Updated,
            Kind::KeyChanged,
            Kind::Deleted
        ]
    );
    let seen_ids: Vec<&str> = seen.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(seen_ids, [&ids[0], &ids[1], &ids[0], &ids[0], &ids[1]]);
    assert!(seen[0].revision > start);
    let created = seen[1].pet.as_ref().expect("a created pet");
    assert_eq!(
        (created.name.as_str(), created.idempotency_key.as_str()),
        ("Tron", "uid-tron")
    );
    let updated = seen[2].pet.as_ref().expect("an updated pet");
    assert_eq!(updated.name, "Thor II");
    let keyed = seen[3].pet.as_ref().expect("a re-keyed pet");
    assert_eq!(
        (keyed.name.as_str(), keyed.idempotency_key.as_str()),
        ("Thor II", "uid-thor")
    );
    // The deletion carries Tron as he was: key and identity included.
    assert_eq!(
        seen[4].pet,
        Some(pb::Pet {
            id: ids[1].clone(),
            ..keyed_tron()
        }),
        "a deletion carries the record as it was"
    );

    // The no-ops announced nothing: the next message is progress, at the
    // last change's revision.
    assert_eq!(progress(&mut stream).await, seen[4].revision);
    s.stop().await;
}

/// SetIdempotencyKeys, which must succeed: one change of `id`'s key and,
/// if `identity` is set, of its identity.
async fn set_key(
    client: &mut PetStoreClient<Channel>,
    id: &str,
    (expected_key, new_key): (&str, &str),
    identity: Option<&str>,
) {
    client
        .set_idempotency_keys(pb::SetIdempotencyKeysReq {
            changes: vec![pb::KeyChange {
                id: id.to_owned(),
                expected_key: expected_key.into(),
                new_key: new_key.into(),
                new_identity: identity.map(str::to_owned),
            }],
        })
        .await
        .unwrap_or_else(|status| panic!("set key of {id}: {status:?}"));
}

/// Every change carries the record's identity; a key change that changes
/// only the identity is KEY_CHANGED, one that changes neither is nothing.
async fn identity_changes_are_key_changes(backend: Backend) {
    let mut s = start(backend).await;
    let mut stream = watch_from_start(&mut s.client).await;
    let thor = pb::Pet {
        identity: "ns/thor".into(),
        ..keyed("Thor", "uid-thor")
    };
    let id = add(&mut s.client, vec![thor.clone()]).await.remove(0);
    update(&mut s.client, &id, "Thor II").await;
    let key = ("uid-thor", "uid-thor");
    set_key(&mut s.client, &id, key, Some("ns/thor-2")).await;
    // No-ops: the identity and key it has, the key alone, and an AddPets
    // whose identity names the record.
    set_key(&mut s.client, &id, key, Some("ns/thor-2")).await;
    set_key(&mut s.client, &id, key, None).await;
    add(
        &mut s.client,
        vec![pb::Pet {
            identity: "ns/thor-2".into(),
            ..keyed("Thor", "uid-other")
        }],
    )
    .await;
    // A release keeps the identity; then the identity is cleared.
    set_key(&mut s.client, &id, ("uid-thor", ""), None).await;
    set_key(&mut s.client, &id, ("", ""), Some("")).await;

    let seen = changes(&mut stream, 5).await;
    assert_eq!(
        kinds(&seen),
        [
            Kind::Created,
            Kind::Updated,
            Kind::KeyChanged,
            Kind::KeyChanged,
            Kind::KeyChanged
        ]
    );
    let held: Vec<(&str, &str)> = seen
        .iter()
        .map(|c| {
            let pet = c.pet.as_ref().expect("a record");
            (pet.idempotency_key.as_str(), pet.identity.as_str())
        })
        .collect();
    assert_eq!(
        held,
        [
            ("uid-thor", "ns/thor"),
            ("uid-thor", "ns/thor"),
            ("uid-thor", "ns/thor-2"),
            ("", "ns/thor-2"),
            ("", ""),
        ]
    );
    assert_eq!(progress(&mut stream).await, seen[4].revision);
    s.stop().await;
}

async fn a_client_resumes_after_the_revision_it_saw(backend: Backend) {
    let mut s = start(backend).await;
    let mut first = watch(&mut s.client, 0).await;
    progress(&mut first).await;
    one_of_each(&mut s.client).await;
    let all = changes(&mut first, 5).await;

    let mut resumed = watch(&mut s.client, all[1].revision).await;
    let again = changes(&mut resumed, 3).await;
    assert_eq!(again, all[2..]);
    let deleted = again[2].pet.as_ref().expect("the deleted record");
    assert_eq!(
        (deleted.idempotency_key.as_str(), deleted.identity.as_str()),
        ("uid-tron", "ns/tron")
    );
    assert_eq!(progress(&mut resumed).await, all[4].revision);

    // At the current revision: progress at once, then new changes.
    let mut current = watch(&mut s.client, all[4].revision).await;
    assert_eq!(progress(&mut current).await, all[4].revision);
    add(&mut s.client, vec![keyed("Late", "")]).await;
    let late = changes(&mut current, 1).await;
    assert_eq!(late[0].kind(), Kind::Created);
    assert!(late[0].revision > all[4].revision);
    s.stop().await;
}

/// A deletion carries the record as it was just before (after its last
/// update and key change), one per record deleted, none for an unknown ID;
/// live, resumed, and (durable, PostgreSQL) from the history a reopened
/// store reads back.
async fn a_deletion_carries_the_last_record(backend: Backend) {
    let (dir, config) = reopenable(backend).await;
    let mut s = serve_opened(&config, &dir).await;
    let mut stream = watch_from_start(&mut s.client).await;
    let thor = pb::Pet {
        identity: "ns/thor".into(),
        ..keyed("Thor", "uid-thor")
    };
    let tron = pb::Pet {
        idempotency_key: "uid-tron".into(),
        identity: "ns/tron".into(),
        ..support::tron()
    };
    let ids = add(&mut s.client, vec![thor.clone(), tron.clone()]).await;
    update(&mut s.client, &ids[0], "Thor II").await;
    set_key(
        &mut s.client,
        &ids[1],
        ("uid-tron", "uid-tron-2"),
        Some("ns/tron-2"),
    )
    .await;
    s.client
        .delete_pets(pb::DeletePetsReq {
            ids: vec![ids[0].clone(), "no-such-pet".into(), ids[1].clone()],
        })
        .await
        .expect("delete");
    let last = [
        pb::Pet {
            id: ids[0].clone(),
            name: "Thor II".into(),
            ..thor
        },
        pb::Pet {
            id: ids[1].clone(),
            idempotency_key: "uid-tron-2".into(),
            identity: "ns/tron-2".into(),
            ..tron
        },
    ];
    // The two deletions, in whichever order the store made them.
    let deletions = |seen: &[pb::PetChange]| {
        assert_eq!(kinds(seen), [Kind::Deleted, Kind::Deleted], "{seen:?}");
        let mut pets: Vec<pb::Pet> = seen
            .iter()
            .map(|c| {
                let pet = c.pet.clone().expect("a deletion carries the record");
                assert_eq!(pet.id, c.id);
                pet
            })
            .collect();
        pets.sort_by(|a, b| a.name.cmp(&b.name));
        pets
    };

    let seen = changes(&mut stream, 6).await;
    assert_eq!(deletions(&seen[4..]), last);
    let from = seen[3].revision;
    assert_eq!(progress(&mut stream).await, seen[5].revision);
    let mut resumed = watch(&mut s.client, from).await;
    assert_eq!(changes(&mut resumed, 2).await, seen[4..]);
    drop((stream, resumed));
    s.stop().await;

    // A reopened store serves them from the history it keeps.
    if matches!(backend, Backend::Durable | Backend::Postgres) {
        let mut s = serve_opened(&config, &dir).await;
        let mut resumed = watch(&mut s.client, from).await;
        let again = changes(&mut resumed, 2).await;
        assert_eq!(deletions(&again), last);
        assert_eq!(again, seen[4..]);
        drop(resumed);
        s.stop().await;
    }
}

async fn compacted_history_is_out_of_range(backend: Backend) {
    let mut s = start_with_history(backend, 3).await;
    for name in ["a", "b", "c", "d", "e", "f"] {
        add(&mut s.client, vec![keyed(name, "")]).await;
    }
    let mut stream = watch(&mut s.client, 0).await;
    let current = progress(&mut stream).await;
    assert_eq!(current, 6);
    let status = watch_refused(&mut s.client, 1).await;
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    assert_eq!(
        status.message(),
        "after_revision 1 is compacted: history starts after revision 3; re-read and watch from the current revision"
    );
    // The oldest kept start still works.
    let mut oldest = watch(&mut s.client, 3).await;
    let kept = changes(&mut oldest, 3).await;
    let revisions: Vec<i64> = kept.iter().map(|c| c.revision).collect();
    assert_eq!(revisions, [4, 5, 6]);
    s.stop().await;
}

async fn idle_streams_get_progress(backend: Backend) {
    let mut s = start(backend).await;
    add(&mut s.client, vec![keyed("Thor", "")]).await;
    let mut stream = watch(&mut s.client, 0).await;
    let started = tokio::time::Instant::now();
    for _ in 0..4 {
        assert_eq!(progress(&mut stream).await, 1);
    }
    // The first at once, three more a progress interval apart.
    let took = started.elapsed();
    assert!(took >= PROGRESS * 3 - Duration::from_millis(50), "{took:?}");
    assert!(took < PROGRESS * 3 + Duration::from_secs(2), "{took:?}");
    s.stop().await;
}

async fn bad_revisions_are_invalid_arguments(backend: Backend) {
    let mut s = start(backend).await;
    add(&mut s.client, vec![keyed("Thor", "")]).await;
    for after in [-1, 2, i64::MAX] {
        let status = watch_refused(&mut s.client, after).await;
        assert_refused(&status, Code::InvalidArgument, "after_revision");
    }
    s.stop().await;
}

suite!(
    every_kind_arrives_once_in_order,
    identity_changes_are_key_changes,
    a_client_resumes_after_the_revision_it_saw,
    a_deletion_carries_the_last_record,
    compacted_history_is_out_of_range,
    idle_streams_get_progress,
    bad_revisions_are_invalid_arguments,
);

// ---- the service, the same for every backend -------------------------------

// A client that stops reading while thousands of changes happen: its stream
// ends with RESOURCE_EXHAUSTED after a bounded number of messages, naming
// the last revision it got; a watcher on another connection gets them all.
#[tokio::test]
async fn a_slow_watcher_is_ended_and_others_are_not() {
    const WRITES: usize = 3000;
    let dir = Arc::new(tempfile::tempdir().expect("tempdir"));
    let storage = StorageConfig::Memory.open().await.expect("memory");
    let options = WatchOptions {
        buffer: 4,
        batch: 1,
        slow_after: Duration::from_millis(300),
        ..watch_options()
    };
    let mut s = serve(storage, dir, options).await;
    // A small HTTP/2 window, so the client's unread bytes stop the server
    // after some 16 KiB rather than hyper's default 2 MiB.
    let slow_channel = Channel::from_shared(format!("http://{}", s.addr))
        .expect("uri")
        .initial_stream_window_size(Some(16 * 1024))
        .connect()
        .await
        .expect("connect");
    let mut slow_client = PetStoreClient::new(slow_channel);
    let mut slow = watch(&mut slow_client, 0).await;
    let mut fast_client = s.another_client().await;
    let mut fast = watch(&mut fast_client, 0).await;
    progress(&mut fast).await;
    let reader = tokio::spawn(async move {
        let seen = changes(&mut fast, WRITES).await;
        (seen, fast)
    });
    for batch in 0..WRITES / 100 {
        let pets = (0..100)
            .map(|i| keyed(&format!("pet-{batch}-{i}"), ""))
            .collect();
        add(&mut s.client, pets).await;
    }
    let (seen, _fast) = tokio::time::timeout(PATIENCE, reader)
        .await
        .expect("the fast watcher keeps up")
        .expect("reader");
    assert_eq!(seen.last().map(|c| c.revision), Some(WRITES as i64));

    // The slow client has still read nothing, for longer than the store
    // waits for room in its buffer.
    tokio::time::sleep(Duration::from_secs(1)).await;
    // The slow stream now yields what it had buffered, then the status.
    let mut last_seen = 0;
    let mut messages = 0;
    let status = loop {
        match tokio::time::timeout(PATIENCE, slow.message())
            .await
            .expect("the slow stream answers")
        {
            Ok(Some(message)) => {
                messages += 1;
                assert!(messages <= WRITES, "the slow stream was never ended");
                last_seen = message.changes.last().map_or(last_seen, |c| c.revision);
            }
            Ok(None) => panic!("the slow stream ended without a status"),
            Err(status) => break status,
        }
    };
    assert_status(
        &status,
        Code::ResourceExhausted,
        &format!("the last revision delivered is {last_seen},"),
    );
    assert!(
        messages < WRITES,
        "ended before it could hold every change: {messages} messages"
    );
    assert_metrics(
        &s.observability.metrics.encode().expect("metrics"),
        &[
            "petstore_server_watch_terminated_total{reason=\"slow\"} 1",
            &format!("petstore_server_watch_revision {WRITES}"),
        ],
    );

    // Catching up on a long history fills the buffer as fast, but a client
    // that reads frees it: it gets everything.
    let mut late = watch(&mut s.client, 1).await;
    let caught_up = changes(&mut late, WRITES - 1).await;
    assert_eq!(caught_up.first().map(|c| c.revision), Some(2));
    assert_metrics(
        &s.observability.metrics.encode().expect("metrics"),
        &["petstore_server_watch_terminated_total{reason=\"slow\"} 1"],
    );
    s.stop().await;
}

// Stopping the server ends open watch streams (UNAVAILABLE, naming where to
// resume) instead of waiting for them forever.
#[tokio::test]
async fn stopping_the_server_ends_watch_streams() {
    let mut s = start(Backend::Memory).await;
    add(&mut s.client, vec![keyed("Thor", "")]).await;
    let mut stream = watch(&mut s.client, 0).await;
    assert_eq!(progress(&mut stream).await, 1);
    assert_metrics(
        &s.observability.metrics.encode().expect("metrics"),
        &["petstore_server_watchers 1"],
    );
    let observability = s.observability.clone();
    s.stop().await;
    let status = loop {
        match tokio::time::timeout(PATIENCE, stream.message())
            .await
            .expect("the stream ends")
        {
            Ok(Some(message)) => assert!(message.changes.is_empty()),
            Ok(None) => panic!("the stream ended without a status"),
            Err(status) => break status,
        }
    };
    assert_status(&status, Code::Unavailable, "after_revision 1");
    assert_metrics(
        &observability.metrics.encode().expect("metrics"),
        &[
            "petstore_server_watchers 0",
            "petstore_server_watch_terminated_total{reason=\"shutdown\"} 1",
        ],
    );
}

// ---- durable ----------------------------------------------------------------

// Revisions and history survive a reopen: a client resumes across it, and
// new changes continue after the old revisions.
#[tokio::test]
async fn durable_history_survives_a_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = StorageConfig::durable(dir.path().join("pets.redb"));
    let dir = Arc::new(dir);
    let mut s = serve_opened(&config, &dir).await;
    let mut stream = watch_from_start(&mut s.client).await;
    one_of_each(&mut s.client).await;
    let before = changes(&mut stream, 5).await;
    drop(stream);
    s.stop().await;

    let mut s = serve_opened(&config, &dir).await;
    let mut resumed = watch(&mut s.client, before[1].revision).await;
    let again = changes(&mut resumed, 3).await;
    assert_eq!(again, before[2..]);
    assert_eq!(
        again[2].pet.as_ref().map(|pet| pet.identity.as_str()),
        Some("ns/tron"),
        "the deletion, read back from the file, carries the record"
    );
    add(&mut s.client, vec![keyed("After", "")]).await;
    let after = changes(&mut resumed, 1).await;
    assert_eq!(after[0].revision, before[4].revision + 1);
    s.stop().await;
}

// ---- history written by an older store ---------------------------------------

/// Rewrites the deletion at `revision` as a store older than this one
/// wrote it: without the record.
async fn strip_deletion(config: &StorageConfig, revision: i64, id: &str) {
    match config {
        StorageConfig::Durable { path, .. } => {
            use redb::TableDefinition;
            const CHANGES: TableDefinition<u64, &[u8]> = TableDefinition::new("changes");
            // The codec's `StoredChange`: kind 3 (field 1), the ID (field 2).
            let mut old = vec![0x08, 0x03, 0x12, u8::try_from(id.len()).expect("short ID")];
            old.extend_from_slice(id.as_bytes());
            let db = redb::Database::create(path).expect("open the file directly");
            let txn = db.begin_write().expect("write");
            {
                let mut changes = txn.open_table(CHANGES).expect("changes");
                let revision = u64::try_from(revision).expect("positive");
                changes
                    .insert(revision, old.as_slice())
                    .expect("rewrite the deletion");
            }
            txn.commit().expect("commit");
        }
        StorageConfig::Postgres(config) => {
            let (client, connection) = support::postgres_client(config).await;
            let rewritten = client
                .execute(
                    "UPDATE petstore_changes
                     SET name = NULL, species = NULL, birthday = NULL,
                         idempotency_key = NULL, identity = NULL
                     WHERE revision = $1 AND kind = 3 AND id = $2",
                    &[&revision, &id],
                )
                .await
                .expect("rewrite the deletion");
            assert_eq!(rewritten, 1);
            drop(client);
            let _ = connection.await;
        }
        StorageConfig::Memory => unreachable!("memory keeps no history"),
    }
}

/// A deletion in history from a store older than this one (no record)
/// is served as it was, without `pet`, beside deletions that carry it.
async fn old_deletions_come_without_the_record(backend: Backend) {
    let (dir, config) = reopenable(backend).await;
    let mut s = serve_opened(&config, &dir).await;
    let mut stream = watch_from_start(&mut s.client).await;
    let mut ids = Vec::new();
    for pet in [keyed("Thor", "uid-thor"), keyed_tron()] {
        let id = add(&mut s.client, vec![pet]).await.remove(0);
        s.client
            .delete_pets(pb::DeletePetsReq {
                ids: vec![id.clone()],
            })
            .await
            .expect("delete");
        ids.push(id);
    }
    let before = changes(&mut stream, 4).await;
    assert_eq!(
        kinds(&before),
        [Kind::Created, Kind::Deleted, Kind::Created, Kind::Deleted]
    );
    drop(stream);
    s.stop().await;

    strip_deletion(&config, before[1].revision, &ids[0]).await;
    let mut s = serve_opened(&config, &dir).await;
    let mut resumed = watch(&mut s.client, before[0].revision).await;
    let after = changes(&mut resumed, 3).await;
    assert_eq!(
        after[0],
        pb::PetChange {
            pet: None,
            ..before[1].clone()
        },
        "the old deletion, as an older store served it"
    );
    assert_eq!(after[1..], before[2..], "the new deletion keeps its record");
    assert_eq!(
        after[2].pet,
        Some(pb::Pet {
            id: ids[1].clone(),
            ..keyed_tron()
        })
    );
    drop(resumed);
    s.stop().await;
}

#[tokio::test]
async fn durable_old_deletions_come_without_the_record() {
    old_deletions_come_without_the_record(Backend::Durable).await;
}

#[tokio::test]
async fn postgres_old_deletions_come_without_the_record() {
    old_deletions_come_without_the_record(Backend::Postgres).await;
}

// ---- PostgreSQL: two replicas ------------------------------------------------

// Two store replicas on one database, writes through both (concurrent
// ones too): a watcher on each sees the same changes, every one once, in
// the same revision order, with no gap.
#[tokio::test]
async fn postgres_replicas_see_one_sequence() {
    let config = tokio::task::spawn_blocking(|| support::postgres_config("watch"))
        .await
        .expect("postgres config");
    let dir = Arc::new(tempfile::tempdir().expect("tempdir"));
    let mut replicas = Vec::new();
    for _ in 0..2 {
        let storage = StorageConfig::Postgres(Box::new(config.clone()))
            .open()
            .await
            .expect("open replica");
        replicas.push(serve(storage, Arc::clone(&dir), watch_options()).await);
    }
    let mut streams = Vec::new();
    for replica in &mut replicas {
        let mut stream = watch(&mut replica.client, 0).await;
        assert_eq!(progress(&mut stream).await, 0);
        streams.push(stream);
    }
    let (a, b) = replicas.split_at_mut(1);
    let (a, b) = (&mut a[0], &mut b[0]);
    let ids = add(&mut a.client, vec![keyed("Thor", "")]).await;
    update(&mut b.client, &ids[0], "Thor II").await;
    // Concurrent writes through both.
    let mut writers = Vec::new();
    for (n, replica) in [&*a, &*b].into_iter().enumerate() {
        for w in 0..5 {
            let mut client = replica.another_client().await;
            writers.push(tokio::spawn(async move {
                for i in 0..4 {
                    add(&mut client, vec![keyed(&format!("r{n}-w{w}-{i}"), "")]).await;
                }
            }));
        }
    }
    for writer in writers {
        writer.await.expect("writer");
    }
    b.client
        .delete_pets(pb::DeletePetsReq { ids })
        .await
        .expect("delete through b");
    let total = 2 + 2 * 5 * 4 + 1;
    let mut sequences = Vec::new();
    for stream in &mut streams {
        sequences.push(changes(stream, total).await);
    }
    assert_eq!(sequences[0], sequences[1], "both replicas see one sequence");
    let revisions: Vec<i64> = sequences[0].iter().map(|c| c.revision).collect();
    assert_eq!(revisions, (1..=total as i64).collect::<Vec<_>>(), "no gap");
    assert_eq!(sequences[0][1].kind(), Kind::Updated);
    assert_eq!(sequences[0][total - 1].kind(), Kind::Deleted);
    assert_eq!(
        sequences[0][total - 1]
            .pet
            .as_ref()
            .map(|pet| pet.name.as_str()),
        Some("Thor II"),
        "a deletion through one replica carries the record to both"
    );
    // A revision seen on one replica resumes on the other.
    let mut resumed = watch(&mut b.client, revisions[total - 3]).await;
    assert_eq!(changes(&mut resumed, 2).await, sequences[0][total - 2..]);
    for replica in replicas {
        replica.stop().await;
    }
}
