//! Wires the operator together: the Kubernetes client, the conversion
//! webhook and its certificates, the store client, metrics, Events, leader
//! election and the controller.
//!
//! [`run`] goes through named steps, in this order: [`connect`] (the
//! webhook's port, then the Kubernetes client), [`serve_webhook`],
//! [`wait_for_pets`], [`serve_metrics`], [`build_controller`], [`lead`] and
//! [`shut_down`]. A step that cannot go on says why in an [`AppError`].

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams};
use kube::runtime::events::Reporter;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::Fault;
use crate::certs::CertError;
use crate::certs::store::StoreCertificates;
use crate::claim::{self, Claim, Claimed};
use crate::cli::Args;
use crate::controller::{self, Context, Settings, StormThreshold};
use crate::crd::Pet;
use crate::events::{EventQueue, EventWriter};
use crate::leader::{self, LeaderError, Lease, Reign};
use crate::metrics::{self, Metrics};
use crate::store::grpc::TlsFiles;
use crate::store::grpc::{ConnectError, GrpcPetStore};
use crate::store::limiter::StoreLimiter;
use crate::stores::{ClientSettings, Stores};
use crate::webhook::cert_files::{self, CertFileError, CertFiles};
use crate::webhook::certs::{self, WebhookError, WebhookTarget};
use crate::webhook::server::{self, ServerError, ServingCertificate};
use crate::webhook::{guard, store_guard};

/// Why the operator stopped before its controller ran, or could not keep
/// its leadership election going.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// The webhook's port is taken (or cannot be bound).
    #[error(transparent)]
    WebhookListen(ServerError),

    /// Without it the probes fail and nothing can see the operator: it stops
    /// rather than run unobserved.
    #[error("cannot listen for metrics and health probes on {addr} (--metrics-addr): {source}")]
    MetricsListen {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },

    #[error("cannot build a Kubernetes client (check KUBECONFIG): {0}")]
    KubeClient(#[source] kube::Error),

    #[error("cannot set up the webhook's certificates: {0}")]
    WebhookCertificates(#[source] CertError),

    /// `--webhook-cert-dir`'s files cannot be read, loaded or watched.
    #[error("cannot serve the webhook from --webhook-cert-dir: {0}")]
    WebhookCertificateFiles(#[source] CertFileError),

    #[error("cannot set up the store channel's certificates (--store-certificates): {0}")]
    StoreCertificates(#[source] CertError),

    /// The certificate in the webhook's Secret cannot be served.
    #[error(transparent)]
    ServingCertificate(ServerError),

    #[error("cannot point the Pet CRD at the conversion webhook: {0}")]
    ConversionWebhook(#[source] WebhookError),

    #[error(
        "cannot list Pets; is the CRD installed (kubectl apply -f config/crd/) and may this account list pets? {0}"
    )]
    ListPets(#[source] kube::Error),

    #[error(transparent)]
    StoreAddress(#[from] ConnectError),

    #[error(transparent)]
    Leader(#[from] LeaderError),

    #[error(
        "cannot read the kube-system Namespace, whose UID names this cluster in its claim on the installation's name (may this account get namespaces?): {0}"
    )]
    ClusterIdentity(#[source] kube::Error),
}

/// How long the API server may take to use the webhook settings just
/// written to the CRD (see [`wait_for_pets`]).
const WEBHOOK_SETTLING: Duration = Duration::from_secs(30);

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
pub async fn run(args: Args, fault: Option<Fault>) -> Result<ExitCode, AppError> {
    let identity = args.identity.clone().unwrap_or_else(|| {
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "local".into());
        format!("{host}-{}", std::process::id())
    });
    let shutdown = shutdown_on_signal();
    let metrics = Arc::new(Metrics::default());
    let (
        Listeners {
            webhook,
            metrics: metrics_listener,
        },
        client,
    ) = connect(&args).await?;
    let webhook_server = serve_webhook(&args, &client, webhook, &shutdown).await?;
    wait_for_pets(&client).await?;
    let metrics_server = serve_metrics(metrics_listener, &metrics, &shutdown);
    if let Some(target) = &args.publish_token_issuer {
        tokio::spawn(crate::stores::issuer::keep_published(
            client.clone(),
            target.clone(),
            shutdown.clone(),
        ));
    }
    let store_tls = store_tls(&args, &client, &shutdown).await?;
    let (ctx, events) =
        build_controller(&args, &client, store_tls, &metrics, &identity, fault).await?;
    let exit = lead(&args, client, ctx, &shutdown, &metrics, &identity).await?;
    shut_down(&shutdown, &events, webhook_server, metrics_server).await;
    Ok(exit)
}

/// The ports the operator serves on, bound before anything else.
struct Listeners {
    webhook: TcpListener,
    metrics: TcpListener,
}

/// The webhook's and the metrics' ports, then the Kubernetes client. The
/// ports first: a taken port stops the operator before it does anything.
async fn connect(args: &Args) -> Result<(Listeners, kube::Client), AppError> {
    let webhook = server::bind(args.webhook_listen)
        .await
        .map_err(AppError::WebhookListen)?;
    let metrics = TcpListener::bind(args.metrics_addr)
        .await
        .map_err(|source| AppError::MetricsListen {
            addr: args.metrics_addr,
            source,
        })?;
    let bound = |listener: &TcpListener| listener.local_addr().map(|addr| addr.to_string());
    tracing::info!(
        webhook = %bound(&webhook).unwrap_or_default(),
        metrics = %bound(&metrics).unwrap_or_default(),
        "listening"
    );
    let client = kube::Client::try_default()
        .await
        .map_err(AppError::KubeClient)?;
    Ok((Listeners { webhook, metrics }, client))
}

/// The conversion webhook, on every replica and before leader election:
/// the API server needs it to serve v1alpha1 whoever leads. Before the
/// first read of Pets, too: Pets an older release stored as v1alpha1 reach
/// even this v1-only operator through it. The operator writes only v1, so
/// once those are rewritten its watch never needs it.
///
/// Sets up its certificates, serves it, points the CRD (and the CRD and
/// store deletion guards) at it and keeps its certificates fresh; returns
/// the server's task.
async fn serve_webhook(
    args: &Args,
    client: &kube::Client,
    listener: TcpListener,
    shutdown: &CancellationToken,
) -> Result<JoinHandle<Result<(), ServerError>>, AppError> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let guards: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let target = match &args.webhook_url {
        Some(url) => WebhookTarget::Url(url.clone()),
        None => WebhookTarget::Service {
            namespace: args.lease_namespace.clone(),
        },
    };
    if let Some(dir) = &args.webhook_cert_dir {
        let files = CertFiles::new(dir);
        let (served, serving) = files.load().map_err(AppError::WebhookCertificateFiles)?;
        let watching = files
            .start_watching()
            .map_err(AppError::WebhookCertificateFiles)?;
        let serving = Arc::new(serving);
        let webhook_server = spawn_webhook(client, listener, Arc::clone(&serving), shutdown);
        cert_files::point_at_if_ca(&served, (&crds, &guards, &target)).await;
        tracing::info!(listen = %args.webhook_listen, ?target, dir = %dir.display(), "conversion webhook serving, its certificate from files");
        tokio::spawn(cert_files::follow(
            files,
            watching,
            serving,
            (crds, guards, target),
            served,
            shutdown.clone(),
        ));
        return Ok(webhook_server);
    }
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &args.lease_namespace);
    let names = certs::serving_names(&args.lease_namespace);
    let webhook_certs = certs::ensure_secret(&secrets, &names, certs::unix_now())
        .await
        .map_err(AppError::WebhookCertificates)?;
    let serving = Arc::new(
        ServingCertificate::from_pem(&webhook_certs.cert, &webhook_certs.key)
            .map_err(AppError::ServingCertificate)?,
    );
    let webhook_server = spawn_webhook(client, listener, Arc::clone(&serving), shutdown);
    certs::inject_ca_bundle(&crds, &webhook_certs.ca_cert, Some(&target))
        .await
        .map_err(AppError::ConversionWebhook)?;
    tracing::info!(listen = %args.webhook_listen, ?target, "conversion webhook serving");
    certs::inject_guards(&guards, &webhook_certs.ca_cert, &target).await;
    tokio::spawn(certs::keep_fresh(
        secrets,
        crds,
        (guards, target.clone()),
        names,
        serving,
        webhook_certs,
        shutdown.clone(),
    ));
    Ok(webhook_server)
}

/// The webhook's server on `listener`, presenting `serving`: its routes
/// count Pets (the CRD guard) and list a store's (the store guard).
fn spawn_webhook(
    client: &kube::Client,
    listener: TcpListener,
    serving: Arc<ServingCertificate>,
    shutdown: &CancellationToken,
) -> JoinHandle<Result<(), ServerError>> {
    let counted: Api<Pet> = Api::all(client.clone());
    let count_pets: server::CountPets = Arc::new(move || Box::pin(guard::count(counted.clone())));
    let listing = client.clone();
    let store_pets: server::StorePets =
        Arc::new(move |store| Box::pin(store_guard::list_pets(listing.clone(), store)));
    tokio::spawn(server::serve(
        listener,
        serving,
        count_pets,
        store_pets,
        shutdown.clone().cancelled_owned(),
    ))
}

/// The store channel's TLS files: the flags', or with
/// `--store-certificates` the ones this operator makes (and keeps fresh
/// until `shutdown`). Its own CA and certificate must be ready before the
/// first store call; the store's Secret may fail (its namespace not there
/// yet) and is retried every minute.
async fn store_tls(
    args: &Args,
    client: &kube::Client,
    shutdown: &CancellationToken,
) -> Result<Option<TlsFiles>, AppError> {
    let Some(store_secret) = &args.store_certificates else {
        return Ok(args.petstore_tls.files());
    };
    let certs = StoreCertificates::new(
        client.clone(),
        store_secret,
        &args.petstore_addr,
        &crate::stores::tokens::ObserverAccount {
            namespace: args.lease_namespace.clone(),
            name: args.service_account.clone(),
        }
        .subject(),
        args.store_certificates_dir.clone(),
    );
    let now = crate::certs::unix_now();
    let own = certs
        .ensure_own(now)
        .await
        .map_err(AppError::StoreCertificates)?;
    match certs.ensure_store(&own, now).await {
        Ok(()) => tracing::info!(secret = %store_secret, "the store's certificate is ready"),
        Err(err) => tracing::warn!(
            error = %err,
            "cannot write the store's certificate yet; retrying every minute"
        ),
    }
    let files = certs.files();
    tokio::spawn(crate::certs::store::keep_fresh(certs, shutdown.clone()));
    Ok(Some(files))
}

/// Lists a Pet, to know the CRD is installed and Pets may be read. The API
/// server takes a moment to use the webhook settings just written to the
/// CRD; until then a Pet stored in another version cannot be read (its
/// conversion goes to the old address), so for [`WEBHOOK_SETTLING`] a
/// failed conversion is waited out.
async fn wait_for_pets(client: &kube::Client) -> Result<(), AppError> {
    let pets: Api<Pet> = Api::all(client.clone());
    let settling = std::time::Instant::now() + WEBHOOK_SETTLING;
    loop {
        match pets.list_metadata(&ListParams::default().limit(1)).await {
            Err(err) if std::time::Instant::now() < settling && conversion_failed(&err) => {
                tracing::info!(error = %err, "waiting for the API server to use the conversion webhook");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(err) => return Err(AppError::ListPets(err)),
            Ok(_) => return Ok(()),
        }
    }
}

/// Whether a read failed as one does while the API server cannot reach the
/// conversion webhook: an internal error (HTTP 500). Its Status says that
/// it was the conversion in its message's text alone, so the code is what
/// is matched; another internal error is retried as well, within the
/// settling time only.
fn conversion_failed(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 500)
}

/// `/metrics`, `/healthz` and `/readyz`, ready at once: the Kubernetes
/// client works by now. Returns the server's task.
fn serve_metrics(
    listener: TcpListener,
    metrics: &Arc<Metrics>,
    shutdown: &CancellationToken,
) -> JoinHandle<std::io::Result<()>> {
    let metrics_server = tokio::spawn(metrics::serve(
        listener,
        Arc::clone(metrics),
        shutdown.clone().cancelled_owned(),
    ));
    metrics.set_ready();
    metrics_server
}

/// The store client, the Event queue and the controller's context.
async fn build_controller(
    args: &Args,
    client: &kube::Client,
    tls: Option<TlsFiles>,
    metrics: &Arc<Metrics>,
    identity: &str,
    fault: Option<Fault>,
) -> Result<(Arc<Context>, EventQueue), AppError> {
    let store = GrpcPetStore::connect_lazy(
        &args.petstore_addr,
        args.petstore_timeout,
        tls.as_ref(),
        metrics.store_calls(),
    )?
    .with_limiter(
        StoreLimiter::new(
            args.store_concurrency_limit(),
            args.store_qps,
            args.store_burst,
        )
        .showing_in(metrics.store_calls().limits_of(&args.petstore_addr)),
    )
    .with_create_batching(if petstore_telemetry::spans_exported() {
        Duration::ZERO
    } else {
        args.create_batch_wait
    });
    let recorder = EventWriter::new(
        client.clone(),
        Reporter {
            controller: "petstore-operator".into(),
            instance: Some(identity.to_owned()),
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
        drift_storm: StormThreshold {
            share: args.drift_storm_share,
            min: args.drift_storm_min,
            window: args.drift_storm_window,
        },
        fault,
    };
    tracing::info!(store = %args.petstore_addr, tls = tls.is_some(), ?settings, %identity, "starting");
    let events = EventQueue::start(recorder, Arc::clone(metrics));
    let stores = Stores::start(
        client.clone(),
        store,
        ClientSettings {
            call_timeout: args.petstore_timeout,
            qps: args.store_qps,
            burst: args.store_burst,
            concurrency: args.store_concurrency_limit(),
            create_batch_wait: args.create_batch_wait,
            observer: Some(crate::stores::tokens::ObserverAccount {
                namespace: args.lease_namespace.clone(),
                name: args.service_account.clone(),
            }),
            own_audience: args.petstore_audience.clone(),
            status_interval: args.store_status_interval,
        },
        metrics.store_calls(),
    )
    .await;
    // Calls made for no Pet (the feed, claims, probes): as the observer
    // when the own store checks tenants.
    let store = Arc::clone(stores.own());
    let ctx = Arc::new(
        Context::new(
            client.clone(),
            store,
            events.clone(),
            Arc::clone(metrics),
            settings,
        )
        .with_stores(stores)
        .watching_uninstall(args.lease_namespace.clone()),
    );
    Ok((ctx, events))
}

/// Runs the controller: while this replica holds the Lease, with leader
/// election, otherwise until `shutdown`; either way only while this cluster
/// holds its claim on the installation's name in the store (see
/// [`claim`]). Failure as the exit code when leadership or the claim was
/// lost.
async fn lead(
    args: &Args,
    client: kube::Client,
    ctx: Arc<Context>,
    shutdown: &CancellationToken,
    metrics: &Metrics,
    identity: &str,
) -> Result<ExitCode, AppError> {
    let holder = cluster_identity(&client, &args.installation).await?;
    let store = Arc::clone(&ctx.store);
    let installation_claim = Claim {
        installation: &args.installation,
        holder: &holder,
        ttl: args.installation_claim_ttl,
    };
    let claimed = std::sync::Mutex::new(Claimed::Ended);
    // The controller, once the claim is granted and while it holds.
    let reconcile = |stop: CancellationToken| {
        let (store, claimed) = (&store, &claimed);
        async move {
            let ended = claim::run_while_claimed(
                store.as_ref(),
                installation_claim,
                &stop,
                metrics,
                |stop| controller::run(ctx, stop),
            )
            .await;
            *claimed
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = ended;
        }
    };
    let claim_lost = || {
        *claimed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            == Claimed::Lost
    };
    if !args.leader_election {
        reconcile(shutdown.clone()).await;
        if claim_lost() {
            tracing::error!(installation = %args.installation, "lost the installation's claim; exiting");
            return Ok(ExitCode::FAILURE);
        }
        return Ok(ExitCode::SUCCESS);
    }
    let lease = Lease {
        namespace: &args.lease_namespace,
        name: &args.lease_name,
        identity,
        duration: args.lease_duration,
    };
    let reign = leader::run_while_leading(client, lease, shutdown, metrics, reconcile).await?;
    if claim_lost() {
        // Another cluster may be reconciling this installation already:
        // stop at once, and come back to wait for the claim.
        tracing::error!(installation = %args.installation, "lost the installation's claim; exiting");
        return Ok(ExitCode::FAILURE);
    }
    if reign == Reign::Lost {
        // Another replica may already be reconciling: stop at once and
        // let Kubernetes restart us as a standby.
        tracing::error!("lost leadership; exiting");
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// This cluster's identity in its installation's claim: the UID of its
/// `kube-system` Namespace, the same for every replica and restart, and new
/// in a rebuilt cluster. The unnamed installation claims nothing, so needs
/// none.
async fn cluster_identity(client: &kube::Client, installation: &str) -> Result<String, AppError> {
    if installation.is_empty() {
        return Ok(String::new());
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let kube_system = namespaces
        .get("kube-system")
        .await
        .map_err(AppError::ClusterIdentity)?;
    Ok(kube_system.metadata.uid.unwrap_or_default())
}

/// Stops the rest once the controller has stopped: whatever stopped it
/// stops the servers too (a replica that lost the Lease must exit, not go
/// on serving /healthz as a live one), and queued Events get a moment to
/// reach the API.
async fn shut_down(
    shutdown: &CancellationToken,
    events: &EventQueue,
    webhook_server: JoinHandle<Result<(), ServerError>>,
    metrics_server: JoinHandle<std::io::Result<()>>,
) {
    shutdown.cancel();
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16) -> kube::Error {
        let status = kube::core::Status::failure(
            "conversion webhook for petstore.example.com/v1alpha1, Kind=Pet failed",
            "InternalError",
        )
        .with_code(code);
        kube::Error::Api(status.boxed())
    }

    #[test]
    fn only_an_internal_error_is_waited_out_as_a_conversion_not_yet_settled() {
        assert!(conversion_failed(&api_error(500)));
        // Forbidden or not found (no CRD) stop the operator at once.
        assert!(!conversion_failed(&api_error(403)));
        assert!(!conversion_failed(&api_error(404)));
    }

    #[test]
    fn errors_say_what_failed_and_why() {
        let error = AppError::ListPets(api_error(403));
        let text = error.to_string();
        assert!(
            text.starts_with("cannot list Pets; is the CRD installed"),
            "{text}"
        );
        assert!(
            std::error::Error::source(&error).is_some(),
            "the kube error is the source"
        );
    }
}
