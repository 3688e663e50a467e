//! Storage-version migration, after Kubernetes' kube-storage-version-migrator:
//! once `v1` is the CRD's storage version, Pets written before are still
//! stored as `v1alpha1`, and the CRD's `status.storedVersions` lists both.
//! The leader rewrites each Pet once, unchanged (the API server stores an
//! unchanged object in the current storage version, and skips the write for
//! one already stored so), then sets `storedVersions` to the storage
//! version alone, so that `v1alpha1` can one day stop being served.
//!
//! Every Pet listed must end accounted for: rewritten (a new
//! resourceVersion), found current (the API server skipped the write and
//! gave the same resourceVersion back) or gone (404). A write refused with
//! 409 is re-read and written again, as kube-storage-version-migrator does:
//! the change that won may have been made through an API server still
//! storing the old version. A Pet that still conflicts after
//! [`ATTEMPTS`] writes, or a run that listed Pets and rewrote or found
//! current none of them, fails the migration: `storedVersions` is left as
//! it was, for the next leader to try again.
//!
//! Idempotent: a restart part-way rewrites again, and objects already in the
//! storage version cost a read and no write.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use serde_json::json;
use tracing::{debug, error, info};

/// Pets listed per page.
const PAGE: u32 = 500;
/// Writes of one Pet before a run of 409 Conflicts fails the migration.
const ATTEMPTS: usize = 5;

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
    #[error("rewriting Pet {namespace}/{name}: still 409 Conflict after {ATTEMPTS} writes")]
    Conflicts { namespace: String, name: String },
    #[error(
        "{listed} Pets listed and none rewritten or found current ({gone} gone): nothing was migrated"
    )]
    NothingMigrated { listed: usize, gone: usize },
    #[error("setting status.storedVersions of the CRD {crd}: {source}")]
    SetStoredVersions {
        crd: String,
        #[source]
        source: kube::Error,
    },
}

/// What a migration did, Pet by Pet.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Migrated {
    /// Versions the CRD listed as stored before.
    pub stored_before: Vec<String>,
    /// Pets written in the storage version (a new resourceVersion).
    pub rewritten: usize,
    /// Pets the API server found in the storage version already, and did
    /// not write (the same resourceVersion back).
    pub current: usize,
    /// Pets deleted between the list and their write.
    pub gone: usize,
}

/// How one Pet ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Rewritten,
    Current,
    Gone,
}

impl Outcome {
    const fn label(self) -> &'static str {
        match self {
            Outcome::Rewritten => "rewritten",
            Outcome::Current => "current",
            Outcome::Gone => "gone",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

/// The migration's counters, registered with the operator's others.
#[derive(Clone, Debug, Default)]
pub struct MigrationMetrics {
    pets: Family<OutcomeLabels, Counter>,
    runs: Family<ResultLabels, Counter>,
}

impl MigrationMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "storage_migration_pets",
            "Pets handled by the storage-version migration, by outcome: rewritten (written in the storage version), current (stored so already; not written), gone (deleted meanwhile)",
            self.pets.clone(),
        );
        registry.register(
            "storage_migrations",
            "Storage-version migrations run, by result: done (status.storedVersions set to the storage version) or failed (left as it was)",
            self.runs.clone(),
        );
    }

    fn pet(&self, outcome: Outcome) {
        self.pets
            .get_or_create(&OutcomeLabels {
                outcome: outcome.label(),
            })
            .inc();
    }

    fn run(&self, result: &'static str) {
        self.runs.get_or_create(&ResultLabels { result }).inc();
    }
}

/// [`migrate_storage`], logged and counted: a failure is an error line and
/// `storage_migrations_total{result="failed"}`.
pub async fn run(client: &Client, crd_name: &str, metrics: &MigrationMetrics) {
    match migrate_storage(client, crd_name, metrics).await {
        Ok(None) => {}
        Ok(Some(_)) => metrics.run("done"),
        Err(err) => {
            metrics.run("failed");
            error!(error = %err, "storage migration failed; status.storedVersions left as it was, the next leader tries again");
        }
    }
}

/// Rewrites every Pet in the CRD's storage version if `status.storedVersions`
/// lists any other version, then lists the storage version alone there.
/// `None` when there was nothing to do.
pub async fn migrate_storage(
    client: &Client,
    crd_name: &str,
    metrics: &MigrationMetrics,
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
    let mut migrated = rewrite_all(client, &resource, metrics).await?;
    let listed = migrated.rewritten + migrated.current + migrated.gone;
    // A run that touched nothing it listed proves nothing about what is
    // stored (every write misdirected, say); the next leader tries again.
    if listed > 0 && migrated.rewritten + migrated.current == 0 {
        return Err(MigrationError::NothingMigrated {
            listed,
            gone: migrated.gone,
        });
    }
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
        rewritten = migrated.rewritten,
        current = migrated.current,
        gone = migrated.gone,
        storage_version = %storage.name,
        "storage migration done; status.storedVersions lists the storage version alone"
    );
    migrated.stored_before = stored_before;
    Ok(Some(migrated))
}

/// Every object of `resource`, read and written back unchanged, a page at
/// a time.
async fn rewrite_all(
    client: &Client,
    resource: &ApiResource,
    metrics: &MigrationMetrics,
) -> Result<Migrated, MigrationError> {
    let all: Api<DynamicObject> = Api::all_with(client.clone(), resource);
    let mut params = ListParams::default().limit(PAGE);
    let mut migrated = Migrated::default();
    loop {
        let page = all.list(&params).await.map_err(MigrationError::List)?;
        for object in page.items {
            let outcome = rewrite(client, resource, object).await?;
            metrics.pet(outcome);
            match outcome {
                Outcome::Rewritten => migrated.rewritten += 1,
                Outcome::Current => migrated.current += 1,
                Outcome::Gone => migrated.gone += 1,
            }
        }
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(migrated),
        }
    }
}

/// Writes one Pet back unchanged; on 409 reads it again and retries.
async fn rewrite(
    client: &Client,
    resource: &ApiResource,
    mut object: DynamicObject,
) -> Result<Outcome, MigrationError> {
    let namespace = object.namespace().unwrap_or_default();
    let name = object.name_any();
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, resource);
    let failed = |source| MigrationError::Rewrite {
        namespace: namespace.clone(),
        name: name.clone(),
        source,
    };
    for attempt in 1..=ATTEMPTS {
        let sent = object.resource_version();
        match api.replace(&name, &PostParams::default(), &object).await {
            Ok(written) if written.resource_version() == sent => return Ok(Outcome::Current),
            Ok(_) => return Ok(Outcome::Rewritten),
            Err(kube::Error::Api(status)) if status.code == 404 => {
                debug!(%namespace, %name, "deleted meanwhile");
                return Ok(Outcome::Gone);
            }
            Err(kube::Error::Api(status)) if status.code == 409 => {
                if attempt == ATTEMPTS {
                    break;
                }
                debug!(%namespace, %name, "changed meanwhile; reading it again");
                // A list by name, not a get: the list the operator needs
                // anyway, so its RBAC grants no verb for this rare path.
                let by_name = ListParams::default().fields(&format!("metadata.name={name}"));
                match api
                    .list(&by_name)
                    .await
                    .map_err(failed)?
                    .items
                    .into_iter()
                    .next()
                {
                    Some(fresh) => object = fresh,
                    None => return Ok(Outcome::Gone),
                }
            }
            Err(source) => return Err(failed(source)),
        }
    }
    Err(MigrationError::Conflicts { namespace, name })
}

#[cfg(test)]
mod tests;
