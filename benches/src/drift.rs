//! Drift latency: with every Pet converged, records are changed and deleted
//! out of band through the store's gRPC API, as someone with grpcurl would,
//! one call each; each is timed from its call until the operator has put
//! the record back. The bench follows the store's own change feed to see
//! the fixes: an update restoring the record's name, or a new record with
//! the deleted one's key.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use petstore_proto::PetStoreClient;
use petstore_proto::petstore::{self as pb, pet_change::Kind};
use tokio::sync::mpsc;

use crate::store_load::{connect, grpc_error, percentile};
use fixtures::{Error, Result};

/// Out-of-band edits and deletes, and how long each took to be undone.
#[derive(Clone, Debug, Default)]
pub struct DriftResult {
    pub edits: usize,
    pub deletes: usize,
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
    /// From the first change sent to the last: the changes arrived at
    /// (edits + deletes) ÷ this a second.
    pub sending: Duration,
}

impl DriftResult {
    /// Its goal: some changes made, and their p99 put back within
    /// [`GOAL_DRIFT_P99`](crate::report::GOAL_DRIFT_P99).
    pub fn met(&self) -> bool {
        self.edits > 0 && self.p99 <= crate::report::GOAL_DRIFT_P99
    }

    /// `p99 s (p50 …, max …; N renames, N deletes)`, as the report shows it.
    pub fn figures(&self) -> String {
        format!(
            "{:.3} s (p50 {:.3} s, max {:.3} s; {} renames, {} deletes)",
            self.p99.as_secs_f64(),
            self.p50.as_secs_f64(),
            self.max.as_secs_f64(),
            self.edits,
            self.deletes
        )
    }

    /// Changes sent a second while they were being sent.
    pub fn arrival_rate(&self) -> f64 {
        (self.edits + self.deletes) as f64 / self.sending.as_secs_f64().max(1e-9)
    }
}

/// Makes `edits` renames and `deletes` deletions of the keyed records in
/// the store at `addr`, one call each, and waits up to `timeout` for every
/// one to be put back.
pub async fn measure(
    addr: &str,
    edits: usize,
    deletes: usize,
    timeout: Duration,
) -> Result<DriftResult> {
    let mut client = PetStoreClient::new(connect(addr).await?);
    let mut records = Vec::new();
    let mut stream = client
        .search_pets(pb::SearchPetsReq::default())
        .await
        .map_err(grpc_error)?
        .into_inner();
    while let Some(pet) = stream.message().await.map_err(grpc_error)? {
        if !pet.idempotency_key.is_empty() {
            records.push(pet);
        }
    }
    if records.len() < edits + deletes {
        return Err(grpc_error(format!(
            "{} keyed records, fewer than {edits} edits and {deletes} deletes",
            records.len()
        )));
    }

    // Follow the feed from now before changing anything.
    let mut feed = client
        .watch_pets(pb::WatchPetsReq { after_revision: 0 })
        .await
        .map_err(grpc_error)?
        .into_inner();
    let (seen, mut fixes) = mpsc::unbounded_channel::<(pb::PetChange, Instant)>();
    let follower = tokio::spawn(async move {
        while let Ok(Some(message)) = feed.message().await {
            let at = Instant::now();
            for change in message.changes {
                if seen.send((change, at)).is_err() {
                    return;
                }
            }
        }
    });

    // What each fix will look like on the feed, and when its change was
    // sent: the record's name restored (by ID), or a record with the
    // deleted one's key created again.
    let mut renamed: HashMap<String, (String, Instant)> = HashMap::new();
    let mut recreated: HashMap<String, Instant> = HashMap::new();
    let (to_edit, to_delete) = records.split_at(edits);
    let first_sent = Instant::now();
    for (i, record) in to_edit.iter().enumerate() {
        let mut changed = record.clone();
        changed.name = format!("Changed out of band {i}");
        let sent = Instant::now();
        client
            .update_pets(pb::UpdatePetsReq {
                pets: vec![changed],
            })
            .await
            .map_err(grpc_error)?;
        renamed.insert(record.id.clone(), (record.name.clone(), sent));
    }
    for record in &to_delete[..deletes] {
        let sent = Instant::now();
        client
            .delete_pets(pb::DeletePetsReq {
                ids: vec![record.id.clone()],
            })
            .await
            .map_err(grpc_error)?;
        recreated.insert(record.idempotency_key.clone(), sent);
    }

    let sending = first_sent.elapsed();
    let expected = renamed.len() + recreated.len();
    let mut latencies = Vec::with_capacity(expected);
    let deadline = tokio::time::Instant::now() + timeout;
    while latencies.len() < expected {
        let next = tokio::time::timeout_at(deadline, fixes.recv()).await;
        let Ok(Some((change, at))) = next else {
            follower.abort();
            return Err(Error::Timeout(
                timeout,
                format!(
                    "{} of {} out-of-band changes put back",
                    latencies.len(),
                    expected
                ),
            ));
        };
        let Some(pet) = change.pet else { continue };
        let fixed = match Kind::try_from(change.kind) {
            Ok(Kind::Updated) => match renamed.get(&pet.id) {
                Some((name, _)) if *name == pet.name => {
                    renamed.remove(&pet.id).map(|(_, sent)| sent)
                }
                _ => None,
            },
            Ok(Kind::Created) => recreated.remove(&pet.idempotency_key),
            _ => None,
        };
        if let Some(sent) = fixed {
            latencies.push(at.saturating_duration_since(sent));
        }
    }
    follower.abort();
    latencies.sort_unstable();
    Ok(DriftResult {
        edits,
        deletes,
        p50: percentile(&latencies, 0.50),
        p99: percentile(&latencies, 0.99),
        max: latencies.last().copied().unwrap_or_default(),
        sending,
    })
}
