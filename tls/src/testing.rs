//! Test certificates, and handshakes run in memory between plain rustls
//! configs and the crate's own.

use std::path::Path;
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
};
use rustls::{ClientConfig, ClientConnection, Connection, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use crate::provider;

pub struct Ca {
    pub cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
}

impl Ca {
    pub fn new(name: &str) -> Self {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key).expect("CA");
        Self {
            cert_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    fn leaf(&self, name: &str, server: bool) -> Leaf {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).expect("params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![if server {
            ExtendedKeyUsagePurpose::ServerAuth
        } else {
            ExtendedKeyUsagePurpose::ClientAuth
        }];
        let cert = params.signed_by(&key, &self.issuer).expect("leaf");
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }

    pub fn server(&self, name: &str) -> Leaf {
        self.leaf(name, true)
    }

    pub fn client(&self, name: &str) -> Leaf {
        self.leaf(name, false)
    }

    fn der(&self) -> CertificateDer<'static> {
        CertificateDer::from_pem_slice(self.cert_pem.as_bytes()).expect("CA PEM")
    }
}

impl Leaf {
    pub fn der(&self) -> CertificateDer<'static> {
        CertificateDer::from_pem_slice(self.cert_pem.as_bytes()).expect("PEM")
    }

    pub fn write(&self, cert: &Path, key: &Path) {
        std::fs::write(cert, &self.cert_pem).expect("write the certificate");
        std::fs::write(key, &self.key_pem).expect("write the key");
    }

    fn chain_and_key(&self) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
        let key = PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes()).expect("key PEM");
        (vec![self.der()], key)
    }
}

fn roots(cas: &[&Ca]) -> Arc<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for ca in cas {
        roots.add(ca.der()).expect("root");
    }
    Arc::new(roots)
}

/// A plain rustls client trusting `cas`, resuming sessions as rustls does
/// by default.
pub fn client_config(cas: &[&Ca], identity: Option<&Leaf>) -> Arc<ClientConfig> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots(cas));
    Arc::new(match identity {
        Some(leaf) => {
            let (chain, key) = leaf.chain_and_key();
            builder.with_client_auth_cert(chain, key).expect("identity")
        }
        None => builder.with_no_client_auth(),
    })
}

/// A plain rustls server presenting `leaf`, requiring client certificates
/// from `client_ca` if given; resuming sessions (rustls' default) or not.
pub fn server_config(client_ca: Option<&Ca>, leaf: &Leaf, resumption: bool) -> Arc<ServerConfig> {
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("versions");
    let builder = match client_ca {
        Some(ca) => builder.with_client_cert_verifier(
            rustls::server::WebPkiClientVerifier::builder_with_provider(roots(&[ca]), provider())
                .build()
                .expect("verifier"),
        ),
        None => builder.with_no_client_auth(),
    };
    let (chain, key) = leaf.chain_and_key();
    let mut config = builder.with_single_cert(chain, key).expect("identity");
    if !resumption {
        config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
        config.send_tls13_tickets = 0;
    }
    Arc::new(config)
}

/// What each side saw of the other.
#[derive(Debug)]
pub struct Seen {
    pub server_cert: CertificateDer<'static>,
    pub client_cert: Option<CertificateDer<'static>>,
}

fn io(error: std::io::Error) -> rustls::Error {
    rustls::Error::General(error.to_string())
}

/// Moves what `from` has to send into `to`; whether anything moved.
fn transfer(from: &mut Connection, to: &mut Connection) -> Result<bool, rustls::Error> {
    let mut bytes = Vec::new();
    while from.wants_write() {
        from.write_tls(&mut bytes).map_err(io)?;
    }
    let mut rest = &bytes[..];
    while !rest.is_empty() {
        to.read_tls(&mut rest).map_err(io)?;
        to.process_new_packets()?;
    }
    Ok(!bytes.is_empty())
}

/// A whole handshake for "localhost", in memory, and the tickets after it.
pub fn handshake(
    client: &Arc<ClientConfig>,
    server: &Arc<ServerConfig>,
) -> Result<Seen, rustls::Error> {
    let name = ServerName::try_from("localhost").expect("name");
    let mut client = Connection::Client(ClientConnection::new(Arc::clone(client), name)?);
    let mut server = Connection::Server(rustls::ServerConnection::new(Arc::clone(server))?);
    for _ in 0..10 {
        let sent = transfer(&mut client, &mut server)?;
        let answered = transfer(&mut server, &mut client)?;
        if !sent && !answered && !client.is_handshaking() && !server.is_handshaking() {
            let first = |certs: Option<&[CertificateDer<'_>]>| {
                certs
                    .and_then(|certs| certs.first())
                    .map(|cert| cert.clone().into_owned())
            };
            return Ok(Seen {
                server_cert: first(client.peer_certificates())
                    .ok_or_else(|| rustls::Error::General("no server certificate".into()))?,
                client_cert: first(server.peer_certificates()),
            });
        }
    }
    Err(rustls::Error::General(
        "the handshake did not finish".into(),
    ))
}
