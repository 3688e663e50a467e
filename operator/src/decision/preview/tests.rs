//! The plan a person sees, and whether it is written: one table per step,
//! each case named for its reason, and a property that the plan shown
//! under Approve or Observe is the one Automatic writes.

use proptest::prelude::*;

use super::super::tests::{facts, found, mine, record};
use super::*;
use crate::crd::{ChangePolicy, PetType};
use crate::decision::{DriftBrake, Uninstall};
use crate::decision::{Observation, Step, decide, first_step};
use crate::status::Reason;

const UID: &str = "uid-thor";

/// The plan of the decision made.
fn planned(facts: &Facts, observation: Observation) -> Plan {
    let observed = observation.lookup();
    plan(facts, decide(facts, observation), &observed)
}

fn approve(facts: Facts) -> Facts {
    facts.policy(ChangePolicy::Approve)
}

#[test]
fn preview_table() {
    let cases: Vec<(&str, Facts, Observation, &str)> = vec![
        ("a new Pet creates", facts(), found(None, None), "create"),
        (
            "a record in line writes nothing",
            facts().status_id("a"),
            found(mine("a"), mine("a")),
            "none",
        ),
        (
            "a spec edit names the fields it changes",
            facts()
                .status_id("a")
                .wanting(PetData::named("Thorbert").of_type(PetType::Cat)),
            found(mine("a"), mine("a")),
            "update name,type",
        ),
        (
            "adopting a keyless record that differs claims it, then updates",
            facts().external_id("x").wanting(PetData::named("Thorbert")),
            found(Some(record("x", "", PetData::test())), None),
            "claim, update name",
        ),
        (
            "a vanished record is created again",
            facts().status_id("gone"),
            found(None, None),
            "create",
        ),
        (
            "deleting deletes the Pet's record",
            facts().deleting(),
            found(None, mine("a")),
            "delete",
        ),
        (
            "deleting with Orphan releases it",
            facts().deleting().orphan(),
            found(None, mine("a")),
            "release",
        ),
        (
            "deleting in Observe leaves the record alone",
            facts().deleting().policy(ChangePolicy::Observe),
            found(None, mine("a")),
            "none",
        ),
        (
            "a record owned elsewhere is held, not written",
            facts().external_id("x"),
            found(Some(record("x", "uid-loki", PetData::test())), None),
            "none",
        ),
    ];
    for (name, facts, observation, summary) in cases {
        assert_eq!(planned(&facts, observation).summary(), summary, "{name}");
    }
}

#[test]
fn the_diff_shows_each_field_as_the_record_holds_it_and_as_the_spec_asks() {
    let facts = facts().status_id("a").wanting(PetData::named("Thorbert"));
    let plan = planned(&facts, found(mine("a"), mine("a"))).to_status();
    assert_eq!(plan.summary, "update name");
    assert_eq!(plan.cause, "drift");
    assert_eq!(plan.generation, Some(1));
    assert_eq!(plan.actions.len(), 1);
    let action = &plan.actions[0];
    let change = &action.changes[0];
    assert_eq!(
        (
            action.action.as_str(),
            action.record_id.as_deref(),
            change.field.as_str(),
            change.from.as_str(),
            change.to.as_str()
        ),
        ("update", Some("a"), "name", "\"Thor\"", "\"Thorbert\"")
    );
}

#[test]
fn the_hash_changes_with_the_generation_and_with_the_record() {
    let facts = facts().status_id("a").wanting(PetData::named("Thorbert"));
    let base = planned(&facts, found(mine("a"), mine("a")));
    assert_eq!(base.hash.len(), 16);
    assert!(
        base.hash
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    );
    assert_eq!(
        planned(&facts, found(mine("a"), mine("a"))).hash,
        base.hash,
        "the same plan has the same hash"
    );
    let mut next_generation = facts.clone();
    next_generation.generation = Some(2);
    assert_ne!(
        planned(&next_generation, found(mine("a"), mine("a"))).hash,
        base.hash,
        "another generation"
    );
    let edited = Some(record("a", UID, PetData::test().born(2019, 1, 1)));
    assert_ne!(
        planned(&facts, found(edited.clone(), edited)).hash,
        base.hash,
        "the record changed out of band"
    );
    // Approved and applied, then the record put back as it was: the same
    // writes again are a new plan, which the spent approval cannot apply.
    let mut after = facts.clone();
    after.applied_plan = Some(base.hash.clone());
    after.approved_plan = Some(base.hash.clone());
    after.change_policy = ChangePolicy::Approve;
    let again = planned(&after, found(mine("a"), mine("a")));
    assert_ne!(again.hash, base.hash, "a plan after an applied one");
    assert!(
        matches!(gate(&after, &again), Gate::Show { .. }),
        "the spent approval applied the recurring plan"
    );
}

/// A hash is shown by one operator and approved against another, perhaps
/// a newer build: fixed Facts, Plan and Lookup must give this literal for
/// good. Changing it breaks every approval shown by an older operator (an
/// annotation set against it is called stale); change the canonical text
/// only as a release that says so.
#[test]
fn the_plan_hash_is_the_same_in_every_build() {
    let mut facts = facts().status_id("a").wanting(PetData::named("Thorbert"));
    facts.spec_changed = true;
    let decision = Decision::Sync(crate::decision::Sync {
        target: Target::Existing("a".into()),
        claim: None,
        update: true,
        story: Story::Updated,
        warning: None,
    });
    let observed = Lookup {
        by_id: mine("a"),
        by_key: mine("a"),
        ..Lookup::default()
    };
    assert_eq!(plan(&facts, decision, &observed).hash, "9c5adc89ceec65b6");
}

#[test]
fn gate_table() {
    let pending = planned(
        &facts().status_id("a").wanting(PetData::named("Thorbert")),
        found(mine("a"), mine("a")),
    );
    let hash = pending.hash.clone();
    let nothing = planned(&facts().status_id("a"), found(mine("a"), mine("a")));
    let mut edited = facts().status_id("a").wanting(PetData::named("Thorbert"));
    edited.spec_changed = true;
    let spec_change = planned(&edited, found(mine("a"), mine("a")));
    let storm = DriftBrake::Storm {
        drifted: 60,
        pets: 100,
    };
    // Ok(approval used) when written; Err((reason shown, stale approval)).
    type Expected = Result<Option<String>, (Reason, Option<String>)>;
    let stale = "0123456789abcdef".to_owned();
    let cases: Vec<(&str, Facts, &Plan, Expected)> = vec![
        (
            "Automatic writes without approval",
            facts(),
            &pending,
            Ok(None),
        ),
        (
            "Approve without an approval shows the plan",
            approve(facts()),
            &pending,
            Err((Reason::PlanPending, None)),
        ),
        (
            "Approve with this plan's hash writes it and uses the approval",
            approve(facts()).approving(&hash),
            &pending,
            Ok(Some(hash.clone())),
        ),
        (
            "Approve with another plan's hash writes nothing and calls it stale",
            approve(facts()).approving(&stale),
            &pending,
            Err((Reason::PlanPending, Some(stale.clone()))),
        ),
        (
            "an approval already used is not used again, and not called stale",
            approve(facts()).approving(&hash).applied(&hash),
            &pending,
            Err((Reason::PlanPending, None)),
        ),
        (
            "Observe never writes, approved or not",
            facts().policy(ChangePolicy::Observe).approving(&hash),
            &pending,
            Err((Reason::RecordDiffers, None)),
        ),
        (
            "a plan that writes nothing needs no approval",
            approve(facts()),
            &nothing,
            Ok(None),
        ),
        (
            "in a drift storm, Automatic holds a drift plan for approval",
            facts().braked(storm),
            &pending,
            Err((Reason::DriftStorm, None)),
        ),
        (
            "in a drift storm, the approved drift plan is written",
            facts().braked(storm).approving(&hash),
            &pending,
            Ok(Some(hash.clone())),
        ),
        (
            "a Pet held in a storm stays held once the storm is over",
            facts().braked(DriftBrake::HeldInStorm),
            &pending,
            Err((Reason::DriftStorm, None)),
        ),
        (
            "a drift storm does not hold a spec change",
            facts().braked(storm),
            &spec_change,
            Ok(None),
        ),
        (
            "in a drift storm, Observe still writes nothing",
            facts().policy(ChangePolicy::Observe).braked(storm),
            &pending,
            Err((Reason::RecordDiffers, None)),
        ),
        (
            "in a drift storm, a plan that writes nothing needs no approval",
            facts().braked(storm),
            &nothing,
            Ok(None),
        ),
        (
            "Observe with nothing to write is in line",
            facts().policy(ChangePolicy::Observe),
            &nothing,
            Ok(None),
        ),
    ];
    for (name, facts, plan, expected) in cases {
        let got = match gate(&facts, plan) {
            Gate::Apply { approved } => Ok(approved),
            Gate::Show { outcome, stale } => {
                assert!(
                    outcome.message.contains("update record a"),
                    "{name}: {}",
                    outcome.message
                );
                Err((outcome.synced_reason(), stale))
            }
        };
        assert_eq!(got, expected, "{name}");
    }
}

#[test]
fn only_automatic_creates_before_reading() {
    let new_pet = facts().create_observes();
    assert_eq!(first_step(&new_pet), Step::Create);
    for policy in [ChangePolicy::Approve, ChangePolicy::Observe] {
        assert_eq!(
            first_step(&new_pet.clone().policy(policy)),
            Step::Observe { id: None },
            "{policy:?}"
        );
    }
}

fn arb_data() -> impl Strategy<Value = PetData> {
    (
        prop::sample::select(vec!["Thor", "Thorbert", "Loki"]),
        prop::sample::select(vec![PetType::Dog, PetType::Cat]),
        1..3u32,
    )
        .prop_map(|(name, pet_type, day)| PetData::named(name).of_type(pet_type).born(2021, 4, day))
}

/// Every kind of owner as seen from Thor in the unnamed installation or in
/// `blue`: itself, nobody, a lost Pet, another installation's Pet, a
/// handover to its installation, one it made, one another Pet made, and
/// an older operator's.
const KEYS: [&str; 12] = [
    UID,
    "",
    "uid-loki",
    "blue/uid-thor",
    "blue/uid-loki",
    "green/uid-loki",
    "blue/",
    "blue/from:uid-loki",
    "green/",
    "green/from:uid-thor",
    "green/from:uid-loki",
    "/odd",
];

fn arb_record(id: &'static str) -> impl Strategy<Value = Option<Record>> {
    prop::option::of((prop::sample::select(KEYS.to_vec()), arb_data()))
        .prop_map(move |r| r.map(|(key, data)| record(id, key, data)))
}

/// A record that carries Thor's identity, under any key.
fn arb_named(id: &'static str) -> impl Strategy<Value = Option<Record>> {
    arb_record(id).prop_map(|r| {
        r.map(|r| Record {
            identity: "default/thor".into(),
            ..r
        })
    })
}

/// What the first generator leaves alone: the installation, a handover,
/// a pause, a plan shown, and the last plan applied.
fn arb_more(facts: Facts) -> impl Strategy<Value = Facts> {
    (
        prop::sample::select(vec!["", "blue"]),
        prop::option::of(prop::sample::select(vec!["green", "blue"])),
        any::<bool>(),
        any::<bool>(),
        prop::option::of(prop::sample::select(vec!["0123456789abcdef"])),
    )
        .prop_map(
            move |(installation, hand_over_to, paused, shown, applied)| {
                let mut facts = facts.clone();
                facts.installation = installation.to_owned();
                facts.hand_over_to =
                    hand_over_to.map(|to| crate::crd::Setting::Valid(to.to_owned()));
                facts.paused = crate::crd::Setting::Valid(paused);
                facts.plan_shown = shown;
                facts.applied_plan = applied.map(str::to_owned);
                facts
            },
        )
}

fn arb_facts() -> impl Strategy<Value = Facts> {
    (
        arb_data(),
        any::<bool>(),
        any::<bool>(),
        prop::option::of(prop::sample::select(vec!["a", "x"])),
        prop::option::of(prop::sample::select(vec!["a", "gone"])),
        1..4i64,
        prop::option::of(prop::sample::select(vec![
            Uninstall::CrdDeleting,
            Uninstall::NamespaceDeleting,
        ])),
    )
        .prop_map(
            |(desired, deleting, orphan, external, status, generation, uninstalling)| {
                let mut facts = facts().wanting(desired);
                facts.deleting = deleting;
                facts.uninstalling = uninstalling;
                if orphan {
                    facts = facts.orphan();
                }
                facts.external_id = external.map(str::to_owned);
                facts.status_id = status.map(str::to_owned);
                facts.generation = Some(generation);
                facts
            },
        )
}

proptest! {
    /// For any spec, records, annotations and deletion state: the plan
    /// shown under Approve is the very plan Automatic executes (its typed
    /// writes, hash and decision), and
    /// approving its hash writes exactly it; Observe shows the same writes
    /// and writes none, and a Pet going in Observe plans none at all.
    #[test]
    fn the_plan_shown_is_the_plan_automatic_writes(
        facts in arb_facts().prop_flat_map(arb_more),
        by_id in arb_record("a"),
        by_key in arb_record("k"),
        by_identity in arb_named("n"),
        identities in any::<bool>(),
    ) {
        // The lookup by key only ever returns a record with that key, and
        // a store without identities finds none by it.
        let by_key = by_key.map(|mut r| {
            r.key = facts.owner();
            r
        });
        let by_identity = by_identity.filter(|_| identities);
        let observation = || {
            Observation::Found(Lookup {
                by_id: by_id.clone(),
                by_key: by_key.clone(),
                by_identity: by_identity.clone(),
                identities,
            })
        };
        let automatic = planned(&facts, observation());
        prop_assert_eq!(gate(&facts, &automatic), Gate::Apply { approved: None });

        let approving = approve(facts.clone());
        let shown = planned(&approving, observation());
        // One value is shown and executed: the plan shown under Approve,
        // with its hash and its decision, is the plan Automatic executes.
        prop_assert_eq!(&shown, &automatic);
        prop_assert_eq!(shown.to_status(), automatic.to_status());
        let approved = approving.approving(&shown.hash);
        let used = (!shown.is_empty()).then(|| shown.hash.clone());
        prop_assert_eq!(
            gate(&approved, &planned(&approved, observation())),
            Gate::Apply { approved: used }
        );

        let observing = facts.clone().policy(ChangePolicy::Observe);
        let observed = planned(&observing, observation());
        if facts.deleting {
            prop_assert!(observed.is_empty());
        } else {
            prop_assert_eq!(&observed.writes, &automatic.writes);
        }
        let writes = matches!(gate(&observing, &observed), Gate::Apply { .. });
        prop_assert_eq!(writes, observed.is_empty());
    }
}
