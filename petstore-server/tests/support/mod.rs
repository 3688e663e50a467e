//! What the server's integration tests share: a real server on loopback
//! TCP, the storage backends a suite runs against, and the pets they send.
//! Each test binary uses its own part of it.
#![allow(dead_code, unused_macros)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use petstore_proto::PetStoreClient;
use petstore_proto::google::r#type::Date;
use petstore_proto::petstore::{self as pb, PetType};
use petstore_server::server::ServeOptions;
use petstore_server::service::Observability;
use petstore_server::storage::{PostgresConfig, Storage, StorageConfig};
use tonic::transport::Channel;
use tonic::{Code, Status};

pub mod tokens;

/// Longest wait for the server to drain when a test stops it.
const DRAIN: Duration = Duration::from_secs(10);

/// A server task on 127.0.0.1 and a client connected to it.
pub struct Running {
    pub client: PetStoreClient<Channel>,
    /// The client's connection, for more clients on it.
    pub channel: Channel,
    pub addr: SocketAddr,
    pub observability: Observability,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    server: tokio::task::JoinHandle<()>,
    _dir: Arc<tempfile::TempDir>,
}

impl Running {
    /// Serves `storage` on an ephemeral port until stopped or dropped;
    /// `dir` (where a durable store keeps its file) lives as long.
    pub async fn serve(
        storage: Arc<dyn Storage>,
        dir: Arc<tempfile::TempDir>,
        options: ServeOptions,
    ) -> Running {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let observability = options.observability.clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            petstore_server::server::serve(listener, storage, options, async {
                let _ = stopped.await;
            })
            .await
            .expect("serve");
        });
        let channel = connect(addr).await;
        Running {
            client: PetStoreClient::new(channel.clone()),
            channel,
            addr,
            observability,
            stop: Some(stop),
            server,
            _dir: dir,
        }
    }

    /// A client on a connection of its own, as another process would have.
    pub async fn another_client(&self) -> PetStoreClient<Channel> {
        PetStoreClient::new(connect(self.addr).await)
    }

    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(DRAIN, &mut self.server)
            .await
            .expect("the server drains in time")
            .expect("server task");
    }
}

/// A connection to the server at `addr` (loopback in these tests).
pub async fn connect(addr: impl std::fmt::Display) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect()
        .await
        .expect("connect")
}

/// A fresh, empty database named after `purpose` on the PostgreSQL server
/// this test binary started (a real one, on 127.0.0.1; see fixtures::postgres).
pub fn postgres_config(purpose: &str) -> PostgresConfig {
    let server = fixtures::postgres::shared().expect("start PostgreSQL");
    let url = server.new_database(purpose).expect("create database");
    let mut config: tokio_postgres::Config = url.parse().expect("url");
    let password = std::fs::read_to_string(&server.password_file).expect("password");
    config.password(password.trim_end());
    PostgresConfig {
        config,
        pool_size: 4,
        connect_timeout: Duration::from_secs(10),
    }
}

/// A direct client of `config`'s database, for a test that edits the tables
/// behind the store's back; drop the client, then await the handle, to end
/// the connection.
pub async fn postgres_client(
    config: &PostgresConfig,
) -> (
    tokio_postgres::Client,
    tokio::task::JoinHandle<Result<(), tokio_postgres::Error>>,
) {
    let (client, connection) = config
        .config
        .connect(tokio_postgres::NoTls)
        .await
        .expect("connect");
    (client, tokio::spawn(connection))
}

/// The storage backends a suite runs against.
#[derive(Clone, Copy, Debug)]
pub enum Backend {
    Memory,
    Durable,
    Postgres,
}

impl Backend {
    /// An empty store's configuration: the durable one keeps its file in
    /// `dir`, the PostgreSQL one gets a new database named after `purpose`.
    pub async fn config(self, dir: &tempfile::TempDir, purpose: &'static str) -> StorageConfig {
        match self {
            Backend::Memory => StorageConfig::Memory,
            Backend::Durable => StorageConfig::durable(dir.path().join("pets.redb")),
            Backend::Postgres => StorageConfig::Postgres(Box::new(
                tokio::task::spawn_blocking(move || postgres_config(purpose))
                    .await
                    .expect("postgres config"),
            )),
        }
    }
}

/// Runs each named `async fn(Backend)` as one test per backend, in the
/// modules `memory`, `durable` and `postgres`.
macro_rules! suite {
    ($($case:ident),* $(,)?) => {
        mod memory {
            $( #[tokio::test] async fn $case() { super::$case(super::Backend::Memory).await } )*
        }
        mod durable {
            $( #[tokio::test] async fn $case() { super::$case(super::Backend::Durable).await } )*
        }
        mod postgres {
            $( #[tokio::test] async fn $case() { super::$case(super::Backend::Postgres).await } )*
        }
    };
}

pub fn date(year: i32, month: i32, day: i32) -> Option<Date> {
    Some(Date { year, month, day })
}

pub fn pet(name: &str, kind: PetType, birthday: Option<Date>) -> pb::Pet {
    pb::Pet {
        name: name.into(),
        r#type: kind.into(),
        birthday,
        ..Default::default()
    }
}

/// The book's dog, born 2021-04-01.
pub fn thor() -> pb::Pet {
    pet("Thor", PetType::PtCanine, date(2021, 4, 1))
}

pub fn tron() -> pb::Pet {
    pet("Tron", PetType::PtFeline, date(2020, 6, 25))
}

/// A dog born when Thor was, named `name`, with idempotency key `key`.
pub fn keyed(name: &str, key: &str) -> pb::Pet {
    pb::Pet {
        name: name.into(),
        idempotency_key: key.into(),
        ..thor()
    }
}

/// AddPets, which must succeed; the new IDs in request order.
pub async fn add(client: &mut PetStoreClient<Channel>, pets: Vec<pb::Pet>) -> Vec<String> {
    client
        .add_pets(pb::AddPetsReq { pets })
        .await
        .expect("add")
        .into_inner()
        .ids
}

/// Every pet a SearchPets answers, in the order streamed.
pub async fn searched(
    client: &mut PetStoreClient<Channel>,
    request: impl tonic::IntoRequest<pb::SearchPetsReq>,
) -> Result<Vec<pb::Pet>, Status> {
    let mut stream = client.search_pets(request).await?.into_inner();
    let mut pets = Vec::new();
    while let Some(pet) = stream.message().await? {
        pets.push(pet);
    }
    Ok(pets)
}

/// The call was refused with `code`, its message saying `fragment`.
pub fn assert_status(status: &Status, code: Code, fragment: &str) {
    assert_eq!(status.code(), code, "{status:?}");
    assert!(
        status.message().contains(fragment),
        "{fragment:?} not in {:?}",
        status.message()
    );
}

/// The call was refused with `code`, its message naming `field` first.
pub fn assert_refused(status: &Status, code: Code, field: &str) {
    assert_status(status, code, field);
    assert!(
        status.message().starts_with(field),
        "{field:?} not first in {:?}",
        status.message()
    );
}

/// Every one of `series` (a line of the OpenMetrics text) is in `metrics`.
pub fn assert_metrics(metrics: &str, series: &[impl AsRef<str>]) {
    for series in series.iter().map(AsRef::as_ref) {
        assert!(metrics.contains(series), "no {series} in\n{metrics}");
    }
}
