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

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    ServiceReference, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::core::ObjectMeta;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::server::ServingCertificate;

use crate::crd::{
    CRD_GUARD_CONFIGURATION, CRD_GUARD_PATH, CRD_NAME, STORE_GUARD_CONFIGURATION, STORE_GUARD_PATH,
    WEBHOOK_PATH, WEBHOOK_SERVICE, WEBHOOK_SERVICE_PORT,
};

/// The Secret all replicas share, in the operator's namespace.
pub const SECRET_NAME: &str = "petstore-operator-webhook-tls";
/// How long the CA is valid: it outlives any release, so the CRD's CA
/// bundle stays put while serving certificates rotate under it.
pub const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// How long a serving certificate is valid. Re-issued with a third left
/// (30 days), so every replica has weeks to pick up the new one.
pub const SERVING_VALIDITY: Duration = Duration::from_secs(90 * 24 * 3600);
/// How often each replica re-reads the Secret (renewing if due, reloading
/// what another replica renewed) and re-checks the CRD's CA bundle.
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(60);

const CA_CERT_KEY: &str = "ca.crt";
const CA_KEY_KEY: &str = "ca.key";
const TLS_CERT_KEY: &str = "tls.crt";
const TLS_KEY_KEY: &str = "tls.key";
/// The serving certificate's validity, in Unix seconds, so renewal needs
/// no X.509 parser.
const NOT_BEFORE_ANNOTATION: &str = "petstore.example.com/serving-not-before";
const NOT_AFTER_ANNOTATION: &str = "petstore.example.com/serving-not-after";
const CA_COMMON_NAME: &str = "petstore-operator-webhook-ca";

#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("making the webhook certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("{action} (Secret {SECRET_NAME}): {source}")]
    Secret {
        action: &'static str,
        #[source]
        source: kube::Error,
    },
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
    #[error("the Secret {SECRET_NAME} kept changing under us; giving up for now")]
    Contended,
}

/// The CA and the serving certificate, PEM, as kept in the Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebhookCerts {
    pub ca_cert: String,
    pub ca_key: String,
    pub cert: String,
    pub key: String,
    /// The serving certificate's validity, Unix seconds.
    pub not_before: i64,
    pub not_after: i64,
}

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

/// Now, in Unix seconds.
pub fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

fn at(secs: i64) -> time::OffsetDateTime {
    time::OffsetDateTime::from_unix_timestamp(secs).unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

/// The CA's parameters; the same every time, so the CA key from the Secret
/// signs serving certificates without parsing the CA certificate back.
fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, CA_COMMON_NAME);
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

/// A validity window from an hour before `now` (the API server's clock may
/// lag ours) for `validity`.
fn window(now: i64, validity: Duration) -> (i64, i64) {
    (now - 3600, now + validity.as_secs() as i64)
}

impl WebhookCerts {
    /// A new CA and a serving certificate for `names`.
    pub fn generate(names: &[String], now: i64) -> Result<Self, CertError> {
        let ca_key = KeyPair::generate()?;
        let mut params = ca_params();
        let (not_before, not_after) = window(now, CA_VALIDITY);
        params.not_before = at(not_before);
        params.not_after = at(not_after);
        let ca_cert = params.self_signed(&ca_key)?.pem();
        let ca_key = ca_key.serialize_pem();
        let placeholder = Self {
            ca_cert,
            ca_key,
            cert: String::new(),
            key: String::new(),
            not_before: 0,
            not_after: 0,
        };
        placeholder.renew_serving(names, now)
    }

    /// A new serving certificate for `names`, signed by the same CA.
    pub fn renew_serving(&self, names: &[String], now: i64) -> Result<Self, CertError> {
        let issuer = Issuer::new(ca_params(), KeyPair::from_pem(&self.ca_key)?);
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(names.to_vec())?;
        let mut name = DistinguishedName::new();
        name.push(DnType::CommonName, WEBHOOK_SERVICE);
        params.distinguished_name = name;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.use_authority_key_identifier_extension = true;
        let (not_before, not_after) = window(now, SERVING_VALIDITY);
        params.not_before = at(not_before);
        params.not_after = at(not_after);
        let cert = params.signed_by(&key, &issuer)?;
        Ok(Self {
            cert: cert.pem(),
            key: key.serialize_pem(),
            not_before,
            not_after,
            ..self.clone()
        })
    }

    /// Due for renewal: less than a third of the serving certificate's
    /// validity is left.
    pub fn needs_renewal(&self, now: i64) -> bool {
        let third = (self.not_after - self.not_before) / 3;
        now >= self.not_after - third
    }

    pub fn to_secret(&self) -> Secret {
        let data = [
            (CA_CERT_KEY, &self.ca_cert),
            (CA_KEY_KEY, &self.ca_key),
            (TLS_CERT_KEY, &self.cert),
            (TLS_KEY_KEY, &self.key),
        ]
        .into_iter()
        .map(|(key, pem)| (key.to_owned(), ByteString(pem.as_bytes().to_vec())))
        .collect();
        Secret {
            metadata: ObjectMeta {
                name: Some(SECRET_NAME.into()),
                labels: Some(BTreeMap::from([(
                    "app.kubernetes.io/name".to_owned(),
                    "petstore-operator".to_owned(),
                )])),
                annotations: Some(BTreeMap::from([
                    (
                        NOT_BEFORE_ANNOTATION.to_owned(),
                        self.not_before.to_string(),
                    ),
                    (NOT_AFTER_ANNOTATION.to_owned(), self.not_after.to_string()),
                ])),
                ..ObjectMeta::default()
            },
            type_: Some("kubernetes.io/tls".into()),
            data: Some(data),
            ..Secret::default()
        }
    }

    /// `None` if the Secret lacks a key or holds something unreadable.
    pub fn from_secret(secret: &Secret) -> Option<Self> {
        let data = secret.data.as_ref()?;
        let text = |key: &str| -> Option<String> {
            String::from_utf8(data.get(key)?.0.clone())
                .ok()
                .filter(|text| !text.is_empty())
        };
        let annotations = secret.metadata.annotations.as_ref()?;
        let number = |key: &str| annotations.get(key)?.parse::<i64>().ok();
        let certs = Self {
            ca_cert: text(CA_CERT_KEY)?,
            ca_key: text(CA_KEY_KEY)?,
            cert: text(TLS_CERT_KEY)?,
            key: text(TLS_KEY_KEY)?,
            not_before: number(NOT_BEFORE_ANNOTATION)?,
            not_after: number(NOT_AFTER_ANNOTATION)?,
        };
        // The CA key must still sign, or renewal would fail later.
        KeyPair::from_pem(&certs.ca_key).ok()?;
        Some(certs)
    }
}

fn is_conflict(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 409)
}

/// The shared certificates: read, created if absent, renewed if due.
/// Every replica calling this at once ends up with the same Secret.
pub async fn ensure_secret(
    secrets: &Api<Secret>,
    names: &[String],
    now: i64,
) -> Result<WebhookCerts, CertError> {
    let secret_error =
        |action: &'static str| move |source: kube::Error| CertError::Secret { action, source };
    for _ in 0..5 {
        let existing = secrets
            .get_opt(SECRET_NAME)
            .await
            .map_err(secret_error("reading"))?;
        let Some(existing) = existing else {
            let certs = WebhookCerts::generate(names, now)?;
            match secrets
                .create(&PostParams::default(), &certs.to_secret())
                .await
            {
                Ok(_) => {
                    tracing::info!(secret = SECRET_NAME, "created the webhook certificates");
                    return Ok(certs);
                }
                // Another replica created it first: use theirs.
                Err(err) if is_conflict(&err) => continue,
                Err(err) => return Err(secret_error("creating")(err)),
            }
        };
        let renewed = match WebhookCerts::from_secret(&existing) {
            Some(certs) if !certs.needs_renewal(now) => return Ok(certs),
            Some(certs) => certs.renew_serving(names, now)?,
            None => {
                tracing::warn!(
                    secret = SECRET_NAME,
                    "the webhook Secret is incomplete; making a new CA"
                );
                WebhookCerts::generate(names, now)?
            }
        };
        let mut replacement = renewed.to_secret();
        // Replace only what we read: a replica that renewed meanwhile wins.
        replacement.metadata.resource_version = existing.metadata.resource_version.clone();
        match secrets
            .replace(SECRET_NAME, &PostParams::default(), &replacement)
            .await
        {
            Ok(_) => {
                tracing::info!(
                    secret = SECRET_NAME,
                    not_after = renewed.not_after,
                    "renewed the webhook serving certificate"
                );
                return Ok(renewed);
            }
            Err(err) if is_conflict(&err) => continue,
            Err(err) => return Err(secret_error("renewing")(err)),
        }
    }
    Err(CertError::Contended)
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
) -> Result<bool, CertError> {
    let crd = crds.get(CRD_NAME).await.map_err(|source| CertError::Crd {
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
        .map_err(|source| CertError::Crd {
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
) -> Result<bool, CertError> {
    let configuration = guard.configuration;
    let guard_error = |action| {
        move |source| CertError::Guard {
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
        for guard in GUARDS {
            if let Err(err) = inject_guard(&guards, guard, &current.ca_cert, &target).await {
                tracing::warn!(error = %err, "cannot check {}", guard.what);
            }
        }
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
    fn a_renewal_keeps_the_ca_and_changes_the_serving_certificate() {
        let first = WebhookCerts::generate(&names(), NOW).expect("generate");
        assert!(first.ca_cert.contains("BEGIN CERTIFICATE"));
        assert!(first.cert.contains("BEGIN CERTIFICATE"));
        assert_eq!(
            first.not_after - first.not_before,
            SERVING_VALIDITY.as_secs() as i64 + 3600
        );
        let later = NOW + 70 * 24 * 3600;
        let renewed = first.renew_serving(&names(), later).expect("renew");
        assert_eq!(renewed.ca_cert, first.ca_cert);
        assert_eq!(renewed.ca_key, first.ca_key);
        assert_ne!(renewed.cert, first.cert);
        assert_ne!(renewed.key, first.key);
        assert!(renewed.not_after > first.not_after);
    }

    #[test]
    fn renewal_is_due_with_a_third_of_the_validity_left() {
        let certs = WebhookCerts::generate(&names(), NOW).expect("generate");
        let third = (certs.not_after - certs.not_before) / 3;
        assert!(!certs.needs_renewal(NOW));
        assert!(!certs.needs_renewal(certs.not_after - third - 1));
        assert!(certs.needs_renewal(certs.not_after - third));
        assert!(certs.needs_renewal(certs.not_after + 1));
    }

    #[test]
    fn the_secret_holds_everything_and_reads_back() {
        let certs = WebhookCerts::generate(&names(), NOW).expect("generate");
        let secret = certs.to_secret();
        assert_eq!(secret.metadata.name.as_deref(), Some(SECRET_NAME));
        assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
        assert_eq!(WebhookCerts::from_secret(&secret), Some(certs.clone()));

        let mut incomplete = secret.clone();
        if let Some(data) = incomplete.data.as_mut() {
            data.remove(CA_KEY_KEY);
        }
        assert_eq!(WebhookCerts::from_secret(&incomplete), None);
        let mut garbled = secret;
        if let Some(data) = garbled.data.as_mut() {
            data.insert(CA_KEY_KEY.into(), ByteString(b"not a key".to_vec()));
        }
        assert_eq!(WebhookCerts::from_secret(&garbled), None);
    }

    #[test]
    fn the_serving_certificate_names_the_service_and_loopback() {
        let names = names();
        assert!(names.contains(&"petstore-operator-metrics.petstore-system.svc".to_owned()));
        assert!(names.contains(&"127.0.0.1".to_owned()));
    }
}
