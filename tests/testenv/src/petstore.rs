//! The project's own binaries, run as processes: the pet store and the
//! operator.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::{Error, Process, Result, Tools, cargo_bin, free_port, run, wait_for};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Storage {
    Durable,
    Memory,
    /// PostgreSQL; the server is started with [`PetStoreServer::spawn_postgres`].
    Postgres,
}

/// Where a `--storage postgres` store finds its database.
#[derive(Clone, Debug)]
pub struct PostgresTarget {
    pub url: String,
    pub password_file: PathBuf,
}

/// TLS for the store: its serving certificate, the CA that clients must
/// present certificates from (mutual TLS), and a client certificate that
/// grpcurl uses.
#[derive(Clone, Debug)]
pub struct StoreTls {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

pub struct PetStoreServer {
    process: Process,
    pub addr: String,
    storage: Storage,
    data_file: PathBuf,
    log: PathBuf,
    tls: Option<StoreTls>,
    postgres: Option<PostgresTarget>,
}

impl PetStoreServer {
    /// Starts a `--storage postgres` replica named `name` on a free port
    /// without waiting for it (so several can start together); call
    /// [`PetStoreServer::wait_serving`].
    pub fn spawn_postgres(dir: &Path, name: &str, target: PostgresTarget) -> Result<Self> {
        let addr = format!("127.0.0.1:{}", free_port()?);
        let data_file = dir.join(format!("{name}.unused"));
        let log = dir.join(format!("{name}.log"));
        let process = Self::spawn_with(
            &addr,
            Storage::Postgres,
            &data_file,
            &log,
            None,
            Some(&target),
        )?;
        Ok(Self {
            process,
            addr,
            storage: Storage::Postgres,
            data_file,
            log,
            tls: None,
            postgres: Some(target),
        })
    }

    /// Starts the store on a free port, keeping its data (if durable) and
    /// log in `dir`.
    pub fn start(dir: &Path, storage: Storage) -> Result<Self> {
        Self::start_with(dir, storage, None)
    }

    /// Like [`PetStoreServer::start`], serving mutual TLS when `tls` is set.
    pub fn start_with(dir: &Path, storage: Storage, tls: Option<StoreTls>) -> Result<Self> {
        let addr = format!("127.0.0.1:{}", free_port()?);
        let data_file = dir.join("petstore.redb");
        let log = dir.join("petstore.log");
        let process = Self::spawn(&addr, storage, &data_file, &log, tls.as_ref())?;
        let server = Self {
            process,
            addr,
            storage,
            data_file,
            log,
            tls,
            postgres: None,
        };
        server.wait_serving()?;
        Ok(server)
    }

    fn spawn(
        addr: &str,
        storage: Storage,
        data_file: &Path,
        log: &Path,
        tls: Option<&StoreTls>,
    ) -> Result<Process> {
        Self::spawn_with(addr, storage, data_file, log, tls, None)
    }

    fn spawn_with(
        addr: &str,
        storage: Storage,
        data_file: &Path,
        log: &Path,
        tls: Option<&StoreTls>,
        postgres: Option<&PostgresTarget>,
    ) -> Result<Process> {
        let mut command = Command::new(cargo_bin("petstore-server"));
        command
            .args(["--listen", addr, "--storage"])
            .arg(match storage {
                Storage::Durable => "durable",
                Storage::Memory => "memory",
                Storage::Postgres => "postgres",
            })
            .arg("--data-file")
            .arg(data_file);
        if let Some(target) = postgres {
            // The password comes from a file, never the command line.
            command
                .env("PETSTORE_POSTGRES_URL", &target.url)
                .env("PETSTORE_POSTGRES_PASSWORD_FILE", &target.password_file);
        }
        if let Some(tls) = tls {
            command
                .arg("--tls-cert")
                .arg(&tls.cert)
                .arg("--tls-key")
                .arg(&tls.key)
                .arg("--tls-client-ca")
                .arg(&tls.ca);
        }
        Process::spawn("petstore-server", command, log)
    }

    pub fn wait_serving(&self) -> Result<()> {
        wait_for(Duration::from_secs(30), "pet store health SERVING", || {
            self.grpcurl("grpc.health.v1.Health/Check", "{}")
                .ok()
                .filter(|out| out.first().is_some_and(|v| v["status"] == "SERVING"))
                .map(drop)
        })
    }

    /// SIGKILL the store (like `kill -9`).
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Starts the store again on the same address, with `storage`.
    pub fn restart(&mut self, storage: Storage) -> Result<()> {
        self.process.kill();
        self.storage = storage;
        self.process = Self::spawn_with(
            &self.addr,
            storage,
            &self.data_file,
            &self.log,
            self.tls.as_ref(),
            self.postgres.as_ref(),
        )?;
        self.wait_serving()
    }

    /// Restarts with `storage` and an empty data file, like a new volume.
    pub fn restart_fresh(&mut self, storage: Storage) -> Result<()> {
        self.process.kill();
        if self.data_file.exists() {
            std::fs::remove_file(&self.data_file).map_err(crate::io("removing the data file"))?;
        }
        self.restart(storage)
    }

    pub fn storage(&self) -> Storage {
        self.storage
    }

    /// `grpcurl -plaintext <addr> <method>` with `data` as the request.
    /// Returns every message the call printed.
    pub fn grpcurl(&self, method: &str, data: &str) -> Result<Vec<Value>> {
        match &self.tls {
            None => grpcurl(&self.addr, method, data),
            Some(tls) => grpcurl_with(
                &[
                    "-cacert".as_ref(),
                    tls.ca.as_os_str(),
                    "-cert".as_ref(),
                    tls.client_cert.as_os_str(),
                    "-key".as_ref(),
                    tls.client_key.as_os_str(),
                ],
                &self.addr,
                method,
                data,
            ),
        }
    }

    /// Every pet in the store, via SearchPets with an empty filter.
    pub fn all_pets(&self) -> Result<Vec<Value>> {
        self.grpcurl("petstore.PetStore/SearchPets", "{}")
    }

    pub fn process(&self) -> &Process {
        &self.process
    }
}

/// `grpcurl -plaintext -d <data> <addr> <method>`, parsed as a stream of JSON
/// messages.
pub fn grpcurl(addr: &str, method: &str, data: &str) -> Result<Vec<Value>> {
    grpcurl_with(&["-plaintext".as_ref()], addr, method, data)
}

/// grpcurl with connection flags such as `-plaintext` or `-cacert FILE`.
pub fn grpcurl_with(
    flags: &[&std::ffi::OsStr],
    addr: &str,
    method: &str,
    data: &str,
) -> Result<Vec<Value>> {
    let out = run(Command::new(Tools::get()?.bin("grpcurl"))
        .args(flags)
        .args(["-max-time", "10", "-d", data, addr, method]))?;
    serde_json::Deserializer::from_str(&out)
        .into_iter::<Value>()
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Error::Command {
            command: format!("grpcurl {method}"),
            status: "unparsable output".into(),
            stderr: format!("{e}: {out}"),
        })
}

#[derive(Clone, Debug)]
pub struct OperatorOptions {
    /// Kubeconfig the operator authenticates with.
    pub kubeconfig: PathBuf,
    pub store_addr: String,
    pub leader_election: bool,
    pub lease_namespace: String,
    pub identity: String,
    pub poll_interval: &'static str,
    pub backoff_max: &'static str,
    pub fault: Option<&'static str>,
    /// RUST_LOG for the operator.
    pub log_filter: &'static str,
    /// Further flags, such as the TLS ones.
    pub extra_args: Vec<std::ffi::OsString>,
}

pub struct Operator {
    process: Process,
    pub metrics_addr: String,
}

impl Operator {
    pub fn start(options: &OperatorOptions, log: &Path) -> Result<Self> {
        let metrics_addr = format!("127.0.0.1:{}", free_port()?);
        // Faults exist only in the tests' own build of the operator.
        let binary = match options.fault {
            Some(_) => "petstore-operator-faults",
            None => "petstore-operator",
        };
        let mut command = Command::new(cargo_bin(binary));
        command
            .env("KUBECONFIG", &options.kubeconfig)
            .env("RUST_LOG", options.log_filter)
            .args(["--petstore-addr", &options.store_addr])
            .args(["--metrics-addr", &metrics_addr])
            .args(["--poll-interval", options.poll_interval])
            .args([
                "--backoff-base",
                "200ms",
                "--backoff-max",
                options.backoff_max,
            ])
            .args(["--petstore-timeout", "2s"])
            .args(["--lease-namespace", &options.lease_namespace])
            .args(["--lease-duration", "4s"])
            .args(["--identity", &options.identity])
            .arg(format!("--leader-election={}", options.leader_election));
        command.args(&options.extra_args);
        if let Some(fault) = options.fault {
            command.args(["--fault", fault]);
        }
        let process = Process::spawn(&options.identity, command, log)?;
        Ok(Self {
            process,
            metrics_addr,
        })
    }

    pub fn process(&mut self) -> &mut Process {
        &mut self.process
    }

    pub fn kill(&mut self) {
        self.process.kill();
    }

    pub fn log_contains(&self, needle: &str) -> bool {
        self.process.log_contains(needle)
    }

    /// GET /metrics as text.
    pub fn metrics(&self) -> Result<String> {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(&self.metrics_addr)
            .map_err(crate::io("connecting to the metrics port"))?;
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
            .map_err(crate::io("requesting metrics"))?;
        let mut response = String::new();
        stream
            .read_to_string(&mut response)
            .map_err(crate::io("reading metrics"))?;
        Ok(response)
    }
}
