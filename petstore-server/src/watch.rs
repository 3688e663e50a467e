//! `WatchPets`: one task per stream reads the store's change feed after the
//! revision the client has seen and hands batches to a bounded buffer. The
//! feed's window is shared; a stream holds at most its buffer, so a client
//! that stops reading cannot grow the store: when its buffer stays full for
//! `slow_after` the stream ends with RESOURCE_EXHAUSTED, naming the
//! revision to resume after. (A client catching up on a long history fills
//! its buffer too, but frees it as fast as it reads, so it is not ended.)

use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::{Stream, StreamExt};
use petstore_proto::petstore as pb;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use crate::metrics::ServerMetrics;
use crate::storage::{Change, FeedError, Storage};
use crate::tenancy::Access;
use crate::wire;

/// How `WatchPets` streams behave.
#[derive(Clone, Copy, Debug)]
pub struct WatchOptions {
    /// A stream without changes for this long gets a progress message.
    pub progress_interval: Duration,
    /// Messages a stream buffers ahead of its client before it is ended as
    /// too slow.
    pub buffer: usize,
    /// Most changes in one message.
    pub batch: usize,
    /// How long a full buffer may stay full before the stream is ended as
    /// too slow.
    pub slow_after: Duration,
}

/// The default progress interval: 10 s.
pub const DEFAULT_PROGRESS_INTERVAL: Duration = Duration::from_secs(10);

impl Default for WatchOptions {
    fn default() -> Self {
        // 32 messages of at most 128 changes: about 1 MB per stream at most.
        Self {
            progress_interval: DEFAULT_PROGRESS_INTERVAL,
            buffer: 32,
            batch: 128,
            slow_after: Duration::from_secs(5),
        }
    }
}

pub type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::WatchPetsResp, Status>> + Send>>;

/// Why a stream was ended by the store; the `reason` label of
/// `petstore_server_watch_terminated_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Termination {
    /// The client read too slowly and its buffer filled.
    Slow,
    /// The client fell behind the history the store keeps.
    Compacted,
    /// The store is shutting down.
    Shutdown,
}

impl Termination {
    pub fn label(self) -> &'static str {
        match self {
            Self::Slow => "slow",
            Self::Compacted => "compacted",
            Self::Shutdown => "shutdown",
        }
    }
}

pub(crate) fn feed_status(err: FeedError) -> Status {
    match err {
        FeedError::Compacted { .. } => Status::out_of_range(err.to_string()),
        FeedError::Ahead { .. } | FeedError::Negative { .. } => {
            Status::invalid_argument(err.to_string())
        }
    }
}

/// Starts a stream of the changes after `after_revision` that `access` may
/// read. Errors that concern the request (a bad or compacted revision) are
/// the RPC's status.
pub(crate) async fn start(
    storage: Arc<dyn Storage>,
    access: Access,
    request: pb::WatchPetsReq,
    options: WatchOptions,
    metrics: Arc<ServerMetrics>,
    stopping: watch::Receiver<bool>,
) -> Result<WatchStream, Status> {
    let after = request.after_revision;
    // "Now" includes every write acknowledged before this call, through
    // any replica.
    storage.catch_up().await?;
    let from = storage.feed().start(after).map_err(feed_status)?;
    let (tx, rx) = mpsc::channel(options.buffer.max(1));
    let ending: Arc<Mutex<Option<Status>>> = Arc::default();
    let watcher = Watcher {
        storage,
        access,
        options,
        metrics,
        tx,
        ending: Arc::clone(&ending),
        delivered: from,
        stopping,
    };
    tokio::spawn(watcher.run(after == 0));
    // After the buffered messages, the status that ended the stream, if the
    // store ended it.
    let last = futures::stream::once(async move {
        ending.lock().unwrap_or_else(PoisonError::into_inner).take()
    })
    .filter_map(|status| async move { status.map(Err) });
    Ok(Box::pin(ReceiverStream::new(rx).chain(last)))
}

struct Watcher {
    storage: Arc<dyn Storage>,
    /// Whose stream it is: it carries only the changes of records this
    /// caller may read. Revisions stay the store's, so a tenant's stream
    /// skips numbers, and its progress messages carry the store's revision.
    access: Access,
    options: WatchOptions,
    metrics: Arc<ServerMetrics>,
    tx: mpsc::Sender<Result<pb::WatchPetsResp, Status>>,
    ending: Arc<Mutex<Option<Status>>>,
    /// The last revision handed to the client's buffer.
    delivered: i64,
    stopping: watch::Receiver<bool>,
}

/// What ended a wait for news.
enum Wake {
    Changed,
    Idle,
    Closed,
    Stopping,
}

/// What sending one message did.
enum Sent {
    Queued,
    /// The client is gone: stop quietly.
    Closed,
    /// The buffer is full.
    Full,
}

impl Watcher {
    async fn run(mut self, progress_first: bool) {
        let _open = self.metrics.watcher_opened();
        let mut revisions = self.storage.feed().subscribe();
        let mut said_anything = false;
        if progress_first {
            match self.progress().await {
                Sent::Queued => said_anything = true,
                Sent::Closed => return,
                Sent::Full => return self.end_slow(),
            }
        }
        loop {
            // Marks the current revision seen before reading, so a change
            // published after the read wakes the wait below.
            revisions.borrow_and_update();
            let batch = match self
                .storage
                .feed()
                .read_after(self.delivered, self.options.batch)
            {
                Ok(batch) => batch,
                Err(err) => {
                    return self.end(Termination::Compacted, feed_status(err));
                }
            };
            if let Some(last) = batch.last().map(|change| change.revision) {
                let changes: Vec<pb::PetChange> = batch
                    .iter()
                    .filter(|change| self.may_see(change))
                    .map(|change| wire::change_to_proto(change))
                    .collect();
                if changes.is_empty() {
                    // None of them is this caller's: passed over in silence
                    // (the next progress message carries the revision), so
                    // another tenant's writes cost this stream no message.
                    self.delivered = last;
                    continue;
                }
                let message = pb::WatchPetsResp {
                    // Everything up to it has been sent: safe to resume from,
                    // even if the store has moved on since.
                    revision: last,
                    changes,
                };
                match self.send(message).await {
                    Sent::Queued => {
                        self.delivered = last;
                        said_anything = true;
                        continue;
                    }
                    Sent::Closed => return,
                    Sent::Full => return self.end_slow(),
                }
            }
            // A resumed stream with nothing new says so at once.
            if !said_anything {
                match self.progress().await {
                    Sent::Queued => said_anything = true,
                    Sent::Closed => return,
                    Sent::Full => return self.end_slow(),
                }
            }
            let woken = tokio::select! {
                changed = revisions.changed() => match changed {
                    Ok(()) => Wake::Changed,
                    // The store is gone (the server is stopping).
                    Err(_) => Wake::Closed,
                },
                () = tokio::time::sleep(self.options.progress_interval) => Wake::Idle,
                () = self.tx.closed() => Wake::Closed,
                // A dropped sender (a service built without a server) is
                // not a shutdown: that branch then just never fires.
                Ok(_) = self.stopping.wait_for(|stopping| *stopping) => Wake::Stopping,
            };
            match woken {
                Wake::Changed => {}
                Wake::Closed => return,
                Wake::Idle => match self.progress().await {
                    Sent::Queued => {}
                    Sent::Closed => return,
                    Sent::Full => return self.end_slow(),
                },
                Wake::Stopping => {
                    let status = Status::unavailable(format!(
                        "the store is shutting down; resume with after_revision {}",
                        self.delivered
                    ));
                    return self.end(Termination::Shutdown, status);
                }
            }
        }
    }

    /// Whether this stream carries `change`: a change of a record its
    /// caller may read (a deletion from history too old to hold the record
    /// only to callers that read everything).
    fn may_see(&self, change: &Change) -> bool {
        match &change.record {
            Some(record) => self.access.may_read(record),
            None => self.access.tenant().is_none(),
        }
    }

    /// A message without changes at the revision delivered so far: the
    /// client has everything up to it.
    async fn progress(&self) -> Sent {
        self.send(pb::WatchPetsResp {
            revision: self.delivered,
            changes: Vec::new(),
        })
        .await
    }

    /// Queues `message`, waiting up to `slow_after` for room.
    async fn send(&self, message: pb::WatchPetsResp) -> Sent {
        let message = match self.tx.try_send(Ok(message)) {
            Ok(()) => return Sent::Queued,
            Err(mpsc::error::TrySendError::Closed(_)) => return Sent::Closed,
            Err(mpsc::error::TrySendError::Full(message)) => message,
        };
        match tokio::time::timeout(self.options.slow_after, self.tx.reserve()).await {
            Ok(Ok(permit)) => {
                permit.send(message);
                Sent::Queued
            }
            Ok(Err(_)) => Sent::Closed,
            Err(_) => Sent::Full,
        }
    }

    fn end_slow(self) {
        let status = Status::resource_exhausted(format!(
            "the client reads too slowly: {} messages waited unread for {:?}; the last revision delivered is {}, resume with after_revision {}",
            self.options.buffer, self.options.slow_after, self.delivered, self.delivered
        ));
        self.end(Termination::Slow, status);
    }

    /// Ends the stream with `status`, after the messages already buffered.
    fn end(self, why: Termination, status: Status) {
        tracing::info!(
            reason = why.label(),
            delivered = self.delivered,
            message = status.message(),
            "watch stream ended by the store"
        );
        self.metrics.watch_terminated(why.label());
        *self.ending.lock().unwrap_or_else(PoisonError::into_inner) = Some(status);
        // Dropping `self.tx` (with `self`) closes the buffer, so the stream
        // yields the status after the last buffered message.
    }
}

/// Keeps `petstore_server_watch_revision` at the feed's revision until the
/// store closes.
pub async fn follow_revision(storage: Arc<dyn Storage>, metrics: Arc<ServerMetrics>) {
    let mut revisions = storage.feed().subscribe();
    drop(storage);
    loop {
        let revision = *revisions.borrow_and_update();
        metrics.set_watch_revision(revision);
        if revisions.changed().await.is_err() {
            return;
        }
    }
}
