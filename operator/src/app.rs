//! Wires the operator together: the Kubernetes client, the conversion
//! webhook and its certificates, the store client, metrics, Events, leader
//! election and the controller.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
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
use crate::store::grpc::GrpcPetStore;
use crate::webhook::certs::{self, WebhookTarget};
use crate::webhook::guard;
use crate::webhook::server::{self, ServingCertificate};

/// A token cancelled by SIGTERM or Ctrl-C.
fn shutdown_on_signal() -> CancellationToken {
    let shutdown = CancellationToken::new();
    let cancel = shutdown.clone();
    tokio::spawn(async move {
        petstore_process::shutdown_requested().await;
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
    // First: a taken webhook port stops the operator before it does anything.
    let webhook_listener = server::bind(args.webhook_listen)
        .await
        .map_err(|e| e.to_string())?;

    let client = kube::Client::try_default()
        .await
        .map_err(|e| format!("cannot build a Kubernetes client (check KUBECONFIG): {e}"))?;
    // The conversion webhook, on every replica and before leader election:
    // the API server needs it to serve v1alpha1 whoever leads. Before the
    // first read of Pets, too: Pets an older release stored as v1alpha1
    // reach even this v1-only operator through it. The operator writes
    // only v1, so once those are rewritten its watch never needs it.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &args.lease_namespace);
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let names = certs::serving_names(&args.lease_namespace);
    let webhook_certs = certs::ensure_secret(&secrets, &names, certs::unix_now())
        .await
        .map_err(|e| format!("cannot set up the webhook's certificates: {e}"))?;
    let serving = Arc::new(
        ServingCertificate::from_pem(&webhook_certs.cert, &webhook_certs.key)
            .map_err(|e| e.to_string())?,
    );
    let counted: Api<Pet> = Api::all(client.clone());
    let count_pets: server::CountPets = Arc::new(move || Box::pin(guard::count(counted.clone())));
    let webhook_server = tokio::spawn(server::serve(
        webhook_listener,
        Arc::clone(&serving),
        count_pets,
        shutdown.clone().cancelled_owned(),
    ));
    let target = match &args.webhook_url {
        Some(url) => WebhookTarget::Url(url.clone()),
        None => WebhookTarget::Service {
            namespace: args.lease_namespace.clone(),
        },
    };
    certs::inject_ca_bundle(&crds, &webhook_certs.ca_cert, Some(&target))
        .await
        .map_err(|e| format!("cannot point the Pet CRD at the conversion webhook: {e}"))?;
    tracing::info!(listen = %args.webhook_listen, ?target, "conversion webhook serving");
    let guards: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    if let Err(err) = certs::inject_guard(&guards, &webhook_certs.ca_cert, &target).await {
        // The guard keeps the CRD while it cannot reach us: nothing lost.
        tracing::warn!(error = %err, "cannot point the CRD deletion guard at this operator");
    }
    tokio::spawn(certs::keep_fresh(
        secrets,
        crds,
        (guards, target.clone()),
        names,
        serving,
        webhook_certs,
        shutdown.clone(),
    ));

    let pets: Api<Pet> = Api::all(client.clone());
    // The API server takes a moment to use the webhook settings just
    // written to the CRD; until then a Pet stored in another version
    // cannot be read (its conversion goes to the old address).
    let settling = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        match pets.list_metadata(&ListParams::default().limit(1)).await {
            Err(err)
                if std::time::Instant::now() < settling
                    && err.to_string().contains("conversion webhook") =>
            {
                tracing::info!(error = %err, "waiting for the API server to use the conversion webhook");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            result => break result,
        }
    }
    .map_err(|e| {
            format!("cannot list Pets; is the CRD installed (kubectl apply -f config/crd/) and may this account list pets? {e}")
        })?;

    let metrics_server = tokio::spawn(metrics::serve(
        args.metrics_addr,
        Arc::clone(&metrics),
        shutdown.clone().cancelled_owned(),
    ));
    metrics.set_ready();

    let tls = args.petstore_tls.files();
    let store = GrpcPetStore::connect_lazy(
        &args.petstore_addr,
        args.petstore_timeout,
        tls.as_ref(),
        metrics.store_calls(),
    )
    .map_err(|e| e.to_string())?
    .with_budget(CallBudget::new(args.store_qps, args.store_burst))
    .with_create_batching(if petstore_telemetry::spans_exported() {
        Duration::ZERO
    } else {
        args.create_batch_wait
    });
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
        follow_store_changes: args.follow_store_changes,
        backoff_base: args.backoff_base,
        backoff_max: args.backoff_max,
        concurrency: args.concurrency,
        installation: args.installation.clone(),
        fault,
    };
    tracing::info!(store = %args.petstore_addr, tls = tls.is_some(), ?settings, %identity, "starting");
    let events = EventQueue::start(recorder, Arc::clone(&metrics));
    let ctx = Arc::new(
        Context::new(
            client.clone(),
            Arc::new(store),
            events.clone(),
            Arc::clone(&metrics),
            settings,
        )
        .watching_uninstall(args.lease_namespace.clone()),
    );

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
    match webhook_server.await {
        Ok(Ok(())) => {}
        Ok(Err(err)) => tracing::warn!(error = %err, "webhook server failed"),
        Err(err) => tracing::warn!(error = %err, "webhook server task failed"),
    }
    match metrics_server.await {
        Ok(Ok(())) => {}
        Ok(Err(err)) => tracing::warn!(error = %err, "metrics server failed"),
        Err(err) => tracing::warn!(error = %err, "metrics server task failed"),
    }
    tracing::info!("stopped");
    Ok(exit)
}
