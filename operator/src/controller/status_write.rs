//! Writes a Pet's status for the outcome of a reconcile, only when it
//! differs from what the Pet shows.

use chrono::Utc;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, Resource, ResourceExt};
use tracing::debug;

use crate::Error;
use crate::crd::{PENDING_PLAN_FIELD, Pet, PetStatus};
use crate::status::{Outcome, PlanUpdate, next_status};

/// Status writes tried after a 409 before giving up (and retrying the whole
/// reconcile with backoff, which never creates again: the create is keyed by
/// the Pet's UID).
const ATTEMPTS: u32 = 5;

/// Writes the status for `outcome`, with `id` as the record's ID (`None`
/// keeps the current one) and `plan` applied to `status.plan`. On a 409 it re-reads the status and recomputes
/// from it.
pub async fn write(
    client: &Client,
    api: &Api<Pet>,
    pet: &Pet,
    id: Option<&str>,
    outcome: &Outcome,
    plan: &PlanUpdate,
) -> Result<(), Error> {
    let name = pet.name_any();
    // The generation acted upon, even if a re-read shows a newer one.
    let generation = pet.metadata.generation;
    let mut current = pet.status.clone();
    let mut attempt = 1;
    loop {
        let now = Utc::now();
        let mut next = next_status(current.as_ref(), generation, id, outcome, now);
        plan.apply_to(&mut next, now);
        if current.as_ref() == Some(&next) {
            return Ok(());
        }
        // Only a plan the Pet shows needs removing: most writes send none.
        let clear_plan = matches!(plan, PlanUpdate::Clear { .. })
            && current.as_ref().is_some_and(|status| status.plan.is_some());
        match patch(client, pet, &name, &next, clear_plan).await {
            Ok(()) => return Ok(()),
            Err(kube::Error::Api(status)) if status.is_conflict() && attempt < ATTEMPTS => {
                debug!(attempt, "status write conflicted; re-reading the Pet");
                attempt += 1;
                current = api
                    .get_status(&name)
                    .await
                    .map_err(|source| Error::WriteStatus {
                        name: name.clone(),
                        source,
                    })?
                    .status;
            }
            Err(source) => return Err(Error::WriteStatus { name, source }),
        }
    }
}

/// Merge-patches the Pet's status. The reply (the whole Pet, managedFields
/// and all) is not decoded: nothing reads it, and the watch brings the same
/// object to the cache anyway. Errors, a 409 among them, are kube's as usual.
async fn patch(
    client: &Client,
    pet: &Pet,
    name: &str,
    status: &PetStatus,
    clear_plan: bool,
) -> Result<(), kube::Error> {
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
    client.request_text(request).await.map(drop)
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
