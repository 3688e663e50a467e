use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, ValueEnum};
use petstore_server::server::{ServeOptions, TlsFiles};
use petstore_server::storage::{PostgresConfig, StorageConfig};

/// gRPC pet store: add, update, delete, search and look up pets.
///
/// Serves petstore.PetStore, grpc.health.v1.Health and gRPC server
/// reflection, so `grpcurl -plaintext localhost:6742 list` works.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Address to listen on.
    #[arg(long, env = "PETSTORE_LISTEN", default_value = "0.0.0.0:6742")]
    listen: SocketAddr,

    /// Where pets are kept: `durable` (a crash-safe file), `memory` (lost on
    /// restart) or `postgres` (a PostgreSQL database that any number of
    /// replicas can share).
    #[arg(long, env = "PETSTORE_STORAGE", value_enum, default_value_t = StorageKind::Durable)]
    storage: StorageKind,

    /// File that holds the durable store; created if missing.
    #[arg(long, env = "PETSTORE_DATA_FILE", default_value = "petstore.redb")]
    data_file: PathBuf,

    /// Memory for the durable store's page cache, in MiB. Reads beyond it
    /// come from the kernel's page cache.
    #[arg(long, env = "PETSTORE_DURABLE_CACHE_MIB", default_value_t = 32)]
    durable_cache_mib: usize,

    /// Threads that serve requests; 0 means one per core. One is the
    /// default: the Deployment gives the store one CPU, a call takes
    /// microseconds of it, and one thread spends none handing calls between
    /// threads. More help only with many busy clients and more CPU.
    #[arg(long, env = "PETSTORE_WORKER_THREADS", default_value_t = 1)]
    worker_threads: usize,

    /// PostgreSQL connection URL for `--storage postgres`, e.g.
    /// `postgres://petstore@db:5432/petstore`. Put the password in
    /// --postgres-password-file, not here.
    #[arg(
        long,
        env = "PETSTORE_POSTGRES_URL",
        required_if_eq("storage", "postgres")
    )]
    postgres_url: Option<String>,

    /// File holding the database password (e.g. a mounted Secret); a
    /// trailing newline is ignored.
    #[arg(long, env = "PETSTORE_POSTGRES_PASSWORD_FILE")]
    postgres_password_file: Option<PathBuf>,

    /// Database connections kept by this replica.
    #[arg(long, env = "PETSTORE_POSTGRES_POOL_SIZE", default_value_t = 16)]
    postgres_pool_size: usize,

    /// Serve TLS with this certificate (PEM). Needs --tls-key.
    #[arg(long, env = "PETSTORE_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,

    /// Private key (PEM) for --tls-cert.
    #[arg(long, env = "PETSTORE_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,

    /// Require client certificates signed by this CA (PEM): mutual TLS.
    #[arg(long, env = "PETSTORE_TLS_CLIENT_CA", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,

    /// Log format. The level comes from RUST_LOG (default `info`).
    #[arg(long, env = "PETSTORE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum StorageKind {
    Durable,
    Memory,
    Postgres,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour only on a terminal: `kubectl logs` and log files get plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stdout().is_terminal());
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(err) => {
                tracing::warn!(error = %err, "cannot listen for SIGTERM; only Ctrl-C stops the server");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
}

fn postgres_config(args: &Args) -> anyhow::Result<PostgresConfig> {
    let url = args
        .postgres_url
        .as_deref()
        .context("--postgres-url (PETSTORE_POSTGRES_URL) is required")?;
    // The parser's message never repeats the URL, so a password in it
    // stays out of the log.
    let mut config: tokio_postgres::Config = url.parse().context("parsing --postgres-url")?;
    if config.get_password().is_some() {
        tracing::warn!(
            "the PostgreSQL URL carries a password; prefer --postgres-password-file, as a URL flag is visible to every local user"
        );
    }
    if let Some(path) = &args.postgres_password_file {
        let password = std::fs::read_to_string(path)
            .with_context(|| format!("reading the password file {}", path.display()))?;
        config.password(password.trim_end_matches(['\r', '\n']));
    }
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(std::time::Duration::from_secs(5));
    }
    Ok(PostgresConfig {
        config,
        pool_size: args.postgres_pool_size,
        connect_timeout: std::time::Duration::from_secs(60),
    })
}

fn main() -> ExitCode {
    let args = Args::parse();
    init_tracing(args.log_format);
    let mut builder = match args.worker_threads {
        1 => tokio::runtime::Builder::new_current_thread(),
        _ => tokio::runtime::Builder::new_multi_thread(),
    };
    if args.worker_threads > 1 {
        builder.worker_threads(args.worker_threads);
    }
    let runtime = builder.enable_all().build();
    match runtime {
        Ok(runtime) => runtime.block_on(serve(args)),
        Err(err) => {
            tracing::error!(error = %err, "cannot start the async runtime");
            ExitCode::FAILURE
        }
    }
}

async fn serve(args: Args) -> ExitCode {
    let config = match args.storage {
        StorageKind::Memory => StorageConfig::Memory,
        StorageKind::Durable => StorageConfig::Durable {
            path: args.data_file.clone(),
            cache_bytes: args.durable_cache_mib.saturating_mul(1024 * 1024),
        },
        StorageKind::Postgres => match postgres_config(&args) {
            Ok(config) => StorageConfig::Postgres(Box::new(config)),
            Err(err) => {
                tracing::error!(error = %err, "invalid PostgreSQL settings");
                return ExitCode::FAILURE;
            }
        },
    };
    let opening = std::time::Instant::now();
    let storage = match config.open().await {
        Ok(storage) => storage,
        Err(err) => {
            tracing::error!(error = %err, ?config, "cannot open storage");
            return ExitCode::FAILURE;
        }
    };
    let open_ms = opening.elapsed().as_secs_f64() * 1000.0;
    tracing::info!(?config, open_ms, "storage open");

    let listener = match tokio::net::TcpListener::bind(args.listen).await {
        Ok(listener) => listener,
        Err(err) => {
            tracing::error!(error = %err, listen = %args.listen, "cannot listen");
            return ExitCode::FAILURE;
        }
    };
    let options = ServeOptions {
        tls: args.tls_cert.zip(args.tls_key).map(|(cert, key)| TlsFiles {
            cert,
            key,
            client_ca: args.tls_client_ca,
        }),
    };
    match petstore_server::server::serve(listener, storage, options, shutdown_signal()).await {
        Ok(()) => {
            tracing::info!("stopped");
            ExitCode::SUCCESS
        }
        Err(err) => {
            tracing::error!(error = %err, "server failed");
            ExitCode::FAILURE
        }
    }
}
