//! Pacing each store: the operator's adaptive limit against a real store
//! that refuses by rate (`--max-calls-per-second`), beside a fixed limit,
//! as the operator was before (docs/operator.md, "Pacing each store").
//!
//! The load is the drift poll's, which does not hang on the API server's
//! speed: with the change feed off, every Pet is read once a second, so
//! 200 Pets ask 200 reads a second of a store that answers 100.

use std::time::Duration;

use fixtures::env::pet_manifest;
use fixtures::{Env, Operator, Storage, THOUSANDS_POLL, wait_for_every};

/// Pets, each read once a second.
const PETS: usize = 200;
/// The store's bound, calls a second.
const STORE_RATE: f64 = 100.0;
/// How long the calls are counted, once every record is made.
const WINDOW: Duration = Duration::from_secs(15);
/// The bound on the share of calls a rate-bound store refuses.
const REFUSED_AT_MOST: f64 = 0.01;

/// The operator's store calls in all, and those refused, so far.
fn calls(operator: &Operator) -> fixtures::Result<(f64, f64)> {
    let scrape = operator.metrics()?;
    let name = "petstore_operator_store_call_duration_seconds_count";
    Ok((
        fixtures::http::sum_series(&scrape, name, ""),
        fixtures::http::sum_series(&scrape, name, "outcome=\"ResourceExhausted\""),
    ))
}

/// Runs the operator with `--store-concurrency=<limit>` against a store
/// bound to [`STORE_RATE`]; returns its calls and refusals in the window,
/// and what its limits showed at its end.
fn paced(limit: &str) -> fixtures::Result<(f64, f64, String)> {
    let mut env = Env::start(Storage::Memory)?;
    env.store.set_restart_args(vec![
        "--max-calls-per-second".into(),
        STORE_RATE.to_string().into(),
    ]);
    env.store.restart(Storage::Memory)?;
    let mut options = env.operator_options(&format!("pacing-{limit}"));
    options.poll_interval = "1s";
    options.extra_args.extend(
        [
            "--poll-max-rate=0",
            "--follow-store-changes=false",
            // One create a call: the creates ask as much as they can too.
            "--create-batch-wait=0",
            &format!("--store-concurrency={limit}"),
        ]
        .map(Into::into),
    );
    let operator = env.start_operator_with(&options)?;
    let manifests: Vec<String> = (0..PETS)
        .map(|i| {
            pet_manifest(
                &format!("paced-{i}"),
                &[],
                &format!(" {{name: paced{i}, type: dog, birthday: \"2021-04-01\"}}"),
            )
        })
        .collect();
    env.cp
        .kubectl_stdin(&["apply", "-f", "-"], &manifests.join("---\n"))?;
    // Read from the store's metrics, not its gRPC: a call from here would
    // take the operator's places in the store's rate. Each record made is
    // one revision of the store.
    wait_for_every(
        THOUSANDS_POLL,
        Duration::from_secs(300),
        "every Pet's record made",
        || {
            let scrape = fixtures::http::scrape(&env.store.metrics_addr).ok()?;
            let revision =
                fixtures::http::sum_series(&scrape, "petstore_server_watch_revision", "");
            (revision >= PETS as f64).then_some(())
        },
    )?;
    let before = calls(&operator)?;
    std::thread::sleep(WINDOW);
    let after = calls(&operator)?;
    let scrape = operator.metrics()?;
    let shown = scrape
        .lines()
        .filter(|line| {
            line.starts_with("petstore_operator_store_concurrency_limit")
                || line.starts_with("petstore_operator_store_rate_cap")
        })
        .collect::<Vec<_>>()
        .join("; ");
    Ok((after.0 - before.0, after.1 - before.1, shown))
}

#[test]
fn a_store_bound_by_rate_refuses_at_most_one_call_in_a_hundred_of_the_adaptive_limits()
-> fixtures::Result<()> {
    let (fixed_calls, fixed_refused, _) = paced("32")?;
    let (calls, refused, shown) = paced("auto")?;
    let share = |refused: f64, calls: f64| refused / calls.max(1.0);
    eprintln!(
        "pacing: a store bound to {STORE_RATE} calls a second, {PETS} Pets read once a second, {WINDOW:?}: fixed at 32, {fixed_refused} of {fixed_calls} calls refused ({:.1}%); adaptive, {refused} of {calls} ({:.2}%), its limits at the end: {shown}",
        100.0 * share(fixed_refused, fixed_calls),
        100.0 * share(refused, calls)
    );
    // The bound binds: the fixed limit, as before, meets it.
    assert!(
        share(fixed_refused, fixed_calls) > 0.10,
        "the store's rate never bound the fixed limit: {fixed_refused} of {fixed_calls}"
    );
    assert!(
        share(refused, calls) <= REFUSED_AT_MOST,
        "{refused} of {calls} calls refused (at most {REFUSED_AT_MOST}); limits: {shown}"
    );
    // Held to the store's rate, not far under it: at least half of it.
    let answered = calls - refused;
    assert!(
        answered >= 0.5 * STORE_RATE * WINDOW.as_secs_f64(),
        "only {answered} calls answered in {WINDOW:?}; limits: {shown}"
    );
    // The operator holds itself to about the store's rate, and says so.
    let cap = fixtures::http::sum_series(
        &shown.replace("; ", "\n"),
        "petstore_operator_store_rate_cap",
        "",
    );
    assert!(
        cap > 0.0 && cap <= 1.5 * STORE_RATE,
        "rate cap {cap}; limits: {shown}"
    );
    Ok(())
}
