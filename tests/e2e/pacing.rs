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
/// How long the adaptive limit's calls are counted, once every record is
/// made: 1,500 calls at the store's rate, so 1% is 15 of them.
const WINDOW: Duration = Duration::from_secs(15);
/// How long the fixed limit's are: only to show that the bound binds. Its
/// refused polls fail their reconciles, each a status write, so a short
/// window spares the API server.
const FIXED_WINDOW: Duration = Duration::from_secs(5);
/// From the store's restart with its bound, the time the limit is given to
/// find it: a warm operator meets the bound with as many calls in flight
/// as its limit had grown to, and those are refused together.
const SETTLE: Duration = Duration::from_secs(3);
/// The refusals the adaptive limit may take to find the bound: a few
/// rounds of its calls in flight (the fixed limit takes hundreds).
const SETTLING_REFUSED_AT_MOST: f64 = 50.0;
/// The bound on the share of calls a rate-bound store refuses.
const REFUSED_AT_MOST: f64 = 0.01;

/// What one run counted.
struct Paced {
    /// Refusals in the [`SETTLE`] after the store's restart with its bound.
    settling_refused: f64,
    /// Calls, and refusals, in the window after that.
    calls: f64,
    refused: f64,
    /// The limits' series at the end.
    shown: String,
}

/// The operator's store calls in all, and those refused, so far.
fn calls(operator: &Operator) -> fixtures::Result<(f64, f64)> {
    let scrape = operator.metrics()?;
    let name = "petstore_operator_store_call_duration_seconds_count";
    Ok((
        fixtures::http::sum_series(&scrape, name, ""),
        fixtures::http::sum_series(&scrape, name, "outcome=\"ResourceExhausted\""),
    ))
}

/// Runs the operator with `--store-concurrency=<limit>`: its Pets made on
/// a free store, which then restarts bound to [`STORE_RATE`]; counts the
/// operator's refusals while it settles, then its calls and refusals in
/// `window`. The Pets are made before the bound so that the fixed limit's
/// refused creates, each a failed reconcile and a status write, do not
/// keep the API server busy for half a minute.
fn paced(limit: &str, window: Duration) -> fixtures::Result<Paced> {
    let mut env = Env::start(Storage::Durable)?;
    let mut options = env.operator_options(&format!("pacing-{limit}"));
    options.poll_interval = "1s";
    options.extra_args.extend(
        [
            "--poll-max-rate=0",
            "--follow-store-changes=false",
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
    wait_for_every(
        THOUSANDS_POLL,
        Duration::from_secs(300),
        "every Pet Ready",
        || {
            let pets = crate::typed::pets(&env.cp, Some("default")).ok()?;
            (pets
                .iter()
                .filter(|pet| crate::typed::is_ready(pet))
                .count()
                == PETS)
                .then_some(())
        },
    )?;
    env.store.set_restart_args(vec![
        "--max-calls-per-second".into(),
        STORE_RATE.to_string().into(),
    ]);
    env.store.restart(Storage::Durable)?;
    let restarted = calls(&operator)?;
    std::thread::sleep(SETTLE);
    let before = calls(&operator)?;
    std::thread::sleep(window);
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
    Ok(Paced {
        settling_refused: before.1 - restarted.1,
        calls: after.0 - before.0,
        refused: after.1 - before.1,
        shown,
    })
}

#[test]
fn a_store_bound_by_rate_refuses_at_most_one_call_in_a_hundred_of_the_adaptive_limits()
-> fixtures::Result<()> {
    let fixed = paced("32", FIXED_WINDOW)?;
    let auto = paced("auto", WINDOW)?;
    let share = |run: &Paced| run.refused / run.calls.max(1.0);
    eprintln!(
        "pacing: a store bound to {STORE_RATE} calls a second, {PETS} Pets read once a second. Fixed at 32: {} refused settling, then {} of {} calls in {FIXED_WINDOW:?} ({:.1}%). Adaptive: {} refused settling, then {} of {} in {WINDOW:?} ({:.2}%); its limits at the end: {}",
        fixed.settling_refused,
        fixed.refused,
        fixed.calls,
        100.0 * share(&fixed),
        auto.settling_refused,
        auto.refused,
        auto.calls,
        100.0 * share(&auto),
        auto.shown
    );
    // The bound binds: the fixed limit, as before, meets it.
    assert!(
        share(&fixed) > 0.10,
        "the store's rate never bound the fixed limit: {} of {}",
        fixed.refused,
        fixed.calls
    );
    assert!(
        auto.settling_refused <= SETTLING_REFUSED_AT_MOST,
        "{} refused while finding the bound (at most {SETTLING_REFUSED_AT_MOST}); limits: {}",
        auto.settling_refused,
        auto.shown
    );
    assert!(
        share(&auto) <= REFUSED_AT_MOST,
        "{} of {} calls refused (at most {REFUSED_AT_MOST}); limits: {}",
        auto.refused,
        auto.calls,
        auto.shown
    );
    // Held to the store's rate, not far under it: at least half of it.
    let answered = auto.calls - auto.refused;
    assert!(
        answered >= 0.5 * STORE_RATE * WINDOW.as_secs_f64(),
        "only {answered} calls answered in {WINDOW:?}; limits: {}",
        auto.shown
    );
    // The operator holds itself to about the store's rate, and says so.
    let cap = fixtures::http::sum_series(
        &auto.shown.replace("; ", "\n"),
        "petstore_operator_store_rate_cap",
        "",
    );
    assert!(
        cap > 0.0 && cap <= 1.5 * STORE_RATE,
        "rate cap {cap}; limits: {}",
        auto.shown
    );
    Ok(())
}
