//! A seeded randomized soak of change policies on the real API server and
//! store: 1,000 steps of spec edits, out-of-band store edits with grpcurl,
//! approvals with the current and with a stale hash, policy switches,
//! deletions, re-creations and `kill -9` of the operator. After every step,
//! counted by the store's own write RPCs:
//!
//! - no write while a plan waits unapproved;
//! - every write is an approved plan's or an `Automatic` decision's, exactly
//!   as many as the plan shown or the decision needs;
//! - no record of an `Observe` or unapproved `Approve` Pet, nor one a Pet
//!   left behind, changes but by the test's own edits.
//!
//! A Pet deleted under `Observe` leaves its record, still keyed to it and
//! holding its namespace and name: the Pet created next under that name
//! takes it over (a claim, shown as a plan but under `Automatic`) rather
//! than creating another.
//!
//! The seed is printed; `PETSTORE_SOAK_SEED` replays another, and
//! `PETSTORE_SOAK_TRACE=1` prints each step as it starts.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use fixtures::env::pet_manifest;
use fixtures::{Env, Operator, Storage};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use petstore_operator::crd::{ChangePolicy, Pet};
use petstore_proto::PetStoreClient;
use petstore_proto::petstore::GetPetsReq;
use serde_json::json;
use tonic::transport::Channel;

const STEPS: usize = 1000;
const PETS: usize = 5;
const SEED: u64 = 20261126;
/// Every step's outcome is awaited; this only bounds a broken one.
const SETTLE: Duration = Duration::from_secs(30);
/// A stale approval changes nothing the soak can see; the operator gets
/// this long to (wrongly) act on it before the writes are counted.
const QUIET: Duration = Duration::from_millis(300);
const APPROVE_PLAN: &str = "petstore.example.com/approve-plan";
const NAMES: [&str; 6] = ["Rex", "Tom", "Kiwi", "Bo", "Ziggy", "Luna"];
/// (spec, store wire value)
const TYPES: [(&str, i32); 3] = [("dog", 1), ("cat", 2), ("bird", 3)];
const BIRTHDAY: &str = "2020-01-01";

type Error = Box<dyn std::error::Error>;

#[derive(Clone, Debug, PartialEq)]
struct Record {
    name: String,
    pet_type: i32,
}

#[derive(Clone, Debug)]
struct Slot {
    name: String,
    live: bool,
    deleting: bool,
    policy: ChangePolicy,
    pet_name: String,
    pet_type: usize,
    /// The record this Pet owns, once it has one.
    record: Option<String>,
    /// Every plan this Pet has shown, by generation and hash: stale
    /// approvals come from earlier generations' plans.
    hashes: Vec<(i64, String)>,
    /// The record an earlier Pet of this name left (deleted under Observe).
    left: Option<String>,
    /// `record` was left by an earlier Pet and is not claimed yet.
    unclaimed: bool,
}

impl Slot {
    fn wants(&self) -> Record {
        Record {
            name: self.pet_name.clone(),
            pet_type: TYPES[self.pet_type].1,
        }
    }
}

/// The Pets and the records, read once per poll.
struct Snapshot {
    pets: BTreeMap<String, Pet>,
    records: BTreeMap<String, Record>,
}

#[derive(Clone, Copy, Debug)]
enum Step {
    Create(usize),
    EditSpec(usize),
    EditStore(usize),
    ApproveCurrent(usize),
    ApproveStale(usize),
    Switch(usize, ChangePolicy),
    Delete(usize),
    KillOperator,
}

struct Soak {
    env: Env,
    operator: Operator,
    rt: tokio::runtime::Runtime,
    pets: Api<Pet>,
    store: PetStoreClient<Channel>,
    rng: fastrand::Rng,
    slots: Vec<Slot>,
    /// The last known state of every record the soak has seen, whether a
    /// live Pet owns it or not.
    records: BTreeMap<String, Record>,
    /// The store's write RPCs after the last step.
    writes: f64,
    /// A slot whose approval of this hash must have been applied before
    /// the step has settled (until then its Pet already looks settled).
    approved: Option<(usize, String)>,
    counts: BTreeMap<&'static str, usize>,
    /// The store's write calls by method after the last step, for a
    /// failure's message.
    last_by_method: [f64; 4],
    /// The store's AddPets calls when the running operator started: once
    /// it has created a record, it creates a new Pet's before reading, and
    /// that AddPets is answered (and counted) even when a record of the
    /// Pet's name is there to take over, and nothing is created.
    adds_at_operator_start: f64,
}

fn policy_name(policy: ChangePolicy) -> &'static str {
    match policy {
        ChangePolicy::Automatic => "Automatic",
        ChangePolicy::Approve => "Approve",
        ChangePolicy::Observe => "Observe",
    }
}

const POLICIES: [ChangePolicy; 3] = [
    ChangePolicy::Automatic,
    ChangePolicy::Approve,
    ChangePolicy::Observe,
];

impl Soak {
    fn start(seed: u64) -> Result<Self, Error> {
        let env = Env::start(Storage::Memory)?;
        let operator = Self::start_operator(&env)?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (pets, store) = rt.block_on(async {
            let client = crate::admin_client(&env).await.map_err(|e| e as Error)?;
            let store = PetStoreClient::connect(format!("http://{}", env.store.addr)).await?;
            Ok::<_, Error>((Api::namespaced(client, "default"), store))
        })?;
        let writes = env.store.writes()?;
        let adds_at_operator_start = env.store.answered("AddPets")?;
        let slots = (0..PETS)
            .map(|i| Slot {
                name: format!("soak-{i}"),
                live: false,
                deleting: false,
                policy: ChangePolicy::Automatic,
                pet_name: String::new(),
                pet_type: 0,
                record: None,
                hashes: Vec::new(),
                left: None,
                unclaimed: false,
            })
            .collect();
        Ok(Self {
            env,
            operator,
            rt,
            pets,
            store,
            rng: fastrand::Rng::with_seed(seed),
            slots,
            records: BTreeMap::new(),
            writes,
            approved: None,
            counts: BTreeMap::new(),
            last_by_method: [0.0; 4],
            adds_at_operator_start,
        })
    }

    /// The same identity every time, so a restarted operator takes the
    /// Lease back without waiting for it to expire.
    fn start_operator(env: &Env) -> Result<Operator, Error> {
        Ok(env.start_operator("soak-operator")?)
    }

    /// AddPets, UpdatePets, DeletePets and SetIdempotencyKeys answered.
    fn writes_by_method(&self) -> Result<[f64; 4], Error> {
        let store = &self.env.store;
        Ok([
            store.answered("AddPets")?,
            store.answered("UpdatePets")?,
            store.answered("DeletePets")?,
            store.answered("SetIdempotencyKeys")?,
        ])
    }

    fn pick(&mut self) -> Step {
        let i = self.rng.usize(..PETS);
        let slot = &self.slots[i];
        let (live, deleting, policy) = (slot.live, slot.deleting, slot.policy);
        let has_record = slot.record.is_some();
        if !live {
            return Step::Create(i);
        }
        if deleting {
            return match self.rng.u8(..3) {
                0 => Step::ApproveCurrent(i),
                1 => Step::ApproveStale(i),
                _ => Step::Switch(i, self.other_policy(policy)),
            };
        }
        match self.rng.u8(..100) {
            0..25 => Step::EditSpec(i),
            25..45 if has_record => Step::EditStore(i),
            25..45 => Step::EditSpec(i),
            45..62 => Step::ApproveCurrent(i),
            62..72 => Step::ApproveStale(i),
            72..90 => Step::Switch(i, self.other_policy(policy)),
            90..98 => Step::Delete(i),
            _ => Step::KillOperator,
        }
    }

    fn other_policy(&mut self, policy: ChangePolicy) -> ChangePolicy {
        let others: Vec<ChangePolicy> = POLICIES.into_iter().filter(|p| *p != policy).collect();
        others[self.rng.usize(..others.len())]
    }

    fn other_name(&mut self, not: &str) -> String {
        let others: Vec<&str> = NAMES.into_iter().filter(|n| *n != not).collect();
        others[self.rng.usize(..others.len())].to_owned()
    }

    fn pet(&self, i: usize) -> Result<Option<Pet>, Error> {
        let name = self.slots[i].name.clone();
        Ok(self.rt.block_on(self.pets.get_opt(&name))?)
    }

    /// Every Pet, and every record the soak knows or a Pet names, in two
    /// reads.
    fn snapshot(&self) -> Result<Snapshot, Error> {
        let list = self.rt.block_on(self.pets.list(&ListParams::default()))?;
        let pets: BTreeMap<String, Pet> = list
            .items
            .into_iter()
            .filter_map(|pet| pet.metadata.name.clone().map(|name| (name, pet)))
            .collect();
        let mut ids: Vec<String> = self.records.keys().cloned().collect();
        ids.extend(self.slots.iter().filter_map(|slot| slot.record.clone()));
        ids.extend(
            pets.values()
                .filter_map(|pet| pet.status.as_ref().and_then(|s| s.id.clone())),
        );
        ids.sort();
        ids.dedup();
        let mut store = self.store.clone();
        let reply = self.rt.block_on(store.get_pets(GetPetsReq {
            ids,
            ..Default::default()
        }))?;
        let records = reply
            .into_inner()
            .pets
            .into_iter()
            .map(|pet| {
                let record = Record {
                    name: pet.name,
                    pet_type: pet.r#type,
                };
                (pet.id, record)
            })
            .collect();
        Ok(Snapshot { pets, records })
    }

    fn merge(&self, i: usize, patch: serde_json::Value) -> Result<(), Error> {
        let name = self.slots[i].name.clone();
        self.rt.block_on(
            self.pets
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch)),
        )?;
        Ok(())
    }

    /// The plan `Pet` shows now, if any.
    fn plan_of(pet: &Pet) -> Option<&petstore_operator::crd::PlanStatus> {
        pet.status.as_ref().and_then(|s| s.plan.as_ref())
    }

    /// Runs one step; returns the store writes the operator must make for
    /// it and the writes the test made itself.
    fn run(&mut self, step: Step) -> Result<(usize, usize), Error> {
        let name = match step {
            Step::Create(_) => "create",
            Step::EditSpec(_) => "spec edit",
            Step::EditStore(_) => "store edit",
            Step::ApproveCurrent(_) => "approval",
            Step::ApproveStale(_) => "stale approval",
            Step::Switch(..) => "policy switch",
            Step::Delete(_) => "deletion",
            Step::KillOperator => "kill -9",
        };
        *self.counts.entry(name).or_default() += 1;
        match step {
            Step::Create(i) => {
                let policy = POLICIES[self.rng.usize(..3)];
                let slot = &mut self.slots[i];
                slot.pet_name = NAMES[self.rng.usize(..NAMES.len())].to_owned();
                slot.pet_type = self.rng.usize(..TYPES.len());
                slot.policy = policy;
                // The record an earlier Pet of this name left is this one's
                // to take over: a claim, and an update if it differs.
                slot.record = slot.left.take();
                slot.unclaimed = slot.record.is_some();
                slot.hashes.clear();
                slot.live = true;
                slot.deleting = false;
                let creates_first =
                    self.env.store.answered("AddPets")? > self.adds_at_operator_start;
                let slot = &mut self.slots[i];
                let writes = match slot.record.as_ref().map(|id| self.records.get(id)) {
                    None => 1,
                    Some(found) => {
                        usize::from(creates_first) + 1 + usize::from(found != Some(&slot.wants()))
                    }
                };
                let spec = format!(
                    " {{name: {}, type: {}, birthday: \"{BIRTHDAY}\", changePolicy: {}}}",
                    slot.pet_name,
                    TYPES[slot.pet_type].0,
                    policy_name(policy)
                );
                self.env.cp.apply(&pet_manifest(&slot.name, &[], &spec))?;
                Ok((
                    if policy == ChangePolicy::Automatic {
                        writes
                    } else {
                        0
                    },
                    0,
                ))
            }
            Step::EditSpec(i) => {
                let (pet_name, pet_type) = (self.slots[i].pet_name.clone(), self.slots[i].pet_type);
                let patch = if self.rng.bool() {
                    let name = self.other_name(&pet_name);
                    self.slots[i].pet_name = name.clone();
                    json!({"spec": {"name": name}})
                } else {
                    let pet_type = (pet_type + 1 + self.rng.usize(..TYPES.len() - 1)) % TYPES.len();
                    self.slots[i].pet_type = pet_type;
                    json!({"spec": {"type": TYPES[pet_type].0}})
                };
                self.merge(i, patch)?;
                let slot = &self.slots[i];
                let writes = slot.policy == ChangePolicy::Automatic && slot.record.is_some();
                Ok((usize::from(writes), 0))
            }
            Step::EditStore(i) => {
                let id = self.slots[i].record.clone().ok_or("no record")?;
                let before = self.records.get(&id).cloned().ok_or("unknown record")?;
                let name = self.other_name(&before.name);
                let slot = &self.slots[i];
                self.env.store.grpcurl(
                    "petstore.PetStore/UpdatePets",
                    &format!(
                        r#"{{"pets":[{{"id":"{id}","name":"{name}","type":{},"birthday":{{"year":2020,"month":1,"day":1}}}}]}}"#,
                        before.pet_type
                    ),
                )?;
                let reverted = slot.policy == ChangePolicy::Automatic && name != slot.pet_name;
                self.records.insert(
                    id,
                    Record {
                        name,
                        pet_type: before.pet_type,
                    },
                );
                Ok((usize::from(reverted), 1))
            }
            Step::ApproveCurrent(i) => {
                let pet = self.pet(i)?.ok_or("a live Pet is gone")?;
                let Some(plan) = Self::plan_of(&pet) else {
                    return Ok((0, 0));
                };
                let (hash, actions) = (plan.hash.clone(), plan.actions.len());
                self.merge(
                    i,
                    json!({"metadata": {"annotations": {APPROVE_PLAN: &hash}}}),
                )?;
                // Observe writes nothing, even approved.
                if self.slots[i].policy == ChangePolicy::Approve {
                    self.approved = Some((i, hash));
                    Ok((actions, 0))
                } else {
                    std::thread::sleep(QUIET);
                    Ok((0, 0))
                }
            }
            Step::ApproveStale(i) => {
                let pet = self.pet(i)?.ok_or("a live Pet is gone")?;
                // Only earlier generations' plans: a plan of this generation
                // comes back, hash and all, when the record returns to what
                // it held (the hash covers the record's content; the store
                // has no per-record revision), and its approval then applies.
                let generation = pet.metadata.generation.unwrap_or_default();
                let stale: Vec<String> = self.slots[i]
                    .hashes
                    .iter()
                    .filter(|(g, _)| *g < generation)
                    .map(|(_, hash)| hash.clone())
                    .collect();
                let hash = if stale.is_empty() {
                    format!("{:016x}", self.rng.u64(..))
                } else {
                    stale[self.rng.usize(..stale.len())].clone()
                };
                self.merge(
                    i,
                    json!({"metadata": {"annotations": {APPROVE_PLAN: hash}}}),
                )?;
                std::thread::sleep(QUIET);
                Ok((0, 0))
            }
            Step::Switch(i, policy) => {
                let pet = self.pet(i)?.ok_or("a live Pet is gone")?;
                let shown = Self::plan_of(&pet).map_or(0, |p| p.actions.len());
                self.slots[i].policy = policy;
                self.merge(i, json!({"spec": {"changePolicy": policy_name(policy)}}))?;
                Ok((
                    if policy == ChangePolicy::Automatic {
                        shown
                    } else {
                        0
                    },
                    0,
                ))
            }
            Step::Delete(i) => {
                let name = self.slots[i].name.clone();
                self.rt
                    .block_on(self.pets.delete(&name, &DeleteParams::default()))?;
                let slot = &mut self.slots[i];
                slot.deleting = true;
                let deletes = slot.policy == ChangePolicy::Automatic
                    && slot.record.is_some()
                    && !slot.unclaimed;
                Ok((usize::from(deletes), 0))
            }
            Step::KillOperator => {
                self.operator.kill();
                self.operator = Self::start_operator(&self.env)?;
                self.adds_at_operator_start = self.env.store.answered("AddPets")?;
                Ok((0, 0))
            }
        }
    }

    /// Whether slot `i` shows what its policy, spec and record call for.
    fn settled(&self, i: usize, now: &Snapshot) -> bool {
        let slot = &self.slots[i];
        let Some(pet) = now.pets.get(&slot.name) else {
            // Absent: never made, or gone once its deletion was asked for.
            return !slot.live || slot.deleting;
        };
        let status = pet.status.clone().unwrap_or_default();
        if let Some((slot_index, hash)) = &self.approved
            && *slot_index == i
            && status.applied_plan.as_ref() != Some(hash)
        {
            return false;
        }
        if !slot.live {
            return false;
        }
        let generation = pet.metadata.generation;
        if status.observed_generation != generation {
            return false;
        }
        let plan = status.plan.as_ref();
        let id = slot.record.clone().or(status.id.clone());
        let record = id.as_ref().and_then(|id| now.records.get(id));
        match slot.policy {
            ChangePolicy::Automatic | ChangePolicy::Observe if slot.deleting => false,
            ChangePolicy::Automatic => {
                let ready = status
                    .conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                ready && record == Some(&slot.wants()) && plan.is_none()
            }
            ChangePolicy::Approve if slot.deleting => plan.is_some_and(|p| p.summary == "delete"),
            ChangePolicy::Approve | ChangePolicy::Observe => {
                let Some(record) = record else {
                    return plan
                        .is_some_and(|p| p.summary == "create" && p.generation == generation);
                };
                // A record left by an earlier Pet shows a claim until the
                // claim is applied, which leaves no plan.
                if *record == slot.wants() && (!slot.unclaimed || plan.is_none()) {
                    return plan.is_none();
                }
                let Some(plan) = plan else {
                    return false;
                };
                if plan.generation != generation {
                    return false;
                }
                if slot.unclaimed
                    && plan.actions.first().map(|a| a.action.as_str()) != Some("claim")
                {
                    return false;
                }
                if *record == slot.wants() {
                    return plan.actions.len() == 1;
                }
                let mut fields = Vec::new();
                if record.name != slot.pet_name {
                    fields.push("name");
                }
                if record.pet_type != TYPES[slot.pet_type].1 {
                    fields.push("type");
                }
                let Some(update) = plan.actions.iter().find(|a| a.action == "update") else {
                    return false;
                };
                let shown: Vec<&str> = update.changes.iter().map(|c| c.field.as_str()).collect();
                let name_from_now = update
                    .changes
                    .iter()
                    .filter(|c| c.field == "name")
                    .all(|c| c.from == format!("{:?}", record.name));
                shown == fields && name_from_now
            }
        }
    }

    /// Waits until every slot has settled, then takes in what the operator
    /// did: IDs it created, records it deleted, plans it showed.
    fn settle(&mut self, step: usize) -> Result<(), Error> {
        let deadline = Instant::now() + SETTLE;
        let now = loop {
            let now = self.snapshot()?;
            if (0..PETS).all(|i| self.settled(i, &now)) {
                break now;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "step {step}: not settled after {SETTLE:?}; records {:?}\n{}",
                    now.records,
                    self.describe(&now)
                )
                .into());
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        self.approved = None;
        for slot in &mut self.slots {
            let Some(pet) = now.pets.get(&slot.name) else {
                if slot.live {
                    // Deleted: by an Automatic decision or an approved plan
                    // the record went; under Observe it stays.
                    if let Some(id) = slot.record.take() {
                        // Never claimed, it was never this Pet's to delete.
                        if slot.policy == ChangePolicy::Observe || slot.unclaimed {
                            slot.left = Some(id);
                        } else {
                            self.records.remove(&id);
                        }
                    }
                    slot.live = false;
                    slot.deleting = false;
                }
                continue;
            };
            let status = pet.status.clone().unwrap_or_default();
            if let Some(plan) = &status.plan {
                let shown = (plan.generation.unwrap_or_default(), plan.hash.clone());
                if !slot.hashes.contains(&shown) {
                    slot.hashes.push(shown);
                }
            }
            if slot.record.is_none() {
                slot.record = status.id.clone();
            }
            if let Some(id) = &slot.record
                && status.plan.is_none()
                && !slot.deleting
            {
                // In line with the spec (Automatic, approved, or equal), and
                // claimed.
                self.records.insert(id.clone(), slot.wants());
                slot.unclaimed = false;
            }
        }
        Ok(())
    }

    /// Each slot as the soak sees it and its Pet's status, for a failure.
    fn describe(&self, now: &Snapshot) -> String {
        let slots: Vec<String> = self
            .slots
            .iter()
            .map(|slot| {
                let status = now.pets.get(&slot.name).map(|p| &p.status);
                format!("{slot:?}\n  {status:?}")
            })
            .collect();
        slots.join("\n")
    }

    /// Every record the soak knows holds what the soak last saw or made.
    fn check_records(&self, step: usize, what: Step) -> Result<(), Error> {
        let now = self.snapshot()?;
        for (id, want) in &self.records {
            let got = now.records.get(id);
            if got != Some(want) {
                return Err(format!(
                    "step {step} ({what:?}): record {id} is {got:?}, the soak last saw {want:?}\n{}",
                    self.describe(&now)
                )
                .into());
            }
        }
        Ok(())
    }
}

#[test]
fn a_thousand_random_steps_write_only_what_was_decided_or_approved() -> Result<(), Error> {
    let seed = match std::env::var("PETSTORE_SOAK_SEED") {
        Ok(text) => text
            .parse()
            .map_err(|e| format!("PETSTORE_SOAK_SEED={text:?}: {e}"))?,
        Err(_) => SEED,
    };
    eprintln!("plans soak: seed {seed} (PETSTORE_SOAK_SEED={seed} replays it)");
    let mut soak = Soak::start(seed)?;
    let started = Instant::now();
    let mut operator_writes = 0;
    for step in 0..STEPS {
        let what = soak.pick();
        if std::env::var_os("PETSTORE_SOAK_TRACE").is_some() {
            eprintln!("step {step}: {what:?}");
        }
        let (expected, own) = soak.run(what)?;
        soak.settle(step)?;
        let writes = soak.env.store.writes()?;
        let made = (writes - soak.writes) as i64 - own as i64;
        let by_method = soak.writes_by_method()?;
        assert_eq!(
            made, expected as i64,
            "step {step} ({what:?}): the operator made {made} store writes, {expected} were decided or approved; the store's write calls so far by method {by_method:?} (before: {:?}); slots: {:?}",
            soak.last_by_method, soak.slots
        );
        soak.last_by_method = by_method;
        operator_writes += expected;
        soak.writes = writes;
        soak.check_records(step, what)?;
    }
    eprintln!(
        "plans soak: {STEPS} steps in {:.0?}, {operator_writes} operator writes, each one decided or approved; steps: {:?}",
        started.elapsed(),
        soak.counts
    );
    // The run exercised what it claims to: each kind of step happened.
    for kind in [
        "create",
        "spec edit",
        "store edit",
        "approval",
        "stale approval",
        "policy switch",
        "deletion",
        "kill -9",
    ] {
        assert!(
            soak.counts.get(kind).is_some_and(|n| *n > 0),
            "no {kind} step"
        );
    }
    assert!(operator_writes > 0, "the operator never wrote");
    Ok(())
}
