use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{ArgAction, Parser, ValueEnum};
use kube::api::{Api, ListParams};
use kube::runtime::events::Reporter;
use petstore_operator::controller::{self, Context, Settings};
use petstore_operator::crd::Pet;
use petstore_operator::events::{EventQueue, EventWriter};
use petstore_operator::leader::Leadership;
use petstore_operator::metrics::{self, Metrics};
use petstore_operator::store::grpc::{GrpcPetStore, TlsFiles};
use tokio::sync::watch;

/// Kubernetes operator that keeps each Pet resource in the gRPC pet store.
///
/// Every flag can also be set through the environment variable shown.
/// Durations take a unit: 500ms, 30s, 5m, 1h.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Pet store address, host:port or http://host:port.
    #[arg(
        long,
        env = "PETSTORE_ADDR",
        default_value = "petstore-service.petstore.svc.cluster.local:6742"
    )]
    petstore_addr: String,

    /// Use TLS to the store, trusting this CA (PEM) for its certificate.
    #[arg(long, env = "PETSTORE_CA_FILE")]
    petstore_ca_file: Option<PathBuf>,

    /// Client certificate (PEM) for mutual TLS with the store. Needs
    /// --petstore-key-file.
    #[arg(long, env = "PETSTORE_CERT_FILE", requires = "petstore_key_file")]
    petstore_cert_file: Option<PathBuf>,

    /// Private key (PEM) for --petstore-cert-file.
    #[arg(long, env = "PETSTORE_KEY_FILE", requires = "petstore_cert_file")]
    petstore_key_file: Option<PathBuf>,

    /// Name to verify in the store's certificate, if not the address's host.
    #[arg(long, env = "PETSTORE_TLS_SERVER_NAME")]
    petstore_tls_server_name: Option<String>,

    /// Timeout for each pet store call (and for connecting). The old
    /// spelling --store-timeout is still accepted.
    #[arg(long, env = "PETSTORE_TIMEOUT", alias = "store-timeout", default_value = "5s", value_parser = parse_duration)]
    petstore_timeout: Duration,

    /// How often an in-sync Pet is re-checked against the store, so records
    /// changed or lost out of band are put back.
    #[arg(long, env = "POLL_INTERVAL", default_value = "5m", value_parser = parse_duration)]
    poll_interval: Duration,

    /// Most drift-poll reads per second the store gets, on average. Polls
    /// are spread evenly over the interval; with more Pets than the interval
    /// allows at this rate, the interval stretches. 0 = no bound.
    #[arg(long, env = "POLL_MAX_RATE", default_value_t = 100.0, value_parser = parse_rate)]
    poll_max_rate: f64,

    /// Pets reconciled concurrently.
    #[arg(long, env = "CONCURRENCY", default_value_t = 16)]
    concurrency: u16,

    /// First retry delay after a failure; it doubles per consecutive failure.
    #[arg(long, env = "BACKOFF_BASE", default_value = "1s", value_parser = parse_duration)]
    backoff_base: Duration,

    /// Longest retry delay after repeated failures.
    #[arg(long, env = "BACKOFF_MAX", default_value = "5m", value_parser = parse_duration)]
    backoff_max: Duration,

    /// Address for /metrics, /healthz and /readyz.
    #[arg(long, env = "METRICS_ADDR", default_value = "0.0.0.0:8080")]
    metrics_addr: SocketAddr,

    /// Elect a leader through a Lease so only one replica reconciles.
    /// Turn off for a single local process.
    #[arg(long, env = "LEADER_ELECTION", default_value_t = true, action = ArgAction::Set)]
    leader_election: bool,

    /// Namespace of the leader Lease (in a pod: its own namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    lease_namespace: String,

    /// Name of the leader Lease.
    #[arg(long, env = "LEASE_NAME", default_value = "petstore-operator")]
    lease_name: String,

    /// Lease duration: how long a dead leader blocks a standby.
    #[arg(long, env = "LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    lease_duration: Duration,

    /// This replica's identity in the Lease and in Events (in a pod: its name).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,

    /// Log format. The level comes from RUST_LOG (default `info`).
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,

    /// Fault injection for crash tests (built only with the
    /// `fault-injection` feature).
    #[cfg(feature = "fault-injection")]
    #[arg(long, env = "PETSTORE_OPERATOR_FAULT", value_enum)]
    fault: Option<FaultArg>,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[cfg(feature = "fault-injection")]
#[derive(Clone, Copy, Debug, ValueEnum)]
enum FaultArg {
    HangAfterCreate,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration such as 500ms, 30s, 5m or 1h"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "s" | "" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => {
            return Err(format!(
                "unknown unit {unit:?} in {text:?}: use ms, s, m or h"
            ));
        }
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("{text:?}: {e}"))
}

fn parse_rate(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(rate) if rate.is_finite() && rate >= 0.0 => Ok(rate),
        _ => Err(format!(
            "{text:?} is not a rate: give reads per second, such as 100 (0: no bound)"
        )),
    }
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

/// A shutdown flag set by SIGTERM or Ctrl-C, that many tasks can wait on.
fn shutdown_flag() -> watch::Receiver<bool> {
    let (set, flag) = watch::channel(false);
    tokio::spawn(async move {
        let terminate = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut signal) => {
                    signal.recv().await;
                }
                Err(err) => {
                    tracing::warn!(error = %err, "cannot listen for SIGTERM");
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            () = terminate => {}
        }
        tracing::info!("shutdown requested");
        let _ = set.send(true);
    });
    flag
}

async fn wait_for(mut flag: watch::Receiver<bool>) {
    let _ = flag.wait_for(|set| *set).await;
}

// One thread: the operator waits on I/O almost all the time, and a single
// scheduler avoids cross-thread wake-ups that cost more CPU than they save
// (measured in BENCHMARKS.md).
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    init_tracing(args.log_format);
    match run(args).await {
        Ok(code) => code,
        Err(message) => {
            tracing::error!("{message}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<ExitCode, String> {
    let identity = args.identity.clone().unwrap_or_else(|| {
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "local".into());
        format!("{host}-{}", std::process::id())
    });
    let shutdown = shutdown_flag();
    let metrics = Arc::new(Metrics::default());

    let client = kube::Client::try_default()
        .await
        .map_err(|e| format!("cannot build a Kubernetes client (check KUBECONFIG): {e}"))?;
    let pets: Api<Pet> = Api::all(client.clone());
    pets.list_metadata(&ListParams::default().limit(1))
        .await
        .map_err(|e| {
            format!("cannot list Pets; is the CRD installed (kubectl apply -f config/crd/) and may this account list pets? {e}")
        })?;

    let metrics_server = tokio::spawn(metrics::serve(
        args.metrics_addr,
        Arc::clone(&metrics),
        wait_for(shutdown.clone()),
    ));
    metrics.set_ready();

    let tls =
        (args.petstore_ca_file.is_some() || args.petstore_cert_file.is_some()).then(|| TlsFiles {
            ca: args.petstore_ca_file.clone(),
            client_cert_and_key: args
                .petstore_cert_file
                .clone()
                .zip(args.petstore_key_file.clone()),
            server_name: args.petstore_tls_server_name.clone(),
        });
    let store = GrpcPetStore::connect_lazy(
        &args.petstore_addr,
        args.petstore_timeout,
        tls.as_ref(),
        Arc::clone(&metrics),
    )
    .map_err(|e| e.to_string())?;
    let recorder = EventWriter::new(
        client.clone(),
        Reporter {
            controller: "petstore-operator".into(),
            instance: Some(identity.clone()),
        },
    );
    let settings = Settings {
        poll_interval: args.poll_interval,
        poll_max_rate: args.poll_max_rate,
        backoff_base: args.backoff_base,
        backoff_max: args.backoff_max,
        concurrency: args.concurrency,
        #[cfg(feature = "fault-injection")]
        fault: args
            .fault
            .map(|FaultArg::HangAfterCreate| controller::Fault::HangAfterCreate),
    };
    tracing::info!(store = %args.petstore_addr, tls = tls.is_some(), ?settings, %identity, "starting");
    let events = EventQueue::start(recorder, Arc::clone(&metrics));
    let ctx = Arc::new(Context::new(
        client.clone(),
        Arc::new(store),
        events.clone(),
        Arc::clone(&metrics),
        settings,
    ));

    let mut exit = ExitCode::SUCCESS;
    if args.leader_election {
        let mut leadership = Leadership::start(
            client,
            &args.lease_namespace,
            &args.lease_name,
            &identity,
            args.lease_duration,
        )
        .await
        .map_err(|e| e.to_string())?;
        tracing::info!(lease = %args.lease_name, namespace = %args.lease_namespace, "waiting for leadership");
        let acquired = tokio::select! {
            acquired = leadership.acquired() => acquired,
            () = wait_for(shutdown.clone()) => false,
        };
        if acquired {
            tracing::info!("became leader; reconciling");
            metrics.set_leader(true);
            let (lost_tx, lost_rx) = watch::channel(false);
            let stop = {
                let shutdown = shutdown.clone();
                async move {
                    tokio::select! {
                        () = wait_for(shutdown) => {}
                        () = wait_for(lost_rx) => {}
                    }
                }
            };
            let watcher = tokio::spawn(async move {
                leadership.lost().await;
                let _ = lost_tx.send(true);
            });
            controller::run(ctx, stop).await;
            if !*shutdown.borrow() {
                // Another replica may already be reconciling: stop at once
                // and let Kubernetes restart us as a standby.
                tracing::error!("lost leadership; exiting");
                exit = ExitCode::FAILURE;
            }
            watcher.abort();
            metrics.set_leader(false);
        }
    } else {
        controller::run(ctx, wait_for(shutdown.clone())).await;
    }

    // Give queued Events a moment to reach the API before exiting.
    if tokio::time::timeout(Duration::from_secs(2), events.flush())
        .await
        .is_err()
    {
        tracing::warn!(pending = events.pending(), "exiting with Events unwritten");
    }
    match metrics_server.await {
        Ok(Ok(())) => {}
        Ok(Err(err)) => tracing::warn!(error = %err, "metrics server failed"),
        Err(err) => tracing::warn!(error = %err, "metrics server task failed"),
    }
    tracing::info!("stopped");
    Ok(exit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_units() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn the_store_timeout_flag_matches_its_variable_and_keeps_its_old_name() {
        let args = Args::try_parse_from(["petstore-operator", "--petstore-timeout", "7s"])
            .expect("new name");
        assert_eq!(args.petstore_timeout, Duration::from_secs(7));
        let args =
            Args::try_parse_from(["petstore-operator", "--store-timeout", "3s"]).expect("old name");
        assert_eq!(args.petstore_timeout, Duration::from_secs(3));
    }

    #[cfg(not(feature = "fault-injection"))]
    #[test]
    fn a_default_build_has_no_fault_flag() {
        use clap::CommandFactory;
        let help = Args::command().render_long_help().to_string();
        assert!(
            !help.contains("--fault") && !help.contains("FAULT"),
            "{help}"
        );
        assert!(
            Args::try_parse_from(["petstore-operator", "--fault", "hang-after-create"]).is_err()
        );
    }

    #[test]
    fn rates_are_non_negative_numbers() {
        assert_eq!(parse_rate("100"), Ok(100.0));
        assert_eq!(parse_rate("0"), Ok(0.0));
        assert_eq!(parse_rate("2.5"), Ok(2.5));
        assert!(parse_rate("-1").is_err());
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("inf").is_err());
    }

    #[test]
    fn cli_is_well_formed() {
        use clap::CommandFactory;
        Args::command().debug_assert();
    }
}
