//! Test fixtures, after controller-rs's `Document::test()`: a Pet as the API
//! server returns it, changed by name (`Pet::test().finalized().deleted()`)
//! rather than built from positional flags.

use chrono::NaiveDate;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::core::ObjectMeta;
use serde_json::Value;

use crate::crd::{
    ChangePolicy, DeletionPolicy, FINALIZER, Pet, PetSpec, PetStatus, PetType, PlanStatus,
};
use crate::store::{PetData, Record, RecordChange};

pub const UID: &str = "8d3c7c51-uid";
/// Thor's identity in the store: `<namespace>/<name>` of [`Pet::test`].
pub const IDENTITY: &str = "default/thor";
/// The id of Thor's store record, where a test needs it fixed.
pub const RECORD_ID: &str = "record-1";

impl Pet {
    /// Thor, a dog, just created in namespace `default`: generation 1, no
    /// finalizer, no status.
    pub fn test() -> Pet {
        let spec: PetSpec = serde_json::from_value(serde_json::json!({
            "name": "Thor", "type": "dog", "birthday": "2021-04-01",
        }))
        .expect("a valid spec");
        let mut pet = Pet::new("thor", spec);
        pet.metadata = ObjectMeta {
            name: Some("thor".into()),
            namespace: Some("default".into()),
            uid: Some(UID.into()),
            generation: Some(1),
            resource_version: Some("1".into()),
            ..ObjectMeta::default()
        };
        pet
    }

    /// With our finalizer.
    pub fn finalized(mut self) -> Self {
        self.metadata.finalizers = Some(vec![FINALIZER.into()]);
        self
    }

    /// Being deleted.
    pub fn deleted(mut self) -> Self {
        let at = "2026-01-01T00:00:00Z".parse().expect("a timestamp");
        self.metadata.deletion_timestamp = Some(Time(at));
        self
    }

    /// Another Pet of the same name.
    pub fn with_uid(mut self, uid: &str) -> Self {
        self.metadata.uid = Some(uid.into());
        self
    }

    pub fn with_generation(mut self, generation: i64) -> Self {
        self.metadata.generation = Some(generation);
        self
    }

    pub fn annotated(mut self, key: &str, value: &str) -> Self {
        self.metadata
            .annotations
            .get_or_insert_default()
            .insert(key.into(), value.into());
        self
    }

    pub fn with_deletion_policy(mut self, policy: DeletionPolicy) -> Self {
        self.spec.deletion_policy = Some(policy);
        self
    }

    pub fn with_change_policy(mut self, policy: ChangePolicy) -> Self {
        self.spec.change_policy = Some(policy);
        self
    }

    /// With this record ID in its status, and nothing else there.
    pub fn with_status_id(mut self, id: &str) -> Self {
        self.status.get_or_insert_default().id = Some(id.into());
        self
    }

    /// Shown Ready and in sync with record `id` at its current generation,
    /// as after a successful reconcile.
    pub fn ready(self, id: &str) -> Self {
        let generation = self.metadata.generation;
        let condition = |type_: &str, reason: &str| {
            serde_json::json!({
                "type": type_, "status": "True", "reason": reason, "message": "",
                "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": generation,
            })
        };
        self.with_status(serde_json::json!({
            "id": id,
            "observedGeneration": generation,
            "conditions": [condition("Ready", "Available"), condition("Synced", "Synced")],
        }))
    }

    /// Showing a pending plan (Approve or Observe) for its generation.
    pub fn showing_plan(mut self) -> Self {
        let generation = self.metadata.generation;
        self.status.get_or_insert_default().plan = Some(PlanStatus {
            hash: "0123456789abcdef".into(),
            summary: "update name".into(),
            cause: "drift".into(),
            generation,
            actions: Vec::new(),
        });
        self
    }

    /// Another copy of the Pet, as the API server numbers each write.
    pub fn with_resource_version(mut self, version: &str) -> Self {
        self.metadata.resource_version = Some(version.into());
        self
    }

    /// With the status the operator wrote (as the API server saw it).
    pub fn with_status(mut self, status: Value) -> Self {
        let status: PetStatus = serde_json::from_value(status).expect("a valid status");
        self.status = Some(status);
        self
    }

    /// As the API server sends it.
    pub fn json(&self) -> Value {
        serde_json::to_value(self).expect("a Pet serialises")
    }
}

impl PetData {
    /// Thor's data, as `Pet::test()` describes it.
    pub fn test() -> PetData {
        PetData {
            name: "Thor".into(),
            pet_type: PetType::Dog,
            birthday: NaiveDate::from_ymd_opt(2021, 4, 1).expect("a date"),
        }
    }

    /// Thor's data under another name (changed out of band, or a new spec).
    pub fn named(name: &str) -> PetData {
        PetData {
            name: name.into(),
            ..PetData::test()
        }
    }

    /// Another kind of animal.
    pub fn of_type(mut self, kind: PetType) -> Self {
        self.pet_type = kind;
        self
    }

    /// Born on another day.
    pub fn born(mut self, year: i32, month: u32, day: u32) -> Self {
        self.birthday = NaiveDate::from_ymd_opt(year, month, day).expect("a date");
        self
    }
}

impl RecordChange {
    /// The change feed's news that record `id`, keyed `key`, now holds
    /// Thor's data under `name`.
    pub fn changed(id: &str, key: &str, name: &str) -> Self {
        Self {
            revision: 7,
            id: id.into(),
            record: Some(Record {
                id: id.into(),
                key: key.into(),
                identity: String::new(),
                data: PetData::named(name),
            }),
            identity: String::new(),
        }
    }

    /// The change feed's news that record `id` was deleted.
    pub fn deleted(id: &str) -> Self {
        Self {
            revision: 7,
            id: id.into(),
            record: None,
            identity: String::new(),
        }
    }

    /// The same change, to a record holding this identity.
    pub fn named(mut self, identity: &str) -> Self {
        if let Some(record) = &mut self.record {
            record.identity = identity.into();
        }
        self.identity = identity.into();
        self
    }
}

/// Makes a test's own subscriber (`tracing::subscriber::set_default`) see
/// every span and event on its thread. Without a global subscriber, a
/// callsite first reached on another test's thread can cache "never
/// interested" while this test's subscriber is being registered (a race in
/// tracing's callsite cache), and the test then sees nothing: the test of
/// the store calls' spans failed so, about once in 13 runs. A global
/// registry without layers is interested in everything and shows nothing.
pub fn scoped_subscribers_see_everything() {
    static GLOBAL: std::sync::Once = std::sync::Once::new();
    GLOBAL.call_once(|| {
        let _ = tracing::subscriber::set_global_default(tracing_subscriber::registry());
    });
}

/// The metrics text of what `register` adds to a registry, named as the
/// operator names its metrics.
pub fn metrics_text(register: impl FnOnce(&mut prometheus_client::registry::Registry)) -> String {
    let mut registry = prometheus_client::registry::Registry::with_prefix("petstore_operator");
    register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
    text
}

/// Fails, naming the part, unless `text` contains every one of `parts`.
#[track_caller]
pub fn assert_mentions(text: &str, parts: &[&str]) {
    for part in parts {
        assert!(text.contains(part), "{part:?} missing: {text}");
    }
}
