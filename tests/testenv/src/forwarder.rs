//! A round-robin TCP forwarder on 127.0.0.1, standing in for a Kubernetes
//! Service in front of several store replicas: each new connection goes to
//! the next backend that accepts it.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::{Result, io};

pub struct Forwarder {
    pub addr: String,
    state: Arc<State>,
}

struct State {
    backends: Vec<String>,
    next: AtomicUsize,
    /// Connections currently open to each backend.
    open: Vec<AtomicUsize>,
    /// Connections ever made to each backend.
    total: Vec<AtomicUsize>,
    stopped: AtomicBool,
    /// Both halves of every live connection, closed when the forwarder drops.
    live: Mutex<Vec<TcpStream>>,
}

impl Forwarder {
    pub fn start(backends: Vec<String>) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").map_err(io("binding the forwarder"))?;
        let addr = listener
            .local_addr()
            .map_err(io("reading the forwarder address"))?
            .to_string();
        let state = Arc::new(State {
            open: backends.iter().map(|_| AtomicUsize::new(0)).collect(),
            total: backends.iter().map(|_| AtomicUsize::new(0)).collect(),
            backends,
            next: AtomicUsize::new(0),
            stopped: AtomicBool::new(false),
            live: Mutex::new(Vec::new()),
        });
        let accepting = Arc::clone(&state);
        std::thread::Builder::new()
            .name("forwarder".into())
            .spawn(move || accept_loop(&listener, &accepting))
            .map_err(io("starting the forwarder"))?;
        Ok(Self { addr, state })
    }

    /// Connections open right now to backend `index`.
    pub fn open_connections(&self, index: usize) -> usize {
        self.state.open[index].load(Ordering::SeqCst)
    }

    /// Connections ever forwarded to backend `index`.
    pub fn total_connections(&self, index: usize) -> usize {
        self.state.total[index].load(Ordering::SeqCst)
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.state.stopped.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(&self.addr);
        if let Ok(live) = self.state.live.lock() {
            for stream in live.iter() {
                let _ = stream.shutdown(Shutdown::Both);
            }
        }
    }
}

fn accept_loop(listener: &TcpListener, state: &Arc<State>) {
    for client in listener.incoming() {
        if state.stopped.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = client else { continue };
        let _ = client.set_nodelay(true);
        let state = Arc::clone(state);
        std::thread::spawn(move || forward(client, &state));
    }
}

fn forward(client: TcpStream, state: &State) {
    let n = state.backends.len();
    let first = state.next.fetch_add(1, Ordering::SeqCst);
    // The next backend that accepts; a dead one is skipped, as a Service
    // skips a Pod that is not ready.
    let Some((index, upstream)) = (0..n).find_map(|i| {
        let index = (first + i) % n;
        TcpStream::connect_timeout(&state.backends[index].parse().ok()?, Duration::from_secs(1))
            .ok()
            .map(|s| (index, s))
    }) else {
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    let _ = upstream.set_nodelay(true);
    let (Ok(client_w), Ok(upstream_w)) = (client.try_clone(), upstream.try_clone()) else {
        return;
    };
    if let Ok(mut live) = state.live.lock() {
        for s in [&client, &upstream] {
            if let Ok(s) = s.try_clone() {
                live.push(s);
            }
        }
    }
    state.open[index].fetch_add(1, Ordering::SeqCst);
    state.total[index].fetch_add(1, Ordering::SeqCst);
    let back = std::thread::spawn(move || pipe(upstream, client_w));
    pipe(client, upstream_w);
    let _ = back.join();
    state.open[index].fetch_sub(1, Ordering::SeqCst);
}

/// Copies until either side closes, then closes both, so a killed backend
/// looks to the client like a dropped connection.
fn pipe(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}
