//! Lease-based leader election, so several replicas are safe and only one
//! reconciles.

use std::time::Duration;

use kube::Client;
use kube_lease_manager::LeaseManagerBuilder;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::metrics::Metrics;

#[derive(Debug, thiserror::Error)]
#[error("leader election on Lease {namespace}/{name}: {source}")]
pub struct LeaderError {
    namespace: String,
    name: String,
    #[source]
    source: kube_lease_manager::LeaseManagerError,
}

/// The Lease replicas compete for.
#[derive(Clone, Copy, Debug)]
pub struct Lease<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    /// This replica's name in the Lease.
    pub identity: &'a str,
    /// How long a dead leader blocks a standby.
    pub duration: Duration,
}

/// How [`run_while_leading`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reign {
    /// Shut down, whether it led or not.
    Ended,
    /// The Lease was lost while leading: another replica may be reconciling
    /// already.
    Lost,
}

/// Competes for the Lease until this replica holds it, then runs `work`
/// until it returns. The token `work` gets is cancelled on `shutdown` or
/// when the Lease is lost; `work` should stop gracefully then. Returns at
/// once, without working, if `shutdown` comes first.
pub async fn run_while_leading<W, F>(
    client: Client,
    lease: Lease<'_>,
    shutdown: &CancellationToken,
    metrics: &Metrics,
    work: W,
) -> Result<Reign, LeaderError>
where
    W: FnOnce(CancellationToken) -> F,
    F: Future<Output = ()>,
{
    let mut leadership = Leadership::start(client, lease).await?;
    info!(lease = %lease.name, namespace = %lease.namespace, "waiting for leadership");
    let acquired = tokio::select! {
        acquired = leadership.acquired() => acquired,
        () = shutdown.cancelled() => false,
    };
    if !acquired {
        return Ok(Reign::Ended);
    }
    info!("became leader; reconciling");
    metrics.set_leader(true);
    let stop = shutdown.child_token();
    let work = work(stop.clone());
    tokio::pin!(work);
    tokio::select! {
        () = &mut work => {}
        () = leadership.lost() => {
            stop.cancel();
            work.await;
        }
    }
    metrics.set_leader(false);
    Ok(if shutdown.is_cancelled() {
        Reign::Ended
    } else {
        Reign::Lost
    })
}

/// Holds the Lease while alive; dropping it stops renewing (and releases
/// the Lease in the background).
struct Leadership {
    changes: watch::Receiver<bool>,
    _task: tokio::task::JoinHandle<
        Result<kube_lease_manager::LeaseManager, kube_lease_manager::LeaseManagerError>,
    >,
}

impl Leadership {
    /// Starts competing for the Lease in the background.
    async fn start(client: Client, lease: Lease<'_>) -> Result<Self, LeaderError> {
        let seconds = lease.duration.as_secs().max(2);
        let manager = LeaseManagerBuilder::new(client, lease.name)
            .with_namespace(lease.namespace)
            .with_identity(lease.identity)
            .with_duration(seconds)
            .with_grace((seconds / 3).max(1))
            .build()
            .await
            .map_err(|source| LeaderError {
                namespace: lease.namespace.to_owned(),
                name: lease.name.to_owned(),
                source,
            })?;
        let (changes, task) = manager.watch().await;
        Ok(Self {
            changes,
            _task: task,
        })
    }

    /// Resolves once this replica holds the Lease (false if the manager
    /// stopped first).
    async fn acquired(&mut self) -> bool {
        self.changes.wait_for(|leader| *leader).await.is_ok()
    }

    /// Resolves when this replica loses the Lease (or the manager stops).
    async fn lost(&mut self) {
        let _ = self.changes.wait_for(|leader| !*leader).await;
    }
}
