//! Which store a Pet uses: a pure function of the Pet's `spec.storeRef`,
//! the store its record is already in (`status.store`), and the store
//! objects and namespace labels the watch caches hold.
//!
//! A Pet without `storeRef` uses its namespace's default: the `PetStore`
//! named `default` in its namespace, else the `ClusterPetStore` named
//! `default`, else the operator's own store (`--petstore-addr`). A Pet that
//! has a record keeps the store it is in, whatever appears later, so a
//! default added to a namespace never splits a Pet across two stores.

use std::collections::BTreeMap;
use std::sync::Arc;

use kube::ResourceExt as _;

use crate::crd::{CaSource, StoreTls};
use crate::crd::{ClusterPetStore, Pet, PetStore, StoreKind, StoreRef};
use crate::status::Reason;

/// The name of the default store of a namespace, of either kind.
pub const DEFAULT_STORE: &str = "default";

/// A store, as `status.store` names it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StoreId {
    /// The operator's own store, from its flags: `status.store` unset.
    Own,
    /// A `PetStore`, which serves its own namespace only.
    Namespaced { namespace: String, name: String },
    /// A `ClusterPetStore`.
    Cluster { name: String },
}

impl StoreId {
    /// The PetStore `name` in `namespace`.
    pub fn namespaced(namespace: &str, name: &str) -> StoreId {
        StoreId::Namespaced {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }
    }

    /// The ClusterPetStore `name`.
    pub fn cluster(name: &str) -> StoreId {
        StoreId::Cluster {
            name: name.to_owned(),
        }
    }

    /// `status.store`'s value; `None` for the operator's own store.
    pub fn status_value(&self) -> Option<String> {
        match self {
            StoreId::Own => None,
            StoreId::Namespaced { name, .. } => Some(format!("PetStore/{name}")),
            StoreId::Cluster { name } => Some(format!("ClusterPetStore/{name}")),
        }
    }

    /// The store `status.store` names, for a Pet in `namespace`.
    pub fn from_status(namespace: &str, value: Option<&str>) -> Option<StoreId> {
        match value.filter(|value| !value.is_empty()) {
            None => Some(StoreId::Own),
            Some(value) => match value.split_once('/')? {
                ("PetStore", name) => Some(StoreId::namespaced(namespace, name)),
                ("ClusterPetStore", name) => Some(StoreId::cluster(name)),
                _ => None,
            },
        }
    }

    fn of(namespace: &str, store_ref: &StoreRef) -> StoreId {
        match store_ref.kind {
            StoreKind::PetStore => StoreId::namespaced(namespace, &store_ref.name),
            StoreKind::ClusterPetStore => StoreId::cluster(&store_ref.name),
        }
    }
}

impl std::fmt::Display for StoreId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreId::Own => f.write_str("the operator's own store"),
            StoreId::Namespaced { namespace, name } => write!(f, "PetStore {namespace}/{name}"),
            StoreId::Cluster { name } => write!(f, "ClusterPetStore {name}"),
        }
    }
}

/// Where to reach a store and what its tokens must carry.
#[derive(Clone, Debug, PartialEq)]
pub struct Endpoint {
    pub address: String,
    pub audience: String,
    /// The CA to trust, and in which namespace its Secret or ConfigMap is.
    pub ca: Option<(String, CaSource)>,
    pub server_name: Option<String>,
    /// The store object's generation: a changed spec opens a new client.
    pub generation: Option<i64>,
}

impl Endpoint {
    /// A PetStore's endpoint; its CA is in `namespace`, the store's own.
    pub fn of_pet_store(store: &PetStore, namespace: &str) -> Endpoint {
        let tls = store.spec.tls.as_ref();
        Endpoint {
            address: store.spec.address.clone(),
            audience: store.spec.audience.clone(),
            ca: tls
                .and_then(|tls| tls.ca.clone())
                .map(|ca| (namespace.to_owned(), ca)),
            server_name: tls.and_then(|tls| tls.server_name.clone()),
            generation: store.metadata.generation,
        }
    }

    /// A ClusterPetStore's endpoint; its CA names its own namespace.
    pub fn of_cluster_store(store: &ClusterPetStore) -> Endpoint {
        let tls = store.spec.tls.as_ref();
        Endpoint {
            address: store.spec.address.clone(),
            audience: store.spec.audience.clone(),
            ca: tls.and_then(StoreTls::ca_in_namespace),
            server_name: tls.and_then(|tls| tls.server_name.clone()),
            generation: store.metadata.generation,
        }
    }
}

/// The store a Pet uses.
#[derive(Clone, Debug, PartialEq)]
pub enum Resolved {
    Own,
    Store {
        id: StoreId,
        endpoint: Box<Endpoint>,
    },
}

impl Resolved {
    pub fn id(&self) -> StoreId {
        match self {
            Resolved::Own => StoreId::Own,
            Resolved::Store { id, .. } => id.clone(),
        }
    }
}

/// Why a Pet has no store to write to: held, with nothing written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    pub reason: Reason,
    pub message: String,
}

/// What the watch caches hold, as [`resolve`] reads it.
pub trait Known {
    fn pet_store(&self, namespace: &str, name: &str) -> Option<Arc<PetStore>>;
    fn cluster_pet_store(&self, name: &str) -> Option<Arc<ClusterPetStore>>;
    /// The namespace's labels; `None` for a namespace not (yet) known.
    fn namespace_labels(&self, namespace: &str) -> Option<BTreeMap<String, String>>;
}

/// The store a Pet in `namespace` uses; see the module.
pub fn resolve(
    namespace: &str,
    store_ref: Option<&StoreRef>,
    pinned: Option<&StoreId>,
    known: &impl Known,
) -> Result<Resolved, Refused> {
    let id = match (pinned, store_ref) {
        (Some(pinned), _) => pinned.clone(),
        (None, Some(store_ref)) => StoreId::of(namespace, store_ref),
        (None, None) => default_store(namespace, known),
    };
    endpoint_of(namespace, &id, known).map(|endpoint| match endpoint {
        None => Resolved::Own,
        Some(endpoint) => Resolved::Store {
            id,
            endpoint: Box::new(endpoint),
        },
    })
}

fn default_store(namespace: &str, known: &impl Known) -> StoreId {
    if known.pet_store(namespace, DEFAULT_STORE).is_some() {
        StoreId::namespaced(namespace, DEFAULT_STORE)
    } else if known.cluster_pet_store(DEFAULT_STORE).is_some() {
        StoreId::cluster(DEFAULT_STORE)
    } else {
        StoreId::Own
    }
}

fn endpoint_of(
    namespace: &str,
    id: &StoreId,
    known: &impl Known,
) -> Result<Option<Endpoint>, Refused> {
    match id {
        StoreId::Own => Ok(None),
        StoreId::Namespaced {
            namespace: store_namespace,
            name,
        } => {
            let Some(store) = known.pet_store(store_namespace, name) else {
                return Err(Refused {
                    reason: Reason::StoreNotFound,
                    message: format!(
                        "no PetStore {name:?} in namespace {store_namespace}; create it, or name another store in spec.storeRef"
                    ),
                });
            };
            Ok(Some(Endpoint::of_pet_store(&store, store_namespace)))
        }
        StoreId::Cluster { name } => {
            let Some(store) = known.cluster_pet_store(name) else {
                return Err(Refused {
                    reason: Reason::StoreNotFound,
                    message: format!(
                        "no ClusterPetStore {name:?}; create it, or name another store in spec.storeRef"
                    ),
                });
            };
            let labels = known.namespace_labels(namespace).unwrap_or_default();
            if !store.spec.admits(namespace, &labels) {
                return Err(Refused {
                    reason: Reason::StoreNotAllowed,
                    message: format!(
                        "ClusterPetStore {name:?} does not admit namespace {namespace}: its spec.allowedNamespaces names neither the namespace nor labels it has"
                    ),
                });
            }
            Ok(Some(Endpoint::of_cluster_store(&store)))
        }
    }
}

/// The store `status.store` pins a Pet to, as the operator reads it: a Pet
/// with a record but no `status.store` made it before stores were
/// resources, in the operator's own store.
pub fn pinned(pet: &Pet) -> Result<Option<StoreId>, Refused> {
    let namespace = pet.namespace().unwrap_or_default();
    let status = pet.status.as_ref();
    match status.and_then(|status| status.store.as_deref()) {
        Some(value) => StoreId::from_status(&namespace, Some(value))
            .map(Some)
            .ok_or_else(|| Refused {
                reason: Reason::StoreNotFound,
                message: format!("status.store names {value:?}, which is no store kind"),
            }),
        // A record made before stores were resources is in the own one.
        None if status.is_some_and(|status| status.id.is_some()) => Ok(Some(StoreId::Own)),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{AllowedNamespaces, ClusterPetStoreSpec, PetStoreSpec};

    #[derive(Default)]
    struct World {
        pet_stores: Vec<(String, String)>,
        cluster_stores: Vec<(String, Vec<String>)>,
    }

    impl Known for World {
        fn pet_store(&self, namespace: &str, name: &str) -> Option<Arc<PetStore>> {
            self.pet_stores
                .iter()
                .any(|(ns, n)| ns == namespace && n == name)
                .then(|| {
                    let mut store = PetStore::new(
                        name,
                        PetStoreSpec {
                            address: format!("http://{namespace}-{name}:1"),
                            tls: None,
                            audience: "petstore".into(),
                        },
                    );
                    store.metadata.namespace = Some(namespace.into());
                    Arc::new(store)
                })
        }

        fn cluster_pet_store(&self, name: &str) -> Option<Arc<ClusterPetStore>> {
            let (_, admits) = self.cluster_stores.iter().find(|(n, _)| n == name)?;
            Some(Arc::new(ClusterPetStore::new(
                name,
                ClusterPetStoreSpec {
                    address: format!("http://cluster-{name}:1"),
                    tls: None,
                    audience: "petstore".into(),
                    allowed_namespaces: (!admits.is_empty()).then(|| AllowedNamespaces {
                        names: admits.clone(),
                        selector: None,
                    }),
                },
            )))
        }

        fn namespace_labels(&self, _: &str) -> Option<BTreeMap<String, String>> {
            Some(BTreeMap::new())
        }
    }

    /// One row per rule: (why, namespace, storeRef, pinned, world, expected
    /// store or refusal reason).
    type Case<'a> = (
        &'a str,
        &'a str,
        Option<StoreRef>,
        Option<StoreId>,
        &'a World,
        Result<StoreId, Reason>,
    );

    #[test]
    fn which_store_a_pet_uses() {
        let world = World {
            pet_stores: vec![("a".into(), "default".into()), ("a".into(), "x".into())],
            cluster_stores: vec![
                ("default".into(), vec!["a".into(), "c".into()]),
                ("shared".into(), vec!["c".into()]),
                ("closed".into(), vec![]),
            ],
        };
        let bare = World::default();
        let cases: Vec<Case> = vec![
            (
                "no storeRef, no store objects: the operator's own",
                "a",
                None,
                None,
                &bare,
                Ok(StoreId::Own),
            ),
            (
                "no storeRef: the namespace's PetStore default first",
                "a",
                None,
                None,
                &world,
                Ok(StoreId::namespaced("a", "default")),
            ),
            (
                "no storeRef, no namespaced default: the ClusterPetStore default",
                "c",
                None,
                None,
                &world,
                Ok(StoreId::cluster("default")),
            ),
            (
                "the cluster default must admit the namespace",
                "b",
                None,
                None,
                &world,
                Err(Reason::StoreNotAllowed),
            ),
            (
                "storeRef names a PetStore of its namespace",
                "a",
                Some(StoreRef::new(StoreKind::PetStore, "x")),
                None,
                &world,
                Ok(StoreId::namespaced("a", "x")),
            ),
            (
                "another namespace's PetStore is not found from here",
                "b",
                Some(StoreRef::new(StoreKind::PetStore, "x")),
                None,
                &world,
                Err(Reason::StoreNotFound),
            ),
            (
                "a ClusterPetStore that admits the namespace",
                "c",
                Some(StoreRef::new(StoreKind::ClusterPetStore, "shared")),
                None,
                &world,
                Ok(StoreId::cluster("shared")),
            ),
            (
                "a ClusterPetStore that does not",
                "a",
                Some(StoreRef::new(StoreKind::ClusterPetStore, "shared")),
                None,
                &world,
                Err(Reason::StoreNotAllowed),
            ),
            (
                "allowedNamespaces unset admits none",
                "a",
                Some(StoreRef::new(StoreKind::ClusterPetStore, "closed")),
                None,
                &world,
                Err(Reason::StoreNotAllowed),
            ),
            (
                "a missing ClusterPetStore",
                "a",
                Some(StoreRef::new(StoreKind::ClusterPetStore, "nope")),
                None,
                &world,
                Err(Reason::StoreNotFound),
            ),
            (
                "a Pet with a record stays where it is: own, though a default appeared",
                "a",
                None,
                Some(StoreId::Own),
                &world,
                Ok(StoreId::Own),
            ),
            (
                "a Pet with a record stays in its PetStore",
                "a",
                None,
                Some(StoreId::namespaced("a", "x")),
                &world,
                Ok(StoreId::namespaced("a", "x")),
            ),
            (
                "its pinned store deleted: held, never moved",
                "b",
                None,
                Some(StoreId::namespaced("b", "gone")),
                &world,
                Err(Reason::StoreNotFound),
            ),
            (
                "pinned to a ClusterPetStore that stopped admitting it: held",
                "a",
                None,
                Some(StoreId::cluster("shared")),
                &world,
                Err(Reason::StoreNotAllowed),
            ),
        ];
        for (why, namespace, store_ref, pinned, known, expected) in cases {
            let got = resolve(namespace, store_ref.as_ref(), pinned.as_ref(), known)
                .map(|resolved| resolved.id())
                .map_err(|refused| refused.reason);
            assert_eq!(got, expected, "{why}");
        }
    }

    #[test]
    fn status_store_round_trips() {
        for id in [
            StoreId::Own,
            StoreId::namespaced("a", "x"),
            StoreId::cluster("c"),
        ] {
            let value = id.status_value();
            assert_eq!(StoreId::from_status("a", value.as_deref()), Some(id));
        }
        assert_eq!(StoreId::from_status("a", Some("Bogus/x")), None);
    }

    #[test]
    fn a_refusal_names_what_is_missing_and_what_to_do() {
        let refused = resolve(
            "b",
            Some(&StoreRef::new(StoreKind::PetStore, "x")),
            None,
            &World::default(),
        )
        .unwrap_err();
        assert!(
            refused.message.contains("no PetStore \"x\" in namespace b")
                && refused.message.contains("spec.storeRef"),
            "{}",
            refused.message
        );
    }
}
