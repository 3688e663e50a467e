//! The webhook's HTTPS server: axum's router served by axum-server with its
//! rustls acceptor (handshakes in tasks of their own, each with a timeout).
//! Its certificate sits behind [`ServingCertificate`], which
//! [`super::certs`] swaps when it renews the certificate: the acceptor asks
//! it at every handshake, so new connections get the new one without a
//! restart.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::DefaultBodyLimit;
use axum::routing::post;
use axum_server::tls_rustls::{RustlsAcceptor, RustlsConfig};
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;

use super::guard::{self, PetCount};
use super::store_guard::{self, DeletedStore, PetUse};
use crate::crd::{CRD_GUARD_PATH, STORE_GUARD_PATH, WEBHOOK_PATH};

/// Counts the Pets for the CRD deletion guard: the API server's list in
/// the operator, a fixed answer in tests.
pub type CountPets =
    Arc<dyn Fn() -> futures::future::BoxFuture<'static, Result<PetCount, String>> + Send + Sync>;

/// Lists the Pets that may use a store, for the store deletion guard: the
/// API server's list in the operator, a fixed answer in tests.
pub type StorePets = Arc<
    dyn Fn(DeletedStore) -> futures::future::BoxFuture<'static, Result<Vec<PetUse>, String>>
        + Send
        + Sync,
>;

/// A ConversionReview lists every object of a request; a list of many Pets
/// is larger than axum's 2 MiB default.
const MAX_BODY_BYTES: usize = 64 << 20;
/// A client that opens a connection and never finishes the handshake must
/// not hold a task forever.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// At shutdown, how long requests already in progress may take to finish.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("the webhook certificate is not PEM: {0}")]
    Pem(#[from] rustls_pki_types::pem::Error),
    #[error("the webhook certificate file holds no certificate")]
    NoCertificate,
    #[error("the webhook certificate and key do not make a TLS identity: {0}")]
    Tls(#[from] rustls::Error),
    #[error("listening for the webhook on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("serving the webhook: {0}")]
    Serve(#[source] std::io::Error),
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The certificate the server presents; replaceable while it runs.
#[derive(Debug)]
pub struct ServingCertificate {
    current: RwLock<Arc<CertifiedKey>>,
}

impl ServingCertificate {
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, ServerError> {
        Ok(Self {
            current: RwLock::new(certified_key(cert_pem, key_pem)?),
        })
    }

    /// Presents `cert_pem` from the next handshake on.
    pub fn replace(&self, cert_pem: &str, key_pem: &str) -> Result<(), ServerError> {
        let key = certified_key(cert_pem, key_pem)?;
        // A poisoned lock only means a writer panicked mid-swap of an Arc,
        // which cannot leave it half-written.
        let mut current = self.current.write().unwrap_or_else(|e| e.into_inner());
        *current = key;
        Ok(())
    }
}

#[cfg(test)]
impl ServingCertificate {
    /// The leaf served now, DER.
    pub fn served_leaf_der(&self) -> Vec<u8> {
        let current = self.current.read().unwrap_or_else(|e| e.into_inner());
        current.cert.first().map(|c| c.to_vec()).unwrap_or_default()
    }
}

fn certified_key(cert_pem: &str, key_pem: &str) -> Result<Arc<CertifiedKey>, ServerError> {
    let chain =
        CertificateDer::pem_slice_iter(cert_pem.as_bytes()).collect::<Result<Vec<_>, _>>()?;
    if chain.is_empty() {
        return Err(ServerError::NoCertificate);
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())?;
    Ok(Arc::new(CertifiedKey::from_der(chain, key, &provider())?))
}

impl ResolvesServerCert for ServingCertificate {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let current = self.current.read().unwrap_or_else(|e| e.into_inner());
        Some(Arc::clone(&current))
    }
}

/// Binds the webhook's address; done before anything else starts, so a
/// taken port stops the operator at once.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, ServerError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Listen { addr, source })
}

/// The webhook's routes: `POST /convert`, `POST /guard-crd-deletion` and
/// `POST /validate-store-deletion`.
pub fn router(count_pets: CountPets, store_pets: StorePets) -> Router {
    Router::new()
        .route(
            WEBHOOK_PATH,
            post(|body: Bytes| async move { axum::Json(super::review(&body)) }),
        )
        .route(
            CRD_GUARD_PATH,
            post(move |body: Bytes| async move {
                axum::Json(guard::review(&body, || count_pets()).await)
            }),
        )
        .route(
            STORE_GUARD_PATH,
            post(move |body: Bytes| async move {
                axum::Json(store_guard::review(&body, |store| store_pets(store)).await)
            }),
        )
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
}

/// Serves HTTPS on `listener` until `shutdown` completes, then lets the
/// requests in progress finish (for up to [`SHUTDOWN_GRACE`]).
pub async fn serve(
    listener: TcpListener,
    certificate: Arc<ServingCertificate>,
    count_pets: CountPets,
    store_pets: StorePets,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(certificate);
    let acceptor = RustlsAcceptor::new(RustlsConfig::from_config(Arc::new(config)))
        .handshake_timeout(HANDSHAKE_TIMEOUT);
    let handle = axum_server::Handle::new();
    let stopping = handle.clone();
    tokio::spawn(async move {
        shutdown.await;
        stopping.graceful_shutdown(Some(SHUTDOWN_GRACE));
    });
    axum_server::Server::<SocketAddr>::from_listener(listener)
        .acceptor(acceptor)
        .handle(handle)
        // Accepting backs off and goes on; a failed handshake is the client's.
        .accept_error_handler(|peer, err| match peer {
            None => tracing::warn!(error = %err, "webhook accept failed"),
            Some(peer) => tracing::debug!(%peer, error = %err, "webhook TLS handshake failed"),
        })
        .serve(router(count_pets, store_pets).into_make_service())
        .await
        .map_err(ServerError::Serve)
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_rustls::TlsConnector;

    use super::*;
    use crate::webhook::certs::{WEBHOOK, WebhookCerts, serving_names, unix_now};

    /// POSTs `body` to `path` over TLS, trusting `ca_pem` only; returns
    /// the whole HTTP response and the certificate the server presented.
    async fn post_to(addr: SocketAddr, path: &str, ca_pem: &str, body: &[u8]) -> (String, Vec<u8>) {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            roots.add(cert.expect("CA PEM")).expect("CA");
        }
        let config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let name = rustls_pki_types::ServerName::try_from("127.0.0.1").expect("name");
        let mut tls = TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .expect("handshake");
        let presented = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|chain| chain.first())
            .map(|cert| cert.to_vec())
            .expect("a certificate");
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        tls.write_all(head.as_bytes()).await.expect("write");
        tls.write_all(body).await.expect("write");
        let mut response = Vec::new();
        // The server may close without a TLS close_notify; what was read counts.
        let _ = tls.read_to_end(&mut response).await;
        (String::from_utf8_lossy(&response).into_owned(), presented)
    }

    async fn post(addr: SocketAddr, ca_pem: &str, body: &[u8]) -> (String, Vec<u8>) {
        post_to(addr, WEBHOOK_PATH, ca_pem, body).await
    }

    fn der(pem: &str) -> Vec<u8> {
        CertificateDer::pem_slice_iter(pem.as_bytes())
            .next()
            .expect("a certificate")
            .expect("PEM")
            .to_vec()
    }

    #[tokio::test]
    async fn serves_reviews_over_tls_and_swaps_its_certificate_without_a_restart() {
        let names = serving_names("petstore-system");
        let certs = WebhookCerts::generate(&WEBHOOK, &names, unix_now()).expect("certs");
        let serving =
            Arc::new(ServingCertificate::from_pem(&certs.cert, &certs.key).expect("identity"));
        let listener = bind("127.0.0.1:0".parse().expect("addr"))
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let stop = tokio_util::sync::CancellationToken::new();
        let count_pets: CountPets = Arc::new(|| {
            Box::pin(async {
                Ok(PetCount {
                    pets: 2,
                    protected: 0,
                })
            })
        });
        let store_pets: StorePets = Arc::new(|store| {
            Box::pin(async move {
                Ok(vec![PetUse {
                    namespace: store.namespace().unwrap_or("team-a").to_owned(),
                    name: "rex".into(),
                    store_ref: Some("PetStore/shared".parse().expect("a store ref")),
                    status_store: None,
                }])
            })
        });
        let server = tokio::spawn(serve(
            listener,
            Arc::clone(&serving),
            count_pets,
            store_pets,
            stop.clone().cancelled_owned(),
        ));

        let (response, presented) = post(addr, &certs.ca_cert, b"not json").await;
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        assert!(response.contains("\"Failure\""), "{response}");
        assert_eq!(presented, der(&certs.cert));

        let review = serde_json::json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
            "request": {"uid": "u", "desiredAPIVersion": "petstore.example.com/v1", "objects": [{
                "apiVersion": "petstore.example.com/v1alpha1", "kind": "Pet",
                "metadata": {"name": "thor"},
                "spec": {"name": "Thor", "type": "dog", "birthday": "2021-04-01T00:00:00Z"},
            }]},
        });
        let body = serde_json::to_vec(&review).expect("json");
        let (response, _) = post(addr, &certs.ca_cert, &body).await;
        assert!(response.contains("\"Success\""), "{response}");
        assert!(
            response.contains("\"birthday\":\"2021-04-01\""),
            "{response}"
        );

        // The CRD deletion guard, beside it, counts the Pets.
        let deletion = serde_json::json!({"request": {
            "uid": "g", "name": crate::crd::CRD_NAME, "operation": "DELETE",
            "oldObject": {"metadata": {"name": crate::crd::CRD_NAME}},
        }});
        let body = serde_json::to_vec(&deletion).expect("json");
        let (response, _) = post_to(addr, CRD_GUARD_PATH, &certs.ca_cert, &body).await;
        assert!(response.contains("\"allowed\":false"), "{response}");
        assert!(response.contains("2 Pets exist"), "{response}");

        // And the store deletion guard names the Pet that uses the store.
        let deletion = serde_json::json!({"request": {
            "uid": "s", "name": "shared", "namespace": "team-a", "operation": "DELETE",
            "kind": {"group": "petstore.example.com", "version": "v1", "kind": "PetStore"},
        }});
        let body = serde_json::to_vec(&deletion).expect("json");
        let (response, _) = post_to(addr, STORE_GUARD_PATH, &certs.ca_cert, &body).await;
        assert!(response.contains("\"allowed\":false"), "{response}");
        assert!(response.contains("team-a/rex"), "{response}");

        // A renewal signed by the same CA: the next handshake presents it.
        let renewed = certs
            .renew_leaf(&WEBHOOK, &names, unix_now())
            .expect("renew");
        serving.replace(&renewed.cert, &renewed.key).expect("swap");
        let (_, presented) = post(addr, &certs.ca_cert, b"{}").await;
        assert_eq!(presented, der(&renewed.cert));
        assert_ne!(presented, der(&certs.cert));

        stop.cancel();
        server.await.expect("task").expect("clean stop");
    }

    #[test]
    fn a_key_that_does_not_match_is_refused() {
        let names = serving_names("petstore-system");
        let one = WebhookCerts::generate(&WEBHOOK, &names, 1_800_000_000).expect("certs");
        let other = WebhookCerts::generate(&WEBHOOK, &names, 1_800_000_000).expect("certs");
        assert!(ServingCertificate::from_pem(&one.cert, &other.key).is_err());
        assert!(ServingCertificate::from_pem("", &one.key).is_err());
        assert!(ServingCertificate::from_pem(&one.cert, "garbage").is_err());
    }
}
