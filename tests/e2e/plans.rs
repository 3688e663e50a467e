//! Change policies on the real API server and store, counted by the
//! store's own write RPCs: a Pet in `Approve` shows its plan and writes
//! nothing through two audits (counted as the operator's own store reads,
//! not slept through), refuses a wrong or stale approval, writes
//! exactly the approved plan once, shows a new plan for a spec edit, and
//! waits to be deleted until its delete plan is approved; the kubectl
//! plugin prints the same plan before anything is applied, and from what
//! `kubectl get pets -o yaml` prints; a Pet in `Observe` adopts nothing,
//! shows what differs, shows an out-of-band edit within about a second from
//! the store's change feed alone (its poll and audit an hour away) without
//! reverting it, and switched to `Automatic` writes exactly the plan it
//! showed; deleted in `Observe`, it leaves its record untouched.

use std::time::{Duration, Instant};

use fixtures::env::pet_manifest;
use fixtures::{Env, Operator, Storage, wait_for};
use kube::api::Api;
use petstore_operator::crd::{Pet, PlanStatus, PlannedChange};
use serde_json::Value;

use crate::typed::{self};

const TIMEOUT: Duration = Duration::from_secs(60);
const APPROVE_PLAN: &str = "petstore.example.com/approve-plan";
/// The audit's interval here.
const AUDIT: &str = "2s";
/// Store reads to wait for before "nothing was written" is asserted: the
/// echo of the status write that showed the plan may be one of them, so
/// three leave at least two audits (one Pet's reconciles never overlap).
const TWO_AUDITS: u32 = 3;
/// The change feed shows an out-of-band edit within about a second. With
/// the poll and the audit an hour away, nothing else can show it in time.
const SHOWN_WITHIN: Duration = Duration::from_millis(1500);
/// The observing operator's poll interval (its audit is the default hour):
/// far beyond the test, so only the change feed can show an edit.
const NO_POLL: &str = "1h";
/// How long the operator's store reads must hold still to count as idle.
const SETTLED: Duration = Duration::from_millis(500);

type Error = Box<dyn std::error::Error + Send + Sync>;

fn pet_yaml(name: &str, spec: &str, annotations: &[(&str, &str)]) -> String {
    pet_manifest(name, annotations, &format!(" {spec}"))
}

fn plan_of(pet: &Pet) -> Option<&PlanStatus> {
    pet.status.as_ref()?.plan.as_ref()
}

fn plan(env: &Env, name: &str) -> Option<PlanStatus> {
    plan_of(&typed::pet(&env.cp, "default", name).ok()?).cloned()
}

/// Waits for a plan with this summary, other than `not` (a hash); returns it.
fn wait_plan(
    env: &Env,
    name: &str,
    summary: &str,
    not: Option<&str>,
) -> fixtures::Result<PlanStatus> {
    let what = format!("with the plan {summary}");
    typed::wait_pet(&env.cp, "default", name, TIMEOUT, &what, |pet| {
        plan_of(pet)
            .filter(|p| p.summary == summary && not.is_none_or(|hash| p.hash != hash))
            .cloned()
    })
}

fn hash(plan: &PlanStatus) -> String {
    plan.hash.clone()
}

/// The `n`th action's first change, if the plan has them.
fn first_change(plan: &PlanStatus, n: usize) -> Option<&PlannedChange> {
    plan.actions.get(n)?.changes.first()
}

fn annotate(env: &Env, name: &str, key: &str, value: &str) -> fixtures::Result<String> {
    env.cp
        .annotate_pet("default", name, &["--overwrite", &format!("{key}={value}")])
}

fn record(env: &Env, id: &str) -> fixtures::Result<Value> {
    let found = env.store.grpcurl(
        "petstore.PetStore/GetPets",
        &format!(r#"{{"ids":["{id}"]}}"#),
    )?;
    Ok(found
        .first()
        .and_then(|reply| reply["pets"].get(0))
        .cloned()
        .unwrap_or(Value::Null))
}

fn update_record(
    env: &Env,
    id: &str,
    name: &str,
    pet_type: &str,
    year: u32,
) -> fixtures::Result<()> {
    env.store.grpcurl(
        "petstore.PetStore/UpdatePets",
        &format!(
            r#"{{"pets":[{{"id":"{id}","name":"{name}","type":"{pet_type}","birthday":{{"year":{year},"month":3,"day":1}}}}]}}"#
        ),
    )?;
    Ok(())
}

/// `kubectl petstore plan -f <manifest>` against the plaintext store: its
/// exit code and the plans it printed, failing on an error.
fn kubectl_petstore_plan(env: &Env, manifest: &str) -> fixtures::Result<(Option<i32>, String)> {
    let addr = ["--petstore-addr", env.store.addr.as_str()];
    let planned = env.kubectl_petstore_plan(manifest, &addr.map(Into::into))?;
    assert_ne!(
        planned.code,
        Some(1),
        "kubectl petstore plan failed: {}",
        planned.stderr
    );
    Ok((planned.code, planned.stdout))
}

/// The PLAN column of `kubectl get pet NAME`, as printed. kubectl aligns
/// its columns, so the cell spans from its header to the next one's.
fn plan_column(env: &Env, name: &str) -> fixtures::Result<String> {
    let listed = env.cp.kubectl(&["get", "pet", name, "-n", "default"])?;
    let mut lines = listed.lines();
    let (header, row) = (
        lines.next().unwrap_or_default(),
        lines.next().unwrap_or_default(),
    );
    let start = header.find("PLAN").expect("a PLAN column");
    let end = header[start..]
        .find("READY")
        .map_or(row.len(), |i| start + i);
    Ok(row
        .get(start..end.min(row.len()))
        .unwrap_or_default()
        .trim()
        .to_owned())
}

fn reason(pet: &Pet, type_: &str) -> String {
    pet.condition(type_)
        .map(|c| c.reason.clone())
        .unwrap_or_default()
}

#[test]
fn approve_writes_only_the_approved_plan_once() -> fixtures::Result<()> {
    let env = Env::start(Storage::Durable)?;
    let mut options = env.operator_options("operator");
    options
        .extra_args
        .extend(["--audit-interval".into(), AUDIT.into()]);
    let operator = env.start_operator_with(&options)?;
    let writes = || env.store.writes();
    let start = writes()?;
    let two_audits = |since: f64| {
        operator
            .wait_store_reads(since, TWO_AUDITS, TIMEOUT)
            .map(drop)
    };

    // A new Pet in Approve: a create plan, and nothing written for two
    // audits.
    env.cp.apply(&pet_yaml(
        "rex",
        r#"{name: Rex, type: dog, birthday: "2022-03-01", changePolicy: Approve}"#,
        &[],
    ))?;
    let create = wait_plan(&env, "rex", "create", None)?;
    assert_eq!(create.cause, "new_pet");
    assert_eq!(plan_column(&env, "rex")?, "create");
    two_audits(operator.store_reads()?)?;
    let pet = typed::pet(&env.cp, "default", "rex")?;
    assert_eq!(
        reason(&pet, "Ready"),
        "PlanPending",
        "{}",
        typed::shown(&pet)
    );
    assert_eq!(
        plan_of(&pet).map(hash),
        Some(hash(&create)),
        "the plan held still"
    );
    assert_eq!(writes()?, start, "written before approval");

    // A wrong hash writes nothing, and is called stale.
    annotate(&env, "rex", APPROVE_PLAN, "0123456789abcdef")?;
    env.wait_event("ApprovalStale/rex", TIMEOUT)?;
    assert_eq!(writes()?, start, "written on a wrong hash");

    // The right hash writes exactly the create.
    annotate(&env, "rex", APPROVE_PLAN, &hash(&create))?;
    let id = env.wait_ready("default", "rex", TIMEOUT)?;
    assert_eq!(writes()?, start + 1.0, "one AddPets");
    let pet = typed::pet(&env.cp, "default", "rex")?;
    let status = pet.status.as_ref();
    assert_eq!(
        status.and_then(|s| s.applied_plan.as_deref()),
        Some(create.hash.as_str())
    );
    assert!(plan_of(&pet).is_none(), "{}", typed::shown(&pet));
    assert_eq!(plan_column(&env, "rex")?, "none");

    // A spec edit makes a new plan; the spent approval does not apply it.
    env.rename("default", "rex", "Rexford")?;
    let rename = wait_plan(&env, "rex", "update name", None)?;
    let rename_shown = operator.store_reads()?;
    assert_eq!(rename.cause, "spec_change");
    assert_eq!(plan_column(&env, "rex")?, "update name");

    // The plugin, for the Pet as it stands: the very plan in its status,
    // byte for byte, and exit code 2 (a change would be made).
    let rexford = pet_yaml(
        "rex",
        r#"{name: Rexford, type: dog, birthday: "2022-03-01", changePolicy: Approve}"#,
        &[],
    );
    let (code, printed) = kubectl_petstore_plan(&env, &rexford)?;
    let shown = env.cp.kubectl(&[
        "get",
        "pet",
        "rex",
        "-n",
        "default",
        "-o",
        "jsonpath={.status.plan}",
    ])?;
    assert_eq!(code, Some(2), "{printed}");
    assert_eq!(printed.trim_end(), shown.trim_end());
    // The same Pet as `kubectl get pets -o yaml` prints it: a List, with
    // the API server's fields (managedFields, resourceVersion, status).
    let listed = env
        .cp
        .kubectl(&["get", "pets", "-n", "default", "-o", "yaml"])?;
    let (code, from_list) = kubectl_petstore_plan(&env, &listed)?;
    assert_eq!(code, Some(2), "{from_list}");
    assert_eq!(from_list.trim_end(), shown.trim_end());
    // A Pet not created yet: a create, and nothing written anywhere.
    let fido = pet_yaml(
        "fido",
        r#"{name: Fido, type: dog, birthday: "2023-01-01"}"#,
        &[],
    );
    let (code, printed) = kubectl_petstore_plan(&env, &fido)?;
    assert_eq!(code, Some(2), "{printed}");
    assert!(printed.contains(r#""summary":"create""#), "{printed}");
    assert!(
        env.pet("default", "fido").is_err(),
        "the plugin created fido"
    );
    two_audits(rename_shown)?;
    assert_eq!(record(&env, &id)?["name"], "Rex");
    assert_eq!(writes()?, start + 1.0, "written without a new approval");

    // An out-of-band edit while the plan waits: a new plan, and the
    // approval of the old one is stale.
    update_record(&env, &id, "Rex", "PTCanine", 2020)?;
    let both = wait_plan(&env, "rex", "update name,birthday", None)?;
    let after_edit = start + 2.0;
    let stale_approval = operator.store_reads()?;
    annotate(&env, "rex", APPROVE_PLAN, &hash(&rename))?;
    two_audits(stale_approval)?;
    assert_eq!(writes()?, after_edit, "a stale approval was written");
    assert_eq!(plan(&env, "rex").map(|p| hash(&p)), Some(hash(&both)));

    // Its own hash writes it: one UpdatePets with both fields.
    annotate(&env, "rex", APPROVE_PLAN, &hash(&both))?;
    env.wait_ready("default", "rex", TIMEOUT)?;
    let stored = record(&env, &id)?;
    assert_eq!(stored["name"], "Rexford");
    assert_eq!(stored["birthday"]["year"], 2022);
    assert_eq!(writes()?, after_edit + 1.0, "one UpdatePets");

    // In line: the plugin plans nothing and exits 0.
    let (code, printed) = kubectl_petstore_plan(&env, &rexford)?;
    assert_eq!(code, Some(0), "{printed}");
    assert!(printed.contains(r#""summary":"none""#), "{printed}");
    assert_eq!(writes()?, after_edit + 1.0, "the plugin wrote");

    // Deleted in Approve: the Pet waits with a delete plan until that is
    // approved too.
    env.cp
        .kubectl(&["delete", "pet", "rex", "-n", "default", "--wait=false"])?;
    let delete = wait_plan(&env, "rex", "delete", None)?;
    assert_eq!(delete.cause, "deletion");
    two_audits(operator.store_reads()?)?;
    assert!(env.pet("default", "rex").is_ok(), "gone without approval");
    assert_eq!(
        record(&env, &id)?["id"],
        id.as_str(),
        "deleted without approval"
    );
    annotate(&env, "rex", APPROVE_PLAN, &hash(&delete))?;
    env.wait_gone("default", "rex", TIMEOUT)?;
    assert!(
        record(&env, &id)?.is_null(),
        "the record outlived its approved delete"
    );
    assert_eq!(writes()?, after_edit + 2.0, "one DeletePets");
    Ok(())
}

/// Reads the Pet every few milliseconds with a client of its own (kubectl
/// takes tens of milliseconds a read, more under load) until its plan
/// passes `accept`; the plan, and when the read that showed it returned.
fn wait_plan_closely(
    env: &Env,
    name: &str,
    accept: impl Fn(&PlanStatus) -> bool,
) -> Result<(PlanStatus, Instant), Error> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let api: Api<Pet> = Api::namespaced(crate::admin_client(env).await?, "default");
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let pet = api.get(name).await?;
            let seen = Instant::now();
            if let Some(plan) = plan_of(&pet).filter(|plan| accept(plan)) {
                return Ok((plan.clone(), seen));
            }
            if seen > deadline {
                let plan = plan_of(&pet);
                return Err(format!("{name}'s plan after {TIMEOUT:?}: {plan:?}").into());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
}

/// The operator's change-feed series, for a failure's message.
fn feed_metrics(operator: &Operator) -> Vec<String> {
    operator
        .metrics()
        .unwrap_or_default()
        .lines()
        .filter(|line| line.starts_with("petstore_operator_change_feed"))
        .map(str::to_owned)
        .collect()
}

#[test]
fn observe_shows_drift_without_reverting_it_and_automatic_applies_the_plan() -> Result<(), Error> {
    let env = Env::start(Storage::Durable)?;
    // Polling off in effect: an hour's poll, and the default hour's audit.
    // An operator whose change feed never connects fails the bound below.
    let mut options = env.operator_options("operator");
    options.poll_interval = NO_POLL;
    let operator = env.start_operator_with(&options)?;
    let writes = || env.store.writes();

    // A record made outside Kubernetes, then a Pet in Observe naming it.
    let added = env.store.grpcurl(
        "petstore.PetStore/AddPets",
        r#"{"pets":[{"name":"Old Tom","type":"PTFeline","birthday":{"year":2015,"month":3,"day":1}}]}"#,
    )?;
    let id = fixtures::petstore::added_id(&added)
        .expect("AddPets returns the new record's ID")
        .to_owned();
    let start = writes()?;
    env.cp.apply(&pet_yaml(
        "tom",
        r#"{name: Tom, type: cat, birthday: "2015-03-01", changePolicy: Observe}"#,
        &[("petstore.example.com/external-id", &id)],
    ))?;
    let adopt = wait_plan(&env, "tom", "claim, update name", None)?;
    assert_eq!(adopt.cause, "adoption");
    let rename =
        first_change(&adopt, 1).map(|c| (c.field.as_str(), c.from.as_str(), c.to.as_str()));
    assert_eq!(
        rename,
        Some(("name", "\"Old Tom\"", "\"Tom\"")),
        "{adopt:?}"
    );
    assert_eq!(
        reason(&typed::pet(&env.cp, "default", "tom")?, "Ready"),
        "RecordDiffers"
    );
    wait_for(TIMEOUT, "the operator to follow the change feed", || {
        feed_metrics(&operator)
            .iter()
            .any(|line| line == "petstore_operator_change_feed_connected 1")
            .then_some(())
    })?;
    operator.wait_reads_settled(SETTLED, TIMEOUT)?;

    // An out-of-band edit shows up as a plan within about a second, from
    // the feed, and stays.
    update_record(&env, &id, "Older Tom", "PTFeline", 2015)?;
    let edited = Instant::now();
    let (shown, seen) = wait_plan_closely(&env, "tom", |p| {
        first_change(p, 1).is_some_and(|c| c.from == "\"Older Tom\"")
    })
    .map_err(|error| {
        format!(
            "{error}; the operator's feed: {:?}",
            feed_metrics(&operator)
        )
    })?;
    let took = seen.duration_since(edited);
    eprintln!("the out-of-band edit was shown after {took:?}");
    assert!(
        took < SHOWN_WITHIN,
        "the edit was shown after {took:?}; the operator's feed: {:?}",
        feed_metrics(&operator)
    );
    // Even approved, Observe writes nothing: the reconcile the annotation
    // brings reads the record, and writes nothing.
    let before_approval = operator.wait_reads_settled(SETTLED, TIMEOUT)?;
    annotate(&env, "tom", APPROVE_PLAN, &hash(&shown))?;
    operator.wait_store_reads(before_approval, 1, TIMEOUT)?;
    operator.wait_reads_settled(SETTLED, TIMEOUT)?;
    assert_eq!(writes()?, start + 1.0, "only the test's own UpdatePets");
    assert_eq!(record(&env, &id)?["name"], "Older Tom");

    // Automatic applies exactly the plan shown: a claim and an update.
    env.patch_spec("default", "tom", r#"{"changePolicy":"Automatic"}"#)?;
    env.wait_ready("default", "tom", TIMEOUT)?;
    assert_eq!(record(&env, &id)?["name"], "Tom");
    assert_eq!(writes()?, start + 3.0, "SetIdempotencyKeys and UpdatePets");

    // In line: Observe, then Automatic again, costs no write, though each
    // switch's reconcile reads the record.
    let before_switch = operator.wait_reads_settled(SETTLED, TIMEOUT)?;
    env.patch_spec("default", "tom", r#"{"changePolicy":"Observe"}"#)?;
    env.patch_spec("default", "tom", r#"{"changePolicy":"Automatic"}"#)?;
    env.wait_ready("default", "tom", TIMEOUT)?;
    operator.wait_store_reads(before_switch, 1, TIMEOUT)?;
    operator.wait_reads_settled(SETTLED, TIMEOUT)?;
    assert_eq!(
        writes()?,
        start + 3.0,
        "a switch with nothing to change wrote"
    );

    // Deleted in Observe: the Pet goes, its record stays as it was.
    env.patch_spec("default", "tom", r#"{"changePolicy":"Observe"}"#)?;
    env.wait_ready("default", "tom", TIMEOUT)?;
    env.cp.kubectl(&["delete", "pet", "tom", "-n", "default"])?;
    env.wait_gone("default", "tom", TIMEOUT)?;
    assert_eq!(
        record(&env, &id)?["name"],
        "Tom",
        "the record went with the Pet"
    );
    assert_eq!(writes()?, start + 3.0, "deleting an observed Pet wrote");
    Ok(())
}
