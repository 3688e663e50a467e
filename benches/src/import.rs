//! `kubectl petstore import` on N records: a control plane (the CRD
//! installed, no operator) and a durable store holding N records nobody
//! owns, added with the store's own `AddPets` (untimed). The plugin, the
//! release binary as a user installs it, is then run [`ROUNDS`] times, one
//! after the other and with no warm-up, each timed from its start to its
//! exit; each must exit 0 with one Pet manifest per record.

use std::fmt::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use petstore_proto::PetStoreClient;
use petstore_proto::google::r#type::Date;
use petstore_proto::petstore::{self as pb, PetType};

use crate::procstat::PeakRss;
use crate::report::plain_verdict;
use crate::store_load::{connect, grpc_error};
use fixtures::{Env, Error, Result, Storage};

/// Where the section of the report starts; runs that do not measure it
/// keep it as it is.
pub const SECTION: &str = "\n## Import";

/// The goal, as printed: every run's records as manifests within this.
pub const GOAL: Duration = Duration::from_secs(60);

/// Timed runs of the plugin, one after the other.
pub const ROUNDS: usize = 3;

/// Records per `AddPets` call while setting up.
pub const BATCH: usize = 1000;

/// The namespace the manifests are for (`-n`); nothing is created in it.
const NAMESPACE: &str = "imported";

#[derive(Clone, Debug)]
pub struct ImportConfig {
    pub records: usize,
}

/// One run of the plugin.
#[derive(Clone, Debug, Default)]
pub struct Run {
    /// From its start to its exit.
    pub took: Duration,
    /// `kind: Pet` documents on its standard output.
    pub manifests: usize,
    /// Sampled every 10 ms.
    pub peak_rss_kib: u64,
}

#[derive(Clone, Debug, Default)]
pub struct ImportResult {
    pub records: usize,
    pub runs: Vec<Run>,
    /// The last run's summary line, from its standard error.
    pub summary: String,
    pub stamp: crate::report::Stamp,
}

impl ImportResult {
    /// The slowest run.
    pub fn max(&self) -> Duration {
        self.runs
            .iter()
            .map(|run| run.took)
            .max()
            .unwrap_or_default()
    }

    pub fn peak_rss_kib(&self) -> u64 {
        self.runs
            .iter()
            .map(|run| run.peak_rss_kib)
            .max()
            .unwrap_or_default()
    }

    /// Every run printed one manifest per record.
    pub fn every_record(&self) -> bool {
        !self.runs.is_empty() && self.runs.iter().all(|run| run.manifests == self.records)
    }

    pub fn goal_met(&self) -> bool {
        self.records > 0 && self.every_record() && self.max() < GOAL
    }
}

pub fn measure(config: &ImportConfig, progress: &dyn Fn(&str)) -> Result<ImportResult> {
    let plugin = fixtures::cargo_bin("kubectl-petstore")?;
    if !plugin.is_file() {
        return Err(fixtures::io(format!("finding {}", plugin.display()))(
            std::io::Error::from(std::io::ErrorKind::NotFound),
        ));
    }
    let rt = crate::runtime()?;
    let env = Env::start(Storage::Durable)?;
    progress(&format!(
        "import: adding {} records, {BATCH} per AddPets",
        config.records
    ));
    rt.block_on(add_records(&env.store.addr, config.records))?;

    let stamp = crate::report::Stamp::now();
    let mut runs = Vec::new();
    let mut summary = String::new();
    for round in 0..ROUNDS {
        progress(&format!(
            "import: kubectl petstore import of {} records, run {} of {ROUNDS}",
            config.records,
            round + 1
        ));
        let (run, stderr) = import_once(&plugin, &env)?;
        progress(&format!(
            "import: {} manifests in {:.2} s, peak RSS {:.1} MiB",
            run.manifests,
            run.took.as_secs_f64(),
            run.peak_rss_kib as f64 / 1024.0
        ));
        runs.push(run);
        summary = stderr.trim().to_owned();
    }
    Ok(ImportResult {
        records: config.records,
        runs,
        summary,
        stamp,
    })
}

/// `count` records nobody owns, [`BATCH`] per `AddPets` call.
async fn add_records(addr: &str, count: usize) -> Result<()> {
    let mut client = PetStoreClient::new(connect(addr).await?);
    let mut added = 0;
    while added < count {
        let batch = BATCH.min(count - added);
        let pets = (added..added + batch).map(record).collect();
        let reply = client
            .add_pets(pb::AddPetsReq { pets })
            .await
            .map_err(grpc_error)?
            .into_inner();
        if reply.ids.len() != batch {
            return Err(grpc_error(format!(
                "AddPets of {batch} records answered {} IDs",
                reply.ids.len()
            )));
        }
        added += batch;
    }
    Ok(())
}

/// A record as a team that kept pets in the store before Kubernetes would
/// have: no idempotency key, no identity.
fn record(i: usize) -> pb::Pet {
    let types = [
        PetType::PtCanine,
        PetType::PtFeline,
        PetType::PtBird,
        PetType::PtReptile,
    ];
    pb::Pet {
        name: format!("Stray {i}"),
        r#type: types[i % types.len()].into(),
        birthday: Some(Date {
            year: 2019,
            month: 1 + (i % 12) as i32,
            day: 1 + (i % 28) as i32,
        }),
        ..Default::default()
    }
}

/// One timed run of the plugin binary, with the control plane's
/// kubeconfig; and its standard error.
fn import_once(plugin: &Path, env: &Env) -> Result<(Run, String)> {
    let started = Instant::now();
    let child = Command::new(plugin)
        .env("KUBECONFIG", &env.cp.kubeconfig)
        .args([
            "import",
            "-n",
            NAMESPACE,
            "--petstore-addr",
            &env.store.addr,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(fixtures::io("starting kubectl-petstore import"))?;
    // spawn returns once the plugin is exec'd: every sample is its own.
    let peak = PeakRss::start(child.id());
    let output = child
        .wait_with_output()
        .map_err(fixtures::io("waiting for kubectl-petstore import"))?;
    let took = started.elapsed();
    let peak_rss_kib = peak.stop();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    if !output.status.success() {
        return Err(Error::Command {
            command: "kubectl petstore import".into(),
            status: output.status.to_string(),
            stderr,
        });
    }
    Ok((
        Run {
            took,
            manifests: stdout.matches("kind: Pet").count(),
            peak_rss_kib,
        },
        stderr,
    ))
}

/// The report's section.
pub fn markdown(result: &ImportResult, command: &str) -> String {
    let n = result.records;
    let mut out = crate::report::measured_section(
        SECTION,
        command,
        &result.stamp,
        &format!(
            "On a control plane with the Pet CRD installed and no operator, a durable store held {n} records that no Pet owns, added beforehand with the store's own `AddPets`, {BATCH} per call (not timed). `kubectl petstore import -n {NAMESPACE} --petstore-addr <store>` (the plugin binary, run directly with the control plane's kubeconfig) lists the cluster's Pets, reads every record with `SearchPets` and prints a Pet manifest per record it may adopt; it was run {} times, one after the other and with no warm-up run, each timed from its start to its exit, its manifests counted (`kind: Pet`) and its peak RSS sampled every 10 ms.",
            result.runs.len(),
        ),
    );
    let _ = writeln!(
        out,
        "| manifests printed, every run | {n} of {n} | {} | {} |",
        result
            .runs
            .iter()
            .map(|run| run.manifests.to_string())
            .collect::<Vec<_>>()
            .join(", "),
        plain_verdict(result.every_record()),
    );
    let _ = writeln!(
        out,
        "| {n} records as manifests, each run / max | max < {:.0} s | {} / {} | {} |",
        GOAL.as_secs_f64(),
        result
            .runs
            .iter()
            .map(|run| seconds(run.took))
            .collect::<Vec<_>>()
            .join(", "),
        seconds(result.max()),
        plain_verdict(result.max() < GOAL && !result.runs.is_empty()),
    );
    let _ = writeln!(
        out,
        "| the plugin's peak RSS, each run |  | {} |  |",
        result
            .runs
            .iter()
            .map(|run| format!("{:.1} MiB", run.peak_rss_kib as f64 / 1024.0))
            .collect::<Vec<_>>()
            .join(", "),
    );
    if !result.summary.is_empty() {
        let _ = writeln!(out, "\nThe plugin's summary: \"{}\"", result.summary);
    }
    out
}

fn seconds(duration: Duration) -> String {
    format!("{:.2} s", duration.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(secs: f64, manifests: usize) -> Run {
        Run {
            took: Duration::from_secs_f64(secs),
            manifests,
            peak_rss_kib: 40 * 1024,
        }
    }

    fn result(runs: Vec<Run>) -> ImportResult {
        ImportResult {
            records: 10_000,
            runs,
            summary:
                "10000 of 10000 records as Pet manifests; left out: 0 owned by Pets of this cluster"
                    .into(),
            stamp: crate::report::Stamp {
                started_at: "2026-11-27 10:00 UTC".into(),
                commit: "abc1234".into(),
            },
        }
    }

    fn row<'a>(section: &'a str, starts: &str) -> &'a str {
        section
            .lines()
            .find(|line| line.starts_with(starts))
            .unwrap_or_default()
    }

    #[test]
    fn the_section_gives_each_run_and_judges_the_slowest() {
        let section = markdown(
            &result(vec![run(4.2, 10_000), run(3.9, 10_000), run(4.05, 10_000)]),
            "hack/bench.sh --import 10000",
        );
        assert!(section.starts_with(SECTION.trim_start()), "{section}");
        assert!(
            section.contains("Measured with `hack/bench.sh --import 10000` on commit abc1234"),
            "{section}"
        );
        assert_eq!(
            row(&section, "| manifests printed"),
            "| manifests printed, every run | 10000 of 10000 | 10000, 10000, 10000 | met |"
        );
        assert_eq!(
            row(&section, "| 10000 records as manifests"),
            "| 10000 records as manifests, each run / max | max < 60 s | 4.20 s, 3.90 s, 4.05 s / 4.20 s | met |"
        );
        assert!(
            row(&section, "| the plugin's peak RSS").contains("40.0 MiB, 40.0 MiB, 40.0 MiB"),
            "{section}"
        );
        assert!(section.contains("The plugin's summary: \"10000 of 10000 records"));
        // A section is found by its heading's first occurrence.
        for other in [
            crate::plans::SECTION,
            crate::idle::SECTION,
            crate::idle::OBSERVE_SECTION,
        ] {
            assert!(!other.contains(SECTION) && !SECTION.contains(other));
        }
    }

    #[test]
    fn one_slow_run_or_a_missing_manifest_fails_the_goal() {
        assert!(result(vec![run(4.0, 10_000); 3]).goal_met());
        let slow = result(vec![run(4.0, 10_000), run(60.0, 10_000), run(4.0, 10_000)]);
        assert!(!slow.goal_met(), "60 s is not under 60 s");
        assert!(
            row(&markdown(&slow, "bench"), "| 10000 records").ends_with("| not met |"),
            "{}",
            markdown(&slow, "bench")
        );
        let short = result(vec![run(4.0, 10_000), run(4.0, 9_999), run(4.0, 10_000)]);
        assert!(!short.goal_met());
        assert!(row(&markdown(&short, "bench"), "| manifests printed").ends_with("| not met |"));
        assert!(!result(vec![]).goal_met(), "no run, no goal met");
    }
}
