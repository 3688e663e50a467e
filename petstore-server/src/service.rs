//! The gRPC layer: validates each request at the edge, then calls [`Storage`].
//! What every call shares (its span, metrics and place under the bound on
//! calls at once) is not here but in the server's tower layers
//! ([`crate::observe`], [`crate::admission`]).

use std::sync::Arc;

use petstore_proto::PetStore;
use petstore_proto::petstore as pb;
use petstore_telemetry::SharedSampler;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tracing::{Instrument, Span};

use crate::auth::{CertificateIdentity, Tenancy};
use crate::metrics::ServerMetrics;
use crate::model::PetRecord;
use crate::storage::{LookupBy, PageRequest, SearchPage, Storage, StorageError};
use crate::tenancy::Access;
use crate::watch::{WatchOptions, WatchStream};
use crate::{validate, watch, wire};

/// What the store measures and how it samples traces; `ChangeSampler`
/// switches `sampler` (the same handle the tracer provider holds).
#[derive(Clone, Debug, Default)]
pub struct Observability {
    pub metrics: Arc<ServerMetrics>,
    pub sampler: SharedSampler,
    /// Whether calls open spans: only when spans are exported, as a span
    /// per call costs the log layer measurable time for nothing otherwise.
    pub spans: bool,
}

impl Observability {
    pub fn new(sampler: SharedSampler, spans: bool) -> Self {
        let metrics = Arc::new(ServerMetrics::default());
        metrics.set_sampler(sampler.get());
        Self {
            metrics,
            sampler,
            spans,
        }
    }
}

pub struct PetStoreService {
    storage: Arc<dyn Storage>,
    observability: Observability,
    watch: WatchOptions,
    /// Turns true when the server starts draining: open watch streams end,
    /// so the drain does not wait for them forever.
    stopping: tokio::sync::watch::Receiver<bool>,
    /// Tenancy, when on: every call then needs a token, and acts for the
    /// tenant (or observer) it names.
    tenancy: Option<Arc<Tenancy>>,
    /// Whether every connection presents a client certificate (a client CA
    /// is set): tenancy then binds each token to the certificate it came
    /// with.
    client_certificates: bool,
}

impl PetStoreService {
    pub fn new(storage: Arc<dyn Storage>, observability: Observability) -> Self {
        let (_, stopping) = tokio::sync::watch::channel(false);
        Self {
            storage,
            observability,
            watch: WatchOptions::default(),
            stopping,
            tenancy: None,
            client_certificates: false,
        }
    }

    /// Enforces tenancy (`None`: off, every call acts for everyone).
    pub fn with_tenancy(mut self, tenancy: Option<Arc<Tenancy>>) -> Self {
        self.tenancy = tenancy;
        self
    }

    /// Connections come with client certificates (the store has a client
    /// CA): with tenancy, each call's token must then be one its
    /// certificate may carry ([`crate::auth::certificate_may_carry`]).
    pub fn with_client_certificates(mut self, required: bool) -> Self {
        self.client_certificates = required;
        self
    }

    /// Whom a call acts for: everyone with tenancy off; else the tenant or
    /// observer its token names, if its client certificate may carry that
    /// token, or the refusal (counted).
    fn access<T>(&self, request: &Request<T>, method: &'static str) -> Result<Access, Status> {
        let Some(tenancy) = &self.tenancy else {
            return Ok(Access::All);
        };
        let certificate = self.client_certificates.then(|| client_identity(request));
        tenancy
            .access(request.metadata(), certificate.as_ref())
            .map_err(|refusal| {
                self.observability
                    .metrics
                    .tenant_refused(method, refusal.reason());
                let status = refusal.status();
                tracing::info!(
                    method,
                    reason = refusal.reason(),
                    message = status.message(),
                    "call refused by tenancy"
                );
                status
            })
    }

    /// A storage failure as the call's status; tenancy's refusals counted.
    fn storage_status(&self, method: &'static str, err: StorageError) -> Status {
        if let StorageError::Denied { denial, .. } = &err {
            let reason = denial.reason();
            self.observability.metrics.tenant_refused(method, reason);
            let message = err.to_string();
            tracing::info!(method, reason, message, "write refused by tenancy");
            return Status::permission_denied(message);
        }
        err.into()
    }

    /// Serves `WatchPets` with `options`, ending every stream once
    /// `stopping` turns true.
    pub fn with_watch(
        mut self,
        options: WatchOptions,
        stopping: tokio::sync::watch::Receiver<bool>,
    ) -> Self {
        self.watch = options;
        self.stopping = stopping;
        self
    }

    /// A span made by `make`, or none when calls open no spans.
    fn span(&self, make: impl FnOnce() -> Span) -> Span {
        if self.observability.spans {
            make()
        } else {
            Span::none()
        }
    }
}

/// The identity in the client certificate a call's connection presented
/// (the chain's first); none presented reads as unnamed, and is refused.
fn client_identity<T>(request: &Request<T>) -> CertificateIdentity {
    request
        .peer_certs()
        .and_then(|chain| chain.first().map(|der| CertificateIdentity::from_der(der)))
        .unwrap_or(CertificateIdentity::Unnamed)
}

impl From<StorageError> for Status {
    fn from(err: StorageError) -> Self {
        match err {
            StorageError::NotFound { index, id } => {
                Status::not_found(format!("pets[{index}].id: no pet with ID {id:?}"))
            }
            StorageError::KeyMismatch {
                index,
                id,
                expected,
                actual,
            } => Status::failed_precondition(format!(
                "changes[{index}].expected_key: pet {id:?} has key {actual:?}, not {expected:?}"
            )),
            StorageError::KeyTaken { index, key } => Status::already_exists(format!(
                "changes[{index}].new_key: key {key:?} already belongs to another pet"
            )),
            StorageError::IdentityTaken { index, identity } => Status::already_exists(format!(
                "changes[{index}].new_identity: identity {identity:?} already belongs to another pet"
            )),
            denied @ StorageError::Denied { .. } => Status::permission_denied(denied.to_string()),
            other => {
                tracing::error!(error = %other, "storage failure");
                Status::unavailable(other.to_string())
            }
        }
    }
}

/// Pets buffered ahead of a slow search client; with the page size, bounds
/// memory per stream whatever the store holds.
const SEARCH_CHANNEL_DEPTH: usize = 64;
/// Entries a search scans per storage call (see `Storage::search_page`).
pub const SEARCH_PAGE: usize = 256;

#[tonic::async_trait]
impl PetStore for PetStoreService {
    async fn add_pets(
        &self,
        request: Request<pb::AddPetsReq>,
    ) -> Result<Response<pb::AddPetsResp>, Status> {
        let access = self.access(&request, "AddPets")?;
        let pets = validate::add_request(request.get_ref())?;
        let count = pets.len();
        let added = self
            .storage
            .add(&access, &pets)
            .instrument(self.span(|| tracing::info_span!("storage.add_pets")))
            .await
            .map_err(|err| self.storage_status("AddPets", err))?;
        tracing::debug!(count, "added pets");
        let created = added.iter().map(|a| a.created).collect();
        let ids = added.into_iter().map(|a| a.id).collect();
        Ok(Response::new(pb::AddPetsResp { ids, created }))
    }

    async fn update_pets(
        &self,
        request: Request<pb::UpdatePetsReq>,
    ) -> Result<Response<pb::UpdatePetsResp>, Status> {
        let access = self.access(&request, "UpdatePets")?;
        let updates = validate::update_request(request.get_ref())?;
        let count = updates.len();
        self.storage
            .update(&access, &updates)
            .instrument(self.span(|| tracing::info_span!("storage.update_pets")))
            .await
            .map_err(|err| self.storage_status("UpdatePets", err))?;
        tracing::debug!(count, "updated pets");
        Ok(Response::new(pb::UpdatePetsResp {}))
    }

    async fn delete_pets(
        &self,
        request: Request<pb::DeletePetsReq>,
    ) -> Result<Response<pb::DeletePetsResp>, Status> {
        let access = self.access(&request, "DeletePets")?;
        let ids = request.into_inner().ids;
        validate::ids("ids", &ids)?;
        let count = ids.len();
        self.storage
            .delete(&access, &ids)
            .instrument(self.span(|| tracing::info_span!("storage.delete_pets")))
            .await
            .map_err(|err| self.storage_status("DeletePets", err))?;
        tracing::debug!(count, "deleted pets");
        Ok(Response::new(pb::DeletePetsResp {}))
    }

    type SearchPetsStream = ReceiverStream<Result<pb::Pet, Status>>;

    async fn search_pets(
        &self,
        request: Request<pb::SearchPetsReq>,
    ) -> Result<Response<Self::SearchPetsStream>, Status> {
        let access = self.access(&request, "SearchPets")?;
        self.search(access, request.into_inner()).await
    }

    async fn change_sampler(
        &self,
        request: Request<pb::ChangeSamplerReq>,
    ) -> Result<Response<pb::ChangeSamplerResp>, Status> {
        if let Access::Tenant(namespace) = self.access(&request, "ChangeSampler")? {
            // The sampler is every tenant's: a tenant does not change it.
            let refusal = crate::auth::Refusal::ObserverOnly {
                namespace,
                what: "change the trace sampler",
            };
            self.observability
                .metrics
                .tenant_refused("ChangeSampler", refusal.reason());
            return Err(refusal.status());
        }
        let setting = validate::change_sampler_request(request.get_ref())?;
        self.observability.sampler.set(setting);
        self.observability.metrics.set_sampler(setting);
        tracing::info!(sampler = %setting, "trace sampler changed");
        Ok(Response::new(pb::ChangeSamplerResp {}))
    }

    async fn set_idempotency_keys(
        &self,
        request: Request<pb::SetIdempotencyKeysReq>,
    ) -> Result<Response<pb::SetIdempotencyKeysResp>, Status> {
        let access = self.access(&request, "SetIdempotencyKeys")?;
        self.set_keys(access, request.into_inner()).await
    }

    async fn get_pets(
        &self,
        request: Request<pb::GetPetsReq>,
    ) -> Result<Response<pb::GetPetsResp>, Status> {
        let access = self.access(&request, "GetPets")?;
        self.get(access, request.into_inner()).await
    }

    async fn claim_installation(
        &self,
        request: Request<pb::ClaimInstallationReq>,
    ) -> Result<Response<pb::ClaimInstallationResp>, Status> {
        // Claims are not records: any tenant or observer may claim.
        self.access(&request, "ClaimInstallation")?;
        let claim = validate::claim_request(request.get_ref())?;
        let outcome = self
            .storage
            .claim_installation(&claim)
            .instrument(self.span(|| tracing::info_span!("storage.claim_installation")))
            .await?;
        if outcome.granted {
            tracing::debug!(installation = %claim.installation, holder = %claim.holder, "installation claimed");
        } else {
            tracing::info!(
                installation = %claim.installation,
                claimant = %claim.holder,
                holder = %outcome.holder,
                remaining_ms = outcome.remaining_millis,
                "installation claim refused: held by another"
            );
        }
        Ok(Response::new(pb::ClaimInstallationResp {
            granted: outcome.granted,
            holder: outcome.holder,
            expires_at_unix_millis: outcome.expires_at_unix_millis,
            remaining_millis: outcome.remaining_millis,
        }))
    }

    type WatchPetsStream = WatchStream;

    async fn watch_pets(
        &self,
        request: Request<pb::WatchPetsReq>,
    ) -> Result<Response<Self::WatchPetsStream>, Status> {
        let access = self.access(&request, "WatchPets")?;
        let stream = watch::start(
            Arc::clone(&self.storage),
            access,
            request.into_inner(),
            self.watch,
            Arc::clone(&self.observability.metrics),
            self.stopping.clone(),
        )
        .await?;
        Ok(Response::new(stream))
    }
}

// The longer handlers, run inside their RPC's span (see `crate::observe`).
impl PetStoreService {
    async fn search(
        &self,
        access: Access,
        request: pb::SearchPetsReq,
    ) -> Result<Response<ReceiverStream<Result<pb::Pet, Status>>>, Status> {
        let filter = validate::search_request(&request)?;
        // The first page is read before answering, so a failing store is a
        // status rather than a broken stream.
        let first = self
            .storage
            .search_page(PageRequest::new(&access, &filter, None, SEARCH_PAGE))
            .instrument(self.span(|| tracing::info_span!("storage.search_page")))
            .await?;
        let storage = Arc::clone(&self.storage);
        let (tx, rx) = tokio::sync::mpsc::channel(SEARCH_CHANNEL_DEPTH);
        // The rest of the stream stays in the RPC's trace.
        let rpc_span = Span::current();
        tokio::spawn(async move {
            let mut page = first;
            let mut count = 0usize;
            loop {
                let SearchPage { pets, next } = page;
                for record in pets {
                    // The client hung up: stop reading.
                    if tx.send(Ok(wire::to_proto(&record))).await.is_err() {
                        return;
                    }
                    count += 1;
                }
                let Some(after) = next else { break };
                page = match storage
                    .search_page(PageRequest::new(&access, &filter, Some(after), SEARCH_PAGE))
                    .instrument(if rpc_span.is_none() {
                        Span::none()
                    } else {
                        tracing::info_span!(parent: &rpc_span, "storage.search_page")
                    })
                    .await
                {
                    Ok(page) => page,
                    Err(err) => {
                        let _ = tx.send(Err(Status::from(err))).await;
                        return;
                    }
                };
            }
            tracing::debug!(parent: &rpc_span, count, "search");
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn set_keys(
        &self,
        access: Access,
        request: pb::SetIdempotencyKeysReq,
    ) -> Result<Response<pb::SetIdempotencyKeysResp>, Status> {
        let changes = validate::set_keys_request(&request)?;
        let count = changes.len();
        self.storage
            .set_keys(&access, &changes)
            .instrument(self.span(|| tracing::info_span!("storage.set_keys")))
            .await
            .map_err(|err| match err {
                // The generic mapping names `pets[i]`; this request's field is `changes`.
                StorageError::NotFound { index, id } => {
                    Status::not_found(format!("changes[{index}].id: no pet with ID {id:?}"))
                }
                other => self.storage_status("SetIdempotencyKeys", other),
            })?;
        tracing::debug!(count, "changed idempotency keys");
        Ok(Response::new(pb::SetIdempotencyKeysResp {}))
    }

    /// One index's part of a `GetPets`: no storage call, and no span, for
    /// an empty list. Each index keeps the span named for its storage call.
    async fn lookup(
        &self,
        access: &Access,
        by: LookupBy,
        values: &[String],
    ) -> Result<Vec<Option<PetRecord>>, Status> {
        if values.is_empty() {
            return Ok(Vec::new());
        }
        let (found, span) = match by {
            LookupBy::Id => (
                self.storage.get(access, values),
                self.span(|| tracing::info_span!("storage.get")),
            ),
            LookupBy::Key => (
                self.storage.get_by_keys(access, values),
                self.span(|| tracing::info_span!("storage.get_by_keys")),
            ),
            LookupBy::Identity => (
                self.storage.get_by_identities(access, values),
                self.span(|| tracing::info_span!("storage.get_by_identities")),
            ),
        };
        Ok(found.instrument(span).await?)
    }

    async fn get(
        &self,
        access: Access,
        request: pb::GetPetsReq,
    ) -> Result<Response<pb::GetPetsResp>, Status> {
        validate::get_request(&request)?;
        let pb::GetPetsReq {
            ids,
            idempotency_keys,
            identities,
        } = request;

        let by_id = self.lookup(&access, LookupBy::Id, &ids).await?;
        let by_key = self
            .lookup(&access, LookupBy::Key, &idempotency_keys)
            .await?;
        let by_identity = self
            .lookup(&access, LookupBy::Identity, &identities)
            .await?;

        let mut response = pb::GetPetsResp::default();
        let mut seen = std::collections::HashSet::new();
        // By ID, then by key, then by identity: each pet once, where first found.
        for (requested, found, missing) in [
            (ids, by_id, &mut response.missing_ids),
            (
                idempotency_keys,
                by_key,
                &mut response.missing_idempotency_keys,
            ),
            (identities, by_identity, &mut response.missing_identities),
        ] {
            for (value, found) in requested.into_iter().zip(found) {
                match found {
                    Some(record) if seen.insert(record.id.clone()) => {
                        response.pets.push(wire::to_proto(&record))
                    }
                    Some(_) => {}
                    None => missing.push(value),
                }
            }
        }
        Ok(Response::new(response))
    }
}
