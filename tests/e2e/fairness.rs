//! One namespace's burst does not hold the Pets of another: the operator
//! takes the namespaces in turn (operator/src/controller/fair_queue.rs).
//!
//! Judged by order, not by a clock, so a slow or loaded machine cannot make
//! it pass or fail: one watch sees every Pet's writes in the API server's
//! own order, and counts the burst's Pets that became Ready after the quiet
//! namespace's Pet was created and before it was Ready. Taken in the order
//! they came, that would be the whole backlog.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use fixtures::{Env, Storage};
use futures::{Stream, StreamExt};
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use petstore_operator::crd::Pet;

use crate::typed::is_ready;

type Error = Box<dyn std::error::Error + Send + Sync>;

const BURST: usize = 300;
/// One Pet reconciled at a time, so the backlog drains slowly enough to be
/// seen on any machine, and each turn is one Pet.
const CONCURRENCY: &str = "--concurrency=1";
/// The burst's Pets that may become Ready while the quiet Pet waits: the one
/// in flight, and one turn of the burst beside each pass of the quiet Pet's
/// reconcile, with room to spare. In the order they came, it would be all
/// of the backlog (at least `BURST / 2`, checked).
const OVERTAKEN_AT_MOST: usize = 20;
const TIMEOUT: Duration = Duration::from_secs(240);

fn pet(namespace: &str, name: &str) -> String {
    format!(
        "apiVersion: petstore.example.com/v1\nkind: Pet\nmetadata:\n  name: {name}\n  namespace: {namespace}\nspec:\n  name: {name}\n  type: dog\n  birthday: \"2021-04-01\"\n"
    )
}

/// Reads Pets off the watch until `done` says so; fails after the timeout.
async fn watch_until(
    pets: &mut (impl Stream<Item = Result<Pet, watcher::Error>> + Unpin),
    what: &str,
    mut done: impl FnMut(&Pet) -> bool,
) -> Result<(), Error> {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        let pet = tokio::time::timeout_at(deadline, pets.next())
            .await
            .map_err(|_| format!("waited {TIMEOUT:?} for {what}"))?
            .ok_or("the watch ended")??;
        if done(&pet) {
            return Ok(());
        }
    }
}

#[test]
fn a_burst_in_one_namespace_does_not_hold_a_pet_of_another() -> Result<(), Error> {
    let env = Env::start(Storage::Memory)?;
    let cp = &env.cp;
    cp.ensure_namespace("burst")?;
    cp.ensure_namespace("quiet")?;
    // Made while no operator runs: it finds the whole burst at once.
    let burst: Vec<String> = (0..BURST).map(|i| pet("burst", &format!("p{i}"))).collect();
    cp.apply(&burst.join("---\n"))?;
    let rt = tokio::runtime::Runtime::new()?;
    let client = rt.block_on(crate::admin_client(&env))?;
    let mut pets = watcher(Api::<Pet>::all(client), watcher::Config::default())
        .default_backoff()
        .applied_objects()
        .boxed();
    let mut options = env.operator_options("fairness");
    options.extra_args.push(CONCURRENCY.into());
    let _operator = env.start_operator_with(&options)?;

    // The burst's Pets seen Ready.
    let mut ready = HashSet::new();
    rt.block_on(watch_until(
        &mut pets,
        "the burst's first Pet Ready",
        |pet| {
            if is_ready(pet) {
                ready.insert(pet.metadata.name.clone().unwrap_or_default());
            }
            !ready.is_empty()
        },
    ))?;
    let created = Instant::now();
    cp.apply(&pet("quiet", "alone"))?;
    let mut backlog = None;
    let mut overtaken = 0;
    rt.block_on(watch_until(&mut pets, "quiet/alone Ready", |pet| {
        let name = pet.metadata.name.clone().unwrap_or_default();
        if pet.metadata.namespace.as_deref() == Some("quiet") {
            // Its creation, in the watch's order: what is not Ready yet is
            // the backlog it would wait behind.
            backlog.get_or_insert(BURST - ready.len());
            return is_ready(pet);
        }
        if is_ready(pet) && ready.insert(name) && backlog.is_some() {
            overtaken += 1;
        }
        false
    }))?;
    let backlog = backlog.ok_or("quiet/alone was never seen")?;
    println!(
        "quiet/alone Ready {:?} after its apply returned; {overtaken} of a backlog of {backlog} burst Pets became Ready meanwhile",
        created.elapsed()
    );
    assert!(
        backlog >= BURST / 2,
        "the burst was over too soon to show anything: {backlog} of {BURST} left"
    );
    assert!(
        overtaken <= OVERTAKEN_AT_MOST,
        "{overtaken} of the burst's {backlog} waiting Pets were reconciled before the other namespace's one Pet (at most {OVERTAKEN_AT_MOST})"
    );
    Ok(())
}
