//! `kubectl petstore plan -f pets.yaml`: the plan the operator would make
//! for each Pet in the manifests, before they are applied. It asks the API
//! server for a server-side dry run (defaults, validation, conversion and
//! admission applied; nothing stored), reads each Pet's record from the
//! store, and plans with the operator's own decision step, printing each
//! plan as `status.plan` holds it. It writes nothing anywhere. A Pet being
//! deleted while the installation is being removed shows the release the
//! operator would make instead of a delete (the same read of the CRD and the
//! operator's namespace).
//!
//! Exit codes, as `terraform plan -detailed-exitcode`: 0 when no Pet would
//! change the store, 2 when some would, 1 on an error (a Pet with no store
//! it may use among them).
//!
//! `kubectl petstore import`: records already in the store as Pet
//! manifests on standard output, safe to apply as they are (see
//! [`petstore_operator::import`]). It writes nothing either.
//!
//! `kubectl petstore approve`: approves the plans Pets show now, each by
//! setting its approve-plan annotation to the hash in its `status.plan`,
//! so the operator writes exactly the plan that was shown (one that changed
//! meanwhile is not approved). For the many Pets a drift storm holds, or
//! many pending plans; it writes only those annotations.
//!
//! Both plan and import act with the caller's rights: each Pet's store is found by the
//! operator's rule over the store objects the caller may read, and a store
//! named by a `PetStore` or `ClusterPetStore` is read with a token of the
//! namespace minted with the caller's kubeconfig
//! ([`petstore_operator::stores::caller`]), so the plugin reads only what
//! its user may read as that namespace. The operator's own store is read
//! as before, at `--petstore-addr`.

use std::collections::HashSet;
use std::io::Read as _;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, bail};
use chrono::NaiveDate;
use clap::{Parser, Subcommand};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use petstore_operator::Error;
use petstore_operator::cli::{INSTALLATION_ENV, StoreTlsArgs, parse_audience, parse_installation};
use petstore_operator::controller::facts_of;
use petstore_operator::controller::plan::{self as planning, Planned};
use petstore_operator::controller::uninstall::UninstallProbe;
use petstore_operator::crd::{
    APPROVE_PLAN_ANNOTATION, ChangePolicy, GROUP, Pet, PetType, PlanStatus, StoreRef,
};
use petstore_operator::decision::nothing_planned;
use petstore_operator::import::{
    Born, Holder, holder, importable, manifest, of_namespace, search_request, to_yaml,
};
use petstore_operator::store::grpc::{GrpcPetStore, StoreCallMetrics};
use petstore_operator::stores::caller::{CallerError, CallerStores, Chosen, store_ref_of};
use petstore_operator::stores::resolve::{Resolved, StoreId};
use petstore_proto::petstore as pb;
use serde_json::Value;

#[derive(Parser)]
#[command(name = "kubectl-petstore", about = "Pet store tools for kubectl")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the store writes the operator would make for these Pets,
    /// without applying them. Exit 0: none; 2: some; 1: an error.
    Plan {
        /// A manifest file of Pets, as `kubectl apply -f` takes it: YAML
        /// documents or JSON, each a Pet or a List of them (what `kubectl
        /// get pets -o yaml` prints); `-` reads standard input.
        #[arg(short = 'f', long = "filename")]
        file: String,
        #[command(flatten)]
        store: StoreArgs,
        /// Namespace for Pets whose manifest names none (default: the
        /// kubeconfig context's).
        #[arg(short = 'n', long)]
        namespace: Option<String>,
        /// The operator's namespace, read to tell an uninstall (config/default
        /// installs it in petstore-system).
        #[arg(
            long,
            env = "PETSTORE_OPERATOR_NAMESPACE",
            default_value = "petstore-system"
        )]
        operator_namespace: String,
    },
    /// Print Pet manifests that adopt records already in the store: each by
    /// its ID (external-id), kept on deletion (Orphan), observed only
    /// (changePolicy: Observe) unless --change-policy says otherwise.
    /// Records a live Pet of this cluster or another installation owns are
    /// left out, and counted on standard error.
    Import {
        /// Only records with this pet name (repeatable).
        #[arg(long = "name")]
        names: Vec<String>,
        /// Only records of this type: dog, cat, bird or reptile (repeatable).
        #[arg(long = "type", value_parser = parse_type)]
        types: Vec<PetType>,
        /// Only records born on or after this date (YYYY-MM-DD).
        #[arg(long)]
        born_from: Option<NaiveDate>,
        /// Only records born before this date (YYYY-MM-DD).
        #[arg(long)]
        born_before: Option<NaiveDate>,
        /// The change policy of the manifests: Observe (never writes),
        /// Approve or Automatic (claims each record at once).
        #[arg(long, default_value = "Observe", value_parser = parse_policy)]
        change_policy: ChangePolicy,
        /// The store to read, as a Pet of the namespace names it:
        /// PetStore/<name> or ClusterPetStore/<name>. Default: the
        /// namespace's, as the operator picks it (its PetStore default, else
        /// the ClusterPetStore default if it admits the namespace, else the
        /// operator's own store at --petstore-addr). A PetStore's or
        /// ClusterPetStore's records are read as the namespace, with a token
        /// minted as you, and the manifests name that store.
        #[arg(long, value_parser = parse_store_ref)]
        store_ref: Option<StoreRef>,
        #[command(flatten)]
        store: StoreArgs,
        /// Namespace for records that name none (default: the kubeconfig
        /// context's); a record keeps the namespace and name of the Pet it
        /// last belonged to. Through a PetStore or ClusterPetStore, the
        /// namespace the records are read as and the manifests go to.
        #[arg(short = 'n', long)]
        namespace: Option<String>,
    },
    /// Approve the plans these Pets show now: each Pet's
    /// petstore.example.com/approve-plan annotation is set to the hash in
    /// its status.plan, so the operator writes exactly the plan shown.
    Approve {
        /// The Pets to approve (or --all).
        names: Vec<String>,
        /// Every Pet of the namespace that shows a plan.
        #[arg(long, conflicts_with = "names")]
        all: bool,
        /// Only Pets whose Synced reason is this, such as DriftStorm or
        /// PlanPending.
        #[arg(long)]
        reason: Option<String>,
        /// The Pets' namespace (default: the kubeconfig context's).
        #[arg(short = 'n', long)]
        namespace: Option<String>,
    },
}

/// The store, and the installation whose keys are this cluster's, as the
/// operator's flags name them.
#[derive(clap::Args)]
struct StoreArgs {
    /// The operator's own pet store, as its --petstore-addr: the store of
    /// Pets that no PetStore or ClusterPetStore serves.
    #[arg(long, env = "PETSTORE_ADDR", default_value = "localhost:6742")]
    petstore_addr: String,
    #[command(flatten)]
    tls: StoreTlsArgs,
    /// The operator's --installation: part of the key its records carry.
    #[arg(long, env = INSTALLATION_ENV, default_value = "", value_parser = parse_installation)]
    installation: String,
    /// The operator's --petstore-audience: the own store checks tenants,
    /// and is read with a token of the namespace's petstore-tenant minted
    /// as you.
    #[arg(long, env = "PETSTORE_AUDIENCE", value_parser = parse_audience)]
    petstore_audience: Option<String>,
    /// Reach a store at ADDR rather than at its spec.address, as through
    /// `kubectl port-forward`: PetStore/<namespace>/<name>=ADDR or
    /// ClusterPetStore/<name>=ADDR; repeatable. TLS still checks the name
    /// the store's spec gives.
    #[arg(long = "store-address", value_name = "STORE=ADDR", value_parser = parse_store_address)]
    store_addresses: Vec<(StoreId, String)>,
}

impl StoreArgs {
    fn caller_stores(&self, client: Client, call_timeout: Duration) -> CallerStores<Client> {
        CallerStores::new(client, call_timeout)
            .with_addresses(self.store_addresses.iter().cloned().collect())
    }

    fn connect(&self, call_timeout: Duration) -> anyhow::Result<GrpcPetStore> {
        GrpcPetStore::connect_lazy(
            &self.petstore_addr,
            call_timeout,
            self.tls.files().as_ref(),
            StoreCallMetrics::default(),
        )
        .context("the pet store address")
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Plan {
            file,
            store,
            namespace,
            operator_namespace,
        } => match plan(&file, &store, namespace, operator_namespace).await {
            Ok(false) => ExitCode::SUCCESS,
            Ok(true) => ExitCode::from(2),
            Err(error) => {
                eprintln!("kubectl petstore plan: {error:#}");
                ExitCode::FAILURE
            }
        },
        Command::Import {
            names,
            types,
            born_from,
            born_before,
            change_policy,
            store_ref,
            store,
            namespace,
        } => {
            let born = Born {
                from: born_from,
                before: born_before,
            };
            let search = search_request(names, &types, born);
            match import(search, change_policy, store_ref, &store, namespace).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    eprintln!("kubectl petstore import: {error:#}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Approve {
            names,
            all,
            reason,
            namespace,
        } => match approve(names, all, reason, namespace).await {
            Ok(approved) => {
                eprintln!("{approved} plan(s) approved");
                ExitCode::SUCCESS
            }
            Err(error) => {
                eprintln!("kubectl petstore approve: {error:#}");
                ExitCode::FAILURE
            }
        },
    }
}

/// Sets each chosen Pet's approve-plan annotation to the hash of the plan
/// it shows; returns how many were approved.
async fn approve(
    names: Vec<String>,
    all: bool,
    reason: Option<String>,
    namespace: Option<String>,
) -> anyhow::Result<usize> {
    if names.is_empty() && !all {
        bail!(
            "name the Pets to approve, or pass --all for every Pet of the namespace that shows a plan"
        );
    }
    let client = Client::try_default()
        .await
        .context("no Kubernetes client (kubeconfig)")?;
    let namespace = namespace.unwrap_or_else(|| client.default_namespace().to_owned());
    let api: Api<Pet> = Api::namespaced(client, &namespace);
    let pets = if all {
        api.list(&ListParams::default())
            .await
            .context("listing Pets")?
            .items
    } else {
        let mut pets = Vec::with_capacity(names.len());
        for name in &names {
            pets.push(api.get(name).await.with_context(|| format!("pet {name}"))?);
        }
        pets
    };
    let mut approved = 0;
    for pet in pets {
        let name = pet.name_any();
        let synced = pet
            .condition(petstore_operator::status::SYNCED)
            .map(|c| c.reason.clone())
            .unwrap_or_default();
        if reason.as_ref().is_some_and(|wanted| *wanted != synced) {
            continue;
        }
        let Some(plan) = pet.status.as_ref().and_then(|s| s.plan.as_ref()) else {
            if !all {
                eprintln!("pet/{name} shows no plan: nothing to approve");
            }
            continue;
        };
        let patch = serde_json::json!({
            "metadata": {"annotations": {APPROVE_PLAN_ANNOTATION: plan.hash}}
        });
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .with_context(|| format!("annotating pet {name}"))?;
        println!(
            "pet/{name} approved: plan {} ({}, {synced})",
            plan.hash, plan.summary
        );
        approved += 1;
    }
    Ok(approved)
}

fn parse_type(value: &str) -> Result<PetType, String> {
    serde_json::from_value(Value::String(value.to_owned()))
        .map_err(|_| format!("{value:?} is not dog, cat, bird or reptile"))
}

fn parse_policy(value: &str) -> Result<ChangePolicy, String> {
    serde_json::from_value(Value::String(value.to_owned()))
        .map_err(|_| format!("{value:?} is not Automatic, Approve or Observe"))
}

fn parse_store_address(value: &str) -> Result<(StoreId, String), String> {
    let wrong = || {
        format!("{value:?} is not PetStore/<namespace>/<name>=ADDR or ClusterPetStore/<name>=ADDR")
    };
    let (store, address) = value.split_once('=').ok_or_else(wrong)?;
    if address.is_empty() {
        return Err(wrong());
    }
    let id = match store.split('/').collect::<Vec<_>>()[..] {
        ["PetStore", namespace, name] if !namespace.is_empty() && !name.is_empty() => {
            StoreId::Namespaced {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            }
        }
        ["ClusterPetStore", name] if !name.is_empty() => StoreId::Cluster {
            name: name.to_owned(),
        },
        _ => return Err(wrong()),
    };
    Ok((id, address.to_owned()))
}

fn parse_store_ref(value: &str) -> Result<StoreRef, String> {
    value.parse().map_err(|error| format!("{error}"))
}

/// Prints the manifests for the records `search` finds that this cluster
/// may adopt, from the store `store_ref` names (default: the namespace's).
async fn import(
    search: pb::SearchPetsReq,
    policy: ChangePolicy,
    store_ref: Option<StoreRef>,
    store_args: &StoreArgs,
    namespace: Option<String>,
) -> anyhow::Result<()> {
    let client = Client::try_default()
        .await
        .context("connecting to the API server (KUBECONFIG)")?;
    let namespace = namespace.unwrap_or_else(|| client.default_namespace().to_owned());
    // One streamed read of every record asked for, however many.
    let call_timeout = Duration::from_secs(60);
    let mut stores = store_args.caller_stores(client.clone(), call_timeout);
    if let Some(audience) = &store_args.petstore_audience {
        stores = stores.with_own_tenancy(store_args.connect(call_timeout)?, audience.clone());
    }
    let resolved = stores.resolve(&namespace, store_ref.as_ref(), None).await?;
    // Through a PetStore or ClusterPetStore the store shows this namespace
    // its own records only, so the Pets that may own them are this
    // namespace's: what a user of one namespace may list.
    let (store, through, pets) = match resolved {
        // An own store that checks tenants is read as this namespace too.
        Resolved::Own => match stores.own_for(&namespace).await? {
            Some(store) => (
                store,
                Some(StoreId::Own),
                Api::<Pet>::namespaced(client, &namespace),
            ),
            None => (
                store_args.connect(call_timeout)?,
                None,
                Api::<Pet>::all(client),
            ),
        },
        Resolved::Store { id, endpoint } => {
            // The token is minted before anything is sent: a caller who may
            // not act as the namespace gets no client, and the store no call.
            let store = stores.client(&id, &endpoint, &namespace).await?;
            (store, Some(id), Api::<Pet>::namespaced(client, &namespace))
        }
    };
    let live_uids: HashSet<String> = pets
        .list(&ListParams::default())
        .await
        .with_context(|| match &through {
            None => "listing the cluster's Pets".to_owned(),
            Some(_) => format!("listing the Pets of namespace {namespace}"),
        })?
        .into_iter()
        .filter_map(|pet| pet.uid())
        .collect();
    let records = store.search(search).await.context("searching the store")?;
    let named = through.as_ref().and_then(store_ref_of);
    let (mut manifests, mut live, mut elsewhere, mut nameless, mut foreign) =
        (Vec::new(), 0, 0, 0, 0);
    for record in &records {
        if named.is_some() && !of_namespace(record, &namespace) {
            foreign += 1;
            continue;
        }
        let holder = holder(record, &store_args.installation, &live_uids);
        if importable(record, &holder) {
            manifests.push(manifest(record, &namespace, policy, named.as_ref()));
            continue;
        }
        match holder {
            Holder::LivePet => live += 1,
            Holder::Elsewhere(_) => elsewhere += 1,
            Holder::Lost | Holder::Nobody => nameless += 1,
        }
    }
    print!("{}", to_yaml(&manifests)?);
    let (read, owners, others) = match &through {
        None => (String::new(), "this cluster".to_owned(), String::new()),
        Some(id) => (
            format!(" in {id}, read as namespace {namespace},"),
            format!("namespace {namespace}"),
            format!(", {foreign} named after Pets of other namespaces"),
        ),
    };
    eprintln!(
        "{} of {} records{read} as Pet manifests; left out: {live} owned by Pets of {owners}, {elsewhere} by other installations, {nameless} owned by Pets gone from this cluster but without an identity (release them with SetIdempotencyKeys, then import again){others}",
        manifests.len(),
        records.len()
    );
    Ok(())
}

/// Plans every Pet in `file`; says whether any would write. A Pet with no
/// store it may use is named on standard error, the others are planned,
/// and then it is an error.
async fn plan(
    file: &str,
    store_args: &StoreArgs,
    namespace: Option<String>,
    operator_namespace: String,
) -> anyhow::Result<bool> {
    let manifests = read_manifests(file)?;
    let client = Client::try_default()
        .await
        .context("connecting to the API server (KUBECONFIG)")?;
    let namespace = namespace.unwrap_or_else(|| client.default_namespace().to_owned());
    let call_timeout = Duration::from_secs(10);
    let own = store_args.connect(call_timeout)?;
    let mut stores = store_args.caller_stores(client.clone(), call_timeout);
    if let Some(audience) = &store_args.petstore_audience {
        stores = stores.with_own_tenancy(own.clone(), audience.clone());
    }
    let uninstall = UninstallProbe::new(client.clone(), operator_namespace);
    let (mut changes, mut refused) = (false, Vec::new());
    for manifest in manifests {
        let pet = dry_run(&client, &namespace, &manifest).await?;
        let name = pet.identity();
        let store = match stores.for_pet(&pet).await {
            Ok(Chosen::Own) => own.clone(),
            Ok(Chosen::Store { client, .. }) => *client,
            Err(error @ (CallerError::Refused(_) | CallerError::Forbidden(_))) => {
                eprintln!("pet {name}: no store it may use: {error}");
                refused.push(name);
                continue;
            }
            Err(error) => return Err(error.into()),
        };
        let planned = plan_pet(&pet, &store, &uninstall, &store_args.installation).await?;
        let writes = !planned.actions.is_empty();
        if writes {
            eprintln!("pet {name}: {} (plan {})", planned.summary, planned.hash);
        } else {
            eprintln!("pet {name}: none");
        }
        println!("{}", status_plan_json(&planned)?);
        changes |= writes;
    }
    if !refused.is_empty() {
        bail!(
            "not planned, as no store they may use was found: {}",
            refused.join(", ")
        );
    }
    Ok(changes)
}

/// Every Pet in `file` (`-`: standard input), as JSON.
fn read_manifests(file: &str) -> anyhow::Result<Vec<Value>> {
    if file == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("reading standard input")?;
        pets_in("standard input", &text)
    } else {
        let text = std::fs::read_to_string(file).with_context(|| format!("reading {file}"))?;
        pets_in(file, &text)
    }
}

/// The Pets in manifests, read as `kubectl apply -f` reads them: YAML
/// documents separated by `---`, or JSON objects one after another; each a
/// Pet, or a list of them (`kind: List` or `PetList`, with `items`), as
/// `kubectl get pets -o yaml` prints. Empty documents are skipped; anything
/// else is an error naming `source`, the document and the item (counted
/// from 1) and what it holds.
///
/// What the API server wrote into a Pet it printed is dropped: its
/// managedFields, which an apply must not carry, and its resourceVersion,
/// which every status write moves on (the plan is for the spec, whenever
/// the copy was made).
fn pets_in(source: &str, text: &str) -> anyhow::Result<Vec<Value>> {
    let documents: Vec<Value> = if text.trim_start().starts_with('{') {
        serde_json::Deserializer::from_str(text)
            .into_iter::<Value>()
            .enumerate()
            .map(|(i, document)| {
                document.with_context(|| format!("{source}: document {} is not JSON", i + 1))
            })
            .collect::<anyhow::Result<_>>()?
    } else {
        serde_norway::Deserializer::from_str(text)
            .enumerate()
            .map(|(i, document)| {
                serde::Deserialize::deserialize(document)
                    .with_context(|| format!("{source}: document {} is not YAML", i + 1))
            })
            .collect::<anyhow::Result<_>>()?
    };
    let mut pets = Vec::new();
    for (i, document) in documents.into_iter().enumerate() {
        let at = format!("{source}: document {}", i + 1);
        if document.is_null() {
            continue;
        }
        let Some(items) = list_items(&document) else {
            pets.push(pet(document, &at)?);
            continue;
        };
        // kubectl fills in an item's kind from a typed list's (a PetList
        // from the API holds Pets that may not repeat it).
        let item_kind = document["kind"]
            .as_str()
            .and_then(|kind| kind.strip_suffix("List"))
            .filter(|kind| !kind.is_empty());
        for (j, mut item) in items.iter().cloned().enumerate() {
            if let (Some(kind), Some(fields)) = (item_kind, item.as_object_mut())
                && !fields.contains_key("kind")
            {
                fields.insert("kind".into(), kind.into());
                if let Some(version) = document.get("apiVersion") {
                    fields.insert("apiVersion".into(), version.clone());
                }
            }
            pets.push(pet(item, &format!("{at}, item {}", j + 1))?);
        }
    }
    Ok(pets)
}

/// The items of a list (`List`, `PetList`, any `...List` with `items`).
fn list_items(document: &Value) -> Option<&Vec<Value>> {
    document["kind"]
        .as_str()
        .filter(|kind| kind.ends_with("List"))
        .and(document["items"].as_array())
}

/// `value` if it is a Pet of this API group, ready to apply; `at` names
/// where it was for the error.
fn pet(mut value: Value, at: &str) -> anyhow::Result<Value> {
    let kind = value["kind"].as_str();
    let api_version = value["apiVersion"].as_str().unwrap_or_default();
    let group = api_version.split_once('/').map(|(group, _)| group);
    match (kind, group) {
        (Some("Pet"), Some(GROUP)) => {}
        (Some(kind), _) if !api_version.is_empty() => {
            bail!("{at} is a {kind} of {api_version}, not a Pet of {GROUP}")
        }
        (Some(kind), _) => bail!("{at} is a {kind} without an apiVersion, not a Pet of {GROUP}"),
        (None, _) if value.is_object() => bail!("{at} has no kind, so is not a Pet"),
        (None, _) => bail!("{at} is not an object, so is not a Pet"),
    }
    if let Some(metadata) = value["metadata"].as_object_mut() {
        metadata.remove("managedFields");
        metadata.remove("resourceVersion");
    }
    Ok(value)
}

/// The Pet as the API server would store it: a server-side dry-run apply.
async fn dry_run(client: &Client, namespace: &str, manifest: &Value) -> anyhow::Result<Pet> {
    let name = manifest["metadata"]["name"]
        .as_str()
        .context("a Pet without metadata.name")?;
    let namespace = manifest["metadata"]["namespace"]
        .as_str()
        .unwrap_or(namespace);
    let api: Api<Pet> = Api::namespaced(client.clone(), namespace);
    // Forced: the fields belong to whoever applied the Pet before; nothing
    // is stored either way.
    let params = PatchParams::apply("kubectl-petstore").force().dry_run();
    api.patch(name, &params, &Patch::Apply(manifest))
        .await
        .with_context(|| format!("server-side dry run of Pet {namespace}/{name}"))
}

/// The operator's plan for `pet`: the same facts, first step, read and
/// decision as a reconcile. The finalizer, which precedes every store
/// write, is taken as written.
async fn plan_pet(
    pet: &Pet,
    store: &GrpcPetStore,
    uninstall: &UninstallProbe,
    installation: &str,
) -> anyhow::Result<PlanStatus> {
    let mut pet = pet.clone();
    // A Pet not created yet has no UID: no record can be keyed by it.
    pet.metadata
        .uid
        .get_or_insert_with(|| "(not created yet)".into());
    let mut facts = facts_of(&pet, installation)?;
    facts.has_finalizer = true;
    // The operator's own planning; this writes nothing, so it reads the
    // store where the operator would create first.
    let planned = planning::plan(store, Some(uninstall), &mut facts, false)
        .await
        .map_err(|error| match error {
            Error::Store(error) => anyhow::Error::new(error).context("reading the store"),
            error => error.into(),
        })?;
    Ok(match planned {
        Planned::Plan(plan) => plan.to_status(),
        // Paused, or a spec the store rejected: nothing is planned.
        Planned::Wait(_) | Planned::Hold { .. } | Planned::AddFinalizer | Planned::CreateFirst => {
            nothing_planned(facts.generation)
        }
    })
}

/// As `kubectl get pet -o jsonpath='{.status.plan}'` prints it: the API
/// server's JSON has its keys in order, and so has serde_json's map (its
/// `preserve_order` feature is off); the plugin's end-to-end test compares
/// the two byte for byte.
fn status_plan_json(plan: &PlanStatus) -> anyhow::Result<String> {
    Ok(serde_json::to_string(&serde_json::to_value(plan)?)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    const REX: &str = "apiVersion: petstore.example.com/v1
kind: Pet
metadata: {name: rex}
spec: {name: Rex, type: dog, birthday: \"2022-03-01\"}
";

    /// A setting the operator and the plugin share has one variable: the
    /// plugin's flags named as an operator flag read the operator's.
    #[test]
    fn the_plugin_reads_the_operators_variables() {
        use clap::CommandFactory;
        let operator = petstore_operator::cli::Args::command();
        let plugin = Cli::command();
        let mut shared = Vec::new();
        for subcommand in plugin.get_subcommands() {
            for arg in subcommand.get_arguments() {
                let Some(theirs) = operator.get_arguments().find(|theirs| {
                    theirs.get_long().is_some() && theirs.get_long() == arg.get_long()
                }) else {
                    continue;
                };
                assert_eq!(
                    arg.get_env(),
                    theirs.get_env(),
                    "{} --{:?}",
                    subcommand.get_name(),
                    arg.get_long()
                );
                shared.push(arg.get_long().unwrap_or_default().to_owned());
            }
        }
        for flag in [
            "installation",
            "petstore-addr",
            "petstore-ca-file",
            "petstore-audience",
        ] {
            assert!(
                shared.iter().any(|s| s == flag),
                "{flag} not shared: {shared:?}"
            );
        }
        let installation = plugin
            .find_subcommand("plan")
            .and_then(|plan| {
                plan.get_arguments()
                    .find(|arg| arg.get_id() == "installation")
            })
            .and_then(|arg| arg.get_env());
        assert_eq!(
            installation.and_then(|env| env.to_str()),
            Some("PETSTORE_INSTALLATION")
        );
    }

    /// `approve` approves named Pets, or every Pet only when asked with
    /// --all, never both.
    #[test]
    fn approve_takes_names_or_all() {
        let parsed = |args: &[&str]| {
            Cli::try_parse_from(std::iter::once("kubectl-petstore").chain(args.iter().copied()))
                .map(|cli| match cli.command {
                    Command::Approve { names, all, .. } => (names, all),
                    _ => (Vec::new(), false),
                })
                .map_err(|error| error.to_string())
        };
        assert_eq!(parsed(&["approve", "rex"]), Ok((vec!["rex".into()], false)));
        assert_eq!(
            parsed(&["approve", "--all", "--reason", "DriftStorm"]),
            Ok((Vec::new(), true))
        );
        assert!(parsed(&["approve", "rex", "--all"]).is_err());
    }

    /// `--store-address` names a store as its status does, with the
    /// namespace of a PetStore; plan and import both take it.
    #[test]
    fn a_store_address_names_one_store_and_an_address() {
        let parsed = |args: &[&str]| {
            Cli::try_parse_from(std::iter::once("kubectl-petstore").chain(args.iter().copied()))
                .map(|cli| match cli.command {
                    Command::Plan { store, .. } | Command::Import { store, .. } => {
                        store.store_addresses
                    }
                    Command::Approve { .. } => Vec::new(),
                })
                .map_err(|error| error.to_string())
        };
        assert_eq!(
            parsed(&[
                "plan",
                "-f",
                "-",
                "--store-address",
                "PetStore/team-a/shared=127.0.0.1:16742",
                "--store-address=ClusterPetStore/big=localhost:9",
            ]),
            Ok(vec![
                (
                    StoreId::namespaced("team-a", "shared"),
                    "127.0.0.1:16742".into()
                ),
                (StoreId::cluster("big"), "localhost:9".into()),
            ])
        );
        for wrong in [
            "PetStore/shared=127.0.0.1:1",
            "ClusterPetStore/big",
            "ClusterPetStore/big=",
            "Secret/x/y=127.0.0.1:1",
        ] {
            let error = parsed(&["import", "--store-address", wrong]).unwrap_err();
            assert!(
                error.contains(
                    "is not PetStore/<namespace>/<name>=ADDR or ClusterPetStore/<name>=ADDR"
                ),
                "{wrong}: {error}"
            );
        }
    }

    /// `--store-ref` as a Pet's `storeRef` reads, on import only: each row
    /// says why, the command line, and the store named or the start of the
    /// error.
    #[test]
    fn the_store_an_import_reads_is_named_as_a_pet_names_it() {
        type Case = (
            &'static str,
            &'static [&'static str],
            Result<Option<&'static str>, &'static str>,
        );
        let cases: [Case; 6] = [
            (
                "a PetStore of the namespace",
                &["import", "-n", "team-a", "--store-ref", "PetStore/x"],
                Ok(Some("PetStore/x")),
            ),
            (
                "a ClusterPetStore",
                &["import", "--store-ref=ClusterPetStore/shared"],
                Ok(Some("ClusterPetStore/shared")),
            ),
            (
                "none: the namespace's default, as the operator picks it",
                &["import", "-n", "team-a"],
                Ok(None),
            ),
            (
                "a kind that is no store",
                &["import", "--store-ref", "Secret/x"],
                Err(
                    "error: invalid value 'Secret/x' for '--store-ref <STORE_REF>': \"Secret/x\" is not PetStore/<name> or ClusterPetStore/<name>",
                ),
            ),
            (
                "no name",
                &["import", "--store-ref", "PetStore/"],
                Err("error: invalid value 'PetStore/' for '--store-ref <STORE_REF>'"),
            ),
            (
                "plan takes each Pet's own storeRef, not a flag",
                &["plan", "-f", "-", "--store-ref", "PetStore/x"],
                Err("error: unexpected argument '--store-ref'"),
            ),
        ];
        for (why, args, expected) in cases {
            let parsed = Cli::try_parse_from(
                std::iter::once("kubectl-petstore").chain(args.iter().copied()),
            );
            match (parsed, expected) {
                (Ok(cli), Ok(named)) => {
                    let Command::Import { store_ref, .. } = cli.command else {
                        panic!("{why}: not an import");
                    };
                    assert_eq!(store_ref.map(|r| r.to_string()).as_deref(), named, "{why}");
                }
                (Err(error), Err(start)) => {
                    let message = error.to_string();
                    assert!(message.starts_with(start), "{why}: {message}");
                }
                (Ok(_), Err(start)) => panic!("{why}: parsed, expected {start:?}"),
                (Err(error), Ok(_)) => panic!("{why}: {error}"),
            }
        }
    }

    /// The names of the Pets read.
    fn names(pets: &[Value]) -> Vec<&str> {
        pets.iter()
            .map(|pet| pet["metadata"]["name"].as_str().unwrap_or_default())
            .collect()
    }

    fn error(text: &str) -> String {
        let error = pets_in("pets.yaml", text).expect_err("not only Pets");
        format!("{error:#}")
    }

    #[test]
    fn one_pet() {
        let pets = pets_in("pets.yaml", REX).expect("a Pet");
        assert_eq!(names(&pets), ["rex"]);
        assert_eq!(pets[0]["spec"]["birthday"], "2022-03-01");
    }

    #[test]
    fn several_documents() {
        let text = format!("{REX}---\n{}", REX.replace("rex", "fido"));
        assert_eq!(
            names(&pets_in("pets.yaml", &text).expect("two Pets")),
            ["rex", "fido"]
        );
        // JSON objects one after another, as kubectl reads them.
        let json = r#"{"apiVersion": "petstore.example.com/v1", "kind": "Pet", "metadata": {"name": "rex"}}
            {"apiVersion": "petstore.example.com/v1", "kind": "Pet", "metadata": {"name": "fido"}}"#;
        assert_eq!(
            names(&pets_in("pets.json", json).expect("two Pets")),
            ["rex", "fido"]
        );
    }

    /// `kubectl get pets -o yaml`, shortened: the API server's fields go,
    /// the rest is applied as it is.
    #[test]
    fn a_list_as_kubectl_get_prints_it() {
        let text = "apiVersion: v1
kind: List
metadata: {resourceVersion: \"\"}
items:
- apiVersion: petstore.example.com/v1
  kind: Pet
  metadata:
    name: rex
    namespace: default
    uid: 0b9b3c5e-1f0e-4a57-9d7b-3f2f2f5c8c11
    resourceVersion: \"4711\"
    generation: 2
    managedFields:
    - {manager: kubectl-client-side-apply, operation: Update}
  spec: {name: Rex, type: dog, birthday: \"2022-03-01\"}
  status: {id: \"42\"}
- apiVersion: petstore.example.com/v1
  kind: Pet
  metadata: {name: fido, namespace: default}
  spec: {name: Fido, type: dog, birthday: \"2023-01-01\"}
";
        let pets = pets_in("pets.yaml", text).expect("a List of Pets");
        assert_eq!(names(&pets), ["rex", "fido"]);
        let rex = &pets[0]["metadata"];
        assert!(rex.get("managedFields").is_none(), "{rex}");
        assert!(rex.get("resourceVersion").is_none(), "{rex}");
        assert_eq!(rex["uid"], "0b9b3c5e-1f0e-4a57-9d7b-3f2f2f5c8c11");
        assert_eq!(pets[0]["spec"]["name"], "Rex");

        // The same as `-o json` prints it.
        let json =
            serde_json::to_string_pretty(&serde_norway::from_str::<Value>(text).expect("YAML"))
                .expect("JSON");
        assert_eq!(pets_in("pets.json", &json).expect("a List"), pets);
    }

    /// A PetList, as the API serves a list: its items need not repeat
    /// their kind.
    #[test]
    fn a_pet_list() {
        let text = "apiVersion: petstore.example.com/v1
kind: PetList
items:
- metadata: {name: rex}
  spec: {name: Rex, type: dog, birthday: \"2022-03-01\"}
- apiVersion: petstore.example.com/v1
  kind: Pet
  metadata: {name: fido}
";
        let pets = pets_in("pets.yaml", text).expect("a PetList");
        assert_eq!(names(&pets), ["rex", "fido"]);
        assert_eq!(pets[0]["kind"], "Pet");
        assert_eq!(pets[0]["apiVersion"], "petstore.example.com/v1");
    }

    #[test]
    fn a_list_holding_something_else_names_it() {
        let text = format!(
            "{REX}---
apiVersion: v1
kind: List
items:
- {}
- {{apiVersion: v1, kind: ConfigMap, metadata: {{name: settings}}}}
",
            serde_json::to_string(&serde_norway::from_str::<Value>(REX).expect("YAML"))
                .expect("JSON")
        );
        let message = error(&text);
        assert_eq!(
            message,
            "pets.yaml: document 2, item 2 is a ConfigMap of v1, not a Pet of petstore.example.com"
        );
    }

    #[test]
    fn anything_but_a_pet_is_named_without_debug_formatting() {
        for (text, expected) in [
            (
                "apiVersion: v1\nkind: Service\n",
                "pets.yaml: document 1 is a Service of v1, not a Pet of petstore.example.com",
            ),
            (
                "apiVersion: example.com/v1\nkind: Pet\n",
                "pets.yaml: document 1 is a Pet of example.com/v1, not a Pet of petstore.example.com",
            ),
            (
                "kind: Pet\n",
                "pets.yaml: document 1 is a Pet without an apiVersion, not a Pet of petstore.example.com",
            ),
            (
                "metadata: {name: rex}\n",
                "pets.yaml: document 1 has no kind, so is not a Pet",
            ),
            (
                "just text\n",
                "pets.yaml: document 1 is not an object, so is not a Pet",
            ),
        ] {
            assert_eq!(error(text), expected);
        }
        assert!(
            error("kind: [Pet\n").starts_with("pets.yaml: document 1 is not YAML: "),
            "{}",
            error("kind: [Pet\n")
        );
        assert!(
            error("{\"kind\": ").starts_with("pets.yaml: document 1 is not JSON: "),
            "{}",
            error("{\"kind\": ")
        );
    }

    /// Empty documents (a leading or trailing `---`, an empty file) are
    /// skipped, but still counted in the document numbers.
    #[test]
    fn empty_documents() {
        for empty in ["", "\n", "---\n", "---\n---\n", "# nothing\n"] {
            assert_eq!(
                pets_in("pets.yaml", empty).expect("empty").len(),
                0,
                "{empty:?}"
            );
        }
        let text = format!("---\n{REX}---\n---\n");
        assert_eq!(
            names(&pets_in("pets.yaml", &text).expect("one Pet")),
            ["rex"]
        );
        let text = format!("---\n{REX}---\n---\napiVersion: v1\nkind: Secret\n");
        assert!(
            error(&text).starts_with("pets.yaml: document 3 is a Secret"),
            "{}",
            error(&text)
        );
    }
}
