//! Writes a Pet's status for the outcome of a reconcile, only when it
//! differs from what the Pet shows.

use chrono::Utc;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, Resource, ResourceExt};

use crate::Error;
use crate::crd::{PENDING_PLAN_FIELD, Pet, PetStatus};
use crate::status::{Outcome, PlanUpdate, next_status};

/// Writes the status for `outcome`, with `id` as the record's ID (`None`
/// keeps the current one) and `plan` applied to `status.plan`. A merge
/// patch without a resourceVersion never conflicts (the API server applies
/// it to whatever is current), so there is nothing to re-read and retry,
/// and the operator needs no `get` or `update` on the status.
///
/// Returns the resourceVersion the write gave the Pet, if it wrote and the
/// reply named one; `None` when the Pet already showed it all.
pub async fn write(
    client: &Client,
    pet: &Pet,
    id: Option<&str>,
    outcome: &Outcome,
    plan: &PlanUpdate,
) -> Result<Option<String>, Error> {
    let name = pet.name_any();
    let current = pet.status.as_ref();
    let now = Utc::now();
    let mut next = next_status(current, pet.metadata.generation, id, outcome, now);
    plan.apply_to(&mut next, now);
    if current == Some(&next) {
        return Ok(None);
    }
    // Only a plan the Pet shows needs removing: most writes send none.
    let clear_plan = matches!(plan, PlanUpdate::Clear { .. })
        && current.is_some_and(|status| status.plan.is_some());
    patch(client, pet, &name, &next, clear_plan)
        .await
        .map_err(|source| Error::WriteStatus { name, source })
}

/// Merge-patches the Pet's status; returns the resourceVersion the reply
/// names. Only that is decoded from the reply (the whole Pet, managedFields
/// and all): the watch brings the same object to the cache anyway. Errors,
/// a 409 among them, are kube's as usual.
async fn patch(
    client: &Client,
    pet: &Pet,
    name: &str,
    status: &PetStatus,
    clear_plan: bool,
) -> Result<Option<String>, kube::Error> {
    let mut body = serde_json::json!({ "status": status });
    // The Plan column's field follows the plan in the same write.
    if let Some(plan) = &status.plan {
        body["status"][PENDING_PLAN_FIELD] = plan.summary.clone().into();
    } else if clear_plan {
        // A merge patch removes only what it sets to null; the API server
        // then fills the field's default, `none`.
        body["status"]["plan"] = serde_json::Value::Null;
        body["status"][PENDING_PLAN_FIELD] = serde_json::Value::Null;
    }
    let patch = Patch::Merge(body);
    let request = kube::core::Request::new(Pet::url_path(&(), pet.namespace().as_deref()))
        .patch_subresource("status", name, &PatchParams::default(), &patch)
        .map_err(kube::Error::BuildRequest)?;
    let reply = client.request_text(request).await?;
    Ok(resource_version_of(&reply))
}

/// `metadata.resourceVersion` of an object's JSON, without decoding the rest.
fn resource_version_of(reply: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Reply {
        metadata: Metadata,
    }
    #[derive(serde::Deserialize)]
    struct Metadata {
        #[serde(rename = "resourceVersion")]
        resource_version: Option<String>,
    }
    serde_json::from_str::<Reply>(reply)
        .ok()
        .and_then(|reply| reply.metadata.resource_version)
}

/// Writes `status.store` alone: the store a Pet's record is about to be
/// made in, before it is (see [`crate::stores`]). The Pet as written: a
/// later write (the finalizer's) must carry its resourceVersion.
pub async fn pin_store(api: &Api<Pet>, pet: &Pet, store: Option<&str>) -> Result<Pet, Error> {
    let name = pet.name_any();
    let body = serde_json::json!({ "status": { "store": store } });
    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&body))
        .await
        .map_err(|source| Error::WriteStatus { name, source })
}

#[cfg(test)]
mod tests {
    use super::resource_version_of;

    #[test]
    fn the_reply_gives_its_resource_version_and_nothing_else_is_needed() {
        let reply = r#"{"apiVersion":"petstore.example.com/v1","kind":"Pet","metadata":{"name":"thor","resourceVersion":"4711","managedFields":[{"manager":"x"}]},"spec":{"name":"Thor"},"status":{"id":"r-1"}}"#;
        assert_eq!(resource_version_of(reply).as_deref(), Some("4711"));
        assert_eq!(resource_version_of(r#"{"metadata":{}}"#), None);
        assert_eq!(resource_version_of("not json"), None);
    }
}
