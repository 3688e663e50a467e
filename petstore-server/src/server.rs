//! Assembles the gRPC server: the pet store, health, reflection and limits.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use petstore_proto::PetStoreServer;
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};

use crate::admission::AdmissionLayer;
use crate::model::MAX_MESSAGE_BYTES;
use crate::observe::ObserveLayer;
use crate::service::{Observability, PetStoreService};
use crate::storage::Storage;
use crate::watch::WatchOptions;

/// Concurrent requests served per HTTP/2 connection; further streams queue.
pub const MAX_CONCURRENT_STREAMS_PER_CONNECTION: u32 = 256;
/// A request (including a whole search stream) taking longer is cancelled.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Serving certificate and key (PEM), and optionally a CA whose client
/// certificates are then required (mutual TLS).
#[derive(Clone, Debug)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

#[derive(Clone, Debug, Default)]
pub struct ServeOptions {
    /// Plaintext when `None`, the default for local development.
    pub tls: Option<TlsFiles>,
    /// Metrics and the trace sampler the service reports to and obeys.
    pub observability: Observability,
    /// How `WatchPets` streams behave.
    pub watch: WatchOptions,
    /// The bound on requests answered at once; none: unbounded.
    pub admission: Option<crate::admission::Admission>,
    /// Tenancy (`crate::auth`); none: off, every call acts for everyone.
    pub tenancy: Option<Arc<crate::auth::Tenancy>>,
}

fn read(path: &Path) -> Result<Vec<u8>, ServeError> {
    std::fs::read(path).map_err(|source| ServeError::ReadTlsFile {
        path: path.to_owned(),
        source,
    })
}

impl TlsFiles {
    fn config(&self) -> Result<ServerTlsConfig, ServeError> {
        let identity = Identity::from_pem(read(&self.cert)?, read(&self.key)?);
        let mut config = ServerTlsConfig::new().identity(identity);
        if let Some(ca) = &self.client_ca {
            config = config.client_ca_root(Certificate::from_pem(read(ca)?));
        }
        Ok(config)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("building the reflection service: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("serving gRPC: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error(
        "tenancy without TLS would take ServiceAccount tokens over plaintext: serve TLS (--tls-cert and --tls-key), or pass --allow-plaintext-tokens for local development only"
    )]
    PlaintextTokens,
    #[error("reading {path}: {source}")]
    ReadTlsFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The connections `serve` accepts, each with `TCP_NODELAY` set (TLS runs on
/// top of these same sockets). Without it, a client that writes a request in
/// two segments (grpc-go does: headers, then data) waits for the delayed ACK
/// of the first: about 40 ms per call instead of a fraction of a
/// millisecond. `Server::tcp_nodelay` would not help: it only applies when
/// tonic binds the address itself.
pub fn incoming(listener: TcpListener) -> TcpIncoming {
    TcpIncoming::from(listener).with_nodelay(Some(true))
}

/// Sets `status` for the pet store service and for the server as a whole
/// (the empty service name), which probes without a service name ask about.
async fn report_health(
    health: &tonic_health::server::HealthReporter,
    status: tonic_health::ServingStatus,
) {
    health
        .set_service_status(
            <PetStoreServer<PetStoreService> as tonic::server::NamedService>::NAME,
            status,
        )
        .await;
    health.set_service_status("", status).await;
}

/// Serves on `listener` until `shutdown` resolves, then reports NOT_SERVING,
/// stops accepting, and finishes in-flight calls before returning.
pub async fn serve(
    listener: TcpListener,
    storage: Arc<dyn Storage>,
    options: ServeOptions,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    if let Some(tenancy) = &options.tenancy
        && options.tls.is_none()
        && !tenancy.allows_plaintext_tokens()
    {
        return Err(ServeError::PlaintextTokens);
    }
    let mut builder = Server::builder();
    if let Some(tls) = &options.tls {
        builder = builder.tls_config(tls.config()?)?;
    }
    let (health, health_service) = tonic_health::server::health_reporter();
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(petstore_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(petstore_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;

    tokio::spawn(crate::watch::follow_revision(
        Arc::clone(&storage),
        Arc::clone(&options.observability.metrics),
    ));
    let (stop_watchers, stopping) = tokio::sync::watch::channel(false);
    let service = PetStoreService::new(storage, options.observability.clone())
        .with_watch(options.watch, stopping)
        .with_tenancy(options.tenancy.clone());
    let pet_store = PetStoreServer::new(service)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);

    // Storage is already open when we get here, so we can serve at once.
    report_health(&health, tonic_health::ServingStatus::Serving).await;

    let draining_health = health.clone();
    let shutdown = async move {
        shutdown.await;
        tracing::info!("shutting down: draining in-flight calls");
        // Watch streams never end by themselves; the drain would wait for
        // them forever.
        stop_watchers.send_replace(true);
        report_health(&draining_health, tonic_health::ServingStatus::NotServing).await;
    };

    if let Ok(addr) = listener.local_addr() {
        let tls = match &options.tls {
            None => "off",
            Some(TlsFiles {
                client_ca: None, ..
            }) => "tls",
            Some(_) => "mutual-tls",
        };
        let tenancy = options.tenancy.is_some();
        tracing::info!(%addr, tls, tenancy, "pet store listening");
    }
    // Every pet store call is observed (its span and metrics), refusals by
    // the bound included; then it takes its place under the bound.
    let layers = tower::ServiceBuilder::new()
        .layer(ObserveLayer::new(
            Arc::clone(&options.observability.metrics),
            options.observability.spans,
        ))
        .layer(AdmissionLayer(options.admission));
    builder
        .layer(layers)
        .concurrency_limit_per_connection(MAX_CONCURRENT_STREAMS_PER_CONNECTION as usize)
        .timeout(REQUEST_TIMEOUT)
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS_PER_CONNECTION)
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(pet_store)
        .serve_with_incoming_shutdown(incoming(listener), shutdown)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;

    // Fails if any accepted connection, the first or a later one, lacks
    // TCP_NODELAY: every RPC, unary or streaming, is written to these sockets.
    #[tokio::test]
    async fn every_accepted_connection_has_tcp_nodelay() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let mut accepted = incoming(listener);
        let mut clients = Vec::new();
        for _ in 0..3 {
            clients.push(tokio::net::TcpStream::connect(addr).await.expect("connect"));
            let stream = accepted
                .next()
                .await
                .expect("a connection")
                .expect("accepted");
            assert!(stream.nodelay().expect("read TCP_NODELAY"));
        }
    }
}
