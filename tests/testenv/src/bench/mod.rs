//! Benchmarks: operator convergence against the floor this control plane
//! allows, and pet store throughput and latency. `petstore-bench` runs them
//! and writes BENCHMARKS.md; a smoke test runs them tiny.

pub mod apimetrics;
pub mod convergence;
pub mod procstat;
pub mod report;
pub mod store_load;

use std::fmt::Write as _;
use std::process::Command;
use std::time::Duration;

use convergence::{ConvergenceConfig, ConvergenceResult};
use store_load::{DurabilityCheck, LoadResult};

use crate::{Result, Storage, Tools, run};

#[derive(Clone, Debug)]
pub struct BenchConfig {
    pub sizes: Vec<usize>,
    pub concurrency: usize,
    /// Poll interval of the operator restarted after convergence.
    pub poll_interval: Duration,
    pub poll_max_rate: u32,
    pub churn_max_pets: usize,
    pub store_concurrencies: Vec<usize>,
    pub store_cell: Duration,
    pub search_records: u64,
}

impl BenchConfig {
    pub fn full() -> Self {
        Self {
            sizes: vec![100, 1000, 5000, 20_000],
            concurrency: 16,
            poll_interval: Duration::from_secs(10),
            poll_max_rate: 1000,
            churn_max_pets: 5000,
            store_concurrencies: vec![1, 16, 64],
            store_cell: Duration::from_secs(3),
            search_records: 10_000,
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
            store_concurrencies: vec![2],
            store_cell: Duration::from_millis(300),
            search_records: 200,
        }
    }
}

#[derive(Debug, Default)]
pub struct BenchResults {
    pub convergence: Vec<ConvergenceResult>,
    /// /proc/loadavg before the first and after the last operator run.
    pub load_start: String,
    pub load_end: String,
    pub store: Vec<LoadResult>,
    pub durability: Option<DurabilityCheck>,
}

pub fn run_all(config: &BenchConfig, progress: impl Fn(&str)) -> Result<BenchResults> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(crate::io("starting a tokio runtime"))?;
    let mut results = BenchResults {
        load_start: report::load_average(),
        ..BenchResults::default()
    };
    for &pets in &config.sizes {
        let c = ConvergenceConfig {
            pets,
            concurrency: config.concurrency,
            poll_interval: config.poll_interval,
            poll_max_rate: config.poll_max_rate,
            churn_max_pets: config.churn_max_pets,
        };
        progress(&format!("floor, N = {pets}"));
        let (floor, floor_requests) = convergence::measure_floor(&rt, &c)?;
        progress(&format!("operator, N = {pets}"));
        let mut result = convergence::measure_operator(&rt, &c)?;
        result.floor = floor;
        result.floor_api_requests = floor_requests;
        progress(&format!(
            "N = {pets}: operator {:.2}s, floor {:.2}s",
            result.converge.as_secs_f64(),
            floor.as_secs_f64()
        ));
        results.convergence.push(result);
    }
    results.load_end = report::load_average();
    let backends = if config.store_concurrencies.is_empty() {
        vec![]
    } else {
        vec![Storage::Durable, Storage::Memory]
    };
    for backend in backends {
        progress(&format!("store, {backend:?}"));
        let dir = tempfile::tempdir().map_err(crate::io("creating a directory"))?;
        let (cells, durability) = store_load::measure_backend(
            &rt,
            dir.path(),
            backend,
            &config.store_concurrencies,
            config.store_cell,
            config.search_records,
        )?;
        results.store.extend(cells);
        if durability.is_some() {
            results.durability = durability;
        }
    }
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
    let _ = writeln!(out, "{environment}");
    let _ = writeln!(
        out,
        "- Load average (1, 5, 15 min) at the start: {}; at the end of the operator runs: {}\n",
        results.load_start, results.load_end
    );
    report::operator(&mut out, &results.convergence, plot);
    let _ = writeln!(out, "\n## Pet store\n");
    let _ = writeln!(
        out,
        "A Rust tonic client on loopback, several HTTP/2 connections, each cell run for a fixed time. Get and search run against exactly the stated number of records.\n"
    );
    let _ = writeln!(
        out,
        "| backend | operation | concurrency | calls/s | pets/s | p50 ms | p99 ms |"
    );
    let _ = writeln!(out, "|---|---|---:|---:|---:|---:|---:|");
    for r in &results.store {
        let _ = writeln!(
            out,
            "| {:?} | {} | {} | {:.0} | {:.0} | {} | {} |",
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

pub use report::plot;
