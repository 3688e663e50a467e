use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use petstore_server::server::{ServeOptions, TlsFiles};
use petstore_server::storage::StorageConfig;

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

    /// Where pets are kept: `durable` (a crash-safe file) or `memory`
    /// (lost on restart).
    #[arg(long, env = "PETSTORE_STORAGE", value_enum, default_value_t = StorageKind::Durable)]
    storage: StorageKind,

    /// File that holds the durable store; created if missing.
    #[arg(long, env = "PETSTORE_DATA_FILE", default_value = "petstore.redb")]
    data_file: PathBuf,

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
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
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

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    init_tracing(args.log_format);

    let config = match args.storage {
        StorageKind::Memory => StorageConfig::Memory,
        StorageKind::Durable => StorageConfig::Durable {
            path: args.data_file.clone(),
        },
    };
    let storage = match config.open() {
        Ok(storage) => storage,
        Err(err) => {
            tracing::error!(error = %err, ?config, "cannot open storage");
            return ExitCode::FAILURE;
        }
    };
    tracing::info!(?config, "storage open");

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
