//! What tenancy's tokens cost at steady state, over a real window: a
//! durable store started with `--tenancy`, [`NAMESPACES`] namespaces with
//! their `petstore-tenant` ServiceAccounts and N Pets each, one operator
//! with its shipped settings and `--petstore-audience`. Once every Pet is
//! Ready, the operator's own counters are read at both ends of the window:
//! the TokenRequests it made (each namespace's, and the observer's for the
//! change feed) and its store calls. Nothing is scaled: the figures are
//! the window's counts.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use kube::api::Api;
use petstore_operator::crd::Pet;

use crate::convergence::{
    Shows, Tracker, client_from, create_pets, shipped_options, start_leader, store_calls,
};
use fixtures::{Env, Result, Storage};

/// Where the section of the report starts; runs that do not measure it
/// keep it as it is.
pub const SECTION: &str = "\n## Token cost";

/// Tenant namespaces, each with its own Pets and tokens.
pub const NAMESPACES: usize = 20;

/// The audience the store checks and the operator's tokens carry.
const AUDIENCE: &str = "petstore";

#[derive(Clone, Debug)]
pub struct TokenCostConfig {
    pub pets_per_namespace: usize,
    pub window: Duration,
}

#[derive(Clone, Debug, Default)]
pub struct TokenCostResult {
    pub pets_per_namespace: usize,
    pub window: Duration,
    pub converge: Duration,
    /// TokenRequests while converging: tenants', observer's.
    pub converging_tokens: (u64, u64),
    /// TokenRequests in the window: tenants', observer's.
    pub window_tokens: (u64, u64),
    /// Failed TokenRequests, over the whole run.
    pub failed_tokens: u64,
    /// Store calls in the window.
    pub window_calls: u64,
    pub stamp: crate::report::Stamp,
}

impl TokenCostResult {
    pub fn pets(&self) -> usize {
        NAMESPACES * self.pets_per_namespace
    }

    /// Tokens are cached, not minted per call: at most one TokenRequest
    /// per namespace for each 8 minutes of the window (a token lasts 10
    /// and is renewed with a fifth of its life left), plus one.
    pub fn per_namespace_bound(&self) -> u64 {
        self.window.as_secs() / (8 * 60) + 1
    }

    pub fn goal_met(&self) -> bool {
        self.failed_tokens == 0
            && self.window_tokens.0 <= self.per_namespace_bound() * NAMESPACES as u64
    }
}

pub(crate) fn tokens(metrics: &str) -> (u64, u64, u64) {
    let count = |account: &str, outcome: &str| {
        crate::apimetrics::samples(metrics, "petstore_operator_store_token_requests_total")
            .filter(|(labels, _)| {
                crate::apimetrics::label(labels, "account") == account
                    && crate::apimetrics::label(labels, "outcome") == outcome
            })
            .map(|(_, value)| value as u64)
            .sum::<u64>()
    };
    (
        count("tenant", "minted"),
        count("observer", "minted"),
        count("tenant", "failed") + count("observer", "failed"),
    )
}

fn namespace(i: usize) -> String {
    format!("team-{i:02}")
}

pub fn measure(config: &TokenCostConfig, progress: &dyn Fn(&str)) -> Result<TokenCostResult> {
    let rt = crate::runtime()?;
    let mut env = Env::start(Storage::Durable)?;
    let issuer = env.cp.token_issuer_flag()?;
    env.store.set_restart_args(
        fixtures::TenancyFlags::new(&issuer, AUDIENCE)
            .operator_observer()
            .os_args(),
    );
    env.store.restart(Storage::Durable)?;
    let mut setup = String::new();
    for i in 0..NAMESPACES {
        let namespace = namespace(i);
        let _ = write!(
            setup,
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {namespace}\n---\napiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: petstore-tenant\n  namespace: {namespace}\n---\n"
        );
    }
    env.cp.apply(&setup)?;
    let mut options = shipped_options(&env, "bench-operator");
    options
        .extra_args
        .extend(["--petstore-audience".into(), AUDIENCE.into()]);
    let operator = start_leader(&env, &options)?;
    let stamp = crate::report::Stamp::now();
    let per = config.pets_per_namespace;
    let timeout = Duration::from_secs(600);
    progress(&format!(
        "token cost: {per} Pets in each of {NAMESPACES} namespaces, on a store with tenancy"
    ));
    let converge = rt.block_on(async {
        let client = client_from(&env.cp.kubeconfig).await?;
        let started = Instant::now();
        let mut trackers = Vec::new();
        for i in 0..NAMESPACES {
            let api: Api<Pet> = Api::namespaced(client.clone(), &namespace(i));
            trackers.push(Tracker::start(api.clone()));
            create_pets(&api, per, 16).await?;
        }
        for tracker in &mut trackers {
            tracker
                .all(Shows::Ready, per, 1, timeout, "every Pet Ready")
                .await?;
        }
        Ok::<_, fixtures::Error>(started.elapsed())
    })?;
    let before = operator.metrics()?;
    let (tenant_before, observer_before, _) = tokens(&before);
    let calls_before: u64 = store_calls(&before).values().sum();
    progress(&format!(
        "token cost: converged in {:.1} s; counting over a {} s window",
        converge.as_secs_f64(),
        config.window.as_secs()
    ));
    std::thread::sleep(config.window);
    let after = operator.metrics()?;
    let (tenant_after, observer_after, failed) = tokens(&after);
    let calls_after: u64 = store_calls(&after).values().sum();
    Ok(TokenCostResult {
        pets_per_namespace: per,
        window: config.window,
        converge,
        converging_tokens: (tenant_before, observer_before),
        window_tokens: (
            tenant_after.saturating_sub(tenant_before),
            observer_after.saturating_sub(observer_before),
        ),
        failed_tokens: failed,
        window_calls: calls_after.saturating_sub(calls_before),
        stamp,
    })
}

pub fn markdown(result: &TokenCostResult, command: &str) -> String {
    let minutes = result.window.as_secs_f64() / 60.0;
    let mut out = crate::report::measured_section(
        SECTION,
        command,
        &result.stamp,
        &format!(
            "A durable store with `--tenancy`; {NAMESPACES} namespaces with {} Pets each ({} in all), one operator with its shipped settings and `--petstore-audience`. The operator's own counters (`petstore_operator_store_token_requests_total`, `petstore_operator_store_call_duration_seconds_count`) are read once every Pet is Ready, and again after a {minutes:.0}-minute window with nothing changing. Nothing is scaled.",
            result.pets_per_namespace,
            result.pets(),
        ),
    );
    let per_namespace = result.window_tokens.0 as f64 / NAMESPACES as f64;
    let _ = writeln!(
        out,
        "| tenants' TokenRequests in the {minutes:.0}-minute window, per namespace | ≤ {} (one per 8 minutes, plus one) | {per_namespace:.2} ({} in all) | {} |",
        result.per_namespace_bound(),
        result.window_tokens.0,
        crate::report::verdict(result.goal_met()),
    );
    let _ = writeln!(
        out,
        "| the observer's TokenRequests in the window | | {} | |",
        result.window_tokens.1
    );
    let _ = writeln!(
        out,
        "| failed TokenRequests, whole run | 0 | {} | |",
        result.failed_tokens
    );
    let _ = writeln!(
        out,
        "| store calls in the window, per Pet | | {:.3} ({} in all) | |",
        result.window_calls as f64 / result.pets().max(1) as f64,
        result.window_calls
    );
    let _ = writeln!(
        out,
        "| converging: time / tenants' TokenRequests / observer's | | {:.1} s / {} / {} | |",
        result.converge.as_secs_f64(),
        result.converging_tokens.0,
        result.converging_tokens.1
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_counters_are_read_by_account_and_outcome() {
        let metrics = "\
petstore_operator_store_token_requests_total{account=\"tenant\",outcome=\"minted\"} 40
petstore_operator_store_token_requests_total{account=\"observer\",outcome=\"minted\"} 2
petstore_operator_store_token_requests_total{account=\"tenant\",outcome=\"failed\"} 1
";
        assert_eq!(tokens(metrics), (40, 2, 1));
    }

    #[test]
    fn the_goal_allows_one_token_per_namespace_per_eight_minutes_and_no_failure() {
        let mut result = TokenCostResult {
            window: Duration::from_secs(3600),
            window_tokens: (8 * NAMESPACES as u64, 8),
            ..Default::default()
        };
        assert_eq!(result.per_namespace_bound(), 8);
        assert!(result.goal_met());
        result.window_tokens.0 += 1;
        assert!(!result.goal_met(), "one more than a token per 8 minutes");
        result.window_tokens.0 -= 1;
        result.failed_tokens = 1;
        assert!(!result.goal_met(), "a failed TokenRequest");
    }
}
