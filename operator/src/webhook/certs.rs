//! The webhook's certificates, without cert-manager or any other component:
//! a CA and a serving certificate it signs, kept in one Secret in the
//! operator's namespace that every replica shares, and the CA in the CRD's
//! `spec.conversion.webhook.clientConfig.caBundle`.
//!
//! The CA is long-lived ([`CA_VALIDITY`]) and only the serving certificate
//! rotates ([`SERVING_VALIDITY`], re-issued with a third of it left), so the
//! CA bundle never changes while the Secret lives and no old+new bundle is
//! needed. Replicas race with the API server's optimistic concurrency:
//! create-if-absent, and on 409 read the winner's; a renewal replaces the
//! Secret at the resourceVersion it read, and the loser reads the winner's.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    ServiceReference, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::server::ServingCertificate;

pub use crate::certs::unix_now;
use crate::certs::{CaAndLeaf, CertError, Profile, Usage};
use crate::crd::{
    CRD_GUARD_CONFIGURATION, CRD_GUARD_PATH, CRD_NAME, STORE_GUARD_CONFIGURATION, STORE_GUARD_PATH,
    WEBHOOK_PATH, WEBHOOK_SERVICE, WEBHOOK_SERVICE_PORT,
};

/// The Secret all replicas share, in the operator's namespace.
pub const SECRET_NAME: &str = "petstore-operator-webhook-tls";
/// The webhook's CA and serving certificate.
pub const WEBHOOK: Profile = Profile {
    secret: SECRET_NAME,
    ca_common_name: "petstore-operator-webhook-ca",
    leaf_common_name: std::borrow::Cow::Borrowed(WEBHOOK_SERVICE),
    usage: Usage::Server,
};
/// How often each replica re-reads the Secret (renewing if due, reloading
/// what another replica renewed) and re-checks the CRD's CA bundle.
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error(transparent)]
    Certificates(#[from] CertError),
    #[error("{action} (CRD {CRD_NAME}): {source}")]
    Crd {
        action: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error("{action} (ValidatingWebhookConfiguration {configuration}): {source}")]
    Guard {
        configuration: &'static str,
        action: &'static str,
        #[source]
        source: kube::Error,
    },
}

/// The CA and the serving certificate, PEM, as kept in the Secret.
pub type WebhookCerts = CaAndLeaf;

/// The names the serving certificate is valid for: the Service in
/// `namespace` by every name the API server may use, and 127.0.0.1 for an
/// operator run as a local process.
pub fn serving_names(namespace: &str) -> Vec<String> {
    vec![
        WEBHOOK_SERVICE.to_owned(),
        format!("{WEBHOOK_SERVICE}.{namespace}"),
        format!("{WEBHOOK_SERVICE}.{namespace}.svc"),
        format!("{WEBHOOK_SERVICE}.{namespace}.svc.cluster.local"),
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
    ]
}

/// The shared certificates: read, created if absent, renewed if due.
/// Every replica calling this at once ends up with the same Secret.
pub async fn ensure_secret(
    secrets: &Api<Secret>,
    names: &[String],
    now: i64,
) -> Result<WebhookCerts, CertError> {
    crate::certs::ensure_ca_and_leaf(secrets, &WEBHOOK, names, now).await
}

/// Where the API server reaches the webhook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WebhookTarget {
    /// Through the Service in this namespace (in a cluster).
    Service { namespace: String },
    /// At this URL (an operator run as a local process).
    Url(String),
}

/// Makes the CRD's conversion webhook trust `ca_cert`, and, with
/// `point_at`, reach `point_at`. Returns whether it changed the CRD. Only
/// patches on a difference: every replica calls this every minute.
pub async fn inject_ca_bundle(
    crds: &Api<CustomResourceDefinition>,
    ca_cert: &str,
    point_at: Option<&WebhookTarget>,
) -> Result<bool, WebhookError> {
    let crd = crds
        .get(CRD_NAME)
        .await
        .map_err(|source| WebhookError::Crd {
            action: "reading",
            source,
        })?;
    let client_config = crd
        .spec
        .conversion
        .as_ref()
        .filter(|conversion| conversion.strategy == "Webhook")
        .and_then(|conversion| conversion.webhook.as_ref())
        .and_then(|webhook| webhook.client_config.as_ref());
    let bundle_current = client_config
        .and_then(|config| config.ca_bundle.as_ref())
        .is_some_and(|bundle| bundle.0 == ca_cert.as_bytes());
    let target_current = match point_at {
        None => client_config.is_some_and(|c| c.url.is_some() || c.service.is_some()),
        Some(WebhookTarget::Url(url)) => client_config.is_some_and(|c| c.url.as_ref() == Some(url)),
        Some(WebhookTarget::Service { namespace }) => client_config.is_some_and(|c| {
            c.url.is_none()
                && c.service
                    .as_ref()
                    .is_some_and(|s| s.name == WEBHOOK_SERVICE && &s.namespace == namespace)
        }),
    };
    if bundle_current && target_current {
        return Ok(false);
    }
    let bundle = ByteString(ca_cert.as_bytes().to_vec());
    let mut config = json!({ "caBundle": bundle });
    let target = point_at.cloned().or_else(|| {
        // The CRD lost its target (re-applied without one): the Service.
        (!target_current).then(|| WebhookTarget::Service {
            namespace: crate::crd::WEBHOOK_SERVICE_NAMESPACE.into(),
        })
    });
    match target {
        Some(WebhookTarget::Url(url)) => {
            config["url"] = url.into();
            config["service"] = serde_json::Value::Null;
        }
        Some(WebhookTarget::Service { namespace }) => {
            config["url"] = serde_json::Value::Null;
            config["service"] = json!({
                "name": WEBHOOK_SERVICE,
                "namespace": namespace,
                "path": WEBHOOK_PATH,
                "port": WEBHOOK_SERVICE_PORT,
            });
        }
        None => {}
    }
    let patch = json!({"spec": {"conversion": {
        "strategy": "Webhook",
        "webhook": {"conversionReviewVersions": ["v1"], "clientConfig": config},
    }}});
    crds.patch(CRD_NAME, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|source| WebhookError::Crd {
            action: "injecting the CA bundle into",
            source,
        })?;
    tracing::info!(
        crd = CRD_NAME,
        "pointed the conversion webhook at this operator's CA"
    );
    Ok(true)
}

/// A ValidatingWebhookConfiguration this operator serves: the route it
/// names, on the conversion webhook's server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Guard {
    pub configuration: &'static str,
    pub path: &'static str,
    /// What it guards, for log lines.
    pub what: &'static str,
}

/// The Pet CRD's deletion guard (`config/operator/crd-guard.yaml`).
pub const CRD_GUARD: Guard = Guard {
    configuration: CRD_GUARD_CONFIGURATION,
    path: CRD_GUARD_PATH,
    what: "the CRD deletion guard",
};
/// The guard on deleting stores in use (`config/operator/store-guard.yaml`).
pub const STORE_GUARD: Guard = Guard {
    configuration: STORE_GUARD_CONFIGURATION,
    path: STORE_GUARD_PATH,
    what: "the store deletion guard",
};
/// Every guard the operator points at itself.
pub const GUARDS: [Guard; 2] = [CRD_GUARD, STORE_GUARD];

/// A guard's address beside the conversion webhook's `convert_url`: the
/// same host and port, the guard's `path`.
pub fn guard_url(convert_url: &str, path: &str) -> String {
    let host_start = convert_url.find("://").map_or(0, |i| i + 3);
    let path_start = convert_url[host_start..]
        .find('/')
        .map_or(convert_url.len(), |i| host_start + i);
    format!("{}{path}", &convert_url[..path_start])
}

/// The guard's client config for `target`, trusting `ca_cert`.
fn guard_client_config(ca_cert: &str, target: &WebhookTarget, path: &str) -> WebhookClientConfig {
    let ca_bundle = Some(ByteString(ca_cert.as_bytes().to_vec()));
    match target {
        WebhookTarget::Url(url) => WebhookClientConfig {
            ca_bundle,
            url: Some(guard_url(url, path)),
            service: None,
        },
        WebhookTarget::Service { namespace } => WebhookClientConfig {
            ca_bundle,
            url: None,
            service: Some(ServiceReference {
                name: WEBHOOK_SERVICE.into(),
                namespace: namespace.clone(),
                path: Some(path.into()),
                port: Some(WEBHOOK_SERVICE_PORT),
            }),
        },
    }
}

/// Makes `guard`'s ValidatingWebhookConfiguration, if it is installed,
/// trust `ca_cert` and reach `target`; returns whether it changed it. A
/// guard that is not installed stays so: deleting it is how a user goes
/// around it on purpose.
pub async fn inject_guard(
    configs: &Api<ValidatingWebhookConfiguration>,
    guard: Guard,
    ca_cert: &str,
    target: &WebhookTarget,
) -> Result<bool, WebhookError> {
    let configuration = guard.configuration;
    let guard_error = |action| {
        move |source| WebhookError::Guard {
            configuration,
            action,
            source,
        }
    };
    let Some(config) = configs
        .get_opt(configuration)
        .await
        .map_err(guard_error("reading"))?
    else {
        return Ok(false);
    };
    let wanted = guard_client_config(ca_cert, target, guard.path);
    let webhooks = config.webhooks.unwrap_or_default();
    if webhooks
        .iter()
        .all(|webhook| webhook.client_config == wanted)
    {
        return Ok(false);
    }
    // A strategic merge by webhook name; the null removes the other way
    // of reaching it.
    let mut client_config = serde_json::to_value(&wanted).unwrap_or_default();
    match target {
        WebhookTarget::Url(_) => client_config["service"] = serde_json::Value::Null,
        WebhookTarget::Service { .. } => client_config["url"] = serde_json::Value::Null,
    }
    let patch = json!({"webhooks": webhooks
        .iter()
        .map(|webhook| json!({"name": webhook.name, "clientConfig": client_config}))
        .collect::<Vec<_>>()});
    configs
        .patch(
            configuration,
            &PatchParams::default(),
            &Patch::Strategic(&patch),
        )
        .await
        .map_err(guard_error("pointing at this operator"))?;
    tracing::info!(configuration, "pointed {} at this operator", guard.what);
    Ok(true)
}

/// Points every deletion guard in [`GUARDS`] at `target` with `ca_cert`;
/// a failure is logged and retried at the next check. A guard that cannot
/// reach the operator refuses what it guards: nothing is lost meanwhile.
pub async fn inject_guards(
    configs: &Api<ValidatingWebhookConfiguration>,
    ca_cert: &str,
    target: &WebhookTarget,
) {
    for guard in GUARDS {
        if let Err(err) = inject_guard(configs, guard, ca_cert, target).await {
            tracing::warn!(error = %err, "cannot point {} at this operator", guard.what);
        }
    }
}

/// Every [`REFRESH_INTERVAL`] until `stop`: renews the serving certificate
/// when due (or picks up another replica's renewal) and swaps it into the
/// running server, and puts the CA bundle back if the CRD or a deletion
/// guard lost it (a `kubectl apply` of config/ does). Failures are logged and retried:
/// the current certificate stays valid for weeks.
pub async fn keep_fresh(
    secrets: Api<Secret>,
    crds: Api<CustomResourceDefinition>,
    (guards, target): (Api<ValidatingWebhookConfiguration>, WebhookTarget),
    names: Vec<String>,
    serving: Arc<ServingCertificate>,
    mut current: WebhookCerts,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(REFRESH_INTERVAL) => {}
        }
        match ensure_secret(&secrets, &names, unix_now()).await {
            Ok(latest) if latest != current => match serving.replace(&latest.cert, &latest.key) {
                Ok(()) => {
                    tracing::info!(
                        not_after = latest.not_after,
                        "serving the renewed webhook certificate"
                    );
                    current = latest;
                }
                Err(err) => {
                    tracing::warn!(error = %err, "cannot load the renewed webhook certificate")
                }
            },
            Ok(_) => {}
            Err(err) => tracing::warn!(error = %err, "cannot check the webhook certificates"),
        }
        if let Err(err) = inject_ca_bundle(&crds, &current.ca_cert, None).await {
            tracing::warn!(error = %err, "cannot check the CRD's CA bundle");
        }
        inject_guards(&guards, &current.ca_cert, &target).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000;

    #[test]
    fn the_guard_is_reached_where_the_conversion_webhook_is() {
        assert_eq!(
            guard_url("https://127.0.0.1:9443/convert", CRD_GUARD_PATH),
            "https://127.0.0.1:9443/guard-crd-deletion"
        );
        assert_eq!(
            guard_url("https://host.example:8443", CRD_GUARD_PATH),
            "https://host.example:8443/guard-crd-deletion"
        );
        assert_eq!(
            guard_url("https://127.0.0.1:9443/convert", STORE_GUARD_PATH),
            "https://127.0.0.1:9443/validate-store-deletion"
        );
        let in_cluster = guard_client_config(
            "CA",
            &WebhookTarget::Service {
                namespace: "petstore-system".into(),
            },
            CRD_GUARD_PATH,
        );
        let service = in_cluster.service.expect("a service");
        assert_eq!(
            (service.name.as_str(), service.path.as_deref(), service.port),
            (
                WEBHOOK_SERVICE,
                Some(CRD_GUARD_PATH),
                Some(WEBHOOK_SERVICE_PORT)
            )
        );
        assert_eq!(in_cluster.ca_bundle, Some(ByteString(b"CA".to_vec())));
    }

    fn names() -> Vec<String> {
        serving_names("petstore-system")
    }

    #[test]
    fn the_webhook_secret_is_the_one_its_role_names() {
        let certs = WebhookCerts::generate(&WEBHOOK, &names(), NOW).expect("generate");
        let secret = certs.to_secret(&WEBHOOK);
        assert_eq!(secret.metadata.name.as_deref(), Some(SECRET_NAME));
        assert_eq!(WebhookCerts::from_secret(&secret), Some(certs));
    }

    #[test]
    fn the_serving_certificate_names_the_service_and_loopback() {
        let names = names();
        assert!(names.contains(&"petstore-operator-metrics.petstore-system.svc".to_owned()));
        assert!(names.contains(&"127.0.0.1".to_owned()));
    }
}
