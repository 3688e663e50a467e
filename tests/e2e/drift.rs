//! Drift found from the store's change feed: with the poll at its 5-minute
//! default, an out-of-band rename and delete made with grpcurl are put back
//! within about a second, the operator's own writes coming back on the feed
//! queue nothing, and a converged, idle operator that follows the feed reads
//! nothing from the store even with a short poll interval, where one that
//! does not follow it polls.

use std::time::{Duration, Instant};

use fixtures::http::sum_series;
use fixtures::{Env, Storage, wait_for};
use serde_json::Value;

use crate::typed;

const TIMEOUT: Duration = Duration::from_secs(60);
/// The issue's goal is 1 s at p99; one sample on a shared test machine gets
/// some room, and stays far below the 5-minute poll.
const PUT_BACK_WITHIN: Duration = Duration::from_secs(3);

fn record(env: &Env, id: &str) -> Option<Value> {
    env.store
        .grpcurl(
            "petstore.PetStore/GetPets",
            &format!(r#"{{"ids":["{id}"]}}"#),
        )
        .ok()?
        .into_iter()
        .next()?["pets"]
        .as_array()?
        .first()
        .cloned()
}

#[test]
fn out_of_band_changes_are_put_back_from_the_feed_and_an_idle_operator_reads_nothing()
-> fixtures::Result<()> {
    let env = Env::start(Storage::Durable)?;
    let mut options = env.operator_options("operator");
    // The default: only the feed can find the drift within the test.
    options.poll_interval = "5m";
    let operator = env.start_operator_with(&options)?;
    let (thor, _) = env.apply_samples()?;
    wait_for(TIMEOUT, "the operator to follow the change feed", || {
        let scrape = operator.metrics().ok()?;
        (sum_series(&scrape, "petstore_operator_change_feed_connected", "") == 1.0).then_some(())
    })?;
    let before = operator.metrics()?;
    let drifted = |scrape: &str| {
        sum_series(
            scrape,
            "petstore_operator_change_feed_changes_total",
            r#"verdict="drifted""#,
        )
    };
    assert_eq!(
        drifted(&before),
        0.0,
        "the operator's own writes came back as drift:\n{before}"
    );

    // A rename behind the operator's back, as a user of grpcurl makes it.
    env.store.grpcurl(
        "petstore.PetStore/UpdatePets",
        &format!(
            r#"{{"pets":[{{"id":"{thor}","name":"Changed behind its back","type":"PTCanine","birthday":{{"year":2021,"month":4,"day":1}}}}]}}"#
        ),
    )?;
    let changed = Instant::now();
    wait_for(TIMEOUT, "the record renamed back", || {
        let record = record(&env, &thor)?;
        (record["name"] == "Thor").then_some(())
    })?;
    let took = changed.elapsed();
    assert!(
        took < PUT_BACK_WITHIN,
        "the rename was put back after {took:?}"
    );

    // A delete behind its back: a new record, its ID in the status.
    env.store.grpcurl(
        "petstore.PetStore/DeletePets",
        &format!(r#"{{"ids":["{thor}"]}}"#),
    )?;
    let deleted = Instant::now();
    let what = "on a new record named Thor";
    let new_id = typed::wait_pet(&env.cp, "default", "pet-sample1", TIMEOUT, what, |pet| {
        let id = typed::id(pet)?.to_owned();
        (id != thor && record(&env, &id)?["name"] == "Thor").then_some(id)
    })?;
    let took = deleted.elapsed();
    assert!(
        took < PUT_BACK_WITHIN,
        "the deleted record was made again after {took:?}"
    );
    assert!(record(&env, &thor).is_none(), "the old record came back");

    let after = operator.metrics()?;
    assert!(
        drifted(&after) >= 2.0,
        "two drifts seen on the feed:\n{after}"
    );
    // Normal Events are written once reconciles pause, in parallel: the
    // rename's may land after the delete's.
    let notes = || {
        env.cp
            .kubectl(&[
                "get",
                "events.events.k8s.io",
                "-n",
                "default",
                "-o",
                "jsonpath={range .items[*]}{.note}{\"\\n\"}{end}",
            ])
            .unwrap_or_default()
    };
    let rename_told = r#"drift corrected: name "Changed behind its back" -> "Thor""#;
    wait_for(TIMEOUT, "the rename's drift Event", || {
        notes().contains(rename_told).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}; the notes:\n{}", notes()));

    let pet = typed::pet(&env.cp, "default", "pet-sample1")?;
    assert_eq!(typed::id(&pet), Some(new_id.as_str()));

    // Idle: an operator whose poll is short and whose audit is an hour
    // reads nothing while it follows the feed, over several poll
    // intervals; the same window with the feed off shows the poll's reads.
    // So an operator that polled while following the feed fails here.
    let pets = env.cp.kubectl_json(&["get", "pets", "-A"])?["items"]
        .as_array()
        .map_or(0, Vec::len);
    assert!(pets >= 2, "the samples' Pets: {pets}");
    drop(operator);
    let feed_reads = idle_reads(&env, true, pets)?;
    assert_eq!(
        feed_reads, 0.0,
        "store reads while idle and following the feed, over {} poll intervals of {IDLE_POLL}",
        IDLE_POLLS
    );
    let polling_reads = idle_reads(&env, false, pets)?;
    eprintln!(
        "idle over {IDLE_POLLS} poll intervals of {IDLE_POLL}, {pets} Pets: {feed_reads} store reads following the feed, {polling_reads} polling alone"
    );
    // Each Pet once per interval; the window's two edges may lose one.
    let expected = (pets * (IDLE_POLLS - 1)) as f64;
    assert!(
        polling_reads >= expected,
        "{polling_reads} reads polling alone over {IDLE_POLLS} poll intervals of {IDLE_POLL}, for {pets} Pets: at least {expected} expected"
    );
    Ok(())
}

/// The idle check's poll interval, and the window in poll intervals.
const IDLE_POLL: &str = "2s";
const IDLE_POLL_INTERVAL: Duration = Duration::from_secs(2);
const IDLE_POLLS: usize = 5;

/// Store reads over [`IDLE_POLLS`] poll intervals by an operator started
/// with the poll at [`IDLE_POLL`] and the audit at an hour, following the
/// change feed or not, once it has caught up with `pets` Pets.
fn idle_reads(env: &Env, follow_feed: bool, pets: usize) -> fixtures::Result<f64> {
    let mut options = env.operator_options("operator");
    options.poll_interval = IDLE_POLL;
    options.extra_args.extend([
        "--audit-interval".into(),
        "1h".into(),
        format!("--follow-store-changes={follow_feed}").into(),
    ]);
    let operator = env.start_operator_with(&options)?;
    let connected = if follow_feed { 1.0 } else { 0.0 };
    wait_for(TIMEOUT, "the restarted operator to catch up", || {
        let scrape = operator.metrics().ok()?;
        let reconciled = sum_series(
            &scrape,
            "petstore_operator_reconcile_duration_seconds_count",
            "",
        );
        (reconciled >= pets as f64
            && sum_series(&scrape, "petstore_operator_change_feed_connected", "") == connected)
            .then_some(())
    })?;
    // A reconcile before the feed was live scheduled its Pet's next read at
    // the poll interval, at most one and a half intervals on.
    std::thread::sleep(IDLE_POLL_INTERVAL * 2);
    let reads = |scrape: &str| {
        sum_series(
            scrape,
            "petstore_operator_store_call_duration_seconds_count",
            r#"method="GetPets""#,
        )
    };
    let from = reads(&operator.metrics()?);
    std::thread::sleep(IDLE_POLL_INTERVAL * IDLE_POLLS as u32);
    let scrape = operator.metrics()?;
    assert_eq!(
        sum_series(&scrape, "petstore_operator_change_feed_connected", ""),
        connected,
        "the change feed followed: {follow_feed}"
    );
    Ok(reads(&scrape) - from)
}
