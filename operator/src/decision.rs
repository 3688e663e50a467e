//! The pure decision step: the whole reconcile policy, with no I/O. The
//! controller gathers [`Facts`] about a Pet, asks [`first_step`] whether the
//! store needs to be read at all, reads it if so, and asks [`decide`] for a
//! [`Decision`], which [`plan`] turns into the [`Plan`] it shows and
//! executes (or, after a create that stood in for the read, asks
//! [`after_create`]); then it only executes the plan and records the outcome.
//!
//! A create has two shapes, for its two moments: [`Step::Create`] before
//! any read (the create is the read), and [`Target::Create`] in a plan made
//! after one.
//! Every branch is covered by the table tests in `tests.rs`.
//!
//! Ownership: a record is this Pet's only if its idempotency key is the
//! Pet's key (its installation and UID, [`Facts::key`]). Creating sets that
//! key; adopting a record named by the external-id annotation sets it by
//! compare-and-set from empty, so a record owned by anyone else is never
//! taken, and of two Pets racing for one record exactly one wins. No plan
//! ever updates or deletes a record whose key is not the Pet's, whatever
//! `status.id` says.
//!
//! A record also carries its Pet's identity, `<namespace>/<name>`, which
//! outlives the UID. A Pet with no record under its key takes the record
//! holding its identity by the same compare-and-set: from empty (an Orphan
//! deletion left it), or from a key of this installation (the cluster was
//! rebuilt or restored: in one installation, namespace and name name one
//! live Pet, so that key's Pet is gone). A record of another installation
//! is never taken: the Pet is held, naming it.
//!
//! [`plan`] turns a decision into the store writes it makes, which a
//! reconcile either executes or, by the change policy, shows as
//! `status.plan` ([`preview::gate`]).
//!
//! [`feed`] judges what a change on the store's change feed means for its
//! Pet.
//!
//! By job: `facts.rs` holds [`Facts`] and how they are read from a Pet;
//! `plan.rs` the vocabulary of steps, decisions, holds and stories;
//! `preview.rs` the [`Plan`] made of a decision; `rules.rs`
//! the rules that choose them; `prose.rs` every message they are told in.

mod facts;
pub mod feed;
mod plan;
pub mod preview;
mod prose;
mod rules;

pub use facts::{DriftBrake, Facts, Uninstall, facts_of};
pub use plan::{
    Cause, Decision, Finish, ForeignHolder, HandOver, Hold, Misspelled, Next, Observation, Step,
    Story, Sync, Target,
};
pub use preview::{Gate, Plan, StoreAction, Write, gate, nothing_planned, plan};
pub use prose::release_by_hand;
pub use rules::{after_create, decide, first_step, read_after_create};

#[cfg(test)]
mod tests;
