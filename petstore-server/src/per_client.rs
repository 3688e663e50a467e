//! A bound on the connections one client holds open at once
//! (`--max-connections-per-client`), a client being its IP address. A
//! connection beyond it is closed as soon as it is accepted, before any TLS
//! handshake, so one client opening connections without end takes neither
//! the store's sockets nor its handshakes from the others. With the bound
//! on streams per connection
//! ([`MAX_CONCURRENT_STREAMS_PER_CONNECTION`](crate::server::MAX_CONCURRENT_STREAMS_PER_CONNECTION)),
//! it bounds the calls one client can have open.
//!
//! The operator holds one connection per store (one channel), and grpcurl
//! one per call, so the default leaves a wide margin.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

use crate::metrics::ServerMetrics;

/// The default bound: far above a client of the store's own (the operator
/// holds one connection per store), low enough that a flood is refused.
pub const DEFAULT_MAX_CONNECTIONS_PER_CLIENT: usize = 64;

/// How many places each client (an IP address) holds now: the count both
/// the connection bound here and the admission share
/// ([`crate::admission`]) keep.
#[derive(Debug, Default)]
pub struct ClientCounts(Mutex<HashMap<IpAddr, usize>>);

/// One of a client's places, given back when dropped.
#[derive(Debug)]
pub struct ClientPlace {
    client: IpAddr,
    counts: Arc<ClientCounts>,
}

impl Drop for ClientPlace {
    fn drop(&mut self) {
        let mut counts = self.counts.lock();
        if let Some(count) = counts.get_mut(&self.client) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.client);
            }
        }
    }
}

impl ClientCounts {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, usize>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A place for `client`, unless it holds `limit` already.
    pub fn take(self: &Arc<Self>, client: IpAddr, limit: usize) -> Option<ClientPlace> {
        let mut counts = self.lock();
        let count = counts.entry(client).or_default();
        if *count >= limit {
            return None;
        }
        *count += 1;
        Some(ClientPlace {
            client,
            counts: Arc::clone(self),
        })
    }

    /// How many places `client` holds now.
    pub fn held_by(&self, client: IpAddr) -> usize {
        self.lock().get(&client).copied().unwrap_or(0)
    }
}

/// A connection's place under the bound, held while it is open.
pub type Held = ClientPlace;

/// The connections each client holds; see the module's documentation.
#[derive(Debug)]
pub struct PerClient {
    limit: usize,
    counts: Arc<ClientCounts>,
    metrics: Arc<ServerMetrics>,
}

impl PerClient {
    pub fn new(limit: usize, metrics: Arc<ServerMetrics>) -> Arc<Self> {
        Arc::new(Self {
            limit,
            counts: Arc::default(),
            metrics,
        })
    }

    /// A place for one more connection of `peer`'s client, or `None` (said
    /// and counted) when it holds the most it may.
    pub fn admit(&self, peer: SocketAddr) -> Option<Held> {
        let client = peer.ip();
        let held = self.counts.take(client, self.limit);
        if held.is_none() {
            tracing::warn!(
                %client,
                limit = self.limit,
                "a client opened more connections than it may hold at once: closed"
            );
            self.metrics.connection_refused();
        }
        held
    }

    /// How many connections `client` holds now.
    pub fn held_by(&self, client: IpAddr) -> usize {
        self.counts.held_by(client)
    }
}

/// A plaintext connection that holds its client's place while open.
#[derive(Debug)]
pub struct HeldTcp {
    stream: TcpStream,
    _held: Held,
}

impl Connected for HeldTcp {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncRead for HeldTcp {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for HeldTcp {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// After a failed accept (no file descriptors left, say), before the next.
const ACCEPT_BACKOFF: std::time::Duration = std::time::Duration::from_millis(50);
/// Connections waiting for the server to take them.
pub(crate) const READY_QUEUE: usize = 64;

/// Accepts on `listener` until `ready` closes (the server stopped taking
/// connections), the one accept loop of the plaintext and TLS paths: each
/// connection within its client's bound (refused before anything else,
/// a TLS handshake above all), with `TCP_NODELAY` (see
/// [`crate::server::incoming`]), then given to `take` with its place.
pub(crate) async fn accept_each<T>(
    listener: TcpListener,
    per_client: Option<Arc<PerClient>>,
    ready: mpsc::Sender<T>,
    mut take: impl FnMut(TcpStream, SocketAddr, Option<Held>, mpsc::Sender<T>),
) {
    loop {
        let accepted = tokio::select! {
            () = ready.closed() => return,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "accepting a connection");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let held = match &per_client {
            Some(per_client) => match per_client.admit(peer) {
                Some(held) => Some(held),
                None => continue,
            },
            None => None,
        };
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%peer, %error, "setting TCP_NODELAY");
        }
        take(stream, peer, held, ready.clone());
    }
}

/// The plaintext connections `listener` accepts, within their client's
/// bound; see [`accept_each`].
pub fn incoming(
    listener: TcpListener,
    per_client: Arc<PerClient>,
) -> ReceiverStream<io::Result<HeldTcp>> {
    let (ready, taken) = mpsc::channel(READY_QUEUE);
    tokio::spawn(accept_each(
        listener,
        Some(per_client),
        ready,
        |stream, _peer, held, ready| {
            let Some(held) = held else { return };
            let connection = HeldTcp {
                stream,
                _held: held,
            };
            // Waits for room in the queue without holding up the accepts;
            // if the server stopped taking connections, this one closes.
            tokio::spawn(async move {
                let _ = ready.send(Ok(connection)).await;
            });
        },
    ));
    ReceiverStream::new(taken)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(ip: [u8; 4], port: u16) -> SocketAddr {
        SocketAddr::from((ip, port))
    }

    #[test]
    fn each_client_holds_at_most_the_limit_and_a_closed_connection_gives_its_place_back() {
        let metrics = Arc::new(ServerMetrics::default());
        let per_client = PerClient::new(2, Arc::clone(&metrics));
        let first = per_client.admit(peer([127, 0, 0, 1], 1000)).expect("first");
        let _second = per_client
            .admit(peer([127, 0, 0, 1], 1001))
            .expect("second");
        assert!(
            per_client.admit(peer([127, 0, 0, 1], 1002)).is_none(),
            "a third from one client"
        );
        let other = IpAddr::from([127, 0, 0, 2]);
        let _elsewhere = per_client
            .admit(peer([127, 0, 0, 2], 1000))
            .expect("another client is not held back");
        assert_eq!(per_client.held_by(other), 1);
        drop(first);
        assert_eq!(per_client.held_by(IpAddr::from([127, 0, 0, 1])), 1);
        assert!(
            per_client.admit(peer([127, 0, 0, 1], 1003)).is_some(),
            "a place given back is taken again"
        );
        let scrape = metrics.encode().expect("metrics encode");
        assert!(
            scrape.contains("petstore_server_connections_refused_total 1"),
            "{scrape}"
        );
    }
}
