//! Plans under `Approve`: N Pets converged, each switched to `Approve`
//! (nothing to change, so nothing shown), then all renamed at once. Each
//! rename is timed from the API server's answer to the patch until a watch
//! on the Pets shows that Pet's plan for the new generation. The store's
//! own count of write RPCs over the whole edit must not move.

use std::fmt::Write as _;
use std::time::Duration;

use kube::api::Api;
use petstore_operator::crd::Pet;

use crate::apimetrics::{self, RequestCounts};
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

/// Bulk renames measured, one after the other, each on an idle operator
/// (the previous round's Events written): one burst's tail varies from run
/// to run on 2 cores, so the goal is judged on all of them together.
pub const ROUNDS: usize = 5;

/// One bulk rename.
#[derive(Clone, Debug, Default)]
pub struct Round {
    pub p99: Duration,
    /// From the first edit's answer to the last one's.
    pub edits_took: Duration,
    /// From the first edit's answer to the last plan shown.
    pub all_shown: Duration,
}

#[derive(Clone, Debug, Default)]
pub struct PlansResult {
    pub pets: usize,
    /// Patches in flight at once.
    pub concurrency: usize,
    /// Edits (of every round) whose plan was shown before the timeout.
    pub shown: usize,
    /// Over every round's edits together.
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
    pub rounds: Vec<Round>,
    /// Write RPCs the store answered from before the switch to `Approve`
    /// until the last plan was shown.
    pub store_writes: f64,
    /// API requests to Pets and Events from the first rename until the last
    /// plan was shown, the renames included: what each edit costs the API
    /// server, which shares the cores with everything else.
    pub api_requests: RequestCounts,
    pub started_at: String,
    pub commit: String,
}

impl PlansResult {
    /// Every round renames every Pet once.
    pub fn edits(&self) -> usize {
        self.pets * self.rounds.len()
    }

    pub fn goal_met(&self) -> bool {
        self.edits() > 0
            && self.shown == self.edits()
            && self.p99 <= GOAL_P99
            && self.store_writes == 0.0
    }
}

/// The Pets' generation after the first rename: created (1), switched (2),
/// renamed (3); each round adds one.
const FIRST_EDITED_GENERATION: i64 = 3;

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
        // notes when each first shows a plan for each renamed generation.
        let started_at = chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string();
        let api_before = apimetrics::scrape(&env.cp)?;
        let mut latencies = Vec::new();
        let mut rounds = Vec::new();
        for round in 0..ROUNDS {
            let generation = FIRST_EDITED_GENERATION + round as i64;
            progress(&format!(
                "plans: renaming {} Pets in Approve, round {} of {ROUNDS}",
                config.pets,
                round + 1
            ));
            let answered = patch_all(
                &api,
                config.pets,
                config.concurrency,
                |i| serde_json::json!({"spec": {"name": format!("Renamed {round} {i}")}}),
            )
            .await?;
            // A timeout is a result too: the plans not shown are left out
            // of the count, and the goal is not met.
            let _ = tracker
                .all(
                    Shows::Plan,
                    config.pets,
                    generation,
                    timeout,
                    "every plan shown",
                )
                .await;
            let shown = tracker.planned_since(generation);
            let mut this_round: Vec<Duration> = (0..config.pets)
                .filter_map(|i| {
                    let at = shown.get(&format!("pet-{i}"))?;
                    Some(at.saturating_duration_since(answered[i]))
                })
                .collect();
            this_round.sort();
            let first_answer = answered.iter().min().copied();
            let since_first = |last: Option<&std::time::Instant>| match (first_answer, last) {
                (Some(first), Some(last)) => last.saturating_duration_since(first),
                _ => Duration::ZERO,
            };
            rounds.push(Round {
                p99: percentile(&this_round, 0.99),
                edits_took: since_first(answered.iter().max()),
                all_shown: since_first(shown.values().max()),
            });
            latencies.extend(this_round);
            // The next burst starts on an idle operator, as a user's would.
            events_drained(&operator, timeout).await?;
        }
        let store_writes = env.store.writes()? - writes_before;
        let api_requests = apimetrics::diff(
            &api_before,
            &apimetrics::scrape(&env.cp)?,
            &["pets", "events"],
        );
        latencies.sort();
        Ok(PlansResult {
            pets: config.pets,
            concurrency: config.concurrency,
            shown: latencies.len(),
            p50: percentile(&latencies, 0.50),
            p99: percentile(&latencies, 0.99),
            max: latencies.last().copied().unwrap_or_default(),
            rounds,
            store_writes,
            api_requests,
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
        "Measured with `{command}` on commit {}, from {}. {} Pets were converged (`Automatic`) on a control plane with a durable store and the operator at its defaults, then each was switched to `changePolicy: Approve` (nothing to change, so nothing shown), then all were renamed at once, {} patches at a time, {} times over, each time once the operator was idle again (its Events written). Each rename is timed from the API server's answer to its patch until a watch on the Pets shows that Pet's `status.plan` for the new generation; the percentiles are over all {} renames.\n",
        result.commit,
        result.started_at,
        result.pets,
        result.concurrency,
        result.rounds.len(),
        result.edits(),
    );
    let _ = writeln!(
        out,
        "| measurement | goal | measured |  |\n|---|---|---|---|"
    );
    let _ = writeln!(
        out,
        "| plans shown after the bulk renames | {n} of {n} | {} | {} |",
        result.shown,
        if result.shown == result.edits() {
            "met"
        } else {
            "not met"
        },
        n = result.edits(),
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
        "\n| round | edits answered over | last plan shown after the first answer | p99 |\n|---:|---:|---:|---:|"
    );
    for (i, round) in result.rounds.iter().enumerate() {
        let _ = writeln!(
            out,
            "| {} | {:.1} s | {:.1} s | {} |",
            i + 1,
            round.edits_took.as_secs_f64(),
            round.all_shown.as_secs_f64(),
            ms(round.p99)
        );
    }
    let _ = writeln!(
        out,
        "\nEach plan is a status write: for a burst, how soon each shows is bounded by how fast the API server takes status writes (see the floor at N = 1000 in the convergence table above)."
    );
    let _ = writeln!(
        out,
        "\nAPI requests to Pets and Events over the same time, the renames included: {}.",
        result
            .api_requests
            .iter()
            .map(|((resource, verb), n)| format!("{verb} {resource} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    out
}

fn ms(duration: Duration) -> String {
    format!("{:.0} ms", duration.as_secs_f64() * 1000.0)
}
