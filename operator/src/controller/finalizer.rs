//! The finalizer `pet.petstore.example.com`, added before anything exists in
//! the store and released once the store side of a deletion is done.
//!
//! Not kube's `finalizer()` helper: after adding the finalizer that one ends
//! the reconcile and waits for the watch event of its own write. Here the
//! reconcile carries on with the object the API server returned, one round
//! trip less per new Pet, and the decision step, not the helper, says when
//! the finalizer is added or released (a paused Pet gets none, a misspelled
//! deletion policy keeps it).
//!
//! Both writes carry the resourceVersion read, so the API server refuses
//! (409) if anyone changed the Pet meanwhile, and no other finalizer is ever
//! overwritten.

use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};

use crate::Error;
use crate::crd::{FINALIZER, Pet};

/// Adds our finalizer; returns the Pet as the API server now has it.
pub async fn add(api: &Api<Pet>, pet: &Pet) -> Result<Pet, Error> {
    let mut finalizers = pet.finalizers().to_vec();
    finalizers.push(FINALIZER.to_owned());
    patch(api, pet, finalizers)
        .await
        .map_err(|source| Error::AddFinalizer {
            name: pet.name_any(),
            source,
        })
}

/// Removes our finalizer, letting the Pet go.
pub async fn remove(api: &Api<Pet>, pet: &Pet) -> Result<(), Error> {
    let finalizers = pet
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    patch(api, pet, finalizers)
        .await
        .map(drop)
        .map_err(|source| Error::RemoveFinalizer {
            name: pet.name_any(),
            source,
        })
}

async fn patch(api: &Api<Pet>, pet: &Pet, finalizers: Vec<String>) -> Result<Pet, kube::Error> {
    let patch = serde_json::json!({
        "metadata": {
            "finalizers": finalizers,
            "resourceVersion": pet.resource_version(),
        }
    });
    api.patch(
        &pet.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
}
