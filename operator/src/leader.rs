//! Lease-based leader election, so several replicas are safe and only one
//! reconciles.

use std::time::Duration;

use kube::Client;
use kube_lease_manager::LeaseManagerBuilder;
use tokio::sync::watch;

#[derive(Debug, thiserror::Error)]
#[error("leader election on Lease {namespace}/{name}: {source}")]
pub struct LeaderError {
    namespace: String,
    name: String,
    #[source]
    source: kube_lease_manager::LeaseManagerError,
}

/// Holds the lease while alive; dropping it stops renewing.
pub struct Leadership {
    pub changes: watch::Receiver<bool>,
    _task: tokio::task::JoinHandle<
        Result<kube_lease_manager::LeaseManager, kube_lease_manager::LeaseManagerError>,
    >,
}

impl Leadership {
    /// Starts competing for the lease in the background.
    pub async fn start(
        client: Client,
        namespace: &str,
        name: &str,
        identity: &str,
        lease_duration: Duration,
    ) -> Result<Self, LeaderError> {
        let seconds = lease_duration.as_secs().max(2);
        let manager = LeaseManagerBuilder::new(client, name)
            .with_namespace(namespace)
            .with_identity(identity)
            .with_duration(seconds)
            .with_grace((seconds / 3).max(1))
            .build()
            .await
            .map_err(|source| LeaderError {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                source,
            })?;
        let (changes, task) = manager.watch().await;
        Ok(Self {
            changes,
            _task: task,
        })
    }

    /// Resolves once this replica holds the lease.
    pub async fn acquired(&mut self) -> bool {
        self.changes.wait_for(|leader| *leader).await.is_ok()
    }

    /// Resolves when this replica loses the lease (or the manager stops).
    pub async fn lost(&mut self) {
        let _ = self.changes.wait_for(|leader| !*leader).await;
    }
}
