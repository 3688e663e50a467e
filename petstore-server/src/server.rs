//! Assembles the gRPC server: the pet store, health, reflection and limits.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use petstore_proto::PetStoreServer;
use petstore_tls::server::ServerTls;
use petstore_tls::{FileWatcher, Reload};
use tokio::net::TcpListener;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;

use crate::admission::{AdmissionLayer, Throttle};
use crate::metrics::ServerMetrics;
use crate::model::MAX_MESSAGE_BYTES;
use crate::observe::ObserveLayer;
use crate::per_client::PerClient;
use crate::service::{Observability, PetStoreService};
use crate::storage::Storage;
use crate::tls::Connections;
use crate::watch::WatchOptions;

/// Concurrent requests served per HTTP/2 connection; further streams queue.
pub const MAX_CONCURRENT_STREAMS_PER_CONNECTION: u32 = 256;
/// A request (including a whole search stream) taking longer is cancelled.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Serving certificate and key (PEM), and optionally a CA whose client
/// certificates are then required (mutual TLS). Read at start, and again
/// whenever they change (see [`crate::tls`]).
pub type TlsFiles = petstore_tls::server::ServerFiles;

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
    /// The bound on calls answered per second, from all clients together
    /// (`crate::admission::Throttle`); 0: unbounded.
    pub max_calls_per_second: f64,
    /// Tenancy (`crate::auth`); none: off, every call acts for everyone.
    pub tenancy: Option<Arc<crate::auth::Tenancy>>,
    /// The connections one client may hold at once (`crate::per_client`);
    /// 0: unbounded.
    pub max_connections_per_client: usize,
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
    #[error("TLS: {0}")]
    Tls(#[from] petstore_tls::TlsError),
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
    // Read before anything serves: files that make no TLS identity stop
    // the store here.
    let tls = options
        .tls
        .clone()
        .map(ServerTls::load)
        .transpose()?
        .map(Arc::new);
    let connections = Arc::new(Connections::default());
    let _watcher = tls
        .as_ref()
        .map(|tls| follow_files(tls, &connections, &options.observability.metrics))
        .transpose()?;
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
        .with_tenancy(options.tenancy.clone())
        .with_client_certificates(
            tls.as_ref()
                .is_some_and(|tls| tls.requires_client_certificates()),
        );
    let pet_store = PetStoreServer::new(service)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);

    // Storage is already open when we get here, so we can serve at once.
    report_health(&health, tonic_health::ServingStatus::Serving).await;
    options.observability.metrics.set_serving(true);

    let draining_health = health.clone();
    let draining_metrics = Arc::clone(&options.observability.metrics);
    let shutdown = async move {
        shutdown.await;
        tracing::info!("shutting down: draining in-flight calls");
        // Watch streams never end by themselves; the drain would wait for
        // them forever.
        stop_watchers.send_replace(true);
        report_health(&draining_health, tonic_health::ServingStatus::NotServing).await;
        draining_metrics.set_serving(false);
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
    // the bounds included; then it takes its place and token under them.
    let layers = tower::ServiceBuilder::new()
        .layer(ObserveLayer::new(
            Arc::clone(&options.observability.metrics),
            options.observability.spans,
        ))
        .layer(AdmissionLayer {
            admission: options.admission,
            throttle: Throttle::new(options.max_calls_per_second),
        });
    let router = Server::builder()
        .layer(layers)
        .concurrency_limit_per_connection(MAX_CONCURRENT_STREAMS_PER_CONNECTION as usize)
        .timeout(REQUEST_TIMEOUT)
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS_PER_CONNECTION)
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(pet_store);
    let per_client = (options.max_connections_per_client > 0).then(|| {
        PerClient::new(
            options.max_connections_per_client,
            Arc::clone(&options.observability.metrics),
        )
    });
    match (&tls, per_client) {
        (Some(tls), per_client) => {
            let accepted = crate::tls::incoming(listener, tls, connections, per_client);
            router
                .serve_with_incoming_shutdown(accepted, shutdown)
                .await?;
        }
        (None, Some(per_client)) => {
            let accepted = crate::per_client::incoming(listener, per_client);
            router
                .serve_with_incoming_shutdown(accepted, shutdown)
                .await?;
        }
        (None, None) => {
            router
                .serve_with_incoming_shutdown(incoming(listener), shutdown)
                .await?;
        }
    }
    Ok(())
}

/// Reloads the TLS files whenever they change, and counts each reload. A
/// new client CA also closes the connections whose client certificate it
/// no longer trusts.
fn follow_files(
    tls: &Arc<ServerTls>,
    connections: &Arc<Connections>,
    metrics: &Arc<ServerMetrics>,
) -> Result<FileWatcher, ServeError> {
    let (reloaded, connections, metrics) = (
        Arc::clone(tls),
        Arc::clone(connections),
        Arc::clone(metrics),
    );
    Ok(tls.watch(move |outcome| {
        match outcome {
            Ok(Reload::Unchanged) => return,
            Ok(Reload::Changed) => metrics.tls_reloaded(true),
            Err(_) => metrics.tls_reloaded(false),
        }
        if outcome.is_ok() && reloaded.requires_client_certificates() {
            let closed = connections.close_untrusted(|chain| reloaded.trusts_client(chain));
            if closed > 0 {
                tracing::warn!(
                    closed,
                    "closed connections whose client certificate the new client CA does not trust"
                );
            }
        }
    })?)
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use fixtures::certs::Pki;
    use futures::StreamExt;
    use rustls_pki_types::pem::PemObject as _;
    use rustls_pki_types::{CertificateDer, ServerName};
    use tokio_rustls::rustls;
    use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;

    use super::*;
    use crate::service::Observability;
    use crate::storage::StorageConfig;

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

    /// Long enough on a loaded machine; the tests poll and finish sooner.
    const PATIENCE: Duration = Duration::from_secs(10);

    fn pem(path: &Path) -> String {
        std::fs::read_to_string(path).expect("read PEM")
    }

    fn der(path: &Path) -> CertificateDer<'static> {
        CertificateDer::from_pem_file(path).expect("a certificate")
    }

    /// Replaces `to` as `mv` would: a new inode renamed over it.
    fn replace(to: &Path, text: &str) {
        let next = to.with_extension("next");
        std::fs::write(&next, text).expect("write");
        std::fs::rename(&next, to).expect("rename");
    }

    /// A store CA in a directory of its own, the store's files it issued
    /// (trusting it for clients too), and an operator's client
    /// certificate from it: where each test of one TLS store starts.
    struct OneCa {
        pki: Pki,
        files: StoreFiles,
        client: (PathBuf, PathBuf),
        _dir: tempfile::TempDir,
    }

    impl OneCa {
        fn new() -> Self {
            let dir = tempfile::tempdir().expect("dir");
            let pki = Pki::create(dir.path(), "store", &[]).expect("CA");
            let files = StoreFiles::new(&pki.issue_server("store").expect("cert"), &pki.ca_cert);
            let client = pki.issue_client("operator").expect("client");
            Self {
                pki,
                files,
                client,
                _dir: dir,
            }
        }
    }

    /// The store's files in a directory of their own, as a volume holds
    /// them: its certificate and key from `pki`, and `client_ca`.
    struct StoreFiles {
        dir: tempfile::TempDir,
    }

    impl StoreFiles {
        fn new(serving: &(PathBuf, PathBuf), client_ca: &Path) -> Self {
            let files = Self {
                dir: tempfile::tempdir().expect("dir"),
            };
            files.serve(serving);
            files.trust(&[client_ca]);
            files
        }

        fn serve(&self, (cert, key): &(PathBuf, PathBuf)) {
            replace(&self.dir.path().join("tls.crt"), &pem(cert));
            replace(&self.dir.path().join("tls.key"), &pem(key));
        }

        fn trust(&self, cas: &[&Path]) {
            let bundle = cas.iter().map(|ca| pem(ca)).collect::<String>();
            replace(&self.dir.path().join("ca.crt"), &bundle);
        }

        fn tls(&self) -> TlsFiles {
            TlsFiles {
                cert: self.dir.path().join("tls.crt"),
                key: self.dir.path().join("tls.key"),
                client_ca: Some(self.dir.path().join("ca.crt")),
            }
        }
    }

    async fn serve_tls(files: TlsFiles, observability: Observability) -> std::net::SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let storage = StorageConfig::Memory.open().await.expect("memory");
        let options = ServeOptions {
            tls: Some(files),
            observability,
            ..ServeOptions::default()
        };
        tokio::spawn(serve(listener, storage, options, std::future::pending()));
        addr
    }

    /// A gRPC channel over mutual TLS, as the operator's was before it
    /// reloaded anything: tonic's own, with fixed files.
    async fn try_channel(
        addr: std::net::SocketAddr,
        ca: &Path,
        client: &(PathBuf, PathBuf),
    ) -> Result<Channel, tonic::transport::Error> {
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(pem(ca)))
            .identity(Identity::from_pem(pem(&client.0), pem(&client.1)));
        Endpoint::from_shared(format!("https://{addr}"))?
            .tls_config(tls)?
            .connect_timeout(PATIENCE)
            .connect()
            .await
    }

    async fn channel(
        addr: std::net::SocketAddr,
        ca: &Path,
        client: &(PathBuf, PathBuf),
    ) -> Channel {
        try_channel(addr, ca, client).await.expect("connect")
    }

    /// Whether a new connection with `client`'s certificate can make a call.
    async fn admitted(addr: std::net::SocketAddr, ca: &Path, client: &(PathBuf, PathBuf)) -> bool {
        match try_channel(addr, ca, client).await {
            Ok(channel) => healthy(&channel).await.is_ok(),
            Err(_) => false,
        }
    }

    async fn healthy(channel: &Channel) -> Result<(), tonic::Status> {
        HealthClient::new(channel.clone())
            .check(HealthCheckRequest::default())
            .await
            .map(drop)
    }

    /// One handshake; the certificate the store presented.
    async fn presented(
        addr: std::net::SocketAddr,
        ca: &Path,
        client: &(PathBuf, PathBuf),
    ) -> CertificateDer<'static> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(der(ca)).expect("CA");
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_client_auth_cert(
            vec![der(&client.0)],
            rustls_pki_types::PrivateKeyDer::from_pem_file(&client.1).expect("key"),
        )
        .expect("identity");
        let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let name = ServerName::try_from("127.0.0.1").expect("name");
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .expect("handshake");
        let (_, session) = tls.get_ref();
        assert_eq!(session.alpn_protocol(), None, "the probe offered no ALPN");
        session.peer_certificates().expect("certificates")[0].clone()
    }

    fn reloads(observability: &Observability, outcome: &str) -> f64 {
        let text = observability.metrics.encode().expect("metrics");
        let series = format!("petstore_server_tls_reloads_total{{outcome=\"{outcome}\"}} ");
        text.lines()
            .find_map(|line| line.strip_prefix(&series))
            .and_then(|value| value.parse().ok())
            .unwrap_or_default()
    }

    async fn eventually<F, Fut>(what: &str, mut check: F)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while !check().await {
            assert!(tokio::time::Instant::now() < deadline, "{what}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    // Fails if the store reads its files only at start, if a reload that
    // finds a key not matching its certificate replaces the identity, or if
    // removing a CA from the client CA file leaves the connections it had
    // authenticated open.
    #[tokio::test]
    async fn certificates_and_client_ca_rotate_without_a_restart() {
        let pki_dir = tempfile::tempdir().expect("dir");
        let old = Pki::create(&pki_dir.path().join("old"), "old", &[]).expect("old CA");
        let new = Pki::create(&pki_dir.path().join("new"), "new", &[]).expect("new CA");
        let first = old.issue_server("store-1").expect("certificate");
        let old_client = old.issue_client("operator-old").expect("client");
        let new_client = new.issue_client("operator-new").expect("client");
        let files = StoreFiles::new(&first, &old.ca_cert);
        let observability = Observability::default();
        let addr = serve_tls(files.tls(), observability.clone()).await;

        let operator = channel(addr, &old.ca_cert, &old_client).await;
        healthy(&operator).await.expect("a call over mutual TLS");
        assert_eq!(
            presented(addr, &old.ca_cert, &old_client).await,
            der(&first.0)
        );

        // A new certificate from the same CA: the next handshake has it.
        let second = old.issue_server("store-2").expect("certificate");
        files.serve(&second);
        eventually("the new certificate presented", || async {
            presented(addr, &old.ca_cert, &old_client).await == der(&second.0)
        })
        .await;
        assert!(reloads(&observability, "ok") >= 1.0);

        // A key that is not the certificate's: counted, and nothing changes.
        let failed = reloads(&observability, "failed");
        let third = old.issue_server("store-3").expect("certificate");
        replace(&files.dir.path().join("tls.crt"), &pem(&third.0));
        eventually("the failed reload counted", || async {
            reloads(&observability, "failed") > failed
        })
        .await;
        assert_eq!(
            presented(addr, &old.ca_cert, &old_client).await,
            der(&second.0)
        );
        healthy(&operator).await.expect("still serving");

        // The client CA moves to the new CA through a bundle of both.
        files.serve(&second);
        assert!(!admitted(addr, &old.ca_cert, &new_client).await);
        files.trust(&[&old.ca_cert, &new.ca_cert]);
        eventually("the new CA's client admitted", || {
            admitted(addr, &old.ca_cert, &new_client)
        })
        .await;
        let rotated = channel(addr, &old.ca_cert, &new_client).await;
        healthy(&rotated)
            .await
            .expect("the new CA's client, with both trusted");
        healthy(&operator)
            .await
            .expect("the old CA's client, with both trusted");
        files.trust(&[&new.ca_cert]);
        // The old client's connection is closed, and it cannot make another.
        eventually("the old CA's client refused", || async {
            healthy(&operator).await.is_err()
        })
        .await;
        healthy(&rotated).await.expect("the new CA's client stays");
    }

    #[tokio::test]
    async fn bad_files_at_start_stop_the_store() {
        let ca = OneCa::new();
        std::fs::write(ca.files.dir.path().join("tls.key"), "not a key").expect("write");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let storage = StorageConfig::Memory.open().await.expect("memory");
        let options = ServeOptions {
            tls: Some(ca.files.tls()),
            ..ServeOptions::default()
        };
        let refused = serve(listener, storage, options, std::future::pending()).await;
        assert!(
            matches!(
                refused,
                Err(ServeError::Tls(petstore_tls::TlsError::Pem { .. }))
            ),
            "{refused:?}"
        );
    }

    // Fails if serving TLS no longer stops when asked: with a client
    // connected and one that never handshakes.
    #[tokio::test]
    async fn a_tls_store_stops_when_asked() {
        let ca = OneCa::new();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let storage = StorageConfig::Memory.open().await.expect("memory");
        let options = ServeOptions {
            tls: Some(ca.files.tls()),
            ..ServeOptions::default()
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, storage, options, async {
            let _ = stopped.await;
        }));
        let operator = channel(addr, &ca.pki.ca_cert, &ca.client).await;
        healthy(&operator).await.expect("a call");
        let _silent = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let _ = stop.send(());
        tokio::time::timeout(PATIENCE, server)
            .await
            .expect("stopped in time")
            .expect("task")
            .expect("a clean stop");
        assert!(
            !admitted(addr, &ca.pki.ca_cert, &ca.client).await,
            "still serving"
        );
    }

    /// Whether the store serves a connection from `from`: it answers an
    /// HTTP/2 client preface with its own SETTINGS, where a connection it
    /// refused reads end of file (or a reset).
    async fn served_from(
        addr: std::net::SocketAddr,
        from: [u8; 4],
    ) -> (bool, tokio::net::TcpStream) {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
        socket
            .bind(std::net::SocketAddr::from((from, 0)))
            .expect("bind the source address");
        let mut stream = socket.connect(addr).await.expect("connect");
        // The preface, then an empty SETTINGS frame.
        let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        hello.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
        let wrote = stream.write_all(&hello).await;
        let mut answer = [0u8; 9];
        let read = tokio::time::timeout(PATIENCE, stream.read(&mut answer)).await;
        let served = wrote.is_ok() && matches!(read, Ok(Ok(n)) if n > 0);
        (served, stream)
    }

    // Fails if one client may hold more connections than the bound, if the
    // bound holds other clients back, or if a closed connection keeps its
    // place.
    #[tokio::test]
    async fn one_client_holds_at_most_its_connections_and_others_are_served() {
        // Reached from 127.0.0.2 too: another client, on the loopback.
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let storage = StorageConfig::Memory.open().await.expect("memory");
        let observability = Observability::default();
        let metrics = Arc::clone(&observability.metrics);
        let options = ServeOptions {
            observability,
            max_connections_per_client: 2,
            ..ServeOptions::default()
        };
        tokio::spawn(serve(listener, storage, options, std::future::pending()));
        let (first, held) = served_from(addr, [127, 0, 0, 1]).await;
        let (second, _also_held) = served_from(addr, [127, 0, 0, 1]).await;
        assert!(first && second, "two connections of one client are served");
        let (third, _) = served_from(addr, [127, 0, 0, 1]).await;
        assert!(!third, "a third connection of the same client is closed");
        let (elsewhere, _) = served_from(addr, [127, 0, 0, 2]).await;
        assert!(elsewhere, "another client is served meanwhile");
        let scrape = metrics.encode().expect("metrics");
        assert!(
            scrape.contains("petstore_server_connections_refused_total 1"),
            "{scrape}"
        );
        // A closed connection gives its place back, once the server has seen
        // it close.
        drop(held);
        let given_back = tokio::time::timeout(PATIENCE, async {
            loop {
                if served_from(addr, [127, 0, 0, 1]).await.0 {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        assert!(
            given_back.is_ok(),
            "the place of a closed connection is taken again"
        );
    }

    /// A client of `channel` holding one admission place: a search over
    /// more pets than HTTP/2's windows and the stream's buffer hold (about
    /// 6 MB of long names), left unread.
    async fn hold_a_place(channel: &Channel) -> tonic::Streaming<petstore_proto::petstore::Pet> {
        use petstore_proto::petstore as pb;
        let mut client = petstore_proto::PetStoreClient::new(channel.clone())
            .max_decoding_message_size(MAX_MESSAGE_BYTES);
        let long = "x".repeat(120);
        for batch in 0..40 {
            let pets = (0..1000)
                .map(|i| pb::Pet {
                    name: format!("{long} {batch}-{i}"),
                    r#type: pb::PetType::PtBird as i32,
                    birthday: Some(petstore_proto::google::r#type::Date {
                        year: 2020,
                        month: 1,
                        day: 1,
                    }),
                    ..Default::default()
                })
                .collect();
            client.add_pets(pb::AddPetsReq { pets }).await.expect("add");
        }
        let mut held = client
            .search_pets(pb::SearchPetsReq::default())
            .await
            .expect("search")
            .into_inner();
        held.message().await.expect("stream").expect("a first pet");
        held
    }

    // Fails if one client's share is not enforced on either path: the
    // client's address comes from the plaintext connection in one case and
    // from the TLS connection in the other.
    #[tokio::test]
    async fn one_client_takes_only_its_share_of_the_admission_bound_over_plaintext_and_tls() {
        let ca = OneCa::new();
        for tls in [false, true] {
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let addr = listener.local_addr().expect("addr");
            let storage = StorageConfig::Memory.open().await.expect("memory");
            let options = ServeOptions {
                tls: tls.then(|| ca.files.tls()),
                admission: Some(crate::admission::Admission::new(8).with_per_client(1)),
                ..ServeOptions::default()
            };
            tokio::spawn(serve(listener, storage, options, std::future::pending()));
            let channel = if tls {
                channel(addr, &ca.pki.ca_cert, &ca.client).await
            } else {
                Endpoint::from_shared(format!("http://{addr}"))
                    .expect("endpoint")
                    .connect()
                    .await
                    .expect("connect")
            };
            let _held = hold_a_place(&channel).await;
            let refused = petstore_proto::PetStoreClient::new(channel.clone())
                .get_pets(petstore_proto::petstore::GetPetsReq::default())
                .await
                .expect_err("beyond the client's share");
            assert_eq!(
                refused.code(),
                tonic::Code::ResourceExhausted,
                "tls {tls}: {refused:?}"
            );
            assert!(
                refused
                    .message()
                    .contains("--max-concurrent-requests-per-client"),
                "tls {tls}: {refused:?}"
            );
        }
    }

    // Fails if a handshake runs on the accepting task: the silent client
    // would hold it for the whole handshake timeout.
    #[tokio::test]
    async fn a_client_that_never_handshakes_does_not_stall_the_others() {
        let ca = OneCa::new();
        let addr = serve_tls(ca.files.tls(), Observability::default()).await;
        let _silent = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let _also = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let started = std::time::Instant::now();
        let operator = channel(addr, &ca.pki.ca_cert, &ca.client).await;
        healthy(&operator).await.expect("a call");
        assert!(
            started.elapsed() < crate::tls::HANDSHAKE_TIMEOUT / 2,
            "{:?}",
            started.elapsed()
        );
    }

    // Fails if a TLS connection lacks TCP_NODELAY, or if the store does
    // not offer HTTP/2 by ALPN (tonic's client refuses a connection without).
    #[tokio::test]
    async fn tls_connections_have_tcp_nodelay_and_speak_h2() {
        let ca = OneCa::new();
        let tls = ServerTls::load(ca.files.tls()).expect("TLS");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let connections = Arc::new(Connections::default());
        let mut accepted = crate::tls::incoming(listener, &tls, Arc::clone(&connections), None);
        let channel = tokio::spawn({
            let (ca, client) = (ca.pki.ca_cert.clone(), ca.client.clone());
            async move { channel(addr, &ca, &client).await }
        });
        let connection = accepted
            .next()
            .await
            .expect("a connection")
            .expect("accepted");
        assert!(connection.tcp().nodelay().expect("read TCP_NODELAY"));
        assert_eq!(connections.open(), 1);
        // tonic's client connects only over h2.
        let handshake = tokio::time::timeout(PATIENCE, async {
            let _server = tokio::spawn(
                Server::builder()
                    .add_service(tonic_health::server::health_reporter().1)
                    .serve_with_incoming(futures::stream::iter([Ok::<_, std::io::Error>(
                        connection,
                    )])),
            );
            channel.await.expect("task")
        })
        .await;
        assert!(handshake.is_ok());
        drop(handshake);
        eventually("the connection forgotten once closed", || async {
            connections.open() == 0
        })
        .await;
    }
}
