//! The spread (#49): one operator, N Pets over many namespaces on three
//! stores, against the same N Pets in one namespace on one store, and
//! operator ÷ floor side by side in the spread layout.
//!
//! Every store runs with tenancy (durable, `--tenancy`, the operator as its
//! observer; plaintext on loopback with `--allow-plaintext-tokens`, as the
//! fixtures start it), and the operator runs with its shipped settings and
//! `--petstore-audience`, so each namespace writes with its own
//! `petstore-tenant` token. The stores are reached as a platform team sets
//! them up (see [`Way`]); the single run differs from the spread only in
//! its layout ([`Layout::single`]).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use petstore_operator::crd::stores::{StoreKind, StoreRef};
use petstore_operator::crd::{FINALIZER, Pet};
use serde_json::json;

use crate::apimetrics::{self, RequestCounts};
use crate::convergence::{
    CpuSplit, FloorIdentity, Shows, Tracker, conversion_calls, events_drained, floor_ready_status,
    for_each_pet, hold_lease, kube_error, pet, prepare, quiet, shipped_options, spawn_baseline,
    start_leader, store_calls, warmed_up, writes_since,
};
use crate::report::mib;
use crate::side_by_side::{self, SideBySide, SideResult, Sides};
use crate::{BenchConfig, procstat};
use fixtures::{Env, PetStoreServer, Result, Storage, TenancyFlags};

/// Where the section of the report starts; runs that do not measure it
/// keep it as it is.
pub const SECTION: &str = "\n## Spread";

/// The namespaces and stores.
pub const NAMESPACES: usize = 200;
pub const STORES: usize = 3;

/// The goals: the spread's peak RSS within this of the single
/// run's, and operator ÷ floor within it in every pair.
pub const GOAL_RSS_RATIO: f64 = 1.10;
pub const GOAL_RATIO: f64 = crate::report::GOAL_RATIO;

/// The label every measured Pet carries: the watches and the floor see
/// only these, not the warm-up's.
const RUN_LABEL: &str = "bench.petstore.example.com/run";
/// The label by which `ClusterPetStore/shared-<store>` admits namespaces.
const STORE_LABEL: &str = "bench.petstore.example.com/store";
/// The operator's own store's audience (`--petstore-audience`); it keeps
/// only the warm-up's Pets.
const OWN_AUDIENCE: &str = "petstore";
/// The tenant ServiceAccount every namespace has.
const TENANT: &str = "petstore-tenant";
/// What the operator's tokens last (`operator/src/stores/tokens.rs`).
const TOKEN_SECONDS: i64 = 600;

/// How a namespace's Pets reach their store, as a platform team sets it
/// up: each of the three ways the model gives (docs/tenancy.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Way {
    /// The namespace's `PetStore/default`: Pets without `storeRef`.
    NamespaceDefault,
    /// `ClusterPetStore/shared-<store>`, admitting its namespaces by a
    /// label selector; Pets name it in `storeRef`.
    Cluster,
    /// The namespace's `PetStore/team`; Pets name it in `storeRef`.
    Named,
}

/// Which namespace each Pet is in and which store each namespace uses:
/// Pet `i` in namespace `i mod namespaces`, namespace `j` on store
/// `j mod stores`, so both are as even as whole numbers allow, and
/// consecutive creates go to different namespaces and stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub namespaces: usize,
    pub stores: usize,
}

impl Layout {
    /// The spread: `namespaces` namespaces on [`STORES`] stores.
    pub fn spread(namespaces: usize) -> Self {
        Self {
            namespaces: namespaces.max(1),
            stores: STORES,
        }
    }

    /// One namespace on one store, reached through its `PetStore/default`.
    pub fn single() -> Self {
        Self {
            namespaces: 1,
            stores: 1,
        }
    }

    pub fn namespace(&self, j: usize) -> String {
        format!("spread-{j:03}")
    }

    /// The index of a namespace this layout names.
    pub fn namespace_index(&self, name: &str) -> Option<usize> {
        let j: usize = name.strip_prefix("spread-")?.parse().ok()?;
        (j < self.namespaces && self.namespace(j) == name).then_some(j)
    }

    pub fn namespace_of(&self, pet: usize) -> usize {
        pet % self.namespaces
    }

    pub fn store_of(&self, namespace: usize) -> usize {
        namespace % self.stores
    }

    pub fn way(store: usize) -> Way {
        match store % 3 {
            0 => Way::NamespaceDefault,
            1 => Way::Cluster,
            _ => Way::Named,
        }
    }

    pub fn audience(store: usize) -> String {
        format!("store-{store}")
    }

    /// The `storeRef` of the Pets of a namespace.
    pub fn store_ref(&self, namespace: usize) -> Option<StoreRef> {
        let store = self.store_of(namespace);
        match Self::way(store) {
            Way::NamespaceDefault => None,
            Way::Cluster => Some(StoreRef {
                kind: StoreKind::ClusterPetStore,
                name: format!("shared-{store}"),
            }),
            Way::Named => Some(StoreRef {
                kind: StoreKind::PetStore,
                name: "team".into(),
            }),
        }
    }

    /// What the operator writes to `status.store` for a Pet of a namespace.
    pub fn status_store(&self, namespace: usize) -> String {
        match self.store_ref(namespace) {
            None => "PetStore/default".into(),
            Some(StoreRef { kind, name }) => format!("{}/{name}", kind.as_str()),
        }
    }

    /// Pets in each namespace, of `pets`.
    pub fn pets_per_namespace(&self, pets: usize) -> Vec<usize> {
        let mut counts = vec![0; self.namespaces];
        for i in 0..pets {
            counts[self.namespace_of(i)] += 1;
        }
        counts
    }

    /// Pets on each store, of `pets`.
    pub fn pets_per_store(&self, pets: usize) -> Vec<usize> {
        let mut counts = vec![0; self.stores];
        for (j, n) in self.pets_per_namespace(pets).into_iter().enumerate() {
            counts[self.store_of(j)] += n;
        }
        counts
    }

    /// Pet `i` of the run, and its namespace.
    pub fn pet(&self, i: usize) -> (String, Pet) {
        let j = self.namespace_of(i);
        let mut pet = pet(i);
        pet.spec.store_ref = self.store_ref(j);
        pet.metadata.labels = Some(BTreeMap::from([(RUN_LABEL.into(), "spread".into())]));
        (self.namespace(j), pet)
    }

    /// The namespaces with their `petstore-tenant`, and the store objects
    /// that reach `addrs` (one per store); the warm-up's namespace gets its
    /// ServiceAccount too, as it writes to the operator's own store.
    pub fn setup_yaml(&self, addrs: &[String]) -> String {
        let mut yaml = String::new();
        let account = |yaml: &mut String, ns: &str| {
            let _ = write!(
                yaml,
                "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: {TENANT}, namespace: {ns}}}\n---\n"
            );
        };
        let _ = write!(
            yaml,
            "apiVersion: v1\nkind: Namespace\nmetadata: {{name: warmup}}\n---\n"
        );
        account(&mut yaml, "warmup");
        for j in 0..self.namespaces {
            let ns = self.namespace(j);
            let store = self.store_of(j);
            let (addr, audience) = (&addrs[store], Self::audience(store));
            let _ = write!(
                yaml,
                "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {ns}, labels: {{{STORE_LABEL}: {audience}}}}}\n---\n"
            );
            account(&mut yaml, &ns);
            let name = match Self::way(store) {
                Way::NamespaceDefault => "default",
                Way::Named => "team",
                Way::Cluster => continue,
            };
            let _ = write!(
                yaml,
                "apiVersion: petstore.example.com/v1\nkind: PetStore\nmetadata: {{name: {name}, namespace: {ns}}}\n\
                 spec: {{address: \"http://{addr}\", audience: {audience}}}\n---\n"
            );
        }
        for (store, addr) in addrs.iter().enumerate().take(self.stores) {
            if Self::way(store) != Way::Cluster {
                continue;
            }
            let audience = Self::audience(store);
            let _ = write!(
                yaml,
                "apiVersion: petstore.example.com/v1\nkind: ClusterPetStore\nmetadata: {{name: shared-{store}}}\n\
                 spec: {{address: \"http://{addr}\", audience: {audience}, allowedNamespaces: {{selector: {{matchLabels: {{{STORE_LABEL}: {audience}}}}}}}}}\n---\n"
            );
        }
        yaml
    }

    /// The arguments that make a side of a pair run this layout.
    fn side_args(&self) -> Vec<String> {
        vec!["--spread-namespaces".into(), self.namespaces.to_string()]
    }
}

#[derive(Clone, Debug)]
pub struct SpreadConfig {
    pub pets: usize,
    pub namespaces: usize,
    /// Its pairs, concurrency, floor identity and side runner.
    pub bench: BenchConfig,
}

/// What one run (spread or single) measured.
#[derive(Clone, Debug, Default)]
pub struct Figures {
    pub pets: usize,
    pub namespaces: usize,
    pub stores: usize,
    /// From the first create until a watch saw every Pet Ready.
    pub converge: Duration,
    pub operator_peak_rss_kib: u64,
    /// The operator's store calls while converging, by method.
    pub store_calls: BTreeMap<String, u64>,
    /// Writes to Pets and Events, less the creates, once the Events are
    /// written.
    pub api_writes: u64,
    /// TokenRequests while converging: tenants', observer's.
    pub token_requests: (u64, u64),
    /// The Pets on each store, as their `status.store` says.
    pub pets_per_store: Vec<usize>,
    pub apiserver_peak_rss_kib: u64,
    pub etcd_peak_rss_kib: u64,
    /// The stores the Pets use, summed.
    pub stores_peak_rss_kib: u64,
    /// Connections the stores closed at once, over one client's bound
    /// (`petstore_server_connections_refused_total`, summed): the
    /// operator's own, since nothing else calls them.
    pub connections_refused: u64,
}

impl Figures {
    pub fn writes_per_pet(&self) -> f64 {
        self.api_writes as f64 / self.pets.max(1) as f64
    }

    pub fn calls_per_pet(&self) -> f64 {
        self.store_calls.values().sum::<u64>() as f64 / self.pets.max(1) as f64
    }
}

#[derive(Clone, Debug, Default)]
pub struct SpreadResult {
    pub spread: Figures,
    pub single: Figures,
    /// Floor (first) and operator (second), side by side, spread layout.
    pub pairs: Vec<SideBySide>,
    /// Load averages at the end.
    pub load: String,
    pub stamp: crate::report::Stamp,
}

impl SpreadResult {
    /// The spread's peak RSS ÷ the single run's.
    pub fn rss_ratio(&self) -> f64 {
        self.spread.operator_peak_rss_kib as f64
            / (self.single.operator_peak_rss_kib as f64).max(1.0)
    }

    pub fn worst_pair(&self) -> f64 {
        self.pairs.iter().map(SideBySide::ratio).fold(0.0, f64::max)
    }

    pub fn rss_met(&self) -> bool {
        self.single.operator_peak_rss_kib > 0 && self.rss_ratio() <= GOAL_RSS_RATIO
    }

    /// Every pair within the goal, not only their median.
    pub fn pairs_met(&self) -> bool {
        !self.pairs.is_empty() && self.worst_pair() <= GOAL_RATIO
    }

    pub fn goal_met(&self) -> bool {
        self.rss_met() && self.pairs_met() && self.no_connection_refused()
    }

    /// The operator kept within each store's bound on one client's
    /// connections, however many store objects name the store.
    pub fn no_connection_refused(&self) -> bool {
        self.spread.connections_refused == 0 && self.single.connections_refused == 0
    }
}

/// A minute, plus 200 ms a Pet, as the convergence's waits.
fn timeout(pets: usize) -> Duration {
    Duration::from_secs(60 + pets as u64 / 5)
}

/// The spread, then the single run, then the pairs.
pub fn measure(config: &SpreadConfig, progress: &dyn Fn(&str)) -> Result<SpreadResult> {
    let rt = crate::runtime()?;
    let stamp = crate::report::Stamp::now();
    let (pets, concurrency) = (config.pets, config.bench.concurrency);
    let spread_layout = Layout::spread(config.namespaces);
    progress(&format!(
        "spread: {pets} Pets over {} namespaces on {} stores",
        spread_layout.namespaces, spread_layout.stores
    ));
    let spread = run_operator(&rt, spread_layout, pets, concurrency, true, &|| {})?.1;
    progress(&format!(
        "spread: converged in {:.1} s, operator peak RSS {:.1} MiB; now {pets} Pets in one namespace on one store",
        spread.converge.as_secs_f64(),
        spread.operator_peak_rss_kib as f64 / 1024.0
    ));
    let single = run_operator(&rt, Layout::single(), pets, concurrency, true, &|| {})?.1;
    progress(&format!(
        "single: converged in {:.1} s, operator peak RSS {:.1} MiB; now the pairs",
        single.converge.as_secs_f64(),
        single.operator_peak_rss_kib as f64 / 1024.0
    ));
    let pairs = side_by_side::pairs_at_with(
        &config.bench,
        pets,
        Sides::FloorOperator,
        &spread_layout.side_args(),
        progress,
    )?;
    Ok(SpreadResult {
        spread,
        single,
        pairs,
        load: crate::report::load_average(),
        stamp,
    })
}

/// One side of a pair in `layout`, for `petstore-bench --side`.
pub fn run_side(config: &BenchConfig, side: side_by_side::Side, namespaces: usize) -> Result<()> {
    let pets = *config
        .sizes
        .first()
        .ok_or_else(|| kube_error("a side of the spread needs one size (--sizes)"))?;
    let rt = crate::runtime()?;
    let layout = Layout::spread(namespaces);
    side_by_side::serve_side(|gate| match side {
        side_by_side::Side::Floor => run_floor(
            &rt,
            layout,
            pets,
            config.concurrency,
            config.floor_identity,
            false,
            gate,
        )
        .map(|(side, _)| side),
        side_by_side::Side::Operator => {
            run_operator(&rt, layout, pets, config.concurrency, false, gate).map(|(side, _)| side)
        }
    })
}

/// A control plane, the operator's own store and `layout.stores` stores,
/// all with tenancy, and the layout's namespaces and store objects.
struct Setup {
    env: Env,
    stores: Vec<PetStoreServer>,
    layout: Layout,
}

impl Setup {
    fn start(layout: Layout) -> Result<Self> {
        let mut env = Env::start(Storage::Durable)?;
        let issuer = env.cp.token_issuer_flag()?;
        env.store.set_restart_args(
            TenancyFlags::new(&issuer, OWN_AUDIENCE)
                .operator_observer()
                .os_args(),
        );
        env.store.restart(Storage::Durable)?;
        let stores = (0..layout.stores)
            .map(|store| {
                PetStoreServer::start_in(
                    &env.cp.dir().join(Layout::audience(store)),
                    Storage::Durable,
                    &TenancyFlags::new(&issuer, &Layout::audience(store))
                        .operator_observer()
                        .args(),
                )
            })
            .collect::<Result<Vec<_>>>()?;
        let addrs: Vec<String> = stores.iter().map(|s| s.addr.clone()).collect();
        env.cp.apply(&layout.setup_yaml(&addrs))?;
        Ok(Self {
            env,
            stores,
            layout,
        })
    }

    /// The operator as it ships, with tenancy on its own store too.
    fn operator_options(&self, identity: &str) -> fixtures::OperatorOptions {
        let mut options = shipped_options(&self.env, identity);
        options
            .extra_args
            .extend(["--petstore-audience".into(), OWN_AUDIENCE.into()]);
        options
    }

    /// Creates the layout's `pets` Pets and waits until `tracker` has seen
    /// every one Ready, metering `measured` (the operator, or the floor's
    /// webhook replica) with the rest: the operator's run and the floor's
    /// time the same span the same way.
    async fn create_all_timed(
        &self,
        measured: Option<u32>,
        client: &kube::Client,
        tracker: &mut Tracker,
        pets: usize,
        concurrency: usize,
        what: &str,
    ) -> Result<TimedCreate> {
        let conversions_before = conversion_calls(&self.env.cp)?;
        let meter = CpuSplit::meter(
            &self.env,
            measured,
            self.stores.iter().map(|s| s.process().pid()),
        );
        let started = Instant::now();
        create(client, self.layout, pets, concurrency).await?;
        tracker
            .all(Shows::Ready, pets, 1, timeout(pets), what)
            .await?;
        Ok(TimedCreate {
            time: started.elapsed(),
            meter,
            conversions_before,
        })
    }
}

/// A timed creation whose CPU and conversion calls are read when the side
/// is done with it (the floor stops its baseline client first).
struct TimedCreate {
    time: Duration,
    meter: procstat::CpuMeter,
    conversions_before: u64,
}

impl TimedCreate {
    /// The side's figures: the span's time, and CPU and conversion calls
    /// from its start until now.
    fn side(&self, cp: &fixtures::ControlPlane) -> Result<SideResult> {
        Ok(SideResult {
            time: self.time,
            cpu: CpuSplit::read(&self.meter),
            conversions: conversion_calls(cp)?.saturating_sub(self.conversions_before),
        })
    }
}

fn run_pets() -> watcher::Config {
    watcher::Config::default().labels(&format!("{RUN_LABEL}=spread"))
}

/// Creates the layout's `pets` Pets, `concurrency` at a time, in order, so
/// that consecutive creates go to different namespaces.
async fn create(
    client: &kube::Client,
    layout: Layout,
    pets: usize,
    concurrency: usize,
) -> Result<()> {
    for_each_pet(pets, concurrency, |i| {
        let (ns, pet) = layout.pet(i);
        let api: Api<Pet> = Api::namespaced(client.clone(), &ns);
        async move { api.create(&PostParams::default(), &pet).await.map(drop) }
    })
    .await
    .map(drop)
}

/// The operator's convergence in `layout`: what a side of a pair reports,
/// and with `everything` the run's other figures, once its Events are
/// written.
fn run_operator(
    rt: &tokio::runtime::Runtime,
    layout: Layout,
    pets: usize,
    concurrency: usize,
    everything: bool,
    gate: &dyn Fn(),
) -> Result<(SideResult, Figures)> {
    let setup = Setup::start(layout)?;
    let env = &setup.env;
    let mut operator = start_leader(env, &setup.operator_options("bench-operator"))?;
    let pid = operator.process().pid();
    let timeout = timeout(pets);
    rt.block_on(async {
        let client = warmed_up(env, timeout).await?;
        events_drained(&operator, timeout).await?;
        let mut tracker = Tracker::start_with(Api::all(client.clone()), run_pets());
        quiet(env, pid).await;
        tokio::task::block_in_place(gate);
        let (api_before, metrics_before) = if everything {
            (apimetrics::scrape(&env.cp)?, operator.metrics()?)
        } else {
            Default::default()
        };
        let side = setup
            .create_all_timed(
                pid,
                &client,
                &mut tracker,
                pets,
                concurrency,
                "every Pet Ready",
            )
            .await?
            .side(&env.cp)?;
        let converge = side.time;
        let peak = |pid: Option<u32>| pid.and_then(procstat::peak_rss_kib).unwrap_or(0);
        let operator_peak_rss_kib = peak(pid);
        if !everything {
            return Ok((side, Figures::default()));
        }
        let metrics_after = operator.metrics()?;
        let (tenants_before, observer_before, _) = crate::token_cost::tokens(&metrics_before);
        let (tenants_after, observer_after, _) = crate::token_cost::tokens(&metrics_after);
        let store_calls =
            apimetrics::increase(&store_calls(&metrics_before), &store_calls(&metrics_after));
        // The Events trail Ready in their queue; they are the run's too.
        events_drained(&operator, timeout).await?;
        let api_writes = writes_since(&env.cp, &api_before)?.saturating_sub(pets as u64);
        let pets_per_store = pets_per_store(&client, layout).await?;
        Ok((
            side,
            Figures {
                pets,
                namespaces: layout.namespaces,
                stores: layout.stores,
                converge,
                operator_peak_rss_kib,
                store_calls,
                api_writes,
                token_requests: (
                    tenants_after.saturating_sub(tenants_before),
                    observer_after.saturating_sub(observer_before),
                ),
                pets_per_store,
                apiserver_peak_rss_kib: peak(env.cp.apiserver_pid()),
                etcd_peak_rss_kib: peak(env.cp.etcd_pid()),
                stores_peak_rss_kib: setup.stores.iter().map(|s| peak(s.process().pid())).sum(),
                connections_refused: setup
                    .stores
                    .iter()
                    .map(|store| {
                        fixtures::http::scrape(&store.metrics_addr).map(|text| {
                            crate::convergence::metric_sum(
                                &text,
                                "petstore_server_connections_refused_total",
                            ) as u64
                        })
                    })
                    .sum::<Result<u64>>()?,
            },
        ))
    })
}

/// The Pets on each store, as their `status.store` says; an error if any
/// Pet is not on the store its namespace's layout names, so that a run
/// whose Pets went elsewhere (the operator's own store, say) is not
/// reported as spread.
async fn pets_per_store(client: &kube::Client, layout: Layout) -> Result<Vec<usize>> {
    let api: Api<Pet> = Api::all(client.clone());
    let mut counts = vec![0; layout.stores];
    let mut params = ListParams::default()
        .labels(&format!("{RUN_LABEL}=spread"))
        .limit(2000);
    loop {
        let page = api.list(&params).await.map_err(kube_error)?;
        for pet in &page.items {
            let ns = pet.metadata.namespace.as_deref().unwrap_or_default();
            let shown = pet.status.as_ref().and_then(|s| s.store.as_deref());
            let Some(j) = layout.namespace_index(ns) else {
                return Err(kube_error(format!("a Pet in namespace {ns:?}")));
            };
            if shown != Some(layout.status_store(j).as_str()) {
                return Err(kube_error(format!(
                    "Pet {ns}/{} is on {shown:?}, not {}",
                    pet.metadata.name.as_deref().unwrap_or_default(),
                    layout.status_store(j)
                )));
            }
            counts[layout.store_of(j)] += 1;
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(counts),
        }
    }
}

/// The floor in `layout`: the same set-up and creates, and a baseline client
/// that makes, per Pet, only the writes the operator must make for a Pet on
/// a store object, with no store: the `status.store` pin (the store is named
/// before a record is made there, docs/tenancy.md), the finalizer and the
/// Ready status; and, before the first Pet of each namespace is Ready, that
/// namespace's TokenRequest for its store's audience, which any operator
/// writing as the tenant needs and the operator makes once per namespace
/// and store while converging. What the floor leaves out is the operator's
/// own work: the store calls, the Events, the observer's tokens and the
/// change feeds. As in the convergence's floor, an operator replica that
/// reconciles nothing serves the conversion webhook, and the baseline runs
/// at the operator's default concurrency as its ServiceAccount.
fn run_floor(
    rt: &tokio::runtime::Runtime,
    layout: Layout,
    pets: usize,
    concurrency: usize,
    identity: FloorIdentity,
    count: bool,
    gate: &dyn Fn(),
) -> Result<(SideResult, RequestCounts)> {
    let setup = Setup::start(layout)?;
    let env = &setup.env;
    hold_lease(&env.cp)?;
    let mut webhook = env.start_operator_with(&setup.operator_options("bench-floor-webhook"))?;
    let webhook_pid = webhook.process().pid();
    rt.block_on(async {
        let client = prepare(env).await?;
        let mut tracker = Tracker::start_with(Api::all(client.clone()), run_pets());
        let baseline_client = identity.client(env, &client).await?;
        let baseline = spawn_floor_baseline(baseline_client, layout);
        quiet(env, webhook_pid).await;
        tokio::task::block_in_place(gate);
        let api_before = if count {
            apimetrics::scrape(&env.cp)?
        } else {
            RequestCounts::default()
        };
        let timed = setup
            .create_all_timed(
                webhook_pid,
                &client,
                &mut tracker,
                pets,
                concurrency,
                "the floor: every Pet Ready",
            )
            .await?;
        baseline.abort();
        let side = timed.side(&env.cp)?;
        let requests = if count {
            apimetrics::diff(
                &api_before,
                &apimetrics::scrape(&env.cp)?,
                &["pets", "serviceaccounts"],
            )
        } else {
            RequestCounts::default()
        };
        Ok((side, requests))
    })
}

/// The floor alone in the spread layout, as the operator's ServiceAccount,
/// with the requests to Pets and ServiceAccounts made while it converged
/// (the benchmark's creates included): what its writes are checked by.
pub fn measure_floor(
    pets: usize,
    namespaces: usize,
    concurrency: usize,
) -> Result<(SideResult, RequestCounts)> {
    let rt = crate::runtime()?;
    let layout = Layout::spread(namespaces);
    run_floor(
        &rt,
        layout,
        pets,
        concurrency,
        FloorIdentity::Operator,
        true,
        &|| {},
    )
}

/// Each namespace's TokenRequest, made once; the Pets of a namespace wait
/// for it, as the operator's first store call in a namespace does.
type Minted = Arc<Mutex<HashMap<String, Arc<tokio::sync::OnceCell<()>>>>>;

fn spawn_floor_baseline(client: kube::Client, layout: Layout) -> tokio::task::JoinHandle<()> {
    let minted: Minted = Arc::default();
    spawn_baseline(
        Api::all(client.clone()),
        // A new Pet of the run: neither pinned nor with the finalizer yet
        // (the pin's own echo is not picked again).
        |pet: Pet| {
            let ours = pet
                .metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key(RUN_LABEL));
            let pinned = pet.status.as_ref().is_some_and(|s| s.store.is_some());
            (ours && !pinned && pet.metadata.finalizers.is_none()).then_some(pet)
        },
        move |_, pet| {
            let client = client.clone();
            let minted = Arc::clone(&minted);
            async move { floor_writes(client, layout, minted, pet).await }
        },
    )
}

async fn floor_writes(
    client: kube::Client,
    layout: Layout,
    minted: Minted,
    pet: Pet,
) -> Result<()> {
    let ns = pet.metadata.namespace.clone().unwrap_or_default();
    let name = pet.metadata.name.clone().unwrap_or_default();
    let j = layout
        .namespace_index(&ns)
        .ok_or_else(|| kube_error(format!("a Pet in namespace {ns:?}")))?;
    let store = layout.status_store(j);
    let api: Api<Pet> = Api::namespaced(client.clone(), &ns);
    let pin = json!({"status": {"store": store}});
    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&pin))
        .await
        .map_err(kube_error)?;
    let finalizer = json!({"metadata": {"finalizers": [FINALIZER]}});
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&finalizer))
        .await
        .map_err(kube_error)?;
    let cell = {
        let mut minted = minted
            .lock()
            .map_err(|_| kube_error("the floor's tokens: a writer panicked"))?;
        Arc::clone(minted.entry(ns.clone()).or_default())
    };
    cell.get_or_try_init(|| mint(&client, &ns, Layout::audience(layout.store_of(j))))
        .await?;
    // The pin stays in the status the floor writes last, as the operator's.
    let mut status = floor_ready_status(&name, pet.metadata.generation);
    status["status"]["store"] = json!(store);
    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .map(drop)
        .map_err(kube_error)
}

/// A TokenRequest for the namespace's `petstore-tenant`, as the operator
/// makes it.
async fn mint(client: &kube::Client, ns: &str, audience: String) -> Result<()> {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![audience],
            expiration_seconds: Some(TOKEN_SECONDS),
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    accounts
        .create_token_request(TENANT, &PostParams::default(), &request)
        .await
        .map(drop)
        .map_err(kube_error)
}

fn calls(figures: &Figures) -> String {
    figures
        .store_calls
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(method, n)| format!("{method} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// "100", or "10 or 11" when the Pets do not divide evenly.
fn per_namespace(pets: usize, namespaces: usize) -> String {
    let namespaces = namespaces.max(1);
    let (fewer, more) = (pets / namespaces, pets.div_ceil(namespaces));
    if fewer == more {
        fewer.to_string()
    } else {
        format!("{fewer} or {more}")
    }
}

pub fn markdown(result: &SpreadResult, command: &str) -> String {
    let (spread, single) = (&result.spread, &result.single);
    let mut out = crate::report::measured_section(
        SECTION,
        command,
        &result.stamp,
        &format!(
            "One operator with its shipped settings and `--petstore-audience`; every store durable with `--tenancy` and the operator as its observer. **Spread**: {} Pets over {} namespaces ({} each, created in turn at concurrency 16), each namespace with its `petstore-tenant` ServiceAccount, on {} stores reached as a platform team sets them up, a store per namespace in turn: each namespace's `PetStore/default` (Pets without `storeRef`), a `ClusterPetStore` admitting its namespaces by a label selector (named in `storeRef`), and each namespace's `PetStore/team` (named in `storeRef`). **Single**: the same {} Pets in one namespace on one store, through its `PetStore/default`, otherwise the same. Each is timed from the first create until a watch saw every Pet Ready; the counts are the operator's own and the API server's over that span (writes once the Events are written). Operator ÷ floor: pairs side by side as in *Operator convergence*, in the spread layout; the floor writes per Pet the `status.store` pin, the finalizer and the status, and one TokenRequest per namespace (`benches/src/spread.rs` says why). Load averages at the end: {}.",
            spread.pets,
            spread.namespaces,
            per_namespace(spread.pets, spread.namespaces),
            spread.stores,
            single.pets,
            result.load,
        ),
    );
    let _ = writeln!(
        out,
        "| operator peak RSS, spread ÷ single | ≤ {GOAL_RSS_RATIO:.2} | {:.2} ({:.1} MiB against {:.1} MiB) | {} |",
        result.rss_ratio(),
        mib(spread.operator_peak_rss_kib),
        mib(single.operator_peak_rss_kib),
        crate::report::verdict(result.rss_met()),
    );
    let ratios: Vec<f64> = result.pairs.iter().map(SideBySide::ratio).collect();
    let _ = writeln!(
        out,
        "| operator ÷ floor in the spread layout, every pair side by side | ≤ {GOAL_RATIO:.2} | {:.2} at worst (median {:.2}; each: {}) | {} |",
        result.worst_pair(),
        crate::convergence::median(ratios.clone()),
        ratios
            .iter()
            .map(|r| format!("{r:.2}"))
            .collect::<Vec<_>>()
            .join(", "),
        crate::report::verdict(result.pairs_met()),
    );
    let _ = writeln!(
        out,
        "| connections the stores refused the operator (one client's bound, 64 each) | 0 | {} / {} (spread / single) | {} |",
        spread.connections_refused,
        single.connections_refused,
        crate::report::verdict(result.no_connection_refused()),
    );
    let both =
        |what: &str, a: String, b: String| format!("| {what}, spread / single | | {a} / {b} | |");
    for row in [
        both(
            "time to converge",
            format!("{:.1} s", spread.converge.as_secs_f64()),
            format!("{:.1} s", single.converge.as_secs_f64()),
        ),
        both(
            "API writes per Pet (Pets and Events)",
            format!("{:.3}", spread.writes_per_pet()),
            format!("{:.3}", single.writes_per_pet()),
        ),
        both(
            "store calls per Pet",
            format!("{:.3} ({})", spread.calls_per_pet(), calls(spread)),
            format!("{:.3} ({})", single.calls_per_pet(), calls(single)),
        ),
        both(
            "TokenRequests while converging, tenants' + observer's",
            format!("{} + {}", spread.token_requests.0, spread.token_requests.1),
            format!("{} + {}", single.token_requests.0, single.token_requests.1),
        ),
        both(
            "the API server's peak RSS",
            format!("{:.0} MiB", mib(spread.apiserver_peak_rss_kib)),
            format!("{:.0} MiB", mib(single.apiserver_peak_rss_kib)),
        ),
        both(
            "etcd's peak RSS",
            format!("{:.0} MiB", mib(spread.etcd_peak_rss_kib)),
            format!("{:.0} MiB", mib(single.etcd_peak_rss_kib)),
        ),
        both(
            "peak RSS of the stores used, summed",
            format!("{:.1} MiB", mib(spread.stores_peak_rss_kib)),
            format!("{:.1} MiB", mib(single.stores_peak_rss_kib)),
        ),
    ] {
        let _ = writeln!(out, "{row}");
    }
    let _ = writeln!(
        out,
        "| the spread's Pets on each store, by their `status.store` | | {} | |",
        spread
            .pets_per_store
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pets_spread_evenly_over_the_namespaces_and_the_stores() {
        let layout = Layout::spread(NAMESPACES);
        let per_namespace = layout.pets_per_namespace(20_000);
        assert_eq!(per_namespace, vec![100; NAMESPACES]);
        // 200 namespaces on 3 stores: 67, 67 and 66 of them.
        assert_eq!(layout.pets_per_store(20_000), [6700, 6700, 6600]);
        // Not a whole number a namespace: at most one Pet apart.
        let uneven = Layout::spread(20).pets_per_namespace(205);
        assert_eq!(uneven.iter().sum::<usize>(), 205);
        assert_eq!(
            (uneven.iter().min(), uneven.iter().max()),
            (Some(&10), Some(&11))
        );
        assert_eq!(Layout::single().pets_per_store(20_000), [20_000]);
        assert_eq!(Layout::single().pets_per_namespace(7), [7]);
        // Consecutive creates go to different namespaces and stores.
        let (a, b) = (layout.namespace_of(0), layout.namespace_of(1));
        assert_ne!(a, b);
        assert_ne!(layout.store_of(a), layout.store_of(b));
    }

    #[test]
    fn each_store_is_reached_one_of_the_three_ways() {
        let layout = Layout::spread(6);
        let refs: Vec<(usize, Option<StoreRef>, String)> = (0..6)
            .map(|j| {
                (
                    layout.store_of(j),
                    layout.store_ref(j),
                    layout.status_store(j),
                )
            })
            .collect();
        let shared = StoreRef {
            kind: StoreKind::ClusterPetStore,
            name: "shared-1".into(),
        };
        let team = StoreRef {
            kind: StoreKind::PetStore,
            name: "team".into(),
        };
        assert_eq!(
            refs[..3],
            [
                (0, None, "PetStore/default".into()),
                (1, Some(shared), "ClusterPetStore/shared-1".into()),
                (2, Some(team), "PetStore/team".into()),
            ]
        );
        assert_eq!(refs[3..], refs[..3], "namespaces take the stores in turn");
        assert_eq!(Layout::single().status_store(0), "PetStore/default");
        assert_eq!(Layout::single().store_ref(0), None);
        // A Pet carries its namespace's reference and the run's label.
        let (ns, pet) = layout.pet(7);
        assert_eq!(ns, "spread-001");
        assert_eq!(pet.spec.store_ref, layout.store_ref(1));
        assert!(
            pet.metadata
                .labels
                .is_some_and(|l| l[RUN_LABEL] == "spread")
        );
        assert_eq!(layout.namespace_index("spread-005"), Some(5));
        for other in ["spread-006", "spread-5", "warmup", "bench"] {
            assert_eq!(layout.namespace_index(other), None, "{other}");
        }
    }

    #[test]
    fn the_setup_makes_each_namespaces_account_and_the_store_objects_of_its_way() {
        let layout = Layout::spread(4);
        let addrs: Vec<String> = (0..3).map(|s| format!("127.0.0.1:{}", 7000 + s)).collect();
        let yaml = layout.setup_yaml(&addrs);
        let count = |needle: &str| yaml.matches(needle).count();
        // Four namespaces and the warm-up's, each with its ServiceAccount.
        assert_eq!(count("kind: Namespace\n"), 5);
        assert_eq!(count("name: petstore-tenant"), 5);
        // Namespaces 0 and 3 on store 0 by PetStore/default, 2 on store 2
        // by PetStore/team, 1 on store 1 by the ClusterPetStore alone.
        assert_eq!(count("kind: PetStore\n"), 3);
        assert_eq!(count("{name: default, namespace: spread-000}"), 1);
        assert_eq!(count("{name: default, namespace: spread-003}"), 1);
        assert_eq!(count("{name: team, namespace: spread-002}"), 1);
        assert_eq!(count("namespace: spread-001}\nspec"), 0);
        assert!(yaml.contains(
            "kind: ClusterPetStore\nmetadata: {name: shared-1}\nspec: {address: \"http://127.0.0.1:7001\", audience: store-1, allowedNamespaces: {selector: {matchLabels: {bench.petstore.example.com/store: store-1}}}}"
        ), "{yaml}");
        assert!(
            yaml.contains(
                "{name: spread-001, labels: {bench.petstore.example.com/store: store-1}}"
            )
        );
        assert!(yaml.contains("spec: {address: \"http://127.0.0.1:7002\", audience: store-2}"));
        // Every document parses as YAML.
        for doc in yaml.split("---\n").filter(|d| !d.trim().is_empty()) {
            let parsed: serde_json::Value =
                serde_norway::from_str(doc).unwrap_or_else(|e| panic!("{e}: {doc}"));
            assert!(parsed["kind"].is_string(), "{doc}");
        }
    }

    fn figures(peak_mib: u64) -> Figures {
        Figures {
            pets: 200,
            namespaces: 20,
            stores: 3,
            operator_peak_rss_kib: peak_mib * 1024,
            ..Default::default()
        }
    }

    fn pair(floor: f64, operator: f64) -> SideBySide {
        let run = |secs: f64| SideResult {
            time: Duration::from_secs_f64(secs),
            ..SideResult::default()
        };
        SideBySide {
            first: run(floor),
            second: run(operator),
            first_cpu: 0,
        }
    }

    #[test]
    fn the_goal_needs_the_memory_and_every_pair_within_ten_percent() {
        let mut result = SpreadResult {
            spread: figures(54),
            single: figures(50),
            pairs: vec![pair(10.0, 10.5), pair(10.0, 10.9)],
            ..Default::default()
        };
        assert!(result.goal_met(), "1.08 and pairs at 1.05, 1.09");
        result.spread = figures(56);
        assert!(
            !result.rss_met() && !result.goal_met(),
            "1.12 of the single run's"
        );
        result.spread = figures(54);
        result.pairs.push(pair(10.0, 11.2));
        assert!(
            !result.pairs_met() && !result.goal_met(),
            "one pair at 1.12"
        );
        result.pairs.pop();
        result.spread.connections_refused = 1;
        assert!(
            !result.no_connection_refused() && !result.goal_met(),
            "a store refused the operator a connection"
        );
        result.spread.connections_refused = 0;
        assert!(result.goal_met());
        result.pairs.clear();
        assert!(!result.goal_met(), "no pair shows nothing");
        result.pairs.push(pair(10.0, 10.0));
        result.single = figures(0);
        assert!(!result.goal_met(), "no single run's RSS shows nothing");
    }

    #[test]
    fn the_section_gives_each_goal_and_both_runs() {
        let mut result = SpreadResult {
            spread: figures(55),
            single: figures(50),
            pairs: vec![pair(10.0, 10.5), pair(10.0, 11.2)],
            ..Default::default()
        };
        result.spread.pets_per_store = vec![67, 67, 66];
        result.spread.api_writes = 800;
        result.single.api_writes = 600;
        let section = markdown(&result, "hack/bench.sh --spread 200 --spread-namespaces 20");
        assert!(section.starts_with("## Spread\n"), "{section}");
        assert!(
            section.contains("| operator peak RSS, spread ÷ single | ≤ 1.10 | 1.10 (55.0 MiB against 50.0 MiB) | met |"),
            "{section}"
        );
        assert!(
            section.contains(
                "| ≤ 1.10 | 1.12 at worst (median 1.08; each: 1.05, 1.12) | **not met** |"
            ),
            "{section}"
        );
        assert!(
            section.contains(
                "| API writes per Pet (Pets and Events), spread / single | | 4.000 / 3.000 | |"
            ),
            "{section}"
        );
        assert!(section.contains("| 67, 67, 66 |"), "{section}");
        assert!(
            section.contains("200 Pets over 20 namespaces (10 each"),
            "{section}"
        );
        assert_eq!(per_namespace(205, 20), "10 or 11");
    }
}
