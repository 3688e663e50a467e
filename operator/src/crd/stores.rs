//! The stores a Pet's record may live in, as Kubernetes resources
//! (`petstore.example.com/v1`):
//!
//! - [`PetStore`] (`crd::PetStore`, not the store client's trait
//!   `store::PetStore`): namespaced; only Pets of its own namespace use it.
//! - [`ClusterPetStore`] (`crd::ClusterPetStore`): cluster-scoped; Pets of
//!   the namespaces its `allowedNamespaces` admits use it.
//!
//! A Pet names one with `spec.storeRef` ([`StoreRef`]); without one it uses
//! the operator's own store (its `--petstore-addr`). The CRD YAML in
//! `config/crd/` is generated from these types by `cargo xtask crdgen`.

// Each printcolumn(...) repeats `type_ = "string"`, which this lint mistakes
// for a duplicated attribute.
#![allow(clippy::duplicated_attributes)]

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    Condition, LabelSelector, LabelSelectorRequirement,
};
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

/// The PetStore CRD's name.
pub const PETSTORES_CRD_NAME: &str = "petstores.petstore.example.com";
/// The ClusterPetStore CRD's name.
pub const CLUSTERPETSTORES_CRD_NAME: &str = "clusterpetstores.petstore.example.com";
/// The audience a store's tokens carry unless the spec names another.
pub const DEFAULT_AUDIENCE: &str = "petstore";
/// Store condition: the store answers and the operator may use it.
pub const STORE_READY: &str = "Ready";
/// Store condition: the store answered at its address (TLS included).
pub const STORE_REACHABLE: &str = "Reachable";

/// Longest Kubernetes object name (a DNS subdomain); also bounds the CEL
/// rules' cost estimate.
const MAX_OBJECT_NAME: usize = 253;
/// Longest store address; bounds the address rule's cost estimate.
const MAX_ADDRESS: usize = 2048;

fn default_audience() -> String {
    DEFAULT_AUDIENCE.to_owned()
}

/// Declares a store kind's spec with the `#[kube]` attributes both kinds
/// share: group and version, status, category and printer columns. The
/// kind's own `#[kube]` attribute (kind, plural, scope, doc, short name)
/// goes on the struct; kube-derive reads the two as one.
macro_rules! store_kind {
    ($(#[$attr:meta])* pub struct $spec:ident $fields:tt) => {
        #[derive(kube::CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
        #[kube(
            group = "petstore.example.com",
            version = "v1",
            status = "StoreStatus",
            derive = "PartialEq",
            category = "petstore",
            printcolumn(name = "Address", type_ = "string", json_path = ".spec.address"),
            printcolumn(
                name = "Ready",
                type_ = "string",
                json_path = ".status.conditions[?(@.type==\"Ready\")].status"
            ),
            printcolumn(
                name = "Pets",
                type_ = "integer",
                json_path = ".status.pets",
                description = "How many Pets use this store"
            ),
            printcolumn(
                name = "Age",
                type_ = "date",
                json_path = ".metadata.creationTimestamp"
            )
        )]
        $(#[$attr])*
        pub struct $spec $fields
    };
}

store_kind! {
    /// A pet store in this namespace, for the Pets of this namespace only.
    #[kube(
        kind = "PetStore",
        plural = "petstores",
        namespaced,
        doc = "A pet store for the Pets of this namespace: a Pet uses it with spec.storeRef {kind: PetStore, name: <this>}. Deleting it is refused while a Pet of this namespace uses it.",
        shortname = "ps"
    )]
    #[serde(rename_all = "camelCase")]
    pub struct PetStoreSpec {
        /// The store's gRPC address: https://host:port, or http://host:port
        /// for a store without TLS.
        #[schemars(length(min = 1, max = MAX_ADDRESS), extend("x-kubernetes-validations" = [address_rule()]))]
        pub address: String,

        /// How to verify the store's TLS certificate. Without it, an https
        /// address is verified against the system's trusted roots.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub tls: Option<StoreTls>,

        /// The audience the tokens sent to this store must carry, so a token
        /// meant for one store is refused by another.
        #[serde(default = "default_audience")]
        #[schemars(length(min = 1, max = MAX_OBJECT_NAME))]
        pub audience: String,
    }
}

store_kind! {
    /// A pet store for the whole cluster, for the Pets of the namespaces it
    /// admits.
    #[kube(
        kind = "ClusterPetStore",
        plural = "clusterpetstores",
        doc = "A pet store shared by the namespaces spec.allowedNamespaces admits: a Pet there uses it with spec.storeRef {kind: ClusterPetStore, name: <this>}. Deleting it is refused while any Pet uses it.",
        shortname = "cps"
    )]
    #[serde(rename_all = "camelCase")]
    pub struct ClusterPetStoreSpec {
        /// The store's gRPC address: https://host:port, or http://host:port
        /// for a store without TLS.
        #[schemars(length(min = 1, max = MAX_ADDRESS), extend("x-kubernetes-validations" = [address_rule()]))]
        pub address: String,

        /// How to verify the store's TLS certificate. Without it, an https
        /// address is verified against the system's trusted roots. The CA's
        /// Secret or ConfigMap is named with its namespace.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub tls: Option<StoreTls<NamespacedKeyRef>>,

        /// The audience the tokens sent to this store must carry, so a token
        /// meant for one store is refused by another.
        #[serde(default = "default_audience")]
        #[schemars(length(min = 1, max = MAX_OBJECT_NAME))]
        pub audience: String,

        /// The namespaces whose Pets may use this store. Unset admits no
        /// namespace at all (a cluster store is shared only on purpose); an
        /// empty selector ({}) admits every namespace.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub allowed_namespaces: Option<AllowedNamespaces>,
    }
}

impl ClusterPetStoreSpec {
    /// Whether Pets of `namespace` (with these labels) may use this store.
    /// `allowedNamespaces` unset admits none.
    pub fn admits(&self, namespace: &str, labels: &BTreeMap<String, String>) -> bool {
        self.allowed_namespaces
            .as_ref()
            .is_some_and(|allowed| allowed.admits(namespace, labels))
    }
}

/// The CEL rule on `address`: a message a person understands, where a
/// `pattern` would print the regular expression.
fn address_rule() -> serde_json::Value {
    serde_json::json!({
        "rule": "self.matches('^https?://[^/?#\\\\s]+/?$')",
        "message": "address must be https://host:port, or http://host:port for a store without TLS, such as https://petstore.petstore.svc:6742",
        "reason": "FieldValueInvalid",
    })
}

/// Namespaces admitted by name or by their labels.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AllowedNamespaces {
    /// Namespaces admitted by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub names: Vec<String>,

    /// Namespaces admitted by their labels (matchLabels and
    /// matchExpressions, ANDed). An empty selector admits every namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "label_selector_schema")]
    pub selector: Option<LabelSelector>,
}

impl AllowedNamespaces {
    /// Whether `namespace`, with these labels, is named or matches the
    /// selector.
    pub fn admits(&self, namespace: &str, labels: &BTreeMap<String, String>) -> bool {
        self.names.iter().any(|name| name == namespace)
            || self
                .selector
                .as_ref()
                .is_some_and(|selector| selector_matches(selector, labels))
    }
}

/// Kubernetes' label selector semantics: every `matchLabels` pair and every
/// requirement must hold; an empty selector matches everything. An operator
/// outside the four the schema allows matches nothing.
pub fn selector_matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let pairs = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(key, value)| labels.get(key) == Some(value));
    pairs
        && selector
            .match_expressions
            .iter()
            .flatten()
            .all(|requirement| requirement_matches(requirement, labels))
}

fn requirement_matches(
    requirement: &LabelSelectorRequirement,
    labels: &BTreeMap<String, String>,
) -> bool {
    let value = labels.get(&requirement.key);
    let values = requirement.values.as_deref().unwrap_or_default();
    match requirement.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        // As Kubernetes: a namespace without the label is not in the set.
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        _ => false,
    }
}

/// How to verify the store's certificate. `R` is how the CA is found:
/// [`KeyRef`] (the PetStore's own namespace) or [`NamespacedKeyRef`] (a
/// ClusterPetStore's, which has none of its own).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
// Without the bound, serde would ask `R: Default` for `ca`'s default.
#[serde(rename_all = "camelCase", bound(deserialize = "R: Deserialize<'de>"))]
pub struct StoreTls<R = KeyRef> {
    /// The CA certificate (PEM) that signed the store's certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<CaSource<R>>,

    /// The name to verify the store's certificate for, when it is not the
    /// address's host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_OBJECT_NAME))]
    pub server_name: Option<String>,
}

/// Where the CA certificate is: exactly one of a Secret's key or a
/// ConfigMap's key.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum CaSource<R = KeyRef> {
    #[serde(rename = "secretKeyRef")]
    SecretKeyRef(R),
    #[serde(rename = "configMapKeyRef")]
    ConfigMapKeyRef(R),
}

impl<R> CaSource<R> {
    /// The reference, whichever kind of object it names.
    pub fn key_ref(&self) -> &R {
        match self {
            CaSource::SecretKeyRef(r) | CaSource::ConfigMapKeyRef(r) => r,
        }
    }
}

/// Written by hand: two optional properties and a CEL rule that one is set
/// give the API server's message a person can act on, where serde's
/// externally tagged enum would become a `oneOf` with a terse error.
impl<R: JsonSchema> JsonSchema for CaSource<R> {
    fn schema_name() -> Cow<'static, str> {
        format!("CaSource_for_{}", R::schema_name()).into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        let reference = |generator: &mut SchemaGenerator, what: &str| {
            let mut schema = generator.subschema_for::<R>();
            schema.insert(
                "description".into(),
                format!("A key of a {what} holding the CA certificate (PEM).").into(),
            );
            schema
        };
        let secret = reference(generator, "Secret");
        let config_map = reference(generator, "ConfigMap");
        json_schema!({
            "description": "Where the CA certificate is: exactly one of secretKeyRef or configMapKeyRef.",
            "type": "object",
            "properties": {
                "secretKeyRef": secret,
                "configMapKeyRef": config_map,
            },
            "x-kubernetes-validations": [{
                "rule": "has(self.secretKeyRef) != has(self.configMapKeyRef)",
                "message": "tls.ca must set exactly one of secretKeyRef or configMapKeyRef",
                "reason": "FieldValueInvalid",
            }],
        })
    }
}

impl StoreTls<NamespacedKeyRef> {
    /// A ClusterPetStore's CA as a PetStore names it, with the namespace
    /// it is in.
    pub fn ca_in_namespace(&self) -> Option<(String, CaSource)> {
        self.ca.as_ref().map(|ca| {
            let named = ca.key_ref();
            let key_ref = KeyRef {
                name: named.name.clone(),
                key: named.key.clone(),
            };
            let source = match ca {
                CaSource::SecretKeyRef(_) => CaSource::SecretKeyRef(key_ref),
                CaSource::ConfigMapKeyRef(_) => CaSource::ConfigMapKeyRef(key_ref),
            };
            (named.namespace.clone(), source)
        })
    }
}

/// A key of a Secret or ConfigMap in the PetStore's own namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub struct KeyRef {
    /// The object's name.
    #[schemars(length(min = 1, max = MAX_OBJECT_NAME))]
    pub name: String,
    /// The key in its data.
    #[schemars(length(min = 1, max = MAX_OBJECT_NAME))]
    pub key: String,
}

/// A key of a Secret or ConfigMap in the namespace named.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub struct NamespacedKeyRef {
    /// The object's namespace.
    #[schemars(length(min = 1, max = 63))]
    pub namespace: String,
    /// The object's name.
    #[schemars(length(min = 1, max = MAX_OBJECT_NAME))]
    pub name: String,
    /// The key in its data.
    #[schemars(length(min = 1, max = MAX_OBJECT_NAME))]
    pub key: String,
}

/// What the operator last observed of a store.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StoreStatus {
    /// `Ready` (the operator may use the store) and `Reachable` (it
    /// answered at its address), each with a reason and message; and, as
    /// kstatus reads them, `Reconciling` while an unreachable store is
    /// re-checked and `Stalled` while only a person can help.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,

    /// The extension RPCs the store serves beyond the book's
    /// (GetPets, SetIdempotencyKeys, WatchPets, ClaimInstallation), as its
    /// gRPC reflection lists them: empty for the book's store, unset while
    /// not known (the store does not answer, or serves no reflection).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extensions: Option<Vec<String>>,

    /// How many Pets use the store: those whose status.store names it (a
    /// PetStore's in its own namespace only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pets: Option<i64>,

    /// The metadata.generation that the conditions describe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The store a Pet's record lives in: `spec.storeRef`.
#[derive(
    Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema,
)]
pub struct StoreRef {
    /// PetStore (in the Pet's namespace) or ClusterPetStore.
    pub kind: StoreKind,
    /// The store's name.
    #[schemars(length(min = 1, max = MAX_OBJECT_NAME))]
    pub name: String,
}

/// The two kinds of store.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema,
)]
pub enum StoreKind {
    PetStore,
    ClusterPetStore,
}

impl StoreKind {
    pub const fn as_str(self) -> &'static str {
        match self {
            StoreKind::PetStore => "PetStore",
            StoreKind::ClusterPetStore => "ClusterPetStore",
        }
    }
}

impl fmt::Display for StoreKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl StoreRef {
    /// The store of this kind named `name`.
    pub fn new(kind: StoreKind, name: &str) -> StoreRef {
        StoreRef {
            kind,
            name: name.to_owned(),
        }
    }
}

/// `PetStore/<name>` or `ClusterPetStore/<name>`, as `status.store` says it.
impl fmt::Display for StoreRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.kind, self.name)
    }
}

/// A `status.store` that is not `<kind>/<name>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not PetStore/<name> or ClusterPetStore/<name>")]
pub struct BadStoreRef(pub String);

/// Reads what [`StoreRef`]'s `Display` writes.
impl FromStr for StoreRef {
    type Err = BadStoreRef;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || BadStoreRef(text.to_owned());
        let (kind, name) = text.split_once('/').ok_or_else(bad)?;
        let kind = match kind {
            "PetStore" => StoreKind::PetStore,
            "ClusterPetStore" => StoreKind::ClusterPetStore,
            _ => return Err(bad()),
        };
        if name.is_empty() || name.contains('/') {
            return Err(bad());
        }
        Ok(StoreRef::new(kind, name))
    }
}

/// `status.conditions`: Kubernetes' own Condition, a map keyed by type, as
/// kstatus and `kubectl wait --for=condition=Ready` read it.
fn conditions_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "description": "Ready (the operator may use the store) and Reachable (it answered at its address), each with a reason and message; Reconciling while an unreachable store is re-checked, Stalled while only a person can help (kstatus reads both).",
        "type": "array",
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
        "items": {
            "type": "object",
            "properties": {
                "type": {"type": "string", "description": "Ready, Reachable, Reconciling or Stalled."},
                "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                "reason": {"type": "string", "description": "One CamelCase word."},
                "message": {"type": "string", "description": "Human-readable detail."},
                "lastTransitionTime": {"type": "string", "format": "date-time", "description": "When status last changed."},
                "observedGeneration": {"type": "integer", "format": "int64", "description": "The metadata.generation this condition was set for."},
            },
            "required": ["type", "status", "reason", "message", "lastTransitionTime"],
        },
    })
}

/// Kubernetes' LabelSelector, with the operators it knows spelled out and
/// a rule on `values` the API server would otherwise not check here.
fn label_selector_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "description": "Namespaces admitted by their labels: matchLabels and matchExpressions, ANDed. An empty selector ({}) admits every namespace.",
        "type": "object",
        "properties": {
            "matchLabels": {
                "type": "object",
                "additionalProperties": {"type": "string"},
                "description": "Labels a namespace must carry, with these values.",
            },
            "matchExpressions": {
                "type": "array",
                // Bounds the CEL rule's cost estimate, as the API server requires.
                "maxItems": 32,
                "description": "Requirements a namespace's labels must meet.",
                "items": {
                    "type": "object",
                    "properties": {
                        "key": {"type": "string", "maxLength": 317, "description": "The label's key."},
                        "operator": {"type": "string", "enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                        "values": {"type": "array", "maxItems": 256, "items": {"type": "string", "maxLength": 63}},
                    },
                    "required": ["key", "operator"],
                    "x-kubernetes-validations": [{
                        "rule": "self.operator in ['In', 'NotIn'] ? has(self.values) && size(self.values) > 0 : !has(self.values) || size(self.values) == 0",
                        "message": "values must be non-empty for In and NotIn, and empty for Exists and DoesNotExist",
                        "reason": "FieldValueInvalid",
                    }],
                },
            },
        },
    })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
    use serde_json::json;

    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn requirement(key: &str, operator: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: operator.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| (*v).to_owned()).collect()),
        }
    }

    fn selector(
        match_labels: &[(&str, &str)],
        expressions: Vec<LabelSelectorRequirement>,
    ) -> LabelSelector {
        LabelSelector {
            match_labels: (!match_labels.is_empty()).then(|| labels(match_labels)),
            match_expressions: (!expressions.is_empty()).then_some(expressions),
        }
    }

    fn spec(allowed: Option<AllowedNamespaces>) -> ClusterPetStoreSpec {
        ClusterPetStoreSpec {
            address: "https://petstore.petstore.svc:6742".into(),
            tls: None,
            audience: DEFAULT_AUDIENCE.into(),
            allowed_namespaces: allowed,
        }
    }

    #[test]
    fn admits_by_name_or_selector_and_unset_admits_none() {
        const TEAM: &[(&str, &str)] = &[("tenant", "team-a"), ("tier", "gold")];
        let by = |names: &[&str], selector: Option<LabelSelector>| {
            Some(AllowedNamespaces {
                names: names.iter().map(|n| (*n).to_owned()).collect(),
                selector,
            })
        };
        type Case = (
            &'static str,
            Option<AllowedNamespaces>,
            &'static str,
            &'static [(&'static str, &'static str)],
            bool,
        );
        let cases: Vec<Case> = vec![
            ("unset admits none", None, "team-a", TEAM, false),
            ("empty admits none", by(&[], None), "team-a", TEAM, false),
            ("by name", by(&["team-a"], None), "team-a", &[], true),
            ("another name", by(&["team-b"], None), "team-a", TEAM, false),
            (
                "empty selector admits all",
                by(&[], Some(LabelSelector::default())),
                "x",
                &[],
                true,
            ),
            (
                "matchLabels",
                by(&[], Some(selector(&[("tenant", "team-a")], vec![]))),
                "team-a",
                TEAM,
                true,
            ),
            (
                "matchLabels, other value",
                by(&[], Some(selector(&[("tenant", "team-b")], vec![]))),
                "team-a",
                TEAM,
                false,
            ),
            (
                "name OR selector",
                by(&["team-z"], Some(selector(&[("tenant", "team-b")], vec![]))),
                "team-z",
                TEAM,
                true,
            ),
            (
                "In",
                by(
                    &[],
                    Some(selector(
                        &[],
                        vec![requirement("tier", "In", &["gold", "silver"])],
                    )),
                ),
                "team-a",
                TEAM,
                true,
            ),
            (
                "In, label absent",
                by(
                    &[],
                    Some(selector(&[], vec![requirement("zone", "In", &["a"])])),
                ),
                "team-a",
                TEAM,
                false,
            ),
            (
                "NotIn",
                by(
                    &[],
                    Some(selector(&[], vec![requirement("tier", "NotIn", &["gold"])])),
                ),
                "team-a",
                TEAM,
                false,
            ),
            (
                "NotIn, label absent",
                by(
                    &[],
                    Some(selector(&[], vec![requirement("zone", "NotIn", &["a"])])),
                ),
                "team-a",
                TEAM,
                true,
            ),
            (
                "Exists",
                by(
                    &[],
                    Some(selector(&[], vec![requirement("tenant", "Exists", &[])])),
                ),
                "team-a",
                TEAM,
                true,
            ),
            (
                "Exists, absent",
                by(
                    &[],
                    Some(selector(&[], vec![requirement("zone", "Exists", &[])])),
                ),
                "team-a",
                TEAM,
                false,
            ),
            (
                "DoesNotExist",
                by(
                    &[],
                    Some(selector(
                        &[],
                        vec![requirement("zone", "DoesNotExist", &[])],
                    )),
                ),
                "team-a",
                TEAM,
                true,
            ),
            (
                "DoesNotExist, present",
                by(
                    &[],
                    Some(selector(
                        &[],
                        vec![requirement("tier", "DoesNotExist", &[])],
                    )),
                ),
                "team-a",
                TEAM,
                false,
            ),
            (
                "labels AND expressions",
                by(
                    &[],
                    Some(selector(
                        &[("tenant", "team-a")],
                        vec![requirement("tier", "NotIn", &["gold"])],
                    )),
                ),
                "team-a",
                TEAM,
                false,
            ),
            (
                "an unknown operator matches nothing",
                by(
                    &[],
                    Some(selector(&[], vec![requirement("tier", "Gt", &["1"])])),
                ),
                "team-a",
                TEAM,
                false,
            ),
        ];
        for (name, allowed, namespace, namespace_labels, admitted) in cases {
            assert_eq!(
                spec(allowed).admits(namespace, &labels(namespace_labels)),
                admitted,
                "{name}"
            );
        }
    }

    #[test]
    fn a_store_ref_reads_back_what_it_writes() {
        for (kind, text) in [
            (StoreKind::PetStore, "PetStore/shared"),
            (StoreKind::ClusterPetStore, "ClusterPetStore/shared"),
        ] {
            let store = StoreRef::new(kind, "shared");
            assert_eq!(store.to_string(), text);
            assert_eq!(text.parse::<StoreRef>(), Ok(store.clone()));
            assert_eq!(
                serde_json::to_value(&store).expect("json"),
                json!({"kind": kind.as_str(), "name": "shared"})
            );
        }
        for bad in ["", "PetStore", "PetStore/", "Store/x", "PetStore/a/b"] {
            assert!(bad.parse::<StoreRef>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_ca_is_one_of_a_secret_or_a_config_map_key() {
        let spec: PetStoreSpec = serde_json::from_value(json!({
            "address": "https://store:6742",
            "tls": {"ca": {"configMapKeyRef": {"name": "ca", "key": "ca.crt"}}, "serverName": "store"},
        }))
        .expect("a spec");
        assert_eq!(spec.audience, DEFAULT_AUDIENCE, "defaulted");
        let ca = spec.tls.and_then(|tls| tls.ca).expect("a CA");
        assert!(matches!(ca, CaSource::ConfigMapKeyRef(_)));
        assert_eq!(ca.key_ref().key, "ca.crt");
        // A ClusterPetStore's reference needs its namespace.
        let missing_namespace = serde_json::from_value::<ClusterPetStoreSpec>(json!({
            "address": "https://store:6742",
            "tls": {"ca": {"secretKeyRef": {"name": "ca", "key": "ca.crt"}}},
        }));
        assert!(missing_namespace.is_err());
    }
}
