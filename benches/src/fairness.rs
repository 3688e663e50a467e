//! Fairness between namespaces: N Pets created at once in one namespace
//! (the burst), by [`BURST_CLIENTS`] clients, while a Pet is created in
//! another namespace every [`PROBE_EVERY`] until the whole burst is Ready.
//! Each of those probes is timed from its create's answer until a watch
//! shows it Ready. The operator is the release binary with its shipped
//! settings, on a durable store.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::Api;
use kube::api::PostParams;
use kube::runtime::{WatchStreamExt, watcher};
use petstore_operator::crd::Pet;
use tokio::sync::Notify;

use crate::convergence::{
    NAMESPACE, Shows, Tracker, create_pets, kube_error, pet, ready, shipped_options, start_leader,
    warmed_up,
};
use crate::procstat;
use crate::rotation::{p50_p99_max, quantile};
use fixtures::{Env, Result, Storage};

/// Where the section of the report starts; runs that do not measure it
/// keep it as it is.
pub const SECTION: &str = "\n## Fairness";

/// The goal: every probe Ready within this, at p99.
pub const GOAL: Duration = Duration::from_secs(2);

/// How often a probe Pet is created in the other namespace.
pub const PROBE_EVERY: Duration = Duration::from_millis(250);

/// The burst's clients, creating at once.
pub const BURST_CLIENTS: usize = 64;

const PROBE_NAMESPACE: &str = "probe";

#[derive(Clone, Debug)]
pub struct FairnessConfig {
    pub pets: usize,
}

#[derive(Clone, Debug, Default)]
pub struct FairnessResult {
    pub pets: usize,
    /// From the first create to the last create's answer.
    pub burst_created: Duration,
    /// From the first create until every Pet of the burst was Ready.
    pub burst_ready: Duration,
    /// Each probe, from its create's answer until it was seen Ready.
    pub probes: Vec<Duration>,
    pub operator_peak_rss_kib: u64,
    /// The machine's load averages when the burst ended.
    pub load: String,
    pub stamp: crate::report::Stamp,
}

impl FairnessResult {
    fn sorted_probes(&self) -> Vec<Duration> {
        let mut sorted = self.probes.clone();
        sorted.sort();
        sorted
    }

    /// The `q`-quantile of the probes (nearest rank).
    pub fn probe_quantile(&self, q: f64) -> Duration {
        quantile(&self.sorted_probes(), q)
    }

    pub fn goal_met(&self) -> bool {
        !self.probes.is_empty() && self.probe_quantile(0.99) <= GOAL
    }
}

pub fn measure(config: &FairnessConfig, progress: &dyn Fn(&str)) -> Result<FairnessResult> {
    let rt = crate::runtime()?;
    let env = Env::start(Storage::Durable)?;
    let mut operator = start_leader(&env, &shipped_options(&env, "bench-operator"))?;
    let timeout = Duration::from_secs(600) + Duration::from_millis(20 * config.pets as u64);
    let stamp = crate::report::Stamp::now();
    let n = config.pets;
    let measured = rt.block_on(async {
        let client = warmed_up(&env, timeout).await?;
        env.cp.ensure_namespace(PROBE_NAMESPACE)?;
        let burst_api: Api<Pet> = Api::namespaced(client.clone(), NAMESPACE);
        let probe_api: Api<Pet> = Api::namespaced(client, PROBE_NAMESPACE);
        let mut burst = Tracker::start(burst_api.clone());
        let probes_ready = ReadyTimes::watch(probe_api.clone());
        let stop = Arc::new(Notify::new());
        progress(&format!(
            "fairness: {n} Pets at once in one namespace, a probe in another every {} ms",
            PROBE_EVERY.as_millis()
        ));
        let started = Instant::now();
        let creating = tokio::spawn(async move {
            create_pets(&burst_api, n, BURST_CLIENTS).await?;
            Ok::<_, fixtures::Error>(started.elapsed())
        });
        let probing = tokio::spawn(probe_until(probe_api, Arc::clone(&stop)));
        burst
            .all(Shows::Ready, n, 1, timeout, "every Pet of the burst Ready")
            .await?;
        let burst_ready = started.elapsed();
        let load = crate::report::load_average();
        stop.notify_one();
        let burst_created = creating
            .await
            .map_err(|e| kube_error(format!("the burst's creates: {e}")))??;
        let created = probing
            .await
            .map_err(|e| kube_error(format!("the probes: {e}")))??;
        let probes = probes_ready.latencies(&created, timeout).await?;
        Ok::<_, fixtures::Error>((burst_created, burst_ready, probes, load))
    });
    let (burst_created, burst_ready, probes, load) = measured?;
    let operator_peak_rss_kib = operator
        .process()
        .pid()
        .and_then(procstat::peak_rss_kib)
        .unwrap_or(0);
    Ok(FairnessResult {
        pets: n,
        burst_created,
        burst_ready,
        probes,
        operator_peak_rss_kib,
        load,
        stamp,
    })
}

/// Creates a probe every [`PROBE_EVERY`] until `stop`; when each create
/// was answered, by name.
async fn probe_until(api: Api<Pet>, stop: Arc<Notify>) -> Result<Vec<(String, Instant)>> {
    let mut created = Vec::new();
    let mut ticks = tokio::time::interval(PROBE_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let stopped = stop.notified();
    tokio::pin!(stopped);
    for i in 0.. {
        tokio::select! {
            () = &mut stopped => break,
            _ = ticks.tick() => {}
        }
        let pet = pet(i);
        api.create(&PostParams::default(), &pet)
            .await
            .map_err(kube_error)?;
        created.push((pet.metadata.name.unwrap_or_default(), Instant::now()));
    }
    Ok(created)
}

/// When each Pet of a namespace was first seen Ready.
struct ReadyTimes {
    seen: Arc<Mutex<HashMap<String, Instant>>>,
}

impl ReadyTimes {
    fn watch(api: Api<Pet>) -> Self {
        let seen = Arc::new(Mutex::new(HashMap::new()));
        let state = Arc::clone(&seen);
        tokio::spawn(async move {
            let mut pets = watcher(api, watcher::Config::default())
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(pet) = pets.next().await {
                let Ok(pet) = pet else { continue };
                if ready(&pet) {
                    let name = pet.metadata.name.unwrap_or_default();
                    if let Ok(mut seen) = state.lock() {
                        seen.entry(name).or_insert_with(Instant::now);
                    }
                }
            }
        });
        Self { seen }
    }

    /// Each created Pet's time to Ready, once all are Ready.
    async fn latencies(
        &self,
        created: &[(String, Instant)],
        timeout: Duration,
    ) -> Result<Vec<Duration>> {
        let deadline = Instant::now() + timeout;
        loop {
            let times: Option<Vec<Duration>> = {
                let seen = self
                    .seen
                    .lock()
                    .map_err(|_| kube_error("the probes' watch panicked"))?;
                created
                    .iter()
                    .map(|(name, at)| {
                        seen.get(name)
                            .map(|ready| ready.saturating_duration_since(*at))
                    })
                    .collect()
            };
            if let Some(times) = times {
                return Ok(times);
            }
            if Instant::now() >= deadline {
                return Err(fixtures::Error::Timeout(
                    timeout,
                    "every probe Ready".into(),
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn ms(d: Duration) -> String {
    format!("{} ms", d.as_millis())
}

pub fn markdown(result: &FairnessResult, command: &str) -> String {
    let n = result.pets;
    let mut out = crate::report::measured_section(
        SECTION,
        command,
        &result.stamp,
        &format!(
            "One operator with its shipped settings, on a durable store. {n} Pets were created at once in one namespace by {BURST_CLIENTS} clients, and one Pet in another namespace every {} ms until the whole burst was Ready. Each of those {} probes is timed from its create's answer until a watch saw it Ready. The operator takes the namespaces in turn (`operator/src/controller/fair_queue.rs`). Load averages when the burst was Ready: {}.",
            PROBE_EVERY.as_millis(),
            result.probes.len(),
            result.load,
        ),
    );
    let _ = writeln!(
        out,
        "| a probe Pet Ready, p50 / p99 / max | p99 ≤ {} | {} | {} |",
        ms(GOAL),
        p50_p99_max(&result.sorted_probes(), ms),
        crate::report::verdict(result.goal_met()),
    );
    let _ = writeln!(
        out,
        "| the burst: all created / all Ready | | {:.1} s / {:.1} s | |",
        result.burst_created.as_secs_f64(),
        result.burst_ready.as_secs_f64(),
    );
    let _ = writeln!(
        out,
        "| the operator's peak RSS | | {:.1} MiB | |",
        result.operator_peak_rss_kib as f64 / 1024.0,
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(probes_ms: &[u64]) -> FairnessResult {
        FairnessResult {
            pets: 10,
            probes: probes_ms
                .iter()
                .copied()
                .map(Duration::from_millis)
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn the_goal_is_the_probes_p99() {
        let mut probes = vec![100; 99];
        probes.push(5_000);
        assert!(result(&probes).goal_met(), "one slow probe in 100 is p100");
        probes.push(5_000);
        assert!(!result(&probes).goal_met(), "two in 101 are p99");
        assert!(!result(&[]).goal_met(), "no probe shows nothing");
    }

    #[test]
    fn the_section_shows_the_quantiles_and_whether_the_goal_was_met() {
        let section = markdown(&result(&[10, 20, 3_000]), "hack/bench.sh --fairness 10");
        assert!(section.starts_with("## Fairness"));
        assert!(
            section.contains("20 ms / 3000 ms / 3000 ms | **not met**"),
            "{section}"
        );
    }
}
