//! Assembles the gRPC server: the pet store, health, reflection and limits.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use petstore_proto::PetStoreServer;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::Server;

use crate::model::MAX_MESSAGE_BYTES;
use crate::service::PetStoreService;
use crate::storage::Storage;

/// Concurrent requests served per HTTP/2 connection; further streams queue.
pub const MAX_CONCURRENT_STREAMS_PER_CONNECTION: u32 = 256;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("building the reflection service: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("serving gRPC: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// Serves on `listener` until `shutdown` resolves, then reports NOT_SERVING,
/// stops accepting, and finishes in-flight calls before returning.
pub async fn serve(
    listener: TcpListener,
    storage: Arc<dyn Storage>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let (health, health_service) = tonic_health::server::health_reporter();
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(petstore_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(petstore_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;

    let pet_store = PetStoreServer::new(PetStoreService::new(storage))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);

    // Storage is already open when we get here, so we can serve at once.
    health
        .set_serving::<PetStoreServer<PetStoreService>>()
        .await;
    health
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;

    let draining_health = health.clone();
    let shutdown = async move {
        shutdown.await;
        tracing::info!("shutting down: draining in-flight calls");
        draining_health
            .set_not_serving::<PetStoreServer<PetStoreService>>()
            .await;
        draining_health
            .set_service_status("", tonic_health::ServingStatus::NotServing)
            .await;
    };

    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "pet store listening");
    }
    Server::builder()
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS_PER_CONNECTION)
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(pet_store)
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
        .await?;
    Ok(())
}
