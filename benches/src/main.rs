//! Runs the benchmarks and writes BENCHMARKS.md and docs/convergence.svg.
//! Use hack/bench.sh, which builds the release binaries first; `--help`
//! lists the flags.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use fixtures::trace_receiver::TraceReceiver;
use petstore_bench::convergence::FloorIdentity;
use petstore_bench::{self as bench, BenchConfig, BenchResults};

/// Benchmarks the operator's convergence against the floor this control
/// plane allows, and the pet store's throughput and latency; writes the
/// report (BENCHMARKS.md) and docs/convergence.svg beside it.
///
/// hack/bench.sh builds the release binaries and runs this with its
/// arguments. A flag left out takes the value of a full run, or of a tiny
/// one with --smoke.
#[derive(Debug, Parser)]
#[command(name = "petstore-bench")]
#[command(group(clap::ArgGroup::new("spread_run").args(["spread", "side"]).multiple(true)))]
struct Args {
    /// A tiny run, to check that the benchmarks work: the smaller defaults
    /// below, and short store cells.
    #[arg(long)]
    smoke: bool,

    /// Measure only the operator; the report's store section stays as it is.
    #[arg(long, conflicts_with_all = ["store_only", "scale"])]
    skip_store: bool,

    /// Measure only the pet store; the report's operator section stays as it
    /// is.
    #[arg(long, conflicts_with_all = ["sizes", "pairs", "floor_as", "poll_max_rate"])]
    store_only: bool,

    /// The numbers of Pets the operator converges, in order
    /// [default: 100,1000,5000,20000; with --smoke: 10].
    #[arg(
        long,
        value_name = "N,N,...",
        value_delimiter = ',',
        value_parser = at_least_one
    )]
    sizes: Option<Vec<usize>>,

    /// Floor-then-operator pairs at each N; operator ÷ floor is the median of
    /// their ratios [default: 3; with --smoke: 2].
    #[arg(long, value_name = "K", value_parser = at_least_one)]
    pairs: Option<usize>,

    /// Whose credentials the floor's baseline client uses [default:
    /// operator].
    #[arg(long, value_enum, value_name = "WHO")]
    floor_as: Option<FloorAs>,

    /// The restarted operator's --poll-max-rate, in store reads per second
    /// (0: the operator's own default) [default: 1000; with --smoke: 100].
    #[arg(long, value_name = "R", value_parser = whole_number::<u32>)]
    poll_max_rate: Option<u32>,

    /// Pets in the large store (search by name, a full stream, the durable
    /// file's open time); 0 skips it [default: 1000000; with --smoke: 2000].
    #[arg(long, value_name = "N", value_parser = whole_number::<u64>)]
    scale: Option<u64>,

    /// Export every trace of the operator and the store over OTLP/gRPC to a
    /// receiver started for the run (the tests' OpenTelemetry Collector,
    /// built once and cached), to measure what tracing costs. Without it
    /// tracing is off, as the operator ships.
    #[arg(long, conflicts_with = "store_only")]
    tracing: bool,

    /// Only the floor-then-operator pairs at each N, each pair's ratio and
    /// CPU per Pet printed as it ends; nothing else is measured, and no
    /// report is written. For trying a change against the ratio's goal.
    #[arg(long, conflicts_with_all = ["store_only", "scale", "out"])]
    pairs_only: bool,

    /// With --pairs-only: only the operator's run of each pair, its CPU a
    /// Pet split by process and its peak RSS printed, to see how each part's
    /// cost a Pet moves with N.
    #[arg(long, requires = "pairs_only")]
    operator_alone: bool,

    /// Only pairs, as --pairs-only, but run side by side: the two runs of a
    /// pair at the same time, each pinned to a core of its own, so that both
    /// meet the same moment of a machine whose speed moves; the cores swap
    /// from pair to pair. `floors` and `operators` put a run beside its
    /// like, to show what the method cannot tell apart. Needs two cores.
    #[arg(
        long,
        value_enum,
        value_name = "RUNS",
        conflicts_with_all = ["store_only", "scale", "out", "pairs_only"]
    )]
    side_by_side: Option<SideBySideRuns>,

    /// Internal: one run of a side-by-side pair (floor or operator) at the
    /// first of --sizes, pinned to the core --cpu names.
    #[arg(long, hide = true, requires = "cpu", value_name = "RUN")]
    side: Option<String>,

    #[arg(long, hide = true, requires = "side", value_name = "CPU")]
    cpu: Option<usize>,

    /// Internal: the client concurrency of a side-by-side run.
    #[arg(long, hide = true, requires = "side", value_name = "C")]
    concurrency: Option<usize>,

    /// Only idle store calls, over a real window this long (at most 1h):
    /// two operators at their defaults, one following the store's change
    /// feed and one with `--follow-store-changes=false`, each with its own
    /// control plane and store and the largest of --sizes Pets converged,
    /// counted over the same window. Rewrites only the report's idle
    /// section, which every other run keeps.
    #[arg(
        long,
        value_name = "WINDOW",
        value_parser = idle_window,
        conflicts_with_all = ["store_only", "skip_store", "pairs_only", "side_by_side", "smoke", "tracing", "scale"]
    )]
    idle: Option<std::time::Duration>,

    /// With --idle: once converged, every Pet is switched to
    /// `changePolicy: Observe` and renamed, so each holds a pending plan
    /// through the window. Rewrites the report's Observe section instead.
    #[arg(long, requires = "idle")]
    idle_observe: bool,

    /// Only plans under `Approve`: this many Pets converged, switched to
    /// `changePolicy: Approve`, then all renamed at once, by `kubectl apply`
    /// of one file and by the benchmark's own patches (`--concurrency` at a
    /// time); each rename timed until its plan is shown. Rewrites only the
    /// report's plans section, which every other run keeps.
    #[arg(
        long,
        value_name = "N",
        value_parser = at_least_one,
        conflicts_with_all = ["store_only", "skip_store", "pairs_only", "side_by_side", "smoke", "tracing", "scale", "idle"]
    )]
    plans: Option<usize>,

    /// Only `kubectl petstore import`: this many records added to a
    /// durable store (no operator), then the release plugin run 3 times,
    /// each timed until it has printed a Pet manifest per record. Rewrites
    /// only the report's import section, which every other run keeps.
    #[arg(
        long,
        value_name = "N",
        value_parser = at_least_one,
        conflicts_with_all = ["store_only", "skip_store", "pairs_only", "side_by_side", "smoke", "tracing", "scale", "idle", "plans", "sizes", "pairs", "floor_as", "poll_max_rate"]
    )]
    import: Option<usize>,

    /// Only fairness between namespaces: this many Pets created at once in
    /// one namespace, while a Pet is created in another every 250 ms; each
    /// of those timed until Ready. Rewrites only the report's fairness
    /// section, which every other run keeps.
    #[arg(
        long,
        value_name = "N",
        value_parser = at_least_one,
        conflicts_with_all = ["store_only", "skip_store", "pairs_only", "side_by_side", "smoke", "tracing", "scale", "idle", "plans", "import", "sizes", "pairs", "floor_as", "poll_max_rate"]
    )]
    fairness: Option<usize>,

    /// Only tenancy's token cost at steady state, over a real window this
    /// long (at most 1h): 20 namespaces with --token-cost-pets Pets each,
    /// on a store with tenancy; the operator's TokenRequests and store
    /// calls counted over the window once all are Ready. Rewrites only the
    /// report's token cost section, which every other run keeps.
    #[arg(
        long,
        value_name = "WINDOW",
        value_parser = idle_window,
        conflicts_with_all = ["store_only", "skip_store", "pairs_only", "side_by_side", "smoke", "tracing", "scale", "idle", "plans", "import", "fairness", "sizes", "pairs", "floor_as", "poll_max_rate"]
    )]
    token_cost: Option<std::time::Duration>,

    /// Only the spread: this many Pets over --spread-namespaces namespaces
    /// on 3 stores with tenancy, reached through the store kinds, against
    /// the same Pets in one namespace on one store; then --pairs
    /// floor-and-operator pairs side by side in the spread layout.
    /// Rewrites only the report's spread section, which every other run
    /// keeps [default: 20000].
    #[arg(
        long,
        value_name = "N",
        num_args = 0..=1,
        default_missing_value = "20000",
        value_parser = at_least_one,
        conflicts_with_all = ["store_only", "skip_store", "pairs_only", "side_by_side", "smoke", "tracing", "scale", "idle", "plans", "import", "fairness", "token_cost", "sizes", "poll_max_rate"]
    )]
    spread: Option<usize>,

    /// With --spread (and its sides): the namespaces the Pets spread over
    /// [default: 200].
    #[arg(long, value_name = "K", value_parser = at_least_one, requires = "spread_run")]
    spread_namespaces: Option<usize>,

    /// With --token-cost: Pets in each namespace.
    #[arg(long, value_name = "N", default_value_t = 50, requires = "token_cost", value_parser = at_least_one)]
    token_cost_pets: usize,

    /// Only certificate rotation, over a real window this long (at most
    /// 1h) [default: 30m]: the store and an operator with mutual TLS from
    /// files, --pets Pets renamed throughout, a TLS file changed every
    /// --rotation-period, each cycle of six moving both sides to a new CA;
    /// each change timed until in use. Rewrites only the report's rotation
    /// section, which every other run keeps.
    #[arg(
        long,
        value_name = "WINDOW",
        value_parser = idle_window,
        num_args = 0..=1,
        default_missing_value = "30m",
        conflicts_with_all = ["store_only", "skip_store", "pairs_only", "side_by_side", "smoke", "tracing", "scale", "idle", "plans", "import", "fairness", "token_cost", "sizes", "pairs", "floor_as", "poll_max_rate"]
    )]
    rotation: Option<std::time::Duration>,

    /// Only the store under a flood: the store with its shipped bounds and
    /// mutual TLS, an operator reaching it from another address, --pets
    /// Pets Ready, then renames for two windows this long (at most 1h)
    /// [default: 60s], the second while ghz floods the store; the
    /// operator's store-call p99 in each. Rewrites only the report's flood
    /// section, which every other run keeps.
    #[arg(
        long,
        value_name = "WINDOW",
        value_parser = idle_window,
        num_args = 0..=1,
        default_missing_value = "60s",
        conflicts_with_all = ["store_only", "skip_store", "pairs_only", "side_by_side", "smoke", "tracing", "scale", "idle", "plans", "import", "fairness", "token_cost", "sizes", "pairs", "floor_as", "poll_max_rate", "rotation"]
    )]
    flood: Option<std::time::Duration>,

    /// Only pacing each store: N Pets converged once with each fixed
    /// `--store-concurrency` of 4, 8, 16, 32, 64 and 128 and once with
    /// `auto`, each on a control plane of its own; then a store bound by
    /// rate (`--max-calls-per-second`) read by --pacing-pets Pets once a
    /// second, with the fixed 32 and with `auto`, calls and refusals
    /// counted over --pacing-window. Rewrites only the report's pacing
    /// section, which every other run keeps [default: 20000; with
    /// --smoke: 20].
    #[arg(
        long,
        value_name = "N",
        num_args = 0..=1,
        value_parser = at_least_one,
        conflicts_with_all = ["store_only", "skip_store", "pairs_only", "side_by_side", "tracing", "scale", "idle", "plans", "import", "fairness", "token_cost", "spread", "rotation", "flood", "sizes", "pairs", "floor_as", "poll_max_rate", "pets"]
    )]
    pacing: Option<Option<usize>>,

    /// Only the operator at N Pets, alone: its convergence, then
    /// out-of-band drift, a `kill -9` and restart, and steady state, with
    /// the API server's and etcd's memory beside the figures. Rewrites only
    /// the report's section "The operator at scale", which every other run
    /// keeps.
    #[arg(
        long,
        value_name = "N",
        value_parser = at_least_one,
        conflicts_with_all = ["store_only", "skip_store", "pairs_only", "side_by_side", "tracing", "scale", "idle", "plans", "import", "fairness", "token_cost", "spread", "rotation", "flood", "pacing", "sizes", "pairs", "floor_as"]
    )]
    at_scale: Option<usize>,

    /// With --pacing: the Pets read once a second from the store bound by
    /// rate, twice its calls a second (200; with --smoke: 20) [default:
    /// 400; with --smoke: 40].
    #[arg(long, value_name = "P", value_parser = at_least_one, requires = "pacing")]
    pacing_pets: Option<usize>,

    /// With --pacing: how long the calls to the store bound by rate are
    /// counted, once every record is made (at most 1h) [default: 60s; with
    /// --smoke: 5s].
    #[arg(long, value_name = "WINDOW", value_parser = idle_window, requires = "pacing")]
    pacing_window: Option<std::time::Duration>,

    /// With --rotation: how often a TLS file changes.
    #[arg(long, value_name = "PERIOD", default_value = "60s", requires = "rotation", value_parser = period)]
    rotation_period: std::time::Duration,

    /// With --rotation or --flood: the Pets converged, then renamed.
    #[arg(long, value_name = "N", default_value_t = 1000, value_parser = at_least_one)]
    pets: usize,

    /// Where to write the report; the plot goes to docs/convergence.svg in
    /// the report's folder [default: BENCHMARKS.md at the repository root].
    #[arg(long, value_name = "PATH")]
    out: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum SideBySideRuns {
    /// The floor beside the operator: the ratio's pairs.
    FloorOperator,
    /// A floor beside a floor.
    Floors,
    /// An operator run beside an operator run.
    Operators,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum FloorAs {
    /// The operator's ServiceAccount, with its RBAC and API Priority and
    /// Fairness, as the operator itself runs.
    Operator,
    /// The cluster admin (system:masters), which skips both.
    Admin,
}

/// A window for --idle: a duration up to an hour.
fn idle_window(text: &str) -> Result<std::time::Duration, String> {
    let window = petstore_process::parse_duration(text).map_err(|e| e.to_string())?;
    if window.is_zero() || window > bench::idle::MAX_WINDOW {
        return Err(format!(
            "{text:?}: the window is more than 0 and at most 1h"
        ));
    }
    Ok(window)
}

/// A period: a duration of at least a second.
fn period(text: &str) -> Result<std::time::Duration, String> {
    let period = petstore_process::parse_duration(text).map_err(|e| e.to_string())?;
    if period < std::time::Duration::from_secs(1) {
        return Err(format!("{text:?}: the period is at least 1s"));
    }
    Ok(period)
}

/// A whole number, 0 or more.
fn whole_number<T: std::str::FromStr>(text: &str) -> Result<T, String> {
    text.parse().map_err(|_| "expected a whole number".into())
}

/// A whole number, at least 1.
fn at_least_one(text: &str) -> Result<usize, String> {
    match whole_number(text)? {
        0 => Err("must be at least 1".into()),
        n => Ok(n),
    }
}

impl Args {
    /// The configuration these flags ask for.
    fn config(&self) -> BenchConfig {
        let mut config = if self.smoke {
            BenchConfig::smoke()
        } else {
            BenchConfig::full()
        };
        if self.skip_store {
            config.store_concurrencies.clear();
        }
        if self.store_only {
            config.sizes.clear();
        }
        if let Some(sizes) = &self.sizes {
            config.sizes.clone_from(sizes);
        }
        if let Some(pairs) = self.pairs {
            config.pairs = pairs;
        }
        if let Some(concurrency) = self.concurrency {
            config.concurrency = concurrency;
        }
        if let Some(floor_as) = self.floor_as {
            config.floor_identity = match floor_as {
                FloorAs::Operator => FloorIdentity::Operator,
                FloorAs::Admin => FloorIdentity::Admin,
            };
        }
        if let Some(rate) = self.poll_max_rate {
            config.poll_max_rate = rate;
        }
        if let Some(records) = self.scale {
            config.scale_records = (records > 0).then_some(records);
        }
        config
    }

    /// The --pacing run these flags ask for, with `pets` to converge if
    /// given.
    fn pacing_config(&self, pets: Option<usize>) -> bench::pacing::PacingConfig {
        let mut config = if self.smoke {
            bench::pacing::PacingConfig::smoke()
        } else {
            bench::pacing::PacingConfig::full()
        };
        config.bench = self.config();
        if let Some(pets) = pets {
            config.pets = pets;
        }
        if let Some(pets) = self.pacing_pets {
            config.throttled_pets = pets;
        }
        if let Some(window) = self.pacing_window {
            config.window = window;
        }
        config
    }
}

/// Where the store's section of the report starts.
const STORE_SECTION: &str = "\n## Pet store";

/// The report to write, keeping the section of the existing one that this
/// run did not measure.
fn report(args: &Args, results: &BenchResults, out: &Path) -> String {
    let existing = || std::fs::read_to_string(out).unwrap_or_default();
    if args.store_only {
        let existing = existing();
        let head = existing
            .find(STORE_SECTION)
            .map_or(existing.as_str(), |at| &existing[..at]);
        return format!("{}\n{}", head.trim_end(), bench::store_markdown(results));
    }
    let svg = out
        .parent()
        .unwrap_or(Path::new("."))
        .join("docs/convergence.svg");
    let plot = std::fs::create_dir_all(svg.parent().unwrap_or(Path::new(".")))
        .ok()
        .and_then(|()| bench::plot(&results.convergence, &svg).ok())
        .map(|()| "docs/convergence.svg");
    let tracing = if args.tracing {
        "- Tracing: on. Both processes export every trace over OTLP/gRPC (batched, the SDK's defaults) to an OpenTelemetry Collector (OTLP receiver, file exporter) on 127.0.0.1; the operator samples every reconcile and the store follows its parent\n"
    } else {
        "- Tracing: off (no `OTEL_EXPORTER_OTLP_ENDPOINT`), as the operator ships\n"
    };
    let environment = format!("{}{tracing}", bench::environment());
    let report = bench::markdown(results, &environment, plot);
    if args.skip_store {
        let existing = existing();
        if let (Some(old), Some(new)) = (existing.find(STORE_SECTION), report.find(STORE_SECTION)) {
            return format!("{}{}", &report[..new], &existing[old..]);
        }
    }
    report
}

/// The trace receiver for the run, and the OTLP exporter's environment pointing at
/// it for every process started after this.
fn start_trace_receiver() -> Result<(TraceReceiver, tempfile::TempDir), String> {
    let dir = tempfile::tempdir().map_err(|err| err.to_string())?;
    let receiver = TraceReceiver::start(dir.path()).map_err(|err| err.to_string())?;
    eprintln!(
        "[bench] exporting traces to the trace receiver at {}",
        receiver.otlp_endpoint()
    );
    // SAFETY: no other thread exists yet that reads the environment: the
    // runtime and every benchmark thread start after this.
    unsafe {
        std::env::set_var("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.otlp_endpoint());
        std::env::set_var("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc");
    }
    Ok((receiver, dir))
}

/// The --idle run: measures, then rewrites the report's idle section.
fn idle(args: &Args, window: std::time::Duration, out: &Path) -> ExitCode {
    let config = args.config();
    let idle = bench::idle::IdleConfig {
        pets: config.sizes.iter().copied().max().unwrap_or(1),
        window,
        concurrency: config.concurrency,
        observe: args.idle_observe,
    };
    let measured = bench::idle::measure(&idle, &progress);
    let (heading, markdown) = (bench::idle::section(idle.observe), bench::idle::markdown);
    write_section(out, heading, measured, markdown, |r| r.goal_met())
}

/// A step of a run, as it starts.
fn progress(step: &str) {
    eprintln!("[bench] {step}");
}

/// How a run ends when something stops it: `why` printed, and a failure.
fn failed(why: impl std::fmt::Display) -> ExitCode {
    eprintln!("petstore-bench: {why}");
    ExitCode::FAILURE
}

/// The end of a run of pairs only: each N's ratios printed on a line of
/// its own, the pairs named by `what`.
fn print_pairs<P>(
    sizes: &[usize],
    ran: fixtures::Result<Vec<Vec<P>>>,
    what: &str,
    ratio: fn(&P) -> f64,
) -> ExitCode {
    let all = match ran {
        Ok(all) => all,
        Err(err) => return failed(err),
    };
    for (pets, pairs) in sizes.iter().zip(&all) {
        let ratios: Vec<String> = pairs.iter().map(|p| format!("{:.3}", ratio(p))).collect();
        println!("N = {pets}: {what}, each pair: {}", ratios.join(", "));
    }
    ExitCode::SUCCESS
}

/// The last step of every run that measures one section on its own: the
/// error that stopped it printed, or the section (`markdown` of the
/// result) printed and written in place of the report's section under
/// `heading`; fails unless the goal was met.
fn write_section<T>(
    out: &Path,
    heading: &str,
    measured: fixtures::Result<T>,
    markdown: fn(&T, &str) -> String,
    goal_met: fn(&T) -> bool,
) -> ExitCode {
    let result = match measured {
        Ok(result) => result,
        Err(err) => return failed(err),
    };
    let section = markdown(&result, &command_line());
    println!("{section}");
    let existing = std::fs::read_to_string(out).unwrap_or_default();
    let report = bench::report::replace_section(&existing, heading, &section);
    if let Err(err) = std::fs::write(out, report) {
        return failed(format_args!("writing {}: {err}", out.display()));
    }
    eprintln!(
        "wrote the section \"{}\" of {}",
        heading.trim_start_matches(['\n', '#', ' ']),
        out.display()
    );
    if goal_met(&result) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The command line this run was started with, as a user types it.
fn command_line() -> String {
    // What was run: hack/bench.sh runs the release build.
    let runner = if cfg!(debug_assertions) {
        "cargo run -p petstore-bench --"
    } else {
        "hack/bench.sh"
    };
    std::iter::once(runner.to_owned())
        .chain(std::env::args().skip(1))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The --plans run: measures, then rewrites the report's plans section.
fn plans(args: &Args, pets: usize, out: &Path) -> ExitCode {
    use bench::plans::{PlansConfig, ROUNDS, SECTION, markdown, measure};
    let config = PlansConfig {
        pets,
        concurrency: args.config().concurrency,
        rounds: ROUNDS,
    };
    let measured = measure(&config, &progress);
    write_section(out, SECTION, measured, markdown, |r| r.goal_met())
}

/// The --fairness run: measures, then rewrites the report's fairness
/// section.
fn fairness(pets: usize, out: &Path) -> ExitCode {
    use bench::fairness::{FairnessConfig, SECTION, markdown, measure};
    let measured = measure(&FairnessConfig { pets }, &progress);
    write_section(out, SECTION, measured, markdown, |r| r.goal_met())
}

/// The --import run: measures, then rewrites the report's import section.
fn import(records: usize, out: &Path) -> ExitCode {
    use bench::import::{ImportConfig, SECTION, markdown, measure};
    let measured = measure(&ImportConfig { records }, &progress);
    write_section(out, SECTION, measured, markdown, |r| r.goal_met())
}

/// The --token-cost run: measures, then rewrites the report's token cost
/// section.
fn token_cost(args: &Args, window: std::time::Duration, out: &Path) -> ExitCode {
    use bench::token_cost::{SECTION, TokenCostConfig, markdown, measure};
    let config = TokenCostConfig {
        pets_per_namespace: args.token_cost_pets,
        window,
    };
    let measured = measure(&config, &progress);
    write_section(out, SECTION, measured, markdown, |r| r.goal_met())
}

/// The --spread run: measures, then rewrites the report's spread section.
fn spread(args: &Args, pets: usize, out: &Path) -> ExitCode {
    use bench::spread::{NAMESPACES, SECTION, SpreadConfig, markdown, measure};
    let config = SpreadConfig {
        pets,
        namespaces: args.spread_namespaces.unwrap_or(NAMESPACES),
        bench: args.config(),
    };
    let measured = measure(&config, &progress);
    write_section(out, SECTION, measured, markdown, |r| r.goal_met())
}

/// The --rotation run: measures, then rewrites the report's rotation
/// section.
fn rotation(args: &Args, window: std::time::Duration, out: &Path) -> ExitCode {
    use bench::rotation::{RotationConfig, SECTION, markdown, measure};
    let config = RotationConfig {
        pets: args.pets,
        window,
        period: args.rotation_period,
    };
    let measured = measure(&config, &progress);
    write_section(out, SECTION, measured, markdown, |r| r.goal_met())
}

/// The --flood run: measures, then rewrites the report's flood section.
fn flood(args: &Args, window: std::time::Duration, out: &Path) -> ExitCode {
    use bench::flood::{FloodConfig, SECTION, markdown, measure};
    let config = FloodConfig {
        pets: args.pets,
        window,
        ghz: (
            bench::flood::FLOOD_CONCURRENCY,
            bench::flood::FLOOD_CONNECTIONS,
        ),
    };
    let measured = measure(&config, &progress);
    write_section(out, SECTION, measured, markdown, |r| r.goal_met())
}

/// The --pacing run: measures, then rewrites the report's pacing section.
fn at_scale(args: &Args, pets: usize, out: &Path) -> ExitCode {
    use bench::at_scale::{SECTION, markdown, measure};
    progress(&format!("the operator alone, N = {pets}"));
    write_section(out, SECTION, measure(&args.config(), pets), markdown, |r| {
        r.goal_met()
    })
}

fn pacing(args: &Args, pets: Option<usize>, out: &Path) -> ExitCode {
    use bench::pacing::{SECTION, markdown, measure};
    let config = args.pacing_config(pets);
    let measured = measure(&config, &progress);
    write_section(out, SECTION, measured, markdown, |r| r.goal_met())
}

/// The sections measured by runs of their own (each mode's flag): a full
/// run keeps them as they were.
const KEPT_SECTIONS: [&str; 11] = [
    bench::at_scale::SECTION,
    bench::idle::SECTION,
    bench::idle::OBSERVE_SECTION,
    bench::plans::SECTION,
    bench::import::SECTION,
    bench::fairness::SECTION,
    bench::token_cost::SECTION,
    bench::spread::SECTION,
    bench::rotation::SECTION,
    bench::flood::SECTION,
    bench::pacing::SECTION,
];

fn main() -> ExitCode {
    let args = Args::parse();
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| fixtures::repo_root().join("BENCHMARKS.md"));
    // Lives until the run ends; the processes the run starts inherit the
    // exporter's environment.
    let _receiver = if args.tracing {
        match start_trace_receiver() {
            Ok(receiver) => Some(receiver),
            Err(err) => return failed(format_args!("starting the trace receiver: {err}")),
        }
    } else {
        None
    };
    if let (Some(side), Some(cpu)) = (&args.side, args.cpu) {
        let Some(side) = bench::side_by_side::Side::from_name(side) else {
            return failed(format_args!("--side is floor or operator, not {side:?}"));
        };
        // Before any thread starts: every thread and process of the run
        // inherits the core.
        let ran = bench::side_by_side::pin_to(cpu).and_then(|()| match args.spread_namespaces {
            Some(namespaces) => bench::spread::run_side(&args.config(), side, namespaces),
            None => bench::side_by_side::run_side(&args.config(), side),
        });
        return match ran {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => failed(format_args!("the {} side: {err}", side.name())),
        };
    }
    if let Some(runs) = args.side_by_side {
        use bench::side_by_side::Sides;
        let sides = match runs {
            SideBySideRuns::FloorOperator => Sides::FloorOperator,
            SideBySideRuns::Floors => Sides::Floors,
            SideBySideRuns::Operators => Sides::Operators,
        };
        let config = args.config();
        return print_pairs(
            &config.sizes,
            bench::side_by_side::run(&config, sides, progress),
            "side by side",
            bench::side_by_side::SideBySide::ratio,
        );
    }
    if let Some(window) = args.idle {
        return idle(&args, window, &out);
    }
    if let Some(pets) = args.plans {
        return plans(&args, pets, &out);
    }
    if let Some(window) = args.token_cost {
        return token_cost(&args, window, &out);
    }
    if let Some(pets) = args.fairness {
        return fairness(pets, &out);
    }
    if let Some(records) = args.import {
        return import(records, &out);
    }
    if let Some(pets) = args.spread {
        return spread(&args, pets, &out);
    }
    if let Some(window) = args.rotation {
        return rotation(&args, window, &out);
    }
    if let Some(window) = args.flood {
        return flood(&args, window, &out);
    }
    if let Some(pets) = args.pacing {
        return pacing(&args, pets, &out);
    }
    if let Some(pets) = args.at_scale {
        return at_scale(&args, pets, &out);
    }
    if args.operator_alone {
        return match bench::run_operator_alone(&args.config(), progress) {
            Ok(_) => ExitCode::SUCCESS,
            Err(err) => failed(err),
        };
    }
    if args.pairs_only {
        let config = args.config();
        return print_pairs(
            &config.sizes,
            bench::run_pairs(&config, progress),
            "operator ÷ floor",
            bench::convergence::Pair::ratio,
        );
    }
    let results = match bench::run_all(&args.config(), progress) {
        Ok(results) => results,
        Err(err) => return failed(err),
    };
    let existing = std::fs::read_to_string(&out).unwrap_or_default();
    let mut report = report(&args, &results, &out);
    for heading in KEPT_SECTIONS {
        report = bench::report::keep_section(&report, &existing, heading);
    }
    if let Err(err) = std::fs::write(&out, &report) {
        return failed(format_args!("writing {}: {err}", out.display()));
    }
    if args.store_only {
        println!("{}", bench::store_markdown(&results));
    } else {
        println!("{report}");
    }
    eprintln!("wrote {}", out.display());
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("petstore-bench").chain(args.iter().copied()))
    }

    #[test]
    fn cli_is_well_formed() {
        Args::command().debug_assert();
    }

    #[test]
    fn flags_override_the_run_they_start_from() {
        let config = parse(&[
            "--sizes",
            "1000,5000",
            "--pairs",
            "1",
            "--floor-as",
            "admin",
            "--poll-max-rate",
            "0",
            "--smoke",
        ])
        .expect("valid flags")
        .config();
        assert_eq!(config.sizes, [1000, 5000]);
        assert_eq!(config.pairs, 1);
        assert_eq!(config.floor_identity, FloorIdentity::Admin);
        assert_eq!(config.poll_max_rate, 0);
        // The rest is the smoke run's, whatever the order of the flags.
        assert_eq!(config.concurrency, BenchConfig::smoke().concurrency);

        let full = parse(&[]).expect("no flags").config();
        assert_eq!(full.sizes, BenchConfig::full().sizes);
        assert_eq!(full.scale_records, BenchConfig::full().scale_records);
    }

    #[test]
    fn a_side_gets_the_flags_its_pair_passes() {
        let side = parse(&[
            "--side",
            "floor",
            "--cpu",
            "1",
            "--sizes",
            "5000",
            "--floor-as",
            "admin",
            "--concurrency",
            "4",
        ])
        .expect("the flags side_by_side passes");
        assert_eq!((side.side.as_deref(), side.cpu), (Some("floor"), Some(1)));
        let config = side.config();
        assert_eq!(
            (config.sizes[..].to_vec(), config.concurrency),
            (vec![5000], 4)
        );
        assert!(parse(&["--side", "floor"]).is_err(), "--side needs --cpu");
        assert!(parse(&["--side-by-side", "floors", "--pairs-only"]).is_err());
        assert!(parse(&["--side-by-side", "floor-operator", "--sizes", "5000"]).is_ok());
    }

    #[test]
    fn each_part_can_be_left_out() {
        let operator = parse(&["--skip-store"]).expect("valid").config();
        assert!(operator.store_concurrencies.is_empty());
        assert!(!operator.sizes.is_empty());
        let store = parse(&["--store-only", "--scale", "0"])
            .expect("valid")
            .config();
        assert!(store.sizes.is_empty());
        assert!(!store.store_concurrencies.is_empty());
        assert_eq!(store.scale_records, None, "--scale 0 skips the large store");
    }

    #[test]
    fn bad_values_and_conflicts_are_refused() {
        for args in [
            &["--pairs", "0"][..],
            &["--pairs", "three"],
            &["--sizes", "1000,,5000"],
            &["--sizes", "1000,0"],
            &["--floor-as", "root"],
            &["--poll-max-rate", "-1"],
            &["--scale", "many"],
            &["--skip-store", "--store-only"],
            &["--skip-store", "--scale", "1000"],
            &["--store-only", "--sizes", "1000"],
            &["--store-only", "--pairs", "1"],
            &["--store-only", "--tracing"],
            &["--idle", "0s"],
            &["--idle", "2h"],
            &["--idle", "soon"],
            &["--idle", "10m", "--store-only"],
            &["--idle-observe"],
            &["--plans", "0"],
            &["--plans", "1000", "--idle", "10m"],
            &["--plans", "1000", "--smoke"],
            &["--import", "0"],
            &["--import", "many"],
            &["--import", "10000", "--smoke"],
            &["--import", "10000", "--plans", "1000"],
            &["--import", "10000", "--idle", "10m"],
            &["--import", "10000", "--store-only"],
            &["--import", "10000", "--tracing"],
            &["--import", "10000", "--sizes", "1000"],
            &["--unknown"],
        ] {
            assert!(parse(args).is_err(), "{args:?} accepted");
        }
    }

    #[test]
    fn import_takes_a_number_of_records() {
        let args = parse(&["--import", "10000"]).expect("valid");
        assert_eq!(
            (args.import, args.plans, args.idle),
            (Some(10000), None, None)
        );
        assert!(parse(&["--import", "10000", "--out", "report.md"]).is_ok());
    }

    #[test]
    fn spread_takes_a_number_of_pets_and_namespaces() {
        let args = parse(&["--spread"]).expect("valid");
        assert_eq!((args.spread, args.spread_namespaces), (Some(20000), None));
        let args = parse(&[
            "--spread",
            "200",
            "--spread-namespaces",
            "20",
            "--pairs",
            "1",
        ])
        .expect("valid");
        assert_eq!((args.spread, args.spread_namespaces), (Some(200), Some(20)));
        assert_eq!(args.config().pairs, 1);
        // A side of a spread pair takes the namespaces without --spread.
        let side = parse(&[
            "--side",
            "operator",
            "--cpu",
            "0",
            "--sizes",
            "200",
            "--spread-namespaces",
            "20",
        ])
        .expect("the flags a spread pair passes");
        assert_eq!(side.spread_namespaces, Some(20));
        for args in [
            &["--spread", "0"][..],
            &["--spread-namespaces", "20"],
            &["--spread", "200", "--spread-namespaces", "0"],
            &["--spread", "200", "--sizes", "100"],
            &["--spread", "200", "--fairness", "100"],
            &["--spread", "200", "--smoke"],
        ] {
            assert!(parse(args).is_err(), "{args:?} accepted");
        }
    }

    #[test]
    fn rotation_and_flood_take_a_window_and_pets() {
        let args = parse(&["--rotation"]).expect("the default window");
        assert_eq!(args.rotation, Some(std::time::Duration::from_secs(30 * 60)));
        assert_eq!(args.rotation_period, std::time::Duration::from_secs(60));
        assert_eq!(args.pets, 1000);
        let args = parse(&[
            "--rotation",
            "2m",
            "--rotation-period",
            "20s",
            "--pets",
            "50",
        ])
        .expect("a smoke's flags");
        assert_eq!(
            (args.rotation, args.rotation_period, args.pets),
            (
                Some(std::time::Duration::from_secs(120)),
                std::time::Duration::from_secs(20),
                50
            )
        );
        let args = parse(&["--flood"]).expect("the default window");
        assert_eq!(args.flood, Some(std::time::Duration::from_secs(60)));
        let args = parse(&["--flood", "10s", "--pets", "50"]).expect("a smoke's flags");
        assert_eq!(
            (args.flood, args.pets),
            (Some(std::time::Duration::from_secs(10)), 50)
        );
        for args in [
            &["--rotation", "2h"][..],
            &["--rotation-period", "20s"],
            &["--rotation", "2m", "--rotation-period", "0s"],
            &["--rotation", "2m", "--pets", "0"],
            &["--rotation", "2m", "--smoke"],
            &["--rotation", "2m", "--import", "10"],
            &["--rotation", "2m", "--flood"],
            &["--flood", "0s"],
            &["--flood", "1m", "--store-only"],
        ] {
            assert!(parse(args).is_err(), "{args:?} accepted");
        }
    }

    #[test]
    fn pacing_takes_a_number_of_pets_and_the_throttled_runs_flags() {
        use bench::pacing::PacingConfig;
        let args = parse(&["--pacing"]).expect("the default N");
        assert_eq!(args.pacing, Some(None));
        let config = args.pacing_config(None);
        let full = PacingConfig::full();
        assert_eq!(
            (
                config.pets,
                config.throttled_pets,
                config.store_rate,
                config.window
            ),
            (20_000, 400, 200, std::time::Duration::from_secs(60))
        );
        assert_eq!(config.bench.concurrency, full.bench.concurrency);
        // --smoke shrinks every default, and the flags override it, in
        // any order.
        let smoke = parse(&["--pacing", "--smoke"]).expect("a smoke");
        let config = smoke.pacing_config(smoke.pacing.flatten());
        assert_eq!(
            (config.pets, config.throttled_pets, config.window),
            (20, 40, std::time::Duration::from_secs(5))
        );
        assert_eq!(config.bench.concurrency, BenchConfig::smoke().concurrency);
        let args = parse(&[
            "--pacing-window",
            "10s",
            "--pacing",
            "500",
            "--pacing-pets",
            "80",
            "--smoke",
        ])
        .expect("every flag");
        assert_eq!(args.pacing, Some(Some(500)));
        let config = args.pacing_config(args.pacing.flatten());
        assert_eq!(
            (config.pets, config.throttled_pets, config.window),
            (500, 80, std::time::Duration::from_secs(10))
        );
        for args in [
            &["--pacing", "0"][..],
            &["--pacing", "many"],
            &["--pacing-pets", "80"],
            &["--pacing-window", "10s"],
            &["--pacing", "--pacing-pets", "0"],
            &["--pacing", "--pacing-window", "2h"],
            &["--pacing", "--sizes", "1000"],
            &["--pacing", "--pets", "50"],
            &["--pacing", "--flood"],
            &["--pacing", "--spread"],
            &["--pacing", "--store-only"],
        ] {
            assert!(parse(args).is_err(), "{args:?} accepted");
        }
        let help = Args::command().render_long_help().to_string();
        let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
        let smoke = PacingConfig::smoke();
        for stated in [
            format!("[default: {}; with --smoke: {}]", full.pets, smoke.pets),
            format!(
                "[default: {}; with --smoke: {}]",
                full.throttled_pets, smoke.throttled_pets
            ),
            format!(
                "twice its calls a second ({}; with --smoke: {})",
                full.store_rate, smoke.store_rate
            ),
            format!(
                "[default: {}s; with --smoke: {}s]",
                full.window.as_secs(),
                smoke.window.as_secs()
            ),
        ] {
            assert!(help.contains(&stated), "--help lacks {stated}: {help}");
        }
    }

    /// The defaults --help states are the configurations'.
    /// Every section BENCHMARKS.md has that a full run does not write
    /// (it writes the convergence and the store) is kept by it: a section
    /// missing from the list would be dropped by the next full run.
    #[test]
    fn a_full_run_keeps_every_section_of_its_own() {
        let written = ["## Operator convergence", "## Pet store"];
        let report = std::fs::read_to_string(fixtures::repo_root().join("BENCHMARKS.md"))
            .expect("BENCHMARKS.md");
        for heading in report.lines().filter(|line| line.starts_with("## ")) {
            if written.contains(&heading) || heading == "## Method" {
                continue;
            }
            assert!(
                KEPT_SECTIONS.iter().any(|kept| kept.trim() == heading),
                "{heading:?} would be dropped by a full run"
            );
        }
    }

    #[test]
    fn help_states_the_defaults() {
        let help = Args::command().render_long_help().to_string();
        let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
        let (full, smoke) = (BenchConfig::full(), BenchConfig::smoke());
        let join = |sizes: &[usize]| {
            sizes
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(",")
        };
        for stated in [
            format!(
                "[default: {}; with --smoke: {}]",
                join(&full.sizes),
                join(&smoke.sizes)
            ),
            format!("[default: {}; with --smoke: {}]", full.pairs, smoke.pairs),
            format!(
                "[default: {}; with --smoke: {}]",
                full.poll_max_rate, smoke.poll_max_rate
            ),
            format!(
                "[default: {}; with --smoke: {}]",
                full.scale_records.unwrap_or(0),
                smoke.scale_records.unwrap_or(0)
            ),
        ] {
            assert!(help.contains(&stated), "--help lacks {stated}: {help}");
        }
        assert_eq!(full.floor_identity, FloorIdentity::Operator);
        assert!(help.contains("[default: operator]"), "{help}");
    }
}
