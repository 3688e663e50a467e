//! A plan pending across a restart and across a leader change: the new
//! process neither publishes its `PlanPending` Event again nor resets
//! `plan_oldest_age_seconds`, so the pending-plan alert still fires for an
//! operator restarted every day. The plan's start is `status.planPendingSince`.

use std::time::{Duration, Instant};

use fixtures::env::pet_manifest;
use fixtures::http::series_value;
use fixtures::{Env, Storage, wait_for};
use petstore_operator::crd::PetStatus;

use crate::typed;

const TIMEOUT: Duration = Duration::from_secs(60);

/// How often `PlanPending` was published for the Pet `name`: every Event
/// object, each counting its series' repeats.
fn plan_announcements(env: &Env, name: &str) -> fixtures::Result<u64> {
    let listed = env.cp.kubectl(&[
        "get",
        "events.events.k8s.io",
        "-n",
        "default",
        "-o",
        "jsonpath={range .items[*]}{.reason}/{.regarding.name}/{.series.count}{\"\\n\"}{end}",
    ])?;
    let wanted = format!("PlanPending/{name}/");
    Ok(listed
        .lines()
        .filter_map(|line| line.strip_prefix(&wanted))
        .map(|count| count.parse().unwrap_or(1))
        .sum())
}

/// Waits until `operator` leads and has taken the plan into its memory
/// with its Event queue drained, then checks the gauge's age against the
/// plan's real age and that no second Event was published.
fn check_the_plan_is_remembered(
    operator: &fixtures::Operator,
    shown_at: Instant,
) -> fixtures::Result<()> {
    wait_for(TIMEOUT, "the new leader to hold the pending plan", || {
        let scrape = operator.metrics().ok()?;
        (series_value(&scrape, "petstore_operator_leader") == Some(1.0)
            && series_value(&scrape, "petstore_operator_plans_pending") == Some(1.0)
            && series_value(&scrape, "petstore_operator_events_pending") == Some(0.0))
        .then_some(())
    })?;
    let waited = shown_at.elapsed();
    let scrape = operator.metrics()?;
    let age = series_value(&scrape, "petstore_operator_plan_oldest_age_seconds").unwrap_or(0.0);
    // The status keeps whole seconds at worst: a second's room, and the
    // new process's own age (a reset) would be far below `waited`.
    assert!(
        age + 1.0 >= waited.as_secs_f64(),
        "plan_oldest_age_seconds {age} after a plan pending for {waited:?}"
    );
    Ok(())
}

/// A Pet in Automatic applied now gets its Created Event after anything
/// the new leader queued for rex: once it is there, a repeat would be too.
fn marker_created(env: &Env, name: &str) -> fixtures::Result<()> {
    env.cp.apply(&pet_manifest(
        name,
        &[],
        r#" {name: Marker, type: cat, birthday: "2020-01-01"}"#,
    ))?;
    env.wait_ready("default", name, TIMEOUT)?;
    env.wait_event(&format!("Created/{name}"), TIMEOUT)?;
    Ok(())
}

#[test]
fn a_pending_plan_is_announced_once_and_keeps_its_age_across_restarts() -> fixtures::Result<()> {
    let env = Env::start(Storage::Durable)?;
    let mut first = env.start_operator("replica-1")?;
    env.cp.apply(&pet_manifest(
        "rex",
        &[],
        r#" {name: Rex, type: dog, birthday: "2022-03-01", changePolicy: Approve}"#,
    ))?;
    let status: PetStatus = typed::wait_pet(
        &env.cp,
        "default",
        "rex",
        TIMEOUT,
        "with a create plan",
        |pet| {
            let status = pet.status.as_ref()?;
            (status.plan.as_ref()?.summary == "create").then(|| status.clone())
        },
    )?;
    let shown_at = Instant::now();
    assert!(
        status.plan_pending_since.is_some(),
        "status.planPendingSince: {status:?}"
    );
    env.wait_event("PlanPending/rex", TIMEOUT)?;
    assert_eq!(plan_announcements(&env, "rex")?, 1);

    // A restart: kill -9, and the same replica again.
    first.kill();
    let restarted = env.start_operator("replica-1")?;
    check_the_plan_is_remembered(&restarted, shown_at)?;
    marker_created(&env, "marker-1")?;
    assert_eq!(
        plan_announcements(&env, "rex")?,
        1,
        "announced again after a restart"
    );

    // A leader change: a standby that never reconciled takes over.
    let standby = env.start_operator("replica-2")?;
    wait_for(TIMEOUT, "replica-2 to stand by", || {
        standby.log_contains("waiting for leadership").then_some(())
    })?;
    let mut restarted = restarted;
    restarted.kill();
    check_the_plan_is_remembered(&standby, shown_at)?;
    marker_created(&env, "marker-2")?;
    assert_eq!(
        plan_announcements(&env, "rex")?,
        1,
        "announced again after a leader change"
    );
    let pet = typed::pet(&env.cp, "default", "rex")?;
    assert_eq!(
        pet.status.and_then(|s| s.plan_pending_since),
        status.plan_pending_since,
        "the plan's start moved"
    );
    Ok(())
}
