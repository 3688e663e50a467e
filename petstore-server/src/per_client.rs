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

/// How many connections each client holds; see the module's documentation.
#[derive(Debug)]
pub struct PerClient {
    limit: usize,
    open: Mutex<HashMap<IpAddr, usize>>,
    metrics: Arc<ServerMetrics>,
}

/// One client's place, given back when dropped (with its connection).
#[derive(Debug)]
pub struct Held {
    client: IpAddr,
    per_client: Arc<PerClient>,
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut open = self.per_client.lock();
        if let Some(count) = open.get_mut(&self.client) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.client);
            }
        }
    }
}

impl PerClient {
    pub fn new(limit: usize, metrics: Arc<ServerMetrics>) -> Arc<Self> {
        Arc::new(Self {
            limit,
            open: Mutex::default(),
            metrics,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, usize>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A place for one more connection of `peer`'s client, or `None` (said
    /// and counted) when it holds the most it may.
    pub fn admit(self: &Arc<Self>, peer: SocketAddr) -> Option<Held> {
        let client = peer.ip();
        {
            let mut open = self.lock();
            let count = open.entry(client).or_default();
            if *count >= self.limit {
                drop(open);
                tracing::warn!(
                    %client,
                    limit = self.limit,
                    "a client opened more connections than it may hold at once: closed"
                );
                self.metrics.connection_refused();
                return None;
            }
            *count += 1;
        }
        Some(Held {
            client,
            per_client: Arc::clone(self),
        })
    }

    /// How many connections `client` holds now.
    pub fn held_by(&self, client: IpAddr) -> usize {
        self.lock().get(&client).copied().unwrap_or(0)
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

/// The plaintext connections `listener` accepts, each with `TCP_NODELAY`
/// (see [`crate::server::incoming`]) and within its client's bound.
pub fn incoming(
    listener: TcpListener,
    per_client: Arc<PerClient>,
) -> ReceiverStream<io::Result<HeldTcp>> {
    let (ready, taken) = mpsc::channel(crate::tls::READY_QUEUE);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                () = ready.closed() => return,
                accepted = listener.accept() => accepted,
            };
            let (stream, peer) = match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "accepting a connection");
                    tokio::time::sleep(crate::tls::ACCEPT_BACKOFF).await;
                    continue;
                }
            };
            let Some(held) = per_client.admit(peer) else {
                continue;
            };
            if let Err(error) = stream.set_nodelay(true) {
                tracing::debug!(%peer, %error, "setting TCP_NODELAY");
            }
            let connection = HeldTcp {
                stream,
                _held: held,
            };
            // The server stopped taking connections: this one closes.
            if ready.send(Ok(connection)).await.is_err() {
                return;
            }
        }
    });
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
