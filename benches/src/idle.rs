//! Idle store calls at the operator's defaults, measured over a real
//! window: N Pets converged on two control planes at once, each with its
//! own store, one operator following the store's change feed (the default)
//! and one polling alone (`--follow-store-changes=false`), both at the
//! default intervals (a 5-minute poll, an hourly audit). Then every store
//! call each makes over the same wall-clock window with nothing changing.
//! Nothing is scaled: the figures are the window's counts.
//!
//! With `observe`, once converged every Pet is switched to `changePolicy:
//! Observe` and renamed in the same patch, so that each holds a pending
//! plan through the window: what a team watching a store it does not let
//! the operator write costs.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use kube::api::Api;
use petstore_operator::crd::Pet;

use crate::convergence::{
    NAMESPACE, Shows, Tracker, client_from, create_pets, events_drained, metric_sum,
    shipped_options, start_leader, store_calls, writes_since,
};
use crate::report::plain_verdict;
use fixtures::{Env, Operator, Result, Storage};

/// Where the idle section of the report starts; runs that do not measure
/// it keep it as it is.
pub const SECTION: &str = "\n## Idle store calls";
/// The same for the Observe run.
// Not "Idle store calls ...": the report finds a section by its heading's
// first occurrence, so neither heading may contain the other.
pub const OBSERVE_SECTION: &str = "\n## Observe: idle store calls";

/// The longest window: the goal is per audit interval (an hour), and a
/// window at most that long reads each Pet at most once while the feed is
/// followed, so its count compares with the goal as it is.
pub const MAX_WINDOW: Duration = Duration::from_secs(3600);

#[derive(Clone, Debug)]
pub struct IdleConfig {
    pub pets: usize,
    pub window: Duration,
    pub concurrency: usize,
    /// Every Pet in `Observe` with a pending plan through the window.
    pub observe: bool,
}

/// One operator's side of the window.
#[derive(Clone, Debug, Default)]
pub struct IdleSide {
    /// Store calls in the window, by method.
    pub calls: BTreeMap<String, u64>,
    /// Writes to Pets and Events in the window.
    pub api_writes: u64,
    /// Whether the operator followed the change feed at the window's end.
    pub feed_connected: bool,
    pub converge: Duration,
}

impl IdleSide {
    pub fn total(&self) -> u64 {
        self.calls.values().sum()
    }

    fn by_method(&self) -> String {
        let parts: Vec<String> = self
            .calls
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(method, n)| format!("{method} {n}"))
            .collect();
        if parts.is_empty() {
            "none".into()
        } else {
            parts.join(", ")
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct IdleResult {
    pub pets: usize,
    /// Measured with every Pet in `Observe` and a plan pending.
    pub observe: bool,
    /// The window as timed by its first and last scrape.
    pub window: Duration,
    /// From the later of the two convergences to the window's start.
    pub after_convergence: Duration,
    /// When the window started, and the commit measured.
    pub stamp: crate::report::Stamp,
    pub feed: IdleSide,
    pub polling: IdleSide,
}

impl IdleResult {
    /// The goal, exactly as printed: at most N store calls with the feed
    /// followed. It is shown only by a window in which polling alone makes
    /// more than N, so that a feed-on operator that polled would fail it,
    /// and only by a window of at most an hour.
    pub fn goal_met(&self) -> bool {
        self.window <= MAX_WINDOW + Duration::from_secs(60)
            && self.feed.feed_connected
            && !self.polling.feed_connected
            && self.feed.total() <= self.pets as u64
            && self.polling.total() > self.pets as u64
    }
}

/// Converges `config.pets` Pets on each side, then counts each operator's
/// store calls over `config.window`.
pub fn measure(config: &IdleConfig, progress: &dyn Fn(&str)) -> Result<IdleResult> {
    let rt = crate::runtime()?;
    let feed_env = Env::start(Storage::Durable)?;
    let polling_env = Env::start(Storage::Durable)?;
    let feed = start_leader(&feed_env, &defaults(&feed_env, "idle-feed", true))?;
    let polling = start_leader(&polling_env, &defaults(&polling_env, "idle-polling", false))?;
    let timeout = Duration::from_secs(120 + config.pets as u64 / 5);
    rt.block_on(async {
        progress(&format!(
            "idle: converging {} Pets on each side at once",
            config.pets
        ));
        let (feed_converge, polling_converge) = futures::try_join!(
            converge(&feed_env, &feed, config, timeout, true),
            converge(&polling_env, &polling, config, timeout, false),
        )?;
        let converged = Instant::now();
        let stamp = crate::report::Stamp::now();
        let feed_before = store_calls(&feed.metrics()?);
        let polling_before = store_calls(&polling.metrics()?);
        let feed_api = crate::apimetrics::scrape(&feed_env.cp)?;
        let polling_api = crate::apimetrics::scrape(&polling_env.cp)?;
        let window_started = Instant::now();
        progress(&format!(
            "idle: counting store calls for {} from {}",
            crate::report::duration_words(config.window),
            stamp.started_at
        ));
        tokio::time::sleep(config.window).await;
        let feed_after = store_calls(&feed.metrics()?);
        let polling_after = store_calls(&polling.metrics()?);
        let window = window_started.elapsed();
        let side = |operator: &Operator,
                    before: &BTreeMap<String, u64>,
                    after: &BTreeMap<String, u64>,
                    env: &Env,
                    api: &crate::apimetrics::RequestCounts,
                    converge: Duration|
         -> Result<IdleSide> {
            Ok(IdleSide {
                calls: crate::apimetrics::increase(before, after),
                api_writes: writes_since(&env.cp, api)?,
                feed_connected: metric_sum(
                    &operator.metrics()?,
                    "petstore_operator_change_feed_connected",
                ) == 1.0,
                converge,
            })
        };
        Ok(IdleResult {
            pets: config.pets,
            observe: config.observe,
            window,
            after_convergence: window_started - converged,
            stamp,
            feed: side(
                &feed,
                &feed_before,
                &feed_after,
                &feed_env,
                &feed_api,
                feed_converge,
            )?,
            polling: side(
                &polling,
                &polling_before,
                &polling_after,
                &polling_env,
                &polling_api,
                polling_converge,
            )?,
        })
    })
}

/// The operator's flags as it ships, but for the feed.
fn defaults(env: &Env, identity: &str, follow_feed: bool) -> fixtures::OperatorOptions {
    let mut options = shipped_options(env, identity);
    options.backoff_max = "5m";
    if !follow_feed {
        options
            .extra_args
            .push("--follow-store-changes=false".into());
    }
    options
}

/// Creates the Pets and waits until every one is Ready (and, with
/// `events`, its Events written); how long that took. The polling side's
/// Events are not waited for: its writer yields to reconciles, and a
/// 5-minute poll of 20,000 Pets keeps it busy, so they trail by an hour and
/// more (17,792 still queued ten minutes after 20,000 Pets converged). Its
/// window then counts them as API writes, shown beside the feed side's.
async fn converge(
    env: &Env,
    operator: &Operator,
    config: &IdleConfig,
    timeout: Duration,
    events: bool,
) -> Result<Duration> {
    env.cp.ensure_namespace(NAMESPACE)?;
    let client = client_from(&env.cp.kubeconfig).await?;
    let api: Api<Pet> = Api::namespaced(client, NAMESPACE);
    let mut tracker = Tracker::start(api.clone());
    let started = Instant::now();
    create_pets(&api, config.pets, config.concurrency).await?;
    tracker
        .all(Shows::Ready, config.pets, 1, timeout, "all Pets Ready")
        .await?;
    if events {
        events_drained(operator, timeout).await?;
    }
    if config.observe {
        crate::convergence::patch_all(&api, config.pets, config.concurrency, |i| {
            serde_json::json!({"spec": {"changePolicy": "Observe", "name": format!("Renamed {i}")}})
        })
        .await?;
        // Generation 2: the switch and the rename, one patch.
        tracker
            .all(
                Shows::Plan,
                config.pets,
                2,
                timeout,
                "every Pet's plan shown in Observe",
            )
            .await?;
        if events {
            events_drained(operator, timeout).await?;
        }
    }
    Ok(started.elapsed())
}

/// The report's section for this run.
pub fn section(observe: bool) -> &'static str {
    if observe { OBSERVE_SECTION } else { SECTION }
}

/// The report's idle section (or its Observe section).
pub fn markdown(result: &IdleResult, command: &str) -> String {
    let window = crate::report::duration_words(result.window);
    let n = result.pets;
    let mut out = crate::report::goal_section(
        section(result.observe),
        &format!(
            "Measured with `{command}` on commit {commit}, window from {started} ({profile} build). {n} Pets were converged on each of two control planes at once, each with its own durable store: one operator with the defaults (the store's change feed followed, each Pet audited every hour, `--audit-interval 1h`), one with the defaults but `--follow-store-changes=false` (each Pet polled every 5 minutes, `--poll-interval 5m`). {observe}Once both were Ready, and the feed side's Events written, every store call each operator made was counted over the same {window} window with nothing changing (its `petstore_operator_store_call_duration_seconds_count`, by method). The figures are the window's counts, **not scaled to an hour**{full}. The audit reads a Pet at least half an audit interval after its last reconcile, at a phase fixed by its UID, so a window that starts at convergence holds no audit reads in its first 30 minutes, and any window of at most an hour reads each Pet at most once: the goal, N calls an hour, applies to the window's count as it is.",
            commit = result.stamp.commit,
            started = result.stamp.started_at,
            profile = crate::report::build(),
            observe = if result.observe {
                "Once converged, every Pet was switched to `changePolicy: Observe` and renamed in the same patch, so each held a pending `update name` plan, never applied, through the window. "
            } else {
                ""
            },
            full = if result.window >= MAX_WINDOW {
                " (the window is a full hour)"
            } else {
                ""
            },
        ),
    );
    let _ = writeln!(
        out,
        "| store calls in a {window} idle window at N = {n}{observe}, with the defaults (the feed followed) | ≤ {n} | {} ({}) | {} |",
        result.feed.total(),
        result.feed.by_method(),
        plain_verdict(result.goal_met()),
        observe = if result.observe {
            " in `Observe`, each with a plan pending"
        } else {
            ""
        },
    );
    let _ = writeln!(
        out,
        "| beside it: the same window, `--follow-store-changes=false` (5-minute poll) | (as before the feed) | {} ({}) |  |",
        result.polling.total(),
        result.polling.by_method(),
    );
    let _ = writeln!(
        out,
        "| API writes (Pets and Events) in the window with the feed (beside it, polling, whose Events were not waited for) | 0 | {} ({}) | {} |",
        result.feed.api_writes,
        result.polling.api_writes,
        plain_verdict(result.feed.api_writes == 0),
    );
    let _ = writeln!(
        out,
        "\nConverging{} took {:.1} s with the feed and {:.1} s polling (both at once); the window started {:.1} s after the later one. *Met* needs the feed-on count within the goal, the feed connected on that side and not on the other, and the polling side above N, so that a window too short to tell the two apart shows nothing.",
        if result.observe {
            " (and every plan shown in Observe)"
        } else {
            ""
        },
        result.feed.converge.as_secs_f64(),
        result.polling.converge.as_secs_f64(),
        result.after_convergence.as_secs_f64(),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn side(calls: u64, connected: bool) -> IdleSide {
        IdleSide {
            calls: [("GetPets".to_owned(), calls)].into(),
            feed_connected: connected,
            ..Default::default()
        }
    }

    fn result(feed: u64, polling: u64) -> IdleResult {
        IdleResult {
            pets: 1000,
            window: Duration::from_secs(3000),
            feed: side(feed, true),
            polling: side(polling, false),
            ..Default::default()
        }
    }

    #[test]
    fn the_goal_is_the_printed_one_and_needs_a_window_that_tells_feed_from_poll() {
        assert!(result(0, 9000).goal_met());
        assert!(result(1000, 9000).goal_met());
        assert!(!result(1001, 9000).goal_met(), "one call above N fails");
        // Polling too made no more than N: the window showed nothing.
        assert!(!result(0, 1000).goal_met());
        let mut swapped = result(0, 9000);
        swapped.feed.feed_connected = false;
        assert!(!swapped.goal_met(), "the feed side did not follow the feed");
        let mut long = result(0, 9000);
        long.window = Duration::from_secs(7200);
        assert!(!long.goal_met(), "two hours may read each Pet twice");
    }

    #[test]
    fn the_observe_run_has_a_section_of_its_own_and_says_what_it_measured() {
        let automatic = markdown(&result(10, 9000), "bench --idle 50m");
        assert!(automatic.starts_with(SECTION.trim_start()), "{automatic}");
        assert!(!automatic.contains("Observe"), "{automatic}");
        let mut observed = result(10, 9000);
        observed.observe = true;
        let observed = markdown(&observed, "bench --idle 50m --idle-observe");
        assert!(
            observed.starts_with(OBSERVE_SECTION.trim_start()),
            "{observed}"
        );
        assert!(
            observed.contains("N = 1000 in `Observe`, each with a plan pending"),
            "{observed}"
        );
        // A section is found by its heading's first occurrence.
        assert!(!OBSERVE_SECTION.contains(SECTION) && !SECTION.contains(OBSERVE_SECTION));
    }
}
