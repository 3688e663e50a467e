//! The `Pet` custom resource in its two versions, and what they share.
//!
//! - [`v1`]: `petstore.example.com/v1`, the storage version, which the
//!   operator reads and writes; re-exported here as [`Pet`] and [`PetSpec`].
//! - [`v1alpha1`]: the first version, still served and deprecated.
//! - [`conversion`]: the lossless conversion between them, which the
//!   conversion webhook ([`crate::webhook`]) applies for the API server.
//! - [`stores`]: the stores a Pet's `spec.storeRef` names, `PetStore` and
//!   `ClusterPetStore` (v1 only).
//!
//! The CRD YAML in `config/crd/` is generated from these types by
//! `cargo xtask crdgen` ([`crd_files`]).

/// Declares one served version's `PetSpec` (and kube's `Pet` for it). The
/// versions share every field, schema rule and printed column; they differ
/// in `spec.birthday` (its type and doc) and whether they are deprecated.
macro_rules! pet_version {
    (
        version = $version:literal,
        $(deprecated = $deprecated:literal,)?
        $(#[doc = $birthday_doc:literal])*
        birthday: $birthday:ty $(,)?
    ) => {
        /// The desired state of a pet in the pet store.
        #[derive(
            kube::CustomResource,
            serde::Serialize,
            serde::Deserialize,
            Clone,
            Debug,
            PartialEq,
            schemars::JsonSchema,
        )]
        #[kube(
            group = "petstore.example.com",
            version = $version,
            kind = "Pet",
            plural = "pets",
            namespaced,
            doc = "A pet kept in the pet store. The operator creates a store record for it (or adopts the unowned record named by the annotation petstore.example.com/external-id), keeps that record in line with spec, writes the record's ID to status.id, and deletes the record when the Pet is deleted (unless spec.deletionPolicy is Orphan, which keeps the record and releases it for adoption).",
            status = "PetStatus",
            derive = "PartialEq",
            shortname = "pt",
            $(deprecated = $deprecated,)?
            category = "petstore",
            printcolumn(
                name = "Pet Name",
                type_ = "string",
                json_path = ".spec.name",
                description = "The pet's name in the store"
            ),
            printcolumn(name = "Type", type_ = "string", json_path = ".spec.type"),
            printcolumn(name = "Birthday", type_ = "string", json_path = ".spec.birthday"),
            printcolumn(
                name = "Store ID",
                type_ = "string",
                json_path = ".status.id",
                description = "ID of the pet's record in the store"
            ),
            printcolumn(
                name = "Plan",
                type_ = "string",
                json_path = ".status.pendingPlan",
                description = "What the pending plan would do (create, update and the fields, claim, release, delete), or none"
            ),
            printcolumn(
                name = "Ready",
                type_ = "string",
                json_path = ".status.conditions[?(@.type==\"Ready\")].status"
            ),
            printcolumn(
                name = "Reason",
                type_ = "string",
                json_path = ".status.conditions[?(@.type==\"Ready\")].reason",
                priority = 1
            ),
            // Wide only: the default table is the README's, which users'
            // scripts and the user_story test read column by column.
            printcolumn(
                name = "Store",
                type_ = "string",
                json_path = ".status.store",
                description = "The store the record lives in (PetStore/<name> or ClusterPetStore/<name>); empty for the operator's own",
                priority = 1
            ),
            printcolumn(
                name = "Age",
                type_ = "date",
                json_path = ".metadata.creationTimestamp"
            )
        )]
        pub struct PetSpec {
            /// The pet's name, as stored in the pet store: 1 to 128 characters, not
            /// only whitespace. Renaming a Pet renames its existing store record.
            #[schemars(length(min = 1, max = MAX_NAME_CHARS), regex(pattern = r"\S"))]
            pub name: String,

            /// The kind of animal: one of dog, cat, bird or reptile.
            #[serde(rename = "type")]
            pub pet_type: PetType,

            $(#[doc = $birthday_doc])*
            pub birthday: $birthday,

            /// What happens to the store record when the Pet is deleted: Delete
            /// (the default) deletes it; Orphan keeps it and clears its owner, so
            /// another Pet can adopt it with the annotation
            /// petstore.example.com/external-id.
            #[serde(
                default,
                rename = "deletionPolicy",
                skip_serializing_if = "Option::is_none"
            )]
            pub deletion_policy: Option<DeletionPolicy>,

            /// When the operator may write the store: Automatic (the default)
            /// writes as soon as it decides; Approve shows each change as
            /// status.plan and writes it once the annotation
            /// petstore.example.com/approve-plan names the plan's hash;
            /// Observe never writes and shows what differs as status.plan.
            #[serde(
                default,
                rename = "changePolicy",
                skip_serializing_if = "Option::is_none"
            )]
            pub change_policy: Option<ChangePolicy>,

            /// The store that keeps this Pet's record: a PetStore of this
            /// namespace, or a ClusterPetStore that admits it. Unset: the
            /// operator's own store. It cannot change once the Pet has a
            /// record (status.id is set).
            #[serde(default, rename = "storeRef", skip_serializing_if = "Option::is_none")]
            pub store_ref: Option<StoreRef>,
        }
    };
}

pub mod conversion;
pub mod stores;
pub mod v1;
pub mod v1alpha1;

use chrono::{DateTime, Utc};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceConversion, CustomResourceDefinition, ServiceReference, ValidationRule,
    WebhookClientConfig, WebhookConversion,
};
/// Longest pet name, in characters; the store enforces the same limit.
pub use petstore_proto::convert::MAX_NAME_CHARS;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use stores::{
    AllowedNamespaces, CaSource, ClusterPetStore, ClusterPetStoreSpec, KeyRef, NamespacedKeyRef,
    PetStore, PetStoreSpec, StoreKind, StoreRef, StoreStatus, StoreTls,
};
pub use v1::{Pet, PetSpec};

/// The API group of both versions.
pub const GROUP: &str = "petstore.example.com";
/// The CRD's name.
pub const CRD_NAME: &str = "pets.petstore.example.com";

/// On the Pet CRD: how many Pets its deletion may take (with their store
/// records). The CRD's deletion guard refuses the deletion unless this
/// names the number of Pets there are; the operator deletes records on a
/// CRD being deleted only with it.
pub const CONFIRM_DELETE_PETS_ANNOTATION: &str = "petstore.example.com/confirm-delete-pets";
/// `"true"` on a Pet: the API server refuses to delete it
/// (`config/admission/protection.yaml`), and the CRD's deletion guard
/// refuses to delete the CRD while it exists.
pub const PROTECTED_ANNOTATION: &str = "petstore.example.com/protected";

/// An installation name: a lowercase RFC 1123 label, so that it holds no
/// slash (a key's installation ends at its last slash) and reads as one word
/// in a message.
pub fn is_installation_name(value: &str) -> bool {
    let label = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-';
    !value.is_empty()
        && value.len() <= 63
        && value.chars().all(label)
        && !value.starts_with('-')
        && !value.ends_with('-')
}

/// Finalizer that keeps a Pet until its store record is deleted.
pub const FINALIZER: &str = "pet.petstore.example.com";
/// Annotation kept for compatibility with `spec.deletionPolicy`: `Delete` or
/// `Orphan`. Any other value stops deletion (it never means Delete).
pub const DELETION_POLICY_ANNOTATION: &str = "petstore.example.com/deletion-policy";
/// Annotation: `"true"` stops reconciliation of the Pet (including deletion).
/// Only `"true"` and `"false"` are valid; any other value also pauses.
pub const PAUSED_ANNOTATION: &str = "petstore.example.com/paused";
/// Annotation: the ID of an existing store record for this Pet to adopt
/// (after Crossplane's external-name). Only a record with no owner (an empty
/// idempotency key) can be adopted.
pub const EXTERNAL_ID_ANNOTATION: &str = "petstore.example.com/external-id";
/// Annotation: the hash of the plan (status.plan.hash) a Pet in
/// `changePolicy: Approve` may apply, once.
pub const APPROVE_PLAN_ANNOTATION: &str = "petstore.example.com/approve-plan";
/// Annotation: hand this Pet's record over to the installation named (the
/// `--installation` of another cluster's operator on the same store). The
/// record's key becomes `<installation>/from:<this Pet's UID>`, which only a Pet of that
/// installation with the same namespace and name takes; this Pet then
/// writes it no more, and can be deleted without touching it.
pub const HAND_OVER_TO_ANNOTATION: &str = "petstore.example.com/hand-over-to";

/// What deleting the Pet does to its store record: Delete (the default)
/// deletes it; Orphan keeps it and clears its owner, so another Pet can adopt
/// it with the annotation petstore.example.com/external-id.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum DeletionPolicy {
    /// Delete the record.
    Delete,
    /// Keep the record and release it (clear its idempotency key).
    Orphan,
}

/// When the operator may write the store for a Pet.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum ChangePolicy {
    /// Write as soon as the operator decides.
    #[default]
    Automatic,
    /// Show each change as status.plan; write it once approved.
    Approve,
    /// Never write; show what differs as status.plan.
    Observe,
}

impl ChangePolicy {
    pub const fn as_str(self) -> &'static str {
        match self {
            ChangePolicy::Automatic => "Automatic",
            ChangePolicy::Approve => "Approve",
            ChangePolicy::Observe => "Observe",
        }
    }
}

/// An annotation's value, parsed. `Invalid` carries the value as written.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Setting<T> {
    Valid(T),
    Invalid {
        annotation: &'static str,
        value: String,
    },
}

/// The type of animal, as the spec spells it (`spec.type`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PetType {
    Dog,
    Cat,
    Bird,
    Reptile,
}

impl PetType {
    /// As the spec spells it.
    pub const fn as_str(self) -> &'static str {
        match self {
            PetType::Dog => "dog",
            PetType::Cat => "cat",
            PetType::Bird => "bird",
            PetType::Reptile => "reptile",
        }
    }
}

/// What the operator last observed and did.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = with_pending_plan)]
pub struct PetStatus {
    /// ID of this Pet's record in the pet store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,

    /// The metadata.generation that the conditions describe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Current state: `Ready` (the record matches the spec) and `Synced`
    /// (the last reconciliation succeeded), with a reason and message.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    // An atomic list, not a map keyed by `type`: the operator is its only
    // writer and replaces it whole, and with two conditions the API server's
    // per-element field tracking of a map cost about 5% more of its CPU per
    // status write (BENCHMARKS.md).
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub conditions: Vec<Condition>,

    /// What the operator would write to the store and has not, because the
    /// change policy is Approve (until approved) or Observe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<PlanStatus>,

    /// Since when the Pet has shown a plan it has not written (this one or
    /// one before it): the age the pending-plan alert reads. Kept in the
    /// status, not only in the operator's memory, so a restart or a new
    /// leader neither announces the plan again nor resets its age; beside
    /// `plan`, not in it, so the plan stays exactly what `kubectl petstore
    /// plan` prints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan_pending_since: Option<DateTime<Utc>>,

    /// The hash of the last approved plan applied: an approval is used once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_plan: Option<String>,

    /// The store the operator resolved for this Pet, as PetStore/<name> or
    /// ClusterPetStore/<name>; unset for the operator's own store. A store
    /// cannot be deleted while a Pet names it here or in spec.storeRef.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<String>,
}

/// `status.pendingPlan`, what the Plan column prints: the pending plan's
/// summary, or `none`. The schema defaults it to `none`, and the API server
/// fills a default on every read, so a Pet written before the field existed
/// shows `none` with no write. The operator sets it in the same status write
/// that shows or clears `status.plan` and never reads it: it is not in
/// [`PetStatus`], so it cannot make an unchanged status look changed.
pub const PENDING_PLAN_FIELD: &str = "pendingPlan";
/// What `status.pendingPlan` says when no plan waits.
pub const NO_PENDING_PLAN: &str = "none";

fn with_pending_plan(schema: &mut schemars::Schema) {
    if let Some(properties) = schema
        .get_mut("properties")
        .and_then(serde_json::Value::as_object_mut)
    {
        properties.insert(
            PENDING_PLAN_FIELD.into(),
            serde_json::json!({
                "type": "string",
                "default": NO_PENDING_PLAN,
                "description": "What the pending plan would do, as status.plan.summary says it, or none. For kubectl's Plan column.",
            }),
        );
    }
}

/// A pending plan: the store writes one reconcile would make.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlanStatus {
    /// Identifies exactly this plan, for this spec generation and this state
    /// of the record; approve it with the annotation
    /// petstore.example.com/approve-plan.
    pub hash: String,
    /// One line: `create`, `update name,type`, `claim, update name`, `delete`.
    pub summary: String,
    /// Why: new_pet, spec_change, drift, adoption or deletion.
    pub cause: String,
    /// The metadata.generation the plan was made for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// Each store write, in order.
    pub actions: Vec<PlannedAction>,
}

/// One store write of a plan.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlannedAction {
    /// create, claim, update, release or delete.
    pub action: String,
    /// The record written; none for a create.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record_id: Option<String>,
    /// Each field's value in the record now and after the write.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<PlannedChange>,
}

/// One field of a planned write: `from` as the record holds it, `to` as
/// the spec asks.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct PlannedChange {
    pub field: String,
    pub from: String,
    pub to: String,
}

/// A Kubernetes-style condition.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// Condition type: `Ready` or `Synced`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    // A string in the schema, as in every Kubernetes condition.
    #[schemars(with = "String")]
    pub status: ConditionStatus,
    /// One-word, CamelCase cause, such as `StoreUnavailable`.
    pub reason: String,
    /// Human-readable detail.
    #[serde(default)]
    pub message: String,
    /// When `status` last changed.
    pub last_transition_time: DateTime<Utc>,
    /// The metadata.generation this condition was set for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// A condition's status, written as `True`, `False` or `Unknown`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConditionStatus {
    True,
    False,
    /// Any other value written by someone else also reads as Unknown: one
    /// odd condition must not make the Pet unreadable to the watch.
    #[serde(other)]
    Unknown,
}

impl ConditionStatus {
    pub const fn as_str(self) -> &'static str {
        match self {
            ConditionStatus::True => "True",
            ConditionStatus::False => "False",
            ConditionStatus::Unknown => "Unknown",
        }
    }
}

impl From<bool> for ConditionStatus {
    fn from(ok: bool) -> Self {
        if ok {
            ConditionStatus::True
        } else {
            ConditionStatus::False
        }
    }
}

/// Compares with the word as written, as code reading conditions does.
impl PartialEq<&str> for ConditionStatus {
    fn eq(&self, word: &&str) -> bool {
        self.as_str() == *word
    }
}

impl Pet {
    fn annotation(&self, key: &str) -> Option<&str> {
        self.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .map(String::as_str)
    }

    /// The paused annotation: absent is `false`; only `true` and `false`
    /// (any case) are valid.
    pub fn paused(&self) -> Setting<bool> {
        match self.annotation(PAUSED_ANNOTATION) {
            None => Setting::Valid(false),
            Some(v) if v.eq_ignore_ascii_case("true") => Setting::Valid(true),
            Some(v) if v.eq_ignore_ascii_case("false") => Setting::Valid(false),
            Some(v) => Setting::Invalid {
                annotation: PAUSED_ANNOTATION,
                value: v.to_owned(),
            },
        }
    }

    /// The effective deletion policy. Orphan wins if either the spec or the
    /// compatibility annotation says so; an annotation value that is neither
    /// Delete nor Orphan (any case) is invalid, so a typo never deletes.
    pub fn deletion_policy(&self) -> Setting<DeletionPolicy> {
        let annotated = match self.annotation(DELETION_POLICY_ANNOTATION) {
            None => None,
            Some(v) if v.eq_ignore_ascii_case("orphan") => Some(DeletionPolicy::Orphan),
            Some(v) if v.eq_ignore_ascii_case("delete") => Some(DeletionPolicy::Delete),
            Some(v) => {
                return Setting::Invalid {
                    annotation: DELETION_POLICY_ANNOTATION,
                    value: v.to_owned(),
                };
            }
        };
        let orphan = [annotated, self.spec.deletion_policy].contains(&Some(DeletionPolicy::Orphan));
        Setting::Valid(if orphan {
            DeletionPolicy::Orphan
        } else {
            DeletionPolicy::Delete
        })
    }

    /// The change policy: Automatic when unset.
    pub fn change_policy(&self) -> ChangePolicy {
        self.spec.change_policy.unwrap_or_default()
    }

    /// The plan hash approved by the annotation, if any (blank counts as
    /// none).
    pub fn approved_plan(&self) -> Option<&str> {
        self.annotation(APPROVE_PLAN_ANNOTATION)
            .map(str::trim)
            .filter(|hash| !hash.is_empty())
    }

    /// The record ID named for adoption, if any (blank counts as none).
    /// The installation named by [`HAND_OVER_TO_ANNOTATION`]; blank counts
    /// as none.
    pub fn hand_over_to(&self) -> Option<Setting<String>> {
        let value = self.annotation(HAND_OVER_TO_ANNOTATION)?.trim();
        if value.is_empty() {
            return None;
        }
        Some(if is_installation_name(value) {
            Setting::Valid(value.to_owned())
        } else {
            Setting::Invalid {
                annotation: HAND_OVER_TO_ANNOTATION,
                value: value.to_owned(),
            }
        })
    }

    /// `<namespace>/<name>`: the Pet as a person names it, and its record's
    /// identity in the store.
    pub fn identity(&self) -> String {
        use kube::ResourceExt as _;
        format!(
            "{}/{}",
            self.namespace().unwrap_or_default(),
            self.name_any()
        )
    }

    pub fn external_id(&self) -> Option<&str> {
        self.annotation(EXTERNAL_ID_ANNOTATION)
            .map(str::trim)
            .filter(|id| !id.is_empty())
    }

    pub fn status_id(&self) -> Option<&str> {
        self.status
            .as_ref()
            .and_then(|s| s.id.as_deref())
            .filter(|id| !id.is_empty())
    }

    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.status
            .as_ref()?
            .conditions
            .iter()
            .find(|c| c.type_ == type_)
    }
}

/// The Service in front of every operator replica, through which the API
/// server reaches the conversion webhook in a cluster
/// (`config/operator/service.yaml`).
pub const WEBHOOK_SERVICE: &str = "petstore-operator-metrics";
/// The operator's namespace in the shipped deployment.
pub const WEBHOOK_SERVICE_NAMESPACE: &str = "petstore-system";
/// The Service's port for the webhook (to the pods' 9443).
pub const WEBHOOK_SERVICE_PORT: i32 = 443;
/// The webhook's path.
pub const WEBHOOK_PATH: &str = "/convert";
/// The path of the guard on the Pet CRD's deletion, behind the same
/// Service (`config/operator/crd-guard.yaml`).
pub const CRD_GUARD_PATH: &str = "/guard-crd-deletion";
/// The ValidatingWebhookConfiguration of that guard.
pub const CRD_GUARD_CONFIGURATION: &str = "petstore-operator-crd-guard";
/// The path of the guard on deleting a PetStore or ClusterPetStore that
/// Pets use, behind the same Service (`config/operator/store-guard.yaml`).
pub const STORE_GUARD_PATH: &str = "/validate-store-deletion";
/// The ValidatingWebhookConfiguration of that guard.
pub const STORE_GUARD_CONFIGURATION: &str = "petstore-operator-store-guard";

/// The CRD: both versions, v1 stored, converted by the operator's webhook
/// behind [`WEBHOOK_SERVICE`]. The operator adds the CA bundle (and, run
/// outside the cluster, a URL) when it starts.
pub fn crd() -> Result<CustomResourceDefinition, kube::core::crd::MergeError> {
    use kube::CustomResourceExt;
    let mut crd = kube::core::crd::merge_crds(vec![v1alpha1::Pet::crd(), v1::Pet::crd()], "v1")?;
    for version in &mut crd.spec.versions {
        let birthday = version
            .schema
            .as_mut()
            .and_then(|schema| schema.open_api_v3_schema.as_mut())
            .and_then(|root| root.properties.as_mut()?.get_mut("spec"))
            .and_then(|spec| spec.properties.as_mut()?.get_mut("birthday"));
        if let Some(birthday) = birthday {
            birthday.x_kubernetes_validations = Some(vec![birthday_rule()]);
        }
        if let Some(root) = version
            .schema
            .as_mut()
            .and_then(|schema| schema.open_api_v3_schema.as_mut())
        {
            root.x_kubernetes_validations = Some(vec![store_ref_rule()]);
        }
    }
    crd.spec.conversion = Some(CustomResourceConversion {
        strategy: "Webhook".into(),
        webhook: Some(WebhookConversion {
            client_config: Some(WebhookClientConfig {
                service: Some(ServiceReference {
                    name: WEBHOOK_SERVICE.into(),
                    namespace: WEBHOOK_SERVICE_NAMESPACE.into(),
                    path: Some(WEBHOOK_PATH.into()),
                    port: Some(WEBHOOK_SERVICE_PORT),
                }),
                ..WebhookClientConfig::default()
            }),
            conversion_review_versions: vec!["v1".into()],
        }),
    });
    Ok(crd)
}

/// A CEL rule, because the schema cannot say it: `format: date` (and
/// `date-time`) accepts year 0, which no store keeps, so such a Pet would be
/// accepted and then never become Ready. CEL compares it as a timestamp,
/// and names the field with a message a person understands (a `pattern`
/// would show the regular expression).
fn birthday_rule() -> ValidationRule {
    ValidationRule {
        rule: "self >= timestamp('0001-01-01T00:00:00Z')".into(),
        message: Some("the birthday must be in year 1 or later".into()),
        reason: Some("FieldValueInvalid".into()),
        ..ValidationRule::default()
    }
}

/// What `spec.storeRef` must not do once the Pet has a record.
pub const STORE_REF_IMMUTABLE_MESSAGE: &str = "spec.storeRef cannot change once the Pet has a record (status.id is set); moving records between stores is not supported";

/// A transition rule on the whole Pet, the only level that sees both
/// `spec` and the old `status`: once the old Pet has a record, setting,
/// changing or removing `spec.storeRef` would leave that record behind in
/// the old store. Status writes (the status subresource) keep the spec, so
/// they always pass.
fn store_ref_rule() -> ValidationRule {
    ValidationRule {
        rule: "!has(oldSelf.status) || !has(oldSelf.status.id) || oldSelf.status.id == '' || (has(self.spec.storeRef) ? has(oldSelf.spec.storeRef) && self.spec.storeRef == oldSelf.spec.storeRef : !has(oldSelf.spec.storeRef))".into(),
        message: Some(STORE_REF_IMMUTABLE_MESSAGE.into()),
        reason: Some("FieldValueForbidden".into()),
        field_path: Some(".spec.storeRef".into()),
        ..ValidationRule::default()
    }
}

/// Why the CRD YAML could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    #[error("merging the versions: {0}")]
    Merge(#[from] kube::core::crd::MergeError),
    #[error("writing YAML: {0}")]
    Yaml(#[from] serde_norway::Error),
}

/// The CRD as YAML, exactly as written to `config/crd/`.
pub fn crd_yaml() -> Result<String, CrdError> {
    to_yaml(&crd()?)
}

/// Every CRD, as `(file name in config/crd/, YAML)`: what `cargo xtask
/// crdgen` writes and the drift tests compare.
pub fn crd_files() -> Result<Vec<(&'static str, String)>, CrdError> {
    use kube::CustomResourceExt;
    Ok(vec![
        (PETS_CRD_FILE, crd_yaml()?),
        (PETSTORES_CRD_FILE, to_yaml(&PetStore::crd())?),
        (CLUSTERPETSTORES_CRD_FILE, to_yaml(&ClusterPetStore::crd())?),
    ])
}

/// The Pet CRD's file in `config/crd/`.
pub const PETS_CRD_FILE: &str = "petstore.example.com_pets.yaml";
/// The PetStore CRD's file in `config/crd/`.
pub const PETSTORES_CRD_FILE: &str = "petstore.example.com_petstores.yaml";
/// The ClusterPetStore CRD's file in `config/crd/`.
pub const CLUSTERPETSTORES_CRD_FILE: &str = "petstore.example.com_clusterpetstores.yaml";

fn to_yaml(crd: &CustomResourceDefinition) -> Result<String, CrdError> {
    let body = serde_norway::to_string(crd)?;
    Ok(format!(
        "# Generated by `cargo xtask crdgen`; do not edit.\n{body}"
    ))
}
