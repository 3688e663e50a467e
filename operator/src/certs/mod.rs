//! Certificates the operator makes itself, without cert-manager or any
//! other component: a CA and one leaf certificate it signs, kept in one
//! Secret that every replica shares.
//!
//! Two users: the webhook's serving certificate ([`crate::webhook::certs`])
//! and the store channel's mutual TLS ([`store`]).
//!
//! The CA is long-lived ([`CA_VALIDITY`]) and only the leaf rotates
//! ([`LEAF_VALIDITY`], re-issued with a third of it left), so what trusts
//! the CA never needs an old+new bundle while the Secret lives. Replicas
//! race with the API server's optimistic concurrency: create-if-absent, and
//! on 409 read the winner's; a renewal replaces the Secret at the
//! resourceVersion it read, and the loser reads the winner's.

pub mod store;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::core::ObjectMeta;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

use crate::shared_object::{SharedObjectError, Wanted, ensure};

/// How long a CA is valid: it outlives any release, so what trusts it stays
/// put while leaves rotate under it.
pub const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// How long a leaf is valid. Re-issued with a third left (30 days), so
/// every replica and every mounted copy has weeks to pick up the new one.
pub const LEAF_VALIDITY: Duration = Duration::from_secs(90 * 24 * 3600);

pub(crate) const CA_CERT_KEY: &str = "ca.crt";
pub(crate) const CA_KEY_KEY: &str = "ca.key";
pub(crate) const TLS_CERT_KEY: &str = "tls.crt";
pub(crate) const TLS_KEY_KEY: &str = "tls.key";
/// The leaf's validity, in Unix seconds, so renewal needs no X.509 parser.
const NOT_BEFORE_ANNOTATION: &str = "petstore.example.com/serving-not-before";
const NOT_AFTER_ANNOTATION: &str = "petstore.example.com/serving-not-after";

#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("making a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error(transparent)]
    Secret(#[from] SharedObjectError),
    #[error("writing {path}: {source}")]
    Files {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What a leaf is for: a server's name, or a client's identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Usage {
    Server,
    Client,
}

/// One CA and its leaf: the Secret that holds them, and the names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Profile {
    pub secret: &'static str,
    pub ca_common_name: &'static str,
    /// The leaf's subject CN; a leaf in the Secret with another is issued
    /// again.
    pub leaf_common_name: Cow<'static, str>,
    pub usage: Usage,
}

/// A CA and a leaf it signs, PEM, as kept in the Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaAndLeaf {
    pub ca_cert: String,
    pub ca_key: String,
    pub cert: String,
    pub key: String,
    /// The leaf's validity, Unix seconds.
    pub not_before: i64,
    pub not_after: i64,
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
/// signs leaves without parsing the CA certificate back.
fn ca_params(common_name: &str) -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

/// A validity window from an hour before `now` (another clock may lag
/// ours) for `validity`.
fn window(now: i64, validity: Duration) -> (i64, i64) {
    (now - 3600, now + validity.as_secs() as i64)
}

/// A leaf signed by the CA in `ca_key`: its PEM, its key's PEM and its
/// validity.
fn issue(
    profile: &Profile,
    ca_key: &str,
    common_name: &str,
    usage: Usage,
    names: &[String],
    now: i64,
) -> Result<(String, String, i64, i64), CertError> {
    let issuer = Issuer::new(
        ca_params(profile.ca_common_name),
        KeyPair::from_pem(ca_key)?,
    );
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(names.to_vec())?;
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    params.distinguished_name = name;
    params.extended_key_usages = vec![match usage {
        Usage::Server => ExtendedKeyUsagePurpose::ServerAuth,
        Usage::Client => ExtendedKeyUsagePurpose::ClientAuth,
    }];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.use_authority_key_identifier_extension = true;
    let (not_before, not_after) = window(now, LEAF_VALIDITY);
    params.not_before = at(not_before);
    params.not_after = at(not_after);
    let cert = params.signed_by(&key, &issuer)?;
    Ok((cert.pem(), key.serialize_pem(), not_before, not_after))
}

/// The subject CN of the first certificate in `pem`; `None` if it has none
/// or cannot be read.
fn common_name(pem: &str) -> Option<String> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).ok()?;
    let certificate = pem.parse_x509().ok()?;
    let name = certificate.subject().iter_common_name().next()?;
    name.as_str().ok().map(str::to_owned)
}

/// Due for renewal: less than a third of the validity is left.
fn renewal_due(not_before: i64, not_after: i64, now: i64) -> bool {
    let third = (not_after - not_before) / 3;
    now >= not_after - third
}

fn validity_annotations(not_before: i64, not_after: i64) -> BTreeMap<String, String> {
    BTreeMap::from([
        (NOT_BEFORE_ANNOTATION.to_owned(), not_before.to_string()),
        (NOT_AFTER_ANNOTATION.to_owned(), not_after.to_string()),
    ])
}

fn tls_secret(
    name: &str,
    pems: &[(&str, &String)],
    annotations: BTreeMap<String, String>,
) -> Secret {
    let data = pems
        .iter()
        .map(|(key, pem)| ((*key).to_owned(), ByteString(pem.as_bytes().to_vec())))
        .collect();
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(crate::shared_object::labels()),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(data),
        ..Secret::default()
    }
}

/// `key`'s text in the Secret, if present and not empty.
fn secret_text(secret: &Secret, key: &str) -> Option<String> {
    String::from_utf8(secret.data.as_ref()?.get(key)?.0.clone())
        .ok()
        .filter(|text| !text.is_empty())
}

fn secret_number(secret: &Secret, key: &str) -> Option<i64> {
    secret.metadata.annotations.as_ref()?.get(key)?.parse().ok()
}

impl CaAndLeaf {
    /// A new CA and a leaf for `names`.
    pub fn generate(profile: &Profile, names: &[String], now: i64) -> Result<Self, CertError> {
        let ca_key = KeyPair::generate()?;
        let mut params = ca_params(profile.ca_common_name);
        let (not_before, not_after) = window(now, CA_VALIDITY);
        params.not_before = at(not_before);
        params.not_after = at(not_after);
        let ca_cert = params.self_signed(&ca_key)?.pem();
        let placeholder = Self {
            ca_cert,
            ca_key: ca_key.serialize_pem(),
            cert: String::new(),
            key: String::new(),
            not_before: 0,
            not_after: 0,
        };
        placeholder.renew_leaf(profile, names, now)
    }

    /// A new leaf for `names`, signed by the same CA.
    pub fn renew_leaf(
        &self,
        profile: &Profile,
        names: &[String],
        now: i64,
    ) -> Result<Self, CertError> {
        let (cert, key, not_before, not_after) = issue(
            profile,
            &self.ca_key,
            &profile.leaf_common_name,
            profile.usage,
            names,
            now,
        )?;
        Ok(Self {
            cert,
            key,
            not_before,
            not_after,
            ..self.clone()
        })
    }

    /// Another leaf from this CA, for someone else: the store's serving
    /// certificate, signed by the CA that signs the operator's.
    pub fn issue_other(
        &self,
        profile: &Profile,
        common_name: &str,
        usage: Usage,
        names: &[String],
        now: i64,
    ) -> Result<Leaf, CertError> {
        let (cert, key, not_before, not_after) =
            issue(profile, &self.ca_key, common_name, usage, names, now)?;
        Ok(Leaf {
            ca_cert: self.ca_cert.clone(),
            cert,
            key,
            not_before,
            not_after,
        })
    }

    /// Due for renewal: less than a third of the leaf's validity is left.
    pub fn needs_renewal(&self, now: i64) -> bool {
        renewal_due(self.not_before, self.not_after, now)
    }

    /// The leaf's subject CN, if it can be read.
    pub fn leaf_common_name(&self) -> Option<String> {
        common_name(&self.cert)
    }

    pub fn to_secret(&self, profile: &Profile) -> Secret {
        tls_secret(
            profile.secret,
            &[
                (CA_CERT_KEY, &self.ca_cert),
                (CA_KEY_KEY, &self.ca_key),
                (TLS_CERT_KEY, &self.cert),
                (TLS_KEY_KEY, &self.key),
            ],
            validity_annotations(self.not_before, self.not_after),
        )
    }

    /// `None` if the Secret lacks a key or holds something unreadable.
    pub fn from_secret(secret: &Secret) -> Option<Self> {
        let certs = Self {
            ca_cert: secret_text(secret, CA_CERT_KEY)?,
            ca_key: secret_text(secret, CA_KEY_KEY)?,
            cert: secret_text(secret, TLS_CERT_KEY)?,
            key: secret_text(secret, TLS_KEY_KEY)?,
            not_before: secret_number(secret, NOT_BEFORE_ANNOTATION)?,
            not_after: secret_number(secret, NOT_AFTER_ANNOTATION)?,
        };
        // The CA key must still sign, or renewal would fail later.
        KeyPair::from_pem(&certs.ca_key).ok()?;
        Some(certs)
    }
}

/// A leaf kept without its CA's key: what a party that only presents it,
/// and trusts the CA, mounts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leaf {
    pub ca_cert: String,
    pub cert: String,
    pub key: String,
    pub not_before: i64,
    pub not_after: i64,
}

impl Leaf {
    pub fn needs_renewal(&self, now: i64) -> bool {
        renewal_due(self.not_before, self.not_after, now)
    }

    pub fn to_secret(&self, name: &str, names_annotation: (&str, String)) -> Secret {
        let mut annotations = validity_annotations(self.not_before, self.not_after);
        annotations.insert(names_annotation.0.to_owned(), names_annotation.1);
        tls_secret(
            name,
            &[
                (CA_CERT_KEY, &self.ca_cert),
                (TLS_CERT_KEY, &self.cert),
                (TLS_KEY_KEY, &self.key),
            ],
            annotations,
        )
    }

    pub fn from_secret(secret: &Secret) -> Option<Self> {
        Some(Self {
            ca_cert: secret_text(secret, CA_CERT_KEY)?,
            cert: secret_text(secret, TLS_CERT_KEY)?,
            key: secret_text(secret, TLS_KEY_KEY)?,
            not_before: secret_number(secret, NOT_BEFORE_ANNOTATION)?,
            not_after: secret_number(secret, NOT_AFTER_ANNOTATION)?,
        })
    }
}

/// The shared CA and leaf of `profile`: read, created if absent, the leaf
/// renewed if due. Every replica calling this at once ends up with the
/// same Secret.
pub async fn ensure_ca_and_leaf(
    secrets: &Api<Secret>,
    profile: &Profile,
    names: &[String],
    now: i64,
) -> Result<CaAndLeaf, CertError> {
    Ok(ensure(secrets, profile.secret, |existing| {
        let fresh = match existing.map(CaAndLeaf::from_secret) {
            None => CaAndLeaf::generate(profile, names, now)?,
            Some(Some(certs)) => {
                // A leaf made for another name (the operator's client
                // certificate before it named its ServiceAccount) is issued
                // again by the same CA, as one that is due.
                let made_for = certs.leaf_common_name();
                let renamed = made_for.as_deref() != Some(&*profile.leaf_common_name);
                if !renamed && !certs.needs_renewal(now) {
                    return Ok(Wanted::Keep(certs));
                }
                if renamed {
                    tracing::info!(
                        secret = profile.secret,
                        was = made_for.as_deref().unwrap_or_default(),
                        now = %profile.leaf_common_name,
                        "issuing the certificate again for its new name"
                    );
                }
                certs.renew_leaf(profile, names, now)?
            }
            Some(None) => {
                tracing::warn!(
                    secret = profile.secret,
                    "the Secret is incomplete; making a new CA"
                );
                CaAndLeaf::generate(profile, names, now)?
            }
        };
        let secret = fresh.to_secret(profile);
        Ok::<_, CertError>(Wanted::Write(fresh, Box::new(secret)))
    })
    .await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000;
    const PROFILE: Profile = Profile {
        secret: "some-tls",
        ca_common_name: "some-ca",
        leaf_common_name: Cow::Borrowed("some-leaf"),
        usage: Usage::Server,
    };

    fn names() -> Vec<String> {
        vec!["some.example".to_owned(), "127.0.0.1".to_owned()]
    }

    #[test]
    fn a_renewal_keeps_the_ca_and_changes_the_leaf() {
        let first = CaAndLeaf::generate(&PROFILE, &names(), NOW).expect("generate");
        assert!(first.ca_cert.contains("BEGIN CERTIFICATE"));
        assert!(first.cert.contains("BEGIN CERTIFICATE"));
        assert_eq!(
            first.not_after - first.not_before,
            LEAF_VALIDITY.as_secs() as i64 + 3600
        );
        let later = NOW + 70 * 24 * 3600;
        let renewed = first.renew_leaf(&PROFILE, &names(), later).expect("renew");
        assert_eq!(renewed.ca_cert, first.ca_cert);
        assert_eq!(renewed.ca_key, first.ca_key);
        assert_ne!(renewed.cert, first.cert);
        assert_ne!(renewed.key, first.key);
        assert!(renewed.not_after > first.not_after);
    }

    #[test]
    fn renewal_is_due_with_a_third_of_the_validity_left() {
        let certs = CaAndLeaf::generate(&PROFILE, &names(), NOW).expect("generate");
        let third = (certs.not_after - certs.not_before) / 3;
        assert!(!certs.needs_renewal(NOW));
        assert!(!certs.needs_renewal(certs.not_after - third - 1));
        assert!(certs.needs_renewal(certs.not_after - third));
        assert!(certs.needs_renewal(certs.not_after + 1));
    }

    #[test]
    fn the_secret_holds_everything_and_reads_back() {
        let certs = CaAndLeaf::generate(&PROFILE, &names(), NOW).expect("generate");
        let secret = certs.to_secret(&PROFILE);
        assert_eq!(secret.metadata.name.as_deref(), Some(PROFILE.secret));
        assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
        assert_eq!(CaAndLeaf::from_secret(&secret), Some(certs.clone()));

        let mut incomplete = secret.clone();
        if let Some(data) = incomplete.data.as_mut() {
            data.remove(CA_KEY_KEY);
        }
        assert_eq!(CaAndLeaf::from_secret(&incomplete), None);
        let mut garbled = secret;
        if let Some(data) = garbled.data.as_mut() {
            data.insert(CA_KEY_KEY.into(), ByteString(b"not a key".to_vec()));
        }
        assert_eq!(CaAndLeaf::from_secret(&garbled), None);
    }

    #[test]
    fn another_leaf_reads_back_without_the_ca_key() {
        let certs = CaAndLeaf::generate(&PROFILE, &names(), NOW).expect("generate");
        let leaf = certs
            .issue_other(&PROFILE, "other", Usage::Client, &names(), NOW)
            .expect("issue");
        assert_eq!(leaf.ca_cert, certs.ca_cert);
        let secret = leaf.to_secret("other-tls", ("example/names", "a,b".into()));
        assert!(!secret.data.as_ref().expect("data").contains_key(CA_KEY_KEY));
        assert_eq!(Leaf::from_secret(&secret), Some(leaf));
    }
}
