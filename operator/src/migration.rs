//! Storage-version migration, after Kubernetes' kube-storage-version-migrator:
//! once `v1` is the CRD's storage version, Pets written before are still
//! stored as `v1alpha1`, and the CRD's `status.storedVersions` lists both.
//! The leader rewrites each Pet once, unchanged (the API server stores an
//! unchanged object in the current storage version, and skips the write for
//! one already stored so), then sets `storedVersions` to the storage
//! version alone, so that `v1alpha1` can one day stop being served.
//!
//! Idempotent: a restart part-way rewrites again, and objects already in the
//! storage version cost a read and no write. A Pet that changed or went
//! meanwhile was rewritten by that change, or needs nothing.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tracing::{debug, info};

/// Pets listed per page.
const PAGE: u32 = 500;

#[derive(Debug, thiserror::Error)]
pub enum MigrationError {
    #[error("reading the CRD {crd}: {source}")]
    ReadCrd {
        crd: String,
        #[source]
        source: kube::Error,
    },
    #[error("the CRD {0} has no storage version")]
    NoStorageVersion(String),
    #[error("listing Pets: {0}")]
    List(#[source] kube::Error),
    #[error("rewriting Pet {namespace}/{name}: {source}")]
    Rewrite {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("setting status.storedVersions of the CRD {crd}: {source}")]
    SetStoredVersions {
        crd: String,
        #[source]
        source: kube::Error,
    },
}

/// What a migration did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Migrated {
    /// Versions the CRD listed as stored before.
    pub stored_before: Vec<String>,
    /// Pets rewritten (including those the API server found already in the
    /// storage version, and did not write).
    pub pets: usize,
}

/// Rewrites every Pet in the CRD's storage version if `status.storedVersions`
/// lists any other version, then lists the storage version alone there.
/// `None` when there was nothing to do.
pub async fn migrate_storage(
    client: &Client,
    crd_name: &str,
) -> Result<Option<Migrated>, MigrationError> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = crds
        .get(crd_name)
        .await
        .map_err(|source| MigrationError::ReadCrd {
            crd: crd_name.to_owned(),
            source,
        })?;
    let Some(storage) = crd.spec.versions.iter().find(|v| v.storage) else {
        return Err(MigrationError::NoStorageVersion(crd_name.to_owned()));
    };
    let stored_before = crd
        .status
        .as_ref()
        .and_then(|status| status.stored_versions.clone())
        .unwrap_or_default();
    if stored_before.iter().all(|version| *version == storage.name) {
        debug!(?stored_before, "no storage migration needed");
        return Ok(None);
    }
    info!(
        ?stored_before,
        storage_version = %storage.name,
        "migrating every Pet to the storage version"
    );
    let resource = ApiResource {
        group: crd.spec.group.clone(),
        version: storage.name.clone(),
        api_version: format!("{}/{}", crd.spec.group, storage.name),
        kind: crd.spec.names.kind.clone(),
        plural: crd.spec.names.plural.clone(),
    };
    let pets = rewrite_all(client, &resource).await?;
    crds.patch_status(
        crd_name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": { "storedVersions": [storage.name] } })),
    )
    .await
    .map_err(|source| MigrationError::SetStoredVersions {
        crd: crd_name.to_owned(),
        source,
    })?;
    info!(
        pets,
        storage_version = %storage.name,
        "storage migration done; status.storedVersions lists the storage version alone"
    );
    Ok(Some(Migrated {
        stored_before,
        pets,
    }))
}

/// Every object of `resource`, read and written back unchanged, a page at
/// a time.
async fn rewrite_all(client: &Client, resource: &ApiResource) -> Result<usize, MigrationError> {
    let all: Api<DynamicObject> = Api::all_with(client.clone(), resource);
    let mut params = ListParams::default().limit(PAGE);
    let mut rewritten = 0;
    loop {
        let page = all.list(&params).await.map_err(MigrationError::List)?;
        for object in &page.items {
            let namespace = object.namespace().unwrap_or_default();
            let name = object.name_any();
            let api: Api<DynamicObject> =
                Api::namespaced_with(client.clone(), &namespace, resource);
            match api.replace(&name, &PostParams::default(), object).await {
                Ok(_) => rewritten += 1,
                // Changed since listed (so written in the storage version
                // already) or deleted: nothing left to migrate.
                Err(kube::Error::Api(status)) if status.code == 409 || status.code == 404 => {
                    debug!(%namespace, %name, code = status.code, "changed meanwhile; skipped");
                }
                Err(source) => {
                    return Err(MigrationError::Rewrite {
                        namespace,
                        name,
                        source,
                    });
                }
            }
        }
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(rewritten),
        }
    }
}
