//! Runs the benchmarks and writes BENCHMARKS.md and docs/convergence.svg.
//! Use hack/bench.sh, which builds the release binaries first.
//!
//!     petstore-bench [--smoke] [--poll-max-rate R] [--out BENCHMARKS.md] [--sizes 100,1000,5000,20000]
//!                    [--floor-as operator|admin]    # the floor's identity (default: operator)
//!                    [--pairs K]                    # floor-then-operator pairs per N (default: 3)
//!     petstore-bench --skip-store [...]         # replaces only the operator section
//!     petstore-bench --store-only [--scale N]   # replaces only the store section

use std::path::PathBuf;
use std::process::ExitCode;

use petstore_bench::convergence::FloorIdentity;
use petstore_bench::{self as bench, BenchConfig};

fn main() -> ExitCode {
    let mut config = BenchConfig::full();
    let mut out = fixtures::repo_root().join("BENCHMARKS.md");
    let mut store_only = false;
    let mut skip_store = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--smoke" => config = BenchConfig::smoke(),
            "--skip-store" => {
                skip_store = true;
                config.store_concurrencies.clear();
            }
            "--store-only" => {
                store_only = true;
                config.sizes.clear();
            }
            "--scale" => match args.next().and_then(|n| n.parse().ok()) {
                Some(0) => config.scale_records = None,
                Some(n) => config.scale_records = Some(n),
                None => return usage("--scale needs a number of pets (0 skips)"),
            },
            "--floor-as" => match args.next().as_deref() {
                Some("operator") => config.floor_identity = FloorIdentity::Operator,
                Some("admin") => config.floor_identity = FloorIdentity::Admin,
                _ => return usage("--floor-as needs operator (its ServiceAccount) or admin"),
            },
            "--pairs" => match args.next().and_then(|v| v.parse().ok()) {
                Some(pairs) if pairs > 0 => config.pairs = pairs,
                _ => return usage("--pairs needs a number of pairs, at least 1"),
            },
            "--poll-max-rate" => match args.next().and_then(|v| v.parse().ok()) {
                Some(rate) => config.poll_max_rate = rate,
                None => return usage("--poll-max-rate needs a number (0: leave the default)"),
            },
            "--out" => match args.next() {
                Some(path) => out = PathBuf::from(path),
                None => return usage("--out needs a path"),
            },
            "--sizes" => {
                let sizes: Result<Vec<usize>, _> = args
                    .next()
                    .unwrap_or_default()
                    .split(',')
                    .map(str::parse)
                    .collect();
                match sizes {
                    Ok(sizes) if !sizes.is_empty() => config.sizes = sizes,
                    _ => return usage("--sizes needs numbers such as 1000,5000,20000"),
                }
            }
            other => return usage(&format!("unknown argument {other:?}")),
        }
    }
    let results = match bench::run_all(&config, |step| eprintln!("[bench] {step}")) {
        Ok(results) => results,
        Err(err) => {
            eprintln!("petstore-bench: {err}");
            return ExitCode::FAILURE;
        }
    };
    if store_only {
        // Keep the operator's section as it is; replace the store's.
        let existing = std::fs::read_to_string(&out).unwrap_or_default();
        let head = existing
            .find("\n## Pet store")
            .map_or(existing.as_str(), |at| &existing[..at]);
        let report = format!("{}\n{}", head.trim_end(), bench::store_markdown(&results));
        if let Err(err) = std::fs::write(&out, &report) {
            eprintln!("petstore-bench: writing {}: {err}", out.display());
            return ExitCode::FAILURE;
        }
        println!("{}", bench::store_markdown(&results));
        eprintln!("wrote {}", out.display());
        return ExitCode::SUCCESS;
    }
    let svg = out
        .parent()
        .unwrap_or(std::path::Path::new("."))
        .join("docs/convergence.svg");
    let plot = std::fs::create_dir_all(svg.parent().unwrap_or(std::path::Path::new(".")))
        .ok()
        .and_then(|()| bench::plot(&results.convergence, &svg).ok())
        .map(|()| "docs/convergence.svg");
    let mut report = bench::markdown(&results, &bench::environment(), plot);
    if skip_store {
        // Keep the store's section as it is; replace the operator's.
        let existing = std::fs::read_to_string(&out).unwrap_or_default();
        if let (Some(old), Some(new)) = (
            existing.find("\n## Pet store"),
            report.find("\n## Pet store"),
        ) {
            report = format!("{}{}", &report[..new], &existing[old..]);
        }
    }
    if let Err(err) = std::fs::write(&out, &report) {
        eprintln!("petstore-bench: writing {}: {err}", out.display());
        return ExitCode::FAILURE;
    }
    println!("{report}");
    eprintln!("wrote {}", out.display());
    ExitCode::SUCCESS
}

fn usage(problem: &str) -> ExitCode {
    eprintln!(
        "petstore-bench: {problem}\nusage: petstore-bench [--smoke] [--skip-store | --store-only] [--scale N] [--poll-max-rate R] [--floor-as operator|admin] [--pairs K] [--out FILE] [--sizes N,N,...]"
    );
    ExitCode::FAILURE
}
