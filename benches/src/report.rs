//! The operator's part of BENCHMARKS.md, and its plot.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use crate::apimetrics::RequestCounts;
use crate::convergence::{ConvergenceResult, FloorIdentity, ListRound, Pair};
use fixtures::Result;

/// The goals this benchmark is held to (see BENCHMARKS.md).
pub const GOAL_RATIO: f64 = 1.10;
pub const GOAL_PEAK_RSS_MIB: f64 = 100.0;
pub const GOAL_KIB_PER_PET: f64 = 3.0;
pub const GOAL_READS_PER_PET: f64 = 1.1;
pub const GOAL_WRITES_PER_PET: f64 = 3.0;
/// An out-of-band change put back within this, at the 99th percentile.
pub const GOAL_DRIFT_P99: std::time::Duration = std::time::Duration::from_secs(1);
/// Listing as v1alpha1 (converted by the webhook) ÷ listing as v1.
pub const GOAL_LIST_RATIO: f64 = 1.5;

/// The head of every section's table of goals.
pub const GOAL_TABLE: &str = "| measurement | goal | measured |  |\n|---|---|---|---|";

/// When a run that measures a section of its own started, and the commit
/// it measured.
#[derive(Clone, Debug, Default)]
pub struct Stamp {
    /// UTC, to the minute.
    pub started_at: String,
    pub commit: String,
}

impl Stamp {
    /// Now, on the commit checked out. Taken as the run starts: the tree
    /// may move on during a long window.
    pub fn now() -> Self {
        Self {
            started_at: chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string(),
            commit: commit(),
        }
    }
}

/// The commit measured, marked when the tree differs from it.
fn commit() -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .current_dir(fixtures::repo_root())
            .output()
            .ok()
            .filter(|out| out.status.success())
            .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    let Some(head) = git(&["rev-parse", "--short", "HEAD"]) else {
        return "unknown".into();
    };
    match git(&["status", "--porcelain", "--untracked-files=no"]) {
        Some(changes) if changes.is_empty() => head,
        _ => format!("{head} with uncommitted changes"),
    }
}

/// The build measured, as the text names it.
pub(crate) fn build() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}

/// How a section's text begins: what was run, on which commit, when, and
/// the build measured.
pub fn measured_with(command: &str, stamp: &Stamp) -> String {
    format!(
        "Measured with `{command}` on commit {}, from {} ({} build).",
        stamp.commit,
        stamp.started_at,
        build()
    )
}

/// `/proc/loadavg`'s three load averages.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_else(|| "unknown".into())
}

/// "5-minute", "3-second": a poll interval as the text says it.
fn interval_words(interval: Duration) -> String {
    let secs = interval.as_secs();
    if secs >= 60 && secs.is_multiple_of(60) {
        format!("{}-minute", secs / 60)
    } else {
        format!("{:.0}-second", interval.as_secs_f64())
    }
}

/// "50.0-minute", "45-second": a measured window as the text says it.
pub fn duration_words(window: Duration) -> String {
    if window >= Duration::from_secs(60) {
        format!("{:.1}-minute", window.as_secs_f64() / 60.0)
    } else {
        format!("{:.0}-second", window.as_secs_f64())
    }
}

pub(crate) fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// Growth of peak RSS per added Pet between two runs, in KiB.
pub fn marginal_kib_per_pet(smaller: &ConvergenceResult, larger: &ConvergenceResult) -> f64 {
    (larger.operator_peak_rss_kib as f64 - smaller.operator_peak_rss_kib as f64)
        / (larger.pets as f64 - smaller.pets as f64).max(1.0)
}

/// A rename or deletion time; they are not run at the largest sizes.
fn churn(took: std::time::Duration) -> String {
    if took.is_zero() {
        "—".into()
    } else {
        format!("{:.2} s", took.as_secs_f64())
    }
}

/// `VERB resource: count` for every request counted, one a line of a
/// table cell.
fn requests(counts: &RequestCounts) -> String {
    requests_joined(counts, "<br>")
}

/// `VERB resource: count` for every request counted, `separator` between.
pub(crate) fn requests_joined(counts: &RequestCounts, separator: &str) -> String {
    counts
        .iter()
        .map(|((resource, verb), n)| format!("{verb} {resource}: {n}"))
        .collect::<Vec<_>>()
        .join(separator)
}

/// A "###" section's heading and the paragraph that introduces it.
pub(crate) fn subsection(out: &mut String, heading: &str, intro: &str) {
    let _ = writeln!(out, "\n### {heading}\n");
    let _ = writeln!(out, "{intro}\n");
}

/// A markdown table's header row and alignment row; `align` has one letter
/// per column, `l` or `r`.
pub(crate) fn table_head(out: &mut String, columns: &[&str], align: &str) {
    debug_assert_eq!(columns.len(), align.len(), "one alignment per column");
    let _ = writeln!(out, "| {} |", columns.join(" | "));
    let marks: Vec<&str> = align
        .chars()
        .map(|a| if a == 'r' { "---:" } else { "---" })
        .collect();
    let _ = writeln!(out, "|{}|", marks.join("|"));
}

/// How every section measured by a run of its own begins: its heading
/// (its `SECTION`, which starts with a newline), the paragraph that says
/// what was measured, and the head of its table of goals.
pub(crate) fn goal_section(section: &str, intro: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}\n", section.trim_start());
    let _ = writeln!(out, "{intro}\n");
    let _ = writeln!(out, "{GOAL_TABLE}");
    out
}

/// [`goal_section`] for a run measured with `command`: its paragraph is
/// [`measured_with`], then `what` was measured.
pub(crate) fn measured_section(section: &str, command: &str, stamp: &Stamp, what: &str) -> String {
    goal_section(
        section,
        &format!("{} {what}", measured_with(command, stamp)),
    )
}

/// A goal's last cell, the miss in bold so it stands out in the table.
pub(crate) fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "**not met**" }
}

/// A goal's last cell in the sections that print the miss plainly.
pub(crate) fn plain_verdict(met: bool) -> &'static str {
    if met { "met" } else { "not met" }
}

fn goals(out: &mut String, results: &[ConvergenceResult]) {
    let _ = writeln!(out, "### Goals\n");
    table_head(out, &["measurement", "goal", "measured", ""], "llll");
    let row = |out: &mut String, what: &str, goal: &str, measured: String, met: bool| {
        let _ = writeln!(out, "| {what} | {goal} | {measured} | {} |", verdict(met));
    };
    // The goal holds in every pair, not only in the median.
    for r in results.iter().filter(|r| r.pets >= 1000) {
        let worst = r.pairs.iter().map(Pair::ratio).fold(r.ratio(), f64::max);
        row(
            out,
            &format!("operator ÷ floor, N = {}, every pair side by side", r.pets),
            &format!("≤ {GOAL_RATIO:.2}"),
            format!(
                "{worst:.2} at worst (median {:.2}); one after the other: {:.2}",
                r.ratio(),
                r.sequential_ratio()
            ),
            worst <= GOAL_RATIO,
        );
    }
    let Some(largest) = results.iter().max_by_key(|r| r.pets) else {
        return;
    };
    row(
        out,
        &format!("operator peak RSS, N = {}", largest.pets),
        &format!("≤ {GOAL_PEAK_RSS_MIB:.0} MiB"),
        format!("{:.1} MiB", mib(largest.operator_peak_rss_kib)),
        mib(largest.operator_peak_rss_kib) <= GOAL_PEAK_RSS_MIB,
    );
    if let Some(base) = results
        .iter()
        .filter(|r| r.pets >= 1000)
        .min_by_key(|r| r.pets)
        && base.pets < largest.pets
    {
        let kib = marginal_kib_per_pet(base, largest);
        row(
            out,
            &format!(
                "marginal memory per Pet, N = {} to {}",
                base.pets, largest.pets
            ),
            &format!("≤ {GOAL_KIB_PER_PET:.0} KiB"),
            format!("{kib:.2} KiB"),
            kib <= GOAL_KIB_PER_PET,
        );
    }
    let worst =
        |per_pet: fn(&ConvergenceResult) -> f64| results.iter().map(per_pet).fold(0.0, f64::max);
    let reads = worst(ConvergenceResult::reads_per_pet);
    row(
        out,
        "store reads per Pet while converging, worst N",
        &format!("≤ {GOAL_READS_PER_PET}"),
        format!("{reads:.3}"),
        reads <= GOAL_READS_PER_PET,
    );
    let writes = worst(ConvergenceResult::writes_per_pet);
    row(
        out,
        "API writes per Pet (Pets and Events), worst N",
        &format!("≤ {GOAL_WRITES_PER_PET:.1}"),
        format!("{writes:.3}"),
        writes <= GOAL_WRITES_PER_PET,
    );
    row(
        out,
        &format!(
            "restart at N = {}: API and store writes in the catch-up",
            largest.pets
        ),
        "0",
        format!(
            "{} and {} (caught up in {:.1} s)",
            largest.restart_api_writes,
            largest.restart_store_writes,
            largest.restart_catch_up.as_secs_f64()
        ),
        largest.restart_api_writes == 0 && largest.restart_store_writes == 0,
    );
    for r in results
        .iter()
        .filter(|r| r.pets >= 1000 || r.pets == largest.pets)
    {
        for (drift, backend) in [
            (&r.drift, "durable"),
            (&r.drift_postgres, "PostgreSQL, 2 replicas"),
        ] {
            row(
                out,
                &format!(
                    "out-of-band change put back (feed, 5-minute poll), p99, N = {}, {backend}",
                    r.pets
                ),
                &format!("≤ {:.1} s", GOAL_DRIFT_P99.as_secs_f64()),
                drift.figures(),
                drift.met(),
            );
        }
        if let Some((interval, drift)) = &r.drift_polling {
            let _ = writeln!(
                out,
                "| beside it: the same changes put back by polling alone (`--follow-store-changes=false`, {} poll), p99, N = {}, durable | (as before the feed) | {:.1} s (p50 {:.1} s, max {:.1} s; {} renames, {} deletes) |  |",
                interval_words(*interval),
                r.pets,
                drift.p99.as_secs_f64(),
                drift.p50.as_secs_f64(),
                drift.max.as_secs_f64(),
                drift.edits,
                drift.deletes
            );
        }
    }
    let list = &largest.list;
    let list_measured = |round: &ListRound| {
        format!(
            "{:.2} ({:.2} s against {:.2} s; {} webhook calls and {:.2} s of the webhook's CPU a list, {:.1} MiB after)",
            round.ratio(),
            round.v1alpha1.as_secs_f64(),
            round.v1.as_secs_f64(),
            round.webhook_calls,
            round.webhook_cpu_seconds,
            mib(list.webhook_rss_kib)
        )
    };
    row(
        out,
        &format!(
            "kubectl get, N = {}: as v1alpha1 (through the webhook) ÷ as v1",
            largest.pets
        ),
        &format!("≤ {GOAL_LIST_RATIO:.2}"),
        list_measured(&list.default),
        list.default.v1 > Duration::ZERO && list.default.ratio() <= GOAL_LIST_RATIO,
    );
    let _ = writeln!(
        out,
        "| beside it: the same lists with `ListFromCacheSnapshot` off, as Kubernetes 1.33 ships it | (as on 1.33) | {} |  |",
        list_measured(&list.without_snapshot)
    );
    row(
        out,
        &format!(
            "steady state at N = {}, two poll intervals: writes",
            largest.pets
        ),
        "0",
        format!(
            "{} API, {} store",
            largest.steady_api_writes, largest.steady_store_writes
        ),
        largest.steady_api_writes == 0 && largest.steady_store_writes == 0,
    );
    let _ = writeln!(
        out,
        "\nOut-of-band changes are renames and deletes of records made with one gRPC call each, in the first pair once converged; each is timed from its call until the store's own change feed shows the record put back. *Beside it* repeats the same changes on an operator restarted with `--follow-store-changes=false`, which finds drift by polling each Pet once per interval, as before the feed."
    );
    let _ = writeln!(out);
}

/// CPU by process while converging, floor and operator side by side.
fn cpu(out: &mut String, results: &[ConvergenceResult]) {
    subsection(
        out,
        "CPU while converging",
        "CPU seconds each process used from the first create until every Pet was Ready (utime + stime from `/proc`), in the first pair. Every process shares the 2 cores, so the time to converge follows the total: CPU the operator and the store use is CPU the API server waits for. *Benchmark* is the process that creates the Pets and watches for Ready; in the floor it also runs the baseline client. In the floor, *operator* is a replica that only serves the conversion webhook (the bench holds the leader Lease): the API server converts every write of a Pet for its v1alpha1 watch cache, in both runs (*webhook calls*, from its `apiserver_crd_conversion_webhook_duration_seconds`). *Events while converging* were written before the last Pet was Ready; the rest trail it.",
    );
    table_head(
        out,
        &[
            "N",
            "run",
            "API server",
            "etcd",
            "benchmark",
            "operator",
            "store",
            "total",
            "CPU ms per Pet",
            "webhook calls",
            "Events while converging",
        ],
        "rlrrrrrrrrr",
    );
    for r in results {
        for (run, split, conversions, events) in [
            ("floor", &r.floor_cpu, r.floor_conversions, String::new()),
            (
                "operator",
                &r.cpu,
                r.conversions,
                r.events_while_converging.to_string(),
            ),
        ] {
            let _ = writeln!(
                out,
                "| {} | {run} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {conversions} | {events} |",
                r.pets,
                split.api_server,
                split.etcd,
                split.bench,
                split.operator,
                split.store,
                split.total(),
                split.total() * 1000.0 / r.pets.max(1) as f64,
            );
        }
    }
}

/// The operator sections of BENCHMARKS.md.
pub fn operator(out: &mut String, results: &[ConvergenceResult], plot: Option<&str>) {
    let _ = writeln!(out, "## Operator convergence\n");
    let _ = writeln!(
        out,
        "N Pets created in one namespace at client concurrency 16 on the local control plane (etcd + kube-apiserver on the same machine), durable store. Times run from the first create until a watch has seen every Pet with `status.id` and `Ready=True` for its generation. The floor is a baseline client that makes only the finalizer patch and the status patch per Pet, with no store, as many at once as the operator reconciles by default ({}), while an operator replica that reconciles nothing serves the conversion webhook (see *CPU while converging*). At each N the floor runs first, then the operator, one after the other on the two cores: the *operator* and *floor* times, *one after the other* (their ratio) and every other figure come from that pair, which goes on to the restart, steady state and churn. The ratio's goal is checked on {} more pairs run **side by side**: the floor and the operator converge at the same time, each on one core, their cores swapped every quarter of a second, so that both meet the same moment of the machine, whose speed can move by more than the goal's 10% between two runs one after the other ([docs/performance.md](docs/performance.md#side-by-side-pairs) shows it, and a floor beside a floor). *Side by side* is the median of their ratios, *each pair* lists them in order, and the goal is met only when every pair meets it. The lists are timed in the first pair's floor, on its converged Pets, with nothing else running: first with the API server's defaults, then with it restarted with `ListFromCacheSnapshot` off, as Kubernetes 1.33 ships it. The floor authenticates as {}, and the operator as its ServiceAccount. The converging operator runs with the default 5-minute poll interval, so no drift poll falls inside the convergence.\n",
        petstore_operator::controller::DEFAULT_CONCURRENCY,
        results.first().map_or(1, |r| r.pairs.len().max(1)),
        results
            .first()
            .map_or(FloorIdentity::default(), |r| r.floor_identity)
            .label()
    );
    let _ = writeln!(
        out,
        "Events are written from a background queue (as client-go does), so they may trail Ready; *events written* is when the last one of the convergence reached the API server. *RSS converged* is the resident memory once the Events are written; *KiB/Pet* is the growth of peak RSS per Pet added since the previous N. The API server's and etcd's peak RSS and etcd's database file are read once every Pet is Ready: as N grows, the control plane meets its walls (the API server's memory, etcd's 2 GiB default quota) before the operator does. The rename storm and deletion (every Pet renamed, then every Pet deleted, each until the operator has caught up) run up to N = 5,000.\n"
    );
    goals(out, results);
    table_head(
        out,
        &[
            "N",
            "operator",
            "floor",
            "one after the other",
            "side by side",
            "each pair side by side",
            "events written",
            "rename storm",
            "delete all",
            "operator peak RSS",
            "RSS converged",
            "KiB/Pet",
            "operator CPU",
            "store peak RSS",
            "API server peak RSS",
            "etcd peak RSS",
            "etcd database",
        ],
        "rrrrrlrrrrrrrrrrr",
    );
    for (i, r) in results.iter().enumerate() {
        let marginal = i
            .checked_sub(1)
            .map(|p| format!("{:.2}", marginal_kib_per_pet(&results[p], r)))
            .unwrap_or_else(|| "".into());
        let _ = writeln!(
            out,
            "| {} | {:.2} s | {:.2} s | {:.2} | **{:.2}** | {} | {:.2} s | {} | {} | {:.1} MiB | {:.1} MiB | {} | {:.1} s | {:.1} MiB | {:.1} MiB | {:.1} MiB | {:.1} MiB |",
            r.pets,
            r.converge.as_secs_f64(),
            r.floor.as_secs_f64(),
            r.sequential_ratio(),
            r.ratio(),
            r.pairs
                .iter()
                .map(|p| format!("{:.2}", p.ratio()))
                .collect::<Vec<_>>()
                .join(", "),
            r.events_written.as_secs_f64(),
            churn(r.rename),
            churn(r.delete),
            mib(r.operator_peak_rss_kib),
            mib(r.operator_rss_kib),
            marginal,
            r.operator_cpu_seconds,
            mib(r.store_peak_rss_kib),
            mib(r.control_plane.apiserver_peak_rss_kib),
            mib(r.control_plane.etcd_peak_rss_kib),
            r.control_plane.etcd_db_mib(),
        );
    }
    if let Some(plot) = plot {
        let _ = writeln!(
            out,
            "\n![Time to converge, peak RSS and store reads per Pet against N, with the floor]({plot})\n"
        );
    }
    subsection(
        out,
        "What it cost (during convergence)",
        "API requests are the API server's own `apiserver_request_total`, minus the benchmark's N creates; *writes per Pet* counts the writes to Pets and Events (Lease renewals follow time, not Pets). Store RPCs are counted by the operator; every read is a `GetPets`.",
    );
    table_head(
        out,
        &[
            "N",
            "operator API requests",
            "API writes per Pet",
            "store reads per Pet",
            "floor API requests",
            "store RPCs",
        ],
        "rlrrll",
    );
    for r in results {
        let calls = r
            .store_calls
            .iter()
            .map(|(m, n)| format!("{m}: {n}"))
            .collect::<Vec<_>>()
            .join("<br>");
        let _ = writeln!(
            out,
            "| {} | {} | {:.3} | {:.3} | {} | {} |",
            r.pets,
            requests(&r.api_requests),
            r.writes_per_pet(),
            r.reads_per_pet(),
            requests(&r.floor_api_requests),
            calls
        );
    }
    cpu(out, results);
    subsection(
        out,
        "Restart",
        "Once converged, the operator is killed with `kill -9` and a new process starts under the same name (as when Kubernetes restarts the container). *Caught up* is from its start until it has reconciled every Pet once; it includes waiting for the dead process's Lease. Writes are to Pets and Events; store writes are creates, updates and deletes.",
    );
    table_head(
        out,
        &[
            "N",
            "caught up",
            "of which Lease wait",
            "API writes",
            "store writes",
            "store reads",
            "new process peak RSS",
        ],
        "rrrrrrr",
    );
    for r in results {
        let _ = writeln!(
            out,
            "| {} | {:.2} s | {:.2} s | {} | {} | {} | {:.1} MiB |",
            r.pets,
            r.restart_catch_up.as_secs_f64(),
            r.restart_lease_wait.as_secs_f64(),
            r.restart_api_writes,
            r.restart_store_writes,
            r.restart_store_reads,
            mib(r.restart_peak_rss_kib),
        );
    }
    subsection(
        out,
        "Steady state and the drift poll",
        "The restarted operator runs with a short poll interval (and the same `--audit-interval`, the poll's interval while it follows the store's change feed) and `--poll-max-rate`, so that two intervals pass quickly and the bound shows: with more Pets than the interval allows at that rate, the interval in effect stretches to N ÷ rate. Each Pet is polled at a phase of the interval fixed by its UID, so polls are spread evenly whenever the Pets were created. The window starts half an interval after the catch-up, when the first polls begin.",
    );
    table_head(
        out,
        &[
            "N",
            "poll interval in effect",
            "window",
            "API writes",
            "store writes",
            "store reads",
            "store reads/s",
        ],
        "rrrrrrr",
    );
    for r in results {
        let _ = writeln!(
            out,
            "| {} | {:.1} s | {:.1} s | {} | {} | {} | {:.0} |",
            r.pets,
            r.poll_interval.as_secs_f64(),
            r.steady_window.as_secs_f64(),
            r.steady_api_writes,
            r.steady_store_writes,
            r.steady_store_reads,
            r.poll_read_rate(),
        );
    }
    if let Some(largest) = results.iter().max_by_key(|r| r.pets) {
        let _ = writeln!(
            out,
            "\nAt the default interval (5 minutes, `--poll-max-rate 100`) the drift poll of N = {} Pets reads {:.0} records per second from the store, spread evenly; the bound would stretch the interval only beyond 30,000 Pets.",
            largest.pets,
            largest.pets as f64 / 300.0
        );
    }
}

type Drawn = std::result::Result<(), Box<dyn std::error::Error>>;

/// Points, colour and legend of one line.
type Series<'a> = (Vec<(f64, f64)>, plotters::style::RGBColor, &'a str);

/// Time, peak RSS and store reads per Pet against N, with the floor, as
/// three panels of one SVG.
pub fn plot(results: &[ConvergenceResult], path: &Path) -> Result<()> {
    draw(results, path).map_err(|e| fixtures::Error::Command {
        command: "plot".into(),
        status: "error".into(),
        stderr: e.to_string(),
    })
}

fn draw(results: &[ConvergenceResult], path: &Path) -> Drawn {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (1080, 380)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((1, 3));
    let max_n = results.iter().map(|r| r.pets).max().unwrap_or(1) as f64 * 1.05;
    let points = |f: &dyn Fn(&ConvergenceResult) -> f64| {
        results
            .iter()
            .map(|r| (r.pets as f64, f(r)))
            .collect::<Vec<_>>()
    };
    let line = |chart: &mut ChartContext<'_, SVGBackend<'_>, Cartesian2d<_, _>>,
                data: Vec<(f64, f64)>,
                color: RGBColor,
                label: &str|
     -> Drawn {
        chart
            .draw_series(LineSeries::new(data.clone(), color.stroke_width(2)))?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart.draw_series(data.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
        Ok(())
    };
    let panel = |area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
                 title: &str,
                 y_desc: &str,
                 max_y: f64,
                 series: Vec<Series<'_>>|
     -> Drawn {
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(52)
            .build_cartesian_2d(0.0..max_n, 0.0..(max_y * 1.15).max(0.1))?;
        chart
            .configure_mesh()
            .x_desc("Pets (N)")
            .y_desc(y_desc)
            .x_labels(5)
            .draw()?;
        for (data, color, label) in series {
            line(&mut chart, data, color, label)?;
        }
        chart
            .configure_series_labels()
            .border_style(BLACK)
            .background_style(WHITE.mix(0.9))
            .position(SeriesLabelPosition::UpperLeft)
            .draw()?;
        Ok(())
    };
    let max_t = results
        .iter()
        .map(|r| r.converge.max(r.floor).as_secs_f64())
        .fold(0.0, f64::max);
    panel(
        &panels[0],
        "Time to converge",
        "seconds",
        max_t,
        vec![
            (points(&|r| r.converge.as_secs_f64()), RED, "operator"),
            (
                points(&|r| r.floor.as_secs_f64()),
                BLUE,
                "floor (finalizer + status patch only)",
            ),
        ],
    )?;
    let max_rss = results
        .iter()
        .map(|r| mib(r.operator_peak_rss_kib))
        .fold(GOAL_PEAK_RSS_MIB, f64::max);
    panel(
        &panels[1],
        "Operator peak RSS",
        "MiB",
        max_rss,
        vec![
            (
                points(&|r| mib(r.operator_peak_rss_kib)),
                RED,
                "operator peak RSS",
            ),
            (
                vec![(0.0, GOAL_PEAK_RSS_MIB), (max_n, GOAL_PEAK_RSS_MIB)],
                BLACK,
                "goal at N = 20,000",
            ),
        ],
    )?;
    let max_reads = results
        .iter()
        .map(ConvergenceResult::reads_per_pet)
        .fold(GOAL_READS_PER_PET, f64::max);
    panel(
        &panels[2],
        "Store reads per Pet while converging",
        "reads per Pet",
        max_reads,
        vec![
            (points(&ConvergenceResult::reads_per_pet), RED, "operator"),
            (
                vec![(0.0, GOAL_READS_PER_PET), (max_n, GOAL_READS_PER_PET)],
                BLACK,
                "goal",
            ),
            (vec![(0.0, 0.0), (max_n, 0.0)], BLUE, "floor (no store)"),
        ],
    )?;
    root.present()?;
    Ok(())
}

/// `report` with the section under `heading` of `existing` in place of its
/// own (or added at the end): a run that does not measure a section keeps
/// the last one measured.
pub fn keep_section(report: &str, existing: &str, heading: &str) -> String {
    let Some(old) = section(existing, heading) else {
        return report.to_owned();
    };
    replace_section(report, heading, old)
}

/// `report` with `text` as its section under `heading` (which `text`
/// starts with), replacing one it has.
pub fn replace_section(report: &str, heading: &str, text: &str) -> String {
    let text = text.trim();
    match section_span(report, heading) {
        Some((at, end)) => {
            format!("{}\n\n{text}\n{}", report[..at].trim_end(), &report[end..])
        }
        None => format!("{}\n\n{text}\n", report.trim_end()),
    }
}

/// The section under `heading` of a report, if it has one.
fn section<'a>(report: &'a str, heading: &str) -> Option<&'a str> {
    let (at, end) = section_span(report, heading)?;
    Some(&report[at..end])
}

/// Where the section under `heading` starts in `report` and where it ends:
/// at the next "## " heading, or at the end of the report.
fn section_span(report: &str, heading: &str) -> Option<(usize, usize)> {
    let at = report.find(heading)?;
    let rest = &report[at + heading.len()..];
    let end = rest
        .find("\n## ")
        .map_or(report.len(), |i| at + heading.len() + i);
    Some((at, end))
}

#[cfg(test)]
mod section_tests {
    use super::*;

    /// The report's words for a poll interval and a window: whole minutes
    /// as minutes, a window of minutes to a tenth, anything shorter in
    /// seconds; a churn not run as a dash.
    #[test]
    fn durations_are_written_as_the_text_says_them() {
        let secs = Duration::from_secs;
        assert_eq!(interval_words(secs(300)), "5-minute");
        assert_eq!(interval_words(secs(3)), "3-second");
        assert_eq!(interval_words(secs(90)), "90-second", "not 1.5-minute");
        assert_eq!(duration_words(secs(3600)), "60.0-minute");
        assert_eq!(duration_words(secs(3000)), "50.0-minute");
        assert_eq!(duration_words(secs(45)), "45-second");
        assert_eq!(churn(Duration::ZERO), "—");
        assert_eq!(churn(Duration::from_millis(1234)), "1.23 s");
    }

    const IDLE: &str = crate::idle::SECTION;

    #[test]
    fn the_section_is_kept_or_replaced_in_place() {
        let report = "# B\n\nops\n\n## Pet store\n\nstore\n";
        let idle = "## Idle store calls\n\nfirst\n";
        let with = replace_section(report, IDLE, idle);
        assert_eq!(
            with,
            "# B\n\nops\n\n## Pet store\n\nstore\n\n## Idle store calls\n\nfirst\n"
        );
        let again = replace_section(&with, IDLE, "## Idle store calls\n\nsecond");
        assert_eq!(again, with.replace("first", "second"));
        // A run without it keeps the existing one.
        assert_eq!(keep_section(report, &again, IDLE), again);
        assert_eq!(keep_section(report, report, IDLE), report);
        // In the middle, the sections after it stay.
        let middle = "# B\n\n## Idle store calls\n\nold\n\n## Pet store\n\nstore\n";
        assert_eq!(
            replace_section(middle, IDLE, "## Idle store calls\n\nnew"),
            "# B\n\n## Idle store calls\n\nnew\n\n## Pet store\n\nstore\n"
        );
    }
}
