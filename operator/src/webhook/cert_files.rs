//! The webhook's certificate from files (`--webhook-cert-dir`), for a
//! cluster whose certificates come from cert-manager: the directory a
//! Certificate's Secret is mounted at, with `tls.crt`, `tls.key` and, from
//! a CA issuer, `ca.crt`. The operator then neither reads nor writes the
//! Secret it makes otherwise ([`super::certs`]).
//!
//! The files are watched, not polled: each change swaps the served
//! certificate in place, and a pair that does not load (half-written, or a
//! key that is not the certificate's) keeps the one in use until the files
//! change again. A `ca.crt` goes into the CRD's and the deletion guards'
//! caBundle at start, on each change and every [`REFRESH_INTERVAL`] (as the
//! operator's own CA does); without one, the caBundle is left to whoever
//! sets it (cert-manager's CA injector).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::Api;
use petstore_tls::FileWatcher;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::certs::{REFRESH_INTERVAL, WebhookTarget, inject_ca_bundle, inject_guards};
use super::server::{ServerError, ServingCertificate};

/// cert-manager's names for a Secret's keys, as mounted.
const CERT: &str = "tls.crt";
const KEY: &str = "tls.key";
const CA: &str = "ca.crt";

#[derive(Debug, thiserror::Error)]
pub enum CertFileError {
    #[error("reading {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the webhook's certificate files in {}: {source}", dir.display())]
    Load {
        dir: PathBuf,
        #[source]
        source: ServerError,
    },
    #[error("watching {}: {source}", dir.display())]
    Watch {
        dir: PathBuf,
        #[source]
        source: Box<petstore_tls::TlsError>,
    },
}

/// What the directory holds, PEM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Served {
    pub cert: String,
    pub key: String,
    /// `ca.crt`, if the directory has one.
    pub ca: Option<String>,
}

/// The directory of `--webhook-cert-dir`.
#[derive(Clone, Debug)]
pub struct CertFiles {
    dir: PathBuf,
}

impl CertFiles {
    pub fn new(dir: &Path) -> Self {
        Self {
            dir: dir.to_owned(),
        }
    }

    fn paths(&self) -> [PathBuf; 3] {
        [CERT, KEY, CA].map(|name| self.dir.join(name))
    }

    /// Reads the files; `tls.crt` and `tls.key` must be there.
    pub fn read(&self) -> Result<Served, CertFileError> {
        let [cert, key, ca] = self.paths();
        let read = |path: &PathBuf| {
            std::fs::read_to_string(path).map_err(|source| CertFileError::Read {
                path: path.clone(),
                source,
            })
        };
        let ca = match std::fs::read_to_string(&ca) {
            Ok(pem) => Some(pem),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
            Err(source) => return Err(CertFileError::Read { path: ca, source }),
        };
        Ok(Served {
            cert: read(&cert)?,
            key: read(&key)?,
            ca,
        })
    }

    /// Reads the files and loads the pair: what the server starts with.
    pub fn load(&self) -> Result<(Served, ServingCertificate), CertFileError> {
        let served = self.read()?;
        let serving =
            ServingCertificate::from_pem(&served.cert, &served.key).map_err(|source| {
                CertFileError::Load {
                    dir: self.dir.clone(),
                    source,
                }
            })?;
        Ok((served, serving))
    }

    /// Starts watching the directory: a failure stops the operator, which
    /// would otherwise serve a certificate it never renews.
    pub fn start_watching(&self) -> Result<Watching, CertFileError> {
        let (changed, changes) = mpsc::unbounded_channel();
        let watcher = FileWatcher::start(&self.paths(), move || {
            // The receiver gone means the operator is stopping.
            let _ = changed.send(());
        })
        .map_err(|source| CertFileError::Watch {
            dir: self.dir.clone(),
            source: Box::new(source),
        })?;
        Ok(Watching {
            _watcher: watcher,
            changes,
        })
    }

    /// Swaps what the files hold now into `serving`, if it differs from
    /// `current` and loads; returns what is served afterwards.
    pub fn reload(&self, serving: &ServingCertificate, current: &Served) -> Served {
        let latest = match self.read() {
            Ok(latest) => latest,
            Err(error) => {
                tracing::warn!(%error, "the webhook's certificate files cannot be read; the certificate in use stays");
                return current.clone();
            }
        };
        if latest == *current {
            return latest;
        }
        if (&latest.cert, &latest.key) != (&current.cert, &current.key) {
            if let Err(error) = serving.replace(&latest.cert, &latest.key) {
                // Its CA too: the caBundles stay with the leaf served.
                tracing::warn!(%error, dir = %self.dir.display(), "the webhook's certificate files do not load; the certificate in use stays until they change again");
                return current.clone();
            }
            tracing::info!(dir = %self.dir.display(), "serving the webhook certificate from the changed files");
        }
        latest
    }
}

/// The files followed: their watcher and the changes it sends.
pub struct Watching {
    _watcher: FileWatcher,
    changes: mpsc::UnboundedReceiver<()>,
}

/// Points the CRD and the guards at this operator with `served`'s CA, if
/// it has one; without, leaves them to whoever sets their caBundle.
pub async fn point_at_if_ca(
    served: &Served,
    (crds, guards, target): (
        &Api<CustomResourceDefinition>,
        &Api<ValidatingWebhookConfiguration>,
        &WebhookTarget,
    ),
) {
    let Some(ca) = &served.ca else {
        return;
    };
    if let Err(error) = inject_ca_bundle(crds, ca, Some(target)).await {
        tracing::warn!(%error, "cannot put the webhook's CA from ca.crt into the CRD");
    }
    inject_guards(guards, ca, target).await;
}

/// Until `stop`: follows the files ([`CertFiles::reload`] on each change)
/// and keeps their CA, if any, in the CRD and the guards.
pub async fn follow(
    files: CertFiles,
    mut watching: Watching,
    serving: Arc<ServingCertificate>,
    (crds, guards, target): (
        Api<CustomResourceDefinition>,
        Api<ValidatingWebhookConfiguration>,
        WebhookTarget,
    ),
    mut current: Served,
    stop: CancellationToken,
) {
    let mut refresh = tokio::time::interval(REFRESH_INTERVAL);
    refresh.tick().await;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            Some(()) = watching.changes.recv() => {
                let ca_before = current.ca.clone();
                current = files.reload(&serving, &current);
                if current.ca == ca_before {
                    continue;
                }
            }
            _ = refresh.tick() => {}
        }
        point_at_if_ca(&current, (&crds, &guards, &target)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use petstore_tls::testing::Ca;

    fn der(pem: &str) -> Vec<u8> {
        use rustls_pki_types::pem::PemObject;
        rustls_pki_types::CertificateDer::from_pem_slice(pem.as_bytes())
            .expect("PEM")
            .to_vec()
    }

    fn write(dir: &Path, ca: &Ca, leaf: &petstore_tls::testing::Leaf) {
        leaf.write(&dir.join(CERT), &dir.join(KEY));
        std::fs::write(dir.join(CA), &ca.cert_pem).expect("ca.crt");
    }

    #[test]
    fn the_files_are_served_and_a_bad_pair_keeps_the_certificate_in_use() {
        let dir = tempfile::tempdir().expect("dir");
        let files = CertFiles::new(dir.path());
        assert!(
            matches!(files.load(), Err(CertFileError::Read { .. })),
            "no files yet"
        );
        let ca = Ca::new("webhook-ca");
        write(dir.path(), &ca, &ca.server("127.0.0.1"));
        let (first, serving) = files.load().expect("loads");
        assert_eq!(first.ca.as_deref(), Some(ca.cert_pem.as_str()));
        assert_eq!(serving.served_leaf_der(), der(&first.cert));

        // Unchanged files: nothing swapped.
        assert_eq!(files.reload(&serving, &first), first);

        // A new leaf of the same CA is served from now on.
        write(dir.path(), &ca, &ca.server("127.0.0.1"));
        let second = files.reload(&serving, &first);
        assert_ne!(second.cert, first.cert);
        assert_eq!(serving.served_leaf_der(), der(&second.cert), "swapped");

        // Half-written: a new CA and a key that is not the certificate's.
        // The pair in use stays, with its CA (the caBundles must still
        // trust what is served), and the next good write is taken.
        let other_ca = Ca::new("another-webhook-ca");
        std::fs::write(dir.path().join(CA), &other_ca.cert_pem).expect("ca.crt");
        std::fs::write(dir.path().join(KEY), &first.key).expect("key");
        let kept = files.reload(&serving, &second);
        assert_eq!(kept, second, "the pair and its CA kept");
        assert_eq!(serving.served_leaf_der(), der(&second.cert), "kept");
        write(dir.path(), &ca, &ca.server("127.0.0.1"));
        let third = files.reload(&serving, &kept);
        assert_ne!(third.cert, second.cert);
        assert_eq!(serving.served_leaf_der(), der(&third.cert));

        // No ca.crt: nothing to put in the CRD.
        std::fs::remove_file(dir.path().join(CA)).expect("rm ca.crt");
        assert_eq!(files.read().expect("reads").ca, None);
    }
}
