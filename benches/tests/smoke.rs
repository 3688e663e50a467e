//! Runs the benchmarks at a tiny size so the test command proves the code
//! works. It asserts results that are not timings: everything converged,
//! nothing was written in steady state, and no acknowledged pet was lost.

use petstore_bench::{self as bench, BenchConfig};

#[test]
fn benchmarks_run_end_to_end() -> fixtures::Result<()> {
    let _one = one_at_a_time();
    let config = BenchConfig {
        // The side-by-side pairs run each side in a process of its own.
        side_runner: Some(env!("CARGO_BIN_EXE_petstore-bench").into()),
        ..BenchConfig::smoke()
    };
    let results = bench::run_all(&config, progress)?;

    assert_eq!(results.convergence.len(), config.sizes.len());
    for r in &results.convergence {
        let n = r.pets as u64;
        assert_eq!(r.pairs.len(), config.pairs, "every pair ran: {r:?}");
        let memory = r.control_plane;
        assert!(
            memory.apiserver_peak_rss_kib > 0
                && memory.etcd_peak_rss_kib > 0
                && memory.etcd_db_bytes > 0,
            "the control plane's memory read: {r:?}"
        );
        assert!(
            r.drift_reconcile_p99.is_some() && r.drift_queue_wait_p99.is_some(),
            "the reconciles that put the drift back, and their waits, timed: {r:?}"
        );
        // The same run as `--at-scale` reports it.
        let at_scale = bench::at_scale::AtScaleResult {
            stamp: bench::report::Stamp::now(),
            run: r.clone(),
        };
        let section = bench::at_scale::markdown(&at_scale, "hack/bench.sh --at-scale 10");
        assert!(
            section.contains(&format!(
                "| {}, {}, {:.1} s",
                r.restart_api_writes,
                r.restart_store_writes,
                r.restart_catch_up.as_secs_f64()
            )),
            "{section}"
        );
        // The restarted operator listed its Pets, and the section says so.
        assert!(
            r.restart_api_requests
                .contains_key(&("pets".to_owned(), "LIST".to_owned()))
                && section.contains("pets LIST "),
            "{r:?}\n{section}"
        );
        // The restart's CPU read by process, the new operator's too.
        assert!(
            r.restart_first_reconcile
                .is_some_and(|first| first <= r.restart_catch_up)
                && r.restart_cpu.api_server > 0.0
                && r.restart_cpu.operator > 0.0
                && r.restart_cpu.store > 0.0
                && section.contains(&format!(
                    "{:.1}, {:.1}, {:.1}, {:.1} s",
                    r.restart_cpu.api_server,
                    r.restart_cpu.etcd,
                    r.restart_cpu.operator,
                    r.restart_cpu.store
                )),
            "{r:?}\n{section}"
        );
        assert!(
            r.pairs
                .iter()
                .all(|p| p.floor > std::time::Duration::ZERO
                    && p.operator > std::time::Duration::ZERO),
            "every pair timed: {r:?}"
        );
        assert!(
            r.api_requests
                .keys()
                .any(|(res, verb)| res == "pets/status" && verb == "PATCH"),
            "{r:?}"
        );
        // Creates that come together share calls (--create-batch-wait).
        assert!(
            r.store_calls
                .get("AddPets")
                .is_some_and(|&calls| (1..=n).contains(&calls)),
            "at most one create call per Pet: {r:?}"
        );
        // Counts, not timings: no read per Pet, because the warm-up's
        // creates showed that a create says what it found (a retry may
        // read), and the finalizer, the status and one Event per Pet.
        assert!(
            r.reads_per_pet() <= 0.1,
            "store reads per Pet while converging: {r:?}"
        );
        assert!(
            r.api_writes >= 2 * n && r.writes_per_pet() <= 3.0,
            "API writes per Pet while converging: {r:?}"
        );
        // The restarted operator catches up without writing anything.
        assert_eq!(r.restart_api_writes, 0, "API writes in the catch-up: {r:?}");
        assert_eq!(
            r.restart_store_writes, 0,
            "store writes in the catch-up: {r:?}"
        );
        assert!(
            r.restart_store_reads >= n,
            "every Pet re-read on restart: {r:?}"
        );
        // Every out-of-band change was put back (drift::measure waits for
        // each), and timed.
        assert!(
            r.drift.edits > 0 && r.drift.deletes > 0 && r.drift.max > std::time::Duration::ZERO,
            "drift measured: {r:?}"
        );
        assert!(
            r.drift_postgres.edits > 0
                && r.drift_postgres.deletes > 0
                && r.drift_postgres.max > std::time::Duration::ZERO,
            "drift measured on PostgreSQL: {r:?}"
        );
        // Drift found by polling alone (--follow-store-changes=false, which
        // the bench checks left the feed alone): every change put back, and
        // each waited for its Pet's poll, so the slowest took longer than
        // any found on the feed.
        let Some((interval, polling)) = &r.drift_polling else {
            panic!("drift by polling not measured: {r:?}");
        };
        assert!(
            polling.edits == r.drift.edits && polling.deletes == r.drift.deletes,
            "the same changes by polling: {r:?}"
        );
        assert!(
            polling.max > r.drift.max
                && polling.max <= *interval * 2 + std::time::Duration::from_secs(60),
            "drift by polling waits for the poll: {r:?}"
        );
        // Both lists counted every Pet (list_times checks), and timed,
        // with the defaults and with the API server restarted without the
        // list snapshot.
        for round in [&r.list.default, &r.list.without_snapshot] {
            assert!(
                round.v1 > std::time::Duration::ZERO && round.v1alpha1 > std::time::Duration::ZERO,
                "listed as v1 and v1alpha1: {r:?}"
            );
        }
        // By default every page comes from the watch cache, which holds
        // the Pets converted already: the webhook is not called.
        assert_eq!(r.list.default.webhook_calls, 0, "{r:?}");
        assert_eq!(
            r.steady_api_writes, 0,
            "no API writes in steady state: {r:?}"
        );
        assert_eq!(
            r.steady_store_writes, 0,
            "no store writes in steady state: {r:?}"
        );
        // Two poll intervals: each Pet polled, none written.
        assert!(r.steady_store_reads >= n, "drift polls ran: {r:?}");
        assert!(r.operator_peak_rss_kib > 0 && r.store_peak_rss_kib > 0);
        // CPU is read from /proc for every process of both runs.
        assert!(
            r.cpu.api_server > 0.0 && r.floor_cpu.api_server > 0.0,
            "API server CPU measured in both runs: {r:?}"
        );
        // In the floor, a standby replica serves the conversion webhook,
        // which the API server calls for writes of Pets: both runs convert.
        // (Calls answered, not CPU: a few conversions may take less than
        // the clock tick /proc counts in.)
        assert!(
            r.floor_conversions > 0 && r.conversions > 0,
            "conversions served in both runs: {r:?}"
        );
    }
    // Each backend x 4 operations x each concurrency, for the Rust client;
    // x 3 operations plus ghz's ceiling (a health check) for ghz, every
    // ghz call answered OK.
    let cells = config.store_setups.len() * config.store_concurrencies.len();
    assert_eq!(results.store.len(), 4 * cells);
    assert!(results.store.iter().all(|r| r.calls > 0));
    assert_eq!(results.ghz.len(), 4 * cells);
    assert_eq!(
        results
            .ghz
            .iter()
            .filter(|r| r.operation == petstore_bench::store_load::CEILING_OPERATION)
            .count(),
        cells
    );
    assert!(
        results.ghz.iter().all(|r| r.calls > 0 && r.errors == 0),
        "{:?}",
        results.ghz
    );
    // The large-store run, tiny: every pet streamed, name search found one.
    assert_eq!(results.scale.len(), 2);
    for r in &results.scale {
        assert_eq!(Some(r.streamed), config.scale_records, "{r:?}");
    }
    assert!(
        results.scale.iter().any(|r| r.open.is_some()),
        "durable open time logged"
    );
    // The feed's cost: every watcher received every create.
    assert_eq!(
        results
            .feed_cost
            .iter()
            .map(|r| r.watchers)
            .collect::<Vec<_>>(),
        config.feed_watchers
    );
    for r in &results.feed_cost {
        assert_eq!(r.delivered, r.creates * r.watchers as u64, "{r:?}");
        assert!(
            r.store_cpu_seconds > 0.0 && r.store_peak_rss_kib > 0,
            "{r:?}"
        );
    }
    let durability = results
        .durability
        .as_ref()
        .expect("durable backend checked");
    assert!(durability.acknowledged > 0);
    assert_eq!(durability.found_after_kill, durability.acknowledged);

    let dir = tempfile::tempdir().map_err(|e| fixtures::Error::Io {
        what: "tempdir".into(),
        source: e,
    })?;
    let svg = dir.path().join("convergence.svg");
    bench::plot(&results.convergence, &svg)?;
    assert!(
        std::fs::read_to_string(&svg)
            .unwrap_or_default()
            .contains("<svg")
    );
    let report = bench::markdown(&results, &bench::environment(), Some("convergence.svg"));
    for heading in [
        "## Operator convergence",
        "### Goals",
        "### CPU while converging",
        "authenticates as the operator's ServiceAccount",
        "### Restart",
        "### Steady state",
        "## Pet store",
        "### ghz",
        "### Goals",
        "### A large store",
        "### The change feed's cost",
        "Durability:",
    ] {
        assert!(report.contains(heading), "{heading}");
    }
    Ok(())
}

/// `--pairs-only --operator-alone`: the operator's run alone, timed, with
/// its CPU split by process and the API requests it made.
#[test]
fn the_operator_alone_runs_end_to_end() -> fixtures::Result<()> {
    let _one = one_at_a_time();
    let config = BenchConfig {
        pairs: 1,
        ..BenchConfig::smoke()
    };
    let runs = bench::run_operator_alone(&config, progress)?;
    assert_eq!(runs.len(), config.sizes.len(), "one run a size");
    for r in &runs {
        assert!(r.converge > std::time::Duration::ZERO, "{r:?}");
        assert!(r.cpu.api_server > 0.0 && r.cpu.operator > 0.0, "{r:?}");
        assert!(r.operator_peak_rss_kib > 0, "{r:?}");
        let memory = r.control_plane;
        assert!(
            memory.apiserver_peak_rss_kib > 0 && memory.etcd_peak_rss_kib > 0,
            "{r:?}"
        );
        assert!(memory.etcd_db_bytes > 0, "{r:?}");
        // Every Pet's finalizer and status patched by the operator.
        for resource in ["pets", "pets/status"] {
            let patches = r
                .api_requests
                .get(&(resource.to_owned(), "PATCH".to_owned()))
                .copied();
            assert!(
                patches.is_some_and(|n| n >= r.pets as u64),
                "{resource} PATCH: {r:?}"
            );
        }
    }
    Ok(())
}

/// `--import` at a tiny size: the plugin runs and prints a manifest per
/// record.
#[test]
fn the_import_benchmark_runs_end_to_end() -> fixtures::Result<()> {
    let config = bench::import::ImportConfig { records: 50 };
    let result = bench::import::measure(&config, &progress)?;
    assert_eq!(result.runs.len(), bench::import::ROUNDS);
    assert!(result.every_record(), "{result:?}");
    assert!(result.summary.contains("50 of 50 records"), "{result:?}");
    assert!(result.peak_rss_kib() > 0, "{result:?}");
    Ok(())
}

/// `--plans` at a tiny size, one round each way: every rename's plan shown
/// and timed, the store not written, and each burst's requests to Pets and
/// Events what the report's model says they are.
#[test]
fn the_plans_benchmark_runs_end_to_end() -> fixtures::Result<()> {
    use bench::plans::{self, BulkEdit, PlanWriter};
    use std::time::Duration;

    let config = plans::PlansConfig {
        pets: 4,
        concurrency: 2,
        rounds: 1,
    };
    let result = plans::measure(&config, &progress)?;
    assert_eq!((result.pets, result.rounds), (4, 1), "{result:?}");
    assert_eq!(
        result
            .bursts
            .iter()
            .map(|b| (b.edit, b.writer))
            .collect::<Vec<_>>(),
        [
            (BulkEdit::KubectlApply, PlanWriter::Operator),
            (BulkEdit::Patches(2), PlanWriter::Operator),
            (BulkEdit::Patches(2), PlanWriter::Floor),
        ],
        "{result:?}"
    );
    for burst in &result.bursts {
        assert_eq!(burst.rounds.len(), config.rounds, "{burst:?}");
        assert_eq!(burst.edits(config.pets), 4, "{burst:?}");
        // Every rename timed, by whoever wrote its plan.
        assert_eq!(burst.shown, 4, "every plan shown: {burst:?}");
        assert!(
            burst.p50 <= burst.p99 && burst.p99 <= burst.max,
            "{burst:?}"
        );
        for round in &burst.rounds {
            // Four edits, answered one after another (kubectl) or two at a
            // time: the last answer and the last plan come after the first
            // answer.
            assert!(
                round.edits_took > Duration::ZERO && round.all_shown > Duration::ZERO,
                "{burst:?}"
            );
            assert!(round.p99 <= burst.max, "{burst:?}");
        }
        assert_eq!(
            burst.edit_requests(),
            burst.modelled_requests(config.pets),
            "one edit, one status write and (by the operator) one Event per rename: {burst:?}"
        );
    }
    assert_eq!(result.store_writes, 0.0, "no store write under Approve");
    assert!(!result.stamp.commit.is_empty() && !result.stamp.started_at.is_empty());

    let section = plans::markdown(&result, "hack/bench.sh --plans 4");
    assert!(
        section.starts_with(plans::SECTION.trim_start()),
        "{section}"
    );
    assert!(plans::every_way_showed_every_plan(&section, 4), "{section}");
    assert!(
        section.contains(
            "| store write RPCs, from the switch to the operator's last plan shown | 0 | 0 | met |"
        ),
        "{section}"
    );
    Ok(())
}

/// `--spread` at a tiny size (60 Pets over 6 namespaces on 3 stores), with
/// no pair (the pairs' method has its own smoke above; each pair would
/// start two more control planes): every Pet on the store its namespace's
/// layout names, one tenant token per namespace, and the section written.
#[test]
fn the_spread_benchmark_runs_end_to_end() -> fixtures::Result<()> {
    use bench::spread::{self, Layout, SpreadConfig};
    let _one = one_at_a_time();

    let config = SpreadConfig {
        pets: 60,
        namespaces: 6,
        bench: BenchConfig {
            pairs: 0,
            concurrency: 16,
            side_runner: Some(env!("CARGO_BIN_EXE_petstore-bench").into()),
            ..BenchConfig::smoke()
        },
    };
    let result = spread::measure(&config, &progress)?;
    let (spread_run, single) = (&result.spread, &result.single);
    assert_eq!(
        (
            spread_run.namespaces,
            spread_run.stores,
            single.namespaces,
            single.stores
        ),
        (6, 3, 1, 1)
    );
    // Checked Pet by Pet against the layout as they are counted.
    assert_eq!(
        spread_run.pets_per_store,
        Layout::spread(6).pets_per_store(60)
    );
    assert_eq!(spread_run.pets_per_store, [20, 20, 20]);
    assert_eq!(single.pets_per_store, [60]);
    // Tokens are cached: one TokenRequest per namespace, and one for the
    // observer of each store the Pets opened.
    assert_eq!(spread_run.token_requests, (6, 3), "{spread_run:?}");
    assert_eq!(single.token_requests, (1, 1), "{single:?}");
    for run in [spread_run, single] {
        assert!(run.operator_peak_rss_kib > 0, "{run:?}");
        // Each Pet's pin, finalizer and status at least, and a record made.
        assert!(run.writes_per_pet() >= 3.0, "{run:?}");
        assert!(
            run.store_calls.get("AddPets").is_some_and(|n| *n > 0),
            "{run:?}"
        );
        assert!(run.apiserver_peak_rss_kib > 0 && run.etcd_peak_rss_kib > 0);
        assert!(run.stores_peak_rss_kib > 0, "{run:?}");
        assert_eq!(run.connections_refused, 0, "{run:?}");
    }
    assert!(result.pairs.is_empty());
    // The floor's writes, Pet by Pet: the pin, the finalizer and the
    // status, and one TokenRequest per namespace; the creates are the
    // benchmark's.
    let (floor, requests) = spread::measure_floor(60, 6, 16)?;
    assert!(floor.time > std::time::Duration::ZERO);
    let count = |resource: &str, verb: &str| {
        requests
            .get(&(resource.to_owned(), verb.to_owned()))
            .copied()
            .unwrap_or(0)
    };
    assert_eq!(
        (
            count("pets", "POST"),
            count("pets/status", "PATCH"),
            count("pets", "PATCH"),
            count("serviceaccounts/token", "POST"),
        ),
        (60, 120, 60, 6),
        "{requests:?}"
    );
    let section = spread::markdown(&result, "hack/bench.sh --spread 60 --spread-namespaces 6");
    assert!(
        section.starts_with(spread::SECTION.trim_start()),
        "{section}"
    );
    assert!(section.contains("| 20, 20, 20 |"), "{section}");
    Ok(())
}

/// The smoke runs below start control planes and load the machine: one at
/// a time, and not beside the run above's timings.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Holds [`ONE_AT_A_TIME`] until dropped; poison is ignored so that one
/// failed run does not fail the others.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A run's steps, on stderr where `cargo test` shows them on failure.
fn progress(step: &str) {
    eprintln!("[bench smoke] {step}");
}

/// `hack/bench.sh --rotation`, tiny: a whole CA move (six changes), each
/// change in use, no failed store call, no restart.
#[test]
fn rotation_runs_end_to_end() -> fixtures::Result<()> {
    use petstore_bench::rotation::{CYCLE, RotationConfig, measure};
    let _one = one_at_a_time();
    let config = RotationConfig {
        pets: 10,
        window: std::time::Duration::from_secs(18),
        period: std::time::Duration::from_secs(3),
    };
    let result = measure(&config, &progress)?;
    assert_eq!(result.rotations.len(), CYCLE.len(), "{result:?}");
    assert_eq!(result.ca_moves(), 1, "{result:?}");
    assert_eq!(result.never_in_use(), 0, "{result:?}");
    assert_eq!(result.operator_failed_total(), 0, "{result:?}");
    assert!(result.restarted.is_empty(), "{result:?}");
    assert!(result.edits > 0 && result.operator_ok > 0, "{result:?}");
    // Three changes each side, each read once.
    assert_eq!(
        (result.store_reloads.0, result.operator_reloads.0),
        (3, 3),
        "{result:?}"
    );
    Ok(())
}

/// `hack/bench.sh --flood`, tiny: the operator's calls timed in both
/// windows, ghz answered and refused.
#[test]
fn flood_runs_end_to_end() -> fixtures::Result<()> {
    use petstore_bench::flood::{CONNECTIONS_PER_CLIENT, FloodConfig, measure};
    let _one = one_at_a_time();
    // Small beside the full run's ghz: this shares the machine with the
    // end-to-end stories. Still more connections than one client may hold.
    let connections = CONNECTIONS_PER_CLIENT + 8;
    let config = FloodConfig {
        pets: 10,
        window: std::time::Duration::from_secs(3),
        ghz: (connections, connections),
    };
    let result = measure(&config, &progress)?;
    assert!(
        !result.idle.is_empty() && !result.flood.is_empty(),
        "the operator's calls timed in both windows: {result:?}"
    );
    assert!(result.ghz.code("OK") > 0, "{:?}", result.ghz);
    // ghz opens more connections than one client may hold: the store
    // closes the rest as they come.
    assert!(
        result.connections_refused >= (connections - CONNECTIONS_PER_CLIENT) as u64,
        "{result:?}"
    );
    Ok(())
}

/// `--smoke --pacing`, as a user runs it: the binary with its flags, and
/// the section it writes. Every setting of the sweep converged and timed;
/// the store bound by rate called with both limits, and refusing the fixed
/// one (the bound binds). At this size auto ÷ the best fixed limit is
/// noise, so a miss of a goal is let pass; an error is not (it writes no
/// section).
#[test]
fn the_pacing_benchmark_runs_end_to_end() -> fixtures::Result<()> {
    use petstore_bench::pacing::{SECTION, STATIC_DEFAULT, SWEEP, Setting};
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().map_err(fixtures::io("a temporary directory"))?;
    let out = dir.path().join("BENCHMARKS.md");
    let ran = std::process::Command::new(env!("CARGO_BIN_EXE_petstore-bench"))
        .args(["--smoke", "--pacing", "--out"])
        .arg(&out)
        .output()
        .map_err(fixtures::io("running petstore-bench --smoke --pacing"))?;
    let stderr = String::from_utf8_lossy(&ran.stderr);
    let report = std::fs::read_to_string(&out).unwrap_or_default();
    let heading = SECTION.trim_start();
    let Some(at) = report.find(heading) else {
        panic!("no section {heading:?} written ({}): {stderr}", ran.status);
    };
    let section = &report[at..];
    assert!(
        ran.status.success() || section.contains("**not met**"),
        "failed with every goal met ({}): {stderr}",
        ran.status
    );
    // The cells of the row for `setting` in the table under `table`.
    let row = |table: &str, setting: Setting| -> Vec<String> {
        let table = section
            .split("\n### ")
            .find(|part| part.starts_with(table))
            .unwrap_or_else(|| panic!("no table {table:?}: {section}"));
        let start = format!("| {setting} |");
        let line = table
            .lines()
            .find(|line| line.starts_with(&start))
            .unwrap_or_else(|| panic!("no row for {setting} in {table:?}: {section}"));
        line.trim_matches('|')
            .split('|')
            .map(|cell| cell.trim().to_owned())
            .collect()
    };
    let number = |cell: &str| -> f64 {
        cell.parse()
            .unwrap_or_else(|_| panic!("{cell:?} is not a number: {section}"))
    };
    for setting in SWEEP {
        let cells = row("The sweep", setting);
        assert!(number(&cells[1]) > 0.0, "{setting} timed: {section}");
        assert!(
            number(&cells[2]) > 0.0,
            "{setting} called the store: {section}"
        );
    }
    for setting in [STATIC_DEFAULT, Setting::Auto] {
        let cells = row("A store bound by rate", setting);
        assert!(
            number(&cells[1]) > 0.0,
            "{setting} called the store: {section}"
        );
    }
    let fixed = row("A store bound by rate", STATIC_DEFAULT);
    assert!(
        number(&fixed[2]) > 0.0,
        "the store's rate never refused the fixed limit: {section}"
    );
    Ok(())
}
