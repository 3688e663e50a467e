//! Plans under `Approve`: N Pets converged, each switched to `Approve`
//! (nothing to change, so nothing shown), then all renamed at once. Each
//! rename is timed from the API server's answer to the patch until a watch
//! on the Pets shows that Pet's plan for the new generation. The store's
//! own count of write RPCs over the whole edit must not move.

use std::fmt::Write as _;
use std::time::Duration;

use kube::api::Api;
use petstore_operator::crd::Pet;

use crate::convergence::{
    NAMESPACE, Shows, Tracker, client_from, create_pets, events_drained, patch_all,
    shipped_options, start_leader,
};
use crate::store_load::percentile;
use fixtures::{Env, Result, Storage};

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
            .all(Shows::Ready, config.pets, 1, timeout, "all Pets Ready")
            .await?;
        events_drained(&operator, timeout).await?;

        let writes_before = env.store.writes()?;
        progress("plans: switching every Pet to Approve");
        patch_all(
            &api,
            config.pets,
            config.concurrency,
            |_| serde_json::json!({"spec": {"changePolicy": "Approve"}}),
        )
        .await?;
        tracker
            .all(
                Shows::Ready,
                config.pets,
                2,
                timeout,
                "all Pets Ready in Approve",
            )
            .await?;
        events_drained(&operator, timeout).await?;

        // The tracker's watch, running since before the Pets were made,
        // notes when each first shows a plan for the renamed generation.
        let started_at = chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string();
        progress(&format!("plans: renaming {} Pets in Approve", config.pets));
        let answered = patch_all(
            &api,
            config.pets,
            config.concurrency,
            |i| serde_json::json!({"spec": {"name": format!("Renamed {i}")}}),
        )
        .await?;
        // A timeout is a result too: the plans not shown are left out of
        // the count, and the goal is not met.
        let _ = tracker
            .all(
                Shows::Plan,
                config.pets,
                EDITED_GENERATION,
                timeout,
                "every plan shown",
            )
            .await;
        let store_writes = env.store.writes()? - writes_before;

        let shown = tracker.planned_since(EDITED_GENERATION);
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
