//! Each store object's `status`, written by the leader: whether the store
//! answers at its address, which extension RPCs it serves, and how many
//! Pets use it, with the conditions kstatus reads.
//!
//! - *Answers*: a `grpc.health.v1.Health` check over the TLS trust its
//!   Pets' clients use (the same CA, read the same way). Any gRPC answer
//!   counts, a refusal such as `UNAUTHENTICATED` included; a refused
//!   connection, a failed TLS handshake or no answer within
//!   `--petstore-timeout` does not. A CA that cannot be read is no probe
//!   at all: `StoreTrustMissing`.
//! - *Extensions*: the methods of `petstore.PetStore` its gRPC reflection
//!   lists (as `grpcurl describe` reads them), so no call needs a tenant's
//!   token.
//! - *Pets*: those whose `status.store` names it, counted in the
//!   controller's watch cache of Pets.
//!
//! A store is probed as soon as it appears or its spec changes, and every
//! `--store-status-interval` otherwise; probes run side by side, at most
//! [`PROBES_AT_ONCE`], so a slow store delays only its own status. The Pet
//! count is taken at each interval and on every change a held Pet waits
//! for (a new store, a store's spec, a namespace's labels), so it may lag
//! by up to an interval. A status is written
//! only when it differs from the cached object's: a steady state makes no
//! API writes.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{self, ObjectRef};
use kube::{Client, ResourceExt as _};
use prost::Message as _;
use tokio::sync::Semaphore;
use tokio::sync::broadcast::error::RecvError;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tonic::Code;
use tonic::transport::Channel;
use tracing::{debug, info, warn};

use super::listed;
use super::resolve::{Endpoint, StoreId};
use super::{Caches, Stores};
use crate::crd::stores::{STORE_REACHABLE, STORE_READY};
use crate::crd::{ClusterPetStore, Pet, PetStore, StoreStatus};
use crate::status::{RECONCILING, Reason, STALLED};
use crate::store::Operation;
use crate::store::grpc::{GrpcPetStore, StoreCallMetrics};

/// Probes in flight at once, at most.
const PROBES_AT_ONCE: usize = 8;

/// The shortest interval between probes of a store, whatever the flag says.
const MIN_INTERVAL: Duration = Duration::from_millis(100);

/// The service whose methods reflection is asked for.
const SERVICE: &str = "petstore.PetStore";

/// This project's RPCs beyond the book's, in the order
/// `status.extensions` lists them.
const EXTENSIONS: [Operation; 4] = [
    Operation::Observe,
    Operation::SetKey,
    Operation::Watch,
    Operation::Claim,
];

/// What one probe of a store found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Probed {
    /// The store's CA Secret or ConfigMap cannot be read: nothing was tried.
    TrustMissing(String),
    /// The spec makes no client (an address or CA the client refuses).
    Unusable(String),
    /// No answer: the connection was refused, the TLS handshake failed, or
    /// nothing came back in time.
    Unreachable(String),
    /// It answered, and its health check says it is not serving.
    NotServing,
    /// It answered. `extensions` as its reflection lists them; `None` when
    /// it serves no reflection.
    Answered { extensions: Option<Vec<String>> },
}

/// One condition as the status should show it.
struct Wanted {
    type_: &'static str,
    status: &'static str,
    reason: Reason,
    message: String,
}

/// The status a store shows for what its last probe of `generation` found
/// and the Pets that use it. Transition times move only when a
/// condition's status does, so the same findings give the same status,
/// and no write.
pub fn next_status(
    current: Option<&StoreStatus>,
    generation: Option<i64>,
    address: &str,
    probed: &Probed,
    pets: i64,
    now: &Time,
) -> StoreStatus {
    let answered = format!("the store answers at {address}");
    let (reachable, ready) = match probed {
        Probed::Answered { .. } => (
            ("True", Reason::Available, answered.clone()),
            ("True", Reason::Available, answered),
        ),
        Probed::NotServing => (
            ("True", Reason::Available, answered),
            (
                "False",
                Reason::StoreUnavailable,
                format!(
                    "the store at {address} answers, and its health check says NOT_SERVING; checked again every interval"
                ),
            ),
        ),
        Probed::Unreachable(why) => {
            let message = format!("no answer from {address}, checked again every interval: {why}");
            (
                ("False", Reason::StoreUnavailable, message.clone()),
                ("False", Reason::StoreUnavailable, message),
            )
        }
        Probed::TrustMissing(why) => (
            ("Unknown", Reason::StoreTrustMissing, why.clone()),
            ("False", Reason::StoreTrustMissing, why.clone()),
        ),
        Probed::Unusable(why) => {
            let message = format!("fix spec.address or spec.tls: {why}");
            (
                ("Unknown", Reason::InvalidSpec, message.clone()),
                ("False", Reason::InvalidSpec, message),
            )
        }
    };
    let mut wanted = vec![
        Wanted {
            type_: STORE_REACHABLE,
            status: reachable.0,
            reason: reachable.1,
            message: reachable.2,
        },
        Wanted {
            type_: STORE_READY,
            status: ready.0,
            reason: ready.1,
            message: ready.2.clone(),
        },
    ];
    // kstatus: Reconciling while the store is re-checked by itself,
    // Stalled while only a person can help; present only while they hold.
    if ready.0 == "False" {
        let abnormal = if ready.1.stalls() {
            Some(STALLED)
        } else if ready.1.retries() {
            Some(RECONCILING)
        } else {
            None
        };
        if let Some(type_) = abnormal {
            wanted.push(Wanted {
                type_,
                status: "True",
                reason: ready.1,
                message: ready.2,
            });
        }
    }
    let was = |type_: &str| {
        current
            .into_iter()
            .flat_map(|status| &status.conditions)
            .find(|condition| condition.type_ == type_)
    };
    let mut conditions: Vec<Condition> = wanted
        .into_iter()
        .map(|wanted| {
            let last_transition_time = match was(wanted.type_) {
                Some(before) if before.status == wanted.status => {
                    before.last_transition_time.clone()
                }
                _ => now.clone(),
            };
            Condition {
                type_: wanted.type_.to_owned(),
                status: wanted.status.to_owned(),
                reason: wanted.reason.as_str().to_owned(),
                message: wanted.message,
                last_transition_time,
                observed_generation: generation,
            }
        })
        .collect();
    // A stable order, so equal findings compare equal.
    conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
    StoreStatus {
        conditions,
        extensions: match probed {
            Probed::Answered { extensions } => extensions.clone(),
            _ => None,
        },
        pets: Some(pets),
        observed_generation: generation,
    }
}

/// How many Pets use each store: those whose `status.store` names it (a
/// PetStore in the Pet's own namespace).
pub fn count_pets<'a>(pets: impl IntoIterator<Item = &'a Pet>) -> HashMap<StoreId, i64> {
    let mut counts = HashMap::new();
    for pet in pets {
        let namespace = pet.metadata.namespace.as_deref().unwrap_or_default();
        let store = pet
            .status
            .as_ref()
            .and_then(|status| status.store.as_deref());
        match StoreId::from_status(namespace, store) {
            None | Some(StoreId::Own) => {}
            Some(id) => *counts.entry(id).or_insert(0) += 1,
        }
    }
    counts
}

/// Whether a health check that failed with `code` still heard from the
/// store: any gRPC answer does (`UNAUTHENTICATED` from a store that
/// guards every service, `UNIMPLEMENTED` from one without health checks);
/// a connection that failed or timed out does not.
fn heard_from_store(code: Code) -> bool {
    !matches!(
        code,
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown
    )
}

/// The extension RPCs among the methods of `petstore.PetStore` in these
/// serialized `FileDescriptorProto`s (a reflection answer).
fn served_extensions(files: &[Vec<u8>]) -> Vec<String> {
    let methods: HashSet<String> = files
        .iter()
        .filter_map(|file| prost_types::FileDescriptorProto::decode(file.as_slice()).ok())
        .filter(|file| file.package() == "petstore")
        .flat_map(|file| file.service)
        .filter(|service| service.name() == "PetStore")
        .flat_map(|service| service.method)
        .map(|method| method.name().to_owned())
        .collect();
    EXTENSIONS
        .iter()
        .map(|operation| operation.method())
        .filter(|method| methods.contains(*method))
        .map(str::to_owned)
        .collect()
}

/// A tonic error with its causes, as one line ("tcp connect error:
/// Connection refused (os error 111)"), less tonic's wrapper that says
/// only "transport error".
fn describe(status: &tonic::Status) -> String {
    let mut text = status.message().to_owned();
    let mut source = std::error::Error::source(status);
    while let Some(error) = source {
        let cause = error.to_string();
        if cause != "transport error" && !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
        source = error.source();
    }
    text
}

/// Probes the store at `endpoint`: see the module.
async fn probe(stores: &Stores, endpoint: &Endpoint, timeout: Duration) -> Probed {
    let ca = match &endpoint.ca {
        Some((namespace, source)) => match stores.read_ca(namespace, source).await {
            Ok(pem) => Some(pem),
            Err(refused) => return Probed::TrustMissing(refused.message),
        },
        None => None,
    };
    probe_address(endpoint, ca.as_deref(), timeout).await
}

/// Probes the store at `endpoint`, trusting `ca` (PEM) if given.
async fn probe_address(endpoint: &Endpoint, ca: Option<&[u8]>, timeout: Duration) -> Probed {
    let channel = match GrpcPetStore::connect_lazy_pem(
        &endpoint.address,
        timeout,
        ca,
        endpoint.server_name.as_deref(),
        StoreCallMetrics::default(),
    ) {
        Ok(store) => store.channel(),
        Err(error) => return Probed::Unusable(error.to_string()),
    };
    use tonic_health::pb::health_check_response::ServingStatus;
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    // The channel's own timeout ends the call first, in the same words
    // every time (words that changed would be a status write each time);
    // this one only backs it up.
    let checked = tokio::time::timeout(
        timeout * 2,
        health.check(tonic_health::pb::HealthCheckRequest::default()),
    )
    .await;
    match checked {
        Err(_) => return Probed::Unreachable(format!("no answer within {timeout:?}")),
        Ok(Ok(answer)) if answer.get_ref().status() != ServingStatus::Serving => {
            return Probed::NotServing;
        }
        Ok(Err(status)) if !heard_from_store(status.code()) => {
            return Probed::Unreachable(describe(&status));
        }
        Ok(_) => {}
    }
    Probed::Answered {
        extensions: extensions(channel, timeout).await,
    }
}

/// The extension RPCs the store's reflection (v1) lists; `None` if it
/// serves no reflection or does not list `petstore.PetStore`.
async fn extensions(channel: Channel, timeout: Duration) -> Option<Vec<String>> {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::FileContainingSymbol(SERVICE.to_owned())),
    };
    let mut client = ServerReflectionClient::new(channel);
    let asked = async move {
        let mut answers = client
            .server_reflection_info(futures::stream::iter([request]))
            .await
            .ok()?
            .into_inner();
        answers.message().await.ok()?
    };
    // The channel's timeout ends the call; this one, the answer's stream.
    match tokio::time::timeout(timeout * 2, asked)
        .await
        .ok()??
        .message_response?
    {
        MessageResponse::FileDescriptorResponse(files) => {
            Some(served_extensions(&files.file_descriptor_proto))
        }
        _ => None,
    }
}

/// A store object as the watch cache holds it.
struct Seen {
    id: StoreId,
    uid: String,
    generation: Option<i64>,
    resource_version: Option<String>,
    endpoint: Endpoint,
    status: Option<StoreStatus>,
}

impl Seen {
    fn of_pet_store(store: &PetStore) -> Self {
        let namespace = store.namespace().unwrap_or_default();
        Seen {
            id: StoreId::namespaced(&namespace, &store.name_any()),
            uid: store.uid().unwrap_or_default(),
            generation: store.metadata.generation,
            resource_version: store.resource_version(),
            endpoint: Endpoint::of_pet_store(store, &namespace),
            status: store.status.clone(),
        }
    }

    fn of_cluster_store(store: &ClusterPetStore) -> Self {
        Seen {
            id: StoreId::cluster(&store.name_any()),
            uid: store.uid().unwrap_or_default(),
            generation: store.metadata.generation,
            resource_version: store.resource_version(),
            endpoint: Endpoint::of_cluster_store(store),
            status: store.status.clone(),
        }
    }

    fn all(caches: &Caches) -> Vec<Seen> {
        let pet_stores = caches.pet_stores.state();
        let cluster_stores = caches.cluster_stores.state();
        pet_stores
            .iter()
            .map(|store| Seen::of_pet_store(store))
            .chain(
                cluster_stores
                    .iter()
                    .map(|store| Seen::of_cluster_store(store)),
            )
            .collect()
    }

    fn one(caches: &Caches, id: &StoreId) -> Option<Seen> {
        match id {
            StoreId::Own => None,
            StoreId::Namespaced { namespace, name } => caches
                .pet_stores
                .get(&ObjectRef::new(name).within(namespace))
                .map(|store| Seen::of_pet_store(&store)),
            StoreId::Cluster { name } => caches
                .cluster_stores
                .get(&ObjectRef::new(name))
                .map(|store| Seen::of_cluster_store(&store)),
        }
    }

    /// The store's spec is not the one `last` probed (or it was never
    /// probed): probe it at once.
    fn changed_since(&self, last: Option<&Last>) -> bool {
        last.is_none_or(|last| last.uid != self.uid || last.generation != self.generation)
    }
}

/// A store's last probe, and of which object and generation.
struct Last {
    uid: String,
    generation: Option<i64>,
    probed: Probed,
}

/// A status written, until the watch cache shows it.
struct Written {
    /// The resourceVersion the cache showed when it was written.
    resource_version: Option<String>,
    status: StoreStatus,
}

/// A probe's result.
struct Done {
    uid: String,
    generation: Option<i64>,
    probed: Probed,
}

/// Probes under way, each a task of its own and at most `at_once`
/// running: each result comes as soon as it is ready, whatever the others
/// do, so a store that does not answer delays only its own status.
struct Probes<T> {
    tasks: JoinSet<T>,
    stores: HashMap<tokio::task::Id, StoreId>,
    permits: Arc<Semaphore>,
}

impl<T: Send + 'static> Probes<T> {
    fn new(at_once: usize) -> Self {
        Self {
            tasks: JoinSet::new(),
            stores: HashMap::new(),
            permits: Arc::new(Semaphore::new(at_once)),
        }
    }

    fn under_way(&self, store: &StoreId) -> bool {
        self.stores.values().any(|id| id == store)
    }

    /// Runs `probe` of `store` once a place is free.
    fn start(&mut self, store: StoreId, probe: impl Future<Output = T> + Send + 'static) {
        let permits = Arc::clone(&self.permits);
        let task = self.tasks.spawn(async move {
            // Never closed, so always a permit.
            let _permit = permits.acquire_owned().await;
            probe.await
        });
        self.stores.insert(task.id(), store);
    }

    /// The next probe to end: its store, and its result (`None` if its
    /// task failed). `None` while none is under way. Cancel-safe.
    async fn next(&mut self) -> Option<(StoreId, Option<T>)> {
        let (task, result) = match self.tasks.join_next_with_id().await? {
            Ok((task, result)) => (task, Some(result)),
            Err(error) => {
                warn!(%error, "a store probe failed; it is probed again next interval");
                (error.id(), None)
            }
        };
        let store = self.stores.remove(&task)?;
        Some((store, result))
    }
}

/// The loop's state: see [`write_until`].
struct Writer {
    stores: Arc<Stores>,
    pets: reflector::Store<Pet>,
    counts: HashMap<StoreId, i64>,
    last: HashMap<StoreId, Last>,
    written: HashMap<StoreId, Written>,
    probes: Probes<Done>,
}

/// Writes the status of every PetStore and ClusterPetStore until `stop`:
/// see the module. The leader's, beside the controller; `pets` is the
/// controller's watch cache of Pets.
pub async fn write_until(
    stores: Arc<Stores>,
    pets: reflector::Store<Pet>,
    stop: CancellationToken,
) {
    let Some(caches) = stores.caches.as_ref() else {
        return;
    };
    let mut changed = stores.subscribe();
    let listed = async {
        listed(&caches.pet_stores).await;
        listed(&caches.cluster_stores).await;
        listed(&pets).await;
    };
    tokio::select! {
        () = stop.cancelled() => return,
        () = listed => {}
    }
    let interval = stores.settings.status_interval.max(MIN_INTERVAL);
    info!(?interval, "writing the stores' status");
    let mut every = tokio::time::interval(interval);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut writer = Writer {
        stores: Arc::clone(&stores),
        pets,
        counts: HashMap::new(),
        last: HashMap::new(),
        written: HashMap::new(),
        probes: Probes::new(PROBES_AT_ONCE),
    };
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = every.tick() => writer.probe_all(caches),
            change = changed.recv() => {
                // Lagged: some changes missed, and this looks at all.
                if matches!(change, Err(RecvError::Closed)) {
                    return;
                }
                writer.probe_changed(caches);
                writer.show_all(caches).await;
            }
            Some((store, done)) = writer.probes.next() => writer.probed(caches, store, done).await,
        }
    }
}

impl Writer {
    /// Every interval: a fresh Pet count, and every store probed again.
    fn probe_all(&mut self, caches: &Caches) {
        self.counts = count_pets(self.pets.state().iter().map(|pet| &**pet));
        let seen = Seen::all(caches);
        let present: HashSet<&StoreId> = seen.iter().map(|store| &store.id).collect();
        self.last.retain(|id, _| present.contains(id));
        self.written.retain(|id, _| present.contains(id));
        for store in &seen {
            self.start_probe(store);
        }
    }

    /// A store object changed: the new and changed ones probed at once.
    fn probe_changed(&mut self, caches: &Caches) {
        for store in Seen::all(caches) {
            if store.changed_since(self.last.get(&store.id)) {
                self.start_probe(&store);
            }
        }
    }

    /// Starts a probe of `store`, unless one is under way (its result
    /// starts another if the spec has changed since).
    fn start_probe(&mut self, store: &Seen) {
        if self.probes.under_way(&store.id) {
            return;
        }
        let stores = Arc::clone(&self.stores);
        let endpoint = store.endpoint.clone();
        let (uid, generation) = (store.uid.clone(), store.generation);
        let timeout = stores.settings.call_timeout;
        self.probes.start(store.id.clone(), async move {
            let probed = probe(&stores, &endpoint, timeout).await;
            Done {
                uid,
                generation,
                probed,
            }
        });
    }

    /// A probe ended: its store's status, and another probe if its spec
    /// changed meanwhile.
    async fn probed(&mut self, caches: &Caches, id: StoreId, done: Option<Done>) {
        let Some(done) = done else {
            return;
        };
        debug!(store = %id, probed = ?done.probed, "store probed");
        let Some(store) = Seen::one(caches, &id) else {
            return;
        };
        self.last.insert(
            id.clone(),
            Last {
                uid: done.uid,
                generation: done.generation,
                probed: done.probed,
            },
        );
        if store.changed_since(self.last.get(&id)) {
            self.start_probe(&store);
        } else {
            self.show(&store).await;
        }
    }

    /// Every store's status, with a fresh Pet count.
    async fn show_all(&mut self, caches: &Caches) {
        self.counts = count_pets(self.pets.state().iter().map(|pet| &**pet));
        for store in Seen::all(caches) {
            self.show(&store).await;
        }
    }

    /// Writes the store's status for its last probe, if that probe was of
    /// its current spec and the status differs from what it shows.
    async fn show(&mut self, store: &Seen) {
        let Some(last) = self.last.get(&store.id) else {
            return;
        };
        if store.changed_since(Some(last)) {
            return;
        }
        let pets = self.counts.get(&store.id).copied().unwrap_or(0);
        let next = next_status(
            store.status.as_ref(),
            store.generation,
            &store.endpoint.address,
            &last.probed,
            pets,
            &now(),
        );
        if store.status.as_ref() == Some(&next) {
            self.written.remove(&store.id);
            return;
        }
        // Written already; the cache has not caught up yet.
        if self.written.get(&store.id).is_some_and(|written| {
            written.status == next && written.resource_version == store.resource_version
        }) {
            return;
        }
        match patch_status(&self.stores.client, &store.id, &next).await {
            Ok(()) => {
                let ready = next
                    .conditions
                    .iter()
                    .find(|condition| condition.type_ == STORE_READY)
                    .map(|condition| (condition.status.clone(), condition.reason.clone()));
                info!(store = %store.id, ?ready, pets, "store status written");
                self.written.insert(
                    store.id.clone(),
                    Written {
                        resource_version: store.resource_version.clone(),
                        status: next,
                    },
                );
            }
            // Deleted meanwhile.
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(error) => {
                warn!(store = %store.id, %error, "cannot write a store's status; trying again next interval");
            }
        }
    }
}

/// Now, to the second: the API server keeps no finer time, so a time kept
/// from the cache compares equal with one just made.
fn now() -> Time {
    let now = k8s_openapi::jiff::Timestamp::now();
    Time(k8s_openapi::jiff::Timestamp::from_second(now.as_second()).unwrap_or(now))
}

/// Merge-patches the store's status subresource; `null` removes what the
/// status no longer has.
async fn patch_status(
    client: &Client,
    id: &StoreId,
    status: &StoreStatus,
) -> Result<(), kube::Error> {
    let body = serde_json::json!({
        "status": {
            "conditions": status.conditions,
            "extensions": status.extensions,
            "pets": status.pets,
            "observedGeneration": status.observed_generation,
        }
    });
    let params = PatchParams::default();
    let patch = Patch::Merge(&body);
    match id {
        StoreId::Own => {}
        StoreId::Namespaced { namespace, name } => {
            Api::<PetStore>::namespaced(client.clone(), namespace)
                .patch_status(name, &params, &patch)
                .await?;
        }
        StoreId::Cluster { name } => {
            Api::<ClusterPetStore>::all(client.clone())
                .patch_status(name, &params, &patch)
                .await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ADDRESS: &str = "https://store.team-a.svc:6742";

    fn at(second: i64) -> Time {
        Time(
            k8s_openapi::jiff::Timestamp::from_second(1_700_000_000 + second)
                .expect("a valid time"),
        )
    }

    fn all_extensions() -> Option<Vec<String>> {
        Some(
            [
                "GetPets",
                "SetIdempotencyKeys",
                "WatchPets",
                "ClaimInstallation",
            ]
            .map(str::to_owned)
            .to_vec(),
        )
    }

    fn answered() -> Probed {
        Probed::Answered {
            extensions: all_extensions(),
        }
    }

    /// The status after a first probe of generation 1 that found `probed`,
    /// with 2 Pets.
    fn first(probed: &Probed) -> StoreStatus {
        next_status(None, Some(1), ADDRESS, probed, 2, &at(0))
    }

    /// Type, status, reason of each condition, and whether its transition
    /// time is `at(60)` (it flipped in this probe).
    type Shown = (&'static str, &'static str, &'static str, bool);

    fn shown(status: &StoreStatus) -> Vec<(String, String, String, bool)> {
        status
            .conditions
            .iter()
            .map(|c| {
                (
                    c.type_.clone(),
                    c.status.clone(),
                    c.reason.clone(),
                    c.last_transition_time == at(60),
                )
            })
            .collect()
    }

    /// Reachable and Ready: the store answers.
    fn available(flipped: bool) -> Vec<Shown> {
        vec![
            ("Reachable", "True", "Available", flipped),
            ("Ready", "True", "Available", flipped),
        ]
    }

    /// Neither Reachable nor Ready, and Reconciling: nothing listens.
    fn unavailable(flipped: bool) -> Vec<Shown> {
        vec![
            ("Reachable", "False", "StoreUnavailable", flipped),
            ("Ready", "False", "StoreUnavailable", flipped),
            ("Reconciling", "True", "StoreUnavailable", flipped),
        ]
    }

    /// Not tried, not Ready, and Stalled for `reason`, all just now: only
    /// a person can help.
    fn stalled(reason: &'static str) -> Vec<Shown> {
        vec![
            ("Reachable", "Unknown", reason, true),
            ("Ready", "False", reason, true),
            ("Stalled", "True", reason, true),
        ]
    }

    struct Row {
        name: &'static str,
        current: Option<StoreStatus>,
        generation: i64,
        probed: Probed,
        pets: i64,
        conditions: Vec<Shown>,
        extensions: Option<Vec<String>>,
        written: bool,
    }

    #[test]
    fn the_status_follows_the_probe_and_the_pets_and_is_written_only_when_it_changes() {
        let unreachable = Probed::Unreachable("tcp connect error: Connection refused".into());
        let trust = Probed::TrustMissing(
            "the store's CA ConfigMap team-a/petstore-ca does not exist".into(),
        );
        let rows = vec![
            Row {
                name: "a store that answers: Ready and Reachable, nothing for kstatus to wait on",
                current: None,
                generation: 1,
                probed: answered(),
                pets: 2,
                conditions: available(true),
                extensions: all_extensions(),
                written: true,
            },
            Row {
                name: "nothing changed: the same status, no write",
                current: Some(first(&answered())),
                generation: 1,
                probed: answered(),
                pets: 2,
                conditions: available(false),
                extensions: all_extensions(),
                written: false,
            },
            Row {
                name: "unreachable, again: the same status, no write",
                current: Some(first(&unreachable)),
                generation: 1,
                probed: unreachable.clone(),
                pets: 2,
                conditions: unavailable(false),
                extensions: None,
                written: false,
            },
            Row {
                name: "a Pet more: written, transition times kept",
                current: Some(first(&answered())),
                generation: 1,
                probed: answered(),
                pets: 3,
                conditions: available(false),
                extensions: all_extensions(),
                written: true,
            },
            Row {
                name: "a new generation: written, observed",
                current: Some(first(&answered())),
                generation: 2,
                probed: answered(),
                pets: 2,
                conditions: available(false),
                extensions: all_extensions(),
                written: true,
            },
            Row {
                name: "nothing listens: not Ready, Reconciling (kstatus InProgress), extensions unknown",
                current: Some(first(&answered())),
                generation: 1,
                probed: unreachable.clone(),
                pets: 2,
                conditions: unavailable(true),
                extensions: None,
                written: true,
            },
            Row {
                name: "back again: Ready, and Reconciling gone",
                current: Some(first(&unreachable)),
                generation: 1,
                probed: answered(),
                pets: 2,
                conditions: available(true),
                extensions: all_extensions(),
                written: true,
            },
            Row {
                name: "NOT_SERVING: reachable, not Ready, Reconciling",
                current: None,
                generation: 1,
                probed: Probed::NotServing,
                pets: 0,
                conditions: vec![
                    ("Reachable", "True", "Available", true),
                    ("Ready", "False", "StoreUnavailable", true),
                    ("Reconciling", "True", "StoreUnavailable", true),
                ],
                extensions: None,
                written: true,
            },
            Row {
                name: "the CA missing: not tried, Stalled (kstatus Failed)",
                current: None,
                generation: 1,
                probed: trust,
                pets: 0,
                conditions: stalled("StoreTrustMissing"),
                extensions: None,
                written: true,
            },
            Row {
                name: "a spec no client takes: InvalidSpec, Stalled",
                current: None,
                generation: 1,
                probed: Probed::Unusable("invalid pet store address".into()),
                pets: 0,
                conditions: stalled("InvalidSpec"),
                extensions: None,
                written: true,
            },
            Row {
                name: "the book's store: answers, with no extensions",
                current: None,
                generation: 1,
                probed: Probed::Answered {
                    extensions: Some(vec![]),
                },
                pets: 0,
                conditions: available(true),
                extensions: Some(vec![]),
                written: true,
            },
            Row {
                name: "no reflection: answers, extensions unknown",
                current: None,
                generation: 1,
                probed: Probed::Answered { extensions: None },
                pets: 0,
                conditions: available(true),
                extensions: None,
                written: true,
            },
        ];
        for row in rows {
            let next = next_status(
                row.current.as_ref(),
                Some(row.generation),
                ADDRESS,
                &row.probed,
                row.pets,
                &at(60),
            );
            let mut expected: Vec<(String, String, String, bool)> = row
                .conditions
                .iter()
                .map(|(t, s, r, flipped)| {
                    ((*t).to_owned(), (*s).to_owned(), (*r).to_owned(), *flipped)
                })
                .collect();
            expected.sort();
            assert_eq!(shown(&next), expected, "{}", row.name);
            assert_eq!(next.extensions, row.extensions, "{}", row.name);
            assert_eq!(next.pets, Some(row.pets), "{}", row.name);
            assert_eq!(
                next.observed_generation,
                Some(row.generation),
                "{}",
                row.name
            );
            assert!(
                next.conditions
                    .iter()
                    .all(|c| c.observed_generation == Some(row.generation)),
                "{}",
                row.name
            );
            assert_eq!(
                row.current.as_ref() != Some(&next),
                row.written,
                "{}: written",
                row.name
            );
        }
    }

    #[test]
    fn messages_say_where_and_why() {
        let down = first(&Probed::Unreachable("tcp connect error".into()));
        let ready = down
            .conditions
            .iter()
            .find(|c| c.type_ == STORE_READY)
            .expect("Ready");
        assert!(ready.message.contains(ADDRESS), "{}", ready.message);
        assert!(
            ready.message.contains("tcp connect error"),
            "{}",
            ready.message
        );
        // The status as the API server stores it.
        let json = serde_json::to_value(&down).expect("json");
        assert_eq!(json["pets"], 2);
        assert_eq!(json["observedGeneration"], 1);
        assert!(json.get("extensions").is_none(), "{json}");
    }

    fn pet(namespace: &str, store: Option<&str>) -> Pet {
        let mut pet = Pet::test().with_status(serde_json::json!({ "store": store }));
        pet.metadata.namespace = Some(namespace.to_owned());
        pet
    }

    #[test]
    fn a_pet_store_counts_its_own_namespace_and_a_cluster_store_every_one() {
        let pets = [
            pet("team-a", Some("PetStore/shared")),
            pet("team-a", Some("PetStore/shared")),
            pet("team-b", Some("PetStore/shared")),
            pet("team-a", Some("ClusterPetStore/global")),
            pet("team-b", Some("ClusterPetStore/global")),
            // The operator's own store, and a value that names no store.
            pet("team-a", None),
            pet("team-a", Some("Elsewhere/x")),
        ];
        let counts = count_pets(&pets);
        let shared = |namespace: &str| StoreId::namespaced(namespace, "shared");
        assert_eq!(counts.get(&shared("team-a")), Some(&2));
        assert_eq!(counts.get(&shared("team-b")), Some(&1));
        assert_eq!(counts.get(&StoreId::cluster("global")), Some(&2));
        assert_eq!(counts.len(), 3, "{counts:?}");
    }

    #[test]
    fn any_answer_is_heard_and_a_failed_connection_is_not() {
        for code in [
            Code::Ok,
            Code::Unauthenticated,
            Code::PermissionDenied,
            Code::Unimplemented,
            Code::NotFound,
            Code::ResourceExhausted,
        ] {
            assert!(heard_from_store(code), "{code:?}");
        }
        for code in [
            Code::Unavailable,
            Code::DeadlineExceeded,
            Code::Cancelled,
            Code::Unknown,
        ] {
            assert!(!heard_from_store(code), "{code:?}");
        }
    }

    #[test]
    fn the_extensions_are_the_methods_reflection_lists_beyond_the_books() {
        let set = prost_types::FileDescriptorSet::decode(petstore_proto::FILE_DESCRIPTOR_SET)
            .expect("descriptor set");
        let encoded: Vec<Vec<u8>> = set.file.iter().map(|f| f.encode_to_vec()).collect();
        assert_eq!(Some(served_extensions(&encoded)), all_extensions());
        // The book's store: its four RPCs, none of them an extension.
        let book: Vec<Vec<u8>> = set
            .file
            .into_iter()
            .map(|mut file| {
                for service in &mut file.service {
                    service.method.retain(|m| {
                        ["AddPets", "UpdatePets", "DeletePets", "SearchPets"].contains(&m.name())
                    });
                }
                file.encode_to_vec()
            })
            .collect();
        assert_eq!(served_extensions(&book), Vec::<String>::new());
        assert_eq!(
            served_extensions(&[b"not a descriptor".to_vec()]),
            Vec::<String>::new()
        );
    }

    /// A gRPC server on 127.0.0.1, serving `router` (with `tls`: a
    /// certificate and key, PEM); its address.
    async fn serve(router: tonic::transport::server::Router) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let addr = listener.local_addr().expect("its address");
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        tokio::spawn(router.serve_with_incoming(incoming));
        addr.to_string()
    }

    fn endpoint(address: String) -> Endpoint {
        Endpoint {
            address,
            audience: "petstore".into(),
            ca: None,
            server_name: None,
            generation: Some(1),
        }
    }

    fn reflection() -> tonic_reflection::server::v1::ServerReflectionServer<
        impl tonic_reflection::server::v1::ServerReflection,
    > {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(petstore_proto::FILE_DESCRIPTOR_SET)
            .build_v1()
            .expect("reflection")
    }

    /// What a probe finds, against real gRPC servers: any answer is one,
    /// a refused or silent connection and a certificate from another CA
    /// are none.
    #[tokio::test]
    async fn a_probe_hears_any_answer_over_the_stores_trust_and_reads_its_extensions() {
        use tonic::transport::{Identity, Server, ServerTlsConfig};
        use tonic_health::ServingStatus;
        let timeout = Duration::from_millis(1500);
        let probe = |address: String, ca: Option<String>| async move {
            probe_address(
                &endpoint(address),
                ca.as_deref().map(str::as_bytes),
                timeout,
            )
            .await
        };

        let (_, health) = tonic_health::server::health_reporter();
        let ours = serve(
            Server::builder()
                .add_service(health)
                .add_service(reflection()),
        )
        .await;
        let (not_serving, health) = tonic_health::server::health_reporter();
        not_serving
            .set_service_status("", ServingStatus::NotServing)
            .await;
        let draining = serve(Server::builder().add_service(health)).await;
        let (_, health) = tonic_health::server::health_reporter();
        let guarded = tonic::service::interceptor::InterceptedService::new(health, |_| {
            Err(tonic::Status::unauthenticated("no token"))
        });
        let guarded = serve(Server::builder().add_service(guarded)).await;
        let no_health = serve(Server::builder().add_service(reflection())).await;
        // Accepts, and never answers.
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let silent_addr = silent.local_addr().expect("its address").to_string();
        // Nothing listens: a port taken and let go.
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port")
            .local_addr()
            .expect("its address")
            .to_string();
        let certs = crate::webhook::certs::WebhookCerts::generate(
            &crate::webhook::certs::WEBHOOK,
            &["127.0.0.1".to_owned()],
            crate::webhook::certs::unix_now(),
        )
        .expect("certificates");
        let other_ca = crate::webhook::certs::WebhookCerts::generate(
            &crate::webhook::certs::WEBHOOK,
            &["127.0.0.1".to_owned()],
            crate::webhook::certs::unix_now(),
        )
        .expect("certificates")
        .ca_cert;
        let (_, health) = tonic_health::server::health_reporter();
        let mut tls = Server::builder()
            .tls_config(
                ServerTlsConfig::new().identity(Identity::from_pem(&certs.cert, &certs.key)),
            )
            .expect("TLS");
        let tls = serve(tls.add_service(health)).await;

        let answered = |extensions: Option<Vec<String>>| Probed::Answered { extensions };
        let cases = [
            (
                "this project's store",
                probe(format!("http://{ours}"), None).await,
                Some(answered(all_extensions())),
            ),
            (
                "NOT_SERVING",
                probe(format!("http://{draining}"), None).await,
                Some(Probed::NotServing),
            ),
            (
                "UNAUTHENTICATED is an answer",
                probe(format!("http://{guarded}"), None).await,
                Some(answered(None)),
            ),
            (
                "UNIMPLEMENTED health is an answer",
                probe(format!("http://{no_health}"), None).await,
                Some(answered(all_extensions())),
            ),
            (
                "over TLS, trusting its CA",
                probe(format!("https://{tls}"), Some(certs.ca_cert.clone())).await,
                Some(answered(None)),
            ),
            (
                "another CA",
                probe(format!("https://{tls}"), Some(other_ca)).await,
                None,
            ),
            (
                "nothing listens",
                probe(format!("http://{closed}"), None).await,
                None,
            ),
            (
                "no answer in time",
                probe(format!("http://{silent_addr}"), None).await,
                None,
            ),
        ];
        for (name, found, expected) in cases {
            match expected {
                Some(expected) => assert_eq!(found, expected, "{name}"),
                None => assert!(matches!(found, Probed::Unreachable(_)), "{name}: {found:?}"),
            }
        }
        // Unchanged findings, unchanged words: no status write.
        let (once, again) = futures::join!(
            probe(format!("http://{silent_addr}"), None),
            probe(format!("http://{silent_addr}"), None)
        );
        assert_eq!(once, again);
        let refused = probe(format!("http://{closed}"), None).await;
        assert!(
            matches!(&refused, Probed::Unreachable(why) if why.contains("Connection refused")),
            "says why: {refused:?}"
        );
        drop(silent);
    }

    /// A store that never answers holds one place, and only its own
    /// result: the others' come at once, until every place is held.
    #[tokio::test(start_paused = true)]
    async fn a_slow_probe_delays_only_its_own_result() {
        let mut probes = Probes::new(2);
        probes.start(StoreId::cluster("silent"), std::future::pending::<&str>());
        probes.start(StoreId::cluster("quick"), async { "answered" });
        assert!(probes.under_way(&StoreId::cluster("silent")));
        assert_eq!(
            probes.next().await,
            Some((StoreId::cluster("quick"), Some("answered")))
        );
        assert!(!probes.under_way(&StoreId::cluster("quick")));
        // Both places held by stores that never answer: the next waits.
        probes.start(StoreId::cluster("silent-too"), std::future::pending());
        probes.start(StoreId::cluster("waiting"), async { "answered" });
        let next = tokio::time::timeout(Duration::from_secs(3600), probes.next()).await;
        assert!(next.is_err(), "at most 2 at once: {next:?}");
    }

    /// kube wakes only the last task to wait on a cache's first list; the
    /// writer, waiting beside the reconciles, must not wait forever.
    #[tokio::test(start_paused = true)]
    async fn the_writer_sees_a_cache_listed_while_another_task_waits_on_it() {
        use k8s_openapi::api::core::v1::ConfigMap;
        use kube::runtime::watcher;
        let (cache, mut writer) = reflector::store::<ConfigMap>();
        let first = tokio::spawn({
            let cache = cache.clone();
            async move { listed(&cache).await }
        });
        tokio::task::yield_now().await;
        // A reconcile waits after it, taking the wake-up.
        let second = tokio::spawn({
            let cache = cache.clone();
            async move { cache.wait_until_ready().await.is_ok() }
        });
        tokio::task::yield_now().await;
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitDone);
        let waited = tokio::time::timeout(Duration::from_secs(60), first).await;
        assert!(matches!(waited, Ok(Ok(()))), "{waited:?}");
        assert!(matches!(second.await, Ok(true)));
    }

    #[test]
    fn the_stores_are_checked_every_30_seconds_unless_told() {
        use clap::Parser as _;
        let interval = |args: &[&str]| {
            crate::cli::Args::try_parse_from(
                std::iter::once("petstore-operator").chain(args.iter().copied()),
            )
            .map(|args| args.store_status_interval)
            .ok()
        };
        assert_eq!(interval(&[]), Some(Duration::from_secs(30)));
        assert_eq!(
            interval(&["--store-status-interval=1s"]),
            Some(Duration::from_secs(1))
        );
        assert_eq!(interval(&["--store-status-interval=soon"]), None);
    }

    #[test]
    fn a_new_store_or_a_changed_spec_is_probed_at_once() {
        let store = PetStore::new(
            "shared",
            crate::crd::PetStoreSpec {
                address: ADDRESS.into(),
                tls: None,
                audience: "petstore".into(),
            },
        );
        let mut store = store;
        store.metadata.namespace = Some("team-a".into());
        store.metadata.uid = Some("u-1".into());
        store.metadata.generation = Some(2);
        let seen = Seen::of_pet_store(&store);
        let last = |uid: &str, generation: i64| Last {
            uid: uid.into(),
            generation: Some(generation),
            probed: answered(),
        };
        assert!(seen.changed_since(None), "never probed");
        assert!(seen.changed_since(Some(&last("u-1", 1))), "spec changed");
        assert!(
            seen.changed_since(Some(&last("u-0", 2))),
            "deleted and made again"
        );
        assert!(
            !seen.changed_since(Some(&last("u-1", 2))),
            "probed as it is"
        );
    }
}
