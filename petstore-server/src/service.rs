//! The gRPC layer: validates each request at the edge, then calls [`Storage`].

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use petstore_proto::PetStore;
use petstore_proto::petstore as pb;
use petstore_telemetry::{FORCE_SAMPLING_ATTRIBUTE, SharedSampler};
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};
use tracing::{Instrument, Span};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::admission::{Admission, Admitted};
use crate::metrics::{InFlight, ServerMetrics};
use crate::storage::{SearchPage, Storage, StorageError};
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
    /// The bound on requests answered at once; none: unbounded.
    admission: Option<Admission>,
}

impl PetStoreService {
    pub fn new(storage: Arc<dyn Storage>, observability: Observability) -> Self {
        let (_, stopping) = tokio::sync::watch::channel(false);
        Self {
            storage,
            observability,
            watch: WatchOptions::default(),
            stopping,
            admission: None,
        }
    }

    /// Refuses requests beyond `admission`'s bound (see
    /// [`crate::admission`]).
    pub fn with_admission(mut self, admission: Admission) -> Self {
        self.admission = Some(admission);
        self
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

    /// Starts observing one call to `rpc` (`petstore.PetStore/<Method>`),
    /// which counts against the bound on requests at once.
    fn call(&self, rpc: &'static str, metadata: &MetadataMap) -> RpcCall {
        let admitted = match &self.admission {
            Some(admission) => admission.admit().map(Some),
            None => Ok(None),
        };
        RpcCall {
            admitted,
            ..self.unbounded_call(rpc, metadata)
        }
    }

    /// Like [`Self::call`], for a call the bound does not count (a watch).
    fn unbounded_call(&self, rpc: &'static str, metadata: &MetadataMap) -> RpcCall {
        RpcCall {
            admitted: Ok(None),
            method: rpc.rsplit('/').next().unwrap_or(rpc),
            span: if self.observability.spans {
                rpc_span(rpc, metadata)
            } else {
                Span::none()
            },
            started: Instant::now(),
            metrics: Arc::clone(&self.observability.metrics),
            _in_flight: self.observability.metrics.in_flight(),
        }
    }
}

/// The server span of one RPC, a child of the caller's span when its
/// metadata carries a W3C `traceparent`. A `trace` key in the metadata
/// samples it whatever the sampler says, as in the book's store.
fn rpc_span(rpc: &'static str, metadata: &MetadataMap) -> Span {
    let force_sampling = metadata.contains_key("trace");
    let span = tracing::info_span!(
        "rpc",
        otel.name = rpc,
        otel.kind = "server",
        rpc.system = "grpc",
        rpc.service = "petstore.PetStore",
        rpc.method = rpc.rsplit('/').next().unwrap_or(rpc),
        rpc.grpc.status_code = tracing::field::Empty,
        { FORCE_SAMPLING_ATTRIBUTE } = force_sampling,
        trace_id = tracing::field::Empty,
    );
    // Fails only when no OpenTelemetry layer is installed: nothing to link.
    let _ = span.set_parent(petstore_telemetry::extract(metadata));
    petstore_telemetry::record_trace_id(&span);
    span
}

/// One RPC being answered: its span, its place among the calls in flight,
/// and its duration, recorded with its gRPC code when it ends.
struct RpcCall {
    /// Its place under the bound, or the refusal to answer with.
    admitted: Result<Option<Admitted>, Status>,
    method: &'static str,
    span: Span,
    started: Instant,
    metrics: Arc<ServerMetrics>,
    _in_flight: InFlight,
}

impl RpcCall {
    /// Runs `handler`, holding the call's place until it returns.
    async fn run<T>(
        self,
        handler: impl Future<Output = Result<Response<T>, Status>>,
    ) -> Result<Response<T>, Status> {
        self.run_admitted(|admitted| async move {
            let result = handler.await;
            drop(admitted);
            result
        })
        .await
    }

    /// Runs the handler `start` makes, which is given the call's place to
    /// hold for as long as it answers (a search, until its stream ends);
    /// or answers with the refusal if there was no place.
    async fn run_admitted<T, F, Fut>(mut self, start: F) -> Result<Response<T>, Status>
    where
        F: FnOnce(Option<Admitted>) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        let result = match std::mem::replace(&mut self.admitted, Ok(None)) {
            Ok(admitted) => start(admitted).instrument(self.span.clone()).await,
            Err(refused) => Err(refused),
        };
        let code = match &result {
            Ok(_) => tonic::Code::Ok,
            Err(status) => status.code(),
        };
        self.span.record("rpc.grpc.status_code", code as i64);
        self.metrics
            .observe_rpc(self.method, code, self.started.elapsed());
        result
    }
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
        let call = self.call("petstore.PetStore/AddPets", request.metadata());
        call.run(async {
            let pets = validate::add_request(request.get_ref())?;
            let count = pets.len();
            let added = self
                .storage
                .add(&pets)
                .instrument(self.span(|| tracing::info_span!("storage.add_pets")))
                .await?;
            tracing::debug!(count, "added pets");
            let created = added.iter().map(|a| a.created).collect();
            let ids = added.into_iter().map(|a| a.id).collect();
            Ok(Response::new(pb::AddPetsResp { ids, created }))
        })
        .await
    }

    async fn update_pets(
        &self,
        request: Request<pb::UpdatePetsReq>,
    ) -> Result<Response<pb::UpdatePetsResp>, Status> {
        let call = self.call("petstore.PetStore/UpdatePets", request.metadata());
        call.run(async {
            let updates = validate::update_request(request.get_ref())?;
            let count = updates.len();
            self.storage
                .update(&updates)
                .instrument(self.span(|| tracing::info_span!("storage.update_pets")))
                .await?;
            tracing::debug!(count, "updated pets");
            Ok(Response::new(pb::UpdatePetsResp {}))
        })
        .await
    }

    async fn delete_pets(
        &self,
        request: Request<pb::DeletePetsReq>,
    ) -> Result<Response<pb::DeletePetsResp>, Status> {
        let call = self.call("petstore.PetStore/DeletePets", request.metadata());
        call.run(async {
            let ids = request.into_inner().ids;
            validate::ids("ids", &ids)?;
            let count = ids.len();
            self.storage
                .delete(&ids)
                .instrument(self.span(|| tracing::info_span!("storage.delete_pets")))
                .await?;
            tracing::debug!(count, "deleted pets");
            Ok(Response::new(pb::DeletePetsResp {}))
        })
        .await
    }

    type SearchPetsStream = ReceiverStream<Result<pb::Pet, Status>>;

    async fn search_pets(
        &self,
        request: Request<pb::SearchPetsReq>,
    ) -> Result<Response<Self::SearchPetsStream>, Status> {
        let call = self.call("petstore.PetStore/SearchPets", request.metadata());
        call.run_admitted(|admitted| self.search(request.into_inner(), admitted))
            .await
    }

    async fn change_sampler(
        &self,
        request: Request<pb::ChangeSamplerReq>,
    ) -> Result<Response<pb::ChangeSamplerResp>, Status> {
        let call = self.call("petstore.PetStore/ChangeSampler", request.metadata());
        call.run(async {
            let setting = validate::change_sampler_request(request.get_ref())?;
            self.observability.sampler.set(setting);
            self.observability.metrics.set_sampler(setting);
            tracing::info!(sampler = %setting, "trace sampler changed");
            Ok(Response::new(pb::ChangeSamplerResp {}))
        })
        .await
    }

    async fn set_idempotency_keys(
        &self,
        request: Request<pb::SetIdempotencyKeysReq>,
    ) -> Result<Response<pb::SetIdempotencyKeysResp>, Status> {
        let call = self.call("petstore.PetStore/SetIdempotencyKeys", request.metadata());
        call.run(self.set_keys(request.into_inner())).await
    }

    async fn get_pets(
        &self,
        request: Request<pb::GetPetsReq>,
    ) -> Result<Response<pb::GetPetsResp>, Status> {
        let call = self.call("petstore.PetStore/GetPets", request.metadata());
        call.run(self.get(request.into_inner())).await
    }

    type WatchPetsStream = WatchStream;

    async fn watch_pets(
        &self,
        request: Request<pb::WatchPetsReq>,
    ) -> Result<Response<Self::WatchPetsStream>, Status> {
        let call = self.unbounded_call("petstore.PetStore/WatchPets", request.metadata());
        call.run(async {
            let stream = watch::start(
                Arc::clone(&self.storage),
                request.into_inner(),
                self.watch,
                Arc::clone(&self.observability.metrics),
                self.stopping.clone(),
            )
            .await?;
            Ok(Response::new(stream))
        })
        .await
    }
}

// The longer handlers, run inside their RPC's span by the trait methods.
impl PetStoreService {
    async fn search(
        &self,
        request: pb::SearchPetsReq,
        admitted: Option<Admitted>,
    ) -> Result<Response<ReceiverStream<Result<pb::Pet, Status>>>, Status> {
        let filter = validate::search_request(&request)?;
        // The first page is read before answering, so a failing store is a
        // status rather than a broken stream.
        let first = self
            .storage
            .search_page(&filter, None, SEARCH_PAGE)
            .instrument(self.span(|| tracing::info_span!("storage.search_page")))
            .await?;
        let storage = Arc::clone(&self.storage);
        let (tx, rx) = tokio::sync::mpsc::channel(SEARCH_CHANNEL_DEPTH);
        // The rest of the stream stays in the RPC's trace.
        let rpc_span = Span::current();
        tokio::spawn(async move {
            // The search's place under the bound lasts as long as its stream.
            let _admitted = admitted;
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
                    .search_page(&filter, Some(after), SEARCH_PAGE)
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
        request: pb::SetIdempotencyKeysReq,
    ) -> Result<Response<pb::SetIdempotencyKeysResp>, Status> {
        let changes = validate::set_keys_request(&request)?;
        let count = changes.len();
        self.storage
            .set_keys(&changes)
            .instrument(self.span(|| tracing::info_span!("storage.set_keys")))
            .await
            .map_err(|err| match err {
                // The generic mapping names `pets[i]`; this request's field is `changes`.
                StorageError::NotFound { index, id } => {
                    Status::not_found(format!("changes[{index}].id: no pet with ID {id:?}"))
                }
                other => other.into(),
            })?;
        tracing::debug!(count, "changed idempotency keys");
        Ok(Response::new(pb::SetIdempotencyKeysResp {}))
    }

    async fn get(&self, request: pb::GetPetsReq) -> Result<Response<pb::GetPetsResp>, Status> {
        let pb::GetPetsReq {
            ids,
            idempotency_keys,
        } = request;
        validate::ids("ids", &ids)?;
        validate::ids("idempotency_keys", &idempotency_keys)?;

        let by_id = if ids.is_empty() {
            Vec::new()
        } else {
            self.storage
                .get(&ids)
                .instrument(self.span(|| tracing::info_span!("storage.get")))
                .await?
        };
        let by_key = if idempotency_keys.is_empty() {
            Vec::new()
        } else {
            self.storage
                .get_by_keys(&idempotency_keys)
                .instrument(self.span(|| tracing::info_span!("storage.get_by_keys")))
                .await?
        };

        let mut response = pb::GetPetsResp::default();
        let mut seen = std::collections::HashSet::new();
        for (id, found) in ids.into_iter().zip(by_id) {
            match found {
                Some(record) if seen.insert(record.id.clone()) => {
                    response.pets.push(wire::to_proto(&record))
                }
                Some(_) => {}
                None => response.missing_ids.push(id),
            }
        }
        for (key, found) in idempotency_keys.into_iter().zip(by_key) {
            match found {
                Some(record) if seen.insert(record.id.clone()) => {
                    response.pets.push(wire::to_proto(&record))
                }
                Some(_) => {}
                None => response.missing_idempotency_keys.push(key),
            }
        }
        Ok(Response::new(response))
    }
}
