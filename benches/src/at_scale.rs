//! The operator alone at one large N (`--at-scale N`): its convergence, then
//! out-of-band drift, a `kill -9` and restart, and steady state, as a full
//! run measures its largest N, with the control plane's memory beside the
//! figures. No floor runs beside it: the ratio's pairs at that N are
//! `--pairs-only` or `--side-by-side`, each as long again.

use std::fmt::Write as _;
use std::time::Duration;

use fixtures::Result;

use crate::BenchConfig;
use crate::convergence::{self, ConvergenceResult};
use crate::report::{
    GOAL_DRIFT_P99, GOAL_WRITES_PER_PET, Stamp, measured_section, mib, plain_verdict,
};

/// The report's section; every other run keeps it.
pub const SECTION: &str = "\n## The operator at scale";
/// The operator's peak RSS at 100,000 Pets.
pub const GOAL_PEAK_RSS_MIB: f64 = 300.0;
/// A restart at 100,000 Pets is done (every Pet reconciled once) within this.
pub const GOAL_RESTART: Duration = Duration::from_secs(30);
/// Drift's p99 holds while at least this many changes arrive a second.
pub const GOAL_DRIFT_ARRIVALS: f64 = 300.0;
/// The reconciles that put drift back, p99.
pub const GOAL_RECONCILE_P99: f64 = 5.0;
/// Their waits for a turn in the queue, p99.
pub const GOAL_QUEUE_WAIT_P99: f64 = 1.0;

#[derive(Debug)]
pub struct AtScaleResult {
    pub stamp: Stamp,
    pub run: ConvergenceResult,
}

/// One whole cycle of the operator at `pets`, with `config`'s settings.
pub fn measure(config: &BenchConfig, pets: usize) -> Result<AtScaleResult> {
    let stamp = Stamp::now();
    let rt = crate::runtime()?;
    let mut convergence = crate::convergence_config(config, pets);
    // Drift found by polling alone is the full run's comparison at its
    // sizes, not a figure of this section.
    convergence.polling_drift = None;
    let run = convergence::measure_operator(&rt, &convergence)?;
    Ok(AtScaleResult { stamp, run })
}

impl AtScaleResult {
    fn rss_met(&self) -> bool {
        mib(self.run.operator_peak_rss_kib) <= GOAL_PEAK_RSS_MIB
    }

    fn writes_met(&self) -> bool {
        self.run.writes_per_pet() <= GOAL_WRITES_PER_PET
    }

    fn restart_met(&self) -> bool {
        let r = &self.run;
        r.restart_api_writes == 0
            && r.restart_store_writes == 0
            && r.restart_catch_up <= GOAL_RESTART
    }

    fn drift_met(&self) -> bool {
        let drift = &self.run.drift;
        drift.met() && drift.arrival_rate() >= GOAL_DRIFT_ARRIVALS
    }

    fn reconcile_met(&self) -> bool {
        self.run
            .drift_reconcile_p99
            .is_some_and(|p99| p99 <= GOAL_RECONCILE_P99)
    }

    fn queue_wait_met(&self) -> bool {
        self.run
            .drift_queue_wait_p99
            .is_some_and(|p99| p99 <= GOAL_QUEUE_WAIT_P99)
    }

    fn steady_met(&self) -> bool {
        self.run.steady_api_writes == 0 && self.run.steady_store_writes == 0
    }

    pub fn goal_met(&self) -> bool {
        self.rss_met()
            && self.writes_met()
            && self.restart_met()
            && self.drift_met()
            && self.reconcile_met()
            && self.queue_wait_met()
            && self.steady_met()
    }
}

/// A histogram's quantile as the bound of its bucket: `≤ 0.512 s`.
fn bucket_bound(quantile: Option<f64>) -> String {
    quantile.map_or_else(|| "none".to_owned(), |bound| format!("≤ {bound} s"))
}

pub fn markdown(result: &AtScaleResult, command: &str) -> String {
    let r = &result.run;
    let n = r.pets;
    let mut out = measured_section(
        SECTION,
        command,
        &result.stamp,
        &format!(
            "The operator alone, with its shipped settings but for the drift-storm brake (`--drift-storm-min=0`: the changes below, sent within seconds, make a storm by its measure below N = 22,000), on the local control plane and a durable store: {n} Pets created at client concurrency {}, timed until a watch has seen every one Ready; then out-of-band renames and deletes in the store, one call each, sent as fast as one client sends them, each timed until the operator has put it back (the store's change feed shows the fix); then `kill -9` and a new process, timed until it has reconciled every Pet once, and two of its poll intervals with nothing changing. The floor does not run beside it (its pairs at this N are `--pairs-only`). The API server's and etcd's memory are their peak RSS once every Pet was Ready, and etcd's database is its file then: as N grows, the control plane meets its walls (the API server's memory, etcd's 2 GiB default quota) before the operator does. The reconciles' and the queue waits' p99 are read from the operator's histograms (`reconcile_duration_seconds`, `queue_wait_seconds`) between a scrape before the drift and one after it was all put back.",
            crate::BenchConfig::full().concurrency,
        ),
    );
    let row = |out: &mut String, what: &str, goal: &str, measured: String, met: Option<bool>| {
        let _ = writeln!(
            out,
            "| {what} | {goal} | {measured} | {} |",
            met.map_or("", plain_verdict)
        );
    };
    row(
        &mut out,
        &format!("{n} Pets Ready, from the first create"),
        "",
        format!("{:.1} s", r.converge.as_secs_f64()),
        None,
    );
    let cpu = r.cpu;
    let per_pet = |seconds: f64| crate::per_pet(seconds, n);
    row(
        &mut out,
        "CPU a Pet while converging: all, API server, etcd, operator, store",
        "",
        format!(
            "{:.2} ms: {:.2}, {:.2}, {:.2}, {:.2}",
            per_pet(cpu.total()),
            per_pet(cpu.api_server),
            per_pet(cpu.etcd),
            per_pet(cpu.operator),
            per_pet(cpu.store)
        ),
        None,
    );
    row(
        &mut out,
        "operator peak RSS",
        &format!("≤ {GOAL_PEAK_RSS_MIB:.0} MiB"),
        format!("{:.1} MiB", mib(r.operator_peak_rss_kib)),
        Some(result.rss_met()),
    );
    row(
        &mut out,
        "API writes per Pet (Pets and Events)",
        &format!("≤ {GOAL_WRITES_PER_PET:.1}"),
        format!("{:.3}", r.writes_per_pet()),
        Some(result.writes_met()),
    );
    let drift = &r.drift;
    row(
        &mut out,
        "out-of-band change put back, p99",
        &format!(
            "≤ {:.1} s, while ≥ {GOAL_DRIFT_ARRIVALS:.0} changes arrive a second",
            GOAL_DRIFT_P99.as_secs_f64()
        ),
        format!(
            "{}, arriving at {:.0} a second",
            drift.figures(),
            drift.arrival_rate()
        ),
        Some(result.drift_met()),
    );
    row(
        &mut out,
        "the reconciles meanwhile, p99 (the bound of its histogram's bucket)",
        &format!("≤ {GOAL_RECONCILE_P99:.0} s"),
        bucket_bound(r.drift_reconcile_p99),
        Some(result.reconcile_met()),
    );
    row(
        &mut out,
        "their waits for a turn in the queue, p99 (the bound of its histogram's bucket)",
        &format!("≤ {GOAL_QUEUE_WAIT_P99:.0} s"),
        bucket_bound(r.drift_queue_wait_p99),
        Some(result.queue_wait_met()),
    );
    row(
        &mut out,
        "restart: API and store writes, and until every Pet was reconciled",
        &format!("0, 0, ≤ {} s", GOAL_RESTART.as_secs()),
        format!(
            "{}, {}, {:.1} s (of it {:.1} s waiting for the dead replica's Lease); peak RSS {:.1} MiB",
            r.restart_api_writes,
            r.restart_store_writes,
            r.restart_catch_up.as_secs_f64(),
            r.restart_lease_wait.as_secs_f64(),
            mib(r.restart_peak_rss_kib)
        ),
        Some(result.restart_met()),
    );
    let cpu = &r.restart_cpu;
    row(
        &mut out,
        "the restart: until its first reconcile ended; CPU until it caught up: API server, etcd, operator, store",
        "",
        format!(
            "{}; {:.1}, {:.1}, {:.1}, {:.1} s",
            r.restart_first_reconcile.map_or_else(
                || "none".to_owned(),
                |at| format!("{:.1} s", at.as_secs_f64())
            ),
            cpu.api_server,
            cpu.etcd,
            cpu.operator,
            cpu.store
        ),
        None,
    );
    let requests: Vec<String> = r
        .restart_api_requests
        .iter()
        .map(|((resource, verb), n)| format!("{resource} {verb} {n}"))
        .collect();
    row(
        &mut out,
        "the restart's requests to the API server, by resource and verb",
        "",
        requests.join(", "),
        None,
    );
    row(
        &mut out,
        "steady state: API and store writes",
        "0, 0",
        format!(
            "{}, {} (over {:.0} s, {} store reads)",
            r.steady_api_writes,
            r.steady_store_writes,
            r.steady_window.as_secs_f64(),
            r.steady_store_reads
        ),
        Some(result.steady_met()),
    );
    let (cpu, seconds) = (&r.steady_cpu, r.steady_window.as_secs_f64().max(1e-9));
    row(
        &mut out,
        "steady state: CPU a second: API server, etcd, operator, store",
        "",
        format!(
            "{:.3}, {:.3}, {:.3}, {:.3}",
            cpu.api_server / seconds,
            cpu.etcd / seconds,
            cpu.operator / seconds,
            cpu.store / seconds
        ),
        None,
    );
    let memory = r.control_plane;
    row(
        &mut out,
        "beside it: the API server's and etcd's peak RSS, etcd's database",
        "",
        format!(
            "{:.1} MiB, {:.1} MiB, {:.1} MiB",
            mib(memory.apiserver_peak_rss_kib),
            mib(memory.etcd_peak_rss_kib),
            memory.etcd_db_mib()
        ),
        None,
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convergence::ControlPlaneMemory;
    use crate::drift::DriftResult;

    fn met() -> AtScaleResult {
        AtScaleResult {
            stamp: Stamp {
                started_at: "2026-11-29 13:00 UTC".into(),
                commit: "abc1234".into(),
            },
            run: ConvergenceResult {
                pets: 100_000,
                converge: Duration::from_secs(900),
                api_writes: 300_000,
                operator_peak_rss_kib: 230 * 1024,
                restart_catch_up: Duration::from_secs(20),
                drift: DriftResult {
                    edits: 1000,
                    deletes: 100,
                    p50: Duration::from_millis(10),
                    p99: Duration::from_millis(80),
                    max: Duration::from_millis(90),
                    sending: Duration::from_secs(2),
                },
                drift_reconcile_p99: Some(0.016),
                drift_queue_wait_p99: Some(0.002),
                control_plane: ControlPlaneMemory {
                    apiserver_peak_rss_kib: 4 << 20,
                    etcd_peak_rss_kib: 400 << 10,
                    etcd_db_bytes: 600 << 20,
                },
                ..Default::default()
            },
        }
    }

    #[test]
    fn every_goal_met_is_said_so_and_the_memory_stands_beside_it() {
        let result = met();
        assert!(result.goal_met());
        let text = markdown(&result, "hack/bench.sh --at-scale 100000");
        assert!(text.starts_with(SECTION.trim_start()), "{text}");
        assert!(!text.contains("not met"), "{text}");
        assert!(text.contains("arriving at 550 a second"), "{text}");
        assert!(text.contains("4096.0 MiB, 400.0 MiB, 600.0 MiB"), "{text}");
    }

    #[test]
    fn each_goal_missed_fails_the_run() {
        type Miss = fn(&mut ConvergenceResult);
        let misses: [(&str, Miss); 9] = [
            ("RSS over the goal", |r| {
                r.operator_peak_rss_kib = 301 * 1024
            }),
            ("more than 3 writes a Pet", |r| r.api_writes = 300_001),
            ("a write in the restart", |r| r.restart_store_writes = 1),
            ("a slow restart", |r| {
                r.restart_catch_up = Duration::from_secs(31)
            }),
            ("changes arriving too slowly", |r| {
                r.drift.sending = Duration::from_secs(4)
            }),
            ("reconciles not timed", |r| r.drift_reconcile_p99 = None),
            ("a long wait in the queue", |r| {
                r.drift_queue_wait_p99 = Some(2.048)
            }),
            ("queue waits not timed", |r| r.drift_queue_wait_p99 = None),
            ("a write in steady state", |r| r.steady_api_writes = 1),
        ];
        for (case, miss) in misses {
            let mut result = met();
            miss(&mut result.run);
            assert!(!result.goal_met(), "{case}");
            let text = markdown(&result, "hack/bench.sh --at-scale 100000");
            assert!(text.contains("| not met |"), "{case}: {text}");
        }
    }
}
