//! The operator's side: the CA it trusts for the store's certificate, and
//! its own client certificate for mutual TLS, both reloaded from their
//! files.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::ClientConfig;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{ServerCertVerified, ServerCertVerifier};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

use crate::{
    ALPN_H2, FileWatcher, Identity, Loaded, Reload, Swap, TlsError, certified_key, follow,
    provider, read_all, roots,
};

/// The CA (PEM, one or more certificates) that signs the server's
/// certificate, and for mutual TLS this client's certificate and key.
#[derive(Clone, Debug)]
pub struct ClientFiles {
    pub ca: PathBuf,
    pub cert_and_key: Option<(PathBuf, PathBuf)>,
}

impl ClientFiles {
    fn paths(&self) -> Vec<PathBuf> {
        let mut paths = vec![self.ca.clone()];
        if let Some((cert, key)) = &self.cert_and_key {
            paths.extend([cert.clone(), key.clone()]);
        }
        paths
    }

    fn load(&self) -> Result<Material, TlsError> {
        let contents = read_all(&self.paths())?;
        let verifier =
            WebPkiServerVerifier::builder_with_provider(roots(&contents[0], &self.ca)?, provider())
                .build()
                .map_err(|source| TlsError::Verifier {
                    path: self.ca.clone(),
                    source,
                })?;
        let identity = match &self.cert_and_key {
            Some((cert, key)) => Some(certified_key((cert, &contents[1]), (key, &contents[2]))?),
            None => None,
        };
        Ok(Material {
            contents,
            verifier,
            identity,
        })
    }
}

struct Material {
    contents: Vec<Vec<u8>>,
    verifier: Arc<WebPkiServerVerifier>,
    identity: Option<Arc<rustls::sign::CertifiedKey>>,
}

/// The client's TLS: one rustls config whose server verifier and client
/// certificate follow the files.
#[derive(Debug)]
pub struct ClientTls {
    files: ClientFiles,
    verifier: Arc<ServerVerifier>,
    identity: Option<Arc<Identity>>,
    loaded: Loaded,
    config: Arc<ClientConfig>,
}

impl ClientTls {
    /// Reads the files; an error here is the caller's to report.
    pub fn load(files: ClientFiles) -> Result<Self, TlsError> {
        let material = files.load()?;
        let verifier = Arc::new(ServerVerifier(Swap::new(material.verifier)));
        let identity = material
            .identity
            .map(|key| Arc::new(Identity(Swap::new(key))));
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .dangerous()
            .with_custom_certificate_verifier(Arc::clone(&verifier) as _);
        let mut config = match &identity {
            Some(identity) => builder.with_client_cert_resolver(Arc::clone(identity) as _),
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![ALPN_H2.to_vec()];
        // See the crate's docs: a resumed session would keep the identity
        // of before a rotation.
        config.resumption = rustls::client::Resumption::disabled();
        Ok(Self {
            files,
            verifier,
            identity,
            loaded: Loaded::new(material.contents),
            config: Arc::new(config),
        })
    }

    /// The config every handshake uses; it stays the same object while
    /// what it trusts and presents changes.
    pub fn config(&self) -> Arc<ClientConfig> {
        Arc::clone(&self.config)
    }

    pub fn files(&self) -> &ClientFiles {
        &self.files
    }

    /// Reads the files again and, if they changed and all of them are good,
    /// uses them from the next handshake on. On an error nothing changes.
    pub fn reload(&self) -> Result<Reload, TlsError> {
        let Material {
            contents,
            verifier,
            identity,
        } = self.files.load()?;
        Ok(self.loaded.replace(contents, || {
            self.verifier.0.set(verifier);
            if let (Some(current), Some(new)) = (&self.identity, identity) {
                current.0.set(new);
            }
        }))
    }

    /// Reloads after each change of the files' directories until the
    /// watcher is dropped, handing every outcome to `report`.
    pub fn watch(
        self: &Arc<Self>,
        report: impl FnMut(&Result<Reload, TlsError>) + Send + 'static,
    ) -> Result<FileWatcher, TlsError> {
        let tls = Arc::clone(self);
        follow("client", self.files.paths(), move || tls.reload(), report)
    }
}

/// The server's certificate is checked by the verifier built from the CA
/// file last loaded.
#[derive(Debug)]
struct ServerVerifier(Swap<WebPkiServerVerifier>);

impl ServerCertVerifier for ServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.0
            .get()
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
    }

    signatures_from_current_verifier!();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{Ca, handshake, server_config};

    fn files(dir: &std::path::Path) -> ClientFiles {
        ClientFiles {
            ca: dir.join("ca.crt"),
            cert_and_key: Some((dir.join("tls.crt"), dir.join("tls.key"))),
        }
    }

    /// The client certificate `tls` presents to `server` in a new
    /// handshake, if any.
    fn presented(
        tls: &ClientTls,
        server: &Arc<rustls::ServerConfig>,
    ) -> Option<CertificateDer<'static>> {
        handshake(&tls.config(), server)
            .expect("handshake")
            .client_cert
    }

    #[test]
    fn the_next_handshake_presents_the_reloaded_client_certificate() {
        let dir = tempfile::tempdir().expect("dir");
        let ca = Ca::new("ca");
        std::fs::write(dir.path().join("ca.crt"), &ca.cert_pem).expect("write");
        let first = ca.client("first");
        first.write(&dir.path().join("tls.crt"), &dir.path().join("tls.key"));
        let tls = ClientTls::load(files(dir.path())).expect("load");
        // A server that resumes sessions: the client must not offer one.
        let server = server_config(Some(&ca), &ca.server("store"), true);

        assert_eq!(presented(&tls, &server), Some(first.der()));

        let second = ca.client("second");
        second.write(&dir.path().join("tls.crt"), &dir.path().join("tls.key"));
        assert_eq!(tls.reload().expect("reload"), Reload::Changed);
        assert_eq!(presented(&tls, &server), Some(second.der()));
    }

    #[test]
    fn a_new_ca_decides_which_servers_are_trusted() {
        let dir = tempfile::tempdir().expect("dir");
        let old = Ca::new("old-ca");
        let new = Ca::new("new-ca");
        let ca_file = dir.path().join("ca.crt");
        std::fs::write(&ca_file, &old.cert_pem).expect("write");
        old.client("operator")
            .write(&dir.path().join("tls.crt"), &dir.path().join("tls.key"));
        let tls = ClientTls::load(files(dir.path())).expect("load");
        let old_store = server_config(Some(&old), &old.server("store"), false);
        let new_store = server_config(Some(&old), &new.server("store"), false);
        assert!(handshake(&tls.config(), &old_store).is_ok());
        assert!(handshake(&tls.config(), &new_store).is_err());

        std::fs::write(&ca_file, format!("{}{}", old.cert_pem, new.cert_pem)).expect("bundle");
        assert_eq!(tls.reload().expect("reload"), Reload::Changed);
        assert!(handshake(&tls.config(), &old_store).is_ok());
        assert!(handshake(&tls.config(), &new_store).is_ok());

        std::fs::write(&ca_file, &new.cert_pem).expect("new only");
        assert_eq!(tls.reload().expect("reload"), Reload::Changed);
        assert!(handshake(&tls.config(), &old_store).is_err());
        assert!(handshake(&tls.config(), &new_store).is_ok());
    }

    #[test]
    fn bad_or_half_written_files_keep_the_identity_in_use() {
        let dir = tempfile::tempdir().expect("dir");
        let ca = Ca::new("ca");
        std::fs::write(dir.path().join("ca.crt"), &ca.cert_pem).expect("write");
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let first = ca.client("first");
        first.write(&cert, &key);
        let tls = ClientTls::load(files(dir.path())).expect("load");
        let server = server_config(Some(&ca), &ca.server("store"), false);

        let second = ca.client("second");
        std::fs::write(&cert, &second.cert_pem).expect("the certificate alone");
        assert!(matches!(tls.reload(), Err(TlsError::Identity { .. })));
        std::fs::write(dir.path().join("ca.crt"), "").expect("an empty CA file");
        assert!(matches!(tls.reload(), Err(TlsError::NoCertificate { .. })));
        assert_eq!(presented(&tls, &server), Some(first.der()));
    }

    #[test]
    fn a_ca_alone_is_tls_without_a_client_certificate() {
        let dir = tempfile::tempdir().expect("dir");
        let ca = Ca::new("ca");
        let ca_file = dir.path().join("ca.crt");
        std::fs::write(&ca_file, &ca.cert_pem).expect("write");
        let tls = ClientTls::load(ClientFiles {
            ca: ca_file,
            cert_and_key: None,
        })
        .expect("load");
        let plain = server_config(None, &ca.server("store"), false);
        assert_eq!(presented(&tls, &plain), None);
    }
}
