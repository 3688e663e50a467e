//! Plans under `Approve`: N Pets converged, each switched to `Approve`
//! (nothing to change, so nothing shown), then all renamed at once, in
//! rounds. Each rename is timed from the answer to its edit until a watch on
//! the Pets shows that Pet's plan for the new generation. The store's own
//! count of write RPCs over the whole edit must not move.
//!
//! The bulk edit is made two ways. The goal is judged on the way users make
//! one: `kubectl apply -f` of a file holding every Pet's edited manifest.
//! Beside it, this benchmark's own client patches 16 Pets at once, a burst
//! heavier than kubectl makes. That burst is then made once more with the
//! operator stopped and a floor writing the plans: a client that only
//! writes each edited Pet's status with its plan moved to the new
//! generation. The floor's tail is what the API server's cores allow any
//! operator.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write as _};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kube::api::{Api, Patch, PatchParams};
use petstore_operator::crd::{Pet, PetStatus};

use crate::apimetrics::{self, RequestCounts};
use crate::convergence::{
    NAMESPACE, Shows, Tracker, client_from, create_pets, events_drained, hold_lease, kube_error,
    patch_all, pet, quiet, shipped_options, spawn_baseline, start_leader,
};
use crate::store_load::percentile;
use fixtures::{Env, Error, Operator, Result, Storage, Tools};

/// Where the section of the report starts; runs that do not measure it
/// keep it as it is.
pub const SECTION: &str = "\n## Plans under Approve";

/// The goal, as printed: every plan shown, p99 within this of its edit.
pub const GOAL_P99: Duration = Duration::from_secs(1);

#[derive(Clone, Debug)]
pub struct PlansConfig {
    pub pets: usize,
    pub concurrency: usize,
}

/// Bulk renames measured per way of editing, one after the other, each on
/// an idle operator (the previous round's Events written): one burst's tail
/// varies from run to run on 2 cores, so the goal is judged on all of them
/// together.
pub const ROUNDS: usize = 5;

/// How a bulk rename is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BulkEdit {
    /// `kubectl apply -f -` of one List holding every Pet's manifest: how a
    /// user edits many Pets at once. kubectl applies them one after the
    /// other, each with a read and a patch.
    KubectlApply,
    /// This benchmark's client: merge patches, this many in flight at once.
    Patches(usize),
}

impl BulkEdit {
    fn describe(self) -> String {
        match self {
            Self::KubectlApply => "`kubectl apply -f` of every Pet's manifest in one file".into(),
            Self::Patches(n) => {
                format!("merge patches from the benchmark's own client, {n} at a time")
            }
        }
    }
}

/// Who writes the plans a bulk rename makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlanWriter {
    Operator,
    /// The operator stopped (a replica stands by to serve the conversion
    /// webhook, as in the convergence floor), and a client that only writes
    /// each edited Pet's last status with its plan's generation moved on,
    /// as the operator's ServiceAccount, at the operator's concurrency.
    Floor,
}

/// One bulk rename.
#[derive(Clone, Debug, Default)]
pub struct Round {
    pub p99: Duration,
    /// From the first edit's answer to the last one's.
    pub edits_took: Duration,
    /// From the first edit's answer to the last plan shown.
    pub all_shown: Duration,
}

/// Every round of one way of editing.
#[derive(Clone, Debug)]
pub struct Burst {
    pub edit: BulkEdit,
    pub writer: PlanWriter,
    /// Edits (of every round) whose plan was shown before the timeout.
    pub shown: usize,
    /// Over every round's edits together.
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
    pub rounds: Vec<Round>,
    /// API requests to Pets and Events from the first rename until the last
    /// plan was shown, the renames included: what each edit costs the API
    /// server, which shares the cores with everything else.
    pub api_requests: RequestCounts,
}

#[derive(Clone, Debug, Default)]
pub struct PlansResult {
    pub pets: usize,
    /// kubectl's rounds first, then the benchmark client's.
    pub bursts: Vec<Burst>,
    /// Write RPCs the store answered from before the switch to `Approve`
    /// until the last plan was shown.
    pub store_writes: f64,
    pub started_at: String,
    pub commit: String,
}

impl Burst {
    fn describe(&self) -> String {
        match self.writer {
            PlanWriter::Operator => self.edit.describe(),
            PlanWriter::Floor => format!(
                "{}, **the floor**: the operator stopped, each plan written by a client that only moves the Pet's last plan to its new generation",
                self.edit.describe()
            ),
        }
    }

    /// Every round renames every Pet once.
    pub fn edits(&self, pets: usize) -> usize {
        pets * self.rounds.len()
    }

    fn all_shown(&self, pets: usize) -> bool {
        self.edits(pets) > 0 && self.shown == self.edits(pets)
    }
}

impl PlansResult {
    /// The goal's burst: kubectl's.
    pub fn by_kubectl(&self) -> Option<&Burst> {
        self.bursts
            .iter()
            .find(|b| b.edit == BulkEdit::KubectlApply && b.writer == PlanWriter::Operator)
    }

    pub fn goal_met(&self) -> bool {
        !self.bursts.is_empty()
            && self
                .bursts
                .iter()
                .filter(|b| b.writer == PlanWriter::Operator)
                .all(|b| b.all_shown(self.pets))
            && self.by_kubectl().is_some_and(|b| b.p99 <= GOAL_P99)
            && self.store_writes == 0.0
    }
}

/// The Pets' generation after the first rename: created (1), switched (2),
/// renamed (3); each round adds one.
const FIRST_EDITED_GENERATION: i64 = 3;

/// Pet `i`'s whole manifest as the benchmark created it, in `Approve` and
/// named `name`: what a user's file holds.
fn manifest(i: usize, name: &str) -> Result<serde_json::Value> {
    let mut pet = serde_json::to_value(pet(i)).map_err(|e| kubectl_error(e.to_string()))?;
    pet["metadata"]["namespace"] = NAMESPACE.into();
    pet["spec"]["name"] = name.into();
    pet["spec"]["changePolicy"] = "Approve".into();
    if let Some(object) = pet.as_object_mut() {
        object.remove("status");
    }
    Ok(pet)
}

fn kubectl_error(stderr: String) -> Error {
    Error::Command {
        command: "kubectl apply -f -".into(),
        status: "error".into(),
        stderr,
    }
}

/// `kubectl apply -f -` of one List of `pets` manifests, named by `name`;
/// when kubectl printed each Pet as configured (after its patch was
/// answered), by Pet.
fn kubectl_apply(env: &Env, pets: usize, name: impl Fn(usize) -> String) -> Result<Vec<Instant>> {
    let items = (0..pets)
        .map(|i| manifest(i, &name(i)))
        .collect::<Result<Vec<_>>>()?;
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string();
    let mut child = Command::new(Tools::get()?.kubectl())
        .arg(format!("--kubeconfig={}", env.cp.kubeconfig.display()))
        .args(["apply", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(fixtures::io("starting kubectl apply"))?;
    let (Some(mut stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(kubectl_error("no pipes to kubectl".into()));
    };
    // Written and read on threads of their own, so a full pipe never
    // stalls kubectl.
    let writer = std::thread::spawn(move || stdin.write_all(list.as_bytes()));
    let errors = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
    let mut answered: Vec<Option<Instant>> = vec![None; pets];
    for line in BufReader::new(stdout).lines() {
        let line = line.map_err(fixtures::io("reading kubectl apply"))?;
        let at = Instant::now();
        let index = line
            .strip_prefix("pet.petstore.example.com/pet-")
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|i| i.parse::<usize>().ok());
        if let Some(slot) = index.and_then(|i| answered.get_mut(i)) {
            *slot = Some(at);
        }
    }
    let written = writer
        .join()
        .map_err(|_| kubectl_error("writing the manifests panicked".into()))?;
    written.map_err(fixtures::io("writing the manifests to kubectl"))?;
    let status = child
        .wait()
        .map_err(fixtures::io("waiting for kubectl apply"))?;
    let stderr = errors.join().unwrap_or_default();
    if !status.success() {
        return Err(kubectl_error(stderr));
    }
    answered
        .into_iter()
        .enumerate()
        .map(|(i, at)| {
            at.ok_or_else(|| {
                kubectl_error(format!("kubectl printed nothing for pet-{i}: {stderr}"))
            })
        })
        .collect()
}

/// The plan a floor writes for this Pet: its status with the plan's
/// generation moved to the Pet's, if the Pet shows a plan for an older one.
fn moved_plan(pet: Pet) -> Option<(String, PetStatus)> {
    let generation = pet.metadata.generation?;
    let mut status = pet.status?;
    let plan = status.plan.as_mut()?;
    if plan.generation >= Some(generation) {
        return None;
    }
    plan.generation = Some(generation);
    status.observed_generation = Some(generation);
    Some((pet.metadata.name?, status))
}

/// Runs the floor ([`PlanWriter::Floor`]) until aborted.
fn spawn_plan_floor(api: Api<Pet>) -> tokio::task::JoinHandle<()> {
    spawn_baseline(api, moved_plan, |api, (name, status)| async move {
        let body = serde_json::json!({ "status": status });
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&body))
            .await
            .map(drop)
            .map_err(kube_error)
    })
}

pub fn measure(config: &PlansConfig, progress: &dyn Fn(&str)) -> Result<PlansResult> {
    let rt = crate::runtime()?;
    let env = Env::start(Storage::Durable)?;
    let mut operator = start_leader(&env, &shipped_options(&env, "plans"))?;
    let timeout = Duration::from_secs(120 + config.pets as u64 / 5);
    rt.block_on(async {
        env.cp.ensure_namespace(NAMESPACE)?;
        let client = client_from(&env.cp.kubeconfig).await?;
        let api: Api<Pet> = Api::namespaced(client, NAMESPACE);
        let mut tracker = Tracker::start(api.clone());
        progress(&format!("plans: converging {} Pets", config.pets));
        create_pets(&api, config.pets, config.concurrency).await?;
        tracker
            .all(Shows::Ready, config.pets, 1, timeout, "all Pets Ready")
            .await?;
        events_drained(&operator, timeout).await?;

        let writes_before = env.store.writes()?;
        // Switched as a user would, with kubectl apply of the manifests, so
        // each Pet carries kubectl's last-applied annotation before the
        // measured rounds, as a Pet kept in a file does.
        progress("plans: switching every Pet to Approve (kubectl apply)");
        // kubectl runs on this thread, which is not one of the runtime's
        // workers: the tracker's watch goes on meanwhile.
        let pets = config.pets;
        kubectl_apply(&env, pets, |i| format!("Pet {i}"))?;
        tracker
            .all(
                Shows::Ready,
                config.pets,
                2,
                timeout,
                "all Pets Ready in Approve",
            )
            .await?;
        events_drained(&operator, timeout).await?;

        // The tracker's watch, running since before the Pets were made,
        // notes when each first shows a plan for each renamed generation.
        let started_at = chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string();
        let mut bursts = Vec::new();
        let mut generation = FIRST_EDITED_GENERATION;
        // Started for the floor's rounds, which come last.
        let mut floor: Option<(Option<u32>, Operator, tokio::task::JoinHandle<()>)> = None;
        let mut store_writes = 0.0;
        for (edit, writer) in [
            (BulkEdit::KubectlApply, PlanWriter::Operator),
            (BulkEdit::Patches(config.concurrency), PlanWriter::Operator),
            (BulkEdit::Patches(config.concurrency), PlanWriter::Floor),
        ] {
            if writer == PlanWriter::Floor && floor.is_none() {
                store_writes = env.store.writes()? - writes_before;
                progress("plans: stopping the operator; the floor writes the plans");
                // The replica serves the conversion webhook before the
                // leader goes, so no write or watch meets it down; it stands
                // by, as the Lease is the leader's and then the bench's.
                let mut webhook =
                    env.start_operator_with(&shipped_options(&env, "plans-webhook"))?;
                let webhook_pid = webhook.process().pid();
                operator.kill();
                hold_lease(&env.cp)?;
                let client = client_from(&env.operator_kubeconfig).await?;
                let baseline = spawn_plan_floor(Api::namespaced(client, NAMESPACE));
                quiet(&env, webhook_pid).await;
                floor = Some((webhook_pid, webhook, baseline));
            }
            let api_before = apimetrics::scrape(&env.cp)?;
            let mut latencies = Vec::new();
            let mut rounds = Vec::new();
            for round in 0..ROUNDS {
                progress(&format!(
                    "plans: renaming {} Pets in Approve by {}, plans by {writer:?}, round {} of {ROUNDS}",
                    config.pets,
                    edit.describe(),
                    round + 1
                ));
                let answered = match edit {
                    BulkEdit::KubectlApply => {
                        kubectl_apply(&env, pets, |i| format!("Applied {round} {i}"))?
                    }
                    BulkEdit::Patches(concurrency) => patch_all(
                        &api,
                        pets,
                        concurrency,
                        |i| serde_json::json!({"spec": {"name": format!("Renamed {round} {i}")}}),
                    )
                    .await?,
                };
                // A timeout is a result too: the plans not shown are left
                // out of the count, and the goal is not met.
                let _ = tracker
                    .all(Shows::Plan, pets, generation, timeout, "every plan shown")
                    .await;
                let shown = tracker.planned_since(generation);
                let mut this_round: Vec<Duration> = (0..pets)
                    .filter_map(|i| {
                        let at = shown.get(&format!("pet-{i}"))?;
                        Some(at.saturating_duration_since(answered[i]))
                    })
                    .collect();
                this_round.sort();
                let first_answer = answered.iter().min().copied();
                let since_first = |last: Option<&Instant>| match (first_answer, last) {
                    (Some(first), Some(last)) => last.saturating_duration_since(first),
                    _ => Duration::ZERO,
                };
                rounds.push(Round {
                    p99: percentile(&this_round, 0.99),
                    edits_took: since_first(answered.iter().max()),
                    all_shown: since_first(shown.values().max()),
                });
                latencies.extend(this_round);
                generation += 1;
                // The next burst starts on an idle operator, as a user's would.
                match &floor {
                    None => events_drained(&operator, timeout).await?,
                    Some((webhook_pid, _, _)) => quiet(&env, *webhook_pid).await,
                }
            }
            let api_requests = apimetrics::diff(
                &api_before,
                &apimetrics::scrape(&env.cp)?,
                &["pets", "events"],
            );
            latencies.sort();
            bursts.push(Burst {
                edit,
                writer,
                shown: latencies.len(),
                p50: percentile(&latencies, 0.50),
                p99: percentile(&latencies, 0.99),
                max: latencies.last().copied().unwrap_or_default(),
                rounds,
                api_requests,
            });
        }
        if let Some((_, _, baseline)) = floor {
            baseline.abort();
        }
        Ok(PlansResult {
            pets: config.pets,
            bursts,
            store_writes,
            started_at,
            commit: crate::idle::commit(),
        })
    })
}

/// The report's section.
pub fn markdown(result: &PlansResult, command: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}\n", SECTION.trim_start());
    let _ = writeln!(
        out,
        "Measured with `{command}` on commit {}, from {}. {} Pets were converged (`Automatic`) on a control plane with a durable store and the operator at its defaults, then each was switched to `changePolicy: Approve` with `kubectl apply` of its manifest (nothing to change, so nothing shown), then all were renamed at once, {} times over by each way below, each time once the operator was idle again (its Events written). Each rename is timed from its answer (for kubectl, the line it prints for that Pet once its patch is answered) until a watch on the Pets shows that Pet's `status.plan` for the new generation; the percentiles are over all of one way's renames. The goal is judged on the way users edit many Pets: `kubectl apply -f` of a file holding every Pet's manifest, which kubectl applies one Pet after the other. Beside it, the benchmark's own client sends the renames as merge patches, several at once, a burst heavier than kubectl makes.\n",
        result.commit, result.started_at, result.pets, ROUNDS,
    );
    let _ = writeln!(
        out,
        "| measurement | goal | measured |  |\n|---|---|---|---|"
    );
    let met = |ok: bool| if ok { "met" } else { "not met" };
    for burst in &result.bursts {
        let n = burst.edits(result.pets);
        let how = burst.describe();
        let _ = writeln!(
            out,
            "| plans shown after the bulk renames, {how} | {n} of {n} | {} | {} |",
            burst.shown,
            met(burst.all_shown(result.pets)),
        );
        let (goal, verdict) = match (burst.edit, burst.writer) {
            (_, PlanWriter::Floor) => ("(the floor)".to_owned(), ""),
            (BulkEdit::KubectlApply, PlanWriter::Operator) => (
                format!("p99 ≤ {}", ms(GOAL_P99)),
                met(burst.p99 <= GOAL_P99),
            ),
            (BulkEdit::Patches(_), PlanWriter::Operator) => ("(beside it)".to_owned(), ""),
        };
        let _ = writeln!(
            out,
            "| edit to plan shown, p50 / p99 / max, {how} | {goal} | {} / {} / {} | {verdict} |",
            ms(burst.p50),
            ms(burst.p99),
            ms(burst.max),
        );
    }
    let _ = writeln!(
        out,
        "| store write RPCs, from the switch to the operator's last plan shown | 0 | {} | {} |",
        result.store_writes,
        met(result.store_writes == 0.0),
    );
    for burst in &result.bursts {
        let _ = writeln!(
            out,
            "\nRounds by {}:\n\n| round | edits answered over | last plan shown after the first answer | p99 |\n|---:|---:|---:|---:|",
            burst.describe()
        );
        for (i, round) in burst.rounds.iter().enumerate() {
            let _ = writeln!(
                out,
                "| {} | {:.1} s | {:.1} s | {} |",
                i + 1,
                round.edits_took.as_secs_f64(),
                round.all_shown.as_secs_f64(),
                ms(round.p99)
            );
        }
        let _ = writeln!(
            out,
            "\nAPI requests to Pets and Events over these rounds, the renames included: {}.",
            burst
                .api_requests
                .iter()
                .map(|((resource, verb), n)| format!("{verb} {resource} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let _ = writeln!(
        out,
        "\nEach plan is a status write: for a burst, how soon each shows is bounded by how fast the API server takes status writes beside the edits. The floor's rounds measure that bound: the same burst, with nothing between each edit and its plan but one status write, as the operator's ServiceAccount, at the operator's concurrency. The store's write count above covers the operator's rounds (the floor has no store)."
    );
    out
}

fn ms(duration: Duration) -> String {
    format!("{:.0} ms", duration.as_secs_f64() * 1000.0)
}
