//! How fast the operator converges N Pets, what it costs, and the floor: a
//! baseline client that makes only the two writes any correct operator must
//! make per Pet (the finalizer patch and the status patch).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::{WatchStreamExt, watcher};
use petstore_operator::crd::{FINALIZER, Pet, PetSpec, PetType};
use serde_json::json;
use tokio::sync::watch;

use crate::apimetrics::{self, RequestCounts};
use crate::procstat;
use fixtures::env::OPERATOR_NAMESPACE;
use fixtures::{ControlPlane, Env, Error, Operator, Result, Storage, wait_for};

pub(crate) const NAMESPACE: &str = "bench";

#[derive(Clone, Debug)]
pub struct ConvergenceConfig {
    pub pets: usize,
    /// Client concurrency for creates, renames and deletes. The baseline
    /// patches at the operator's default concurrency
    /// ([`petstore_operator::controller::DEFAULT_CONCURRENCY`]), so both
    /// sides keep as many Pets in flight.
    pub concurrency: usize,
    /// Drift-poll interval of the operator restarted after convergence,
    /// over two of which steady state is watched. The converging operator
    /// runs with the default interval (5 minutes), as in production, so
    /// the store reads counted while converging are the reconciles' own.
    pub poll_interval: Duration,
    /// `--poll-max-rate` of the restarted operator (0: its default).
    pub poll_max_rate: u32,
    /// The rename storm and deletion run up to this N (they take as long
    /// as the convergence each).
    pub churn_max_pets: usize,
    pub floor_identity: FloorIdentity,
    /// If set, drift is measured a second time at this N, on an operator
    /// that polls alone (`--follow-store-changes=false`) at this interval:
    /// drift as found before the change feed, beside it.
    pub polling_drift: Option<Duration>,
    /// Flags added to the operator's shipped ones (pacing's
    /// `--store-concurrency=8`, say); none for the convergence itself.
    pub operator_args: Vec<String>,
}

impl ConvergenceConfig {
    /// The longest any wait on N Pets may take: a minute, plus 200 ms a Pet.
    fn timeout(&self) -> Duration {
        Duration::from_secs(60 + self.pets as u64 / 5)
    }
}

/// Whose credentials the floor's baseline client uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FloorIdentity {
    /// The operator's ServiceAccount token, with the operator's RBAC: every
    /// baseline request is authenticated, authorized and queued by API
    /// Priority and Fairness exactly as the operator's are.
    #[default]
    Operator,
    /// The admin certificate (group system:masters), which skips RBAC and
    /// API Priority and Fairness: about 6% faster for the same requests on
    /// this control plane, so no operator running as itself can match it.
    Admin,
}

impl FloorIdentity {
    pub fn label(self) -> &'static str {
        match self {
            FloorIdentity::Operator => "the operator's ServiceAccount",
            FloorIdentity::Admin => "the cluster admin (system:masters)",
        }
    }

    /// The floor's baseline client: as the operator's ServiceAccount, or
    /// `admin` itself.
    pub(crate) async fn client(self, env: &Env, admin: &kube::Client) -> Result<kube::Client> {
        match self {
            FloorIdentity::Operator => client_from(&env.operator_kubeconfig).await,
            FloorIdentity::Admin => Ok(admin.clone()),
        }
    }
}

/// One floor run and the operator run straight after it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Pair {
    pub floor: Duration,
    pub operator: Duration,
}

impl Pair {
    pub fn ratio(&self) -> f64 {
        self.operator.as_secs_f64() / self.floor.as_secs_f64().max(1e-9)
    }
}

/// The middle value (the mean of the middle two for an even count).
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => 0.0,
        _ if n % 2 == 1 => values[n / 2],
        _ => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

#[derive(Clone, Debug, Default)]
pub struct ConvergenceResult {
    pub pets: usize,
    /// The ratio's pairs at this N, in the order run, side by side (see
    /// `side_by_side`): the floor and the operator at the same time.
    pub pairs: Vec<Pair>,
    /// The operator's time, run just after the floor's on the two cores:
    /// the full run that every other figure below comes from.
    pub converge: Duration,
    /// Until the last Event of the convergence was written.
    pub events_written: Duration,
    /// Events the API server had received when every Pet was Ready.
    pub events_while_converging: u64,
    /// The floor's time, run just before the operator's.
    pub floor: Duration,
    pub floor_identity: FloorIdentity,
    /// CPU used while converging, by process; the floor's and the operator's
    /// (first pair).
    pub floor_cpu: CpuSplit,
    /// Conversion webhook calls the API server made while converging, in
    /// the operator's run and in the floor's (first pair).
    pub conversions: u64,
    pub floor_conversions: u64,
    pub cpu: CpuSplit,
    pub rename: Duration,
    pub delete: Duration,
    /// Operator API requests during convergence, by (resource, verb).
    pub api_requests: RequestCounts,
    pub floor_api_requests: RequestCounts,
    /// Operator store RPCs during convergence, by method.
    pub store_calls: BTreeMap<String, u64>,
    /// Those that did not end OK, by outcome (`ResourceExhausted`...).
    pub store_failed: BTreeMap<String, u64>,
    /// The operator's `petstore_operator_store_concurrency_limit` once
    /// every Pet was Ready (the largest over stores; the bench has one).
    pub store_limit: Option<f64>,
    /// Store reads (GetPets) during convergence.
    pub store_reads: u64,
    /// Writes to Pets and Events during convergence (leases excluded:
    /// they follow time, not Pets).
    pub api_writes: u64,
    /// Restart after convergence: `kill -9`, then a new process. Until
    /// every Pet was reconciled once by the new process, from its start.
    pub restart_catch_up: Duration,
    /// Of which waiting for the dead replica's Lease.
    pub restart_lease_wait: Duration,
    pub restart_api_writes: u64,
    pub restart_store_writes: u64,
    pub restart_store_reads: u64,
    pub restart_peak_rss_kib: u64,
    /// CPU by process from the new process's start until it caught up:
    /// which of them the catch-up waited on.
    pub restart_cpu: CpuSplit,
    /// Until the new process's first reconcile ended: its Lease, the
    /// Pets' first list and the store's client, before any Pet's turn.
    pub restart_first_reconcile: Option<Duration>,
    /// Every request the API server served meanwhile, by (resource, verb):
    /// the restarted operator's, and the re-watches of the API server's
    /// own informers (flowschemas, configmaps...) when one falls due.
    pub restart_api_requests: RequestCounts,
    /// Steady state on the restarted operator, over two poll intervals.
    pub steady_api_writes: u64,
    pub steady_store_writes: u64,
    pub steady_store_reads: u64,
    /// Every store call in steady state, reads or not.
    pub steady_store_calls: u64,
    /// The restarted operator's poll interval in effect.
    pub poll_interval: Duration,
    pub steady_window: Duration,
    /// CPU by process over the window: what an idle control plane and
    /// operator cost at this N.
    pub steady_cpu: CpuSplit,
    pub operator_peak_rss_kib: u64,
    /// Resident memory once converged and the Events written.
    pub operator_rss_kib: u64,
    pub operator_cpu_seconds: f64,
    pub store_peak_rss_kib: u64,
    /// Every Pet listed with kubectl as v1 and as v1alpha1, once converged.
    pub list: ListTimes,
    /// Out-of-band changes, once converged, and how soon each was undone.
    pub drift: crate::drift::DriftResult,
    /// The same on PostgreSQL with two store replicas.
    pub drift_postgres: crate::drift::DriftResult,
    /// The same on durable, found by polling alone, at this poll interval.
    pub drift_polling: Option<(Duration, crate::drift::DriftResult)>,
    /// The control plane's memory once every Pet was Ready.
    pub control_plane: ControlPlaneMemory,
    /// p99 of the operator's reconciles while the drift was put back, as
    /// the bound of its histogram's bucket (`reconcile_duration_seconds`).
    pub drift_reconcile_p99: Option<f64>,
    /// p99 of the Pets' waits for their turn meanwhile, as the bound of
    /// its histogram's bucket (`queue_wait_seconds`).
    pub drift_queue_wait_p99: Option<f64>,
}

/// What the Pets cost the control plane in memory: read where a figure is
/// reported, since its first wall as N grows is the API server's memory or
/// etcd's quota (2 GiB by default), not the operator's.
#[derive(Clone, Copy, Debug, Default)]
pub struct ControlPlaneMemory {
    pub apiserver_peak_rss_kib: u64,
    pub etcd_peak_rss_kib: u64,
    /// etcd's database file, the size its quota limits.
    pub etcd_db_bytes: u64,
}

impl ControlPlaneMemory {
    pub fn etcd_db_mib(&self) -> f64 {
        self.etcd_db_bytes as f64 / (1024.0 * 1024.0)
    }

    pub(crate) fn sample(env: &Env) -> Self {
        let peak = |pid: Option<u32>| pid.and_then(procstat::peak_rss_kib).unwrap_or(0);
        Self {
            apiserver_peak_rss_kib: peak(env.cp.apiserver_pid()),
            etcd_peak_rss_kib: peak(env.cp.etcd_pid()),
            etcd_db_bytes: std::fs::metadata(env.cp.dir().join("etcd/member/snap/db"))
                .map(|m| m.len())
                .unwrap_or(0),
        }
    }
}

/// `kubectl get pets -o json` over every Pet: as v1, the stored version,
/// and as v1alpha1, which the API server converts through the operator's
/// webhook; with the API server's defaults, and again with the
/// `ListFromCacheSnapshot` feature gate off, as Kubernetes 1.33 ships it.
///
/// Why both: kubectl reads 500 Pets a page. With the gate (on by default
/// from 1.34) every page comes from the watch cache, which holds every Pet
/// already converted to each served version. Without it only the first
/// page does, and every later page is read from etcd, each Pet of it
/// converted with a webhook call of its own.
#[derive(Clone, Debug, Default)]
pub struct ListTimes {
    pub default: ListRound,
    pub without_snapshot: ListRound,
    /// The webhook's resident memory after the v1alpha1 lists.
    pub webhook_rss_kib: u64,
}

/// Medians of [`LIST_ROUNDS`] rounds, the two lists alternating, after an
/// untimed list of each.
#[derive(Clone, Debug, Default)]
pub struct ListRound {
    pub v1: Duration,
    pub v1alpha1: Duration,
    /// The webhook's CPU per v1alpha1 list: its conversions.
    pub webhook_cpu_seconds: f64,
    /// Conversion webhook calls the API server made per v1alpha1 list.
    pub webhook_calls: u64,
}

impl ListRound {
    /// v1alpha1 ÷ v1: what the conversion webhook adds to a list.
    pub fn ratio(&self) -> f64 {
        self.v1alpha1.as_secs_f64() / self.v1.as_secs_f64().max(1e-9)
    }
}

/// The feature gate that serves every page of a list from the watch cache,
/// turned off as in Kubernetes 1.33.
const WITHOUT_LIST_SNAPSHOT: &str = "--feature-gates=ListFromCacheSnapshot=false";

const LIST_ROUNDS: usize = 3;

impl ConvergenceResult {
    /// Operator ÷ floor: the median of the side-by-side pairs' ratios.
    pub fn ratio(&self) -> f64 {
        if self.pairs.is_empty() {
            let only = Pair {
                floor: self.floor,
                operator: self.converge,
            };
            return only.ratio();
        }
        median(self.pairs.iter().map(Pair::ratio).collect())
    }

    /// Operator ÷ floor in the full run, one after the other.
    pub fn sequential_ratio(&self) -> f64 {
        self.converge.as_secs_f64() / self.floor.as_secs_f64().max(1e-9)
    }

    pub fn reads_per_pet(&self) -> f64 {
        self.store_reads as f64 / self.pets.max(1) as f64
    }

    pub fn writes_per_pet(&self) -> f64 {
        self.api_writes as f64 / self.pets.max(1) as f64
    }

    /// Drift-poll reads per second in steady state.
    pub fn poll_read_rate(&self) -> f64 {
        self.steady_store_reads as f64 / self.steady_window.as_secs_f64().max(1e-9)
    }
}

/// CPU seconds used from the first create until every Pet was Ready, by
/// process. All of them share the machine's cores, so CPU one of them uses
/// is CPU the API server cannot.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuSplit {
    pub api_server: f64,
    pub etcd: f64,
    /// The benchmark process: the creates and the watch that times them;
    /// in the floor, the baseline client too.
    pub bench: f64,
    pub operator: f64,
    pub store: f64,
}

impl CpuSplit {
    /// CPU from now, by process: the API server, etcd, this process, the
    /// operator (or the floor's webhook replica), then the operator's own
    /// store and `more_stores`.
    pub(crate) fn meter(
        env: &Env,
        operator_pid: Option<u32>,
        more_stores: impl IntoIterator<Item = Option<u32>>,
    ) -> procstat::CpuMeter {
        let mut pids = vec![
            env.cp.apiserver_pid(),
            env.cp.etcd_pid(),
            Some(std::process::id()),
            operator_pid,
            env.store.process().pid(),
        ];
        pids.extend(more_stores);
        procstat::CpuMeter::start(&pids)
    }

    /// What a [`CpuSplit::meter`] measured so far, every store summed.
    pub(crate) fn read(meter: &procstat::CpuMeter) -> Self {
        let used = meter.used();
        let at = |i: usize| used.get(i).copied().unwrap_or(0.0);
        Self {
            api_server: at(0),
            etcd: at(1),
            bench: at(2),
            operator: at(3),
            store: used.iter().skip(4).sum(),
        }
    }

    pub fn total(&self) -> f64 {
        self.api_server + self.etcd + self.bench + self.operator + self.store
    }
}

/// The floor's time, API requests and CPU.
pub struct Floor {
    pub time: Duration,
    pub requests: RequestCounts,
    pub cpu: CpuSplit,
    /// Conversion webhook calls while converging.
    pub conversions: u64,
    /// Listing the converged Pets, when asked for.
    pub list: Option<ListTimes>,
}

/// What the watch has seen of each Pet.
#[derive(Default)]
struct Seen {
    /// name -> (generation, ready-for-that-generation)
    pets: HashMap<String, (i64, bool)>,
    /// name -> the generation of the newest `status.plan` seen, and when it
    /// was first seen (Pets in `Approve` or `Observe`).
    planned: HashMap<String, (i64, Instant)>,
}

impl Seen {
    fn ready_at_least(&self, generation: i64) -> usize {
        self.pets
            .values()
            .filter(|(g, ready)| *ready && *g >= generation)
            .count()
    }

    fn planned_at_least(&self, generation: i64) -> usize {
        self.planned
            .values()
            .filter(|(g, _)| *g >= generation)
            .count()
    }

    fn note_plan(&mut self, name: &str, pet: &Pet) {
        let Some(generation) = pet
            .status
            .as_ref()
            .and_then(|s| s.plan.as_ref())
            .and_then(|p| p.generation)
        else {
            return;
        };
        if self
            .planned
            .get(name)
            .is_none_or(|(seen, _)| *seen < generation)
        {
            self.planned
                .insert(name.to_owned(), (generation, Instant::now()));
        }
    }
}

pub(crate) fn ready(pet: &Pet) -> bool {
    let generation = pet.metadata.generation;
    pet.status_id().is_some()
        && pet
            .condition("Ready")
            .is_some_and(|c| c.status == "True" && c.observed_generation == generation)
}

/// What a Pet shows that [`Tracker::all`] waits for.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Shows {
    /// Ready, for the generation.
    Ready,
    /// A plan made for the generation.
    Plan,
}

/// A watch on one namespace's Pets: what it has seen, and a tick on every
/// change.
pub(crate) struct Tracker {
    seen: Arc<Mutex<Seen>>,
    ticks: watch::Receiver<u64>,
}

impl Tracker {
    pub(crate) fn start(api: Api<Pet>) -> Self {
        Self::start_with(api, watcher::Config::default())
    }

    /// [`Tracker::start`], watching only the Pets `config` selects (by
    /// label, say, over every namespace).
    pub(crate) fn start_with(api: Api<Pet>, config: watcher::Config) -> Self {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (tick, ticks) = watch::channel(0u64);
        let state = Arc::clone(&seen);
        tokio::spawn(async move {
            // An error (the conversion webhook restarting, say) is retried
            // after a backoff: the watch goes on, and relists.
            let mut stream = watcher(api, config).default_backoff().boxed();
            while let Some(event) = stream.next().await {
                let Ok(event) = event else { continue };
                let mut seen = state.lock().expect("seen");
                match event {
                    watcher::Event::Apply(pet) | watcher::Event::InitApply(pet) => {
                        let name = pet.metadata.name.clone().unwrap_or_default();
                        let generation = pet.metadata.generation.unwrap_or(0);
                        seen.note_plan(&name, &pet);
                        seen.pets.insert(name, (generation, ready(&pet)));
                    }
                    watcher::Event::Delete(pet) => {
                        seen.pets
                            .remove(&pet.metadata.name.clone().unwrap_or_default());
                    }
                    watcher::Event::Init | watcher::Event::InitDone => {}
                }
                drop(seen);
                tick.send_modify(|n| *n += 1);
            }
        });
        Self { seen, ticks }
    }

    /// Resolves when `done` holds, re-checked on every watch event.
    async fn until(
        &mut self,
        timeout: Duration,
        what: &str,
        done: impl Fn(&Seen) -> bool,
    ) -> Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if done(&self.seen.lock().expect("seen")) {
                return Ok(());
            }
            match tokio::time::timeout_at(deadline, self.ticks.changed()).await {
                Ok(Ok(())) => {}
                // The watch's task ended: nothing will change any more.
                Ok(Err(_)) => {
                    return Err(kube_error(format!("the watch ended, waiting for {what}")));
                }
                Err(_) => return Err(Error::Timeout(timeout, what.to_owned())),
            }
        }
    }

    /// Resolves when `n` Pets show `shows` for `generation` or a later one.
    pub(crate) async fn all(
        &mut self,
        shows: Shows,
        n: usize,
        generation: i64,
        timeout: Duration,
        what: &str,
    ) -> Result<()> {
        self.until(timeout, what, |s| match shows {
            Shows::Ready => s.ready_at_least(generation) == n,
            Shows::Plan => s.planned_at_least(generation) == n,
        })
        .await
    }

    /// When each Pet first showed a plan for `generation` or a later one.
    pub(crate) fn planned_since(&self, generation: i64) -> HashMap<String, Instant> {
        let seen = self.seen.lock().expect("seen");
        seen.planned
            .iter()
            .filter(|(_, (g, _))| *g >= generation)
            .map(|(name, (_, at))| (name.clone(), *at))
            .collect()
    }
}

/// What the floor's run and the operator's both do before they measure:
/// the bench namespace, and a warm-up. The API server's first requests for
/// a new CRD are slow (it builds the handler, validators and storage); the
/// warm-up makes them outside the measurement, with Pets in a namespace of
/// their own that are not counted. Returns the admin's client.
pub(crate) async fn prepare(env: &Env) -> Result<kube::Client> {
    env.cp.ensure_namespace(NAMESPACE)?;
    env.cp.ensure_namespace("warmup")?;
    let client = client_from(&env.cp.kubeconfig).await?;
    let api: Api<Pet> = Api::namespaced(client.clone(), "warmup");
    for i in 0..WARMUP_PETS {
        let mut pet = pet(i);
        pet.spec.name = format!("Warmup {i}");
        api.create(&PostParams::default(), &pet)
            .await
            .map_err(kube_error)?;
    }
    Ok(client)
}

const WARMUP_PETS: usize = 20;

/// [`prepare`], then waits until an operator has made the warm-up Pets
/// Ready.
pub(crate) async fn warmed_up(env: &Env, timeout: Duration) -> Result<kube::Client> {
    let client = prepare(env).await?;
    Tracker::start(Api::namespaced(client.clone(), "warmup"))
        .all(Shows::Ready, WARMUP_PETS, 1, timeout, "warm-up Pets Ready")
        .await?;
    Ok(client)
}

/// Waits, at most [`QUIET_MAX`], until the control plane and the
/// operator (or the floor's webhook replica) have used less than
/// [`QUIET_CPU`] of CPU over [`QUIET_WINDOW`]. What is left of starting
/// them, of the CRD's updates (the API server rebuilds its OpenAPI) and of
/// the warm-up is then measured in neither run of a pair, rather than in
/// one and not the other.
pub(crate) async fn quiet(env: &Env, process: Option<u32>) {
    let pids = [env.cp.apiserver_pid(), env.cp.etcd_pid(), process];
    let started = Instant::now();
    let mut windows = 0;
    let quiet = loop {
        let meter = procstat::CpuMeter::start(&pids);
        tokio::time::sleep(QUIET_WINDOW).await;
        windows += 1;
        if meter.used().iter().sum::<f64>() < QUIET_CPU {
            break true;
        }
        if started.elapsed() >= QUIET_MAX {
            break false;
        }
    };
    if windows > 1 || !quiet {
        eprintln!(
            "[bench] the control plane was {} after {:.1} s",
            if quiet { "quiet" } else { "still busy" },
            started.elapsed().as_secs_f64()
        );
    }
}

const QUIET_WINDOW: Duration = Duration::from_millis(500);
/// A tenth of a core over the window.
const QUIET_CPU: f64 = 0.05;
const QUIET_MAX: Duration = Duration::from_secs(30);

/// The operator's options as it ships: the default 5-minute poll (no drift
/// poll falls inside a convergence) and production logging (debug logging
/// would be part of what is measured).
pub(crate) fn shipped_options(env: &Env, identity: &str) -> fixtures::OperatorOptions {
    let mut options = env.operator_options(identity);
    options.poll_interval = "5m";
    options.log_filter = "info";
    options
}

/// For a run that measures drift: its out-of-band changes, made as fast as
/// one client can, are a drift storm by the operator's own measure, which
/// would hold them for approval (docs/operator.md#drift-storms). The
/// correction latency measured is the operator's with the brake off.
pub(crate) fn drift_measured(mut options: fixtures::OperatorOptions) -> fixtures::OperatorOptions {
    options.extra_args.push("--drift-storm-min=0".into());
    options
}

/// Starts an operator and waits until it leads.
pub(crate) fn start_leader(env: &Env, options: &fixtures::OperatorOptions) -> Result<Operator> {
    let operator = env.start_operator_with(options)?;
    wait_for(Duration::from_secs(60), "leadership", || {
        operator
            .metrics()
            .is_ok_and(|m| is_leader(&m))
            .then_some(())
    })?;
    Ok(operator)
}

pub(crate) async fn client_from(kubeconfig: &std::path::Path) -> Result<kube::Client> {
    let kubeconfig = Kubeconfig::read_from(kubeconfig).map_err(kube_error)?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(kube_error)?;
    kube::Client::try_from(config).map_err(kube_error)
}

pub(crate) fn kube_error(err: impl std::fmt::Display) -> Error {
    Error::Command {
        command: "kube client".into(),
        status: "error".into(),
        stderr: err.to_string(),
    }
}

pub(crate) fn pet(i: usize) -> Pet {
    let types = [PetType::Dog, PetType::Cat, PetType::Bird, PetType::Reptile];
    let birthday = chrono::NaiveDate::from_ymd_opt(2020, 1, 1).expect("constant date")
        + chrono::Duration::days((i % 365) as i64);
    Pet::new(
        &format!("pet-{i}"),
        PetSpec {
            name: format!("Pet {i}"),
            pet_type: types[i % types.len()],
            birthday,
            deletion_policy: None,
            change_policy: None,
            store_ref: None,
        },
    )
}

/// Merge-patches `pet-0` to `pet-{pets - 1}`, `concurrency` at a time; when
/// each patch was answered, by Pet.
pub(crate) async fn patch_all(
    api: &Api<Pet>,
    pets: usize,
    concurrency: usize,
    patch: impl Fn(usize) -> serde_json::Value,
) -> Result<Vec<Instant>> {
    let answered = for_each_pet(pets, concurrency, |i| {
        let api = api.clone();
        let body = patch(i);
        async move {
            api.patch(
                &format!("pet-{i}"),
                &PatchParams::default(),
                &Patch::Merge(&body),
            )
            .await
            .map(|_| (i, Instant::now()))
        }
    })
    .await?;
    let mut at = vec![Instant::now(); pets];
    for (i, when) in answered {
        at[i] = when;
    }
    Ok(at)
}

/// Runs `action` for pet-0 to pet-(n - 1), `concurrency` at a time; their
/// results in the order they finished.
pub(crate) async fn for_each_pet<F, Fut, T>(
    n: usize,
    concurrency: usize,
    action: F,
) -> Result<Vec<T>>
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = std::result::Result<T, kube::Error>>,
{
    futures::stream::iter(0..n)
        .map(action)
        .buffer_unordered(concurrency)
        .try_collect::<Vec<T>>()
        .await
        .map_err(kube_error)
}

/// Creates pet-0 to pet-(n - 1), `concurrency` at a time.
pub(crate) async fn create_pets(api: &Api<Pet>, n: usize, concurrency: usize) -> Result<()> {
    for_each_pet(n, concurrency, |i| {
        let api = api.clone();
        async move { api.create(&PostParams::default(), &pet(i)).await.map(drop) }
    })
    .await
    .map(drop)
}

/// The operator's store RPCs so far, by method.
pub(crate) fn store_calls(metrics: &str) -> BTreeMap<String, u64> {
    let mut calls = BTreeMap::new();
    for (labels, value) in apimetrics::samples(
        metrics,
        "petstore_operator_store_call_duration_seconds_count",
    ) {
        *calls
            .entry(apimetrics::label(labels, "method").to_owned())
            .or_default() += value as u64;
    }
    calls
}

/// Sum of a counter (or histogram `_count`) over all its label sets.
/// The status patch the floor writes for Pet `name` at `generation`: a
/// record ID of its own and Ready, as the operator's status reads.
pub(crate) fn floor_ready_status(name: &str, generation: Option<i64>) -> serde_json::Value {
    json!({"status": {
        "id": format!("baseline-{name}"),
        "observedGeneration": generation,
        "conditions": [{
            "type": "Ready", "status": "True", "reason": "Available",
            "message": "baseline", "lastTransitionTime": "2026-01-01T00:00:00Z",
            "observedGeneration": generation,
        }],
    }})
}

pub(crate) fn metric_sum(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .filter(|line| {
            line.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|line| line.rsplit_once(' '))
        .filter_map(|(_, value)| value.trim().parse::<f64>().ok())
        .sum()
}

/// Whether this operator process holds the leader Lease: its own gauge, set
/// when it has acquired the Lease, just before it starts reconciling. The
/// Lease's holder would not tell a restarted process from the one it
/// replaces, since both have the same identity (a restarted Pod keeps its
/// name).
fn is_leader(metrics: &str) -> bool {
    metric_sum(metrics, "petstore_operator_leader") == 1.0
}

/// Reconciles the operator has finished.
fn reconciles_done(metrics: &str) -> u64 {
    metric_sum(
        metrics,
        "petstore_operator_reconcile_duration_seconds_count",
    ) as u64
}

/// Writes to Pets and Events since `before`.
pub(crate) fn writes_since(cp: &ControlPlane, before: &RequestCounts) -> Result<u64> {
    let counts = apimetrics::diff(before, &apimetrics::scrape(cp)?, &["pets", "events"]);
    Ok(counts
        .iter()
        .filter(|((_, verb), _)| WRITE_VERBS.contains(&verb.as_str()))
        .map(|(_, n)| n)
        .sum())
}

/// Requests to Pets, Events and Leases since `before`, less the benchmark's
/// own `creates` of Pets.
fn requests_since(
    cp: &ControlPlane,
    before: &RequestCounts,
    creates: usize,
) -> Result<RequestCounts> {
    let mut requests = apimetrics::diff(before, &apimetrics::scrape(cp)?, &RESOURCES);
    if let Some(posts) = requests.get_mut(&("pets".to_owned(), "POST".to_owned())) {
        *posts = posts.saturating_sub(creates as u64);
    }
    requests.retain(|_, n| *n > 0);
    Ok(requests)
}

fn store_reads(calls: &BTreeMap<String, u64>) -> u64 {
    calls.get("GetPets").copied().unwrap_or(0)
}

/// Every write RPC the store has, the compare-and-set of idempotency keys
/// (a claim or release) included: a catch-up or steady state that claims a
/// record writes it.
fn store_writes(calls: &BTreeMap<String, u64>) -> u64 {
    fixtures::petstore::WRITE_RPCS
        .iter()
        .map(|m| calls.get(*m).copied().unwrap_or(0))
        .sum()
}

const WRITE_VERBS: [&str; 4] = ["POST", "PATCH", "PUT", "DELETE"];
const RESOURCES: [&str; 3] = ["pets", "events", "leases"];

/// The operator's convergence only (its time, CPU, webhook calls and peak
/// RSS): the extra pairs need nothing else.
pub fn measure_operator_convergence(
    rt: &tokio::runtime::Runtime,
    config: &ConvergenceConfig,
) -> Result<ConvergenceResult> {
    measure_operator_with(rt, config, false, &|| {})
}

/// [`measure_operator_convergence`], with `gate` called once everything is
/// ready and quiet, just before the first create: a run side by side with
/// another starts when `gate` returns.
pub fn measure_operator_convergence_gated(
    rt: &tokio::runtime::Runtime,
    config: &ConvergenceConfig,
    gate: &dyn Fn(),
) -> Result<ConvergenceResult> {
    measure_operator_with(rt, config, false, gate)
}

/// The operator's convergence, then its restart, steady state and churn.
pub fn measure_operator(
    rt: &tokio::runtime::Runtime,
    config: &ConvergenceConfig,
) -> Result<ConvergenceResult> {
    measure_operator_with(rt, config, true, &|| {})
}

fn measure_operator_with(
    rt: &tokio::runtime::Runtime,
    config: &ConvergenceConfig,
    everything: bool,
    gate: &dyn Fn(),
) -> Result<ConvergenceResult> {
    let env = Env::start(Storage::Durable)?;
    let mut options = drift_measured(shipped_options(&env, "bench-operator"));
    options
        .extra_args
        .extend(config.operator_args.iter().map(Into::into));
    let mut operator = start_leader(&env, &options)?;
    let n = config.pets;
    let timeout = config.timeout();

    rt.block_on(async {
        let client = warmed_up(&env, timeout).await?;
        // The warm-up's Events wait for a quiet moment; they are not part
        // of what is measured.
        events_drained(&operator, timeout).await?;
        let api: Api<Pet> = Api::namespaced(client, NAMESPACE);
        let mut tracker = Tracker::start(api.clone());
        quiet(&env, operator.process().pid()).await;
        tokio::task::block_in_place(gate);
        let api_before = apimetrics::scrape(&env.cp)?;
        let metrics_before = operator.metrics()?;
        let calls_before = store_calls(&metrics_before);
        let failed_before = crate::rotation::operator_failed(&metrics_before);

        let pid = operator.process().pid();
        let run = create_all_timed(&env, &api, &mut tracker, config, pid, "all Pets Ready").await?;
        let TimedCreate {
            started,
            took: converge,
            cpu,
            conversions,
        } = run;
        // Read once every Pet is Ready, outside the time.
        let metrics_converged = operator.metrics()?;
        let store_failed = apimetrics::increase(
            &failed_before,
            &crate::rotation::operator_failed(&metrics_converged),
        );
        let store_limit = apimetrics::samples(
            &metrics_converged,
            "petstore_operator_store_concurrency_limit",
        )
        .map(|(_, limit)| limit)
        .reduce(f64::max);
        let control_plane = ControlPlaneMemory::sample(&env);
        if !everything {
            let pid = operator.process().pid().unwrap_or(0);
            return Ok(ConvergenceResult {
                pets: n,
                converge,
                cpu,
                conversions,
                // As every Pet turned Ready: Events still queued then are
                // not among them.
                api_requests: requests_since(&env.cp, &api_before, n)?,
                store_calls: apimetrics::increase(&calls_before, &store_calls(&metrics_converged)),
                store_failed,
                store_limit,
                operator_peak_rss_kib: procstat::peak_rss_kib(pid).unwrap_or(0),
                control_plane,
                ..Default::default()
            });
        }
        let events_while_converging =
            apimetrics::diff(&api_before, &apimetrics::scrape(&env.cp)?, &["events"])
                .get(&("events".to_owned(), "POST".to_owned()))
                .copied()
                .unwrap_or(0);
        // Events trail behind in their queue; count them too.
        events_drained(&operator, timeout).await?;
        let events_written = started.elapsed();

        // The bench's own creates are not the operator's.
        let api_requests = requests_since(&env.cp, &api_before, n)?;
        let store_calls_converge =
            apimetrics::increase(&calls_before, &store_calls(&operator.metrics()?));
        let api_writes = writes_since(&env.cp, &api_before)?.saturating_sub(n as u64);
        let first_pid = operator.process().pid().unwrap_or(0);
        let operator_rss_kib = procstat::rss_kib(first_pid).unwrap_or(0);
        let operator_peak_rss_kib = procstat::peak_rss_kib(first_pid).unwrap_or(0);
        let operator_cpu_seconds = procstat::cpu_seconds(first_pid).unwrap_or(0.0);

        // Drift, on the operator as it runs by default (5-minute poll, the
        // store's change feed followed): up to 1,000 renames and 100
        // deletes out of band. Their Events are drained before the restart.
        let (drift_edits, drift_deletes) = drift_counts(n);
        let metrics_before_drift = operator.metrics()?;
        let drift =
            crate::drift::measure(&env.store.addr, drift_edits, drift_deletes, timeout).await?;
        let metrics_after_drift = operator.metrics()?;
        let drift_p99 = |histogram: &str| {
            apimetrics::histogram_quantile(
                &metrics_before_drift,
                &metrics_after_drift,
                histogram,
                0.99,
            )
        };
        let drift_reconcile_p99 = drift_p99("petstore_operator_reconcile_duration_seconds");
        let drift_queue_wait_p99 = drift_p99("petstore_operator_queue_wait_seconds");
        events_drained(&operator, timeout).await?;

        // Restart: kill -9, and a new process (the same Pod name, as when
        // Kubernetes restarts the container) with a short poll interval, so
        // that steady state can be watched over two of them afterwards.
        let restart_before = apimetrics::scrape(&env.cp)?;
        operator.kill();
        let mut restarted_options = options.clone();
        restarted_options.poll_interval =
            Box::leak(format!("{}ms", config.poll_interval.as_millis()).into_boxed_str());
        // With the store's change feed followed, the poll is an audit at
        // --audit-interval (an hour by default): the same short interval
        // lets steady state watch its reads.
        restarted_options.extra_args.extend([
            "--audit-interval".into(),
            format!("{}ms", config.poll_interval.as_millis()).into(),
        ]);
        if config.poll_max_rate > 0 {
            let max_rate = config.poll_max_rate.to_string();
            restarted_options
                .extra_args
                .extend(["--poll-max-rate".into(), max_rate.into()]);
        }
        let started = Instant::now();
        // The new process's CPU is all since its start: read on its own.
        let restart_meter = CpuSplit::meter(&env, None, []);
        operator = env.start_operator_with(&restarted_options)?;
        let expected = (n + WARMUP_PETS) as u64;
        let restarted = caught_up(&operator, expected, timeout).await?;
        let restart_catch_up = started.elapsed();
        let restart_cpu = CpuSplit {
            operator: operator
                .process()
                .pid()
                .and_then(procstat::cpu_seconds)
                .unwrap_or(0.0),
            ..CpuSplit::read(&restart_meter)
        };
        let (calls_at_restart, restart_lease_wait) = (restarted.calls, restarted.lease_wait);
        let restart_api_writes = writes_since(&env.cp, &restart_before)?;
        let restart_api_requests =
            apimetrics::increase(&restart_before, &apimetrics::scrape(&env.cp)?);
        let restart_store_writes = store_writes(&calls_at_restart);
        let restart_store_reads = store_reads(&calls_at_restart);
        let restarted_pid = operator.process().pid().unwrap_or(0);
        let restart_peak_rss_kib = procstat::peak_rss_kib(restarted_pid).unwrap_or(0);

        // Steady state: two poll intervals with nothing changing, once the
        // first polls after the catch-up (half an interval on) have begun.
        let poll_interval = Duration::from_secs_f64(metric_sum(
            &operator.metrics()?,
            "petstore_operator_poll_interval_seconds",
        ))
        .max(config.poll_interval);
        tokio::time::sleep(poll_interval / 2).await;
        let steady_before = apimetrics::scrape(&env.cp)?;
        let steady_calls_before = store_calls(&operator.metrics()?);
        let steady_meter = CpuSplit::meter(&env, operator.process().pid(), []);
        let window_started = Instant::now();
        tokio::time::sleep(poll_interval * 2).await;
        let steady_cpu = CpuSplit::read(&steady_meter);
        // The store calls' window is timed by its own two scrapes: the API
        // server's scrape (a kubectl run) would add to it.
        let steady_calls =
            apimetrics::increase(&steady_calls_before, &store_calls(&operator.metrics()?));
        let steady_window = window_started.elapsed();
        let steady_api_writes = writes_since(&env.cp, &steady_before)?;
        let steady_store_writes = store_writes(&steady_calls);
        let steady_store_reads = store_reads(&steady_calls);
        let steady_store_calls = steady_calls.values().sum();

        // Drift again, on an operator that polls alone, as before the feed
        // (the same edits, each found at its Pet's next poll); then the
        // restarted operator is back for the churn.
        let drift_polling = match config.polling_drift {
            Some(interval) => {
                operator.kill();
                let mut polling = options.clone();
                polling.poll_interval =
                    Box::leak(format!("{}ms", interval.as_millis()).into_boxed_str());
                polling
                    .extra_args
                    .push("--follow-store-changes=false".into());
                operator = env.start_operator_with(&polling)?;
                caught_up(&operator, expected, timeout).await?;
                // Each change waits for its Pet's poll: up to an interval.
                let drift = crate::drift::measure(
                    &env.store.addr,
                    drift_edits,
                    drift_deletes,
                    interval * 2 + timeout,
                )
                .await?;
                if metric_sum(
                    &operator.metrics()?,
                    "petstore_operator_change_feed_connected",
                ) != 0.0
                {
                    return Err(Error::Command {
                        command: "petstore-operator --follow-store-changes=false".into(),
                        status: "followed the change feed".into(),
                        stderr: String::new(),
                    });
                }
                operator.kill();
                operator = env.start_operator_with(&restarted_options)?;
                caught_up(&operator, expected, timeout).await?;
                Some((interval, drift))
            }
            None => None,
        };

        let (rename, delete) = if n <= config.churn_max_pets {
            churn(&env, &api, &mut tracker, config, timeout).await?
        } else {
            (Duration::ZERO, Duration::ZERO)
        };

        let store_pid = env.store.process().pid().unwrap_or(0);
        Ok(ConvergenceResult {
            pets: n,
            converge,
            cpu,
            conversions,
            events_written,
            events_while_converging,
            rename,
            delete,
            api_requests,
            store_reads: store_reads(&store_calls_converge),
            store_calls: store_calls_converge,
            store_failed,
            store_limit,
            api_writes,
            restart_catch_up,
            restart_lease_wait: restart_lease_wait.unwrap_or(restart_catch_up),
            drift_polling,
            restart_api_writes,
            restart_store_writes,
            restart_store_reads,
            restart_peak_rss_kib,
            restart_cpu,
            restart_first_reconcile: restarted.first_done,
            restart_api_requests,
            steady_api_writes,
            steady_store_writes,
            steady_store_reads,
            steady_store_calls,
            poll_interval,
            steady_window,
            steady_cpu,
            operator_peak_rss_kib,
            operator_rss_kib,
            operator_cpu_seconds,
            store_peak_rss_kib: procstat::peak_rss_kib(store_pid).unwrap_or(0),
            drift,
            drift_reconcile_p99,
            drift_queue_wait_p99,
            control_plane,
            ..Default::default()
        })
    })
}

/// Waits until the operator just started has reconciled `expected` Pets
/// (the catch-up after a start); returns its store calls by then and how
/// long it took to lead.
async fn caught_up(operator: &Operator, expected: u64, timeout: Duration) -> Result<CaughtUp> {
    let started = Instant::now();
    let mut lease_wait = None;
    let mut first_done = None;
    let mut done = None;
    loop {
        // Metrics appear once the process is up; counts start at zero.
        if let Ok(metrics) = operator.metrics() {
            if lease_wait.is_none() && is_leader(&metrics) {
                lease_wait = Some(started.elapsed());
            }
            let finished = reconciles_done(&metrics);
            if first_done.is_none() && finished > 0 {
                first_done = Some(started.elapsed());
            }
            if finished >= expected {
                return Ok(CaughtUp {
                    calls: store_calls(&metrics),
                    lease_wait,
                    first_done,
                });
            }
            done = Some(finished);
        }
        if started.elapsed() > timeout {
            return Err(Error::Timeout(
                timeout,
                format!(
                    "the operator to catch up: {} of {expected} reconciles finished, leader after {lease_wait:?}; its log:\n{}",
                    done.map_or_else(|| "no metrics, so none".to_owned(), |n| n.to_string()),
                    operator.log_tail(60)
                ),
            ));
        }
        tokio::time::sleep(CATCH_UP_POLL).await;
    }
}

/// What [`caught_up`] saw, each time from the operator's start (to the
/// bound of its scrape interval).
struct CaughtUp {
    /// Store calls by method, once every Pet was reconciled.
    calls: BTreeMap<String, u64>,
    /// Until it led.
    lease_wait: Option<Duration>,
    /// Until its first reconcile ended.
    first_done: Option<Duration>,
}

/// How often [`caught_up`] scrapes the operator. Each scrape walks the
/// operator's memory of every Pet for its gauges: at 100,000 Pets, a scrape
/// every 20 ms spent a share of the CPU of the very catch-up it timed.
const CATCH_UP_POLL: Duration = Duration::from_millis(250);

/// Lists the `n` bench Pets as v1 and as v1alpha1, alternating, with the
/// client users use; see [`ListTimes`]. The process `webhook_pid` serves
/// the conversions.
fn list_times(cp: &ControlPlane, webhook_pid: Option<u32>, n: usize) -> Result<ListRound> {
    let list = |version: &str| -> Result<Duration> {
        let resource = format!("pets.{version}.petstore.example.com");
        let started = Instant::now();
        let out = cp.kubectl(&["get", &resource, "-n", NAMESPACE, "-o", "json"])?;
        let took = started.elapsed();
        let list: serde_json::Value = serde_json::from_str(&out)
            .map_err(|err| kube_error(format!("kubectl get {resource}: {err}")))?;
        let listed = list["items"].as_array().map_or(0, Vec::len);
        if listed != n {
            return Err(kube_error(format!(
                "listed {listed} of {n} Pets as {version}"
            )));
        }
        Ok(took)
    };
    // Untimed: after an API server start the watch caches fill first.
    list("v1")?;
    list("v1alpha1")?;
    let pid = webhook_pid.unwrap_or(0);
    let calls_before = conversion_calls(cp)?;
    let (mut v1, mut v1alpha1, mut webhook_cpu) = (Vec::new(), Vec::new(), 0.0);
    for _ in 0..LIST_ROUNDS {
        v1.push(list("v1")?.as_secs_f64());
        let cpu_before = procstat::cpu_seconds(pid).unwrap_or(0.0);
        v1alpha1.push(list("v1alpha1")?.as_secs_f64());
        webhook_cpu += procstat::cpu_seconds(pid).unwrap_or(0.0) - cpu_before;
    }
    let calls = conversion_calls(cp)?.saturating_sub(calls_before);
    Ok(ListRound {
        v1: Duration::from_secs_f64(median(v1)),
        v1alpha1: Duration::from_secs_f64(median(v1alpha1)),
        webhook_cpu_seconds: webhook_cpu / LIST_ROUNDS as f64,
        webhook_calls: calls / LIST_ROUNDS as u64,
    })
}

/// A timed creation of N Pets, from the first create until all are Ready.
struct TimedCreate {
    started: Instant,
    took: Duration,
    /// CPU over that span, the process `pid` named split out.
    cpu: CpuSplit,
    /// Conversion webhook calls over that span.
    conversions: u64,
}

/// Creates the configured number of Pets and waits until all are Ready: the
/// operator's run and the floor's time the same span the same way.
async fn create_all_timed(
    env: &Env,
    api: &Api<Pet>,
    tracker: &mut Tracker,
    config: &ConvergenceConfig,
    pid: Option<u32>,
    what: &str,
) -> Result<TimedCreate> {
    let conversions_before = conversion_calls(&env.cp)?;
    let meter = CpuSplit::meter(env, pid, []);
    let started = Instant::now();
    create_pets(api, config.pets, config.concurrency).await?;
    tracker
        .all(Shows::Ready, config.pets, 1, config.timeout(), what)
        .await?;
    let took = started.elapsed();
    Ok(TimedCreate {
        started,
        took,
        cpu: CpuSplit::read(&meter),
        conversions: conversion_calls(&env.cp)?.saturating_sub(conversions_before),
    })
}

/// Conversion webhook calls the API server has made for Pets and the webhook
/// answered, from its
/// `apiserver_crd_conversion_webhook_duration_seconds` histogram.
pub(crate) fn conversion_calls(cp: &ControlPlane) -> Result<u64> {
    let metrics = cp.kubectl(&["get", "--raw", "/metrics"])?;
    Ok(apimetrics::samples(
        &metrics,
        "apiserver_crd_conversion_webhook_duration_seconds_count",
    )
    .filter(|(labels, _)| {
        apimetrics::label(labels, "crd_name") == "pets.petstore.example.com"
            && apimetrics::label(labels, "succeeded") == "true"
    })
    .map(|(_, calls)| calls)
    .sum::<f64>() as u64)
}

/// Holds the operator's leader Lease for a day, so that an operator started
/// now stands by: it serves the conversion webhook and reconciles nothing.
pub(crate) fn hold_lease(cp: &ControlPlane) -> Result<()> {
    let now = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%S%.6fZ");
    cp.apply(&format!(
        "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: petstore-operator\n  namespace: {OPERATOR_NAMESPACE}\nspec:\n  holderIdentity: petstore-bench-floor\n  leaseDurationSeconds: 86400\n  acquireTime: {now}\n  renewTime: {now}\n"
    ))
    .map(drop)
}

/// Out-of-band renames and deletes for drift latency at `n` Pets: up to
/// 1,000 and 100.
fn drift_counts(n: usize) -> (usize, usize) {
    let deletes = (n / 10).clamp(1, 100);
    (n.saturating_sub(deletes).clamp(1, 1000), deletes)
}

/// Drift latency with the store on PostgreSQL: two store replicas on one
/// database behind a round-robin forwarder (as behind a Service), the
/// operator as it ships (5-minute poll, the feed followed), `n` Pets
/// converged first. The out-of-band changes and the operator's feed go
/// through different connections, so through either replica.
pub fn measure_drift_on_postgres(
    rt: &tokio::runtime::Runtime,
    config: &ConvergenceConfig,
) -> Result<crate::drift::DriftResult> {
    let env = Env::start(Storage::Durable)?;
    let dir = tempfile::tempdir().map_err(fixtures::io("creating a directory"))?;
    let store = crate::store_load::StoreUnderTest::start(
        dir.path(),
        crate::store_load::StoreSetup::Postgres { replicas: 2 },
    )?;
    let mut options = drift_measured(shipped_options(&env, "bench-operator-postgres"));
    options.store_addr = store.addr.clone();
    let operator = start_leader(&env, &options)?;
    let n = config.pets;
    let timeout = config.timeout();
    rt.block_on(async {
        let client = warmed_up(&env, timeout).await?;
        let api: Api<Pet> = Api::namespaced(client, NAMESPACE);
        let mut tracker = Tracker::start(api.clone());
        create_pets(&api, n, config.concurrency).await?;
        tracker
            .all(Shows::Ready, n, 1, timeout, "all Pets Ready on PostgreSQL")
            .await?;
        events_drained(&operator, timeout).await?;
        let (edits, deletes) = drift_counts(n);
        crate::drift::measure(&store.addr, edits, deletes, timeout).await
    })
}

/// Resolves once the operator has written every Event it queued.
pub(crate) async fn events_drained(operator: &Operator, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while !operator
        .metrics()?
        .contains("petstore_operator_events_pending 0")
    {
        if Instant::now() > deadline {
            return Err(Error::Timeout(timeout, "events to drain".into()));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Rename storm, then deletion of every Pet; how long each took.
async fn churn(
    env: &Env,
    api: &Api<Pet>,
    tracker: &mut Tracker,
    config: &ConvergenceConfig,
    timeout: Duration,
) -> Result<(Duration, Duration)> {
    let n = config.pets;
    // Rename storm: every Pet gets a new name.
    let started = Instant::now();
    for_each_pet(n, config.concurrency, |i| {
        let api = api.clone();
        async move {
            let patch = json!({"spec": {"name": format!("Renamed {i}")}});
            api.patch(
                &format!("pet-{i}"),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .map(drop)
        }
    })
    .await?;
    tracker
        .all(Shows::Ready, n, 2, timeout, "renames applied")
        .await?;
    let rename = started.elapsed();
    let renamed = super::store_load::count_named(&env.store.addr, "Renamed ").await?;
    if renamed != n {
        return Err(kube_error(format!("{renamed} of {n} records renamed")));
    }

    // Deletion: every Pet, until all are gone.
    let started = Instant::now();
    for_each_pet(n, config.concurrency, |i| {
        let api = api.clone();
        async move {
            api.delete(&format!("pet-{i}"), &DeleteParams::default())
                .await
                .map(drop)
        }
    })
    .await?;
    tracker
        .until(timeout, "all Pets gone", |s| s.pets.is_empty())
        .await?;
    let delete = started.elapsed();
    let left = super::store_load::count_named(&env.store.addr, "Renamed ").await?;
    if left != 0 {
        return Err(kube_error(format!("{left} records left after deletion")));
    }

    Ok((rename, delete))
}

/// A floor's baseline client: for each Pet its watch shows that `pick`
/// selects, `write` runs, at the operator's default concurrency, until the
/// task is aborted.
pub(crate) fn spawn_baseline<T, Fut>(
    api: Api<Pet>,
    pick: fn(Pet) -> Option<T>,
    write: impl Fn(Api<Pet>, T) -> Fut + Send + Sync + 'static,
) -> tokio::task::JoinHandle<()>
where
    T: Send + 'static,
    Fut: std::future::Future<Output = Result<()>> + Send + 'static,
{
    let concurrency = usize::from(petstore_operator::controller::DEFAULT_CONCURRENCY);
    tokio::spawn(async move {
        watcher(api.clone(), watcher::Config::default())
            .try_filter_map(|event| {
                std::future::ready(Ok(match event {
                    watcher::Event::Apply(pet) | watcher::Event::InitApply(pet) => pick(pet),
                    _ => None,
                }))
            })
            .map_err(kube_error)
            .map_ok(|picked| write(api.clone(), picked))
            .try_buffer_unordered(concurrency)
            // A failed watch or write leaves a Pet unwritten, which the
            // measurement then waits for: say why.
            .for_each(|done| async move {
                if let Err(err) = done {
                    eprintln!("[bench] the floor's client: {err}");
                }
            })
            .await;
    })
}

/// The floor: the same creates, and a baseline that only adds the finalizer
/// and writes status for each Pet, at the operator's default concurrency,
/// with no store.
///
/// The API server converts every write of a Pet to v1alpha1 for that
/// version's watch cache, through the conversion webhook, whoever writes.
/// So the floor runs with the webhook served as in the operator's run: by
/// an operator replica that stands by (the bench holds the leader Lease)
/// and reconciles nothing. Without it the floor would skip that work
/// (each conversion failing at once) and the ratio would charge the
/// control plane's conversions to the operator.
///
/// With `lists`, it then times listing the converged Pets ([`ListTimes`]).
pub fn measure_floor(
    rt: &tokio::runtime::Runtime,
    config: &ConvergenceConfig,
    lists: bool,
) -> Result<Floor> {
    measure_floor_gated(rt, config, lists, &|| {})
}

/// [`measure_floor`], with `gate` called just before the first create, as
/// in [`measure_operator_convergence_gated`].
pub fn measure_floor_gated(
    rt: &tokio::runtime::Runtime,
    config: &ConvergenceConfig,
    lists: bool,
    gate: &dyn Fn(),
) -> Result<Floor> {
    let mut env = Env::start(Storage::Durable)?;
    hold_lease(&env.cp)?;
    let options = shipped_options(&env, "bench-floor-webhook");
    let mut webhook = env.start_operator_with(&options)?;
    let webhook_pid = webhook.process().pid();
    let n = config.pets;
    let mut floor = rt.block_on(async {
        let client = prepare(&env).await?;
        let api: Api<Pet> = Api::namespaced(client.clone(), NAMESPACE);
        let mut tracker = Tracker::start(api.clone());
        let api_before = apimetrics::scrape(&env.cp)?;

        // The baseline "operator": for each new Pet, patch in the finalizer,
        // then write a Ready status, with bounded concurrency.
        // The baseline authenticates as the operator does unless told
        // otherwise: see FloorIdentity.
        let baseline_client = config.floor_identity.client(&env, &client).await?;
        let baseline_api: Api<Pet> = Api::namespaced(baseline_client, NAMESPACE);
        let baseline = spawn_baseline(
            baseline_api,
            |pet| pet.metadata.finalizers.is_none().then_some(pet),
            |api, pet| async move {
                let name = pet.metadata.name.clone().unwrap_or_default();
                let finalizer = json!({"metadata": {"finalizers": [FINALIZER]}});
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&finalizer))
                    .await
                    .map_err(kube_error)?;
                let status = floor_ready_status(&name, pet.metadata.generation);
                api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                    .await
                    .map(drop)
                    .map_err(kube_error)
            },
        );

        quiet(&env, webhook_pid).await;
        tokio::task::block_in_place(gate);
        let what = "baseline: all Pets Ready";
        let run = create_all_timed(&env, &api, &mut tracker, config, webhook_pid, what);
        let TimedCreate {
            took: floor,
            cpu,
            conversions,
            ..
        } = run.await?;
        baseline.abort();
        Ok::<_, Error>(Floor {
            time: floor,
            requests: requests_since(&env.cp, &api_before, n)?,
            cpu,
            conversions,
            list: None,
        })
    })?;
    if lists {
        let default = list_times(&env.cp, webhook_pid, n)?;
        env.cp.restart_apiserver(&[WITHOUT_LIST_SNAPSHOT])?;
        let without_snapshot = list_times(&env.cp, webhook_pid, n)?;
        floor.list = Some(ListTimes {
            default,
            without_snapshot,
            webhook_rss_kib: webhook_pid.and_then(procstat::rss_kib).unwrap_or(0),
        });
    }
    Ok(floor)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The operator's own counters, as its `/metrics` prints them.
    const METRICS: &str = "\
# TYPE petstore_operator_leader gauge
petstore_operator_leader 1
petstore_operator_leader_changes_total 3
petstore_operator_store_call_duration_seconds_count{method=\"GetPets\",outcome=\"OK\"} 40
petstore_operator_store_call_duration_seconds_count{method=\"GetPets\",outcome=\"Unavailable\"} 2
petstore_operator_store_call_duration_seconds_count{method=\"AddPets\",outcome=\"OK\"} 5
petstore_operator_store_call_duration_seconds_count{method=\"UpdatePets\",outcome=\"OK\"} 1
petstore_operator_store_call_duration_seconds_count{method=\"DeletePets\",outcome=\"OK\"} 1
petstore_operator_store_call_duration_seconds_count{method=\"SetIdempotencyKeys\",outcome=\"FailedPrecondition\"} 1
petstore_operator_store_call_duration_seconds_count{method=\"SearchPets\",outcome=\"OK\"} 1
petstore_operator_store_call_duration_seconds_count{method=\"WatchPets\",outcome=\"OK\"} 1
petstore_operator_store_call_duration_seconds_sum{method=\"GetPets\",outcome=\"OK\"} 0.5
petstore_operator_reconcile_duration_seconds_count{outcome=\"ok\"} 7
petstore_operator_reconcile_duration_seconds_count{outcome=\"error\"} 2
";

    #[test]
    fn store_calls_are_counted_by_method_and_every_write_rpc_is_a_write() {
        let calls = store_calls(METRICS);
        assert_eq!(calls["GetPets"], 42, "every outcome counted");
        assert_eq!(store_reads(&calls), 42);
        // A claim is a write, whatever its answer; a search or the feed is
        // not.
        assert_eq!(store_writes(&calls), 5 + 1 + 1 + 1);
        assert_eq!(store_writes(&BTreeMap::new()), 0);
    }

    #[test]
    fn a_metric_is_summed_over_its_labels_and_no_longer_name() {
        assert_eq!(metric_sum(METRICS, "petstore_operator_leader"), 1.0);
        assert!(is_leader(METRICS));
        assert!(!is_leader(&METRICS.replace("leader 1", "leader 0")));
        assert!(!is_leader(""), "no gauge, no leader");
        assert_eq!(reconciles_done(METRICS), 9);
        assert_eq!(
            metric_sum(
                METRICS,
                "petstore_operator_store_call_duration_seconds_count"
            ),
            52.0
        );
    }

    #[test]
    fn the_ratio_is_the_median_of_the_pairs() {
        let pair = |floor: f64, operator: f64| Pair {
            floor: Duration::from_secs_f64(floor),
            operator: Duration::from_secs_f64(operator),
        };
        let mut r = ConvergenceResult {
            pairs: vec![pair(10.0, 10.5), pair(10.0, 13.0), pair(10.0, 10.8)],
            ..Default::default()
        };
        assert!((r.ratio() - 1.08).abs() < 1e-9, "{}", r.ratio());
        r.pairs.truncate(2);
        assert!((r.ratio() - 1.175).abs() < 1e-9, "{}", r.ratio());
        assert_eq!(median(vec![]), 0.0);
    }
}
