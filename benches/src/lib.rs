//! Benchmarks: operator convergence against the floor this control plane
//! allows, and pet store throughput and latency. `petstore-bench` runs them
//! and writes BENCHMARKS.md; a smoke test runs them tiny.

pub mod apimetrics;
pub mod at_scale;
pub mod convergence;
pub mod drift;
pub mod fairness;
pub mod feed_cost;
pub mod flood;
pub mod idle;
pub mod import;
pub mod pacing;
pub mod plans;
pub mod procstat;
pub mod report;
pub mod rotation;
pub mod side_by_side;
pub mod spread;
pub mod store_load;
pub mod token_cost;

use std::fmt::Write as _;
use std::process::Command;
use std::time::Duration;

use apimetrics::RequestCounts;
use convergence::{ConvergenceConfig, ConvergenceResult, FloorIdentity, Pair};
use report::{subsection, table_head};
use store_load::{DurabilityCheck, GhzResult, LoadResult, ScaleResult, StoreSetup};

use fixtures::{Result, Tools, run};

#[derive(Clone, Debug)]
pub struct BenchConfig {
    pub sizes: Vec<usize>,
    pub concurrency: usize,
    /// Poll interval of the operator restarted after convergence.
    pub poll_interval: Duration,
    pub poll_max_rate: u32,
    pub churn_max_pets: usize,
    pub floor_identity: FloorIdentity,
    /// Floor-then-operator pairs at each N; operator ÷ floor is the median
    /// of their ratios.
    pub pairs: usize,
    pub store_concurrencies: Vec<usize>,
    pub store_cell: Duration,
    pub search_records: u64,
    /// Backends the store part measures.
    pub store_setups: Vec<StoreSetup>,
    /// Pets in the large-store run (search by name, full stream, open time);
    /// none skips it.
    pub scale_records: Option<u64>,
    /// The change feed's cost: creates in the burst, and the numbers of
    /// watchers to measure it with.
    pub feed_creates: u64,
    pub feed_watchers: Vec<usize>,
    /// The N at which drift is measured a second time by polling alone,
    /// and that poll's interval.
    pub polling_drift_sizes: Vec<usize>,
    pub polling_drift_interval: Duration,
    /// The program that runs one side of a side-by-side pair (`petstore-bench
    /// --side`); this program when unset.
    pub side_runner: Option<std::path::PathBuf>,
}

impl BenchConfig {
    pub fn full() -> Self {
        Self {
            sizes: vec![100, 1000, 5000, 20_000],
            concurrency: 16,
            poll_interval: Duration::from_secs(10),
            poll_max_rate: 1000,
            churn_max_pets: 5000,
            floor_identity: FloorIdentity::Operator,
            pairs: 3,
            store_concurrencies: vec![1, 16, 64],
            store_cell: Duration::from_secs(3),
            search_records: 10_000,
            store_setups: vec![
                StoreSetup::Durable,
                StoreSetup::Memory,
                StoreSetup::Postgres { replicas: 1 },
                StoreSetup::Postgres { replicas: 2 },
            ],
            scale_records: Some(1_000_000),
            feed_creates: 10_000,
            feed_watchers: vec![0, 1, 10, 100],
            // The operator's default --poll-interval: drift as it was found
            // before the feed.
            polling_drift_sizes: vec![1000, 20_000],
            polling_drift_interval: Duration::from_secs(300),
            side_runner: None,
        }
    }

    /// Small enough for the test command; checks that the code works.
    pub fn smoke() -> Self {
        Self {
            sizes: vec![10],
            concurrency: 4,
            poll_interval: Duration::from_secs(2),
            poll_max_rate: 100,
            churn_max_pets: 10,
            floor_identity: FloorIdentity::Operator,
            pairs: 2,
            store_concurrencies: vec![2],
            store_cell: Duration::from_millis(300),
            search_records: 200,
            store_setups: vec![
                StoreSetup::Durable,
                StoreSetup::Memory,
                StoreSetup::Postgres { replicas: 2 },
            ],
            scale_records: Some(2_000),
            feed_creates: 200,
            feed_watchers: vec![0, 3],
            polling_drift_sizes: vec![10],
            polling_drift_interval: Duration::from_secs(3),
            side_runner: None,
        }
    }
}

/// /proc/loadavg at the start and at the end of a group of runs.
#[derive(Debug, Default)]
pub struct LoadAverages {
    pub start: String,
    pub end: String,
}

impl LoadAverages {
    /// Started now; `end` is set when the group finishes.
    fn now() -> Self {
        Self {
            start: report::load_average(),
            end: String::new(),
        }
    }
}

#[derive(Debug, Default)]
pub struct BenchResults {
    pub convergence: Vec<ConvergenceResult>,
    /// Around the operator runs: before the first, after the last.
    pub load: LoadAverages,
    /// Around the store runs.
    pub store_load: LoadAverages,
    pub store: Vec<LoadResult>,
    pub durability: Option<DurabilityCheck>,
    pub ghz: Vec<GhzResult>,
    pub scale: Vec<ScaleResult>,
    pub feed_cost: Vec<feed_cost::FeedCost>,
}

/// Only the floor-then-operator pairs at each N, for iterating on the
/// ratio: each pair's times and CPU are told to `progress`, and nothing
/// else is measured or written.
pub fn run_pairs(config: &BenchConfig, progress: impl Fn(&str)) -> Result<Vec<Vec<Pair>>> {
    let rt = runtime()?;
    let mut all = Vec::new();
    for &pets in &config.sizes {
        let c = convergence_config(config, pets);
        let mut pairs = Vec::new();
        for pair in 1..=config.pairs {
            let floor = convergence::measure_floor(&rt, &c, false)?;
            let operator = convergence::measure_operator_convergence(&rt, &c)?;
            let (f, o) = (floor.cpu, operator.cpu);
            // Of the two cores over the run, the share no measured process used.
            let idle = |cpu: f64, time: Duration| 1.0 - cpu / (2.0 * time.as_secs_f64());
            progress(&format!(
                "N = {pets}, pair {pair}: operator ÷ floor {:.3} ({:.2} s against {:.2} s); CPU ms per Pet: total {:.2} against {:.2}, API server {:.2} against {:.2}, etcd {:.2} against {:.2}, operator {:.3} and store {:.3} against the floor's client {:.3} and webhook {:.3}; idle {:.0}% against {:.0}%; webhook calls {} against {}; operator peak RSS {:.1} MiB",
                operator.converge.as_secs_f64() / floor.time.as_secs_f64(),
                operator.converge.as_secs_f64(),
                floor.time.as_secs_f64(),
                per_pet(o.total(), pets),
                per_pet(f.total(), pets),
                per_pet(o.api_server, pets),
                per_pet(f.api_server, pets),
                per_pet(o.etcd, pets),
                per_pet(f.etcd, pets),
                per_pet(o.operator, pets),
                per_pet(o.store, pets),
                per_pet(f.bench - o.bench, pets),
                per_pet(f.operator, pets),
                100.0 * idle(o.total(), operator.converge),
                100.0 * idle(f.total(), floor.time),
                operator.conversions,
                floor.conversions,
                operator.operator_peak_rss_kib as f64 / 1024.0,
            ));
            progress(&format!(
                "N = {pets}, pair {pair}: API requests to Pets, Events and Leases until every Pet was Ready, operator against floor: {}",
                requests_side_by_side(&operator.api_requests, &floor.requests)
            ));
            pairs.push(Pair {
                floor: floor.time,
                operator: operator.converge,
            });
        }
        all.push(pairs);
    }
    Ok(all)
}

/// The operator's runs alone, `config.pairs` at each N: the convergence,
/// its CPU a Pet by process, peak memory (the control plane's too) and
/// requests.
pub fn run_operator_alone(
    config: &BenchConfig,
    progress: impl Fn(&str),
) -> Result<Vec<ConvergenceResult>> {
    let rt = runtime()?;
    let mut runs = Vec::new();
    for &pets in &config.sizes {
        let c = convergence_config(config, pets);
        for run in 1..=config.pairs {
            let operator = convergence::measure_operator_convergence(&rt, &c)?;
            let o = operator.cpu;
            let memory = operator.control_plane;
            progress(&format!(
                "N = {pets}, run {run}, the operator alone: {:.2} s; CPU ms per Pet: total {:.2}, API server {:.2}, etcd {:.2}, operator {:.3}, store {:.3}; peak RSS: operator {:.1} MiB, API server {:.1} MiB, etcd {:.1} MiB; etcd database {:.1} MiB; API requests until every Pet was Ready: {}",
                operator.converge.as_secs_f64(),
                per_pet(o.total(), pets),
                per_pet(o.api_server, pets),
                per_pet(o.etcd, pets),
                per_pet(o.operator, pets),
                per_pet(o.store, pets),
                report::mib(operator.operator_peak_rss_kib),
                report::mib(memory.apiserver_peak_rss_kib),
                report::mib(memory.etcd_peak_rss_kib),
                memory.etcd_db_mib(),
                report::requests_joined(&operator.api_requests, ", "),
            ));
            runs.push(operator);
        }
    }
    Ok(runs)
}

/// `resource VERB operator/floor` for every request either side made, so
/// that a pair whose ratio moves shows which requests moved with it.
fn requests_side_by_side(operator: &RequestCounts, floor: &RequestCounts) -> String {
    let keys: std::collections::BTreeSet<_> = operator.keys().chain(floor.keys()).collect();
    let count = |counts: &RequestCounts, key| counts.get(key).copied().unwrap_or(0);
    keys.into_iter()
        .map(|key| {
            format!(
                "{} {} {}/{}",
                key.0,
                key.1,
                count(operator, key),
                count(floor, key)
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Milliseconds per Pet of `seconds` spent on `pets`.
pub(crate) fn per_pet(seconds: f64, pets: usize) -> f64 {
    seconds * 1000.0 / pets as f64
}

pub(crate) fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(fixtures::io("starting a tokio runtime"))
}

pub(crate) fn convergence_config(config: &BenchConfig, pets: usize) -> ConvergenceConfig {
    ConvergenceConfig {
        pets,
        concurrency: config.concurrency,
        poll_interval: config.poll_interval,
        poll_max_rate: config.poll_max_rate,
        churn_max_pets: config.churn_max_pets,
        floor_identity: config.floor_identity,
        polling_drift: config
            .polling_drift_sizes
            .contains(&pets)
            .then_some(config.polling_drift_interval),
        operator_args: Vec::new(),
    }
}

pub fn run_all(config: &BenchConfig, progress: impl Fn(&str)) -> Result<BenchResults> {
    let rt = runtime()?;
    let mut results = BenchResults {
        load: LoadAverages::now(),
        ..BenchResults::default()
    };
    for &pets in &config.sizes {
        let c = convergence_config(config, pets);
        progress(&format!("floor, N = {pets}"));
        let floor = convergence::measure_floor(&rt, &c, true)?;
        progress(&format!("operator, N = {pets}"));
        let mut result = convergence::measure_operator(&rt, &c)?;
        result.floor_api_requests = floor.requests;
        result.floor_cpu = floor.cpu;
        result.floor_conversions = floor.conversions;
        result.list = floor.list.unwrap_or_default();
        result.floor_identity = config.floor_identity;
        result.floor = floor.time;
        progress(&format!(
            "N = {pets}: operator {:.2}s, floor {:.2}s; CPU {:.1}s, floor {:.1}s",
            result.converge.as_secs_f64(),
            floor.time.as_secs_f64(),
            result.cpu.total(),
            result.floor_cpu.total(),
        ));
        progress(&format!("drift on PostgreSQL (2 replicas), N = {pets}"));
        result.drift_postgres = convergence::measure_drift_on_postgres(&rt, &c)?;
        // The ratio's pairs: side by side, which a machine whose speed
        // moves cannot tilt (see side_by_side).
        let pairs = side_by_side::pairs_at(
            config,
            pets,
            side_by_side::Sides::FloorOperator,
            &|step: &str| progress(step),
        )?;
        result.pairs = pairs
            .iter()
            .map(|p| convergence::Pair {
                floor: p.first.time,
                operator: p.second.time,
            })
            .collect();
        results.convergence.push(result);
    }
    results.load.end = report::load_average();
    let setups = if config.store_concurrencies.is_empty() {
        vec![]
    } else {
        config.store_setups.clone()
    };
    results.store_load = LoadAverages::now();
    for setup in setups {
        progress(&format!("store, {}", setup.label()));
        let dir = tempfile::tempdir().map_err(fixtures::io("creating a directory"))?;
        let (cells, durability, ghz) = store_load::measure_backend(
            &rt,
            dir.path(),
            setup,
            &config.store_concurrencies,
            config.store_cell,
            config.search_records,
        )?;
        results.store.extend(cells);
        results.ghz.extend(ghz);
        if durability.is_some() {
            results.durability = durability;
        }
    }
    if let Some(records) = config
        .scale_records
        .filter(|_| !config.store_concurrencies.is_empty())
    {
        for setup in [StoreSetup::Memory, StoreSetup::Durable] {
            let dir = tempfile::tempdir().map_err(fixtures::io("creating a directory"))?;
            results.scale.push(store_load::measure_scale(
                &rt,
                dir.path(),
                setup,
                records,
                &|step| progress(step),
            )?);
        }
    }
    if !config.store_concurrencies.is_empty() {
        progress("store, the change feed's cost");
        let dir = tempfile::tempdir().map_err(fixtures::io("creating a directory"))?;
        results.feed_cost =
            feed_cost::measure(&rt, dir.path(), config.feed_creates, &config.feed_watchers)?;
    }
    results.store_load.end = report::load_average();
    Ok(results)
}

fn first_line(command: &mut Command) -> String {
    run(command)
        .map(|out| out.lines().next().unwrap_or_default().trim().to_owned())
        .unwrap_or_else(|_| "unknown".into())
}

/// The machine, versions and date, for the report.
pub fn environment() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown".into());
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .next()
                .map(|l| l.split_whitespace().nth(1).unwrap_or("0").to_owned())
        })
        .and_then(|kib| kib.parse::<u64>().ok())
        .map(|kib| format!("{:.1} GiB", kib as f64 / 1024.0 / 1024.0))
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let tools = Tools::get().ok();
    let version = |bin: &str, arg: &str| {
        tools
            .map(|t| first_line(Command::new(t.bin(bin)).arg(arg)))
            .unwrap_or_default()
    };
    format!(
        "- Date: {date}\n- Machine: {cpu}, {cores} cores, {memory}, {kernel}\n- {rustc}\n- kube-apiserver {apiserver}, {etcd}\n- Build: release (`cargo build --release`)\n",
        date = first_line(Command::new("date").arg("-u").arg("+%Y-%m-%d %H:%M UTC")),
        kernel = first_line(Command::new("uname").arg("-sr")),
        rustc = first_line(Command::new("rustc").arg("--version")),
        apiserver = version("kube-apiserver", "--version"),
        etcd = version("etcd", "--version"),
    )
}

fn ms(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1000.0;
    if ms < 10.0 {
        format!("{ms:.2}")
    } else {
        format!("{ms:.0}")
    }
}

pub fn markdown(results: &BenchResults, environment: &str, plot: Option<&str>) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# Benchmarks\n");
    let _ = writeln!(
        out,
        "Reproduce with `hack/bench.sh` (writes this file and `docs/convergence.svg`).\n"
    );
    // Everything here is rewritten by the next run: notes belong elsewhere.
    let _ = writeln!(
        out,
        "This file is the benchmark's output only, and the next run rewrites it; notes on a run are written in [docs/performance.md](docs/performance.md).\n"
    );
    let _ = writeln!(out, "{environment}");
    let _ = writeln!(
        out,
        "- Load average (1, 5, 15 min) at the start: {}; at the end of the operator runs: {}\n",
        results.load.start, results.load.end
    );
    report::operator(&mut out, &results.convergence, plot);
    out.push_str(&store_markdown(results));
    out
}

/// The pet store's part of BENCHMARKS.md, from "## Pet store" to the end.
pub fn store_markdown(results: &BenchResults) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "\n## Pet store\n");
    let _ = writeln!(
        out,
        "Reproduce with `hack/bench.sh --store-only` (this section only). Both clients and the store share the machine's cores, so these are the store *and* its load generator on 2 cores; compare rows run back to back rather than across runs. PostgreSQL is a local server (Debian's 15, fsync on) on the same machine; with 2 replicas both store processes share one database.\n"
    );
    let _ = writeln!(
        out,
        "- Load average (1, 5, 15 min) at the start of the store runs: {}; at the end: {}\n",
        results.store_load.start, results.store_load.end
    );
    let _ = writeln!(out, "### ghz (grpc-go client)\n");
    let _ = writeln!(
        out,
        "[ghz](https://ghz.sh) drives the store as Go clients do (grpcurl, the book's CLI and operator). Each cell runs for a fixed time: `ghz --insecure --call petstore.PetStore/<RPC> -d '<request>' -c <concurrency> --connections <replicas> -z <time> <addr>`, against a store that holds the records loaded for the Rust get and search cells plus what earlier AddPets cells added. GetPets reads one fixed ID; SearchPets names one pet. With 2 replicas, ghz goes through a round-robin TCP forwarder on 127.0.0.1 (standing in for a Service) with one connection per replica, so the extra hop is in those figures.\n"
    );
    table_head(
        &mut out,
        &[
            "backend",
            "operation",
            "concurrency",
            "calls/s",
            "p50 ms",
            "p99 ms",
            "errors",
        ],
        "llrrrrr",
    );
    for r in &results.ghz {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.0} | {} | {} | {} |",
            r.backend,
            r.operation,
            r.concurrency,
            r.calls_per_second,
            ms3(r.p50),
            ms3(r.p99),
            r.errors
        );
    }
    let ghz_cell = |backend: &str, operation: &str, c: usize| {
        results.ghz.iter().find(|r| {
            r.backend == backend && r.operation.starts_with(operation) && r.concurrency == c
        })
    };
    // What ghz reaches on a call that touches no storage, same backend and
    // concurrency: a goal above it is out of reach of any store here.
    let ceiling = |backend: &str, c: usize, latency: bool| {
        ghz_cell(backend, store_load::CEILING_OPERATION, c).map_or("-".to_owned(), |r| {
            if latency {
                format!("{} ms", ms3(r.p50))
            } else {
                format!("{:.0} calls/s", r.calls_per_second)
            }
        })
    };
    let mut goals: Vec<(String, String, String, bool, String)> = Vec::new();
    for backend in ["Memory", "Durable"] {
        for operation in ["AddPets", "GetPets"] {
            if let Some(r) = ghz_cell(backend, operation, 1) {
                goals.push((
                    format!("{backend}: {operation} p50 at concurrency 1"),
                    "≤ 0.2 ms".into(),
                    format!("{} ms", ms3(r.p50)),
                    r.p50 <= Duration::from_micros(200),
                    ceiling(backend, 1, true),
                ));
            }
        }
    }
    for (backend, operation, goal) in [
        ("Memory", "AddPets", 15_000.0),
        ("Durable", "AddPets", 8_000.0),
        ("Durable", "GetPets", 30_000.0),
    ] {
        if let Some(r) = ghz_cell(backend, operation, 64) {
            goals.push((
                format!("{backend}: {operation} at concurrency 64"),
                format!("≥ {goal:.0} calls/s"),
                format!("{:.0} calls/s", r.calls_per_second),
                r.calls_per_second >= goal,
                ceiling(backend, 64, false),
            ));
        }
    }
    for r in &results.scale {
        goals.push((
            format!("{}: search by name at {} pets, p50", r.backend, r.records),
            "≤ 1 ms".into(),
            format!("{} ms", ms3(r.name_p50)),
            r.name_p50 <= Duration::from_millis(1),
            "-".into(),
        ));
        goals.push((
            format!(
                "{}: RSS growth during a full stream of {} pets",
                r.backend, r.records
            ),
            "≤ 64 MiB".into(),
            format!("{:.1} MiB", r.rss_growth_kib as f64 / 1024.0),
            r.rss_growth_kib <= 64 * 1024,
            "-".into(),
        ));
    }
    if !goals.is_empty() {
        subsection(
            &mut out,
            "Goals",
            "*ghz's ceiling* is the same ghz cell on `grpc.health.v1.Health/Check`, which touches no storage: what ghz itself reaches on these 2 cores.",
        );
        table_head(
            &mut out,
            &["measurement", "goal", "measured", "met", "ghz's ceiling"],
            "llrlr",
        );
        for (what, goal, got, met, ceiling) in goals {
            let _ = writeln!(
                out,
                "| {what} | {goal} | {got} | {} | {ceiling} |",
                if met { "yes" } else { "**no**" }
            );
        }
    }
    if !results.scale.is_empty() {
        subsection(
            &mut out,
            "A large store",
            "Pets loaded 1000 per call by 4 clients. Name searches: one name per call at concurrency 1 (Rust client), each finding exactly one pet through the name index. The full stream is one SearchPets with no filter, read by one client; RSS is the server's, sampled every 10 ms. The durable store was killed with `kill -9` after loading, and its open time is what it logged on restart.",
        );
        table_head(
            &mut out,
            &[
                "backend",
                "pets",
                "load",
                "name search p50",
                "p99",
                "full stream",
                "pets streamed",
                "RSS before",
                "RSS growth during stream",
                "open after kill -9",
                "file",
            ],
            "lrrrrrrrrrr",
        );
        for r in &results.scale {
            let _ = writeln!(
                out,
                "| {} | {} | {:.1} s | {} ms | {} ms | {:.1} s | {} | {:.1} MiB | {:.1} MiB | {} | {} |",
                r.backend,
                r.records,
                r.load_seconds,
                ms3(r.name_p50),
                ms3(r.name_p99),
                r.stream_seconds,
                r.streamed,
                r.rss_before_kib as f64 / 1024.0,
                r.rss_growth_kib as f64 / 1024.0,
                r.open.map_or("-".into(), |d| format!("{} ms", ms3(d))),
                r.file_bytes.map_or("-".into(), |b| format!(
                    "{:.0} MiB",
                    b as f64 / 1024.0 / 1024.0
                )),
            );
        }
    }
    if !results.feed_cost.is_empty() {
        subsection(
            &mut out,
            "The change feed's cost",
            &format!(
                "A fresh durable store for each row: the watchers follow `WatchPets` from the current revision, then {CREATORS} clients create the pets, one `AddPets` call per pet (as the operator sends a lone create). Time runs until every watcher has received every change; CPU and peak RSS are the store's (RSS sampled every 10 ms). The first row, with no watcher, is the store without the feed's cost.",
                CREATORS = feed_cost::CREATORS
            ),
        );
        table_head(
            &mut out,
            &[
                "watchers",
                "creates",
                "time",
                "creates/s",
                "store CPU",
                "CPU µs per create",
                "RSS before",
                "peak RSS",
                "changes delivered",
            ],
            "rrrrrrrrr",
        );
        for r in &results.feed_cost {
            let _ = writeln!(
                out,
                "| {} | {} | {:.2} s | {:.0} | {:.2} s | {:.0} | {:.1} MiB | {:.1} MiB | {} |",
                r.watchers,
                r.creates,
                r.seconds,
                r.creates as f64 / r.seconds.max(1e-9),
                r.store_cpu_seconds,
                r.store_cpu_seconds * 1e6 / r.creates.max(1) as f64,
                r.store_rss_before_kib as f64 / 1024.0,
                r.store_peak_rss_kib as f64 / 1024.0,
                r.delivered,
            );
        }
    }
    subsection(
        &mut out,
        "Rust client (tonic)",
        "A Rust tonic client on loopback, several HTTP/2 connections (spread over the replicas directly, as client-side round-robin would), each cell run for a fixed time. Get and search run against exactly the stated number of records.",
    );
    table_head(
        &mut out,
        &[
            "backend",
            "operation",
            "concurrency",
            "calls/s",
            "pets/s",
            "p50 ms",
            "p99 ms",
        ],
        "llrrrrr",
    );
    for r in &results.store {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.0} | {:.0} | {} | {} |",
            r.backend,
            r.operation,
            r.concurrency,
            r.calls_per_second(),
            r.pets_per_second(),
            ms(r.p50),
            ms(r.p99)
        );
    }
    if let Some(d) = &results.durability {
        let _ = writeln!(
            out,
            "\nDurability: after the durable AddPets cells the store was killed with `kill -9` and restarted: {} of {} acknowledged pets were there.",
            d.found_after_kill, d.acknowledged
        );
    }
    out
}

/// Milliseconds with three decimals below 1 ms, where the goals are.
fn ms3(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1000.0;
    if ms < 1.0 {
        format!("{ms:.3}")
    } else {
        self::ms(d)
    }
}

pub use report::plot;

#[cfg(test)]
mod tests {
    /// The next run rewrites the report, so it says where notes go and
    /// holds none.
    #[test]
    fn the_report_is_the_benchmarks_own_output() {
        let report = super::markdown(&super::BenchResults::default(), "- Date: now\n", None);
        let header: Vec<&str> = report.lines().take(5).collect();
        assert!(
            header.iter().any(|line| line.contains(
                "notes on a run are written in [docs/performance.md](docs/performance.md)"
            )),
            "{header:?}"
        );
        let lower = report.to_lowercase();
        for claim in ["by hand", "hand-written", "notes on this run"] {
            assert!(!lower.contains(claim), "the report says {claim:?}");
        }
    }

    /// Operator ÷ floor must hold in every pair: a median that meets it
    /// does not make the goal met.
    #[test]
    fn one_pair_over_the_ratio_fails_its_goal() {
        use crate::convergence::{ConvergenceResult, Pair};
        use std::time::Duration;
        let pair = |operator: f64| Pair {
            floor: Duration::from_secs(10),
            operator: Duration::from_secs_f64(operator),
        };
        let results = |pairs: Vec<Pair>| super::BenchResults {
            convergence: vec![ConvergenceResult {
                pets: 1000,
                pairs,
                ..Default::default()
            }],
            ..Default::default()
        };
        let goal_row = |report: String| {
            report
                .lines()
                .find(|line| line.starts_with("| operator ÷ floor, N = 1000, every pair"))
                .map(str::to_owned)
                .unwrap_or_default()
        };
        let over = goal_row(super::markdown(
            &results(vec![pair(10.5), pair(11.2), pair(10.8)]),
            "",
            None,
        ));
        assert!(
            over.contains("1.12 at worst (median 1.08)") && over.contains("**not met**"),
            "{over}"
        );
        let within = goal_row(super::markdown(
            &results(vec![pair(10.5), pair(11.0), pair(10.8)]),
            "",
            None,
        ));
        assert!(within.ends_with("| met |"), "{within}");
    }
}
