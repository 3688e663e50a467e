//! Many stores, one operator: which store each Pet uses, and a client for
//! it that carries the Pet's namespace's identity.
//!
//! - [`resolve`]: the pure rule: `spec.storeRef`, the namespace's default,
//!   or the store the Pet's record is already in;
//! - [`tokens`]: the namespace's ServiceAccount tokens each write carries;
//! - [`status`]: each store object's status (does it answer, its
//!   extensions, the Pets that use it), written by the leader;
//! - [`issuer`]: this cluster's token issuer, published for a store with
//!   tenancy to check tokens by;
//! - this module: the watch caches of `PetStore`, `ClusterPetStore` and
//!   Namespace that the rule reads, and the clients, opened on a store's
//!   first use, one per store and namespace, over a channel the store
//!   objects naming one endpoint share ([`channels`]), and closed when no Pet has used the store for a while, or its object
//!   is gone or changed; and the change feeds of the open stores, read as
//!   the operator's own ServiceAccount, one per endpoint and audience
//!   ([`Stores::feeds`]).

pub mod caller;
pub mod channels;
pub mod issuer;
pub mod resolve;
pub mod status;
pub mod tokens;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Client, ResourceExt as _};
use tokio::sync::{broadcast, watch};
use tokio::time::Instant;
use tracing::{info, warn};

use crate::crd::CaSource;
use crate::crd::{ClusterPetStore, Pet, PetStore};
use crate::status::Reason;
use crate::store::PetStore as StoreClient;
use crate::store::grpc::{GrpcPetStore, StoreCallMetrics};
use crate::store::limiter::{ConcurrencyLimit, StoreLimiter};
use caller::AsCaller as _;
use channels::{ChannelKey, ChannelPool};
use resolve::{Endpoint, Known};
pub use resolve::{Refused, Resolved, StoreId};
use tokens::{ObserverAccount, TenantCredentials, TokenMinter};

/// The longest a reconcile waits for the store kinds' first list.
const CACHE_WAIT: Duration = Duration::from_secs(2);

/// A store no Pet has used for this long is closed.
const IDLE_CLOSE: Duration = Duration::from_secs(600);

/// How the clients of the stores are made.
#[derive(Clone, Debug)]
pub struct ClientSettings {
    pub call_timeout: Duration,
    pub qps: f64,
    pub burst: u32,
    /// Each store's calls at once (`--store-concurrency`).
    pub concurrency: ConcurrencyLimit,
    pub create_batch_wait: Duration,
    /// The operator's own ServiceAccount, whose tokens read each store's
    /// change feed; `None` publishes no feeds.
    pub observer: Option<ObserverAccount>,
    /// The audience of the operator's own store, when it checks tenants
    /// (`--petstore-audience`).
    pub own_audience: Option<String>,
    /// How often each store's status is checked again (see [`status`]).
    pub status_interval: Duration,
}

/// The operator's own store, when it checks tenants: each Pet's calls
/// carry its namespace's token, as on any store.
struct OwnTenancy {
    base: GrpcPetStore,
    audience: String,
    /// One client a namespace, made on first use (a handful of bytes and
    /// an `Arc` each: kept for the process's life).
    tenants: Mutex<HashMap<String, Arc<dyn StoreClient>>>,
}

/// Where a change feed is read from: the endpoint (its channel's key) and
/// the audience of the observer token the feed client carries. The open
/// store objects with one source share one feed: it is one server's, and
/// its record IDs are unique across them. Two audiences on one endpoint
/// are two feeds, as the store may answer their tokens differently.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FeedSource {
    pub channel: ChannelKey,
    pub audience: String,
}

/// The open store objects of one feed source, and the client the feed is
/// read with: the first member's, as the operator's observer.
#[derive(Clone)]
pub struct FeedGroup {
    pub client: Arc<dyn StoreClient>,
    pub members: BTreeSet<StoreId>,
}

/// The change feeds of the open stores, by source (see [`Stores::feeds`]).
pub type Feeds = HashMap<FeedSource, FeedGroup>;

/// Store object `id` reads its feed from `source` now (leaving any other).
fn join_feed(feeds: &mut Feeds, source: FeedSource, id: &StoreId, client: Arc<dyn StoreClient>) {
    feeds.retain(|other, group| {
        if *other != source {
            group.members.remove(id);
        }
        !group.members.is_empty()
    });
    feeds
        .entry(source)
        .or_insert_with(|| FeedGroup {
            client,
            members: BTreeSet::new(),
        })
        .members
        .insert(id.clone());
}

/// Store object `id` reads no feed: a group left empty goes.
fn leave_feed(feeds: &mut Feeds, id: &StoreId) {
    feeds.retain(|_, group| {
        group.members.remove(id);
        !group.members.is_empty()
    });
}

/// The store a Pet uses, and its client for the Pet's namespace.
pub struct ForPet {
    pub id: StoreId,
    pub store: Arc<dyn StoreClient>,
}

/// Something a Pet may be waiting on changed: the Pets held on it
/// reconcile again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Changed {
    /// A `PetStore` or Namespace: the Pets of this namespace.
    Namespace(String),
    /// A `ClusterPetStore`: every Pet.
    Cluster,
}

struct Caches {
    /// Both store kinds have been listed once.
    listed: AtomicBool,
    pet_stores: reflector::Store<PetStore>,
    cluster_stores: reflector::Store<ClusterPetStore>,
    namespaces: reflector::Store<Namespace>,
}

impl Known for Caches {
    fn pet_store(&self, namespace: &str, name: &str) -> Option<Arc<PetStore>> {
        self.pet_stores.get(&ObjectRef::new(name).within(namespace))
    }

    fn cluster_pet_store(&self, name: &str) -> Option<Arc<ClusterPetStore>> {
        self.cluster_stores.get(&ObjectRef::new(name))
    }

    fn namespace_labels(&self, namespace: &str) -> Option<BTreeMap<String, String>> {
        self.namespaces
            .get(&ObjectRef::new(namespace))
            .map(|namespace| namespace.labels().clone())
    }
}

impl Caches {
    /// The generation of the store object `id` names: `Some(None)` once
    /// it is gone, `None` before the first list.
    fn generation(&self, id: &StoreId) -> Option<Option<i64>> {
        if !self.listed.load(Ordering::Relaxed) {
            return None;
        }
        Some(match id {
            StoreId::Own => return None,
            StoreId::Namespaced { namespace, name } => self
                .pet_store(namespace, name)
                .map(|store| store.metadata.generation.unwrap_or_default()),
            StoreId::Cluster { name } => self
                .cluster_pet_store(name)
                .map(|store| store.metadata.generation.unwrap_or_default()),
        })
    }
}

/// Why an open store is closed, if it is: its object (`Some(None)`) is
/// gone, its spec changed since it was opened (`Some(Some(generation))`
/// unlike `opened`), or no Pet has used it for [`IDLE_CLOSE`].
fn close_reason(
    current: Option<Option<i64>>,
    opened: Option<i64>,
    unused_for: Duration,
) -> Option<&'static str> {
    match current {
        Some(None) => Some("its object is gone"),
        Some(Some(generation)) if generation != opened.unwrap_or_default() => {
            Some("its spec changed; the next Pet to use it opens it anew")
        }
        _ if unused_for >= IDLE_CLOSE => Some("no Pet has used it for 10 minutes"),
        _ => None,
    }
}

/// One open store: its channel, and a client per namespace on it.
struct Open {
    generation: Option<i64>,
    base: GrpcPetStore,
    /// The feed it reads, and the audience of its tokens.
    source: FeedSource,
    tenants: HashMap<String, Arc<dyn StoreClient>>,
    last_used: Instant,
}

pub struct Stores {
    /// The own store's client for calls made for no Pet: as the observer
    /// when it checks tenants.
    own: Arc<dyn StoreClient>,
    own_tenancy: Option<OwnTenancy>,
    client: Client,
    minter: Arc<TokenMinter>,
    /// `None` where the store kinds are not installed: every Pet uses the
    /// operator's own store, and one that names a store is held.
    caches: Option<Caches>,
    open: Mutex<HashMap<StoreId, Open>>,
    /// The channels of the open stores, shared by the objects naming one
    /// endpoint.
    channels: Mutex<ChannelPool<GrpcPetStore>>,
    settings: ClientSettings,
    metrics: StoreCallMetrics,
    changed: broadcast::Sender<Changed>,
    /// Changed under the `open` lock, so it always names the open clients.
    feeds: watch::Sender<Feeds>,
}

impl Stores {
    /// Starts the watch caches (when the store kinds are installed) for the
    /// process's life.
    pub async fn start(
        client: Client,
        own: GrpcPetStore,
        settings: ClientSettings,
        metrics: StoreCallMetrics,
    ) -> Arc<Self> {
        let minter = Arc::new(TokenMinter::new(client.clone(), metrics.clone()));
        let (own, own_tenancy): (Arc<dyn StoreClient>, _) =
            match (&settings.own_audience, &settings.observer) {
                (Some(audience), Some(observer)) => {
                    let as_observer =
                        TenantCredentials::observer(Arc::clone(&minter), observer, audience);
                    (
                        Arc::new(own.for_caller(Arc::new(as_observer))),
                        Some(OwnTenancy {
                            base: own,
                            audience: audience.clone(),
                            tenants: Mutex::default(),
                        }),
                    )
                }
                _ => (Arc::new(own), None),
            };
        let (changed, _) = broadcast::channel(256);
        let installed = kinds_installed(&client).await;
        let caches = installed.then(|| Caches {
            listed: AtomicBool::new(false),
            pet_stores: cache(
                Api::<PetStore>::all(client.clone()),
                &changed,
                |store| Changed::Namespace(store.namespace().unwrap_or_default()),
                spec_generation,
            ),
            cluster_stores: cache(
                Api::<ClusterPetStore>::all(client.clone()),
                &changed,
                |_| Changed::Cluster,
                spec_generation,
            ),
            namespaces: cache(
                Api::<Namespace>::all(client.clone()),
                &changed,
                |namespace| Changed::Namespace(namespace.name_any()),
                labels_hash,
            ),
        });
        if !installed {
            info!(
                "the PetStore and ClusterPetStore kinds are not installed: every Pet uses the operator's own store"
            );
        }
        Arc::new(Self {
            own,
            own_tenancy,
            minter,
            client,
            caches,
            open: Mutex::default(),
            channels: Mutex::default(),
            settings,
            metrics,
            changed,
            feeds: watch::Sender::default(),
        })
    }

    /// Where the store kinds are not watched (tests, `kubectl petstore`):
    /// every Pet uses `own`.
    pub fn own_only(client: Client, own: Arc<dyn StoreClient>) -> Arc<Self> {
        let (changed, _) = broadcast::channel(1);
        Arc::new(Self {
            own,
            own_tenancy: None,
            minter: Arc::new(TokenMinter::new(
                client.clone(),
                StoreCallMetrics::default(),
            )),
            client,
            caches: None,
            open: Mutex::default(),
            channels: Mutex::default(),
            settings: ClientSettings {
                call_timeout: Duration::from_secs(10),
                qps: 0.0,
                burst: 0,
                concurrency: ConcurrencyLimit::default(),
                create_batch_wait: Duration::ZERO,
                observer: None,
                own_audience: None,
                status_interval: Duration::from_secs(30),
            },
            metrics: StoreCallMetrics::default(),
            changed,
            feeds: watch::Sender::default(),
        })
    }

    /// The operator's own store, for calls made for no Pet.
    pub fn own(&self) -> &Arc<dyn StoreClient> {
        &self.own
    }

    /// The own store's client for a Pet of `namespace`.
    fn own_for(&self, namespace: &str) -> Arc<dyn StoreClient> {
        let Some(tenancy) = &self.own_tenancy else {
            return Arc::clone(&self.own);
        };
        let mut tenants = tenancy
            .tenants
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let tenant = tenants.entry(namespace.to_owned()).or_insert_with(|| {
            let credentials =
                TenantCredentials::new(Arc::clone(&self.minter), namespace, &tenancy.audience);
            Arc::new(tenancy.base.for_caller(Arc::new(credentials)))
        });
        Arc::clone(tenant)
    }

    /// The operator's own ServiceAccount, whose tokens read the feeds.
    pub fn observer(&self) -> Option<&ObserverAccount> {
        self.settings.observer.as_ref()
    }

    /// The open stores' change feeds, one per [`FeedSource`], as the store
    /// objects open and close: what the feed followers follow
    /// (`controller/feed.rs`).
    pub fn feeds(&self) -> watch::Receiver<Feeds> {
        self.feeds.subscribe()
    }

    /// The stores in `used` (that have Pets) stay open: a Pet whose store's
    /// feed is followed is only audited, so it may not call for hours.
    pub fn keep_open(&self, used: &HashSet<StoreId>) {
        let now = Instant::now();
        for (id, store) in self.lock_open().iter_mut() {
            if used.contains(id) {
                store.last_used = now;
            }
        }
    }

    /// Changes a held Pet may be waiting on.
    pub fn subscribe(&self) -> broadcast::Receiver<Changed> {
        self.changed.subscribe()
    }

    /// The store `pet` uses and its client: see [`resolve`].
    pub async fn for_pet(&self, pet: &Pet) -> Result<ForPet, Refused> {
        let namespace = pet.namespace().unwrap_or_default();
        let pinned = resolve::pinned(pet)?;
        let store_ref = pet.spec.store_ref.as_ref();
        let Some(caches) = &self.caches else {
            return match (store_ref, &pinned) {
                (None, None | Some(StoreId::Own)) => Ok(ForPet {
                    id: StoreId::Own,
                    store: self.own_for(&namespace),
                }),
                _ => Err(Refused {
                    reason: Reason::StoreNotFound,
                    message: "the Pet names a store, and the PetStore and ClusterPetStore kinds are not installed (config/crd)".into(),
                }),
            };
        };
        // Until their first list, a named store would look missing, and a
        // namespace's default absent: hold the Pet rather than guess.
        if !caches.listed.load(Ordering::Relaxed) {
            let both = async {
                listed(&caches.pet_stores).await;
                listed(&caches.cluster_stores).await;
            };
            if tokio::time::timeout(CACHE_WAIT, both).await.is_err() {
                return Err(Refused {
                    reason: Reason::StoreNotFound,
                    message: "the PetStores and ClusterPetStores are not listed yet; retrying"
                        .into(),
                });
            }
            // Once listed, a reconcile no longer waits or sets a timer.
            caches.listed.store(true, Ordering::Relaxed);
        }
        match resolve::resolve(&namespace, store_ref, pinned.as_ref(), caches)? {
            Resolved::Own => Ok(ForPet {
                id: StoreId::Own,
                store: self.own_for(&namespace),
            }),
            Resolved::Store { id, endpoint } => {
                let store = self.client_for(&id, &endpoint, &namespace).await?;
                Ok(ForPet { id, store })
            }
        }
    }

    /// The client of store `id` for `namespace`, opening the store on its
    /// first use or after its spec changed.
    async fn client_for(
        &self,
        id: &StoreId,
        endpoint: &Endpoint,
        namespace: &str,
    ) -> Result<Arc<dyn StoreClient>, Refused> {
        {
            let mut open = self.lock_open();
            if let Some(store) = open.get_mut(id)
                && store.generation == endpoint.generation
            {
                store.last_used = Instant::now();
                let tenant = store
                    .tenants
                    .entry(namespace.to_owned())
                    .or_insert_with(|| {
                        let credentials = TenantCredentials::new(
                            Arc::clone(&self.minter),
                            namespace,
                            &store.source.audience,
                        );
                        Arc::new(store.base.for_caller(Arc::new(credentials)))
                    });
                return Ok(Arc::clone(tenant));
            }
        }
        let ca = match &endpoint.ca {
            Some((ca_namespace, source)) => Some(self.read_ca(ca_namespace, source).await?),
            None => None,
        };
        let key = ChannelKey {
            address: endpoint.address.clone(),
            ca: ca.clone(),
            server_name: endpoint.server_name.clone(),
        };
        let source = FeedSource {
            channel: key.clone(),
            audience: endpoint.audience.clone(),
        };
        let base = self
            .lock_channels()
            .join(key, id, || {
                GrpcPetStore::connect_lazy_pem(
                    &endpoint.address,
                    self.settings.call_timeout,
                    ca.as_deref(),
                    endpoint.server_name.as_deref(),
                    self.metrics.clone(),
                )
                .map(|base| {
                    let limiter = StoreLimiter::new(
                        self.settings.concurrency,
                        self.settings.qps,
                        self.settings.burst,
                    )
                    .showing_in(self.metrics.limits_of(&endpoint.address));
                    base.with_limiter(limiter)
                        .with_create_batching(self.settings.create_batch_wait)
                })
            })
            .map_err(|error| Refused {
                reason: Reason::StoreNotFound,
                message: format!("{id} cannot be used: {error}"),
            })?
            .on_same_channel();
        info!(store = %id, address = %endpoint.address, "opening a store");
        let mut open = self.lock_open();
        // The objects reading one feed note their writes together, so each
        // one's echo is met on it in O(1) (see crate::store::echoes). An
        // object opened again on its feed keeps noting where it did: the
        // feed goes on with the client it had.
        let base = match open.values().find(|peer| peer.source == source) {
            Some(peer) => base.noting_writes_with(&peer.base),
            None => base,
        };
        let credentials =
            TenantCredentials::new(Arc::clone(&self.minter), namespace, &endpoint.audience);
        let tenant: Arc<dyn StoreClient> = Arc::new(base.for_caller(Arc::new(credentials)));
        let feed = self.settings.observer.as_ref().map(|account| {
            let observer =
                TenantCredentials::observer(Arc::clone(&self.minter), account, &endpoint.audience);
            Arc::new(base.for_caller(Arc::new(observer))) as Arc<dyn StoreClient>
        });
        open.insert(
            id.clone(),
            Open {
                generation: endpoint.generation,
                base,
                source: source.clone(),
                tenants: HashMap::from([(namespace.to_owned(), Arc::clone(&tenant))]),
                last_used: Instant::now(),
            },
        );
        self.feeds.send_modify(|feeds| match feed {
            Some(feed) => join_feed(feeds, source, id, feed),
            None => leave_feed(feeds, id),
        });
        Ok(tenant)
    }

    fn lock_open(&self) -> std::sync::MutexGuard<'_, HashMap<StoreId, Open>> {
        self.open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Taken alone, or after [`Stores::lock_open`], never before it.
    fn lock_channels(&self) -> std::sync::MutexGuard<'_, ChannelPool<GrpcPetStore>> {
        self.channels
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Closes the stores no Pet has used for [`IDLE_CLOSE`], every minute,
    /// until `stop`.
    pub async fn close_idle_until(&self, stop: tokio_util::sync::CancellationToken) {
        let mut every = tokio::time::interval(Duration::from_secs(60));
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = every.tick() => self.close_idle(),
            };
        }
    }

    /// Closes the stores no Pet has used for [`IDLE_CLOSE`], and those
    /// whose object is gone or changed (see [`close_reason`]); returns how
    /// many are still open.
    fn close_idle(&self) -> usize {
        let mut open = self.lock_open();
        let mut closed = Vec::new();
        open.retain(|id, store| {
            let current = self
                .caches
                .as_ref()
                .and_then(|caches| caches.generation(id));
            let Some(why) = close_reason(current, store.generation, store.last_used.elapsed())
            else {
                return true;
            };
            info!(store = %id, "closing a store: {why}");
            closed.push(id.clone());
            false
        });
        if !closed.is_empty() {
            let mut channels = self.lock_channels();
            for id in &closed {
                channels.leave(id);
            }
            drop(channels);
            self.feeds.send_modify(|feeds| {
                for id in &closed {
                    leave_feed(feeds, id);
                }
            });
        }
        open.len()
    }

    /// The PEM of a store's CA, from its Secret or ConfigMap.
    async fn read_ca(&self, namespace: &str, source: &CaSource) -> Result<Vec<u8>, Refused> {
        match self.client.ca_data(namespace, source).await {
            Ok(data) => caller::ca_pem(namespace, source, data.as_ref()),
            Err(error) => Err(Refused {
                reason: Reason::StoreTrustMissing,
                message: format!(
                    "reading {}: {error}",
                    caller::ca_described(namespace, source)
                ),
            }),
        }
    }
}

/// Whether the API server serves the store kinds.
async fn kinds_installed(client: &Client) -> bool {
    let api: Api<ClusterPetStore> = Api::all(client.clone());
    match api.list_metadata(&ListParams::default().limit(1)).await {
        Ok(_) => true,
        Err(kube::Error::Api(status)) if status.code == 404 => false,
        Err(error) => {
            // Forbidden, say: the Pets that name stores will say so.
            warn!(%error, "cannot list ClusterPetStores; assuming the store kinds are installed");
            true
        }
    }
}

/// What a hold reads of a store object: its spec, whose every change bumps
/// the generation (a status write does not).
fn spec_generation<K: kube::Resource>(object: &K) -> u64 {
    object
        .meta()
        .generation
        .and_then(|generation| u64::try_from(generation).ok())
        .unwrap_or_default()
}

/// What a hold reads of a namespace: its labels, which `allowedNamespaces`
/// selects by.
fn labels_hash(namespace: &Namespace) -> u64 {
    use std::hash::{Hash as _, Hasher as _};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    namespace.labels().hash(&mut hasher);
    hasher.finish()
}

/// A watch cache of `api`'s objects, told to `changed` as `what` says when
/// an object is new or its `matters` differs. Not on every event: the
/// stores' status writer writes each store's Pet count as Pets come, and
/// each write woke every held Pet again (a `ClusterPetStore`'s, every held
/// Pet in the cluster), seconds of queue in the attack matrix.
fn cache<K>(
    api: Api<K>,
    changed: &broadcast::Sender<Changed>,
    what: fn(&K) -> Changed,
    matters: fn(&K) -> u64,
) -> reflector::Store<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let changed = changed.clone();
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .modify(|object| object.managed_fields_mut().clear())
        .reflect(writer);
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        let mut last = LastMatters::default();
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::Apply(object) | watcher::Event::InitApply(object)) => {
                    if last.changed(&object, matters(&object)) {
                        // Nobody listening is fine: no Pet is held.
                        let _ = changed.send(what(&object));
                    }
                }
                Ok(watcher::Event::Delete(object)) => last.forget(&object),
                Ok(watcher::Event::Init | watcher::Event::InitDone) => {}
                Err(error) => warn!(%error, kind = %K::kind(&()), "watching a store kind"),
            }
        }
    });
    reader
}

/// What each object's `matters` last was, by uid.
#[derive(Default)]
struct LastMatters(HashMap<String, u64>);

impl LastMatters {
    /// Whether `object` is new, or what matters of it differs from before.
    fn changed<K: kube::Resource>(&mut self, object: &K, matters: u64) -> bool {
        let Some(uid) = object.meta().uid.clone() else {
            return true;
        };
        self.0.insert(uid, matters) != Some(matters)
    }

    fn forget<K: kube::Resource>(&mut self, object: &K) {
        if let Some(uid) = &object.meta().uid {
            self.0.remove(uid);
        }
    }
}

/// How often [`listed`] asks again.
const LISTED_RECHECK: Duration = Duration::from_millis(500);

/// Waits until `cache` has listed its objects (or its writer is gone).
/// Asked again every [`LISTED_RECHECK`]: kube's readiness signal wakes only
/// the last of the tasks waiting on one cache at once, and the reconciles
/// wait on the store kinds' caches too.
pub(crate) async fn listed<K>(cache: &reflector::Store<K>)
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    while tokio::time::timeout(LISTED_RECHECK, cache.wait_until_ready())
        .await
        .is_err()
    {}
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stores with `ids` open (never dialled), as their first Pets left
    /// them, and the feeds they publish, each on an endpoint of its own.
    fn open_stores(ids: &[StoreId]) -> Arc<Stores> {
        let (service, _handle) = tower_test::mock::pair::<
            http::Request<kube::client::Body>,
            http::Response<kube::client::Body>,
        >();
        let client = Client::new(service, "default");
        let own: Arc<dyn StoreClient> = Arc::new(crate::store::fake::FakeStore::default());
        let stores = Stores::own_only(client, own);
        for (i, id) in ids.iter().enumerate() {
            let base = GrpcPetStore::connect_lazy_pem(
                "127.0.0.1:1",
                Duration::from_secs(1),
                None,
                None,
                StoreCallMetrics::default(),
            )
            .expect("an address");
            let feed: Arc<dyn StoreClient> = Arc::new(base.clone());
            let source = FeedSource {
                channel: ChannelKey {
                    address: format!("127.0.0.1:{}", i + 1),
                    ca: None,
                    server_name: None,
                },
                audience: "petstore".into(),
            };
            stores.lock_open().insert(
                id.clone(),
                Open {
                    generation: Some(1),
                    base,
                    source: source.clone(),
                    tenants: HashMap::new(),
                    last_used: Instant::now(),
                },
            );
            stores
                .feeds
                .send_modify(|feeds| join_feed(feeds, source, id, feed));
        }
        stores
    }

    /// The wiring of [`channels`]: 40 `PetStore/default`s naming one
    /// store, each opened by a Pet of its namespace, make 2 channels (a
    /// connection each), not 40; closed, they leave none.
    #[tokio::test]
    async fn store_objects_naming_one_endpoint_share_channels_and_close_them() {
        let stores = open_stores(&[]);
        let endpoint = Endpoint {
            address: "127.0.0.1:1".into(),
            audience: "petstore".into(),
            ca: None,
            server_name: None,
            generation: Some(1),
        };
        let ids: Vec<StoreId> = (0..40)
            .map(|i| StoreId::namespaced(&format!("team-{i}"), "default"))
            .collect();
        for (i, id) in ids.iter().enumerate() {
            stores
                .client_for(id, &endpoint, &format!("team-{i}"))
                .await
                .expect("opened");
        }
        assert_eq!(stores.lock_open().len(), 40);
        assert_eq!(stores.lock_channels().len(), 2);
        // Their objects are gone: every store closes, with its channel.
        tokio::time::pause();
        tokio::time::advance(IDLE_CLOSE).await;
        assert_eq!(stores.close_idle(), 0);
        assert!(stores.lock_channels().is_empty());
    }

    /// The feed groups: (address, audience, members), sorted.
    fn feed_groups(stores: &Stores) -> Vec<(String, String, Vec<StoreId>)> {
        let mut groups: Vec<_> = stores
            .feeds()
            .borrow()
            .iter()
            .map(|(source, group)| {
                (
                    source.channel.address.clone(),
                    source.audience.clone(),
                    group.members.iter().cloned().collect(),
                )
            })
            .collect();
        groups.sort();
        groups
    }

    /// Store objects naming one endpoint with one audience share one feed;
    /// another endpoint, or another audience on the same one (whose token
    /// the store may answer otherwise), is a feed of its own. Members join
    /// and leave as they open, move and close.
    #[tokio::test(start_paused = true)]
    async fn the_feeds_are_one_per_endpoint_and_audience() {
        let mut stores = open_stores(&[]);
        Arc::get_mut(&mut stores)
            .expect("not shared yet")
            .settings
            .observer = Some(ObserverAccount {
            namespace: "petstore-system".into(),
            name: "petstore-operator".into(),
        });
        let endpoint = |address: &str, audience: &str, generation: i64| Endpoint {
            address: address.into(),
            audience: audience.into(),
            ca: None,
            server_name: None,
            generation: Some(generation),
        };
        let [a, b, c, d] = ["a", "b", "c", "d"].map(StoreId::cluster);
        let one = "127.0.0.1:1";
        let two = "127.0.0.1:2";
        for (id, address, audience) in [
            (&a, one, "petstore"),
            (&b, one, "petstore"),
            (&c, two, "petstore"),
            (&d, one, "other"),
        ] {
            stores
                .client_for(id, &endpoint(address, audience, 1), "team")
                .await
                .expect("opened");
        }
        let group = |address: &str, audience: &str, members: &[&StoreId]| {
            (
                address.to_owned(),
                audience.to_owned(),
                members.iter().map(|id| (*id).clone()).collect::<Vec<_>>(),
            )
        };
        assert_eq!(
            feed_groups(&stores),
            [
                group(one, "other", &[&d]),
                group(one, "petstore", &[&a, &b]),
                group(two, "petstore", &[&c]),
            ]
        );
        // The objects reading one feed note their writes together, for
        // their echoes on it; the others note their own.
        let notes_with = |x: &StoreId, y: &StoreId| {
            let open = stores.lock_open();
            open[x].base.notes_writes_with(&open[y].base)
        };
        assert!(notes_with(&a, &b));
        assert!(!notes_with(&a, &c));
        assert!(!notes_with(&a, &d));
        // d's spec changes, not its endpoint or audience: opened again, it
        // still notes where its feed's client does.
        let before = stores.lock_open()[&d].base.clone();
        stores
            .client_for(&d, &endpoint(one, "other", 2), "team")
            .await
            .expect("opened");
        assert!(stores.lock_open()[&d].base.notes_writes_with(&before));
        // c's new spec names the first endpoint: it joins that feed, and
        // its old one, left empty, goes.
        stores
            .client_for(&c, &endpoint(one, "petstore", 2), "team")
            .await
            .expect("opened");
        assert_eq!(
            feed_groups(&stores),
            [
                group(one, "other", &[&d]),
                group(one, "petstore", &[&a, &b, &c]),
            ]
        );
        // Closed, they leave; the last member takes its feed with it.
        for _ in 0..11 {
            tokio::time::sleep(Duration::from_secs(60)).await;
            stores.keep_open(&HashSet::from([b.clone()]));
        }
        assert_eq!(stores.close_idle(), 1);
        assert_eq!(feed_groups(&stores), [group(one, "petstore", &[&b])]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_store_with_pets_stays_open_and_an_unused_one_closes_with_its_feed() {
        let used = StoreId::cluster("used");
        let unused = StoreId::cluster("unused");
        let stores = open_stores(&[used.clone(), unused.clone()]);
        let feeds = stores.feeds();
        // Its Pets are only audited, hourly: no call for 11 minutes.
        for _ in 0..11 {
            tokio::time::sleep(Duration::from_secs(60)).await;
            stores.keep_open(&HashSet::from([used.clone()]));
        }
        assert_eq!(stores.close_idle(), 1);
        let followed: Vec<StoreId> = feeds
            .borrow()
            .values()
            .flat_map(|group| group.members.iter().cloned())
            .collect();
        assert_eq!(followed, [used], "the closed store's feed is gone with it");
    }

    #[test]
    fn held_pets_wake_on_a_new_spec_or_new_labels_never_on_a_status_write() {
        use crate::crd::ClusterPetStoreSpec;
        use crate::crd::StoreStatus;
        let store = |uid: &str, generation: i64, pets: i64| {
            let mut store = ClusterPetStore::new(
                "shared",
                ClusterPetStoreSpec {
                    address: "https://store:50051".into(),
                    tls: None,
                    audience: "petstore".into(),
                    allowed_namespaces: None,
                },
            );
            store.metadata.uid = Some(uid.into());
            store.metadata.generation = Some(generation);
            store.status = Some(StoreStatus {
                pets: Some(pets),
                ..StoreStatus::default()
            });
            store
        };
        let namespace = |uid: &str, team: &str, annotation: &str| {
            let mut namespace = Namespace::default();
            namespace.metadata.uid = Some(uid.into());
            namespace.metadata.labels = Some(BTreeMap::from([("team".into(), team.into())]));
            namespace.metadata.annotations =
                Some(BTreeMap::from([("note".into(), annotation.into())]));
            namespace
        };
        let mut stores = LastMatters::default();
        let mut wakes = |store: &ClusterPetStore| stores.changed(store, spec_generation(store));
        // (row, the event, wakes the held Pets)
        let rows = [
            ("a store first seen", store("a", 1, 0), true),
            ("its status written: a Pet count", store("a", 1, 40), false),
            (
                "listed again after a watch restart",
                store("a", 1, 40),
                false,
            ),
            ("its spec changed", store("a", 2, 40), true),
            ("another store", store("b", 1, 0), true),
        ];
        for (row, event, wake) in rows {
            assert_eq!(wakes(&event), wake, "{row}");
        }
        stores.forget(&store("a", 2, 40));
        assert!(
            stores.changed(&store("a", 2, 40), 2),
            "a store deleted and seen again is new"
        );

        let mut namespaces = LastMatters::default();
        let mut wakes = |ns: &Namespace| namespaces.changed(ns, labels_hash(ns));
        let rows = [
            ("a namespace first seen", namespace("n", "red", "x"), true),
            ("an annotation changed", namespace("n", "red", "y"), false),
            ("a label changed", namespace("n", "blue", "y"), true),
        ];
        for (row, event, wake) in rows {
            assert_eq!(wakes(&event), wake, "{row}");
        }
    }

    #[test]
    fn a_store_closes_when_unused_gone_or_changed() {
        let minute = Duration::from_secs(60);
        /// (row, its object's generation now, at opening, unused for, closed)
        type Row = (
            &'static str,
            Option<Option<i64>>,
            Option<i64>,
            Duration,
            bool,
        );
        let rows: [Row; 7] = [
            ("in use, unchanged", Some(Some(2)), Some(2), minute, false),
            (
                "unused for 10 minutes",
                Some(Some(2)),
                Some(2),
                IDLE_CLOSE,
                true,
            ),
            ("its object deleted", Some(None), Some(2), minute, true),
            ("its spec changed", Some(Some(3)), Some(2), minute, true),
            (
                "no generation either way",
                Some(Some(0)),
                None,
                minute,
                false,
            ),
            (
                "not listed yet: only idleness counts",
                None,
                Some(2),
                minute,
                false,
            ),
            ("not listed yet, idle", None, Some(2), IDLE_CLOSE, true),
        ];
        for (row, current, opened, unused_for, closed) in rows {
            assert_eq!(
                close_reason(current, opened, unused_for).is_some(),
                closed,
                "{row}"
            );
        }
    }
}
