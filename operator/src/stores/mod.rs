//! Many stores, one operator: which store each Pet uses, and a client for
//! it that carries the Pet's namespace's identity.
//!
//! - [`resolve`]: the pure rule: `spec.storeRef`, the namespace's default,
//!   or the store the Pet's record is already in;
//! - [`tokens`]: the namespace's ServiceAccount tokens each write carries;
//! - [`status`]: each store object's status (does it answer, its
//!   extensions, the Pets that use it), written by the leader;
//! - this module: the watch caches of `PetStore`, `ClusterPetStore` and
//!   Namespace that the rule reads, and the clients, opened on a store's
//!   first use, one per store and namespace over one channel per store,
//!   and closed when no Pet has used the store for a while.

pub mod resolve;
pub mod status;
pub mod tokens;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::{Api, ListParams};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Client, ResourceExt as _};
use tokio::sync::broadcast;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::crd::CaSource;
use crate::crd::{ClusterPetStore, Pet, PetStore};
use crate::status::Reason;
use crate::store::PetStore as StoreClient;
use crate::store::budget::CallBudget;
use crate::store::grpc::{GrpcPetStore, StoreCallMetrics};
use resolve::{Endpoint, Known};
pub use resolve::{Refused, Resolved, StoreId};
use tokens::{TenantCredentials, TokenMinter};

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
    pub create_batch_wait: Duration,
    /// How often each store's status is checked again (see [`status`]).
    pub status_interval: Duration,
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

/// One open store: its channel, and a client per namespace on it.
struct Open {
    generation: Option<i64>,
    base: GrpcPetStore,
    audience: String,
    tenants: HashMap<String, Arc<dyn StoreClient>>,
    last_used: Instant,
}

pub struct Stores {
    own: Arc<dyn StoreClient>,
    client: Client,
    minter: Arc<TokenMinter>,
    /// `None` where the store kinds are not installed: every Pet uses the
    /// operator's own store, and one that names a store is held.
    caches: Option<Caches>,
    open: Mutex<HashMap<StoreId, Open>>,
    settings: ClientSettings,
    metrics: StoreCallMetrics,
    changed: broadcast::Sender<Changed>,
}

impl Stores {
    /// Starts the watch caches (when the store kinds are installed) for the
    /// process's life.
    pub async fn start(
        client: Client,
        own: Arc<dyn StoreClient>,
        settings: ClientSettings,
        metrics: StoreCallMetrics,
    ) -> Arc<Self> {
        let (changed, _) = broadcast::channel(256);
        let installed = kinds_installed(&client).await;
        let caches = installed.then(|| Caches {
            listed: AtomicBool::new(false),
            pet_stores: cache(Api::<PetStore>::all(client.clone()), &changed, |store| {
                Changed::Namespace(store.namespace().unwrap_or_default())
            }),
            cluster_stores: cache(
                Api::<ClusterPetStore>::all(client.clone()),
                &changed,
                |_| Changed::Cluster,
            ),
            namespaces: cache(
                Api::<Namespace>::all(client.clone()),
                &changed,
                |namespace| Changed::Namespace(namespace.name_any()),
            ),
        });
        if !installed {
            info!(
                "the PetStore and ClusterPetStore kinds are not installed: every Pet uses the operator's own store"
            );
        }
        Arc::new(Self {
            own,
            minter: Arc::new(TokenMinter::new(client.clone())),
            client,
            caches,
            open: Mutex::default(),
            settings,
            metrics,
            changed,
        })
    }

    /// Where the store kinds are not watched (tests, `kubectl petstore`):
    /// every Pet uses `own`.
    pub fn own_only(client: Client, own: Arc<dyn StoreClient>) -> Arc<Self> {
        let (changed, _) = broadcast::channel(1);
        Arc::new(Self {
            own,
            minter: Arc::new(TokenMinter::new(client.clone())),
            client,
            caches: None,
            open: Mutex::default(),
            settings: ClientSettings {
                call_timeout: Duration::from_secs(10),
                qps: 0.0,
                burst: 0,
                create_batch_wait: Duration::ZERO,
                status_interval: Duration::from_secs(30),
            },
            metrics: StoreCallMetrics::default(),
            changed,
        })
    }

    /// The operator's own store.
    pub fn own(&self) -> &Arc<dyn StoreClient> {
        &self.own
    }

    /// Changes a held Pet may be waiting on.
    pub fn subscribe(&self) -> broadcast::Receiver<Changed> {
        self.changed.subscribe()
    }

    /// The store `pet` uses and its client: see [`resolve`].
    pub async fn for_pet(&self, pet: &Pet) -> Result<ForPet, Refused> {
        let namespace = pet.namespace().unwrap_or_default();
        let status = pet.status.as_ref();
        let pinned = match status.and_then(|status| status.store.as_deref()) {
            Some(value) => Some(StoreId::from_status(&namespace, Some(value)).ok_or_else(
                || Refused {
                    reason: Reason::StoreNotFound,
                    message: format!("status.store names {value:?}, which is no store kind"),
                },
            )?),
            // A record made before stores were resources is in the own one.
            None if status.is_some_and(|status| status.id.is_some()) => Some(StoreId::Own),
            None => None,
        };
        let store_ref = pet.spec.store_ref.as_ref();
        let Some(caches) = &self.caches else {
            return match (store_ref, &pinned) {
                (None, None | Some(StoreId::Own)) => Ok(ForPet {
                    id: StoreId::Own,
                    store: Arc::clone(&self.own),
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
            let listed = async {
                caches.pet_stores.wait_until_ready().await.ok();
                caches.cluster_stores.wait_until_ready().await.ok();
            };
            if tokio::time::timeout(CACHE_WAIT, listed).await.is_err() {
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
                store: Arc::clone(&self.own),
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
                            &store.audience,
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
        let base = GrpcPetStore::connect_lazy_pem(
            &endpoint.address,
            self.settings.call_timeout,
            ca.as_deref(),
            endpoint.server_name.as_deref(),
            self.metrics.clone(),
        )
        .map_err(|error| Refused {
            reason: Reason::StoreNotFound,
            message: format!("{id} cannot be used: {error}"),
        })?
        .with_budget(CallBudget::new(self.settings.qps, self.settings.burst))
        .with_create_batching(self.settings.create_batch_wait);
        info!(store = %id, address = %endpoint.address, "opening a store");
        let credentials =
            TenantCredentials::new(Arc::clone(&self.minter), namespace, &endpoint.audience);
        let tenant: Arc<dyn StoreClient> = Arc::new(base.for_caller(Arc::new(credentials)));
        let mut open = self.lock_open();
        open.insert(
            id.clone(),
            Open {
                generation: endpoint.generation,
                base,
                audience: endpoint.audience.clone(),
                tenants: HashMap::from([(namespace.to_owned(), Arc::clone(&tenant))]),
                last_used: Instant::now(),
            },
        );
        Ok(tenant)
    }

    fn lock_open(&self) -> std::sync::MutexGuard<'_, HashMap<StoreId, Open>> {
        self.open
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

    /// Closes the stores no Pet has used for [`IDLE_CLOSE`]; returns how
    /// many are still open.
    fn close_idle(&self) -> usize {
        let mut open = self.lock_open();
        open.retain(|id, store| {
            let keep = store.last_used.elapsed() < IDLE_CLOSE;
            if !keep {
                info!(store = %id, "closing a store no Pet has used for 10 minutes");
            }
            keep
        });
        open.len()
    }

    /// The PEM of a store's CA, from its Secret or ConfigMap.
    async fn read_ca(&self, namespace: &str, source: &CaSource) -> Result<Vec<u8>, Refused> {
        let missing = |what: String| Refused {
            reason: Reason::StoreTrustMissing,
            message: what,
        };
        let (kind, key_ref) = match source {
            CaSource::SecretKeyRef(key_ref) => ("Secret", key_ref),
            CaSource::ConfigMapKeyRef(key_ref) => ("ConfigMap", key_ref),
        };
        let what = format!("the store's CA {kind} {namespace}/{}", key_ref.name);
        let data = match source {
            CaSource::SecretKeyRef(_) => Api::<Secret>::namespaced(self.client.clone(), namespace)
                .get_opt(&key_ref.name)
                .await
                .map(|secret| {
                    secret.map(|s| s.data.unwrap_or_default().remove(&key_ref.key).map(|b| b.0))
                }),
            CaSource::ConfigMapKeyRef(_) => {
                Api::<ConfigMap>::namespaced(self.client.clone(), namespace)
                    .get_opt(&key_ref.name)
                    .await
                    .map(|map| {
                        map.map(|m| {
                            m.data
                                .unwrap_or_default()
                                .remove(&key_ref.key)
                                .map(String::into_bytes)
                        })
                    })
            }
        };
        let pem = match data {
            Err(error) => return Err(missing(format!("reading {what}: {error}"))),
            Ok(None) => return Err(missing(format!("{what} does not exist"))),
            Ok(Some(None)) => {
                return Err(missing(format!("{what} has no key {:?}", key_ref.key)));
            }
            Ok(Some(Some(pem))) => pem,
        };
        if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
            return Err(missing(format!(
                "the store's CA in namespace {namespace} is not a PEM certificate"
            )));
        }
        Ok(pem)
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

/// A watch cache of `api`'s objects, told to `changed` as `what` says.
fn cache<K>(
    api: Api<K>,
    changed: &broadcast::Sender<Changed>,
    what: fn(&K) -> Changed,
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
        .reflect(writer)
        .applied_objects();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            match event {
                // Nobody listening is fine: no Pet is held.
                Ok(object) => {
                    let _ = changed.send(what(&object));
                }
                Err(error) => warn!(%error, kind = %K::kind(&()), "watching a store kind"),
            }
        }
    });
    reader
}
