//! The store's side: its serving certificate, and the CA whose client
//! certificates it requires (mutual TLS), both reloaded from their files.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DistinguishedName, ServerConfig};
use rustls_pki_types::{CertificateDer, UnixTime};

use crate::{
    ALPN_H2, FileWatcher, Identity, Loaded, Reload, Swap, TlsError, certified_key, follow,
    provider, read_all, roots,
};

/// Serving certificate and key (PEM), and optionally a CA (PEM, one or
/// more certificates) whose client certificates are then required.
#[derive(Clone, Debug)]
pub struct ServerFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

impl ServerFiles {
    fn paths(&self) -> Vec<PathBuf> {
        let mut paths = vec![self.cert.clone(), self.key.clone()];
        paths.extend(self.client_ca.clone());
        paths
    }
}

/// The server's TLS: one rustls config whose certificate and client
/// verifier follow the files.
#[derive(Debug)]
pub struct ServerTls {
    files: ServerFiles,
    identity: Arc<Identity>,
    clients: Option<Arc<ClientVerifier>>,
    loaded: Loaded,
    config: Arc<ServerConfig>,
}

/// What the files hold, parsed.
struct Material {
    contents: Vec<Vec<u8>>,
    identity: Arc<rustls::sign::CertifiedKey>,
    clients: Option<Arc<dyn ClientCertVerifier>>,
}

impl ServerFiles {
    fn load(&self) -> Result<Material, TlsError> {
        let contents = read_all(&self.paths())?;
        let identity = certified_key((&self.cert, &contents[0]), (&self.key, &contents[1]))?;
        let clients = match (&self.client_ca, contents.get(2)) {
            (Some(path), Some(pem)) => Some(
                WebPkiClientVerifier::builder_with_provider(roots(pem, path)?, provider())
                    .build()
                    .map_err(|source| TlsError::Verifier {
                        path: path.clone(),
                        source,
                    })?,
            ),
            _ => None,
        };
        Ok(Material {
            contents,
            identity,
            clients,
        })
    }
}

impl ServerTls {
    /// Reads the files; an error here is the caller's to report (a store
    /// that cannot serve TLS should not start).
    pub fn load(files: ServerFiles) -> Result<Self, TlsError> {
        let material = files.load()?;
        let identity = Arc::new(Identity(Swap::new(material.identity)));
        let clients = material
            .clients
            .map(|verifier| Arc::new(ClientVerifier(Swap::new(verifier))));
        let builder = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?;
        let builder = match &clients {
            Some(verifier) => builder.with_client_cert_verifier(Arc::clone(verifier) as _),
            None => builder.with_no_client_auth(),
        };
        let mut config = builder.with_cert_resolver(Arc::clone(&identity) as _);
        config.alpn_protocols = vec![ALPN_H2.to_vec()];
        // No resumption (see the crate's docs): no session cache, no tickets.
        config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
        config.send_tls13_tickets = 0;
        Ok(Self {
            files,
            identity,
            clients,
            loaded: Loaded::new(material.contents),
            config: Arc::new(config),
        })
    }

    /// The config every handshake uses; it stays the same object while
    /// what it presents and trusts changes.
    pub fn config(&self) -> Arc<ServerConfig> {
        Arc::clone(&self.config)
    }

    pub fn files(&self) -> &ServerFiles {
        &self.files
    }

    /// Whether client certificates are required.
    pub fn requires_client_certificates(&self) -> bool {
        self.clients.is_some()
    }

    /// Reads the files again and, if they changed and all of them are good,
    /// uses them from the next handshake on. On an error nothing changes.
    pub fn reload(&self) -> Result<Reload, TlsError> {
        let Material {
            contents,
            identity,
            clients,
        } = self.files.load()?;
        Ok(self.loaded.replace(contents, || {
            self.identity.0.set(identity);
            if let (Some(current), Some(new)) = (&self.clients, clients) {
                current.0.set(new);
            }
        }))
    }

    /// Whether a client certificate chain (as a connection presented it)
    /// is trusted by the client CA in use now; true without client
    /// certificates required.
    pub fn trusts_client(&self, chain: &[CertificateDer<'_>]) -> bool {
        let Some(clients) = &self.clients else {
            return true;
        };
        let Some((end_entity, intermediates)) = chain.split_first() else {
            return false;
        };
        clients
            .verify_client_cert(end_entity, intermediates, UnixTime::now())
            .is_ok()
    }

    /// Reloads after each change of the files' directories until the
    /// watcher is dropped, handing every outcome to `report`.
    pub fn watch(
        self: &Arc<Self>,
        report: impl FnMut(&Result<Reload, TlsError>) + Send + 'static,
    ) -> Result<FileWatcher, TlsError> {
        let tls = Arc::clone(self);
        follow("server", self.files.paths(), move || tls.reload(), report)
    }
}

/// Client certificates are checked by the verifier built from the client CA
/// file last loaded.
#[derive(Debug)]
struct ClientVerifier(Swap<dyn ClientCertVerifier>);

impl ClientCertVerifier for ClientVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    /// None: the hints would borrow from a verifier that a reload may drop
    /// while rustls holds them. With none, a client sends the certificate
    /// it has, and the verifier judges it as before.
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.0
            .get()
            .verify_client_cert(end_entity, intermediates, now)
    }

    signatures_from_current_verifier!();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{Ca, client_config, handshake};

    fn files(dir: &std::path::Path, mutual: bool) -> ServerFiles {
        ServerFiles {
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
            client_ca: mutual.then(|| dir.join("ca.crt")),
        }
    }

    /// The certificate `server` presents to `client` in a new handshake.
    fn presented(
        client: &Arc<rustls::ClientConfig>,
        server: &Arc<ServerConfig>,
    ) -> CertificateDer<'static> {
        handshake(client, server).expect("handshake").server_cert
    }

    #[test]
    fn the_next_handshake_presents_the_reloaded_certificate() {
        let dir = tempfile::tempdir().expect("dir");
        let ca = Ca::new("store-ca");
        let first = ca.server("first");
        first.write(&dir.path().join("tls.crt"), &dir.path().join("tls.key"));
        let tls = ServerTls::load(files(dir.path(), false)).expect("load");
        let config = tls.config();
        let client = client_config(&[&ca], None);

        assert_eq!(presented(&client, &config), first.der());

        let second = ca.server("second");
        second.write(&dir.path().join("tls.crt"), &dir.path().join("tls.key"));
        assert_eq!(tls.reload().expect("reload"), Reload::Changed);
        // The same config object and the same client (which would resume
        // its session if the server allowed it): the new certificate.
        assert_eq!(presented(&client, &config), second.der());
        assert_eq!(tls.reload().expect("reload"), Reload::Unchanged);
    }

    #[test]
    fn bad_or_half_written_files_keep_the_certificate_in_use() {
        let dir = tempfile::tempdir().expect("dir");
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let ca = Ca::new("store-ca");
        let first = ca.server("first");
        first.write(&cert, &key);
        let tls = ServerTls::load(files(dir.path(), false)).expect("load");
        let client = client_config(&[&ca], None);

        // A new certificate written, its key not yet.
        let second = ca.server("second");
        std::fs::write(&cert, &second.cert_pem).expect("write");
        let error = tls.reload().expect_err("the old key");
        assert!(matches!(error, TlsError::Identity { .. }), "{error}");
        assert_eq!(presented(&client, &tls.config()), first.der());
        // Garbage, and a file gone.
        std::fs::write(&key, "not a key").expect("write");
        assert!(matches!(tls.reload(), Err(TlsError::Pem { .. })));
        std::fs::remove_file(&key).expect("remove");
        assert!(matches!(tls.reload(), Err(TlsError::Read { .. })));
        assert_eq!(presented(&client, &tls.config()), first.der());
        // The key arrives: the next reload takes both.
        std::fs::write(&key, &second.key_pem).expect("write");
        assert_eq!(tls.reload().expect("reload"), Reload::Changed);
        assert_eq!(presented(&client, &tls.config()), second.der());
    }

    #[test]
    fn a_new_client_ca_decides_the_next_handshake_and_judges_chains() {
        let dir = tempfile::tempdir().expect("dir");
        let old = Ca::new("old-ca");
        let new = Ca::new("new-ca");
        old.server("store")
            .write(&dir.path().join("tls.crt"), &dir.path().join("tls.key"));
        let ca_file = dir.path().join("ca.crt");
        std::fs::write(&ca_file, &old.cert_pem).expect("write");
        let tls = ServerTls::load(files(dir.path(), true)).expect("load");
        assert!(tls.requires_client_certificates());
        let old_client = old.client("operator");
        let new_client = new.client("operator");

        let with_old = client_config(&[&old], Some(&old_client));
        let with_new = client_config(&[&old], Some(&new_client));
        let seen = handshake(&with_old, &tls.config()).expect("old client, old CA");
        assert_eq!(seen.client_cert, Some(old_client.der()));
        assert!(handshake(&with_new, &tls.config()).is_err());
        assert!(handshake(&client_config(&[&old], None), &tls.config()).is_err());
        assert!(tls.trusts_client(&[old_client.der()]));
        assert!(!tls.trusts_client(&[new_client.der()]));

        std::fs::write(&ca_file, format!("{}{}", old.cert_pem, new.cert_pem)).expect("bundle");
        assert_eq!(tls.reload().expect("reload"), Reload::Changed);
        assert!(handshake(&with_old, &tls.config()).is_ok());
        assert!(handshake(&with_new, &tls.config()).is_ok());

        std::fs::write(&ca_file, &new.cert_pem).expect("new only");
        assert_eq!(tls.reload().expect("reload"), Reload::Changed);
        assert!(handshake(&with_old, &tls.config()).is_err());
        let seen = handshake(&with_new, &tls.config()).expect("new client, new CA");
        assert_eq!(seen.client_cert, Some(new_client.der()));
        assert!(!tls.trusts_client(&[old_client.der()]));
        assert!(tls.trusts_client(&[new_client.der()]));
        assert!(!tls.trusts_client(&[]));

        // A CA file that is not a certificate keeps the one in use.
        std::fs::write(
            &ca_file,
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        )
        .expect("write");
        assert!(tls.reload().is_err());
        assert!(handshake(&with_new, &tls.config()).is_ok());
    }

    #[test]
    fn the_watcher_reloads_and_reports() {
        let dir = tempfile::tempdir().expect("dir");
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let ca = Ca::new("store-ca");
        ca.server("first").write(&cert, &key);
        let tls = Arc::new(ServerTls::load(files(dir.path(), false)).expect("load"));
        let (reports, reported) = std::sync::mpsc::channel();
        let _watcher = tls
            .watch(move |outcome| {
                let _ = reports.send(outcome.as_ref().map_err(ToString::to_string).copied());
            })
            .expect("watch");
        let wait = std::time::Duration::from_secs(10);

        // Garbage first: reported as failed.
        std::fs::write(&key, "not a key").expect("write");
        let outcome = reported.recv_timeout(wait).expect("a report");
        assert!(outcome.is_err(), "{outcome:?}");

        let second = ca.server("second");
        second.write(&cert, &key);
        let outcome = loop {
            // The certificate and key are two writes, which may be two
            // reloads: the last one has both.
            let outcome = reported.recv_timeout(wait).expect("a report");
            if outcome == Ok(Reload::Changed) {
                break outcome;
            }
        };
        assert_eq!(outcome, Ok(Reload::Changed));
        let client = client_config(&[&ca], None);
        assert_eq!(presented(&client, &tls.config()), second.der());
    }

    /// The store's protocol policy: TLS 1.3 and 1.2, AEAD suites with ECDHE.
    #[test]
    fn only_modern_versions_and_suites_are_offered() {
        let dir = tempfile::tempdir().expect("dir");
        Ca::new("store-ca")
            .server("first")
            .write(&dir.path().join("tls.crt"), &dir.path().join("tls.key"));
        let tls = ServerTls::load(files(dir.path(), false)).expect("load");
        let config = tls.config();
        for suite in &config.crypto_provider().cipher_suites {
            let name = format!("{:?}", suite.suite());
            assert!(
                name.starts_with("TLS13_")
                    || (name.starts_with("TLS_ECDHE_")
                        && (name.contains("_GCM_") || name.contains("CHACHA20_POLY1305"))),
                "{name}"
            );
        }
        assert_eq!(config.alpn_protocols, [b"h2".to_vec()]);
    }
}
