//! Runs the benchmarks at a tiny size so the test command proves the code
//! works. It asserts results that are not timings: everything converged,
//! nothing was written in steady state, and no acknowledged pet was lost.

use testenv::bench::{self, BenchConfig};

#[test]
fn benchmarks_run_end_to_end() -> testenv::Result<()> {
    let config = BenchConfig::smoke();
    let results = bench::run_all(&config, |step| eprintln!("[bench smoke] {step}"))?;

    assert_eq!(results.convergence.len(), config.sizes.len());
    for r in &results.convergence {
        assert!(
            r.api_requests
                .keys()
                .any(|(res, verb)| res == "pets/status" && verb == "PATCH"),
            "{r:?}"
        );
        assert!(
            r.store_calls.get("AddPets").copied().unwrap_or(0) >= r.pets as u64,
            "{r:?}"
        );
        assert_eq!(
            r.steady_api_writes, 0,
            "no API writes in steady state: {r:?}"
        );
        assert_eq!(
            r.steady_store_writes, 0,
            "no store writes in steady state: {r:?}"
        );
        assert!(r.operator_peak_rss_kib > 0 && r.store_peak_rss_kib > 0);
    }
    // 2 backends x 4 operations x each concurrency.
    assert_eq!(
        results.store.len(),
        2 * 4 * config.store_concurrencies.len()
    );
    assert!(results.store.iter().all(|r| r.calls > 0));
    let durability = results
        .durability
        .as_ref()
        .expect("durable backend checked");
    assert!(durability.acknowledged > 0);
    assert_eq!(durability.found_after_kill, durability.acknowledged);

    let dir = tempfile::tempdir().map_err(|e| testenv::Error::Io {
        what: "tempdir".into(),
        source: e,
    })?;
    let svg = dir.path().join("convergence.svg");
    bench::plot(&results, &svg)?;
    assert!(
        std::fs::read_to_string(&svg)
            .unwrap_or_default()
            .contains("<svg")
    );
    let report = bench::markdown(&results, &bench::environment(), Some("convergence.svg"));
    for heading in [
        "## Operator convergence",
        "### Steady state",
        "## Pet store",
        "Durability:",
    ] {
        assert!(report.contains(heading), "{heading}");
    }
    Ok(())
}
