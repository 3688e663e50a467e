//! Stopping: every long-running process here stops on SIGTERM (what
//! Kubernetes and process supervisors send) or SIGINT (Ctrl-C), through
//! tokio's handlers, so no process installs a raw signal handler of its own.
//! On Windows, where the plugin also runs, Ctrl-C and Ctrl-Break stand for
//! them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

#[cfg(unix)]
use tokio::signal::unix::{Signal, SignalKind, signal};
#[cfg(windows)]
use tokio::signal::windows::{CtrlBreak, CtrlC, ctrl_break, ctrl_c};

/// SIGTERM and SIGINT, listened for from [`ShutdownSignals::listen`] on:
/// one that arrives before [`ShutdownSignals::recv`] is awaited still counts.
#[derive(Debug)]
pub struct ShutdownSignals {
    #[cfg(unix)]
    terminate: Signal,
    #[cfg(unix)]
    interrupt: Signal,
    #[cfg(windows)]
    interrupt: CtrlC,
    #[cfg(windows)]
    terminate: CtrlBreak,
}

impl ShutdownSignals {
    /// Starts listening; needs a tokio runtime with I/O enabled.
    #[cfg(unix)]
    pub fn listen() -> std::io::Result<Self> {
        Ok(Self {
            terminate: signal(SignalKind::terminate())?,
            interrupt: signal(SignalKind::interrupt())?,
        })
    }

    /// Starts listening; needs a tokio runtime with I/O enabled.
    #[cfg(windows)]
    pub fn listen() -> std::io::Result<Self> {
        Ok(Self {
            interrupt: ctrl_c()?,
            terminate: ctrl_break()?,
        })
    }

    /// Resolves at the first SIGTERM or SIGINT.
    #[cfg(unix)]
    pub async fn recv(mut self) {
        tokio::select! {
            _ = self.terminate.recv() => tracing::info!("SIGTERM: shutdown requested"),
            _ = self.interrupt.recv() => tracing::info!("SIGINT: shutdown requested"),
        }
    }

    /// Resolves at the first Ctrl-Break or Ctrl-C.
    #[cfg(windows)]
    pub async fn recv(mut self) {
        tokio::select! {
            _ = self.terminate.recv() => tracing::info!("Ctrl-Break: shutdown requested"),
            _ = self.interrupt.recv() => tracing::info!("Ctrl-C: shutdown requested"),
        }
    }
}

/// Resolves at the first SIGTERM or SIGINT. If they cannot be listened for
/// it logs why and never resolves: the process then runs until killed
/// rather than stopping at once.
pub async fn shutdown_requested() {
    match ShutdownSignals::listen() {
        Ok(signals) => signals.recv().await,
        Err(err) => {
            tracing::warn!(error = %err, "cannot listen for SIGTERM or SIGINT; only SIGKILL stops this process");
            std::future::pending::<()>().await;
        }
    }
}

/// For a synchronous program: a flag that turns true at the first SIGTERM
/// or SIGINT, set by a thread of its own. The signals are listened for
/// before this returns.
pub fn stop_flag() -> std::io::Result<Arc<AtomicBool>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()?;
    let signals = {
        let _entered = runtime.enter();
        ShutdownSignals::listen()?
    };
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    std::thread::Builder::new()
        .name("stop-on-signal".into())
        .spawn(move || {
            runtime.block_on(signals.recv());
            flag.store(true, Ordering::SeqCst);
        })?;
    Ok(stop)
}
