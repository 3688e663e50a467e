//! The guard on deleting a store that Pets use (`POST
//! /validate-store-deletion`, named by `config/operator/store-guard.yaml`):
//! a Pet's record lives in its store, and a store deleted under it leaves
//! the operator no way to keep, delete or release that record. So deleting
//! a PetStore or ClusterPetStore is refused while a Pet uses it, naming the
//! Pets.
//!
//! The same holds for a namespace's `petstore-tenant` ServiceAccount: the
//! calls for a Pet on a store that checks tenants carry its tokens, and
//! without it the Pet's finalizer cannot delete the record. Deleting a
//! namespace deletes its ServiceAccounts and Pets at once; refusing the
//! ServiceAccount until the Pets are gone lets their finalizers run first,
//! and the namespace then goes (the namespace controller retries).
//!
//! A Pet uses a store if its `spec.storeRef` names it, or its
//! `status.store` (the store the operator resolved) does. A PetStore is
//! used only by Pets of its own namespace: two PetStores of one name in two
//! namespaces never affect each other. A ClusterPetStore is used by Pets of
//! every namespace.
//!
//! A webhook, not a ValidatingAdmissionPolicy: a policy cannot look at
//! other objects. The decision is [`judge`], a pure function; the route
//! lists the Pets from the API server.

use std::future::Future;

use kube::ResourceExt;
use kube::api::Api;
use serde::Deserialize;
use serde_json::Value;

use super::{admission_answer as answer, admission_request, pets_by_page};
use crate::crd::{Pet, StoreKind, StoreRef};
use crate::stores::tokens::TENANT_SERVICE_ACCOUNT;

/// How many Pets a refusal names; it gives the total too.
pub const NAMED_PETS: usize = 5;

/// The store (or tenant ServiceAccount) whose deletion is asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeletedStore {
    PetStore {
        namespace: String,
        name: String,
    },
    ClusterPetStore {
        name: String,
    },
    /// The namespace's `petstore-tenant` ServiceAccount.
    TenantAccount {
        namespace: String,
    },
}

impl DeletedStore {
    /// How `spec.storeRef` and `status.store` name it; `None` for the
    /// tenant ServiceAccount, which every Pet on a store uses.
    fn store_ref(&self) -> Option<StoreRef> {
        match self {
            DeletedStore::PetStore { name, .. } => Some(StoreRef::new(StoreKind::PetStore, name)),
            DeletedStore::ClusterPetStore { name } => {
                Some(StoreRef::new(StoreKind::ClusterPetStore, name))
            }
            DeletedStore::TenantAccount { .. } => None,
        }
    }

    /// The namespace whose Pets may use it; `None` for every namespace.
    pub fn namespace(&self) -> Option<&str> {
        match self {
            DeletedStore::PetStore { namespace, .. }
            | DeletedStore::TenantAccount { namespace } => Some(namespace),
            DeletedStore::ClusterPetStore { .. } => None,
        }
    }

    /// `PetStore team-a/shared` or `ClusterPetStore shared`, for messages.
    fn describe(&self) -> String {
        match self {
            DeletedStore::PetStore { namespace, name } => format!("PetStore {namespace}/{name}"),
            DeletedStore::ClusterPetStore { name } => format!("ClusterPetStore {name}"),
            DeletedStore::TenantAccount { namespace } => {
                format!("ServiceAccount {namespace}/{TENANT_SERVICE_ACCOUNT}")
            }
        }
    }

    /// What the user can do about the Pets that use it.
    fn remedy(&self) -> &'static str {
        match self {
            DeletedStore::TenantAccount { .. } => {
                "their store calls carry its tokens: delete them first (a namespace being deleted deletes them, and this ServiceAccount goes after)"
            }
            _ => {
                "delete them or change their storeRef first (a Pet's storeRef can change only until it has a record)"
            }
        }
    }
}

/// What the guard reads of a Pet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PetUse {
    pub namespace: String,
    pub name: String,
    /// `spec.storeRef`.
    pub store_ref: Option<StoreRef>,
    /// `status.store`, as written.
    pub status_store: Option<String>,
}

impl PetUse {
    pub fn of(pet: &Pet) -> Self {
        Self {
            namespace: pet.namespace().unwrap_or_default(),
            name: pet.name_any(),
            store_ref: pet.spec.store_ref.clone(),
            status_store: pet.status.as_ref().and_then(|s| s.store.clone()),
        }
    }

    /// Whether this Pet uses `store`.
    pub fn uses(&self, store: &DeletedStore) -> bool {
        if store.namespace().is_some_and(|ns| ns != self.namespace) {
            return false;
        }
        let Some(wanted) = store.store_ref() else {
            // The tenant ServiceAccount: every Pet on a store other than
            // the operator's own (which takes no tokens).
            return self.store_ref.is_some() || self.status_store.is_some();
        };
        self.store_ref.as_ref() == Some(&wanted)
            || self
                .status_store
                .as_deref()
                .and_then(|text| text.parse::<StoreRef>().ok())
                .is_some_and(|resolved| resolved == wanted)
    }
}

/// Whether `store` may be deleted, given every Pet that might use it;
/// `Err` names the Pets that do (the first [`NAMED_PETS`], sorted, and the
/// total) and what to do.
pub fn judge(store: &DeletedStore, pets: &[PetUse]) -> Result<(), String> {
    let mut users: Vec<String> = pets
        .iter()
        .filter(|pet| pet.uses(store))
        .map(|pet| format!("{}/{}", pet.namespace, pet.name))
        .collect();
    if users.is_empty() {
        return Ok(());
    }
    users.sort();
    let total = users.len();
    let mut named = users[..total.min(NAMED_PETS)].join(", ");
    if total > NAMED_PETS {
        named.push_str(&format!(", and {} more", total - NAMED_PETS));
    }
    let pets = if total == 1 { "Pet" } else { "Pets" };
    Err(format!(
        "{} is used by {total} {pets} ({named}); {}",
        store.describe(),
        store.remedy()
    ))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Request {
    uid: String,
    #[serde(default)]
    kind: Kind,
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    operation: String,
    /// The object being deleted. A `deletecollection` (the namespace
    /// controller's way of emptying a namespace) is reviewed once per
    /// object with an empty `name`: the name is only here.
    #[serde(default)]
    old_object: Option<OldObject>,
}

#[derive(Deserialize, Default)]
struct OldObject {
    #[serde(default)]
    metadata: OldMetadata,
}

#[derive(Deserialize, Default)]
struct OldMetadata {
    #[serde(default)]
    name: String,
}

impl Request {
    /// The deleted object's name, from `oldObject` when `name` is empty.
    fn object_name(&self) -> String {
        if !self.name.is_empty() {
            return self.name.clone();
        }
        self.old_object
            .as_ref()
            .map(|old| old.metadata.name.clone())
            .unwrap_or_default()
    }
}

#[derive(Deserialize, Default)]
struct Kind {
    #[serde(default)]
    group: String,
    #[serde(default)]
    kind: String,
}

/// Answers one `AdmissionReview` body; `list` is called only for the
/// deletion of a store, with that store, and gives the Pets that might use
/// it. Never fails: what cannot be read, or Pets that cannot be listed,
/// refuse the deletion with the reason (a store kept a moment longer costs
/// nothing; one deleted under its Pets strands their records).
pub async fn review<F>(body: &[u8], list: impl FnOnce(DeletedStore) -> F) -> Value
where
    F: Future<Output = Result<Vec<PetUse>, String>>,
{
    let request: Request = match admission_request(body) {
        Ok(request) => request,
        Err(refused) => return refused,
    };
    let name = request.object_name();
    let store = match (
        request.operation.as_str(),
        request.kind.group.as_str(),
        request.kind.kind.as_str(),
    ) {
        ("DELETE", crate::crd::GROUP, "PetStore") => DeletedStore::PetStore {
            namespace: request.namespace.unwrap_or_default(),
            name,
        },
        ("DELETE", crate::crd::GROUP, "ClusterPetStore") => DeletedStore::ClusterPetStore { name },
        ("DELETE", "", "ServiceAccount") if name == TENANT_SERVICE_ACCOUNT => {
            DeletedStore::TenantAccount {
                namespace: request.namespace.unwrap_or_default(),
            }
        }
        // Not a store's deletion: the configuration sends none, and
        // nothing else is this guard's to refuse.
        _ => return answer(&request.uid, Ok(())),
    };
    let verdict = match list(store.clone()).await {
        Ok(pets) => judge(&store, &pets),
        Err(err) => Err(format!(
            "refusing to delete {}: the Pets that may use it could not be listed ({err})",
            store.describe()
        )),
    };
    match &verdict {
        Ok(()) => tracing::info!(store = store.describe(), "store unused: deletion allowed"),
        Err(message) => tracing::info!(%message, "refused to delete a store in use"),
    }
    answer(&request.uid, verdict)
}

/// The Pets that may use `store`, from the API server itself, not a cache
/// (a Pet created a moment ago counts): those of its namespace for a
/// PetStore, of every namespace for a ClusterPetStore. A page at a time.
pub async fn list_pets(client: kube::Client, store: DeletedStore) -> Result<Vec<PetUse>, String> {
    let pets: Api<Pet> = match store.namespace() {
        Some(namespace) => Api::namespaced(client, namespace),
        None => Api::all(client),
    };
    let (pets, mut found) = (&pets, Vec::new());
    pets_by_page(
        |params| async move { pets.list(&params).await },
        |page| found.extend(page.iter().map(PetUse::of)),
    )
    .await?;
    Ok(found)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pet(namespace: &str, name: &str, spec: Option<&str>, status: Option<&str>) -> PetUse {
        PetUse {
            namespace: namespace.into(),
            name: name.into(),
            store_ref: spec.map(|text| text.parse().expect("a store ref")),
            status_store: status.map(str::to_owned),
        }
    }

    fn pet_store(namespace: &str, name: &str) -> DeletedStore {
        DeletedStore::PetStore {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    fn cluster_store(name: &str) -> DeletedStore {
        DeletedStore::ClusterPetStore { name: name.into() }
    }

    fn tenant_account(namespace: &str) -> DeletedStore {
        DeletedStore::TenantAccount {
            namespace: namespace.into(),
        }
    }

    #[test]
    fn refuses_while_a_pet_uses_the_store_and_names_it() {
        let pets = vec![
            pet("team-a", "rex", Some("PetStore/shared"), None),
            pet("team-a", "fido", None, Some("PetStore/shared")),
            pet("team-a", "tom", Some("PetStore/other"), None),
            pet("team-b", "max", Some("PetStore/shared"), None),
            pet("team-c", "kit", Some("ClusterPetStore/shared"), None),
            pet("team-d", "ace", None, Some("ClusterPetStore/global")),
            pet("team-d", "odd", None, Some("not a store")),
            pet("team-e", "own", None, None),
        ];
        // Store, allowed, what a refusal says.
        let cases: Vec<(&str, DeletedStore, bool, &str)> = vec![
            (
                "spec or status, its own namespace only",
                pet_store("team-a", "shared"),
                false,
                "PetStore team-a/shared is used by 2 Pets (team-a/fido, team-a/rex); delete them or change their storeRef first",
            ),
            (
                "the same name in another namespace is its own",
                pet_store("team-b", "shared"),
                false,
                "PetStore team-b/shared is used by 1 Pet (team-b/max)",
            ),
            (
                "a namespace with no users",
                pet_store("team-c", "shared"),
                true,
                "",
            ),
            (
                "a PetStore no Pet names",
                pet_store("team-a", "unused"),
                true,
                "",
            ),
            (
                "a ClusterPetStore, by spec",
                cluster_store("shared"),
                false,
                "ClusterPetStore shared is used by 1 Pet (team-c/kit)",
            ),
            (
                "a ClusterPetStore, by status, any namespace",
                cluster_store("global"),
                false,
                "(team-d/ace)",
            ),
            (
                "a ClusterPetStore no Pet names",
                cluster_store("other"),
                true,
                "",
            ),
            (
                "the tenant ServiceAccount, by any store, spec or status",
                tenant_account("team-a"),
                false,
                "ServiceAccount team-a/petstore-tenant is used by 3 Pets (team-a/fido, team-a/rex, team-a/tom); their store calls carry its tokens",
            ),
            (
                "the tenant ServiceAccount of a namespace whose Pets use the operator's own store",
                tenant_account("team-e"),
                true,
                "",
            ),
        ];
        for (name, store, allowed, says) in cases {
            match judge(&store, &pets) {
                Ok(()) => assert!(allowed, "{name}: allowed"),
                Err(message) => {
                    assert!(!allowed, "{name}: refused: {message}");
                    assert!(message.contains(says), "{name}: {message}");
                }
            }
        }
    }

    #[test]
    fn names_five_pets_and_gives_the_total() {
        let pets: Vec<PetUse> = (0..8)
            .map(|i| pet("ns", &format!("p{i}"), Some("PetStore/s"), None))
            .collect();
        let message = judge(&pet_store("ns", "s"), &pets).expect_err("in use");
        assert!(
            message.contains("is used by 8 Pets (ns/p0, ns/p1, ns/p2, ns/p3, ns/p4, and 3 more)"),
            "{message}"
        );
    }

    fn deletion(kind: &str, namespace: Option<&str>, name: &str) -> Vec<u8> {
        let group = if kind == "ServiceAccount" {
            ""
        } else {
            "petstore.example.com"
        };
        json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u-1",
                "kind": {"group": group, "version": "v1", "kind": kind},
                "name": name,
                "namespace": namespace,
                "operation": "DELETE",
            },
        })
        .to_string()
        .into_bytes()
    }

    #[tokio::test]
    async fn the_route_lists_the_store_s_pets_and_answers() {
        let body = deletion("PetStore", Some("team-a"), "shared");
        let answer = review(&body, |store| async move {
            assert_eq!(store, pet_store("team-a", "shared"));
            Ok(vec![pet("team-a", "rex", Some("PetStore/shared"), None)])
        })
        .await;
        let response = &answer["response"];
        assert_eq!(response["uid"], "u-1");
        assert_eq!(response["allowed"], false, "{answer}");
        assert_eq!(response["status"]["code"], 403);
        assert!(
            response["status"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("team-a/rex")),
            "{answer}"
        );

        let body = deletion("ClusterPetStore", None, "global");
        let answer = review(&body, |store| async move {
            assert_eq!(store, cluster_store("global"));
            Ok(vec![])
        })
        .await;
        assert_eq!(answer["response"]["allowed"], true, "{answer}");

        let body = deletion("ServiceAccount", Some("team-a"), "petstore-tenant");
        let answer = review(&body, |store| async move {
            assert_eq!(store, tenant_account("team-a"));
            Ok(vec![pet("team-a", "rex", None, Some("PetStore/default"))])
        })
        .await;
        assert_eq!(answer["response"]["allowed"], false, "{answer}");

        // What the namespace controller's deletecollection sends: no name,
        // the object in oldObject.
        let mut collection: Value =
            serde_json::from_slice(&deletion("PetStore", Some("team-a"), "")).expect("json");
        collection["request"]["oldObject"] =
            json!({"metadata": {"name": "shared", "namespace": "team-a"}});
        let answer = review(
            &serde_json::to_vec(&collection).expect("json"),
            |store| async move {
                assert_eq!(store, pet_store("team-a", "shared"));
                Ok(vec![pet("team-a", "rex", Some("PetStore/shared"), None)])
            },
        )
        .await;
        assert_eq!(answer["response"]["allowed"], false, "{answer}");
        let mut collection: Value =
            serde_json::from_slice(&deletion("ServiceAccount", Some("team-a"), "")).expect("json");
        collection["request"]["oldObject"] = json!({"metadata": {"name": "petstore-tenant"}});
        let answer = review(
            &serde_json::to_vec(&collection).expect("json"),
            |store| async move {
                assert_eq!(store, tenant_account("team-a"));
                Ok(vec![pet("team-a", "rex", None, Some("PetStore/shared"))])
            },
        )
        .await;
        assert_eq!(answer["response"]["allowed"], false, "{answer}");

        let answer = review(&body, |_| async { Err("timeout".to_owned()) }).await;
        assert_eq!(answer["response"]["allowed"], false, "{answer}");
        assert!(
            answer["response"]["status"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("could not be listed (timeout)")),
            "{answer}"
        );
    }

    #[tokio::test]
    async fn only_a_store_s_deletion_lists_pets() {
        let update = json!({"request": {
            "uid": "u-2", "operation": "UPDATE", "name": "shared", "namespace": "team-a",
            "kind": {"group": "petstore.example.com", "version": "v1", "kind": "PetStore"},
        }});
        let other = deletion("Pet", Some("team-a"), "rex");
        let other_account = deletion("ServiceAccount", Some("team-a"), "default");
        for body in [update.to_string().into_bytes(), other, other_account] {
            let answer = review(
                &body,
                |store| async move { panic!("listed Pets for {store:?}") },
            )
            .await;
            assert_eq!(answer["response"]["allowed"], true, "{answer}");
        }
        let answer = review(b"{not json", |_| async { Ok(vec![]) }).await;
        assert_eq!(answer["response"]["allowed"], false);
    }
}
