//! A seeded randomized soak of change policies on the real API server and
//! store: 1,000 steps of spec edits, out-of-band store edits with grpcurl,
//! approvals with the current and with a stale hash, policy switches,
//! deletions, re-creations and `kill -9` of the operator. After every step,
//! counted by the store's own write RPCs:
//!
//! - no write while a plan waits unapproved;
//! - every write is an approved plan's or an `Automatic` decision's, exactly
//!   the writes, by RPC, that the soak's own model of the Pet and its record
//!   says are needed (create, update, claim, delete), never read from the
//!   plan the operator shows: a wrong plan applied faithfully fails;
//! - every record holds what the model says: the spec once written (name,
//!   type and birthday, so an update writing a field it should not fails),
//!   and no record of an `Observe` or unapproved `Approve` Pet, nor one a
//!   Pet left behind, changes but by the test's own edits;
//! - an approval that must write nothing (stale, or under `Observe`) is
//!   counted only once the operator has reconciled since it, shown by its
//!   finished reconciles and the store's reads advancing.
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
    /// `YYYY-MM-DD`; the spec's never changes, so neither may the record's.
    birthday: String,
}

/// Store writes by what they do; `keys` are claims and releases
/// (SetIdempotencyKeys).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Writes {
    create: usize,
    update: usize,
    delete: usize,
    keys: usize,
}

impl Writes {
    const NONE: Writes = Writes {
        create: 0,
        update: 0,
        delete: 0,
        keys: 0,
    };

    fn total(&self) -> usize {
        self.create + self.update + self.delete + self.keys
    }

    /// In the order of [`Soak::writes_by_method`].
    fn by_method(&self) -> [usize; 4] {
        [self.create, self.update, self.delete, self.keys]
    }
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
    /// The model expects the operator to bring this Pet's record in line
    /// with its spec in the current step (Automatic, or approved).
    applying: bool,
}

impl Slot {
    fn wants(&self) -> Record {
        Record {
            name: self.pet_name.clone(),
            pet_type: TYPES[self.pet_type].1,
            birthday: BIRTHDAY.to_owned(),
        }
    }
}

/// What shows that the operator looked at the Pets since: reconciles it
/// started and finished, and the store's reads.
#[derive(Clone, Copy, Debug)]
struct Activity {
    started: f64,
    finished: f64,
    reads: f64,
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
    /// The store's write calls by method after the last step.
    last_by_method: [f64; 4],
    /// Approvals that must write nothing, counted after a reconcile.
    audited: usize,
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
        let last_by_method = [
            env.store.answered("AddPets")?,
            env.store.answered("UpdatePets")?,
            env.store.answered("DeletePets")?,
            env.store.answered("SetIdempotencyKeys")?,
        ];
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
                applying: false,
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
            last_by_method,
            audited: 0,
            adds_at_operator_start,
        })
    }

    /// The same identity every time, so a restarted operator takes the
    /// Lease back without waiting for it to expire. Its store calls may
    /// take 10 s, not the fixtures' 2 s: the soak counts write RPCs, and a
    /// call given up and sent again is one RPC more for the same write.
    /// Under the test command's load one AddPets was counted twice.
    fn start_operator(env: &Env) -> Result<Operator, Error> {
        let mut options = env.operator_options("soak-operator");
        options.petstore_timeout = "10s";
        Ok(env.start_operator_with(&options)?)
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

    /// The model: the store writes that bring slot `i`'s record in line
    /// with what the soak set (spec, policy, deletion), from the record as
    /// the soak last left or saw it. Never from the Pet's plan.
    fn needs(&self, i: usize) -> Writes {
        let slot = &self.slots[i];
        if slot.deleting {
            // A record never claimed is not this Pet's to delete.
            let mine = slot.record.is_some() && !slot.unclaimed;
            return Writes {
                delete: usize::from(mine),
                ..Writes::NONE
            };
        }
        match &slot.record {
            None => Writes {
                create: 1,
                ..Writes::NONE
            },
            Some(id) => Writes {
                keys: usize::from(slot.unclaimed),
                update: usize::from(self.records.get(id) != Some(&slot.wants())),
                ..Writes::NONE
            },
        }
    }

    /// The operator brings slot `i` in line now: what the model says that
    /// takes, and the record it leaves (taken in by [`Soak::settle`]).
    fn apply(&mut self, i: usize) -> Writes {
        let needs = self.needs(i);
        self.slots[i].applying = !self.slots[i].deleting;
        needs
    }

    /// What shows the operator looked at the Pets: see [`Activity`].
    fn activity(&self) -> Result<Activity, Error> {
        let scrape = self.operator.metrics()?;
        let sum = |name| fixtures::http::sum_series(&scrape, name, "");
        Ok(Activity {
            started: sum("petstore_operator_reconciles_total"),
            finished: sum("petstore_operator_reconcile_duration_seconds_count"),
            reads: self.env.store.answered("GetPets")?,
        })
    }

    /// Waits until a reconcile that started after `before` was taken has
    /// finished (more finished than had started then) and the store has
    /// been read since. The annotation changed, so the operator's watch
    /// asks for the Pet's reconcile (the approval is part of its intent);
    /// every other Pet has settled and drift comes from the store's feed,
    /// the poll being an hourly audit, so that reconcile is, all but
    /// surely, the Pet's audit of the approval, read from the store.
    fn await_audit(&mut self, step: Step, before: Activity) -> Result<(), Error> {
        let deadline = Instant::now() + SETTLE;
        loop {
            let now = self.activity()?;
            if now.finished > before.started && now.reads > before.reads {
                self.audited += 1;
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{step:?}: no reconcile ran in {SETTLE:?} after the approval: before {before:?}, now {now:?}"
                )
                .into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The approve-plan annotation `pet` carries now.
    fn approval_of(pet: &Pet) -> Option<&String> {
        pet.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(APPROVE_PLAN))
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
                let birthday = pet.birthday.map_or_else(String::new, |d| {
                    format!("{:04}-{:02}-{:02}", d.year, d.month, d.day)
                });
                let record = Record {
                    name: pet.name,
                    pet_type: pet.r#type,
                    birthday,
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

    /// Runs one step; returns the store writes the model says the operator
    /// must make for it and the writes the test made itself.
    fn run(&mut self, step: Step) -> Result<(Writes, Writes), Error> {
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
        let automatic = |soak: &Self, i: usize| soak.slots[i].policy == ChangePolicy::Automatic;
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
                let slot = &self.slots[i];
                let spec = format!(
                    " {{name: {}, type: {}, birthday: \"{BIRTHDAY}\", changePolicy: {}}}",
                    slot.pet_name,
                    TYPES[slot.pet_type].0,
                    policy_name(policy)
                );
                self.env.cp.apply(&pet_manifest(&slot.name, &[], &spec))?;
                if !automatic(self, i) {
                    return Ok((Writes::NONE, Writes::NONE));
                }
                let mut writes = self.apply(i);
                if self.slots[i].record.is_some() && creates_first {
                    // The create before the read, answered with the record
                    // of the Pet's name; nothing is created.
                    writes.create += 1;
                }
                Ok((writes, Writes::NONE))
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
                if !automatic(self, i) {
                    return Ok((Writes::NONE, Writes::NONE));
                }
                Ok((self.apply(i), Writes::NONE))
            }
            Step::EditStore(i) => {
                let id = self.slots[i].record.clone().ok_or("no record")?;
                let before = self.records.get(&id).cloned().ok_or("unknown record")?;
                let name = self.other_name(&before.name);
                self.env.store.grpcurl(
                    "petstore.PetStore/UpdatePets",
                    &format!(
                        r#"{{"pets":[{{"id":"{id}","name":"{name}","type":{},"birthday":{{"year":2020,"month":1,"day":1}}}}]}}"#,
                        before.pet_type
                    ),
                )?;
                self.records.insert(
                    id,
                    Record {
                        name,
                        pet_type: before.pet_type,
                        birthday: BIRTHDAY.to_owned(),
                    },
                );
                let own = Writes {
                    update: 1,
                    ..Writes::NONE
                };
                if !automatic(self, i) {
                    return Ok((Writes::NONE, own));
                }
                Ok((self.apply(i), own))
            }
            Step::ApproveCurrent(i) => {
                let pet = self.pet(i)?.ok_or("a live Pet is gone")?;
                // The hash is the operator's (an approval has to name it);
                // what approving it writes is the model's.
                let Some(plan) = Self::plan_of(&pet) else {
                    let needs = self.needs(i);
                    if needs != Writes::NONE {
                        return Err(format!(
                            "{step:?}: no plan shown, but the model needs {needs:?}; slot {:?}",
                            self.slots[i]
                        )
                        .into());
                    }
                    return Ok((Writes::NONE, Writes::NONE));
                };
                let hash = plan.hash.clone();
                let changes = Self::approval_of(&pet) != Some(&hash);
                let before = self.activity()?;
                self.merge(
                    i,
                    json!({"metadata": {"annotations": {APPROVE_PLAN: &hash}}}),
                )?;
                // Observe writes nothing, even approved.
                if self.slots[i].policy == ChangePolicy::Approve {
                    self.approved = Some((i, hash));
                    Ok((self.apply(i), Writes::NONE))
                } else {
                    if changes {
                        self.await_audit(step, before)?;
                    }
                    Ok((Writes::NONE, Writes::NONE))
                }
            }
            Step::ApproveStale(i) => {
                let pet = self.pet(i)?.ok_or("a live Pet is gone")?;
                // Only earlier generations' plans: a plan of this generation
                // comes back, hash and all, when the record returns to what
                // it held (the hash covers the record's content; the store
                // has no per-record revision), and its approval then applies.
                // Never the approval it carries: the annotation must change
                // for the operator to look again.
                let generation = pet.metadata.generation.unwrap_or_default();
                let carried = Self::approval_of(&pet);
                let stale: Vec<String> = self.slots[i]
                    .hashes
                    .iter()
                    .filter(|(g, hash)| *g < generation && Some(hash) != carried)
                    .map(|(_, hash)| hash.clone())
                    .collect();
                let hash = if stale.is_empty() {
                    format!("{:016x}", self.rng.u64(..))
                } else {
                    stale[self.rng.usize(..stale.len())].clone()
                };
                let before = self.activity()?;
                self.merge(
                    i,
                    json!({"metadata": {"annotations": {APPROVE_PLAN: hash}}}),
                )?;
                self.await_audit(step, before)?;
                Ok((Writes::NONE, Writes::NONE))
            }
            Step::Switch(i, policy) => {
                self.slots[i].policy = policy;
                self.merge(i, json!({"spec": {"changePolicy": policy_name(policy)}}))?;
                if !automatic(self, i) {
                    return Ok((Writes::NONE, Writes::NONE));
                }
                Ok((self.apply(i), Writes::NONE))
            }
            Step::Delete(i) => {
                let name = self.slots[i].name.clone();
                self.rt
                    .block_on(self.pets.delete(&name, &DeleteParams::default()))?;
                self.slots[i].deleting = true;
                if !automatic(self, i) {
                    return Ok((Writes::NONE, Writes::NONE));
                }
                Ok((self.apply(i), Writes::NONE))
            }
            Step::KillOperator => {
                self.operator.kill();
                self.operator = Self::start_operator(&self.env)?;
                self.adds_at_operator_start = self.env.store.answered("AddPets")?;
                Ok((Writes::NONE, Writes::NONE))
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

    /// Waits until every slot has settled, then takes in what the model
    /// says the operator did (records it brought in line, deleted or left)
    /// and the names it gave: IDs it created, plans it showed.
    fn settle(&mut self, step: usize) -> Result<(), Error> {
        let deadline = Instant::now() + SETTLE;
        let now = loop {
            let now = self.snapshot()?;
            if (0..PETS).all(|i| self.settled(i, &now)) {
                break now;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "step {step}: not settled after {SETTLE:?}; records {:?}\n{}\nthe operator's log:\n{}",
                    now.records,
                    self.describe(&now),
                    self.operator.process().log_tail(80)
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
            if std::mem::take(&mut slot.applying) {
                // Brought in line with the spec (Automatic or approved), and
                // claimed: check_records holds the store to it.
                let id = slot.record.clone().ok_or_else(|| {
                    format!(
                        "step {step}: {} was to be brought in line, and names no record",
                        slot.name
                    )
                })?;
                self.records.insert(id, slot.wants());
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
        let by_method = soak.writes_by_method()?;
        // AddPets, UpdatePets, DeletePets, SetIdempotencyKeys.
        let made: Vec<i64> = (0..4)
            .map(|m| (by_method[m] - soak.last_by_method[m]) as i64 - own.by_method()[m] as i64)
            .collect();
        let want: Vec<i64> = expected.by_method().iter().map(|n| *n as i64).collect();
        assert_eq!(
            made,
            want,
            "step {step} ({what:?}): the operator's store writes by RPC (AddPets, UpdatePets, DeletePets, SetIdempotencyKeys) were {made:?}, the model decided or approved {expected:?}; the store's write calls so far by method {by_method:?} (before: {:?}); slots: {:?}\nthe operator's log:\n{}",
            soak.last_by_method,
            soak.slots,
            soak.operator.log_tail(80)
        );
        soak.last_by_method = by_method;
        operator_writes += expected.total();
        soak.writes = writes;
        soak.check_records(step, what)?;
    }
    eprintln!(
        "plans soak: {STEPS} steps in {:.0?}, {operator_writes} operator writes, each one the model's decision or approval; {} approvals that write nothing counted after a reconcile; steps: {:?}",
        started.elapsed(),
        soak.audited,
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
    assert!(soak.audited > 0, "no approval was audited");
    Ok(())
}
