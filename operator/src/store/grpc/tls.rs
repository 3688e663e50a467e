//! The store's channel when TLS comes from files (`--petstore-ca-file`,
//! `--petstore-cert-file`, `--petstore-key-file`): TCP and a rustls
//! handshake of our own, with a config whose server verifier and client
//! certificate are swapped when the files change
//! ([`petstore_tls::client::ClientTls`]).
//!
//! A swapped config only decides the next handshake, and the channel keeps
//! its HTTP/2 connection for as long as it works: the new certificate would
//! not be in use until that connection broke. So after each reload
//! [`StoreChannel`] starts a new channel, which the next call connects: calls
//! from then on go over a connection made with the new files, while the
//! calls and streams (the change feed) already on the old one finish
//! there; it closes when the last of them ends.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use petstore_tls::client::ClientTls;
use petstore_tls::{FileWatcher, Reload};
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use tonic::body::Body;
use tonic::codegen::http::{self, Uri};
use tonic::transport::{Channel, Endpoint};
use tower::Service;

use super::calls::StoreCallMetrics;

/// The channel every call of a [`super::GrpcPetStore`] goes over: one fixed
/// channel, or with TLS from files the one made after the last reload.
pub struct StoreChannel {
    source: Arc<Source>,
    /// The channel `poll_ready` readied, which `call` must use.
    ready: Option<Channel>,
}

impl Clone for StoreChannel {
    // A clone is not ready: readiness is a place reserved in one channel's
    // queue, for one call.
    fn clone(&self) -> Self {
        Self {
            source: Arc::clone(&self.source),
            ready: None,
        }
    }
}

struct Source {
    /// The channel in use, and the reload it was made after.
    current: Mutex<(u64, Channel)>,
    reconnect: Option<Reconnect>,
}

/// What makes a channel again after a reload.
struct Reconnect {
    endpoint: Endpoint,
    connector: TlsConnector,
    /// Reloads so far; the watcher counts them.
    reloads: Arc<AtomicU64>,
    _watcher: FileWatcher,
}

impl StoreChannel {
    pub fn fixed(channel: Channel) -> Self {
        Self {
            source: Arc::new(Source {
                current: Mutex::new((0, channel)),
                reconnect: None,
            }),
            ready: None,
        }
    }

    /// A channel to `endpoint` (whose scheme must be `http`: the TLS is
    /// ours, not tonic's) over TLS from `tls`' files, following them.
    pub fn reloading(
        endpoint: Endpoint,
        tls: ClientTls,
        server_name: ServerName<'static>,
        call_timeout: Duration,
        metrics: StoreCallMetrics,
    ) -> Result<Self, petstore_tls::TlsError> {
        let tls = Arc::new(tls);
        let reloads = Arc::new(AtomicU64::new(0));
        let watcher = tls.watch({
            let reloads = Arc::clone(&reloads);
            let metrics = metrics.clone();
            move |outcome| match outcome {
                Ok(Reload::Changed) => {
                    metrics.tls_reloaded(true);
                    reloads.fetch_add(1, Ordering::Release);
                    tracing::debug!(
                        "the next store call opens a connection with the new TLS files"
                    );
                }
                Ok(Reload::Unchanged) => {}
                Err(_) => metrics.tls_reloaded(false),
            }
        })?;
        let mut http = HttpConnector::new();
        // As tonic's own connector: no Nagle delay, keepalive as the
        // endpoint's, and the scheme is ours to check.
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_keepalive(Some(Duration::from_secs(30)));
        http.set_connect_timeout(Some(call_timeout));
        let connector = TlsConnector {
            http,
            tls: tokio_rustls::TlsConnector::from(tls.config()),
            server_name,
            metrics,
        };
        let channel = endpoint.connect_with_connector_lazy(connector.clone());
        Ok(Self {
            source: Arc::new(Source {
                current: Mutex::new((0, channel)),
                reconnect: Some(Reconnect {
                    endpoint,
                    connector,
                    reloads,
                    _watcher: watcher,
                }),
            }),
            ready: None,
        })
    }

    /// The channel for the next call: after a reload, a new one.
    pub fn current(&self) -> Channel {
        let mut current = self
            .source
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(reconnect) = &self.source.reconnect {
            let reloads = reconnect.reloads.load(Ordering::Acquire);
            if current.0 != reloads {
                // Made here, on the caller's runtime (the watcher's thread
                // has none to spawn the channel's worker on).
                let channel = reconnect
                    .endpoint
                    .connect_with_connector_lazy(reconnect.connector.clone());
                *current = (reloads, channel);
            }
        }
        current.1.clone()
    }
}

impl Service<http::Request<Body>> for StoreChannel {
    type Response = http::Response<Body>;
    type Error = tonic::transport::Error;
    type Future = tonic::transport::channel::ResponseFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        if self.ready.is_none() {
            self.ready = Some(self.current());
        }
        match &mut self.ready {
            Some(channel) => channel.poll_ready(cx),
            None => Poll::Ready(Ok(())),
        }
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        // tower's contract: `call` comes after a ready `poll_ready`.
        let mut channel = self.ready.take().unwrap_or_else(|| self.current());
        channel.call(request)
    }
}

/// TCP, then a rustls handshake offering `h2`, as tonic's connector does
/// but with a config that follows the files.
#[derive(Clone)]
struct TlsConnector {
    http: HttpConnector,
    tls: tokio_rustls::TlsConnector,
    server_name: ServerName<'static>,
    metrics: StoreCallMetrics,
}

type Connected = TokioIo<tokio_rustls::client::TlsStream<TcpStream>>;
type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, thiserror::Error)]
#[error("the store did not agree to HTTP/2 (ALPN h2) in the TLS handshake")]
struct NoHttp2;

impl Service<Uri> for TlsConnector {
    type Response = Connected;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Connected, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.http.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let tcp = self.http.call(uri);
        let tls = self.tls.clone();
        let name = self.server_name.clone();
        let metrics = self.metrics.clone();
        Box::pin(async move {
            let connected = async {
                let tcp = tcp.await?.into_inner();
                let stream = tls.connect(name, tcp).await?;
                if stream.get_ref().1.alpn_protocol() != Some(b"h2") {
                    return Err(NoHttp2.into());
                }
                Ok(TokioIo::new(stream))
            }
            .await;
            metrics.tls_connection(connected.is_ok());
            connected
        })
    }
}

/// The name to check in the store's certificate: `--petstore-tls-server-name`,
/// or the address's host (a DNS name or an IP address).
pub fn server_name(
    host: &str,
) -> Result<ServerName<'static>, rustls_pki_types::InvalidDnsNameError> {
    let host = host
        .strip_prefix('[')
        .and_then(|rest| rest.strip_suffix(']'))
        .unwrap_or(host);
    ServerName::try_from(host.to_owned())
}
