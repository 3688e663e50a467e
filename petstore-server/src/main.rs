use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Parser, ValueEnum};
use petstore_server::auth::{Tenancy, TenancyOptions, TrustedIssuer};
use petstore_server::server::{ServeOptions, TlsFiles};
use petstore_server::service::Observability;
use petstore_server::storage::{PostgresConfig, StorageConfig};
use petstore_telemetry::{LogFormat, SamplerSetting, SharedSampler};

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

    /// Which calls without a sampled parent start a trace: `never`, `always`
    /// or a ratio in (0, 1] such as `0.25`. The ChangeSampler RPC changes it
    /// at run time. Spans are exported only when OTEL_EXPORTER_OTLP_ENDPOINT
    /// (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set.
    #[arg(long, env = "PETSTORE_TRACE_SAMPLER", default_value = "never")]
    trace_sampler: SamplerSetting,

    /// Address serving Prometheus metrics on /metrics; `off` or empty
    /// serves none.
    #[arg(long, env = "PETSTORE_METRICS_LISTEN", default_value = "0.0.0.0:9090")]
    metrics_listen: MetricsListen,

    /// How often an idle WatchPets stream gets a progress message (its
    /// current revision), e.g. `200ms`, `10s`, `1m`.
    #[arg(
        long,
        env = "PETSTORE_WATCH_PROGRESS_INTERVAL",
        default_value = "10s",
        value_parser = petstore_process::parse_positive_duration
    )]
    watch_progress_interval: std::time::Duration,

    /// Changes kept for WatchPets to resume from (about 300 bytes of memory
    /// each, and as much disk in a durable store or PostgreSQL). A client
    /// further behind gets OUT_OF_RANGE and re-reads.
    #[arg(long, env = "PETSTORE_WATCH_HISTORY", default_value_t = petstore_server::storage::DEFAULT_HISTORY)]
    watch_history: usize,

    /// Requests answered at once (WatchPets streams and health checks are
    /// not counted). Beyond it a request is refused at once with
    /// RESOURCE_EXHAUSTED and a grpc-retry-pushback-ms trailer, instead of
    /// queueing. 0: no bound.
    #[arg(long, env = "PETSTORE_MAX_CONCURRENT_REQUESTS", default_value_t = petstore_server::admission::DEFAULT_MAX_CONCURRENT_REQUESTS)]
    max_concurrent_requests: usize,

    /// Of those, the most one client (an IP address) may have answered at
    /// once; beyond it its request is refused the same way, while others'
    /// are answered. Default: half of --max-concurrent-requests. 0: no
    /// share.
    #[arg(long, env = "PETSTORE_MAX_CONCURRENT_REQUESTS_PER_CLIENT")]
    max_concurrent_requests_per_client: Option<usize>,

    /// Calls answered per second, from all clients together, counted as
    /// --max-concurrent-requests counts them; bursts of up to a tenth of a
    /// second's calls (at least one). Beyond it a call is refused at once
    /// with RESOURCE_EXHAUSTED and a grpc-retry-pushback-ms trailer of the
    /// wait until the next may be answered. 0: no bound.
    #[arg(
        long,
        env = "PETSTORE_MAX_CALLS_PER_SECOND",
        default_value_t = 0.0,
        value_parser = parse_calls_per_second
    )]
    max_calls_per_second: f64,

    /// Connections one client (an IP address) may hold open at once. One
    /// more is closed as soon as it is accepted, before any TLS handshake.
    /// 0: no bound.
    #[arg(long, env = "PETSTORE_MAX_CONNECTIONS_PER_CLIENT", default_value_t = petstore_server::per_client::DEFAULT_MAX_CONNECTIONS_PER_CLIENT)]
    max_connections_per_client: usize,

    /// Tenant isolation: every call must carry `authorization: Bearer
    /// <Kubernetes ServiceAccount token>`, and acts for the token's
    /// namespace, which reads and writes only its own records. Needs
    /// --token-issuer, and TLS unless --allow-plaintext-tokens.
    #[arg(long, env = "PETSTORE_TENANCY")]
    tenancy: bool,

    /// A trusted token issuer and the file holding its keys (a JWKS
    /// document, as the API server's /openid/v1/jwks serves), as
    /// `<ISSUER>=<JWKS_FILE>`; repeat for several. The file is read again
    /// when it changes.
    #[arg(
        long = "token-issuer",
        env = "PETSTORE_TOKEN_ISSUERS",
        value_delimiter = ',',
        requires = "tenancy"
    )]
    token_issuers: Vec<TrustedIssuer>,

    /// The audience tokens must carry (`kubectl create token --audience`).
    #[arg(long, env = "PETSTORE_TOKEN_AUDIENCE", default_value = petstore_server::auth::DEFAULT_AUDIENCE)]
    token_audience: String,

    /// A ServiceAccount (`system:serviceaccount:<namespace>:<name>`) that
    /// may read every tenant's records, watch them, claim installations and
    /// change the sampler, but write no record; repeat for several.
    #[arg(
        long = "observer",
        env = "PETSTORE_OBSERVERS",
        value_delimiter = ',',
        requires = "tenancy"
    )]
    observers: Vec<String>,

    /// Refuse tokens issued longer ago than this (e.g. `5m`), however long
    /// they last: bounds how long a leaked token can be replayed. The
    /// operator mints a fresh token when one is refused. Default: none.
    #[arg(
        long = "token-max-age",
        env = "PETSTORE_TOKEN_MAX_AGE",
        value_parser = petstore_process::parse_positive_duration,
        requires = "tenancy"
    )]
    token_max_age: Option<std::time::Duration>,

    /// The only namespaces that may use the store (repeat, or a comma
    /// list); others are PERMISSION_DENIED. Default: any.
    #[arg(
        long = "tenant-namespaces",
        env = "PETSTORE_TENANT_NAMESPACES",
        value_delimiter = ',',
        requires = "tenancy"
    )]
    tenant_namespaces: Vec<String>,

    /// Accept tokens over plaintext: local development only, as anyone on
    /// the path could read and replay them.
    #[arg(long, env = "PETSTORE_ALLOW_PLAINTEXT_TOKENS", requires = "tenancy")]
    allow_plaintext_tokens: bool,
}

/// `--max-calls-per-second`: a rate, 0 or more.
fn parse_calls_per_second(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(rate) if rate.is_finite() && rate >= 0.0 => Ok(rate),
        _ => Err(format!(
            "{text:?} is not a number of calls a second (0 or more; 0: no bound)"
        )),
    }
}

/// `--metrics-listen`: an address, or none.
#[derive(Clone, Copy, Debug)]
struct MetricsListen(Option<SocketAddr>);

impl std::str::FromStr for MetricsListen {
    type Err = std::net::AddrParseError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim() {
            "" | "off" => Ok(Self(None)),
            addr => addr.parse().map(|addr| Self(Some(addr))),
        }
    }
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum StorageKind {
    Durable,
    Memory,
    Postgres,
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
    let mut builder = match args.worker_threads {
        1 => tokio::runtime::Builder::new_current_thread(),
        _ => tokio::runtime::Builder::new_multi_thread(),
    };
    if args.worker_threads > 1 {
        builder.worker_threads(args.worker_threads);
    }
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        let sampler = SharedSampler::new(args.trace_sampler);
        // Inside the runtime: the span exporter's gRPC channel lives on it.
        let Some(telemetry) = petstore_telemetry::init_for_main(
            "petstore-server",
            args.log_format,
            Some(sampler.clone()),
        ) else {
            return ExitCode::FAILURE;
        };
        tracing::info!(
            exporting_spans = telemetry.is_exporting(),
            sampler = %args.trace_sampler,
            "telemetry ready"
        );
        let observability = Observability::new(sampler, telemetry.is_exporting());
        let code = serve(args, observability).await;
        // Sends the last spans.
        telemetry.shutdown_async().await;
        code
    })
}

/// Tenancy as the flags set it: `None` when off.
fn tenancy(args: &Args) -> anyhow::Result<Option<Arc<Tenancy>>> {
    if !args.tenancy {
        return Ok(None);
    }
    if args.tls_cert.is_none() && !args.allow_plaintext_tokens {
        anyhow::bail!(petstore_server::server::ServeError::PlaintextTokens);
    }
    let tenancy = Tenancy::new(TenancyOptions {
        issuers: args.token_issuers.clone(),
        audience: args.token_audience.clone(),
        observers: args.observers.clone(),
        tenant_namespaces: args.tenant_namespaces.clone(),
        allow_plaintext_tokens: args.allow_plaintext_tokens,
        token_max_age: args.token_max_age,
    })?;
    if args.tls_cert.is_none() {
        tracing::warn!(
            "tenancy over plaintext (--allow-plaintext-tokens): tokens can be read on the wire; for local development only"
        );
    }
    tracing::info!(
        issuers = args.token_issuers.len(),
        audience = %args.token_audience,
        observers = args.observers.len(),
        tenant_namespaces = ?args.tenant_namespaces,
        token_max_age = ?args.token_max_age,
        "tenancy on"
    );
    Ok(Some(Arc::new(tenancy)))
}

async fn serve(args: Args, observability: Observability) -> ExitCode {
    // Before anything opens: a refused configuration changes nothing.
    let tenancy = match tenancy(&args) {
        Ok(tenancy) => tenancy,
        Err(err) => {
            tracing::error!(error = %err, "cannot start tenancy");
            return ExitCode::FAILURE;
        }
    };
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
    let storage = match config.open_with_history(args.watch_history).await {
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
    let metrics_server = match args.metrics_listen.0 {
        None => None,
        Some(addr) => match tokio::net::TcpListener::bind(addr).await {
            Ok(listener) => Some(tokio::spawn(petstore_server::metrics::serve(
                listener,
                Arc::clone(&observability.metrics),
                std::future::pending(),
            ))),
            // Not fatal: the pets matter more than their metrics, and
            // stores started side by side on one host (tests) would
            // otherwise stop each other.
            Err(err) => {
                tracing::error!(error = %err, listen = %addr, "cannot listen for metrics; serving without them");
                None
            }
        },
    };
    let options = ServeOptions {
        tls: args.tls_cert.zip(args.tls_key).map(|(cert, key)| TlsFiles {
            cert,
            key,
            client_ca: args.tls_client_ca,
        }),
        observability,
        watch: petstore_server::watch::WatchOptions {
            progress_interval: args.watch_progress_interval,
            ..Default::default()
        },
        admission: (args.max_concurrent_requests > 0).then(|| {
            let admission =
                petstore_server::admission::Admission::new(args.max_concurrent_requests);
            match args.max_concurrent_requests_per_client {
                Some(share) => admission.with_per_client(share),
                None => admission,
            }
        }),
        max_calls_per_second: args.max_calls_per_second,
        tenancy,
        max_connections_per_client: args.max_connections_per_client,
    };
    let served = petstore_server::server::serve(
        listener,
        storage,
        options,
        petstore_process::shutdown_requested(),
    )
    .await;
    // Scrapes may come until the gRPC calls have drained; then stop.
    if let Some(metrics_server) = metrics_server {
        metrics_server.abort();
    }
    match served {
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

#[cfg(test)]
mod tests {
    use super::Args;
    use clap::Parser;
    use std::time::Duration;

    fn progress_interval(value: &str) -> Result<Duration, clap::Error> {
        Args::try_parse_from(["petstore-server", "--watch-progress-interval", value])
            .map(|args| args.watch_progress_interval)
    }

    // The flag reads the grammar every duration flag shares, but refuses
    // zero: progress messages would be sent in a busy loop.
    #[test]
    fn the_progress_interval_reads_the_shared_grammar_but_not_zero() {
        assert_eq!(
            progress_interval("200ms").ok(),
            Some(Duration::from_millis(200))
        );
        assert_eq!(
            progress_interval("1.5m").ok(),
            Some(Duration::from_secs(90))
        );
        assert_eq!(
            progress_interval("1h30m").ok(),
            Some(Duration::from_secs(5400))
        );
        for bad in ["", "10", "s", "10 parsecs", "-1s", "0s"] {
            assert!(progress_interval(bad).is_err(), "{bad:?} accepted");
        }
    }

    // Off by default; a rate is a number, 0 or more, and nothing else.
    #[test]
    fn the_rate_bound_is_off_by_default_and_reads_only_a_rate() {
        let rate = |value: &str| {
            Args::try_parse_from(["petstore-server", "--max-calls-per-second", value])
                .map(|args| args.max_calls_per_second)
        };
        let args = Args::try_parse_from(["petstore-server"]).expect("defaults");
        assert_eq!(args.max_calls_per_second, 0.0);
        assert_eq!(rate("200").ok(), Some(200.0));
        assert_eq!(rate("2.5").ok(), Some(2.5));
        assert_eq!(rate("0").ok(), Some(0.0));
        for bad in ["", "-1", "NaN", "inf", "fast", "10/s"] {
            assert!(rate(bad).is_err(), "{bad:?} accepted");
        }
    }

    // Off by default; the flags that shape it need it on.
    #[test]
    fn tenancy_flags_parse_and_need_tenancy() {
        let args = Args::try_parse_from(["petstore-server"]).expect("defaults");
        assert!(!args.tenancy);
        assert_eq!(args.token_audience, "petstore");
        let args = Args::try_parse_from([
            "petstore-server",
            "--tenancy",
            "--token-issuer",
            "https://kubernetes.default.svc=/etc/jwks.json",
            "--token-issuer",
            "https://other=/etc/other.json",
            "--observer",
            "system:serviceaccount:monitoring:reader",
            "--tenant-namespaces",
            "a,b",
            "--tenant-namespaces",
            "c",
            "--allow-plaintext-tokens",
        ])
        .expect("tenancy flags");
        assert!(args.tenancy && args.allow_plaintext_tokens);
        assert_eq!(args.token_issuers.len(), 2);
        assert_eq!(
            args.token_issuers[0].issuer,
            "https://kubernetes.default.svc"
        );
        assert_eq!(
            args.token_issuers[0].jwks,
            std::path::PathBuf::from("/etc/jwks.json")
        );
        assert_eq!(args.tenant_namespaces, ["a", "b", "c"]);
        assert_eq!(args.observers, ["system:serviceaccount:monitoring:reader"]);
        for without_tenancy in [
            ["--token-issuer", "x=/f"],
            ["--observer", "system:serviceaccount:a:b"],
            ["--tenant-namespaces", "a"],
        ] {
            let mut argv = vec!["petstore-server"];
            argv.extend(without_tenancy);
            assert!(Args::try_parse_from(argv).is_err(), "{without_tenancy:?}");
        }
        assert!(Args::try_parse_from(["petstore-server", "--allow-plaintext-tokens"]).is_err());
        assert!(
            Args::try_parse_from([
                "petstore-server",
                "--tenancy",
                "--token-issuer",
                "no-equals"
            ])
            .is_err()
        );
    }
}
