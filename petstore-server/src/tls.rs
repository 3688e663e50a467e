//! The store's TLS connections: accepted on one task, each handshake on a
//! task of its own with a timeout (a client that connects and says nothing
//! holds only its own task), each connection handed to the server when its
//! handshake is done.
//!
//! The certificate and client CA come from [`petstore_tls::server::ServerTls`],
//! which reloads them when their files change. Connections already open keep
//! the identity they were made with, with one exception: when the client CA
//! changes, a connection whose client certificate it no longer trusts is
//! closed ([`Connections::close_untrusted`]). A CA taken out of the bundle
//! is trusted by nothing from then on, not merely by new connections.

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::task::AtomicWaker;
use petstore_tls::server::ServerTls;
use rustls_pki_types::CertificateDer;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::Connected;

use crate::per_client::{Held, PerClient, READY_QUEUE, accept_each};

/// A client that opens a connection and never finishes its handshake holds
/// its task no longer than this.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The TLS connections `listener` accepts, handshaken with `tls`' config,
/// each with `TCP_NODELAY` set (see [`crate::server::incoming`]) and
/// tracked in `connections`. Accepting stops when the stream is dropped.
pub fn incoming(
    listener: TcpListener,
    tls: &ServerTls,
    connections: Arc<Connections>,
    per_client: Option<Arc<PerClient>>,
) -> ReceiverStream<io::Result<TlsConnection>> {
    let (ready, taken) = mpsc::channel(READY_QUEUE);
    tokio::spawn(accept(
        listener,
        TlsAcceptor::from(tls.config()),
        connections,
        per_client,
        ready,
    ));
    ReceiverStream::new(taken)
}

/// Each connection [`accept_each`] takes is handshaken on a task of its
/// own, so a client that never finishes its handshake holds up no other.
async fn accept(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    connections: Arc<Connections>,
    per_client: Option<Arc<PerClient>>,
    ready: mpsc::Sender<io::Result<TlsConnection>>,
) {
    accept_each(listener, per_client, ready, |tcp, peer, held, ready| {
        let acceptor = acceptor.clone();
        let connections = Arc::clone(&connections);
        tokio::spawn(async move {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => {
                    // The server stopped taking connections: this one closes.
                    let _ = ready.send(Ok(connections.track(stream, held))).await;
                }
                // The client's failure (a certificate refused, a scanner),
                // not the server's.
                Ok(Err(error)) => tracing::debug!(%peer, %error, "TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
            }
        });
    })
    .await;
}

/// One connection's client certificate chain, and whether it was closed.
#[derive(Debug)]
struct Peer {
    chain: Vec<CertificateDer<'static>>,
    closed: AtomicBool,
    /// The connection's task, woken to see that it was closed.
    waker: AtomicWaker,
}

/// The open TLS connections, with the client certificates they presented.
#[derive(Debug, Default)]
pub struct Connections {
    next: AtomicU64,
    open: Mutex<HashMap<u64, Arc<Peer>>>,
}

impl Connections {
    fn track(self: &Arc<Self>, stream: TlsStream<TcpStream>, held: Option<Held>) -> TlsConnection {
        let chain = stream
            .get_ref()
            .1
            .peer_certificates()
            .map(|chain| chain.iter().map(|cert| cert.clone().into_owned()).collect())
            .unwrap_or_default();
        let peer = Arc::new(Peer {
            chain,
            closed: AtomicBool::new(false),
            waker: AtomicWaker::new(),
        });
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(id, Arc::clone(&peer));
        TlsConnection {
            stream,
            peer,
            _tracked: Tracked {
                id,
                connections: Arc::clone(self),
            },
            _held: held,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Peer>>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Closes every open connection whose client certificate chain
    /// `trusts` refuses; how many it closed. Their calls in progress fail.
    pub fn close_untrusted(&self, trusts: impl Fn(&[CertificateDer<'_>]) -> bool) -> usize {
        let untrusted = self
            .lock()
            .values()
            .filter(|peer| !trusts(&peer.chain))
            .cloned()
            .collect::<Vec<_>>();
        for peer in &untrusted {
            peer.closed.store(true, Ordering::Release);
            peer.waker.wake();
        }
        untrusted.len()
    }

    /// How many connections are open.
    pub fn open(&self) -> usize {
        self.lock().len()
    }
}

/// Forgets its connection when the connection is dropped.
#[derive(Debug)]
struct Tracked {
    id: u64,
    connections: Arc<Connections>,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.connections.lock().remove(&self.id);
    }
}

/// A handshaken connection, which [`Connections::close_untrusted`] can end.
#[derive(Debug)]
pub struct TlsConnection {
    stream: TlsStream<TcpStream>,
    peer: Arc<Peer>,
    _tracked: Tracked,
    /// Its client's place under `--max-connections-per-client`, if bounded.
    _held: Option<Held>,
}

impl TlsConnection {
    /// Whether it was closed; registers the task to be woken when it is.
    fn closed(&self, cx: &Context<'_>) -> bool {
        self.peer.waker.register(cx.waker());
        self.peer.closed.load(Ordering::Acquire)
    }
}

fn closed_error() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "the client CA no longer trusts this connection's certificate",
    )
}

impl AsyncRead for TlsConnection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.closed(cx) {
            return Poll::Ready(Err(closed_error()));
        }
        Pin::new(&mut this.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConnection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.closed(cx) {
            return Poll::Ready(Err(closed_error()));
        }
        Pin::new(&mut this.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.closed(cx) {
            return Poll::Ready(Err(closed_error()));
        }
        Pin::new(&mut this.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

/// What tonic's own TLS server gave the handlers: the TCP addresses and
/// the client's certificates.
impl Connected for TlsConnection {
    type ConnectInfo = <TlsStream<TcpStream> as Connected>::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

impl TlsConnection {
    /// The TCP socket under the TLS.
    pub fn tcp(&self) -> &TcpStream {
        self.stream.get_ref().0
    }
}
