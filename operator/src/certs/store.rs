//! Mutual TLS between the operator and its store, made by the operator
//! (`--store-certificates`), as `config/` runs it by default:
//!
//! - a CA and the operator's client certificate, in Secret
//!   [`CLIENT_SECRET`], shared by every replica;
//! - the store's serving certificate, signed by that CA, with the CA beside
//!   it to check clients by, in the Secret `--store-certificates` names,
//!   which the store's Pod mounts.
//!
//! Both live in the store's namespace: an uninstall of the operator (its
//! namespace deleted) keeps the CA the store trusts, so an operator
//! installed again connects at once.
//!
//! The operator writes its own certificate to files
//! (`--store-certificates-dir`) and reads them as it reads files from any
//! other source: a renewal reaches the channel through the same reload.
//! The store's Secret reaches the store through its volume, which its
//! file watch follows.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use tokio_util::sync::CancellationToken;

use super::{
    CA_CERT_KEY, CaAndLeaf, CertError, Leaf, Profile, TLS_CERT_KEY, TLS_KEY_KEY, Usage,
    ensure_ca_and_leaf,
};
use crate::shared_object::{NamespacedName, Wanted, ensure};
use crate::store::grpc::TlsFiles;

/// The Secret with the CA and the operator's client certificate, beside
/// the store's. `grpcurl` can use its `ca.crt`, `tls.crt` and
/// `tls.key` as the operator does.
pub const CLIENT_SECRET: &str = "petstore-store-client";
/// The CA and the operator's client certificate, whose CN is the
/// operator's ServiceAccount principal (`system:serviceaccount:<namespace>:<name>`):
/// a store with tenancy reads it as the identity the call's token must
/// match, or be carried by one of its observers.
pub fn client_profile(principal: &str) -> Profile {
    Profile {
        secret: CLIENT_SECRET,
        ca_common_name: "petstore-store-ca",
        leaf_common_name: principal.to_owned().into(),
        usage: Usage::Client,
    }
}
const STORE_COMMON_NAME: &str = "petstore";
/// The names the store's certificate was made for, comma-separated: a
/// changed `--petstore-addr` makes a new one.
const NAMES_ANNOTATION: &str = "petstore.example.com/serving-names";
/// How often each replica re-reads both Secrets: renewing when due, taking
/// up another replica's renewal, putting back a store Secret deleted.
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(60);

/// The host of a store address (`host:port` or a URL).
pub fn address_host(address: &str) -> &str {
    let rest = address.split_once("://").map_or(address, |(_, rest)| rest);
    let authority = rest.split('/').next().unwrap_or(rest);
    match authority.strip_prefix('[') {
        Some(bracketed) => bracketed.split(']').next().unwrap_or(bracketed),
        None => authority.split(':').next().unwrap_or(authority),
    }
}

/// The names the store's certificate is valid for: `host`, a Service's
/// shorter names when `host` is one (`svc.ns.svc.cluster.local`), and
/// loopback, for a port-forward and grpcurl.
pub fn store_names(host: &str) -> Vec<String> {
    let mut names = vec![host.to_owned()];
    let service = host
        .strip_suffix(".svc.cluster.local")
        .or_else(|| host.strip_suffix(".svc"))
        .and_then(|rest| rest.split_once('.'))
        .filter(|(service, namespace)| !service.is_empty() && !namespace.contains('.'));
    if let Some((service, namespace)) = service {
        names.extend([
            service.to_owned(),
            format!("{service}.{namespace}"),
            format!("{service}.{namespace}.svc"),
            format!("{service}.{namespace}.svc.cluster.local"),
        ]);
    }
    names.extend(["localhost".to_owned(), "127.0.0.1".to_owned()]);
    let mut seen = std::collections::HashSet::new();
    names.retain(|name| seen.insert(name.clone()));
    names
}

/// Both Secrets and the operator's files.
#[derive(Clone)]
pub struct StoreCertificates {
    /// The store's namespace, where both Secrets live.
    secrets: Api<Secret>,
    /// The CA and the operator's own certificate, named for its principal.
    client: Profile,
    store_secret: String,
    store_names: Vec<String>,
    dir: PathBuf,
}

impl StoreCertificates {
    /// `principal`: the operator's ServiceAccount, as its certificate names it.
    pub fn new(
        client: kube::Client,
        store_secret: &NamespacedName,
        store_address: &str,
        principal: &str,
        dir: PathBuf,
    ) -> Self {
        Self {
            secrets: Api::namespaced(client, &store_secret.namespace),
            client: client_profile(principal),
            store_secret: store_secret.name.clone(),
            store_names: store_names(address_host(store_address)),
            dir,
        }
    }

    /// The files the store client reads: the CA and the operator's own
    /// certificate.
    pub fn files(&self) -> TlsFiles {
        TlsFiles {
            ca: Some(self.dir.join(CA_CERT_KEY)),
            client_cert_and_key: Some((self.dir.join(TLS_CERT_KEY), self.dir.join(TLS_KEY_KEY))),
            server_name: None,
        }
    }

    /// The CA and the operator's certificate, made if absent, renewed if
    /// due or made for another name, and written to the files.
    pub async fn ensure_own(&self, now: i64) -> Result<CaAndLeaf, CertError> {
        // A client certificate names no host.
        let own = ensure_ca_and_leaf(&self.secrets, &self.client, &[], now).await?;
        write_files(&self.dir, &own).await?;
        Ok(own)
    }

    /// The store's Secret: made if absent, and made again if it is not
    /// from `ca`, not for today's names, or due for renewal.
    pub async fn ensure_store(&self, ca: &CaAndLeaf, now: i64) -> Result<(), CertError> {
        let names = self.store_names.join(",");
        Ok(ensure(&self.secrets, &self.store_secret, |existing| {
            let current = existing.and_then(|secret| {
                let leaf = Leaf::from_secret(secret)?;
                let made_for = secret
                    .metadata
                    .annotations
                    .as_ref()?
                    .get(NAMES_ANNOTATION)?;
                (leaf.ca_cert == ca.ca_cert && *made_for == names && !leaf.needs_renewal(now))
                    .then_some(())
            });
            if current.is_some() {
                return Ok(Wanted::Keep(()));
            }
            let leaf = ca.issue_other(
                &self.client,
                STORE_COMMON_NAME,
                Usage::Server,
                &self.store_names,
                now,
            )?;
            let secret = leaf.to_secret(&self.store_secret, (NAMES_ANNOTATION, names.clone()));
            Ok::<_, CertError>(Wanted::Write((), Box::new(secret)))
        })
        .await?)
    }
}

/// Writes the CA, the certificate and its key to `dir`, each by a rename
/// (a reader never sees half a file), the key before its certificate, and
/// only those that changed, so an unchanged Secret wakes no file watch.
async fn write_files(dir: &Path, certs: &CaAndLeaf) -> Result<(), CertError> {
    let files_error = |path: &Path| {
        let path = path.to_owned();
        move |source| CertError::Files { path, source }
    };
    tokio::fs::create_dir_all(dir)
        .await
        .map_err(files_error(dir))?;
    for (name, pem) in [
        (TLS_KEY_KEY, &certs.key),
        (TLS_CERT_KEY, &certs.cert),
        (CA_CERT_KEY, &certs.ca_cert),
    ] {
        let path = dir.join(name);
        if tokio::fs::read(&path).await.ok().as_deref() == Some(pem.as_bytes()) {
            continue;
        }
        let partial = dir.join(format!(".{name}.partial"));
        tokio::fs::write(&partial, pem)
            .await
            .map_err(files_error(&partial))?;
        tokio::fs::rename(&partial, &path)
            .await
            .map_err(files_error(&path))?;
    }
    Ok(())
}

/// Every [`REFRESH_INTERVAL`] until `stop`: both Secrets checked, renewed
/// or put back, and the operator's files rewritten when its certificate
/// changed. Failures are logged and retried: the certificates in use stay
/// valid for weeks.
pub async fn keep_fresh(certs: StoreCertificates, stop: CancellationToken) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(REFRESH_INTERVAL) => {}
        }
        let now = super::unix_now();
        match certs.ensure_own(now).await {
            Ok(own) => {
                if let Err(err) = certs.ensure_store(&own, now).await {
                    tracing::warn!(error = %err, "cannot check the store's certificate");
                }
            }
            Err(err) => tracing::warn!(error = %err, "cannot check the store channel's CA"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::api_server::{ApiServerVerifier, failure};

    const OPERATOR: &str = "system:serviceaccount:petstore-system:petstore-operator";

    #[test]
    fn the_host_comes_from_any_address_form() {
        for (address, host) in [
            (
                "petstore-service.petstore.svc.cluster.local:6742",
                "petstore-service.petstore.svc.cluster.local",
            ),
            ("https://store.example:443/", "store.example"),
            ("http://127.0.0.1:6742", "127.0.0.1"),
            ("[::1]:6742", "::1"),
            ("store", "store"),
        ] {
            assert_eq!(address_host(address), host, "{address}");
        }
    }

    #[test]
    fn a_service_is_named_every_way_and_loopback_too() {
        assert_eq!(
            store_names("petstore-service.petstore.svc.cluster.local"),
            [
                "petstore-service.petstore.svc.cluster.local",
                "petstore-service",
                "petstore-service.petstore",
                "petstore-service.petstore.svc",
                "localhost",
                "127.0.0.1",
            ]
        );
        assert_eq!(
            store_names("store.example"),
            ["store.example", "localhost", "127.0.0.1"]
        );
        assert_eq!(store_names("127.0.0.1"), ["127.0.0.1", "localhost"]);
    }

    #[tokio::test]
    async fn files_are_written_whole_and_only_when_they_change() {
        let dir = tempfile::tempdir().expect("a directory");
        let dir = dir.path().join("tls");
        let client = client_profile(OPERATOR);
        let certs = CaAndLeaf::generate(&client, &[], super::super::unix_now()).expect("certs");
        write_files(&dir, &certs).await.expect("written");
        for (name, pem) in [
            (CA_CERT_KEY, &certs.ca_cert),
            (TLS_CERT_KEY, &certs.cert),
            (TLS_KEY_KEY, &certs.key),
        ] {
            assert_eq!(
                std::fs::read_to_string(dir.join(name)).ok().as_ref(),
                Some(pem)
            );
        }
        let written_at = |name| {
            std::fs::metadata(dir.join(name))
                .and_then(|m| m.modified())
                .ok()
        };
        let before = written_at(CA_CERT_KEY);
        std::thread::sleep(Duration::from_millis(20));
        let renewed = certs
            .renew_leaf(&client, &[], super::super::unix_now())
            .expect("renew");
        write_files(&dir, &renewed).await.expect("written");
        assert_eq!(written_at(CA_CERT_KEY), before, "the CA did not change");
        assert_eq!(
            std::fs::read_to_string(dir.join(TLS_CERT_KEY)).ok(),
            Some(renewed.cert)
        );
        let leftovers: Vec<_> = std::fs::read_dir(&dir)
            .expect("list")
            .filter_map(|entry| entry.ok())
            .filter(|entry| entry.file_name().to_string_lossy().ends_with(".partial"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }

    fn certificates(api: &ApiServerVerifier, dir: &Path) -> StoreCertificates {
        StoreCertificates::new(
            api.start(),
            &NamespacedName {
                namespace: "petstore".into(),
                name: "petstore-tls".into(),
            },
            "petstore-service.petstore.svc.cluster.local:6742",
            OPERATOR,
            dir.to_owned(),
        )
    }

    const SECRET_PATH: &str = "/api/v1/namespaces/petstore/secrets/petstore-store-client";

    /// `ensure_own` against an API server that answers exactly `calls`
    /// (method, path, code, reply), every one of them made; `what` names the
    /// step if it fails, and the verifier is returned for what the calls
    /// carried.
    async fn ensure_own_answering(
        calls: Vec<(http::Method, &str, u16, serde_json::Value)>,
        dir: &Path,
        now: i64,
        what: &str,
    ) -> (CaAndLeaf, ApiServerVerifier) {
        let api = ApiServerVerifier::default();
        for (method, path, code, reply) in calls {
            api.expect(method, path, code, reply);
        }
        let own = certificates(&api, dir)
            .ensure_own(now)
            .await
            .unwrap_or_else(|error| panic!("{what}: {error}"));
        api.verify();
        (own, api)
    }

    // Fails if the operator's client certificate does not name its
    // ServiceAccount principal (a store with tenancy would then refuse every
    // token it carries), or if one made before, named "petstore-operator",
    // is kept, or its CA changed with it.
    #[tokio::test]
    async fn the_operators_certificate_names_its_principal_and_an_older_one_is_issued_again() {
        use http::Method;

        let now = super::super::unix_now();
        let before = Profile {
            leaf_common_name: "petstore-operator".into(),
            ..client_profile(OPERATOR)
        };
        let old = CaAndLeaf::generate(&before, &[], now).expect("certs");
        assert_eq!(old.leaf_common_name().as_deref(), Some("petstore-operator"));
        let mut old_secret = old.to_secret(&before);
        old_secret.metadata.namespace = Some("petstore".into());
        old_secret.metadata.resource_version = Some("7".into());
        let old_secret = serde_json::to_value(&old_secret).expect("json");

        // At start, the Secret of an install made before: not due, but
        // named otherwise, so issued again by the same CA.
        let dir = tempfile::tempdir().expect("a directory");
        let (own, api) = ensure_own_answering(
            vec![
                (Method::GET, SECRET_PATH, 200, old_secret.clone()),
                (Method::PUT, SECRET_PATH, 200, old_secret),
            ],
            dir.path(),
            now,
            "issued again",
        )
        .await;
        assert_eq!(own.leaf_common_name().as_deref(), Some(OPERATOR));
        assert_eq!(own.ca_cert, old.ca_cert, "the CA is kept");
        assert_eq!(own.ca_key, old.ca_key, "the CA is kept");
        let written = api.calls(|call| call.method == Method::PUT);
        let written: Secret =
            serde_json::from_value(written[0].body.clone()).expect("the Secret written");
        assert_eq!(CaAndLeaf::from_secret(&written).as_ref(), Some(&own));
        assert_eq!(
            std::fs::read_to_string(dir.path().join(TLS_CERT_KEY)).ok(),
            Some(own.cert.clone()),
            "the channel reads the new certificate"
        );

        // The next start finds it named right: kept, nothing written.
        let mut current = written;
        current.metadata.resource_version = Some("8".into());
        let current = serde_json::to_value(&current).expect("json");
        let (kept, _) = ensure_own_answering(
            vec![(Method::GET, SECRET_PATH, 200, current.clone())],
            dir.path(),
            now,
            "kept",
        )
        .await;
        assert_eq!(kept, own);

        // A first install makes it named right.
        let (made, _) = ensure_own_answering(
            vec![
                (Method::GET, SECRET_PATH, 404, failure(404)),
                (
                    Method::POST,
                    "/api/v1/namespaces/petstore/secrets",
                    201,
                    current,
                ),
            ],
            dir.path(),
            now,
            "made",
        )
        .await;
        assert_eq!(made.leaf_common_name().as_deref(), Some(OPERATOR));
    }
}
