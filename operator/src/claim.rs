//! The cluster's claim on its installation's name in the store.
//!
//! A cluster rebuilt or restored under the same installation name takes its
//! Pets' records back by namespace and name; two *live* clusters with one
//! name would take each other's. So the leader claims the name for its
//! cluster (the UID of its `kube-system` Namespace, the same from every
//! replica and restart, new in a rebuilt cluster) before it reconciles, and
//! renews the claim every third of its TTL while it does. The store's clock
//! decides when a claim expires: a rebuilt cluster waits at most one TTL
//! for a dead one's. The unnamed installation claims nothing, as before.

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::store::{InstallationClaim, PetStore, StoreError};

/// What to claim, for whom, for how long.
#[derive(Clone, Copy, Debug)]
pub struct Claim<'a> {
    /// The installation's name; empty claims nothing.
    pub installation: &'a str,
    /// This cluster: its `kube-system` Namespace's UID.
    pub holder: &'a str,
    /// How long a claim lasts unless renewed (`--installation-claim-ttl`).
    pub ttl: Duration,
}

/// How [`run_while_claimed`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claimed {
    /// `stop` came, or the work ended by itself.
    Ended,
    /// The claim was lost while reconciling (another cluster holds it, or
    /// it could not be renewed before it expired): the work was stopped.
    Lost,
}

/// The shortest wait between two claims.
const MIN_RETRY: Duration = Duration::from_millis(100);
/// Retried this long after a refused claim's expiry, so the store's clock
/// has passed it.
const AFTER_EXPIRY: Duration = Duration::from_millis(100);

/// The refusal as the log says it.
pub fn refusal_message(claim: &Claim<'_>, answer: &InstallationClaim) -> String {
    format!(
        "the installation {:?} is claimed in the store by another live cluster (kube-system UID {}) until {}; two live clusters must not share an installation name: give this one (kube-system UID {}) its own --installation, or stop the other. Reconciling nothing; retrying, so this cluster takes over once that claim expires",
        claim.installation,
        answer.holder,
        answer
            .expires_at
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        claim.holder,
    )
}

/// Claims the installation's name, then runs `work` while the claim is
/// held, renewing it every third of its TTL. Until the claim is granted,
/// `work` does not start: a refused claim is logged and retried (a claim
/// that expires is anyone's), and `stop` ends the wait. `work`'s token is
/// cancelled on `stop` or when the claim is lost. The unnamed
/// installation, and a store without claims (the book's), run `work`
/// unclaimed.
pub async fn run_while_claimed<W, F>(
    store: &dyn PetStore,
    claim: Claim<'_>,
    stop: &CancellationToken,
    metrics: &Metrics,
    work: W,
) -> Claimed
where
    W: FnOnce(CancellationToken) -> F,
    F: Future<Output = ()>,
{
    metrics.set_installation_claimed(false);
    if claim.installation.is_empty() {
        work(stop.clone()).await;
        return Claimed::Ended;
    }
    let Some(claimed) = acquire(store, &claim, stop, metrics).await else {
        return Claimed::Ended;
    };
    let Some(mut expires) = claimed else {
        // No claims in this store: reconcile as before.
        work(stop.clone()).await;
        return Claimed::Ended;
    };
    let every = (claim.ttl / 3).max(MIN_RETRY);
    let working = stop.child_token();
    let work = work(working.clone());
    tokio::pin!(work);
    let mut next = Instant::now() + every;
    loop {
        tokio::select! {
            () = &mut work => {
                metrics.set_installation_claimed(false);
                return Claimed::Ended;
            }
            () = tokio::time::sleep_until(next) => {}
        }
        let sent = Instant::now();
        match store
            .claim_installation(claim.installation, claim.holder, claim.ttl)
            .await
        {
            Ok(answer) if answer.granted => {
                expires = sent + claim.ttl;
                next = sent + every;
            }
            Ok(answer) => {
                tracing::error!(
                    installation = %claim.installation,
                    holder = %answer.holder,
                    expires_at = %answer.expires_at,
                    "lost the installation's claim: {}",
                    refusal_message(&claim, &answer)
                );
                return stop_work(&working, work, metrics).await;
            }
            Err(StoreError::Unimplemented { .. }) => {
                // The store was replaced by one without claims.
                tracing::warn!(installation = %claim.installation, "the pet store no longer offers ClaimInstallation; reconciling unclaimed");
                metrics.set_installation_claimed(false);
                work.await;
                return Claimed::Ended;
            }
            Err(err) => {
                let retry = (every / 2).max(MIN_RETRY);
                if Instant::now() + retry >= expires {
                    tracing::error!(installation = %claim.installation, error = %err, "cannot renew the installation's claim before it expires; stopping reconciling");
                    return stop_work(&working, work, metrics).await;
                }
                tracing::warn!(installation = %claim.installation, error = %err, "cannot renew the installation's claim; retrying");
                next = Instant::now() + retry;
            }
        }
    }
}

/// Stops `work` after its claim was lost.
async fn stop_work<F: Future<Output = ()>>(
    working: &CancellationToken,
    work: std::pin::Pin<&mut F>,
    metrics: &Metrics,
) -> Claimed {
    metrics.set_installation_claimed(false);
    working.cancel();
    work.await;
    Claimed::Lost
}

/// Claims until granted: `Some(Some(deadline))` with the local instant the
/// claim surely lasts to, `Some(None)` for a store without claims, `None`
/// when `stop` came first.
async fn acquire(
    store: &dyn PetStore,
    claim: &Claim<'_>,
    stop: &CancellationToken,
    metrics: &Metrics,
) -> Option<Option<Instant>> {
    let every = (claim.ttl / 3).max(MIN_RETRY);
    loop {
        // The store's expiry counts from when it answered, after this.
        let sent = Instant::now();
        let wait = match store
            .claim_installation(claim.installation, claim.holder, claim.ttl)
            .await
        {
            Ok(answer) if answer.granted => {
                tracing::info!(installation = %claim.installation, holder = %claim.holder, ttl = ?claim.ttl, "claimed the installation's name in the store; reconciling");
                metrics.set_installation_claimed(true);
                return Some(Some(sent + claim.ttl));
            }
            Ok(answer) => {
                metrics.set_installation_claimed(false);
                tracing::error!(
                    installation = %claim.installation,
                    holder = %answer.holder,
                    expires_at = %answer.expires_at,
                    "{}",
                    refusal_message(claim, &answer)
                );
                (answer.remaining + AFTER_EXPIRY).min(every).max(MIN_RETRY)
            }
            Err(StoreError::Unimplemented { .. }) => {
                tracing::warn!(
                    installation = %claim.installation,
                    "the pet store does not implement ClaimInstallation (the book's store, or an older petstore-server): nothing keeps another live cluster with this installation name from taking this one's records; reconciling unclaimed"
                );
                return Some(None);
            }
            Err(err) => {
                tracing::warn!(installation = %claim.installation, error = %err, "cannot claim the installation's name in the store; retrying");
                every
            }
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = stop.cancelled() => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;
    use crate::store::Operation;
    use crate::store::fake::FakeStore;

    const TTL: Duration = Duration::from_secs(6);

    /// A store that answers claims from a script, repeating its last
    /// answer.
    fn script(answers: Vec<Result<InstallationClaim, StoreError>>) -> FakeStore {
        let store = FakeStore::default();
        store.answer_claims(answers);
        store
    }

    /// How many claims `store` was sent, each for [`blue`].
    fn claims(store: &FakeStore) -> usize {
        let calls = store.calls();
        for call in &calls {
            assert_eq!(call, &format!("claim:blue:this-cluster:{TTL:?}"));
        }
        calls.len()
    }

    fn granted() -> Result<InstallationClaim, StoreError> {
        Ok(InstallationClaim {
            granted: true,
            holder: "this-cluster".into(),
            expires_at: chrono::DateTime::UNIX_EPOCH,
            remaining: TTL,
        })
    }

    fn refused(remaining: Duration) -> Result<InstallationClaim, StoreError> {
        Ok(InstallationClaim {
            granted: false,
            holder: "other-cluster".into(),
            expires_at: chrono::DateTime::UNIX_EPOCH,
            remaining,
        })
    }

    fn down() -> Result<InstallationClaim, StoreError> {
        Err(StoreError::Unavailable {
            operation: Operation::Claim,
            message: "connection refused".into(),
            retry_after: None,
        })
    }

    fn blue() -> Claim<'static> {
        Claim {
            installation: "blue",
            holder: "this-cluster",
            ttl: TTL,
        }
    }

    fn claimed_gauge(metrics: &Metrics) -> bool {
        metrics
            .encode()
            .expect("metrics")
            .lines()
            .any(|line| line == "petstore_operator_installation_claimed 1")
    }

    /// Work that notes when it starts and runs until its token is
    /// cancelled.
    fn work(
        started: Arc<AtomicBool>,
    ) -> impl FnOnce(CancellationToken) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> {
        move |token| {
            Box::pin(async move {
                started.store(true, Ordering::SeqCst);
                token.cancelled().await;
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_claim_reconciles_nothing_until_the_other_expires() {
        let store = script(vec![
            refused(Duration::from_secs(30)),
            refused(Duration::from_millis(500)),
            granted(),
        ]);
        let metrics = Metrics::default();
        let stop = CancellationToken::new();
        let started = Arc::new(AtomicBool::new(false));
        let run = run_while_claimed(&store, blue(), &stop, &metrics, work(Arc::clone(&started)));
        tokio::pin!(run);
        let begun = Instant::now();
        // The first refusal's claim lasts 30 s more: retried a third of
        // the TTL later, not sooner.
        tokio::select! {
            _ = &mut run => panic!("ended while refused"),
            () = tokio::time::sleep(Duration::from_millis(1_900)) => {}
        }
        assert_eq!(claims(&store), 1);
        assert!(!started.load(Ordering::SeqCst), "worked while refused");
        assert!(!claimed_gauge(&metrics));
        // The second expires in 500 ms: retried just after.
        tokio::select! {
            _ = &mut run => panic!("ended"),
            () = tokio::time::sleep(Duration::from_millis(1_000)) => {}
        }
        assert_eq!(claims(&store), 3);
        assert!(begun.elapsed() < Duration::from_secs(3));
        assert!(started.load(Ordering::SeqCst), "works once granted");
        assert!(claimed_gauge(&metrics));
        // Renewed every third of the TTL while working.
        tokio::select! {
            _ = &mut run => panic!("ended"),
            () = tokio::time::sleep(TTL * 2) => {}
        }
        assert_eq!(claims(&store), 3 + 6);
        stop.cancel();
        assert_eq!(run.await, Claimed::Ended);
        assert!(!claimed_gauge(&metrics));
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_lost_while_working_stops_the_work() {
        let store = script(vec![granted(), granted(), refused(TTL)]);
        let metrics = Metrics::default();
        let stop = CancellationToken::new();
        let started = Arc::new(AtomicBool::new(false));
        let ended =
            run_while_claimed(&store, blue(), &stop, &metrics, work(Arc::clone(&started))).await;
        assert_eq!(ended, Claimed::Lost);
        assert!(started.load(Ordering::SeqCst));
        assert!(!stop.is_cancelled(), "only the work's token is cancelled");
        assert_eq!(claims(&store), 3);
        assert!(!claimed_gauge(&metrics));
    }

    #[tokio::test(start_paused = true)]
    async fn renewals_ride_out_a_short_outage_but_not_the_claims_expiry() {
        // Down for two tries (2 s then 1 s later), then back: kept.
        let store = script(vec![granted(), down(), down(), granted()]);
        let metrics = Metrics::default();
        let stop = CancellationToken::new();
        let started = Arc::new(AtomicBool::new(false));
        let run = run_while_claimed(&store, blue(), &stop, &metrics, work(Arc::clone(&started)));
        tokio::pin!(run);
        tokio::select! {
            _ = &mut run => panic!("lost in a short outage"),
            () = tokio::time::sleep(TTL * 3) => {}
        }
        assert!(claimed_gauge(&metrics));
        stop.cancel();
        assert_eq!(run.await, Claimed::Ended);

        // Down for good: stopped before the claim expires.
        let store = script(vec![granted(), down()]);
        let stop = CancellationToken::new();
        let begun = Instant::now();
        let ended =
            run_while_claimed(&store, blue(), &stop, &metrics, work(Arc::clone(&started))).await;
        assert_eq!(ended, Claimed::Lost);
        assert!(begun.elapsed() < TTL, "{:?}", begun.elapsed());
    }

    #[tokio::test(start_paused = true)]
    async fn the_unnamed_installation_and_a_store_without_claims_work_unclaimed() {
        let metrics = Metrics::default();
        let started = Arc::new(AtomicBool::new(false));
        let store = script(vec![Err(StoreError::Unimplemented {
            operation: Operation::Claim,
        })]);
        let stop = CancellationToken::new();
        stop.cancel();
        let ended =
            run_while_claimed(&store, blue(), &stop, &metrics, work(Arc::clone(&started))).await;
        assert_eq!(ended, Claimed::Ended);
        assert!(started.load(Ordering::SeqCst), "works unclaimed");
        assert_eq!(claims(&store), 1);

        let store = script(vec![granted()]);
        let unnamed = Claim {
            installation: "",
            ..blue()
        };
        started.store(false, Ordering::SeqCst);
        run_while_claimed(&store, unnamed, &stop, &metrics, work(Arc::clone(&started))).await;
        assert!(started.load(Ordering::SeqCst));
        assert_eq!(claims(&store), 0, "the unnamed installation claims nothing");
        assert!(!claimed_gauge(&metrics));
    }

    #[tokio::test(start_paused = true)]
    async fn stop_ends_the_wait_of_a_refused_claim() {
        let store = script(vec![refused(Duration::from_secs(60))]);
        let metrics = Metrics::default();
        let stop = CancellationToken::new();
        let started = Arc::new(AtomicBool::new(false));
        let cancel = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(9)).await;
            cancel.cancel();
        });
        let ended =
            run_while_claimed(&store, blue(), &stop, &metrics, work(Arc::clone(&started))).await;
        assert_eq!(ended, Claimed::Ended);
        assert!(!started.load(Ordering::SeqCst));
        // Retried every third of the TTL meanwhile: at 0, 2, 4, 6 and 8 s.
        assert_eq!(claims(&store), 5);
    }

    #[test]
    fn the_refusal_names_the_installation_both_clusters_and_the_way_out() {
        let answer = InstallationClaim {
            granted: false,
            holder: "5f1c-other".into(),
            expires_at: chrono::DateTime::from_timestamp(1_700_000_000, 0).expect("a time"),
            remaining: TTL,
        };
        let message = refusal_message(&blue(), &answer);
        crate::fixtures::assert_mentions(
            &message,
            &[
                "the installation \"blue\" is claimed in the store by another live cluster (kube-system UID 5f1c-other) until 2023-11-14T22:13:20Z",
                "two live clusters must not share an installation name",
                "give this one (kube-system UID this-cluster) its own --installation, or stop the other",
                "takes over once that claim expires",
            ],
        );
    }
}
