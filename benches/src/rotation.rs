//! Certificates rotated live for a long window (issue #50, "Rotated live"):
//! the store and the operator with mutual TLS from files, as the rotation
//! story sets them up (the store's from a directory laid out as a Secret
//! volume, the operator's from plain files replaced by `mv`), N Pets
//! converged, then renamed without pause through the API server while a
//! file changes every period. The changes follow [`CYCLE`]: each cycle
//! moves both sides to a new CA by the documented procedure (trust both,
//! move the leaves, trust the new only), so over the window the CA changes
//! several times and each side gets a new leaf every cycle.
//!
//! Each change is timed until the new file is in use, as the story defines
//! it: the store presents its new certificate in a handshake; the
//! operator has reloaded and made a connection with its new files; the
//! store has reloaded its client CA. Failed store calls are read from the
//! operator's metrics (by outcome) and the store's (by code), restarts
//! from the two processes' PIDs.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kube::api::{Api, Patch, PatchParams};
use petstore_operator::crd::Pet;

use crate::apimetrics;
use crate::convergence::{
    NAMESPACE, Shows, Tracker, create_pets, kube_error, shipped_options, start_leader, warmed_up,
};
use fixtures::certs::{Pki, SecretVolume};
use fixtures::petstore::StoreTls;
use fixtures::rotation::{self, alive, bundle, der, presented, replace};
use fixtures::{Env, Result, Storage};

/// Where the section of the report starts; runs that do not measure it
/// keep it as it is.
pub const SECTION: &str = "\n## Certificate rotation";

/// The issue's bound: the new certificate in use within this long of the
/// file change.
pub const IN_USE_BOUND: Duration = Duration::from_secs(5);

/// How long a change is watched for before it counts as never in use.
const GIVE_UP: Duration = Duration::from_secs(30);

/// Renames through the API server, per second, for the whole window.
pub const EDITS_PER_SECOND: u64 = 4;

#[derive(Clone, Debug)]
pub struct RotationConfig {
    pub pets: usize,
    pub window: Duration,
    pub period: Duration,
}

/// One file change. A cycle of them moves both sides from one CA to the
/// next, as docs/security.md says to rotate a CA without a failed call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// The operator's CA file: the old CA and the new.
    OperatorTrustsBoth,
    /// The store's client CA: the old CA and the new.
    StoreTrustsBoth,
    /// The store's certificate and key: a new leaf from the new CA.
    StoreLeaf,
    /// The operator's certificate and key: a new leaf from the new CA.
    OperatorLeaf,
    /// The operator's CA file: the new CA only.
    OperatorTrustsNew,
    /// The store's client CA: the new CA only. The CA has moved.
    StoreTrustsNew,
}

/// The changes of one CA move, in order.
pub const CYCLE: [Step; 6] = [
    Step::OperatorTrustsBoth,
    Step::StoreTrustsBoth,
    Step::StoreLeaf,
    Step::OperatorLeaf,
    Step::OperatorTrustsNew,
    Step::StoreTrustsNew,
];

impl Step {
    pub fn describe(self) -> &'static str {
        match self {
            Self::OperatorTrustsBoth => "operator trusts old + new CA",
            Self::StoreTrustsBoth => "store takes clients of old + new CA",
            Self::StoreLeaf => "store certificate from the new CA",
            Self::OperatorLeaf => "operator certificate from the new CA",
            Self::OperatorTrustsNew => "operator trusts the new CA only",
            Self::StoreTrustsNew => "store takes clients of the new CA only",
        }
    }
}

/// When each change is made, from the start of the window: one at once,
/// then one each `period`, while the window lasts; the steps follow
/// [`CYCLE`] round and round.
pub fn schedule(window: Duration, period: Duration) -> Vec<(Duration, Step)> {
    if period.is_zero() {
        return Vec::new();
    }
    (0u32..)
        .map(|k| period * k)
        .take_while(|at| *at < window)
        .zip(CYCLE.iter().copied().cycle())
        .collect()
}

/// One change as measured.
#[derive(Clone, Debug)]
pub struct Rotation {
    pub step: Step,
    /// From the file change until the new file was in use; `None` if it
    /// was not within [`GIVE_UP`].
    pub in_use: Option<Duration>,
}

#[derive(Clone, Debug, Default)]
pub struct RotationResult {
    pub pets: usize,
    pub window: Duration,
    pub period: Duration,
    pub rotations: Vec<Rotation>,
    /// Renames the API server took, and those it refused.
    pub edits: u64,
    pub refused_edits: u64,
    /// The operator's store calls in the window: answered OK, and every
    /// other outcome's count.
    pub operator_ok: u64,
    pub operator_failed: BTreeMap<String, u64>,
    /// The store's answers in the window other than OK, by method and code.
    pub store_not_ok: BTreeMap<String, u64>,
    /// The processes whose PID changed or that exited.
    pub restarted: Vec<&'static str>,
    /// Reloads over the run: the store's (ok, failed), the operator's.
    pub store_reloads: (u64, u64),
    pub operator_reloads: (u64, u64),
    /// Every Pet Ready for its last rename, once the window was over.
    pub settled: bool,
    pub load: String,
    pub stamp: crate::report::Stamp,
}

impl RotationResult {
    /// The measured changes' times to in use.
    pub fn in_use_times(&self) -> Vec<Duration> {
        let mut times: Vec<Duration> = self.rotations.iter().filter_map(|r| r.in_use).collect();
        times.sort();
        times
    }

    /// Changes never seen in use.
    pub fn never_in_use(&self) -> usize {
        self.rotations.iter().filter(|r| r.in_use.is_none()).count()
    }

    /// CA moves completed: the changes that left the store trusting the
    /// new CA only.
    pub fn ca_moves(&self) -> usize {
        self.rotations
            .iter()
            .filter(|r| r.step == Step::StoreTrustsNew)
            .count()
    }

    pub fn operator_failed_total(&self) -> u64 {
        self.operator_failed.values().sum()
    }

    pub fn goal_met(&self) -> bool {
        !self.rotations.is_empty()
            && self.operator_failed_total() == 0
            && self.restarted.is_empty()
            && self.never_in_use() == 0
            && quantile(&self.in_use_times(), 1.0) <= IN_USE_BOUND
    }
}

/// The `q`-quantile of `sorted` (nearest rank); zero if empty.
pub fn quantile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// "p50 / p99 / max" of `sorted`, each as `shown` writes it.
pub(crate) fn p50_p99_max(sorted: &[Duration], shown: fn(Duration) -> String) -> String {
    format!(
        "{} / {} / {}",
        shown(quantile(sorted, 0.5)),
        shown(quantile(sorted, 0.99)),
        shown(quantile(sorted, 1.0))
    )
}

/// The sum of `metric`'s samples by the labels `keys` name, joined by `/`,
/// leaving out those whose `skip` label is `skip_value`.
fn by_labels(
    metrics: &str,
    metric: &str,
    keys: &[&str],
    (skip, skip_value): (&str, &str),
) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for (labels, value) in apimetrics::samples(metrics, metric) {
        if apimetrics::label(labels, skip) == skip_value {
            continue;
        }
        let key = keys
            .iter()
            .map(|key| apimetrics::label(labels, key))
            .collect::<Vec<_>>()
            .join("/");
        *counts.entry(key).or_default() += value as u64;
    }
    counts
}

/// The operator's store calls that did not end OK, by outcome.
pub fn operator_failed(metrics: &str) -> BTreeMap<String, u64> {
    by_labels(
        metrics,
        "petstore_operator_store_call_duration_seconds_count",
        &["outcome"],
        ("outcome", "OK"),
    )
}

/// The store's answers other than OK, by method and code.
pub fn store_not_ok(metrics: &str) -> BTreeMap<String, u64> {
    by_labels(
        metrics,
        "petstore_server_rpc_duration_seconds_count",
        &["method", "code"],
        ("code", "OK"),
    )
}

/// The files both sides read, and the CAs so far.
struct Files {
    dir: PathBuf,
    cas: Vec<Pki>,
    volume: SecretVolume,
    operator_ca: PathBuf,
    operator_cert: PathBuf,
    operator_key: PathBuf,
    /// A client certificate of each CA, for the probe's handshakes.
    probes: Vec<(PathBuf, PathBuf)>,
    issued: usize,
}

impl Files {
    fn create(dir: &Path) -> Result<Self> {
        let ca = Pki::create(&dir.join("ca-0"), "rotation-0", &[])?;
        let store = ca.issue_server("store-0")?;
        let operator = ca.issue_client("operator-0")?;
        let probe = ca.issue_client("probe-0")?;
        let volume = SecretVolume::create(
            &dir.join("store-volume"),
            &[
                ("tls.crt", &store.0),
                ("tls.key", &store.1),
                ("ca.crt", &ca.ca_cert),
            ],
        )?;
        let own = dir.join("operator");
        std::fs::create_dir_all(&own).map_err(fixtures::io("the operator's directory"))?;
        let files = Self {
            dir: dir.to_owned(),
            operator_ca: own.join("ca.crt"),
            operator_cert: own.join("tls.crt"),
            operator_key: own.join("tls.key"),
            volume,
            cas: vec![ca],
            probes: vec![probe],
            issued: 0,
        };
        replace(&files.operator_ca, &[&files.cas[0].ca_cert])?;
        replace(&files.operator_cert, &[&operator.0])?;
        replace(&files.operator_key, &[&operator.1])?;
        Ok(files)
    }

    /// The CA being moved from, and the one being moved to (made on
    /// first use).
    fn old_and_new(&mut self, cycle: usize) -> Result<(usize, usize)> {
        if self.cas.len() < cycle + 2 {
            let next = cycle + 1;
            let ca = Pki::create(
                &self.dir.join(format!("ca-{next}")),
                &format!("rotation-{next}"),
                &[],
            )?;
            self.probes.push(ca.issue_client(&format!("probe-{next}"))?);
            self.cas.push(ca);
        }
        Ok((cycle, cycle + 1))
    }

    fn name(&mut self, what: &str) -> String {
        self.issued += 1;
        format!("{what}-{}", self.issued)
    }
}

/// What tells that a change is in use.
struct Watch<'a> {
    store_addr: &'a str,
    store_metrics: &'a str,
    operator_metrics: &'a str,
}

impl Watch<'_> {
    fn operator_in_use(&self, change: impl FnOnce() -> Result<()>) -> Result<Option<Duration>> {
        let reloads = rotation::operator_reloads(self.operator_metrics, "ok");
        let connections = rotation::operator_connections(self.operator_metrics, "ok");
        in_use_after("the operator's new files in use", change, || {
            rotation::operator_reloads(self.operator_metrics, "ok") > reloads
                && rotation::operator_connections(self.operator_metrics, "ok") > connections
        })
    }

    fn store_reloaded(&self, change: impl FnOnce() -> Result<()>) -> Result<Option<Duration>> {
        let reloads = rotation::store_reloads(self.store_metrics, "ok");
        in_use_after("the store's new client CA", change, || {
            rotation::store_reloads(self.store_metrics, "ok") > reloads
        })
    }
}

/// Makes `change` and times it until `in_use` holds; `None` if that takes
/// longer than [`GIVE_UP`], which the report counts as never in use.
fn in_use_after(
    what: &str,
    change: impl FnOnce() -> Result<()>,
    in_use: impl FnMut() -> bool,
) -> Result<Option<Duration>> {
    let changed = Instant::now();
    change()?;
    Ok(rotation::took(what, changed, GIVE_UP, in_use).ok())
}

/// Makes the change `step` of cycle `cycle` and times it until in use.
fn rotate(files: &mut Files, watch: &Watch, cycle: usize, step: Step) -> Result<Option<Duration>> {
    let (old, new) = files.old_and_new(cycle)?;
    let (old_ca, new_ca) = (
        files.cas[old].ca_cert.clone(),
        files.cas[new].ca_cert.clone(),
    );
    let both = bundle(&files.dir, &[&old_ca, &new_ca])?;
    match step {
        Step::OperatorTrustsBoth => watch.operator_in_use(|| replace(&files.operator_ca, &[&both])),
        Step::OperatorTrustsNew => {
            watch.operator_in_use(|| replace(&files.operator_ca, &[&new_ca]))
        }
        Step::OperatorLeaf => {
            let name = files.name("operator");
            let (cert, key) = files.cas[new].issue_client(&name)?;
            // Key, then certificate, back to back: the watch reads them
            // once they have been quiet for 100 ms, so it reads both.
            watch.operator_in_use(|| {
                replace(&files.operator_key, &[&key])?;
                replace(&files.operator_cert, &[&cert])
            })
        }
        Step::StoreTrustsBoth => {
            let volume = &mut files.volume;
            watch.store_reloaded(|| volume.update(&[("ca.crt", &both)]))
        }
        Step::StoreTrustsNew => {
            let volume = &mut files.volume;
            watch.store_reloaded(|| volume.update(&[("ca.crt", &new_ca)]))
        }
        Step::StoreLeaf => {
            let name = files.name("store");
            let (cert, key) = files.cas[new].issue_server(&name)?;
            let expected = der(&cert);
            // The store takes clients of both CAs at this step.
            let probe = &files.probes[old];
            let volume = &mut files.volume;
            in_use_after(
                "the store's new certificate",
                || volume.update(&[("tls.crt", &cert), ("tls.key", &key)]),
                || {
                    presented(watch.store_addr, &[&old_ca, &new_ca], (&probe.0, &probe.1)).as_ref()
                        == Some(&expected)
                },
            )
        }
    }
}

pub fn measure(config: &RotationConfig, progress: &dyn Fn(&str)) -> Result<RotationResult> {
    let rt = crate::runtime()?;
    let pki = tempfile::tempdir().map_err(fixtures::io("a temporary directory"))?;
    let mut files = Files::create(pki.path())?;
    let store_tls = StoreTls {
        ca: files.volume.path("ca.crt"),
        cert: files.volume.path("tls.crt"),
        key: files.volume.path("tls.key"),
        // For the fixtures' health check at start.
        client_cert: files.probes[0].0.clone(),
        client_key: files.probes[0].1.clone(),
    };
    let mut env = Env::start_with_store_tls(Storage::Durable, |_| Ok(Some(store_tls)))?;
    // The operator's flags name its own files.
    env.tls = Some(StoreTls {
        ca: files.operator_ca.clone(),
        cert: PathBuf::new(),
        key: PathBuf::new(),
        client_cert: files.operator_cert.clone(),
        client_key: files.operator_key.clone(),
    });
    let mut operator = start_leader(&env, &shipped_options(&env, "bench-operator"))?;
    let store_pid = env.store.process().pid();
    let operator_pid = operator.process().pid();
    let stamp = crate::report::Stamp::now();
    let n = config.pets;
    let timeout = Duration::from_secs(600) + Duration::from_millis(20 * n as u64);

    progress(&format!("rotation: {n} Pets, converging"));
    let client = rt.block_on(async {
        let client = warmed_up(&env, timeout).await?;
        let api: Api<Pet> = Api::namespaced(client.clone(), NAMESPACE);
        let mut tracker = Tracker::start(api.clone());
        create_pets(&api, n, 16).await?;
        tracker
            .all(Shows::Ready, n, 1, timeout, "every Pet Ready")
            .await?;
        Ok::<_, fixtures::Error>(client)
    })?;
    let api: Api<Pet> = Api::namespaced(client, NAMESPACE);

    let store_before = store_not_ok(&fixtures::http::scrape(&env.store.metrics_addr)?);
    let operator_metrics_before = operator.metrics()?;
    let operator_before = operator_failed(&operator_metrics_before);
    let ok_before = rotation::store_calls(&operator_metrics_before).0;

    let churn = Churn::start(&rt, api.clone(), n, EDITS_PER_SECOND, "r");

    let plan = schedule(config.window, config.period);
    progress(&format!(
        "rotation: {} changes over {} s, one each {} s, while Pets are renamed",
        plan.len(),
        config.window.as_secs(),
        config.period.as_secs()
    ));
    let watch = Watch {
        store_addr: &env.store.addr,
        store_metrics: &env.store.metrics_addr,
        operator_metrics: &operator.metrics_addr,
    };
    let started = Instant::now();
    let mut rotations = Vec::new();
    let measured = (|| -> Result<()> {
        for (index, (at, step)) in plan.iter().enumerate() {
            std::thread::sleep((started + *at).saturating_duration_since(Instant::now()));
            let cycle = index / CYCLE.len();
            let in_use = rotate(&mut files, &watch, cycle, *step)?;
            progress(&format!(
                "rotation {}/{}: {}: {}",
                index + 1,
                plan.len(),
                step.describe(),
                in_use.map_or("never in use".into(), |d| format!("in use after {d:?}"))
            ));
            rotations.push(Rotation {
                step: *step,
                in_use,
            });
        }
        std::thread::sleep((started + config.window).saturating_duration_since(Instant::now()));
        Ok(())
    })();
    let (edits, refused_edits) = churn.stop(&rt);
    measured?;
    let load = crate::report::load_average();

    let operator_metrics_after = operator.metrics()?;
    let operator_failed_now =
        apimetrics::increase(&operator_before, &operator_failed(&operator_metrics_after));
    let ok_after = rotation::store_calls(&operator_metrics_after).0;
    let store_not_ok_now = apimetrics::increase(
        &store_before,
        &store_not_ok(&fixtures::http::scrape(&env.store.metrics_addr)?),
    );
    progress("rotation: waiting for every Pet to be Ready for its last rename");
    let settled = rt
        .block_on(async {
            let mut tracker = Tracker::start(api.clone());
            let pets = api.list(&Default::default()).await.map_err(kube_error)?;
            let newest = pets
                .items
                .iter()
                .filter_map(|pet| pet.metadata.generation)
                .min()
                .unwrap_or(1);
            tracker
                .all(
                    Shows::Ready,
                    n,
                    newest,
                    Duration::from_secs(300),
                    "every Pet Ready",
                )
                .await
        })
        .is_ok();

    let mut restarted = Vec::new();
    if env.store.process().pid() != store_pid || !store_pid.is_some_and(alive) {
        restarted.push("store");
    }
    if operator.process().pid() != operator_pid || !operator_pid.is_some_and(alive) {
        restarted.push("operator");
    }
    let count = |addr: &str, read: fn(&str, &str) -> f64| {
        (read(addr, "ok") as u64, read(addr, "failed") as u64)
    };
    Ok(RotationResult {
        pets: n,
        window: config.window,
        period: config.period,
        rotations,
        edits,
        refused_edits,
        operator_ok: (ok_after - ok_before).max(0.0) as u64,
        operator_failed: operator_failed_now,
        store_not_ok: store_not_ok_now,
        restarted,
        store_reloads: count(&env.store.metrics_addr, rotation::store_reloads),
        operator_reloads: count(&operator.metrics_addr, rotation::operator_reloads),
        settled,
        load,
        stamp,
    })
}

/// Renames through the API server, a steady number a second, every Pet
/// in turn, until stopped.
pub(crate) struct Churn {
    stop: Arc<AtomicBool>,
    edits: Arc<AtomicU64>,
    refused: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Churn {
    /// Renames `pet-0` to `pet-(pets - 1)` in turn, `per_second`, to
    /// `Pet <i> <tag><round>`: another tag makes every name new again.
    pub(crate) fn start(
        rt: &tokio::runtime::Runtime,
        api: Api<Pet>,
        pets: usize,
        per_second: u64,
        tag: &str,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (edits, refused) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (stopped, done, failed, tag) = (
            Arc::clone(&stop),
            Arc::clone(&edits),
            Arc::clone(&refused),
            tag.to_owned(),
        );
        let task = rt.spawn(async move {
            let every = Duration::from_secs(1) / per_second.max(1) as u32;
            let mut ticks = tokio::time::interval(every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut edit = 0usize;
            while !stopped.load(Ordering::Relaxed) {
                ticks.tick().await;
                let (i, round) = (edit % pets, edit / pets + 1);
                let body = serde_json::json!({"spec": {"name": format!("Pet {i} {tag}{round}")}});
                let patched = api
                    .patch(
                        &format!("pet-{i}"),
                        &PatchParams::default(),
                        &Patch::Merge(&body),
                    )
                    .await;
                match patched {
                    Ok(_) => done.fetch_add(1, Ordering::Relaxed),
                    Err(_) => failed.fetch_add(1, Ordering::Relaxed),
                };
                edit += 1;
            }
        });
        Self {
            stop,
            edits,
            refused,
            task,
        }
    }

    /// Stops, and returns the renames taken and refused.
    pub(crate) fn stop(self, rt: &tokio::runtime::Runtime) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = rt.block_on(self.task);
        (
            self.edits.load(Ordering::Relaxed),
            self.refused.load(Ordering::Relaxed),
        )
    }
}

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

fn listed(counts: &BTreeMap<String, u64>) -> String {
    if counts.is_empty() {
        return "0".into();
    }
    let total: u64 = counts.values().sum();
    let each: Vec<String> = counts.iter().map(|(k, n)| format!("{k}: {n}")).collect();
    format!("{total} ({})", each.join(", "))
}

pub fn markdown(result: &RotationResult, command: &str) -> String {
    let mut out = crate::report::measured_section(
        SECTION,
        command,
        &result.stamp,
        &format!(
            "The store and one operator with their shipped settings and mutual TLS from files, as the rotation story (`tests/e2e/rotation.rs`) sets them up: the store's from a directory laid out as a Secret volume, the operator's from files replaced by `mv`. {} Pets converged, then renamed through the API server, {EDITS_PER_SECOND} a second, for a {} window, while a TLS file changed every {} s: {} changes, each cycle of six moving both sides to a new CA as docs/security.md says (the operator trusts both CAs, the store takes clients of both, the store's certificate from the new CA, the operator's, the operator trusts the new CA only, the store takes its clients only). Each change is timed until in use: the store presents its new certificate in a handshake; the operator has reloaded and made a connection with its new files; the store has reloaded its client CA. Load averages at the end: {}.",
            result.pets,
            crate::report::duration_words(result.window),
            result.period.as_secs(),
            result.rotations.len(),
            result.load,
        ),
    );
    let times = result.in_use_times();
    let in_use_met = result.never_in_use() == 0 && quantile(&times, 1.0) <= IN_USE_BOUND;
    let _ = writeln!(
        out,
        "| new certificate or CA in use after the file change, p50 / p99 / max | max ≤ {} | {}{} | {} |",
        secs(IN_USE_BOUND),
        p50_p99_max(&times, secs),
        match result.never_in_use() {
            0 => String::new(),
            never => format!("; {never} never in use within {} s", GIVE_UP.as_secs()),
        },
        crate::report::verdict(in_use_met),
    );
    let _ = writeln!(
        out,
        "| the operator's failed store calls in the window, by outcome | 0 | {} of {} | {} |",
        listed(&result.operator_failed),
        result.operator_ok + result.operator_failed_total(),
        crate::report::verdict(result.operator_failed_total() == 0),
    );
    let _ = writeln!(
        out,
        "| restarts (the store's and the operator's PIDs) | 0 | {} | {} |",
        if result.restarted.is_empty() {
            "0".to_owned()
        } else {
            result.restarted.join(", ")
        },
        crate::report::verdict(result.restarted.is_empty()),
    );
    let _ = writeln!(
        out,
        "| the store's answers other than OK in the window, by method and code | | {} | |",
        listed(&result.store_not_ok),
    );
    let _ = writeln!(
        out,
        "| changes / CA moves completed | | {} / {} | |",
        result.rotations.len(),
        result.ca_moves(),
    );
    let _ = writeln!(
        out,
        "| renames taken / refused by the API server | | {} / {} | |",
        result.edits, result.refused_edits,
    );
    let _ = writeln!(
        out,
        "| reloads, ok / failed: the store's; the operator's | | {} / {}; {} / {} | |",
        result.store_reloads.0,
        result.store_reloads.1,
        result.operator_reloads.0,
        result.operator_reloads.1,
    );
    let _ = writeln!(
        out,
        "| every Pet Ready for its last rename after the window | | {} | |",
        if result.settled { "yes" } else { "no" },
    );
    let _ = writeln!(out, "\nEach change, in order:\n");
    let _ = writeln!(out, "| # | change | in use after |\n|---|---|---|");
    for (i, rotation) in result.rotations.iter().enumerate() {
        let _ = writeln!(
            out,
            "| {} | {} | {} |",
            i + 1,
            rotation.step.describe(),
            rotation.in_use.map_or("never".into(), secs),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schedule_changes_a_file_each_period_and_moves_the_ca_each_cycle() {
        let plan = schedule(Duration::from_secs(30 * 60), Duration::from_secs(60));
        assert_eq!(plan.len(), 30);
        assert_eq!(plan[0], (Duration::ZERO, Step::OperatorTrustsBoth));
        assert_eq!(plan[29].0, Duration::from_secs(29 * 60));
        let moves = plan
            .iter()
            .filter(|(_, step)| *step == Step::StoreTrustsNew)
            .count();
        assert_eq!(moves, 5, "the CA moves several times in 30 minutes");
        // Every step of a cycle comes before the next cycle starts, in the
        // documented order: trust both, move the leaves, trust the new.
        assert_eq!(
            plan[6..12].iter().map(|(_, s)| *s).collect::<Vec<_>>(),
            CYCLE
        );
        let smoke = schedule(Duration::from_secs(120), Duration::from_secs(20));
        assert_eq!(smoke.len(), 6, "the smoke's window moves the CA once");
        assert!(schedule(Duration::from_secs(60), Duration::ZERO).is_empty());
    }

    #[test]
    fn in_the_cycle_each_side_trusts_the_new_ca_before_it_is_used() {
        let at = |step| CYCLE.iter().position(|s| *s == step).expect("in the cycle");
        assert!(at(Step::OperatorTrustsBoth) < at(Step::StoreLeaf));
        assert!(at(Step::StoreTrustsBoth) < at(Step::OperatorLeaf));
        assert!(at(Step::StoreLeaf) < at(Step::OperatorTrustsNew));
        assert!(at(Step::OperatorLeaf) < at(Step::StoreTrustsNew));
    }

    /// docs/performance.md states the method's numbers as they are here.
    #[test]
    fn the_method_in_the_docs_is_this_one() {
        let docs = std::fs::read_to_string(fixtures::repo_root().join("docs/performance.md"))
            .expect("docs/performance.md");
        let docs = docs.split_whitespace().collect::<Vec<_>>().join(" ");
        let plan = schedule(Duration::from_secs(30 * 60), Duration::from_secs(60));
        let moves = plan
            .iter()
            .filter(|(_, s)| *s == Step::StoreTrustsNew)
            .count();
        for stated in [
            format!("{EDITS_PER_SECOND} a second, for the whole window"),
            "in cycles of six".to_owned(),
            format!("({} changes, {moves} CA moves in 30 minutes)", plan.len()),
            format!("in use within {} s", IN_USE_BOUND.as_secs()),
        ] {
            assert!(
                docs.contains(&stated),
                "docs/performance.md lacks {stated:?}"
            );
        }
        assert_eq!(CYCLE.len(), 6, "\"six\" in the docs");
    }

    #[test]
    fn quantiles_are_by_nearest_rank() {
        let times: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(quantile(&times, 0.5), Duration::from_millis(50));
        assert_eq!(quantile(&times, 0.99), Duration::from_millis(99));
        assert_eq!(quantile(&times, 1.0), Duration::from_millis(100));
        assert_eq!(quantile(&[], 0.5), Duration::ZERO);
    }

    #[test]
    fn failures_are_read_by_outcome_and_code_and_counted_over_the_window() {
        let operator = "\
petstore_operator_store_call_duration_seconds_count{method=\"GetPets\",outcome=\"OK\"} 7
petstore_operator_store_call_duration_seconds_count{method=\"GetPets\",outcome=\"Unavailable\"} 2
petstore_operator_store_call_duration_seconds_count{method=\"AddPets\",outcome=\"Unavailable\"} 1
";
        let failed = operator_failed(operator);
        assert_eq!(failed.get("Unavailable"), Some(&3));
        assert_eq!(failed.len(), 1);
        let store = "\
petstore_server_rpc_duration_seconds_count{method=\"AddPets\",code=\"OK\"} 5
petstore_server_rpc_duration_seconds_count{method=\"WatchPets\",code=\"Cancelled\"} 1
";
        assert_eq!(
            store_not_ok(store).into_iter().collect::<Vec<_>>(),
            [("WatchPets/Cancelled".to_owned(), 1)]
        );
        let before = BTreeMap::from([("Unavailable".to_owned(), 3)]);
        assert!(
            apimetrics::increase(&before, &failed).is_empty(),
            "no more than before"
        );
    }

    fn result(in_use_ms: &[Option<u64>]) -> RotationResult {
        RotationResult {
            rotations: in_use_ms
                .iter()
                .zip(CYCLE.iter().cycle())
                .map(|(ms, step)| Rotation {
                    step: *step,
                    in_use: ms.map(Duration::from_millis),
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn the_goal_needs_every_change_in_use_within_the_bound_no_failure_no_restart() {
        assert!(result(&[Some(100), Some(5_000)]).goal_met());
        assert!(
            !result(&[Some(100), Some(5_001)]).goal_met(),
            "over the bound"
        );
        assert!(!result(&[Some(100), None]).goal_met(), "never in use");
        assert!(!result(&[]).goal_met(), "nothing rotated");
        let mut failed = result(&[Some(100)]);
        failed.operator_failed.insert("Unavailable".into(), 1);
        assert!(!failed.goal_met(), "a failed call");
        let mut restarted = result(&[Some(100)]);
        restarted.restarted.push("store");
        assert!(!restarted.goal_met(), "a restart");
    }

    #[test]
    fn the_section_gives_the_quantiles_and_each_change() {
        let section = markdown(
            &result(&[Some(100), Some(200), Some(6_000)]),
            "hack/bench.sh --rotation 3m",
        );
        assert!(section.starts_with("## Certificate rotation"), "{section}");
        assert!(
            section.contains("0.20 s / 6.00 s / 6.00 s | **not met**"),
            "{section}"
        );
        assert!(
            section.contains("| 3 | store certificate from the new CA | 6.00 s |"),
            "{section}"
        );
    }
}
