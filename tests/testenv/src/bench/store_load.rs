//! A gRPC load generator for the pet store: throughput and latency per RPC,
//! backend and client concurrency, plus a kill -9 durability check.

use std::time::{Duration, Instant};

use petstore_proto::PetStoreClient;
use petstore_proto::google::r#type::Date;
use petstore_proto::petstore::{self as pb, PetType};
use tonic::transport::Channel;

use crate::{Error, PetStoreServer, Result, Storage};

#[derive(Clone, Debug)]
pub struct LoadResult {
    pub backend: Storage,
    pub operation: &'static str,
    pub concurrency: usize,
    pub calls: u64,
    pub pets: u64,
    pub seconds: f64,
    pub p50: Duration,
    pub p99: Duration,
}

impl LoadResult {
    pub fn calls_per_second(&self) -> f64 {
        self.calls as f64 / self.seconds
    }
    pub fn pets_per_second(&self) -> f64 {
        self.pets as f64 / self.seconds
    }
}

#[derive(Clone, Debug)]
pub struct DurabilityCheck {
    pub acknowledged: u64,
    pub found_after_kill: u64,
}

fn grpc_error(err: impl std::fmt::Display) -> Error {
    Error::Command {
        command: "grpc".into(),
        status: "error".into(),
        stderr: err.to_string(),
    }
}

async fn connect(addr: &str) -> Result<Channel> {
    Channel::from_shared(format!("http://{addr}"))
        .map_err(grpc_error)?
        .connect()
        .await
        .map_err(grpc_error)
}

fn pet(n: u64) -> pb::Pet {
    pb::Pet {
        name: format!("Load {n}"),
        r#type: PetType::PtBird.into(),
        birthday: Some(Date {
            year: 2020,
            month: 1 + (n % 12) as i32,
            day: 1 + (n % 28) as i32,
        }),
        ..Default::default()
    }
}

/// Streams every pet and counts those whose name starts with `prefix`.
pub async fn count_named(addr: &str, prefix: &str) -> Result<usize> {
    let mut client =
        PetStoreClient::new(connect(addr).await?).max_decoding_message_size(petstore_max_message());
    let mut stream = client
        .search_pets(pb::SearchPetsReq::default())
        .await
        .map_err(grpc_error)?
        .into_inner();
    let mut count = 0;
    while let Some(pet) = stream.message().await.map_err(grpc_error)? {
        if pet.name.starts_with(prefix) {
            count += 1;
        }
    }
    Ok(count)
}

fn petstore_max_message() -> usize {
    4 * 1024 * 1024
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index]
}

/// Runs `concurrency` workers for `duration`, each repeating `call`, which
/// returns how many pets it handled.
async fn drive<F, Fut>(
    channels: &[Channel],
    concurrency: usize,
    duration: Duration,
    call: F,
) -> Result<(u64, u64, f64, Vec<Duration>)>
where
    F: Fn(PetStoreClient<Channel>, u64) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = std::result::Result<u64, tonic::Status>> + Send,
{
    let started = Instant::now();
    let deadline = started + duration;
    let mut workers = Vec::new();
    for worker in 0..concurrency {
        let client = PetStoreClient::new(channels[worker % channels.len()].clone());
        let call = call.clone();
        workers.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut pets = 0;
            let mut n = worker as u64 * 1_000_000_000;
            while Instant::now() < deadline {
                let began = Instant::now();
                pets += call(client.clone(), n).await?;
                latencies.push(began.elapsed());
                n += 1;
            }
            Ok::<_, tonic::Status>((pets, latencies))
        }));
    }
    let mut latencies = Vec::new();
    let mut pets = 0;
    for worker in workers {
        let (p, l) = worker.await.map_err(grpc_error)?.map_err(grpc_error)?;
        pets += p;
        latencies.extend(l);
    }
    let seconds = started.elapsed().as_secs_f64();
    latencies.sort_unstable();
    Ok((latencies.len() as u64, pets, seconds, latencies))
}

async fn channels(addr: &str, concurrency: usize) -> Result<Vec<Channel>> {
    // Several connections, as several clients would have; HTTP/2 multiplexes
    // the rest.
    let mut channels = Vec::new();
    for _ in 0..concurrency.clamp(1, 8) {
        channels.push(connect(addr).await?);
    }
    Ok(channels)
}

fn result(
    backend: Storage,
    operation: &'static str,
    concurrency: usize,
    (calls, pets, seconds, latencies): (u64, u64, f64, Vec<Duration>),
) -> LoadResult {
    LoadResult {
        backend,
        operation,
        concurrency,
        calls,
        pets,
        seconds,
        p50: percentile(&latencies, 0.50),
        p99: percentile(&latencies, 0.99),
    }
}

/// Every cell for one backend. `search_records` pets are loaded before the
/// get and search cells.
pub fn measure_backend(
    rt: &tokio::runtime::Runtime,
    dir: &std::path::Path,
    backend: Storage,
    concurrencies: &[usize],
    cell: Duration,
    search_records: u64,
) -> Result<(Vec<LoadResult>, Option<DurabilityCheck>)> {
    let mut server = PetStoreServer::start(dir, backend)?;
    let mut results = Vec::new();
    let addr = server.addr.clone();
    let mut acknowledged = 0;
    rt.block_on(async {
        for &c in concurrencies {
            let chans = channels(&addr, c).await?;
            let cell_result = drive(&chans, c, cell, |mut client, n| async move {
                let resp = client
                    .add_pets(pb::AddPetsReq { pets: vec![pet(n)] })
                    .await?;
                Ok(resp.into_inner().ids.len() as u64)
            })
            .await?;
            acknowledged += cell_result.1;
            results.push(result(backend, "AddPets, 1 pet per call", c, cell_result));
        }
        for &c in concurrencies {
            let chans = channels(&addr, c).await?;
            let cell_result = drive(&chans, c, cell, |mut client, n| async move {
                let pets = (0..100).map(|i| pet(n * 100 + i)).collect();
                let resp = client.add_pets(pb::AddPetsReq { pets }).await?;
                Ok(resp.into_inner().ids.len() as u64)
            })
            .await?;
            acknowledged += cell_result.1;
            results.push(result(
                backend,
                "AddPets, 100 pets per call",
                c,
                cell_result,
            ));
        }
        Ok::<_, Error>(())
    })?;

    // Every acknowledged pet must survive kill -9 of a durable store.
    let durability = if backend == Storage::Durable {
        server.kill();
        server.restart(Storage::Durable)?;
        let found = rt.block_on(count_named(&addr, ""))? as u64;
        Some(DurabilityCheck {
            acknowledged,
            found_after_kill: found,
        })
    } else {
        None
    };

    // A store of exactly `search_records` pets for lookups and searches.
    server.restart_fresh(backend)?;
    rt.block_on(async {
        let mut client = PetStoreClient::new(connect(&addr).await?);
        let mut ids = Vec::new();
        let mut n = 0;
        while (ids.len() as u64) < search_records {
            let batch = (search_records - ids.len() as u64).min(1000);
            let pets = (0..batch).map(|_| {
                n += 1;
                pet(n)
            });
            let resp = client
                .add_pets(pb::AddPetsReq {
                    pets: pets.collect(),
                })
                .await
                .map_err(grpc_error)?;
            ids.extend(resp.into_inner().ids);
        }
        let ids = std::sync::Arc::new(ids);
        for &c in concurrencies {
            let chans = channels(&addr, c).await?;
            let ids = std::sync::Arc::clone(&ids);
            let cell_result = drive(&chans, c, cell, move |mut client, n| {
                let id = ids[(n.wrapping_mul(2_654_435_761) % ids.len() as u64) as usize].clone();
                async move {
                    let resp = client
                        .get_pets(pb::GetPetsReq {
                            ids: vec![id],
                            idempotency_keys: vec![],
                        })
                        .await?;
                    Ok(resp.into_inner().pets.len() as u64)
                }
            })
            .await?;
            results.push(result(backend, "GetPets by ID", c, cell_result));
        }
        for &c in concurrencies {
            let chans = channels(&addr, c).await?;
            let cell_result = drive(&chans, c, cell, |mut client, _| async move {
                let mut stream = client
                    .search_pets(pb::SearchPetsReq::default())
                    .await?
                    .into_inner();
                let mut pets = 0;
                while stream.message().await?.is_some() {
                    pets += 1;
                }
                Ok(pets)
            })
            .await?;
            results.push(result(
                backend,
                "SearchPets, all records streamed",
                c,
                cell_result,
            ));
        }
        Ok::<_, Error>(())
    })?;
    Ok((results, durability))
}
