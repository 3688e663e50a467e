//! TCP forwarders from 127.0.0.1 on the host into the node's network
//! namespace. Each connection is dialled from a thread that has entered the
//! namespace (setns is per thread), so nothing on the host routes to it.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::{Result, io};

pub struct Forwarder {
    pub listen: SocketAddr,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

impl Forwarder {
    /// Listens on `listen` (a 127.0.0.1 address) and forwards each
    /// connection to `target` inside the namespace at `netns`.
    pub fn start(listen: SocketAddr, netns: &Path, target: SocketAddr) -> Result<Self> {
        let listener =
            TcpListener::bind(listen).map_err(io(format!("listening on {listen} (in use?)")))?;
        let listen = listener.local_addr().map_err(io("forwarder address"))?;
        listener
            .set_nonblocking(true)
            .map_err(io("forwarder nonblocking"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let netns: PathBuf = netns.to_owned();
        let flag = stop.clone();
        let accept = std::thread::Builder::new()
            .name(format!("forward-{}", listen.port()))
            .spawn(move || {
                while !flag.load(Ordering::SeqCst) {
                    match listener.accept() {
                        Ok((client, _)) => {
                            let netns = netns.clone();
                            let _ = std::thread::Builder::new()
                                .name("forward-conn".into())
                                .spawn(move || {
                                    if let Err(err) = connect_and_copy(client, &netns, target) {
                                        eprintln!("forwarder to {target}: {err}");
                                    }
                                });
                        }
                        Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(20));
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(20)),
                    }
                }
            })
            .map_err(io("starting a forwarder thread"))?;
        Ok(Self {
            listen,
            stop,
            accept: Some(accept),
        })
    }
}

fn connect_and_copy(client: TcpStream, netns: &Path, target: SocketAddr) -> std::io::Result<()> {
    client.set_nonblocking(false)?;
    let ns = File::open(netns)?;
    // SAFETY: setns on this thread only; the fd is valid for the call.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let upstream = TcpStream::connect_timeout(&target, Duration::from_secs(10))?;
    let (mut c_read, mut u_write) = (client.try_clone()?, upstream.try_clone()?);
    let up = std::thread::spawn(move || {
        let _ = copy(&mut c_read, &mut u_write);
        let _ = u_write.shutdown(Shutdown::Write);
    });
    let (mut u_read, mut c_write) = (upstream, client);
    let _ = copy(&mut u_read, &mut c_write);
    let _ = c_write.shutdown(Shutdown::Write);
    let _ = up.join();
    Ok(())
}

fn copy(from: &mut TcpStream, to: &mut TcpStream) -> std::io::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = from.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        to.write_all(&buf[..n])?;
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(handle) = self.accept.take() {
            let _ = handle.join();
        }
    }
}
