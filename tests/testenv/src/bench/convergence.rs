//! How fast the operator converges N Pets, what it costs, and the floor: a
//! baseline client that makes only the two writes any correct operator must
//! make per Pet (the finalizer patch and the status patch).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::watcher;
use petstore_operator::crd::{FINALIZER, Pet, PetKind, PetSpec};
use serde_json::json;
use tokio::sync::watch;

use super::apimetrics::{self, RequestCounts};
use super::procstat;
use crate::{Env, Error, Result, Storage, wait_for};

const NAMESPACE: &str = "bench";

#[derive(Clone, Debug)]
pub struct ConvergenceConfig {
    pub pets: usize,
    /// Client concurrency for creates, renames and deletes, and the
    /// baseline's concurrency (the operator's default is 16 too).
    pub concurrency: usize,
    /// Drift-poll interval given to the operator.
    pub poll_interval: Duration,
}

#[derive(Clone, Debug, Default)]
pub struct ConvergenceResult {
    pub pets: usize,
    pub converge: Duration,
    /// Until the last Event of the convergence was written.
    pub events_written: Duration,
    pub floor: Duration,
    pub rename: Duration,
    pub delete: Duration,
    /// Operator API requests during convergence, by (resource, verb).
    pub api_requests: RequestCounts,
    pub floor_api_requests: RequestCounts,
    /// Operator store RPCs during convergence, by method.
    pub store_calls: BTreeMap<String, u64>,
    pub steady_api_writes: u64,
    pub steady_store_writes: u64,
    pub steady_window: Duration,
    pub operator_peak_rss_kib: u64,
    pub operator_cpu_seconds: f64,
    pub store_peak_rss_kib: u64,
}

/// What the watch has seen of each Pet.
#[derive(Default)]
struct Seen {
    /// name -> (generation, ready-for-that-generation)
    pets: HashMap<String, (i64, bool)>,
}

impl Seen {
    fn ready_at_least(&self, generation: i64) -> usize {
        self.pets
            .values()
            .filter(|(g, ready)| *ready && *g >= generation)
            .count()
    }
}

fn ready(pet: &Pet) -> bool {
    let generation = pet.metadata.generation;
    pet.status_id().is_some()
        && pet
            .condition("Ready")
            .is_some_and(|c| c.status == "True" && c.observed_generation == generation)
}

/// Watches the bench namespace and publishes every change to `seen`.
fn track(api: Api<Pet>) -> (Arc<Mutex<Seen>>, watch::Receiver<u64>) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let (tick, ticks) = watch::channel(0u64);
    let state = Arc::clone(&seen);
    tokio::spawn(async move {
        let mut stream = watcher(api, watcher::Config::default()).boxed();
        while let Ok(Some(event)) = stream.try_next().await {
            let mut seen = state.lock().expect("seen");
            match event {
                watcher::Event::Apply(pet) | watcher::Event::InitApply(pet) => {
                    let name = pet.metadata.name.clone().unwrap_or_default();
                    let generation = pet.metadata.generation.unwrap_or(0);
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
    (seen, ticks)
}

/// Resolves when `done` holds, re-checked on every watch event.
async fn until(
    seen: &Mutex<Seen>,
    ticks: &mut watch::Receiver<u64>,
    timeout: Duration,
    what: &str,
    done: impl Fn(&Seen) -> bool,
) -> Result<()> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if done(&seen.lock().expect("seen")) {
            return Ok(());
        }
        if tokio::time::timeout_at(deadline, ticks.changed())
            .await
            .is_err()
        {
            return Err(Error::Timeout(timeout, what.to_owned()));
        }
    }
}

/// The API server's first requests for a new CRD are slow (it builds the
/// handler, validators and storage); make them outside the measurement.
/// The warm-up Pets sit in their own namespace and are not counted.
async fn warm_up(client: &kube::Client, env: &Env) -> Result<()> {
    env.cp.kubectl(&["create", "namespace", "warmup"])?;
    let api: Api<Pet> = Api::namespaced(client.clone(), "warmup");
    for i in 0..WARMUP_PETS {
        let mut pet = pet(i);
        pet.spec.name = format!("Warmup {i}");
        api.create(&PostParams::default(), &pet)
            .await
            .map_err(kube_error)?;
    }
    Ok(())
}

const WARMUP_PETS: usize = 20;

async fn admin_client(env: &Env) -> Result<kube::Client> {
    let kubeconfig = Kubeconfig::read_from(&env.cp.kubeconfig).map_err(kube_error)?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(kube_error)?;
    kube::Client::try_from(config).map_err(kube_error)
}

fn kube_error(err: impl std::fmt::Display) -> Error {
    Error::Command {
        command: "kube client".into(),
        status: "error".into(),
        stderr: err.to_string(),
    }
}

fn pet(i: usize) -> Pet {
    let kinds = [PetKind::Dog, PetKind::Cat, PetKind::Bird, PetKind::Reptile];
    let birthday = chrono::DateTime::parse_from_rfc3339("2020-01-01T00:00:00Z")
        .expect("constant timestamp")
        + chrono::Duration::days((i % 365) as i64);
    Pet::new(
        &format!("pet-{i}"),
        PetSpec {
            name: format!("Pet {i}"),
            kind: kinds[i % kinds.len()],
            birthday,
            deletion_policy: None,
        },
    )
}

async fn for_each_pet<F, Fut>(n: usize, concurrency: usize, action: F) -> Result<()>
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = std::result::Result<(), kube::Error>>,
{
    futures::stream::iter(0..n)
        .map(action)
        .buffer_unordered(concurrency)
        .try_collect::<Vec<()>>()
        .await
        .map(drop)
        .map_err(kube_error)
}

fn store_calls(metrics: &str) -> BTreeMap<String, u64> {
    let mut calls = BTreeMap::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("petstore_operator_store_call_duration_seconds_count{")
        else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let method = labels
            .split(',')
            .find_map(|l| l.strip_prefix("method=\""))
            .and_then(|m| m.strip_suffix('"'))
            .unwrap_or("?");
        *calls.entry(method.to_owned()).or_default() +=
            value.trim().parse::<f64>().unwrap_or(0.0) as u64;
    }
    calls
}

fn diff_calls(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, v)| *v > 0)
        .collect()
}

const WRITE_VERBS: [&str; 4] = ["POST", "PATCH", "PUT", "DELETE"];
const RESOURCES: [&str; 3] = ["pets", "events", "leases"];

/// The operator end to end: converge, stay still, rename, delete.
pub fn measure_operator(
    rt: &tokio::runtime::Runtime,
    config: &ConvergenceConfig,
) -> Result<ConvergenceResult> {
    let env = Env::start(Storage::Durable)?;
    let mut options = env.operator_options("bench-operator");
    options.poll_interval =
        Box::leak(format!("{}s", config.poll_interval.as_secs()).into_boxed_str());
    // Production log level: debug logging would be part of what we measure.
    options.log_filter = "info";
    let mut operator = env.start_operator_with(&options)?;
    wait_for(Duration::from_secs(60), "leadership", || {
        operator.log_contains("became leader").then_some(())
    })?;
    env.cp.kubectl(&["create", "namespace", NAMESPACE])?;
    let n = config.pets;
    let timeout = Duration::from_secs(60 + n as u64 / 5);

    rt.block_on(async {
        let client = admin_client(&env).await?;
        warm_up(&client, &env).await?;
        let warm: Api<Pet> = Api::namespaced(client.clone(), "warmup");
        let (warm_seen, mut warm_ticks) = track(warm);
        until(
            &warm_seen,
            &mut warm_ticks,
            timeout,
            "warm-up Pets Ready",
            |s| s.ready_at_least(1) == WARMUP_PETS,
        )
        .await?;
        let api: Api<Pet> = Api::namespaced(client, NAMESPACE);
        let (seen, mut ticks) = track(api.clone());
        let api_before = apimetrics::scrape(&env.cp)?;
        let calls_before = store_calls(&operator.metrics()?);

        let started = Instant::now();
        for_each_pet(n, config.concurrency, |i| {
            let api = api.clone();
            async move { api.create(&PostParams::default(), &pet(i)).await.map(drop) }
        })
        .await?;
        until(&seen, &mut ticks, timeout, "all Pets Ready", |s| {
            s.ready_at_least(1) == n
        })
        .await?;
        let converge = started.elapsed();
        // Events trail behind in their queue; count them too.
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
        let events_written = started.elapsed();

        let mut api_requests =
            apimetrics::diff(&api_before, &apimetrics::scrape(&env.cp)?, &RESOURCES);
        // The bench's own creates are not the operator's.
        if let Some(posts) = api_requests.get_mut(&("pets".to_owned(), "POST".to_owned())) {
            *posts -= n as u64;
        }
        api_requests.retain(|_, v| *v > 0);
        let store_calls_converge = diff_calls(&calls_before, &store_calls(&operator.metrics()?));

        // Steady state: two poll intervals with nothing changing.
        let steady_before = apimetrics::scrape(&env.cp)?;
        let steady_calls_before = store_calls(&operator.metrics()?);
        let steady_window = config.poll_interval * 2;
        tokio::time::sleep(steady_window).await;
        let steady = apimetrics::diff(
            &steady_before,
            &apimetrics::scrape(&env.cp)?,
            &["pets", "events"],
        );
        let steady_api_writes = steady
            .iter()
            .filter(|((_, verb), _)| WRITE_VERBS.contains(&verb.as_str()))
            .map(|(_, n)| n)
            .sum();
        let steady_calls = diff_calls(&steady_calls_before, &store_calls(&operator.metrics()?));
        let steady_store_writes = ["AddPets", "UpdatePets", "DeletePets"]
            .iter()
            .map(|m| steady_calls.get(*m).copied().unwrap_or(0))
            .sum();

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
        until(&seen, &mut ticks, timeout, "renames applied", |s| {
            s.ready_at_least(2) == n
        })
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
        until(&seen, &mut ticks, timeout, "all Pets gone", |s| {
            s.pets.is_empty()
        })
        .await?;
        let delete = started.elapsed();
        let left = super::store_load::count_named(&env.store.addr, "Renamed ").await?;
        if left != 0 {
            return Err(kube_error(format!("{left} records left after deletion")));
        }

        let operator_pid = operator.process().pid().unwrap_or(0);
        let store_pid = env.store.process().pid().unwrap_or(0);
        Ok(ConvergenceResult {
            pets: n,
            converge,
            events_written,
            rename,
            delete,
            api_requests,
            store_calls: store_calls_converge,
            steady_api_writes,
            steady_store_writes,
            steady_window,
            operator_peak_rss_kib: procstat::peak_rss_kib(operator_pid).unwrap_or(0),
            operator_cpu_seconds: procstat::cpu_seconds(operator_pid).unwrap_or(0.0),
            store_peak_rss_kib: procstat::peak_rss_kib(store_pid).unwrap_or(0),
            ..Default::default()
        })
    })
}

/// The floor: the same creates, and a baseline that only adds the finalizer
/// and writes status for each Pet, at the same concurrency, with no store.
pub fn measure_floor(
    rt: &tokio::runtime::Runtime,
    config: &ConvergenceConfig,
) -> Result<(Duration, RequestCounts)> {
    let env = Env::start(Storage::Durable)?;
    env.cp.kubectl(&["create", "namespace", NAMESPACE])?;
    let n = config.pets;
    let timeout = Duration::from_secs(60 + n as u64 / 5);
    rt.block_on(async {
        let client = admin_client(&env).await?;
        warm_up(&client, &env).await?;
        let api: Api<Pet> = Api::namespaced(client, NAMESPACE);
        let (seen, mut ticks) = track(api.clone());
        let api_before = apimetrics::scrape(&env.cp)?;

        // The baseline "operator": for each new Pet, patch in the finalizer,
        // then write a Ready status, with bounded concurrency.
        let baseline_api = api.clone();
        let concurrency = config.concurrency;
        let baseline =
            tokio::spawn(async move {
                watcher(baseline_api.clone(), watcher::Config::default())
                .try_filter_map(|event| async move {
                    Ok(match event {
                        watcher::Event::Apply(pet) | watcher::Event::InitApply(pet)
                            if pet.metadata.finalizers.is_none() => Some(pet),
                        _ => None,
                    })
                })
                .map_err(kube_error)
                .map_ok(|pet| {
                    let api = baseline_api.clone();
                    async move {
                        let name = pet.metadata.name.clone().unwrap_or_default();
                        let finalizer = json!({"metadata": {"finalizers": [FINALIZER]}});
                        api.patch(&name, &PatchParams::default(), &Patch::Merge(&finalizer))
                            .await
                            .map_err(kube_error)?;
                        let status = json!({"status": {
                            "id": format!("baseline-{name}"),
                            "observedGeneration": pet.metadata.generation,
                            "conditions": [{
                                "type": "Ready", "status": "True", "reason": "Available",
                                "message": "baseline", "lastTransitionTime": "2026-01-01T00:00:00Z",
                                "observedGeneration": pet.metadata.generation,
                            }],
                        }});
                        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                            .await
                            .map(drop)
                            .map_err(kube_error)
                    }
                })
                .try_buffer_unordered(concurrency)
                .for_each(|_| async {})
                .await;
            });

        let started = Instant::now();
        for_each_pet(n, config.concurrency, |i| {
            let api = api.clone();
            async move { api.create(&PostParams::default(), &pet(i)).await.map(drop) }
        })
        .await?;
        until(
            &seen,
            &mut ticks,
            timeout,
            "baseline: all Pets Ready",
            |s| s.ready_at_least(1) == n,
        )
        .await?;
        let floor = started.elapsed();
        baseline.abort();
        let mut requests = apimetrics::diff(&api_before, &apimetrics::scrape(&env.cp)?, &RESOURCES);
        if let Some(posts) = requests.get_mut(&("pets".to_owned(), "POST".to_owned())) {
            *posts -= n as u64;
        }
        requests.retain(|_, v| *v > 0);
        Ok((floor, requests))
    })
}
