//! A gRPC load generator for the pet store: throughput and latency per RPC,
//! backend and client concurrency, plus a kill -9 durability check. The same
//! store is also driven by ghz, a standard external load tool built on
//! grpc-go, which (unlike tonic) exposes a missing TCP_NODELAY.

use std::process::Command;
use std::time::{Duration, Instant};

use petstore_proto::PetStoreClient;
use petstore_proto::google::r#type::Date;
use petstore_proto::petstore::{self as pb, PetType};
use tonic::transport::Channel;

use crate::procstat;
use fixtures::forwarder::Forwarder;
use fixtures::postgres::{Postgres, PostgresOptions};
use fixtures::{Error, PetStoreServer, PostgresTarget, Result, Storage, Tools};

/// What serves a benchmark: one store process, or several replicas on one
/// PostgreSQL database behind a round-robin forwarder (as behind a Service).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreSetup {
    Memory,
    Durable,
    Postgres { replicas: usize },
}

impl StoreSetup {
    pub fn label(&self) -> String {
        match self {
            Self::Memory => "Memory".into(),
            Self::Durable => "Durable".into(),
            Self::Postgres { replicas: 1 } => "PostgreSQL, 1 replica".into(),
            Self::Postgres { replicas } => format!("PostgreSQL, {replicas} replicas"),
        }
    }
}

/// The running store(s) of a [`StoreSetup`].
pub struct StoreUnderTest {
    pub setup: StoreSetup,
    pub servers: Vec<PetStoreServer>,
    /// Where clients connect: the store, or the forwarder in front of them.
    pub addr: String,
    _forwarder: Option<Forwarder>,
    database: Option<Postgres>,
}

impl StoreUnderTest {
    pub fn start(dir: &std::path::Path, setup: StoreSetup) -> Result<Self> {
        match setup {
            StoreSetup::Memory | StoreSetup::Durable => {
                let storage = if setup == StoreSetup::Memory {
                    Storage::Memory
                } else {
                    Storage::Durable
                };
                let server = PetStoreServer::start(dir, storage)?;
                Ok(Self {
                    setup,
                    addr: server.addr.clone(),
                    servers: vec![server],
                    _forwarder: None,
                    database: None,
                })
            }
            StoreSetup::Postgres { replicas } => {
                // fsync on: a commit costs what it would in production.
                let database = Postgres::start_with(PostgresOptions { fsync: true })?;
                let target = PostgresTarget {
                    url: database.create_database("petstore")?,
                    password_file: database.password_file.clone(),
                };
                let servers = (0..replicas.max(1))
                    .map(|i| {
                        PetStoreServer::spawn_postgres(dir, &format!("store-{i}"), target.clone())
                    })
                    .collect::<Result<Vec<_>>>()?;
                for server in &servers {
                    server.wait_serving()?;
                }
                let (addr, forwarder) = if servers.len() == 1 {
                    (servers[0].addr.clone(), None)
                } else {
                    let forwarder =
                        Forwarder::start(servers.iter().map(|s| s.addr.clone()).collect())?;
                    (forwarder.addr.clone(), Some(forwarder))
                };
                Ok(Self {
                    setup,
                    servers,
                    addr,
                    _forwarder: forwarder,
                    database: Some(database),
                })
            }
        }
    }

    /// Empties the store.
    pub fn fresh(&mut self) -> Result<()> {
        match &self.database {
            Some(database) => {
                database.psql("petstore", "TRUNCATE petstore_pets")?;
                Ok(())
            }
            None => {
                let storage = self.servers[0].storage();
                self.servers[0].restart_fresh(storage)
            }
        }
    }
}

#[derive(Clone, Debug)]
pub struct LoadResult {
    pub backend: String,
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

pub(crate) fn grpc_error(err: impl std::fmt::Display) -> Error {
    Error::Command {
        command: "grpc".into(),
        status: "error".into(),
        stderr: err.to_string(),
    }
}

pub(crate) async fn connect(addr: &str) -> Result<Channel> {
    Channel::from_shared(format!("http://{addr}"))
        .map_err(grpc_error)?
        .connect()
        .await
        .map_err(grpc_error)
}

pub(crate) fn pet(n: u64) -> pb::Pet {
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

pub(crate) fn percentile(sorted: &[Duration], p: f64) -> Duration {
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

/// Several connections, as several clients would have (HTTP/2 multiplexes
/// the rest), spread over the replicas directly, as a gRPC client with
/// round-robin balancing over a headless Service would.
async fn channels(addrs: &[String], concurrency: usize) -> Result<Vec<Channel>> {
    let mut channels = Vec::new();
    for i in 0..concurrency.clamp(1, 8).max(addrs.len()) {
        channels.push(connect(&addrs[i % addrs.len()]).await?);
    }
    Ok(channels)
}

fn result(
    backend: &str,
    operation: &'static str,
    concurrency: usize,
    (calls, pets, seconds, latencies): (u64, u64, f64, Vec<Duration>),
) -> LoadResult {
    LoadResult {
        backend: backend.to_owned(),
        operation,
        concurrency,
        calls,
        pets,
        seconds,
        p50: percentile(&latencies, 0.50),
        p99: percentile(&latencies, 0.99),
    }
}

/// One ghz run.
#[derive(Clone, Debug)]
pub struct GhzResult {
    pub backend: String,
    pub operation: &'static str,
    pub concurrency: usize,
    pub connections: usize,
    pub calls: u64,
    pub calls_per_second: f64,
    pub p50: Duration,
    pub p99: Duration,
    /// Calls that did not end OK, beyond those ghz itself cut off when the
    /// time was up (it cancels the calls in flight: at most one per worker,
    /// reported as Canceled or Unavailable).
    pub errors: u64,
}

/// Runs `ghz` (reflection, plaintext) for `duration` and reads its JSON report.
#[allow(clippy::too_many_arguments)]
pub fn ghz(
    backend: &str,
    operation: &'static str,
    addr: &str,
    call: &str,
    data: &str,
    concurrency: usize,
    connections: usize,
    duration: Duration,
) -> Result<GhzResult> {
    let run = || {
        fixtures::run(
            Command::new(Tools::get()?.bin("ghz"))
                .args(["--insecure", "--call", call, "-d", data])
                .args(["-c", &concurrency.to_string()])
                .args(["--connections", &connections.to_string()])
                .args(["-z", &format!("{}ms", duration.as_millis())])
                .args(["-O", "json", addr]),
        )
    };
    // ghz's duration ticker can close its channel while a worker still
    // sends on it, and then panics at the end of a run ("send on closed
    // channel"): its race, not the store's. Such a run is run again.
    let mut out = run();
    for _ in 0..2 {
        match &out {
            Err(Error::Command { stderr, .. }) if stderr.contains("send on closed channel") => {
                out = run();
            }
            _ => break,
        }
    }
    let out = out?;
    let report: serde_json::Value = serde_json::from_str(&out).map_err(|e| Error::Command {
        command: format!("ghz {call}"),
        status: "unparsable output".into(),
        stderr: format!("{e}: {out}"),
    })?;
    let latency = |p: u64| {
        report["latencyDistribution"]
            .as_array()
            .and_then(|l| l.iter().find(|e| e["percentage"].as_u64() == Some(p)))
            .and_then(|e| e["latency"].as_u64())
            .map(Duration::from_nanos)
            .unwrap_or_default()
    };
    let calls = report["count"].as_u64().unwrap_or(0);
    let codes = &report["statusCodeDistribution"];
    let ok = codes["OK"].as_u64().unwrap_or(0);
    let cut_off = (codes["Canceled"].as_u64().unwrap_or(0)
        + codes["Unavailable"].as_u64().unwrap_or(0))
    .min(concurrency as u64);
    Ok(GhzResult {
        backend: backend.to_owned(),
        operation,
        concurrency,
        connections,
        calls,
        calls_per_second: report["rps"].as_f64().unwrap_or(0.0),
        p50: latency(50),
        p99: latency(99),
        errors: calls.saturating_sub(ok).saturating_sub(cut_off),
    })
}

/// The ghz cell that measures ghz itself rather than the store.
pub const CEILING_OPERATION: &str = "Health/Check, no storage (ghz's ceiling)";

/// The ghz cells: AddPets (1 pet per call), GetPets of one ID, SearchPets by
/// one name (one match), each at every concurrency. `known_id` must exist.
pub fn measure_ghz(
    store: &StoreUnderTest,
    concurrencies: &[usize],
    cell: Duration,
    known_id: &str,
) -> Result<Vec<GhzResult>> {
    let label = store.setup.label();
    // One connection per replica, so a forwarder spreads them.
    let connections = store.servers.len();
    let add = r#"{"pets":[{"name":"Ghz {{.RequestNumber}}","type":"PTBird","birthday":{"year":2020,"month":1,"day":1}}]}"#;
    let get = format!(r#"{{"ids":["{known_id}"]}}"#);
    let search = r#"{"names":["Load 7"]}"#;
    let mut results = Vec::new();
    for (operation, call, data) in [
        ("AddPets, 1 pet per call", "petstore.PetStore/AddPets", add),
        ("GetPets, 1 ID", "petstore.PetStore/GetPets", get.as_str()),
        (
            "SearchPets by name, 1 match",
            "petstore.PetStore/SearchPets",
            search,
        ),
        // Touches no storage: the most ghz can drive on this machine, since
        // ghz shares the cores with the store.
        (CEILING_OPERATION, "grpc.health.v1.Health/Check", "{}"),
    ] {
        for &c in concurrencies {
            results.push(ghz(
                &label,
                operation,
                &store.addr,
                call,
                data,
                c,
                connections.min(c),
                cell,
            )?);
        }
    }
    Ok(results)
}

async fn load(addrs: &[String], records: u64, concurrency: usize) -> Result<Vec<String>> {
    let chans = channels(addrs, concurrency).await?;
    let batches = records.div_ceil(1000);
    let next = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut workers = Vec::new();
    for w in 0..concurrency.max(1) {
        let mut client = PetStoreClient::new(chans[w % chans.len()].clone());
        let next = std::sync::Arc::clone(&next);
        workers.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            loop {
                let batch = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if batch >= batches {
                    return Ok::<_, tonic::Status>(ids);
                }
                let pets = (batch * 1000..((batch + 1) * 1000).min(records))
                    .map(pet)
                    .collect();
                ids.extend(
                    client
                        .add_pets(pb::AddPetsReq { pets })
                        .await?
                        .into_inner()
                        .ids,
                );
            }
        }));
    }
    let mut ids = Vec::new();
    for worker in workers {
        ids.extend(worker.await.map_err(grpc_error)?.map_err(grpc_error)?);
    }
    Ok(ids)
}

/// Every cell for one setup: the Rust client's, then ghz's. `search_records`
/// pets are loaded before the get and search cells.
pub fn measure_backend(
    rt: &tokio::runtime::Runtime,
    dir: &std::path::Path,
    setup: StoreSetup,
    concurrencies: &[usize],
    cell: Duration,
    search_records: u64,
) -> Result<(Vec<LoadResult>, Option<DurabilityCheck>, Vec<GhzResult>)> {
    let mut store = StoreUnderTest::start(dir, setup)?;
    let label = setup.label();
    let label = label.as_str();
    let mut results = Vec::new();
    let addrs: Vec<String> = store.servers.iter().map(|s| s.addr.clone()).collect();
    let mut acknowledged = 0;
    rt.block_on(async {
        for (operation, batch) in [
            ("AddPets, 1 pet per call", 1),
            ("AddPets, 100 pets per call", 100),
        ] {
            for &c in concurrencies {
                let chans = channels(&addrs, c).await?;
                let cell_result = drive(&chans, c, cell, move |mut client, n| async move {
                    let pets = (0..batch).map(|i| pet(n * batch + i)).collect();
                    let resp = client.add_pets(pb::AddPetsReq { pets }).await?;
                    Ok(resp.into_inner().ids.len() as u64)
                })
                .await?;
                acknowledged += cell_result.1;
                results.push(result(label, operation, c, cell_result));
            }
        }
        Ok::<_, Error>(())
    })?;

    // Every acknowledged pet must survive kill -9 of a durable store.
    let durability = if setup == StoreSetup::Durable {
        store.servers[0].kill();
        store.servers[0].restart(Storage::Durable)?;
        let found = rt.block_on(count_named(&store.addr, ""))? as u64;
        Some(DurabilityCheck {
            acknowledged,
            found_after_kill: found,
        })
    } else {
        None
    };

    // A store of exactly `search_records` pets for lookups and searches.
    store.fresh()?;
    let ids = rt.block_on(load(&addrs, search_records, 1))?;
    rt.block_on(async {
        let ids = std::sync::Arc::new(ids.clone());
        for &c in concurrencies {
            let chans = channels(&addrs, c).await?;
            let ids = std::sync::Arc::clone(&ids);
            let cell_result = drive(&chans, c, cell, move |mut client, n| {
                let id = ids[(n.wrapping_mul(2_654_435_761) % ids.len() as u64) as usize].clone();
                async move {
                    let resp = client
                        .get_pets(pb::GetPetsReq {
                            ids: vec![id],
                            ..Default::default()
                        })
                        .await?;
                    Ok(resp.into_inner().pets.len() as u64)
                }
            })
            .await?;
            results.push(result(label, "GetPets by ID", c, cell_result));
        }
        for &c in concurrencies {
            let chans = channels(&addrs, c).await?;
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
                label,
                "SearchPets, all records streamed",
                c,
                cell_result,
            ));
        }
        Ok::<_, Error>(())
    })?;
    let known = ids.first().cloned().unwrap_or_default();
    let ghz = measure_ghz(&store, concurrencies, cell, &known)?;
    Ok((results, durability, ghz))
}

/// A store of `records` pets: search by name, a full stream, and (durable)
/// the time to open the file.
#[derive(Clone, Debug)]
pub struct ScaleResult {
    pub backend: String,
    pub records: u64,
    pub load_seconds: f64,
    pub name_searches: usize,
    pub name_p50: Duration,
    pub name_p99: Duration,
    pub stream_seconds: f64,
    pub streamed: u64,
    /// Server RSS just before the full stream, and its largest growth while
    /// the stream ran (sampled every 10 ms).
    pub rss_before_kib: u64,
    pub rss_growth_kib: u64,
    /// The durable store's own measure of opening its file (its log's
    /// `open_ms`), after a `kill -9`.
    pub open: Option<Duration>,
    pub file_bytes: Option<u64>,
}

/// The last `open_ms=` the store logged.
fn logged_open(server: &PetStoreServer) -> Option<Duration> {
    let raw = std::fs::read_to_string(server.process().log_path()).ok()?;
    // The text log may carry ANSI colours between a field and its value.
    let mut log = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            log.push(c);
        }
    }
    let line = log.lines().rev().find(|l| l.contains("storage open"))?;
    let value = line.split("open_ms=").nth(1)?.split_whitespace().next()?;
    value
        .parse::<f64>()
        .ok()
        .map(|ms| Duration::from_secs_f64(ms / 1000.0))
}

pub fn measure_scale(
    rt: &tokio::runtime::Runtime,
    dir: &std::path::Path,
    setup: StoreSetup,
    records: u64,
    progress: &dyn Fn(&str),
) -> Result<ScaleResult> {
    let mut store = StoreUnderTest::start(dir, setup)?;
    let addrs: Vec<String> = store.servers.iter().map(|s| s.addr.clone()).collect();
    progress(&format!("{}: loading {records} pets", setup.label()));
    let started = Instant::now();
    rt.block_on(load(&addrs, records, 4))?;
    let load_seconds = started.elapsed().as_secs_f64();

    let open = if setup == StoreSetup::Durable {
        store.servers[0].kill();
        store.servers[0].restart(Storage::Durable)?;
        logged_open(&store.servers[0])
    } else {
        None
    };
    let file_bytes = (setup == StoreSetup::Durable)
        .then(|| {
            std::fs::metadata(dir.join("petstore.redb"))
                .ok()
                .map(|m| m.len())
        })
        .flatten();

    progress(&format!("{}: searching by name", setup.label()));
    let searches = 2000;
    let (name_p50, name_p99) = rt.block_on(async {
        let mut client = PetStoreClient::new(connect(&store.addr).await?);
        let mut latencies = Vec::with_capacity(searches);
        for i in 0..searches as u64 {
            let name = format!("Load {}", i.wrapping_mul(2_654_435_761) % records);
            let began = Instant::now();
            let mut stream = client
                .search_pets(pb::SearchPetsReq {
                    names: vec![name],
                    ..Default::default()
                })
                .await
                .map_err(grpc_error)?
                .into_inner();
            let mut found = 0;
            while stream.message().await.map_err(grpc_error)?.is_some() {
                found += 1;
            }
            latencies.push(began.elapsed());
            if found != 1 {
                return Err(grpc_error(format!(
                    "a name search found {found} pets, not 1"
                )));
            }
        }
        latencies.sort_unstable();
        Ok::<_, Error>((percentile(&latencies, 0.5), percentile(&latencies, 0.99)))
    })?;

    progress(&format!("{}: streaming every pet", setup.label()));
    let pid = store.servers[0].process().pid().unwrap_or_default();
    let rss_before_kib = procstat::rss_kib(pid).unwrap_or(0);
    let peak_rss = procstat::PeakRss::start(pid);
    let started = Instant::now();
    let streamed = rt.block_on(count_named(&store.addr, ""));
    let stream_seconds = started.elapsed().as_secs_f64();
    let peak = peak_rss.stop();
    let streamed = streamed? as u64;
    let _ = store.fresh();
    Ok(ScaleResult {
        backend: setup.label(),
        records,
        load_seconds,
        name_searches: searches,
        name_p50,
        name_p99,
        stream_seconds,
        streamed,
        rss_before_kib,
        rss_growth_kib: peak.saturating_sub(rss_before_kib),
        open,
        file_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::percentile;
    use std::time::Duration;

    #[test]
    fn a_percentile_is_the_nearest_rank_of_the_sorted_samples() {
        let ms = Duration::from_millis;
        let samples: Vec<Duration> = (1..=100).map(ms).collect();
        assert_eq!(percentile(&samples, 0.0), ms(1));
        assert_eq!(percentile(&samples, 0.99), ms(99));
        assert_eq!(percentile(&samples, 1.0), ms(100), "the last, not past it");
        // The middle of an even count rounds up.
        assert_eq!(percentile(&samples, 0.5), ms(51));
        // A p99 of fewer than 100 samples is the slowest but rounded: of
        // 10, the tenth.
        let ten: Vec<Duration> = (1..=10).map(ms).collect();
        assert_eq!(percentile(&ten, 0.99), ms(10));
        assert_eq!(percentile(&ten, 0.5), ms(6));
        assert_eq!(percentile(&[ms(7)], 0.99), ms(7));
        assert_eq!(percentile(&[], 0.99), Duration::ZERO, "no sample");
    }
}
