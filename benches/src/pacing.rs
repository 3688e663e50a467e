//! Pacing each store (issue #52): the operator's adaptive limit of store
//! calls at once (`--store-concurrency auto`, `operator/src/store/limiter.rs`)
//! against fixed limits, in one run on one machine.
//!
//! - **The sweep.** N Pets converged as the convergence benchmark's
//!   operator run converges them ([`measure_operator_convergence`]: a
//!   control plane and durable store of its own, shipped settings), once
//!   for each fixed limit of [`SWEEP`] and once with `auto`. The goal: auto
//!   within [`GOAL_RATIO`] of the best fixed limit, which no single fixed
//!   setting is known in advance to be.
//! - **A store bound by rate.** The store refusing beyond
//!   `store_rate` calls a second (`--max-calls-per-second`), read by the
//!   drift poll alone, as tests/e2e/pacing.rs does: the change feed off,
//!   every Pet read once a second, twice as many Pets as the rate, so the
//!   poll asks twice what the store answers, whatever the API server's
//!   speed. Counted over a window once every record is made, with today's
//!   static default ([`STATIC_DEFAULT`]) and with auto. The goal: auto
//!   refused at most [`GOAL_REFUSED`] of its calls.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use kube::api::Api;
use petstore_operator::crd::Pet;

use crate::BenchConfig;
use crate::apimetrics;
use crate::convergence::{
    NAMESPACE, client_from, create_pets, measure_operator_convergence, shipped_options,
    start_leader, store_calls,
};
use crate::report::{subsection, table_head, verdict};
use fixtures::{Env, Operator, Result, Storage, wait_for_every};

/// Where the section of the report starts; runs that do not measure it
/// keep it as it is.
pub const SECTION: &str = "\n## Pacing each store";

/// The goals: auto's time to converge within this many times the
/// best fixed limit's, and at most this share of its calls refused by a
/// store bound by rate.
pub const GOAL_RATIO: f64 = 1.10;
pub const GOAL_REFUSED: f64 = 0.01;

/// `--store-concurrency`: fixed at a number, or `auto`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Setting {
    Fixed(u32),
    Auto,
}

impl std::fmt::Display for Setting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Setting::Fixed(limit) => write!(f, "{limit}"),
            Setting::Auto => f.write_str("auto"),
        }
    }
}

/// The sweep's settings, in the order run: the fixed limits, then
/// auto.
pub const SWEEP: [Setting; 7] = [
    Setting::Fixed(4),
    Setting::Fixed(8),
    Setting::Fixed(16),
    Setting::Fixed(32),
    Setting::Fixed(64),
    Setting::Fixed(128),
    Setting::Auto,
];

/// Today's static default: as many store calls at once as reconciles run
/// (`--concurrency`), so no limit of the store's own.
pub const STATIC_DEFAULT: Setting =
    Setting::Fixed(petstore_operator::controller::DEFAULT_CONCURRENCY as u32);

#[derive(Clone, Debug)]
pub struct PacingConfig {
    /// Pets the sweep converges.
    pub pets: usize,
    /// Pets read once a second from the store bound by rate.
    pub throttled_pets: usize,
    /// That store's `--max-calls-per-second`.
    pub store_rate: u32,
    /// How long its calls are counted, once every record is made.
    pub window: Duration,
    /// The creates' client concurrency, and the convergence's waits.
    pub bench: BenchConfig,
}

impl PacingConfig {
    /// The run: 20,000 Pets; 400 Pets against 200 calls a second.
    pub fn full() -> Self {
        Self {
            pets: 20_000,
            throttled_pets: 400,
            store_rate: 200,
            window: Duration::from_secs(60),
            bench: BenchConfig::full(),
        }
    }

    /// Small enough for the test command. The store's rate shrinks with
    /// the Pets, so that the poll still asks twice what it answers and the
    /// bound binds.
    pub fn smoke() -> Self {
        Self {
            pets: 20,
            throttled_pets: 40,
            store_rate: 20,
            window: Duration::from_secs(5),
            bench: BenchConfig::smoke(),
        }
    }
}

/// One setting's convergence.
#[derive(Clone, Debug)]
pub struct SweepRun {
    pub setting: Setting,
    pub converge: Duration,
    /// The operator's store calls while converging, and those refused
    /// (`ResourceExhausted`).
    pub calls: u64,
    pub refused: u64,
    /// `petstore_operator_store_concurrency_limit` once every Pet was Ready.
    pub limit: Option<f64>,
}

/// One setting against the store bound by rate, over the window.
#[derive(Clone, Debug)]
pub struct ThrottledRun {
    pub setting: Setting,
    pub calls: u64,
    pub refused: u64,
    /// Calls that ended OK.
    pub ok: u64,
    /// The window as measured between the two scrapes.
    pub window: Duration,
    /// The operator's limit and rate cap at the window's end.
    pub limit: Option<f64>,
    pub rate_cap: Option<f64>,
}

impl ThrottledRun {
    pub fn refused_share(&self) -> f64 {
        self.refused as f64 / self.calls.max(1) as f64
    }

    pub fn ok_per_second(&self) -> f64 {
        self.ok as f64 / self.window.as_secs_f64().max(1e-9)
    }
}

#[derive(Clone, Debug, Default)]
pub struct PacingResult {
    pub pets: usize,
    /// In the order run ([`SWEEP`]).
    pub sweep: Vec<SweepRun>,
    pub throttled_pets: usize,
    pub store_rate: u32,
    /// [`STATIC_DEFAULT`], then auto.
    pub throttled: Vec<ThrottledRun>,
    /// Load averages at the end.
    pub load: String,
    pub stamp: crate::report::Stamp,
}

impl PacingResult {
    /// The fixed limit that converged fastest.
    pub fn best_fixed(&self) -> Option<&SweepRun> {
        self.sweep
            .iter()
            .filter(|run| run.setting != Setting::Auto)
            .min_by_key(|run| run.converge)
    }

    pub fn sweep_auto(&self) -> Option<&SweepRun> {
        self.sweep.iter().find(|run| run.setting == Setting::Auto)
    }

    /// Auto's time ÷ the best fixed limit's.
    pub fn ratio(&self) -> f64 {
        match (self.sweep_auto(), self.best_fixed()) {
            (Some(auto), Some(best)) if !best.converge.is_zero() => {
                auto.converge.as_secs_f64() / best.converge.as_secs_f64()
            }
            _ => f64::INFINITY,
        }
    }

    pub fn sweep_met(&self) -> bool {
        self.ratio() <= GOAL_RATIO
    }

    pub fn throttled_run(&self, setting: Setting) -> Option<&ThrottledRun> {
        self.throttled.iter().find(|run| run.setting == setting)
    }

    /// Auto made calls in the window, and the store refused few enough.
    pub fn throttled_met(&self) -> bool {
        self.throttled_run(Setting::Auto)
            .is_some_and(|run| run.calls > 0 && run.refused_share() <= GOAL_REFUSED)
    }

    pub fn goal_met(&self) -> bool {
        self.sweep_met() && self.throttled_met()
    }
}

/// The sweep, then the store bound by rate with each limit.
pub fn measure(config: &PacingConfig, progress: &dyn Fn(&str)) -> Result<PacingResult> {
    let rt = crate::runtime()?;
    let stamp = crate::report::Stamp::now();
    let n = config.pets;
    let mut sweep = Vec::new();
    for setting in SWEEP {
        progress(&format!(
            "pacing: {n} Pets converging, --store-concurrency={setting}"
        ));
        let mut convergence = crate::convergence_config(&config.bench, n);
        convergence.operator_args = vec![format!("--store-concurrency={setting}")];
        let result = measure_operator_convergence(&rt, &convergence)?;
        let run = SweepRun {
            setting,
            converge: result.converge,
            calls: result.store_calls.values().sum(),
            refused: refused(&result.store_failed),
            limit: result.store_limit,
        };
        progress(&format!(
            "pacing: --store-concurrency={setting} converged in {:.2} s, {} store calls, {} refused",
            run.converge.as_secs_f64(),
            run.calls,
            run.refused
        ));
        sweep.push(run);
    }
    let mut throttled = Vec::new();
    for setting in [STATIC_DEFAULT, Setting::Auto] {
        progress(&format!(
            "pacing: {} Pets read once a second from a store bound to {} calls a second, --store-concurrency={setting}",
            config.throttled_pets, config.store_rate
        ));
        let run = measure_throttled(&rt, config, setting)?;
        progress(&format!(
            "pacing: --store-concurrency={setting}, {} of {} calls refused in {:.1} s",
            run.refused,
            run.calls,
            run.window.as_secs_f64()
        ));
        throttled.push(run);
    }
    Ok(PacingResult {
        pets: n,
        sweep,
        throttled_pets: config.throttled_pets,
        store_rate: config.store_rate,
        throttled,
        load: crate::report::load_average(),
        stamp,
    })
}

fn refused(failed: &BTreeMap<String, u64>) -> u64 {
    failed.get("ResourceExhausted").copied().unwrap_or(0)
}

/// The largest series of a gauge over its stores (the bench has one).
fn gauge(metrics: &str, name: &str) -> Option<f64> {
    apimetrics::samples(metrics, name)
        .map(|(_, value)| value)
        .reduce(f64::max)
}

/// The operator's store calls so far: by method, and those not OK by
/// outcome.
type Calls = (BTreeMap<String, u64>, BTreeMap<String, u64>);

fn calls(operator: &Operator) -> Result<Calls> {
    let metrics = operator.metrics()?;
    Ok((
        store_calls(&metrics),
        crate::rotation::operator_failed(&metrics),
    ))
}

/// One operator with `--store-concurrency=<setting>` against a store bound
/// to `config.store_rate`, on a control plane of its own.
fn measure_throttled(
    rt: &tokio::runtime::Runtime,
    config: &PacingConfig,
    setting: Setting,
) -> Result<ThrottledRun> {
    let mut env = Env::start(Storage::Durable)?;
    env.store.set_restart_args(vec![
        "--max-calls-per-second".into(),
        config.store_rate.to_string().into(),
    ]);
    env.store.restart(Storage::Durable)?;
    let mut options = shipped_options(&env, "bench-pacing");
    options.poll_interval = "1s";
    options.extra_args.extend(
        [
            // Every Pet read once a second, by the poll alone.
            "--poll-max-rate=0".to_owned(),
            "--follow-store-changes=false".to_owned(),
            // One create a call: the creates ask as much as they can too.
            "--create-batch-wait=0".to_owned(),
            format!("--store-concurrency={setting}"),
        ]
        .map(Into::into),
    );
    let operator = start_leader(&env, &options)?;
    let pets = config.throttled_pets;
    rt.block_on(async {
        env.cp.ensure_namespace(NAMESPACE)?;
        let client = client_from(&env.cp.kubeconfig).await?;
        let api: Api<Pet> = Api::namespaced(client, NAMESPACE);
        create_pets(&api, pets, config.bench.concurrency).await
    })?;
    // Each record made is one revision of the store. Read from its
    // metrics, not its gRPC: a call from here would take the operator's
    // places in the store's rate.
    wait_for_every(
        Duration::from_millis(500),
        Duration::from_secs(300 + pets as u64 / 5),
        "every Pet's record made",
        || {
            let scrape = fixtures::http::scrape(&env.store.metrics_addr).ok()?;
            let revision =
                fixtures::http::sum_series(&scrape, "petstore_server_watch_revision", "");
            (revision >= pets as f64).then_some(())
        },
    )?;
    let (calls_before, failed_before) = calls(&operator)?;
    let from = Instant::now();
    std::thread::sleep(config.window);
    let (calls_after, failed_after) = calls(&operator)?;
    let window = from.elapsed();
    let metrics = operator.metrics()?;
    let all: u64 = apimetrics::increase(&calls_before, &calls_after)
        .values()
        .sum();
    let failed = apimetrics::increase(&failed_before, &failed_after);
    Ok(ThrottledRun {
        setting,
        calls: all,
        refused: refused(&failed),
        ok: all.saturating_sub(failed.values().sum()),
        window,
        limit: gauge(&metrics, "petstore_operator_store_concurrency_limit"),
        rate_cap: gauge(&metrics, "petstore_operator_store_rate_cap"),
    })
}

fn shown(value: Option<f64>) -> String {
    value.map_or_else(|| "—".to_owned(), |v| format!("{v:.0}"))
}

fn percent(share: f64) -> String {
    format!("{:.2}%", 100.0 * share)
}

pub fn markdown(result: &PacingResult, command: &str) -> String {
    let settings = SWEEP
        .iter()
        .filter(|s| **s != Setting::Auto)
        .map(Setting::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    let mut out = crate::report::measured_section(
        SECTION,
        command,
        &result.stamp,
        &format!(
            "**Sweep**: {} Pets converged as in *Operator convergence* (each time a control plane and durable store of its own, the operator with its shipped settings), with `--store-concurrency` fixed at each of {settings} (a fixed limit learns nothing) and then `auto` (the default: adaptive, up to `--store-concurrency-max` 128), one after the other; each timed from the first create until a watch saw every Pet Ready. Store calls and refusals (`ResourceExhausted`) are the operator's own over that span; the limit is its `petstore_operator_store_concurrency_limit` once every Pet was Ready. Each setting runs once, so the ratio carries the machine's run-to-run noise. **A store bound by rate**: the store started with `--max-calls-per-second {}`, the operator with `--poll-interval 1s --poll-max-rate=0 --follow-store-changes=false --create-batch-wait=0`, {} Pets, so the drift poll alone asks {} reads a second; once the store's `petstore_server_watch_revision` reached {} (every record made), the operator's calls were counted over a {} window, with today's static default (`--store-concurrency={STATIC_DEFAULT}`, as many calls at once as reconciles: no limit of the store's own) and with `auto`, each on a control plane of its own. Load averages at the end: {}.",
            result.pets,
            result.store_rate,
            result.throttled_pets,
            result.throttled_pets,
            result.throttled_pets,
            crate::report::duration_words(
                result
                    .throttled
                    .first()
                    .map_or(Duration::ZERO, |run| run.window)
            ),
            result.load,
        ),
    );
    let seconds = |run: Option<&SweepRun>| {
        run.map_or_else(
            || "—".to_owned(),
            |run| format!("{:.2} s", run.converge.as_secs_f64()),
        )
    };
    let _ = writeln!(
        out,
        "| time to converge N = {}, `auto` ÷ the best fixed limit ({}) | ≤ {GOAL_RATIO:.2} | {:.2} ({} against {}) | {} |",
        result.pets,
        result
            .best_fixed()
            .map_or_else(|| "none".to_owned(), |run| run.setting.to_string()),
        result.ratio(),
        seconds(result.sweep_auto()),
        seconds(result.best_fixed()),
        verdict(result.sweep_met()),
    );
    let refused = |run: Option<&ThrottledRun>| {
        run.map_or_else(
            || "—".to_owned(),
            |run| {
                format!(
                    "{} ({} of {})",
                    percent(run.refused_share()),
                    run.refused,
                    run.calls
                )
            },
        )
    };
    let _ = writeln!(
        out,
        "| store calls refused with `auto`, a store bound to {} calls a second, {} Pets read once a second | ≤ {} | {} | {} |",
        result.store_rate,
        result.throttled_pets,
        percent(GOAL_REFUSED),
        refused(result.throttled_run(Setting::Auto)),
        verdict(result.throttled_met()),
    );
    let _ = writeln!(
        out,
        "| beside it: the same with today's static default (`--store-concurrency={STATIC_DEFAULT}`) | (as before) | {} |  |",
        refused(result.throttled_run(STATIC_DEFAULT)),
    );
    subsection(
        &mut out,
        "The sweep",
        &format!(
            "{} Pets, each setting on a fresh control plane.",
            result.pets
        ),
    );
    table_head(
        &mut out,
        &[
            "`--store-concurrency`",
            "seconds to converge",
            "store calls",
            "refused",
            "limit once converged",
        ],
        "lrrrr",
    );
    for run in &result.sweep {
        let _ = writeln!(
            out,
            "| {} | {:.2} | {} | {} | {} |",
            run.setting,
            run.converge.as_secs_f64(),
            run.calls,
            run.refused,
            shown(run.limit),
        );
    }
    subsection(
        &mut out,
        "A store bound by rate",
        &format!(
            "{} calls a second at most; {} Pets read once a second. *Answered* is the calls that ended OK, a second of the window.",
            result.store_rate, result.throttled_pets
        ),
    );
    table_head(
        &mut out,
        &[
            "`--store-concurrency`",
            "store calls",
            "refused",
            "refused share",
            "answered a second",
            "limit at the end",
            "rate cap at the end",
        ],
        "lrrrrrr",
    );
    for run in &result.throttled {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {:.1} | {} | {} |",
            run.setting,
            run.calls,
            run.refused,
            percent(run.refused_share()),
            run.ok_per_second(),
            shown(run.limit),
            shown(run.rate_cap.filter(|cap| *cap > 0.0)),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sweep_run(setting: Setting, seconds: f64) -> SweepRun {
        SweepRun {
            setting,
            converge: Duration::from_secs_f64(seconds),
            calls: 100,
            refused: 0,
            limit: None,
        }
    }

    fn throttled_run(setting: Setting, calls: u64, refused: u64) -> ThrottledRun {
        ThrottledRun {
            setting,
            calls,
            refused,
            ok: calls - refused,
            window: Duration::from_secs(10),
            limit: Some(8.0),
            rate_cap: Some(180.0),
        }
    }

    fn result(auto_seconds: f64, auto_refused: u64) -> PacingResult {
        let mut sweep: Vec<SweepRun> = [40.0, 22.0, 20.0, 21.0, 25.0, 30.0]
            .into_iter()
            .zip(SWEEP)
            .map(|(seconds, setting)| sweep_run(setting, seconds))
            .collect();
        sweep.push(sweep_run(Setting::Auto, auto_seconds));
        PacingResult {
            pets: 20_000,
            sweep,
            throttled_pets: 400,
            store_rate: 200,
            throttled: vec![
                throttled_run(STATIC_DEFAULT, 12_000, 6_000),
                throttled_run(Setting::Auto, 10_000, auto_refused),
            ],
            ..Default::default()
        }
    }

    #[test]
    fn the_goals_are_auto_within_a_tenth_of_the_best_fixed_limit_and_a_hundredth_refused() {
        // The best fixed limit is 16, at 20 s: 22 s is 1.10 of it.
        let met = result(22.0, 100);
        assert_eq!(
            met.best_fixed().map(|run| run.setting),
            Some(Setting::Fixed(16))
        );
        assert!((met.ratio() - 1.10).abs() < 1e-9, "{}", met.ratio());
        assert!(met.goal_met());
        assert!(!result(22.1, 100).sweep_met(), "just over a tenth");
        assert!(!result(22.0, 101).throttled_met(), "just over a hundredth");
        let mut no_auto = result(20.0, 0);
        no_auto.sweep.pop();
        assert!(!no_auto.sweep_met(), "no auto run");
        let mut no_calls = result(20.0, 0);
        no_calls.throttled[1].calls = 0;
        assert!(!no_calls.throttled_met(), "no call in the window");
        assert_eq!(STATIC_DEFAULT, Setting::Fixed(32));
    }

    #[test]
    fn the_section_has_the_goals_and_a_row_for_every_setting() {
        let section = markdown(&result(23.0, 50), "hack/bench.sh --pacing");
        assert!(section.starts_with(SECTION.trim_start()), "{section}");
        assert!(
            section.contains("| ≤ 1.10 | 1.15 (23.00 s against 20.00 s) | **not met** |"),
            "{section}"
        );
        assert!(
            section.contains("| ≤ 1.00% | 0.50% (50 of 10000) | met |"),
            "{section}"
        );
        assert!(
            section.contains("| (as before) | 50.00% (6000 of 12000) |  |"),
            "{section}"
        );
        for setting in SWEEP {
            assert!(
                section.contains(&format!("\n| {setting} | ")),
                "no row for {setting}: {section}"
            );
        }
        assert!(
            section.contains("| auto | 10000 | 50 | 0.50% | 995.0 | 8 | 180 |"),
            "{section}"
        );
    }
}
