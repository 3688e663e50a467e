//! The planning sequence, shared by a reconcile and `kubectl petstore
//! plan` so that the plan the plugin prints is the one the operator would
//! make: whether the installation is going away (when a deletion would
//! delete a record), the decision step's first step, the store read, the
//! decision and the [`Plan`] made of it.

use tracing::info_span;

use super::uninstall::UninstallProbe;
use crate::Error;
use crate::decision::{Facts, Next, Plan, Step, decide, first_step, plan as plan_of};
use crate::status::Outcome;
use crate::store::PetStore;

/// Where planning stopped: a first step that is not a read, or the plan.
#[derive(Debug)]
pub enum Planned {
    /// Nothing to do and nothing to write.
    Wait(Next),
    /// Touch nothing in the store; show `outcome` in the conditions.
    Hold {
        outcome: Outcome,
        next: Next,
    },
    /// Persist the finalizer, then plan again.
    AddFinalizer,
    /// Create without reading first ([`Step::Create`]).
    CreateFirst,
    Plan(Plan),
}

/// Plans for the Pet of `facts`, reading the installation (`uninstall`)
/// and the store as it must. With `may_create_first` false, a Pet that
/// would be created without a read is read first (the plugin, which writes
/// nothing; a reconcile whose create found a record already there).
pub async fn plan(
    store: &dyn PetStore,
    uninstall: Option<&UninstallProbe>,
    facts: &mut Facts,
    may_create_first: bool,
) -> Result<Planned, Error> {
    // Only a deletion that would delete a record needs to know.
    if let (true, Some(probe)) = (facts.deletion_would_delete_record(), uninstall) {
        facts.uninstalling = probe.check().await?;
    }
    let id = match first_step(facts) {
        Step::Wait(next) => return Ok(Planned::Wait(next)),
        Step::Hold { outcome, next } => return Ok(Planned::Hold { outcome, next }),
        Step::AddFinalizer => return Ok(Planned::AddFinalizer),
        Step::Create if may_create_first => return Ok(Planned::CreateFirst),
        Step::Create => None,
        Step::Observe { id } => id,
    };
    let observation = super::observe(store, id.as_deref(), facts).await?;
    let observed = observation.lookup();
    let facts = &*facts;
    Ok(Planned::Plan(
        petstore_telemetry::span(|| info_span!("decide"))
            .in_scope(|| plan_of(facts, decide(facts, observation), &observed)),
    ))
}
