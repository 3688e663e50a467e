//! The policy as two tables, in the style of Crossplane's reconciler tests:
//! each case has a name, the facts, what the store shows, and the one
//! expected step or plan.

use std::time::Duration;

use super::prose::invalid;
use super::*;
use crate::crd::PetType;
use crate::crd::{
    CONFIRM_DELETE_PETS_ANNOTATION, ChangePolicy, DELETION_POLICY_ANNOTATION, DeletionPolicy,
    EXTERNAL_ID_ANNOTATION, HAND_OVER_TO_ANNOTATION, PAUSED_ANNOTATION, Setting,
};
use crate::status::Reason;
use crate::store::Field;
use crate::store::{Changes, Created, Holder, Lookup, Operation, Owner, PetData, Record};

const UID: &str = "uid-thor";
const OTHER_UID: &str = "uid-loki";
/// Thor's namespace and name.
const IDENTITY: &str = "default/thor";

/// The Orphan plan that releases `id` and names it.
fn orphaned(id: Option<&str>) -> Result<Decision, Reason> {
    Ok(Decision::Finish(Finish {
        hand_to: None,
        release: id.map(str::to_owned),
        delete: None,
        story: Story::Orphaned {
            id: id.map(str::to_owned),
        },
    }))
}

/// A finish that writes nothing to the store: no release, no delete.
fn writes_nothing(story: Story) -> Result<Decision, Reason> {
    Ok(Decision::Finish(Finish {
        hand_to: None,
        release: None,
        delete: None,
        story,
    }))
}

/// What a store without GetPets answers to the read.
fn lacks_get_pets() -> Observation {
    Observation::StoreLacks {
        missing: Operation::Observe,
    }
}

/// A Pet being deleted while the installation goes.
fn uninstalling(why: Uninstall) -> Facts {
    facts().deleting().uninstalling(why)
}

/// The plan that keeps (and, with `release`, releases) the record `id`.
fn kept(release: Option<&str>, id: Option<&str>, why: Uninstall) -> Result<Decision, Reason> {
    Ok(Decision::Finish(Finish {
        hand_to: None,
        release: release.map(str::to_owned),
        delete: None,
        story: Story::KeptOnUninstall {
            id: id.map(str::to_owned),
            why,
        },
    }))
}

/// A live Pet with its finalizer, nothing else set.
pub(super) fn facts() -> Facts {
    Facts {
        uid: UID.into(),
        installation: String::new(),
        identity: IDENTITY.into(),
        desired: PetData::test(),
        deleting: false,
        has_finalizer: true,
        paused: Setting::Valid(false),
        deletion_policy: Setting::Valid(DeletionPolicy::Delete),
        external_id: None,
        status_id: None,
        rejected_this_generation: false,
        spec_changed: false,
        recently_synced: None,
        create_observes: false,
        generation: Some(1),
        change_policy: ChangePolicy::Automatic,
        approved_plan: None,
        applied_plan: None,
        plan_shown: false,
        uninstalling: None,
        hand_over_to: None,
        drift_brake: None,
    }
}

impl Facts {
    pub(super) fn policy(mut self, policy: ChangePolicy) -> Self {
        self.change_policy = policy;
        self
    }
    pub(super) fn approving(mut self, hash: &str) -> Self {
        self.approved_plan = Some(hash.into());
        self
    }
    pub(super) fn braked(mut self, brake: super::DriftBrake) -> Self {
        self.drift_brake = Some(brake);
        self
    }
    pub(super) fn applied(mut self, hash: &str) -> Self {
        self.applied_plan = Some(hash.into());
        self
    }
    pub(super) fn status_id(mut self, id: &str) -> Self {
        self.status_id = Some(id.into());
        self
    }
    pub(super) fn external_id(mut self, id: &str) -> Self {
        self.external_id = Some(id.into());
        self
    }
    pub(super) fn deleting(mut self) -> Self {
        self.deleting = true;
        self
    }
    fn without_finalizer(mut self) -> Self {
        self.has_finalizer = false;
        self
    }
    fn paused(mut self, paused: Setting<bool>) -> Self {
        self.paused = paused;
        self
    }
    pub(super) fn uninstalling(mut self, why: Uninstall) -> Self {
        self.uninstalling = Some(why);
        self
    }
    pub(super) fn orphan(mut self) -> Self {
        self.deletion_policy = Setting::Valid(DeletionPolicy::Orphan);
        self
    }
    fn policy_typo(mut self) -> Self {
        self.deletion_policy = invalid_policy();
        self
    }
    fn rejected(mut self) -> Self {
        self.rejected_this_generation = true;
        self
    }
    fn synced_ago(mut self, left: Duration) -> Self {
        self.recently_synced = Some(left);
        self
    }
    pub(super) fn wanting(mut self, desired: PetData) -> Self {
        self.desired = desired;
        self
    }
    /// The store's create says whether the key already named a record.
    pub(super) fn create_observes(mut self) -> Self {
        self.create_observes = true;
        self
    }
}

fn invalid_policy() -> Setting<DeletionPolicy> {
    Setting::Invalid {
        annotation: DELETION_POLICY_ANNOTATION,
        value: "Orhpan".into(),
    }
}

pub(super) fn record(id: &str, key: &str, data: PetData) -> Record {
    Record {
        id: id.into(),
        key: key.into(),
        identity: String::new(),
        data,
    }
}

pub(super) fn found(by_id: Option<Record>, by_key: Option<Record>) -> Observation {
    Observation::Found(Lookup {
        by_id,
        by_key,
        ..Lookup::default()
    })
}

/// A read from a store that keeps identities: by ID, by key, and by this
/// Pet's identity.
fn found_named(
    by_id: Option<Record>,
    by_key: Option<Record>,
    by_identity: Option<Record>,
) -> Observation {
    Observation::Found(Lookup {
        by_id,
        by_key,
        by_identity,
        identities: true,
    })
}

/// A read that finds, by this Pet's identity alone, the record `id` with
/// `key`: one a Pet of its name made.
fn found_by_name(id: &str, key: &str) -> Observation {
    found_named(None, None, named_record(id, key))
}

/// A read that finds the record `id` with `key` both by the ID in status
/// and by this Pet's identity.
fn found_status_named(id: &str, key: &str) -> Observation {
    found_named(named_record(id, key), None, named_record(id, key))
}

/// A record with this key that carries Thor's identity.
fn named_record(id: &str, key: &str) -> Option<Record> {
    Some(Record {
        identity: IDENTITY.into(),
        ..record(id, key, PetData::test())
    })
}

/// A plan that claims `id` from `from` with this story.
fn claim_from(id: &str, from: &str, update: bool, story: Story) -> Decision {
    Decision::Sync(Sync {
        target: existing(id),
        claim: Some(from.into()),
        update,
        story,
        warning: None,
    })
}

/// A plan that takes `id` over from the key `from`, and says so.
fn taken_over(id: &str, from: &str, update: bool) -> Result<Decision, Reason> {
    Ok(claim_from(
        id,
        from,
        update,
        Story::TakenOver { from: from.into() },
    ))
}

impl Facts {
    fn installation(mut self, name: &str) -> Self {
        self.installation = name.into();
        self
    }
    fn hand_over_to(mut self, to: &str) -> Self {
        self.hand_over_to = Some(Setting::Valid(to.into()));
        self
    }
}

/// Thor's record, handed over by Thor of `blue` to `green`.
const HANDED: &str = "green/from:uid-thor";

/// The plan that takes [`HANDED`] back, cancelling its handover.
fn handover_cancelled() -> Result<Decision, Reason> {
    Ok(claim_from(
        "a",
        HANDED,
        false,
        Story::HandOverCancelled { to: "green".into() },
    ))
}

fn hand_over(release: Option<&str>, to: &str) -> Result<Decision, Reason> {
    Ok(Decision::HandOver(HandOver {
        release: release.map(str::to_owned),
        to: to.into(),
    }))
}

/// Thor's record in `installation`, with its identity.
fn mine_in(id: &str, installation: &str) -> Option<Record> {
    named_record(id, &format!("{installation}/{UID}"))
}

fn record_opt(id: &str, key: &str) -> Option<Record> {
    Some(record(id, key, PetData::test()))
}

pub(super) fn mine(id: &str) -> Option<Record> {
    Some(record(id, UID, PetData::test()))
}

/// `claim`: the record's key is set from empty to the Pet's.
fn sync(target: Target, claim: bool, update: bool, story: Story) -> Decision {
    Decision::Sync(Sync {
        target,
        claim: claim.then(Owner::default),
        update,
        story,
        warning: None,
    })
}

fn existing(id: &str) -> Target {
    Target::Existing(id.into())
}

/// The reason a plan or step would show in Synced, if it holds.
fn held_reason(plan: &Decision) -> Option<Reason> {
    match plan {
        Decision::Hold { outcome, .. } => Some(outcome.synced_reason()),
        _ => None,
    }
}

/// The first step reads the record with this ID, and by UID.
fn observe(id: &str) -> Result<Step, Reason> {
    Ok(Step::Observe {
        id: Some(id.into()),
    })
}

#[test]
fn first_step_table() {
    let paused_typo = Setting::Invalid {
        annotation: PAUSED_ANNOTATION,
        value: "yes".into(),
    };
    let mut handover_typo = facts();
    handover_typo.hand_over_to = Some(Setting::Invalid {
        annotation: HAND_OVER_TO_ANNOTATION,
        value: "Green/".into(),
    });
    let cases: Vec<(&str, Facts, Result<Step, Reason>)> = vec![
        (
            "a misspelled hand-over-to holds, writing nothing",
            handover_typo.clone(),
            Err(Reason::InvalidAnnotation),
        ),
        (
            "and holds a deletion too",
            handover_typo.deleting(),
            Err(Reason::InvalidAnnotation),
        ),
        (
            "handing over reads the store, even just synced",
            facts()
                .hand_over_to("green")
                .status_id("a")
                .create_observes()
                .synced_ago(Duration::from_secs(5)),
            observe("a"),
        ),
        (
            "a Pet switched to Automatic with a plan shown reads, not creates",
            Facts {
                plan_shown: true,
                ..facts().create_observes()
            },
            Ok(Step::Observe { id: None }),
        ),
        (
            "a new Pet gets its finalizer before anything else",
            facts().without_finalizer(),
            Ok(Step::AddFinalizer),
        ),
        (
            "a Pet without status.id, while no create has said what it found, is looked up by UID only",
            facts(),
            Ok(Step::Observe { id: None }),
        ),
        (
            "a Pet with status.id is looked up by that ID and by UID",
            facts().status_id("a"),
            observe("a"),
        ),
        (
            "the external-id annotation is what is looked up, not status.id",
            facts().status_id("a").external_id("x"),
            observe("x"),
        ),
        (
            "paused touches nothing, not even a new Pet's finalizer",
            facts().without_finalizer().paused(Setting::Valid(true)),
            Err(Reason::ReconcilePaused),
        ),
        (
            "paused holds deletion too",
            facts().deleting().paused(Setting::Valid(true)),
            Err(Reason::ReconcilePaused),
        ),
        (
            "an unknown paused value is treated as paused and said so",
            facts().deleting().paused(paused_typo),
            Err(Reason::InvalidAnnotation),
        ),
        (
            "paused=false reconciles",
            facts().status_id("a").paused(Setting::Valid(false)),
            observe("a"),
        ),
        (
            "a rejected generation waits for a change without a store call",
            facts().status_id("a").rejected(),
            Ok(Step::Wait(Next::AwaitChange)),
        ),
        (
            "a generation synced a moment ago waits for its poll",
            facts().status_id("a").synced_ago(Duration::from_secs(9)),
            Ok(Step::Wait(Next::After(Duration::from_secs(9)))),
        ),
        (
            "deleting a Pet without our finalizer is none of our business",
            facts().deleting().without_finalizer(),
            Ok(Step::Wait(Next::AwaitChange)),
        ),
        (
            "deletion reads status.id's record too (decide trusts only the key)",
            facts().deleting().status_id("a"),
            observe("a"),
        ),
        (
            "deletion goes ahead even if the spec was rejected",
            facts().deleting().rejected(),
            Ok(Step::Observe { id: None }),
        ),
        (
            "a misspelled deletion policy stops deletion and says why",
            facts().deleting().status_id("a").policy_typo(),
            Err(Reason::InvalidAnnotation),
        ),
        (
            "a misspelled deletion policy does not stop a live Pet's sync",
            facts().status_id("a").policy_typo(),
            observe("a"),
        ),
        (
            "with no ID known, a create that says what it found is the read",
            facts().create_observes(),
            Ok(Step::Create),
        ),
        (
            "a known status.id is read, not created over",
            facts().create_observes().status_id("a"),
            observe("a"),
        ),
        (
            "a record to adopt is read, never created",
            facts().create_observes().external_id("x"),
            observe("x"),
        ),
        (
            "deletion reads; it never creates",
            facts().create_observes().deleting(),
            Ok(Step::Observe { id: None }),
        ),
        (
            "a rejected spec is not sent again by a create",
            facts().create_observes().rejected(),
            Ok(Step::Wait(Next::AwaitChange)),
        ),
    ];
    for (name, facts, expected) in cases {
        let step = first_step(&facts);
        match (&step, expected) {
            (
                Step::Hold {
                    outcome,
                    next: Next::AwaitChange,
                },
                Err(reason),
            ) => {
                assert_eq!(outcome.synced_reason(), reason, "{name}");
                // A hold never claims the record is in line. One that
                // stalls marks its generation observed, so that kstatus
                // reads Failed rather than waiting; a pause does not.
                let status =
                    crate::status::next_status(None, Some(1), None, outcome, chrono::Utc::now());
                let ready = status
                    .conditions
                    .iter()
                    .find(|c| c.type_ == crate::status::READY);
                assert!(
                    ready.is_some_and(|c| c.status == crate::crd::ConditionStatus::Unknown),
                    "{name}"
                );
                let observed = reason.stalls().then_some(1);
                assert_eq!(status.observed_generation, observed, "{name}");
            }
            (step, Ok(expected)) => assert_eq!(*step, expected, "{name}"),
            (step, Err(reason)) => panic!("{name}: expected a hold with {reason}, got {step:?}"),
        }
    }
}

#[test]
fn after_create_table() {
    let policy_warning = Some(invalid(
        DELETION_POLICY_ANNOTATION,
        "Orhpan",
        "Delete or Orphan",
        "the record is in line with the spec, but deleting this Pet will wait until the annotation is fixed",
    ));
    let cases: Vec<(&str, Facts, Created, Option<Sync>)> = vec![
        (
            "a new record only needs its ID in status",
            facts(),
            Created::New("n".into()),
            Some(Sync {
                target: existing("n"),
                claim: None,
                update: false,
                story: Story::Created,
                warning: None,
            }),
        ),
        (
            "a misspelled policy is still shown after a create",
            facts().policy_typo(),
            Created::New("n".into()),
            Some(Sync {
                target: existing("n"),
                claim: None,
                update: false,
                story: Story::Created,
                warning: policy_warning,
            }),
        ),
        (
            "a record the UID already named may hold an older spec: read it",
            facts(),
            Created::Existing("e".into()),
            None,
        ),
        (
            "a store that does not say what it did: read",
            facts(),
            Created::Unknown("u".into()),
            None,
        ),
    ];
    for (name, facts, created, expected) in cases {
        assert_eq!(after_create(&facts, &created), expected, "{name}");
    }
}

#[test]
fn a_create_is_read_after_unless_it_made_a_new_record() {
    let cases = [
        (Created::New("n".into()), false, false),
        (Created::New("n".into()), true, false),
        // Nothing was created, whatever a read before it found.
        (Created::Existing("e".into()), false, true),
        (Created::Existing("e".into()), true, true),
        // A read before it found nothing under the key: it made one.
        (Created::Unknown("u".into()), false, true),
        (Created::Unknown("u".into()), true, false),
    ];
    for (created, read_before, read) in cases {
        assert_eq!(
            read_after_create(&created, read_before),
            read,
            "{created:?}, read before: {read_before}"
        );
    }
}

#[test]
fn decide_table() {
    let cases: Vec<(&str, Facts, Observation, Result<Decision, Reason>)> = vec![
        // Handover: the record goes to another installation's Pet of the
        // same namespace and name.
        (
            "hand-over-to another installation: its record released to it",
            facts()
                .installation("blue")
                .hand_over_to("green")
                .status_id("a"),
            found_named(
                mine_in("a", "blue"),
                mine_in("a", "blue"),
                mine_in("a", "blue"),
            ),
            hand_over(Some("a"), "green"),
        ),
        (
            "handed over already: nothing more to write",
            facts()
                .installation("blue")
                .hand_over_to("green")
                .status_id("a"),
            found_status_named("a", HANDED),
            hand_over(None, "green"),
        ),
        (
            "the installation handed to takes the record",
            facts().installation("green"),
            found_by_name("a", "green/from:uid-loki"),
            taken_over("a", "green/from:uid-loki", false),
        ),
        (
            "and one handed over by an operator before handover keys named their Pet",
            facts().installation("green"),
            found_by_name("a", "green/"),
            taken_over("a", "green/", false),
        ),
        (
            "a third installation does not",
            facts().installation("red"),
            found_by_name("a", "green/from:uid-loki"),
            Err(Reason::RecordOwnedElsewhere),
        ),
        (
            "hand-over-to its own installation cancels a handover not yet taken",
            facts()
                .installation("blue")
                .hand_over_to("blue")
                .status_id("a"),
            found_status_named("a", HANDED),
            handover_cancelled(),
        ),
        (
            "and so does taking the annotation off",
            facts().installation("blue").status_id("a"),
            found_status_named("a", HANDED),
            handover_cancelled(),
        ),
        (
            "a handover another Pet of its name made is not this Pet's to cancel",
            facts().installation("blue").hand_over_to("blue"),
            found_by_name("a", "green/from:uid-loki"),
            Err(Reason::RecordOwnedElsewhere),
        ),
        (
            "nor is one whose key does not name its Pet (an older operator's)",
            facts()
                .installation("blue")
                .hand_over_to("blue")
                .status_id("a"),
            found_status_named("a", "green/"),
            Err(Reason::RecordOwnedElsewhere),
        ),
        (
            "and a handover to it comes back",
            facts()
                .installation("blue")
                .hand_over_to("blue")
                .status_id("a"),
            found_status_named("a", "blue/"),
            taken_over("a", "blue/", false),
        ),
        (
            "deleted while handing over: released to it, never deleted",
            facts()
                .installation("blue")
                .hand_over_to("green")
                .deleting(),
            found_named(None, mine_in("a", "blue"), None),
            Ok(Decision::Finish(Finish {
                release: Some("a".into()),
                hand_to: Some("green".into()),
                delete: None,
                story: Story::HandedOver {
                    id: Some("a".into()),
                    to: "green".into(),
                },
            })),
        ),
        // Identities: the record follows the Pet's namespace and name.
        (
            "its own record carries its identity: nothing to claim",
            facts().status_id("a"),
            found_named(
                named_record("a", UID),
                named_record("a", UID),
                named_record("a", UID),
            ),
            Ok(sync(existing("a"), false, false, Story::InSync)),
        ),
        (
            "its own record lacks the identity (made before identities): given it by compare-and-set on its own key",
            facts().status_id("a"),
            found_named(mine("a"), mine("a"), None),
            Ok(claim_from("a", UID, false, Story::InSync)),
        ),
        (
            "another record already holds its identity: its own keeps none, and that one is not touched",
            facts().status_id("a"),
            found_named(mine("a"), mine("a"), named_record("b", "")),
            Ok(sync(existing("a"), false, false, Story::InSync)),
        ),
        (
            "the record an earlier Pet of its name kept (Orphan) is taken back",
            facts(),
            found_by_name("k", ""),
            Ok(claim_from("k", "", false, Story::Reclaimed)),
        ),
        (
            "rebuilt from Git: the record of the lost Pet of its name in this installation is taken over",
            facts(),
            found_by_name("r", OTHER_UID),
            taken_over("r", OTHER_UID, false),
        ),
        (
            "restored with its old status: the same, and the spec written if it differs",
            facts().status_id("r").wanting(PetData::named("Thorbert")),
            found_status_named("r", OTHER_UID),
            taken_over("r", OTHER_UID, true),
        ),
        (
            "a named installation takes over from its own lost Pet",
            facts().installation("blue"),
            found_by_name("r", "blue/uid-loki"),
            taken_over("r", "blue/uid-loki", false),
        ),
        (
            "another installation's record of the same name is never taken",
            facts().installation("blue"),
            found_by_name("r", "green/uid-loki"),
            Err(Reason::RecordOwnedElsewhere),
        ),
        (
            "a named installation's record is not the unnamed one's",
            facts(),
            found_by_name("r", "green/uid-loki"),
            Err(Reason::RecordOwnedElsewhere),
        ),
        (
            "nor is the unnamed one's a named installation's",
            facts().installation("blue"),
            found_by_name("r", OTHER_UID),
            Err(Reason::RecordOwnedElsewhere),
        ),
        (
            "an external-id while another record carries its identity: held, nothing claimed",
            facts().external_id("x"),
            found_named(record_opt("x", ""), None, named_record("k", "")),
            Err(Reason::AdoptionConflict),
        ),
        (
            "an external-id naming the record a lost Pet of its name held: taken over",
            facts().external_id("k"),
            found_status_named("k", OTHER_UID),
            taken_over("k", OTHER_UID, false),
        ),
        (
            "an external-id naming a record a Pet of another name holds: not taken",
            facts().external_id("k"),
            found_named(record_opt("k", OTHER_UID), None, None),
            Err(Reason::RecordOwnedElsewhere),
        ),
        (
            "an external-id naming the record that carries its identity: claimed with it",
            facts().external_id("k"),
            found_status_named("k", ""),
            Ok(claim_from("k", "", false, Story::Adopted)),
        ),
        (
            "deleting: a record holding its name but not its key is not deleted",
            facts().deleting(),
            found_by_name("r", OTHER_UID),
            writes_nothing(Story::Deleted { id: None }),
        ),
        // Plain lifecycle.
        (
            "nothing recorded and nothing found: create under the UID",
            facts(),
            found(None, None),
            Ok(sync(Target::Create, false, false, Story::Created)),
        ),
        (
            "the ID never reached status: adopt the record found by UID",
            facts(),
            found(None, mine("a")),
            Ok(sync(existing("a"), false, false, Story::FoundByKey)),
        ),
        (
            "found by UID and drifted: adopt and update",
            facts().wanting(PetData::named("Thorbert")),
            found(None, mine("a")),
            Ok(sync(existing("a"), false, true, Story::FoundByKey)),
        ),
        (
            "this Pet's record matches: no write",
            facts().status_id("a"),
            found(mine("a"), mine("a")),
            Ok(sync(existing("a"), false, false, Story::InSync)),
        ),
        (
            "this Pet's record drifted: update the same ID",
            facts().status_id("a").wanting(PetData::named("Thorbert")),
            found(mine("a"), mine("a")),
            Ok(sync(existing("a"), false, true, Story::Updated)),
        ),
        (
            "status.id names a vanished record and there is no other: recreate",
            facts().status_id("gone"),
            found(None, None),
            Ok(sync(
                Target::Create,
                false,
                false,
                Story::Recreated {
                    lost: "gone".into(),
                },
            )),
        ),
        // Ownership.
        (
            "status.id names another Pet's record: use our own, touch theirs never",
            facts().status_id("alpha"),
            found(record_opt("alpha", OTHER_UID), mine("beta")),
            Ok(sync(
                existing("beta"),
                false,
                false,
                Story::Corrected {
                    stale: "alpha".into(),
                    foreign: true,
                    created: false,
                },
            )),
        ),
        (
            "status.id names another Pet's record and ours drifted: update ours only",
            facts()
                .status_id("alpha")
                .wanting(PetData::named("Thorbert")),
            found(record_opt("alpha", OTHER_UID), mine("beta")),
            Ok(sync(
                existing("beta"),
                false,
                true,
                Story::Corrected {
                    stale: "alpha".into(),
                    foreign: true,
                    created: false,
                },
            )),
        ),
        (
            "status.id names an unowned record: it is not ours without adoption",
            facts().status_id("loose"),
            found(record_opt("loose", ""), None),
            Ok(sync(
                Target::Create,
                false,
                false,
                Story::Corrected {
                    stale: "loose".into(),
                    foreign: true,
                    created: true,
                },
            )),
        ),
        (
            "status.id names no record but ours exists: correct, do not claim a recreate",
            facts().status_id("nowhere"),
            found(None, mine("a")),
            Ok(sync(
                existing("a"),
                false,
                false,
                Story::Corrected {
                    stale: "nowhere".into(),
                    foreign: false,
                    created: false,
                },
            )),
        ),
        // Explicit adoption.
        (
            "an unowned record named for adoption is claimed and kept in line",
            facts().external_id("x").wanting(PetData::named("Thorbert")),
            found(record_opt("x", ""), None),
            Ok(sync(existing("x"), true, true, Story::Adopted)),
        ),
        (
            "an adoption claimed before a crash is finished without claiming again",
            facts().external_id("x"),
            found(mine("x"), mine("x")),
            Ok(sync(existing("x"), false, false, Story::Adopted)),
        ),
        (
            "an adopted record in status is simply kept in sync",
            facts().external_id("x").status_id("x"),
            found(mine("x"), mine("x")),
            Ok(sync(existing("x"), false, false, Story::InSync)),
        ),
        (
            "a record owned by another Pet is never taken",
            facts().external_id("x"),
            found(record_opt("x", OTHER_UID), None),
            Err(Reason::RecordOwnedElsewhere),
        ),
        (
            "a named record that does not exist: nothing is created",
            facts().external_id("x"),
            found(None, None),
            Err(Reason::RecordNotFound),
        ),
        (
            "a Pet that already owns a record cannot adopt a second one",
            facts().external_id("x").status_id("a"),
            found(record_opt("x", ""), mine("a")),
            Err(Reason::AdoptionConflict),
        ),
        // Deletion.
        (
            "delete: this Pet's record, found by UID",
            facts().deleting().status_id("a"),
            found(None, mine("a")),
            Ok(Decision::Finish(Finish {
                hand_to: None,
                release: None,
                delete: Some("a".into()),
                story: Story::Deleted {
                    id: Some("a".into()),
                },
            })),
        ),
        (
            "delete: no record of ours, whatever status.id says: delete nothing",
            facts().deleting().status_id("alpha"),
            found(None, None),
            writes_nothing(Story::Deleted { id: None }),
        ),
        (
            "orphan: keep the record and release it for adoption",
            facts().deleting().orphan().status_id("a"),
            found(None, mine("a")),
            orphaned(Some("a")),
        ),
        (
            "orphan retried after the release: nothing to release, the Event still names it",
            facts().deleting().orphan().status_id("a"),
            found(record_opt("a", ""), None),
            writes_nothing(Story::Orphaned {
                id: Some("a".into()),
            }),
        ),
        (
            "orphan with status.id naming another's record: release and name nothing",
            facts().deleting().orphan().status_id("alpha"),
            found(record_opt("alpha", OTHER_UID), None),
            writes_nothing(Story::Orphaned { id: None }),
        ),
        (
            "delete with status.id naming another Pet's record: delete nothing",
            facts().deleting().status_id("alpha"),
            found(record_opt("alpha", OTHER_UID), None),
            writes_nothing(Story::Deleted { id: None }),
        ),
        // The installation going away: Delete keeps and releases.
        (
            "CRD deleted without confirmation: keep this Pet's record and release it",
            uninstalling(Uninstall::CrdDeleting).status_id("a"),
            found(None, mine("a")),
            kept(Some("a"), Some("a"), Uninstall::CrdDeleting),
        ),
        (
            "operator's namespace going: the retry after the release still names the record",
            uninstalling(Uninstall::NamespaceDeleting).status_id("a"),
            found(record_opt("a", ""), None),
            kept(None, Some("a"), Uninstall::NamespaceDeleting),
        ),
        (
            "uninstalling with status.id naming another's record: touch nothing",
            uninstalling(Uninstall::CrdDeleting).status_id("alpha"),
            found(record_opt("alpha", OTHER_UID), None),
            kept(None, None, Uninstall::CrdDeleting),
        ),
        (
            "uninstalling an Orphan is an Orphan",
            uninstalling(Uninstall::CrdDeleting).orphan().status_id("a"),
            found(None, mine("a")),
            orphaned(Some("a")),
        ),
        (
            "uninstalling on a store without GetPets lets the Pet go, deleting nothing",
            uninstalling(Uninstall::CrdDeleting).status_id("a"),
            lacks_get_pets(),
            kept(None, Some("a"), Uninstall::CrdDeleting),
        ),
        // A store without the extension RPCs.
        (
            "without GetPets a live Pet says the store lacks extensions",
            facts().status_id("a"),
            lacks_get_pets(),
            Err(Reason::StoreLacksExtensions),
        ),
        (
            "without GetPets deletion cannot find the record, and says so",
            facts().deleting(),
            lacks_get_pets(),
            Err(Reason::StoreLacksExtensions),
        ),
        (
            "without GetPets an Orphan deletion still releases the Pet",
            facts().deleting().orphan().status_id("a"),
            lacks_get_pets(),
            writes_nothing(Story::OrphanedUnkeyed {
                status_id: Some("a".into()),
                missing: Operation::Observe,
            }),
        ),
    ];
    for (name, facts, observation, expected) in cases {
        let foreign: Vec<Record> = match &observation {
            Observation::Found(lookup) => lookup
                .records()
                .filter(|r| r.key != facts.owner())
                .cloned()
                .collect(),
            Observation::StoreLacks { .. } => Vec::new(),
        };
        let plan = decide(&facts, observation);
        match expected {
            Ok(expected) => assert_eq!(plan, expected, "{name}"),
            Err(reason) => assert_eq!(held_reason(&plan), Some(reason), "{name}: {plan:?}"),
        }
        // Whatever the case, no plan writes to a record that is not this
        // Pet's, except to claim, by compare-and-set from its key, one owned
        // by nobody or by a lost Pet of this installation, handed over to
        // it, or handed over by this Pet.
        for record in &foreign {
            let touched = match &plan {
                Decision::Sync(Sync {
                    target: Target::Existing(id),
                    claim,
                    ..
                }) => {
                    id == &record.id
                        && !(claim.as_ref() == Some(&record.key)
                            && matches!(
                                facts.holder(&record.key),
                                Holder::Nobody
                                    | Holder::SameInstallation { .. }
                                    | Holder::HandedOverHere
                                    | Holder::HandedOverByThisPet { .. }
                            ))
                }
                Decision::Finish(finish) => {
                    finish.delete.as_ref() == Some(&record.id)
                        || finish.release.as_ref() == Some(&record.id)
                }
                _ => false,
            };
            assert!(!touched, "{name}: touches {record:?}");
        }
    }
}

#[test]
fn a_misspelled_policy_is_shown_while_the_record_is_kept_in_line() {
    let plan = decide(
        &facts().status_id("a").policy_typo(),
        found(mine("a"), mine("a")),
    );
    let Decision::Sync(sync) = plan else {
        panic!("expected a sync, got {plan:?}")
    };
    let outcome = sync.outcome("a");
    assert_eq!(outcome.synced_reason(), Reason::InvalidAnnotation);
    assert!(outcome.message.contains("Orhpan"), "{}", outcome.message);
}

#[test]
fn events_never_claim_what_did_not_happen() {
    // status.id named nothing, and the Pet's record was found by key: the
    // Event says so and does not claim a create.
    let story = Story::Corrected {
        stale: "nowhere".into(),
        foreign: false,
        created: false,
    };
    let (reason, note) = story.notice(Some("a")).expect("an event");
    assert_eq!(reason, Reason::StatusIdCorrected);
    assert!(reason.is_warning());
    assert!(
        note.contains("nowhere") && note.contains("does not exist"),
        "{note}"
    );
    assert!(!note.contains("created"), "{note}");
    // kube's recorder folds Events with one reason and action into a series
    // that keeps the first note: different stories must not share an action.
    let foreign = Story::Corrected {
        stale: "alpha".into(),
        foreign: true,
        created: false,
    };
    assert_ne!(story.action(), foreign.action());
    // The Orphaned Event names the ID to adopt it with.
    let (_, note) = Story::Orphaned {
        id: Some("r-1".into()),
    }
    .notice(None)
    .expect("an event");
    assert!(
        note.contains(&format!("{EXTERNAL_ID_ANNOTATION}: r-1")),
        "{note}"
    );
    assert_eq!(Story::InSync.notice(Some("a")), None);
    // Kept on uninstall: says why, and names the ID to adopt it with.
    for (why, because) in [
        (Uninstall::CrdDeleting, CONFIRM_DELETE_PETS_ANNOTATION),
        (Uninstall::NamespaceDeleting, "namespace is being deleted"),
    ] {
        let kept = Story::KeptOnUninstall {
            id: Some("r-1".into()),
            why,
        };
        let (reason, note) = kept.notice(None).expect("an event");
        assert_eq!(reason, Reason::Orphaned);
        assert!(note.contains(because), "{note}");
        assert!(
            note.contains("instead of deleting")
                && note.contains(&format!("{EXTERNAL_ID_ANNOTATION}: r-1")),
            "{note}"
        );
        assert_ne!(kept.action(), Story::Orphaned { id: None }.action());
    }
}

#[test]
fn every_write_has_one_cause() {
    let edited = Facts {
        spec_changed: true,
        ..facts()
    };
    let unchanged = facts();
    let cases: Vec<(&str, Story, &Facts, Cause)> = vec![
        ("a new Pet's record", Story::Created, &edited, Cause::NewPet),
        (
            "its own record found by UID",
            Story::FoundByKey,
            &edited,
            Cause::NewPet,
        ),
        (
            "a record named for adoption",
            Story::Adopted,
            &unchanged,
            Cause::Adoption,
        ),
        ("an edited spec", Story::Updated, &edited, Cause::SpecChange),
        (
            "in line, the record given its identity",
            Story::InSync,
            &edited,
            Cause::Adoption,
        ),
        (
            "a record changed outside, spec unchanged",
            Story::Updated,
            &unchanged,
            Cause::Drift,
        ),
        (
            "a record deleted outside",
            Story::Recreated { lost: "a".into() },
            &unchanged,
            Cause::Drift,
        ),
        (
            "status.id edited outside",
            Story::Corrected {
                stale: "a".into(),
                foreign: true,
                created: false,
            },
            &unchanged,
            Cause::Drift,
        ),
        (
            "a deletion",
            Story::Deleted { id: None },
            &unchanged,
            Cause::Deletion,
        ),
        (
            "an Orphan release",
            Story::Orphaned { id: None },
            &unchanged,
            Cause::Deletion,
        ),
    ];
    for (name, story, facts, cause) in cases {
        assert_eq!(story.cause(facts), cause, "{name}");
    }
}

#[test]
fn events_tell_the_cause_and_the_fields_changed() {
    let changes = PetData::named("Thorbert").changes_to(&PetData::test());
    assert_eq!(changes.to_string(), r#"name "Thorbert" -> "Thor""#);
    let (reason, note) = Story::Updated
        .event(Some("17"), Cause::Drift, &changes)
        .expect("an event");
    assert_eq!(reason, Reason::Updated);
    assert_eq!(
        note,
        r#"drift corrected: name "Thorbert" -> "Thor" (store record 17 was changed outside the operator)"#
    );
    let (_, note) = Story::Updated
        .event(Some("17"), Cause::SpecChange, &changes)
        .expect("an event");
    assert_eq!(
        note,
        r#"spec change applied to store record 17: name "Thorbert" -> "Thor""#
    );
    let (_, note) = Story::Recreated { lost: "5".into() }
        .event(Some("9"), Cause::Drift, &Changes::default())
        .expect("an event");
    assert!(
        note.starts_with("drift corrected: store record 5 was deleted outside"),
        "{note}"
    );
    // Adoption that also brought the record in line says both.
    let (_, note) = Story::Adopted
        .event(Some("17"), Cause::Adoption, &changes)
        .expect("an event");
    assert!(
        note.ends_with(r#"; updated name "Thorbert" -> "Thor""#),
        "{note}"
    );
    assert_eq!(
        Story::InSync.event(Some("17"), Cause::Drift, &Changes::default()),
        None
    );
}

#[test]
fn a_diff_names_every_changed_field_in_spec_order() {
    let before = PetData::named("Loki")
        .of_type(PetType::Cat)
        .born(2020, 1, 2);
    let changes = before.changes_to(&PetData::test());
    assert_eq!(
        changes.to_string(),
        r#"name "Loki" -> "Thor", type cat -> dog, birthday 2020-01-02 -> 2021-04-01"#
    );
    assert_eq!(
        changes.fields().collect::<Vec<_>>(),
        [Field::Name, Field::Type, Field::Birthday]
    );
    assert!(PetData::test().changes_to(&PetData::test()).is_empty());
}
