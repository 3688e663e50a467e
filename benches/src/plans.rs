//! Plans under `Approve`: N Pets converged, each switched to `Approve`
//! (nothing to change, so nothing shown), then all renamed at once. Each
//! rename is timed from the API server's answer to the patch until a watch
//! on the Pets shows that Pet's plan for the new generation. The store's
//! own count of write RPCs over the whole edit must not move.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher;
use petstore_operator::crd::Pet;
use tokio::sync::watch;

use crate::convergence::{
    NAMESPACE, Tracker, client_from, create_pets, events_drained, shipped_options, start_leader,
};
use crate::store_load::percentile;
use fixtures::{Env, Error, Result, Storage};

/// Where the section of the report starts; runs that do not measure it
/// keep it as it is.
pub const SECTION: &str = "\n## Plans under Approve";

/// The goal, as printed: every plan shown, p99 within this of its edit.
pub const GOAL_P99: Duration = Duration::from_secs(1);

#[derive(Clone, Debug)]
pub struct PlansConfig {
    pub pets: usize,
    pub concurrency: usize,
}

#[derive(Clone, Debug, Default)]
pub struct PlansResult {
    pub pets: usize,
    /// Patches in flight at once.
    pub concurrency: usize,
    /// Pets whose plan for the edit was shown before the timeout.
    pub shown: usize,
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
    /// From the first edit's answer to the last one's.
    pub edits_took: Duration,
    /// From the first edit's answer to the last plan shown.
    pub all_shown: Duration,
    /// Write RPCs the store answered from before the switch to `Approve`
    /// until the last plan was shown.
    pub store_writes: f64,
    pub started_at: String,
    pub commit: String,
}

impl PlansResult {
    pub fn goal_met(&self) -> bool {
        self.pets > 0 && self.shown == self.pets && self.p99 <= GOAL_P99 && self.store_writes == 0.0
    }
}

/// The Pets' generation after the rename: created (1), switched (2),
/// renamed (3).
const EDITED_GENERATION: i64 = 3;

pub fn measure(config: &PlansConfig, progress: &dyn Fn(&str)) -> Result<PlansResult> {
    let rt = crate::runtime()?;
    let env = Env::start(Storage::Durable)?;
    let operator = start_leader(&env, &shipped_options(&env, "plans"))?;
    let timeout = Duration::from_secs(120 + config.pets as u64 / 5);
    rt.block_on(async {
        env.cp.ensure_namespace(NAMESPACE)?;
        let client = client_from(&env.cp.kubeconfig).await?;
        let api: Api<Pet> = Api::namespaced(client, NAMESPACE);
        let mut tracker = Tracker::start(api.clone());
        progress(&format!("plans: converging {} Pets", config.pets));
        create_pets(&api, config.pets, config.concurrency).await?;
        tracker
            .all_ready(config.pets, 1, timeout, "all Pets Ready")
            .await?;
        events_drained(&operator, timeout).await?;

        let writes_before = env.store.writes()?;
        progress("plans: switching every Pet to Approve");
        patch_all(
            &api,
            config,
            |_| serde_json::json!({"spec": {"changePolicy": "Approve"}}),
        )
        .await?;
        tracker
            .all_ready(config.pets, 2, timeout, "all Pets Ready in Approve")
            .await?;
        events_drained(&operator, timeout).await?;

        // A watch of its own, listed before the first edit, notes when each
        // Pet first shows a plan for the renamed generation.
        let shown = Arc::new(Mutex::new(HashMap::<String, Instant>::new()));
        let (tick, mut ticks) = watch::channel((false, 0usize));
        let watched = Arc::clone(&shown);
        let watch_api = api.clone();
        let follower = tokio::spawn(async move {
            let mut stream = watcher(watch_api, watcher::Config::default()).boxed();
            while let Ok(Some(event)) = stream.try_next().await {
                match event {
                    watcher::Event::InitDone => tick.send_modify(|(listed, _)| *listed = true),
                    watcher::Event::Apply(pet) | watcher::Event::InitApply(pet) => {
                        let for_edit = pet
                            .status
                            .as_ref()
                            .and_then(|s| s.plan.as_ref())
                            .and_then(|p| p.generation)
                            .is_some_and(|g| g >= EDITED_GENERATION);
                        if for_edit {
                            let name = pet.metadata.name.clone().unwrap_or_default();
                            let mut shown = watched.lock().expect("shown");
                            shown.entry(name).or_insert_with(Instant::now);
                            let n = shown.len();
                            drop(shown);
                            tick.send_modify(|(_, count)| *count = n);
                        }
                    }
                    _ => {}
                }
            }
        });
        let deadline = tokio::time::Instant::now() + timeout;
        let wait_until = |ticks: &mut watch::Receiver<(bool, usize)>,
                          done: fn(&(bool, usize), usize) -> bool| {
            let mut ticks = ticks.clone();
            let pets = config.pets;
            async move {
                while !done(&ticks.borrow(), pets) {
                    match tokio::time::timeout_at(deadline, ticks.changed()).await {
                        Ok(Ok(())) => {}
                        _ => return false,
                    }
                }
                true
            }
        };
        if !wait_until(&mut ticks, |(listed, _), _| *listed).await {
            return Err(Error::Timeout(
                timeout,
                "the plans watch's first list".into(),
            ));
        }

        let started_at = chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string();
        progress(&format!("plans: renaming {} Pets in Approve", config.pets));
        let answered = patch_all(
            &api,
            config,
            |i| serde_json::json!({"spec": {"name": format!("Renamed {i}")}}),
        )
        .await?;
        wait_until(&mut ticks, |(_, count), pets| *count >= pets).await;
        follower.abort();
        let store_writes = env.store.writes()? - writes_before;

        let shown = shown.lock().expect("shown").clone();
        let mut latencies: Vec<Duration> = (0..config.pets)
            .filter_map(|i| {
                let at = shown.get(&format!("pet-{i}"))?;
                Some(at.saturating_duration_since(answered[i]))
            })
            .collect();
        latencies.sort();
        let first_answer = answered.iter().min().copied();
        let edits_took = match (first_answer, answered.iter().max()) {
            (Some(first), Some(last)) => last.saturating_duration_since(first),
            _ => Duration::ZERO,
        };
        let last_shown = shown.values().max().copied();
        let all_shown = match (first_answer, last_shown) {
            (Some(first), Some(last)) => last.saturating_duration_since(first),
            _ => Duration::ZERO,
        };
        Ok(PlansResult {
            pets: config.pets,
            concurrency: config.concurrency,
            shown: latencies.len(),
            p50: percentile(&latencies, 0.50),
            p99: percentile(&latencies, 0.99),
            max: latencies.last().copied().unwrap_or_default(),
            edits_took,
            all_shown,
            store_writes,
            started_at,
            commit: crate::idle::commit(),
        })
    })
}

async fn patch_all(
    api: &Api<Pet>,
    config: &PlansConfig,
    patch: impl Fn(usize) -> serde_json::Value,
) -> Result<Vec<Instant>> {
    let answered = futures::stream::iter(0..config.pets)
        .map(|i| {
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
        .buffer_unordered(config.concurrency)
        .try_collect::<Vec<(usize, Instant)>>()
        .await
        .map_err(|err| Error::Command {
            command: "patching the Pets".into(),
            status: "error".into(),
            stderr: err.to_string(),
        })?;
    let mut at = vec![Instant::now(); config.pets];
    for (i, when) in answered {
        at[i] = when;
    }
    Ok(at)
}

/// The report's section.
pub fn markdown(result: &PlansResult, command: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}\n", SECTION.trim_start());
    let _ = writeln!(
        out,
        "Measured with `{command}` on commit {}, from {}. {} Pets were converged (`Automatic`) on a control plane with a durable store and the operator at its defaults, then each was switched to `changePolicy: Approve` (nothing to change, so nothing shown), then all were renamed at once, {} patches at a time. Each rename is timed from the API server's answer to its patch until a watch on the Pets shows that Pet's `status.plan` for the new generation.\n",
        result.commit, result.started_at, result.pets, result.concurrency,
    );
    let _ = writeln!(
        out,
        "| measurement | goal | measured |  |\n|---|---|---|---|"
    );
    let _ = writeln!(
        out,
        "| plans shown after the bulk rename | {n} of {n} | {} | {} |",
        result.shown,
        if result.shown == result.pets {
            "met"
        } else {
            "not met"
        },
        n = result.pets,
    );
    let _ = writeln!(
        out,
        "| edit to plan shown, p50 / p99 / max | p99 ≤ {} | {} / {} / {} | {} |",
        ms(GOAL_P99),
        ms(result.p50),
        ms(result.p99),
        ms(result.max),
        if result.p99 <= GOAL_P99 {
            "met"
        } else {
            "not met"
        },
    );
    let _ = writeln!(
        out,
        "| store write RPCs, from the switch to the last plan shown | 0 | {} | {} |",
        result.store_writes,
        if result.store_writes == 0.0 {
            "met"
        } else {
            "not met"
        },
    );
    let _ = writeln!(
        out,
        "\nThe {} edits were answered over {:.1} s; every plan was shown {:.1} s after the first edit's answer. Each plan is a status write: for a burst, how soon each shows is bounded by how fast the API server takes status writes (see the floor at N = 1000 in the convergence table above).",
        result.pets,
        result.edits_took.as_secs_f64(),
        result.all_shown.as_secs_f64()
    );
    out
}

fn ms(duration: Duration) -> String {
    format!("{:.0} ms", duration.as_secs_f64() * 1000.0)
}
