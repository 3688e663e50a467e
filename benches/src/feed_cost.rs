//! What the change feed costs the store: its CPU and peak memory during a
//! burst of creates (one `AddPets` call per record, as the operator sends a
//! lone create), with 0, 1, 10 and 100 clients following `WatchPets`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use petstore_proto::PetStoreClient;
use petstore_proto::petstore as pb;

use crate::procstat;
use crate::store_load::{StoreSetup, StoreUnderTest, connect, grpc_error, pet};
use fixtures::{Error, Result};

/// Clients creating at once.
pub const CREATORS: usize = 16;

/// One burst with `watchers` clients following the feed.
#[derive(Clone, Debug, Default)]
pub struct FeedCost {
    pub watchers: usize,
    pub creates: u64,
    /// From the first create until every watcher has received every one.
    pub seconds: f64,
    pub store_cpu_seconds: f64,
    pub store_rss_before_kib: u64,
    pub store_peak_rss_kib: u64,
    /// Changes received, over all watchers: `creates` × `watchers`.
    pub delivered: u64,
}

/// A fresh durable store for each count of watchers, in a directory of its
/// own under `dir`.
pub fn measure(
    rt: &tokio::runtime::Runtime,
    dir: &std::path::Path,
    creates: u64,
    watcher_counts: &[usize],
) -> Result<Vec<FeedCost>> {
    watcher_counts
        .iter()
        .map(|&watchers| {
            let dir = dir.join(format!("watchers-{watchers}"));
            std::fs::create_dir_all(&dir).map_err(fixtures::io("creating a directory"))?;
            let mut store = StoreUnderTest::start(&dir, StoreSetup::Durable)?;
            let pid = store.servers[0].process().pid().unwrap_or(0);
            let cost = rt.block_on(burst(&store.addr, pid, creates, watchers));
            let _ = store.fresh();
            cost
        })
        .collect()
}

async fn burst(addr: &str, pid: u32, creates: u64, watchers: usize) -> Result<FeedCost> {
    // Every watcher is following (has its first, progress, message) before
    // the burst begins.
    let delivered = Arc::new(AtomicU64::new(0));
    let mut followers = Vec::new();
    for _ in 0..watchers {
        let mut client = PetStoreClient::new(connect(addr).await?);
        let mut feed = client
            .watch_pets(pb::WatchPetsReq { after_revision: 0 })
            .await
            .map_err(grpc_error)?
            .into_inner();
        feed.message().await.map_err(grpc_error)?;
        let delivered = Arc::clone(&delivered);
        followers.push(tokio::spawn(async move {
            let mut seen = 0;
            while seen < creates {
                match feed.message().await? {
                    Some(message) => {
                        let n = message.changes.len() as u64;
                        seen += n;
                        delivered.fetch_add(n, Ordering::Relaxed);
                    }
                    None => {
                        return Err(tonic::Status::unavailable(format!(
                            "the feed ended after {seen} of {creates} changes"
                        )));
                    }
                }
            }
            Ok(())
        }));
    }

    let rss_before = procstat::rss_kib(pid).unwrap_or(0);
    let peak_rss = procstat::PeakRss::start(pid);
    let cpu_before = procstat::cpu_seconds(pid).unwrap_or(0.0);
    let started = Instant::now();
    let channel = connect(addr).await?;
    let next = Arc::new(AtomicU64::new(0));
    let mut creators = Vec::new();
    for _ in 0..CREATORS {
        let mut client = PetStoreClient::new(channel.clone());
        let next = Arc::clone(&next);
        creators.push(tokio::spawn(async move {
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= creates {
                    return Ok::<_, tonic::Status>(());
                }
                client
                    .add_pets(pb::AddPetsReq { pets: vec![pet(n)] })
                    .await?;
            }
        }));
    }
    let mut outcome = Ok(());
    for task in creators.into_iter().chain(followers) {
        let result = match task.await {
            Ok(result) => result.map_err(grpc_error),
            Err(err) => Err(grpc_error(err)),
        };
        if outcome.is_ok() {
            outcome = result;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let cpu = procstat::cpu_seconds(pid).unwrap_or(0.0) - cpu_before;
    let peak = peak_rss.stop();
    outcome?;
    let delivered = delivered.load(Ordering::Relaxed);
    if delivered != creates * watchers as u64 {
        return Err(Error::Command {
            command: "WatchPets".into(),
            status: "incomplete".into(),
            stderr: format!(
                "{watchers} watchers received {delivered} changes of {creates} creates"
            ),
        });
    }
    Ok(FeedCost {
        watchers,
        creates,
        seconds,
        store_cpu_seconds: cpu,
        store_rss_before_kib: rss_before,
        store_peak_rss_kib: peak,
        delivered,
    })
}
