//! TLS from certificate files that rotate while the process runs, for the
//! store's server ([`server`]) and the operator's client ([`client`]).
//!
//! Each side builds its rustls config once, around a certificate resolver
//! and a verifier that are swapped in place when the files change: the
//! next handshake uses the new ones, and no restart is needed. A
//! [`watch::FileWatcher`] on the files' directories tells when (Kubernetes
//! updates a Secret volume by swapping a `..data` symlink, and editors and
//! `mv` replace a file's inode, so the files themselves cannot be watched).
//! A reload that finds a file missing, unreadable or not matching the others
//! (a certificate written before its key) changes nothing; the next change
//! of the files tries again.
//!
//! The policy both sides keep: TLS 1.3, and TLS 1.2 with ECDHE and AEAD
//! suites only (rustls' ring provider has no other), ALPN `h2`, and no
//! session resumption: a resumed session skips the certificate checks, so
//! after a rotation it would go on with the identity of before.

/// The signature checks of a swapped verifier, handed to the one in use
/// now: the same three methods for the server's and the client's verifier
/// traits (each side's own check stays in its impl).
macro_rules! signatures_from_current_verifier {
    () => {
        signatures_from_current_verifier!(check verify_tls12_signature);
        signatures_from_current_verifier!(check verify_tls13_signature);

        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            self.0.get().supported_verify_schemes()
        }
    };
    // TLS 1.2's and 1.3's checks take and return the same.
    (check $method:ident) => {
        fn $method(
            &self,
            message: &[u8],
            cert: &rustls_pki_types::CertificateDer<'_>,
            dss: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            self.0.get().$method(message, cert, dss)
        }
    };
}

pub mod client;
pub mod server;
pub mod watch;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

pub use watch::FileWatcher;

/// gRPC runs over HTTP/2, which both sides must agree on in the handshake.
const ALPN_H2: &[u8] = b"h2";

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not PEM: {source}")]
    Pem {
        path: PathBuf,
        #[source]
        source: rustls_pki_types::pem::Error,
    },
    #[error("{path} holds no certificate")]
    NoCertificate { path: PathBuf },
    #[error("{cert} and {key} do not make a TLS identity: {source}")]
    Identity {
        cert: PathBuf,
        key: PathBuf,
        #[source]
        source: rustls::Error,
    },
    #[error("the CA certificates in {path}: {source}")]
    Ca {
        path: PathBuf,
        #[source]
        source: rustls::Error,
    },
    #[error("a verifier for the CA certificates in {path}: {source}")]
    Verifier {
        path: PathBuf,
        #[source]
        source: rustls::server::VerifierBuilderError,
    },
    #[error("TLS settings: {0}")]
    Config(#[from] rustls::Error),
    #[error("watching {path}: {source}")]
    Watch {
        path: PathBuf,
        #[source]
        source: notify::Error,
    },
    #[error("starting the thread that watches the TLS files: {0}")]
    WatchThread(#[source] std::io::Error),
}

/// What a reload did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reload {
    /// The files differ from those in use, and are used from the next
    /// handshake on.
    Changed,
    /// The files are the same as those in use (a change of another file
    /// of their directory); nothing was swapped.
    Unchanged,
}

/// The crypto every config here is built with: ring, as kube and tonic
/// already build it.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A value swapped in place while handshakes read it.
#[derive(Debug)]
struct Swap<T: ?Sized>(RwLock<Arc<T>>);

impl<T: ?Sized> Swap<T> {
    fn new(value: Arc<T>) -> Self {
        Self(RwLock::new(value))
    }

    fn get(&self) -> Arc<T> {
        // A poisoned lock only means a writer panicked while swapping an
        // Arc, which cannot leave it half-written.
        Arc::clone(&self.0.read().unwrap_or_else(PoisonError::into_inner))
    }

    fn set(&self, value: Arc<T>) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = value;
    }
}

/// The contents of a side's files as last loaded, to tell a change from an
/// event that changed none of them.
#[derive(Debug)]
struct Loaded(Mutex<Vec<Vec<u8>>>);

impl Loaded {
    fn new(contents: Vec<Vec<u8>>) -> Self {
        Self(Mutex::new(contents))
    }

    /// A reload's last step on either side: `swap` puts the new material in
    /// use only when `contents` differ from what is loaded, and they are
    /// then what is loaded. The lock is held throughout, so two reloads at
    /// once cannot leave the recorded contents and the material apart.
    fn replace(&self, contents: Vec<Vec<u8>>, swap: impl FnOnce()) -> Reload {
        let mut loaded = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if *loaded == contents {
            return Reload::Unchanged;
        }
        swap();
        *loaded = contents;
        Reload::Changed
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}

/// Every file a side names, in the order it names them.
fn read_all(paths: &[PathBuf]) -> Result<Vec<Vec<u8>>, TlsError> {
    paths.iter().map(|path| read(path)).collect()
}

fn certificates(pem: &[u8], path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let chain = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsError::Pem {
            path: path.to_owned(),
            source,
        })?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_owned(),
        });
    }
    Ok(chain)
}

/// A certificate chain and its key, checked to belong together.
fn certified_key(
    (cert, cert_pem): (&Path, &[u8]),
    (key, key_pem): (&Path, &[u8]),
) -> Result<Arc<CertifiedKey>, TlsError> {
    let chain = certificates(cert_pem, cert)?;
    let private = PrivateKeyDer::from_pem_slice(key_pem).map_err(|source| TlsError::Pem {
        path: key.to_owned(),
        source,
    })?;
    CertifiedKey::from_der(chain, private, &provider())
        .map(Arc::new)
        .map_err(|source| TlsError::Identity {
            cert: cert.to_owned(),
            key: key.to_owned(),
            source,
        })
}

/// Every CA certificate of a bundle; one that does not parse refuses the
/// whole file, rather than trusting less than it names.
fn roots(pem: &[u8], path: &Path) -> Result<Arc<RootCertStore>, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in certificates(pem, path)? {
        roots.add(cert).map_err(|source| TlsError::Ca {
            path: path.to_owned(),
            source,
        })?;
    }
    Ok(Arc::new(roots))
}

/// The certificate and key a side presents; swapped by a reload. It
/// answers every handshake, as a server's or a client's identity.
#[derive(Debug)]
struct Identity(Swap<CertifiedKey>);

impl rustls::server::ResolvesServerCert for Identity {
    fn resolve(&self, _hello: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.get())
    }
}

impl rustls::client::ResolvesClientCert for Identity {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.0.get())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// Watches `files`' directories and calls `reload` after each change,
/// logging what it did and handing the outcome to `report` (a metric).
fn follow(
    side: &'static str,
    files: Vec<PathBuf>,
    reload: impl Fn() -> Result<Reload, TlsError> + Send + 'static,
    mut report: impl FnMut(&Result<Reload, TlsError>) + Send + 'static,
) -> Result<FileWatcher, TlsError> {
    let names = files
        .iter()
        .map(|file| file.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    FileWatcher::start(&files, move || {
        let outcome = reload();
        match &outcome {
            Ok(Reload::Changed) => {
                tracing::info!(side, files = %names, "TLS files reloaded: new handshakes use them");
            }
            Ok(Reload::Unchanged) => {
                tracing::debug!(side, files = %names, "TLS files unchanged");
            }
            Err(error) => tracing::warn!(
                side,
                %error,
                "TLS files not reloaded: the certificates in use stay until the files change again"
            ),
        }
        report(&outcome);
    })
}

#[cfg(any(test, feature = "testing"))]
pub mod testing;
