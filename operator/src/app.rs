//! Wires the operator together: the Kubernetes client, the store client,
//! metrics, Events, leader election and the controller.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, ListParams};
use kube::runtime::events::Reporter;
use tokio_util::sync::CancellationToken;

use crate::Fault;
use crate::cli::Args;
use crate::controller::{self, Context, Settings};
use crate::crd::Pet;
use crate::events::{EventQueue, EventWriter};
use crate::leader::{self, Lease, Reign};
use crate::metrics::{self, Metrics};
use crate::store::budget::CallBudget;
use crate::store::grpc::{GrpcPetStore, TlsFiles};

/// A token cancelled by SIGTERM or Ctrl-C.
fn shutdown_on_signal() -> CancellationToken {
    let shutdown = CancellationToken::new();
    let cancel = shutdown.clone();
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
        cancel.cancel();
    });
    shutdown
}

/// Runs the operator until SIGTERM or Ctrl-C (or, with leader election, until
/// leadership is lost: then it exits with failure, to come back as a
/// standby). `fault` is for the end-to-end crash tests; the release binary
/// always passes `None`.
pub async fn run(args: Args, fault: Option<Fault>) -> Result<ExitCode, String> {
    let identity = args.identity.clone().unwrap_or_else(|| {
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "local".into());
        format!("{host}-{}", std::process::id())
    });
    let shutdown = shutdown_on_signal();
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
        shutdown.clone().cancelled_owned(),
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
    .map_err(|e| e.to_string())?
    .with_budget(CallBudget::new(args.store_qps, args.store_burst));
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
        audit_interval: args.audit_interval,
        backoff_base: args.backoff_base,
        backoff_max: args.backoff_max,
        concurrency: args.concurrency,
        fault,
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
        let lease = Lease {
            namespace: &args.lease_namespace,
            name: &args.lease_name,
            identity: &identity,
            duration: args.lease_duration,
        };
        let reign = leader::run_while_leading(client, lease, &shutdown, &metrics, |stop| {
            controller::run(ctx, stop)
        })
        .await
        .map_err(|e| e.to_string())?;
        if reign == Reign::Lost {
            // Another replica may already be reconciling: stop at once and
            // let Kubernetes restart us as a standby.
            tracing::error!("lost leadership; exiting");
            exit = ExitCode::FAILURE;
        }
    } else {
        controller::run(ctx, shutdown.clone()).await;
    }

    // Whatever stopped the controller stops the rest: a replica that lost
    // the Lease must exit, not go on serving /healthz as a live one.
    shutdown.cancel();

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
