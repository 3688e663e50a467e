//! `kubectl petstore` as the person who runs it: the store each Pet uses,
//! found by the operator's own rule ([`resolve`](super::resolve)) over the
//! store objects the caller may read, and a client that carries a token of
//! the Pet's namespace minted with the caller's kubeconfig. A user who may
//! not mint that token in a namespace gets no client for it, so the plugin
//! can read (or import into) only the namespaces its user may act for, and
//! nothing reaches the store on their behalf.
//!
//! What the plugin reads is read once per run: each store object, each
//! namespace, and one client per store and namespace, whose token is
//! minted again when it nears its end.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, ServiceAccount};
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt as _};
use tokio::time::Instant;
use tonic::codegen::http::HeaderValue;

use super::resolve::{self, Endpoint, Known, Refused, Resolved, StoreId};
use super::tokens::{TENANT_SERVICE_ACCOUNT, TOKEN_LIFETIME};
use crate::crd::{CaSource, ClusterPetStore, Pet, PetStore, StoreKind, StoreRef};
use crate::status::Reason;
use crate::store::Credentials;
use crate::store::grpc::{GrpcPetStore, StoreCallMetrics};

/// Why the plugin has no store client for a Pet or a namespace.
#[derive(Debug, thiserror::Error)]
pub enum CallerError {
    /// The operator would hold the Pet, for this reason.
    #[error("{}: {}", .0.reason, .0.message)]
    Refused(Refused),
    /// The caller's RBAC does not allow what the plugin must do as them.
    #[error("{0}")]
    Forbidden(String),
    /// The API server could not answer.
    #[error("{what}: {source}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
}

/// What the plugin reads and mints with the caller's kube client. `None`:
/// there is no such object (or kind).
pub trait AsCaller: Send + Sync {
    fn pet_store(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<PetStore>, kube::Error>> + Send;
    fn cluster_pet_store(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Option<ClusterPetStore>, kube::Error>> + Send;
    fn namespace_labels(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Option<BTreeMap<String, String>>, kube::Error>> + Send;
    /// The data of the Secret or ConfigMap `source` names in `namespace`.
    fn ca_data(
        &self,
        namespace: &str,
        source: &CaSource,
    ) -> impl Future<Output = Result<Option<BTreeMap<String, Vec<u8>>>, kube::Error>> + Send;
    /// A token of [`TENANT_SERVICE_ACCOUNT`] in `namespace` for `audience`.
    fn mint(
        &self,
        namespace: &str,
        audience: &str,
    ) -> impl Future<Output = Result<String, kube::Error>> + Send;
}

impl AsCaller for Client {
    async fn pet_store(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<PetStore>, kube::Error> {
        Api::<PetStore>::namespaced(self.clone(), namespace)
            .get_opt(name)
            .await
    }

    async fn cluster_pet_store(&self, name: &str) -> Result<Option<ClusterPetStore>, kube::Error> {
        Api::<ClusterPetStore>::all(self.clone())
            .get_opt(name)
            .await
    }

    async fn namespace_labels(
        &self,
        name: &str,
    ) -> Result<Option<BTreeMap<String, String>>, kube::Error> {
        let namespace = Api::<Namespace>::all(self.clone()).get_opt(name).await?;
        Ok(namespace.map(|namespace| namespace.labels().clone()))
    }

    async fn ca_data(
        &self,
        namespace: &str,
        source: &CaSource,
    ) -> Result<Option<BTreeMap<String, Vec<u8>>>, kube::Error> {
        let name = &source.key_ref().name;
        Ok(match source {
            CaSource::SecretKeyRef(_) => Api::<Secret>::namespaced(self.clone(), namespace)
                .get_opt(name)
                .await?
                .map(|secret| {
                    let data = secret.data.unwrap_or_default();
                    data.into_iter()
                        .map(|(key, value)| (key, value.0))
                        .collect()
                }),
            CaSource::ConfigMapKeyRef(_) => Api::<ConfigMap>::namespaced(self.clone(), namespace)
                .get_opt(name)
                .await?
                .map(|map| {
                    let data = map.data.unwrap_or_default();
                    data.into_iter()
                        .map(|(key, value)| (key, value.into_bytes()))
                        .collect()
                }),
        })
    }

    async fn mint(&self, namespace: &str, audience: &str) -> Result<String, kube::Error> {
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: vec![audience.to_owned()],
                expiration_seconds: Some(TOKEN_LIFETIME.as_secs() as i64),
                bound_object_ref: None,
            },
            ..TokenRequest::default()
        };
        let answer = Api::<ServiceAccount>::namespaced(self.clone(), namespace)
            .create_token_request(TENANT_SERVICE_ACCOUNT, &PostParams::default(), &request)
            .await?;
        Ok(answer.status.map(|status| status.token).unwrap_or_default())
    }
}

/// The `storeRef` that names `id` from a Pet of its namespace; `None` for
/// the operator's own store.
pub fn store_ref_of(id: &StoreId) -> Option<StoreRef> {
    match id {
        StoreId::Own => None,
        StoreId::Namespaced { name, .. } => Some(StoreRef::new(StoreKind::PetStore, name)),
        StoreId::Cluster { name } => Some(StoreRef::new(StoreKind::ClusterPetStore, name)),
    }
}

/// The store a Pet uses, and the client to reach it as its namespace.
#[derive(Clone)]
pub enum Chosen {
    /// The operator's own store: the plugin's `--petstore-addr`.
    Own,
    Store {
        id: StoreId,
        client: Box<GrpcPetStore>,
    },
}

/// One object as the caller's GET found it.
#[derive(Clone)]
enum Got<T> {
    Found(T),
    Absent,
    /// The caller may not read it: why, to say so.
    Forbidden(String),
}

impl<T: Clone> Got<T> {
    fn from(got: Result<Option<T>, kube::Error>, what: &str) -> Result<Self, CallerError> {
        match got {
            Ok(Some(found)) => Ok(Got::Found(found)),
            Ok(None) => Ok(Got::Absent),
            // A kind the API server does not serve answers 404 as a missing
            // object does: where the store kinds are not installed, no
            // store exists, and a Pet without storeRef uses the own store.
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(Got::Absent),
            Err(kube::Error::Api(status)) if status.code == 403 => Ok(Got::Forbidden(format!(
                "you may not get {what}, which kubectl petstore reads as you to find a Pet's store: {}",
                status.message
            ))),
            Err(source) => Err(CallerError::Api {
                what: format!("reading {what}"),
                source,
            }),
        }
    }
}

/// An object [`resolve`] asked for that has not been read yet.
enum Wanted {
    PetStore { namespace: String, name: String },
    ClusterPetStore(String),
    Namespace(String),
}

/// The objects read so far, as [`Known`]. A lookup of one not read yet
/// answers `None` and is noted, so [`CallerStores::resolve`] reads exactly
/// what the rule looks at and runs it again, until nothing is missing.
#[derive(Default)]
struct Seen {
    pet_stores: HashMap<(String, String), Got<Arc<PetStore>>>,
    cluster_stores: HashMap<String, Got<Arc<ClusterPetStore>>>,
    namespaces: HashMap<String, Got<BTreeMap<String, String>>>,
    wanted: Mutex<Vec<Wanted>>,
    /// The unreadable objects this pass looked at: (why, whether the
    /// answer depends on it whatever it is; a namespace's labels matter
    /// only to a refusal).
    unreadable: Mutex<Vec<(String, bool)>>,
}

impl Seen {
    fn look<T: Clone>(&self, got: Option<&Got<T>>, wanted: impl FnOnce() -> Wanted) -> Option<T> {
        self.look_as(got, wanted, true)
    }

    fn look_as<T: Clone>(
        &self,
        got: Option<&Got<T>>,
        wanted: impl FnOnce() -> Wanted,
        decisive: bool,
    ) -> Option<T> {
        match got {
            Some(Got::Found(found)) => Some(found.clone()),
            Some(Got::Absent) => None,
            Some(Got::Forbidden(why)) => {
                lock(&self.unreadable).push((why.clone(), decisive));
                None
            }
            None => {
                lock(&self.wanted).push(wanted());
                None
            }
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Known for Seen {
    fn pet_store(&self, namespace: &str, name: &str) -> Option<Arc<PetStore>> {
        let key = (namespace.to_owned(), name.to_owned());
        self.look(self.pet_stores.get(&key), || Wanted::PetStore {
            namespace: key.0.clone(),
            name: key.1.clone(),
        })
    }

    fn cluster_pet_store(&self, name: &str) -> Option<Arc<ClusterPetStore>> {
        self.look(self.cluster_stores.get(name), || {
            Wanted::ClusterPetStore(name.to_owned())
        })
    }

    fn namespace_labels(&self, namespace: &str) -> Option<BTreeMap<String, String>> {
        self.look_as(
            self.namespaces.get(namespace),
            || Wanted::Namespace(namespace.to_owned()),
            false,
        )
    }
}

/// A token minted once, for a short run: the plugin does not renew it.
/// A namespace's token for a store, minted as the caller: kept until a
/// fifth of its life is left, then minted again when a call needs it, and
/// at once after the store refuses it. So a run that outlasts one token
/// (an import of many records, say) goes on, as the operator's do.
struct CallerToken<C> {
    caller: Arc<C>,
    namespace: String,
    audience: String,
    /// The header, and when to mint the next.
    kept: tokio::sync::Mutex<Option<(HeaderValue, Instant)>>,
}

/// When a token minted at `asked` is renewed: at four fifths of the life
/// asked for, as the operator's tokens ([`super::tokens`]).
fn renew_at(asked: Instant) -> Instant {
    asked + TOKEN_LIFETIME.mul_f64(0.8)
}

impl<C: AsCaller> CallerToken<C> {
    /// The first token, minted now, so that a caller who may not mint it
    /// is told before anything reaches the store.
    async fn mint_first(
        caller: Arc<C>,
        namespace: &str,
        audience: &str,
    ) -> Result<Self, CallerError> {
        let asked = Instant::now();
        let header = mint_header(&*caller, namespace, audience).await?;
        Ok(Self {
            caller,
            namespace: namespace.to_owned(),
            audience: audience.to_owned(),
            kept: tokio::sync::Mutex::new(Some((header, renew_at(asked)))),
        })
    }
}

#[tonic::async_trait]
impl<C: AsCaller + 'static> Credentials for CallerToken<C> {
    async fn authorization(&self) -> Result<HeaderValue, String> {
        let mut kept = self.kept.lock().await;
        if let Some((header, renew)) = kept.as_ref()
            && Instant::now() < *renew
        {
            return Ok(header.clone());
        }
        let asked = Instant::now();
        let header = mint_header(&*self.caller, &self.namespace, &self.audience)
            .await
            .map_err(|error| error.to_string())?;
        *kept = Some((header.clone(), renew_at(asked)));
        Ok(header)
    }

    fn refused(&self) {
        // A call minting meanwhile holds the lock: it brings a fresh one.
        if let Ok(mut kept) = self.kept.try_lock() {
            *kept = None;
        }
    }
}

/// A `Bearer` header with a token of `namespace`'s `petstore-tenant` for
/// `audience`, minted as the caller.
async fn mint_header<C: AsCaller>(
    caller: &C,
    namespace: &str,
    audience: &str,
) -> Result<HeaderValue, CallerError> {
    let token = caller
        .mint(namespace, audience)
        .await
        .map_err(|error| mint_error(namespace, error))?;
    HeaderValue::try_from(format!("Bearer {token}")).map_err(|_| {
        CallerError::Refused(Refused {
            reason: Reason::StoreAccessDenied,
            message: format!(
                "the token minted for ServiceAccount {namespace}/{TENANT_SERVICE_ACCOUNT} is not a valid header value"
            ),
        })
    })
}

/// The address to dial for a store reached at `to` (`host:port`, or with
/// a scheme) rather than at its `spec.address`, and the name its
/// certificate must carry: still the one its spec gives (`tls.serverName`,
/// or the host of `spec.address`), so a port-forward changes the route and
/// never what is trusted. Without a scheme, `to` keeps the spec's. A store
/// without TLS (no CA, no server name) stays without.
pub fn redirected(endpoint: &Endpoint, to: &str) -> (String, Option<String>) {
    let (scheme, authority) = match endpoint.address.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, endpoint.address.as_str()),
    };
    let address = match (to.contains("://"), scheme) {
        (false, Some(scheme)) => format!("{scheme}://{to}"),
        _ => to.to_owned(),
    };
    let host = authority.split('/').next().unwrap_or_default();
    let host = match host.strip_prefix('[') {
        // [v6]:port
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map_or(host, |(host, _)| host),
    };
    let server_name = endpoint
        .server_name
        .clone()
        .or_else(|| (endpoint.ca.is_some() && !host.is_empty()).then(|| host.to_owned()));
    (address, server_name)
}

/// The stores the Pets of one plugin run use, found and reached as the
/// caller.
pub struct CallerStores<C> {
    caller: Arc<C>,
    call_timeout: Duration,
    seen: Seen,
    /// One channel per store.
    channels: HashMap<StoreId, GrpcPetStore>,
    /// One client (one token) per store and namespace.
    tenants: HashMap<(StoreId, String), GrpcPetStore>,
    /// The operator's own store and its audience, when it checks tenants
    /// (the operator's `--petstore-audience`).
    own: Option<(GrpcPetStore, String)>,
    /// Where to reach a store instead of its `spec.address`.
    addresses: HashMap<StoreId, String>,
}

impl<C: AsCaller + 'static> CallerStores<C> {
    pub fn new(caller: C, call_timeout: Duration) -> Self {
        Self {
            caller: Arc::new(caller),
            call_timeout,
            seen: Seen::default(),
            channels: HashMap::new(),
            tenants: HashMap::new(),
            own: None,
            addresses: HashMap::new(),
        }
    }

    /// Reaches each of these stores at its address here rather than at its
    /// `spec.address`: from outside the cluster, through `kubectl
    /// port-forward`. See [`redirected`].
    #[must_use]
    pub fn with_addresses(mut self, addresses: HashMap<StoreId, String>) -> Self {
        self.addresses = addresses;
        self
    }

    /// The operator's own store checks tenants with `audience`: its Pets
    /// are read with their namespace's token too, minted as the caller.
    #[must_use]
    pub fn with_own_tenancy(mut self, own: GrpcPetStore, audience: String) -> Self {
        self.own = Some((own, audience));
        self
    }

    /// The own store's client for `namespace`, when it checks tenants;
    /// `None` when it takes no tokens.
    pub async fn own_for(&mut self, namespace: &str) -> Result<Option<GrpcPetStore>, CallerError> {
        let Some((base, audience)) = self.own.clone() else {
            return Ok(None);
        };
        self.tenant(&StoreId::Own, base, &audience, namespace)
            .await
            .map(Some)
    }

    /// The store `pet` uses and its client, as the operator would choose
    /// it: `status.store`, else `spec.storeRef`, else the namespace's
    /// default.
    pub async fn for_pet(&mut self, pet: &Pet) -> Result<Chosen, CallerError> {
        let namespace = pet.namespace().unwrap_or_default();
        let pinned = resolve::pinned(pet).map_err(CallerError::Refused)?;
        let store_ref = pet.spec.store_ref.as_ref();
        match self.resolve(&namespace, store_ref, pinned.as_ref()).await? {
            Resolved::Own => match self.own_for(&namespace).await? {
                None => Ok(Chosen::Own),
                Some(client) => Ok(Chosen::Store {
                    id: StoreId::Own,
                    client: Box::new(client),
                }),
            },
            Resolved::Store { id, endpoint } => {
                let client = self.client(&id, &endpoint, &namespace).await?;
                Ok(Chosen::Store {
                    id,
                    client: Box::new(client),
                })
            }
        }
    }

    /// [`resolve::resolve`] over the objects the caller may read, each read
    /// once per run. An answer that depends on an object the caller may not
    /// read is an error, never a guess.
    pub async fn resolve(
        &mut self,
        namespace: &str,
        store_ref: Option<&StoreRef>,
        pinned: Option<&StoreId>,
    ) -> Result<Resolved, CallerError> {
        loop {
            lock(&self.seen.unreadable).clear();
            let answer = resolve::resolve(namespace, store_ref, pinned, &self.seen);
            let wanted = std::mem::take(&mut *lock(&self.seen.wanted));
            if wanted.is_empty() {
                let unreadable = std::mem::take(&mut *lock(&self.seen.unreadable));
                let refused_for_labels = matches!(
                    &answer,
                    Err(Refused {
                        reason: Reason::StoreNotAllowed,
                        ..
                    })
                );
                if let Some((why, _)) = unreadable
                    .into_iter()
                    .find(|(_, decisive)| *decisive || refused_for_labels)
                {
                    return Err(CallerError::Forbidden(why));
                }
                return answer.map_err(CallerError::Refused);
            }
            // Each pass reads what the last one missed; the rule looks at
            // a few objects, so this ends within a few passes.
            for wanted in wanted {
                self.read(wanted).await?;
            }
        }
    }

    async fn read(&mut self, wanted: Wanted) -> Result<(), CallerError> {
        match wanted {
            Wanted::PetStore { namespace, name } => {
                let what = format!("PetStore {namespace}/{name}");
                let got = self.caller.pet_store(&namespace, &name).await;
                let got = Got::from(got.map(|store| store.map(Arc::new)), &what)?;
                self.seen.pet_stores.insert((namespace, name), got);
            }
            Wanted::ClusterPetStore(name) => {
                let what = format!("ClusterPetStore {name}");
                let got = self.caller.cluster_pet_store(&name).await;
                let got = Got::from(got.map(|store| store.map(Arc::new)), &what)?;
                self.seen.cluster_stores.insert(name, got);
            }
            Wanted::Namespace(name) => {
                let what = format!(
                    "namespace {name} (its labels say whether a ClusterPetStore's selector admits it)"
                );
                let got = Got::from(self.caller.namespace_labels(&name).await, &what)?;
                self.seen.namespaces.insert(name, got);
            }
        }
        Ok(())
    }

    /// The client of store `id` for `namespace`: its channel (the CA read
    /// as the caller) and a token of the namespace minted as the caller,
    /// before anything is sent; one of each per store and namespace.
    pub async fn client(
        &mut self,
        id: &StoreId,
        endpoint: &Endpoint,
        namespace: &str,
    ) -> Result<GrpcPetStore, CallerError> {
        let key = (id.clone(), namespace.to_owned());
        if let Some(client) = self.tenants.get(&key) {
            return Ok(client.clone());
        }
        let base = match self.channels.get(id) {
            Some(base) => base.clone(),
            None => {
                let ca = match &endpoint.ca {
                    Some((ca_namespace, source)) => Some(self.ca(ca_namespace, source).await?),
                    None => None,
                };
                let (address, server_name) = match self.addresses.get(id) {
                    Some(to) => redirected(endpoint, to),
                    None => (endpoint.address.clone(), endpoint.server_name.clone()),
                };
                let base = GrpcPetStore::connect_lazy_pem(
                    &address,
                    self.call_timeout,
                    ca.as_deref(),
                    server_name.as_deref(),
                    StoreCallMetrics::default(),
                )
                .map_err(|error| {
                    CallerError::Refused(Refused {
                        reason: Reason::StoreNotFound,
                        message: format!("{id} cannot be used: {error}"),
                    })
                })?;
                self.channels.insert(id.clone(), base.clone());
                base
            }
        };
        self.tenant(id, base, &endpoint.audience, namespace).await
    }

    /// A client of `base` carrying a token of `namespace`'s
    /// `petstore-tenant` for `audience`, minted as the caller; one per store
    /// and namespace.
    async fn tenant(
        &mut self,
        id: &StoreId,
        base: GrpcPetStore,
        audience: &str,
        namespace: &str,
    ) -> Result<GrpcPetStore, CallerError> {
        let key = (id.clone(), namespace.to_owned());
        if let Some(client) = self.tenants.get(&key) {
            return Ok(client.clone());
        }
        let token = CallerToken::mint_first(Arc::clone(&self.caller), namespace, audience).await?;
        let client = base.for_caller(Arc::new(token));
        self.tenants.insert(key, client.clone());
        Ok(client)
    }

    /// The PEM of a store's CA, read as the caller.
    async fn ca(&self, namespace: &str, source: &CaSource) -> Result<Vec<u8>, CallerError> {
        match self.caller.ca_data(namespace, source).await {
            Ok(data) => ca_pem(namespace, source, data.as_ref()).map_err(CallerError::Refused),
            Err(kube::Error::Api(status)) if status.code == 403 => {
                Err(CallerError::Forbidden(format!(
                    "you may not get {}, which kubectl petstore reads as you to trust the store: {}",
                    ca_described(namespace, source),
                    status.message
                )))
            }
            Err(source_error) => Err(CallerError::Api {
                what: format!("reading {}", ca_described(namespace, source)),
                source: source_error,
            }),
        }
    }
}

/// What the caller can act on when a token cannot be minted as them: the
/// namespace, the ServiceAccount, and the RBAC that would allow it.
fn mint_error(namespace: &str, error: kube::Error) -> CallerError {
    let account = TENANT_SERVICE_ACCOUNT;
    match error {
        kube::Error::Api(status) if status.code == 403 => CallerError::Forbidden(format!(
            "you may not mint tokens for ServiceAccount {namespace}/{account}, so kubectl petstore may not read the store as namespace {namespace} ({}); it acts with your rights: to use namespace {namespace}, ask for a Role there that allows create on serviceaccounts/token for resourceNames [{account}], e.g. `kubectl create role petstore-tenant-token -n {namespace} --verb=create --resource=serviceaccounts/token --resource-name={account}` and a RoleBinding to you",
            status.message
        )),
        kube::Error::Api(status) if status.code == 404 => CallerError::Refused(Refused {
            reason: Reason::StoreAccessDenied,
            message: format!(
                "no ServiceAccount {namespace}/{account} to mint this namespace's store token from; create it (`kubectl create serviceaccount {account} -n {namespace}`)"
            ),
        }),
        source => CallerError::Api {
            what: format!("minting a token for ServiceAccount {namespace}/{account}"),
            source,
        },
    }
}

/// `the store's CA Secret team-a/ca`, for messages.
pub(super) fn ca_described(namespace: &str, source: &CaSource) -> String {
    let kind = match source {
        CaSource::SecretKeyRef(_) => "Secret",
        CaSource::ConfigMapKeyRef(_) => "ConfigMap",
    };
    format!(
        "the store's CA {kind} {namespace}/{}",
        source.key_ref().name
    )
}

/// The CA certificate from the data of the Secret or ConfigMap `source`
/// names (`None`: there is none), or what is missing: one rule for the
/// operator and the plugin.
pub(super) fn ca_pem(
    namespace: &str,
    source: &CaSource,
    data: Option<&BTreeMap<String, Vec<u8>>>,
) -> Result<Vec<u8>, Refused> {
    let what = ca_described(namespace, source);
    let missing = |message: String| Refused {
        reason: Reason::StoreTrustMissing,
        message,
    };
    let key = &source.key_ref().key;
    let data = data.ok_or_else(|| missing(format!("{what} does not exist")))?;
    let pem = data
        .get(key)
        .ok_or_else(|| missing(format!("{what} has no key {key:?}")))?;
    if !String::from_utf8_lossy(pem).contains("-----BEGIN CERTIFICATE-----") {
        return Err(missing(format!("{what}: {key:?} is not a PEM certificate")));
    }
    Ok(pem.clone())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_redirected_store_is_dialled_here_and_trusted_for_the_name_its_spec_gives() {
        use crate::crd::CaSource;
        let ca = Some((
            "team-a".to_owned(),
            CaSource::SecretKeyRef(crate::crd::KeyRef {
                name: "ca".into(),
                key: "ca.crt".into(),
            }),
        ));
        let endpoint =
            |address: &str, ca: &Option<(String, CaSource)>, name: Option<&str>| super::Endpoint {
                address: address.into(),
                audience: "petstore".into(),
                ca: ca.clone(),
                server_name: name.map(Into::into),
                generation: None,
            };
        let cases = [
            (
                "TLS: the spec's host is still the name checked",
                endpoint("https://petstore.team-a.svc:6742", &ca, None),
                "127.0.0.1:16742",
                ("https://127.0.0.1:16742", Some("petstore.team-a.svc")),
            ),
            (
                "TLS with a serverName: that name",
                endpoint("https://10.0.0.7:6742", &ca, Some("petstore")),
                "127.0.0.1:16742",
                ("https://127.0.0.1:16742", Some("petstore")),
            ),
            (
                "no scheme in the spec: none added",
                endpoint("petstore.team-a.svc:6742", &ca, None),
                "127.0.0.1:16742",
                ("127.0.0.1:16742", Some("petstore.team-a.svc")),
            ),
            (
                "an IPv6 host",
                endpoint("https://[fd00::7]:6742", &ca, None),
                "127.0.0.1:16742",
                ("https://127.0.0.1:16742", Some("fd00::7")),
            ),
            (
                "plaintext stays plaintext",
                endpoint("http://petstore.team-a.svc:6742", &None, None),
                "127.0.0.1:16742",
                ("http://127.0.0.1:16742", None),
            ),
            (
                "a scheme given here is kept",
                endpoint("http://petstore.team-a.svc:6742", &None, None),
                "http://localhost:9",
                ("http://localhost:9", None),
            ),
        ];
        for (why, endpoint, to, (address, name)) in cases {
            assert_eq!(
                super::redirected(&endpoint, to),
                (address.to_owned(), name.map(str::to_owned)),
                "{why}"
            );
        }
    }

    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::crd::{
        AllowedNamespaces, ClusterPetStoreSpec, KeyRef, PetStatus, PetStoreSpec, StoreTls,
    };

    fn forbidden() -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("nope", "Forbidden")
                .with_code(403)
                .boxed(),
        )
    }

    fn not_found() -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("not found", "NotFound")
                .with_code(404)
                .boxed(),
        )
    }

    /// A cluster as one caller sees it: the objects, which of them the
    /// caller may not read, and where it may mint tokens; every GET and
    /// mint counted.
    #[derive(Default)]
    struct World {
        pet_stores: Vec<(&'static str, &'static str)>,
        /// ClusterPetStores and the namespaces they admit by name.
        cluster_stores: Vec<(&'static str, Vec<&'static str>)>,
        /// What the caller may not GET: `kind/namespace/name`.
        unreadable: Vec<&'static str>,
        /// Namespaces where the caller may mint tokens.
        may_mint: Vec<&'static str>,
        /// The store kinds are not installed: every GET of them is a 404.
        no_store_kinds: bool,
        gets: AtomicUsize,
        mints: AtomicUsize,
    }

    impl World {
        fn get<T>(&self, what: &str, found: Option<T>) -> Result<Option<T>, kube::Error> {
            self.gets.fetch_add(1, Ordering::Relaxed);
            if self.unreadable.contains(&what) {
                return Err(forbidden());
            }
            Ok(found)
        }
    }

    impl AsCaller for World {
        async fn pet_store(
            &self,
            namespace: &str,
            name: &str,
        ) -> Result<Option<PetStore>, kube::Error> {
            if self.no_store_kinds {
                return Err(not_found());
            }
            let found = self.pet_stores.contains(&(namespace, name)).then(|| {
                let mut store = PetStore::new(
                    name,
                    PetStoreSpec {
                        address: "http://127.0.0.1:1".into(),
                        tls: None,
                        audience: "petstore".into(),
                    },
                );
                store.metadata.namespace = Some(namespace.into());
                store
            });
            self.get(&format!("PetStore/{namespace}/{name}"), found)
        }

        async fn cluster_pet_store(
            &self,
            name: &str,
        ) -> Result<Option<ClusterPetStore>, kube::Error> {
            if self.no_store_kinds {
                return Err(not_found());
            }
            let found = self
                .cluster_stores
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, admits)| {
                    ClusterPetStore::new(
                        name,
                        ClusterPetStoreSpec {
                            address: "http://127.0.0.1:1".into(),
                            tls: None,
                            audience: "petstore".into(),
                            allowed_namespaces: Some(AllowedNamespaces {
                                names: admits.iter().map(|n| (*n).to_owned()).collect(),
                                selector: None,
                            }),
                        },
                    )
                });
            self.get(&format!("ClusterPetStore//{name}"), found)
        }

        async fn namespace_labels(
            &self,
            name: &str,
        ) -> Result<Option<BTreeMap<String, String>>, kube::Error> {
            self.get(&format!("Namespace//{name}"), Some(BTreeMap::new()))
        }

        async fn ca_data(
            &self,
            namespace: &str,
            source: &CaSource,
        ) -> Result<Option<BTreeMap<String, Vec<u8>>>, kube::Error> {
            let name = &source.key_ref().name;
            let pem = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n".to_vec();
            let found = (name == "ca").then(|| BTreeMap::from([("ca.crt".to_owned(), pem)]));
            self.get(&format!("ConfigMap/{namespace}/{name}"), found)
        }

        async fn mint(&self, namespace: &str, _audience: &str) -> Result<String, kube::Error> {
            self.mints.fetch_add(1, Ordering::Relaxed);
            if self.may_mint.contains(&namespace) {
                Ok(format!("token-of-{namespace}"))
            } else {
                Err(forbidden())
            }
        }
    }

    fn pet(namespace: &str, store_ref: Option<&str>, store: Option<&str>) -> Pet {
        let mut pet = Pet::new(
            "rex",
            serde_json::from_value(serde_json::json!({
                "name": "Rex", "type": "dog", "birthday": "2021-04-01",
            }))
            .expect("a spec"),
        );
        pet.metadata.namespace = Some(namespace.into());
        pet.spec.store_ref = store_ref.map(|r| r.parse().expect("a storeRef"));
        if let Some(store) = store {
            pet.status = Some(PetStatus {
                store: Some(store.into()),
                ..Default::default()
            });
        }
        pet
    }

    /// What the plugin makes of a Pet: the store it uses, or the reason
    /// word it is refused with, or `Forbidden` when the caller's RBAC is
    /// what stops it.
    async fn chosen(stores: &mut CallerStores<World>, pet: &Pet) -> Result<StoreId, String> {
        match stores.for_pet(pet).await {
            Ok(Chosen::Own) => Ok(StoreId::Own),
            Ok(Chosen::Store { id, .. }) => Ok(id),
            Err(CallerError::Refused(refused)) => Err(refused.reason.to_string()),
            Err(CallerError::Forbidden(_)) => Err("Forbidden".into()),
            Err(CallerError::Api { what, .. }) => Err(format!("Api: {what}")),
        }
    }

    fn team() -> World {
        World {
            pet_stores: vec![("a", "default"), ("a", "x"), ("b", "x")],
            cluster_stores: vec![("default", vec!["c"]), ("shared", vec!["a", "c"])],
            may_mint: vec!["a", "c"],
            ..World::default()
        }
    }

    /// [`team`], but the caller may not GET `what` (`kind/namespace/name`).
    fn team_not_reading(what: &'static str) -> World {
        World {
            unreadable: vec![what],
            ..team()
        }
    }

    /// A cluster without the store kinds installed.
    fn without_store_kinds() -> World {
        World {
            no_store_kinds: true,
            ..World::default()
        }
    }

    #[tokio::test]
    async fn the_plugin_chooses_each_pets_store_as_the_operator_does_with_the_callers_rights() {
        type Case = (
            &'static str,
            World,
            &'static str,
            Option<&'static str>,
            Option<&'static str>,
            Result<StoreId, &'static str>,
        );
        let cases: Vec<Case> = vec![
            (
                "storeRef names a PetStore of its namespace",
                team(),
                "a",
                Some("PetStore/x"),
                None,
                Ok(StoreId::namespaced("a", "x")),
            ),
            (
                "no storeRef: the namespace's PetStore default",
                team(),
                "a",
                None,
                None,
                Ok(StoreId::namespaced("a", "default")),
            ),
            (
                "no PetStore default: the ClusterPetStore default that admits it",
                team(),
                "c",
                None,
                None,
                Ok(StoreId::cluster("default")),
            ),
            (
                "no default at all: the operator's own store",
                World::default(),
                "a",
                None,
                None,
                Ok(StoreId::Own),
            ),
            (
                "the store kinds not installed: the operator's own store",
                without_store_kinds(),
                "a",
                None,
                None,
                Ok(StoreId::Own),
            ),
            (
                "the store kinds not installed, a storeRef: StoreNotFound",
                without_store_kinds(),
                "a",
                Some("PetStore/x"),
                None,
                Err("StoreNotFound"),
            ),
            (
                "another namespace's PetStore is not found from here",
                team(),
                "c",
                Some("PetStore/x"),
                None,
                Err("StoreNotFound"),
            ),
            (
                "a ClusterPetStore that does not admit the namespace",
                team(),
                "b",
                Some("ClusterPetStore/shared"),
                None,
                Err("StoreNotAllowed"),
            ),
            (
                "the cluster default must admit the namespace too",
                World {
                    pet_stores: vec![],
                    ..team()
                },
                "a",
                None,
                None,
                Err("StoreNotAllowed"),
            ),
            (
                "a Pet with a record stays in the store status.store names",
                team(),
                "a",
                Some("PetStore/x"),
                Some("ClusterPetStore/shared"),
                Ok(StoreId::cluster("shared")),
            ),
            (
                "status.store naming no store kind",
                team(),
                "a",
                None,
                Some("Bogus/x"),
                Err("StoreNotFound"),
            ),
            (
                "a store found, but no token may be minted as the caller",
                team(),
                "b",
                Some("PetStore/x"),
                None,
                Err("Forbidden"),
            ),
            (
                "a PetStore the caller may not read: never taken as absent",
                team_not_reading("PetStore/a/x"),
                "a",
                Some("PetStore/x"),
                None,
                Err("Forbidden"),
            ),
            (
                "an unreadable PetStore default: the default is unknown, not skipped",
                team_not_reading("PetStore/a/default"),
                "a",
                None,
                None,
                Err("Forbidden"),
            ),
            (
                "the namespace's labels unreadable, but its name admits it",
                team_not_reading("Namespace//a"),
                "a",
                Some("ClusterPetStore/shared"),
                None,
                Ok(StoreId::cluster("shared")),
            ),
            (
                "the namespace's labels unreadable, and the name does not admit it",
                team_not_reading("Namespace//b"),
                "b",
                Some("ClusterPetStore/shared"),
                None,
                Err("Forbidden"),
            ),
        ];
        for (why, world, namespace, store_ref, store, expected) in cases {
            let mut stores = CallerStores::new(world, Duration::from_secs(1));
            let got = chosen(&mut stores, &pet(namespace, store_ref, store)).await;
            assert_eq!(got, expected.map_err(str::to_owned), "{why}");
        }
    }

    #[tokio::test]
    async fn one_read_per_object_and_one_token_per_store_and_namespace_per_run() {
        let mut stores = CallerStores::new(team(), Duration::from_secs(1));
        for _ in 0..3 {
            for (namespace, store_ref) in [("a", "PetStore/x"), ("a", "ClusterPetStore/shared")] {
                let id = chosen(&mut stores, &pet(namespace, Some(store_ref), None)).await;
                assert!(id.is_ok(), "{id:?}");
            }
        }
        // PetStore a/x, ClusterPetStore shared, namespace a.
        assert_eq!(stores.caller.gets.load(Ordering::Relaxed), 3);
        assert_eq!(stores.caller.mints.load(Ordering::Relaxed), 2);
        assert_eq!((stores.channels.len(), stores.tenants.len()), (2, 2));
    }

    /// A run longer than a token's life: the token is kept for four fifths
    /// of it, minted again on the first call after that, and at once after
    /// the store refuses it.
    #[tokio::test(start_paused = true)]
    async fn a_callers_token_is_minted_again_when_it_nears_its_end_or_is_refused() {
        let world = Arc::new(team());
        let token = CallerToken::mint_first(Arc::clone(&world), "a", "petstore")
            .await
            .map_err(|e| e.to_string())
            .expect("the caller may mint in a");
        let mints = || world.mints.load(Ordering::Relaxed);
        assert_eq!(mints(), 1, "minted before anything reaches the store");
        let first = token.authorization().await.expect("a header");
        assert_eq!(first, "Bearer token-of-a");
        tokio::time::advance(TOKEN_LIFETIME.mul_f64(0.8) - Duration::from_secs(1)).await;
        token.authorization().await.expect("a header");
        assert_eq!(mints(), 1, "kept until a fifth of its life is left");
        tokio::time::advance(Duration::from_secs(2)).await;
        token.authorization().await.expect("a header");
        assert_eq!(mints(), 2, "minted again past four fifths of its life");
        token.authorization().await.expect("a header");
        assert_eq!(mints(), 2, "and kept again");
        token.refused();
        token.authorization().await.expect("a header");
        assert_eq!(mints(), 3, "minted again at once after a refusal");
    }

    #[tokio::test]
    async fn a_caller_who_may_not_mint_gets_no_client_and_is_told_what_to_ask_for() {
        let mut stores = CallerStores::new(team(), Duration::from_secs(1));
        let error = stores
            .for_pet(&pet("b", Some("PetStore/x"), None))
            .await
            .err()
            .expect("refused");
        let message = error.to_string();
        crate::fixtures::assert_mentions(
            &message,
            &[
                "ServiceAccount b/petstore-tenant",
                "namespace b",
                "create on serviceaccounts/token",
                "--resource-name=petstore-tenant",
            ],
        );
        assert!(stores.tenants.is_empty(), "a client without a token");
    }

    #[test]
    fn a_missing_service_account_is_refused_with_the_operators_reason() {
        let error = mint_error("a", not_found());
        let CallerError::Refused(refused) = error else {
            panic!("not a refusal: {error}");
        };
        assert_eq!(refused.reason, Reason::StoreAccessDenied);
        assert!(
            refused
                .message
                .contains("kubectl create serviceaccount petstore-tenant -n a"),
            "{}",
            refused.message
        );
    }

    #[tokio::test]
    async fn the_stores_ca_is_read_as_the_caller() {
        let with_ca = |name: &str| {
            let mut store = PetStore::new(
                "tls",
                PetStoreSpec {
                    address: "https://127.0.0.1:1".into(),
                    tls: Some(StoreTls {
                        ca: Some(CaSource::ConfigMapKeyRef(KeyRef {
                            name: name.into(),
                            key: "ca.crt".into(),
                        })),
                        server_name: Some("petstore".into()),
                    }),
                    audience: "petstore".into(),
                },
            );
            store.metadata.namespace = Some("a".into());
            store
        };
        let id = StoreId::namespaced("a", "tls");
        type Case = (&'static str, &'static str, Vec<&'static str>, &'static str);
        let cases: Vec<Case> = vec![
            ("the CA is read, the token minted", "ca", vec![], "ok"),
            (
                "a missing CA: StoreTrustMissing",
                "gone",
                vec![],
                "StoreTrustMissing",
            ),
            (
                "a CA the caller may not read",
                "ca",
                vec!["ConfigMap/a/ca"],
                "Forbidden",
            ),
        ];
        for (why, ca_name, unreadable, expected) in cases {
            let mut stores = CallerStores::new(
                World {
                    unreadable,
                    ..team()
                },
                Duration::from_secs(1),
            );
            let got = match stores
                .client(&id, &Endpoint::of_pet_store(&with_ca(ca_name), "a"), "a")
                .await
            {
                Ok(_) => "ok".to_owned(),
                Err(CallerError::Refused(refused)) => refused.reason.to_string(),
                Err(CallerError::Forbidden(_)) => "Forbidden".to_owned(),
                Err(error) => error.to_string(),
            };
            assert_eq!(got, expected, "{why}");
        }
    }

    #[test]
    fn a_store_ref_names_the_store_it_was_resolved_to() {
        assert_eq!(store_ref_of(&StoreId::Own), None);
        assert_eq!(
            store_ref_of(&StoreId::namespaced("a", "x")).map(|r| r.to_string()),
            Some("PetStore/x".into())
        );
        assert_eq!(
            store_ref_of(&StoreId::cluster("shared")).map(|r| r.to_string()),
            Some("ClusterPetStore/shared".into())
        );
    }
}
